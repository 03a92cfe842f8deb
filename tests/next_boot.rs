//! `dirseal convert DIR --at-next-boot` and the boot-time run (`dirseal convert --scheduled`, what
//! dirseal-convert-boot.service runs), through the real binary on a loop ext4: a remount stands
//! for the reboot (it drops every key of the filesystem), and the boot-time run gets no input, so
//! it can only use the key held for the conversion.
mod common;

use dirseal::convert::LoginDuring;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::{fresh_uid, names, p, Env};
use dirseal_testfs::tree::entries_manifest as manifest;

/// A small home owned by `uid`, with `bulk` MiB of data in 64 KiB files (a run long enough to
/// be killed part-way).
fn build_home(root: &Path, uid: u32, bulk: usize) {
    fs::create_dir_all(root.join("Documents/deep")).unwrap();
    fs::write(root.join("Documents/plan.txt"), b"meet at noon").unwrap();
    fs::write(root.join("Documents/deep/big.bin"), (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>())
        .unwrap();
    fs::create_dir(root.join("bulk")).unwrap();
    for i in 0..bulk * 16 {
        fs::write(root.join(format!("bulk/{i}")), vec![(i % 251) as u8; 64 * 1024]).unwrap();
    }
    std::os::unix::fs::symlink("Documents/plan.txt", root.join("plan-link")).unwrap();
    let st = std::process::Command::new("chown").args(["-hR", &format!("{uid}:{uid}"), p(root)]).status().unwrap();
    assert!(st.success());
}

fn schedule(env: &Env, home: &Path, extra: &[&str]) -> String {
    let mut args = vec!["convert", p(home), "--at-next-boot", "--yes", "--protector-name", "owner"];
    args.extend_from_slice(extra);
    env.ok(&args, "pw\n")
}

/// The files of a keystore subdirectory (none if it does not exist).
fn files(env: &Env, sub: &str) -> Vec<String> {
    let dir = env.keystore().join(sub);
    if !dir.exists() {
        return Vec::new();
    }
    names(&dir).into_iter().filter(|n| !n.starts_with('.')).collect()
}

/// What PAM's rule says of a login to `home` now.
fn login_during(env: &Env, home: &Path) -> LoginDuring {
    let ds = dirseal::Dirseal::open(&env.config(), Some(&env.keystore())).unwrap();
    dirseal::convert::login_during(Some(&ds), home).unwrap()
}

/// What the keystore holds: protectors, policies, held keys, schedules.
fn keystore_files(env: &Env) -> [Vec<String>; 4] {
    [files(env, "protectors"), files(env, "policies"), files(env, "held"), files(env, "scheduled")]
}

#[test]
fn scheduled_then_run_at_boot_with_nothing_typed() {
    dirseal_testfs::needs_root!();
    let mut env = Env::new();
    let home = env.mnt().join("home/alice");
    build_home(&home, fresh_uid(), 2);
    let before = manifest(&home);
    let out = schedule(&env, &home, &[]);
    assert!(out.contains("scheduled for encryption at the next boot"), "{out}");
    assert!(out.contains("held in a root-only file"), "{out}");
    // Until the boot nothing of the home changed, and status says where it stands.
    assert_eq!(manifest(&home), before);
    let st = env.status_json(&home);
    assert_eq!(st["encrypted"], false, "{st}");
    assert_eq!(st["conversion"], "scheduled", "{st}");
    let st: serde_json::Value =
        serde_json::from_str(&env.ok(&["convert", "--status", "--json", p(&home)], "")).unwrap();
    assert_eq!(st["state"], "scheduled", "{st}");
    assert_eq!(st["at_next_boot"], "scheduled for the next boot (copy)", "{st}");
    let all = env.ok(&["convert", "--status"], "");
    assert!(all.contains(&format!("{}: scheduled for the next boot (copy)", home.display())), "{all}");
    let text = env.ok(&["status", p(&home)], "");
    assert!(text.contains("conversion: scheduled for the next boot (copy)"), "{text}");
    // Its owner goes on logging in until the boot (PAM asks the one rule): the home is as it was.
    assert_eq!(login_during(&env, &home), LoginDuring::Open);
    // The held key: one root-only 0600 file, in the 0700 keystore.
    let held = files(&env, "held");
    assert_eq!(held.len(), 1, "{held:?}");
    let meta = fs::symlink_metadata(env.keystore().join("held").join(&held[0])).unwrap();
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o7777), (0, 0o600));
    let dir = fs::symlink_metadata(env.keystore().join("held")).unwrap();
    assert_eq!(dir.permissions().mode() & 0o7777, 0o700);

    // The reboot drops the staging key; the boot-time run asks nothing (no input at all).
    env.fs.remount();
    let out = env.ok(&["convert", "--scheduled"], "");
    assert!(out.contains(&format!("{} is encrypted", home.display())), "{out}");
    assert!(out.contains("copying"), "progress is shown: {out}");
    // Nobody is logged in: the run's key is gone, the home locked until a login opens it.
    assert!(out.contains(&format!("locked {}: its owner's login opens it", home.display())), "{out}");
    assert_eq!(env.status_json(&home)["key"], "locked");
    let [protectors, policies, held, scheduled] = keystore_files(&env);
    assert_eq!((protectors.len(), policies.len()), (1, 1));
    assert!(held.is_empty() && scheduled.is_empty(), "held {held:?}, scheduled {scheduled:?}");
    // After the boot the outcome is found.
    let text = env.ok(&["status", p(&home)], "");
    assert!(text.contains("conversion: the conversion scheduled for the boot finished: done ("), "{text}");
    // The home opens with the password chosen when it was scheduled.
    env.fs.remount();
    assert!(!names(&home).contains(&"Documents".to_string()));
    env.ok(&["unlock", p(&home)], "pw\n");
    assert_eq!(manifest(&home), before);
    // Nothing left to run: the boot-time run says so, successfully.
    let out = env.ok(&["convert", "--scheduled"], "");
    assert!(out.contains("no conversion is scheduled"), "{out}");
}

/// Without its held key (gone), the boot-time run cannot ask for the secret: it fails, says so,
/// and the conversion stays scheduled with the failure in its status; resumed by hand with the
/// password, it finishes and the schedule is settled.
#[test]
fn without_its_held_key_the_boot_run_fails_and_stays_scheduled() {
    dirseal_testfs::needs_root!();
    let mut env = Env::new();
    let home = env.mnt().join("home/erin");
    build_home(&home, fresh_uid(), 1);
    let before = manifest(&home);
    schedule(&env, &home, &[]);
    let held = files(&env, "held");
    fs::remove_file(env.keystore().join("held").join(&held[0])).unwrap();
    env.fs.remount();
    let out = env.run(&["convert", "--scheduled"], "");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("failed; it is tried again at the next boot"), "{said}");
    assert_eq!(manifest(&home), before);
    let text = env.ok(&["status", p(&home)], "");
    assert!(text.contains("scheduled for the next boot (copy); the last boot's run failed"), "{text}");
    env.ok(&["convert", p(&home)], "pw\n");
    assert!(files(&env, "scheduled").is_empty());
    let text = env.ok(&["status", p(&home)], "");
    assert!(text.contains("the conversion scheduled for the boot finished: done"), "{text}");
    assert_eq!(manifest(&home), before);
}

/// A power cut (SIGKILL) during the boot-time run of a move, at many moments: the next boot's run
/// finishes it with nothing lost, the key still held until then.
#[test]
fn a_boot_run_killed_part_way_finishes_at_the_next_boot() {
    dirseal_testfs::needs_root!();
    let mut env = Env::new();
    let home = env.mnt().join("home/bob");
    build_home(&home, fresh_uid(), 24);
    let before = manifest(&home);
    let out = schedule(&env, &home, &["--mode", "move"]);
    assert!(out.contains("will be moved"), "{out}");
    let mut kills = 0;
    for delay_ms in [30u64, 120, 300, 600, 1000] {
        env.fs.remount();
        let mut child = env
            .cmd(&["convert", "--scheduled"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        if files(&env, "scheduled").is_empty() {
            break;
        }
        assert_eq!(files(&env, "held").len(), 1, "the key is held until the conversion is past its swap");
        // Files on their way into the staging directory: no login may use the home.
        if dirseal::convert::status(&home).unwrap().is_some_and(|v| v.state != dirseal::convert::State::Prepared) {
            assert_eq!(login_during(&env, &home), LoginDuring::Closed);
        }
    }
    assert!(kills > 0, "the run was never killed part-way");
    env.fs.remount();
    if !files(&env, "scheduled").is_empty() {
        let out = env.ok(&["convert", "--scheduled"], "");
        assert!(out.contains(&format!("{} is encrypted", home.display())), "{out}");
    }
    let [_, policies, held, scheduled] = keystore_files(&env);
    assert_eq!(policies.len(), 1);
    assert!(held.is_empty() && scheduled.is_empty(), "held {held:?}, scheduled {scheduled:?}");
    env.fs.remount();
    env.ok(&["unlock", p(&home)], "pw\n");
    assert_eq!(manifest(&home), before);
}

/// A cancel after scheduling (and a reboot, with nothing typed: the held key reads the staging
/// directory back) leaves the home and the keystore as they were.
#[test]
fn cancel_after_scheduling_leaves_everything_as_it_was() {
    dirseal_testfs::needs_root!();
    let mut env = Env::new();
    let home = env.mnt().join("home/carol");
    build_home(&home, fresh_uid(), 1);
    let before = manifest(&home);
    let mode = fs::metadata(&home).unwrap().permissions().mode();
    for data_mode in ["move", "copy"] {
        schedule(&env, &home, &["--mode", data_mode]);
        assert_eq!(files(&env, "held").len(), 1);
        env.fs.remount();
        let out = env.ok(&["convert", "--abort", p(&home)], "");
        assert!(out.contains("aborted"), "{out}");
        assert_eq!(manifest(&home), before, "{data_mode}");
        assert_eq!(fs::metadata(&home).unwrap().permissions().mode(), mode);
        let [protectors, policies, held, scheduled] = keystore_files(&env);
        assert!(
            protectors.is_empty() && policies.is_empty() && held.is_empty() && scheduled.is_empty(),
            "{data_mode}: left {protectors:?} {policies:?} {held:?} {scheduled:?}"
        );
        let st = env.status_json(&home);
        assert_eq!(st["encrypted"], false, "{st}");
        assert!(!env.ok(&["status", p(&home)], "").contains("scheduled"));
        // Nothing is left for the boot either.
        let out = env.ok(&["convert", "--scheduled"], "");
        assert!(out.contains("no conversion is scheduled"), "{out}");
    }
}

/// Scheduling twice is refused, and so is scheduling a directory whose conversion is under way.
#[test]
fn scheduling_twice_is_refused() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/dave");
    build_home(&home, fresh_uid(), 0);
    schedule(&env, &home, &[]);
    let err = env.fails(&["convert", p(&home), "--at-next-boot", "--yes"], "pw\n");
    assert!(err.contains("already under way") && err.contains("--abort"), "{err}");
    assert_eq!(files(&env, "policies").len(), 1);
}

/// The unit file is valid (`systemd-analyze verify`, when there is one), with ExecStart pointing
/// at a binary that exists here.
#[test]
fn the_boot_unit_verifies() {
    let Ok(out) = std::process::Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("skipped: no systemd-analyze");
        return;
    };
    assert!(out.status.success());
    let unit =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/systemd/dirseal-convert-boot.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/sbin/dirseal convert --scheduled"), "{unit}");
    assert!(unit.contains("ConditionDirectoryNotEmpty=/var/lib/dirseal/scheduled"));
    let before = unit.lines().find(|l| l.starts_with("Before=dirseal-autologin.service")).unwrap_or("");
    assert!(before.contains("display-manager.service") && before.contains("systemd-user-sessions.service"), "{unit}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dirseal-convert-boot.service");
    fs::write(&path, unit.replace("/usr/sbin/dirseal", env!("CARGO_BIN_EXE_dirseal"))).unwrap();
    let out = std::process::Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&path).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

/// Scheduling killed right after the new policy was saved (its key already held, no journal
/// yet), then asked again: the second leaves one policy and one held key, as one uninterrupted
/// run does; the orphans of the first are gone.
#[cfg(feature = "fault-injection")]
#[test]
fn scheduling_killed_before_its_journal_leaves_no_orphan_key() {
    dirseal_testfs::needs_root!();
    use dirseal_migrate::fault::Point;
    let env = Env::new();
    let home = env.mnt().join("home/fay");
    build_home(&home, fresh_uid(), 0);
    use std::io::Write;
    let mut child = env
        .cmd(&["convert", p(&home), "--at-next-boot", "--yes", "--protector-name", "owner"])
        .env("DIRSEAL_FAULT", Point::AfterPolicySaved.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"pw\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(99), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!((files(&env, "policies").len(), files(&env, "held").len()), (1, 1));
    schedule(&env, &home, &[]);
    let [protectors, policies, held, scheduled] = keystore_files(&env);
    assert_eq!((protectors.len(), policies.len(), held.len(), scheduled.len()), (1, 1, 1, 1));
    assert_eq!(held[0].trim_end_matches(".key"), policies[0].trim_end_matches(".json"));
}

/// With a TPM (a software one) the held key is sealed to it: the file holds no key, only one
/// wrapped under a TPM-sealed key; the boot-time run unseals it with nothing typed. Without the
/// TPM the file opens nothing: the run fails and the conversion stays scheduled.
#[test]
fn with_a_tpm_the_held_key_is_sealed_to_it() {
    dirseal_testfs::needs_root!();
    use std::io::Write;
    let tpm = dirseal_testfs::Swtpm::start();
    let mut env = Env::new();
    let mut f = fs::OpenOptions::new().append(true).open(env.config()).unwrap();
    writeln!(f, "[tpm2]\ntcti = \"{}\"", tpm.tcti()).unwrap();
    let home = env.mnt().join("home/gus");
    build_home(&home, fresh_uid(), 1);
    let before = manifest(&home);
    let out = schedule(&env, &home, &[]);
    assert!(out.contains("held sealed to this machine's TPM"), "{out}");
    let held = files(&env, "held");
    let record: serde_json::Value =
        serde_json::from_slice(&fs::read(env.keystore().join("held").join(&held[0])).unwrap()).unwrap();
    assert!(record.get("key").is_none() && record["tpm2"].is_object() && record["wrapped"].is_object(), "{record}");
    // Another TPM (this one's state gone) cannot give it back: nothing is guessed or asked.
    let other = dirseal_testfs::Swtpm::start();
    let config = fs::read_to_string(env.config()).unwrap();
    fs::write(env.config(), config.replace(&tpm.tcti(), &other.tcti())).unwrap();
    env.fs.remount();
    let out = env.run(&["convert", "--scheduled"], "");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(manifest(&home), before);
    fs::write(env.config(), config).unwrap();
    let out = env.ok(&["convert", "--scheduled"], "");
    assert!(out.contains(&format!("{} is encrypted", home.display())), "{out}");
    assert!(files(&env, "held").is_empty());
    env.fs.remount();
    env.ok(&["unlock", p(&home)], "pw\n");
    assert_eq!(manifest(&home), before);
}

/// While plymouth runs (`plymouth --ping` succeeds) the boot-time run's progress and outcome go to
/// its message line too. A stand-in `plymouth` on PATH records the calls (no plymouthd can run
/// here).
#[test]
fn progress_goes_to_plymouth_when_it_runs() {
    dirseal_testfs::needs_root!();
    let mut env = Env::new();
    let home = env.mnt().join("home/hal");
    build_home(&home, fresh_uid(), 8);
    schedule(&env, &home, &[]);
    env.fs.remount();
    let bin = tempfile::tempdir().unwrap();
    let log = bin.path().join("calls");
    let stub = bin.path().join("plymouth");
    fs::write(&stub, format!("#!/bin/sh\nprintf '%s\\n' \"$*\" >>{}\n", log.display())).unwrap();
    fs::set_permissions(&stub, fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    let out = env.cmd(&["convert", "--scheduled"]).env("PATH", path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let calls = fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(lines[0], "--ping", "{calls}");
    assert!(lines.iter().any(|l| l.starts_with("display-message --text=dirseal: copying")), "{calls}");
    assert!(lines.last().unwrap().ends_with(&format!("{} is encrypted", home.display())), "{calls}");
    // Without plymouth (its ping fails) nothing more is sent to it.
    fs::write(&stub, format!("#!/bin/sh\nprintf '%s\\n' \"$*\" >>{}\nexit 1\n", log.display())).unwrap();
    fs::write(&log, "").unwrap();
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    env.cmd(&["convert", "--scheduled"]).env("PATH", path).output().unwrap();
    assert_eq!(fs::read_to_string(&log).unwrap(), "--ping\n");
}
