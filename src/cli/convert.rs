//! `dirseal convert`: flags to [`dirseal::convert`]'s plan and run, a progress bar (or JSON
//! lines), and clean stops on SIGINT/SIGTERM.
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::HumanBytes;
use serde::Serialize;

use dirseal::convert::{self, ConvertError, Converted, Finish, Hooks, Options, Plan};
use dirseal::ops::{Dirseal, Pick, ProtectorChoice};
use dirseal::ui::Progress;
use dirseal_migrate::{Method, Outcome, State, StatusView};

use super::progress::Reporter;
use super::term::{clean, TermUi};
use super::ProtectorArgs;

#[derive(Args)]
pub struct ConvertArgs {
    /// The directory to encrypt in place
    #[arg(required_unless_present = "status")]
    dir: Option<PathBuf>,
    #[command(flatten)]
    protector: ProtectorArgs,
    #[command(flatten)]
    recovery: super::recovery::RecoveryOffer,
    /// Do not ask for confirmation
    #[arg(long, short = 'y')]
    yes: bool,
    /// Keep the directory's records on its own filesystem (removable media) so that it opens on
    /// any machine with its password or security key; a TPM protector cannot be its only one
    #[arg(long)]
    portable: bool,
    /// Keep the old plaintext until `--commit` (or restore it with `--rollback`)
    #[arg(long)]
    keep_backup: bool,
    /// Overwrite the old plaintext before deleting it, then TRIM the filesystem
    #[arg(long)]
    wipe: bool,
    /// When done, overwrite the filesystem's free space (`dirseal scrub`): the old plaintext and
    /// what files deleted earlier left behind
    #[arg(long)]
    scrub: bool,
    /// Convert even if programs use the directory (their changes during the copy are recopied)
    #[arg(long)]
    force: bool,
    /// copy: a second copy next to the original (needs room for it); move: the data moves into the
    /// encrypted directory chunk by chunk (for a nearly full disk; no backup window); auto: copy
    /// when it fits, else move
    #[arg(long = "mode", value_enum, default_value = "auto", value_name = "MODE")]
    data_mode: DataMode,
    /// Worker threads [default: two per CPU, at least 4]
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

#[derive(Clone, Copy, clap::ValueEnum)]
pub(super) enum DataMode {
    Copy,
    Move,
    Auto,
}

#[derive(Serialize)]
pub(super) struct OutcomeOut<'a> {
    path: &'a Path,
    state: String,
    method: String,
    files: u64,
    /// Data copied (the same as `data_bytes`; kept for older readers).
    bytes: u64,
    data_bytes: u64,
    /// Sum of file sizes, when known (not on a resumed run).
    apparent_bytes: Option<u64>,
    policy: &'a str,
    backup: Option<&'a Path>,
    notes: &'a [String],
    /// Seconds of wall time per part of this run (scan, copy, sync, verify, swap, dispose, ...).
    timings: serde_json::Map<String, serde_json::Value>,
}

#[derive(Serialize)]
pub(super) struct StatusOut<'a> {
    path: &'a Path,
    state: String,
    method: String,
    policy: &'a str,
    files_done: u64,
    files_total: u64,
    bytes_done: u64,
    bytes_total: u64,
    keep_backup: bool,
    started_unix: u64,
    /// A live process is running it now; otherwise it was interrupted and resumes when run again.
    running: bool,
}

pub(super) fn status_out(v: &StatusView) -> StatusOut<'_> {
    StatusOut {
        path: &v.source,
        state: v.state.to_string(),
        method: v.method.to_string(),
        policy: &v.token,
        files_done: v.files_done,
        files_total: v.files_total,
        bytes_done: v.bytes_done,
        bytes_total: v.bytes_total,
        keep_backup: v.keep_backup,
        started_unix: v.started_unix,
        running: v.running,
    }
}

/// `convert --status [DIR]`: reads the work dirs only, so it runs before (and without) the
/// keystore, which a look at the state must never create.
pub fn status_only(args: &ConvertArgs) -> Option<Result<i32>> {
    if !args.status {
        return None;
    }
    Some(match &args.dir {
        None => status_all(args.json),
        Some(dir) => convert::absolute(dir)
            .map_err(anyhow::Error::from)
            .and_then(|abs| show_status(&abs, convert::status(&abs)?.as_ref(), args.json)),
    })
}

pub fn run(ds: &mut Dirseal, args: ConvertArgs, ui: &mut TermUi) -> Result<i32> {
    let Some(dir) = args.dir.clone() else {
        bail!("name the directory to convert: `dirseal convert DIR`");
    };
    let abs = convert::absolute(&dir)?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let reporter = Reporter::new(args.json);
    let progress = |p: &Progress| reporter.report(p);
    let hooks = Hooks { progress: &progress, stop: &stop };
    let finish = match (args.abort, args.rollback, args.commit) {
        (true, _, _) => Some(Finish::Abort),
        (_, true, _) => Some(Finish::Rollback),
        (_, _, true) => Some(Finish::Commit),
        _ => None,
    };
    // Sizes as the plan counted them, for the result (a resumed run has none).
    let mut summary = None;
    let result = if let Some(how) = finish {
        convert::finish(ds, &abs, how, ui, &hooks).map(|outcome| Converted { outcome, recovery_key_saved: None })
    } else {
        if args.resume && !convert::status(&abs)?.is_some_and(|v| convert::unfinished(v.state)) {
            return Err(ConvertError::NotInProgress { path: abs.clone() })
                .context(format!("start one with `dirseal convert {}`", abs.display()));
        }
        let options = Options {
            keep_backup: args.keep_backup,
            wipe: args.wipe,
            force: args.force,
            owner_asks: false,
            threads: args.threads.unwrap_or(0),
            // --yes asks nothing but secrets: no recovery key unless the flags say so.
            recovery_key: args.recovery.decided().or(args.yes.then_some(false)),
            // The probe costs a few syncs: measured only when someone sees the estimate (the
            // question's summary, a bar, --json), not for a script's `--yes`.
            estimate: !args.yes || args.json || std::io::stderr().is_terminal(),
            portable: args.portable,
            mode: match args.data_mode {
                DataMode::Copy => convert::Mode::Copy,
                DataMode::Move => convert::Mode::Move,
                DataMode::Auto => convert::Mode::Auto,
            },
        };
        let plan = convert::plan(ds, &abs, options, &hooks)?;
        reporter.finish();
        summary = plan.summary();
        // The estimate weighs a file as the probe measured it against the data rate.
        if let Some(e) = summary.as_ref().and_then(|s| s.estimate.as_ref()) {
            reporter.set_file_cost(e.write_bytes_per_sec.saturating_mul(e.micros_per_entry) / 1_000_000);
        }
        if let (Some(s), true) = (&summary, args.json) {
            println!("{}", serde_json::to_string(&serde_json::json!({ "plan": s }))?);
        }
        let user = args.protector.user_or_owner(&abs)?;
        ui.login_user = user.as_ref().map(|u| u.name.clone());
        ui.assume_yes = args.yes;
        let choice = args.protector.choice(ds, &user)?;
        match plan {
            Plan::New(plan) => plan.run(ds, choice, ui, &hooks),
            // Resuming makes no protector: `--protector` at most names the one that reloads the
            // staging key.
            Plan::Resume(plan) => {
                let pick = match choice {
                    ProtectorChoice::Existing(id) => Pick { protector: Some(id) },
                    ProtectorChoice::New(_) => Pick::default(),
                };
                plan.run(ds, pick, ui, &hooks)
            }
        }
    };
    reporter.finish();
    let done = result?;
    if done.recovery_key_saved == Some(false) {
        eprintln!(
            "dirseal: the recovery key shown above was not saved on {d}; create a new one with `dirseal recovery add {d}`",
            d = clean(&abs.display().to_string())
        );
    }
    report(&abs, &done.outcome, summary.as_ref().map(|s| s.apparent_bytes), args.json)?;
    if args.scrub {
        return scrub_after(&abs, &done.outcome, &stop, args.json);
    }
    if !args.json && done.outcome.state == State::Done {
        let d = clean(&abs.display().to_string());
        if args.recovery.decided().is_none() && args.yes {
            println!("note: no recovery key was made (--yes makes one only with --recovery-key); `dirseal recovery add {d}` makes one");
        }
        if !args.wipe {
            let mp = dirseal::fscrypt::mount_point(&abs)?;
            println!(
                "note: `dirseal scrub {}` overwrites the free space, the old plaintext's blocks included",
                clean(&mp.display().to_string())
            );
        }
    }
    Ok(0)
}

/// `--scrub`: once the old plaintext is deleted, overwrite the filesystem's free space.
fn scrub_after(abs: &Path, o: &Outcome, stop: &AtomicBool, json: bool) -> Result<i32> {
    if o.state != State::Done {
        eprintln!(
            "dirseal: not scrubbing: the conversion is {}, so the old plaintext is still there; run `dirseal convert --commit --scrub {}` when you are sure",
            o.state,
            clean(&abs.display().to_string())
        );
        return Ok(0);
    }
    let mp = dirseal::fscrypt::mount_point(abs)?;
    super::scrub::scrub_and_report(&mp, &dirseal::scrub::Options::default(), stop, json)
}

/// The result; `apparent` is the sum of file sizes when the plan counted it (a new conversion).
fn report(abs: &Path, o: &Outcome, apparent: Option<u64>, json: bool) -> Result<()> {
    if json {
        let out = outcome_out(abs, o, apparent);
        println!("{}", serde_json::to_string(&serde_json::json!({ "result": out }))?);
        return Ok(());
    }
    let d = clean(&abs.display().to_string());
    match o.state {
        State::Done => {
            let sizes = match apparent {
                Some(a) if a != o.bytes => format!(" (files' apparent size {}: sparse files)", HumanBytes(a)),
                _ => String::new(),
            };
            println!(
                "{d} is now encrypted (policy {}) and unlocked: {} entries, {} of data {}{sizes}",
                o.token,
                o.files,
                HumanBytes(o.bytes),
                if o.method == Method::Move { "moved" } else { "copied" }
            )
        }
        State::Swapped => {
            println!("{d} is now encrypted (policy {}) and unlocked; the old plaintext is kept", o.token);
            if let Some(b) = &o.backup {
                println!("  backup: {}", clean(&b.display().to_string()));
            }
            println!(
                "  run `dirseal convert --commit {d}` to delete it, or `dirseal convert --rollback {d}` to restore it"
            );
        }
        State::Aborted if o.method == Method::Move => {
            println!("aborted the conversion of {d}; every file was moved back as it was")
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

/// The JSON `result` of a run.
pub(super) fn outcome_out<'a>(abs: &'a Path, o: &'a Outcome, apparent: Option<u64>) -> OutcomeOut<'a> {
    OutcomeOut {
        path: abs,
        state: o.state.to_string(),
        method: o.method.to_string(),
        files: o.files,
        bytes: o.bytes,
        data_bytes: o.bytes,
        apparent_bytes: apparent,
        policy: &o.token,
        backup: o.backup.as_deref(),
        notes: &o.notes,
        timings: o.timings.parts().iter().map(|(p, d)| (p.to_string(), d.as_secs_f64().into())).collect(),
    }
}

pub(super) fn show_status(abs: &Path, v: Option<&StatusView>, json: bool) -> Result<i32> {
    match (v, json) {
        (None, true) => println!("{}", serde_json::json!({ "path": abs, "state": null })),
        (None, false) => println!("no conversion recorded for {}", clean(&abs.display().to_string())),
        (Some(v), true) => println!("{}", serde_json::to_string(&status_out(v))?),
        (Some(v), false) => print_status(v),
    }
    Ok(0)
}

fn print_status(v: &StatusView) {
    println!("{}: {}", clean(&v.source.display().to_string()), status_text(v));
}

/// A recorded conversion as a person reads it: finished, running now, or interrupted (with what
/// to run, and where a move's files are meanwhile).
pub fn status_text(v: &StatusView) -> String {
    let d = clean(&v.source.display().to_string());
    let cmd = v.direction.command();
    let counts = format!(
        "{} of {} files, {} of {}",
        v.files_done,
        v.files_total,
        HumanBytes(v.bytes_done),
        HumanBytes(v.bytes_total)
    );
    match v.state {
        State::Done | State::Aborted | State::RolledBack => v.state.to_string(),
        s if v.running => format!("{s}, running now ({counts})"),
        State::Swapped if v.direction == dirseal_migrate::Direction::Decrypt => format!(
            "decrypted; the encrypted tree is kept until `dirseal {cmd} --commit {d}` (or `--rollback` restores it)"
        ),
        State::Swapped => format!(
            "encrypted; the old plaintext is kept until `dirseal {cmd} --commit {d}` (or `--rollback` restores it)"
        ),
        State::RollingBack => format!("interrupted while rolling back; run `dirseal {cmd} --rollback {d}` to finish"),
        State::MovingBack => {
            format!("interrupted while moving files back; run `dirseal {cmd} --abort {d}` to finish")
        }
        s @ (State::Moving | State::Moved) => format!(
            "interrupted while {s} ({counts}); the files already moved are in the work dir's staging directory until \
             `dirseal {cmd} {d}` resumes (or `--abort` moves them back)"
        ),
        s => format!("interrupted while {s} ({counts}); run `dirseal {cmd} {d}` to resume (or `--abort`)"),
    }
}

/// Every conversion recorded on any mounted filesystem.
fn status_all(json: bool) -> Result<i32> {
    let found = convert::recorded()?;
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
