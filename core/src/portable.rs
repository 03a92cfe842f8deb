//! Portable directories (docs/formats.md): a directory on removable media whose policy record,
//! and the records of the protectors that travel with it (a password, a security key), are kept
//! on the medium itself, in `<mount>/.dirseal/portable/`, so it opens on any machine with dirseal.
//!
//! That directory is a keystore like the machine's (`protectors/`, `policies/`, `.lock`), in the
//! same formats, read by the same strict parsers. What differs is that a medium is
//! attacker-controlled input: every directory on the way from the mount point is checked without
//! following symlinks, must be root's alone (0700, as every record must be 0600: no other user can
//! hold the lock or read a record), and must be on the medium itself (a filesystem mounted over
//! `.dirseal` is refused), so no record is ever read or written outside the medium. Nothing on it
//! is opened before its type is known (a FIFO or a device node is refused unopened), and its lock
//! is waited for only a few seconds.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::keystore::{Keystore, KeystoreError};
use crate::securefile::{self, Privacy, SecureFileError};

/// `<mount>/.dirseal/portable`: the records of the portable directories on that filesystem.
pub fn records_dir(mount_point: &Path) -> PathBuf {
    mount_point.join(".dirseal").join("portable")
}

/// The directories from the mount point down to the records, in the order they are checked.
fn chain(mp: &Path) -> [PathBuf; 4] {
    let root = records_dir(mp);
    [mp.join(".dirseal"), root.clone(), root.join("protectors"), root.join("policies")]
}

/// Refuses `dir` unless it is a private directory (securefile's checks: not a symlink, root's
/// alone) on the filesystem of device `dev`.
fn check_on_medium(dir: &Path, dev: u64) -> Result<(), SecureFileError> {
    securefile::check_dir(dir, Privacy::OwnerOnly)?;
    let meta = std::fs::symlink_metadata(dir).map_err(|source| SecureFileError::Io {
        path: dir.to_path_buf(),
        op: "inspect",
        source,
    })?;
    if meta.dev() != dev {
        return Err(SecureFileError::Insecure {
            path: dir.to_path_buf(),
            reason: "it is on another filesystem than the medium (something is mounted over it)".into(),
        });
    }
    Ok(())
}

fn device_of(mp: &Path) -> Result<u64, SecureFileError> {
    let meta = std::fs::metadata(mp).map_err(|source| SecureFileError::Io {
        path: mp.to_path_buf(),
        op: "inspect",
        source,
    })?;
    Ok(meta.dev())
}

/// The keystore on the filesystem mounted at `mp`, if it has one; `None` when it keeps no
/// portable records. Creates nothing.
pub(crate) fn open_existing(mp: &Path) -> Result<Option<Keystore>, KeystoreError> {
    let dev = device_of(mp)?;
    for dir in chain(mp) {
        match check_on_medium(&dir, dev) {
            Ok(()) => {}
            // A medium without records; missing subdirectories are an empty keystore's.
            Err(SecureFileError::NotFound { .. }) => {
                if dir.starts_with(records_dir(mp)) && dir != records_dir(mp) {
                    continue;
                }
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(Keystore::open_existing(&records_dir(mp))?.on_medium(mp)))
}

/// The keystore on the filesystem mounted at `mp`, made (mode 0700, one level at a time, each
/// checked) if missing.
pub(crate) fn open_or_create(mp: &Path) -> Result<Keystore, KeystoreError> {
    let dev = device_of(mp)?;
    for dir in chain(mp) {
        securefile::ensure_dir(&dir, Privacy::OwnerOnly)?;
        check_on_medium(&dir, dev)?;
    }
    Ok(Keystore::open(&records_dir(mp))?.on_medium(mp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keystore::PolicyRecord;
    use crate::protector::tests::new_password;
    use crate::secret::MasterKey;

    /// A card pulled between the write of a record's temp file and its rename leaves the old
    /// record, read as it was; the temp file is never taken for a record.
    #[test]
    fn an_interrupted_write_leaves_the_old_record() {
        let card = tempfile::tempdir().unwrap();
        assert!(open_existing(card.path()).unwrap().is_none(), "a medium without records");
        let ks = open_or_create(card.path()).unwrap();
        let (prec, pkey) = new_password("pw", None, "pw");
        let master = MasterKey::random();
        let mut policy = PolicyRecord::new(crate::fscrypt::key_identifier(&master), None);
        policy.add_protector(&prec.id, &pkey, &master);
        ks.save_policy(&policy).unwrap();
        let dir = records_dir(card.path()).join("policies");
        std::fs::write(dir.join(format!(".{}.json.0123456789ab.tmp", policy.id)), b"{\"half\":").unwrap();
        let ks = open_existing(card.path()).unwrap().expect("records");
        let listed = ks.policies().unwrap();
        assert_eq!(listed.len(), 1);
        let read = listed.into_iter().next().unwrap().1.unwrap();
        assert_eq!(read.wrapped, policy.wrapped);
        assert_eq!(read.medium.as_deref(), Some(card.path()), "a medium's record says where it is");
    }

    #[test]
    fn a_symlinked_records_directory_is_refused() {
        let card = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), card.path().join(".dirseal")).unwrap();
        let e = open_existing(card.path()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = open_or_create(card.path()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0, "nothing written off the card");
    }
}
