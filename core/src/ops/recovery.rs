//! Recovery keys meeting the keystore: unlock with one, restore a policy from one.
use std::path::Path;

use super::{Dirseal, OpsError, ProtectorChoice};
use crate::keystore::{KeystoreError, PolicyRecord};
use crate::protector::ProtectorRecord;
use crate::recovery;
use crate::ui::Ui;

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
