//! Thin, safe, fd-relative filesystem primitives. Every lookup of a name that a user may control is
//! `O_NOFOLLOW`/`AT_SYMLINK_NOFOLLOW` relative to an already-open directory, and special files are
//! only ever opened with `O_PATH` (which opens nothing: no FIFO blocks, no device driver runs).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, ResolveFlags, SeekFrom, StatxAttributes, StatxFlags, Timestamps, XattrFlags,
};
use rustix::io::Errno;

/// The type of a filesystem entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Kind {
    fn from_mode(mode: u32) -> Option<Kind> {
        Some(match FileType::from_raw_mode(mode) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            FileType::Fifo => Kind::Fifo,
            FileType::Socket => Kind::Socket,
            FileType::CharacterDevice => Kind::CharDev,
            FileType::BlockDevice => Kind::BlockDev,
            FileType::Unknown => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::File => "regular file",
            Kind::Dir => "directory",
            Kind::Symlink => "symbolic link",
            Kind::Fifo => "FIFO",
            Kind::Socket => "socket",
            Kind::CharDev => "character device",
            Kind::BlockDev => "block device",
        }
    }
}

/// A timestamp with nanoseconds, as statx reports it.
/// Ordered as times are: seconds, then nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub(crate) struct Time {
    pub sec: i64,
    pub nsec: u32,
}

impl Time {
    fn spec(self) -> rustix::fs::Timespec {
        rustix::fs::Timespec { tv_sec: self.sec, tv_nsec: i64::from(self.nsec) }
    }
}

/// What the engine needs to know about an inode.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub kind: Kind,
    /// Permission bits including setuid/setgid/sticky.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub nlink: u32,
    pub ino: u64,
    pub dev: u64,
    pub rdev: (u32, u32),
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub mnt_id: u64,
    pub encrypted: bool,
    pub mount_root: bool,
    /// `chattr +i` and `+a` as statx reports them (`FS_IMMUTABLE_FL`, `FS_APPEND_FL`): a copy
    /// gets them only once verified, an original loses them only when it is disposed of.
    pub sealed: u32,
    /// fs-verity and DAX as statx reports them (`FS_VERITY_FL`, `FS_DAX_FL`): no copy can have
    /// them, so a tree holding them is refused (see flags.rs).
    pub unkept: u32,
}

impl Meta {
    /// The bytes of data a copy moves: the size, but no more than the allocated blocks (a sparse
    /// file's holes are not copied). Counts progress and the census.
    pub(crate) fn data(&self) -> u64 {
        self.size.min(self.blocks.saturating_mul(512))
    }

    /// Same type, permissions, owner, size, device number and modification time: what the copy
    /// sets, with mtime set last, so an entry matching on all of these is complete.
    pub(crate) fn same_copy(&self, other: &Meta) -> bool {
        self.kind == other.kind
            && self.perm == other.perm
            && self.uid == other.uid
            && self.gid == other.gid
            && (self.kind != Kind::File || self.size == other.size)
            && ((self.kind != Kind::CharDev && self.kind != Kind::BlockDev) || self.rdev == other.rdev)
            && self.mtime == other.mtime
    }

    /// Whether the inode changed between two looks at it (content, metadata or xattrs).
    pub(crate) fn changed_since(&self, before: &Meta) -> bool {
        self.size != before.size || self.mtime != before.mtime || self.ctime != before.ctime || self.ino != before.ino
    }

    pub(crate) fn times(&self) -> Timestamps {
        Timestamps { last_access: self.atime.spec(), last_modification: self.mtime.spec() }
    }
}

fn statx_flags() -> StatxFlags {
    StatxFlags::BASIC_STATS | StatxFlags::MNT_ID
}

fn to_meta(x: rustix::fs::Statx) -> io::Result<Meta> {
    let mode = u32::from(x.stx_mode);
    let kind = Kind::from_mode(mode).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown file type"))?;
    let t = |s: rustix::fs::StatxTimestamp| Time { sec: s.tv_sec, nsec: s.tv_nsec };
    Ok(Meta {
        kind,
        perm: mode & 0o7777,
        uid: x.stx_uid,
        gid: x.stx_gid,
        size: x.stx_size,
        blocks: x.stx_blocks,
        nlink: x.stx_nlink,
        ino: x.stx_ino,
        dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
        rdev: (x.stx_rdev_major, x.stx_rdev_minor),
        atime: t(x.stx_atime),
        mtime: t(x.stx_mtime),
        ctime: t(x.stx_ctime),
        mnt_id: x.stx_mnt_id,
        encrypted: x.stx_attributes.contains(StatxAttributes::ENCRYPTED),
        mount_root: x.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
        sealed: if x.stx_attributes.contains(StatxAttributes::IMMUTABLE) { 0x10 } else { 0 }
            | if x.stx_attributes.contains(StatxAttributes::APPEND) { 0x20 } else { 0 },
        unkept: if x.stx_attributes.contains(StatxAttributes::VERITY) { 0x10_0000 } else { 0 }
            | if x.stx_attributes.contains(StatxAttributes::DAX) { 0x200_0000 } else { 0 },
    })
}

/// Metadata of the inode behind `fd` (any kind, including O_PATH).
pub(crate) fn stat_fd(fd: impl AsFd) -> io::Result<Meta> {
    to_meta(rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW, statx_flags())?)
}

/// Metadata of `name` in `dir`, not following a symlink. `None` if it does not exist.
pub(crate) fn stat_at(dir: impl AsFd, name: &OsStr) -> io::Result<Option<Meta>> {
    match rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, statx_flags()) {
        Ok(x) => Ok(Some(to_meta(x)?)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Opens an absolute path that must contain no symbolic link at all (not even in its parent
/// components) and no magic link: a path stored in the journal or given by the caller cannot be
/// redirected by a user who replaces one of its directories with a symlink. ELOOP if it has one.
pub(crate) fn open_nosym(path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// The parent directory of `path` (opened `O_PATH`, symlink-free) and the final name. `None` when
/// the parent does not exist.
pub(crate) fn open_parent(path: &Path) -> io::Result<Option<(OwnedFd, &OsStr)>> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the path has no parent directory"));
    };
    match open_nosym(parent, OFlags::PATH | OFlags::DIRECTORY) {
        Ok(fd) => Ok(Some((fd, name))),
        Err(e) if is_errno(&e, Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Metadata of an absolute path without following any symlink on the way (ELOOP if the parent
/// path holds one; a final symlink is described, not followed). `None` if it does not exist.
pub(crate) fn stat_path(path: &Path) -> io::Result<Option<Meta>> {
    if path.parent().is_none() {
        return Ok(Some(to_meta(rustix::fs::statx(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW, statx_flags())?)?));
    }
    match open_parent(path)? {
        Some((dir, name)) => stat_at(&dir, name),
        None => Ok(None),
    }
}

/// An `O_PATH` handle on `name` itself (a symlink stays a symlink). Pins the inode so later
/// operations cannot be redirected by a rename.
pub(crate) fn open_path(dir: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?)
}

/// Opens a directory for reading entries; fails on symlinks and non-directories.
pub(crate) fn open_dir(dir: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOATIME,
        Mode::empty(),
    )?)
}

/// Opens a directory by absolute path for reading, refusing any symlink on the way.
pub(crate) fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    open_nosym(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOATIME)
}

/// `/proc/self/fd/N`: the kernel resolves it to exactly the inode `fd` holds, whatever happened to
/// its name since, so it can reopen an `O_PATH` handle or reach xattrs of symlinks and devices.
pub(crate) fn proc_path(fd: BorrowedFd<'_>) -> String {
    use std::os::fd::AsRawFd;
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Reopens the regular file held by an `O_PATH` handle, without a second name lookup.
pub(crate) fn reopen(fd: BorrowedFd<'_>, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(rustix::fs::CWD, proc_path(fd).as_str(), flags | OFlags::CLOEXEC, Mode::empty())?)
}

/// Opens `rel` (a path of several components) beneath `root` without following any symlink on the
/// way; the final component may be a symlink and is returned as an O_PATH handle on it.
pub(crate) fn open_beneath(root: impl AsFd, rel: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        root,
        rel,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// Names in a directory, without `.` and `..`. Reads from a fresh handle so the caller's offset is
/// untouched, with `O_NOATIME` so listing a tree leaves its access times as they were.
pub(crate) fn list_names(dir: impl AsFd) -> io::Result<Vec<OsString>> {
    Ok(list(dir)?.into_iter().map(|(n, _)| n).collect())
}

/// Like [`list_names`], with each entry's type as the directory says it (`None` when the
/// filesystem does not say). Only a hint for sorting work: the entry may change before it is
/// opened, so whoever acts on it checks the inode it opened.
pub(crate) fn list(dir: impl AsFd) -> io::Result<Vec<(OsString, Option<Kind>)>> {
    let fd = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOATIME | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = rustix::fs::Dir::new(fd)?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        let kind = match e.file_type() {
            FileType::Unknown => None,
            t => Kind::from_mode(t.as_raw_mode()),
        };
        out.push((OsString::from_vec(n.to_vec()), kind));
    }
    Ok(out)
}

/// Target of the symlink held by an O_PATH handle, verbatim bytes.
pub(crate) fn read_link(fd: impl AsFd) -> io::Result<OsString> {
    let t = rustix::fs::readlinkat(fd, c"", Vec::new())?;
    Ok(OsString::from_vec(t.into_bytes()))
}

/// Where extended attributes are read and written: through `/proc/self/fd/N` (works for any handle,
/// including O_PATH ones on symlinks and device nodes), or directly on a file opened for I/O
/// (no path walk through /proc: the cheaper way for the regular files a copy has open anyway).
#[derive(Clone, Copy)]
pub(crate) enum On<'a> {
    Handle(BorrowedFd<'a>),
    Open(BorrowedFd<'a>),
}

/// The xattr calls for one target: the path form for O_PATH handles, the f* form for open files.
enum Target<'a> {
    Path(String),
    Fd(BorrowedFd<'a>),
}

impl<'a> Target<'a> {
    fn new(on: On<'a>) -> Target<'a> {
        match on {
            On::Handle(fd) => Target::Path(proc_path(fd)),
            On::Open(fd) => Target::Fd(fd),
        }
    }

    fn list(&self, buf: &mut [u8]) -> rustix::io::Result<usize> {
        match self {
            Target::Path(p) => rustix::fs::listxattr(p.as_str(), buf),
            Target::Fd(fd) => rustix::fs::flistxattr(fd, buf),
        }
    }

    fn list_size(&self) -> rustix::io::Result<usize> {
        match self {
            Target::Path(p) => rustix::fs::listxattr_query(p.as_str()),
            Target::Fd(fd) => rustix::fs::flistxattr_query(fd),
        }
    }

    fn get(&self, name: &OsStr, buf: &mut [u8]) -> rustix::io::Result<usize> {
        match self {
            Target::Path(p) => rustix::fs::getxattr(p.as_str(), name, buf),
            Target::Fd(fd) => rustix::fs::fgetxattr(fd, name, buf),
        }
    }

    fn get_size(&self, name: &OsStr) -> rustix::io::Result<usize> {
        match self {
            Target::Path(p) => rustix::fs::getxattr_query(p.as_str(), name),
            Target::Fd(fd) => rustix::fs::fgetxattr_query(fd, name),
        }
    }

    fn set(&self, name: &OsStr, value: &[u8]) -> rustix::io::Result<()> {
        match self {
            Target::Path(p) => rustix::fs::setxattr(p.as_str(), name, value, XattrFlags::empty()),
            Target::Fd(fd) => rustix::fs::fsetxattr(fd, name, value, XattrFlags::empty()),
        }
    }

    fn remove(&self, name: &OsStr) -> rustix::io::Result<()> {
        match self {
            Target::Path(p) => rustix::fs::removexattr(p.as_str(), name),
            Target::Fd(fd) => rustix::fs::fremovexattr(fd, name),
        }
    }
}

/// All extended attributes (name, value), sorted by name, of the inode behind `fd`; works on any
/// kind of inode, including O_PATH handles on symlinks and device nodes.
pub(crate) fn xattrs(fd: BorrowedFd<'_>) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    xattrs_on(On::Handle(fd))
}

/// [`xattrs`] of a handle or an open file.
pub(crate) fn xattrs_on(on: On<'_>) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let t = Target::new(on);
    // Most files have no xattrs or a few short ones: one call into a small buffer answers that;
    // only a longer list needs the size query.
    let mut first = vec![0u8; 1024];
    let names = match t.list(&mut first[..]) {
        Ok(0) => return Ok(Vec::new()),
        Ok(len) => {
            first.truncate(len);
            Some(first)
        }
        Err(Errno::RANGE) => None,
        Err(Errno::OPNOTSUPP) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let names = if let Some(n) = names {
        n
    } else {
        loop {
            let n = match t.list_size() {
                Ok(n) => n,
                Err(Errno::OPNOTSUPP) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut buf = vec![0u8; n];
            match t.list(&mut buf[..]) {
                Ok(len) => {
                    buf.truncate(len);
                    break buf;
                }
                // Grew between the two calls.
                Err(Errno::RANGE) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    };
    let mut out = Vec::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name_os = OsStr::from_bytes(name);
        let value = loop {
            let n = match t.get_size(name_os) {
                Ok(n) => n,
                // Removed between list and get.
                Err(Errno::NODATA) => break None,
                Err(e) => return Err(e.into()),
            };
            let mut buf = vec![0u8; n];
            match t.get(name_os, &mut buf[..]) {
                Ok(len) => {
                    buf.truncate(len);
                    break Some(buf);
                }
                Err(Errno::RANGE) => continue,
                Err(Errno::NODATA) => break None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(v) = value {
            out.push((name.to_vec(), v));
        }
    }
    out.sort();
    Ok(out)
}

/// Makes the xattrs of the inode behind `on` exactly `want` (removes extras, e.g. ACLs inherited
/// from a default ACL, then sets every wanted one).
fn set_xattrs_on(on: On<'_>, want: &[(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
    let have = xattrs_on(on)?;
    let t = Target::new(on);
    for (name, _) in &have {
        if !want.iter().any(|(n, _)| n == name) {
            match t.remove(OsStr::from_bytes(name)) {
                Ok(()) | Err(Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    for (name, value) in want {
        if have.iter().any(|(n, v)| n == name && v == value) {
            continue;
        }
        t.set(OsStr::from_bytes(name), value)?;
    }
    Ok(())
}

/// Copies the data of `src` into the empty `dst`, leaving holes where `src` has them.
/// `on_chunk` is called with each copied byte count and may abort the copy by returning an error.
pub(crate) fn copy_sparse(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    size: u64,
    dense: bool,
    on_chunk: &mut dyn FnMut(u64) -> io::Result<()>,
) -> io::Result<()> {
    let mut off = 0u64;
    // `dense` is a hint from st_blocks, which also counts an external xattr block and extent tree
    // blocks, so one SEEK_HOLE confirms it: the first hole at the end means there is none.
    let dense = dense
        && match rustix::fs::seek(src, SeekFrom::Hole(0)) {
            Ok(h) => h >= size,
            Err(Errno::NXIO) => true,
            Err(e) => return Err(e.into()),
        };
    if dense {
        // No holes to find: skip the SEEK_DATA/SEEK_HOLE round trips (they dominate for the many
        // small files of a home).
        if copy_chunks(src, dst, 0, size, on_chunk)? != size {
            rustix::fs::ftruncate(dst, size)?;
        }
        return Ok(());
    }
    'segments: loop {
        let data = match rustix::fs::seek(src, SeekFrom::Data(off)) {
            Ok(d) => d,
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(src, SeekFrom::Hole(data))?;
        if copy_chunks(src, dst, data, hole, on_chunk)? < hole {
            // The file shrank under us; the caller's before/after check catches it.
            break 'segments;
        }
        off = hole;
    }
    rustix::fs::ftruncate(dst, size)?;
    Ok(())
}

/// Calls `f` with each data range `[from, to)` of `fd` within `[start, end)` (holes skipped).
fn data_ranges(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    f: &mut dyn FnMut(u64, u64) -> io::Result<()>,
) -> io::Result<()> {
    let mut off = start;
    while off < end {
        let data = match rustix::fs::seek(fd, SeekFrom::Data(off)) {
            Ok(d) if d < end => d,
            Ok(_) | Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(fd, SeekFrom::Hole(data))?.min(end);
        f(data, hole)?;
        off = hole;
    }
    Ok(())
}

/// Bytes of data (not holes) of `fd` within `[start, end)`.
pub(crate) fn data_in(fd: BorrowedFd<'_>, start: u64, end: u64) -> io::Result<u64> {
    let mut n = 0;
    data_ranges(fd, start, end, &mut |from, to| {
        n += to - from;
        Ok(())
    })?;
    Ok(n)
}

/// Where a move's next chunk begins when it ends at `end` (moving in, from the tail): as far back
/// as `fd` holds at most `max` bytes of data, on the grid of `max` from offset 0. Holes cost
/// nothing, so a sparse disk image moves in as many chunks (each synced and recorded) as its data
/// needs, not its size; a dense file moves in the chunks of the grid. Always below `end` (0 < `end`).
pub(crate) fn chunk_start(fd: BorrowedFd<'_>, end: u64, max: u64) -> io::Result<u64> {
    let (mut hi, mut acc, mut span) = (end, 0u64, max);
    while hi > 0 {
        // The first window ends off the grid (the file's tail); the others are whole cells, or
        // runs of cells that double while they hold no data.
        let lo = if hi % max == 0 { hi.saturating_sub(span) } else { hi / max * max };
        let data = data_in(fd, lo, hi)?;
        if acc + data <= max {
            acc += data;
            hi = lo;
            span = if data == 0 { span.saturating_mul(2) } else { max };
        } else if hi - lo > max {
            span = max;
        } else {
            break;
        }
    }
    Ok(hi)
}

/// Where a chunk that begins at `start` ends (moving back, front to back; the mirror of
/// [`chunk_start`]): as far up to `size` as `fd` holds at most `max` bytes of data. Always above
/// `start` (`start` < `size`).
pub(crate) fn chunk_end(fd: BorrowedFd<'_>, start: u64, size: u64, max: u64) -> io::Result<u64> {
    let (mut lo, mut acc, mut span) = (start, 0u64, max);
    while lo < size {
        let hi = if lo % max == 0 { lo.saturating_add(span) } else { (lo / max + 1) * max }.min(size);
        let data = data_in(fd, lo, hi)?;
        if acc + data <= max {
            acc += data;
            lo = hi;
            span = if data == 0 { span.saturating_mul(2) } else { max };
        } else if hi - lo > max {
            span = max;
        } else {
            break;
        }
    }
    Ok(lo)
}

/// Copies the data of `src` in `[start, end)` to the same offsets of `dst`, skipping holes (what
/// is a hole in `src` is left untouched in `dst`, which the caller has made a hole). `on_chunk` as
/// for [`copy_sparse`].
pub(crate) fn copy_span(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    start: u64,
    end: u64,
    on_chunk: &mut dyn FnMut(u64) -> io::Result<()>,
) -> io::Result<()> {
    data_ranges(src, start, end, &mut |pos, to| {
        if copy_chunks(src, dst, pos, to, on_chunk)? < to {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank while it was moved"));
        }
        Ok(())
    })
}

/// Copies `[pos, to)` of `src` to the same offsets of `dst` in 1 MiB chunks, calling `on_chunk`
/// after each; returns where it stopped (short of `to` if the file ended first).
fn copy_chunks(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    mut pos: u64,
    to: u64,
    on_chunk: &mut dyn FnMut(u64) -> io::Result<()>,
) -> io::Result<u64> {
    const CHUNK: u64 = 1 << 20;
    while pos < to {
        let n = copy_range(src, dst, pos, (to - pos).min(CHUNK))?;
        if n == 0 {
            break;
        }
        pos += n;
        on_chunk(n)?;
    }
    Ok(pos)
}

/// Deallocates `[off, off + len)` of a regular file (it reads as zeros; the size stays).
pub(crate) fn punch(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    use rustix::fs::FallocateFlags as F;
    Ok(rustix::fs::fallocate(fd, F::PUNCH_HOLE | F::KEEP_SIZE, off, len)?)
}

/// Overwrites the allocated data of `[start, end)` with zeros and syncs it (wiping what a move
/// leaves behind before it is truncated away).
pub(crate) fn zero_span(fd: BorrowedFd<'_>, start: u64, end: u64) -> io::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    data_ranges(fd, start, end, &mut |mut pos, to| {
        while pos < to {
            let len = (to - pos).min(zeros.len() as u64) as usize;
            pos += rustix::io::pwrite(fd, &zeros[..len], pos)? as u64;
        }
        Ok(())
    })?;
    Ok(rustix::fs::fdatasync(fd)?)
}

fn copy_range(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, pos: u64, len: u64) -> io::Result<u64> {
    let (mut i, mut o) = (pos, pos);
    match rustix::fs::copy_file_range(src, Some(&mut i), dst, Some(&mut o), len as usize) {
        Ok(n) => return Ok(n as u64),
        // Filesystems or kernels that cannot: fall back to plain reads and writes.
        Err(Errno::XDEV | Errno::OPNOTSUPP | Errno::INVAL | Errno::NOSYS) => {}
        Err(e) => {
            // copy_file_range does not say which side failed. A bad sector in the original must
            // be named as such, with its offset (the user can restore that file), not pass for
            // a failing target; reading the range again tells them apart.
            return Err(match unreadable_at(src, pos, len) {
                Some((at, re)) => located(re, Side::ReadOriginal, at),
                None => located(e.into(), Side::WriteCopy, o),
            });
        }
    }
    let mut buf = vec![0u8; len as usize];
    let n = match rustix::io::pread(src, &mut buf[..], pos) {
        Ok(n) => n,
        Err(e) => {
            let (at, re) = unreadable_at(src, pos, len).unwrap_or((pos, e.into()));
            return Err(located(re, Side::ReadOriginal, at));
        }
    };
    let mut done = 0;
    while done < n {
        let at = pos + done as u64;
        done += rustix::io::pwrite(dst, &buf[done..n], at).map_err(|e| located(e.into(), Side::WriteCopy, at))?;
    }
    Ok(n as u64)
}

/// The first 4 KiB block of `[pos, pos + len)` of `fd` that cannot be read, and why.
fn unreadable_at(fd: BorrowedFd<'_>, pos: u64, len: u64) -> Option<(u64, io::Error)> {
    const BLOCK: u64 = 4096;
    let mut buf = [0u8; BLOCK as usize];
    let mut at = pos;
    while at < pos + len {
        let n = (pos + len - at).min(BLOCK - at % BLOCK) as usize;
        match rustix::io::pread(fd, &mut buf[..n], at) {
            Ok(0) => return None,
            Ok(k) => at += k as u64,
            Err(e) => return Some((at, e.into())),
        }
    }
    None
}

/// What an I/O error of a copy happened doing, to which file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    ReadOriginal,
    WriteCopy,
    ReadCopy,
}

/// An I/O error of a copy or comparison, with the file and byte offset where it happened. Its
/// errno stays visible to [`is_errno`] (running out of space is told apart by it).
#[derive(Debug)]
pub(crate) struct Located {
    pub side: Side,
    pub offset: u64,
    pub source: io::Error,
}

impl std::fmt::Display for Located {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.side {
            Side::ReadOriginal => "reading the original",
            Side::WriteCopy => "writing the copy",
            Side::ReadCopy => "reading the copy",
        };
        write!(f, "{what} at byte {}: {}", self.offset, self.source)
    }
}

impl std::error::Error for Located {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn located(e: io::Error, side: Side, offset: u64) -> io::Error {
    io::Error::new(e.kind(), Located { side, offset, source: e })
}

/// Where an error [`located`] it, if it was.
pub(crate) fn location(e: &io::Error) -> Option<&Located> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Located>())
}

/// Overwrites every allocated data range of a regular file with zeros and syncs it.
pub(crate) fn zero_data(fd: BorrowedFd<'_>) -> io::Result<()> {
    zero_span(fd, 0, u64::MAX)
}

/// Applies owner, xattrs, permissions and times, in the order that keeps each of them: chown
/// clears setuid/setgid and file capabilities, so it goes first; setting an ACL rewrites the mode,
/// so chmod comes after it; mtime last, which marks the entry complete.
pub(crate) fn apply_meta(fd: BorrowedFd<'_>, m: &Meta, xattrs: &[(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
    apply_meta_on(On::Handle(fd), m, xattrs)
}

/// [`apply_meta`] on a handle or an open file (an open regular file needs no path walk through
/// /proc for its xattrs and mode).
pub(crate) fn apply_meta_on(on: On<'_>, m: &Meta, xattrs: &[(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
    let fd = match on {
        On::Handle(fd) | On::Open(fd) => fd,
    };
    let (uid, gid) = (Some(rustix::fs::Uid::from_raw(m.uid)), Some(rustix::fs::Gid::from_raw(m.gid)));
    let here = AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW;
    rustix::fs::chownat(fd, c"", uid, gid, here)?;
    set_xattrs_on(on, xattrs)?;
    match on {
        On::Open(fd) => rustix::fs::fchmod(fd, Mode::from_raw_mode(m.perm))?,
        On::Handle(_) if m.kind == Kind::Symlink => {}
        On::Handle(fd) => {
            // Following the magic link lands on exactly this inode, which is not a symlink.
            let path = proc_path(fd);
            rustix::fs::chmodat(rustix::fs::CWD, path.as_str(), Mode::from_raw_mode(m.perm), AtFlags::empty())?;
        }
    }
    rustix::fs::utimensat(fd, c"", &m.times(), here)?;
    Ok(())
}

/// Sets access and modification time of the inode `fd` holds.
pub(crate) fn set_times(fd: BorrowedFd<'_>, atime: Time, mtime: Time) -> io::Result<()> {
    let t = Timestamps { last_access: atime.spec(), last_modification: mtime.spec() };
    rustix::fs::utimensat(fd, c"", &t, AtFlags::EMPTY_PATH)?;
    Ok(())
}

pub(crate) fn fsync(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::fs::fsync(fd)?)
}

/// Creates an anonymous file in `dir` that appears under a name only once `link_fd` is called.
/// Open for reading too, so what was written can be read back while it is in memory.
pub(crate) fn tmpfile(dir: impl AsFd) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(dir, c".", OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))?)
}

/// Starts writing the file's dirty pages out now, from this thread, without waiting for the
/// writes (`POSIX_FADV_DONTNEED` starts writeback of the range, then drops only clean pages). On
/// an encrypted directory the data is encrypted on its way out: done here, it is spread over
/// the copy's threads instead of piling up for the single flusher thread and the final sync.
/// `range`: `(offset, length)` of the part to write, `None` for the whole file.
pub(crate) fn start_writeback(fd: impl AsFd, range: Option<(u64, u64)>) {
    let (off, len) = range.unwrap_or((0, 0));
    // Advice only: failing to start early just leaves the work to the final sync.
    let _ = rustix::fs::fadvise(fd, off, std::num::NonZeroU64::new(len), rustix::fs::Advice::DontNeed);
}

/// Writes the file's dirty pages and drops its cached ones, so that the next reads come from
/// the disk. Fails if the data cannot be written (an error not yet reported to anyone).
pub(crate) fn drop_cached(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::fs::fsync(fd)?;
    Ok(rustix::fs::fadvise(fd, 0, None, rustix::fs::Advice::DontNeed)?)
}

/// Asks for the first `len` bytes of a file opened for reading without waiting for them.
pub(crate) fn read_ahead(fd: impl AsFd, len: u64) {
    // Advice only: if it fails, the copy reads the data when it gets there.
    let _ = rustix::fs::fadvise(fd, 0, std::num::NonZeroU64::new(len), rustix::fs::Advice::WillNeed);
}

/// Whether two open regular files of `size` bytes each (the caller checked the sizes) hold the
/// same bytes, compared over every range where either has data (holes read as zeros, so a 1 GiB
/// sparse file with 1 MiB of data costs 1 MiB of reads), in chunks, with per-thread buffers.
/// `on_chunk` gets each compared byte count.
pub(crate) fn same_content(
    a: BorrowedFd<'_>,
    b: BorrowedFd<'_>,
    size: u64,
    on_chunk: &mut dyn FnMut(u64),
) -> io::Result<bool> {
    const CHUNK: u64 = 256 * 1024;
    thread_local! {
        static BUFS: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    BUFS.with(|bufs| {
        let (x, y) = &mut *bufs.borrow_mut();
        x.resize(CHUNK as usize, 0);
        y.resize(CHUNK as usize, 0);
        let read = |fd: BorrowedFd<'_>, buf: &mut [u8], at: u64| -> io::Result<()> {
            let mut done = 0;
            while done < buf.len() {
                match rustix::io::pread(fd, &mut buf[done..], at + done as u64)? {
                    0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                    n => done += n,
                }
            }
            Ok(())
        };
        let read_a = |buf: &mut [u8], at: u64| read(a, buf, at).map_err(|e| located(e, Side::ReadOriginal, at));
        let read_b = |buf: &mut [u8], at: u64| read(b, buf, at).map_err(|e| located(e, Side::ReadCopy, at));
        if size <= CHUNK {
            // One read each: cheaper than finding the data ranges of a small file.
            let n = size as usize;
            read_a(&mut x[..n], 0)?;
            read_b(&mut y[..n], 0)?;
            on_chunk(size);
            return Ok(x[..n] == y[..n]);
        }
        let mut pos = 0;
        while pos < size {
            let start = next_data(a, pos, size)?.min(next_data(b, pos, size)?);
            if start >= size {
                break;
            }
            let end = state_change(a, start, size)?.min(state_change(b, start, size)?).max(start + 1);
            let mut at = start;
            while at < end {
                let n = (end - at).min(CHUNK) as usize;
                read_a(&mut x[..n], at)?;
                read_b(&mut y[..n], at)?;
                if x[..n] != y[..n] {
                    return Ok(false);
                }
                at += n as u64;
                on_chunk(n as u64);
            }
            pos = end;
        }
        Ok(true)
    })
}

/// The first offset at or after `at` holding data, or `size` if none.
fn next_data(f: BorrowedFd<'_>, at: u64, size: u64) -> io::Result<u64> {
    match rustix::fs::seek(f, SeekFrom::Data(at)) {
        Ok(o) => Ok(o.min(size)),
        Err(Errno::NXIO) => Ok(size),
        Err(e) => Err(e.into()),
    }
}

/// Where the data/hole state that holds at `at` ends.
fn state_change(f: BorrowedFd<'_>, at: u64, size: u64) -> io::Result<u64> {
    if next_data(f, at, size)? == at {
        match rustix::fs::seek(f, SeekFrom::Hole(at)) {
            Ok(o) => Ok(o.min(size)),
            Err(Errno::NXIO) => Ok(size),
            Err(e) => Err(e.into()),
        }
    } else {
        next_data(f, at, size)
    }
}

/// Gives the inode behind `fd` (an O_TMPFILE or O_PATH handle) the name `name` in `dir`.
pub(crate) fn link_fd(fd: impl AsFd, dir: impl AsFd, name: &OsStr) -> io::Result<()> {
    Ok(rustix::fs::linkat(fd, c"", dir, name, AtFlags::EMPTY_PATH)?)
}

/// Creates a symlink, FIFO, socket or device node named `name` in `dir` like `m`, with
/// temporary permissions; `apply_meta` finishes it.
pub(crate) fn make_special(dir: impl AsFd, name: &OsStr, m: &Meta, target: Option<&OsStr>) -> io::Result<()> {
    let mode = Mode::from_raw_mode(0o600);
    let (ft, dev) = match m.kind {
        Kind::Symlink => {
            let t = target.ok_or_else(|| io::Error::other("symlink without target"))?;
            return Ok(rustix::fs::symlinkat(t, dir, name)?);
        }
        Kind::Fifo => (FileType::Fifo, 0),
        Kind::Socket => (FileType::Socket, 0),
        Kind::CharDev => (FileType::CharacterDevice, rustix::fs::makedev(m.rdev.0, m.rdev.1)),
        Kind::BlockDev => (FileType::BlockDevice, rustix::fs::makedev(m.rdev.0, m.rdev.1)),
        Kind::File | Kind::Dir => return Err(io::Error::other("not a special file")),
    };
    Ok(rustix::fs::mknodat(dir, name, ft, mode, dev)?)
}

pub(crate) fn mkdir(dir: impl AsFd, name: &OsStr) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))?)
}

/// Removes a non-directory entry.
pub(crate) fn unlink(dir: impl AsFd, name: &OsStr) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?)
}

pub(crate) fn rmdir(dir: impl AsFd, name: &OsStr) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

/// What `open_nosym` reports when a directory of the path was replaced by a symlink (ELOOP for
/// an inner component, ENOTDIR for the last one, opened `O_DIRECTORY | O_NOFOLLOW`) or a file.
pub(crate) fn is_redirected(e: &io::Error) -> bool {
    is_errno(e, Errno::LOOP) || is_errno(e, Errno::NOTDIR)
}

pub(crate) fn is_errno(e: &io::Error, errno: Errno) -> bool {
    let raw = location(e).map_or(e, |l| &l.source).raw_os_error();
    raw == Some(errno.raw_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A file of `size` bytes with 1 MiB of data (less at the end) at each offset of `at`, holes
    /// elsewhere.
    fn sparse(size: u64, at: &[u64]) -> (tempfile::TempDir, OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        let f = std::fs::File::options().create_new(true).read(true).write(true).open(t.path().join("f")).unwrap();
        f.set_len(size).unwrap();
        for &off in at {
            rustix::io::pwrite(&f, &vec![7u8; MIB.min(size - off) as usize], off).unwrap();
        }
        (t, OwnedFd::from(f))
    }

    type Spans = Vec<(u64, u64)>;

    /// The chunks of a move, from the tail (moving in) and from the front (moving back).
    fn chunks(fd: &OwnedFd, size: u64, max: u64) -> (Spans, Spans) {
        let (mut back, mut end) = (Vec::new(), size);
        while end > 0 {
            let start = chunk_start(fd.as_fd(), end, max).unwrap();
            assert!(start < end, "no progress at {end}");
            back.push((start, end));
            end = start;
        }
        let (mut fwd, mut start) = (Vec::new(), 0);
        while start < size {
            let end = chunk_end(fd.as_fd(), start, size, max).unwrap();
            assert!(end > start, "no progress at {start}");
            fwd.push((start, end));
            start = end;
        }
        for &(a, b) in back.iter().chain(&fwd) {
            assert!(data_in(fd.as_fd(), a, b).unwrap() <= max, "chunk [{a}, {b}) holds more than {max}");
        }
        (back, fwd)
    }

    /// Issue 25: a sparse image moved in 16 MiB cells of its size took a sync and a journal write
    /// per cell, data or not (64 for the benchmark's 1 GiB image with 11 MiB of data). Chunks
    /// now count data: the image is one chunk; a dense file keeps the grid of the chunk size.
    #[test]
    fn move_chunks_count_data_not_holes() {
        let gib = 1 << 30;
        let at: Vec<u64> = (0..gib).step_by(100 << 20).collect();
        let (_t, fd) = sparse(gib, &at);
        assert_eq!(chunks(&fd, gib, 16 * MIB), (vec![(0, gib)], vec![(0, gib)]));
        // 32 MiB of data, 1 MiB every 4 MiB: about two chunks each way, none over 16 MiB.
        let at: Vec<u64> = (0..128 * MIB).step_by(4 << 20).collect();
        let (_t, fd) = sparse(128 * MIB, &at);
        let (back, fwd) = chunks(&fd, 128 * MIB, 16 * MIB);
        assert!((2..=3).contains(&back.len()) && (2..=3).contains(&fwd.len()), "{back:?} {fwd:?}");
        // Dense: the grid, the tail's part first.
        let size = 40 * MIB + 5;
        let (_t, fd) = sparse(size, &(0..41).map(|i| i * MIB).collect::<Vec<_>>());
        let grid = vec![(0, 16 * MIB), (16 * MIB, 32 * MIB), (32 * MIB, size)];
        let (back, fwd) = chunks(&fd, size, 16 * MIB);
        assert_eq!(back, grid.iter().rev().copied().collect::<Vec<_>>());
        assert_eq!(fwd, grid);
    }

    /// A bad sector in the original is reported as a read of the original, at the byte offset of
    /// the first block that fails, with its errno: /proc/self/mem gives a real EIO past the end
    /// of a mapping.
    #[test]
    fn an_unreadable_original_is_named_with_its_offset() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let regions: Vec<(u64, u64, bool, bool)> = maps
            .lines()
            .map(|l| {
                let (range, rest) = l.split_once(' ').unwrap();
                let (a, b) = range.split_once('-').unwrap();
                let special = l.contains('[');
                (
                    u64::from_str_radix(a, 16).unwrap(),
                    u64::from_str_radix(b, 16).unwrap(),
                    rest.starts_with('r'),
                    special,
                )
            })
            .collect();
        // A readable mapping followed by a wide gap (other threads may map memory meanwhile).
        let end = regions
            .windows(2)
            .find(|w| w[0].2 && !w[0].3 && w[0].1 - w[0].0 >= 8192 && w[1].0 - w[0].1 >= 1 << 30)
            .map(|w| w[0].1)
            .expect("a readable mapping followed by a gap");
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        // Writes at offsets as high as the mapping's address: only a null device takes them.
        let dst = std::fs::OpenOptions::new().write(true).open("/dev/null").unwrap();
        let mut pos = end - 8192;
        let err = loop {
            match copy_range(mem.as_fd(), dst.as_fd(), pos, end + 8192 - pos) {
                Ok(0) => panic!("the unmapped range read as the end of the file"),
                Ok(n) => pos += n,
                Err(e) => break e,
            }
        };
        let at = location(&err).unwrap_or_else(|| panic!("not located: {err}"));
        assert_eq!((at.side, at.offset), (Side::ReadOriginal, end), "{err}");
        assert!(is_errno(&err, Errno::IO), "{err}");
        assert!(err.to_string().starts_with(&format!("reading the original at byte {end}: ")), "{err}");
    }
}
