//! Named crash points for tests (feature `fault-injection` only). With the feature off these are
//! empty inline functions and the environment is never read. The list of points is in
//! docs/crash-safety.md.
//!
//! `DIRSEAL_FAULT=<point>` makes the process exit at the first time execution reaches `<point>`;
//! `DIRSEAL_FAULT=<point>:<n>` at the n-th time (e.g. `copy-file:30`, after the 30th file copied
//! by this run). Counting is per process and across threads, so a point reached by parallel
//! workers dies at exactly the n-th arrival.

/// Exits the process with status 99 when `DIRSEAL_FAULT` names this point and this is the
/// wanted arrival. No destructors, no journal flush: to the files on disk it looks like a crash at
/// this instant (the engine never holds unwritten data in user space).
#[cfg(feature = "fault-injection")]
pub(crate) fn point(name: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static WANTED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let wanted = WANTED.get_or_init(|| {
        let v = std::env::var("DIRSEAL_FAULT").ok()?;
        match v.rsplit_once(':') {
            Some((p, n)) => Some((p.to_string(), n.parse().ok()?)),
            None => Some((v, 1)),
        }
    });
    if let Some((p, n)) = wanted {
        if p == name && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            std::process::exit(99);
        }
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn point(_: &str) {}
