//! `dirseal autologin`: a display manager's automatic login onto an encrypted home
//! ([`dirseal::autologin`]). `check` is what `dirseal-autologin.service` runs before the display
//! managers start; `status` says what the next boot does; `clear` is for uninstalling.
use std::path::Path;

use anyhow::Result;

use dirseal::autologin::{self, Status};
use dirseal::ids::ProtectorId;
use dirseal::ops::Dirseal;
use dirseal::secret::Passphrase;
use dirseal::ui::{SecretPrompt, Ui, UiError};

use super::args::AutologinCmd;
use super::term::clean;

/// The check runs unattended: nothing is typed, a security key's touch is waited for (and said).
struct Unattended;

impl Ui for Unattended {
    fn secret(&mut self, _prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        // Never reached: the check tries only protectors that need no typing.
        Err(UiError::Cancelled)
    }
    fn touch(&mut self, name: &str, _id: Option<&ProtectorId>) {
        eprintln!("dirseal: touch the security key of protector {} to log in automatically", clean(name));
    }
}

/// `clear` needs no keystore; the others do (`ds`).
pub fn clear(root: &Path) -> Result<i32> {
    for p in autologin::clear(root)? {
        println!("removed {}", clean(&p.display().to_string()));
    }
    Ok(0)
}

/// `off` needs no keystore either: it is what runs when the check could not.
pub fn off(root: &Path) -> Result<i32> {
    for (list, written) in autologin::turn_off(root)? {
        let files: Vec<String> = written.iter().map(|p| clean(&p.display().to_string())).collect();
        let users: Vec<String> = list.iter().map(|c| clean(&c.user)).collect();
        println!(
            "{}: automatic login of {} off for this boot ({})",
            list[0].manager.name(),
            users.join(", "),
            files.join(", ")
        );
    }
    Ok(0)
}

pub fn run(ds: &Dirseal, cmd: AutologinCmd) -> Result<i32> {
    match cmd {
        AutologinCmd::Check { root, json } => {
            let out = ds.autologin_check(&root, &mut Unattended)?;
            if json {
                super::print_json(&out)?;
                return Ok(0);
            }
            if out.is_empty() {
                println!("no display manager logs anyone in automatically");
            }
            for o in &out {
                let (m, u) = (o.configured.manager.name(), clean(&o.configured.user));
                match o.case {
                    1 => {
                        match &o.opened_with {
                            Some(p) => println!(
                                "{m}: {u}'s home opened with protector {} ({}); autologin proceeds",
                                clean(&p.name),
                                p.id
                            ),
                            None => println!("{m}: {u}'s home is open; autologin proceeds"),
                        }
                        if !o.written.is_empty() {
                            println!("  relogin after a logout is off for this boot: a logout locks the home");
                        }
                    }
                    2 => {
                        let files: Vec<String> = o.written.iter().map(|p| clean(&p.display().to_string())).collect();
                        println!(
                            "{m}: {u}'s home is encrypted and nothing opens it without typing: autologin is off for this boot, the greeter asks ({})",
                            files.join(", ")
                        );
                        for p in &o.problems {
                            println!("  {}", clean(p));
                        }
                    }
                    _ => println!("{m}: {u}'s home is not encrypted by dirseal; autologin as configured"),
                }
            }
            Ok(0)
        }
        AutologinCmd::Status { root, json } => {
            let list = ds.autologin_status(&root)?;
            if json {
                super::print_json(&list)?;
            } else {
                print_status(&list);
            }
            Ok(0)
        }
        AutologinCmd::Clear { root } => clear(&root),
        AutologinCmd::Off { root } => off(&root),
    }
}

/// The overview's lines about autologins (also `dirseal status`).
pub fn print_status(list: &[Status]) {
    if list.is_empty() {
        println!("autologin: none configured");
    }
    for s in list {
        let c = &s.configured;
        println!(
            "autologin: {} logs in {} ({}){}",
            c.manager.name(),
            clean(&c.user),
            clean(&c.file.display().to_string()),
            if s.greeter_now { "; off for this boot (the greeter asks)" } else { "" }
        );
        println!("  next boot: {}", clean(&s.next_boot_text));
    }
}
