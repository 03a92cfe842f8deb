//! State shared by the threads of one phase: counters, throttled progress, cancellation, and the
//! mapping of low-level errors to messages that name the entry.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::io::Errno;

use crate::fsx::{self, Meta};
use crate::journal::Journal;
use crate::types::Direction;
use crate::{Host, MigrateError, Phase, Progress};

const PROGRESS_EVERY: Duration = Duration::from_millis(250);
const SAVE_EVERY: Duration = Duration::from_secs(5);

pub(crate) struct Ctx<'a> {
    pub host: &'a dyn Host,
    /// The source path as the user named it, to print entries by their real location.
    pub source: &'a Path,
    /// Mount id of the source root; any entry on another mount is a mount point inside.
    pub root_mnt: u64,
    pub phase: Phase,
    pub files_total: u64,
    pub bytes_total: u64,
    pub files_done: AtomicU64,
    pub bytes_done: AtomicU64,
    /// Files seen changing while they were copied, in this run.
    pub recopied: AtomicU64,
    stopped: AtomicBool,
    last: Mutex<Option<Instant>>,
    /// Writes the counters to the journal (see `checkpoint` in lib.rs), every `SAVE_EVERY`.
    saver: Option<&'a (dyn Fn(u64, u64) + Sync)>,
    last_save: Mutex<Instant>,
    /// Decrypting: the source's entries are encrypted (with the root's policy) by design.
    decrypting: bool,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(
        host: &'a dyn Host,
        source: &'a Path,
        root_mnt: u64,
        phase: Phase,
        files_total: u64,
        bytes_total: u64,
    ) -> Ctx<'a> {
        Ctx {
            host,
            source,
            root_mnt,
            phase,
            files_total,
            bytes_total,
            files_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            recopied: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            last: Mutex::new(None),
            saver: None,
            last_save: Mutex::new(Instant::now()),
            decrypting: false,
        }
    }

    /// A pass over the source of a conversion going `direction`.
    pub(crate) fn going(mut self, direction: Direction) -> Ctx<'a> {
        self.decrypting = direction == Direction::Decrypt;
        self
    }

    pub(crate) fn saving(mut self, saver: &'a (dyn Fn(u64, u64) + Sync)) -> Ctx<'a> {
        self.saver = Some(saver);
        self
    }

    /// Copies this pass's counters into the journal (capped at its totals), for its next write.
    pub(crate) fn counters_into(&self, j: &mut Journal) {
        j.files_done = self.files_done.load(Ordering::Relaxed).min(j.files_total);
        j.bytes_done = self.bytes_done.load(Ordering::Relaxed).min(j.bytes_total);
    }

    /// Whether the host asked to stop (as seen by any thread).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub(crate) fn display(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.source.to_path_buf()
        } else {
            self.source.join(rel)
        }
    }

    fn snapshot(&self) -> Progress {
        let files_done = self.files_done.load(Ordering::Relaxed).min(self.files_total);
        let bytes_done = self.bytes_done.load(Ordering::Relaxed).min(self.bytes_total);
        Progress {
            phase: self.phase,
            bytes_done,
            bytes_total: self.bytes_total,
            files_done,
            files_total: self.files_total,
        }
    }

    /// Reports progress at most a few times per second (always when `force`).
    pub(crate) fn tick(&self, force: bool) {
        let guard = if force { self.last.lock().ok() } else { self.last.try_lock().ok() };
        if let Some(mut last) = guard {
            if force || last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                *last = Some(Instant::now());
                let p = self.snapshot();
                self.host.progress(&p);
                if let (Some(save), Ok(mut at)) = (self.saver, self.last_save.try_lock()) {
                    if at.elapsed() >= SAVE_EVERY {
                        *at = Instant::now();
                        save(p.files_done, p.bytes_done);
                    }
                }
            }
        }
    }

    pub(crate) fn add_bytes(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
        self.tick(false);
    }

    pub(crate) fn file_done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
        self.tick(false);
    }

    /// Polls the host; once it asked to stop, every thread sees it.
    pub(crate) fn check_stop(&self) -> Result<(), MigrateError> {
        if self.stopped.load(Ordering::Relaxed) || self.host.should_stop() {
            self.stopped.store(true, Ordering::Relaxed);
            return Err(MigrateError::Interrupted { state: crate::State::Copying });
        }
        Ok(())
    }

    /// Refuses entries that cannot be converted faithfully: other mounts, encrypted inodes (when
    /// encrypting; a decrypt's source is encrypted throughout), entries with fs-verity or DAX
    /// (no copy can have them) and special files that are immutable or append-only (their flags
    /// cannot be read or set through an open file).
    pub(crate) fn check_entry(&self, m: &Meta, rel: &Path) -> Result<(), MigrateError> {
        if m.mnt_id != self.root_mnt {
            return Err(MigrateError::MountPointInside { path: self.display(rel) });
        }
        if m.encrypted && !self.decrypting {
            return Err(MigrateError::EncryptedInside { path: self.display(rel) });
        }
        if m.unkept != 0 {
            let (flag, reason) = crate::flags::unkept(m.unkept);
            return Err(MigrateError::FlagNotKept { path: self.display(rel), flag, reason: reason.into() });
        }
        if m.sealed != 0 && m.kind != crate::fsx::Kind::File && m.kind != crate::fsx::Kind::Dir {
            return Err(MigrateError::ImmutableInside { path: self.display(rel) });
        }
        Ok(())
    }

    /// A failure reading the source.
    pub(crate) fn src_err(&self, rel: &Path, e: io::Error) -> MigrateError {
        MigrateError::CopyFailed { path: self.display(rel), source: e }
    }

    /// A failure writing the staging copy; running out of space gets its own message.
    pub(crate) fn dst_err(&self, rel: &Path, e: io::Error) -> MigrateError {
        if fsx::is_errno(&e, Errno::NOSPC) || fsx::is_errno(&e, Errno::DQUOT) {
            MigrateError::OutOfSpace { path: self.display(rel) }
        } else {
            MigrateError::CopyFailed { path: self.display(rel), source: e }
        }
    }
}
