//! The keystore: one JSON file per protector and per policy under a root-only directory
//! (docs/formats.md). Files are parsed into records that cannot hold bad states: the id in a
//! file must match its name, sizes are fixed, KDF costs are bounded. One bad file yields an error
//! naming it and never hides the others.
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::format::{check_header, FORMAT_VERSION};
use crate::ids::{KeyIdentifier, ProtectorId};
use crate::protector;
pub use crate::protector::{ProtectorKind, ProtectorRecord};
use crate::secret::{MasterKey, ProtectorKey, MASTER_KEY_LEN};
use crate::securefile::{self, Privacy, SecureFileError};
use crate::wrap::{self, Kek, WrapError, Wrapped};

const POLICY_FORMAT: &str = "dirseal-policy";
const MAX_FILE_BYTES: u64 = 256 * 1024;
/// How long a medium's keystore lock is waited for. dirseal holds it only while it writes a few
/// small files; someone holding it longer (a medium's lock is not this machine's to trust) gets an
/// error rather than root stalled for ever.
const MEDIUM_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why the keystore could not be read or changed; each names the file or record concerned.
#[derive(Debug, thiserror::Error)]
pub enum KeystoreError {
    /// No record with that id.
    #[error("no {kind} {id} in the keystore")]
    NotFound {
        /// What was looked for ("protector", "policy").
        kind: &'static str,
        /// The id asked for, as given.
        id: String,
    },
    /// A file failed to parse or to pass the record's checks.
    #[error("keystore file {path} is corrupt ({reason}); restore it from a backup, or remove it and re-create what it held (a directory's policy comes back from its recovery key)")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The file or directory itself was refused or could not be read or written.
    #[error("keystore: {0}")]
    File(#[from] SecureFileError),
    /// A protector still wraps the master key of some policies, so it cannot be removed.
    #[error("protector {id} still protects {policies}; remove it from those first")]
    InUse {
        /// The protector.
        id: ProtectorId,
        /// The policies it protects, listed for the message.
        policies: String,
    },
    /// Whether a protector is in use cannot be told because a policy file is unreadable.
    #[error("cannot tell whether {path} uses protector {id} because that file is unreadable ({reason}); fix or remove that file first")]
    Undecidable {
        /// The protector to be removed.
        id: ProtectorId,
        /// The unreadable policy file.
        path: PathBuf,
        /// Why it cannot be read.
        reason: String,
    },
    /// Removing this protector would leave the policy with none.
    #[error("policy {policy} has no other usable protector; add another one first so the data stays reachable")]
    LastProtector {
        /// The policy.
        policy: KeyIdentifier,
    },
    /// The policy does not list the protector.
    #[error("policy {policy} has no entry for protector {protector}")]
    NoEntry {
        /// The policy.
        policy: KeyIdentifier,
        /// The protector asked for.
        protector: ProtectorId,
    },
    /// The protector's entry in the policy does not authenticate with that protector's key.
    #[error("the entry for protector {protector} in policy {policy} does not open with that protector: the policy file was altered or copied from elsewhere; restore it from a backup or use the recovery key")]
    EntryMismatch {
        /// The policy.
        policy: KeyIdentifier,
        /// The protector whose entry failed.
        protector: ProtectorId,
    },
}

/// A policy file (`policies/ID.json`): one directory's master key, wrapped once per protector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRecord {
    /// The fscrypt key identifier of the master key: the kernel's name for the policy.
    pub id: KeyIdentifier,
    /// Where the directory was when the policy was made (informational: directories move).
    pub path_hint: Option<PathBuf>,
    /// The master key wrapped by each protector's key.
    pub wrapped: BTreeMap<ProtectorId, Wrapped>,
    /// Where the record was read from: the mount point of the medium whose `.dirseal/portable`
    /// holds it (a portable directory), or `None` for the machine's keystore. Not stored.
    pub medium: Option<PathBuf>,
}

fn policy_aad(policy: &KeyIdentifier, protector: &ProtectorId) -> Vec<u8> {
    format!("dirseal:{FORMAT_VERSION}:policy:{policy}:protector:{protector}").into_bytes()
}

fn protector_kek(pkey: &ProtectorKey) -> Kek {
    Kek::from_slice(pkey.as_bytes())
}

impl PolicyRecord {
    /// A policy with no protectors yet; [`PolicyRecord::add_protector`] gives it its first.
    pub fn new(id: KeyIdentifier, path_hint: Option<PathBuf>) -> PolicyRecord {
        PolicyRecord { id, path_hint, wrapped: BTreeMap::new(), medium: None }
    }

    /// Wraps `master` for protector `pid` (replacing an existing entry for it).
    pub fn add_protector(&mut self, pid: &ProtectorId, pkey: &ProtectorKey, master: &MasterKey) {
        let w = wrap::seal(&protector_kek(pkey), &policy_aad(&self.id, pid), master.as_bytes());
        self.wrapped.insert(*pid, w);
    }

    pub(crate) fn unwrap_master(&self, pid: &ProtectorId, pkey: &ProtectorKey) -> Result<MasterKey, KeystoreError> {
        let w = self.wrapped.get(pid).ok_or(KeystoreError::NoEntry { policy: self.id, protector: *pid })?;
        match wrap::open(&protector_kek(pkey), &policy_aad(&self.id, pid), w, MASTER_KEY_LEN) {
            // Invariant: `open` checked the plaintext is MASTER_KEY_LEN bytes.
            Ok(bytes) => Ok(MasterKey::from_slice(&bytes).expect("length checked by wrap::open")),
            Err(WrapError::Authentication | WrapError::Length { .. }) => {
                Err(KeystoreError::EntryMismatch { policy: self.id, protector: *pid })
            }
        }
    }

    pub(crate) fn remove_protector(&mut self, pid: &ProtectorId) -> Result<(), KeystoreError> {
        if !self.wrapped.contains_key(pid) {
            return Err(KeystoreError::NoEntry { policy: self.id, protector: *pid });
        }
        if self.wrapped.len() == 1 {
            return Err(KeystoreError::LastProtector { policy: self.id });
        }
        self.wrapped.remove(pid);
        Ok(())
    }
}

// ---- On-disk forms. Parsed strictly, then converted into the records above. ----

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    format: String,
    version: u32,
    id: KeyIdentifier,
    #[serde(default)]
    path_hint: Option<PathBuf>,
    protectors: BTreeMap<ProtectorId, Wrapped>,
}

fn parse_policy(bytes: &[u8], file_id: &KeyIdentifier) -> Result<PolicyRecord, String> {
    let f: PolicyFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    check_header(&f.format, f.version, POLICY_FORMAT)?;
    if f.id != *file_id {
        return Err(format!("it holds policy {} but is named for {file_id}", f.id));
    }
    if f.protectors.is_empty() {
        return Err("it lists no protectors".into());
    }
    if f.protectors.values().any(|w| w.ciphertext.len() != MASTER_KEY_LEN + wrap::TAG_LEN) {
        return Err("a wrapped master key has the wrong length".into());
    }
    Ok(PolicyRecord { id: f.id, path_hint: f.path_hint, wrapped: f.protectors, medium: None })
}

fn policy_json(r: &PolicyRecord) -> Vec<u8> {
    let f = PolicyFile {
        format: POLICY_FORMAT.into(),
        version: FORMAT_VERSION,
        id: r.id,
        path_hint: r.path_hint.clone(),
        protectors: r.wrapped.clone(),
    };
    // Invariant: as above.
    serde_json::to_vec_pretty(&f).expect("serialising a policy cannot fail")
}

/// Every record of one kind, each parsed or with the error that names its file.
pub(crate) type Listing<I, R> = Vec<(I, Result<R, KeystoreError>)>;

/// Held while a command reads, modifies and writes keystore files.
pub struct KeystoreLock {
    _lock: nix::fcntl::Flock<File>,
}

/// The keystore directory (`protectors/`, `policies/`, `.lock`); reads and writes its records.
/// A portable directory's medium has one of its own (crate::portable), read the same way.
#[derive(Clone, Debug)]
pub struct Keystore {
    root: PathBuf,
    /// The medium's mount point when this is a medium's keystore; its policies say so.
    medium: Option<PathBuf>,
}

impl Keystore {
    /// Opens the keystore at `root`, creating it (0700, root) if missing. Its directories and
    /// files must be root's alone ([`Privacy::OwnerOnly`]), here as on a medium.
    pub fn open(root: &Path) -> Result<Keystore, KeystoreError> {
        securefile::ensure_dir(root, Privacy::OwnerOnly)?;
        securefile::ensure_dir(&root.join("protectors"), Privacy::OwnerOnly)?;
        securefile::ensure_dir(&root.join("policies"), Privacy::OwnerOnly)?;
        Ok(Keystore { root: root.to_path_buf(), medium: None })
    }

    /// Opens without creating anything (for the PAM module and read-only status): a missing
    /// keystore is an empty one.
    pub(crate) fn open_existing(root: &Path) -> Result<Keystore, KeystoreError> {
        match securefile::check_dir(root, Privacy::OwnerOnly) {
            Ok(()) | Err(SecureFileError::NotFound { .. }) => Ok(Keystore { root: root.to_path_buf(), medium: None }),
            Err(e) => Err(e.into()),
        }
    }

    /// The keystore directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// This keystore as the one on the medium mounted at `mp`.
    pub(crate) fn on_medium(mut self, mp: &Path) -> Keystore {
        self.medium = Some(mp.to_path_buf());
        self
    }

    /// The mount point of the medium this keystore is on; `None` for the machine's.
    pub fn medium(&self) -> Option<&Path> {
        self.medium.as_deref()
    }

    /// Takes the keystore lock, for a read-modify-write of its files: waiting as long as it takes
    /// for this machine's (only root can open it), at most [`MEDIUM_LOCK_WAIT`] for a medium's.
    pub fn lock(&self) -> Result<KeystoreLock, KeystoreError> {
        let path = self.root.join(".lock");
        let wait = self.medium.is_some().then_some(MEDIUM_LOCK_WAIT);
        Ok(KeystoreLock { _lock: securefile::lock_file_within(&path, Privacy::OwnerOnly, wait)? })
    }

    pub(crate) fn protector_path(&self, id: &ProtectorId) -> PathBuf {
        self.root.join("protectors").join(format!("{id}.json"))
    }

    pub(crate) fn policy_path(&self, id: &KeyIdentifier) -> PathBuf {
        self.root.join("policies").join(format!("{id}.json"))
    }

    fn read(&self, path: &Path, kind: &'static str, id: String) -> Result<Vec<u8>, KeystoreError> {
        match securefile::read_file(path, MAX_FILE_BYTES, Privacy::OwnerOnly) {
            Ok(b) => Ok(b),
            Err(SecureFileError::NotFound { .. }) => Err(KeystoreError::NotFound { kind, id }),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads and checks the protector record `id`.
    pub fn protector(&self, id: &ProtectorId) -> Result<ProtectorRecord, KeystoreError> {
        let path = self.protector_path(id);
        let bytes = self.read(&path, "protector", id.to_string())?;
        protector::parse(&bytes, id).map_err(|reason| KeystoreError::Corrupt { path, reason })
    }

    pub(crate) fn policy(&self, id: &KeyIdentifier) -> Result<PolicyRecord, KeystoreError> {
        let path = self.policy_path(id);
        let bytes = self.read(&path, "policy", id.to_string())?;
        let mut rec = parse_policy(&bytes, id).map_err(|reason| KeystoreError::Corrupt { path, reason })?;
        rec.medium.clone_from(&self.medium);
        Ok(rec)
    }

    /// The ids named by the `*.json` files of a subdirectory, sorted. Other files are ignored.
    fn ids<T: std::str::FromStr + Ord>(&self, sub: &str) -> Result<Vec<T>, KeystoreError> {
        let dir = self.root.join(sub);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(SecureFileError::Io { path: dir, op: "list", source }.into()),
        };
        let mut ids: Vec<T> =
            entries.flatten().filter_map(|e| e.file_name().to_str()?.strip_suffix(".json")?.parse().ok()).collect();
        ids.sort();
        Ok(ids)
    }

    /// Every protector, each readable or not.
    pub fn protectors(&self) -> Result<Listing<ProtectorId, ProtectorRecord>, KeystoreError> {
        Ok(self.ids::<ProtectorId>("protectors")?.into_iter().map(|id| (id, self.protector(&id))).collect())
    }

    /// Every policy, each readable or not.
    pub fn policies(&self) -> Result<Listing<KeyIdentifier, PolicyRecord>, KeystoreError> {
        Ok(self.ids::<KeyIdentifier>("policies")?.into_iter().map(|id| (id, self.policy(&id))).collect())
    }

    /// Policies that list protector `id`.
    pub(crate) fn policies_using(&self, id: &ProtectorId) -> Result<Vec<KeyIdentifier>, KeystoreError> {
        let mut using = Vec::new();
        for (pid, p) in self.policies()? {
            match p {
                Ok(p) if p.wrapped.contains_key(id) => using.push(pid),
                Ok(_) => {}
                Err(e) => {
                    return Err(KeystoreError::Undecidable {
                        id: *id,
                        path: self.policy_path(&pid),
                        reason: e.to_string(),
                    })
                }
            }
        }
        Ok(using)
    }

    /// Callers hold [`Keystore::lock`].
    pub fn save_protector(&self, r: &ProtectorRecord) -> Result<(), KeystoreError> {
        securefile::write_atomic(&self.protector_path(&r.id), &protector::to_json(r))?;
        Ok(())
    }

    /// Callers hold [`Keystore::lock`].
    pub fn save_policy(&self, r: &PolicyRecord) -> Result<(), KeystoreError> {
        securefile::write_atomic(&self.policy_path(&r.id), &policy_json(r))?;
        Ok(())
    }

    /// Deletes a protector that no policy uses. Callers hold [`Keystore::lock`].
    pub(crate) fn remove_protector(&self, id: &ProtectorId) -> Result<(), KeystoreError> {
        let path = self.protector_path(id);
        if !path.exists() {
            return Err(KeystoreError::NotFound { kind: "protector", id: id.to_string() });
        }
        let using = self.policies_using(id)?;
        if !using.is_empty() {
            let policies = using.iter().map(|p| format!("policy {p}")).collect::<Vec<_>>().join(", ");
            return Err(KeystoreError::InUse { id: *id, policies });
        }
        securefile::remove_durable(&path)?;
        Ok(())
    }

    /// Deletes a policy record (its directory becomes unreachable except by a recovery key).
    /// Callers hold [`Keystore::lock`].
    pub(crate) fn remove_policy(&self, id: &KeyIdentifier) -> Result<(), KeystoreError> {
        match securefile::remove_durable(&self.policy_path(id)) {
            Ok(()) => Ok(()),
            Err(SecureFileError::NotFound { .. }) => {
                Err(KeystoreError::NotFound { kind: "policy", id: id.to_string() })
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protector::tests::new_password;

    #[test]
    fn protectors_and_policies_many_to_many() {
        let d = tempfile::tempdir().unwrap();
        let ks = Keystore::open(&d.path().join("ks")).unwrap();
        let _l = ks.lock().unwrap();
        let (a, ka) = new_password("alice", Some(300001), "a");
        let (b, kb) = new_password("bob", None, "b");
        ks.save_protector(&a).unwrap();
        ks.save_protector(&b).unwrap();
        let m1 = MasterKey::random();
        let m2 = MasterKey::random();
        let mut p1 = PolicyRecord::new(crate::fscrypt::key_identifier(&m1), Some("/x".into()));
        p1.add_protector(&a.id, &ka, &m1);
        p1.add_protector(&b.id, &kb, &m1);
        let mut p2 = PolicyRecord::new(crate::fscrypt::key_identifier(&m2), None);
        p2.add_protector(&a.id, &ka, &m2);
        ks.save_policy(&p1).unwrap();
        ks.save_policy(&p2).unwrap();

        let a2 = ks.protector(&a.id).unwrap();
        assert_eq!(a2, a);
        assert!(ks.policy(&p1.id).unwrap().unwrap_master(&a.id, &ka).unwrap() == m1);
        assert!(ks.policy(&p2.id).unwrap().unwrap_master(&a.id, &ka).unwrap() == m2);
        assert!(p1.unwrap_master(&b.id, &kb).unwrap() == m1);
        assert!(matches!(p2.unwrap_master(&b.id, &kb), Err(KeystoreError::NoEntry { .. })));

        assert!(matches!(ks.remove_protector(&a.id), Err(KeystoreError::InUse { .. })));
        let mut p2b = ks.policy(&p2.id).unwrap();
        assert!(matches!(p2b.remove_protector(&a.id), Err(KeystoreError::LastProtector { .. })));
        p2b.add_protector(&b.id, &kb, &m2);
        p2b.remove_protector(&a.id).unwrap();
        ks.save_policy(&p2b).unwrap();
        let mut p1b = ks.policy(&p1.id).unwrap();
        p1b.remove_protector(&a.id).unwrap();
        ks.save_policy(&p1b).unwrap();
        ks.remove_protector(&a.id).unwrap();
        assert!(matches!(ks.protector(&a.id), Err(KeystoreError::NotFound { .. })));
        assert_eq!(ks.protectors().unwrap().len(), 1);
        assert_eq!(ks.policies().unwrap().len(), 2);
    }

    #[test]
    fn a_master_key_does_not_move_between_policies() {
        let (a, ka) = new_password("a", None, "p");
        let m = MasterKey::random();
        let mut p = PolicyRecord::new(crate::fscrypt::key_identifier(&m), None);
        p.add_protector(&a.id, &ka, &m);
        let other = MasterKey::random();
        let mut q = PolicyRecord::new(crate::fscrypt::key_identifier(&other), None);
        q.wrapped = p.wrapped.clone();
        assert!(matches!(q.unwrap_master(&a.id, &ka), Err(KeystoreError::EntryMismatch { .. })));
    }

    #[test]
    fn corrupt_files_are_named_and_isolated() {
        let d = tempfile::tempdir().unwrap();
        let ks = Keystore::open(&d.path().join("ks")).unwrap();
        let (a, _) = new_password("a", None, "p");
        let (b, _) = new_password("b", None, "p");
        ks.save_protector(&a).unwrap();
        ks.save_protector(&b).unwrap();
        let path = ks.protector_path(&a.id);
        let good = std::fs::read(&path).unwrap();
        let cases: Vec<Vec<u8>> = vec![
            good[..good.len() / 2].to_vec(),
            b"".to_vec(),
            b"\xff\xfe".to_vec(),
            String::from_utf8(good.clone()).unwrap().replace("\"version\": 1", "\"version\": 9").into_bytes(),
            String::from_utf8(good.clone()).unwrap().replace(&a.id.to_string(), &b.id.to_string()).into_bytes(),
            String::from_utf8(good.clone()).unwrap().replace("\"time_cost\": 1", "\"time_cost\": 0").into_bytes(),
        ];
        for c in cases {
            securefile::write_atomic(&path, &c).unwrap();
            let e = ks.protector(&a.id).unwrap_err();
            assert!(matches!(e, KeystoreError::Corrupt { .. }), "{e}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
            assert!(ks.protector(&b.id).is_ok());
            let all = ks.protectors().unwrap();
            assert_eq!(all.len(), 2);
        }
    }
}
