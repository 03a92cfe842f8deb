//! Whether the person spending a try is at the device: the one rule for every front end that can
//! spend a TPM PIN try (PAM, the CLI, the service).
//!
//! The TPM's count of wrong PINs is shared by the whole machine, and its last
//! `tpm2.min_local_tries` tries are kept for someone at the device ([`crate::tpm2::PinTries`]).
//! "At the device" is decided from what the kernel and logind say about the process that asks —
//! never from its environment, which the caller of a setuid program controls:
//! - a process in a logind session is at the device only when that session is local (not
//!   `REMOTE`) and is either its seat's active one or on a console line of the machine (a serial
//!   console has no seat). `su` run from an SSH session is in that SSH session, so it is elsewhere;
//! - a login that is not in a session yet (`login`, a display manager, `sshd`, before
//!   `pam_systemd` makes one) is elsewhere when it names a remote host or comes through a network
//!   service, and at the device only when its terminal (set by the privileged program itself) is
//!   a virtual, serial or hypervisor console or a local X display;
//! - any doubt (no session, no terminal, an unreadable record) means elsewhere. The cost of being
//!   wrong that way is only that the last kept tries must be typed at a local console.
//!
//! The session of a process is read as sd-login reads it, without linking libsystemd or speaking
//! D-Bus (the PAM module loads into every login program): the unit in `/proc/PID/cgroup` after
//! the leading slices must be `session-ID.scope` (a user cannot create one there: their delegated
//! cgroups are all under `user@UID.service`), and `/run/systemd/sessions/ID` holds its state.
use std::fs;
use std::path::Path;

/// Where the person spending a try is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// At the machine: a local, active seat session or a console login.
    AtDevice,
    /// Anywhere else, or not known.
    Elsewhere,
}

impl Presence {
    /// Whether the tries kept for the person at the device may be spent.
    pub fn at_device(self) -> bool {
        self == Presence::AtDevice
    }
}

/// Services through which people log in over the network, for stacks that set no remote host.
const NETWORK_SERVICES: &[&str] = &["sshd", "xrdp-sesman", "vsftpd", "rlogin", "rsh", "telnet", "cockpit"];

/// What logind keeps of a session that matters here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Session {
    /// Its id (`3`, `c1`).
    pub id: String,
    /// Opened with a remote host (`REMOTE=1`).
    pub remote: bool,
    /// The seat it sits on (`seat0`); none for SSH and other seatless sessions.
    pub seat: Option<String>,
    /// The seat's active session (`ACTIVE=1`).
    pub active: bool,
    /// Its terminal (`TTY=tty1`, `pts/0`, `ttyS0`).
    pub tty: Option<String>,
}

impl Session {
    /// The rule for a process in a session: local, and either the active session of a seat or on
    /// one of the machine's own console lines (a serial console has no seat).
    pub fn presence(&self) -> Presence {
        let seat_in_front = self.seat.is_some() && self.active;
        if !self.remote && (seat_in_front || self.tty.as_deref().is_some_and(console_line)) {
            Presence::AtDevice
        } else {
            Presence::Elsewhere
        }
    }
}

/// What a PAM conversation tells of a login (items its privileged program set) and the session
/// the authenticating process is in.
#[derive(Clone, Debug, Default)]
pub struct Login<'a> {
    /// `PAM_RHOST`.
    pub rhost: Option<&'a str>,
    /// `PAM_SERVICE`.
    pub service: &'a str,
    /// `PAM_TTY`.
    pub tty: Option<&'a str>,
    /// The logind session of the process running the conversation, if it is in one.
    pub session: Option<Session>,
}

impl Login<'_> {
    /// The rule for a login (see the module's documentation).
    pub fn presence(&self) -> Presence {
        if self.rhost.is_some_and(|h| !h.is_empty()) || NETWORK_SERVICES.contains(&self.service) {
            return Presence::Elsewhere;
        }
        match &self.session {
            Some(s) => s.presence(),
            None if self.tty.is_some_and(local_terminal) => Presence::AtDevice,
            None => Presence::Elsewhere,
        }
    }
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// A terminal line of the machine itself: a virtual console (`tty1`, `/dev/tty2`) or a serial or
/// hypervisor console (`ttyS0`, `ttyAMA0`, `hvc0`), wired to the device; not a pseudo-terminal
/// (`/dev/pts/3`: anything, SSH included).
fn console_line(tty: &str) -> bool {
    let tty = tty.strip_prefix("/dev/").unwrap_or(tty);
    ["ttyS", "ttyAMA", "hvc"].iter().any(|p| tty.strip_prefix(p).is_some_and(digits))
        // tty0 is "the current console", not a terminal a login runs on.
        || tty.strip_prefix("tty").is_some_and(|vt| digits(vt) && vt != "0")
}

/// A console line ([`console_line`]) or a local X display (`:0`, `:1.0`); not a remote display
/// (`host:10.0`).
fn local_terminal(tty: &str) -> bool {
    if console_line(tty) {
        return true;
    }
    match tty.strip_prefix(':') {
        Some(d) => {
            let (display, screen) = d.split_once('.').unwrap_or((d, "0"));
            digits(display) && digits(screen)
        }
        None => false,
    }
}

/// The session process `pid` belongs to, if any, read from `proc_root` (`/proc`) and
/// `sessions` (`/run/systemd/sessions`); the paths are parameters for tests.
pub fn session_of_in(proc_root: &Path, sessions: &Path, pid: u32) -> Option<Session> {
    let cgroup = fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    let id = session_id(&cgroup)?;
    let record = fs::read_to_string(sessions.join(&id)).ok()?;
    let field = |key: &str| {
        record.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('='))).map(str::to_string)
    };
    Some(Session {
        remote: field("REMOTE").as_deref() != Some("0"),
        seat: field("SEAT").filter(|s| !s.is_empty()),
        active: field("ACTIVE").as_deref() == Some("1"),
        tty: field("TTY").filter(|t| !t.is_empty()),
        id,
    })
}

/// The session process `pid` belongs to, if any.
pub fn session_of(pid: u32) -> Option<Session> {
    session_of_in(Path::new("/proc"), Path::new("/run/systemd/sessions"), pid)
}

/// The presence of this process, for a front end run by the person (the CLI): its session's, or,
/// outside any session, at the device only on a virtual console (its standard input).
pub fn of_this_process() -> Presence {
    let tty = fs::read_link("/proc/self/fd/0").ok();
    Login {
        rhost: None,
        service: "dirseal",
        tty: tty.as_deref().and_then(Path::to_str),
        session: session_of(std::process::id()),
    }
    .presence()
}

/// The session id in a `/proc/PID/cgroup` text: the systemd hierarchy's path (the unified `0::`
/// line, or `name=systemd` on a hybrid one), whose first unit after the leading slices must be
/// `session-ID.scope`, as sd-login decides.
fn session_id(cgroup: &str) -> Option<String> {
    let path = cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        (controllers == "name=systemd").then_some(path)
    });
    let path = path.or_else(|| cgroup.lines().find_map(|l| l.strip_prefix("0::")))?;
    let unit = path.split('/').filter(|c| !c.is_empty()).find(|c| !c.ends_with(".slice"))?;
    let id = unit.strip_prefix("session-")?.strip_suffix(".scope")?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_come_only_from_a_session_scope_after_slices() {
        assert_eq!(session_id("0::/user.slice/user-1000.slice/session-3.scope\n").as_deref(), Some("3"));
        assert_eq!(
            session_id("1:name=systemd:/user.slice/user-0.slice/session-c1.scope\n0::/\n").as_deref(),
            Some("c1")
        );
        // A user's delegated subtree may hold a cgroup of any name: never a session.
        assert_eq!(session_id("0::/user.slice/user-1000.slice/user@1000.service/app.slice/session-1.scope\n"), None);
        assert_eq!(session_id("0::/system.slice/sshd.service\n"), None);
        assert_eq!(session_id("0::/\n"), None);
        assert_eq!(session_id("0::/user.slice/user-1000.slice/session-.scope\n"), None);
    }

    #[test]
    fn sessions_are_read_as_logind_writes_them() {
        let d = tempfile::tempdir().unwrap();
        let (proc_root, sessions) = (d.path().join("proc"), d.path().join("sessions"));
        fs::create_dir_all(proc_root.join("42")).unwrap();
        fs::create_dir_all(&sessions).unwrap();
        fs::write(proc_root.join("42/cgroup"), "0::/user.slice/user-1000.slice/session-7.scope\n").unwrap();
        let write = |body: &str| fs::write(sessions.join("7"), body).unwrap();
        let at = || session_of_in(&proc_root, &sessions, 42).map(|s| s.presence());
        write("# This is private data.\nUID=1000\nACTIVE=1\nREMOTE=0\nSEAT=seat0\nTTY=tty1\n");
        assert_eq!(at(), Some(Presence::AtDevice));
        // An SSH login: remote (or from localhost: not remote, but no seat).
        write("UID=1000\nACTIVE=1\nREMOTE=1\nREMOTE_HOST=203.0.113.7\nTTY=pts/0\n");
        assert_eq!(at(), Some(Presence::Elsewhere));
        write("UID=1000\nACTIVE=1\nREMOTE=0\nTTY=pts/0\n");
        assert_eq!(at(), Some(Presence::Elsewhere));
        // A seat session that is not in front (another user's is).
        write("UID=1000\nACTIVE=0\nREMOTE=0\nSEAT=seat0\n");
        assert_eq!(at(), Some(Presence::Elsewhere));
        // A serial console login: no seat, but the machine's own line.
        write("UID=1000\nACTIVE=1\nREMOTE=0\nTTY=ttyS1\n");
        assert_eq!(at(), Some(Presence::AtDevice));
        // No REMOTE line: not known to be local.
        write("UID=1000\nACTIVE=1\nSEAT=seat0\n");
        assert_eq!(at(), Some(Presence::Elsewhere));
        fs::remove_file(sessions.join("7")).unwrap();
        assert_eq!(at(), None);
    }

    #[test]
    fn logins_outside_a_session() {
        let login = |rhost, service, tty| Login { rhost, service, tty, session: None }.presence();
        assert_eq!(login(None, "login", Some("/dev/tty1")), Presence::AtDevice);
        assert_eq!(login(None, "login", Some("tty2")), Presence::AtDevice);
        assert_eq!(login(None, "gdm-password", Some(":0")), Presence::AtDevice);
        assert_eq!(login(None, "lightdm", Some(":1.0")), Presence::AtDevice);
        assert_eq!(login(Some("203.0.113.7"), "login", Some("tty1")), Presence::Elsewhere);
        assert_eq!(login(None, "sshd", Some("ssh")), Presence::Elsewhere);
        assert_eq!(login(None, "su", Some("/dev/pts/3")), Presence::Elsewhere);
        assert_eq!(login(None, "login", Some("/dev/tty0")), Presence::Elsewhere);
        // The machine's serial console: wired to it.
        assert_eq!(login(None, "login", Some("/dev/ttyS1")), Presence::AtDevice);
        assert_eq!(login(None, "login", Some("ttyUSB0")), Presence::Elsewhere);
        assert_eq!(login(None, "x", Some("host:10.0")), Presence::Elsewhere);
        assert_eq!(login(None, "login", None), Presence::Elsewhere);
    }

    #[test]
    fn su_from_a_remote_session_is_elsewhere_whatever_its_terminal() {
        let remote = Session { id: "4".into(), remote: true, seat: None, active: true, tty: Some("pts/0".into()) };
        let l = Login { rhost: None, service: "su", tty: Some("tty1"), session: Some(remote) };
        assert_eq!(l.presence(), Presence::Elsewhere);
        let local = Session {
            id: "2".into(),
            remote: false,
            seat: Some("seat0".into()),
            active: true,
            tty: Some("tty2".into()),
        };
        let l = Login { rhost: None, service: "su", tty: Some("/dev/pts/1"), session: Some(local) };
        assert_eq!(l.presence(), Presence::AtDevice);
    }
}
