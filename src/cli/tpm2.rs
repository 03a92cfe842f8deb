//! `dirseal tpm2 status|setup|reset-lockout`: the TPM's dictionary-attack protection, which is
//! what makes a short TPM PIN safe.
use anyhow::{bail, Result};
use serde::Serialize;

use dirseal::config::Config;
use dirseal::secret::Passphrase;
use dirseal::tpm2::{self, human_secs, DaParameters, DaStatus, ResetCode, Tcti, Tpm, Tpm2Error, SETUP_DEFAULTS};

use super::args::Tpm2Cmd;
use super::print_json;
use super::term;

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
        // The way out now, not only the wait: with the reset code, reset-lockout ends it at once.
        println!("  in lockout:        yes: no PIN is tried until a failure is forgiven,");
        if d.lockout_owned {
            println!("                     or `dirseal tpm2 reset-lockout` with the TPM reset code ends it now");
        } else {
            println!("                     or `dirseal tpm2 reset-lockout` ends it now");
        }
    } else {
        println!("  in lockout:        no");
    }
    if d.lockout_owned {
        println!("  lockout owned:     yes: only the TPM reset code resets the count of wrong PINs");
    } else {
        println!("  lockout owned:     no: anyone can reset the count of wrong PINs, so PINs are not protected;");
        println!("                     run `dirseal tpm2 setup`");
    }
    println!("  kept for the device: the last {} tries (not spent from the network or D-Bus)", s.min_local_tries);
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
        Tpm2Cmd::Setup { max_tries, recovery_time, lockout_recovery, yes } => {
            if max_tries == Some(0) {
                bail!("--max-tries 0 would lock every TPM PIN out at once; give at least 1");
            }
            let tcti = config.tpm2.tcti();
            let cur = Tpm::open(&tcti)?.da_status()?;
            let given = max_tries.is_some() || recovery_time.is_some() || lockout_recovery.is_some();
            if cur.lockout_owned && !given {
                println!("{}", Tpm2Error::LockoutOwned);
                return Ok(0);
            }
            let base = if cur.lockout_owned {
                DaParameters {
                    max_tries: cur.max_tries,
                    recovery_time_s: cur.recovery_time_s,
                    lockout_recovery_s: cur.lockout_recovery_s,
                }
            } else {
                SETUP_DEFAULTS
            };
            let p = DaParameters {
                max_tries: max_tries.unwrap_or(base.max_tries),
                recovery_time_s: recovery_time.unwrap_or(base.recovery_time_s),
                lockout_recovery_s: lockout_recovery.unwrap_or(base.lockout_recovery_s),
            };
            if cur.lockout_owned {
                let code = read_code()?;
                tpm2::set_da_parameters(&tcti, &code, p)?;
            } else {
                let code = ResetCode::generate();
                show_code(&code, yes)?;
                tpm2::setup(&tcti, p, &code)?;
                println!("The TPM's lockout is now owned: only this reset code undoes wrong PINs.");
            }
            println!(
                "TPM dictionary-attack protection: {} tries, one forgiven every {}, lockout recovery {}",
                p.max_tries,
                human_secs(p.recovery_time_s),
                human_secs(p.lockout_recovery_s)
            );
        }
        Tpm2Cmd::ResetLockout => {
            let tcti = config.tpm2.tcti();
            if Tpm::open(&tcti)?.da_status()?.lockout_owned {
                tpm2::reset_lockout(&tcti, Some(&read_code()?))?;
            } else {
                tpm2::reset_lockout(&tcti, None)?;
                eprintln!("warning: {}; run `dirseal tpm2 setup`", Tpm2Error::LockoutNotOwned);
            }
            println!("the TPM forgot every counted wrong PIN");
        }
    }
    Ok(0)
}

/// Shows a new reset code; unless `yes`, has it typed back (a miswritten copy is caught now,
/// before it becomes the only way to reset the TPM's lockout).
fn show_code(code: &ResetCode, yes: bool) -> Result<()> {
    println!(
        "TPM reset code — write it down and keep it away from the device; it is shown only once:\n\n    {}\n\n\
         It resets the TPM's count of wrong PINs. Without it, wrong PINs are only forgotten with time.\n",
        &*code.to_display()
    );
    if yes {
        return Ok(());
    }
    for _ in 0..3 {
        let typed = match term::ask("Type the TPM reset code back to confirm: ") {
            Ok(t) => t,
            Err(e) => bail!(
                "{e}; the TPM reset code was not confirmed, nothing changed (pass --yes to skip the confirmation)"
            ),
        };
        match ResetCode::parse(&typed) {
            Ok(c) if c == *code => return Ok(()),
            Ok(_) => eprintln!("that is a valid code, but not this one; check what you wrote"),
            Err(e) => eprintln!("{e}"),
        }
    }
    bail!("the TPM reset code was not confirmed; nothing changed (pass --yes to skip the confirmation)")
}

/// The reset code, asked on the terminal or read as one line from stdin.
fn read_code() -> Result<ResetCode> {
    let typed: Passphrase = term::ask("TPM reset code: ")?;
    Ok(ResetCode::parse(&typed)?)
}
