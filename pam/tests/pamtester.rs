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
use dirseal::ui::{SecretPrompt, Ui, UiError};
use dirseal_testfs::TestFs;

const FAST_CONFIG: &str = "[argon2]\ntime_cost = 1\nmemory_kib = 1024\nparallelism = 1\n";

/// Answers secrets from a list, in order.
struct Answers(Vec<&'static str>);

impl Ui for Answers {
    fn secret(&mut self, _: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        if self.0.is_empty() {
            return Err(UiError::NoInput { hint: "test".into() });
        }
        Ok(Passphrase::from_str_copy(self.0.remove(0)))
    }
}

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

fn rand_hex() -> String {
    let mut b = [0u8; 5];
    fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A system user that exists for the test only.
struct User {
    name: String,
    uid: u32,
    home: PathBuf,
}

impl User {
    fn new(home_parent: &Path) -> User {
        let name = format!("dst{}", rand_hex());
        let uid = 200_000 + u32::from_str_radix(&name[3..8], 16).unwrap() % 700_000;
        let home = home_parent.join(&name);
        fs::create_dir(&home).unwrap();
        let args = ["-M", "-d", home.to_str().unwrap(), "-u", &uid.to_string(), "-U", "-s", "/usr/sbin/nologin", &name];
        accounts("useradd", &args, None).unwrap();
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
        User { name, uid, home }
    }

    /// Sets the system (pam_unix) password.
    fn set_system_password(&self, pw: &str) {
        accounts("chpasswd", &[], Some(&format!("{}:{pw}\n", self.name))).unwrap();
    }
}

impl Drop for User {
    fn drop(&mut self) {
        // Never panic in drop (it may run while a failed test unwinds).
        let _ = accounts("userdel", &[&self.name], None);
    }
}

/// Serialises this binary's writers of /etc/passwd and /etc/shadow (useradd, userdel, chpasswd,
/// pam_unix changing a password): useradd fails, rather than waits, while another holds the lock.
fn passwd_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs an account tool under [`passwd_lock`]; the retry covers programs outside this test
/// binary holding the lock briefly.
fn accounts(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let _g = passwd_lock();
    for attempt in 0..20 {
        let mut c = Command::new(cmd);
        c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let _ = child.stdin.take().unwrap().write_all(stdin.unwrap_or("").as_bytes());
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.contains("lock") || attempt == 19 {
            return Err(format!("{cmd} {args:?}: {err}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(())
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
        let kind = NewKind::named("password", &KindOptions::default()).unwrap();
        let n = NewProtector { name: &u.name, uid: Some(u.uid), kind };
        ds.encrypt(&u.home, ProtectorChoice::New(n), &mut Answers(vec![password])).unwrap();
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

fn pamtester(service: &str, user: &str, ops: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    run_pamtester(Command::new("pamtester"), service, user, ops, stdin, env)
}

/// pamtester with the real uid of `u` and effective uid root: how `passwd` runs when a user
/// changes their own password (set-uid root), so modules see a non-root caller.
fn pamtester_as(u: &User, service: &str, ops: &[&str], stdin: &str) -> Output {
    let mut c = Command::new("setpriv");
    c.arg(format!("--ruid={}", u.uid)).arg("pamtester");
    run_pamtester(c, service, &u.name, ops, stdin, &[])
}

fn run_pamtester(mut c: Command, service: &str, user: &str, ops: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    c.arg(service).arg(user).args(ops).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("pamtester");
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
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

const AUTH_THEN: &str = "auth [success=done user_unknown=ignore default=die] {so} {args}\nauth required pam_NEXT.so\n\
                         account required pam_permit.so\n\
                         session optional {so} {args}\n\
                         session required pam_permit.so\n";

/// The control field of the `section` ("Auth", "Session", "Password") line of the profile we ship,
/// data/pam-configs/dirseal, so the stacks below are the ones pam-auth-update will write.
fn profile_control(section: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/pam-configs/dirseal");
    let text = fs::read_to_string(path).unwrap();
    let header = format!("{section}:");
    let line = text.lines().skip_while(|l| *l != header).nth(1).unwrap();
    let (control, module) = line.trim().rsplit_once(char::is_whitespace).unwrap();
    assert_eq!(module, "pam_dirseal.so", "{line}");
    control.trim().to_string()
}

/// What pam-auth-update writes into Debian 12's common-auth/-account/-session/-password with the
/// unix profile and ours enabled: `end` becomes a jump past the primary block. `nodelay` only
/// keeps pam_unix's failure delay out of the test's run time.
fn debian_stack() -> String {
    format!(
        "auth {auth} {{so}} {{args}}\n\
         auth [success=1 default=ignore] pam_unix.so nullok nodelay\n\
         auth requisite pam_deny.so\n\
         auth required pam_permit.so\n\
         account required pam_permit.so\n\
         session required pam_permit.so\n\
         session {session} {{so}} {{args}}\n\
         password [success=1 default=ignore] pam_unix.so yescrypt nodelay\n\
         password requisite pam_deny.so\n\
         password required pam_permit.so\n\
         password {password} {{so}} {{args}}\n",
        auth = profile_control("Auth").replace("success=end", "success=2"),
        session = profile_control("Session"),
        password = profile_control("Password"),
    )
}

/// The service's session counter file of `u`.
fn counter(s: &Setup, u: &User) -> PathBuf {
    s.etc.path().join("run").join(format!("{}.sessions", u.uid))
}

#[test]
fn login_unlocks_and_last_logout_locks() {
    let mut s = Setup::new();
    let u = s.managed_user("hunter2");
    // An unknown argument is logged and ignored, not fatal.
    let svc = s.service(&AUTH_THEN.replace("NEXT", "deny").replace("{args}", "{args} no_such_option"));
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "hunter2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "open_session must unlock the home");
    // The session count lives in the root-only run directory.
    let run = s.etc.path().join("run");
    assert_eq!(fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(fs::read_to_string(counter(&s, &u)).unwrap(), "1");
    // A second session, then both end: only the last one locks.
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "hunter2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert_eq!(fs::read_to_string(counter(&s, &u)).unwrap(), "2");
    let o = pamtester(&svc, &u.name, &["close_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "another session is still open");
    let o = pamtester(&svc, &u.name, &["close_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u), "the last close_session must lock");
    // Locked means the names are ciphertext again, not just unreadable contents.
    let names: Vec<_> = fs::read_dir(&u.home).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1);
    assert_ne!(names[0], "diary.txt");
}

#[test]
fn wrong_password_is_denied_and_stays_locked() {
    let mut s = Setup::new();
    let u = s.managed_user("right");
    let svc = s.service(&AUTH_THEN.replace("NEXT", "permit"));
    let o = pamtester(&svc, &u.name, &["authenticate"], "wrong\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert!(text(&o).contains("Authentication failure"), "PAM_AUTH_ERR expected: {}", show(&o));
    // pamtester stops at the failed operation; a session opened anyway finds no key to add.
    let o = pamtester(&svc, &u.name, &["open_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u));
}

#[test]
fn the_shipped_profile_logs_in_managed_and_other_users() {
    let mut s = Setup::new();
    let u = s.managed_user("home-Password-1");
    // Out of step on purpose: for a managed user the home's password is the one that counts.
    u.set_system_password("system-Password-1");
    let plain = User::new(s.fs.path());
    plain.set_system_password("plain-Password-1");
    let svc = s.service(&debian_stack());
    assert!(!ok(&pamtester(&svc, &u.name, &["authenticate"], "system-Password-1\n", &[])));
    assert!(!unlocked(&u));
    let o = pamtester(&svc, &u.name, &["authenticate", "acct_mgmt", "open_session"], "home-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
    assert!(ok(&pamtester(&svc, &u.name, &["close_session"], "", &[])));
    assert!(!unlocked(&u));
    // Users dirseal does not manage meet pam_unix alone.
    let o = pamtester(&svc, &plain.name, &["authenticate", "acct_mgmt", "open_session"], "plain-Password-1\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!ok(&pamtester(&svc, &plain.name, &["authenticate"], "home-Password-1\n", &[])));
}

#[test]
fn a_session_without_our_auth_leaves_the_home_locked() {
    let mut s = Setup::new();
    let u = s.managed_user("pw");
    // SSH keys, or another module, authenticate: pam_dirseal never sees the password.
    let svc = s.service("auth required pam_permit.so\nsession optional {so} {args}\n");
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u));
    assert_eq!(fs::read_to_string(counter(&s, &u)).unwrap(), "1", "the session is counted all the same");
}

#[test]
fn unmanaged_users_fall_through_to_the_next_module() {
    let mut s = Setup::new();
    let plain = User::new(s.fs.path());
    fs::write(plain.home.join("x"), b"plain").unwrap();
    let permit = s.service(&AUTH_THEN.replace("NEXT", "permit"));
    let deny = s.service(&AUTH_THEN.replace("NEXT", "deny"));
    let o = pamtester(&permit, &plain.name, &["authenticate"], "whatever\n", &[]);
    assert!(ok(&o), "pam_permit after an unmanaged user: {}", show(&o));
    let o = pamtester(&deny, &plain.name, &["authenticate"], "whatever\n", &[]);
    assert!(!ok(&o), "pam_deny after an unmanaged user: {}", show(&o));
    // A user that does not exist at all steps aside too.
    let o = pamtester(&permit, "dst-no-such-user", &["authenticate"], "x\n", &[]);
    assert!(ok(&o), "{}", show(&o));

    // With pam_unix behind it, pam_unix alone decides (and asks for the password itself).
    plain.set_system_password("unix-Password-1");
    let unix = s.service(&AUTH_THEN.replace("pam_NEXT.so", "pam_unix.so nodelay"));
    assert!(ok(&pamtester(&unix, &plain.name, &["authenticate"], "unix-Password-1\n", &[])));
    assert!(!ok(&pamtester(&unix, &plain.name, &["authenticate"], "not-it\n", &[])));

    // A home encrypted by someone else (no record in this keystore, or no keystore at all) is
    // not ours either. The later keystore= argument wins.
    let foreign = s.managed_user("pw");
    let other_ks = tempfile::tempdir().unwrap();
    for ks in [other_ks.path().to_path_buf(), other_ks.path().join("missing")] {
        let elsewhere = s.service(
            &AUTH_THEN.replace("NEXT", "permit").replace("{args}", &format!("{{args}} keystore={}", ks.display())),
        );
        let o = pamtester(&elsewhere, &foreign.name, &["authenticate", "open_session"], "wrong\n", &[]);
        assert!(ok(&o), "{}", show(&o));
        assert!(!unlocked(&foreign));
    }
    assert!(!other_ks.path().join("missing").exists(), "the module creates no keystore");
}

#[test]
fn password_change_follows_and_the_old_one_stops_working() {
    let mut s = Setup::new();
    let u = s.managed_user("old-Password-1");
    u.set_system_password("old-Password-1");
    let pw = s.service(&debian_stack());
    let auth = s.service(&AUTH_THEN.replace("NEXT", "deny"));
    let unix = s.service("auth required pam_unix.so nodelay\n");
    // The user runs passwd: pam_unix asks the current and the new password, pam_dirseal follows.
    let o = {
        let _g = passwd_lock();
        pamtester_as(&u, &pw, &["chauthtok"], "old-Password-1\nnew-Password-2\nnew-Password-2\n")
    };
    assert!(ok(&o), "{}", show(&o));
    assert!(!ok(&pamtester(&auth, &u.name, &["authenticate"], "old-Password-1\n", &[])));
    let o = pamtester(&auth, &u.name, &["authenticate", "open_session"], "new-Password-2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
    assert!(ok(&pamtester(&unix, &u.name, &["authenticate"], "new-Password-2\n", &[])), "system password changed");
}

#[test]
fn password_change_alone_asks_the_current_password_itself() {
    let mut s = Setup::new();
    let u = s.managed_user("old-pw");
    let pw = s.service("password required {so} {args}\n");
    let auth = s.service(&AUTH_THEN.replace("NEXT", "deny"));
    let o = pamtester_as(&u, &pw, &["chauthtok"], "bad\nnew-pw\nnew-pw\n");
    assert!(!ok(&o), "a wrong current password must fail: {}", show(&o));
    assert!(text(&o).contains("does not open the encrypted home"), "{}", show(&o));
    let o = pamtester_as(&u, &pw, &["chauthtok"], "old-pw\nnew-pw\nother\n");
    assert!(!ok(&o), "mismatched new passwords must fail: {}", show(&o));
    assert!(ok(&pamtester(&auth, &u.name, &["authenticate"], "old-pw\n", &[])), "nothing changed yet");
    let o = pamtester_as(&u, &pw, &["chauthtok"], "old-pw\nnew-pw\nnew-pw\n");
    assert!(ok(&o), "{}", show(&o));
    assert!(!ok(&pamtester(&auth, &u.name, &["authenticate"], "old-pw\n", &[])));
    assert!(ok(&pamtester(&auth, &u.name, &["authenticate"], "new-pw\n", &[])));
}

#[test]
fn a_home_password_out_of_step_blocks_the_change_before_anything_changes() {
    let mut s = Setup::new();
    let u = s.managed_user("home-Password-1");
    u.set_system_password("system-Password-1");
    let pw = s.service(&debian_stack());
    let unix = s.service("auth required pam_unix.so nodelay\n");
    let o = {
        let _g = passwd_lock();
        pamtester_as(&u, &pw, &["chauthtok"], "system-Password-1\nnew-Password-2\nnew-Password-2\n")
    };
    assert!(!ok(&o), "{}", show(&o));
    assert!(text(&o).contains("dirseal change-password"), "{}", show(&o));
    // PRELIM_CHECK failed, so pam_unix never reached its update.
    assert!(ok(&pamtester(&unix, &u.name, &["authenticate"], "system-Password-1\n", &[])));
    assert!(!ok(&pamtester(&unix, &u.name, &["authenticate"], "new-Password-2\n", &[])));
}

#[test]
fn root_resetting_a_password_is_told_what_to_run_and_not_blocked() {
    let mut s = Setup::new();
    let u = s.managed_user("home-Password-1");
    u.set_system_password("home-Password-1");
    let pw = s.service(&debian_stack());
    let auth = s.service(&AUTH_THEN.replace("NEXT", "deny"));
    let unix = s.service("auth required pam_unix.so nodelay\n");
    // pamtester runs as root, like `passwd USER`: pam_unix asks only the new password.
    let o = {
        let _g = passwd_lock();
        pamtester(&pw, &u.name, &["chauthtok"], "reset-Password-2\nreset-Password-2\n", &[])
    };
    assert!(ok(&o), "the system password change must go through: {}", show(&o));
    let all = text(&o);
    assert!(all.contains(&format!("dirseal change-password {}", u.home.display())), "{all}");
    assert!(all.contains("dirseal recovery restore"), "{all}");
    assert!(ok(&pamtester(&unix, &u.name, &["authenticate"], "reset-Password-2\n", &[])));
    // The protector is unchanged: still the old password.
    assert!(ok(&pamtester(&auth, &u.name, &["authenticate"], "home-Password-1\n", &[])));
    assert!(!ok(&pamtester(&auth, &u.name, &["authenticate"], "reset-Password-2\n", &[])));
}

#[test]
#[cfg_attr(not(debug_assertions), ignore = "the test_panic argument exists only in debug builds")]
fn a_panic_is_caught_as_service_error() {
    let mut s = Setup::new();
    let u = s.managed_user("pw");
    let svc = s.service("auth required {so} {args} test_panic\n");
    let o = pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[]);
    // pamtester exits 1 with the PAM error text; a panic unwinding into libpam would abort it.
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o).contains("Error in service module"), "PAM_SERVICE_ERR expected: {}", show(&o));
    assert!(!unlocked(&u));
    // Without the switch the same stack succeeds, so the failure above is the panic.
    let svc = s.service("auth required {so} {args}\n");
    assert!(ok(&pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[])));
}

#[test]
fn the_callers_environment_changes_nothing() {
    let mut s = Setup::new();
    let u = s.managed_user("pw");
    let empty = tempfile::tempdir().unwrap();
    let svc = s.service(&AUTH_THEN.replace("NEXT", "deny"));
    let bogus_config = empty.path().join("config.toml");
    fs::write(&bogus_config, "keystore = \"/nonexistent\"\n").unwrap();
    let env = [
        ("DIRSEAL_CONFIG", bogus_config.to_str().unwrap()),
        ("DIRSEAL_KEYSTORE", empty.path().to_str().unwrap()),
        ("DIRSEAL_FAULT", "after-prepare"),
    ];
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "pw\n", &env);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));
}

#[test]
fn a_keystore_entry_for_another_key_is_refused() {
    let mut s = Setup::new();
    let a = s.managed_user("pw-a");
    let ds = s.ds();
    let policy = ds.policy_of(&a.home).unwrap();
    let pid = *policy.wrapped.keys().next().unwrap();
    let prec = ds.keystore().protector(&pid).unwrap();
    let pkey = dirseal::protector::unlock(&prec, ds.config(), Some(&Passphrase::from_str_copy("pw-a"))).unwrap();
    // Forge: the same policy id and protector, but wrapping a different master key. Every
    // cryptographic check of the file passes; only the key-identifier check can catch it.
    let mut forged = dirseal::keystore::PolicyRecord::new(policy.id, None);
    forged.add_protector(&pid, &pkey, &dirseal::secret::MasterKey::random());
    {
        let _l = ds.keystore().lock().unwrap();
        ds.keystore().save_policy(&forged).unwrap();
    }
    let svc = s.service(&AUTH_THEN.replace("NEXT", "permit"));
    let o = pamtester(&svc, &a.name, &["authenticate", "open_session"], "pw-a\n", &[]);
    assert!(!ok(&o), "a forged entry must not authenticate: {}", show(&o));
    assert!(!unlocked(&a));
}

#[test]
fn another_homes_policy_record_swapped_in_is_refused() {
    let mut s = Setup::new();
    let a = s.managed_user("pw-a");
    let b = s.managed_user("pw-b");
    let ds = s.ds();
    let (pa, pb) = (ds.policy_of(&a.home).unwrap().id, ds.policy_of(&b.home).unwrap().id);
    // b's record, complete and valid, under a's name: b's password must not open a's login.
    let policies = s.keystore().join("policies");
    fs::copy(policies.join(format!("{pb}.json")), policies.join(format!("{pa}.json"))).unwrap();
    let svc = s.service(&AUTH_THEN.replace("NEXT", "permit"));
    for pw in ["pw-b\n", "pw-a\n"] {
        let o = pamtester(&svc, &a.name, &["authenticate", "open_session"], pw, &[]);
        assert!(!ok(&o), "{}", show(&o));
    }
    assert!(!unlocked(&a));
    // b is unaffected.
    assert!(ok(&pamtester(&svc, &b.name, &["authenticate", "open_session"], "pw-b\n", &[])));
    assert!(unlocked(&b));
}

/// Leaves a conversion of `home` recorded mid-copy, as if it had been interrupted.
fn interrupted_conversion(home: &Path) {
    /// Stops the engine as soon as the copy starts, so the journal says "copying".
    struct Stopped(std::sync::atomic::AtomicBool);
    impl dirseal_migrate::Host for Stopped {
        fn progress(&self, p: &dirseal_migrate::Progress) {
            if p.phase == dirseal_migrate::Phase::Copying {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        fn prepare_staging(&self, _: &Path) -> Result<String, dirseal_migrate::HostError> {
            Ok("test".into())
        }
        fn ensure_unlocked(&self, _: &str, _: &Path) -> Result<(), dirseal_migrate::HostError> {
            Ok(())
        }
        fn is_encrypted(&self, _: &Path) -> Result<bool, dirseal_migrate::HostError> {
            Ok(false)
        }
        fn exchange(&self, _: &Path, _: &Path) -> Result<(), dirseal_migrate::HostError> {
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
        threads: 1,
        mode: dirseal_migrate::Mode::Copy,
    };
    let e = dirseal_migrate::convert(&req, &Stopped(Default::default())).unwrap_err();
    assert!(matches!(e, dirseal_migrate::MigrateError::Interrupted { .. }), "{e:?}");
    assert!(dirseal::convert::in_progress(home).unwrap());
}

#[test]
fn login_during_a_conversion_is_refused_unless_allowed() {
    let mut s = Setup::new();
    let u = User::new(s.fs.path());
    fs::write(u.home.join("file"), b"plaintext still").unwrap();
    interrupted_conversion(&u.home);
    let svc = s.service(&AUTH_THEN.replace("NEXT", "permit"));
    let acct = s.service("account required {so} {args}\naccount required pam_permit.so\n");
    let o = pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert!(text(&o).contains("Encryption of your home directory is in progress"), "{}", show(&o));
    // Logins that skip auth (SSH keys) meet the same refusal in the account stack.
    let o = pamtester(&acct, &u.name, &["acct_mgmt"], "", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert!(text(&o).contains("Encryption of your home directory is in progress"), "{}", show(&o));
    // The admin allows it: the module steps aside and the rest of the stack decides.
    fs::write(s.config(), format!("{FAST_CONFIG}[pam]\nallow_login_during_conversion = true\n")).unwrap();
    assert!(ok(&pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[])));
    assert!(ok(&pamtester(&acct, &u.name, &["acct_mgmt"], "", &[])));
}

#[test]
fn account_management_ignores_everyone_else() {
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
    let mut s = Setup::new();
    let u = s.managed_user("pw");
    let svc = s.service(
        "auth [success=done user_unknown=ignore default=die] {so} {args}\nauth required pam_deny.so\nsession optional {so} {args} unlock_only\n",
    );
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session", "close_session"], "pw\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "unlock_only must leave the home unlocked at the last logout");
    assert_eq!(fs::read_to_string(counter(&s, &u)).unwrap(), "0", "sessions are still counted");
}
