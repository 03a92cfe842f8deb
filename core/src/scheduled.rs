//! Conversions scheduled for the next boot (`dirseal convert DIR --at-next-boot`, D-Bus Convert
//! with `at_next_boot`) and the staging keys held for them, in the keystore directory:
//!
//! - `scheduled/<hash>.json`: a conversion waiting for the boot-time run (its file existing is
//!   what "scheduled" means: [`Schedules::pending`]); `dirseal-convert-boot.service` runs only
//!   while this directory holds something;
//! - `scheduled-ran/<hash>.json`: the same record once the boot-time run finished it, with the
//!   outcome, for `status` and the service's GetStatus to find after the reboot;
//! - `held/<policy>.key`: the staging master key of a conversion in progress, so the boot-time run
//!   and any resume load it without anyone typing (0600, root's, in the 0700 keystore). With a TPM
//!   the file holds the key wrapped (AES-256-GCM) under a random key sealed to the TPM (no PIN,
//!   no PCRs: the boot-time run asks nothing), so the file, or what of it a filesystem keeps after
//!   its deletion, is useless away from this machine's TPM; without one, the key itself. It is
//!   kept exactly while the conversion is before its swap ([`key_needed`]) and destroyed after.
//!
//! `<hash>` is the first 8 bytes of SHA-256 of the directory's absolute path, hex, as its work
//! dir's name. This module reads and writes records; what a scheduled conversion does is
//! `crate::convert`'s.
use std::io::Write;
use std::path::{Path, PathBuf};

use dirseal_migrate::{Method, State};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::format::{check_header, FORMAT_VERSION};
use crate::fscrypt;
use crate::ids::{KeyIdentifier, ProtectorId};
use crate::keystore::{Keystore, KeystoreError};
use crate::secret::{MasterKey, ProtectorKey, MASTER_KEY_LEN};
use crate::securefile::{self, Privacy, SecureFileError};
use crate::tpm2::{self, SealedKey, Tcti, Tpm};
use crate::wrap::{self, Kek, Wrapped};

const SCHEDULE_FORMAT: &str = "dirseal-scheduled";
const HELD_FORMAT: &str = "dirseal-held-key";
const MAX_RECORD_BYTES: u64 = 64 * 1024;
/// The directory `dirseal-convert-boot.service`'s condition names (under the default keystore).
pub const PENDING_DIR: &str = "scheduled";
const RAN_DIR: &str = "scheduled-ran";
const HELD_DIR: &str = "held";

/// Whether a conversion in `state` still needs its staging key: until the swap the staging
/// directory is written (or, for an abort, read back); from the swap on nothing needs it, and the
/// directory's own protectors open it. The one rule for how long a held key lives.
pub fn key_needed(state: State) -> bool {
    state.before_swap()
}

/// A conversion scheduled for the next boot, as recorded when it was asked for.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    format: String,
    version: u32,
    /// The directory, absolute.
    pub source: PathBuf,
    /// The new policy (the staging directory's, then the directory's).
    pub policy: KeyIdentifier,
    /// How the plan chose to put the data into staging.
    pub method: Method,
    /// The protector the policy was made with, and whether scheduling made it (a cancel then
    /// removes it again when no policy uses it).
    pub protector: ProtectorId,
    /// Whether scheduling made (or adopted an unused) protector.
    pub protector_made: bool,
    /// When it was scheduled (seconds since the epoch).
    pub scheduled_unix: u64,
    /// When a boot-time run first took it up (seconds since the epoch): from then on part of the
    /// directory may be on its way into staging, so logins are no longer let through
    /// ([`crate::convert::login_during`]). Written, durably, before that run touches anything.
    #[serde(default)]
    pub began_unix: Option<u64>,
    /// The last boot-time run that failed: when, and why (it is tried again at the next boot).
    #[serde(default)]
    pub last_failure: Option<Attempt>,
    /// How the boot-time run ended (only in `scheduled-ran/`).
    #[serde(default)]
    pub ran: Option<Ran>,
    /// A live conversion (`convert --live`): its background run commits it once the owner has
    /// logged out; the boot-time run commits it only if that never happened.
    #[serde(default)]
    pub live: bool,
    /// A live conversion's commit under way since then (seconds since the epoch); cleared when
    /// it is put off.
    #[serde(default)]
    pub committing_unix: Option<u64>,
    /// A live conversion's last commit put off: when, and why (the owner logged back in, a
    /// program used the directory).
    #[serde(default)]
    pub deferred: Option<Attempt>,
}

/// A boot-time run that failed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    /// When it ended (seconds since the epoch).
    pub unix: u64,
    /// The error, as said.
    pub error: String,
}

/// How a boot-time run ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Ran {
    /// When it ended (seconds since the epoch).
    pub unix: u64,
    /// The state it reached (`done`, or `swapped` with a backup kept).
    pub state: String,
    /// Wall time of that run, in seconds.
    pub seconds: u64,
}

impl Schedule {
    /// A new record: `source` is scheduled with `policy` (made with `protector`).
    pub(crate) fn new(
        source: PathBuf,
        policy: KeyIdentifier,
        method: Method,
        protector: ProtectorId,
        protector_made: bool,
        live: bool,
    ) -> Schedule {
        Schedule {
            format: SCHEDULE_FORMAT.into(),
            version: FORMAT_VERSION,
            source,
            policy,
            method,
            protector,
            protector_made,
            scheduled_unix: now(),
            began_unix: None,
            last_failure: None,
            ran: None,
            live,
            committing_unix: None,
            deferred: None,
        }
    }
}

/// Where a directory stands with the next boot.
#[derive(Clone, Debug)]
pub enum BootState {
    /// Scheduled, not yet run (or its last run failed: `last_failure`).
    Pending(Schedule),
    /// The boot-time run finished it (`ran` says how).
    Ran(Schedule),
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A directory's record name: a hash of its absolute path, so two never share one.
fn name_of(source: &Path) -> String {
    let digest = Sha256::digest(source.as_os_str().as_encoded_bytes());
    format!("{}.json", hex::encode(&digest[..8]))
}

/// The scheduled conversions and held keys of one keystore (the machine's: a portable
/// directory's medium may not be there at boot).
#[derive(Clone, Debug)]
pub struct Schedules {
    root: PathBuf,
    /// The TPM held keys are sealed to, when there is one.
    tpm: Option<Tcti>,
}

/// How a held key is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldForm {
    /// Wrapped under a key sealed to the TPM.
    Tpm2,
    /// The key itself, in the root-only file (no TPM here, or it refused).
    Record,
}

/// A held key's file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeldFile {
    format: String,
    version: u32,
    policy: KeyIdentifier,
    /// The key, hex ([`HeldForm::Record`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// The wrapping key, sealed to the TPM, and the key wrapped by it ([`HeldForm::Tpm2`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tpm2: Option<SealedKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrapped: Option<Wrapped>,
}

/// What a wrapped held key is bound to: the policy it opens.
fn held_aad(id: &KeyIdentifier) -> Vec<u8> {
    format!("dirseal:{FORMAT_VERSION}:held:{id}").into_bytes()
}

impl Schedules {
    /// The records kept in `store`'s directory; held keys are sealed to the TPM at `tpm` when it
    /// answers.
    pub fn of(store: &Keystore, tpm: Option<Tcti>) -> Schedules {
        Schedules { root: store.root().to_path_buf(), tpm }
    }

    fn dir(&self, which: &str) -> PathBuf {
        self.root.join(which)
    }

    /// Every conversion waiting for the boot-time run. A record that does not parse is an error
    /// naming it (never skipped: the boot-time run must not forget a conversion it holds a key for).
    pub fn pending(&self) -> Result<Vec<Schedule>, KeystoreError> {
        let dir = self.dir(PENDING_DIR);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(SecureFileError::Io { path: dir, op: "list", source: e }.into()),
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name();
            // Temporary files of an atomic write that a crash left behind.
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            out.push(read_record(&e.path())?);
        }
        out.sort_by(|a, b| a.source.cmp(&b.source));
        Ok(out)
    }

    /// Where `source` stands with the next boot: scheduled, run, or nothing recorded.
    pub fn state_of(&self, source: &Path) -> Result<Option<BootState>, KeystoreError> {
        let name = name_of(source);
        let read = |dir: &str| -> Result<Option<Schedule>, KeystoreError> {
            let path = self.dir(dir).join(&name);
            match read_record(&path) {
                Ok(s) if s.source == source => Ok(Some(s)),
                Ok(_) => Ok(None),
                Err(KeystoreError::File(SecureFileError::NotFound { .. })) => Ok(None),
                Err(e) => Err(e),
            }
        };
        if let Some(s) = read(PENDING_DIR)? {
            return Ok(Some(BootState::Pending(s)));
        }
        Ok(read(RAN_DIR)?.map(BootState::Ran))
    }

    /// Records `s` as scheduled (replacing an earlier outcome of the same directory).
    pub(crate) fn save(&self, s: &Schedule) -> Result<(), KeystoreError> {
        self.write(PENDING_DIR, s)?;
        self.remove_from(RAN_DIR, &s.source)
    }

    /// Records that a boot-time run takes `s` up now (the first one only: a later one keeps the
    /// first time); returns the schedule as recorded.
    pub(crate) fn began(&self, s: &Schedule) -> Result<Schedule, KeystoreError> {
        if s.began_unix.is_some() {
            return Ok(s.clone());
        }
        let s = Schedule { began_unix: Some(now()), ..s.clone() };
        self.write(PENDING_DIR, &s)?;
        Ok(s)
    }

    /// Records a failed boot-time run of `s`: it stays scheduled, for the next boot.
    pub(crate) fn failed(&self, s: &Schedule, error: String) -> Result<(), KeystoreError> {
        let s = Schedule { last_failure: Some(Attempt { unix: now(), error }), ..s.clone() };
        self.write(PENDING_DIR, &s)
    }

    /// Records that a live conversion's commit begins (`true`) or was put off for `reason`.
    pub(crate) fn live_commit(&self, s: &Schedule, deferred: Option<String>) -> Result<Schedule, KeystoreError> {
        let s = match deferred {
            None => Schedule { committing_unix: Some(now()), ..s.clone() },
            Some(error) => {
                Schedule { committing_unix: None, deferred: Some(Attempt { unix: now(), error }), ..s.clone() }
            }
        };
        self.write(PENDING_DIR, &s)?;
        Ok(s)
    }

    /// Records that the boot-time run finished `s`: it leaves the schedule, its outcome is kept.
    pub(crate) fn ran(&self, s: &Schedule, state: State, seconds: u64) -> Result<(), KeystoreError> {
        let s = Schedule { ran: Some(Ran { unix: now(), state: state.to_string(), seconds }), ..s.clone() };
        self.write(RAN_DIR, &s)?;
        self.remove_from(PENDING_DIR, &s.source)
    }

    /// Forgets `source`'s schedule (cancelled), and any outcome.
    pub(crate) fn remove(&self, source: &Path) -> Result<(), KeystoreError> {
        self.remove_from(PENDING_DIR, source)?;
        self.remove_from(RAN_DIR, source)
    }

    fn write(&self, which: &str, s: &Schedule) -> Result<(), KeystoreError> {
        let dir = self.dir(which);
        securefile::ensure_dir(&dir, Privacy::OwnerOnly)?;
        let json = serde_json::to_vec_pretty(s).map_err(|e| KeystoreError::Corrupt {
            path: dir.join(name_of(&s.source)),
            reason: format!("cannot serialize: {e}"),
        })?;
        securefile::write_atomic(&dir.join(name_of(&s.source)), &json)?;
        Ok(())
    }

    fn remove_from(&self, which: &str, source: &Path) -> Result<(), KeystoreError> {
        match securefile::remove_durable(&self.dir(which).join(name_of(source))) {
            Ok(()) | Err(SecureFileError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn held_path(&self, id: &KeyIdentifier) -> PathBuf {
        self.dir(HELD_DIR).join(format!("{id}.key"))
    }

    /// Holds `key` (the staging policy `id`'s master key) until [`Schedules::forget`], in a
    /// root-only 0600 file in the keystore: wrapped under a key sealed to the TPM when there is
    /// one that seals, else the key itself. Says which.
    pub(crate) fn hold(&self, id: &KeyIdentifier, key: &MasterKey) -> Result<HeldForm, KeystoreError> {
        let dir = self.dir(HELD_DIR);
        securefile::ensure_dir(&dir, Privacy::OwnerOnly)?;
        let mut file = HeldFile {
            format: HELD_FORMAT.into(),
            version: FORMAT_VERSION,
            policy: *id,
            key: None,
            tpm2: None,
            wrapped: None,
        };
        let form = match self.seal(id, key) {
            Some((sealed, wrapped)) => {
                (file.tpm2, file.wrapped) = (Some(sealed), Some(wrapped));
                HeldForm::Tpm2
            }
            None => {
                file.key = Some(hex::encode(key.as_bytes()));
                HeldForm::Record
            }
        };
        let json = Zeroizing::new(serde_json::to_vec(&file).map_err(|e| KeystoreError::Corrupt {
            path: self.held_path(id),
            reason: format!("cannot serialize: {e}"),
        })?);
        if let Some(k) = file.key.as_mut() {
            zeroize::Zeroize::zeroize(k);
        }
        securefile::write_atomic(&self.held_path(id), &json)?;
        Ok(form)
    }

    /// `key` wrapped under a new random key, and that key sealed to the TPM (none: no TPM here, or
    /// it would not seal; the caller keeps the key itself then).
    fn seal(&self, id: &KeyIdentifier, key: &MasterKey) -> Option<(SealedKey, Wrapped)> {
        let tcti = self.tpm.as_ref()?;
        let mut tpm = Tpm::open(tcti).ok()?;
        let wrapping = ProtectorKey::random();
        // The cost is for a PIN's stretching; there is none.
        let unused = crate::kdf::Argon2Params { time_cost: 1, memory_kib: crate::kdf::MIN_MEMORY_KIB, parallelism: 1 };
        let sealed = tpm.seal(&wrapping, None, &tpm2::PcrSet::default(), unused).ok()?;
        let wrapped = wrap::seal(&Kek::from_slice(wrapping.as_bytes()), &held_aad(id), key.as_bytes());
        Some((sealed, wrapped))
    }

    /// How the key held for policy `id` is kept, if one is.
    pub fn held_form(&self, id: &KeyIdentifier) -> Option<HeldForm> {
        let bytes = securefile::read_file(&self.held_path(id), MAX_RECORD_BYTES, Privacy::OwnerOnly).ok()?;
        let h: HeldFile = serde_json::from_slice(&Zeroizing::new(bytes)).ok()?;
        Some(if h.tpm2.is_some() { HeldForm::Tpm2 } else { HeldForm::Record })
    }

    /// Whether a key is held for policy `id`.
    pub fn holds(&self, id: &KeyIdentifier) -> bool {
        std::fs::symlink_metadata(self.held_path(id)).is_ok()
    }

    /// The key held for policy `id`, if any. A record whose key is not that policy's (the kernel's
    /// identifier of the key decides) is refused: it was altered.
    pub(crate) fn held(&self, id: &KeyIdentifier) -> Result<Option<MasterKey>, KeystoreError> {
        let path = self.held_path(id);
        let bytes = match securefile::read_file(&path, MAX_RECORD_BYTES, Privacy::OwnerOnly) {
            Ok(b) => Zeroizing::new(b),
            Err(SecureFileError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let corrupt = |reason: String| KeystoreError::Corrupt { path: path.clone(), reason };
        let h: HeldFile = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        check_header(&h.format, h.version, HELD_FORMAT).map_err(corrupt)?;
        let raw = match (h.key, h.tpm2, h.wrapped) {
            (Some(hex_key), None, None) => {
                let hex_key = Zeroizing::new(hex_key);
                Zeroizing::new(hex::decode(hex_key.as_bytes()).map_err(|e| corrupt(format!("key: {e}")))?)
            }
            (None, Some(sealed), Some(wrapped)) => {
                let unsealed = self.unseal(&sealed).map_err(|e| {
                    corrupt(format!("its key is sealed to a TPM that does not give it back ({e}); resume the conversion with a protector's secret (`dirseal convert DIR`), or abort it"))
                })?;
                wrap::open(&Kek::from_slice(unsealed.as_bytes()), &held_aad(id), &wrapped, MASTER_KEY_LEN)
                    .map_err(|e| corrupt(format!("its wrapped key does not open: {e}")))?
            }
            _ => return Err(corrupt("it holds neither a key nor a TPM-sealed one".into())),
        };
        let key = MasterKey::from_slice(&raw).ok_or_else(|| corrupt("the key has the wrong length".into()))?;
        if h.policy != *id || fscrypt::key_identifier(&key) != *id {
            return Err(corrupt(format!("it does not hold the key of policy {id}")));
        }
        Ok(Some(key))
    }

    fn unseal(&self, sealed: &SealedKey) -> Result<ProtectorKey, tpm2::Tpm2Error> {
        let tcti = self.tpm.clone().unwrap_or_default();
        // No PIN: nothing is spent, wherever the caller is.
        Tpm::open(&tcti)?.unseal(sealed, None, crate::presence::Presence::Elsewhere, 0)
    }

    /// Destroys the key held for policy `id` (none held: nothing to do). The file's bytes are
    /// overwritten and synced before it is unlinked; a filesystem may still keep older copies of
    /// its blocks (its journal, a copy-on-write filesystem, an SSD's remapping), which
    /// `dirseal scrub` of the keystore's filesystem overwrites (docs/threat-model.md).
    pub(crate) fn forget(&self, id: &KeyIdentifier) -> Result<(), KeystoreError> {
        let path = self.held_path(id);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(SecureFileError::Io { path, op: "inspect", source: e }.into()),
        };
        if meta.is_file() {
            use std::os::unix::fs::OpenOptionsExt;
            let opened = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(&path);
            if let Ok(mut f) = opened {
                let _ = f.write_all(&vec![0u8; meta.len() as usize]).and_then(|()| f.sync_all());
            }
        }
        match securefile::remove_durable(&path) {
            Ok(()) | Err(SecureFileError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn read_record(path: &Path) -> Result<Schedule, KeystoreError> {
    let bytes = securefile::read_file(path, MAX_RECORD_BYTES, Privacy::OwnerOnly)?;
    let corrupt = |reason: String| KeystoreError::Corrupt { path: path.to_path_buf(), reason };
    let s: Schedule = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    check_header(&s.format, s.version, SCHEDULE_FORMAT).map_err(corrupt)?;
    if !s.source.is_absolute() || path.file_name().is_none_or(|n| *n != *name_of(&s.source)) {
        return Err(corrupt(format!("it names {}, which is not the directory its name is for", s.source.display())));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Schedules) {
        let d = tempfile::tempdir().unwrap();
        let ks = Keystore::open(&d.path().join("ks")).unwrap();
        // No TPM: the key itself is held.
        (d, Schedules::of(&ks, None))
    }

    #[test]
    fn a_held_key_comes_back_only_for_its_policy_and_is_gone_once_forgotten() {
        let (_d, s) = store();
        let key = MasterKey::random();
        let id = fscrypt::key_identifier(&key);
        assert_eq!(s.hold(&id, &key).unwrap(), HeldForm::Record);
        assert!(s.held(&id).unwrap().is_some_and(|k| k == key));
        let path = s.held_path(&id);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // Another policy's key put in its place (a swapped file) is refused, never loaded.
        let other = MasterKey::random();
        let other_id = fscrypt::key_identifier(&other);
        s.hold(&other_id, &other).unwrap();
        std::fs::rename(s.held_path(&other_id), &path).unwrap();
        assert!(matches!(s.held(&id), Err(KeystoreError::Corrupt { .. })));
        s.forget(&id).unwrap();
        assert!(s.held(&id).unwrap().is_none() && !s.holds(&id));
        s.forget(&id).unwrap();
    }

    #[test]
    fn a_schedule_is_pending_then_ran_and_a_misnamed_record_is_refused() {
        let (_d, s) = store();
        let key = MasterKey::random();
        let id = fscrypt::key_identifier(&key);
        let rec = Schedule::new("/home/a".into(), id, Method::Move, ProtectorId([1; 8]), true, false);
        s.save(&rec).unwrap();
        assert!(matches!(s.state_of(Path::new("/home/a")).unwrap(), Some(BootState::Pending(_))));
        assert!(s.state_of(Path::new("/home/b")).unwrap().is_none());
        s.failed(&rec, "it broke".into()).unwrap();
        let pending = s.pending().unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].last_failure.as_ref().map(|f| f.error.as_str()), Some("it broke"));
        s.ran(&pending[0], State::Done, 3).unwrap();
        assert!(s.pending().unwrap().is_empty());
        match s.state_of(Path::new("/home/a")).unwrap() {
            Some(BootState::Ran(r)) => assert_eq!(r.ran.map(|r| (r.state, r.seconds)), Some(("done".into(), 3))),
            other => panic!("{other:?}"),
        }
        // A record copied under another directory's name is not taken for that directory's.
        s.save(&rec).unwrap();
        let dir = s.dir(PENDING_DIR);
        std::fs::rename(dir.join(name_of(Path::new("/home/a"))), dir.join(name_of(Path::new("/home/b")))).unwrap();
        assert!(matches!(s.pending(), Err(KeystoreError::Corrupt { .. })));
        s.remove(Path::new("/home/a")).unwrap();
    }
}
