//! The service's D-Bus errors: a name a front end can branch on, and a one-line message: the
//! library's, which says what happened, and the service's next step in terms of its methods.
use dirseal::keystore::KeystoreError;
use dirseal::ops::OpsError;
use dirseal::protector::ProtectorError;
use dirseal::recovery::RecoveryError;
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
        Error::new(protector_kind(&e), e.to_string())
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
        RecoveryError::Blob { source: dirseal_recovery::BlobError::WrongKey, .. } => Kind::IncorrectSecret,
        RecoveryError::NotEncrypted { .. } | RecoveryError::Missing { .. } => Kind::NotFound,
        _ => Kind::Failed,
    }
}

/// `e`'s message, then what to call next if there is a method for it.
fn message(e: &dyn std::error::Error, next: Option<&str>) -> String {
    match next {
        Some(n) => format!("{e}; {n}"),
        None => e.to_string(),
    }
}

fn ops_next(e: &OpsError) -> Option<&'static str> {
    match e {
        OpsError::NotEncrypted { .. } => Some("call Encrypt for an empty directory, Convert for one that holds data"),
        OpsError::NotManaged { .. } | OpsError::KeyMismatch { .. } => {
            Some("RecoveryRestore with the directory's recovery key restores its policy")
        }
        OpsError::NotEmpty { .. } => Some("call Convert to encrypt it in place"),
        OpsError::AlreadyEncrypted { .. } => Some("GetStatus shows its state"),
        OpsError::NoProtector { .. } => Some("add one with AddProtectorToPolicy"),
        OpsError::UseAnother { .. } => {
            Some("call Unlock with one of those protectors, or RecoveryRestore with the key")
        }
        OpsError::Keystore(k) => keystore_next(k),
        OpsError::Recovery(r) => recovery_next(r),
        OpsError::Fscrypt(f) => fscrypt_next(f),
        _ => None,
    }
}

fn keystore_next(e: &KeystoreError) -> Option<&'static str> {
    match e {
        KeystoreError::NotFound { .. } => Some("ListProtectors shows what exists"),
        KeystoreError::InUse { .. } => Some("remove it with RemoveProtectorFromPolicy"),
        KeystoreError::LastProtector { .. } => Some("add one with AddProtectorToPolicy"),
        _ => None,
    }
}

fn recovery_next(e: &RecoveryError) -> Option<&'static str> {
    match e {
        RecoveryError::Missing { .. } => Some("while it is unlocked, create one with RecoveryAdd"),
        RecoveryError::Exists { .. } => Some("remove it with RecoveryRemove"),
        RecoveryError::Blob { source, .. } if source.is_damaged() => {
            Some("replace it: RecoveryRemove, then RecoveryAdd")
        }
        RecoveryError::Fscrypt(f) => fscrypt_next(f),
        _ => None,
    }
}

fn fscrypt_next(e: &dirseal::fscrypt::FscryptError) -> Option<&'static str> {
    use dirseal::fscrypt::FscryptError as F;
    match e {
        F::AlreadyEncrypted { .. } => Some("GetStatus shows its state"),
        F::NotEmpty { .. } => Some("call Convert to encrypt it in place"),
        F::Locked { .. } => Some("call Unlock first"),
        _ => None,
    }
}

impl From<OpsError> for Error {
    fn from(e: OpsError) -> Error {
        Error::new(ops_kind(&e), message(&e, ops_next(&e)))
    }
}

impl From<KeystoreError> for Error {
    fn from(e: KeystoreError) -> Error {
        Error::new(keystore_kind(&e), message(&e, keystore_next(&e)))
    }
}

impl From<RecoveryError> for Error {
    fn from(e: RecoveryError) -> Error {
        Error::new(recovery_kind(&e), message(&e, recovery_next(&e)))
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
        use dirseal_migrate::MigrateError as M;
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
            | C::Path { .. } => Kind::InvalidArgs,
            C::Ui(UiError::Empty) => Kind::InvalidArgs,
            _ => Kind::Failed,
        };
        let next = match &e {
            C::Ops(o) => ops_next(o),
            _ => None,
        };
        Error::new(kind, message(&e, next))
    }
}
