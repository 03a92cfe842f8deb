//! Crashes in a separate process, then resume: at every fault point (the process exits on the
//! spot), by SIGKILL at numbered moments of every phase, by SIGKILL of a lock holder; and an
//! entry the converter cannot read. After every crash the directory must read exactly as before,
//! and running the same operation again must finish the job.
#![cfg(feature = "fault-injection")]
mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{add_bulk, assert_same, build_tree, changes, manifest, wd_names, Case};
use dirseal_migrate::{self as migrate, fault::Point, MigrateError, State};

const CHILD: &str = env!("CARGO_BIN_EXE_dirseal-migrate-test-child");

struct Run {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn show(&self) -> String {
        format!("code {:?} signal {:?}\n{}{}", self.code, self.signal, self.stdout, self.stderr)
    }
}

fn child(op: &str, src: &Path, wd: &Path, flags: &[&str], env: &[(&str, String)]) -> Run {
    let mut c = Command::new(CHILD);
    c.arg(op).arg(src).arg(wd).args(flags).env_remove("DIRSEAL_FAULT").env_remove("TEST_KILL");
    // Move mode in 1 MiB chunks and batches of 8 files: a small tree still moves in many of each.
    c.env("DIRSEAL_MOVE_CHUNK", "1048576").env("DIRSEAL_MOVE_BATCH", "8");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.stdin(Stdio::null()).output().unwrap();
    Run {
        code: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[track_caller]
fn finishes(op: &str, src: &Path, wd: &Path, flags: &[&str], state: &str) {
    let r = child(op, src, wd, flags, &[]);
    assert!(r.code == Some(0) && r.stdout.contains(&format!("state={state}")), "{op} {}: {}", src.display(), r.show());
}

#[track_caller]
fn faults(op: &str, src: &Path, wd: &Path, flags: &[&str], point: &str) {
    let r = child(op, src, wd, flags, &[("DIRSEAL_FAULT", point.to_string())]);
    assert_eq!(r.code, Some(99), "{op} should die at {point}: {}", r.show());
}

#[track_caller]
fn killed(op: &str, src: &Path, wd: &Path, flags: &[&str], spec: &str) {
    let r = child(op, src, wd, flags, &[("TEST_KILL", spec.to_string())]);
    assert_eq!(r.signal, Some(9), "{op} should be killed at {spec}: {}", r.show());
}

/// The operation a crash test runs to reach a fault point.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    /// A conversion, then a resume.
    Convert,
    /// A conversion whose verification finds a file changed (it is appended to), then a resume.
    Recopy,
    /// A conversion stopped after its copy, an abort, then the abort again.
    Abort,
    /// An aborted conversion, a new conversion clearing its leftovers, then a resume.
    Leftover,
    /// A conversion that keeps its backup, a rollback, then the rollback again.
    Rollback,
    /// A conversion that keeps its backup, a commit, then the commit again.
    Commit,
    /// A live conversion (it stops caught up), then a resume or an abort.
    Live,
    /// A live conversion caught up, changed, then committed (run `Now`), then a resume.
    LiveCommit,
    /// A move, then a resume.
    Move,
    /// A move stopped with a large file moved and one in flight, an abort, then the abort again.
    MoveAbort,
    /// A move stopped while a hard-link group's names are linked in staging, an abort, then the
    /// abort again.
    GroupAbort,
    /// A conversion of a tree with immutable and append-only entries, then a resume.
    Sealed,
}

/// One crash: at the `at`-th arrival at the point, during `op`, run with `flags`.
struct Crash {
    op: Op,
    at: u32,
    flags: &'static [&'static str],
}

fn at(op: Op, at: u32) -> Crash {
    Crash { op, at, flags: &[] }
}

/// How the tests reach every point of `Point::ALL`. The match is exhaustive, so a new point does
/// not compile until it has a crash test here.
fn crashes(p: Point) -> Vec<Crash> {
    use Op::*;
    use Point::*;
    const WIPE: &[&str] = &["--wipe"];
    match p {
        // Reached by dirseal's host only (its keystore writes): tests/convert.rs and
        // tests/decrypt.rs crash there.
        AfterProtectorSaved
        | AfterPolicySaved
        | CleanupRecoveryRemoved
        | CleanupRecorded
        | CleanupPolicySaved
        | CleanupProtectorRemoved
        | CleanupPolicyRemoved
        | AfterPolicyForgotten
        | CleanupKeyRemoved => vec![],
        AfterStagingCreated | BeforeRecordPrepared | AfterPrepare | AfterRecordCopying | BeforeRecordCopied
        | AfterVerify | AfterRecordSwapped => {
            vec![at(Convert, 1)]
        }
        AfterRecordCopied | AfterRecordVerified | AfterSwap => vec![at(Convert, 1), at(LiveCommit, 1)],
        AfterRecordCatchingUp | AfterRecordCaughtUp => vec![at(Live, 1)],
        AfterManifestWritten => vec![at(Live, 1), at(Live, 2), at(LiveCommit, 1)],
        AfterRecordCommitting => vec![at(LiveCommit, 1)],
        CopyFile => vec![at(Convert, 1), at(Convert, 7)],
        CopySpecialMade => vec![at(Convert, 1)],
        SealEntry => vec![at(Sealed, 1), at(Sealed, 2), at(Sealed, 4)],
        // Dies before the flags of an empty directory (compression on a/b) are set.
        CopyDirMade => vec![at(Convert, 1), at(Convert, 3), at(Convert, 6)],
        MoveDirMade => vec![at(Move, 1), at(Move, 3), at(Move, 6)],
        CopySpecial => vec![at(Convert, 3)],
        CopyDir => vec![at(Convert, 2)],
        VerifyEntry => vec![at(Convert, 5)],
        AfterRecordRecopy => vec![at(Recopy, 1)],
        AfterRecordDisposing => vec![at(Convert, 1), at(Commit, 1)],
        MidDispose => vec![Crash { op: Convert, at: 1, flags: WIPE }],
        DisposeEntry => vec![at(Convert, 20), at(Commit, 10)],
        BeforeTrim => vec![Crash { op: Convert, at: 1, flags: WIPE }],
        AfterRecordDone => vec![at(Convert, 1), at(Commit, 1), at(LiveCommit, 1)],
        AfterRecordAborted => vec![at(Abort, 1), at(MoveAbort, 1)],
        AfterRecordMoving | AfterRecordSettling | AfterRecordMoved => vec![at(Move, 1)],
        MoveEntryCopied => vec![at(Move, 1), at(Move, 40), at(MoveAbort, 1), at(MoveAbort, 10)],
        MoveBatchSynced => vec![at(Move, 1), at(Move, 2), at(MoveAbort, 1)],
        MoveEntryRemoved => vec![at(Move, 1), at(Move, 20), at(MoveAbort, 3)],
        MoveFileStarted => vec![at(Move, 1), at(Move, 2), at(MoveAbort, 1)],
        MoveChunkCopied => vec![at(Move, 1), at(Move, 3), at(MoveAbort, 1), at(MoveAbort, 2)],
        MoveChunkRecorded => vec![at(Move, 1), at(Move, 2), at(Move, 4), at(MoveAbort, 1), at(MoveAbort, 3)],
        MoveLinkMade => vec![at(Move, 1), at(Move, 2), at(Move, 3), at(GroupAbort, 1), at(GroupAbort, 2)],
        MoveLinkRemoved => vec![at(Move, 1), at(Move, 2), at(GroupAbort, 1), at(GroupAbort, 2)],
        MoveFileDone => vec![at(Move, 1), at(Move, 2), at(MoveAbort, 1), at(MoveAbort, 2), at(GroupAbort, 1)],
        SettleDir | SettleTimesKept => vec![at(Move, 1), at(Move, 5)],
        AfterRecordMovingBack | BeforeRecordAbortedMove => vec![at(MoveAbort, 1)],
        AbortEntry => vec![at(Abort, 1), at(Abort, 15)],
        LeftoverEntry => vec![at(Leftover, 5)],
        AfterRecordRollingBack | RollbackAfterSwap | RollbackBeforeRecord => vec![at(Rollback, 1)],
        RollbackEntry => vec![at(Rollback, 10)],
    }
}

/// Every (point spec, flags) of `Point::ALL` that `op` reaches.
fn points_of(op: Op) -> Vec<(String, &'static [&'static str])> {
    let mut out = Vec::new();
    for &p in Point::ALL {
        for c in crashes(p).into_iter().filter(|c| c.op == op) {
            out.push((format!("{p}:{}", c.at), c.flags));
        }
    }
    assert!(!out.is_empty(), "no point is reached by {op:?}");
    out
}

#[test]
fn a_crash_at_every_fault_point_of_a_conversion_loses_nothing_and_resumes() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    for (i, (point, flags)) in points_of(Op::Convert).iter().enumerate() {
        let (src, wd) = c.other(&format!("p{i}"));
        build_tree(&src);
        let before = manifest(&src);
        faults("convert", &src, &wd, flags, point);
        assert_same(&manifest(&src), &before, &format!("right after the crash at {point}"));
        finishes("convert", &src, &wd, flags, "done");
        assert_same(&manifest(&src), &before, &format!("after resuming from {point}"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
    }
}

/// A live conversion killed at each of its steps: the directory is as it was, and it resumes (live,
/// then committed) or aborts, leaving only the journal and the lock. Its commit killed at each of
/// its steps resumes and swaps the directory as it was when the commit began.
#[test]
fn a_crash_at_every_step_of_a_live_conversion_loses_nothing() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    const LIVE: &[&str] = &["--live"];
    for (i, (point, _)) in points_of(Op::Live).iter().enumerate() {
        for abort in [false, true] {
            let (src, wd) = c.other(&format!("lv{i}-{abort}"));
            build_tree(&src);
            let before = manifest(&src);
            faults("convert", &src, &wd, LIVE, point);
            assert_same(&manifest(&src), &before, &format!("right after the crash at {point}"));
            if abort {
                finishes("abort", &src, &wd, &[], "aborted");
            } else {
                finishes("convert", &src, &wd, LIVE, "caught up");
                finishes("convert", &src, &wd, &[], "done");
            }
            assert_same(&manifest(&src), &before, &format!("after the crash at {point} (abort: {abort})"));
            assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
        }
    }
    // Killed half way through a catch-up pass (at its 5th file copied), and through the commit's:
    // each redone, and the copy is the source.
    for commit in [false, true] {
        let (src, wd) = c.other(&format!("lmid-{commit}"));
        build_tree(&src);
        add_bulk(&src, 40, 0);
        finishes("convert", &src, &wd, LIVE, "caught up");
        for i in 0..20 {
            let f = src.join(format!("bulk/f{i:04}"));
            let mut data = fs::read(&f).unwrap();
            data.extend_from_slice(b"changed");
            fs::write(&f, data).unwrap();
        }
        let before = manifest(&src);
        let flags: &[&str] = if commit { &[] } else { LIVE };
        faults("convert", &src, &wd, flags, &format!("{}:5", Point::CopyFile));
        assert_same(&manifest(&src), &before, "right after the kill");
        if !commit {
            finishes("convert", &src, &wd, LIVE, "caught up");
            assert_same(&manifest(&wd.join("staging")), &before, "staging after the pass was redone");
        }
        finishes("convert", &src, &wd, &[], "done");
        assert_same(&manifest(&src), &before, "after the commit");
        assert_eq!(wd_names(&wd), ["journal.json", "lock"]);
    }
    for (i, (point, _)) in points_of(Op::LiveCommit).iter().enumerate() {
        let (src, wd) = c.other(&format!("lc{i}"));
        build_tree(&src);
        finishes("convert", &src, &wd, LIVE, "caught up");
        // Something for the commit's pass to copy.
        fs::write(src.join("a/new"), b"written after it caught up").unwrap();
        let before = manifest(&src);
        faults("convert", &src, &wd, &[], point);
        assert_same(&manifest(&src), &before, &format!("right after the crash at {point}"));
        finishes("convert", &src, &wd, &[], "done");
        assert_same(&manifest(&src), &before, &format!("after resuming from {point}"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
    }
}

/// Issue 42: each kind of change a catch-up pass brings into staging (tests/live.rs), and a file
/// appended while the pass copies, with a crash at each step of the catch-up pass that finds it
/// and, after one more change, at each step of the commit. Each crash is resumed; the committed
/// directory is the source as it was when the commit began, byte for byte and in metadata.
#[test]
fn every_kind_of_change_survives_a_crash_at_every_live_step() {
    dirseal_testfs::needs_root!();
    use changes::{rewrite_known, EVERY_KIND};
    const LIVE: &[&str] = &["--live"];
    let c = Case::new();
    // The steps of a catch-up pass run live from `CaughtUp`, then those of the commit.
    let pass = [
        format!("{}:1", Point::AfterRecordCatchingUp),
        format!("{}:1", Point::CopyFile),
        format!("{}:1", Point::AfterManifestWritten),
        format!("{}:1", Point::AfterRecordCaughtUp),
    ];
    let commit: Vec<String> = [
        Point::AfterRecordCommitting,
        Point::CopyFile,
        Point::AfterManifestWritten,
        Point::AfterRecordCopied,
        Point::AfterVerify,
        Point::AfterRecordVerified,
        Point::AfterSwap,
        Point::AfterRecordSwapped,
        Point::AfterRecordDone,
    ]
    .iter()
    .map(|p| format!("{p}:1"))
    .collect();
    // Appended to while a pass copies (after it read its clock).
    let during = |s: &Path| ("TEST_APPEND", format!("start-copying={}", s.join("a/linked").display()));
    let kinds: Vec<(&str, Option<changes::Change>)> =
        EVERY_KIND.iter().map(|(w, ch)| (*w, Some(*ch))).chain([("appended while a pass copies", None)]).collect();
    let mut n = 0;
    for (k, (what, change)) in kinds.iter().enumerate() {
        for (i, at_commit) in commit.iter().enumerate() {
            let at_pass = &pass[i % pass.len()];
            let (src, wd) = c.other(&format!("k{k}-{i}"));
            build_tree(&src);
            let first: Vec<(&str, String)> = change.is_none().then(|| during(&src)).into_iter().collect();
            let r = child("convert", &src, &wd, LIVE, &first);
            assert!(r.code == Some(0) && r.stdout.contains("state=caught up"), "{what}: {}", r.show());
            if let Some(change) = change {
                change(&src);
            }
            rewrite_known(&src, b"ODD");
            let env: Vec<(&str, String)> = [("DIRSEAL_FAULT", at_pass.clone())]
                .into_iter()
                .chain(change.is_none().then(|| during(&src)))
                .collect();
            let r = child("convert", &src, &wd, LIVE, &env);
            assert_eq!(r.code, Some(99), "{what}: should die at {at_pass}: {}", r.show());
            let before = manifest(&src);
            finishes("convert", &src, &wd, LIVE, "caught up");
            assert_same(&manifest(&src), &before, &format!("{what}: the source after the crash at {at_pass}"));
            assert_same(
                &manifest(&wd.join("staging")),
                &before,
                &format!("{what}: staging caught up after the crash at {at_pass}"),
            );
            // One more change, then the commit, killed.
            rewrite_known(&src, b"EVE");
            let at_commit_time = manifest(&src);
            faults("convert", &src, &wd, &[], at_commit);
            finishes("convert", &src, &wd, &[], "done");
            assert_same(
                &manifest(&src),
                &at_commit_time,
                &format!("{what}: committed after crashes at {at_pass} and {at_commit}"),
            );
            assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{what}: {at_commit}");
            fs::remove_dir_all(&src).unwrap();
            n += 1;
        }
    }
    eprintln!("{n} trees, each crashed in a catch-up pass and in its commit");
}

#[test]
fn a_crash_between_a_verification_that_found_changes_and_the_next_copy_resumes() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    for (i, (point, _)) in points_of(Op::Recopy).iter().enumerate() {
        let (src, wd) = c.other(&format!("r{i}"));
        build_tree(&src);
        let changed = src.join("a/plain.txt");
        let append = ("TEST_APPEND", format!("start-verifying={}", changed.display()));
        let r = child("convert", &src, &wd, &[], &[("DIRSEAL_FAULT", point.clone()), append]);
        assert_eq!(r.code, Some(99), "{}", r.show());
        assert_eq!(fs::read(&changed).unwrap(), b"hello+");
        let before = manifest(&src);
        finishes("convert", &src, &wd, &[], "done");
        assert_same(&manifest(&src), &before, "after resume");
    }
}

#[test]
fn crashes_while_aborting_rolling_back_or_committing_resume() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    let mut n = 0;
    let mut case = || {
        n += 1;
        let (src, wd) = c.other(&format!("c{n}"));
        build_tree(&src);
        let before = manifest(&src);
        (src, wd, before)
    };
    let copied = format!("{}:1", Point::AfterRecordCopied);
    for (point, _) in points_of(Op::Abort) {
        let point = point.as_str();
        let (src, wd, before) = case();
        let original = fs::metadata(&src).unwrap().ino();
        faults("convert", &src, &wd, &[], &copied);
        faults("abort", &src, &wd, &[], point);
        assert_same(&manifest(&src), &before, point);
        finishes("abort", &src, &wd, &[], "aborted");
        assert_eq!(fs::metadata(&src).unwrap().ino(), original, "{point}");
        assert_same(&manifest(&src), &before, point);
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
    }
    // A new conversion first clears what an aborted one left; a crash there is resumed too.
    for (point, _) in points_of(Op::Leftover) {
        let point = point.as_str();
        let (src, wd, before) = case();
        faults("convert", &src, &wd, &[], &copied);
        faults("abort", &src, &wd, &[], &format!("{}:1", Point::AfterRecordAborted));
        faults("convert", &src, &wd, &[], point);
        assert_same(&manifest(&src), &before, point);
        finishes("convert", &src, &wd, &[], "done");
        assert_same(&manifest(&src), &before, point);
    }
    for (point, _) in points_of(Op::Rollback) {
        let point = point.as_str();
        let (src, wd, before) = case();
        let original = fs::metadata(&src).unwrap().ino();
        finishes("convert", &src, &wd, &["--keep-backup"], "swapped");
        faults("rollback", &src, &wd, &[], point);
        assert_same(&manifest(&src), &before, point);
        finishes("rollback", &src, &wd, &[], "rolled back");
        assert_eq!(fs::metadata(&src).unwrap().ino(), original, "{point}: the original is back");
        assert_same(&manifest(&src), &before, point);
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
    }
    for (point, _) in points_of(Op::Commit) {
        let point = point.as_str();
        let (src, wd, before) = case();
        finishes("convert", &src, &wd, &["--keep-backup"], "swapped");
        let copy = fs::metadata(&src).unwrap().ino();
        faults("commit", &src, &wd, &[], point);
        assert_same(&manifest(&src), &before, point);
        finishes("commit", &src, &wd, &[], "done");
        assert_eq!(fs::metadata(&src).unwrap().ino(), copy, "{point}");
        assert_same(&manifest(&src), &before, point);
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
    }
    // A crash right after the swap, then an abort: the swap is found and kept for a rollback.
    let (src, wd, before) = case();
    faults("convert", &src, &wd, &[], &format!("{}:1", Point::AfterSwap));
    let r = child("abort", &src, &wd, &[], &[]);
    assert!(r.stdout.contains("error=WrongState") && r.stderr.contains("roll back"), "{}", r.show());
    assert_eq!(migrate::status(&wd).unwrap().unwrap().state, State::Swapped);
    finishes("rollback", &src, &wd, &[], "rolled back");
    assert_same(&manifest(&src), &before, "rolled back after the crash at the swap");
}

/// Issue 43: immutable and append-only entries (files, a directory, one inside another) are
/// kept: sealed on the copy once verified, cleared on the originals only as they are disposed
/// of. A crash at every step from the verification on, then a resume; a crash while sealing,
/// then an abort (the sealed copy is removed); a rollback after a swap that kept its backup.
#[test]
fn immutable_and_append_only_entries_are_kept_across_crashes_aborts_and_rollbacks() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    let tree = |name: &str| {
        let (src, wd) = c.other(name);
        build_tree(&src);
        common::add_sealed(&src);
        let before = manifest(&src);
        (src, wd, before)
    };
    let mut specs: Vec<String> = points_of(Op::Sealed).into_iter().map(|(p, _)| p).collect();
    for p in [
        Point::CopyFile,
        Point::AfterRecordVerified,
        Point::AfterSwap,
        Point::AfterRecordSwapped,
        Point::MidDispose,
        Point::AfterRecordDone,
    ] {
        specs.push(format!("{p}:1"));
    }
    specs.push(format!("{}:12", Point::DisposeEntry));
    for (i, point) in specs.iter().enumerate() {
        let (src, wd, before) = tree(&format!("s{i}"));
        faults("convert", &src, &wd, &[], point);
        finishes("convert", &src, &wd, &[], "done");
        assert_same(&manifest(&src), &before, &format!("after resuming from {point}"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}: the sealed originals are gone");
    }
    // Sealing stopped half way, then an abort: the original untouched, the copy gone.
    let (src, wd, before) = tree("sa");
    faults("convert", &src, &wd, &[], &format!("{}:2", Point::SealEntry));
    finishes("abort", &src, &wd, &[], "aborted");
    assert_same(&manifest(&src), &before, "aborted after sealing began");
    assert_eq!(wd_names(&wd), ["journal.json", "lock"]);
    // A kept backup, rolled back: the sealed copy goes, the original comes back as it was.
    let (src, wd, before) = tree("sr");
    finishes("convert", &src, &wd, &["--keep-backup"], "swapped");
    assert_same(&manifest(&src), &before, "the sealed copy in place");
    finishes("rollback", &src, &wd, &[], "rolled back");
    assert_same(&manifest(&src), &before, "rolled back");
    assert_eq!(wd_names(&wd), ["journal.json", "lock"]);
    // Move mode cannot keep them: refused before anything is written.
    let (src, wd, before) = tree("sm");
    let r = child("convert", &src, &wd, &["--mode", "move"], &[]);
    assert!(r.stdout.contains("error=ImmutableInMove") && r.stderr.contains("--mode copy"), "{}", r.show());
    assert_same(&manifest(&src), &before, "refused move");
    assert!(!wd.exists(), "a refusal writes nothing");
}

/// A tree for move mode: every kind of entry, files large enough to move chunk by chunk, and
/// enough small ones for several batches.
fn move_tree(src: &Path) {
    build_tree(src);
    common::add_large(src);
    common::add_large_group(src);
    add_bulk(src, 60, 0);
}

const MOVE: &[&str] = &["--mode", "move"];

#[test]
fn a_crash_at_every_fault_point_of_a_move_loses_nothing_and_resumes() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    for (i, (point, _)) in points_of(Op::Move).iter().enumerate() {
        let (src, wd) = c.other(&format!("m{i}"));
        move_tree(&src);
        let before = manifest(&src);
        faults("convert", &src, &wd, MOVE, point);
        finishes("convert", &src, &wd, MOVE, "done");
        assert_same(&manifest(&src), &before, &format!("after resuming from {point}"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
        fs::remove_dir_all(&src).unwrap();
    }
}

#[test]
fn a_crash_at_every_fault_point_of_an_aborted_move_loses_nothing_and_the_abort_finishes() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    // The root's entries move first, its large files in one chunk each (a chunk counts data, and
    // all-hole and sparse.img hold less than one); then large/ (sparse-5m in 1 chunk, dense-3m
    // in 3) is the only directory with more. The 4th chunk leaves every file of the root moved
    // and dense-3m in flight, sparse-5m moved or not yet by the listing's order.
    let midway = format!("{}:4", Point::MoveChunkRecorded);
    for (i, (point, _)) in points_of(Op::MoveAbort).iter().enumerate() {
        let (src, wd) = c.other(&format!("b{i}"));
        move_tree(&src);
        let before = manifest(&src);
        let original = fs::metadata(&src).unwrap().ino();
        faults("convert", &src, &wd, MOVE, &midway);
        faults("abort", &src, &wd, &[], point);
        finishes("abort", &src, &wd, &[], "aborted");
        assert_eq!(fs::metadata(&src).unwrap().ino(), original, "{point}");
        assert_same(&manifest(&src), &before, &format!("after aborting, with a crash at {point}"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
        fs::remove_dir_all(&src).unwrap();
    }
    // Stopped while the large group's other names are linked in staging (its data all there,
    // its source names not yet removed): the abort turns the group around.
    let linking = format!("{}:1", Point::MoveLinkMade);
    for (i, (point, _)) in points_of(Op::GroupAbort).iter().enumerate() {
        let (src, wd) = c.other(&format!("g{i}"));
        move_tree(&src);
        let before = manifest(&src);
        faults("convert", &src, &wd, MOVE, &linking);
        faults("abort", &src, &wd, &[], point);
        finishes("abort", &src, &wd, &[], "aborted");
        assert_same(&manifest(&src), &before, &format!("after aborting a group, with a crash at {point}"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{point}");
        fs::remove_dir_all(&src).unwrap();
    }
}

/// xorshift64*, seeded from the clock (or `TEST_SEED`); the seed is printed so a failing run can
/// be replayed.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
        });
        eprintln!("TEST_SEED={seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// A moment to SIGKILL a move: mostly a random poll (every entry and every MiB) of the move,
/// sometimes the swap or the disposal.
fn move_moment(rng: &mut Rng, phase: &str) -> String {
    match rng.below(10) {
        0 if phase == "moving" => "exchange-after".into(),
        1 if phase == "moving" => format!("poll-disposing:{}", 1 + rng.below(3)),
        _ => format!("poll-{phase}:{}", 2 + rng.below(30)),
    }
}

#[test]
fn sigkill_at_100_random_moments_of_moves_each_then_resumed_loses_nothing() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    let mut rng = Rng::new();
    let (mut kills, mut trees) = (0, 0);
    while kills < 100 {
        trees += 1;
        let (src, wd) = c.other(&format!("r{trees}"));
        move_tree(&src);
        let before = manifest(&src);
        loop {
            let moment = move_moment(&mut rng, "moving");
            let r = child("convert", &src, &wd, MOVE, &[("TEST_KILL", moment.clone())]);
            if r.signal == Some(9) {
                kills += 1;
                continue;
            }
            assert!(r.code == Some(0) && r.stdout.contains("state=done"), "after {kills} kills: {}", r.show());
            break;
        }
        assert_same(&manifest(&src), &before, &format!("tree {trees}, after {kills} kills in all"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"]);
        fs::remove_dir_all(&src).unwrap();
    }
    eprintln!("{kills} kills over {trees} moves");
}

#[test]
fn sigkill_at_100_random_moments_of_moves_and_their_aborts_then_aborted_loses_nothing() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    let mut rng = Rng::new();
    let (mut kills, mut trees) = (0, 0);
    while kills < 100 {
        trees += 1;
        let (src, wd) = c.other(&format!("a{trees}"));
        move_tree(&src);
        let before = manifest(&src);
        let original = fs::metadata(&src).unwrap().ino();
        // Kill the move a few times (a run that reaches its end first leaves nothing to abort).
        let mut finished = false;
        for _ in 0..2 + rng.below(4) {
            let moment = format!("poll-moving:{}", 2 + rng.below(40));
            let r = child("convert", &src, &wd, MOVE, &[("TEST_KILL", moment)]);
            if r.signal != Some(9) {
                assert!(r.stdout.contains("state=done"), "{}", r.show());
                finished = true;
                break;
            }
            kills += 1;
        }
        if finished {
            assert_same(&manifest(&src), &before, &format!("tree {trees}, moved"));
            fs::remove_dir_all(&src).unwrap();
            continue;
        }
        loop {
            let moment = move_moment(&mut rng, "moving-back");
            let r = child("abort", &src, &wd, &[], &[("TEST_KILL", moment)]);
            if r.signal == Some(9) {
                kills += 1;
                continue;
            }
            assert!(r.code == Some(0) && r.stdout.contains("state=aborted"), "after {kills} kills: {}", r.show());
            break;
        }
        assert_eq!(fs::metadata(&src).unwrap().ino(), original);
        assert_same(&manifest(&src), &before, &format!("tree {trees}, after {kills} kills in all"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"]);
        fs::remove_dir_all(&src).unwrap();
    }
    eprintln!("{kills} kills over {trees} aborted moves");
}

#[test]
fn sigkill_at_numbered_moments_of_every_phase_loses_nothing() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    let specs: &[(&str, &[&str])] = &[
        ("start-scanning", &[]),
        ("poll-scanning:3", &[]),
        ("prepare", &[]),
        ("start-copying", &[]),
        ("poll-copying:1", &[]),
        ("poll-copying:60", &[]),
        ("poll-copying:200", &[]),
        ("start-verifying", &[]),
        ("poll-verifying:1", &[]),
        ("poll-verifying:120", &[]),
        ("start-swapping", &[]),
        ("exchange-before", &[]),
        ("exchange-after", &[]),
        ("start-disposing", &[]),
        ("poll-disposing:1", &[]),
        ("poll-disposing:150", &["--wipe"]),
        ("trim", &["--wipe"]),
    ];
    for (i, (spec, flags)) in specs.iter().enumerate() {
        let (src, wd) = c.other(&format!("k{i}"));
        build_tree(&src);
        add_bulk(&src, 200, 6);
        let before = manifest(&src);
        killed("convert", &src, &wd, flags, spec);
        assert_same(&manifest(&src), &before, &format!("right after SIGKILL at {spec}"));
        finishes("convert", &src, &wd, flags, "done");
        assert_same(&manifest(&src), &before, &format!("after resuming from SIGKILL at {spec}"));
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{spec}");
    }
}

#[test]
fn repeated_sigkills_of_resumed_runs_still_converge() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    add_bulk(&c.src, 200, 6);
    let before = manifest(&c.src);
    // Every pass re-polls each entry, so each of these runs reaches its moment.
    let chain = [
        ("poll-copying:60", State::Copying),
        ("poll-copying:120", State::Copying),
        ("poll-verifying:30", State::Copied),
        ("poll-verifying:1", State::Copied),
        ("exchange-after", State::Verified),
        ("poll-disposing:10", State::Swapped),
        ("poll-disposing:10", State::Swapped),
    ];
    for (spec, state) in chain {
        killed("convert", &c.src, &c.wd, &[], spec);
        assert_same(&manifest(&c.src), &before, spec);
        assert_eq!(migrate::status(&c.wd).unwrap().unwrap().state, state, "{spec}");
    }
    finishes("convert", &c.src, &c.wd, &[], "done");
    assert_same(&manifest(&c.src), &before, "after the last run");
}

#[test]
fn a_second_converter_is_refused_and_a_killed_holder_does_not_block() {
    dirseal_testfs::needs_root!();
    use std::io::BufRead;
    let c = Case::new();
    build_tree(&c.src);
    let before = manifest(&c.src);
    let mut holder = Command::new(CHILD)
        .args(["convert".as_ref(), c.src.as_os_str(), c.wd.as_os_str()])
        .env("TEST_HOLD", "start-copying")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "holding\n");
    let pid = holder.id();
    // Another process, and this one, are both told who holds the lock.
    let r = child("convert", &c.src, &c.wd, &[], &[]);
    assert!(r.stdout.contains("error=Busy") && r.stderr.contains(&format!("(pid {pid})")), "{}", r.show());
    for e in [
        migrate::convert(&common::req(&c.src, &c.wd), &common::host::PlainHost::new()).unwrap_err(),
        migrate::preflight(&common::req(&c.src, &c.wd), &common::host::PlainHost::new()).unwrap_err(),
        migrate::abort(&c.wd, &common::host::PlainHost::new()).unwrap_err(),
    ] {
        assert!(matches!(e, MigrateError::Busy { pid: Some(p), .. } if p == pid), "{e:?}");
        assert!(e.to_string().contains("wait for it to finish"), "{e}");
    }
    // The holder dies; its pid stays in the lock file but its lock went with it.
    holder.kill().unwrap();
    assert_eq!(holder.wait().unwrap().signal(), Some(9));
    assert_eq!(fs::read_to_string(c.wd.join("lock")).unwrap().trim(), pid.to_string());
    finishes("convert", &c.src, &c.wd, &[], "done");
    assert_same(&manifest(&c.src), &before, "after resuming the killed holder's conversion");
}

#[test]
fn an_entry_the_converter_cannot_read_stops_it_before_anything_is_written() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    // Without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH even root cannot open a mode-000 file it does
    // not own; that stands in for any unreadable entry (I/O error, odd filesystem).
    fs::create_dir_all(c.src.join("open")).unwrap();
    fs::write(c.src.join("open/fine"), b"readable").unwrap();
    fs::write(c.src.join("open/locked"), b"not for you").unwrap();
    let owner = common::rand_id();
    common::run("chown", &["-R".as_ref(), format!("{owner}:{owner}").as_ref(), c.src.as_os_str()]);
    fs::set_permissions(c.src.join("open/locked"), std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    let before = manifest(&c.src);
    let out = Command::new("setpriv")
        .args(["--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", CHILD, "convert"])
        .arg(&c.src)
        .arg(&c.wd)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("error=CopyFailed"), "{stdout}{stderr}");
    let want = format!("copying {} failed", c.src.join("open/locked").display());
    assert!(stderr.contains(&want) && stderr.contains("Permission denied"), "{stderr}");
    assert!(stderr.contains("nothing was swapped"), "{stderr}");
    assert_same(&manifest(&c.src), &before, "after the refusal");
    // The census opens every regular file for its inode flags, so the refusal comes before
    // anything is written (issue 43).
    assert!(migrate::status(&c.wd).unwrap().is_none(), "refused in preflight: no journal");
    finishes("convert", &c.src, &c.wd, &[], "done");
    assert_same(&manifest(&c.src), &before, "after resuming with full privileges");
}

#[test]
fn memory_does_not_grow_with_the_size_of_the_tree() {
    dirseal_testfs::needs_root!();
    let c = Case::with(dirseal_testfs::Options { inodes: Some(60_000), ..Default::default() });
    let mut peaks = Vec::new();
    for (name, dirs) in [("small", 20), ("large", 200)] {
        let (src, wd) = c.other(name);
        for d in 0..dirs {
            let dir = src.join(format!("d{:03}/sub", d));
            fs::create_dir_all(&dir).unwrap();
            for f in 0..100 {
                fs::write(dir.join(format!("file-with-a-longish-name-{f:03}")), b"x").unwrap();
            }
        }
        let t = std::time::Instant::now();
        let r = child("convert", &src, &wd, &[], &[]);
        assert!(r.stdout.contains("state=done"), "{}", r.show());
        let peak: u64 = r.stdout.lines().find_map(|l| l.strip_prefix("peak_kib=")).unwrap().parse().unwrap();
        eprintln!("{name}: {} files, peak {peak} KiB, {:?}", dirs * 100, t.elapsed());
        peaks.push(peak);
    }
    // Ten times the files (same directory sizes): the peak may not follow them.
    assert!(peaks[1] < peaks[0] + 1024, "peak RSS grew from {} KiB to {} KiB", peaks[0], peaks[1]);
}

/// Issue 50: the passes' maps of hard-linked inodes keep only a few entries in memory here
/// (`DIRSEAL_LINKS_IN_MEMORY`), the rest on disk; the groups must come through whole all the same,
/// in the copy, its verification and the census (the file linked outside the tree is reported).
#[test]
fn hard_links_past_the_in_memory_map_convert_exactly() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    for d in ["a", "b/deep", "c"] {
        fs::create_dir_all(c.src.join(d)).unwrap();
    }
    for i in 0..400 {
        let f = c.src.join(format!("a/f{i}"));
        fs::write(&f, format!("contents {i}")).unwrap();
        fs::hard_link(&f, c.src.join(format!("b/deep/also-f{i}"))).unwrap();
        if i % 7 == 0 {
            fs::hard_link(&f, c.src.join(format!("c/third-{i}"))).unwrap();
        }
    }
    fs::write(c.src.join("shared"), b"also outside").unwrap();
    fs::hard_link(c.src.join("shared"), c.fs.path().join("outside-link")).unwrap();
    let before = manifest(&c.src);
    let r = child("convert", &c.src, &c.wd, &[], &[("DIRSEAL_LINKS_IN_MEMORY", "16".into())]);
    assert!(r.stdout.contains("state=done"), "{}", r.show());
    let spilled: u64 = r.stdout.lines().find_map(|l| l.strip_prefix("links_spilled=")).unwrap().parse().unwrap();
    // Census, copy, verification both ways: each keeps about 400 inodes past its first 16.
    assert!(spilled >= 4 * 380, "only {spilled} entries went to disk: {}", r.show());
    assert!(r.stdout.contains("1 file(s) also had hard links outside"), "{}", r.show());
    let mut after = manifest(&c.src);
    // The file linked outside is its own inode now (reported above); the manifest counts links.
    let shared = after.remove(b"shared".as_slice());
    assert!(shared.is_some());
    let mut want = before.clone();
    want.remove(b"shared".as_slice());
    assert_same(&after, &want, "after converting many hard links");
    for i in 0..400 {
        let ino = |p: String| fs::metadata(c.src.join(p)).unwrap().ino();
        assert_eq!(ino(format!("a/f{i}")), ino(format!("b/deep/also-f{i}")), "group {i} kept");
        if i % 7 == 0 {
            assert_eq!(ino(format!("a/f{i}")), ino(format!("c/third-{i}")));
        }
        assert_ne!(ino(format!("a/f{i}")), ino(format!("a/f{}", (i + 1) % 400)));
    }
}

/// Issue 24: the file counter stood still while a big file copied (3/3905), because a directory
/// handed its subdirectories to the other threads only once its own files were copied. Held in
/// the copy of the first file (`DIRSEAL_FAULT_HOLD`), the run must have entered the subdirectory
/// meanwhile, whichever file that is.
#[test]
fn a_subdirectory_is_copied_while_a_file_above_it_is() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    fs::create_dir_all(c.src.join("sub")).unwrap();
    fs::write(c.src.join("big"), vec![7u8; 1 << 20]).unwrap();
    fs::write(c.src.join("sub/f"), b"x").unwrap();
    let before = manifest(&c.src);
    let hold = c.fs.path().join("hold");
    let child = Command::new(CHILD)
        .arg("convert")
        .arg(&c.src)
        .arg(&c.wd)
        .env("DIRSEAL_FAULT", "copy-file:1")
        .env("DIRSEAL_FAULT_HOLD", &hold)
        .env_remove("TEST_KILL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let within = |secs: u64, what: &dyn Fn() -> bool| {
        let t = std::time::Instant::now();
        while !what() && t.elapsed() < std::time::Duration::from_secs(secs) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        what()
    };
    let held = within(60, &|| hold.exists());
    let entered = held && within(10, &|| c.wd.join("staging/sub").exists());
    let _ = fs::remove_file(&hold);
    let out = child.wait_with_output().unwrap();
    assert!(held, "never held at copy-file: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("state=done"), "{out:?}");
    assert!(entered, "the subdirectory waited for the copy of the file above it");
    assert_same(&manifest(&c.src), &before, "after the conversion");
}
