//! Protector kinds: what unwraps a protector key. Each kind lives in its own module and
//! implements the crate's `Kind` trait (the record's part: what unlocking asks, the
//! key-encryption key, a new secret, its part of the associated data) and `NewKindOf` (its
//! options, read from (key, value) pairs, and how one is made). Everything common — the record, its file, the
//! wrapping of the protector key, names, the login order, the dispatch — is here, written once;
//! `kinds!` generates [`ProtectorKind`], [`NewKind`], [`KIND_NAMES`] and every `match` from
//! one registration line per kind.
//!
//! Adding a kind touches its own module, its line in the `kinds!` call below and
//! docs/formats.md; docs/architecture.md walks through it (and `dummy`, a test-only kind,
//! follows it).
//!
//! Recovery keys are not a kind: they live with the directory (an xattr, see [`crate::recovery`]),
//! open exactly one directory, survive the loss of the keystore, and are never offered at login.
#[cfg(test)]
mod dummy;
pub mod fido2;
pub mod password;
pub mod tang;
pub mod tpm2;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::format::{check_header, FORMAT_VERSION};
use crate::ids::ProtectorId;
use crate::kdf::KdfError;
use crate::presence::Presence;
use crate::remedy::HasRemedy;
use crate::secret::{Passphrase, ProtectorKey, PROTECTOR_KEY_LEN};
use crate::ui::{SecretPrompt, Ui, UiError};
use crate::wrap::{self, Kek, Wrapped};

const PROTECTOR_FORMAT: &str = "dirseal-protector";
const MAX_NAME_CHARS: usize = 128;

/// One kind as stored in a record: the kind's module implements it on its serde struct.
pub(crate) trait Kind: Sized {
    /// Whether the protector opens on any machine (a password, a security key that travels with
    /// its owner), so its record may be kept on a portable directory's medium; a kind bound to one
    /// machine (a TPM) says `false`.
    const TRAVELS: bool = true;
    /// Whether a protector of this kind, belonging to a user, is among the ones their login
    /// tries; a machine's key (a tang server's) says `false`: it opens directories, never a login.
    const OPENS_LOGIN: bool = true;
    /// What unlocking asks for.
    fn ask(&self) -> Ask;
    /// Whether a protector of this kind may log its user in on its own, with nothing but what
    /// it asks (docs/pam.md's stand-alone pass): declared by the kind, never guessed from its
    /// prompt, so a new kind that asks for a PIN or a touch opens no login until it says so.
    fn standalone_login(&self) -> Option<Standalone> {
        None
    }
    /// The kind's part of the record's associated data: every field, so none can be edited.
    fn aad(&self) -> String;
    /// The key-encryption key, from the answer to [`Kind::ask`]. A wrong secret that the kind
    /// itself notices is [`ProtectorError::WrongSecret`]; one it cannot notice makes a wrong key,
    /// which the unwrapping reports as [`ProtectorError::IncorrectSecret`].
    /// `presence`: where the person is; a kind whose device counts wrong secrets for the whole
    /// machine (a TPM) spends the tries kept for the device only [`Presence::AtDevice`].
    fn kek(&self, config: &Config, secret: Option<&Passphrase>, presence: Presence) -> Result<Kek, ProtectorError>;
    /// The same kind under a new secret; `None` for kinds (or records) without one.
    fn rekey(&self, _config: &Config, _secret: Option<&Passphrase>) -> Option<Result<(Self, Kek), ProtectorError>> {
        None
    }
    /// Checks, asking nothing and waiting for nothing, that the device this protector needs is
    /// there, so a login moves on at once when it is not ([`ProtectorError::Unavailable`]).
    fn locate(&self, _config: &Config) -> Result<(), ProtectorError> {
        Ok(())
    }
    /// The device a typed secret goes to, asked just before the secret is: its name for the
    /// prompt and its wrong tries left. It refuses (a TPM in lockout) before anything is asked.
    /// `presence`: where the person is. `None`: no device counts wrong secrets.
    fn prompt_device(&self, _config: &Config, _presence: Presence) -> Result<Option<PromptDevice>, ProtectorError> {
        Ok(None)
    }
    /// How many wrong secrets the device behind this protector still takes; `None`: no device
    /// counts them.
    fn device_tries(&self, _config: &Config) -> Option<Result<u32, ProtectorError>> {
        None
    }
}

/// How a new protector of one kind is made: the kind's module implements it on its options.
pub(crate) trait NewKindOf: Sized {
    /// The stored kind this makes.
    type Made: Kind;
    /// The kind's options from `opts`; what it does not take is refused by the caller.
    fn from_options(opts: &mut KindOptions) -> Result<Self, ProtectorError>;
    /// What creating one asks for (a new password or PIN is asked twice; a key's PIN once).
    fn ask(&self) -> Ask;
    /// Settles through the Ui what a person must confirm before one is made (a tang server's
    /// signing key), before any secret is asked: `Some(settled)` is made instead of `self`.
    fn confirm(&self, _config: &Config, _ui: &mut dyn Ui) -> Result<Option<Self>, UnlockError> {
        Ok(None)
    }
    /// Refuses, before any secret is asked, a protector that could not be made safely now.
    fn check_ready(&self, _config: &Config) -> Result<(), ProtectorError> {
        Ok(())
    }
    /// Whether the new secret must not be the owner's login password (whose hash in
    /// /etc/shadow would let anyone with the disk guess it offline, uncounted).
    fn refuses_login_password(&self) -> bool {
        false
    }
    /// Makes one; may record machine-wide settings in `config` (the calibrated Argon2id cost).
    fn create(&self, config: &mut Config, secret: Option<&Passphrase>) -> Result<(Self::Made, Kek), ProtectorError>;
}

/// The device a secret is typed for (see [`Kind::prompt_device`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PromptDevice {
    pub(crate) name: &'static str,
    pub(crate) tries_left: Option<u32>,
}

/// Generates, from one line per kind, the stored and new-kind enums, the kinds' names and the
/// dispatch to [`Kind`] and [`NewKindOf`]: the compiler checks every arm, none is written by hand.
macro_rules! kinds {
    ($( $(#[doc = $doc:expr])* $(#[cfg($cfg:meta)])? $name:literal => $Variant:ident($Stored:ty, $New:ty), )*) => {
        /// Every kind's parameters as stored in its record. The serde tag is the kind's name on disk.
        #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        pub enum ProtectorKind {
            $( $(#[doc = $doc])* $(#[cfg($cfg)])? #[serde(rename = $name)] $Variant($Stored), )*
        }

        /// What a new protector of each kind is made from (front ends give the kind's options).
        #[derive(Clone, Debug)]
        pub enum NewKind {
            $( $(#[doc = $doc])* $(#[cfg($cfg)])? $Variant($New), )*
        }

        /// Names of the kinds a front end can create, for `--protector-type` and service arguments.
        pub const KIND_NAMES: &[&str] = &[$( $(#[cfg($cfg)])? $name, )*];

        impl ProtectorKind {
            /// The kind's name, as on disk and in listings.
            pub fn name(&self) -> &'static str {
                match self { $( $(#[cfg($cfg)])? ProtectorKind::$Variant(_) => $name, )* }
            }

            fn kind(&self) -> &dyn KindDyn {
                match self { $( $(#[cfg($cfg)])? ProtectorKind::$Variant(k) => k, )* }
            }

            /// The same kind under a new secret; `None` for kinds without one.
            fn rekey(
                &self,
                config: &Config,
                secret: Option<&Passphrase>,
            ) -> Option<Result<(ProtectorKind, Kek), ProtectorError>> {
                match self {
                    $( $(#[cfg($cfg)])? ProtectorKind::$Variant(k) => {
                        Kind::rekey(k, config, secret).map(|r| r.map(|(k, kek)| (ProtectorKind::$Variant(k), kek)))
                    } )*
                }
            }
        }

        impl NewKind {
            /// The kind named `name` (one of [`KIND_NAMES`]) with its options from `opts`; an
            /// option the kind does not take is refused, so none is silently dropped.
            pub fn named(name: &str, mut opts: KindOptions) -> Result<NewKind, ProtectorError> {
                let new = match name {
                    $( $(#[cfg($cfg)])? $name => {
                        opts.kind = $name;
                        NewKind::$Variant(<$New as NewKindOf>::from_options(&mut opts)?)
                    } )*
                    _ => return Err(ProtectorError::UnknownKind { name: name.to_string() }),
                };
                opts.refuse_rest()?;
                Ok(new)
            }

            /// The kind's name, as [`KIND_NAMES`] lists it.
            pub fn name(&self) -> &'static str {
                match self { $( $(#[cfg($cfg)])? NewKind::$Variant(_) => $name, )* }
            }

            fn new_kind(&self) -> &dyn NewKindDyn {
                match self { $( $(#[cfg($cfg)])? NewKind::$Variant(n) => n, )* }
            }

            /// What [`NewKindOf::confirm`] settles: `Some` kind to make instead.
            pub(crate) fn confirm(&self, config: &Config, ui: &mut dyn Ui) -> Result<Option<NewKind>, UnlockError> {
                match self {
                    $( $(#[cfg($cfg)])? NewKind::$Variant(n) => {
                        Ok(n.confirm(config, ui)?.map(NewKind::$Variant))
                    } )*
                }
            }

            fn create(
                &self,
                config: &mut Config,
                secret: Option<&Passphrase>,
            ) -> Result<(ProtectorKind, Kek), ProtectorError> {
                match self {
                    $( $(#[cfg($cfg)])? NewKind::$Variant(n) => {
                        n.create(config, secret).map(|(k, kek)| (ProtectorKind::$Variant(k), kek))
                    } )*
                }
            }
        }
    };
}

// The registered kinds: `"name" => Variant(stored type, creation type)`. The name is the
// record's on-disk `type`, the `--protector-type`/`kind` a front end passes, and what listings show.
kinds! {
    /// Argon2id(password, salt) wraps the protector key.
    "password" => Password(password::Password, password::NewPassword),
    /// A key sealed by the TPM (behind a PIN and/or PCR values) wraps the protector key.
    "tpm2" => Tpm2(tpm2::Tpm2, tpm2::NewTpm2),
    /// A security key's hmac-secret (through HKDF) wraps the protector key.
    "fido2" => Fido2(fido2::Fido2, fido2::NewFido2),
    /// A tang server's McCallum–Relyea exchange (a clevis JWE) wraps the protector key.
    "tang" => Tang(tang::Tang, tang::NewTang),
    /// A test-only kind that follows docs/architecture.md, proving it.
    #[cfg(test)]
    "dummy" => Dummy(dummy::Dummy, dummy::NewDummy),
}

/// The name of the kind made when no one names one ([`NewKind::login_default`]): front ends'
/// default for a kind option (`--protector-type`, the service's `kind`).
pub const DEFAULT_KIND: &str = "password";

impl NewKind {
    /// The kind made when no one names one ([`DEFAULT_KIND`]): a password protector with default
    /// options, the kind a login password opens (PAM's enrolment, `home create`, the service's
    /// new protectors).
    pub fn login_default() -> NewKind {
        NewKind::Password(Default::default())
    }
}

/// The object-safe part of [`Kind`], for dispatch without a `match` per method.
trait KindDyn {
    fn travels(&self) -> bool;
    fn opens_login(&self) -> bool;
    fn ask(&self) -> Ask;
    fn standalone_login(&self) -> Option<Standalone>;
    fn aad(&self) -> String;
    fn kek(&self, config: &Config, secret: Option<&Passphrase>, presence: Presence) -> Result<Kek, ProtectorError>;
    fn locate(&self, config: &Config) -> Result<(), ProtectorError>;
    fn prompt_device(&self, config: &Config, presence: Presence) -> Result<Option<PromptDevice>, ProtectorError>;
    fn device_tries(&self, config: &Config) -> Option<Result<u32, ProtectorError>>;
}

impl<K: Kind> KindDyn for K {
    fn travels(&self) -> bool {
        K::TRAVELS
    }
    fn opens_login(&self) -> bool {
        K::OPENS_LOGIN
    }
    fn ask(&self) -> Ask {
        Kind::ask(self)
    }
    fn standalone_login(&self) -> Option<Standalone> {
        Kind::standalone_login(self)
    }
    fn aad(&self) -> String {
        Kind::aad(self)
    }
    fn kek(&self, config: &Config, secret: Option<&Passphrase>, presence: Presence) -> Result<Kek, ProtectorError> {
        Kind::kek(self, config, secret, presence)
    }
    fn locate(&self, config: &Config) -> Result<(), ProtectorError> {
        Kind::locate(self, config)
    }
    fn prompt_device(&self, config: &Config, presence: Presence) -> Result<Option<PromptDevice>, ProtectorError> {
        Kind::prompt_device(self, config, presence)
    }
    fn device_tries(&self, config: &Config) -> Option<Result<u32, ProtectorError>> {
        Kind::device_tries(self, config)
    }
}

/// The object-safe part of [`NewKindOf`].
trait NewKindDyn {
    fn travels(&self) -> bool;
    fn ask(&self) -> Ask;
    fn check_ready(&self, config: &Config) -> Result<(), ProtectorError>;
    fn refuses_login_password(&self) -> bool;
}

impl<N: NewKindOf> NewKindDyn for N {
    fn travels(&self) -> bool {
        <N::Made as Kind>::TRAVELS
    }
    fn ask(&self) -> Ask {
        NewKindOf::ask(self)
    }
    fn check_ready(&self, config: &Config) -> Result<(), ProtectorError> {
        NewKindOf::check_ready(self, config)
    }
    fn refuses_login_password(&self) -> bool {
        NewKindOf::refuses_login_password(self)
    }
}

/// How a protector may log its user in on its own, no login password checked (docs/pam.md's
/// stand-alone pass), as its kind declares ([`ProtectorKind::standalone_login`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standalone {
    /// With a PIN whose wrong tries its device counts (a TPM PIN): PIN login.
    Pin,
    /// With a touch of a device the user holds, nothing typed (a security key without PIN).
    Touch,
}

/// A secret the person types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secret {
    /// A password: a wrong one costs nothing but time (no device counts it), so it may be tried
    /// against several protectors.
    Password,
    /// A PIN a device counts the wrong tries of (a TPM's lockout); what a PIN login opens.
    Pin,
    /// The PIN a security key already has (asked once, also when creating a protector on it).
    KeyPin,
}

/// What unlocking (or creating) a protector asks of the person: a typed secret, a touch of a
/// device, both, or nothing at all (a TPM without PIN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The secret typed, if any.
    pub secret: Option<Secret>,
    /// Whether the person must touch a device.
    pub touch: bool,
}

impl Ask {
    /// A password and nothing else: trying it on a protector costs nothing but time.
    pub const PASSWORD: Ask = Ask { secret: Some(Secret::Password), touch: false };
    /// A PIN and nothing else (the device counts wrong ones): what a PIN login opens.
    pub const PIN: Ask = Ask { secret: Some(Secret::Pin), touch: false };
    /// A touch and nothing typed (a security key without PIN): what a key login opens.
    pub const TOUCH: Ask = Ask { secret: None, touch: true };

    /// The login order's rank: nothing is typed before every protector that needs no typing
    /// was tried — a FIDO2 touch first, then a TPM without PIN, then passwords, then PINs.
    fn login_rank(self) -> u8 {
        match (self.secret, self.touch) {
            (None, true) => 0,
            (None, false) => 1,
            (Some(Secret::Password), _) => 2,
            // A wrong PIN costs one of the device's few tries: the typed secret goes to PINs only
            // when no password protector took it.
            (Some(Secret::Pin | Secret::KeyPin), _) => 3,
        }
    }

    fn word(self) -> &'static str {
        match self.secret {
            Some(Secret::Password) => "password",
            Some(Secret::Pin | Secret::KeyPin) => "PIN",
            None => "device",
        }
    }
}

/// Why a protector could not be made, opened or changed. The kinds' own errors (a TPM's, a
/// security key's) come wrapped in [`KindError`], sorted by what a front end does about them:
/// [`ProtectorError::Unavailable`] (move on), [`ProtectorError::WrongSecret`] (a counted wrong
/// try), [`ProtectorError::NotNow`] (use another protector) or [`ProtectorError::Kind`].
#[derive(Debug, thiserror::Error)]
pub enum ProtectorError {
    /// The secret did not unwrap the protector key; nothing was changed, so it can be tried again.
    #[error("incorrect {what} for protector {name} ({id}); nothing was changed")]
    IncorrectSecret {
        /// The protector's name.
        name: String,
        /// Its id.
        id: ProtectorId,
        /// What was wrong: "password", "PIN" or "device".
        what: &'static str,
    },
    /// A protector name is empty, too long or holds control characters.
    #[error("invalid protector name {name:?}: {reason}")]
    BadName {
        /// The name given (cut to the longest allowed).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A new secret was asked for a protector whose kind has none.
    #[error("protector {name} ({id}) is a {kind} protector: it has no secret to change")]
    NoSecret {
        /// The protector's name.
        name: String,
        /// Its id.
        id: ProtectorId,
        /// Its kind's name.
        kind: &'static str,
    },
    /// A kind name none of [`KIND_NAMES`] has.
    #[error("unknown protector kind {name:?}; known kinds: {}", KIND_NAMES.join(", "))]
    UnknownKind {
        /// The name given.
        name: String,
    },
    /// A front end called a kind without the answer its [`Ask`] named: a bug, not a user error.
    #[error("internal error: no {what} was supplied to the protector")]
    NoAnswer {
        /// What was missing.
        what: &'static str,
    },
    /// An option (by its key; front ends render their own spelling) the kind does not take.
    #[error("option {option} does not apply to {kind} protectors")]
    BadOption {
        /// The option's key.
        option: String,
        /// The kind's name.
        kind: &'static str,
    },
    /// An option the kind takes, with a value it cannot use.
    #[error("option {option} of {kind} protectors: {reason}")]
    BadOptionValue {
        /// The option's key.
        option: String,
        /// The kind's name.
        kind: &'static str,
        /// What a valid value is.
        reason: String,
    },
    /// An option that only an administrator may set was given by someone else.
    #[error("option {option} of {kind} protectors may be set only by an administrator")]
    Privileged {
        /// The option's key.
        option: String,
        /// The kind's name.
        kind: &'static str,
    },
    /// The Argon2id cost asked for or found is out of bounds, or the derivation failed.
    #[error(transparent)]
    Kdf(#[from] KdfError),
    /// The kind cannot work here now: no TPM, no security key holding the credential connected,
    /// a library missing. A login moves on to the next protector without reporting it.
    #[error(transparent)]
    Unavailable(KindError),
    /// The kind's device counted a wrong secret (a TPM PIN).
    #[error(transparent)]
    WrongSecret(KindError),
    /// The protector cannot open now, or not in this state, though its secret may be right (a
    /// TPM in lockout, PCR values changed): another protector or the recovery key can.
    #[error(transparent)]
    NotNow(KindError),
    /// Anything else the kind's device or library reports.
    #[error(transparent)]
    Kind(KindError),
}

impl ProtectorError {
    /// Whether the secret given was wrong (and so counted, when a device counts them).
    pub fn is_wrong_secret(&self) -> bool {
        matches!(self, ProtectorError::IncorrectSecret { .. } | ProtectorError::WrongSecret(_))
    }

    /// The kind's own error, if this is one: for front ends with advice on a device's errors.
    pub fn kind_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            ProtectorError::Unavailable(k)
            | ProtectorError::WrongSecret(k)
            | ProtectorError::NotNow(k)
            | ProtectorError::Kind(k) => Some(&*k.0),
            _ => None,
        }
    }
}

/// A kind's own error, shown as itself.
#[derive(Debug)]
pub struct KindError(Box<dyn HasRemedy + Send + Sync + 'static>);

impl KindError {
    /// Wraps a kind's (or its device's) own error, which says its own remedy (crate::advice).
    pub(crate) fn new(e: impl HasRemedy + Send + Sync + 'static) -> KindError {
        KindError(Box::new(e))
    }

    /// The wrapped error itself, for its remedy.
    pub(crate) fn inner(&self) -> &(dyn HasRemedy + 'static) {
        &*self.0
    }
}

impl fmt::Display for KindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for KindError {
    // Shown as the wrapped error, so its cause is the wrapped error's.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// A kind's options, as (key, value) pairs: front ends turn their flags or arguments into
/// these without knowing which kind takes which. The kind takes its own; the rest is refused.
#[derive(Clone, Debug)]
pub struct KindOptions {
    kind: &'static str,
    pairs: Vec<(String, String)>,
    trusted: bool,
}

/// No options, from someone who may set every option.
impl Default for KindOptions {
    fn default() -> KindOptions {
        KindOptions::new(Vec::new())
    }
}

impl KindOptions {
    /// Options from someone who may set every option (the CLI runs as root).
    pub fn new(pairs: Vec<(String, String)>) -> KindOptions {
        KindOptions { kind: "", pairs, trusted: true }
    }

    /// Options from a caller who is not an administrator: options that cost the machine (an
    /// Argon2id cost) or weaken a protector below the default are refused.
    pub fn untrusted(pairs: Vec<(String, String)>) -> KindOptions {
        KindOptions { trusted: false, ..KindOptions::new(pairs) }
    }

    /// Takes option `key`'s value (the last one given).
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let mut value = None;
        self.pairs.retain(|(k, v)| {
            if k == key {
                value = Some(v.clone());
            }
            k != key
        });
        value
    }

    /// Takes option `key` and parses it.
    pub(crate) fn parse<T: FromStr>(&mut self, key: &str) -> Result<Option<T>, ProtectorError>
    where
        T::Err: fmt::Display,
    {
        let Some(v) = self.take(key) else { return Ok(None) };
        v.parse().map(Some).map_err(|e: T::Err| self.bad_value(key, e.to_string()))
    }

    /// Takes yes/no option `key` (absent: no).
    pub(crate) fn flag(&mut self, key: &str) -> Result<bool, ProtectorError> {
        match self.take(key).as_deref() {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(_) => Err(self.bad_value(key, "it is true or false".into())),
        }
    }

    /// Like [`KindOptions::parse`], for an option only an administrator may set.
    pub(crate) fn parse_privileged<T: FromStr>(&mut self, key: &str) -> Result<Option<T>, ProtectorError>
    where
        T::Err: fmt::Display,
    {
        let v = self.parse(key)?;
        self.privileged(key, v.is_some())?;
        Ok(v)
    }

    /// Like [`KindOptions::flag`], for an option only an administrator may set.
    pub(crate) fn flag_privileged(&mut self, key: &str) -> Result<bool, ProtectorError> {
        let v = self.flag(key)?;
        self.privileged(key, v)?;
        Ok(v)
    }

    fn privileged(&self, key: &str, given: bool) -> Result<(), ProtectorError> {
        if given && !self.trusted {
            return Err(ProtectorError::Privileged { option: key.into(), kind: self.kind });
        }
        Ok(())
    }

    fn bad_value(&self, key: &str, reason: String) -> ProtectorError {
        ProtectorError::BadOptionValue { option: key.into(), kind: self.kind, reason }
    }

    fn refuse_rest(&self) -> Result<(), ProtectorError> {
        match self.pairs.first() {
            Some((k, _)) => Err(ProtectorError::BadOption { option: k.clone(), kind: self.kind }),
            None => Ok(()),
        }
    }
}

/// A protector as kept in the keystore: a protector key wrapped by whatever its kind derives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtectorRecord {
    /// Its id, which names its file and its entries in policies.
    pub id: ProtectorId,
    /// Its name, shown in listings and prompts.
    pub name: String,
    /// Its kind, with that kind's parameters.
    pub kind: ProtectorKind,
    /// The user this protector belongs to (its login password), if any.
    pub uid: Option<u32>,
    pub(crate) wrapped_key: Wrapped,
}

impl ProtectorKind {
    /// Whether it opens on any machine, so a portable directory's medium may keep its record
    /// (docs/formats.md: portable directories).
    pub fn travels(&self) -> bool {
        self.kind().travels()
    }

    /// What unlocking asks for.
    pub fn ask(&self) -> Ask {
        self.kind().ask()
    }

    /// Whether its owner's login may try it (a machine's key, a tang server's, never is).
    pub fn opens_login(&self) -> bool {
        self.kind().opens_login()
    }

    /// How the protector may log its user in on its own, if its kind declares it may
    /// ([`Standalone`]); `None`: only together with the login password's check.
    pub fn standalone_login(&self) -> Option<Standalone> {
        self.kind().standalone_login()
    }

    /// How many wrong secrets the device behind this protector still takes (`None`: no such
    /// limit, or the device cannot be asked now).
    pub fn tries_left(&self, config: &Config) -> Option<u32> {
        self.device_tries(config).and_then(Result::ok)
    }

    /// Like [`ProtectorKind::tries_left`], saying why the device could not be asked; `None`: no
    /// device counts this protector's wrong secrets.
    pub fn device_tries(&self, config: &Config) -> Option<Result<u32, ProtectorError>> {
        self.kind().device_tries(config)
    }

    /// The prompt for this kind's secret. A device that cannot take a try now (a TPM in lockout, or
    /// missing) is reported before anything is asked.
    fn prompt<'a>(
        &self,
        rec: &'a ProtectorRecord,
        config: &Config,
        s: Secret,
        presence: Presence,
    ) -> Result<SecretPrompt<'a>, ProtectorError> {
        let (name, id) = (rec.name.as_str(), &rec.id);
        Ok(match (self.kind().prompt_device(config, presence)?, s) {
            (Some(d), _) => SecretPrompt::Pin { name, id, device: d.name, tries_left: d.tries_left },
            (None, Secret::Password) => SecretPrompt::Password { name, id },
            (None, Secret::Pin | Secret::KeyPin) => SecretPrompt::Pin { name, id, device: "", tries_left: None },
        })
    }

    fn aad_tail(&self) -> String {
        self.kind().aad()
    }

    fn locate(&self, config: &Config) -> Result<(), ProtectorError> {
        self.kind().locate(config)
    }

    fn kek(&self, config: &Config, secret: Option<&Passphrase>, presence: Presence) -> Result<Kek, ProtectorError> {
        self.kind().kek(config, secret, presence)
    }
}

impl NewKind {
    /// Refuses, before any secret is asked, a protector that could not be made safely now (a TPM
    /// PIN on a TPM whose lockout anyone can reset). [`create`] checks again.
    pub(crate) fn check_ready(&self, config: &Config) -> Result<(), ProtectorError> {
        self.new_kind().check_ready(config)
    }

    /// Whether the protector made opens on any machine (see [`ProtectorKind::travels`]).
    pub fn travels(&self) -> bool {
        self.new_kind().travels()
    }

    /// What creating one asks for (a new password or PIN is asked twice; a key's PIN once).
    pub fn ask(&self) -> Ask {
        self.new_kind().ask()
    }

    /// Whether the new secret must not be the owner's login password.
    pub(crate) fn refuses_login_password(&self) -> bool {
        self.new_kind().refuses_login_password()
    }
}

/// Binds the wrapped protector key to its record: id, format version and every parameter of
/// the kind, so no field can be changed or the key moved to another record.
fn aad(id: &ProtectorId, kind: &ProtectorKind) -> Vec<u8> {
    format!("dirseal:{FORMAT_VERSION}:protector:{id}:{}", kind.aad_tail()).into_bytes()
}

pub(crate) fn check_name(name: &str) -> Result<(), ProtectorError> {
    let bad = |reason| Err(ProtectorError::BadName { name: name.chars().take(MAX_NAME_CHARS).collect(), reason });
    if name.trim().is_empty() {
        return bad("it is empty");
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return bad("it is longer than 128 characters");
    }
    if name.chars().any(char::is_control) {
        return bad("it contains control characters");
    }
    Ok(())
}

/// A new protector with a fresh random key and id. `secret` answers `new.ask()`.
pub fn create(
    name: &str,
    uid: Option<u32>,
    new: &NewKind,
    config: &mut Config,
    secret: Option<&Passphrase>,
) -> Result<(ProtectorRecord, ProtectorKey), ProtectorError> {
    check_name(name)?;
    let id = ProtectorId::random();
    let key = ProtectorKey::random();
    let (kind, kek) = new.create(config, secret)?;
    let wrapped_key = wrap::seal(&kek, &aad(&id, &kind), key.as_bytes());
    Ok((ProtectorRecord { id, name: name.to_string(), kind, uid, wrapped_key }, key))
}

/// Unwraps a protector's key with the answer to `rec.kind.ask()`, given by someone at
/// `presence`. A wrong answer changes nothing (but a TPM counts it).
pub fn unlock(
    rec: &ProtectorRecord,
    config: &Config,
    secret: Option<&Passphrase>,
    presence: Presence,
) -> Result<ProtectorKey, ProtectorError> {
    let kek = rec.kind.kek(config, secret, presence)?;
    match wrap::open(&kek, &aad(&rec.id, &rec.kind), &rec.wrapped_key, PROTECTOR_KEY_LEN) {
        // Invariant: `open` checked the plaintext is PROTECTOR_KEY_LEN bytes.
        Ok(bytes) => Ok(ProtectorKey::from_slice(&bytes).expect("length checked by wrap::open")),
        Err(_) => {
            Err(ProtectorError::IncorrectSecret { name: rec.name.clone(), id: rec.id, what: rec.kind.ask().word() })
        }
    }
}

/// The same protector (same id and key, so every policy it protects keeps working) under a new
/// secret.
pub fn change_secret(
    rec: &ProtectorRecord,
    key: &ProtectorKey,
    config: &Config,
    new_secret: Option<&Passphrase>,
) -> Result<ProtectorRecord, ProtectorError> {
    let no_secret = || ProtectorError::NoSecret { name: rec.name.clone(), id: rec.id, kind: rec.kind.name() };
    let (kind, kek) = rec.kind.rekey(config, new_secret).ok_or_else(no_secret)??;
    let wrapped_key = wrap::seal(&kek, &aad(&rec.id, &kind), key.as_bytes());
    Ok(ProtectorRecord { kind, wrapped_key, ..rec.clone() })
}

/// Asks `ui` what unlocking `rec` needs, then unlocks it. A touch is announced just before the
/// kind waits for it.
pub fn unlock_with(rec: &ProtectorRecord, config: &Config, ui: &mut dyn Ui) -> Result<ProtectorKey, UnlockError> {
    let ask = rec.kind.ask();
    let presence = ui.presence();
    rec.kind.locate(config)?;
    let secret = match ask.secret {
        Some(s) => Some(ui.secret(&rec.kind.prompt(rec, config, s, presence)?)?),
        None => None,
    };
    if ask.touch {
        ui.touch(&rec.name, Some(&rec.id));
    }
    Ok(unlock(rec, config, secret.as_ref(), presence)?)
}

/// Asks `ui` for the new secret `ask` names (none for kinds without one) for a protector named
/// `name` of user `uid`. Empty secrets are refused.
pub fn ask_new(ask: Ask, name: &str, uid: Option<u32>, ui: &mut dyn Ui) -> Result<Option<Passphrase>, UiError> {
    let secret = match ask.secret {
        Some(Secret::Password) => ui.secret(&SecretPrompt::NewPassword { name, uid })?,
        Some(Secret::Pin) => ui.secret(&SecretPrompt::NewPin { name })?,
        Some(Secret::KeyPin) => ui.secret(&SecretPrompt::KeyPin { name })?,
        None => return Ok(None),
    };
    if secret.is_empty() {
        return Err(UiError::Empty);
    }
    Ok(Some(secret))
}

/// Why a protector did not open through a Ui.
#[derive(Debug, thiserror::Error)]
pub enum UnlockError {
    /// The Ui could not ask, or the person cancelled.
    #[error(transparent)]
    Ui(#[from] UiError),
    /// The protector refused the answer or could not be opened.
    #[error(transparent)]
    Protector(#[from] ProtectorError),
}

/// The one login order, used by the PAM module and the service: kinds that need no typing first
/// ([`Ask`]'s rank), then the user's own protectors before others, then by name.
pub(crate) fn login_order(list: &mut [ProtectorRecord], uid: u32) {
    list.sort_by(|a, b| {
        let key = |r: &ProtectorRecord| (r.kind.ask().login_rank(), r.uid != Some(uid));
        key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
    });
}

// ---- The record's file (docs/formats.md). Parsed strictly into the record above. ----

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProtectorFile {
    format: String,
    version: u32,
    id: ProtectorId,
    name: String,
    #[serde(default)]
    uid: Option<u32>,
    kind: ProtectorKind,
    wrapped_key: Wrapped,
}

/// Parses a protector file named for `file_id`; the reason says what is wrong.
pub(crate) fn parse(bytes: &[u8], file_id: &ProtectorId) -> Result<ProtectorRecord, String> {
    let f: ProtectorFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    check_header(&f.format, f.version, PROTECTOR_FORMAT)?;
    if f.id != *file_id {
        return Err(format!("it holds protector {} but is named for {file_id}", f.id));
    }
    check_name(&f.name).map_err(|e| e.to_string())?;
    if f.wrapped_key.ciphertext.len() != PROTECTOR_KEY_LEN + wrap::TAG_LEN {
        return Err("the wrapped key has the wrong length".into());
    }
    Ok(ProtectorRecord { id: f.id, name: f.name, kind: f.kind, uid: f.uid, wrapped_key: f.wrapped_key })
}

pub(crate) fn to_json(r: &ProtectorRecord) -> Vec<u8> {
    let f = ProtectorFile {
        format: PROTECTOR_FORMAT.into(),
        version: FORMAT_VERSION,
        id: r.id,
        name: r.name.clone(),
        uid: r.uid,
        kind: r.kind.clone(),
        wrapped_key: r.wrapped_key.clone(),
    };
    // Invariant: these structs hold only strings, integers and maps with string keys.
    serde_json::to_vec_pretty(&f).expect("serialising a protector cannot fail")
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn the_default_kind_is_the_one_named_default() {
        assert_eq!(NewKind::login_default().name(), DEFAULT_KIND);
        assert!(KIND_NAMES.contains(&DEFAULT_KIND));
    }

    use super::*;
    use crate::kdf::{self, Argon2Params};

    const FAST: Argon2Params = Argon2Params { time_cost: 1, memory_kib: kdf::MIN_MEMORY_KIB, parallelism: 1 };

    fn pw(s: &str) -> Passphrase {
        Passphrase::from_str_copy(s)
    }

    fn fast_config() -> Config {
        Config { argon2: Some(FAST), ..Config::default() }
    }

    pub(crate) fn new_password(name: &str, uid: Option<u32>, secret: &str) -> (ProtectorRecord, ProtectorKey) {
        let new = NewKind::Password(password::NewPassword::default());
        create(name, uid, &new, &mut fast_config(), Some(&pw(secret))).unwrap()
    }

    #[test]
    fn unlock_and_wrong_secret() {
        let (a, ka) = new_password("alice", None, "a");
        assert!(unlock(&a, &fast_config(), Some(&pw("a")), Presence::AtDevice).unwrap() == ka);
        let Err(e) = unlock(&a, &fast_config(), Some(&pw("wrong")), Presence::AtDevice) else {
            panic!("a wrong password unlocked")
        };
        assert_eq!(e.to_string(), format!("incorrect password for protector alice ({}); nothing was changed", a.id));
        assert!(matches!(unlock(&a, &fast_config(), None, Presence::AtDevice), Err(ProtectorError::NoAnswer { .. })));
    }

    #[test]
    fn change_secret_keeps_the_key_and_the_cost() {
        let (a, ka) = new_password("a", None, "old");
        // The machine's cost changed since; a new password keeps the protector's own.
        let later = Config { argon2: Some(Argon2Params { time_cost: 2, ..FAST }), ..Config::default() };
        let a2 = change_secret(&a, &ka, &later, Some(&pw("new"))).unwrap();
        assert_eq!(a2.id, a.id);
        let (ProtectorKind::Password(p1), ProtectorKind::Password(p2)) = (&a.kind, &a2.kind) else {
            panic!("password protectors stay password protectors")
        };
        assert_eq!(p1.kdf, p2.kdf);
        assert_ne!(p1.salt, p2.salt);
        assert!(unlock(&a2, &later, Some(&pw("old")), Presence::AtDevice).is_err());
        assert!(unlock(&a2, &later, Some(&pw("new")), Presence::AtDevice).unwrap() == ka);
    }

    #[test]
    fn tampering_is_detected() {
        let (a, _) = new_password("a", None, "p");
        // Raising the cost in the file (or lowering it) breaks the binding, not just the speed.
        let mut t = a.clone();
        t.kind =
            ProtectorKind::Password(password::Password { salt: [0; 16], kdf: Argon2Params { time_cost: 2, ..FAST } });
        assert!(unlock(&t, &fast_config(), Some(&pw("p")), Presence::AtDevice).is_err());
        // The wrapped key of one record does not open as another's.
        let (mut b, _) = new_password("b", None, "p");
        b.kind = a.kind.clone();
        b.wrapped_key = a.wrapped_key.clone();
        assert!(unlock(&b, &fast_config(), Some(&pw("p")), Presence::AtDevice).is_err());
    }

    #[test]
    fn names_are_checked() {
        let new = NewKind::Password(password::NewPassword::default());
        for bad in ["", " ", "a\nb", &"x".repeat(129)] {
            assert!(matches!(
                create(bad, None, &new, &mut fast_config(), Some(&pw("p"))),
                Err(ProtectorError::BadName { .. })
            ));
        }
    }

    /// A password record written by the first dirseal still parses and opens: the format is kept.
    #[test]
    fn password_record_format_is_stable() {
        let (a, ka) = new_password("alice", Some(1000), "pw");
        let json: serde_json::Value = serde_json::from_slice(&to_json(&a)).unwrap();
        let ProtectorKind::Password(p) = &a.kind else { panic!("a password protector") };
        assert_eq!(
            json["kind"],
            serde_json::json!({"type": "password", "salt": hex::encode(p.salt),
                "argon2": {"time_cost": 1, "memory_kib": 1024, "parallelism": 1}})
        );
        assert_eq!(json["format"], "dirseal-protector");
        let back = parse(&to_json(&a), &a.id).unwrap();
        assert_eq!(back, a);
        assert!(unlock(&back, &fast_config(), Some(&pw("pw")), Presence::AtDevice).unwrap() == ka);
        // Unknown fields inside the kind and unknown kinds are refused, not ignored.
        let text = String::from_utf8(to_json(&a)).unwrap();
        let extra = text.replace("\"type\": \"password\"", "\"type\": \"password\", \"x\": 1");
        assert!(parse(extra.as_bytes(), &a.id).is_err());
        let other = text.replace("\"type\": \"password\"", "\"type\": \"tpm9\"");
        assert!(parse(other.as_bytes(), &a.id).is_err());
        let weak = text.replace("\"time_cost\": 1", "\"time_cost\": 0");
        assert!(parse(weak.as_bytes(), &a.id).unwrap_err().contains("Argon2id"));
    }

    /// A record built from docs/formats.md by an independent implementation
    /// (tests/data/make_password_golden.py: argon2-cffi and Python's cryptography) opens: what
    /// earlier dirseal versions wrote stays readable.
    #[test]
    fn a_documented_password_record_opens() {
        let id: ProtectorId = "0123456789abcdef".parse().unwrap();
        let rec = parse(include_bytes!("../../../tests/data/password-golden.json"), &id).unwrap();
        assert_eq!((rec.name.as_str(), rec.uid, rec.kind.name()), ("alice", Some(1000), "password"));
        let key = unlock(&rec, &Config::default(), Some(&pw("correct horse")), Presence::AtDevice).unwrap();
        assert_eq!(key.as_bytes().to_vec(), (200..232).collect::<Vec<u8>>());
        assert!(matches!(
            unlock(&rec, &Config::default(), Some(&pw("correct horse!")), Presence::AtDevice),
            Err(ProtectorError::IncorrectSecret { .. })
        ));
    }

    #[test]
    fn login_order_puts_no_typing_first_then_own() {
        let (mut a, _) = new_password("z-own", Some(7), "p");
        let (b, _) = new_password("a-other", Some(8), "p");
        let (c, _) = new_password("m-own", Some(7), "p");
        a.name = "z-own".into();
        let mut list = vec![b.clone(), a.clone(), c.clone()];
        login_order(&mut list, 7);
        let names: Vec<&str> = list.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["m-own", "z-own", "a-other"]);
        assert!(Ask { secret: None, touch: true }.login_rank() < Ask { secret: None, touch: false }.login_rank());
        assert!(Ask { secret: None, touch: false }.login_rank() < password::ASK.login_rank());
        // A PIN costs a device try when wrong: passwords take the typed secret first.
        assert!(Ask { secret: Some(Secret::Pin), touch: true }.login_rank() > password::ASK.login_rank());
    }
}
