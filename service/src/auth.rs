//! Who is calling, and what they may touch. The caller's uid comes from the bus daemon (the
//! credentials of the message's sender), never from an argument. Root may do anything; any other
//! user may act only on directories they own and on protectors whose uid is theirs — unless
//! polkit grants them [`MANAGE_ACTION`] for the call, which then goes on as root's would.
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dirseal::keystore::ProtectorRecord;
use dirseal::presence::Presence;
use zbus::message::Header;
use zbus::zvariant::Value;
use zbus::Connection;

use crate::error::{Error, Result};

/// The polkit action (data/polkit-1/actions/) for acting on what is not the caller's own.
pub const MANAGE_ACTION: &str = "org.dirseal.Dirseal1.manage";

/// The polkit action a user needs to decrypt a directory of their own (`Decrypt`): it removes
/// the encryption an administrator may have required, so it is not theirs alone to decide.
pub const DECRYPT_ACTION: &str = "org.dirseal.Dirseal1.decrypt-own";

#[derive(Clone, Debug)]
pub struct Caller {
    pub uid: u32,
    /// The sender's process as the bus daemon knows it (for logind: is it at the device?).
    pub pid: Option<u32>,
    /// The sender's unique bus name and the connection to ask polkit about it on.
    bus: Option<(String, Connection)>,
    /// Polkit's answer, asked at most once per call and only when the call needs it.
    admin: OnceLock<bool>,
}

impl Caller {
    /// The sender's uid as the bus daemon knows it.
    pub async fn of(conn: &Connection, hdr: &Header<'_>) -> Result<Caller> {
        let sender = hdr.sender().ok_or_else(|| Error::denied("the call has no sender; it cannot be authorized"))?;
        let dbus = zbus::fdo::DBusProxy::new(conn).await?;
        let creds = dbus.get_connection_credentials(sender.clone().into()).await?;
        let uid = creds.unix_user_id().ok_or_else(|| Error::denied("the bus did not report the caller's uid"))?;
        let pid = creds.process_id();
        Ok(Caller { uid, pid, bus: Some((sender.to_string(), conn.clone())), admin: OnceLock::new() })
    }

    /// A caller known by uid only (no polkit), for tests.
    #[cfg(test)]
    pub fn local(uid: u32) -> Caller {
        Caller { uid, pid: None, bus: None, admin: OnceLock::new() }
    }

    /// Where the caller's process is: at the device only in a local, active seat session, as logind
    /// records it; any doubt (no pid, no session) is elsewhere. The library's one rule
    /// ([`dirseal::presence`]), so PAM, the CLI and the service agree.
    pub fn presence(&self) -> Presence {
        self.pid.and_then(dirseal::presence::session_of).map_or(Presence::Elsewhere, |s| s.presence())
    }

    /// Root, or a user polkit has already let act as an administrator in this call.
    pub fn is_root(&self) -> bool {
        self.uid == 0 || self.admin.get() == Some(&true)
    }

    /// Whether the caller may act on what is not theirs: root, or a user polkit grants
    /// [`MANAGE_ACTION`] (it may ask them to authenticate). Without polkitd on the bus: root only.
    /// Blocks on the bus: call it from a worker thread, never from the bus's executor.
    pub fn may_administer(&self) -> bool {
        self.uid == 0 || *self.admin.get_or_init(|| self.polkit_allows(MANAGE_ACTION))
    }

    /// Whether the caller may decrypt a directory of their own: root, an administrator, or a
    /// user polkit grants [`DECRYPT_ACTION`]. Blocks on the bus, like [`Caller::may_administer`].
    pub fn may_decrypt_own(&self) -> bool {
        self.may_administer() || self.polkit_allows(DECRYPT_ACTION)
    }

    fn polkit_allows(&self, action: &str) -> bool {
        let Some((sender, conn)) = &self.bus else { return false };
        let subject = ("system-bus-name", HashMap::from([("name", Value::from(sender.as_str()))]));
        let details: HashMap<&str, &str> = HashMap::new();
        // Flag 1: AllowUserInteraction (the caller's authentication agent may ask for a password).
        let args = (subject, action, details, 1u32, "");
        let reply = zbus::block_on(conn.call_method(
            Some("org.freedesktop.PolicyKit1"),
            "/org/freedesktop/PolicyKit1/Authority",
            Some("org.freedesktop.PolicyKit1.Authority"),
            "CheckAuthorization",
            &args,
        ));
        match reply.and_then(|m| m.body().deserialize::<(bool, bool, HashMap<String, String>)>()) {
            Ok((authorized, _, _)) => authorized,
            // No polkitd: the service works without it, and only root acts for others.
            Err(zbus::Error::MethodError(name, ..)) if name.as_str() == "org.freedesktop.DBus.Error.ServiceUnknown" => {
                false
            }
            Err(e) => {
                crate::log::line(&format!(
                    "asking polkit about uid {} failed ({e}); treated as not authorized",
                    self.uid
                ));
                false
            }
        }
    }

    /// Whether the protector is the caller's own (or the caller is root): asks nobody.
    pub fn owns_protector(&self, rec: &ProtectorRecord) -> bool {
        self.is_root() || rec.uid == Some(self.uid)
    }

    /// A protector the caller may use or change.
    pub fn check_protector(&self, rec: &ProtectorRecord) -> Result<()> {
        if self.owns_protector(rec) || self.may_administer() {
            return Ok(());
        }
        Err(Error::denied(format!(
            "protector {} ({}) is not yours (uid {}); you may use only protectors that belong to you (uid {})",
            rec.id,
            rec.name,
            rec.uid.map_or_else(|| "none".into(), |u| u.to_string()),
            self.uid
        )))
    }

    /// The directory the caller named, as a path the service may act on for them.
    ///
    /// Root's paths are taken as given (absolute). For anyone else the path must be canonical (no
    /// symlink, `.` or `..` anywhere), a directory they own, and reachable only through directories
    /// no unprivileged user can change: otherwise the caller could swap in another directory
    /// between this check and the operation. A home under root-owned `/home` qualifies.
    pub fn directory(&self, dir: &str) -> Result<PathBuf> {
        self.directory_under(dir, None)
    }

    /// A directory to unlock: as [`Caller::directory`], but its parent directories may also be
    /// the caller's own (`~/Private`), not writable by others. The caller can then swap in another
    /// directory between this check and the unlock, and gains nothing by it: an unlock opens a
    /// directory only with the caller's own protectors, so only a directory they can open anyway.
    /// (Lock and every method that writes keep [`Caller::directory`]'s rule: a swapped path
    /// would lock or change someone else's directory.)
    pub fn directory_to_unlock(&self, dir: &str) -> Result<PathBuf> {
        self.directory_under(dir, Some(self.uid))
    }

    /// `directory`'s rule, with ancestors owned by `also` (the caller) accepted too.
    fn directory_under(&self, dir: &str, also: Option<u32>) -> Result<PathBuf> {
        let path = PathBuf::from(dir);
        // By the string: `Path::components` silently drops inner `.` components.
        if !path.is_absolute() || dir.split('/').any(|c| c == "." || c == "..") {
            return Err(Error::invalid(format!("{dir:?} is not an absolute path without . or .. components")));
        }
        if self.is_root() {
            return Ok(path);
        }
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| Error::new(crate::error::Kind::NotFound, format!("cannot inspect {dir}: {e}")))?;
        if meta.file_type().is_symlink() || !meta.is_dir() {
            return Err(Error::invalid(format!("{dir} is not a directory (symlinks are not followed)")));
        }
        // What is not (safely) the caller's own is for administrators, who act as root does.
        if meta.uid() != self.uid {
            if self.may_administer() {
                return Ok(path);
            }
            return Err(Error::denied(format!(
                "{dir} belongs to {} (uid {}); you (uid {}) may act only on directories you own \
                 (administrators: polkit action {MANAGE_ACTION})",
                dirseal::account::user_name(meta.uid()),
                meta.uid(),
                self.uid
            )));
        }
        let real = std::fs::canonicalize(&path).map_err(|e| Error::invalid(format!("cannot resolve {dir}: {e}")))?;
        if real != path {
            return Err(Error::invalid(format!(
                "{dir} goes through a symbolic link (it is really {}); pass the real path",
                real.display()
            )));
        }
        match check_ancestors(&path, also) {
            Err(_) if self.may_administer() => Ok(path),
            r => r.map(|()| path),
        }
    }
}

/// Every proper ancestor of `path` must be owned by root (or by `also`) and not writable by group
/// or others — or, like /tmp, sticky with the next component owned by root — so no unprivileged
/// user (but `also`) can rename or replace any component of `path`.
fn check_ancestors(path: &Path, also: Option<u32>) -> Result<()> {
    let mut child = path;
    while let Some(parent) = child.parent() {
        let pm = std::fs::symlink_metadata(parent)
            .map_err(|e| Error::failed(format!("cannot inspect {}: {e}", parent.display())))?;
        let cm = std::fs::symlink_metadata(child)
            .map_err(|e| Error::failed(format!("cannot inspect {}: {e}", child.display())))?;
        let group_or_other_write = pm.mode() & 0o022 != 0;
        let sticky_guarded = pm.mode() & 0o1000 != 0 && cm.uid() == 0;
        let trusted_owner = pm.uid() == 0 || Some(pm.uid()) == also;
        if !trusted_owner || (group_or_other_write && !sticky_guarded) {
            return Err(Error::denied(format!(
                "{} is reached through {}, which {} can change; the service acts for users only on directories \
                 whose parent directories belong to root and are not writable by others (a home such as /home/NAME); \
                 ask an administrator (root, or polkit action {MANAGE_ACTION})",
                path.display(),
                parent.display(),
                if pm.uid() != 0 { dirseal::account::user_name(pm.uid()) } else { "other users".into() }
            )));
        }
        child = parent;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_absolute_and_plain() {
        let root = Caller::local(0);
        assert!(root.directory("relative/x").is_err());
        assert!(root.directory("/a/../b").is_err());
        assert!(root.directory("/a/./b").is_err());
        assert_eq!(root.directory("/anything/at/all").unwrap(), PathBuf::from("/anything/at/all"));
    }

    #[test]
    fn users_get_only_their_own_stable_directories() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let uid = 4_000_123;
        let user = Caller::local(uid);
        // A root-owned 0755 parent: stable. /tmp itself is sticky and root-owned.
        let top = tempfile::tempdir().unwrap();
        std::fs::set_permissions(top.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mine = top.path().join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::os::unix::fs::chown(&mine, Some(uid), None).unwrap();
        assert_eq!(user.directory(mine.to_str().unwrap()).unwrap(), mine);

        let theirs = top.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        let e = user.directory(theirs.to_str().unwrap()).unwrap_err();
        assert_eq!(e.kind, crate::error::Kind::AccessDenied, "{e}");

        // Inside a directory the user owns: they could swap it, so refused.
        let inner = mine.join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::os::unix::fs::chown(&inner, Some(uid), None).unwrap();
        let e = user.directory(inner.to_str().unwrap()).unwrap_err();
        assert_eq!(e.kind, crate::error::Kind::AccessDenied, "{e}");

        // Through a symlink: refused even though the target is theirs.
        let link = top.path().join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        assert!(user.directory(link.to_str().unwrap()).is_err());
        assert!(user.directory(link.join("inner").to_str().unwrap()).is_err());

        // Under a world-writable, non-sticky parent: refused.
        let open = top.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let d = open.join("d");
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(uid), None).unwrap();
        assert_eq!(user.directory(d.to_str().unwrap()).unwrap_err().kind, crate::error::Kind::AccessDenied);
        // Sticky and world-writable (like /tmp): the user could rename their own entry, refused.
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        assert_eq!(user.directory(d.to_str().unwrap()).unwrap_err().kind, crate::error::Kind::AccessDenied);
    }
}
