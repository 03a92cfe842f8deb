//! Progress of long jobs (convert, scrub): a bar on a terminal, or JSON lines for front ends.
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use dirseal::ui::Progress;

/// Progress for humans (a bar on a terminal) or front ends (JSON lines, at most one per second).
pub struct Reporter {
    bar: Option<indicatif::ProgressBar>,
    json: Option<Mutex<Option<(Instant, String)>>>,
}

impl Reporter {
    pub fn new(json: bool) -> Reporter {
        if json {
            return Reporter { bar: None, json: Some(Mutex::new(None)) };
        }
        if !std::io::stderr().is_terminal() {
            return Reporter { bar: None, json: None };
        }
        let bar = indicatif::ProgressBar::new(0);
        let style = indicatif::ProgressStyle::with_template(
            "{msg:10} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {prefix}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        Reporter { bar: Some(bar), json: None }
    }

    pub fn report(&self, p: &Progress) {
        if let Some(bar) = &self.bar {
            bar.set_message(p.phase.clone());
            bar.set_length(p.bytes_total);
            bar.set_position(p.bytes_done);
            if p.files_total > 0 {
                bar.set_prefix(format!("{}/{} files", p.files_done, p.files_total));
            }
        }
        if let Some(last) = &self.json {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            // One line per second, and one at every phase change so front ends see each phase.
            let same_phase = last.as_ref().is_some_and(|(_, ph)| *ph == p.phase);
            if same_phase && last.as_ref().is_some_and(|(t, _)| t.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *last = Some((Instant::now(), p.phase.clone()));
            #[derive(Serialize)]
            struct Line<'a> {
                progress: &'a Progress,
            }
            if let Ok(s) = serde_json::to_string(&Line { progress: p }) {
                println!("{s}");
            }
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
