//! Recovery keys: the protector of last resort, typed back from paper years later, possibly on a
//! handheld's on-screen keyboard.
//!
//! Format: 8 groups of 6 digits (`123456-234567-...`). Each group encodes 16 bits of the 128-bit
//! key as `value × 11`, so every group carries its own check: a mistyped digit or two swapped
//! neighbours make that group not a multiple of 11 and the parser names the group before any
//! cryptography runs. Digits alone are easy on any keyboard.
//!
//! The key is 128 bits from the OS CSPRNG. A uniformly random 128-bit secret needs no password
//! stretching: HKDF-SHA256 turns it into a wrapping key, and guessing it costs 2^128 trials
//! whatever the KDF. See docs/recovery-format.md.
#![forbid(unsafe_code)]

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use hkdf::Hkdf;
use sha2::Sha256;
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, Zeroizing};

pub const KEY_BYTES: usize = 16;
pub const GROUPS: usize = 8;
pub const GROUP_DIGITS: usize = 6;
/// The policy (fscrypt key identifier) a key and its blob are bound to.
pub type Context = [u8; 16];

/// A recovery key. Zeroized on drop; no `Debug`; compared in constant time.
pub struct RecoveryKey(Box<[u8; KEY_BYTES]>);

impl Drop for RecoveryKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl PartialEq for RecoveryKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&*other.0).into()
    }
}
impl Eq for RecoveryKey {}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("character {ch:?} (position {position}) is not a digit; a recovery key is 8 groups of 6 digits")]
    NotADigit { ch: char, position: usize },
    #[error("group {group} has {digits} digits instead of 6; check it against the paper")]
    GroupLength { group: usize, digits: usize },
    #[error("a recovery key is 8 groups of 6 digits (48 digits); {digits} digits were typed in {groups} groups")]
    Length { digits: usize, groups: usize },
    #[error("group {group} is wrong (it fails its check digit); retype group {group}")]
    BadGroup { group: usize },
}

impl RecoveryKey {
    pub fn generate() -> RecoveryKey {
        use rand::RngCore;
        let mut k = Box::new([0u8; KEY_BYTES]);
        rand::rngs::OsRng.fill_bytes(&mut *k);
        RecoveryKey(k)
    }

    pub fn from_bytes(b: &[u8; KEY_BYTES]) -> RecoveryKey {
        RecoveryKey(Box::new(*b))
    }

    /// Accepts groups separated by any mix of spaces, dashes, dots or underscores, or 48 digits in
    /// a row. Reports the first problem precisely enough to fix it.
    pub fn parse(input: &str) -> Result<RecoveryKey, ParseError> {
        let is_sep = |c: char| c.is_whitespace() || matches!(c, '-' | '.' | '_' | '\u{2010}'..='\u{2015}');
        let mut groups: Vec<Zeroizing<String>> = Vec::new();
        let mut cur = Zeroizing::new(String::with_capacity(64));
        for (i, ch) in input.trim().chars().enumerate() {
            if is_sep(ch) {
                if !cur.is_empty() {
                    groups.push(std::mem::replace(&mut cur, Zeroizing::new(String::with_capacity(64))));
                }
            } else if ch.is_ascii_digit() {
                cur.push(ch);
            } else {
                return Err(ParseError::NotADigit { ch, position: i + 1 });
            }
        }
        if !cur.is_empty() {
            groups.push(cur);
        }
        let digits: usize = groups.iter().map(|g| g.len()).sum();
        let all: Zeroizing<String> = Zeroizing::new(groups.iter().map(|g| g.as_str()).collect());
        if digits != GROUPS * GROUP_DIGITS {
            // With the right number of groups, name the one that is short or long.
            if groups.len() == GROUPS {
                if let Some((i, g)) = groups.iter().enumerate().find(|(_, g)| g.len() != GROUP_DIGITS) {
                    return Err(ParseError::GroupLength { group: i + 1, digits: g.len() });
                }
            }
            return Err(ParseError::Length { digits, groups: groups.len() });
        }
        let mut key = Box::new([0u8; KEY_BYTES]);
        for g in 0..GROUPS {
            let text = &all[g * GROUP_DIGITS..(g + 1) * GROUP_DIGITS];
            // Invariant: text is 6 ASCII digits, so it parses and fits in u32.
            let v: u32 = text.parse().unwrap_or(u32::MAX);
            if v % 11 != 0 || v / 11 > u32::from(u16::MAX) {
                key.zeroize();
                return Err(ParseError::BadGroup { group: g + 1 });
            }
            let chunk = (v / 11) as u16;
            key[g * 2..g * 2 + 2].copy_from_slice(&chunk.to_be_bytes());
        }
        Ok(RecoveryKey(key))
    }

    /// `123456-234567-...`: the form to print and to type.
    pub fn to_display(&self) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(GROUPS * (GROUP_DIGITS + 1)));
        for g in 0..GROUPS {
            let chunk = u16::from_be_bytes([self.0[g * 2], self.0[g * 2 + 1]]);
            if g > 0 {
                s.push('-');
            }
            let mut digits = Zeroizing::new(format!("{:06}", u32::from(chunk) * 11));
            s.push_str(&digits);
            digits.zeroize();
        }
        s
    }

    fn hkdf(&self, label: &[u8], context: &Context, out: &mut [u8]) {
        let hk = Hkdf::<Sha256>::new(Some(b"dirseal-recovery-v1"), &*self.0);
        let mut info = Vec::with_capacity(label.len() + context.len());
        info.extend_from_slice(label);
        info.extend_from_slice(context);
        // Invariant: HKDF-SHA256 can produce up to 8160 bytes; we ask for 16 or 32.
        hk.expand(&info, out).expect("HKDF output length is small");
    }

    /// The 256-bit wrapping key for the policy `context`.
    fn wrapping_key(&self, context: &Context) -> Zeroizing<[u8; 32]> {
        let mut k = Zeroizing::new([0u8; 32]);
        self.hkdf(b"wrap", context, &mut *k);
        k
    }

    /// A public check value: tells "wrong key" from "corrupted data" without trying to decrypt.
    /// It lets someone holding the blob test guesses offline, which is harmless for 128-bit keys.
    fn check_value(&self, context: &Context) -> [u8; 16] {
        let mut c = [0u8; 16];
        self.hkdf(b"check", context, &mut c);
        c
    }
}

// ---- Sealed blobs ----

pub const MAGIC: &[u8; 4] = b"DSRK";
pub const VERSION: u8 = 1;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
pub const MAX_METADATA: usize = 4096;
pub const MAX_SECRET: usize = 256;
const HEADER: usize = 4 + 1 + 16 + 16 + NONCE_LEN;

/// A parsed blob: structurally valid, not yet authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    context: Context,
    check: [u8; 16],
    nonce: [u8; NONCE_LEN],
    metadata: Vec<u8>,
    ciphertext: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    #[error("the recovery data is truncated ({0} bytes); it is damaged: recovery with it is impossible, create a new recovery key while the directory is unlocked")]
    Truncated(usize),
    #[error("the recovery data is not dirseal recovery data (bad magic); it was overwritten: create a new recovery key while the directory is unlocked")]
    BadMagic,
    #[error("the recovery data has format version {0}, which this dirseal does not read; use a newer dirseal")]
    Version(u8),
    #[error("the recovery data has {0} unexpected trailing bytes; it is damaged: create a new recovery key while the directory is unlocked")]
    Trailing(usize),
    #[error("the recovery data declares a field of {0} bytes, more than any real one; it is damaged")]
    TooLarge(usize),
    #[error("this recovery data belongs to another directory; it cannot open this one")]
    ContextMismatch,
    #[error("this recovery key does not open this directory: check it against the paper, or it belongs to another directory")]
    WrongKey,
    #[error("the recovery data is corrupted (authentication failed although the key is right); create a new recovery key while the directory is unlocked")]
    Corrupt,
}

fn aad(context: &Context, metadata: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(4 + 1 + 16 + metadata.len());
    a.extend_from_slice(MAGIC);
    a.push(VERSION);
    a.extend_from_slice(context);
    a.extend_from_slice(metadata);
    a
}

/// Seals `secret` (≤ 256 bytes; the master key) with metadata (≤ 4096 bytes, authenticated but
/// readable without the key) for the policy `context`.
pub fn seal(key: &RecoveryKey, context: &Context, secret: &[u8], metadata: &[u8]) -> Result<Sealed, BlobError> {
    if secret.len() > MAX_SECRET {
        return Err(BlobError::TooLarge(secret.len()));
    }
    if metadata.len() > MAX_METADATA {
        return Err(BlobError::TooLarge(metadata.len()));
    }
    let nonce: [u8; NONCE_LEN] = rand::random();
    let wk = key.wrapping_key(context);
    let cipher = Aes256Gcm::new(wk.as_slice().into());
    let ciphertext = cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: secret, aad: &aad(context, metadata) })
        // Invariant: AES-GCM only fails beyond 64 GiB of plaintext.
        .expect("AES-GCM sealing of a short secret cannot fail");
    Ok(Sealed { context: *context, check: key.check_value(context), nonce, metadata: metadata.to_vec(), ciphertext })
}

impl Sealed {
    /// Layout: magic(4) version(1) context(16) check(16) nonce(12) meta_len(u16 BE) meta
    /// ct_len(u16 BE) ciphertext+tag.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + 4 + self.metadata.len() + self.ciphertext.len());
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.extend_from_slice(&self.context);
        b.extend_from_slice(&self.check);
        b.extend_from_slice(&self.nonce);
        // Invariant: seal and parse bound both lengths far below u16::MAX.
        b.extend_from_slice(&(self.metadata.len() as u16).to_be_bytes());
        b.extend_from_slice(&self.metadata);
        b.extend_from_slice(&(self.ciphertext.len() as u16).to_be_bytes());
        b.extend_from_slice(&self.ciphertext);
        b
    }

    pub fn parse(b: &[u8]) -> Result<Sealed, BlobError> {
        let truncated = || BlobError::Truncated(b.len());
        if b.len() < 5 {
            return Err(if b.len() >= 4 && &b[..4] != MAGIC { BlobError::BadMagic } else { truncated() });
        }
        if &b[..4] != MAGIC {
            return Err(BlobError::BadMagic);
        }
        if b[4] != VERSION {
            return Err(BlobError::Version(b[4]));
        }
        let mut r = Reader { b, at: 5 };
        let context: Context = r.array().ok_or_else(truncated)?;
        let check: [u8; 16] = r.array().ok_or_else(truncated)?;
        let nonce: [u8; NONCE_LEN] = r.array().ok_or_else(truncated)?;
        let mlen = u16::from_be_bytes(r.array().ok_or_else(truncated)?) as usize;
        if mlen > MAX_METADATA {
            return Err(BlobError::TooLarge(mlen));
        }
        let metadata = r.take(mlen).ok_or_else(truncated)?.to_vec();
        let clen = u16::from_be_bytes(r.array().ok_or_else(truncated)?) as usize;
        if clen > MAX_SECRET + TAG_LEN {
            return Err(BlobError::TooLarge(clen));
        }
        if clen < TAG_LEN {
            return Err(truncated());
        }
        let ciphertext = r.take(clen).ok_or_else(truncated)?.to_vec();
        if r.at != b.len() {
            return Err(BlobError::Trailing(b.len() - r.at));
        }
        Ok(Sealed { context, check, nonce, metadata, ciphertext })
    }

    /// The policy this blob belongs to.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The authenticated (once [`Sealed::open`] succeeds) but unencrypted metadata.
    pub fn metadata(&self) -> &[u8] {
        &self.metadata
    }

    /// Whether `key` is this blob's key, without decrypting.
    pub fn matches(&self, key: &RecoveryKey) -> bool {
        key.check_value(&self.context).ct_eq(&self.check).into()
    }

    /// Opens the blob for the policy `expected` with `key`.
    pub fn open(&self, key: &RecoveryKey, expected: &Context) -> Result<Zeroizing<Vec<u8>>, BlobError> {
        if &self.context != expected {
            return Err(BlobError::ContextMismatch);
        }
        if !self.matches(key) {
            return Err(BlobError::WrongKey);
        }
        let wk = key.wrapping_key(&self.context);
        let cipher = Aes256Gcm::new(wk.as_slice().into());
        cipher
            .decrypt(
                Nonce::from_slice(&self.nonce),
                Payload { msg: &self.ciphertext, aad: &aad(&self.context, &self.metadata) },
            )
            .map(Zeroizing::new)
            .map_err(|_| BlobError::Corrupt)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|s| s.try_into().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key_of(b: [u8; 16]) -> RecoveryKey {
        RecoveryKey::from_bytes(&b)
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(b in any::<[u8; 16]>()) {
            let k = key_of(b);
            let s = k.to_display();
            prop_assert_eq!(s.len(), 8 * 6 + 7);
            prop_assert!(RecoveryKey::parse(&s).unwrap() == k);
            // Separators, spacing and no separators all parse to the same key.
            prop_assert!(RecoveryKey::parse(&s.replace('-', " ")).unwrap() == k);
            prop_assert!(RecoveryKey::parse(&s.replace('-', "")).unwrap() == k);
            let spaced = format!("  {}\n", s.replace('-', " - "));
            prop_assert!(RecoveryKey::parse(&spaced).unwrap() == k);
        }

        #[test]
        fn single_digit_typos_name_their_group(b in any::<[u8; 16]>(), pos in 0usize..48, delta in 1u8..10) {
            let s = key_of(b).to_display().replace('-', "");
            let mut chars: Vec<u8> = s.into_bytes();
            chars[pos] = b'0' + (chars[pos] - b'0' + delta) % 10;
            let typed = String::from_utf8(chars).unwrap();
            match RecoveryKey::parse(&typed) {
                Err(ParseError::BadGroup { group }) => prop_assert_eq!(group, pos / 6 + 1),
                Err(e) => prop_assert!(false, "unexpected error {e}"),
                Ok(_) => prop_assert!(false, "a one-digit typo was accepted"),
            }
        }

        #[test]
        fn adjacent_transpositions_are_caught(b in any::<[u8; 16]>(), g in 0usize..8, i in 0usize..5) {
            let s = key_of(b).to_display().replace('-', "");
            let mut chars: Vec<u8> = s.into_bytes();
            let p = g * 6 + i;
            prop_assume!(chars[p] != chars[p + 1]);
            chars.swap(p, p + 1);
            let typed = String::from_utf8(chars).unwrap();
            prop_assert_eq!(RecoveryKey::parse(&typed).err(), Some(ParseError::BadGroup { group: g + 1 }));
        }

        #[test]
        fn blobs_never_panic_on_garbage(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Sealed::parse(&b);
        }
    }

    #[test]
    fn format_errors_are_specific() {
        let k = RecoveryKey::generate();
        let s = k.to_display().to_string();
        let groups: Vec<&str> = s.split('-').collect();
        assert_eq!(
            RecoveryKey::parse(&groups[..7].join("-")).err(),
            Some(ParseError::Length { digits: 42, groups: 7 })
        );
        let mut short = groups.clone();
        let g3 = &groups[2][..5];
        short[2] = g3;
        assert_eq!(RecoveryKey::parse(&short.join("-")).err(), Some(ParseError::GroupLength { group: 3, digits: 5 }));
        let mut bad = s.clone();
        bad.replace_range(10..11, "x");
        assert_eq!(RecoveryKey::parse(&bad).err(), Some(ParseError::NotADigit { ch: 'x', position: 11 }));
        assert!(matches!(RecoveryKey::parse(""), Err(ParseError::Length { digits: 0, .. })));
        // Group value above 65535 × 11.
        let over = format!("999999-{}", groups[1..].join("-"));
        assert_eq!(RecoveryKey::parse(&over).err(), Some(ParseError::BadGroup { group: 1 }));
        assert!(RecoveryKey::parse("000000-000000-000000-000000-000000-000000-000000-720885").is_ok());
    }

    #[test]
    fn seal_open_and_every_failure() {
        let k = RecoveryKey::generate();
        let ctx = [7u8; 16];
        let secret = [42u8; 64];
        let blob = seal(&k, &ctx, &secret, b"{\"policy\":\"x\"}").unwrap().to_bytes();
        let s = Sealed::parse(&blob).unwrap();
        assert_eq!(&*s.open(&k, &ctx).unwrap(), &secret);
        assert_eq!(s.metadata(), b"{\"policy\":\"x\"}");
        assert_eq!(s.open(&RecoveryKey::generate(), &ctx).unwrap_err(), BlobError::WrongKey);
        assert_eq!(s.open(&k, &[8u8; 16]).unwrap_err(), BlobError::ContextMismatch);

        // Every truncation is refused cleanly.
        for n in 0..blob.len() {
            assert!(Sealed::parse(&blob[..n]).is_err(), "truncated to {n}");
        }
        let mut long = blob.clone();
        long.push(0);
        assert_eq!(Sealed::parse(&long).unwrap_err(), BlobError::Trailing(1));
        // Flipping any byte is detected: at parse, as a wrong key or context, or as corruption.
        for i in 0..blob.len() {
            let mut t = blob.clone();
            t[i] ^= 0x01;
            let r = Sealed::parse(&t).and_then(|s| s.open(&k, &ctx));
            assert!(r.is_err(), "flipping byte {i} went unnoticed");
        }
        let mut t = blob.clone();
        t[4] = 9;
        assert_eq!(Sealed::parse(&t).unwrap_err(), BlobError::Version(9));
        t[0] = b'X';
        assert_eq!(Sealed::parse(&t).unwrap_err(), BlobError::BadMagic);
        // Corrupting the ciphertext with the right key says "corrupt", not "wrong key".
        let mut t = blob.clone();
        let last = t.len() - 1;
        t[last] ^= 0x80;
        assert_eq!(Sealed::parse(&t).unwrap().open(&k, &ctx).unwrap_err(), BlobError::Corrupt);
    }

    #[test]
    fn keys_are_random() {
        assert!(RecoveryKey::generate() != RecoveryKey::generate());
    }
}
