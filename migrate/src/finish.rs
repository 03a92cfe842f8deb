//! Ending a conversion: [`status`], [`abort`] before the swap (moving a move's files back),
//! [`rollback`] and [`commit`] after a swap that kept its backup, and disposing of the old tree.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::ctx::Ctx;
use crate::error::{host_err, io_err, move_err};
use crate::fault::{self, Point};
use crate::journal::{self, Journal, Step, Workdir, STAGING};
use crate::pass::after_pass;
use crate::trees::{clear_leftovers, exchange, open_pair, place, remove_staging, restore_root_times, sync_swap, Place};
use crate::types::{Direction, Method};
use crate::{catchup, fsx, mv, remove, Host, MigrateError, Outcome, Phase, State, StatusView, Timings};

/// Deletes (or wipes, then deletes) the old tree now in the staging slot, on `pool` (rayon's
/// global pool if none). Safe to repeat.
pub(crate) fn dispose(
    host: &dyn Host,
    wd: &Workdir,
    j: &Journal,
    notes: &mut Vec<String>,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), MigrateError> {
    match place(j, wd)? {
        Place::Exchanged => {
            let ctx = Ctx::new(host, &j.source.0, 0, Phase::Disposing, j.files_total + 1, j.bytes_total);
            ctx.tick(true);
            let first = AtomicBool::new(true);
            let on_removed = |m: &fsx::Meta| {
                if m.kind == fsx::Kind::File {
                    ctx.bytes_done.fetch_add(m.data(), Relaxed);
                }
                ctx.file_done();
                if first.swap(false, Relaxed) {
                    fault::point(Point::MidDispose);
                }
                fault::point(Point::DisposeEntry);
                ctx.check_stop().map_err(|_| io::Error::from(io::ErrorKind::Interrupted))
            };
            let remove = || remove::remove_tree(wd.fd.as_fd(), STAGING.as_ref(), j.wipe, &on_removed);
            let removed = match pool {
                Some(p) => p.install(remove),
                None => remove(),
            };
            match removed {
                Ok(()) => {}
                Err(_) if ctx.stopped() => return Err(MigrateError::Interrupted { state: State::Swapped }),
                Err(e) => return Err(io_err("removing the old copy", &wd.staging_path())(e)),
            }
            wd.sync()?;
        }
        Place::CopyOnly => {}
        _ => return Err(MigrateError::SourceReplaced { path: j.source.0.clone() }),
    }
    if j.wipe {
        fault::point(Point::BeforeTrim);
        if let Err(e) = host.trim(&wd.path) {
            notes.push(format!("TRIM of the freed blocks failed ({e}); run fstrim on the filesystem"));
        }
    }
    Ok(())
}

/// What a run reached, with the caveats that apply to its direction: those about the old
/// plaintext (deleted, not overwritten; kept as a backup) only for a conversion, since a
/// decrypt's old tree is ciphertext whose key goes too.
pub(crate) fn outcome(j: &Journal, wd: &Workdir, mut notes: Vec<String>) -> Outcome {
    let backup = (j.method == Method::Copy && matches!(j.step, Step::Swapped { .. })).then(|| wd.staging_path());
    let plaintext_left = j.direction == Direction::Encrypt;
    if j.step == Step::Done && plaintext_left {
        if j.wipe {
            notes.push(
                "old file contents were overwritten once with zeros and TRIM was requested; on SSDs, \
                 thin-provisioned, copy-on-write or journaled storage this does not guarantee the old \
                 blocks are gone"
                    .into(),
            );
        } else {
            notes.push(
                "the old plaintext was deleted, not overwritten: its blocks stay readable on the raw \
                 device until reused, unless the free space is overwritten (full-disk encryption \
                 keeps them unreadable from the start)"
                    .into(),
            );
        }
    }
    if backup.is_some() && plaintext_left {
        notes.push("the old plaintext is kept as a backup until the conversion is committed or rolled back".into());
    }
    if j.outside_links > 0 && matches!(j.step, Step::Done | Step::Swapped { .. }) {
        notes.push(format!(
            "{} file(s) also had hard links outside the directory; their plaintext is still reachable there",
            j.outside_links
        ));
    }
    if j.recopied > 0 {
        notes.push(format!("{} file(s) changed while being copied and were copied again", j.recopied));
    }
    Outcome {
        state: j.step.public(),
        method: j.method,
        token: j.token.clone(),
        files: j.files_total,
        bytes: j.bytes_total,
        backup,
        notes,
        timings: Timings::default(),
    }
}

/// Opens a work dir holding a journal, takes its lock and reads the journal.
fn open_recorded(workdir: &Path) -> Result<(Workdir, journal::WorkdirLock, Journal), MigrateError> {
    let none = || MigrateError::NoConversion { workdir: workdir.to_path_buf() };
    let wd = Workdir::open(workdir, false)?.ok_or_else(none)?;
    let lock = wd.lock()?;
    let j = wd.read()?.ok_or_else(none)?;
    Ok((wd, lock, j))
}

/// What the journal in `workdir` says, or `None` if there is no conversion there.
pub fn status(workdir: &Path) -> Result<Option<StatusView>, MigrateError> {
    let Some(wd) = Workdir::open(workdir, false)? else { return Ok(None) };
    let Some(j) = wd.read()? else { return Ok(None) };
    let backup =
        (j.method == Method::Copy && matches!(j.step, Step::Swapped { disposing: false })).then(|| wd.staging_path());
    Ok(Some(StatusView {
        state: j.step.public(),
        method: j.method,
        source: j.source.0,
        token: j.token,
        started_unix: j.started_unix,
        files_done: j.files_done,
        bytes_done: j.bytes_done,
        files_total: j.files_total,
        bytes_total: j.bytes_total,
        keep_backup: j.keep_backup,
        wipe: j.wipe,
        backup,
        moved_to: matches!(j.step.public(), State::Moving | State::Moved | State::MovingBack)
            .then(|| wd.staging_path()),
        running: matches!(wd.probe_lock(), Err(MigrateError::Busy { .. })),
        direction: j.direction,
        live: j.live.is_some(),
        passes: j.live.as_ref().and_then(|l| l.last_finished()).map_or(0, |p| p.pass),
    }))
}

/// Abandons a conversion before its swap: the staging copy is removed, the original was never
/// touched. After the swap this refuses and points to [`rollback`].
pub fn abort(workdir: &Path, host: &dyn Host) -> Result<Outcome, MigrateError> {
    let (wd, _lock, mut j) = open_recorded(workdir)?;
    match j.step {
        Step::Prepared
        | Step::Copying { .. }
        | Step::Copied { .. }
        | Step::Verified
        | Step::CatchingUp { .. }
        | Step::CaughtUp { .. } => {
            if place(&j, &wd)? == Place::Exchanged {
                // Crashed right after the swap: record it, and let the user roll back.
                j.keep_backup = true;
                wd.record(&mut j, Step::Swapped { disposing: false }, None)?;
                return Err(MigrateError::WrongState {
                    op: "abort",
                    state: State::Swapped,
                    hint: "the copy was already swapped into place; roll back instead",
                });
            }
            wd.record(&mut j, Step::Aborted, Point::AfterRecordAborted)?;
        }
        Step::Moving | Step::Settling | Step::Moved => {
            if place(&j, &wd)? == Place::Exchanged {
                // Crashed right after the swap: there is no backup to go back to; finishing is the
                // only way on.
                wd.record(&mut j, Step::Swapped { disposing: false }, None)?;
                return Err(MigrateError::WrongState {
                    op: "abort",
                    state: State::Swapped,
                    hint: "the encrypted directory was already swapped into place and a move keeps no backup; run the conversion again to finish it",
                });
            }
            host.ensure_unlocked(&j.token, &wd.staging_path()).map_err(host_err("unlocking the staging directory"))?;
            let (src, stg) = open_pair(&j, &wd)?;
            let ctx = Ctx::new(host, &j.source.0, src.meta.mnt_id, Phase::MovingBack, j.files_total, j.bytes_total);
            ctx.tick(true);
            let inflight: Vec<&Path> = j.inflight.iter().flat_map(|f| f.names()).collect();
            mv::prepare_back(&ctx, &src.fd, &stg, &inflight, j.step != Step::Moving)?;
            rustix::fs::syncfs(&stg).map_err(|e| io_err("syncing", &wd.staging_path())(e.into()))?;
            if let Some(f) = &mut j.inflight {
                f.back = true;
            }
            wd.record(&mut j, Step::MovingBack, Point::AfterRecordMovingBack)?;
            move_back(host, &wd, &mut j)?;
        }
        Step::MovingBack => {
            host.ensure_unlocked(&j.token, &wd.staging_path()).map_err(host_err("unlocking the staging directory"))?;
            move_back(host, &wd, &mut j)?;
        }
        Step::Aborted => {}
        Step::Swapped { .. } | Step::RollingBack | Step::Done | Step::RolledBack => {
            return Err(MigrateError::WrongState {
                op: "abort",
                state: j.step.public(),
                hint: "the copy was already swapped into place; roll back instead (possible only while the backup is kept)",
            })
        }
    }
    let ctx = Ctx::new(host, &j.source.0, 0, Phase::Aborting, 0, 0);
    ctx.tick(true);
    clear_leftovers(&wd, Some(&j), Point::AbortEntry)?;
    catchup::forget_all(&wd)?;
    Ok(outcome(&j, &wd, Vec::new()))
}

/// Moves every file back into the source, restores the source directories' times and records
/// `Aborted` (the staging directories are removed next, as after any abort).
fn move_back(host: &dyn Host, wd: &Workdir, j: &mut Journal) -> Result<(), MigrateError> {
    let (src, stg) = open_pair(j, wd)?;
    let source = j.source.0.clone();
    let ctx = Ctx::new(host, &source, src.meta.mnt_id, Phase::MovingBack, j.files_total, j.bytes_total);
    ctx.tick(true);
    let moved = mv::Mover::new(&ctx, wd, j, &src.fd, &stg, true).run();
    if let Err(e) = moved {
        return Err(after_pass(wd, j, &ctx, move_err(e)));
    }
    mv::restore_dir_times(&ctx, &src.fd, &stg)?;
    rustix::fs::syncfs(&src.fd).map_err(|e| io_err("syncing", &source)(e.into()))?;
    fault::point(Point::BeforeRecordAbortedMove);
    wd.record(j, Step::Aborted, Point::AfterRecordAborted)
}

/// Undoes a swap whose backup was kept: swaps the original back, then removes the encrypted copy.
pub fn rollback(workdir: &Path, host: &dyn Host) -> Result<Outcome, MigrateError> {
    let (wd, _lock, mut j) = open_recorded(workdir)?;
    if j.method == Method::Move && !j.step.is_final() {
        return Err(MigrateError::WrongState {
            op: "roll back",
            state: j.step.public(),
            hint: "a move keeps no backup; abort it before the swap, or run the conversion again to finish it",
        });
    }
    match j.step {
        Step::Swapped { disposing: false } => {
            wd.record(&mut j, Step::RollingBack, Point::AfterRecordRollingBack)?;
        }
        Step::RollingBack => {}
        Step::RolledBack => return Ok(outcome(&j, &wd, Vec::new())),
        Step::Swapped { disposing: true } | Step::Done => {
            return Err(MigrateError::WrongState {
                op: "roll back",
                state: j.step.public(),
                hint: "the old copy was already (partly) removed; finish the conversion instead",
            })
        }
        Step::Prepared
        | Step::Copying { .. }
        | Step::Copied { .. }
        | Step::Verified
        | Step::CatchingUp { .. }
        | Step::CaughtUp { .. }
        | Step::Moving
        | Step::Settling
        | Step::Moved
        | Step::MovingBack => {
            return Err(MigrateError::WrongState {
                op: "roll back",
                state: j.step.public(),
                hint: "nothing was swapped yet; abort it instead",
            })
        }
        Step::Aborted => {
            return Err(MigrateError::WrongState {
                op: "roll back",
                state: State::Aborted,
                hint: "it was aborted; the original is in place",
            })
        }
    }
    let ctx = Ctx::new(host, &j.source.0, 0, Phase::RollingBack, 0, 0);
    ctx.tick(true);
    match place(&j, &wd)? {
        Place::Exchanged => {
            exchange(host, &j, &wd, (j.staging_ino, j.source_ino), "swapping the original back")?;
            fault::point(Point::RollbackAfterSwap);
            restore_root_times(&j, &wd)?;
            sync_swap(&j, &wd)?;
        }
        // A crash may have come between the exchange back and putting the times back.
        Place::Original => restore_root_times(&j, &wd)?,
        Place::OriginalOnly => {}
        Place::CopyOnly | Place::Unknown => return Err(MigrateError::SourceReplaced { path: j.source.0.clone() }),
    }
    if place(&j, &wd)? == Place::Original {
        remove_staging(&wd, Point::RollbackEntry)?;
    }
    fault::point(Point::RollbackBeforeRecord);
    catchup::forget_all(&wd)?;
    wd.record(&mut j, Step::RolledBack, None)?;
    Ok(outcome(&j, &wd, Vec::new()))
}

/// Finishes a conversion kept at `Swapped`: disposes of the old plaintext (wiping it if the
/// conversion was started with `wipe`).
pub fn commit(workdir: &Path, host: &dyn Host) -> Result<Outcome, MigrateError> {
    let (wd, _lock, mut j) = open_recorded(workdir)?;
    match j.step {
        Step::Swapped { disposing: false } => {
            wd.record(&mut j, Step::Swapped { disposing: true }, Point::AfterRecordDisposing)?;
        }
        Step::Swapped { disposing: true } => {}
        Step::Done => return Ok(outcome(&j, &wd, Vec::new())),
        _ => {
            return Err(MigrateError::WrongState {
                op: "commit",
                state: j.step.public(),
                hint: "only a swapped conversion whose backup was kept can be committed",
            })
        }
    }
    let mut notes = Vec::new();
    dispose(host, &wd, &j, &mut notes, None)?;
    catchup::forget_all(&wd)?;
    wd.record(&mut j, Step::Done, Point::AfterRecordDone)?;
    Ok(outcome(&j, &wd, notes))
}
