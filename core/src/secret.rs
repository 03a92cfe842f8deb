//! Secrets: zeroized on drop, no `Debug`, compared in constant time.
//!
//! Nothing here derives `Debug`, `Clone` or `Serialize`, so a secret cannot reach a log line, a
//! panic message or a JSON file by accident. Copies are explicit (`duplicate`).
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, Zeroizing};

/// Size of an fscrypt v2 master key we generate (the kernel accepts 16..=64; we use the maximum).
pub(crate) const MASTER_KEY_LEN: usize = 64;
/// Size of a protector key: the AES-256-GCM key that wraps master keys.
pub(crate) const PROTECTOR_KEY_LEN: usize = 32;

macro_rules! fixed_secret {
    ($(#[$m:meta])* $t:ident, $n:expr) => {
        $(#[$m])*
        pub struct $t(Box<[u8; $n]>);

        impl $t {
            /// Fresh key from the OS CSPRNG.
            pub fn random() -> Self {
                let mut k = Box::new([0u8; $n]);
                rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut k[..]);
                $t(k)
            }
            /// Takes the bytes; the caller's slice should itself be zeroizing.
            pub fn from_slice(b: &[u8]) -> Option<Self> {
                let arr: [u8; $n] = b.try_into().ok()?;
                let k = Box::new(arr);
                // The stack copy `arr` is Copy; scrub what we can.
                let mut arr = arr;
                arr.zeroize();
                Some($t(k))
            }
            pub fn as_bytes(&self) -> &[u8; $n] {
                &self.0
            }
            /// An explicit copy, because secrets are deliberately not `Clone`.
            pub fn duplicate(&self) -> Self {
                $t(Box::new(*self.0))
            }
        }
        impl Drop for $t {
            fn drop(&mut self) {
                self.0.zeroize();
            }
        }
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.0[..].ct_eq(&other.0[..]).into()
            }
        }
        impl Eq for $t {}
    };
}

fixed_secret!(
    /// An fscrypt master key: what the kernel needs to unlock a directory.
    MasterKey,
    MASTER_KEY_LEN
);
fixed_secret!(
    /// A protector's key: unwraps the master keys of every policy the protector opens.
    ProtectorKey,
    PROTECTOR_KEY_LEN
);

/// A secret the user typed or a token produced: a password, a PIN, a recovery key.
pub struct Passphrase(Zeroizing<Vec<u8>>);

impl Passphrase {
    pub fn new(bytes: Zeroizing<Vec<u8>>) -> Self {
        Passphrase(bytes)
    }
    pub fn from_str_copy(s: &str) -> Self {
        Passphrase(Zeroizing::new(s.as_bytes().to_vec()))
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn duplicate(&self) -> Self {
        Passphrase(Zeroizing::new(self.0.to_vec()))
    }
}

impl PartialEq for Passphrase {
    fn eq(&self, other: &Self) -> bool {
        // Length is not secret enough to hide; contents are compared in constant time.
        self.0.len() == other.0.len() && bool::from(self.0.ct_eq(&other.0))
    }
}
impl Eq for Passphrase {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_keys_differ_and_compare() {
        let a = MasterKey::random();
        let b = MasterKey::random();
        assert!(a != b);
        assert!(a == a.duplicate());
        assert!(MasterKey::from_slice(&[0u8; 10]).is_none());
        let p = Passphrase::from_str_copy("pw");
        assert!(p == p.duplicate());
        assert!(p != Passphrase::from_str_copy("pX"));
        assert!(p != Passphrase::from_str_copy("pw2"));
    }
}
