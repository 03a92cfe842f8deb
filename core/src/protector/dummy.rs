//! A test-only fourth kind, added exactly as docs/architecture.md ("Where a new protector kind
//! goes") says: this module and one line in `kinds!`; nothing in ops or the front ends. Its key-
//! encryption key is SHA-256(salt, secret) — no real kind would be so cheap to guess.
//! On disk: `{"type": "dummy", "salt": hex, "shout": bool, "pin": bool}`. With `pin` it asks for
//! a PIN, yet declares no stand-alone login: only a kind's declaration opens a PIN login.
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Ask, Kind, KindOptions, NewKindOf, ProtectorError};
use crate::config::Config;
use crate::presence::Presence;
use crate::secret::Passphrase;
use crate::wrap::Kek;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dummy {
    #[serde(with = "hex::serde")]
    pub salt: [u8; 16],
    /// The secret is upper-cased first (an option of the kind, to show options reach it).
    pub shout: bool,
    /// Asks for a PIN rather than a password (the same secret to the kind).
    #[serde(default)]
    pub pin: bool,
}

#[derive(Clone, Debug, Default)]
pub struct NewDummy {
    pub shout: bool,
    pub pin: bool,
}

fn ask(pin: bool) -> Ask {
    if pin {
        Ask::PIN
    } else {
        Ask::PASSWORD
    }
}

fn kek(salt: &[u8; 16], shout: bool, secret: Option<&Passphrase>) -> Result<Kek, ProtectorError> {
    let s = secret.ok_or(ProtectorError::NoAnswer { what: "password" })?;
    let s = if shout { s.as_bytes().to_ascii_uppercase() } else { s.as_bytes().to_vec() };
    Ok(Kek::from_slice(&Sha256::new().chain_update(salt).chain_update(&s).finalize().into()))
}

impl Kind for Dummy {
    fn ask(&self) -> Ask {
        ask(self.pin)
    }

    fn aad(&self) -> String {
        format!("dummy:{}:{}:{}", hex::encode(self.salt), self.shout, self.pin)
    }

    fn kek(&self, _config: &Config, secret: Option<&Passphrase>, _: Presence) -> Result<Kek, ProtectorError> {
        kek(&self.salt, self.shout, secret)
    }

    fn rekey(&self, _config: &Config, secret: Option<&Passphrase>) -> Option<Result<(Dummy, Kek), ProtectorError>> {
        let d = Dummy { salt: rand::random(), shout: self.shout, pin: self.pin };
        Some(kek(&d.salt, d.shout, secret).map(|k| (d, k)))
    }
}

impl NewKindOf for NewDummy {
    type Made = Dummy;

    fn from_options(opts: &mut KindOptions) -> Result<NewDummy, ProtectorError> {
        Ok(NewDummy { shout: opts.flag("shout")?, pin: opts.flag("pin")? })
    }

    fn ask(&self) -> Ask {
        ask(self.pin)
    }

    fn create(&self, _config: &mut Config, secret: Option<&Passphrase>) -> Result<(Dummy, Kek), ProtectorError> {
        let d = Dummy { salt: rand::random(), shout: self.shout, pin: self.pin };
        let k = kek(&d.salt, d.shout, secret)?;
        Ok((d, k))
    }
}

/// The walk a reviewer would do for a new kind, through the same calls the front ends make.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Dirseal, NewProtector};
    use crate::protector::{NewKind, ProtectorKind, KIND_NAMES};
    use crate::ui::{SecretPrompt, Ui, UiError};

    /// Answers each prompt with the next of `answers`.
    struct Script(Vec<&'static str>);

    impl Ui for Script {
        fn secret(&mut self, _: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
            let s = self.0.remove(0);
            Ok(Passphrase::from_str_copy(s))
        }
    }

    fn opts(pairs: &[(&str, &str)]) -> KindOptions {
        KindOptions::new(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn a_fourth_kind_needs_only_its_module_and_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut ds = Dirseal::open(&dir.path().join("config.toml"), Some(&dir.path().join("keystore"))).unwrap();
        assert!(KIND_NAMES.contains(&"dummy"));
        // Options reach the kind by key; what it does not take is refused, naming no front end.
        let e = NewKind::named("dummy", opts(&[("no_pin", "true")])).unwrap_err();
        assert_eq!(e.to_string(), "option no_pin does not apply to dummy protectors");
        let e = NewKind::named("dummy", opts(&[("shout", "loud")])).unwrap_err();
        assert!(matches!(e, ProtectorError::BadOptionValue { kind: "dummy", .. }), "{e}");
        let kind = NewKind::named("dummy", opts(&[("shout", "true")])).unwrap();

        // Create (the new secret is asked twice by a terminal; the Ui gives it once here).
        let n = NewProtector { name: "d".into(), uid: None, kind };
        let (rec, key) = ds.create_protector(&n, &mut Script(vec!["secret"])).unwrap();
        assert_eq!(rec.kind.name(), "dummy");

        // Unlock: the option took effect; a wrong secret is the common error.
        assert!(ds.unlock_protector(&rec, &mut Script(vec!["SeCrEt"])).unwrap() == key);
        let Err(e) = ds.unlock_protector(&rec, &mut Script(vec!["other"])) else { panic!("a wrong secret opened it") };
        assert!(e.to_string().starts_with("incorrect password for protector d"), "{e}");

        // Change its secret: same id and key, new secret.
        ds.change_secret(&rec.id, &mut Script(vec!["secret", "new"])).unwrap();
        let changed = ds.keystore().protector(&rec.id).unwrap();
        assert!(ds.unlock_protector(&changed, &mut Script(vec!["NEW"])).unwrap() == key);
        assert!(ds.unlock_protector(&changed, &mut Script(vec!["secret"])).is_err());

        // List: the record comes back from its file, as on disk.
        let listed: Vec<_> = ds.keystore().protectors().unwrap().into_iter().filter_map(|(_, r)| r.ok()).collect();
        assert_eq!(listed.len(), 1);
        let ProtectorKind::Dummy(d) = &listed[0].kind else { panic!("a dummy protector") };
        assert!(d.shout);
    }

    /// A kind that asks for a PIN opens no PIN login unless it declares so: the dummy asks one,
    /// declares nothing, and is no user's PIN-login protector (issue 45).
    #[test]
    fn a_pin_prompt_alone_opens_no_pin_login() {
        use crate::keystore::PolicyRecord;
        use crate::secret::MasterKey;
        let dir = tempfile::tempdir().unwrap();
        let mut ds = Dirseal::open(&dir.path().join("config.toml"), Some(&dir.path().join("keystore"))).unwrap();
        let kind = NewKind::named("dummy", opts(&[("pin", "true")])).unwrap();
        let n = NewProtector { name: "d".into(), uid: Some(4242), kind };
        let (rec, key) = ds.create_protector(&n, &mut Script(vec!["1234"])).unwrap();
        assert_eq!(rec.kind.ask(), Ask::PIN);
        assert_eq!(rec.kind.standalone_login(), None);
        let mut policy = PolicyRecord::new(crate::ids::KeyIdentifier([7; 16]), None);
        policy.add_protector(&rec.id, &key, &MasterKey::random());
        assert_eq!(ds.login_protectors(&policy, 4242).len(), 1, "the user's own protector of the policy");
        assert!(!crate::ops::opens_pin_login(&rec));
        assert!(ds.pin_protector(&policy, 4242).is_none(), "a PIN prompt made a PIN-login protector");
    }
}
