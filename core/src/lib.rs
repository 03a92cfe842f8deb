//! dirseal: encrypt existing directories in place with Linux fscrypt v2, with master keys kept
//! behind protectors. The front ends (the `dirseal` command, `pam_dirseal`, `dirsealed`) are thin
//! glue over this crate, starting at [`Dirseal`].
//!
//! The library never prints or prompts: everything that needs a human goes through [`ui::Ui`].
//! `unsafe` lives only in the crate-private `sys` module (kernel calls rustix does not wrap).
//!
//! Where things are:
//! - [`ops`]: the operations every front end offers (encrypt, unlock, lock, protectors, policies).
//! - [`convert`]: planning and running the in-place conversion of a directory that holds data.
//! - [`census`]: what a conversion involves ([`census::Summary`]), as front ends show it.
//! - [`protector`]: protector kinds (password, TPM2, FIDO2) and what unlocking each asks for.
//! - [`keystore`]: the root-only directory of protector and policy records.
//! - [`portable`]: directories on removable media whose records travel with them.
//! - [`recovery`]: recovery keys kept with the data, for when the keystore is gone.
//! - [`escrow`]: recovery keys encrypted to an organisation's public keys (age).
//! - [`report`]: what a fleet agent collects of this machine (`dirseal report`).
//! - [`remedy`]: the way out of each error, as data each front end renders in its own terms.
//! - [`fscrypt`]: the kernel's fscrypt v2 API, typed, with errors that say what they mean.
//! - [`tpm2`], [`fido2`]: the devices behind the TPM2 and FIDO2 protector kinds.
//! - [`config`]: the root-owned `/etc/dirseal/config.toml`.
//! - [`account`]: what the password database says of an account (for PIN and touch logins).
//! - [`secret`], [`ids`]: zeroizing secret types; key and protector identifiers.
//! - [`securefile`]: root-owned private files (no-follow reads, atomic durable writes).
//! - [`ui`]: the trait through which the library asks a person things and reports progress.
//! - [`scheduled`]: conversions scheduled for the next boot, and the staging keys held for them.
//! - [`home`]: new homes encrypted from birth (`home create`, PAM `mkhome`, D-Bus CreateHome).
//!
//! Beside the key library, in their own tree (core/src/aside/), what manages no keys:
//! - [`autologin`]: a display manager's automatic login onto an encrypted home (handhelds).
//! - [`scrub`]: overwriting free space, so plaintext deleted before a conversion is gone.
#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod account;
mod advice;
mod aside;
pub use aside::{autologin, scrub};
pub mod census;
pub mod config;
pub mod convert;
pub mod decrypt;
pub mod escrow;
pub mod fido2;
mod format;
pub mod fscrypt;
pub mod home;
pub mod ids;
mod kdf;
pub mod keystore;
pub mod ops;
pub mod portable;
pub mod presence;
pub mod protector;
pub mod recovery;
pub mod remedy;
pub mod report;
pub mod scheduled;
pub mod secret;
pub mod securefile;
mod sys;
pub mod tang;
/// The hardware helpers' process and framing (for `dirseal-tpm2` and `dirseal-fido2`).
#[doc(hidden)]
pub use sys::helper;
pub mod tpm2;
pub mod ui;
mod wrap;

pub use ids::{KeyIdentifier, ProtectorId};
pub use ops::Dirseal;
pub use secret::Passphrase;
pub use ui::Ui;

/// docs/architecture.md, whose Rust blocks (a whole front end) `cargo test --doc` compiles: the
/// steps it gives stay true to the letter.
#[cfg(doctest)]
#[doc = include_str!("../../docs/architecture.md")]
pub struct ArchitectureDoc;
