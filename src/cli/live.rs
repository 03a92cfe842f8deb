//! `dirseal convert DIR --live`: once everything was asked in the foreground (the conversion is
//! prepared and its staging key held, as for `--at-next-boot`), the background run
//! (`convert --live-worker DIR`, [`dirseal::convert::run_live`]) is started detached: as a
//! transient systemd unit at idle priority when systemd runs the machine, else as a child in its
//! own session that lowers its own priority. `--wait` follows it until the commit.
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use dirseal::convert::{self, Hooks, LiveEvent, LiveStatus, State};
use dirseal::ops::Dirseal;
use dirseal::ui::{Progress, Question, SecretPrompt, Ui, UiError};
use dirseal::Passphrase;

use super::term::clean;

/// Whether systemd manages this machine (sd_booted(3)'s test).
fn systemd_runs() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Starts the background run of `abs`'s live conversion and returns at once; it uses the
/// configuration and keystore of `ds` (named on its command line: a systemd unit gets none of
/// this process's environment).
pub fn start(ds: &Dirseal, abs: &Path) -> Result<()> {
    let exe = std::fs::read_link("/proc/self/exe").context("cannot find this program to start the background run")?;
    let global = [
        std::ffi::OsString::from("--config"),
        ds.config_path().into(),
        "--keystore".into(),
        ds.keystore().root().into(),
    ];
    let status = if systemd_runs() {
        let name = convert::workdir_for(abs)?;
        let unit = format!("dirseal-live-{}", name.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
        Command::new("systemd-run")
            .args([
                &format!("--unit={unit}"),
                "--property=Nice=19",
                "--property=IOSchedulingClass=idle",
                "--collect",
                "--quiet",
            ])
            .arg(&exe)
            .args(&global)
            .args(["convert", "--live-worker"])
            .arg(abs)
            .stdin(Stdio::null())
            .status()
            .context("cannot run systemd-run to start the background run")?
            .success()
    } else {
        // Its own session (it calls setsid), so the terminal's hangup at logout does not reach
        // it; reparented to init once this process exits.
        // Its cwd is never the directory, which it waits to see unused.
        Command::new(&exe)
            .args(&global)
            .args(["convert", "--live-worker"])
            .arg(abs)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the background run")
            .map(drop)
            .is_ok()
    };
    // Returned once the run holds its lock (status then says it runs), or said when it could not
    // start at all.
    let started = Instant::now();
    while status && started.elapsed() < Duration::from_secs(15) {
        match convert::live_status(ds, abs)? {
            Some(LiveStatus::NotRunning { error: Some(e), .. }) => {
                bail!("the background run of {} failed: {}", clean(&abs.display().to_string()), clean(&e))
            }
            Some(LiveStatus::NotRunning { .. }) => std::thread::sleep(Duration::from_millis(100)),
            _ => return Ok(()),
        }
    }
    if !status {
        bail!(
            "the background run of {d} did not start; the conversion is prepared: start it again with `dirseal convert --live {d}`, or the next boot converts it",
            d = clean(&abs.display().to_string())
        );
    }
    Ok(())
}

/// Follows the background run of `abs` until the commit (`--wait`): its phase changes on stderr.
pub fn wait(ds: &Dirseal, abs: &Path) -> Result<i32> {
    let d = clean(&abs.display().to_string());
    let mut said = String::new();
    let started = Instant::now();
    loop {
        let now = convert::live_status(ds, abs)?;
        let line = now.as_ref().map(ToString::to_string).unwrap_or_default();
        if line != said {
            eprintln!("{d}: {line}");
            said = line;
        }
        match now {
            Some(LiveStatus::Done) => return Ok(0),
            Some(LiveStatus::Ended(_)) | None => return Ok(1),
            // Give the run a moment to take its lock after it was started.
            Some(LiveStatus::NotRunning { .. }) if started.elapsed() > Duration::from_secs(10) => return Ok(1),
            _ => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

/// The background run's Ui: nothing can be asked (the key is held), notices go to stdout.
struct Unattended;

const UNATTENDED: &str = "nothing can be asked of a background run; run `dirseal convert DIR` from a root shell, or cancel it with `dirseal convert --abort DIR`";

impl Ui for Unattended {
    fn secret(&mut self, _prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        Err(UiError::NoInput { hint: UNATTENDED.into() })
    }

    fn confirm(&mut self, _q: &Question<'_>) -> Result<bool, UiError> {
        Err(UiError::Unconfirmed { what: "the background run".into(), hint: UNATTENDED.into() })
    }

    fn notice(&mut self, msg: &str) {
        println!("dirseal: {}", clean(msg));
    }
}

/// `convert --live-worker DIR`: the background run itself, until the commit (0), a stop (SIGTERM:
/// 0, it stays resumable), or a failure (1, recorded for `--status`).
pub fn worker(ds: &Dirseal, abs: &Path) -> Result<i32> {
    if !systemd_runs() {
        // Out of the starting terminal's session; lowered as systemd-run would.
        let _ = rustix::process::setsid();
        convert::background_priority()?;
    }
    let _catch = super::interrupt::catching();
    let stop = super::interrupt::flag();
    let d = clean(&abs.display().to_string());
    let last: Mutex<Option<(Instant, String)>> = Mutex::new(None);
    let progress = |p: &Progress| {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.as_ref().is_none_or(|(at, phase)| *phase != p.phase || at.elapsed() >= Duration::from_secs(30));
        if due {
            *last = Some((Instant::now(), p.phase.clone()));
            println!("dirseal: {d}: {} ({} of {} files)", p.phase, p.files_done, p.files_total);
        }
    };
    let hooks = Hooks { progress: &progress, stop };
    let on = |e: LiveEvent<'_>| match e {
        LiveEvent::CaughtUp { passes } => println!("dirseal: {d}: caught up ({passes} passes), waiting for logout"),
        LiveEvent::Committing => println!("dirseal: {d}: the owner logged out: committing"),
        LiveEvent::Deferred(why) => println!("dirseal: {d}: commit deferred: {}", clean(why)),
    };
    match convert::run_live(ds, abs, &mut Unattended, &hooks, &on) {
        Ok(c) if c.outcome.state == State::Done => {
            println!("dirseal: {d} is encrypted");
            Ok(0)
        }
        Ok(c) => {
            println!("dirseal: {d}: {}", c.outcome.state);
            Ok(0)
        }
        Err(convert::ConvertError::Migrate(convert::MigrateError::Interrupted { .. })) => {
            println!("dirseal: {d}: stopped; the next boot commits it, or `dirseal convert --live {d}` goes on");
            Ok(0)
        }
        Err(e) => Err(e.into()),
    }
}
