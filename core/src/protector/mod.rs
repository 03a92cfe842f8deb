//! Protector kinds: what unwraps a protector key. Each kind lives in its own module and gives
//! the same few things: how to create one, what to ask the person unlocking it ([`Ask`]), how to
//! turn that answer into the key-encryption key of the protector key, how to change its secret,
//! its on-disk form (a serde struct, tagged by `"type"`) and its part of the record's associated
//! data. Everything common — the record, its file, the wrapping of the protector key, names, the
//! login order — is here, written once.
//!
//! Adding a kind touches its own module, the two enums below ([`ProtectorKind`], [`NewKind`])
//! and docs/formats.md; docs/architecture.md walks through it.
//!
//! Recovery keys are not a kind: they live with the directory (an xattr, see [`crate::recovery`]),
//! open exactly one directory, survive the loss of the keystore, and are never offered at login.
pub mod fido2;
pub mod password;
pub mod tpm2;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::ids::ProtectorId;
use crate::kdf::KdfError;
use crate::keystore::FORMAT_VERSION;
use crate::secret::{Passphrase, ProtectorKey, PROTECTOR_KEY_LEN};
use crate::tpm2::{PcrSet, PinTries, Tpm2Error};
use crate::ui::{SecretPrompt, Ui, UiError};
use crate::wrap::{self, Kek, Wrapped};

const PROTECTOR_FORMAT: &str = "dirseal-protector";
const MAX_NAME_CHARS: usize = 128;

/// Every kind's parameters as stored in its record. The serde tag is the kind's name on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ProtectorKind {
    /// Argon2id(password, salt) wraps the protector key.
    Password(password::Password),
    /// A key sealed by the TPM (behind a PIN and/or PCR values) wraps the protector key.
    Tpm2(tpm2::Tpm2),
    /// A security key's hmac-secret (through HKDF) wraps the protector key.
    Fido2(fido2::Fido2),
}

/// What a new protector of each kind is made from (front ends fill in the kind's options).
#[derive(Clone, Debug)]
pub enum NewKind {
    Password(password::NewPassword),
    Tpm2(tpm2::NewTpm2),
    Fido2(fido2::NewFido2),
}

/// Names of the kinds a front end can create, for `--protector-type` and service arguments.
pub const KIND_NAMES: &[&str] = &["password", "tpm2", "fido2"];

/// A secret the person types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secret {
    Password,
    Pin,
    /// The PIN a security key already has (asked once, also when creating a protector on it).
    KeyPin,
}

/// What unlocking (or creating) a protector asks of the person: a typed secret, a touch of a
/// device, both, or nothing at all (a TPM without PIN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub secret: Option<Secret>,
    pub touch: bool,
}

impl Ask {
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

#[derive(Debug, thiserror::Error)]
pub enum ProtectorError {
    #[error("incorrect {what} for protector {name} ({id}); nothing was changed")]
    IncorrectSecret { name: String, id: ProtectorId, what: &'static str },
    #[error("invalid protector name {name:?}: {reason}")]
    BadName { name: String, reason: &'static str },
    #[error("protector {name} ({id}) is a {kind} protector: it has no secret to change")]
    NoSecret { name: String, id: ProtectorId, kind: &'static str },
    #[error("unknown protector kind {name:?}; known kinds: {}", KIND_NAMES.join(", "))]
    UnknownKind { name: String },
    /// A front end called a kind without the answer its [`Ask`] named: a bug, not a user error.
    #[error("internal error: no {what} was supplied to the protector")]
    NoAnswer { what: &'static str },
    #[error("several security keys are connected; say which one to use")]
    SeveralKeys,
    #[error(transparent)]
    Kdf(#[from] KdfError),
    #[error(transparent)]
    Tpm2(#[from] Tpm2Error),
    #[error("option {option} does not apply to {kind} protectors")]
    BadOption { option: &'static str, kind: &'static str },
    #[error(transparent)]
    Fido2(#[from] crate::fido2::Fido2Error),
}

/// A protector as kept in the keystore: a protector key wrapped by whatever its kind derives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtectorRecord {
    pub id: ProtectorId,
    pub name: String,
    pub kind: ProtectorKind,
    /// The user this protector belongs to (its login password), if any.
    pub uid: Option<u32>,
    pub wrapped_key: Wrapped,
}

impl ProtectorKind {
    /// The kind's name, as on disk and in listings.
    pub fn name(&self) -> &'static str {
        match self {
            ProtectorKind::Password(_) => "password",
            ProtectorKind::Tpm2(_) => "tpm2",
            ProtectorKind::Fido2(_) => "fido2",
        }
    }

    /// What unlocking asks for.
    pub fn ask(&self) -> Ask {
        match self {
            ProtectorKind::Password(_) => password::ASK,
            ProtectorKind::Tpm2(t) => t.ask(),
            ProtectorKind::Fido2(f) => f.ask(),
        }
    }

    /// How many wrong PINs the device behind this protector still takes (`None`: no such limit or
    /// the device cannot be asked now).
    pub fn tries_left(&self, config: &Config) -> Option<u32> {
        match self {
            ProtectorKind::Password(_) => None,
            ProtectorKind::Tpm2(_) => tpm2::da_status(config).ok().map(|s| s.tries_left()),
            ProtectorKind::Fido2(f) if f.pin => f.locate(config).ok().and_then(|mut d| d.pin_retries().ok()),
            ProtectorKind::Fido2(_) => None,
        }
    }

    /// The prompt for this kind's secret. A device that cannot take a try now (a TPM in lockout, or
    /// missing) is reported before anything is asked.
    fn prompt<'a>(
        &self,
        rec: &'a ProtectorRecord,
        config: &Config,
        s: Secret,
        network: bool,
    ) -> Result<SecretPrompt<'a>, ProtectorError> {
        let (name, id) = (rec.name.as_str(), &rec.id);
        Ok(match (self, s) {
            (ProtectorKind::Tpm2(t), _) => {
                let st = t.ready(config)?;
                // A login from the network is not at the device; it is not rate limited here
                // (each PAM conversation is one try, behind the stack's own failure delay).
                PinTries { tries_left: st.tries_left(), min_local_tries: config.tpm2.min_local_tries() }
                    .may_try(!network, None)?;
                SecretPrompt::Pin { name, id, device: "TPM", tries_left: Some(st.tries_left()) }
            }
            (ProtectorKind::Fido2(f), _) => {
                let tries_left = f.locate(config)?.pin_retries().ok();
                SecretPrompt::Pin { name, id, device: "Security key", tries_left }
            }
            (_, Secret::Password) => SecretPrompt::Password { name, id },
            (_, Secret::Pin | Secret::KeyPin) => SecretPrompt::Pin { name, id, device: "", tries_left: None },
        })
    }

    fn aad_tail(&self) -> String {
        match self {
            ProtectorKind::Password(p) => p.aad(),
            ProtectorKind::Tpm2(t) => t.aad(),
            ProtectorKind::Fido2(f) => f.aad(),
        }
    }

    /// Checks, asking nothing and waiting for nothing, that the device this protector needs is
    /// there, so a login moves on at once when it is not.
    fn locate(&self, config: &Config) -> Result<(), ProtectorError> {
        match self {
            ProtectorKind::Password(_) | ProtectorKind::Tpm2(_) => Ok(()),
            ProtectorKind::Fido2(f) => f.locate(config).map(drop),
        }
    }

    fn kek(&self, config: &Config, secret: Option<&Passphrase>) -> Result<Kek, ProtectorError> {
        match self {
            ProtectorKind::Password(p) => p.kek(secret),
            ProtectorKind::Tpm2(t) => t.kek(config, secret),
            ProtectorKind::Fido2(f) => f.kek(config, secret),
        }
    }

    /// The same kind under a new secret; `None` for kinds without one.
    fn rekey(
        &self,
        config: &Config,
        secret: Option<&Passphrase>,
    ) -> Option<Result<(ProtectorKind, Kek), ProtectorError>> {
        match self {
            ProtectorKind::Password(p) => Some(p.rekey(secret).map(|(p, k)| (ProtectorKind::Password(p), k))),
            ProtectorKind::Tpm2(t) if t.sealed.pin.is_some() => {
                Some(t.rekey(config, secret).map(|(t, k)| (ProtectorKind::Tpm2(t), k)))
            }
            ProtectorKind::Tpm2(_) => None,
            // The key's PIN is the key's business (its vendor tool changes it); the record keeps.
            ProtectorKind::Fido2(_) => None,
        }
    }
}

/// Creation options as front ends collect them (flags, service arguments). Each kind takes the
/// ones that mean something to it and refuses the others, so no option is silently dropped.
#[derive(Clone, Debug, Default)]
pub struct KindOptions {
    /// Argon2id time in ms of CPU (password).
    pub kdf_time_ms: Option<u64>,
    /// Argon2id memory in MiB (password).
    pub kdf_memory_mib: Option<u32>,
    /// No PIN (tpm2).
    pub no_pin: bool,
    /// PCRs to bind to (tpm2).
    pub pcrs: Option<PcrSet>,
    /// Which connected security key (fido2).
    pub device: Option<String>,
    /// Require the security key's PIN at every unlock (fido2).
    pub pin: bool,
    /// Require the security key's built-in user verification (fido2).
    pub uv: bool,
    /// Accept a PIN equal to the owner's login password (tpm2): see [`tpm2::NewTpm2`].
    pub allow_password_pin: bool,
}

impl NewKind {
    /// Refuses, before any secret is asked, a protector that could not be made safely now (a TPM
    /// PIN on a TPM whose lockout anyone can reset). [`create`] checks again.
    pub fn check_ready(&self, config: &Config) -> Result<(), ProtectorError> {
        match self {
            NewKind::Tpm2(t) if !t.no_pin => Ok(crate::tpm2::require_owned_lockout(&mut tpm2::open(config)?)?),
            _ => Ok(()),
        }
    }

    /// The kind named `name` (one of [`KIND_NAMES`]) with `opts`.
    pub fn named(name: &str, opts: &KindOptions) -> Result<NewKind, ProtectorError> {
        let refuse = |option: &'static str, given: bool, kind: &'static str| {
            if given {
                Err(ProtectorError::BadOption { option, kind })
            } else {
                Ok(())
            }
        };
        match name {
            "password" => {
                refuse("--no-pin", opts.no_pin, "password")?;
                refuse("--allow-password-pin", opts.allow_password_pin, "password")?;
                refuse("--pcr", opts.pcrs.is_some(), "password")?;
                refuse("--device", opts.device.is_some(), "password")?;
                refuse("--pin", opts.pin, "password")?;
                refuse("--uv", opts.uv, "password")?;
                Ok(NewKind::Password(password::NewPassword {
                    kdf_time_ms: opts.kdf_time_ms,
                    kdf_memory_mib: opts.kdf_memory_mib,
                }))
            }
            "tpm2" => {
                refuse("--kdf-time-ms", opts.kdf_time_ms.is_some(), "tpm2")?;
                refuse("--kdf-memory-mib", opts.kdf_memory_mib.is_some(), "tpm2")?;
                refuse("--device", opts.device.is_some(), "tpm2")?;
                refuse("--pin", opts.pin, "tpm2")?;
                refuse("--uv", opts.uv, "tpm2")?;
                Ok(NewKind::Tpm2(tpm2::NewTpm2 {
                    no_pin: opts.no_pin,
                    pcrs: opts.pcrs.clone().unwrap_or_default(),
                    allow_password_pin: opts.allow_password_pin,
                }))
            }
            "fido2" => {
                refuse("--kdf-time-ms", opts.kdf_time_ms.is_some(), "fido2")?;
                refuse("--kdf-memory-mib", opts.kdf_memory_mib.is_some(), "fido2")?;
                refuse("--no-pin", opts.no_pin, "fido2")?;
                refuse("--allow-password-pin", opts.allow_password_pin, "fido2")?;
                refuse("--pcr", opts.pcrs.is_some(), "fido2")?;
                Ok(NewKind::Fido2(fido2::NewFido2 { device: opts.device.clone(), pin: opts.pin, uv: opts.uv }))
            }
            _ => Err(ProtectorError::UnknownKind { name: name.to_string() }),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            NewKind::Password(_) => "password",
            NewKind::Tpm2(_) => "tpm2",
            NewKind::Fido2(_) => "fido2",
        }
    }

    /// What creating one asks for (a new password or PIN is asked twice; a key's PIN once).
    pub fn ask(&self) -> Ask {
        match self {
            NewKind::Password(_) => password::ASK,
            NewKind::Tpm2(t) => t.ask(),
            NewKind::Fido2(f) => f.ask(),
        }
    }

    /// May record machine-wide settings in `config` (the calibrated Argon2id cost); the caller
    /// saves it when it changed.
    fn create(&self, config: &mut Config, secret: Option<&Passphrase>) -> Result<(ProtectorKind, Kek), ProtectorError> {
        match self {
            NewKind::Password(n) => n.create(config, secret).map(|(p, k)| (ProtectorKind::Password(p), k)),
            NewKind::Tpm2(n) => n.create(config, secret).map(|(t, k)| (ProtectorKind::Tpm2(t), k)),
            NewKind::Fido2(n) => n.create(config, secret).map(|(p, k)| (ProtectorKind::Fido2(p), k)),
        }
    }
}

/// Binds the wrapped protector key to its record: id, format version and every parameter of
/// the kind, so no field can be changed or the key moved to another record.
fn aad(id: &ProtectorId, kind: &ProtectorKind) -> Vec<u8> {
    format!("dirseal:{FORMAT_VERSION}:protector:{id}:{}", kind.aad_tail()).into_bytes()
}

pub fn check_name(name: &str) -> Result<(), ProtectorError> {
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

/// Unwraps a protector's key with the answer to `rec.kind.ask()`. A wrong answer changes nothing.
pub fn unlock(
    rec: &ProtectorRecord,
    config: &Config,
    secret: Option<&Passphrase>,
) -> Result<ProtectorKey, ProtectorError> {
    let kek = rec.kind.kek(config, secret)?;
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
    rec.kind.locate(config)?;
    let secret = match ask.secret {
        Some(s) => Some(ui.secret(&rec.kind.prompt(rec, config, s, ui.network_login())?)?),
        None => None,
    };
    if ask.touch {
        ui.touch(&rec.name, Some(&rec.id));
    }
    Ok(unlock(rec, config, secret.as_ref())?)
}

/// Asks `ui` for the new secret `ask` names (none for kinds without one). Empty secrets are refused.
pub fn ask_new(ask: Ask, name: &str, ui: &mut dyn Ui) -> Result<Option<Passphrase>, UiError> {
    let secret = match ask.secret {
        Some(Secret::Password) => ui.secret(&SecretPrompt::NewPassword { name })?,
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
    #[error(transparent)]
    Ui(#[from] UiError),
    #[error(transparent)]
    Protector(#[from] ProtectorError),
}

/// The one login order, used by the PAM module and the service: kinds that need no typing first
/// ([`Ask`]'s rank), then the user's own protectors before others, then by name.
pub fn login_order(list: &mut [ProtectorRecord], uid: u32) {
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
    crate::keystore::check_header(&f.format, f.version, PROTECTOR_FORMAT)?;
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
        assert!(unlock(&a, &fast_config(), Some(&pw("a"))).unwrap() == ka);
        let Err(e) = unlock(&a, &fast_config(), Some(&pw("wrong"))) else { panic!("a wrong password unlocked") };
        assert_eq!(e.to_string(), format!("incorrect password for protector alice ({}); nothing was changed", a.id));
        assert!(matches!(unlock(&a, &fast_config(), None), Err(ProtectorError::NoAnswer { .. })));
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
        assert!(unlock(&a2, &later, Some(&pw("old"))).is_err());
        assert!(unlock(&a2, &later, Some(&pw("new"))).unwrap() == ka);
    }

    #[test]
    fn tampering_is_detected() {
        let (a, _) = new_password("a", None, "p");
        // Raising the cost in the file (or lowering it) breaks the binding, not just the speed.
        let mut t = a.clone();
        t.kind =
            ProtectorKind::Password(password::Password { salt: [0; 16], kdf: Argon2Params { time_cost: 2, ..FAST } });
        assert!(unlock(&t, &fast_config(), Some(&pw("p"))).is_err());
        // The wrapped key of one record does not open as another's.
        let (mut b, _) = new_password("b", None, "p");
        b.kind = a.kind.clone();
        b.wrapped_key = a.wrapped_key.clone();
        assert!(unlock(&b, &fast_config(), Some(&pw("p"))).is_err());
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
        assert!(unlock(&back, &fast_config(), Some(&pw("pw"))).unwrap() == ka);
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
        let key = unlock(&rec, &Config::default(), Some(&pw("correct horse"))).unwrap();
        assert_eq!(key.as_bytes().to_vec(), (200..232).collect::<Vec<u8>>());
        assert!(matches!(
            unlock(&rec, &Config::default(), Some(&pw("correct horse!"))),
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
