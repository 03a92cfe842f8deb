//! Logins (the one login order, for PAM and the service) and PIN-login accounts.
use std::path::PathBuf;

use super::{Dirseal, OpsError};
use crate::ids::ProtectorId;
use crate::keystore::PolicyRecord;
use crate::protector::{self, ProtectorError, ProtectorRecord, Standalone, UnlockError};
use crate::secret::{MasterKey, Passphrase};
use crate::ui::Ui;

/// What a login achieved: the protector that opened the home and its master key, if any, and
/// what went wrong with the others (for the log).
pub struct Login {
    /// The protector that opened the home and the master key it unwrapped; `None` if none did.
    pub opened: Option<(ProtectorRecord, MasterKey)>,
    /// Each protector that was tried and failed, with why.
    pub problems: Vec<(ProtectorId, OpsError)>,
}

impl Dirseal {
    /// The protectors a login of `uid` may try, in the one login order
    /// (kinds that need no typing first, then by name): only the user's own (`uid` = theirs). A protector shared
    /// into the directory by someone else opens it with the CLI but never logs anyone in.
    pub fn login_protectors(&self, policy: &PolicyRecord, uid: u32) -> Vec<ProtectorRecord> {
        let (mut list, _) = self.protectors_of(policy);
        list.retain(|r| r.uid == Some(uid) && r.kind.opens_login());
        protector::login_order(&mut list, uid);
        list
    }

    /// A login: tries `policy`'s [`Dirseal::login_protectors`] in order and returns the first that
    /// opens it, with the master key. The Ui is asked only for what each protector needs, so
    /// the ones needing no typing go first; a login Ui answers every password prompt with the one
    /// login password. A protector that fails for another reason than a wrong secret is reported in
    /// `problems` and the next one is tried; a Ui error (cancelled, conversation failed) ends it.
    pub fn login(&self, policy: &PolicyRecord, uid: u32, ui: &mut dyn Ui) -> Result<Login, OpsError> {
        self.login_where(policy, uid, ui, |_| true)
    }

    /// [`Dirseal::login`] over the login protectors `keep` accepts (asked of each just before it
    /// would be tried, in order). Those that need a security key's own PIN are never among them: a
    /// login has no such PIN, and offering it the password would spend the key's few tries.
    pub fn login_where(
        &self,
        policy: &PolicyRecord,
        uid: u32,
        ui: &mut dyn Ui,
        mut keep: impl FnMut(&ProtectorRecord) -> bool,
    ) -> Result<Login, OpsError> {
        // A touch is asked of whoever is at the machine: a login from elsewhere must not raise
        // one there, or anyone who knows the user's name logs in when a person at the device
        // touches their key. (An unlock by the user, already someone, may: `unlock_as_where`.)
        // This is about what the protector asks (any touch), not which kinds may log in alone.
        let at_device = ui.presence().at_device();
        self.first_opening(policy, uid, ui, |r| (at_device || !r.kind.ask().touch) && keep(r))
    }

    /// The first of `policy`'s login protectors of `uid` that `keep` accepts and that opens, in
    /// the login order (see [`Dirseal::login_where`]).
    pub(super) fn first_opening(
        &self,
        policy: &PolicyRecord,
        uid: u32,
        ui: &mut dyn Ui,
        mut keep: impl FnMut(&ProtectorRecord) -> bool,
    ) -> Result<Login, OpsError> {
        let mut problems = Vec::new();
        let mut list = self.login_protectors(policy, uid);
        list.retain(|r| r.kind.ask().secret != Some(protector::Secret::KeyPin));
        for rec in list {
            if !keep(&rec) {
                continue;
            }
            let pkey = match protector::unlock_with(&rec, &self.config, ui) {
                Ok(k) => k,
                Err(UnlockError::Ui(e)) => return Err(e.into()),
                Err(UnlockError::Protector(ProtectorError::IncorrectSecret { .. })) => continue,
                // No TPM on this machine, no security key holding the credential plugged in: the
                // usual case, nothing to report at every login.
                Err(UnlockError::Protector(ProtectorError::Unavailable(_))) => continue,
                Err(UnlockError::Protector(e)) => {
                    problems.push((rec.id, e.into()));
                    continue;
                }
            };
            match self.master_key(policy, &rec.id, &pkey) {
                Ok(master) => return Ok(Login { opened: Some((rec, master)), problems }),
                Err(e) => problems.push((rec.id, e)),
            }
        }
        Ok(Login { opened: None, problems })
    }
}

/// A TPM PIN for `uid`'s protector must not be `uid`'s login password (see
/// [`OpsError::PinIsLoginPassword`]). A shadow entry that cannot be read (not root, no entry)
/// has nothing to compare with.
pub(super) fn refuse_login_password_pin(uid: u32, pin: &Passphrase) -> Result<(), OpsError> {
    let Some(name) = crate::account::login_name(uid) else { return Ok(()) };
    if crate::account::password_is(&name, pin).unwrap_or(false) {
        return Err(OpsError::PinIsLoginPassword { user: name });
    }
    Ok(())
}

/// Whether `rec`'s kind declares it may log its user in with a PIN alone that its device counts
/// (a TPM PIN): what a PIN login (docs/pam.md) opens.
pub fn opens_pin_login(rec: &ProtectorRecord) -> bool {
    rec.kind.standalone_login() == Some(Standalone::Pin)
}

/// Whether `rec`'s kind declares it may log its user in with a touch alone (a security key
/// without PIN): what the PAM module's stand-alone pass tries first.
pub fn opens_touch_login(rec: &ProtectorRecord) -> bool {
    rec.kind.standalone_login() == Some(Standalone::Touch)
}

/// PIN-login accounts (docs/pam.md): log in with their TPM PIN alone, no password hash in
/// /etc/shadow, and `passwd` changes the PIN. Marked in the root-owned config (`[pam] pin_login`).
impl Dirseal {
    /// Whether `user` is a PIN-login account (`[pam] pin_login` in the configuration).
    pub fn is_pin_login(&self, user: &str) -> bool {
        self.config.pam.pin_login.iter().any(|u| u == user)
    }

    /// The protector a PIN login of `uid` opens `policy` with: their own first TPM PIN protector
    /// in the login order.
    pub fn pin_protector(&self, policy: &PolicyRecord, uid: u32) -> Option<ProtectorRecord> {
        self.login_protectors(policy, uid).into_iter().find(opens_pin_login)
    }

    /// Makes `user` a PIN-login account: their home must open with a TPM PIN protector of
    /// theirs. The config names them first, then their password hash is replaced by `*`; run
    /// again if the second step failed. Returns the protector their PIN opens.
    pub fn enable_pin_login(&mut self, user: &str) -> Result<ProtectorRecord, OpsError> {
        let (uid, home) = lookup_user(user)?;
        let name = crate::account::login_name(uid).unwrap_or_else(|| user.to_string());
        let policy = self.policy_of(&home)?;
        let rec = self.pin_protector(&policy, uid).ok_or(OpsError::NoPinProtector { user: name.clone(), home })?;
        if !self.is_pin_login(&name) {
            let mut config = self.config.clone();
            config.pam.pin_login.push(name.clone());
            config.save(&self.config_path)?;
            self.config = config;
        }
        crate::account::remove_password(&name)?;
        Ok(rec)
    }

    /// A TPM PIN protector of an ordinary account (not PIN-login) whose login password has a hash
    /// in /etc/shadow: the PAM module offers it the login password at every login, so its PIN is
    /// that password (docs/pam.md), and the hash lets anyone with the disk find it offline.
    pub(crate) fn pin_warning(&self, rec: &ProtectorRecord) -> Option<String> {
        let uid = rec.uid.filter(|_| opens_pin_login(rec))?;
        let user = crate::account::login_name(uid)?;
        if self.is_pin_login(&user) || !crate::account::shadow(&user).ok().flatten()?.has_hash {
            return None;
        }
        Some(format!(
            "TPM protector {} ({}) of {user}: if its PIN is {user}'s login password (the PAM module tries that at \
             every login), the password hash in /etc/shadow makes the PIN testable offline, without the TPM's \
             limit; give it a PIN of its own, or make {user} a PIN-login account (docs/pam.md)",
            rec.name, rec.id
        ))
    }

    /// Ends `user`'s PIN login: their password stack is `pam_unix`'s again, and until an
    /// administrator sets a password (`passwd USER`) the account has none.
    pub fn disable_pin_login(&mut self, user: &str) -> Result<(), OpsError> {
        let mut config = self.config.clone();
        config.pam.pin_login.retain(|u| u != user);
        if config != self.config {
            config.save(&self.config_path)?;
            self.config = config;
        }
        Ok(())
    }
}

/// Resolves `--user` (a name or a numeric uid) without trusting the environment.
pub fn lookup_user(user: &str) -> Result<(u32, PathBuf), OpsError> {
    let found = if let Ok(uid) = user.parse::<u32>() {
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
    } else {
        nix::unistd::User::from_name(user)
    };
    match found {
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.dir)),
        _ => Err(OpsError::NoSuchUser(user.to_string())),
    }
}
