//! `dirseal convert`: flags to [`dirseal::convert`]'s plan and run, a progress bar (or JSON
//! lines), and clean stops on SIGINT/SIGTERM.
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use anyhow::{bail, Context, Result};
use indicatif::HumanBytes;
use serde::Serialize;

use dirseal::convert::{self, ConvertError, Converted, Hooks, Mode, Options, Plan, When};
use dirseal::convert::{Direction, Method, Outcome, State, StatusView};
use dirseal::ops::Dirseal;

use super::args::{ConvertArgs, DataMode};
use super::drive::{drive, Steps};
use super::term::{clean, TermUi};

impl From<DataMode> for Mode {
    fn from(m: DataMode) -> Mode {
        match m {
            DataMode::Copy => Mode::Copy,
            DataMode::Move => Mode::Move,
            DataMode::Auto => Mode::Auto,
        }
    }
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

/// `convert --status [DIR]`: reads the work dirs only, so it runs before (and without) the
/// keystore, which a look at the state must never create.
/// A conversion scheduled for the next boot (or run by it) is said so; that record is read from
/// the keystore named by `config` and `keystore`, only if it exists.
pub fn status_only(args: &ConvertArgs, config: &Path, keystore: Option<&Path>) -> Option<Result<i32>> {
    if !args.end.status {
        return None;
    }
    Some(match &args.dir {
        None => status_all(Dirseal::open_existing(config, keystore).ok().as_ref(), args.run.json),
        Some(dir) => convert::absolute(dir).map_err(anyhow::Error::from).and_then(|abs| {
            let at_boot =
                Dirseal::open_existing(config, keystore).ok().and_then(|ds| super::boot::state_line(&ds, &abs));
            let view = convert::status(&abs)?;
            match at_boot {
                // JSON readers get the journal's view; its state says "scheduled" while it waits.
                Some(line) if args.run.json => {
                    let mut out = serde_json::to_value(view.as_ref())?;
                    if let Some(o) = out.as_object_mut() {
                        if line.starts_with("scheduled") {
                            o.insert("state".into(), "scheduled".into());
                        }
                        o.insert(super::boot::line_key(&line).into(), line.into());
                    }
                    println!("{out}");
                    Ok(0)
                }
                Some(line) => {
                    println!("{}: {}", clean(&abs.display().to_string()), clean(&line));
                    Ok(0)
                }
                None => show_status(&abs, view.as_ref(), args.run.json),
            }
        }),
    })
}

pub fn run(ds: &mut Dirseal, args: ConvertArgs, ui: &mut TermUi) -> Result<i32> {
    if args.scheduled {
        return super::boot::run(ds, args.run.json);
    }
    let Some(dir) = args.dir.clone() else {
        bail!("name the directory to convert: `dirseal convert DIR`");
    };
    let abs = convert::absolute(&dir)?;
    if args.live_worker {
        return super::live::worker(ds, &abs);
    }
    let how = args.end.finish();
    if how == Some(convert::Finish::Abort) && convert::stop_live(&abs)? && !args.run.json {
        eprintln!("dirseal: stopped the background run of {}", clean(&abs.display().to_string()));
    }
    // Run again after it finished (a power cut just past "done"): said, not an error.
    if how.is_none() && !args.end.status {
        if let Some(policy) = convert::finished(&abs)? {
            let d = clean(&abs.display().to_string());
            if args.run.json {
                println!(
                    "{}",
                    serde_json::json!({ "result": { "path": abs, "state": "done", "already": true, "policy": policy.to_string() } })
                );
            } else {
                println!("{d} is already encrypted (policy {policy}): its conversion finished; `dirseal status {d}` shows it");
            }
            return Ok(0);
        }
    }
    if how.is_none() && args.resume && !convert::status(&abs)?.is_some_and(|v| convert::unfinished(v.state)) {
        return Err(ConvertError::NotInProgress { path: abs.clone() })
            .context(format!("start one with `dirseal convert {}`", abs.display()));
    }
    let escrow_required = ds.escrow().is_some_and(|e| e.required());
    let options = Options {
        keep_backup: args.keep_backup,
        wipe: args.wipe,
        force: args.run.force,
        owner_asks: false,
        threads: args.run.threads,
        // --yes asks nothing but secrets: no recovery key unless the flags say so, or escrow is
        // required (every new directory then gets one: the library decides).
        recovery_key: args.recovery.decided().or((args.yes && !escrow_required).then_some(false)),
        // The probe costs a few syncs: measured only when someone sees the estimate (the
        // question's summary, a bar, --json), not for a script's `--yes`.
        estimate: !args.yes || args.run.json || std::io::stderr().is_terminal(),
        portable: args.portable,
        mode: args.run.data_mode.into(),
        when: match (args.live, args.at_next_boot) {
            (true, _) => When::Live,
            (false, true) => When::AtNextBoot,
            (false, false) => When::Now,
        },
    };
    let steps = Steps {
        finish: |ds: &mut Dirseal, ui: &mut TermUi, how, hooks: &Hooks<'_>| {
            let outcome = convert::finish(ds, &abs, how, ui, hooks)?;
            Ok(Converted { outcome, recovery_key_saved: None, scheduled: false })
        },
        plan: |ds: &mut Dirseal, _: &mut TermUi, hooks: &Hooks<'_>| Ok(convert::plan(ds, &abs, options, hooks)?),
        run: |ds: &mut Dirseal, ui: &mut TermUi, plan: Plan, hooks: &Hooks<'_>| {
            ui.assume_yes = args.yes;
            let choice = args.protector.choice(ds, Some(&abs))?;
            Ok(plan.run(ds, choice, ui, hooks)?)
        },
    };
    // The estimate weighs a file as the probe measured it against the data rate.
    let driven = drive(ds, ui, (args.run.json, true), how, steps)?;
    let (done, summary, stop) = (driven.result, driven.summary, driven.stop);
    if done.recovery_key_saved == Some(false) {
        eprintln!(
            "dirseal: the recovery key shown above was not saved on {d}; create a new one with `dirseal recovery add {d}`",
            d = clean(&abs.display().to_string())
        );
    }
    if args.live && convert::unfinished(done.outcome.state) {
        super::live::start(ds, &abs)?;
        if args.wait {
            return super::live::wait(ds, &abs);
        }
        return report_live(&abs, &done.outcome, args.run.json);
    }
    if done.scheduled {
        return report_scheduled(ds, &abs, &done.outcome, args.run.json);
    }
    report(&abs, &done.outcome, summary.as_ref().map(|s| s.apparent_bytes), args.run.json)?;
    if args.scrub {
        return scrub_after(&abs, &done.outcome, stop, args.run.json);
    }
    if !args.run.json && done.outcome.state == State::Done {
        let d = clean(&abs.display().to_string());
        if args.recovery.decided().is_none() && args.yes && !escrow_required {
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

/// A conversion scheduled for the next boot: what happens then, and how to cancel it.
fn report_scheduled(ds: &Dirseal, abs: &Path, o: &Outcome, json: bool) -> Result<i32> {
    use dirseal::scheduled::{HeldForm, Schedules};
    let held = o.token.parse().ok().and_then(|id| Schedules::of(ds.keystore(), None).held_form(&id));
    let held_in = match held {
        Some(HeldForm::Tpm2) => "tpm2",
        Some(HeldForm::Record) => "record",
        None => "none",
    };
    if json {
        let out = serde_json::json!({ "result": {
            "path": abs, "state": "scheduled", "method": o.method.to_string(), "policy": o.token,
            "files": o.files, "data_bytes": o.bytes, "key_held": held_in,
        }});
        println!("{out}");
        return Ok(0);
    }
    let d = clean(&abs.display().to_string());
    let how = if o.method == Method::Move { "moved" } else { "copied" };
    println!(
        "{d} is scheduled for encryption at the next boot (policy {}): {} ({}) will be {how} before the login screen, asking nothing",
        o.token,
        super::term::entries(o.files),
        HumanBytes(o.bytes)
    );
    match held {
        Some(HeldForm::Tpm2) => println!("  until it is done its key is held sealed to this machine's TPM"),
        _ => println!(
            "  until it is done its key is held in a root-only file of the keystore (no TPM here); `dirseal scrub` of that filesystem afterwards removes what may remain of it"
        ),
    }
    println!("  until then nothing changes; `dirseal convert --abort {d}` cancels it");
    Ok(0)
}

/// A live conversion whose background run was started.
fn report_live(abs: &Path, o: &Outcome, json: bool) -> Result<i32> {
    if json {
        let out = serde_json::json!({ "result": {
            "path": abs, "state": "live", "method": o.method.to_string(), "policy": o.token,
            "files": o.files, "data_bytes": o.bytes,
        }});
        println!("{out}");
        return Ok(0);
    }
    let d = clean(&abs.display().to_string());
    println!(
        "{d} is being encrypted in the background (policy {}): {} ({}) are copied while it stays in use; the switch happens once its owner has logged out and nothing uses it",
        o.token,
        super::term::entries(o.files),
        HumanBytes(o.bytes)
    );
    println!("  `dirseal convert --status {d}` shows where it stands; `dirseal convert --abort {d}` cancels it");
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
    print_outcome(&clean(&abs.display().to_string()), o, Direction::Encrypt, apparent);
    print_notes(o);
    Ok(())
}

/// The sentence a run ends with, either way: the state reached and what to do next. `d` is the
/// directory as printed; `apparent` the files' apparent size when the plan counted it.
pub(super) fn print_outcome(d: &str, o: &Outcome, direction: Direction, apparent: Option<u64>) {
    let decrypt = direction == Direction::Decrypt;
    let (what, cmd) = if decrypt { ("decrypt", "decrypt") } else { ("conversion", "convert") };
    let now = if decrypt {
        "is plaintext again".to_string()
    } else {
        format!("is now encrypted (policy {}) and unlocked", o.token)
    };
    // What the swap put aside (kept as a backup until commit or rollback).
    let old = if decrypt { "the encrypted tree" } else { "the old plaintext" };
    match o.state {
        State::Done => {
            let sizes = match apparent {
                Some(a) if a != o.bytes => format!(" (files' apparent size {}: sparse files)", HumanBytes(a)),
                _ => String::new(),
            };
            let how = if o.method == Method::Move { "moved" } else { "copied" };
            println!("{d} {now}: {}, {} of data {how}{sizes}", super::term::entries(o.files), HumanBytes(o.bytes))
        }
        State::Swapped => {
            println!("{d} {now}; {old} is kept");
            if let Some(b) = &o.backup {
                println!("  backup: {}", clean(&b.display().to_string()));
            }
            let delete = if decrypt { "to delete it and forget its keys" } else { "to delete it" };
            println!("  run `dirseal {cmd} --commit {d}` {delete}, or `dirseal {cmd} --rollback {d}` to restore it");
        }
        State::Aborted if o.method == Method::Move => {
            println!("aborted the {what} of {d}; every file was moved back as it was")
        }
        State::Aborted => {
            let untouched = if decrypt { "the encrypted directory" } else { "the original" };
            println!("aborted the {what} of {d}; {untouched} is untouched")
        }
        State::RolledBack => {
            let again = if decrypt { "the encrypted tree" } else { "the original plaintext" };
            println!("rolled back: {d} holds {again} again")
        }
        s => println!("{what} of {d}: {s}"),
    }
}

/// The engine's caveats (it gives only those that apply to the run's direction).
pub(super) fn print_notes(o: &Outcome) {
    for n in &o.notes {
        println!("note: {}", clean(n));
    }
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
        (Some(v), true) => println!("{}", serde_json::to_string(v)?),
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
        State::Swapped if v.direction == Direction::Decrypt => format!(
            "decrypted; the encrypted tree is kept until `dirseal {cmd} --commit {d}` (or `--rollback` restores it)"
        ),
        State::Swapped => format!(
            "encrypted; the old plaintext is kept until `dirseal {cmd} --commit {d}` (or `--rollback` restores it)"
        ),
        State::RollingBack => format!("interrupted while rolling back; run `dirseal {cmd} --rollback {d}` to finish"),
        State::MovingBack => format!(
            "interrupted while moving files back; the files not yet back are in {}; run `dirseal {cmd} --abort {d}` to \
             finish",
            moved_to(v)
        ),
        s @ (State::Moving | State::Moved) => format!(
            "interrupted while {s} ({counts}); the files already moved are in {} until `dirseal {cmd} {d}` resumes \
             (or `--abort` moves them back)",
            moved_to(v)
        ),
        s => format!("interrupted while {s} ({counts}); run `dirseal {cmd} {d}` to resume (or `--abort`)"),
    }
}

/// Where an interrupted move's files are, as a person can find them.
fn moved_to(v: &StatusView) -> String {
    match (&v.moved_to, v.direction) {
        (Some(p), Direction::Decrypt) => clean(&p.display().to_string()),
        (Some(p), _) => {
            format!("{} (encrypted: its names read as ciphertext while it is locked)", clean(&p.display().to_string()))
        }
        (None, _) => "the work dir's staging directory".into(),
    }
}

/// Every conversion recorded on any mounted filesystem.
/// Every conversion recorded on any mounted filesystem; one scheduled for the next boot says so
/// (read from the keystore of `ds`, when there is one).
fn status_all(ds: Option<&Dirseal>, json: bool) -> Result<i32> {
    let found = convert::recorded()?;
    let at_boot = |v: &StatusView| ds.and_then(|ds| super::boot::state_line(ds, &v.source));
    if json {
        let mut list = Vec::new();
        for v in &found {
            let mut out = serde_json::to_value(v)?;
            if let (Some(line), Some(o)) = (at_boot(v), out.as_object_mut()) {
                if line.starts_with("scheduled") {
                    o.insert("state".into(), "scheduled".into());
                }
                o.insert(super::boot::line_key(&line).into(), line.into());
            }
            list.push(out);
        }
        println!("{}", serde_json::to_string(&serde_json::json!({ "conversions": list }))?);
    } else if found.is_empty() {
        println!("no conversions recorded");
    } else {
        for v in &found {
            match at_boot(v).filter(|l| l.starts_with("scheduled") || l.starts_with("live:")) {
                Some(line) => println!("{}: {}", clean(&v.source.display().to_string()), clean(&line)),
                None => print_status(v),
            }
        }
    }
    Ok(0)
}
