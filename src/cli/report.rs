//! `dirseal report [--json]`: what a fleet agent collects (dirseal::report), as text or JSON.
use anyhow::Result;

use dirseal::escrow::RecordStatus;
use dirseal::ops::Dirseal;
use dirseal::report::{self, Report};

use super::{clean, print_json};

pub fn run(ds: &Dirseal, json: bool) -> Result<i32> {
    let r = report::report(ds)?;
    if json {
        print_json(&r)?;
    } else {
        print(&r);
    }
    Ok(0)
}

fn print(r: &Report) {
    println!("dirseal {} on {}", r.product_version, clean(&r.host));
    match &r.escrow {
        Some(e) => println!(
            "escrow: to {} in {}{}",
            e.recipients.join(", "),
            clean(&e.dir.display().to_string()),
            if e.required { " (required)" } else { "" }
        ),
        None => println!("escrow: none configured"),
    }
    if r.directories.is_empty() {
        println!("no encrypted directories");
    }
    for d in &r.directories {
        let path = d.path.as_ref().map_or_else(|| "(unknown path)".into(), |p| clean(&p.display().to_string()));
        let owner = d.owner.clone().or_else(|| d.owner_uid.map(|u| format!("uid {u}"))).unwrap_or_else(|| "-".into());
        println!("{path}  {}  owner {}  protectors: {}", d.state, clean(&owner), d.protector_kinds.join(", "));
        let recovery = match d.recovery_key {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown (not present)",
        };
        let escrow = match &d.escrow {
            None => String::new(),
            Some(RecordStatus::Current { recipients, .. }) => format!(", escrowed to {}", recipients.join(", ")),
            Some(RecordStatus::Missing) => ", not escrowed".into(),
            Some(RecordStatus::OtherRecipients { recipients }) => {
                format!(", escrowed to other recipients ({})", recipients.join(", "))
            }
            Some(RecordStatus::Damaged { reason }) => format!(", escrow record damaged: {}", clean(reason)),
        };
        println!("    policy {}  recovery key: {recovery}{escrow}", d.policy);
    }
    let t = &r.tpm;
    if t.present {
        println!(
            "TPM at {}: lockout owned: {}, tries left: {} of {}{}",
            t.tcti,
            if t.lockout_owned == Some(true) { "yes" } else { "no" },
            t.tries_left.unwrap_or(0),
            t.max_tries.unwrap_or(0),
            if t.in_lockout == Some(true) { ", IN LOCKOUT" } else { "" }
        );
    } else {
        println!("TPM at {}: none ({})", t.tcti, clean(t.reason.as_deref().unwrap_or("not found")));
    }
    for d in &r.portable_directories {
        println!(
            "portable {}: {} on {} ({} protectors)",
            clean(&d.path_hint.as_ref().map_or("(path not recorded)".into(), |h| h.display().to_string())),
            d.key.unwrap_or("unknown"),
            clean(&d.records.display().to_string()),
            d.protectors.len()
        );
    }
    for u in &r.unfinished_conversions {
        println!(
            "unfinished {}: {} ({}{})",
            if u.direction == "decrypt" { "decrypt" } else { "conversion" },
            clean(&u.path.display().to_string()),
            u.state,
            if u.running { ", running" } else { "" }
        );
    }
    for p in &r.problems {
        println!("problem: {}", clean(p));
    }
}
