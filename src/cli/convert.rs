//! `dirseal convert`: preflight, confirm, choose the protector, then run or resume the engine
//! with a progress bar (or JSON lines) and clean stops on SIGINT/SIGTERM.
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;

use dirseal::convert::{self, KeyHost};
use dirseal::ops::{Dirseal, Pick};
use dirseal::ui::{Progress, Ui};
use dirseal_migrate::{self as migrate, Outcome, Request, State, StatusView};

use super::term::{clean, confirm, TermUi};
use super::ProtectorArgs;

#[derive(Args)]
pub struct ConvertArgs {
    /// The directory to encrypt in place
    dir: Option<PathBuf>,
    #[command(flatten)]
    protector: ProtectorArgs,
    #[command(flatten)]
    recovery: super::recovery::RecoveryOffer,
    /// Do not ask for confirmation
    #[arg(long, short = 'y')]
    yes: bool,
    /// Keep the old plaintext until `--commit` (or restore it with `--rollback`)
    #[arg(long)]
    keep_backup: bool,
    /// Overwrite the old plaintext before deleting it, then TRIM the filesystem
    #[arg(long)]
    wipe: bool,
    /// Convert even if programs use the directory (their changes during the copy are recopied)
    #[arg(long)]
    force: bool,
    /// Copy threads [default: number of CPUs]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// One JSON progress object per second on stdout, and a JSON result
    #[arg(long)]
    pub json: bool,
    /// Resume an interrupted conversion (what a plain re-run does too)
    #[arg(long, group = "mode")]
    resume: bool,
    /// Before the swap: remove the copy, leave the original untouched
    #[arg(long, group = "mode")]
    abort: bool,
    /// After a swap kept with --keep-backup: put the plaintext back
    #[arg(long, group = "mode")]
    rollback: bool,
    /// After a swap kept with --keep-backup: delete the old plaintext
    #[arg(long, group = "mode")]
    commit: bool,
    /// Show the recorded state of a conversion
    #[arg(long, group = "mode")]
    status: bool,
}

#[derive(Serialize)]
struct OutcomeOut<'a> {
    path: &'a Path,
    state: String,
    files: u64,
    bytes: u64,
    policy: &'a str,
    backup: Option<&'a Path>,
    notes: &'a [String],
}

#[derive(Serialize)]
struct StatusOut<'a> {
    path: &'a Path,
    state: String,
    policy: &'a str,
    files_done: u64,
    files_total: u64,
    bytes_done: u64,
    bytes_total: u64,
    keep_backup: bool,
    started_unix: u64,
}

fn status_out(v: &StatusView) -> StatusOut<'_> {
    StatusOut {
        path: &v.source,
        state: v.state.to_string(),
        policy: &v.token,
        files_done: v.files_done,
        files_total: v.files_total,
        bytes_done: v.bytes_done,
        bytes_total: v.bytes_total,
        keep_backup: v.keep_backup,
        started_unix: v.started_unix,
    }
}

/// Progress for humans (a bar on a terminal) or front ends (JSON lines, at most one per second).
struct Reporter {
    bar: Option<indicatif::ProgressBar>,
    json: Option<Mutex<Option<(Instant, String)>>>,
}

impl Reporter {
    fn new(json: bool) -> Reporter {
        if json {
            return Reporter { bar: None, json: Some(Mutex::new(None)) };
        }
        if !std::io::stderr().is_terminal() {
            return Reporter { bar: None, json: None };
        }
        let bar = indicatif::ProgressBar::new(0);
        let style = indicatif::ProgressStyle::with_template(
            "{msg:10} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {prefix}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        Reporter { bar: Some(bar), json: None }
    }

    fn report(&self, p: &Progress) {
        if let Some(bar) = &self.bar {
            bar.set_message(p.phase.clone());
            bar.set_length(p.bytes_total);
            bar.set_position(p.bytes_done);
            bar.set_prefix(format!("{}/{} files", p.files_done, p.files_total));
        }
        if let Some(last) = &self.json {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            // One line per second, and one at every phase change so front ends see each phase.
            let same_phase = last.as_ref().is_some_and(|(_, ph)| *ph == p.phase);
            if same_phase && last.as_ref().is_some_and(|(t, _)| t.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *last = Some((Instant::now(), p.phase.clone()));
            #[derive(Serialize)]
            struct Line<'a> {
                progress: &'a Progress,
            }
            if let Ok(s) = serde_json::to_string(&Line { progress: p }) {
                println!("{s}");
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

pub fn run(ds: &mut Dirseal, args: ConvertArgs, ui: &mut TermUi) -> Result<i32> {
    let Some(dir) = args.dir.clone() else {
        if args.status {
            return status_all(args.json);
        }
        bail!("name the directory to convert: `dirseal convert DIR`");
    };
    let abs = convert::absolute(&dir)?;
    let workdir = convert::workdir_for(&abs)?;
    let view = convert::status(&abs)?;
    if args.status {
        return show_status(&abs, view.as_ref(), args.json);
    }

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let reporter = Reporter::new(args.json);
    let on_progress = |p: &Progress| reporter.report(p);
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2));
    let req = Request {
        source: &abs,
        workdir: &workdir,
        keep_backup: args.keep_backup,
        wipe: args.wipe,
        force: args.force,
        threads,
    };
    let mut recovery_key: Option<dirseal_recovery::RecoveryKey> = None;
    // A macro, not a closure: each host borrows `ds` only for the one engine call it serves.
    macro_rules! host {
        ($protector:expr) => {
            KeyHost {
                ds: &*ds,
                source: abs.clone(),
                protector: $protector,
                recovery: recovery_key.as_ref(),
                stop: &stop,
                on_progress: &on_progress,
            }
        };
    }

    let active = view.as_ref().filter(|v| !matches!(v.state, State::Done | State::Aborted | State::RolledBack));
    let result = if args.abort {
        migrate::abort(&workdir, &host!(None))
    } else if args.rollback {
        migrate::rollback(&workdir, &host!(None))
    } else if args.commit {
        migrate::commit(&workdir, &host!(None))
    } else if let Some(v) = active {
        if let Some(id) = convert::staging_key_needed(&abs, v)? {
            // After a reboot the staging key is gone: unlock it with the protector saved before
            // any data was copied.
            let policy = ds.keystore().policy(&id)?;
            let what = format!("the conversion of {}", abs.display());
            let (pid, pkey) =
                ds.unlock_policy_protector(&policy, Pick { protector: args.protector.protector }, &what, ui)?;
            let master = ds.master_key(&policy, &pid, &pkey)?;
            ds.add_key(&abs, &master)?;
        }
        ui.notice(&format!("resuming the conversion of {} ({})", abs.display(), v.state));
        migrate::convert(&req, &host!(None))
    } else if args.resume {
        bail!("no conversion of {} is in progress; start one with `dirseal convert {}`", abs.display(), abs.display());
    } else {
        // Nothing may be created (protector, policy, work dir) on a filesystem that cannot encrypt.
        dirseal::fscrypt::check_supported(&dirseal::fscrypt::mount_point(&abs)?)?;
        if !args.force {
            convert::check_owner_inactive(&abs)?;
        }
        // Refusals come before any question or secret.
        migrate::preflight(&req, &host!(None))?;
        if !args.yes {
            if !std::io::stdin().is_terminal() {
                bail!("converting {} needs confirmation; pass --yes when not on a terminal", abs.display());
            }
            let q = format!(
                "Encrypt {} in place? Its data is copied into an encrypted directory that replaces it.",
                clean(&abs.display().to_string())
            );
            if !confirm(&q) {
                bail!("cancelled; nothing was changed");
            }
        }
        if args.recovery.wanted() {
            let key = dirseal_recovery::RecoveryKey::generate();
            super::recovery::present(&key, &abs)?;
            recovery_key = Some(key);
        }
        let user = args.protector.user_or_owner(&abs)?;
        let chosen = ds.resolve_protector(args.protector.choice(&user)?, ui)?;
        migrate::convert(&req, &host!(Some(chosen)))
    };
    reporter.finish();
    let outcome = result?;
    if recovery_key.is_some() && matches!(outcome.state, State::Done | State::Swapped) && !has_recovery(&abs) {
        eprintln!(
            "dirseal: the recovery key shown above was not saved on {d}; create a new one with `dirseal recovery add {d}`",
            d = clean(&abs.display().to_string())
        );
    }
    report(&abs, &outcome, args.json)?;
    Ok(0)
}

fn report(abs: &Path, o: &Outcome, json: bool) -> Result<()> {
    if json {
        let out = OutcomeOut {
            path: abs,
            state: o.state.to_string(),
            files: o.files,
            bytes: o.bytes,
            policy: &o.token,
            backup: o.backup.as_deref(),
            notes: &o.notes,
        };
        println!("{}", serde_json::to_string(&serde_json::json!({ "result": out }))?);
        return Ok(());
    }
    let d = clean(&abs.display().to_string());
    match o.state {
        State::Done => println!(
            "{d} is now encrypted (policy {}) and unlocked: {} entries, {} bytes copied",
            o.token, o.files, o.bytes
        ),
        State::Swapped => {
            println!("{d} is now encrypted (policy {}) and unlocked; the old plaintext is kept", o.token);
            if let Some(b) = &o.backup {
                println!("  backup: {}", clean(&b.display().to_string()));
            }
            println!(
                "  run `dirseal convert --commit {d}` to delete it, or `dirseal convert --rollback {d}` to restore it"
            );
        }
        State::Aborted => println!("aborted the conversion of {d}; the original is untouched"),
        State::RolledBack => println!("rolled back: {d} holds the original plaintext again"),
        s => println!("conversion of {d}: {s}"),
    }
    for n in &o.notes {
        println!("note: {}", clean(n));
    }
    Ok(())
}

fn show_status(abs: &Path, v: Option<&StatusView>, json: bool) -> Result<i32> {
    match (v, json) {
        (None, true) => println!("{}", serde_json::json!({ "path": abs, "state": null })),
        (None, false) => println!("no conversion recorded for {}", clean(&abs.display().to_string())),
        (Some(v), true) => println!("{}", serde_json::to_string(&status_out(v))?),
        (Some(v), false) => print_status(v),
    }
    Ok(0)
}

fn print_status(v: &StatusView) {
    println!(
        "{}: {} ({}/{} files, {}/{} bytes), policy {}",
        clean(&v.source.display().to_string()),
        v.state,
        v.files_done,
        v.files_total,
        v.bytes_done,
        v.bytes_total,
        if v.token.is_empty() { "-" } else { &v.token }
    );
}

/// Every conversion recorded on any mounted filesystem.
fn status_all(json: bool) -> Result<i32> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut found = Vec::new();
    for line in mounts.lines() {
        let Some(mp) = line.split(' ').nth(1) else { continue };
        let base = Path::new(&unescape(mp)).join(".dirseal/convert");
        let Ok(entries) = std::fs::read_dir(&base) else { continue };
        for e in entries.flatten() {
            if let Ok(Some(v)) = migrate::status(&e.path()) {
                found.push(v);
            }
        }
    }
    if json {
        let list: Vec<StatusOut<'_>> = found.iter().map(status_out).collect();
        println!("{}", serde_json::to_string(&serde_json::json!({ "conversions": list }))?);
    } else if found.is_empty() {
        println!("no conversions recorded");
    } else {
        found.iter().for_each(print_status);
    }
    Ok(0)
}

/// /proc/self/mounts escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn has_recovery(dir: &Path) -> bool {
    dirseal::recovery::read_blob(dir).is_ok_and(|b| b.is_some())
}
