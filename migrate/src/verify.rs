//! Verification before the swap: both trees walked side by side, every entry compared by type,
//! permissions, owner, size, device number, symlink target, mtime, xattrs, hard-link grouping and
//! (regular files) content, compared byte for byte. Staging entries that differ are removed so the next copy
//! pass redoes exactly them.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rayon::prelude::*;
use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::ctx::Ctx;
use crate::fault::{self, Point};
use crate::fsx::{self, Kind};
use crate::{remove, MigrateError};

/// The differences found; `first` names one for the error message.
#[derive(Default)]
pub(crate) struct Diff {
    pub count: u64,
    pub first: Option<(PathBuf, String)>,
}

struct Verifier<'c, 'a> {
    ctx: &'c Ctx<'a>,
    pool: &'c rayon::ThreadPool,
    /// Source inode → staging inode and back, for multiply-linked inodes only.
    fwd: Mutex<HashMap<u64, u64>>,
    back: Mutex<HashMap<u64, u64>>,
    diff: Mutex<Diff>,
}

struct Frame {
    src: OwnedFd,
    stg: OwnedFd,
    rel: PathBuf,
    subdirs: Vec<OsString>,
}

enum Cmp {
    Same,
    Dir,
    Differs(String),
}

pub(crate) fn verify_tree(
    ctx: &Ctx,
    pool: &rayon::ThreadPool,
    src_root: &OwnedFd,
    stg_root: &OwnedFd,
) -> Result<Diff, MigrateError> {
    let v = Verifier {
        ctx,
        pool,
        fwd: Mutex::new(HashMap::new()),
        back: Mutex::new(HashMap::new()),
        diff: Mutex::new(Diff::default()),
    };
    let root = Path::new("");
    v.compare_dir_meta(src_root, stg_root, root, true)?;
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| ctx.dst_err(root, e));
    let subdirs = v.compare_entries(src_root, stg_root, root)?;
    let mut stack = vec![Frame { src: dup(src_root)?, stg: dup(stg_root)?, rel: PathBuf::new(), subdirs }];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.subdirs.pop() else {
            stack.pop();
            continue;
        };
        ctx.check_stop()?;
        let rel = top.rel.join(&name);
        let src = match fsx::open_dir(&top.src, &name) {
            Ok(fd) => fd,
            Err(e) => {
                v.differs(&rel, format!("source directory cannot be opened: {e}"));
                continue;
            }
        };
        let stg = fsx::open_dir(&top.stg, &name).map_err(|e| ctx.dst_err(&rel, e))?;
        let m = fsx::stat_fd(&src).map_err(|e| ctx.src_err(&rel, e))?;
        ctx.check_entry(&m, &rel)?;
        v.compare_dir_meta(&src, &stg, &rel, false)?;
        ctx.file_done();
        let subdirs = v.compare_entries(&src, &stg, &rel)?;
        stack.push(Frame { src, stg, rel, subdirs });
    }
    v.diff.into_inner().map_err(|_| MigrateError::Internal("verification state poisoned"))
}

impl Verifier<'_, '_> {
    fn differs(&self, rel: &Path, why: String) {
        if let Ok(mut d) = self.diff.lock() {
            d.count += 1;
            if d.first.is_none() {
                d.first = Some((self.ctx.display(rel), why));
            }
        }
    }

    fn compare_dir_meta(&self, src: &OwnedFd, stg: &OwnedFd, rel: &Path, is_root: bool) -> Result<(), MigrateError> {
        let ctx = self.ctx;
        let m = fsx::stat_fd(src).map_err(|e| ctx.src_err(rel, e))?;
        let e = fsx::stat_fd(stg).map_err(|e| ctx.dst_err(rel, e))?;
        if !m.same_copy(&e) {
            self.differs(rel, "directory owner, mode or times differ".into());
            return Ok(());
        }
        let sx = fsx::xattrs(src.as_fd()).map_err(|e| ctx.src_err(rel, e))?;
        let dx = fsx::xattrs(stg.as_fd()).map_err(|e| ctx.dst_err(rel, e))?;
        // The host's own attributes on the root are allowed in addition to the source's.
        let same = if is_root { sx.iter().all(|a| dx.contains(a)) } else { sx == dx };
        if !same {
            self.differs(rel, "directory extended attributes differ".into());
        }
        Ok(())
    }

    /// Compares the entries of one directory pair; returns the common subdirectories.
    fn compare_entries(&self, src: &OwnedFd, stg: &OwnedFd, rel: &Path) -> Result<Vec<OsString>, MigrateError> {
        let ctx = self.ctx;
        let names = fsx::list_names(src).map_err(|e| ctx.src_err(rel, e))?;
        let theirs = fsx::list_names(stg).map_err(|e| ctx.dst_err(rel, e))?;
        let ours: HashSet<&OsStr> = names.iter().map(|n| n.as_os_str()).collect();
        let theirs_set: HashSet<&OsStr> = theirs.iter().map(|n| n.as_os_str()).collect();
        for n in &theirs {
            if !ours.contains(n.as_os_str()) {
                self.differs(&rel.join(n), "only in the copy".into());
            }
        }
        let mut common = Vec::new();
        for n in names {
            if theirs_set.contains(n.as_os_str()) {
                common.push(n);
            } else {
                self.differs(&rel.join(&n), "missing from the copy".into());
            }
        }
        let results: Vec<(OsString, Cmp)> = self.pool.install(|| {
            common.into_par_iter().map(|n| self.compare(src, stg, rel, &n).map(|c| (n, c))).collect::<Result<_, _>>()
        })?;
        let mut subdirs = Vec::new();
        for (n, c) in results {
            match c {
                Cmp::Same => {}
                Cmp::Dir => subdirs.push(n),
                Cmp::Differs(why) => {
                    let r = rel.join(&n);
                    // Drop the stale copy so the next copy pass redoes it.
                    remove::remove_tree(stg.as_fd(), &n, false, &mut |_| Ok(())).map_err(|e| ctx.dst_err(&r, e))?;
                    self.differs(&r, why);
                }
            }
        }
        Ok(subdirs)
    }

    fn compare(&self, src_dir: &OwnedFd, stg_dir: &OwnedFd, rel_dir: &Path, name: &OsStr) -> Result<Cmp, MigrateError> {
        let ctx = self.ctx;
        ctx.check_stop()?;
        let rel = rel_dir.join(name);
        let fd = match fsx::open_path(src_dir, name) {
            Ok(fd) => fd,
            Err(e) if fsx::is_errno(&e, Errno::NOENT) => return Ok(Cmp::Differs("vanished from the source".into())),
            Err(e) => return Err(ctx.src_err(&rel, e)),
        };
        let efd = fsx::open_path(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
        let m = fsx::stat_fd(&fd).map_err(|e| ctx.src_err(&rel, e))?;
        let e = fsx::stat_fd(&efd).map_err(|e| ctx.dst_err(&rel, e))?;
        if m.kind != e.kind {
            return Ok(Cmp::Differs(format!("{} in the source, {} in the copy", m.kind.name(), e.kind.name())));
        }
        if m.kind == Kind::Dir {
            return Ok(Cmp::Dir);
        }
        ctx.check_entry(&m, &rel)?;
        if !m.same_copy(&e) {
            return Ok(Cmp::Differs("owner, mode, size or times differ".into()));
        }
        // Link groups must map one to one between the trees. The counts themselves may differ: a
        // source file also linked outside the tree has a single name in the copy.
        if m.nlink > 1 || e.nlink > 1 {
            let (fwd, back) = match (self.fwd.lock(), self.back.lock()) {
                (Ok(f), Ok(b)) => (f, b),
                _ => return Err(MigrateError::Internal("verification state poisoned")),
            };
            let (mut fwd, mut back) = (fwd, back);
            let f = *fwd.entry(m.ino).or_insert(e.ino);
            let b = *back.entry(e.ino).or_insert(m.ino);
            if f != e.ino || b != m.ino {
                return Ok(Cmp::Differs("hard links differ".into()));
            }
        }
        let sx = fsx::xattrs(fd.as_fd()).map_err(|e| ctx.src_err(&rel, e))?;
        let dx = fsx::xattrs(efd.as_fd()).map_err(|e| ctx.dst_err(&rel, e))?;
        if sx != dx {
            return Ok(Cmp::Differs("extended attributes differ".into()));
        }
        match m.kind {
            Kind::Symlink => {
                let a = fsx::read_link(&fd).map_err(|e| ctx.src_err(&rel, e))?;
                let b = fsx::read_link(&efd).map_err(|e| ctx.dst_err(&rel, e))?;
                if a != b {
                    return Ok(Cmp::Differs("symlink targets differ".into()));
                }
            }
            Kind::File if !self.same_content(&fd, &efd).map_err(|e| ctx.dst_err(&rel, e))? => {
                return Ok(Cmp::Differs("contents differ".into()));
            }
            _ => {}
        }
        ctx.file_done();
        fault::point(Point::VerifyEntry);
        Ok(Cmp::Same)
    }

    /// Compares two files byte for byte over every range where either has data (holes read as
    /// zeros, so a 1 GiB sparse file with 1 MiB of data costs 1 MiB of reads), in chunks, with
    /// per-thread buffers. Stronger than comparing hashes, and much cheaper than hashing both.
    fn same_content(&self, a: &OwnedFd, b: &OwnedFd) -> std::io::Result<bool> {
        use std::os::unix::fs::FileExt;
        const CHUNK: u64 = 256 * 1024;
        thread_local! {
            static BUFS: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
        }
        let fa = std::fs::File::from(fsx::reopen(a.as_fd(), OFlags::RDONLY | OFlags::NOATIME)?);
        let fb = std::fs::File::from(fsx::reopen(b.as_fd(), OFlags::RDONLY | OFlags::NOATIME)?);
        let size = fa.metadata()?.len();
        if fb.metadata()?.len() != size {
            return Ok(false);
        }
        BUFS.with(|bufs| {
            let (x, y) = &mut *bufs.borrow_mut();
            x.resize(CHUNK as usize, 0);
            y.resize(CHUNK as usize, 0);
            if size <= CHUNK {
                // One read each: cheaper than finding the data ranges of a small file.
                let n = size as usize;
                fa.read_exact_at(&mut x[..n], 0)?;
                fb.read_exact_at(&mut y[..n], 0)?;
                self.ctx.bytes_done.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
                return Ok(x[..n] == y[..n]);
            }
            let mut pos = 0;
            while pos < size {
                let start = next_data(&fa, pos, size)?.min(next_data(&fb, pos, size)?);
                if start >= size {
                    break;
                }
                let end = state_change(&fa, start, size)?.min(state_change(&fb, start, size)?).max(start + 1);
                let mut at = start;
                while at < end {
                    let n = (end - at).min(CHUNK) as usize;
                    fa.read_exact_at(&mut x[..n], at)?;
                    fb.read_exact_at(&mut y[..n], at)?;
                    if x[..n] != y[..n] {
                        return Ok(false);
                    }
                    at += n as u64;
                    self.ctx.bytes_done.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    self.ctx.tick(false);
                }
                pos = end;
            }
            Ok(true)
        })
    }
}

/// The first offset at or after `at` holding data, or `size` if none.
fn next_data(f: &std::fs::File, at: u64, size: u64) -> std::io::Result<u64> {
    match rustix::fs::seek(f, rustix::fs::SeekFrom::Data(at)) {
        Ok(o) => Ok(o.min(size)),
        Err(rustix::io::Errno::NXIO) => Ok(size),
        Err(e) => Err(e.into()),
    }
}

/// Where the data/hole state that holds at `at` ends.
fn state_change(f: &std::fs::File, at: u64, size: u64) -> std::io::Result<u64> {
    if next_data(f, at, size)? == at {
        match rustix::fs::seek(f, rustix::fs::SeekFrom::Hole(at)) {
            Ok(o) => Ok(o.min(size)),
            Err(rustix::io::Errno::NXIO) => Ok(size),
            Err(e) => Err(e.into()),
        }
    } else {
        next_data(f, at, size)
    }
}
