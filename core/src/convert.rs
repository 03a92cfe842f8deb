//! Conversion of a directory that holds data, for every front end: [`plan`] checks everything
//! without writing (one walk of the tree, for the census) and answers a new conversion
//! ([`NewPlan`]) or an unfinished one ([`ResumePlan`]). [`NewPlan::run`] takes the protector to
//! create or use, asks the [`Ui`] to confirm, offers a recovery key and drives the engine;
//! [`ResumePlan::run`] takes at most the protector that reloads the staging key. [`finish`]
//! aborts, rolls back or commits; [`cancel`] ends a stopped run as its state allows.
//!
//! The engine in `dirseal-migrate` knows nothing of keys; this module supplies the staging
//! directory's policy (saved in the keystore before any data is copied, so an interrupted
//! conversion can always be resumed with the same secret) and the privileged syscalls the engine
//! may not make itself.
use std::ffi::OsStr;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use dirseal_migrate::{self as migrate, Census, Host, HostError, Request};
// The engine's types the front ends name (a run's state and outcome, how it moved the data, why it
// failed): they come from here, so that the CLI and the service depend on the core alone.
pub use dirseal_migrate::{Direction, Method, MigrateError, Mode, Outcome, State, StatusView};
// Kept at their old paths: front ends name them `dirseal::convert::{Summary, Estimate}`.
pub use crate::census::{Estimate, Summary};
use dirseal_recovery::RecoveryKey;
use sha2::{Digest, Sha256};

use crate::fscrypt::{self, KeyStatus};
use crate::ids::KeyIdentifier;
use crate::keystore::Keystore;
use crate::ops::{Dirseal, OpsError, Pick, ProtectorChoice, Undo};
use crate::protector::ProtectorRecord;
use crate::scheduled::{self, BootState, Schedule, Schedules};
use crate::secret::ProtectorKey;
use crate::ui::{Progress, Question, Ui, UiError};

mod boot;
mod host;
mod live;
mod probe;

pub use boot::{boot_state, cancel_scheduled, run_scheduled, BootRun};
use boot::{schedules, settle};
pub(crate) use host::KeyHost;
pub use live::{
    background_priority, commit_live, live_status, owner_logged_in, run_live, stop_live, LiveEvent, LiveStatus,
};
pub(crate) use probe::estimate;

/// Why a conversion could not be planned, run, resumed or aborted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The conversion engine refused (a preflight check) or failed (a step; its journal says where).
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    /// A library operation the conversion needs failed (protectors, policies, the keystore).
    #[error(transparent)]
    Ops(#[from] OpsError),
    /// The Ui could not ask, or the person cancelled.
    #[error(transparent)]
    Ui(#[from] UiError),
    /// The path cannot be converted as given.
    #[error("{path}: {reason}")]
    Path {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The owner is logged in: what their session writes after the copy is verified would be lost.
    #[error("the owner of {path} ({user}, uid {uid}) has processes running ({pids}); converting under a running session loses what it writes after verification. Log {user} out first (`loginctl terminate-user {user}` ends every session of theirs)")]
    OwnerActive {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The owner's login name ("uid N" without a passwd entry).
        user: String,
        /// The owner's processes, for the message: `pid 1031 (sleep), ...`.
        pids: String,
    },
    /// The journal's staging key is not a key identifier: the journal was altered.
    #[error("the conversion journal of {path} names staging key {token:?}, which is not a policy id; the journal was tampered with: abort the conversion")]
    BadToken {
        /// The directory.
        path: PathBuf,
        /// What the journal holds instead.
        token: String,
    },
    /// A decrypt would leave the owner without a login: their only one is a TPM PIN (no
    /// password hash in /etc/shadow), which the PAM module stops handling once the directory is
    /// plain.
    #[error("{user}, the owner of {path}, logs in with a TPM PIN only (no password in /etc/shadow); after the decrypt dirseal no longer handles that login, so give the account a password first (`passwd {user}`), then decrypt")]
    PinLoginOnly {
        /// The directory.
        path: PathBuf,
        /// The owner's login name.
        user: String,
    },
    /// A decrypt was asked to wipe: its old tree is ciphertext whose key is removed, so there
    /// is no plaintext to overwrite ([`Options::wipe`] is a conversion's).
    #[error("{path}: wiping is for a conversion (a decrypt's old tree is ciphertext, its key removed)")]
    WipeOnDecrypt {
        /// The directory.
        path: PathBuf,
    },
    /// A cancel of a conversion scheduled for the next boot where none is scheduled.
    #[error("no conversion of {path} is scheduled for the next boot")]
    NotScheduled {
        /// The directory.
        path: PathBuf,
    },
    /// Resume or abort was asked where no conversion was started.
    #[error("no conversion of {path} is in progress")]
    NotInProgress {
        /// The directory.
        path: PathBuf,
    },
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
    /// The owner's uid.
    pub uid: u32,
    /// Empty for root, whose processes always run.
    pub pids: Vec<u32>,
}

pub(crate) fn owner_of(source: &Path) -> Result<Owner, ConvertError> {
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
    /// The owner asks for it themselves (through the service): their session may run, but no
    /// process — theirs included — may have the directory open (unless `force`).
    pub owner_asks: bool,
    /// Copy threads; `None`: [`default_threads`].
    pub threads: Option<NonZeroUsize>,
    /// Seal the new master key under a new recovery key; `None` asks the Ui.
    pub recovery_key: Option<bool>,
    /// Copy the data, move it (for a nearly full disk: no second copy, no backup window), or
    /// pick by free space (the census says which, and why).
    pub mode: Mode,
    /// Measure the filesystem's encrypted write rate for the summary's time estimate: a short
    /// probe (a few MiB in a temporary encrypted directory with a throwaway key, removed again).
    pub estimate: bool,
    /// Keep the policy record and the protector's on the directory's own filesystem (a portable
    /// directory, crate::portable); the protector must travel.
    pub portable: bool,
    /// When the copy runs: now, live (in the background while the directory is in use,
    /// committed once the owner has logged out), or at the next boot.
    pub when: When,
}

/// When a conversion runs: the one place [`request`] and [`NewPlan::run`] read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum When {
    /// Copy, verify and swap now; the directory must not be in use (unless forced).
    #[default]
    Now,
    /// Live ([`live`]): everything a person chooses is asked now and the staging key held, as for
    /// [`When::AtNextBoot`] (whose schedule it records too, so a boot commits it if nothing else
    /// did); then [`run_live`] copies and catches up while the directory is in use and commits
    /// once the owner has logged out and nothing uses it.
    Live,
    /// Schedule it for the next boot instead of running it now ([`NewPlan::run`]): everything a
    /// person chooses is asked now, the protector, policy and staging directory are made, the
    /// journal is started and the staging key held ([`crate::scheduled`]); the copy or move runs
    /// in `dirseal-convert-boot.service` ([`run_scheduled`]). The owner's session and programs
    /// using the directory are no reason to refuse: nothing of them runs at that point of a boot.
    AtNextBoot,
}

/// A checked run of the engine, either way: a new one, or one that stopped part-way (interrupted,
/// crashed, rebooted). Each direction names its own ([`Plan`], [`crate::decrypt::Plan`]): what
/// running them takes differs, and the types say so.
#[derive(Debug)]
pub enum Planned<N, R> {
    /// A run not yet started.
    New(N),
    /// A run that stopped part-way.
    Resume(R),
}

/// A checked conversion: a new one needs the protector to create or use ([`NewPlan::run`]); an
/// unfinished one at most the protector that reloads its staging key ([`ResumePlan::run`]).
pub type Plan = Planned<NewPlan, ResumePlan>;

/// A new run that passed every check, either way: what it will copy and needs, the owner, and the
/// measured time estimate when [`Options::estimate`] asked for one (and the probe could run).
/// `key` is what the direction adds (a decrypt: the directory's policy, whose key is loaded).
#[derive(Debug)]
pub struct NewRun<K> {
    /// The directory, absolute (its final component not followed).
    pub source: PathBuf,
    /// Its root-only work dir (journal, staging copy).
    pub workdir: PathBuf,
    /// The options it was planned with.
    pub options: Options,
    /// What the engine counted: entries, bytes, the method, the space each method needs.
    pub census: Census,
    /// The owner, whose processes the plan checked.
    pub owner: Owner,
    /// The measured time estimate, if asked for and the probe could run.
    pub estimate: Option<Estimate>,
    /// What the direction adds.
    pub key: K,
    engine: Box<migrate::Plan>,
}

/// A new conversion that passed every check.
pub type NewPlan = NewRun<()>;

/// An unfinished run, either way; `key` is what the direction needs to know of its key.
#[derive(Debug)]
pub struct ResumeRun<K> {
    /// The directory, absolute.
    pub source: PathBuf,
    /// Its root-only work dir, holding the journal.
    pub workdir: PathBuf,
    /// The options to run it with.
    pub options: Options,
    /// Where the journal says it stopped.
    pub state: State,
    /// What the direction needs to know of its key.
    pub key: K,
}

/// An unfinished conversion. `key` names the staging policy whose key must be loaded again
/// first (after a reboot; `None` if none is needed): [`ResumePlan::run`] asks for a protector's
/// secret then.
pub type ResumePlan = ResumeRun<Option<KeyIdentifier>>;

/// Progress reports and the stop flag of a long run (SIGINT/SIGTERM, a cancelled D-Bus call).
pub struct Hooks<'a> {
    /// Called with each progress report, from any thread.
    pub progress: &'a (dyn Fn(&Progress) + Sync),
    /// Set to stop the run at its next safe point; it can be resumed later.
    pub stop: &'a AtomicBool,
}

/// What a run achieved.
#[derive(Debug)]
pub struct Converted {
    /// The engine's account: the state reached, the method, what was moved, any backup, caveats.
    pub outcome: Outcome,
    /// Whether the recovery key shown is saved on the directory; `None` when none was made.
    pub recovery_key_saved: Option<bool>,
    /// It was scheduled for the next boot, or prepared for a live run ([`Options::when`]):
    /// `outcome` is where the journal stands (nothing copied yet).
    pub scheduled: bool,
}

/// The copy threads of a run whose options name none: two per CPU, at least 4, at most 32. A
/// thread waiting for a small file's data to be read leaves its CPU to another (4 threads
/// converted 200,000 small files 4-10 % faster than 2 on 2 CPUs).
pub fn default_threads() -> NonZeroUsize {
    let cpus = std::thread::available_parallelism().map_or(2, NonZeroUsize::get);
    NonZeroUsize::new((2 * cpus).clamp(4, 32)).unwrap_or(NonZeroUsize::MIN)
}

/// The engine's request for a run of `o`: the one place options become the engine's (every
/// run's preflight, start and resume go through it), so the thread default is applied here.
pub(crate) fn request<'a>(plan_source: &'a Path, workdir: &'a Path, o: &Options, direction: Direction) -> Request<'a> {
    let threads = o.threads.unwrap_or_else(default_threads);
    Request {
        source: plan_source,
        workdir,
        keep_backup: o.keep_backup,
        wipe: o.wipe,
        // Scheduling starts the journal while the owner's session still runs; the copy itself
        // runs at boot, before any session.
        force: o.force || o.when == When::AtNextBoot,
        threads,
        mode: o.mode,
        direction,
        schedule: match o.when {
            When::Live => dirseal_migrate::Schedule::Live,
            When::Now | When::AtNextBoot => dirseal_migrate::Schedule::Now,
        },
    }
}

/// Whether a conversion in `state` still has work to do (resume it, or finish it): not the
/// engine's [`State::is_final`], which defines "finished".
pub fn unfinished(state: State) -> bool {
    !state.is_final()
}

/// Checks a conversion of `dir` without writing anything: an unfinished one is resumed; a new
/// one needs a filesystem that can encrypt, an owner who is not logged in (unless forced) and the
/// engine's preflight (the one walk of the tree, which counts what the copy needs).
pub fn plan(ds: &Dirseal, dir: &Path, options: Options, hooks: &Hooks<'_>) -> Result<Plan, ConvertError> {
    let source = absolute(dir)?;
    let workdir = workdir_for(&source)?;
    if let Some(v) = migrate::status(&workdir)?.filter(|v| unfinished(v.state)) {
        if v.direction != Direction::Encrypt {
            return Err(other_direction(&v, Direction::Encrypt).into());
        }
        if options.when == When::AtNextBoot {
            return Err(ConvertError::Path {
                path: source,
                reason: format!(
                    "a conversion of it is already under way ({}); resume it now with `dirseal convert {}`, or cancel it with `dirseal convert --abort {}` before scheduling one",
                    v.state,
                    v.source.display(),
                    v.source.display()
                ),
            });
        }
        let staging_key = staging_key_needed(&source, &v)?;
        return Ok(Plan::Resume(ResumePlan { source, workdir, options, state: v.state, key: staging_key }));
    }
    // Nothing may be created (protector, policy, work dir) on a filesystem that cannot encrypt.
    fscrypt::check_supported(&fscrypt::mount_point(&source).map_err(OpsError::from)?).map_err(OpsError::from)?;
    let owner = owner_idle(&source, &options)?;
    Ok(Plan::New(NewPlan::check(&KeyHost::new(ds, &source, hooks), workdir, options, owner, ())?))
}

/// The owner of `source`, refused while they run processes (unless forced, or asking themselves).
pub(crate) fn owner_idle(source: &Path, options: &Options) -> Result<Owner, ConvertError> {
    let owner = owner_of(source)?;
    if !options.force && !options.owner_asks && options.when == When::Now && !owner.pids.is_empty() {
        // Named by program too: a pid alone tells a person nothing.
        let program = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string());
        let mut pids: Vec<String> = owner
            .pids
            .iter()
            .take(8)
            .map(|&p| program(p).map_or_else(|_| format!("pid {p}"), |c| format!("pid {p} ({c})")))
            .collect();
        if owner.pids.len() > 8 {
            pids.push(format!("{} more", owner.pids.len() - 8));
        }
        let user = crate::account::user_name(owner.uid);
        return Err(ConvertError::OwnerActive {
            path: source.to_path_buf(),
            uid: owner.uid,
            user,
            pids: pids.join(", "),
        });
    }
    Ok(owner)
}

impl<N: AsRef<Path>, R: AsRef<Path>> Planned<N, R> {
    /// The directory, absolute.
    pub fn source(&self) -> &Path {
        match self {
            Planned::New(p) => p.as_ref(),
            Planned::Resume(p) => p.as_ref(),
        }
    }
}

impl<K, R> Planned<NewRun<K>, R> {
    /// The summary of a new run; `None` when resuming one.
    pub fn summary(&self) -> Option<Summary> {
        match self {
            Planned::New(p) => Some(p.summary()),
            Planned::Resume(_) => None,
        }
    }
}

impl<K> AsRef<Path> for NewRun<K> {
    fn as_ref(&self) -> &Path {
        &self.source
    }
}

impl<K> AsRef<Path> for ResumeRun<K> {
    fn as_ref(&self) -> &Path {
        &self.source
    }
}

impl<K> NewRun<K> {
    /// The engine's preflight of a new run going `host.direction` (the one walk of the tree,
    /// which counts what the copy needs) and, when the options ask, the measured estimate.
    pub(crate) fn check(
        host: &KeyHost<'_>,
        workdir: PathBuf,
        options: Options,
        owner: Owner,
        key: K,
    ) -> Result<NewRun<K>, ConvertError> {
        let source = host.source.to_path_buf();
        let engine = migrate::preflight(&request(&source, &workdir, &options, host.direction), host)?;
        let census = *engine.census();
        let estimate = if options.estimate { estimate(&source, &census) } else { None };
        Ok(NewRun { source, workdir, options, census, owner, estimate, key, engine: Box::new(engine) })
    }

    /// What the run involves, as a person should see it before saying yes.
    pub fn summary(&self) -> Summary {
        let (census, owner, options) = (&self.census, &self.owner, &self.options);
        let owner_name = crate::account::login_name(owner.uid);
        Summary {
            path: self.source.clone(),
            entries: census.entries,
            data_bytes: census.data,
            apparent_bytes: census.bytes,
            space_needed: census.space_needed,
            space_available: census.space_available,
            owner_uid: owner.uid,
            owner_name,
            recovery_key: options.recovery_key,
            keep_backup: options.keep_backup,
            wipe: options.wipe,
            method: census.method,
            auto: census.auto,
            copy_needed: census.copy_needed,
            move_needed: census.move_needed,
            estimate: self.estimate,
            flagged_entries: census.flagged,
            kept_flags: migrate::flag_names(census.flag_bits),
            casefolded_dirs: census.casefolded,
        }
    }

    /// Asks the Ui the question `ask` makes of the directory and this summary: a person
    /// confirms, or cancels.
    pub(crate) fn confirm(
        &self,
        ask: impl for<'q> FnOnce(&'q Path, &'q Summary) -> Question<'q>,
        ui: &mut dyn Ui,
    ) -> Result<(), ConvertError> {
        let summary = self.summary();
        match ui.confirm(&ask(&self.source, &summary))? {
            true => Ok(()),
            false => Err(UiError::Cancelled.into()),
        }
    }

    /// Hands the engine the plan its preflight made: copy (or move), verify, swap.
    pub(crate) fn start(self, host: &KeyHost<'_>) -> Result<Outcome, ConvertError> {
        let req = request(&self.source, &self.workdir, &self.options, host.direction);
        Ok(migrate::start(&req, host, *self.engine)?)
    }
}

/// Resumes the run recorded in `workdir` from where it stopped (its key is loaded), saying so.
pub(crate) fn resume(
    host: &KeyHost<'_>,
    workdir: &Path,
    options: &Options,
    state: State,
    ui: &mut dyn Ui,
) -> Result<Outcome, ConvertError> {
    let what = if host.direction == Direction::Decrypt { "decrypt" } else { "conversion" };
    let source = host.source.display();
    // A prepared run (scheduled, or a live worker's first start) has nothing to resume yet, and a
    // live one's later runs catch up or commit: each is said as what it does.
    ui.notice(&match (state, options.when) {
        (State::Prepared, _) => format!("starting the {what} of {source}"),
        (State::CatchingUp | State::CaughtUp, When::Live) => {
            format!("catching up the {what} of {source} with the changes since its last pass")
        }
        (State::CatchingUp | State::CaughtUp, _) => {
            format!("committing the {what} of {source}: a last catch-up pass, then the swap")
        }
        _ => format!("resuming the {what} of {source} ({state})"),
    });
    Ok(migrate::convert(&request(host.source, workdir, options, host.direction), host)?)
}

impl NewPlan {
    /// Runs a new conversion: the Ui confirms ([`Question::Convert`]), a recovery key is made if
    /// wanted and shown ([`Ui::show_recovery_key`]) before anything is encrypted, the protector
    /// `choice` is created or unlocked, then the engine copies, verifies and swaps.
    pub fn run(
        self,
        ds: &mut Dirseal,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
        hooks: &Hooks<'_>,
    ) -> Result<Converted, ConvertError> {
        // The host borrows the path for as long as the engine runs, which takes the plan.
        let source = self.source.clone();
        if self.options.portable && self.options.when != When::Now {
            return Err(ConvertError::Path {
                path: source,
                reason: "a portable directory cannot be converted live or at the next boot (its medium may be gone by then); convert it now, without --live or --at-next-boot".into(),
            });
        }
        if self.options.portable {
            // Refused before anything is asked.
            ds.check_travels(&choice)?;
        }
        self.confirm(|dir, summary| Question::Convert { dir, summary }, ui)?;
        let store = if self.options.portable {
            let mp = fscrypt::mount_point(&source).map_err(OpsError::from)?;
            crate::portable::open_or_create(&mp).map_err(OpsError::from)?
        } else {
            ds.keystore().clone()
        };
        let want_key = ds.wants_recovery_key(&source, self.options.recovery_key, ui)?;
        let recovery = if want_key {
            let key = RecoveryKey::generate();
            ui.show_recovery_key(&source, &key)?;
            Some(key)
        } else {
            None
        };
        drop_orphan_policy(ds, &source, &self.workdir)?;
        // Until the engine's first journal record, a failure takes back what was made for it.
        let mut undo = Undo::watching(&[ds.keystore(), &store]);
        let made = matches!(choice, ProtectorChoice::New(_));
        let chosen = match choice {
            ProtectorChoice::New(n) => ds.adopt_or_create_protector(&n, &store, ui)?,
            existing if self.options.portable => ds.resolve_protector_into(existing, &store, ui)?,
            existing => ds.resolve_protector(existing, ui)?,
        };
        undo.protector(&chosen.0.id);
        migrate::fault::point(migrate::fault::Point::AfterProtectorSaved);
        let workdir = self.workdir.clone();
        if self.options.when != When::Now {
            // The engine starts with its stop flag already set: it makes the staging directory
            // (the host encrypts it, saves the policy and holds its key), records the journal and
            // stops before copying or moving anything.
            let protector = chosen.0.id;
            let stopped = AtomicBool::new(true);
            let hooks = Hooks { progress: hooks.progress, stop: &stopped };
            let host = KeyHost {
                protector: Some(chosen),
                recovery: recovery.as_ref(),
                store: Some(store.clone()),
                hold: true,
                ..KeyHost::new(ds, &source, &hooks)
            };
            let scheduled = self.schedule(ds, &host, protector, made, recovery.is_some());
            take_back(undo, scheduled.is_err(), &workdir, &store, &source);
            return scheduled;
        }
        let host = KeyHost {
            protector: Some(chosen),
            recovery: recovery.as_ref(),
            store: Some(store.clone()),
            ..KeyHost::new(ds, &source, hooks)
        };
        let started = self.start(&host);
        take_back(undo, started.is_err(), &workdir, &store, &source);
        let outcome = started?;
        settle(ds, &source, &outcome)?;
        if let Some(e) = host.escrow_failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            crate::ops::Escrowed::Failed(e).notice(&source, ui);
        }
        let saved = recovery.map(|_| {
            !matches!(outcome.state, State::Done | State::Swapped)
                || crate::recovery::read_blob(&source).is_ok_and(|b| b.is_some())
        });
        Ok(Converted { outcome, recovery_key_saved: saved, scheduled: false })
    }

    /// The scheduling part of [`NewPlan::run`] ([`When::AtNextBoot`], [`When::Live`]), with a `host` whose
    /// stop flag is set: the engine prepares and stops, then the schedule is recorded. Until that
    /// record exists this is an ordinary interrupted conversion (resumed, or aborted, as any).
    fn schedule(
        self,
        ds: &Dirseal,
        host: &KeyHost<'_>,
        protector: crate::ids::ProtectorId,
        protector_made: bool,
        recovery: bool,
    ) -> Result<Converted, ConvertError> {
        let (source, workdir, census) = (self.source.clone(), self.workdir.clone(), self.census);
        let live = self.options.when == When::Live;
        let state = match self.start(host) {
            Err(ConvertError::Migrate(MigrateError::Interrupted { state })) => state,
            // Nothing to copy (an empty tree) may finish before the first stop check: done now.
            Ok(outcome) => {
                settle(ds, &source, &outcome)?;
                return Ok(Converted { outcome, recovery_key_saved: recovery.then_some(true), scheduled: false });
            }
            Err(e) => return Err(e),
        };
        let view = migrate::status(&workdir)?.ok_or_else(|| ConvertError::NotInProgress { path: source.clone() })?;
        let policy: KeyIdentifier = view
            .token
            .parse()
            .map_err(|_| ConvertError::BadToken { path: source.clone(), token: view.token.clone() })?;
        let record = Schedule::new(source.clone(), policy, view.method, protector, protector_made, live);
        schedules(ds).save(&record).map_err(OpsError::from)?;
        let outcome = Outcome {
            state,
            method: view.method,
            token: view.token,
            files: census.entries,
            bytes: census.data,
            backup: None,
            notes: Vec::new(),
            timings: Default::default(),
        };
        Ok(Converted { outcome, recovery_key_saved: recovery.then_some(true), scheduled: true })
    }
}

impl Plan {
    /// Runs the plan: a new conversion with the protector `choice` ([`NewPlan::run`]), or an
    /// unfinished one from where it stopped, whose staging key the protector `choice` names
    /// reloads if needed ([`ResumePlan::run`]; resuming makes no protector, so a new one names
    /// none: [`ProtectorChoice::pick`]).
    pub fn run(
        self,
        ds: &mut Dirseal,
        choice: ProtectorChoice<'_>,
        ui: &mut dyn Ui,
        hooks: &Hooks<'_>,
    ) -> Result<Converted, ConvertError> {
        match self {
            Plan::New(plan) => plan.run(ds, choice, ui, hooks),
            Plan::Resume(plan) => plan.run(ds, choice.pick(), ui, hooks),
        }
    }
}

impl ResumePlan {
    /// Resumes an unfinished conversion from where it stopped: the staging key is loaded again
    /// first if needed, with the protector `pick` names (none: the policy's only one).
    pub fn run(self, ds: &Dirseal, pick: Pick, ui: &mut dyn Ui, hooks: &Hooks<'_>) -> Result<Converted, ConvertError> {
        let ResumePlan { source, workdir, options, state, key } = self;
        if let Some(id) = key {
            load_staging_key(ds, &source, &id, pick, ui)?;
        }
        let outcome = resume(&KeyHost::new(ds, &source, hooks), &workdir, &options, state, ui)?;
        settle(ds, &source, &outcome)?;
        Ok(Converted { outcome, recovery_key_saved: None, scheduled: false })
    }
}

/// Removes the policy record a new conversion of `source` made before it was interrupted, ahead
/// of its journal: the conversion's staging dir is still there, empty, encrypted with a policy
/// the keystore holds for `source` and no journal of this work dir names. The engine removes that
/// staging dir as a leftover; its record wraps a key nothing uses, and the same command run again
/// must end with the keystore an uninterrupted run makes (one policy, and its protector adopted
/// by [`Dirseal::adopt_or_create_protector`], which only takes protectors no policy uses).
fn drop_orphan_policy(ds: &Dirseal, source: &Path, workdir: &Path) -> Result<(), ConvertError> {
    let staging = migrate::staging_path(workdir);
    let empty = std::fs::symlink_metadata(&staging).is_ok_and(|m| m.is_dir())
        && std::fs::read_dir(&staging).is_ok_and(|mut d| d.next().is_none());
    if !empty {
        return Ok(());
    }
    let Ok(Some(policy)) = fscrypt::get_policy(&staging) else { return Ok(()) };
    let id = policy.identifier;
    if migrate::status(workdir)?.is_some_and(|v| v.token == id.to_string()) {
        return Ok(());
    }
    let Ok(store) = ds.store_of_policy(source, &id) else { return Ok(()) };
    let Ok(record) = store.policy(&id) else { return Ok(()) };
    if record.path_hint.as_deref() != Some(source) {
        return Ok(());
    }
    {
        let _guard = store.lock().map_err(OpsError::from)?;
        store.remove_policy(&id).map_err(OpsError::from)?;
    }
    // Scheduling that crashed there held the key already.
    schedules(ds).forget(&id).map_err(OpsError::from)?;
    if let Ok(mp) = fscrypt::mount_point(source) {
        // The staging dir is empty: nothing of it is in use, so the key goes too.
        let _ = fscrypt::remove_key(&mp, &id, false);
    }
    Ok(())
}

/// Loads the key of a conversion's staging directory again (after a reboot), with a protector's
/// secret.
pub(crate) fn load_staging_key(
    ds: &Dirseal,
    source: &Path,
    id: &KeyIdentifier,
    pick: Pick,
    ui: &mut dyn Ui,
) -> Result<(), ConvertError> {
    // A conversion scheduled for the boot holds its key: no one is asked.
    if let Some(master) = schedules(ds).held(id).map_err(OpsError::from)? {
        ds.add_key(source, &master)?;
        return Ok(());
    }
    let policy = ds.store_of_policy(source, id)?.policy(id).map_err(OpsError::from)?;
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
    finish_going(&KeyHost::new(ds, &absolute(dir)?, hooks), how, ui)
}

/// [`finish`] for a conversion going `host.direction`: one going the other way is refused (it is
/// finished with its own command). A decrypt's token is the source's key, which moving back
/// into the encrypted tree needs.
pub(crate) fn finish_going(host: &KeyHost<'_>, how: Finish, ui: &mut dyn Ui) -> Result<Outcome, ConvertError> {
    let (ds, source, direction) = (host.ds, host.source, host.direction);
    let workdir = workdir_for(source)?;
    let recorded = migrate::status(&workdir)?;
    if let Some(v) = recorded.as_ref().filter(|v| unfinished(v.state) && v.direction != direction) {
        return Err(other_direction(v, direction).into());
    }
    if how == Finish::Abort {
        if let Some(v) = recorded.as_ref().filter(|v| v.method == Method::Move) {
            if let Some(id) = staging_key_needed(source, v)? {
                load_staging_key(ds, source, &id, Pick::default(), ui)?;
            }
        }
    }
    let outcome = match how {
        Finish::Abort => migrate::abort(&workdir, host)?,
        Finish::Rollback => migrate::rollback(&workdir, host)?,
        Finish::Commit => migrate::commit(&workdir, host)?,
    };
    if direction == Direction::Encrypt {
        settle(ds, source, &outcome)?;
    }
    Ok(outcome)
}

/// After a new conversion's start (or its scheduling) failed with no journal of its run, what was
/// made for it goes ([`Undo`]): the new protector, and the staging dir's policy if the host made it.
/// With a journal, everything stays for the resume.
fn take_back(undo: Undo, failed: bool, workdir: &Path, store: &Keystore, source: &Path) {
    match migrate::status(workdir) {
        Ok(v) if failed && !v.as_ref().is_some_and(|v| unfinished(v.state)) => {
            let mut undo = undo;
            let staged = fscrypt::get_policy(&migrate::staging_path(workdir)).ok().flatten();
            let ours = |id: &KeyIdentifier| store.policy(id).is_ok_and(|r| r.path_hint.as_deref() == Some(source));
            if let (Some(p), Ok(mp)) = (staged.filter(|p| ours(&p.identifier)), fscrypt::mount_point(source)) {
                undo.policy(p.identifier, store, mp);
            }
        }
        _ => undo.keep(),
    }
}

/// A finished conversion of a portable directory leaves no journal on its medium: the journal
/// names the directory's original path, and a card goes to other machines and people. (On this
/// machine's own disks the finished journal stays: `status` and a re-run read it.) Best effort: a
/// journal that stays holds nothing a resume needs.
fn forget_on_medium(ds: &Dirseal, source: &Path, workdir: &Path, state: State) {
    if state != State::Done || !ds.policy_of(source).is_ok_and(|p| p.medium.is_some()) {
        return;
    }
    let _ = std::fs::remove_dir_all(workdir);
}

/// The engine's refusal of a conversion recorded going the other way than `asked`.
pub(crate) fn other_direction(v: &StatusView, asked: Direction) -> MigrateError {
    MigrateError::OtherDirection { path: v.source.clone(), running: v.direction.command(), asked: asked.command() }
}

/// What a cancel did to a stopped conversion.
#[derive(Debug)]
pub enum Cancelled {
    /// It was before the swap and is aborted: the directory is as it was (a move's files moved
    /// back out of the staging directory).
    Aborted(Outcome),
    /// It was past the swap (the directory is encrypted and complete): it cannot be undone by a
    /// cancel; running the conversion again finishes it.
    PastSwap(State),
}

/// After a run stopped by its stop flag at `state` (a [`MigrateError::Interrupted`]): aborts the
/// conversion of `dir` whenever the state allows ([`State::abortable`], moves included), else
/// leaves it to be resumed. The Ui may be asked a protector's secret for a move's staging key.
pub fn cancel(
    ds: &Dirseal,
    dir: &Path,
    state: State,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
) -> Result<Cancelled, ConvertError> {
    if !state.abortable() {
        return Ok(Cancelled::PastSwap(state));
    }
    Ok(Cancelled::Aborted(finish(ds, dir, Finish::Abort, ui, hooks)?))
}

/// Every conversion recorded on a mounted filesystem.
pub fn recorded() -> Result<Vec<StatusView>, ConvertError> {
    Ok(fscrypt::mount_points().map_err(OpsError::from)?.iter().flat_map(|mp| recorded_on(mp)).collect())
}

/// Every conversion recorded on the filesystem mounted at `mount_point` (a work dir that cannot be
/// read is skipped: it records nothing this can show).
pub fn recorded_on(mount_point: &Path) -> Vec<StatusView> {
    let Ok(entries) = std::fs::read_dir(mount_point.join(".dirseal/convert")) else { return Vec::new() };
    entries.flatten().filter_map(|e| migrate::status(&e.path()).ok().flatten()).collect()
}

/// The staging key of a conversion in progress, if one is recorded and its key is not loaded:
/// the caller must unlock it (ask the secret) before resuming.
pub(crate) fn staging_key_needed(source: &Path, view: &StatusView) -> Result<Option<KeyIdentifier>, ConvertError> {
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

/// The policy of `source`'s finished conversion, when its journal says the conversion is done and
/// the directory is encrypted with that policy (for a portable directory, whose journal is gone:
/// its medium's record of that policy made for this path): the same command run again (after a power cut
/// just past "done", say) has nothing left to do, which is no error.
pub fn finished(source: &Path) -> Result<Option<KeyIdentifier>, ConvertError> {
    let recorded = status(source)?;
    if recorded.is_none() {
        // A portable directory's finished journal is gone from its medium ([`forget_on_medium`]):
        // its policy record there, made for this path, says it is done.
        // Anything unreadable here is the plan's to say, with its own checks.
        let Ok(Some(policy)) = fscrypt::get_policy(source) else { return Ok(None) };
        let Ok(mp) = fscrypt::mount_point(source) else { return Ok(None) };
        let on_medium =
            crate::portable::open_existing(&mp).ok().flatten().and_then(|m| m.policy(&policy.identifier).ok());
        return Ok(on_medium.filter(|r| r.path_hint.as_deref() == Some(source)).map(|r| r.id));
    }
    let Some(v) = recorded.filter(|v| v.direction == Direction::Encrypt && v.state == State::Done) else {
        return Ok(None);
    };
    let Ok(token) = v.token.parse::<KeyIdentifier>() else { return Ok(None) };
    let policy = fscrypt::get_policy(source).map_err(OpsError::from)?;
    Ok(policy.filter(|p| p.identifier == token).map(|_| token))
}

/// Whether `dir` is mid-conversion (before the swap): logging in would work on plaintext that is
/// about to be replaced, so the PAM module refuses unless the admin allowed it. Not a live
/// conversion ([`When::Live`]): it is made to run while the owner works, catches up with what
/// they change, and commits only when no process uses the directory (checked again before the
/// swap), so a login just puts the commit off.
pub fn in_progress(dir: &Path) -> Result<bool, ConvertError> {
    Ok(status(&absolute(dir)?)?.is_some_and(|v| v.state.before_swap() && !v.live))
}

/// The outcome of a conversion that ended (done, aborted, rolled back) as its journal records it,
/// for a run that finds it ended by another (a boot-time run, a hand, a live worker).
pub(crate) fn ended(v: &StatusView) -> Outcome {
    Outcome {
        state: v.state,
        method: v.method,
        token: v.token.clone(),
        files: v.files_total,
        bytes: v.bytes_total,
        backup: v.backup.clone(),
        notes: Vec::new(),
        timings: Default::default(),
    }
}

/// Whether a login may use a home while a conversion of it is recorded: the one rule, for PAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoginDuring {
    /// No conversion before its swap: the home is what it looks like.
    NoConversion,
    /// The conversion expects its owner at work: a live copy (its commit waits for the last
    /// logout, and is put off by a new login), or one scheduled for the next boot and not started
    /// (the home stays as it is till then).
    Open,
    /// A copy under way: the home is intact, but what is written now is caught only by a live
    /// copy; the configuration decides (`pam.allow_login_during_conversion`).
    IfAllowed,
    /// A move under way: part of the home may already be in the staging directory.
    Closed,
}

/// Whether and how a login may use `dir` while it is being converted ([`LoginDuring`]); `ds`
/// (when it opens) tells whether a conversion is the one scheduled for the next boot.
pub fn login_during(ds: Option<&Dirseal>, dir: &Path) -> Result<LoginDuring, ConvertError> {
    let Some(v) = status(&absolute(dir)?)?.filter(|v| v.state.before_swap()) else {
        return Ok(LoginDuring::NoConversion);
    };
    // Scheduled and not yet taken up by a boot-time run: nothing has moved or been copied.
    let scheduled = || {
        ds.is_some_and(
            |ds| matches!(boot_state(ds, dir), Ok(Some(scheduled::BootState::Pending(s))) if s.began_unix.is_none()),
        )
    };
    Ok(if v.live || scheduled() {
        LoginDuring::Open
    } else if v.method == Method::Move {
        LoginDuring::Closed
    } else {
        LoginDuring::IfAllowed
    })
}
