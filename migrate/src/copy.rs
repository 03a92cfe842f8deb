//! The copy pass: makes the staging tree equal to the source tree, one directory at a time.
//!
//! Invariant that makes resuming cheap and safe: a name present in staging is complete. Regular
//! files are written into an `O_TMPFILE`, given their metadata and only then linked under their
//! name (made durable all at once by a `syncfs` before `Copied` is recorded). Other entries get their modification time last, so one whose type, owner, mode,
//! xattrs and mtime match the source is finished. A resumed pass therefore walks the tree again but
//! copies only what is missing, stale or half-made, and removes what the source no longer has.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use rayon::prelude::*;
use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::ctx::Ctx;
use crate::fault::{self, Point};
use crate::fsx::{self, Kind, Meta};
use crate::{remove, MigrateError};

/// How often one file may be seen changing under the copy before the conversion gives up on it.
const MAX_TRIES: usize = 5;

/// The first staging name of a source inode with several links; later names link to it.
#[derive(Clone)]
struct Rep {
    rel: PathBuf,
    stg_ino: u64,
}

enum Entry {
    Done,
    IsDir,
    /// Multiply-linked: handled after the parallel batch so one thread owns each link group.
    Deferred,
}

struct Copier<'c, 'a> {
    ctx: &'c Ctx<'a>,
    stg_root: BorrowedFd<'c>,
    /// Only inodes with more than one link, so memory follows the number of hard-linked files,
    /// not the size of the tree.
    links: Mutex<HashMap<u64, Rep>>,
    pool: &'c rayon::ThreadPool,
}

struct Frame {
    src: OwnedFd,
    stg: OwnedFd,
    rel: PathBuf,
    subdirs: Vec<OsString>,
}

/// Copies `src_root` into `stg_root` (whose own xattrs set by the host are kept).
pub(crate) fn copy_tree(
    ctx: &Ctx,
    pool: &rayon::ThreadPool,
    src_root: &OwnedFd,
    stg_root: &OwnedFd,
) -> Result<(), MigrateError> {
    let c = Copier { ctx, stg_root: stg_root.as_fd(), links: Mutex::new(HashMap::new()), pool };
    let root = Path::new("");
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| ctx.dst_err(root, e));
    let subdirs = c.sync_entries(src_root, stg_root, root)?;
    let mut stack = vec![Frame { src: dup(src_root)?, stg: dup(stg_root)?, rel: PathBuf::new(), subdirs }];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.subdirs.pop() else {
            if let Some(f) = stack.pop() {
                c.finish_dir(&f.src, &f.stg, &f.rel, stack.is_empty())?;
            }
            continue;
        };
        ctx.check_stop()?;
        if let Some(frame) = c.enter_dir(&top.src, &top.stg, &top.rel, &name)? {
            stack.push(frame);
        }
    }
    Ok(())
}

impl Copier<'_, '_> {
    /// Opens (creating in staging) a subdirectory and copies its non-directory entries.
    fn enter_dir(
        &self,
        src_dir: &OwnedFd,
        stg_dir: &OwnedFd,
        rel_dir: &Path,
        name: &OsStr,
    ) -> Result<Option<Frame>, MigrateError> {
        let ctx = self.ctx;
        let rel = rel_dir.join(name);
        let pfd = match fsx::open_path(src_dir, name) {
            Ok(fd) => fd,
            Err(e) if fsx::is_errno(&e, Errno::NOENT) => return Ok(None),
            Err(e) => return Err(ctx.src_err(&rel, e)),
        };
        let m = fsx::stat_fd(&pfd).map_err(|e| ctx.src_err(&rel, e))?;
        ctx.check_entry(&m, &rel)?;
        if m.kind != Kind::Dir {
            // Replaced by something else since the listing.
            self.entry(src_dir, stg_dir, rel_dir, name, true)?;
            return Ok(None);
        }
        let src = fsx::reopen(pfd.as_fd(), OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOATIME)
            .map_err(|e| ctx.src_err(&rel, e))?;
        match fsx::stat_at(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))? {
            Some(d) if d.kind == Kind::Dir => {}
            other => {
                if other.is_some() {
                    remove::remove_tree(stg_dir.as_fd(), name, false, &mut |_| Ok(()))
                        .map_err(|e| ctx.dst_err(&rel, e))?;
                }
                fsx::mkdir(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
            }
        }
        let stg = fsx::open_dir(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
        ctx.file_done();
        let subdirs = self.sync_entries(&src, &stg, &rel)?;
        Ok(Some(Frame { src, stg, rel, subdirs }))
    }

    /// Directory metadata goes on after all children, so their creation does not disturb the
    /// times. Durability comes from one `syncfs` before `Copied` is recorded (see `create`).
    fn finish_dir(&self, src: &OwnedFd, stg: &OwnedFd, rel: &Path, is_root: bool) -> Result<(), MigrateError> {
        let ctx = self.ctx;
        let m = fsx::stat_fd(src).map_err(|e| ctx.src_err(rel, e))?;
        let mut x = fsx::xattrs(src.as_fd()).map_err(|e| ctx.src_err(rel, e))?;
        if is_root {
            // The host may have put attributes on the staging root (e.g. a recovery blob); keep them.
            let have = fsx::xattrs(stg.as_fd()).map_err(|e| ctx.dst_err(rel, e))?;
            for (n, v) in have {
                if !x.iter().any(|(m, _)| *m == n) {
                    x.push((n, v));
                }
            }
        }
        fsx::apply_meta(stg.as_fd(), &m, &x).map_err(|e| ctx.dst_err(rel, e))?;
        fault::point(Point::CopyDir);
        Ok(())
    }

    /// Makes the non-directory entries of one staging directory equal to the source's and returns
    /// the source's subdirectories, to be entered next.
    fn sync_entries(&self, src: &OwnedFd, stg: &OwnedFd, rel: &Path) -> Result<Vec<OsString>, MigrateError> {
        let ctx = self.ctx;
        let names = fsx::list_names(src).map_err(|e| ctx.src_err(rel, e))?;
        let wanted: HashSet<&OsStr> = names.iter().map(|n| n.as_os_str()).collect();
        for n in fsx::list_names(stg).map_err(|e| ctx.dst_err(rel, e))? {
            if !wanted.contains(n.as_os_str()) {
                remove::remove_tree(stg.as_fd(), &n, false, &mut |_| Ok(()))
                    .map_err(|e| ctx.dst_err(&rel.join(&n), e))?;
            }
        }
        let (mut singles, mut others, mut subdirs) = (Vec::new(), Vec::new(), Vec::new());
        for n in names {
            match fsx::stat_at(src, &n).map_err(|e| ctx.src_err(&rel.join(&n), e))? {
                None => {}
                Some(m) if m.kind == Kind::Dir => subdirs.push(n),
                Some(m) if m.kind == Kind::File && m.nlink == 1 => singles.push(n),
                Some(_) => others.push(n),
            }
        }
        let results: Vec<(OsString, Entry)> = self.pool.install(|| {
            singles
                .into_par_iter()
                .map(|n| self.entry(src, stg, rel, &n, false).map(|r| (n, r)))
                .collect::<Result<_, _>>()
        })?;
        for (n, r) in results {
            match r {
                Entry::Done => {}
                Entry::IsDir => subdirs.push(n),
                Entry::Deferred => others.push(n),
            }
        }
        for n in others {
            if let Entry::IsDir = self.entry(src, stg, rel, &n, true)? {
                subdirs.push(n);
            }
        }
        Ok(subdirs)
    }

    /// Brings one non-directory entry up to date in staging.
    fn entry(
        &self,
        src_dir: &OwnedFd,
        stg_dir: &OwnedFd,
        rel_dir: &Path,
        name: &OsStr,
        allow_links: bool,
    ) -> Result<Entry, MigrateError> {
        let ctx = self.ctx;
        ctx.check_stop()?;
        let rel = rel_dir.join(name);
        let fd = match fsx::open_path(src_dir, name) {
            Ok(fd) => fd,
            Err(e) if fsx::is_errno(&e, Errno::NOENT) => {
                ctx.file_done();
                return Ok(Entry::Done);
            }
            Err(e) => return Err(ctx.src_err(&rel, e)),
        };
        let m = fsx::stat_fd(&fd).map_err(|e| ctx.src_err(&rel, e))?;
        ctx.check_entry(&m, &rel)?;
        if m.kind == Kind::Dir {
            return Ok(Entry::IsDir);
        }
        if m.nlink > 1 && !allow_links {
            return Ok(Entry::Deferred);
        }
        let existing = fsx::stat_at(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
        let rep = if m.nlink > 1 { self.rep(m.ino) } else { None };
        if let Some(rep) = rep {
            if existing.as_ref().map(|e| e.ino) != Some(rep.stg_ino) {
                if existing.is_some() {
                    remove::remove_tree(stg_dir.as_fd(), name, false, &mut |_| Ok(()))
                        .map_err(|e| ctx.dst_err(&rel, e))?;
                }
                let rfd = fsx::open_beneath(self.stg_root, &rep.rel).map_err(|e| ctx.dst_err(&rep.rel, e))?;
                let rm = fsx::stat_fd(&rfd).map_err(|e| ctx.dst_err(&rep.rel, e))?;
                if rm.ino != rep.stg_ino {
                    return Err(
                        ctx.dst_err(&rel, std::io::Error::other("the staging copy changed under the conversion"))
                    );
                }
                fsx::link_fd(&rfd, stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
            }
            ctx.add_bytes(if m.kind == Kind::File { m.data() } else { 0 });
            ctx.file_done();
            return Ok(Entry::Done);
        }
        if let Some(e) = existing {
            if self.matches(&fd, &m, stg_dir, name, &e, &rel)? {
                if m.nlink > 1 {
                    self.set_rep(m.ino, &rel, e.ino);
                }
                ctx.add_bytes(if m.kind == Kind::File { m.data() } else { 0 });
                ctx.file_done();
                return Ok(Entry::Done);
            }
            remove::remove_tree(stg_dir.as_fd(), name, false, &mut |_| Ok(())).map_err(|e| ctx.dst_err(&rel, e))?;
        }
        let stg_ino = create(ctx, &fd, m.kind, stg_dir, name, &rel, m.nlink > 1)?;
        if m.nlink > 1 {
            self.set_rep(m.ino, &rel, stg_ino);
        }
        ctx.file_done();
        Ok(Entry::Done)
    }

    fn rep(&self, ino: u64) -> Option<Rep> {
        self.links.lock().ok().and_then(|l| l.get(&ino).cloned())
    }

    fn set_rep(&self, ino: u64, rel: &Path, stg_ino: u64) {
        if let Ok(mut l) = self.links.lock() {
            l.insert(ino, Rep { rel: rel.to_path_buf(), stg_ino });
        }
    }

    /// Whether an entry already in staging is a finished copy of the source entry.
    fn matches(
        &self,
        fd: &OwnedFd,
        m: &Meta,
        stg_dir: &OwnedFd,
        name: &OsStr,
        e: &Meta,
        rel: &Path,
    ) -> Result<bool, MigrateError> {
        let ctx = self.ctx;
        // A staging entry with extra links belongs to a link group the source no longer has.
        if !m.same_copy(e) || (m.nlink == 1 && e.nlink != 1) {
            return Ok(false);
        }
        let efd = fsx::open_path(stg_dir, name).map_err(|err| ctx.dst_err(rel, err))?;
        if m.kind == Kind::Symlink
            && fsx::read_link(fd).map_err(|err| ctx.src_err(rel, err))?
                != fsx::read_link(&efd).map_err(|err| ctx.dst_err(rel, err))?
        {
            return Ok(false);
        }
        Ok(fsx::xattrs(fd.as_fd()).map_err(|err| ctx.src_err(rel, err))?
            == fsx::xattrs(efd.as_fd()).map_err(|err| ctx.dst_err(rel, err))?)
    }
}

/// Creates the copy of a non-directory entry (in staging, or back in the source when a move is
/// aborted); returns its inode number (when `need_ino`, else 0). Re-copies
/// while the source changes under it (size, mtime or ctime differ before and after).
pub(crate) fn create(
    ctx: &Ctx,
    fd: &OwnedFd,
    kind: Kind,
    stg_dir: &OwnedFd,
    name: &OsStr,
    rel: &Path,
    need_ino: bool,
) -> Result<u64, MigrateError> {
    let serr = |e| ctx.src_err(rel, e);
    let derr = |e| ctx.dst_err(rel, e);
    for attempt in 0..MAX_TRIES {
        if attempt > 0 {
            ctx.recopied.fetch_add(1, Ordering::Relaxed);
        }
        let before = fsx::stat_fd(fd).map_err(serr)?;
        if before.kind != kind {
            return Err(MigrateError::KeepsChanging { path: ctx.display(rel) });
        }
        if kind == Kind::File {
            let rfd = fsx::reopen(fd.as_fd(), OFlags::RDONLY | OFlags::NOATIME).map_err(serr)?;
            let tmp = fsx::tmpfile(stg_dir).map_err(derr)?;
            let mut copied = 0u64;
            let mut on_chunk = |n: u64| {
                copied += n;
                ctx.add_bytes(n);
                ctx.check_stop().map_err(|_| std::io::Error::from(std::io::ErrorKind::Interrupted))
            };
            if let Err(e) = fsx::copy_sparse(
                rfd.as_fd(),
                tmp.as_fd(),
                before.size,
                before.blocks * 512 >= before.size,
                &mut on_chunk,
            ) {
                ctx.check_stop()?;
                // Both ends report through copy_file_range; only the destination runs out of space.
                return Err(derr(e));
            }
            let x = fsx::xattrs(fd.as_fd()).map_err(serr)?;
            fsx::apply_meta(tmp.as_fd(), &before, &x).map_err(derr)?;
            let after = fsx::stat_fd(fd).map_err(serr)?;
            if after.changed_since(&before) {
                continue;
            }
            // No fsync per file: a killed process loses nothing from the page cache, and after
            // a power loss ext4 shows an unsynced file short (its on-disk size grows only with
            // written blocks), so the resumed pass recopies it. Everything is made durable by
            // one syncfs before `Copied` is recorded, and verification compares content before
            // the swap. Per-file fsync made conversion several times slower than `cp -a`.
            fsx::link_fd(&tmp, stg_dir, name).map_err(derr)?;
            // Data ranges end at block granularity in the census: count the file as a whole.
            ctx.add_bytes(before.data().saturating_sub(copied));
            fault::point(Point::CopyFile);
            // The staging inode number matters only to hard-link groups; skip the stat otherwise.
            return Ok(if need_ino { fsx::stat_fd(&tmp).map_err(derr)?.ino } else { 0 });
        }
        let target = match kind {
            Kind::Symlink => Some(fsx::read_link(fd).map_err(serr)?),
            _ => None,
        };
        fsx::make_special(stg_dir, name, &before, target.as_deref()).map_err(derr)?;
        fault::point(Point::CopySpecialMade);
        let sfd = fsx::open_path(stg_dir, name).map_err(derr)?;
        let x = fsx::xattrs(fd.as_fd()).map_err(serr)?;
        fsx::apply_meta(sfd.as_fd(), &before, &x).map_err(derr)?;
        let after = fsx::stat_fd(fd).map_err(serr)?;
        if after.changed_since(&before) {
            fsx::unlink(stg_dir, name).map_err(derr)?;
            continue;
        }
        fault::point(Point::CopySpecial);
        return Ok(if need_ino { fsx::stat_fd(&sfd).map_err(derr)?.ino } else { 0 });
    }
    Err(MigrateError::KeepsChanging { path: ctx.display(rel) })
}
