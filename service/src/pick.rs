//! Which protector a call uses: one it names (the caller's own, with a TPM PIN try allowed now),
//! the caller's own when it names none, or one it enrols ([`Enrol`]).
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use dirseal::ids::ProtectorId;
use dirseal::keystore::PolicyRecord;
use dirseal::ops::{Dirseal, NewProtector, Pick, ProtectorChoice};
use dirseal::protector::NewKind;
use dirseal::secret::Passphrase;

use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::secrets::Secrets;

pub fn parse_protector_id(s: &str) -> Result<ProtectorId> {
    s.parse().map_err(|e| Error::invalid(format!("protector: {e}")))
}

/// Before the TPM checks a PIN for the caller: the service's part of the rule on PIN tries
/// ([`crate::pin`]). Root's calls that name no protector pass.
pub fn pin_try(ds: &Dirseal, caller: &Caller, protector: Option<ProtectorId>) -> Result<()> {
    protector.map_or(Ok(()), |id| crate::pin::may_try(ds, caller, &id))
}

/// The protector `id` as the caller may use it: theirs (root: any), and its PIN may be tried now.
pub fn check(ds: &Dirseal, caller: &Caller, id: ProtectorId) -> Result<()> {
    caller.check_protector(&ds.keystore().protector(&id)?)?;
    pin_try(ds, caller, Some(id))
}

/// The protector a call names by id, [`check`]ed.
pub fn named(ds: &Dirseal, caller: &Caller, named: &str) -> Result<ProtectorId> {
    let id = parse_protector_id(named)?;
    check(ds, caller, id)?;
    Ok(id)
}

/// The owner of `dir` when it is a real (non-root) account: a new password protector for a
/// directory belongs to its owner, so PAM later matches it by uid.
pub fn owner_of(dir: &Path) -> Option<u32> {
    let uid = std::fs::symlink_metadata(dir).ok()?.uid();
    (uid != 0).then_some(uid)
}

/// The protector a call names for `policy` (by id, or by the name of one of the caller's), or —
/// when it names none — the one to use: the caller's own when they are not root (the library's
/// "exactly one of yours"), else the library's pick.
pub fn choose(ds: &Dirseal, caller: &Caller, policy: &PolicyRecord, named: &str, dir: &Path) -> Result<Pick> {
    if !named.is_empty() {
        let rec = ds.protector_named(named, (!caller.is_root()).then_some(caller.uid))?;
        caller.check_protector(&rec)?;
        return Ok(Pick { protector: Some(rec.id) });
    }
    if caller.is_root() {
        return Ok(Pick::default());
    }
    Ok(Pick { protector: Some(ds.own_protector(policy, caller.uid, &dir.display().to_string())?) })
}

/// The protector a call enrols: an existing one (proved by the call's secret) or a new password
/// protector, named and owned by the core's rule ([`NewProtector::for_dir`]): a user's new
/// protector always belongs to them; root's to the directory's owner (or to nobody when root owns
/// it). Owned, so a job thread can carry it.
pub struct Enrol(ProtectorChoice<'static>);

impl Enrol {
    /// `protector` empty: a new password protector named `given` (empty: the core's default name)
    /// whose password is `secret`; otherwise that existing protector, which must be the caller's,
    /// proved by `secret`.
    pub fn new(
        ds: &Dirseal,
        caller: &Caller,
        dir: &Path,
        protector: &str,
        given: &str,
        secret: Passphrase,
        secrets: &mut Secrets,
    ) -> Result<Enrol> {
        if protector.is_empty() {
            secrets.new = Some(secret);
            let user = (!caller.is_root()).then_some(caller.uid);
            let name = (!given.is_empty()).then(|| given.to_string());
            let new = NewProtector::for_dir(dir, user, NewKind::login_default(), name);
            return Ok(Enrol(ProtectorChoice::New(new)));
        }
        let id = named(ds, caller, protector)?;
        secrets.current.push((Some(id), secret));
        Ok(Enrol(ProtectorChoice::Existing(id)))
    }

    /// No protector named, for resuming a conversion without a secret (its staging key is
    /// loaded): a resume makes no protector, and the new one's description is never used.
    pub fn none_named() -> Enrol {
        Enrol(ProtectorChoice::New(NewProtector::for_user(None, NewKind::login_default(), None::<&str>)))
    }

    pub fn choice(self) -> ProtectorChoice<'static> {
        self.0
    }
}
