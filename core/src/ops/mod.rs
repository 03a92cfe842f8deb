//! The operations behind every front end: encrypt, unlock, lock, protectors and policies.
//!
//! Every operation that rewrites keystore files holds the keystore lock for its whole
//! read-modify-write, and re-reads the records under it, so two concurrent commands cannot lose
//! each other's changes.
//!
//! One [`Dirseal`], its methods in one file per concern: `protectors.rs` (create, name, change
//! secrets, remove), `policies.rs` (records, encrypt, add and remove protectors), `unlock.rs`
//! (unlock, lock, picking a protector), `login.rs` (login order, PIN-login accounts),
//! `status.rs` (what `status` reports), `recovery.rs` (recovery keys meet the keystore),
//! `errors.rs` ([`OpsError`]).
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::ids::ProtectorId;
use crate::keystore::Keystore;
use crate::protector::NewKind;

mod errors;
mod login;
mod policies;
mod protectors;
mod recovery;
mod status;
mod unlock;

pub use crate::census::ProtectorSummary;
pub use errors::OpsError;
pub use login::{is_tpm_pin, lookup_user, Login};
pub use status::{public_dir_status, DirStatus, FsStatus};
pub use unlock::{BusyProcess, LockReport};

/// Which protector to use when a policy has several.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pick {
    /// The protector to use; `None` lets the operation choose (the only one, or an error listing them).
    pub protector: Option<ProtectorId>,
}

/// How to create a new protector, of any kind.
pub struct NewProtector<'a> {
    /// The new protector's name, shown in listings and prompts.
    pub name: &'a str,
    /// The user it belongs to (whose login it may open), if any.
    pub uid: Option<u32>,
    /// Its kind and that kind's options.
    pub kind: NewKind,
}

/// Where to get the protector for a new policy: an existing one, or a new one.
pub enum ProtectorChoice<'a> {
    /// A protector already in the keystore.
    Existing(ProtectorId),
    /// A protector made for the purpose.
    New(NewProtector<'a>),
}

/// The library's entry point: the keystore and configuration every operation works on.
pub struct Dirseal {
    keystore: Keystore,
    config: Config,
    config_path: PathBuf,
}

impl Dirseal {
    /// Loads the config (missing file = defaults) and opens the keystore it names, unless
    /// `keystore_override` says otherwise.
    pub fn open(config_path: &Path, keystore_override: Option<&Path>) -> Result<Dirseal, OpsError> {
        let config = Config::load(config_path)?;
        let root = keystore_override.map(Path::to_path_buf).unwrap_or_else(|| config.keystore_path());
        let keystore = Keystore::open(&root)?;
        Ok(Dirseal { keystore, config, config_path: config_path.to_path_buf() })
    }

    /// Like [`Dirseal::open`] but creates nothing: for the PAM module and read-only queries, where
    /// a machine without a keystore simply manages no directories.
    pub fn open_existing(config_path: &Path, keystore_override: Option<&Path>) -> Result<Dirseal, OpsError> {
        let config = Config::load(config_path)?;
        let root = keystore_override.map(Path::to_path_buf).unwrap_or_else(|| config.keystore_path());
        let keystore = Keystore::open_existing(&root)?;
        Ok(Dirseal { keystore, config, config_path: config_path.to_path_buf() })
    }

    /// The keystore this instance works on.
    pub fn keystore(&self) -> &Keystore {
        &self.keystore
    }

    /// The configuration loaded at open.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where the configuration was loaded from (and is saved to when an operation changes it).
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }
}
