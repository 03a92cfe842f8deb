//! Who may make the TPM check a PIN through the service. The TPM's count of wrong PINs is shared
//! by every PIN protector on the machine, so a caller guessing at their own protector spends
//! everyone's tries. Before any method lets the TPM check a PIN for a caller other than root:
//! - the protector must be the caller's own;
//! - the library's one rule ([`PinTries::may_try`]) must allow a try: while the last
//!   `tpm2.min_local_tries` tries remain, only someone at the device (the caller's process is in
//!   a local, active seat session, as logind says) may spend them; and one try per uid per
//!   [`PinTries::MIN_INTERVAL`].
//!
//! This check answers early, with the service's own error; the library decides again, under the
//! machine's PIN lock, right before the TPM is asked (the call's [`crate::secrets::Secrets`]
//! carry the caller's presence), so calls at once cannot race past it.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use dirseal::ids::ProtectorId;
use dirseal::ops::Dirseal;
use dirseal::protector::Ask;

use dirseal::tpm2::PinTries;

use crate::auth::Caller;
use crate::error::{Error, Result};

/// When each uid last had a PIN try let through.
static LAST_TRY: Mutex<Option<HashMap<u32, Instant>>> = Mutex::new(None);

/// Checks (and, when allowed, records) a try of protector `id`'s PIN by `caller`. Protectors
/// without a TPM PIN, and root, pass at once.
pub fn may_try(ds: &Dirseal, caller: &Caller, id: &ProtectorId) -> Result<()> {
    if caller.uid == 0 {
        return Ok(());
    }
    let rec = match ds.keystore().protector(id) {
        Ok(r) => r,
        // Not here: on a portable directory's medium, which keeps only protectors that travel
        // (never a TPM's), or nowhere, which the operation itself reports.
        Err(dirseal::keystore::KeystoreError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    // A PIN the device counts (a TPM PIN); other secrets cost no shared tries.
    if rec.kind.ask() != Ask::PIN {
        return Ok(());
    }
    if rec.uid != Some(caller.uid) {
        return Err(Error::denied(format!(
            "protector {id} is not yours: TPM PIN tries are shared by every user, so only the owner of a TPM \
             protector (or root) may try its PIN"
        )));
    }
    let config = ds.config();
    let Some(tries_left) = rec.kind.device_tries(config) else { return Ok(()) };
    let tries_left = tries_left.map_err(|e| Error::failed(e.to_string()))?;
    let rule = PinTries { tries_left, min_local_tries: config.tpm2.min_local_tries() };
    let mut last = LAST_TRY.lock().unwrap_or_else(|e| e.into_inner());
    let last = last.get_or_insert_with(HashMap::new);
    let since = last.get(&caller.uid).map(Instant::elapsed);
    rule.may_try(caller.presence().at_device(), since).map_err(|e| Error::denied(e.to_string()))?;
    last.insert(caller.uid, Instant::now());
    Ok(())
}
