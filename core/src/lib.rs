//! dirseal: encrypt existing directories in place with Linux fscrypt v2, with master keys kept
//! behind protectors (kinds in [`protector`]; recovery keys in [`recovery`]).
//!
//! The library never prints or prompts: everything that needs a human goes through [`ui::Ui`].
//! `unsafe` lives only in the crate-private `sys` module (kernel calls rustix does not wrap).
#![deny(unsafe_code)]

pub mod account;
pub mod config;
pub mod convert;
pub mod fido2;
pub mod fscrypt;
pub mod ids;
pub mod kdf;
pub mod keystore;
pub mod ops;
pub mod protector;
pub mod recovery;
pub mod remedy;
pub mod scrub;
pub mod secret;
pub mod securefile;
mod sys;
pub mod tpm2;
pub mod ui;
pub mod wrap;
