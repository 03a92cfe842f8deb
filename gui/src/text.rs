//! How figures and states are put in words. scripts/gui/driver.py says the same figures the same
//! way to check the window against the service's answers: change both together.

/// A byte count as GLib says it everywhere on the desktop ("1.2 GB").
pub fn size(bytes: u64) -> String {
    gtk::glib::format_size(bytes).to_string()
}

/// A duration, rounded up to what a person plans with.
pub fn duration(seconds: u64) -> String {
    match seconds {
        0..=59 => "less than a minute".to_owned(),
        60..=3599 => format!("about {} minutes", seconds.div_ceil(60)),
        _ => format!("about {} h {} min", seconds / 3600, (seconds % 3600).div_ceil(60)),
    }
}

/// A job's phase (the engine's `Phase` names, docs/dbus.md) for a person.
pub fn phase(p: &str) -> String {
    match p {
        "scanning" => "Counting files".to_owned(),
        "copying" => "Copying into the encrypted folder".to_owned(),
        "verifying" => "Checking the copy".to_owned(),
        "moving" => "Moving files into the encrypted folder".to_owned(),
        "swapping" => "Putting the encrypted folder in place".to_owned(),
        "disposing" => "Removing the unencrypted original".to_owned(),
        "aborting" => "Cancelling".to_owned(),
        "moving back" => "Moving files back".to_owned(),
        "rolling back" => "Undoing the change".to_owned(),
        other => other.to_owned(),
    }
}

/// The key state `GetStatus` reports.
pub fn key_state(k: &str) -> &str {
    match k {
        "unlocked" => "Unlocked",
        "locked" => "Locked",
        "partially-locked" => "Partly locked (files still open)",
        "" => "Unknown",
        other => other,
    }
}

/// What `GetStatus`'s `conversion` means for the buttons the overview offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Ended (or none): a new conversion may start.
    Finished,
    /// Stopped midway: `Convert` resumes or completes it.
    Unfinished,
    /// Waits for the next boot: `CancelScheduled` takes it back.
    Scheduled,
    /// Runs in the background (a live conversion): its job shows progress and cancels.
    Live,
}

/// A recorded conversion's state (`GetStatus`'s `conversion`, the engine's state words, "scheduled"
/// and "live: ...") for a person, and what it means. The finished states are the engine's
/// `State::is_final` ones.
pub fn conversion(state: &str) -> (String, Recorded) {
    if let Some(rest) = state.strip_prefix("live: ") {
        // A live one that ended reads as any ended one.
        return match conversion(rest) {
            ended @ (_, Recorded::Finished) => ended,
            _ => (format!("In the background: {rest}"), Recorded::Live),
        };
    }
    match state {
        "done" => ("Finished".to_owned(), Recorded::Finished),
        "aborted" => ("Cancelled; nothing was changed".to_owned(), Recorded::Finished),
        "rolled back" => ("Undone; the folder is as it was".to_owned(), Recorded::Finished),
        "scheduled" => ("Scheduled for the next boot: restart the computer to encrypt".to_owned(), Recorded::Scheduled),
        other => (format!("Unfinished ({other})"), Recorded::Unfinished),
    }
}

/// A running job's State property, when it says more than its Progress signals: a live
/// conversion waiting for the logout, put off, or committing.
pub fn job_state(state: &str) -> Option<String> {
    match state {
        "caught up" => Some("Caught up: log out to finish".to_owned()),
        "deferred" => Some("Put off: it finishes at your next logout".to_owned()),
        "committing" => Some("Finishing: putting the encrypted folder in place".to_owned()),
        _ => None,
    }
}

/// The line under [`job_state`]'s.
pub fn job_state_note(state: &str) -> String {
    match state {
        "committing" => "Almost done".to_owned(),
        _ => "Your files are copied and kept up to date; the encrypted folder takes their place once you have logged out. Restarting also finishes it.".to_owned(),
    }
}

/// The result page for a job's final state (`Finished`): title and note.
pub fn ending(state: &str) -> (&'static str, &'static str) {
    match state {
        "aborted" => ("Encryption cancelled", "Your home is as it was: nothing was encrypted and nothing was lost."),
        "scheduled" => (
            "Encryption scheduled for the next boot",
            "Restart the computer when it suits you: your home is encrypted before the login screen. \
             Until then nothing changes, and the overview can cancel it.",
        ),
        _ => (
            "Your data is encrypted",
            "Only your password or your recovery key opens it. \
             The old unencrypted files were deleted, but a disk keeps deleted data until it is written over: \
             until then it could be read by someone who takes the disk. An administrator can overwrite the free space \
             with “dirseal scrub”.",
        ),
    }
}

/// A protector's kind, with whether opening it needs typing.
pub fn protector_kind(kind: &str) -> String {
    match kind {
        "password" => "password".to_owned(),
        "tpm2" => "TPM (PIN, or no typing)".to_owned(),
        "fido2" => "security key (touch)".to_owned(),
        other => other.to_owned(),
    }
}

/// The recovery key's groups ("ABCD-EFGH-…" splits at the dashes).
pub fn groups(key: &str) -> Vec<&str> {
    key.split('-').filter(|g| !g.is_empty()).collect()
}

/// Whether what the user typed is the group: case, spaces and dashes do not matter.
pub fn same_group(typed: &str, group: &str) -> bool {
    let clean: String = typed.chars().filter(|c| !c.is_whitespace() && *c != '-').collect();
    !clean.is_empty() && clean.eq_ignore_ascii_case(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up() {
        assert_eq!(duration(0), "less than a minute");
        assert_eq!(duration(61), "about 2 minutes");
        assert_eq!(duration(3600), "about 1 h 0 min");
        assert_eq!(duration(3661), "about 1 h 2 min");
    }

    #[test]
    fn only_the_engines_final_states_are_finished() {
        for s in ["done", "aborted", "rolled back", "live: done", "live: aborted"] {
            assert_eq!(conversion(s).1, Recorded::Finished, "{s}");
        }
        for s in
            ["prepared", "copying", "copied", "verified", "moving", "moved", "moving back", "swapped", "rolling back"]
        {
            assert_eq!(conversion(s).1, Recorded::Unfinished, "{s}");
        }
        assert_eq!(conversion("scheduled").1, Recorded::Scheduled);
        assert_eq!(conversion("live: caught up, waiting for logout").1, Recorded::Live);
    }

    #[test]
    fn a_group_is_matched_loosely_but_not_emptily() {
        assert!(same_group(" abcd ", "ABCD"));
        assert!(!same_group("", ""));
        assert!(!same_group("ABCE", "ABCD"));
        assert_eq!(groups("AB-CD-EF"), ["AB", "CD", "EF"]);
    }
}
