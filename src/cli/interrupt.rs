//! Ctrl-C (SIGINT) and SIGTERM, one way for the whole CLI (issue 44): a question cancels, a long
//! job stops at its next safe point, anything else ends as it would without dirseal's handler.
//!
//! One handler is installed at start. While something *catches* the signal (a read of the
//! terminal in [`super::term`], a conversion's or a scrub's run) it only sets [`flag`]; a read
//! that sees it returns [`dirseal::ui::UiError::Cancelled`], so every question (y/N, passwords,
//! PINs, recovery keys, menus) cancels with nothing written and exit status 130, and a run polls
//! the flag as its stop flag. While nothing catches it (a KDF, a lock, a status), the signal's
//! default action ends the process at once, as before.
//!
//! Before, convert's stop flag was registered before its plan, so a Ctrl-C at any of its
//! questions only set that flag: the read went on (SA_RESTART), the next line typed was taken as
//! the answer, and "no" could become a new protector and a copy that then stopped.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

struct Handler {
    /// Set by SIGINT or SIGTERM while caught; never cleared (the process is on its way out).
    arrived: Arc<AtomicBool>,
    /// True while nothing catches the signal: its default action runs (the process ends).
    uncaught: Arc<AtomicBool>,
    /// How many [`Catching`] guards are alive (a read inside a run: two).
    catchers: Mutex<usize>,
}

static HANDLER: OnceLock<Handler> = OnceLock::new();

/// Installs the handler for SIGINT and SIGTERM; once, before any question or job.
pub fn install() -> std::io::Result<()> {
    let arrived = Arc::new(AtomicBool::new(false));
    let uncaught = Arc::new(AtomicBool::new(true));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_default(sig, Arc::clone(&uncaught))?;
        signal_hook::flag::register(sig, Arc::clone(&arrived))?;
    }
    let _ = HANDLER.set(Handler { arrived, uncaught, catchers: Mutex::new(0) });
    Ok(())
}

/// The flag SIGINT and SIGTERM set while caught: a run's stop flag. Without [`install`] (unit
/// tests) a flag nothing sets.
pub fn flag() -> &'static AtomicBool {
    static NEVER: AtomicBool = AtomicBool::new(false);
    HANDLER.get().map_or(&NEVER, |h| &h.arrived)
}

/// Whether a signal came while caught.
pub fn arrived() -> bool {
    flag().load(Ordering::SeqCst)
}

/// While alive, SIGINT and SIGTERM set [`flag`] instead of ending the process.
pub struct Catching(());

/// Catches SIGINT and SIGTERM until the guard is dropped.
pub fn catching() -> Catching {
    if let Some(h) = HANDLER.get() {
        let mut n = h.catchers.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        h.uncaught.store(false, Ordering::SeqCst);
    }
    Catching(())
}

impl Drop for Catching {
    fn drop(&mut self) {
        if let Some(h) = HANDLER.get() {
            let mut n = h.catchers.lock().unwrap_or_else(|e| e.into_inner());
            *n = n.saturating_sub(1);
            if *n == 0 {
                h.uncaught.store(true, Ordering::SeqCst);
            }
        }
    }
}
