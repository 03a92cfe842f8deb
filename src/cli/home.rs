//! `dirseal home create USER`: a new account's home, encrypted before anything is written to it
//! ([`dirseal::home`]). For scripts: `useradd -M USER` then `dirseal home create USER`.
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};

use dirseal::home::{self, Account, HomeError};
use dirseal::ops::Dirseal;
use dirseal::protector;

use super::term::{clean, TermUi};

#[derive(Subcommand)]
pub enum HomeCmd {
    /// Create USER's home (from the passwd entry) encrypted from the start, then copy the skeleton
    /// into it; the home must not exist or be empty (for one that holds data, use `convert`)
    Create(CreateArgs),
}

#[derive(Args)]
pub struct CreateArgs {
    /// The account (it must exist: `useradd -M USER` first)
    user: String,
    /// The skeleton copied into the new home
    #[arg(long, value_name = "DIR", default_value = home::DEFAULT_SKEL)]
    skel: PathBuf,
    /// Kind of the user's new protector (named after them, theirs)
    #[arg(long, alias = "type", default_value = "password", value_parser = clap::builder::PossibleValuesParser::new(protector::KIND_NAMES))]
    protector_type: String,
    #[command(flatten)]
    kdf: super::KdfArgs,
    #[command(flatten)]
    recovery: super::recovery::RecoveryOffer,
    /// Print the result as one JSON object
    #[arg(long)]
    json: bool,
}

pub fn run(ds: &mut Dirseal, cmd: HomeCmd, ui: &mut TermUi) -> Result<i32> {
    let HomeCmd::Create(args) = cmd;
    let acct = Account::named(&args.user)?;
    ui.json = args.json;
    ui.login_user = Some(acct.name.clone());
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
    let h = clean(&made.home.display().to_string());
    println!(
        "created {h} for {}: encrypted (policy {}), protector {} ({}), {} entries from {}",
        clean(&made.user),
        made.policy,
        made.protector,
        clean(&made.user),
        made.entries,
        clean(&options.skel.display().to_string())
    );
    for s in &made.skipped {
        println!("note: not copied (a device, fifo or socket): {}", clean(&s.display().to_string()));
    }
    Ok(0)
}
