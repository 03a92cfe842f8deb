//! `dirseal decrypt`: flags to [`dirseal::decrypt`]'s plan and run, the same summary, progress
//! and JSON as `dirseal convert`, and clean stops on SIGINT/SIGTERM.
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use indicatif::HumanBytes;

use dirseal::convert::{self, Finish, Hooks, Options};
use dirseal::decrypt::{self, Decrypted, Forgotten, Plan};
use dirseal::ops::{Dirseal, Pick};
use dirseal::ui::Progress;
use dirseal_migrate::{Method, State};

use super::convert::{outcome_out, show_status, DataMode};
use super::progress::Reporter;
use super::term::{clean, TermUi};
use super::ProtectorRef;

#[derive(Args)]
pub struct DecryptArgs {
    /// The encrypted directory (the root of its policy) to turn back into plaintext in place
    dir: PathBuf,
    /// Unlock a locked directory (or reload its key to resume) with this protector, by id or name
    #[arg(long, value_name = "ID|NAME")]
    protector: Option<ProtectorRef>,
    /// Do not ask for confirmation
    #[arg(long, short = 'y')]
    yes: bool,
    /// Keep the encrypted tree until `--commit` (or put it back with `--rollback`)
    #[arg(long)]
    keep_backup: bool,
    /// Keep the protectors that protected only this directory (the policy record goes anyway)
    #[arg(long)]
    keep_protectors: bool,
    /// Decrypt even if programs use the directory (their changes during the copy are recopied)
    #[arg(long)]
    force: bool,
    /// copy: a plaintext copy next to the encrypted tree (needs room for it); move: the data moves
    /// out chunk by chunk (for a nearly full disk; no backup window); auto: copy when it fits,
    /// else move
    #[arg(long = "mode", value_enum, default_value = "auto", value_name = "MODE")]
    data_mode: DataMode,
    /// Worker threads [default: two per CPU, at least 4]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// One JSON progress object per second on stdout, and a JSON result
    #[arg(long)]
    pub json: bool,
    /// Before the swap: remove the plaintext copy, leave the encrypted directory untouched
    #[arg(long, group = "mode")]
    abort: bool,
    /// After a swap kept with --keep-backup: put the encrypted tree back
    #[arg(long, group = "mode")]
    rollback: bool,
    /// After a swap kept with --keep-backup: delete the encrypted tree and forget its keys
    #[arg(long, group = "mode")]
    commit: bool,
    /// Show the recorded state of a decrypt
    #[arg(long, group = "mode")]
    status: bool,
}

pub fn run(ds: &mut Dirseal, args: DecryptArgs, ui: &mut TermUi) -> Result<i32> {
    let abs = convert::absolute(&args.dir)?;
    if args.status {
        return show_status(&abs, convert::status(&abs)?.as_ref(), args.json);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let reporter = Reporter::new(args.json);
    let progress = |p: &Progress| reporter.report(p);
    let hooks = Hooks { progress: &progress, stop: &stop };
    let pick: Pick = ProtectorRef::pick(&args.protector, ds)?;
    let finish = match (args.abort, args.rollback, args.commit) {
        (true, _, _) => Some(Finish::Abort),
        (_, true, _) => Some(Finish::Rollback),
        (_, _, true) => Some(Finish::Commit),
        _ => None,
    };
    ui.assume_yes = args.yes;
    let mut summary = None;
    let result = if let Some(how) = finish {
        decrypt::finish(ds, &abs, how, args.keep_protectors, ui, &hooks)
    } else {
        let options = Options {
            keep_backup: args.keep_backup,
            force: args.force,
            threads: args.threads.unwrap_or(0),
            recovery_key: Some(false),
            estimate: true,
            mode: match args.data_mode {
                DataMode::Copy => convert::Mode::Copy,
                DataMode::Move => convert::Mode::Move,
                DataMode::Auto => convert::Mode::Auto,
            },
            ..Options::default()
        };
        let plan = decrypt::plan(ds, &abs, options, pick, ui, &hooks)?;
        reporter.finish();
        summary = plan.summary();
        if let (Some(s), true) = (&summary, args.json) {
            println!("{}", serde_json::to_string(&serde_json::json!({ "plan": s }))?);
        }
        match plan {
            Plan::New(plan) => plan.run(ds, args.keep_protectors, ui, &hooks),
            Plan::Resume(plan) => plan.run(ds, pick, args.keep_protectors, ui, &hooks),
        }
    };
    reporter.finish();
    let done = result?;
    report(&abs, &done, summary.as_ref().map(|s| s.apparent_bytes), args.json)?;
    Ok(0)
}

fn report(abs: &std::path::Path, d: &Decrypted, apparent: Option<u64>, json: bool) -> Result<()> {
    let o = &d.outcome;
    if json {
        let mut out = serde_json::to_value(outcome_out(abs, o, apparent))?;
        out["forgotten"] = serde_json::to_value(&d.forgotten)?;
        println!("{}", serde_json::to_string(&serde_json::json!({ "result": out }))?);
        return Ok(());
    }
    let p = clean(&abs.display().to_string());
    match o.state {
        State::Done => println!(
            "{p} is plaintext again: {} entries, {} of data {}",
            o.files,
            HumanBytes(o.bytes),
            if o.method == Method::Move { "moved" } else { "copied" }
        ),
        State::Swapped => {
            println!("{p} is plaintext again; the encrypted tree is kept");
            if let Some(b) = &o.backup {
                println!("  backup: {}", clean(&b.display().to_string()));
            }
            println!(
                "  run `dirseal decrypt --commit {p}` to delete it and forget its keys, or `dirseal decrypt --rollback {p}` to restore it"
            );
        }
        State::Aborted if o.method == Method::Move => {
            println!("aborted the decrypt of {p}; every file was moved back as it was")
        }
        State::Aborted => println!("aborted the decrypt of {p}; the encrypted directory is untouched"),
        State::RolledBack => println!("rolled back: {p} holds the encrypted tree again"),
        s => println!("decrypt of {p}: {s}"),
    }
    if let Some(f) = &d.forgotten {
        print_forgotten(f);
    }
    for n in &o.notes {
        if n.contains("old plaintext") {
            // The engine's notes speak of a conversion's old plaintext; here the old tree is
            // encrypted and its key is gone.
            continue;
        }
        println!("note: {}", clean(n));
    }
    Ok(())
}

fn print_forgotten(f: &Forgotten) {
    println!(
        "  policy {} removed from the keystore{}",
        f.policy,
        if f.key_removed { ", its key from the kernel" } else { "" }
    );
    for p in &f.protectors_removed {
        println!("  protector {} removed (it protected only this directory)", clean(p));
    }
    for p in &f.protectors_kept {
        println!("  protector {} kept", clean(p));
    }
    println!(
        "  any recovery key made for this directory is void{}",
        if f.recovery_removed { " (its recovery attribute was removed)" } else { "" }
    );
}
