//! Recovery keys: the protector of last resort, typed back from paper years later, possibly on a
//! handheld's on-screen keyboard.
//!
//! - [`RecoveryKey`]: 128 bits from the OS CSPRNG, printed as 8 groups of 6 digits
//!   (`123453-234564-...`). Each group is a 16-bit chunk × 11, so every group carries its own
//!   check: a mistyped digit or two swapped neighbours make it fail, and [`RecoveryKey::parse`]
//!   names the group before any cryptography runs ([`ParseError`]).
//! - [`seal`] / [`open`] / [`Sealed`]: a versioned blob holding a secret (the directory's master
//!   key) under AES-256-GCM with a key derived by HKDF-SHA256 from the recovery key and a caller
//!   context (the policy's fscrypt key identifier), plus non-secret metadata bound to it
//!   ([`BlobError`]).
//!
//! A uniformly random 128-bit secret needs no password stretching: guessing it costs 2^128 trials
//! whatever the KDF. See docs/recovery-format.md.
#![forbid(unsafe_code)]

mod blob;
mod key;

pub use blob::{
    open, seal, BlobError, Sealed, CHECK_LEN, CONTEXT_LEN, MAGIC, MAX_BLOB, MAX_METADATA, MAX_SECRET, MIN_BLOB,
    NONCE_LEN, TAG_LEN, VERSION,
};
pub use key::{ParseError, RecoveryKey, GROUPS, GROUP_DIGITS, GROUP_MODULUS, KEY_BYTES, KEY_DIGITS, MAX_GROUP_VALUE};

/// What a key and its blob are bound to: the policy's 16-byte fscrypt key identifier.
pub type Context = [u8; 16];
