//! The real module loaded by libpam through `pamtester`, with service files of our own, users
//! of our own, and homes encrypted with dirseal on a real loop-mounted ext4.
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use dirseal::ops::{Dirseal, NewProtector, ProtectorChoice};
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
        accounts("useradd", &args).unwrap();
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
        User { name, uid, home }
    }
}

impl Drop for User {
    fn drop(&mut self) {
        // Never panic in drop (it may run while a failed test unwinds).
        let _ = accounts("userdel", &[&self.name]);
    }
}

/// Runs useradd/userdel one at a time: they lock /etc/passwd and fail, rather than wait, when a
/// parallel test holds it. The retry covers other programs holding the lock briefly.
fn accounts(cmd: &str, args: &[&str]) -> Result<(), String> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for attempt in 0..20 {
        let out = Command::new(cmd).args(args).output().unwrap();
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
        let n = NewProtector { name: &u.name, uid: Some(u.uid), kdf_time_ms: None, kdf_memory_mib: None };
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
    let mut c = Command::new("pamtester");
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
                         session optional {so} {args}\n";

#[test]
fn login_unlocks_and_last_logout_locks() {
    let mut s = Setup::new();
    let u = s.managed_user("hunter2");
    let svc = s.service(&AUTH_THEN.replace("NEXT", "deny"));
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "hunter2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "open_session must unlock the home");
    // A second session, then both end: only the last one locks.
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "hunter2\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    let o = pamtester(&svc, &u.name, &["close_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u), "another session is still open");
    let o = pamtester(&svc, &u.name, &["close_session"], "", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!unlocked(&u), "the last close_session must lock");
    assert!(!s.fs.path().join(&u.name).join("diary.txt").exists());
}

#[test]
fn wrong_password_is_denied_and_stays_locked() {
    let mut s = Setup::new();
    let u = s.managed_user("right");
    let svc = s.service(&AUTH_THEN.replace("NEXT", "permit"));
    let o = pamtester(&svc, &u.name, &["authenticate", "open_session"], "wrong\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    assert!(!unlocked(&u));
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
}

#[test]
fn password_change_follows_and_the_old_one_stops_working() {
    let mut s = Setup::new();
    let u = s.managed_user("old-pw");
    let pw = s.service("password required {so} {args}\n");
    let auth = s.service(&AUTH_THEN.replace("NEXT", "deny"));
    let o = pamtester(&pw, &u.name, &["chauthtok"], "bad\n", &[]);
    assert!(!ok(&o), "a wrong current password must fail: {}", show(&o));
    let o = pamtester(&pw, &u.name, &["chauthtok"], "old-pw\nnew-pw\nnew-pw\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(!ok(&pamtester(&auth, &u.name, &["authenticate"], "old-pw\n", &[])));
    let o = pamtester(&auth, &u.name, &["authenticate", "open_session"], "new-pw\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    assert!(unlocked(&u));

    // Root resetting without the old password: told what to run, the rest of the stack proceeds,
    // the protector is unchanged.
    let reset = s.service("password required {so} {args}\npassword required pam_permit.so\n");
    let o = pamtester(&reset, &u.name, &["chauthtok"], "\n", &[]);
    assert!(ok(&o), "{}", show(&o));
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(all.contains("dirseal change-password"), "{all}");
    assert!(ok(&pamtester(&auth, &u.name, &["authenticate"], "new-pw\n", &[])));
}

#[test]
fn a_panic_is_caught_as_service_error() {
    let mut s = Setup::new();
    let u = s.managed_user("pw");
    let svc = s.service("auth required {so} {args} test_panic\n");
    let o = pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[]);
    assert_eq!(o.status.code(), Some(1), "pamtester must fail normally, not die: {}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Critical error") || !ok(&o));
    assert!(!unlocked(&u));
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
    let pkey = dirseal::keystore::unlock_protector(&prec, &Passphrase::from_str_copy("pw-a")).unwrap();
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
    let o = pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[]);
    assert!(!ok(&o), "{}", show(&o));
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(all.contains("Encryption of your home directory is in progress"), "{all}");
    // The admin allows it: the module steps aside and the rest of the stack decides.
    fs::write(s.config(), format!("{FAST_CONFIG}[pam]\nallow_login_during_conversion = true\n")).unwrap();
    let o = pamtester(&svc, &u.name, &["authenticate"], "pw\n", &[]);
    assert!(ok(&o), "{}", show(&o));
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
}
