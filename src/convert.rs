//! `dirseal convert`: the generic engine in `dirseal-migrate`, wired to the keystore.
//!
//! The engine knows nothing of keys; this module supplies the staging directory's policy (saved in
//! the keystore before any data is copied, so an interrupted conversion can always be resumed with
//! the same secret) and the privileged syscalls the engine may not make itself.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use dirseal_migrate::{self as migrate, Host, HostError, MigrateError, State, StatusView};
use sha2::{Digest, Sha256};

use crate::fscrypt::{self, KeyStatus};
use crate::ids::KeyIdentifier;
use crate::keystore::ProtectorRecord;
use crate::ops::{Dirseal, OpsError};
use crate::secret::ProtectorKey;
use crate::ui::Progress;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Ops(#[from] OpsError),
    #[error("{path}: {reason}")]
    Path { path: PathBuf, reason: String },
    #[error("the owner of {path} (uid {uid}) has processes running (pid {pids}); converting under a running session loses what it writes after verification. Log the user out first, or pass --force if you are sure nothing writes there")]
    OwnerActive { path: PathBuf, uid: u32, pids: String },
    #[error("the conversion journal of {path} names staging key {token:?}, which is not a policy id; the journal was tampered with: run `dirseal convert --abort {path}`")]
    BadToken { path: PathBuf, token: String },
}

/// Where a conversion of `source` keeps its journal: root-only, on the same filesystem, named by
/// a hash of the path so two sources never share one.
pub fn workdir_for(source: &Path) -> Result<PathBuf, ConvertError> {
    let mp = fscrypt::mount_point(source).map_err(OpsError::from)?;
    let digest = Sha256::digest(source.as_os_str().as_encoded_bytes());
    Ok(mp.join(".dirseal").join("convert").join(hex::encode(&digest[..8])))
}

/// The absolute path of `dir` with its parent resolved, but its final component not followed: the
/// engine must see (and refuse) a symlink, not silently convert what it points to.
pub fn absolute(dir: &Path) -> Result<PathBuf, ConvertError> {
    let bad = |reason: String| ConvertError::Path { path: dir.to_path_buf(), reason };
    let name = dir.file_name().ok_or_else(|| bad("has no final name component; give the directory's path".into()))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent = std::fs::canonicalize(&parent).map_err(|e| bad(format!("cannot resolve its parent: {e}")))?;
    Ok(parent.join(name))
}

/// Refuses when the owner of `source` runs anything: a logged-in user keeps writing.
pub fn check_owner_inactive(source: &Path) -> Result<(), ConvertError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(source)
        .map_err(|e| ConvertError::Path { path: source.to_path_buf(), reason: format!("cannot inspect it: {e}") })?;
    let uid = meta.uid();
    if uid == 0 {
        return Ok(());
    }
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if let Ok(m) = std::fs::metadata(entry.path()) {
            if m.uid() == uid {
                pids.push(pid.to_string());
            }
        }
    }
    if pids.is_empty() {
        return Ok(());
    }
    pids.truncate(8);
    Err(ConvertError::OwnerActive { path: source.to_path_buf(), uid, pids: pids.join(", ") })
}

/// The privileged side of the engine.
pub struct KeyHost<'a> {
    pub ds: &'a Dirseal,
    pub source: PathBuf,
    /// The protector for a new conversion's staging policy (absent on resume and abort).
    pub protector: Option<(ProtectorRecord, ProtectorKey)>,
    /// A recovery key to seal the new policy's master key under, on the staging root (it becomes
    /// the directory at the swap, so the key works from the first moment the data is encrypted).
    pub recovery: Option<&'a dirseal_recovery::RecoveryKey>,
    pub stop: &'a AtomicBool,
    pub on_progress: &'a (dyn Fn(&Progress) + Sync),
}

fn host_err(e: impl std::fmt::Display) -> HostError {
    HostError(e.to_string())
}

impl Host for KeyHost<'_> {
    fn prepare_staging(&self, staging: &Path) -> Result<String, HostError> {
        let (prec, pkey) = self
            .protector
            .as_ref()
            .ok_or_else(|| HostError("internal: no protector chosen for a new conversion".into()))?;
        // The hint names the source: after the swap that path is the encrypted directory.
        let (policy, master) = self.ds.new_policy(&self.source, prec, pkey).map_err(host_err)?;
        fscrypt::set_policy(staging, &policy.id).map_err(host_err)?;
        if let Some(key) = self.recovery {
            crate::recovery::install(staging, &policy.id, &master, key).map_err(host_err)?;
        }
        Ok(policy.id.to_string())
    }

    fn ensure_unlocked(&self, token: &str, staging: &Path) -> Result<(), HostError> {
        let id: KeyIdentifier = token.parse().map_err(host_err)?;
        let mp = fscrypt::mount_point(staging).map_err(host_err)?;
        match fscrypt::key_status(&mp, &id).map_err(host_err)? {
            KeyStatus::Present => Ok(()),
            _ => Err(HostError(format!(
                "the staging directory's key {id} is not loaded (was the machine restarted?); run `dirseal convert --resume {}`, which asks for the secret",
                self.source.display()
            ))),
        }
    }

    fn is_encrypted(&self, path: &Path) -> Result<bool, HostError> {
        fscrypt::is_encrypted(path).map_err(host_err)
    }

    fn exchange(&self, a: &Path, b: &Path) -> Result<(), HostError> {
        fscrypt::rename_exchange(a, b).map_err(host_err)
    }

    fn trim(&self, dir: &Path) -> Result<(), HostError> {
        // An absolute path: root must not run whatever `fstrim` its PATH finds.
        let fstrim = ["/usr/sbin/fstrim", "/sbin/fstrim"].into_iter().find(|p| Path::new(p).exists());
        let Some(fstrim) = fstrim else { return Err(HostError("fstrim is not installed (util-linux)".into())) };
        let out = std::process::Command::new(fstrim).arg(dir).env_clear().output().map_err(host_err)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(HostError(format!("fstrim {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr).trim())))
        }
    }

    fn progress(&self, p: &migrate::Progress) {
        (self.on_progress)(&Progress {
            phase: phase_name(p.phase).to_string(),
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            files_done: p.files_done,
            files_total: p.files_total,
        });
    }

    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// The staging key of a conversion in progress, if one is recorded and its key is not loaded:
/// the caller must unlock it (ask the secret) before resuming.
pub fn staging_key_needed(source: &Path, view: &StatusView) -> Result<Option<KeyIdentifier>, ConvertError> {
    if view.token.is_empty() || matches!(view.state, State::Done | State::Aborted | State::RolledBack) {
        return Ok(None);
    }
    let id: KeyIdentifier = view
        .token
        .parse()
        .map_err(|_| ConvertError::BadToken { path: source.to_path_buf(), token: view.token.clone() })?;
    let mp = fscrypt::mount_point(source).map_err(OpsError::from)?;
    match fscrypt::key_status(&mp, &id).map_err(OpsError::from)? {
        KeyStatus::Present => Ok(None),
        _ => Ok(Some(id)),
    }
}

/// The journal of `source`'s conversion, if any.
pub fn status(source: &Path) -> Result<Option<StatusView>, ConvertError> {
    Ok(migrate::status(&workdir_for(source)?)?)
}

/// Whether `dir` is mid-conversion (before the swap): logging in would work on plaintext that is
/// about to be replaced, so the PAM module refuses unless the admin allowed it.
pub fn in_progress(dir: &Path) -> Result<bool, ConvertError> {
    Ok(matches!(
        status(&absolute(dir)?)?.map(|v| v.state),
        Some(State::Prepared | State::Copying | State::Copied | State::Verified)
    ))
}

fn phase_name(p: migrate::Phase) -> &'static str {
    use migrate::Phase::*;
    match p {
        Scanning => "scanning",
        Copying => "copying",
        Verifying => "verifying",
        Swapping => "swapping",
        Disposing => "disposing",
        Aborting => "aborting",
        RollingBack => "rolling back",
    }
}
