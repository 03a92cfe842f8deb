//! PIN-login accounts and the TPM PIN that is a login password, through the `dirseal` binary:
//! a real ext4 (loop), a software TPM and a real user (docs/pam.md).
mod common;

use std::fs;
use std::io::Write;

use common::Env;
use dirseal_testfs::{Swtpm, User};

fn shadow_field(user: &str) -> String {
    let shadow = fs::read_to_string("/etc/shadow").unwrap();
    let line = shadow.lines().find(|l| l.split(':').next() == Some(user)).unwrap().to_string();
    line.split(':').nth(1).unwrap().to_string()
}

#[test]
fn a_pin_equal_to_the_login_password_is_refused_warned_about_and_a_pin_login_account_has_no_hash() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start_owned();
    let env = Env::new();
    writeln!(fs::OpenOptions::new().append(true).open(env.config()).unwrap(), "[tpm2]\ntcti = \"{}\"", tpm.tcti())
        .unwrap();
    let u = User::new(env.mnt());
    u.set_system_password("24682468");

    let create = ["protector", "create", "--name", "tpm", "--type", "tpm2", "--user", &u.name];
    let err = env.fails(&create, "24682468\n");
    assert!(err.contains(&format!("the PIN is {}'s login password", u.name)) && err.contains("offline"), "{err}");
    assert!(err.contains("--allow-password-pin"), "the hint names the way out: {err}");
    let out = env.ok(&[&create[..], &["--allow-password-pin"]].concat(), "24682468\n");
    // "created protector ID (tpm)"
    let id = out.split_whitespace().nth(2).unwrap_or_else(|| panic!("no protector id in {out}"));
    env.ok(&["encrypt", u.home_str(), "--protector", id], "24682468\n");

    let status = env.ok(&["status", u.home_str()], "");
    assert!(status.contains("warning:") && status.contains("testable offline"), "{status}");
    assert_eq!(env.status_json(&u.home)["warnings"].as_array().unwrap().len(), 1);

    let out = env.ok(&["pin-login", "enable", &u.name], "");
    assert!(out.contains("no password hash is left"), "{out}");
    assert_eq!(shadow_field(&u.name), "*");
    let status = env.ok(&["status", u.home_str()], "");
    assert!(!status.contains("warning:"), "{status}");
    env.ok(&["pin-login", "disable", &u.name], "");
}
