//! `dirseal scrub`: overwrite a filesystem's free space, then say plainly what that did and did not
//! reach.
use std::path::Path;
use std::sync::atomic::AtomicBool;

use anyhow::Result;
use indicatif::HumanBytes;

use dirseal::scrub::{self, Medium, Report, Trim};

use super::args::ScrubArgs;
use super::progress::Reporter;
use super::term::clean;

pub fn run(args: ScrubArgs) -> Result<i32> {
    let opts = scrub::Options { reserve: args.reserve, no_trim: args.no_trim };
    scrub_and_report(&args.mountpoint, &opts, super::interrupt::flag(), args.json)
}

/// Scrubs with a progress bar (or JSON lines) and prints the report (JSON: `{"scrub": ...}`);
/// exit code 1 when interrupted.
pub fn scrub_and_report(path: &Path, opts: &scrub::Options, stop: &AtomicBool, json: bool) -> Result<i32> {
    // SIGINT and SIGTERM stop the fill (its file is removed), not the process.
    let _catch = super::interrupt::catching();
    let reporter = Reporter::new(json);
    let result = scrub::scrub(path, opts, stop, &|p| reporter.report(p));
    reporter.finish();
    let r = result?;
    if json {
        println!("{}", serde_json::to_string(&serde_json::json!({ "scrub": &r }))?);
    } else {
        print_report(&r);
    }
    if r.interrupted {
        eprintln!(
            "dirseal: interrupted after {} written; the fill file is gone and the free space is back; run `dirseal scrub {}` again to finish",
            HumanBytes(r.written),
            clean(&r.mount_point.display().to_string())
        );
        return Ok(1);
    }
    Ok(0)
}

/// The closing report: what was overwritten, what was not, and what would reach the rest.
pub fn print_report(r: &Report) {
    let mp = clean(&r.mount_point.display().to_string());
    println!("free space of {mp} ({} on {}):", clean(&r.fstype), clean(&r.device));
    // Distinct space and bytes written are two figures: the sweep rewrites space it released,
    // so what was written can exceed the free space, while what was covered cannot.
    println!(
        "  overwritten:     {} of {} free, held at once with random data, synced, released ({} available again)",
        HumanBytes(r.covered),
        HumanBytes(r.free_before),
        HumanBytes(r.available_after)
    );
    if r.swept > 0 {
        println!(
            "  sweep:           {} more past the fill's end as its start was released, into blocks the allocator set aside",
            HumanBytes(r.swept)
        );
    }
    println!("  written in all:  {}", HumanBytes(r.written));
    let mut left = format!("  not overwritten: {}", HumanBytes(r.unwritten));
    if !r.interrupted {
        left.push_str(&format!(" (the {} safety reserve", HumanBytes(r.reserve)));
        if r.root_reserved > 0 {
            left.push_str(&format!(", {} reserved for root", HumanBytes(r.root_reserved)));
        }
        left.push(')');
    }
    println!("{left}");
    if let Some(why) = &r.stopped_early {
        println!("  stopped early:   {}", clean(why));
    }
    let trim = match &r.trim {
        Trim::Done { bytes } => format!("{} of free blocks passed to the device as discards", HumanBytes(*bytes)),
        Trim::Unsupported => {
            format!("not supported by {}: the device keeps its free blocks as they are", clean(&r.device))
        }
        Trim::Skipped if r.interrupted => "skipped (interrupted)".to_string(),
        Trim::Skipped => "skipped (--no-trim)".to_string(),
        Trim::Failed { reason } => format!("failed: {}", clean(reason)),
    };
    println!("  TRIM:            {trim}");
    if r.interrupted {
        return;
    }
    println!();
    println!("What this reaches:");
    let hdd = "  a hard disk (HDD) overwrites blocks in place: the overwritten free space no longer holds old data.";
    let flash = "  an SSD, NVMe drive, SD card or eMMC writes new data elsewhere and remaps: old data can survive in\n  over-provisioned or retired cells that no program can address, until the drive erases them; TRIM asks it\n  to, but does not guarantee when.";
    match r.medium {
        Medium::Rotational => println!("{hdd}"),
        Medium::SolidState => println!("{flash}"),
        Medium::Loop => {
            println!("  {} is a loop device: its blocks live in a file, so what reaches a disk depends on the filesystem and disk holding that file.", clean(&r.device));
            println!("{hdd}\n{flash}");
        }
        Medium::Unknown => println!("{hdd}\n{flash}"),
    }
    println!("  It does not reach: the filesystem journal and metadata (recent file names and directory blocks),");
    println!("  the space left unwritten above, nor copies elsewhere (swap, backups, snapshots, other partitions).");
    println!("What would: full-disk encryption from the start (LUKS), or a secure erase of the whole device");
    println!("  (`blkdiscard --secure`, `nvme format --ses=1`, `hdparm --security-erase`) followed by a reinstall.");
}

#[cfg(test)]
mod tests {
    use crate::cli::args::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
