//! The `dirseal` command line: thin glue from clap to [`dirseal::ops`].
mod args;
mod autologin;
mod boot;
mod bus;
mod convert;
mod decrypt;
mod drive;
mod fido2;
mod hint;
mod home;
mod interrupt;
mod live;
mod progress;
mod recovery;
mod report;
mod scrub;
mod term;
mod tpm2;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Parser;
use serde::Serialize;

use dirseal::ids::{KeyIdentifier, ProtectorId};
use dirseal::keystore::{PolicyRecord, ProtectorRecord};
use dirseal::ops::{self, Dirseal, LockReport, NewProtector, OpsError, Pick, ProtectorChoice, ProtectorSummary};
use dirseal::protector::{KindOptions, NewKind, ProtectorError};

use args::{Cli, Cmd, KdfArgs, PinLoginCmd, PolicyCmd, PolicyTarget, ProtectorArgs, ProtectorCmd};
pub use term::clean;
use term::TermUi;

/// What the command line's definition (args.rs) takes from the library; build.rs gives it the
/// same, read from the library's sources (checked by tests/cli.rs).
mod lib_values {
    pub use super::ProtectorRef;
    pub use dirseal::ids::KeyIdentifier;

    pub fn config_path() -> &'static str {
        dirseal::config::DEFAULT_CONFIG_PATH
    }

    pub fn kind_names() -> &'static [&'static str] {
        dirseal::protector::KIND_NAMES
    }

    pub fn default_kind() -> &'static str {
        dirseal::protector::DEFAULT_KIND
    }

    pub fn skel_dir() -> &'static str {
        dirseal::home::DEFAULT_SKEL
    }
}

impl KdfArgs {
    /// The kind's options as (key, value) pairs: flag `--a-b` gives option `a_b`, which is how
    /// an error about an option is shown with the flag that gave it. The kind sorts them out.
    fn kind(&self, name: &str) -> Result<NewKind> {
        let given: Vec<String> = self.flags()?.into_iter().map(|(k, _)| k).collect();
        NewKind::named(name, KindOptions::new(self.pairs()?)).map_err(|e| match e {
            ProtectorError::BadOption { option, kind } if given.contains(&option) => {
                anyhow::anyhow!("option --{} does not apply to {kind} protectors", option.replace('_', "-"))
            }
            e => e.into(),
        })
    }

    /// The options given, flags and `--protector-opt`s, as (key, value) pairs.
    fn pairs(&self) -> Result<Vec<(String, String)>> {
        let mut pairs = self.flags()?;
        pairs.extend(self.protector_opt.iter().map(|o| match o.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (o.clone(), "true".into()),
        }));
        Ok(pairs)
    }

    /// The flags given, as options.
    fn flags(&self) -> Result<Vec<(String, String)>> {
        let yes = |b: bool| b.then(|| "true".to_string());
        // `--import FILE` gives the file's text: the kind takes the JWE, never a path.
        let import = match &self.import {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| anyhow::anyhow!("cannot read the JWE to import from {}: {e}", f.display()))?,
            ),
            None => None,
        };
        let flags = [
            ("kdf_time_ms", self.kdf_time_ms.map(|v| v.to_string())),
            ("kdf_memory_mib", self.kdf_memory_mib.map(|v| v.to_string())),
            ("no_pin", yes(self.no_pin)),
            ("pcr", self.pcr.clone()),
            ("device", self.device.clone()),
            ("pin", yes(self.pin)),
            ("uv", yes(self.uv)),
            ("allow_password_pin", yes(self.allow_password_pin)),
            ("url", self.url.clone()),
            ("thumbprint", self.thumbprint.clone()),
            ("import", import),
        ];
        Ok(flags.into_iter().filter_map(|(k, v)| Some((k.to_string(), v?))).collect())
    }
}

impl ProtectorArgs {
    /// `--user`'s uid.
    fn user(&self) -> Result<Option<u32>> {
        Ok(self.user.as_deref().map(ops::lookup_user).transpose()?.map(|(uid, _)| uid))
    }

    /// `--protector`, else a new protector as the core names and owns it: for `dir` (its owner's
    /// unless `--user` says whose), or with no directory (a policy) only `--user`'s.
    pub fn choice(&self, ds: &Dirseal, dir: Option<&Path>) -> Result<ProtectorChoice<'_>> {
        if let Some(p) = &self.protector {
            return Ok(ProtectorChoice::Existing(p.id(ds)?));
        }
        let (kind, user, name) = (self.kdf.kind(&self.protector_type)?, self.user()?, self.protector_name.as_deref());
        Ok(ProtectorChoice::New(match dir {
            Some(dir) => NewProtector::for_dir(dir, user, kind, name),
            None => NewProtector::for_user(user, kind, name),
        }))
    }
}

/// A protector as the person names it: its 16-digit id, or its name (which must then be unique;
/// the error of an ambiguous one lists the candidates with their ids).
#[derive(Clone, Debug)]
pub struct ProtectorRef(String);

impl std::str::FromStr for ProtectorRef {
    type Err = String;
    fn from_str(s: &str) -> Result<ProtectorRef, String> {
        if s.is_empty() {
            return Err("a protector id or name".into());
        }
        Ok(ProtectorRef(s.to_string()))
    }
}

impl ProtectorRef {
    /// An id is taken as it is: the operation looks its record up where the directory keeps it
    /// (a portable directory's medium, which this machine's keystore does not know).
    fn id(&self, ds: &Dirseal) -> Result<ProtectorId> {
        if let Ok(id) = self.0.parse::<ProtectorId>() {
            return Ok(id);
        }
        Ok(ds.protector_named(&self.0, None)?.id)
    }

    /// For `policy` (`what` names it, a directory): a name is looked up among the protectors
    /// that open it, so a name other directories' protectors share is no ambiguity.
    fn pick_for(this: &Option<ProtectorRef>, ds: &Dirseal, policy: &PolicyRecord, what: &str) -> Result<Pick> {
        let Some(named) = this else { return Ok(Pick::default()) };
        Ok(Pick { protector: Some(ds.protector_named_for(policy, &named.0, what)?) })
    }

    /// [`ProtectorRef::pick_for`] the policy of `dir`. Where `dir` has no policy record (yet, or
    /// any more: a conversion's resume) a name is looked up in the whole keystore, and the
    /// operation itself says what is wrong with `dir`.
    pub fn pick_in(this: &Option<ProtectorRef>, ds: &Dirseal, dir: &Path) -> Result<Pick> {
        let Some(named) = this else { return Ok(Pick::default()) };
        match ds.policy_of(dir) {
            Ok(policy) => ProtectorRef::pick_for(this, ds, &policy, &dir.display().to_string()),
            Err(_) => Ok(Pick { protector: Some(named.id(ds)?) }),
        }
    }
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    // libtss2 logs every TPM error response (a wrong PIN) to stderr; dirseal explains them itself.
    if std::env::var_os("TSS2_LOG").is_none() {
        std::env::set_var("TSS2_LOG", "all+NONE");
    }
    let cli = Cli::parse();
    if let Err(e) = interrupt::install() {
        eprintln!("dirseal: error: cannot handle Ctrl-C: {e}");
        return 1;
    }
    let context = hint::Context::of(&cli.cmd);
    match run(cli) {
        Ok(code) => code,
        Err(e) if cancelled(&e) => {
            eprintln!("dirseal: cancelled; nothing was changed");
            130
        }
        Err(e) => {
            eprintln!("dirseal: error: {}", clean(&dirseal::remedy::said_once(e.as_ref())));
            if let Some(h) = hint::hint(&e, &context).or_else(|| bus::hint(&e)) {
                eprintln!("dirseal: {}", clean(&h));
            }
            1
        }
    }
}

/// Whether the person cancelled a prompt (Ctrl-D): exit status 130, as a shell reports an
/// interrupted command. The library wraps `UiError` transparently in several error types, and a
/// transparent wrapper displays exactly the wrapped text, so the text identifies it in any of them.
fn cancelled(e: &anyhow::Error) -> bool {
    let text = dirseal::ui::UiError::Cancelled.to_string();
    e.chain().any(|c| c.to_string() == text)
}

fn print_json<T: Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn run(cli: Cli) -> Result<i32> {
    // A user other than root works through the system service, on what is theirs (bus.rs).
    if !nix::unistd::geteuid().is_root() {
        return bus::run(cli.cmd, cli.keystore.as_deref());
    }
    // Scrubbing touches no keys: it must work with a missing or broken config and keystore.
    if let Cmd::Scrub(args) = cli.cmd {
        return scrub::run(args);
    }
    if let Cmd::Tpm2(cmd) = cli.cmd {
        return tpm2::run(&dirseal::config::Config::load(&cli.config)?, cmd);
    }
    if let Cmd::Fido2(cmd) = cli.cmd {
        return fido2::run(&dirseal::config::Config::load(&cli.config)?, cmd);
    }
    if let Some(code) = match &cli.cmd {
        Cmd::Convert(a) => convert::status_only(a, &cli.config, cli.keystore.as_deref()),
        _ => None,
    } {
        return code;
    }
    if let Cmd::Autologin(args::AutologinCmd::Clear { root }) = &cli.cmd {
        return autologin::clear(root);
    }
    // The check's fallback: it must work when the keystore or the configuration cannot be read.
    if let Cmd::Autologin(args::AutologinCmd::Off { root }) = &cli.cmd {
        return autologin::off(root);
    }
    // Commands that only read never create a keystore (a typo'd --keystore, or a status on a
    // machine that manages nothing, must leave no directory behind).
    let read_only = matches!(
        cli.cmd,
        Cmd::Status { .. }
            | Cmd::Lock { .. }
            | Cmd::Unlock { .. }
            | Cmd::Protector(ProtectorCmd::List { .. } | ProtectorCmd::Verify { .. })
            | Cmd::Policy(PolicyCmd::List { .. })
            | Cmd::Recovery(args::RecoveryCmd::Verify { .. } | args::RecoveryCmd::Escrow { check: true, .. })
            | Cmd::Report { .. }
            | Cmd::Autologin(_)
    );
    let mut ds = if read_only {
        Dirseal::open_existing(&cli.config, cli.keystore.as_deref())?
    } else {
        Dirseal::open(&cli.config, cli.keystore.as_deref())?
    };
    let json = matches!(
        cli.cmd,
        Cmd::Status { json: true, .. }
            | Cmd::Lock { json: true, .. }
            | Cmd::Unlock { json: true, .. }
            | Cmd::Protector(ProtectorCmd::List { json: true })
            | Cmd::Policy(PolicyCmd::List { json: true })
            | Cmd::Report { json: true }
    ) || matches!(&cli.cmd, Cmd::Convert(a) if a.run.json)
        || matches!(&cli.cmd, Cmd::Decrypt(a) if a.run.json);
    let mut ui = TermUi { json, assume_yes: false };
    match cli.cmd {
        Cmd::Status { dir: Some(dir), json } => status_dir(&ds, &dir, json)?,
        Cmd::Status { dir: None, json } => overview(&ds, json)?,
        Cmd::Encrypt { dir, protector, recovery: offer, portable } => {
            // Asked, shown and typed back before anything is encrypted (as convert does): a
            // cancel at any question leaves the directory as it was. Saved once the master key
            // exists.
            let want_recovery = ds.wants_recovery_key(&dir, offer.decided(), &mut ui)?;
            let choice = protector.choice(&ds, Some(&dir))?;
            let key = want_recovery.then(|| recovery::show_new(&dir, &mut ui)).transpose()?;
            let (policy, master) =
                if portable { ds.encrypt_portable(&dir, choice, &mut ui)? } else { ds.encrypt(&dir, choice, &mut ui)? };
            if let Some(key) = key {
                ds.save_recovery_key(&dir, &policy.id, &master, &key, None)?.notice(&dir, &mut ui);
            }
        }
        Cmd::Convert(args) => return convert::run(&mut ds, args, &mut ui),
        Cmd::Decrypt(args) => return decrypt::run(&mut ds, args, &mut ui),
        Cmd::Home(cmd) => return home::run(&mut ds, cmd, &mut ui),
        Cmd::Autologin(cmd) => return autologin::run(&ds, cmd),
        Cmd::Unlock { dir, protector, recovery, json } => {
            // Read before, for the JSON answer: an unlocked directory is an answer (rc 0), as a
            // locked one is to `lock`.
            let before = json.then(|| ops::public_dir_status(&dir)).transpose()?;
            if recovery {
                ds.unlock_with_recovery(&dir, &mut ui)?
            } else {
                let pick = ProtectorRef::pick_in(&protector, &ds, &dir)?;
                unlock(&mut ds, &dir, pick, &mut ui)?
            }
            if let Some(before) = before {
                #[derive(Serialize)]
                struct Out {
                    path: PathBuf,
                    unlocked: bool,
                    already_unlocked: bool,
                }
                let path = before.encrypted_root.unwrap_or(dir);
                return print_json(&Out { path, unlocked: true, already_unlocked: before.key == Some("unlocked") })
                    .map(|()| 0);
            }
        }
        Cmd::Lock { dir, all_users, json } => return lock(&ds, &dir, all_users, json),
        Cmd::ChangePassword { dir, protector } => {
            let rec = {
                let pick = ProtectorRef::pick_in(&protector, &ds, &dir)?;
                forgiving(|| ds.change_dir_secret(&dir, pick, &mut ui))?
            };
            println!("changed the password of protector {} ({})", clean(&rec.name), rec.id);
        }
        Cmd::Protector(cmd) => protector(&mut ds, cmd, &mut ui)?,
        Cmd::Policy(cmd) => policy(&mut ds, cmd, &mut ui)?,
        Cmd::Recovery(cmd) => return recovery::run(&mut ds, cmd, &mut ui),
        Cmd::Report { json } => return report::run(&ds, json),
        Cmd::UnlockAtBoot => return unlock_at_boot(&ds, &mut ui),
        Cmd::PinLogin(PinLoginCmd::Enable { user }) => {
            let rec = ds.enable_pin_login(&user)?;
            println!(
                "{} logs in with the PIN of TPM protector {} ({}) on the `standalone` line (docs/pam.md); no password \
                 hash is left in /etc/shadow, and `passwd` changes the PIN",
                clean(&user),
                clean(&rec.name),
                rec.id
            );
        }
        Cmd::PinLogin(PinLoginCmd::Disable { user }) => {
            ds.disable_pin_login(&user)?;
            println!(
                "{} is no PIN-login account any more; `passwd {}` gives it a password",
                clean(&user),
                clean(&user)
            );
        }
        Cmd::Tpm2(_) | Cmd::Fido2(_) | Cmd::Scrub(_) => unreachable!("handled above"),
    }
    Ok(0)
}

/// On a terminal a mistyped secret is asked again, three tries in all (as `fscrypt unlock`
/// does); a script gets the first error. A TPM PIN's prompt shows the tries the TPM has left.
fn unlock(ds: &mut Dirseal, dir: &Path, mut pick: Pick, ui: &mut TermUi) -> Result<()> {
    let tty = std::io::stdin().is_terminal();
    if tty && pick.protector.is_none() {
        match choose(ds, dir, ui)? {
            Chosen::Unlocked => return Ok(()),
            Chosen::Ask(id) => pick.protector = id,
        }
    }
    Ok(forgiving(|| ds.unlock(dir, pick, ui))?)
}

/// On a terminal a mistyped password is forgiven twice, as `fscrypt` re-asks: `op` runs again and
/// asks again. Only a secret the protector itself judged wrong: a device's PIN check (a TPM
/// counts every wrong PIN towards its lockout) ends at once, with its tries left.
fn forgiving<T>(mut op: impl FnMut() -> Result<T, OpsError>) -> Result<T, OpsError> {
    let tries = if std::io::stdin().is_terminal() { 3 } else { 1 };
    let mut n = 1;
    loop {
        match op() {
            Err(e) if n < tries => {
                let what = match &e {
                    OpsError::Protector(ProtectorError::IncorrectSecret { what, .. }) => *what,
                    _ => return Err(e),
                };
                eprintln!("incorrect {what}; try again");
                n += 1;
            }
            r => return r,
        }
    }
}

/// What the terminal's choice of protector came to.
enum Chosen {
    /// A protector that needs nothing typed opened the directory.
    Unlocked,
    /// The protector whose secret to ask (`None`: let the library pick, or say why it cannot).
    Ask(Option<ProtectorId>),
}

/// On a terminal, a directory that several protectors open: those that need nothing typed (a TPM
/// without PIN, then a security key's touch) are tried first; of the rest, one is asked for its
/// secret and several are offered as a numbered menu (as `fscrypt unlock` does) instead of
/// asking for `--protector`.
fn choose(ds: &Dirseal, dir: &Path, ui: &mut TermUi) -> Result<Chosen> {
    let st = ds.dir_status(dir)?;
    if st.protectors.len() < 2 || st.key == Some("unlocked") {
        return Ok(Chosen::Ask(None));
    }
    // A protector whose record cannot be read stays in the menu: choosing it names the problem.
    let untyped = |p: &ProtectorSummary| ds.keystore().protector(&p.id).ok().map(|r| r.kind.ask());
    let mut quiet: Vec<(&ProtectorSummary, bool)> =
        st.protectors.iter().filter_map(|p| untyped(p).filter(|a| a.secret.is_none()).map(|a| (p, a.touch))).collect();
    // No wait first: a TPM answers at once, a security key waits for a touch.
    quiet.sort_by_key(|(_, touch)| *touch);
    let mut last = None;
    for (p, _) in &quiet {
        match ds.unlock(dir, Pick { protector: Some(p.id) }, ui) {
            Ok(()) => return Ok(Chosen::Unlocked),
            Err(e @ OpsError::Ui(_)) => return Err(e.into()),
            Err(e) => {
                eprintln!("protector {} ({}) did not open it: {}", clean(&p.name), p.id, clean(&e.to_string()));
                last = Some(e);
            }
        }
    }
    let typed: Vec<&ProtectorSummary> =
        st.protectors.iter().filter(|p| !quiet.iter().any(|(q, _)| q.id == p.id)).collect();
    match (typed.as_slice(), last) {
        ([], Some(e)) => return Err(e.into()),
        ([], None) => return Ok(Chosen::Ask(None)),
        ([one], _) => return Ok(Chosen::Ask(Some(one.id))),
        _ => {}
    }
    eprintln!("{} opens with any of:", clean(&dir.display().to_string()));
    for (n, p) in typed.iter().enumerate() {
        eprintln!("  {}) {}", n + 1, protector_line(p));
    }
    loop {
        let answer = term::ask_visible(&format!("Which one (1-{})? ", typed.len()))?;
        match answer.trim().parse::<usize>() {
            Ok(n) if (1..=typed.len()).contains(&n) => return Ok(Chosen::Ask(Some(typed[n - 1].id))),
            _ => eprintln!("type a number from 1 to {}", typed.len()),
        }
    }
}

/// One line per marked directory; exit 1 if any stays locked (the unit retries: a network server
/// may answer later in the boot).
fn unlock_at_boot(ds: &Dirseal, ui: &mut TermUi) -> Result<i32> {
    let results = ds.unlock_marked(ui);
    if results.is_empty() {
        println!("no directory is marked to unlock at boot ([tang] unlock_at_boot in {})", ds.config_path().display());
    }
    let mut rc = 0;
    for (dir, r) in results {
        let dir = clean(&dir.display().to_string());
        match r {
            Ok(ops::Marked::Unlocked) => println!("{dir}: unlocked"),
            Ok(ops::Marked::AlreadyUnlocked) => println!("{dir}: already unlocked"),
            Err(e) => {
                eprintln!("{dir}: still locked: {}", clean(&e.to_string()));
                rc = 1;
            }
        }
    }
    Ok(rc)
}

fn lock(ds: &Dirseal, dir: &Path, all_users: bool, json: bool) -> Result<i32> {
    report_lock(&ds.lock(dir, all_users)?, json)
}

/// What `lock` did, and what to do about what it could not; the exit code.
fn report_lock(r: &LockReport, json: bool) -> Result<i32> {
    if json {
        print_json(r)?;
    } else if r.already_locked {
        println!("{} is already locked", clean(&r.path.display().to_string()));
    } else if r.locked {
        println!("locked {}", clean(&r.path.display().to_string()));
    }
    if r.locked {
        return Ok(0);
    }
    let d = clean(&r.path.display().to_string());
    if r.files_busy {
        let mut msg = format!("{d} is only partly locked: files in it are still open");
        if r.busy.is_empty() {
            msg.push_str(
                " (no process holding them could be identified; they may be open through another mount or namespace)",
            );
        } else {
            msg.push_str(" by:");
            for p in &r.busy {
                msg.push_str(&format!("\n  pid {} ({}, uid {}): {}", p.pid, clean(&p.comm), p.uid, clean(&p.how)));
            }
        }
        msg.push_str(&format!("\nclose them, then run `dirseal lock {d}` again to finish locking"));
        eprintln!("dirseal: {msg}");
    } else if r.other_users {
        eprintln!(
            "dirseal: {d} stays unlocked because other users also added its key; run `dirseal lock --all-users {d}`"
        );
    } else {
        eprintln!("dirseal: {d} is not fully locked; run `dirseal lock {d}` again");
    }
    Ok(1)
}

#[derive(Serialize)]
struct DirStatusOut {
    #[serde(flatten)]
    status: ops::DirStatus,
    /// State of a conversion of this directory recorded in its work dir, if any.
    conversion: Option<String>,
    /// Whether a recovery key is stored on the directory; `None` when hidden.
    recovery_key: Option<bool>,
    /// Run by a user other than root: keystore facts and the recovery key are not shown.
    hidden: bool,
    /// The display managers that log in the user whose home this is, and what the next boot does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    autologin: Vec<dirseal::autologin::Status>,
}

/// Root's view of a directory: the keystore's facts and the root-only recovery key attribute too.
fn status_dir(ds: &Dirseal, dir: &Path, json: bool) -> Result<()> {
    let status = ds.dir_status(dir)?;
    // A conversion scheduled for the next boot, or run by the boot (the keystore's record, of the
    // top of the tree).
    let top = status.encrypted_root.clone().unwrap_or_else(|| dir.to_path_buf());
    let at_boot = dirseal::convert::boot_state(ds, &top).ok().flatten();
    let live = dirseal::convert::live_status(ds, &top).ok().flatten().map(|l| l.to_string());
    // The recovery key is stored on the top of the encrypted tree, whichever directory was asked.
    let recovery_key = status
        .encrypted_root
        .as_deref()
        .is_some_and(|top| dirseal::recovery::read_blob(top).is_ok_and(|b| b.is_some()));
    let here = std::fs::canonicalize(dir).ok();
    let autologin = match here {
        Some(_) => ds
            .autologin_status(Path::new("/"))
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s.home.as_deref().and_then(|h| std::fs::canonicalize(h).ok()) == here)
            .collect(),
        None => Vec::new(),
    };
    print_dir_status(status, Some(recovery_key), autologin, at_boot, live, json)
}

/// A directory's status; `recovery_key` is `None` where the keystore's facts are hidden (a user
/// other than root, without the service's word).
fn print_dir_status(
    status: ops::DirStatus,
    recovery_key: Option<bool>,
    autologin: Vec<dirseal::autologin::Status>,
    at_boot: Option<dirseal::scheduled::BootState>,
    live: Option<String>,
    json: bool,
) -> Result<()> {
    let hidden = recovery_key.is_none();
    // A conversion is recorded for the top of the tree: a subdirectory reports its tree's.
    let top = status.encrypted_root.as_deref().unwrap_or(&status.path);
    let view = dirseal::convert::absolute(top).ok().and_then(|abs| dirseal::convert::status(&abs).ok().flatten());
    // Scheduled for the next boot, or run by the boot: said instead of the journal's state.
    let scheduled = matches!(at_boot, Some(dirseal::scheduled::BootState::Pending(_)));
    let conversion = match (&live, scheduled) {
        (Some(l), _) => Some(l.clone()),
        (None, true) => Some("scheduled".to_string()),
        (None, false) => view.as_ref().map(|v| v.state.to_string()),
    };
    // A live conversion's line says more than its schedule (only its fallback).
    let at_boot = live.or_else(|| at_boot.as_ref().map(boot::state_text));
    let out = DirStatusOut { status, conversion, recovery_key, hidden, autologin };
    if json {
        return print_json(&out);
    }
    let s = &out.status;
    println!("{}", clean(&s.path.display().to_string()));
    println!("  filesystem: {}", filesystem_line(&s.filesystem));
    match s.policy {
        None => println!("  encrypted:  no"),
        Some(p) => {
            println!("  encrypted:  yes (policy {p})");
            let asked = std::fs::canonicalize(&s.path).ok();
            if let Some(top) = s.encrypted_root.as_deref().filter(|t| asked.as_deref() != Some(*t)) {
                println!(
                    "  part of:    {} (one key locks and unlocks the whole tree)",
                    clean(&top.display().to_string())
                );
            }
            println!("  key:        {}", s.key.unwrap_or("unknown"));
            println!(
                "  managed:    {}",
                match (hidden, s.managed) {
                    (true, _) => "hidden (the keystore is root's: `sudo dirseal status` shows protectors)",
                    (false, true) if s.portable.is_some() => "yes, portable",
                    (false, true) => "yes",
                    (false, false) => "no (no policy record in the keystore)",
                }
            );
        }
    }
    if let Some(records) = &s.portable {
        println!(
            "  records:    on the medium, {} (it opens on any machine with dirseal)",
            clean(&records.display().to_string())
        );
    }
    if !s.protectors.is_empty() {
        println!("  protectors:");
        for p in &s.protectors {
            let place = match (s.portable.is_some(), p.stored) {
                (false, _) => "",
                (true, "medium") => "  [on the medium: opens on any machine]",
                (true, _) => "  [this machine's keystore: opens here only]",
            };
            println!("    {}{place}", protector_line(p));
        }
    }
    for id in &s.elsewhere {
        println!("    {id}  kept on another machine (its keystore): does not open it here");
    }
    if s.encrypted {
        println!(
            "  recovery:   {}",
            match out.recovery_key {
                None => "hidden (stored where only root reads it)",
                Some(true) => "yes",
                Some(false) => "no (create one with `dirseal recovery add`)",
            }
        );
    }
    match (&at_boot, &view) {
        (Some(b), _) => println!("  conversion: {}", clean(b)),
        (None, Some(v)) => println!("  conversion: {}", convert::status_text(v)),
        (None, None) => {}
    }
    for a in &out.autologin {
        println!(
            "  autologin:  {} logs this user in; next boot {}",
            a.configured.manager.name(),
            clean(&a.next_boot_text)
        );
    }
    for p in &s.problems {
        println!("  problem:    {}", clean(p));
    }
    for w in &s.warnings {
        println!("  warning:    {}", clean(w));
    }
    Ok(())
}

/// The filesystem under a path and whether it can encrypt, with the way to enable it.
fn filesystem_line(f: &ops::FsStatus) -> String {
    use dirseal::fscrypt::Support;
    let at = format!("{} at {} ({})", clean(&f.fstype), clean(&f.mount_point.display().to_string()), clean(&f.device));
    match f.encryption {
        Support::Enabled => format!("{at}, can encrypt"),
        Support::ReadOnly => format!(
            "{at}, mounted read-only: nothing can be encrypted on it until `mount -o remount,rw {}`",
            clean(&f.mount_point.display().to_string())
        ),
        Support::NotEnabled if f.fstype == "f2fs" => format!(
            "{at}, cannot encrypt until its encrypt feature is enabled: `fsck.f2fs -O encrypt {}` (f2fs needs it unmounted)",
            clean(&f.device)
        ),
        Support::NotEnabled => format!(
            "{at}, cannot encrypt until its encrypt feature is enabled: `tune2fs -O encrypt {}` (works while mounted)",
            clean(&f.device)
        ),
        Support::Unsupported => format!("{at}, cannot encrypt (fscrypt needs ext4 or f2fs)"),
    }
}

fn protector_line(p: &ProtectorSummary) -> String {
    let uid = p.uid.map(|u| format!(" (uid {u})")).unwrap_or_default();
    format!("{}  {:<8}  {}{uid}", p.id, p.kind, clean(&p.name))
}

#[derive(Serialize)]
struct PolicyOut {
    id: KeyIdentifier,
    path_hint: Option<PathBuf>,
    key: Option<&'static str>,
    protectors: Vec<ProtectorId>,
}

#[derive(Serialize)]
struct ProtectorOut {
    #[serde(flatten)]
    summary: ProtectorSummary,
    policies: Vec<KeyIdentifier>,
    /// Wrong PINs its device still takes (TPM protectors whose TPM answers).
    #[serde(skip_serializing_if = "Option::is_none")]
    tries_left: Option<u32>,
    /// A decrypt of this directory stopped in its clean-up before removing this protector; the
    /// same decrypt command finishes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    left_by_decrypt_of: Option<PathBuf>,
}

#[derive(Serialize)]
struct Overview {
    keystore: PathBuf,
    policies: Vec<PolicyOut>,
    protectors: Vec<ProtectorOut>,
    /// Portable directories on mounted media, whose records are on the medium, not here.
    portable: Vec<ops::PortableDir>,
    problems: Vec<String>,
    /// Display managers' autologins and what the next boot does with each (docs/pam.md).
    autologin: Vec<dirseal::autologin::Status>,
}

fn overview_data(ds: &Dirseal) -> Result<Overview> {
    let ks = ds.keystore();
    let mut problems = Vec::new();
    let mut policies = Vec::new();
    let mut records: Vec<PolicyRecord> = Vec::new();
    for (_, p) in ks.policies()? {
        match p {
            Ok(p) => records.push(p),
            Err(e) => problems.push(e.to_string()),
        }
    }
    for p in &records {
        policies.push(PolicyOut {
            id: p.id,
            path_hint: p.path_hint.clone(),
            key: ds.policy_key_status(p),
            protectors: p.wrapped.keys().copied().collect(),
        });
    }
    let mut protectors = Vec::new();
    let cleanups = dirseal::decrypt::unfinished_cleanups();
    for (_, r) in ks.protectors()? {
        match r {
            Ok(r) => protectors.push(ProtectorOut {
                policies: records.iter().filter(|p| p.wrapped.contains_key(&r.id)).map(|p| p.id).collect(),
                tries_left: if r.kind.ask().secret.is_some() { r.kind.tries_left(ds.config()) } else { None },
                left_by_decrypt_of: cleanups.iter().find(|(_, id)| *id == r.id).map(|(dir, _)| dir.clone()),
                summary: ProtectorSummary::of(&r),
            }),
            Err(e) => problems.push(e.to_string()),
        }
    }
    let autologin = ds.autologin_status(Path::new("/")).unwrap_or_else(|e| {
        problems.push(format!("autologin: {e}"));
        Vec::new()
    });
    let (portable, unreadable) = ds.portable_dirs();
    problems.extend(unreadable);
    Ok(Overview { keystore: ks.root().to_path_buf(), policies, protectors, portable, problems, autologin })
}

fn print_policies(o: &Overview) {
    if o.policies.is_empty() && o.portable.is_empty() {
        println!("no encrypted directories yet: `dirseal convert DIR` encrypts one that holds data");
    }
    for p in &o.policies {
        let path =
            p.path_hint.as_ref().map(|h| clean(&h.display().to_string())).unwrap_or_else(|| "(unknown path)".into());
        println!("policy {}  {:<16}  {path}", p.id, p.key.unwrap_or("unknown"));
        for id in &p.protectors {
            match o.protectors.iter().find(|r| r.summary.id == *id) {
                Some(r) => println!("    {}", protector_line(&r.summary)),
                None => println!("    {id}  (unreadable or missing protector)"),
            }
        }
    }
    print_portable(o);
}

/// The portable directories of mounted media, after this keystore's policies.
fn print_portable(o: &Overview) {
    for d in &o.portable {
        let path = d.path_hint.as_ref().map_or_else(|| "(unknown path)".into(), |h| clean(&h.display().to_string()));
        println!(
            "portable {}  {:<16}  {path}  (records on the medium: {})",
            d.policy,
            d.key.unwrap_or("unknown"),
            clean(&d.records.display().to_string())
        );
        for id in &d.protectors {
            println!("    {id}");
        }
    }
}

fn print_protectors(o: &Overview) {
    if o.protectors.is_empty() {
        println!("no protectors");
    }
    for r in &o.protectors {
        let used = if let Some(dir) = &r.left_by_decrypt_of {
            let dir = clean(&dir.display().to_string());
            format!("left by an interrupted decrypt of {dir}: `dirseal decrypt {dir}` finishes its clean-up")
        } else if r.policies.is_empty() {
            "unused".to_string()
        } else {
            format!("{} polic{}", r.policies.len(), if r.policies.len() == 1 { "y" } else { "ies" })
        };
        let tries = r.tries_left.map(|n| format!("  ({n} PIN tries left)")).unwrap_or_default();
        println!("{}  {used}{tries}", protector_line(&r.summary));
    }
}

fn print_problems(o: &Overview) {
    for p in &o.problems {
        println!("problem: {}", clean(p));
    }
}

fn overview(ds: &Dirseal, json: bool) -> Result<()> {
    let o = overview_data(ds)?;
    if json {
        return print_json(&o);
    }
    println!("keystore {}", clean(&o.keystore.display().to_string()));
    print_policies(&o);
    println!();
    print_protectors(&o);
    if !o.autologin.is_empty() {
        println!();
        autologin::print_status(&o.autologin);
    }
    print_problems(&o);
    Ok(())
}

fn protector(ds: &mut Dirseal, cmd: ProtectorCmd, ui: &mut TermUi) -> Result<()> {
    match cmd {
        ProtectorCmd::List { json } => {
            let o = overview_data(ds)?;
            if json {
                #[derive(Serialize)]
                struct Out<'a> {
                    protectors: &'a [ProtectorOut],
                    problems: &'a [String],
                }
                return print_json(&Out { protectors: &o.protectors, problems: &o.problems });
            }
            print_protectors(&o);
            print_problems(&o);
        }
        ProtectorCmd::Create { name, protector_type, user, kdf } => {
            let uid = user.as_deref().map(ops::lookup_user).transpose()?.map(|(uid, _)| uid);
            let n = NewProtector::for_user(uid, kdf.kind(&protector_type)?, Some(&name));
            let (rec, _) = ds.create_protector(&n, ui)?;
            println!("created protector {} ({})", rec.id, clean(&rec.name));
        }
        ProtectorCmd::Remove { id } => {
            let id = id.id(ds)?;
            ds.remove_protector(&id)?;
            println!("removed protector {id}");
        }
        ProtectorCmd::Verify { id } => {
            let id = id.id(ds)?;
            let rec: ProtectorRecord = forgiving(|| ds.verify_protector(&id, ui))?;
            println!("the secret of protector {} ({}) is correct", rec.id, clean(&rec.name));
        }
        ProtectorCmd::ChangePassword { id } => {
            let id = id.id(ds)?;
            let rec = forgiving(|| ds.change_secret(&id, ui))?;
            println!("changed the password of protector {} ({})", rec.id, clean(&rec.name));
        }
    }
    Ok(())
}

/// The policy record a target names: a directory's (on its medium when it is portable), or the
/// keystore's record of that id.
fn policy_record(ds: &Dirseal, t: &PolicyTarget) -> Result<PolicyRecord> {
    match (&t.dir, t.policy) {
        (_, Some(id)) => Ok(ds.policy(&id)?),
        (Some(dir), None) => Ok(ds.policy_of(dir)?),
        (None, None) => bail!("name the policy: give a DIR or --policy ID"),
    }
}

fn policy(ds: &mut Dirseal, cmd: PolicyCmd, ui: &mut TermUi) -> Result<()> {
    match cmd {
        PolicyCmd::List { json } => {
            let o = overview_data(ds)?;
            if json {
                #[derive(Serialize)]
                struct Out<'a> {
                    policies: &'a [PolicyOut],
                    problems: &'a [String],
                }
                return print_json(&Out { policies: &o.policies, problems: &o.problems });
            }
            print_policies(&o);
            print_problems(&o);
        }
        PolicyCmd::AddProtector { target, with, new } => {
            let policy = policy_record(ds, &target)?;
            let id = policy.id;
            let what = target.dir.as_ref().map_or_else(|| format!("policy {id}"), |d| d.display().to_string());
            let with = ProtectorRef::pick_for(&with, ds, &policy, &what)?;
            let choice = new.choice(ds, None)?;
            let rec = ds.add_protector_to(&policy, with, choice, ui)?;
            println!("protector {} ({}) now opens policy {id}", rec.id, clean(&rec.name));
        }
        PolicyCmd::RemoveProtector { target, protector } => {
            let policy = policy_record(ds, &target)?;
            let id = policy.id;
            let protector = protector.id(ds)?;
            ds.remove_protector_from(&policy, &protector)?;
            println!("protector {protector} no longer opens policy {id}");
        }
    }
    Ok(())
}
