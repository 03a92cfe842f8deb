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
use std::borrow::Cow;
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
mod undo;
mod unlock;

pub use crate::census::ProtectorSummary;
pub use errors::OpsError;
pub use login::{lookup_user, opens_pin_login, opens_touch_login, Login};
pub use recovery::Escrowed;
pub use status::{public_dir_status, DirStatus, FsStatus, PortableDir};
pub(crate) use undo::Undo;
pub use unlock::{BusyProcess, LockReport, Marked};

/// Which protector to use when a policy has several.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pick {
    /// The protector to use; `None` lets the operation choose (the only one, or an error listing them).
    pub protector: Option<ProtectorId>,
}

/// How to create a new protector, of any kind. Front ends make one with [`NewProtector::for_dir`]
/// or [`NewProtector::for_user`], so every one names and owns it by the same rule.
pub struct NewProtector<'a> {
    /// The new protector's name, shown in listings and prompts.
    pub name: Cow<'a, str>,
    /// The user it belongs to (whose login it may open), if any.
    pub uid: Option<u32>,
    /// Its kind and that kind's options.
    pub kind: NewKind,
}

impl<'a> NewProtector<'a> {
    /// A new protector for `dir`: it belongs to `user` when the front end says whose it is (a
    /// `--user`, a service caller acting for themselves), else to the directory's owner unless
    /// that is root (a converted home's password is its owner's, which PAM later matches by uid);
    /// named as [`NewProtector::for_user`] says.
    pub fn for_dir(
        dir: &Path,
        user: Option<u32>,
        kind: NewKind,
        name: Option<impl Into<Cow<'a, str>>>,
    ) -> NewProtector<'a> {
        use std::os::unix::fs::MetadataExt;
        let owner = || std::fs::symlink_metadata(dir).ok().map(|m| m.uid()).filter(|&uid| uid != 0);
        NewProtector::for_user(user.or_else(owner), kind, name)
    }

    /// A new protector belonging to `user` (if anyone), named `name` if given, else after its
    /// user: their login name, or "uid N" for a uid without a passwd entry (from another system, a
    /// container: still someone, and not a misleading kind name), else after its kind.
    pub fn for_user(user: Option<u32>, kind: NewKind, name: Option<impl Into<Cow<'a, str>>>) -> NewProtector<'a> {
        let name = match (name, user) {
            (Some(n), _) => n.into(),
            (None, Some(uid)) => Cow::Owned(crate::account::user_name(uid)),
            (None, None) => Cow::Borrowed(kind.name()),
        };
        NewProtector { name, uid: user, kind }
    }
}

/// Where to get the protector for a new policy: an existing one, or a new one.
pub enum ProtectorChoice<'a> {
    /// A protector already in the keystore.
    Existing(ProtectorId),
    /// A protector made for the purpose.
    New(NewProtector<'a>),
}

impl ProtectorChoice<'_> {
    /// The protector this choice names for a run that makes none (resuming a conversion, which
    /// reloads its staging key): the existing one, or — for a new one — none, which lets the
    /// operation take the policy's only one.
    pub fn pick(&self) -> Pick {
        match self {
            ProtectorChoice::Existing(id) => Pick { protector: Some(*id) },
            ProtectorChoice::New(_) => Pick::default(),
        }
    }
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
