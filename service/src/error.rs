//! The service's D-Bus errors: a name a front end can branch on, and a one-line message: the
//! library's, which says what happened, and the library's remedy for it rendered as the
//! service's next step in terms of its methods ([`next`]).
use dirseal::keystore::KeystoreError;
use dirseal::ops::OpsError;
use dirseal::protector::ProtectorError;
use dirseal::recovery::{BlobError, RecoveryError};
use dirseal::remedy::{HasRemedy, Remedy};
use dirseal::ui::UiError;
use zbus::message::{Header, Message};
use zbus::names::ErrorName;

const PREFIX: &str = "org.dirseal.Dirseal1.Error.";

/// What kind of failure, which fixes the D-Bus error name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `org.freedesktop.DBus.Error.AccessDenied`: the caller may not act on this.
    AccessDenied,
    /// `org.freedesktop.DBus.Error.InvalidArgs`: a malformed path, id or secret.
    InvalidArgs,
    /// The secret does not open the protector (or the recovery key does not open the directory).
    IncorrectSecret,
    /// No such protector, policy or directory, or the directory is not encrypted or not managed.
    NotFound,
    /// Files are in use, the owner is logged in, or another conversion runs: retry after that.
    Busy,
    /// The filesystem or this build cannot do it.
    NotSupported,
    /// `org.freedesktop.DBus.Error.LimitsExceeded`: the caller has too many calls in flight or
    /// conversions running; retry when one has returned.
    LimitsExceeded,
    /// Anything else; the message says what.
    Failed,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::AccessDenied => "org.freedesktop.DBus.Error.AccessDenied",
            Kind::InvalidArgs => "org.freedesktop.DBus.Error.InvalidArgs",
            Kind::IncorrectSecret => "org.dirseal.Dirseal1.Error.IncorrectSecret",
            Kind::NotFound => "org.dirseal.Dirseal1.Error.NotFound",
            Kind::Busy => "org.dirseal.Dirseal1.Error.Busy",
            Kind::NotSupported => "org.dirseal.Dirseal1.Error.NotSupported",
            Kind::LimitsExceeded => "org.freedesktop.DBus.Error.LimitsExceeded",
            Kind::Failed => "org.dirseal.Dirseal1.Error.Failed",
        }
    }
}

#[derive(Debug)]
pub struct Error {
    pub kind: Kind,
    pub message: String,
}

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }
    pub fn denied(message: impl Into<String>) -> Error {
        Error::new(Kind::AccessDenied, message)
    }
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(Kind::InvalidArgs, message)
    }
    pub fn failed(message: impl Into<String>) -> Error {
        Error::new(Kind::Failed, message)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.name().trim_start_matches(PREFIX), self.message)
    }
}

impl std::error::Error for Error {}

impl zbus::DBusError for Error {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.kind.name())?.build(&(self.message.as_str(),))
    }
    fn name(&self) -> ErrorName<'_> {
        ErrorName::from_static_str_unchecked(self.kind.name())
    }
    fn description(&self) -> Option<&str> {
        Some(&self.message)
    }
}

impl From<zbus::Error> for Error {
    fn from(e: zbus::Error) -> Error {
        Error::failed(format!("D-Bus: {e}"))
    }
}

impl From<zbus::fdo::Error> for Error {
    fn from(e: zbus::fdo::Error) -> Error {
        Error::failed(format!("D-Bus: {e}"))
    }
}

fn keystore_kind(e: &KeystoreError) -> Kind {
    match e {
        KeystoreError::NotFound { .. } | KeystoreError::NoEntry { .. } => Kind::NotFound,
        _ => Kind::Failed,
    }
}

fn protector_kind(e: &ProtectorError) -> Kind {
    match e {
        e if e.is_wrong_secret() => Kind::IncorrectSecret,
        ProtectorError::BadName { .. }
        | ProtectorError::UnknownKind { .. }
        | ProtectorError::BadOption { .. }
        | ProtectorError::BadOptionValue { .. } => Kind::InvalidArgs,
        ProtectorError::Privileged { .. } => Kind::AccessDenied,
        ProtectorError::NoSecret { .. } => Kind::NotSupported,
        _ => Kind::Failed,
    }
}

impl From<ProtectorError> for Error {
    fn from(e: ProtectorError) -> Error {
        Error::new(protector_kind(&e), message(&e))
    }
}

fn ops_kind(e: &OpsError) -> Kind {
    use dirseal::fscrypt::FscryptError as F;
    match e {
        OpsError::Keystore(k) => keystore_kind(k),
        OpsError::Protector(p) | OpsError::UseAnother { source: p, .. } => protector_kind(p),
        OpsError::Recovery(r) => recovery_kind(r),
        OpsError::NotEncrypted { .. } | OpsError::NotManaged { .. } | OpsError::NotAProtectorOf { .. } => {
            Kind::NotFound
        }
        OpsError::Ui(UiError::Empty) => Kind::InvalidArgs,
        OpsError::NoneOfYours { .. } => Kind::AccessDenied,
        OpsError::SeveralOfYours { .. } | OpsError::NameAmbiguous { .. } => Kind::InvalidArgs,
        OpsError::NoSuchName { .. } => Kind::NotFound,
        OpsError::OpensNone { .. } => Kind::IncorrectSecret,
        OpsError::Fscrypt(F::NotSupported { .. }) => Kind::NotSupported,
        OpsError::Fscrypt(F::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Kind::NotFound,
        OpsError::Fscrypt(F::Symlink { .. } | F::NotADirectory { .. } | F::InvalidPath { .. }) => Kind::InvalidArgs,
        _ => Kind::Failed,
    }
}

fn recovery_kind(e: &RecoveryError) -> Kind {
    match e {
        RecoveryError::Typo(_) => Kind::InvalidArgs,
        RecoveryError::Blob { source: BlobError::WrongKey, .. } => Kind::IncorrectSecret,
        RecoveryError::NotEncrypted { .. } | RecoveryError::Missing { .. } => Kind::NotFound,
        _ => Kind::Failed,
    }
}

/// `e`'s message, then its remedy (if it has one) as what to call next.
fn message(e: &dyn HasRemedy) -> String {
    match Remedy::find(e) {
        Some(r) => format!("{e}; {}", next(&r)),
        None => e.to_string(),
    }
}

/// A remedy in the service's terms: its methods and options, never a CLI command line (the
/// caller is a program that offers its own way to do it).
pub fn next(r: &Remedy) -> String {
    match r {
        Remedy::EncryptOrConvert { .. } => {
            "call Encrypt for an empty directory, Convert for one that holds data".into()
        }
        Remedy::Convert { .. } => "call Convert to encrypt it in place".into(),
        Remedy::Force => "if nothing writes there, root can call Convert with the force option".into(),
        Remedy::AbortConversion { .. } => {
            "root aborts it with the command-line tool; the service resumes no conversion it cannot trust".into()
        }
        Remedy::PickProtector => "name one of them in the protector argument".into(),
        Remedy::UseAnotherProtector { others, recovery, .. } => match (others.is_empty(), *recovery) {
            (false, true) => "call Unlock with one of those protectors, or RecoveryRestore with the key".into(),
            (false, false) => "call Unlock with one of those protectors".into(),
            (true, _) => "call RecoveryRestore with the key".into(),
        },
        Remedy::UseRecoveryKey => "forgotten? RecoveryRestore with the directory's recovery key opens it".into(),
        Remedy::RestorePolicy { .. } => "RecoveryRestore with the directory's recovery key restores its policy".into(),
        Remedy::ShowStatus { .. } => "GetStatus shows its state".into(),
        Remedy::AddProtector => "add one with AddProtectorToPolicy".into(),
        Remedy::RemoveFromPolicies => "remove it with RemoveProtectorFromPolicy".into(),
        Remedy::ListExisting => "ListProtectors shows what exists".into(),
        Remedy::Unlock { .. } => "call Unlock first".into(),
        Remedy::AddRecoveryKey { .. } => "while it is unlocked, create one with RecoveryAdd".into(),
        Remedy::RemoveRecoveryKey { .. } => "remove it with RecoveryRemove".into(),
        Remedy::ReplaceRecoveryKey { .. } => "replace it: RecoveryRemove, then RecoveryAdd".into(),
        Remedy::PinLoginAccount { user } => format!(
            "call CreateProtector again with another PIN; keeping this one needs root to make {user} a PIN-login \
             account with the command-line tool"
        ),
        Remedy::CreatePinProtector { .. } => {
            "CreateProtector with kind tpm2, then AddProtectorToPolicy, adds one".into()
        }
        Remedy::SetUpTpm => {
            "root sets the TPM up first with the command-line tool; or call CreateProtector with no_pin for a \
             protector without PIN"
                .into()
        }
        Remedy::WaitForTpm => "wait until the TPM forgives failures, then try again".into(),
        Remedy::ListSecurityKeys => "check that the security key is plugged in".into(),
    }
}

impl From<OpsError> for Error {
    fn from(e: OpsError) -> Error {
        Error::new(ops_kind(&e), message(&e))
    }
}

impl From<KeystoreError> for Error {
    fn from(e: KeystoreError) -> Error {
        Error::new(keystore_kind(&e), message(&e))
    }
}

impl From<RecoveryError> for Error {
    fn from(e: RecoveryError) -> Error {
        Error::new(recovery_kind(&e), message(&e))
    }
}

impl From<dirseal::fscrypt::FscryptError> for Error {
    fn from(e: dirseal::fscrypt::FscryptError) -> Error {
        OpsError::from(e).into()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<dirseal::convert::ConvertError> for Error {
    fn from(e: dirseal::convert::ConvertError) -> Error {
        use dirseal::convert::ConvertError as C;
        use dirseal::convert::MigrateError as M;
        let kind = match &e {
            C::Ops(o) => ops_kind(o),
            C::OwnerActive { .. } | C::Migrate(M::Busy { .. } | M::InUse { .. }) => Kind::Busy,
            C::Migrate(M::NoSpace { .. } | M::NoInodes { .. }) => Kind::Failed,
            C::Migrate(
                M::SourceIsSymlink { .. }
                | M::NotADirectory { .. }
                | M::FilesystemRoot { .. }
                | M::AlreadyEncrypted { .. }
                | M::EncryptedInside { .. },
            )
            | C::Path { .. }
            | C::WipeOnDecrypt { .. } => Kind::InvalidArgs,
            C::Ui(UiError::Empty) => Kind::InvalidArgs,
            C::NotScheduled { .. } => Kind::NotFound,
            _ => Kind::Failed,
        };
        Error::new(kind, message(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every remedy comes out in the service's terms: no CLI command line or flag.
    #[test]
    fn every_remedy_names_no_cli_command() {
        for r in Remedy::examples() {
            let text = next(&r);
            assert!(!text.is_empty() && !text.contains("dirseal ") && !text.contains("--"), "{r:?}: {text}");
        }
    }

    /// The three a D-Bus caller got no advice for before (the CLI had it).
    #[test]
    fn ambiguous_owner_active_and_bad_token_carry_advice() {
        let e = Error::from(OpsError::AmbiguousProtector { what: "/home/a".into(), list: "1 (x), 2 (y)".into() });
        assert!(e.message.ends_with("; name one of them in the protector argument"), "{e}");
        use dirseal::convert::ConvertError as C;
        let e = Error::from(C::OwnerActive {
            path: "/home/a".into(),
            uid: 1000,
            user: "a".into(),
            pids: "pid 7 (sh)".into(),
        });
        assert_eq!(e.kind, Kind::Busy);
        assert!(e.message.ends_with("root can call Convert with the force option"), "{e}");
        let e = Error::from(C::BadToken { path: "/home/a".into(), token: "x".into() });
        assert!(e.message.contains("root aborts it"), "{e}");
    }
}
