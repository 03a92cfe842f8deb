//! libfido2 (the production wrapper, `dirseal::fido2`) against the software authenticator,
//! over the socket transport: the same code path a real key takes from CTAPHID INIT up.
use std::time::{Duration, Instant};

use dirseal::fido2::{AssertRequest, Device, DevicePath, Fido2Error, Pin};
use dirseal_softfido::{Options, PinProtocol, Presence, SoftFido};

const RP: &str = "dirseal:test";

struct Fx {
    _dir: tempfile::TempDir,
    keys: Vec<SoftFido>,
}

fn fx(opts: &[Options]) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let keys = opts
        .iter()
        .enumerate()
        .map(|(i, o)| SoftFido::start(&dir.path().join(format!("key{i}.sock")), o.clone()).unwrap())
        .collect();
    Fx { _dir: dir, keys }
}

fn open(k: &SoftFido, timeout: Duration) -> Device {
    Device::open(&DevicePath::Socket(k.path().to_path_buf()), timeout).unwrap()
}

fn secret(d: &mut Device, id: &[u8], salt: &[u8; 32], pin: Option<&Pin>) -> Result<[u8; 32], Fido2Error> {
    let a = d.assert(&AssertRequest { rp_id: RP, credential_ids: &[id], salt: Some(salt), pin, uv: false })?;
    Ok(*a.secret.unwrap().as_bytes())
}

#[test]
fn make_credential_and_hmac_secret_both_protocols() {
    for protos in [vec![PinProtocol::One], vec![PinProtocol::Two]] {
        let f = fx(&[Options { pin_protocols: protos.clone(), ..Default::default() }]);
        let mut d = open(&f.keys[0], Duration::from_secs(5));
        let info = d.info().unwrap();
        assert!(info.hmac_secret(), "{info:?}");
        assert_eq!(info.option("clientPin"), Some(false));
        let id = d.make_credential(RP, b"uid", "alice", None, false).unwrap();
        assert_eq!(f.keys[0].touches(), 1);
        let s1 = secret(&mut d, &id, &[1; 32], None).unwrap();
        let s2 = secret(&mut d, &id, &[1; 32], None).unwrap();
        let s3 = secret(&mut d, &id, &[2; 32], None).unwrap();
        assert_eq!(s1, s2, "{protos:?}: same salt, same secret");
        assert_ne!(s1, s3, "{protos:?}: another salt, another secret");
        assert_eq!(f.keys[0].touches(), 4);
        // The secret survives reopening (a fresh key agreement).
        drop(d);
        let mut d = open(&f.keys[0], Duration::from_secs(5));
        assert_eq!(secret(&mut d, &id, &[1; 32], None).unwrap(), s1);
    }
}

#[test]
fn other_authenticator_or_rp_refuses_the_credential() {
    let f = fx(&[Options::default(), Options::default()]);
    let mut a = open(&f.keys[0], Duration::from_secs(5));
    let mut b = open(&f.keys[1], Duration::from_secs(5));
    let id = a.make_credential(RP, b"uid", "alice", None, false).unwrap();
    let e = b.assert(&AssertRequest { rp_id: RP, credential_ids: &[&id], salt: Some(&[1; 32]), pin: None, uv: false });
    assert_eq!(e.err(), Some(Fido2Error::NoCredential));
    let e =
        a.assert(&AssertRequest { rp_id: "other", credential_ids: &[&id], salt: Some(&[1; 32]), pin: None, uv: false });
    assert_eq!(e.err(), Some(Fido2Error::NoCredential));
    let mut bad = id.clone();
    bad[20] ^= 1;
    let e = a.assert(&AssertRequest { rp_id: RP, credential_ids: &[&bad], salt: Some(&[1; 32]), pin: None, uv: false });
    assert_eq!(e.err(), Some(Fido2Error::NoCredential));
}

#[test]
fn the_right_key_is_found_without_a_touch() {
    let f = fx(&[Options::default(), Options::default()]);
    let id = open(&f.keys[1], Duration::from_secs(5)).make_credential(RP, b"u", "alice", None, false).unwrap();
    let before: Vec<usize> = f.keys.iter().map(|k| k.presence_requests()).collect();
    for k in &f.keys {
        k.set_presence(Presence::Withhold);
    }
    let probe = |k: &SoftFido| {
        open(k, Duration::from_secs(5)).assert(&AssertRequest {
            rp_id: RP,
            credential_ids: &[&id],
            salt: None,
            pin: None,
            uv: false,
        })
    };
    assert_eq!(probe(&f.keys[0]).err(), Some(Fido2Error::NoCredential));
    let a = probe(&f.keys[1]).unwrap();
    assert_eq!(a.credential_id, id);
    assert!(a.secret.is_none());
    let after: Vec<usize> = f.keys.iter().map(|k| k.presence_requests()).collect();
    assert_eq!(before, after, "probing must not ask for a touch");
    assert!(f.keys[0].take_log().contains(&"getAssertion up=false".to_string()));
}

#[test]
fn withheld_touch_times_out_within_the_limit() {
    let f = fx(&[Options::default()]);
    let mut d = open(&f.keys[0], Duration::from_secs(2));
    let id = d.make_credential(RP, b"u", "alice", None, false).unwrap();
    f.keys[0].set_presence(Presence::Withhold);
    let t = Instant::now();
    let e = secret(&mut d, &id, &[1; 32], None).unwrap_err();
    let took = t.elapsed();
    assert_eq!(e, Fido2Error::Timeout(2));
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(4), "{took:?}");
    // A touch that comes late but in time still works.
    f.keys[0].set_presence(Presence::Delay(Duration::from_millis(700)));
    let mut d = open(&f.keys[0], Duration::from_secs(2));
    secret(&mut d, &id, &[1; 32], None).unwrap();
}

#[test]
fn pin_set_required_wrong_and_blocked() {
    for (protos, perms) in [(vec![PinProtocol::One], false), (vec![PinProtocol::Two], true)] {
        let f = fx(&[Options { pin_protocols: protos.clone(), token_permissions: perms, ..Default::default() }]);
        let k = &f.keys[0];
        let pin = Pin::new(b"1234").unwrap();
        let mut d = open(k, Duration::from_secs(5));
        assert_eq!(d.set_pin(&Pin::new(b"12").unwrap(), None).unwrap_err(), Fido2Error::PinPolicy);
        d.set_pin(&pin, None).unwrap();
        drop(d);
        let mut d = open(k, Duration::from_secs(5));
        assert_eq!(d.info().unwrap().option("clientPin"), Some(true));
        assert_eq!(d.make_credential(RP, b"u", "alice", None, false).unwrap_err(), Fido2Error::PinRequired);
        let id = d.make_credential(RP, b"u", "alice", Some(&pin), false).unwrap();
        let with_pin = secret(&mut d, &id, &[1; 32], Some(&pin)).unwrap();
        assert_eq!(secret(&mut d, &id, &[1; 32], Some(&pin)).unwrap(), with_pin);
        // Without the PIN the key answers, but with the other (not user-verified) secret.
        assert_ne!(secret(&mut d, &id, &[1; 32], None).unwrap(), with_pin, "{protos:?}");
        let wrong = Pin::new(b"9999").unwrap();
        assert_eq!(
            secret(&mut d, &id, &[1; 32], Some(&wrong)).unwrap_err(),
            Fido2Error::PinInvalid { retries: Some(7) }
        );
        assert_eq!(
            secret(&mut d, &id, &[1; 32], Some(&wrong)).unwrap_err(),
            Fido2Error::PinInvalid { retries: Some(6) }
        );
        assert_eq!(secret(&mut d, &id, &[1; 32], Some(&wrong)).unwrap_err(), Fido2Error::PinAuthBlocked);
        k.power_cycle();
        // The right PIN resets the count.
        assert_eq!(secret(&mut d, &id, &[1; 32], Some(&pin)).unwrap(), with_pin);
        assert_eq!(d.pin_retries().unwrap(), 8);
        let mut last = None;
        for i in 0..8 {
            if i % 3 == 0 {
                k.power_cycle();
            }
            last = Some(secret(&mut d, &id, &[1; 32], Some(&wrong)).unwrap_err());
        }
        assert_eq!(last, Some(Fido2Error::PinBlocked));
        k.power_cycle();
        assert_eq!(secret(&mut d, &id, &[1; 32], Some(&pin)).unwrap_err(), Fido2Error::PinBlocked);
        assert!(Fido2Error::PinBlocked.to_string().contains("reset"));
        let log = k.take_log().join("\n");
        let (p, token_cmd) = if perms { ("p2", "clientPIN 9 p2") } else { ("p1", "clientPIN 5 p1") };
        for want in [
            "clientPIN 3",
            token_cmd,
            &format!("getAssertion up=true hmac-secret {p} {p}"),
            &format!("makeCredential {p}"),
        ] {
            assert!(log.contains(want), "{want} not in\n{log}");
        }
    }
}

#[test]
fn change_pin() {
    let f = fx(&[Options { pin: Some("1234".into()), ..Default::default() }]);
    let mut d = open(&f.keys[0], Duration::from_secs(5));
    let (old, new) = (Pin::new(b"1234").unwrap(), Pin::new(b"abcdef").unwrap());
    assert_eq!(d.set_pin(&new, Some(&new)).unwrap_err(), Fido2Error::PinInvalid { retries: Some(7) });
    d.set_pin(&new, Some(&old)).unwrap();
    let id = d.make_credential(RP, b"u", "alice", Some(&new), false).unwrap();
    assert_eq!(
        d.make_credential(RP, b"u", "alice", Some(&old), false).unwrap_err(),
        Fido2Error::PinInvalid { retries: Some(7) }
    );
    secret(&mut d, &id, &[3; 32], Some(&new)).unwrap();
}

#[test]
fn socket_device_must_be_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("plain");
    std::fs::write(&p, b"").unwrap();
    let e = Device::open(&DevicePath::Socket(p), Duration::from_secs(1)).err().unwrap();
    assert!(e.to_string().contains("not a unix socket"), "{e}");
    let e = Device::open(&DevicePath::Socket(dir.path().join("absent")), Duration::from_secs(1)).err().unwrap();
    assert!(matches!(e, Fido2Error::Open { .. }), "{e}");
}

/// Yubico's python-fido2 (installed from PyPI into the target dir on first use) drives the same
/// authenticator: setPIN, register with hmac-secret and PIN, verify the packed attestation and
/// the assertion signature; then libfido2 must get the very same hmac-secret from it.
#[test]
fn independent_client_agrees() {
    let py = python_fido2();
    for proto in [PinProtocol::One, PinProtocol::Two] {
        let f = fx(&[Options { pin_protocols: vec![proto], ..Default::default() }]);
        let salt = [0x5au8; 32];
        let out = std::process::Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/softfido/py/crosscheck.py"))
            .arg(f.keys[0].path())
            .args(["4321", &hex::encode(salt)])
            .env("PYTHONPATH", &py)
            .output()
            .unwrap();
        assert!(out.status.success(), "python-fido2 failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["protocol"], proto.number(), "{v}");
        assert_eq!(v["retries"], 7, "{v}");
        let id = hex::decode(v["credential_id"].as_str().unwrap()).unwrap();
        let mut d = open(&f.keys[0], Duration::from_secs(5));
        let a = d
            .assert(&AssertRequest {
                rp_id: "example.com",
                credential_ids: &[&id],
                salt: Some(&salt),
                pin: Some(&Pin::new(b"4321").unwrap()),
                uv: false,
            })
            .unwrap();
        assert!(a.user_verified);
        assert_eq!(hex::encode(a.secret.unwrap().as_bytes()), v["output"].as_str().unwrap(), "{proto:?}");
    }
}

fn python_fido2() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-fido2-1.1.3");
    let probe = |d: &std::path::Path| {
        std::process::Command::new("python3")
            .args(["-c", "import fido2.client"])
            .env("PYTHONPATH", d)
            .stderr(std::process::Stdio::null())
            .status()
    };
    if !probe(&dir).is_ok_and(|s| s.success()) {
        let st = std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-conflicts",
                "--root-user-action=ignore",
                "--target",
            ])
            .arg(&dir)
            .arg("fido2==1.1.3")
            .status()
            .unwrap();
        assert!(st.success(), "pip install fido2 from PyPI failed");
    }
    dir
}

#[test]
fn builtin_user_verification() {
    let f = fx(&[Options { builtin_uv: true, ..Default::default() }, Options::default()]);
    let mut d = open(&f.keys[0], Duration::from_secs(5));
    assert_eq!(d.info().unwrap().option("uv"), Some(true));
    let id = d.make_credential(RP, b"u", "alice", None, true).unwrap();
    let get = |d: &mut Device, uv| {
        d.assert(&AssertRequest { rp_id: RP, credential_ids: &[&id], salt: Some(&[9; 32]), pin: None, uv }).unwrap()
    };
    let (with, without) = (get(&mut d, true), get(&mut d, false));
    assert!(with.user_verified && !without.user_verified);
    assert_ne!(with.secret.unwrap().as_bytes(), without.secret.unwrap().as_bytes());
    // Without built-in verification the request fails (libfido2 wants a PIN) instead of being
    // silently downgraded.
    let mut other = open(&f.keys[1], Duration::from_secs(5));
    let e = other.make_credential(RP, b"u", "alice", None, true).unwrap_err();
    assert!(matches!(e, Fido2Error::Unsupported(_) | Fido2Error::PinRequired), "{e}");
    assert!(f.keys[0].take_log().iter().any(|l| l.starts_with("clientPIN 6")), "UV went through the token command");
}

/// The library's protector flow with a recording Ui: the PIN prompt names the device and the
/// tries it has left; the touch is announced after the PIN, just before the key waits.
#[test]
fn pin_prompt_shows_the_keys_tries_left() {
    use dirseal::protector::{self, fido2::NewFido2, NewKind};
    use dirseal::secret::Passphrase;
    use dirseal::ui::{SecretPrompt, Ui, UiError};

    struct Rec(Vec<String>);
    impl Ui for Rec {
        fn secret(&mut self, p: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
            if let SecretPrompt::Pin { device, tries_left, .. } = p {
                self.0.push(format!("pin {device} {tries_left:?}"));
            }
            Ok(Passphrase::from_str_copy(if self.0.len() < 2 { "0000" } else { "1234" }))
        }
        fn touch(&mut self, name: &str, _: Option<&dirseal::ids::ProtectorId>) {
            self.0.push(format!("touch {name}"));
        }
    }
    let f = fx(&[Options { pin: Some("1234".into()), ..Default::default() }]);
    let mut config = dirseal::config::Config::default();
    config.fido2.socket_devices = vec![f.keys[0].path().to_path_buf()];
    let new = NewKind::Fido2(NewFido2 { device: None, pin: true, uv: false });
    let (rec, key) = protector::create("k", None, &new, &mut config, Some(&Passphrase::from_str_copy("1234"))).unwrap();
    let mut ui = Rec(Vec::new());
    let e = protector::unlock_with(&rec, &config, &mut ui).err().unwrap();
    assert!(e.to_string().contains("7 tries left"), "{e}");
    assert!(protector::unlock_with(&rec, &config, &mut ui).unwrap() == key);
    assert_eq!(ui.0, ["pin Security key Some(8)", "touch k", "pin Security key Some(7)", "touch k"]);
}
