//! The jobs of this service process: their numbers, which run for whom, the cap per user, and
//! the stop of them all when the service stops. The jobs themselves are [`crate::jobs`].
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zbus::zvariant::OwnedObjectPath;

use crate::error::{Error, Kind, Result};

/// The jobs of this service process and what they share.
#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    running: Mutex<Vec<Running>>,
    /// Set when the service stops: jobs stop at their next checkpoint and keep their records.
    shutdown: AtomicBool,
}

/// Conversions one user may have running at once (root: any number).
pub const JOBS_PER_UID: usize = 2;

/// A job's thread, as the registry keeps it.
pub struct Running {
    pub source: PathBuf,
    pub owner: u32,
    pub path: OwnedObjectPath,
    /// Set to stop the job at its next checkpoint.
    pub stop: Arc<AtomicBool>,
    pub thread: JoinHandle<()>,
}

impl Jobs {
    /// The number of the next job (its object path's last component), from 1.
    pub fn number(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Keeps a started job (and forgets the finished ones).
    pub fn add(&self, job: Running) {
        let mut list = self.running.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|r| !r.thread.is_finished());
        list.push(job);
    }

    /// The job already running for `source`, if any.
    pub fn running_for(&self, source: &Path) -> Option<OwnedObjectPath> {
        let list = self.running.lock().unwrap_or_else(|e| e.into_inner());
        list.iter().find(|r| r.source == source && !r.thread.is_finished()).map(|r| r.path.clone())
    }

    /// Refuses a new job for a user who already has [`JOBS_PER_UID`] running.
    pub fn admit(&self, uid: u32) -> Result<()> {
        let list = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let n = list.iter().filter(|r| r.owner == uid && !r.thread.is_finished()).count();
        if uid != 0 && n >= JOBS_PER_UID {
            return Err(Error::new(
                Kind::LimitsExceeded,
                format!("uid {uid} already has {n} conversions running; wait for one to finish"),
            ));
        }
        Ok(())
    }

    /// Whether the service is stopping ([`Jobs::stop_all`]): a job stopped now is interrupted,
    /// not cancelled, and resumes when the service starts again.
    pub fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// Stops every job at its next checkpoint and waits (up to `limit`) for them to return.
    pub fn stop_all(&self, limit: Duration) {
        self.shutdown.store(true, Ordering::SeqCst);
        let list = std::mem::take(&mut *self.running.lock().unwrap_or_else(|e| e.into_inner()));
        for r in &list {
            r.stop.store(true, Ordering::SeqCst);
        }
        let t = Instant::now();
        for r in list {
            while !r.thread.is_finished() && t.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(50));
            }
            if r.thread.is_finished() {
                let _ = r.thread.join();
            }
        }
    }
}
