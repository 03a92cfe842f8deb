//! Identifiers shared by the kernel layer and the keystore.
use std::fmt;
use std::str::FromStr;

/// An fscrypt v2 master key identifier: HKDF-SHA512 of the master key, as the kernel computes it.
/// Also the id of a policy in the keystore, so a policy file names the kernel key it unlocks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyIdentifier(pub [u8; 16]);

/// A protector's id: 8 random bytes, shown as 16 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtectorId(pub [u8; 8]);

/// Why a string is not an id.
#[derive(Debug, thiserror::Error)]
#[error("{what} must be {digits} hexadecimal digits, got {got:?}")]
pub struct BadId {
    what: &'static str,
    digits: usize,
    got: String,
}

fn parse_hex<const N: usize>(s: &str, what: &'static str) -> Result<[u8; N], BadId> {
    let bad = || BadId { what, digits: N * 2, got: s.chars().take(80).collect() };
    if s.len() != N * 2 {
        return Err(bad());
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).map_err(|_| bad())?;
    Ok(out)
}

macro_rules! hex_id {
    ($t:ident, $n:expr, $what:expr) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex::encode(self.0))
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($t), self)
            }
        }
        impl FromStr for $t {
            type Err = BadId;
            fn from_str(s: &str) -> Result<Self, BadId> {
                parse_hex::<$n>(s, $what).map($t)
            }
        }
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.to_string())
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

hex_id!(KeyIdentifier, 16, "a key identifier");
hex_id!(ProtectorId, 8, "a protector id");

impl ProtectorId {
    pub(crate) fn random() -> ProtectorId {
        ProtectorId(rand::random())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_reject_garbage() {
        let id = ProtectorId([1, 2, 3, 4, 5, 6, 7, 0xff]);
        assert_eq!(id.to_string(), "01020304050607ff");
        assert_eq!("01020304050607ff".parse::<ProtectorId>().unwrap(), id);
        assert!("0102".parse::<ProtectorId>().is_err());
        assert!("zz020304050607ff".parse::<ProtectorId>().is_err());
        assert!("01020304050607ff00112233445566778".parse::<KeyIdentifier>().is_err());
        let k: KeyIdentifier = "000102030405060708090a0b0c0d0e0f".parse().unwrap();
        assert_eq!(serde_json::to_string(&k).unwrap(), "\"000102030405060708090a0b0c0d0e0f\"");
    }
}
