//! Live conversions (`Schedule::Live`): the directory stays in use while it is copied, catch-up
//! passes bring its changes into staging, the conversion stops `CaughtUp`; run `Now` it commits
//! (a last pass, verification, swap). On real loop-mounted ext4 with the plain test host.
mod common;

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use common::changes::{append, rewrite_known, scribble, EVERY_KIND};
use common::host::{Event, PlainHost};
use common::{assert_same, build_tree, manifest, req, wd_names, Case};
use dirseal_migrate::{self as migrate, MigrateError, Mode, Phase, Request, Schedule, State};

fn live<'a>(src: &'a Path, wd: &'a Path) -> Request<'a> {
    Request { schedule: Schedule::Live, ..req(src, wd) }
}

/// Runs live to `CaughtUp`, checking what status says.
#[track_caller]
fn caught_up(src: &Path, wd: &Path, host: &PlainHost) -> u32 {
    let out = migrate::convert(&live(src, wd), host).unwrap();
    assert_eq!(out.state, State::CaughtUp);
    assert!(out.backup.is_none());
    let st = migrate::status(wd).unwrap().unwrap();
    assert_eq!((st.state, st.live), (State::CaughtUp, true));
    assert!(st.passes >= 1, "{st:?}");
    assert_eq!(st.state.to_string(), "caught up");
    assert!(st.state.before_swap() && !st.state.is_final() && st.state.abortable());
    st.passes
}

/// Runs `Now` (the commit) and checks the result is the source as it was when the commit began,
/// found by the last catch-up pass alone (the verification then finds nothing to copy again).
#[track_caller]
fn commits(src: &Path, wd: &Path) -> migrate::Outcome {
    let before = manifest(src);
    let host = PlainHost::new();
    let out = migrate::convert(&req(src, wd), &host).unwrap();
    assert_eq!(out.state, State::Done);
    assert_same(&manifest(src), &before, "the converted tree against the source at commit time");
    let phases = host.phases.lock().unwrap().clone();
    assert_eq!(
        phases,
        [Phase::Copying, Phase::Verifying, Phase::Swapping, Phase::Disposing],
        "one last pass, one verification that found nothing"
    );
    assert!(out.timings.parts().iter().any(|(p, _)| *p == "commit"), "{:?}", out.timings);
    assert_eq!(wd_names(wd), ["journal.json", "lock"], "the manifests are gone");
    out
}

/// Each kind of change a catch-up pass must bring into staging: made after the conversion caught
/// up, then caught up again (a live run: no verification in between, so the pass alone must make
/// staging equal the source), changed once more, and committed.
#[test]
fn every_kind_of_change_is_caught_up_then_committed() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    for (i, (what, change)) in EVERY_KIND.iter().enumerate() {
        let (src, wd) = c.other(&format!("l{i}"));
        build_tree(&src);
        let host = PlainHost::new();
        caught_up(&src, &wd, &host);
        assert_eq!(
            host.phases.lock().unwrap().clone(),
            [Phase::Scanning, Phase::Copying, Phase::Verifying, Phase::Copying],
            "{what}: the first copy, its verification, one catch-up pass"
        );
        change(&src);
        let passes = caught_up(&src, &wd, &PlainHost::new());
        assert_same(&manifest(&wd.join("staging")), &manifest(&src), &format!("{what}: staging after catching up"));
        // Once more, committed.
        rewrite_known(&src, b"ODD");
        commits(&src, &wd);
        assert!(passes >= 2, "{what}");
        fs::remove_dir_all(&src).unwrap();
    }
}

/// Changes while the first copy runs (from the host's polls): a file appended to while it is
/// copied, and one rewritten in place after it was copied. The catch-up finds them.
#[test]
fn changes_during_the_first_copy_are_caught_up() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    fs::create_dir(&c.src).unwrap();
    let big = c.src.join("big");
    fs::write(&big, vec![1u8; 4 << 20]).unwrap();
    let small = c.src.join("small");
    fs::write(&small, vec![2u8; 10_000]).unwrap();
    let (b2, s2) = (big.clone(), small.clone());
    let done = AtomicBool::new(false);
    // One thread: polls come one per 1 MiB chunk of the big file; by the third, the small file
    // (copied first or not at all yet) is rewritten, and the big one half copied grows.
    let host = PlainHost::with(move |e, _| {
        if e == Event::Poll(Phase::Copying, 3) && !done.swap(true, Ordering::SeqCst) {
            append(&b2, b"appended mid-copy");
            scribble(&s2, 100, b"changed");
        }
    });
    let mut r = live(&c.src, &c.wd);
    r.threads = std::num::NonZeroUsize::MIN;
    let out = migrate::convert(&r, &host).unwrap();
    assert_eq!(out.state, State::CaughtUp);
    assert_same(&manifest(&c.wd.join("staging")), &manifest(&c.src), "staging once caught up");
    // (Its size, not its bytes: reading would move its atime, which no pass can see.)
    assert_eq!(fs::symlink_metadata(&big).unwrap().len(), (4 << 20) + 17);
    commits(&c.src, &c.wd);
}

/// A program with its working directory inside does not stop a live copy, but stops the commit
/// (nothing swapped, still caught up); once it ends the commit goes through.
#[test]
fn the_commit_waits_until_nothing_uses_the_directory() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let mut sleeper = std::process::Command::new("sleep").arg("600").current_dir(c.src.join("a/b")).spawn().unwrap();
    // A plain conversion is refused; a live one is not.
    let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::InUse { .. }), "{e:?}");
    caught_up(&c.src, &c.wd, &PlainHost::new());
    let before = manifest(&c.src);
    let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::StillInUse { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&format!("pid {} (sleep", sleeper.id())) && msg.contains("caught up"), "{msg}");
    assert_eq!(migrate::status(&c.wd).unwrap().unwrap().state, State::CaughtUp);
    assert_same(&manifest(&c.src), &before, "nothing swapped");
    // A live run meanwhile catches up again.
    fs::write(c.src.join("a/new"), b"new").unwrap();
    caught_up(&c.src, &c.wd, &PlainHost::new());
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    commits(&c.src, &c.wd);
}

#[test]
fn abort_in_every_live_state_leaves_the_original() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    // Caught up; stopped in the first copy; stopped in a catch-up pass; stopped committing.
    let stops: &[(&str, Option<&'static str>)] =
        &[("caught up", None), ("copying", Some("poll-copying:10")), ("verifying", Some("poll-verifying:5"))];
    for (i, (what, stop)) in stops.iter().enumerate() {
        let (src, wd) = c.other(&format!("a{i}"));
        build_tree(&src);
        let before = manifest(&src);
        match stop {
            None => {
                caught_up(&src, &wd, &PlainHost::new());
            }
            Some(at) => {
                let e = migrate::convert(&live(&src, &wd), &PlainHost::stopping_at(at)).unwrap_err();
                assert!(matches!(e, MigrateError::Interrupted { .. }), "{what}: {e:?}");
            }
        }
        let out = migrate::abort(&wd, &PlainHost::new()).unwrap();
        assert_eq!(out.state, State::Aborted, "{what}");
        assert_same(&manifest(&src), &before, what);
        assert_eq!(wd_names(&wd), ["journal.json", "lock"], "{what}");
    }
    // Stopped in a catch-up pass (after a change), resumed; then stopped in the commit's pass.
    let (src, wd) = c.other("a-pass");
    build_tree(&src);
    caught_up(&src, &wd, &PlainHost::new());
    append(&src.join("a/plain.txt"), b"more");
    let e = migrate::convert(&live(&src, &wd), &PlainHost::stopping_at("poll-copying:3")).unwrap_err();
    assert!(matches!(e, MigrateError::Interrupted { state: State::CatchingUp }), "{e:?}");
    assert_eq!(migrate::status(&wd).unwrap().unwrap().state, State::CatchingUp);
    caught_up(&src, &wd, &PlainHost::new());
    assert_same(&manifest(&wd.join("staging")), &manifest(&src), "a catch-up pass resumed");
    let e = migrate::convert(&req(&src, &wd), &PlainHost::stopping_at("poll-copying:3")).unwrap_err();
    assert!(matches!(e, MigrateError::Interrupted { state: State::CatchingUp }), "{e:?}");
    let j: serde_json::Value = serde_json::from_slice(&fs::read(wd.join("journal.json")).unwrap()).unwrap();
    assert!(j["live"]["commit_from"].as_u64().is_some(), "stopped committing: {j}");
    let before = manifest(&src);
    let e = migrate::rollback(&wd, &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::WrongState { .. }), "{e:?}");
    assert_eq!(migrate::abort(&wd, &PlainHost::new()).unwrap().state, State::Aborted);
    assert_same(&manifest(&src), &before, "aborted while committing");
    assert_eq!(wd_names(&wd), ["journal.json", "lock"]);
}

/// A staging copy that differs from its original while the original did not change since the
/// pass that copied it is an error, not a change to copy again.
#[test]
fn a_copy_that_went_bad_behind_the_engine_is_an_error_at_commit() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    caught_up(&c.src, &c.wd, &PlainHost::new());
    let f = c.src.join("a/b/c/deep.bin");
    append(&f, b"changed after the first verification");
    caught_up(&c.src, &c.wd, &PlainHost::new());
    scribble(&c.wd.join("staging/a/b/c/deep.bin"), 5, b"rot");
    let before = manifest(&c.src);
    let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::CopyCorrupt { .. }), "{e:?}");
    assert!(e.to_string().contains("deep.bin") && e.to_string().contains("abort"), "{e}");
    assert_same(&manifest(&c.src), &before, "nothing swapped");
    assert_eq!(migrate::abort(&c.wd, &PlainHost::new()).unwrap().state, State::Aborted);
}

#[test]
fn live_refuses_a_move_and_a_conversion_started_to_run_now() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    let host = PlainHost::new();
    let e = migrate::preflight(&Request { mode: Mode::Move, ..live(&c.src, &c.wd) }, &host).unwrap_err();
    assert!(matches!(e, MigrateError::LiveMove { .. }), "{e:?}");
    assert!(!c.wd.exists(), "a refusal writes nothing");
    let plan = migrate::preflight(&Request { mode: Mode::Auto, ..live(&c.src, &c.wd) }, &host).unwrap();
    assert_eq!(plan.census().method, migrate::Method::Copy);
    // A conversion started to run now, interrupted, is not resumed live.
    let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::stopping_at("poll-copying:5")).unwrap_err();
    assert!(matches!(e, MigrateError::Interrupted { .. }), "{e:?}");
    let e = migrate::convert(&live(&c.src, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::WrongState { op: "resume live", .. }), "{e:?}");
    let st = migrate::status(&c.wd).unwrap().unwrap();
    assert_eq!((st.state, st.live, st.passes), (State::Copying, false, 0));
}

/// The journal keeps every pass: its number, when it began and ended, and what it did.
#[test]
fn the_journal_records_every_pass() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    caught_up(&c.src, &c.wd, &PlainHost::new());
    for i in 0..3 {
        fs::write(c.src.join(format!("n{i}")), b"x").unwrap();
    }
    caught_up(&c.src, &c.wd, &PlainHost::new());
    let j: serde_json::Value = serde_json::from_slice(&fs::read(c.wd.join("journal.json")).unwrap()).unwrap();
    let passes = j["live"]["passes"].as_array().unwrap();
    let numbers: Vec<u64> = passes.iter().map(|p| p["pass"].as_u64().unwrap()).collect();
    assert_eq!(numbers, [0, 1, 2], "{j}");
    assert!(passes.iter().all(|p| p["finished_unix"].as_u64() >= p["started_unix"].as_u64()), "{j}");
    assert_eq!(passes[2]["copied"], 3, "{j}");
    assert_eq!(j["step"], serde_json::json!({"name": "caught_up", "pass": 2}));
    let manifests: Vec<String> = wd_names(&c.wd).into_iter().filter(|n| n.starts_with("manifest")).collect();
    assert_eq!(manifests, ["manifest.2"], "only the last pass's manifest is kept");
}

/// A program that starts using the directory while the commit verifies stops the swap: the
/// conversion is caught up again, nothing swapped, and commits once the program is gone.
#[test]
fn a_program_entering_during_the_commit_stops_the_swap() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    caught_up(&c.src, &c.wd, &PlainHost::new());
    let dir = c.src.join("a");
    let sleeper: std::sync::Arc<std::sync::Mutex<Option<std::process::Child>>> = Default::default();
    let s2 = sleeper.clone();
    let host = PlainHost::with(move |e, _| {
        if e == Event::PhaseStart(Phase::Verifying) {
            let child = std::process::Command::new("sleep").arg("600").current_dir(&dir).spawn().unwrap();
            *s2.lock().unwrap() = Some(child);
        }
    });
    let before = manifest(&c.src);
    let e = migrate::convert(&req(&c.src, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::StillInUse { .. }), "{e:?}");
    let st = migrate::status(&c.wd).unwrap().unwrap();
    assert_eq!(st.state, State::CaughtUp);
    assert_same(&manifest(&c.src), &before, "nothing swapped");
    let mut child = sleeper.lock().unwrap().take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    commits(&c.src, &c.wd);
}

/// The commit of a large home that changed little copies and compares only what changed.
#[test]
fn the_commit_of_a_home_that_changed_little_copies_only_the_changes() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    build_tree(&c.src);
    common::add_bulk(&c.src, 3000, 8);
    let t = std::time::Instant::now();
    caught_up(&c.src, &c.wd, &PlainHost::new());
    let live_time = t.elapsed();
    // Caught up again in a quiet tree: every entry is now in the last manifest.
    caught_up(&c.src, &c.wd, &PlainHost::new());
    for i in [3, 300, 2999] {
        append(&c.src.join(format!("bulk/f{i:04}")), b"changed");
    }
    scribble(&c.src.join("bulk/f1000"), 7, b"same size");
    fs::write(c.src.join("bulk/new"), b"new").unwrap();
    let t = std::time::Instant::now();
    let out = commits(&c.src, &c.wd);
    let commit_time = t.elapsed();
    let j: serde_json::Value = serde_json::from_slice(&fs::read(c.wd.join("journal.json")).unwrap()).unwrap();
    let last = j["live"]["passes"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["copied"].as_u64(), last["removed"].as_u64()), (Some(5), Some(0)), "{j}");
    eprintln!(
        "live copy to caught up: {live_time:?}; commit: {commit_time:?} ({} entries): {:?}",
        last["entries"], out.timings
    );
}

/// A file that keeps changing while the first copy copies it does not stop a live conversion (a
/// run `Now` gives up on it): it is left to the next pass.
#[test]
fn a_file_that_keeps_changing_is_left_to_the_next_pass() {
    dirseal_testfs::needs_root!();
    let c = Case::new();
    fs::create_dir(&c.src).unwrap();
    let busy = c.src.join("busy.log");
    fs::write(&busy, vec![1u8; 3 << 20]).unwrap();
    fs::write(c.src.join("quiet"), b"quiet").unwrap();
    let writing = std::sync::Arc::new(AtomicBool::new(true));
    let host = |w: std::sync::Arc<AtomicBool>| {
        let b = busy.clone();
        PlainHost::with(move |e, _| match e {
            // Every 1 MiB chunk copied, the file grows.
            Event::Poll(Phase::Copying, _) if w.load(Ordering::SeqCst) => append(&b, b"line\n"),
            Event::PhaseStart(Phase::Verifying) => w.store(false, Ordering::SeqCst),
            _ => {}
        })
    };
    let mut r = req(&c.src, &c.wd);
    r.threads = std::num::NonZeroUsize::MIN;
    let e = migrate::convert(&r, &host(std::sync::Arc::new(AtomicBool::new(true)))).unwrap_err();
    assert!(matches!(e, MigrateError::KeepsChanging { .. }), "{e:?}");
    assert_eq!(migrate::abort(&c.wd, &PlainHost::new()).unwrap().state, State::Aborted);
    let r = Request { schedule: Schedule::Live, ..r };
    let out = migrate::convert(&r, &host(writing.clone())).unwrap();
    assert_eq!(out.state, State::CaughtUp);
    assert!(!writing.load(Ordering::SeqCst), "it was written to until the verification");
    assert_same(&manifest(&c.wd.join("staging")), &manifest(&c.src), "staging once caught up");
    commits(&c.src, &c.wd);
}

/// A file mapped shared and writable can be written again without a fault (so without moving its
/// ctime) while its page stays dirty. Each pass writes the source's dirty pages out before it
/// copies, so a write through the mapping after the copy moves the ctime and the next pass sees
/// it. (A program writes through a mapping after its file was copied, during a catch-up pass.)
#[test]
fn a_write_through_a_shared_mapping_after_the_copy_is_caught_up() {
    dirseal_testfs::needs_root!();
    use std::io::{BufRead, Write};
    let c = Case::new();
    fs::create_dir_all(c.src.join("sub")).unwrap();
    let mapped = c.src.join("mapped");
    fs::write(&mapped, vec![b'.'; 16384]).unwrap();
    fs::write(c.src.join("sub/big"), vec![3u8; 8 << 20]).unwrap();
    let mut r = live(&c.src, &c.wd);
    r.threads = std::num::NonZeroUsize::MIN;
    assert_eq!(migrate::convert(&r, &PlainHost::new()).unwrap().state, State::CaughtUp);
    // The program maps the file and writes (a fault: the ctime moves, the page is dirty).
    let script = "import mmap,sys\nf=open(sys.argv[1],'r+b')\nm=mmap.mmap(f.fileno(),0)\nm[0:5]=b'first'\n\
                  print('ready',flush=True)\nsys.stdin.readline()\nm[100:106]=b'second'\nprint('done',flush=True)\n\
                  sys.stdin.readline()\nm.close()\n";
    let mut prog = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&mapped)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let input = prog.stdin.take().unwrap();
    let mut output = std::io::BufReader::new(prog.stdout.take().unwrap());
    let mut line = String::new();
    output.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // The catch-up pass copies the mapped file (in the root, before `sub` on one thread), then
    // while it copies sub/big (grown, so copied again, 1 MiB per poll) the program writes again.
    append(&c.src.join("sub/big"), b"grown");
    let talk = std::sync::Arc::new(std::sync::Mutex::new(Some((input, output))));
    let t2 = talk.clone();
    let wrote = AtomicBool::new(false);
    let host = PlainHost::with(move |e, _| {
        if matches!(e, Event::Poll(Phase::Copying, n) if n >= 7) && !wrote.swap(true, Ordering::SeqCst) {
            let mut t = t2.lock().unwrap();
            let (i, o) = t.as_mut().unwrap();
            i.write_all(b"go\n").unwrap();
            let mut line = String::new();
            o.read_line(&mut line).unwrap();
            assert_eq!(line, "done\n");
        }
    });
    assert_eq!(migrate::convert(&r, &host).unwrap().state, State::CaughtUp);
    let (mut input, _) = talk.lock().unwrap().take().unwrap();
    input.write_all(b"exit\n").unwrap();
    assert!(prog.wait().unwrap().success());
    // (Read without moving its access time.)
    let data = dirseal_testfs::tree::contents(&mapped).remove(0).1;
    assert_eq!((&data[..5], &data[100..106]), (&b"first"[..], &b"second"[..]), "the program wrote during the pass");
    // Caught up once more, nothing writing: the second write is in the copy.
    assert_eq!(migrate::convert(&r, &PlainHost::new()).unwrap().state, State::CaughtUp);
    assert_same(&manifest(&c.wd.join("staging")), &manifest(&c.src), "staging after the mapped write");
    commits(&c.src, &c.wd);
}
