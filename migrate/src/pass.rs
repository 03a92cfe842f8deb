//! What every pass over a tree shares, whoever runs it (the machine's copy, verify and move, an
//! abort's move back, the census): the worker pool it runs on, and what is recorded when it
//! stops early. Below both machine.rs and finish.rs, which run passes (issue 45).

use std::sync::atomic::Ordering::Relaxed;

use crate::ctx::Ctx;
use crate::error::MigrateError;
use crate::journal::{Journal, Workdir};

/// The worker threads of one run.
pub(crate) fn pool(threads: std::num::NonZeroUsize) -> Result<rayon::ThreadPool, MigrateError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.get())
        .build()
        .map_err(|_| MigrateError::Internal("cannot start worker threads"))
}

/// Records the progress counters of a pass that stopped early, and tags an interruption with the
/// state it left the conversion in.
pub(crate) fn after_pass(wd: &Workdir, j: &mut Journal, ctx: &Ctx, e: MigrateError) -> MigrateError {
    ctx.counters_into(j);
    j.recopied += ctx.recopied.load(Relaxed);
    // The journal state is unchanged; only the counters are new, so a failed write loses nothing.
    let _ = wd.write(j);
    match e {
        MigrateError::Interrupted { .. } => MigrateError::Interrupted { state: j.step.public() },
        e => e,
    }
}
