//! Progress of long jobs (convert, scrub): a bar on a terminal, or JSON lines for front ends.
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::HumanBytes;
use serde::Serialize;

use dirseal::ui::{Eta, Progress};

/// Resolution of the bar's position: it shows the estimate's fraction of the work (files and
/// bytes), not bytes alone, so bar and ETA agree on a tail of small files.
const STEPS: u64 = 10_000;

/// Progress for humans (a bar on a terminal) or front ends (JSON lines, at most one per second).
pub struct Reporter {
    bar: Option<Mutex<BarState>>,
    json: Option<Mutex<JsonState>>,
}

/// On a terminal: the bar while one is shown, whether it is the counting-only style, the phase
/// it shows, and the estimate (one per phase).
#[derive(Default)]
struct BarState {
    bar: Option<(indicatif::ProgressBar, bool)>,
    phase: String,
    eta: Eta,
    file_cost: Option<u64>,
    /// The phase's last report: its totals, for the bar kept when the phase is over.
    last: Option<Progress>,
}

/// JSON lines: when the last went out, for which phase, and the estimate.
type JsonState = (Option<(Instant, String)>, Eta);

fn style(counting: bool) -> indicatif::ProgressStyle {
    // Before the totals are known (the census walk) there is nothing to measure against: a
    // spinner and a count, not a bar at 0 B/0 B. The bar takes what the terminal's width leaves
    // (the text after it is at most 64 columns), so a line never wraps at 80 columns.
    let template = if counting { "{spinner} {msg:10} {prefix}" } else { "{msg:10} [{wide_bar}] {prefix}" };
    indicatif::ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
}

/// "ETA 42 s", "ETA 3 min", "ETA 1 h 5 min"; empty while unknown.
fn eta_text(secs: i64) -> String {
    match secs {
        s if s < 0 => String::new(),
        s @ 0..=59 => format!("  ETA {s} s"),
        s @ 60..=3599 => format!("  ETA {} min", (s + 59) / 60),
        s => format!("  ETA {} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// The text after the bar: bytes (if the phase counts any), files and the estimate.
fn counts(p: &Progress, eta: i64) -> String {
    let mut parts = Vec::new();
    if p.bytes_total > 0 {
        parts.push(format!("{}/{}", HumanBytes(p.bytes_done), HumanBytes(p.bytes_total)));
    }
    if p.files_total > 0 {
        parts.push(format!("{}/{} files", p.files_done, p.files_total));
    }
    let mut out = parts.join("  ");
    out.push_str(&eta_text(eta));
    out
}

/// What a phase's bar shows of the engine's report. Every phase reports the conversion's totals,
/// but the swap handles nothing one by one, and the disposal removes files without counting
/// bytes: their bars read "0 B/426 MiB" until the end (issue 24). The swap shows a spinner, the
/// disposal a count of files.
fn shown(p: &Progress) -> Progress {
    match p.phase.as_str() {
        "swapping" => Progress { bytes_done: 0, bytes_total: 0, files_done: 0, files_total: 0, ..p.clone() },
        "disposing" => Progress { bytes_done: 0, bytes_total: 0, ..p.clone() },
        _ => p.clone(),
    }
}

/// A phase's report as it stands once the phase is over: everything done.
fn complete(p: &Progress) -> Progress {
    Progress { bytes_done: p.bytes_total, files_done: p.files_total, ..p.clone() }
}

impl Reporter {
    pub fn new(json: bool) -> Reporter {
        if json {
            return Reporter { bar: None, json: Some(Mutex::default()) };
        }
        let bar = std::io::stderr().is_terminal().then(|| Mutex::new(BarState::default()));
        Reporter { bar, json: None }
    }

    /// One file costs as much time as writing `bytes` (from the conversion's measured rates):
    /// the estimates from here on weigh files so.
    pub fn set_file_cost(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            let mut st = bar.lock().unwrap_or_else(|e| e.into_inner());
            st.file_cost = Some(bytes);
            st.eta = Eta::with_file_cost(bytes);
        }
        if let Some(json) = &self.json {
            json.lock().unwrap_or_else(|e| e.into_inner()).1 = Eta::with_file_cost(bytes);
        }
    }

    pub fn report(&self, p: &Progress) {
        if let Some(bar) = &self.bar {
            let p = &shown(p);
            let mut st = bar.lock().unwrap_or_else(|e| e.into_inner());
            let st = &mut *st;
            let counting = p.bytes_total == 0 && p.files_total == 0;
            // A new phase starts from zero with its own rate: a bar (and indicatif's clock)
            // carried over from the copy would show the verification at the copy's end.
            if st.phase != p.phase {
                // A phase that counted stays on screen as its last count (a short one, under
                // indicatif's redraw interval, would otherwise never show it); a spinner goes.
                match st.bar.take() {
                    Some((b, false)) => {
                        // The engine went on, so the phase is over: its bar is kept full, with its
                        // totals. A run counts only what it handled itself (a resumed move ended
                        // at 54 %, the part the first run had moved being left out).
                        if let Some(last) = st.last.take() {
                            b.set_position(STEPS);
                            b.set_prefix(counts(&complete(&last), -1));
                        }
                        b.abandon();
                        // indicatif leaves the cursor at the end of the kept line.
                        if !b.is_hidden() {
                            eprintln!();
                        }
                    }
                    Some((b, true)) => b.finish_and_clear(),
                    None => {}
                }
                st.phase = p.phase.clone();
                st.eta = st.file_cost.map(Eta::with_file_cost).unwrap_or_default();
            }
            st.last = Some(p.clone());
            let (b, was_counting) = st.bar.get_or_insert_with(|| {
                let b = indicatif::ProgressBar::new(STEPS);
                b.set_style(style(counting));
                (b, counting)
            });
            if *was_counting != counting {
                b.set_style(style(counting));
                *was_counting = counting;
            }
            b.set_message(p.phase.clone());
            if counting {
                // The census counts entries as it finds them; a phase with nothing to count
                // (the swap) shows its name and the spinner alone.
                b.set_prefix(if p.files_done > 0 { super::term::entries(p.files_done) } else { String::new() });
                b.tick();
            } else {
                let eta = st.eta.seconds(p);
                b.set_position((st.eta.fraction(p) * STEPS as f64) as u64);
                b.set_prefix(counts(p, eta));
            }
        }
        if let Some(last) = &self.json {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            let (sent, estimate) = &mut *last;
            let eta_seconds = estimate.seconds(p);
            // One line per second, and one at every phase change so front ends see each phase.
            let same_phase = sent.as_ref().is_some_and(|(_, ph)| *ph == p.phase);
            if same_phase && sent.as_ref().is_some_and(|(t, _)| t.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *sent = Some((Instant::now(), p.phase.clone()));
            /// The library's progress and the seconds left in its phase (-1 while unknown), as
            /// the service's Progress signal has them.
            #[derive(Serialize)]
            struct WithEta<'a> {
                #[serde(flatten)]
                progress: &'a Progress,
                eta_seconds: i64,
            }
            #[derive(Serialize)]
            struct Line<'a> {
                progress: WithEta<'a>,
            }
            if let Ok(s) = serde_json::to_string(&Line { progress: WithEta { progress: p, eta_seconds } }) {
                println!("{s}");
            }
        }
    }

    /// Removes the bar (before a question, or at the end); the next report starts a new one.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            let mut st = bar.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((b, _)) = st.bar.take() {
                b.finish_and_clear();
            }
            st.phase.clear();
            st.last = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The widest text after the bar (a terabyte, millions of files, hours) still fits 80
    /// columns: msg (10) + " [" + bar + "] " + this.
    #[test]
    fn the_text_after_the_bar_fits_80_columns() {
        let p = Progress {
            phase: "verifying".into(),
            bytes_done: 1023 << 30,
            bytes_total: 1023 << 30,
            files_done: 9_999_999,
            files_total: 9_999_999,
        };
        let text = counts(&p, 3 * 3600 + 59 * 60);
        assert!(10 + 4 + text.chars().count() <= 78, "{} columns: {text}", text.len());
    }

    /// Issue 24: the swap and the disposal showed a byte bar that never moved ("0 B/426 MiB").
    #[test]
    fn the_swap_and_the_disposal_show_no_bytes() {
        let at = |phase: &str| Progress {
            phase: phase.into(),
            bytes_done: 0,
            bytes_total: 426 << 20,
            files_done: 1200,
            files_total: 3905,
        };
        let swap = shown(&at("swapping"));
        assert_eq!((swap.bytes_total, swap.files_total, swap.files_done), (0, 0, 0));
        let dispose = counts(&shown(&at("disposing")), -1);
        assert_eq!(dispose, "1200/3905 files");
        assert_eq!(counts(&shown(&at("copying")), -1), "0 B/426.00 MiB  1200/3905 files");
    }
}
