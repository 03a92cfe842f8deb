//! The conversion as a state machine: [`convert`] and [`start`] record `Prepared`, then [`run`]
//! takes the recorded step to the next one, one function per step, until the conversion is done
//! (or swapped with a backup kept). Every step first writes what it did to the journal
//! ([`Run::record`]), so a run killed anywhere resumes at the step the journal names.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

use crate::catchup::{self, Manifest, Pass, MAX_LIVE_PASSES};
use crate::ctx::Ctx;
use crate::error::{host_err, io_err, move_err, other_direction, other_source};
use crate::fault::{self, Point};
use crate::finish::{dispose, outcome};
use crate::journal::{self, HexPath, HexRel, Journal, Step, Version, Workdir, STAGING};
use crate::pass::{after_pass, pool};
use crate::plan::{check_not_in_use, preflight_source, quick_checks};
use crate::trees::{
    check_encrypted, clear_leftovers, exchange, open_pair, open_staging, place, restore_root_times, sync_swap, Place,
    Source,
};
use crate::types::{Method, Schedule, MAX_ROUNDS};
use crate::{copy, flags, fsx, mv, verify};
use crate::{Census, Host, HostError, MigrateError, Outcome, Phase, Plan, Request, State, Timings};

/// Starts a conversion (running the [`preflight`] checks itself) or resumes the unfinished one
/// recorded in the work dir, from whatever state it is in. Returns when the conversion is `Done`,
/// or `Swapped` with a backup, or (a live one, run [`Schedule::Live`]) `CaughtUp`. A live
/// conversion run `Now` is committed: unless forced, nothing may use the directory
/// ([`MigrateError::StillInUse`], and it stays `CaughtUp`), then a last catch-up pass, the
/// verification of what changed, the swap and the disposal. A resumed conversion keeps its recorded `keep_backup` and `wipe`;
/// `force` and `threads` apply to this run. A finished journal (done, aborted, rolled back) is
/// replaced by a new conversion.
pub fn convert(req: &Request, host: &dyn Host) -> Result<Outcome, MigrateError> {
    let src = Source::resolve(req.source)?;
    if let Some(resumed) = resume_recorded(req, host, &src) {
        return resumed;
    }
    let mut timings = Timings::default();
    let census = timings.time("scan", || preflight_source(req, host, &src))?;
    begin(req, host, &src, &census, timings)
}

/// Begins the conversion [`preflight`] planned, without walking the tree again: what may have
/// changed while a person confirmed it (the source replaced, a converter started, a program
/// opened the directory) is checked again. Like [`convert`], resumes an unfinished conversion
/// recorded meanwhile.
pub fn start(req: &Request, host: &dyn Host, plan: Plan) -> Result<Outcome, MigrateError> {
    let src = Source::resolve(req.source)?;
    if (src.meta.dev, src.meta.ino) != (plan.src.meta.dev, plan.src.meta.ino) {
        return Err(MigrateError::SourceReplaced { path: src.path });
    }
    if let Some(resumed) = resume_recorded(req, host, &src) {
        return resumed;
    }
    quick_checks(req, host, &src)?;
    let mut timings = Timings::default();
    timings.add("scan", plan.scan);
    begin(req, host, &src, &plan.census, timings)
}

/// Resumes the unfinished conversion recorded in the work dir, if there is one.
fn resume_recorded(req: &Request, host: &dyn Host, src: &Source) -> Option<Result<Outcome, MigrateError>> {
    let recorded = match Workdir::open(req.workdir, false) {
        Ok(Some(wd)) => wd.read(),
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    };
    let j = match recorded {
        Ok(j) => j.filter(|j| !j.step.is_final())?,
        Err(e) => return Some(Err(e)),
    };
    Some((|| {
        if j.source.0 != src.path {
            return Err(other_source(req.workdir, &j.source.0, &src.path));
        }
        if j.direction != req.direction {
            return Err(other_direction(&j.source.0, j.direction));
        }
        let wd = Workdir::open(req.workdir, false)?
            .ok_or(MigrateError::NoConversion { workdir: req.workdir.to_path_buf() })?;
        let _lock = wd.lock()?;
        let j = wd.read()?.ok_or(MigrateError::NoConversion { workdir: req.workdir.to_path_buf() })?;
        run(req, host, &wd, j, true, Timings::default())
    })())
}

/// Creates the work dir and staging, has the host encrypt it, records `Prepared` and runs.
fn begin(
    req: &Request,
    host: &dyn Host,
    src: &Source,
    census: &Census,
    mut timings: Timings,
) -> Result<Outcome, MigrateError> {
    let prepared = std::time::Instant::now();
    let wd =
        Workdir::open(req.workdir, true)?.ok_or(MigrateError::Internal("work dir missing right after creation"))?;
    let _lock = wd.lock()?;
    let old = wd.read()?;
    if let Some(j) = &old {
        if !j.step.is_final() {
            // Another converter started between our look and the lock.
            if j.source.0 != src.path {
                return Err(other_source(req.workdir, &j.source.0, &src.path));
            }
            if j.direction != req.direction {
                return Err(other_direction(&j.source.0, j.direction));
            }
            return run(req, host, &wd, j.clone(), true, timings);
        }
    }
    clear_leftovers(&wd, old.as_ref(), Point::LeftoverEntry)?;
    catchup::forget_all(&wd)?;
    fsx::mkdir(&wd.fd, STAGING.as_ref()).map_err(io_err("creating", &wd.staging_path()))?;
    wd.sync()?;
    fault::point(Point::AfterStagingCreated);
    let stg_fd = fsx::open_dir(&wd.fd, STAGING.as_ref()).map_err(io_err("opening", &wd.staging_path()))?;
    // Casefold goes onto the empty staging root, before the host makes it encrypted.
    let root_attrs = flags::read(src.fd.as_fd()).map_err(io_err("reading the inode flags of", &src.path))?;
    flags::set_early(stg_fd.as_fd(), &root_attrs).map_err(io_err("setting the inode flags of", &wd.staging_path()))?;
    let token = host
        .prepare_staging(stg_fd.as_fd(), &wd.staging_path())
        .map_err(host_err("preparing the staging directory"))?;
    if token.len() > journal::MAX_TOKEN || token.chars().any(char::is_control) {
        return Err(MigrateError::Host {
            step: "preparing the staging directory",
            source: HostError(format!("the host returned an unusable token of {} bytes", token.len())),
        });
    }
    // What the host did to the staging dir (its encryption policy) must be on disk before the
    // journal that relies on it.
    fsx::fsync(&stg_fd).map_err(io_err("syncing", &wd.staging_path()))?;
    let stg = fsx::stat_fd(&stg_fd).map_err(io_err("inspecting", &wd.staging_path()))?;
    fault::point(Point::BeforeRecordPrepared);
    let mut j = Journal {
        version: Version,
        source: HexPath(src.path.clone()),
        recorded_dev: src.meta.dev,
        source_ino: src.meta.ino,
        staging_ino: stg.ino,
        token,
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        keep_backup: req.keep_backup,
        wipe: req.wipe,
        files_total: census.entries,
        // Data, not sizes, for a copy and a move alike: a sparse disk image would make the bar and
        // ETA lie.
        bytes_total: census.data,
        outside_links: census.outside_links,
        files_done: 0,
        bytes_done: 0,
        recopied: 0,
        root_times: None,
        copy_started: None,
        step: Step::Prepared,
        method: census.method,
        inflight: None,
        direction: req.direction,
        live: (req.schedule == Schedule::Live).then(journal::Live::default),
        sealed: Vec::new(),
    };
    wd.record(&mut j, Step::Prepared, Point::AfterPrepare)?;
    timings.add("prepare", prepared.elapsed());
    run(req, host, &wd, j, false, timings)
}

/// A progress saver for a long pass: rewrites the journal with new counters (and nothing else)
/// every few seconds, so `status` from another process shows how far the pass got. Failures are
/// ignored: the recorded state stays right, only the counters lag.
fn checkpoint<'a>(wd: &'a Workdir, j: &Journal) -> impl Fn(u64, u64) + Sync + 'a {
    let shared = std::sync::Mutex::new(j.clone());
    move |files, bytes| {
        if let Ok(mut s) = shared.try_lock() {
            s.files_done = files.min(s.files_total);
            s.bytes_done = bytes.min(s.bytes_total);
            let _ = wd.write(&s);
        }
    }
}

/// Runs the recorded conversion from its step to the end: the step table.
fn run(
    req: &Request,
    host: &dyn Host,
    wd: &Workdir,
    j: Journal,
    resumed: bool,
    t: Timings,
) -> Result<Outcome, MigrateError> {
    let mut r = Run {
        req: *req,
        host,
        wd,
        j,
        pool: pool(req.threads)?,
        unlocked: !resumed,
        pass_recorded_here: false,
        notes: Vec::new(),
        t,
        passes_here: 0,
        verified_here: false,
        commit_started: None,
    };
    if req.schedule == Schedule::Live && !r.j.step.is_final() {
        if r.j.live.is_none() {
            return Err(MigrateError::WrongState {
                op: "resume live",
                state: r.j.step.public(),
                hint: "it was started to run now; run it again without live (or abort it)",
            });
        }
        r.back_to_live()?;
    }
    if r.j.live.as_ref().is_some_and(|l| l.commit_from.is_some()) {
        // A commit resumed: this run's part of it is timed too.
        r.commit_started = Some(std::time::Instant::now());
    }
    loop {
        match r.j.step {
            Step::Prepared => r.prepared()?,
            Step::Copying { round } => r.copying(round)?,
            Step::Copied { round } if r.j.live.is_some() => r.live_verifying(round)?,
            Step::Copied { round } => r.verifying(round)?,
            Step::CatchingUp { pass } => r.catching_up(pass)?,
            Step::CaughtUp { .. } if r.req.schedule == Schedule::Live && r.passes_here > 0 => return Ok(r.outcome()),
            Step::CaughtUp { pass } if r.req.schedule == Schedule::Live => {
                // Caught up earlier: catch up again, from here.
                r.next_pass(pass + 1, Point::AfterRecordCatchingUp)?
            }
            Step::CaughtUp { pass } => r.committing(pass)?,
            // A commit verified in an earlier run and not swapped yet (a crash can come between
            // the exchange and its record): the directory may have changed since.
            Step::Verified if r.j.live.is_some() && !r.verified_here && place(&r.j, r.wd)? == Place::Original => {
                r.committing(r.last_pass())?
            }
            Step::Moving => r.moving()?,
            Step::Settling => r.settling()?,
            Step::Verified | Step::Moved => r.swapping()?,
            Step::Swapped { disposing: false } if r.j.keep_backup => return Ok(r.outcome()),
            Step::Swapped { disposing: false } => {
                r.record(Step::Swapped { disposing: true }, Point::AfterRecordDisposing)?
            }
            Step::Swapped { disposing: true } => r.disposing()?,
            Step::Done => return Ok(r.outcome()),
            Step::MovingBack => {
                return Err(not_resumable(
                    State::MovingBack,
                    "an abort is moving the files back; run the abort again to finish it",
                ))
            }
            Step::RollingBack => {
                return Err(not_resumable(
                    State::RollingBack,
                    "a rollback was started; run the rollback again to finish it",
                ))
            }
            Step::Aborted | Step::RolledBack => {
                return Err(not_resumable(r.j.step.public(), "it is finished; start a new conversion"))
            }
        }
    }
}

fn not_resumable(state: State, hint: &'static str) -> MigrateError {
    MigrateError::WrongState { op: "resume", state, hint }
}

/// One run of the machine: what every step needs, and what the run collects.
struct Run<'r> {
    req: Request<'r>,
    host: &'r dyn Host,
    wd: &'r Workdir,
    j: Journal,
    pool: rayon::ThreadPool,
    /// Whether the staging dir is unlocked in this run (a resumed run unlocks it once, when a
    /// step first needs it).
    unlocked: bool,
    /// Whether this process recorded the copy pass it is in: a pass it finds recorded was
    /// interrupted, and what it copied may not have reached the disk.
    pass_recorded_here: bool,
    notes: Vec<String>,
    t: Timings,
    /// Live: catch-up passes this run made (a live run makes at most [`MAX_LIVE_PASSES`]).
    passes_here: u32,
    /// Live: this run verified the commit (a `Verified` found on resuming was verified before
    /// the directory may have changed again).
    verified_here: bool,
    /// Live: when this run began committing (its users check), for the `commit` timing.
    commit_started: Option<std::time::Instant>,
}

/// The two trees a step works on, opened and checked against the journal.
struct Trees {
    src: Source,
    stg: OwnedFd,
}

impl<'r> Run<'r> {
    /// The prologue of every step that works on the trees: unlock staging once, open both trees
    /// (checked to be the recorded inodes) and, before writing into staging, check its encryption.
    fn open(&mut self, writes_staging: bool) -> Result<Trees, MigrateError> {
        if !self.unlocked {
            self.host
                .ensure_unlocked(&self.j.token, &self.wd.staging_path())
                .map_err(host_err("unlocking the staging directory"))?;
            self.unlocked = true;
        }
        let (src, stg) = open_pair(&self.j, self.wd)?;
        if writes_staging {
            check_encrypted(self.host, &self.j, self.wd, &stg)?;
        }
        Ok(Trees { src, stg })
    }

    /// The shared state of a pass over `trees` in `phase`.
    fn ctx<'p>(&self, trees: &'p Trees, phase: Phase) -> Ctx<'p>
    where
        'r: 'p,
    {
        Ctx::new(self.host, &trees.src.path, trees.src.meta.mnt_id, phase, self.j.files_total, self.j.bytes_total)
            .going(self.j.direction)
    }

    /// Records a transition (timed as `journal`); `then` is the crash point right after it.
    fn record(&mut self, step: Step, then: impl Into<Option<Point>>) -> Result<(), MigrateError> {
        let (wd, j) = (self.wd, &mut self.j);
        self.t.time("journal", || wd.record(j, step, then))
    }

    /// Makes what a pass wrote into staging durable (timed as `sync`).
    fn sync_staging(&mut self, stg: &OwnedFd) -> Result<(), MigrateError> {
        let path = self.wd.staging_path();
        self.t.time("sync", || rustix::fs::syncfs(stg)).map_err(|e| io_err("syncing", &path)(e.into()))
    }

    /// A pass that stopped: its counters recorded, an interruption tagged with the state.
    fn failed(&mut self, ctx: &Ctx, e: MigrateError) -> MigrateError {
        after_pass(self.wd, &mut self.j, ctx, e)
    }

    fn all_done(&mut self) {
        self.j.files_done = self.j.files_total;
        self.j.bytes_done = self.j.bytes_total;
    }

    fn outcome(&mut self) -> Outcome {
        if let Some(t) = self.commit_started.take() {
            self.t.add("commit", t.elapsed());
        }
        Outcome { timings: std::mem::take(&mut self.t), ..outcome(&self.j, self.wd, std::mem::take(&mut self.notes)) }
    }

    /// `Prepared`: the first pass is recorded (a copy remembers when it began, for verifying).
    fn prepared(&mut self) -> Result<(), MigrateError> {
        if self.j.method == Method::Move {
            return self.record(Step::Moving, Point::AfterRecordMoving);
        }
        self.j.copy_started = Some(self.wd.clock()?);
        if let Some(l) = &mut self.j.live {
            l.started(0);
        }
        self.record(Step::Copying { round: 0 }, Point::AfterRecordCopying)?;
        self.pass_recorded_here = true;
        Ok(())
    }

    /// `Copying`: copies the tree into staging (what is there already and unchanged is kept).
    fn copying(&mut self, round: u32) -> Result<(), MigrateError> {
        if !self.pass_recorded_here {
            // Every journal written from here on says so (progress checkpoints included).
            self.j.copy_started = None;
        }
        let trees = self.open(true)?;
        let save = checkpoint(self.wd, &self.j);
        let ctx = self.ctx(&trees, Phase::Copying).saving(&save);
        ctx.tick(true);
        // A live conversion's first copy records what it saw, for the catch-up passes.
        let live = match self.j.live {
            Some(_) => {
                let p = Pass::new(true, None, self.wd.clock()?);
                self.flush_source(&trees.src)?;
                Some(p)
            }
            None => None,
        };
        let pool = &self.pool;
        let copied = self.t.time("copy", || {
            copy::copy_tree(&ctx, pool, &trees.src.fd, &trees.stg, live.as_ref().map(|p| p as &dyn copy::Catchup))
        });
        if let Err(e) = copied {
            return Err(self.failed(&ctx, e));
        }
        fault::point(Point::BeforeRecordCopied);
        self.sync_staging(&trees.stg)?;
        ctx.tick(true);
        self.all_done();
        self.j.recopied += ctx.recopied.load(Relaxed);
        if let Some(p) = live {
            self.pass_done(0, p)?;
        }
        self.record(Step::Copied { round }, Point::AfterRecordCopied)
    }

    /// Before a live pass (after its clock is read): writes out the source's dirty pages. A page
    /// of a file mapped shared and writable can be written again without a fault, so without
    /// moving the file's ctime, only while it stays dirty; written out, it is write-protected, and
    /// the next write through the mapping moves the ctime (ext4's and f2fs's `page_mkwrite`). So
    /// a file whose ctime is older than the pass's clock was not changed through a mapping after
    /// the pass began without its ctime saying so.
    fn flush_source(&mut self, src: &Source) -> Result<(), MigrateError> {
        self.t.time("sync", || rustix::fs::syncfs(&src.fd)).map_err(|e| io_err("syncing", &src.path)(e.into()))
    }

    /// Writes a finished pass's manifest (the copy is synced) and notes the pass in the journal
    /// (written with the next record).
    fn pass_done(&mut self, pass: u32, p: Pass) -> Result<(), MigrateError> {
        let clock = p.clock();
        let counts = p.store(self.wd, pass)?;
        fault::point(Point::AfterManifestWritten);
        if let Some(r) = self.j.live.as_mut().and_then(|l| l.passes.iter_mut().find(|r| r.pass == pass)) {
            r.finished_unix = Some(journal::unix_now());
            r.clock = Some(clock);
            (r.copied, r.removed, r.entries) = (counts.copied, counts.removed, counts.entries);
        }
        Ok(())
    }

    fn live(&mut self) -> Result<&mut journal::Live, MigrateError> {
        self.j.live.as_mut().ok_or(MigrateError::Internal("a live step in a conversion that is not live"))
    }

    /// The last pass that finished (0 if only the first copy was under way).
    fn last_pass(&self) -> u32 {
        self.j.live.as_ref().and_then(|l| l.last_finished()).map_or(0, |p| p.pass)
    }

    /// Records catch-up pass `pass` as begun.
    fn next_pass(&mut self, pass: u32, then: Point) -> Result<(), MigrateError> {
        self.live()?.started(pass);
        self.record(Step::CatchingUp { pass }, then)
    }

    /// A live run of a conversion whose commit had begun: the directory is in use again, so the
    /// commit is dropped and the conversion catches up again (nothing was swapped).
    fn back_to_live(&mut self) -> Result<(), MigrateError> {
        // (A crash may have come between the exchange and its record: then the commit finishes.)
        if !self.j.step.public().before_swap() || place(&self.j, self.wd)? != Place::Original {
            return Ok(());
        }
        let Some(l) = &mut self.j.live else { return Ok(()) };
        if l.commit_from.take().is_none() {
            return Ok(());
        }
        match self.j.step {
            Step::Copied { .. } | Step::Verified => {
                let pass = self.last_pass() + 1;
                self.next_pass(pass, Point::AfterRecordCatchingUp)
            }
            // A pass under way goes on as a live one (recorded when it ends).
            _ => Ok(()),
        }
    }

    /// `CatchingUp`: brings into staging what changed since the previous pass (see catchup.rs),
    /// then goes on catching up, stops `CaughtUp`, or (committing) verifies.
    fn catching_up(&mut self, pass: u32) -> Result<(), MigrateError> {
        let trees = self.open(true)?;
        let clock = self.wd.clock()?;
        // The previous pass's manifest, unless the clock went back since that pass began (a
        // change now could then get an old ctime): without it everything is copied again.
        let prev = self.j.live.as_ref().and_then(|l| l.passes.iter().find(|p| p.pass == pass - 1));
        let reference = match prev.and_then(|p| p.clock) {
            Some(c) if clock >= c => Manifest::load(self.wd, pass - 1)?,
            _ => None,
        };
        let p = Pass::new(false, reference.as_ref(), clock);
        self.flush_source(&trees.src)?;
        let save = checkpoint(self.wd, &self.j);
        let ctx = self.ctx(&trees, Phase::Copying).saving(&save);
        ctx.tick(true);
        let pool = &self.pool;
        let copied = self.t.time("catch-up", || copy::copy_tree(&ctx, pool, &trees.src.fd, &trees.stg, Some(&p)));
        if let Err(e) = copied {
            return Err(self.failed(&ctx, e));
        }
        self.sync_staging(&trees.stg)?;
        ctx.tick(true);
        self.all_done();
        self.j.recopied += ctx.recopied.load(Relaxed);
        self.passes_here += 1;
        self.pass_done(pass, p)?;
        let little = self
            .j
            .live
            .as_ref()
            .and_then(|l| l.last_finished())
            .is_some_and(|r| catchup::Counts { copied: r.copied, removed: r.removed, entries: r.entries }.little());
        let commit_from = self.live()?.commit_from;
        match commit_from {
            Some(from) => self.record(Step::Copied { round: pass - from }, Point::AfterRecordCopied)?,
            None if little || self.passes_here >= MAX_LIVE_PASSES => {
                self.record(Step::CaughtUp { pass }, Point::AfterRecordCaughtUp)?
            }
            None => self.next_pass(pass + 1, Point::AfterRecordCatchingUp)?,
        }
        catchup::forget_before(self.wd, pass)
    }

    /// `CaughtUp`, run `Now`: unless forced, nothing may use the directory; then the last
    /// catch-up pass begins (the commit).
    fn committing(&mut self, pass: u32) -> Result<(), MigrateError> {
        self.commit_started.get_or_insert_with(std::time::Instant::now);
        if !self.req.force {
            self.check_free()?;
        }
        self.live()?.commit_from = Some(pass + 1);
        self.next_pass(pass + 1, Point::AfterRecordCommitting)
    }

    /// Refuses with [`MigrateError::StillInUse`] while a process uses the directory; a commit
    /// under way goes back to `CaughtUp` (nothing was swapped).
    fn check_free(&mut self) -> Result<(), MigrateError> {
        match check_not_in_use(&self.j.source.0) {
            Err(MigrateError::InUse { path, users }) => {
                if matches!(self.j.step, Step::Copied { .. } | Step::Verified | Step::CatchingUp { .. }) {
                    let pass = self.last_pass();
                    self.live()?.commit_from = None;
                    self.record(Step::CaughtUp { pass }, None)?;
                }
                Err(MigrateError::StillInUse { path, users })
            }
            other => other,
        }
    }

    /// `Copied`, live: after the first copy, its full verification (the directory in use: a
    /// difference in an entry that changed since it was copied is left to the catch-up passes);
    /// committing, the verification of what changed since that one (a difference there sends it
    /// back to one more pass, up to [`MAX_ROUNDS`]). A difference in an entry that did not change
    /// since its pass recorded it means the copy is wrong: an error.
    fn live_verifying(&mut self, round: u32) -> Result<(), MigrateError> {
        let trees = self.open(false)?;
        let now = self.wd.clock()?;
        let l = self.j.live.clone().ok_or(MigrateError::Internal("live verification of a conversion not live"))?;
        let (from, pass, trusted) = match l.commit_from {
            None => (self.j.copy_started, 0, self.j.copy_started.is_some()),
            Some(first) => (l.verified_from, first + round, true),
        };
        // A clock that went back makes every file compared (as in `verifying`).
        let started = from.filter(|t0| now >= *t0);
        let manifest = Manifest::load(self.wd, pass)?;
        // The manifest of a resumed first copy was made by a pass that kept what matched by
        // metadata alone (as any resumed copy): its differences are not taken for corruption.
        let settled = |rel: &std::path::Path, m: &fsx::Meta| manifest.as_ref().is_some_and(|mf| mf.unchanged(rel, m));
        let save = checkpoint(self.wd, &self.j);
        let ctx = self.ctx(&trees, Phase::Verifying).saving(&save);
        ctx.tick(true);
        let pool = &self.pool;
        let verified = self.t.time("verify", || {
            verify::verify_tree_with(
                &ctx,
                pool,
                &trees.src.fd,
                &trees.stg,
                started,
                trusted.then_some(&settled as verify::Settled),
            )
        });
        let diff = verified.map_err(|e| self.failed(&ctx, e))?;
        ctx.tick(true);
        fault::point(Point::AfterVerify);
        if let Some((path, reason)) = diff.fatal {
            return Err(MigrateError::CopyCorrupt { path, reason });
        }
        if diff.count > 0 {
            self.sync_staging(&trees.stg)?;
        }
        let Some(first) = l.commit_from else {
            self.live()?.verified_from = Some(now);
            return self.next_pass(1, Point::AfterRecordCatchingUp);
        };
        if diff.count > 0 {
            // Changes while committing: something uses the directory again (its owner logged back
            // in). The commit is put off (`StillInUse`, back to caught up) rather than chasing
            // the changes until the passes run out and the run fails.
            if !self.req.force {
                self.check_free()?;
            }
            if round + 1 >= MAX_ROUNDS {
                // Back to caught up: a later commit starts afresh.
                self.live()?.commit_from = None;
                self.record(Step::CaughtUp { pass }, None)?;
                let (path, reason) = diff.first.unwrap_or_default();
                return Err(MigrateError::VerifyFailed { path, reason });
            }
            debug_assert_eq!(pass, first + round);
            return self.next_pass(pass + 1, Point::AfterRecordCatchingUp);
        }
        let root = fsx::stat_fd(&trees.src.fd).map_err(io_err("inspecting", &self.j.source.0))?;
        self.j.root_times = Some(journal::RootTimes { atime: root.atime, mtime: root.mtime });
        self.verified_here = true;
        self.record(Step::Verified, Point::AfterRecordVerified)
    }

    /// `Copied`: compares the copy with the original; differences send it back to copying,
    /// up to [`MAX_ROUNDS`] passes.
    fn verifying(&mut self, round: u32) -> Result<(), MigrateError> {
        let trees = self.open(false)?;
        let save = checkpoint(self.wd, &self.j);
        let ctx = self.ctx(&trees, Phase::Verifying).saving(&save);
        ctx.tick(true);
        // A clock that went back since the copy began could stamp a later change with an older
        // ctime: then every file is compared.
        let started = match self.j.copy_started {
            Some(t0) if self.wd.clock()? >= t0 => Some(t0),
            _ => None,
        };
        let pool = &self.pool;
        let verified = self.t.time("verify", || verify::verify_tree(&ctx, pool, &trees.src.fd, &trees.stg, started));
        let diff = verified.map_err(|e| self.failed(&ctx, e))?;
        // The phase's last count, as copying ends with its own: a short verify (under one
        // progress interval) would otherwise only ever show "0 B".
        ctx.tick(true);
        fault::point(Point::AfterVerify);
        if diff.count > 0 {
            // The stale entries were removed from staging; make that durable first.
            self.sync_staging(&trees.stg)?;
            if round + 1 >= MAX_ROUNDS {
                // The next run starts a fresh series of passes; this one gives up.
                self.record(Step::Copying { round: 0 }, None)?;
                let (path, reason) = diff.first.unwrap_or_default();
                return Err(MigrateError::VerifyFailed { path, reason });
            }
            self.record(Step::Copying { round: round + 1 }, Point::AfterRecordRecopy)?;
            self.pass_recorded_here = true;
            return Ok(());
        }
        let root = fsx::stat_fd(&trees.src.fd).map_err(io_err("inspecting", &self.j.source.0))?;
        self.j.root_times = Some(journal::RootTimes { atime: root.atime, mtime: root.mtime });
        self.j.sealed =
            diff.sealed.into_iter().map(|(rel, flags)| journal::Sealed { rel: HexRel(rel), flags }).collect();
        self.record(Step::Verified, Point::AfterRecordVerified)
    }

    /// `Moving`: moves every file into staging (see mv.rs).
    fn moving(&mut self) -> Result<(), MigrateError> {
        let trees = self.open(true)?;
        let ctx = self.ctx(&trees, Phase::Moving);
        ctx.tick(true);
        let (wd, j, pool) = (self.wd, &mut self.j, &self.pool);
        // Small files are copied on the pool's threads, one directory's batch at a time.
        let moved = self
            .t
            .time("move", || pool.install(|| mv::Mover::new(&ctx, wd, j, &trees.src.fd, &trees.stg, false).run()));
        if let Err(e) = moved {
            return Err(self.failed(&ctx, move_err(e)));
        }
        self.sync_staging(&trees.stg)?;
        ctx.tick(true);
        self.all_done();
        self.record(Step::Settling, Point::AfterRecordSettling)
    }

    /// `Settling`: the staging directories get their final metadata.
    fn settling(&mut self) -> Result<(), MigrateError> {
        let trees = self.open(false)?;
        let ctx = self.ctx(&trees, Phase::Moving);
        if let Err(e) = self.t.time("move", || mv::settle(&ctx, &trees.src.fd, &trees.stg)) {
            return Err(self.failed(&ctx, e));
        }
        self.sync_staging(&trees.stg)?;
        // Settled, the staging root has the original's times (the source root's changed as
        // entries left it).
        let root = fsx::stat_fd(&trees.stg).map_err(io_err("inspecting", &self.wd.staging_path()))?;
        self.j.root_times = Some(journal::RootTimes { atime: root.atime, mtime: root.mtime });
        self.record(Step::Moved, Point::AfterRecordMoved)
    }

    /// `Verified` or `Moved`: swaps the staging tree (encrypted, or plain for a decrypt) into place.
    fn swapping(&mut self) -> Result<(), MigrateError> {
        if self.j.live.is_some() && !self.req.force && place(&self.j, self.wd)? == Place::Original {
            // Taken since the last pass: the conversion is caught up, no more.
            self.check_free()?;
        }
        let (req, host, wd, j) = (&self.req, self.host, self.wd, &self.j);
        self.t.time("swap", || swap(req, host, wd, j))?;
        self.record(Step::Swapped { disposing: false }, Point::AfterRecordSwapped)?;
        catchup::forget_all(self.wd)
    }

    /// `Swapped`, disposing: removes (or wipes) the old tree.
    fn disposing(&mut self) -> Result<(), MigrateError> {
        let (host, wd, j, notes, pool) = (self.host, self.wd, &self.j, &mut self.notes, &self.pool);
        self.t.time("dispose", || dispose(host, wd, j, notes, Some(pool)))?;
        catchup::forget_all(self.wd)?;
        self.record(Step::Done, Point::AfterRecordDone)
    }
}

fn swap(req: &Request, host: &dyn Host, wd: &Workdir, j: &Journal) -> Result<(), MigrateError> {
    Ctx::new(host, &j.source.0, 0, Phase::Swapping, j.files_total, j.bytes_total).tick(true);
    match place(j, wd)? {
        Place::Original => {
            if !req.force {
                check_not_in_use(&j.source.0)?;
            }
            let stg = open_staging(j, wd)?;
            check_encrypted(host, j, wd, &stg)?;
            let sealed: Vec<_> = j.sealed.iter().map(|s| (s.rel.0.clone(), s.flags)).collect();
            verify::seal_copies(&stg, &sealed, &j.source.0)?;
            exchange(host, j, wd, (j.source_ino, j.staging_ino), "swapping the copy into place")?;
            fault::point(Point::AfterSwap);
            if place(j, wd)? != Place::Exchanged {
                return Err(MigrateError::SourceReplaced { path: j.source.0.clone() });
            }
        }
        Place::Exchanged => {}
        _ => return Err(MigrateError::SourceReplaced { path: j.source.0.clone() }),
    }
    restore_root_times(j, wd)?;
    sync_swap(j, wd)
}
