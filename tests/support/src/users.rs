//! System users that exist for one test: PAM and dbus-daemon want real passwd entries.
//!
//! Creating users writes /etc/passwd and /etc/shadow: suites that do must run under the global
//! suite lock (scripts/test.sh), and within one test binary [`accounts`] serialises the writers.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use crate::util::rand_hex;

/// A user `dst<10 hex digits>` with a uid no real account has, removed when dropped.
pub struct User {
    pub name: String,
    pub uid: u32,
    /// A new directory owned by the user (mode 0700), like a real home.
    pub home: PathBuf,
}

impl User {
    /// A user whose home is a new empty directory in `parent`.
    pub fn new(parent: &Path) -> User {
        let name = format!("dst{}", rand_hex());
        // From the name, so a leftover user's uid tells which test made it.
        let uid = 200_000 + u32::from_str_radix(&name[3..8], 16).expect("hex") % 700_000;
        let home = parent.join(&name);
        std::fs::create_dir(&home).unwrap_or_else(|e| panic!("creating {}: {e}", home.display()));
        let home_str = home.to_str().expect("utf-8 home");
        let args = ["-M", "-d", home_str, "-u", &uid.to_string(), "-U", "-s", "/usr/sbin/nologin", &name];
        accounts("useradd", &args, None).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).expect("chown home");
        std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod home");
        User { name, uid, home }
    }

    pub fn home_str(&self) -> &str {
        self.home.to_str().expect("utf-8 home")
    }

    /// Sets the system (pam_unix) password.
    pub fn set_system_password(&self, pw: &str) {
        accounts("chpasswd", &[], Some(&format!("{}:{pw}\n", self.name))).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for User {
    fn drop(&mut self) {
        // Never panic in drop (it may run while a failed test unwinds).
        let _ = accounts("userdel", &[&self.name], None);
    }
}

/// Serialises this test binary's writers of /etc/passwd and /etc/shadow (useradd, userdel,
/// chpasswd, pam_unix changing a password): useradd fails, rather than waits, while another holds
/// the lock.
pub fn passwd_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs an account tool (`stdin` fed to it) under [`passwd_lock`]; the retries cover programs
/// outside this test binary holding the lock briefly.
pub fn accounts(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let _g = passwd_lock();
    for attempt in 0..20 {
        let mut child = Command::new(cmd)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{cmd}: {e}"))?;
        let _ = child.stdin.take().expect("piped stdin").write_all(stdin.unwrap_or("").as_bytes());
        let out = child.wait_with_output().map_err(|e| format!("{cmd}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.contains("lock") || attempt == 19 {
            return Err(format!("{cmd} {args:?}: {err}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    unreachable!("the last attempt returns")
}
