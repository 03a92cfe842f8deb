//! The CLI's rendering of a library error's [`Remedy`]: the commands and flags that are the next
//! step. Which errors have which remedy is the library's decision (dirseal::remedy); this file
//! only words them.
use std::path::PathBuf;

use dirseal::remedy::Remedy;

use super::args::{Cmd, PolicyCmd, RecoveryCmd};

/// What the command line knows that an error may not: the directory the command is about (a
/// hint names it, not `DIR`), and the flag that picks the protector proving access (`--with` for
/// `policy add-protector`, whose `--protector` is the one to add).
pub struct Context {
    pub dir: Option<PathBuf>,
    pub pick: &'static str,
}

impl Default for Context {
    fn default() -> Context {
        Context { dir: None, pick: "--protector" }
    }
}

impl Context {
    pub fn of(cmd: &Cmd) -> Context {
        let dir = match cmd {
            Cmd::Status { dir, .. } => dir.clone(),
            Cmd::Encrypt { dir, .. }
            | Cmd::Unlock { dir, .. }
            | Cmd::Lock { dir, .. }
            | Cmd::ChangePassword { dir, .. }
            | Cmd::Recovery(
                RecoveryCmd::Add { dir, .. }
                | RecoveryCmd::Verify { dir }
                | RecoveryCmd::Remove { dir }
                | RecoveryCmd::Restore { dir, .. },
            ) => Some(dir.clone()),
            Cmd::Convert(a) => a.dir.clone(),
            Cmd::Decrypt(a) => Some(a.dir.clone()),
            Cmd::Policy(PolicyCmd::AddProtector { target, .. } | PolicyCmd::RemoveProtector { target, .. }) => {
                target.dir.clone()
            }
            _ => None,
        };
        let pick = if matches!(cmd, Cmd::Policy(PolicyCmd::AddProtector { .. })) { "--with" } else { "--protector" };
        Context { dir, pick }
    }

    /// The directory as a command line takes it, else `DIR`.
    fn dir(&self) -> String {
        self.dir.as_deref().map_or_else(|| "DIR".to_string(), |d| d.display().to_string())
    }
}

/// The hint for the first error in `e`'s chain that has a remedy.
pub fn hint(e: &anyhow::Error, ctx: &Context) -> Option<String> {
    e.chain().find_map(Remedy::of).map(|r| render(&r, ctx))
}

/// A remedy as dirseal commands; where the remedy names no directory, the command's own.
pub fn render(r: &Remedy, ctx: &Context) -> String {
    match r {
        Remedy::EncryptOrConvert { dir } => {
            let p = dir.display();
            format!("encrypt an empty directory with `dirseal encrypt {p}`, or one that holds data with `dirseal convert {p}`")
        }
        Remedy::Convert { dir } => format!("encrypt it in place with `dirseal convert {}`", dir.display()),
        Remedy::Force => "if you are sure nothing writes there, pass --force to convert anyway".into(),
        Remedy::AbortConversion { dir } => format!("run `dirseal convert --abort {}`", dir.display()),
        Remedy::PickProtector => format!("pick one with {} NAME or ID", ctx.pick),
        Remedy::UseAnotherProtector { dir, others, recovery } => {
            let d = dir.display();
            let mut ways: Vec<String> =
                others.iter().map(|o| format!("`dirseal unlock {d} --protector {}` ({})", o.id, o.name)).collect();
            if *recovery {
                ways.push(format!("`dirseal unlock --recovery {d}`"));
            }
            format!("unlock it with {}", ways.join(" or "))
        }
        Remedy::UseRecoveryKey => {
            format!("forgotten? a directory's recovery key opens it: `dirseal unlock --recovery {}`", ctx.dir())
        }
        Remedy::RestorePolicy { dir: Some(dir) } => {
            format!("if you have its recovery key, run `dirseal recovery restore {}`", dir.display())
        }
        Remedy::RestorePolicy { dir: None } => match &ctx.dir {
            Some(d) => format!("if you have its recovery key, run `dirseal recovery restore {}`", d.display()),
            None => {
                "for a directory's policy, `dirseal recovery restore DIR` re-creates it from the recovery key".into()
            }
        },
        Remedy::ShowStatus { dir } => format!("see `dirseal status {}`", dir.display()),
        Remedy::AddProtector => "see `dirseal status` and add one with `dirseal policy add-protector`".into(),
        Remedy::RemoveFromPolicies => "remove it with `dirseal policy remove-protector`".into(),
        Remedy::ListExisting => "`dirseal protector list` and `dirseal policy list` show what exists".into(),
        Remedy::Unlock { dir } => format!("run `dirseal unlock {}` first", dir.display()),
        Remedy::AddRecoveryKey { dir } => {
            format!("while it is unlocked, create one with `dirseal recovery add {}`", dir.display())
        }
        Remedy::RemoveRecoveryKey { dir } => format!("remove it with `dirseal recovery remove {}`", dir.display()),
        Remedy::ReplaceRecoveryKey { dir } => {
            let p = dir.display();
            format!("replace it: `dirseal recovery remove {p}`, then `dirseal recovery add {p}`")
        }
        Remedy::PinLoginAccount { user } => format!(
            "choose another PIN; or keep it and make {user} a PIN-login account: create the protector with \
             --allow-password-pin, then `dirseal pin-login enable {user}` removes the password hash"
        ),
        Remedy::CreatePinProtector { user, home } => {
            format!("`dirseal policy add-protector {} --protector-type tpm2 --user {user}` adds one", home.display())
        }
        Remedy::SetUpTpm => "run `dirseal tpm2 setup` first (it shows a TPM reset code to write down), or pass \
                             --no-pin for a protector without PIN"
            .into(),
        Remedy::WaitForTpm => "`dirseal tpm2 status` shows when the TPM forgives failures without the code".into(),
        Remedy::ListSecurityKeys => "`dirseal fido2 list` shows the connected security keys".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every remedy comes out as a command line or flag of this CLI.
    #[test]
    fn every_remedy_names_a_command_or_flag() {
        for r in Remedy::examples() {
            let text = render(&r, &Context::default());
            assert!(text.contains("`dirseal ") || text.contains(" --"), "{r:?}: {text}");
        }
    }

    #[test]
    fn another_protector_and_the_recovery_key() {
        let [_, _, _, _, _, both, only_other, only_recovery, ..] = &Remedy::examples()[..] else { panic!() };
        let render = |r| render(r, &Context::default());
        assert_eq!(
            render(both),
            "unlock it with `dirseal unlock /home/alice --protector 123456789abcdef0` (pw) or \
             `dirseal unlock --recovery /home/alice`"
        );
        assert_eq!(render(only_other), "unlock it with `dirseal unlock /home/alice --protector 123456789abcdef0` (pw)");
        assert_eq!(render(only_recovery), "unlock it with `dirseal unlock --recovery /home/alice`");
    }

    /// The library decides which error has which remedy; the hint follows the chain to it.
    #[test]
    fn found_along_the_chain() {
        let e =
            anyhow::Error::new(dirseal::ops::OpsError::AmbiguousProtector { what: "d".into(), list: "a, b".into() })
                .context("unlocking");
        assert_eq!(hint(&e, &Context::default()).as_deref(), Some("pick one with --protector NAME or ID"));
        assert_eq!(hint(&anyhow::anyhow!("plain"), &Context::default()), None);
    }

    /// Issue 44: the hints of `policy add-protector` name `--with` (its `--protector` is the one to
    /// add), and a hint names the command's directory instead of `DIR`.
    #[test]
    fn hints_follow_the_command() {
        use clap::Parser;
        let ctx = |args: &[&str]| Context::of(&super::super::args::Cli::parse_from(args).cmd);
        let add = ctx(&["dirseal", "policy", "add-protector", "/srv/d", "--protector-name", "x"]);
        assert_eq!(render(&Remedy::PickProtector, &add), "pick one with --with NAME or ID");
        let unlock = ctx(&["dirseal", "unlock", "/home/alice"]);
        assert_eq!(render(&Remedy::PickProtector, &unlock), "pick one with --protector NAME or ID");
        assert_eq!(
            render(&Remedy::UseRecoveryKey, &unlock),
            "forgotten? a directory's recovery key opens it: `dirseal unlock --recovery /home/alice`"
        );
        assert!(render(&Remedy::RestorePolicy { dir: None }, &unlock).contains("recovery restore /home/alice`"));
        let verify = ctx(&["dirseal", "protector", "verify", "o"]);
        assert!(render(&Remedy::UseRecoveryKey, &verify).contains("--recovery DIR`"));
    }
}
