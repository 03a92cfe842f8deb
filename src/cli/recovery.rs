//! `dirseal recovery ...` and the recovery-key offer of `encrypt` and `convert`.
use std::path::Path;

use anyhow::{bail, Result};

use dirseal::ids::KeyIdentifier;
use dirseal::ops::{Dirseal, ProtectorChoice};
use dirseal::recovery::RecoveryKey;
use dirseal::recovery::{self, RecoveryError};
use dirseal::secret::MasterKey;

use dirseal::ui::{Question, Ui};

use super::args::{RecoveryCmd, RecoveryOffer};
use super::term::{clean, TermUi};

impl RecoveryOffer {
    /// What the flags decided; `None` leaves it to a question ([`TermUi::confirm`]).
    pub fn decided(&self) -> Option<bool> {
        (self.recovery_key || self.no_recovery_key).then_some(self.recovery_key)
    }

    /// Whether to make a key: the flags decide; on a terminal without flags, ask.
    pub fn wanted(&self, dir: &Path, ui: &mut TermUi) -> Result<bool> {
        match self.decided() {
            Some(w) => Ok(w),
            None => Ok(ui.confirm(&Question::CreateRecoveryKey { dir })?),
        }
    }
}

/// A new key for `dir`, shown and typed back (nothing is saved): the caller installs it.
pub fn show_new(dir: &Path, ui: &mut TermUi) -> Result<RecoveryKey> {
    if recovery::read_blob(dir)?.is_some() {
        return Err(RecoveryError::Exists { path: dir.to_path_buf() }.into());
    }
    let key = RecoveryKey::generate();
    ui.show_recovery_key(dir, &key)?;
    Ok(key)
}

/// Creates and installs a key for a directory whose master key the caller holds.
pub fn create(dir: &Path, policy: &KeyIdentifier, master: &MasterKey, ui: &mut TermUi) -> Result<()> {
    let key = show_new(dir, ui)?;
    recovery::install(dir, policy, master, &key)?;
    Ok(())
}

pub fn run(ds: &mut Dirseal, cmd: RecoveryCmd, ui: &mut TermUi) -> Result<()> {
    match cmd {
        RecoveryCmd::Add { dir, protector } => {
            if recovery::read_blob(&dir)?.is_some() {
                return Err(RecoveryError::Exists { path: dir }.into());
            }
            let pick = super::ProtectorRef::pick_in(&protector, ds, &dir)?;
            let (policy, master) = super::forgiving(|| ds.master_key_of_dir(&dir, pick, ui))?;
            create(&dir, &policy.id, &master, ui)?;
            println!("recovery key saved on {}", clean(&dir.display().to_string()));
        }
        RecoveryCmd::Verify { dir } => {
            let key = recovery::ask_key(&dir, ui)?;
            recovery::master_key(&dir, &key)?;
            println!("the recovery key opens {}", clean(&dir.display().to_string()));
        }
        RecoveryCmd::Remove { dir } => {
            if !recovery::remove_blob(&dir)? {
                bail!("{} has no recovery key; nothing to remove", dir.display());
            }
            println!("removed the recovery key of {}", clean(&dir.display().to_string()));
        }
        RecoveryCmd::Restore { dir, protector } => {
            // As `convert` does: a home's new protector belongs to its owner, else PAM (which
            // tries only the user's own protectors) would leave the restored home locked.
            let choice = protector.choice(ds, Some(&dir))?;
            let owner = match &choice {
                ProtectorChoice::New(n) => n.uid.map(dirseal::account::user_name),
                ProtectorChoice::Existing(_) => None,
            };
            let (_, prec) = ds.restore_with_recovery(&dir, choice, ui)?;
            if let Some(u) = owner {
                println!(
                    "protector {} belongs to {}: a login unlocks {} only while its password is {}'s login password",
                    clean(&prec.name),
                    clean(&u),
                    clean(&dir.display().to_string()),
                    clean(&u)
                );
            }
        }
    }
    Ok(())
}
