//! `dirsealed`: dirseal's D-Bus system service (docs/dbus.md). Started on demand by the bus
//! through systemd; runs as root and authorizes every caller by the uid the bus reports.
#![deny(unsafe_code)]

mod auth;
mod error;
mod fdio;
mod jobs;
mod log;
mod pin;
mod service;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;

use service::{Ctx, Service, BUS_NAME, OBJECT_PATH};

/// dirseal's D-Bus system service: encryption for desktop and game front ends, each caller
/// limited to what is theirs. Paths come from these options only, never from the environment.
#[derive(Parser)]
#[command(name = "dirsealed", version)]
struct Args {
    /// Config file
    #[arg(long, default_value = dirseal::config::DEFAULT_CONFIG_PATH, value_name = "FILE")]
    config: PathBuf,
    /// Keystore directory [default: from the config, else /var/lib/dirseal]
    #[arg(long, value_name = "DIR")]
    keystore: Option<PathBuf>,
    /// Root-only directory for records of running conversions (kept across restarts of the
    /// service, cleared by a reboot)
    #[arg(long, value_name = "DIR", default_value = "/run/dirsealed")]
    run_dir: PathBuf,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dirsealed: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("dirsealed must run as root: it manages kernel encryption keys and the root-only keystore");
    }
    log::init();
    let ctx = Arc::new(Ctx::new(args.config, args.keystore, args.run_dir));
    // Fail early, with the file named, rather than on every call.
    ctx.open().context("opening the config and keystore")?;
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])?;
    let conn = zbus::blocking::Connection::system().context("connecting to the system bus")?;
    // Served before the name is taken: no call can arrive before the object exists.
    conn.object_server().at(OBJECT_PATH, Service::new(Arc::clone(&ctx), conn.inner().clone()))?;
    // Not queued behind another owner: a second instance says so and exits.
    conn.request_name_with_flags(BUS_NAME, zbus::fdo::RequestNameFlags::DoNotQueue.into())
        .with_context(|| format!("serving {BUS_NAME} on the system bus (is another dirsealed running?)"))?;
    log::line(&format!("serving {BUS_NAME} at {OBJECT_PATH}"));
    jobs::resume_recorded(&ctx, conn.inner());
    let sig = signals.forever().next();
    log::line(&format!("stopping on signal {}", sig.unwrap_or_default()));
    // Conversions stop at their next checkpoint, journaled; the next start resumes them.
    ctx.jobs.stop_all(std::time::Duration::from_secs(25));
    // The object holds the connection: removing it lets the connection close here.
    let _ = conn.object_server().remove::<Service, _>(OBJECT_PATH);
    drop(conn);
    Ok(())
}
