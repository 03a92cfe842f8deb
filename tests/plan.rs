//! What `convert` tells a person before and after: the plan from the one preflight walk (data vs
//! apparent size, space, a measured time estimate, the owner, the recovery key), progress that
//! counts data actually copied, and `--scrub`.
mod common;

use std::fs;
use std::path::Path;

use common::{p, Env};

/// JSON lines of a `--json` run, by their single key.
fn lines(out: &str, key: &str) -> Vec<serde_json::Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get(key).cloned())
        .collect()
}

fn sparse_home(root: &Path) {
    fs::create_dir_all(root.join("sub")).unwrap();
    for i in 0..50u32 {
        fs::write(root.join(format!("sub/f{i}")), vec![i as u8; 1000 * i as usize]).unwrap();
    }
    // A 1 GiB disk image holding 4 MiB of data: the bar and the ETA must not count its holes.
    let img = fs::File::create(root.join("disk.img")).unwrap();
    img.set_len(1 << 30).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&img, &vec![7u8; 4 << 20], 64 << 20).unwrap();
}

#[test]
fn json_plan_progress_and_result_count_data_not_apparent_size() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    sparse_home(&home);
    let out = env.ok(&["convert", p(&home), "--yes", "--json", "--protector-name", "o"], "pw\n");
    let plan = &lines(&out, "plan")[0];
    let data = plan["data_bytes"].as_u64().unwrap();
    let apparent = plan["apparent_bytes"].as_u64().unwrap();
    let small: u64 = (0..50u64).map(|i| 1000 * i).sum();
    assert!(data >= small + (4 << 20) && data < small + (5 << 20), "{plan}");
    assert_eq!(apparent, small + (1 << 30), "{plan}");
    assert_eq!(plan["entries"], 52, "{plan}");
    assert!(plan["space_needed"].as_u64().unwrap() < 64 << 20, "{plan}");
    assert!(plan["space_available"].as_u64().unwrap() > plan["space_needed"].as_u64().unwrap());
    // --yes asks nothing but the secret: no recovery key unless asked for.
    assert_eq!(plan["recovery_key"], false, "{plan}");
    assert_eq!(plan["owner_uid"], 0);
    let est = &plan["estimate"];
    assert!(est["write_bytes_per_sec"].as_u64().unwrap() > 1 << 20, "a measured rate: {plan}");
    assert!(est["micros_per_entry"].as_u64().unwrap() > 0, "{plan}");
    assert!(est["seconds"].as_u64().unwrap() < 600, "{plan}");
    // The probe left nothing behind.
    let leftovers: Vec<_> = common::names(&env.mnt().join(".dirseal"));
    assert_eq!(leftovers, vec!["convert"], "{leftovers:?}");

    let copying: Vec<_> =
        lines(&out, "progress").into_iter().filter(|p| p["phase"] == "copying" || p["phase"] == "verifying").collect();
    assert!(!copying.is_empty(), "{out}");
    for p in &copying {
        assert_eq!(p["bytes_total"].as_u64(), Some(data), "progress counts data: {p}");
        assert!(p["bytes_done"].as_u64().unwrap() <= data);
        assert!(p["eta_seconds"].as_i64().is_some_and(|e| e >= -1), "every progress line has its ETA: {p}");
    }
    let result = &lines(&out, "result")[0];
    assert_eq!(result["data_bytes"].as_u64(), Some(data), "{result}");
    assert_eq!(result["apparent_bytes"].as_u64(), Some(apparent), "{result}");
    assert_eq!(result["state"], "done");
}

#[test]
fn a_run_without_room_to_probe_has_no_estimate_rather_than_a_guess() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    fs::create_dir(&home).unwrap();
    fs::write(home.join("f"), b"x").unwrap();
    // Leave the copy its space but nothing for a probe.
    let avail = {
        let v = rustix::fs::statvfs(env.mnt()).unwrap();
        v.f_bavail * v.f_frsize
    };
    let filler = fs::File::create(env.mnt().join("filler")).unwrap();
    rustix::fs::fallocate(&filler, rustix::fs::FallocateFlags::empty(), 0, avail - (10 << 20)).unwrap();
    let out = env.ok(&["convert", p(&home), "--yes", "--json", "--protector-name", "o"], "pw\n");
    let plan = &lines(&out, "plan")[0];
    assert!(plan["estimate"].is_null(), "{plan}");
    assert_eq!(lines(&out, "result")[0]["state"], "done");
}

#[test]
fn convert_scrub_overwrites_the_old_plaintext_when_done() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    fs::create_dir(&home).unwrap();
    for i in 0..30 {
        fs::write(home.join(format!("f{i}")), format!("DIRSEAL-SCRUB-{i:03}-").repeat(3000)).unwrap();
    }
    let args = ["convert", p(&home), "--yes", "--json", "--protector-name", "o", "--scrub"];
    let out = env.ok(&args, "pw\n");
    assert_eq!(lines(&out, "result")[0]["state"], "done", "{out}");
    let scrub = &lines(&out, "scrub")[0];
    assert_eq!(scrub["interrupted"], false, "{scrub}");
    assert!(scrub["written"].as_u64().unwrap() > 100 << 20, "{scrub}");
    let grep =
        std::process::Command::new("grep").args(["-a", "-c", "DIRSEAL-SCRUB-", p(env.fs.image())]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&grep.stdout).trim(), "0", "plaintext left on the image");

    // Kept as a backup: nothing to scrub yet, and it says so.
    let other = env.mnt().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("f"), b"x").unwrap();
    let o = env.run(&["convert", p(&other), "--yes", "--protector-name", "o", "--keep-backup", "--scrub"], "pw\n");
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not scrubbing") && err.contains("--commit --scrub"), "{err}");
    let out = env.ok(&["convert", "--commit", "--scrub", "--json", p(&other)], "");
    assert_eq!(lines(&out, "scrub")[0]["interrupted"], false, "{out}");
}

#[test]
fn the_probe_never_writes_into_a_dirseal_dir_someone_else_controls() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    fs::create_dir(&home).unwrap();
    fs::write(home.join("f"), b"x").unwrap();
    // A user got there first: their .dirseal, with a symlink where a probe might go.
    let uid = common::fresh_uid();
    let theirs = env.mnt().join(".dirseal");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::symlink("/etc", theirs.join("probe.0000000000000000")).unwrap();
    std::os::unix::fs::lchown(&theirs, Some(uid), Some(uid)).unwrap();
    let out = env.run(&["convert", p(&home), "--yes", "--json", "--protector-name", "o"], "pw\n");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(plan) = lines(&stdout, "plan").first() {
        assert!(plan["estimate"].is_null(), "{plan}");
    }
    let probes: Vec<_> = common::names(&theirs).into_iter().filter(|n| n.starts_with("probe.")).collect();
    assert_eq!(probes, vec!["probe.0000000000000000"], "the probe touched a user's directory");
    assert!(!std::path::Path::new("/etc/w").exists() && !std::path::Path::new("/etc/s0").exists());
    assert!(fs::symlink_metadata(theirs.join("probe.0000000000000000")).unwrap().file_type().is_symlink());
}
