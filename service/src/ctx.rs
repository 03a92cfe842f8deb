//! What every call of the service shares: where its files are, the one-at-a-time lock, each
//! caller's cap on calls in flight, and the registry of running jobs.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use dirseal::ops::Dirseal;

use crate::error::{Error, Kind, Result};
use crate::registry::Jobs;

/// Where the service finds its files: from its command line, never the environment.
pub struct Ctx {
    pub config: PathBuf,
    pub keystore: Option<PathBuf>,
    /// Root-only; records of running conversions (see [`crate::jobs`]).
    pub run_dir: PathBuf,
    pub jobs: Jobs,
    /// One KDF or keystore change at a time ([`Ctx::one_at_a_time`]).
    work: Mutex<()>,
    /// Calls in flight per caller uid ([`CALLS_PER_UID`]).
    calls: Mutex<HashMap<u32, usize>>,
}

/// Calls one user may have in flight (the rest are refused with LimitsExceeded); root more.
pub const CALLS_PER_UID: usize = 4;
pub const CALLS_ROOT: usize = 64;

/// A call counted against its caller's cap until it is dropped.
pub struct Slot {
    ctx: Arc<Ctx>,
    uid: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut calls = self.ctx.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = calls.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                calls.remove(&self.uid);
            }
        }
    }
}

impl Ctx {
    pub fn new(config: PathBuf, keystore: Option<PathBuf>, run_dir: PathBuf) -> Ctx {
        Ctx { config, keystore, run_dir, jobs: Jobs::default(), work: Mutex::new(()), calls: Mutex::default() }
    }

    /// The lock for work that must not run twice at once. Taken only after the call's secrets
    /// were read: a caller that never closes its secret's pipe holds up no one else.
    pub fn one_at_a_time(&self) -> MutexGuard<'_, ()> {
        self.work.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Ctx::one_at_a_time`] with the keystore opened under it ([`Ctx::open`]), for work that
    /// may change it or runs a KDF.
    pub fn open_alone(&self) -> Result<(MutexGuard<'_, ()>, Dirseal)> {
        let one = self.one_at_a_time();
        Ok((one, self.open()?))
    }

    /// Counts a call of `uid` in flight, or refuses it when the caller has too many.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Slot> {
        let cap = if uid == 0 { CALLS_ROOT } else { CALLS_PER_UID };
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let n = calls.entry(uid).or_default();
        if *n >= cap {
            return Err(Error::new(
                Kind::LimitsExceeded,
                format!("uid {uid} already has {cap} calls in flight; wait for one to return and try again"),
            ));
        }
        *n += 1;
        Ok(Slot { ctx: Arc::clone(self), uid })
    }

    /// Opened per call, so changes made meanwhile by the CLI (config, records) are always seen.
    pub fn open(&self) -> Result<Dirseal> {
        Ok(Dirseal::open(&self.config, self.keystore.as_deref())?)
    }

    /// As [`Ctx::open`], for calls that only read: creates no keystore.
    pub fn open_existing(&self) -> Result<Dirseal> {
        Ok(Dirseal::open_existing(&self.config, self.keystore.as_deref())?)
    }
}
