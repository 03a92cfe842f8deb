//! Password protectors: Argon2id(password, salt) is the key-encryption key of the protector key.
//! On disk (docs/formats.md): `{"type": "password", "salt": hex, "argon2": {...}}`.
use serde::{Deserialize, Serialize};

use super::{Ask, Kind, KindOptions, NewKindOf, ProtectorError};
use crate::config::Config;
use crate::kdf::{self, Argon2Params, KdfError};
use crate::presence::Presence;
use crate::secret::Passphrase;
use crate::wrap::Kek;

const SALT_LEN: usize = 16;

/// A password protector's parameters. Parsed from disk only with a cost inside the library's
/// Argon2id bounds, so a tampered file cannot make an unlock take hours.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "OnDisk", into = "OnDisk")]
pub struct Password {
    pub(crate) salt: [u8; SALT_LEN],
    pub(crate) kdf: Argon2Params,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    #[serde(with = "hex::serde")]
    salt: [u8; SALT_LEN],
    argon2: Argon2Params,
}

impl TryFrom<OnDisk> for Password {
    type Error = KdfError;
    fn try_from(f: OnDisk) -> Result<Password, KdfError> {
        f.argon2.check()?;
        Ok(Password { salt: f.salt, kdf: f.argon2 })
    }
}

impl From<Password> for OnDisk {
    fn from(p: Password) -> OnDisk {
        OnDisk { salt: p.salt, argon2: p.kdf }
    }
}

/// How to make a new password protector: per-protector overrides of the machine's Argon2id cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct NewPassword {
    pub(crate) kdf_time_ms: Option<u64>,
    pub(crate) kdf_memory_mib: Option<u32>,
}

pub(super) const ASK: Ask = Ask::PASSWORD;

fn password(secret: Option<&Passphrase>) -> Result<&Passphrase, ProtectorError> {
    secret.ok_or(ProtectorError::NoAnswer { what: "password" })
}

impl Kind for Password {
    fn ask(&self) -> Ask {
        ASK
    }

    /// The kind's part of the record's associated data: the salt and cost are bound to the
    /// wrapped key, so raising or lowering the cost in the file breaks it instead of weakening it.
    fn aad(&self) -> String {
        format!(
            "password:{}:{}:{}:{}",
            hex::encode(self.salt),
            self.kdf.time_cost,
            self.kdf.memory_kib,
            self.kdf.parallelism
        )
    }

    fn kek(&self, _config: &Config, secret: Option<&Passphrase>, _: Presence) -> Result<Kek, ProtectorError> {
        Ok(kdf::derive(password(secret)?, &self.salt, self.kdf)?)
    }

    /// A new password keeps the protector's cost (what its creator chose, perhaps with
    /// `--kdf-*` flags) and gets a fresh salt. The CLI and the PAM module both change passwords
    /// through here, so they agree.
    fn rekey(&self, config: &Config, secret: Option<&Passphrase>) -> Option<Result<(Password, Kek), ProtectorError>> {
        let p = Password { salt: rand::random(), kdf: self.kdf };
        Some(p.kek(config, secret, Presence::Elsewhere).map(|kek| (p, kek)))
    }
}

impl NewPassword {
    /// The Argon2id cost for a new protector: the configured one, calibrated and recorded in
    /// `config` on first use so every protector of this machine costs the same; the per-protector
    /// overrides win.
    fn params(&self, config: &mut Config) -> Argon2Params {
        let memory_kib = self
            .kdf_memory_mib
            .map(|m| m.saturating_mul(1024).max(kdf::MIN_MEMORY_KIB))
            .or(config.argon2.map(|a| a.memory_kib))
            .unwrap_or_else(kdf::memory_cap_kib);
        if let Some(ms) = self.kdf_time_ms {
            return kdf::calibrate(std::time::Duration::from_millis(ms), memory_kib);
        }
        if let Some(p) = config.argon2 {
            return Argon2Params { memory_kib, ..p };
        }
        let p = kdf::calibrate(std::time::Duration::from_secs(1), memory_kib);
        config.argon2 = Some(p);
        p
    }
}

impl NewKindOf for NewPassword {
    type Made = Password;

    /// `kdf_time_ms`, `kdf_memory_mib`: this protector's Argon2id cost instead of the machine's
    /// (administrators only: it costs the machine that much at every unlock).
    fn from_options(opts: &mut KindOptions) -> Result<NewPassword, ProtectorError> {
        Ok(NewPassword {
            kdf_time_ms: opts.parse_privileged("kdf_time_ms")?,
            kdf_memory_mib: opts.parse_privileged("kdf_memory_mib")?,
        })
    }

    fn ask(&self) -> Ask {
        ASK
    }

    fn create(&self, config: &mut Config, secret: Option<&Passphrase>) -> Result<(Password, Kek), ProtectorError> {
        let secret = password(secret)?;
        let p = Password { salt: rand::random(), kdf: self.params(config) };
        let kek = p.kek(config, Some(secret), Presence::Elsewhere)?;
        Ok((p, kek))
    }
}
