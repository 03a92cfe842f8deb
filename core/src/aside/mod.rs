//! What ships with the key library without managing keys: a display manager's automatic login
//! onto an encrypted home ([`autologin`]: its configuration files, and whether the home opens
//! with no secret typed) and overwriting a filesystem's free space ([`scrub`]). Kept out of the
//! key library's own modules so that what handles keys stays what a reviewer reads; the crate
//! root re-exports both (`dirseal::autologin`, `dirseal::scrub`).
//!
//! Each points one way: `autologin` uses the key library (`ops`) from above; `scrub` is used by
//! it from below (a conversion TRIMs the blocks it freed with [`scrub::trim`]) and itself uses
//! only `fscrypt`, `ui` and `sys`. No module circle runs through here.
pub mod autologin;
pub mod scrub;
