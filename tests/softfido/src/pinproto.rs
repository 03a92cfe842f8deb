//! PIN/UV auth protocols 1 and 2 (CTAP 2.1 §6.5.6, §6.5.7): the ECDH-derived shared secret, its
//! encrypt/decrypt (AES-256-CBC) and authenticate (HMAC-SHA-256, truncated to 16 bytes in v1).
use aes::cipher::{block_padding::NoPadding, BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use hmac::{Hmac, Mac};
use p256::elliptic_curve::sec1::ToEncodedPoint;
use sha2::{Digest, Sha256};

type Enc = cbc::Encryptor<aes::Aes256>;
type Dec = cbc::Decryptor<aes::Aes256>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    One,
    Two,
}

impl Proto {
    pub fn from_u64(v: u64) -> Option<Proto> {
        match v {
            1 => Some(Proto::One),
            2 => Some(Proto::Two),
            _ => None,
        }
    }
    pub fn number(self) -> u8 {
        match self {
            Proto::One => 1,
            Proto::Two => 2,
        }
    }

    /// The shared secret from the ECDH x-coordinate: v1 = SHA-256(Z) (32 bytes, both keys);
    /// v2 = HKDF "CTAP2 HMAC key" || HKDF "CTAP2 AES key" (64 bytes).
    pub fn kdf(self, z: &[u8]) -> Vec<u8> {
        match self {
            Proto::One => Sha256::digest(z).to_vec(),
            Proto::Two => {
                let hk = hkdf::Hkdf::<Sha256>::new(Some(&[0u8; 32]), z);
                let mut out = vec![0u8; 64];
                // Invariant: 32-byte outputs are far below HKDF-SHA-256's 8160-byte limit.
                hk.expand(b"CTAP2 HMAC key", &mut out[..32]).expect("short HKDF output");
                hk.expand(b"CTAP2 AES key", &mut out[32..]).expect("short HKDF output");
                out
            }
        }
    }

    fn aes_key(self, key: &[u8]) -> &[u8] {
        match self {
            Proto::One => key,
            Proto::Two if key.len() == 64 => &key[32..],
            Proto::Two => key,
        }
    }

    fn hmac_key(self, key: &[u8]) -> &[u8] {
        if key.len() == 64 {
            &key[..32]
        } else {
            key
        }
    }

    pub fn encrypt(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        let (iv, prefix) = match self {
            Proto::One => ([0u8; 16], false),
            Proto::Two => (rand::random(), true),
        };
        let ct = Enc::new_from_slices(self.aes_key(key), &iv)
            .expect("32-byte key, 16-byte IV")
            .encrypt_padded_vec_mut::<NoPadding>(data);
        if prefix {
            [&iv[..], &ct].concat()
        } else {
            ct
        }
    }

    pub fn decrypt(self, key: &[u8], data: &[u8]) -> Option<Vec<u8>> {
        let (iv, ct) = match self {
            Proto::One => ([0u8; 16], data),
            Proto::Two => {
                if data.len() < 16 {
                    return None;
                }
                (data[..16].try_into().ok()?, &data[16..])
            }
        };
        if ct.len() % 16 != 0 {
            return None;
        }
        Dec::new_from_slices(self.aes_key(key), &iv).ok()?.decrypt_padded_vec_mut::<NoPadding>(ct).ok()
    }

    pub fn authenticate(self, key: &[u8], msg: &[u8]) -> Vec<u8> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(self.hmac_key(key)).expect("HMAC takes any key");
        m.update(msg);
        let tag = m.finalize().into_bytes();
        match self {
            Proto::One => tag[..16].to_vec(),
            Proto::Two => tag.to_vec(),
        }
    }

    /// Constant-time check of a pinUvAuthParam.
    pub fn verify(self, key: &[u8], msg: &[u8], param: &[u8]) -> bool {
        let want = self.authenticate(key, msg);
        want.len() == param.len() && want.iter().zip(param).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// x || y of a public key, for a COSE EC2 map.
pub fn xy(pk: &p256::PublicKey) -> (Vec<u8>, Vec<u8>) {
    let pt = pk.to_encoded_point(false);
    // Invariant: an uncompressed point of a valid public key has both coordinates.
    (pt.x().expect("uncompressed").to_vec(), pt.y().expect("uncompressed").to_vec())
}

pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key");
    m.update(msg);
    m.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_lengths() {
        for p in [Proto::One, Proto::Two] {
            let k = p.kdf(&[7u8; 32]);
            assert_eq!(k.len(), if p == Proto::One { 32 } else { 64 });
            let ct = p.encrypt(&k, &[1u8; 64]);
            assert_eq!(ct.len(), if p == Proto::One { 64 } else { 80 });
            assert_eq!(p.decrypt(&k, &ct).unwrap(), vec![1u8; 64]);
            let tag = p.authenticate(&k, b"msg");
            assert!(p.verify(&k, b"msg", &tag));
            assert!(!p.verify(&k, b"msh", &tag));
            assert!(p.decrypt(&k, &ct[..ct.len() - 1]).is_none());
        }
    }
}
