//! What a new conversion will do, decided before anything is written: the [`Request`], the
//! checks of [`preflight`], the [`Census`] and the choice between copying and moving.

use std::path::Path;

use crate::ctx::Ctx;
use crate::error::{host_err, io_err, other_direction, other_source};
use crate::journal::Workdir;
use crate::pass::pool;
use crate::trees::Source;
use crate::types::{Direction, Method, Mode, Schedule};
use crate::{find_users, flags, fsx, mv, scan, Host, MigrateError, Phase, State};

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
    /// Worker threads for copying, hashing and moving small files.
    pub threads: std::num::NonZeroUsize,
    /// Copy, move, or pick by free space. Applies when a conversion starts; a resumed one keeps
    /// its recorded method.
    pub mode: Mode,
    /// Encrypt (convert) or decrypt. A recorded conversion going the other way is neither
    /// resumed nor replaced: it must be finished by its own command first.
    pub direction: Direction,
    /// Now (nothing may use the directory) or live (it stays in use until a later run `Now`
    /// swaps it). A live conversion is a copy: `Mode::Move` is refused, `Mode::Auto` copies.
    pub schedule: Schedule,
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
    /// the directories and the files also linked from outside the tree, which are copied).
    pub copy_needed: u64,
    pub move_needed: u64,
    pub inodes_needed: u64,
    pub inodes_available: u64,
    /// Files with hard links outside the tree (they stop being shared: see the outcome's notes).
    pub outside_links: u64,
    /// Regular files and directories (the root included) whose inode flags (other than
    /// casefold) or project id the copy keeps, and which flags they have
    /// ([`flag_names`](crate::flag_names) names them).
    pub flagged: u64,
    pub flag_bits: u32,
    /// Casefolded directories (`+F`), kept casefolded.
    pub casefolded: u64,
    /// Immutable or append-only entries, made so on the copy once it is verified.
    pub sealed: u64,
}

/// A new conversion that passed [`preflight`]: the resolved source and its census. [`start`]
/// begins the conversion from it without walking the tree again.
#[derive(Debug)]
pub struct Plan {
    pub(crate) src: Source,
    pub(crate) census: Census,
    /// How long the census took, reported with the run's other timings.
    pub(crate) scan: std::time::Duration,
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
/// free space and inodes, and (unless forced or live) that no process uses the directory; decides
/// between copying and moving. Walks the tree once, for the census the plan carries.
pub fn preflight(req: &Request, host: &dyn Host) -> Result<Plan, MigrateError> {
    let src = Source::resolve(req.source)?;
    let t = std::time::Instant::now();
    let census = preflight_source(req, host, &src)?;
    Ok(Plan { src, census, scan: t.elapsed() })
}

/// Free space a move needs: the chunk in flight or one batch (whichever is pending; both
/// counted, with a block of rounding per file), a block per directory, the files also linked
/// from outside the tree (copied, not moved), and a margin. A hard-link group inside the tree
/// moves like one file.
fn move_needed(c: &scan::Census) -> u64 {
    mv::CHUNK + mv::BATCH_BYTES + mv::BATCH_FILES as u64 * 4096 + (c.dirs + 1) * 4096 + c.outside_alloc + (16 << 20)
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
    if req.schedule == Schedule::Live {
        // The directory stays in use: its files cannot leave it.
        return match req.mode {
            Mode::Move => Err(MigrateError::LiveMove { path: path() }),
            _ if available >= copy_needed => Ok((Method::Copy, auto, copy_needed, move_needed)),
            _ => Err(MigrateError::NoSpace { path: path(), needed: copy_needed, available }),
        };
    }
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
pub(crate) fn quick_checks(req: &Request, host: &dyn Host, src: &Source) -> Result<(), MigrateError> {
    let encrypted = src.meta.encrypted
        || host.is_encrypted(&src.path).map_err(host_err("checking whether the directory is encrypted"))?;
    match req.direction {
        Direction::Encrypt if encrypted => return Err(MigrateError::AlreadyEncrypted { path: src.path.clone() }),
        Direction::Decrypt if !encrypted => return Err(MigrateError::NotEncrypted { path: src.path.clone() }),
        _ => {}
    }
    if src.meta.sealed != 0 {
        // The swap renames the directory itself, which these flags forbid.
        return Err(MigrateError::ImmutableInside { path: src.path.clone() });
    }
    check_workdir_location(req.workdir, src)?;
    if let Some(wd) = Workdir::open(req.workdir, false)? {
        // A running converter holds the source open: without this it would be reported as a
        // process using the directory rather than as what it is.
        wd.probe_lock()?;
        if let Some(j) = wd.read()? {
            if !j.step.is_final() && j.source.0 != src.path {
                return Err(other_source(req.workdir, &j.source.0, &src.path));
            }
            if !j.step.is_final() && j.direction != req.direction {
                return Err(other_direction(&j.source.0, j.direction));
            }
        }
    }
    if !req.force && req.schedule == Schedule::Now {
        check_not_in_use(&src.path)?;
    }
    Ok(())
}

pub(crate) fn preflight_source(req: &Request, host: &dyn Host, src: &Source) -> Result<Census, MigrateError> {
    quick_checks(req, host, src)?;
    let ctx = Ctx::new(host, &src.path, src.meta.mnt_id, Phase::Scanning, 0, 0).going(req.direction);
    ctx.tick(true);
    let census = pool(req.threads)?.install(|| scan::census(&ctx, &src.fd)).map_err(|e| match e {
        MigrateError::Interrupted { .. } => MigrateError::Interrupted { state: State::Prepared },
        e => e,
    })?;
    if let (Direction::Encrypt, Some(rel)) = (req.direction, &census.first_casefolded) {
        flags::check_casefold_encryption(&src.fd).map_err(|reason| MigrateError::FlagNotKept {
            path: if rel.as_os_str().is_empty() { src.path.clone() } else { src.path.join(rel) },
            flag: "casefold (+F)",
            reason,
        })?;
    }
    let vfs = rustix::fs::fstatvfs(&src.fd).map_err(|e| io_err("checking free space on", &src.path)(e.into()))?;
    let available = vfs.f_bavail.saturating_mul(vfs.f_frsize);
    let (method, auto, copy_needed, move_needed) = choose_method(req, src, &census, available)?;
    if let (Method::Move, Some(rel)) = (method, &census.first_sealed) {
        return Err(MigrateError::ImmutableInMove { path: src.path.join(rel) });
    }
    let inodes = match method {
        Method::Copy => census.entries + 1 + census.entries / 20 + 16,
        Method::Move => census.dirs + census.outside_links + mv::BATCH_FILES as u64 + 16,
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
        flagged: census.flagged,
        flag_bits: census.flag_bits,
        casefolded: census.casefolded,
        sealed: census.sealed,
    })
}

pub(crate) fn check_not_in_use(path: &Path) -> Result<(), MigrateError> {
    let users = find_users(path).map_err(io_err("looking for processes using", path))?;
    if users.is_empty() {
        Ok(())
    } else {
        Err(MigrateError::InUse { path: path.to_path_buf(), users })
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
