//! Read-only looks before anything is written: the streaming census of the source tree and the
//! scan of /proc for processes using it.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::ctx::Ctx;
use crate::fsx::{self, Kind};
use crate::{MigrateError, ProcessUse};

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Census {
    /// Entries below the root.
    pub entries: u64,
    /// Sum of regular file sizes.
    pub bytes: u64,
    /// Sum of regular files' data ([`fsx::Meta::data`]): what the copy reads and writes.
    pub data: u64,
    /// Space actually allocated (st_blocks), root included: what the copy will need.
    pub alloc: u64,
    /// Multiply-linked files with links outside the tree.
    pub outside_links: u64,
    /// Directories below the root.
    pub dirs: u64,
    /// Multiply-linked inodes and the space they take (each counted once): move mode copies them.
    pub linked: u64,
    pub linked_alloc: u64,
}

/// Directories the census has listed, in this process: a test checks that a conversion walks
/// its tree for the census once (the copy, verification and disposal walk it on their own).
static DIRS_LISTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many directories every census of this process has listed so far.
pub fn census_dirs_listed() -> u64 {
    DIRS_LISTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Walks the tree one directory at a time, refusing mount points and encrypted entries inside.
pub(crate) fn census(ctx: &Ctx, root: &OwnedFd) -> Result<Census, MigrateError> {
    let rootm = fsx::stat_fd(root).map_err(|e| ctx.src_err(Path::new(""), e))?;
    let mut c = Census { alloc: rootm.blocks * 512, ..Census::default() };
    // nlink and names seen, for multiply-linked inodes only.
    let mut links: HashMap<u64, (u32, u32)> = HashMap::new();
    let mut stack: Vec<(OwnedFd, PathBuf, Vec<OsString>)> = Vec::new();
    let first = root.try_clone().map_err(|e| ctx.src_err(Path::new(""), e))?;
    stack.push((first, PathBuf::new(), Vec::new()));
    let mut fresh = true;
    while let Some((dir, rel, pending)) = stack.last_mut() {
        if fresh {
            fresh = false;
            DIRS_LISTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for n in fsx::list_names(&*dir).map_err(|e| ctx.src_err(rel, e))? {
                let r = rel.join(&n);
                let Some(m) = fsx::stat_at(&*dir, &n).map_err(|e| ctx.src_err(&r, e))? else {
                    continue;
                };
                ctx.check_entry(&m, &r)?;
                c.entries += 1;
                c.alloc += m.blocks * 512;
                match m.kind {
                    Kind::Dir => {
                        c.dirs += 1;
                        pending.push(n)
                    }
                    Kind::File => {
                        c.bytes += m.size;
                        c.data += m.data();
                    }
                    _ => {}
                }
                if m.kind != Kind::Dir && m.nlink > 1 {
                    let seen = links.entry(m.ino).or_insert_with(|| {
                        c.linked += 1;
                        c.linked_alloc += m.blocks * 512;
                        (m.nlink, 0)
                    });
                    seen.1 += 1;
                }
            }
            ctx.files_done.store(c.entries, std::sync::atomic::Ordering::Relaxed);
            ctx.tick(false);
            ctx.check_stop()?;
        }
        let Some(n) = pending.pop() else {
            stack.pop();
            continue;
        };
        let r = rel.join(&n);
        match fsx::open_dir(&*dir, &n) {
            Ok(fd) => {
                stack.push((fd, r, Vec::new()));
                fresh = true;
            }
            Err(e) if fsx::is_errno(&e, rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(ctx.src_err(&r, e)),
        }
    }
    c.outside_links = links.values().filter(|(nlink, seen)| seen < nlink).count() as u64;
    Ok(c)
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
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let base = entry.path();
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
