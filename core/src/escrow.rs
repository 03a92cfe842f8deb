//! Escrow of recovery keys to an organisation's public keys (`[escrow]`, docs/fleet.md): each
//! recovery key, when it is made, is encrypted with age to every configured recipient (age
//! X25519 `age1…`, `ssh-ed25519`, `ssh-rsa`) and kept as `<dir>/<policy>.age`, a plain age file
//! that `age -d -i IDENTITY` opens. Beside it `<policy>.json` says in plain text what the record
//! is for (host, user, directory, recipients' fingerprints, the age file's SHA-256), so an agent
//! can index records and `recovery escrow --check` can tell a stale or changed one without any
//! secret. Nothing secret is in the clear: the key is only in the age file.
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::ids::KeyIdentifier;
use crate::recovery::RecoveryKey;
use crate::securefile::{self, Privacy, SecureFileError};

/// Where records go unless `[escrow] dir` says otherwise: this directory of the keystore.
pub const DEFAULT_DIR_NAME: &str = "escrow";
const HEADER_FORMAT: &str = "dirseal-escrow";
const PAYLOAD_FORMAT: &str = "dirseal-escrow-payload";
const VERSION: u32 = 1;
/// No header is this long; anything longer is not one.
const MAX_HEADER: u64 = 64 * 1024;
/// An age file to a few dozen recipients (an ssh-rsa stanza is under 1 KiB) and a small payload.
const MAX_RECORD: u64 = 1024 * 1024;

/// One public key records are encrypted to, parsed when the config is read.
#[derive(Clone, Debug)]
pub struct Recipient {
    key: Key,
}

#[derive(Clone, Debug)]
enum Key {
    X25519(age::x25519::Recipient),
    Ssh(age::ssh::Recipient),
}

impl Recipient {
    /// How records and `--check` name it: the `age1…` string itself for an X25519 key, the
    /// `SHA256:…` fingerprint `ssh-keygen -l` prints for an ssh key.
    pub fn fingerprint(&self) -> String {
        match &self.key {
            Key::X25519(r) => r.to_string(),
            Key::Ssh(age::ssh::Recipient::SshEd25519(blob, _) | age::ssh::Recipient::SshRsa(blob, _)) => {
                use base64::Engine;
                format!("SHA256:{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(blob)))
            }
        }
    }

    fn as_age(&self) -> &dyn age::Recipient {
        match &self.key {
            Key::X25519(r) => r,
            Key::Ssh(r) => r,
        }
    }
}

impl PartialEq for Recipient {
    fn eq(&self, other: &Recipient) -> bool {
        self.fingerprint() == other.fingerprint()
    }
}
impl Eq for Recipient {}

impl FromStr for Recipient {
    type Err = String;
    fn from_str(s: &str) -> Result<Recipient, String> {
        let t = s.trim();
        let bad = |why: &str| format!("[escrow] recipient {t:?} {why}");
        if t.starts_with("age1") {
            let r = t
                .parse::<age::x25519::Recipient>()
                .map_err(|e| bad(&format!("is not a valid age X25519 recipient ({e})")))?;
            return Ok(Recipient { key: Key::X25519(r) });
        }
        if t.starts_with("ssh-") {
            use age::ssh::ParseRecipientKeyError as E;
            let r = t.parse::<age::ssh::Recipient>().map_err(|e| match e {
                E::RsaModulusTooSmall => bad("is an ssh-rsa key shorter than 2048 bits, which age refuses"),
                E::RsaModulusTooLarge => bad("is an ssh-rsa key longer than age supports"),
                E::Unsupported(kind) => bad(&format!("is an {kind} key; age takes ssh-ed25519 and ssh-rsa keys only")),
                E::Ignore | E::Invalid(_) => bad("is not a valid ssh-ed25519 or ssh-rsa public key"),
            })?;
            return Ok(Recipient { key: Key::Ssh(r) });
        }
        Err(bad("is neither an age X25519 recipient (age1…) nor an ssh-ed25519/ssh-rsa public key"))
    }
}

impl TryFrom<String> for Recipient {
    type Error = String;
    fn try_from(s: String) -> Result<Recipient, String> {
        s.parse()
    }
}

impl From<Recipient> for String {
    fn from(r: Recipient) -> String {
        match &r.key {
            Key::X25519(k) => k.to_string(),
            Key::Ssh(k) => k.to_string(),
        }
    }
}

impl Serialize for Recipient {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from(self.clone()))
    }
}

impl<'de> Deserialize<'de> for Recipient {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Recipient, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The `[escrow]` section of the config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscrowConfig {
    /// Whom every recovery key is encrypted to; none: no escrow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recipients: Vec<Recipient>,
    /// Where records go; default `escrow/` in the keystore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Refuse to encrypt a directory whose recovery key cannot be escrowed (and make a recovery
    /// key for every new one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
}

impl EscrowConfig {
    pub(crate) fn is_default(&self) -> bool {
        *self == EscrowConfig::default()
    }

    /// What is wrong with the section beyond its syntax, for [`crate::config::Config::load`].
    pub(crate) fn problem(&self) -> Option<String> {
        if self.required && self.recipients.is_empty() {
            return Some("[escrow] required = true needs at least one recipient".into());
        }
        match &self.dir {
            Some(d) if !d.is_absolute() => Some(format!("[escrow] dir {} is not an absolute path", d.display())),
            _ => None,
        }
    }
}

/// Why a record could not be written, read or checked.
#[derive(Debug, thiserror::Error)]
pub enum EscrowError {
    /// The record directory is unsafe (a symlink, not root's, writable by others) or unusable.
    #[error("cannot keep escrow records in {dir}: {source}; or set [escrow] dir in the config to a directory only root can write")]
    Dir {
        /// The record directory.
        dir: PathBuf,
        /// What the check said.
        source: SecureFileError,
    },
    /// The record directory refuses new files (read-only, immutable, full).
    #[error("cannot write escrow records in {dir}: {source}; make it writable (a read-only filesystem or `chattr +i` refuses them) or set [escrow] dir in the config")]
    Unwritable {
        /// The record directory.
        dir: PathBuf,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// Escrow is required and the person declined a recovery key.
    #[error("escrow is required on this machine ([escrow] required = true): every new encrypted directory gets a recovery key, escrowed before anything is encrypted; {dir} cannot go without one")]
    KeyRequired {
        /// The directory.
        dir: PathBuf,
    },
    /// Escrow is asked for on a machine whose config names no recipient.
    #[error("no escrow recipients are configured: add `recipients = [\"age1…\"]` (or ssh public keys) under [escrow] in the config")]
    NotConfigured,
    /// age refused to encrypt (its words).
    #[error("cannot encrypt the escrow record: {0}")]
    Encrypt(String),
    /// A record that is there cannot be used.
    #[error("escrow record {path} cannot be used: {reason}; `recovery escrow` on its directory writes it again")]
    Record {
        /// The record's file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The directory has no record.
    #[error("there is no escrow record for policy {policy} in {dir}")]
    NoRecord {
        /// The directory's policy.
        policy: KeyIdentifier,
        /// The record directory.
        dir: PathBuf,
    },
    /// An identity file given to open records is not one, or opens none.
    #[error("identity {path}: {reason}")]
    Identity {
        /// The identity file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// What a record says of the recovery key it holds: in its plain header and, with the key, in its
/// encrypted payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    /// The directory's policy (the record's file name).
    pub policy: KeyIdentifier,
    /// The directory when the key was made.
    pub directory: PathBuf,
    /// Its owner.
    pub uid: u32,
    /// The owner's login name, if the passwd database has one.
    pub user: Option<String>,
    /// The machine's host name.
    pub host: String,
    /// `/etc/machine-id`, if the machine has one.
    pub machine_id: Option<String>,
    /// When the record was written (seconds since the epoch).
    pub created_unix: u64,
    /// The recipients' fingerprints ([`Recipient::fingerprint`]), sorted.
    pub recipients: Vec<String>,
}

fn read_trimmed(p: &str) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// This machine's host name, as records and the report name it.
pub fn host_name() -> String {
    read_trimmed("/proc/sys/kernel/hostname").unwrap_or_default()
}

/// `/etc/machine-id`, if the machine has one.
pub fn machine_id() -> Option<String> {
    read_trimmed("/etc/machine-id")
}

/// Seconds since the epoch, now.
pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Context {
    /// The context of `dir` (policy `policy`, owned by `uid`) on this machine, now, for `recipients`.
    pub fn now(policy: KeyIdentifier, dir: &Path, uid: u32, recipients: &[Recipient]) -> Context {
        let mut fps: Vec<String> = recipients.iter().map(Recipient::fingerprint).collect();
        fps.sort();
        fps.dedup();
        Context {
            policy,
            directory: dir.to_path_buf(),
            uid,
            user: nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten().map(|u| u.name),
            host: host_name(),
            machine_id: machine_id(),
            created_unix: now_unix(),
            recipients: fps,
        }
    }
}

/// `<policy>.json`: what the record is, in the clear.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    format: String,
    version: u32,
    /// What the record is for.
    #[serde(flatten)]
    pub context: Context,
    /// The age file beside it.
    pub payload: String,
    /// The age file's SHA-256 (hex): a record changed after it was written is told without a key.
    pub payload_sha256: String,
}

/// The age file's plaintext: the key and the same context.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    format: String,
    version: u32,
    recovery_key: String,
    #[serde(flatten)]
    context: Context,
}

/// What `--check` and the report say of one directory's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum RecordStatus {
    /// Written for exactly the configured recipients, unchanged since.
    Current {
        /// Their fingerprints.
        recipients: Vec<String>,
        /// When it was written.
        created_unix: u64,
    },
    /// No record.
    Missing,
    /// Written for other recipients (the config changed since).
    OtherRecipients {
        /// The record's recipients.
        recipients: Vec<String>,
    },
    /// Unreadable, or changed after it was written.
    Damaged {
        /// What is wrong.
        reason: String,
    },
}

/// The machine's escrow: its recipients and where records go.
#[derive(Clone, Debug)]
pub struct Escrow {
    recipients: Vec<Recipient>,
    dir: PathBuf,
    required: bool,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Escrow {
    /// The escrow `config` asks for, records under `keystore_root` unless it names a dir; `None`
    /// when it names no recipient.
    pub fn new(config: &EscrowConfig, keystore_root: &Path) -> Option<Escrow> {
        if config.recipients.is_empty() {
            return None;
        }
        Some(Escrow {
            recipients: config.recipients.clone(),
            dir: config.dir.clone().unwrap_or_else(|| keystore_root.join(DEFAULT_DIR_NAME)),
            required: config.required,
        })
    }

    /// Where records go.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a directory whose key cannot be escrowed is refused.
    pub fn required(&self) -> bool {
        self.required
    }

    /// Whom records are encrypted to.
    pub fn recipients(&self) -> &[Recipient] {
        &self.recipients
    }

    /// The recipients' fingerprints, sorted, as records list them.
    pub fn fingerprints(&self) -> Vec<String> {
        let mut f: Vec<String> = self.recipients.iter().map(Recipient::fingerprint).collect();
        f.sort();
        f.dedup();
        f
    }

    fn paths(&self, policy: &KeyIdentifier) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("{policy}.age")), self.dir.join(format!("{policy}.json")))
    }

    fn checked_dir(&self) -> Result<(), EscrowError> {
        let refuse = |source| EscrowError::Dir { dir: self.dir.clone(), source };
        // Above it too: whoever may rename a directory on the way could swap in their own
        // between the check and the write. A sticky directory (/tmp) lets nobody rename root's.
        for up in self.dir.ancestors().skip(1) {
            use std::os::unix::fs::MetadataExt;
            let Ok(m) = std::fs::symlink_metadata(up) else { continue };
            let insecure = |reason: String| refuse(SecureFileError::Insecure { path: up.to_path_buf(), reason });
            if m.uid() != 0 && m.uid() != nix::unistd::geteuid().as_raw() {
                return Err(insecure(format!("a directory above the records is owned by uid {}", m.uid())));
            }
            if !m.file_type().is_symlink() && m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
                return Err(insecure(format!(
                    "a directory above the records has mode {:o}: group or others may write it",
                    m.mode() & 0o7777
                )));
            }
        }
        securefile::ensure_dir(&self.dir, Privacy::NotWritable).map_err(refuse)
    }

    /// Whether a record could be written now: the directory is safe (made if missing) and takes
    /// a file. Asked before anything is encrypted.
    pub fn preflight(&self) -> Result<(), EscrowError> {
        self.checked_dir()?;
        let probe = self.dir.join(format!(".probe.{}", hex::encode(rand::random::<[u8; 6]>())));
        let unwritable = |source| EscrowError::Unwritable { dir: self.dir.clone(), source };
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&probe)
            .map_err(unwritable)?;
        std::fs::remove_file(&probe).map_err(unwritable)
    }

    /// Writes the record of `key` (its age file, then its header; each atomically).
    pub fn write(&self, context: &Context, key: &RecoveryKey) -> Result<(), EscrowError> {
        self.checked_dir()?;
        let payload = Payload {
            format: PAYLOAD_FORMAT.into(),
            version: VERSION,
            recovery_key: key.to_display().to_string(),
            context: context.clone(),
        };
        // Sized once, so that no copy of the key is left behind by a growing buffer.
        let mut plain = Zeroizing::new(Vec::with_capacity(4096));
        serde_json::to_writer_pretty(&mut *plain, &payload).expect("serialising a payload cannot fail");
        // The String inside the payload held the key too.
        drop(Zeroizing::new(payload.recovery_key));
        let enc = age::Encryptor::with_recipients(self.recipients.iter().map(Recipient::as_age))
            .map_err(|e| EscrowError::Encrypt(e.to_string()))?;
        let mut sealed = Vec::new();
        let mut w = enc.wrap_output(&mut sealed).map_err(|e| EscrowError::Encrypt(e.to_string()))?;
        w.write_all(&plain).and_then(|()| w.finish().map(drop)).map_err(|e| EscrowError::Encrypt(e.to_string()))?;
        let (age_path, json_path) = self.paths(&context.policy);
        let header = Header {
            format: HEADER_FORMAT.into(),
            version: VERSION,
            context: context.clone(),
            payload: format!("{}.age", context.policy),
            payload_sha256: sha256_hex(&sealed),
        };
        let mut text = serde_json::to_vec_pretty(&header).expect("serialising a header cannot fail");
        text.push(b'\n');
        let dir_err = |source| EscrowError::Dir { dir: self.dir.clone(), source };
        securefile::write_atomic(&age_path, &sealed).map_err(dir_err)?;
        securefile::write_atomic(&json_path, &text).map_err(dir_err)
    }

    /// Removes `policy`'s record; `false` if there was none.
    pub fn remove(&self, policy: &KeyIdentifier) -> Result<bool, EscrowError> {
        let mut any = false;
        let (age_path, json_path) = self.paths(policy);
        // The header first: a crash between leaves an age file without header, which `--check`
        // reports, never a header that claims a record.
        for p in [json_path, age_path] {
            match securefile::remove_durable(&p) {
                Ok(()) => any = true,
                Err(SecureFileError::NotFound { .. }) => {}
                Err(source) => return Err(EscrowError::Dir { dir: self.dir.clone(), source }),
            }
        }
        Ok(any)
    }

    fn read(&self, path: &Path, max: u64) -> Result<Option<Vec<u8>>, EscrowError> {
        match securefile::read_file(path, max, Privacy::NotWritable) {
            Ok(b) => Ok(Some(b)),
            Err(SecureFileError::NotFound { .. }) => Ok(None),
            Err(e) => Err(EscrowError::Record { path: path.to_path_buf(), reason: e.to_string() }),
        }
    }

    /// `policy`'s header and age file, checked against each other; `None` without a record.
    fn record(&self, policy: &KeyIdentifier) -> Result<Option<(Header, Vec<u8>)>, EscrowError> {
        let (age_path, json_path) = self.paths(policy);
        let (text, sealed) = match (self.read(&json_path, MAX_HEADER)?, self.read(&age_path, MAX_RECORD)?) {
            (None, None) => return Ok(None),
            // A write or removal cut short between its two files.
            (None, Some(_)) => {
                return Err(EscrowError::Record { path: json_path, reason: "its header is missing".into() })
            }
            (Some(text), sealed) => (text, sealed),
        };
        let bad = |reason: String| EscrowError::Record { path: json_path.clone(), reason };
        let header: Header =
            serde_json::from_slice(&text).map_err(|e| bad(format!("its header does not parse: {e}")))?;
        if header.format != HEADER_FORMAT || header.version != VERSION {
            return Err(bad(format!(
                "it is {} version {}, not {HEADER_FORMAT} version {VERSION}",
                header.format, header.version
            )));
        }
        if header.context.policy != *policy {
            return Err(bad(format!("it is named for policy {policy} but says {}", header.context.policy)));
        }
        let sealed = sealed.ok_or_else(|| bad(format!("its encrypted part {} is missing", age_path.display())))?;
        if sha256_hex(&sealed) != header.payload_sha256 {
            return Err(EscrowError::Record {
                path: age_path,
                reason: "it was changed after it was written (its SHA-256 differs from its header's)".into(),
            });
        }
        Ok(Some((header, sealed)))
    }

    /// What `policy`'s record is, asking no secret.
    pub fn status(&self, policy: &KeyIdentifier) -> RecordStatus {
        match self.record(policy) {
            Ok(None) => RecordStatus::Missing,
            Err(e) => RecordStatus::Damaged { reason: e.to_string() },
            Ok(Some((h, _))) if h.context.recipients == self.fingerprints() => {
                RecordStatus::Current { recipients: h.context.recipients, created_unix: h.context.created_unix }
            }
            Ok(Some((h, _))) => RecordStatus::OtherRecipients { recipients: h.context.recipients },
        }
    }

    /// The recovery key in `policy`'s record, opened with `identity` (an age identity file, or an
    /// unencrypted ssh private key).
    pub fn open(&self, policy: &KeyIdentifier, identity: &Identity) -> Result<RecoveryKey, EscrowError> {
        let (_, sealed) =
            self.record(policy)?.ok_or_else(|| EscrowError::NoRecord { policy: *policy, dir: self.dir.clone() })?;
        let (age_path, _) = self.paths(policy);
        let bad = |reason: String| EscrowError::Record { path: age_path.clone(), reason };
        let dec = age::Decryptor::new(&sealed[..]).map_err(|e| bad(e.to_string()))?;
        let mut r = dec.decrypt(identity.ids.iter().map(|i| i.as_ref() as &dyn age::Identity)).map_err(|e| {
            EscrowError::Identity {
                path: identity.path.clone(),
                reason: format!("cannot open {}: {e}", age_path.display()),
            }
        })?;
        let mut plain = Zeroizing::new(Vec::new());
        r.read_to_end(&mut plain).map_err(|e| bad(e.to_string()))?;
        let p: Payload = serde_json::from_slice(&plain).map_err(|e| bad(format!("its payload does not parse: {e}")))?;
        let typed = Zeroizing::new(p.recovery_key);
        if p.format != PAYLOAD_FORMAT || p.context.policy != *policy {
            return Err(bad(format!("its payload is not a {PAYLOAD_FORMAT} for policy {policy}")));
        }
        RecoveryKey::parse(&typed).map_err(|e| bad(format!("its recovery key does not parse: {e}")))
    }
}

/// Secret keys that open records: an age identity file or an unencrypted ssh private key.
pub struct Identity {
    path: PathBuf,
    ids: Vec<Box<dyn age::Identity>>,
}

impl Identity {
    /// Reads `path` (root's, not writable by others).
    pub fn load(path: &Path) -> Result<Identity, EscrowError> {
        let bad = |reason: String| EscrowError::Identity { path: path.to_path_buf(), reason };
        let bytes = Zeroizing::new(securefile::read_private(path, MAX_HEADER).map_err(|e| bad(e.to_string()))?);
        if let Ok(f) = age::IdentityFile::from_buffer(&bytes[..]) {
            let ids = f.into_identities().map_err(|e| bad(e.to_string()))?;
            if !ids.is_empty() {
                return Ok(Identity { path: path.to_path_buf(), ids });
            }
        }
        match age::ssh::Identity::from_buffer(&bytes[..], Some(path.display().to_string())) {
            Ok(i @ age::ssh::Identity::Unencrypted(_)) => {
                Ok(Identity { path: path.to_path_buf(), ids: vec![Box::new(i)] })
            }
            Ok(age::ssh::Identity::Encrypted(_)) => {
                Err(bad("the ssh key has a passphrase; give a copy without one (`ssh-keygen -p`), kept root's".into()))
            }
            Ok(_) => Err(bad("this kind of ssh key cannot open age files".into())),
            Err(_) => Err(bad("neither an age identity file (AGE-SECRET-KEY-1…) nor an ssh private key".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIANtin3QKWTgY8VUewknNNNaUswoYBZprtZX+WXH/y8t admin@example";

    #[test]
    fn recipients_parse_or_are_named() {
        let x = age::x25519::Identity::generate().to_public().to_string();
        assert_eq!(x.parse::<Recipient>().unwrap().fingerprint(), x);
        let ed: Recipient = ED.parse().unwrap();
        // As `ssh-keygen -l` prints it.
        assert_eq!(ed.fingerprint(), "SHA256:xOaz0h+TscjCd2JeTeTW3d/WyX4w2snEb5/q6lpnR1s");
        for bad in ["age1nonsense", "ssh-ed25519 AAAA", "ssh-dss AAAAB3NzaC1kc3MAAACBAP", "hello", ""] {
            let e = bad.parse::<Recipient>().unwrap_err();
            assert!(e.contains("[escrow] recipient"), "{bad}: {e}");
        }
    }
}
