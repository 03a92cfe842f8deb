//! Read-only look before anything is written: the streaming census of the source tree. (Which
//! processes use it: `dirseal-procs`.)

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::ctx::Ctx;
use crate::flags;
use crate::fsx::{self, Kind};
use crate::linkmap::{self, Blob, LinkMap};
use crate::walk::{self, Visitor};
use crate::MigrateError;

#[derive(Clone, Debug, Default)]
pub(crate) struct Census {
    /// Entries below the root.
    pub entries: u64,
    /// Sum of regular file sizes.
    pub bytes: u64,
    /// Sum of regular files' data ([`fsx::Meta::data`]): what the copy reads and writes.
    pub data: u64,
    /// Space actually allocated (st_blocks), root included: what the copy will need.
    pub alloc: u64,
    /// Multiply-linked files with links outside the tree, and the space they take: move mode
    /// copies them (their data must stay for the names outside).
    pub outside_links: u64,
    pub outside_alloc: u64,
    /// Directories below the root.
    pub dirs: u64,
    /// Regular files and directories (the root included) with inode flags other than casefold
    /// or a project id the copy keeps, and the flags seen; the casefolded directories.
    pub flagged: u64,
    pub flag_bits: u32,
    pub casefolded: u64,
    /// Immutable or append-only entries below the root, and one of them to name.
    pub sealed: u64,
    pub first_sealed: Option<PathBuf>,
    /// A casefolded directory to name (the root's path is empty).
    pub first_casefolded: Option<PathBuf>,
}

impl Census {
    /// Casefold is counted on its own (a casefolded tree has it on every directory). `sealed`:
    /// immutable and append-only, as statx says (`rel`: below the root).
    fn count_flags(&mut self, a: &flags::Attrs, sealed: u32, rel: &Path) {
        let others = (a.flags & !flags::FS_CASEFOLD_FL) | sealed;
        if others != 0 || a.project != 0 {
            self.flagged += 1;
            self.flag_bits |= others;
        }
        self.casefolded += u64::from(a.casefold());
        if a.casefold() {
            self.first_casefolded.get_or_insert_with(|| rel.to_path_buf());
        }
        if sealed != 0 && !rel.as_os_str().is_empty() {
            self.sealed += 1;
            self.first_sealed.get_or_insert_with(|| rel.to_path_buf());
        }
    }
}

/// Directories the census has listed, in this process: a test checks that a conversion walks
/// its tree for the census once (the copy, verification and disposal walk it on their own).
static DIRS_LISTED: AtomicU64 = AtomicU64::new(0);

/// How many directories every census of this process has listed so far.
pub fn census_dirs_listed() -> u64 {
    DIRS_LISTED.load(Ordering::Relaxed)
}

/// Walks the tree, directories in parallel on the current rayon pool, refusing mount points and
/// encrypted entries inside.
pub(crate) fn census(ctx: &Ctx, root: &OwnedFd) -> Result<Census, MigrateError> {
    let rootm = fsx::stat_fd(root).map_err(|e| ctx.src_err(Path::new(""), e))?;
    let s = Scanner {
        ctx,
        total: Mutex::new(Census { alloc: rootm.blocks * 512, ..Census::default() }),
        links: Mutex::new(LinkMap::new(root).map_err(|e| ctx.src_err(Path::new(""), e))?),
    };
    let top = Dir { fd: root.try_clone().map_err(|e| ctx.src_err(Path::new(""), e))?, rel: PathBuf::new() };
    walk::walk(&s, top)?;
    let poisoned = || MigrateError::Internal("census state poisoned");
    let mut c = s.total.into_inner().map_err(|_| poisoned())?;
    let links = s.links.into_inner().map_err(|_| poisoned())?;
    links
        .each(&mut |_, Seen { nlink, seen, alloc }| {
            if seen < nlink {
                c.outside_links += 1;
                c.outside_alloc += alloc;
            }
        })
        .map_err(|e| ctx.src_err(Path::new(""), e))?;
    Ok(c)
}

struct Scanner<'c, 'a> {
    ctx: &'c Ctx<'a>,
    total: Mutex<Census>,
    /// For multiply-linked inodes only; past a threshold on disk, in the source's filesystem.
    links: Mutex<LinkMap<Seen>>,
}

/// A multiply-linked inode as the census saw it: its link count, the names of it seen in the
/// tree, its allocated bytes.
#[derive(Clone, Copy)]
struct Seen {
    nlink: u32,
    seen: u32,
    alloc: u64,
}

impl linkmap::Record for Seen {
    fn encode(&self, _: &mut Blob, _: &OwnedFd) -> io::Result<[u8; linkmap::VALUE]> {
        let mut b = [0; linkmap::VALUE];
        b[..4].copy_from_slice(&self.nlink.to_le_bytes());
        b[4..8].copy_from_slice(&self.seen.to_le_bytes());
        b[8..16].copy_from_slice(&self.alloc.to_le_bytes());
        Ok(b)
    }

    fn decode(b: &[u8; linkmap::VALUE], _: &Blob) -> io::Result<Seen> {
        let word = |r| linkmap::word(b, r);
        let short = |_| io::Error::other("a corrupt hard-link record");
        Ok(Seen {
            nlink: u32::try_from(word(0..4)).map_err(short)?,
            seen: u32::try_from(word(4..8)).map_err(short)?,
            alloc: word(8..16),
        })
    }
}

struct Dir {
    fd: OwnedFd,
    rel: PathBuf,
}

impl Visitor for Scanner<'_, '_> {
    type Dir = Dir;
    type Error = MigrateError;

    fn enter(&self, parent: &Dir, name: &OsStr) -> Result<Option<Dir>, MigrateError> {
        let rel = parent.rel.join(name);
        match fsx::open_dir(&parent.fd, name) {
            Ok(fd) => Ok(Some(Dir { fd, rel })),
            Err(e) if fsx::is_errno(&e, rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(self.ctx.src_err(&rel, e)),
        }
    }

    /// Counts the directory's entries into a local census, then adds it to the total once.
    fn visit(&self, d: &Dir, found: &mut dyn FnMut(Vec<OsString>)) -> Result<(), MigrateError> {
        let ctx = self.ctx;
        ctx.check_stop()?;
        DIRS_LISTED.fetch_add(1, Ordering::Relaxed);
        let mut c = Census::default();
        let dm = fsx::stat_fd(&d.fd).map_err(|e| ctx.src_err(&d.rel, e))?;
        c.count_flags(&flags::read(d.fd.as_fd()).map_err(|e| ctx.src_err(&d.rel, e))?, dm.sealed, &d.rel);
        let (mut subdirs, mut linked) = (Vec::new(), Vec::new());
        for n in fsx::list_names(&d.fd).map_err(|e| ctx.src_err(&d.rel, e))? {
            let Some(m) = fsx::stat_at(&d.fd, &n).map_err(|e| ctx.src_err(&d.rel.join(&n), e))? else {
                continue;
            };
            ctx.check_entry(&m, &d.rel.join(&n))?;
            c.entries += 1;
            c.alloc += m.blocks * 512;
            match m.kind {
                Kind::Dir => {
                    c.dirs += 1;
                    subdirs.push(n);
                }
                Kind::File => {
                    c.bytes += m.size;
                    c.data += m.data();
                    let rel = || d.rel.join(&n);
                    if let Some(a) = flags::read_at(&d.fd, &n).map_err(|e| ctx.src_err(&rel(), e))? {
                        c.count_flags(&a, m.sealed, &rel());
                    }
                }
                _ => {}
            }
            if m.kind != Kind::Dir && m.nlink > 1 {
                linked.push(m);
            }
        }
        if !linked.is_empty() {
            let mut links = self.links.lock().map_err(|_| MigrateError::Internal("census state poisoned"))?;
            for m in linked {
                let had = links.get(m.ino).map_err(|e| ctx.src_err(&d.rel, e))?;
                let mut s = had.unwrap_or(Seen { nlink: m.nlink, seen: 0, alloc: m.blocks * 512 });
                s.seen += 1;
                links.insert(m.ino, s).map_err(|e| ctx.src_err(&d.rel, e))?;
            }
        }
        let mut t = self.total.lock().map_err(|_| MigrateError::Internal("census state poisoned"))?;
        t.entries += c.entries;
        t.alloc += c.alloc;
        t.dirs += c.dirs;
        t.bytes += c.bytes;
        t.data += c.data;
        t.flagged += c.flagged;
        t.flag_bits |= c.flag_bits;
        t.casefolded += c.casefolded;
        t.sealed += c.sealed;
        if t.first_sealed.is_none() {
            t.first_sealed = c.first_sealed;
        }
        if t.first_casefolded.is_none() {
            t.first_casefolded = c.first_casefolded;
        }
        ctx.files_done.store(t.entries, Ordering::Relaxed);
        drop(t);
        ctx.tick(false);
        found(subdirs);
        Ok(())
    }
}
