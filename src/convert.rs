//! Conversion of a directory that holds data, for every front end: [`plan`] checks everything
//! without writing (one walk of the tree, for the census), [`run`] asks the [`Ui`] to confirm,
//! offers a recovery key, creates or unlocks the protector and drives the engine; [`finish`]
//! aborts, rolls back or commits.
//!
//! The engine in `dirseal-migrate` knows nothing of keys; this module supplies the staging
//! directory's policy (saved in the keystore before any data is copied, so an interrupted
//! conversion can always be resumed with the same secret) and the privileged syscalls the engine
//! may not make itself.
use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use dirseal_migrate::{self as migrate, Census, Host, HostError, MigrateError, Outcome, Request, State, StatusView};
pub use dirseal_migrate::{Method, Mode};
use dirseal_recovery::RecoveryKey;
use sha2::{Digest, Sha256};

use crate::fscrypt::{self, KeyStatus};
use crate::ids::KeyIdentifier;
use crate::ops::{Dirseal, OpsError, Pick, ProtectorChoice};
use crate::protector::ProtectorRecord;
use crate::secret::ProtectorKey;
use crate::ui::{Progress, Question, Ui, UiError};

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Ops(#[from] OpsError),
    #[error(transparent)]
    Ui(#[from] UiError),
    #[error("{path}: {reason}")]
    Path { path: PathBuf, reason: String },
    #[error("the owner of {path} (uid {uid}) has processes running (pid {pids}); converting under a running session loses what it writes after verification. Log the user out first")]
    OwnerActive { path: PathBuf, uid: u32, pids: String },
    #[error("the conversion journal of {path} names staging key {token:?}, which is not a policy id; the journal was tampered with: abort the conversion")]
    BadToken { path: PathBuf, token: String },
    #[error("no conversion of {path} is in progress")]
    NotInProgress { path: PathBuf },
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

/// The owner of a directory and the processes they run: a logged-in user keeps writing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    /// Empty for root, whose processes always run.
    pub pids: Vec<u32>,
}

fn owner_of(source: &Path) -> Result<Owner, ConvertError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(source)
        .map_err(|e| ConvertError::Path { path: source.to_path_buf(), reason: format!("cannot inspect it: {e}") })?;
    let uid = meta.uid();
    if uid == 0 {
        return Ok(Owner { uid, pids: Vec::new() });
    }
    let pids = dirseal_procs::pids_of_user(uid).map_err(|e| ConvertError::Path {
        path: source.to_path_buf(),
        reason: format!("cannot list processes: {e}"),
    })?;
    Ok(Owner { uid, pids })
}

/// How to convert.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Keep the old plaintext until [`Finish::Commit`] (or put it back with [`Finish::Rollback`]).
    pub keep_backup: bool,
    /// Overwrite the old plaintext before deleting it, then TRIM.
    pub wipe: bool,
    /// Convert although the owner runs processes or programs use the directory.
    pub force: bool,
    /// Copy threads; 0 means one per CPU.
    pub threads: usize,
    /// Seal the new master key under a new recovery key; `None` asks the Ui.
    pub recovery_key: Option<bool>,
    /// Copy the data, move it (for a nearly full disk: no second copy, no backup window), or
    /// pick by free space (the census says which, and why).
    pub mode: Mode,
}

/// A checked conversion, ready for [`run`].
#[derive(Debug)]
pub struct Plan {
    /// The directory, absolute (its final component not followed).
    pub source: PathBuf,
    /// Its root-only work dir (journal, staging copy).
    pub workdir: PathBuf,
    pub options: Options,
    pub what: Planned,
}

#[derive(Debug)]
pub enum Planned {
    /// A new conversion that passed every check: what it will copy and needs, and the owner.
    New { census: Census, owner: Owner, engine: Box<migrate::Plan> },
    /// An unfinished conversion. `staging_key` names the policy whose key must be loaded again
    /// first (after a reboot): [`run`] asks for a protector's secret then.
    Resume { state: State, staging_key: Option<KeyIdentifier> },
}

/// Progress reports and the stop flag of a long run (SIGINT/SIGTERM, a cancelled D-Bus call).
pub struct Hooks<'a> {
    pub progress: &'a (dyn Fn(&Progress) + Sync),
    pub stop: &'a AtomicBool,
}

/// What a run achieved.
#[derive(Debug)]
pub struct Converted {
    pub outcome: Outcome,
    /// Whether the recovery key shown is saved on the directory; `None` when none was made.
    pub recovery_key_saved: Option<bool>,
}

fn request<'a>(plan_source: &'a Path, workdir: &'a Path, o: &Options) -> Request<'a> {
    let threads =
        if o.threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2) } else { o.threads };
    Request {
        source: plan_source,
        workdir,
        keep_backup: o.keep_backup,
        wipe: o.wipe,
        force: o.force,
        threads,
        mode: o.mode,
    }
}

/// Whether a conversion in `state` still has work to do (resume it, or finish it).
pub fn unfinished(state: State) -> bool {
    !matches!(state, State::Done | State::Aborted | State::RolledBack)
}

/// Checks a conversion of `dir` without writing anything: an unfinished one is resumed; a new
/// one needs a filesystem that can encrypt, an owner who is not logged in (unless forced) and the
/// engine's preflight (the one walk of the tree, which counts what the copy needs).
pub fn plan(ds: &Dirseal, dir: &Path, options: Options, hooks: &Hooks<'_>) -> Result<Plan, ConvertError> {
    let source = absolute(dir)?;
    let workdir = workdir_for(&source)?;
    if let Some(v) = migrate::status(&workdir)?.filter(|v| unfinished(v.state)) {
        let staging_key = staging_key_needed(&source, &v)?;
        return Ok(Plan { source, workdir, options, what: Planned::Resume { state: v.state, staging_key } });
    }
    // Nothing may be created (protector, policy, work dir) on a filesystem that cannot encrypt.
    fscrypt::check_supported(&fscrypt::mount_point(&source).map_err(OpsError::from)?).map_err(OpsError::from)?;
    let owner = owner_of(&source)?;
    if !options.force && !owner.pids.is_empty() {
        let pids = owner.pids.iter().take(8).map(u32::to_string).collect::<Vec<_>>().join(", ");
        return Err(ConvertError::OwnerActive { path: source, uid: owner.uid, pids });
    }
    let host = KeyHost::new(ds, &source, hooks);
    let engine = migrate::preflight(&request(&source, &workdir, &options), &host)?;
    let census = *engine.census();
    Ok(Plan { source, workdir, options, what: Planned::New { census, owner, engine: Box::new(engine) } })
}

/// Runs a plan. A new conversion: the Ui confirms ([`Question::Convert`]), a recovery key is
/// made if wanted and shown ([`Ui::show_recovery_key`]) before anything is encrypted, the
/// protector `choice` is created or unlocked, then the engine copies, verifies and swaps. A
/// resumed one: the staging key is loaded again if needed (with the protector `choice` names,
/// else the policy's only one), then the engine goes on from where it stopped.
pub fn run(
    ds: &mut Dirseal,
    plan: Plan,
    choice: ProtectorChoice<'_>,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
) -> Result<Converted, ConvertError> {
    let Plan { source, workdir, options, what } = plan;
    let req = request(&source, &workdir, &options);
    match what {
        Planned::Resume { state, staging_key } => {
            if let Some(id) = staging_key {
                let pick = match choice {
                    ProtectorChoice::Existing(id) => Pick { protector: Some(id) },
                    ProtectorChoice::New(_) => Pick::default(),
                };
                load_staging_key(ds, &source, &id, pick, ui)?;
            }
            ui.notice(&format!("resuming the conversion of {} ({state})", source.display()));
            let outcome = migrate::convert(&req, &KeyHost::new(ds, &source, hooks))?;
            Ok(Converted { outcome, recovery_key_saved: None })
        }
        Planned::New { census, engine, .. } => {
            if !ui.confirm(&Question::Convert { dir: &source, census: &census })? {
                return Err(UiError::Cancelled.into());
            }
            let want_key = match options.recovery_key {
                Some(w) => w,
                None => ui.confirm(&Question::CreateRecoveryKey { dir: &source })?,
            };
            let recovery = if want_key {
                let key = RecoveryKey::generate();
                ui.show_recovery_key(&source, &key)?;
                Some(key)
            } else {
                None
            };
            let chosen = ds.resolve_protector(choice, ui)?;
            let host =
                KeyHost { protector: Some(chosen), recovery: recovery.as_ref(), ..KeyHost::new(ds, &source, hooks) };
            let outcome = migrate::start(&req, &host, *engine)?;
            let saved = recovery.map(|_| {
                !matches!(outcome.state, State::Done | State::Swapped)
                    || crate::recovery::read_blob(&source).is_ok_and(|b| b.is_some())
            });
            Ok(Converted { outcome, recovery_key_saved: saved })
        }
    }
}

/// Loads the key of a conversion's staging directory again (after a reboot), with a protector's
/// secret.
fn load_staging_key(
    ds: &Dirseal,
    source: &Path,
    id: &KeyIdentifier,
    pick: Pick,
    ui: &mut dyn Ui,
) -> Result<(), ConvertError> {
    let policy = ds.keystore().policy(id).map_err(OpsError::from)?;
    let what = format!("the conversion of {}", source.display());
    let (pid, pkey) = ds.unlock_policy_protector(&policy, pick, &what, ui)?;
    let master = ds.master_key(&policy, &pid, &pkey)?;
    ds.add_key(source, &master)?;
    Ok(())
}

/// The end of a conversion other than completing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Before the swap: remove the copy, leave the original untouched.
    Abort,
    /// After a swap that kept the backup: put the plaintext back.
    Rollback,
    /// After a swap that kept the backup: delete the old plaintext.
    Commit,
}

/// Aborting a move reads the moved files back out of the encrypted staging directory: its key is
/// loaded first if needed (the Ui asks a protector's secret).
pub fn finish(
    ds: &Dirseal,
    dir: &Path,
    how: Finish,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
) -> Result<Outcome, ConvertError> {
    let source = absolute(dir)?;
    let workdir = workdir_for(&source)?;
    if how == Finish::Abort {
        if let Some(v) = migrate::status(&workdir)?.filter(|v| v.method == Method::Move) {
            if let Some(id) = staging_key_needed(&source, &v)? {
                load_staging_key(ds, &source, &id, Pick::default(), ui)?;
            }
        }
    }
    let host = KeyHost::new(ds, &source, hooks);
    Ok(match how {
        Finish::Abort => migrate::abort(&workdir, &host)?,
        Finish::Rollback => migrate::rollback(&workdir, &host)?,
        Finish::Commit => migrate::commit(&workdir, &host)?,
    })
}

/// Every conversion recorded on a mounted filesystem.
pub fn recorded() -> Result<Vec<StatusView>, ConvertError> {
    let mut found = Vec::new();
    for mp in fscrypt::mount_points().map_err(OpsError::from)? {
        let Ok(entries) = std::fs::read_dir(mp.join(".dirseal/convert")) else { continue };
        for e in entries.flatten() {
            if let Ok(Some(v)) = migrate::status(&e.path()) {
                found.push(v);
            }
        }
    }
    Ok(found)
}

/// The privileged side of the engine.
struct KeyHost<'a> {
    ds: &'a Dirseal,
    source: &'a Path,
    /// The protector for a new conversion's staging policy (absent on resume and abort).
    protector: Option<(ProtectorRecord, ProtectorKey)>,
    /// A recovery key to seal the new policy's master key under, on the staging root (it becomes
    /// the directory at the swap, so the key works from the first moment the data is encrypted).
    recovery: Option<&'a RecoveryKey>,
    hooks: &'a Hooks<'a>,
}

impl<'a> KeyHost<'a> {
    fn new(ds: &'a Dirseal, source: &'a Path, hooks: &'a Hooks<'a>) -> KeyHost<'a> {
        KeyHost { ds, source, protector: None, recovery: None, hooks }
    }
}

fn host_err(e: impl std::fmt::Display) -> HostError {
    HostError(e.to_string())
}

impl Host for KeyHost<'_> {
    fn prepare_staging(&self, staging: BorrowedFd<'_>, path: &Path) -> Result<String, HostError> {
        let (prec, pkey) = self
            .protector
            .as_ref()
            .ok_or_else(|| HostError("internal: no protector chosen for a new conversion".into()))?;
        // The hint names the source: after the swap that path is the encrypted directory.
        let (policy, master) = self.ds.new_policy(self.source, prec, pkey).map_err(host_err)?;
        fscrypt::set_policy_fd(staging, path, &policy.id).map_err(host_err)?;
        if let Some(key) = self.recovery {
            crate::recovery::install_at(staging, path, &policy.id, &master, key).map_err(host_err)?;
        }
        Ok(policy.id.to_string())
    }

    fn check_staging(&self, token: &str, staging: BorrowedFd<'_>, path: &Path) -> Result<(), HostError> {
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

/// The staging key of a conversion in progress, if one is recorded and its key is not loaded:
/// the caller must unlock it (ask the secret) before resuming.
fn staging_key_needed(source: &Path, view: &StatusView) -> Result<Option<KeyIdentifier>, ConvertError> {
    if view.token.is_empty() || !unfinished(view.state) {
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
        Some(
            State::Prepared
                | State::Copying
                | State::Copied
                | State::Verified
                | State::Moving
                | State::Moved
                | State::MovingBack
        )
    ))
}
