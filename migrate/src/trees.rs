//! The two trees of a conversion: the source as resolved once, the staging directory in the work
//! dir, where each of them is (judged by inode, since a crash may come between a rename and its
//! record), and the swap.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::error::{host_err, io_err};
use crate::fault::{self, Point};
use crate::journal::{Journal, Workdir, STAGING};
use crate::{fsx, remove, Host, MigrateError};

/// The source as resolved once: absolute path (canonical parent + final name) and an open handle.
#[derive(Debug)]
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    pub(crate) fd: OwnedFd,
    pub(crate) meta: fsx::Meta,
}

impl Source {
    /// Resolves a path as the caller gave it: symlinks in the parent directories are followed
    /// once, here, and the result is used from then on; a final symlink is refused.
    pub(crate) fn resolve(p: &Path) -> Result<Source, MigrateError> {
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
    pub(crate) fn open(path: PathBuf) -> Result<Source, MigrateError> {
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

/// Where the staging copy of the conversion recorded in `workdir` is (or will be).
pub fn staging_path(workdir: &Path) -> PathBuf {
    workdir.join(STAGING)
}

/// Removes what an earlier attempt left in the work dir: the staging copy of an aborted
/// conversion, or an empty staging dir made just before a crash (before the journal existed).
/// Anything else is left alone: it might be someone's data.
pub(crate) fn clear_leftovers(wd: &Workdir, old: Option<&Journal>, point: Point) -> Result<(), MigrateError> {
    let Some(t) = wd.staging_meta()? else { return Ok(()) };
    let recorded = old.is_some_and(|j| t.ino == j.staging_ino && t.ino != j.source_ino);
    // An empty dir is the one a run made just before it died, before its journal replaced the
    // finished one of an earlier conversion (or decrypt) of the same directory.
    let ours = recorded
        || (t.kind == fsx::Kind::Dir
            && fsx::open_dir(&wd.fd, STAGING.as_ref())
                .and_then(fsx::list_names)
                .map(|n| n.is_empty())
                .unwrap_or(false));
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
pub(crate) fn remove_staging(wd: &Workdir, point: Point) -> Result<(), MigrateError> {
    remove::remove_tree(wd.fd.as_fd(), STAGING.as_ref(), false, &|_| {
        fault::point(point);
        Ok(())
    })
    .map_err(io_err("removing", &wd.staging_path()))?;
    wd.sync()
}

/// Opens source and staging and checks they are still the inodes the journal names.
pub(crate) fn open_pair(j: &Journal, wd: &Workdir) -> Result<(Source, OwnedFd), MigrateError> {
    let src = Source::open(j.source.0.clone())?;
    if src.meta.ino != j.source_ino || src.meta.dev != wd.dev()? {
        return Err(MigrateError::SourceReplaced { path: j.source.0.clone() });
    }
    Ok((src, open_staging(j, wd)?))
}

/// The staging dir, through the work dir's handle, if it is still the inode the journal names.
pub(crate) fn open_staging(j: &Journal, wd: &Workdir) -> Result<OwnedFd, MigrateError> {
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
pub(crate) fn check_encrypted(host: &dyn Host, j: &Journal, wd: &Workdir, stg: &OwnedFd) -> Result<(), MigrateError> {
    host.check_staging(&j.token, stg.as_fd(), &wd.staging_path())
        .map_err(|e| MigrateError::StagingNotEncrypted { workdir: wd.path.clone(), reason: e.0 })
}

/// Exchanges the source with the work dir's staging entry, relative to handles opened once: the
/// source's parent (opened without following any symlink) must hold `at_source` under the
/// source's name, and the staging entry must be `at_staging`.
pub(crate) fn exchange(
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

/// Where the two trees physically are, judged by inode numbers (a crash may have come between a
/// rename and the journal write that records it).
#[derive(PartialEq, Eq)]
pub(crate) enum Place {
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

pub(crate) fn place(j: &Journal, wd: &Workdir) -> Result<Place, MigrateError> {
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
pub(crate) fn sync_swap(j: &Journal, wd: &Workdir) -> Result<(), MigrateError> {
    if let Some(parent) = j.source.0.parent() {
        let fd = fsx::open_dir_path(parent).map_err(io_err("opening", parent))?;
        fsx::fsync(&fd).map_err(io_err("syncing", parent))?;
    }
    wd.sync()
}

/// Puts the recorded times back on both roots after an exchange (a moved directory's mtime
/// changes on f2fs, which rewrites its ".." entry; ext4 leaves it). Repeatable, so a resume
/// after a crash right after the exchange does it too.
pub(crate) fn restore_root_times(j: &Journal, wd: &Workdir) -> Result<(), MigrateError> {
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
