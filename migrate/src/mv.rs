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
//! Small files move in batches of up to 1,024 files, 16 MiB or 64 directories: each copied
//! whole on the current rayon pool, in tasks of 32 that span directories, while this thread walks
//! on; then (all copies of the batch finished) one `syncfs`, then the sources removed, in a pool
//! task beside the next batch's copies ([`Mover::flush`]). Large ones move chunk by chunk (copy a
//! chunk, its encryption on two threads, `fdatasync`, record `moved`, then truncate the
//! source, or punch the staging file when moving back). A hard-link group moves after the walk
//! like a large file, in flight with all its names: the data once, then every other name linked
//! at the destination, then the original names removed (see [`Mover::move_groups`]); a group
//! with names outside the tree is copied, its source names staying until the disposal after the
//! swap. Directories are created in staging as they are entered; their original times (which
//! moving entries out of them changes) are kept in a root-only xattr on the staging directory
//! until [`settle`] applies the final metadata.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::copy;
use crate::ctx::Ctx;
use crate::fault::{self, Point};
use crate::flags;
use crate::fsx::{self, Kind, Meta, Time};
use crate::journal::{HexBytes, HexRel, InFlight, Journal, Workdir};
use crate::{remove, MigrateError};

/// Files larger than this move chunk by chunk; smaller ones are copied whole in batches.
pub(crate) const CHUNK: u64 = 16 << 20;

/// The chunk size (`DIRSEAL_MOVE_CHUNK` in tests, so small files move in many chunks). Any size
/// is safe across runs: progress is recorded in bytes, not chunks.
fn chunk() -> u64 {
    fault::test_override("DIRSEAL_MOVE_CHUNK").map_or(CHUNK, |n| n.max(4096))
}

/// Files per batch (`DIRSEAL_MOVE_BATCH` in tests, so a small tree makes many batches).
fn batch_files() -> usize {
    fault::test_override("DIRSEAL_MOVE_BATCH").map_or(BATCH_FILES, |n| n as usize)
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
    /// Small entries copied (or being copied) whose originals go after the next `syncfs`.
    batch: Vec<(Arc<OwnedFd>, OsString, PathBuf)>,
    batch_bytes: u64,
    /// Origin directories the batch spans: each holds a descriptor until the flush.
    batch_dirs: usize,
    /// Small entries of the batch not yet handed to a worker.
    pending: Vec<Small>,
    /// Directory times recorded on staging and not yet synced: the next flush syncs even
    /// without a batch.
    times_unsynced: bool,
    /// Multiply-linked files met by the walk (inode → its metadata and the names seen), moved
    /// as groups once the walk has seen every name.
    groups: HashMap<u64, (Meta, Vec<PathBuf>)>,
}

/// A small entry to copy: its directories (shared by every entry of the directory: one
/// descriptor each, not one per file), name, path and kind.
struct Small {
    from: Arc<OwnedFd>,
    to: Arc<OwnedFd>,
    name: OsString,
    rel: PathBuf,
    kind: Kind,
}

/// Small entries handed to a worker together (a task per few directories, so the copies of
/// many directories run on every thread while the walk goes on).
const TASK_FILES: usize = 32;

/// A batch also ends once it spans this many origin directories, so the descriptors it holds
/// stay well below the usual limit of 1,024 (a batch of 1,024 one-file directories would not).
const BATCH_DIRS: usize = 64;

/// The copies running on the pool while the walk goes on: how many tasks are unfinished, and
/// the first failure.
struct Copying {
    running: Mutex<usize>,
    idle: Condvar,
    failed: AtomicBool,
    error: Mutex<Option<MigrateError>>,
}

impl Copying {
    fn new() -> Self {
        Copying {
            running: Mutex::new(0),
            idle: Condvar::new(),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, usize> {
        // A poisoned count only means a copy panicked, which the scope re-raises.
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a task on the pool (it is skipped after anyone's failure; its own is kept).
    fn spawn<'s>(&'s self, s: &rayon::Scope<'s>, task: impl FnOnce() -> Result<(), MigrateError> + Send + 's) {
        *self.lock_running() += 1;
        s.spawn(move |_| self.run(task));
    }

    fn run(&self, task: impl FnOnce() -> Result<(), MigrateError>) {
        if !self.failed.load(Ordering::Relaxed) {
            if let Err(e) = task() {
                self.error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                self.failed.store(true, Ordering::Relaxed);
            }
        }
        let mut n = self.lock_running();
        *n -= 1;
        if *n == 0 {
            self.idle.notify_all();
        }
    }

    /// The first failure of a copy, not reported yet.
    fn take(&self) -> Option<MigrateError> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Fails with the first failure of a copy, if any.
    fn check(&self) -> Result<(), MigrateError> {
        if !self.failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        Err(self.take().unwrap_or(MigrateError::Internal("a copy of a small file failed")))
    }

    /// Waits until every copy handed out has finished (running pool tasks meanwhile, so a pool
    /// of one thread cannot wait on itself), then reports the first failure.
    fn wait(&self) -> Result<(), MigrateError> {
        loop {
            if *self.lock_running() == 0 {
                break;
            }
            if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                continue;
            }
            // Nothing left to run here: the remaining tasks run on other threads.
            let n = self.lock_running();
            if *n > 0 {
                let _ = self.idle.wait_timeout(n, Duration::from_millis(10));
            }
        }
        self.check()
    }
}

/// Copies one small entry into its destination twin. Nothing leaves the origin before the
/// batch's `syncfs` ([`Mover::flush`]), so the rule holds whatever order the workers finish in:
/// a copy whose origin name still exists is a leftover.
fn copy_one(ctx: &Ctx, back: bool, it: &Small) -> Result<(), MigrateError> {
    ctx.check_stop()?;
    let rel = &it.rel;
    let fd =
        fsx::open_path(&*it.from, &it.name)
            .map_err(|e| if back { ctx.dst_err(rel, e) } else { ctx.src_err(rel, e) })?;
    copy::create(ctx, &fd, None, it.kind, &it.to, &it.name, rel, false)?;
    fault::point(Point::MoveEntryCopied);
    // Counted when copied, so the counter moves with the work, not batch by batch.
    ctx.file_done();
    Ok(())
}

/// Removes the originals of a batch whose copies are durable (wiped first if asked).
fn remove_originals(
    ctx: &Ctx,
    back: bool,
    wipe: bool,
    batch: Vec<(Arc<OwnedFd>, OsString, PathBuf)>,
) -> Result<(), MigrateError> {
    let err = |rel: &Path, e| if back { ctx.dst_err(rel, e) } else { ctx.src_err(rel, e) };
    for (dir, name, rel) in batch {
        if wipe {
            let m = fsx::stat_at(&*dir, &name).map_err(|e| err(&rel, e))?;
            if let Some(m) = m.filter(|m| m.kind == Kind::File) {
                let p = fsx::open_path(&*dir, &name).map_err(|e| err(&rel, e))?;
                if m.size > 0 {
                    let w = fsx::reopen(p.as_fd(), OFlags::WRONLY | OFlags::NOATIME).map_err(|e| err(&rel, e))?;
                    fsx::zero_data(w.as_fd()).map_err(|e| err(&rel, e))?;
                }
            }
        }
        match fsx::unlink(&*dir, &name) {
            Ok(()) => {}
            Err(e) if fsx::is_errno(&e, Errno::NOENT) => {}
            Err(e) => return Err(err(&rel, e)),
        }
        fault::point(Point::MoveEntryRemoved);
    }
    Ok(())
}

struct Frame {
    /// Shared with the batch entries of this directory (one descriptor, not one per file).
    from: Arc<OwnedFd>,
    to: Arc<OwnedFd>,
    rel: PathBuf,
    subdirs: Vec<OsString>,
    /// Its destination twin was made by this run: it holds nothing but what this run put there.
    fresh: bool,
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
            batch_dirs: 0,
            pending: Vec::new(),
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

    /// Moves everything: first the file in flight, then the tree, one directory at a time, the
    /// small files copied on the pool meanwhile; then the hard-link groups.
    pub(crate) fn run(&mut self) -> Result<(), MigrateError> {
        if let Some(f) = self.j.inflight.clone() {
            self.large(f)?;
        }
        let copying = Copying::new();
        let walked = rayon::in_place_scope(|s| self.walk(s, &copying));
        // Whatever stopped the walk, the scope has waited for every copy handed out; a copy's
        // failure says more than the interruption it may have caused.
        if let Err(MigrateError::Interrupted { .. }) = walked {
            if let Some(e) = copying.take() {
                return Err(e);
            }
        }
        walked?;
        self.move_groups()
    }

    /// The walk proper: directories on this thread, small files handed to the pool in tasks.
    fn walk<'s>(&mut self, s: &rayon::Scope<'s>, copying: &'s Copying) -> Result<(), MigrateError>
    where
        'c: 's,
    {
        let root = Path::new("");
        let from = Arc::new(self.origin_root().try_clone().map_err(|e| self.origin_err(root, e))?);
        let to = Arc::new(self.dest_root().try_clone().map_err(|e| self.dest_err(root, e))?);
        self.prepare_dir(&from, &to, root, false)?;
        let subdirs = self.entries(s, copying, &from, &to, root, false)?;
        let mut stack = vec![Frame { from, to, rel: PathBuf::new(), subdirs, fresh: false }];
        while let Some(top) = stack.last_mut() {
            let Some(name) = top.subdirs.pop() else {
                stack.pop();
                continue;
            };
            self.ctx.check_stop()?;
            copying.check()?;
            let rel = top.rel.join(&name);
            let from = match fsx::open_dir(&*top.from, &name) {
                Ok(fd) => Arc::new(fd),
                Err(e) if fsx::is_errno(&e, Errno::NOENT) => continue,
                Err(e) => return Err(self.origin_err(&rel, e)),
            };
            // In a directory this run made, nothing can be there yet.
            let existing = match top.fresh {
                true => None,
                false => fsx::stat_at(&*top.to, &name).map_err(|e| self.dest_err(&rel, e))?,
            };
            let fresh = match existing {
                Some(m) if m.kind == Kind::Dir => false,
                other => {
                    if other.is_some() {
                        // A leftover of the other kind under this name (see the rule above).
                        remove::remove_tree(top.to.as_fd(), &name, false, &|_| Ok(()))
                            .map_err(|e| self.dest_err(&rel, e))?;
                    }
                    fsx::mkdir(&*top.to, &name).map_err(|e| self.dest_err(&rel, e))?;
                    true
                }
            };
            let to = Arc::new(fsx::open_dir(&*top.to, &name).map_err(|e| self.dest_err(&rel, e))?);
            if fresh {
                fault::point(Point::MoveDirMade);
            }
            self.early_flags(&from, &to, &rel, fresh)?;
            self.prepare_dir(&from, &to, &rel, fresh)?;
            self.ctx.file_done();
            let subdirs = self.entries(s, copying, &from, &to, &rel, fresh)?;
            stack.push(Frame { from, to, rel, subdirs, fresh });
        }
        self.submit(s, copying);
        self.flush(s, copying, true)
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

    /// A destination directory gets the flags of an empty one (casefold) before anything is
    /// made in it. One made before a crash that holds nothing yet gets them now; one that holds
    /// entries without them cannot (a move cannot remake it: its entries are the only copy).
    fn early_flags(&self, from: &OwnedFd, to: &OwnedFd, rel: &Path, fresh: bool) -> Result<(), MigrateError> {
        let want = flags::read(from.as_fd()).map_err(|e| self.origin_err(rel, e))?;
        if !fresh {
            let have = flags::read(to.as_fd()).map_err(|e| self.dest_err(rel, e))?;
            if !want.early_differs(&have) {
                return Ok(());
            }
            if !fsx::list_names(to).map_err(|e| self.dest_err(rel, e))?.is_empty() {
                return Err(MigrateError::MoveInconsistent {
                    path: self.ctx.display(rel),
                    reason: "its staging copy holds entries but lacks the inode flags of the original (casefold)"
                        .into(),
                });
            }
        }
        flags::set_early(to.as_fd(), &want).map_err(|e| self.dest_err(rel, e))
    }

    /// Moving in: before anything leaves a source directory, its staging copy records the
    /// directory's times, since moving entries out changes them. Made durable by the `syncfs`
    /// that precedes every removal from the source ([`Mover::flush`]), not by an fsync each: a
    /// home has thousands of directories. `fresh`: the staging copy was just made (no record).
    fn prepare_dir(&mut self, from: &OwnedFd, to: &OwnedFd, rel: &Path, fresh: bool) -> Result<(), MigrateError> {
        if self.back {
            return Ok(());
        }
        let recorded = !fresh && recorded_times(&fsx::xattrs(to.as_fd()).map_err(|e| self.dest_err(rel, e))?).is_some();
        if !recorded {
            let m = fsx::stat_fd(from).map_err(|e| self.origin_err(rel, e))?;
            self.ctx.check_entry(&m, rel)?;
            set_times_xattr(to.as_fd(), &m).map_err(|e| self.dest_err(rel, e))?;
            self.times_unsynced = true;
        }
        Ok(())
    }

    /// Moves the non-directory entries of one directory; returns its subdirectories. Small
    /// entries join the batch and are copied on the pool in tasks of a few directories' worth
    /// while the walk goes on; a large file waits for the batch ([`Mover::flush`]) and moves
    /// here; hard-link groups are noted for [`Mover::move_groups`].
    fn entries<'s>(
        &mut self,
        s: &rayon::Scope<'s>,
        copying: &'s Copying,
        from: &Arc<OwnedFd>,
        to: &Arc<OwnedFd>,
        rel: &Path,
        fresh: bool,
    ) -> Result<Vec<OsString>, MigrateError>
    where
        'c: 's,
    {
        let mut subdirs = Vec::new();
        // The destination's names, listed once (a `statx` per entry before): a name there is a
        // leftover to clear before its entry moves (see the rule above).
        let leftovers: HashSet<OsString> = match fresh {
            true => HashSet::new(),
            false => fsx::list_names(&**to).map_err(|e| self.dest_err(rel, e))?.into_iter().collect(),
        };
        for name in fsx::list_names(&**from).map_err(|e| self.origin_err(rel, e))? {
            let r = rel.join(&name);
            let Some(m) = fsx::stat_at(&**from, &name).map_err(|e| self.origin_err(&r, e))? else { continue };
            if !self.back {
                self.ctx.check_entry(&m, &r)?;
                if m.sealed != 0 {
                    return Err(MigrateError::ImmutableInMove { path: self.ctx.display(&r) });
                }
            }
            if m.kind == Kind::Dir {
                subdirs.push(name);
                continue;
            }
            self.ctx.check_stop()?;
            copying.check()?;
            if leftovers.contains(&name) {
                remove::remove_tree(to.as_fd(), &name, false, &|_| Ok(())).map_err(|e| self.dest_err(&r, e))?;
            }
            if m.nlink > 1 {
                // Moved as a group once the walk has seen all its names (see move_groups).
                self.groups.entry(m.ino).or_insert_with(|| (m, Vec::new())).1.push(r);
                continue;
            }
            if m.kind == Kind::File && m.size > chunk() {
                self.submit(s, copying);
                self.flush(s, copying, true)?;
                self.start_large(from, &name, &r, &m, Vec::new())?;
                continue;
            }
            if self.batch.last().is_none_or(|(d, _, _)| !Arc::ptr_eq(d, from)) {
                self.batch_dirs += 1;
            }
            self.batch.push((Arc::clone(from), name.clone(), r.clone()));
            self.batch_bytes += if m.kind == Kind::File { m.size } else { 0 };
            self.pending.push(Small { from: Arc::clone(from), to: Arc::clone(to), name, rel: r, kind: m.kind });
            if self.pending.len() >= TASK_FILES {
                self.submit(s, copying);
            }
            if self.batch.len() >= batch_files() || self.batch_bytes >= BATCH_BYTES || self.batch_dirs >= BATCH_DIRS {
                self.submit(s, copying);
                self.flush(s, copying, false)?;
            }
        }
        Ok(subdirs)
    }

    /// Hands the pending small entries to a pool task.
    fn submit<'s>(&mut self, s: &rayon::Scope<'s>, copying: &'s Copying)
    where
        'c: 's,
    {
        if self.pending.is_empty() {
            return;
        }
        let items = std::mem::take(&mut self.pending);
        let (ctx, back) = (self.ctx, self.back);
        copying.spawn(s, move || {
            for it in &items {
                if copying.failed.load(Ordering::Relaxed) {
                    break;
                }
                copy_one(ctx, back, it)?;
            }
            Ok(())
        });
    }

    /// Ends the batch: waits for its copies (and the previous batch's sync and removals), then,
    /// on the pool while the walk and the next batch's copies go on, makes them (and the
    /// directory times recorded so far) durable with one `syncfs` and only then removes their
    /// originals. The next batch's originals stay until its own `syncfs`, so whatever that
    /// `syncfs` catches of them early changes nothing. Every pending entry must have been
    /// submitted. `last`: all of it has finished when this returns.
    fn flush<'s>(&mut self, s: &rayon::Scope<'s>, copying: &'s Copying, last: bool) -> Result<(), MigrateError>
    where
        'c: 's,
    {
        debug_assert!(self.pending.is_empty(), "a flush with small entries not handed out");
        copying.wait()?;
        if !self.batch.is_empty() || self.times_unsynced {
            // Times recorded from here on are not covered by this sync: the next one covers them.
            self.times_unsynced = false;
            let (ctx, back, wipe, dest) = (self.ctx, self.back, self.j.wipe && !self.back, self.dest_root());
            let batch = std::mem::take(&mut self.batch);
            copying.spawn(s, move || {
                rustix::fs::syncfs(dest).map_err(|e| ctx.dst_err(Path::new(""), e.into()))?;
                fault::point(Point::MoveBatchSynced);
                remove_originals(ctx, back, wipe, batch)
            });
            self.batch_bytes = 0;
            self.batch_dirs = 0;
        }
        if last {
            copying.wait()?;
        }
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
        let attrs = flags::read_handle(fd.as_fd()).map_err(|e| self.origin_err(rel, e))?;
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
            attrs,
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
            // Compression and no-COW only go onto an empty file.
            flags::set_early(fd.as_fd(), &f.attrs).map_err(|e| self.dest_err(&rel, e))?;
            drop(fd);
        }
        let dst_path = fsx::open_path(&to_dir, &name).map_err(|e| self.dest_err(&rel, e))?;
        let dst = Arc::new(
            fsx::reopen(dst_path.as_fd(), OFlags::WRONLY | OFlags::NOATIME).map_err(|e| self.dest_err(&rel, e))?,
        );
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
            // The chunk is encrypted on its way to the disk, by whichever thread writes it
            // back: half on another thread, half here, then the sync waits for both (one
            // thread alone encrypted at half the speed of copy mode's parallel writeback).
            let mid = start + (end - start) / 2;
            copy::writeback_elsewhere(&dst, Some((start, mid - start)));
            fsx::start_writeback(&*dst, Some((mid, end - mid)));
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
        let r = fsx::reopen(p.as_fd(), OFlags::RDONLY | OFlags::NOATIME).map_err(|e| self.dest_err(rel, e))?;
        flags::apply(r.as_fd(), &f.attrs).map_err(|e| self.dest_err(rel, e))?;
        // Read back: a move has no verification pass to find a flag the filesystem dropped.
        if let Some(why) = f.attrs.difference(&flags::read(r.as_fd()).map_err(|e| self.dest_err(rel, e))?) {
            return Err(MigrateError::MoveInconsistent {
                path: self.ctx.display(rel),
                reason: format!("the moved file's {why}"),
            });
        }
        fsx::apply_meta(p.as_fd(), &want, &x).map_err(|e| self.dest_err(rel, e))?;
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
/// the relative path, the staging directory's xattrs and whether it is the root. Only the
/// directories on the current path hold descriptors (a directory's subdirectories are opened as
/// they are reached: opened all at once, a root of a few hundred hit the descriptor limit).
fn each_dir(src_root: &OwnedFd, stg_root: &OwnedFd, ctx: &Ctx, f: DirVisit<'_>) -> Result<(), MigrateError> {
    struct Level {
        s: Option<OwnedFd>,
        t: OwnedFd,
        rel: PathBuf,
        subdirs: Vec<OsString>,
    }
    let mut visit = |s: Option<OwnedFd>, t: OwnedFd, rel: PathBuf| -> Result<Level, MigrateError> {
        ctx.check_stop()?;
        f(s.as_ref(), &t, &rel, rel.as_os_str().is_empty())?;
        let mut subdirs = Vec::new();
        for name in fsx::list_names(&t).map_err(|e| ctx.dst_err(&rel, e))? {
            let r = rel.join(&name);
            if let Some(m) = fsx::stat_at(&t, &name).map_err(|e| ctx.dst_err(&r, e))? {
                if m.kind == Kind::Dir {
                    subdirs.push(name);
                }
            }
        }
        Ok(Level { s, t, rel, subdirs })
    };
    let root = Path::new("");
    let top = visit(
        Some(src_root.try_clone().map_err(|e| ctx.src_err(root, e))?),
        stg_root.try_clone().map_err(|e| ctx.dst_err(root, e))?,
        PathBuf::new(),
    )?;
    let mut stack = vec![top];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.subdirs.pop() else {
            stack.pop();
            continue;
        };
        let r = top.rel.join(&name);
        let tfd = fsx::open_dir(&top.t, &name).map_err(|e| ctx.dst_err(&r, e))?;
        let sfd = match &top.s {
            Some(s) => match fsx::open_dir(s, &name) {
                Ok(fd) => Some(fd),
                Err(e) if fsx::is_errno(&e, Errno::NOENT) => None,
                Err(e) => return Err(ctx.src_err(&r, e)),
            },
            None => None,
        };
        let next = visit(sfd, tfd, r)?;
        stack.push(next);
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
        let attrs = flags::read(s.as_fd()).map_err(|e| ctx.src_err(rel, e))?;
        flags::apply(t.as_fd(), &attrs).map_err(|e| ctx.dst_err(rel, e))?;
        if let Some(why) = attrs.difference(&flags::read(t.as_fd()).map_err(|e| ctx.dst_err(rel, e))?) {
            return Err(MigrateError::MoveInconsistent {
                path: ctx.display(rel),
                reason: format!("the settled directory's {why}"),
            });
        }
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
