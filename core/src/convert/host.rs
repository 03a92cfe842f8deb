//! The engine's host: what dirseal-migrate asks of the key side (the staging directory's new
//! policy and key, its checks, the swap), for convert and decrypt alike.
use super::*;

/// The privileged side of the engine.
pub(crate) struct KeyHost<'a> {
    pub(super) ds: &'a Dirseal,
    pub(super) source: &'a Path,
    /// The protector for a new conversion's staging policy (absent on resume and abort).
    pub(super) protector: Option<(ProtectorRecord, ProtectorKey)>,
    /// A recovery key to seal the new policy's master key under, on the staging root (it becomes
    /// the directory at the swap, so the key works from the first moment the data is encrypted).
    pub(super) recovery: Option<&'a RecoveryKey>,
    /// Where a new conversion's policy record goes (a portable directory's medium, or the
    /// keystore); absent on resume and abort, which write no record.
    pub(super) store: Option<Keystore>,
    pub(super) hooks: &'a Hooks<'a>,
    /// Decrypting: the staging dir stays plain and the token names the source's own key (the
    /// one a resume must find loaded), given by the plan as `source_key`.
    pub(super) direction: Direction,
    pub(super) source_key: Option<KeyIdentifier>,
    /// Why the new recovery key's escrow record was not written (escrow not required), for the
    /// Ui once the engine is done: the engine's host has no Ui.
    pub(super) escrow_failed: std::sync::Mutex<Option<crate::escrow::EscrowError>>,
    /// Scheduling for the boot: the new staging key is held ([`Schedules::hold`]) when made.
    pub(super) hold: bool,
}

impl<'a> KeyHost<'a> {
    pub(crate) fn new(ds: &'a Dirseal, source: &'a Path, hooks: &'a Hooks<'a>) -> KeyHost<'a> {
        KeyHost {
            ds,
            source,
            protector: None,
            recovery: None,
            store: None,
            hooks,
            direction: Direction::Encrypt,
            source_key: None,
            escrow_failed: std::sync::Mutex::new(None),
            hold: false,
        }
    }

    /// The host of a decrypt of `source`, whose policy is `key`.
    pub(crate) fn decrypting(
        ds: &'a Dirseal,
        source: &'a Path,
        key: KeyIdentifier,
        hooks: &'a Hooks<'a>,
    ) -> KeyHost<'a> {
        KeyHost { source_key: Some(key), ..KeyHost::new(ds, source, hooks).going(Direction::Decrypt) }
    }

    /// The host of a run going `direction` whose key is not needed (ending it: abort, rollback,
    /// commit).
    pub(crate) fn going(self, direction: Direction) -> KeyHost<'a> {
        KeyHost { direction, ..self }
    }
}

impl KeyHost<'_> {
    /// A decrypt's staging dir must not be encrypted: what is copied into it is the plaintext.
    pub(super) fn check_plain(&self, staging: BorrowedFd<'_>, path: &Path) -> Result<(), HostError> {
        match fscrypt::get_policy_fd(staging, path).map_err(host_err)? {
            None => Ok(()),
            Some(p) => Err(HostError(format!(
                "it is encrypted (policy {}), where a decrypt needs a plain directory",
                p.identifier
            ))),
        }
    }
}

fn host_err(e: impl std::fmt::Display) -> HostError {
    HostError(e.to_string())
}

impl Host for KeyHost<'_> {
    fn prepare_staging(&self, staging: BorrowedFd<'_>, path: &Path) -> Result<String, HostError> {
        if self.direction == Direction::Decrypt {
            // The plain staging dir only has to be plain; the token is the key the source needs.
            self.check_plain(staging, path)?;
            let id = self.source_key.ok_or_else(|| HostError("internal: no source key for a decrypt".into()))?;
            return Ok(id.to_string());
        }
        let (prec, pkey) = self
            .protector
            .as_ref()
            .ok_or_else(|| HostError("internal: no protector chosen for a new conversion".into()))?;
        // The hint names the source: after the swap that path is the encrypted directory.
        let (policy, master) = Dirseal::draft_policy(self.source, prec, pkey);
        // The staging dir carries the policy (on disk) before its record exists: after a crash
        // before the journal, a record always has its staging dir, by which the next run knows it
        // for an orphan ([`drop_orphan_policy`]).
        self.ds.add_key(self.source, &master).map_err(host_err)?;
        fscrypt::set_policy_fd(staging, path, &policy.id).map_err(host_err)?;
        rustix::fs::fsync(staging).map_err(|e| HostError(format!("{}: cannot sync it: {e}", path.display())))?;
        let store =
            self.store.as_ref().ok_or_else(|| HostError("internal: no keystore chosen for a new conversion".into()))?;
        self.ds.save_new_policy(&policy, store).map_err(host_err)?;
        if self.hold {
            schedules(self.ds).hold(&policy.id, &master).map_err(host_err)?;
        }
        migrate::fault::point(migrate::fault::Point::AfterPolicySaved);
        if let Some(key) = self.recovery {
            // The record names the directory converted, owned by its owner (the staging dir
            // is root's until the swap). A record that could not be written (escrow not
            // required) shows in `recovery escrow --check` and the report.
            let owner = std::fs::symlink_metadata(self.source).ok().map(|m| std::os::unix::fs::MetadataExt::uid(&m));
            let escrowed = self
                .ds
                .save_recovery_key_at((staging, path), self.source, &policy.id, &master, key, owner)
                .map_err(host_err)?;
            if let crate::ops::Escrowed::Failed(e) = escrowed {
                *self.escrow_failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
        }
        Ok(policy.id.to_string())
    }

    fn check_staging(&self, token: &str, staging: BorrowedFd<'_>, path: &Path) -> Result<(), HostError> {
        if self.direction == Direction::Decrypt {
            return self.check_plain(staging, path);
        }
        let id: KeyIdentifier = token.parse().map_err(host_err)?;
        match fscrypt::get_policy_fd(staging, path).map_err(host_err)? {
            Some(p) if p == fscrypt::PolicyV2::new(id) => Ok(()),
            Some(p) => Err(HostError(format!("it is encrypted with policy {}, not {id}", p.identifier))),
            None => Err(HostError(format!("it is not encrypted at all, where policy {id} was recorded"))),
        }
    }

    fn ensure_unlocked(&self, token: &str, staging: &Path) -> Result<(), HostError> {
        let id: KeyIdentifier = token.parse().map_err(host_err)?;
        let mp = fscrypt::mount_point(staging).map_err(host_err)?;
        match fscrypt::key_status(&mp, &id).map_err(host_err)? {
            KeyStatus::Present => Ok(()),
            _ if self.direction == Direction::Encrypt && schedules(self.ds).holds(&id) => {
                let master = schedules(self.ds).held(&id).map_err(host_err)?;
                let master = master.ok_or_else(|| HostError(format!("the key held for policy {id} went away")))?;
                self.ds.add_key(self.source, &master).map_err(host_err)
            }
            _ if self.direction == Direction::Decrypt => Err(HostError(format!(
                "the key {id} of {} is not loaded (was the machine restarted?); resuming the decrypt loads it with a protector's secret",
                self.source.display()
            ))),
            _ => Err(HostError(format!(
                "the staging directory's key {id} is not loaded (was the machine restarted?); resuming the conversion of {} loads it with a protector's secret",
                self.source.display()
            ))),
        }
    }

    fn is_encrypted(&self, path: &Path) -> Result<bool, HostError> {
        fscrypt::is_encrypted(path).map_err(host_err)
    }

    fn exchange(&self, a_dir: BorrowedFd<'_>, a: &OsStr, b_dir: BorrowedFd<'_>, b: &OsStr) -> Result<(), HostError> {
        fscrypt::rename_exchange_at(a_dir, a, b_dir, b).map_err(host_err)
    }

    fn trim(&self, dir: &Path) -> Result<(), HostError> {
        fscrypt::trim(dir).map(drop).map_err(host_err)
    }

    fn progress(&self, p: &migrate::Progress) {
        (self.hooks.progress)(&Progress {
            phase: p.phase.name().to_string(),
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            files_done: p.files_done,
            files_total: p.files_total,
        });
    }

    fn should_stop(&self) -> bool {
        self.hooks.stop.load(Ordering::Relaxed)
    }
}
