//! `dirseal convert` in move mode through the real binary, on a real encrypted staging directory:
//! a nearly full filesystem converted with `--mode auto`, and a crashed move aborted after a
//! reboot (the moved files are read back out of the encrypted directory).
mod common;
// The engine tests' tree (every kind of entry) and manifest (everything a conversion must keep).
#[path = "../migrate/tests/common/mod.rs"]
mod engine;

use std::fs;
use std::io::Write;
use std::path::Path;

use common::{p, Env, Options};

/// Takes free space (reserved blocks included) until `left` bytes are available to users.
fn fill_until_available(dir: &Path, filler: &Path, left: u64) {
    let vfs = rustix::fs::statvfs(dir).unwrap();
    let avail = vfs.f_bavail * vfs.f_frsize;
    let f = fs::File::create(filler).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, avail - left).unwrap();
    f.sync_all().unwrap();
}

fn available(dir: &Path) -> u64 {
    let vfs = rustix::fs::statvfs(dir).unwrap();
    vfs.f_bavail * vfs.f_frsize
}

#[test]
fn a_nearly_full_filesystem_is_converted_by_moving_and_every_entry_stays_the_same() {
    dirseal_testfs::needs_root!();
    let env = Env::with(Options { size_mib: 1024, ..Default::default() });
    fs::create_dir(env.mnt().join("home")).unwrap();
    let home = env.mnt().join("home/gamer");
    engine::build_tree(&home);
    // A 600 MiB game file, written in 1 MiB blocks that all differ.
    fs::create_dir(home.join("games")).unwrap();
    let mut f = fs::File::create(home.join("games/big.pak")).unwrap();
    let mut block = vec![0u8; 1 << 20];
    for i in 0..600u32 {
        for (j, b) in block.iter_mut().enumerate() {
            *b = (i as usize * 31 + j / 4096) as u8;
        }
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    // The rest of the disk is taken by something else: room for a move, not for a copy.
    fill_until_available(env.mnt(), &env.mnt().join("other-data"), 110 << 20);
    let used = {
        let v = rustix::fs::statvfs(env.mnt()).unwrap();
        100 - v.f_bavail * 100 / v.f_blocks
    };
    assert!(used >= 85, "only {used}% full");
    let before = engine::manifest(&home);
    let out = env.run(&["convert", p(&home), "--yes", "--protector-name", "owner"], "pw\n");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("move mode: a copy needs") && stderr.contains("no backup window"), "{stderr}");
    assert!(stdout.contains("is now encrypted") && stdout.contains("of data moved"), "{stdout}");
    assert_eq!(env.status_json(&home)["encrypted"], true);
    engine::assert_same(&engine::manifest(&home), &before, "after the move");
    assert!(available(env.mnt()) > 100 << 20, "the old copy's space is free again");
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_crashed_move_is_aborted_after_a_reboot_with_the_secret() {
    dirseal_testfs::needs_root!();
    use dirseal_migrate::fault::Point;
    let mut env = Env::new();
    let home = env.mnt().join("h");
    engine::build_tree(&home);
    engine::add_large(&home);
    let before = engine::manifest(&home);
    let crash = |env: &Env| {
        let mut c = env
            .cmd(&["convert", p(&home), "--yes", "--protector-name", "owner", "--mode", "move"])
            .env("DIRSEAL_FAULT", format!("{}:7", Point::MoveChunkRecorded))
            .env("DIRSEAL_MOVE_CHUNK", "1048576")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(b"pw\n").unwrap();
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(99), "{}", String::from_utf8_lossy(&out.stderr));
    };
    crash(&env);
    let st: serde_json::Value =
        serde_json::from_str(&env.ok(&["convert", "--status", "--json", p(&home)], "")).unwrap();
    assert_eq!((st["state"].as_str(), st["method"].as_str()), (Some("moving"), Some("move")));
    // Logins are refused while the directory is half moved (PAM asks the library the same).
    assert!(dirseal::convert::in_progress(&home).unwrap());
    // A remount drops the staging key, like a reboot: the abort asks for the secret.
    env.fs.remount();
    let err = env.fails(&["convert", "--abort", p(&home)], "wrong\n");
    assert!(err.contains("incorrect password"), "{err}");
    let out = env.ok(&["convert", "--abort", p(&home)], "pw\n");
    assert!(out.contains("every file was moved back"), "{out}");
    engine::assert_same(&engine::manifest(&home), &before, "after aborting the move");
    assert_eq!(env.status_json(&home)["encrypted"], false);
}
