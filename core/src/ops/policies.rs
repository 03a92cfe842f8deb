//! Policies: which record a directory's key has (here or on its medium), encrypting an empty
//! directory, adding and removing a policy's protectors.
use std::path::Path;

use super::{Dirseal, OpsError, Pick, ProtectorChoice, Undo};
use crate::fscrypt;
use crate::ids::{KeyIdentifier, ProtectorId};
use crate::keystore::{Keystore, KeystoreError, PolicyRecord};
use crate::portable;
use crate::protector::ProtectorRecord;
use crate::secret::{MasterKey, ProtectorKey};
use crate::ui::Ui;

impl Dirseal {
    /// The kernel's policy for `dir` and the keystore's record for it.
    /// This machine's record comes first: the medium is asked only about a policy this keystore
    /// has no record of (a portable directory), so a record planted on a filesystem never stands
    /// in for a local directory's, and a local one that cannot be read is an error, not a reason
    /// to look elsewhere. A planted one is reported: see [`Dirseal::shadowed`].
    pub fn policy_of(&self, dir: &Path) -> Result<PolicyRecord, OpsError> {
        let policy = fscrypt::get_policy(dir)?.ok_or_else(|| OpsError::NotEncrypted { path: dir.to_path_buf() })?;
        match self.keystore.policy(&policy.identifier) {
            Err(KeystoreError::NotFound { .. }) => {}
            local => return Ok(local?),
        }
        match self.medium_policy(dir, &policy.identifier)? {
            Some(r) => Ok(r),
            None => Err(OpsError::NotManaged { path: dir.to_path_buf(), id: policy.identifier }),
        }
    }

    /// The record of policy `id` on the filesystem holding `dir`, if it keeps one (a portable
    /// directory). A directory with a local record still opens when the medium's records are
    /// unreadable (anyone who can write the root of a shared filesystem can plant a `.dirseal`
    /// there): [`Dirseal::dir_status`] reports that as a problem.
    pub(super) fn medium_policy(&self, dir: &Path, id: &KeyIdentifier) -> Result<Option<PolicyRecord>, OpsError> {
        let mp = fscrypt::mount_point(dir)?;
        let Some(medium) = portable::open_existing(&mp)? else { return Ok(None) };
        match medium.policy(id) {
            Ok(r) => Ok(Some(r)),
            Err(KeystoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The keystore's policy record `id`.
    pub fn policy(&self, id: &KeyIdentifier) -> Result<PolicyRecord, OpsError> {
        Ok(self.keystore.policy(id)?)
    }

    /// `None` when dirseal does not manage `dir` (not encrypted, or no policy record): the case in
    /// which the PAM module steps aside.
    pub fn managed_policy(&self, dir: &Path) -> Result<Option<PolicyRecord>, OpsError> {
        match self.policy_of(dir) {
            Ok(r) => Ok(Some(r)),
            Err(OpsError::NotEncrypted { .. } | OpsError::NotManaged { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Readable protectors of a policy; unreadable ones are reported, not fatal.
    /// A portable policy's protectors are looked up on its medium, then in this machine's
    /// keystore (an extra, local TPM protector); one found in neither was added on another machine
    /// and is left out here without being a problem ([`DirStatus::elsewhere`](super::DirStatus::elsewhere)).
    pub fn protectors_of(&self, policy: &PolicyRecord) -> (Vec<ProtectorRecord>, Vec<String>) {
        let mut ok = Vec::new();
        let mut problems = Vec::new();
        for id in policy.wrapped.keys() {
            match self.protector_of_policy(policy, id) {
                Ok((r, _)) => ok.push(r),
                Err(KeystoreError::NotFound { .. }) if policy.medium.is_some() => {}
                Err(e) => problems.push(e.to_string()),
            }
        }
        (ok, problems)
    }

    /// The medium's keystore of a portable policy; `None` for a local one.
    pub(super) fn medium_of(&self, policy: &PolicyRecord) -> Result<Option<Keystore>, KeystoreError> {
        match &policy.medium {
            Some(mp) => portable::open_existing(mp),
            None => Ok(None),
        }
    }

    /// Protector `id` of `policy`: the medium's record first for a portable policy (the `bool`
    /// says it came from there), else this machine's.
    pub(super) fn protector_of_policy(
        &self,
        policy: &PolicyRecord,
        id: &ProtectorId,
    ) -> Result<(ProtectorRecord, bool), KeystoreError> {
        if let Some(medium) = self.medium_of(policy)? {
            match medium.protector(id) {
                Err(KeystoreError::NotFound { .. }) => {}
                // dirseal never writes one there: a medium's record of a kind bound to a machine
                // was planted, and trying it could spend this machine's TPM tries.
                Ok(r) if !r.kind.travels() => {
                    return Err(KeystoreError::Corrupt {
                        path: medium.protector_path(id),
                        reason: format!(
                            "it is a {} protector, which is bound to a machine and never kept on a medium",
                            r.kind.name()
                        ),
                    })
                }
                r => return r.map(|r| (r, true)),
            }
        }
        self.keystore.protector(id).map(|r| (r, false))
    }

    /// Where the records of `dir`'s policy on its filesystem and this machine's keystore disagree,
    /// each said (in `status`, and by `unlock`), never silently ignored: for a local policy, a
    /// record of it on the filesystem too (planted there: dirseal keeps a policy in one place),
    /// ignored; for a portable one, a local record of one of its protectors that differs from the
    /// medium's, which is used.
    pub fn shadowed(&self, dir: &Path, policy: &PolicyRecord) -> Vec<String> {
        let mut out = Vec::new();
        if policy.medium.is_none() {
            let planted = fscrypt::mount_point(dir).ok().and_then(|mp| portable::open_existing(&mp).ok().flatten());
            if let Some(medium) = planted {
                if !matches!(medium.policy(&policy.id), Err(KeystoreError::NotFound { .. })) {
                    out.push(format!(
                        "{} also holds a record of policy {}, which this machine's keystore keeps: it is ignored \
                         (this directory is not portable, and dirseal never wrote it there); remove it",
                        medium.policy_path(&policy.id).display(),
                        policy.id
                    ));
                }
            }
            return out;
        }
        let Ok(Some(medium)) = self.medium_of(policy) else { return out };
        for id in policy.wrapped.keys() {
            let (Ok(on_medium), local) = (medium.protector(id), self.keystore.protector(id)) else { continue };
            if matches!(local, Err(KeystoreError::NotFound { .. })) || local.as_ref().is_ok_and(|l| *l == on_medium) {
                continue;
            }
            out.push(format!(
                "protector {id} ({}): this machine's keystore has another record with the same id ({}), ignored for \
                 this directory: the medium's is used",
                on_medium.name,
                self.keystore.protector_path(id).display()
            ));
        }
        out
    }

    /// Makes the empty directory `dir` encrypted with a new policy protected by `choice`.
    ///
    /// Order matters for crash safety: the policy record (with the wrapped key) is durable before the
    /// directory is encrypted, so there is never an encrypted directory whose key exists nowhere.
    pub fn encrypt(
        &mut self,
        dir: &Path,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, MasterKey), OpsError> {
        self.encrypt_where(dir, choice, false, ui)
    }

    /// [`Dirseal::encrypt`] for a portable directory: its policy record and its protector's are
    /// kept on its own filesystem (crate::portable), so it opens on any machine. The protector must
    /// travel ([`ProtectorKind::travels`](crate::protector::ProtectorKind::travels)): a TPM's is
    /// refused before anything is asked or written.
    pub fn encrypt_portable(
        &mut self,
        dir: &Path,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, MasterKey), OpsError> {
        self.encrypt_where(dir, choice, true, ui)
    }

    fn encrypt_where(
        &mut self,
        dir: &Path,
        choice: ProtectorChoice<'_>,
        portable: bool,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, MasterKey), OpsError> {
        let meta = std::fs::symlink_metadata(dir).map_err(|e| OpsError::BadDirectory {
            path: dir.to_path_buf(),
            reason: format!("cannot inspect it: {e}"),
        })?;
        if !meta.is_dir() {
            return Err(OpsError::BadDirectory {
                path: dir.to_path_buf(),
                reason: "not a directory (symlinks are not followed)".into(),
            });
        }
        let mp = fscrypt::mount_point(dir)?;
        fscrypt::check_supported(&mp)?;
        if let Some(p) = fscrypt::get_policy(dir)? {
            return Err(OpsError::AlreadyEncrypted { path: dir.to_path_buf(), id: p.identifier });
        }
        let non_empty = std::fs::read_dir(dir)
            .map_err(|e| OpsError::BadDirectory { path: dir.to_path_buf(), reason: format!("cannot list it: {e}") })?
            .next()
            .is_some();
        if non_empty {
            return Err(OpsError::NotEmpty { path: dir.to_path_buf() });
        }
        let store = if portable {
            self.check_travels(&choice)?;
            portable::open_or_create(&mp)?
        } else {
            self.keystore.clone()
        };
        // Until the directory has its policy, a failure (a file put in meanwhile, a read-only
        // remount) takes back the records made for it.
        let mut undo = Undo::watching(&[&self.keystore, &store]);
        let (prec, pkey) = if portable {
            self.resolve_protector_into(choice, &store, ui)?
        } else {
            self.resolve_protector(choice, ui)?
        };
        undo.protector(&prec.id);
        let (policy, master) = Self::draft_policy(dir, &prec, &pkey);
        self.save_new_policy(&policy, &store)?;
        undo.policy(policy.id, &store, mp);
        self.add_key(dir, &master)?;
        fscrypt::set_policy(dir, &policy.id)?;
        undo.keep();
        let policy = PolicyRecord { medium: store.medium().map(Path::to_path_buf), ..policy };
        ui.notice(&format!("encrypted {} (policy {}, protector {} {})", dir.display(), policy.id, prec.id, prec.name));
        Ok((policy, master))
    }

    /// A fresh master key and its policy record protected by `prec`, nothing written: for a caller
    /// that puts the policy on a directory before the record exists ([`Dirseal::save_new_policy`]),
    /// so that every saved record has its directory.
    pub(crate) fn draft_policy(dir: &Path, prec: &ProtectorRecord, pkey: &ProtectorKey) -> (PolicyRecord, MasterKey) {
        let master = MasterKey::random();
        let id = fscrypt::key_identifier(&master);
        let mut policy = PolicyRecord::new(id, Some(dir.to_path_buf()));
        policy.add_protector(&prec.id, pkey, &master);
        (policy, master)
    }

    /// Saves a new policy record in `store` (a portable directory's medium, or this keystore).
    pub(crate) fn save_new_policy(&self, policy: &PolicyRecord, store: &Keystore) -> Result<(), OpsError> {
        let _guard = store.lock()?;
        store.save_policy(policy)?;
        Ok(())
    }

    /// Where the record of policy `id`, of a directory on the filesystem holding `dir`, is kept:
    /// this keystore when it has one (as [`Dirseal::policy_of`] decides), else that filesystem
    /// when it has one there (a portable directory), else this keystore.
    pub(crate) fn store_of_policy(&self, dir: &Path, id: &KeyIdentifier) -> Result<Keystore, OpsError> {
        if !matches!(self.keystore.policy(id), Err(KeystoreError::NotFound { .. })) {
            return Ok(self.keystore.clone());
        }
        let mp = fscrypt::mount_point(dir)?;
        if let Some(medium) = portable::open_existing(&mp)? {
            match medium.policy(id) {
                Ok(_) => return Ok(medium),
                Err(KeystoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(self.keystore.clone())
    }

    /// Adds protector `new` to the policy of `dir` (or of policy `id`), proving access with an
    /// existing protector.
    pub fn add_protector_to_policy(
        &mut self,
        policy_id: &KeyIdentifier,
        with: Pick,
        new: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<ProtectorRecord, OpsError> {
        let policy = self.keystore.policy(policy_id)?;
        self.add_protector_to(&policy, with, new, ui)
    }

    /// [`Dirseal::add_protector_to_policy`] given the policy record ([`Dirseal::policy_of`]). For
    /// a portable policy the records go to its medium, a protector that travels with it, while one
    /// bound to this machine (a TPM) stays in this machine's keystore as an extra, local one.
    pub fn add_protector_to(
        &mut self,
        policy: &PolicyRecord,
        with: Pick,
        new: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
    ) -> Result<ProtectorRecord, OpsError> {
        let policy_id = policy.id;
        let (pid, pkey) = self.unlock_policy_protector(policy, with, &format!("policy {policy_id}"), ui)?;
        let master = self.master_key(policy, &pid, &pkey)?;
        let store = match &policy.medium {
            Some(mp) => portable::open_or_create(mp)?,
            None => self.keystore.clone(),
        };
        let (nrec, nkey) = match policy.medium {
            Some(_) => self.resolve_protector_into(new, &store, ui)?,
            None => self.resolve_protector(new, ui)?,
        };
        let _guard = store.lock()?;
        // Re-read under the lock: another command may have changed the policy meanwhile.
        let mut policy = store.policy(&policy_id)?;
        if policy.wrapped.contains_key(&nrec.id) {
            return Err(OpsError::AlreadyProtects(nrec.id));
        }
        policy.add_protector(&nrec.id, &nkey, &master);
        store.save_policy(&policy)?;
        Ok(nrec)
    }

    /// Removes a protector from one policy; refused if no other readable protector would be left.
    pub fn remove_protector_from_policy(&self, policy_id: &KeyIdentifier, pid: &ProtectorId) -> Result<(), OpsError> {
        self.remove_protector_from(&self.keystore.policy(policy_id)?, pid)
    }

    /// [`Dirseal::remove_protector_from_policy`] given the policy record ([`Dirseal::policy_of`]):
    /// a portable policy keeps at least one readable protector that travels.
    pub fn remove_protector_from(&self, policy: &PolicyRecord, pid: &ProtectorId) -> Result<(), OpsError> {
        let policy_id = &policy.id;
        let store = match &policy.medium {
            Some(mp) => portable::open_or_create(mp)?,
            None => self.keystore.clone(),
        };
        let _guard = store.lock()?;
        let mut policy = store.policy(policy_id)?;
        if !policy.wrapped.contains_key(pid) {
            let list = policy.wrapped.keys().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            return Err(OpsError::NotAProtectorOf { id: *pid, what: format!("policy {policy_id}"), list });
        }
        // The last *readable* protector counts as the last one: removing it would strand the key.
        let others: Vec<ProtectorRecord> = policy
            .wrapped
            .keys()
            .filter(|k| *k != pid)
            .filter_map(|k| self.protector_of_policy(&policy, k).ok().map(|(r, _)| r))
            .collect();
        if others.is_empty() {
            return Err(KeystoreError::LastProtector { policy: *policy_id }.into());
        }
        if policy.medium.is_some() && !others.iter().any(|r| r.kind.travels()) {
            return Err(OpsError::LastTravelling { policy: *policy_id, protector: *pid });
        }
        policy.remove_protector(pid)?;
        store.save_policy(&policy)?;
        Ok(())
    }
}
