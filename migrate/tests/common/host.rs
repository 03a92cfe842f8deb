//! The test host: a plain (unencrypted) staging directory, a real `renameat2(RENAME_EXCHANGE)`,
//! and an event hook that sees every call the engine makes into it, numbered, so tests can act at
//! deterministic moments (modify a file, block, stop, or SIGKILL the process).
//!
//! Shared by the in-process tests and the child binary (tests/bin/engine_child.rs).

use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use dirseal_migrate::{Host, HostError, Phase, Progress};

/// A moment in a run, as the host sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A phase began (the engine reports each phase start at once).
    PhaseStart(Phase),
    /// The n-th `should_stop` poll (from 1) since the current phase began.
    Poll(Phase, u64),
    /// `prepare_staging` was called (the staging dir exists and is empty).
    Prepare,
    /// The n-th exchange of this process, before and after the rename itself.
    ExchangeBefore(u64),
    ExchangeAfter(u64),
    Trim,
}

impl Event {
    /// Names used by `TEST_KILL`/`TEST_HOLD` in the child binary: `poll-copying:40`, `prepare`,
    /// `exchange-after`, `start-verifying`...
    pub fn matches(&self, spec: &str) -> bool {
        let (name, n) = match spec.rsplit_once(':') {
            Some((name, n)) => (name, n.parse::<u64>().ok()),
            None => (spec, None),
        };
        let (mine, my_n) = match *self {
            Event::PhaseStart(p) => (format!("start-{}", phase_name(p)), None),
            Event::Poll(p, k) => (format!("poll-{}", phase_name(p)), Some(k)),
            Event::Prepare => ("prepare".to_string(), None),
            Event::ExchangeBefore(k) => ("exchange-before".to_string(), Some(k)),
            Event::ExchangeAfter(k) => ("exchange-after".to_string(), Some(k)),
            Event::Trim => ("trim".to_string(), None),
        };
        mine == name && (n.is_none() || n == my_n.or(Some(1)))
    }
}

/// A phase as named in event specs (`start-rolling-back`): its name with dashes.
pub fn phase_name(p: Phase) -> String {
    p.name().replace(' ', "-")
}

type Hook = Box<dyn Fn(Event, &PlainHost) + Send + Sync>;

pub struct PlainHost {
    hook: Option<Hook>,
    phase: Mutex<Option<Phase>>,
    polls: AtomicU64,
    exchanges: AtomicU64,
    /// What `should_stop` answers (after the hook ran).
    pub stop: AtomicBool,
    /// What `is_encrypted` answers.
    pub encrypted: AtomicBool,
    /// Paths `trim` was asked for.
    pub trims: Mutex<Vec<PathBuf>>,
    /// Every phase start seen, in order.
    pub phases: Mutex<Vec<Phase>>,
    /// Every progress report, in order.
    pub reports: Mutex<Vec<Progress>>,
}

impl Default for PlainHost {
    fn default() -> Self {
        PlainHost::new()
    }
}

impl PlainHost {
    pub fn new() -> PlainHost {
        PlainHost {
            hook: None,
            phase: Mutex::new(None),
            polls: AtomicU64::new(0),
            exchanges: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            encrypted: AtomicBool::new(false),
            trims: Mutex::new(Vec::new()),
            phases: Mutex::new(Vec::new()),
            reports: Mutex::new(Vec::new()),
        }
    }

    pub fn with(hook: impl Fn(Event, &PlainHost) + Send + Sync + 'static) -> PlainHost {
        PlainHost { hook: Some(Box::new(hook)), ..PlainHost::new() }
    }

    /// A host that asks the engine to stop at the first event matching `spec`.
    pub fn stopping_at(spec: &'static str) -> PlainHost {
        PlainHost::with(move |e, h| {
            if e.matches(spec) {
                h.stop.store(true, Ordering::SeqCst);
            }
        })
    }

    fn event(&self, e: Event) {
        if let Some(h) = &self.hook {
            h(e, self);
        }
    }
}

impl Host for PlainHost {
    fn prepare_staging(&self, staging: BorrowedFd<'_>, path: &Path) -> Result<String, HostError> {
        let m = rustix::fs::fstat(staging).map_err(|e| HostError(e.to_string()))?;
        let here = std::fs::symlink_metadata(path).map_err(|e| HostError(e.to_string()))?;
        use std::os::unix::fs::MetadataExt;
        if here.ino() != m.st_ino
            || !here.is_dir()
            || std::fs::read_dir(path).map_err(|e| HostError(e.to_string()))?.next().is_some()
        {
            return Err(HostError("staging is not the empty directory the handle holds".into()));
        }
        self.event(Event::Prepare);
        Ok("plain-token".into())
    }

    fn check_staging(&self, token: &str, _: BorrowedFd<'_>, _: &Path) -> Result<(), HostError> {
        self.ensure_unlocked(token, Path::new("/"))
    }

    fn ensure_unlocked(&self, token: &str, _: &Path) -> Result<(), HostError> {
        if token == "plain-token" {
            Ok(())
        } else {
            Err(HostError(format!("unknown token {token:?}")))
        }
    }

    fn is_encrypted(&self, _: &Path) -> Result<bool, HostError> {
        Ok(self.encrypted.load(Ordering::SeqCst))
    }

    fn exchange(&self, a_dir: BorrowedFd<'_>, a: &OsStr, b_dir: BorrowedFd<'_>, b: &OsStr) -> Result<(), HostError> {
        use rustix::fs::{renameat_with, RenameFlags};
        let n = self.exchanges.fetch_add(1, Ordering::SeqCst) + 1;
        self.event(Event::ExchangeBefore(n));
        renameat_with(a_dir, a, b_dir, b, RenameFlags::EXCHANGE).map_err(|e| HostError(e.to_string()))?;
        self.event(Event::ExchangeAfter(n));
        Ok(())
    }

    fn trim(&self, dir: &Path) -> Result<(), HostError> {
        self.event(Event::Trim);
        self.trims.lock().unwrap().push(dir.to_path_buf());
        Ok(())
    }

    fn progress(&self, p: &Progress) {
        self.reports.lock().unwrap().push(*p);
        let mut cur = self.phase.lock().unwrap();
        if *cur != Some(p.phase) {
            *cur = Some(p.phase);
            self.polls.store(0, Ordering::SeqCst);
            drop(cur);
            self.phases.lock().unwrap().push(p.phase);
            self.event(Event::PhaseStart(p.phase));
        }
    }

    fn should_stop(&self) -> bool {
        let phase = *self.phase.lock().unwrap();
        if let Some(phase) = phase {
            let n = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
            self.event(Event::Poll(phase, n));
        }
        self.stop.load(Ordering::SeqCst)
    }
}
