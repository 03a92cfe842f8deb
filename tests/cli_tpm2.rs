//! TPM2 protectors through the `dirseal` binary: a real ext4 (loop) and a software TPM per test.
mod common;

use std::fs;
use std::io::Write;

use common::{p, Env};
use dirseal_testfs::Swtpm;

/// An Env whose config points at `tpm`. This test process is in no logind session, so the CLI it
/// runs is not at the device (docs/pam.md): no tries are kept for the device here, so that these
/// tests may spend them all, as a person at the device may.
fn env_with(tpm: &str) -> Env {
    env_keeping(tpm, 0)
}

/// An Env whose config points at `tpm` and keeps `kept` tries for the device.
fn env_keeping(tpm: &str, kept: u32) -> Env {
    let env = Env::new();
    let mut f = fs::OpenOptions::new().append(true).open(env.config()).unwrap();
    writeln!(f, "[tpm2]\ntcti = \"{tpm}\"\nmin_local_tries = {kept}").unwrap();
    env
}

/// Issue 41: the CLI spends a TPM try only by the library's rule too. Run outside any seat session
/// (here: no logind session and no virtual console), it is elsewhere: the tries kept for the device
/// are refused before the TPM is asked, as for a login over SSH.
#[test]
fn the_cli_outside_a_seat_session_leaves_the_tries_kept_for_the_device() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start();
    let env = env_keeping(&tpm.tcti(), 2);
    env.ok(&["tpm2", "setup", "--yes", "--max-tries", "3", "--recovery-time", "1000"], "");
    env.ok(&["protector", "create", "--type", "tpm2", "--name", "t"], "1234\n");
    let id = id_of(&env, "t");
    let err = env.fails(&["protector", "verify", &id], "9999\n");
    assert!(err.contains("wrong TPM PIN; 2 tries left"), "{err}");
    let err = env.fails(&["protector", "verify", &id], "1234\n");
    assert!(err.contains("the last 2 are kept for the person at the device"), "{err}");
    assert_eq!(tries_left(&env, "t"), Some(2));
}

fn protectors(env: &Env) -> Vec<serde_json::Value> {
    let out = env.ok(&["protector", "list", "--json"], "");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["protectors"].as_array().unwrap().clone()
}

fn id_of(env: &Env, name: &str) -> String {
    let list = protectors(env);
    let r = list.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no protector {name}: {list:?}"));
    r["id"].as_str().unwrap().to_string()
}

fn tries_left(env: &Env, name: &str) -> Option<u64> {
    protectors(env).iter().find(|r| r["name"] == name).and_then(|r| r["tries_left"].as_u64())
}

#[test]
fn tpm_pin_unlocks_wrong_pins_cost_one_try_lockout_leaves_other_protectors() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start();
    let env = env_with(&tpm.tcti());
    // Owned by dirseal's setup; its reset code changes the parameters below.
    let out = env.ok(&["tpm2", "setup", "--yes", "--max-tries", "3", "--recovery-time", "1000"], "");
    let code = out.split_whitespace().find(|w| w.len() == 55).expect("reset code").to_string();
    let d = env.mnt().join("home");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-type", "tpm2", "--protector-name", "tpm", "--recovery-key"], "1234\n");
    fs::write(d.join("f"), b"secret").unwrap();
    // A password protector next to it, proven with the TPM PIN.
    env.ok(
        &["policy", "add-protector", p(&d), "--protector-type", "password", "--protector-name", "pw"],
        "1234\npw1\n",
    );
    assert_eq!(tries_left(&env, "tpm"), Some(3));
    assert_eq!(tries_left(&env, "pw"), None);
    let (tpm_id, pw_id) = (id_of(&env, "tpm"), id_of(&env, "pw"));

    env.ok(&["lock", p(&d)], "");
    env.ok(&["unlock", p(&d), "--protector", &tpm_id], "1234\n");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"secret");
    assert_eq!(tries_left(&env, "tpm"), Some(3), "a right PIN costs nothing");

    env.ok(&["lock", p(&d)], "");
    let err = env.fails(&["unlock", p(&d), "--protector", &tpm_id], "9999\n");
    assert!(err.contains("wrong TPM PIN; 2 tries left"), "{err}");
    assert_eq!(tries_left(&env, "tpm"), Some(2), "a wrong PIN costs exactly one try");
    let err = env.fails(&["unlock", p(&d), "--protector", &tpm_id], "9998\n");
    assert!(err.contains("wrong TPM PIN; 1 try left"), "{err}");
    let err = env.fails(&["unlock", p(&d), "--protector", &tpm_id], "9997\n");
    assert!(err.contains("no tries left"), "{err}");

    // Locked out: said before any PIN is asked (no input given: asking would fail otherwise),
    // with what else opens the directory.
    let err = env.fails(&["unlock", p(&d), "--protector", &tpm_id], "");
    assert!(!err.contains("no secret was given"), "no PIN may be asked in lockout: {err}");
    assert!(err.contains("locked out") && err.contains("at most 17 min"), "{err}");
    // The library names what else opens it; the CLI's hint says how.
    assert!(err.contains(&format!("still opens with protector pw (password, {pw_id}); its recovery key")), "{err}");
    let hint = format!(
        "unlock it with `dirseal unlock {d} --protector {pw_id}` (pw) or `dirseal unlock --recovery {d}`",
        d = p(&d)
    );
    assert!(err.contains(&hint), "{err}");
    assert_eq!(tries_left(&env, "tpm"), Some(0));
    // The status names the way out of the lockout, not only the wait.
    let st = env.ok(&["tpm2", "status"], "");
    assert!(
        st.contains("in lockout:        yes") && st.contains("`dirseal tpm2 reset-lockout` with the TPM reset code"),
        "{st}"
    );
    env.ok(&["unlock", p(&d), "--protector", &pw_id], "pw1\n");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"secret");
    env.ok(&["lock", p(&d)], "");

    // With a 2 s recovery time the TPM forgives failures and the PIN works again.
    env.ok(&["tpm2", "setup", "--recovery-time", "2"], &format!("{code}\n"));
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(tries_left(&env, "tpm").unwrap() >= 1);
    env.ok(&["unlock", p(&d), "--protector", &tpm_id], "1234\n");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"secret");
}

#[test]
fn pcr_bound_protector_refuses_after_the_pcr_changes_and_names_the_others() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start();
    let env = env_with(&tpm.tcti());
    // The flags are the kind's options; `--protector-opt no_pin --protector-opt pcr=7` says the same.
    let out = env
        .ok(&["protector", "create", "--type", "tpm2", "--name", "boot", "--no-pin", "--protector-opt", "pcr=7"], "");
    assert!(out.contains("created protector"), "{out}");
    let boot = id_of(&env, "boot");
    let d = env.mnt().join("data");
    fs::create_dir(&d).unwrap();
    // No PIN: nothing is read from stdin.
    env.ok(&["encrypt", p(&d), "--protector", &boot, "--no-recovery-key"], "");
    env.ok(&["policy", "add-protector", p(&d), "--protector-type", "password", "--protector-name", "pw"], "pw\n");
    fs::write(d.join("f"), b"x").unwrap();
    env.ok(&["lock", p(&d)], "");
    env.ok(&["unlock", p(&d), "--protector", &boot], "");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"x");
    env.ok(&["lock", p(&d)], "");

    tpm.pcr_extend(7);
    let err = env.fails(&["unlock", p(&d), "--protector", &boot], "");
    assert!(err.contains("PCRs 7 changed since this protector was created"), "{err}");
    assert!(err.contains("still opens with protector pw (password, "), "{err}");
    assert!(err.contains(&format!("unlock it with `dirseal unlock {} --protector ", p(&d))), "{err}");
    assert!(!err.contains("recovery key"), "it has none: {err}");
    env.ok(&["unlock", p(&d), "--protector", &id_of(&env, "pw")], "pw\n");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"x");
    // A PCR refusal costs no try; a no-PIN protector shows no tries.
    assert_eq!(tries_left(&env, "boot"), None);
    let st = env.ok(&["tpm2", "status", "--json"], "");
    assert!(st.contains("\"lockout_counter\": 0"), "{st}");
}

#[test]
fn a_missing_tpm_is_a_clear_error_at_create_and_nothing_is_saved() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start();
    let gone = tpm.tcti();
    drop(tpm);
    let env = env_with(&gone);
    let err = env.fails(&["protector", "create", "--type", "tpm2", "--name", "t"], "1234\n");
    assert!(err.contains("no usable TPM at swtpm:host=127.0.0.1"), "{err}");
    assert!(err.contains("tpm2.tcti"), "{err}");
    // The status says where it looked.
    let st = env.ok(&["tpm2", "status"], "");
    assert!(st.contains(&format!("TPM at {gone}")) && st.contains("present:           no"), "{st}");
    assert!(protectors(&env).is_empty());
    let d = env.mnt().join("d");
    fs::create_dir(&d).unwrap();
    let err = env.fails(&["encrypt", p(&d), "--protector-type", "tpm2", "--no-recovery-key"], "1234\n");
    assert!(err.contains("no usable TPM"), "{err}");
    assert!(env.status_json(&d)["encrypted"] == false);
    // Options of other kinds are refused, not dropped.
    let err = env.fails(&["protector", "create", "--type", "password", "--name", "x", "--no-pin"], "pw\n");
    assert!(err.contains("--no-pin does not apply to password protectors"), "{err}");
    // Any kind's option by its key; the kind refuses what it does not take, by that key.
    let err =
        env.fails(&["protector", "create", "--type", "password", "--name", "x", "--protector-opt", "pcr=7"], "pw\n");
    assert!(err.contains("option pcr does not apply to password protectors"), "{err}");
    let err =
        env.fails(&["protector", "create", "--type", "tpm2", "--name", "x", "--protector-opt", "no_pin=maybe"], "");
    assert!(err.contains("option no_pin of tpm2 protectors: it is true or false"), "{err}");
    let err = env.fails(&["protector", "create", "--type", "tpm2", "--name", "x", "--pcr", "99"], "");
    assert!(err.contains("PCR 99"), "{err}");
}

#[test]
fn tpm_pin_change_keeps_the_protector() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start_owned();
    let env = env_with(&tpm.tcti());
    env.ok(&["protector", "create", "--type", "tpm2", "--name", "t"], "1111\n");
    let id = id_of(&env, "t");
    env.ok(&["protector", "verify", &id], "1111\n");
    env.ok(&["protector", "change-password", &id], "1111\n2222\n");
    env.fails(&["protector", "verify", &id], "1111\n");
    env.ok(&["protector", "verify", &id], "2222\n");
}

#[test]
fn convert_with_a_new_tpm_protector() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start_owned();
    let env = env_with(&tpm.tcti());
    let d = env.mnt().join("home");
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("sub/f"), b"data").unwrap();
    env.ok(
        &["convert", p(&d), "--yes", "--no-recovery-key", "--protector-type", "tpm2", "--protector-name", "t"],
        "4321\n",
    );
    let st = env.status_json(&d);
    assert_eq!(st["encrypted"], true);
    assert_eq!(st["protectors"][0]["kind"], "tpm2");
    env.ok(&["lock", p(&d)], "");
    env.fails(&["unlock", p(&d)], "1111\n");
    env.ok(&["unlock", p(&d)], "4321\n");
    assert_eq!(fs::read(d.join("sub/f")).unwrap(), b"data");
    assert_eq!(tries_left(&env, "t"), Some(2));
}

/// Regression (issue 20): a PIN on a TPM whose lockout anyone can reset protects nothing, so it is
/// refused, naming the command that fixes it; without a PIN there is nothing to guess.
#[test]
fn a_pin_protector_needs_an_owned_lockout_and_setup_provides_it() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start();
    let env = env_with(&tpm.tcti());
    // Refused before the PIN is asked (no input given: asking would fail otherwise).
    let err = env.fails(&["protector", "create", "--type", "tpm2", "--name", "t"], "");
    assert!(!err.contains("no secret was given"), "{err}");
    assert!(err.contains("lockout hierarchy has no password"), "{err}");
    assert!(err.contains("`dirseal tpm2 setup`"), "{err}");
    assert!(protectors(&env).is_empty());
    env.ok(&["protector", "create", "--type", "tpm2", "--name", "free", "--no-pin"], "");
    env.ok(&["tpm2", "setup", "--yes"], "");
    env.ok(&["protector", "create", "--type", "tpm2", "--name", "t"], "1234\n");
    let st: serde_json::Value = serde_json::from_str(&env.ok(&["tpm2", "status", "--json"], "")).unwrap();
    assert_eq!((st["lockout_owned"].as_bool(), st["max_tries"].as_u64()), (Some(true), Some(6)), "{st}");
}
