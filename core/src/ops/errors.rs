//! Why an operation failed ([`OpsError`]), and the wording its messages share.
use std::path::PathBuf;

use crate::census::ProtectorSummary;
use crate::config::ConfigError;
use crate::escrow::EscrowError;
use crate::fscrypt::FscryptError;
use crate::ids::{KeyIdentifier, ProtectorId};
use crate::keystore::KeystoreError;
use crate::protector::{ProtectorError, ProtectorRecord, UnlockError};
use crate::recovery::RecoveryError;
use crate::ui::UiError;

/// Why an operation failed; each names the directory, policy or protector concerned.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The kernel's fscrypt API refused or failed.
    #[error(transparent)]
    Fscrypt(#[from] FscryptError),
    /// The keystore could not be read or changed.
    #[error(transparent)]
    Keystore(#[from] KeystoreError),
    /// The configuration could not be read or saved.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Ui could not ask, or the person cancelled.
    #[error(transparent)]
    Ui(#[from] UiError),
    /// A protector could not be made, opened or changed.
    #[error(transparent)]
    Protector(#[from] ProtectorError),
    /// A recovery key could not be made, read or used.
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    /// A recovery key could not be escrowed, or its record read.
    #[error(transparent)]
    Escrow(#[from] EscrowError),
    /// An operation that needs an encrypted directory was given a plain one.
    #[error("{path} is not encrypted")]
    NotEncrypted {
        /// The directory.
        path: PathBuf,
    },
    /// The directory is encrypted with a key the keystore has no policy for.
    #[error(
        "{path} is encrypted with key {id}, but the keystore has no policy for it; its recovery key can restore one"
    )]
    NotManaged {
        /// The directory.
        path: PathBuf,
        /// Its key identifier.
        id: KeyIdentifier,
    },
    /// Direct encryption needs an empty directory; one with data is converted instead.
    #[error("{path} is not empty; only an empty directory is encrypted directly, one that holds data is converted")]
    NotEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// The directory already has an encryption policy.
    #[error("{path} is already encrypted (key {id})")]
    AlreadyEncrypted {
        /// The directory.
        path: PathBuf,
        /// Its key identifier.
        id: KeyIdentifier,
    },
    /// The path cannot be used as the directory asked for (missing, not a directory, wrong filesystem).
    #[error("{path}: {reason}")]
    BadDirectory {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Several protectors could be used and none was picked.
    #[error("{what} has several protectors ({list}); choose the one to use")]
    AmbiguousProtector {
        /// What is to be opened.
        what: String,
        /// Its protectors, as `id (name)`, for the message.
        list: String,
    },
    /// Nothing opens the policy: it lists no protector the keystore has.
    #[error("{what} has no usable protector")]
    NoProtector {
        /// What is to be opened.
        what: String,
    },
    /// The policy's protectors exist, but none of their records can be used (unreadable, corrupt).
    #[error("{what} has no usable protector: {problems}")]
    Unusable {
        /// What is to be opened.
        what: String,
        /// What is wrong with each record, for the message.
        problems: String,
    },
    /// The protector picked is not one of the policy's.
    #[error("protector {id} does not protect {what}; its protectors are: {list}")]
    NotAProtectorOf {
        /// The protector picked.
        id: ProtectorId,
        /// What is to be opened.
        what: String,
        /// The policy's protectors, for the message.
        list: String,
    },
    /// An unwrapped master key does not have the policy's identifier: the record was swapped or altered.
    #[error("the key unwrapped for policy {policy} has identifier {got}: the keystore entry does not belong to this directory and was refused; restore the keystore from a backup or restore the policy with the directory's recovery key")]
    KeyMismatch {
        /// The policy.
        policy: KeyIdentifier,
        /// The identifier of the key it unwrapped to.
        got: KeyIdentifier,
    },
    /// No account has that name or uid.
    #[error("no user named {0:?}; pass an existing user name or numeric uid")]
    NoSuchUser(String),
    /// The protector to add is already on the policy.
    #[error("protector {0} already protects this policy")]
    AlreadyProtects(ProtectorId),
    /// A user asked to open something none of their own protectors opens.
    #[error("no protector of uid {uid} opens {what}")]
    NoneOfYours {
        /// The user.
        uid: u32,
        /// What is to be opened.
        what: String,
    },
    /// Several of the user's protectors open it and none was named.
    #[error("several protectors of uid {uid} open {what} ({list}); name one")]
    SeveralOfYours {
        /// The user.
        uid: u32,
        /// What is to be opened.
        what: String,
        /// Those protectors, for the message.
        list: String,
    },
    /// A protector name matches several protectors where it was looked up.
    #[error("{name:?} names several protectors {scope} ({list}); name one by its id")]
    NameAmbiguous {
        /// The name given.
        name: String,
        /// Where it was looked up: "of uid 1000", "that open /home/alice", "in the keystore".
        scope: String,
        /// The protectors it matches, for the message.
        list: String,
    },
    /// No protector has that name where it was looked up.
    #[error("no protector named {name:?} {scope}")]
    NoSuchName {
        /// The name given.
        name: String,
        /// Where it was looked up: "of uid 1000", "that open /home/alice", "in the keystore".
        scope: String,
    },
    /// The user's secret opened none of their protectors.
    #[error("the secret opens none of the protectors of uid {uid} for {what} ({list})")]
    OpensNone {
        /// The user.
        uid: u32,
        /// What was to be opened.
        what: String,
        /// The protectors tried, for the message.
        list: String,
    },
    /// A TPM PIN equal to the login password would be testable offline against /etc/shadow.
    #[error(
        "the PIN is {user}'s login password: /etc/shadow holds a hash of it, against which anyone with the disk can \
         test PINs offline without the TPM counting them; choose another PIN, or log {user} in with the PIN alone \
         (a PIN-login account, docs/pam.md)"
    )]
    PinIsLoginPassword {
        /// The account.
        user: String,
    },
    /// PIN login was asked for an account whose home no TPM PIN protector of theirs opens.
    #[error("{user} has no TPM protector with a PIN of their own on {}; create one first (docs/pam.md: PIN login)", .home.display())]
    NoPinProtector {
        /// The account.
        user: String,
        /// Its home directory.
        home: PathBuf,
    },
    /// The account could not be looked up in the password database.
    #[error(transparent)]
    Account(#[from] crate::account::AccountError),
    /// A device-bound protector cannot open now (PCRs changed, TPM locked out); the others can.
    #[error("{source}; {} still opens with {}", .dir.display(), alternatives(.others, *.recovery))]
    UseAnother {
        /// The protector's own error.
        source: ProtectorError,
        /// The directory to open.
        dir: PathBuf,
        /// The protectors that may still open it.
        others: Vec<ProtectorSummary>,
        /// Whether it has a recovery key too.
        recovery: bool,
    },
    /// A portable directory's protector must open on any machine; this one is bound to this one.
    #[error(
        "protector {name} is a {kind} protector, bound to this machine, and a portable directory must open on any \
         machine: protect it with a password or a security key (fido2), then add the {kind} protector as an extra, \
         local one"
    )]
    StaysOnMachine {
        /// The protector's name.
        name: String,
        /// Its kind.
        kind: &'static str,
    },
    /// Removing the protector would leave a portable directory no protector that opens it elsewhere.
    #[error(
        "policy {policy} is portable and protector {protector} is the last one that opens it on other machines; \
         add another password or security key protector first"
    )]
    LastTravelling {
        /// The policy.
        policy: KeyIdentifier,
        /// The protector asked to be removed.
        protector: ProtectorId,
    },
}

/// The one record of `found` (those named `named`, looked up `scope`), or the error that says
/// there are none or several.
pub(super) fn one_named(named: &str, found: Vec<ProtectorRecord>, scope: String) -> Result<ProtectorRecord, OpsError> {
    let name = named.to_string();
    match <[ProtectorRecord; 1]>::try_from(found) {
        Ok([one]) => Ok(one),
        Err(found) if found.is_empty() => Err(OpsError::NoSuchName { name, scope }),
        Err(found) => Err(OpsError::NameAmbiguous { name, scope, list: listed(&found) }),
    }
}

/// Protectors as errors list them: id (name), comma-separated.
pub(super) fn listed(list: &[ProtectorRecord]) -> String {
    list.iter().map(|r| format!("{} ({})", r.id, r.name)).collect::<Vec<_>>().join(", ")
}

/// What else opens a directory, for [`OpsError::UseAnother`]: each front end says how to use them.
fn alternatives(others: &[ProtectorSummary], recovery: bool) -> String {
    let mut out: Vec<String> = others.iter().map(|r| format!("protector {} ({}, {})", r.name, r.kind, r.id)).collect();
    if recovery {
        out.push("its recovery key".into());
    }
    if out.is_empty() {
        out.push("nothing else: it has no other protector and no recovery key".into());
    }
    out.join("; ")
}

impl From<UnlockError> for OpsError {
    fn from(e: UnlockError) -> OpsError {
        match e {
            UnlockError::Ui(e) => e.into(),
            UnlockError::Protector(e) => e.into(),
        }
    }
}
