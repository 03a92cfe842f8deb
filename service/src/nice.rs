//! CPU priority of the service's heavy work. A KDF (Argon2 is memory- and CPU-hard) and a
//! conversion's thread run at [`BACKGROUND`] niceness, so the calls that only read (GetStatus and
//! the like, issue 50) are scheduled before them instead of sharing the cores evenly: on a
//! two-core machine an unlock and a conversion otherwise take a core each and every status
//! answer queues behind them. Linux's nice value is per thread; threads the work starts inherit it.

/// The niceness of heavy work: low enough that interactive calls win, not idle (a loaded
/// machine still lets an unlock and a conversion finish).
pub const BACKGROUND: i32 = 10;

/// The calling thread lowered to [`BACKGROUND`] until this is dropped, then set back. Setting it
/// back needs RLIMIT_NICE (the unit's `LimitNICE=0`) or CAP_SYS_NICE; where neither is granted
/// the thread (a reused blocking-pool thread) stays lowered, which slows only what it later runs.
pub struct Lowered {
    before: Option<i32>,
}

/// Lowers the calling thread's priority (see [`Lowered`]); a thread already at or below
/// [`BACKGROUND`], or one the kernel refuses to change, is left as it is.
pub fn lower() -> Lowered {
    let before = match rustix::process::getpriority_process(None) {
        Ok(n) if n < BACKGROUND && rustix::process::setpriority_process(None, BACKGROUND).is_ok() => Some(n),
        _ => None,
    };
    Lowered { before }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        if let Some(n) = self.before {
            if let Err(e) = rustix::process::setpriority_process(None, n) {
                crate::log::line(&format!(
                    "could not restore a worker thread's niceness to {n} ({e}); give the service LimitNICE=0"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowers_for_the_guards_life_and_restores() {
        // On a thread of its own: the test harness's threads are shared.
        std::thread::spawn(|| {
            let before = rustix::process::getpriority_process(None).expect("getpriority");
            assert!(before < BACKGROUND, "test runs at niceness {before}");
            {
                let _l = lower();
                assert_eq!(rustix::process::getpriority_process(None).expect("getpriority"), BACKGROUND);
                // Nested (a job started under the lock): no change, and no early restore.
                drop(lower());
                assert_eq!(rustix::process::getpriority_process(None).expect("getpriority"), BACKGROUND);
            }
            assert_eq!(rustix::process::getpriority_process(None).expect("getpriority"), before);
        })
        .join()
        .expect("thread");
    }
}
