//! `/etc/dirseal/config.toml`: where the keystore lives, the machine's Argon2id cost, PAM policy,
//! where the TPM is.
//! Read with the same root-owned, no-follow rules as the keystore, since PAM trusts it.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::escrow::EscrowConfig;
pub use crate::kdf::{Argon2Params, KdfError, MIN_MEMORY_KIB};
use crate::securefile::{self, SecureFileError};
use crate::tpm2::Tcti;

/// Where every front end reads the config unless told otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/dirseal/config.toml";
pub(crate) const DEFAULT_KEYSTORE_PATH: &str = "/var/lib/dirseal";
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The machine's dirseal settings (`config.toml`, docs/formats.md); missing file = defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Keystore directory; default `/var/lib/dirseal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keystore: Option<PathBuf>,
    /// The Argon2id cost every new password protector gets, calibrated on first use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argon2: Option<Argon2Params>,
    /// `[pam]`: login policy for the PAM module.
    #[serde(default)]
    pub pam: PamConfig,
    /// `[tpm2]`: where the TPM is and how its PIN tries are shared.
    #[serde(default)]
    pub tpm2: Tpm2Config,
    /// `[fido2]`: touch timeout and software authenticators.
    #[serde(default, skip_serializing_if = "Fido2Config::is_default")]
    pub fido2: Fido2Config,
    /// `[escrow]`: recovery keys encrypted to an organisation's public keys (docs/fleet.md).
    #[serde(default, skip_serializing_if = "EscrowConfig::is_default")]
    pub escrow: EscrowConfig,
    /// `[tang]`: directories unlocked at boot by their network (tang) protectors.
    #[serde(default, skip_serializing_if = "TangConfig::is_default")]
    pub tang: TangConfig,
}

/// The `[tang]` section.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TangConfig {
    /// Directories `dirseal unlock --marked` opens with their tang protectors, asking nothing:
    /// what the opt-in `dirseal-unlock-boot.service` runs once the network is up. Only this
    /// root-owned file marks a directory so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unlock_at_boot: Vec<PathBuf>,
}

impl TangConfig {
    fn is_default(&self) -> bool {
        *self == TangConfig::default()
    }
}

/// The `[fido2]` section.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fido2Config {
    /// How long an unlock waits for a touch of the key; default
    /// 30 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) touch_timeout_secs: Option<u64>,
    /// Unix sockets of software authenticators to treat as connected keys (tests, demos). Only
    /// this root-owned file can name one; each must be a socket owned by root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub socket_devices: Vec<PathBuf>,
}

impl Fido2Config {
    fn is_default(&self) -> bool {
        *self == Fido2Config::default()
    }
}

/// The `[tpm2]` section.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tpm2Config {
    /// Where the TPM is (a TCTI string); default `device:/dev/tpmrm0`, the kernel's
    /// resource manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcti: Option<Tcti>,
    /// The last TPM PIN tries, kept for the person at the device: no try is spent from the network
    /// or over D-Bus unless more than this many are left ([`crate::tpm2::PinTries`]), so nobody
    /// elsewhere can lock the owner out of their own device; default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min_local_tries: Option<u32>,
}

/// Tries kept for the device: network logins stop when the TPM has this many left.
pub(crate) const DEFAULT_MIN_LOCAL_TRIES: u32 = 2;

impl Tpm2Config {
    /// The configured TPM location, or the default.
    pub fn tcti(&self) -> Tcti {
        self.tcti.clone().unwrap_or_default()
    }
    /// The configured tries kept for the device, or the default.
    pub fn min_local_tries(&self) -> u32 {
        self.min_local_tries.unwrap_or(DEFAULT_MIN_LOCAL_TRIES)
    }
}

/// The `[pam]` section.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PamConfig {
    /// Let a user log in on the old plaintext home while a conversion of it is in progress.
    #[serde(default)]
    pub allow_login_during_conversion: bool,
    /// PIN-login accounts (docs/pam.md): they log in with their TPM PIN on the `standalone` line,
    /// have no password hash in /etc/shadow, and `passwd` changes their PIN. Set by `dirseal
    /// pin-login enable USER`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pin_login: Vec<String>,
}

/// Why the config could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file was refused (owner, mode, symlink) or could not be read or written.
    #[error("cannot use the config file: {0}")]
    File(#[from] SecureFileError),
    /// The file does not parse, or holds values out of bounds.
    #[error("config file {path} is invalid: {reason}; fix it (see docs/formats.md) or remove it to use defaults")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// What is wrong, in the parser's words.
        reason: String,
    },
}

impl Config {
    /// Loads `path`; a missing file means the defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let bytes = match securefile::read_private(path, MAX_CONFIG_BYTES) {
            Ok(b) => b,
            Err(SecureFileError::NotFound { .. }) => return Ok(Config::default()),
            Err(e) => return Err(e.into()),
        };
        let invalid = |reason: String| ConfigError::Invalid { path: path.to_path_buf(), reason };
        let text = std::str::from_utf8(&bytes).map_err(|_| invalid("not UTF-8".into()))?;
        let c: Config = toml::from_str(text).map_err(|e| invalid(e.message().to_string()))?;
        if let Some(p) = &c.argon2 {
            p.check().map_err(|e| invalid(e.to_string()))?;
        }
        if c.fido2.touch_timeout_secs.is_some_and(|t| !(1..=600).contains(&t)) {
            return Err(invalid("[fido2] touch_timeout_secs must be between 1 and 600".into()));
        }
        if let Some(p) = c.fido2.socket_devices.iter().find(|p| !p.is_absolute()) {
            return Err(invalid(format!("[fido2] socket device {} is not an absolute path", p.display())));
        }
        if let Some(p) = c.tang.unlock_at_boot.iter().find(|p| !p.is_absolute()) {
            return Err(invalid(format!("[tang] unlock_at_boot: {} is not an absolute path", p.display())));
        }
        if let Some(p) = c.escrow.problem() {
            return Err(invalid(p));
        }
        if let Some(k) = &c.keystore {
            if !k.is_absolute() {
                return Err(invalid(format!("keystore path {} is not absolute", k.display())));
            }
        }
        Ok(c)
    }

    /// Writes the config atomically to `path` (root-only), creating its directory if needed.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid { path: path.to_path_buf(), reason };
        let text = toml::to_string(self).map_err(|e| invalid(e.to_string()))?;
        if let Some(dir) = path.parent() {
            securefile::ensure_private_dir(dir)?;
        }
        let body = format!("# dirseal configuration (docs/formats.md). Written by dirseal; edits are kept.\n{text}");
        securefile::write_atomic(path, body.as_bytes())?;
        Ok(())
    }

    pub(crate) fn keystore_path(&self) -> PathBuf {
        self.keystore.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_KEYSTORE_PATH))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_is_default_and_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("etc/config.toml");
        assert_eq!(Config::load(&p).unwrap(), Config::default());
        let c = Config {
            keystore: Some("/x/ks".into()),
            argon2: Some(Argon2Params { time_cost: 3, memory_kib: 4096, parallelism: 2 }),
            pam: PamConfig { allow_login_during_conversion: true, pin_login: vec!["kiosk".into()] },
            tpm2: Tpm2Config {
                tcti: Some("swtpm:host=127.0.0.1,port=2321".parse().unwrap()),
                min_local_tries: Some(3),
            },
            fido2: Fido2Config { touch_timeout_secs: Some(10), socket_devices: vec!["/run/soft.sock".into()] },
            escrow: EscrowConfig {
                recipients: vec![age::x25519::Identity::generate().to_public().to_string().parse().unwrap()],
                dir: Some("/srv/escrow".into()),
                required: true,
            },
            tang: TangConfig { unlock_at_boot: vec!["/srv/lab".into()] },
        };
        c.save(&p).unwrap();
        assert_eq!(Config::load(&p).unwrap(), c);
    }

    #[test]
    fn invalid_configs_are_named() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.toml");
        for bad in [
            "keystore = 3",
            "bogus = 1",
            "keystore = \"rel/path\"",
            "[argon2]\ntime_cost = 0\nmemory_kib = 1\nparallelism = 1",
            "[tpm2]\ntcti = \"nonsense\"",
            "[fido2]\ntouch_timeout_secs = 0",
            "[fido2]\nsocket_devices = [\"rel.sock\"]",
            "[escrow]\nrecipients = [\"age1notakey\"]",
            "[escrow]\nrecipients = [\"ssh-dss AAAAB3NzaC1kc3M\"]",
            "[escrow]\nrequired = true",
            "[escrow]\ndir = \"rel\"\nrecipients = [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIANtin3QKWTgY8VUewknNNNaUswoYBZprtZX+WXH/y8t\"]",
        ] {
            securefile::write_atomic(&p, bad.as_bytes()).unwrap();
            let e = Config::load(&p).unwrap_err();
            assert!(e.to_string().contains("config.toml is invalid"), "{bad}: {e}");
        }
    }
}
