//! Protectors: creating one (or adopting a conversion's leftover), finding one by name, changing
//! its secret, removing it.
use std::path::Path;

use super::errors::{listed, one_named};
use super::login::refuse_login_password_pin;
use super::{Dirseal, NewProtector, OpsError, Pick, ProtectorChoice};
use crate::ids::ProtectorId;
use crate::keystore::{Keystore, KeystoreError, PolicyRecord};
use crate::protector::{self, ProtectorError, ProtectorRecord};
use crate::secret::{Passphrase, ProtectorKey};
use crate::ui::{Ui, UiError};

impl Dirseal {
    /// Creates and saves a protector of any kind, asking the Ui what the kind needs (a new
    /// password or PIN, a touch). A machine-wide setting the kind recorded (the calibrated Argon2id
    /// cost) is saved in the config first, so every later protector costs the same.
    pub fn create_protector(
        &mut self,
        n: &NewProtector<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        let store = self.keystore.clone();
        self.create_protector_in(n, ui, &store)
    }

    /// [`Dirseal::create_protector`] saving the record in `store` (a portable directory's medium).
    fn create_protector_in(
        &mut self,
        n: &NewProtector<'_>,
        ui: &mut dyn Ui,
        store: &Keystore,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        let settled;
        let n = match n.kind.confirm(&self.config, ui)? {
            Some(kind) => {
                settled = NewProtector { name: n.name.clone(), uid: n.uid, kind };
                &settled
            }
            None => n,
        };
        let ask = n.kind.ask();
        n.kind.check_ready(&self.config)?;
        let secret = protector::ask_new(ask, &n.name, n.uid, ui)?;
        if let (true, Some(uid), Some(secret)) = (n.kind.refuses_login_password(), n.uid, secret.as_ref()) {
            refuse_login_password_pin(uid, secret)?;
        }
        if ask.touch {
            ui.touch(&n.name, None);
        }
        self.save_created_protector(n, secret.as_ref(), store)
    }

    /// Creates protector `n` with the secret asked for it and saves it in `store`.
    fn save_created_protector(
        &mut self,
        n: &NewProtector<'_>,
        secret: Option<&Passphrase>,
        store: &Keystore,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        let mut config = self.config.clone();
        let (rec, key) = protector::create(&n.name, n.uid, &n.kind, &mut config, secret)?;
        if config != self.config {
            config.save(&self.config_path)?;
            self.config = config;
        }
        let _guard = store.lock()?;
        store.save_protector(&rec)?;
        Ok((rec, key))
    }

    /// Like [`Dirseal::create_protector`], for a conversion's new protector: a password protector
    /// of the same name and owner that no policy uses and that opens with the password given is
    /// taken instead of making another. A conversion interrupted after saving its protector and
    /// before its policy left it (it wraps nothing); the same command run again must end with the
    /// keystore an uninterrupted run makes, not two protectors of one name. Kinds whose unlocking
    /// costs something (a TPM's lockout tries, a touch) are never tried: they get a new protector.
    /// `store` is where the record goes (and where one to adopt is looked for): a portable
    /// directory's medium, or this keystore.
    pub(crate) fn adopt_or_create_protector(
        &mut self,
        n: &NewProtector<'_>,
        store: &Keystore,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        if n.kind.ask() != protector::Ask::PASSWORD {
            return self.create_protector_in(n, ui, store);
        }
        let candidates: Vec<ProtectorRecord> = store
            .protectors()?
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter(|r| r.name == n.name && r.uid == n.uid && r.kind.name() == n.kind.name())
            .filter(|r| store.policies_using(&r.id).is_ok_and(|p| p.is_empty()))
            .collect();
        if candidates.is_empty() {
            return self.create_protector_in(n, ui, store);
        }
        let secret = protector::ask_new(n.kind.ask(), &n.name, n.uid, ui)?;
        for rec in candidates {
            if let Ok(key) = protector::unlock(&rec, &self.config, secret.as_ref(), ui.presence()) {
                return Ok((rec, key));
            }
        }
        self.save_created_protector(n, secret.as_ref(), store)
    }

    /// Asks what `rec`'s kind needs and unwraps its key; a wrong secret changes nothing.
    pub(crate) fn unlock_protector(&self, rec: &ProtectorRecord, ui: &mut dyn Ui) -> Result<ProtectorKey, OpsError> {
        Ok(protector::unlock_with(rec, &self.config, ui)?)
    }

    /// An existing protector unlocked with its secret, or a new one.
    pub(crate) fn resolve_protector(
        &mut self,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        match choice {
            ProtectorChoice::Existing(id) => {
                let rec = self.keystore.protector(&id)?;
                let key = self.unlock_protector(&rec, ui)?;
                Ok((rec, key))
            }
            ProtectorChoice::New(n) => self.create_protector(&n, ui),
        }
    }

    /// The protector `named` for `uid`: its id, or the name of one of `uid`'s protectors (`None`:
    /// anyone's, for an administrator). A name two of them share is refused with both named.
    pub fn protector_named(&self, named: &str, uid: Option<u32>) -> Result<ProtectorRecord, OpsError> {
        if let Ok(id) = named.parse::<ProtectorId>() {
            return Ok(self.keystore.protector(&id)?);
        }
        let found: Vec<ProtectorRecord> = self
            .keystore
            .protectors()?
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter(|r| r.name == named && (uid.is_none() || r.uid == uid))
            .collect();
        let scope = uid.map_or_else(|| "in the keystore".to_string(), |uid| format!("of uid {uid}"));
        one_named(named, found, scope)
    }

    /// The protector of `policy` (`what` names it in errors, a directory) that `named` names: an
    /// id as it is, else the one of its protectors (on its medium too) of that name. A name other
    /// directories' protectors share is no ambiguity here; a name none of its protectors has is
    /// looked up in the whole keystore, so the error says it does not open `what`.
    pub fn protector_named_for(&self, policy: &PolicyRecord, named: &str, what: &str) -> Result<ProtectorId, OpsError> {
        if let Ok(id) = named.parse::<ProtectorId>() {
            return Ok(id);
        }
        let (list, _) = self.protectors_of(policy);
        let found: Vec<ProtectorRecord> = list.into_iter().filter(|r| r.name == named).collect();
        if found.is_empty() {
            return Ok(self.protector_named(named, None)?.id);
        }
        Ok(one_named(named, found, format!("that open {what}"))?.id)
    }

    /// The one protector of `uid` that opens `policy` (`what` names it in errors): none or
    /// several are errors that say so.
    pub fn own_protector(&self, policy: &PolicyRecord, uid: u32, what: &str) -> Result<ProtectorId, OpsError> {
        let (mut list, _) = self.protectors_of(policy);
        list.retain(|r| r.uid == Some(uid));
        match list.as_slice() {
            [one] => Ok(one.id),
            [] => Err(OpsError::NoneOfYours { uid, what: what.to_string() }),
            many => Err(OpsError::SeveralOfYours { uid, what: what.to_string(), list: listed(many) }),
        }
    }

    /// Refuses, before anything is asked, a protector that cannot be a portable directory's own.
    pub(crate) fn check_travels(&self, choice: &ProtectorChoice<'_>) -> Result<(), OpsError> {
        let (travels, name, kind) = match choice {
            ProtectorChoice::New(n) => (n.kind.travels(), n.name.to_string(), n.kind.name()),
            ProtectorChoice::Existing(id) => {
                let rec = self.keystore.protector(id)?;
                (rec.kind.travels(), rec.name, rec.kind.name())
            }
        };
        if travels {
            Ok(())
        } else {
            Err(OpsError::StaysOnMachine { name, kind })
        }
    }

    /// A protector for a portable policy whose medium's keystore is `medium`: a new one that
    /// travels is saved there, one that does not in this machine's keystore; an existing one is
    /// looked up on the medium, then here, and one that travels is copied to the medium (the same
    /// record, so it opens there as it does here).
    pub(crate) fn resolve_protector_into(
        &mut self,
        choice: ProtectorChoice<'_>,
        medium: &Keystore,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorRecord, ProtectorKey), OpsError> {
        match choice {
            ProtectorChoice::New(n) if n.kind.travels() => self.create_protector_in(&n, ui, medium),
            ProtectorChoice::New(n) => self.create_protector(&n, ui),
            ProtectorChoice::Existing(id) => {
                let (rec, on_medium) = match medium.protector(&id) {
                    Ok(r) => (r, true),
                    Err(KeystoreError::NotFound { .. }) => (self.keystore.protector(&id)?, false),
                    Err(e) => return Err(e.into()),
                };
                let key = self.unlock_protector(&rec, ui)?;
                if !on_medium && rec.kind.travels() {
                    let _guard = medium.lock()?;
                    medium.save_protector(&rec)?;
                }
                Ok((rec, key))
            }
        }
    }

    /// Deletes a protector from the keystore; refused while any policy still uses it.
    pub fn remove_protector(&self, pid: &ProtectorId) -> Result<(), OpsError> {
        let _guard = self.keystore.lock()?;
        self.keystore.remove_protector(pid)?;
        Ok(())
    }

    /// Checks a protector's secret without changing anything.
    pub fn verify_protector(&self, pid: &ProtectorId, ui: &mut dyn Ui) -> Result<ProtectorRecord, OpsError> {
        let rec = self.keystore.protector(pid)?;
        self.unlock_protector(&rec, ui)?;
        Ok(rec)
    }

    /// Gives a protector a new secret (password, PIN): asks the current one, then the new one.
    /// Policies are untouched: they wrap master keys with the protector key, which does not change.
    pub fn change_secret(&self, pid: &ProtectorId, ui: &mut dyn Ui) -> Result<ProtectorRecord, OpsError> {
        let rec = self.keystore.protector(pid)?;
        if rec.kind.ask().secret.is_none() {
            return Err(ProtectorError::NoSecret { name: rec.name, id: rec.id, kind: rec.kind.name() }.into());
        }
        let pkey = self.unlock_protector(&rec, ui)?;
        let new = protector::ask_new(rec.kind.ask(), &rec.name, rec.uid, ui)?;
        self.change_secret_with(pid, &pkey, new.as_ref())
    }

    /// [`Dirseal::change_secret`] for the protector of `dir` that `pick` names (or its only one),
    /// changed where the directory keeps it: a portable directory's medium, or this keystore.
    pub fn change_dir_secret(&self, dir: &Path, pick: Pick, ui: &mut dyn Ui) -> Result<ProtectorRecord, OpsError> {
        let policy = self.policy_of(dir)?;
        let rec = self.protector_of_dir(dir, pick)?;
        let store = match self.protector_of_policy(&policy, &rec.id)? {
            (_, true) => {
                self.medium_of(&policy)?.ok_or(KeystoreError::NotFound { kind: "protector", id: rec.id.to_string() })?
            }
            (_, false) => return self.change_secret(&rec.id, ui),
        };
        if rec.kind.ask().secret.is_none() {
            return Err(ProtectorError::NoSecret { name: rec.name, id: rec.id, kind: rec.kind.name() }.into());
        }
        let pkey = self.unlock_protector(&rec, ui)?;
        let new = protector::ask_new(rec.kind.ask(), &rec.name, rec.uid, ui)?;
        if new.as_ref().is_some_and(Passphrase::is_empty) {
            return Err(UiError::Empty.into());
        }
        let _guard = store.lock()?;
        let rec = store.protector(&rec.id)?;
        let updated = protector::change_secret(&rec, &pkey, &self.config, new.as_ref())?;
        store.save_protector(&updated)?;
        Ok(updated)
    }

    /// The PAM path: the old secret was already verified into `pkey`. The kind keeps its cost
    /// (protector::password: the protector's own Argon2id cost).
    pub fn change_secret_with(
        &self,
        pid: &ProtectorId,
        pkey: &ProtectorKey,
        new: Option<&Passphrase>,
    ) -> Result<ProtectorRecord, OpsError> {
        if new.is_some_and(Passphrase::is_empty) {
            return Err(UiError::Empty.into());
        }
        let _guard = self.keystore.lock()?;
        let rec = self.keystore.protector(pid)?;
        let updated = protector::change_secret(&rec, pkey, &self.config, new)?;
        self.keystore.save_protector(&updated)?;
        Ok(updated)
    }

    /// The protector of `dir` that `pick` names, or the only one.
    pub fn protector_of_dir(&self, dir: &Path, pick: Pick) -> Result<ProtectorRecord, OpsError> {
        let policy = self.policy_of(dir)?;
        let (list, problems) = self.protectors_of(&policy);
        let what = dir.display().to_string();
        let rec = self.pick(&policy, pick, &what, (&list, &problems))?;
        Ok(rec.clone())
    }
}
