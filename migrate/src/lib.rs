//! Journaled, resumable, faithful in-place conversion of a directory tree.
//!
//! The engine copies a directory into a staging directory that the caller (the [`Host`]) has made
//! encrypted, verifies the copy, swaps the two with `renameat2(RENAME_EXCHANGE)` and disposes of the
//! old tree. It knows nothing of keys. Every step is recorded durably in a journal in a root-only
//! work directory before the step it enables, so a run killed at any instant can be resumed by
//! running it again (see docs/crash-safety.md).
//!
//! In move mode (for a nearly full filesystem) the files move into staging instead, chunk by
//! chunk for large ones, so only a few chunks of free space are needed (see mv.rs).
//!
//! States: `Prepared → Copying → Copied → Verified → Swapped → Done`, plus `Aborted` (before the
//! swap), `RollingBack → RolledBack` (after a swap kept with `keep_backup`). Move mode:
//! `Prepared → Moving → Moved → Swapped → Done`, and `MovingBack → Aborted` for an abort.
#![forbid(unsafe_code)]

mod copy;
mod ctx;
pub mod fault;
mod fsx;
mod journal;
mod mv;
mod remove;
mod scan;
mod verify;
mod walk;

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use ctx::Ctx;
use fault::Point;
use journal::{HexPath, Journal, Step, Version, Workdir, STAGING};

pub use dirseal_procs::{find_users, ProcessUse};
pub use journal::Method;
pub use scan::census_dirs_listed;

/// What to convert and how.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The directory to convert in place.
    pub source: &'a Path,
    /// Root-only work directory on the same filesystem, e.g. `<mount>/.dirseal/convert/<id>/`,
    /// one per source (it holds one journal). Absolute, free of symlinks, outside the source;
    /// created (mode 0700, with missing parents, all synced) if missing. Every directory from
    /// the mount root down to it must be root-owned and not writable by others (sticky ones
    /// excepted); it is opened once and every later step goes through that handle.
    pub workdir: &'a Path,
    /// Keep the old tree after the swap (state stays `Swapped`) for [`rollback`] or [`commit`].
    pub keep_backup: bool,
    /// Overwrite old file contents with zeros before deleting them, then ask the host to TRIM.
    pub wipe: bool,
    /// Skip the "directory in use" checks (and only those).
    pub force: bool,
    /// Worker threads for copying and hashing (0 counts as 1).
    pub threads: usize,
    /// Copy, move, or pick by free space. Applies when a conversion starts; a resumed one keeps
    /// its recorded method.
    pub mode: Mode,
}

/// How the caller wants the data to go into staging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    Copy,
    Move,
    /// Copy when a second copy fits with the margin, else move.
    #[default]
    Auto,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HostError(pub String);

/// What the engine needs from its caller: the encryption of the staging directory and the few
/// privileged operations that live outside this crate.
pub trait Host: Sync {
    /// Make the empty staging dir (just created by the engine, mode 0700 root; `staging` is the
    /// engine's handle on it, `path` only names it in messages) encrypted and unlocked, through
    /// the handle: a path could be made to lead elsewhere. Called once per conversion, before `Prepared` is recorded (a crash before that
    /// record starts the conversion over, with a new staging dir). Returns a token (e.g. the
    /// policy id; at most 256 bytes, no control characters) that the engine stores in the
    /// journal and hands back to [`Host::ensure_unlocked`]. Attributes the host sets on the
    /// staging root (e.g. a recovery blob) are kept; the source root's are added to them.
    fn prepare_staging(&self, staging: BorrowedFd<'_>, path: &Path) -> Result<String, HostError>;
    /// Whether the staging dir (the engine's handle on it) carries the encryption `token` names.
    /// Asked before every copy pass and right before the swap; an error stops the conversion
    /// with nothing swapped.
    fn check_staging(&self, token: &str, staging: BorrowedFd<'_>, path: &Path) -> Result<(), HostError>;
    /// On resume: make sure the staging dir identified by token is unlocked again (after a reboot
    /// the key is gone).
    fn ensure_unlocked(&self, token: &str, staging: &Path) -> Result<(), HostError>;
    /// Whether `path` is already an encrypted directory.
    fn is_encrypted(&self, path: &Path) -> Result<bool, HostError>;
    /// Atomically exchange `a_name` in directory `a_dir` with `b_name` in `b_dir`
    /// (`renameat2(RENAME_EXCHANGE)`), relative to these handles, which the engine opened without
    /// following symlinks and checked to hold the expected entries: nothing is looked up by path
    /// again, so nobody can redirect the swap between the check and the rename.
    fn exchange(
        &self,
        a_dir: BorrowedFd<'_>,
        a_name: &OsStr,
        b_dir: BorrowedFd<'_>,
        b_name: &OsStr,
    ) -> Result<(), HostError>;
    /// Discard unused blocks of the filesystem holding `mountpoint_or_dir` (FITRIM).
    fn trim(&self, mountpoint_or_dir: &Path) -> Result<(), HostError>;
    /// Progress, called at most a few times per second, and always once at each phase start (on
    /// the calling thread, before any work of that phase).
    fn progress(&self, _p: &Progress) {}
    /// Polled between entries and 1 MiB chunks while scanning, copying, verifying and disposing;
    /// returning true makes the engine stop cleanly with [`MigrateError::Interrupted`] (the
    /// journal is written; running the same operation again resumes).
    fn should_stop(&self) -> bool {
        false
    }
}

/// What the engine is doing right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Scanning,
    Copying,
    Verifying,
    Swapping,
    Disposing,
    Aborting,
    RollingBack,
    /// Move mode: files moving into staging, then their directories settling.
    Moving,
    /// Move mode, aborted: files moving back.
    MovingBack,
}

impl Phase {
    /// The phase's name for progress displays and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Scanning => "scanning",
            Phase::Copying => "copying",
            Phase::Verifying => "verifying",
            Phase::Swapping => "swapping",
            Phase::Disposing => "disposing",
            Phase::Aborting => "aborting",
            Phase::RollingBack => "rolling back",
            Phase::Moving => "moving",
            Phase::MovingBack => "moving back",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub phase: Phase,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub files_done: u64,
    pub files_total: u64,
}

/// The recorded state of a conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Prepared,
    Copying,
    Copied,
    Verified,
    /// Move mode: files are moving into the staging directory (the directory is unusable).
    Moving,
    /// Move mode: everything is in the staging directory, not yet swapped into place.
    Moved,
    /// Move mode: an abort is moving files back; run the abort again to finish it.
    MovingBack,
    Swapped,
    /// A rollback was started and not finished; run [`rollback`] again.
    RollingBack,
    Done,
    Aborted,
    RolledBack,
}

impl State {
    /// Whether the swap has not happened yet: the directory's path still names the original tree
    /// (in move mode, partly moved into the staging directory).
    pub fn before_swap(self) -> bool {
        matches!(
            self,
            State::Prepared
                | State::Copying
                | State::Copied
                | State::Verified
                | State::Moving
                | State::Moved
                | State::MovingBack
        )
    }

    /// Whether [`abort`] can put the directory back as it was: every state before the swap (a
    /// move's files are moved back).
    pub fn abortable(self) -> bool {
        self.before_swap()
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Prepared => "prepared",
            State::Copying => "copying",
            State::Copied => "copied",
            State::Verified => "verified",
            State::Moving => "moving",
            State::Moved => "moved",
            State::MovingBack => "moving back",
            State::Swapped => "swapped",
            State::RollingBack => "rolling back",
            State::Done => "done",
            State::Aborted => "aborted",
            State::RolledBack => "rolled back",
        })
    }
}

/// The result of an operation that finished (or paused at `Swapped` with a backup).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub state: State,
    pub method: Method,
    pub token: String,
    /// Entries in the tree (below its root) and bytes of regular file data: a copy counts what it
    /// copies (a sparse file's allocated data, not its size; see [`Census::data`]), a move sizes.
    pub files: u64,
    pub bytes: u64,
    /// The old tree, kept in the work dir, when the state is `Swapped`.
    pub backup: Option<PathBuf>,
    /// Honest caveats for the user (e.g. what deleting or wiping can and cannot guarantee).
    pub notes: Vec<String>,
    /// Where this run's wall time went (a resumed run counts only what it did itself).
    pub timings: Timings,
}

/// Wall time per part of a run, in the order the parts first ran: `scan` (the census), `copy`,
/// `verify`, `move`, `sync` (making the copy durable), `journal` (recording transitions),
/// `swap`, `dispose` (removing the old tree, with its sync). For benchmarks and `--json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timings(Vec<(&'static str, std::time::Duration)>);

impl Timings {
    pub fn parts(&self) -> &[(&'static str, std::time::Duration)] {
        &self.0
    }

    fn add(&mut self, part: &'static str, d: std::time::Duration) {
        match self.0.iter_mut().find(|(p, _)| *p == part) {
            Some((_, t)) => *t += d,
            None => self.0.push((part, d)),
        }
    }

    /// Runs `f`, counting its wall time as `part`.
    fn time<T>(&mut self, part: &'static str, f: impl FnOnce() -> T) -> T {
        let t = std::time::Instant::now();
        let r = f();
        self.add(part, t.elapsed());
        r
    }
}

/// What the journal says, for `dirseal convert --status`-like displays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusView {
    pub state: State,
    pub method: Method,
    pub source: PathBuf,
    pub token: String,
    pub started_unix: u64,
    /// Progress as of the last journal write (written at each transition and every few seconds).
    pub files_done: u64,
    pub bytes_done: u64,
    pub files_total: u64,
    pub bytes_total: u64,
    pub keep_backup: bool,
    pub wipe: bool,
    /// The old tree, when it is kept in the work dir.
    pub backup: Option<PathBuf>,
    /// A live process holds the conversion's lock: it is running now, not interrupted.
    pub running: bool,
}

fn holder(pid: Option<u32>) -> String {
    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
}

fn list_users(users: &[ProcessUse]) -> String {
    let mut s: Vec<String> = users.iter().take(5).map(|u| u.to_string()).collect();
    if users.len() > 5 {
        s.push(format!("and {} more", users.len() - 5));
    }
    s.join("; ")
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot use {}: {source}; check that the directory exists", path.display())]
    SourceUnavailable { path: PathBuf, source: io::Error },
    #[error("{} is a symbolic link; convert the directory it points to instead", path.display())]
    SourceIsSymlink { path: PathBuf },
    #[error("{} is not a directory; only directories can be converted", path.display())]
    NotADirectory { path: PathBuf },
    #[error("{} is the root of a filesystem; convert a directory inside it instead", path.display())]
    FilesystemRoot { path: PathBuf },
    #[error("{} is already encrypted; there is nothing to convert", path.display())]
    AlreadyEncrypted { path: PathBuf },
    #[error("{} is encrypted on its own; move it out of the directory, convert, then move it back", path.display())]
    EncryptedInside { path: PathBuf },
    #[error("{} is immutable or append-only, which a copy cannot keep and which blocks removing the old tree; clear the flag (chattr -i -a) and try again, then set it again after the conversion", path.display())]
    ImmutableInside { path: PathBuf },
    #[error("{} is a mount point inside the directory; unmount it (or move it out) and try again", path.display())]
    MountPointInside { path: PathBuf },
    #[error("not enough free space for a copy of {}: about {needed} bytes needed, {available} available; free some space and try again", path.display())]
    NoSpace { path: PathBuf, needed: u64, available: u64 },
    #[error("not enough free space to move {} into the encrypted directory: about {needed} bytes needed (a few chunks, the directories and the hard-linked files, which are copied), {available} available; free some space and try again", path.display())]
    NoSpaceToMove { path: PathBuf, needed: u64, available: u64 },
    #[error("not enough free space for a copy of {}: about {needed} bytes needed, {available} available, and a move keeps no backup; free some space, or convert without keeping a backup", path.display())]
    NoSpaceForBackup { path: PathBuf, needed: u64, available: u64 },
    #[error("moving {} failed: {source}; the move is paused and nothing is lost: part of the files are already in the conversion's root-only staging directory, each whole in one of the two trees (the journal says which); fix the cause and run the same command again to continue, or abort the conversion to move them back", path.display())]
    MoveFailed { path: PathBuf, source: io::Error },
    #[error("the filesystem ran out of space while moving {}; the move is paused and nothing is lost (every file is whole in one of the two trees, the journal says which); free some space and run the same command again to continue", path.display())]
    MoveOutOfSpace { path: PathBuf },
    #[error("cannot continue moving {}: {reason}; something changed the directory or its staging copy during the move; nothing more was changed (see docs/crash-safety.md to recover by hand)", path.display())]
    MoveInconsistent { path: PathBuf, reason: String },
    #[error("moving {} into the encrypted directory keeps no backup of the original; convert without keeping a backup, or by copying (which needs room for a second copy)", path.display())]
    MoveWithBackup { path: PathBuf },
    #[error("not enough free inodes for a copy of {}: {needed} needed, {available} available; delete some files and try again", path.display())]
    NoInodes { path: PathBuf, needed: u64, available: u64 },
    #[error("{} is in use: {}; close these programs (or log the user out) and try again, or force the conversion", path.display(), list_users(users))]
    InUse { path: PathBuf, users: Vec<ProcessUse> },
    #[error("work directory {} is unsafe: {reason}; fix or remove it and try again", path.display())]
    UnsafeWorkdir { path: PathBuf, reason: String },
    #[error("the staging copy in {} does not carry the encryption recorded for it ({reason}); nothing was swapped and the original is untouched: abort the conversion and start it again", workdir.display())]
    StagingNotEncrypted { workdir: PathBuf, reason: String },
    #[error("work directory {} is not on the same mount as {}; it must be on the directory's filesystem", workdir.display(), source_dir.display())]
    WorkdirElsewhere { workdir: PathBuf, source_dir: PathBuf },
    #[error("work directory {} lies inside {}; use one outside the directory being converted", workdir.display(), source_dir.display())]
    WorkdirInsideSource { workdir: PathBuf, source_dir: PathBuf },
    #[error("another conversion{} is running in {}; wait for it to finish (or stop it) and try again", holder(*pid), workdir.display())]
    Busy { workdir: PathBuf, pid: Option<u32> },
    #[error("the conversion journal {} is corrupt ({reason}), so dirseal cannot tell how far the conversion got and changes nothing. If the directory being converted still holds your files, delete {} and start again; if it does not, your original files are in {}/staging: move them back first", path.display(), workdir.display(), workdir.display())]
    CorruptJournal { path: PathBuf, workdir: PathBuf, reason: String },
    #[error("work directory {} belongs to the conversion of {}, not {}; finish or abort that conversion first", workdir.display(), journal_source.display(), requested.display())]
    OtherSource { workdir: PathBuf, journal_source: PathBuf, requested: PathBuf },
    #[error("no conversion is recorded in {}; start one first", workdir.display())]
    NoConversion { workdir: PathBuf },
    #[error("{} was replaced or moved since the conversion started; put the directory back, or abort the conversion", path.display())]
    SourceReplaced { path: PathBuf },
    #[error("copying {} failed: {source}; fix the cause, then run the same command again to resume (nothing was swapped; the original is untouched)", path.display())]
    CopyFailed { path: PathBuf, source: io::Error },
    #[error("the filesystem ran out of space while copying {}; free some space and run the same command again to resume, or abort the conversion (the original is untouched)", path.display())]
    OutOfSpace { path: PathBuf },
    #[error("{} keeps changing while it is copied; stop the programs writing to it and run the same command again", path.display())]
    KeepsChanging { path: PathBuf },
    #[error("the copy of {} still differs from the original ({reason}) after several passes; stop the programs changing the directory and run the same command again", path.display())]
    VerifyFailed { path: PathBuf, reason: String },
    #[error("{step} failed: {source}; fix the cause and run the same command again")]
    Host { step: &'static str, source: HostError },
    #[error("the conversion was interrupted while {state}; nothing is lost: run the same command again to resume")]
    Interrupted { state: State },
    #[error("cannot {op} a conversion that is {state}: {hint}")]
    WrongState { op: &'static str, state: State, hint: &'static str },
    #[error("{what} {} failed: {source}; fix the cause and run the same command again", path.display())]
    Io { what: &'static str, path: PathBuf, source: io::Error },
    #[error("internal error: {0}; please report this bug")]
    Internal(&'static str),
}

/// Most passes a copy may take in one run before verification gives up on a directory that keeps
/// changing.
pub(crate) const MAX_ROUNDS: u32 = 3;

/// The source as resolved once: absolute path (canonical parent + final name) and an open handle.
#[derive(Debug)]
struct Source {
    path: PathBuf,
    fd: OwnedFd,
    meta: fsx::Meta,
}

impl Source {
    /// Resolves a path as the caller gave it: symlinks in the parent directories are followed
    /// once, here, and the result is used from then on; a final symlink is refused.
    fn resolve(p: &Path) -> Result<Source, MigrateError> {
        let unavailable = |e| MigrateError::SourceUnavailable { path: p.to_path_buf(), source: e };
        let path = match p.file_name() {
            Some(name) => {
                let parent = match p.parent() {
                    Some(q) if !q.as_os_str().is_empty() => q,
                    _ => Path::new("."),
                };
                std::fs::canonicalize(parent).map_err(unavailable)?.join(name)
            }
            // "/", "..", "x/..": only a full resolution says what they name.
            None => std::fs::canonicalize(p).map_err(unavailable)?,
        };
        Source::open(path)
    }

    /// Opens an absolute path that must hold no symlink anywhere (a recorded source path: a
    /// user who swapped one of its directories for a symlink gets [`MigrateError::SourceReplaced`]).
    fn open(path: PathBuf) -> Result<Source, MigrateError> {
        if path.parent().is_none() {
            return Err(MigrateError::FilesystemRoot { path });
        }
        let err = |path: &Path, e: io::Error| {
            if fsx::is_redirected(&e) {
                MigrateError::SourceReplaced { path: path.to_path_buf() }
            } else {
                MigrateError::SourceUnavailable { path: path.to_path_buf(), source: e }
            }
        };
        let meta = fsx::stat_path(&path)
            .map_err(|e| err(&path, e))?
            .ok_or_else(|| err(&path, io::ErrorKind::NotFound.into()))?;
        match meta.kind {
            fsx::Kind::Symlink => return Err(MigrateError::SourceIsSymlink { path }),
            fsx::Kind::Dir => {}
            _ => return Err(MigrateError::NotADirectory { path }),
        }
        if meta.mount_root {
            return Err(MigrateError::FilesystemRoot { path });
        }
        let fd = fsx::open_dir_path(&path).map_err(|e| err(&path, e))?;
        let meta = fsx::stat_fd(&fd).map_err(|e| err(&path, e))?;
        Ok(Source { path, fd, meta })
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl Fn(io::Error) -> MigrateError + 'a {
    move |source| MigrateError::Io { what, path: path.to_path_buf(), source }
}

fn host_err(step: &'static str) -> impl Fn(HostError) -> MigrateError {
    move |source| MigrateError::Host { step, source }
}

/// What a new conversion will copy and need, as counted by [`preflight`], and how it will put
/// the data into staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Census {
    /// Entries below the root.
    pub entries: u64,
    /// Bytes of regular file content, as sizes say (sparse files count their holes).
    pub bytes: u64,
    /// Bytes of regular file data: the sizes, but a sparse file counts only its allocated blocks.
    /// What a copy actually reads and writes, and what its progress counts.
    pub data: u64,
    /// Copy or move: asked for, or picked by [`Mode::Auto`] (then `auto` is set).
    pub method: Method,
    pub auto: bool,
    /// Free space the chosen method needs, and what the filesystem has.
    pub space_needed: u64,
    pub space_available: u64,
    /// Free space a copy needs (allocated blocks plus a margin) and a move needs (a few chunks,
    /// the directories and the hard-linked files, which are copied).
    pub copy_needed: u64,
    pub move_needed: u64,
    pub inodes_needed: u64,
    pub inodes_available: u64,
    /// Files with hard links outside the tree (they stop being shared: see the outcome's notes).
    pub outside_links: u64,
}

/// A new conversion that passed [`preflight`]: the resolved source and its census. [`start`]
/// begins the conversion from it without walking the tree again.
#[derive(Debug)]
pub struct Plan {
    src: Source,
    census: Census,
    /// How long the census took, reported with the run's other timings.
    scan: std::time::Duration,
}

impl Plan {
    pub fn census(&self) -> &Census {
        &self.census
    }

    /// The source as resolved (canonical parent, final name).
    pub fn source(&self) -> &Path {
        &self.src.path
    }
}

/// Checks everything that can be checked without writing: the source, the work dir location,
/// free space and inodes, and (unless forced) that no process uses the directory; decides
/// between copying and moving. Walks the tree once, for the census the plan carries.
pub fn preflight(req: &Request, host: &dyn Host) -> Result<Plan, MigrateError> {
    let src = Source::resolve(req.source)?;
    let t = std::time::Instant::now();
    let census = preflight_source(req, host, &src)?;
    Ok(Plan { src, census, scan: t.elapsed() })
}

/// Free space a move needs: the chunk in flight or one batch (whichever is pending; both
/// counted, with a block of rounding per file), a block per directory, the hard-linked files
/// (copied, not moved), and a margin.
fn move_needed(c: &scan::Census) -> u64 {
    mv::CHUNK + mv::BATCH_BYTES + mv::BATCH_FILES as u64 * 4096 + (c.dirs + 1) * 4096 + c.linked_alloc + (16 << 20)
}

/// Picks copy or move by free space (and the request), or refuses. Returns the method, whether
/// it was picked automatically, and what a copy and a move need.
fn choose_method(
    req: &Request,
    src: &Source,
    census: &scan::Census,
    available: u64,
) -> Result<(Method, bool, u64, u64), MigrateError> {
    let copy_needed = census.alloc + census.alloc / 20 + (8 << 20);
    let move_needed = move_needed(census);
    let auto = req.mode == Mode::Auto;
    let path = || src.path.clone();
    match req.mode {
        Mode::Copy | Mode::Auto if available >= copy_needed => Ok((Method::Copy, auto, copy_needed, move_needed)),
        Mode::Copy => Err(MigrateError::NoSpace { path: path(), needed: copy_needed, available }),
        Mode::Move if req.keep_backup => Err(MigrateError::MoveWithBackup { path: path() }),
        _ if req.keep_backup => Err(MigrateError::NoSpaceForBackup { path: path(), needed: copy_needed, available }),
        Mode::Move | Mode::Auto if available >= move_needed => Ok((Method::Move, auto, copy_needed, move_needed)),
        Mode::Move | Mode::Auto => Err(MigrateError::NoSpaceToMove { path: path(), needed: move_needed, available }),
    }
}

/// The checks that need no walk of the tree.
fn quick_checks(req: &Request, host: &dyn Host, src: &Source) -> Result<(), MigrateError> {
    if src.meta.encrypted
        || host.is_encrypted(&src.path).map_err(host_err("checking whether the directory is encrypted"))?
    {
        return Err(MigrateError::AlreadyEncrypted { path: src.path.clone() });
    }
    check_workdir_location(req.workdir, src)?;
    if let Some(wd) = Workdir::open(req.workdir, false)? {
        // A running converter holds the source open: without this it would be reported as a
        // process using the directory rather than as what it is.
        wd.probe_lock()?;
        if let Some(j) = wd.read()? {
            if !j.step.is_final() && j.source.0 != src.path {
                return Err(other_source(req.workdir, &j, &src.path));
            }
        }
    }
    if !req.force {
        check_not_in_use(&src.path)?;
    }
    Ok(())
}

fn preflight_source(req: &Request, host: &dyn Host, src: &Source) -> Result<Census, MigrateError> {
    quick_checks(req, host, src)?;
    let ctx = Ctx::new(host, &src.path, src.meta.mnt_id, Phase::Scanning, 0, 0);
    ctx.tick(true);
    let census = pool(req.threads)?.install(|| scan::census(&ctx, &src.fd)).map_err(|e| match e {
        MigrateError::Interrupted { .. } => MigrateError::Interrupted { state: State::Prepared },
        e => e,
    })?;
    let vfs = rustix::fs::fstatvfs(&src.fd).map_err(|e| io_err("checking free space on", &src.path)(e.into()))?;
    let available = vfs.f_bavail.saturating_mul(vfs.f_frsize);
    let (method, auto, copy_needed, move_needed) = choose_method(req, src, &census, available)?;
    let inodes = match method {
        Method::Copy => census.entries + 1 + census.entries / 20 + 16,
        Method::Move => census.dirs + census.linked + mv::BATCH_FILES as u64 + 16,
    };
    if vfs.f_favail < inodes {
        return Err(MigrateError::NoInodes { path: src.path.clone(), needed: inodes, available: vfs.f_favail });
    }
    Ok(Census {
        entries: census.entries,
        bytes: census.bytes,
        data: census.data,
        method,
        auto,
        space_needed: if method == Method::Copy { copy_needed } else { move_needed },
        space_available: available,
        copy_needed,
        move_needed,
        inodes_needed: inodes,
        inodes_available: vfs.f_favail,
        outside_links: census.outside_links,
    })
}

fn check_not_in_use(path: &Path) -> Result<(), MigrateError> {
    let users = find_users(path).map_err(io_err("looking for processes using", path))?;
    if users.is_empty() {
        Ok(())
    } else {
        Err(MigrateError::InUse { path: path.to_path_buf(), users })
    }
}

fn other_source(workdir: &Path, j: &Journal, requested: &Path) -> MigrateError {
    MigrateError::OtherSource {
        workdir: workdir.to_path_buf(),
        journal_source: j.source.0.clone(),
        requested: requested.to_path_buf(),
    }
}

/// The work dir must be on the source's mount (the swap is a rename) and outside the source.
fn check_workdir_location(workdir: &Path, src: &Source) -> Result<(), MigrateError> {
    if !workdir.is_absolute() {
        return Err(MigrateError::UnsafeWorkdir {
            path: workdir.to_path_buf(),
            reason: "it must be an absolute path".into(),
        });
    }
    let mut existing = workdir;
    let mut rest = Vec::new();
    let meta = loop {
        match fsx::stat_path(existing).map_err(io_err("inspecting", existing))? {
            Some(m) => break m,
            None => {
                rest.push(existing.file_name());
                existing = existing.parent().ok_or(MigrateError::Internal("no existing ancestor"))?;
            }
        }
    };
    let real = std::fs::canonicalize(existing).map_err(io_err("resolving", existing))?;
    if real.starts_with(&src.path) {
        return Err(MigrateError::WorkdirInsideSource { workdir: workdir.to_path_buf(), source_dir: src.path.clone() });
    }
    if meta.mnt_id != src.meta.mnt_id {
        return Err(MigrateError::WorkdirElsewhere { workdir: workdir.to_path_buf(), source_dir: src.path.clone() });
    }
    Workdir::check_location(workdir)
}

/// Starts a conversion (running the [`preflight`] checks itself) or resumes the unfinished one
/// recorded in the work dir, from whatever state it is in. Returns when the conversion is `Done`,
/// or `Swapped` with a backup. A resumed conversion keeps its recorded `keep_backup` and `wipe`;
/// `force` and `threads` apply to this run. A finished journal (done, aborted, rolled back) is
/// replaced by a new conversion.
pub fn convert(req: &Request, host: &dyn Host) -> Result<Outcome, MigrateError> {
    let src = Source::resolve(req.source)?;
    if let Some(resumed) = resume_recorded(req, host, &src) {
        return resumed;
    }
    let mut timings = Timings::default();
    let census = timings.time("scan", || preflight_source(req, host, &src))?;
    begin(req, host, &src, &census, timings)
}

/// Begins the conversion [`preflight`] planned, without walking the tree again: what may have
/// changed while a person confirmed it (the source replaced, a converter started, a program
/// opened the directory) is checked again. Like [`convert`], resumes an unfinished conversion
/// recorded meanwhile.
pub fn start(req: &Request, host: &dyn Host, plan: Plan) -> Result<Outcome, MigrateError> {
    let src = Source::resolve(req.source)?;
    if (src.meta.dev, src.meta.ino) != (plan.src.meta.dev, plan.src.meta.ino) {
        return Err(MigrateError::SourceReplaced { path: src.path });
    }
    if let Some(resumed) = resume_recorded(req, host, &src) {
        return resumed;
    }
    quick_checks(req, host, &src)?;
    let mut timings = Timings::default();
    timings.add("scan", plan.scan);
    begin(req, host, &src, &plan.census, timings)
}

/// Resumes the unfinished conversion recorded in the work dir, if there is one.
fn resume_recorded(req: &Request, host: &dyn Host, src: &Source) -> Option<Result<Outcome, MigrateError>> {
    let recorded = match Workdir::open(req.workdir, false) {
        Ok(Some(wd)) => wd.read(),
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    };
    let j = match recorded {
        Ok(j) => j.filter(|j| !j.step.is_final())?,
        Err(e) => return Some(Err(e)),
    };
    Some((|| {
        if j.source.0 != src.path {
            return Err(other_source(req.workdir, &j, &src.path));
        }
        let wd = Workdir::open(req.workdir, false)?
            .ok_or(MigrateError::NoConversion { workdir: req.workdir.to_path_buf() })?;
        let _lock = wd.lock()?;
        let j = wd.read()?.ok_or(MigrateError::NoConversion { workdir: req.workdir.to_path_buf() })?;
        run(req, host, &wd, j, true, Timings::default())
    })())
}

/// Creates the work dir and staging, has the host encrypt it, records `Prepared` and runs.
fn begin(
    req: &Request,
    host: &dyn Host,
    src: &Source,
    census: &Census,
    mut timings: Timings,
) -> Result<Outcome, MigrateError> {
    let prepared = std::time::Instant::now();
    let wd =
        Workdir::open(req.workdir, true)?.ok_or(MigrateError::Internal("work dir missing right after creation"))?;
    let _lock = wd.lock()?;
    let old = wd.read()?;
    if let Some(j) = &old {
        if !j.step.is_final() {
            // Another converter started between our look and the lock.
            if j.source.0 != src.path {
                return Err(other_source(req.workdir, j, &src.path));
            }
            return run(req, host, &wd, j.clone(), true, timings);
        }
    }
    clear_leftovers(&wd, old.as_ref(), Point::LeftoverEntry)?;
    fsx::mkdir(&wd.fd, STAGING.as_ref()).map_err(io_err("creating", &wd.staging_path()))?;
    wd.sync()?;
    fault::point(Point::AfterStagingCreated);
    let stg_fd = fsx::open_dir(&wd.fd, STAGING.as_ref()).map_err(io_err("opening", &wd.staging_path()))?;
    let token = host
        .prepare_staging(stg_fd.as_fd(), &wd.staging_path())
        .map_err(host_err("preparing the encrypted staging directory"))?;
    if token.len() > journal::MAX_TOKEN || token.chars().any(char::is_control) {
        return Err(MigrateError::Host {
            step: "preparing the encrypted staging directory",
            source: HostError(format!("the host returned an unusable token of {} bytes", token.len())),
        });
    }
    // What the host did to the staging dir (its encryption policy) must be on disk before the
    // journal that relies on it.
    fsx::fsync(&stg_fd).map_err(io_err("syncing", &wd.staging_path()))?;
    let stg = fsx::stat_fd(&stg_fd).map_err(io_err("inspecting", &wd.staging_path()))?;
    fault::point(Point::BeforeRecordPrepared);
    let mut j = Journal {
        version: Version,
        source: HexPath(src.path.clone()),
        recorded_dev: src.meta.dev,
        source_ino: src.meta.ino,
        staging_ino: stg.ino,
        token,
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        keep_backup: req.keep_backup,
        wipe: req.wipe,
        files_total: census.entries,
        // A copy counts data, not sizes (a sparse disk image would make the bar and ETA lie); a
        // move moves whole sizes chunk by chunk and counts those.
        bytes_total: if census.method == Method::Copy { census.data } else { census.bytes },
        outside_links: census.outside_links,
        files_done: 0,
        bytes_done: 0,
        recopied: 0,
        root_times: None,
        copy_started: None,
        step: Step::Prepared,
        method: census.method,
        inflight: None,
    };
    wd.record(&mut j, Step::Prepared, Point::AfterPrepare)?;
    timings.add("prepare", prepared.elapsed());
    run(req, host, &wd, j, false, timings)
}

/// Where the staging copy of the conversion recorded in `workdir` is (or will be).
pub fn staging_path(workdir: &Path) -> PathBuf {
    workdir.join(STAGING)
}

/// Removes what an earlier attempt left in the work dir: the staging copy of an aborted
/// conversion, or an empty staging dir made just before a crash (before the journal existed).
/// Anything else is left alone: it might be someone's data.
fn clear_leftovers(wd: &Workdir, old: Option<&Journal>, point: Point) -> Result<(), MigrateError> {
    let Some(t) = wd.staging_meta()? else { return Ok(()) };
    let ours = match old {
        Some(j) => t.ino == j.staging_ino && t.ino != j.source_ino,
        None => {
            t.kind == fsx::Kind::Dir
                && fsx::open_dir(&wd.fd, STAGING.as_ref())
                    .and_then(fsx::list_names)
                    .map(|n| n.is_empty())
                    .unwrap_or(false)
        }
    };
    if !ours {
        return Err(MigrateError::UnsafeWorkdir {
            path: wd.path.clone(),
            reason: format!(
                "{} exists but is not a copy this conversion made; move it away",
                wd.staging_path().display()
            ),
        });
    }
    remove_staging(wd, point)
}

/// Removes the staging dir; `point` names the fault point reached after each removed entry.
fn remove_staging(wd: &Workdir, point: Point) -> Result<(), MigrateError> {
    remove::remove_tree(wd.fd.as_fd(), STAGING.as_ref(), false, &|_| {
        fault::point(point);
        Ok(())
    })
    .map_err(io_err("removing", &wd.staging_path()))?;
    wd.sync()
}

/// Opens source and staging and checks they are still the inodes the journal names.
fn open_pair(j: &Journal, wd: &Workdir) -> Result<(Source, OwnedFd), MigrateError> {
    let src = Source::open(j.source.0.clone())?;
    if src.meta.ino != j.source_ino || src.meta.dev != wd.dev()? {
        return Err(MigrateError::SourceReplaced { path: j.source.0.clone() });
    }
    Ok((src, open_staging(j, wd)?))
}

/// The staging dir, through the work dir's handle, if it is still the inode the journal names.
fn open_staging(j: &Journal, wd: &Workdir) -> Result<OwnedFd, MigrateError> {
    let stg = fsx::open_dir(&wd.fd, STAGING.as_ref()).map_err(io_err("opening", &wd.staging_path()))?;
    let m = fsx::stat_fd(&stg).map_err(io_err("inspecting", &wd.staging_path()))?;
    if m.ino != j.staging_ino {
        return Err(MigrateError::UnsafeWorkdir {
            path: wd.path.clone(),
            reason: "its staging directory was replaced".into(),
        });
    }
    Ok(stg)
}

/// Refuses to go on unless the staging copy carries the encryption the journal's token names.
fn check_encrypted(host: &dyn Host, j: &Journal, wd: &Workdir, stg: &OwnedFd) -> Result<(), MigrateError> {
    host.check_staging(&j.token, stg.as_fd(), &wd.staging_path())
        .map_err(|e| MigrateError::StagingNotEncrypted { workdir: wd.path.clone(), reason: e.0 })
}

/// Exchanges the source with the work dir's staging entry, relative to handles opened once: the
/// source's parent (opened without following any symlink) must hold `at_source` under the
/// source's name, and the staging entry must be `at_staging`.
fn exchange(
    host: &dyn Host,
    j: &Journal,
    wd: &Workdir,
    (at_source, at_staging): (u64, u64),
    step: &'static str,
) -> Result<(), MigrateError> {
    let replaced = || MigrateError::SourceReplaced { path: j.source.0.clone() };
    let (parent, name) = match fsx::open_parent(&j.source.0) {
        Ok(Some(p)) => p,
        Ok(None) => return Err(replaced()),
        Err(e) if fsx::is_redirected(&e) => return Err(replaced()),
        Err(e) => return Err(io_err("opening the parent of", &j.source.0)(e)),
    };
    let here = fsx::stat_at(&parent, name).map_err(io_err("inspecting", &j.source.0))?;
    // The device as it is now: the recorded one may differ after a reboot (see Journal::recorded_dev).
    let dev = wd.dev()?;
    if !here.is_some_and(|m| m.dev == dev && m.ino == at_source) {
        return Err(replaced());
    }
    if wd.staging_meta()?.is_none_or(|m| m.ino != at_staging) {
        return Err(MigrateError::UnsafeWorkdir {
            path: wd.path.clone(),
            reason: "its staging directory was replaced".into(),
        });
    }
    host.exchange(parent.as_fd(), name, wd.fd.as_fd(), STAGING.as_ref()).map_err(host_err(step))
}

fn pool(threads: usize) -> Result<rayon::ThreadPool, MigrateError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|_| MigrateError::Internal("cannot start worker threads"))
}

/// Records the progress counters of a pass that stopped early, and tags an interruption with the
/// state it left the conversion in.
fn after_pass(wd: &Workdir, j: &mut Journal, ctx: &Ctx, e: MigrateError) -> MigrateError {
    use std::sync::atomic::Ordering::Relaxed;
    j.files_done = ctx.files_done.load(Relaxed).min(j.files_total);
    j.bytes_done = ctx.bytes_done.load(Relaxed).min(j.bytes_total);
    j.recopied += ctx.recopied.load(Relaxed);
    // The journal state is unchanged; only the counters are new, so a failed write loses nothing.
    let _ = wd.write(j);
    match e {
        MigrateError::Interrupted { .. } => MigrateError::Interrupted { state: j.step.public() },
        e => e,
    }
}

/// A progress saver for a long pass: rewrites the journal with new counters (and nothing else)
/// every few seconds, so `status` from another process shows how far the pass got. Failures are
/// ignored: the recorded state stays right, only the counters lag.
fn checkpoint<'a>(wd: &'a Workdir, j: &Journal) -> impl Fn(u64, u64) + Sync + 'a {
    let shared = std::sync::Mutex::new(j.clone());
    move |files, bytes| {
        if let Ok(mut s) = shared.try_lock() {
            s.files_done = files.min(s.files_total);
            s.bytes_done = bytes.min(s.bytes_total);
            let _ = wd.write(&s);
        }
    }
}

fn run(
    req: &Request,
    host: &dyn Host,
    wd: &Workdir,
    mut j: Journal,
    resumed: bool,
    mut t: Timings,
) -> Result<Outcome, MigrateError> {
    let pool = pool(req.threads)?;
    let mut unlocked = !resumed;
    // Whether this process recorded the copy pass it is in: a pass it finds recorded was
    // interrupted, and what it copied may not have reached the disk.
    let mut pass_recorded_here = false;
    let mut notes = Vec::new();
    loop {
        match j.step {
            Step::Prepared if j.method == Method::Move => {
                t.time("journal", || wd.record(&mut j, Step::Moving, Point::AfterRecordMoving))?;
            }
            Step::Prepared => {
                j.copy_started = Some(wd.clock()?);
                t.time("journal", || wd.record(&mut j, Step::Copying { round: 0 }, Point::AfterRecordCopying))?;
                pass_recorded_here = true;
            }
            Step::Moving => {
                ensure_unlocked(host, wd, &j, &mut unlocked)?;
                let (src, stg) = open_pair(&j, wd)?;
                check_encrypted(host, &j, wd, &stg)?;
                let source = j.source.0.clone();
                let ctx = Ctx::new(host, &source, src.meta.mnt_id, Phase::Moving, j.files_total, j.bytes_total);
                ctx.tick(true);
                let moved = t.time("move", || mv::Mover::new(&ctx, wd, &mut j, &src.fd, &stg, false).run());
                if let Err(e) = moved {
                    return Err(after_pass(wd, &mut j, &ctx, move_err(e)));
                }
                t.time("sync", || rustix::fs::syncfs(&stg))
                    .map_err(|e| io_err("syncing", &wd.staging_path())(e.into()))?;
                j.files_done = j.files_total;
                j.bytes_done = j.bytes_total;
                t.time("journal", || wd.record(&mut j, Step::Settling, Point::AfterRecordSettling))?;
            }
            Step::Settling => {
                ensure_unlocked(host, wd, &j, &mut unlocked)?;
                let (src, stg) = open_pair(&j, wd)?;
                let source = j.source.0.clone();
                let ctx = Ctx::new(host, &source, src.meta.mnt_id, Phase::Moving, j.files_total, j.bytes_total);
                if let Err(e) = t.time("move", || mv::settle(&ctx, &src.fd, &stg)) {
                    return Err(after_pass(wd, &mut j, &ctx, e));
                }
                t.time("sync", || rustix::fs::syncfs(&stg))
                    .map_err(|e| io_err("syncing", &wd.staging_path())(e.into()))?;
                // Settled, the staging root has the original's times (the source root's changed
                // as entries left it).
                let root = fsx::stat_fd(&stg).map_err(io_err("inspecting", &wd.staging_path()))?;
                j.root_times = Some(journal::RootTimes { atime: root.atime, mtime: root.mtime });
                t.time("journal", || wd.record(&mut j, Step::Moved, Point::AfterRecordMoved))?;
            }
            Step::MovingBack => {
                return Err(MigrateError::WrongState {
                    op: "resume",
                    state: State::MovingBack,
                    hint: "an abort is moving the files back; run the abort again to finish it",
                })
            }
            Step::Copying { round } => {
                if !pass_recorded_here {
                    // Every journal written from here on says so (progress checkpoints included).
                    j.copy_started = None;
                }
                ensure_unlocked(host, wd, &j, &mut unlocked)?;
                let (src, stg) = open_pair(&j, wd)?;
                check_encrypted(host, &j, wd, &stg)?;
                let source = j.source.0.clone();
                let save = checkpoint(wd, &j);
                let ctx = Ctx::new(host, &source, src.meta.mnt_id, Phase::Copying, j.files_total, j.bytes_total)
                    .saving(&save);
                ctx.tick(true);
                if let Err(e) = t.time("copy", || copy::copy_tree(&ctx, &pool, &src.fd, &stg)) {
                    return Err(after_pass(wd, &mut j, &ctx, e));
                }
                fault::point(Point::BeforeRecordCopied);
                t.time("sync", || rustix::fs::syncfs(&stg))
                    .map_err(|e| io_err("syncing", &wd.staging_path())(e.into()))?;
                ctx.tick(true);
                j.files_done = j.files_total;
                j.bytes_done = j.bytes_total;
                j.recopied += ctx.recopied.load(std::sync::atomic::Ordering::Relaxed);
                t.time("journal", || wd.record(&mut j, Step::Copied { round }, Point::AfterRecordCopied))?;
            }
            Step::Copied { round } => {
                ensure_unlocked(host, wd, &j, &mut unlocked)?;
                let (src, stg) = open_pair(&j, wd)?;
                let source = j.source.0.clone();
                let save = checkpoint(wd, &j);
                let ctx = Ctx::new(host, &source, src.meta.mnt_id, Phase::Verifying, j.files_total, j.bytes_total)
                    .saving(&save);
                ctx.tick(true);
                // A clock that went back since the copy began could stamp a later change with
                // an older ctime: then every file is compared.
                let started = match j.copy_started {
                    Some(t0) if wd.clock()? >= t0 => Some(t0),
                    _ => None,
                };
                let diff = match t.time("verify", || verify::verify_tree(&ctx, &pool, &src.fd, &stg, started)) {
                    Ok(d) => d,
                    Err(e) => return Err(after_pass(wd, &mut j, &ctx, e)),
                };
                fault::point(Point::AfterVerify);
                if diff.count > 0 {
                    // The stale entries were removed from staging; make that durable first.
                    t.time("sync", || rustix::fs::syncfs(&stg))
                        .map_err(|e| io_err("syncing", &wd.staging_path())(e.into()))?;
                    if round + 1 >= MAX_ROUNDS {
                        // The next run starts a fresh series of passes; this one gives up.
                        t.time("journal", || wd.record(&mut j, Step::Copying { round: 0 }, None))?;
                        let (path, reason) = diff.first.unwrap_or_default();
                        return Err(MigrateError::VerifyFailed { path, reason });
                    }
                    t.time("journal", || {
                        wd.record(&mut j, Step::Copying { round: round + 1 }, Point::AfterRecordRecopy)
                    })?;
                    pass_recorded_here = true;
                    continue;
                }
                let root = fsx::stat_fd(&src.fd).map_err(io_err("inspecting", &j.source.0))?;
                j.root_times = Some(journal::RootTimes { atime: root.atime, mtime: root.mtime });
                t.time("journal", || wd.record(&mut j, Step::Verified, Point::AfterRecordVerified))?;
            }
            Step::Verified | Step::Moved => {
                t.time("swap", || swap(req, host, wd, &j))?;
                t.time("journal", || wd.record(&mut j, Step::Swapped { disposing: false }, Point::AfterRecordSwapped))?;
            }
            Step::Swapped { disposing: false } => {
                if j.keep_backup {
                    return Ok(Outcome { timings: t, ..outcome(&j, wd, notes) });
                }
                t.time("journal", || {
                    wd.record(&mut j, Step::Swapped { disposing: true }, Point::AfterRecordDisposing)
                })?;
            }
            Step::Swapped { disposing: true } => {
                t.time("dispose", || dispose(host, wd, &j, &mut notes, Some(&pool)))?;
                t.time("journal", || wd.record(&mut j, Step::Done, Point::AfterRecordDone))?;
            }
            Step::Done => return Ok(Outcome { timings: t, ..outcome(&j, wd, notes) }),
            Step::RollingBack => {
                return Err(MigrateError::WrongState {
                    op: "resume",
                    state: State::RollingBack,
                    hint: "a rollback was started; run the rollback again to finish it",
                })
            }
            Step::Aborted | Step::RolledBack => {
                return Err(MigrateError::WrongState {
                    op: "resume",
                    state: j.step.public(),
                    hint: "it is finished; start a new conversion",
                })
            }
        }
    }
}

/// A failure while moving pauses the move, with its own message: the original is no longer
/// untouched (files are in the staging directory), but every file is whole somewhere.
fn move_err(e: MigrateError) -> MigrateError {
    match e {
        MigrateError::OutOfSpace { path } => MigrateError::MoveOutOfSpace { path },
        MigrateError::CopyFailed { path, source } => MigrateError::MoveFailed { path, source },
        e => e,
    }
}

fn ensure_unlocked(host: &dyn Host, wd: &Workdir, j: &Journal, unlocked: &mut bool) -> Result<(), MigrateError> {
    if !*unlocked {
        host.ensure_unlocked(&j.token, &wd.staging_path()).map_err(host_err("unlocking the staging directory"))?;
        *unlocked = true;
    }
    Ok(())
}

/// Where the two trees physically are, judged by inode numbers (a crash may have come between a
/// rename and the journal write that records it).
#[derive(PartialEq, Eq)]
enum Place {
    /// Source path holds the original; staging holds the copy.
    Original,
    /// Source path holds the copy; staging holds the original.
    Exchanged,
    /// Source path holds the original and the staging copy is gone.
    OriginalOnly,
    /// Source path holds the copy and the old tree is gone.
    CopyOnly,
    Unknown,
}

fn place(j: &Journal, wd: &Workdir) -> Result<Place, MigrateError> {
    let s = match fsx::stat_path(&j.source.0) {
        Ok(s) => s,
        // A symlink now in the source's path: whatever is there is not ours.
        Err(e) if fsx::is_redirected(&e) => return Ok(Place::Unknown),
        Err(e) => return Err(io_err("inspecting", &j.source.0)(e)),
    };
    let t = wd.staging_meta()?;
    let (s, t) = (s.map(|m| (m.dev, m.ino)), t.map(|m| m.ino));
    let dev = wd.dev()?;
    Ok(match (s, t) {
        (Some((d, si)), Some(ti)) if d == dev && si == j.source_ino && ti == j.staging_ino => Place::Original,
        (Some((d, si)), Some(ti)) if d == dev && si == j.staging_ino && ti == j.source_ino => Place::Exchanged,
        (Some((d, si)), None) if d == dev && si == j.source_ino => Place::OriginalOnly,
        (Some((d, si)), None) if d == dev && si == j.staging_ino => Place::CopyOnly,
        _ => Place::Unknown,
    })
}

/// Syncs the directories whose entries a swap changed, so the swap is durable before it is
/// recorded.
fn sync_swap(j: &Journal, wd: &Workdir) -> Result<(), MigrateError> {
    if let Some(parent) = j.source.0.parent() {
        let fd = fsx::open_dir_path(parent).map_err(io_err("opening", parent))?;
        fsx::fsync(&fd).map_err(io_err("syncing", parent))?;
    }
    wd.sync()
}

fn swap(req: &Request, host: &dyn Host, wd: &Workdir, j: &Journal) -> Result<(), MigrateError> {
    Ctx::new(host, &j.source.0, 0, Phase::Swapping, j.files_total, j.bytes_total).tick(true);
    match place(j, wd)? {
        Place::Original => {
            if !req.force {
                check_not_in_use(&j.source.0)?;
            }
            check_encrypted(host, j, wd, &open_staging(j, wd)?)?;
            exchange(host, j, wd, (j.source_ino, j.staging_ino), "swapping the copy into place")?;
            fault::point(Point::AfterSwap);
            if place(j, wd)? != Place::Exchanged {
                return Err(MigrateError::SourceReplaced { path: j.source.0.clone() });
            }
        }
        Place::Exchanged => {}
        _ => return Err(MigrateError::SourceReplaced { path: j.source.0.clone() }),
    }
    restore_root_times(j, wd)?;
    sync_swap(j, wd)
}

/// Puts the recorded times back on both roots after an exchange (a moved directory's mtime
/// changes on f2fs, which rewrites its ".." entry; ext4 leaves it). Repeatable, so a resume
/// after a crash right after the exchange does it too.
fn restore_root_times(j: &Journal, wd: &Workdir) -> Result<(), MigrateError> {
    let Some(t) = j.root_times else { return Ok(()) };
    let src = fsx::open_dir_path(&j.source.0).map_err(io_err("opening", &j.source.0))?;
    let stg = fsx::open_dir(&wd.fd, STAGING.as_ref()).map_err(io_err("opening", &wd.staging_path()))?;
    // Only the two trees of this conversion, in either order, get the times.
    let ino = |fd: &OwnedFd, path: &Path| fsx::stat_fd(fd).map(|m| m.ino).map_err(io_err("inspecting", path));
    let pair = (ino(&src, &j.source.0)?, ino(&stg, &wd.staging_path())?);
    if pair != (j.staging_ino, j.source_ino) && pair != (j.source_ino, j.staging_ino) {
        return Err(MigrateError::SourceReplaced { path: j.source.0.clone() });
    }
    for (fd, path) in [(&src, j.source.0.clone()), (&stg, wd.staging_path())] {
        fsx::set_times(fd.as_fd(), t.atime, t.mtime)
            .and_then(|()| fsx::fsync(fd))
            .map_err(io_err("setting the times of", &path))?;
    }
    Ok(())
}

/// Deletes (or wipes, then deletes) the old tree now in the staging slot, on `pool` (rayon's
/// global pool if none). Safe to repeat.
fn dispose(
    host: &dyn Host,
    wd: &Workdir,
    j: &Journal,
    notes: &mut Vec<String>,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), MigrateError> {
    match place(j, wd)? {
        Place::Exchanged => {
            let ctx = Ctx::new(host, &j.source.0, 0, Phase::Disposing, j.files_total + 1, j.bytes_total);
            ctx.tick(true);
            let first = std::sync::atomic::AtomicBool::new(true);
            let on_removed = |m: &fsx::Meta| {
                if m.kind == fsx::Kind::File {
                    ctx.bytes_done.fetch_add(m.data(), std::sync::atomic::Ordering::Relaxed);
                }
                ctx.file_done();
                if first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    fault::point(Point::MidDispose);
                }
                fault::point(Point::DisposeEntry);
                ctx.check_stop().map_err(|_| io::Error::from(io::ErrorKind::Interrupted))
            };
            let remove = || remove::remove_tree(wd.fd.as_fd(), STAGING.as_ref(), j.wipe, &on_removed);
            let removed = match pool {
                Some(p) => p.install(remove),
                None => remove(),
            };
            match removed {
                Ok(()) => {}
                Err(_) if ctx.stopped() => return Err(MigrateError::Interrupted { state: State::Swapped }),
                Err(e) => return Err(io_err("removing the old copy", &wd.staging_path())(e)),
            }
            wd.sync()?;
        }
        Place::CopyOnly => {}
        _ => return Err(MigrateError::SourceReplaced { path: j.source.0.clone() }),
    }
    if j.wipe {
        fault::point(Point::BeforeTrim);
        if let Err(e) = host.trim(&wd.path) {
            notes.push(format!("TRIM of the freed blocks failed ({e}); run fstrim on the filesystem"));
        }
    }
    Ok(())
}

fn outcome(j: &Journal, wd: &Workdir, mut notes: Vec<String>) -> Outcome {
    let backup = (j.method == Method::Copy && matches!(j.step, Step::Swapped { .. })).then(|| wd.staging_path());
    if j.step == Step::Done {
        if j.wipe {
            notes.push(
                "old file contents were overwritten once with zeros and TRIM was requested; on SSDs, \
                 thin-provisioned, copy-on-write or journaled storage this does not guarantee the old \
                 blocks are gone"
                    .into(),
            );
        } else {
            notes.push(
                "the old plaintext was deleted, not overwritten: its blocks stay readable on the raw \
                 device until reused, unless the free space is overwritten (full-disk encryption \
                 keeps them unreadable from the start)"
                    .into(),
            );
        }
    }
    if backup.is_some() {
        notes.push("the old plaintext is kept as a backup until the conversion is committed or rolled back".into());
    }
    if j.outside_links > 0 && matches!(j.step, Step::Done | Step::Swapped { .. }) {
        notes.push(format!(
            "{} file(s) also had hard links outside the directory; their plaintext is still reachable there",
            j.outside_links
        ));
    }
    if j.recopied > 0 {
        notes.push(format!("{} file(s) changed while being copied and were copied again", j.recopied));
    }
    Outcome {
        state: j.step.public(),
        method: j.method,
        token: j.token.clone(),
        files: j.files_total,
        bytes: j.bytes_total,
        backup,
        notes,
        timings: Timings::default(),
    }
}

/// Opens a work dir holding a journal, takes its lock and reads the journal.
fn open_recorded(workdir: &Path) -> Result<(Workdir, journal::WorkdirLock, Journal), MigrateError> {
    let none = || MigrateError::NoConversion { workdir: workdir.to_path_buf() };
    let wd = Workdir::open(workdir, false)?.ok_or_else(none)?;
    let lock = wd.lock()?;
    let j = wd.read()?.ok_or_else(none)?;
    Ok((wd, lock, j))
}

/// What the journal in `workdir` says, or `None` if there is no conversion there.
pub fn status(workdir: &Path) -> Result<Option<StatusView>, MigrateError> {
    let Some(wd) = Workdir::open(workdir, false)? else { return Ok(None) };
    let Some(j) = wd.read()? else { return Ok(None) };
    let backup =
        (j.method == Method::Copy && matches!(j.step, Step::Swapped { disposing: false })).then(|| wd.staging_path());
    Ok(Some(StatusView {
        state: j.step.public(),
        method: j.method,
        source: j.source.0,
        token: j.token,
        started_unix: j.started_unix,
        files_done: j.files_done,
        bytes_done: j.bytes_done,
        files_total: j.files_total,
        bytes_total: j.bytes_total,
        keep_backup: j.keep_backup,
        wipe: j.wipe,
        backup,
        running: matches!(wd.probe_lock(), Err(MigrateError::Busy { .. })),
    }))
}

/// Abandons a conversion before its swap: the staging copy is removed, the original was never
/// touched. After the swap this refuses and points to [`rollback`].
pub fn abort(workdir: &Path, host: &dyn Host) -> Result<Outcome, MigrateError> {
    let (wd, _lock, mut j) = open_recorded(workdir)?;
    match j.step {
        Step::Prepared | Step::Copying { .. } | Step::Copied { .. } | Step::Verified => {
            if place(&j, &wd)? == Place::Exchanged {
                // Crashed right after the swap: record it, and let the user roll back.
                j.keep_backup = true;
                wd.record(&mut j, Step::Swapped { disposing: false }, None)?;
                return Err(MigrateError::WrongState {
                    op: "abort",
                    state: State::Swapped,
                    hint: "the copy was already swapped into place; roll back instead",
                });
            }
            wd.record(&mut j, Step::Aborted, Point::AfterRecordAborted)?;
        }
        Step::Moving | Step::Settling | Step::Moved => {
            if place(&j, &wd)? == Place::Exchanged {
                // Crashed right after the swap: there is no backup to go back to; finishing is the
                // only way on.
                wd.record(&mut j, Step::Swapped { disposing: false }, None)?;
                return Err(MigrateError::WrongState {
                    op: "abort",
                    state: State::Swapped,
                    hint: "the encrypted directory was already swapped into place and a move keeps no backup; run the conversion again to finish it",
                });
            }
            host.ensure_unlocked(&j.token, &wd.staging_path()).map_err(host_err("unlocking the staging directory"))?;
            let (src, stg) = open_pair(&j, &wd)?;
            let ctx = Ctx::new(host, &j.source.0, src.meta.mnt_id, Phase::MovingBack, j.files_total, j.bytes_total);
            ctx.tick(true);
            let inflight = j.inflight.as_ref().map(|f| f.rel.0.clone());
            mv::prepare_back(&ctx, &src.fd, &stg, inflight.as_deref(), j.step != Step::Moving)?;
            rustix::fs::syncfs(&stg).map_err(|e| io_err("syncing", &wd.staging_path())(e.into()))?;
            if let Some(f) = &mut j.inflight {
                f.back = true;
            }
            wd.record(&mut j, Step::MovingBack, Point::AfterRecordMovingBack)?;
            move_back(host, &wd, &mut j)?;
        }
        Step::MovingBack => {
            host.ensure_unlocked(&j.token, &wd.staging_path()).map_err(host_err("unlocking the staging directory"))?;
            move_back(host, &wd, &mut j)?;
        }
        Step::Aborted => {}
        Step::Swapped { .. } | Step::RollingBack | Step::Done | Step::RolledBack => {
            return Err(MigrateError::WrongState {
                op: "abort",
                state: j.step.public(),
                hint: "the copy was already swapped into place; roll back instead (possible only while the backup is kept)",
            })
        }
    }
    let ctx = Ctx::new(host, &j.source.0, 0, Phase::Aborting, 0, 0);
    ctx.tick(true);
    clear_leftovers(&wd, Some(&j), Point::AbortEntry)?;
    Ok(outcome(&j, &wd, Vec::new()))
}

/// Moves every file back into the source, restores the source directories' times and records
/// `Aborted` (the staging directories are removed next, as after any abort).
fn move_back(host: &dyn Host, wd: &Workdir, j: &mut Journal) -> Result<(), MigrateError> {
    let (src, stg) = open_pair(j, wd)?;
    let source = j.source.0.clone();
    let ctx = Ctx::new(host, &source, src.meta.mnt_id, Phase::MovingBack, j.files_total, j.bytes_total);
    ctx.tick(true);
    let moved = mv::Mover::new(&ctx, wd, j, &src.fd, &stg, true).run();
    if let Err(e) = moved {
        return Err(after_pass(wd, j, &ctx, move_err(e)));
    }
    mv::restore_dir_times(&ctx, &src.fd, &stg)?;
    rustix::fs::syncfs(&src.fd).map_err(|e| io_err("syncing", &source)(e.into()))?;
    fault::point(Point::BeforeRecordAbortedMove);
    wd.record(j, Step::Aborted, Point::AfterRecordAborted)
}

/// Undoes a swap whose backup was kept: swaps the original back, then removes the encrypted copy.
pub fn rollback(workdir: &Path, host: &dyn Host) -> Result<Outcome, MigrateError> {
    let (wd, _lock, mut j) = open_recorded(workdir)?;
    if j.method == Method::Move && !j.step.is_final() {
        return Err(MigrateError::WrongState {
            op: "roll back",
            state: j.step.public(),
            hint: "a move keeps no backup; abort it before the swap, or run the conversion again to finish it",
        });
    }
    match j.step {
        Step::Swapped { disposing: false } => {
            wd.record(&mut j, Step::RollingBack, Point::AfterRecordRollingBack)?;
        }
        Step::RollingBack => {}
        Step::RolledBack => return Ok(outcome(&j, &wd, Vec::new())),
        Step::Swapped { disposing: true } | Step::Done => {
            return Err(MigrateError::WrongState {
                op: "roll back",
                state: j.step.public(),
                hint: "the old copy was already (partly) removed; finish the conversion instead",
            })
        }
        Step::Prepared
        | Step::Copying { .. }
        | Step::Copied { .. }
        | Step::Verified
        | Step::Moving
        | Step::Settling
        | Step::Moved
        | Step::MovingBack => {
            return Err(MigrateError::WrongState {
                op: "roll back",
                state: j.step.public(),
                hint: "nothing was swapped yet; abort it instead",
            })
        }
        Step::Aborted => {
            return Err(MigrateError::WrongState {
                op: "roll back",
                state: State::Aborted,
                hint: "it was aborted; the original is in place",
            })
        }
    }
    let ctx = Ctx::new(host, &j.source.0, 0, Phase::RollingBack, 0, 0);
    ctx.tick(true);
    match place(&j, &wd)? {
        Place::Exchanged => {
            exchange(host, &j, &wd, (j.staging_ino, j.source_ino), "swapping the original back")?;
            fault::point(Point::RollbackAfterSwap);
            restore_root_times(&j, &wd)?;
            sync_swap(&j, &wd)?;
        }
        // A crash may have come between the exchange back and putting the times back.
        Place::Original => restore_root_times(&j, &wd)?,
        Place::OriginalOnly => {}
        Place::CopyOnly | Place::Unknown => return Err(MigrateError::SourceReplaced { path: j.source.0.clone() }),
    }
    if place(&j, &wd)? == Place::Original {
        remove_staging(&wd, Point::RollbackEntry)?;
    }
    fault::point(Point::RollbackBeforeRecord);
    wd.record(&mut j, Step::RolledBack, None)?;
    Ok(outcome(&j, &wd, Vec::new()))
}

/// Finishes a conversion kept at `Swapped`: disposes of the old plaintext (wiping it if the
/// conversion was started with `wipe`).
pub fn commit(workdir: &Path, host: &dyn Host) -> Result<Outcome, MigrateError> {
    let (wd, _lock, mut j) = open_recorded(workdir)?;
    match j.step {
        Step::Swapped { disposing: false } => {
            wd.record(&mut j, Step::Swapped { disposing: true }, Point::AfterRecordDisposing)?;
        }
        Step::Swapped { disposing: true } => {}
        Step::Done => return Ok(outcome(&j, &wd, Vec::new())),
        _ => {
            return Err(MigrateError::WrongState {
                op: "commit",
                state: j.step.public(),
                hint: "only a swapped conversion whose backup was kept can be committed",
            })
        }
    }
    let mut notes = Vec::new();
    dispose(host, &wd, &j, &mut notes, None)?;
    wd.record(&mut j, Step::Done, Point::AfterRecordDone)?;
    Ok(outcome(&j, &wd, notes))
}
