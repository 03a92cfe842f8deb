//! Live conversions ([`Schedule::Live`](crate::Schedule::Live)): the directory stays in use while
//! it is copied, so after the first copy, catch-up passes bring into staging what changed
//! meanwhile, until a pass finds little to do; the conversion then stops `CaughtUp`, before the
//! swap. A later run when nothing uses the directory makes one more pass, verifies and swaps
//! (machine.rs runs the steps; this module is what a pass decides by).
//!
//! Whether an entry changed is decided by its identity, never by its mtime (which its owner can
//! set): inode number, ctime with nanoseconds (which nobody can set, and which every change of
//! content, owner, mode, xattrs or link count moves), size and type. Each pass writes the
//! identity of every non-directory entry, read *before* its data was, into a manifest in the
//! work dir (`manifest.<pass>`, replaced atomically and synced after the pass's `syncfs`); the
//! next pass keeps a staging entry only if the source entry at that path still has that
//! identity. An entry whose ctime is not older than the clock at the start of its pass is left
//! out of the manifest: timestamps are coarse, and a change in the same tick could keep its
//! ctime, so such an entry is copied again next pass. Directories are walked every pass and
//! given their metadata again; renames, deletions, type changes and new hard links show as
//! paths with a new identity or none (the copy pass removes what the source no longer has). A
//! file that keeps changing while a pass copies it is left to the next pass (in use, it may
//! never be still), not an error.
//!
//! Why an identity read before the data is enough while the directory is in use: a `write`
//! stamps the ctime when it begins and holds the inode lock until its data is in; the copy's
//! first `SEEK_HOLE`/`SEEK_DATA` (fsx::copy_sparse) takes that lock shared on ext4 and f2fs, so
//! a write under way at the stat ends before the copy reads, and a later one gets a ctime not
//! older than the pass's clock. A page of a shared writable mapping moves the ctime only when a
//! write faults on it, so each pass first writes the source's dirty pages out (machine.rs),
//! which write-protects them. Not covered: direct I/O overwrites (they take the lock shared).
//!
//! A pass killed half way is run again against the same previous manifest: what the killed
//! attempt copied has an identity the previous manifest does not have, so it is copied again
//! (its copy may not have reached the disk). A manifest that is missing or unreadable, or a clock
//! that went back since the previous pass, makes the pass copy everything again.
//!
//! The device number is not part of the identity: every entry is on the source's mount (others
//! are refused), and device numbers change across reboots.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use std::os::unix::ffi::OsStrExt;

use crate::copy::Catchup;
use crate::fsx::{Kind, Meta, Time};
use crate::journal::Workdir;
use crate::MigrateError;

/// Most catch-up passes one live run makes before it stops `CaughtUp` anyway (a directory that
/// keeps changing a lot is caught up as well as it can be; the commit's last pass does the rest).
pub(crate) const MAX_LIVE_PASSES: u32 = 5;

/// A pass that copied and removed at most this many entries (or 1 % of the tree, if more) changed
/// little: the copy has caught up.
const LITTLE: u64 = 32;

const PREFIX: &str = "manifest.";
const TMP: &str = "manifest.tmp";
const MAGIC: &[u8] = b"dirseal-manifest-1\n";
/// Largest manifest read (about 8 million entries with short paths).
const MAX_BYTES: u64 = 1 << 30;

fn name(pass: u32) -> String {
    format!("{PREFIX}{pass}")
}

/// What decides whether an entry changed (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ident {
    ino: u64,
    ctime: Time,
    size: u64,
    kind: u8,
}

impl Ident {
    pub(crate) fn of(m: &Meta) -> Ident {
        let kind = match m.kind {
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
            Kind::Fifo => 4,
            Kind::Socket => 5,
            Kind::CharDev => 6,
            Kind::BlockDev => 7,
        };
        Ident { ino: m.ino, ctime: m.ctime, size: m.size, kind }
    }
}

/// The identities a finished pass recorded, by path below the root.
#[derive(Default)]
pub(crate) struct Manifest(HashMap<PathBuf, Ident>);

impl Manifest {
    /// The manifest of `pass`, or `None` if it is missing or unreadable (then everything is
    /// copied again, which is always safe).
    pub(crate) fn load(wd: &Workdir, pass: u32) -> Result<Option<Manifest>, MigrateError> {
        Ok(wd.read_file(&name(pass), MAX_BYTES)?.and_then(|d| decode(&d)))
    }

    /// Whether the entry at `rel`, as `m` describes it now, has the recorded identity.
    pub(crate) fn unchanged(&self, rel: &Path, m: &Meta) -> bool {
        self.0.get(rel) == Some(&Ident::of(m))
    }

    fn contains(&self, rel: &Path) -> bool {
        self.0.contains_key(rel)
    }
}

fn encode(entries: &[(PathBuf, Ident)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 8 + entries.len() * 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (rel, id) in entries {
        let b = rel.as_os_str().as_bytes();
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
        out.push(id.kind);
        out.extend_from_slice(&id.ino.to_le_bytes());
        out.extend_from_slice(&id.ctime.sec.to_le_bytes());
        out.extend_from_slice(&id.ctime.nsec.to_le_bytes());
        out.extend_from_slice(&id.size.to_le_bytes());
    }
    out
}

fn decode(data: &[u8]) -> Option<Manifest> {
    let mut rest = data.strip_prefix(MAGIC)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        if rest.len() < n {
            return None;
        }
        let (a, b) = rest.split_at(n);
        rest = b;
        Some(a)
    };
    let count = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let mut map = HashMap::new();
    for _ in 0..count {
        let len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let rel = PathBuf::from(std::ffi::OsStr::from_bytes(take(len)?));
        let kind = take(1)?[0];
        let ino = u64::from_le_bytes(take(8)?.try_into().ok()?);
        let sec = i64::from_le_bytes(take(8)?.try_into().ok()?);
        let nsec = u32::from_le_bytes(take(4)?.try_into().ok()?);
        let size = u64::from_le_bytes(take(8)?.try_into().ok()?);
        map.insert(rel, Ident { ino, ctime: Time { sec, nsec }, size, kind });
    }
    take(1).is_none().then_some(Manifest(map))
}

/// Removes every manifest (the conversion swapped, aborted, or a new one begins). Repeatable.
pub(crate) fn forget_all(wd: &Workdir) -> Result<(), MigrateError> {
    wd.remove_files(&|n| n.starts_with(PREFIX.as_bytes()))
}

/// Removes the manifests of the passes before `pass` (whose own is recorded: nothing needs them).
pub(crate) fn forget_before(wd: &Workdir, pass: u32) -> Result<(), MigrateError> {
    wd.remove_files(&|n| {
        let number = n.strip_prefix(PREFIX.as_bytes()).and_then(|d| std::str::from_utf8(d).ok()?.parse::<u32>().ok());
        number.is_some_and(|p| p < pass)
    })
}

/// One pass as the copy sees it: what it keeps (by the previous pass's manifest) and what it saw.
pub(crate) struct Pass<'m> {
    /// `None`: the first copy, which has no previous pass.
    reference: Option<&'m Manifest>,
    /// The filesystem's clock when this pass began.
    clock: Time,
    seen: Mutex<Vec<(PathBuf, Option<Ident>)>>,
    copied: AtomicU64,
}

/// What a finished pass did, for its record.
pub(crate) struct Counts {
    pub copied: u64,
    pub removed: u64,
    pub entries: u64,
}

impl Counts {
    /// Whether the pass changed little (see [`LITTLE`]).
    pub(crate) fn little(&self) -> bool {
        self.copied + self.removed <= LITTLE.max(self.entries / 100)
    }
}

impl<'m> Pass<'m> {
    /// The first copy (`first`), or a catch-up pass keeping what `reference` shows unchanged
    /// (`None`: nothing, everything is copied again).
    pub(crate) fn new(first: bool, reference: Option<&'m Manifest>, clock: Time) -> Pass<'m> {
        static NONE: std::sync::OnceLock<Manifest> = std::sync::OnceLock::new();
        let reference = match (first, reference) {
            (true, _) => None,
            (false, Some(r)) => Some(r),
            (false, None) => Some(NONE.get_or_init(Manifest::default)),
        };
        Pass { reference, clock, seen: Mutex::new(Vec::new()), copied: AtomicU64::new(0) }
    }

    /// The filesystem's clock when this pass began.
    pub(crate) fn clock(&self) -> Time {
        self.clock
    }

    /// Writes this pass's manifest as `pass` (durably: the copy must be synced before), and
    /// returns its counts.
    pub(crate) fn store(self, wd: &Workdir, pass: u32) -> Result<Counts, MigrateError> {
        let seen = self.seen.into_inner().map_err(|_| MigrateError::Internal("catch-up state poisoned"))?;
        let removed = match self.reference {
            Some(r) => {
                let here: HashSet<&Path> = seen.iter().map(|(p, _)| p.as_path()).collect();
                r.0.keys().filter(|k| !here.contains(k.as_path())).count() as u64
            }
            None => 0,
        };
        let entries = seen.len() as u64;
        let recorded: Vec<(PathBuf, Ident)> = seen.into_iter().filter_map(|(p, id)| Some((p, id?))).collect();
        wd.replace(&name(pass), TMP, &encode(&recorded), "writing the catch-up manifest")?;
        Ok(Counts { copied: self.copied.load(Relaxed), removed, entries })
    }
}

impl Catchup for Pass<'_> {
    fn unchanged(&self, rel: &Path, m: &Meta) -> Option<bool> {
        self.reference.map(|r| r.contains(rel) && r.unchanged(rel, m))
    }

    fn seen(&self, rel: &Path, m: &Meta, copied: bool) {
        if copied {
            self.copied.fetch_add(1, Relaxed);
        }
        let id = (m.ctime < self.clock).then(|| Ident::of(m));
        if let Ok(mut s) = self.seen.lock() {
            s.push((rel.to_path_buf(), id));
        }
    }

    fn unsettled(&self, rel: &Path) -> bool {
        // Seen, with no identity: the next pass copies it.
        self.copied.fetch_add(1, Relaxed);
        match self.seen.lock() {
            Ok(mut s) => {
                s.push((rel.to_path_buf(), None));
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_a_torn_one_is_refused() {
        let id = |ino| Ident { ino, ctime: Time { sec: -5, nsec: 999_999_999 }, size: 7, kind: 1 };
        let entries =
            vec![(PathBuf::from("a/b\n"), id(1)), (PathBuf::from(std::ffi::OsStr::from_bytes(b"\xff")), id(2))];
        let data = encode(&entries);
        let m = decode(&data).unwrap();
        assert_eq!(m.0.len(), 2);
        assert_eq!(m.0[Path::new("a/b\n")], id(1));
        assert!(decode(&data[..data.len() - 1]).is_none(), "a short manifest");
        let mut long = data.clone();
        long.push(0);
        assert!(decode(&long).is_none(), "trailing bytes");
        assert!(decode(b"something else").is_none());
        assert_eq!(decode(&encode(&[])).unwrap().0.len(), 0);
    }

    #[test]
    fn little_means_a_few_entries_or_a_percent() {
        assert!(Counts { copied: 30, removed: 2, entries: 100 }.little());
        assert!(!Counts { copied: 30, removed: 3, entries: 100 }.little());
        assert!(Counts { copied: 900, removed: 100, entries: 100_000 }.little());
        assert!(!Counts { copied: 1001, removed: 0, entries: 100_000 }.little());
    }
}
