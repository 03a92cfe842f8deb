//! What the system's password database says about an account, for logins that do not go
//! through `pam_unix` (a security key's touch, a TPM PIN) and for the PIN-login accounts
//! (docs/pam.md): whether the password is locked or expired, whether /etc/shadow holds a hash
//! (something anyone with the disk can test guesses against, offline and without limit), and
//! whether a secret is the account's login password.
use std::process::Command;

use subtle::ConstantTimeEq;

use crate::secret::Passphrase;
use crate::sys::shadow;

/// The login name of `uid`, if the passwd database has one.
pub fn login_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten().map(|u| u.name)
}

/// How every message and every new protector names `uid`'s account: its login name, or "uid N"
/// for a uid without a passwd entry (from another system, a container: still someone, and never a
/// misleading kind name such as "password").
pub fn user_name(uid: u32) -> String {
    login_name(uid).unwrap_or_else(|| format!("uid {uid}"))
}

/// A shadow entry, without its hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shadow {
    /// The first byte of the hash field (`!` = locked by `passwd -l`/`usermod -L`, `*` = no
    /// password); `None` when the field is empty.
    pub hash_first: Option<u8>,
    /// The field holds a crypt hash, possibly behind the lock mark `!`.
    pub(crate) has_hash: bool,
    /// Days since 1970 of the last change (0 = must change at next login), -1 if unset.
    pub last_change: i64,
    /// Days a password stays valid after `last_change`, -1 if unset.
    pub max_days: i64,
    /// Day (since 1970) the account expires, -1 if never.
    pub expire: i64,
}

/// A hash field's hash, without the lock marks in front of it; empty when it holds none
/// (`*`, `!`, `!*`, nothing).
fn hash_part(field: &[u8]) -> &[u8] {
    let start = field.iter().position(|b| *b != b'!').unwrap_or(field.len());
    let rest = &field[start..];
    if rest.first() == Some(&b'*') {
        &[]
    } else {
        rest
    }
}

/// The shadow entry of `user` (`getspnam_r`); `Ok(None)` if there is none. Needs root.
pub fn shadow(user: &str) -> Result<Option<Shadow>, std::io::Error> {
    Ok(shadow::getspnam(user)?.map(|sp| Shadow {
        hash_first: sp.hash.first().copied(),
        has_hash: !hash_part(&sp.hash).is_empty(),
        last_change: sp.last_change,
        max_days: sp.max_days,
        expire: sp.expire,
    }))
}

/// Whether `user` has a login password /etc/shadow can test (a hash, locked or not). Needs root.
pub fn has_password(user: &str) -> Result<bool, std::io::Error> {
    Ok(shadow(user)?.is_some_and(|s| s.has_hash))
}

/// Whether `secret` is `user`'s login password as /etc/shadow holds it (also behind a lock
/// mark: the hash is as testable locked as unlocked). Needs root.
pub fn password_is(user: &str, secret: &Passphrase) -> Result<bool, std::io::Error> {
    let Some(sp) = shadow::getspnam(user)? else { return Ok(false) };
    let hash = hash_part(&sp.hash);
    if hash.is_empty() {
        return Ok(false);
    }
    Ok(shadow::crypt(secret.as_bytes(), hash).is_some_and(|h| bool::from(h.as_slice().ct_eq(hash))))
}

/// Why an account's shadow entry could not be changed.
#[derive(Debug, thiserror::Error)]
#[error("cannot change the password entry of {user}: {reason}")]
pub struct AccountError {
    pub(crate) user: String,
    pub(crate) reason: String,
}

/// Replaces `user`'s password hash by `*`: no password opens the account any more and none can
/// be tested offline. `usermod -L` still locks it (`!*`). Done by `usermod`, which keeps
/// /etc/shadow's locking and backup conventions.
pub(crate) fn remove_password(user: &str) -> Result<(), AccountError> {
    let err = |reason: String| AccountError { user: user.into(), reason };
    let o = Command::new("usermod").args(["-p", "*", "--", user]).output().map_err(|e| err(format!("usermod: {e}")))?;
    if !o.status.success() {
        return Err(err(format!("usermod: {}", String::from_utf8_lossy(&o.stderr).trim())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::hash_part;

    #[test]
    fn lock_marks_and_no_password_marks_hold_no_hash() {
        assert_eq!(hash_part(b"$y$j9T$salt$hash"), b"$y$j9T$salt$hash");
        assert_eq!(hash_part(b"!$y$j9T$salt$hash"), b"$y$j9T$salt$hash");
        assert_eq!(hash_part(b"!!$6$x$y"), b"$6$x$y");
        for none in [&b"*"[..], b"!*", b"!", b"", b"*LK*"] {
            assert!(hash_part(none).is_empty(), "{none:?}");
        }
    }
}
