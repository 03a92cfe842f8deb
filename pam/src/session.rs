//! The sessions open on each home, in a root-only run directory, so a home is locked only when
//! its last session ends.
//!
//! One file per home (named by a hash of the home's path, so two accounts sharing a home share
//! it), one line per session: the process that opened it, that process's start time, and the
//! account. Whoever reads the file holds its `flock` and first drops the sessions whose process
//! is gone (or whose pid now belongs to a newer process): a session killed before its
//! `close_session` does not keep the home unlocked, and a new account that reuses a uid
//! inherits nothing. The caller decides "last session" and locks the home while still holding
//! the lock, so a login racing a logout cannot end with a live session on a locked home.
use std::io::{Read, Seek, Write};
use std::path::{Component, Path};

use sha2::{Digest, Sha256};

/// One session: the process that opened it (with its start time, so a reused pid is not taken
/// for it) and the account it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub pid: u32,
    pub start: u64,
    pub uid: u32,
}

impl Entry {
    /// The calling process, opening a session for `uid`.
    pub fn current(uid: u32) -> Result<Entry, String> {
        let pid = std::process::id();
        let start = start_time(pid).ok_or("cannot read this process's start time from /proc")?;
        Ok(Entry { pid, start, uid })
    }

    fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }

    fn parse(line: &str) -> Option<Entry> {
        let mut f = line.split(' ');
        let e = Entry { pid: f.next()?.parse().ok()?, start: f.next()?.parse().ok()?, uid: f.next()?.parse().ok()? };
        f.next().is_none().then_some(e)
    }
}

/// Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat); `None` if there
/// is no such process.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; fields after it are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The session file of a home: the hash of its path with `.` components and trailing slashes
/// dropped (the path comes from the passwd database, never from the caller).
fn file_name(home: &Path) -> String {
    let mut canon = Vec::new();
    for c in home.components().filter(|c| *c != Component::CurDir) {
        canon.extend_from_slice(c.as_os_str().as_encoded_bytes());
        canon.push(b'/');
    }
    let digest = Sha256::digest(&canon);
    format!("{}.sessions", hex::encode(&digest[..16]))
}

/// The sessions of one home, locked until dropped.
pub struct Sessions {
    file: nix::fcntl::Flock<std::fs::File>,
    entries: Vec<Entry>,
    /// Entries dropped because their process is gone.
    pub dropped: Vec<Entry>,
}

impl Sessions {
    /// Locks the session file of `home` (waiting for whoever holds it) and reads it, without the
    /// sessions whose process is gone. Unreadable lines (a file from an older version, which
    /// counted per uid) are dropped too.
    pub fn open(rundir: &Path, home: &Path) -> Result<Sessions, String> {
        dirseal::securefile::ensure_private_dir(rundir).map_err(|e| e.to_string())?;
        let path = rundir.join(file_name(home));
        let mut file = dirseal::securefile::lock_file(&path).map_err(|e| e.to_string())?;
        let mut text = String::new();
        (&mut *file).take(1 << 20).read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
        let (entries, dropped) = text.lines().filter_map(Entry::parse).partition(Entry::alive);
        Ok(Sessions { file, entries, dropped })
    }

    pub fn add(&mut self, e: Entry) {
        if !self.entries.contains(&e) {
            self.entries.push(e);
        }
    }

    /// Removes `e`; false if it was not recorded (or its process is gone, so it was dropped).
    pub fn remove(&mut self, e: &Entry) -> bool {
        let before = self.entries.len();
        self.entries.retain(|x| x != e);
        self.entries.len() != before
    }

    /// Sessions still open.
    pub fn live(&self) -> usize {
        self.entries.len()
    }

    /// Writes the list back (durably) and releases the lock.
    pub fn save(mut self) -> Result<(), String> {
        let text: String = self.entries.iter().map(|e| format!("{} {} {}\n", e.pid, e.start, e.uid)).collect();
        let f = &mut *self.file;
        f.set_len(0).map_err(|e| e.to_string())?;
        f.rewind().map_err(|e| e.to_string())?;
        f.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
        f.sync_all().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn me() -> Entry {
        Entry::current(4242).unwrap()
    }

    #[test]
    fn sessions_are_counted_per_home_and_saved() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        let mut s = Sessions::open(&run, Path::new("/home/a")).unwrap();
        assert_eq!(s.live(), 0);
        s.add(me());
        s.add(me());
        assert_eq!(s.live(), 1, "the same session is recorded once");
        s.save().unwrap();
        // The same home however its path is spelled; another home is separate.
        assert_eq!(Sessions::open(&run, Path::new("/home/./a/")).unwrap().live(), 1);
        assert_eq!(Sessions::open(&run, Path::new("/home/b")).unwrap().live(), 0);
        let mut s = Sessions::open(&run, Path::new("/home/a")).unwrap();
        assert!(s.remove(&me()));
        assert!(!s.remove(&me()));
        s.save().unwrap();
        assert_eq!(Sessions::open(&run, Path::new("/home/a")).unwrap().live(), 0);
        assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o7777, 0o700);
        let f = run.join(file_name(Path::new("/home/a")));
        assert_eq!(std::fs::metadata(f).unwrap().permissions().mode() & 0o7777, 0o600);
    }

    #[test]
    fn sessions_of_dead_processes_and_old_counters_are_dropped() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let live = me();
        // The same pid as a live process but another start time: the pid was reused.
        let reused = Entry { start: live.start + 1, ..live };
        let text = format!(
            "5\n{dead_pid} 1 7\n{} {} {}\n{} {} 4242\ngarbage\n",
            reused.pid, reused.start, 7, live.pid, live.start
        );
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        let f = run.join(file_name(Path::new("/home/a")));
        std::fs::write(&f, text).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = Sessions::open(&run, Path::new("/home/a")).unwrap();
        assert_eq!(s.live(), 1, "only the live session is left");
        assert_eq!(s.dropped.len(), 2);
    }

    #[test]
    fn symlinks_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        // A symlinked run directory.
        let link = d.path().join("run-link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(Sessions::open(&link, Path::new("/home/a")).is_err());
        // A symlinked session file inside a good run directory.
        let run = d.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(target.join("victim"), run.join(file_name(Path::new("/home/a")))).unwrap();
        assert!(Sessions::open(&run, Path::new("/home/a")).is_err());
        assert!(!target.join("victim").exists(), "nothing may be created through the link");
    }

    #[test]
    fn a_world_writable_run_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Sessions::open(&run, Path::new("/home/a")).is_err());
    }
}
