//! What ships with the key library without managing keys: a display manager's automatic login
//! onto an encrypted home ([`autologin`]: its configuration files, and whether the home opens
//! with no secret typed) and overwriting a filesystem's free space ([`scrub`]). Kept out of the
//! key library's own modules so that what handles keys stays what a reviewer reads; the crate
//! root re-exports both (`dirseal::autologin`, `dirseal::scrub`).
//!
//! Each points one way, from above: `autologin` uses the key library (`ops`); `scrub` uses
//! `fscrypt` (its TRIM, which conversions use too), `convert` (to refuse scrubbing under an
//! unfinished conversion), `ui` and `sys`. Nothing in the key library uses them
//! (core/tests/modules.rs checks that no module circle runs through here).
pub mod autologin;
pub mod scrub;
