//! The engine in-process on real loop-mounted ext4, with a host whose staging directory is plain
//! (the engine is generic; encrypted staging is covered by the dirseal CLI tests). Deterministic
//! moments come from the host's numbered events (phase starts, stop polls, exchanges).
mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use common::host::{Event, PlainHost};
use common::{add_bulk, assert_same, build_tree, manifest, req, walk, wd_names, Case};
use dirseal_migrate::{self as migrate, Method, MigrateError, Mode, Phase, State};
use dirseal_testfs::Options;

fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn every_kind_of_entry_survives_exactly() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    let host = PlainHost::new();
    let out = migrate::convert(&req(&c.src, &c.wd), &host).unwrap();
    assert_eq!(out.state, State::Done);
    assert_eq!(out.token, "plain-token");
    assert_eq!(out.files, before.len() as u64 - 1, "entries below the root");
    assert_same(&manifest(&c.src), &before, "after conversion");
    assert_eq!(wd_names(&c.wd), ["journal.json", "lock"], "nothing but the journal and lock may remain");
    assert!(out.notes.iter().any(|n| n.contains("deleted, not overwritten")), "{:?}", out.notes);
    assert!(host.trims.lock().unwrap().is_empty(), "no TRIM without wipe");
    let phases = host.phases.lock().unwrap().clone();
    assert_eq!(
        phases,
        [Phase::Scanning, Phase::Copying, Phase::Verifying, Phase::Swapping, Phase::Disposing],
        "phases in order, each reported"
    );
    let st = migrate::status(&c.wd).unwrap().unwrap();
    assert_eq!((st.state, st.source.as_path(), st.backup), (State::Done, c.src.as_path(), None));
    // The work dir is root-only.
    let m = fs::metadata(&c.wd).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o700));
}

#[test]
fn a_resumed_copy_redoes_only_what_was_in_flight() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    add_bulk(&c.src, 150, 0);
    let before = manifest(&c.src);
    let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::stopping_at("poll-copying:80")).unwrap_err();
    assert!(matches!(e, MigrateError::Interrupted { state: State::Copying }), "{e:?}");
    assert!(e.to_string().contains("run the same command again"), "{e}");
    let st = migrate::status(&c.wd).unwrap().unwrap();
    assert_eq!(st.state, State::Copying);
    assert!(st.files_done > 0 && st.files_done < st.files_total, "{st:?}");
    // What the first run finished (files are linked into staging only when complete).
    let staging = c.wd.join("staging");
    let done: Vec<_> = walk(&staging)
        .into_iter()
        .filter(|r| fs::symlink_metadata(staging.join(r)).unwrap().is_file())
        .map(|r| (ino(&staging.join(&r)), r))
        .collect();
    assert!(done.len() > 20, "the first run copied {} files", done.len());
    let out = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Done);
    assert_same(&manifest(&c.src), &before, "after resume");
    for (i, rel) in &done {
        assert_eq!(ino(&c.src.join(rel)), *i, "{} was copied again", rel.display());
    }
}

#[test]
fn a_file_changed_during_its_copy_is_copied_again() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    fs::create_dir(&c.src).unwrap();
    let big = c.src.join("big");
    fs::write(&big, vec![1u8; 4 << 20]).unwrap();
    let b2 = big.clone();
    let changed = Mutex::new(false);
    // Polls during the copy: 1 before the file, then one per 1 MiB chunk. At the second the file
    // is half copied; it grows.
    let host = PlainHost::with(move |e, _| {
        if e == Event::Poll(Phase::Copying, 2) && !std::mem::replace(&mut *changed.lock().unwrap(), true) {
            use std::io::Write;
            fs::OpenOptions::new().append(true).open(&b2).unwrap().write_all(b"appended mid-copy").unwrap();
        }
    });
    let mut r = req(&c.src, &c.wd);
    r.threads = std::num::NonZeroUsize::MIN;
    let out = migrate::convert(&r, &host).unwrap();
    assert_eq!(out.state, State::Done);
    assert!(out.notes.iter().any(|n| n.contains("1 file(s) changed while being copied")), "{:?}", out.notes);
    let data = fs::read(&big).unwrap();
    assert_eq!(data.len(), (4 << 20) + 17);
    assert!(data.ends_with(b"appended mid-copy"));
}

#[test]
fn a_file_changed_before_verification_is_copied_again() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let target = c.src.join("a/plain.txt");
    let t2 = target.clone();
    let host = PlainHost::with(move |e, _| {
        if e == Event::PhaseStart(Phase::Verifying) && fs::read(&t2).unwrap() == b"hello" {
            fs::write(&t2, b"changed while the copy was being verified").unwrap();
        }
    });
    let out = migrate::convert(&req(&c.src, &c.wd), &host).unwrap();
    assert_eq!(out.state, State::Done);
    assert_eq!(fs::read(&target).unwrap(), b"changed while the copy was being verified");
    let phases = host.phases.lock().unwrap().clone();
    assert_eq!(phases.iter().filter(|p| **p == Phase::Copying).count(), 2, "a second copy pass: {phases:?}");
}

/// Overwrites bytes of a file in place, then puts its access and modification times back: same
/// size, same times, other bytes (only its ctime, which cannot be set, tells).
fn scribble(f: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let m = fs::metadata(f).unwrap();
    fs::OpenOptions::new().write(true).open(f).unwrap().write_all_at(bytes, at).unwrap();
    let t = |s, ns| rustix::fs::Timespec { tv_sec: s, tv_nsec: ns };
    let ts = rustix::fs::Timestamps {
        last_access: t(m.atime(), m.atime_nsec()),
        last_modification: t(m.mtime(), m.mtime_nsec()),
    };
    rustix::fs::utimensat(rustix::fs::CWD, f, &ts, rustix::fs::AtFlags::empty()).unwrap();
    assert_eq!(fs::metadata(f).unwrap().len(), m.len());
}

fn journal(wd: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(wd.join("journal.json")).unwrap()).unwrap()
}

#[test]
fn verification_catches_a_change_that_leaves_size_and_times_alone_and_stray_entries() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let deep = c.src.join("a/b/c/deep.bin");
    let (d2, stg) = (deep.clone(), c.wd.join("staging"));
    let once = std::sync::atomic::AtomicBool::new(false);
    let host = PlainHost::with(move |e, _| {
        if e == Event::PhaseStart(Phase::Verifying) && !once.swap(true, Ordering::SeqCst) {
            // Copied already, with matching metadata: verification must not trust it.
            scribble(&d2, 1000, b"XX");
            fs::write(stg.join("stray"), b"not in the source").unwrap();
        }
    });
    let before = manifest(&c.src);
    let out = migrate::convert(&req(&c.src, &c.wd), &host).unwrap();
    assert_eq!(out.state, State::Done);
    let phases = host.phases.lock().unwrap().clone();
    assert_eq!(phases.iter().filter(|p| **p == Phase::Verifying).count(), 2, "verified twice: {phases:?}");
    assert_eq!(&fs::read(&deep).unwrap()[1000..1002], b"XX", "the changed bytes were copied");
    assert!(!c.src.join("stray").exists());
    // Everything else as it was.
    let after = manifest(&c.src);
    assert_eq!(after.len(), before.len());
    let changed: Vec<_> = after.iter().filter(|(k, v)| before.get(*k) != Some(v)).map(|(k, _)| k.clone()).collect();
    assert_eq!(changed, [b"a/b/c/deep.bin".to_vec()]);
    // The copy pass was never interrupted: its start time stays recorded, so unchanged files are
    // checked by their metadata.
    assert!(journal(&c.wd)["copy_started"]["sec"].as_i64().unwrap() > 0);
}

/// A copy pass stopped half way and resumed (as after a power cut, which can take unsynced copies
/// with it) must compare every file byte for byte: a staging file with the right size and times
/// but other bytes is found and copied again.
#[test]
fn a_copy_pass_resumed_after_an_interruption_compares_every_file_again() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    add_bulk(&c.src, 300, 0);
    let before = manifest(&c.src);
    let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::stopping_at("poll-copying:200")).unwrap_err();
    assert!(matches!(e, MigrateError::Interrupted { state: State::Copying }), "{e:?}");
    assert!(!journal(&c.wd)["copy_started"].is_null(), "the first pass recorded its start");
    let bulk = c.wd.join("staging/bulk");
    let copied = fs::read_dir(&bulk).unwrap().next().expect("some files were copied before the stop").unwrap().path();
    scribble(&copied, 10, b"lost");
    let host = PlainHost::new();
    let out = migrate::convert(&req(&c.src, &c.wd), &host).unwrap();
    assert_eq!(out.state, State::Done);
    assert_same(&manifest(&c.src), &before, "after the resumed conversion");
    let phases = host.phases.lock().unwrap().clone();
    assert_eq!(phases.iter().filter(|p| **p == Phase::Verifying).count(), 2, "found and recopied: {phases:?}");
    assert!(journal(&c.wd)["copy_started"].is_null(), "a resumed pass drops the start time");
}

#[test]
fn a_tree_that_keeps_changing_gives_up_then_a_later_run_finishes() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let target = c.src.join("a/plain.txt");
    let t2 = target.clone();
    let host = PlainHost::with(move |e, _| {
        if e == Event::PhaseStart(Phase::Verifying) {
            let mut v = fs::read(&t2).unwrap();
            v.push(b'+');
            fs::write(&t2, v).unwrap();
        }
    });
    let e = migrate::convert(&req(&c.src, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::VerifyFailed { .. }), "{e:?}");
    assert!(e.to_string().contains("a/plain.txt") && e.to_string().contains("run the same command again"), "{e}");
    let before = manifest(&c.src);
    let out = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Done);
    assert_same(&manifest(&c.src), &before, "after the later run");
    assert_eq!(fs::read(&target).unwrap(), b"hello+++");
}

#[test]
fn out_of_space_mid_copy_keeps_the_source_and_resumes() {
    dirseal_testfs::needs_root!();
    let c = Case::with(Options { size_mib: 64, ..Default::default() });
    fs::create_dir(&c.src).unwrap();
    for i in 0..16 {
        fs::write(c.src.join(format!("f{i:02}")), vec![i as u8; 1 << 20]).unwrap();
    }
    let before = manifest(&c.src);
    let filler = c.fs.path().join("filler");
    let f2 = filler.clone();
    // Preflight sees room; then something else takes the space as the copy starts.
    let host = PlainHost::with(move |e, _| {
        if e == Event::PhaseStart(Phase::Copying) {
            let vfs = rustix::fs::statvfs(f2.parent().unwrap()).unwrap();
            let f = fs::File::create(&f2).unwrap();
            let free = vfs.f_bavail * vfs.f_frsize;
            rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, free - (3 << 20)).unwrap();
        }
    });
    let e = migrate::convert(&req(&c.src, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::OutOfSpace { .. }), "{e:?}");
    assert!(e.to_string().contains("free some space") && e.to_string().contains("the original is untouched"), "{e}");
    assert_same(&manifest(&c.src), &before, "after ENOSPC");
    assert_eq!(migrate::status(&c.wd).unwrap().unwrap().state, State::Copying);
    fs::remove_file(&filler).unwrap();
    let out = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Done);
    assert_same(&manifest(&c.src), &before, "after resume");
}

fn move_req<'a>(src: &'a Path, wd: &'a Path, mode: Mode) -> migrate::Request<'a> {
    migrate::Request { mode, ..req(src, wd) }
}

/// Takes free space (as root sees it, reserved blocks included) until `left` bytes remain.
fn fill_until(dir: &Path, filler: &Path, left: u64) {
    let vfs = rustix::fs::statvfs(dir).unwrap();
    let free = vfs.f_bfree * vfs.f_frsize;
    let f = fs::File::create(filler).unwrap();
    // Blocks the filesystem keeps for itself make the last few MiB unreachable: back off a little.
    let mut len = free.saturating_sub(left);
    while let Err(e) = rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, len) {
        assert_eq!(e, rustix::io::Errno::NOSPC);
        len -= len.min(1 << 20);
    }
}

fn available(dir: &Path) -> u64 {
    let vfs = rustix::fs::statvfs(dir).unwrap();
    vfs.f_bavail * vfs.f_frsize
}

#[test]
fn auto_copies_when_a_copy_fits_moves_when_not_and_refuses_below_a_move() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    common::add_large(&c.src);
    fs::write(c.src.join("large/big-60m"), vec![0x42u8; 60 << 20]).unwrap();
    let before = manifest(&c.src);
    let host = PlainHost::new();
    let plan = *migrate::preflight(&move_req(&c.src, &c.wd, Mode::Auto), &host).unwrap().census();
    assert_eq!((plan.method, plan.auto), (Method::Copy, true), "{plan:?}");
    assert!(plan.copy_needed > 60 << 20 && plan.move_needed < plan.copy_needed, "{plan:?}");
    // Leave room for a move but not for a copy.
    let filler = c.fs.path().join("filler");
    let room = (plan.move_needed + plan.copy_needed) / 2;
    let vfs = rustix::fs::statvfs(c.fs.path()).unwrap();
    let reserved = (vfs.f_bfree - vfs.f_bavail) * vfs.f_frsize;
    fill_until(c.fs.path(), &filler, room + reserved);
    assert!(available(c.fs.path()).abs_diff(room) < 1 << 20);
    let plan = *migrate::preflight(&move_req(&c.src, &c.wd, Mode::Auto), &host).unwrap().census();
    assert_eq!((plan.method, plan.auto), (Method::Move, true), "{plan:?}");
    let e = migrate::preflight(&move_req(&c.src, &c.wd, Mode::Copy), &host).unwrap_err();
    assert!(matches!(e, MigrateError::NoSpace { .. }), "{e:?}");
    let e = migrate::preflight(&migrate::Request { keep_backup: true, ..move_req(&c.src, &c.wd, Mode::Auto) }, &host)
        .unwrap_err();
    assert!(e.to_string().contains("a move keeps no backup"), "{e}");
    let e = migrate::preflight(&migrate::Request { keep_backup: true, ..move_req(&c.src, &c.wd, Mode::Move) }, &host)
        .unwrap_err();
    assert!(matches!(e, MigrateError::MoveWithBackup { .. }), "{e:?}");
    // Below what a move needs: refused, naming the amount, writing nothing.
    fs::remove_file(&filler).unwrap();
    fill_until(c.fs.path(), &filler, plan.move_needed / 2 + reserved);
    let e = migrate::convert(&move_req(&c.src, &c.wd, Mode::Auto), &host).unwrap_err();
    match &e {
        MigrateError::NoSpaceToMove { needed, available, .. } => assert!(needed > available, "{e:?}"),
        _ => panic!("{e:?}"),
    }
    assert!(e.to_string().contains("more and try again"), "{e}");
    assert!(!c.wd.exists(), "a refusal must write nothing");
    // With room for a move only, auto moves; every entry comes out as it was.
    fs::remove_file(&filler).unwrap();
    fill_until(c.fs.path(), &filler, room + reserved);
    let out = migrate::convert(&move_req(&c.src, &c.wd, Mode::Auto), &host).unwrap();
    assert_eq!((out.state, out.method), (State::Done, Method::Move));
    assert!(out.backup.is_none());
    assert_same(&manifest(&c.src), &before, "after an automatic move");
    assert_eq!(wd_names(&c.wd), ["journal.json", "lock"]);
    let st = migrate::status(&c.wd).unwrap().unwrap();
    assert_eq!((st.state, st.method), (State::Done, Method::Move));
}

/// A move counts data as a copy does: a sparse file's holes are not bytes to move (they made the
/// bar and the ETA lie, and the result claim sizes).
#[test]
fn a_move_counts_data_not_sizes() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    common::add_large(&c.src);
    let host = PlainHost::new();
    let census = *migrate::preflight(&move_req(&c.src, &c.wd, Mode::Move), &host).unwrap().census();
    assert!(census.data * 2 < census.bytes, "the tree is mostly holes: {census:?}");
    let out = migrate::convert(&move_req(&c.src, &c.wd, Mode::Move), &host).unwrap();
    assert_eq!((out.method, out.bytes), (Method::Move, census.data));
    let reports = host.reports.lock().unwrap();
    let moving: Vec<_> = reports.iter().filter(|p| p.phase == Phase::Moving).collect();
    assert!(moving.iter().all(|p| p.bytes_total == census.data), "{moving:?}");
    let most = moving.iter().map(|p| p.bytes_done).max().unwrap();
    assert!(most * 100 >= census.data * 95, "the move reported {most} of {} bytes", census.data);
}

/// A batch of small files waiting for its sync must not hold a descriptor per file: with the
/// usual soft limit of 1,024 descriptors a directory of more files failed with EMFILE.
/// Moves `c`'s tree with the open-file limit at 256; the result must be the original.
fn moves_within_256_descriptors(c: &Case) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = manifest(&c.src);
    let old = getrlimit(Resource::Nofile);
    setrlimit(Resource::Nofile, Rlimit { current: Some(256), maximum: old.maximum }).unwrap();
    let out = migrate::convert(&move_req(&c.src, &c.wd, Mode::Move), &PlainHost::new());
    setrlimit(Resource::Nofile, old).unwrap();
    let out = out.unwrap();
    assert_eq!((out.state, out.method), (State::Done, Method::Move));
    assert_same(&manifest(&c.src), &before, "after the move");
}

#[test]
fn a_move_batch_of_many_files_fits_a_low_descriptor_limit() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    fs::create_dir(&c.src).unwrap();
    add_bulk(&c.src, 600, 0);
    moves_within_256_descriptors(&c);
}

/// A batch that spans directories holds a descriptor per directory (the copies in flight one
/// more): many directories of one file each must fit a low limit too.
#[test]
fn a_move_batch_over_many_directories_fits_a_low_descriptor_limit() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    fs::create_dir(&c.src).unwrap();
    for i in 0..400 {
        let d = c.src.join(format!("d{i:03}"));
        fs::create_dir(&d).unwrap();
        fs::write(d.join("f"), format!("file {i}")).unwrap();
    }
    moves_within_256_descriptors(&c);
}

#[test]
fn out_of_space_mid_move_pauses_and_resumes() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    add_bulk(&c.src, 100, 0);
    common::add_large(&c.src);
    fs::write(c.src.join("large/big-40m"), vec![0x17u8; 40 << 20]).unwrap();
    let before = manifest(&c.src);
    let filler = c.fs.path().join("filler");
    let f2 = filler.clone();
    // Another program takes nearly all the space once the move has started.
    let host = PlainHost::with(move |e, _| {
        if e == Event::Poll(Phase::Moving, 20) {
            fill_until(f2.parent().unwrap(), &f2, 1 << 20);
        }
    });
    let e = migrate::convert(&move_req(&c.src, &c.wd, Mode::Move), &host).unwrap_err();
    assert!(matches!(e, MigrateError::MoveOutOfSpace { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("paused") && msg.contains("nothing is lost") && msg.contains("free some space"), "{msg}");
    assert_eq!(migrate::status(&c.wd).unwrap().unwrap().state, State::Moving);
    fs::remove_file(&filler).unwrap();
    let out = migrate::convert(&move_req(&c.src, &c.wd, Mode::Copy), &PlainHost::new()).unwrap();
    assert_eq!((out.state, out.method), (State::Done, Method::Move), "a resumed move stays a move");
    assert_same(&manifest(&c.src), &before, "after resuming the paused move");
}

#[test]
fn preflight_refuses_the_root_mounts_space_and_inodes_changing_nothing() {
    dirseal_testfs::needs_root!();
    let c = Case::with(Options { size_mib: 64, inodes: Some(4096), ..Default::default() });
    let host = PlainHost::new();
    let e = migrate::preflight(&req(c.fs.path(), &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::FilesystemRoot { .. }), "{e:?}");
    let e = migrate::convert(&req(Path::new("/"), &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::FilesystemRoot { .. }), "{e:?}");
    // Not enough space: 40 MiB cannot be copied next to itself on 64 MiB.
    let big = c.fs.path().join("big");
    fs::create_dir(&big).unwrap();
    let f = fs::File::create(big.join("data")).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 40 << 20).unwrap();
    let e = migrate::convert(&req(&big, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::NoSpace { .. }), "{e:?}");
    assert!(e.to_string().contains("more and try again"), "{e}");
    fs::remove_dir_all(&big).unwrap();
    // Not enough inodes.
    let many = c.fs.path().join("many");
    fs::create_dir(&many).unwrap();
    let vfs = rustix::fs::statvfs(c.fs.path()).unwrap();
    for i in 0..(vfs.f_favail * 2 / 3) {
        fs::write(many.join(i.to_string()), b"").unwrap();
    }
    let e = migrate::convert(&req(&many, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::NoInodes { .. }), "{e:?}");
    fs::remove_dir_all(&many).unwrap();
    // A mount point inside the tree, however deep.
    fs::create_dir_all(c.src.join("x/mnt")).unwrap();
    common::run("mount", &["-t".as_ref(), "tmpfs".as_ref(), "none".as_ref(), c.src.join("x/mnt").as_os_str()]);
    let e = migrate::convert(&req(&c.src, &c.wd), &host);
    common::run("umount", &[c.src.join("x/mnt").as_os_str()]);
    let e = e.unwrap_err();
    assert!(matches!(&e, MigrateError::MountPointInside { path } if path.ends_with("x/mnt")), "{e:?}");
    assert!(e.to_string().contains("unmount it"), "{e}");
    assert!(!c.wd.exists(), "a refusal must write nothing");
}

#[test]
fn preflight_refuses_encrypted_symlinks_files_and_bad_work_dirs() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    let enc = PlainHost::new();
    enc.encrypted.store(true, Ordering::SeqCst);
    let e = migrate::convert(&req(&c.src, &c.wd), &enc).unwrap_err();
    assert!(matches!(e, MigrateError::AlreadyEncrypted { .. }), "{e:?}");
    let host = PlainHost::new();
    let link = c.fs.path().join("link");
    std::os::unix::fs::symlink(&c.src, &link).unwrap();
    let e = migrate::convert(&req(&link, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::SourceIsSymlink { .. }), "{e:?}");
    let e = migrate::convert(&req(&c.src.join("a/plain.txt"), &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::NotADirectory { .. }), "{e:?}");
    let e = migrate::convert(&req(&c.fs.path().join("missing"), &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::SourceUnavailable { .. }), "{e:?}");
    // Work dirs: inside the source, on another filesystem, relative, too open, behind a symlink.
    let e = migrate::convert(&req(&c.src, &c.src.join("a/wd")), &host).unwrap_err();
    assert!(matches!(e, MigrateError::WorkdirInsideSource { .. }), "{e:?}");
    let elsewhere = c.fs.scratch().join("wd");
    let e = migrate::convert(&req(&c.src, &elsewhere), &host).unwrap_err();
    assert!(matches!(e, MigrateError::WorkdirElsewhere { .. }), "{e:?}");
    let e = migrate::convert(&req(&c.src, Path::new("relative/wd")), &host).unwrap_err();
    assert!(matches!(e, MigrateError::UnsafeWorkdir { .. }), "{e:?}");
    let open = c.fs.path().join("open-wd");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let e = migrate::convert(&req(&c.src, &open), &host).unwrap_err();
    assert!(matches!(e, MigrateError::UnsafeWorkdir { .. }) && e.to_string().contains("mode 755"), "{e:?}");
    // A parent others may write to (no sticky bit), or that a user owns: nothing is created
    // below it.
    let shared = c.fs.path().join("shared");
    fs::create_dir(&shared).unwrap();
    for (mode, owner, says) in [(0o777, 0, "chmod go-w"), (0o755, 4242, "belongs to uid 4242")] {
        fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&shared, Some(owner), None).unwrap();
        let e = migrate::convert(&req(&c.src, &shared.join("convert/wd")), &host).unwrap_err();
        assert!(matches!(e, MigrateError::UnsafeWorkdir { .. }) && e.to_string().contains(says), "{e:?}");
        assert!(fs::read_dir(&shared).unwrap().next().is_none(), "nothing may be created in {mode:o}/{owner}");
    }
    fs::create_dir(c.fs.path().join("real")).unwrap();
    std::os::unix::fs::symlink("real", c.fs.path().join("via-link")).unwrap();
    let e = migrate::convert(&req(&c.src, &c.fs.path().join("via-link/wd")), &host).unwrap_err();
    assert!(matches!(e, MigrateError::UnsafeWorkdir { .. }), "{e:?}");
    // An immutable or append-only directory itself (the swap renames it, which they forbid;
    // entries inside are kept, see crash.rs).
    for flag in ["+i", "+a"] {
        common::run("chattr", &[flag.as_ref(), c.src.as_os_str()]);
        let e = migrate::convert(&req(&c.src, &c.wd), &host).unwrap_err();
        common::run("chattr", &["-i".as_ref(), "-a".as_ref(), c.src.as_os_str()]);
        assert!(matches!(&e, MigrateError::ImmutableInside { path } if *path == c.src), "{e:?}");
        assert!(e.to_string().contains("chattr -i -a"), "{e}");
    }
    assert_same(&manifest(&c.src), &before, "after refusals");
    assert!(!c.wd.exists() && !c.fs.path().join("real/wd").exists(), "a refusal must write nothing");
}

#[test]
fn a_directory_in_use_is_refused_and_named_unless_forced() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let host = PlainHost::new();
    for (script, how) in
        [("cd a/b && echo ready && read _", "cwd"), ("exec 3<a/plain.txt; echo ready; read _", "open file")]
    {
        let mut child = std::process::Command::new("sh")
            .args(["-c", script])
            .current_dir(&c.src)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The child says when it is set up.
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line).unwrap();
        assert_eq!(line, "ready\n");
        let e = migrate::convert(&req(&c.src, &c.wd), &host).unwrap_err();
        let pre = migrate::preflight(&req(&c.src, &c.wd), &host).unwrap_err();
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(matches!(e, MigrateError::InUse { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("pid {} (sh", child.id())) && msg.contains(how), "{msg}");
        assert!(msg.contains("close these programs"), "{msg}");
        assert!(matches!(pre, MigrateError::InUse { .. }), "{pre:?}");
    }
    assert!(!c.wd.exists(), "a refusal must write nothing");
    // Forcing skips that check (and only that one).
    let mut child = std::process::Command::new("sh")
        .args(["-c", "read _"])
        .current_dir(&c.src)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = req(&c.src, &c.wd);
    r.force = true;
    let enc = PlainHost::new();
    enc.encrypted.store(true, Ordering::SeqCst);
    let refused = migrate::preflight(&r, &enc);
    let before = manifest(&c.src);
    let out = migrate::convert(&r, &host);
    drop(child.stdin.take());
    child.wait().unwrap();
    assert!(matches!(refused, Err(MigrateError::AlreadyEncrypted { .. })), "{refused:?}");
    assert_eq!(out.unwrap().state, State::Done);
    assert_same(&manifest(&c.src), &before, "after a forced conversion");
}

#[test]
fn a_second_converter_is_refused_while_the_first_runs() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let (go_rx, started_tx) = (Mutex::new(go_rx), Mutex::new(started_tx));
    let host = PlainHost::with(move |e, _| {
        if e == Event::PhaseStart(Phase::Copying) {
            started_tx.lock().unwrap().send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
        }
    });
    std::thread::scope(|s| {
        let first = s.spawn(|| migrate::convert(&req(&c.src, &c.wd), &host));
        started_rx.recv().unwrap();
        let pid = std::process::id();
        for e in [
            migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap_err(),
            migrate::preflight(&req(&c.src, &c.wd), &PlainHost::new()).unwrap_err(),
            migrate::abort(&c.wd, &PlainHost::new()).unwrap_err(),
        ] {
            assert!(matches!(e, MigrateError::Busy { pid: Some(p), .. } if p == pid), "{e:?}");
            assert!(e.to_string().contains(&format!("pid {pid}")), "{e}");
        }
        go_tx.send(()).unwrap();
        assert_eq!(first.join().unwrap().unwrap().state, State::Done);
    });
}

#[test]
fn interrupted_in_every_phase_then_resumed() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    let mut n = 0;
    for (spec, state) in [
        ("poll-scanning:2", None),
        ("poll-copying:1", Some(State::Copying)),
        ("poll-copying:30", Some(State::Copying)),
        ("poll-verifying:1", Some(State::Copied)),
        ("poll-verifying:25", Some(State::Copied)),
        ("poll-disposing:1", Some(State::Swapped)),
        ("poll-disposing:30", Some(State::Swapped)),
    ] {
        n += 1;
        let (src, wd) = c.other(&format!("h{n}"));
        build_tree(&src);
        let before = manifest(&src);
        let e = migrate::convert(&req(&src, &wd), &PlainHost::stopping_at(spec)).unwrap_err();
        let want = state.unwrap_or(State::Prepared);
        assert!(matches!(e, MigrateError::Interrupted { state } if state == want), "{spec}: {e:?}");
        assert_same(&manifest(&src), &before, spec);
        // The journal says where it stopped (nothing at all when stopped before it was written).
        assert_eq!(migrate::status(&wd).unwrap().map(|s| s.state), state, "{spec}");
        let out = migrate::convert(&req(&src, &wd), &PlainHost::new()).unwrap();
        assert_eq!(out.state, State::Done, "{spec}");
        assert_same(&manifest(&src), &before, spec);
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{spec}");
    }
}

#[test]
fn abort_before_the_swap_leaves_the_original_and_removes_the_copy() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    let original = ino(&c.src);
    for spec in ["poll-copying:20", "poll-verifying:10"] {
        let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::stopping_at(spec)).unwrap_err();
        assert!(matches!(e, MigrateError::Interrupted { .. }), "{e:?}");
        assert!(c.wd.join("staging").exists());
        let out = migrate::abort(&c.wd, &PlainHost::new()).unwrap();
        assert_eq!(out.state, State::Aborted);
        assert_eq!(ino(&c.src), original, "the original directory itself stays");
        assert_same(&manifest(&c.src), &before, "after abort");
        assert_eq!(wd_names(&c.wd), ["journal.json", "lock"]);
        assert_eq!(migrate::status(&c.wd).unwrap().unwrap().state, State::Aborted);
        // Aborting again is harmless; rolling back or committing an aborted one is refused.
        assert_eq!(migrate::abort(&c.wd, &PlainHost::new()).unwrap().state, State::Aborted);
        let e = migrate::rollback(&c.wd, &PlainHost::new()).unwrap_err();
        assert!(matches!(e, MigrateError::WrongState { state: State::Aborted, .. }), "{e:?}");
        let e = migrate::commit(&c.wd, &PlainHost::new()).unwrap_err();
        assert!(matches!(e, MigrateError::WrongState { .. }), "{e:?}");
    }
    // A fresh conversion after an abort works.
    assert_eq!(migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap().state, State::Done);
    assert_same(&manifest(&c.src), &before, "after converting");
    let e = migrate::abort(&c.wd, &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::WrongState { state: State::Done, .. }), "{e:?}");
    let (_, none) = c.other("never");
    assert!(matches!(migrate::abort(&none, &PlainHost::new()), Err(MigrateError::NoConversion { .. })));
}

#[test]
fn keep_backup_then_rollback_restores_the_original() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    let original = ino(&c.src);
    let mut r = req(&c.src, &c.wd);
    r.keep_backup = true;
    let out = migrate::convert(&r, &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Swapped);
    let backup = out.backup.clone().unwrap();
    assert_eq!(backup, c.wd.join("staging"));
    assert_eq!(ino(&backup), original, "the backup is the original tree itself");
    assert_ne!(ino(&c.src), original);
    assert_same(&manifest(&c.src), &before, "the copy in place");
    assert_same(&manifest(&backup), &before, "the backup");
    assert!(out.notes.iter().any(|n| n.contains("kept as a backup")), "{:?}", out.notes);
    assert_eq!(migrate::status(&c.wd).unwrap().unwrap().backup, Some(backup.clone()));
    // Running the conversion again changes nothing; abort is refused with a pointer to rollback.
    assert_eq!(migrate::convert(&r, &PlainHost::new()).unwrap().state, State::Swapped);
    let e = migrate::abort(&c.wd, &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::WrongState { .. }) && e.to_string().contains("roll back"), "{e}");
    let out = migrate::rollback(&c.wd, &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::RolledBack);
    assert_eq!(ino(&c.src), original, "the original directory is back in place");
    assert_same(&manifest(&c.src), &before, "after rollback");
    assert_eq!(wd_names(&c.wd), ["journal.json", "lock"], "the copy is removed");
    assert_eq!(migrate::rollback(&c.wd, &PlainHost::new()).unwrap().state, State::RolledBack);
}

#[test]
fn keep_backup_then_commit_removes_the_backup() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    let mut r = req(&c.src, &c.wd);
    r.keep_backup = true;
    let out = migrate::convert(&r, &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Swapped);
    let copy = ino(&c.src);
    let out = migrate::commit(&c.wd, &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Done);
    assert_eq!(out.backup, None);
    assert_eq!(ino(&c.src), copy);
    assert_same(&manifest(&c.src), &before, "after commit");
    assert_eq!(wd_names(&c.wd), ["journal.json", "lock"], "the backup is removed");
    assert_eq!(migrate::commit(&c.wd, &PlainHost::new()).unwrap().state, State::Done);
    let e = migrate::rollback(&c.wd, &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::WrongState { state: State::Done, .. }), "{e:?}");
}

#[test]
fn wipe_overwrites_old_contents_then_trims_and_says_what_that_cannot_promise() {
    dirseal_testfs::needs_root!();
    use std::io::{Read, Seek};
    let c = Case::new();
    fs::create_dir_all(c.src.join("d")).unwrap();
    fs::write(c.src.join("secret"), b"plaintext that must go").unwrap();
    fs::write(c.src.join("d/big"), vec![b'p'; 3 << 20]).unwrap();
    fs::hard_link(c.src.join("d/big"), c.src.join("big-too")).unwrap();
    let (src2, wd2) = c.other("plain");
    fs::create_dir(&src2).unwrap();
    fs::write(src2.join("secret"), b"plaintext that stays on disk").unwrap();
    // Handles on the old inodes show what happens to their blocks after the conversion.
    let mut held: Vec<fs::File> = ["secret", "d/big"].iter().map(|n| fs::File::open(c.src.join(n)).unwrap()).collect();
    let mut held2 = fs::File::open(src2.join("secret")).unwrap();
    let host = PlainHost::new();
    let mut r = req(&c.src, &c.wd);
    r.wipe = true;
    r.force = true; // our own handles are not users (the engine skips its own process anyway)
    let out = migrate::convert(&r, &host).unwrap();
    assert_eq!(out.state, State::Done);
    assert_eq!(fs::read(c.src.join("secret")).unwrap(), b"plaintext that must go");
    for f in &mut held {
        let mut data = Vec::new();
        f.rewind().unwrap();
        f.read_to_end(&mut data).unwrap();
        assert!(!data.is_empty() && data.iter().all(|b| *b == 0), "old contents overwritten");
    }
    assert_eq!(host.trims.lock().unwrap().len(), 1, "TRIM requested once");
    assert!(out.notes.iter().any(|n| n.contains("SSD") && n.contains("does not guarantee")), "{:?}", out.notes);
    // Without wipe the old blocks keep the plaintext (and the note says so).
    let host2 = PlainHost::new();
    let out = migrate::convert(&req(&src2, &wd2), &host2).unwrap();
    let mut data = Vec::new();
    held2.read_to_end(&mut data).unwrap();
    assert_eq!(data, b"plaintext that stays on disk");
    assert!(out.notes.iter().any(|n| n.contains("deleted, not overwritten")), "{:?}", out.notes);
    assert!(host2.trims.lock().unwrap().is_empty());
}

#[test]
fn hard_links_leaving_the_tree_are_reported() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    fs::create_dir(&c.src).unwrap();
    fs::write(c.src.join("shared"), b"also outside").unwrap();
    fs::hard_link(c.src.join("shared"), c.fs.path().join("outside-link")).unwrap();
    let out = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap();
    assert!(out.notes.iter().any(|n| n.contains("1 file(s) also had hard links outside")), "{:?}", out.notes);
    assert_eq!(fs::read(c.fs.path().join("outside-link")).unwrap(), b"also outside");
    assert_eq!(fs::metadata(c.src.join("shared")).unwrap().nlink(), 1, "the copy is its own inode");
}

#[test]
fn a_corrupt_journal_is_named_with_what_to_do() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::stopping_at("poll-copying:5")).unwrap_err();
    assert!(matches!(e, MigrateError::Interrupted { .. }));
    let journal = c.wd.join("journal.json");
    let good = fs::read_to_string(&journal).unwrap();
    let v: serde_json::Value = serde_json::from_str(&good).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = v.clone();
        f(&mut v);
        v.to_string()
    };
    let bad = [
        "{ not json".to_string(),
        String::new(),
        edit(&|v| v["version"] = 2.into()),
        edit(&|v| v["step"] = serde_json::json!({"name": "teleporting"})),
        edit(&|v| v["step"] = serde_json::json!({"name": "copying", "round": 99})),
        edit(&|v| v["files_done"] = (v["files_total"].as_u64().unwrap() + 1).into()),
        edit(&|v| v["staging_ino"] = v["source_ino"].clone()),
        edit(&|v| v["source"] = "2e2e2f6574632f".into()),
        edit(&|v| v["extra"] = true.into()),
        edit(&|v| {
            v.as_object_mut().unwrap().remove("token");
        }),
    ];
    for text in &bad {
        fs::write(&journal, text).unwrap();
        for e in [
            migrate::status(&c.wd).unwrap_err(),
            migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap_err(),
            migrate::abort(&c.wd, &PlainHost::new()).unwrap_err(),
        ] {
            assert!(matches!(e, MigrateError::CorruptJournal { .. }), "{text}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains(&journal.display().to_string()) && msg.contains("staging"), "{msg}");
        }
    }
    fs::write(&journal, good).unwrap();
    assert_eq!(migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap().state, State::Done);
}

/// The user moves her directory away and leaves a symlink to another one holding a `data`.
fn redirect(users: &Path) {
    fs::rename(users.join("alice"), users.join("moved")).unwrap();
    std::os::unix::fs::symlink("decoy", users.join("alice")).unwrap();
}

fn put_back(users: &Path) {
    fs::remove_file(users.join("alice")).unwrap();
    fs::rename(users.join("moved"), users.join("alice")).unwrap();
}

#[test]
fn a_symlink_put_in_the_source_path_is_never_followed() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    let users = c.fs.path().join("users");
    let src = users.join("alice/data");
    let wd = c.fs.path().join(".dirseal/convert/alice");
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(users.join("decoy/data")).unwrap();
    fs::write(src.join("f"), b"mine").unwrap();
    let before = manifest(&src);
    for moment in [Event::PhaseStart(Phase::Swapping), Event::ExchangeBefore(1)] {
        let u = users.clone();
        let host = PlainHost::with(move |e, _| {
            if e == moment {
                redirect(&u);
            }
        });
        let e = migrate::convert(&req(&src, &wd), &host).unwrap_err();
        match moment {
            // The engine looks again just before the swap, without following symlinks.
            Event::PhaseStart(_) => {
                assert!(matches!(e, MigrateError::SourceReplaced { .. }), "{e:?}");
                assert!(e.to_string().contains("put the directory back"), "{e}");
            }
            // Between that look and the rename: the rename goes through the handles opened at the
            // look, so it swaps the genuine source wherever it was moved, never the decoy; the
            // look after it finds the path redirected.
            _ => assert!(matches!(e, MigrateError::SourceReplaced { .. }), "{e:?}"),
        }
        assert_eq!(fs::read_dir(users.join("decoy/data")).unwrap().count(), 0, "the decoy is untouched");
        assert_eq!(migrate::status(&wd).unwrap().unwrap().state, State::Verified);
        put_back(&users);
        assert_same(&manifest(&src), &before, "the original, put back");
    }
    let mut r = req(&src, &wd);
    r.keep_backup = true;
    // The journal was started without keep_backup; resuming keeps its settings.
    assert_eq!(migrate::convert(&r, &PlainHost::new()).unwrap().state, State::Done);
    assert_same(&manifest(&src), &before, "after resume");
    // Rollback follows the journal's path, and refuses a redirected one the same way.
    let (src2, wd2) = (users.join("alice/data2"), c.fs.path().join(".dirseal/convert/alice2"));
    fs::create_dir(&src2).unwrap();
    fs::create_dir(users.join("decoy/data2")).unwrap();
    let mut r = req(&src2, &wd2);
    r.keep_backup = true;
    assert_eq!(migrate::convert(&r, &PlainHost::new()).unwrap().state, State::Swapped);
    redirect(&users);
    let e = migrate::rollback(&wd2, &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::SourceReplaced { .. }), "{e:?}");
    assert_eq!(fs::read_dir(users.join("decoy/data2")).unwrap().count(), 0, "the decoy is untouched");
    put_back(&users);
    assert_eq!(migrate::rollback(&wd2, &PlainHost::new()).unwrap().state, State::RolledBack);
}

#[test]
fn a_hostile_tree_cannot_make_root_follow_a_symlink() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    fs::create_dir_all(c.src.join("docs/inner")).unwrap();
    fs::write(c.src.join("docs/inner/note"), b"mine").unwrap();
    fs::write(c.src.join("docs/f"), b"x").unwrap();
    let outside = c.fs.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"root only").unwrap();
    let (src, out2) = (c.src.clone(), outside.clone());
    // As the copy starts, the user swaps a directory for a symlink to the outside.
    let host = PlainHost::with(move |e, _| {
        if e == Event::PhaseStart(Phase::Copying) {
            fs::remove_dir_all(src.join("docs/inner")).unwrap();
            std::os::unix::fs::symlink(&out2, src.join("docs/inner")).unwrap();
        }
    });
    let out = migrate::convert(&req(&c.src, &c.wd), &host).unwrap();
    assert_eq!(out.state, State::Done);
    assert!(fs::symlink_metadata(c.src.join("docs/inner")).unwrap().file_type().is_symlink());
    // Neither the copy nor disposing of the old tree (which held the symlink) followed it.
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"root only");
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 1);
}

/// f2fs gives a directory moved to another parent a new mtime (it rewrites its ".." entry); the
/// VM tests (scripts/vm-test.sh) found converted homes with the conversion's time as mtime. This
/// host does the same on ext4: after every exchange both roots get the current time.
fn f2fs_like_exchange(src: &Path, wd: &Path) -> PlainHost {
    let (src, staging) = (src.to_path_buf(), wd.join("staging"));
    PlainHost::with(move |e, _| {
        if matches!(e, Event::ExchangeAfter(_)) {
            for d in [&src, &staging] {
                let now = std::time::SystemTime::now();
                fs::File::open(d).unwrap().set_times(fs::FileTimes::new().set_accessed(now).set_modified(now)).unwrap();
            }
        }
    })
}

#[test]
fn the_roots_keep_their_times_when_the_exchange_changes_them() {
    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    assert_eq!(migrate::convert(&req(&c.src, &c.wd), &f2fs_like_exchange(&c.src, &c.wd)).unwrap().state, State::Done);
    assert_same(&manifest(&c.src), &before, "after conversion");

    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    let host = f2fs_like_exchange(&c.src, &c.wd);
    assert_eq!(migrate::convert(&move_req(&c.src, &c.wd, Mode::Move), &host).unwrap().state, State::Done);
    assert_same(&manifest(&c.src), &before, "after a move");

    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    let mut r = req(&c.src, &c.wd);
    r.keep_backup = true;
    let host = f2fs_like_exchange(&c.src, &c.wd);
    assert_eq!(migrate::convert(&r, &host).unwrap().state, State::Swapped);
    assert_same(&manifest(&c.src), &before, "the copy in place");
    assert_same(&manifest(&c.wd.join("staging")), &before, "the backup");
    assert_eq!(migrate::rollback(&c.wd, &host).unwrap().state, State::RolledBack);
    assert_same(&manifest(&c.src), &before, "after rollback");
}
