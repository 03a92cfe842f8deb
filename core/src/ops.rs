//! The operations behind every front end: encrypt, unlock, lock, protectors and policies.
//!
//! Every operation that rewrites keystore files holds the keystore lock for its whole
//! read-modify-write, and re-reads the records under it, so two concurrent commands cannot lose
//! each other's changes.
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::{Config, ConfigError};
use crate::fscrypt::{self, FscryptError, KeyStatus};
use crate::ids::{KeyIdentifier, ProtectorId};
use crate::keystore::{Keystore, KeystoreError, PolicyRecord};
use crate::portable;
use crate::protector::{self, NewKind, ProtectorError, ProtectorRecord, UnlockError};
use crate::recovery::{self, RecoveryError};
use crate::secret::{MasterKey, Passphrase, ProtectorKey};
use crate::ui::{Ui, UiError};

/// Why an operation failed; each names the directory, policy or protector concerned.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The kernel's fscrypt API refused or failed.
    #[error(transparent)]
    Fscrypt(#[from] FscryptError),
    /// The keystore could not be read or changed.
    #[error(transparent)]
    Keystore(#[from] KeystoreError),
    /// The configuration could not be read or saved.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Ui could not ask, or the person cancelled.
    #[error(transparent)]
    Ui(#[from] UiError),
    /// A protector could not be made, opened or changed.
    #[error(transparent)]
    Protector(#[from] ProtectorError),
    /// A recovery key could not be made, read or used.
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    /// An operation that needs an encrypted directory was given a plain one.
    #[error("{path} is not encrypted")]
    NotEncrypted {
        /// The directory.
        path: PathBuf,
    },
    /// The directory is encrypted with a key the keystore has no policy for.
    #[error(
        "{path} is encrypted with key {id}, but the keystore has no policy for it; its recovery key can restore one"
    )]
    NotManaged {
        /// The directory.
        path: PathBuf,
        /// Its key identifier.
        id: KeyIdentifier,
    },
    /// Direct encryption needs an empty directory; one with data is converted instead.
    #[error("{path} is not empty; only an empty directory is encrypted directly, one that holds data is converted")]
    NotEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// The directory already has an encryption policy.
    #[error("{path} is already encrypted (key {id})")]
    AlreadyEncrypted {
        /// The directory.
        path: PathBuf,
        /// Its key identifier.
        id: KeyIdentifier,
    },
    /// The path cannot be used as the directory asked for (missing, not a directory, wrong filesystem).
    #[error("{path}: {reason}")]
    BadDirectory {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Several protectors could be used and none was picked.
    #[error("{what} has several protectors ({list}); choose the one to use")]
    AmbiguousProtector {
        /// What is to be opened.
        what: String,
        /// Its protectors, as `id (name)`, for the message.
        list: String,
    },
    /// Nothing opens the policy: it lists no protector the keystore has.
    #[error("{what} has no usable protector")]
    NoProtector {
        /// What is to be opened.
        what: String,
    },
    /// The policy's protectors exist, but none of their records can be used (unreadable, corrupt).
    #[error("{what} has no usable protector: {problems}")]
    Unusable {
        /// What is to be opened.
        what: String,
        /// What is wrong with each record, for the message.
        problems: String,
    },
    /// The protector picked is not one of the policy's.
    #[error("protector {id} does not protect {what}; its protectors are: {list}")]
    NotAProtectorOf {
        /// The protector picked.
        id: ProtectorId,
        /// What is to be opened.
        what: String,
        /// The policy's protectors, for the message.
        list: String,
    },
    /// An unwrapped master key does not have the policy's identifier: the record was swapped or altered.
    #[error("the key unwrapped for policy {policy} has identifier {got}: the keystore entry does not belong to this directory and was refused; restore the keystore from a backup or restore the policy with the directory's recovery key")]
    KeyMismatch {
        /// The policy.
        policy: KeyIdentifier,
        /// The identifier of the key it unwrapped to.
        got: KeyIdentifier,
    },
    /// No account has that name or uid.
    #[error("no user named {0:?}; pass an existing user name or numeric uid")]
    NoSuchUser(String),
    /// The protector to add is already on the policy.
    #[error("protector {0} already protects this policy")]
    AlreadyProtects(ProtectorId),
    /// A user asked to open something none of their own protectors opens.
    #[error("no protector of uid {uid} opens {what}")]
    NoneOfYours {
        /// The user.
        uid: u32,
        /// What is to be opened.
        what: String,
    },
    /// Several of the user's protectors open it and none was named.
    #[error("several protectors of uid {uid} open {what} ({list}); name one")]
    SeveralOfYours {
        /// The user.
        uid: u32,
        /// What is to be opened.
        what: String,
        /// Those protectors, for the message.
        list: String,
    },
    /// A protector name matches several protectors where it was looked up.
    #[error("{name:?} names several protectors {scope} ({list}); name one by its id")]
    NameAmbiguous {
        /// The name given.
        name: String,
        /// Where it was looked up: "of uid 1000", "that open /home/alice", "in the keystore".
        scope: String,
        /// The protectors it matches, for the message.
        list: String,
    },
    /// No protector has that name where it was looked up.
    #[error("no protector named {name:?} {scope}")]
    NoSuchName {
        /// The name given.
        name: String,
        /// Where it was looked up: "of uid 1000", "that open /home/alice", "in the keystore".
        scope: String,
    },
    /// The user's secret opened none of their protectors.
    #[error("the secret opens none of the protectors of uid {uid} for {what} ({list})")]
    OpensNone {
        /// The user.
        uid: u32,
        /// What was to be opened.
        what: String,
        /// The protectors tried, for the message.
        list: String,
    },
    /// A TPM PIN equal to the login password would be testable offline against /etc/shadow.
    #[error(
        "the PIN is {user}'s login password: /etc/shadow holds a hash of it, against which anyone with the disk can \
         test PINs offline without the TPM counting them; choose another PIN, or log {user} in with the PIN alone \
         (a PIN-login account, docs/pam.md)"
    )]
    PinIsLoginPassword {
        /// The account.
        user: String,
    },
    /// PIN login was asked for an account whose home no TPM PIN protector of theirs opens.
    #[error("{user} has no TPM protector with a PIN of their own on {}; create one first (docs/pam.md: PIN login)", .home.display())]
    NoPinProtector {
        /// The account.
        user: String,
        /// Its home directory.
        home: PathBuf,
    },
    /// The account could not be looked up in the password database.
    #[error(transparent)]
    Account(#[from] crate::account::AccountError),
    /// A device-bound protector cannot open now (PCRs changed, TPM locked out); the others can.
    #[error("{source}; {} still opens with {}", .dir.display(), alternatives(.others, *.recovery))]
    UseAnother {
        /// The protector's own error.
        source: ProtectorError,
        /// The directory to open.
        dir: PathBuf,
        /// The protectors that may still open it.
        others: Vec<ProtectorSummary>,
        /// Whether it has a recovery key too.
        recovery: bool,
    },
    /// A portable directory's protector must open on any machine; this one is bound to this one.
    #[error(
        "protector {name} is a {kind} protector, bound to this machine, and a portable directory must open on any \
         machine: protect it with a password or a security key (fido2), then add the {kind} protector as an extra, \
         local one"
    )]
    StaysOnMachine {
        /// The protector's name.
        name: String,
        /// Its kind.
        kind: &'static str,
    },
    /// Removing the protector would leave a portable directory no protector that opens it elsewhere.
    #[error(
        "policy {policy} is portable and protector {protector} is the last one that opens it on other machines; \
         add another password or security key protector first"
    )]
    LastTravelling {
        /// The policy.
        policy: KeyIdentifier,
        /// The protector asked to be removed.
        protector: ProtectorId,
    },
}

/// The one record of `found` (those named `named`, looked up `scope`), or the error that says
/// there are none or several.
fn one_named(named: &str, found: Vec<ProtectorRecord>, scope: String) -> Result<ProtectorRecord, OpsError> {
    let name = named.to_string();
    match <[ProtectorRecord; 1]>::try_from(found) {
        Ok([one]) => Ok(one),
        Err(found) if found.is_empty() => Err(OpsError::NoSuchName { name, scope }),
        Err(found) => Err(OpsError::NameAmbiguous { name, scope, list: listed(&found) }),
    }
}

/// Protectors as errors list them: id (name), comma-separated.
fn listed(list: &[ProtectorRecord]) -> String {
    list.iter().map(|r| format!("{} ({})", r.id, r.name)).collect::<Vec<_>>().join(", ")
}

/// What else opens a directory, for [`OpsError::UseAnother`]: each front end says how to use them.
fn alternatives(others: &[ProtectorSummary], recovery: bool) -> String {
    let mut out: Vec<String> = others.iter().map(|r| format!("protector {} ({}, {})", r.name, r.kind, r.id)).collect();
    if recovery {
        out.push("its recovery key".into());
    }
    if out.is_empty() {
        out.push("nothing else: it has no other protector and no recovery key".into());
    }
    out.join("; ")
}

impl From<UnlockError> for OpsError {
    fn from(e: UnlockError) -> OpsError {
        match e {
            UnlockError::Ui(e) => e.into(),
            UnlockError::Protector(e) => e.into(),
        }
    }
}

/// A protector as shown to users and front ends.
#[derive(Clone, Debug, Serialize)]
pub struct ProtectorSummary {
    /// Its id.
    pub id: ProtectorId,
    /// Its name.
    pub name: String,
    /// Its kind's name, one of [`protector::KIND_NAMES`].
    pub kind: &'static str,
    /// The user it belongs to, if any.
    pub uid: Option<u32>,
    /// Where its record is: "keystore" (this machine's; opens here only when the kind is bound to
    /// the machine) or "medium" (a portable directory's, opens on any machine).
    pub stored: &'static str,
}

impl ProtectorSummary {
    /// The summary of a record in this machine's keystore.
    pub fn of(r: &ProtectorRecord) -> Self {
        ProtectorSummary { id: r.id, name: r.name.clone(), kind: r.kind.name(), uid: r.uid, stored: "keystore" }
    }
}

/// What `dirseal status DIR` reports.
#[derive(Clone, Debug, Serialize)]
pub struct DirStatus {
    /// The path asked about.
    pub path: PathBuf,
    /// The top of the encrypted tree the path belongs to (its highest ancestor on the
    /// same filesystem with the same policy).
    pub encrypted_root: Option<PathBuf>,
    /// Whether the path has an fscrypt policy.
    pub encrypted: bool,
    /// The key identifier of that policy.
    pub policy: Option<KeyIdentifier>,
    /// "unlocked", "locked", or "partially-locked" (files were busy at lock time).
    pub key: Option<&'static str>,
    /// Whether the keystore has a policy record for that key.
    pub managed: bool,
    /// For a portable directory, the directory on its medium that holds its records.
    pub portable: Option<PathBuf>,
    /// Protectors of a portable directory kept on another machine (a TPM protector added there):
    /// they do not open it here.
    pub elsewhere: Vec<ProtectorId>,
    /// The protectors the policy lists that the keystore has.
    pub protectors: Vec<ProtectorSummary>,
    /// Something a user should fix (unreadable protector file, missing policy, ...).
    pub problems: Vec<String>,
    /// Something that works but weakens the protection (a TPM PIN testable offline).
    pub warnings: Vec<String>,
    /// The filesystem holding the path, and whether it can encrypt at all.
    pub filesystem: FsStatus,
}

/// The filesystem under a path, as `status` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct FsStatus {
    /// Where the filesystem is mounted.
    pub mount_point: PathBuf,
    /// Its type ("ext4", "f2fs", ...).
    pub fstype: String,
    /// The device it is mounted from.
    pub device: String,
    /// Whether it can encrypt, and what to do if not.
    pub encryption: fscrypt::Support,
}

/// What `dirseal lock` achieved.
#[derive(Clone, Debug, Serialize)]
pub struct LockReport {
    /// The directory.
    pub path: PathBuf,
    /// The key is fully gone: names are ciphertext again.
    pub locked: bool,
    /// It was locked before this call (nothing was removed).
    pub already_locked: bool,
    /// Files were still open, so the kernel kept their inodes unlocked.
    pub files_busy: bool,
    /// Other users had also added this key; only root's `--all-users` removes theirs.
    pub other_users: bool,
    /// Processes still holding files under it (why the lock is incomplete).
    pub busy: Vec<BusyProcess>,
}

/// What a login achieved: the protector that opened the home and its master key, if any, and
/// what went wrong with the others (for the log).
pub struct Login {
    /// The protector that opened the home and the master key it unwrapped; `None` if none did.
    pub opened: Option<(ProtectorRecord, MasterKey)>,
    /// Each protector that was tried and failed, with why.
    pub problems: Vec<(ProtectorId, OpsError)>,
}

/// A process holding files under a directory being locked.
#[derive(Clone, Debug, Serialize)]
pub struct BusyProcess {
    /// Its process id.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// The user it runs as.
    pub uid: u32,
    /// "cwd", "open file /x/y", ...
    pub how: String,
}

impl From<dirseal_procs::ProcessUse> for BusyProcess {
    fn from(p: dirseal_procs::ProcessUse) -> Self {
        BusyProcess { pid: p.pid, comm: p.comm, uid: p.uid, how: p.how }
    }
}

fn key_word(s: KeyStatus) -> &'static str {
    match s {
        KeyStatus::Absent => "locked",
        KeyStatus::Present => "unlocked",
        KeyStatus::IncompletelyRemoved => "partially-locked",
    }
}

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

    /// Creates and saves a protector of any kind, asking the Ui what the kind needs (a new
    /// password or PIN, a touch). A machine-wide setting the kind recorded (the calibrated Argon2id
    /// cost) is saved in the config first, so every later protector costs the same.
    pub fn create_protector(
        &mut self,
        n: &NewProtector<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        let store = self.keystore.clone();
        self.create_protector_in(n, ui, &store)
    }

    /// [`Dirseal::create_protector`] saving the record in `store` (a portable directory's medium).
    fn create_protector_in(
        &mut self,
        n: &NewProtector<'_>,
        ui: &mut dyn Ui,
        store: &Keystore,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        let ask = n.kind.ask();
        n.kind.check_ready(&self.config)?;
        let secret = protector::ask_new(ask, n.name, n.uid, ui)?;
        if let (true, Some(uid), Some(secret)) = (n.kind.refuses_login_password(), n.uid, secret.as_ref()) {
            refuse_login_password_pin(uid, secret)?;
        }
        if ask.touch {
            ui.touch(n.name, None);
        }
        self.save_created_protector(n, secret.as_ref(), store)
    }

    /// Creates protector `n` with the secret asked for it and saves it in `store`.
    fn save_created_protector(
        &mut self,
        n: &NewProtector<'_>,
        secret: Option<&Passphrase>,
        store: &Keystore,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        let mut config = self.config.clone();
        let (rec, key) = protector::create(n.name, n.uid, &n.kind, &mut config, secret)?;
        if config != self.config {
            config.save(&self.config_path)?;
            self.config = config;
        }
        let _guard = store.lock()?;
        store.save_protector(&rec)?;
        Ok((rec, key))
    }

    /// Like [`Dirseal::create_protector`], for a conversion's new protector: a password protector
    /// of the same name and owner that no policy uses and that opens with the password given is
    /// taken instead of making another. A conversion interrupted after saving its protector and
    /// before its policy left it (it wraps nothing); the same command run again must end with the
    /// keystore an uninterrupted run makes, not two protectors of one name. Kinds whose unlocking
    /// costs something (a TPM's lockout tries, a touch) are never tried: they get a new protector.
    /// `store` is where the record goes (and where one to adopt is looked for): a portable
    /// directory's medium, or this keystore.
    pub(crate) fn adopt_or_create_protector(
        &mut self,
        n: &NewProtector<'_>,
        store: &Keystore,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        if n.kind.ask() != protector::Ask::PASSWORD {
            return self.create_protector_in(n, ui, store);
        }
        let candidates: Vec<ProtectorRecord> = store
            .protectors()?
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter(|r| r.name == n.name && r.uid == n.uid && r.kind.name() == n.kind.name())
            .filter(|r| store.policies_using(&r.id).is_ok_and(|p| p.is_empty()))
            .collect();
        if candidates.is_empty() {
            return self.create_protector_in(n, ui, store);
        }
        let secret = protector::ask_new(n.kind.ask(), n.name, n.uid, ui)?;
        for rec in candidates {
            if let Ok(key) = protector::unlock(&rec, &self.config, secret.as_ref(), ui.presence()) {
                return Ok((rec, key));
            }
        }
        self.save_created_protector(n, secret.as_ref(), store)
    }

    /// Asks what `rec`'s kind needs and unwraps its key; a wrong secret changes nothing.
    pub(crate) fn unlock_protector(&self, rec: &ProtectorRecord, ui: &mut dyn Ui) -> Result<ProtectorKey, OpsError> {
        Ok(protector::unlock_with(rec, &self.config, ui)?)
    }

    /// An existing protector unlocked with its secret, or a new one.
    pub(crate) fn resolve_protector(
        &mut self,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        match choice {
            ProtectorChoice::Existing(id) => {
                let rec = self.keystore.protector(&id)?;
                let key = self.unlock_protector(&rec, ui)?;
                Ok((rec, key))
            }
            ProtectorChoice::New(n) => self.create_protector(&n, ui),
        }
    }

    /// The kernel's policy for `dir` and the keystore's record for it.
    /// This machine's record comes first: the medium is asked only about a policy this keystore
    /// has no record of (a portable directory), so a record planted on a filesystem never stands
    /// in for a local directory's, and a local one that cannot be read is an error, not a reason
    /// to look elsewhere. A planted one is reported: see [`Dirseal::shadowed`].
    pub fn policy_of(&self, dir: &Path) -> Result<PolicyRecord, OpsError> {
        let policy = fscrypt::get_policy(dir)?.ok_or_else(|| OpsError::NotEncrypted { path: dir.to_path_buf() })?;
        match self.keystore.policy(&policy.identifier) {
            Err(KeystoreError::NotFound { .. }) => {}
            local => return Ok(local?),
        }
        match self.medium_policy(dir, &policy.identifier)? {
            Some(r) => Ok(r),
            None => Err(OpsError::NotManaged { path: dir.to_path_buf(), id: policy.identifier }),
        }
    }

    /// The record of policy `id` on the filesystem holding `dir`, if it keeps one (a portable
    /// directory). A directory with a local record still opens when the medium's records are
    /// unreadable (anyone who can write the root of a shared filesystem can plant a `.dirseal`
    /// there): [`Dirseal::dir_status`] reports that as a problem.
    fn medium_policy(&self, dir: &Path, id: &KeyIdentifier) -> Result<Option<PolicyRecord>, OpsError> {
        let mp = fscrypt::mount_point(dir)?;
        let Some(medium) = portable::open_existing(&mp)? else { return Ok(None) };
        match medium.policy(id) {
            Ok(r) => Ok(Some(r)),
            Err(KeystoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The keystore's policy record `id`.
    pub fn policy(&self, id: &KeyIdentifier) -> Result<PolicyRecord, OpsError> {
        Ok(self.keystore.policy(id)?)
    }

    /// `None` when dirseal does not manage `dir` (not encrypted, or no policy record): the case in
    /// which the PAM module steps aside.
    pub fn managed_policy(&self, dir: &Path) -> Result<Option<PolicyRecord>, OpsError> {
        match self.policy_of(dir) {
            Ok(r) => Ok(Some(r)),
            Err(OpsError::NotEncrypted { .. } | OpsError::NotManaged { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Readable protectors of a policy; unreadable ones are reported, not fatal.
    /// A portable policy's protectors are looked up on its medium, then in this machine's
    /// keystore (an extra, local TPM protector); one found in neither was added on another machine
    /// and is left out here without being a problem ([`DirStatus::elsewhere`]).
    pub fn protectors_of(&self, policy: &PolicyRecord) -> (Vec<ProtectorRecord>, Vec<String>) {
        let mut ok = Vec::new();
        let mut problems = Vec::new();
        for id in policy.wrapped.keys() {
            match self.protector_of_policy(policy, id) {
                Ok((r, _)) => ok.push(r),
                Err(KeystoreError::NotFound { .. }) if policy.medium.is_some() => {}
                Err(e) => problems.push(e.to_string()),
            }
        }
        (ok, problems)
    }

    /// The medium's keystore of a portable policy; `None` for a local one.
    fn medium_of(&self, policy: &PolicyRecord) -> Result<Option<Keystore>, KeystoreError> {
        match &policy.medium {
            Some(mp) => portable::open_existing(mp),
            None => Ok(None),
        }
    }

    /// Protector `id` of `policy`: the medium's record first for a portable policy (the `bool`
    /// says it came from there), else this machine's.
    fn protector_of_policy(
        &self,
        policy: &PolicyRecord,
        id: &ProtectorId,
    ) -> Result<(ProtectorRecord, bool), KeystoreError> {
        if let Some(medium) = self.medium_of(policy)? {
            match medium.protector(id) {
                Err(KeystoreError::NotFound { .. }) => {}
                // dirseal never writes one there: a medium's record of a kind bound to a machine
                // was planted, and trying it could spend this machine's TPM tries.
                Ok(r) if !r.kind.travels() => {
                    return Err(KeystoreError::Corrupt {
                        path: medium.protector_path(id),
                        reason: format!(
                            "it is a {} protector, which is bound to a machine and never kept on a medium",
                            r.kind.name()
                        ),
                    })
                }
                r => return r.map(|r| (r, true)),
            }
        }
        self.keystore.protector(id).map(|r| (r, false))
    }

    /// Where the records of `dir`'s policy on its filesystem and this machine's keystore disagree,
    /// each said (in `status`, and by `unlock`), never silently ignored: for a local policy, a
    /// record of it on the filesystem too (planted there: dirseal keeps a policy in one place),
    /// ignored; for a portable one, a local record of one of its protectors that differs from the
    /// medium's, which is used.
    pub fn shadowed(&self, dir: &Path, policy: &PolicyRecord) -> Vec<String> {
        let mut out = Vec::new();
        if policy.medium.is_none() {
            let planted = fscrypt::mount_point(dir).ok().and_then(|mp| portable::open_existing(&mp).ok().flatten());
            if let Some(medium) = planted {
                if !matches!(medium.policy(&policy.id), Err(KeystoreError::NotFound { .. })) {
                    out.push(format!(
                        "{} also holds a record of policy {}, which this machine's keystore keeps: it is ignored \
                         (this directory is not portable, and dirseal never wrote it there); remove it",
                        medium.policy_path(&policy.id).display(),
                        policy.id
                    ));
                }
            }
            return out;
        }
        let Ok(Some(medium)) = self.medium_of(policy) else { return out };
        for id in policy.wrapped.keys() {
            let (Ok(on_medium), local) = (medium.protector(id), self.keystore.protector(id)) else { continue };
            if matches!(local, Err(KeystoreError::NotFound { .. })) || local.as_ref().is_ok_and(|l| *l == on_medium) {
                continue;
            }
            out.push(format!(
                "protector {id} ({}): this machine's keystore has another record with the same id ({}), ignored for \
                 this directory: the medium's is used",
                on_medium.name,
                self.keystore.protector_path(id).display()
            ));
        }
        out
    }

    /// The protectors a login of `uid` may try, in the one login order
    /// (kinds that need no typing first, then by name): only the user's own (`uid` = theirs). A protector shared
    /// into the directory by someone else opens it with the CLI but never logs anyone in.
    pub fn login_protectors(&self, policy: &PolicyRecord, uid: u32) -> Vec<ProtectorRecord> {
        let (mut list, _) = self.protectors_of(policy);
        list.retain(|r| r.uid == Some(uid));
        protector::login_order(&mut list, uid);
        list
    }

    /// The protector `named` for `uid`: its id, or the name of one of `uid`'s protectors (`None`:
    /// anyone's, for an administrator). A name two of them share is refused with both named.
    pub fn protector_named(&self, named: &str, uid: Option<u32>) -> Result<ProtectorRecord, OpsError> {
        if let Ok(id) = named.parse::<ProtectorId>() {
            return Ok(self.keystore.protector(&id)?);
        }
        let found: Vec<ProtectorRecord> = self
            .keystore
            .protectors()?
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter(|r| r.name == named && (uid.is_none() || r.uid == uid))
            .collect();
        let scope = uid.map_or_else(|| "in the keystore".to_string(), |uid| format!("of uid {uid}"));
        one_named(named, found, scope)
    }

    /// The protector of `policy` (`what` names it in errors, a directory) that `named` names: an
    /// id as it is, else the one of its protectors (on its medium too) of that name. A name other
    /// directories' protectors share is no ambiguity here; a name none of its protectors has is
    /// looked up in the whole keystore, so the error says it does not open `what`.
    pub fn protector_named_for(&self, policy: &PolicyRecord, named: &str, what: &str) -> Result<ProtectorId, OpsError> {
        if let Ok(id) = named.parse::<ProtectorId>() {
            return Ok(id);
        }
        let (list, _) = self.protectors_of(policy);
        let found: Vec<ProtectorRecord> = list.into_iter().filter(|r| r.name == named).collect();
        if found.is_empty() {
            return Ok(self.protector_named(named, None)?.id);
        }
        Ok(one_named(named, found, format!("that open {what}"))?.id)
    }

    /// The one protector of `uid` that opens `policy` (`what` names it in errors): none or
    /// several are errors that say so.
    pub fn own_protector(&self, policy: &PolicyRecord, uid: u32, what: &str) -> Result<ProtectorId, OpsError> {
        let (mut list, _) = self.protectors_of(policy);
        list.retain(|r| r.uid == Some(uid));
        match list.as_slice() {
            [one] => Ok(one.id),
            [] => Err(OpsError::NoneOfYours { uid, what: what.to_string() }),
            many => Err(OpsError::SeveralOfYours { uid, what: what.to_string(), list: listed(many) }),
        }
    }

    /// Loads `dir`'s key for `uid` with no protector named: `uid`'s own protectors of it are tried
    /// in the login order ([`Dirseal::login_protectors`]), each asked of the Ui, until one opens.
    pub fn unlock_as(&self, dir: &Path, uid: u32, ui: &mut dyn Ui) -> Result<(), OpsError> {
        self.unlock_as_where(dir, uid, ui, |_| true)
    }

    /// [`Dirseal::unlock_as`] over the protectors `keep` accepts, asked of each just before it
    /// would be tried (a front end's own rule, such as the service's PIN tries): one refused is
    /// skipped and the next tried. With none accepted the error is [`OpsError::OpensNone`].
    pub fn unlock_as_where(
        &self,
        dir: &Path,
        uid: u32,
        ui: &mut dyn Ui,
        mut keep: impl FnMut(&ProtectorRecord) -> bool,
    ) -> Result<(), OpsError> {
        if self.is_unlocked(dir)? {
            ui.notice(&format!("{} is already unlocked", dir.display()));
            return Ok(());
        }
        let policy = self.policy_of(dir)?;
        let what = dir.display().to_string();
        let list = self.login_protectors(&policy, uid);
        match list.as_slice() {
            [] => return Err(OpsError::NoneOfYours { uid, what }),
            [one] if keep(one) => return self.unlock(dir, Pick { protector: Some(one.id) }, ui),
            [_] => return Err(OpsError::OpensNone { uid, what, list: listed(&list) }),
            _ => {}
        }
        let login = self.first_opening(&policy, uid, ui, keep)?;
        match login.opened {
            Some((_, master)) => {
                self.add_key(dir, &master)?;
                ui.notice(&format!("unlocked {what}"));
                Ok(())
            }
            None => match login.problems.into_iter().next() {
                Some((_, e)) => Err(e),
                None => Err(OpsError::OpensNone { uid, what, list: listed(&list) }),
            },
        }
    }

    /// A login: tries `policy`'s [`Dirseal::login_protectors`] in order and returns the first that
    /// opens it, with the master key. The Ui is asked only for what each protector needs, so
    /// the ones needing no typing go first; a login Ui answers every password prompt with the one
    /// login password. A protector that fails for another reason than a wrong secret is reported in
    /// `problems` and the next one is tried; a Ui error (cancelled, conversation failed) ends it.
    pub fn login(&self, policy: &PolicyRecord, uid: u32, ui: &mut dyn Ui) -> Result<Login, OpsError> {
        self.login_where(policy, uid, ui, |_| true)
    }

    /// [`Dirseal::login`] over the login protectors `keep` accepts (asked of each just before it
    /// would be tried, in order). Those that need a security key's own PIN are never among them: a
    /// login has no such PIN, and offering it the password would spend the key's few tries.
    pub fn login_where(
        &self,
        policy: &PolicyRecord,
        uid: u32,
        ui: &mut dyn Ui,
        mut keep: impl FnMut(&ProtectorRecord) -> bool,
    ) -> Result<Login, OpsError> {
        // A touch is asked of whoever is at the machine: a login from elsewhere must not raise
        // one there, or anyone who knows the user's name logs in when a person at the device
        // touches their key. (An unlock by the user, already someone, may: `unlock_as_where`.)
        let at_device = ui.presence().at_device();
        self.first_opening(policy, uid, ui, |r| (at_device || r.kind.ask() != protector::Ask::TOUCH) && keep(r))
    }

    /// The first of `policy`'s login protectors of `uid` that `keep` accepts and that opens, in
    /// the login order (see [`Dirseal::login_where`]).
    fn first_opening(
        &self,
        policy: &PolicyRecord,
        uid: u32,
        ui: &mut dyn Ui,
        mut keep: impl FnMut(&ProtectorRecord) -> bool,
    ) -> Result<Login, OpsError> {
        let mut problems = Vec::new();
        let mut list = self.login_protectors(policy, uid);
        list.retain(|r| r.kind.ask().secret != Some(protector::Secret::KeyPin));
        for rec in list {
            if !keep(&rec) {
                continue;
            }
            let pkey = match protector::unlock_with(&rec, &self.config, ui) {
                Ok(k) => k,
                Err(UnlockError::Ui(e)) => return Err(e.into()),
                Err(UnlockError::Protector(ProtectorError::IncorrectSecret { .. })) => continue,
                // No TPM on this machine, no security key holding the credential plugged in: the
                // usual case, nothing to report at every login.
                Err(UnlockError::Protector(ProtectorError::Unavailable(_))) => continue,
                Err(UnlockError::Protector(e)) => {
                    problems.push((rec.id, e.into()));
                    continue;
                }
            };
            match self.master_key(policy, &rec.id, &pkey) {
                Ok(master) => return Ok(Login { opened: Some((rec, master)), problems }),
                Err(e) => problems.push((rec.id, e)),
            }
        }
        Ok(Login { opened: None, problems })
    }

    /// Unwraps a policy's master key with an unlocked protector and checks it really is the key of
    /// that policy: a forged or swapped keystore entry never yields a key for the wrong directory.
    pub fn master_key(
        &self,
        policy: &PolicyRecord,
        pid: &ProtectorId,
        pkey: &ProtectorKey,
    ) -> Result<MasterKey, OpsError> {
        let master = policy.unwrap_master(pid, pkey)?;
        let got = fscrypt::key_identifier(&master);
        if got != policy.id {
            return Err(OpsError::KeyMismatch { policy: policy.id, got });
        }
        Ok(master)
    }

    fn pick<'p>(
        &self,
        policy: &PolicyRecord,
        pick: Pick,
        what: &str,
        (list, problems): (&'p [ProtectorRecord], &[String]),
    ) -> Result<&'p ProtectorRecord, OpsError> {
        // A protector whose file cannot be used is reported as such, not as "no protector".
        let unusable = || OpsError::Unusable { what: what.to_string(), problems: problems.join("; ") };
        let names =
            || list.iter().map(|r| format!("{} ({}, {})", r.id, r.name, r.kind.name())).collect::<Vec<_>>().join(", ");
        if let Some(id) = pick.protector {
            return list.iter().find(|r| r.id == id).ok_or_else(|| {
                if policy.wrapped.contains_key(&id) {
                    match self.protector_of_policy(policy, &id) {
                        Err(e) => OpsError::Keystore(e),
                        Ok(_) => unusable(),
                    }
                } else {
                    OpsError::NotAProtectorOf { id, what: what.to_string(), list: names() }
                }
            });
        }
        match list {
            [one] => Ok(one),
            [] if !problems.is_empty() => Err(unusable()),
            [] => Err(OpsError::NoProtector { what: what.to_string() }),
            _ => Err(OpsError::AmbiguousProtector { what: what.to_string(), list: names() }),
        }
    }

    /// The master key of `dir`'s policy, asking the Ui for the chosen protector's secret.
    pub fn master_key_of_dir(
        &self,
        dir: &Path,
        pick: Pick,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, MasterKey), OpsError> {
        let policy = self.policy_of(dir)?;
        let what = dir.display().to_string();
        let picked = pick.protector;
        let (pid, pkey) = match self.unlock_policy_protector(&policy, pick, &what, ui) {
            Err(OpsError::Protector(e @ ProtectorError::NotNow(_))) => {
                return Err(self.use_another(&policy, dir, picked, e));
            }
            r => r?,
        };
        let master = self.master_key(&policy, &pid, &pkey)?;
        Ok((policy, master))
    }

    /// `e` (a TPM protector that cannot open now) with what else opens `dir`: its other protectors
    /// and its recovery key. `picked` is the one that failed (else the policy has only one).
    fn use_another(
        &self,
        policy: &PolicyRecord,
        dir: &Path,
        picked: Option<ProtectorId>,
        e: ProtectorError,
    ) -> OpsError {
        let (list, _) = self.protectors_of(policy);
        let failed = picked.or_else(|| (list.len() == 1).then(|| list[0].id));
        let others = list.iter().filter(|r| Some(r.id) != failed).map(ProtectorSummary::of).collect();
        let recovery = crate::recovery::read_blob(dir).is_ok_and(|b| b.is_some());
        OpsError::UseAnother { source: e, dir: dir.to_path_buf(), others, recovery }
    }

    /// Picks one of `policy`'s protectors (`what` names the policy in errors) and unlocks it.
    pub(crate) fn unlock_policy_protector(
        &self,
        policy: &PolicyRecord,
        pick: Pick,
        what: &str,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorId, ProtectorKey), OpsError> {
        let (list, problems) = self.protectors_of(policy);
        if pick.protector.is_none() && list.len() > 1 {
            return self.unlock_untyped_first(policy, what, (list, problems), ui);
        }
        let rec = self.pick(policy, pick, what, (&list, &problems))?;
        let pkey = self.unlock_protector(rec, ui)?;
        Ok((rec.id, pkey))
    }

    /// Several protectors and none chosen: those that need nothing typed (a security key to
    /// touch) are tried first, in the login order; when none opens, the one protector left that
    /// needs a secret is asked for it, and with several the caller must choose.
    fn unlock_untyped_first(
        &self,
        policy: &PolicyRecord,
        what: &str,
        (mut list, problems): (Vec<ProtectorRecord>, Vec<String>),
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorId, ProtectorKey), OpsError> {
        protector::login_order(&mut list, rustix::process::getuid().as_raw());
        let (untyped, typed): (Vec<_>, Vec<_>) = list.into_iter().partition(|r| r.kind.ask().secret.is_none());
        let mut last = None;
        for rec in &untyped {
            match self.unlock_protector(rec, ui) {
                Ok(k) => return Ok((rec.id, k)),
                Err(OpsError::Ui(e)) => return Err(e.into()),
                Err(e) => {
                    ui.notice(&format!("protector {} ({}): {e}", rec.name, rec.id));
                    last = Some(e);
                }
            }
        }
        match (typed.as_slice(), last) {
            ([], Some(e)) => Err(e),
            (typed, _) => {
                let rec = self.pick(policy, Pick { protector: None }, what, (typed, &problems))?;
                Ok((rec.id, self.unlock_protector(rec, ui)?))
            }
        }
    }

    /// Adds `key` to the kernel for the filesystem holding `dir`.
    pub fn add_key(&self, dir: &Path, key: &MasterKey) -> Result<(), OpsError> {
        let mp = fscrypt::mount_point(dir)?;
        fscrypt::add_key(&mp, key)?;
        Ok(())
    }

    /// Whether `dir` is encrypted and its key is fully loaded, so unlocking has nothing to do.
    /// A partly removed key is not: adding it again is what finishes an interrupted lock's undo.
    pub(crate) fn is_unlocked(&self, dir: &Path) -> Result<bool, OpsError> {
        let Some(policy) = fscrypt::get_policy(dir)? else { return Ok(false) };
        let mp = fscrypt::mount_point(dir)?;
        Ok(fscrypt::key_status(&mp, &policy.identifier)? == KeyStatus::Present)
    }

    /// Loads `dir`'s key, asking for a protector's secret; an unlocked directory asks nothing.
    pub fn unlock(&self, dir: &Path, pick: Pick, ui: &mut dyn Ui) -> Result<(), OpsError> {
        if self.is_unlocked(dir)? {
            ui.notice(&format!("{} is already unlocked", dir.display()));
            return Ok(());
        }
        let (policy, master) = self.master_key_of_dir(dir, pick, ui)?;
        for note in self.shadowed(dir, &policy) {
            ui.notice(&note);
        }
        self.add_key(dir, &master)?;
        ui.notice(&format!("unlocked {}", dir.display()));
        Ok(())
    }

    /// Removes the key. Busy files keep their inodes unlocked until closed: the report names the
    /// processes holding them so the caller can say "close these and run lock again".
    pub fn lock(&self, dir: &Path, all_users: bool) -> Result<LockReport, OpsError> {
        let policy = fscrypt::get_policy(dir)?.ok_or_else(|| OpsError::NotEncrypted { path: dir.to_path_buf() })?;
        let mp = fscrypt::mount_point(dir)?;
        // The key locks its whole tree: the report names the tree, not the subdirectory asked.
        let dir = &fscrypt::encrypted_root(dir, &policy)?;
        // Locking a locked directory achieves what was asked: say so, as unlock does for an
        // unlocked one, instead of the kernel's "key not present".
        if fscrypt::key_status(&mp, &policy.identifier)? == KeyStatus::Absent {
            return Ok(LockReport {
                path: dir.to_path_buf(),
                locked: true,
                already_locked: true,
                files_busy: false,
                other_users: false,
                busy: Vec::new(),
            });
        }
        let out = fscrypt::remove_key(&mp, &policy.identifier, all_users)?;
        let status = fscrypt::key_status(&mp, &policy.identifier)?;
        let busy = if out.files_busy {
            dirseal_procs::find_users(dir).unwrap_or_default().into_iter().map(BusyProcess::from).collect()
        } else {
            Vec::new()
        };
        Ok(LockReport {
            path: dir.to_path_buf(),
            locked: status == KeyStatus::Absent,
            already_locked: false,
            files_busy: out.files_busy,
            other_users: out.other_users,
            busy,
        })
    }

    /// Makes the empty directory `dir` encrypted with a new policy protected by `choice`.
    ///
    /// Order matters for crash safety: the policy record (with the wrapped key) is durable before the
    /// directory is encrypted, so there is never an encrypted directory whose key exists nowhere.
    pub fn encrypt(
        &mut self,
        dir: &Path,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, MasterKey), OpsError> {
        self.encrypt_where(dir, choice, false, ui)
    }

    /// [`Dirseal::encrypt`] for a portable directory: its policy record and its protector's are
    /// kept on its own filesystem (crate::portable), so it opens on any machine. The protector must
    /// travel ([`ProtectorKind::travels`](crate::protector::ProtectorKind::travels)): a TPM's is
    /// refused before anything is asked or written.
    pub fn encrypt_portable(
        &mut self,
        dir: &Path,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, MasterKey), OpsError> {
        self.encrypt_where(dir, choice, true, ui)
    }

    fn encrypt_where(
        &mut self,
        dir: &Path,
        choice: ProtectorChoice<'_>,
        portable: bool,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, MasterKey), OpsError> {
        let meta = std::fs::symlink_metadata(dir).map_err(|e| OpsError::BadDirectory {
            path: dir.to_path_buf(),
            reason: format!("cannot inspect it: {e}"),
        })?;
        if !meta.is_dir() {
            return Err(OpsError::BadDirectory {
                path: dir.to_path_buf(),
                reason: "not a directory (symlinks are not followed)".into(),
            });
        }
        let mp = fscrypt::mount_point(dir)?;
        fscrypt::check_supported(&mp)?;
        if let Some(p) = fscrypt::get_policy(dir)? {
            return Err(OpsError::AlreadyEncrypted { path: dir.to_path_buf(), id: p.identifier });
        }
        let non_empty = std::fs::read_dir(dir)
            .map_err(|e| OpsError::BadDirectory { path: dir.to_path_buf(), reason: format!("cannot list it: {e}") })?
            .next()
            .is_some();
        if non_empty {
            return Err(OpsError::NotEmpty { path: dir.to_path_buf() });
        }
        let (store, (prec, pkey)) = if portable {
            self.check_travels(&choice)?;
            let store = portable::open_or_create(&mp)?;
            let resolved = self.resolve_protector_into(choice, &store, ui)?;
            (store, resolved)
        } else {
            (self.keystore.clone(), self.resolve_protector(choice, ui)?)
        };
        let (policy, master) = Self::draft_policy(dir, &prec, &pkey);
        {
            let _guard = store.lock()?;
            store.save_policy(&policy)?;
        }
        self.add_key(dir, &master)?;
        fscrypt::set_policy(dir, &policy.id)?;
        let policy = PolicyRecord { medium: store.medium().map(Path::to_path_buf), ..policy };
        ui.notice(&format!("encrypted {} (policy {}, protector {} {})", dir.display(), policy.id, prec.id, prec.name));
        Ok((policy, master))
    }

    /// A fresh master key and its policy record protected by `prec`, nothing written: for a caller
    /// that puts the policy on a directory before the record exists ([`Dirseal::save_new_policy`]),
    /// so that every saved record has its directory.
    pub(crate) fn draft_policy(dir: &Path, prec: &ProtectorRecord, pkey: &ProtectorKey) -> (PolicyRecord, MasterKey) {
        let master = MasterKey::random();
        let id = fscrypt::key_identifier(&master);
        let mut policy = PolicyRecord::new(id, Some(dir.to_path_buf()));
        policy.add_protector(&prec.id, pkey, &master);
        (policy, master)
    }

    /// Saves a new policy record in `store` (a portable directory's medium, or this keystore).
    pub(crate) fn save_new_policy(&self, policy: &PolicyRecord, store: &Keystore) -> Result<(), OpsError> {
        let _guard = store.lock()?;
        store.save_policy(policy)?;
        Ok(())
    }

    /// Where the record of policy `id`, of a directory on the filesystem holding `dir`, is kept:
    /// this keystore when it has one (as [`Dirseal::policy_of`] decides), else that filesystem
    /// when it has one there (a portable directory), else this keystore.
    pub(crate) fn store_of_policy(&self, dir: &Path, id: &KeyIdentifier) -> Result<Keystore, OpsError> {
        if !matches!(self.keystore.policy(id), Err(KeystoreError::NotFound { .. })) {
            return Ok(self.keystore.clone());
        }
        let mp = fscrypt::mount_point(dir)?;
        if let Some(medium) = portable::open_existing(&mp)? {
            match medium.policy(id) {
                Ok(_) => return Ok(medium),
                Err(KeystoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(self.keystore.clone())
    }

    /// Adds protector `new` to the policy of `dir` (or of policy `id`), proving access with an
    /// existing protector.
    pub fn add_protector_to_policy(
        &mut self,
        policy_id: &KeyIdentifier,
        with: Pick,
        new: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<ProtectorRecord, OpsError> {
        let policy = self.keystore.policy(policy_id)?;
        self.add_protector_to(&policy, with, new, ui)
    }

    /// [`Dirseal::add_protector_to_policy`] given the policy record ([`Dirseal::policy_of`]). For
    /// a portable policy the records go to its medium, a protector that travels with it, while one
    /// bound to this machine (a TPM) stays in this machine's keystore as an extra, local one.
    pub fn add_protector_to(
        &mut self,
        policy: &PolicyRecord,
        with: Pick,
        new: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<ProtectorRecord, OpsError> {
        let policy_id = policy.id;
        let (pid, pkey) = self.unlock_policy_protector(policy, with, &format!("policy {policy_id}"), ui)?;
        let master = self.master_key(policy, &pid, &pkey)?;
        let store = match &policy.medium {
            Some(mp) => portable::open_or_create(mp)?,
            None => self.keystore.clone(),
        };
        let (nrec, nkey) = match policy.medium {
            Some(_) => self.resolve_protector_into(new, &store, ui)?,
            None => self.resolve_protector(new, ui)?,
        };
        let _guard = store.lock()?;
        // Re-read under the lock: another command may have changed the policy meanwhile.
        let mut policy = store.policy(&policy_id)?;
        if policy.wrapped.contains_key(&nrec.id) {
            return Err(OpsError::AlreadyProtects(nrec.id));
        }
        policy.add_protector(&nrec.id, &nkey, &master);
        store.save_policy(&policy)?;
        Ok(nrec)
    }

    /// Refuses, before anything is asked, a protector that cannot be a portable directory's own.
    pub(crate) fn check_travels(&self, choice: &ProtectorChoice<'_>) -> Result<(), OpsError> {
        let (travels, name, kind) = match choice {
            ProtectorChoice::New(n) => (n.kind.travels(), n.name.to_string(), n.kind.name()),
            ProtectorChoice::Existing(id) => {
                let rec = self.keystore.protector(id)?;
                (rec.kind.travels(), rec.name, rec.kind.name())
            }
        };
        if travels {
            Ok(())
        } else {
            Err(OpsError::StaysOnMachine { name, kind })
        }
    }

    /// A protector for a portable policy whose medium's keystore is `medium`: a new one that
    /// travels is saved there, one that does not in this machine's keystore; an existing one is
    /// looked up on the medium, then here, and one that travels is copied to the medium (the same
    /// record, so it opens there as it does here).
    pub(crate) fn resolve_protector_into(
        &mut self,
        choice: ProtectorChoice<'_>,
        medium: &Keystore,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        match choice {
            ProtectorChoice::New(n) if n.kind.travels() => self.create_protector_in(&n, ui, medium),
            ProtectorChoice::New(n) => self.create_protector(&n, ui),
            ProtectorChoice::Existing(id) => {
                let (rec, on_medium) = match medium.protector(&id) {
                    Ok(r) => (r, true),
                    Err(KeystoreError::NotFound { .. }) => (self.keystore.protector(&id)?, false),
                    Err(e) => return Err(e.into()),
                };
                let key = self.unlock_protector(&rec, ui)?;
                if !on_medium && rec.kind.travels() {
                    let _guard = medium.lock()?;
                    medium.save_protector(&rec)?;
                }
                Ok((rec, key))
            }
        }
    }

    /// Removes a protector from one policy; refused if no other readable protector would be left.
    pub fn remove_protector_from_policy(&self, policy_id: &KeyIdentifier, pid: &ProtectorId) -> Result<(), OpsError> {
        self.remove_protector_from(&self.keystore.policy(policy_id)?, pid)
    }

    /// [`Dirseal::remove_protector_from_policy`] given the policy record ([`Dirseal::policy_of`]):
    /// a portable policy keeps at least one readable protector that travels.
    pub fn remove_protector_from(&self, policy: &PolicyRecord, pid: &ProtectorId) -> Result<(), OpsError> {
        let policy_id = &policy.id;
        let store = match &policy.medium {
            Some(mp) => portable::open_or_create(mp)?,
            None => self.keystore.clone(),
        };
        let _guard = store.lock()?;
        let mut policy = store.policy(policy_id)?;
        if !policy.wrapped.contains_key(pid) {
            let list = policy.wrapped.keys().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            return Err(OpsError::NotAProtectorOf { id: *pid, what: format!("policy {policy_id}"), list });
        }
        // The last *readable* protector counts as the last one: removing it would strand the key.
        let others: Vec<ProtectorRecord> = policy
            .wrapped
            .keys()
            .filter(|k| *k != pid)
            .filter_map(|k| self.protector_of_policy(&policy, k).ok().map(|(r, _)| r))
            .collect();
        if others.is_empty() {
            return Err(KeystoreError::LastProtector { policy: *policy_id }.into());
        }
        if policy.medium.is_some() && !others.iter().any(|r| r.kind.travels()) {
            return Err(OpsError::LastTravelling { policy: *policy_id, protector: *pid });
        }
        policy.remove_protector(pid)?;
        store.save_policy(&policy)?;
        Ok(())
    }

    /// Deletes a protector from the keystore; refused while any policy still uses it.
    pub fn remove_protector(&self, pid: &ProtectorId) -> Result<(), OpsError> {
        let _guard = self.keystore.lock()?;
        self.keystore.remove_protector(pid)?;
        Ok(())
    }

    /// Checks a protector's secret without changing anything.
    pub fn verify_protector(&self, pid: &ProtectorId, ui: &mut dyn Ui) -> Result<ProtectorRecord, OpsError> {
        let rec = self.keystore.protector(pid)?;
        self.unlock_protector(&rec, ui)?;
        Ok(rec)
    }

    /// Gives a protector a new secret (password, PIN): asks the current one, then the new one.
    /// Policies are untouched: they wrap master keys with the protector key, which does not change.
    pub fn change_secret(&self, pid: &ProtectorId, ui: &mut dyn Ui) -> Result<ProtectorRecord, OpsError> {
        let rec = self.keystore.protector(pid)?;
        if rec.kind.ask().secret.is_none() {
            return Err(ProtectorError::NoSecret { name: rec.name, id: rec.id, kind: rec.kind.name() }.into());
        }
        let pkey = self.unlock_protector(&rec, ui)?;
        let new = protector::ask_new(rec.kind.ask(), &rec.name, rec.uid, ui)?;
        self.change_secret_with(pid, &pkey, new.as_ref())
    }

    /// [`Dirseal::change_secret`] for the protector of `dir` that `pick` names (or its only one),
    /// changed where the directory keeps it: a portable directory's medium, or this keystore.
    pub fn change_dir_secret(&self, dir: &Path, pick: Pick, ui: &mut dyn Ui) -> Result<ProtectorRecord, OpsError> {
        let policy = self.policy_of(dir)?;
        let rec = self.protector_of_dir(dir, pick)?;
        let store = match self.protector_of_policy(&policy, &rec.id)? {
            (_, true) => {
                self.medium_of(&policy)?.ok_or(KeystoreError::NotFound { kind: "protector", id: rec.id.to_string() })?
            }
            (_, false) => return self.change_secret(&rec.id, ui),
        };
        if rec.kind.ask().secret.is_none() {
            return Err(ProtectorError::NoSecret { name: rec.name, id: rec.id, kind: rec.kind.name() }.into());
        }
        let pkey = self.unlock_protector(&rec, ui)?;
        let new = protector::ask_new(rec.kind.ask(), &rec.name, rec.uid, ui)?;
        if new.as_ref().is_some_and(Passphrase::is_empty) {
            return Err(UiError::Empty.into());
        }
        let _guard = store.lock()?;
        let rec = store.protector(&rec.id)?;
        let updated = protector::change_secret(&rec, &pkey, &self.config, new.as_ref())?;
        store.save_protector(&updated)?;
        Ok(updated)
    }

    /// The PAM path: the old secret was already verified into `pkey`. The kind keeps its cost
    /// (protector::password: the protector's own Argon2id cost).
    pub fn change_secret_with(
        &self,
        pid: &ProtectorId,
        pkey: &ProtectorKey,
        new: Option<&Passphrase>,
    ) -> Result<ProtectorRecord, OpsError> {
        if new.is_some_and(Passphrase::is_empty) {
            return Err(UiError::Empty.into());
        }
        let _guard = self.keystore.lock()?;
        let rec = self.keystore.protector(pid)?;
        let updated = protector::change_secret(&rec, pkey, &self.config, new)?;
        self.keystore.save_protector(&updated)?;
        Ok(updated)
    }

    /// The protector of `dir` that `pick` names, or the only one.
    pub fn protector_of_dir(&self, dir: &Path, pick: Pick) -> Result<ProtectorRecord, OpsError> {
        let policy = self.policy_of(dir)?;
        let (list, problems) = self.protectors_of(&policy);
        let what = dir.display().to_string();
        let rec = self.pick(&policy, pick, &what, (&list, &problems))?;
        Ok(rec.clone())
    }

    /// The state of any path: encrypted or not, and whether its filesystem could be. A filesystem
    /// without fscrypt is an answer here, not an error.
    pub fn dir_status(&self, dir: &Path) -> Result<DirStatus, OpsError> {
        let mut st = public_dir_status(dir)?;
        if st.policy.is_none() {
            return Ok(st);
        }
        match self.policy_of(dir) {
            Ok(rec) => {
                st.managed = true;
                st.portable = rec.medium.as_deref().map(portable::records_dir);
                let (list, problems) = self.protectors_of(&rec);
                st.protectors = list
                    .iter()
                    .map(|r| {
                        let on_medium = self.protector_of_policy(&rec, &r.id).is_ok_and(|(_, m)| m);
                        ProtectorSummary {
                            stored: if on_medium { "medium" } else { "keystore" },
                            ..ProtectorSummary::of(r)
                        }
                    })
                    .collect();
                if rec.medium.is_some() {
                    let missing = |id: &&ProtectorId| {
                        matches!(self.protector_of_policy(&rec, id), Err(KeystoreError::NotFound { .. }))
                    };
                    st.elsewhere = rec.wrapped.keys().filter(missing).copied().collect();
                }
                st.problems = problems;
                st.warnings = list.iter().filter_map(|r| self.pin_warning(r)).collect();
                st.warnings.extend(self.shadowed(dir, &rec));
                if let (None, Err(e)) = (&rec.medium, self.medium_policy(dir, &rec.id)) {
                    st.problems
                        .push(format!("the records on this filesystem cannot be read (the local one is used): {e}"));
                }
            }
            Err(OpsError::NotManaged { id, .. }) => {
                st.problems.push(KeystoreError::NotFound { kind: "policy", id: id.to_string() }.to_string())
            }
            Err(e) => st.problems.push(e.to_string()),
        }
        Ok(st)
    }

    /// Key status of a policy on the filesystem its hint points at, for overviews.
    pub fn policy_key_status(&self, rec: &PolicyRecord) -> Option<&'static str> {
        let hint = rec.path_hint.as_ref()?;
        let mp = fscrypt::mount_point(hint).ok()?;
        fscrypt::key_status(&mp, &rec.id).ok().map(key_word)
    }
}

/// What anyone who can open `dir` may learn without the keystore: its filesystem, whether it is
/// encrypted (and the top of its tree), and whether its key is loaded. Neither the policy nor
/// the key-status ioctl needs privilege; protectors are the keystore's and stay with root.
pub fn public_dir_status(dir: &Path) -> Result<DirStatus, OpsError> {
    let m = fscrypt::mount_entry(dir)?;
    let filesystem = FsStatus {
        encryption: fscrypt::support(&m.mount_point)?,
        mount_point: m.mount_point,
        fstype: m.fstype,
        device: m.source,
    };
    let policy = match filesystem.encryption {
        fscrypt::Support::Enabled => fscrypt::get_policy(dir)?,
        fscrypt::Support::NotEnabled | fscrypt::Support::Unsupported => None,
    };
    let encrypted_root = match &policy {
        Some(p) => Some(fscrypt::encrypted_root(dir, p)?),
        None => None,
    };
    let mut st = DirStatus {
        path: dir.to_path_buf(),
        encrypted_root,
        encrypted: policy.is_some(),
        policy: policy.map(|p| p.identifier),
        key: None,
        managed: false,
        portable: None,
        elsewhere: Vec::new(),
        protectors: Vec::new(),
        problems: Vec::new(),
        warnings: Vec::new(),
        filesystem,
    };
    if let Some(p) = policy {
        st.key = Some(key_word(fscrypt::key_status(&st.filesystem.mount_point, &p.identifier)?));
    }
    Ok(st)
}

/// Recovery keys (crate::recovery) reach the keystore only through here, so `recovery` needs
/// nothing of `ops`.
impl Dirseal {
    /// Unlocks `dir` with its recovery key; works without any keystore entry.
    pub fn unlock_with_recovery(&self, dir: &Path, ui: &mut dyn Ui) -> Result<(), OpsError> {
        if self.is_unlocked(dir)? {
            ui.notice(&format!("{} is already unlocked", dir.display()));
            return Ok(());
        }
        let key = recovery::ask_key(dir, ui)?;
        let (_, master) = recovery::master_key(dir, &key)?;
        self.add_key(dir, &master)?;
        ui.notice(&format!("unlocked {} with its recovery key", dir.display()));
        Ok(())
    }

    /// Unlocks `dir` with its recovery key and enrols `choice` (e.g. a new password) in its
    /// policy, creating the policy record if the keystore lost it.
    pub fn restore_with_recovery(
        &mut self,
        dir: &Path,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, ProtectorRecord), OpsError> {
        let key = recovery::ask_key(dir, ui)?;
        let (id, master) = recovery::master_key(dir, &key)?;
        let (prec, pkey) = self.resolve_protector(choice, ui)?;
        let _guard = self.keystore().lock()?;
        let mut policy = match self.keystore().policy(&id) {
            Ok(p) => p,
            // A missing or unreadable record is rebuilt: the recovery key proved ownership.
            Err(KeystoreError::NotFound { .. } | KeystoreError::Corrupt { .. }) => {
                PolicyRecord::new(id, Some(dir.to_path_buf()))
            }
            Err(e) => return Err(e.into()),
        };
        policy.add_protector(&prec.id, &pkey, &master);
        self.keystore().save_policy(&policy)?;
        self.add_key(dir, &master)?;
        ui.notice(&format!(
            "restored {}: unlocked, and protector {} ({}) now opens it",
            dir.display(),
            prec.id,
            prec.name
        ));
        Ok((policy, prec))
    }
}

/// A TPM PIN for `uid`'s protector must not be `uid`'s login password (see
/// [`OpsError::PinIsLoginPassword`]). A shadow entry that cannot be read (not root, no entry)
/// has nothing to compare with.
fn refuse_login_password_pin(uid: u32, pin: &Passphrase) -> Result<(), OpsError> {
    let Ok(Some(u)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else { return Ok(()) };
    if crate::account::password_is(&u.name, pin).unwrap_or(false) {
        return Err(OpsError::PinIsLoginPassword { user: u.name });
    }
    Ok(())
}

/// Whether `rec` opens with a PIN alone that its device counts (a TPM PIN): what a PIN login
/// (docs/pam.md) opens.
pub fn is_tpm_pin(rec: &ProtectorRecord) -> bool {
    rec.kind.ask() == protector::Ask::PIN
}

/// PIN-login accounts (docs/pam.md): log in with their TPM PIN alone, no password hash in
/// /etc/shadow, and `passwd` changes the PIN. Marked in the root-owned config (`[pam] pin_login`).
impl Dirseal {
    /// Whether `user` is a PIN-login account (`[pam] pin_login` in the configuration).
    pub fn is_pin_login(&self, user: &str) -> bool {
        self.config.pam.pin_login.iter().any(|u| u == user)
    }

    /// The protector a PIN login of `uid` opens `policy` with: their own first TPM PIN protector
    /// in the login order.
    pub fn pin_protector(&self, policy: &PolicyRecord, uid: u32) -> Option<ProtectorRecord> {
        self.login_protectors(policy, uid).into_iter().find(is_tpm_pin)
    }

    /// Makes `user` a PIN-login account: their home must open with a TPM PIN protector of
    /// theirs. The config names them first, then their password hash is replaced by `*`; run
    /// again if the second step failed. Returns the protector their PIN opens.
    pub fn enable_pin_login(&mut self, user: &str) -> Result<ProtectorRecord, OpsError> {
        let (uid, home) = lookup_user(user)?;
        let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map_or_else(|| user.to_string(), |u| u.name);
        let policy = self.policy_of(&home)?;
        let rec = self.pin_protector(&policy, uid).ok_or(OpsError::NoPinProtector { user: name.clone(), home })?;
        if !self.is_pin_login(&name) {
            let mut config = self.config.clone();
            config.pam.pin_login.push(name.clone());
            config.save(&self.config_path)?;
            self.config = config;
        }
        crate::account::remove_password(&name)?;
        Ok(rec)
    }

    /// A TPM PIN protector of an ordinary account (not PIN-login) whose login password has a hash
    /// in /etc/shadow: the PAM module offers it the login password at every login, so its PIN is
    /// that password (docs/pam.md), and the hash lets anyone with the disk find it offline.
    pub(crate) fn pin_warning(&self, rec: &ProtectorRecord) -> Option<String> {
        let uid = rec.uid.filter(|_| is_tpm_pin(rec))?;
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten()?.name;
        if self.is_pin_login(&user) || !crate::account::shadow(&user).ok().flatten()?.has_hash {
            return None;
        }
        Some(format!(
            "TPM protector {} ({}) of {user}: if its PIN is {user}'s login password (the PAM module tries that at \
             every login), the password hash in /etc/shadow makes the PIN testable offline, without the TPM's \
             limit; give it a PIN of its own, or make {user} a PIN-login account (docs/pam.md)",
            rec.name, rec.id
        ))
    }

    /// Ends `user`'s PIN login: their password stack is `pam_unix`'s again, and until an
    /// administrator sets a password (`passwd USER`) the account has none.
    pub fn disable_pin_login(&mut self, user: &str) -> Result<(), OpsError> {
        let mut config = self.config.clone();
        config.pam.pin_login.retain(|u| u != user);
        if config != self.config {
            config.save(&self.config_path)?;
            self.config = config;
        }
        Ok(())
    }
}

/// Resolves `--user` (a name or a numeric uid) without trusting the environment.
pub fn lookup_user(user: &str) -> Result<(u32, PathBuf), OpsError> {
    let found = if let Ok(uid) = user.parse::<u32>() {
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
    } else {
        nix::unistd::User::from_name(user)
    };
    match found {
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.dir)),
        _ => Err(OpsError::NoSuchUser(user.to_string())),
    }
}
