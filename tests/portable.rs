//! Portable directories (issue 28): a directory on a "card" (a loop ext4 image) keeps its records
//! on the card, so "another machine" (an empty keystore and config) opens it with the password or
//! a touch of the security key that travels with its owner; hostile records on the card (it is
//! attacker-controlled input) are clear errors.
//!
//! dirseal reads no machine id: a machine is its config and keystore, so another machine here is
//! another pair of those (and the card comes back on another loop device, a new device number).
mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{p, TestFs, FAST_CONFIG};
use dirseal_softfido::{Options, SoftFido};

/// One machine: its own config (naming the security key's socket, if any) and keystore.
struct Machine {
    etc: tempfile::TempDir,
}

impl Machine {
    fn new(key: Option<&Path>) -> Machine {
        let etc = tempfile::tempdir().unwrap();
        let mut cfg = FAST_CONFIG.to_string();
        if let Some(k) = key {
            cfg.push_str(&format!("[fido2]\ntouch_timeout_secs = 3\nsocket_devices = [{k:?}]\n"));
        }
        fs::write(etc.path().join("config.toml"), cfg).unwrap();
        Machine { etc }
    }

    fn keystore(&self) -> PathBuf {
        self.etc.path().join("ks")
    }

    fn run(&self, args: &[&str], stdin: &str) -> Output {
        self.run_env(args, stdin, &[])
    }

    fn run_env(&self, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dirseal"))
            .args(args)
            .envs(env.iter().copied())
            .env("DIRSEAL_CONFIG", self.etc.path().join("config.toml"))
            .env("DIRSEAL_KEYSTORE", self.keystore())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A command may fail before reading its input.
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        child.wait_with_output().unwrap()
    }

    /// [`Machine::run`] that must end within `limit`: killed and a test failure otherwise (root
    /// stalled by something on a medium).
    fn run_within(&self, limit: Duration, args: &[&str], stdin: &str) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dirseal"))
            .args(args)
            .env("DIRSEAL_CONFIG", self.etc.path().join("config.toml"))
            .env("DIRSEAL_KEYSTORE", self.keystore())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > limit {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!("dirseal {args:?} still ran after {limit:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, stdin);
        assert!(
            out.status.success(),
            "dirseal {args:?} failed:\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// Runs, requires a clean failure (an error message, no panic); returns stderr.
    fn fails(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, stdin);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "dirseal {args:?}: {err}");
        assert!(err.starts_with("dirseal: error: ") && !err.contains("panicked"), "{err}");
        err
    }

    fn status(&self, dir: &Path) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["status", "--json", p(dir)], "")).unwrap()
    }

    /// The files of one kind in this machine's keystore.
    fn records(&self, sub: &str) -> usize {
        fs::read_dir(self.keystore().join(sub)).map(|d| d.count()).unwrap_or(0)
    }
}

fn records_on(card: &Path, sub: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(card.join(".dirseal/portable").join(sub))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

fn protector_id(st: &serde_json::Value, kind: &str) -> String {
    let list = st["protectors"].as_array().unwrap();
    let found: Vec<&serde_json::Value> = list.iter().filter(|p| p["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "{st}");
    found[0]["id"].as_str().unwrap().to_string()
}

fn fsck_clean(image: &Path) {
    let out = Command::new("e2fsck").args(["-f", "-n"]).arg(image).output().unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn card_opens_on_another_machine_by_password_and_by_touch() {
    dirseal_testfs::needs_root!();
    let mut card = TestFs::new();
    let keydir = tempfile::tempdir().unwrap();
    let sock = keydir.path().join("key.sock");
    let key = SoftFido::start(&sock, Options::default()).unwrap();
    let a = Machine::new(Some(&sock));
    let games = card.path().join("games");
    fs::create_dir(&games).unwrap();

    // Machine A: a portable directory with a password, then the security key added.
    let out = a.ok(&["encrypt", p(&games), "--portable", "--protector-name", "pw", "--no-recovery-key"], "pw\n");
    assert!(out.contains("encrypted"), "{out}");
    fs::write(games.join("save.dat"), b"level 42").unwrap();
    fs::create_dir(games.join("roms")).unwrap();
    fs::write(games.join("roms/a.rom"), vec![7u8; 300_000]).unwrap();
    a.ok(&["policy", "add-protector", p(&games), "--protector-type", "fido2", "--protector-name", "yubi"], "pw\n");
    assert_eq!(records_on(card.path(), "policies").len(), 1);
    assert_eq!(records_on(card.path(), "protectors").len(), 2);
    assert_eq!((a.records("policies"), a.records("protectors")), (0, 0), "nothing of it in A's keystore");
    let st = a.status(&games);
    assert_eq!(st["managed"], true, "{st}");
    assert!(st["portable"].as_str().unwrap().ends_with(".dirseal/portable"), "{st}");
    assert!(st["protectors"].as_array().unwrap().iter().all(|p| p["stored"] == "medium"), "{st}");
    let text = a.ok(&["status", p(&games)], "");
    assert!(
        text.contains("managed:    yes, portable") && text.contains("[on the medium: opens on any machine]"),
        "{text}"
    );
    a.ok(&["lock", p(&games)], "");
    // The card's records are root's alone and atomically replaced: no temp file is left.
    let dir = card.path().join(".dirseal/portable");
    assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    for sub in ["policies", "protectors"] {
        let names = common::names(&dir.join(sub));
        assert!(names.iter().all(|n| n.ends_with(".json")), "{names:?}");
    }

    // The card moves: unmounted, attached anew (another device number), to machine B, which has
    // never seen it: an empty keystore and config.
    card.reattach();
    let b = Machine::new(Some(&sock));
    let st = b.status(&games);
    assert_eq!((st["managed"].clone(), st["key"].clone()), (true.into(), "locked".into()), "{st}");
    assert_eq!(st["problems"].as_array().unwrap().len(), 0, "{st}");
    let pw = protector_id(&st, "password");
    let touches = key.touches();
    b.ok(&["unlock", p(&games)], "");
    assert_eq!(key.touches(), touches + 1, "unlocked by a touch");
    assert_eq!(fs::read(games.join("save.dat")).unwrap(), b"level 42");
    assert_eq!(fs::read(games.join("roms/a.rom")).unwrap(), vec![7u8; 300_000]);
    b.ok(&["lock", p(&games)], "");
    assert_eq!(b.status(&games)["key"], "locked");
    let err = b.fails(&["unlock", p(&games), "--protector", &pw], "wrong\n");
    assert!(err.contains("incorrect"), "{err}");
    b.ok(&["unlock", p(&games), "--protector", &pw], "pw\n");
    assert_eq!(fs::read(games.join("save.dat")).unwrap(), b"level 42");

    // B adds a password: it goes to the card, B's keystore stays empty; A opens with it.
    b.ok(&["policy", "add-protector", p(&games), "--protector-name", "pw2"], "pw2\npw2\n");
    assert_eq!(records_on(card.path(), "protectors").len(), 3);
    assert_eq!((b.records("policies"), b.records("protectors")), (0, 0));
    b.ok(&["lock", p(&games)], "");
    let pw2 = b.status(&games)["protectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "pw2")
        .map(|p| p["id"].as_str().unwrap().to_string())
        .unwrap();
    card.remount();
    a.ok(&["unlock", p(&games), "--protector", &pw2], "pw2\n");
    assert_eq!(fs::read(games.join("save.dat")).unwrap(), b"level 42");
    a.ok(&["lock", p(&games)], "");

    // A local record of the same policy is this machine's: the card's is then ignored, and said so
    // (a_record_planted_on_a_filesystem_never_stands_in_for_a_local_policy).
    let policy = records_on(card.path(), "policies").remove(0);
    let local = b.keystore().join("policies").join(policy.file_name().unwrap());
    fs::copy(&policy, &local).unwrap();
    let st = b.status(&games);
    assert_eq!(st["portable"], serde_json::Value::Null, "{st}");
    assert!(st["warnings"].to_string().contains("also holds a record of policy"), "{st}");
    fs::remove_file(&local).unwrap();

    // The password changes on the card: the other machine opens with the new one.
    b.ok(&["change-password", p(&games), "--protector", &pw], "pw\npw-new\npw-new\n");
    card.remount();
    a.fails(&["unlock", p(&games), "--protector", &pw], "pw\n");
    a.ok(&["unlock", p(&games), "--protector", &pw], "pw-new\n");
    a.ok(&["lock", p(&games)], "");

    // Removing protectors: never the last one.
    let yubi = protector_id(&b.status(&games), "fido2");
    b.ok(&["policy", "remove-protector", p(&games), "--protector", &yubi], "");
    b.ok(&["policy", "remove-protector", p(&games), "--protector", &pw2], "");
    let err = b.fails(&["policy", "remove-protector", p(&games), "--protector", &pw], "");
    assert!(err.contains("no other usable protector"), "{err}");

    let image = card.image().to_path_buf();
    let out = Command::new("umount").arg(card.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fsck_clean(&image);
}

#[test]
fn tpm_only_portable_directory_is_refused() {
    dirseal_testfs::needs_root!();
    let card = TestFs::new();
    let a = Machine::new(None);
    let d = card.path().join("d");
    fs::create_dir(&d).unwrap();
    let err = a.fails(&["encrypt", p(&d), "--portable", "--protector-type", "tpm2", "--no-recovery-key"], "1234\n");
    assert!(
        err.contains("bound to this machine") && err.contains("portable directory must open on any machine"),
        "{err}"
    );
    // Refused before anything was asked or written.
    assert_eq!(a.status(&d)["encrypted"], false);
    assert_eq!(a.records("protectors"), 0);
    assert!(!card.path().join(".dirseal/portable/policies").exists() || records_on(card.path(), "policies").is_empty());
}

/// A card with a portable directory opened by password "pw"; returns its policy file.
fn portable_card(a: &Machine, card: &TestFs) -> (PathBuf, PathBuf) {
    let d = card.path().join("d");
    fs::create_dir(&d).unwrap();
    a.ok(&["encrypt", p(&d), "--portable", "--protector-name", "pw", "--no-recovery-key"], "pw\n");
    fs::write(d.join("f"), b"x").unwrap();
    a.ok(&["lock", p(&d)], "");
    (d, records_on(card.path(), "policies").remove(0))
}

#[test]
fn hostile_records_on_the_card_are_clear_errors() {
    dirseal_testfs::needs_root!();
    let card = TestFs::new();
    let a = Machine::new(None);
    let (d, policy) = portable_card(&a, &card);
    let b = Machine::new(None);
    let good = fs::read(&policy).unwrap();
    let unlock = |want: &str| {
        let err = b.fails(&["unlock", p(&d)], "pw\n");
        assert!(err.contains(want), "want {want:?}: {err}");
        err
    };

    // Truncated (a card pulled mid-write by a writer that was not atomic).
    fs::write(&policy, &good[..good.len() / 2]).unwrap();
    let err = unlock("is corrupt");
    assert!(err.contains(p(&policy)), "{err}");
    // Oversized.
    fs::write(&policy, vec![b' '; 300 * 1024]).unwrap();
    unlock("is larger than");
    // Another version.
    let v2 = String::from_utf8(good.clone()).unwrap().replace("\"version\": 1", "\"version\": 2");
    assert_ne!(v2.as_bytes(), &good[..]);
    fs::write(&policy, v2).unwrap();
    unlock("format version 2 is not supported");
    // A symlink out of the card.
    let outside = tempfile::NamedTempFile::new().unwrap();
    fs::write(outside.path(), &good).unwrap();
    fs::remove_file(&policy).unwrap();
    std::os::unix::fs::symlink(outside.path(), &policy).unwrap();
    unlock("it is a symbolic link");
    fs::remove_file(&policy).unwrap();
    fs::write(&policy, &good).unwrap();
    fs::set_permissions(&policy, fs::Permissions::from_mode(0o600)).unwrap();
    b.ok(&["unlock", p(&d)], "pw\n");
    b.ok(&["lock", p(&d)], "");

    // A protector record: truncated, then owned by someone else.
    let prot = records_on(card.path(), "protectors").remove(0);
    let good_prot = fs::read(&prot).unwrap();
    fs::write(&prot, &good_prot[..10]).unwrap();
    unlock("is corrupt");
    fs::write(&prot, &good_prot).unwrap();
    std::os::unix::fs::chown(&prot, Some(4242), None).unwrap();
    unlock("owned by uid 4242");
    std::os::unix::fs::chown(&prot, Some(0), None).unwrap();

    // The records directory: a symlink to a directory off the card, then writable by all.
    let base = card.path().join(".dirseal/portable");
    let moved = card.path().join(".dirseal/moved");
    fs::rename(&base, &moved).unwrap();
    let off_card = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(off_card.path(), &base).unwrap();
    unlock("it is a symbolic link");
    let st = b.status(&d);
    assert!(st["problems"].to_string().contains("symbolic link"), "{st}");
    fs::remove_file(&base).unwrap();
    fs::rename(&moved, &base).unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o777)).unwrap();
    unlock("lets group or others write");
    fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();

    // A filesystem mounted over the records is not the card's.
    let over = TestFs::new();
    fs::create_dir_all(over.path().join("portable/policies")).unwrap();
    for dir in ["", "portable", "portable/policies"] {
        fs::set_permissions(over.path().join(dir), fs::Permissions::from_mode(0o700)).unwrap();
    }
    let out =
        Command::new("mount").args(["--bind"]).arg(over.path()).arg(card.path().join(".dirseal")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = b.fails(&["unlock", p(&d)], "pw\n");
    let _ = Command::new("umount").arg(card.path().join(".dirseal")).status();
    assert!(err.contains("on another filesystem than the medium"), "{err}");

    b.ok(&["unlock", p(&d)], "pw\n");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"x");
    b.ok(&["lock", p(&d)], "");
}

#[test]
fn a_tpm_protector_is_an_extra_local_one_and_never_the_last_that_travels() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start();
    let card = TestFs::new();
    let a = Machine::new(None);
    let cfg = a.etc.path().join("config.toml");
    let text = fs::read_to_string(&cfg).unwrap();
    fs::write(&cfg, format!("{text}[tpm2]\ntcti = \"{}\"\n", tpm.tcti())).unwrap();
    let (d, _) = portable_card(&a, &card);
    a.ok(
        &["policy", "add-protector", p(&d), "--protector-type", "tpm2", "--no-pin", "--protector-name", "tpm"],
        "pw\n",
    );
    // The TPM's record stays with the machine; the policy on the card lists it.
    assert_eq!(a.records("protectors"), 1);
    assert_eq!(records_on(card.path(), "protectors").len(), 1);
    let st = a.status(&d);
    let (tpm_id, pw) = (protector_id(&st, "tpm2"), protector_id(&st, "password"));
    let stored = |st: &serde_json::Value, id: &str| {
        st["protectors"].as_array().unwrap().iter().find(|p| p["id"] == id).unwrap()["stored"].clone()
    };
    assert_eq!((stored(&st, &tpm_id), stored(&st, &pw)), ("keystore".into(), "medium".into()), "{st}");
    let text = a.ok(&["status", p(&d)], "");
    assert!(text.contains("[this machine's keystore: opens here only]"), "{text}");
    a.ok(&["unlock", p(&d), "--protector", &tpm_id], "");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"x");
    a.ok(&["lock", p(&d)], "");
    let err = a.fails(&["policy", "remove-protector", p(&d), "--protector", &pw], "");
    assert!(err.contains("last one that opens it on other machines"), "{err}");

    // Elsewhere the TPM protector is named as kept on another machine, not as a problem.
    let b = Machine::new(None);
    let st = b.status(&d);
    assert_eq!(st["elsewhere"], serde_json::json!([tpm_id]), "{st}");
    assert_eq!(st["problems"], serde_json::json!([]), "{st}");
    b.ok(&["unlock", p(&d)], "pw\n");
    b.ok(&["lock", p(&d)], "");

    // A TPM record planted on the card is refused, never tried against this machine's TPM.
    let planted = card.path().join(".dirseal/portable/protectors").join(format!("{tpm_id}.json"));
    fs::copy(a.keystore().join("protectors").join(format!("{tpm_id}.json")), &planted).unwrap();
    let st = b.status(&d);
    assert!(st["problems"].to_string().contains("bound to a machine and never kept on a medium"), "{st}");
    let err = b.fails(&["unlock", p(&d), "--protector", &tpm_id], "");
    assert!(err.contains("bound to a machine and never kept on a medium"), "{err}");
    b.ok(&["unlock", p(&d)], "pw\n");
    fs::remove_file(&planted).unwrap();
}

#[test]
fn convert_portable_opens_on_another_machine() {
    dirseal_testfs::needs_root!();
    let mut card = TestFs::new();
    let a = Machine::new(None);
    let d = card.path().join("music");
    fs::create_dir_all(d.join("album")).unwrap();
    for i in 0..20 {
        fs::write(d.join("album").join(format!("t{i}.ogg")), vec![i as u8; 10_000 + i * 1000]).unwrap();
    }
    let err = a.fails(&["convert", p(&d), "--portable", "--yes", "--protector-type", "tpm2", "--no-recovery-key"], "");
    assert!(err.contains("bound to this machine"), "{err}");
    assert_eq!(a.status(&d)["encrypted"], false);
    a.ok(&["convert", p(&d), "--portable", "--yes", "--protector-name", "pw", "--no-recovery-key"], "pw\n");
    assert_eq!((a.records("policies"), a.records("protectors")), (0, 0), "nothing of it in A's keystore");
    assert_eq!(records_on(card.path(), "policies").len(), 1);
    a.ok(&["lock", p(&d)], "");

    card.reattach();
    let b = Machine::new(None);
    assert_eq!(b.status(&d)["managed"], true);
    b.ok(&["unlock", p(&d)], "pw\n");
    for i in 0..20 {
        assert_eq!(fs::read(d.join("album").join(format!("t{i}.ogg"))).unwrap(), vec![i as u8; 10_000 + i * 1000]);
    }
    b.ok(&["lock", p(&d)], "");
    let image = card.image().to_path_buf();
    let out = Command::new("umount").arg(card.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fsck_clean(&image);
}

/// A crash among the first writes of a portable conversion (protector saved on the card, policy
/// saved there, journal written), then the same command: the card holds what an uninterrupted run
/// leaves (one policy per directory, one protector each, none wrapping nothing), and another
/// machine opens every directory.
#[cfg(feature = "fault-injection")]
#[test]
fn a_crash_early_in_a_portable_conversion_leaves_no_orphan_on_the_card() {
    dirseal_testfs::needs_root!();
    let card = TestFs::new();
    let a = Machine::new(None);
    let points = ["after-protector-saved", "after-staging-created", "after-policy-saved", "after-prepare"];
    for (i, point) in points.iter().enumerate() {
        let d = card.path().join(format!("d{i}"));
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::write(d.join("sub/f"), format!("file {i}")).unwrap();
        let args = ["convert", p(&d), "--portable", "--yes", "--protector-name", "pw", "--no-recovery-key"];
        let out = a.run_env(&args, "pw\n", &[("DIRSEAL_FAULT", point)]);
        assert_eq!(out.status.code(), Some(99), "{point}: {}", String::from_utf8_lossy(&out.stderr));
        a.ok(&args, "pw\n");
        assert_eq!(fs::read_to_string(d.join("sub/f")).unwrap(), format!("file {i}"), "{point}");
        assert_eq!(records_on(card.path(), "policies").len(), i + 1, "after a crash at {point}");
        assert_eq!(records_on(card.path(), "protectors").len(), i + 1, "after a crash at {point}");
        assert_eq!((a.records("policies"), a.records("protectors")), (0, 0), "{point}");
        a.ok(&["lock", p(&d)], "");
    }
    let b = Machine::new(None);
    for (i, _) in points.iter().enumerate() {
        let d = card.path().join(format!("d{i}"));
        b.ok(&["unlock", p(&d)], "pw\n");
        assert_eq!(fs::read_to_string(d.join("sub/f")).unwrap(), format!("file {i}"));
    }
}

/// Anyone who can write the root of a shared filesystem can plant a `.dirseal` there: a directory
/// whose record is in this machine's keystore still opens, and status names the planted one.
#[test]
fn a_planted_dirseal_does_not_lock_out_local_directories() {
    dirseal_testfs::needs_root!();
    let fs_ = TestFs::new();
    let a = Machine::new(None);
    let d = fs_.path().join("local");
    fs::create_dir(&d).unwrap();
    a.ok(&["encrypt", p(&d), "--protector-name", "pw", "--no-recovery-key"], "pw\n");
    fs::write(d.join("f"), b"kept").unwrap();
    a.ok(&["lock", p(&d)], "");
    let planted = fs_.path().join(".dirseal");
    fs::create_dir(&planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(4242), Some(4242)).unwrap();
    a.ok(&["unlock", p(&d)], "pw\n");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"kept");
    let st = a.status(&d);
    let problems = st["problems"].to_string();
    assert!(
        problems.contains("cannot be read (the local one is used)") && problems.contains("owned by uid 4242"),
        "{st}"
    );
    assert_eq!(st["portable"], serde_json::Value::Null, "{st}");
}

fn records_dir(card: &TestFs) -> PathBuf {
    card.path().join(".dirseal/portable")
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A process holding a lock, killed when dropped (a failed test leaves none behind).
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Records and a lock on a card that another user could open are refused (they could hold the
/// lock, or read a record), and a lock held by another process is waited for a few seconds, then
/// an error naming it: root is never stalled by a medium.
#[test]
fn a_medium_lock_others_could_take_is_refused_and_a_held_one_ends_in_an_error() {
    dirseal_testfs::needs_root!();
    let card = TestFs::new();
    let a = Machine::new(None);
    let (d, _) = portable_card(&a, &card);
    let (records, lock) = (records_dir(&card), records_dir(&card).join(".lock"));
    assert_eq!(fs::metadata(&lock).unwrap().permissions().mode() & 0o777, 0o600);
    let add = ["policy", "add-protector", p(&d), "--protector-name", "pw2"];
    let limit = Duration::from_secs(60);
    let refused = |want: &[&str]| {
        let out = a.run_within(limit, &add, "pw\npw2\npw2\n");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(want.iter().all(|w| err.contains(w)), "want {want:?}: {err}");
    };

    // As a card made elsewhere could come: 0755 records, a 0644 lock.
    chmod(&records, 0o755);
    chmod(&lock, 0o644);
    refused(&["lets group or others open it", p(&records), "chmod 700"]);
    chmod(&records, 0o700);
    refused(&["lets group or others open it", p(&lock), "chmod 600"]);
    chmod(&lock, 0o600);
    assert_eq!(records_on(card.path(), "protectors").len(), 1, "nothing was added");

    // Another process holds the lock: an error within the wait, not a hang.
    // One process holds it (the shell becomes `sleep`), so killing it lets go.
    let hold = "exec 9<>\"$0\" && flock -x 9 && exec sleep 120";
    let holder = Holder(Command::new("sh").args(["-c", hold]).arg(&lock).spawn().unwrap());
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10)
        && Command::new("flock").args(["-n", "-x"]).arg(&lock).arg("true").status().unwrap().success()
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    refused(&["is locked by another process", p(&lock), "fuser -v"]);
    let waited = t.elapsed();
    drop(holder);
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    assert_eq!(records_on(card.path(), "protectors").len(), 1, "nothing was added");
    a.ok(&add, "pw\npw2\npw2\n");
    assert_eq!(records_on(card.path(), "protectors").len(), 2);
}

/// What a FIFO or a device node in place of the card's lock or of a record does: refused before
/// it is opened, and nothing waits. A writer waiting on the FIFO would be let through by any open
/// of it; the device node has no driver, so opening it would fail otherwise ("no such device").
#[test]
fn a_fifo_or_a_device_on_the_medium_is_refused_unopened() {
    dirseal_testfs::needs_root!();
    let card = TestFs::new();
    let a = Machine::new(None);
    let (d, policy) = portable_card(&a, &card);
    let lock = records_dir(&card).join(".lock");
    let limit = Duration::from_secs(60);
    let add = ["policy", "add-protector", p(&d), "--protector-name", "pw2"];
    let unlock = ["unlock", p(&d)];
    for (target, args, stdin) in [(&lock, &add[..], "pw\npw2\npw2\n"), (&policy, &unlock[..], "pw\n")] {
        let good = fs::read(target).unwrap();
        for fifo in [true, false] {
            fs::remove_file(target).unwrap();
            let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
            let writer = if fifo {
                nix::unistd::mkfifo(target, mode).unwrap();
                let (tx, rx) = std::sync::mpsc::channel();
                let path = target.clone();
                std::thread::spawn(move || tx.send(fs::OpenOptions::new().write(true).open(&path).is_ok()));
                Some(rx)
            } else {
                let dev = nix::sys::stat::makedev(0, 0);
                nix::sys::stat::mknod(target, nix::sys::stat::SFlag::S_IFCHR, mode, dev).unwrap();
                None
            };
            let out = a.run_within(limit, args, stdin);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains("not a regular file") && err.contains(p(target)), "{args:?}: {err}");
            if let Some(rx) = writer {
                assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "{args:?} opened the FIFO");
                // Let the writer go.
                let _reader = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(target).unwrap();
                assert!(rx.recv().unwrap());
            }
        }
        fs::remove_file(target).unwrap();
        fs::write(target, good).unwrap();
        chmod(target, 0o600);
    }
    a.ok(&unlock, "pw\n");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"x");
}

/// A record planted on a filesystem under a local directory's policy id (a portable record made
/// for another key, renamed): the local record is still the one used, and the planted one is
/// named by `unlock` and `status`.
#[test]
fn a_record_planted_on_a_filesystem_never_stands_in_for_a_local_policy() {
    dirseal_testfs::needs_root!();
    let fs_ = TestFs::new();
    let a = Machine::new(None);
    let d = fs_.path().join("local");
    fs::create_dir(&d).unwrap();
    a.ok(&["encrypt", p(&d), "--protector-name", "pw", "--no-recovery-key"], "pw\n");
    fs::write(d.join("f"), b"kept").unwrap();
    a.ok(&["lock", p(&d)], "");
    let id = a.status(&d)["policy"].as_str().unwrap().to_string();

    // The attacker's: a portable directory of their own on the same filesystem (their password),
    // its policy record copied under the local policy's id.
    let evil = Machine::new(None);
    let e = fs_.path().join("evil");
    fs::create_dir(&e).unwrap();
    evil.ok(&["encrypt", p(&e), "--portable", "--protector-name", "evil", "--no-recovery-key"], "evil\n");
    let theirs = records_on(fs_.path(), "policies").remove(0);
    let their_id = theirs.file_stem().unwrap().to_str().unwrap().to_string();
    let planted = theirs.with_file_name(format!("{id}.json"));
    fs::write(&planted, fs::read_to_string(&theirs).unwrap().replace(&their_id, &id)).unwrap();
    chmod(&planted, 0o600);

    let st = a.status(&d);
    assert_eq!((st["managed"].clone(), st["portable"].clone()), (true.into(), serde_json::Value::Null), "{st}");
    let names: Vec<&str> = st["protectors"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["pw"], "{st}");
    let warnings = st["warnings"].to_string();
    assert!(warnings.contains("also holds a record of policy") && warnings.contains(p(&planted)), "{st}");
    let out = a.ok(&["unlock", p(&d)], "pw\n");
    assert!(out.contains("also holds a record of policy") && out.contains(p(&planted)), "{out}");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"kept");
    a.ok(&["lock", p(&d)], "");
    // The attacker's own directory is theirs as before.
    evil.ok(&["lock", p(&e)], "");
    evil.ok(&["unlock", p(&e)], "evil\n");
}
