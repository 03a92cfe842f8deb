//! Unlocking and locking a directory, and picking which of its protectors opens it.
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::errors::listed;
use super::{Dirseal, OpsError, Pick};
use crate::census::ProtectorSummary;
use crate::fscrypt::{self, KeyStatus};
use crate::ids::ProtectorId;
use crate::keystore::PolicyRecord;
use crate::protector::{self, ProtectorError, ProtectorRecord};
use crate::secret::{MasterKey, ProtectorKey};
use crate::ui::Ui;

/// What [`Dirseal::unlock_marked`] did for one directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marked {
    /// Its key was loaded.
    Unlocked,
    /// It was unlocked already: nothing was asked of its server.
    AlreadyUnlocked,
}

/// What `dirseal lock` achieved.
#[derive(Clone, Debug, Serialize)]
pub struct LockReport {
    /// The directory.
    pub path: PathBuf,
    /// The key is fully gone: names are ciphertext again.
    pub locked: bool,
    /// It was locked before this call (nothing was removed).
    pub already_locked: bool,
    /// Files were still open, so the kernel kept their inodes unlocked.
    pub files_busy: bool,
    /// Other users had also added this key; only root's `--all-users` removes theirs.
    pub other_users: bool,
    /// Processes still holding files under it (why the lock is incomplete).
    pub busy: Vec<BusyProcess>,
}

/// A process holding files under a directory being locked.
#[derive(Clone, Debug, Serialize)]
pub struct BusyProcess {
    /// Its process id.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// The user it runs as.
    pub uid: u32,
    /// "cwd", "open file /x/y", ...
    pub how: String,
}

impl From<dirseal_procs::ProcessUse> for BusyProcess {
    fn from(p: dirseal_procs::ProcessUse) -> Self {
        BusyProcess { pid: p.pid, comm: p.comm, uid: p.uid, how: p.how }
    }
}

impl Dirseal {
    /// Loads `dir`'s key for `uid` with no protector named: `uid`'s own protectors of it are tried
    /// in the login order ([`Dirseal::login_protectors`]), each asked of the Ui, until one opens.
    pub fn unlock_as(&self, dir: &Path, uid: u32, ui: &mut dyn Ui) -> Result<(), OpsError> {
        self.unlock_as_where(dir, uid, ui, |_| true)
    }

    /// [`Dirseal::unlock_as`] over the protectors `keep` accepts, asked of each just before it
    /// would be tried (a front end's own rule, such as the service's PIN tries): one refused is
    /// skipped and the next tried. With none accepted the error is [`OpsError::OpensNone`].
    pub fn unlock_as_where(
        &self,
        dir: &Path,
        uid: u32,
        ui: &mut dyn Ui,
        mut keep: impl FnMut(&ProtectorRecord) -> bool,
    ) -> Result<(), OpsError> {
        if self.is_unlocked(dir)? {
            ui.notice(&format!("{} is already unlocked", dir.display()));
            return Ok(());
        }
        let policy = self.policy_of(dir)?;
        let what = dir.display().to_string();
        let list = self.login_protectors(&policy, uid);
        match list.as_slice() {
            [] => return Err(OpsError::NoneOfYours { uid, what }),
            [one] if keep(one) => return self.unlock(dir, Pick { protector: Some(one.id) }, ui),
            [_] => return Err(OpsError::OpensNone { uid, what, list: listed(&list) }),
            _ => {}
        }
        let login = self.first_opening(&policy, uid, ui, keep)?;
        match login.opened {
            Some((_, master)) => {
                self.add_key(dir, &master)?;
                ui.notice(&format!("unlocked {what}"));
                Ok(())
            }
            None => match login.problems.into_iter().next() {
                Some((_, e)) => Err(e),
                None => Err(OpsError::OpensNone { uid, what, list: listed(&list) }),
            },
        }
    }

    /// Unwraps a policy's master key with an unlocked protector and checks it really is the key of
    /// that policy: a forged or swapped keystore entry never yields a key for the wrong directory.
    pub fn master_key(
        &self,
        policy: &PolicyRecord,
        pid: &ProtectorId,
        pkey: &ProtectorKey,
    ) -> Result<MasterKey, OpsError> {
        let master = policy.unwrap_master(pid, pkey)?;
        let got = fscrypt::key_identifier(&master);
        if got != policy.id {
            return Err(OpsError::KeyMismatch { policy: policy.id, got });
        }
        Ok(master)
    }

    pub(super) fn pick<'p>(
        &self,
        policy: &PolicyRecord,
        pick: Pick,
        what: &str,
        (list, problems): (&'p [ProtectorRecord], &[String]),
    ) -> Result<&'p ProtectorRecord, OpsError> {
        // A protector whose file cannot be used is reported as such, not as "no protector".
        let unusable = || OpsError::Unusable { what: what.to_string(), problems: problems.join("; ") };
        let names =
            || list.iter().map(|r| format!("{} ({}, {})", r.id, r.name, r.kind.name())).collect::<Vec<_>>().join(", ");
        if let Some(id) = pick.protector {
            return list.iter().find(|r| r.id == id).ok_or_else(|| {
                if policy.wrapped.contains_key(&id) {
                    match self.protector_of_policy(policy, &id) {
                        Err(e) => OpsError::Keystore(e),
                        Ok(_) => unusable(),
                    }
                } else {
                    OpsError::NotAProtectorOf { id, what: what.to_string(), list: names() }
                }
            });
        }
        match list {
            [one] => Ok(one),
            [] if !problems.is_empty() => Err(unusable()),
            [] => Err(OpsError::NoProtector { what: what.to_string() }),
            _ => Err(OpsError::AmbiguousProtector { what: what.to_string(), list: names() }),
        }
    }

    /// The master key of `dir`'s policy, asking the Ui for the chosen protector's secret.
    pub fn master_key_of_dir(
        &self,
        dir: &Path,
        pick: Pick,
        ui: &mut dyn Ui,
    ) -> Result<(PolicyRecord, MasterKey), OpsError> {
        let policy = self.policy_of(dir)?;
        let what = dir.display().to_string();
        let picked = pick.protector;
        let (pid, pkey) = match self.unlock_policy_protector(&policy, pick, &what, ui) {
            Err(OpsError::Protector(e @ ProtectorError::NotNow(_))) => {
                return Err(self.use_another(&policy, dir, picked, e));
            }
            r => r?,
        };
        let master = self.master_key(&policy, &pid, &pkey)?;
        Ok((policy, master))
    }

    /// `e` (a TPM protector that cannot open now) with what else opens `dir`: its other protectors
    /// and its recovery key. `picked` is the one that failed (else the policy has only one).
    fn use_another(
        &self,
        policy: &PolicyRecord,
        dir: &Path,
        picked: Option<ProtectorId>,
        e: ProtectorError,
    ) -> OpsError {
        let (list, _) = self.protectors_of(policy);
        let failed = picked.or_else(|| (list.len() == 1).then(|| list[0].id));
        let others = list.iter().filter(|r| Some(r.id) != failed).map(ProtectorSummary::of).collect();
        let recovery = crate::recovery::read_blob(dir).is_ok_and(|b| b.is_some());
        OpsError::UseAnother { source: e, dir: dir.to_path_buf(), others, recovery }
    }

    /// Picks one of `policy`'s protectors (`what` names the policy in errors) and unlocks it.
    pub(crate) fn unlock_policy_protector(
        &self,
        policy: &PolicyRecord,
        pick: Pick,
        what: &str,
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorId, ProtectorKey), OpsError> {
        let (list, problems) = self.protectors_of(policy);
        if pick.protector.is_none() && list.len() > 1 {
            return self.unlock_untyped_first(policy, what, (list, problems), ui);
        }
        let rec = self.pick(policy, pick, what, (&list, &problems))?;
        let pkey = self.unlock_protector(rec, ui)?;
        Ok((rec.id, pkey))
    }

    /// Several protectors and none chosen: those that need nothing typed (a security key to
    /// touch) are tried first, in the login order; when none opens, the one protector left that
    /// needs a secret is asked for it, and with several the caller must choose.
    fn unlock_untyped_first(
        &self,
        policy: &PolicyRecord,
        what: &str,
        (mut list, problems): (Vec<ProtectorRecord>, Vec<String>),
        ui: &mut dyn Ui,
    ) -> Result<(ProtectorId, ProtectorKey), OpsError> {
        protector::login_order(&mut list, rustix::process::getuid().as_raw());
        let (untyped, typed): (Vec<_>, Vec<_>) = list.into_iter().partition(|r| r.kind.ask().secret.is_none());
        let mut last = None;
        for rec in &untyped {
            match self.unlock_protector(rec, ui) {
                Ok(k) => return Ok((rec.id, k)),
                Err(OpsError::Ui(e)) => return Err(e.into()),
                Err(e) => {
                    ui.notice(&format!("protector {} ({}): {e}", rec.name, rec.id));
                    last = Some(e);
                }
            }
        }
        match (typed.as_slice(), last) {
            ([], Some(e)) => Err(e),
            (typed, _) => {
                let rec = self.pick(policy, Pick { protector: None }, what, (typed, &problems))?;
                Ok((rec.id, self.unlock_protector(rec, ui)?))
            }
        }
    }

    /// Adds `key` to the kernel for the filesystem holding `dir`.
    pub fn add_key(&self, dir: &Path, key: &MasterKey) -> Result<(), OpsError> {
        let mp = fscrypt::mount_point(dir)?;
        fscrypt::add_key(&mp, key)?;
        Ok(())
    }

    /// Whether `dir` is encrypted and its key is fully loaded, so unlocking has nothing to do.
    /// A partly removed key is not: adding it again is what finishes an interrupted lock's undo.
    pub(crate) fn is_unlocked(&self, dir: &Path) -> Result<bool, OpsError> {
        let Some(policy) = fscrypt::get_policy(dir)? else { return Ok(false) };
        let mp = fscrypt::mount_point(dir)?;
        Ok(fscrypt::key_status(&mp, &policy.identifier)? == KeyStatus::Present)
    }

    /// Loads `dir`'s key, asking for a protector's secret; an unlocked directory asks nothing.
    pub fn unlock(&self, dir: &Path, pick: Pick, ui: &mut dyn Ui) -> Result<(), OpsError> {
        if self.is_unlocked(dir)? {
            ui.notice(&format!("{} is already unlocked", dir.display()));
            return Ok(());
        }
        let (policy, master) = self.master_key_of_dir(dir, pick, ui)?;
        for note in self.shadowed(dir, &policy) {
            ui.notice(&note);
        }
        self.add_key(dir, &master)?;
        ui.notice(&format!("unlocked {}", dir.display()));
        Ok(())
    }

    /// Unlocks each directory `[tang] unlock_at_boot` names ([`crate::config::TangConfig`]) with
    /// its machine keys only (protectors that open no login and ask nothing: a tang server's),
    /// asking nothing: what `dirseal-unlock-boot.service` runs. Each directory has its own answer;
    /// one that fails (its server unreachable, no such protector) does not stop the others.
    pub fn unlock_marked(&self, ui: &mut dyn Ui) -> Vec<(PathBuf, Result<Marked, OpsError>)> {
        let dirs = self.config().tang.unlock_at_boot.clone();
        dirs.into_iter()
            .map(|dir| {
                let r = self.unlock_with_machine_keys(&dir, ui);
                (dir, r)
            })
            .collect()
    }

    fn unlock_with_machine_keys(&self, dir: &Path, ui: &mut dyn Ui) -> Result<Marked, OpsError> {
        if self.is_unlocked(dir)? {
            return Ok(Marked::AlreadyUnlocked);
        }
        let st = self.dir_status(dir)?;
        let machine: Vec<ProtectorId> = st
            .protectors
            .iter()
            .filter(|p| {
                self.keystore()
                    .protector(&p.id)
                    .is_ok_and(|r| !r.kind.opens_login() && r.kind.ask().secret.is_none() && !r.kind.ask().touch)
            })
            .map(|p| p.id)
            .collect();
        let mut last = None;
        for id in machine {
            match self.unlock(dir, Pick { protector: Some(id) }, ui) {
                Ok(()) => return Ok(Marked::Unlocked),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| OpsError::BadDirectory {
            path: dir.to_path_buf(),
            reason: "it has no network (tang) protector to unlock it at boot; add one (`dirseal policy add-protector` \
                     with a protector made by `dirseal protector create --type tang --url URL`) or take it out of \
                     [tang] unlock_at_boot in the configuration"
                .into(),
        }))
    }

    /// Removes the key. Busy files keep their inodes unlocked until closed: the report names the
    /// processes holding them so the caller can say "close these and run lock again".
    pub fn lock(&self, dir: &Path, all_users: bool) -> Result<LockReport, OpsError> {
        let policy = fscrypt::get_policy(dir)?.ok_or_else(|| OpsError::NotEncrypted { path: dir.to_path_buf() })?;
        let mp = fscrypt::mount_point(dir)?;
        // The key locks its whole tree: the report names the tree, not the subdirectory asked.
        let dir = &fscrypt::encrypted_root(dir, &policy)?;
        // Locking a locked directory achieves what was asked: say so, as unlock does for an
        // unlocked one, instead of the kernel's "key not present".
        if fscrypt::key_status(&mp, &policy.identifier)? == KeyStatus::Absent {
            return Ok(LockReport {
                path: dir.to_path_buf(),
                locked: true,
                already_locked: true,
                files_busy: false,
                other_users: false,
                busy: Vec::new(),
            });
        }
        let out = fscrypt::remove_key(&mp, &policy.identifier, all_users)?;
        let status = fscrypt::key_status(&mp, &policy.identifier)?;
        let busy = if out.files_busy {
            dirseal_procs::find_users(dir).unwrap_or_default().into_iter().map(BusyProcess::from).collect()
        } else {
            Vec::new()
        };
        Ok(LockReport {
            path: dir.to_path_buf(),
            locked: status == KeyStatus::Absent,
            already_locked: false,
            files_busy: out.files_busy,
            other_users: out.other_users,
            busy,
        })
    }
}
