//! What `status` reports of a directory, a protector and a filesystem.
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Dirseal, OpsError};
use crate::census::ProtectorSummary;
use crate::fscrypt::{self, KeyStatus};
use crate::ids::{KeyIdentifier, ProtectorId};
use crate::keystore::{KeystoreError, PolicyRecord};
use crate::portable;
use crate::protector::ProtectorRecord;

// Made here, where records are read; the type sits low in census.rs, for remedies to name.
impl ProtectorSummary {
    /// The summary of a record in this machine's keystore.
    pub fn of(r: &ProtectorRecord) -> Self {
        ProtectorSummary { id: r.id, name: r.name.clone(), kind: r.kind.name(), uid: r.uid, stored: "keystore" }
    }
}

/// What `dirseal status DIR` reports.
#[derive(Clone, Debug, Serialize)]
pub struct DirStatus {
    /// The path asked about.
    pub path: PathBuf,
    /// The top of the encrypted tree the path belongs to (its highest ancestor on the
    /// same filesystem with the same policy).
    pub encrypted_root: Option<PathBuf>,
    /// Whether the path has an fscrypt policy.
    pub encrypted: bool,
    /// The key identifier of that policy.
    pub policy: Option<KeyIdentifier>,
    /// "unlocked", "locked", or "partially-locked" (files were busy at lock time).
    pub key: Option<&'static str>,
    /// Whether the keystore has a policy record for that key.
    pub managed: bool,
    /// For a portable directory, the directory on its medium that holds its records.
    pub portable: Option<PathBuf>,
    /// Protectors of a portable directory kept on another machine (a TPM protector added there):
    /// they do not open it here.
    pub elsewhere: Vec<ProtectorId>,
    /// The protectors the policy lists that the keystore has.
    pub protectors: Vec<ProtectorSummary>,
    /// Something a user should fix (unreadable protector file, missing policy, ...).
    pub problems: Vec<String>,
    /// Something that works but weakens the protection (a TPM PIN testable offline).
    pub warnings: Vec<String>,
    /// The filesystem holding the path, and whether it can encrypt at all.
    pub filesystem: FsStatus,
}

/// The filesystem under a path, as `status` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct FsStatus {
    /// Where the filesystem is mounted.
    pub mount_point: PathBuf,
    /// Its type ("ext4", "f2fs", ...).
    pub fstype: String,
    /// The device it is mounted from.
    pub device: String,
    /// Whether it can encrypt, and what to do if not.
    pub encryption: fscrypt::Support,
}

fn key_word(s: KeyStatus) -> &'static str {
    match s {
        KeyStatus::Absent => "locked",
        KeyStatus::Present => "unlocked",
        KeyStatus::IncompletelyRemoved => "partially-locked",
    }
}

impl Dirseal {
    /// The state of any path: encrypted or not, and whether its filesystem could be. A filesystem
    /// without fscrypt is an answer here, not an error.
    pub fn dir_status(&self, dir: &Path) -> Result<DirStatus, OpsError> {
        let mut st = public_dir_status(dir)?;
        if st.policy.is_none() {
            return Ok(st);
        }
        match self.policy_of(dir) {
            Ok(rec) => {
                st.managed = true;
                st.portable = rec.medium.as_deref().map(portable::records_dir);
                let (list, problems) = self.protectors_of(&rec);
                st.protectors = list
                    .iter()
                    .map(|r| {
                        let on_medium = self.protector_of_policy(&rec, &r.id).is_ok_and(|(_, m)| m);
                        ProtectorSummary {
                            stored: if on_medium { "medium" } else { "keystore" },
                            ..ProtectorSummary::of(r)
                        }
                    })
                    .collect();
                if rec.medium.is_some() {
                    let missing = |id: &&ProtectorId| {
                        matches!(self.protector_of_policy(&rec, id), Err(KeystoreError::NotFound { .. }))
                    };
                    st.elsewhere = rec.wrapped.keys().filter(missing).copied().collect();
                }
                st.problems = problems;
                st.warnings = list.iter().filter_map(|r| self.pin_warning(r)).collect();
                st.warnings.extend(self.shadowed(dir, &rec));
                if let (None, Err(e)) = (&rec.medium, self.medium_policy(dir, &rec.id)) {
                    st.problems
                        .push(format!("the records on this filesystem cannot be read (the local one is used): {e}"));
                }
            }
            Err(OpsError::NotManaged { id, .. }) => {
                st.problems.push(KeystoreError::NotFound { kind: "policy", id: id.to_string() }.to_string())
            }
            Err(e) => st.problems.push(e.to_string()),
        }
        Ok(st)
    }

    /// Key status of a policy on the filesystem its hint points at, for overviews.
    pub fn policy_key_status(&self, rec: &PolicyRecord) -> Option<&'static str> {
        let hint = rec.path_hint.as_ref()?;
        let mp = fscrypt::mount_point(hint).ok()?;
        fscrypt::key_status(&mp, &rec.id).ok().map(key_word)
    }
}

/// A portable directory whose records a mounted filesystem keeps (docs/portable.md), as the
/// overview lists it: this machine's keystore does not know it.
#[derive(Clone, Debug, Serialize)]
pub struct PortableDir {
    /// Its policy (the kernel's key identifier).
    pub policy: KeyIdentifier,
    /// Where it was when it was encrypted (on the machine that did it: the medium may be mounted
    /// elsewhere now).
    pub path_hint: Option<PathBuf>,
    /// The medium's records, `<mount>/.dirseal/portable`.
    pub records: PathBuf,
    /// "locked", "unlocked" or "partially-locked" on the filesystem now.
    pub key: Option<&'static str>,
    /// The protectors its record names.
    pub protectors: Vec<ProtectorId>,
}

impl Dirseal {
    /// The portable directories on every mounted filesystem, and a problem for each whose records
    /// cannot be read. A policy this keystore records is not one (a record of it on a medium is
    /// ignored, and `status DIR` says so).
    pub fn portable_dirs(&self) -> (Vec<PortableDir>, Vec<String>) {
        let (mut found, mut problems) = (Vec::new(), Vec::new());
        let mounts = match fscrypt::mount_points() {
            Ok(m) => m,
            Err(e) => return (found, vec![e.to_string()]),
        };
        for mp in mounts {
            let medium = match portable::open_existing(&mp) {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    problems.push(format!("the portable records on {} cannot be read: {e}", mp.display()));
                    continue;
                }
            };
            let Ok(listing) = medium.policies() else { continue };
            for (_, rec) in listing {
                match rec {
                    Ok(r) if matches!(self.keystore.policy(&r.id), Err(KeystoreError::NotFound { .. })) => {
                        found.push(PortableDir {
                            policy: r.id,
                            key: fscrypt::key_status(&mp, &r.id).ok().map(key_word),
                            path_hint: r.path_hint,
                            records: portable::records_dir(&mp),
                            protectors: r.wrapped.keys().copied().collect(),
                        })
                    }
                    Ok(_) => {}
                    Err(e) => problems.push(e.to_string()),
                }
            }
        }
        (found, problems)
    }
}

/// What anyone who can open `dir` may learn without the keystore: its filesystem, whether it is
/// encrypted (and the top of its tree), and whether its key is loaded. Neither the policy nor
/// the key-status ioctl needs privilege; protectors are the keystore's and stay with root.
pub fn public_dir_status(dir: &Path) -> Result<DirStatus, OpsError> {
    let m = fscrypt::mount_entry(dir)?;
    let filesystem = FsStatus {
        encryption: fscrypt::support(&m.mount_point)?,
        mount_point: m.mount_point,
        fstype: m.fstype,
        device: m.source,
    };
    let policy = match filesystem.encryption {
        fscrypt::Support::Enabled | fscrypt::Support::ReadOnly => fscrypt::get_policy(dir)?,
        fscrypt::Support::NotEnabled | fscrypt::Support::Unsupported => None,
    };
    let encrypted_root = match &policy {
        Some(p) => Some(fscrypt::encrypted_root(dir, p)?),
        None => None,
    };
    let mut st = DirStatus {
        path: dir.to_path_buf(),
        encrypted_root,
        encrypted: policy.is_some(),
        policy: policy.map(|p| p.identifier),
        key: None,
        managed: false,
        portable: None,
        elsewhere: Vec::new(),
        protectors: Vec::new(),
        problems: Vec::new(),
        warnings: Vec::new(),
        filesystem,
    };
    if let Some(p) = policy {
        st.key = Some(key_word(fscrypt::key_status(&st.filesystem.mount_point, &p.identifier)?));
    }
    Ok(st)
}
