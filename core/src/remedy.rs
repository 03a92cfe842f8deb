//! What to do about a library error, as data: each error type's `remedy()` decides it once, and
//! each front end renders it in its own vocabulary (the CLI as commands and flags, the service as
//! the method to call next, PAM as a log line). Error messages name the problem; a remedy names
//! the way out without naming any front end's commands.
//!
//! Every `remedy()` matches its variants one by one, without a wildcard arm: a new error variant
//! does not compile until someone decides its remedy (or that it has none).
use std::error::Error;
use std::path::PathBuf;

use crate::convert::ConvertError;
use crate::fido2::Fido2Error;
use crate::fscrypt::FscryptError;
use crate::keystore::KeystoreError;
use crate::ops::{OpsError, ProtectorSummary};
use crate::protector::{ProtectorError, UnlockError};
use crate::recovery::RecoveryError;
use crate::tpm2::Tpm2Error;

/// The next step out of an error. Front ends match it exhaustively, so a new variant is rendered
/// by each of them before it compiles.
#[derive(Clone, Debug)]
pub enum Remedy {
    /// The directory is not encrypted: encrypt it if it is empty, convert it if it holds data.
    EncryptOrConvert {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory holds data: convert it (encrypt it in place).
    Convert {
        /// The directory.
        dir: PathBuf,
    },
    /// The owner of the directory is logged in: convert anyway if nothing writes there.
    Force,
    /// The conversion journal cannot be trusted: abort the conversion.
    AbortConversion {
        /// The directory being converted.
        dir: PathBuf,
    },
    /// Several protectors fit: name the one to use (the message lists them).
    PickProtector,
    /// A device-bound protector cannot open now: use another way in. Never with neither
    /// `others` nor `recovery` (there is no remedy then).
    UseAnotherProtector {
        /// The directory to open.
        dir: PathBuf,
        /// Its other protectors.
        others: Vec<ProtectorSummary>,
        /// Whether it has a recovery key.
        recovery: bool,
    },
    /// The secret is wrong (perhaps forgotten): a directory's recovery key opens it.
    UseRecoveryKey,
    /// The policy is missing or does not match: the directory's recovery key restores it.
    RestorePolicy {
        /// The directory, when the error knows which.
        dir: Option<PathBuf>,
    },
    /// The directory is already encrypted: its status shows how.
    ShowStatus {
        /// The directory.
        dir: PathBuf,
    },
    /// The policy needs another (usable) protector.
    AddProtector,
    /// The protector still protects policies: remove it from them first.
    RemoveFromPolicies,
    /// No such protector or policy: list what exists.
    ListExisting,
    /// The directory is locked: unlock it first.
    Unlock {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory has no recovery key: create one while it is unlocked.
    AddRecoveryKey {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory already has a recovery key: remove it first.
    RemoveRecoveryKey {
        /// The directory.
        dir: PathBuf,
    },
    /// The recovery data on the directory is damaged: remove it and add a new key.
    ReplaceRecoveryKey {
        /// The directory.
        dir: PathBuf,
    },
    /// The PIN is the user's login password: choose another, or allow it and make the user a
    /// PIN-login account.
    PinLoginAccount {
        /// The user.
        user: String,
    },
    /// The user has no TPM protector with a PIN of their own on their home: add one.
    CreatePinProtector {
        /// The user.
        user: String,
        /// Their home.
        home: PathBuf,
    },
    /// The TPM's lockout hierarchy is not owned: set the TPM up first, or use no PIN.
    SetUpTpm,
    /// The TPM refuses for now: its status says when it forgives failures.
    WaitForTpm,
    /// A security key cannot be opened: list the connected ones.
    ListSecurityKeys,
}

/// `e` and its causes on one line, each said once: many errors already name their cause in their
/// own message (`cannot open X: No such file or directory`), and printing the whole chain (as
/// anyhow's `{:#}` does) would repeat it. What every front end prints for an error.
pub fn said_once(e: &(dyn Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut link = e.source();
    while let Some(cause) = link {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        link = cause.source();
    }
    out
}

impl Remedy {
    /// The remedy of `e` itself, if it is one of the library's error types and has one. Its
    /// transparent wrappers forward `source()` past what they wrap, so a walk down a chain
    /// asks each link, outermost first: `chain.find_map(Remedy::of)`.
    pub fn of(e: &(dyn Error + 'static)) -> Option<Remedy> {
        if let Some(c) = e.downcast_ref::<ConvertError>() {
            return c.remedy();
        }
        if let Some(o) = e.downcast_ref::<OpsError>() {
            return o.remedy();
        }
        if let Some(u) = e.downcast_ref::<UnlockError>() {
            return u.remedy();
        }
        if let Some(k) = e.downcast_ref::<KeystoreError>() {
            return k.remedy();
        }
        if let Some(r) = e.downcast_ref::<RecoveryError>() {
            return r.remedy();
        }
        if let Some(f) = e.downcast_ref::<FscryptError>() {
            return f.remedy();
        }
        if let Some(p) = e.downcast_ref::<ProtectorError>() {
            return p.remedy();
        }
        if let Some(t) = e.downcast_ref::<Tpm2Error>() {
            return t.remedy();
        }
        e.downcast_ref::<Fido2Error>().and_then(Fido2Error::remedy)
    }

    /// The first remedy along `e`'s chain of sources.
    pub fn find(e: &(dyn Error + 'static)) -> Option<Remedy> {
        let mut link = Some(e);
        while let Some(cause) = link {
            if let Some(r) = Remedy::of(cause) {
                return Some(r);
            }
            link = cause.source();
        }
        None
    }

    /// One of each variant, for front ends' tests that render them all.
    #[doc(hidden)]
    pub fn examples() -> Vec<Remedy> {
        let dir = || PathBuf::from("/home/alice");
        let other = ProtectorSummary {
            id: crate::ids::ProtectorId([0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0]),
            name: "pw".into(),
            kind: "password",
            uid: Some(1000),
            stored: "keystore",
        };
        vec![
            Remedy::EncryptOrConvert { dir: dir() },
            Remedy::Convert { dir: dir() },
            Remedy::Force,
            Remedy::AbortConversion { dir: dir() },
            Remedy::PickProtector,
            Remedy::UseAnotherProtector { dir: dir(), others: vec![other.clone()], recovery: true },
            Remedy::UseAnotherProtector { dir: dir(), others: vec![other], recovery: false },
            Remedy::UseAnotherProtector { dir: dir(), others: Vec::new(), recovery: true },
            Remedy::UseRecoveryKey,
            Remedy::RestorePolicy { dir: Some(dir()) },
            Remedy::RestorePolicy { dir: None },
            Remedy::ShowStatus { dir: dir() },
            Remedy::AddProtector,
            Remedy::RemoveFromPolicies,
            Remedy::ListExisting,
            Remedy::Unlock { dir: dir() },
            Remedy::AddRecoveryKey { dir: dir() },
            Remedy::RemoveRecoveryKey { dir: dir() },
            Remedy::ReplaceRecoveryKey { dir: dir() },
            Remedy::PinLoginAccount { user: "alice".into() },
            Remedy::CreatePinProtector { user: "alice".into(), home: dir() },
            Remedy::SetUpTpm,
            Remedy::WaitForTpm,
            Remedy::ListSecurityKeys,
        ]
    }
}

impl ConvertError {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            ConvertError::OwnerActive { .. } => Some(Remedy::Force),
            ConvertError::BadToken { path, .. } => Some(Remedy::AbortConversion { dir: path.clone() }),
            ConvertError::Ops(o) => o.remedy(),
            // The engine's messages say what to do in its own terms (resume, abort, free space).
            ConvertError::Migrate(_) | ConvertError::Ui(_) | ConvertError::Path { .. } => None,
            ConvertError::NotInProgress { .. } => None,
            ConvertError::PinLoginOnly { .. } => None,
        }
    }
}

impl OpsError {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            OpsError::Fscrypt(f) => f.remedy(),
            OpsError::Keystore(k) => k.remedy(),
            OpsError::Protector(p) => p.remedy(),
            OpsError::Recovery(r) => r.remedy(),
            OpsError::AmbiguousProtector { .. } => Some(Remedy::PickProtector),
            // Only directories are encrypted: for anything else there is nothing to suggest.
            OpsError::NotEncrypted { path } => path.is_dir().then(|| Remedy::EncryptOrConvert { dir: path.clone() }),
            OpsError::NotManaged { path, .. } => Some(Remedy::RestorePolicy { dir: Some(path.clone()) }),
            OpsError::KeyMismatch { .. } => Some(Remedy::RestorePolicy { dir: None }),
            OpsError::NotEmpty { path } => Some(Remedy::Convert { dir: path.clone() }),
            OpsError::AlreadyEncrypted { path, .. } => Some(Remedy::ShowStatus { dir: path.clone() }),
            OpsError::NoProtector { .. } | OpsError::LastTravelling { .. } => Some(Remedy::AddProtector),
            OpsError::UseAnother { dir, others, recovery, .. } => (!others.is_empty() || *recovery)
                .then(|| Remedy::UseAnotherProtector { dir: dir.clone(), others: others.clone(), recovery: *recovery }),
            OpsError::PinIsLoginPassword { user } => Some(Remedy::PinLoginAccount { user: user.clone() }),
            OpsError::NoPinProtector { user, home } => {
                Some(Remedy::CreatePinProtector { user: user.clone(), home: home.clone() })
            }
            // Their messages say what to do, or there is nothing a front end could add.
            OpsError::Config(_)
            | OpsError::Ui(_)
            | OpsError::Account(_)
            | OpsError::BadDirectory { .. }
            | OpsError::Unusable { .. }
            | OpsError::NotAProtectorOf { .. }
            | OpsError::NoSuchUser(_)
            | OpsError::AlreadyProtects(_)
            | OpsError::NoneOfYours { .. }
            | OpsError::SeveralOfYours { .. }
            | OpsError::NameAmbiguous { .. }
            | OpsError::NoSuchName { .. }
            | OpsError::OpensNone { .. }
            | OpsError::StaysOnMachine { .. } => None,
        }
    }
}

impl UnlockError {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            UnlockError::Protector(p) => p.remedy(),
            UnlockError::Ui(_) => None,
        }
    }
}

impl KeystoreError {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            KeystoreError::NotFound { .. } => Some(Remedy::ListExisting),
            KeystoreError::Corrupt { .. } => Some(Remedy::RestorePolicy { dir: None }),
            KeystoreError::InUse { .. } => Some(Remedy::RemoveFromPolicies),
            KeystoreError::LastProtector { .. } => Some(Remedy::AddProtector),
            KeystoreError::File(_)
            | KeystoreError::Undecidable { .. }
            | KeystoreError::NoEntry { .. }
            | KeystoreError::EntryMismatch { .. } => None,
        }
    }
}

impl RecoveryError {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            RecoveryError::Missing { path } => Some(Remedy::AddRecoveryKey { dir: path.clone() }),
            RecoveryError::Exists { path } => Some(Remedy::RemoveRecoveryKey { dir: path.clone() }),
            RecoveryError::Blob { path, source } => {
                source.is_damaged().then(|| Remedy::ReplaceRecoveryKey { dir: path.clone() })
            }
            RecoveryError::Fscrypt(f) => f.remedy(),
            RecoveryError::NotEncrypted { .. }
            | RecoveryError::Typo(_)
            | RecoveryError::OtherPolicy { .. }
            | RecoveryError::KeyMismatch { .. }
            | RecoveryError::Xattr { .. }
            | RecoveryError::Ui(_) => None,
        }
    }
}

impl FscryptError {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            FscryptError::AlreadyEncrypted { path } => Some(Remedy::ShowStatus { dir: path.clone() }),
            FscryptError::NotEmpty { path } => Some(Remedy::Convert { dir: path.clone() }),
            FscryptError::Locked { path } => Some(Remedy::Unlock { dir: path.clone() }),
            // The message names the fix where there is one (tune2fs, another tool, the real path).
            FscryptError::NotSupported { .. }
            | FscryptError::NotADirectory { .. }
            | FscryptError::Symlink { .. }
            | FscryptError::PolicyV1 { .. }
            | FscryptError::UnsupportedPolicy { .. }
            | FscryptError::KeyIdMismatch { .. }
            | FscryptError::KeyNotPresent { .. }
            | FscryptError::PermissionDenied { .. }
            | FscryptError::ExchangeRefused { .. }
            | FscryptError::InvalidPath { .. }
            | FscryptError::NoMount { .. }
            | FscryptError::MountInfo { .. }
            | FscryptError::Io { .. } => None,
        }
    }
}

// Kept here rather than in protector/, whose variants are each kind's: deciding a new variant's
// remedy is then one arm in this file.
impl ProtectorError {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            ProtectorError::IncorrectSecret { .. } => Some(Remedy::UseRecoveryKey),
            // A kind's own error: its device (TPM, security key) may have advice.
            ProtectorError::Unavailable(k)
            | ProtectorError::WrongSecret(k)
            | ProtectorError::NotNow(k)
            | ProtectorError::Kind(k) => Remedy::of(k.as_error()),
            ProtectorError::BadName { .. }
            | ProtectorError::NoSecret { .. }
            | ProtectorError::UnknownKind { .. }
            | ProtectorError::NoAnswer { .. }
            | ProtectorError::Kdf(_)
            | ProtectorError::BadOption { .. }
            | ProtectorError::BadOptionValue { .. }
            | ProtectorError::Privileged { .. } => None,
        }
    }
}

impl Tpm2Error {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            Tpm2Error::LockoutNotOwned => Some(Remedy::SetUpTpm),
            Tpm2Error::WrongResetCode { .. } => Some(Remedy::WaitForTpm),
            // The messages say how long to wait or what changed; a PCR change or a lockout
            // reaches users as OpsError::UseAnother, which names the other ways in.
            Tpm2Error::Unavailable { .. }
            | Tpm2Error::BadTcti(_)
            | Tpm2Error::BadPcrs(_)
            | Tpm2Error::WrongPin { .. }
            | Tpm2Error::Lockout { .. }
            | Tpm2Error::PcrMismatch { .. }
            | Tpm2Error::ForeignBlob
            | Tpm2Error::Corrupt(_)
            | Tpm2Error::TriesKept { .. }
            | Tpm2Error::TooSoon { .. }
            | Tpm2Error::PinLock { .. }
            | Tpm2Error::Busy { .. }
            | Tpm2Error::PinRequired
            | Tpm2Error::LockoutOwned
            | Tpm2Error::ResetCodeTypo(_)
            | Tpm2Error::LockoutHierarchyBlocked { .. }
            | Tpm2Error::ResetCodeNeeded
            | Tpm2Error::Tpm { .. }
            | Tpm2Error::Kdf(_)
            | Tpm2Error::NotInstalled { .. }
            | Tpm2Error::Helper(_) => None,
        }
    }
}

impl Fido2Error {
    /// What to do about it (see [`Remedy`]).
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            Fido2Error::Open { .. } => Some(Remedy::ListSecurityKeys),
            Fido2Error::Timeout(_)
            | Fido2Error::PinInvalid { .. }
            | Fido2Error::PinBlocked
            | Fido2Error::PinAuthBlocked
            | Fido2Error::PinRequired
            | Fido2Error::PinNotSet
            | Fido2Error::PinPolicy
            | Fido2Error::NoCredential
            | Fido2Error::Unsupported(_)
            | Fido2Error::NotConnected
            | Fido2Error::Cancelled
            | Fido2Error::Other { .. }
            | Fido2Error::NotInstalled { .. }
            | Fido2Error::Helper(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `examples` holds every variant: adding one breaks this match until it is listed here and
    /// given an example.
    #[test]
    fn examples_cover_every_variant() {
        let index = |r: &Remedy| match r {
            Remedy::EncryptOrConvert { .. } => 0,
            Remedy::Convert { .. } => 1,
            Remedy::Force => 2,
            Remedy::AbortConversion { .. } => 3,
            Remedy::PickProtector => 4,
            Remedy::UseAnotherProtector { .. } => 5,
            Remedy::UseRecoveryKey => 6,
            Remedy::RestorePolicy { .. } => 7,
            Remedy::ShowStatus { .. } => 8,
            Remedy::AddProtector => 9,
            Remedy::RemoveFromPolicies => 10,
            Remedy::ListExisting => 11,
            Remedy::Unlock { .. } => 12,
            Remedy::AddRecoveryKey { .. } => 13,
            Remedy::RemoveRecoveryKey { .. } => 14,
            Remedy::ReplaceRecoveryKey { .. } => 15,
            Remedy::PinLoginAccount { .. } => 16,
            Remedy::CreatePinProtector { .. } => 17,
            Remedy::SetUpTpm => 18,
            Remedy::WaitForTpm => 19,
            Remedy::ListSecurityKeys => 20,
        };
        let mut seen = [false; 21];
        for r in Remedy::examples() {
            seen[index(&r)] = true;
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
    }

    /// A transparent wrapper forwards `source()` past what it wraps: the remedy is still found.
    #[test]
    fn found_through_wrappers() {
        let e = ConvertError::Ops(OpsError::Keystore(KeystoreError::InUse {
            id: crate::ids::ProtectorId([1; 8]),
            policies: "p".into(),
        }));
        assert!(matches!(Remedy::find(&e), Some(Remedy::RemoveFromPolicies)));
        let e = OpsError::Protector(ProtectorError::Unavailable(crate::protector::KindError::new(
            Tpm2Error::LockoutNotOwned,
        )));
        assert!(matches!(Remedy::find(&e), Some(Remedy::SetUpTpm)));
        let e = ConvertError::OwnerActive { path: "/x".into(), uid: 1, pids: "2".into() };
        assert!(matches!(Remedy::find(&e), Some(Remedy::Force)));
        assert!(Remedy::find(&ConvertError::NotInProgress { path: "/x".into() }).is_none());
    }
}
