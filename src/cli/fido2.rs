//! `dirseal fido2 list`: the connected security keys, as `--device` names them.
use anyhow::Result;

use dirseal::config::Config;
use dirseal::fido2;

use super::args::Fido2Cmd;
use super::{clean, print_json};

pub fn run(config: &Config, cmd: Fido2Cmd) -> Result<i32> {
    match cmd {
        Fido2Cmd::List { json } => {
            let keys = fido2::list(&config.fido2)?;
            if json {
                print_json(&keys)?;
                return Ok(0);
            }
            if keys.is_empty() {
                println!("no security key connected");
            }
            for k in &keys {
                println!("{}  {}", clean(&k.path), clean(&k.product));
                match (&k.info, &k.error) {
                    (Some(i), _) => {
                        let opt = |n: &str| match i.option(n) {
                            Some(true) => "yes",
                            Some(false) => "not set",
                            None => "no",
                        };
                        println!(
                            "    hmac-secret: {}  PIN: {}  built-in verification: {}  versions: {}",
                            if i.hmac_secret() { "yes" } else { "no (cannot hold a protector)" },
                            opt("clientPin"),
                            opt("uv"),
                            i.versions.join(", ")
                        );
                    }
                    (None, Some(e)) => println!("    cannot be used: {}", clean(e)),
                    (None, None) => {}
                }
            }
            Ok(0)
        }
    }
}
