//! Named crash points for tests (feature `fault-injection` only). With the feature off these are
//! empty inline functions and the environment is never read. The list of points is in
//! docs/crash-safety.md.

/// Exits the process with status 99 if `DIRSEAL_FAULT` names this point. No destructors, no
/// journal flush: to the files on disk it looks like a crash at this instant.
#[cfg(feature = "fault-injection")]
pub(crate) fn point(name: &str) {
    static WANTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let wanted = WANTED.get_or_init(|| std::env::var("DIRSEAL_FAULT").ok());
    if wanted.as_deref() == Some(name) {
        std::process::exit(99);
    }
}

/// `point("<name>:<n>")`, formatted only when the feature is on.
#[cfg(feature = "fault-injection")]
pub(crate) fn numbered(name: &str, n: u64) {
    point(&format!("{name}:{n}"));
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn point(_: &str) {}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn numbered(_: &str, _: u64) {}
