//! `dirseal scrub` on a real loop-mounted ext4: plaintext left in free blocks is gone from the raw
//! image afterwards, the reserve is kept, and an interrupted or killed scrub gives the space back.
mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{p, Env, Options};

/// Distinct 4 KiB blocks of `image` that contain `needle` (0 means absent).
fn count_in_image(image: &Path, needle: &str) -> usize {
    let out = Command::new("grep").args(["-a", "-o", "-b", needle, p(image)]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let blocks: std::collections::BTreeSet<u64> =
        text.lines().filter_map(|l| l.split(':').next()?.parse::<u64>().ok()).map(|off| off / 4096).collect();
    blocks.len()
}

fn available(mnt: &Path) -> u64 {
    let v = rustix::fs::statvfs(mnt).unwrap();
    v.f_bavail * v.f_frsize
}

fn sync_fs(mnt: &Path) {
    assert!(Command::new("sync").args(["-f", p(mnt)]).status().unwrap().success());
}

fn marker_file(path: &Path, tag: &str, i: usize) {
    let unit = format!("DIRSEAL-{tag}-{i:03}-");
    fs::write(path, unit.repeat(200 + i * 300)).unwrap();
}

fn scrub_json(env: &Env, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["scrub", p(env.mnt()), "--json"];
    args.extend_from_slice(extra);
    let out = env.ok(&args, "");
    let last = out.lines().last().unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(last).unwrap_or_else(|e| panic!("{e}: {out}"))["scrub"].clone()
}

#[test]
fn scrub_after_convert_leaves_no_plaintext_on_the_raw_image() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    fs::create_dir(&home).unwrap();
    for i in 0..40 {
        marker_file(&home.join(format!("kept{i}")), "KEPT", i);
        marker_file(&home.join(format!("gone{i}")), "GONE", i);
    }
    sync_fs(env.mnt());
    for i in 0..40 {
        fs::remove_file(home.join(format!("gone{i}"))).unwrap();
    }
    env.ok(&["convert", p(&home), "--yes", "--no-recovery-key", "--protector-name", "o"], "pw\n");
    sync_fs(env.mnt());
    let image = env.fs.image();
    // The problem exists: deleted files and the replaced plaintext are still on the device.
    let gone = count_in_image(image, "DIRSEAL-GONE-");
    let kept = count_in_image(image, "DIRSEAL-KEPT-");
    assert!(gone > 100 && kept > 100, "plaintext should still be on the image: {gone} {kept} blocks");

    let before = available(env.mnt());
    // Overwriting alone (on a loop device TRIM punches the freed blocks out of the image).
    let r = scrub_json(&env, &["--no-trim", "--reserve", "8M"]);
    assert_eq!(r["interrupted"], false, "{r}");
    assert_eq!(r["trim"]["result"], "skipped", "{r}");
    assert!(r["written"].as_u64().unwrap() > 100 << 20, "{r}");
    // Distinct space covered never exceeds the free space; bytes written (with the sweep) may.
    let (covered, free, written, swept) = (
        r["covered"].as_u64().unwrap(),
        r["free_before"].as_u64().unwrap(),
        r["written"].as_u64().unwrap(),
        r["swept"].as_u64().unwrap(),
    );
    assert!(covered <= free && covered > 100 << 20, "{r}");
    assert!(written >= covered && swept <= written - covered + (8 << 20), "{r}");
    // The allocator hands out isolated single blocks last, so a few can stay out of reach of a
    // fill that keeps a reserve (the report counts them as not overwritten); nearly all must go.
    let (gone_after, kept_after) = (count_in_image(image, "DIRSEAL-GONE-"), count_in_image(image, "DIRSEAL-KEPT-"));
    eprintln!("plaintext blocks: deleted {gone} -> {gone_after}, replaced {kept} -> {kept_after}");
    assert!(gone_after * 50 <= gone && kept_after * 50 <= kept, "overwrite missed too much: {r}");
    let after = available(env.mnt());
    assert!(after.abs_diff(before) <= 1 << 20, "free space is back: {before} -> {after}");
    assert_eq!(r["available_after"].as_u64(), Some(after), "{r}");
    assert_eq!(common::names(env.mnt()), vec![".dirseal", "home", "lost+found"], "nothing left behind");
    // The encrypted data is untouched.
    assert_eq!(fs::read(home.join("kept7")).unwrap(), "DIRSEAL-KEPT-007-".repeat(200 + 7 * 300).as_bytes());

    // With TRIM (the default): a loop device discards by punching holes in its image.
    let r = scrub_json(&env, &[]);
    assert_eq!(r["trim"]["result"], "done", "{r}");
    assert_eq!(count_in_image(image, "DIRSEAL-GONE-"), 0, "{r}");
    assert_eq!(count_in_image(image, "DIRSEAL-KEPT-"), 0, "{r}");
    assert!(available(env.mnt()).abs_diff(before) <= 1 << 20);
    let text = env.ok(&["scrub", p(env.mnt()), "--no-trim"], "");
    for needle in [
        "overwritten:",
        " free, held at once",
        "written in all:",
        "not overwritten:",
        "hard disk (HDD)",
        "SSD",
        "journal",
        "full-disk encryption",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from the report:\n{text}");
    }
}

#[test]
fn scrub_keeps_the_reserve_for_other_programs() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let reserve: u64 = 48 << 20;
    let before = available(env.mnt());
    // Another program samples the free space throughout the run, without pause: ext4's
    // accounting can dip for a moment only (see `Fill::append`).
    let mnt = env.mnt().to_path_buf();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut min = u64::MAX;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                min = min.min(available(&mnt));
                std::thread::yield_now();
            }
            min
        })
    };
    let r = scrub_json(&env, &["--reserve", "48M", "--no-trim"]);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let min = watcher.join().unwrap();
    assert!(min >= reserve - (1 << 20), "free space fell to {min}, below the {reserve} reserve: {r}");
    assert!(min <= reserve + (8 << 20), "the fill never came near the reserve ({min}): {r}");
    assert_eq!(r["reserve"].as_u64(), Some(reserve));
    assert!(available(env.mnt()).abs_diff(before) <= 1 << 20);
}

/// Starts a scrub and returns once it reports filling progress.
// The child is handed to the caller, which waits for it; the lint does not follow returns.
#[allow(clippy::zombie_processes)]
fn start_scrub(env: &Env) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = env
        .cmd(&["scrub", p(env.mnt()), "--json", "--reserve", "16M"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            let o = child.wait_with_output().unwrap();
            panic!("scrub ended before it reported progress: {}", String::from_utf8_lossy(&o.stderr));
        }
        if line.contains("\"filling\"") {
            return (child, out);
        }
    }
}

#[test]
fn interrupted_or_killed_scrub_gives_the_space_back() {
    dirseal_testfs::needs_root!();
    let env = Env::with(Options { size_mib: 1024, ..Default::default() });
    let before = available(env.mnt());
    let names = common::names(env.mnt());

    let (child, mut out) = start_scrub(&env);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGINT).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{rest}");
    let result: serde_json::Value = serde_json::from_str(rest.lines().last().unwrap()).unwrap();
    assert_eq!(result["scrub"]["interrupted"], true, "{rest}");
    assert_eq!(result["scrub"]["trim"]["result"], "skipped", "{rest}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("interrupted") && err.contains("free space is back"), "{err}");
    assert!(available(env.mnt()).abs_diff(before) <= 1 << 20);
    assert_eq!(common::names(env.mnt()), names);

    // SIGKILL: no handler runs, yet the unnamed fill file goes with the process.
    let (mut child, _out) = start_scrub(&env);
    child.kill().unwrap();
    child.wait().unwrap();
    sync_fs(env.mnt());
    assert!(available(env.mnt()).abs_diff(before) <= 1 << 20, "space not back after SIGKILL");
    assert_eq!(common::names(env.mnt()), names);
}

#[test]
fn scrub_refuses_during_an_unfinished_conversion() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    fs::create_dir(&home).unwrap();
    fs::write(home.join("f"), b"data").unwrap();
    // Swapped with the plaintext kept: the conversion is not finished until commit or rollback.
    env.ok(&["convert", p(&home), "--yes", "--no-recovery-key", "--protector-name", "o", "--keep-backup"], "pw\n");
    let err = env.fails(&["scrub", p(env.mnt())], "");
    assert!(err.contains("not finished") && err.contains(p(&home)), "{err}");
    env.ok(&["convert", "--commit", p(&home)], "");
    env.ok(&["scrub", p(env.mnt()), "--no-trim"], "");
}
