//! Who may make the TPM check a PIN through the service. The TPM's count of wrong PINs is shared
//! by every PIN protector on the machine, so a caller guessing at their own protector spends
//! everyone's tries. Before any method lets the TPM check a PIN for a caller other than root:
//! - the protector must be the caller's own;
//! - the library's one rule ([`PinTries::may_try`]) must allow a try: while the last
//!   `tpm2.min_local_tries` tries remain, only someone at the device (the caller's process is in
//!   a local, active seat session, as logind says) may spend them; and one try per uid per
//!   [`PinTries::MIN_INTERVAL`].
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use dirseal::ids::ProtectorId;
use dirseal::ops::Dirseal;
use dirseal::protector::Ask;

const LOGIN1: &str = "org.freedesktop.login1";
use dirseal::tpm2::PinTries;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};

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
    rule.may_try(at_device(caller), since).map_err(|e| Error::denied(e.to_string()))?;
    last.insert(caller.uid, Instant::now());
    Ok(())
}

/// Whether the caller's process is in a local, active seat session (logind's `Active`, not
/// `Remote`, with a seat). Any doubt — no pid, no logind, no session — means not at the device.
fn at_device(caller: &Caller) -> bool {
    let (Some(pid), Some(conn)) = (caller.pid, caller.bus()) else { return false };
    let manager = zbus::block_on(conn.call_method(
        Some(LOGIN1),
        "/org/freedesktop/login1",
        Some("org.freedesktop.login1.Manager"),
        "GetSessionByPID",
        &pid,
    ));
    let Ok(session) = manager.and_then(|m| m.body().deserialize::<OwnedObjectPath>()) else { return false };
    let prop = |name: &str| -> Option<OwnedValue> {
        let reply = zbus::block_on(conn.call_method(
            Some(LOGIN1),
            session.as_str(),
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &("org.freedesktop.login1.Session", name),
        ));
        reply.and_then(|m| m.body().deserialize::<OwnedValue>()).ok()
    };
    let active = prop("Active").and_then(|v| bool::try_from(v).ok()) == Some(true);
    let remote = prop("Remote").and_then(|v| bool::try_from(v).ok()) != Some(false);
    let seat =
        prop("Seat").and_then(|v| <(String, OwnedObjectPath)>::try_from(v).ok()).is_some_and(|(id, _)| !id.is_empty());
    active && !remote && seat
}
