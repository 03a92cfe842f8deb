//! Which remedy each library error has: the [`HasRemedy`] impls, one exhaustive match per error
//! type, kept together so that deciding a new variant's remedy is one arm in this file. Nothing
//! uses this module (impls are found by type), so naming every error type here closes no circle.
use std::error::Error;

use crate::convert::ConvertError;
use crate::fido2::Fido2Error;
use crate::fscrypt::FscryptError;
use crate::keystore::KeystoreError;
use crate::ops::OpsError;
use crate::protector::fido2::SeveralKeys;
use crate::protector::{KindError, ProtectorError, UnlockError};
use crate::recovery::RecoveryError;
use crate::remedy::{HasRemedy, Remedy};
use crate::tang::TangError;
use crate::tpm2::Tpm2Error;

impl Remedy {
    /// The remedy of `e` itself, if it is one of the library's error types and has one: for a
    /// front end that holds errors type-erased (the CLI's anyhow), asking each link of a chain,
    /// outermost first (`chain.find_map(Remedy::of)`). Their transparent wrappers forward
    /// `source()` past what they wrap, so each link is asked once. The one place the library
    /// downcasts: every typed path goes through [`Remedy::find`].
    pub fn of(e: &(dyn Error + 'static)) -> Option<Remedy> {
        // Each of the library's error types that a front end may hold, once.
        macro_rules! first_of {
            ($($t:ty),*) => { None $(.or_else(|| e.downcast_ref::<$t>().map(|x| x as &dyn HasRemedy)))* };
        }
        let known: Option<&dyn HasRemedy> = first_of!(
            ConvertError,
            OpsError,
            UnlockError,
            KeystoreError,
            RecoveryError,
            FscryptError,
            ProtectorError,
            Tpm2Error,
            Fido2Error,
            TangError
        );
        known.and_then(HasRemedy::remedy)
    }
}

impl HasRemedy for ConvertError {
    fn remedy(&self) -> Option<Remedy> {
        match self {
            ConvertError::OwnerActive { .. } => Some(Remedy::Force),
            ConvertError::BadToken { path, .. } => Some(Remedy::AbortConversion { dir: path.clone() }),
            ConvertError::Ops(o) => o.remedy(),
            // The engine's messages say what to do in its own terms (resume, abort, free space).
            ConvertError::Migrate(_) | ConvertError::Ui(_) | ConvertError::Path { .. } => None,
            ConvertError::NotInProgress { .. } | ConvertError::NotScheduled { .. } => None,
            ConvertError::PinLoginOnly { .. } | ConvertError::WipeOnDecrypt { .. } => None,
        }
    }

    fn source_remedy(&self) -> Option<&dyn HasRemedy> {
        match self {
            ConvertError::Ops(o) => o.source_remedy(),
            // The others' causes are no library error's (the engine's, I/O).
            _ => None,
        }
    }
}

impl HasRemedy for OpsError {
    fn remedy(&self) -> Option<Remedy> {
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
            | OpsError::Escrow(_)
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

    fn source_remedy(&self) -> Option<&dyn HasRemedy> {
        match self {
            // Its cause, in its own message: a remedy of the protector's when it has none itself.
            OpsError::UseAnother { source, .. } => Some(source),
            // Transparent: their cause is what they wrap's.
            OpsError::Fscrypt(f) => f.source_remedy(),
            OpsError::Keystore(k) => k.source_remedy(),
            OpsError::Protector(p) => p.source_remedy(),
            OpsError::Recovery(r) => r.source_remedy(),
            // The others' causes are no library error's (I/O, the password database).
            _ => None,
        }
    }
}

impl HasRemedy for UnlockError {
    fn remedy(&self) -> Option<Remedy> {
        match self {
            UnlockError::Protector(p) => p.remedy(),
            UnlockError::Ui(_) => None,
        }
    }

    fn source_remedy(&self) -> Option<&dyn HasRemedy> {
        match self {
            UnlockError::Protector(p) => p.source_remedy(),
            UnlockError::Ui(_) => None,
        }
    }
}

impl HasRemedy for KeystoreError {
    fn remedy(&self) -> Option<Remedy> {
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

impl HasRemedy for RecoveryError {
    fn remedy(&self) -> Option<Remedy> {
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

    fn source_remedy(&self) -> Option<&dyn HasRemedy> {
        match self {
            RecoveryError::Fscrypt(f) => f.source_remedy(),
            // The others' causes are no library error's (the key format's, I/O).
            _ => None,
        }
    }
}

impl HasRemedy for FscryptError {
    fn remedy(&self) -> Option<Remedy> {
        match self {
            FscryptError::AlreadyEncrypted { path } => Some(Remedy::ShowStatus { dir: path.clone() }),
            FscryptError::NotEmpty { path } => Some(Remedy::Convert { dir: path.clone() }),
            FscryptError::Locked { path } => Some(Remedy::Unlock { dir: path.clone() }),
            // The message names the fix where there is one (tune2fs, another tool, the real path).
            FscryptError::NotSupported { .. }
            | FscryptError::ReadOnly { .. }
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
impl HasRemedy for ProtectorError {
    fn remedy(&self) -> Option<Remedy> {
        match self {
            ProtectorError::IncorrectSecret { .. } => Some(Remedy::UseRecoveryKey),
            // A kind's own error: its device (TPM, security key) may have advice.
            ProtectorError::Unavailable(k)
            | ProtectorError::WrongSecret(k)
            | ProtectorError::NotNow(k)
            | ProtectorError::Kind(k) => k.remedy(),
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

    fn source_remedy(&self) -> Option<&dyn HasRemedy> {
        match self {
            // Transparent, as the kind's error is: their cause is its cause.
            ProtectorError::Unavailable(k)
            | ProtectorError::WrongSecret(k)
            | ProtectorError::NotNow(k)
            | ProtectorError::Kind(k) => k.source_remedy(),
            _ => None,
        }
    }
}

impl HasRemedy for Tpm2Error {
    fn remedy(&self) -> Option<Remedy> {
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

impl HasRemedy for Fido2Error {
    fn remedy(&self) -> Option<Remedy> {
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
            | Fido2Error::NoKey
            | Fido2Error::Cancelled
            | Fido2Error::Other { .. }
            | Fido2Error::NotInstalled { .. }
            | Fido2Error::Helper(_) => None,
        }
    }
}

impl HasRemedy for TangError {
    // Each message says what to do; an unlock that fails "not now" (unreachable, the key gone)
    // gets the directory's other ways in from the operation (`OpsError::UseAnother`).
    fn remedy(&self) -> Option<Remedy> {
        match self {
            TangError::BadUrl { .. }
            | TangError::Unreachable { .. }
            | TangError::Status { .. }
            | TangError::KeyGone { .. }
            | TangError::BadReply { .. }
            | TangError::BadSignature { .. }
            | TangError::Untrusted { .. }
            | TangError::NotTrusted { .. }
            | TangError::WrongKey { .. }
            | TangError::BadJwe { .. } => None,
        }
    }
}

impl HasRemedy for KindError {
    // Shown as the kind's error, so its remedy and cause are that error's.
    fn remedy(&self) -> Option<Remedy> {
        self.inner().remedy()
    }

    fn source_remedy(&self) -> Option<&dyn HasRemedy> {
        self.inner().source_remedy()
    }
}

impl HasRemedy for SeveralKeys {
    // The message says what to do: name the key.
    fn remedy(&self) -> Option<Remedy> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let e =
            ConvertError::OwnerActive { path: "/x".into(), uid: 1, user: "daemon".into(), pids: "pid 2 (sh)".into() };
        assert!(matches!(Remedy::find(&e), Some(Remedy::Force)));
        assert!(Remedy::find(&ConvertError::NotInProgress { path: "/x".into() }).is_none());
    }

    /// The typed walk finds what walking `source()` and asking each link ([`Remedy::of`]) finds,
    /// through transparent wrappers, a cause named in its own message, and kinds' errors.
    #[test]
    fn typed_walk_agrees_with_the_chain() {
        fn by_chain(e: &(dyn Error + 'static)) -> Option<Remedy> {
            let mut link = Some(e);
            while let Some(cause) = link {
                if let Some(r) = Remedy::of(cause) {
                    return Some(r);
                }
                link = cause.source();
            }
            None
        }
        fn same<E: HasRemedy + 'static>(e: E) {
            let (typed, chain) = (Remedy::find(&e), by_chain(&e));
            assert_eq!(format!("{typed:?}"), format!("{chain:?}"), "{e}");
        }
        let kind = |e: Tpm2Error| crate::protector::KindError::new(e);
        let not_now = || ProtectorError::NotNow(kind(Tpm2Error::Lockout { recovery_time_s: Some(10) }));
        let use_another = |others: Vec<crate::census::ProtectorSummary>, recovery| OpsError::UseAnother {
            source: not_now(),
            dir: "/x".into(),
            others,
            recovery,
        };
        same(use_another(Vec::new(), false));
        same(use_another(Vec::new(), true));
        same(ConvertError::Ops(use_another(Vec::new(), false)));
        same(OpsError::Protector(ProtectorError::Kind(kind(Tpm2Error::WrongResetCode { lockout_recovery_s: None }))));
        same(UnlockError::Protector(ProtectorError::Unavailable(kind(Tpm2Error::LockoutNotOwned))));
        same(OpsError::Protector(ProtectorError::Kind(crate::protector::KindError::new(SeveralKeys))));
        same(ProtectorError::Unavailable(crate::protector::KindError::new(Fido2Error::NotConnected)));
        same(OpsError::NotManaged { path: "/x".into(), id: crate::ids::KeyIdentifier([2; 16]) });
        same(ConvertError::NotInProgress { path: "/x".into() });
        same(RecoveryError::Missing { path: "/x".into() });
        same(OpsError::Recovery(RecoveryError::Fscrypt(FscryptError::Locked { path: "/x".into() })));
        same(KeystoreError::LastProtector { policy: crate::ids::KeyIdentifier([3; 16]) });
    }
}
