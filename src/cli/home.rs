//! `dirseal home create USER`: a new account's home, encrypted before anything is written to it
//! ([`dirseal::home`]). For scripts: `useradd -M USER` then `dirseal home create USER`.

use anyhow::Result;

use dirseal::home::{self, Account, HomeError};
use dirseal::ops::Dirseal;

use super::args::HomeCmd;
use super::term::{clean, TermUi};

pub fn run(ds: &mut Dirseal, cmd: HomeCmd, ui: &mut TermUi) -> Result<i32> {
    let HomeCmd::Create(args) = cmd;
    let acct = Account::named(&args.user)?;
    ui.json = args.json;
    let options = home::Options { skel: args.skel, recovery_key: args.recovery.decided(), ..Default::default() };
    let kind = args.kdf.kind(&args.protector_type)?;
    // The library error itself, not its wrapper, so the CLI's hints find it.
    let made = home::create(ds, &acct, kind, &options, ui).map_err(|e| match e {
        HomeError::Ops(o) => anyhow::Error::from(o),
        e => e.into(),
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&serde_json::json!({ "result": made }))?);
        return Ok(0);
    }
    // The library's notice already said "created HOME for USER, encrypted (policy, protector)"
    // (through the Ui, on stdout): saying it again read as two homes made (issue 44).
    println!(
        "  {} copied from {}{}",
        super::term::entries(made.entries),
        clean(&options.skel.display().to_string()),
        if made.recovery_key { "; a recovery key was made" } else { "" }
    );
    for s in &made.skipped {
        println!("note: not copied (a device, fifo or socket): {}", clean(&s.display().to_string()));
    }
    Ok(0)
}
