//! Argon2id password stretching, with a cost calibrated once per machine.
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::secret::Passphrase;
use crate::wrap::Kek;

/// The least memory a protector may use: below this Argon2id is no longer memory-hard in any
/// useful sense. Tests use it to stay fast.
pub const MIN_MEMORY_KIB: u32 = 1024;
/// Upper bounds that keep a tampered file from making every unlock take hours or exhaust memory.
pub(crate) const MAX_MEMORY_KIB: u32 = 4 * 1024 * 1024;
pub(crate) const MAX_TIME_COST: u32 = 1000;
pub(crate) const MAX_PARALLELISM: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Argon2Params {
    pub time_cost: u32,
    pub memory_kib: u32,
    pub parallelism: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum KdfError {
    #[error("Argon2id parameters out of range (time {time_cost}, memory {memory_kib} KiB, lanes {parallelism}); allowed: time 1..={MAX_TIME_COST}, memory {MIN_MEMORY_KIB}..={MAX_MEMORY_KIB} KiB, lanes 1..={MAX_PARALLELISM}")]
    Params { time_cost: u32, memory_kib: u32, parallelism: u32 },
    #[error("Argon2id failed: {0}")]
    Argon2(String),
}

impl Argon2Params {
    pub(crate) fn check(&self) -> Result<(), KdfError> {
        let ok = (1..=MAX_TIME_COST).contains(&self.time_cost)
            && (MIN_MEMORY_KIB..=MAX_MEMORY_KIB).contains(&self.memory_kib)
            && (1..=MAX_PARALLELISM).contains(&self.parallelism)
            && self.memory_kib >= 8 * self.parallelism;
        if ok {
            Ok(())
        } else {
            Err(KdfError::Params {
                time_cost: self.time_cost,
                memory_kib: self.memory_kib,
                parallelism: self.parallelism,
            })
        }
    }
}

/// Stretches `password` with `salt` into a 256-bit key-encryption key.
pub(crate) fn derive(password: &Passphrase, salt: &[u8], p: Argon2Params) -> Result<Kek, KdfError> {
    Ok(Kek::from_slice(&*derive_bytes(password, salt, p)?))
}

/// Stretches `password` with `salt` into 32 bytes, for uses that are not a [`Kek`] (a TPM authValue).
pub(crate) fn derive_bytes(
    password: &Passphrase,
    salt: &[u8],
    p: Argon2Params,
) -> Result<Zeroizing<[u8; 32]>, KdfError> {
    p.check()?;
    let params = argon2::Params::new(p.memory_kib, p.time_cost, p.parallelism, Some(32))
        .map_err(|e| KdfError::Argon2(e.to_string()))?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = Zeroizing::new([0u8; 32]);
    a.hash_password_into(password.as_bytes(), salt, out.as_mut_slice()).map_err(|e| KdfError::Argon2(e.to_string()))?;
    Ok(out)
}

/// min(RAM/8, 256 MiB), never below [`MIN_MEMORY_KIB`]: enough to hurt GPUs, small enough for a
/// handheld that also runs a game.
pub(crate) fn memory_cap_kib() -> u32 {
    let ram_kib = nix::sys::sysinfo::sysinfo().map(|s| s.ram_total() / 1024).unwrap_or(2 * 1024 * 1024);
    (ram_kib / 8).min(256 * 1024).max(u64::from(MIN_MEMORY_KIB)) as u32
}

fn lanes() -> u32 {
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1).clamp(1, 4)
}

/// The time cost that makes one derivation take about `target` with `memory_kib` on this machine.
pub(crate) fn calibrate(target: Duration, memory_kib: u32) -> Argon2Params {
    let memory_kib = memory_kib.clamp(MIN_MEMORY_KIB, MAX_MEMORY_KIB);
    let mut p = Argon2Params { time_cost: 1, memory_kib, parallelism: lanes() };
    let pw = Passphrase::from_str_copy("calibration");
    let salt = [0u8; 16];
    let start = Instant::now();
    // Invariant: the params were clamped into range above, so derivation cannot fail.
    let _ = derive(&pw, &salt, p);
    let one = start.elapsed().max(Duration::from_micros(100));
    let t = (target.as_secs_f64() / one.as_secs_f64()).floor() as u32;
    p.time_cost = t.clamp(1, MAX_TIME_COST);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derive_is_deterministic_and_salted() {
        let p = Argon2Params { time_cost: 1, memory_kib: MIN_MEMORY_KIB, parallelism: 1 };
        let pw = Passphrase::from_str_copy("pw");
        let w = |k: &Kek| crate::wrap::seal(k, b"", b"x");
        let a = derive(&pw, b"0123456789abcdef", p).unwrap();
        let b = derive(&pw, b"0123456789abcdef", p).unwrap();
        let c = derive(&pw, b"0123456789abcdeX", p).unwrap();
        let sealed = w(&a);
        assert!(crate::wrap::open(&b, b"", &sealed, 1).is_ok());
        assert!(crate::wrap::open(&c, b"", &sealed, 1).is_err());
    }

    #[test]
    fn rejects_absurd_params() {
        let pw = Passphrase::from_str_copy("pw");
        for p in [
            Argon2Params { time_cost: 0, memory_kib: MIN_MEMORY_KIB, parallelism: 1 },
            Argon2Params { time_cost: 1, memory_kib: 8, parallelism: 1 },
            Argon2Params { time_cost: 1, memory_kib: u32::MAX, parallelism: 1 },
            Argon2Params { time_cost: 1, memory_kib: MIN_MEMORY_KIB, parallelism: 0 },
        ] {
            assert!(matches!(derive(&pw, b"0123456789abcdef", p), Err(KdfError::Params { .. })));
        }
    }

    #[test]
    fn calibrate_gives_valid_params() {
        let p = calibrate(Duration::from_millis(20), MIN_MEMORY_KIB);
        p.check().unwrap();
        assert!(memory_cap_kib() >= MIN_MEMORY_KIB && memory_cap_kib() <= 256 * 1024);
    }
}
