//! The engine's one error type: each message names the problem and what to do about it.

use std::io;
use std::path::{Path, PathBuf};

use dirseal_procs::ProcessUse;

use crate::host::HostError;
use crate::state::State;
use crate::types::Direction;

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

/// What to do after an I/O error. A full filesystem (or a used-up quota) is said so: "fix the
/// cause" does not tell the user that the remedy is freeing space there (the path before it names
/// the filesystem; the journal or work dir there is as after a crash).
fn io_next_step(e: &io::Error) -> &'static str {
    use rustix::io::Errno;
    match e.raw_os_error() {
        Some(n) if n == Errno::NOSPC.raw_os_error() || n == Errno::DQUOT.raw_os_error() => {
            "the filesystem it is on is full: free some space on it and run the same command again"
        }
        _ => "fix the cause and run the same command again",
    }
}

/// Bytes as a person reads free space: whole MiB, or GiB with one decimal from 1 GiB up. What is
/// needed (and what to free) is rounded up, so a shortfall is never "0 MiB"; what is free, down.
/// The error keeps the exact bytes.
fn size(bytes: u64, up: bool) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else if up {
        format!("{} MiB", bytes.div_ceil(MIB))
    } else {
        format!("{} MiB", bytes / MIB)
    }
}

fn mib(needed: u64) -> String {
    size(needed, true)
}

fn free(available: u64) -> String {
    size(available, false)
}

/// What must be freed: the difference, rounded up.
fn shortfall(needed: u64, available: u64) -> String {
    size(needed.saturating_sub(available).max(1), true)
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
    #[error("{} is not encrypted; there is nothing to decrypt", path.display())]
    NotEncrypted { path: PathBuf },
    #[error("a `dirseal {running}` of {} is unfinished; finish it first (run `dirseal {running}` on it again to resume, or abort it), then run `dirseal {asked}`", path.display())]
    OtherDirection { path: PathBuf, running: &'static str, asked: &'static str },
    #[error("{} is encrypted on its own; move it out of the directory, convert, then move it back", path.display())]
    EncryptedInside { path: PathBuf },
    #[error("{} is immutable or append-only, which a conversion keeps only on regular files and directories inside the directory; clear the flag (chattr -i -a) and try again, then set it again after the conversion", path.display())]
    ImmutableInside { path: PathBuf },
    #[error("{} is immutable or append-only, which a conversion by moving cannot keep (it takes the originals apart as it goes); free room for a copy and convert with --mode copy, or clear the flag (chattr -i -a), convert, then set it again", path.display())]
    ImmutableInMove { path: PathBuf },
    #[error("{} has the inode flag {flag}, which the conversion cannot keep: {reason}; nothing was written", path.display())]
    FlagNotKept { path: PathBuf, flag: &'static str, reason: String },
    #[error("{} is a mount point inside the directory; unmount it (or move it out) and try again", path.display())]
    MountPointInside { path: PathBuf },
    #[error("not enough free space for a copy of {}: it needs about {}, {} is free; free about {} more and try again", path.display(), mib(*needed), free(*available), shortfall(*needed, *available))]
    NoSpace { path: PathBuf, needed: u64, available: u64 },
    #[error("not enough free space to move {} into the staging directory: it needs about {} (a few chunks, the directories and the files also linked from outside it, which are copied), {} is free; free about {} more and try again", path.display(), mib(*needed), free(*available), shortfall(*needed, *available))]
    NoSpaceToMove { path: PathBuf, needed: u64, available: u64 },
    #[error("not enough free space for a copy of {}: it needs about {}, {} is free, and a move keeps no backup; free about {} more, or convert without keeping a backup", path.display(), mib(*needed), free(*available), shortfall(*needed, *available))]
    NoSpaceForBackup { path: PathBuf, needed: u64, available: u64 },
    #[error("moving {} failed: {source}; the move is paused and nothing is lost: part of the files are already in the conversion's root-only staging directory, each whole in one of the two trees (the journal says which); fix the cause and run the same command again to continue, or abort the conversion to move them back", path.display())]
    MoveFailed { path: PathBuf, source: io::Error },
    #[error("the filesystem ran out of space while moving {}; the move is paused and nothing is lost (every file is whole in one of the two trees, the journal says which); free some space and run the same command again to continue", path.display())]
    MoveOutOfSpace { path: PathBuf },
    #[error("cannot continue moving {}: {reason}; something changed the directory or its staging copy during the move; nothing more was changed (see docs/crash-safety.md to recover by hand)", path.display())]
    MoveInconsistent { path: PathBuf, reason: String },
    #[error("moving {} into the staging directory keeps no backup of the original; run without keeping a backup, or by copying (which needs room for a second copy)", path.display())]
    MoveWithBackup { path: PathBuf },
    #[error("{} cannot be moved while it stays in use: a live conversion copies; convert it live by copying (which needs room for a second copy), or move it when nothing uses it", path.display())]
    LiveMove { path: PathBuf },
    #[error("{} is still in use: {}; the live copy stays caught up and nothing was swapped: close these programs (or log the user out) and finish the conversion again, or abort it", path.display(), list_users(users))]
    StillInUse { path: PathBuf, users: Vec<ProcessUse> },
    #[error("the copy of {} differs from the original ({reason}) although the original did not change since it was copied; nothing was swapped and the original is untouched: abort the conversion and start it again, and check the disk", path.display())]
    CopyCorrupt { path: PathBuf, reason: String },
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
    #[error("{what} {} failed: {source}; {}", path.display(), io_next_step(source))]
    Io { what: &'static str, path: PathBuf, source: io::Error },
    #[error("internal error: {0}; please report this bug")]
    Internal(&'static str),
}

pub(crate) fn io_err<'a>(what: &'static str, path: &'a Path) -> impl Fn(io::Error) -> MigrateError + 'a {
    move |source| MigrateError::Io { what, path: path.to_path_buf(), source }
}

pub(crate) fn host_err(step: &'static str) -> impl Fn(HostError) -> MigrateError {
    move |source| MigrateError::Host { step, source }
}

/// A failure while moving pauses the move, with its own message: the original is no longer
/// untouched (files are in the staging directory), but every file is whole somewhere.
pub(crate) fn move_err(e: MigrateError) -> MigrateError {
    match e {
        MigrateError::OutOfSpace { path } => MigrateError::MoveOutOfSpace { path },
        MigrateError::CopyFailed { path, source } => MigrateError::MoveFailed { path, source },
        e => e,
    }
}

/// A recorded, unfinished conversion is of `journal_source`, not of the `requested` directory.
pub(crate) fn other_source(workdir: &Path, journal_source: &Path, requested: &Path) -> MigrateError {
    MigrateError::OtherSource {
        workdir: workdir.to_path_buf(),
        journal_source: journal_source.to_path_buf(),
        requested: requested.to_path_buf(),
    }
}

/// A recorded, unfinished conversion of `path` goes the other way (`running`) than the one asked
/// for.
pub(crate) fn other_direction(path: &Path, running: Direction) -> MigrateError {
    let asked = match running {
        Direction::Encrypt => Direction::Decrypt,
        Direction::Decrypt => Direction::Encrypt,
    };
    MigrateError::OtherDirection { path: path.to_path_buf(), running: running.command(), asked: asked.command() }
}

#[cfg(test)]
mod tests {
    use super::MigrateError;
    use std::io;
    use std::path::PathBuf;

    /// ENOSPC while writing the journal (the VM harness fills the filesystem at each phase): the
    /// message says to free space on that filesystem, not just "fix the cause".
    #[test]
    fn a_full_filesystem_says_to_free_space() {
        let io_error = |errno| MigrateError::Io {
            what: "writing the journal",
            path: PathBuf::from("/home/.dirseal/convert/1/journal.json"),
            source: io::Error::from_raw_os_error(errno),
        };
        for errno in [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT] {
            let msg = io_error(errno.raw_os_error()).to_string();
            assert!(msg.contains("/home/.dirseal/convert/1/journal.json"), "{msg}");
            assert!(msg.contains("full: free some space on it and run the same command again"), "{msg}");
        }
        let msg = io_error(rustix::io::Errno::IO.raw_os_error()).to_string();
        assert!(msg.ends_with("fix the cause and run the same command again"), "{msg}");
        assert!(!msg.contains("free some space"), "{msg}");
    }

    /// Issue 44: the space a copy needs was said in raw bytes ("about 125829120 bytes needed,
    /// 111149056 available"); it is said in MiB, with what to free.
    #[test]
    fn no_space_says_mib_and_what_to_free() {
        let path = PathBuf::from("/home/alice");
        let msg = MigrateError::NoSpace { path: path.clone(), needed: 120 << 20, available: 106 << 20 }.to_string();
        assert!(msg.contains("it needs about 120 MiB, 106 MiB is free; free about 14 MiB more"), "{msg}");
        assert!(!msg.contains("bytes"), "{msg}");
        let msg =
            MigrateError::NoSpaceToMove { path: path.clone(), needed: (5 << 20) + 1, available: 5 << 20 }.to_string();
        assert!(msg.contains("about 6 MiB") && msg.contains("free about 1 MiB more"), "{msg}");
        let msg = MigrateError::NoSpaceForBackup { path, needed: 20 << 30, available: 12 << 30 }.to_string();
        assert!(msg.contains("about 20.0 GiB, 12.0 GiB is free") && msg.contains("free about 8.0 GiB more"), "{msg}");
    }
}
