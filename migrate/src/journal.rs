//! The work directory (root-only, locked) and the journal it holds.
//!
//! The journal is rewritten whole on every transition: temp file, fsync, rename over, fsync the
//! directory. A reader therefore sees either the old or the new state, never a torn one.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::error::MigrateError;
use crate::fault::{self, Point};
use crate::flags::Attrs;
use crate::fsx;
use crate::fsx::Time;
use crate::state::State;
use crate::types::{Direction, Method, MAX_ROUNDS};

const JOURNAL: &str = "journal.json";
const JOURNAL_TMP: &str = "journal.json.tmp";
const LOCK: &str = "lock";
pub(crate) const STAGING: &str = "staging";

/// Only version 1 parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub(crate) struct Version;

impl TryFrom<u32> for Version {
    type Error = String;
    fn try_from(v: u32) -> Result<Self, String> {
        if v == 1 {
            Ok(Version)
        } else {
            Err(format!("unsupported journal version {v} (this dirseal understands version 1)"))
        }
    }
}

impl From<Version> for u32 {
    fn from(_: Version) -> u32 {
        1
    }
}

/// Paths stored as hex of their bytes: any Linux path round-trips, UTF-8 or not. Each type says
/// what it names in errors and which paths it accepts.
macro_rules! hex_path {
    ($($(#[$doc:meta])* $ty:ident($what:literal, $ok:expr, $rule:literal);)+) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub(crate) struct $ty(pub PathBuf);

        impl TryFrom<String> for $ty {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                let p = unhex_path(&s, $what)?;
                let ok: fn(&Path) -> bool = $ok;
                if !ok(&p) {
                    return Err($rule.into());
                }
                Ok($ty(p))
            }
        }

        impl From<$ty> for String {
            fn from(p: $ty) -> String {
                hex::encode(p.0.as_os_str().as_bytes())
            }
        }
    )+};
}

hex_path! {
    /// The source's absolute path.
    HexPath("source path", |p| p.is_absolute(), "source path must be absolute");
    /// A path relative to the tree's root: non-empty, no NUL, and only normal components (no `/`
    /// at the start, no `.` or `..`), so it can only name an entry beneath the root.
    HexRel(
        "relative path",
        |p| {
            let bytes = p.as_os_str().as_bytes();
            let normal = p.components().all(|c| matches!(c, std::path::Component::Normal(_)));
            !bytes.is_empty() && normal && !bytes.ends_with(b"/")
        },
        "a relative path must be non-empty, without NUL, `.`, `..` or a leading `/`"
    );
}

/// Decodes a hex-stored path (`what` names it in the error).
fn unhex_path(s: &str, what: &str) -> Result<PathBuf, String> {
    let bytes = hex::decode(s).map_err(|e| format!("{what} is not hex: {e}"))?;
    if bytes.contains(&0) {
        return Err(format!("{what} contains NUL"));
    }
    Ok(PathBuf::from(OsStr::from_bytes(&bytes)))
}

/// Bytes stored as hex (xattr names and values).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub(crate) struct HexBytes(pub Vec<u8>);

impl TryFrom<String> for HexBytes {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        hex::decode(&s).map(HexBytes).map_err(|e| format!("bytes are not hex: {e}"))
    }
}

impl From<HexBytes> for String {
    fn from(b: HexBytes) -> String {
        hex::encode(b.0)
    }
}

/// The regular file whose data is split between the trees: the source name holds bytes
/// `[0, size - moved)`, the staging name `[size - moved, size)`. Its metadata is kept here because
/// shrinking or punching a file may drop some of it (file capabilities) and changes its times.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawInFlight")]
pub(crate) struct InFlight {
    pub rel: HexRel,
    pub size: u64,
    pub moved: u64,
    /// Moving back into the source (an abort) rather than into staging.
    pub back: bool,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: Time,
    pub mtime: Time,
    pub xattrs: Vec<(HexBytes, HexBytes)>,
    /// A hard-link group's other names (the same inode as `rel`), linked at the destination
    /// once the data is there, before any original name is removed. Absent for a single file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<HexRel>,
    /// Its inode flags and project id, set on the destination when the data is there. Absent:
    /// none.
    #[serde(default, skip_serializing_if = "Attrs::is_none")]
    pub attrs: Attrs,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInFlight {
    rel: HexRel,
    size: u64,
    moved: u64,
    back: bool,
    perm: u32,
    uid: u32,
    gid: u32,
    atime: Time,
    mtime: Time,
    xattrs: Vec<(HexBytes, HexBytes)>,
    #[serde(default)]
    links: Vec<HexRel>,
    #[serde(default)]
    attrs: Attrs,
}

impl InFlight {
    /// Every name of the file in flight: its own, then its group's others.
    pub(crate) fn names(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.rel.0.as_path()).chain(self.links.iter().map(|l| l.0.as_path()))
    }
}

impl TryFrom<RawInFlight> for InFlight {
    type Error = String;
    fn try_from(r: RawInFlight) -> Result<InFlight, String> {
        if r.moved > r.size {
            return Err("more of the file in flight moved than it holds".into());
        }
        if r.links.iter().any(|l| l == &r.rel) || (1..r.links.len()).any(|i| r.links[i..].contains(&r.links[i - 1])) {
            return Err("the hard-link group in flight names a file twice".into());
        }
        if r.perm & !0o7777 != 0 || r.atime.nsec >= 1_000_000_000 || r.mtime.nsec >= 1_000_000_000 {
            return Err("the metadata of the file in flight is out of range".into());
        }
        Ok(InFlight {
            rel: r.rel,
            size: r.size,
            moved: r.moved,
            back: r.back,
            perm: r.perm,
            uid: r.uid,
            gid: r.gid,
            atime: r.atime,
            mtime: r.mtime,
            xattrs: r.xattrs,
            links: r.links,
            attrs: r.attrs,
        })
    }
}

/// The persisted state. Fields that only exist in some states live inside their variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case", try_from = "RawStep")]
pub(crate) enum Step {
    Prepared,
    /// `round` counts copy passes started after a verification found differences.
    Copying {
        round: u32,
    },
    Copied {
        round: u32,
    },
    Verified,
    /// A live conversion: catch-up pass `pass` (from 1) brings into staging what changed since
    /// pass `pass - 1` (see catchup.rs); while committing (`Live::commit_from`), the last ones.
    CatchingUp {
        pass: u32,
    },
    /// A live conversion stopped before the swap after catch-up pass `pass`.
    CaughtUp {
        pass: u32,
    },
    /// Move mode: files are moving into staging (see mv.rs).
    Moving,
    /// Move mode: every file is in staging; the staging directories get their final metadata.
    Settling,
    /// Move mode: staging holds the whole tree with its metadata, ready for the swap.
    Moved,
    /// Move mode, aborted: files are moving back into the source.
    MovingBack,
    /// `disposing`: removal of the old tree has begun, so rolling back is no longer possible.
    Swapped {
        disposing: bool,
    },
    RollingBack,
    Done,
    Aborted,
    RolledBack,
}

/// A state as written, before it is known to carry exactly the fields of its kind (serde alone
/// lets a unit state such as `done` carry stray fields).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    name: String,
    round: Option<u32>,
    disposing: Option<bool>,
    pass: Option<u32>,
}

impl TryFrom<RawStep> for Step {
    type Error = String;
    fn try_from(r: RawStep) -> Result<Step, String> {
        Ok(match (r.name.as_str(), r.round, r.disposing, r.pass) {
            ("prepared", None, None, None) => Step::Prepared,
            ("copying", Some(round), None, None) => Step::Copying { round },
            ("copied", Some(round), None, None) => Step::Copied { round },
            ("verified", None, None, None) => Step::Verified,
            ("catching_up", None, None, Some(pass)) if pass > 0 => Step::CatchingUp { pass },
            ("caught_up", None, None, Some(pass)) if pass > 0 => Step::CaughtUp { pass },
            ("moving", None, None, None) => Step::Moving,
            ("settling", None, None, None) => Step::Settling,
            ("moved", None, None, None) => Step::Moved,
            ("moving_back", None, None, None) => Step::MovingBack,
            ("swapped", None, Some(disposing), None) => Step::Swapped { disposing },
            ("rolling_back", None, None, None) => Step::RollingBack,
            ("done", None, None, None) => Step::Done,
            ("aborted", None, None, None) => Step::Aborted,
            ("rolled_back", None, None, None) => Step::RolledBack,
            (
                name @ ("prepared" | "copying" | "copied" | "verified" | "catching_up" | "caught_up" | "moving"
                | "settling" | "moved" | "moving_back" | "swapped" | "rolling_back" | "done" | "aborted"
                | "rolled_back"),
                _,
                _,
                _,
            ) => return Err(format!("state {name:?} with missing or extra fields (or a pass out of range)")),
            (name, _, _, _) => return Err(format!("unknown state {name:?}")),
        })
    }
}

impl Step {
    pub(crate) fn public(self) -> State {
        match self {
            Step::Prepared => State::Prepared,
            Step::Copying { .. } => State::Copying,
            Step::Copied { .. } => State::Copied,
            Step::Verified => State::Verified,
            Step::CatchingUp { .. } => State::CatchingUp,
            Step::CaughtUp { .. } => State::CaughtUp,
            Step::Moving | Step::Settling => State::Moving,
            Step::Moved => State::Moved,
            Step::MovingBack => State::MovingBack,
            Step::Swapped { .. } => State::Swapped,
            Step::RollingBack => State::RollingBack,
            Step::Done => State::Done,
            Step::Aborted => State::Aborted,
            Step::RolledBack => State::RolledBack,
        }
    }

    /// Whether the conversion is finished: its public state's [`State::is_final`].
    pub(crate) fn is_final(self) -> bool {
        self.public().is_final()
    }
}

/// The persisted conversion. Parsed through [`RawJournal`], so a journal whose numbers contradict
/// each other never reaches the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawJournal")]
pub(crate) struct Journal {
    pub version: Version,
    pub source: HexPath,
    /// The device at the start, for the record only: device numbers change across reboots
    /// (device-mapper and loop minors are handed out in activation order), so identity checks
    /// compare with the work dir's device now ([`Workdir::dev`]). Named so no one compares it.
    #[serde(rename = "source_dev")]
    pub recorded_dev: u64,
    pub source_ino: u64,
    pub staging_ino: u64,
    pub token: String,
    pub started_unix: u64,
    pub keep_backup: bool,
    pub wipe: bool,
    pub files_total: u64,
    pub bytes_total: u64,
    /// Files in the tree that also have hard links outside it (their plaintext stays there).
    pub outside_links: u64,
    pub files_done: u64,
    pub bytes_done: u64,
    /// Files seen changing while copied, over all runs.
    pub recopied: u64,
    /// The root's times when the copy was verified (absent in journals from before it existed).
    /// f2fs gives a directory moved to another parent a new mtime (it rewrites its ".." entry),
    /// so each exchange puts these back on both roots.
    pub root_times: Option<RootTimes>,
    /// The filesystem's clock when the first copy pass began. A source entry whose ctime is
    /// older has not changed since (ctime cannot be set), so its copy, compared with it when it
    /// was made, still matches: verification checks such entries by metadata alone. Absent in
    /// journals from before it, and dropped when a copy pass resumes after an interruption (the
    /// copies it made may have been lost with the page cache in a power cut): then every file is
    /// compared byte for byte.
    pub copy_started: Option<Time>,
    pub step: Step,
    /// How the data goes into staging (journals written before move mode existed are copies).
    pub method: Method,
    /// Move mode: the one regular file whose data is split between the two trees.
    pub inflight: Option<InFlight>,
    /// Which way the tree goes; written only for a decrypt, so a conversion's journal is what it
    /// was before (and a dirseal without decrypt refuses a decrypt's journal: an unknown field).
    #[serde(skip_serializing_if = "Direction::is_encrypt")]
    pub direction: Direction,
    /// A live conversion's record (absent otherwise, so other journals read as before).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<Live>,
    /// From `Verified` on: the source's immutable and append-only entries (their flags), which
    /// their copies get right before the swap. Absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sealed: Vec<Sealed>,
}

/// An immutable or append-only entry: its path below the root and which of the two flags.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Sealed {
    pub rel: HexRel,
    pub flags: u32,
}

/// Most pass records a live journal keeps (the oldest go first): a conversion caught up again and
/// again must not grow its journal without bound.
pub(crate) const MAX_PASS_RECORDS: usize = 64;

/// What a live conversion ([`crate::Schedule::Live`]) records besides its state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Live {
    /// The filesystem's clock when the verification of the first copy began (after it passed):
    /// a file whose ctime is older did not change since that verification, which proved its
    /// copy (or a later pass copied it again, comparing as it copied), so the verification
    /// before the swap checks it by metadata alone. Absent until that verification passed.
    pub verified_from: Option<Time>,
    /// Committing (run `Now`): the first pass of the commit. Set with its record; cleared when a
    /// commit gives up, back to `CaughtUp`.
    pub commit_from: Option<u32>,
    /// Every pass (the first copy is pass 0), oldest first, at most [`MAX_PASS_RECORDS`].
    pub passes: Vec<PassRecord>,
}

/// One pass of a live conversion: when it ran and what it did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PassRecord {
    pub pass: u32,
    pub started_unix: u64,
    /// Absent while the pass runs (or was interrupted: a resumed pass starts over).
    pub finished_unix: Option<u64>,
    /// The filesystem's clock when the pass (its last attempt) began; set when it finished.
    pub clock: Option<Time>,
    /// Entries (not directories) the pass copied or linked anew, entries of the previous pass
    /// gone from the tree (deleted or renamed), and entries it saw.
    pub copied: u64,
    pub removed: u64,
    pub entries: u64,
}

impl Live {
    /// The last pass that finished.
    pub(crate) fn last_finished(&self) -> Option<&PassRecord> {
        self.passes.iter().rev().find(|p| p.finished_unix.is_some())
    }

    /// Records `pass` as begun (replacing an older record of the same number).
    pub(crate) fn started(&mut self, pass: u32) {
        let now = unix_now();
        self.passes.retain(|p| p.pass != pass);
        self.passes.push(PassRecord {
            pass,
            started_unix: now,
            finished_unix: None,
            clock: None,
            copied: 0,
            removed: 0,
            entries: 0,
        });
        if self.passes.len() > MAX_PASS_RECORDS {
            self.passes.remove(0);
        }
    }
}

/// Seconds since the epoch now (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Access and modification time of a tree's root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RootTimes {
    pub atime: fsx::Time,
    pub mtime: fsx::Time,
}

/// The journal as it is on disk, before its fields are checked against each other.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJournal {
    version: Version,
    source: HexPath,
    source_dev: u64,
    source_ino: u64,
    staging_ino: u64,
    token: String,
    started_unix: u64,
    keep_backup: bool,
    wipe: bool,
    files_total: u64,
    bytes_total: u64,
    outside_links: u64,
    files_done: u64,
    bytes_done: u64,
    recopied: u64,
    #[serde(default)]
    root_times: Option<RootTimes>,
    #[serde(default)]
    copy_started: Option<Time>,
    step: Step,
    #[serde(default)]
    method: Method,
    #[serde(default)]
    inflight: Option<InFlight>,
    #[serde(default)]
    direction: Direction,
    #[serde(default)]
    live: Option<Live>,
    #[serde(default)]
    sealed: Vec<Sealed>,
}

/// Longest token a host may hand out (a policy id is 32 hex digits).
pub(crate) const MAX_TOKEN: usize = 256;

impl TryFrom<RawJournal> for Journal {
    type Error = String;
    fn try_from(r: RawJournal) -> Result<Journal, String> {
        if r.source_ino == r.staging_ino {
            return Err("the source and staging inode numbers are equal".into());
        }
        if r.token.len() > MAX_TOKEN || r.token.chars().any(char::is_control) {
            return Err("the staging token is too long or holds control characters".into());
        }
        if r.files_done > r.files_total || r.bytes_done > r.bytes_total {
            return Err("progress exceeds the recorded totals".into());
        }
        let moving = matches!(r.step, Step::Moving | Step::MovingBack);
        if r.inflight.is_some() && !(moving && r.method == Method::Move) {
            return Err("a file in flight outside a move".into());
        }
        let copy_step = matches!(
            r.step,
            Step::Copying { .. }
                | Step::Copied { .. }
                | Step::Verified
                | Step::CatchingUp { .. }
                | Step::CaughtUp { .. }
        );
        let move_step = matches!(r.step, Step::Moving | Step::Settling | Step::Moved | Step::MovingBack);
        if (copy_step && r.method != Method::Copy) || (move_step && r.method != Method::Move) {
            return Err(format!("state {:?} does not belong to a {} conversion", r.step, r.method));
        }
        if r.method == Method::Move && r.keep_backup {
            return Err("a move keeps no backup".into());
        }
        if r.root_times.is_some_and(|t| t.atime.nsec >= 1_000_000_000 || t.mtime.nsec >= 1_000_000_000) {
            return Err("a root time has 1e9 or more nanoseconds".into());
        }
        if r.copy_started.is_some_and(|t| t.nsec >= 1_000_000_000) {
            return Err("the copy start time has 1e9 or more nanoseconds".into());
        }
        if r.copy_started.is_some() && r.method != Method::Copy {
            return Err("a copy start time in a move".into());
        }
        if r.sealed.iter().any(|s| s.flags == 0 || s.flags & !crate::flags::SEALED != 0) {
            return Err("a sealed entry with flags other than immutable and append-only".into());
        }
        if let Step::Copying { round } | Step::Copied { round } = r.step {
            if round >= MAX_ROUNDS {
                return Err(format!("copy round {round} is beyond the limit of {MAX_ROUNDS}"));
            }
        }
        match (&r.live, r.step) {
            (None, Step::CatchingUp { .. } | Step::CaughtUp { .. }) => {
                return Err("a catch-up state in a conversion that is not live".into())
            }
            (Some(_), _) if r.method != Method::Copy => return Err("a live conversion that moves".into()),
            (Some(l), step) => {
                let bad = |t: &Option<Time>| t.is_some_and(|t| t.nsec >= 1_000_000_000);
                if bad(&l.verified_from) || l.passes.iter().any(|p| bad(&p.clock)) {
                    return Err("a live time has 1e9 or more nanoseconds".into());
                }
                if l.passes.len() > MAX_PASS_RECORDS {
                    return Err("too many pass records".into());
                }
                match (l.commit_from, step) {
                    (Some(from), Step::CatchingUp { pass }) if from > pass || pass - from >= MAX_ROUNDS => {
                        return Err(format!("commit pass {pass} is out of range (the commit began at pass {from})"))
                    }
                    (Some(_), Step::CaughtUp { .. }) => return Err("a commit recorded in a caught-up state".into()),
                    _ => {}
                }
            }
            (None, _) => {}
        }
        Ok(Journal {
            version: r.version,
            source: r.source,
            recorded_dev: r.source_dev,
            source_ino: r.source_ino,
            staging_ino: r.staging_ino,
            token: r.token,
            started_unix: r.started_unix,
            keep_backup: r.keep_backup,
            wipe: r.wipe,
            files_total: r.files_total,
            bytes_total: r.bytes_total,
            outside_links: r.outside_links,
            files_done: r.files_done,
            bytes_done: r.bytes_done,
            recopied: r.recopied,
            root_times: r.root_times,
            copy_started: r.copy_started,
            step: r.step,
            method: r.method,
            inflight: r.inflight,
            direction: r.direction,
            live: r.live,
            sealed: r.sealed,
        })
    }
}

/// The open, checked, root-only work directory.
pub(crate) struct Workdir {
    pub path: PathBuf,
    pub fd: OwnedFd,
}

fn unsafe_wd(path: &Path, reason: impl Into<String>) -> MigrateError {
    MigrateError::UnsafeWorkdir { path: path.to_path_buf(), reason: reason.into() }
}

fn wd_io(path: &Path, what: &'static str, e: io::Error) -> MigrateError {
    MigrateError::Io { what, path: path.to_path_buf(), source: e }
}

/// What [`Workdir::walk`] does about a missing directory on the path.
#[derive(Clone, Copy)]
enum Walk {
    /// Nothing there: no work dir (`None`).
    Find,
    /// Nothing there: fine if it could be created safely.
    Check,
    /// Create it.
    Create,
}

/// Why root must not trust `m` as a directory on its work dir's path: another user owns it, or
/// can rename what is in it (group/world-writable without the sticky bit, which leaves others
/// only their own entries).
fn untrusted(dir: &Path, m: &fsx::Meta) -> Option<String> {
    if m.uid != 0 {
        return Some(format!(
            "{d} belongs to uid {}, who could swap what root keeps there; as root, move it out of the way \
             (`mv {d} {d}.suspect`) so that dirseal creates its own",
            m.uid,
            d = dir.display()
        ));
    }
    if m.perm & 0o022 != 0 && m.perm & 0o1000 == 0 {
        return Some(format!(
            "{d} is writable by others (mode {:o}) without the sticky bit; make it `chmod go-w {d}` or `chmod +t {d}`",
            m.perm,
            d = dir.display()
        ));
    }
    None
}

impl Workdir {
    /// Opens the work dir, creating missing directories (root, 0700) one at a time relative to
    /// their parent's handle, never following a symlink. Every directory from the mount root
    /// holding the work dir down to it must be root-owned and not writable by others (a sticky
    /// one, like a 1777 filesystem root, counts: others cannot rename root's entries in it), and
    /// nothing is created under one that is not: a user who owns or can rename a directory on
    /// the path could otherwise make root's journal and staging copy theirs. The work dir itself
    /// must be root's, mode 700. The handle returned is what every later step goes through.
    pub(crate) fn open(path: &Path, create: bool) -> Result<Option<Workdir>, MigrateError> {
        Workdir::walk(path, if create { Walk::Create } else { Walk::Find })
    }

    /// Refuses a work dir location that [`Workdir::open`] would refuse to create, without
    /// creating anything: the checks of a new conversion come before any question or secret.
    pub(crate) fn check_location(path: &Path) -> Result<(), MigrateError> {
        Workdir::walk(path, Walk::Check).map(|_| ())
    }

    fn walk(path: &Path, how: Walk) -> Result<Option<Workdir>, MigrateError> {
        if !path.is_absolute() {
            return Err(unsafe_wd(path, "it must be an absolute path"));
        }
        let symlinked = || unsafe_wd(path, "it or one of its parent directories is a symbolic link or not a directory");
        let root = Path::new("/");
        let mut fd = fsx::open_dir_path(root).map_err(|e| wd_io(root, "opening", e))?;
        let mut here = root.to_path_buf();
        let mut meta = fsx::stat_fd(&fd).map_err(|e| wd_io(root, "inspecting", e))?;
        // The first reason not to trust the path, since the last mount root.
        let mut flaw = untrusted(root, &meta);
        for c in path.components().skip(1) {
            let std::path::Component::Normal(name) = c else {
                return Err(unsafe_wd(path, "it must not contain `.` or `..`"));
            };
            let next = here.join(name);
            let child = match fsx::open_dir(&fd, name) {
                Ok(child) => child,
                Err(e) if fsx::is_errno(&e, Errno::NOENT) => {
                    match (how, &flaw) {
                        (Walk::Find, _) | (Walk::Check, None) => return Ok(None),
                        (_, Some(reason)) => return Err(unsafe_wd(path, reason.as_str())),
                        (Walk::Create, None) => {}
                    }
                    match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o700)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(wd_io(&next, "creating", e.into())),
                    }
                    // The new entry must survive a crash before anything inside it is trusted to.
                    fsx::fsync(&fd).map_err(|e| wd_io(&here, "syncing", e))?;
                    fsx::open_dir(&fd, name).map_err(|e| wd_io(&next, "opening", e))?
                }
                Err(e) if fsx::is_redirected(&e) => return Err(symlinked()),
                Err(e) => return Err(wd_io(&next, "opening", e)),
            };
            meta = fsx::stat_fd(&child).map_err(|e| wd_io(&next, "inspecting", e))?;
            if meta.mount_root {
                // A mount root cannot be renamed: what lies above it no longer matters.
                flaw = None;
            }
            flaw = flaw.or_else(|| untrusted(&next, &meta));
            (fd, here) = (child, next);
        }
        if let Some(reason) = flaw {
            return Err(unsafe_wd(path, reason));
        }
        if meta.uid != 0 || meta.perm != 0o700 {
            return Err(unsafe_wd(
                path,
                format!("it is owned by uid {} with mode {:o}, expected uid 0 and mode 700", meta.uid, meta.perm),
            ));
        }
        Ok(Some(Workdir { path: path.to_path_buf(), fd }))
    }

    /// Takes the exclusive conversion lock and writes this process's id into the lock file (only
    /// to name the holder in a refusal). The lock is an `flock`: the kernel drops it when its
    /// holder dies, so a crashed run never blocks the next one, whatever pid the file still names.
    pub(crate) fn lock(&self) -> Result<WorkdirLock, MigrateError> {
        let lpath = self.path.join(LOCK);
        let fd = rustix::fs::openat(
            &self.fd,
            LOCK,
            OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| wd_io(&lpath, "opening the lock file", e.into()))?;
        let key = self.key()?;
        self.acquire(&fd, FlockOperation::NonBlockingLockExclusive, key)?;
        HELD.lock().map_err(|_| MigrateError::Internal("lock registry poisoned"))?.push(key);
        let guard = WorkdirLock { _fd: fd, key };
        let pid = format!("{}\n", std::process::id());
        rustix::fs::ftruncate(&guard._fd, 0).map_err(|e| wd_io(&lpath, "writing the lock file", e.into()))?;
        rustix::io::pwrite(&guard._fd, pid.as_bytes(), 0)
            .map_err(|e| wd_io(&lpath, "writing the lock file", e.into()))?;
        Ok(guard)
    }

    /// Refuses with [`MigrateError::Busy`] if a live process holds the lock; takes nothing.
    pub(crate) fn probe_lock(&self) -> Result<(), MigrateError> {
        let fd = match rustix::fs::openat(
            &self.fd,
            LOCK,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(wd_io(&self.path.join(LOCK), "opening the lock file", e.into())),
        };
        self.acquire(&fd, FlockOperation::NonBlockingLockShared, self.key()?)
    }

    /// The device the work dir is on now. The source shares it (the work dir sits on the source's
    /// filesystem, and the swap is a rename within it).
    pub(crate) fn dev(&self) -> Result<u64, MigrateError> {
        Ok(self.key()?.0)
    }

    fn key(&self) -> Result<(u64, u64), MigrateError> {
        let m = fsx::stat_fd(&self.fd).map_err(|e| wd_io(&self.path, "inspecting", e))?;
        Ok((m.dev, m.ino))
    }

    /// `flock` without waiting, except for one case: the lock file names this very process and
    /// no thread of it holds the lock. Then the holder is a child of ours between `fork` and
    /// `exec` (say, another thread starting a command), which shares our open files for that
    /// moment; it lets go as soon as it runs its program, so wait for that, briefly.
    fn acquire(&self, fd: &OwnedFd, op: FlockOperation, key: (u64, u64)) -> Result<(), MigrateError> {
        let busy = |fd: &OwnedFd| MigrateError::Busy { workdir: self.path.clone(), pid: holder(fd) };
        let mine = || HELD.lock().map(|h| h.contains(&key)).unwrap_or(true);
        for _ in 0..200 {
            match rustix::fs::flock(fd, op) {
                Ok(()) => return Ok(()),
                Err(Errno::WOULDBLOCK) if holder(fd) == Some(std::process::id()) && !mine() => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(Errno::WOULDBLOCK) => return Err(busy(fd)),
                Err(e) => return Err(wd_io(&self.path.join(LOCK), "locking", e.into())),
            }
        }
        Err(busy(fd))
    }

    pub(crate) fn staging_path(&self) -> PathBuf {
        self.path.join(STAGING)
    }

    pub(crate) fn read(&self) -> Result<Option<Journal>, MigrateError> {
        read_journal(&self.fd, &self.path)
    }

    /// Durably replaces the journal: when this returns, a crash leaves exactly `j` on disk.
    pub(crate) fn write(&self, j: &Journal) -> Result<(), MigrateError> {
        let jpath = self.path.join(JOURNAL);
        let data =
            serde_json::to_vec_pretty(j).map_err(|e| wd_io(&jpath, "writing the journal", io::Error::other(e)))?;
        self.replace(JOURNAL, JOURNAL_TMP, &data, "writing the journal")
    }

    /// Durably replaces the work dir's file `name` with `data` (through `tmp`: a crash leaves
    /// the old file or the new one, whole).
    pub(crate) fn replace(&self, name: &str, tmp: &str, data: &[u8], what: &'static str) -> Result<(), MigrateError> {
        let jpath = self.path.join(name);
        let err = |e: io::Error| wd_io(&jpath, what, e);
        match rustix::fs::unlinkat(&self.fd, tmp, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(err(e.into())),
        }
        let fd = rustix::fs::openat(
            &self.fd,
            tmp,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| err(e.into()))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(data).map_err(err)?;
        f.sync_all().map_err(err)?;
        drop(f);
        rustix::fs::renameat(&self.fd, tmp, &self.fd, name).map_err(|e| err(e.into()))?;
        fsx::fsync(&self.fd).map_err(err)?;
        Ok(())
    }

    /// The work dir's file `name`, up to `limit` bytes, or `None` if there is none.
    pub(crate) fn read_file(&self, name: &str, limit: u64) -> Result<Option<Vec<u8>>, MigrateError> {
        let path = self.path.join(name);
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(wd_io(&path, "reading", e.into())),
        };
        let mut data = Vec::new();
        std::fs::File::from(fd).take(limit).read_to_end(&mut data).map_err(|e| wd_io(&path, "reading", e))?;
        Ok(Some(data))
    }

    /// Removes the work dir's entries whose names `which` picks (synced). Repeatable.
    pub(crate) fn remove_files(&self, which: &dyn Fn(&[u8]) -> bool) -> Result<(), MigrateError> {
        let names = fsx::list_names(&self.fd).map_err(|e| wd_io(&self.path, "listing", e))?;
        let mut any = false;
        for n in names.iter().filter(|n| which(n.as_bytes())) {
            match rustix::fs::unlinkat(&self.fd, n.as_os_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => any = true,
                Err(e) => return Err(wd_io(&self.path.join(n), "removing", e.into())),
            }
        }
        if any {
            self.sync()?;
        }
        Ok(())
    }

    /// Records a transition: sets `j.step`, then [`Workdir::save`]s.
    pub(crate) fn record(
        &self,
        j: &mut Journal,
        step: Step,
        then: impl Into<Option<Point>>,
    ) -> Result<(), MigrateError> {
        j.step = step;
        self.save(j, then)
    }

    /// Writes the journal durably, then passes the fault point that stands for a crash right
    /// after this write: every record of the engine goes through here.
    pub(crate) fn save(&self, j: &Journal, then: impl Into<Option<Point>>) -> Result<(), MigrateError> {
        self.write(j)?;
        if let Some(p) = then.into() {
            fault::point(p);
        }
        Ok(())
    }

    pub(crate) fn sync(&self) -> Result<(), MigrateError> {
        fsx::fsync(&self.fd).map_err(|e| wd_io(&self.path, "syncing", e))
    }

    /// The filesystem's clock now, as it stamps a change: the ctime the work dir gets from
    /// having its times set to now.
    pub(crate) fn clock(&self) -> Result<Time, MigrateError> {
        let now = rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW };
        rustix::fs::futimens(&self.fd, &rustix::fs::Timestamps { last_access: now, last_modification: now })
            .map_err(|e| wd_io(&self.path, "reading the clock of", e.into()))?;
        Ok(fsx::stat_fd(&self.fd).map_err(|e| wd_io(&self.path, "reading the clock of", e))?.ctime)
    }

    pub(crate) fn staging_meta(&self) -> Result<Option<fsx::Meta>, MigrateError> {
        fsx::stat_at(&self.fd, OsStr::new(STAGING)).map_err(|e| wd_io(&self.staging_path(), "inspecting", e))
    }
}

/// Work dirs (device, inode) locked by some thread of this process.
static HELD: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

/// The conversion lock; released when dropped (or when the process dies).
pub(crate) struct WorkdirLock {
    _fd: OwnedFd,
    key: (u64, u64),
}

impl Drop for WorkdirLock {
    fn drop(&mut self) {
        if let Ok(mut h) = HELD.lock() {
            h.retain(|k| *k != self.key);
        }
    }
}

/// The pid a lock holder wrote into the lock file, if readable.
fn holder(fd: &OwnedFd) -> Option<u32> {
    let mut buf = [0u8; 16];
    let n = rustix::io::pread(fd, &mut buf[..], 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// Reads the journal of a work dir without locking (atomic renames make any read consistent).
pub(crate) fn read_journal(dir: impl AsFd, wd: &Path) -> Result<Option<Journal>, MigrateError> {
    let jpath = wd.join(JOURNAL);
    let fd = match rustix::fs::openat(dir, JOURNAL, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
    {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(wd_io(&jpath, "reading the journal", e.into())),
    };
    let mut data = Vec::new();
    std::fs::File::from(fd)
        .take(1 << 20)
        .read_to_end(&mut data)
        .map_err(|e| wd_io(&jpath, "reading the journal", e))?;
    serde_json::from_slice(&data).map(Some).map_err(|e| MigrateError::CorruptJournal {
        path: jpath,
        workdir: wd.to_path_buf(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(step: Step) -> Journal {
        Journal {
            version: Version,
            source: HexPath(PathBuf::from(OsStr::from_bytes(b"/home/b\xffd"))),
            recorded_dev: 2049,
            source_ino: 12,
            staging_ino: 13,
            token: "0123456789abcdef0123456789abcdef".into(),
            started_unix: 1_700_000_000,
            keep_backup: true,
            wipe: false,
            files_total: 10,
            bytes_total: 100,
            outside_links: 0,
            files_done: 3,
            bytes_done: 30,
            recopied: 1,
            root_times: Some(RootTimes {
                atime: fsx::Time { sec: 1_600_000_000, nsec: 5 },
                mtime: fsx::Time { sec: -3, nsec: 999_999_999 },
            }),
            copy_started: Some(fsx::Time { sec: 1_700_000_000, nsec: 123 }),
            step,
            method: Method::Copy,
            inflight: None,
            direction: Direction::Encrypt,
            live: None,
            sealed: Vec::new(),
        }
    }

    #[test]
    fn a_decrypt_journal_names_its_direction_and_a_conversion_journal_does_not() {
        let j = sample(Step::Copying { round: 0 });
        let text = serde_json::to_string(&j).unwrap();
        assert!(!text.contains("direction"), "a conversion's journal is what it was before decrypt: {text}");
        let d = Journal { direction: Direction::Decrypt, ..moving(Step::Moving) };
        let text = serde_json::to_string(&d).unwrap();
        assert!(text.contains(r#""direction":"decrypt""#), "{text}");
        assert_eq!(serde_json::from_str::<Journal>(&text).unwrap(), d);
        let bad = text.replace(r#""direction":"decrypt""#, r#""direction":"sideways""#);
        assert!(serde_json::from_str::<Journal>(&bad).is_err());
    }

    fn moving(step: Step) -> Journal {
        let t = Time { sec: 1_700_000_000, nsec: 5 };
        Journal {
            keep_backup: false,
            method: Method::Move,
            inflight: matches!(step, Step::Moving | Step::MovingBack).then(|| InFlight {
                rel: HexRel(PathBuf::from(OsStr::from_bytes(b"games/big\xff.pak"))),
                size: 600 << 20,
                moved: 64 << 20,
                back: step == Step::MovingBack,
                perm: 0o4755,
                uid: 1000,
                gid: 1000,
                atime: t,
                mtime: t,
                xattrs: vec![(HexBytes(b"user.a".to_vec()), HexBytes(vec![0, 1, 255]))],
                links: Vec::new(),
                attrs: Attrs { flags: 0x40, project: 7 },
            }),
            copy_started: None,
            ..sample(step)
        }
    }

    #[test]
    fn every_state_round_trips_and_the_format_is_stable() {
        for step in [
            Step::Prepared,
            Step::Copying { round: 2 },
            Step::Copied { round: 0 },
            Step::Verified,
            Step::Swapped { disposing: false },
            Step::Swapped { disposing: true },
            Step::RollingBack,
            Step::Done,
            Step::Aborted,
            Step::RolledBack,
        ] {
            let j = sample(step);
            let text = serde_json::to_string(&j).unwrap();
            assert_eq!(serde_json::from_str::<Journal>(&text).unwrap(), j);
        }
        for step in [Step::Prepared, Step::Moving, Step::Settling, Step::Moved, Step::MovingBack, Step::Done] {
            let j = moving(step);
            let text = serde_json::to_string(&j).unwrap();
            assert_eq!(serde_json::from_str::<Journal>(&text).unwrap(), j);
        }
        // A journal from before move mode (no method, no file in flight) is a copy.
        let mut old = serde_json::to_value(sample(Step::Copied { round: 1 })).unwrap();
        old.as_object_mut().unwrap().remove("method");
        old.as_object_mut().unwrap().remove("inflight");
        assert_eq!(serde_json::from_value::<Journal>(old).unwrap(), sample(Step::Copied { round: 1 }));
        // docs/crash-safety.md shows this layout; old journals must keep parsing.
        let v: serde_json::Value = serde_json::to_value(sample(Step::Swapped { disposing: true })).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["source"], "2f686f6d652f62ff64");
        assert_eq!(v["step"], serde_json::json!({"name": "swapped", "disposing": true}));
        assert_eq!(v["root_times"]["mtime"], serde_json::json!({"sec": -3, "nsec": 999_999_999}));
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("root_times");
        assert_eq!(serde_json::from_value::<Journal>(old).unwrap().root_times, None, "journals from before root_times");
        assert_eq!(v["copy_started"], serde_json::json!({"sec": 1_700_000_000, "nsec": 123}));
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("copy_started");
        assert_eq!(serde_json::from_value::<Journal>(old).unwrap().copy_started, None, "journals from before it");
    }

    fn live(step: Step) -> Journal {
        let mut l = Live { verified_from: Some(Time { sec: 1_700_000_001, nsec: 7 }), ..Live::default() };
        l.started(0);
        l.passes[0].finished_unix = Some(1_700_000_100);
        l.passes[0].clock = Some(Time { sec: 1_700_000_000, nsec: 9 });
        l.started(1);
        if let Step::CatchingUp { pass } = step {
            l.commit_from = Some(pass);
        }
        Journal { live: Some(l), ..sample(step) }
    }

    #[test]
    fn live_states_round_trip_and_bad_ones_do_not_parse() {
        for step in [Step::CatchingUp { pass: 3 }, Step::CaughtUp { pass: 1 }, Step::Copied { round: 0 }, Step::Done] {
            let j = live(step);
            let text = serde_json::to_string(&j).unwrap();
            assert_eq!(serde_json::from_str::<Journal>(&text).unwrap(), j);
        }
        let v = serde_json::to_value(live(Step::CaughtUp { pass: 2 })).unwrap();
        assert_eq!(v["step"], serde_json::json!({"name": "caught_up", "pass": 2}));
        assert_eq!(v["live"]["passes"][0]["pass"], 0);
        // Other journals do not name it.
        assert!(!serde_json::to_string(&sample(Step::Verified)).unwrap().contains("live"));
        let bad = |f: &dyn Fn(&mut serde_json::Value)| parse_error(&v, f);
        assert!(bad(&|v| v["step"]["pass"] = 0.into()).contains("out of range"));
        assert!(bad(&|v| v["step"] = serde_json::json!({"name": "caught_up"})).contains("missing or extra"));
        assert!(bad(&|v| v["live"] = serde_json::Value::Null).contains("not live"));
        assert!(bad(&|v| v["live"]["commit_from"] = 1.into()).contains("caught-up"));
        assert!(bad(&|v| v["live"]["surprise"] = 1.into()).contains("unknown field"));
        assert!(bad(&|v| v["live"]["passes"][0]["clock"]["nsec"] = 1_000_000_000u64.into()).contains("nanoseconds"));
        let c = serde_json::to_value(live(Step::CatchingUp { pass: 3 })).unwrap();
        let bad = |f: &dyn Fn(&mut serde_json::Value)| parse_error(&c, f);
        assert!(bad(&|v| v["live"]["commit_from"] = 4.into()).contains("out of range"));
        assert!(bad(&|v| v["step"]["pass"] = (3 + MAX_ROUNDS).into()).contains("out of range"));
    }

    /// The error of parsing `good` changed by `f` (which must make it unparsable).
    fn parse_error(good: &serde_json::Value, f: &dyn Fn(&mut serde_json::Value)) -> String {
        let mut v = good.clone();
        f(&mut v);
        match serde_json::from_value::<Journal>(v.clone()) {
            Ok(_) => panic!("parsed: {v}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_states_do_not_parse() {
        let good = serde_json::to_value(sample(Step::Copying { round: 0 })).unwrap();
        let bad = |f: &dyn Fn(&mut serde_json::Value)| parse_error(&good, f);
        assert!(bad(&|v| v["source"] = "686f6d65".into()).contains("absolute"));
        assert!(bad(&|v| v["source"] = "2f6100".into()).contains("NUL"));
        assert!(bad(&|v| v["source"] = "zz".into()).contains("hex"));
        assert!(bad(&|v| v["version"] = 7.into()).contains("version 7"));
        assert!(bad(&|v| v["staging_ino"] = 12.into()).contains("inode"));
        assert!(bad(&|v| v["bytes_done"] = 101.into()).contains("exceeds"));
        assert!(bad(&|v| v["root_times"]["atime"]["nsec"] = 1_000_000_000.into()).contains("nanoseconds"));
        assert!(bad(&|v| v["copy_started"]["nsec"] = 1_000_000_000.into()).contains("nanoseconds"));
        assert!(bad(&|v| v["token"] = "a\nb".into()).contains("control"));
        assert!(bad(&|v| v["token"] = "x".repeat(MAX_TOKEN + 1).into()).contains("too long"));
        assert!(bad(&|v| v["step"] = serde_json::json!({"name": "copied", "round": 3})).contains("beyond"));
        assert!(bad(&|v| v["step"] = serde_json::json!({"name": "swapped"})).contains("missing or extra"));
        assert!(bad(&|v| v["step"] = serde_json::json!({"name": "done", "round": 1})).contains("missing or extra"));
        assert!(bad(&|v| v["step"] = serde_json::json!({"name": "done", "x": 1})).contains("unknown field"));
        assert!(bad(&|v| v["step"] = serde_json::json!({"name": "flying"})).contains("unknown state"));
        assert!(bad(&|v| v["surprise"] = 1.into()).contains("unknown field"));
        assert!(bad(&|v| v["step"] = serde_json::json!({"name": "moving"})).contains("does not belong"));
        let good = serde_json::to_value(moving(Step::Moving)).unwrap();
        let bad = |f: &dyn Fn(&mut serde_json::Value)| parse_error(&good, f);
        assert!(bad(&|v| v["inflight"]["moved"] = (601u64 << 20).into()).contains("more of the file"));
        assert!(bad(&|v| v["inflight"]["rel"] = hex::encode("a/../../etc").into()).contains("relative path"));
        assert!(bad(&|v| v["inflight"]["rel"] = hex::encode("/etc/shadow").into()).contains("relative path"));
        assert!(bad(&|v| v["inflight"]["rel"] = "".into()).contains("relative path"));
        assert!(bad(&|v| v["inflight"]["perm"] = 0o170000.into()).contains("out of range"));
        assert!(bad(&|v| v["step"] = serde_json::json!({"name": "moved"})).contains("outside a move"));
        assert!(bad(&|v| v["keep_backup"] = true.into()).contains("no backup"));
        assert!(bad(&|v| v["method"] = "teleport".into()).contains("unknown variant"));
        assert!(bad(&|v| v["copy_started"] = serde_json::json!({"sec": 1, "nsec": 0})).contains("in a move"));
    }
}
