//! Verification before the swap: both trees walked side by side (directories in parallel, see
//! walk.rs), every entry compared by type, permissions, owner, size, device number, symlink
//! target, mtime, xattrs, inode flags and project id (directories, and files compared by
//! content), hard-link grouping and (regular files) content. Staging entries that
//! differ are removed so the next copy pass redoes exactly them.
//!
//! A regular file whose source ctime is older than the start of the copy has not changed since
//! it was copied (ctime cannot be set, and every change of content, metadata or xattrs moves it
//! forward), and the copy compared its content with the source's while both were in memory (see
//! copy.rs). For such a file matching metadata completes the proof, without opening or reading
//! either side; any other file is compared byte for byte.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use rayon::prelude::*;
use rustix::fs::OFlags;

use crate::ctx::Ctx;
use crate::fault::{self, Point};
use crate::flags;
use crate::fsx::{self, Kind, Meta, On, Time};
use crate::linkmap::{self, Blob, LinkMap};
use crate::walk::{self, Visitor};
use crate::{remove, MigrateError};

/// A directory with at least this many entries has them compared by several threads.
const PAR_ENTRIES: usize = 256;

/// The differences found; `first` names one for the error message. `sealed`: the immutable and
/// append-only entries of the source (their flags), which the copy gets once verified.
#[derive(Default)]
pub(crate) struct Diff {
    pub count: u64,
    pub first: Option<(PathBuf, String)>,
    /// A difference in an entry that `settled` says did not change since it was copied: the copy
    /// itself is wrong (counted in `count` too).
    pub fatal: Option<(PathBuf, String)>,
    pub sealed: Vec<(PathBuf, u32)>,
}

/// Whether the source entry at a path, as it is now, is unchanged since its copy was made (a live
/// conversion's manifest says so, see catchup.rs).
pub(crate) type Settled<'s> = &'s (dyn Fn(&Path, &Meta) -> bool + Sync);

/// The inode a multiply-linked inode of one tree was first seen paired with in the other.
#[derive(Clone, Copy)]
struct Ino(u64);

impl linkmap::Record for Ino {
    fn encode(&self, _: &mut Blob, _: &OwnedFd) -> io::Result<[u8; linkmap::VALUE]> {
        let mut b = [0; linkmap::VALUE];
        b[..8].copy_from_slice(&self.0.to_le_bytes());
        Ok(b)
    }

    fn decode(b: &[u8; linkmap::VALUE], _: &Blob) -> io::Result<Ino> {
        Ok(Ino(u64::from_le_bytes(b[..8].try_into().map_err(|_| io::Error::other("short record"))?)))
    }
}

struct Verifier<'c, 'a> {
    ctx: &'c Ctx<'a>,
    /// See `Journal::copy_started`; `None` compares every file's content.
    copy_started: Option<Time>,
    settled: Option<Settled<'c>>,
    /// Source inode → staging inode and back, for multiply-linked inodes only; past a threshold
    /// on disk, in staging's filesystem.
    fwd: Mutex<LinkMap<Ino>>,
    back: Mutex<LinkMap<Ino>>,
    diff: Mutex<Diff>,
}

/// A directory pair being compared.
struct Dir {
    src: OwnedFd,
    stg: OwnedFd,
    rel: PathBuf,
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
    copy_started: Option<Time>,
) -> Result<Diff, MigrateError> {
    verify_tree_with(ctx, pool, src_root, stg_root, copy_started, None)
}

/// [`verify_tree`], telling apart with `settled` the differences of entries that did not change.
pub(crate) fn verify_tree_with(
    ctx: &Ctx,
    pool: &rayon::ThreadPool,
    src_root: &OwnedFd,
    stg_root: &OwnedFd,
    copy_started: Option<Time>,
    settled: Option<Settled<'_>>,
) -> Result<Diff, MigrateError> {
    let v = Verifier {
        ctx,
        copy_started,
        settled,
        fwd: Mutex::new(LinkMap::new(stg_root).map_err(|e| ctx.dst_err(Path::new(""), e))?),
        back: Mutex::new(LinkMap::new(stg_root).map_err(|e| ctx.dst_err(Path::new(""), e))?),
        diff: Mutex::new(Diff::default()),
    };
    let root = Path::new("");
    v.compare_dir_meta(src_root, stg_root, root, true)?;
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| ctx.dst_err(root, e));
    let top = Dir { src: dup(src_root)?, stg: dup(stg_root)?, rel: PathBuf::new() };
    pool.install(|| walk::walk(&v, top))?;
    v.diff.into_inner().map_err(|_| MigrateError::Internal("verification state poisoned"))
}

impl Visitor for Verifier<'_, '_> {
    type Dir = Dir;
    type Error = MigrateError;

    fn enter(&self, parent: &Dir, name: &OsStr) -> Result<Option<Dir>, MigrateError> {
        let ctx = self.ctx;
        ctx.check_stop()?;
        let rel = parent.rel.join(name);
        let src = match fsx::open_dir(&parent.src, name) {
            Ok(fd) => fd,
            Err(e) => {
                self.differs(&rel, format!("source directory cannot be opened: {e}"));
                return Ok(None);
            }
        };
        let stg = fsx::open_dir(&parent.stg, name).map_err(|e| ctx.dst_err(&rel, e))?;
        let m = fsx::stat_fd(&src).map_err(|e| ctx.src_err(&rel, e))?;
        ctx.check_entry(&m, &rel)?;
        self.note_sealed(&rel, &m);
        self.compare_dir_meta(&src, &stg, &rel, false)?;
        ctx.file_done();
        Ok(Some(Dir { src, stg, rel }))
    }

    fn visit(&self, d: &Dir, subdirs: &mut dyn FnMut(Vec<OsString>)) -> Result<(), MigrateError> {
        subdirs(self.compare_entries(&d.src, &d.stg, &d.rel)?);
        Ok(())
    }
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

    fn note_sealed(&self, rel: &Path, m: &Meta) {
        if m.sealed != 0 {
            if let Ok(mut d) = self.diff.lock() {
                d.sealed.push((rel.to_path_buf(), m.sealed));
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
        let sx = fsx::xattrs_on(On::Open(src.as_fd())).map_err(|e| ctx.src_err(rel, e))?;
        let dx = fsx::xattrs_on(On::Open(stg.as_fd())).map_err(|e| ctx.dst_err(rel, e))?;
        // The host's own attributes on the root are allowed in addition to the source's.
        let same = if is_root { sx.iter().all(|a| dx.contains(a)) } else { sx == dx };
        if !same {
            self.differs(rel, "directory extended attributes differ".into());
            return Ok(());
        }
        let sa = flags::read(src.as_fd()).map_err(|e| ctx.src_err(rel, e))?;
        let da = flags::read(stg.as_fd()).map_err(|e| ctx.dst_err(rel, e))?;
        if let Some(why) = sa.difference(&da) {
            self.differs(rel, format!("directory {why}"));
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
        let one = |n: OsString| self.compare(src, stg, rel, &n).map(|c| (n, c));
        let results: Vec<(OsString, Cmp)> = if common.len() >= PAR_ENTRIES {
            common.into_par_iter().with_min_len(32).map(one).collect::<Result<_, _>>()?
        } else {
            common.into_iter().map(one).collect::<Result<_, _>>()?
        };
        let mut subdirs = Vec::new();
        for (n, c) in results {
            match c {
                Cmp::Same => {}
                Cmp::Dir => subdirs.push(n),
                Cmp::Differs(why) => {
                    let r = rel.join(&n);
                    if let Some(settled) = self.settled {
                        if let Ok(Some(m)) = fsx::stat_at(src, &n) {
                            if settled(&r, &m) {
                                if let Ok(mut d) = self.diff.lock() {
                                    d.fatal.get_or_insert_with(|| (ctx.display(&r), why.clone()));
                                }
                            }
                        }
                    }
                    // Drop the stale copy so the next copy pass redoes it.
                    remove::remove_tree(stg.as_fd(), &n, false, &|_| Ok(())).map_err(|e| ctx.dst_err(&r, e))?;
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
        let Some(m) = fsx::stat_at(src_dir, name).map_err(|e| ctx.src_err(&rel, e))? else {
            return Ok(Cmp::Differs("vanished from the source".into()));
        };
        let Some(e) = fsx::stat_at(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))? else {
            return Ok(Cmp::Differs("vanished from the copy".into()));
        };
        if m.kind != e.kind {
            return Ok(Cmp::Differs(format!("{} in the source, {} in the copy", m.kind.name(), e.kind.name())));
        }
        if m.kind == Kind::Dir {
            return Ok(Cmp::Dir);
        }
        ctx.check_entry(&m, &rel)?;
        self.note_sealed(&rel, &m);
        if let Some(why) = self.meta_differs(&m, &e)? {
            return Ok(Cmp::Differs(why));
        }
        let unchanged = m.kind == Kind::File && self.copy_started.is_some_and(|t| m.ctime < t);
        if !unchanged {
            if let Some(why) = self.content_differs(src_dir, stg_dir, name, &rel, &m, &e)? {
                return Ok(Cmp::Differs(why));
            }
        } else {
            // Reported like compared bytes: a run of unchanged files must move the bar too.
            ctx.add_bytes(m.data());
        }
        ctx.file_done();
        fault::point(Point::VerifyEntry);
        Ok(Cmp::Same)
    }

    /// What the two entries' metadata and hard-link grouping say.
    fn meta_differs(&self, m: &Meta, e: &Meta) -> Result<Option<String>, MigrateError> {
        if !m.same_copy(e) {
            return Ok(Some("owner, mode, size or times differ".into()));
        }
        // Link groups must map one to one between the trees. The counts themselves may differ: a
        // source file also linked outside the tree has a single name in the copy.
        if m.nlink > 1 || e.nlink > 1 {
            let (fwd, back) = match (self.fwd.lock(), self.back.lock()) {
                (Ok(f), Ok(b)) => (f, b),
                _ => return Err(MigrateError::Internal("verification state poisoned")),
            };
            let (mut fwd, mut back) = (fwd, back);
            let first = |map: &mut LinkMap<Ino>, from: u64, to: u64| -> io::Result<u64> {
                if let Some(Ino(had)) = map.get(from)? {
                    return Ok(had);
                }
                map.insert(from, Ino(to))?;
                Ok(to)
            };
            let err = |e| self.ctx.dst_err(Path::new(""), e);
            let f = first(&mut fwd, m.ino, e.ino).map_err(err)?;
            let b = first(&mut back, e.ino, m.ino).map_err(err)?;
            if f != e.ino || b != m.ino {
                return Ok(Some("hard links differ".into()));
            }
        }
        Ok(None)
    }

    /// Compares xattrs, symlink targets and file contents of the inodes the two names hold
    /// (the ones `m` and `e` describe; a name that moved on since counts as a difference).
    fn content_differs(
        &self,
        src_dir: &OwnedFd,
        stg_dir: &OwnedFd,
        name: &OsStr,
        rel: &Path,
        m: &Meta,
        e: &Meta,
    ) -> Result<Option<String>, MigrateError> {
        let ctx = self.ctx;
        let fd = match fsx::open_path(src_dir, name) {
            Ok(fd) => fd,
            Err(err) if fsx::is_errno(&err, rustix::io::Errno::NOENT) => {
                return Ok(Some("vanished from the source".into()))
            }
            Err(err) => return Err(ctx.src_err(rel, err)),
        };
        let efd = fsx::open_path(stg_dir, name).map_err(|err| ctx.dst_err(rel, err))?;
        let now = fsx::stat_fd(&fd).map_err(|err| ctx.src_err(rel, err))?;
        if now.ino != m.ino
            || now.changed_since(m)
            || fsx::stat_fd(&efd).map_err(|err| ctx.dst_err(rel, err))?.ino != e.ino
        {
            return Ok(Some("changed while it was compared".into()));
        }
        let sx = fsx::xattrs(fd.as_fd()).map_err(|err| ctx.src_err(rel, err))?;
        let dx = fsx::xattrs(efd.as_fd()).map_err(|err| ctx.dst_err(rel, err))?;
        if sx != dx {
            return Ok(Some("extended attributes differ".into()));
        }
        match m.kind {
            Kind::Symlink => {
                let a = fsx::read_link(&fd).map_err(|err| ctx.src_err(rel, err))?;
                let b = fsx::read_link(&efd).map_err(|err| ctx.dst_err(rel, err))?;
                if a != b {
                    return Ok(Some("symlink targets differ".into()));
                }
            }
            Kind::File => {
                let open = |h: &OwnedFd| fsx::reopen(h.as_fd(), OFlags::RDONLY | OFlags::NOATIME);
                let a = open(&fd).map_err(|err| ctx.src_err(rel, err))?;
                let b = open(&efd).map_err(|err| ctx.dst_err(rel, err))?;
                let sa = flags::read(a.as_fd()).map_err(|err| ctx.src_err(rel, err))?;
                if let Some(why) = sa.difference(&flags::read(b.as_fd()).map_err(|err| ctx.dst_err(rel, err))?) {
                    return Ok(Some(why));
                }
                // The copy is compared as the disk has it, not as its pages in memory do: a write
                // the device failed (reported to a run that then stopped) leaves clean pages
                // holding data the disk never got, and a resumed verification reading those would
                // pass a copy that reads differently after the next reboot.
                if let Err(err) = fsx::drop_cached(b.as_fd()) {
                    return Ok(Some(format!("its data did not reach the disk ({err})")));
                }
                let same = fsx::same_content(a.as_fd(), b.as_fd(), m.size, &mut |n| {
                    ctx.bytes_done.fetch_add(n, Ordering::Relaxed);
                    ctx.tick(false);
                })
                .map_err(|err| ctx.dst_err(rel, err))?;
                if !same {
                    return Ok(Some("contents differ".into()));
                }
            }
            _ => {}
        }
        Ok(None)
    }
}

/// Makes the verified copies of the source's immutable and append-only entries so (`sealed`, as
/// the journal recorded them at `Verified`), then makes that durable: the last change to staging
/// before the swap. Repeatable: a resumed swap seals again.
pub(crate) fn seal_copies(stg_root: &OwnedFd, sealed: &[(PathBuf, u32)], source: &Path) -> Result<(), MigrateError> {
    let err = |rel: &Path, e: std::io::Error| MigrateError::CopyFailed { path: source.join(rel), source: e };
    for (rel, bits) in sealed {
        let p = fsx::open_beneath(stg_root, rel).map_err(|e| err(rel, e))?;
        let m = fsx::stat_fd(&p).map_err(|e| err(rel, e))?;
        let dir = if m.kind == Kind::Dir { OFlags::DIRECTORY } else { OFlags::empty() };
        if m.kind != Kind::Dir && m.kind != Kind::File {
            return Err(err(rel, std::io::Error::other("the verified copy is no longer a file or directory")));
        }
        let fd = fsx::reopen(p.as_fd(), OFlags::RDONLY | OFlags::NOATIME | dir).map_err(|e| err(rel, e))?;
        flags::seal(fd.as_fd(), *bits).map_err(|e| err(rel, e))?;
        fault::point(Point::SealEntry);
    }
    if !sealed.is_empty() {
        rustix::fs::syncfs(stg_root).map_err(|e| err(Path::new(""), e.into()))?;
    }
    Ok(())
}
