//! The keystore: one JSON file per protector and per policy under a root-only directory
//! (docs/formats.md). Files are parsed into records that cannot hold bad states: the id in a
//! file must match its name, sizes are fixed, KDF costs are bounded. One bad file yields an error
//! naming it and never hides the others.
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ids::{KeyIdentifier, ProtectorId};
use crate::kdf::{self, Argon2Params, KdfError};
use crate::secret::{MasterKey, Passphrase, ProtectorKey, MASTER_KEY_LEN, PROTECTOR_KEY_LEN};
use crate::securefile::{self, SecureFileError};
use crate::wrap::{self, Kek, WrapError, Wrapped};

pub const FORMAT_VERSION: u32 = 1;
const PROTECTOR_FORMAT: &str = "dirseal-protector";
const POLICY_FORMAT: &str = "dirseal-policy";
const MAX_FILE_BYTES: u64 = 256 * 1024;
const MAX_NAME_CHARS: usize = 128;
const SALT_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum KeystoreError {
    #[error("no {kind} {id} in the keystore; `dirseal protector list` and `dirseal policy list` show what exists")]
    NotFound { kind: &'static str, id: String },
    #[error("keystore file {path} is corrupt ({reason}); restore it from a backup, or remove it and re-create what it held (for a directory's policy: `dirseal recovery restore DIR`)")]
    Corrupt { path: PathBuf, reason: String },
    #[error("keystore: {0}")]
    File(#[from] SecureFileError),
    #[error(
        "protector {id} still protects {policies}; remove it from those first with `dirseal policy remove-protector`"
    )]
    InUse { id: ProtectorId, policies: String },
    #[error("cannot tell whether {path} uses protector {id} because that file is unreadable ({reason}); fix or remove that file first")]
    Undecidable { id: ProtectorId, path: PathBuf, reason: String },
    #[error("policy {policy} has no other usable protector; add another one first (`dirseal policy add-protector`) so the data stays reachable")]
    LastProtector { policy: KeyIdentifier },
    #[error("incorrect password for protector {name} ({id}); nothing was changed")]
    IncorrectSecret { name: String, id: ProtectorId },
    #[error("policy {policy} has no entry for protector {protector}")]
    NoEntry { policy: KeyIdentifier, protector: ProtectorId },
    #[error("the entry for protector {protector} in policy {policy} does not open with that protector: the policy file was altered or copied from elsewhere; restore it from a backup or use the recovery key")]
    EntryMismatch { policy: KeyIdentifier, protector: ProtectorId },
    #[error("invalid protector name {name:?}: {reason}")]
    BadName { name: String, reason: &'static str },
    #[error(transparent)]
    Kdf(#[from] KdfError),
}

/// How a protector's key is wrapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtectorKind {
    /// Argon2id(password, salt) wraps the protector key.
    Password { salt: [u8; SALT_LEN], kdf: Argon2Params },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtectorRecord {
    pub id: ProtectorId,
    pub name: String,
    pub kind: ProtectorKind,
    /// The user this protector belongs to (its login password), if any.
    pub uid: Option<u32>,
    pub wrapped_key: Wrapped,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRecord {
    /// The fscrypt key identifier of the master key: the kernel's name for the policy.
    pub id: KeyIdentifier,
    /// Where the directory was when the policy was made (informational: directories move).
    pub path_hint: Option<PathBuf>,
    /// The master key wrapped by each protector's key.
    pub wrapped: BTreeMap<ProtectorId, Wrapped>,
}

fn protector_aad(id: &ProtectorId, kind: &ProtectorKind) -> Vec<u8> {
    match kind {
        ProtectorKind::Password { salt, kdf } => format!(
            "dirseal:{FORMAT_VERSION}:protector:{id}:password:{}:{}:{}:{}",
            hex::encode(salt),
            kdf.time_cost,
            kdf.memory_kib,
            kdf.parallelism
        )
        .into_bytes(),
    }
}

fn policy_aad(policy: &KeyIdentifier, protector: &ProtectorId) -> Vec<u8> {
    format!("dirseal:{FORMAT_VERSION}:policy:{policy}:protector:{protector}").into_bytes()
}

fn protector_kek(pkey: &ProtectorKey) -> Kek {
    Kek::from_slice(pkey.as_bytes())
}

fn check_name(name: &str) -> Result<(), KeystoreError> {
    let bad = |reason| Err(KeystoreError::BadName { name: name.chars().take(MAX_NAME_CHARS).collect(), reason });
    if name.trim().is_empty() {
        return bad("it is empty");
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return bad("it is longer than 128 characters");
    }
    if name.chars().any(char::is_control) {
        return bad("it contains control characters");
    }
    Ok(())
}

/// A new password protector with a fresh random key, salt and id.
pub fn new_password_protector(
    name: &str,
    uid: Option<u32>,
    password: &Passphrase,
    params: Argon2Params,
) -> Result<(ProtectorRecord, ProtectorKey), KeystoreError> {
    check_name(name)?;
    let id = ProtectorId::random();
    let key = ProtectorKey::random();
    let kind = ProtectorKind::Password { salt: rand::random(), kdf: params };
    let wrapped_key = wrap_password(&id, &kind, password, &key)?;
    Ok((ProtectorRecord { id, name: name.to_string(), kind, uid, wrapped_key }, key))
}

fn wrap_password(
    id: &ProtectorId,
    kind: &ProtectorKind,
    password: &Passphrase,
    key: &ProtectorKey,
) -> Result<Wrapped, KeystoreError> {
    let ProtectorKind::Password { salt, kdf } = kind;
    let kek = kdf::derive(password, salt, *kdf)?;
    Ok(wrap::seal(&kek, &protector_aad(id, kind), key.as_bytes()))
}

/// Unwraps a password protector's key. A wrong password changes nothing.
pub fn unlock_protector(rec: &ProtectorRecord, password: &Passphrase) -> Result<ProtectorKey, KeystoreError> {
    let ProtectorKind::Password { salt, kdf } = &rec.kind;
    let kek = kdf::derive(password, salt, *kdf)?;
    match wrap::open(&kek, &protector_aad(&rec.id, &rec.kind), &rec.wrapped_key, PROTECTOR_KEY_LEN) {
        // Invariant: `open` checked the plaintext is PROTECTOR_KEY_LEN bytes.
        Ok(bytes) => Ok(ProtectorKey::from_slice(&bytes).expect("length checked by wrap::open")),
        Err(_) => Err(KeystoreError::IncorrectSecret { name: rec.name.clone(), id: rec.id }),
    }
}

/// The same protector (same id and key, so every policy it protects keeps working) under a new
/// password, salt and cost.
pub fn rewrap_password(
    rec: &ProtectorRecord,
    key: &ProtectorKey,
    new_password: &Passphrase,
    params: Argon2Params,
) -> Result<ProtectorRecord, KeystoreError> {
    let kind = ProtectorKind::Password { salt: rand::random(), kdf: params };
    let wrapped_key = wrap_password(&rec.id, &kind, new_password, key)?;
    Ok(ProtectorRecord { kind, wrapped_key, ..rec.clone() })
}

impl PolicyRecord {
    pub fn new(id: KeyIdentifier, path_hint: Option<PathBuf>) -> PolicyRecord {
        PolicyRecord { id, path_hint, wrapped: BTreeMap::new() }
    }

    /// Wraps `master` for protector `pid` (replacing an existing entry for it).
    pub fn add_protector(&mut self, pid: &ProtectorId, pkey: &ProtectorKey, master: &MasterKey) {
        let w = wrap::seal(&protector_kek(pkey), &policy_aad(&self.id, pid), master.as_bytes());
        self.wrapped.insert(*pid, w);
    }

    pub fn unwrap_master(&self, pid: &ProtectorId, pkey: &ProtectorKey) -> Result<MasterKey, KeystoreError> {
        let w = self.wrapped.get(pid).ok_or(KeystoreError::NoEntry { policy: self.id, protector: *pid })?;
        match wrap::open(&protector_kek(pkey), &policy_aad(&self.id, pid), w, MASTER_KEY_LEN) {
            // Invariant: `open` checked the plaintext is MASTER_KEY_LEN bytes.
            Ok(bytes) => Ok(MasterKey::from_slice(&bytes).expect("length checked by wrap::open")),
            Err(WrapError::Authentication | WrapError::Length { .. }) => {
                Err(KeystoreError::EntryMismatch { policy: self.id, protector: *pid })
            }
        }
    }

    pub fn remove_protector(&mut self, pid: &ProtectorId) -> Result<(), KeystoreError> {
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
struct ProtectorFile {
    format: String,
    version: u32,
    id: ProtectorId,
    name: String,
    #[serde(default)]
    uid: Option<u32>,
    kind: KindFile,
    wrapped_key: Wrapped,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum KindFile {
    Password {
        #[serde(with = "hex::serde")]
        salt: [u8; SALT_LEN],
        argon2: Argon2Params,
    },
}

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

fn check_header(format: &str, version: u32, want: &str) -> Result<(), String> {
    if format != want {
        return Err(format!("format is {format:?}, expected {want:?}"));
    }
    if version != FORMAT_VERSION {
        return Err(format!("format version {version} is not supported by this dirseal (it reads version {FORMAT_VERSION}); use a matching dirseal"));
    }
    Ok(())
}

fn parse_protector(bytes: &[u8], file_id: &ProtectorId) -> Result<ProtectorRecord, String> {
    let f: ProtectorFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    check_header(&f.format, f.version, PROTECTOR_FORMAT)?;
    if f.id != *file_id {
        return Err(format!("it holds protector {} but is named for {file_id}", f.id));
    }
    check_name(&f.name).map_err(|e| e.to_string())?;
    let kind = match f.kind {
        KindFile::Password { salt, argon2 } => {
            argon2.check().map_err(|e| e.to_string())?;
            ProtectorKind::Password { salt, kdf: argon2 }
        }
    };
    if f.wrapped_key.ciphertext.len() != PROTECTOR_KEY_LEN + wrap::TAG_LEN {
        return Err("the wrapped key has the wrong length".into());
    }
    Ok(ProtectorRecord { id: f.id, name: f.name, kind, uid: f.uid, wrapped_key: f.wrapped_key })
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
    Ok(PolicyRecord { id: f.id, path_hint: f.path_hint, wrapped: f.protectors })
}

fn protector_json(r: &ProtectorRecord) -> Vec<u8> {
    let ProtectorKind::Password { salt, kdf } = &r.kind;
    let f = ProtectorFile {
        format: PROTECTOR_FORMAT.into(),
        version: FORMAT_VERSION,
        id: r.id,
        name: r.name.clone(),
        uid: r.uid,
        kind: KindFile::Password { salt: *salt, argon2: *kdf },
        wrapped_key: r.wrapped_key.clone(),
    };
    // Invariant: these structs hold only strings, integers and maps with string keys.
    serde_json::to_vec_pretty(&f).expect("serialising a protector cannot fail")
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
pub type Listing<I, R> = Vec<(I, Result<R, KeystoreError>)>;

/// Held while a command reads, modifies and writes keystore files.
pub struct KeystoreLock {
    _lock: nix::fcntl::Flock<File>,
}

pub struct Keystore {
    root: PathBuf,
}

impl Keystore {
    /// Opens the keystore at `root`, creating it (0700, root) if missing.
    pub fn open(root: &Path) -> Result<Keystore, KeystoreError> {
        securefile::ensure_private_dir(root)?;
        securefile::ensure_private_dir(&root.join("protectors"))?;
        securefile::ensure_private_dir(&root.join("policies"))?;
        Ok(Keystore { root: root.to_path_buf() })
    }

    /// Opens without creating anything (for the PAM module and read-only status): a missing
    /// keystore is an empty one.
    pub fn open_existing(root: &Path) -> Result<Keystore, KeystoreError> {
        match securefile::check_private_dir(root) {
            Ok(()) | Err(SecureFileError::NotFound { .. }) => Ok(Keystore { root: root.to_path_buf() }),
            Err(e) => Err(e.into()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn lock(&self) -> Result<KeystoreLock, KeystoreError> {
        Ok(KeystoreLock { _lock: securefile::lock_file(&self.root.join(".lock"))? })
    }

    fn protector_path(&self, id: &ProtectorId) -> PathBuf {
        self.root.join("protectors").join(format!("{id}.json"))
    }

    fn policy_path(&self, id: &KeyIdentifier) -> PathBuf {
        self.root.join("policies").join(format!("{id}.json"))
    }

    fn read(&self, path: &Path, kind: &'static str, id: String) -> Result<Vec<u8>, KeystoreError> {
        match securefile::read_private(path, MAX_FILE_BYTES) {
            Ok(b) => Ok(b),
            Err(SecureFileError::NotFound { .. }) => Err(KeystoreError::NotFound { kind, id }),
            Err(e) => Err(e.into()),
        }
    }

    pub fn protector(&self, id: &ProtectorId) -> Result<ProtectorRecord, KeystoreError> {
        let path = self.protector_path(id);
        let bytes = self.read(&path, "protector", id.to_string())?;
        parse_protector(&bytes, id).map_err(|reason| KeystoreError::Corrupt { path, reason })
    }

    pub fn policy(&self, id: &KeyIdentifier) -> Result<PolicyRecord, KeystoreError> {
        let path = self.policy_path(id);
        let bytes = self.read(&path, "policy", id.to_string())?;
        parse_policy(&bytes, id).map_err(|reason| KeystoreError::Corrupt { path, reason })
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

    pub fn policies(&self) -> Result<Listing<KeyIdentifier, PolicyRecord>, KeystoreError> {
        Ok(self.ids::<KeyIdentifier>("policies")?.into_iter().map(|id| (id, self.policy(&id))).collect())
    }

    /// Policies that list protector `id`.
    pub fn policies_using(&self, id: &ProtectorId) -> Result<Vec<KeyIdentifier>, KeystoreError> {
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
        securefile::write_atomic(&self.protector_path(&r.id), &protector_json(r))?;
        Ok(())
    }

    /// Callers hold [`Keystore::lock`].
    pub fn save_policy(&self, r: &PolicyRecord) -> Result<(), KeystoreError> {
        securefile::write_atomic(&self.policy_path(&r.id), &policy_json(r))?;
        Ok(())
    }

    /// Deletes a protector that no policy uses. Callers hold [`Keystore::lock`].
    pub fn remove_protector(&self, id: &ProtectorId) -> Result<(), KeystoreError> {
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
    pub fn remove_policy(&self, id: &KeyIdentifier) -> Result<(), KeystoreError> {
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

    const FAST: Argon2Params = Argon2Params { time_cost: 1, memory_kib: kdf::MIN_MEMORY_KIB, parallelism: 1 };

    fn pw(s: &str) -> Passphrase {
        Passphrase::from_str_copy(s)
    }

    #[test]
    fn protectors_and_policies_many_to_many() {
        let d = tempfile::tempdir().unwrap();
        let ks = Keystore::open(&d.path().join("ks")).unwrap();
        let _l = ks.lock().unwrap();
        let (a, ka) = new_password_protector("alice", Some(300001), &pw("a"), FAST).unwrap();
        let (b, kb) = new_password_protector("bob", None, &pw("b"), FAST).unwrap();
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
        let ka2 = unlock_protector(&a2, &pw("a")).unwrap();
        assert!(ks.policy(&p1.id).unwrap().unwrap_master(&a.id, &ka2).unwrap() == m1);
        assert!(ks.policy(&p2.id).unwrap().unwrap_master(&a.id, &ka2).unwrap() == m2);
        let kb2 = unlock_protector(&ks.protector(&b.id).unwrap(), &pw("b")).unwrap();
        assert!(p1.unwrap_master(&b.id, &kb2).unwrap() == m1);
        assert!(matches!(p2.unwrap_master(&b.id, &kb2), Err(KeystoreError::NoEntry { .. })));

        let Err(e) = unlock_protector(&a2, &pw("wrong")) else { panic!("a wrong password unlocked") };
        assert_eq!(e.to_string(), format!("incorrect password for protector alice ({}); nothing was changed", a.id));

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
    fn rewrap_keeps_the_key() {
        let (a, ka) = new_password_protector("a", None, &pw("old"), FAST).unwrap();
        let a2 = rewrap_password(&a, &ka, &pw("new"), FAST).unwrap();
        assert_eq!(a2.id, a.id);
        assert!(unlock_protector(&a2, &pw("old")).is_err());
        assert!(unlock_protector(&a2, &pw("new")).unwrap() == ka);
    }

    #[test]
    fn tampering_is_detected() {
        let (a, ka) = new_password_protector("a", None, &pw("p"), FAST).unwrap();
        // Raising the cost in the file (or lowering it) breaks the binding, not just the speed.
        let mut t = a.clone();
        t.kind = ProtectorKind::Password { salt: [0; 16], kdf: Argon2Params { time_cost: 2, ..FAST } };
        assert!(unlock_protector(&t, &pw("p")).is_err());
        // A master key wrapped for one policy does not open as another's.
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
        let (a, _) = new_password_protector("a", None, &pw("p"), FAST).unwrap();
        let (b, _) = new_password_protector("b", None, &pw("p"), FAST).unwrap();
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

    #[test]
    fn names_are_checked() {
        assert!(new_password_protector("", None, &pw("p"), FAST).is_err());
        assert!(new_password_protector("a\nb", None, &pw("p"), FAST).is_err());
        assert!(new_password_protector(&"x".repeat(129), None, &pw("p"), FAST).is_err());
    }
}
