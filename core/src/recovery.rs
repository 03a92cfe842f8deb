//! Recovery keys stored with the data: the master key sealed by a recovery key in a root-only
//! `trusted.dirseal.recovery` xattr on the encrypted directory itself, so that a reinstall that
//! wiped the keystore still leaves a way in (docs/recovery-format.md).
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use dirseal_recovery::{ParseError, Sealed};
// The key a front end shows or reads, and the blob error it tells apart (a wrong key): from here,
// so that the CLI and the service depend on the core alone.
pub use dirseal_recovery::{BlobError, RecoveryKey};

use crate::fscrypt::{self, FscryptError};
use crate::ids::KeyIdentifier;
use crate::secret::{MasterKey, Passphrase};
use crate::ui::{SecretPrompt, Ui, UiError};

pub(crate) const XATTR: &str = "trusted.dirseal.recovery";
/// The largest well-formed blob: anything longer is refused before parsing.
const MAX_XATTR: usize = dirseal_recovery::MAX_BLOB;

/// Why a recovery key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// The directory has no fscrypt policy.
    #[error("{path} is not encrypted, so it has no recovery key")]
    NotEncrypted {
        /// The directory.
        path: PathBuf,
    },
    /// The directory has no recovery attribute.
    #[error("{path} has no recovery key (its {XATTR} attribute is missing); one can be created while it is unlocked")]
    Missing {
        /// The directory.
        path: PathBuf,
    },
    /// The directory has a recovery attribute already; it is never overwritten.
    #[error("{path} already has a recovery key; remove it first (the old key then stops working)")]
    Exists {
        /// The directory.
        path: PathBuf,
    },
    /// The typed key is malformed (the parser names the group).
    #[error("the recovery key is mistyped: {0}")]
    Typo(#[from] ParseError),
    /// The stored blob is malformed, or does not open with this key.
    #[error("{path}: {source}")]
    Blob {
        /// The directory holding the blob.
        path: PathBuf,
        /// What the blob parser or opener said.
        source: BlobError,
    },
    /// The blob was made for another directory's policy (copied here).
    #[error("the recovery data of {path} names policy {found}, but the directory's policy is {expected}: it was copied from another directory and cannot open this one")]
    OtherPolicy {
        /// The directory.
        path: PathBuf,
        /// The directory's policy.
        expected: KeyIdentifier,
        /// The policy the blob names.
        found: KeyIdentifier,
    },
    /// The recovered key is not the policy's key (forged or damaged blob).
    #[error("the key recovered for {path} does not match its policy {expected}: the recovery data is forged or damaged; nothing was unlocked")]
    KeyMismatch {
        /// The directory.
        path: PathBuf,
        /// The directory's policy.
        expected: KeyIdentifier,
    },
    /// Reading, writing or removing the attribute failed.
    #[error(
        "cannot {op} the recovery attribute of {path}: {source}; dirseal must run as root on a filesystem with xattrs"
    )]
    Xattr {
        /// The directory.
        path: PathBuf,
        /// What was attempted, as a verb for the message.
        op: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Reading the directory's policy failed.
    #[error(transparent)]
    Fscrypt(#[from] FscryptError),
    /// Asking for the key failed or was cancelled.
    #[error(transparent)]
    Ui(#[from] UiError),
}

pub(crate) fn open_dir(dir: &Path) -> Result<OwnedFd, RecoveryError> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| RecoveryError::Xattr { path: dir.to_path_buf(), op: "open the directory for", source: e.into() })
}

/// The parsed blob on `dir`, if any.
pub fn read_blob(dir: &Path) -> Result<Option<Sealed>, RecoveryError> {
    let fd = open_dir(dir)?;
    let mut buf = vec![0u8; MAX_XATTR];
    match rustix::fs::fgetxattr(&fd, XATTR, &mut buf) {
        Ok(n) => {
            buf.truncate(n);
            Sealed::parse(&buf).map(Some).map_err(|source| RecoveryError::Blob { path: dir.to_path_buf(), source })
        }
        Err(rustix::io::Errno::NODATA) => Ok(None),
        Err(rustix::io::Errno::RANGE) => {
            Err(RecoveryError::Blob { path: dir.to_path_buf(), source: BlobError::TooLarge(MAX_XATTR) })
        }
        Err(e) => Err(RecoveryError::Xattr { path: dir.to_path_buf(), op: "read", source: e.into() }),
    }
}

fn write_blob(fd: BorrowedFd<'_>, dir: &Path, blob: &Sealed) -> Result<(), RecoveryError> {
    rustix::fs::fsetxattr(fd, XATTR, &blob.to_bytes(), rustix::fs::XattrFlags::CREATE).map_err(|e| {
        if e == rustix::io::Errno::EXIST {
            RecoveryError::Exists { path: dir.to_path_buf() }
        } else {
            RecoveryError::Xattr { path: dir.to_path_buf(), op: "write", source: e.into() }
        }
    })?;
    rustix::fs::fsync(fd).map_err(|e| RecoveryError::Xattr { path: dir.to_path_buf(), op: "sync", source: e.into() })
}

/// Deletes the recovery attribute; `false` if there was none. Front ends remove a key through
/// `Dirseal::remove_recovery_key`, which removes its escrow record too.
pub(crate) fn remove_blob(dir: &Path) -> Result<bool, RecoveryError> {
    let fd = open_dir(dir)?;
    match rustix::fs::fremovexattr(&fd, XATTR) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::NODATA) => Ok(false),
        Err(e) => Err(RecoveryError::Xattr { path: dir.to_path_buf(), op: "remove", source: e.into() }),
    }
}

fn metadata(policy: &KeyIdentifier) -> Vec<u8> {
    format!("{{\"version\":1,\"policy\":\"{policy}\"}}").into_bytes()
}

/// Seals `master` (the key of `policy`) under `key` and stores it on the directory open as `dir`
/// (`path` only names it in errors). Only `Dirseal::save_recovery_key` calls it: every new key is
/// escrowed there first.
pub(crate) fn install_at(
    dir: BorrowedFd<'_>,
    path: &Path,
    policy: &KeyIdentifier,
    master: &MasterKey,
    key: &RecoveryKey,
) -> Result<(), RecoveryError> {
    let blob = dirseal_recovery::seal(key, &policy.0, master.as_bytes(), &metadata(policy))
        .map_err(|source| RecoveryError::Blob { path: path.to_path_buf(), source })?;
    write_blob(dir, path, &blob)
}

/// Parses what the user typed.
pub fn parse_key(typed: &Passphrase) -> Result<RecoveryKey, RecoveryError> {
    let text = std::str::from_utf8(typed.as_bytes()).unwrap_or("\u{fffd}");
    Ok(RecoveryKey::parse(text)?)
}

/// The master key of `dir` from its recovery attribute, checked against the kernel's policy.
pub fn master_key(dir: &Path, key: &RecoveryKey) -> Result<(KeyIdentifier, MasterKey), RecoveryError> {
    let policy = fscrypt::get_policy(dir)?.ok_or_else(|| RecoveryError::NotEncrypted { path: dir.to_path_buf() })?;
    let id = policy.identifier;
    let blob = read_blob(dir)?.ok_or_else(|| RecoveryError::Missing { path: dir.to_path_buf() })?;
    if blob.context() != &id.0 {
        return Err(RecoveryError::OtherPolicy {
            path: dir.to_path_buf(),
            expected: id,
            found: KeyIdentifier(*blob.context()),
        });
    }
    let bytes = blob.open(key, &id.0).map_err(|source| RecoveryError::Blob { path: dir.to_path_buf(), source })?;
    let master = MasterKey::from_slice(&bytes)
        .ok_or_else(|| RecoveryError::KeyMismatch { path: dir.to_path_buf(), expected: id })?;
    if fscrypt::key_identifier(&master) != id {
        return Err(RecoveryError::KeyMismatch { path: dir.to_path_buf(), expected: id });
    }
    Ok((id, master))
}

/// Asks the Ui for the recovery key of `dir` and parses it.
pub fn ask_key(dir: &Path, ui: &mut dyn Ui) -> Result<RecoveryKey, RecoveryError> {
    let typed = ui.secret(&SecretPrompt::RecoveryKey { dir })?;
    parse_key(&typed)
}
