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
    // A sparse disk image: 2 GiB in size, 1 MiB of data. The result counts data, not sizes.
    let img = fs::File::create(home.join("games/disk.img")).unwrap();
    img.set_len(2 << 30).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&img, &block, 1 << 30).unwrap();
    drop(img);
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
    // About 600 MiB of data moved (not the 2.6 GiB the sizes add up to).
    assert!(stdout.contains(" MiB of data moved (files' apparent size 2.6"), "{stdout}");
    assert_eq!(env.status_json(&home)["encrypted"], true);
    engine::assert_same(&engine::manifest(&home), &before, "after the move");
    assert!(available(env.mnt()) > 100 << 20, "the old copy's space is free again");
}

/// Hard links cost a move no space: a 100 MiB file with a second name and a group of three
/// (engine::build_tree's) on a filesystem with room for neither a copy nor, before groups moved,
/// the copy of the linked file; SIGKILLs at spread moments, each resumed; the link groups and
/// everything else come out the same.
#[test]
fn hard_linked_files_move_once_and_keep_their_links_across_sigkills() {
    dirseal_testfs::needs_root!();
    let env = Env::with(Options { size_mib: 256, ..Default::default() });
    let home = env.mnt().join("store");
    engine::build_tree(&home);
    let mut f = fs::File::create(home.join("blob")).unwrap();
    let mut block = vec![0u8; 1 << 20];
    for i in 0..100u32 {
        for (j, b) in block.iter_mut().enumerate() {
            *b = (i as usize * 7 + j / 512) as u8;
        }
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    fs::hard_link(home.join("blob"), home.join("a/b/blob-again")).unwrap();
    // Room for the move's chunks and batches, not for a second copy of the blob.
    fill_until_available(env.mnt(), &env.mnt().join("other-data"), 75 << 20);
    let before = engine::manifest(&home);
    let args = ["convert", p(&home), "--yes", "--protector-name", "owner", "--mode", "auto"];
    for delay_ms in [150u64, 400, 700, 1000, 1500] {
        let mut child = env
            .cmd(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(b"pw\n");
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("not enough free space"), "{stderr}");
        let state = env.status_json(&home)["conversion"].clone();
        eprintln!("killed at {delay_ms} ms: conversion {state}");
        if state == "done" {
            break;
        }
    }
    if env.status_json(&home)["conversion"] != "done" {
        env.ok(&args, "pw\n");
    }
    let st = env.status_json(&home);
    assert_eq!((st["encrypted"].as_bool(), st["conversion"].as_str()), (Some(true), Some("done")));
    engine::assert_same(&engine::manifest(&home), &before, "after the killed and resumed move");
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
            .env("DIRSEAL_FAULT", format!("{}:4", Point::MoveChunkRecorded))
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
