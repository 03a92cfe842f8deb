//! Read-only look before anything is written: the streaming census of the source tree. (Which
//! processes use it: `dirseal-procs`.)

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::ctx::Ctx;
use crate::fsx::{self, Kind};
use crate::MigrateError;

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Census {
    /// Entries below the root.
    pub entries: u64,
    /// Sum of regular file sizes.
    pub bytes: u64,
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
                    Kind::File => c.bytes += m.size,
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
