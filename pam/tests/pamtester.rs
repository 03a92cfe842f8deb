//! The real module loaded by libpam through `pamtester`, with service files of our own, users
//! of our own, and homes encrypted with dirseal on a real loop-mounted ext4.
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use dirseal::ops::{Dirseal, NewProtector, ProtectorChoice};
use dirseal::protector::{KindOptions, NewKind};
use dirseal::secret::Passphrase;
use dirseal_testfs::ui::Scripted;
use dirseal_testfs::{accounts, passwd_lock, rand_hex, TestFs, User, FAST_CONFIG};

fn module() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    for dir in exe.ancestors().skip(1).take(3) {
        let so = dir.join("libpam_dirseal.so");
        if so.exists() {
            return so;
        }
    }
    panic!("libpam_dirseal.so not found near {}", exe.display());
}

struct Setup {
    fs: TestFs,
    etc: tempfile::TempDir,
    services: Vec<PathBuf>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for s in &self.services {
            let _ = fs::remove_file(s);
        }
    }
}

impl Setup {
    fn new() -> Setup {
        let fs = TestFs::new();
        let etc = tempfile::tempdir().unwrap();
        fs::write(etc.path().join("config.toml"), FAST_CONFIG).unwrap();
        fs::set_permissions(etc.path().join("config.toml"), fs::Permissions::from_mode(0o600)).unwrap();
        Setup { fs, etc, services: Vec::new() }
    }

    fn config(&self) -> PathBuf {
        self.etc.path().join("config.toml")
    }
    fn keystore(&self) -> PathBuf {
        self.etc.path().join("ks")
    }
    fn args(&self) -> String {
        format!(
            "config={} keystore={} rundir={}",
            self.config().display(),
            self.keystore().display(),
            self.etc.path().join("run").display()
        )
    }
    fn ds(&self) -> Dirseal {
        Dirseal::open(&self.config(), Some(&self.keystore())).unwrap()
    }

    /// A user whose home is encrypted by dirseal with `password`, holding one file, locked.
    fn managed_user(&self, password: &'static str) -> User {
        let u = User::new(self.fs.path());
        let mut ds = self.ds();
        let kind = NewKind::named("password", KindOptions::default()).unwrap();
        let n = NewProtector { name: u.name.as_str().into(), uid: Some(u.uid), kind };
        ds.encrypt(&u.home, ProtectorChoice::New(n), &mut Scripted::new(&[password])).unwrap();
        fs::write(u.home.join("diary.txt"), b"dear diary").unwrap();
        assert!(ds.lock(&u.home, false).unwrap().locked);
        u
    }

    /// Writes /etc/pam.d/<unique> with `lines` ({so} and {args} are filled in); returns its name.
    fn service(&mut self, lines: &str) -> String {
        let name = format!("dirseal-test-{}", rand_hex());
        let text = lines.replace("{so}", module().to_str().unwrap()).replace("{args}", &self.args());
        let path = Path::new("/etc/pam.d").join(&name);
        fs::write(&path, text).unwrap();
        self.services.push(path);
        name
    }
}

/// pamtester as a login at the device: on a virtual console, as `login` sets PAM_TTY (this test
/// process is in no logind session, so the terminal decides; docs/pam.md).
fn pamtester(service: &str, user: &str, ops: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    run_pamtester(at_console(Command::new("pamtester")), service, user, ops, stdin, env)
}

fn at_console(mut c: Command) -> Command {
    c.args(["-I", "tty=/dev/tty1"]);
    c
}

/// pamtester with the real uid of `u` and effective uid root: how `passwd` runs when a user
/// changes their own password (set-uid root), so modules see a non-root caller.
fn pamtester_as(u: &User, service: &str, ops: &[&str], stdin: &str) -> Output {
    let mut c = Command::new("setpriv");
    c.arg(format!("--ruid={}", u.uid)).arg("pamtester");
    run_pamtester(at_console(c), service, &u.name, ops, stdin, &[])
}

fn run_pamtester(c: Command, service: &str, user: &str, ops: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    start_pamtester(c, service, user, ops, stdin, env).wait_with_output().unwrap()
}

fn start_pamtester(
    mut c: Command,
    service: &str,
    user: &str,
    ops: &[&str],
    stdin: &str,
    env: &[(&str, &str)],
) -> std::process::Child {
    c.arg(service).arg(user).args(ops).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("pamtester");
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child
}

fn ok(o: &Output) -> bool {
    o.status.success()
}

/// Everything pamtester printed (conversation messages go to stderr).
fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn unlocked(u: &User) -> bool {
    fs::read(u.home.join("diary.txt")).is_ok_and(|b| b == b"dear diary")
}

/// The stack `pam-auth-update` writes with Debian's unix profile and ours enabled, from the
/// profile we ship (data/pam-configs/dirseal), in a scratch root: common-auth, -account,
/// -session and -password one after the other, ready for one service file. `pam_unix` gets
/// `nodelay` only to keep its failure delay out of the test's run time; our lines get the test's
/// paths.
fn pam_auth_update(enable: bool) -> String {
    pam_auth_update_with(enable, &[])
}

/// [`pam_auth_update`] with more of our profiles (data/pam-configs/NAME) enabled too.
fn pam_auth_update_with(enable: bool, more: &[&str]) -> String {
    let root = tempfile::tempdir().unwrap();
    let configs = root.path().join("usr/share/pam-configs");
    fs::create_dir_all(&configs).unwrap();
    fs::create_dir_all(root.path().join("etc/pam.d")).unwrap();
    fs::create_dir_all(root.path().join("var/lib/pam")).unwrap();
    let unix = fs::read_to_string("/usr/share/pam-configs/unix").unwrap();
    fs::write(configs.join("unix"), unix.replace("pam_unix.so nullok", "pam_unix.so nullok nodelay")).unwrap();
    for name in std::iter::once(&"dirseal").chain(more) {
        let ours =
            fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/pam-configs").join(name)).unwrap();
        assert!(ours.contains("pam_dirseal.so"));
        fs::write(configs.join(name), ours.replace("pam_dirseal.so", "{so} {args}")).unwrap();
    }
    let run = |args: &[&str]| {
        let o = Command::new("pam-auth-update")
            .arg("--root")
            .arg(root.path())
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .unwrap();
        assert!(o.status.success(), "pam-auth-update {args:?}: {}", show(&o));
    };
    run(&[&["--force", "--enable", "unix", "dirseal"][..], more].concat());
    if !enable {
        run(&["--disable", "dirseal"]);
    }
    ["auth", "account", "session", "password"]
        .iter()
        .map(|t| fs::read_to_string(root.path().join(format!("etc/pam.d/common-{t}"))).unwrap())
        .collect()
}

fn shipped_stack() -> String {
    pam_auth_update(true)
}

/// `stack` with `extra` added to our session line (test switches for one service only).
fn session_args(stack: &str, extra: &str) -> String {
    stack
        .lines()
        .map(
            |l| {
                if l.starts_with("session") && l.contains("{so}") {
                    format!("{l} {extra}\n")
                } else {
                    format!("{l}\n")
                }
            },
        )
        .collect()
}

/// A managed user whose system password is the home's password too.
fn in_step_user(s: &Setup, pw: &'static str) -> User {
    let u = s.managed_user(pw);
    u.set_system_password(pw);
    u
}

/// Runs pamtester in the background (for sessions held open by a `test_delay`).
fn spawn(service: &str, user: &str, ops: &[&str], stdin: &str) -> std::process::Child {
    start_pamtester(at_console(Command::new("pamtester")), service, user, ops, stdin, &[])
}

/// Waits up to `secs` for `cond`.
fn eventually(secs: u64, cond: impl Fn() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cond()
}

#[test]
fn the_profile_gives_a_working_stack_enabled_and_disabled() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "home-Password-1");
    let plain = User::new(s.fs.path());
    plain.set_system_password("plain-Password-1");
    let on = shipped_stack();
    assert!(on.contains("{so}"), "{on}");
    let off = pam_auth_update(false);
    assert!(!off.contains("{so}"), "--disable must remove every line: {off}");
    let (on, off) = (s.service(&on), s.service(&off));
    for svc in [&on, &off] {
        let o = pamtester(svc, &u.name, &["authenticate", "acct_mgmt", "open_session"], "home-Password-1\n", &[]);
        assert!(ok(&o), "{}", show(&o));
        let o = pamtester(svc, &plain.name, &["authenticate", "acct_mgmt", "open_session"], "plain-Password-1\n", &[]);
        assert!(ok(&o), "{}", show(&o));
        assert!(!ok(&pamtester(svc, &plain.name, &["authenticate"], "home-Password-1\n", &[])));
        assert!(!ok(&pamtester(svc, &u.name, &["authenticate"], "wrong-Password\n", &[])));
    }
    // Only the enabled stack opened the home (the session above outlived no process: it is
    // still unlocked because nobody closed it).
    assert!(unlocked(&u));
    s.ds().lock(&u.home, false).unwrap();
    let o = pamtester(&off, &u.name, &["authenticate", "open_session"], "home-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u), "the disabled stack must not touch the home");
}

#[test]
fn login_unlocks_and_the_last_logout_locks() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "hunter2-Password");
    let stack = shipped_stack();
    // An unknown argument is logged and ignored, not fatal.
    let svc = s.service(&stack.replace("{args}", "{args} no_such_option"));
    let hold = s.service(&session_args(&stack, "test_delay=after-open:3000"));
    // A session held open for 3 s, and a second one opened and closed meanwhile.
    let first = spawn(&hold, &u.name, &["authenticate", "open_session", "close_session"], "hunter2-Password\n");
    assert!(eventually(3, || unlocked(&u)), "open_session must unlock the home");
    let run = s.etc.path().join("run");
    assert_eq!(fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o700);
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session", "close_session"], "hunter2-Password\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "another session is still open");
    let o = first.wait_with_output().unwrap();
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u), "the last close_session must lock");
    // Locked means the names are ciphertext again, not just unreadable contents.
    let names: Vec<_> = fs::read_dir(&u.home).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1);
    assert_ne!(names[0], "diary.txt");
}

#[test]
fn a_login_racing_the_last_logout_keeps_the_home_unlocked_for_its_session() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "race-Password-1");
    let stack = shipped_stack();
    // The logout pauses after deciding it is the last session and before removing the key; the
    // login starts during that pause and then holds its session open.
    let leaving = s.service(&session_args(&stack, "test_delay=close-decided:1500"));
    let arriving = s.service(&session_args(&stack, "test_delay=after-open:4000"));
    let out = spawn(&leaving, &u.name, &["authenticate", "open_session", "close_session"], "race-Password-1\n");
    assert!(eventually(3, || unlocked(&u)));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut stays = spawn(&arriving, &u.name, &["authenticate", "open_session"], "race-Password-1\n");
    let o = out.wait_with_output().unwrap();
    assert!(ok(&o), "{}", show(&o));
    assert!(stays.try_wait().unwrap().is_none(), "the login's session must still be open");
    assert!(eventually(2, || unlocked(&u)), "the home must be unlocked while the new session lives");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(unlocked(&u), "and stay unlocked");
    assert!(stays.try_wait().unwrap().is_none());
    stays.wait().unwrap();
}

#[test]
fn a_session_killed_without_logout_does_not_keep_the_home_unlocked() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "kill-Password-1");
    let stack = shipped_stack();
    let hold = s.service(&session_args(&stack, "test_delay=after-open:20000"));
    let svc = s.service(&stack);
    let mut killed = spawn(&hold, &u.name, &["authenticate", "open_session", "close_session"], "kill-Password-1\n");
    assert!(eventually(3, || unlocked(&u)));
    killed.kill().unwrap();
    killed.wait().unwrap();
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session", "close_session"], "kill-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u), "the killed session must be forgotten and the last logout lock");
}

#[test]
fn a_shared_protector_of_another_user_never_logs_the_owner_in() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let alice = in_step_user(&s, "alice-Password-1");
    let bob = User::new(s.fs.path());
    bob.set_system_password("bob-Password-1");
    // Bob's protector shares alice's home (a shared directory): it opens it with the CLI.
    let mut ds = s.ds();
    let policy = ds.policy_of(&alice.home).unwrap();
    let kind = NewKind::named("password", KindOptions::default()).unwrap();
    let n = NewProtector { name: bob.name.as_str().into(), uid: Some(bob.uid), kind };
    ds.add_protector_to_policy(
        &policy.id,
        Default::default(),
        ProtectorChoice::New(n),
        &mut Scripted::new(&["alice-Password-1", "bob-Password-1"]),
    )
    .unwrap();
    let svc = s.service(&shipped_stack());
    let o = pamtester(&svc, &alice.name, &["authenticate"], "bob-Password-1\n", &[]);
    assert!(!ok(&o), "bob's password must not log in as alice: {}", show(&o));
    // Even when alice's own system password is that same string, bob's protector is never
    // tried for her: she logs in (the system says so) and her home stays locked.
    alice.set_system_password("bob-Password-1");
    let o = pamtester(&svc, &alice.name, &["authenticate", "open_session"], "bob-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&alice));
}

#[test]
fn after_passwd_lock_or_expiry_the_old_password_fails() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "lock-Password-1");
    let svc = s.service(&shipped_stack());
    assert!(ok(&pamtester(&svc, &u.name, &["authenticate", "acct_mgmt"], "lock-Password-1\n", &[])));
    accounts("passwd", &["-l", &u.name], None).unwrap();
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "lock-Password-1\n", &[]);
    assert!(!ok(&o), "a locked password must not log in: {}", show(&o));
    assert!(!unlocked(&u));
    accounts("passwd", &["-u", &u.name], None).unwrap();
    assert!(ok(&pamtester(&svc, &u.name, &["authenticate", "acct_mgmt"], "lock-Password-1\n", &[])));
    accounts("chage", &["-E", "0", &u.name], None).unwrap();
    let o = pamtester(&svc, &u.name, &["authenticate", "acct_mgmt"], "lock-Password-1\n", &[]);
    assert!(!ok(&o), "an expired account must not log in: {}", show(&o));
}

#[test]
fn after_a_root_reset_the_new_password_logs_in_and_the_home_says_how_to_follow() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "old-Password-1");
    let svc = s.service(&shipped_stack());
    // pamtester runs as root, like `passwd USER`: pam_unix asks only the new password.
    let o = {
        let _g = passwd_lock();
        pamtester(&svc, &u.name, &["chauthtok"], "reset-Password-2\nreset-Password-2\n", &[])
    };
    assert!(ok(&o), "the system password change must go through: {}", show(&o));
    assert!(text(&o).contains(&format!("dirseal change-password {}", u.home.display())), "{}", show(&o));
    // The old password is refused; the new one logs in, the home stays locked and says why.
    assert!(!ok(&pamtester(&svc, &u.name, &["authenticate"], "old-Password-1\n", &[])));
    let o = pamtester(&svc, &u.name, &["authenticate", "acct_mgmt", "open_session"], "reset-Password-2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u));
    let fix = format!("dirseal change-password {} --protector", u.home.display());
    assert!(text(&o).contains(&fix), "the login must name the fix: {}", show(&o));
    // The fix named: the previous password, then the current one. Then logins open the home.
    let pid = *s.ds().policy_of(&u.home).unwrap().wrapped.keys().next().unwrap();
    s.ds().change_secret(&pid, &mut Scripted::new(&["old-Password-1", "reset-Password-2"])).unwrap();
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "reset-Password-2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
    assert!(!text(&o).contains(&fix), "{}", show(&o));
}

#[test]
fn a_user_running_the_stack_without_root_is_never_failed() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "own-Password-1");
    // A screen locker, or the user's own pamtester: not root. Our lines `required` here, as an
    // administrator might write them: stepping aside must not fail the stack.
    let strict = s.service(
        "auth required pam_unix.so nodelay\nauth required {so} {args}\n\
         session required pam_permit.so\nsession required {so} {args}\n",
    );
    let shipped = s.service(&shipped_stack());
    let as_user = |svc: &str, ops: &[&str], pw: &str| {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={}", u.uid)).arg(format!("--regid={}", u.uid)).arg("--clear-groups").arg("pamtester");
        run_pamtester(c, svc, &u.name, ops, pw, &[])
    };
    for svc in [&strict, &shipped] {
        let o = as_user(svc, &["authenticate"], "own-Password-1\n");
        assert!(ok(&o), "{}", show(&o));
        assert!(!ok(&as_user(svc, &["authenticate"], "wrong-Password\n")), "pam_unix still decides");
    }
    let o = as_user(&strict, &["authenticate", "open_session", "close_session"], "own-Password-1\n");
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u), "a process without root's rights cannot unlock anything");
}

#[test]
fn password_change_follows_and_the_old_one_stops_working() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "old-Password-1");
    let svc = s.service(&shipped_stack());
    // The user runs passwd: pam_unix asks the current and the new password, pam_dirseal follows.
    let o = {
        let _g = passwd_lock();
        pamtester_as(&u, &svc, &["chauthtok"], "old-Password-1\nnew-Password-2\nnew-Password-2\n")
    };
    assert!(ok(&o), "{}", show(&o));
    assert!(!ok(&pamtester(&svc, &u.name, &["authenticate"], "old-Password-1\n", &[])));
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "new-Password-2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "the home follows the new password");
}

#[test]
fn a_password_change_is_never_blocked_by_a_home_out_of_step() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = s.managed_user("home-Password-1");
    u.set_system_password("system-Password-1");
    let svc = s.service(&shipped_stack());
    let o = {
        let _g = passwd_lock();
        pamtester_as(&u, &svc, &["chauthtok"], "system-Password-1\nnew-Password-2\nnew-Password-2\n")
    };
    assert!(ok(&o), "the system decides: {}", show(&o));
    assert!(text(&o).contains("dirseal change-password"), "{}", show(&o));
    assert!(ok(&pamtester(&svc, &u.name, &["authenticate"], "new-Password-2\n", &[])));
    // The home kept its own password.
    let rec = s.ds().protector_of_dir(&u.home, Default::default()).unwrap();
    assert!(dirseal::protector::unlock(
        &rec,
        s.ds().config(),
        Some(&Passphrase::from_str_copy("home-Password-1")),
        dirseal::presence::Presence::AtDevice,
    )
    .is_ok());
}

#[test]
fn a_session_without_a_password_leaves_the_home_locked() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "pw-Password-1");
    // SSH keys, or another module, authenticate: pam_dirseal never sees a password.
    let stack = shipped_stack();
    let session: String = stack.lines().filter(|l| l.starts_with("session")).map(|l| format!("{l}\n")).collect();
    let svc = s.service(&format!("auth required pam_permit.so\n{session}"));
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session", "close_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u));
}

#[test]
fn unmanaged_users_and_foreign_homes_are_left_to_the_system() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let svc = s.service(&shipped_stack());
    let plain = User::new(s.fs.path());
    plain.set_system_password("unix-Password-1");
    assert!(ok(&pamtester(
        &svc,
        &plain.name,
        &["authenticate", "open_session", "close_session"],
        "unix-Password-1\n",
        &[]
    )));
    assert!(!ok(&pamtester(&svc, &plain.name, &["authenticate"], "not-it\n", &[])));
    assert!(!ok(&pamtester(&svc, "dst-no-such-user", &["authenticate"], "x\n", &[])));
    // A home encrypted by someone else (no record in this keystore, or no keystore at all) is
    // not ours either. The later keystore= argument wins.
    let foreign = in_step_user(&s, "pw-Password-1");
    let other_ks = tempfile::tempdir().unwrap();
    for ks in [other_ks.path().to_path_buf(), other_ks.path().join("missing")] {
        let elsewhere = s.service(&shipped_stack().replace("{args}", &format!("{{args}} keystore={}", ks.display())));
        let o = pamtester(&elsewhere, &foreign.name, &["authenticate", "open_session"], "pw-Password-1\n", &[]);
        assert!(ok(&o), "{}", show(&o));
        assert!(!unlocked(&foreign));
    }
    assert!(!other_ks.path().join("missing").exists(), "the module creates no keystore");
}

#[test]
#[cfg_attr(not(debug_assertions), ignore = "the test_panic argument exists only in debug builds")]
fn a_panic_is_caught_as_service_error() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = s.managed_user("pw");
    let svc = s.service("auth required {so} {args} test_panic\n");
    let o = pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[]);
    // pamtester exits 1 with the PAM error text; a panic unwinding into libpam would abort it.
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o).contains("Error in service module"), "PAM_SERVICE_ERR expected: {}", show(&o));
    // Without the switch the same stack goes on to pam_permit, so the failure above is the panic.
    let svc = s.service("auth required {so} {args}\nauth required pam_permit.so\n");
    assert!(ok(&pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[])));
}

#[test]
fn the_callers_environment_changes_nothing() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "env-Password-1");
    let empty = tempfile::tempdir().unwrap();
    let svc = s.service(&shipped_stack());
    let bogus_config = empty.path().join("config.toml");
    fs::write(&bogus_config, "keystore = \"/nonexistent\"\n").unwrap();
    let env = [
        ("DIRSEAL_CONFIG", bogus_config.to_str().unwrap()),
        ("DIRSEAL_KEYSTORE", empty.path().to_str().unwrap()),
        ("DIRSEAL_FAULT", "after-prepare"),
    ];
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "env-Password-1\n", &env);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
}

#[test]
fn a_keystore_entry_for_another_key_opens_nothing() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let a = in_step_user(&s, "pw-a-Password");
    let ds = s.ds();
    let policy = ds.policy_of(&a.home).unwrap();
    let pid = *policy.wrapped.keys().next().unwrap();
    let prec = ds.keystore().protector(&pid).unwrap();
    let pkey = dirseal::protector::unlock(
        &prec,
        ds.config(),
        Some(&Passphrase::from_str_copy("pw-a-Password")),
        dirseal::presence::Presence::AtDevice,
    )
    .unwrap();
    // Forge: the same policy id and protector, but wrapping a different master key. Every
    // cryptographic check of the file passes; only the key-identifier check can catch it.
    let mut forged = dirseal::keystore::PolicyRecord::new(policy.id, None);
    forged.add_protector(&pid, &pkey, &dirseal::secret::MasterKey::random());
    {
        let _l = ds.keystore().lock().unwrap();
        ds.keystore().save_policy(&forged).unwrap();
    }
    let svc = s.service(&shipped_stack());
    let o = pamtester(&svc, &a.name, &["authenticate", "open_session"], "pw-a-Password\n", &[]);
    assert!(ok(&o), "the system password still logs in: {}", show(&o));
    assert!(!unlocked(&a));
    // Not mistaken for a password out of step: the user is told to look at the home's status.
    assert!(text(&o).contains("could not be used") && !text(&o).contains("previous password"), "{}", show(&o));
}

#[test]
fn another_homes_policy_record_swapped_in_opens_nothing() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let a = in_step_user(&s, "pw-a-Password");
    let b = in_step_user(&s, "pw-b-Password");
    let ds = s.ds();
    let (pa, pb) = (ds.policy_of(&a.home).unwrap().id, ds.policy_of(&b.home).unwrap().id);
    // b's record, complete and valid, under a's name.
    let policies = s.keystore().join("policies");
    fs::copy(policies.join(format!("{pb}.json")), policies.join(format!("{pa}.json"))).unwrap();
    // a's system password is b's home password: still, b's record opens nothing for a.
    a.set_system_password("pw-b-Password");
    let svc = s.service(&shipped_stack());
    let o = pamtester(&svc, &a.name, &["authenticate", "open_session"], "pw-b-Password\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&a));
    // b is unaffected.
    assert!(ok(&pamtester(&svc, &b.name, &["authenticate", "open_session"], "pw-b-Password\n", &[])));
    assert!(unlocked(&b));
}

#[test]
fn standalone_logins_are_refused_for_locked_or_expired_accounts() {
    dirseal_testfs::needs_root!();
    use pam_dirseal::account::{standalone_login_allowed as allowed, Refusal};
    let s = Setup::new();
    let u = User::new(s.fs.path());
    u.set_system_password("gate-Password-1");
    assert_eq!(allowed(&u.name), Ok(()));
    accounts("usermod", &["-L", &u.name], None).unwrap();
    assert_eq!(allowed(&u.name), Err(Refusal::Locked(u.name.clone())));
    accounts("usermod", &["-U", &u.name], None).unwrap();
    assert_eq!(allowed(&u.name), Ok(()));
    accounts("chage", &["-E", "0", &u.name], None).unwrap();
    assert_eq!(allowed(&u.name), Err(Refusal::AccountExpired(u.name.clone())));
    accounts("chage", &["-E", "-1", "-d", "0", &u.name], None).unwrap();
    assert_eq!(allowed(&u.name), Err(Refusal::PasswordExpired(u.name.clone())));
    assert_eq!(allowed("dst-no-such-user"), Err(Refusal::NoEntry("dst-no-such-user".into())));
}

/// Leaves a conversion of `home` recorded mid-copy (or mid-move), as if it had been interrupted.
fn interrupted_conversion(home: &Path, mode: dirseal_migrate::Mode) {
    /// Stops the engine as soon as the copy (or move) starts, so the journal says "copying".
    struct Stopped(std::sync::atomic::AtomicBool);
    impl dirseal_migrate::Host for Stopped {
        fn progress(&self, p: &dirseal_migrate::Progress) {
            if matches!(p.phase, dirseal_migrate::Phase::Copying | dirseal_migrate::Phase::Moving) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        fn prepare_staging(
            &self,
            _: std::os::fd::BorrowedFd<'_>,
            _: &Path,
        ) -> Result<String, dirseal_migrate::HostError> {
            Ok("test".into())
        }
        fn ensure_unlocked(&self, _: &str, _: &Path) -> Result<(), dirseal_migrate::HostError> {
            Ok(())
        }
        fn is_encrypted(&self, _: &Path) -> Result<bool, dirseal_migrate::HostError> {
            Ok(false)
        }
        fn check_staging(
            &self,
            _: &str,
            _: std::os::fd::BorrowedFd<'_>,
            _: &Path,
        ) -> Result<(), dirseal_migrate::HostError> {
            Ok(())
        }
        fn exchange(
            &self,
            _: std::os::fd::BorrowedFd<'_>,
            _: &std::ffi::OsStr,
            _: std::os::fd::BorrowedFd<'_>,
            _: &std::ffi::OsStr,
        ) -> Result<(), dirseal_migrate::HostError> {
            Err(dirseal_migrate::HostError("not in this test".into()))
        }
        fn trim(&self, _: &Path) -> Result<(), dirseal_migrate::HostError> {
            Ok(())
        }
        fn should_stop(&self) -> bool {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }
    let wd = dirseal::convert::workdir_for(home).unwrap();
    let req = dirseal_migrate::Request {
        source: home,
        workdir: &wd,
        keep_backup: false,
        wipe: false,
        force: true,
        threads: std::num::NonZeroUsize::MIN,
        mode,
        direction: dirseal_migrate::Direction::Encrypt,
        schedule: dirseal_migrate::Schedule::Now,
    };
    let e = dirseal_migrate::convert(&req, &Stopped(Default::default())).unwrap_err();
    assert!(matches!(e, dirseal_migrate::MigrateError::Interrupted { .. }), "{e:?}");
    assert!(dirseal::convert::in_progress(home).unwrap());
}

#[test]
fn login_during_a_conversion_is_refused_only_after_authentication() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = User::new(s.fs.path());
    u.set_system_password("conv-Password-1");
    fs::write(u.home.join("file"), b"plaintext still").unwrap();
    interrupted_conversion(&u.home, dirseal_migrate::Mode::Copy);
    let svc = s.service(&shipped_stack());
    // A wrong password learns nothing about the conversion.
    let o = pamtester(&svc, &u.name, &["authenticate", "acct_mgmt"], "wrong-Password\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert!(!text(&o).contains("in progress"), "{}", show(&o));
    // The right one passes authentication and meets the refusal in the account stack, which
    // logins that skip auth (SSH keys) go through too.
    let o = pamtester(&svc, &u.name, &["authenticate"], "conv-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    let o = pamtester(&svc, &u.name, &["authenticate", "acct_mgmt"], "conv-Password-1\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert!(text(&o).contains("Encryption of your home directory is in progress"), "{}", show(&o));
    // The admin allows it: the module steps aside and the rest of the stack decides.
    fs::write(s.config(), format!("{FAST_CONFIG}[pam]\nallow_login_during_conversion = true\n")).unwrap();
    let o = pamtester(&svc, &u.name, &["authenticate", "acct_mgmt", "open_session"], "conv-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
}

#[test]
fn login_during_a_move_is_refused_even_when_logins_during_conversions_are_allowed() {
    let mut s = Setup::new();
    let u = User::new(s.fs.path());
    u.set_system_password("move-Password-1");
    fs::write(u.home.join("file"), b"half of the home may be in the staging directory").unwrap();
    interrupted_conversion(&u.home, dirseal_migrate::Mode::Move);
    fs::write(s.config(), format!("{FAST_CONFIG}[pam]\nallow_login_during_conversion = true\n")).unwrap();
    let svc = s.service(&shipped_stack());
    let o = pamtester(&svc, &u.name, &["authenticate", "acct_mgmt", "open_session"], "move-Password-1\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert!(text(&o).contains("cannot be used until the move has finished"), "{}", show(&o));
}

#[test]
fn account_management_ignores_everyone_else() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = s.managed_user("pw");
    let plain = User::new(s.fs.path());
    // pam_dirseal alone answers PAM_IGNORE; a stack of only ignores fails, so add pam_permit and
    // check that pam_deny after it would still decide.
    let permit = s.service("account required {so} {args}\naccount required pam_permit.so\n");
    let deny = s.service("account required {so} {args}\naccount required pam_deny.so\n");
    for name in [&u.name, &plain.name] {
        assert!(ok(&pamtester(&permit, name, &["acct_mgmt"], "", &[])));
        assert!(!ok(&pamtester(&deny, name, &["acct_mgmt"], "", &[])));
    }
}

#[test]
fn unlock_only_never_locks() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "only-Password-1");
    let svc = s.service(&session_args(&shipped_stack(), "unlock_only"));
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session", "close_session"], "only-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "unlock_only must leave the home unlocked at the last logout");
}

/// A managed user whose home also opens with a FIDO2 protector of theirs, on a software key the
/// root-owned config names; the key is returned (dropping it unplugs it).
fn managed_user_with_key(s: &Setup, password: &'static str) -> (User, dirseal_softfido::SoftFido) {
    let sock = s.etc.path().join(format!("key-{}.sock", rand_hex()));
    let key = dirseal_softfido::SoftFido::start(&sock, dirseal_softfido::Options::default()).unwrap();
    let cfg = fs::read_to_string(s.config()).unwrap();
    fs::write(s.config(), format!("{cfg}[fido2]\ntouch_timeout_secs = 2\nsocket_devices = [{sock:?}]\n")).unwrap();
    let u = s.managed_user(password);
    let mut ds = s.ds();
    let policy = ds.policy_of(&u.home).unwrap();
    let kind = NewKind::named("fido2", KindOptions::default()).unwrap();
    let n = NewProtector { name: "yubikey".into(), uid: Some(u.uid), kind };
    let pick = dirseal::ops::Pick { protector: None };
    ds.add_protector_to_policy(&policy.id, pick, ProtectorChoice::New(n), &mut Scripted::new(&[password])).unwrap();
    assert_eq!(key.touches(), 2, "making the credential and its first hmac-secret");
    (u, key)
}

/// The stack docs/pam.md gives for security-key logins: a `standalone` line before `pam_unix`,
/// then the usual one after it.
const KEY_STACK: &str = "auth sufficient {so} {args} standalone\n\
                         auth [success=1 default=ignore] pam_unix.so nullok nodelay\n\
                         auth requisite pam_deny.so\n\
                         auth required pam_permit.so\n\
                         auth optional {so} {args}\n\
                         account required pam_permit.so\n\
                         session optional {so} {args}\n\
                         session required pam_permit.so\n";

#[test]
fn security_key_logs_in_without_a_password_and_its_absence_costs_nothing() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let (u, key) = managed_user_with_key(&s, "pw");
    u.set_system_password("pw");
    let svc = s.service(KEY_STACK);
    // Key present: touched, nothing typed (stdin is empty: any prompt would fail the login).
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(text(&o).contains("Touch your security key (yubikey)."), "{}", show(&o));
    assert!(!text(&o).contains("assword"), "nothing may be asked: {}", show(&o));
    assert!(unlocked(&u));
    assert_eq!(key.touches(), 3);
    let o = pamtester(&svc, &u.name, &["close_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u));

    // Key present but not touched: one wait of the configured timeout, then the password, and the
    // pass after pam_unix does not wait for the key again.
    key.set_presence(dirseal_softfido::Presence::Withhold);
    let t = std::time::Instant::now();
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "pw\n", &[]);
    let took = t.elapsed();
    assert!(ok(&o), "{}", show(&o));
    assert!(took >= std::time::Duration::from_secs(2) && took < std::time::Duration::from_secs(5), "{took:?}");
    assert_eq!(key.presence_requests(), 4, "asked once, not twice");
    assert!(unlocked(&u), "the password opened it");
    assert!(ok(&pamtester(&svc, &u.name, &["close_session"], "", &[])));
    key.set_presence(dirseal_softfido::Presence::Grant);

    // A locked account: the key logs nobody in, and is not even asked.
    accounts("usermod", &["-L", &u.name], None).unwrap();
    let o = pamtester(&svc, &u.name, &["authenticate"], "", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert_eq!(key.presence_requests(), 4);
    accounts("usermod", &["-U", &u.name], None).unwrap();

    // Key unplugged: straight to the password prompt, no touch announced, no waiting.
    drop(key);
    let t = std::time::Instant::now();
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "pw\n", &[]);
    let took = t.elapsed();
    assert!(ok(&o), "{}", show(&o));
    assert!(!text(&o).contains("Touch your security key"), "{}", show(&o));
    assert!(took < std::time::Duration::from_secs(3), "{took:?}");
    assert!(unlocked(&u));
}

/// A user whose home is opened by their own TPM protector with `pin` (on `tpm`), locked.
fn managed_tpm_user(s: &Setup, tpm: &dirseal_testfs::Swtpm, pin: &'static str) -> User {
    let mut f = fs::OpenOptions::new().append(true).open(s.config()).unwrap();
    writeln!(f, "[tpm2]\ntcti = \"{}\"", tpm.tcti()).unwrap();
    let u = User::new(s.fs.path());
    let mut ds = s.ds();
    let kind = NewKind::named("tpm2", KindOptions::default()).unwrap();
    let n = NewProtector { name: u.name.as_str().into(), uid: Some(u.uid), kind };
    ds.encrypt(&u.home, ProtectorChoice::New(n), &mut Scripted::new(&[pin])).unwrap();
    fs::write(u.home.join("diary.txt"), b"dear diary").unwrap();
    assert!(ds.lock(&u.home, false).unwrap().locked);
    u
}

fn tpm_tries_left(tpm: &dirseal_testfs::Swtpm) -> u32 {
    let mut t = dirseal::tpm2::Tpm::open(&tpm.tcti().parse().unwrap()).unwrap();
    t.da_status().unwrap().tries_left()
}

/// pamtester as a login from `rhost`.
fn pamtester_from(rhost: &str, service: &str, user: &str, ops: &[&str], stdin: &str) -> Output {
    let mut c = Command::new("pamtester");
    c.arg("-I").arg(format!("rhost={rhost}"));
    run_pamtester(c, service, user, ops, stdin, &[])
}

#[test]
fn tpm_pin_at_login_costs_one_try_when_wrong_and_is_refused_over_the_network_when_tries_are_few() {
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let mut s = Setup::new();
    let u = managed_tpm_user(&s, &tpm, "2468");
    u.set_system_password("2468");
    let svc = s.service(&shipped_stack());
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "2468\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "the accepted password is the TPM PIN");
    s.ds().lock(&u.home, false).unwrap();
    assert_eq!(tpm_tries_left(&tpm), 3, "a right PIN costs nothing");

    // The system accepts a password that is not the PIN: the login goes on, the home stays
    // locked, and the TPM counts exactly one failure.
    u.set_system_password("other-Password-1");
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "other-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u));
    assert_eq!(tpm_tries_left(&tpm), 2);
    // A password the system refuses never reaches the TPM.
    assert!(!ok(&pamtester(&svc, &u.name, &["authenticate"], "wrong-Password\n", &[])));
    assert_eq!(tpm_tries_left(&tpm), 2);

    u.set_system_password("2468");
    // 2 tries left, the last tpm2.min_local_tries (2), kept for the device: a network login does
    // not try the PIN (the TPM is not asked); at the device it does.
    let o = pamtester_from("192.0.2.7", &svc, &u.name, &["authenticate", "open_session"], "2468\n");
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u));
    assert_eq!(tpm_tries_left(&tpm), 2);
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "2468\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
    assert_eq!(tpm_tries_left(&tpm), 2);
}

/// The handheld stack docs/pam.md gives: our two profiles with Debian's unix one, as
/// pam-auth-update writes them (the `standalone` and `pin_accounts` lines before `pam_unix`).
fn handheld_stack() -> String {
    let stack = pam_auth_update_with(true, &["dirseal-pin"]);
    let first = |kind: &str| stack.lines().find(|l| l.starts_with(kind)).unwrap_or_default().to_string();
    assert!(first("auth").contains("standalone"), "{stack}");
    assert!(first("password").contains("pin_accounts"), "{stack}");
    stack
}

/// A PIN-login user (`dirseal pin-login enable`) whose home opens with their own TPM PIN
/// protector (`pin`, on `tpm`) and, with `key`, a touch of a software security key of theirs;
/// locked. The key is returned (dropping it unplugs it).
fn pin_account(
    s: &Setup,
    tpm: &dirseal_testfs::Swtpm,
    pin: &'static str,
    key: bool,
) -> (User, Option<dirseal_softfido::SoftFido>) {
    let mut cfg = fs::read_to_string(s.config()).unwrap();
    cfg.push_str(&format!("[tpm2]\ntcti = \"{}\"\n", tpm.tcti()));
    let key = key.then(|| {
        let sock = s.etc.path().join(format!("key-{}.sock", rand_hex()));
        cfg.push_str(&format!("[fido2]\ntouch_timeout_secs = 2\nsocket_devices = [{sock:?}]\n"));
        dirseal_softfido::SoftFido::start(&sock, dirseal_softfido::Options::default()).unwrap()
    });
    fs::write(s.config(), cfg).unwrap();
    let u = User::new(s.fs.path());
    let mut ds = s.ds();
    let kind = NewKind::named("tpm2", KindOptions::default()).unwrap();
    let n = NewProtector { name: "tpm".into(), uid: Some(u.uid), kind };
    let (policy, _) = ds.encrypt(&u.home, ProtectorChoice::New(n), &mut Scripted::new(&[pin])).unwrap();
    if key.is_some() {
        let kind = NewKind::named("fido2", KindOptions::default()).unwrap();
        let n = NewProtector { name: "yubikey".into(), uid: Some(u.uid), kind };
        let pick = dirseal::ops::Pick { protector: None };
        ds.add_protector_to_policy(&policy.id, pick, ProtectorChoice::New(n), &mut Scripted::new(&[pin])).unwrap();
    }
    fs::write(u.home.join("diary.txt"), b"dear diary").unwrap();
    assert!(ds.lock(&u.home, false).unwrap().locked);
    {
        let _g = passwd_lock();
        ds.enable_pin_login(&u.name).unwrap();
    }
    (u, key)
}

/// The password field of `user` in /etc/shadow.
fn shadow_field(user: &str) -> String {
    let shadow = fs::read_to_string("/etc/shadow").unwrap();
    let line = shadow.lines().find(|l| l.split(':').next() == Some(user)).unwrap().to_string();
    line.split(':').nth(1).unwrap().to_string()
}

#[test]
fn handheld_login_a_key_touch_else_the_tpm_pin() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let mut s = Setup::new();
    let (u, key) = pin_account(&s, &tpm, "2468", true);
    let key = key.unwrap();
    assert_eq!(shadow_field(&u.name), "*", "a PIN-login account keeps no hash of anything");
    assert!(s.ds().is_pin_login(&u.name));
    let svc = s.service(&handheld_stack());
    let login = ["authenticate", "acct_mgmt", "open_session"];

    // Key plugged in: one touch, nothing asked (stdin is empty: any prompt would fail).
    let o = pamtester(&svc, &u.name, &login, "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(text(&o).contains("Touch your security key (yubikey)."), "{}", show(&o));
    assert!(!text(&o).contains("PIN") && !text(&o).contains("assword"), "nothing may be asked: {}", show(&o));
    assert!(unlocked(&u));
    assert!(ok(&pamtester(&svc, &u.name, &["close_session"], "", &[])));
    assert!(!unlocked(&u));

    // Key unplugged: the TPM PIN, with the tries left; the right one costs nothing.
    drop(key);
    let o = pamtester(&svc, &u.name, &login, "2468\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(text(&o).contains(&format!("PIN for {} (3 tries left):", u.name)), "{}", show(&o));
    assert!(!text(&o).contains("Touch"), "{}", show(&o));
    assert!(unlocked(&u), "the PIN opened the home");
    assert_eq!(tpm_tries_left(&tpm), 3);
    assert!(ok(&pamtester(&svc, &u.name, &["close_session"], "", &[])));
    assert!(!unlocked(&u));

    // An empty PIN spends nothing and goes on to the password, which this account has none of.
    let o = pamtester(&svc, &u.name, &["authenticate"], "\n\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert_eq!(tpm_tries_left(&tpm), 3);

    // Locked accounts are refused before the TPM is asked: no prompt, no try spent.
    for (lock, unlock) in [("usermod", "usermod"), ("passwd", "passwd")] {
        let (l, ul) = if lock == "usermod" { ("-L", "-U") } else { ("-l", "-u") };
        accounts(lock, &[l, &u.name], None).unwrap();
        assert_eq!(shadow_field(&u.name), "!*", "{lock} {l} still locks a PIN-login account");
        let o = pamtester(&svc, &u.name, &["authenticate"], "2468\n", &[]);
        assert!(!ok(&o), "{lock} {l}: {}", show(&o));
        assert!(!text(&o).contains("PIN for"), "{}", show(&o));
        assert_eq!(tpm_tries_left(&tpm), 3);
        assert!(!unlocked(&u));
        // `passwd -u` refuses to leave an account without a password; put `*` back as usermod does.
        if unlock == "usermod" {
            accounts("usermod", &[ul, &u.name], None).unwrap();
        } else {
            accounts("usermod", &["-p", "*", &u.name], None).unwrap();
        }
        assert_eq!(shadow_field(&u.name), "*");
    }
    // An expired account too.
    accounts("chage", &["-E", "0", &u.name], None).unwrap();
    assert!(!ok(&pamtester(&svc, &u.name, &["authenticate"], "2468\n", &[])));
    assert_eq!(tpm_tries_left(&tpm), 3);
    accounts("chage", &["-E", "-1", &u.name], None).unwrap();
    assert!(ok(&pamtester(&svc, &u.name, &["authenticate"], "2468\n", &[])));
}

#[test]
fn three_wrong_pins_are_refused_with_the_tries_left_shown_each_time() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let mut s = Setup::new();
    let (u, _) = pin_account(&s, &tpm, "2468", false);
    let svc = s.service(&handheld_stack());
    for (left, shown) in [(3, "3 tries left"), (2, "2 tries left"), (1, "1 try left")] {
        assert_eq!(tpm_tries_left(&tpm), left);
        let o = pamtester(&svc, &u.name, &["authenticate"], "1111\n", &[]);
        assert!(!ok(&o), "{}", show(&o));
        assert!(text(&o).contains(&format!("PIN for {} ({shown}):", u.name)), "{}", show(&o));
        assert!(text(&o).contains("Wrong PIN"), "{}", show(&o));
        // One try per wrong PIN, and no password prompt after it (`auth_err=die`).
        assert!(!text(&o).contains("assword"), "{}", show(&o));
        assert_eq!(tpm_tries_left(&tpm), left - 1);
    }
    // In lockout: the right PIN is not even asked for.
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "2468\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert!(!text(&o).contains("PIN for"), "{}", show(&o));
    assert!(text(&o).contains("locked out"), "{}", show(&o));
    assert!(!unlocked(&u));
}

#[test]
fn passwd_changes_the_pin_of_a_pin_account_and_still_changes_passwords() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let mut s = Setup::new();
    let (u, _) = pin_account(&s, &tpm, "2468", false);
    let plain = in_step_user(&s, "old-Password-1");
    let svc = s.service(&handheld_stack());

    // The user runs passwd: the current PIN, then the new one twice; no password involved.
    let o = {
        let _g = passwd_lock();
        pamtester_as(&u, &svc, &["chauthtok"], "2468\n1357\n1357\n")
    };
    assert!(ok(&o), "{}", show(&o));
    assert!(text(&o).contains(&format!("Current PIN for {} (3 tries left):", u.name)), "{}", show(&o));
    assert_eq!(shadow_field(&u.name), "*", "still no hash");
    let o = pamtester(&svc, &u.name, &["authenticate"], "2468\n", &[]);
    assert!(!ok(&o), "the old PIN is refused: {}", show(&o));
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "1357\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "the new PIN opens the home");

    // A wrong current PIN changes nothing (and costs its one try).
    let before = tpm_tries_left(&tpm);
    let o = {
        let _g = passwd_lock();
        pamtester_as(&u, &svc, &["chauthtok"], "0000\n9999\n9999\n")
    };
    assert!(!ok(&o), "{}", show(&o));
    assert!(text(&o).contains("Wrong PIN"), "{}", show(&o));
    assert_eq!(tpm_tries_left(&tpm), before - 1);

    // Everyone else still changes their password through pam_unix, and the home follows.
    let o = {
        let _g = passwd_lock();
        pamtester_as(&plain, &svc, &["chauthtok"], "old-Password-1\nnew-Password-2\nnew-Password-2\n")
    };
    assert!(ok(&o), "{}", show(&o));
    assert!(!ok(&pamtester(&svc, &plain.name, &["authenticate"], "old-Password-1\n", &[])));
    let o = pamtester(&svc, &plain.name, &["authenticate", "open_session"], "new-Password-2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&plain), "the home follows the new password");
}

#[test]
fn a_tpm_pin_equal_to_the_login_password_is_refused_unless_allowed_and_then_warned_about() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let s = Setup::new();
    let mut f = fs::OpenOptions::new().append(true).open(s.config()).unwrap();
    writeln!(f, "[tpm2]\ntcti = \"{}\"", tpm.tcti()).unwrap();
    let u = s.managed_user("home-Password-1");
    u.set_system_password("24682468");
    let mut ds = s.ds();
    let policy = ds.policy_of(&u.home).unwrap();
    let pick = dirseal::ops::Pick { protector: None };
    let tpm_kind = |allow| {
        NewKind::named(
            "tpm2",
            KindOptions::new(if allow { vec![("allow_password_pin".into(), "true".into())] } else { vec![] }),
        )
    };
    let n = NewProtector { name: "tpm".into(), uid: Some(u.uid), kind: tpm_kind(false).unwrap() };
    let e = ds
        .add_protector_to_policy(
            &policy.id,
            pick,
            ProtectorChoice::New(n),
            &mut Scripted::new(&["home-Password-1", "24682468"]),
        )
        .unwrap_err();
    assert!(matches!(&e, dirseal::ops::OpsError::PinIsLoginPassword { user } if *user == u.name), "{e}");
    assert!(e.to_string().contains("offline"), "{e}");
    // Another PIN is fine; so is this one when asked for.
    let n = NewProtector { name: "tpm".into(), uid: Some(u.uid), kind: tpm_kind(false).unwrap() };
    ds.create_protector(&n, &mut Scripted::new(&["1357"])).unwrap();
    let n = NewProtector { name: "tpm".into(), uid: Some(u.uid), kind: tpm_kind(true).unwrap() };
    ds.add_protector_to_policy(
        &policy.id,
        pick,
        ProtectorChoice::New(n),
        &mut Scripted::new(&["home-Password-1", "24682468"]),
    )
    .unwrap();
    // `status` warns while the account's password has a hash in shadow...
    let st = ds.dir_status(&u.home).unwrap();
    assert_eq!(st.warnings.len(), 1, "{:?}", st.warnings);
    assert!(st.warnings[0].contains("testable offline"), "{:?}", st.warnings);
    // ... and the login with it works as before: the password, then the PIN with it.
    let mut s = s;
    let svc = s.service(&shipped_stack());
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "24682468\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
    // As a PIN-login account the hash is gone, and so is the warning.
    {
        let _g = passwd_lock();
        s.ds().enable_pin_login(&u.name).unwrap();
    }
    assert_eq!(shadow_field(&u.name), "*");
    assert!(s.ds().dir_status(&u.home).unwrap().warnings.is_empty());
}

#[test]
fn pin_login_needs_a_tpm_pin_protector_of_the_users_own() {
    dirseal_testfs::needs_root!();
    let s = Setup::new();
    let u = s.managed_user("home-Password-1");
    u.set_system_password("home-Password-1");
    let e = s.ds().enable_pin_login(&u.name).unwrap_err();
    assert!(matches!(e, dirseal::ops::OpsError::NoPinProtector { .. }), "{e}");
    assert_ne!(shadow_field(&u.name), "*", "nothing was changed");
    assert!(!s.ds().is_pin_login(&u.name));
}

/// The stack of the shipped profiles with first-login homes on (`dirseal` and `dirseal-mkhome`).
fn mkhome_stack() -> String {
    let stack = pam_auth_update_with(true, &["dirseal-mkhome"]);
    assert!(stack.contains("{so} {args} mkhome"), "{stack}");
    stack
}

fn lsattr_encrypted(dir: &Path) -> bool {
    let o = Command::new("lsattr").arg("-d").arg(dir).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    out.split_whitespace().next().is_some_and(|flags| flags.contains('E'))
}

/// A user's protectors in the keystore.
fn protectors_of(s: &Setup, uid: u32) -> Vec<dirseal::keystore::ProtectorRecord> {
    let ds = s.ds();
    let all = ds.keystore().protectors().unwrap();
    all.into_iter().filter_map(|(_, r)| r.ok()).filter(|r| r.uid == Some(uid)).collect()
}

/// `mkhome`: the first login of a user without a home creates it encrypted, from the skeleton,
/// with a protector from the login password, and the session starts with it unlocked; the last
/// logout locks it; the second login just unlocks it (no second protector).
#[test]
fn mkhome_creates_a_missing_home_encrypted_at_the_first_login() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = User::new(s.fs.path());
    fs::remove_dir(&u.home).unwrap();
    u.set_system_password("first-Password-1");
    let svc = s.service(&mkhome_stack());
    let o = pamtester(&svc, &u.name, &["authenticate", "acct_mgmt", "open_session"], "first-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(lsattr_encrypted(&u.home), "lsattr -d must show E: {}", show(&o));
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(&u.home).unwrap();
    let gid = nix::unistd::User::from_name(&u.name).unwrap().unwrap().gid.as_raw();
    assert_eq!((meta.uid(), meta.gid()), (u.uid, gid));
    let defs = dirseal::home::LoginDefs::read(Path::new("/etc/login.defs"));
    assert_eq!(meta.mode() & 0o7777, defs.home_mode);
    // Unlocked, with /etc/skel's files (as the user's, with their modes).
    let skel = fs::read_dir("/etc/skel").unwrap().count();
    assert_eq!(fs::read_dir(&u.home).unwrap().count(), skel);
    for e in fs::read_dir("/etc/skel").unwrap() {
        let e = e.unwrap();
        let copy = fs::symlink_metadata(u.home.join(e.file_name())).unwrap();
        assert_eq!(copy.mode(), e.metadata().unwrap().mode(), "{:?}", e.file_name());
        assert_eq!(copy.uid(), u.uid);
    }
    let mine = protectors_of(&s, u.uid);
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].name, u.name);
    fs::write(u.home.join("diary.txt"), b"dear diary").unwrap();
    // (That session's pamtester is gone: the next login drops it as dead. Lock as root.)
    s.ds().lock(&u.home, false).unwrap();
    assert!(!unlocked(&u));
    // The second login unlocks it and makes nothing new.
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session", "close_session"], "first-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert_eq!(protectors_of(&s, u.uid).len(), 1);
    // Two session lines of the module (mkhome's and the plain one) ended one session: locked.
    assert!(!unlocked(&u), "the last logout must lock");
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "first-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
    s.ds().lock(&u.home, false).unwrap();
}

/// `mkhome` never makes a home for a system account, nor without a password (a key login), nor a
/// plaintext one when the filesystem cannot encrypt: the login goes on without it.
#[test]
fn mkhome_leaves_system_accounts_and_passwordless_logins_alone() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let svc = s.service(&mkhome_stack());
    // A system account (useradd -r: a uid below UID_MIN).
    let name = format!("dss{}", rand_hex());
    let home = s.fs.path().join(&name);
    accounts("useradd", &["-r", "-M", "-d", home.to_str().unwrap(), "-s", "/usr/sbin/nologin", &name], None).unwrap();
    let sys = scopeguard(&name);
    accounts("chpasswd", &[], Some(&format!("{name}:sys-Password-1\n"))).unwrap();
    let o = pamtester(&svc, &name, &["authenticate", "open_session", "close_session"], "sys-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!home.exists(), "a system account got a home");
    drop(sys);
    // No password through the stack.
    let u = User::new(s.fs.path());
    fs::remove_dir(&u.home).unwrap();
    let session = mkhome_stack().lines().filter(|l| l.starts_with("session")).collect::<Vec<_>>().join("\n");
    let nopw = s.service(&format!("auth required pam_permit.so\n{session}\n"));
    let o = pamtester(&nopw, &u.name, &["authenticate", "open_session", "close_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!u.home.exists());
    assert!(text(&o).contains("was not created"), "{}", show(&o));
    // A filesystem without the encrypt feature.
    let plain = TestFs::with(dirseal_testfs::Options { encrypt: false, ..Default::default() });
    let v = User::new(plain.path());
    fs::remove_dir(&v.home).unwrap();
    v.set_system_password("plain-Password-1");
    let o = pamtester(&svc, &v.name, &["authenticate", "open_session", "close_session"], "plain-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!v.home.exists(), "no plaintext home may be made");
    assert!(protectors_of(&s, v.uid).is_empty(), "nothing may be created on a filesystem that cannot encrypt");
}

/// Removes the account when dropped.
struct Account(String);
impl Drop for Account {
    fn drop(&mut self) {
        let _ = accounts("userdel", &[&self.0], None);
    }
}
fn scopeguard(name: &str) -> Account {
    Account(name.to_string())
}

/// A home made by `dirseal home create` (the library call the CLI makes) opens at a login with
/// the password its protector was given.
#[test]
fn a_home_created_encrypted_is_unlocked_by_a_login() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = User::new(s.fs.path());
    fs::remove_dir(&u.home).unwrap();
    u.set_system_password("made-Password-1");
    let acct = dirseal::home::Account::named(&u.name).unwrap();
    let kind = NewKind::named("password", KindOptions::default()).unwrap();
    let options = dirseal::home::Options { recovery_key: Some(false), ..Default::default() };
    let made =
        dirseal::home::create(&mut s.ds(), &acct, kind, &options, &mut Scripted::new(&["made-Password-1"])).unwrap();
    assert_eq!(made.home, u.home);
    fs::write(u.home.join("diary.txt"), b"dear diary").unwrap();
    s.ds().lock(&u.home, false).unwrap();
    assert!(!unlocked(&u));
    let svc = s.service(&shipped_stack());
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "made-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
    s.ds().lock(&u.home, false).unwrap();
}

#[test]
fn after_a_decrypt_the_user_logs_in_by_password_and_the_module_leaves_the_home_alone() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let svc = s.service(&shipped_stack());
    let u = in_step_user(&s, "pw-Password-1");
    let mut ds = s.ds();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let progress = |_: &dirseal::ui::Progress| {};
    let hooks = dirseal::convert::Hooks { progress: &progress, stop: &stop };
    // The home is locked: the plan unlocks it with the password first.
    let mut ui = Scripted::new(&["pw-Password-1"]).yes();
    let plan = dirseal::decrypt::plan(&ds, &u.home, Default::default(), Default::default(), &mut ui, &hooks).unwrap();
    let dirseal::decrypt::Plan::New(plan) = plan else { panic!("a new decrypt was expected") };
    let done = plan.run(&mut ds, false, &mut ui, &hooks).unwrap();
    assert_eq!(done.outcome.state, dirseal_migrate::State::Done);
    assert!(dirseal::fscrypt::get_policy(&u.home).unwrap().is_none());
    assert!(ds.keystore().policies().unwrap().is_empty() && ds.keystore().protectors().unwrap().is_empty());

    let o = pamtester(&svc, &u.name, &["authenticate", "open_session", "close_session"], "pw-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    // Nothing was unlocked or locked: the module found no policy and said nothing.
    assert!(!text(&o).contains("dirseal"), "{}", show(&o));
    assert_eq!(fs::read(u.home.join("diary.txt")).unwrap(), b"dear diary");
    assert!(!ok(&pamtester(&svc, &u.name, &["authenticate"], "not-it\n", &[])));
    assert!(ds.keystore().policies().unwrap().is_empty(), "no record was made at login");
}

/// The TPM and FIDO2 libraries (sonames): only the helpers `dirseal-tpm2` and `dirseal-fido2`
/// link them, never the module (issue 29, docs/architecture.md "Hardware helpers").
const HARDWARE: &[&str] = &["libtss2-", "libfido2.so", "libcbor.so", "libudev.so"];

/// Every library the dynamic loader loaded for a run (`LD_DEBUG=files`: at start and by dlopen).
fn loaded_libraries(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| l.split("file=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The file behind `soname` as the system's loader cache resolves it, symlinks followed.
fn system_library(soname: &str) -> PathBuf {
    let cache = Command::new("ldconfig").arg("-p").output().expect("ldconfig -p");
    let text = String::from_utf8_lossy(&cache.stdout);
    let path = text
        .lines()
        .find_map(|l| {
            let (name, rest) = l.trim().split_once(' ')?;
            (name == soname).then(|| rest.rsplit(" => ").next().map(str::to_string)).flatten()
        })
        .unwrap_or_else(|| panic!("{soname} is not installed here"));
    fs::canonicalize(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn a_password_login_loads_no_tpm_or_fido2_library_and_works_without_them() {
    dirseal_testfs::needs_root!();
    let mut s = Setup::new();
    let u = in_step_user(&s, "maps-Password-1");
    let svc = s.service(&shipped_stack());
    let ops = ["authenticate", "open_session", "close_session"];
    let o = pamtester(&svc, &u.name, &ops, "maps-Password-1\n", &[("LD_DEBUG", "files")]);
    assert!(ok(&o), "{}", show(&o));
    let libs = loaded_libraries(&o.stderr);
    assert!(libs.iter().any(|l| l.ends_with("libpam_dirseal.so")), "the module must be among the loads: {libs:?}");
    let hw: Vec<_> = libs.iter().filter(|l| HARDWARE.iter().any(|h| l.contains(h))).collect();
    assert!(hw.is_empty(), "a password login loaded {hw:?}");

    // On a machine without the libraries (a mount namespace where they are empty files), the
    // same login unlocks the home.
    let empty = s.etc.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let mut script = String::from("set -e\n");
    for lib in ["libtss2-esys.so.0", "libfido2.so.1"] {
        script.push_str(&format!("mount --bind {} {}\n", empty.display(), system_library(lib).display()));
    }
    script.push_str("exec \"$@\"\n");
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh", "pamtester"]);
    let o = run_pamtester(c, &svc, &u.name, &["authenticate", "open_session"], "maps-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "the login must unlock the home without the TPM and FIDO2 libraries");
}

/// Issue 41 (1): six logins from the network at once, each answering a wrong PIN at once (as
/// sshd sends a password). All were shown "3 tries left" and all were tried, locking the TPM.
/// The check of the tries kept for the device and the TPM's answer now happen under one
/// machine-wide lock: only the tries above `min_local_tries` (2 of 3) can be spent from there.
#[test]
fn simultaneous_network_logins_leave_the_tries_kept_for_the_device() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let mut s = Setup::new();
    let (u, _) = pin_account(&s, &tpm, "2468", false);
    let svc = s.service(&handheld_stack());
    // Six, not four: without the lock, swtpm (no resource manager) refuses some of them as busy,
    // and the race must still show.
    let logins: Vec<_> = (0..6)
        .map(|_| {
            let mut c = Command::new("pamtester");
            c.args(["-I", "rhost=203.0.113.7"]);
            start_pamtester(c, &svc, &u.name, &["authenticate"], "1111\n", &[])
        })
        .collect();
    let outs: Vec<Output> = logins.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    assert!(outs.iter().all(|o| !ok(o)), "{}", outs.iter().map(show).collect::<Vec<_>>().join("\n"));
    assert_eq!(tpm_tries_left(&tpm), 2, "{}", outs.iter().map(show).collect::<Vec<_>>().join("\n"));
    // The person at the device still has their tries, and the right PIN logs them in.
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "2468\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
}

/// Issue 41 (2): `su` (or passwd, pkexec) run from an SSH session is no login at the device,
/// whatever terminal it names: the process's logind session decides, and a remote one keeps the
/// device's tries. Here the stack runs in no session at all and names a pseudo-terminal, as `su`
/// does from SSH on a machine without logind: elsewhere too.
#[test]
fn a_pin_login_from_a_pseudo_terminal_outside_a_seat_session_keeps_the_devices_tries() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let mut s = Setup::new();
    let (u, _) = pin_account(&s, &tpm, "2468", false);
    let svc = s.service(&handheld_stack());
    let su = |stdin: &str| {
        let mut c = Command::new("pamtester");
        c.args(["-I", "tty=/dev/pts/3"]);
        run_pamtester(c, &svc, &u.name, &["authenticate"], stdin, &[])
    };
    assert!(!ok(&su("1111\n")));
    assert_eq!(tpm_tries_left(&tpm), 2);
    let o = su("1111\n");
    assert!(!ok(&o), "{}", show(&o));
    assert!(text(&o).contains("kept for the person at the device"), "{}", show(&o));
    assert_eq!(tpm_tries_left(&tpm), 2, "{}", show(&o));
}

/// Issue 41 (8): an SSH login raised a touch request on the key at the machine, and a touch there
/// logged the remote user in. A touch-only key never logs anyone in from elsewhere: the login
/// goes on to the PIN (none given here) and fails.
#[test]
fn a_network_login_never_asks_for_a_key_touch() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let mut s = Setup::new();
    let (u, key) = pin_account(&s, &tpm, "2468", true);
    let svc = s.service(&handheld_stack());
    let o = pamtester_from("203.0.113.7", &svc, &u.name, &["authenticate", "open_session"], "");
    assert!(!ok(&o), "{}", show(&o));
    assert!(!text(&o).contains("Touch"), "{}", show(&o));
    assert!(!unlocked(&u));
    // At the device the same key still logs in with one touch.
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "", &[]);
    assert!(ok(&o) && text(&o).contains("Touch your security key"), "{}", show(&o));
    assert!(unlocked(&u));
    drop(key);
}
