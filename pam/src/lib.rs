//! `pam_dirseal.so`: unlock a dirseal-encrypted home at login, lock it at the last logout, and
//! follow password changes (docs/pam.md).
//!
//! The module acts for root on behalf of whoever runs the PAM stack (`su`, `sudo`, a display
//! manager), so it trusts nothing they control: it never reads the environment; its settings come
//! only from module arguments and the root-owned config; the home comes from the passwd database;
//! and a key is used only if it hashes to the identifier the kernel reports for that home.
#![deny(unsafe_code)]

mod ffi;
mod session;

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use dirseal::config::DEFAULT_CONFIG_PATH;
use dirseal::fscrypt::{self, KeyStatus};
use dirseal::keystore::{self, KeystoreError, ProtectorKind, ProtectorRecord};
use dirseal::ops::{Dirseal, OpsError};
use dirseal::secret::Passphrase;

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
                // Debug builds only: the tests load a debug build to exercise the panic guard.
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

/// Runs an entry point with the panic guard: a panic becomes PAM_SERVICE_ERR, never an abort of
/// the login program.
pub(crate) fn guard(
    h: *mut PamHandleT,
    argc: c_int,
    argv: *const *const c_char,
    f: fn(&Pam, &Args, c_int) -> c_int,
    flags: c_int,
) -> c_int {
    let Some(pam) = Pam::new(h) else { return PAM_SERVICE_ERR };
    let result = catch_unwind(AssertUnwindSafe(|| {
        let args = Args::parse(&pam, &ffi::args(argc, argv));
        if args.test_panic {
            panic!("test_panic module argument");
        }
        f(&pam, &args, flags)
    }));
    result.unwrap_or_else(|_| {
        pam.log(LOG_ERR, "internal error (panic) caught; returning PAM_SERVICE_ERR");
        PAM_SERVICE_ERR
    })
}

/// What dirseal knows about a user's home.
enum Home {
    /// Not encrypted, or no policy in the keystore: another module's business.
    Unmanaged,
    /// A conversion of the home has not reached its swap yet.
    Converting,
    Managed {
        ds: Box<Dirseal>,
        policy: dirseal::keystore::PolicyRecord,
    },
}

fn home_state(pam: &Pam, args: &Args, acct: &Account) -> Result<Home, String> {
    // A conversion in progress leaves the home plaintext until the swap: check it first.
    if dirseal::convert::in_progress(&acct.home).unwrap_or(false) {
        return Ok(Home::Converting);
    }
    match fscrypt::get_policy(&acct.home) {
        Ok(Some(_)) => {}
        Ok(None) => return Ok(Home::Unmanaged),
        Err(e) => {
            if args.debug {
                pam.log(LOG_DEBUG, &format!("{}: {e}; not managed", acct.home.display()));
            }
            return Ok(Home::Unmanaged);
        }
    }
    let ds = Dirseal::open_existing(args.config(), args.keystore.as_deref()).map_err(|e| e.to_string())?;
    match ds.managed_policy(&acct.home) {
        Ok(Some(policy)) => Ok(Home::Managed { ds: Box::new(ds), policy }),
        Ok(None) => Ok(Home::Unmanaged),
        Err(e) => Err(e.to_string()),
    }
}

pub(crate) fn authenticate(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_USER_UNKNOWN };
    let (ds, policy) = match home_state(pam, args, &acct) {
        Ok(Home::Unmanaged) => return PAM_USER_UNKNOWN,
        Ok(Home::Converting) => return converting(pam, args, &acct, flags),
        Ok(Home::Managed { ds, policy }) => (ds, policy),
        Err(e) => {
            pam.log(LOG_ERR, &format!("cannot read the dirseal keystore for {}: {e}", acct.name));
            return PAM_AUTHINFO_UNAVAIL;
        }
    };
    // Kinds that need no typing (TPM without PIN, FIDO2) will be tried here first; today every
    // login protector is a password protector, tried with one typed secret.
    let protectors = ds.login_protectors(&policy, acct.uid);
    if protectors.is_empty() {
        pam.log(
            LOG_NOTICE,
            &format!("{} has no password protector usable at login; stepping aside", acct.home.display()),
        );
        return PAM_USER_UNKNOWN;
    }
    let password = match pam.authtok(PAM_AUTHTOK) {
        Some(pw) => pw,
        None => match pam.prompt_secret("Password: ") {
            Ok(pw) => {
                // Later modules (pam_unix with use_first_pass, keyrings) reuse it.
                pam.set_authtok(PAM_AUTHTOK, &pw);
                pw
            }
            Err(code) => return code,
        },
    };
    for rec in &protectors {
        match ds.master_key_with_password(&policy, rec, &password) {
            Ok(master) => {
                if !pam.set_master(MASTER_DATA, master) {
                    pam.log(LOG_ERR, "cannot keep the key for the session (pam_set_data failed)");
                    return PAM_SYSTEM_ERR;
                }
                if args.debug {
                    pam.log(LOG_DEBUG, &format!("{}: protector {} ({}) accepted", acct.name, rec.id, rec.name));
                }
                return PAM_SUCCESS;
            }
            Err(OpsError::Keystore(KeystoreError::IncorrectSecret { .. })) => {}
            Err(e) => pam.log(LOG_WARNING, &format!("{}: protector {}: {e}", acct.name, rec.id)),
        }
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

fn converting(pam: &Pam, args: &Args, acct: &Account, flags: c_int) -> c_int {
    let allowed = Dirseal::open_existing(args.config(), args.keystore.as_deref())
        .map(|ds| ds.config().pam.allow_login_during_conversion)
        .unwrap_or(false);
    if allowed {
        // The home is still plaintext: nothing to unlock, so the rest of the stack decides.
        return PAM_USER_UNKNOWN;
    }
    if flags & PAM_SILENT == 0 {
        pam.error_msg("Encryption of your home directory is in progress; you can log in once it has finished.");
    }
    pam.log(LOG_NOTICE, &format!("refusing login of {}: conversion of {} in progress", acct.name, acct.home.display()));
    PAM_AUTH_ERR
}

pub(crate) fn open_session(pam: &Pam, args: &Args, _flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    let (ds, policy) = match home_state(pam, args, &acct) {
        Ok(Home::Managed { ds, policy }) => (ds, policy),
        Ok(_) => return PAM_IGNORE,
        Err(e) => {
            pam.log(LOG_ERR, &format!("{}: {e}", acct.name));
            return PAM_SESSION_ERR;
        }
    };
    if let Some(master) = pam.master(MASTER_DATA) {
        if let Err(e) = ds.add_key(&acct.home, &master) {
            pam.log(LOG_ERR, &format!("cannot unlock {}: {e}", acct.home.display()));
            return PAM_SESSION_ERR;
        }
        pam.clear_master(MASTER_DATA);
    } else {
        let present = fscrypt::mount_point(&acct.home)
            .and_then(|mp| fscrypt::key_status(&mp, &policy.id))
            .is_ok_and(|s| s == KeyStatus::Present);
        if !present {
            pam.log(
                LOG_NOTICE,
                &format!("{} stays locked: the password did not go through pam_dirseal's auth", acct.home.display()),
            );
        }
    }
    if let Err(e) = session::adjust(args.rundir(), acct.uid, 1) {
        pam.log(LOG_WARNING, &format!("session count for uid {}: {e}", acct.uid));
    }
    PAM_SUCCESS
}

pub(crate) fn close_session(pam: &Pam, args: &Args, _flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    let ds = match home_state(pam, args, &acct) {
        Ok(Home::Managed { ds, .. }) => ds,
        Ok(_) => return PAM_IGNORE,
        Err(e) => {
            pam.log(LOG_ERR, &format!("{}: {e}", acct.name));
            return PAM_SESSION_ERR;
        }
    };
    let left = match session::adjust(args.rundir(), acct.uid, -1) {
        Ok(n) => n,
        Err(e) => {
            // Without a trustworthy count, locking could pull the key from under another session.
            pam.log(LOG_WARNING, &format!("session count for uid {}: {e}; not locking", acct.uid));
            return PAM_SUCCESS;
        }
    };
    if left > 0 || args.unlock_only {
        return PAM_SUCCESS;
    }
    match ds.lock(&acct.home, false) {
        Ok(r) if r.locked => pam.log(LOG_NOTICE, &format!("locked {}", acct.home.display())),
        Ok(r) => {
            let holders: Vec<String> =
                r.busy.iter().map(|p| format!("pid {} ({}): {}", p.pid, p.comm, p.how)).collect();
            pam.log(
                LOG_NOTICE,
                &format!(
                    "{} is only partly locked: files are still open{}{}; `dirseal lock {}` finishes once they close",
                    acct.home.display(),
                    if holders.is_empty() { "" } else { " by " },
                    holders.join(", "),
                    acct.home.display()
                ),
            );
        }
        Err(e) => pam.log(LOG_ERR, &format!("cannot lock {}: {e}", acct.home.display())),
    }
    PAM_SUCCESS
}

/// The protector a password change updates: the user's own password protector of the home.
fn own_protector(ds: &Dirseal, policy: &dirseal::keystore::PolicyRecord, uid: u32) -> Option<ProtectorRecord> {
    ds.login_protectors(policy, uid).into_iter().find(|r| r.uid == Some(uid) || r.uid.is_none())
}

pub(crate) fn chauthtok(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_USER_UNKNOWN };
    let (ds, policy) = match home_state(pam, args, &acct) {
        Ok(Home::Managed { ds, policy }) => (ds, policy),
        Ok(_) => return PAM_IGNORE,
        Err(e) => {
            pam.log(LOG_ERR, &format!("{}: {e}", acct.name));
            return PAM_AUTHTOK_ERR;
        }
    };
    let Some(rec) = own_protector(&ds, &policy, acct.uid) else {
        pam.log(
            LOG_NOTICE,
            &format!("{} has no password protector of {}; not following the change", acct.home.display(), acct.name),
        );
        return PAM_IGNORE;
    };
    let hint = format!(
        "dirseal: the encrypted home {} still opens with the old password. Run `dirseal change-password {}` (it asks for the old one), or restore access with `dirseal recovery restore {}`.",
        acct.home.display(),
        acct.home.display(),
        acct.home.display()
    );
    let old = match pam.authtok(PAM_OLDAUTHTOK) {
        Some(pw) => pw,
        None => match pam.prompt_secret("Current password (empty to skip the encrypted home): ") {
            Ok(pw) if !pw.is_empty() => {
                pam.set_authtok(PAM_OLDAUTHTOK, &pw);
                pw
            }
            // Root resetting a password it does not know: the system password may still change.
            _ => {
                pam.error_msg(&hint);
                return PAM_IGNORE;
            }
        },
    };
    let pkey = match keystore::unlock_protector(&rec, &old) {
        Ok(k) => k,
        Err(KeystoreError::IncorrectSecret { .. }) => {
            pam.error_msg("dirseal: the current password is not the password of your encrypted home.");
            return PAM_AUTHTOK_RECOVERY_ERR;
        }
        Err(e) => {
            pam.log(LOG_ERR, &format!("{}: {e}", rec.id));
            return PAM_AUTHTOK_ERR;
        }
    };
    if flags & PAM_PRELIM_CHECK != 0 {
        return PAM_SUCCESS;
    }
    if flags & PAM_UPDATE_AUTHTOK == 0 {
        return PAM_SERVICE_ERR;
    }
    let new = match pam.authtok(PAM_AUTHTOK) {
        Some(pw) => pw,
        None => match ask_new(pam) {
            Ok(pw) => pw,
            Err(code) => return code,
        },
    };
    let ProtectorKind::Password { kdf, .. } = rec.kind;
    let kdf = ds.config().argon2.unwrap_or(kdf);
    match ds.change_password_with(&rec.id, &pkey, &new, kdf) {
        Ok(_) => {
            pam.log(LOG_NOTICE, &format!("password protector {} of {} follows the new password", rec.id, acct.name));
            PAM_SUCCESS
        }
        Err(e) => {
            pam.log(LOG_ERR, &format!("cannot rewrap protector {}: {e}", rec.id));
            pam.error_msg(&hint);
            PAM_AUTHTOK_ERR
        }
    }
}

fn ask_new(pam: &Pam) -> Result<Passphrase, c_int> {
    let a = pam.prompt_secret("New password: ")?;
    let b = pam.prompt_secret("Retype new password: ")?;
    if a != b || a.is_empty() {
        pam.error_msg("dirseal: the new passwords are empty or differ; nothing was changed.");
        return Err(PAM_AUTHTOK_ERR);
    }
    pam.set_authtok(PAM_AUTHTOK, &a);
    Ok(a)
}

pub(crate) fn setcred(_pam: &Pam, _args: &Args, _flags: c_int) -> c_int {
    PAM_SUCCESS
}

pub(crate) fn acct_mgmt(pam: &Pam, args: &Args, _flags: c_int) -> c_int {
    match account(pam).map(|a| home_state(pam, args, &a)) {
        Some(Ok(Home::Managed { .. })) => PAM_SUCCESS,
        _ => PAM_IGNORE,
    }
}
