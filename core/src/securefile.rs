//! Root-owned private files: no-follow, size-capped reads that refuse files an unprivileged user
//! could have planted or modified, and atomic, durable writes.
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a root-owned private file or directory was refused or could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecureFileError {
    /// The file does not exist (callers often treat this as "empty" or "defaults").
    #[error("{path} does not exist")]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// Someone other than root could have written the file or directory.
    #[error("refusing {path}: {reason}; it must be owned by root and not writable by group or others (fix with `chown root:root` and `chmod go-w`), or be removed")]
    Insecure {
        /// The file or directory.
        path: PathBuf,
        /// Which check failed (owner, mode, type).
        reason: String,
    },
    /// The file is larger than any file of its kind can be.
    #[error(
        "{path} is larger than {max} bytes, which no dirseal file is; it is not a dirseal file, remove or restore it"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The cap for its kind, in bytes.
        max: u64,
    },
    /// Any other I/O error.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was attempted, as a verb for the message.
        op: &'static str,
        /// The underlying error.
        source: io::Error,
    },
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> SecureFileError + 'a {
    move |source| {
        if source.kind() == io::ErrorKind::NotFound {
            SecureFileError::NotFound { path: path.to_path_buf() }
        } else if source.raw_os_error() == Some(libc::ELOOP) {
            SecureFileError::Insecure { path: path.to_path_buf(), reason: "it is a symbolic link".into() }
        } else {
            SecureFileError::Io { path: path.to_path_buf(), op, source }
        }
    }
}

/// Who may own dirseal's files: root, or the effective user when not root (only tests and
/// `--keystore` experiments run unprivileged; the kernel key ioctls need root anyway).
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

fn check_meta(path: &Path, meta: &std::fs::Metadata, want_dir: bool) -> Result<(), SecureFileError> {
    let insecure = |reason: String| SecureFileError::Insecure { path: path.to_path_buf(), reason };
    if meta.file_type().is_symlink() {
        return Err(insecure("it is a symbolic link".into()));
    }
    if want_dir && !meta.is_dir() {
        return Err(insecure("it is not a directory".into()));
    }
    if !want_dir && !meta.is_file() {
        return Err(insecure("it is not a regular file".into()));
    }
    if !trusted_owner(meta.uid()) {
        return Err(insecure(format!("it is owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(insecure(format!("its mode {:o} lets group or others write it", meta.mode() & 0o7777)));
    }
    Ok(())
}

/// Reads a whole private file: not a symlink, a regular file owned by root, not group/world
/// writable, at most `max` bytes.
pub fn read_private(path: &Path, max: u64) -> Result<Vec<u8>, SecureFileError> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err(path, "open"))?;
    let meta = f.metadata().map_err(io_err(path, "inspect"))?;
    check_meta(path, &meta, false)?;
    if meta.len() > max {
        return Err(SecureFileError::TooLarge { path: path.to_path_buf(), max });
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    // +1 so a file that grew after fstat is still caught.
    f.take(max + 1).read_to_end(&mut buf).map_err(io_err(path, "read"))?;
    if buf.len() as u64 > max {
        return Err(SecureFileError::TooLarge { path: path.to_path_buf(), max });
    }
    Ok(buf)
}

/// Creates `dir` (and missing parents) with mode 0700, or checks that the existing one is a
/// trusted directory.
pub fn ensure_private_dir(dir: &Path) -> Result<(), SecureFileError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => check_meta(dir, &meta, true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err(dir, "create"))?;
            // DirBuilder applies the umask; make the mode exact.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io_err(dir, "chmod"))?;
            sync_dir(dir.parent().unwrap_or(Path::new("/")))?;
            Ok(())
        }
        Err(e) => Err(io_err(dir, "inspect")(e)),
    }
}

/// Checks an existing directory without creating it.
pub(crate) fn check_private_dir(dir: &Path) -> Result<(), SecureFileError> {
    let meta = std::fs::symlink_metadata(dir).map_err(io_err(dir, "inspect"))?;
    check_meta(dir, &meta, true)
}

fn sync_dir(dir: &Path) -> Result<(), SecureFileError> {
    let d = File::open(dir).map_err(io_err(dir, "open"))?;
    d.sync_all().map_err(io_err(dir, "sync"))
}

/// Replaces `path` with `data` (mode 0600) so that a crash leaves either the old or the new
/// content, never a mix: write a temp file in the same directory, fsync, rename, fsync the dir.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), SecureFileError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", hex::encode(rand::random::<[u8; 6]>())));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io_err(&tmp, "create"))?;
        f.write_all(data).map_err(io_err(&tmp, "write"))?;
        f.sync_all().map_err(io_err(&tmp, "sync"))?;
        std::fs::rename(&tmp, path).map_err(io_err(path, "replace"))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    sync_dir(dir)
}

/// Opens (creating, mode 0600) the private file `path` without following symlinks, checks it
/// like [`read_private`] does, and holds an exclusive `flock` on it until the result is dropped.
/// The kernel drops the lock when a process dies, so a crash never leaves a stale lock.
pub fn lock_file(path: &Path) -> Result<nix::fcntl::Flock<File>, SecureFileError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err(path, "open"))?;
    let meta = f.metadata().map_err(io_err(path, "inspect"))?;
    check_meta(path, &meta, false)?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| io_err(path, "lock")(e.into()))
}

/// Like [`lock_file`], without waiting: `None` while another process holds the lock.
pub(crate) fn try_lock_file(path: &Path) -> Result<Option<nix::fcntl::Flock<File>>, SecureFileError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io_err(path, "open"))?;
    let meta = f.metadata().map_err(io_err(path, "inspect"))?;
    check_meta(path, &meta, false)?;
    match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(io_err(path, "lock")(e.into())),
    }
}

/// Unlinks `path` durably. A missing file is `NotFound`.
pub(crate) fn remove_durable(path: &Path) -> Result<(), SecureFileError> {
    std::fs::remove_file(path).map_err(io_err(path, "remove"))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let d = tempfile::tempdir().unwrap();
        let ks = d.path().join("ks");
        ensure_private_dir(&ks).unwrap();
        assert_eq!(std::fs::metadata(&ks).unwrap().mode() & 0o7777, 0o700);
        let p = ks.join("a.json");
        write_atomic(&p, b"hello").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(read_private(&p, 100).unwrap(), b"hello");
        write_atomic(&p, b"bye").unwrap();
        assert_eq!(read_private(&p, 100).unwrap(), b"bye");
        assert!(matches!(read_private(&p, 2), Err(SecureFileError::TooLarge { .. })));

        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = read_private(&p, 100).unwrap_err();
        assert!(e.to_string().contains("lets group or others write"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();

        let l = ks.join("link.json");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        let e = read_private(&l, 100).unwrap_err();
        assert!(matches!(e, SecureFileError::Insecure { .. }), "{e}");

        std::os::unix::fs::chown(&p, Some(4242), None).unwrap();
        let e = read_private(&p, 100).unwrap_err();
        assert!(e.to_string().contains("owned by uid 4242"), "{e}");

        remove_durable(&l).unwrap();
        assert!(matches!(read_private(&l, 100), Err(SecureFileError::NotFound { .. })));
        assert!(std::fs::read_dir(&ks).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().ends_with(".tmp")));
    }

    #[test]
    fn refuses_world_writable_dir() {
        let d = tempfile::tempdir().unwrap();
        let ks = d.path().join("ks");
        std::fs::create_dir(&ks).unwrap();
        std::fs::set_permissions(&ks, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(ensure_private_dir(&ks), Err(SecureFileError::Insecure { .. })));
    }
}
