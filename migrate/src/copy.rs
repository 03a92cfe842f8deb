//! The copy pass: makes the staging tree equal to the source tree, one directory per task (see
//! walk.rs), directories in parallel.
//!
//! Invariant that makes resuming cheap and safe: a name present in staging is complete. Regular
//! files are written into an `O_TMPFILE`, read back and compared while the data is in memory,
//! given their metadata and only then linked under their name (made durable all at once by a
//! `syncfs` before `Copied` is recorded). Other entries get their modification time last, so one
//! whose type, owner, mode, xattrs and mtime match the source is finished. A resumed pass
//! therefore walks the tree again but copies only what is missing, stale or half-made, and
//! removes what the source no longer has.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::ctx::Ctx;
use crate::fault::{self, Point};
use crate::flags;
use crate::fsx::{self, Kind, Meta, On};
use crate::linkmap::{self, Blob, LinkMap};
use crate::walk::{self, Visitor};
use crate::{remove, MigrateError};

/// How often one file may be seen changing under the copy before the conversion gives up on it.
const MAX_TRIES: usize = 5;

/// A directory with at least this many files has them copied by several threads (directories
/// are spread over the threads anyway; this is for one large flat directory).
const PAR_FILES: usize = 256;

/// Files opened together, their data requested at once before the first is copied: the reads
/// of a directory's small files then reach the disk as one batch instead of one wait per file.
const AHEAD: usize = 32;

/// How much of a file is requested ahead (a small file whole, the start of a large one).
const AHEAD_BYTES: u64 = 256 * 1024;

/// A large file's writeback is started, from another thread, each time this much more was copied.
const WRITEBACK_EVERY: u64 = 8 << 20;

/// A source entry opened ahead of its copy.
struct Opened {
    /// The O_PATH handle that pins the inode.
    fd: OwnedFd,
    m: Meta,
    /// A regular file that will be copied, opened for reading, its first bytes requested.
    rfd: Option<OwnedFd>,
}

/// The first staging name of a source inode with several links; later names link to it.
#[derive(Clone)]
struct Rep {
    rel: PathBuf,
    stg_ino: u64,
}

impl linkmap::Record for Rep {
    fn encode(&self, blob: &mut Blob, dir: &OwnedFd) -> io::Result<[u8; linkmap::VALUE]> {
        let (at, len) = blob.push(self.rel.as_os_str().as_bytes(), dir)?;
        let mut b = [0; linkmap::VALUE];
        b[..8].copy_from_slice(&self.stg_ino.to_le_bytes());
        b[8..16].copy_from_slice(&at.to_le_bytes());
        b[16..20].copy_from_slice(&len.to_le_bytes());
        Ok(b)
    }

    fn decode(b: &[u8; linkmap::VALUE], blob: &Blob) -> io::Result<Rep> {
        let word = |r| linkmap::word(b, r);
        let rel = blob.read(word(8..16), word(16..20) as u32)?;
        Ok(Rep { rel: PathBuf::from(OsString::from_vec(rel)), stg_ino: word(0..8) })
    }
}

enum Entry {
    Done,
    IsDir,
}

/// What a live conversion's catch-up pass (catchup.rs) asks of a copy pass: whether a staging
/// entry is still good, judged by the source entry's identity rather than its mtime, and each
/// entry's identity as read before its data was.
pub(crate) trait Catchup: Sync {
    /// Whether the entry at `rel`, as `m` says it is now, is the one the previous pass saw (so
    /// its staging copy is good); `None` when there was no previous pass (then an entry matching
    /// by metadata is kept, as in a resumed copy).
    fn unchanged(&self, rel: &Path, m: &Meta) -> Option<bool>;
    /// `m` was read at `rel` before its data; `copied`: this pass wrote or linked it anew.
    fn seen(&self, rel: &Path, m: &Meta, copied: bool);
    /// The file at `rel` kept changing while it was copied: whether to leave it to the next pass
    /// (its staging name stays absent) rather than fail.
    fn unsettled(&self, rel: &Path) -> bool;
}

struct Copier<'c, 'a> {
    ctx: &'c Ctx<'a>,
    live: Option<&'c dyn Catchup>,
    stg_root: BorrowedFd<'c>,
    /// Only inodes with more than one link; past a threshold on disk, in staging's filesystem.
    links: Mutex<LinkMap<Rep>>,
    /// Held while a multiply-linked file is handled: one thread at a time creates or links the
    /// members of link groups, so two names of one inode never race to be its first copy.
    link_turn: Mutex<()>,
}

/// A directory pair being copied.
struct Dir {
    src: OwnedFd,
    stg: OwnedFd,
    rel: PathBuf,
}

/// Copies `src_root` into `stg_root` (whose own xattrs set by the host are kept). In a pass of a
/// live conversion, `live` decides what is kept and hears of every entry.
pub(crate) fn copy_tree(
    ctx: &Ctx,
    pool: &rayon::ThreadPool,
    src_root: &OwnedFd,
    stg_root: &OwnedFd,
    live: Option<&dyn Catchup>,
) -> Result<(), MigrateError> {
    let root = Path::new("");
    let links = LinkMap::new(stg_root).map_err(|e| ctx.dst_err(root, e))?;
    let c = Copier { ctx, live, stg_root: stg_root.as_fd(), links: Mutex::new(links), link_turn: Mutex::new(()) };
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| ctx.dst_err(root, e));
    let top = Dir { src: dup(src_root)?, stg: dup(stg_root)?, rel: PathBuf::new() };
    pool.install(|| walk::walk(&c, top))
}

impl Visitor for Copier<'_, '_> {
    type Dir = Dir;
    type Error = MigrateError;

    fn enter(&self, parent: &Dir, name: &OsStr) -> Result<Option<Dir>, MigrateError> {
        self.ctx.check_stop()?;
        self.enter_dir(parent, name)
    }

    fn visit(&self, d: &Dir, subdirs: &mut dyn FnMut(Vec<OsString>)) -> Result<(), MigrateError> {
        self.sync_entries(&d.src, &d.stg, &d.rel, subdirs)
    }

    fn leave(&self, _parent: Option<&Dir>, d: &Dir) -> Result<(), MigrateError> {
        self.finish_dir(&d.src, &d.stg, &d.rel, d.rel.as_os_str().is_empty())
    }
}

impl Copier<'_, '_> {
    /// Opens a subdirectory, creating it in staging.
    fn enter_dir(&self, parent: &Dir, name: &OsStr) -> Result<Option<Dir>, MigrateError> {
        let ctx = self.ctx;
        let (src_dir, stg_dir) = (&parent.src, &parent.stg);
        let rel = parent.rel.join(name);
        let pfd = match fsx::open_path(src_dir, name) {
            Ok(fd) => fd,
            Err(e) if fsx::is_errno(&e, Errno::NOENT) => return Ok(None),
            Err(e) => return Err(ctx.src_err(&rel, e)),
        };
        let m = fsx::stat_fd(&pfd).map_err(|e| ctx.src_err(&rel, e))?;
        ctx.check_entry(&m, &rel)?;
        if m.kind != Kind::Dir {
            // Replaced by something else since the listing.
            let in_stg = fsx::stat_at(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?.is_some();
            if let Some(o) = self.open_ahead(src_dir, &parent.rel, name, in_stg)? {
                self.entry(stg_dir, &parent.rel, name, in_stg, o)?;
            }
            return Ok(None);
        }
        let src = fsx::reopen(pfd.as_fd(), OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOATIME)
            .map_err(|e| ctx.src_err(&rel, e))?;
        let attrs = flags::read(src.as_fd()).map_err(|e| ctx.src_err(&rel, e))?;
        let existing = match fsx::stat_at(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))? {
            Some(d) if d.kind == Kind::Dir => {
                let stg = fsx::open_dir(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
                // Casefold (and the other flags of an empty directory) cannot be set on one that
                // holds entries: a copy made without them is made again.
                let have = flags::read(stg.as_fd()).map_err(|e| ctx.dst_err(&rel, e))?;
                if attrs.early_differs(&have) {
                    remove::remove_tree(stg_dir.as_fd(), name, false, &|_| Ok(())).map_err(|e| ctx.dst_err(&rel, e))?;
                    None
                } else {
                    Some(stg)
                }
            }
            None => None,
            Some(_) => {
                remove::remove_tree(stg_dir.as_fd(), name, false, &|_| Ok(())).map_err(|e| ctx.dst_err(&rel, e))?;
                None
            }
        };
        let stg = match existing {
            Some(stg) => stg,
            None => {
                fsx::mkdir(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
                let stg = fsx::open_dir(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
                fault::point(Point::CopyDirMade);
                // While it is empty: a crash before this leaves an empty directory without the
                // flags, which the resumed pass makes again (above).
                flags::set_early(stg.as_fd(), &attrs).map_err(|e| ctx.dst_err(&rel, e))?;
                stg
            }
        };
        ctx.file_done();
        Ok(Some(Dir { src, stg, rel }))
    }

    /// Directory metadata goes on after all children, so their creation does not disturb the
    /// times. Durability comes from one `syncfs` before `Copied` is recorded (see `create`).
    fn finish_dir(&self, src: &OwnedFd, stg: &OwnedFd, rel: &Path, is_root: bool) -> Result<(), MigrateError> {
        let ctx = self.ctx;
        let m = fsx::stat_fd(src).map_err(|e| ctx.src_err(rel, e))?;
        let mut x = fsx::xattrs_on(On::Open(src.as_fd())).map_err(|e| ctx.src_err(rel, e))?;
        if is_root {
            // The host may have put attributes on the staging root (e.g. a recovery blob); keep them.
            let have = fsx::xattrs_on(On::Open(stg.as_fd())).map_err(|e| ctx.dst_err(rel, e))?;
            for (n, v) in have {
                if !x.iter().any(|(m, _)| *m == n) {
                    x.push((n, v));
                }
            }
        }
        let attrs = flags::read(src.as_fd()).map_err(|e| ctx.src_err(rel, e))?;
        flags::apply(stg.as_fd(), &attrs).map_err(|e| ctx.dst_err(rel, e))?;
        fsx::apply_meta_on(On::Open(stg.as_fd()), &m, &x).map_err(|e| ctx.dst_err(rel, e))?;
        fault::point(Point::CopyDir);
        Ok(())
    }

    /// Makes the non-directory entries of one staging directory equal to the source's; hands the
    /// source's subdirectories to `subdirs` first, so they are copied meanwhile.
    fn sync_entries(
        &self,
        src: &OwnedFd,
        stg: &OwnedFd,
        rel: &Path,
        subdirs: &mut dyn FnMut(Vec<OsString>),
    ) -> Result<(), MigrateError> {
        let ctx = self.ctx;
        let entries = fsx::list(src).map_err(|e| ctx.src_err(rel, e))?;
        let wanted: HashSet<&OsStr> = entries.iter().map(|(n, _)| n.as_os_str()).collect();
        let mut in_stg = HashSet::new();
        for n in fsx::list_names(stg).map_err(|e| ctx.dst_err(rel, e))? {
            if wanted.contains(n.as_os_str()) {
                in_stg.insert(n);
            } else {
                remove::remove_tree(stg.as_fd(), &n, false, &|_| Ok(())).map_err(|e| ctx.dst_err(&rel.join(&n), e))?;
            }
        }
        // The listing's types only sort the work: each entry is checked on the inode it opens.
        let (mut dirs, mut files) = (Vec::new(), Vec::new());
        for (n, kind) in entries {
            if kind == Some(Kind::Dir) {
                dirs.push(n);
            } else {
                files.push(n);
            }
        }
        subdirs(dirs);
        // Each batch: open every file and request its data, then copy them one by one.
        let batch = |names: &[OsString]| -> Result<Vec<OsString>, MigrateError> {
            let mut opened = Vec::with_capacity(names.len());
            for n in names {
                opened.push(self.open_ahead(src, rel, n, in_stg.contains(n))?);
            }
            let mut turned = Vec::new();
            for (n, o) in names.iter().zip(opened) {
                let Some(o) = o else { continue };
                if let Entry::IsDir = self.entry(stg, rel, n, in_stg.contains(n), o)? {
                    turned.push(n.clone());
                }
            }
            Ok(turned)
        };
        let turned: Vec<Vec<OsString>> = if files.len() >= PAR_FILES {
            files.par_chunks(AHEAD).map(batch).collect::<Result<_, _>>()?
        } else {
            files.chunks(AHEAD).map(batch).collect::<Result<_, _>>()?
        };
        // Entries that are directories after all (of an unknown type in the listing, or replaced).
        subdirs(turned.into_iter().flatten().collect());
        Ok(())
    }

    /// Opens a source entry for [`Copier::entry`] (`None`: it vanished), and if it is a regular
    /// file that will be copied (`in_stg`: staging's listing has the name, so it may already be
    /// there), opens it for reading and asks for its data without waiting.
    fn open_ahead(
        &self,
        src_dir: &OwnedFd,
        rel_dir: &Path,
        name: &OsStr,
        in_stg: bool,
    ) -> Result<Option<Opened>, MigrateError> {
        let ctx = self.ctx;
        let fd = match fsx::open_path(src_dir, name) {
            Ok(fd) => fd,
            Err(e) if fsx::is_errno(&e, Errno::NOENT) => {
                ctx.file_done();
                return Ok(None);
            }
            Err(e) => return Err(ctx.src_err(&rel_dir.join(name), e)),
        };
        let m = fsx::stat_fd(&fd).map_err(|e| ctx.src_err(&rel_dir.join(name), e))?;
        // Before anything is opened for reading: an entry of another mount or an encrypted one
        // is refused as such.
        ctx.check_entry(&m, &rel_dir.join(name))?;
        let rfd = if m.kind == Kind::File && m.nlink == 1 && !in_stg && m.size > 0 {
            let rfd = fsx::reopen(fd.as_fd(), OFlags::RDONLY | OFlags::NOATIME)
                .map_err(|e| ctx.src_err(&rel_dir.join(name), e))?;
            fsx::read_ahead(&rfd, m.size.min(AHEAD_BYTES));
            Some(rfd)
        } else {
            None
        };
        Ok(Some(Opened { fd, m, rfd }))
    }

    /// Brings one non-directory entry up to date in staging. `in_stg`: staging's listing has the
    /// name (when it does not, there is nothing there to look at: nobody else writes staging).
    fn entry(
        &self,
        stg_dir: &OwnedFd,
        rel_dir: &Path,
        name: &OsStr,
        in_stg: bool,
        o: Opened,
    ) -> Result<Entry, MigrateError> {
        let ctx = self.ctx;
        ctx.check_stop()?;
        let rel = rel_dir.join(name);
        let Opened { fd, m, rfd } = o;
        if m.kind == Kind::Dir {
            return Ok(Entry::IsDir);
        }
        let _turn = match m.nlink {
            1 => None,
            _ => Some(self.link_turn.lock().map_err(|_| MigrateError::Internal("hard-link state poisoned"))?),
        };
        let existing = match in_stg {
            true => fsx::stat_at(stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?,
            false => None,
        };
        let rep = if m.nlink > 1 { self.rep(m.ino).map_err(|e| ctx.dst_err(&rel, e))? } else { None };
        if let Some(rep) = rep {
            if existing.as_ref().map(|e| e.ino) != Some(rep.stg_ino) {
                if existing.is_some() {
                    remove::remove_tree(stg_dir.as_fd(), name, false, &|_| Ok(())).map_err(|e| ctx.dst_err(&rel, e))?;
                }
                let rfd = fsx::open_beneath(self.stg_root, &rep.rel).map_err(|e| ctx.dst_err(&rep.rel, e))?;
                let rm = fsx::stat_fd(&rfd).map_err(|e| ctx.dst_err(&rep.rel, e))?;
                if rm.ino != rep.stg_ino {
                    return Err(
                        ctx.dst_err(&rel, std::io::Error::other("the staging copy changed under the conversion"))
                    );
                }
                fsx::link_fd(&rfd, stg_dir, name).map_err(|e| ctx.dst_err(&rel, e))?;
                self.seen(&rel, &m, true);
            } else {
                self.seen(&rel, &m, false);
            }
            ctx.add_bytes(if m.kind == Kind::File { m.data() } else { 0 });
            ctx.file_done();
            return Ok(Entry::Done);
        }
        if let Some(e) = existing {
            let keep = match self.live.and_then(|l| l.unchanged(&rel, &m)) {
                // mtime alone never decides: the identity does, metadata only confirms.
                Some(same) => same && m.same_copy(&e) && !(m.nlink == 1 && e.nlink != 1),
                None => self.matches(&fd, &m, stg_dir, name, &e, &rel)?,
            };
            if keep {
                if m.nlink > 1 {
                    self.set_rep(m.ino, &rel, e.ino).map_err(|e| ctx.dst_err(&rel, e))?;
                }
                self.seen(&rel, &m, false);
                ctx.add_bytes(if m.kind == Kind::File { m.data() } else { 0 });
                ctx.file_done();
                return Ok(Entry::Done);
            }
            remove::remove_tree(stg_dir.as_fd(), name, false, &|_| Ok(())).map_err(|e| ctx.dst_err(&rel, e))?;
        }
        let stg_ino = match create(ctx, &fd, Some((&m, rfd)), m.kind, stg_dir, name, &rel, m.nlink > 1) {
            // A live pass leaves a file that keeps changing to the next: the directory is in use.
            Err(MigrateError::KeepsChanging { .. }) if self.live.is_some_and(|l| l.unsettled(&rel)) => {
                ctx.file_done();
                return Ok(Entry::Done);
            }
            r => r?,
        };
        if m.nlink > 1 {
            self.set_rep(m.ino, &rel, stg_ino).map_err(|e| ctx.dst_err(&rel, e))?;
        }
        self.seen(&rel, &m, true);
        ctx.file_done();
        Ok(Entry::Done)
    }

    fn seen(&self, rel: &Path, m: &Meta, copied: bool) {
        if let Some(l) = self.live {
            l.seen(rel, m, copied);
        }
    }

    fn rep(&self, ino: u64) -> io::Result<Option<Rep>> {
        self.links.lock().map_err(|_| io::Error::other("hard-link state poisoned"))?.get(ino)
    }

    fn set_rep(&self, ino: u64, rel: &Path, stg_ino: u64) -> io::Result<()> {
        let mut l = self.links.lock().map_err(|_| io::Error::other("hard-link state poisoned"))?;
        l.insert(ino, Rep { rel: rel.to_path_buf(), stg_ino })
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
        if fsx::xattrs(fd.as_fd()).map_err(|err| ctx.src_err(rel, err))?
            != fsx::xattrs(efd.as_fd()).map_err(|err| ctx.dst_err(rel, err))?
        {
            return Ok(false);
        }
        if m.kind != Kind::File {
            return Ok(true);
        }
        Ok(flags::read_handle(fd.as_fd()).map_err(|err| ctx.src_err(rel, err))?
            == flags::read_handle(efd.as_fd()).map_err(|err| ctx.dst_err(rel, err))?)
    }
}

/// Writebacks handed to other threads and not yet started.
static WRITEBACKS: AtomicUsize = AtomicUsize::new(0);

/// Starts the writeback of a file on a rayon thread (the current pool, or the global one), so its
/// encryption runs beside the caller's work; in the caller's thread when many are waiting (each
/// holds a file descriptor).
pub(crate) fn writeback_elsewhere(fd: &Arc<OwnedFd>, range: Option<(u64, u64)>) {
    if WRITEBACKS.fetch_add(1, Ordering::AcqRel) >= 64 {
        WRITEBACKS.fetch_sub(1, Ordering::AcqRel);
        return fsx::start_writeback(&**fd, range);
    }
    let fd = Arc::clone(fd);
    rayon::spawn(move || {
        WRITEBACKS.fetch_sub(1, Ordering::AcqRel);
        fsx::start_writeback(&*fd, range);
    });
}

/// Creates the copy of a non-directory entry (in staging, or back in the source when a move is
/// aborted); returns its inode number (when `need_ino`, else 0). `known`: the entry's metadata
/// as just read from `fd`, and the file opened for reading, if the caller has them. Re-copies while the source changes under it
/// (size, mtime or ctime differ before and after).
#[allow(clippy::too_many_arguments)]
pub(crate) fn create(
    ctx: &Ctx,
    fd: &OwnedFd,
    known: Option<(&Meta, Option<OwnedFd>)>,
    kind: Kind,
    stg_dir: &OwnedFd,
    name: &OsStr,
    rel: &Path,
    need_ino: bool,
) -> Result<u64, MigrateError> {
    let serr = |e| ctx.src_err(rel, e);
    let derr = |e| ctx.dst_err(rel, e);
    let mut known = known;
    for attempt in 0..MAX_TRIES {
        if attempt > 0 {
            ctx.recopied.fetch_add(1, Ordering::Relaxed);
        }
        let (before, opened) = match known.take() {
            Some((m, rfd)) => (*m, rfd),
            None => (fsx::stat_fd(fd).map_err(serr)?, None),
        };
        if before.kind != kind {
            return Err(MigrateError::KeepsChanging { path: ctx.display(rel) });
        }
        if kind == Kind::File {
            let rfd = match opened {
                Some(rfd) => rfd,
                None => fsx::reopen(fd.as_fd(), OFlags::RDONLY | OFlags::NOATIME).map_err(serr)?,
            };
            let tmp = Arc::new(fsx::tmpfile(stg_dir).map_err(derr)?);
            let attrs = flags::read(rfd.as_fd()).map_err(serr)?;
            flags::set_early(tmp.as_fd(), &attrs).map_err(derr)?;
            let (mut copied, mut handed) = (0u64, 0u64);
            let mut on_chunk = |n: u64| {
                copied += n;
                ctx.add_bytes(n);
                if copied - handed >= WRITEBACK_EVERY {
                    // A large file: each part written goes out (and is encrypted) on another
                    // thread while this one copies on, so even a single file keeps the CPUs busy.
                    // Offsets count copied bytes: exact for a dense file, a part of the written
                    // range for a sparse one (the final writeback below covers the rest).
                    writeback_elsewhere(&tmp, Some((handed, copied - handed)));
                    handed = copied;
                }
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
            // Verified now, while both sides are in memory: verification before the swap then
            // only needs to show that the source did not change since (see verify.rs). The copy
            // has the size the source had (copy_sparse sets it), which the after-stat checks.
            let same = fsx::same_content(rfd.as_fd(), tmp.as_fd(), before.size, &mut |_| {}).map_err(derr)?;
            let x = fsx::xattrs_on(On::Open(rfd.as_fd())).map_err(serr)?;
            flags::apply(tmp.as_fd(), &attrs).map_err(derr)?;
            fsx::apply_meta_on(On::Open(tmp.as_fd()), &before, &x).map_err(derr)?;
            let after = fsx::stat_fd(fd).map_err(serr)?;
            if after.changed_since(&before) {
                continue;
            }
            if !same {
                return Err(MigrateError::VerifyFailed {
                    path: ctx.display(rel),
                    reason: "the copy read back differs from the original, which did not change".into(),
                });
            }
            // Read back like the data: verification trusts an unchanged file's copy on this.
            let kept = flags::read(tmp.as_fd()).map_err(derr)?;
            if let Some(why) = attrs.difference(&kept) {
                return Err(MigrateError::VerifyFailed { path: ctx.display(rel), reason: format!("the copy's {why}") });
            }
            // No fsync per file: a killed process loses nothing from the page cache, and after
            // a power loss ext4 shows an unsynced file short (its on-disk size grows only with
            // written blocks), so the resumed pass recopies it. Everything is made durable by
            // one syncfs before `Copied` is recorded. Per-file fsync made conversion several
            // times slower than `cp -a`; starting the writeback here instead keeps the
            // encryption of the data on this thread.
            fsx::link_fd(&tmp, stg_dir, name).map_err(derr)?;
            if rayon::current_thread_index().is_some() {
                // One of the copy's workers: they are all busy copying, each does its own.
                fsx::start_writeback(&*tmp, None);
            } else {
                // Move mode copies on one thread: the encryption can run beside it.
                writeback_elsewhere(&tmp, None);
            }
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
