//! Root-owned private files: no-follow, size-capped reads that refuse files an unprivileged user
//! could have planted or modified, and atomic, durable writes.
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// Group or others may open the file or directory: a keystore's must be root's alone.
    #[error(
        "refusing {path}: its mode {mode:o} lets group or others open it, and dirseal's records and their lock must be \
         root's alone (no other user may read them or hold their lock); fix with `chmod {want:o} {path}` if dirseal \
         made it, or remove it"
    )]
    Exposed {
        /// The file or directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// What they must be: 0700 for a directory, 0600 for a file.
        want: u32,
    },
    /// Another process holds the lock and did not let go within the wait.
    #[error(
        "{path} is locked by another process (waited {secs} s): another dirseal may be changing these records; try \
         again when it is done. If none runs, `fuser -v {path}` names the holder: on a medium, a holder that is not \
         dirseal is hostile (unmount the medium)"
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// How long it was waited for, in seconds.
        secs: u64,
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

/// How private a file or directory must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Privacy {
    /// Root's and not writable by group or others: the config and run-time files, which others
    /// may read.
    NotWritable,
    /// Root's alone (no permission bits for group or others: 0700 directories, 0600 files): a
    /// keystore's, on this machine or a medium. Another user who could open a record's lock
    /// could `flock` it and stall root; one who could read a record could try its password.
    OwnerOnly,
}

fn check_meta(path: &Path, meta: &std::fs::Metadata, want_dir: bool, privacy: Privacy) -> Result<(), SecureFileError> {
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
    if privacy == Privacy::OwnerOnly && meta.mode() & 0o077 != 0 {
        let want = if want_dir { 0o700 } else { 0o600 };
        return Err(SecureFileError::Exposed { path: path.to_path_buf(), mode: meta.mode() & 0o7777, want });
    }
    Ok(())
}

/// Opens the existing regular file `path` with `opts` and never anything else: its type (and
/// owner and mode) is checked with `lstat` before any `open`, since opening a device node or a
/// FIFO (on a medium mounted with `dev`, say) does something of its own: a device's driver acts on
/// it, a FIFO's waiting writer is let through, and without `O_NONBLOCK` the open itself could
/// wait. The open does not follow symlinks, block or take a controlling terminal, and what it
/// opened must be the inode checked, which is checked again.
fn open_regular(path: &Path, opts: &mut OpenOptions, privacy: Privacy) -> Result<File, SecureFileError> {
    let before = std::fs::symlink_metadata(path).map_err(io_err(path, "inspect"))?;
    check_meta(path, &before, false, privacy)?;
    let f = opts
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err(path, "open"))?;
    let meta = f.metadata().map_err(io_err(path, "inspect"))?;
    if (meta.dev(), meta.ino()) != (before.dev(), before.ino()) {
        return Err(SecureFileError::Insecure {
            path: path.to_path_buf(),
            reason: "it was replaced while it was being opened".into(),
        });
    }
    check_meta(path, &meta, false, privacy)?;
    Ok(f)
}

/// Reads a whole private file: not a symlink, a regular file owned by root, not group/world
/// writable, at most `max` bytes.
pub fn read_private(path: &Path, max: u64) -> Result<Vec<u8>, SecureFileError> {
    read_file(path, max, Privacy::NotWritable)
}

/// [`read_private`] with the privacy the file must have.
pub fn read_file(path: &Path, max: u64, privacy: Privacy) -> Result<Vec<u8>, SecureFileError> {
    let f = open_regular(path, OpenOptions::new().read(true), privacy)?;
    let meta = f.metadata().map_err(io_err(path, "inspect"))?;
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
    ensure_dir(dir, Privacy::NotWritable)
}

/// [`ensure_private_dir`] with the privacy an existing directory must have.
pub fn ensure_dir(dir: &Path, privacy: Privacy) -> Result<(), SecureFileError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => check_meta(dir, &meta, true, privacy),
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
pub(crate) fn check_dir(dir: &Path, privacy: Privacy) -> Result<(), SecureFileError> {
    let meta = std::fs::symlink_metadata(dir).map_err(io_err(dir, "inspect"))?;
    check_meta(dir, &meta, true, privacy)
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

/// Removes the temporary files [`write_atomic`] left beside `path` when it was cut short (a
/// power cut or a kill between creating and renaming one). Only for a file whose writers are
/// serialized by a lock the caller holds: a temporary file of a write under way would go too.
pub fn remove_stale_temps(path: &Path) -> Result<(), SecureFileError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else { return Ok(()) };
    let prefix = format!(".{name}.");
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir, "list")(e)),
    };
    let mut removed = false;
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&prefix) && n.ends_with(".tmp") && e.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(e.path()).map_err(io_err(&e.path(), "remove"))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Opens (creating, mode 0600) the private file `path` without following symlinks, checks it
/// like [`read_private`] does, and holds an exclusive `flock` on it until the result is dropped,
/// waiting as long as another process holds it. The kernel drops the lock when a process dies,
/// so a crash never leaves a stale lock.
pub fn lock_file(path: &Path) -> Result<nix::fcntl::Flock<File>, SecureFileError> {
    lock_file_within(path, Privacy::NotWritable, None)
}

/// [`lock_file`] for a file that must have `privacy`, waiting at most `wait` (`None`: as long as
/// it takes) for another holder ([`SecureFileError::Held`] then): a lock that someone else might
/// take (a medium's, whose files an attacker made) must not stall root for ever.
pub fn lock_file_within(
    path: &Path,
    privacy: Privacy,
    wait: Option<Duration>,
) -> Result<nix::fcntl::Flock<File>, SecureFileError> {
    let mut f = open_lock(path, privacy)?;
    let Some(wait) = wait else {
        return nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| io_err(path, "lock")(e.into()));
    };
    let start = Instant::now();
    loop {
        match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((back, nix::errno::Errno::EWOULDBLOCK)) if start.elapsed() < wait => {
                f = back;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(SecureFileError::Held { path: path.to_path_buf(), secs: wait.as_secs() })
            }
            Err((_, e)) => return Err(io_err(path, "lock")(e.into())),
        }
    }
}

/// The lock file, created (0600, never over anything that exists) or opened as [`open_regular`].
fn open_lock(path: &Path, privacy: Privacy) -> Result<File, SecureFileError> {
    if let Err(e) = std::fs::symlink_metadata(path) {
        if e.kind() != io::ErrorKind::NotFound {
            return Err(io_err(path, "inspect")(e));
        }
        let created = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(path);
        match created {
            Ok(f) => {
                let meta = f.metadata().map_err(io_err(path, "inspect"))?;
                check_meta(path, &meta, false, privacy)?;
                return Ok(f);
            }
            // Made by someone else meanwhile: checked like any existing one.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(path, "create")(e)),
        }
    }
    open_regular(path, OpenOptions::new().read(true).write(true), privacy)
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
    fn stale_temporary_files_of_one_record_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let rec = d.path().join("decrypt-cleanup.json");
        write_atomic(&rec, b"{}").unwrap();
        // What a power cut between create and rename leaves, twice; another record's; a directory.
        for n in
            [".decrypt-cleanup.json.0a1b2c3d4e5f.tmp", ".decrypt-cleanup.json.ffffffffffff.tmp", ".journal.json.1.tmp"]
        {
            std::fs::write(d.path().join(n), b"partial").unwrap();
        }
        std::fs::create_dir(d.path().join(".decrypt-cleanup.json.dir.tmp")).unwrap();
        remove_stale_temps(&rec).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".decrypt-cleanup.json.dir.tmp", ".journal.json.1.tmp", "decrypt-cleanup.json"]);
        assert_eq!(std::fs::read(&rec).unwrap(), b"{}");
        // Nothing to do, and a missing directory, are no errors.
        remove_stale_temps(&rec).unwrap();
        remove_stale_temps(&d.path().join("gone/x.json")).unwrap();
    }

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
    fn owner_only_refuses_what_others_can_open() {
        let d = tempfile::tempdir().unwrap();
        let ks = d.path().join("ks");
        ensure_dir(&ks, Privacy::OwnerOnly).unwrap();
        let p = ks.join("a.json");
        write_atomic(&p, b"x").unwrap();
        assert_eq!(read_file(&p, 10, Privacy::OwnerOnly).unwrap(), b"x");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_private(&p, 10).unwrap(), b"x", "others may read a config");
        let e = read_file(&p, 10, Privacy::OwnerOnly).unwrap_err();
        assert!(matches!(e, SecureFileError::Exposed { want: 0o600, .. }), "{e}");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&ks, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_dir(&ks, Privacy::OwnerOnly).unwrap_err();
        assert!(matches!(e, SecureFileError::Exposed { want: 0o700, .. }), "{e}");
        let lock = d.path().join(".lock");
        std::fs::write(&lock, b"").unwrap();
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = lock_file_within(&lock, Privacy::OwnerOnly, Some(Duration::ZERO)).unwrap_err();
        assert!(matches!(e, SecureFileError::Exposed { .. }), "{e}");
    }

    /// Another holder of a lock that must not stall root: an error naming the file, after the
    /// wait and not much later.
    #[test]
    fn a_held_lock_is_waited_for_a_bounded_time() {
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join(".lock");
        let held = lock_file_within(&lock, Privacy::OwnerOnly, None).unwrap();
        assert_eq!(std::fs::metadata(&lock).unwrap().mode() & 0o7777, 0o600);
        let t = Instant::now();
        let e = lock_file_within(&lock, Privacy::OwnerOnly, Some(Duration::from_millis(300))).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(300) && t.elapsed() < Duration::from_secs(5));
        assert!(matches!(e, SecureFileError::Held { .. }), "{e}");
        assert!(e.to_string().contains(&lock.display().to_string()) && e.to_string().contains("another process"));
        drop(held);
        lock_file_within(&lock, Privacy::OwnerOnly, Some(Duration::ZERO)).unwrap();
    }

    /// A FIFO or a device node where a file should be is refused without being opened: a writer
    /// waiting on the FIFO is never let through (an open would), and a device without a driver
    /// is "not a regular file" rather than the open's "no such device".
    #[test]
    fn nothing_but_a_regular_file_is_opened() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || tx.send(OpenOptions::new().write(true).open(&fifo).is_ok()))
        };
        // The writer waits in its open by now: any open of the FIFO would let it through.
        std::thread::sleep(Duration::from_millis(200));
        let e = read_file(&fifo, 10, Privacy::OwnerOnly).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = lock_file_within(&fifo, Privacy::OwnerOnly, Some(Duration::ZERO)).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = lock_file(&fifo).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "the FIFO was opened");
        // Let the writer go.
        let _reader = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
        assert!(rx.recv().unwrap());
        writer.join().unwrap().unwrap();

        let dev = d.path().join("dev");
        let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
        match nix::sys::stat::mknod(&dev, nix::sys::stat::SFlag::S_IFCHR, mode, nix::sys::stat::makedev(0, 0)) {
            Ok(()) => {}
            Err(nix::errno::Errno::EPERM) => return, // not root: the FIFO case stands for both
            Err(e) => panic!("mknod: {e}"),
        }
        let e = read_file(&dev, 10, Privacy::OwnerOnly).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = lock_file(&dev).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
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
