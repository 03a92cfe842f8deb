//! `dirseal convert DIR --live` through the real binary on a loop ext4: the password is asked in
//! the foreground, the command returns while the home is in use, the background run (its own
//! process) copies and catches up, then commits once the owner has no login session (logind's
//! `/run/systemd/users/<uid>`: no systemd runs here, so the test writes it as logind would) and
//! no process uses the home.
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{fresh_uid, names, p, Env};
use dirseal_testfs::tree::entries_manifest as manifest;

/// A small home owned by `uid`, with `bulk` MiB of data in 64 KiB files.
fn build_home(root: &Path, uid: u32, bulk: usize) {
    fs::create_dir_all(root.join("Documents/deep")).unwrap();
    fs::write(root.join("Documents/plan.txt"), b"meet at noon").unwrap();
    fs::write(root.join("Documents/deep/big.bin"), (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>())
        .unwrap();
    fs::create_dir(root.join("bulk")).unwrap();
    for i in 0..bulk * 16 {
        fs::write(root.join(format!("bulk/{i}")), vec![(i % 251) as u8; 64 * 1024]).unwrap();
    }
    let st = Command::new("chown").args(["-hR", &format!("{uid}:{uid}"), p(root)]).status().unwrap();
    assert!(st.success());
}

/// The end of a test, passed or not: the session's processes killed, the background run stopped
/// (an abort stops it first; after a commit it finds nothing to abort), logind's record gone.
struct Cleanup<'a> {
    env: &'a Env,
    home: PathBuf,
    session: Option<Child>,
    logind: Option<PathBuf>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Some(mut c) = self.session.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(f) = self.logind.take() {
            let _ = fs::remove_file(f);
        }
        let _ = self.env.run(&["convert", "--abort", p(&self.home)], "");
    }
}

/// A process of the "session": a shell whose cwd is the home, appending a line every 0.1 s.
fn session(home: &Path) -> Child {
    Command::new("sh")
        .args(["-c", "while :; do echo tick >> session.log; sleep 0.1; done"])
        .current_dir(home)
        .spawn()
        .unwrap()
}

/// logind's record of `uid`, in `state` ("active": logged in; "lingering": no session).
fn logind(uid: u32, state: &str) -> PathBuf {
    let f = Path::new("/run/systemd/users").join(uid.to_string());
    fs::create_dir_all(f.parent().unwrap()).unwrap();
    fs::write(&f, format!("# This is private data. Do not parse.\nNAME=u{uid}\nSTATE={state}\n")).unwrap();
    f
}

/// A home committed with its owner logged out is left locked (the run's key removed): their
/// login opens it. Opens it with the password the tests choose.
#[track_caller]
fn locked_then_opened(env: &Env, home: &Path) {
    // The background run locks it just after its journal says done.
    let start = Instant::now();
    while env.status_json(home)["key"] != "locked" && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(env.status_json(home)["key"], "locked", "the committed home was left open with nobody in");
    env.ok(&["unlock", p(home)], "pw\n");
}

/// `convert --status DIR`'s line, without the path.
fn live_line(env: &Env, home: &Path) -> String {
    let out = env.ok(&["convert", "--status", p(home)], "");
    out.trim().strip_prefix(&format!("{}: ", home.display())).unwrap_or(out.trim()).to_string()
}

/// Waits (up to `secs`) for the status line to start with `want`; every line seen, in order.
#[track_caller]
fn wait_for(env: &Env, home: &Path, want: &str, secs: u64) -> Vec<String> {
    let start = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    loop {
        let line = live_line(env, home);
        if seen.last() != Some(&line) {
            seen.push(line.clone());
        }
        if line.starts_with(want) {
            return seen;
        }
        assert!(start.elapsed() < Duration::from_secs(secs), "no {want:?} within {secs} s: {seen:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn start_live(env: &Env, home: &Path) -> Duration {
    let t = Instant::now();
    let out = env.ok(&["convert", p(home), "--live", "--yes", "--protector-name", "owner"], "pw\n");
    assert!(out.contains("is being encrypted in the background"), "{out}");
    t.elapsed()
}

/// Keystore subdirectory `sub`'s files (none if it does not exist).
fn files(env: &Env, sub: &str) -> Vec<String> {
    let dir = env.keystore().join(sub);
    if !dir.exists() {
        return Vec::new();
    }
    names(&dir).into_iter().filter(|n| !n.starts_with('.')).collect()
}

#[test]
fn a_live_conversion_commits_once_nothing_uses_the_home() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/alice");
    build_home(&home, fresh_uid(), 16);
    let mut c = Cleanup { env: &env, home: home.clone(), session: Some(session(&home)), logind: None };
    let returned = start_live(&env, &home);
    let t = Instant::now();
    let seen = wait_for(&env, &home, "live: caught up, waiting for logout", 180);
    let caught_up = t.elapsed();
    // The command returned with the background run going.
    assert!(!seen.iter().any(|l| l.contains("not running")), "{seen:?}");
    // Still plaintext, still in use: the session changes the home (renames, appends, deletes).
    assert_eq!(env.status_json(&home)["encrypted"], false);
    fs::rename(home.join("Documents/plan.txt"), home.join("Documents/plan-v2.txt")).unwrap();
    std::io::Write::write_all(
        &mut fs::OpenOptions::new().append(true).open(home.join("Documents/deep/big.bin")).unwrap(),
        b"appended",
    )
    .unwrap();
    fs::remove_file(home.join("bulk/3")).unwrap();
    fs::write(home.join("Documents/new.txt"), b"written while caught up").unwrap();
    // While the session's shell has its cwd there, nothing is committed.
    std::thread::sleep(Duration::from_secs(7));
    let line = live_line(&env, &home);
    assert!(line.starts_with("live: caught up, waiting for logout"), "{line}");
    assert_eq!(env.status_json(&home)["encrypted"], false);
    // The session ends: the background run commits what the home is now.
    let mut s = c.session.take().unwrap();
    s.kill().unwrap();
    s.wait().unwrap();
    let at_commit = manifest(&home);
    let t = Instant::now();
    let end = wait_for(&env, &home, "live: done", 120);
    let committed = t.elapsed();
    eprintln!(
        "live: returned in {returned:?}, caught up after {caught_up:?}, committed {committed:?} after the session ended; lines {seen:?} {end:?}"
    );
    // Locked with the owner gone, it opens with the password asked at the start.
    locked_then_opened(&env, &home);
    assert_eq!(manifest(&home), at_commit);
    let st = env.status_json(&home);
    assert_eq!(st["encrypted"], true, "{st}");
    assert!(files(&env, "held").is_empty() && files(&env, "scheduled").is_empty());
    drop(c);
}

#[test]
fn a_live_conversion_waits_for_the_owner_logout() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/bob");
    let uid = fresh_uid();
    build_home(&home, uid, 1);
    let before = manifest(&home);
    let c = Cleanup { env: &env, home: home.clone(), session: None, logind: Some(logind(uid, "active")) };
    start_live(&env, &home);
    wait_for(&env, &home, "live: caught up, waiting for logout", 120);
    // Nothing uses the home, but its owner is logged in: no commit.
    std::thread::sleep(Duration::from_secs(7));
    let line = live_line(&env, &home);
    assert!(line.starts_with("live: caught up, waiting for logout"), "{line}");
    // The owner logs out (logind keeps a lingering user's record): the commit follows.
    logind(uid, "lingering");
    wait_for(&env, &home, "live: done", 60);
    assert_eq!(env.status_json(&home)["encrypted"], true);
    locked_then_opened(&env, &home);
    assert_eq!(manifest(&home), before);
    drop(c);
}

#[test]
fn a_live_conversion_cancelled_while_caught_up_leaves_nothing() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/carol");
    let uid = fresh_uid();
    build_home(&home, uid, 1);
    let before = manifest(&home);
    let c = Cleanup { env: &env, home: home.clone(), session: None, logind: Some(logind(uid, "active")) };
    start_live(&env, &home);
    wait_for(&env, &home, "live: caught up, waiting for logout", 120);
    let out = env.run(&["convert", "--abort", p(&home)], "");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said} {}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("the original is untouched"), "{said}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("stopped the background run"));
    assert_eq!(manifest(&home), before);
    assert_eq!(env.status_json(&home)["encrypted"], false);
    for sub in ["held", "scheduled", "policies", "protectors"] {
        assert!(files(&env, sub).is_empty(), "{sub}: {:?}", files(&env, sub));
    }
    drop(c);
}

/// The background run's pid, from its lock file (the one whose process names `home`).
fn worker_pid(home: &Path) -> i32 {
    for e in fs::read_dir("/run/dirseal").unwrap().flatten() {
        let Ok(pid) = fs::read_to_string(e.path()) else { continue };
        let Ok(pid) = pid.trim().parse::<i32>() else { continue };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(p(home)) {
            return pid;
        }
    }
    panic!("no background run of {} found", home.display())
}

/// The owner never logs out: the background run is gone with the shutdown (SIGKILL), the reboot
/// drops every key; the boot-time run, before any login, commits it with the held key, nothing
/// typed.
#[test]
fn a_live_conversion_never_committed_is_committed_by_the_next_boot() {
    dirseal_testfs::needs_root!();
    let mut env = Env::new();
    let home = env.mnt().join("home/dave");
    let uid = fresh_uid();
    build_home(&home, uid, 2);
    let logind = logind(uid, "active");
    start_live(&env, &home);
    wait_for(&env, &home, "live: caught up, waiting for logout", 120);
    let pid = worker_pid(&home);
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let line = wait_for(&env, &home, "live: caught up, not running", 10);
    assert!(line.last().unwrap().contains("the next boot commits it"), "{line:?}");
    fs::write(home.join("Documents/late.txt"), b"written after the run was gone").unwrap();
    let before = manifest(&home);
    env.fs.remount();
    let out = env.ok(&["convert", "--scheduled"], "");
    assert!(out.contains(&format!("{} is encrypted", home.display())), "{out}");
    assert_eq!(manifest(&home), before);
    assert!(files(&env, "held").is_empty() && files(&env, "scheduled").is_empty());
    let _ = fs::remove_file(logind);
    env.fs.remount();
    env.ok(&["unlock", p(&home)], "pw\n");
    assert_eq!(manifest(&home), before);
}

/// A commit put off: held just after it began (a fault-injection hold), a process of the session
/// starts using the home; the engine's check before the swap refuses, the run records the
/// deferral (status says why) and catches up again; once the process is gone it commits.
#[cfg(feature = "fault-injection")]
#[test]
fn a_commit_put_off_by_a_returning_session_is_deferred_then_done() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/erin");
    build_home(&home, fresh_uid(), 1);
    let hold = env.etc.path().join("hold");
    let mut c = Cleanup { env: &env, home: home.clone(), session: None, logind: None };
    let out = env
        .cmd(&["convert", p(&home), "--live", "--yes", "--protector-name", "owner"])
        .env("DIRSEAL_FAULT", "after-record-committing")
        .env("DIRSEAL_FAULT_HOLD", &hold)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut ch| {
            std::io::Write::write_all(&mut ch.stdin.take().unwrap(), b"pw\n")?;
            ch.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let start = Instant::now();
    while !hold.exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "the commit never began");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(live_line(&env, &home).starts_with("live: committing"));
    c.session = Some(session(&home));
    fs::remove_file(&hold).unwrap();
    let seen = wait_for(&env, &home, "live: deferred (", 60);
    assert!(seen.last().unwrap().contains("is still in use"), "{seen:?}");
    assert_eq!(env.status_json(&home)["encrypted"], false);
    let mut s = c.session.take().unwrap();
    s.kill().unwrap();
    s.wait().unwrap();
    let at_commit = manifest(&home);
    wait_for(&env, &home, "live: done", 60);
    locked_then_opened(&env, &home);
    assert_eq!(manifest(&home), at_commit);
    assert_eq!(env.status_json(&home)["encrypted"], true);
    drop(c);
}

/// `--wait`: the command returns once the background run has committed (nothing uses the home,
/// its owner has no session), having said each stage on stderr.
#[test]
fn live_with_wait_returns_after_the_commit() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home/frank");
    build_home(&home, fresh_uid(), 1);
    let before = manifest(&home);
    let c = Cleanup { env: &env, home: home.clone(), session: None, logind: None };
    let out = env.run(&["convert", p(&home), "--live", "--wait", "--yes", "--protector-name", "owner"], "pw\n");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("live: caught up, waiting for logout") || said.contains("live: committing"), "{said}");
    assert!(said.trim_end().ends_with("live: done"), "{said}");
    assert_eq!(env.status_json(&home)["encrypted"], true);
    locked_then_opened(&env, &home);
    assert_eq!(manifest(&home), before);
    drop(c);
}
