//! `dirseal tpm2 status|setup|reset-lockout`: the TPM's dictionary-attack protection, which is
//! what makes a short TPM PIN safe.
use anyhow::{bail, Result};
use clap::Subcommand;
use serde::Serialize;

use dirseal::config::Config;
use dirseal::tpm2::{self, human_secs, DaParameters, DaStatus, Tcti, Tpm};

use super::print_json;

#[derive(Subcommand)]
pub enum Tpm2Cmd {
    /// Is there a TPM, and how many wrong PINs may still be tried before it locks out?
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Set the dictionary-attack parameters (options not given keep their current value)
    Setup {
        /// Wrong PINs (across all TPM protectors) before the TPM locks out
        #[arg(long, value_name = "N")]
        max_tries: Option<u32>,
        /// Seconds after which the TPM forgives one wrong PIN (0: never, only a reset)
        #[arg(long, value_name = "S")]
        recovery_time: Option<u32>,
        /// Seconds the lockout hierarchy stays blocked after a wrong lockout password
        #[arg(long, value_name = "S")]
        lockout_recovery: Option<u32>,
    },
    /// Forget every counted wrong PIN now (needs the TPM's lockout hierarchy, which has no password)
    ResetLockout,
}

#[derive(Serialize)]
struct StatusOut {
    tcti: Tcti,
    present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    da: Option<DaStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tries_left: Option<u32>,
    min_local_tries: u32,
}

fn status(config: &Config) -> StatusOut {
    let tcti = config.tpm2.tcti();
    let da = Tpm::open(&tcti).and_then(|mut t| t.da_status());
    let (da, error) = match da {
        Ok(d) => (Some(d), None),
        Err(e) => (None, Some(e.to_string())),
    };
    StatusOut {
        present: da.is_some(),
        tries_left: da.map(|d| d.tries_left()),
        da,
        error,
        tcti,
        min_local_tries: config.tpm2.min_local_tries(),
    }
}

fn print_status(s: &StatusOut) {
    println!("TPM at {}", s.tcti);
    let Some(d) = &s.da else {
        println!("  present:           no ({})", s.error.as_deref().unwrap_or("unknown error"));
        println!("  set tpm2.tcti in the config if the TPM is elsewhere");
        return;
    };
    println!("  present:           yes");
    println!("  tries left:        {} of {}", d.tries_left(), d.max_tries);
    println!("  failures counted:  {}", d.lockout_counter);
    let forgive = if d.recovery_time_s == 0 {
        "never (only `dirseal tpm2 reset-lockout`)".to_string()
    } else {
        format!("one every {} while powered on", human_secs(d.recovery_time_s))
    };
    println!("  forgives:          {forgive}");
    println!("  lockout recovery:  {}", human_secs(d.lockout_recovery_s));
    if d.in_lockout {
        println!("  in lockout:        yes: no PIN is tried until a failure is forgiven");
    } else {
        println!("  in lockout:        no");
    }
    if d.lockout_auth_set {
        println!("  lockout password:  set (dirseal cannot change these parameters; use tpm2_dictionarylockout)");
    }
    println!("  network logins:    refused while fewer than {} tries are left", s.min_local_tries);
}

pub fn run(config: &Config, cmd: Tpm2Cmd) -> Result<i32> {
    match cmd {
        Tpm2Cmd::Status { json } => {
            let s = status(config);
            if json {
                print_json(&s)?;
            } else {
                print_status(&s);
            }
        }
        Tpm2Cmd::Setup { max_tries, recovery_time, lockout_recovery } => {
            if max_tries.is_none() && recovery_time.is_none() && lockout_recovery.is_none() {
                bail!("nothing to set: give --max-tries, --recovery-time and/or --lockout-recovery");
            }
            if max_tries == Some(0) {
                bail!("--max-tries 0 would lock every TPM PIN out at once; give at least 1");
            }
            let tcti = config.tpm2.tcti();
            let cur = Tpm::open(&tcti)?.da_status()?;
            let p = DaParameters {
                max_tries: max_tries.unwrap_or(cur.max_tries),
                recovery_time_s: recovery_time.unwrap_or(cur.recovery_time_s),
                lockout_recovery_s: lockout_recovery.unwrap_or(cur.lockout_recovery_s),
            };
            tpm2::set_da_parameters(&tcti, p)?;
            println!(
                "TPM dictionary-attack protection: {} tries, one forgiven every {}, lockout recovery {}",
                p.max_tries,
                human_secs(p.recovery_time_s),
                human_secs(p.lockout_recovery_s)
            );
        }
        Tpm2Cmd::ResetLockout => {
            tpm2::reset_lockout(&config.tpm2.tcti())?;
            println!("the TPM forgot every counted wrong PIN");
        }
    }
    Ok(0)
}
