//! The way back: an encrypted directory (the unlocked root of its policy) becomes plaintext in
//! place, through the same engine as [`crate::convert`] run the other way
//! ([`Direction::Decrypt`]): the tree is copied (or moved) into a plain staging directory inside
//! the root-only work dir, verified, swapped in, and the encrypted tree disposed of. Then nothing
//! is left half-managed: the policy record and the protectors only it used are removed, the
//! directory's recovery attribute goes (any recovery key made for it opens nothing now) and the
//! key leaves the kernel, so the PAM module finds no policy and leaves the user alone.
//!
//! The shape is convert's: [`plan`] (an unfinished decrypt is resumed) → [`NewPlan::run`] or
//! [`ResumePlan::run`]; [`finish`] aborts, rolls back or commits; [`crate::convert::cancel`]'s
//! rules apply to a stopped run.
use std::path::Path;

use dirseal_migrate::{self as migrate, Direction, MigrateError, Outcome, State};

use crate::convert::{
    absolute, finish_going, load_staging_key, other_direction, owner_idle, resume, staging_key_needed, unfinished,
    workdir_for, ConvertError, Finish, Hooks, KeyHost, NewRun, Options, Planned, ResumeRun,
};
use crate::fscrypt::{self, KeyStatus};
use crate::ids::{KeyIdentifier, ProtectorId};
use crate::ops::{Dirseal, OpsError, Pick};
use crate::securefile;
use crate::ui::{Question, Ui};

/// A checked decrypt: a new one ([`NewPlan::run`]), or one that stopped part-way, or whose
/// clean-up did ([`ResumePlan::run`] finishes it).
pub type Plan = Planned<NewPlan, ResumePlan>;

/// A new decrypt that passed every check; the directory is unlocked, and `key` is its policy.
pub type NewPlan = NewRun<KeyIdentifier>;

/// An unfinished decrypt (the journal's state; `Done` when only the clean-up is left).
pub type ResumePlan = ResumeRun<SourceKey>;

/// The key of an unfinished decrypt: the directory's own.
#[derive(Clone, Copy, Debug)]
pub struct SourceKey {
    /// The directory's policy.
    pub policy: KeyIdentifier,
    /// Whether its key must be loaded again first (after a reboot).
    pub needed: bool,
}

/// What a decrypt achieved, and what it left of the directory's encryption.
#[derive(Debug)]
pub struct Decrypted {
    /// The engine's account.
    pub outcome: Outcome,
    /// Set once the decrypt is done: what the clean-up removed.
    pub forgotten: Option<Forgotten>,
    /// The directory was plaintext already: this run only finished the clean-up of one cut
    /// short (the outcome counts nothing).
    pub cleanup_only: bool,
}

/// The clean-up after a decrypt: the policy and everything that only served it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Forgotten {
    /// The policy whose record was removed.
    pub policy: String,
    /// Protectors removed (they protected only this directory): `name (id)`.
    pub protectors_removed: Vec<String>,
    /// Protectors kept: used by other directories too, or `keep_protectors` asked.
    pub protectors_kept: Vec<String>,
    /// The directory carried a recovery blob, now removed: its recovery keys are void.
    pub recovery_removed: bool,
    /// The key was removed from the kernel (false: it was not loaded any more).
    pub key_removed: bool,
}

/// Checks a decrypt of `dir`: an unfinished one is resumed (a done one whose clean-up was cut
/// short finishes it); a new one needs the root of a policy dirseal manages, not inside another
/// encrypted directory, whose owner is not logged in (unless forced) and can log in by password
/// afterwards. A locked directory is unlocked first with the protector `pick` names (the Ui asks
/// its secret), so that the census can read it.
pub fn plan(
    ds: &Dirseal,
    dir: &Path,
    options: Options,
    pick: Pick,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
) -> Result<Plan, ConvertError> {
    // Refused for every front end before anything is looked at.
    if options.wipe {
        return Err(ConvertError::WipeOnDecrypt { path: dir.to_path_buf() });
    }
    let source = absolute(dir)?;
    let workdir = workdir_for(&source)?;
    let bad = |reason: String| ConvertError::Path { path: source.clone(), reason };
    if let Some(v) = migrate::status(&workdir)? {
        if unfinished(v.state) && v.direction != Direction::Decrypt {
            return Err(other_direction(&v, Direction::Decrypt).into());
        }
        let cleanup_left = v.direction == Direction::Decrypt && v.state == State::Done;
        if unfinished(v.state) || cleanup_left {
            let policy: KeyIdentifier =
                v.token.parse().map_err(|_| ConvertError::BadToken { path: source.clone(), token: v.token.clone() })?;
            if cleanup_left && !forget_pending(ds, &source, &policy)? {
                // Finished and cleaned up: a new decrypt of whatever is there now.
            } else {
                let key_needed = unfinished(v.state) && staging_key_needed(&source, &v)?.is_some();
                let key = SourceKey { policy, needed: key_needed };
                return Ok(Plan::Resume(ResumePlan { source, workdir, options, state: v.state, key }));
            }
        }
    }
    let kernel = fscrypt::get_policy(&source)
        .map_err(OpsError::from)?
        .ok_or_else(|| bad("is not encrypted; there is nothing to decrypt".into()))?;
    if let Some(parent) = source.parent() {
        if fscrypt::get_policy(parent).map_err(OpsError::from)?.is_some() {
            return Err(bad(format!(
                "is inside the encrypted directory {}: only the root of an encrypted tree can be decrypted (decrypt the root, or copy this part out)",
                parent.display()
            )));
        }
    }
    let id = kernel.identifier;
    let record = ds.keystore().policy(&id).map_err(|_| {
        bad(format!("is encrypted with policy {id}, which dirseal's keystore does not hold; dirseal can only decrypt directories it manages"))
    })?;
    let owner = owner_idle(&source, &options)?;
    refuse_pin_only(ds, &source, &record, owner.uid)?;
    if !key_loaded(&source, &id)? {
        ds.unlock(&source, pick, ui)?;
    }
    // No recovery key is made: the summary says so.
    let options = Options { recovery_key: Some(false), ..options };
    Ok(Plan::New(NewPlan::check(&KeyHost::decrypting(ds, &source, id, hooks), workdir, options, owner, id)?))
}

fn key_loaded(source: &Path, id: &KeyIdentifier) -> Result<bool, ConvertError> {
    let mp = fscrypt::mount_point(source).map_err(OpsError::from)?;
    Ok(fscrypt::key_status(&mp, id).map_err(OpsError::from)? == KeyStatus::Present)
}

/// After decrypting, the owner logs in as an ordinary account (the PAM module no longer knows
/// them): one whose only login is a TPM PIN, with no password hash in /etc/shadow, would be
/// locked out.
fn refuse_pin_only(
    ds: &Dirseal,
    source: &Path,
    policy: &crate::keystore::PolicyRecord,
    uid: u32,
) -> Result<(), ConvertError> {
    if uid == 0 {
        return Ok(());
    }
    let Some(user) = crate::account::login_name(uid) else {
        return Ok(());
    };
    let pin = ds.is_pin_login(&user) || ds.pin_protector(policy, uid).is_some();
    let no_password = crate::account::shadow(&user).ok().flatten().is_some_and(|s| !s.has_hash);
    if pin && no_password {
        return Err(ConvertError::PinLoginOnly { path: source.to_path_buf(), user });
    }
    Ok(())
}

impl Plan {
    /// Runs the plan: a new decrypt ([`NewPlan::run`]; [`plan`] unlocked the directory
    /// already), or an unfinished one, whose key the protector `pick` names loads again if needed
    /// ([`ResumePlan::run`]). `keep_protectors` keeps every protector once it is done.
    pub fn run(
        self,
        ds: &mut Dirseal,
        pick: Pick,
        keep_protectors: bool,
        ui: &mut dyn Ui,
        hooks: &Hooks<'_>,
    ) -> Result<Decrypted, ConvertError> {
        match self {
            Plan::New(plan) => plan.run(ds, keep_protectors, ui, hooks),
            Plan::Resume(plan) => plan.run(ds, pick, keep_protectors, ui, hooks),
        }
    }
}

impl NewPlan {
    /// Runs a new decrypt: the Ui confirms ([`Question::Decrypt`]), the engine copies (or
    /// moves), verifies and swaps; once done, the policy is forgotten (see [`Forgotten`];
    /// `keep_protectors` keeps every protector).
    pub fn run(
        self,
        ds: &mut Dirseal,
        keep_protectors: bool,
        ui: &mut dyn Ui,
        hooks: &Hooks<'_>,
    ) -> Result<Decrypted, ConvertError> {
        self.confirm(|dir, summary| Question::Decrypt { dir, summary }, ui)?;
        let (source, policy, uid) = (self.source.clone(), self.key, self.owner.uid);
        let outcome = self.start(&KeyHost::decrypting(ds, &source, policy, hooks))?;
        let forgotten = after(ds, &source, &outcome, &policy, uid, keep_protectors)?;
        Ok(Decrypted { outcome, forgotten, cleanup_only: false })
    }
}

impl ResumePlan {
    /// Resumes an unfinished decrypt (loading the directory's key again first if needed, with
    /// the protector `pick` names), or finishes the clean-up of a done one.
    pub fn run(
        self,
        ds: &mut Dirseal,
        pick: Pick,
        keep_protectors: bool,
        ui: &mut dyn Ui,
        hooks: &Hooks<'_>,
    ) -> Result<Decrypted, ConvertError> {
        let ResumePlan { source, workdir, options, state, key: SourceKey { policy, needed } } = self;
        if needed {
            load_staging_key(ds, &source, &policy, pick, ui)?;
        }
        if state == State::Done {
            // Only the clean-up is left (a run stopped in it): the engine has nothing to do.
            let uid = crate::convert::owner_of(&source)?.uid;
            let outcome = Outcome {
                state,
                method: migrate::status(&workdir)?.map_or(migrate::Method::Copy, |v| v.method),
                token: policy.to_string(),
                files: 0,
                bytes: 0,
                backup: None,
                notes: Vec::new(),
                timings: Default::default(),
            };
            let forgotten = Some(forget(ds, &source, &policy, uid, keep_protectors)?);
            return Ok(Decrypted { outcome, forgotten, cleanup_only: true });
        }
        let outcome = resume(&KeyHost::decrypting(ds, &source, policy, hooks), &workdir, &options, state, ui)?;
        let uid = crate::convert::owner_of(&source)?.uid;
        let forgotten = after(ds, &source, &outcome, &policy, uid, keep_protectors)?;
        Ok(Decrypted { outcome, forgotten, cleanup_only: false })
    }
}

/// Ends a decrypt other than completing it: abort before the swap, rollback (the encrypted tree
/// back) or commit (then the policy is forgotten, as after a run) after a swap that kept it.
pub fn finish(
    ds: &mut Dirseal,
    dir: &Path,
    how: Finish,
    keep_protectors: bool,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
) -> Result<Decrypted, ConvertError> {
    let source = absolute(dir)?;
    let outcome = finish_going(&KeyHost::new(ds, &source, hooks).going(Direction::Decrypt), how, ui)?;
    let forgotten = match outcome.token.parse::<KeyIdentifier>() {
        Ok(id) if outcome.state == State::Done => {
            let uid = crate::convert::owner_of(&source)?.uid;
            after(ds, &source, &outcome, &id, uid, keep_protectors)?
        }
        _ => None,
    };
    Ok(Decrypted { outcome, forgotten, cleanup_only: false })
}

/// Whether a done decrypt of `source` still has clean-up to do: its policy record is there, its
/// key is loaded, or its clean-up was recorded and not finished.
fn forget_pending(ds: &Dirseal, source: &Path, id: &KeyIdentifier) -> Result<bool, ConvertError> {
    Ok(ds.keystore().policy(id).is_ok() || key_loaded(source, id)? || Cleanup::read(&workdir_for(source)?)?.is_some())
}

fn after(
    ds: &mut Dirseal,
    source: &Path,
    outcome: &Outcome,
    id: &KeyIdentifier,
    uid: u32,
    keep_protectors: bool,
) -> Result<Option<Forgotten>, ConvertError> {
    if outcome.state != State::Done {
        return Ok(None);
    }
    forget(ds, source, id, uid, keep_protectors).map(Some)
}

/// What a decrypt's clean-up removes, written to the work dir (beside the journal) before it
/// removes anything: a run cut short after the policy record is gone still knows which
/// protectors served only that policy, and the same command finishes them. Removed last.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Cleanup {
    /// The decrypted directory's policy.
    policy: KeyIdentifier,
    /// Protectors that served only it (and `keep_protectors` did not keep): removed.
    remove: Vec<ProtectorId>,
    /// Protectors kept (other directories use them, or they were asked to be kept): `name (id)`.
    kept: Vec<String>,
}

impl Cleanup {
    const FILE: &'static str = "decrypt-cleanup.json";
    const MAX: u64 = 1 << 20;

    fn read(workdir: &Path) -> Result<Option<Cleanup>, ConvertError> {
        let path = workdir.join(Self::FILE);
        let bad = |reason: String| ConvertError::Path { path: path.clone(), reason };
        match securefile::read_private(&path, Self::MAX) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                bad(format!("is not a decrypt clean-up record ({e}); remove it and run the decrypt again"))
            }),
            Err(securefile::SecureFileError::NotFound { .. }) => Ok(None),
            Err(e) => Err(bad(e.to_string())),
        }
    }

    fn write(&self, workdir: &Path) -> Result<(), ConvertError> {
        let path = workdir.join(Self::FILE);
        // Invariant: ids and strings always serialize.
        let json = serde_json::to_vec_pretty(self).expect("a clean-up record serializes");
        // A run cut short while writing it left a temporary copy (the decrypt's lock keeps any
        // other writer out): the work dir ends with nothing of it.
        securefile::remove_stale_temps(&path)
            .and_then(|()| securefile::write_atomic(&path, &json))
            .map_err(|e| ConvertError::Path { path, reason: e.to_string() })
    }

    fn remove(workdir: &Path) -> Result<(), ConvertError> {
        let path = workdir.join(Self::FILE);
        if let Err(e) = securefile::remove_stale_temps(&path) {
            return Err(ConvertError::Path { path, reason: e.to_string() });
        }
        match securefile::remove_durable(&path) {
            Ok(()) | Err(securefile::SecureFileError::NotFound { .. }) => Ok(()),
            Err(e) => Err(ConvertError::Path { path, reason: e.to_string() }),
        }
    }

    /// What to remove of `id`'s record: each protector only it uses, unless `keep_protectors`.
    fn of(ds: &Dirseal, id: &KeyIdentifier, keep_protectors: bool) -> Result<Cleanup, ConvertError> {
        let mut c = Cleanup { policy: *id, remove: Vec::new(), kept: Vec::new() };
        let Ok(record) = ds.keystore().policy(id) else { return Ok(c) };
        for pid in record.wrapped.keys().copied() {
            let Ok(prec) = ds.keystore().protector(&pid) else { continue };
            let others = ds.keystore().policies_using(&pid).map_err(OpsError::from)?.into_iter().any(|p| p != *id);
            if keep_protectors || others {
                c.kept.push(format!("{} ({})", prec.name, prec.id));
            } else {
                c.remove.push(pid);
            }
        }
        Ok(c)
    }
}

/// The protectors an unfinished decrypt's clean-up has still to remove, with its directory (the
/// journal's source), found in the work dirs of every mounted filesystem: `status` names them
/// as such, with the command that finishes the clean-up.
pub fn unfinished_cleanups() -> Vec<(std::path::PathBuf, ProtectorId)> {
    let Ok(views) = crate::convert::recorded() else { return Vec::new() };
    views
        .into_iter()
        .filter(|v| v.direction == Direction::Decrypt && v.state == State::Done)
        .filter_map(|v| Some((workdir_for(&v.source).ok()?, v.source)))
        .filter_map(|(w, src)| Some((src, Cleanup::read(&w).ok()??)))
        .flat_map(|(src, c)| c.remove.into_iter().map(move |id| (src.clone(), id)))
        .collect()
}

/// The clean-up of a done decrypt, each step repeatable (a run killed anywhere in it finishes it
/// when run again): the recovery attribute goes from the now plain directory; what will be
/// removed is recorded ([`Cleanup`]); then the policy record loses each protector only it uses,
/// the record goes, then the last such protector, then the key, then the record of the clean-up.
/// A PIN-login mark of the owner goes with their PIN protector.
fn forget(
    ds: &mut Dirseal,
    source: &Path,
    id: &KeyIdentifier,
    uid: u32,
    keep_protectors: bool,
) -> Result<Forgotten, ConvertError> {
    use migrate::fault::{point, Point};
    let mut f = Forgotten { policy: id.to_string(), ..Forgotten::default() };
    // The swap made `source` the plain tree; it must not be encrypted (by this or any policy).
    if fscrypt::get_policy(source).map_err(OpsError::from)?.is_some() {
        return Err(ConvertError::Path {
            path: source.to_path_buf(),
            reason: "is still encrypted after the decrypt; run `dirseal decrypt --status` on it".into(),
        });
    }
    f.recovery_removed = crate::recovery::remove_blob(source)
        .map_err(|e| ConvertError::Path { path: source.into(), reason: e.to_string() })?;
    // The key is gone, and so goes its escrow record.
    ds.forget_escrow(id)?;
    point(Point::CleanupRecoveryRemoved);
    let workdir = workdir_for(source)?;
    let _guard = ds.keystore().lock().map_err(OpsError::from)?;
    let cleanup = match Cleanup::read(&workdir)? {
        // A run cut short: its record decides, whatever this run was asked.
        Some(c) if c.policy == *id => c,
        _ => {
            let c = Cleanup::of(ds, id, keep_protectors)?;
            c.write(&workdir)?;
            point(Point::CleanupRecorded);
            c
        }
    };
    f.protectors_kept.clone_from(&cleanup.kept);
    let mut removed = |ds: &mut Dirseal, pid: &ProtectorId| -> Result<(), ConvertError> {
        let Ok(prec) = ds.keystore().protector(pid) else { return Ok(()) };
        ds.keystore().remove_protector(pid).map_err(OpsError::from)?;
        point(Point::CleanupProtectorRemoved);
        forget_pin_login(ds, &prec, uid)?;
        f.protectors_removed.push(format!("{} ({})", prec.name, prec.id));
        Ok(())
    };
    if let Ok(mut record) = ds.keystore().policy(id) {
        // Each protector leaves the record before its own is removed, so that the record never
        // names a protector that is gone. A record must list one protector: the last goes right
        // after the record itself.
        let (last, others) = cleanup.remove.split_last().map_or((None, &[][..]), |(l, o)| (Some(l), o));
        for pid in others {
            if record.wrapped.remove(pid).is_some() {
                ds.keystore().save_policy(&record).map_err(OpsError::from)?;
                point(Point::CleanupPolicySaved);
            }
            removed(ds, pid)?;
        }
        ds.keystore().remove_policy(id).map_err(OpsError::from)?;
        point(Point::CleanupPolicyRemoved);
        if let Some(pid) = last {
            removed(ds, pid)?;
        }
    } else {
        // The record is gone already: what is left of the recorded protectors goes now.
        for pid in &cleanup.remove {
            removed(ds, pid)?;
        }
    }
    point(Point::AfterPolicyForgotten);
    let mp = fscrypt::mount_point(source).map_err(OpsError::from)?;
    f.key_removed = match fscrypt::remove_key(&mp, id, true) {
        Ok(_) => true,
        Err(fscrypt::FscryptError::KeyNotPresent { .. }) => false,
        Err(e) => return Err(OpsError::from(e).into()),
    };
    point(Point::CleanupKeyRemoved);
    Cleanup::remove(&workdir)?;
    Ok(f)
}

/// The recorded decrypt of `source`, if the journal there is one (a conversion's is `None`).
pub fn status(source: &Path) -> Result<Option<migrate::StatusView>, ConvertError> {
    Ok(crate::convert::status(source)?.filter(|v| v.direction == Direction::Decrypt))
}

/// Refuses a recorded conversion going the other way (for front ends that look first).
pub fn check_direction(v: &migrate::StatusView) -> Result<(), MigrateError> {
    if unfinished(v.state) && v.direction != Direction::Decrypt {
        return Err(other_direction(v, Direction::Decrypt));
    }
    Ok(())
}

/// The owner's PIN login ends with their TPM PIN protector (they log in by password now).
fn forget_pin_login(ds: &mut Dirseal, prec: &crate::protector::ProtectorRecord, uid: u32) -> Result<(), ConvertError> {
    if crate::ops::opens_pin_login(prec) && prec.uid == Some(uid) {
        if let Some(user) = crate::account::login_name(uid) {
            ds.disable_pin_login(&user)?;
        }
    }
    Ok(())
}

/// After a decrypt stopped by its stop flag at `state`: aborts it whenever the state allows
/// (the encrypted directory is whole again), else leaves it to be resumed (convert's rules).
pub fn cancel(
    ds: &mut Dirseal,
    dir: &Path,
    state: State,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
) -> Result<crate::convert::Cancelled, ConvertError> {
    if !state.abortable() {
        return Ok(crate::convert::Cancelled::PastSwap(state));
    }
    Ok(crate::convert::Cancelled::Aborted(finish(ds, dir, Finish::Abort, false, ui, hooks)?.outcome))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::secret::Passphrase;
    use crate::ui::{SecretPrompt, UiError};

    struct NoUi;

    impl Ui for NoUi {
        fn secret(&mut self, _: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
            Err(UiError::Cancelled)
        }
    }

    /// Wiping is a conversion's: the core refuses it for a decrypt, whichever front end asks.
    #[test]
    fn a_decrypt_refuses_to_wipe() {
        let dir = tempfile::tempdir().unwrap();
        let ds = Dirseal::open(&dir.path().join("config.toml"), Some(&dir.path().join("keystore"))).unwrap();
        let stop = AtomicBool::new(false);
        let hooks = Hooks { progress: &|_| {}, stop: &stop };
        let options = Options { wipe: true, ..Options::default() };
        let e = plan(&ds, &dir.path().join("d"), options, Pick::default(), &mut NoUi, &hooks).unwrap_err();
        assert!(matches!(e, ConvertError::WipeOnDecrypt { .. }), "{e}");
    }
}
