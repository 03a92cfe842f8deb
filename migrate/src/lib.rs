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
//! Live ([`Schedule::Live`], the directory in use; copying only): `Prepared → Copying → Copied →
//! CatchingUp… → CaughtUp`, stopped there; run again `Now` (nothing uses the directory):
//! `CaughtUp → CatchingUp → Copied → Verified → Swapped → Done` (see catchup.rs).
//!
//! The same machine runs the other way ([`Direction::Decrypt`]): the source is the unlocked root
//! of an encrypted tree, the staging directory stays plain (and root-only, in the work dir) until
//! the swap; the host's token then names the source's key, which a resume must load again.
//!
//! Where things are (one state of the journal, one function in machine.rs):
//! - plan.rs: the [`Request`], [`preflight`]'s checks and [`Census`], and the choice of method;
//! - machine.rs: [`convert`] and [`start`]: the step table and one function per step;
//! - finish.rs: [`status`], [`abort`] (with moving back), [`rollback`], [`commit`];
//! - trees.rs: the source and staging trees: opening them, where they are, the swap;
//! - copy.rs, verify.rs, mv.rs, remove.rs, scan.rs: the passes over a tree; fsx.rs the syscalls;
//!   linkmap.rs their maps of hard-linked inodes (bounded memory: past a threshold, on disk);
//!   catchup.rs what a live conversion's catch-up passes decide by (identities, manifests);
//!   pass.rs what the passes share (the worker pool, the record of a pass that stopped early);
//! - journal.rs: the journal and the work dir, and [`fault`] the crash points;
//! - types.rs, host.rs, state.rs, error.rs: the public types the caller sees.
//!
//! The modules import each other without circles (tests/modules.rs checks it): types.rs is at the
//! bottom, machine.rs at the top (docs/architecture.md lists the layers).
// `unsafe` only in sys.rs (two ioctls rustix does not wrap); the workspace denies it elsewhere.
#![deny(unsafe_code)]

mod catchup;
mod copy;
mod ctx;
mod error;
pub mod fault;
mod finish;
mod flags;
mod fsx;
mod host;
mod journal;
mod linkmap;
mod machine;
mod mv;
mod pass;
mod plan;
mod remove;
mod scan;
mod state;
mod sys;
mod trees;
mod types;
mod verify;
mod walk;

pub use dirseal_procs::{find_users, ProcessUse};
pub use error::MigrateError;
pub use finish::{abort, commit, rollback, status};
pub use flags::names as flag_names;
pub use host::{Host, HostError, Phase, Progress};
pub use linkmap::links_spilled;
pub use machine::{convert, start};
pub use plan::{preflight, Census, Plan, Request};
pub use scan::census_dirs_listed;
pub use state::{Outcome, State, StatusView, Timings};
pub use trees::staging_path;
pub use types::{Direction, Method, Mode, Schedule, UnknownWord};
