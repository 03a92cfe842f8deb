//! What to do about a library error, as data: each error type decides its remedy once (its
//! [`HasRemedy`] impl, all of them in core/src/advice.rs), and each front end renders it in its
//! own vocabulary (the CLI as commands and flags, the service as the method to call next, PAM as
//! a log line). Error messages name the problem; a remedy names the way out without naming any
//! front end's commands.
//!
//! Every `remedy()` matches its variants one by one, without a wildcard arm: a new error variant
//! does not compile until someone decides its remedy (or that it has none). A front end holding a
//! library error asks [`Remedy::find`], typed; one holding errors type-erased (the CLI's anyhow)
//! asks [`Remedy::of`] of each link.
//!
//! This module names no error type, so every module may use it (a protector kind's error carries
//! its remedy through [`HasRemedy`]); advice.rs, which names them all, is used by none.
use std::error::Error;
use std::path::PathBuf;

use crate::census::ProtectorSummary;

/// A library error whose way out the library decides: each of the library's error types, and
/// each protector kind's own error (what [`crate::protector::ProtectorError`] wraps).
pub trait HasRemedy: Error {
    /// Its remedy: one exhaustive match of its variants, a variant that wraps another library
    /// error asking that one.
    fn remedy(&self) -> Option<Remedy>;

    /// The library error next along its chain of causes (as `source()` goes: a transparent
    /// wrapper forwards past what it wraps), asked when [`HasRemedy::remedy`] has none.
    fn source_remedy(&self) -> Option<&dyn HasRemedy> {
        None
    }
}

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
    /// The first remedy along `e`'s chain of causes: its own, else that of the library error it
    /// was caused by, and so on.
    pub fn find(e: &dyn HasRemedy) -> Option<Remedy> {
        e.remedy().or_else(|| e.source_remedy().and_then(Remedy::find))
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
}
