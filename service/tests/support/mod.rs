//! A private system bus (dbus-daemon with the shipped policy), the real `dirsealed` on it, real
//! users, and clients: `gdbus` run as a user through `setpriv` (secrets passed as file
//! descriptors), and a zbus connection as root for structured checks.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dirseal_testfs::TestFs;
pub use dirseal_testfs::{User, FAST_CONFIG};
use zbus::zvariant::OwnedValue;

pub const NAME: &str = "org.dirseal.Dirseal1";
pub const PATH: &str = "/org/dirseal/Dirseal1";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").to_path_buf()
}

/// A dbus-daemon of our own, configured like a system bus plus the shipped policy file.
pub struct Bus {
    dir: tempfile::TempDir,
    child: Child,
    pub address: String,
}

impl Bus {
    pub fn start() -> Bus {
        let dir = tempfile::Builder::new().prefix("dirseal-bus.").tempdir().expect("tempdir");
        // Users must reach the socket.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let socket = dir.path().join("bus");
        let policy = repo().join("data/dbus-1/system.d/org.dirseal.Dirseal1.conf");
        let conf = std::fs::read_to_string(repo().join("service/tests/private-bus.conf"))
            .expect("private-bus.conf")
            .replace("@SOCKET@", socket.to_str().expect("utf-8"))
            .replace("@POLICY@", policy.to_str().expect("utf-8"));
        let conf_path = dir.path().join("bus.conf");
        std::fs::write(&conf_path, conf).expect("write bus.conf");
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf_path.display()))
            .args(["--nofork", "--print-address=1"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("bus.log")).expect("bus.log"))
            .spawn()
            .expect("dbus-daemon (scripts/deps.sh installs it)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("bus address");
        let address = line.trim().to_string();
        assert!(address.starts_with("unix:"), "dbus-daemon printed {address:?}");
        Bus { dir, child, address }
    }

    /// A root client.
    pub fn connect(&self) -> zbus::blocking::Connection {
        zbus::blocking::connection::Builder::address(self.address.as_str())
            .expect("address")
            .build()
            .expect("connect to the private bus")
    }

    pub fn has_owner(&self, conn: &zbus::blocking::Connection) -> bool {
        let dbus = zbus::blocking::fdo::DBusProxy::new(conn).expect("DBusProxy");
        dbus.name_has_owner(NAME.try_into().expect("name")).unwrap_or(false)
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `dirsealed`, its stderr kept in a log file.
pub struct Daemon {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the service with `--config`/`--keystore` and waits until it owns its name. The
    /// environment is cleared except for the bus address, plus `extra_env` (to show it is ignored).
    pub fn start(bus: &Bus, config: &Path, keystore: &Path, log: &Path, extra_env: &[(&str, &str)]) -> Daemon {
        let run_dir = log.parent().expect("log dir").join("run");
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_dirsealed"))
            .arg("--config")
            .arg(config)
            .arg("--keystore")
            .arg(keystore)
            .arg("--run-dir")
            .arg(&run_dir)
            .env_clear()
            .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
            .envs(extra_env.iter().copied())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("spawn dirsealed");
        let d = Daemon { child: Some(child), log: log.to_path_buf() };
        let conn = bus.connect();
        let t = Instant::now();
        while !bus.has_owner(&conn) {
            assert!(t.elapsed() < Duration::from_secs(20), "dirsealed did not start:\n{}", d.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// SIGKILL: what a crash or an OOM kill does.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as systemd stops it; returns its exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        c.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A failed call: the D-Bus error name and its message.
#[derive(Debug)]
pub struct CallError {
    pub name: String,
    pub message: String,
}

pub const DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";

/// A gdbus argument that passes the caller's descriptor `n` (a secret's pipe).
pub fn fd(n: u32) -> String {
    format!("@h {n}")
}

/// GVariant text for a string argument.
pub fn s(v: &str) -> String {
    assert!(!v.contains('\''), "test strings have no quotes");
    format!("'{v}'")
}

/// The quoted strings of a gdbus reply, in order: `('a', 'b')` → [a, b].
pub fn strings(reply: &str) -> Vec<String> {
    reply.split('\'').skip(1).step_by(2).map(str::to_string).collect()
}

/// A user encrypts their own empty home through the service: returns (policy, protector).
pub fn encrypt_home(h: &Harness, u: &User, pw: &str) -> (String, String) {
    let r = h.ok(Some(u), "Encrypt", &[s(u.home_str()), s(""), fd(3)], &[(3, pw)]);
    let v = strings(&r);
    assert_eq!(v.len(), 2, "{r}");
    (v[0].clone(), v[1].clone())
}

/// The job object path a Convert or Decrypt reply names.
pub fn job_path(reply: &str) -> String {
    let p = strings(reply);
    assert!(p.len() == 1 && p[0].starts_with("/org/dirseal/Dirseal1/jobs/"), "{reply}");
    p[0].clone()
}

/// Everything a test needs: a filesystem, a private config and keystore, a bus, the service.
pub struct Harness {
    pub fs: TestFs,
    pub etc: tempfile::TempDir,
    pub bus: Bus,
    pub daemon: Daemon,
    pub root: zbus::blocking::Connection,
}

impl Harness {
    pub fn new() -> Harness {
        Harness::with_config("")
    }

    /// With `extra` appended to the (fast) config, e.g. a `[tpm2]` section.
    pub fn with_config(extra: &str) -> Harness {
        // Room for a conversion's copy of a few tens of MB.
        let fs = TestFs::with(dirseal_testfs::Options { size_mib: 512, ..Default::default() });
        let etc = tempfile::tempdir().expect("tempdir");
        std::fs::write(etc.path().join("config.toml"), format!("{FAST_CONFIG}{extra}")).expect("config");
        std::fs::set_permissions(etc.path().join("config.toml"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        let bus = Bus::start();
        let daemon = Daemon::start(
            &bus,
            &etc.path().join("config.toml"),
            &etc.path().join("ks"),
            &etc.path().join("dirsealed.log"),
            &[],
        );
        let root = bus.connect();
        Harness { fs, etc, bus, daemon, root }
    }

    pub fn keystore(&self) -> PathBuf {
        self.etc.path().join("ks")
    }

    pub fn config(&self) -> PathBuf {
        self.etc.path().join("config.toml")
    }

    pub fn restart(&mut self) {
        self.restart_with(&[]);
    }

    /// Kills the service (if running) and starts it again with `env` added.
    pub fn restart_with(&mut self, env: &[(&str, &str)]) {
        self.daemon.kill();
        self.daemon =
            Daemon::start(&self.bus, &self.config(), &self.keystore(), &self.etc.path().join("dirsealed.log"), env);
    }

    pub fn user(&self) -> User {
        User::new(self.fs.path())
    }

    /// Calls `method` with gdbus, as `user` (None: root). `secrets` are handed over on the given fd
    /// numbers (pass `@h N` in `args`); `out` opens fd `N` for writing to a file the user owns.
    pub fn call(
        &self,
        user: Option<&User>,
        method: &str,
        args: &[String],
        secrets: &[(u32, &str)],
        out: Option<(u32, &Path)>,
    ) -> Result<String, CallError> {
        self.call_at(user, PATH, &format!("{NAME}.{method}"), args, secrets, out)
    }

    /// Calls `member` (interface.method) on object `path`.
    pub fn call_at(
        &self,
        user: Option<&User>,
        path: &str,
        member: &str,
        args: &[String],
        secrets: &[(u32, &str)],
        out: Option<(u32, &Path)>,
    ) -> Result<String, CallError> {
        let mut script =
            format!("exec gdbus call --system --dest {NAME} --object-path {path} --method {member} \"$@\"");
        let mut cmd = match user {
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={}", u.uid)).arg(format!("--regid={}", u.uid)).args([
                    "--clear-groups",
                    "--",
                    "bash",
                ]);
                c
            }
            None => Command::new("bash"),
        };
        for (fd, _) in secrets {
            script.push_str(&format!(" {fd}<<<\"$DS_SECRET_{fd}\""));
        }
        if let Some((fd, path)) = out {
            script.push_str(&format!(" {fd}>'{}'", path.display()));
        }
        cmd.arg("-c").arg(&script).arg("gdbus").args(args);
        cmd.env_clear().env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus.address).env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin");
        for (fd, v) in secrets {
            cmd.env(format!("DS_SECRET_{fd}"), v);
        }
        let o = cmd.output().expect("gdbus");
        if o.status.success() {
            return Ok(String::from_utf8_lossy(&o.stdout).trim().to_string());
        }
        let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
        // "Error: GDBus.Error:NAME: MESSAGE"
        let rest = err.split_once("GDBus.Error:").map(|(_, r)| r).unwrap_or(&err);
        let (name, message) = rest.split_once(": ").unwrap_or((rest, ""));
        Err(CallError { name: name.to_string(), message: message.to_string() })
    }

    /// A call that must succeed.
    pub fn ok(&self, user: Option<&User>, method: &str, args: &[String], secrets: &[(u32, &str)]) -> String {
        self.call(user, method, args, secrets, None).unwrap_or_else(|e| {
            panic!("{method} {args:?} failed: {} {}\nservice log:\n{}", e.name, e.message, self.daemon.log_text())
        })
    }

    /// A call that must fail with error `name`; returns the message.
    pub fn fails(
        &self,
        user: Option<&User>,
        method: &str,
        args: &[String],
        secrets: &[(u32, &str)],
        name: &str,
    ) -> String {
        match self.call(user, method, args, secrets, None) {
            Ok(r) => panic!("{method} {args:?} unexpectedly succeeded: {r}"),
            Err(e) => {
                assert_eq!(e.name, name, "{method} {args:?}: {}", e.message);
                assert!(!e.message.is_empty(), "{method}: an error must say what happened");
                e.message
            }
        }
    }

    /// GetStatus as root, as a map.
    pub fn status(&self, dir: &Path) -> HashMap<String, OwnedValue> {
        let reply = self
            .root
            .call_method(Some(NAME), PATH, Some(NAME), "GetStatus", &(dir.to_str().expect("utf-8"),))
            .expect("GetStatus");
        reply.body().deserialize().expect("a{sv}")
    }

    pub fn key(&self, dir: &Path) -> String {
        String::try_from(self.status(dir).remove("key").expect("key")).expect("string")
    }

    pub fn introspect(&self, path: &str) -> String {
        let reply = self
            .root
            .call_method(Some(NAME), path, Some("org.freedesktop.DBus.Introspectable"), "Introspect", &())
            .expect("Introspect");
        reply.body().deserialize().expect("string")
    }
}

pub fn write_as_root(path: &Path, bytes: &[u8]) {
    std::fs::File::create(path).and_then(|mut f| f.write_all(bytes)).expect("write");
}

/// A signal of a conversion job, as a client on the bus receives it.
#[derive(Debug, Clone)]
pub enum JobSignal {
    Progress { path: String, phase: String, bytes_done: u64, bytes_total: u64, eta: i64 },
    Finished { path: String, state: String },
    Failed { path: String, name: String, message: String },
}

/// Subscribes (as root, on a connection of its own) to every job's signals.
pub fn watch_jobs(bus: &Bus) -> std::sync::mpsc::Receiver<JobSignal> {
    let conn = bus.connect();
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface("org.dirseal.Dirseal1.Job")
        .expect("interface")
        .build();
    let it = zbus::blocking::MessageIterator::for_match_rule(rule, &conn, Some(10_000)).expect("match rule");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _keep = conn;
        for m in it {
            let Ok(m) = m else { break };
            let h = m.header();
            let path = h.path().map(|p| p.to_string()).unwrap_or_default();
            let member = h.member().map(|p| p.to_string()).unwrap_or_default();
            let sig = match member.as_str() {
                "Progress" => m.body().deserialize::<(String, u64, u64, u64, u64, i64)>().ok().map(
                    |(phase, bd, bt, _, _, eta)| JobSignal::Progress {
                        path,
                        phase,
                        bytes_done: bd,
                        bytes_total: bt,
                        eta,
                    },
                ),
                "Finished" => m
                    .body()
                    .deserialize::<(String, u64, u64, String)>()
                    .ok()
                    .map(|(state, ..)| JobSignal::Finished { path, state }),
                "Failed" => m.body().deserialize::<(String, String)>().ok().map(|(name, message)| JobSignal::Failed {
                    path,
                    name,
                    message,
                }),
                _ => None,
            };
            if let Some(sig) = sig {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// Fills `dir` with `n` files of `size` bytes of varied content, owned by `uid`.
pub fn fill(dir: &Path, n: usize, size: usize, uid: u32) {
    let mut seed = 0x2545F4914F6CDD1Du64;
    for i in 0..n {
        let mut buf = vec![0u8; size];
        for chunk in buf.chunks_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let b = seed.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        let p = dir.join(format!("file-{i:03}"));
        std::fs::write(&p, &buf).expect("write");
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).expect("chown");
    }
}

/// polkitd on the private bus, with the shipped action (data/polkit-1/actions) installed and a
/// rule granting it to one user. polkitd reads only the system's directories, so this writes
/// /usr/share/polkit-1/actions and /etc/polkit-1/rules.d (put back on drop): tests that use it
/// run under the global suite lock.
pub struct Polkit {
    child: Child,
    action: PathBuf,
    previous_action: Option<Vec<u8>>,
    rules: PathBuf,
}

impl Polkit {
    pub fn start(bus: &Bus, grant_to: &str) -> Polkit {
        let exe = Path::new("/usr/lib/polkit-1/polkitd");
        assert!(exe.exists(), "{} is missing (scripts/deps.sh installs polkitd)", exe.display());
        let action = PathBuf::from("/usr/share/polkit-1/actions/org.dirseal.Dirseal1.policy");
        let previous_action = std::fs::read(&action).ok();
        let shipped = std::fs::read(repo().join("data/polkit-1/actions/org.dirseal.Dirseal1.policy")).expect("policy");
        std::fs::write(&action, shipped).expect("install the polkit action");
        let rules =
            PathBuf::from(format!("/etc/polkit-1/rules.d/49-dirseal-test-{}.rules", dirseal_testfs::rand_hex()));
        let rule = format!(
            "polkit.addRule(function(action, subject) {{\n  if (action.id == \"org.dirseal.Dirseal1.manage\" \
             && subject.user == \"{grant_to}\") {{\n    return polkit.Result.YES;\n  }}\n}});\n"
        );
        std::fs::write(&rules, rule).expect("write the polkit rule");
        // Started as root, polkitd switches to its own user.
        let child = Command::new(exe)
            .arg("--no-debug")
            .env_clear()
            .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("polkitd");
        let pk = Polkit { child, action, previous_action, rules };
        let conn = bus.connect();
        let dbus = zbus::blocking::fdo::DBusProxy::new(&conn).expect("DBusProxy");
        let t = Instant::now();
        while !dbus.name_has_owner("org.freedesktop.PolicyKit1".try_into().expect("name")).unwrap_or(false) {
            assert!(t.elapsed() < Duration::from_secs(20), "polkitd did not take its name on the private bus");
            std::thread::sleep(Duration::from_millis(50));
        }
        pk
    }
}

impl Drop for Polkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.rules);
        let _ = match &self.previous_action {
            Some(bytes) => std::fs::write(&self.action, bytes),
            None => std::fs::remove_file(&self.action),
        };
    }
}
