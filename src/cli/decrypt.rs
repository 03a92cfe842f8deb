//! `dirseal decrypt`: flags to [`dirseal::decrypt`]'s plan and run, the same summary, progress
//! and JSON as `dirseal convert`, and clean stops on SIGINT/SIGTERM.

use anyhow::Result;

use dirseal::convert::{self, Hooks, Options};
use dirseal::convert::{Direction, State};
use dirseal::decrypt::{self, Decrypted, Forgotten, Plan};
use dirseal::ops::{Dirseal, Pick};

use super::args::DecryptArgs;
use super::convert::{outcome_out, print_notes, print_outcome, show_status};
use super::drive::{drive, Steps};
use super::term::{clean, TermUi};
use super::ProtectorRef;

pub fn run(ds: &mut Dirseal, args: DecryptArgs, ui: &mut TermUi) -> Result<i32> {
    let abs = convert::absolute(&args.dir)?;
    if args.end.status {
        return show_status(&abs, convert::status(&abs)?.as_ref(), args.run.json);
    }
    let pick: Pick = ProtectorRef::pick_in(&args.protector, ds, &abs)?;
    ui.assume_yes = args.yes;
    let keep = args.keep_protectors;
    let options = Options {
        keep_backup: args.keep_backup,
        force: args.run.force,
        threads: args.run.threads,
        recovery_key: Some(false),
        estimate: true,
        mode: args.run.data_mode.into(),
        ..Options::default()
    };
    let steps = Steps {
        finish: |ds: &mut Dirseal, ui: &mut TermUi, how, hooks: &Hooks<'_>| {
            Ok(decrypt::finish(ds, &abs, how, keep, ui, hooks)?)
        },
        plan: |ds: &mut Dirseal, ui: &mut TermUi, hooks: &Hooks<'_>| {
            Ok(decrypt::plan(ds, &abs, options, pick, ui, hooks)?)
        },
        run: |ds: &mut Dirseal, ui: &mut TermUi, plan: Plan, hooks: &Hooks<'_>| Ok(plan.run(ds, pick, keep, ui, hooks)?),
    };
    let how = args.end.finish();
    let done = drive(ds, ui, (args.run.json, false), how, steps)?;
    report(&abs, &done.result, done.summary.as_ref().map(|s| s.apparent_bytes), args.run.json)?;
    Ok(0)
}

fn report(abs: &std::path::Path, d: &Decrypted, apparent: Option<u64>, json: bool) -> Result<()> {
    let o = &d.outcome;
    if json {
        let mut out = serde_json::to_value(outcome_out(abs, o, apparent))?;
        out["forgotten"] = serde_json::to_value(&d.forgotten)?;
        out["cleanup_only"] = d.cleanup_only.into();
        println!("{}", serde_json::to_string(&serde_json::json!({ "result": out }))?);
        return Ok(());
    }
    let p = clean(&abs.display().to_string());
    match o.state {
        // A run cut short in its clean-up: the tree was plaintext already, nothing was copied.
        State::Done if d.cleanup_only => println!("{p}: decrypted (clean-up finished)"),
        _ => print_outcome(&p, o, Direction::Decrypt, apparent),
    }
    if let Some(f) = &d.forgotten {
        print_forgotten(f);
    }
    print_notes(o);
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
