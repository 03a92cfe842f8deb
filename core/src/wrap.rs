//! Key wrapping: AES-256-GCM with a fresh random nonce and associated data that names what the
//! wrapped key is and where it belongs, so a wrapped key copied into another file or slot fails
//! to open instead of silently working there.
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

pub(crate) const NONCE_LEN: usize = 12;
pub(crate) const TAG_LEN: usize = 16;

/// A 256-bit key-encryption key (derived from a password, a protector key, or a recovery key).
pub(crate) struct Kek(Box<[u8; 32]>);

impl Kek {
    #[cfg(test)]
    pub(crate) fn new(bytes: [u8; 32]) -> Kek {
        let mut bytes = Zeroizing::new(bytes);
        Kek(Box::new(std::mem::take(&mut *bytes)))
    }
    pub(crate) fn from_slice(b: &[u8; 32]) -> Kek {
        Kek(Box::new(*b))
    }
    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(self.0.as_slice().into())
    }
}

impl Drop for Kek {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut *self.0);
    }
}

/// A wrapped secret as stored in keystore files (hex in JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wrapped {
    #[serde(with = "hex_array")]
    pub(crate) nonce: [u8; NONCE_LEN],
    #[serde(with = "hex::serde")]
    pub(crate) ciphertext: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum WrapError {
    /// Wrong key, or the data or its associated data were altered: GCM cannot tell these apart.
    #[error("authentication failed")]
    Authentication,
    #[error("wrapped key has {got} bytes, expected {expected}")]
    Length { expected: usize, got: usize },
}

pub(crate) fn seal(kek: &Kek, aad: &[u8], plaintext: &[u8]) -> Wrapped {
    let nonce: [u8; NONCE_LEN] = rand::random();
    let ciphertext = kek
        .cipher()
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad })
        // Invariant: AES-GCM encryption only fails for messages beyond 64 GiB; ours are ≤ 64 bytes.
        .expect("AES-GCM encryption of a short key cannot fail");
    Wrapped { nonce, ciphertext }
}

/// Opens `w`, requiring the plaintext to be exactly `len` bytes.
pub(crate) fn open(kek: &Kek, aad: &[u8], w: &Wrapped, len: usize) -> Result<Zeroizing<Vec<u8>>, WrapError> {
    if w.ciphertext.len() != len + TAG_LEN {
        return Err(WrapError::Length { expected: len + TAG_LEN, got: w.ciphertext.len() });
    }
    kek.cipher()
        .decrypt(Nonce::from_slice(&w.nonce), Payload { msg: &w.ciphertext, aad })
        .map(Zeroizing::new)
        .map_err(|_| WrapError::Authentication)
}

mod hex_array {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer, const N: usize>(v: &[u8; N], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>, const N: usize>(d: D) -> Result<[u8; N], D::Error> {
        let s = String::deserialize(d)?;
        let mut out = [0u8; N];
        hex::decode_to_slice(&s, &mut out).map_err(serde::de::Error::custom)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_and_binding() {
        let k = Kek::new(rand::random());
        let w = seal(&k, b"ctx-a", &[7u8; 32]);
        assert_eq!(&*open(&k, b"ctx-a", &w, 32).unwrap(), &[7u8; 32]);
        assert_eq!(open(&k, b"ctx-b", &w, 32).unwrap_err(), WrapError::Authentication);
        let other = Kek::new(rand::random());
        assert_eq!(open(&other, b"ctx-a", &w, 32).unwrap_err(), WrapError::Authentication);
        let mut t = w.clone();
        t.ciphertext[3] ^= 1;
        assert_eq!(open(&k, b"ctx-a", &t, 32).unwrap_err(), WrapError::Authentication);
        assert!(matches!(open(&k, b"ctx-a", &w, 64), Err(WrapError::Length { .. })));
        let w2 = seal(&k, b"ctx-a", &[7u8; 32]);
        assert_ne!(w.nonce, w2.nonce, "nonces must be fresh");
        let json = serde_json::to_string(&w).unwrap();
        assert_eq!(serde_json::from_str::<Wrapped>(&json).unwrap(), w);
    }
}
