//! The only module with `unsafe`.
//!
//! Kernel interfaces that neither libc nor nix wrap: the fscrypt ioctls (UAPI `<linux/fscrypt.h>`),
//! `statx` for the encrypted attribute, and `FITRIM` (UAPI `<linux/fs.h>`). Each is exposed as one safe function taking a borrowed
//! fd, returning the raw [`Errno`] so that `crate::fscrypt` can map it to a meaningful error.
//! [`shadow`] reads /etc/shadow and calls libcrypt. [`helper`] runs the TPM and FIDO2 helper programs
//! (hw/), the only binaries that link libtss2-* and libfido2; [`fexecve`] runs a file by its
//! descriptor, so that the helper run is the file checked.
#![allow(unsafe_code)]
// The structs keep their kernel names so they can be checked against the UAPI header by eye.
#![allow(non_camel_case_types)]

use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;
use zeroize::Zeroize;

pub mod helper;
pub(crate) mod shadow;

pub(crate) const FSCRYPT_POLICY_V1: u8 = 0;
pub(crate) const FSCRYPT_POLICY_V2: u8 = 2;
pub(crate) const FSCRYPT_KEY_IDENTIFIER_SIZE: usize = 16;
/// Largest raw master key the kernel accepts.
pub(crate) const FSCRYPT_MAX_KEY_SIZE: usize = 64;

pub(crate) const FSCRYPT_MODE_AES_256_XTS: u8 = 1;
pub(crate) const FSCRYPT_MODE_AES_256_CTS: u8 = 4;
pub(crate) const FSCRYPT_POLICY_FLAGS_PAD_32: u8 = 0x03;

pub(crate) const FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER: u32 = 2;

pub(crate) const FSCRYPT_KEY_REMOVAL_STATUS_FLAG_FILES_BUSY: u32 = 0x1;
pub(crate) const FSCRYPT_KEY_REMOVAL_STATUS_FLAG_OTHER_USERS: u32 = 0x2;

pub(crate) const FSCRYPT_KEY_STATUS_ABSENT: u32 = 1;
pub(crate) const FSCRYPT_KEY_STATUS_PRESENT: u32 = 2;
pub(crate) const FSCRYPT_KEY_STATUS_INCOMPLETELY_REMOVED: u32 = 3;

/// `struct fscrypt_policy_v2`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct fscrypt_policy_v2 {
    pub(crate) version: u8,
    pub(crate) contents_encryption_mode: u8,
    pub(crate) filenames_encryption_mode: u8,
    pub(crate) flags: u8,
    /// 0 = the filesystem block size; older kernels call this byte reserved.
    pub(crate) log2_data_unit_size: u8,
    pub(crate) reserved: [u8; 3],
    pub(crate) master_key_identifier: [u8; FSCRYPT_KEY_IDENTIFIER_SIZE],
}

/// `struct fscrypt_get_policy_ex_arg`.
///
/// The kernel's `policy` is a union of v1 (12 bytes) and v2 (24 bytes) policies whose members all
/// start with the version byte; the v2 struct is the largest member, so it stands in for the union
/// and a v1 answer is recognised by `policy.version`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct fscrypt_get_policy_ex_arg {
    pub(crate) policy_size: u64,
    pub(crate) policy: fscrypt_policy_v2,
}

/// `struct fscrypt_key_specifier`. The kernel's `u` is a union of byte arrays: descriptor (8),
/// identifier (16) and 32 reserved bytes, so a 32-byte array is the same thing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct fscrypt_key_specifier {
    pub(crate) type_: u32,
    pub(crate) reserved: u32,
    pub(crate) u: [u8; 32],
}

impl fscrypt_key_specifier {
    fn identifier(id: &[u8; FSCRYPT_KEY_IDENTIFIER_SIZE]) -> Self {
        let mut spec = fscrypt_key_specifier { type_: FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER, ..Default::default() };
        spec.u[..FSCRYPT_KEY_IDENTIFIER_SIZE].copy_from_slice(id);
        spec
    }
    fn get_identifier(&self) -> [u8; FSCRYPT_KEY_IDENTIFIER_SIZE] {
        let mut id = [0u8; FSCRYPT_KEY_IDENTIFIER_SIZE];
        id.copy_from_slice(&self.u[..FSCRYPT_KEY_IDENTIFIER_SIZE]);
        id
    }
}

/// `struct fscrypt_add_key_arg`, without the flexible `raw[]` array that follows it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct fscrypt_add_key_arg {
    pub(crate) key_spec: fscrypt_key_specifier,
    pub(crate) raw_size: u32,
    pub(crate) key_id: u32,
    pub(crate) flags: u32,
    pub(crate) reserved: [u32; 7],
}

/// `struct fscrypt_remove_key_arg`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct fscrypt_remove_key_arg {
    pub(crate) key_spec: fscrypt_key_specifier,
    pub(crate) removal_status_flags: u32,
    pub(crate) reserved: [u32; 5],
}

/// `struct fscrypt_get_key_status_arg`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct fscrypt_get_key_status_arg {
    pub(crate) key_spec: fscrypt_key_specifier,
    pub(crate) reserved: [u32; 6],
    pub(crate) status: u32,
    pub(crate) status_flags: u32,
    pub(crate) user_count: u32,
    pub(crate) out_reserved: [u32; 13],
}

/// An add-key argument with its raw key in place, the way the kernel reads it: the header
/// immediately followed by `raw_size` key bytes. Heap-allocated and scrubbed on drop.
#[repr(C)]
struct AddKeyBuf {
    arg: fscrypt_add_key_arg,
    raw: [u8; FSCRYPT_MAX_KEY_SIZE],
}

impl Drop for AddKeyBuf {
    fn drop(&mut self) {
        self.raw.zeroize();
    }
}

// The layout must match the UAPI byte for byte; a mismatch would have the kernel read garbage.
const _: () = assert!(size_of::<fscrypt_policy_v2>() == 24);
const _: () = assert!(size_of::<fscrypt_get_policy_ex_arg>() == 32);
const _: () = assert!(offset_of!(fscrypt_get_policy_ex_arg, policy) == 8);
const _: () = assert!(size_of::<fscrypt_key_specifier>() == 40);
const _: () = assert!(size_of::<fscrypt_add_key_arg>() == 80);
const _: () = assert!(offset_of!(AddKeyBuf, raw) == size_of::<fscrypt_add_key_arg>());
const _: () = assert!(size_of::<fscrypt_remove_key_arg>() == 64);
const _: () = assert!(size_of::<fscrypt_get_key_status_arg>() == 128);
const _: () = assert!(offset_of!(fscrypt_get_key_status_arg, status) == 64);
const _: () = assert!(size_of::<fstrim_range>() == 24);

/// `struct fstrim_range` (`<linux/fs.h>`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct fstrim_range {
    pub(crate) start: u64,
    pub(crate) len: u64,
    pub(crate) minlen: u64,
}

mod ioctls {
    use super::*;

    // FS_IOC_SET_ENCRYPTION_POLICY is declared with the v1 struct's size (12) for compatibility,
    // but accepts either version: hence a "bad" ioctl with an explicit request code.
    nix::ioctl_write_ptr_bad!(fs_ioc_set_encryption_policy, nix::request_code_read!(b'f', 19, 12), fscrypt_policy_v2);
    // Declared as `_IOWR('f', 22, __u8[9])`: size + version byte, not the struct size.
    nix::ioctl_readwrite_bad!(
        fs_ioc_get_encryption_policy_ex,
        nix::request_code_readwrite!(b'f', 22, 9),
        fscrypt_get_policy_ex_arg
    );
    // The argument is followed by the raw key, which the struct does not describe.
    nix::ioctl_readwrite_bad!(
        fs_ioc_add_encryption_key,
        nix::request_code_readwrite!(b'f', 23, size_of::<fscrypt_add_key_arg>()),
        AddKeyBuf
    );
    nix::ioctl_readwrite_bad!(
        fs_ioc_remove_encryption_key,
        nix::request_code_readwrite!(b'f', 24, size_of::<fscrypt_remove_key_arg>()),
        fscrypt_remove_key_arg
    );
    nix::ioctl_readwrite_bad!(
        fs_ioc_remove_encryption_key_all_users,
        nix::request_code_readwrite!(b'f', 25, size_of::<fscrypt_remove_key_arg>()),
        fscrypt_remove_key_arg
    );
    nix::ioctl_readwrite_bad!(
        fs_ioc_get_encryption_key_status,
        nix::request_code_readwrite!(b'f', 26, size_of::<fscrypt_get_key_status_arg>()),
        fscrypt_get_key_status_arg
    );
    // `#define FITRIM _IOWR('X', 121, struct fstrim_range)`.
    nix::ioctl_readwrite!(fitrim, b'X', 121, fstrim_range);
}

/// FS_IOC_SET_ENCRYPTION_POLICY on a directory fd.
pub(crate) fn set_encryption_policy(dir: BorrowedFd<'_>, policy: &fscrypt_policy_v2) -> Result<(), Errno> {
    // SAFETY: `dir` is a live fd for the duration of the call; `policy` points to a fully
    // initialised 24-byte v2 policy, which the kernel only reads (size chosen by `version`).
    unsafe { ioctls::fs_ioc_set_encryption_policy(dir.as_raw_fd(), policy) }.map(drop)
}

/// FS_IOC_GET_ENCRYPTION_POLICY_EX. `ENODATA` means the file is not encrypted.
pub(crate) fn get_encryption_policy_ex(fd: BorrowedFd<'_>) -> Result<fscrypt_get_policy_ex_arg, Errno> {
    let mut arg =
        fscrypt_get_policy_ex_arg { policy_size: size_of::<fscrypt_policy_v2>() as u64, ..Default::default() };
    // SAFETY: `fd` is live; `arg` is a valid, exclusively borrowed buffer whose `policy_size`
    // tells the kernel it may write at most 24 bytes of policy after the size field.
    unsafe { ioctls::fs_ioc_get_encryption_policy_ex(fd.as_raw_fd(), &mut arg) }?;
    Ok(arg)
}

/// FS_IOC_ADD_ENCRYPTION_KEY for a v2 (identifier) key; returns the identifier the kernel computed.
///
/// `fd` may be any file or directory on the target filesystem, usually its root. The key is copied
/// into a heap buffer that is scrubbed when this function returns, on every path.
pub(crate) fn add_encryption_key(fd: BorrowedFd<'_>, raw: &[u8]) -> Result<[u8; FSCRYPT_KEY_IDENTIFIER_SIZE], Errno> {
    if raw.is_empty() || raw.len() > FSCRYPT_MAX_KEY_SIZE {
        return Err(Errno::EINVAL);
    }
    // Built in place on the heap so the key never sits in a stack temporary.
    let mut buf = Box::new(AddKeyBuf { arg: fscrypt_add_key_arg::default(), raw: [0; FSCRYPT_MAX_KEY_SIZE] });
    buf.arg.key_spec.type_ = FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER;
    // Bounded by FSCRYPT_MAX_KEY_SIZE just above, so the cast cannot truncate.
    buf.arg.raw_size = raw.len() as u32;
    buf.raw[..raw.len()].copy_from_slice(raw);
    // SAFETY: `fd` is live; `buf` is an exclusively borrowed, initialised `fscrypt_add_key_arg`
    // immediately followed by `raw_size` key bytes (layout asserted above). The kernel reads the
    // header and key and writes back only `key_spec`, all within the buffer.
    unsafe { ioctls::fs_ioc_add_encryption_key(fd.as_raw_fd(), &mut *buf) }?;
    Ok(buf.arg.key_spec.get_identifier())
}

/// FS_IOC_REMOVE_ENCRYPTION_KEY (or its `_ALL_USERS` variant, which needs CAP_SYS_ADMIN).
/// Returns the `FSCRYPT_KEY_REMOVAL_STATUS_FLAG_*` bits.
pub(crate) fn remove_encryption_key(
    fd: BorrowedFd<'_>,
    id: &[u8; FSCRYPT_KEY_IDENTIFIER_SIZE],
    all_users: bool,
) -> Result<u32, Errno> {
    let mut arg = fscrypt_remove_key_arg { key_spec: fscrypt_key_specifier::identifier(id), ..Default::default() };
    let fd = fd.as_raw_fd();
    if all_users {
        // SAFETY: `fd` is live; `arg` is an initialised, exclusively borrowed remove-key argument
        // of exactly the size encoded in the request code; the kernel writes only its status flags.
        unsafe { ioctls::fs_ioc_remove_encryption_key_all_users(fd, &mut arg) }?;
    } else {
        // SAFETY: as above, for the request without `_ALL_USERS`.
        unsafe { ioctls::fs_ioc_remove_encryption_key(fd, &mut arg) }?;
    }
    Ok(arg.removal_status_flags)
}

/// FS_IOC_GET_ENCRYPTION_KEY_STATUS. Returns the whole answer (status, flags, user count).
pub(crate) fn get_encryption_key_status(
    fd: BorrowedFd<'_>,
    id: &[u8; FSCRYPT_KEY_IDENTIFIER_SIZE],
) -> Result<fscrypt_get_key_status_arg, Errno> {
    let mut arg = fscrypt_get_key_status_arg { key_spec: fscrypt_key_specifier::identifier(id), ..Default::default() };
    // SAFETY: `fd` is live; `arg` is an initialised, exclusively borrowed 128-byte status argument
    // matching the request code's size; the kernel fills in its output fields.
    unsafe { ioctls::fs_ioc_get_encryption_key_status(fd.as_raw_fd(), &mut arg) }?;
    Ok(arg)
}

/// FITRIM on any fd of a mounted filesystem: discards every free block the device can discard.
/// Returns the number of bytes the filesystem reports as trimmed. `EOPNOTSUPP` means the device
/// (or the filesystem) does not support discard.
pub(crate) fn fitrim(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let mut range = fstrim_range { start: 0, len: u64::MAX, minlen: 0 };
    // SAFETY: `fd` is live for the call; `range` is an initialised, exclusively borrowed
    // `fstrim_range` of the size encoded in the request code; the kernel reads it and writes back
    // `len` (the bytes trimmed), all within the struct.
    unsafe { ioctls::fitrim(fd.as_raw_fd(), &mut range) }?;
    Ok(range.len)
}

/// The shared object this library was loaded as (the PAM module's file), or `None` when it is
/// part of the running program: the place the hardware helpers are looked for next to.
pub(crate) fn loaded_from() -> Option<std::path::PathBuf> {
    use std::ffi::{c_void, CStr, OsStr};
    use std::os::unix::ffi::OsStrExt;
    let mut here = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let mut main = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only looks the address up and fills the struct it is given.
    if unsafe { libc::dladdr(loaded_from as *const c_void, here.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded (non-zero): every field is set.
    let here = unsafe { here.assume_init() };
    // The main program's program headers (AT_PHDR) lie in the main program: its base is the
    // one to compare with (dladdr names the main program by argv[0], which the caller chose).
    // SAFETY: getauxval only reads the auxiliary vector.
    let phdr = unsafe { libc::getauxval(libc::AT_PHDR) };
    // SAFETY: dladdr as above.
    let found = phdr != 0 && unsafe { libc::dladdr(phdr as *const c_void, main.as_mut_ptr()) } != 0;
    // SAFETY: dladdr succeeded: every field is set.
    let main_base = found.then(|| unsafe { main.assume_init() }.dli_fbase);
    if main_base.is_none_or(|b| b == here.dli_fbase) || here.dli_fname.is_null() {
        return None;
    }
    // SAFETY: non-NULL, NUL-terminated, owned by the dynamic loader while the object is loaded.
    let name = unsafe { CStr::from_ptr(here.dli_fname) };
    let p = std::path::PathBuf::from(OsStr::from_bytes(name.to_bytes()));
    p.is_absolute().then_some(p)
}

/// `fexecve(fd, [argv0], [])`: runs the file `fd` refers to (it may be an `O_PATH` descriptor),
/// with `argv0` as its only argument and an empty environment. Returns only on failure.
///
/// Async-signal-safe (POSIX lists fexecve as such) and allocation-free, so it may run in a forked
/// child of a multithreaded program, between fork and exec.
pub(crate) fn fexecve(fd: BorrowedFd<'_>, argv0: &std::ffi::CStr) -> Errno {
    let argv = [argv0.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null::<libc::c_char>()];
    // SAFETY: `fd` is live for the call; `argv` and `envp` are NULL-terminated arrays of pointers
    // to NUL-terminated strings that outlive the call (`argv0` is borrowed, the arrays are on this
    // stack). On success the call does not return.
    unsafe { libc::fexecve(fd.as_raw_fd(), argv.as_ptr(), envp.as_ptr()) };
    Errno::last()
}

/// Puts the calling process into the idle I/O scheduling class (`ioprio_set(IOPRIO_WHO_PROCESS,
/// 0, IOPRIO_CLASS_IDLE)`; neither libc nor rustix wraps it): a background conversion's reads and
/// writes then yield to everything else.
pub(crate) fn ioprio_idle() -> Result<(), Errno> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    const IOPRIO_CLASS_SHIFT: u32 = 13;
    // SAFETY: ioprio_set takes three integers and touches no memory of ours.
    let r =
        unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) };
    if r == -1 {
        return Err(Errno::last());
    }
    Ok(())
}
