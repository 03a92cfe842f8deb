//! The PAM module's rendering of a library error's [`Remedy`]: a log line for the administrator
//! who reads the system log, so it names the dirseal command that fixes it. Which errors have
//! which remedy is the library's decision (dirseal::remedy).
use dirseal::remedy::{HasRemedy, Remedy};

/// `e`'s message, and the fix if the library knows one: what the module logs for a library error.
pub(crate) fn why(e: &dyn HasRemedy) -> String {
    match Remedy::find(e) {
        Some(r) => format!("{e} (fix: {})", fix(&r)),
        None => e.to_string(),
    }
}

/// A remedy as the administrator's command.
fn fix(r: &Remedy) -> String {
    match r {
        Remedy::EncryptOrConvert { dir } | Remedy::Convert { dir } => format!("`dirseal convert {}`", dir.display()),
        Remedy::Force => "`dirseal convert --force` while nothing writes there".into(),
        Remedy::AbortConversion { dir } => format!("`dirseal convert --abort {}`", dir.display()),
        Remedy::PickProtector => "name one with `--protector`".into(),
        Remedy::UseAnotherProtector { dir, others, recovery } => {
            let mut ways: Vec<String> = others.iter().map(|o| format!("protector {} ({})", o.id, o.name)).collect();
            if *recovery {
                ways.push("its recovery key".into());
            }
            format!("`dirseal unlock {}` with {}", dir.display(), ways.join(" or "))
        }
        Remedy::UseRecoveryKey => "`dirseal unlock --recovery DIR`".into(),
        Remedy::RestorePolicy { dir } => match dir {
            Some(d) => format!("`dirseal recovery restore {}` with its recovery key", d.display()),
            None => "`dirseal recovery restore DIR` with the directory's recovery key".into(),
        },
        Remedy::ShowStatus { dir } => format!("see `dirseal status {}`", dir.display()),
        Remedy::AddProtector => "`dirseal policy add-protector`".into(),
        Remedy::RemoveFromPolicies => "`dirseal policy remove-protector`".into(),
        Remedy::ListExisting => "see `dirseal protector list` and `dirseal policy list`".into(),
        Remedy::Unlock { dir } => format!("`dirseal unlock {}`", dir.display()),
        Remedy::AddRecoveryKey { dir } => format!("`dirseal recovery add {}` while it is unlocked", dir.display()),
        Remedy::RemoveRecoveryKey { dir } => format!("`dirseal recovery remove {}`", dir.display()),
        Remedy::ReplaceRecoveryKey { dir } => {
            let p = dir.display();
            format!("`dirseal recovery remove {p}`, then `dirseal recovery add {p}`")
        }
        Remedy::PinLoginAccount { user } => format!("another PIN, or `dirseal pin-login enable {user}`"),
        Remedy::CreatePinProtector { user, home } => {
            format!("`dirseal policy add-protector {} --protector-type tpm2 --user {user}`", home.display())
        }
        Remedy::SetUpTpm => "`dirseal tpm2 setup`".into(),
        Remedy::WaitForTpm => "see `dirseal tpm2 status`".into(),
        Remedy::ListSecurityKeys => "see `dirseal fido2 list`".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every remedy comes out as a dirseal command for the log's reader, on one line.
    #[test]
    fn every_remedy_names_a_command() {
        for r in Remedy::examples() {
            let text = fix(&r);
            assert!(text.contains('`') && !text.contains('\n'), "{r:?}: {text}");
        }
    }

    #[test]
    fn a_library_error_is_logged_with_its_fix() {
        let e = dirseal::ops::OpsError::NoProtector { what: "/home/a".into() };
        assert_eq!(why(&e), "/home/a has no usable protector (fix: `dirseal policy add-protector`)");
        let e = dirseal::ops::OpsError::NoSuchUser("x".into());
        assert_eq!(why(&e), e.to_string());
    }
}
