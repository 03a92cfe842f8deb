//! Move mode: the data moves into staging instead of being copied next to itself, so a nearly
//! full filesystem can be converted. See docs/crash-safety.md for the invariants.
//!
//! One rule says where every entry is, whatever instant a crash hits:
//! - moving in (`back == false`): an entry whose *source* name exists is in the source (a staging
//!   entry of that name is a leftover and is removed before the entry is moved);
//! - moving back (an abort): an entry whose *staging* name exists is in staging (a source entry
//!   of that name is a leftover);
//! - except the one regular file the journal names as in flight, whose data is split: bytes
//!   `[0, size - moved)` under the source name, `[size - moved, size)` under the staging name (a
//!   group's other names, recorded with it, are wherever they exist).
//!
//! Small files move in batches (each copied whole, a directory's worth in parallel on the current
//! rayon pool, then one `syncfs`, then the sources removed),
//! large ones chunk by chunk (copy a chunk, `fdatasync`, record `moved`, then truncate the
//! source, or punch the staging file when moving back). A hard-link group moves after the walk
//! like a large file, in flight with all its names: the data once, then every other name linked
//! at the destination, then the original names removed (see [`Mover::move_groups`]); a group
//! with names outside the tree is copied, its source names staying until the disposal after the
//! swap. Directories are created in staging as they are entered; their original times (which
//! moving entries out of them changes) are kept in a root-only xattr on the staging directory
//! until [`settle`] applies the final metadata.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::copy;
use crate::ctx::Ctx;
use crate::fault::{self, Point};
use crate::fsx::{self, Kind, Meta, Time};
use crate::journal::{HexBytes, HexRel, InFlight, Journal, Workdir};
use crate::{remove, MigrateError};

/// Files larger than this move chunk by chunk; smaller ones are copied whole in batches.
pub(crate) const CHUNK: u64 = 16 << 20;

/// A test override (builds with `fault-injection` only) of a size below.
fn test_override(_var: &str) -> Option<u64> {
    #[cfg(feature = "fault-injection")]
    if let Some(n) = std::env::var(_var).ok().and_then(|v| v.parse::<u64>().ok()) {
        return Some(n.max(1));
    }
    None
}

/// The chunk size (`DIRSEAL_MOVE_CHUNK` in tests, so small files move in many chunks). Any size
/// is safe across runs: progress is recorded in bytes, not chunks.
fn chunk() -> u64 {
    test_override("DIRSEAL_MOVE_CHUNK").map_or(CHUNK, |n| n.max(4096))
}

/// Files per batch (`DIRSEAL_MOVE_BATCH` in tests, so a small tree makes many batches).
fn batch_files() -> usize {
    test_override("DIRSEAL_MOVE_BATCH").map_or(BATCH_FILES, |n| n as usize)
}
/// A batch is synced (and its sources removed) once it holds this many bytes or files.
pub(crate) const BATCH_BYTES: u64 = 16 << 20;
pub(crate) const BATCH_FILES: usize = 1024;
/// The original access and modification times of a directory, on its staging copy until
/// settled: 2 × (i64 seconds, u32 nanoseconds), little-endian. `trusted.` needs CAP_SYS_ADMIN
/// to read or write, so users never see it.
const TIMES: &[u8] = b"trusted.dirseal.times";

fn encode_times(m: &Meta) -> Vec<u8> {
    let mut v = Vec::with_capacity(24);
    for t in [m.atime, m.mtime] {
        v.extend_from_slice(&t.sec.to_le_bytes());
        v.extend_from_slice(&t.nsec.to_le_bytes());
    }
    v
}

fn decode_times(v: &[u8]) -> Option<(Time, Time)> {
    if v.len() != 24 {
        return None;
    }
    let t = |b: &[u8]| {
        let sec = i64::from_le_bytes(b[..8].try_into().ok()?);
        let nsec = u32::from_le_bytes(b[8..12].try_into().ok()?);
        (nsec < 1_000_000_000).then_some(Time { sec, nsec })
    };
    Some((t(&v[..12])?, t(&v[12..])?))
}

/// The recorded times of a staging directory, if it still carries them.
fn recorded_times(x: &[(Vec<u8>, Vec<u8>)]) -> Option<(Time, Time)> {
    x.iter().find(|(n, _)| n == TIMES).and_then(|(_, v)| decode_times(v))
}

/// Removes the times record (settling is done with the directory); absent already is fine.
fn remove_times_xattr(fd: BorrowedFd<'_>) -> io::Result<()> {
    let p = fsx::proc_path(fd);
    match rustix::fs::removexattr(p.as_str(), OsStr::from_bytes(TIMES)) {
        Ok(()) | Err(rustix::io::Errno::NODATA) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn set_times_xattr(fd: BorrowedFd<'_>, m: &Meta) -> io::Result<()> {
    let p = fsx::proc_path(fd);
    rustix::fs::setxattr(p.as_str(), OsStr::from_bytes(TIMES), &encode_times(m), rustix::fs::XattrFlags::empty())?;
    Ok(())
}

/// A directory handle, real (not O_PATH: it must be fsync-able), below `root`.
fn dir_beneath(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    if rel.as_os_str().is_empty() {
        return root.try_clone();
    }
    let p = fsx::open_beneath(root, rel)?;
    fsx::reopen(p.as_fd(), OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOATIME)
}

/// The directory part and the name of a relative path.
fn split(rel: &Path) -> Result<(&Path, &OsStr), MigrateError> {
    match (rel.parent(), rel.file_name()) {
        (Some(p), Some(n)) => Ok((p, n)),
        _ => Err(MigrateError::Internal("an entry without a name")),
    }
}

/// Removes a name; one already gone is fine.
fn remove_name(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    match fsx::unlink(dir, name) {
        Err(e) if fsx::is_errno(&e, Errno::NOENT) => Ok(()),
        r => r,
    }
}

fn interrupted() -> io::Error {
    io::Error::from(io::ErrorKind::Interrupted)
}

/// Moves every entry of one tree into the other (in, or back on abort). Holds the journal for
/// the records of the file in flight.
pub(crate) struct Mover<'c, 'a> {
    pub ctx: &'c Ctx<'a>,
    pub wd: &'c Workdir,
    pub j: &'c mut Journal,
    pub src_root: &'c OwnedFd,
    pub stg_root: &'c OwnedFd,
    pub back: bool,
    batch: Vec<(Rc<OwnedFd>, OsString, PathBuf)>,
    batch_bytes: u64,
    /// Directory times recorded on staging and not yet synced: the next flush syncs even
    /// without a batch.
    times_unsynced: bool,
    /// Multiply-linked files met by the walk (inode → its metadata and the names seen), moved
    /// as groups once the walk has seen every name.
    groups: HashMap<u64, (Meta, Vec<PathBuf>)>,
}

struct Frame {
    /// Shared with the batch entries of this directory (one descriptor, not one per file).
    from: Rc<OwnedFd>,
    to: OwnedFd,
    rel: PathBuf,
    subdirs: Vec<OsString>,
}

impl<'c, 'a> Mover<'c, 'a> {
    pub(crate) fn new(
        ctx: &'c Ctx<'a>,
        wd: &'c Workdir,
        j: &'c mut Journal,
        src_root: &'c OwnedFd,
        stg_root: &'c OwnedFd,
        back: bool,
    ) -> Self {
        Mover {
            ctx,
            wd,
            j,
            src_root,
            stg_root,
            back,
            batch: Vec::new(),
            batch_bytes: 0,
            times_unsynced: false,
            groups: HashMap::new(),
        }
    }

    fn origin_root(&self) -> &'c OwnedFd {
        if self.back {
            self.stg_root
        } else {
            self.src_root
        }
    }

    fn dest_root(&self) -> &'c OwnedFd {
        if self.back {
            self.src_root
        } else {
            self.stg_root
        }
    }

    /// A failure on the side entries come from / go to.
    fn origin_err(&self, rel: &Path, e: io::Error) -> MigrateError {
        if self.back {
            self.ctx.dst_err(rel, e)
        } else {
            self.ctx.src_err(rel, e)
        }
    }

    fn dest_err(&self, rel: &Path, e: io::Error) -> MigrateError {
        self.ctx.dst_err(rel, e)
    }

    /// Moves everything: first the file in flight, then the tree, one directory at a time.
    pub(crate) fn run(&mut self) -> Result<(), MigrateError> {
        if let Some(f) = self.j.inflight.clone() {
            self.large(f)?;
        }
        let root = Path::new("");
        let from = Rc::new(self.origin_root().try_clone().map_err(|e| self.origin_err(root, e))?);
        let to = self.dest_root().try_clone().map_err(|e| self.dest_err(root, e))?;
        self.prepare_dir(&from, &to, root)?;
        let subdirs = self.entries(&from, &to, root)?;
        let mut stack = vec![Frame { from, to, rel: PathBuf::new(), subdirs }];
        while let Some(top) = stack.last_mut() {
            let Some(name) = top.subdirs.pop() else {
                stack.pop();
                continue;
            };
            self.ctx.check_stop()?;
            let rel = top.rel.join(&name);
            let from = match fsx::open_dir(&*top.from, &name) {
                Ok(fd) => Rc::new(fd),
                Err(e) if fsx::is_errno(&e, Errno::NOENT) => continue,
                Err(e) => return Err(self.origin_err(&rel, e)),
            };
            match fsx::stat_at(&top.to, &name).map_err(|e| self.dest_err(&rel, e))? {
                Some(m) if m.kind == Kind::Dir => {}
                other => {
                    if other.is_some() {
                        // A leftover of the other kind under this name (see the rule above).
                        remove::remove_tree(top.to.as_fd(), &name, false, &|_| Ok(()))
                            .map_err(|e| self.dest_err(&rel, e))?;
                    }
                    fsx::mkdir(&top.to, &name).map_err(|e| self.dest_err(&rel, e))?;
                }
            }
            let to = fsx::open_dir(&top.to, &name).map_err(|e| self.dest_err(&rel, e))?;
            self.prepare_dir(&from, &to, &rel)?;
            self.ctx.file_done();
            let subdirs = self.entries(&from, &to, &rel)?;
            stack.push(Frame { from, to, rel, subdirs });
        }
        self.flush()?;
        self.move_groups()
    }

    /// After the walk: each hard-linked regular file whose every name is in the tree moves like
    /// one large file, its other names recorded with it. Moving in, a group with names outside
    /// the tree, or of special files (no data to speak of), is copied instead: its source names
    /// stay until the disposal.
    fn move_groups(&mut self) -> Result<(), MigrateError> {
        let mut groups: Vec<(Meta, Vec<PathBuf>)> = std::mem::take(&mut self.groups).into_values().collect();
        for g in &mut groups {
            g.1.sort();
        }
        groups.sort_by(|a, b| a.1.cmp(&b.1));
        for (m, mut names) in groups {
            self.ctx.check_stop()?;
            let first = names.remove(0);
            let (parent, name) = split(&first)?;
            let from = dir_beneath(self.origin_root(), parent).map_err(|e| self.origin_err(&first, e))?;
            if m.kind == Kind::File && names.len() + 1 >= m.nlink as usize {
                self.start_large(&from, name, &first, &m, names)?;
            } else if !self.back {
                self.copy_group(&from, name, &first, &m, &names)?;
            } else {
                return Err(MigrateError::MoveInconsistent {
                    path: self.ctx.display(&first),
                    reason: "a hard-linked entry in the staging directory has names outside it".into(),
                });
            }
        }
        Ok(())
    }

    /// Copies a file that also has names outside the tree and links its names in the tree to the
    /// copy: its data must stay for the names outside.
    fn copy_group(
        &mut self,
        from: &OwnedFd,
        name: &OsStr,
        first: &Path,
        m: &Meta,
        others: &[PathBuf],
    ) -> Result<(), MigrateError> {
        let ctx = self.ctx;
        let (parent, _) = split(first)?;
        let to = dir_beneath(self.dest_root(), parent).map_err(|e| self.dest_err(first, e))?;
        let fd = fsx::open_path(from, name).map_err(|e| self.origin_err(first, e))?;
        copy::create(ctx, &fd, None, m.kind, &to, name, first, true)?;
        ctx.file_done();
        let copy = fsx::open_path(&to, name).map_err(|e| self.dest_err(first, e))?;
        let ino = fsx::stat_fd(&copy).map_err(|e| self.dest_err(first, e))?.ino;
        for r in others {
            self.link_at_dest(&copy, ino, r)?;
            ctx.add_bytes(if m.kind == Kind::File { m.data() } else { 0 });
            ctx.file_done();
        }
        Ok(())
    }

    /// Makes the destination name `rel` a link to `file` (inode `ino`), replacing what else is
    /// there (a leftover, by the rule above).
    fn link_at_dest(&self, file: &OwnedFd, ino: u64, rel: &Path) -> Result<(), MigrateError> {
        let (parent, name) = split(rel)?;
        let dir = dir_beneath(self.dest_root(), parent).map_err(|e| self.dest_err(rel, e))?;
        match fsx::stat_at(&dir, name).map_err(|e| self.dest_err(rel, e))? {
            Some(e) if e.ino == ino => return Ok(()),
            Some(_) => remove::remove_tree(dir.as_fd(), name, false, &|_| Ok(())).map_err(|e| self.dest_err(rel, e))?,
            None => {}
        }
        fsx::link_fd(file, &dir, name).map_err(|e| self.dest_err(rel, e))
    }

    /// Moving in: before anything leaves a source directory, its staging copy records the
    /// directory's times, since moving entries out changes them. Made durable by the `syncfs`
    /// that precedes every removal from the source ([`Mover::flush`]), not by an fsync each: a
    /// home has thousands of directories.
    fn prepare_dir(&mut self, from: &OwnedFd, to: &OwnedFd, rel: &Path) -> Result<(), MigrateError> {
        if self.back {
            return Ok(());
        }
        let x = fsx::xattrs(to.as_fd()).map_err(|e| self.dest_err(rel, e))?;
        if recorded_times(&x).is_none() {
            let m = fsx::stat_fd(from).map_err(|e| self.origin_err(rel, e))?;
            self.ctx.check_entry(&m, rel)?;
            set_times_xattr(to.as_fd(), &m).map_err(|e| self.dest_err(rel, e))?;
            self.times_unsynced = true;
        }
        Ok(())
    }

    /// Moves the non-directory entries of one directory; returns its subdirectories.
    fn entries(&mut self, from: &Rc<OwnedFd>, to: &OwnedFd, rel: &Path) -> Result<Vec<OsString>, MigrateError> {
        let mut subdirs = Vec::new();
        // Small entries of this directory, copied together (in parallel) once they fill a batch.
        let (mut small, mut small_bytes) = (Vec::new(), 0);
        for name in fsx::list_names(from).map_err(|e| self.origin_err(rel, e))? {
            let r = rel.join(&name);
            let Some(m) = fsx::stat_at(from, &name).map_err(|e| self.origin_err(&r, e))? else { continue };
            if !self.back {
                self.ctx.check_entry(&m, &r)?;
            }
            if m.kind == Kind::Dir {
                subdirs.push(name);
                continue;
            }
            self.ctx.check_stop()?;
            if self.entry(from, to, &name, &r, &m)? {
                small_bytes += if m.kind == Kind::File { m.size } else { 0 };
                small.push((name, r, m.kind));
                if self.batch.len() + small.len() >= batch_files() || self.batch_bytes + small_bytes >= BATCH_BYTES {
                    self.copy_small(from, to, std::mem::take(&mut small), std::mem::take(&mut small_bytes))?;
                    self.flush()?;
                }
            }
        }
        self.copy_small(from, to, small, small_bytes)?;
        Ok(subdirs)
    }

    /// Copies small entries of one directory into its destination twin on the current rayon
    /// pool, then adds them to the batch. Nothing leaves the origin before the batch's `syncfs`
    /// ([`Mover::flush`]), so the rule holds whatever order the workers finish in: a copy whose
    /// origin name still exists is a leftover.
    fn copy_small(
        &mut self,
        from: &Rc<OwnedFd>,
        to: &OwnedFd,
        small: Vec<(OsString, PathBuf, Kind)>,
        bytes: u64,
    ) -> Result<(), MigrateError> {
        use rayon::prelude::*;
        let (ctx, back, dir): (&Ctx, bool, &OwnedFd) = (self.ctx, self.back, from);
        small.par_iter().try_for_each(|(name, rel, kind)| {
            ctx.check_stop()?;
            let fd =
                fsx::open_path(dir, name).map_err(|e| if back { ctx.dst_err(rel, e) } else { ctx.src_err(rel, e) })?;
            copy::create(ctx, &fd, None, *kind, to, name, rel, false)?;
            fault::point(Point::MoveEntryCopied);
            // Counted when copied, so the counter moves with the work, not batch by batch.
            ctx.file_done();
            Ok::<(), MigrateError>(())
        })?;
        self.batch.extend(small.into_iter().map(|(name, rel, _)| (Rc::clone(from), name, rel)));
        self.batch_bytes += bytes;
        Ok(())
    }

    /// Clears the destination name, then moves a large file or notes a hard-link group; returns
    /// whether the entry is a small one, for [`Mover::copy_small`].
    fn entry(
        &mut self,
        from: &Rc<OwnedFd>,
        to: &OwnedFd,
        name: &OsStr,
        rel: &Path,
        m: &Meta,
    ) -> Result<bool, MigrateError> {
        if fsx::stat_at(to, name).map_err(|e| self.dest_err(rel, e))?.is_some() {
            remove::remove_tree(to.as_fd(), name, false, &|_| Ok(())).map_err(|e| self.dest_err(rel, e))?;
        }
        if m.nlink > 1 {
            // Moved as a group once the walk has seen all its names (see move_groups).
            self.groups.entry(m.ino).or_insert_with(|| (*m, Vec::new())).1.push(rel.to_path_buf());
            return Ok(false);
        }
        if m.kind == Kind::File && m.size > chunk() {
            self.flush()?;
            self.start_large(from, name, rel, m, Vec::new())?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Makes the batch's copies (and recorded directory times) durable, then removes their
    /// originals.
    fn flush(&mut self) -> Result<(), MigrateError> {
        if self.batch.is_empty() && !self.times_unsynced {
            return Ok(());
        }
        let root = Path::new("");
        rustix::fs::syncfs(self.dest_root()).map_err(|e| self.dest_err(root, e.into()))?;
        self.times_unsynced = false;
        fault::point(Point::MoveBatchSynced);
        let wipe = self.j.wipe && !self.back;
        for (dir, name, rel) in std::mem::take(&mut self.batch) {
            if wipe {
                let m = fsx::stat_at(&dir, &name).map_err(|e| self.origin_err(&rel, e))?;
                if let Some(m) = m.filter(|m| m.kind == Kind::File) {
                    let p = fsx::open_path(&dir, &name).map_err(|e| self.origin_err(&rel, e))?;
                    if m.size > 0 {
                        let w = fsx::reopen(p.as_fd(), OFlags::WRONLY | OFlags::NOATIME)
                            .map_err(|e| self.origin_err(&rel, e))?;
                        fsx::zero_data(w.as_fd()).map_err(|e| self.origin_err(&rel, e))?;
                    }
                }
            }
            match fsx::unlink(&dir, &name) {
                Ok(()) => {}
                Err(e) if fsx::is_errno(&e, Errno::NOENT) => {}
                Err(e) => return Err(self.origin_err(&rel, e)),
            }
            fault::point(Point::MoveEntryRemoved);
        }
        self.batch_bytes = 0;
        Ok(())
    }

    /// Records a large file (or a hard-link group, with its other names `links`) as in flight,
    /// then moves it.
    fn start_large(
        &mut self,
        from: &OwnedFd,
        name: &OsStr,
        rel: &Path,
        m: &Meta,
        links: Vec<PathBuf>,
    ) -> Result<(), MigrateError> {
        let fd = fsx::open_path(from, name).map_err(|e| self.origin_err(rel, e))?;
        let x = fsx::xattrs(fd.as_fd()).map_err(|e| self.origin_err(rel, e))?;
        let f = InFlight {
            rel: HexRel(rel.to_path_buf()),
            size: m.size,
            moved: if self.back { m.size } else { 0 },
            back: self.back,
            perm: m.perm,
            uid: m.uid,
            gid: m.gid,
            atime: m.atime,
            mtime: m.mtime,
            xattrs: x.into_iter().map(|(n, v)| (HexBytes(n), HexBytes(v))).collect(),
            links: links.into_iter().map(HexRel).collect(),
        };
        self.save(Some(f.clone()), Point::MoveFileStarted)?;
        self.large(f)
    }

    /// Records this file in flight (or none) with the progress counters; `then` is the crash
    /// point right after the record.
    fn save(&mut self, f: Option<InFlight>, then: impl Into<Option<Point>>) -> Result<(), MigrateError> {
        self.j.inflight = f;
        self.ctx.counters_into(self.j);
        self.wd.save(self.j, then)
    }

    /// Moves (the rest of) the file in flight, chunk by chunk, and finishes it.
    fn large(&mut self, mut f: InFlight) -> Result<(), MigrateError> {
        let rel = f.rel.0.clone();
        let (parent, name) = split(&rel).map(|(p, n)| (p.to_path_buf(), n.to_os_string()))?;
        // A group's names share one inode on the side that has them all.
        let names = 1 + f.links.len() as u64;
        let (from_root, to_root) = if f.back { (self.stg_root, self.src_root) } else { (self.src_root, self.stg_root) };
        let from_dir = dir_beneath(from_root, &parent).map_err(|e| self.origin_err(&rel, e))?;
        let to_dir = dir_beneath(to_root, &parent).map_err(|e| self.dest_err(&rel, e))?;
        let n = f.size;
        let chunk = chunk();
        let fresh = if f.back { f.moved == n } else { f.moved == 0 };
        let Some(fm) = fsx::stat_at(&from_dir, &name).map_err(|e| self.origin_err(&rel, e))? else {
            // The original name is gone: the move of this file finished; only the record lags.
            return self.finish_large(&f, &from_dir, &to_dir, &name);
        };
        let lost = |what: &str| MigrateError::MoveInconsistent { path: self.ctx.display(&rel), reason: what.into() };
        if fm.kind != Kind::File || u64::from(fm.nlink) > names {
            return Err(lost("the file in flight is no longer a regular file with the names recorded"));
        }
        let to_meta = fsx::stat_at(&to_dir, &name).map_err(|e| self.dest_err(&rel, e))?;
        let usable = to_meta.is_some_and(|t| t.kind == Kind::File && u64::from(t.nlink) <= names);
        // The destination file of a fresh move (made here, or by a run that died before its
        // first record) is made durable, name and all, with its first chunk: nothing relies on
        // it before that chunk is recorded. Saves two flushes per large file.
        let mut created = fresh;
        if !usable {
            if !fresh {
                return Err(lost("the part already moved is missing"));
            }
            if to_meta.is_some() {
                remove::remove_tree(to_dir.as_fd(), &name, false, &|_| Ok(())).map_err(|e| self.dest_err(&rel, e))?;
            }
            let fd = rustix::fs::openat(
                &to_dir,
                name.as_os_str(),
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                rustix::fs::Mode::from_raw_mode(0o600),
            )
            .map_err(|e| self.dest_err(&rel, e.into()))?;
            drop(fd);
        }
        let dst_path = fsx::open_path(&to_dir, &name).map_err(|e| self.dest_err(&rel, e))?;
        let dst =
            fsx::reopen(dst_path.as_fd(), OFlags::WRONLY | OFlags::NOATIME).map_err(|e| self.dest_err(&rel, e))?;
        let src_path = fsx::open_path(&from_dir, &name).map_err(|e| self.origin_err(&rel, e))?;
        let src =
            fsx::reopen(src_path.as_fd(), OFlags::RDWR | OFlags::NOATIME).map_err(|e| self.origin_err(&rel, e))?;
        // What the destination holds outside its recorded part may be a chunk copied before a
        // crash and never recorded: make it a hole, so the holes of the original stay holes.
        let split = n - f.moved;
        let dst_err = |e| self.dest_err(&rel, e);
        if f.back {
            rustix::fs::ftruncate(&dst, split).map_err(|e| dst_err(e.into()))?;
            rustix::fs::ftruncate(&dst, n).map_err(|e| dst_err(e.into()))?;
        } else {
            rustix::fs::ftruncate(&dst, n).map_err(|e| dst_err(e.into()))?;
            fsx::punch(dst.as_fd(), 0, split).map_err(dst_err)?;
            if fm.size > split {
                rustix::fs::ftruncate(&src, split).map_err(|e| self.origin_err(&rel, e.into()))?;
            }
        }
        let ctx = self.ctx;
        // What an earlier run moved, in data (the unrecorded parts are holes by now).
        let (done_from, done_to) = if f.back { (0, split) } else { (split, n) };
        ctx.add_bytes(fsx::data_in(dst.as_fd(), done_from, done_to).map_err(dst_err)?);
        let mut on_chunk = |k: u64| {
            ctx.add_bytes(k);
            ctx.check_stop().map_err(|_| interrupted())
        };
        loop {
            // A chunk holds up to `chunk` bytes of data, however much hole lies between.
            let (start, end) = if f.back {
                if f.moved == 0 {
                    break;
                }
                let start = n - f.moved;
                (start, fsx::chunk_end(src.as_fd(), start, n, chunk).map_err(|e| self.origin_err(&rel, e))?)
            } else {
                if f.moved == n {
                    break;
                }
                let end = n - f.moved;
                (fsx::chunk_start(src.as_fd(), end, chunk).map_err(|e| self.origin_err(&rel, e))?, end)
            };
            if let Err(e) = fsx::copy_span(src.as_fd(), dst.as_fd(), start, end, &mut on_chunk) {
                ctx.check_stop()?;
                return Err(self.dest_err(&rel, e));
            }
            self.sync_dest(&dst, &to_dir, &mut created, &rel)?;
            fault::point(Point::MoveChunkCopied);
            f.moved = if f.back { n - end } else { n - start };
            self.save(Some(f.clone()), Point::MoveChunkRecorded)?;
            if f.back {
                // Frees the chunk's blocks in staging; a crash before this only delays that.
                match fsx::punch(src.as_fd(), start, end - start) {
                    Ok(()) => {}
                    Err(e) if fsx::is_errno(&e, Errno::OPNOTSUPP) => {}
                    Err(e) => return Err(self.origin_err(&rel, e)),
                }
            } else {
                if self.j.wipe {
                    fsx::zero_span(src.as_fd(), start, end).map_err(|e| self.origin_err(&rel, e))?;
                }
                rustix::fs::ftruncate(&src, start).map_err(|e| self.origin_err(&rel, e.into()))?;
            }
        }
        drop(src);
        if created {
            // No chunk was moved (an empty hard-linked file): made durable here.
            self.sync_dest(&dst, &to_dir, &mut created, &rel)?;
        }
        self.finish_large(&f, &from_dir, &to_dir, &name)
    }

    /// Makes the destination file's data durable before its progress is recorded: `fdatasync`,
    /// or, the first time for a file this run `created`, `fsync` of it and of its directory.
    fn sync_dest(&self, dst: &OwnedFd, dir: &OwnedFd, created: &mut bool, rel: &Path) -> Result<(), MigrateError> {
        let err = |e| self.dest_err(rel, e);
        if std::mem::take(created) {
            fsx::fsync(dst).map_err(err)?;
            fsx::fsync(dir).map_err(err)
        } else {
            rustix::fs::fdatasync(dst).map_err(|e| err(e.into()))
        }
    }

    /// The whole file is at its destination: give it its metadata, make it durable, remove the
    /// original name (durably), and only then forget the file in flight.
    fn finish_large(
        &mut self,
        f: &InFlight,
        from_dir: &OwnedFd,
        to_dir: &OwnedFd,
        name: &OsStr,
    ) -> Result<(), MigrateError> {
        let rel = &f.rel.0;
        let p = fsx::open_path(to_dir, name).map_err(|e| self.dest_err(rel, e))?;
        let m = fsx::stat_fd(&p).map_err(|e| self.dest_err(rel, e))?;
        if m.kind != Kind::File {
            return Err(MigrateError::MoveInconsistent {
                path: self.ctx.display(rel),
                reason: "the moved file is no longer a regular file".into(),
            });
        }
        let want = Meta { perm: f.perm, uid: f.uid, gid: f.gid, atime: f.atime, mtime: f.mtime, ..m };
        let x: Vec<(Vec<u8>, Vec<u8>)> = f.xattrs.iter().map(|(n, v)| (n.0.clone(), v.0.clone())).collect();
        fsx::apply_meta(p.as_fd(), &want, &x).map_err(|e| self.dest_err(rel, e))?;
        let r = fsx::reopen(p.as_fd(), OFlags::RDONLY | OFlags::NOATIME).map_err(|e| self.dest_err(rel, e))?;
        fsx::fsync(&r).map_err(|e| self.dest_err(rel, e))?;
        // A group: every other name is linked at the destination (durably) before any original
        // name goes, and the recorded name goes last, so a resumed run finds the file by it.
        for l in &f.links {
            self.link_at_dest(&p, m.ino, &l.0)?;
            fault::point(Point::MoveLinkMade);
        }
        let root = Path::new("");
        if !f.links.is_empty() {
            rustix::fs::syncfs(self.dest_root()).map_err(|e| self.dest_err(root, e.into()))?;
        }
        for l in &f.links {
            let (parent, other) = split(&l.0)?;
            let dir = dir_beneath(self.origin_root(), parent).map_err(|e| self.origin_err(&l.0, e))?;
            remove_name(&dir, other).map_err(|e| self.origin_err(&l.0, e))?;
            fault::point(Point::MoveLinkRemoved);
        }
        remove_name(from_dir, name).map_err(|e| self.origin_err(rel, e))?;
        if f.links.is_empty() {
            fsx::fsync(from_dir).map_err(|e| self.origin_err(rel, e))?;
        } else {
            rustix::fs::syncfs(self.origin_root()).map_err(|e| self.origin_err(root, e.into()))?;
        }
        fault::point(Point::MoveFileDone);
        self.ctx.file_done();
        for _ in &f.links {
            // Each name counts its data, as a copy counts it (and the census).
            self.ctx.add_bytes(m.data());
            self.ctx.file_done();
        }
        self.save(None, None)
    }
}

/// What [`each_dir`] calls for every directory: the source twin (if it exists), the staging
/// directory, the relative path and whether it is the root.
type DirVisit<'f> = &'f mut dyn FnMut(Option<&OwnedFd>, &OwnedFd, &Path, bool) -> Result<(), MigrateError>;

/// Walks the staging directories (with their source twins), depth first; `f` gets both handles,
/// the relative path, the staging directory's xattrs and whether it is the root.
fn each_dir(src_root: &OwnedFd, stg_root: &OwnedFd, ctx: &Ctx, f: DirVisit<'_>) -> Result<(), MigrateError> {
    let root = Path::new("");
    let mut stack = vec![(
        Some(src_root.try_clone().map_err(|e| ctx.src_err(root, e))?),
        stg_root.try_clone().map_err(|e| ctx.dst_err(root, e))?,
        PathBuf::new(),
    )];
    while let Some((s, t, rel)) = stack.pop() {
        ctx.check_stop()?;
        f(s.as_ref(), &t, &rel, rel.as_os_str().is_empty())?;
        for name in fsx::list_names(&t).map_err(|e| ctx.dst_err(&rel, e))? {
            let r = rel.join(&name);
            match fsx::stat_at(&t, &name).map_err(|e| ctx.dst_err(&r, e))? {
                Some(m) if m.kind == Kind::Dir => {}
                _ => continue,
            }
            let tfd = fsx::open_dir(&t, &name).map_err(|e| ctx.dst_err(&r, e))?;
            let sfd = match &s {
                Some(s) => match fsx::open_dir(s, &name) {
                    Ok(fd) => Some(fd),
                    Err(e) if fsx::is_errno(&e, Errno::NOENT) => None,
                    Err(e) => return Err(ctx.src_err(&r, e)),
                },
                None => None,
            };
            stack.push((sfd, tfd, r));
        }
    }
    Ok(())
}

/// Moving in is finished: every staging directory gets its source twin's owner, mode and xattrs
/// and its recorded times (which removes the record). The host's attributes on the staging root
/// are kept. Idempotent: a directory without a record is settled already.
pub(crate) fn settle(ctx: &Ctx, src_root: &OwnedFd, stg_root: &OwnedFd) -> Result<(), MigrateError> {
    each_dir(src_root, stg_root, ctx, &mut |s, t, rel, is_root| {
        let have = fsx::xattrs(t.as_fd()).map_err(|e| ctx.dst_err(rel, e))?;
        let Some((atime, mtime)) = recorded_times(&have) else { return Ok(()) };
        let Some(s) = s else {
            return Err(MigrateError::MoveInconsistent {
                path: ctx.display(rel),
                reason: "the original directory disappeared during the move".into(),
            });
        };
        let sm = fsx::stat_fd(s).map_err(|e| ctx.src_err(rel, e))?;
        let mut x = fsx::xattrs(s.as_fd()).map_err(|e| ctx.src_err(rel, e))?;
        if is_root {
            for (n, v) in &have {
                if n != TIMES && !x.iter().any(|(m, _)| m == n) {
                    x.push((n.clone(), v.clone()));
                }
            }
        }
        // The record goes last: the metadata is applied with it still present, so a run killed
        // anywhere in between finds the directory unsettled and settles it again (removing the
        // record first left a resumed run taking a half-set directory for settled).
        x.retain(|(n, _)| n != TIMES);
        x.extend(have.into_iter().filter(|(n, _)| n == TIMES));
        fsx::apply_meta(t.as_fd(), &Meta { atime, mtime, ..sm }, &x).map_err(|e| ctx.dst_err(rel, e))?;
        fault::point(Point::SettleTimesKept);
        remove_times_xattr(t.as_fd()).map_err(|e| ctx.dst_err(rel, e))?;
        fault::point(Point::SettleDir);
        Ok(())
    })
}

/// Before moving back (an abort): every staging directory records the original times (settled
/// ones carry them as their own; in an unsettled move a directory without a record was just made,
/// so its source twin is untouched), and every staging copy whose source name still exists is
/// removed, except the names of the file (or group) in flight. After this, "the staging name exists" means "it is there".
pub(crate) fn prepare_back(
    ctx: &Ctx,
    src_root: &OwnedFd,
    stg_root: &OwnedFd,
    inflight: &[&Path],
    settling: bool,
) -> Result<(), MigrateError> {
    each_dir(src_root, stg_root, ctx, &mut |s, t, rel, _| {
        let have = fsx::xattrs(t.as_fd()).map_err(|e| ctx.dst_err(rel, e))?;
        if recorded_times(&have).is_none() {
            let m = match (settling, s) {
                (false, Some(s)) => fsx::stat_fd(s).map_err(|e| ctx.src_err(rel, e))?,
                _ => fsx::stat_fd(t).map_err(|e| ctx.dst_err(rel, e))?,
            };
            set_times_xattr(t.as_fd(), &m).map_err(|e| ctx.dst_err(rel, e))?;
        }
        for name in fsx::list_names(t).map_err(|e| ctx.dst_err(rel, e))? {
            let r = rel.join(&name);
            let Some(m) = fsx::stat_at(t, &name).map_err(|e| ctx.dst_err(&r, e))? else { continue };
            if m.kind == Kind::Dir || inflight.contains(&r.as_path()) {
                continue;
            }
            let in_source = match s {
                Some(s) => fsx::stat_at(s, &name).map_err(|e| ctx.src_err(&r, e))?.is_some(),
                None => false,
            };
            if in_source {
                fsx::unlink(t, &name).map_err(|e| ctx.dst_err(&r, e))?;
            }
        }
        Ok(())
    })
}

/// After moving back: the source directories get their original times again.
pub(crate) fn restore_dir_times(ctx: &Ctx, src_root: &OwnedFd, stg_root: &OwnedFd) -> Result<(), MigrateError> {
    each_dir(src_root, stg_root, ctx, &mut |s, t, rel, _| {
        let have = fsx::xattrs(t.as_fd()).map_err(|e| ctx.dst_err(rel, e))?;
        if let (Some((atime, mtime)), Some(s)) = (recorded_times(&have), s) {
            let sm = fsx::stat_fd(s).map_err(|e| ctx.src_err(rel, e))?;
            let times = Meta { atime, mtime, ..sm }.times();
            rustix::fs::utimensat(s, c"", &times, rustix::fs::AtFlags::EMPTY_PATH)
                .map_err(|e| ctx.src_err(rel, e.into()))?;
        }
        Ok(())
    })
}
