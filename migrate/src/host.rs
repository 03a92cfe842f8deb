//! What the engine asks of its caller ([`Host`]) and tells it ([`Progress`]).

use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HostError(pub String);

/// What the engine needs from its caller: the encryption of the staging directory and the few
/// privileged operations that live outside this crate.
pub trait Host: Sync {
    /// Make the empty staging dir (just created by the engine, mode 0700 root; `staging` is the
    /// engine's handle on it, `path` only names it in messages) encrypted and unlocked, through
    /// the handle: a path could be made to lead elsewhere. Called once per conversion, before `Prepared` is recorded (a crash before that
    /// record starts the conversion over, with a new staging dir). Returns a token (e.g. the
    /// policy id; at most 256 bytes, no control characters) that the engine stores in the
    /// journal and hands back to [`Host::ensure_unlocked`]. Attributes the host sets on the
    /// staging root (e.g. a recovery blob) are kept; the source root's are added to them.
    fn prepare_staging(&self, staging: BorrowedFd<'_>, path: &Path) -> Result<String, HostError>;
    /// Whether the staging dir (the engine's handle on it) carries the encryption `token` names.
    /// Asked before every copy pass and right before the swap; an error stops the conversion
    /// with nothing swapped.
    fn check_staging(&self, token: &str, staging: BorrowedFd<'_>, path: &Path) -> Result<(), HostError>;
    /// On resume: make sure the staging dir identified by token is unlocked again (after a reboot
    /// the key is gone).
    fn ensure_unlocked(&self, token: &str, staging: &Path) -> Result<(), HostError>;
    /// Whether `path` is already an encrypted directory.
    fn is_encrypted(&self, path: &Path) -> Result<bool, HostError>;
    /// Atomically exchange `a_name` in directory `a_dir` with `b_name` in `b_dir`
    /// (`renameat2(RENAME_EXCHANGE)`), relative to these handles, which the engine opened without
    /// following symlinks and checked to hold the expected entries: nothing is looked up by path
    /// again, so nobody can redirect the swap between the check and the rename.
    fn exchange(
        &self,
        a_dir: BorrowedFd<'_>,
        a_name: &OsStr,
        b_dir: BorrowedFd<'_>,
        b_name: &OsStr,
    ) -> Result<(), HostError>;
    /// Discard unused blocks of the filesystem holding `mountpoint_or_dir` (FITRIM).
    fn trim(&self, mountpoint_or_dir: &Path) -> Result<(), HostError>;
    /// Progress, called at most a few times per second, and always once at each phase start (on
    /// the calling thread, before any work of that phase).
    fn progress(&self, _p: &Progress) {}
    /// Polled between entries and 1 MiB chunks while scanning, copying, verifying and disposing;
    /// returning true makes the engine stop cleanly with [`MigrateError::Interrupted`] (the
    /// journal is written; running the same operation again resumes).
    fn should_stop(&self) -> bool {
        false
    }
}

/// What the engine is doing right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Scanning,
    Copying,
    Verifying,
    Swapping,
    Disposing,
    Aborting,
    RollingBack,
    /// Move mode: files moving into staging, then their directories settling.
    Moving,
    /// Move mode, aborted: files moving back.
    MovingBack,
}

impl Phase {
    /// The phase's name for progress displays and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Scanning => "scanning",
            Phase::Copying => "copying",
            Phase::Verifying => "verifying",
            Phase::Swapping => "swapping",
            Phase::Disposing => "disposing",
            Phase::Aborting => "aborting",
            Phase::RollingBack => "rolling back",
            Phase::Moving => "moving",
            Phase::MovingBack => "moving back",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub phase: Phase,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub files_done: u64,
    pub files_total: u64,
}
