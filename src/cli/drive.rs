//! What `dirseal convert` and `dirseal decrypt` share around the library's plan and run: a stop
//! flag SIGINT and SIGTERM set (the run stops at its next safe point, to be resumed; at a
//! question they cancel, see [`super::interrupt`]), progress as a bar or JSON lines, and before a
//! new run its summary (`{"plan": ...}` with --json).
use std::sync::atomic::AtomicBool;

use anyhow::Result;

use dirseal::convert::{Finish, Hooks, NewRun, Planned, Summary};
use dirseal::ops::Dirseal;
use dirseal::ui::Progress;

use super::args::EndArgs;
use super::progress::Reporter;
use super::term::TermUi;

impl EndArgs {
    /// The end `--abort`, `--rollback` or `--commit` asks for; none: plan and run.
    pub fn finish(&self) -> Option<Finish> {
        match (self.abort, self.rollback, self.commit) {
            (true, _, _) => Some(Finish::Abort),
            (_, true, _) => Some(Finish::Rollback),
            (_, _, true) => Some(Finish::Commit),
            _ => None,
        }
    }
}

/// One command's way through: `finish` ends a recorded run the way `--abort`, `--rollback` or
/// `--commit` asked; else `plan` checks and `run` runs (new or resumed).
pub struct Steps<F, P, R> {
    pub finish: F,
    pub plan: P,
    pub run: R,
}

/// What a drive gave: the result, the plan's summary (a new run's sizes as counted; none for a
/// resumed run or a finish) and the stop flag (set: a signal came).
pub struct Driven<T> {
    pub result: T,
    pub summary: Option<Summary>,
    pub stop: &'static AtomicBool,
}

/// Drives one command's `steps` with `how` (its `--abort`/`--rollback`/`--commit`, if any).
/// `weigh_files`: the progress estimate weighs a file as the plan's probe measured it.
pub fn drive<K, R, T, F, P, Run>(
    ds: &mut Dirseal,
    ui: &mut TermUi,
    (json, weigh_files): (bool, bool),
    how: Option<Finish>,
    steps: Steps<F, P, Run>,
) -> Result<Driven<T>>
where
    F: FnOnce(&mut Dirseal, &mut TermUi, Finish, &Hooks<'_>) -> Result<T>,
    P: FnOnce(&mut Dirseal, &mut TermUi, &Hooks<'_>) -> Result<Planned<NewRun<K>, R>>,
    Run: FnOnce(&mut Dirseal, &mut TermUi, Planned<NewRun<K>, R>, &Hooks<'_>) -> Result<T>,
{
    // From here a signal stops the run at its next safe point instead of ending the process; a
    // question asked meanwhile (the terminal's reads) cancels at it, and one asked after it
    // cancels at once, so a Ctrl-C is never taken for the answer typed after it.
    let _catch = super::interrupt::catching();
    let stop = super::interrupt::flag();
    let reporter = Reporter::new(json);
    let progress = |p: &Progress| reporter.report(p);
    let hooks = Hooks { progress: &progress, stop };
    let mut summary = None;
    let result = match how {
        Some(how) => (steps.finish)(ds, ui, how, &hooks),
        None => (|| {
            let plan = (steps.plan)(ds, ui, &hooks)?;
            reporter.finish();
            summary = plan.summary();
            if let Some(e) = summary.as_ref().and_then(|s| s.estimate.as_ref()).filter(|_| weigh_files) {
                reporter.set_file_cost(e.write_bytes_per_sec.saturating_mul(e.micros_per_entry) / 1_000_000);
            }
            if let (Some(s), true) = (&summary, json) {
                println!("{}", serde_json::to_string(&serde_json::json!({ "plan": s }))?);
            }
            (steps.run)(ds, ui, plan, &hooks)
        })(),
    };
    reporter.finish();
    Ok(Driven { result: result?, summary, stop })
}
