//! Live conversions (`convert --live`, D-Bus Convert with `live`): prepared like a conversion at
//! the next boot ([`When::Live`]: everything asked up front, the staging key held, a schedule
//! recorded), then [`run_live`] copies and catches up while the directory is in use, and commits
//! once its owner has logged out and nothing uses it. A commit put off (the owner came back, a
//! program kept the directory open) is recorded as deferred; the run catches up and waits again.
//! If the run never gets to commit (the machine is shut down with the owner logged in), the
//! boot-time run commits it ([`run_scheduled`]: resuming a caught-up conversion `Now` is the
//! commit), before any session.
use std::time::{Duration, Instant};

use super::*;

/// How often the waiting run looks at the owner's session and the directory's users.
const POLL: Duration = Duration::from_secs(5);
/// A run waiting for the logout catches up again this often, so the commit has little to copy.
const CATCH_UP_EVERY: Duration = Duration::from_secs(15 * 60);
/// Where logind says which users have sessions (one file per uid, while they have any).
const LOGIND_USERS: &str = "/run/systemd/users";

/// Where the lock of each live run is (root's, 0700, as the TPM PIN lock's): held while a run of
/// [`run_live`] goes on, so there is one per directory and a look at it can tell it runs.
const RUN_DIR: &str = "/run/dirseal";

/// The held lock of a live run of one directory.
struct RunLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

fn lock_path(source: &Path) -> Result<PathBuf, ConvertError> {
    let name = workdir_for(source)?.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(Path::new(RUN_DIR).join(format!("live-{name}.lock")))
}

/// Takes the live-run lock of `source` (`None`: another run holds it); the lock file then names
/// this process, for [`stop_live`].
fn run_lock(source: &Path) -> Result<Option<RunLock>, ConvertError> {
    use crate::securefile::{self, Privacy, SecureFileError};
    use std::io::{Seek, Write};
    let path = lock_path(source)?;
    let failed = |e: SecureFileError| ConvertError::Path {
        path: source.to_path_buf(),
        reason: format!("cannot take the lock of its live run: {e}"),
    };
    securefile::ensure_private_dir(Path::new(RUN_DIR)).map_err(failed)?;
    match securefile::lock_file_within(&path, Privacy::OwnerOnly, Some(Duration::ZERO)) {
        Ok(mut lock) => {
            let named =
                lock.set_len(0).and_then(|()| lock.rewind()).and_then(|()| write!(lock, "{}", std::process::id()));
            named.map_err(|e| failed(SecureFileError::Io { path: path.clone(), op: "write", source: e }))?;
            Ok(Some(RunLock { _lock: lock }))
        }
        Err(SecureFileError::Held { .. }) => Ok(None),
        Err(e) => Err(failed(e)),
    }
}

/// Stops the background run of `dir`'s live conversion, if one goes on in another process
/// (SIGTERM: it stops at its next safe point), and waits up to a minute for it to end; an abort
/// or a commit by hand comes after. Whether one was running.
pub fn stop_live(dir: &Path) -> Result<bool, ConvertError> {
    let source = absolute(dir)?;
    if run_lock(&source)?.is_some() {
        return Ok(false);
    }
    let path = lock_path(&source)?;
    let pid = std::fs::read_to_string(&path).ok().and_then(|p| p.trim().parse::<i32>().ok());
    let stuck = |why: String| ConvertError::Path { path: source.clone(), reason: why };
    let Some(pid) = pid.filter(|&p| p > 1 && p as u32 != std::process::id()) else {
        return Err(stuck(format!("its live run goes on, but {} names no process to stop", path.display())));
    };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if run_lock(&source)?.is_some() {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(stuck(format!("its live run (pid {pid}) did not stop within a minute; stop it, then try again")))
}

/// What a live run reports as it goes (besides the engine's progress).
#[derive(Clone, Copy, Debug)]
pub enum LiveEvent<'a> {
    /// Caught up after `passes` catch-up passes: waiting for the owner's logout.
    CaughtUp {
        /// Catch-up passes finished so far.
        passes: u32,
    },
    /// The owner is gone and nothing uses the directory: the commit begins.
    Committing,
    /// The commit was put off, for this reason; the run catches up and waits again.
    Deferred(&'a str),
}

/// Whether `uid` has a login session: logind's record of the user exists and says neither
/// "lingering" (no session, user manager kept) nor "closing" (the last session is ending).
pub fn owner_logged_in(uid: u32) -> bool {
    match std::fs::read_to_string(Path::new(LOGIND_USERS).join(uid.to_string())) {
        Ok(text) => !text.lines().any(|l| matches!(l.trim(), "STATE=lingering" | "STATE=closing")),
        Err(_) => false,
    }
}

/// A conversion committed while its owner is not logged in (at boot, or a live one after their
/// last logout) would leave the key its run loaded in the kernel: the home would stay open with
/// nobody in. It is removed, so the directory is locked until a login (or `dirseal unlock`) opens
/// it, as the last logout leaves a home. A session of the owner's (a login that raced the commit)
/// keeps it, and so does a directory of root's (a shared one: no login would open it again).
pub(crate) fn lock_after_commit(ds: &Dirseal, converted: &Converted, source: &Path, ui: &mut dyn Ui) {
    if !matches!(converted.outcome.state, State::Done | State::Swapped) {
        return;
    }
    let Ok(owner) = owner_of(source) else { return };
    if owner.uid == 0 || owner_logged_in(owner.uid) {
        return;
    }
    match ds.lock(source, true) {
        Ok(r) if r.locked || r.already_locked => {
            ui.notice(&format!("locked {}: its owner's login opens it", source.display()))
        }
        Ok(_) => ui.notice(&format!("{} stays partly open: files in it are still in use", source.display())),
        Err(e) => ui.notice(&format!("{} stays unlocked: {e}", source.display())),
    }
}

/// Lowers the calling process's CPU and I/O priority for a background run (nice 19, idle I/O
/// class): what `systemd-run` sets as unit properties, for a run started without systemd.
pub fn background_priority() -> Result<(), ConvertError> {
    let failed = |what: &str, e: std::io::Error| ConvertError::Path {
        path: PathBuf::from("/proc/self"),
        reason: format!("cannot lower the {what} priority of the background run: {e}"),
    };
    // An increment past the lowest priority stops there.
    rustix::process::nice(19).map_err(|e| failed("CPU", e.into()))?;
    crate::sys::ioprio_idle().map_err(|e| failed("I/O", std::io::Error::from_raw_os_error(e as i32)))
}

/// Runs the unfinished live conversion of `source` once more as `when` says (a catch-up to
/// `CaughtUp`, or the commit), with its held key: nothing is asked of `ui`.
fn resume_as(
    ds: &Dirseal,
    source: &Path,
    when: When,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
) -> Result<Converted, ConvertError> {
    let v = status(source)?
        .filter(|v| v.direction == Direction::Encrypt)
        .ok_or_else(|| ConvertError::NotInProgress { path: source.to_path_buf() })?;
    if !unfinished(v.state) {
        // Ended meanwhile (committed or aborted by hand, or by a boot).
        let outcome = ended(&v);
        return Ok(Converted { outcome, recovery_key_saved: None, scheduled: false });
    }
    let key = staging_key_needed(source, &v)?;
    let options = Options { when, ..Options::default() };
    let plan = ResumePlan { source: source.to_path_buf(), workdir: workdir_for(source)?, options, state: v.state, key };
    plan.run(ds, Pick::default(), ui, hooks)
}

/// Commits the caught-up live conversion of `dir` now (a last catch-up pass, verification, swap,
/// disposal), with its held key. Refused with [`MigrateError::StillInUse`] while anything uses
/// the directory (it stays caught up).
pub fn commit_live(ds: &Dirseal, dir: &Path, ui: &mut dyn Ui, hooks: &Hooks<'_>) -> Result<Converted, ConvertError> {
    resume_as(ds, &absolute(dir)?, When::Now, ui, hooks)
}

/// The live schedule of `source`, if it has one.
fn live_schedule(ds: &Dirseal, source: &Path) -> Result<Option<Schedule>, ConvertError> {
    Ok(match schedules(ds).state_of(source).map_err(OpsError::from)? {
        Some(BootState::Pending(s)) if s.live => Some(s),
        _ => None,
    })
}

/// The background part of a live conversion of `dir` ([`When::Live`], prepared by
/// [`NewPlan::run`]): copies and catches up while the directory is in use, then waits (polling
/// every few seconds) until its owner has no login session and no process uses it, and commits.
/// A commit put off goes back to catching up and waiting. Returns once committed; `hooks.stop`
/// stops it at the next safe point (it stays resumable: run it again, or the next boot commits).
pub fn run_live(
    ds: &Dirseal,
    dir: &Path,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
    on: &dyn Fn(LiveEvent<'_>),
) -> Result<Converted, ConvertError> {
    let source = absolute(dir)?;
    let Some(_running) = run_lock(&source)? else {
        return Err(ConvertError::Path {
            path: source,
            reason: "its live conversion already runs in the background; `dirseal convert --status DIR` shows where it stands".into(),
        });
    };
    let uid = owner_of(&source)?.uid;
    let result = live_loop(ds, &source, uid, ui, hooks, on);
    if let Err(e) = &result {
        // Said by status until a run goes on (an interrupted run is no failure). The run's own
        // error is what is returned even when this record cannot be written: a disk that fails
        // a catch-up pass fails the record too, and its error would hide the first.
        if !matches!(e, ConvertError::Migrate(MigrateError::Interrupted { .. })) {
            if let Ok(Some(s)) = live_schedule(ds, &source) {
                let _ = schedules(ds).failed(&s, e.to_string());
            }
        }
    }
    result
}

fn live_loop(
    ds: &Dirseal,
    source: &Path,
    uid: u32,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
    on: &dyn Fn(LiveEvent<'_>),
) -> Result<Converted, ConvertError> {
    let source = source.to_path_buf();
    let stopped = || -> Result<(), ConvertError> {
        match hooks.stop.load(Ordering::Relaxed) {
            true => Err(MigrateError::Interrupted { state: State::CaughtUp }.into()),
            false => Ok(()),
        }
    };
    loop {
        let caught = resume_as(ds, &source, When::Live, ui, hooks)?;
        if caught.outcome.state != State::CaughtUp {
            // Finished meanwhile (by hand, or by a boot): nothing left to wait for.
            return Ok(caught);
        }
        let passes = status(&source)?.map_or(0, |v| v.passes);
        on(LiveEvent::CaughtUp { passes });
        let since = Instant::now();
        let commit = loop {
            let until = Instant::now() + POLL;
            while Instant::now() < until {
                stopped()?;
                std::thread::sleep(Duration::from_millis(200));
            }
            let free = !owner_logged_in(uid) && migrate::find_users(&source).is_ok_and(|u| u.is_empty());
            if free {
                break true;
            }
            if since.elapsed() >= CATCH_UP_EVERY {
                break false;
            }
        };
        if !commit {
            continue;
        }
        let s = live_schedule(ds, &source)?;
        if let Some(s) = &s {
            schedules(ds).live_commit(s, None).map_err(OpsError::from)?;
        }
        on(LiveEvent::Committing);
        match resume_as(ds, &source, When::Now, ui, hooks) {
            Err(e @ ConvertError::Migrate(MigrateError::StillInUse { .. })) => {
                let reason = match owner_logged_in(uid) {
                    true => "the user logged back in".to_string(),
                    false => e.to_string(),
                };
                if let Some(s) = live_schedule(ds, &source)? {
                    schedules(ds).live_commit(&s, Some(reason.clone())).map_err(OpsError::from)?;
                }
                on(LiveEvent::Deferred(&reason));
            }
            other => {
                if let Ok(c) = &other {
                    lock_after_commit(ds, c, &source, ui);
                }
                return other;
            }
        }
    }
}

/// Where a live conversion stands, as its front ends say it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveStatus {
    /// The first copy (percent of the data).
    Copying {
        /// Of the data, 0-100.
        percent: u8,
    },
    /// Catch-up pass `pass` (the directory changed since the last).
    CatchingUp {
        /// From 1.
        pass: u32,
    },
    /// Caught up, waiting for the owner's logout.
    Waiting,
    /// Caught up again after a commit was put off for `reason`.
    Deferred {
        /// As said to a person.
        reason: String,
    },
    /// The commit runs.
    Committing,
    /// Committed: the directory is encrypted.
    Done,
    /// Ended otherwise (aborted, or a state a person finishes by hand).
    Ended(State),
    /// Unfinished, and no live run goes on (stopped, failed, or the machine restarted): the
    /// next boot commits it, or `dirseal convert --live DIR` runs it again.
    NotRunning {
        /// Where its journal stands.
        state: State,
        /// Why the last run stopped, when it failed.
        error: Option<String>,
    },
}

impl std::fmt::Display for LiveStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LiveStatus::Copying { percent } => write!(f, "live: copying in the background ({percent} %)"),
            LiveStatus::CatchingUp { pass } => write!(f, "live: catching up (pass {pass})"),
            LiveStatus::Waiting => write!(f, "live: caught up, waiting for logout"),
            LiveStatus::Deferred { reason } => write!(f, "live: deferred ({reason}); caught up, waiting for logout"),
            LiveStatus::Committing => write!(f, "live: committing"),
            LiveStatus::Done => write!(f, "live: done"),
            LiveStatus::Ended(s) => write!(f, "live: {s}"),
            LiveStatus::NotRunning { state, error } => {
                write!(f, "live: {state}, not running")?;
                if let Some(e) = error {
                    write!(f, " (it failed: {e})")?;
                }
                write!(f, "; the next boot commits it, or `dirseal convert --live DIR` runs it again")
            }
        }
    }
}

/// Where the live conversion of `dir` stands (`None`: it has none), from its journal and its
/// schedule.
pub fn live_status(ds: &Dirseal, dir: &Path) -> Result<Option<LiveStatus>, ConvertError> {
    let source = absolute(dir)?;
    let Some(v) = status(&source)?.filter(|v| v.live) else { return Ok(None) };
    let s = live_schedule(ds, &source)?;
    let committing = s.as_ref().is_some_and(|s| s.committing_unix.is_some());
    // A run goes on when its lock is held (or the engine's, by a resume by hand).
    let running = v.running || run_lock(&source)?.is_none();
    Ok(Some(match v.state {
        State::Done => LiveStatus::Done,
        s if !unfinished(s) => LiveStatus::Ended(s),
        state if !running => LiveStatus::NotRunning { state, error: s.and_then(|s| s.last_failure).map(|f| f.error) },
        State::Verified | State::Swapped => LiveStatus::Committing,
        State::CaughtUp => match s.and_then(|s| s.deferred) {
            Some(d) => LiveStatus::Deferred { reason: d.error },
            None => LiveStatus::Waiting,
        },
        _ if committing => LiveStatus::Committing,
        State::CatchingUp => LiveStatus::CatchingUp { pass: v.passes + 1 },
        _ => {
            let percent = (v.bytes_done.saturating_mul(100) / v.bytes_total.max(1)).min(100);
            LiveStatus::Copying { percent: u8::try_from(percent).unwrap_or(100) }
        }
    }))
}
