//! Conversions scheduled for the next boot (`convert --at-next-boot`): settling every run's end
//! against the schedule and its held key, cancelling, and the boot-time run.
use super::*;

/// After any run or end of a conversion of `source`: once the staging key is no longer needed
/// ([`scheduled::key_needed`]) the key held for it is destroyed, and a conversion scheduled for
/// the boot is recorded as run (its outcome kept for the front ends), or, aborted, cancelled (its
/// policy, and the protector scheduling made, removed: nothing of it is left). Whichever front
/// end ran it (the boot-time run, a resume or an abort by hand, the service).
pub(super) fn settle(ds: &Dirseal, source: &Path, outcome: &Outcome) -> Result<(), ConvertError> {
    if scheduled::key_needed(outcome.state) {
        return Ok(());
    }
    if let Ok(workdir) = workdir_for(source) {
        forget_on_medium(ds, source, &workdir, outcome.state);
    }
    let schedules = schedules(ds);
    if let Ok(id) = outcome.token.parse::<KeyIdentifier>() {
        schedules.forget(&id).map_err(OpsError::from)?;
    }
    match schedules.state_of(source).map_err(OpsError::from)? {
        Some(BootState::Pending(s)) if outcome.state == State::Aborted => drop_cancelled(ds, &s),
        Some(BootState::Pending(s)) => {
            let secs = outcome.timings.parts().iter().map(|(_, d)| d.as_secs()).sum();
            Ok(schedules.ran(&s, outcome.state, secs).map_err(OpsError::from)?)
        }
        _ => Ok(()),
    }
}

/// Removes what scheduling `s` made, after its conversion was aborted (the staging directory is
/// gone with the abort): the held key, the policy (record and kernel key), the protector if
/// scheduling made it and no other policy uses it, and the schedule.
fn drop_cancelled(ds: &Dirseal, s: &Schedule) -> Result<(), ConvertError> {
    let schedules = schedules(ds);
    schedules.forget(&s.policy).map_err(OpsError::from)?;
    if let Ok(mp) = fscrypt::mount_point(&s.source) {
        let _ = fscrypt::remove_key(&mp, &s.policy, false);
    }
    {
        let store = ds.keystore();
        let _guard = store.lock().map_err(OpsError::from)?;
        match store.remove_policy(&s.policy) {
            Ok(()) | Err(crate::keystore::KeystoreError::NotFound { .. }) => {}
            Err(e) => return Err(OpsError::from(e).into()),
        }
    }
    if s.protector_made && ds.keystore().policies_using(&s.protector).is_ok_and(|p| p.is_empty()) {
        match ds.remove_protector(&s.protector) {
            Ok(()) => {}
            Err(OpsError::Keystore(crate::keystore::KeystoreError::NotFound { .. })) => {}
            Err(e) => return Err(e.into()),
        }
    }
    schedules.remove(&s.source).map_err(OpsError::from)?;
    Ok(())
}

/// Where `source` stands with the next boot, read from the machine's keystore: scheduled (and
/// whether its last boot-time run failed), or run (and how it ended), or nothing.
pub fn boot_state(ds: &Dirseal, source: &Path) -> Result<Option<BootState>, ConvertError> {
    Ok(schedules(ds).state_of(&absolute(source)?).map_err(OpsError::from)?)
}

/// Cancels the conversion of `dir` scheduled for the next boot, before or after a boot-time run
/// that did not finish it: aborted with the held key (nothing is asked of `ui` while it is
/// held), then what scheduling made is removed ([`finish`] settles it). The directory is as it
/// was. Refused when nothing is scheduled for it.
pub fn cancel_scheduled(ds: &Dirseal, dir: &Path, ui: &mut dyn Ui, hooks: &Hooks<'_>) -> Result<Outcome, ConvertError> {
    match boot_state(ds, dir)? {
        Some(BootState::Pending(_)) => finish(ds, dir, Finish::Abort, ui, hooks),
        _ => Err(ConvertError::NotScheduled { path: absolute(dir)? }),
    }
}

/// The machine's scheduled conversions and held keys, sealed to the configured TPM.
pub(super) fn schedules(ds: &Dirseal) -> Schedules {
    Schedules::of(ds.keystore(), Some(ds.config().tpm2.tcti()))
}

/// One scheduled conversion the boot-time run took up, and how it went.
#[derive(Debug)]
pub struct BootRun {
    /// The record it ran from.
    pub schedule: Schedule,
    /// The run's result: converted (done, or swapped with a backup kept), or why not (it stays
    /// scheduled and is resumed at the next boot).
    pub result: Result<Converted, ConvertError>,
}

/// The boot-time run (`dirseal convert --scheduled`, `dirseal-convert-boot.service`): resumes
/// every conversion scheduled for the boot, one after the other, with the key held for it, so
/// nothing is asked of `ui` (a Ui that can only refuse is right). Each ends recorded as run, or
/// stays scheduled with its failure recorded (a stop or a power cut: the next boot resumes it).
/// A schedule whose conversion was finished or aborted by hand meanwhile is settled as that.
pub fn run_scheduled(ds: &Dirseal, ui: &mut dyn Ui, hooks: &Hooks<'_>) -> Result<Vec<BootRun>, ConvertError> {
    let schedules = schedules(ds);
    let mut runs = Vec::new();
    for s in schedules.pending().map_err(OpsError::from)? {
        let s = schedules.began(&s).map_err(OpsError::from)?;
        let result = run_one_scheduled(ds, &s, ui, hooks);
        if let Ok(c) = &result {
            live::lock_after_commit(ds, c, &s.source, ui);
        }
        if let Err(e) = &result {
            schedules.failed(&s, e.to_string()).map_err(OpsError::from)?;
        }
        runs.push(BootRun { schedule: s, result });
        if hooks.stop.load(Ordering::Relaxed) {
            break;
        }
    }
    Ok(runs)
}

fn run_one_scheduled(
    ds: &Dirseal,
    s: &Schedule,
    ui: &mut dyn Ui,
    hooks: &Hooks<'_>,
) -> Result<Converted, ConvertError> {
    let source = &s.source;
    let view = status(source)?;
    match view.as_ref().filter(|v| v.direction == Direction::Encrypt && v.token == s.policy.to_string()) {
        Some(v) if unfinished(v.state) => {
            let staging_key = staging_key_needed(source, v)?;
            let workdir = workdir_for(source)?;
            let plan = ResumePlan {
                source: source.clone(),
                workdir,
                options: Options::default(),
                state: v.state,
                key: staging_key,
            };
            plan.run(ds, Pick::default(), ui, hooks)
        }
        // Finished by hand meanwhile (or a power cut right after the end): settled as it ended.
        Some(v) => {
            let outcome = ended(v);
            settle(ds, source, &outcome)?;
            Ok(Converted { outcome, recovery_key_saved: None, scheduled: false })
        }
        // The journal is gone or names another conversion: nothing of this schedule can run.
        None => {
            drop_cancelled(ds, s)?;
            Err(ConvertError::NotInProgress { path: source.clone() })
        }
    }
}
