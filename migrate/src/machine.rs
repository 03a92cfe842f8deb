//! The conversion as a state machine: [`convert`] and [`start`] record `Prepared`, then [`run`]
//! takes the recorded step to the next one, one function per step, until the conversion is done
//! (or swapped with a backup kept). Every step first writes what it did to the journal
//! ([`Run::record`]), so a run killed anywhere resumes at the step the journal names.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

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
use crate::types::{Method, MAX_ROUNDS};
use crate::{copy, flags, fsx, mv, verify};
use crate::{Census, Host, HostError, MigrateError, Outcome, Phase, Plan, Request, State, Timings};

/// Starts a conversion (running the [`preflight`] checks itself) or resumes the unfinished one
/// recorded in the work dir, from whatever state it is in. Returns when the conversion is `Done`,
/// or `Swapped` with a backup. A resumed conversion keeps its recorded `keep_backup` and `wipe`;
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
    };
    loop {
        match r.j.step {
            Step::Prepared => r.prepared()?,
            Step::Copying { round } => r.copying(round)?,
            Step::Copied { round } => r.verifying(round)?,
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
        Outcome { timings: std::mem::take(&mut self.t), ..outcome(&self.j, self.wd, std::mem::take(&mut self.notes)) }
    }

    /// `Prepared`: the first pass is recorded (a copy remembers when it began, for verifying).
    fn prepared(&mut self) -> Result<(), MigrateError> {
        if self.j.method == Method::Move {
            return self.record(Step::Moving, Point::AfterRecordMoving);
        }
        self.j.copy_started = Some(self.wd.clock()?);
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
        let pool = &self.pool;
        if let Err(e) = self.t.time("copy", || copy::copy_tree(&ctx, pool, &trees.src.fd, &trees.stg)) {
            return Err(self.failed(&ctx, e));
        }
        fault::point(Point::BeforeRecordCopied);
        self.sync_staging(&trees.stg)?;
        ctx.tick(true);
        self.all_done();
        self.j.recopied += ctx.recopied.load(Relaxed);
        self.record(Step::Copied { round }, Point::AfterRecordCopied)
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
        let (req, host, wd, j) = (&self.req, self.host, self.wd, &self.j);
        self.t.time("swap", || swap(req, host, wd, j))?;
        self.record(Step::Swapped { disposing: false }, Point::AfterRecordSwapped)
    }

    /// `Swapped`, disposing: removes (or wipes) the old tree.
    fn disposing(&mut self) -> Result<(), MigrateError> {
        let (host, wd, j, notes, pool) = (self.host, self.wd, &self.j, &mut self.notes, &self.pool);
        self.t.time("dispose", || dispose(host, wd, j, notes, Some(pool)))?;
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
