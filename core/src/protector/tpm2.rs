//! TPM2 protectors: a random key-encryption key sealed by the TPM ([`crate::tpm2`]) behind a PIN
//! that the TPM's dictionary-attack lockout guards, optionally bound to PCR values.
//! On disk (docs/formats.md): `{"type": "tpm2", "public": hex, "private": hex, "pcrs": [7],
//! "pin": {"salt": hex, "argon2": {...}} | null}`.
use serde::{Deserialize, Serialize};

use super::{Ask, Kind, KindError, KindOptions, NewKindOf, PromptDevice, ProtectorError, Standalone};
use crate::config::Config;
use crate::kdf::{self, Argon2Params, KdfError};
use crate::presence::Presence;
use crate::secret::{Passphrase, ProtectorKey};
use crate::tpm2::{self, DaStatus, PcrSet, PinKdf, PinTries, SealedKey, Tpm, Tpm2Error, DEFAULT_PIN_KDF};
use crate::wrap::Kek;

/// A TPM2 protector's parameters. Parsed from disk only with a PIN cost inside the
/// library's Argon2id bounds and non-empty blobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SealedKey", into = "SealedKey")]
pub struct Tpm2 {
    pub(crate) sealed: SealedKey,
}

/// Why a TPM2 record was refused when parsed.
#[derive(Debug, thiserror::Error)]
pub enum BadTpm2 {
    /// The PIN's Argon2id cost is out of bounds.
    #[error(transparent)]
    Kdf(#[from] KdfError),
    /// A blob of the sealed object is empty.
    #[error("the sealed TPM object is empty")]
    Empty,
}

impl TryFrom<SealedKey> for Tpm2 {
    type Error = BadTpm2;
    fn try_from(sealed: SealedKey) -> Result<Tpm2, BadTpm2> {
        if let Some(p) = &sealed.pin {
            p.argon2.check()?;
        }
        if sealed.public.is_empty() || sealed.private.is_empty() {
            return Err(BadTpm2::Empty);
        }
        Ok(Tpm2 { sealed })
    }
}

impl From<Tpm2> for SealedKey {
    fn from(t: Tpm2) -> SealedKey {
        t.sealed
    }
}

/// How to make a new TPM2 protector.
#[derive(Clone, Debug, Default)]
pub struct NewTpm2 {
    /// Seal with no PIN: anyone who can run code as root on this machine (with the bound PCRs
    /// unchanged) can unseal it.
    pub no_pin: bool,
    /// PCRs whose current values the key is sealed to: it unseals only while they are unchanged.
    pub pcrs: PcrSet,
    /// Accept a PIN equal to the owner's login password. Refused by default: /etc/shadow's hash of
    /// that password lets anyone with the disk find the PIN offline, which the TPM cannot count.
    pub allow_password_pin: bool,
}

const WITH_PIN: Ask = Ask::PIN;
const NO_PIN: Ask = Ask { secret: None, touch: false };

/// The TPM's errors, sorted for the front ends: no TPM here, a wrong PIN (counted), a TPM that
/// will not unseal now (lockout, changed PCRs), or anything else.
impl From<Tpm2Error> for ProtectorError {
    fn from(e: Tpm2Error) -> ProtectorError {
        match e {
            Tpm2Error::Unavailable { .. } | Tpm2Error::NotInstalled { .. } => {
                ProtectorError::Unavailable(KindError::new(e))
            }
            Tpm2Error::WrongPin { .. } => ProtectorError::WrongSecret(KindError::new(e)),
            Tpm2Error::Lockout { .. }
            | Tpm2Error::PcrMismatch { .. }
            | Tpm2Error::PinLock { .. }
            | Tpm2Error::Busy { .. } => ProtectorError::NotNow(KindError::new(e)),
            e => ProtectorError::Kind(KindError::new(e)),
        }
    }
}

/// The PIN stretching: [`DEFAULT_PIN_KDF`], or the machine's configured cost when that is lighter
/// (tests; small machines).
fn pin_kdf(config: &Config) -> Argon2Params {
    let memory_kib = DEFAULT_PIN_KDF.memory_kib.min(kdf::memory_cap_kib());
    match config.argon2 {
        Some(p) if p.memory_kib < memory_kib => p,
        _ => Argon2Params { memory_kib, ..DEFAULT_PIN_KDF },
    }
}

fn open(config: &Config) -> Result<Tpm, Tpm2Error> {
    Tpm::open(&config.tpm2.tcti())
}

fn da_status(config: &Config) -> Result<DaStatus, Tpm2Error> {
    Tpm::open(&config.tpm2.tcti())?.da_status()
}

fn seal(config: &Config, pin: Option<&Passphrase>, pcrs: &PcrSet) -> Result<(Tpm2, Kek), ProtectorError> {
    let kek = ProtectorKey::random();
    let sealed = Tpm::open(&config.tpm2.tcti())?.seal(&kek, pin, pcrs, pin_kdf(config))?;
    Ok((Tpm2 { sealed }, Kek::from_slice(kek.as_bytes())))
}

impl Kind for Tpm2 {
    // The sealed key opens only in the TPM that sealed it.
    const TRAVELS: bool = false;
    fn ask(&self) -> Ask {
        if self.sealed.pin.is_some() {
            WITH_PIN
        } else {
            NO_PIN
        }
    }

    // A PIN the TPM counts may log its user in; a TPM without PIN never does (it would let
    // anyone at the console in).
    fn standalone_login(&self) -> Option<Standalone> {
        self.sealed.pin.is_some().then_some(Standalone::Pin)
    }

    /// The kind's part of the record's associated data: both blobs, the PCRs and the PIN's
    /// stretching, so none can be swapped or weakened in the file.
    fn aad(&self) -> String {
        let pin = match &self.sealed.pin {
            Some(PinKdf { salt, argon2: a }) => {
                format!("pin:{}:{}:{}:{}", hex::encode(salt), a.time_cost, a.memory_kib, a.parallelism)
            }
            None => "nopin".into(),
        };
        format!(
            "tpm2:{}:{}:pcrs={}:{pin}",
            hex::encode(&self.sealed.public),
            hex::encode(&self.sealed.private),
            self.sealed.pcrs
        )
    }

    /// The TPM's dictionary-attack state, checked before a PIN is asked: a locked-out TPM is
    /// reported without asking (and without costing anything).
    /// This refusal only spares a question: [`Tpm::unseal`] decides again, under the machine's
    /// PIN lock, right before the TPM is asked.
    fn prompt_device(&self, config: &Config, presence: Presence) -> Result<Option<PromptDevice>, ProtectorError> {
        let st = da_status(config)?;
        if st.in_lockout && self.sealed.pin.is_some() {
            return Err(Tpm2Error::Lockout { recovery_time_s: Some(st.recovery_time_s) }.into());
        }
        // Not rate limited here: each PAM conversation is one try, behind the stack's own
        // failure delay; the service limits its callers itself.
        PinTries { tries_left: st.tries_left(), min_local_tries: config.tpm2.min_local_tries() }
            .may_try(presence.at_device(), None)?;
        Ok(Some(PromptDevice { name: "TPM", tries_left: Some(st.tries_left()) }))
    }

    fn device_tries(&self, config: &Config) -> Option<Result<u32, ProtectorError>> {
        Some(da_status(config).map(|s| s.tries_left()).map_err(ProtectorError::from))
    }

    /// Unseals; a wrong PIN costs one TPM try and is never retried.
    fn kek(&self, config: &Config, secret: Option<&Passphrase>, presence: Presence) -> Result<Kek, ProtectorError> {
        if self.sealed.pin.is_some() && secret.is_none() {
            return Err(ProtectorError::NoAnswer { what: "TPM PIN" });
        }
        let min_local_tries = config.tpm2.min_local_tries();
        let key = Tpm::open(&config.tpm2.tcti())?.unseal(&self.sealed, secret, presence, min_local_tries)?;
        Ok(Kek::from_slice(key.as_bytes()))
    }

    /// A new PIN: a fresh key sealed under it, bound to the same PCRs (at their current values).
    /// Only a protector with a PIN has a secret to change.
    fn rekey(&self, config: &Config, secret: Option<&Passphrase>) -> Option<Result<(Tpm2, Kek), ProtectorError>> {
        self.sealed.pin.as_ref()?;
        Some(
            secret
                .ok_or(ProtectorError::NoAnswer { what: "TPM PIN" })
                .and_then(|pin| seal(config, Some(pin), &self.sealed.pcrs)),
        )
    }
}

impl NewKindOf for NewTpm2 {
    type Made = Tpm2;

    /// `no_pin`, `pcr` (`7,11`), `allow_password_pin` (administrators only).
    fn from_options(opts: &mut KindOptions) -> Result<NewTpm2, ProtectorError> {
        Ok(NewTpm2 {
            no_pin: opts.flag("no_pin")?,
            pcrs: opts.parse("pcr")?.unwrap_or_default(),
            allow_password_pin: opts.flag_privileged("allow_password_pin")?,
        })
    }

    fn check_ready(&self, config: &Config) -> Result<(), ProtectorError> {
        if self.no_pin {
            return Ok(());
        }
        Ok(tpm2::require_owned_lockout(&mut open(config)?)?)
    }

    fn refuses_login_password(&self) -> bool {
        !self.allow_password_pin
    }

    fn ask(&self) -> Ask {
        if self.no_pin {
            NO_PIN
        } else {
            WITH_PIN
        }
    }

    fn create(&self, config: &mut Config, secret: Option<&Passphrase>) -> Result<(Tpm2, Kek), ProtectorError> {
        let pin = match (self.no_pin, secret) {
            (true, _) => None,
            (false, Some(p)) => Some(p),
            (false, None) => return Err(ProtectorError::NoAnswer { what: "TPM PIN" }),
        };
        if pin.is_some() {
            // A PIN is only as strong as the limit on guessing it, which holds only while nobody
            // but the lockout's owner can reset the count of wrong PINs.
            tpm2::require_owned_lockout(&mut Tpm::open(&config.tpm2.tcti())?)?;
        }
        seal(config, pin, &self.pcrs)
    }
}
