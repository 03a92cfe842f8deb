//! Inode flags (what `lsattr` shows, `FS_IOC_GETFLAGS`) and project ids (`lsattr -p`,
//! `FS_IOC_FSGETXATTR`): which a faithful copy carries, when each is set on the copy, and which
//! it leaves to the filesystem. [`TABLE`] is the one place that decides; docs/formats.md lists it.
//!
//! Only regular files and directories have flags a copy can read: the ioctls need an open file,
//! and symlinks, sockets and device nodes cannot be opened safely (`lsattr` skips them too).
//!
//! Immutable and append-only (`+i`, `+a`, [`When::Sealed`]) are kept by a copy too, at the end;
//! a move, the directory itself or a special file with them is refused before anything is
//! written.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{IFlags, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::{fsx, sys};

/// When a carried flag goes onto the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum When {
    /// On the new, still empty inode, before any data or entry is made in it: the kernel takes
    /// casefold only on an empty directory (its names are hashed by it), and compression and
    /// no-COW only on an empty file.
    Empty,
    /// With the rest of the metadata, after the data and the entries (a synchronous or
    /// dirsync flag set first would make the copy itself synchronous), before the times.
    Last,
    /// Not carried: the filesystem decides it for the copy (why, for the docs).
    Own(&'static str),
    /// Immutable and append-only: set on the copies once they are verified, just before the
    /// swap (nothing could be written into them before), cleared on the originals only when
    /// they are disposed of. Copy mode only (a move takes the originals apart as it goes).
    Sealed,
}

/// One inode flag: its bit, `lsattr` letter, name and how a copy treats it.
pub(crate) struct Flag {
    pub bit: u32,
    pub letter: char,
    pub name: &'static str,
    pub when: When,
}

const fn flag(bit: u32, letter: char, name: &'static str, when: When) -> Flag {
    Flag { bit, letter, name, when }
}

// Bits of include/uapi/linux/fs.h that rustix's `IFlags` does not name.
const FS_ENCRYPT_FL: u32 = 0x0000_0800;
const FS_NOCOMP_FL: u32 = 0x0000_0400;
const FS_INDEX_FL: u32 = 0x0000_1000;
const FS_HUGE_FILE_FL: u32 = 0x0004_0000;
const FS_EXTENT_FL: u32 = 0x0008_0000;
const FS_VERITY_FL: u32 = 0x0010_0000;
const FS_EA_INODE_FL: u32 = 0x0020_0000;
const FS_DAX_FL: u32 = 0x0200_0000;
const FS_INLINE_DATA_FL: u32 = 0x1000_0000;
/// `+F`, casefold.
pub(crate) const FS_CASEFOLD_FL: u32 = 0x4000_0000;

/// Every flag the engine knows, in `lsattr`'s order.
pub(crate) const TABLE: &[Flag] = &[
    flag(IFlags::SECURE_REMOVAL.bits(), 's', "secure deletion", When::Last),
    flag(IFlags::UNRM.bits(), 'u', "undelete", When::Last),
    flag(IFlags::SYNC.bits(), 'S', "sync", When::Last),
    flag(IFlags::IMMUTABLE.bits(), 'i', "immutable", When::Sealed),
    flag(IFlags::APPEND.bits(), 'a', "append-only", When::Sealed),
    flag(IFlags::DIRSYNC.bits(), 'D', "dirsync", When::Last),
    flag(IFlags::NODUMP.bits(), 'd', "nodump", When::Last),
    flag(IFlags::NOATIME.bits(), 'A', "noatime", When::Last),
    flag(IFlags::COMPRESSED.bits(), 'c', "compression", When::Empty),
    flag(FS_ENCRYPT_FL, 'E', "encrypted", When::Own("the copy is encrypted (or not) by the conversion itself")),
    flag(IFlags::JOURNALING.bits(), 'j', "data journaling", When::Last),
    flag(FS_INDEX_FL, 'I', "indexed directory", When::Own("ext4 indexes large directories by itself")),
    flag(IFlags::NOTAIL.bits(), 't', "no tail-merging", When::Last),
    flag(IFlags::TOPDIR.bits(), 'T', "top of directory hierarchy", When::Last),
    flag(FS_EXTENT_FL, 'e', "extents", When::Own("ext4 gives every new file extents")),
    flag(IFlags::NOCOW.bits(), 'C', "no copy-on-write", When::Empty),
    flag(FS_DAX_FL, 'x', "DAX", When::Own("refused: direct access cannot be combined with encryption")),
    flag(FS_CASEFOLD_FL, 'F', "casefold", When::Empty),
    flag(FS_INLINE_DATA_FL, 'N', "inline data", When::Own("ext4 stores small files inline by itself")),
    flag(IFlags::PROJECT_INHERIT.bits(), 'P', "project inheritance", When::Last),
    flag(FS_VERITY_FL, 'V', "verity", When::Own("refused: fs-verity is enabled on a finished file, not copied")),
    flag(FS_NOCOMP_FL, 'm', "no compression", When::Empty),
    flag(FS_HUGE_FILE_FL, 'h', "huge file", When::Own("set by ext4 for files over 2 TiB")),
    flag(FS_EA_INODE_FL, '?', "xattr inode", When::Own("ext4's own, for large extended attributes")),
];

const fn mask(empty: bool) -> u32 {
    let mut m = 0;
    let mut i = 0;
    while i < TABLE.len() {
        let f = &TABLE[i];
        match f.when {
            When::Empty => m |= f.bit,
            When::Last if !empty => m |= f.bit,
            _ => {}
        }
        i += 1;
    }
    m
}

/// The flags a copy carries while it is made.
pub(crate) const CARRIED: u32 = mask(false);
/// Of those, the ones set on the empty inode.
pub(crate) const EARLY: u32 = mask(true);
/// Immutable and append-only.
pub(crate) const SEALED: u32 = IFlags::IMMUTABLE.bits() | IFlags::APPEND.bits();

/// A flag no copy can have (`fsx::Meta::unkept`, from statx): which, and what to do about it.
pub(crate) fn unkept(bit: u32) -> (&'static str, &'static str) {
    if bit & FS_VERITY_FL != 0 {
        (
            "verity (+V)",
            "fs-verity is enabled on a finished file and cannot be copied; move the file out of the \
             directory, convert, move it back (or copy it back and enable it again with `fsverity enable`)",
        )
    } else {
        (
            "DAX (+x)",
            "direct access cannot be combined with encryption; clear it (`chattr -x`), convert, and \
             keep files that need it outside the encrypted directory",
        )
    }
}

/// The flags of an inode a copy carries, and its project id (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Attrs {
    pub flags: u32,
    pub project: u32,
}

impl Attrs {
    pub(crate) fn is_none(&self) -> bool {
        *self == Attrs::default()
    }

    /// Whether the flags set on an empty inode differ: then `other` cannot become `self` by
    /// setting flags once it holds anything.
    pub(crate) fn early_differs(&self, other: &Attrs) -> bool {
        (self.flags ^ other.flags) & EARLY != 0
    }

    pub(crate) fn casefold(&self) -> bool {
        self.flags & FS_CASEFOLD_FL != 0
    }

    /// What differs between two inodes' flags and project ids, for a verification's message.
    pub(crate) fn difference(&self, copy: &Attrs) -> Option<String> {
        let mut out = Vec::new();
        let diff = self.flags ^ copy.flags;
        if diff != 0 {
            out.push(format!("inode flags differ ({})", labels(diff)));
        }
        if self.project != copy.project {
            out.push(format!("project id {} in the source, {} in the copy", self.project, copy.project));
        }
        (!out.is_empty()).then(|| out.join("; "))
    }
}

/// Names of the flags in `bits` ("nodump", "casefold", ...), in the table's order.
pub fn names(bits: u32) -> Vec<&'static str> {
    TABLE.iter().filter(|f| bits & f.bit != 0).map(|f| f.name).collect()
}

/// The attributes of regular file `name` in `dir` (`None`: it is gone, or no longer a regular
/// file). Opened by handle, then reopened for reading: a name swapped for a FIFO or a device
/// node in between is never opened as one.
pub(crate) fn read_at(dir: impl AsFd, name: &OsStr) -> io::Result<Option<Attrs>> {
    let p = match fsx::open_path(dir, name) {
        Ok(p) => p,
        Err(e) if fsx::is_errno(&e, Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    if fsx::stat_fd(&p)?.kind != fsx::Kind::File {
        return Ok(None);
    }
    let f = fsx::reopen(p.as_fd(), OFlags::RDONLY | OFlags::NOATIME)?;
    read(f.as_fd()).map(Some)
}

/// The attributes of the regular file an `O_PATH` handle holds (reopened for reading).
pub(crate) fn read_handle(fd: BorrowedFd<'_>) -> io::Result<Attrs> {
    read(fsx::reopen(fd, OFlags::RDONLY | OFlags::NOATIME)?.as_fd())
}

/// Adds immutable and append-only (`bits`, of [`SEALED`]) to an open file or directory.
pub(crate) fn seal(fd: BorrowedFd<'_>, bits: u32) -> io::Result<()> {
    set_flags(fd, bits & SEALED, bits & SEALED)
}

/// Clears immutable and append-only on an open file or directory, so it can be removed.
pub(crate) fn unseal(fd: BorrowedFd<'_>) -> io::Result<()> {
    set_flags(fd, 0, SEALED)
}

/// Whether this kernel keeps casefolded directories inside an encrypted one on the filesystem
/// of `fd` (ext4 since Linux 5.13, f2fs since 5.11); if not, what to do.
pub(crate) fn check_casefold_encryption(fd: impl AsFd) -> Result<(), String> {
    const EXT4: i64 = 0xEF53;
    const F2FS: i64 = 0xF2F5_2010;
    let fs = rustix::fs::fstatfs(fd).map_err(|e| format!("cannot tell the filesystem's type ({e})"))?;
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between architectures
    let (name, needs) = match fs.f_type as i64 {
        EXT4 => ("ext4", (5, 13)),
        F2FS => ("f2fs", (5, 11)),
        _ => return Err("only ext4 and f2fs keep casefolded directories encrypted".into()),
    };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    casefold_release(release.trim(), name, needs)
}

/// Whether kernel `release` ("6.1.0-57-amd64") is at least `needs` (major, minor) for
/// encrypted casefolded directories on `fs`; if not, what to do.
fn casefold_release(release: &str, fs: &str, needs: (u32, u32)) -> Result<(), String> {
    let mut nums = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
    let have = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    if have < needs {
        return Err(format!(
            "this kernel ({release}) cannot encrypt casefolded directories on {fs} (Linux {}.{} or later can); \
             boot a newer kernel and run the conversion again",
            needs.0, needs.1
        ));
    }
    Ok(())
}

/// The flags in `bits` for a message: "nodump (+d), casefold (+F)".
fn labels(bits: u32) -> String {
    let named = TABLE.iter().filter(|f| bits & f.bit != 0).map(|f| format!("{} (+{})", f.name, f.letter));
    named.collect::<Vec<_>>().join(", ")
}

/// Whether this filesystem or file has no flags to speak of.
fn unsupported(e: Errno) -> bool {
    matches!(e, Errno::NOTTY | Errno::OPNOTSUPP | Errno::INVAL | Errno::NOSYS)
}

fn raw_flags(fd: BorrowedFd<'_>) -> io::Result<Option<u32>> {
    match rustix::fs::ioctl_getflags(fd) {
        Ok(f) => Ok(Some(f.bits())),
        Err(e) if unsupported(e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn project(fd: BorrowedFd<'_>) -> io::Result<Option<sys::FsXattr>> {
    match sys::fsgetxattr(fd) {
        Ok(x) => Ok(Some(x)),
        Err(e) if e.raw_os_error().is_some_and(|n| unsupported(Errno::from_raw_os_error(n))) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The carried flags and the project id of an open regular file or directory.
pub(crate) fn read(fd: BorrowedFd<'_>) -> io::Result<Attrs> {
    let flags = raw_flags(fd)?.unwrap_or(0) & CARRIED;
    let project = project(fd)?.map_or(0, |x| x.projid);
    Ok(Attrs { flags, project })
}

fn context(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("setting {what}: {e}"))
}

fn set_flags(fd: BorrowedFd<'_>, want: u32, which: u32) -> io::Result<()> {
    let names = || format!("the inode flags {}", labels(want & which));
    let Some(cur) = raw_flags(fd)? else {
        if want & which == 0 {
            return Ok(());
        }
        return Err(context(names())(io::Error::from(io::ErrorKind::Unsupported)));
    };
    let new = (cur & !which) | (want & which);
    if new != cur {
        rustix::fs::ioctl_setflags(fd, IFlags::from_bits_retain(new)).map_err(|e| context(names())(e.into()))?;
    }
    Ok(())
}

/// Sets the flags that need an empty inode (casefold, compression, no-COW) on a new, empty file
/// or directory. The others stay as they are.
/// Also clears those the new inode inherited from its directory that `a` does not have.
pub(crate) fn set_early(fd: BorrowedFd<'_>, a: &Attrs) -> io::Result<()> {
    set_flags(fd, a.flags, EARLY)
}

/// Makes the carried flags and the project id of an open file or directory `a`'s (clearing
/// what it inherited from its directory and `a` lacks); flags the copy does not carry
/// (encryption, extents, ...) stay as the filesystem set them.
pub(crate) fn apply(fd: BorrowedFd<'_>, a: &Attrs) -> io::Result<()> {
    match project(fd)? {
        Some(mut x) if x.projid != a.project => {
            x.projid = a.project;
            sys::fssetxattr(fd, x).map_err(context(format!("the project id {}", a.project)))?;
        }
        Some(_) => {}
        None if a.project == 0 => {}
        None => {
            return Err(context(format!("the project id {}", a.project))(io::Error::from(io::ErrorKind::Unsupported)))
        }
    }
    set_flags(fd, a.flags, CARRIED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casefold_under_encryption_needs_5_13_on_ext4_and_5_11_on_f2fs() {
        assert!(casefold_release("6.1.0-57-amd64", "ext4", (5, 13)).is_ok());
        assert!(casefold_release("5.13.0", "ext4", (5, 13)).is_ok());
        assert!(casefold_release("5.11.22-arch1", "f2fs", (5, 11)).is_ok());
        let e = casefold_release("5.10.0-28-amd64", "ext4", (5, 13)).unwrap_err();
        assert!(e.contains("5.10.0-28-amd64") && e.contains("Linux 5.13") && e.contains("newer kernel"), "{e}");
        assert!(casefold_release("4.19.0", "f2fs", (5, 11)).is_err());
        assert!(casefold_release("", "ext4", (5, 13)).is_err(), "an unreadable release is not taken as new enough");
    }

    /// docs/formats.md lists every flag of the table (by its `lsattr` letter) in the row of how a
    /// copy treats it.
    #[test]
    fn the_documented_flags_are_the_table() {
        let doc = include_str!("../../docs/formats.md");
        let start = doc.find("<!-- inode-flags -->").expect("start marker in docs/formats.md");
        let end = doc.find("<!-- /inode-flags -->").expect("end marker in docs/formats.md");
        let rows: Vec<&str> =
            doc[start..end].lines().filter(|l| l.starts_with("| `") && !l.contains("`lsattr`")).collect();
        let row_of = |letter: char| {
            let tick = format!("`{letter}`");
            rows.iter().position(|r| r.split('|').nth(1).is_some_and(|c| c.contains(&tick)))
        };
        for f in TABLE.iter().filter(|f| f.letter != '?') {
            let want = match f.when {
                When::Last => 0,
                When::Empty => 1,
                When::Own(_) if f.bit == FS_DAX_FL || f.bit == FS_VERITY_FL => 3,
                When::Own(_) => 2,
                When::Sealed => 4,
            };
            assert_eq!(row_of(f.letter), Some(want), "docs/formats.md lists +{} ({}) elsewhere", f.letter, f.name);
        }
    }

    #[test]
    fn every_bit_is_listed_once_and_the_masks_follow_the_table() {
        let mut seen = 0u32;
        for f in TABLE {
            assert_eq!(f.bit.count_ones(), 1, "{}", f.name);
            assert_eq!(seen & f.bit, 0, "{} listed twice", f.name);
            seen |= f.bit;
        }
        assert_eq!(EARLY & !CARRIED, 0);
        assert_ne!(CARRIED & FS_CASEFOLD_FL, 0);
        assert_eq!(EARLY, FS_CASEFOLD_FL | IFlags::COMPRESSED.bits() | IFlags::NOCOW.bits() | FS_NOCOMP_FL);
        for own in [FS_ENCRYPT_FL, FS_EXTENT_FL, FS_INDEX_FL, FS_VERITY_FL, FS_DAX_FL, FS_INLINE_DATA_FL] {
            assert_eq!(CARRIED & own, 0);
        }
        // Immutable and append-only are set at the end, not while the copy is made.
        assert_eq!(CARRIED & SEALED, 0);
        assert_eq!(names(IFlags::NODUMP.bits() | IFlags::NOATIME.bits()), ["nodump", "noatime"]);
    }
}
