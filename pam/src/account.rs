//! The rule for protectors that will log users in on their own (TPM2 PIN, FIDO2 touch: a
//! `sufficient` line before `pam_unix`, docs/pam.md): the password database still has the last
//! word on the account. A password locked by `passwd -l`/`usermod -L`, an account past its
//! expiry date, or a password past its maximum age (or flagged "change at next login") refuses
//! such a login, exactly as `pam_unix` would refuse the password. Read from shadow directly
//! (`getspnam_r`) rather than left to the account stack: `pam_unix`'s account check does not
//! look at the lock mark, and a `sufficient` success skips the rest of the auth stack.
//!
//! A PIN-login account (docs/pam.md) has `*` for a password: no password opens it, which is no
//! lock. `usermod -L` / `passwd -l` make that `!*`, which is.

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0} has no shadow entry, so its status cannot be checked")]
    NoEntry(String),
    #[error("the password of {0} is locked (passwd -l / usermod -L)")]
    Locked(String),
    #[error("the account {0} has expired")]
    AccountExpired(String),
    #[error("the password of {0} has expired and must be changed first")]
    PasswordExpired(String),
    #[error("cannot read the shadow entry of {0}: {1}")]
    Unreadable(String, String),
}

/// Days since 1970, as shadow counts them.
fn today() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() / 86_400).unwrap_or(0) as i64
}

/// Whether `user` may be logged in by one of their own protectors without a password check.
pub fn standalone_login_allowed(user: &str) -> Result<(), Refusal> {
    login_allowed(user, false)
}

/// [`standalone_login_allowed`] for a PIN-login account: `*` (no password) is not a lock.
pub fn pin_login_allowed(user: &str) -> Result<(), Refusal> {
    login_allowed(user, true)
}

fn login_allowed(user: &str, pin_account: bool) -> Result<(), Refusal> {
    let sp = match dirseal::account::shadow(user) {
        Ok(Some(sp)) => sp,
        Ok(None) => return Err(Refusal::NoEntry(user.into())),
        Err(e) => return Err(Refusal::Unreadable(user.into(), e.to_string())),
    };
    let day = today();
    let locked = match sp.hash_first {
        Some(b'!') => true,
        Some(b'*') => !pin_account,
        _ => false,
    };
    if locked {
        return Err(Refusal::Locked(user.into()));
    }
    if sp.expire >= 0 && day >= sp.expire {
        return Err(Refusal::AccountExpired(user.into()));
    }
    let aged = sp.max_days >= 0 && sp.last_change > 0 && day > sp.last_change.saturating_add(sp.max_days);
    if sp.last_change == 0 || aged {
        return Err(Refusal::PasswordExpired(user.into()));
    }
    Ok(())
}
