//! The FIDO2 protector end to end: the real `dirseal` binary (a separate process) reaches
//! software authenticators served by this test through the socket devices of its root-owned
//! config, and libfido2 does the rest exactly as with a key on USB.
mod common;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{p, Env};
use dirseal_softfido::{Options, Presence, SoftFido};

struct Keys {
    env: Env,
    keys: Vec<SoftFido>,
}

/// An Env whose config names one socket device per `opts`, each served by a soft authenticator.
fn keys(opts: &[Options], touch_timeout_secs: u64) -> Keys {
    let env = Env::new();
    let paths: Vec<PathBuf> = (0..opts.len()).map(|i| env.etc.path().join(format!("key{i}.sock"))).collect();
    let keys = opts.iter().zip(&paths).map(|(o, path)| SoftFido::start(path, o.clone()).unwrap()).collect();
    let list = paths.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(", ");
    let cfg = fs::read_to_string(env.config()).unwrap();
    fs::write(
        env.config(),
        format!("{cfg}\n[fido2]\ntouch_timeout_secs = {touch_timeout_secs}\nsocket_devices = [{list}]\n"),
    )
    .unwrap();
    Keys { env, keys }
}

impl Keys {
    fn create(&self, name: &str, extra: &[&str], stdin: &str) -> String {
        let mut args = vec!["protector", "create", "--type", "fido2", "--name", name];
        args.extend_from_slice(extra);
        let out = self.env.ok(&args, stdin);
        out.split_whitespace()
            .find(|w| w.len() == 16 && w.chars().all(|c| c.is_ascii_hexdigit()))
            .unwrap_or_else(|| panic!("no id in {out}"))
            .to_string()
    }

    /// An encrypted dir with a password protector ("pw") and the fido2 protector `id`
    /// (`pin`: the key's PIN, asked when the protector is added).
    fn dir(&self, name: &str, id: &str, pin: &str) -> PathBuf {
        let d = self.env.mnt().join(name);
        fs::create_dir(&d).unwrap();
        self.env.ok(&["encrypt", p(&d), "--protector-name", &format!("{name}-pw")], "pw\n");
        fs::write(d.join("f"), name).unwrap();
        self.env.ok(&["policy", "add-protector", p(&d), "--protector", id], &format!("pw\n{pin}"));
        self.env.ok(&["lock", p(&d)], "");
        d
    }

    fn key_status(&self, d: &std::path::Path) -> String {
        self.env.status_json(d)["key"].as_str().unwrap().to_string()
    }
}

#[test]
fn create_lock_unlock_by_touch_then_fall_back() {
    dirseal_testfs::needs_root!();
    let k = keys(&[Options::default()], 3);
    let list: serde_json::Value = serde_json::from_str(&k.env.ok(&["fido2", "list", "--json"], "")).unwrap();
    assert_eq!(list[0]["path"], p(k.keys[0].path()), "{list}");
    assert!(list[0]["info"]["extensions"].as_array().unwrap().contains(&"hmac-secret".into()), "{list}");

    // libfido2's debug log (FIDO_DEBUG) is the environment's to switch on, never ours to print.
    let out = k.env.cmd(&["fido2", "list"]).env("FIDO_DEBUG", "1").output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("hmac-secret: yes"));

    let id = k.create("yubi", &[], "");
    assert_eq!(k.keys[0].touches(), 2, "make credential + first hmac-secret");
    let listed: serde_json::Value = serde_json::from_str(&k.env.ok(&["protector", "list", "--json"], "")).unwrap();
    assert!(listed.to_string().contains("\"fido2\""), "{listed}");
    let d = k.dir("home", &id, "");
    assert_eq!(k.key_status(&d), "locked");

    // Touch: nothing typed.
    let out = k.env.run(&["unlock", p(&d)], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Touch your security key (yubi)…"));
    assert_eq!(fs::read_to_string(d.join("f")).unwrap(), "home");
    k.env.ok(&["lock", p(&d)], "");

    // No touch: a clear timeout within the configured limit, then the password.
    k.keys[0].set_presence(Presence::Withhold);
    let t = Instant::now();
    let out = k.env.run(&["unlock", p(&d)], "pw\n");
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no touch on the security key within 3 s"), "{err}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    assert_eq!(k.key_status(&d), "unlocked");
    k.env.ok(&["lock", p(&d)], "");

    // No key at all: straight to the password, no waiting.
    k.keys[0].set_presence(Presence::Grant);
    let requests = k.keys[0].presence_requests();
    let path = k.keys[0].path().to_path_buf();
    drop(k.keys.into_iter().next());
    assert!(!path.exists());
    let t = Instant::now();
    k.env.ok(&["unlock", p(&d)], "pw\n");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(requests > 0);
    // Only the FIDO2 protector: a clear error naming what to do.
    let err = k.env.fails(&["protector", "verify", &id], "");
    assert!(err.contains("no connected security key holds this protector's credential; plug the key in"), "{err}");
    // Issue 44 (8): making a protector with no key at all is not about a credential (there is none
    // yet): it says no key is plugged in.
    let err = k.env.fails(&["protector", "create", "--type", "fido2", "--name", "new"], "");
    assert!(err.contains("no security key is plugged in"), "{err}");
    assert!(!err.contains("credential"), "{err}");
}

#[test]
fn two_keys_the_right_one_is_found_and_another_key_is_refused() {
    dirseal_testfs::needs_root!();
    let k = keys(&[Options::default(), Options::default()], 5);
    let err = k.env.fails(&["protector", "create", "--type", "fido2", "--name", "x"], "");
    assert!(err.contains("several security keys are connected"), "{err}");
    let err = k.env.fails(&["protector", "create", "--type", "fido2", "--name", "x", "--device", "/dev/hidraw9"], "");
    assert!(err.contains("no such security key is connected"), "{err}");
    let id = k.create("second", &["--device", p(k.keys[1].path())], "");
    assert_eq!((k.keys[0].touches(), k.keys[1].touches()), (0, 2));
    let d = k.dir("home", &id, "");
    k.env.ok(&["unlock", p(&d)], "");
    assert_eq!(k.key_status(&d), "unlocked");
    assert_eq!(k.keys[0].presence_requests(), 0, "the other key must never be asked for a touch");
    assert_eq!(k.keys[1].touches(), 4, "create 2, add-protector 1, unlock 1");
    k.env.ok(&["lock", p(&d)], "");

    // Only the wrong key present: refused without a touch; the password still works.
    let mut it = k.keys.into_iter();
    let first = it.next().unwrap();
    drop(it);
    let err = k.env.fails(&["protector", "verify", &id], "");
    assert!(err.contains("no connected security key holds"), "{err}");
    assert_eq!(first.presence_requests(), 0);
    k.env.ok(&["unlock", p(&d)], "pw\n");
}

#[test]
fn pin_required_wrong_pin_shows_retries_blocked_pin_is_clear() {
    dirseal_testfs::needs_root!();
    let k = keys(&[Options::default()], 5);
    let err = k.env.fails(&["protector", "create", "--type", "fido2", "--name", "x", "--pin"], "1234\n");
    assert!(err.contains("has no PIN set"), "{err}");
    let err = k.env.fails(&["protector", "create", "--type", "fido2", "--name", "x", "--uv"], "");
    assert!(err.contains("does not support built-in user verification"), "{err}");
    let err = k.env.fails(&["protector", "create", "--type", "fido2", "--name", "x", "--kdf-time-ms", "5"], "");
    assert!(err.contains("does not apply to fido2 protectors"), "{err}");
    drop(k);
    let k = keys(&[Options { pin: Some("1234".into()), ..Default::default() }], 5);
    let id = k.create("pinned", &["--pin"], "1234\n");
    let d = k.dir("home", &id, "1234\n");
    // Two protectors that need typing (password, key PIN): the user picks.
    let err = k.env.fails(&["unlock", p(&d)], "");
    assert!(err.contains("--protector"), "{err}");
    k.env.ok(&["unlock", p(&d), "--protector", &id], "1234\n");
    assert_eq!(k.key_status(&d), "unlocked");
    k.env.ok(&["lock", p(&d)], "");
    let err = k.env.fails(&["unlock", p(&d), "--protector", &id], "9999\n");
    assert!(err.contains("wrong PIN for the security key; 7 tries left"), "{err}");
    let err = k.env.fails(&["unlock", p(&d), "--protector", &id], "9999\n");
    assert!(err.contains("6 tries left"), "{err}");
    let err = k.env.fails(&["unlock", p(&d), "--protector", &id], "9999\n");
    assert!(err.contains("unplug it and plug it back in"), "{err}");
    k.keys[0].power_cycle();
    k.env.ok(&["unlock", p(&d), "--protector", &id], "1234\n");
    k.env.ok(&["lock", p(&d)], "");
    let mut last = String::new();
    for i in 0..8 {
        if i % 3 == 0 {
            k.keys[0].power_cycle();
        }
        last = k.env.fails(&["unlock", p(&d), "--protector", &id], "9999\n");
    }
    assert!(last.contains("PIN is blocked"), "{last}");
    k.keys[0].power_cycle();
    let err = k.env.fails(&["unlock", p(&d), "--protector", &id], "1234\n");
    assert!(err.contains("PIN is blocked after too many wrong PINs"), "{err}");
    let st = k.env.status_json(&d);
    let pw = st["protectors"].as_array().unwrap().iter().find(|r| r["name"] == "home-pw").unwrap()["id"].clone();
    k.env.ok(&["unlock", p(&d), "--protector", pw.as_str().unwrap()], "pw\n");
    assert_eq!(k.key_status(&d), "unlocked");
}

#[test]
fn one_key_opens_two_homes() {
    dirseal_testfs::needs_root!();
    let k = keys(&[Options::default()], 5);
    let id = k.create("shared", &[], "");
    let a = k.dir("alice", &id, "");
    let b = k.dir("bob", &id, "");
    k.env.ok(&["unlock", p(&a)], "");
    k.env.ok(&["unlock", p(&b)], "");
    assert_eq!(fs::read_to_string(a.join("f")).unwrap(), "alice");
    assert_eq!(fs::read_to_string(b.join("f")).unwrap(), "bob");
}

/// A login has only the login password: a protector that needs the security key's own PIN is
/// never offered it (each wrong PIN would spend one of the key's eight tries), even when the
/// password happens to be the PIN.
#[test]
fn login_never_offers_the_password_as_a_security_key_pin() {
    dirseal_testfs::needs_root!();
    use dirseal::ops::{Dirseal, NewProtector, Pick, ProtectorChoice};
    use dirseal::protector::{KindOptions, NewKind};
    use dirseal::secret::Passphrase;
    use dirseal::ui::{SecretPrompt, Ui, UiError};

    struct Always(&'static str);
    impl Ui for Always {
        fn secret(&mut self, _: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
            Ok(Passphrase::from_str_copy(self.0))
        }
    }
    let k = keys(&[Options { pin: Some("1234".into()), ..Default::default() }], 5);
    let mut ds = Dirseal::open(&k.env.config(), Some(&k.env.keystore())).unwrap();
    let d = k.env.mnt().join("home");
    fs::create_dir(&d).unwrap();
    let pw = NewKind::named("password", KindOptions::default()).unwrap();
    let (policy, _) = ds
        .encrypt(
            &d,
            ProtectorChoice::New(NewProtector { name: "pw".into(), uid: Some(4242), kind: pw }),
            &mut Always("pw"),
        )
        .unwrap();
    // The password proves access, then the new protector takes the key's PIN.
    let fido = NewKind::named("fido2", KindOptions::new(vec![("pin".into(), "true".into())])).unwrap();
    let key = ProtectorChoice::New(NewProtector { name: "key".into(), uid: Some(4242), kind: fido });
    let mut answers = Seq(vec!["pw", "1234"]);
    ds.add_protector_to_policy(&policy.id, Pick { protector: None }, key, &mut answers).unwrap();
    let requests = k.keys[0].presence_requests();
    assert_eq!(k.keys[0].pin_retries(), 8);

    // Every prompt answered with the key's PIN: the password protector refuses it, and the key
    // is never asked.
    let policy = ds.policy_of(&d).unwrap();
    let login = ds.login(&policy, 4242, &mut Always("1234")).unwrap();
    assert!(login.opened.is_none());
    assert_eq!((k.keys[0].presence_requests(), k.keys[0].pin_retries()), (requests, 8));
    assert!(ds.login(&policy, 4242, &mut Always("pw")).unwrap().opened.is_some());

    struct Seq(Vec<&'static str>);
    impl Ui for Seq {
        fn secret(&mut self, _: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
            Ok(Passphrase::from_str_copy(self.0.remove(0)))
        }
    }
}
