//! `dirsealed`: dirseal's D-Bus system service (docs/dbus.md). Started on demand by the bus
//! through systemd; runs as root and authorizes every caller by the uid the bus reports.
#![deny(unsafe_code)]

mod auth;
mod ctx;
mod error;
mod fdio;
mod jobs;
mod log;
mod pick;
mod pin;
mod registry;
mod secrets;
mod service;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use ctx::Ctx;
use service::{Service, BUS_NAME, OBJECT_PATH};

/// Where the service finds its files. Paths come from these options only, never from the
/// environment. Parsed by hand: three options do not justify an argument-parser crate in a root
/// service (docs/architecture.md, "Front ends").
struct Args {
    config: PathBuf,
    /// None: from the config, else /var/lib/dirseal.
    keystore: Option<PathBuf>,
    /// Root-only directory for records of running conversions (kept across restarts of the
    /// service, cleared by a reboot).
    run_dir: PathBuf,
}

fn usage() -> String {
    format!(
        "usage: dirsealed [--config FILE] [--keystore DIR] [--run-dir DIR]

dirseal's D-Bus system service: encryption for desktop and game front ends, each caller limited
to what is theirs. Started by the bus through systemd (docs/dbus.md).

  --config FILE    config file [default: {}]
  --keystore DIR   keystore directory [default: from the config, else /var/lib/dirseal]
  --run-dir DIR    root-only directory for records of running conversions [default: /run/dirsealed]
  --version        print the version
  --help           print this help",
        dirseal::config::DEFAULT_CONFIG_PATH
    )
}

/// What the command line asks for: serve, or print something and exit.
enum Invocation {
    Serve(Args),
    Print(String),
}

fn parse_args(mut argv: impl Iterator<Item = std::ffi::OsString>) -> Result<Invocation, String> {
    let mut args = Args {
        config: PathBuf::from(dirseal::config::DEFAULT_CONFIG_PATH),
        keystore: None,
        run_dir: PathBuf::from("/run/dirsealed"),
    };
    while let Some(arg) = argv.next() {
        let flag = arg.to_str().map(|s| s.split_once('=').map_or((s, None), |(f, v)| (f, Some(v))));
        let (flag, inline) = match flag {
            Some(f) => f,
            None => return Err(format!("unexpected argument {arg:?}\n\n{}", usage())),
        };
        let mut value = |name: &str| -> Result<PathBuf, String> {
            match inline {
                Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
                Some(_) => Err(format!("{name} needs a value\n\n{}", usage())),
                None => argv.next().map(PathBuf::from).ok_or_else(|| format!("{name} needs a value\n\n{}", usage())),
            }
        };
        match flag {
            "--config" => args.config = value("--config")?,
            "--keystore" => args.keystore = Some(value("--keystore")?),
            "--run-dir" => args.run_dir = value("--run-dir")?,
            "--help" | "-h" => return Ok(Invocation::Print(usage())),
            "--version" | "-V" => return Ok(Invocation::Print(format!("dirsealed {}", env!("CARGO_PKG_VERSION")))),
            _ => return Err(format!("unexpected argument {flag:?}\n\n{}", usage())),
        }
    }
    Ok(Invocation::Serve(args))
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args_os().skip(1)) {
        Ok(Invocation::Serve(args)) => args,
        Ok(Invocation::Print(text)) => {
            println!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("dirsealed: error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dirsealed: error: {}", dirseal::remedy::said_once(e.as_ref()));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Invocation, String> {
        parse_args(args.iter().map(std::ffi::OsString::from))
    }

    #[test]
    fn options_in_both_spellings_and_defaults() {
        let Ok(Invocation::Serve(a)) = parse(&["--config", "/c", "--keystore=/k"]) else { panic!("not parsed") };
        assert_eq!((a.config, a.keystore, a.run_dir), ("/c".into(), Some("/k".into()), "/run/dirsealed".into()));
        let Ok(Invocation::Serve(a)) = parse(&[]) else { panic!("not parsed") };
        assert_eq!(a.config, PathBuf::from(dirseal::config::DEFAULT_CONFIG_PATH));
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        for bad in [&["--keystore"][..], &["--run-dir="], &["--frobnicate"], &["serve"]] {
            let e = parse(bad).err().expect("refused");
            assert!(e.contains("usage: dirsealed"), "{e}");
        }
        assert!(matches!(parse(&["--help"]), Ok(Invocation::Print(t)) if t.contains("--run-dir")));
    }
}
