//! `pam_dirseal.so`: unlock a dirseal-encrypted home at login with the password the system
//! accepted, lock it at the last logout, and follow password changes (docs/pam.md).
//!
//! The password database stays in charge of logins: `pam_unix` (or whatever the stack has)
//! authenticates; this module only *uses* the password it accepted to open the user's own
//! password protector, never authenticates anyone with it, and never fails a login because the
//! home stayed locked. So `passwd -l`, expiry and resets take effect at once, and a protector
//! shared into someone's home (another user's) never logs anyone in.
//!
//! The module acts for root on behalf of whoever runs the PAM stack (`su`, `sudo`, a display
//! manager), so it trusts nothing they control: it never reads the environment; its settings come
//! only from module arguments and the root-owned config; the home comes from the passwd database;
//! the keystore record is looked up by the identifier the kernel reports for the home and must
//! carry that identifier; and a key is used only if it hashes to that identifier. Run by anyone
//! but root (a screen locker checking the user's password) it steps aside.
#![deny(unsafe_code)]

pub mod account;
mod ffi;
mod remedy;
mod session;

use dirseal::convert::LoginDuring;
use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use dirseal::config::DEFAULT_CONFIG_PATH;
use dirseal::fscrypt::{self, KeyStatus};
use dirseal::keystore::PolicyRecord;
use dirseal::ops::{opens_pin_login, opens_touch_login};
use dirseal::ops::{Dirseal, OpsError};
use dirseal::presence::Presence;
use dirseal::protector::{self, ProtectorError, ProtectorRecord, Secret, UnlockError};
use dirseal::secret::Passphrase;
use dirseal::ui::{SecretPrompt, Ui, UiError};

use ffi::*;
use session::{Entry, Sessions};

/// Where `auth` leaves the unwrapped master key for `open_session`.
const MASTER_DATA: &CStr = c"dirseal_master_key";
/// Set by a `standalone` pass that asked for a touch, so the password pass after it does not
/// wait for the same key again.
const TOUCH_TRIED: &CStr = c"dirseal_touch_tried";
/// Where `open_session` leaves the session it recorded for `close_session`.
const SESSION_DATA: &CStr = c"dirseal_session";
/// Set once a session line did its work (recorded the session; ended it), so a second line of
/// this module in the same stack (the `dirseal-mkhome` profile's) does it only once.
const OPENED: &CStr = c"dirseal_session_opened";
const CLOSED: &CStr = c"dirseal_session_closed";
/// Where an `auth` line with `mkhome` keeps the accepted password of a user without a home, for
/// the session line's `mkhome` (libpam hides PAM_AUTHTOK from the session stack).
const NEW_HOME_PASSWORD: &CStr = c"dirseal_new_home_password";
const DEFAULT_RUNDIR: &str = "/run/dirseal";

/// Module arguments: the only settings besides the root-owned config.
#[derive(Debug, Default)]
struct Args {
    config: Option<PathBuf>,
    keystore: Option<PathBuf>,
    rundir: Option<PathBuf>,
    unlock_only: bool,
    /// This line logs users in on its own with a touch of their security key (`auth sufficient`
    /// before `pam_unix`); without it the module only uses the password the stack accepted.
    standalone: bool,
    /// This password line changes the TPM PIN of PIN-login accounts (`password [success=end
    /// default=ignore]` before `pam_unix`); everyone else is left to the rest of the stack.
    pin_accounts: bool,
    /// This session line creates a missing home, encrypted, with a protector from the login
    /// password, before it does what it always does (docs/pam.md): pam_mkhomedir's place.
    mkhome: bool,
    /// The skeleton `mkhome` copies in (default /etc/skel).
    skel: Option<PathBuf>,
    debug: bool,
    /// Makes the entry point panic, to test the panic guard with the real module.
    test_panic: bool,
    /// Pauses at named points, so the tests can line up a login against a logout.
    test_delays: Vec<(String, u64)>,
}

impl Args {
    fn parse(pam: &Pam, raw: &[String]) -> Args {
        let mut a = Args::default();
        let abs = |v: &str| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
        // Debug builds only: the tests load a debug build to exercise the panic guard and races,
        // and a release build must not carry switches that break or stall logins.
        let delay = |v: &str| {
            let (point, ms) = v.split_once(':')?;
            Some((point.to_string(), ms.parse::<u64>().ok()?.min(60_000)))
        };
        for arg in raw {
            match arg.split_once('=') {
                Some(("config", v)) if abs(v).is_some() => a.config = abs(v),
                Some(("keystore", v)) if abs(v).is_some() => a.keystore = abs(v),
                Some(("rundir", v)) if abs(v).is_some() => a.rundir = abs(v),
                Some(("skel", v)) if abs(v).is_some() => a.skel = abs(v),
                Some(("test_delay", v)) if cfg!(debug_assertions) && delay(v).is_some() => {
                    a.test_delays.extend(delay(v))
                }
                None if arg == "unlock_only" => a.unlock_only = true,
                None if arg == "standalone" => a.standalone = true,
                None if arg == "pin_accounts" => a.pin_accounts = true,
                None if arg == "mkhome" => a.mkhome = true,
                None if arg == "debug" => a.debug = true,
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

    /// Sleeps where a test asked to (never in release builds: the argument is not parsed there).
    fn pause(&self, point: &str) {
        for (_, ms) in self.test_delays.iter().filter(|(p, _)| p == point) {
            std::thread::sleep(std::time::Duration::from_millis(*ms));
        }
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
/// into libpam (undefined behaviour) or an abort of the login program. A caller without root's
/// rights (a screen locker, a user's own `pamtester`) cannot read the keystore or add keys:
/// the module steps aside for it rather than fail its stack.
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
        if !nix::unistd::geteuid().is_root() {
            if args.debug {
                pam.log(LOG_DEBUG, "not running as root (a screen locker?); stepping aside");
            }
            return PAM_IGNORE;
        }
        let _quiet = QuietTss2::new();
        f(pam, &args, flags)
    }));
    result.unwrap_or_else(|_| {
        pam.log(LOG_ERR, "internal error (panic) caught; returning PAM_SERVICE_ERR");
        PAM_SERVICE_ERR
    })
}

/// libtss2 writes every TPM error response (a wrong PIN) to the login program's stderr — the user's
/// terminal — as `ERROR:esys:...` lines; the module says what happened itself. Its level comes from
/// `TSS2_LOG`, read at its first message: set for the call when the application has not set it,
/// and taken out of the application's environment again after. (The login programs run their PAM
/// stack on one thread; the CLI does the same in `cli::main`.)
struct QuietTss2(bool);

impl QuietTss2 {
    fn new() -> Self {
        let set = std::env::var_os("TSS2_LOG").is_none();
        if set {
            std::env::set_var("TSS2_LOG", "all+NONE");
        }
        QuietTss2(set)
    }
}

impl Drop for QuietTss2 {
    fn drop(&mut self) {
        if self.0 {
            std::env::remove_var("TSS2_LOG");
        }
    }
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

/// The session lines' view of the home: `Some` when managed, `None` while a conversion runs;
/// `Err` is the PAM code to return (an unmanaged home is another module's business).
fn session_home(pam: &Pam, args: &Args, acct: &Account) -> Result<Option<(Box<Dirseal>, PolicyRecord)>, c_int> {
    match home_state(pam, args, acct) {
        Ok(Home::Managed { ds, policy }) => Ok(Some((ds, policy))),
        Ok(Home::Converting) => Ok(None),
        Ok(Home::Unmanaged) => Err(PAM_IGNORE),
        Err(e) => {
            pam.log(LOG_ERR, &format!("{}: {e}", acct.name));
            Err(PAM_SESSION_ERR)
        }
    }
}

fn home_state(pam: &Pam, args: &Args, acct: &Account) -> Result<Home, String> {
    // A conversion in progress leaves the home plaintext until the swap: check it first.
    if dirseal::convert::login_during(None, &acct.home).is_ok_and(|d| d != LoginDuring::NoConversion) {
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
    let ds = args.open().map_err(|e| remedy::why(&e))?;
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
        Err(e) => Err(remedy::why(&e)),
    }
}

/// `auth`, after the module that checked the password (the profile puts it in the additional
/// block, behind `pam_unix`): opens the user's own password protectors with the password that was
/// accepted and keeps the key for `open_session`. Always PAM_IGNORE: whatever the password opens,
/// this module never decides a login, so a misplaced line cannot turn it into an authenticator.
/// Only a line that says `standalone` logs users in, by a security key's touch ([`standalone`]).
pub(crate) fn authenticate(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    // An `mkhome` auth line only keeps the password of a user whose home is to be made.
    if args.mkhome {
        if new_home_wanted(pam, args, &acct) {
            if let Some(pw) = pam.authtok(PAM_AUTHTOK) {
                pam.set_secret(NEW_HOME_PASSWORD, pw);
            }
        }
        return PAM_IGNORE;
    }
    let (ds, policy) = match home_state(pam, args, &acct) {
        Ok(Home::Managed { ds, policy }) => (ds, policy),
        // A home being converted is still plaintext; `acct_mgmt` decides whether the login may go on.
        Ok(Home::Unmanaged | Home::Converting) => return PAM_IGNORE,
        Err(e) => {
            pam.log(LOG_ERR, &format!("cannot read the dirseal keystore for {}: {e}; home stays locked", acct.name));
            return PAM_IGNORE;
        }
    };
    if args.standalone {
        return standalone(pam, flags, &acct, &ds, &policy);
    }
    // The stand-alone pass already opened it (a stack that goes on after its success).
    if pam.master(MASTER_DATA).is_some() {
        return PAM_IGNORE;
    }
    let home = acct.home.display();
    // Only the user's own protectors: one shared into the home by another user opens it with the
    // CLI, never at this user's login.
    if ds.login_protectors(&policy, acct.uid).is_empty() {
        tell(
            pam,
            flags,
            LOG_NOTICE,
            &format!(
                "dirseal: your home {home} stays locked: none of its protectors belongs to {}; `dirseal status {home}` \
                 lists them, `dirseal unlock {home}` opens it",
                acct.name
            ),
        );
        return PAM_IGNORE;
    }
    // The library's login order: protectors that need no typing first, then every password
    // (and PIN) protector gets the one password the stack accepted. A key the stand-alone pass
    // already waited for is not waited for twice.
    let mut ui = LoginUi { pam, presence: presence(pam), flags, password: pam.authtok(PAM_AUTHTOK) };
    let tried = pam.flag(TOUCH_TRIED);
    let login = match ds.login_where(&policy, acct.uid, &mut ui, |r| !(tried && opens_touch_login(r))) {
        Ok(l) => l,
        Err(e) => {
            // A key or token login: no password went through the stack, and this module asks none.
            pam.log(LOG_NOTICE, &format!("{home} stays locked: {}", remedy::why(&e)));
            return PAM_IGNORE;
        }
    };
    for (id, e) in &login.problems {
        pam.log(LOG_WARNING, &format!("{}: protector {id}: {}", acct.name, remedy::why(e)));
    }
    if let Some((rec, master)) = login.opened {
        if !pam.set_master(MASTER_DATA, master) {
            pam.log(LOG_ERR, "cannot keep the key for the session (pam_set_data failed)");
        } else if args.debug {
            pam.log(LOG_DEBUG, &format!("{}: protector {} ({}) opened", acct.name, rec.id, rec.name));
        }
        if opens_pin_login(&rec) {
            pam.log(LOG_WARNING, &password_pin_warning(&acct.name, &rec));
        }
        return PAM_IGNORE;
    }
    let text = if !login.problems.is_empty() {
        format!(
            "dirseal: your home {home} stays locked: its protector could not be used (the system log says why); \
             `dirseal status {home}` shows what is wrong"
        )
    } else if let Some(rec) = own_protector(&ds, &policy, acct.uid) {
        // The system accepted this password but the home's protector wants another: the two
        // drifted apart (an administrator reset the system password). Log in, leave the home
        // locked, and name the one command that opens it and brings its password in line.
        format!(
            "dirseal: your home {home} stays locked: it still opens with your previous password, not the one you \
             just logged in with. Run `dirseal change-password {home} --protector {}` (as root) with the previous \
             password and then the current one; without the previous password, `dirseal recovery restore {home} \
             --user {}` uses the recovery key.",
            rec.id, acct.name
        )
    } else {
        format!(
            "dirseal: your home {home} stays locked: none of your protectors of it opens with your login password; \
             `dirseal unlock {home}` opens it"
        )
    };
    tell(pam, flags, LOG_NOTICE, &text);
    PAM_IGNORE
}

/// The warning for a TPM PIN that is the account's login password (docs/pam.md).
fn password_pin_warning(user: &str, rec: &ProtectorRecord) -> String {
    format!(
        "{user}: TPM protector {} ({}) opened with the login password: its hash in /etc/shadow makes this PIN \
         testable offline, without the TPM's limit on wrong guesses; give the protector a PIN of its own, or make \
         {user} a PIN-login account (`dirseal pin-login enable {user}`)",
        rec.id, rec.name
    )
}

/// The `standalone` pass (an `auth` line before `pam_unix`, docs/pam.md): logs the user in on
/// its own — unless the password database has closed the account — first with a touch of one of
/// their own security keys (nothing asked), else with the PIN of their own TPM protector ("PIN
/// for NAME (N tries left):"). Neither kind, no key plugged in, or an empty PIN: `PAM_IGNORE`,
/// and the stack goes on to the password. A wrong PIN (one TPM try spent): `PAM_AUTH_ERR`.
fn standalone(pam: &Pam, flags: c_int, acct: &Account, ds: &Dirseal, policy: &PolicyRecord) -> c_int {
    let touch = ds.login_protectors(policy, acct.uid).iter().any(opens_touch_login);
    let pin = ds.pin_protector(policy, acct.uid);
    if !touch && pin.is_none() {
        return PAM_IGNORE;
    }
    let pin_account = ds.is_pin_login(&acct.name);
    let allowed = if pin_account { account::pin_login_allowed } else { account::standalone_login_allowed };
    if let Err(r) = allowed(&acct.name) {
        pam.log(LOG_NOTICE, &format!("no stand-alone login for {}: {r}", acct.name));
        // A closed account ends the login here (with `auth_err=die`). A password that must be
        // changed first is pam_unix's to handle, and an account without a local shadow entry
        // (LDAP, sssd) is the next module's.
        return match r {
            account::Refusal::Locked(_) | account::Refusal::AccountExpired(_) => PAM_AUTH_ERR,
            _ => PAM_IGNORE,
        };
    }
    if touch {
        let mut ui = LoginUi { pam, presence: presence(pam), flags, password: None };
        let login = ds.login_where(policy, acct.uid, &mut ui, opens_touch_login);
        pam.set_flag(TOUCH_TRIED);
        match login {
            Ok(l) => {
                for (id, e) in &l.problems {
                    pam.log(LOG_WARNING, &format!("{}: protector {id}: {}", acct.name, remedy::why(e)));
                }
                if let Some((rec, master)) = l.opened {
                    return logged_in(pam, acct, &rec, master, "security key");
                }
            }
            Err(e) => pam.log(LOG_NOTICE, &format!("no security-key login for {}: {}", acct.name, remedy::why(&e))),
        }
    }
    let Some(rec) = pin else { return PAM_IGNORE };
    let mut ui = PinUi { pam, user: &acct.name, presence: presence(pam), current: false, answer: None };
    match protector::unlock_with(&rec, ds.config(), &mut ui) {
        Ok(pkey) => match ds.master_key(policy, &rec.id, &pkey) {
            Ok(master) => {
                let same =
                    ui.answer.as_ref().is_some_and(|p| dirseal::account::password_is(&acct.name, p).unwrap_or(false));
                if same && !pin_account {
                    pam.log(LOG_WARNING, &password_pin_warning(&acct.name, &rec));
                }
                logged_in(pam, acct, &rec, master, "TPM PIN")
            }
            Err(e) => {
                pam.log(LOG_ERR, &format!("{}: protector {}: {}", acct.name, rec.id, remedy::why(&e)));
                PAM_IGNORE
            }
        },
        // An empty PIN: the user chose the password instead; no try spent.
        Err(UnlockError::Ui(UiError::Cancelled)) => PAM_IGNORE,
        Err(UnlockError::Ui(e)) => {
            pam.log(LOG_NOTICE, &format!("no PIN login for {}: {e}", acct.name));
            PAM_IGNORE
        }
        Err(UnlockError::Protector(e)) if wrong_pin(&e) => {
            tell(pam, flags, LOG_NOTICE, &format!("Wrong PIN for {} ({e}).", acct.name));
            PAM_AUTH_ERR
        }
        Err(UnlockError::Protector(ProtectorError::Unavailable(_))) => PAM_IGNORE,
        // In lockout, refused over the network with few tries left, ...: the TPM was not asked.
        Err(UnlockError::Protector(e)) => {
            tell(pam, flags, LOG_NOTICE, &format!("dirseal: no PIN login for {}: {e}", acct.name));
            PAM_IGNORE
        }
    }
}

/// A wrong PIN, which cost one TPM try.
fn wrong_pin(e: &ProtectorError) -> bool {
    e.is_wrong_secret()
}

/// A stand-alone login succeeded: keeps the key for `open_session`.
fn logged_in(pam: &Pam, acct: &Account, rec: &ProtectorRecord, master: dirseal::secret::MasterKey, how: &str) -> c_int {
    if !pam.set_master(MASTER_DATA, master) {
        pam.log(LOG_ERR, "cannot keep the key for the session (pam_set_data failed)");
        return PAM_IGNORE;
    }
    pam.log(LOG_NOTICE, &format!("{} logged in with {how} protector {} ({})", acct.name, rec.id, rec.name));
    PAM_SUCCESS
}

/// The stand-alone PIN prompt, through the PAM conversation: "PIN for NAME (N tries left):".
/// An empty answer is [`UiError::Cancelled`]: nothing goes to the TPM.
struct PinUi<'a> {
    pam: &'a Pam,
    user: &'a str,
    presence: Presence,
    /// Asking the current PIN before a change ("Current PIN for ...").
    current: bool,
    /// The PIN typed, for the check against the login password after it opened.
    answer: Option<Passphrase>,
}

/// "PIN for alice (2 tries left): ".
fn pin_prompt(current: bool, user: &str, tries_left: Option<u32>) -> String {
    let what = if current { "Current PIN" } else { "PIN" };
    match tries_left {
        Some(1) => format!("{what} for {user} (1 try left): "),
        Some(n) => format!("{what} for {user} ({n} tries left): "),
        None => format!("{what} for {user}: "),
    }
}

impl Ui for PinUi<'_> {
    fn secret(&mut self, prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        let SecretPrompt::Pin { tries_left, .. } = prompt else { return Err(UiError::Cancelled) };
        let answer = self
            .pam
            .prompt_secret(&pin_prompt(self.current, self.user, *tries_left))
            .map_err(|_| UiError::NoInput { hint: "the PAM conversation failed".into() })?
            .ok_or(UiError::NoInput { hint: "no PIN was given".into() })?;
        if answer.is_empty() {
            return Err(UiError::Cancelled);
        }
        self.answer = Some(answer.duplicate());
        Ok(answer)
    }

    fn presence(&self) -> Presence {
        self.presence
    }
}

/// The login's [`Ui`]: every password or PIN prompt is answered with the password the stack
/// already accepted (PAM_AUTHTOK); nothing is ever asked. A touch is announced.
struct LoginUi<'a> {
    pam: &'a Pam,
    /// Where the person is ([`presence`]): TPM PINs from elsewhere are refused while tries are
    /// few, and no key touch logs anyone in from elsewhere.
    presence: Presence,
    flags: c_int,
    password: Option<Passphrase>,
}

impl Ui for LoginUi<'_> {
    fn secret(&mut self, prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        match prompt {
            SecretPrompt::Password { .. } | SecretPrompt::Pin { .. } => self
                .password
                .as_ref()
                .map(Passphrase::duplicate)
                .ok_or(UiError::NoInput { hint: "no password was accepted by the stack to open it with".into() }),
            SecretPrompt::NewPassword { .. }
            | SecretPrompt::NewPin { .. }
            | SecretPrompt::KeyPin { .. }
            | SecretPrompt::RecoveryKey { .. } => Err(UiError::Cancelled),
        }
    }

    fn presence(&self) -> Presence {
        self.presence
    }

    fn touch(&mut self, name: &str, _id: Option<&dirseal::ids::ProtectorId>) {
        if self.flags & PAM_SILENT == 0 {
            self.pam.info_msg(&format!("Touch your security key ({name})."));
        }
    }
}

/// Where the person logging in is, by the library's one rule ([`dirseal::presence`]): the items
/// the privileged program set (remote host, service, terminal) and the logind session this process
/// is in (`su` run from an SSH session is in that session). Never the environment.
fn presence(pam: &Pam) -> Presence {
    let (rhost, service, tty) = (pam.item(PAM_RHOST), pam.item(PAM_SERVICE).unwrap_or_default(), pam.item(PAM_TTY));
    dirseal::presence::Login {
        rhost: rhost.as_deref(),
        service: &service,
        tty: tty.as_deref(),
        session: dirseal::presence::session_of(std::process::id()),
    }
    .presence()
}

/// A login while the home is being converted, as [`dirseal::convert::login_during`] decides:
/// `allowed` (the home is still plaintext: nothing to unlock, so the rest of the stack decides)
/// for a live copy or one not started, for a copy only if the config allows it; a home being
/// moved (part of it may already be in the staging directory) is always `refused`.
fn converting(pam: &Pam, args: &Args, acct: &Account, flags: c_int, (allowed, refused): (c_int, c_int)) -> c_int {
    let ds = args.open().ok();
    let during = dirseal::convert::login_during(ds.as_ref(), &acct.home).unwrap_or(LoginDuring::Closed);
    let moving = during == LoginDuring::Closed;
    match during {
        LoginDuring::NoConversion | LoginDuring::Open => return allowed,
        LoginDuring::IfAllowed if ds.as_ref().is_some_and(|ds| ds.config().pam.allow_login_during_conversion) => {
            return allowed;
        }
        LoginDuring::IfAllowed | LoginDuring::Closed => {}
    }
    pam.log(LOG_NOTICE, &format!("refusing login of {}: conversion of {} in progress", acct.name, acct.home.display()));
    if flags & PAM_SILENT == 0 {
        pam.error_msg(if moving {
            "Your home directory is being moved into encrypted storage and cannot be used until the move \
             has finished; you can log in then (an administrator can follow it with `dirseal convert --status`)."
        } else {
            "Encryption of your home directory is in progress; you can log in once it has finished \
             (an administrator can follow it with `dirseal convert --status`)."
        });
    }
    refused
}

/// systemd's user manager (user@UID.service, PAM service `systemd-user`) is not a login: its
/// session is closed by `(sd-pam)` after that process dropped root, where this module can do
/// nothing, so a record of it would keep the home unlocked for good. Not counted: the home locks
/// when the last login ends (user services still holding files leave it partly locked, logged with
/// the processes). Found by scripts/system-test.sh (`logout`).
fn user_manager(pam: &Pam) -> bool {
    pam.item(PAM_SERVICE).as_deref() == Some("systemd-user")
}

pub(crate) fn open_session(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    if user_manager(pam) {
        return PAM_IGNORE;
    }
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    if args.mkhome {
        mkhome(pam, args, &acct, flags);
    }
    if pam.flag(OPENED) {
        return PAM_IGNORE;
    }
    // A home being converted is recorded too (None): it becomes managed when the conversion
    // swaps, and the sessions open by then must keep the last logout from locking it under them.
    let managed = match session_home(pam, args, &acct) {
        Ok(m) => m,
        Err(code) => return code,
    };
    // The key is added under the sessions lock, so a logout deciding "last session" on this home
    // cannot remove it after this login added it.
    let mut sessions = match Sessions::open(args.rundir(), &acct.home) {
        Ok(s) => s,
        Err(e) => {
            pam.log(LOG_ERR, &format!("sessions of {}: {e}; leaving it as it is", acct.home.display()));
            return PAM_SESSION_ERR;
        }
    };
    log_dropped(pam, &acct, &sessions);
    let mut result = PAM_SUCCESS;
    match Entry::current(acct.uid) {
        Ok(me) => {
            sessions.add(me);
            pam.set_flag(OPENED);
            if !pam.set_session(SESSION_DATA, me) {
                pam.log(LOG_WARNING, "cannot keep the session record for close_session (pam_set_data failed)");
            }
        }
        Err(e) => {
            pam.log(LOG_ERR, &format!("{e}; the session on {} is not recorded", acct.home.display()));
            result = PAM_SESSION_ERR;
        }
    }
    if let Some((ds, policy)) = managed {
        if let Err(e) = unlock(pam, &ds, &policy, &acct) {
            pam.log(LOG_ERR, &e);
            result = PAM_SESSION_ERR;
        }
    }
    if args.debug {
        pam.log(LOG_DEBUG, &format!("{}: {} session(s)", acct.home.display(), sessions.live()));
    }
    if let Err(e) = sessions.save() {
        pam.log(LOG_ERR, &format!("sessions of {}: {e}", acct.home.display()));
        result = PAM_SESSION_ERR;
    }
    args.pause("after-open");
    result
}

/// `mkhome`: creates the home of a first login, if it does not exist, encrypted from the start
/// ([`dirseal::home::create`]) with a password protector from the password the stack accepted;
/// its key stays loaded for the session. Never for system accounts (uid below login.defs'
/// UID_MIN). Whenever it cannot (no password went through the stack, a filesystem that cannot
/// encrypt, any error), it logs why and creates nothing: the login goes on without a home, and
/// never gets a plaintext one from this module (a `pam_mkhomedir` line after this one would make
/// one).
fn mkhome(pam: &Pam, args: &Args, acct: &Account, flags: c_int) {
    use dirseal::home;
    if !new_home_wanted(pam, args, acct) {
        return;
    }
    let Some(password) = pam.secret(NEW_HOME_PASSWORD).or_else(|| pam.authtok(PAM_AUTHTOK)) else {
        tell(
            pam,
            flags,
            LOG_NOTICE,
            &format!(
                "dirseal: your home {} was not created: its protector needs the password you log in with, and this \
                 login did not use it; log in once with your password",
                acct.home.display()
            ),
        );
        return;
    };
    let made = (|| -> Result<home::Created, String> {
        let full = home::Account::named(&acct.name).map_err(|e| e.to_string())?;
        if full.uid != acct.uid || full.home != acct.home {
            return Err("the password database changed during the login".into());
        }
        let mut ds = Dirseal::open(args.config(), args.keystore.as_deref()).map_err(|e| e.to_string())?;
        let options = home::Options {
            skel: args.skel.clone().unwrap_or_else(|| home::DEFAULT_SKEL.into()),
            // A recovery key must be shown to someone: `dirseal recovery add` makes one later.
            recovery_key: Some(false),
            ..Default::default()
        };
        let kind = dirseal::protector::NewKind::login_default();
        home::create(&mut ds, &full, kind, &options, &mut NewHomeUi { password }).map_err(|e| e.to_string())
    })();
    match made {
        Ok(c) => pam.log(
            LOG_NOTICE,
            &format!(
                "created the home {} of {} encrypted (policy {}, protector {}), {} entries from the skeleton",
                c.home.display(),
                c.user,
                c.policy,
                c.protector,
                c.entries
            ),
        ),
        Err(e) => {
            tell(pam, flags, LOG_ERR, &format!("dirseal: your home {} was not created: {e}", acct.home.display()))
        }
    }
}

/// Whether `mkhome` makes `acct`'s home: it does not exist (a dangling symlink exists), and the
/// account is not a system one (uid below login.defs' UID_MIN).
fn new_home_wanted(pam: &Pam, args: &Args, acct: &Account) -> bool {
    match std::fs::symlink_metadata(&acct.home) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        _ => return false,
    }
    let defs = dirseal::home::LoginDefs::read(Path::new(dirseal::home::LOGIN_DEFS));
    if acct.uid < defs.uid_min {
        if args.debug {
            pam.log(LOG_DEBUG, &format!("{}: a system account (uid below {}); no home made", acct.name, defs.uid_min));
        }
        return false;
    }
    true
}

/// A new home's [`Ui`]: the new protector's password is the one the stack accepted; nothing is
/// asked, and no recovery key is made.
struct NewHomeUi {
    password: Passphrase,
}

impl Ui for NewHomeUi {
    fn secret(&mut self, prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        match prompt {
            SecretPrompt::NewPassword { .. } => Ok(self.password.duplicate()),
            _ => Err(UiError::Cancelled),
        }
    }
}

/// Adds the key `auth` kept, if any, and forgets it.
fn unlock(pam: &Pam, ds: &Dirseal, policy: &PolicyRecord, acct: &Account) -> Result<(), String> {
    let home = acct.home.display();
    let Some(master) = pam.master(MASTER_DATA) else {
        let present = fscrypt::mount_point(&acct.home)
            .and_then(|mp| fscrypt::key_status(&mp, &policy.id))
            .is_ok_and(|s| s == KeyStatus::Present);
        if !present {
            pam.log(
                LOG_NOTICE,
                &format!(
                    "{home} stays locked: no password that opens it went through the stack (key or token login, or \
                     a password it does not follow); `dirseal unlock {home}` opens it"
                ),
            );
            // The user, too, must know why their files look scrambled (an SSH key login).
            pam.info_msg(&format!(
                "dirseal: your home {home} stays locked: this login did not use your password; \
                 `dirseal unlock {home}` opens it"
            ));
        }
        return Ok(());
    };
    pam.clear_master(MASTER_DATA);
    // The key was checked against this policy in auth; the home could have been re-encrypted
    // since (a long-running login screen), so check again against what the kernel says now.
    if fscrypt::key_identifier(&master) != policy.id {
        return Err(format!("{home}: the key from auth is not this home's key any more"));
    }
    ds.add_key(&acct.home, &master).map_err(|e| format!("cannot unlock {home}: {e}"))
}

fn log_dropped(pam: &Pam, acct: &Account, sessions: &Sessions) {
    for e in &sessions.dropped {
        pam.log(
            LOG_NOTICE,
            &format!(
                "{}: forgetting the session of uid {} opened by pid {}, which ended without closing it",
                acct.home.display(),
                e.uid,
                e.pid
            ),
        );
    }
}

pub(crate) fn close_session(pam: &Pam, args: &Args, _flags: c_int) -> c_int {
    if user_manager(pam) {
        return PAM_IGNORE;
    }
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    if pam.flag(CLOSED) {
        return PAM_IGNORE;
    }
    let ds = match session_home(pam, args, &acct) {
        Ok(m) => m.map(|(ds, _)| ds),
        Err(code) => return code,
    };
    // Held until the end: "last session" is decided and the key removed under one lock.
    let mut sessions = match Sessions::open(args.rundir(), &acct.home) {
        Ok(s) => s,
        Err(e) => {
            // Without the list, locking could pull the key from under another session.
            pam.log(LOG_WARNING, &format!("not locking {}: its sessions are unknown ({e})", acct.home.display()));
            return PAM_SUCCESS;
        }
    };
    log_dropped(pam, &acct, &sessions);
    // The session this handle opened (also when close_session runs in a forked child). Without
    // one (open_session ran in another handle) nothing is removed: the dead are already dropped.
    if let Some(me) = pam.session(SESSION_DATA) {
        sessions.remove(&me);
    }
    pam.set_flag(CLOSED);
    let left = sessions.live();
    if args.debug {
        pam.log(LOG_DEBUG, &format!("{}: {left} session(s) left", acct.home.display()));
    }
    if let Some(ds) = ds.filter(|_| left == 0 && !args.unlock_only) {
        args.pause("close-decided");
        lock(pam, &ds, &acct);
    }
    if let Err(e) = sessions.save() {
        pam.log(LOG_ERR, &format!("sessions of {}: {e}", acct.home.display()));
    }
    PAM_SUCCESS
}

fn lock(pam: &Pam, ds: &Dirseal, acct: &Account) {
    let home = acct.home.display();
    match ds.lock(&acct.home, false) {
        Ok(r) if r.locked => pam.log(LOG_NOTICE, &format!("locked {home}")),
        Ok(r) if r.files_busy => {
            let holders: Vec<String> =
                r.busy.iter().map(|p| format!("pid {} ({}): {}", p.pid, p.comm, p.how)).collect();
            pam.log(
                LOG_NOTICE,
                &format!(
                    "{home} is only partly locked: files are still open{}{}; `dirseal lock {home}` finishes once they \
                     close (docs/pam.md: systemd --user)",
                    if holders.is_empty() { "" } else { " by " },
                    holders.join(", "),
                ),
            );
        }
        Ok(r) if r.other_users => pam.log(
            LOG_NOTICE,
            &format!(
                "{home} stays unlocked: other users added its key too; `dirseal lock --all-users {home}` removes every \
                 claim"
            ),
        ),
        Ok(_) => pam.log(LOG_WARNING, &format!("{home} is still unlocked after removing the key")),
        // Already locked (`dirseal lock` by hand, or the key never went in): nothing to do.
        Err(OpsError::Fscrypt(fscrypt::FscryptError::KeyNotPresent { .. })) => {}
        Err(e) => pam.log(LOG_ERR, &format!("cannot lock {home}: {e}")),
    }
}

/// The protector a password change updates: the user's own password protector of the home.
fn own_protector(ds: &Dirseal, policy: &PolicyRecord, uid: u32) -> Option<ProtectorRecord> {
    ds.login_protectors(policy, uid).into_iter().find(|r| r.kind.ask().secret == Some(Secret::Password))
}

/// `passwd` runs this twice: PAM_PRELIM_CHECK (may the change happen?) then PAM_UPDATE_AUTHTOK.
/// The password database decides the change (the profile puts this module after `pam_unix`,
/// `optional`): the prelim pass has nothing to check, and the update pass only follows the
/// change that `pam_unix` made, rewrapping the user's own password protector from the old
/// password (PAM_OLDAUTHTOK) to the new (PAM_AUTHTOK). It never asks and never blocks a change;
/// when it cannot follow, it says what restores the match.
pub(crate) fn chauthtok(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    if args.pin_accounts {
        return pin_chauthtok(pam, args, flags);
    }
    if flags & PAM_PRELIM_CHECK != 0 {
        return PAM_IGNORE;
    }
    if flags & PAM_UPDATE_AUTHTOK == 0 {
        return PAM_SERVICE_ERR;
    }
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    let home = acct.home.display();
    let (ds, policy) = match home_state(pam, args, &acct) {
        // A PIN-login account's "password" is its PIN: the `pin_accounts` line changed it.
        Ok(Home::Managed { ds, .. }) if ds.is_pin_login(&acct.name) => return PAM_IGNORE,
        Ok(Home::Managed { ds, policy }) => (ds, policy),
        Ok(_) => return PAM_IGNORE,
        Err(e) => {
            tell(
                pam,
                flags,
                LOG_ERR,
                &format!(
                    "dirseal: cannot read the keystore for {home} ({e}); the home keeps its previous password: run \
                     `dirseal status {home}`"
                ),
            );
            return PAM_IGNORE;
        }
    };
    let Some(rec) = own_protector(&ds, &policy, acct.uid) else {
        pam.log(LOG_NOTICE, &format!("{home} has no password protector belonging to {}; nothing to follow", acct.name));
        return PAM_IGNORE;
    };
    let Some(new) = pam.authtok(PAM_AUTHTOK) else {
        pam.log(LOG_WARNING, &format!("no new password in the stack; {home} keeps its previous password"));
        return PAM_IGNORE;
    };
    let not_following = |why: &str| {
        tell(
            pam,
            flags,
            LOG_NOTICE,
            &format!(
                "dirseal: {why}, so the encrypted home {home} still opens with {}'s previous password and stays locked \
                 at login. Run `dirseal change-password {home} --protector {}` (as root) with the previous password \
                 and then the new one; without the previous password, `dirseal recovery restore {home} --user {}` \
                 uses the recovery key.",
                acct.name, rec.id, acct.name
            ),
        )
    };
    // Root resetting a password (`passwd alice`): pam_unix does not ask it for the old one.
    let Some(old) = pam.authtok(PAM_OLDAUTHTOK) else {
        not_following("the password was reset without the previous one");
        return PAM_IGNORE;
    };
    let pkey = match protector::unlock(&rec, ds.config(), Some(&old), presence(pam)) {
        Ok(k) => k,
        Err(ProtectorError::IncorrectSecret { .. }) => {
            // Already in step with the new password (set by hand before): nothing to do.
            if protector::unlock(&rec, ds.config(), Some(&new), presence(pam)).is_err() {
                not_following("the home's password and the system's had drifted apart");
            }
            return PAM_IGNORE;
        }
        Err(e) => {
            not_following(&format!("protector {} cannot be used ({e})", rec.id));
            return PAM_IGNORE;
        }
    };
    // The protector keeps its Argon2id cost, as with `dirseal change-password`.
    match ds.change_secret_with(&rec.id, &pkey, Some(&new)) {
        Ok(_) => {
            pam.log(LOG_NOTICE, &format!("password protector {} of {} follows the new password", rec.id, acct.name));
            PAM_SUCCESS
        }
        Err(e) => {
            not_following(&format!("updating it failed ({e})"));
            PAM_IGNORE
        }
    }
}

/// The `pin_accounts` password line (before `pam_unix`, `[success=end default=ignore]`):
/// `passwd` on a PIN-login account changes the PIN of their TPM protector — the current PIN
/// (one TPM try if wrong), then the new one twice. Everyone else: `PAM_IGNORE`, for `pam_unix`.
/// libpam decides the update pass's jumps by the prelim pass's results, so the prelim pass
/// answers `PAM_SUCCESS` for exactly the accounts the update pass handles.
fn pin_chauthtok(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    let (ds, policy) = match home_state(pam, args, &acct) {
        Ok(Home::Managed { ds, policy }) if ds.is_pin_login(&acct.name) => (ds, policy),
        Ok(_) => return new_password(pam, flags),
        Err(e) => {
            pam.log(LOG_ERR, &format!("cannot read the dirseal keystore for {}: {e}", acct.name));
            return new_password(pam, flags);
        }
    };
    let Some(rec) = ds.pin_protector(&policy, acct.uid) else {
        pam.log(LOG_WARNING, &format!("PIN-login account {} has no TPM PIN protector of its own", acct.name));
        return PAM_IGNORE;
    };
    if flags & PAM_PRELIM_CHECK != 0 {
        return PAM_SUCCESS;
    }
    if flags & PAM_UPDATE_AUTHTOK == 0 {
        return PAM_SERVICE_ERR;
    }
    let fail = |text: &str| {
        tell(pam, flags, LOG_NOTICE, &format!("{text}; the PIN of {} is unchanged.", acct.name));
        PAM_AUTHTOK_ERR
    };
    let mut ui = PinUi { pam, user: &acct.name, presence: presence(pam), current: true, answer: None };
    let pkey = match protector::unlock_with(&rec, ds.config(), &mut ui) {
        Ok(k) => k,
        Err(UnlockError::Protector(e)) if wrong_pin(&e) => return fail(&format!("Wrong PIN ({e})")),
        Err(e) => return fail(&format!("dirseal: {e}")),
    };
    // A module before this one (pam_pwquality) may have asked the new secret already.
    let new = match pam.authtok(PAM_AUTHTOK) {
        Some(new) => new,
        None => {
            let ask = |text: &str| pam.prompt_secret(text).ok().flatten().filter(|p| !p.is_empty());
            let Some(new) = ask(&format!("New PIN for {}: ", acct.name)) else { return fail("No new PIN given") };
            let Some(again) = ask(&format!("Retype new PIN for {}: ", acct.name)) else {
                return fail("No new PIN given");
            };
            if new != again {
                return fail("The two new PINs differ");
            }
            new
        }
    };
    match ds.change_secret_with(&rec.id, &pkey, Some(&new)) {
        Ok(_) => {
            pam.log(LOG_NOTICE, &format!("PIN of {} changed (TPM protector {})", acct.name, rec.id));
            PAM_SUCCESS
        }
        Err(e) => fail(&format!("dirseal: changing the PIN failed ({e})")),
    }
}

/// The `pin_accounts` line for everyone else. Being first in the password stack, it takes the
/// place of the module that asks the new password for `pam_unix`, which pam-auth-update then
/// configures with `use_authtok` (as behind pam_pwquality): so in the update pass it asks the new
/// password twice and hands it on as PAM_AUTHTOK, unless a module before it did. `pam_unix`
/// still asks and checks the current one (prelim pass) and decides the change.
fn new_password(pam: &Pam, flags: c_int) -> c_int {
    if flags & PAM_UPDATE_AUTHTOK == 0 || pam.authtok(PAM_AUTHTOK).is_some() {
        return PAM_IGNORE;
    }
    let ask = |text: &str| pam.prompt_secret(text).ok().flatten();
    let (Some(new), Some(again)) = (ask("New password: "), ask("Retype new password: ")) else {
        return PAM_AUTHTOK_ERR;
    };
    if new != again {
        if flags & PAM_SILENT == 0 {
            pam.error_msg("Sorry, passwords do not match.");
        }
        return PAM_AUTHTOK_ERR;
    }
    if !pam.set_authtok(&new) {
        return PAM_AUTHTOK_ERR;
    }
    PAM_IGNORE
}

pub(crate) fn setcred(_pam: &Pam, _args: &Args, _flags: c_int) -> c_int {
    PAM_SUCCESS
}

/// After authentication: while the home is being converted, refuse the login (every login,
/// SSH keys included, goes through the account stack), unless the config allows it; the refusal
/// comes only after the password was accepted, so it tells nobody else which homes are being
/// converted. Everything else is ignored.
pub(crate) fn acct_mgmt(pam: &Pam, args: &Args, flags: c_int) -> c_int {
    let Some(acct) = account(pam) else { return PAM_IGNORE };
    if dirseal::convert::login_during(None, &acct.home).is_ok_and(|d| d != LoginDuring::NoConversion) {
        return converting(pam, args, &acct, flags, (PAM_IGNORE, PAM_PERM_DENIED));
    }
    PAM_IGNORE
}
