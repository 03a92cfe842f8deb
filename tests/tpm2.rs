//! The TPM sealing machinery against a real software TPM (swtpm), one per test.
use std::io::Write;
use std::time::{Duration, Instant};

use dirseal::config::Config;
use dirseal::config::{Argon2Params, MIN_MEMORY_KIB};
use dirseal::ids::ProtectorId;
use dirseal::keystore::Keystore;
use dirseal::presence::Presence;
use dirseal::protector::tpm2::NewTpm2;
use dirseal::protector::{self, NewKind, ProtectorError};
use dirseal::secret::{Passphrase, ProtectorKey};
use dirseal::tpm2::{self, DaParameters, PcrSet, PinTries, ResetCode, SealedKey, Tcti, Tpm, Tpm2Error};
use dirseal_testfs::Swtpm;

/// Argon2id at its minimum: tests check behaviour, not strength.
const FAST: Argon2Params = Argon2Params { time_cost: 1, memory_kib: MIN_MEMORY_KIB, parallelism: 1 };

fn tcti(t: &Swtpm) -> Tcti {
    t.tcti().parse().expect("swtpm tcti")
}

fn open(t: &Swtpm) -> Tpm {
    Tpm::open(&tcti(t)).unwrap_or_else(|e| panic!("{e}"))
}

fn pin(s: &str) -> Passphrase {
    Passphrase::from_str_copy(s)
}

fn counter(t: &Swtpm) -> u32 {
    open(t).da_status().unwrap().lockout_counter
}

fn seal(t: &Swtpm, key: &ProtectorKey, p: Option<&str>, pcrs: &str) -> SealedKey {
    let pcrs: PcrSet = if pcrs.is_empty() { PcrSet::default() } else { pcrs.parse().unwrap() };
    open(t).seal(key, p.map(pin).as_ref(), &pcrs, FAST).unwrap_or_else(|e| panic!("seal: {e}"))
}

fn unseal(t: &Swtpm, s: &SealedKey, p: Option<&str>) -> Result<ProtectorKey, Tpm2Error> {
    open(t).unseal(s, p.map(pin).as_ref(), Presence::AtDevice, 0)
}

#[test]
fn right_pin_unseals_and_costs_no_try() {
    let t = Swtpm::start();
    let st = open(&t).da_status().unwrap();
    assert_eq!((st.lockout_counter, st.max_tries, st.in_lockout), (0, 3, false), "{st:?}");
    let key = ProtectorKey::random();
    let sealed = seal(&t, &key, Some("1234"), "");
    assert!(sealed.pin.is_some() && sealed.pcrs.is_empty());
    for _ in 0..4 {
        assert!(unseal(&t, &sealed, Some("1234")).unwrap() == key);
    }
    assert_eq!(counter(&t), 0, "a right PIN must not count as a failure");
    // Survives a round trip through its JSON form.
    let again: SealedKey = serde_json::from_str(&serde_json::to_string(&sealed).unwrap()).unwrap();
    assert!(unseal(&t, &again, Some("1234")).unwrap() == key);
    assert!(matches!(unseal(&t, &sealed, None), Err(Tpm2Error::PinRequired)));
    assert_eq!(counter(&t), 0);
}

#[test]
fn wrong_pin_costs_exactly_one_try() {
    let t = Swtpm::start();
    let key = ProtectorKey::random();
    let sealed = seal(&t, &key, Some("1234"), "");
    let e = unseal(&t, &sealed, Some("1235")).err().expect("a wrong PIN must fail");
    assert!(matches!(e, Tpm2Error::WrongPin { tries_left: Some(2) }), "{e}");
    assert!(e.to_string().contains("2 tries left"), "{e}");
    let st = open(&t).da_status().unwrap();
    assert_eq!((st.lockout_counter, st.tries_left()), (1, 2));
    assert!(unseal(&t, &sealed, Some("1234")).unwrap() == key);
    assert_eq!(counter(&t), 1, "the right PIN neither costs nor restores a try");
}

#[test]
fn lockout_is_clear_and_tries_come_back_after_the_recovery_time() {
    let t = Swtpm::start();
    let p = DaParameters { max_tries: 3, recovery_time_s: 2, lockout_recovery_s: 10 };
    tpm2::setup(&tcti(&t), p, &ResetCode::generate()).unwrap();
    let st = open(&t).da_status().unwrap();
    assert_eq!((st.max_tries, st.recovery_time_s, st.lockout_recovery_s), (3, 2, 10));
    let key = ProtectorKey::random();
    let sealed = seal(&t, &key, Some("0000"), "");
    let mut left = vec![];
    for _ in 0..3 {
        match unseal(&t, &sealed, Some("9999")) {
            Err(Tpm2Error::WrongPin { tries_left }) => left.push(tries_left),
            other => panic!("expected a wrong PIN, got {:?}", other.err().map(|e| e.to_string())),
        }
    }
    // Within 2 s of each other the TPM may already have forgiven one; never more than one.
    assert!(left[0] == Some(2), "{left:?}");
    let st = open(&t).da_status().unwrap();
    if st.in_lockout {
        let e = unseal(&t, &sealed, Some("0000")).err().expect("locked out: even the right PIN is refused");
        assert!(matches!(e, Tpm2Error::Lockout { recovery_time_s: Some(2) }), "{e}");
        assert!(e.to_string().contains("at most 2 s"), "{e}");
        assert_eq!(st.tries_left(), 0);
    }
    std::thread::sleep(Duration::from_millis(2500));
    let st = open(&t).da_status().unwrap();
    assert!(!st.in_lockout && st.tries_left() >= 1, "{st:?}");
    assert!(unseal(&t, &sealed, Some("0000")).unwrap() == key);
}

#[test]
fn lockout_is_reported_before_the_pin_is_judged() {
    let t = Swtpm::start();
    // 1000 s recovery (the fresh default): the lockout lasts for the whole test.
    let key = ProtectorKey::random();
    let sealed = seal(&t, &key, Some("42"), "");
    for _ in 0..3 {
        assert!(matches!(unseal(&t, &sealed, Some("41")), Err(Tpm2Error::WrongPin { .. })));
    }
    let st = open(&t).da_status().unwrap();
    assert!(st.in_lockout && st.tries_left() == 0, "{st:?}");
    let e = unseal(&t, &sealed, Some("42")).err().expect("locked out");
    assert!(matches!(e, Tpm2Error::Lockout { recovery_time_s: Some(1000) }), "{e}");
    assert!(e.to_string().contains("17 min"), "{e}");
    // A protector with no PIN has nothing to guess (noDA): the lockout does not touch it.
    let free = seal(&t, &key, None, "");
    assert!(unseal(&t, &free, None).unwrap() == key);
    // Unowned (this test's TPM is not set up): anyone resets it, which is why PIN protectors
    // refuse such a TPM.
    tpm2::reset_lockout(&tcti(&t), None).unwrap();
    let st = open(&t).da_status().unwrap();
    assert!(!st.in_lockout && st.lockout_counter == 0, "{st:?}");
    assert!(unseal(&t, &sealed, Some("42")).unwrap() == key);
}

#[test]
fn no_pin_unseals_without_asking() {
    let t = Swtpm::start();
    let key = ProtectorKey::random();
    let sealed = seal(&t, &key, None, "");
    assert!(sealed.pin.is_none());
    assert!(unseal(&t, &sealed, None).unwrap() == key);
    assert_eq!(counter(&t), 0);
}

#[test]
fn pcr_binding_refuses_after_the_pcr_changes_without_costing_a_try() {
    let t = Swtpm::start();
    let key = ProtectorKey::random();
    let sealed = seal(&t, &key, Some("1234"), "7,11");
    assert_eq!(sealed.pcrs.to_string(), "7,11");
    let no_pin = seal(&t, &key, None, "7");
    assert!(unseal(&t, &sealed, Some("1234")).unwrap() == key);
    assert!(unseal(&t, &no_pin, None).unwrap() == key);
    // A wrong PIN is still a wrong PIN under a policy session, and still counts.
    assert!(matches!(unseal(&t, &sealed, Some("1111")), Err(Tpm2Error::WrongPin { tries_left: Some(2) })));
    t.pcr_extend(11);
    let e = unseal(&t, &sealed, Some("1234")).err().expect("PCR 11 changed");
    assert!(matches!(&e, Tpm2Error::PcrMismatch { .. }), "{e}");
    assert!(e.to_string().contains("PCRs 7,11 changed"), "{e}");
    assert!(unseal(&t, &no_pin, None).unwrap() == key, "PCR 7 did not change");
    t.pcr_extend(7);
    assert!(matches!(unseal(&t, &no_pin, None), Err(Tpm2Error::PcrMismatch { .. })));
    assert_eq!(counter(&t), 1, "a PCR refusal must not cost a try");
}

#[test]
fn a_blob_copied_to_another_tpm_refuses_cleanly() {
    let a = Swtpm::start();
    let b = Swtpm::start();
    let key = ProtectorKey::random();
    let sealed = seal(&a, &key, Some("1234"), "");
    let e = unseal(&b, &sealed, Some("1234")).err().expect("another TPM");
    assert!(matches!(e, Tpm2Error::ForeignBlob), "{e}");
    assert_eq!(counter(&b), 0);
    let mut damaged = sealed.clone();
    let n = damaged.private.len();
    damaged.private[n - 1] ^= 1;
    let e = unseal(&a, &damaged, Some("1234")).err().expect("damaged");
    assert!(matches!(e, Tpm2Error::ForeignBlob | Tpm2Error::Corrupt(_)), "{e}");
    damaged = sealed.clone();
    damaged.public.truncate(10);
    assert!(matches!(unseal(&a, &damaged, Some("1234")), Err(Tpm2Error::Corrupt(_))));
    assert!(unseal(&a, &sealed, Some("1234")).unwrap() == key);
}

#[test]
fn a_missing_tpm_is_a_clear_error() {
    let t = Swtpm::start();
    let gone = tcti(&t);
    drop(t);
    let e = Tpm::open(&gone).err().expect("swtpm is gone");
    assert!(matches!(e, Tpm2Error::Unavailable { .. }), "{e}");
    assert!(e.to_string().contains("no usable TPM at swtpm:host=127.0.0.1"), "{e}");
    let e = Tpm::open(&"device:/nonexistent/tpmrm0".parse().unwrap()).err().expect("no device");
    assert!(e.to_string().contains("no usable TPM at device:/nonexistent/tpmrm0"), "{e}");
}

/// The golden files: a TPM state, keys sealed in it and a TPM protector record made by an earlier
/// build. If this fails, the
/// sealing format changed: old protectors would stop opening.
const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tpm2-golden");

#[derive(serde::Serialize, serde::Deserialize)]
struct Golden {
    pin: String,
    #[serde(with = "hex::serde")]
    key: Vec<u8>,
    sealed: SealedKey,
    pcr_sealed: SealedKey,
    /// A whole protector record (`protector.json`) and the protector key it gives.
    protector_id: ProtectorId,
    #[serde(with = "hex::serde")]
    protector_key: Vec<u8>,
}

fn config_for(tcti: &str) -> Config {
    let mut c = Config { argon2: Some(FAST), ..Config::default() };
    c.tpm2.tcti = Some(tcti.parse().unwrap());
    c
}

#[test]
fn golden_sealed_key_still_unseals() {
    let g: Golden = serde_json::from_slice(&std::fs::read(format!("{GOLDEN}/sealed.json")).unwrap()).unwrap();
    let t = Swtpm::start_with_state(std::path::Path::new(&format!("{GOLDEN}/state")));
    let key = unseal(&t, &g.sealed, Some(&g.pin)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(key.as_bytes().as_slice(), g.key.as_slice());
    let key = unseal(&t, &g.pcr_sealed, Some(&g.pin)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(key.as_bytes().as_slice(), g.key.as_slice());

    // The protector record, read from a keystore as dirseal reads it, opens with the PIN.
    let tmp = tempfile::tempdir().unwrap();
    // Made by the keystore itself: root's alone (0700), as it requires.
    let ks = tmp.path().join("ks");
    let store = Keystore::open(&ks).unwrap();
    let file = ks.join(format!("protectors/{}.json", g.protector_id));
    std::fs::copy(format!("{GOLDEN}/protector.json"), &file).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let rec = store.protector(&g.protector_id).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rec.kind.name(), "tpm2");
    let config = config_for(&t.tcti());
    let pkey =
        protector::unlock(&rec, &config, Some(&pin(&g.pin)), Presence::AtDevice).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pkey.as_bytes().as_slice(), g.protector_key.as_slice());
    let e =
        protector::unlock(&rec, &config, Some(&pin("0000")), Presence::AtDevice).err().expect("a wrong PIN is refused");
    assert!(e.is_wrong_secret(), "{e}");
    assert!(matches!(tpm_error(&e), Some(Tpm2Error::WrongPin { tries_left: Some(2) })), "{e}");
}

/// Writes new golden files (run by hand: `DIRSEAL_GOLDEN_OUT=tests/data/tpm2-golden cargo test
/// --test tpm2 make_golden -- --ignored`), then commit them.
#[test]
#[ignore = "generator, run by hand"]
fn make_golden() {
    let out = std::path::PathBuf::from(std::env::var("DIRSEAL_GOLDEN_OUT").expect("DIRSEAL_GOLDEN_OUT"));
    let mut t = Swtpm::start_owned();
    let key = ProtectorKey::random();
    let new = NewKind::Tpm2(NewTpm2 { no_pin: false, pcrs: "7".parse().unwrap(), ..Default::default() });
    let (rec, pkey) =
        protector::create("golden", Some(1000), &new, &mut config_for(&t.tcti()), Some(&pin("2580"))).unwrap();
    let ks = tempfile::tempdir().unwrap();
    Keystore::open(ks.path()).unwrap().save_protector(&rec).unwrap();
    std::fs::copy(ks.path().join(format!("protectors/{}.json", rec.id)), out.join("protector.json")).unwrap();
    let g = Golden {
        pin: "2580".into(),
        key: key.as_bytes().to_vec(),
        sealed: seal(&t, &key, Some("2580"), ""),
        pcr_sealed: seal(&t, &key, Some("2580"), "0,7"),
        protector_id: rec.id,
        protector_key: pkey.as_bytes().to_vec(),
    };
    t.stop();
    std::fs::create_dir_all(out.join("state")).unwrap();
    for e in std::fs::read_dir(t.state_dir()).unwrap() {
        let e = e.unwrap();
        // swtpm's .lock is empty and recreated on start.
        if e.file_name() != ".lock" {
            std::fs::copy(e.path(), out.join("state").join(e.file_name())).unwrap();
        }
    }
    std::fs::write(out.join("sealed.json"), serde_json::to_string_pretty(&g).unwrap()).unwrap();
}

/// Runs the real `dirseal` binary with a config whose `tpm2.tcti` is `tcti`.
fn dirseal(tcti: &str, args: &[&str]) -> (bool, String, String) {
    dirseal_in(tcti, args, "")
}

/// [`dirseal`] with `stdin` as its standard input.
fn dirseal_in(tcti: &str, args: &[&str], stdin: &str) -> (bool, String, String) {
    let etc = tempfile::tempdir().unwrap();
    let config = etc.path().join("config.toml");
    std::fs::write(&config, format!("[tpm2]\ntcti = \"{tcti}\"\n")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dirseal"))
        .args(args)
        .env("DIRSEAL_CONFIG", &config)
        .env("DIRSEAL_KEYSTORE", etc.path().join("ks"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A closed pipe (the program did not read) is not an error here.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), s(&out.stdout), s(&out.stderr))
}

fn status_json(tcti: &str) -> serde_json::Value {
    let (ok, out, err) = dirseal(tcti, &["tpm2", "status", "--json"]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The reset code in `dirseal tpm2 setup`'s output.
fn reset_code(out: &str) -> String {
    let code = out.split_whitespace().find(|w| w.len() == 55 && w.matches('-').count() == 7);
    code.unwrap_or_else(|| panic!("no reset code in {out}")).to_string()
}

/// `code` with one digit of group `group` (1-based) changed.
fn mistype(code: &str, group: usize) -> String {
    let mut b = code.as_bytes().to_vec();
    let i = (group - 1) * 7 + 2;
    b[i] = if b[i] == b'9' { b'0' } else { b[i] + 1 };
    String::from_utf8(b).unwrap()
}

#[test]
fn cli_setup_owns_the_lockout_and_changes_what_status_reports() {
    dirseal_testfs::needs_root!();
    let t = Swtpm::start();
    let s = status_json(&t.tcti());
    assert_eq!(s["present"], true);
    assert_eq!((s["max_tries"].as_u64(), s["tries_left"].as_u64()), (Some(3), Some(3)), "{s}");
    assert_eq!((s["recovery_time_s"].as_u64(), s["in_lockout"].as_bool()), (Some(1000), Some(false)), "{s}");
    assert_eq!(s["lockout_owned"], false, "{s}");
    let (ok, out, _) = dirseal(&t.tcti(), &["tpm2", "status"]);
    assert!(ok && out.contains("lockout owned:     no") && out.contains("dirseal tpm2 setup"), "{out}");
    let (ok, _, err) = dirseal(&t.tcti(), &["tpm2", "setup", "--max-tries", "0"]);
    assert!(!ok && err.contains("at least 1"), "{err}");
    // Without --yes the code must be typed back.
    let (ok, _, err) = dirseal(&t.tcti(), &["tpm2", "setup"]);
    assert!(!ok && err.contains("--yes"), "{err}");
    assert_eq!(status_json(&t.tcti())["lockout_owned"], false);

    let (ok, out, err) = dirseal(&t.tcti(), &["tpm2", "setup", "--yes", "--max-tries", "5", "--recovery-time", "2"]);
    assert!(ok, "{err}");
    assert!(out.contains("5 tries, one forgiven every 2 s, lockout recovery 10 min"), "{out}");
    let code = reset_code(&out);
    assert!(ResetCode::parse(&pin(&code)).is_ok(), "{code}");
    let s = status_json(&t.tcti());
    assert_eq!((s["max_tries"].as_u64(), s["tries_left"].as_u64()), (Some(5), Some(5)), "{s}");
    assert_eq!((s["recovery_time_s"].as_u64(), s["lockout_recovery_s"].as_u64()), (Some(2), Some(600)), "{s}");
    assert_eq!(s["lockout_owned"], true, "{s}");
    // Set up once: again, it says the protection holds and changes nothing.
    let (ok, out, err) = dirseal(&t.tcti(), &["tpm2", "setup", "--yes"]);
    assert!(ok && out.contains("already has a password") && !out.contains(&code[..6]), "{out}{err}");
    // Typed back on stdin (as on a terminal, one line), the code is taken.
    let (ok, out, err) = dirseal_in(&t.tcti(), &["tpm2", "setup", "--recovery-time", "1000"], &format!("{code}\n"));
    assert!(ok && out.contains("5 tries, one forgiven every 17 min"), "{out}{err}");

    // A wrong PIN shows in the status; reset-lockout with the code forgets it.
    let sealed = seal(&t, &ProtectorKey::random(), Some("1"), "");
    assert!(unseal(&t, &sealed, Some("2")).is_err());
    let (ok, out, err) = dirseal(&t.tcti(), &["tpm2", "status"]);
    assert!(ok, "{err}");
    assert!(out.contains("tries left:        4 of 5") && out.contains("in lockout:        no"), "{out}");
    assert!(out.contains("lockout owned:     yes"), "{out}");
    assert!(!err.contains("WARNING"), "libtss2 noise must not reach the user: {err}");
    let (ok, _, err) = dirseal(&t.tcti(), &["tpm2", "reset-lockout"]);
    assert!(!ok && err.contains("no secret was given"), "{err}");
    assert_eq!(status_json(&t.tcti())["tries_left"].as_u64(), Some(4));
    // A mistyped code names its group and does not reach the TPM (no lockout-hierarchy penalty).
    let (ok, _, err) = dirseal_in(&t.tcti(), &["tpm2", "reset-lockout"], &format!("{}\n", mistype(&code, 3)));
    assert!(!ok && err.contains("mistyped") && err.contains("group 3"), "{err}");
    let (ok, out, err) = dirseal_in(&t.tcti(), &["tpm2", "reset-lockout"], &format!("{code}\n"));
    assert!(ok && out.contains("forgot every counted wrong PIN"), "{out}{err}");
    assert_eq!(status_json(&t.tcti())["tries_left"].as_u64(), Some(5));
    // A valid code that is not this TPM's: refused, and the lockout hierarchy rests 10 min.
    let other = ResetCode::generate().to_display().to_string();
    let (ok, _, err) = dirseal_in(&t.tcti(), &["tpm2", "reset-lockout"], &format!("{other}\n"));
    assert!(!ok && err.contains("reset code is wrong") && err.contains("10 min"), "{err}");
    let (ok, _, err) = dirseal_in(&t.tcti(), &["tpm2", "reset-lockout"], &format!("{code}\n"));
    assert!(!ok && err.contains("refuses its lockout hierarchy"), "{err}");
}

/// Regression (issue 20): with the lockout hierarchy's password empty, a thief reset the count of
/// wrong PINs after every guess and found a 4-digit PIN in 38 guesses. After setup, 100 guesses
/// with both kinds of reset attempt between them do not find it.
#[test]
fn after_setup_100_guesses_with_resets_between_them_do_not_find_a_4_digit_pin() {
    dirseal_testfs::needs_root!();
    let t = Swtpm::start();
    let (ok, out, err) = dirseal(&t.tcti(), &["tpm2", "setup", "--yes"]);
    assert!(ok && out.contains("6 tries, one forgiven every 2 h"), "{out}{err}");
    // Among the first 100 guesses, so that without the fix this test finds it.
    let secret = "0042";
    let key = ProtectorKey::random();
    let sealed = seal(&t, &key, Some(secret), "");
    let started = Instant::now();
    let (mut wrong, mut locked) = (0, 0);
    for guess in 0..100 {
        match unseal(&t, &sealed, Some(&format!("{guess:04}"))) {
            Ok(_) => panic!("guess {guess} found the PIN"),
            Err(Tpm2Error::WrongPin { .. }) => wrong += 1,
            Err(Tpm2Error::Lockout { .. }) => locked += 1,
            Err(e) => panic!("guess {guess}: {e}"),
        }
        // tpm2-tools with the empty lockout password; dirseal's reset without the code.
        let e = t.tool(&["tpm2_dictionarylockout", "-c"]).expect_err("an empty lockout password must be refused");
        assert!(e.contains("0x98E") || e.contains("0x921"), "{e}");
        let (ok, _, err) = dirseal(&t.tcti(), &["tpm2", "reset-lockout"]);
        assert!(!ok, "dirseal reset the lockout without the code: {err}");
        assert!(matches!(tpm2::reset_lockout(&tcti(&t), None), Err(Tpm2Error::ResetCodeNeeded)));
    }
    eprintln!(
        "100 guesses with resets between them in {:?}: {wrong} judged wrong, {locked} refused in lockout",
        started.elapsed()
    );
    assert_eq!((wrong, locked), (6, 94));
    let st = open(&t).da_status().unwrap();
    assert!(st.in_lockout && st.lockout_owned, "{st:?}");
}

/// The one rule for spending PIN tries.
#[test]
fn pin_tries_keep_the_last_ones_for_the_device_and_pace_callers() {
    let rule = PinTries { tries_left: 3, min_local_tries: 2 };
    assert!(rule.may_try(false, None).is_ok());
    assert!(rule.may_try(true, None).is_ok());
    let kept = PinTries { tries_left: 2, min_local_tries: 2 };
    let e = kept.may_try(false, None).unwrap_err();
    assert!(matches!(e, Tpm2Error::TriesKept { tries_left: 2, min: 2 }), "{e}");
    assert!(e.to_string().contains("kept for the person at the device"), "{e}");
    assert!(kept.may_try(true, None).is_ok());
    let e = rule.may_try(true, Some(Duration::from_millis(500))).unwrap_err();
    assert!(matches!(e, Tpm2Error::TooSoon { wait_s: 3 }), "{e}");
    assert!(rule.may_try(true, Some(PinTries::MIN_INTERVAL)).is_ok());
}

#[test]
fn a_pin_protector_refuses_an_unowned_lockout() {
    let t = Swtpm::start();
    let mut config = config_for(&t.tcti());
    let new = NewKind::Tpm2(NewTpm2::default());
    let e = protector::create("p", None, &new, &mut config, Some(&pin("1234"))).err().expect("unowned: refused");
    assert!(matches!(tpm_error(&e), Some(Tpm2Error::LockoutNotOwned)), "{e}");
    let free = NewKind::Tpm2(NewTpm2 { no_pin: true, ..Default::default() });
    assert!(protector::create("q", None, &free, &mut config, None).is_ok());
    t.own_lockout(Swtpm::OWNER_AUTH);
    assert!(protector::create("p", None, &new, &mut config, Some(&pin("1234"))).is_ok());
}

/// Issue 44 (8): a machine without a TPM device was told "response code not recognized" and the
/// TCTI hint twice; it is told it has no TPM, once.
#[test]
fn a_missing_tpm_device_is_said_plainly() {
    dirseal_testfs::needs_root!();
    let s = status_json("device:/dev/dirseal-test-no-tpm");
    let e = s["error"].as_str().unwrap();
    assert!(e.contains("/dev/dirseal-test-no-tpm does not exist: this machine has no TPM 2.0"), "{s}");
    assert!(!e.contains("response code"), "{s}");
    assert_eq!(e.matches("tpm2.tcti").count(), 1, "{s}");
    let (ok, out, _) = dirseal("device:/dev/dirseal-test-no-tpm", &["tpm2", "status"]);
    assert!(ok && out.matches("tpm2.tcti").count() == 1, "{out}");
}

#[test]
fn cli_status_without_a_tpm_says_so() {
    dirseal_testfs::needs_root!();
    let t = Swtpm::start();
    let gone = t.tcti();
    drop(t);
    let s = status_json(&gone);
    assert_eq!(s["present"], false, "{s}");
    assert!(s["error"].as_str().unwrap().contains("no usable TPM"), "{s}");
    let (ok, _, err) = dirseal(&gone, &["tpm2", "setup", "--yes"]);
    assert!(!ok && err.contains("no usable TPM at swtpm:"), "{err}");
    assert!(!err.contains("WARNING"), "{err}");
}

/// A login front end's Ui: every password or PIN prompt gets the one typed secret.
struct LoginUi {
    typed: &'static str,
    network: bool,
}

impl dirseal::ui::Ui for LoginUi {
    fn secret(&mut self, p: &dirseal::ui::SecretPrompt<'_>) -> Result<Passphrase, dirseal::ui::UiError> {
        use dirseal::ui::SecretPrompt::*;
        match p {
            Password { .. } | Pin { .. } | NewPin { .. } => Ok(pin(self.typed)),
            _ => Err(dirseal::ui::UiError::Cancelled),
        }
    }
    fn presence(&self) -> Presence {
        if self.network {
            Presence::Elsewhere
        } else {
            Presence::AtDevice
        }
    }
}

/// A keystore with one TPM protector (PIN 1234, uid 1000) opening one policy.
fn login_setup(tcti: &str) -> (tempfile::TempDir, dirseal::ops::Dirseal, dirseal::keystore::PolicyRecord) {
    use dirseal::ops::{Dirseal, NewProtector};
    let etc = tempfile::tempdir().unwrap();
    let cfg = etc.path().join("config.toml");
    config_for(tcti).save(&cfg).unwrap();
    let mut ds = Dirseal::open(&cfg, Some(&etc.path().join("ks"))).unwrap();
    let new = NewProtector { name: "tpm".into(), uid: Some(1000), kind: NewKind::Tpm2(NewTpm2::default()) };
    let (rec, pkey) = ds.create_protector(&new, &mut LoginUi { typed: "1234", network: false }).unwrap();
    let master = dirseal::secret::MasterKey::random();
    let mut policy = dirseal::keystore::PolicyRecord::new(dirseal::fscrypt::key_identifier(&master), None);
    policy.add_protector(&rec.id, &pkey, &master);
    ds.keystore().save_policy(&policy).unwrap();
    (etc, ds, policy)
}

#[test]
fn login_tries_the_tpm_pin_once_and_refuses_network_logins_when_tries_are_few() {
    let t = Swtpm::start_owned();
    let (_etc, ds, policy) = login_setup(&t.tcti());
    let login = |typed, network| ds.login(&policy, 1000, &mut LoginUi { typed, network }).unwrap();

    // Over the network with 3 tries left, more than min_local_tries (2): allowed.
    let l = login("1234", true);
    assert!(l.opened.is_some() && l.problems.is_empty());
    // A wrong secret costs exactly one try and is reported, never retried.
    let l = login("0000", false);
    assert!(l.opened.is_none());
    assert_eq!(l.problems.len(), 1);
    assert!(l.problems[0].1.to_string().contains("wrong TPM PIN; 2 tries left"), "{}", l.problems[0].1);
    assert_eq!(counter(&t), 1);
    // 2 tries left, the ones kept for the device: a network login is refused before the TPM is
    // asked, and costs nothing.
    let l = login("1234", true);
    assert!(l.opened.is_none());
    assert!(l.problems[0].1.to_string().contains("the last 2 are kept for the person at the device"));
    assert_eq!(counter(&t), 1);
    // At the device it still opens.
    assert!(login("1234", false).opened.is_some());
    assert_eq!(counter(&t), 1);
}

#[test]
fn login_skips_a_missing_tpm_silently() {
    let t = Swtpm::start_owned();
    let (etc, _ds, policy) = login_setup(&t.tcti());
    drop(t);
    let ds = dirseal::ops::Dirseal::open(&etc.path().join("config.toml"), Some(&etc.path().join("ks"))).unwrap();
    let l = ds.login(&policy, 1000, &mut LoginUi { typed: "1234", network: false }).unwrap();
    assert!(l.opened.is_none());
    assert!(l.problems.is_empty(), "{:?}", l.problems.iter().map(|p| p.1.to_string()).collect::<Vec<_>>());
}

/// The TPM's own error inside a protector's.
fn tpm_error(e: &ProtectorError) -> Option<&Tpm2Error> {
    e.kind_error()?.downcast_ref()
}

/// A login from elsewhere whose PIN prompt waits until every other one has been shown its prompt
/// (the check of tries left done), so all then ask the TPM at once: the review's race.
struct RacingUi<'a> {
    typed: &'static str,
    shown: &'a std::sync::Barrier,
}

impl dirseal::ui::Ui for RacingUi<'_> {
    fn secret(&mut self, _: &dirseal::ui::SecretPrompt<'_>) -> Result<Passphrase, dirseal::ui::UiError> {
        self.shown.wait();
        Ok(pin(self.typed))
    }
    fn presence(&self) -> Presence {
        Presence::Elsewhere
    }
}

/// Issue 41 (1): logins from elsewhere at the same moment all saw "3 tries left" and all spent a
/// try, locking the TPM. The tries kept for the device (min_local_tries 2 of 3) are decided under
/// one machine-wide lock, from the check to the TPM's answer: exactly one try is spent.
#[test]
fn simultaneous_logins_from_elsewhere_spend_no_try_kept_for_the_device() {
    dirseal_testfs::needs_root!();
    let t = Swtpm::start_owned();
    let (_etc, ds, policy) = login_setup(&t.tcti());
    const LOGINS: usize = 4;
    let shown = std::sync::Barrier::new(LOGINS);
    let problems: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..LOGINS)
            .map(|_| {
                s.spawn(|| {
                    let l = ds.login(&policy, 1000, &mut RacingUi { typed: "0000", shown: &shown }).unwrap();
                    assert!(l.opened.is_none());
                    l.problems.iter().map(|(_, e)| e.to_string()).collect::<Vec<_>>().join("; ")
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(counter(&t), 1, "one try spent, the rest kept for the device: {problems:#?}");
    assert_eq!(problems.iter().filter(|p| p.contains("wrong TPM PIN")).count(), 1, "{problems:#?}");
    let kept = problems.iter().filter(|p| p.contains("kept for the person at the device")).count();
    assert_eq!(kept, LOGINS - 1, "{problems:#?}");
    // At the device, the kept tries are still there.
    assert!(ds.login(&policy, 1000, &mut LoginUi { typed: "1234", network: false }).unwrap().opened.is_some());
}
