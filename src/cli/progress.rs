//! Progress of long jobs (convert, scrub): a bar on a terminal, or JSON lines for front ends.
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use dirseal::ui::{Eta, Progress};

/// Progress for humans (a bar on a terminal) or front ends (JSON lines, at most one per second).
pub struct Reporter {
    /// On a terminal: the bar while one is shown, and whether it is the counting-only style.
    bar: Option<Mutex<Option<(indicatif::ProgressBar, bool)>>>,
    json: Option<Mutex<JsonState>>,
}

/// JSON lines: when the last went out, for which phase, and the estimate.
type JsonState = (Option<(Instant, String)>, Eta);

fn style(counting: bool) -> indicatif::ProgressStyle {
    // Before the totals are known (the census walk) there is nothing to measure against: a
    // spinner and a count, not a bar at 0 B/0 B.
    let template = if counting {
        "{spinner} {msg:10} {prefix}"
    } else {
        "{msg:10} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {prefix}"
    };
    indicatif::ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
}

impl Reporter {
    pub fn new(json: bool) -> Reporter {
        if json {
            return Reporter { bar: None, json: Some(Mutex::default()) };
        }
        let bar = std::io::stderr().is_terminal().then(|| Mutex::new(None));
        Reporter { bar, json: None }
    }

    pub fn report(&self, p: &Progress) {
        if let Some(bar) = &self.bar {
            let mut bar = bar.lock().unwrap_or_else(|e| e.into_inner());
            let counting = p.bytes_total == 0 && p.files_total == 0;
            let (b, was_counting) = bar.get_or_insert_with(|| {
                let b = indicatif::ProgressBar::new(0);
                b.set_style(style(counting));
                (b, counting)
            });
            if *was_counting != counting {
                b.set_style(style(counting));
                *was_counting = counting;
            }
            b.set_message(p.phase.clone());
            if counting {
                b.set_prefix(format!("{} entries", p.files_done));
                b.tick();
            } else {
                b.set_length(p.bytes_total);
                b.set_position(p.bytes_done);
                b.set_prefix(if p.files_total > 0 {
                    format!("{}/{} files", p.files_done, p.files_total)
                } else {
                    String::new()
                });
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
            if let Some((b, _)) = bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
                b.finish_and_clear();
            }
        }
    }
}
