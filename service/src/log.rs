//! The service's one logging path. Every line passes through [`clean`]: what a caller controls (a
//! directory, a protector's name, an error quoting them) cannot add a line or fill the log.
//! Under systemd (stderr is the journal) each call's outcome is also a structured entry (METHOD,
//! CALLER_UID, TARGET, OUTCOME) through `tracing-journald`; otherwise plain lines on stderr.
use std::fmt::Write as _;
use std::sync::OnceLock;

/// Longest target (directory, protector) kept in a line, and longest line.
const MAX_TARGET: usize = 256;
const MAX_LINE: usize = 2048;

static JOURNAL: OnceLock<bool> = OnceLock::new();

/// Sets up the journal when stderr is connected to it (systemd's `JOURNAL_STREAM` names stderr's
/// device and inode); plain lines otherwise.
pub fn init() {
    let on_journal = stderr_is_journal()
        && tracing_journald::layer()
            .map(|l| {
                use tracing_subscriber::layer::SubscriberExt;
                let l = l.with_field_prefix(None).with_syslog_identifier("dirsealed".into());
                tracing::subscriber::set_global_default(tracing_subscriber::registry().with(l)).is_ok()
            })
            .unwrap_or(false);
    let _ = JOURNAL.set(on_journal);
}

fn stderr_is_journal() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = v.split_once(':') else { return false };
    match rustix::fs::fstat(std::os::fd::AsFd::as_fd(&std::io::stderr())) {
        Ok(st) => dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino),
        Err(_) => false,
    }
}

/// `s` with control characters (newlines included) and backslashes escaped, cut at `max` bytes
/// (on a character boundary) with "…" marking the cut.
pub fn clean(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max) + 8);
    for c in s.chars() {
        if out.len() >= max {
            out.push('…');
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// One line of the service's log.
pub fn line(text: &str) {
    let text = clean(text, MAX_LINE);
    if JOURNAL.get() == Some(&true) {
        tracing::info!("{text}");
    } else {
        eprintln!("dirsealed: {text}");
    }
}

/// A call's outcome: `method(target) by who: outcome`, and its fields in the journal.
pub fn outcome(method: &str, uid: u32, who: &str, target: &str, outcome: &str) {
    let target = clean(target, MAX_TARGET);
    let outcome = clean(outcome, MAX_LINE);
    if JOURNAL.get() == Some(&true) {
        tracing::info!(method, caller_uid = uid, target = %target, outcome = %outcome, "{method}({target}) by {who}: {outcome}");
    } else {
        eprintln!("dirsealed: {method}({target}) by {who}: {outcome}");
    }
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn control_characters_are_escaped_and_long_text_cut() {
        assert_eq!(
            clean("/home/a\ndirsealed: Lock(/home/v) by uid 0: ok", 100),
            "/home/a\\ndirsealed: Lock(/home/v) by uid 0: ok"
        );
        assert_eq!(clean("a\\n\r\x1b[2J", 100), "a\\\\n\\r\\u{1b}[2J");
        let long = "x".repeat(5000);
        let c = clean(&long, 256);
        assert!(c.len() <= 256 + '…'.len_utf8() && c.ends_with('…'));
        assert_eq!(clean("été", 2), "é…");
    }
}
