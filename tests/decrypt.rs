//! `dirseal decrypt` through the real binary: a converted home comes back to plaintext byte for
//! byte and attribute for attribute, with nothing of its encryption left; crashes at every
//! decrypt fault point resume by running the same command again, or abort; a nearly full
//! filesystem decrypts by moving; refusals change nothing.
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{fresh_uid, names, p, Env, Options};
use dirseal_testfs::tree::entries_manifest as manifest;

/// A home with the kinds of entries a user has (and a few hostile ones), owned by `uid`.
fn build_home(root: &Path, uid: u32) {
    fs::create_dir_all(root.join("Documents/deep/er")).unwrap();
    fs::create_dir_all(root.join(".config/app")).unwrap();
    fs::write(root.join("Documents/plan.txt"), b"meet at noon").unwrap();
    fs::write(root.join("Documents/deep/er/big.bin"), (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>())
        .unwrap();
    for i in 0..40 {
        fs::write(root.join(format!(".config/app/f{i}")), format!("setting {i}")).unwrap();
    }
    fs::write(root.join("script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::os::unix::fs::symlink("Documents/plan.txt", root.join("plan-link")).unwrap();
    fs::hard_link(root.join("Documents/plan.txt"), root.join("plan-hard")).unwrap();
    fs::hard_link(root.join("Documents/deep/er/big.bin"), root.join("big-hard")).unwrap();
    // A name with a newline and invalid UTF-8, a sparse file, a fifo, an ACL.
    let odd = std::ffi::OsStr::from_bytes_compat(b"odd\nname\xff");
    fs::write(root.join(odd), b"odd").unwrap();
    let sparse = fs::File::create(root.join("sparse.img")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&sparse, b"middle", 32 << 20).unwrap();
    run("mkfifo", &[p(&root.join("pipe"))]);
    run("setfattr", &["-n", "user.color", "-v", "blue", p(&root.join("Documents/plan.txt"))]);
    run("chown", &["-hR", &format!("{uid}:{uid}"), p(root)]);
    run("setfacl", &["-m", "u:12345:r", p(&root.join("Documents"))]);
    // chown clears setuid; set it again as the owner would have.
    fs::set_permissions(root.join("script.sh"), fs::Permissions::from_mode(0o4755)).unwrap();
}

trait FromBytes {
    fn from_bytes_compat(b: &[u8]) -> &std::ffi::OsStr;
}
impl FromBytes for std::ffi::OsStr {
    fn from_bytes_compat(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

fn run(cmd: &str, args: &[&str]) {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn convert(env: &Env, dir: &Path) {
    env.ok(&["convert", p(dir), "--yes", "--protector-name", "owner", "--mode", "copy"], "pw\n");
    assert!(is_encrypted(dir));
}

fn is_encrypted(dir: &Path) -> bool {
    let out = std::process::Command::new("lsattr").args(["-d", p(dir)]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().unwrap().contains('E')
}

/// The keystore's records of one kind ("policies", "protectors").
fn records(env: &Env, kind: &str) -> Vec<String> {
    match fs::read_dir(env.keystore().join(kind)) {
        Ok(d) => d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Nothing of the encryption is left: no E flag, no policy or protector record, no key.
fn assert_forgotten(env: &Env, dir: &Path) {
    assert!(!is_encrypted(dir), "lsattr -d still shows E on {}", dir.display());
    assert!(records(env, "policies").is_empty(), "policy records left: {:?}", records(env, "policies"));
    assert!(records(env, "protectors").is_empty(), "protector records left: {:?}", records(env, "protectors"));
    let st = env.status_json(dir);
    assert_eq!(st["encrypted"], false, "{st}");
    // Only the journal and its lock stay in the work dir.
    for e in fs::read_dir(env.mnt().join(".dirseal/convert")).unwrap() {
        let left: Vec<String> =
            names(&e.unwrap().path()).into_iter().filter(|n| n != "journal.json" && n != "lock").collect();
        assert!(left.is_empty(), "work dir still holds {left:?}");
    }
}

#[test]
fn a_converted_home_comes_back_to_plaintext_with_nothing_left_of_its_encryption() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/alice");
    build_home(&home, fresh_uid());
    let before = manifest(&home);
    convert(&env, &home);
    // Not confirmed, not on a terminal: nothing happens.
    let err = env.fails(&["decrypt", p(&home)], "");
    assert!(err.contains("--yes"), "{err}");
    assert!(is_encrypted(&home));

    let out = env.ok(&["decrypt", p(&home), "--yes"], "");
    assert!(out.contains("is plaintext again") && out.contains("removed from the keystore"), "{out}");
    assert!(out.contains("protector owner") && out.contains("recovery key made for this directory is void"), "{out}");
    assert_eq!(manifest(&home), before);
    assert_forgotten(&env, &home);
    // Nothing more to do, and it says so.
    let err = env.fails(&["decrypt", p(&home), "--yes"], "");
    assert!(err.contains("not encrypted"), "{err}");
    // And the way there again works.
    convert(&env, &home);
    assert_eq!(manifest(&home), before);
}

#[test]
fn a_locked_home_is_unlocked_first_and_a_recovery_key_is_void_after() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/carol");
    build_home(&home, fresh_uid());
    let before = manifest(&home);
    env.ok(&["convert", p(&home), "--yes", "--protector-name", "owner", "--recovery-key"], "pw\n");
    env.ok(&["lock", p(&home)], "");
    // A wrong password changes nothing.
    env.fails(&["decrypt", p(&home), "--yes"], "wrong\n");
    assert!(is_encrypted(&home));
    let out = env.ok(&["decrypt", p(&home), "--yes", "--json"], "pw\n");
    let result: serde_json::Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with("{\"result\"")).unwrap()).unwrap();
    assert_eq!(result["result"]["state"], "done", "{out}");
    assert_eq!(result["result"]["forgotten"]["recovery_removed"], true, "{out}");
    assert_eq!(result["result"]["forgotten"]["key_removed"], true, "{out}");
    // The engine gives a decrypt no caveat about an old plaintext (its old tree is ciphertext).
    let notes = result["result"]["notes"].as_array().expect("notes");
    assert!(notes.iter().all(|n| !n.as_str().unwrap_or_default().contains("old plaintext")), "{out}");
    assert_eq!(manifest(&home), before);
    assert_forgotten(&env, &home);
    let x = std::process::Command::new("getfattr").args(["-d", "-m", "trusted.", p(&home)]).output().unwrap();
    assert!(!String::from_utf8_lossy(&x.stdout).contains("dirseal"), "{}", String::from_utf8_lossy(&x.stdout));
}

#[test]
fn refusals_change_nothing() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/dave");
    build_home(&home, fresh_uid());
    let before = manifest(&home);
    let err = env.fails(&["decrypt", p(&home), "--yes"], "");
    assert!(err.contains("not encrypted"), "{err}");
    convert(&env, &home);
    // A subdirectory of the encrypted tree.
    let err = env.fails(&["decrypt", p(&home.join("Documents")), "--yes"], "");
    assert!(err.contains("only the root of an encrypted tree"), "{err}");
    // A protector shared with another directory is kept.
    let other = env.mnt().join("other");
    fs::create_dir(&other).unwrap();
    let id = records(&env, "protectors").pop().unwrap();
    env.ok(&["encrypt", p(&other), "--protector", id.trim_end_matches(".json")], "pw\n");
    // A convert of a directory being decrypted is refused, and the other way round.
    assert!(is_encrypted(&home));
    assert_eq!(manifest(&home), before);
    let out = env.ok(&["decrypt", p(&home), "--yes"], "");
    assert!(out.contains("kept"), "{out}");
    assert_eq!(records(&env, "protectors").len(), 1);
    assert_eq!(records(&env, "policies").len(), 1);
    assert_eq!(manifest(&home), before);
    assert!(!is_encrypted(&home) && is_encrypted(&other));
}

#[test]
fn keep_backup_then_rollback_or_commit() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/erin");
    build_home(&home, fresh_uid());
    let before = manifest(&home);
    convert(&env, &home);
    let out = env.ok(&["decrypt", p(&home), "--yes", "--keep-backup", "--mode", "copy"], "");
    assert!(out.contains("encrypted tree is kept"), "{out}");
    assert!(!is_encrypted(&home));
    assert_eq!(records(&env, "policies").len(), 1, "the policy stays while its tree is kept");
    env.ok(&["decrypt", p(&home), "--rollback"], "");
    assert!(is_encrypted(&home));
    assert_eq!(manifest(&home), before);
    env.ok(&["decrypt", p(&home), "--yes", "--keep-backup", "--mode", "copy"], "");
    // A convert cannot start on a kept decrypt.
    let err = env.fails(&["convert", p(&home), "--yes", "--protector-name", "x"], "pw\n");
    assert!(err.contains("decrypt"), "{err}");
    let out = env.ok(&["decrypt", p(&home), "--commit"], "");
    assert!(out.contains("removed from the keystore"), "{out}");
    assert_eq!(manifest(&home), before);
    assert_forgotten(&env, &home);
}

/// Starts a decrypt that the fault hook kills at `point` (exit status 99).
#[cfg(feature = "fault-injection")]
fn crash_decrypt(env: &Env, dir: &Path, point: &str, mode: &str) {
    let out = env
        .cmd(&["decrypt", p(dir), "--yes", "--mode", mode])
        .env("DIRSEAL_FAULT", point)
        .env("DIRSEAL_MOVE_BATCH", "8")
        .env("DIRSEAL_MOVE_CHUNK", "65536")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(99), "{point}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Every point a decrypt reaches (copy and move), killed there; then aborted when it is before
/// the swap (the encrypted tree is whole again), then resumed by the same command.
#[cfg(feature = "fault-injection")]
#[test]
fn a_crash_at_every_decrypt_point_resumes_or_aborts_and_nothing_is_lost() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/frank");
    build_home(&home, fresh_uid());
    let before = manifest(&home);
    let copy = [
        "after-staging-created",
        "before-record-prepared",
        "after-prepare",
        "after-record-copying",
        "copy-file:5",
        "copy-special",
        "copy-dir:2",
        "before-record-copied",
        "after-record-copied",
        "verify-entry:7",
        "after-verify",
        "after-record-verified",
        "after-swap",
        "after-record-swapped",
        "after-record-disposing",
        "mid-dispose",
        "dispose-entry:9",
        "after-record-done",
        "after-policy-forgotten",
    ];
    let moves = [
        "after-record-moving",
        "move-entry-copied:3",
        "move-batch-synced",
        "move-entry-removed:4",
        "move-file-started",
        "move-chunk-copied",
        "move-chunk-recorded",
        "move-link-made",
        "move-file-done",
        "after-record-settling",
        "settle-times-kept:2",
        "settle-dir:2",
        "after-record-moved",
        "after-swap",
        "after-policy-forgotten",
    ];
    let points = copy.iter().map(|p| (*p, "copy")).chain(moves.iter().map(|p| (*p, "move")));
    for (point, mode) in points {
        convert(&env, &home);
        crash_decrypt(&env, &home, point, mode);
        let st: serde_json::Value =
            serde_json::from_str(&env.ok(&["decrypt", p(&home), "--status", "--json"], "")).unwrap();
        let before_swap = ["prepared", "copying", "copied", "verified", "moving", "moved"]
            .contains(&st["state"].as_str().unwrap_or(""));
        if before_swap {
            let o = env.run(&["decrypt", p(&home), "--abort"], "");
            let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            if o.status.success() {
                assert!(out.contains("aborted"), "{point}: {out}");
            } else if err.contains("roll back instead") {
                // Killed right after the swap, before recording it: the encrypted tree is kept.
                env.ok(&["decrypt", p(&home), "--rollback"], "");
            } else {
                // A move swapped before it was recorded: there is no way back but forward.
                assert!(err.contains("again to finish"), "{point}: {err}");
            }
            if !err.contains("again to finish") {
                assert!(is_encrypted(&home), "{point}: aborted, the directory is the encrypted tree");
                assert_eq!(manifest(&home), before, "{point} ({mode}), aborted");
            }
        }
        let out = env.ok(&["decrypt", p(&home), "--yes", "--mode", mode], "");
        assert!(out.contains("plaintext again") || out.contains("removed from the keystore"), "{point}: {out}");
        assert_eq!(manifest(&home), before, "{point} ({mode}), resumed");
        assert_forgotten(&env, &home);
    }
}

#[test]
fn a_nearly_full_filesystem_decrypts_by_moving() {
    dirseal_testfs::needs_root!();
    let env = Env::with(Options { size_mib: 256, ..Options::default() });
    let home = env.mnt().join("home/gina");
    build_home(&home, fresh_uid());
    for i in 0..6 {
        fs::write(home.join(format!("data{i}.bin")), vec![i as u8 + 1; 12 << 20]).unwrap();
    }
    let before = manifest(&home);
    convert(&env, &home);
    // Free space below the tree's size: only a move fits.
    let filler = env.mnt().join("filler");
    let vfs = rustix::fs::statvfs(env.mnt()).unwrap();
    let avail = vfs.f_bavail * vfs.f_frsize;
    let f = fs::File::create(&filler).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, avail - (64 << 20)).unwrap();
    f.sync_all().unwrap();
    let err = env.fails(&["decrypt", p(&home), "--yes", "--mode", "copy"], "");
    assert!(err.contains("not enough free space"), "{err}");
    let out = env.ok(&["decrypt", p(&home), "--yes"], "");
    assert!(out.contains("moved"), "{out}");
    assert_eq!(manifest(&home), before);
    assert_forgotten(&env, &home);
}

#[test]
fn an_owner_whose_only_login_is_a_tpm_pin_is_refused_until_they_have_a_password() {
    dirseal_testfs::needs_root!();
    use std::io::Write;
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let env = Env::new();
    writeln!(fs::OpenOptions::new().append(true).open(env.config()).unwrap(), "[tpm2]\ntcti = \"{}\"", tpm.tcti())
        .unwrap();
    let u = dirseal_testfs::User::new(env.mnt());
    u.set_system_password("24682468");
    let create = ["protector", "create", "--name", "tpm", "--type", "tpm2", "--user", &u.name, "--allow-password-pin"];
    let out = env.ok(&create, "24682468\n");
    let id = out.split_whitespace().nth(2).unwrap_or_else(|| panic!("no protector id in {out}")).to_string();
    env.ok(&["encrypt", u.home_str(), "--protector", &id], "24682468\n");
    fs::write(u.home.join("note.txt"), b"kept").unwrap();
    env.ok(&["pin-login", "enable", &u.name], "");
    let before = manifest(&u.home);

    let err = env.fails(&["decrypt", u.home_str(), "--yes"], "");
    assert!(err.contains(&format!("`passwd {}`", u.name)), "the refusal names passwd: {err}");
    assert!(is_encrypted(&u.home));
    assert_eq!(records(&env, "policies").len(), 1);

    u.set_system_password("new-Password-1");
    let out = env.ok(&["decrypt", u.home_str(), "--yes"], "");
    assert!(out.contains("protector tpm") && out.contains("removed"), "{out}");
    assert_eq!(manifest(&u.home), before);
    assert_forgotten(&env, &u.home);
    // No longer a PIN-login account: its PIN protector is gone.
    let config = fs::read_to_string(env.config()).unwrap();
    assert!(!config.contains(&format!("\"{}\"", u.name)), "{config}");
}

/// Issue 49: a decrypt killed at each write of its clean-up, then the same command. A cut between
/// the policy record's removal and its last protector's left that protector for good ("is not
/// encrypted; there is nothing to decrypt"). The clean-up now records what it removes before it
/// removes anything: the rerun finishes it, exits 0 saying so, and leaves the keystore an
/// uninterrupted run leaves (empty here). Meanwhile `protector list` names the protector as left
/// by the decrypt, with the command that finishes it.
#[cfg(feature = "fault-injection")]
#[test]
fn a_crash_at_every_write_of_the_cleanup_is_finished_by_the_same_command() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/grace");
    let points = [
        "cleanup-recovery-removed",
        "cleanup-recorded",
        "cleanup-policy-saved:1",
        "cleanup-protector-removed:1",
        "cleanup-policy-saved:2",
        "cleanup-protector-removed:2",
        "cleanup-policy-removed",
        "cleanup-protector-removed:3",
        "after-policy-forgotten",
        "cleanup-key-removed",
    ];
    for mode in ["copy", "move"] {
        for point in points {
            if !home.exists() {
                build_home(&home, fresh_uid());
            }
            let before = manifest(&home);
            convert(&env, &home);
            // Three protectors of its own: two leave the record one by one, the last after it.
            for name in ["spare-a", "spare-b"] {
                env.ok(
                    &["policy", "add-protector", p(&home), "--with", "owner", "--protector-name", name],
                    &format!("pw\n{name}-pw\n"),
                );
            }
            crash_decrypt(&env, &home, point, mode);
            assert!(!is_encrypted(&home), "{point} ({mode}): the clean-up runs after the swap");
            if point == "cleanup-policy-removed" {
                // The review's window: no policy record, a protector that only it used.
                assert!(records(&env, "policies").is_empty(), "{point}");
                let list = env.ok(&["protector", "list"], "");
                assert!(
                    list.contains(&format!("left by an interrupted decrypt of {}", p(&home)))
                        && list.contains(&format!("`dirseal decrypt {}` finishes its clean-up", p(&home))),
                    "{point} ({mode}): {list}"
                );
            }
            let out = env.ok(&["decrypt", p(&home), "--yes", "--mode", mode], "");
            assert!(out.contains("decrypted (clean-up finished)"), "{point} ({mode}): {out}");
            assert!(!out.contains("0 entries"), "{point} ({mode}): {out}");
            assert_eq!(manifest(&home), before, "{point} ({mode})");
            assert_forgotten(&env, &home);
        }
    }
}
