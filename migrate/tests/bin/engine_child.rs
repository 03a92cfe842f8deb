//! Test-only child process (built with the `fault-injection` feature): runs one engine operation
//! with the plain test host so tests can kill it at exact moments and resume in a new process.
//!
//! `dirseal-migrate-test-child <convert|abort|rollback|commit> SOURCE WORKDIR [--keep-backup]
//! [--wipe] [--force] [--threads N] [--mode copy|move|auto] [--live]`
//!
//! Environment (besides `DIRSEAL_FAULT`, read by the engine):
//! - `TEST_KILL=<event>`: SIGKILL this process at the first host event matching (see
//!   `Event::matches`: `poll-copying:40`, `prepare`, `exchange-after`, `trim`, ...).
//! - `TEST_HOLD=<event>`: at that event print `holding` and wait until stdin is closed.
//! - `TEST_APPEND=<event>=<path>`: at that event append a byte to `path`.
//!
//! Prints `state=<state>`, `peak_kib=<peak RSS>` and `links_spilled=<hard-linked inodes the
//! passes kept on disk>` (exit 0) or `error=<variant>` and the message on stderr (exit 1).
#![forbid(unsafe_code)]

#[allow(dead_code)]
#[path = "../common/host.rs"]
mod host;

use std::io::{Read, Write};
use std::path::PathBuf;

use dirseal_migrate::{self as migrate, Mode, Request, Schedule};
use host::PlainHost;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (op, source, workdir) = match &args[..] {
        [op, s, w, ..] => (op.clone(), PathBuf::from(s), PathBuf::from(w)),
        _ => {
            eprintln!("usage: dirseal-migrate-test-child OP SOURCE WORKDIR [flags]");
            std::process::exit(2);
        }
    };
    let flag = |f: &str| args.iter().any(|a| a == f);
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(std::num::NonZeroUsize::new(2).unwrap());
    let req = Request {
        source: &source,
        workdir: &workdir,
        keep_backup: flag("--keep-backup"),
        wipe: flag("--wipe"),
        force: flag("--force"),
        threads,
        mode: match args.iter().position(|a| a == "--mode").and_then(|i| args.get(i + 1)).map(String::as_str) {
            Some("move") => Mode::Move,
            Some("auto") => Mode::Auto,
            _ => Mode::Copy,
        },
        direction: dirseal_migrate::Direction::Encrypt,
        schedule: if flag("--live") { Schedule::Live } else { Schedule::Now },
    };
    let kill = std::env::var("TEST_KILL").ok();
    let hold = std::env::var("TEST_HOLD").ok();
    let append = std::env::var("TEST_APPEND").ok();
    let host = PlainHost::with(move |e, _| {
        if kill.as_deref().is_some_and(|k| e.matches(k)) {
            let me = rustix::process::getpid();
            let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
        }
        if hold.as_deref().is_some_and(|h| e.matches(h)) {
            let mut out = std::io::stdout();
            let _ = writeln!(out, "holding");
            let _ = out.flush();
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        }
        if let Some((spec, path)) = append.as_deref().and_then(|a| a.split_once('=')) {
            if e.matches(spec) {
                let mut f = std::fs::OpenOptions::new().append(true).open(path).expect("TEST_APPEND path");
                f.write_all(b"+").expect("append");
            }
        }
    });
    let result = match op.as_str() {
        "convert" => migrate::convert(&req, &host),
        "abort" => migrate::abort(&workdir, &host),
        "rollback" => migrate::rollback(&workdir, &host),
        "commit" => migrate::commit(&workdir, &host),
        other => {
            eprintln!("unknown operation {other}");
            std::process::exit(2);
        }
    };
    match result {
        Ok(out) => {
            println!("state={}", out.state);
            // Peak resident memory of the whole run, for the memory test.
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            if let Some(kib) = status.lines().find_map(|l| l.strip_prefix("VmHWM:")) {
                println!("peak_kib={}", kib.trim().trim_end_matches(" kB"));
            }
            println!("links_spilled={}", migrate::links_spilled());
            for n in out.notes {
                println!("note={n}");
            }
        }
        Err(e) => {
            let dbg = format!("{e:?}");
            let variant = dbg.split([' ', '{', '(']).next().unwrap_or_default();
            println!("error={variant}");
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
