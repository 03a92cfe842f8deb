//! Issue 44, 7: a user other than root uses the `dirseal` command on their own directories
//! through the system service: the real binary run as a real user, dirsealed on a private system
//! bus (dbus-daemon with the shipped policy), secrets typed on stdin and passed on as pipes.
//! Creates users: run only under the global suite lock (scripts/test.sh).
mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::Env;
use dirseal_testfs::User;

/// dbus-daemon configured as a system bus plus dirsealed's policy, and the service on it.
struct Bus {
    dir: tempfile::TempDir,
    bus: Child,
    daemon: Option<Child>,
    address: String,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

impl Bus {
    fn start(env: &Env) -> Bus {
        Bus::start_with(env, &[])
    }

    /// With `extra` in the service's environment (a fault point to hold it at).
    fn start_with(env: &Env, extra: &[(&str, &Path)]) -> Bus {
        let dir = tempfile::Builder::new().prefix("dirseal-bus.").tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let socket = dir.path().join("bus");
        let policy = repo().join("data/dbus-1/system.d/org.dirseal.Dirseal1.conf");
        let conf = std::fs::read_to_string(repo().join("service/tests/private-bus.conf"))
            .expect("private-bus.conf")
            .replace("@SOCKET@", socket.to_str().expect("utf-8"))
            .replace("@POLICY@", policy.to_str().expect("utf-8"));
        std::fs::write(dir.path().join("bus.conf"), conf).expect("bus.conf");
        let mut bus = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", dir.path().join("bus.conf").display()))
            .args(["--nofork", "--print-address=1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon (scripts/deps.sh installs it)");
        let mut line = String::new();
        BufReader::new(bus.stdout.take().expect("stdout")).read_line(&mut line).expect("bus address");
        let address = line.trim().to_string();
        // dirsealed is another package's binary: built beside `dirseal` (cargo build --workspace).
        let exe = Path::new(env!("CARGO_BIN_EXE_dirseal")).with_file_name("dirsealed");
        assert!(exe.is_file(), "{} is missing: cargo build --workspace (or -p dirsealed)", exe.display());
        let log = std::fs::File::create(dir.path().join("dirsealed.log")).expect("log");
        let daemon = Command::new(exe)
            .arg("--config")
            .arg(env.config())
            .arg("--keystore")
            .arg(env.keystore())
            .arg("--run-dir")
            .arg(dir.path().join("run"))
            .env_clear()
            .env("DBUS_SYSTEM_BUS_ADDRESS", &address)
            .envs(extra.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("dirsealed");
        let b = Bus { dir, bus, daemon: Some(daemon), address };
        let t = Instant::now();
        while !b.owned() {
            assert!(t.elapsed() < Duration::from_secs(20), "dirsealed did not start:\n{}", b.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        b
    }

    /// Whether the service's name has an owner.
    fn owned(&self) -> bool {
        let Ok(conn) = zbus::blocking::connection::Builder::address(self.address.as_str()).and_then(|b| b.build())
        else {
            return false;
        };
        let Ok(dbus) = zbus::blocking::fdo::DBusProxy::new(&conn) else { return false };
        dbus.name_has_owner("org.dirseal.Dirseal1".try_into().expect("name")).unwrap_or(false)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dirsealed.log")).unwrap_or_default()
    }

    fn stop_service(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        self.stop_service();
        let _ = self.bus.kill();
        let _ = self.bus.wait();
    }
}

/// `dirseal ARGS` as `user` (real and effective uid and gid theirs; std drops root's groups), stdin fed
/// `input`, the environment only the bus's address and PATH: no keystore or config of root's.
fn as_user(user: &User, address: &str, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dirseal"))
        .args(args)
        .env_clear()
        .env("DBUS_SYSTEM_BUS_ADDRESS", address)
        .env("PATH", "/usr/bin:/bin")
        .current_dir("/")
        .uid(user.uid)
        .gid(user.uid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dirseal as the user");
    let _ = child.stdin.take().expect("stdin").write_all(input.as_bytes());
    child.wait_with_output().expect("wait")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn key(env: &Env, dir: &Path) -> String {
    env.status_json(dir)["key"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_user_unlocks_locks_and_changes_their_password_through_the_service() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    // The user must reach the mount (test directories are private).
    for a in env.mnt().ancestors().take_while(|a| a.starts_with(std::env::temp_dir()) && *a != std::env::temp_dir()) {
        std::fs::set_permissions(a, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut bus = Bus::start(&env);
    let alice = User::new(env.mnt());
    let home: PathBuf = alice.home.clone();
    let h = alice.home_str();
    // Root encrypts her empty home with a password protector of hers.
    env.ok(&["encrypt", h, "--user", &alice.name, "--no-recovery-key"], "pw-a\n");
    std::fs::write(home.join("diary"), b"dear diary").unwrap();
    let address = bus.address.clone();
    let user = |args: &[&str], input: &str| as_user(&alice, &address, args, input);
    let ok = |args: &[&str], input: &str| {
        let o = user(args, input);
        assert!(o.status.success(), "{args:?} as the user: {}\nservice log:\n{}", text(&o), bus.log());
        String::from_utf8_lossy(&o.stdout).into_owned()
    };

    // status: what the root-only keystore knows, through the service.
    let st = ok(&["status", h], "");
    assert!(st.contains("managed:    yes") && st.contains(&alice.name) && st.contains("recovery:   no"), "{st}");

    assert!(ok(&["lock", h], "").contains(&format!("locked {h}")));
    assert_eq!(key(&env, &home), "locked");

    // A wrong password: the service's error, exit 1, still locked.
    let o = user(&["unlock", h], "wrong\n");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("dirseal: error:") && text(&o).contains("incorrect password"), "{}", text(&o));
    assert_eq!(key(&env, &home), "locked");
    ok(&["unlock", h], "pw-a\n");
    assert_eq!(key(&env, &home), "unlocked");
    assert_eq!(std::fs::read(home.join("diary")).unwrap(), b"dear diary");

    // change-password: the old one, then the new one; only the new one unlocks after.
    ok(&["change-password", h], "pw-a\npw-b\n");
    ok(&["lock", h], "");
    assert!(!user(&["unlock", h], "pw-a\n").status.success());
    ok(&["unlock", h], "pw-b\n");
    assert_eq!(key(&env, &home), "unlocked");
    let log = bus.log();
    assert!(log.contains("ChangeSecret(") && log.contains(&format!("by uid {}: ok", alice.uid)), "{log}");
    assert!(!log.contains("pw-a") && !log.contains("pw-b"), "the log holds a secret");

    // Recovery: a key made through the service, then checked.
    let out = ok(&["recovery", "add", h], "pw-b\n");
    let line = out.lines().map(str::trim).find(|l| l.len() > 30 && !l.contains(' ')).expect("the key is shown");
    assert!(ok(&["recovery", "verify", h], &format!("{line}\n")).contains("opens"));
    assert!(ok(&["status", h], "").contains("recovery:   yes"));
    assert!(ok(&["protector", "list"], "").contains(&alice.name));

    // Protectors: a second one of hers, added to the home, used, then taken off and removed.
    assert!(ok(&["protector", "create", "--name", "laptop"], "pw-l\n").contains("created protector"));
    ok(&["policy", "add-protector", h, "--protector", "laptop"], "pw-b\npw-l\n");
    ok(&["lock", h], "");
    ok(&["unlock", h, "--protector", "laptop"], "pw-l\n");
    ok(&["protector", "verify", "laptop"], "pw-l\n");
    assert!(!user(&["protector", "verify", "laptop"], "nope\n").status.success());
    ok(&["policy", "remove-protector", h, "--protector", "laptop"], "");
    ok(&["protector", "remove", "laptop"], "");
    assert!(!ok(&["protector", "list"], "").contains("laptop"));

    // A directory that is not encrypted: said before any password is asked, with the library's remedy.
    let plain = env.mnt().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let o = user(&["unlock", plain.to_str().unwrap()], "");
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("not encrypted") && text(&o).contains("dirseal convert"), "{}", text(&o));

    // A command the service does not offer: named, and the way to run it.
    let o = user(&["pin-login", "enable", &alice.name], "");
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(t.contains("`dirseal pin-login` needs root") && t.contains("sudo dirseal pin-login enable"), "{t}");

    // What the service refuses a user (a directory under one she could swap): its reason, and root's way.
    let private = home.join("Private");
    std::fs::create_dir(&private).unwrap();
    std::os::unix::fs::chown(&private, Some(alice.uid), Some(alice.uid)).unwrap();
    let o = user(&["lock", private.to_str().unwrap()], "");
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(t.contains("dirseal: error:") && t.contains("sudo dirseal lock"), "{t}");
    assert_eq!(key(&env, &home), "unlocked", "nothing changed");

    // But she unlocks it once encrypted with a protector of hers (issue 44's `dirseal unlock
    // ~/Private`): an unlock opens only what her own protectors open, so a path she could swap gains
    // her nothing. Locking it stays root's (a swapped path would lock someone else's directory).
    // (Her home is encrypted already, so the directory is in another one of hers: a `Private` in it.)
    let own = env.mnt().join(format!("{}-files", alice.name));
    let private = own.join("Private");
    std::fs::create_dir_all(&private).unwrap();
    for d in [&own, &private] {
        std::os::unix::fs::chown(d, Some(alice.uid), Some(alice.uid)).unwrap();
    }
    let p = private.to_str().unwrap();
    env.ok(&["encrypt", p, "--user", &alice.name, "--protector-name", "private", "--no-recovery-key"], "pw-p\n");
    env.ok(&["lock", p], "");
    assert_eq!(key(&env, &private), "locked");
    let o = user(&["unlock", p], "wrong\n");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(key(&env, &private), "locked");
    let o = user(&["unlock", p], "pw-p\n");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(key(&env, &private), "unlocked");
    let o = user(&["lock", p], "");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(key(&env, &private), "unlocked");
    // Under her directory, but another account's, with its protector: her knowing its password gets
    // her nothing (the service opens only what her own protectors open, in what she owns).
    let theirs = own.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let t = theirs.to_str().unwrap();
    env.ok(&["encrypt", t, "--user", "nobody", "--protector-name", "theirs", "--no-recovery-key"], "pw-t\n");
    env.ok(&["lock", t], "");
    let o = user(&["unlock", t], "pw-t\n");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(key(&env, &theirs), "locked", "{}", text(&o));

    // No service: said plainly, with what to do.
    bus.stop_service();
    let o = user(&["lock", h], "");
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(t.contains("dirsealed") && t.contains("not running") && t.contains("systemctl start dirsealed"), "{t}");
    assert_eq!(key(&env, &home), "unlocked");
}

/// A user converts their own home (with data) through the service: the plan, the new password on
/// stdin, the job followed to its end; then unlocks it with that password.
#[test]
fn a_user_converts_their_own_home_through_the_service() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    for a in env.mnt().ancestors().take_while(|a| a.starts_with(std::env::temp_dir()) && *a != std::env::temp_dir()) {
        std::fs::set_permissions(a, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let bus = Bus::start(&env);
    let bob = User::new(env.mnt());
    let h = bob.home_str();
    for i in 0..20 {
        let f = bob.home.join(format!("f{i}"));
        std::fs::write(&f, vec![i as u8; 10_000]).unwrap();
        std::os::unix::fs::chown(&f, Some(bob.uid), Some(bob.uid)).unwrap();
    }
    // Not on a terminal: --yes says yes, as for root.
    let o = as_user(&bob, &bus.address, &["convert", h], "pw-b\n");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--yes"), "{}", text(&o));
    let o = as_user(&bob, &bus.address, &["convert", "--yes", h], "pw-b\n");
    assert!(o.status.success(), "{}\nservice log:\n{}", text(&o), bus.log());
    assert!(text(&o).contains("done"), "{}", text(&o));
    let st = env.status_json(&bob.home);
    assert_eq!(st["encrypted"], true, "{st}");
    assert_eq!(std::fs::read(bob.home.join("f7")).unwrap(), vec![7u8; 10_000]);
    let o = as_user(&bob, &bus.address, &["lock", h], "");
    assert!(o.status.success(), "{}", text(&o));
    let o = as_user(&bob, &bus.address, &["unlock", h], "pw-b\n");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(bob.home.join("f3")).unwrap(), vec![3u8; 10_000]);
    // Decrypting takes polkit's decrypt-own (none on this bus): refused, with root's way.
    let o = as_user(&bob, &bus.address, &["decrypt", "--yes", h], "");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("decrypt-own") && t.contains("sudo dirseal decrypt --yes"), "{t}");
    assert_eq!(env.status_json(&bob.home)["encrypted"], true);
}

/// `--at-next-boot` from the user's own CLI reaches the service as `at_next_boot` (it was once
/// dropped on this path: the service then converted at once, or refused the home in use): the
/// home is scheduled, not converted, and the boot-time run converts it with nothing typed.
#[test]
fn a_user_schedules_their_own_home_for_the_next_boot_through_the_service() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    for a in env.mnt().ancestors().take_while(|a| a.starts_with(std::env::temp_dir()) && *a != std::env::temp_dir()) {
        std::fs::set_permissions(a, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let bus = Bus::start(&env);
    let bob = User::new(env.mnt());
    let h = bob.home_str();
    let f = bob.home.join("f");
    std::fs::write(&f, vec![5u8; 10_000]).unwrap();
    std::os::unix::fs::chown(&f, Some(bob.uid), Some(bob.uid)).unwrap();
    let o = as_user(&bob, &bus.address, &["convert", "--yes", "--at-next-boot", h], "pw-b\n");
    assert!(o.status.success(), "{}\nservice log:\n{}", text(&o), bus.log());
    assert!(text(&o).contains("scheduled for encryption at the next boot"), "{}", text(&o));
    let st = env.status_json(&bob.home);
    assert_eq!((&st["encrypted"], &st["conversion"]), (&false.into(), &"scheduled".into()), "{st}");
    let out = env.ok(&["convert", "--scheduled"], "");
    assert!(out.contains(&format!("{h} is encrypted")), "{out}");
    assert_eq!(env.status_json(&bob.home)["encrypted"], true);
    let o = as_user(&bob, &bus.address, &["lock", h], "");
    assert!(o.status.success(), "{}", text(&o));
    let o = as_user(&bob, &bus.address, &["unlock", h], "pw-b\n");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(&f).unwrap(), vec![5u8; 10_000]);
}

/// Ctrl-C while the service converts the user's home: the CLI cancels the job (`Cancel`), the
/// service aborts it, and the home is as it was; exit 130.
#[cfg(feature = "fault-injection")]
#[test]
fn ctrl_c_cancels_the_users_conversion_in_the_service() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    for a in env.mnt().ancestors().take_while(|a| a.starts_with(std::env::temp_dir()) && *a != std::env::temp_dir()) {
        std::fs::set_permissions(a, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let hold = env.etc.path().join("hold");
    let bus = Bus::start_with(&env, &[("DIRSEAL_FAULT", Path::new("copy-file:5")), ("DIRSEAL_FAULT_HOLD", &hold)]);
    let carol = User::new(env.mnt());
    for i in 0..20 {
        let f = carol.home.join(format!("f{i}"));
        std::fs::write(&f, vec![i as u8; 4096]).unwrap();
        std::os::unix::fs::chown(&f, Some(carol.uid), Some(carol.uid)).unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_dirseal"))
        .args(["convert", "--yes", carol.home_str()])
        .env_clear()
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
        .current_dir("/")
        .uid(carol.uid)
        .gid(carol.uid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"pw-c\n").unwrap();
    let t = Instant::now();
    while !hold.exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "the copy never reached the hold:\n{}", bus.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGINT).unwrap();
    // The CLI's Cancel reaches the job while it waits; the copy then stops at its next checkpoint.
    let t = Instant::now();
    while !bus.log().contains("Cancel(") {
        assert!(t.elapsed() < Duration::from_secs(20), "no Cancel reached the service:\n{}", bus.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_file(&hold).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}\n{}", text(&out), bus.log());
    assert!(text(&out).contains("is as it was"), "{}", text(&out));
    assert_eq!(env.status_json(&carol.home)["encrypted"], false);
    assert_eq!(std::fs::read(carol.home.join("f7")).unwrap(), vec![7u8; 4096]);
}

/// A user converts their own home live from inside their session (a process of theirs has its
/// cwd there): `convert --live` returns once the service's job runs; status says it waits for
/// the logout; when the process ends, the job commits.
#[test]
fn a_user_converts_their_home_live_through_the_service() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    for a in env.mnt().ancestors().take_while(|a| a.starts_with(std::env::temp_dir()) && *a != std::env::temp_dir()) {
        std::fs::set_permissions(a, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let bus = Bus::start(&env);
    let bob = User::new(env.mnt());
    let h = bob.home_str();
    for i in 0..20 {
        let f = bob.home.join(format!("f{i}"));
        std::fs::write(&f, vec![i as u8; 10_000]).unwrap();
        std::os::unix::fs::chown(&f, Some(bob.uid), Some(bob.uid)).unwrap();
    }
    let mut session = std::os::unix::process::CommandExt::uid(std::process::Command::new("sleep").arg("600"), bob.uid)
        .current_dir(&bob.home)
        .spawn()
        .unwrap();
    let o = as_user(&bob, &bus.address, &["convert", "--live", "--yes", h], "pw-b\n");
    assert!(o.status.success(), "{}\nservice log:\n{}", text(&o), bus.log());
    assert!(text(&o).contains("in the background"), "{}", text(&o));
    let conversion = || env.status_json(&bob.home)["conversion"].as_str().unwrap_or_default().to_string();
    let start = std::time::Instant::now();
    while conversion() != "live: caught up, waiting for logout" {
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "{}", conversion());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    session.kill().unwrap();
    session.wait().unwrap();
    while conversion() != "live: done" {
        assert!(start.elapsed() < std::time::Duration::from_secs(120), "{}", conversion());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(env.status_json(&bob.home)["encrypted"], true);
    // Committed with bob gone: locked (just after the journal says done), his password opens it.
    while env.status_json(&bob.home)["key"] != "locked" {
        assert!(start.elapsed() < std::time::Duration::from_secs(140), "the home was left open with nobody in");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let o = as_user(&bob, &bus.address, &["unlock", h], "pw-b\n");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(bob.home.join("f7")).unwrap(), vec![7u8; 10_000]);
}
