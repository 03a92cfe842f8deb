//! Escrow of recovery keys (`[escrow]`, docs/fleet.md) through the real binary on loop-mounted
//! ext4, each record opened by the real `age` program (Debian's age 1.1.1) with an administrator's
//! X25519 identity and with an ssh-ed25519 key made by `ssh-keygen`. Creates a user (`home
//! create`): run under the global suite lock (scripts/test.sh).
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{fresh_uid, names, p, Env};
use sha2::{Digest, Sha256};

/// The recovery key printed by a command (8 dash-separated groups of 6 digits).
fn key_in(out: &str) -> String {
    out.split_whitespace()
        .find(|w| w.len() == 55 && w.split('-').count() == 8 && w.split('-').all(|g| g.len() == 6))
        .unwrap_or_else(|| panic!("no recovery key in: {out}"))
        .to_string()
}

fn run(prog: &str, args: &[&str]) -> std::process::Output {
    Command::new(prog).args(args).output().unwrap_or_else(|e| panic!("{prog}: {e} (is it installed? scripts/deps.sh)"))
}

fn stdout_of(prog: &str, args: &[&str]) -> String {
    let out = run(prog, args);
    assert!(out.status.success(), "{prog} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// An administrator's keys: an age X25519 identity and an ssh-ed25519 key pair.
struct Admin {
    _dir: tempfile::TempDir,
    age_identity: PathBuf,
    age_recipient: String,
    ssh_key: PathBuf,
    ssh_public: String,
    ssh_fingerprint: String,
}

impl Admin {
    fn new() -> Admin {
        let dir = tempfile::tempdir().unwrap();
        let age_identity = dir.path().join("admin.txt");
        run("age-keygen", &["-o", p(&age_identity)]);
        let age_recipient = stdout_of("age-keygen", &["-y", p(&age_identity)]).trim().to_string();
        assert!(age_recipient.starts_with("age1"), "{age_recipient}");
        let ssh_key = dir.path().join("id_ed25519");
        stdout_of("ssh-keygen", &["-q", "-t", "ed25519", "-N", "", "-C", "it@example", "-f", p(&ssh_key)]);
        let ssh_public = fs::read_to_string(ssh_key.with_extension("pub")).unwrap().trim().to_string();
        let ssh_fingerprint = stdout_of("ssh-keygen", &["-lf", p(&ssh_key.with_extension("pub"))])
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string();
        Admin { _dir: dir, age_identity, age_recipient, ssh_key, ssh_public, ssh_fingerprint }
    }
}

/// Appends an `[escrow]` section to the test config.
fn escrow_config(env: &Env, recipients: &[&str], extra: &str) {
    let list: Vec<String> = recipients.iter().map(|r| format!("{r:?}")).collect();
    let mut c = fs::read_to_string(env.config()).unwrap();
    c.push_str(&format!("\n[escrow]\nrecipients = [{}]\n{extra}\n", list.join(", ")));
    fs::write(env.config(), c).unwrap();
}

fn home_of(env: &Env, name: &str) -> (PathBuf, u32) {
    let home = env.mnt().join("home").join(name);
    fs::create_dir_all(home.join("Documents")).unwrap();
    fs::write(home.join("Documents/plan.txt"), format!("plan of {name}")).unwrap();
    let uid = fresh_uid();
    let st = Command::new("chown").args(["-R", &format!("{uid}:{uid}"), p(&home)]).status().unwrap();
    assert!(st.success());
    (home, uid)
}

fn policy_of(env: &Env, dir: &Path) -> String {
    env.status_json(dir)["policy"].as_str().unwrap().to_string()
}

/// `age -d -i identity record`, parsed.
fn age_decrypt(identity: &Path, record: &Path) -> serde_json::Value {
    let text = stdout_of("age", &["-d", "-i", p(identity), p(record)]);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("payload {e}: {text}"))
}

fn escrow_check(env: &Env) -> (bool, String) {
    let out = env.run(&["recovery", "escrow", "--check"], "");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn convert_escrows_to_an_age_and_an_ssh_key_and_the_key_opens_the_home_without_the_keystore() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let admin = Admin::new();
    escrow_config(&env, &[&admin.age_recipient, &admin.ssh_public], "");
    let (home, uid) = home_of(&env, "alice");
    let out = env.ok(&["convert", p(&home), "--yes", "--recovery-key"], "pw\n");
    let key = key_in(&out);
    let policy = policy_of(&env, &home);
    let dir = env.keystore().join("escrow");
    assert_eq!(names(&dir), vec![format!("{policy}.age"), format!("{policy}.json")]);
    let record = dir.join(format!("{policy}.age"));
    assert_eq!(fs::metadata(&record).unwrap().permissions().mode() & 0o777, 0o600);

    // The plain header says what the record is, and holds nothing secret.
    let header_text = fs::read_to_string(dir.join(format!("{policy}.json"))).unwrap();
    assert!(!header_text.contains(&key), "the key is in the clear: {header_text}");
    let header: serde_json::Value = serde_json::from_str(&header_text).unwrap();
    assert_eq!(header["format"], "dirseal-escrow");
    assert_eq!(header["version"], 1);
    assert_eq!(header["policy"], policy);
    assert_eq!(header["directory"], p(&home));
    assert_eq!(header["uid"], uid);
    let mut want = vec![admin.age_recipient.clone(), admin.ssh_fingerprint.clone()];
    want.sort();
    assert_eq!(header["recipients"], serde_json::json!(want));
    assert_eq!(header["payload"], format!("{policy}.age"));
    assert_eq!(header["payload_sha256"], hex::encode(Sha256::digest(fs::read(&record).unwrap())));

    // Both of the administrator's keys open it with the real age, and it holds the key shown.
    for identity in [&admin.age_identity, &admin.ssh_key] {
        let payload = age_decrypt(identity, &record);
        assert_eq!(payload["format"], "dirseal-escrow-payload");
        assert_eq!(payload["recovery_key"], key);
        assert_eq!(payload["policy"], policy);
        assert_eq!(payload["directory"], p(&home));
        assert_eq!(payload["uid"], uid);
        assert_eq!(payload["recipients"], header["recipients"]);
    }
    let (ok, said) = escrow_check(&env);
    assert!(ok && said.contains("every recovery key is escrowed"), "{said}");

    // The administrator kept the record; the machine lost its keystore.
    let kept = tempfile::tempdir().unwrap();
    let copy = kept.path().join("record.age");
    fs::copy(&record, &copy).unwrap();
    env.ok(&["lock", p(&home)], "");
    fs::remove_dir_all(env.keystore()).unwrap();
    let escrowed = age_decrypt(&admin.age_identity, &copy)["recovery_key"].as_str().unwrap().to_string();
    env.ok(&["unlock", "--recovery", p(&home)], &format!("{escrowed}\n"));
    assert_eq!(fs::read_to_string(home.join("Documents/plan.txt")).unwrap(), "plan of alice");
    // Restoring the policy with the key escrows it again, into the new keystore.
    env.ok(&["recovery", "restore", p(&home), "--protector-name", "fresh"], &format!("{escrowed}\nnewpw\n"));
    assert_eq!(age_decrypt(&admin.ssh_key, &record)["recovery_key"], key);
}

#[test]
fn required_escrow_into_an_unwritable_dir_refuses_before_anything_is_written() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let admin = Admin::new();
    let records = env.mnt().join("escrow");
    fs::create_dir(&records).unwrap();
    fs::set_permissions(&records, fs::Permissions::from_mode(0o700)).unwrap();
    // Immutable: even root cannot create a file in it.
    assert!(Command::new("chattr").args(["+i", p(&records)]).status().unwrap().success());
    escrow_config(&env, &[&admin.age_recipient], &format!("dir = {:?}\nrequired = true", p(&records)));
    let (home, _) = home_of(&env, "bob");
    let before = names(&home);
    let err = env.fails(&["convert", p(&home), "--yes", "--recovery-key"], "pw\n");
    assert!(err.contains("cannot write escrow records in") && err.contains(p(&records)), "{err}");
    // Declining the recovery key is no way around it.
    let err = env.fails(&["convert", p(&home), "--yes", "--no-recovery-key"], "pw\n");
    assert!(err.contains("escrow is required"), "{err}");
    let empty = env.mnt().join("empty");
    fs::create_dir(&empty).unwrap();
    let err = env.fails(&["encrypt", p(&empty)], "pw\n");
    assert!(err.contains("cannot write escrow records in"), "{err}");
    assert!(Command::new("chattr").args(["-i", p(&records)]).status().unwrap().success());
    // Nothing was written: no protector, no policy, no record, both directories as they were.
    for sub in ["protectors", "policies"] {
        let d = env.keystore().join(sub);
        assert!(!d.exists() || names(&d).is_empty(), "{sub}: {:?}", names(&d));
    }
    assert!(names(&records).is_empty(), "{:?}", names(&records));
    for d in [&home, &empty] {
        assert_eq!(env.status_json(d)["encrypted"], false);
    }
    assert_eq!(names(&home), before);
    assert_eq!(fs::read_to_string(home.join("Documents/plan.txt")).unwrap(), "plan of bob");
    // Once the directory takes records, the same conversion goes through, escrowed.
    let out = env.ok(&["convert", p(&home), "--yes"], "pw\n");
    let key = key_in(&out);
    let policy = policy_of(&env, &home);
    assert_eq!(age_decrypt(&admin.age_identity, &records.join(format!("{policy}.age")))["recovery_key"], key);
    // `recovery add` into a record dir that refuses files: refused before a key is shown.
    env.ok(&["recovery", "remove", p(&home)], "");
    assert!(names(&records).is_empty());
    assert!(Command::new("chattr").args(["+i", p(&records)]).status().unwrap().success());
    let out = env.run(&["recovery", "add", p(&home)], "pw\n");
    assert!(Command::new("chattr").args(["-i", p(&records)]).status().unwrap().success());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && stderr.contains("cannot write escrow records in"), "{stderr}");
    assert!(!stdout.contains("Recovery key"), "a key was shown: {stdout}");
    assert_eq!(env.status_json(&home)["recovery_key"], false);
}

#[test]
fn recipients_that_do_not_parse_are_named() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let admin = Admin::new();
    let base = fs::read_to_string(env.config()).unwrap();
    for (bad, said) in [
        ("age1qqqqnotarecipient", "is not a valid age X25519 recipient"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIANtin3Q", "is not a valid ssh-ed25519 or ssh-rsa public key"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAPLR", "age takes ssh-ed25519 and ssh-rsa keys only"),
        ("-----BEGIN PGP PUBLIC KEY BLOCK-----", "neither an age X25519 recipient"),
    ] {
        fs::write(env.config(), &base).unwrap();
        escrow_config(&env, &[&admin.age_recipient, bad], "");
        let err = env.fails(&["status"], "");
        assert!(err.contains("is invalid") && err.contains(bad) && err.contains(said), "{bad}: {err}");
    }
    fs::write(env.config(), &base).unwrap();
    let mut c = base.clone();
    c.push_str("\n[escrow]\nrequired = true\n");
    fs::write(env.config(), c).unwrap();
    let err = env.fails(&["status"], "");
    assert!(err.contains("required = true needs at least one recipient"), "{err}");
}

#[test]
fn a_symlinked_or_world_writable_record_dir_is_refused() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let admin = Admin::new();
    let real = env.mnt().join("real");
    fs::create_dir(&real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
    let link = env.mnt().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let open = env.mnt().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    // A user's directory above the records: they could swap theirs in.
    let users = env.mnt().join("users");
    fs::create_dir(&users).unwrap();
    let uid = fresh_uid();
    std::os::unix::fs::chown(&users, Some(uid), Some(uid)).unwrap();
    let below = users.join("escrow");
    let base = fs::read_to_string(env.config()).unwrap();
    for (dir, said) in [
        (&link, "symbolic link".to_string()),
        (&open, "lets group or others write it".to_string()),
        (&below, format!("{}: a directory above the records is owned by uid {uid}", p(&users))),
    ] {
        let said = said.as_str();
        fs::write(env.config(), &base).unwrap();
        escrow_config(&env, &[&admin.age_recipient], &format!("dir = {:?}\nrequired = true", p(dir)));
        let (home, _) = home_of(&env, &format!("h{}", dir.file_name().unwrap().to_str().unwrap()));
        let err = env.fails(&["convert", p(&home), "--yes", "--recovery-key"], "pw\n");
        assert!(err.contains("cannot keep escrow records in") && err.contains(said), "{err}");
        assert_eq!(env.status_json(&home)["encrypted"], false);
        assert!(names(&real).is_empty() && names(&open).is_empty() && !below.exists());
        // Not required: the conversion goes on, says the key was not escrowed, and the check
        // lists the directory.
        fs::write(env.config(), &base).unwrap();
        escrow_config(&env, &[&admin.age_recipient], &format!("dir = {:?}", p(dir)));
        let out = env.run(&["convert", p(&home), "--yes", "--recovery-key"], "pw\n");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("will not be escrowed") && stdout.contains(said), "{stdout}");
        assert!(names(&real).is_empty() && names(&open).is_empty());
        let (ok, said_check) = escrow_check(&env);
        assert!(!ok && said_check.contains(p(&home)) && said_check.contains("no record"), "{said_check}");
        let err = env
            .fails(&["recovery", "escrow", p(&home)], &format!("{}\n", key_in(&String::from_utf8_lossy(&out.stdout))));
        assert!(err.contains(said), "{err}");
        env.ok(&["decrypt", p(&home), "--yes"], "pw\n");
    }
}

#[test]
fn a_tampered_record_fails_age_and_the_check_and_escrow_writes_it_again() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let admin = Admin::new();
    escrow_config(&env, &[&admin.age_recipient], "");
    let (home, _) = home_of(&env, "carol");
    let key = key_in(&env.ok(&["convert", p(&home), "--yes", "--recovery-key"], "pw\n"));
    let policy = policy_of(&env, &home);
    let record = env.keystore().join("escrow").join(format!("{policy}.age"));
    let mut bytes = fs::read(&record).unwrap();
    let n = bytes.len();
    bytes[n - 20] ^= 0x01;
    fs::write(&record, &bytes).unwrap();
    let out = run("age", &["-d", "-i", p(&admin.age_identity), p(&record)]);
    assert!(!out.status.success(), "age opened a tampered record");
    let (ok, said) = escrow_check(&env);
    assert!(!ok && said.contains("damaged") && said.contains("changed after it was written"), "{said}");
    let report: serde_json::Value = serde_json::from_str(&env.ok(&["report", "--json"], "")).unwrap();
    assert_eq!(report["directories"][0]["escrow"]["state"], "damaged", "{report}");
    // A wrong key is refused and writes nothing; the right one writes the record again.
    let wrong = format!("{}{}", &key[..54], if key.ends_with('0') { '1' } else { '0' });
    env.fails(&["recovery", "escrow", p(&home)], &format!("{wrong}\n"));
    env.ok(&["recovery", "escrow", p(&home)], &format!("{key}\n"));
    assert_eq!(age_decrypt(&admin.age_identity, &record)["recovery_key"], key);
    assert!(escrow_check(&env).0);
}

#[test]
fn new_recipients_are_listed_then_escrowed_with_an_old_identity_and_a_removed_key_removes_its_record() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let old = Admin::new();
    let new = Admin::new();
    let base = fs::read_to_string(env.config()).unwrap();
    escrow_config(&env, &[&old.age_recipient], "");
    let (home, _) = home_of(&env, "dave");
    let key = key_in(&env.ok(&["convert", p(&home), "--yes", "--recovery-key"], "pw\n"));
    let policy = policy_of(&env, &home);
    let record = env.keystore().join("escrow").join(format!("{policy}.age"));
    // The organisation adds an ssh key: the record is for other recipients now.
    fs::write(env.config(), &base).unwrap();
    escrow_config(&env, &[&old.age_recipient, &new.ssh_public], "");
    let (ok, said) = escrow_check(&env);
    assert!(!ok && said.contains("other recipients") && said.contains(&old.age_recipient), "{said}");
    let err = env.fails(&["recovery", "escrow", "--all"], "");
    assert!(err.contains("--identity"), "{err}");
    // An identity that opens nothing writes nothing and says so.
    let out = env.run(&["recovery", "escrow", "--all", "--identity", p(&new.age_identity)], "");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(!escrow_check(&env).0);
    env.ok(&["recovery", "escrow", "--all", "--identity", p(&old.age_identity)], "");
    assert!(escrow_check(&env).0);
    assert_eq!(age_decrypt(&new.ssh_key, &record)["recovery_key"], key);
    // One directory, its record opened with an ssh private key.
    let before = fs::read(&record).unwrap();
    env.ok(&["recovery", "escrow", p(&home), "--identity", p(&new.ssh_key)], "");
    assert_ne!(fs::read(&record).unwrap(), before, "not written again");
    assert_eq!(age_decrypt(&old.age_identity, &record)["recovery_key"], key);
    // `recovery remove` takes the record with the key.
    env.ok(&["recovery", "remove", p(&home)], "");
    assert!(names(&env.keystore().join("escrow")).is_empty());
    // `recovery add` makes a new key, escrowed.
    let key2 = key_in(&env.ok(&["recovery", "add", p(&home)], "pw\n"));
    assert_eq!(age_decrypt(&old.age_identity, &record)["recovery_key"], key2);
    // Decrypting the directory removes the key, and so its record.
    env.ok(&["decrypt", p(&home), "--yes"], "pw\n");
    assert!(names(&env.keystore().join("escrow")).is_empty());
}

#[test]
fn home_create_escrows_with_its_user() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let admin = Admin::new();
    escrow_config(&env, &[&admin.age_recipient], "required = true");
    let skel = env.mnt().join("skel");
    fs::create_dir(&skel).unwrap();
    fs::write(skel.join(".profile"), "# profile\n").unwrap();
    let u = dirseal_testfs::User::new(env.mnt());
    fs::remove_dir(&u.home).unwrap();
    // Required escrow: a recovery key is made though none was asked for.
    let out = env.ok(&["home", "create", &u.name, "--skel", p(&skel)], "pw-home\npw-home\n");
    let key = key_in(&out);
    let policy = policy_of(&env, &u.home);
    let record = env.keystore().join("escrow").join(format!("{policy}.age"));
    let payload = age_decrypt(&admin.age_identity, &record);
    assert_eq!(payload["recovery_key"], key);
    assert_eq!(payload["user"], u.name.as_str());
    assert_eq!(payload["uid"], u.uid);
    assert_eq!(payload["directory"], p(&u.home));
}

#[test]
fn an_ssh_rsa_key_opens_its_record_and_a_short_one_is_refused() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let keys = tempfile::tempdir().unwrap();
    let rsa = keys.path().join("id_rsa");
    stdout_of("ssh-keygen", &["-q", "-t", "rsa", "-b", "3072", "-N", "", "-f", p(&rsa)]);
    let short = keys.path().join("id_rsa_short");
    stdout_of("ssh-keygen", &["-q", "-t", "rsa", "-b", "1024", "-N", "", "-f", p(&short)]);
    let public = |k: &Path| fs::read_to_string(k.with_extension("pub")).unwrap().trim().to_string();
    let base = fs::read_to_string(env.config()).unwrap();
    escrow_config(&env, &[&public(&short)], "");
    let err = env.fails(&["status"], "");
    assert!(err.contains("shorter than 2048 bits"), "{err}");
    fs::write(env.config(), &base).unwrap();
    escrow_config(&env, &[&public(&rsa)], "");
    let d = env.mnt().join("vault");
    fs::create_dir(&d).unwrap();
    let key = key_in(&env.ok(&["encrypt", p(&d), "--recovery-key"], "pw\n"));
    let record = env.keystore().join("escrow").join(format!("{}.age", policy_of(&env, &d)));
    assert_eq!(age_decrypt(&rsa, &record)["recovery_key"], key);
}
