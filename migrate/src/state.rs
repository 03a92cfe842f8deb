//! The public view of a conversion: its [`State`], the [`Outcome`] of an operation, [`StatusView`].

use std::fmt;
use std::path::PathBuf;

use crate::types::{Direction, Method};

/// The recorded state of a conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Prepared,
    Copying,
    Copied,
    Verified,
    /// A live conversion: a catch-up pass brings what changed in the directory meanwhile into
    /// the copy (or, committing, the last one before the swap).
    CatchingUp,
    /// A live conversion stopped before the swap, its copy up to date as of its last pass: run it
    /// again `Now` (when nothing uses the directory) to swap, `Live` to catch up again, or abort.
    CaughtUp,
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
                | State::CatchingUp
                | State::CaughtUp
                | State::Moving
                | State::Moved
                | State::MovingBack
        )
    }

    /// Whether the conversion is finished (done, aborted or rolled back): nothing is left to
    /// resume, roll back or commit, and a new conversion may replace its journal. The one
    /// definition of "finished", for the engine and its callers alike.
    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Aborted | State::RolledBack)
    }

    /// Whether [`abort`] can put the directory back as it was: every state before the swap (a
    /// move's files are moved back).
    pub fn abortable(self) -> bool {
        self.before_swap()
    }
}

/// A state in JSON: the words `Display` gives ("moving back"), the ones status lines show.
fn as_text<S: serde::Serializer>(state: &State, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(state)
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Prepared => "prepared",
            State::Copying => "copying",
            State::Copied => "copied",
            State::Verified => "verified",
            State::CatchingUp => "catching up",
            State::CaughtUp => "caught up",
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
    /// Entries in the tree (below its root) and bytes of regular file data: what a copy or a move
    /// puts into staging (a sparse file's allocated data, not its size; see [`Census::data`]).
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
/// `swap`, `dispose` (removing the old tree, with its sync). A live conversion adds `catch-up`
/// (its catch-up passes) and, for the run that finishes it, `commit`: the whole last step, from
/// the check that nothing uses the directory to the end of the run (it overlaps the others).
/// For benchmarks and `--json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timings(Vec<(&'static str, std::time::Duration)>);

impl Timings {
    pub fn parts(&self) -> &[(&'static str, std::time::Duration)] {
        &self.0
    }

    pub(crate) fn add(&mut self, part: &'static str, d: std::time::Duration) {
        match self.0.iter_mut().find(|(p, _)| *p == part) {
            Some((_, t)) => *t += d,
            None => self.0.push((part, d)),
        }
    }

    /// Runs `f`, counting its wall time as `part`.
    pub(crate) fn time<T>(&mut self, part: &'static str, f: impl FnOnce() -> T) -> T {
        let t = std::time::Instant::now();
        let r = f();
        self.add(part, t.elapsed());
        r
    }
}

/// What the journal says, for `dirseal convert --status`-like displays. Its JSON (field names as
/// docs/formats.md gives them for `convert --status --json`) is the one shape every front end
/// shows a recorded conversion in.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StatusView {
    #[serde(serialize_with = "as_text")]
    pub state: State,
    pub method: Method,
    #[serde(rename = "path")]
    pub source: PathBuf,
    /// The host's token: for a conversion, the new policy's id.
    #[serde(rename = "policy")]
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
    /// Where the files a move has moved so far are, while it is under way or interrupted: the
    /// staging directory in the work dir (encrypted when converting).
    pub moved_to: Option<PathBuf>,
    /// A live process holds the conversion's lock: it is running now, not interrupted.
    pub running: bool,
    /// Encrypting (`convert`) or decrypting.
    pub direction: Direction,
    /// Whether the conversion was started live ([`Schedule::Live`](crate::Schedule::Live)).
    pub live: bool,
    /// A live conversion's catch-up passes finished so far (the first copy not counted).
    pub passes: u32,
}
