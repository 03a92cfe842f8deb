//! `pam_dirseal.so`: unlock a dirseal-encrypted home at login, lock it at the last logout, and
//! follow password changes (docs/pam.md).
//!
//! The module acts for root on behalf of whoever runs the PAM stack (`su`, `sudo`, a display
//! manager), so it trusts nothing they control: it never reads the environment; its settings come
//! only from module arguments and the root-owned config; the home comes from the passwd database;
//! the keystore record is looked up by the identifier the kernel reports for the home and must
//! carry that identifier; and a key is used only if it hashes to that identifier.
#![deny(unsafe_code)]

mod ffi;
mod session;

use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use dirseal::config::DEFAULT_CONFIG_PATH;
use dirseal::fscrypt::{self, KeyStatus};
use dirseal::keystore::PolicyRecord;
use dirseal::ops::{Dirseal, OpsError};
use dirseal::protector::{self, ProtectorError, ProtectorRecord, Secret};
use dirseal::secret::Passphrase;
use dirseal::ui::{SecretPrompt, Ui, UiError};

use ffi::*;

/// Where `auth` leaves the unwrapped master key for `open_session`.
const MASTER_DATA: &CStr = c"dirseal_master_key";
const DEFAULT_RUNDIR: &str = "/run/dirseal";

/// Module arguments: the only settings besides the root-owned config.
#[derive(Debug, Default)]
struct Args {
    config: Option<PathBuf>,
    keystore: Option<PathBuf>,
    rundir: Option<PathBuf>,
    unlock_only: bool,
    debug: bool,
    /// Makes the entry point panic, to test the panic guard with the real module.
    test_panic: bool,
}

impl Args {
    fn parse(pam: &Pam, raw: &[String]) -> Args {
        let mut a = Args::default();
        let abs = |v: &str| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
        for arg in raw {
            match arg.split_once('=') {
                Some(("config", v)) if abs(v).is_some() => a.config = abs(v),
                Some(("keystore", v)) if abs(v).is_some() => a.keystore = abs(v),
                Some(("rundir", v)) if abs(v).is_some() => a.rundir = abs(v),
                None if arg == "unlock_only" => a.unlock_only = true,
                None if arg == "debug" => a.debug = true,
                // Debug builds only: the tests load a debug build to exercise the panic guard, and
                // a release build must not carry a switch that turns every login into an error.
                None if arg == "test_panic" && cfg!(debug_assertions) => a.test_panic = true,
                _ => pam.log(
                    LOG_WARNING,
                    &format!("ignoring unknown or invalid module argument {arg:?} (paths must be absolute)"),
                ),
            }
        }
        a
    }

    fn config(&self) -> &Path {
        self.config.as_deref().unwrap_or(Path::new(DEFAULT_CONFIG_PATH))
    }

    fn rundir(&self) -> &Path {
        self.rundir.as_deref().unwrap_or(Path::new(DEFAULT_RUNDIR))
    }

    fn open(&self) -> Result<Dirseal, OpsError> {
        Dirseal::open_existing(self.config(), self.keystore.as_deref())
    }
}

/// The account being served, from the passwd database (never from the caller's environment).
struct Account {
    name: String,
    uid: u32,
    home: PathBuf,
}

fn account(pam: &Pam) -> Option<Account> {
    let name = pam.user()?;
    match nix::unistd::User::from_name(&name) {
        Ok(Some(u)) => Some(Account { name, uid: u.uid.as_raw(), home: u.dir }),
        _ => None,
    }
}

/// Runs an entry point with the panic guard: a panic becomes PAM_SERVICE_ERR, never an unwind
/// into libpam (undefined behaviour) or an abort of the login program.
pub(crate) fn guard(
    pam: &Pam,
    raw_args: impl FnOnce() -> Vec<String>,
    f: fn(&Pam, &Args, c_int) -> c_int,
    flags: c_int,
) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let args = Args::parse(pam, &raw_args());
        if args.test_panic {
            panic!("test_panic module argument");
        }
        f(pam, &args, flags)
    }));
    result.unwrap_or_else(|_| {
        pam.log(LOG_ERR, "internal error (panic) caught; returning PAM_SERVICE_ERR");
        PAM_SERVICE_ERR
    })
}

/// Tells the user `text` through the conversation (unless the application asked for silence)
/// and always logs it, so an administrator sees what the user was told.
fn tell(pam: &Pam, flags: c_int, priority: c_int, text: &str) {
    pam.log(priority, text);
    if flags & PAM_SILENT == 0 {
        pam.error_msg(text);
    }
}

/// What dirseal knows about a user's home.
enum Home {
    /// Not encrypted, or no policy in the keystore: another module's business.
    Unmanaged,
    /// A conversion of the home has not reached its swap yet.
    Converting,
    Managed {
        ds: Box<Dirseal>,
        policy: PolicyRecord,
    },
}

fn home_state(pam: &Pam, args: &Args, acct: &Account) -> Result<Home, String> {
    // A conversion in progress leaves the home plaintext until the swap: check it first.
    if dirseal::convert::in_progress(&acct.home).unwrap_or(false) {
        return Ok(Home::Converting);
    }
    let kernel = match fscrypt::get_policy(&acct.home) {
        Ok(Some(p)) => p,
        Ok(None) => return Ok(Home::Unmanaged),
        Err(e) => {
            if args.debug {
                pam.log(LOG_DEBUG, &format!("{}: {e}; not managed", acct.home.display()));
            }
            return Ok(Home::Unmanaged);
        }
    };
    let ds = args.open().map_err(|e| e.to_string())?;
    match ds.managed_policy(&acct.home) {
        // managed_policy looks the record up by the kernel's identifier; checking it again here
        // keeps that the invariant this module relies on, whatever the lookup becomes.
        Ok(Some(policy)) if policy.id == kernel.identifier => Ok(Home::Managed { ds: Box::new(ds), policy }),
        Ok(Some(policy)) => Err(format!(
            "the keystore record {} does not describe {} (the kernel says policy {}); run `dirseal status {}`",
            policy.id,
            acct.home.display(),
            kernel.identifier,
            acct.home.display()
        )),
        Ok(None) => Ok(Home::Unmanaged),
        Err(e) => Err(e.to_string()),
    }
}

pub(crate) fn authenticate(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_USER_UNKNOWN };
    let (ds, policy) = match home_state(pam, args, &acct) {
        Ok(Home::Unmanaged) => return PAM_USER_UNKNOWN,
        Ok(Home::Converting) => return converting(pam, args, &acct, flags, (PAM_USER_UNKNOWN, PAM_AUTH_ERR)),
        Ok(Home::Managed { ds, policy }) => (ds, policy),
        Err(e) => {
            pam.log(LOG_ERR, &format!("cannot read the dirseal keystore for {}: {e}", acct.name));
            return PAM_AUTHINFO_UNAVAIL;
        }
    };
    // The library's login order: protectors that need no typing are tried before anything is
    // asked; every password protector then gets the one login password.
    if ds.login_protectors(&policy, acct.uid).is_empty() {
        pam.log(LOG_NOTICE, &format!("{} has no protector usable at login; stepping aside", acct.home.display()));
        return PAM_USER_UNKNOWN;
    }
    let mut ui = LoginUi { pam, flags, password: None, failed: None };
    let login = match ds.login(&policy, acct.uid, &mut ui) {
        Ok(l) => l,
        Err(e) => {
            if ui.failed.is_none() {
                pam.log(LOG_ERR, &format!("{}: {e}", acct.name));
            }
            return ui.failed.unwrap_or(PAM_AUTH_ERR);
        }
    };
    for (id, e) in &login.problems {
        pam.log(LOG_WARNING, &format!("{}: protector {id}: {e}", acct.name));
    }
    if let Some((rec, master)) = login.opened {
        if !pam.set_master(MASTER_DATA, master) {
            pam.log(LOG_ERR, "cannot keep the key for the session (pam_set_data failed)");
            return PAM_SYSTEM_ERR;
        }
        if args.debug {
            pam.log(LOG_DEBUG, &format!("{}: protector {} ({}) accepted", acct.name, rec.id, rec.name));
        }
        return PAM_SUCCESS;
    }
    pam.log(
        LOG_NOTICE,
        &format!(
            "authentication failure for {}: no protector of {} accepted the password",
            acct.name,
            acct.home.display()
        ),
    );
    PAM_AUTH_ERR
}

/// The login's [`Ui`]: every password prompt is answered with the one login password (the
/// stack's PAM_AUTHTOK, else asked once and left there for later modules); a PIN is asked
/// through the conversation; a touch is announced. Nothing else is asked at login.
struct LoginUi<'a> {
    pam: &'a Pam,
    flags: c_int,
    password: Option<Passphrase>,
    /// The PAM code of a failed conversation, which becomes the entry point's answer.
    failed: Option<c_int>,
}

impl LoginUi<'_> {
    fn prompt(&mut self, text: &str) -> Result<Passphrase, UiError> {
        self.pam.prompt_secret(text).map_err(|code| {
            self.failed = Some(code);
            UiError::Cancelled
        })
    }
}

impl Ui for LoginUi<'_> {
    fn secret(&mut self, prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        match prompt {
            SecretPrompt::Password { .. } => {
                if let Some(pw) = &self.password {
                    return Ok(pw.duplicate());
                }
                let pw = match self.pam.authtok(PAM_AUTHTOK) {
                    Some(pw) => pw,
                    None => {
                        let pw = self.prompt("Password: ")?;
                        // Later modules (pam_unix with use_first_pass, keyrings) reuse it.
                        self.pam.set_authtok(PAM_AUTHTOK, &pw);
                        pw
                    }
                };
                self.password = Some(pw.duplicate());
                Ok(pw)
            }
            SecretPrompt::Pin { name, .. } => self.prompt(&format!("PIN for {name}: ")),
            SecretPrompt::NewPassword { .. } | SecretPrompt::NewPin { .. } | SecretPrompt::RecoveryKey { .. } => {
                Err(UiError::Cancelled)
            }
        }
    }

    fn touch(&mut self, name: &str, _id: Option<&dirseal::ids::ProtectorId>) {
        if self.flags & PAM_SILENT == 0 {
            self.pam.info_msg(&format!("Touch your security key ({name})."));
        }
    }
}

/// A login while the home is being converted: `refused` unless the config allows it, then
/// `allowed` (the home is still plaintext: nothing to unlock, so the rest of the stack decides).
fn converting(pam: &Pam, args: &Args, acct: &Account, flags: c_int, (allowed, refused): (c_int, c_int)) -> c_int {
    if args.open().is_ok_and(|ds| ds.config().pam.allow_login_during_conversion) {
        return allowed;
    }
    pam.log(LOG_NOTICE, &format!("refusing login of {}: conversion of {} in progress", acct.name, acct.home.display()));
    if flags & PAM_SILENT == 0 {
        pam.error_msg(
            "Encryption of your home directory is in progress; you can log in once it has finished \
             (an administrator can follow it with `dirseal convert --status`).",
        );
    }
    refused
}

pub(crate) fn open_session(pam: &Pam, args: &Args, _flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    let (ds, policy) = match home_state(pam, args, &acct) {
        Ok(Home::Managed { ds, policy }) => (ds, policy),
        // Counted too: the home becomes managed when the conversion swaps, and the sessions open
        // by then must keep the last logout from locking it under them.
        Ok(Home::Converting) => {
            count(pam, args, &acct, 1);
            return PAM_IGNORE;
        }
        Ok(Home::Unmanaged) => return PAM_IGNORE,
        Err(e) => {
            pam.log(LOG_ERR, &format!("{}: {e}", acct.name));
            return PAM_SESSION_ERR;
        }
    };
    let mut result = PAM_SUCCESS;
    if let Some(master) = pam.master(MASTER_DATA) {
        // The key was checked against this policy in auth; the home could have been re-encrypted
        // since (a long-running login screen), so check again against what the kernel says now.
        if fscrypt::key_identifier(&master) != policy.id {
            pam.log(LOG_ERR, &format!("{}: the key from auth is not this home's key any more", acct.home.display()));
            result = PAM_SESSION_ERR;
        } else if let Err(e) = ds.add_key(&acct.home, &master) {
            pam.log(LOG_ERR, &format!("cannot unlock {}: {e}", acct.home.display()));
            result = PAM_SESSION_ERR;
        }
        pam.clear_master(MASTER_DATA);
    } else {
        let present = fscrypt::mount_point(&acct.home)
            .and_then(|mp| fscrypt::key_status(&mp, &policy.id))
            .is_ok_and(|s| s == KeyStatus::Present);
        if !present {
            pam.log(
                LOG_NOTICE,
                &format!(
                    "{} stays locked: the password did not go through pam_dirseal's auth (key or token login, \
                     or another module); unlock it with `dirseal unlock {}`",
                    acct.home.display(),
                    acct.home.display()
                ),
            );
        }
    }
    // Counted even when unlocking failed: close_session will decrement for this session too.
    count(pam, args, &acct, 1);
    result
}

/// Adjusts the user's session count; `None` when it cannot be trusted.
fn count(pam: &Pam, args: &Args, acct: &Account, delta: i64) -> Option<u64> {
    match session::adjust(args.rundir(), acct.uid, delta) {
        Ok(n) => {
            if args.debug {
                pam.log(LOG_DEBUG, &format!("uid {}: {n} session(s)", acct.uid));
            }
            Some(n)
        }
        Err(e) => {
            pam.log(LOG_WARNING, &format!("session count for uid {}: {e}", acct.uid));
            None
        }
    }
}

pub(crate) fn close_session(pam: &Pam, args: &Args, _flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    let ds = match home_state(pam, args, &acct) {
        Ok(Home::Managed { ds, .. }) => ds,
        Ok(Home::Converting) => {
            count(pam, args, &acct, -1);
            return PAM_IGNORE;
        }
        Ok(Home::Unmanaged) => return PAM_IGNORE,
        Err(e) => {
            pam.log(LOG_ERR, &format!("{}: {e}", acct.name));
            return PAM_SESSION_ERR;
        }
    };
    // Without a trustworthy count, locking could pull the key from under another session.
    let Some(left) = count(pam, args, &acct, -1) else {
        pam.log(LOG_WARNING, &format!("not locking {}: the session count is unknown", acct.home.display()));
        return PAM_SUCCESS;
    };
    if left > 0 || args.unlock_only {
        return PAM_SUCCESS;
    }
    match ds.lock(&acct.home, false) {
        Ok(r) if r.locked => pam.log(LOG_NOTICE, &format!("locked {}", acct.home.display())),
        Ok(r) if r.files_busy => {
            let holders: Vec<String> =
                r.busy.iter().map(|p| format!("pid {} ({}): {}", p.pid, p.comm, p.how)).collect();
            pam.log(
                LOG_NOTICE,
                &format!(
                    "{} is only partly locked: files are still open{}{}; `dirseal lock {}` finishes once they \
                     close (docs/pam.md: systemd --user)",
                    acct.home.display(),
                    if holders.is_empty() { "" } else { " by " },
                    holders.join(", "),
                    acct.home.display()
                ),
            );
        }
        Ok(r) if r.other_users => pam.log(
            LOG_NOTICE,
            &format!(
                "{} stays unlocked: other users added its key too; `dirseal lock --all-users {}` removes every claim",
                acct.home.display(),
                acct.home.display()
            ),
        ),
        Ok(_) => pam.log(LOG_WARNING, &format!("{} is still unlocked after removing the key", acct.home.display())),
        Err(e) => pam.log(LOG_ERR, &format!("cannot lock {}: {e}", acct.home.display())),
    }
    PAM_SUCCESS
}

/// The protector a password change updates: the user's own password protector of the home. A
/// protector nobody owns may open other directories too; the login password does not decide it.
fn own_protector(ds: &Dirseal, policy: &PolicyRecord, uid: u32) -> Option<ProtectorRecord> {
    ds.login_protectors(policy, uid)
        .into_iter()
        .find(|r| r.uid == Some(uid) && r.kind.ask().secret == Some(Secret::Password))
}

/// `passwd` runs this twice: PAM_PRELIM_CHECK (may the change happen?) then PAM_UPDATE_AUTHTOK.
/// With the pam-auth-update profile this module runs after pam_unix, which asked for the old and
/// new passwords and left them in PAM_OLDAUTHTOK/PAM_AUTHTOK.
pub(crate) fn chauthtok(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    let prelim = flags & PAM_PRELIM_CHECK != 0;
    if !prelim && flags & PAM_UPDATE_AUTHTOK == 0 {
        return PAM_SERVICE_ERR;
    }
    // Every "not ours" answer is PAM_IGNORE: the profile makes this module `required` in the
    // password stack, so anything else would block the change of an unrelated password.
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    let (ds, policy) = match home_state(pam, args, &acct) {
        Ok(Home::Managed { ds, policy }) => (ds, policy),
        Ok(_) => return PAM_IGNORE,
        Err(e) => {
            tell(
                pam,
                flags,
                LOG_ERR,
                &format!("dirseal: cannot read the keystore for {}: {e}; nothing was changed.", acct.home.display()),
            );
            return PAM_AUTHTOK_ERR;
        }
    };
    let home = acct.home.display();
    let Some(rec) = own_protector(&ds, &policy, acct.uid) else {
        if !prelim {
            tell(
                pam,
                flags,
                LOG_NOTICE,
                &format!(
                    "dirseal: {home} has no password protector belonging to {}, so it keeps opening with its \
                     current password; `dirseal status {home}` lists its protectors.",
                    acct.name
                ),
            );
        }
        return PAM_IGNORE;
    };
    let old = match pam.authtok(PAM_OLDAUTHTOK) {
        Some(pw) => pw,
        // Root resetting someone's password does not know the old one (pam_unix does not ask
        // root for it): the system password may change, the protector cannot. Say once, in the
        // update pass, what restores the match.
        None if nix::unistd::getuid().is_root() => {
            if !prelim {
                tell(
                    pam,
                    flags,
                    LOG_NOTICE,
                    &format!(
                        "dirseal: the encrypted home {home} still opens with {}'s old password, and logins check \
                         that one. Run `dirseal change-password {home} --protector {}` (asks the old password), \
                         or without it `dirseal recovery restore {home} --user {}` (asks the recovery key).",
                        acct.name, rec.id, acct.name
                    ),
                );
            }
            return PAM_IGNORE;
        }
        None => match pam.prompt_secret("Current password: ") {
            Ok(pw) => {
                pam.set_authtok(PAM_OLDAUTHTOK, &pw);
                pw
            }
            Err(code) => return code,
        },
    };
    let pkey = match protector::unlock(&rec, ds.config(), Some(&old)) {
        Ok(k) => k,
        Err(ProtectorError::IncorrectSecret { .. }) => {
            tell(
                pam,
                flags,
                LOG_NOTICE,
                &format!(
                    "dirseal: the current password does not open the encrypted home {home}; nothing was changed. \
                     If it has a different password, an administrator can align it with \
                     `dirseal change-password {home} --protector {}`.",
                    rec.id
                ),
            );
            return PAM_AUTHTOK_RECOVERY_ERR;
        }
        Err(e) => {
            tell(pam, flags, LOG_ERR, &format!("dirseal: cannot use protector {}: {e}; nothing was changed.", rec.id));
            return PAM_AUTHTOK_ERR;
        }
    };
    if prelim {
        return PAM_SUCCESS;
    }
    let new = match pam.authtok(PAM_AUTHTOK) {
        Some(pw) => pw,
        None => match ask_new(pam, flags) {
            Ok(pw) => pw,
            Err(code) => return code,
        },
    };
    // The protector keeps its Argon2id cost, as with `dirseal change-password`.
    match ds.change_secret_with(&rec.id, &pkey, Some(&new)) {
        Ok(_) => {
            pam.log(LOG_NOTICE, &format!("password protector {} of {} follows the new password", rec.id, acct.name));
            PAM_SUCCESS
        }
        Err(e) => {
            tell(
                pam,
                flags,
                LOG_ERR,
                &format!(
                    "dirseal: cannot update the password of {home} ({e}); it still opens with the old password. \
                     Run `dirseal change-password {home} --protector {}`.",
                    rec.id
                ),
            );
            PAM_AUTHTOK_ERR
        }
    }
}

fn ask_new(pam: &Pam, flags: c_int) -> Result<Passphrase, c_int> {
    let a = pam.prompt_secret("New password: ")?;
    let b = pam.prompt_secret("Retype new password: ")?;
    if a != b || a.is_empty() {
        tell(pam, flags, LOG_NOTICE, "dirseal: the new passwords are empty or differ; nothing was changed.");
        return Err(PAM_AUTHTOK_ERR);
    }
    pam.set_authtok(PAM_AUTHTOK, &a);
    Ok(a)
}

pub(crate) fn setcred(_pam: &Pam, _args: &Args, _flags: c_int) -> c_int {
    PAM_SUCCESS
}

/// Not in the default profile (docs/pam.md): an `account required` line additionally refuses
/// logins that skip auth (SSH keys) while the home is being converted. Everything else is ignored.
pub(crate) fn acct_mgmt(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    if dirseal::convert::in_progress(&acct.home).unwrap_or(false) {
        return converting(pam, args, &acct, flags, (PAM_IGNORE, PAM_PERM_DENIED));
    }
    PAM_IGNORE
}
