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
fn resume_as(ds: &Dirseal, source: &Path, when: When, ui: &mut dyn Ui, hooks: &Hooks<'_>) -> Result<Converted, ConvertError> {
    let v = status(source)?
        .filter(|v| unfinished(v.state) && v.direction == Direction::Encrypt)
        .ok_or_else(|| ConvertError::NotInProgress { path: source.to_path_buf() })?;
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
    let uid = owner_of(&source)?.uid;
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
            if owner_logged_in(uid) {
                if since.elapsed() >= CATCH_UP_EVERY {
                    break false;
                }
                continue;
            }
            match migrate::find_users(&source) {
                Ok(users) if users.is_empty() => break true,
                _ => continue,
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
            other => return other,
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
    Ok(Some(match v.state {
        State::Done => LiveStatus::Done,
        s if !unfinished(s) => LiveStatus::Ended(s),
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
