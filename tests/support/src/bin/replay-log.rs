//! Replays a dm-log-writes log (see `dirseal_testfs::logwrites`); used by the power-cut test in the VM.
//!
//!   replay-log list LOG              one line per entry: index, flags, sector, sectors, mark
//!   replay-log replay LOG DEV FROM TO  applies entries FROM..TO (TO exclusive) onto DEV
use std::fs::{File, OpenOptions};
use std::process::ExitCode;

use dirseal_testfs::logwrites::Log;

fn run(args: &[String]) -> Result<(), String> {
    let open = |p: &str| {
        File::open(p).map_err(|e| format!("{p}: {e}")).and_then(|f| Log::open(f).map_err(|e| format!("{p}: {e}")))
    };
    let num = |s: &str| s.parse::<u64>().map_err(|_| format!("not an entry index: {s}"));
    match args {
        [cmd, log] if cmd == "list" => {
            let log = open(log)?;
            for e in &log.entries {
                println!("{} {} {} {} {}", e.index, e.flags, e.sector, e.nr_sectors, e.mark.as_deref().unwrap_or("-"));
            }
            Ok(())
        }
        [cmd, log, dev, from, to] if cmd == "replay" => {
            let log = open(log)?;
            let dev = OpenOptions::new().write(true).open(dev).map_err(|e| format!("{dev}: {e}"))?;
            log.replay(&dev, num(from)?, num(to)?).map_err(|e| format!("replay: {e}"))?;
            dev.sync_all().map_err(|e| format!("sync: {e}"))
        }
        _ => Err("usage: replay-log list LOG | replay-log replay LOG DEV FROM TO".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replay-log: {e}");
            ExitCode::FAILURE
        }
    }
}
