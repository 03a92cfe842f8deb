//! The typed fscrypt v2 API the rest of dirseal uses: policies, kernel keys, the encrypted
//! attribute and atomic exchange, with kernel errors mapped to what they mean for the user.
//!
//! Every path is opened without following a final symlink (`O_NOFOLLOW`), and the syscalls work
//! on the resulting fd, so a path swapped for a symlink is refused instead of followed.
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hkdf::Hkdf;
use nix::errno::Errno;
use sha2::Sha512;

pub use crate::ids::KeyIdentifier;
use crate::secret::MasterKey;
use crate::sys;
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Why an fscrypt operation failed, worded for the person who has to fix it.
#[derive(Debug, thiserror::Error)]
pub enum FscryptError {
    /// The filesystem can encrypt but is mounted read-only.
    #[error("{} is mounted read-only, so nothing can be encrypted or written on it: remount it read-write (`mount -o remount,rw {}`) and run the same command again", mountpoint.display(), mountpoint.display())]
    ReadOnly {
        /// Mount point of that filesystem.
        mountpoint: PathBuf,
    },
    /// The filesystem cannot encrypt: no encrypt feature, or not a filesystem fscrypt supports.
    #[error("{}", not_supported_message(mountpoint, fstype.as_deref(), device.as_deref()))]
    NotSupported {
        /// Mount point of that filesystem.
        mountpoint: PathBuf,
        /// Its type from the mount table, when known: it decides which command the advice names.
        fstype: Option<String>,
        /// Its device, when known, for the advice's command line.
        device: Option<String>,
    },
    /// The directory already has a policy with another key or other settings.
    #[error("{path} is already encrypted with a different policy or key")]
    AlreadyEncrypted {
        /// The directory.
        path: PathBuf,
    },
    /// The kernel sets a policy only on an empty directory; this one holds data.
    #[error("{path} is not empty and the kernel can only encrypt empty directories; one that holds data is converted")]
    NotEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// A policy was asked for on something other than a directory.
    #[error("{path} is not a directory; only directories can be given an encryption policy")]
    NotADirectory {
        /// What was given.
        path: PathBuf,
    },
    /// The path ends in a symbolic link, which is never followed.
    #[error("{path} is a symbolic link, which dirseal never follows; pass the real path instead")]
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// The directory has a v1 policy (another tool's), which dirseal leaves alone.
    #[error("{path} is encrypted with a v1 fscrypt policy, which dirseal does not manage; unlock it with the tool that created it (for example `fscrypt unlock`)")]
    PolicyV1 {
        /// The directory.
        path: PathBuf,
    },
    /// The directory has a policy version or mode dirseal does not know.
    #[error("{path} has an fscrypt policy dirseal does not understand ({detail}); use the tool that created it, or a newer dirseal")]
    UnsupportedPolicy {
        /// The directory.
        path: PathBuf,
        /// What was not understood (version, modes), for the report.
        detail: String,
    },
    /// The kernel's identifier for an added key differs from ours (a bug; the key was removed).
    #[error("the kernel derived key identifier {kernel} but dirseal computed {expected}; the key was removed again. This is a bug in dirseal or the kernel, please report it")]
    KeyIdMismatch {
        /// The identifier dirseal computed.
        expected: KeyIdentifier,
        /// The identifier the kernel returned.
        kernel: KeyIdentifier,
    },
    /// Removing a key that this user has not added (locked already, or another user's claim).
    #[error("key {id} is not loaded on {mountpoint}: the directory is already locked, or another user added the key (root can remove it for all users)")]
    KeyNotPresent {
        /// The filesystem the key was to be removed from.
        mountpoint: PathBuf,
        /// The key.
        id: KeyIdentifier,
    },
    /// The operation needs the directory's key loaded, and it is not.
    #[error("{path} is encrypted and its key is not loaded; unlock it first")]
    Locked {
        /// The encrypted path.
        path: PathBuf,
    },
    /// The kernel refused: key management needs root, a policy needs ownership.
    #[error("permission denied to {op} {path}; fscrypt key management needs root, and setting a policy needs ownership of the directory")]
    PermissionDenied {
        /// The path the operation was on.
        path: PathBuf,
        /// What was attempted, as a verb phrase for the message ("set a policy on").
        op: &'static str,
    },
    /// The kernel refused the atomic exchange (different filesystems or encryption contexts).
    #[error("cannot exchange {a} and {b}: they are on different filesystems, or the exchange would move one into a directory encrypted with another key; keep both in the same unencrypted directory")]
    ExchangeRefused {
        /// First path of the exchange.
        a: PathBuf,
        /// Second path of the exchange.
        b: PathBuf,
    },
    /// A path that cannot be used for the operation (no parent, `..`, a root).
    #[error("{path} cannot be used here: {reason}")]
    InvalidPath {
        /// The path.
        path: PathBuf,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// No mount in the mount table holds the path.
    #[error("no mount in {MOUNTINFO} holds {path}; check that the path exists and that /proc is mounted")]
    NoMount {
        /// The path looked up.
        path: PathBuf,
    },
    /// The mount table could not be parsed.
    #[error("{MOUNTINFO} line {line} is malformed ({reason}); check that /proc is a real procfs")]
    MountInfo {
        /// 1-based line of the malformed entry.
        line: usize,
        /// What was wrong with it.
        reason: &'static str,
    },
    /// Any other I/O or kernel error.
    #[error("cannot {op} {path}: {source}; check the path and retry")]
    Io {
        /// The path the operation was on.
        path: PathBuf,
        /// What was attempted, as a verb phrase for the message.
        op: &'static str,
        /// The underlying error.
        source: io::Error,
    },
}

fn not_supported_message(mountpoint: &Path, fstype: Option<&str>, device: Option<&str>) -> String {
    let dev = device.unwrap_or("/dev/...");
    match fstype {
        Some("ext4") | None => format!(
            "the filesystem at {} does not have the encrypt feature; enable it with `tune2fs -O encrypt {dev}` (ext4 allows this while mounted, and on a casefold filesystem such as a SteamOS SD card with e2fsprogs 1.46 or later) and retry (the kernel also needs CONFIG_FS_ENCRYPTION; casefolded directories inside an encrypted one need Linux 5.13)",
            mountpoint.display()
        ),
        Some("f2fs") => format!(
            "the f2fs filesystem at {} does not have the encrypt feature; enable it with `fsck.f2fs -O encrypt {dev}` (f2fs needs it unmounted; a casefold f2fs takes it too) and retry (casefolded directories inside an encrypted one need Linux 5.11)",
            mountpoint.display()
        ),
        Some(t) => format!(
            "the filesystem at {} ({t}) does not support fscrypt; put the directory on ext4 or f2fs with the encrypt feature",
            mountpoint.display()
        ),
    }
}

/// What a kernel errno means when it comes back for `path`; callers first handle the errnos that
/// mean something specific to their operation.
fn from_errno(e: Errno, path: &Path, op: &'static str) -> FscryptError {
    let path_buf = || path.to_path_buf();
    match e {
        Errno::ELOOP => FscryptError::Symlink { path: path_buf() },
        Errno::ENOTDIR => FscryptError::NotADirectory { path: path_buf() },
        Errno::EACCES | Errno::EPERM => FscryptError::PermissionDenied { path: path_buf(), op },
        Errno::ENOKEY => FscryptError::Locked { path: path_buf() },
        Errno::EOPNOTSUPP | Errno::ENOTTY => not_supported(path),
        e => FscryptError::Io { path: path_buf(), op, source: io::Error::from(e) },
    }
}

fn from_io(e: io::Error, path: &Path, op: &'static str) -> FscryptError {
    match e.raw_os_error() {
        Some(n) => from_errno(Errno::from_raw(n), path, op),
        None => FscryptError::Io { path: path.to_path_buf(), op, source: e },
    }
}

/// Names the filesystem and device in the hint when the mount table says what they are.
fn not_supported(path: &Path) -> FscryptError {
    match mount_entry(path) {
        Ok(m) => {
            FscryptError::NotSupported { mountpoint: m.mount_point, fstype: Some(m.fstype), device: Some(m.source) }
        }
        Err(_) => FscryptError::NotSupported { mountpoint: path.to_path_buf(), fstype: None, device: None },
    }
}

/// An fscrypt v2 policy. Dirseal ignores the data unit size (`log2_data_unit_size`): it does not
/// affect which key unlocks the directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyV2 {
    pub(crate) contents_mode: u8,
    pub(crate) filenames_mode: u8,
    pub(crate) flags: u8,
    /// Which master key unlocks the directory.
    pub identifier: KeyIdentifier,
}

impl PolicyV2 {
    /// What dirseal sets: AES-256-XTS contents, AES-256-CTS names, names padded to 32 bytes (the
    /// kernel documentation's recommendation, leaking the least about name lengths).
    pub fn new(identifier: KeyIdentifier) -> PolicyV2 {
        PolicyV2 {
            contents_mode: sys::FSCRYPT_MODE_AES_256_XTS,
            filenames_mode: sys::FSCRYPT_MODE_AES_256_CTS,
            flags: sys::FSCRYPT_POLICY_FLAGS_PAD_32,
            identifier,
        }
    }
}

/// The identifier the kernel will give `key`: HKDF-SHA512 with no salt, info `"fscrypt\0"` plus
/// context byte 1 (HKDF_CONTEXT_KEY_IDENTIFIER), first 16 bytes.
pub fn key_identifier(key: &MasterKey) -> KeyIdentifier {
    let hk = Hkdf::<Sha512>::new(None, key.as_bytes());
    let mut id = [0u8; 16];
    // Invariant: 16 bytes is far below HKDF-SHA512's 255 * 64-byte output limit.
    hk.expand(b"fscrypt\0\x01", &mut id).expect("16 bytes is a valid HKDF-SHA512 length");
    KeyIdentifier(id)
}

/// One line of /proc/self/mountinfo, the parts dirseal needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// The filesystem's device number (`st_dev` of its files).
    pub(crate) major: u64,
    pub(crate) minor: u64,
    pub(crate) mount_point: PathBuf,
    pub(crate) fstype: String,
    /// The mounted device (or `none`, `tmpfs`, ...), as the mount table names it.
    pub(crate) source: String,
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(byte) = u8::try_from(v) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

fn parse_mountinfo(text: &str) -> Result<Vec<MountEntry>, FscryptError> {
    let mut entries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let bad = |reason| FscryptError::MountInfo { line: n + 1, reason };
        let fields: Vec<&str> = line.split(' ').collect();
        // id parent major:minor root mount-point options [optional...] - fstype source super-options
        let sep = fields.iter().position(|f| *f == "-").ok_or_else(|| bad("no `-` separator"))?;
        if sep < 6 || fields.len() < sep + 3 {
            return Err(bad("too few fields"));
        }
        let (major, minor) = fields[2].split_once(':').ok_or_else(|| bad("device is not major:minor"))?;
        let major = major.parse().map_err(|_| bad("bad major number"))?;
        let minor = minor.parse().map_err(|_| bad("bad minor number"))?;
        let mount_point = PathBuf::from(OsStr::from_bytes(&unescape(fields[4])));
        if !mount_point.is_absolute() {
            return Err(bad("mount point is not absolute"));
        }
        entries.push(MountEntry {
            major,
            minor,
            mount_point,
            fstype: String::from_utf8_lossy(&unescape(fields[sep + 1])).into_owned(),
            source: String::from_utf8_lossy(&unescape(fields[sep + 2])).into_owned(),
        });
    }
    Ok(entries)
}

/// Absolute form of `path` resolving symlinks in its parent but not in its last component.
fn resolve_nofollow(path: &Path) -> Result<PathBuf, FscryptError> {
    let io = |e| from_io(e, path, "resolve");
    if let Some((parent, name)) = split_last(path) {
        if std::fs::symlink_metadata(path).map_err(io)?.file_type().is_symlink() {
            return Ok(std::fs::canonicalize(parent).map_err(io)?.join(name));
        }
    }
    std::fs::canonicalize(path).map_err(io)
}

/// The mount holding `path`: the longest mount point that is a prefix of the resolved path and
/// has the path's device; on ties the later line, which is mounted on top.
fn pick_mount(entries: Vec<MountEntry>, resolved: &Path, major: u64, minor: u64) -> Option<MountEntry> {
    let mut best: Option<MountEntry> = None;
    for e in entries {
        if e.major != major || e.minor != minor || !resolved.starts_with(&e.mount_point) {
            continue;
        }
        let longer = best.as_ref().is_none_or(|b| e.mount_point.as_os_str().len() >= b.mount_point.as_os_str().len());
        if longer {
            best = Some(e);
        }
    }
    best
}

/// The mount holding `path` (which is not followed if it is a symlink).
pub(crate) fn mount_entry(path: &Path) -> Result<MountEntry, FscryptError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| from_io(e, path, "inspect"))?;
    let resolved = resolve_nofollow(path)?;
    let text = std::fs::read_to_string(MOUNTINFO).map_err(|e| from_io(e, Path::new(MOUNTINFO), "read"))?;
    let dev = meta.dev();
    pick_mount(parse_mountinfo(&text)?, &resolved, nix::sys::stat::major(dev), nix::sys::stat::minor(dev))
        .ok_or_else(|| FscryptError::NoMount { path: path.to_path_buf() })
}

/// Every mount point, in /proc/self/mountinfo order.
pub(crate) fn mount_points() -> Result<Vec<PathBuf>, FscryptError> {
    let text = std::fs::read_to_string(MOUNTINFO).map_err(|e| from_io(e, Path::new(MOUNTINFO), "read"))?;
    Ok(parse_mountinfo(&text)?.into_iter().map(|m| m.mount_point).collect())
}

/// The top of the encrypted tree `dir` belongs to: the highest ancestor on the same filesystem
/// with the same policy (a subdirectory inherits its parent's). Locking any directory of the tree
/// locks all of it, and the tree's facts (its recovery key) live on this directory.
pub(crate) fn encrypted_root(dir: &Path, policy: &PolicyV2) -> Result<PathBuf, FscryptError> {
    let mp = mount_point(dir)?;
    let mut top = resolve_nofollow(dir)?;
    while top != mp {
        let Some(parent) = top.parent() else { break };
        match get_policy(parent) {
            Ok(Some(p)) if p.identifier == policy.identifier => top = parent.to_path_buf(),
            _ => break,
        }
    }
    Ok(top)
}

/// The mount point of the filesystem holding `path` (which is not followed if it is a symlink).
pub fn mount_point(path: &Path) -> Result<PathBuf, FscryptError> {
    mount_entry(path).map(|m| m.mount_point)
}

/// Discards the free blocks of the filesystem holding `path` (`FITRIM`), so that a flash device
/// may erase what was freed; the bytes trimmed. Used after a conversion and by `scrub`.
pub(crate) fn trim(path: &Path) -> Result<u64, FscryptError> {
    let mp = mount_point(path)?;
    let root = File::open(&mp).map_err(|source| FscryptError::Io { path: mp.clone(), op: "open", source })?;
    crate::sys::fitrim(root.as_fd()).map_err(|e| FscryptError::Io { path: mp, op: "trim", source: io::Error::from(e) })
}

fn open_nofollow(path: &Path, flags: libc::c_int, op: &'static str) -> Result<File, FscryptError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| from_io(e, path, op))
}

fn open_dir(path: &Path, op: &'static str) -> Result<File, FscryptError> {
    open_nofollow(path, libc::O_DIRECTORY, op).map_err(|e| match e {
        // O_DIRECTORY wins over O_NOFOLLOW: a symlink to a directory fails with ENOTDIR, which
        // would tell the user the wrong thing.
        FscryptError::NotADirectory { path } if path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) => {
            FscryptError::Symlink { path }
        }
        e => e,
    })
}

/// Fails with [`FscryptError::NotSupported`] unless the filesystem at `mountpoint` can encrypt.
/// A filesystem mounted read-only is refused here too, before any question is asked: nothing
/// could be written to it (issue 44).
pub fn check_supported(mountpoint: &Path) -> Result<(), FscryptError> {
    match support(mountpoint)? {
        Support::Enabled => Ok(()),
        Support::ReadOnly => Err(FscryptError::ReadOnly { mountpoint: mountpoint.to_path_buf() }),
        Support::NotEnabled | Support::Unsupported => Err(not_supported(mountpoint)),
    }
}

/// Whether a filesystem can hold encrypted directories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Support {
    /// fscrypt works here.
    Enabled,
    /// fscrypt works here, but the filesystem is mounted read-only: nothing can be encrypted (or
    /// written) until it is remounted read-write. Encrypted directories on it still open.
    ReadOnly,
    /// ext4 or f2fs without the encrypt feature: it can be turned on (ext4: mounted, with `tune2fs -O encrypt`; f2fs: unmounted, with `fsck.f2fs -O encrypt`).
    NotEnabled,
    /// This kind of filesystem has no fscrypt (tmpfs, btrfs, xfs, ...), or the kernel lacks it.
    Unsupported,
}

/// Asks the kernel whether the filesystem mounted at `mountpoint` can encrypt.
pub(crate) fn support(mountpoint: &Path) -> Result<Support, FscryptError> {
    let path = mountpoint;
    let dir = open_dir(path, "open")?;
    // ext4 without the encrypt feature refuses every fscrypt ioctl with EOPNOTSUPP, including this
    // read-only one; any other answer means the ioctl reached fscrypt.
    match sys::get_encryption_policy_ex(dir.as_fd()) {
        Err(Errno::EOPNOTSUPP | Errno::ENOTTY) => {
            let fstype = mount_entry(path).map(|m| m.fstype).unwrap_or_default();
            Ok(if matches!(fstype.as_str(), "ext4" | "f2fs") { Support::NotEnabled } else { Support::Unsupported })
        }
        Err(Errno::EACCES | Errno::EPERM) => {
            Err(FscryptError::PermissionDenied { path: path.to_path_buf(), op: "check encryption support on" })
        }
        _ if read_only(dir.as_fd()) => Ok(Support::ReadOnly),
        _ => Ok(Support::Enabled),
    }
}

/// Whether the filesystem of `fd` is mounted read-only (`ST_RDONLY`).
fn read_only(fd: BorrowedFd<'_>) -> bool {
    nix::sys::statvfs::fstatvfs(fd).is_ok_and(|v| v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

/// The policy of `path`; `None` if it is not encrypted. Symlinks are refused, not followed.
pub fn get_policy(path: &Path) -> Result<Option<PolicyV2>, FscryptError> {
    let ft = std::fs::symlink_metadata(path).map_err(|e| from_io(e, path, "inspect"))?.file_type();
    if ft.is_symlink() {
        return Err(FscryptError::Symlink { path: path.to_path_buf() });
    }
    // Only directories and regular files carry policies; opening a device or FIFO could block or
    // have side effects.
    if !ft.is_dir() && !ft.is_file() {
        return Ok(None);
    }
    let f = open_nofollow(path, libc::O_NONBLOCK, "open")?;
    get_policy_fd(f.as_fd(), path)
}

pub(crate) fn get_policy_fd(fd: BorrowedFd<'_>, path_for_errors: &Path) -> Result<Option<PolicyV2>, FscryptError> {
    let path = path_for_errors;
    let unsupported = |detail: String| FscryptError::UnsupportedPolicy { path: path.to_path_buf(), detail };
    let arg = match sys::get_encryption_policy_ex(fd) {
        Ok(arg) => arg,
        Err(Errno::ENODATA) => return Ok(None),
        // A filesystem that cannot encrypt (no encrypt feature, which cannot be removed once set,
        // or no fscrypt at all) holds no encrypted directory: `lock` and `unlock` then say "not
        // encrypted" instead of how to enable a feature nobody asked for.
        Err(Errno::EOPNOTSUPP | Errno::ENOTTY) => return Ok(None),
        Err(Errno::EOVERFLOW) => return Err(unsupported("the policy is larger than a v2 policy".into())),
        Err(Errno::EINVAL) => return Err(unsupported("the kernel reports an unknown policy version".into())),
        Err(e) => return Err(from_errno(e, path, "read the encryption policy of")),
    };
    let p = arg.policy;
    match p.version {
        sys::FSCRYPT_POLICY_V1 => Err(FscryptError::PolicyV1 { path: path.to_path_buf() }),
        sys::FSCRYPT_POLICY_V2 if arg.policy_size == std::mem::size_of::<sys::fscrypt_policy_v2>() as u64 => {
            Ok(Some(PolicyV2 {
                contents_mode: p.contents_encryption_mode,
                filenames_mode: p.filenames_encryption_mode,
                flags: p.flags,
                identifier: KeyIdentifier(p.master_key_identifier),
            }))
        }
        v => Err(unsupported(format!("version {v}, {} bytes", arg.policy_size))),
    }
}

/// Encrypts the empty directory `dir` with [`PolicyV2::new`]`(id)`. Setting the same policy again
/// is a no-op; the key does not need to be loaded (root has CAP_FOWNER).
pub fn set_policy(dir: &Path, id: &KeyIdentifier) -> Result<(), FscryptError> {
    let f = open_dir(dir, "open")?;
    set_policy_fd(f.as_fd(), dir, id)
}

pub(crate) fn set_policy_fd(
    fd: BorrowedFd<'_>,
    path_for_errors: &Path,
    id: &KeyIdentifier,
) -> Result<(), FscryptError> {
    let path = path_for_errors;
    let p = PolicyV2::new(*id);
    let raw = sys::fscrypt_policy_v2 {
        version: sys::FSCRYPT_POLICY_V2,
        contents_encryption_mode: p.contents_mode,
        filenames_encryption_mode: p.filenames_mode,
        flags: p.flags,
        master_key_identifier: id.0,
        ..Default::default()
    };
    match sys::set_encryption_policy(fd, &raw) {
        Ok(()) => Ok(()),
        Err(Errno::EEXIST) => Err(FscryptError::AlreadyEncrypted { path: path.to_path_buf() }),
        Err(Errno::ENOTEMPTY) => Err(FscryptError::NotEmpty { path: path.to_path_buf() }),
        Err(e) => Err(from_errno(e, path, "set the encryption policy of")),
    }
}

/// Adds `key` to the filesystem at `mountpoint` and returns its identifier, which is checked
/// against [`key_identifier`]. Adding a key that is already present is not an error.
pub fn add_key(mountpoint: &Path, key: &MasterKey) -> Result<KeyIdentifier, FscryptError> {
    let dir = open_dir(mountpoint, "open")?;
    let kernel = sys::add_encryption_key(dir.as_fd(), key.as_bytes())
        .map(KeyIdentifier)
        .map_err(|e| from_errno(e, mountpoint, "add an encryption key to"))?;
    let expected = key_identifier(key);
    if kernel != expected {
        // A key the keystore cannot name must not stay loaded. Best effort: the mismatch is the
        // error to report either way.
        let _ = sys::remove_encryption_key(dir.as_fd(), &kernel.0, false);
        return Err(FscryptError::KeyIdMismatch { expected, kernel });
    }
    Ok(kernel)
}

/// What [`remove_key`] could not finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoveOutcome {
    /// Some files were still open: their inodes stay unlocked until closed; removing again then
    /// finishes the job.
    pub files_busy: bool,
    /// Only this user's claim was removed; other users still hold the key.
    pub other_users: bool,
}

/// Removes the key `id` from the filesystem at `mountpoint` (this user's claim, or every user's
/// with `all_users`, which needs CAP_SYS_ADMIN).
pub fn remove_key(mountpoint: &Path, id: &KeyIdentifier, all_users: bool) -> Result<RemoveOutcome, FscryptError> {
    let dir = open_dir(mountpoint, "open")?;
    match sys::remove_encryption_key(dir.as_fd(), &id.0, all_users) {
        Ok(flags) => Ok(RemoveOutcome {
            files_busy: flags & sys::FSCRYPT_KEY_REMOVAL_STATUS_FLAG_FILES_BUSY != 0,
            other_users: flags & sys::FSCRYPT_KEY_REMOVAL_STATUS_FLAG_OTHER_USERS != 0,
        }),
        Err(Errno::ENOKEY) => Err(FscryptError::KeyNotPresent { mountpoint: mountpoint.to_path_buf(), id: *id }),
        Err(e) => Err(from_errno(e, mountpoint, "remove an encryption key from")),
    }
}

/// Whether a master key is loaded on a filesystem (for every user, not only the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyStatus {
    /// Not loaded: the directories using it are locked.
    Absent,
    /// Loaded: the directories using it are unlocked.
    Present,
    /// Removed, but files that were open at the time are still unlocked.
    IncompletelyRemoved,
}

/// Asks the kernel whether key `id` is loaded on the filesystem at `mountpoint`.
pub fn key_status(mountpoint: &Path, id: &KeyIdentifier) -> Result<KeyStatus, FscryptError> {
    let dir = open_dir(mountpoint, "open")?;
    let arg = sys::get_encryption_key_status(dir.as_fd(), &id.0)
        .map_err(|e| from_errno(e, mountpoint, "read the key status on"))?;
    match arg.status {
        sys::FSCRYPT_KEY_STATUS_ABSENT => Ok(KeyStatus::Absent),
        sys::FSCRYPT_KEY_STATUS_PRESENT => Ok(KeyStatus::Present),
        sys::FSCRYPT_KEY_STATUS_INCOMPLETELY_REMOVED => Ok(KeyStatus::IncompletelyRemoved),
        n => Err(FscryptError::Io {
            path: mountpoint.to_path_buf(),
            op: "read the key status on",
            source: io::Error::new(io::ErrorKind::InvalidData, format!("unknown key status {n} from the kernel")),
        }),
    }
}

/// Whether `path` itself (never a symlink's target) is encrypted. Works on locked files.
pub fn is_encrypted(path: &Path) -> Result<bool, FscryptError> {
    // O_PATH opens nothing: no key needed, no side effects on devices or FIFOs.
    let f = open_nofollow(path, libc::O_PATH, "inspect")?;
    is_encrypted_at(f.as_fd(), OsStr::new(""), true).map_err(|e| from_errno(e, path, "inspect"))
}

/// `path` split into its parent directory and final name, or `None` when it does not end in a
/// name (`/`, `.`, `..`, `a/.`). `a/.` is refused rather than read as `a`: if `a` is a symlink the
/// two name different objects.
fn split_last(path: &Path) -> Option<(&Path, &OsStr)> {
    let last = path.as_os_str().as_bytes().split(|c| *c == b'/').rev().find(|s| !s.is_empty())?;
    if last == b"." || last == b".." {
        return None;
    }
    let name = path.file_name()?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Some((parent, name))
}

/// Atomically swaps `a` and `b` (both must exist). Neither they nor any component of their
/// parents is followed if it is a symlink.
pub fn rename_exchange(a: &Path, b: &Path) -> Result<(), FscryptError> {
    fn split(p: &Path) -> Result<(&Path, &OsStr), FscryptError> {
        split_last(p).ok_or(FscryptError::InvalidPath {
            path: p.to_path_buf(),
            reason: "it must end in a file or directory name",
        })
    }
    let (pa, na) = split(a)?;
    let (pb, nb) = split(b)?;
    // No component of either parent may be a symlink: root exchanges paths a user may own parts
    // of, and a symlink swapped in between the engine's checks and this call would redirect it.
    let parent = |p: &Path| {
        use rustix::fs::{openat2, Mode, OFlags, ResolveFlags, CWD};
        openat2(
            CWD,
            p,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| from_errno(Errno::from_raw(e.raw_os_error()), p, "open the parent of"))
    };
    let da = parent(pa)?;
    let db = parent(pb)?;
    match rename_exchange_at(da.as_fd(), na, db.as_fd(), nb) {
        Ok(()) => Ok(()),
        Err(Errno::EXDEV) => Err(FscryptError::ExchangeRefused { a: a.to_path_buf(), b: b.to_path_buf() }),
        Err(e) => Err(from_errno(e, a, "exchange")),
    }
}

// fd-relative calls that rustix wraps safely: they live here, not in the `unsafe` sys module.

/// A single path component, so an fd-relative call cannot wander through intermediate symlinks.
fn component(name: &OsStr) -> Result<CString, Errno> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    CString::new(b).map_err(|_| Errno::EINVAL)
}

/// Atomically swaps `olddir/oldname` and `newdir/newname` (`renameat2(RENAME_EXCHANGE)`). Both
/// must exist; names are single components and are never followed if they are symlinks.
pub(crate) fn rename_exchange_at(
    olddir: BorrowedFd<'_>,
    oldname: &OsStr,
    newdir: BorrowedFd<'_>,
    newname: &OsStr,
) -> Result<(), Errno> {
    let old = component(oldname)?;
    let new = component(newname)?;
    rustix::fs::renameat_with(olddir, old.as_c_str(), newdir, new.as_c_str(), rustix::fs::RenameFlags::EXCHANGE)
        .map_err(errno)
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_raw(e.raw_os_error())
}

/// Whether `dir/name` has the fscrypt encrypted attribute, via `statx`. An empty `name` asks
/// about `dir` itself (which may be an `O_PATH` fd of any file type). With `nofollow`, a symlink
/// is examined itself (encrypted symlinks have encrypted targets).
///
/// A filesystem that does not report the attribute in `stx_attributes_mask` cannot encrypt, so
/// the answer is `false`.
fn is_encrypted_at(dir: BorrowedFd<'_>, name: &OsStr, nofollow: bool) -> Result<bool, Errno> {
    use rustix::fs::{AtFlags, StatxAttributes, StatxFlags};
    let (cname, mut flags) =
        if name.is_empty() { (CString::default(), AtFlags::EMPTY_PATH) } else { (component(name)?, AtFlags::empty()) };
    if nofollow {
        flags |= AtFlags::SYMLINK_NOFOLLOW;
    }
    // Only the attributes are wanted: no field needs to be requested in the mask.
    let stx = rustix::fs::statx(dir, cname.as_c_str(), flags, StatxFlags::empty()).map_err(errno)?;
    let bit = StatxAttributes::ENCRYPTED;
    Ok(stx.stx_attributes_mask.contains(bit) && stx.stx_attributes.contains(bit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_identifier_matches_known_vector() {
        // Computed independently with Python's hmac/hashlib (HKDF-SHA512, zero salt, info
        // "fscrypt\0\x01") and checked against the kernel in tests/fscrypt.rs.
        let key = MasterKey::from_slice(&(0u8..64).collect::<Vec<_>>()).unwrap();
        assert_eq!(key_identifier(&key).to_string(), "8699c2c53707405da5aba5ae4d8583c0");
    }

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape(r"/mnt/a\040b\011c\012d\134e"), b"/mnt/a b\tc\nd\\e");
        // Not an escape: left as is.
        assert_eq!(unescape(r"/x\09"), b"/x\\09");
        assert_eq!(unescape(r"/x\"), b"/x\\");
        assert_eq!(unescape(r"\777"), b"\\777");
    }

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
40 27 7:3 / /tmp/my\\040dir/mnt rw,relatime shared:20 master:3 - ext4 /dev/loop3 rw
41 27 7:4 / /tmp/my\\040dir/mnt/inner rw,relatime - ext4 /dev/loop4 rw
42 27 7:3 /sub /bind rw,relatime - ext4 /dev/loop3 rw
43 27 7:5 / /tmp/my\\040dir/mnt rw,relatime - ext4 /dev/loop5 rw
";

    #[test]
    fn parses_mountinfo() {
        let e = parse_mountinfo(SAMPLE).unwrap();
        assert_eq!(e.len(), 6);
        assert_eq!(e[2].mount_point, Path::new("/tmp/my dir/mnt"));
        assert_eq!((e[2].major, e[2].minor), (7, 3));
        assert_eq!(e[2].fstype, "ext4");
        assert_eq!(e[2].source, "/dev/loop3");
        assert_eq!(e[0].fstype, "proc");
    }

    #[test]
    fn picks_longest_matching_mount() {
        let pick = |p: &str, maj, min| {
            pick_mount(parse_mountinfo(SAMPLE).unwrap(), Path::new(p), maj, min).map(|m| m.mount_point)
        };
        assert_eq!(pick("/tmp/my dir/mnt/inner/x", 7, 4).unwrap(), Path::new("/tmp/my dir/mnt/inner"));
        // Same prefix, other device: the stacked mount on top wins only when devices match.
        assert_eq!(pick("/tmp/my dir/mnt/x", 7, 5).unwrap(), Path::new("/tmp/my dir/mnt"));
        assert_eq!(pick("/bind/y", 7, 3).unwrap(), Path::new("/bind"));
        assert_eq!(pick("/etc", 259, 1).unwrap(), Path::new("/"));
        // Prefix must be component-wise: /bindx is not under /bind.
        assert!(pick("/bindx", 7, 3).is_none());
        assert!(pick("/etc", 9, 9).is_none());
    }

    #[test]
    fn rejects_malformed_mountinfo() {
        for bad in [
            "1 2 0:1 / /x rw shared:1 ext4 src rw",
            "1 2 01 / /x rw - ext4 src rw",
            "1 2 0:1 / x rw - ext4 src rw",
            "1 2 0:1 / /x rw -",
        ] {
            assert!(matches!(parse_mountinfo(bad), Err(FscryptError::MountInfo { line: 1, .. })), "{bad}");
        }
    }

    #[test]
    fn splits_paths() {
        assert_eq!(split_last(Path::new("a/b")), Some((Path::new("a"), OsStr::new("b"))));
        assert_eq!(split_last(Path::new("b")), Some((Path::new("."), OsStr::new("b"))));
        assert_eq!(split_last(Path::new("/b/")), Some((Path::new("/"), OsStr::new("b"))));
        assert_eq!(split_last(Path::new("/")), None);
        assert_eq!(split_last(Path::new("a/..")), None);
        assert_eq!(split_last(Path::new("a/.")), None);
        assert_eq!(split_last(Path::new("a/./b")), Some((Path::new("a/."), OsStr::new("b"))));
    }
}
