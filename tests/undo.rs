//! Issue 44, 2: a failure before the first durable step takes back the records it made. `encrypt`
//! whose directory gets a file while its password is asked, and `convert` whose work dir refuses
//! writes just after the staging directory's policy was saved, leave no protector and no
//! policy behind (before: an unused protector, and a policy listed as "unlocked" for a directory
//! that is not encrypted).
mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{p, Env};

/// The records in the keystore: (protectors, policies).
fn records(env: &Env) -> (usize, usize) {
    let count = |sub: &str| std::fs::read_dir(env.keystore().join(sub)).map_or(0, |d| d.count());
    (count("protectors"), count("policies"))
}

/// Whether process `pid` waits in poll (x86_64 `poll` 7, `ppoll` 271): the CLI reading a line.
fn polling(pid: u32) -> bool {
    let s = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    matches!(s.split_whitespace().next(), Some("7" | "271"))
}

#[test]
fn a_failed_encrypt_leaves_no_protector_and_no_policy() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    // Something the keystore holds already stays.
    let other = env.mnt().join("other");
    std::fs::create_dir(&other).unwrap();
    env.ok(&["encrypt", p(&other), "--no-recovery-key"], "pw-o\n");
    assert_eq!(records(&env), (1, 1));

    let d = env.mnt().join("d");
    std::fs::create_dir(&d).unwrap();
    let mut child = env
        .cmd(&["encrypt", p(&d), "--no-recovery-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Past its checks (the directory was empty), the command waits for the new password: a file
    // arrives meanwhile, so setting the policy fails after the protector and the policy were saved.
    let t = Instant::now();
    while !polling(child.id()) {
        assert!(t.elapsed() < Duration::from_secs(30), "the command never asked for the password");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(d.join("late"), b"x").unwrap();
    child.stdin.take().unwrap().write_all(b"pw-d\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(records(&env), (1, 1), "the failed encrypt left records: {err}");
    let st = env.status_json(&d);
    assert_eq!(st["encrypted"], false, "{st}");
    let overview = env.ok(&["status"], "");
    assert_eq!(overview.matches("policy ").count(), 1, "{overview}");
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_convert_failing_before_its_journal_leaves_no_protector_and_no_policy() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("data");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("a"), b"hello").unwrap();
    let hold = env.etc.path().join("hold");
    let mut child = env
        .cmd(&["convert", p(&d), "--yes", "--no-recovery-key"])
        .env("DIRSEAL_FAULT", "after-policy-saved")
        .env("DIRSEAL_FAULT_HOLD", &hold)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"pw\n").unwrap();
    let t = Instant::now();
    while !hold.exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "the conversion never reached the hold");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The protector and the staging policy are saved; the work dir refuses writes before the
    // journal (immutable: a read-only remount is refused while the run holds its lock file open).
    assert_eq!(records(&env), (1, 1));
    let convert_dirs = env.mnt().join(".dirseal/convert");
    let workdir = std::fs::read_dir(&convert_dirs).unwrap().next().expect("a work dir").unwrap().path();
    chattr(&workdir, "+i");
    std::fs::remove_file(&hold).unwrap();
    let out = child.wait_with_output().unwrap();
    chattr(&workdir, "-i");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(records(&env), (0, 0), "the failed conversion left records: {err}");
    assert_eq!(std::fs::read(d.join("a")).unwrap(), b"hello");
    // The same command converts it afterwards, with one protector and one policy.
    env.ok(&["convert", p(&d), "--yes", "--no-recovery-key"], "pw\n");
    assert_eq!(records(&env), (1, 1));
    assert_eq!(env.status_json(&d)["encrypted"], true);
}

#[cfg(feature = "fault-injection")]
fn chattr(path: &Path, how: &str) {
    let st = Command::new("chattr").args([how, p(path)]).status().expect("chattr (e2fsprogs)");
    assert!(st.success(), "chattr {how} {}", path.display());
}
