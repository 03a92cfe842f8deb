//! FIDO2 protectors: a security key's hmac-secret opens the protector key.
//!
//! Creating one makes a non-resident ES256 credential with the hmac-secret extension for the
//! fixed relying party id `dirseal` and picks a random salt. Unlocking asks the key
//! (after a touch, and its PIN or built-in verification if the protector requires them) for
//! HMAC(credential secret, salt); HKDF turns those 32 bytes into the key-encryption key of the
//! protector key. The record holds no secret: without the very key that made the credential, the
//! credential id and salt are useless.
//!
//! On disk (docs/formats.md): `{"type": "fido2", "rp_id", "credential_id": hex, "salt": hex,
//! "pin": bool, "uv": bool}`.
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use zeroize::Zeroizing;

use super::{Ask, Kind, KindError, KindOptions, NewKindOf, PromptDevice, ProtectorError, Secret, Standalone};
use crate::config::Config;
use crate::fido2::{self as keys, AssertRequest, Device, Fido2Error, Pin};
use crate::presence::Presence;
use crate::secret::Passphrase;
use crate::wrap::Kek;

const SALT_LEN: usize = 32;
/// Real keys make ids of 16 to a few hundred bytes; CTAP caps them far below this.
const MAX_CREDENTIAL_ID: usize = 1024;
const HKDF_INFO: &[u8] = b"dirseal fido2 protector kek v1";

/// A FIDO2 protector's parameters: the credential on the security key and the salt it is asked to HMAC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "OnDisk", into = "OnDisk")]
pub struct Fido2 {
    pub(crate) rp_id: String,
    pub(crate) credential_id: Vec<u8>,
    pub(crate) salt: [u8; SALT_LEN],
    /// The key's PIN is asked at every unlock (the hmac-secret differs without it).
    pub(crate) pin: bool,
    /// The key's built-in user verification (fingerprint) is required.
    pub(crate) uv: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    rp_id: String,
    #[serde(with = "hex::serde")]
    credential_id: Vec<u8>,
    #[serde(with = "hex::serde")]
    salt: [u8; SALT_LEN],
    pin: bool,
    uv: bool,
}

impl TryFrom<OnDisk> for Fido2 {
    type Error = String;
    fn try_from(f: OnDisk) -> Result<Fido2, String> {
        if f.credential_id.is_empty() || f.credential_id.len() > MAX_CREDENTIAL_ID {
            return Err(format!("a FIDO2 credential id has 1 to {MAX_CREDENTIAL_ID} bytes"));
        }
        if f.rp_id.is_empty() || f.rp_id.len() > 255 || f.rp_id.chars().any(|c| c.is_control() || c == ':') {
            return Err("invalid FIDO2 relying party id".into());
        }
        Ok(Fido2 { rp_id: f.rp_id, credential_id: f.credential_id, salt: f.salt, pin: f.pin, uv: f.uv })
    }
}

impl From<Fido2> for OnDisk {
    fn from(p: Fido2) -> OnDisk {
        OnDisk { rp_id: p.rp_id, credential_id: p.credential_id, salt: p.salt, pin: p.pin, uv: p.uv }
    }
}

/// How to make a new FIDO2 protector.
#[derive(Clone, Debug, Default)]
pub struct NewFido2 {
    /// Which connected key (`dirseal fido2 list`); required when several are connected.
    pub device: Option<String>,
    /// Ask the key's PIN at every unlock (the hmac-secret differs without it).
    pub pin: bool,
    /// Require the key's built-in user verification (fingerprint).
    pub uv: bool,
}

/// No connected key holds the credential: the usual case at a login, not a problem.
impl From<Fido2Error> for ProtectorError {
    fn from(e: Fido2Error) -> ProtectorError {
        match e {
            Fido2Error::NotConnected | Fido2Error::NoKey | Fido2Error::NotInstalled { .. } => {
                ProtectorError::Unavailable(KindError::new(e))
            }
            e => ProtectorError::Kind(KindError::new(e)),
        }
    }
}

/// A new protector on one of several connected keys, and none was named.
#[derive(Debug, thiserror::Error)]
#[error("several security keys are connected; say which one to use")]
pub(crate) struct SeveralKeys;

fn ask(pin: bool) -> Ask {
    Ask { secret: pin.then_some(Secret::KeyPin), touch: true }
}

fn pin_of(secret: Option<&Passphrase>, wanted: bool) -> Result<Option<Pin>, ProtectorError> {
    if !wanted {
        return Ok(None);
    }
    let s = secret.ok_or(ProtectorError::NoAnswer { what: "security key PIN" })?;
    Pin::new(s.as_bytes()).map(Some).ok_or(Fido2Error::PinPolicy.into())
}

/// HKDF-SHA-256 of the hmac-secret, bound to the credential it came from.
fn kek_from(secret: &[u8; 32], credential_id: &[u8]) -> Kek {
    let hk = hkdf::Hkdf::<Sha256>::new(Some(credential_id), secret);
    let mut k = Zeroizing::new([0u8; 32]);
    // Invariant: 32 bytes is far below HKDF-SHA-256's output limit.
    hk.expand(HKDF_INFO, &mut k[..]).expect("32-byte HKDF output");
    Kek::from_slice(&k)
}

impl Kind for Fido2 {
    fn ask(&self) -> Ask {
        ask(self.pin)
    }

    // A touch of the user's own key logs them in; one behind the key's PIN never does (a login
    // has no such PIN).
    fn standalone_login(&self) -> Option<Standalone> {
        (!self.pin).then_some(Standalone::Touch)
    }

    /// Everything of the record is bound to the wrapped key: which credential, which salt, and
    /// whether PIN and UV are required (so they cannot be switched off in the file).
    fn aad(&self) -> String {
        format!(
            "fido2:{}:{}:{}:{}:{}",
            self.rp_id,
            hex::encode(&self.credential_id),
            hex::encode(self.salt),
            self.pin,
            self.uv
        )
    }

    /// Fails early, asking nothing, when no connected key holds the credential.
    fn locate(&self, config: &Config) -> Result<(), ProtectorError> {
        self.holder(config).map(drop)
    }

    fn kek(&self, config: &Config, secret: Option<&Passphrase>, _: Presence) -> Result<Kek, ProtectorError> {
        let pin = pin_of(secret, self.pin)?;
        self.kek_from_device(&mut self.holder(config)?, pin.as_ref())
    }

    fn prompt_device(&self, config: &Config, _: Presence) -> Result<Option<PromptDevice>, ProtectorError> {
        let tries_left = self.holder(config)?.pin_retries().ok();
        Ok(Some(PromptDevice { name: "Security key", tries_left }))
    }

    /// The key's PIN tries, for a protector that asks its PIN.
    fn device_tries(&self, config: &Config) -> Option<Result<u32, ProtectorError>> {
        if !self.pin {
            return None;
        }
        Some(self.holder(config).and_then(|mut d| Ok(d.pin_retries()?)))
    }
}

impl Fido2 {
    /// The connected key holding the credential.
    fn holder(&self, config: &Config) -> Result<Device, ProtectorError> {
        Ok(keys::find_holder(&config.fido2, &self.rp_id, &self.credential_id)?)
    }

    /// Asks `dev` for the hmac-secret of this record's credential and salt (a touch).
    fn kek_from_device(&self, dev: &mut Device, pin: Option<&Pin>) -> Result<Kek, ProtectorError> {
        let a = dev.assert(&AssertRequest {
            rp_id: &self.rp_id,
            credential_ids: &[&self.credential_id],
            salt: Some(&self.salt),
            pin,
            uv: self.uv,
        })?;
        let s = a.secret.ok_or(Fido2Error::Unsupported("the hmac-secret extension".into()))?;
        Ok(kek_from(s.as_bytes(), &self.credential_id))
    }
}

impl NewKindOf for NewFido2 {
    type Made = Fido2;

    /// `device` (as `dirseal fido2 list` shows it), `pin`, `uv`.
    fn from_options(opts: &mut KindOptions) -> Result<NewFido2, ProtectorError> {
        Ok(NewFido2 { device: opts.take("device"), pin: opts.flag("pin")?, uv: opts.flag("uv")? })
    }

    fn ask(&self) -> Ask {
        ask(self.pin)
    }

    /// Makes the credential (first touch) and reads its hmac-secret (second touch).
    fn create(&self, config: &mut Config, secret: Option<&Passphrase>) -> Result<(Fido2, Kek), ProtectorError> {
        let cfg = &config.fido2;
        let path = match &self.device {
            Some(d) => keys::resolve(cfg, d)?,
            None => match keys::device_paths(cfg)?.as_slice() {
                [one] => one.clone(),
                [] => return Err(Fido2Error::NoKey.into()),
                _ => return Err(ProtectorError::Kind(KindError::new(SeveralKeys))),
            },
        };
        let mut dev = Device::open(&path, cfg.touch_timeout())?;
        let info = dev.info()?;
        if !info.hmac_secret() {
            return Err(Fido2Error::Unsupported("the hmac-secret extension".into()).into());
        }
        if self.pin && info.option("clientPin") != Some(true) {
            return Err(Fido2Error::PinNotSet.into());
        }
        if self.uv && info.option("uv") != Some(true) {
            return Err(Fido2Error::Unsupported("built-in user verification (uv)".into()).into());
        }
        let pin = pin_of(secret, self.pin)?;
        let user_id: [u8; 16] = rand::random();
        let credential_id = dev.make_credential(keys::RP_ID, &user_id, "dirseal", pin.as_ref(), self.uv)?;
        let rec = Fido2 { rp_id: keys::RP_ID.into(), credential_id, salt: rand::random(), pin: self.pin, uv: self.uv };
        let kek = rec.kek_from_device(&mut dev, pin.as_ref())?;
        Ok((rec, kek))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ProtectorId;
    use crate::protector::{aad, parse, to_json, ProtectorKind};
    use crate::wrap;

    const ID: &str = "5eed0f1d0c0ffee1";
    const HMAC_SECRET: [u8; 32] = [0x42; 32];
    const PROTECTOR_KEY: [u8; 32] = [0x24; 32];

    fn golden_kind() -> Fido2 {
        Fido2 { rp_id: "dirseal".into(), credential_id: vec![0xc1; 40], salt: [0x5a; 32], pin: true, uv: false }
    }

    /// A FIDO2 record as the first dirseal with FIDO2 wrote it: it must keep parsing, and the
    /// same hmac-secret must keep opening it (HKDF info, AAD layout and field names are frozen).
    const GOLDEN: &str = r#"{
  "format": "dirseal-protector",
  "version": 1,
  "id": "5eed0f1d0c0ffee1",
  "name": "yubikey",
  "uid": 1000,
  "kind": {
    "type": "fido2",
    "rp_id": "dirseal",
    "credential_id": "c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1",
    "salt": "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a",
    "pin": true,
    "uv": false
  },
  "wrapped_key": {
    "nonce": "d020cbb2add02969b5f810d6",
    "ciphertext": "0c75f8d4ce4c7c8de6736c56e745677998f339b2b8360caafe96e82ab83579746a2608c330ada7c4642f5a83d1b9e25a"
  }
}"#;

    #[test]
    fn record_format_is_stable() {
        let id: ProtectorId = ID.parse().unwrap();
        let rec = parse(GOLDEN.as_bytes(), &id).unwrap();
        assert_eq!(rec.kind, ProtectorKind::Fido2(golden_kind()));
        assert_eq!((rec.name.as_str(), rec.uid), ("yubikey", Some(1000)));
        assert_eq!(String::from_utf8(to_json(&rec)).unwrap(), GOLDEN);
        let kek = kek_from(&HMAC_SECRET, &golden_kind().credential_id);
        let key = wrap::open(&kek, &aad(&id, &rec.kind), &rec.wrapped_key, 32).unwrap();
        assert_eq!(key[..], PROTECTOR_KEY);
        // Another hmac-secret (another key, the same key without its PIN) does not open it.
        let other = kek_from(&[0x43; 32], &golden_kind().credential_id);
        assert!(wrap::open(&other, &aad(&id, &rec.kind), &rec.wrapped_key, 32).is_err());
        // Switching the PIN requirement off in the file breaks the binding.
        let off = ProtectorKind::Fido2(Fido2 { pin: false, ..golden_kind() });
        assert!(wrap::open(&kek, &aad(&id, &off), &rec.wrapped_key, 32).is_err());
    }

    #[test]
    fn bad_records_are_refused() {
        let id: ProtectorId = ID.parse().unwrap();
        for (from, to) in [
            ("\"uv\": false", "\"uv\": false, \"x\": 1"),
            ("\"credential_id\": \"c1c1", "\"credential_id\": \"zz"),
            ("\"rp_id\": \"dirseal\"", "\"rp_id\": \"\""),
            ("\"salt\": \"5a5a", "\"salt\": \""),
            ("\"pin\": true,\n", ""),
        ] {
            let bad = GOLDEN.replacen(from, to, 1);
            assert_ne!(bad, GOLDEN, "{from}");
            assert!(parse(bad.as_bytes(), &id).is_err(), "{to}");
        }
        let empty = GOLDEN.replace(&"c1".repeat(40), "");
        assert!(parse(empty.as_bytes(), &id).unwrap_err().contains("credential id"));
    }
}
