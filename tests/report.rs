//! `dirseal report --json` (docs/formats.md) against directories in every state it reports, on
//! loop-mounted ext4, with and without a (software) TPM.
mod common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use common::{fresh_uid, p, Env};
use dirseal_testfs::Swtpm;
use serde_json::Value;

fn report(env: &Env) -> Value {
    // Asks nothing: stdin is empty.
    let out = env.ok(&["report", "--json"], "");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("report json {e}: {out}"))
}

fn dir_entry<'a>(r: &'a Value, dir: &Path) -> &'a Value {
    r["directories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == p(dir))
        .unwrap_or_else(|| panic!("{} not in the report: {r}", dir.display()))
}

fn append_config(env: &Env, text: &str) {
    let mut f = fs::OpenOptions::new().append(true).open(env.config()).unwrap();
    writeln!(f, "\n{text}").unwrap();
}

fn age_recipient(dir: &Path) -> String {
    let id = dir.join("admin.txt");
    assert!(Command::new("age-keygen").args(["-o", p(&id)]).output().unwrap().status.success());
    let out = Command::new("age-keygen").args(["-y", p(&id)]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn owned_dir(env: &Env, name: &str, uid: u32) -> std::path::PathBuf {
    let d = env.mnt().join(name);
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("sub/file.txt"), name).unwrap();
    let st = Command::new("chown").args(["-R", &format!("{uid}:{uid}"), p(&d)]).status().unwrap();
    assert!(st.success());
    d
}

#[test]
fn report_json_covers_every_state() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let keys = tempfile::tempdir().unwrap();
    let recipient = age_recipient(keys.path());
    append_config(
        &env,
        &format!("[tpm2]\ntcti = \"device:/nonexistent/tpmrm0\"\n\n[escrow]\nrecipients = [\"{recipient}\"]"),
    );

    // unlocked, with a recovery key, escrowed.
    let open = env.mnt().join("open");
    fs::create_dir(&open).unwrap();
    env.ok(&["encrypt", p(&open), "--protector-name", "o", "--recovery-key"], "pw\n");
    // locked, without a recovery key.
    let shut = env.mnt().join("shut");
    fs::create_dir(&shut).unwrap();
    env.ok(&["encrypt", p(&shut), "--protector-name", "s", "--no-recovery-key"], "pw\n");
    env.ok(&["lock", p(&shut)], "");
    // a converted home of uid, kept for a commit: an unfinished conversion; its record lost.
    let uid = fresh_uid();
    let home = owned_dir(&env, "home", uid);
    env.ok(&["convert", p(&home), "--yes", "--recovery-key", "--keep-backup"], "pw\n");
    let home_policy = env.status_json(&home)["policy"].as_str().unwrap().to_string();
    let records = env.keystore().join("escrow");
    fs::remove_file(records.join(format!("{home_policy}.json"))).unwrap();
    fs::remove_file(records.join(format!("{home_policy}.age"))).unwrap();
    // a directory that is gone.
    let gone = env.mnt().join("gone");
    fs::create_dir(&gone).unwrap();
    env.ok(&["encrypt", p(&gone), "--protector-name", "g", "--no-recovery-key"], "pw\n");
    env.ok(&["lock", p(&gone)], "");
    fs::remove_dir(&gone).unwrap();

    let r = report(&env);
    assert_eq!(r["format"], "dirseal-report", "{r}");
    assert_eq!(r["version"], 1);
    assert_eq!(r["product_version"], env!("CARGO_PKG_VERSION"));
    assert!(r["host"].is_string() && r["generated_unix"].as_u64().unwrap() > 1_700_000_000, "{r}");
    assert_eq!(r["keystore"], p(&env.keystore()));
    assert_eq!(r["escrow"]["recipients"], serde_json::json!([recipient]));
    assert_eq!(r["escrow"]["required"], false);
    assert_eq!(r["escrow"]["dir"], p(&records));
    assert_eq!(r["directories"].as_array().unwrap().len(), 4, "{r}");

    let d = dir_entry(&r, &open);
    assert_eq!(d["present"], true);
    assert_eq!(d["state"], "unlocked");
    assert_eq!(d["owner_uid"], 0);
    assert_eq!(d["owner"], "root");
    assert_eq!(d["protector_kinds"], serde_json::json!(["password"]));
    assert_eq!(d["recovery_key"], true);
    assert_eq!(d["escrow"]["state"], "current", "{d}");
    assert_eq!(d["escrow"]["recipients"], serde_json::json!([recipient]));
    assert_eq!(d["policy"].as_str().unwrap().len(), 32);

    let d = dir_entry(&r, &shut);
    assert_eq!(d["state"], "locked");
    assert_eq!(d["recovery_key"], false);
    assert_eq!(d["escrow"], Value::Null, "no key, nothing to escrow: {d}");

    let d = dir_entry(&r, &home);
    assert_eq!(d["state"], "unlocked");
    assert_eq!(d["owner_uid"], uid);
    assert_eq!(d["owner"], Value::Null, "uid {uid} has no passwd entry");
    assert_eq!(d["recovery_key"], true);
    assert_eq!(d["escrow"]["state"], "missing", "{d}");
    assert_eq!(d["policy"], home_policy);

    let d = dir_entry(&r, &gone);
    assert_eq!(d["present"], false);
    assert_eq!(d["state"], "unknown");
    assert_eq!(d["recovery_key"], Value::Null);
    assert_eq!(d["owner_uid"], Value::Null);

    let u = r["unfinished_conversions"].as_array().unwrap();
    assert_eq!(u.len(), 1, "{r}");
    assert_eq!(u[0]["path"], p(&home));
    assert_eq!(u[0]["direction"], "encrypt");
    assert_eq!(u[0]["state"], "swapped");
    assert_eq!(u[0]["running"], false);

    assert_eq!(r["tpm"]["present"], false);
    assert_eq!(r["tpm"]["tcti"], "device:/nonexistent/tpmrm0");
    assert!(r["tpm"]["reason"].as_str().unwrap().contains("/nonexistent/tpmrm0 does not exist"), "{r}");
    assert_eq!(r["tpm"]["tries_left"], Value::Null);
    assert_eq!(r["problems"], serde_json::json!([]));

    // Committed, the conversion leaves the report; its record is still missing.
    env.ok(&["convert", "--commit", p(&home)], "");
    let typed = env.run(&["recovery", "escrow", "--check"], "");
    assert_eq!(typed.status.code(), Some(1));
    let r = report(&env);
    assert_eq!(r["unfinished_conversions"], serde_json::json!([]));

    // The human form says the same things.
    let text = env.ok(&["report"], "");
    for want in [p(&open), p(&shut), p(&home), "locked", "unlocked", "not escrowed", "escrowed to", "TPM at"] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
}

#[test]
fn report_reads_the_tpm_lockout_without_asking_anything() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start();
    let env = Env::new();
    append_config(&env, &format!("[tpm2]\ntcti = \"{}\"", tpm.tcti()));
    let r = report(&env);
    assert_eq!(r["tpm"]["present"], true, "{r}");
    assert_eq!(r["tpm"]["lockout_owned"], false);
    assert_eq!(r["escrow"], Value::Null);
    assert_eq!(r["directories"], serde_json::json!([]));
    env.ok(&["tpm2", "setup", "--yes", "--max-tries", "5"], "");
    let r = report(&env);
    assert_eq!(r["tpm"]["lockout_owned"], true, "{r}");
    assert_eq!(r["tpm"]["tries_left"], 5);
    assert_eq!(r["tpm"]["max_tries"], 5);
    assert_eq!(r["tpm"]["in_lockout"], false);
}

#[test]
fn report_lists_portable_directories_of_mounted_media_apart() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let games = env.mnt().join("games");
    fs::create_dir(&games).unwrap();
    env.ok(&["encrypt", p(&games), "--portable", "--no-recovery-key", "--protector-name", "card"], "pw\n");
    let policy = env.status_json(&games)["policy"].as_str().expect("policy").to_string();
    let r = report(&env);
    // Not the keystore's: its records are on the medium.
    assert!(r["directories"].as_array().unwrap().iter().all(|d| d["policy"] != policy.as_str()), "{r}");
    // Other mounted test filesystems may have portable directories too: this one is among them.
    let ours = r["portable_directories"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .find(|d| d["policy"] == policy.as_str())
        .unwrap_or_else(|| panic!("{policy} not among the portable directories: {r}"));
    assert_eq!((ours["key"].as_str(), ours["path_hint"].as_str()), (Some("unlocked"), Some(p(&games))), "{r}");
    assert_eq!(ours["protectors"].as_array().map(Vec::len), Some(1), "{r}");
    assert!(ours["records"].as_str().unwrap().ends_with(".dirseal/portable"), "{r}");
    env.ok(&["lock", p(&games)], "");
    let text = env.ok(&["report"], "");
    assert!(text.lines().any(|l| l.starts_with(&format!("portable {}: locked", p(&games)))), "{text}");
}
