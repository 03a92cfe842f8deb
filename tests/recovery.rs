//! Recovery keys through the real binary on loop-mounted ext4.
mod common;

use std::fs;
use std::path::Path;

use common::{fresh_uid, p, Env};

/// The recovery key printed by a command (8 dash-separated groups of 6 digits).
fn key_in(out: &str) -> String {
    out.split_whitespace()
        .find(|w| w.len() == 55 && w.split('-').count() == 8 && w.split('-').all(|g| g.len() == 6))
        .unwrap_or_else(|| panic!("no recovery key in: {out}"))
        .to_string()
}

fn encrypted_with_key(env: &Env, name: &str) -> (std::path::PathBuf, String) {
    let d = env.mnt().join(name);
    fs::create_dir(&d).unwrap();
    let out = env.ok(&["encrypt", p(&d), "--protector-name", name, "--recovery-key"], "pw\n");
    fs::write(d.join("data.txt"), format!("contents of {name}")).unwrap();
    (d, key_in(&out))
}

fn key_status(env: &Env, d: &Path) -> String {
    env.status_json(d)["key"].as_str().unwrap().to_string()
}

#[test]
fn unlock_with_recovery_key_and_verify() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (d, key) = encrypted_with_key(&env, "a");
    assert_eq!(env.status_json(&d)["recovery_key"], true);
    env.ok(&["lock", p(&d)], "");
    env.ok(&["recovery", "verify", p(&d)], &format!("{key}\n"));
    assert_eq!(key_status(&env, &d), "locked", "verify must not unlock");
    // Typed differently: spaces, no dashes.
    env.ok(&["unlock", "--recovery", p(&d)], &format!("  {}\n", key.replace('-', " ")));
    assert_eq!(fs::read_to_string(d.join("data.txt")).unwrap(), "contents of a");
    // Adding a second one is refused; removing makes it stop working.
    env.fails(&["recovery", "add", p(&d)], "pw\n");
    env.ok(&["recovery", "remove", p(&d)], "");
    let err = env.fails(&["recovery", "verify", p(&d)], &format!("{key}\n"));
    assert!(err.contains("has no recovery key") && err.contains("dirseal recovery add"), "{err}");
    // `recovery add` on a piped stdin: asks the protector's password, prints a new key.
    let out = env.ok(&["recovery", "add", p(&d)], "pw\n");
    let key2 = key_in(&out);
    assert_ne!(key, key2);
    env.ok(&["recovery", "verify", p(&d)], &format!("{key2}\n"));
}

#[test]
fn restore_after_the_keystore_is_gone() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (d, key) = encrypted_with_key(&env, "home");
    env.ok(&["lock", p(&d)], "");
    fs::remove_dir_all(env.keystore()).unwrap();
    let err = env.fails(&["unlock", p(&d)], "pw\n");
    assert!(err.contains("recovery restore"), "{err}");
    env.ok(&["recovery", "restore", p(&d), "--protector-name", "fresh"], &format!("{key}\nnewpw\n"));
    assert_eq!(fs::read_to_string(d.join("data.txt")).unwrap(), "contents of home");
    let st = env.status_json(&d);
    assert_eq!(st["managed"], true);
    assert_eq!(st["protectors"][0]["name"], "fresh");
    env.ok(&["lock", p(&d)], "");
    env.ok(&["unlock", p(&d)], "newpw\n");
    assert_eq!(key_status(&env, &d), "unlocked");
}

/// A home restored with the command the error names (no --user) opens at login again: its new
/// protector belongs to the home's owner, as after `convert`, and is named after them.
#[test]
fn a_restored_home_belongs_to_its_owner() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (d, key) = encrypted_with_key(&env, "owned");
    let uid = fresh_uid();
    std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
    env.ok(&["lock", p(&d)], "");
    fs::remove_dir_all(env.keystore()).unwrap();
    let err = env.fails(&["unlock", p(&d)], "pw\n");
    assert!(err.contains(&format!("dirseal recovery restore {}", d.display())), "{err}");
    let out = env.ok(&["recovery", "restore", p(&d)], &format!("{key}\nnewpw\n"));
    assert!(out.contains("login password"), "{out}");
    let st = env.status_json(&d);
    assert_eq!(st["protectors"][0]["uid"], uid, "{st}");
    assert_eq!(st["protectors"][0]["name"], format!("uid {uid}"), "{st}");
}

#[test]
fn every_class_of_typo_is_named_and_unlocks_nothing() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (d, key) = encrypted_with_key(&env, "t");
    env.ok(&["lock", p(&d)], "");
    let groups: Vec<&str> = key.split('-').collect();
    // One digit changed in group 5.
    let mut g5: Vec<u8> = groups[4].bytes().collect();
    g5[2] = if g5[2] == b'9' { b'0' } else { g5[2] + 1 };
    let mut typo = groups.clone();
    let g5s = String::from_utf8(g5).unwrap();
    typo[4] = &g5s;
    let err = env.fails(&["unlock", "--recovery", p(&d)], &format!("{}\n", typo.join("-")));
    said_once(&err);
    assert!(err.contains("group 5 is wrong"), "{err}");
    // A group left out.
    let err = env.fails(&["unlock", "--recovery", p(&d)], &format!("{}\n", groups[..7].join("-")));
    said_once(&err);
    assert!(err.contains("8 groups of 6 digits"), "{err}");
    assert_eq!(err.matches("8 groups of 6 digits").count(), 1, "said once: {err}");
    // A short group.
    let mut short = groups.clone();
    short[2] = &groups[2][..5];
    let err = env.fails(&["unlock", "--recovery", p(&d)], &format!("{}\n", short.join("-")));
    said_once(&err);
    assert!(err.contains("group 3 has 5 digits"), "{err}");
    // A letter.
    let err = env.fails(&["unlock", "--recovery", p(&d)], &format!("{}x\n", &key[..54]));
    said_once(&err);
    assert!(err.contains("not a digit"), "{err}");
    // A well-formed key that is not this one.
    let err = env.fails(&["unlock", "--recovery", p(&d)], "000000-000000-000000-000000-000000-000000-000000-000000\n");
    said_once(&err);
    assert!(err.contains("does not open this directory"), "{err}");
    assert_eq!(key_status(&env, &d), "locked");
}

/// An error is one line of what happened, then at most one hint line, and no part of it is said
/// twice (each cause once, however the library wraps it).
fn said_once(err: &str) {
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert!((1..=2).contains(&lines.len()), "one line and a hint at most: {err}");
    let text = lines[0].strip_prefix("dirseal: error: ").unwrap_or_else(|| panic!("{err}"));
    let parts: Vec<&str> = text.split(": ").map(str::trim).filter(|p| p.len() > 3).collect();
    for (n, part) in parts.iter().enumerate() {
        assert!(!parts[n + 1..].iter().any(|q| q.contains(part) || part.contains(q)), "said twice: {err}");
    }
}

#[test]
fn a_key_or_blob_from_another_directory_is_refused() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (a, key_a) = encrypted_with_key(&env, "a");
    let (b, _) = encrypted_with_key(&env, "b");
    env.ok(&["lock", p(&a)], "");
    env.ok(&["lock", p(&b)], "");
    let err = env.fails(&["unlock", "--recovery", p(&b)], &format!("{key_a}\n"));
    assert!(err.contains("does not open this directory"), "{err}");
    // Copy a's attribute onto b: the policy binding refuses it.
    let out = std::process::Command::new("getfattr")
        .args(["-e", "hex", "-n", "trusted.dirseal.recovery", p(&a)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let val = text.lines().find_map(|l| l.strip_prefix("trusted.dirseal.recovery=")).unwrap().to_string();
    let st = std::process::Command::new("setfattr")
        .args(["-n", "trusted.dirseal.recovery", "-v", &val, p(&b)])
        .status()
        .unwrap();
    assert!(st.success());
    let err = env.fails(&["unlock", "--recovery", p(&b)], &format!("{key_a}\n"));
    assert!(err.contains("copied from another directory"), "{err}");
    assert_eq!(key_status(&env, &b), "locked");
}

#[test]
fn corrupted_or_missing_attribute_gives_a_clear_error() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (d, key) = encrypted_with_key(&env, "c");
    env.ok(&["lock", p(&d)], "");
    let set = |v: &str| {
        let st = std::process::Command::new("setfattr")
            .args(["-n", "trusted.dirseal.recovery", "-v", v, p(&d)])
            .status()
            .unwrap();
        assert!(st.success());
    };
    set("0x44535246");
    let err = env.fails(&["unlock", "--recovery", p(&d)], &format!("{key}\n"));
    assert!(err.contains("not dirseal recovery data"), "{err}");
    set("0x4453524b01");
    let err = env.fails(&["unlock", "--recovery", p(&d)], &format!("{key}\n"));
    assert!(err.contains("truncated"), "{err}");
    env.ok(&["recovery", "remove", p(&d)], "");
    let err = env.fails(&["unlock", "--recovery", p(&d)], &format!("{key}\n"));
    assert!(err.contains("has no recovery key"), "{err}");
    assert_eq!(key_status(&env, &d), "locked");
    // The password still works: nothing else was changed.
    env.ok(&["unlock", p(&d)], "pw\n");
}

#[test]
fn convert_offers_a_recovery_key_that_works_at_once() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    fs::create_dir(&home).unwrap();
    fs::write(home.join("notes.txt"), b"keep me").unwrap();
    let uid = fresh_uid();
    std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
    let out = env.ok(&["convert", p(&home), "--yes", "--protector-name", "o", "--recovery-key"], "pw\n");
    let key = key_in(&out);
    let shown = out.find(&key).unwrap();
    let done = out.find("is now encrypted").unwrap();
    assert!(shown < done, "the key must be shown before the conversion: {out}");
    env.ok(&["lock", p(&home)], "");
    fs::remove_dir_all(env.keystore()).unwrap();
    env.ok(&["unlock", "--recovery", p(&home)], &format!("{key}\n"));
    assert_eq!(fs::read(home.join("notes.txt")).unwrap(), b"keep me");
}

/// A subdirectory shares its tree's key: status there reports the tree's recovery key and names
/// the tree, and locking it says that the whole tree was locked.
#[test]
fn a_subdirectory_answers_for_its_encrypted_tree() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (d, _key) = encrypted_with_key(&env, "tree");
    let sub = d.join("sub/deeper");
    fs::create_dir_all(&sub).unwrap();
    let st = env.status_json(&sub);
    assert_eq!(st["recovery_key"], true, "{st}");
    assert_eq!(st["encrypted_root"], p(&d), "{st}");
    let text = env.ok(&["status", p(&sub)], "");
    assert!(text.contains(&format!("part of:    {}", d.display())), "{text}");
    let out = env.ok(&["lock", p(&sub)], "");
    assert_eq!(out.trim(), format!("locked {}", d.display()), "{out}");
    assert_eq!(key_status(&env, &d), "locked");
}
