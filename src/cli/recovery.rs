//! `dirseal recovery ...` and the recovery-key offer of `encrypt` and `convert`.
use std::path::Path;

use anyhow::{bail, Result};

use dirseal::escrow::{EscrowError, Identity, RecordStatus};
use dirseal::ids::KeyIdentifier;
use dirseal::ops::{Dirseal, ProtectorChoice};
use dirseal::recovery::RecoveryKey;
use dirseal::recovery::{self, RecoveryError};
use dirseal::secret::MasterKey;

use dirseal::ui::Ui;

use super::args::{RecoveryCmd, RecoveryOffer};
use super::term::{clean, TermUi};

impl RecoveryOffer {
    /// What the flags decided; `None` leaves it to a question ([`TermUi::confirm`]), or to the
    /// escrow's rule (`Dirseal::wants_recovery_key`).
    pub fn decided(&self) -> Option<bool> {
        (self.recovery_key || self.no_recovery_key).then_some(self.recovery_key)
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

/// Creates and saves (escrowed first) a key for a directory whose master key the caller holds.
pub fn create(ds: &Dirseal, dir: &Path, policy: &KeyIdentifier, master: &MasterKey, ui: &mut TermUi) -> Result<()> {
    let key = show_new(dir, ui)?;
    ds.save_recovery_key(dir, policy, master, &key, None)?.notice(dir, ui);
    Ok(())
}

pub fn run(ds: &mut Dirseal, cmd: RecoveryCmd, ui: &mut TermUi) -> Result<i32> {
    match cmd {
        RecoveryCmd::Add { dir, protector } => {
            if recovery::read_blob(&dir)?.is_some() {
                return Err(RecoveryError::Exists { path: dir }.into());
            }
            let pick = super::ProtectorRef::pick_in(&protector, ds, &dir)?;
            // The escrow dir is checked before a key is shown: with escrow required, a key that
            // could not be escrowed is never shown.
            ds.wants_recovery_key(&dir, Some(true), ui)?;
            let (policy, master) = super::forgiving(|| ds.master_key_of_dir(&dir, pick, ui))?;
            create(ds, &dir, &policy.id, &master, ui)?;
            println!("recovery key saved on {}", clean(&dir.display().to_string()));
        }
        RecoveryCmd::Verify { dir } => {
            let key = recovery::ask_key(&dir, ui)?;
            recovery::master_key(&dir, &key)?;
            println!("the recovery key opens {}", clean(&dir.display().to_string()));
        }
        RecoveryCmd::Remove { dir } => {
            if !ds.remove_recovery_key(&dir)? {
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
        RecoveryCmd::Escrow { check: true, .. } => return check(ds),
        RecoveryCmd::Escrow { dir: Some(dir), identity, .. } => {
            let escrow = ds.escrow().ok_or(EscrowError::NotConfigured)?;
            let key = match identity {
                Some(path) => {
                    // From the kernel, so that it works when the keystore lost the policy record too.
                    let policy = dirseal::fscrypt::get_policy(&dir)?
                        .ok_or_else(|| dirseal::ops::OpsError::NotEncrypted { path: dir.clone() })?
                        .identifier;
                    escrow.open(&policy, &Identity::load(&path)?)?
                }
                None => recovery::ask_key(&dir, ui)?,
            };
            ds.escrow_recovery_key(&dir, &key)?;
            println!(
                "escrowed the recovery key of {} to {} in {}",
                clean(&dir.display().to_string()),
                escrow.fingerprints().join(", "),
                clean(&escrow.dir().display().to_string())
            );
        }
        RecoveryCmd::Escrow { identity, .. } => {
            // --all (clap requires --identity with it): only records the identity opens.
            let escrow = ds.escrow().ok_or(EscrowError::NotConfigured)?;
            let Some(path) = identity else { bail!("--all needs --identity") };
            let identity = Identity::load(&path)?;
            let (dirs, _) = dirseal::report::directories(ds)?;
            let mut left = 0;
            for d in
                dirs.iter().filter(|d| matches!(d.escrow, Some(ref s) if !matches!(s, RecordStatus::Current { .. })))
            {
                let Some(dir) = &d.path else { continue };
                let shown = clean(&dir.display().to_string());
                match escrow.open(&d.policy, &identity).map_err(anyhow::Error::from).and_then(|key| {
                    ds.escrow_recovery_key(dir, &key)?;
                    Ok(())
                }) {
                    Ok(()) => println!("escrowed {shown} again"),
                    Err(e) => {
                        left += 1;
                        println!("{shown}: not escrowed: {}", clean(&e.to_string()));
                    }
                }
            }
            if left > 0 {
                println!("{left} not escrowed: `dirseal recovery escrow DIR` asks each one's recovery key");
                return Ok(1);
            }
        }
    }
    Ok(0)
}

/// `recovery escrow --check`: every directory with a recovery key whose record is not current.
fn check(ds: &Dirseal) -> Result<i32> {
    let escrow = ds.escrow().ok_or(EscrowError::NotConfigured)?;
    let (dirs, problems) = dirseal::report::directories(ds)?;
    let mut bad = 0;
    for d in &dirs {
        let path = d.path.as_ref().map_or_else(|| "(unknown path)".into(), |p| clean(&p.display().to_string()));
        let why = match &d.escrow {
            None | Some(RecordStatus::Current { .. }) => continue,
            Some(RecordStatus::Missing) => "no record".to_string(),
            Some(RecordStatus::OtherRecipients { recipients }) => {
                format!("record for other recipients ({})", recipients.join(", "))
            }
            Some(RecordStatus::Damaged { reason }) => format!("record damaged: {}", clean(reason)),
        };
        bad += 1;
        println!("{path}  policy {}  {why}", d.policy);
    }
    for p in &problems {
        println!("problem: {}", clean(p));
    }
    if bad == 0 {
        println!(
            "every recovery key is escrowed to the configured recipients ({}) in {}",
            escrow.fingerprints().join(", "),
            clean(&escrow.dir().display().to_string())
        );
        return Ok(0);
    }
    Ok(1)
}
