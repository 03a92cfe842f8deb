//! `dirseal convert --scheduled`: the boot-time run of `dirseal-convert-boot.service`. It resumes
//! every conversion scheduled with `--at-next-boot` with the keys held for them
//! ([`dirseal::convert::run_scheduled`]): nothing is asked (its Ui refuses every question, so a
//! missing key fails the run instead of waiting at a console no one watches). Progress goes to
//! stdout (the unit sends it to the console and the journal) and, while plymouth shows the boot
//! splash, to plymouth's message line; both at most once a second, and at each phase's start.
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::HumanBytes;

use dirseal::convert::{self, Hooks, State};
use dirseal::ops::Dirseal;
use dirseal::ui::{Progress, Question, SecretPrompt, Ui, UiError};
use dirseal::Passphrase;

use super::term::clean;

/// Where the boot-time run's messages go: stdout, and plymouth when it runs.
struct Console {
    plymouth: bool,
    /// When the last progress line went out, and for which phase.
    last: Mutex<Option<(Instant, String)>>,
}

impl Console {
    fn new() -> Console {
        // `plymouth --ping` succeeds only while plymouthd runs (a splash, or its text mode).
        let plymouth = Command::new("plymouth")
            .arg("--ping")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        Console { plymouth, last: Mutex::new(None) }
    }

    fn say(&self, msg: &str) {
        println!("dirseal: {msg}");
        if self.plymouth {
            let _ = Command::new("plymouth")
                .arg("display-message")
                .arg(format!("--text=dirseal: {msg}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    fn report(&self, p: &Progress) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let due = match &*last {
            Some((at, phase)) => *phase != p.phase || at.elapsed() >= Duration::from_secs(1),
            None => true,
        };
        if !due {
            return;
        }
        *last = Some((Instant::now(), p.phase.clone()));
        drop(last);
        self.say(&progress_text(p));
    }
}

/// "copying 42 % (1.2 GiB of 2.9 GiB, 5120 of 12000 files)".
fn progress_text(p: &Progress) -> String {
    // As the bar shows them (progress.rs): the swap counts nothing, the disposal only files.
    let p = &match p.phase.as_str() {
        "swapping" => Progress { bytes_done: 0, bytes_total: 0, files_done: 0, files_total: 0, ..p.clone() },
        "disposing" => Progress { bytes_done: 0, bytes_total: 0, ..p.clone() },
        _ => p.clone(),
    };
    let share = |done: u64, total: u64| (done.min(total) * 100).checked_div(total);
    let percent = share(p.bytes_done, p.bytes_total).or_else(|| share(p.files_done, p.files_total));
    let mut parts = Vec::new();
    if p.bytes_total > 0 {
        parts.push(format!("{} of {}", HumanBytes(p.bytes_done), HumanBytes(p.bytes_total)));
    }
    if p.files_total > 0 {
        parts.push(format!("{} of {} files", p.files_done, p.files_total));
    }
    match (percent, parts.is_empty()) {
        (Some(pc), false) => format!("{} {pc} % ({})", p.phase, parts.join(", ")),
        _ => p.phase.clone(),
    }
}

/// The boot-time run's Ui: nothing can be asked at boot (what scheduling asked is held), so
/// every question is refused and notices go to the console.
struct NoQuestions<'a>(&'a Console);

const AT_BOOT: &str = "nothing can be asked during the boot-time conversion; resume it from a root shell with `dirseal convert DIR`, or cancel it with `dirseal convert --abort DIR`";

impl Ui for NoQuestions<'_> {
    fn secret(&mut self, _prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        Err(UiError::NoInput { hint: AT_BOOT.into() })
    }

    fn confirm(&mut self, _q: &Question<'_>) -> Result<bool, UiError> {
        Err(UiError::Unconfirmed { what: "the boot-time conversion".into(), hint: AT_BOOT.into() })
    }

    fn notice(&mut self, msg: &str) {
        self.0.say(&clean(msg));
    }
}

/// Runs every scheduled conversion; exit status 1 if any failed (it stays scheduled, and the next
/// boot tries again), 0 otherwise (none scheduled included: the unit's condition usually keeps it
/// from starting then).
pub fn run(ds: &Dirseal, json: bool) -> Result<i32> {
    let _catch = super::interrupt::catching();
    let stop = super::interrupt::flag();
    let console = Console::new();
    let progress = |p: &Progress| console.report(p);
    let hooks = Hooks { progress: &progress, stop };
    let mut ui = NoQuestions(&console);
    let runs = convert::run_scheduled(ds, &mut ui, &hooks)?;
    let mut failed = false;
    for r in &runs {
        let d = clean(&r.schedule.source.display().to_string());
        let (state, error) = match &r.result {
            Ok(c) => (Some(c.outcome.state), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        failed |= error.is_some();
        if json {
            let line = serde_json::json!({ "result": {
                "path": r.schedule.source,
                "state": state.map(|s| s.to_string()),
                "error": error,
            }});
            println!("{line}");
            continue;
        }
        match (state, error) {
            (Some(State::Done), _) => console.say(&format!("{d} is encrypted")),
            (Some(State::Swapped), _) => console
                .say(&format!("{d} is encrypted; the old plaintext is kept until `dirseal convert --commit {d}`")),
            (Some(s), _) => console.say(&format!("{d}: {s}")),
            (None, Some(e)) => {
                console.say(&format!("the conversion of {d} failed; it is tried again at the next boot: {}", clean(&e)))
            }
            (None, None) => {}
        }
    }
    if runs.is_empty() && !json {
        println!("dirseal: no conversion is scheduled for the boot");
    }
    Ok(if failed { 1 } else { 0 })
}

/// The status line of a directory scheduled for the next boot, or converted by the boot-time run.
pub fn state_text(state: &dirseal::scheduled::BootState) -> String {
    use dirseal::scheduled::BootState;
    match state {
        BootState::Pending(s) => {
            let failed = s
                .last_failure
                .as_ref()
                .map(|f| format!("; the last boot's run failed ({}) and is tried again", clean(&f.error)))
                .unwrap_or_default();
            format!("scheduled for the next boot ({}){failed}", s.method)
        }
        BootState::Ran(s) => match &s.ran {
            Some(r) => format!("the conversion scheduled for the boot finished: {} ({} s)", r.state, r.seconds),
            None => "the conversion scheduled for the boot finished".into(),
        },
    }
}

/// The boot-state line for `dir`, when anything is recorded (root with a keystore only); a live
/// conversion's ("live: ...") instead, whose schedule is only its fallback.
pub fn state_line(ds: &Dirseal, dir: &Path) -> Option<String> {
    if let Some(live) = convert::live_status(ds, dir).ok().flatten() {
        return Some(live.to_string());
    }
    convert::boot_state(ds, dir).ok().flatten().map(|s| state_text(&s))
}

/// The JSON key a [`state_line`] goes under.
pub fn line_key(line: &str) -> &'static str {
    if line.starts_with("live:") {
        "live"
    } else {
        "at_next_boot"
    }
}
