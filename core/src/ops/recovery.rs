//! Recovery keys meeting the keystore and the escrow: unlock with one, restore a policy from one,
//! and the one place a new recovery key is saved ([`Dirseal::save_recovery_key`]: escrowed, then
//! stored on the directory) or removed.
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use super::{Dirseal, OpsError, ProtectorChoice};
use crate::escrow::{Context, Escrow, EscrowError};
use crate::ids::KeyIdentifier;
use crate::keystore::{KeystoreError, PolicyRecord};
use crate::protector::ProtectorRecord;
use crate::recovery::{self, RecoveryKey};
use crate::secret::MasterKey;
use crate::ui::{Question, Ui};

/// Whether a new recovery key was escrowed.
#[derive(Debug)]
#[must_use]
pub enum Escrowed {
    /// The config names no recipient.
    NotConfigured,
    /// Its record was written.
    Written,
    /// Escrow is not required and its record could not be written: the key works, and
    /// `recovery escrow --check` lists the directory.
    Failed(EscrowError),
}

impl Escrowed {
    /// Tells the Ui of a record that could not be written.
    pub fn notice(self, dir: &Path, ui: &mut dyn Ui) {
        if let Escrowed::Failed(e) = self {
            ui.notice(&format!("the recovery key of {} was not escrowed: {e}", dir.display()));
        }
    }
}

/// The owner of the directory open as `fd`.
fn owner_of(fd: BorrowedFd<'_>) -> u32 {
    rustix::fs::fstat(fd).map(|st| st.st_uid).unwrap_or(0)
}

/// Recovery keys (crate::recovery) reach the keystore only through here, so `recovery` needs
/// nothing of `ops`.
impl Dirseal {
    /// The escrow the config asks for; `None` when it names no recipient.
    pub fn escrow(&self) -> Option<Escrow> {
        Escrow::new(&self.config().escrow, self.keystore().root())
    }

    /// Whether new directory `dir` gets a recovery key: `decided` by the front end, else the Ui
    /// is asked. With escrow required, always (declining is refused, nothing asked). When one is
    /// wanted the escrow directory is checked now, before anything is written: with escrow
    /// required a record that could not be written refuses the encryption here; otherwise the
    /// Ui is told.
    pub fn wants_recovery_key(&self, dir: &Path, decided: Option<bool>, ui: &mut dyn Ui) -> Result<bool, OpsError> {
        let escrow = self.escrow();
        let required = escrow.as_ref().is_some_and(Escrow::required);
        let want = match decided {
            Some(false) if required => return Err(EscrowError::KeyRequired { dir: dir.to_path_buf() }.into()),
            Some(w) => w,
            None if required => true,
            None => ui.confirm(&Question::CreateRecoveryKey { dir })?,
        };
        if let (true, Some(e)) = (want, &escrow) {
            match e.preflight() {
                Ok(()) => {}
                Err(err) if required => return Err(err.into()),
                Err(err) => ui.notice(&format!("the recovery key of {} will not be escrowed: {err}", dir.display())),
            }
        }
        Ok(want)
    }

    /// Saves new recovery `key` of `dir` (policy `policy`, master key `master`; owned by `owner`,
    /// else by whoever owns `dir`): its escrow record first, then the sealed key on the
    /// directory. With escrow required, a record that cannot be written leaves the key unsaved.
    pub fn save_recovery_key(
        &self,
        dir: &Path,
        policy: &KeyIdentifier,
        master: &MasterKey,
        key: &RecoveryKey,
        owner: Option<u32>,
    ) -> Result<Escrowed, OpsError> {
        let fd = recovery::open_dir(dir)?;
        self.save_recovery_key_at((fd.as_fd(), dir), dir, policy, master, key, owner)
    }

    /// [`Dirseal::save_recovery_key`] onto the directory open as `at` (its fd and the path that
    /// names it in errors: a conversion's staging dir), recorded as `dir`'s.
    pub(crate) fn save_recovery_key_at(
        &self,
        at: (BorrowedFd<'_>, &Path),
        dir: &Path,
        policy: &KeyIdentifier,
        master: &MasterKey,
        key: &RecoveryKey,
        owner: Option<u32>,
    ) -> Result<Escrowed, OpsError> {
        let escrowed = match self.escrow() {
            None => Escrowed::NotConfigured,
            Some(e) => {
                let uid = owner.unwrap_or_else(|| owner_of(at.0));
                match e.write(&Context::now(*policy, dir, uid, e.recipients()), key) {
                    Ok(()) => Escrowed::Written,
                    Err(err) if e.required() => return Err(err.into()),
                    Err(err) => Escrowed::Failed(err),
                }
            }
        };
        if let Err(err) = recovery::install_at(at.0, at.1, policy, master, key) {
            // The key that record holds opens nothing.
            if let (Escrowed::Written, Some(e)) = (&escrowed, self.escrow()) {
                let _ = e.remove(policy);
            }
            return Err(err.into());
        }
        Ok(escrowed)
    }

    /// Escrows the existing recovery `key` of `dir` again (new recipients, a lost record), after
    /// checking that it opens `dir`.
    pub fn escrow_recovery_key(&self, dir: &Path, key: &RecoveryKey) -> Result<KeyIdentifier, OpsError> {
        let escrow = self.escrow().ok_or(EscrowError::NotConfigured)?;
        let (id, _) = recovery::master_key(dir, key)?;
        let fd = recovery::open_dir(dir)?;
        escrow.write(&Context::now(id, dir, owner_of(fd.as_fd()), escrow.recipients()), key)?;
        Ok(id)
    }

    /// Removes the recovery key of `dir` and its escrow record; `false` if it had no key.
    pub fn remove_recovery_key(&self, dir: &Path) -> Result<bool, OpsError> {
        let policy = crate::fscrypt::get_policy(dir)?.map(|p| p.identifier);
        let removed = recovery::remove_blob(dir)?;
        if let Some(id) = policy {
            self.forget_escrow(&id)?;
        }
        Ok(removed)
    }

    /// Removes `policy`'s escrow record, if the machine escrows: its key is gone.
    pub(crate) fn forget_escrow(&self, policy: &KeyIdentifier) -> Result<(), OpsError> {
        if let Some(e) = self.escrow() {
            e.remove(policy)?;
        }
        Ok(())
    }

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
        // The key proved itself: its record is written again (a reinstall lost it, or the
        // recipients changed).
        if self.escrow().is_some() {
            if let Err(e) = self.escrow_recovery_key(dir, &key) {
                ui.notice(&format!("the recovery key of {} was not escrowed again: {e}", dir.display()));
            }
        }
        ui.notice(&format!(
            "restored {}: unlocked, and protector {} ({}) now opens it",
            dir.display(),
            prec.id,
            prec.name
        ));
        Ok((policy, prec))
    }
}
