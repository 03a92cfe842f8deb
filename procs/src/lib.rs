//! The one scanner of /proc: which processes use a directory tree (the conversion engine's
//! in-use check, `lock` naming what keeps files busy) and which belong to a user (converting a
//! logged-in user's home). Processes that vanish or cannot be inspected mid-scan are skipped.
#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A process using a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessUse {
    pub pid: u32,
    pub comm: String,
    pub uid: u32,
    /// "cwd", "root directory", "open file /x/y", "mapped /x/z".
    pub how: String,
}

impl fmt::Display for ProcessUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} ({}, uid {}): {}", self.pid, self.comm, self.uid, self.how)
    }
}

/// Every process: its pid and its /proc directory.
fn processes() -> std::io::Result<impl Iterator<Item = (u32, PathBuf)>> {
    Ok(std::fs::read_dir("/proc")?.flatten().filter_map(|entry| {
        let pid = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok())?;
        Some((pid, entry.path()))
    }))
}

/// The processes whose /proc entry belongs to `uid` (their effective uid), this one included.
pub fn pids_of_user(uid: u32) -> std::io::Result<Vec<u32>> {
    Ok(processes()?
        .filter(|(_, base)| std::fs::metadata(base).is_ok_and(|m| m.uid() == uid))
        .map(|(pid, _)| pid)
        .collect())
}

/// Processes whose working directory, root, open files or memory maps lie under `root`.
/// Processes that vanish or cannot be inspected during the scan are skipped, and so is this
/// process: the engine itself holds the source open while it looks.
pub fn find_users(root: &Path) -> std::io::Result<Vec<ProcessUse>> {
    let root = std::fs::canonicalize(root)?;
    let me = std::process::id();
    let my_exe = std::fs::read_link("/proc/self/exe").ok();
    let under = |p: &Path| p.starts_with(&root);
    let mut out = Vec::new();
    for (pid, base) in processes()? {
        if pid == me {
            continue;
        }
        if is_our_unexeced_child(&base, me, my_exe.as_deref()) {
            continue;
        }
        let mut hows: Vec<String> = Vec::new();
        for (link, how) in [("cwd", "cwd"), ("root", "root directory")] {
            if let Ok(t) = std::fs::read_link(base.join(link)) {
                if under(&strip_deleted(t)) {
                    hows.push(how.to_string());
                }
            }
        }
        if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
            for fd in fds.flatten() {
                if let Ok(t) = std::fs::read_link(fd.path()) {
                    let t = strip_deleted(t);
                    if under(&t) {
                        hows.push(format!("open file {}", t.display()));
                    }
                }
            }
        }
        if let Ok(maps) = std::fs::read(base.join("maps")) {
            let mut seen = Vec::new();
            for line in maps.split(|b| *b == b'\n') {
                // The path is everything from the first '/' after the five fixed fields.
                let Some(i) = line.iter().position(|b| *b == b'/') else { continue };
                let t = strip_deleted(PathBuf::from(OsStr::from_bytes(&line[i..])));
                if under(&t) && !seen.contains(&t) {
                    hows.push(format!("mapped {}", t.display()));
                    seen.push(t);
                }
            }
        }
        if hows.is_empty() {
            continue;
        }
        let comm = std::fs::read_to_string(base.join("comm")).map(|s| s.trim_end().to_string()).unwrap_or_default();
        let uid = std::fs::read_to_string(base.join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|r| r.split_whitespace().next().and_then(|u| u.parse().ok()))
            })
            .unwrap_or(u32::MAX);
        for how in hows {
            out.push(ProcessUse { pid, comm: comm.clone(), uid, how });
        }
    }
    Ok(out)
}

/// A child of ours between fork and exec (still running our own executable) holds copies of our
/// file descriptors for a moment; it is not a user of the tree. Once it execs something else it
/// counts like any other process.
fn is_our_unexeced_child(base: &Path, me: u32, my_exe: Option<&Path>) -> bool {
    let Some(my_exe) = my_exe else { return false };
    let ppid = std::fs::read_to_string(base.join("stat")).ok().and_then(|s| {
        // The command name may contain spaces and parentheses: fields resume after the last ')'.
        let rest = &s[s.rfind(')')? + 1..];
        rest.split_whitespace().nth(1)?.parse::<u32>().ok()
    });
    ppid == Some(me) && std::fs::read_link(base.join("exe")).ok().as_deref() == Some(my_exe)
}

fn strip_deleted(p: PathBuf) -> PathBuf {
    let b = p.as_os_str().as_bytes();
    match b.strip_suffix(b" (deleted)") {
        Some(s) => PathBuf::from(OsStr::from_bytes(s)),
        None => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_process_by_its_cwd_and_by_its_user() {
        let dir = std::env::temp_dir().join(format!("dirseal-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = std::process::Command::new("sleep").arg("30").current_dir(&dir).spawn().unwrap();
        // The child may not have exec'd yet (it then still runs our executable and is skipped).
        let mut found = Vec::new();
        for _ in 0..200 {
            found = find_users(&dir).unwrap();
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let me = std::fs::metadata("/proc/self").unwrap().uid();
        let mine = pids_of_user(me).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_dir(&dir).unwrap();
        assert!(found.iter().any(|u| u.pid == child.id() && u.how == "cwd" && u.comm == "sleep"), "{found:?}");
        assert!(mine.contains(&std::process::id()) && mine.contains(&child.id()));
    }
}
