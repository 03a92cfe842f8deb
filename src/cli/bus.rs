//! The command line of a user other than root: what the system service `dirsealed` offers on the
//! bus (docs/dbus.md), each command one or two of its calls. The service decides what the user
//! may do (their own directories and protectors) and does it as root; this module only asks the
//! person for the secrets (the same prompts as root's commands), hands them over as pipes (never
//! in a message: docs/dbus.md, "Secrets"), and shows the answers as root's commands do. A command
//! the bus does not offer is refused here, naming it, before anything is asked.
use std::io::{IsTerminal, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use zbus::zvariant::{DeserializeDict, Fd, OwnedValue, Type};

use dirseal::ids::ProtectorId;
use dirseal::ops::{self, LockReport, ProtectorSummary};
use dirseal::protector::{KindOptions, NewKind, Secret};
use dirseal::recovery::RecoveryKey;
use dirseal::secret::Passphrase;
use dirseal::ui::{SecretPrompt, Ui};

use super::args::{Cmd, ConvertArgs, DataMode, DecryptArgs, EndArgs, PolicyCmd, ProtectorCmd, RecoveryCmd, RunArgs};
use super::term::{clean, TermUi};

const NAME: &str = "org.dirseal.Dirseal1";
const PATH: &str = "/org/dirseal/Dirseal1";

/// Why a command through the service did not happen.
#[derive(Debug)]
pub enum BusError {
    /// No service answers on the system bus, and the bus could not start one.
    Unavailable { detail: String },
    /// The service refused or failed: its D-Bus error name and its message (the library's, with
    /// what to do next in the service's terms).
    Service { name: String, message: String },
    /// The command is not one the service offers to a user.
    NeedsRoot { command: String },
}

impl std::fmt::Display for BusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusError::Unavailable { detail } => write!(
                f,
                "as a user other than root, dirseal works through the dirseal service (dirsealed), which is not \
                 running and could not be started ({detail})"
            ),
            BusError::Service { message, .. } => write!(f, "{message}"),
            BusError::NeedsRoot { command } => write!(
                f,
                "`dirseal {command}` needs root: the dirseal service does not offer it to users (it offers status, \
                 unlock, lock, change-password, protector, policy add-protector and remove-protector, recovery, and \
                 convert or decrypt of your own home)"
            ),
        }
    }
}

impl std::error::Error for BusError {}

const ACCESS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";
const INCORRECT: &str = "org.dirseal.Dirseal1.Error.IncorrectSecret";

/// The next step after a [`BusError`], as the CLI words it.
pub fn hint(e: &anyhow::Error) -> Option<String> {
    let as_root = || {
        let args: Vec<String> = std::env::args().skip(1).map(|a| clean(&a)).collect();
        format!("`sudo dirseal {}`", args.join(" "))
    };
    match e.downcast_ref::<BusError>()? {
        BusError::Unavailable { .. } => {
            Some(format!("start it with `sudo systemctl start dirsealed`, or run the command as root: {}", as_root()))
        }
        BusError::NeedsRoot { .. } => Some(format!("run it as root: {}", as_root())),
        // The service's message says why; the way that remains is root's.
        BusError::Service { name, .. } if name == ACCESS_DENIED => Some(format!("root can do it: {}", as_root())),
        BusError::Service { .. } => None,
    }
}

/// The service on the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else the system's socket: the
/// service authenticates the caller by the bus's word, whatever the address).
struct Service {
    conn: zbus::blocking::Connection,
}

impl Service {
    fn connect() -> Result<Service, BusError> {
        let conn = zbus::blocking::Connection::system().map_err(|e| BusError::Unavailable { detail: e.to_string() })?;
        Ok(Service { conn })
    }

    fn call<A, R>(&self, method: &str, args: &A) -> Result<R, BusError>
    where
        A: Serialize + zbus::zvariant::DynamicType,
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        let reply = self.conn.call_method(Some(NAME), PATH, Some(NAME), method, args).map_err(|e| match e {
            zbus::Error::MethodError(name, message, _) => {
                let name = name.to_string();
                let message = message.unwrap_or_default();
                // No owner and no activation, or an activation that failed: nobody to ask.
                if name == "org.freedesktop.DBus.Error.ServiceUnknown"
                    || name == "org.freedesktop.DBus.Error.NameHasNoOwner"
                    || name.starts_with("org.freedesktop.DBus.Error.Spawn")
                {
                    BusError::Unavailable { detail: message }
                } else {
                    BusError::Service { name, message }
                }
            }
            e => BusError::Service { name: String::new(), message: format!("the dirseal service: {e}") },
        })?;
        reply
            .body()
            .deserialize()
            .map_err(|e| BusError::Service { name: String::new(), message: format!("the service's answer: {e}") })
    }

    fn status(&self, dir: &Path) -> Result<Status, BusError> {
        self.call("GetStatus", &(path_arg(dir),))
    }
}

/// One protector, as `GetStatus` and `ListProtectors` give it.
#[derive(DeserializeDict, Type, Clone)]
#[zvariant(signature = "a{sv}")]
struct Protector {
    id: String,
    name: String,
    kind: String,
    uid: Option<u32>,
    policies: Option<Vec<String>>,
}

impl Protector {
    fn id(&self) -> Result<ProtectorId> {
        self.id.parse().map_err(|e| anyhow::anyhow!("the service named protector {:?}: {e}", self.id))
    }

    /// What unlocking it asks for: its kind's, as the library defines it.
    fn secret(&self) -> Option<Secret> {
        NewKind::named(&self.kind, KindOptions::default()).map_or(Some(Secret::Password), |k| k.ask().secret)
    }

    fn summary(&self) -> Result<ProtectorSummary> {
        let kind = dirseal::protector::KIND_NAMES.iter().copied().find(|k| *k == self.kind).unwrap_or("unknown");
        Ok(ProtectorSummary { id: self.id()?, name: self.name.clone(), kind, uid: self.uid, stored: "keystore" })
    }
}

/// `GetStatus`'s answer (the fields this front end shows).
#[derive(DeserializeDict, Type, Default)]
#[zvariant(signature = "a{sv}")]
struct Status {
    managed: Option<bool>,
    portable: Option<String>,
    protectors: Option<Vec<Protector>>,
    problems: Option<Vec<String>>,
    warnings: Option<Vec<String>>,
    recovery_key: Option<bool>,
}

/// `Lock`'s answer.
#[derive(DeserializeDict, Type)]
#[zvariant(signature = "a{sv}")]
struct LockInfo {
    locked: bool,
    files_busy: bool,
    other_users: bool,
    busy: Vec<BusyInfo>,
}

#[derive(DeserializeDict, Type)]
#[zvariant(signature = "a{sv}")]
struct BusyInfo {
    pid: u32,
    comm: String,
    uid: u32,
    how: String,
}

/// A path as the service takes it: absolute (it refuses relative ones; a user's shell gives
/// `~/x` expanded, `x` relative to where they are).
fn path_arg(dir: &Path) -> String {
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()).display().to_string()
}

/// A secret as the service reads it: the read end of a pipe holding it (the pipe's buffer holds
/// any secret the service accepts, so the write end is closed before the call).
fn pipe_of(secret: &Passphrase) -> Result<OwnedFd> {
    let (r, mut w) = std::io::pipe()?;
    w.write_all(secret.as_bytes())?;
    Ok(r.into())
}

/// For an argument the call needs but the protector does not use (a TPM without PIN): the service
/// reads every secret argument and refuses an empty one.
fn unused() -> Passphrase {
    Passphrase::new(zeroize::Zeroizing::new(b"-".to_vec()))
}

fn me() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// The current secret of `p`, asked as root's commands ask it.
fn ask_current(p: &Protector, ui: &mut TermUi) -> Result<Passphrase> {
    let id = p.id()?;
    let prompt = match p.secret() {
        None => return Ok(unused()),
        Some(Secret::Password) => SecretPrompt::Password { name: &p.name, id: &id },
        Some(Secret::Pin) => SecretPrompt::Pin { name: &p.name, id: &id, device: "", tries_left: None },
        Some(Secret::KeyPin) => SecretPrompt::KeyPin { name: &p.name },
    };
    Ok(ui.secret(&prompt)?)
}

/// The protector of `dir` a command acts on: the one `named` (id or name), else the caller's own
/// (the only one, else a question on a terminal).
fn pick(st: &Status, dir: &Path, named: Option<&str>) -> Result<Protector> {
    let all = st.protectors.as_deref().unwrap_or_default();
    let d = clean(&dir.display().to_string());
    if let Some(n) = named {
        return all
            .iter()
            .find(|p| p.id == n || p.name == n)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no protector {:?} opens {d}; `dirseal status {d}` lists them", clean(n)));
    }
    let mine: Vec<&Protector> = all.iter().filter(|p| p.uid == Some(me())).collect();
    match mine.as_slice() {
        [] => anyhow::bail!("none of {d}'s protectors is yours; `dirseal status {d}` lists them"),
        [one] => Ok((*one).clone()),
        several if std::io::stdin().is_terminal() => {
            eprintln!("{d} opens with several of your protectors:");
            for (i, p) in several.iter().enumerate() {
                eprintln!("  {}. {} ({}, {})", i + 1, clean(&p.name), p.kind, p.id);
            }
            loop {
                let answer = super::term::ask_visible(&format!("Which one (1-{})? ", several.len()))?;
                match answer.trim().parse::<usize>() {
                    Ok(n) if (1..=several.len()).contains(&n) => return Ok(several[n - 1].clone()),
                    _ => eprintln!("type a number from 1 to {}", several.len()),
                }
            }
        }
        _ => anyhow::bail!("{d} opens with several of your protectors; pick one with --protector NAME or ID"),
    }
}

/// `op` again after a wrong secret, on a terminal (three tries in all, as root's commands).
fn forgiving<T>(mut op: impl FnMut() -> Result<T>) -> Result<T> {
    let tries = if std::io::stdin().is_terminal() { 3 } else { 1 };
    for n in 1.. {
        match op() {
            Err(e)
                if n < tries
                    && matches!(e.downcast_ref(), Some(BusError::Service { name, .. }) if name == INCORRECT) =>
            {
                eprintln!("{}; try again", clean(&e.to_string()));
            }
            r => return r,
        }
    }
    unreachable!("the last try returns")
}

/// Runs `cmd` through the service; the exit code.
pub fn run(cmd: Cmd, keystore: Option<&Path>) -> Result<i32> {
    if keystore.is_some() {
        anyhow::bail!("--keystore is root's: through the dirseal service, its own keystore is used");
    }
    let needs_root = |command: &str| Err(BusError::NeedsRoot { command: command.into() }.into());
    let mut ui = TermUi { json: false, assume_yes: false };
    match cmd {
        Cmd::Status { dir: Some(dir), json } => status(&dir, json),
        Cmd::Status { dir: None, json } => overview(&Service::connect()?, json),
        Cmd::Unlock { recovery: true, .. } => needs_root("unlock --recovery"),
        Cmd::Unlock { dir, protector, recovery: false, json } => {
            let bus = Service::connect()?;
            let before = ops::public_dir_status(&dir)?;
            if !before.encrypted {
                // Said before a password is asked, as root's unlock says it.
                return Err(ops::OpsError::NotEncrypted { path: dir }.into());
            }
            let named = protector.as_ref().map(|p| p.0.as_str());
            if before.key != Some("unlocked") {
                // A directory under one of the user's own (`~/Private`): the service unlocks it
                // with the user's own protectors but tells nothing else about it, so no status.
                let st = match named {
                    Some(_) => Some(bus.status(&dir)?),
                    None => bus.status(&dir).ok(),
                };
                // Several of the user's own (or unknown): the service tries them all with the one
                // secret (the login order), so the prompt names the directory, not one of them.
                let one = named.is_some()
                    || st.as_ref().is_some_and(|st| {
                        st.protectors.as_deref().unwrap_or_default().iter().filter(|p| p.uid == Some(me())).count() == 1
                    });
                forgiving(|| {
                    let (arg, secret) = match (&st, one) {
                        (Some(st), true) => {
                            let p = pick(st, &dir, named)?;
                            (p.id.clone(), ask_current(&p, &mut ui)?)
                        }
                        _ => {
                            let prompt = format!("Password or PIN for {}: ", clean(&dir.display().to_string()));
                            (String::new(), super::term::ask(&prompt)?)
                        }
                    };
                    let fd = pipe_of(&secret)?;
                    bus.call::<_, ()>("Unlock", &(path_arg(&dir), arg, Fd::from(fd.as_fd())))?;
                    Ok(())
                })?;
            }
            if json {
                #[derive(Serialize)]
                struct Out {
                    path: PathBuf,
                    unlocked: bool,
                    already_unlocked: bool,
                }
                let already_unlocked = before.key == Some("unlocked");
                let path = before.encrypted_root.unwrap_or(dir);
                super::print_json(&Out { path, unlocked: true, already_unlocked })?;
            }
            Ok(0)
        }
        Cmd::Lock { dir, all_users, json } => {
            let bus = Service::connect()?;
            let before = ops::public_dir_status(&dir)?;
            let r: LockInfo = bus.call("Lock", &(path_arg(&dir), all_users))?;
            let report = LockReport {
                path: before.encrypted_root.unwrap_or(dir),
                locked: r.locked,
                already_locked: before.key == Some("locked"),
                files_busy: r.files_busy,
                other_users: r.other_users,
                busy: r
                    .busy
                    .into_iter()
                    .map(|b| ops::BusyProcess { pid: b.pid, comm: b.comm, uid: b.uid, how: b.how })
                    .collect(),
            };
            super::report_lock(&report, json)
        }
        Cmd::ChangePassword { dir, protector } => {
            let bus = Service::connect()?;
            let p = pick(&bus.status(&dir)?, &dir, protector.as_ref().map(|p| p.0.as_str()))?;
            change_secret(&bus, &p, &mut ui)
        }
        Cmd::Protector(cmd) => protector(&Service::connect()?, cmd, &mut ui),
        Cmd::Recovery(cmd) => recovery(&Service::connect()?, cmd, &mut ui),
        Cmd::Policy(PolicyCmd::List { .. }) => needs_root("policy list"),
        Cmd::Report { .. } => needs_root("report"),
        Cmd::UnlockAtBoot => needs_root("unlock-at-boot"),
        Cmd::Policy(PolicyCmd::RemoveProtector { target, protector }) => {
            let Some(dir) = target.dir else { return needs_root("policy remove-protector --policy") };
            let bus = Service::connect()?;
            let p = pick(&bus.status(&dir)?, &dir, Some(&protector.0))?;
            bus.call::<_, ()>("RemoveProtectorFromPolicy", &(path_arg(&dir), &p.id))?;
            println!("protector {} no longer opens {}", p.id, clean(&dir.display().to_string()));
            Ok(0)
        }
        Cmd::Policy(PolicyCmd::AddProtector { target, with, new }) => {
            let Some(dir) = target.dir else { return needs_root("policy add-protector --policy") };
            if new.user.is_some() || new.protector_type != dirseal::protector::DEFAULT_KIND {
                // The service adds an existing protector of the user's, or a new password one.
                return needs_root("policy add-protector --user/--protector-type");
            }
            let bus = Service::connect()?;
            let w = pick(&bus.status(&dir)?, &dir, with.as_ref().map(|p| p.0.as_str()))?;
            let with_secret = ask_current(&w, &mut ui)?;
            let (arg, name, secret) = match &new.protector {
                Some(named) => {
                    let p = own_protector(&bus, &named.0)?;
                    let s = ask_current(&p, &mut ui)?;
                    (p.id.clone(), p.name.clone(), s)
                }
                None => {
                    let name = new.protector_name.clone().unwrap_or_else(|| dirseal::account::user_name(me()));
                    let s = ui.secret(&SecretPrompt::NewPassword { name: &name, uid: Some(me()) })?;
                    (String::new(), name, s)
                }
            };
            let (w_fd, n_fd) = (pipe_of(&with_secret)?, pipe_of(&secret)?);
            let args = (path_arg(&dir), &w.id, Fd::from(w_fd.as_fd()), arg, Fd::from(n_fd.as_fd()), &name);
            let id: String = bus.call("AddProtectorToPolicy", &args)?;
            println!("protector {id} ({}) now opens {}", clean(&name), clean(&dir.display().to_string()));
            Ok(0)
        }
        Cmd::Encrypt { .. } => needs_root("encrypt"),
        Cmd::Convert(a) => convert(a, &mut ui),
        Cmd::Decrypt(a) => decrypt(a, &mut ui),
        Cmd::Home(_) => needs_root("home"),
        Cmd::Tpm2(_) => needs_root("tpm2"),
        Cmd::Fido2(_) => needs_root("fido2"),
        Cmd::PinLogin(_) => needs_root("pin-login"),
        Cmd::Autologin(_) => needs_root("autologin"),
        Cmd::Scrub(_) => needs_root("scrub"),
    }
}

/// `status DIR`: what any user may read (policy, key, filesystem), and from the service what the
/// root-only keystore knows of a directory of theirs. Without the service, or for a directory
/// not theirs, those stay hidden, as they did before the service was asked.
fn status(dir: &Path, json: bool) -> Result<i32> {
    let mut public = ops::public_dir_status(dir)?;
    let known = match Service::connect().and_then(|bus| bus.status(dir)) {
        Ok(st) => st,
        Err(BusError::Service { name, .. }) if name == ACCESS_DENIED => Status::default(),
        Err(BusError::Unavailable { .. }) => Status::default(),
        Err(e) => return Err(e.into()),
    };
    let recovery_key = known.recovery_key;
    if recovery_key.is_some() {
        public.managed = known.managed.unwrap_or(false);
        public.portable = known.portable.filter(|p| !p.is_empty()).map(PathBuf::from);
        public.protectors =
            known.protectors.unwrap_or_default().iter().map(Protector::summary).collect::<Result<_>>()?;
        public.problems.extend(known.problems.unwrap_or_default());
        public.warnings.extend(known.warnings.unwrap_or_default());
    }
    super::print_dir_status(public, recovery_key, Vec::new(), None, None, json)?;
    Ok(0)
}

/// `status` without a directory: the user's own protectors and the policies each opens.
fn overview(bus: &Service, json: bool) -> Result<i32> {
    let list: Vec<Protector> = bus.call("ListProtectors", &())?;
    if json {
        #[derive(Serialize)]
        struct Out {
            #[serde(flatten)]
            summary: ProtectorSummary,
            policies: Vec<String>,
        }
        let out: Vec<Out> = list
            .iter()
            .map(|p| Ok(Out { summary: p.summary()?, policies: p.policies.clone().unwrap_or_default() }))
            .collect::<Result<_>>()?;
        super::print_json(&serde_json::json!({ "protectors": out }))?;
        return Ok(0);
    }
    if list.is_empty() {
        println!("you have no protectors; `dirseal status DIR` shows a directory");
    }
    for p in &list {
        let n = p.policies.as_ref().map_or(0, Vec::len);
        let used = match n {
            0 => "unused".to_string(),
            1 => "1 policy".to_string(),
            n => format!("{n} policies"),
        };
        println!("{}  {used}", super::protector_line(&p.summary()?));
    }
    Ok(0)
}

/// A protector of the caller's, by id or name, from the service's list of theirs.
fn own_protector(bus: &Service, named: &str) -> Result<Protector> {
    let list: Vec<Protector> = bus.call("ListProtectors", &())?;
    let found: Vec<&Protector> = list.iter().filter(|p| p.id == named || p.name == named).collect();
    match found.as_slice() {
        [one] => Ok((*one).clone()),
        [] => anyhow::bail!("you have no protector {:?}; `dirseal protector list` lists yours", clean(named)),
        _ => anyhow::bail!("several of your protectors are named {:?}; name one by its id", clean(named)),
    }
}

fn change_secret(bus: &Service, p: &Protector, ui: &mut TermUi) -> Result<i32> {
    let ask = NewKind::named(&p.kind, KindOptions::default()).map_or(dirseal::protector::Ask::PASSWORD, |k| k.ask());
    forgiving(|| {
        let old = ask_current(p, ui)?;
        let new = dirseal::protector::ask_new(ask, &p.name, p.uid, ui)?.unwrap_or_else(unused);
        let (old, new) = (pipe_of(&old)?, pipe_of(&new)?);
        bus.call::<_, ()>("ChangeSecret", &(&p.id, Fd::from(old.as_fd()), Fd::from(new.as_fd())))?;
        Ok(())
    })?;
    println!("changed the password of protector {} ({})", clean(&p.name), p.id);
    Ok(0)
}

fn protector(bus: &Service, cmd: ProtectorCmd, ui: &mut TermUi) -> Result<i32> {
    match cmd {
        ProtectorCmd::List { json } => return overview(bus, json),
        ProtectorCmd::Create { name, protector_type, user, kdf } => {
            if user.as_deref().is_some_and(|u| ops::lookup_user(u).map(|(uid, _)| uid).ok() != Some(me())) {
                return Err(BusError::NeedsRoot { command: "protector create --user".into() }.into());
            }
            let kind = kdf.kind(&protector_type)?;
            let secret = dirseal::protector::ask_new(kind.ask(), &name, Some(me()), ui)?.unwrap_or_else(unused);
            let mut options: std::collections::HashMap<String, OwnedValue> = std::collections::HashMap::new();
            options.insert("kind".into(), OwnedValue::from(zbus::zvariant::Str::from(protector_type.clone())));
            for (k, v) in kdf.pairs()? {
                options.insert(k, OwnedValue::from(zbus::zvariant::Str::from(v)));
            }
            let fd = pipe_of(&secret)?;
            let id: String = bus.call("CreateProtector", &(&name, Fd::from(fd.as_fd()), options))?;
            println!("created protector {id} ({})", clean(&name));
        }
        ProtectorCmd::Remove { id } => {
            let p = own_protector(bus, &id.0)?;
            bus.call::<_, ()>("RemoveProtector", &(&p.id,))?;
            println!("removed protector {}", p.id);
        }
        ProtectorCmd::Verify { id } => {
            let p = own_protector(bus, &id.0)?;
            let ok = forgiving(|| {
                let fd = pipe_of(&ask_current(&p, ui)?)?;
                let ok: bool = bus.call("VerifySecret", &(&p.id, Fd::from(fd.as_fd())))?;
                if ok {
                    Ok(true)
                } else {
                    // As root's command: a wrong secret is an error (and asked again on a terminal).
                    Err(BusError::Service {
                        name: INCORRECT.into(),
                        message: format!("incorrect secret for protector {} ({})", clean(&p.name), p.id),
                    }
                    .into())
                }
            })?;
            if ok {
                println!("the secret of protector {} ({}) is correct", p.id, clean(&p.name));
            }
        }
        ProtectorCmd::ChangePassword { id } => return change_secret(bus, &own_protector(bus, &id.0)?, ui),
    }
    Ok(0)
}

fn recovery(bus: &Service, cmd: RecoveryCmd, ui: &mut TermUi) -> Result<i32> {
    match cmd {
        RecoveryCmd::Add { dir, protector } => {
            let p = pick(&bus.status(&dir)?, &dir, protector.as_ref().map(|p| p.0.as_str()))?;
            let key = forgiving(|| {
                let secret = pipe_of(&ask_current(&p, ui)?)?;
                let (mut r, w) = std::io::pipe()?;
                let w: OwnedFd = w.into();
                bus.call::<_, ()>(
                    "RecoveryAdd",
                    &(path_arg(&dir), &p.id, Fd::from(secret.as_fd()), Fd::from(w.as_fd())),
                )?;
                drop(w);
                let mut line = zeroize::Zeroizing::new(String::new());
                r.read_to_string(&mut line)?;
                Ok(RecoveryKey::parse(line.trim())?)
            })?;
            // Saved by the service already: shown once, as root's command shows it.
            println!(
                "Recovery key for {} — write it down and keep it away from the device; it is shown only once:\n\n    {}\n",
                clean(&dir.display().to_string()),
                &*key.to_display()
            );
            println!("recovery key saved on {}", clean(&dir.display().to_string()));
        }
        RecoveryCmd::Verify { dir } => {
            let typed = ui.secret(&SecretPrompt::RecoveryKey { dir: &dir })?;
            let fd = pipe_of(&typed)?;
            let ok: bool = bus.call("RecoveryVerify", &(path_arg(&dir), Fd::from(fd.as_fd())))?;
            if !ok {
                anyhow::bail!("that recovery key does not open {}", clean(&dir.display().to_string()));
            }
            println!("the recovery key opens {}", clean(&dir.display().to_string()));
        }
        RecoveryCmd::Remove { dir } => {
            bus.call::<_, ()>("RecoveryRemove", &(path_arg(&dir),))?;
            println!("removed the recovery key of {}", clean(&dir.display().to_string()));
        }
        RecoveryCmd::Escrow { .. } => return Err(BusError::NeedsRoot { command: "recovery escrow".into() }.into()),
        RecoveryCmd::Restore { dir, protector } => {
            if protector.user.as_deref().is_some_and(|u| ops::lookup_user(u).map(|(uid, _)| uid).ok() != Some(me())) {
                return Err(BusError::NeedsRoot { command: "recovery restore --user".into() }.into());
            }
            let key = ui.secret(&SecretPrompt::RecoveryKey { dir: &dir })?;
            let (arg, name, secret) = match &protector.protector {
                Some(named) => {
                    let p = own_protector(bus, &named.0)?;
                    let s = ask_current(&p, ui)?;
                    (p.id.clone(), String::new(), s)
                }
                None => {
                    let name = protector.protector_name.clone().unwrap_or_else(|| dirseal::account::user_name(me()));
                    let s = ui.secret(&SecretPrompt::NewPassword { name: &name, uid: Some(me()) })?;
                    (String::new(), name, s)
                }
            };
            let (key, secret) = (pipe_of(&key)?, pipe_of(&secret)?);
            let id: String = bus.call(
                "RecoveryRestore",
                &(path_arg(&dir), Fd::from(key.as_fd()), arg, Fd::from(secret.as_fd()), name),
            )?;
            println!(
                "unlocked {} with its recovery key; protector {id} now opens it",
                clean(&dir.display().to_string())
            );
        }
    }
    Ok(0)
}

/// Options of `Convert` and `Decrypt` (and their plans) from the flags the service takes.
type Dict = std::collections::HashMap<String, OwnedValue>;

fn job_options(run: &RunArgs, keep_backup: bool, protector: Option<&str>) -> Dict {
    let mut o = Dict::new();
    let s = |v: &str| OwnedValue::from(zbus::zvariant::Str::from(v.to_string()));
    o.insert("keep_backup".into(), OwnedValue::from(keep_backup));
    o.insert("force".into(), OwnedValue::from(run.force));
    let mode = match run.data_mode {
        DataMode::Copy => "copy",
        DataMode::Move => "move",
        DataMode::Auto => "auto",
    };
    o.insert("mode".into(), s(mode));
    if let Some(p) = protector {
        o.insert("protector".into(), s(p));
    }
    o
}

/// The flags of a run the service has no way to take: `dirseal convert` as root has them.
fn refused_flags(command: &str, run: &RunArgs, end: &EndArgs, more: &[(&str, bool)]) -> Result<(), BusError> {
    let flags = [
        ("--threads", run.threads.is_some()),
        ("--json", run.json),
        ("--abort", end.abort),
        ("--rollback", end.rollback),
        ("--commit", end.commit),
        ("--status", end.status),
    ];
    match flags.iter().chain(more).find(|(_, given)| *given) {
        Some((flag, _)) => Err(BusError::NeedsRoot { command: format!("{command} {flag}") }),
        None => Ok(()),
    }
}

/// A plan's a{sv} value, as a number or text to show.
fn plan_u64(plan: &Dict, key: &str) -> Option<u64> {
    plan.get(key).and_then(|v| u64::try_from(v).ok())
}

fn plan_str(plan: &Dict, key: &str) -> Option<String> {
    plan.get(key).and_then(|v| String::try_from(v.try_clone().ok()?).ok())
}

/// Shows the service's plan and asks, as root's command asks (`--yes`: asked nothing). A plan
/// with a `state` is an unfinished run, which the call resumes: nothing to ask.
fn confirm_plan(plan: &Dict, dir: &Path, verb: &str, yes: bool) -> Result<bool> {
    let d = clean(&dir.display().to_string());
    if let Some(state) = plan_str(plan, "state") {
        eprintln!("dirseal: resuming the {verb} of {d} (recorded state: {})", clean(&state));
        return Ok(false);
    }
    let mib = |b: u64| b.div_ceil(1 << 20);
    eprintln!(
        "{verb} {d}: {}, {} MiB of data, by {} (needs {} MiB free, {} MiB available)",
        super::term::entries(plan_u64(plan, "entries").unwrap_or(0)),
        mib(plan_u64(plan, "data_bytes").unwrap_or(0)),
        plan_str(plan, "method").unwrap_or_default(),
        mib(plan_u64(plan, "space_needed").unwrap_or(0)),
        mib(plan_u64(plan, "space_available").unwrap_or(0)),
    );
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        return Err(dirseal::ui::UiError::Unconfirmed {
            what: format!("{verb} {d}"),
            hint: "pass --yes when not on a terminal".into(),
        }
        .into());
    }
    if !super::term::confirm(&format!("{verb} {d} in place?"))? {
        return Err(dirseal::ui::UiError::Cancelled.into());
    }
    Ok(true)
}

/// `convert` of the user's own directory (the service allows their home while nothing uses it):
/// its plan, the question, the new password (or an existing protector's secret), then the job
/// followed to its end.
fn convert(a: ConvertArgs, ui: &mut TermUi) -> Result<i32> {
    let more = [
        ("--portable", a.portable),
        ("--scrub", a.scrub),
        ("--recovery-key", a.recovery.recovery_key),
        ("--user", a.protector.user.is_some()),
        ("--protector-type", a.protector.protector_type != dirseal::protector::DEFAULT_KIND),
        ("--live-worker", a.live_worker),
    ];
    refused_flags("convert", &a.run, &a.end, &more)?;
    let Some(dir) = a.dir else { anyhow::bail!("name the directory to convert: `dirseal convert DIR`") };
    let bus = Service::connect()?;
    let named = a.protector.protector.as_ref().map(|p| p.0.as_str());
    let mut options = job_options(&a.run, a.keep_backup, named);
    options.insert("wipe".into(), OwnedValue::from(a.wipe));
    if a.live {
        options.insert("live".into(), OwnedValue::from(true));
    }
    // Without it the service would convert at once (a home in use: refused as busy).
    if a.at_next_boot {
        options.insert("at_next_boot".into(), OwnedValue::from(true));
    }
    let plan: Dict = bus.call("PlanConvert", &(path_arg(&dir), &options))?;
    let new = confirm_plan(&plan, &dir, "Convert", a.yes)?;
    let secret = match named {
        Some(n) => ask_current(&own_protector(&bus, n)?, ui)?,
        // A new run makes a password protector for the owner; a resumed one reloads its key.
        None if new => {
            let name = a.protector.protector_name.clone().unwrap_or_else(|| dirseal::account::user_name(me()));
            ui.secret(&SecretPrompt::NewPassword { name: &name, uid: Some(me()) })?
        }
        None => super::term::ask(&format!("Password for {}: ", clean(&dir.display().to_string())))?,
    };
    // Live, the job goes on in the service until the commit (after the logout): followed only
    // with --wait.
    follow(&bus, "Convert", &dir, &secret, options, a.live && !a.wait)
}

/// `decrypt` of the user's own directory (polkit's `decrypt-own` decides).
fn decrypt(a: DecryptArgs, ui: &mut TermUi) -> Result<i32> {
    refused_flags("decrypt", &a.run, &a.end, &[])?;
    let bus = Service::connect()?;
    let named = a.protector.as_ref().map(|p| p.0.as_str());
    let mut options = job_options(&a.run, a.keep_backup, named);
    options.insert("keep_protectors".into(), OwnedValue::from(a.keep_protectors));
    let locked = ops::public_dir_status(&a.dir)?.key != Some("unlocked");
    // The plan needs the key loaded: a locked directory is unlocked by the call's secret.
    if !locked {
        let plan: Dict = bus.call("PlanDecrypt", &(path_arg(&a.dir), &options))?;
        confirm_plan(&plan, &a.dir, "Decrypt", a.yes)?;
    }
    let secret = if locked {
        let st = bus.status(&a.dir)?;
        ask_current(&pick(&st, &a.dir, named)?, ui)?
    } else {
        unused()
    };
    follow(&bus, "Decrypt", &a.dir, &secret, options, false)
}

/// Starts the job (`Convert` or `Decrypt`) and follows its signals to the end: progress as root's
/// command shows it; Ctrl-C cancels the job (the service aborts it where it can: `Cancel`).
fn follow(bus: &Service, method: &str, dir: &Path, secret: &Passphrase, options: Dict, detach: bool) -> Result<i32> {
    // Subscribed before the call: a small job may end before its path is known here.
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface("org.dirseal.Dirseal1.Job")
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .build();
    let signals = zbus::blocking::MessageIterator::for_match_rule(rule, &bus.conn, Some(64))
        .map_err(|e| anyhow::anyhow!("subscribing to the job's signals: {e}"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for m in signals {
            if m.map(|m| tx.send(m)).is_err() {
                break;
            }
        }
    });
    // The service refuses a home that any process has open, this one's working directory too.
    let path = path_arg(dir);
    let _ = std::env::set_current_dir("/");
    let fd = pipe_of(secret)?;
    // From the call on, Ctrl-C cancels the job (once its path is known) rather than leaving it.
    let _catch = super::interrupt::catching();
    let job: zbus::zvariant::OwnedObjectPath = bus.call(method, &(&path, Fd::from(fd.as_fd()), options))?;
    if detach {
        let d = clean(&path);
        println!("{d} is being encrypted in the background by the dirseal service; it switches once you have logged out and nothing uses it");
        println!("  `dirseal status {d}` shows where it stands");
        return Ok(0);
    }
    let reporter = super::progress::Reporter::new(false);
    let mut cancelled = false;
    loop {
        if super::interrupt::arrived() && !cancelled {
            cancelled = true;
            eprintln!("dirseal: stopping: the service undoes what it can");
            let _ = bus.conn.call_method(Some(NAME), job.as_str(), Some("org.dirseal.Dirseal1.Job"), "Cancel", &());
        }
        let m = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(m) => m,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                reporter.finish();
                anyhow::bail!("lost the connection to the dirseal service; the job goes on: `dirseal status {path}`")
            }
        };
        let h = m.header();
        if h.path().map(|p| p.as_str()) != Some(job.as_str()) {
            continue;
        }
        match h.member().map(|m| m.as_str()) {
            Some("Progress") => {
                if let Ok((phase, bytes_done, bytes_total, files_done, files_total, _)) =
                    m.body().deserialize::<(String, u64, u64, u64, u64, i64)>()
                {
                    reporter.report(&dirseal::ui::Progress { phase, bytes_done, bytes_total, files_done, files_total });
                }
            }
            Some("Deferred") => {
                if let Ok(reason) = m.body().deserialize::<String>() {
                    eprintln!("dirseal: the switch is put off ({}); it waits for the next logout", clean(&reason));
                }
            }
            Some("Finished") => {
                reporter.finish();
                let (state, files, bytes, _policy) = m.body().deserialize::<(String, u64, u64, String)>()?;
                let d = clean(&path);
                match state.as_str() {
                    "aborted" => {
                        eprintln!("dirseal: stopped; {d} is as it was");
                        return Ok(130);
                    }
                    "scheduled" => {
                        println!("{d} is scheduled for encryption at the next boot, before the login screen, asking nothing; restart to have it done");
                        println!("  until then `dirseal convert --abort {d}` as root (or the service's CancelScheduled) cancels it");
                    }
                    state => {
                        println!("{d}: {state} ({}, {} MiB)", super::term::entries(files), bytes.div_ceil(1 << 20))
                    }
                }
                return Ok(0);
            }
            Some("Failed") => {
                reporter.finish();
                let (name, message) = m.body().deserialize::<(String, String)>()?;
                return Err(BusError::Service { name, message }.into());
            }
            _ => {}
        }
    }
}
