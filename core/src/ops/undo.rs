//! What a command made before its first durable step — the encrypted directory of `encrypt`, the
//! first journal record of a conversion — removed again when it fails before that step, so a
//! failure leaves the keystore and the kernel as it found them: no unused protector, no policy
//! record (listed as "unlocked") for a directory that was never encrypted. One guard for every
//! command that makes records: [`Undo`]. A crash is not a failure: what it leaves, the next run
//! adopts or drops (convert's orphan rules, docs/crash-safety.md).
use std::collections::HashSet;
use std::path::PathBuf;

use crate::fscrypt;
use crate::ids::{KeyIdentifier, ProtectorId};
use crate::keystore::Keystore;

/// The records a command made so far, removed on drop unless [`Undo::keep`] was called.
pub(crate) struct Undo {
    /// The stores a new protector may go to, each with the protectors it held at the start.
    watched: Vec<(Keystore, HashSet<ProtectorId>)>,
    protectors: Vec<(ProtectorId, Keystore)>,
    /// A policy record, its store, and the mount point whose kernel keyring holds its key.
    policy: Option<(KeyIdentifier, Keystore, PathBuf)>,
}

impl Undo {
    /// Notes the protectors `stores` hold now: one found in them later was made by this command,
    /// however it was made (created, or an existing one copied to a portable directory's medium).
    /// A store named twice (a directory that is not portable: its store is this keystore) is
    /// watched once.
    pub(crate) fn watching(stores: &[&Keystore]) -> Undo {
        let held = |s: &Keystore| s.protectors().map(|l| l.into_iter().map(|(id, _)| id).collect()).unwrap_or_default();
        let mut watched: Vec<(Keystore, HashSet<ProtectorId>)> = Vec::new();
        for s in stores {
            if !watched.iter().any(|(w, _)| w.root() == s.root()) {
                watched.push(((*s).clone(), held(s)));
            }
        }
        Undo { watched, protectors: Vec::new(), policy: None }
    }

    /// After the protector step: `id`'s record is this command's in each watched store that did
    /// not hold it before.
    pub(crate) fn protector(&mut self, id: &ProtectorId) {
        for (store, before) in &self.watched {
            if !before.contains(id) && store.protector_path(id).exists() {
                self.protectors.push((*id, store.clone()));
            }
        }
    }

    /// Policy record `id` was saved in `store`, its key added to the filesystem at `mount_point`.
    pub(crate) fn policy(&mut self, id: KeyIdentifier, store: &Keystore, mount_point: PathBuf) {
        self.policy = Some((id, store.clone(), mount_point));
    }

    /// The first durable step is done: everything made stays.
    pub(crate) fn keep(mut self) {
        self.protectors.clear();
        self.policy = None;
    }
}

impl Drop for Undo {
    /// Best effort, on a path that already fails with its own error: the policy first (a
    /// protector a policy uses cannot be removed), then its key, then the protectors.
    fn drop(&mut self) {
        if let Some((id, store, mp)) = self.policy.take() {
            if let Ok(_guard) = store.lock() {
                let _ = store.remove_policy(&id);
            }
            let _ = fscrypt::remove_key(&mp, &id, false);
        }
        for (id, store) in self.protectors.drain(..) {
            if let Ok(_guard) = store.lock() {
                let _ = store.remove_protector(&id);
            }
        }
    }
}
