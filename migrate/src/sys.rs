//! The engine's only `unsafe`: the two ioctls rustix does not wrap, `FS_IOC_FSGETXATTR` and
//! `FS_IOC_FSSETXATTR` (the project id of an inode), each behind a safe function. rustix's
//! `ioctl` is unsafe only because the compiler cannot check that an opcode and its argument
//! type agree; here each opcode is declared once, from the kernel's `struct fsxattr`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::BorrowedFd;

use rustix::ioctl::{opcode, Getter, Setter};

/// The kernel's `struct fsxattr` (include/uapi/linux/fs.h), 28 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FsXattr {
    pub xflags: u32,
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
    pub pad: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<FsXattr>() == 28);

/// `_IOR('X', 31, struct fsxattr)`.
const FSGETXATTR: rustix::ioctl::Opcode = opcode::read::<FsXattr>(b'X', 31);
/// `_IOW('X', 32, struct fsxattr)`.
const FSSETXATTR: rustix::ioctl::Opcode = opcode::write::<FsXattr>(b'X', 32);

/// `FS_IOC_FSGETXATTR` on an open file or directory.
pub(crate) fn fsgetxattr(fd: BorrowedFd<'_>) -> io::Result<FsXattr> {
    // SAFETY: FSGETXATTR is a getter of exactly one `struct fsxattr`, which `FsXattr` mirrors
    // (repr(C), same fields, 28 bytes: checked above).
    let ctl = unsafe { Getter::<FSGETXATTR, FsXattr>::new() };
    // SAFETY: the opcode and the argument type agree (see above); the kernel writes at most
    // `size_of::<FsXattr>()` bytes into the buffer the Getter owns.
    Ok(unsafe { rustix::ioctl::ioctl(fd, ctl) }?)
}

/// `FS_IOC_FSSETXATTR` on an open file or directory.
pub(crate) fn fssetxattr(fd: BorrowedFd<'_>, x: FsXattr) -> io::Result<()> {
    // SAFETY: FSSETXATTR reads exactly one `struct fsxattr`, which `FsXattr` mirrors.
    let ctl = unsafe { Setter::<FSSETXATTR, FsXattr>::new(x) };
    // SAFETY: the opcode and the argument type agree; the kernel only reads the value.
    Ok(unsafe { rustix::ioctl::ioctl(fd, ctl) }?)
}
