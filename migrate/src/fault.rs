//! Named crash points for tests. With the feature `fault-injection` off, [`point`] is an empty
//! inline function and the environment is never read. [`Point::ALL`] is the one list of points:
//! the crash tests iterate it and a test checks it against docs/crash-safety.md.
//!
//! `DIRSEAL_FAULT=<point>` makes the process exit at the first time execution reaches `<point>`;
//! `DIRSEAL_FAULT=<point>:<n>` at the n-th time (e.g. `copy-file:30`, after the 30th file copied
//! by this run). Counting is per process and across threads, so a point reached by parallel
//! workers dies at exactly the n-th arrival.
//!
//! With `DIRSEAL_FAULT_HOLD=<file>` as well, the process does not exit there: the arriving thread
//! creates `<file>` and waits until it is removed, so a test can act (cancel, inspect) while the
//! engine is observably at that point.

macro_rules! points {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)+) => {
        /// A place where a test can make the engine die.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Point {
            $($(#[$doc])* $variant,)+
        }

        impl Point {
            /// Every point, in the order a conversion (then abort, rollback, commit) reaches them.
            pub const ALL: &'static [Point] = &[$(Point::$variant,)+];

            /// The name `DIRSEAL_FAULT` and docs/crash-safety.md use.
            pub fn name(self) -> &'static str {
                match self {
                    $(Point::$variant => $name,)+
                }
            }
        }
    };
}

points! {
    /// The host (dirseal's convert) saved the new protector in the keystore.
    AfterProtectorSaved = "after-protector-saved",
    AfterStagingCreated = "after-staging-created",
    /// The host saved the staging directory's policy record in the keystore.
    AfterPolicySaved = "after-policy-saved",
    BeforeRecordPrepared = "before-record-prepared",
    AfterPrepare = "after-prepare",
    AfterRecordCopying = "after-record-copying",
    /// After each staging directory made by a copy, before the flags of an empty directory
    /// (casefold) are set on it.
    CopyDirMade = "copy-dir-made",
    /// After each regular file linked into staging.
    CopyFile = "copy-file",
    CopySpecialMade = "copy-special-made",
    /// After each special file finished in staging.
    CopySpecial = "copy-special",
    /// After each directory's metadata set in staging.
    CopyDir = "copy-dir",
    BeforeRecordCopied = "before-record-copied",
    AfterRecordCopied = "after-record-copied",
    /// After each entry compared.
    VerifyEntry = "verify-entry",
    AfterVerify = "after-verify",
    AfterRecordRecopy = "after-record-recopy",
    /// A live conversion: a catch-up pass recorded (after the first copy's verification, or
    /// after a pass that changed much);
    AfterRecordCatchingUp = "after-record-catching-up",
    /// a pass's manifest written, before the journal records the pass finished;
    AfterManifestWritten = "after-manifest-written",
    AfterRecordCaughtUp = "after-record-caught-up",
    /// the commit recorded (its last catch-up pass begins).
    AfterRecordCommitting = "after-record-committing",
    AfterRecordVerified = "after-record-verified",
    /// After each verified copy made immutable or append-only, before the swap.
    SealEntry = "seal-entry",
    AfterSwap = "after-swap",
    AfterRecordSwapped = "after-record-swapped",
    AfterRecordDisposing = "after-record-disposing",
    MidDispose = "mid-dispose",
    /// After each entry of the old tree removed.
    DisposeEntry = "dispose-entry",
    BeforeTrim = "before-trim",
    AfterRecordDone = "after-record-done",
    AfterRecordMoving = "after-record-moving",
    /// After each staging directory made by a move, before the flags of an empty directory are
    /// set on it.
    MoveDirMade = "move-dir-made",
    /// After each small file or special file copied by a move (in or back).
    MoveEntryCopied = "move-entry-copied",
    /// After each batch of a move made durable, before its originals are removed.
    MoveBatchSynced = "move-batch-synced",
    /// After each original of a batch removed.
    MoveEntryRemoved = "move-entry-removed",
    /// After a large file is recorded in flight.
    MoveFileStarted = "move-file-started",
    /// After each chunk copied and synced, before it is recorded.
    MoveChunkCopied = "move-chunk-copied",
    /// After each chunk recorded, before the original shrinks (or, moving back, is punched).
    MoveChunkRecorded = "move-chunk-recorded",
    /// After each other name of a hard-link group linked at its destination.
    MoveLinkMade = "move-link-made",
    /// After each other original name of a hard-link group removed.
    MoveLinkRemoved = "move-link-removed",
    /// After a large file's original name removed, before the journal forgets it.
    MoveFileDone = "move-file-done",
    AfterRecordSettling = "after-record-settling",
    /// After a staging directory got its metadata, before its times record is removed.
    SettleTimesKept = "settle-times-kept",
    /// After each staging directory settled.
    SettleDir = "settle-dir",
    AfterRecordMoved = "after-record-moved",
    AfterRecordMovingBack = "after-record-moving-back",
    BeforeRecordAbortedMove = "before-record-aborted-move",
    AfterRecordAborted = "after-record-aborted",
    /// After each staging entry removed by an abort.
    AbortEntry = "abort-entry",
    /// After each entry removed of what an aborted conversion left.
    LeftoverEntry = "leftover-entry",
    AfterRecordRollingBack = "after-record-rolling-back",
    RollbackAfterSwap = "rollback-after-swap",
    /// After each entry of the encrypted copy removed by a rollback.
    RollbackEntry = "rollback-entry",
    RollbackBeforeRecord = "rollback-before-record",
    /// Decrypt's clean-up (the host, dirseal's decrypt), at each of its writes: the directory's
    /// recovery attribute removed;
    CleanupRecoveryRemoved = "cleanup-recovery-removed",
    /// what the clean-up will remove recorded in the work dir;
    CleanupRecorded = "cleanup-recorded",
    /// after each protector left the policy record (the record saved without it);
    CleanupPolicySaved = "cleanup-policy-saved",
    /// after each protector's record removed;
    CleanupProtectorRemoved = "cleanup-protector-removed",
    /// the policy record removed;
    CleanupPolicyRemoved = "cleanup-policy-removed",
    /// every record gone (the policy and its protectors), the key not yet removed from the kernel;
    AfterPolicyForgotten = "after-policy-forgotten",
    /// the key removed from the kernel, the clean-up's record not yet removed.
    CleanupKeyRemoved = "cleanup-key-removed",
}

impl std::fmt::Display for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Exits the process with status 99 when `DIRSEAL_FAULT` names this point and this is the
/// wanted arrival. No destructors, no journal flush: to the files on disk it looks like a crash at
/// this instant (the engine never holds unwritten data in user space).
/// Public for the host, whose keystore writes at the start of a conversion are crash points too.
#[cfg(feature = "fault-injection")]
pub fn point(here: Point) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static WANTED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let wanted = WANTED.get_or_init(|| {
        let v = std::env::var("DIRSEAL_FAULT").ok()?;
        match v.rsplit_once(':') {
            Some((p, n)) => Some((p.to_string(), n.parse().ok()?)),
            None => Some((v, 1)),
        }
    });
    if let Some((p, n)) = wanted {
        if p == here.name() && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            if let Some(hold) = std::env::var_os("DIRSEAL_FAULT_HOLD") {
                let hold = std::path::PathBuf::from(hold);
                if std::fs::write(&hold, here.name()).is_ok() {
                    while hold.exists() {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    return;
                }
            }
            std::process::exit(99);
        }
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn point(_: Point) {}

/// A size or count a test sets through the environment (so a small tree exercises what a large
/// one would); with the feature `fault-injection` off the environment is never read.
pub(crate) fn test_override(_var: &str) -> Option<u64> {
    #[cfg(feature = "fault-injection")]
    if let Some(n) = std::env::var(_var).ok().and_then(|v| v.parse::<u64>().ok()) {
        return Some(n.max(1));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::Point;

    /// docs/crash-safety.md lists the points (each in backquotes) between the markers; the list
    /// must be exactly `Point::ALL`, in order.
    #[test]
    fn the_documented_points_are_the_engine_points() {
        let doc = include_str!("../../docs/crash-safety.md");
        let start = doc.find("<!-- fault-points -->").expect("start marker in docs/crash-safety.md");
        let end = doc.find("<!-- /fault-points -->").expect("end marker in docs/crash-safety.md");
        let listed: Vec<&str> = doc[start..end].split('`').skip(1).step_by(2).collect();
        let ours: Vec<&str> = Point::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(listed, ours, "docs/crash-safety.md and fault::Point::ALL disagree");
        let mut names = ours.clone();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ours.len(), "duplicate point names");
    }
}
