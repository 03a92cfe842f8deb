//! dirsealed on a private system bus, called by real users through gdbus (secrets by fd) and by
//! root through zbus. Creates users: run only under the global suite lock (scripts/test.sh).
mod support;

use std::path::Path;

use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use dirseal_testfs::tree::contents;

use support::{
    encrypt_home, fd, fill, job_path, s, strings, watch_jobs, write_as_root, Daemon, Harness, JobSignal, Polkit, User,
    DENIED,
};

const BUSY: &str = "org.dirseal.Dirseal1.Error.Busy";

/// One interface's element of an introspection document, whitespace-normalized.
fn iface(xml: &str, name: &str) -> String {
    let start = xml.find(&format!("<interface name=\"{name}\">")).unwrap_or_else(|| panic!("{name} in:\n{xml}"));
    let end = start + xml[start..].find("</interface>").expect("end") + "</interface>".len();
    xml[start..end].split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Compares the live object's `name` interface with data/org.dirseal.Dirseal1.xml; on a
/// difference the live document is left in the target dir to review and copy.
fn check_against_shipped(live: &str, name: &str) {
    let shipped = std::fs::read_to_string(support::repo().join("data/org.dirseal.Dirseal1.xml")).expect("xml");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.live.xml"));
    std::fs::write(&out, live).expect("write live xml");
    if !shipped.contains(&format!("<interface name=\"{name}\">")) || iface(live, name) != iface(&shipped, name) {
        panic!("{name} differs from data/org.dirseal.Dirseal1.xml; the running service's is in {}", out.display());
    }
}

#[test]
fn introspection_matches_the_shipped_xml() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    check_against_shipped(&h.introspect(support::PATH), "org.dirseal.Dirseal1");
    // (The job interface is checked on a live job in the conversion test.)
}

#[test]
fn a_user_manages_their_own_home_through_every_method() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let home = alice.home.as_path();

    // Encrypt the empty home with a new password protector that belongs to alice.
    let (policy, prot) = encrypt_home(&h, &alice, "pw-a");
    let st = h.status(home);
    assert_eq!(String::try_from(st["policy"].try_clone().unwrap()).unwrap(), policy);
    assert_eq!(h.key(home), "unlocked");
    write_as_root(&home.join("diary.txt"), b"dear diary");

    // Status as the user.
    let r = h.ok(Some(&alice), "GetStatus", &[s(alice.home_str())], &[]);
    assert!(r.contains("'unlocked'") && r.contains(&prot) && r.contains(&format!("<uint32 {}>", alice.uid)), "{r}");

    // Lock, a wrong password, then unlock.
    let r = h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    assert!(r.contains("'locked': <true>"), "{r}");
    assert_eq!(h.key(home), "locked");
    assert!(!home.join("diary.txt").exists(), "names are ciphertext while locked");
    let msg = h.fails(
        Some(&alice),
        "Unlock",
        &[s(alice.home_str()), s(""), fd(3)],
        &[(3, "nope")],
        "org.dirseal.Dirseal1.Error.IncorrectSecret",
    );
    assert!(msg.contains("incorrect password"), "{msg}");
    assert_eq!(h.key(home), "locked");
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(""), fd(3)], &[(3, "pw-a")]);
    assert_eq!(std::fs::read(home.join("diary.txt")).unwrap(), b"dear diary");

    // Secrets: verify, change, verify again.
    assert_eq!(h.ok(Some(&alice), "VerifySecret", &[s(&prot), fd(3)], &[(3, "pw-a")]), "(true,)");
    assert_eq!(h.ok(Some(&alice), "VerifySecret", &[s(&prot), fd(3)], &[(3, "wrong")]), "(false,)");
    h.ok(Some(&alice), "ChangeSecret", &[s(&prot), fd(3), fd(4)], &[(3, "pw-a"), (4, "pw-a2")]);
    assert_eq!(h.ok(Some(&alice), "VerifySecret", &[s(&prot), fd(3)], &[(3, "pw-a2")]), "(true,)");
    assert_eq!(h.ok(Some(&alice), "VerifySecret", &[s(&prot), fd(3)], &[(3, "pw-a")]), "(false,)");

    // Protectors: create a second, add it to the home's policy (proving the first), list, remove.
    let root_prot =
        strings(&h.ok(None, "CreateProtector", &[s("admin"), fd(3), "{}".into()], &[(3, "root-pw")]))[0].clone();
    let second =
        strings(&h.ok(Some(&alice), "CreateProtector", &[s("alice-2"), fd(3), "{}".into()], &[(3, "pw-2")]))[0].clone();
    let list = h.ok(Some(&alice), "ListProtectors", &[], &[]);
    assert!(list.contains(&prot) && list.contains(&second) && !list.contains(&root_prot), "{list}");
    assert!(h.ok(None, "ListProtectors", &[], &[]).contains(&root_prot));
    let added = h.ok(
        Some(&alice),
        "AddProtectorToPolicy",
        &[s(alice.home_str()), s(""), fd(3), s(&second), fd(4), s("")],
        &[(3, "pw-a2"), (4, "pw-2")],
    );
    assert_eq!(strings(&added), vec![second.clone()]);
    let list = h.ok(Some(&alice), "ListProtectors", &[], &[]);
    assert!(list.contains(&policy), "the list names the policies each protector opens: {list}");
    // A new password protector straight into the policy.
    let third = h.ok(
        Some(&alice),
        "AddProtectorToPolicy",
        &[s(alice.home_str()), s(&prot), fd(3), s(""), fd(4), s("laptop")],
        &[(3, "pw-a2"), (4, "pw-3")],
    );
    let third = strings(&third)[0].clone();
    let st = h.ok(Some(&alice), "GetStatus", &[s(alice.home_str())], &[]);
    assert!(st.contains(&second) && st.contains(&third) && st.contains("'laptop'"), "{st}");
    // With several of hers, an unnamed protector is any of them in her login order; naming one
    // (by id or name) works too.
    h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(""), fd(3)], &[(3, "pw-2")]);
    h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(&second), fd(3)], &[(3, "pw-2")]);
    h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s("laptop"), fd(3)], &[(3, "pw-3")]);
    h.ok(Some(&alice), "RemoveProtectorFromPolicy", &[s(alice.home_str()), s(&second)], &[]);
    h.ok(Some(&alice), "RemoveProtectorFromPolicy", &[s(alice.home_str()), s(&third)], &[]);
    h.ok(Some(&alice), "RemoveProtector", &[s(&second)], &[]);
    assert!(!h.ok(Some(&alice), "ListProtectors", &[], &[]).contains(&second));
    // The last protector of a policy stays; the message says what to call, not a CLI command.
    let msg = h.fails(
        Some(&alice),
        "RemoveProtectorFromPolicy",
        &[s(alice.home_str()), s(&prot)],
        &[],
        "org.dirseal.Dirseal1.Error.Failed",
    );
    assert!(msg.contains("add one with AddProtectorToPolicy") && !msg.contains("`dirseal"), "{msg}");

    // Recovery key: written to the caller's fd, verified, used to restore after a lock.
    let keyfile = h.fs.scratch().join("alice-key");
    std::fs::write(&keyfile, b"").unwrap();
    std::os::unix::fs::chown(&keyfile, Some(alice.uid), None).unwrap();
    h.call(
        Some(&alice),
        "RecoveryAdd",
        &[s(alice.home_str()), s(""), fd(3), fd(4)],
        &[(3, "pw-a2")],
        Some((4, &keyfile)),
    )
    .unwrap_or_else(|e| panic!("RecoveryAdd: {e:?}"));
    let key = std::fs::read_to_string(&keyfile).unwrap().trim().to_string();
    assert!(key.len() > 30, "a recovery key was written: {key:?}");
    assert!(bool::try_from(h.status(home)["recovery_key"].try_clone().unwrap()).unwrap());
    assert_eq!(h.ok(Some(&alice), "RecoveryVerify", &[s(alice.home_str()), fd(3)], &[(3, &key)]), "(true,)");
    h.fails(
        Some(&alice),
        "RecoveryVerify",
        &[s(alice.home_str()), fd(3)],
        &[(3, "not-a-key")],
        "org.freedesktop.DBus.Error.InvalidArgs",
    );
    h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    let restored = h.ok(
        Some(&alice),
        "RecoveryRestore",
        &[s(alice.home_str()), fd(3), s(""), fd(4), s("alice-restored")],
        &[(3, &key), (4, "pw-new")],
    );
    let restored = strings(&restored)[0].clone();
    assert_eq!(h.key(home), "unlocked");
    assert_eq!(h.ok(Some(&alice), "VerifySecret", &[s(&restored), fd(3)], &[(3, "pw-new")]), "(true,)");
    h.ok(Some(&alice), "RecoveryRemove", &[s(alice.home_str())], &[]);
    assert!(!bool::try_from(h.status(home)["recovery_key"].try_clone().unwrap()).unwrap());

    // A password protector has no TPM tries (tests/dbus.rs::tpm_tries_left covers a TPM).
    let msg = h.fails(Some(&alice), "GetTpmTriesLeft", &[s(&prot)], &[], "org.dirseal.Dirseal1.Error.NotSupported");
    assert!(msg.contains("no device counts its wrong secrets"), "{msg}");

    // Root acts for anyone: a protector for alice, named by root.
    let opts = format!("{{'uid': <uint32 {}>}}", alice.uid);
    let for_alice =
        strings(&h.ok(None, "CreateProtector", &[s("by-root"), fd(3), opts.clone()], &[(3, "x")]))[0].clone();
    assert!(h.ok(Some(&alice), "ListProtectors", &[], &[]).contains(&for_alice));
    // The log names methods and callers, never a secret.
    let log = h.daemon.log_text();
    assert!(log.contains(&format!("Unlock({}) by uid {}: ok", alice.home_str(), alice.uid)), "{log}");
    for secret in ["pw-a2", "pw-2", "pw-new", &key] {
        assert!(!log.contains(secret), "the log holds a secret");
    }
}

#[test]
fn another_users_home_and_protectors_are_denied_and_nothing_changes() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let bob = h.user();
    let (_, a_prot) = encrypt_home(&h, &alice, "pw-a");
    let (_, b_prot) = encrypt_home(&h, &bob, "pw-b");
    let a = s(alice.home_str());
    // An empty directory of alice's where bob could try Encrypt.
    let spare = h.fs.path().join(format!("{}-spare", alice.name));
    std::fs::create_dir(&spare).unwrap();
    std::os::unix::fs::chown(&spare, Some(alice.uid), None).unwrap();
    let keyfile = h.fs.scratch().join("bob-out");
    std::fs::write(&keyfile, b"").unwrap();
    std::os::unix::fs::chown(&keyfile, Some(bob.uid), None).unwrap();

    let before = (contents(&h.keystore()), h.key(&alice.home), contents(&h.config()));
    let b = Some(&bob);
    let denied = |method: &str, args: &[String], secrets: &[(u32, &str)]| {
        let msg = h.fails(b, method, args, secrets, DENIED);
        assert!(msg.contains("you") || msg.contains("yours"), "{method}: {msg}");
    };
    denied("GetStatus", std::slice::from_ref(&a), &[]);
    denied("Lock", &[a.clone(), "true".into()], &[]);
    // Even with alice's right password.
    denied("Unlock", &[a.clone(), s(""), fd(3)], &[(3, "pw-a")]);
    denied("Unlock", &[a.clone(), s(&a_prot), fd(3)], &[(3, "pw-a")]);
    denied("Encrypt", &[s(spare.to_str().unwrap()), s(""), fd(3)], &[(3, "x")]);
    denied("AddProtectorToPolicy", &[a.clone(), s(""), fd(3), s(&b_prot), fd(4), s("")], &[(3, "pw-a"), (4, "pw-b")]);
    denied("RemoveProtectorFromPolicy", &[a.clone(), s(&a_prot)], &[]);
    denied("RecoveryVerify", &[a.clone(), fd(3)], &[(3, "x")]);
    denied("RecoveryRestore", &[a.clone(), fd(3), s(""), fd(4), s("")], &[(3, "x"), (4, "y")]);
    denied("RecoveryRemove", std::slice::from_ref(&a), &[]);
    let e =
        h.call(b, "RecoveryAdd", &[a.clone(), s(""), fd(3), fd(4)], &[(3, "pw-a")], Some((4, &keyfile))).unwrap_err();
    assert_eq!(e.name, DENIED);
    assert_eq!(std::fs::read(&keyfile).unwrap(), b"", "no key was handed out");
    // Alice's protector, even where bob owns the directory.
    denied("VerifySecret", &[s(&a_prot), fd(3)], &[(3, "pw-a")]);
    denied("ChangeSecret", &[s(&a_prot), fd(3), fd(4)], &[(3, "pw-a"), (4, "bobs")]);
    denied("RemoveProtector", &[s(&a_prot)], &[]);
    denied("GetTpmTriesLeft", &[s(&a_prot)], &[]);
    denied("Unlock", &[s(bob.home_str()), s(&a_prot), fd(3)], &[(3, "pw-a")]);
    denied(
        "AddProtectorToPolicy",
        &[s(bob.home_str()), s(""), fd(3), s(&a_prot), fd(4), s("")],
        &[(3, "pw-b"), (4, "pw-a")],
    );
    // A protector for someone else.
    let opts = format!("{{'uid': <uint32 {}>}}", alice.uid);
    h.fails(b, "CreateProtector", &[s("for-alice"), fd(3), opts], &[(3, "x")], DENIED);
    assert!(!h.ok(b, "ListProtectors", &[], &[]).contains(&a_prot));
    // Paths that are not plainly the caller's own.
    h.fails(
        b,
        "GetStatus",
        &[s(&format!("{}/../{}", h.fs.path().display(), bob.name))],
        &[],
        "org.freedesktop.DBus.Error.InvalidArgs",
    );
    h.fails(b, "GetStatus", &[s("relative")], &[], "org.freedesktop.DBus.Error.InvalidArgs");
    h.fails(b, "GetStatus", &[s(h.fs.path().to_str().unwrap())], &[], DENIED);

    let after = (contents(&h.keystore()), h.key(&alice.home), contents(&h.config()));
    assert!(before == after, "a denied call changed the keystore, the config or the key status");
    assert!(!bool::try_from(h.status(&spare)["encrypted"].try_clone().unwrap()).unwrap());
}

/// With polkitd on the bus, a user it grants org.dirseal.Dirseal1.manage (the shipped action)
/// acts on another user's home as root would, and the log says so; a user it does not grant is
/// refused with a message naming the action; without polkitd the granted user is refused again.
#[test]
fn polkit_lets_an_administrator_act_on_another_users_home() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let admin = h.user();
    let carol = h.user();
    encrypt_home(&h, &alice, "pw-a");
    let a = s(alice.home_str());
    let pk = Polkit::start(&h.bus, &admin.name);

    let st = h.ok(Some(&admin), "GetStatus", std::slice::from_ref(&a), &[]);
    assert!(st.contains("'encrypted': <true>"), "{st}");
    h.ok(Some(&admin), "Lock", &[a.clone(), "false".into()], &[]);
    assert_eq!(h.key(&alice.home), "locked");
    // As for root, an unnamed protector is the one that opens the home.
    h.ok(Some(&admin), "Unlock", &[a.clone(), s(""), fd(3)], &[(3, "pw-a")]);
    assert_eq!(h.key(&alice.home), "unlocked");
    // Root-only options too: a protector for alice.
    let opts = format!("{{'uid': <uint32 {}>}}", alice.uid);
    let id = strings(&h.ok(Some(&admin), "CreateProtector", &[s("by-admin"), fd(3), opts], &[(3, "x")]))[0].clone();
    assert!(h.ok(Some(&alice), "ListProtectors", &[], &[]).contains(&id));
    // Listing asks nobody: the administrator's own list holds only their protectors.
    assert!(!h.ok(Some(&admin), "ListProtectors", &[], &[]).contains(&id));

    // A directory inside alice's home (alice could swap it): refused to alice, not to them.
    let inner = alice.home.join("inner");
    std::fs::create_dir(&inner).unwrap();
    std::os::unix::fs::chown(&inner, Some(alice.uid), Some(alice.uid)).unwrap();
    let i = s(inner.to_str().unwrap());
    let msg = h.fails(Some(&alice), "GetStatus", std::slice::from_ref(&i), &[], DENIED);
    assert!(msg.contains("org.dirseal.Dirseal1.manage"), "{msg}");
    h.ok(Some(&admin), "GetStatus", std::slice::from_ref(&i), &[]);

    let msg = h.fails(Some(&carol), "GetStatus", std::slice::from_ref(&a), &[], DENIED);
    assert!(msg.contains("org.dirseal.Dirseal1.manage"), "{msg}");
    h.fails(Some(&carol), "Lock", &[a.clone(), "false".into()], &[], DENIED);
    let log = h.daemon.log_text();
    let line = format!("Lock({}) by uid {} (as administrator: polkit granted", alice.home_str(), admin.uid);
    assert!(log.contains(&line), "{log}");

    // Without polkitd only root acts for others; the service works on.
    drop(pk);
    h.fails(Some(&admin), "GetStatus", std::slice::from_ref(&a), &[], DENIED);
    h.ok(Some(&alice), "GetStatus", std::slice::from_ref(&a), &[]);
    assert!(!h.daemon.log_text().contains("asking polkit"), "{}", h.daemon.log_text());
}

#[test]
fn the_service_takes_its_paths_from_options_never_the_environment() {
    dirseal_testfs::needs_root!();
    let mut h = Harness::new();
    let elsewhere = h.etc.path().join("env-keystore");
    h.daemon.kill();
    h.daemon = Daemon::start(
        &h.bus,
        &h.config(),
        &h.keystore(),
        &h.etc.path().join("dirsealed.log"),
        &[("DIRSEAL_KEYSTORE", elsewhere.to_str().unwrap()), ("DIRSEAL_CONFIG", "/nonexistent/config.toml")],
    );
    let id = strings(&h.ok(None, "CreateProtector", &[s("p"), fd(3), "{}".into()], &[(3, "x")]))[0].clone();
    assert!(h.keystore().join("protectors").join(format!("{id}.json")).exists());
    assert!(!Path::new(&elsewhere).exists());
    // SIGTERM stops it cleanly.
    let st = h.daemon.stop().expect("exit status");
    assert!(st.success(), "{st:?}");
}

/// No bus to connect to: one line that names the address, its cause said once (before, anyhow's
/// chain printed "No such file or directory (os error 2)" twice).
#[test]
fn without_a_bus_the_service_says_why_once() {
    dirseal_testfs::needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dirsealed"))
        .arg("--keystore")
        .arg(dir.path().join("ks"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .env_clear()
        .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/bus")
        .output()
        .expect("run dirsealed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("connecting to the system bus") && err.contains("/nonexistent/bus"), "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
}

#[test]
fn a_second_service_on_the_bus_says_one_runs_and_exits() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_dirsealed"))
        .arg("--config")
        .arg(h.config())
        .arg("--keystore")
        .arg(h.keystore())
        .arg("--run-dir")
        .arg(h.etc.path().join("run2"))
        .env_clear()
        .env("DBUS_SYSTEM_BUS_ADDRESS", &h.bus.address)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dirsealed");
    let t = Instant::now();
    while second.try_wait().expect("wait").is_none() {
        if t.elapsed() > Duration::from_secs(20) {
            let _ = second.kill();
            panic!("a second dirsealed waited for the name instead of exiting");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = second.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is another dirsealed running?"), "{:?}: {err}", out.status);
    // The first one still serves.
    h.ok(None, "ListProtectors", &[], &[]);
}

/// A TPM whose lockout is owned (as after `dirseal tpm2 setup`) with `max_tries` tries and a long
/// recovery time (nothing is forgiven during a test).
fn owned_tpm(max_tries: u32) -> dirseal_testfs::Swtpm {
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let n = max_tries.to_string();
    let auth = dirseal_testfs::Swtpm::OWNER_AUTH;
    tpm.tool(&["tpm2_dictionarylockout", "-s", "-n", &n, "-t", "1000", "-l", "1000", "-p", auth]).unwrap();
    tpm
}

/// The service's rule on PIN tries: at most one try per few seconds per uid.
const PIN_INTERVAL: Duration = Duration::from_millis(3100);

#[test]
fn tpm_tries_left_counts_down_with_wrong_pins() {
    dirseal_testfs::needs_root!();
    let tpm = owned_tpm(4);
    let h = Harness::with_config(&format!("[tpm2]\ntcti = \"{}\"\n", tpm.tcti()));
    let alice = h.user();
    // A user makes their own TPM+PIN protector.
    let id =
        h.ok(Some(&alice), "CreateProtector", &[s("alice-tpm"), fd(3), "{'kind': <'tpm2'>}".into()], &[(3, "1234")]);
    let id = strings(&id)[0].clone();
    assert_eq!(h.ok(Some(&alice), "GetTpmTriesLeft", &[s(&id)], &[]), "(uint32 4,)");
    assert_eq!(h.ok(Some(&alice), "VerifySecret", &[s(&id), fd(3)], &[(3, "9999")]), "(false,)");
    assert_eq!(h.ok(Some(&alice), "GetTpmTriesLeft", &[s(&id)], &[]), "(uint32 3,)");
    // A second try at once is refused before the TPM sees it.
    let e = h.fails(Some(&alice), "VerifySecret", &[s(&id), fd(3)], &[(3, "1234")], DENIED);
    assert!(e.contains("too many TPM PIN tries in a row"), "{e}");
    std::thread::sleep(PIN_INTERVAL);
    assert_eq!(h.ok(Some(&alice), "VerifySecret", &[s(&id), fd(3)], &[(3, "1234")]), "(true,)");
    let bob = h.user();
    h.fails(Some(&bob), "GetTpmTriesLeft", &[s(&id)], &[], DENIED);
}

/// Regression (issue 20): an unprivileged caller used their own TPM protector to spend the TPM's
/// shared tries over D-Bus until the TPM locked every user out. Now the last `min_local_tries`
/// are kept for the person at the device, and root still verifies.
#[test]
fn an_unprivileged_caller_cannot_lock_the_tpm_out_over_dbus() {
    dirseal_testfs::needs_root!();
    let tpm = owned_tpm(5);
    let h = Harness::with_config(&format!("[tpm2]\ntcti = \"{}\"\nmin_local_tries = 2\n", tpm.tcti()));
    let mallory = h.user();
    let id = h.ok(Some(&mallory), "CreateProtector", &[s("m-tpm"), fd(3), "{'kind': <'tpm2'>}".into()], &[(3, "2468")]);
    let id = strings(&id)[0].clone();
    let tries = || -> u32 {
        let r = h.ok(None, "GetTpmTriesLeft", &[s(&id)], &[]);
        r.trim_start_matches("(uint32 ").trim_end_matches(",)").parse().unwrap()
    };
    let (mut spent, mut kept) = (0, 0);
    for guess in 0..8 {
        match h.call(Some(&mallory), "VerifySecret", &[s(&id), fd(3)], &[(3, &format!("{guess:04}"))], None) {
            Ok(r) => {
                assert_eq!(r, "(false,)");
                spent += 1;
            }
            Err(e) => {
                assert_eq!(e.name, DENIED, "{}", e.message);
                assert!(e.message.contains("kept for the person at the device"), "{}", e.message);
                kept += 1;
            }
        }
        assert!(tries() >= 2, "a D-Bus caller brought the TPM below min_local_tries: {} left", tries());
        std::thread::sleep(PIN_INTERVAL);
    }
    assert_eq!((spent, kept, tries()), (3, 5, 2));
    // Root too (issue 41): a call from a process in no local seat session (this test's) is not at
    // the device, and the kept tries are decided again under the machine's PIN lock right before
    // the TPM is asked, whoever calls.
    let e = h.call(None, "VerifySecret", &[s(&id), fd(3)], &[(3, "2468")], None).expect_err("root from elsewhere");
    assert!(e.message.contains("kept for the person at the device"), "{}: {}", e.name, e.message);
    assert_eq!(tries(), 2);
    // Not mallory's protector: refused before the TPM is asked.
    let root_pin = h.ok(None, "CreateProtector", &[s("root-tpm"), fd(3), "{'kind': <'tpm2'>}".into()], &[(3, "1357")]);
    let root_pin = strings(&root_pin)[0].clone();
    h.fails(Some(&mallory), "VerifySecret", &[s(&root_pin), fd(3)], &[(3, "0000")], DENIED);
    assert_eq!(tries(), 2);
}

/// Regression (issue 20): with the TPM's lockout hierarchy unowned anyone could reset the count of
/// wrong PINs, so a PIN protector is refused there (and allowed without PIN).
#[test]
fn a_tpm_pin_protector_needs_an_owned_lockout() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start();
    let h = Harness::with_config(&format!("[tpm2]\ntcti = \"{}\"\n", tpm.tcti()));
    let alice = h.user();
    let e = h
        .call(Some(&alice), "CreateProtector", &[s("a"), fd(3), "{'kind': <'tpm2'>}".into()], &[(3, "1234")], None)
        .expect_err("a PIN on an unowned TPM lockout must be refused");
    assert!(e.message.contains("lockout hierarchy has no password"), "{}", e.message);
    // The library's remedy, in the service's terms: the option that does without a PIN.
    assert!(e.message.contains("CreateProtector with no_pin") && !e.message.contains("--no-pin"), "{}", e.message);
    h.ok(Some(&alice), "CreateProtector", &[s("b"), fd(3), "{'kind': <'tpm2'>, 'no_pin': <true>}".into()], &[(3, "x")]);
    // The kind's options pass through; an Argon2id cost (what every unlock then costs the
    // machine) is an administrator's to set, and an option no kind takes is refused by its key.
    let slow = "{'kdf_time_ms': <uint32 100000>}";
    let e =
        h.call(Some(&alice), "CreateProtector", &[s("c"), fd(3), slow.into()], &[(3, "x")], None).expect_err("slow");
    assert_eq!(e.name, DENIED, "{}", e.message);
    assert!(e.message.contains("option kdf_time_ms of password protectors may be set only by an administrator"));
    let odd = "{'shout': <true>}";
    let e = h.call(Some(&alice), "CreateProtector", &[s("d"), fd(3), odd.into()], &[(3, "x")], None).expect_err("odd");
    assert!(e.message.contains("option shout does not apply to password protectors"), "{}", e.message);
}

/// A process that is killed when the test ends, however it ends.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Advice comes from the library's one mapping, so a D-Bus caller gets it where only the CLI did
/// before: converting a home whose owner has processes running names the option that overrides it.
#[test]
fn converting_a_home_whose_owner_is_active_names_the_force_option() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    fill(&alice.home, 2, 4096, alice.uid);
    use std::os::unix::process::CommandExt;
    let _session = Running(
        std::process::Command::new("sleep").arg("60").uid(alice.uid).current_dir("/").spawn().expect("sleep as alice"),
    );
    let msg = h.fails(None, "Convert", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw")], BUSY);
    assert!(msg.contains("has processes running"), "{msg}");
    assert!(msg.ends_with("; if nothing writes there, root can call Convert with the force option"), "{msg}");
    assert!(!bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
}

/// Waits for the first signal `pick` accepts; every signal seen is kept in `seen`.
fn wait_for<T>(
    rx: &Receiver<JobSignal>,
    seen: &mut Vec<JobSignal>,
    what: &str,
    pick: impl Fn(&JobSignal) -> Option<T>,
) -> T {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        if let Ok(sig) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(sig.clone());
            if let Some(v) = pick(&sig) {
                return v;
            }
            if let JobSignal::Failed { name, message, .. } = &sig {
                panic!("waiting for {what}, a job failed: {name}: {message}");
            }
        }
    }
    panic!("no {what} within 120 s; signals seen: {seen:?}");
}

/// Fills `u`'s home with `mib` files of 1 MiB and a directory `small` of `small` files of 512 bytes.
fn sample_home(u: &User, mib: usize, small: usize) {
    fill(&u.home, mib, 1 << 20, u.uid);
    let dir = u.home.join("small");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(u.uid), Some(u.uid)).unwrap();
    fill(&dir, small, 512, u.uid);
}

/// How many entries are below `dir` (0 when it does not exist).
fn entries(dir: &Path) -> usize {
    let list = std::fs::read_dir(dir).into_iter().flatten().flatten();
    list.map(|e| 1 + if e.file_type().is_ok_and(|t| t.is_dir()) { entries(&e.path()) } else { 0 }).sum()
}

#[test]
fn a_user_converts_their_home_with_progress_signals_and_can_cancel() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let bob = h.user();
    // Many files: the copy takes long enough that a Cancel sent at once lands before the swap.
    sample_home(&alice, 32, 4000);
    let original = contents(&alice.home);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();

    // Bob may not convert alice's home.
    h.fails(Some(&bob), "Convert", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw")], DENIED);
    // A user may not force.
    h.fails(Some(&alice), "Convert", &[s(alice.home_str()), fd(3), "{'force': <true>}".into()], &[(3, "pw")], DENIED);

    // Start, then cancel at once: the home stays as it was.
    let job = job_path(&h.ok(Some(&alice), "Convert", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw-a")]));
    let e = h.call_at(Some(&bob), &job, "org.dirseal.Dirseal1.Job.Cancel", &[], &[], None).unwrap_err();
    assert_eq!(e.name, DENIED, "{}", e.message);
    h.call_at(Some(&alice), &job, "org.dirseal.Dirseal1.Job.Cancel", &[], &[], None).expect("Cancel");
    let state = wait_for(&rx, &mut seen, "the end of the cancelled job", |sig| match sig {
        JobSignal::Finished { path, state } if *path == job => Some(state.clone()),
        JobSignal::Failed { path, name, message } if *path == job => panic!("{name}: {message}"),
        _ => None,
    });
    assert_eq!(state, "aborted");
    assert!(!bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
    assert!(contents(&alice.home) == original, "a cancelled conversion leaves the home as it was");

    // Again, to the end: progress through the phases, then Finished.
    seen.clear();
    let job = job_path(&h.ok(Some(&alice), "Convert", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw-a")]));
    let state = wait_for(&rx, &mut seen, "the end of the job", |sig| match sig {
        JobSignal::Finished { path, state } if *path == job => Some(state.clone()),
        JobSignal::Failed { path, name, message } if *path == job => {
            panic!("{name}: {message}\n{}", h.daemon.log_text())
        }
        _ => None,
    });
    assert_eq!(state, "done");
    let phases: Vec<&str> = seen
        .iter()
        .filter_map(|s| match s {
            JobSignal::Progress { path, phase, .. } if *path == job => Some(phase.as_str()),
            _ => None,
        })
        .collect();
    for p in ["copying", "verifying"] {
        assert!(phases.contains(&p), "a Progress signal for {p}: {phases:?}");
    }
    let last_copy = seen.iter().rev().find_map(|s| match s {
        JobSignal::Progress { path, phase, bytes_done, bytes_total, .. } if *path == job && phase == "copying" => {
            Some((*bytes_done, *bytes_total))
        }
        _ => None,
    });
    let (done, total) = last_copy.expect("copying progress");
    assert!(total >= 32 << 20 && done <= total, "{done}/{total}");
    let st = h.status(&alice.home);
    assert!(bool::try_from(st["encrypted"].try_clone().unwrap()).unwrap());
    assert_eq!(h.key(&alice.home), "unlocked");
    assert!(contents(&alice.home) == original, "the converted home holds the same files");
    // The new protector is alice's: she can lock and unlock with it.
    h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(""), fd(3)], &[(3, "pw-a")]);
    check_against_shipped(&h.introspect(&job), "org.dirseal.Dirseal1.Job");
    // The job object stays to be read.
    let r = h.call_at(
        Some(&alice),
        &job,
        "org.freedesktop.DBus.Properties.Get",
        &[s("org.dirseal.Dirseal1.Job"), s("State")],
        &[],
        None,
    );
    assert_eq!(r.unwrap(), "(<'done'>,)");
}

/// The service is killed (SIGKILL, as a crash or the OOM killer would) while it copies, with the
/// client that started the job long gone; the restarted service resumes the conversion by itself
/// (its job record and the staging key survive) and the home ends up encrypted, every file intact.
#[test]
fn a_conversion_survives_its_client_and_resumes_after_the_service_is_killed_mid_copy() {
    dirseal_testfs::needs_root!();
    let mut h = Harness::new();
    let alice = h.user();
    // The copy goes to the page cache at memory speed, but the journal says Copied only after a
    // syncfs that encrypts it all (the kernel's AES: ~60 MB/s), so 48 MiB keep the conversion in
    // its copying state for most of a second after its first Progress; the small files make the
    // copy itself take a while.
    sample_home(&alice, 48, 1000);
    let original = contents(&alice.home);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    // Root starts it; the gdbus client exits at once (the job does not depend on it).
    let opts = "{'mode': <'copy'>}".to_string();
    let job = job_path(&h.ok(None, "Convert", &[s(alice.home_str()), fd(3), opts], &[(3, "pw-a")]));
    wait_for(&rx, &mut seen, "a Progress of the copying phase", |sig| match sig {
        JobSignal::Progress { path, phase, .. } if *path == job && phase == "copying" => Some(()),
        JobSignal::Finished { path, .. } if *path == job => panic!("{job} finished before it could be killed"),
        _ => None,
    });
    // Then, with part of the tree in the engine's staging directory, the kill.
    let staging = dirseal::convert::workdir_for(&alice.home).unwrap().join("staging");
    let t = Instant::now();
    while entries(&staging) < 100 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.daemon.kill();
    let (staged, total) = (entries(&staging), original.len() + 1);
    let st = dirseal::convert::status(&alice.home).unwrap().expect("journal");
    let what = format!("{staged} of {total} entries copied");
    assert_eq!(st.state, dirseal::convert::State::Copying, "the kill must land while the conversion copies ({what})");
    eprintln!("killed with {what}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !seen.iter().chain(rx.try_iter().collect::<Vec<_>>().iter()).any(|s| matches!(s, JobSignal::Finished { .. })),
        "{job} must not have finished"
    );
    assert!(contents(&alice.home) == original, "until the swap the home is as it was");
    h.restart();
    let state = wait_for(&rx, &mut seen, "the resumed job's end", |sig| match sig {
        JobSignal::Finished { state, .. } => Some(state.clone()),
        _ => None,
    });
    assert_eq!(state, "done");
    assert!(h.daemon.log_text().contains("resumed the conversion of"), "{}", h.daemon.log_text());
    assert!(bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
    assert!(contents(&alice.home) == original, "nothing lost across the kill");
    // The new protector is alice's.
    h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(""), fd(3)], &[(3, "pw-a")]);
}

#[test]
fn a_portable_directory_opens_over_dbus_with_the_service_keystore_empty() {
    dirseal_testfs::needs_root!();
    use dirseal::ops::{NewProtector, Pick, ProtectorChoice};
    use dirseal::protector::{KindOptions, NewKind};
    // The user's security key, which travels with them: this machine's service is told where it is.
    let keydir = tempfile::tempdir().unwrap();
    let sock = keydir.path().join("key.sock");
    let key = dirseal_softfido::SoftFido::start(&sock, dirseal_softfido::Options::default()).unwrap();
    let fido2 = format!("[fido2]\ntouch_timeout_secs = 3\nsocket_devices = [{sock:?}]\n");
    let h = Harness::with_config(&fido2);
    let alice = h.user();
    // The user's directory at the top of the card (the service acts for users only below
    // root-owned directories).
    let games = alice.home.clone();

    // Made on another machine (its own config and keystore), the card then brought here.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("config.toml"), format!("{}{fido2}", support::FAST_CONFIG)).unwrap();
    let mut ds = dirseal::Dirseal::open(&other.path().join("config.toml"), Some(&other.path().join("ks"))).unwrap();
    let kind = NewKind::named("password", KindOptions::new(Vec::new())).unwrap();
    let choice = ProtectorChoice::New(NewProtector { name: alice.name.as_str().into(), uid: Some(alice.uid), kind });
    let mut ui = dirseal_testfs::ui::Scripted::new(&["pw-card", "pw-card"]);
    let (policy, _) = ds.encrypt_portable(&games, choice, &mut ui).unwrap();
    let kind = NewKind::named("fido2", KindOptions::new(Vec::new())).unwrap();
    let choice = ProtectorChoice::New(NewProtector { name: "yubi".into(), uid: Some(alice.uid), kind });
    ds.add_protector_to(&policy, Pick::default(), choice, &mut dirseal_testfs::ui::Scripted::new(&["pw-card"]))
        .unwrap();
    write_as_root(&games.join("save.dat"), b"level 9");
    assert!(ds.lock(&games, false).unwrap().locked);
    assert_eq!(
        h.fs.path().join(".dirseal/portable/policies").read_dir().unwrap().count(),
        1,
        "the record is on the card"
    );

    let r = h.ok(Some(&alice), "GetStatus", &[s(games.to_str().unwrap())], &[]);
    assert!(r.contains("'managed': <true>") && r.contains(".dirseal/portable'>") && r.contains("'locked'"), "{r}");
    // On insertion: a touch comes first, the secret passed is never used (docs/portable.md).
    let touches = key.touches();
    h.ok(Some(&alice), "Unlock", &[s(games.to_str().unwrap()), s(""), fd(3)], &[(3, "not-the-password")]);
    assert_eq!(key.touches(), touches + 1);
    assert_eq!(std::fs::read(games.join("save.dat")).unwrap(), b"level 9");
    h.ok(Some(&alice), "Lock", &[s(games.to_str().unwrap()), "false".into()], &[]);
    // Without the key, the password.
    drop(key);
    h.fails(
        Some(&alice),
        "Unlock",
        &[s(games.to_str().unwrap()), s(""), fd(3)],
        &[(3, "nope")],
        "org.dirseal.Dirseal1.Error.IncorrectSecret",
    );
    h.ok(Some(&alice), "Unlock", &[s(games.to_str().unwrap()), s(""), fd(3)], &[(3, "pw-card")]);
    assert_eq!(std::fs::read(games.join("save.dat")).unwrap(), b"level 9");
    let r = h.ok(Some(&alice), "Lock", &[s(games.to_str().unwrap()), "false".into()], &[]);
    assert!(r.contains("'locked': <true>"), "{r}");
    assert!(!games.join("save.dat").exists());
    let policies = std::fs::read_dir(h.keystore().join("policies")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(policies, 0, "the service's keystore holds nothing of the card");
}

/// A decrypt asked to keep its protectors, the service killed while it copies: the restarted
/// service resumes it by itself and still keeps them (the option lives in the job's record).
#[test]
fn a_decrypt_resumed_after_the_service_is_killed_keeps_the_protectors_it_was_asked_to_keep() {
    dirseal_testfs::needs_root!();
    let mut h = Harness::new();
    let alice = h.user();
    sample_home(&alice, 48, 1000);
    let original = contents(&alice.home);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    let job = job_path(&h.ok(None, "Convert", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw-a")]));
    let done = |seen: &mut Vec<JobSignal>, job: &str| {
        wait_for(&rx, seen, "the end of the job", |sig| match sig {
            JobSignal::Finished { path, state } if path == job => Some(state.clone()),
            JobSignal::Failed { path, name, message } if path == job => panic!("{name}: {message}"),
            _ => None,
        })
    };
    assert_eq!(done(&mut seen, &job), "done");
    let records = h.keystore().join("protectors");
    let protectors = || std::fs::read_dir(&records).map(|d| d.count()).unwrap_or(0);
    assert_eq!(protectors(), 1);
    seen.clear();
    let opts = "{'mode': <'copy'>, 'keep_protectors': <true>}".to_string();
    let job = job_path(&h.ok(None, "Decrypt", &[s(alice.home_str()), fd(3), opts], &[(3, "pw-a")]));
    wait_for(&rx, &mut seen, "a Progress of the copying phase", |sig| match sig {
        JobSignal::Progress { path, phase, .. } if *path == job && phase == "copying" => Some(()),
        JobSignal::Finished { path, .. } if *path == job => panic!("{job} finished before it could be killed"),
        _ => None,
    });
    let staging = dirseal::convert::workdir_for(&alice.home).unwrap().join("staging");
    let t = Instant::now();
    while entries(&staging) < 100 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.daemon.kill();
    let st = dirseal::convert::status(&alice.home).unwrap().expect("journal");
    assert_eq!(st.state, dirseal::convert::State::Copying, "the kill must land while the decrypt copies");
    h.restart();
    let state = wait_for(&rx, &mut seen, "the resumed job's end", |sig| match sig {
        JobSignal::Finished { state, .. } => Some(state.clone()),
        JobSignal::Failed { name, message, .. } => panic!("{name}: {message}"),
        _ => None,
    });
    assert_eq!(state, "done");
    assert!(h.daemon.log_text().contains("resumed the conversion of"), "{}", h.daemon.log_text());
    assert!(!bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
    assert!(contents(&alice.home) == original, "nothing lost across the kill");
    assert_eq!(protectors(), 1, "keep_protectors survives the restart");
}

/// Decrypt over D-Bus: a converted home comes back to plaintext as a job with Convert's
/// signals; only root (or polkit's decrypt-own action, absent here) may ask for it, and
/// PlanDecrypt answers in PlanConvert's shape first.
#[test]
fn root_decrypts_a_converted_home_as_a_job_and_its_owner_needs_the_polkit_action() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let bob = h.user();
    sample_home(&alice, 4, 300);
    let original = contents(&alice.home);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    let finished = |job: &str, seen: &mut Vec<JobSignal>| {
        wait_for(&rx, seen, "the end of the job", |sig| match sig {
            JobSignal::Finished { path, state } if path == job => Some(state.clone()),
            JobSignal::Failed { path, name, message } if path == job => {
                panic!("{name}: {message}\n{}", h.daemon.log_text())
            }
            _ => None,
        })
    };
    let job = job_path(&h.ok(Some(&alice), "Convert", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw-a")]));
    assert_eq!(finished(&job, &mut seen), "done");
    assert!(bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());

    let plan = h.ok(None, "PlanDecrypt", &[s(alice.home_str()), "{}".into()], &[]);
    for k in ["'entries'", "'data_bytes'", "'method'", "'space_needed'"] {
        assert!(plan.contains(k), "PlanDecrypt has {k}: {plan}");
    }
    h.fails(Some(&bob), "Decrypt", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw-a")], DENIED);
    let msg = h.fails(Some(&alice), "Decrypt", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw-a")], DENIED);
    assert!(msg.contains("org.dirseal.Dirseal1.decrypt-own"), "{msg}");
    assert!(bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());

    seen.clear();
    let job = job_path(&h.ok(None, "Decrypt", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw-a")]));
    assert_eq!(finished(&job, &mut seen), "done");
    let phases: Vec<&str> = seen
        .iter()
        .filter_map(|s| match s {
            JobSignal::Progress { path, phase, .. } if *path == job => Some(phase.as_str()),
            _ => None,
        })
        .collect();
    assert!(phases.contains(&"copying") && phases.contains(&"verifying"), "{phases:?}");
    assert!(!bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
    assert!(contents(&alice.home) == original, "the decrypted home holds the same files");
}

/// The boot-time run's Ui: nothing can be asked at boot.
struct Refuses;

impl dirseal::Ui for Refuses {
    fn secret(&mut self, _: &dirseal::ui::SecretPrompt<'_>) -> Result<dirseal::Passphrase, dirseal::ui::UiError> {
        panic!("the boot-time run asked for a secret")
    }
}

/// A user asks, from inside their running session (a process of theirs works in the home), for
/// their home to be encrypted at the next boot: the job finishes at once as "scheduled" and
/// GetStatus says so, nothing of the home changed. At the "boot" (the service gone, the
/// filesystem remounted: every key dropped) the boot-time run converts it with nothing asked;
/// GetStatus then says "done" and the password chosen when scheduling unlocks it.
#[test]
fn a_user_schedules_their_home_for_the_next_boot_from_their_session() {
    dirseal_testfs::needs_root!();
    let mut h = Harness::new();
    let alice = h.user();
    sample_home(&alice, 4, 300);
    let original = contents(&alice.home);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    let session = Running(
        std::os::unix::process::CommandExt::uid(std::process::Command::new("sleep").arg("60"), alice.uid)
            .current_dir(&alice.home)
            .spawn()
            .expect("sleep"),
    );
    let args = [s(alice.home_str()), fd(3), "{'at_next_boot': <true>, 'mode': <'move'>}".into()];
    let job = job_path(&h.ok(Some(&alice), "Convert", &args, &[(3, "pw-a")]));
    let state = wait_for(&rx, &mut seen, "the end of the scheduling job", |sig| match sig {
        JobSignal::Finished { path, state } if *path == job => Some(state.clone()),
        JobSignal::Failed { path, name, message } if *path == job => panic!("{name}: {message}"),
        _ => None,
    });
    assert_eq!(state, "scheduled");
    let st = h.status(&alice.home);
    assert_eq!(String::try_from(st["conversion"].try_clone().unwrap()).unwrap(), "scheduled");
    assert!(!bool::try_from(st["encrypted"].try_clone().unwrap()).unwrap());
    assert!(contents(&alice.home) == original, "nothing changes before the boot");
    drop(session);

    h.daemon.kill();
    h.fs.remount();
    let ds = dirseal::Dirseal::open(&h.config(), Some(&h.keystore())).expect("keystore");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let hooks = dirseal::convert::Hooks { progress: &|_| {}, stop: &stop };
    let runs = dirseal::convert::run_scheduled(&ds, &mut Refuses, &hooks).expect("boot-time run");
    assert_eq!(runs.len(), 1);
    let done = runs[0].result.as_ref().expect("converted");
    assert_eq!(done.outcome.state, dirseal::convert::State::Done);
    h.restart();
    let st = h.status(&alice.home);
    assert_eq!(String::try_from(st["conversion"].try_clone().unwrap()).unwrap(), "done");
    assert!(bool::try_from(st["encrypted"].try_clone().unwrap()).unwrap());
    h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(""), fd(3)], &[(3, "pw-a")]);
    assert!(contents(&alice.home) == original, "the converted home holds the same files");
}

/// A conversion scheduled for the next boot is cancelled over D-Bus (after a "reboot": the held
/// key reads back what is needed): the home and the keystore are as they were; a second cancel,
/// or another user's, is refused.
#[test]
fn a_user_cancels_the_conversion_scheduled_for_the_next_boot() {
    dirseal_testfs::needs_root!();
    let mut h = Harness::new();
    let alice = h.user();
    let bob = h.user();
    sample_home(&alice, 2, 50);
    let original = contents(&alice.home);
    let ks = h.keystore();
    let listing = |sub: &str| std::fs::read_dir(ks.join(sub)).map(|d| d.count()).unwrap_or(0);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    let args = [s(alice.home_str()), fd(3), "{'at_next_boot': <true>, 'mode': <'move'>}".into()];
    let job = job_path(&h.ok(Some(&alice), "Convert", &args, &[(3, "pw-a")]));
    let state = wait_for(&rx, &mut seen, "the scheduling job", |sig| match sig {
        JobSignal::Finished { path, state } if *path == job => Some(state.clone()),
        JobSignal::Failed { path, name, message } if *path == job => panic!("{name}: {message}"),
        _ => None,
    });
    assert_eq!(state, "scheduled");
    assert_eq!((listing("policies"), listing("held"), listing("scheduled")), (1, 1, 1));
    h.daemon.kill();
    h.fs.remount();
    h.restart();
    h.fails(Some(&bob), "CancelScheduled", &[s(alice.home_str())], &[], DENIED);
    assert_eq!(h.ok(Some(&alice), "CancelScheduled", &[s(alice.home_str())], &[]), "('aborted',)");
    assert!(contents(&alice.home) == original, "the home is as it was");
    assert_eq!((listing("protectors"), listing("policies"), listing("held"), listing("scheduled")), (0, 0, 0, 0));
    assert_eq!(String::try_from(h.status(&alice.home)["conversion"].try_clone().unwrap()).unwrap(), "aborted");
    h.fails(Some(&alice), "CancelScheduled", &[s(alice.home_str())], &[], "org.dirseal.Dirseal1.Error.NotFound");
}

/// The Job's State property, as its owner reads it.
fn job_state(h: &Harness, who: &User, job: &str) -> String {
    let r = h
        .call_at(
            Some(who),
            job,
            "org.freedesktop.DBus.Properties.Get",
            &[s("org.dirseal.Dirseal1.Job"), s("State")],
            &[],
            None,
        )
        .expect("State");
    r.trim_start_matches("(<'").trim_end_matches("'>,)").to_string()
}

/// Waits (up to a minute) for the job's State to be `want`.
fn wait_state(h: &Harness, who: &User, job: &str, want: &str) {
    let start = Instant::now();
    loop {
        let now = job_state(h, who, job);
        if now == want {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "State {now:?}, not {want:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A user converts their home live from inside their session (a process of theirs works in it):
/// the job copies and catches up, its State turns "caught up" and GetStatus says it waits for the
/// logout; while the process runs nothing is committed; once it ends the job commits and finishes
/// "done", and the home opens with the password given.
#[test]
fn a_user_converts_their_home_live_and_it_commits_when_the_session_ends() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    sample_home(&alice, 4, 300);
    let original = contents(&alice.home);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    let session = Running(
        std::os::unix::process::CommandExt::uid(std::process::Command::new("sleep").arg("600"), alice.uid)
            .current_dir(&alice.home)
            .spawn()
            .expect("sleep"),
    );
    let args = [s(alice.home_str()), fd(3), "{'live': <true>}".into()];
    let job = job_path(&h.ok(Some(&alice), "Convert", &args, &[(3, "pw-a")]));
    wait_state(&h, &alice, &job, "caught up");
    let conversion = || String::try_from(h.status(&alice.home)["conversion"].try_clone().unwrap()).unwrap();
    assert_eq!(conversion(), "live: caught up, waiting for logout");
    check_against_shipped(&h.introspect(&job), "org.dirseal.Dirseal1.Job");
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(job_state(&h, &alice, &job), "caught up", "nothing is committed while the session uses the home");
    assert!(!bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
    drop(session);
    let state = wait_for(&rx, &mut seen, "the commit", |sig| match sig {
        JobSignal::Finished { path, state } if *path == job => Some(state.clone()),
        JobSignal::Failed { path, name, message } if *path == job => panic!("{name}: {message}"),
        _ => None,
    });
    assert_eq!(state, "done");
    assert!(seen
        .iter()
        .any(|s| matches!(s, JobSignal::Progress { path, phase, .. } if *path == job && phase == "copying")));
    assert!(bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
    assert_eq!(conversion(), "live: done");
    // Committed with nobody in: the run's key is gone (before Finished), the password opens it.
    assert!(!alice.home.join("small").exists(), "the home was left open with nobody in");
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(""), fd(3)], &[(3, "pw-a")]);
    assert!(contents(&alice.home) == original, "the converted home holds the same files");
}

/// A settings page starts a live conversion with `recovery_key_out`: the key is written to the
/// caller's descriptor as the job starts (before the commit, while the home is still plaintext), and
/// once the job has committed that very key opens the home; GetStatus says a recovery key is there.
#[test]
fn a_live_conversion_given_recovery_key_out_makes_the_key_first() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    sample_home(&alice, 2, 50);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    let session = Running(
        std::os::unix::process::CommandExt::uid(std::process::Command::new("sleep").arg("600"), alice.uid)
            .current_dir(&alice.home)
            .spawn()
            .expect("sleep"),
    );
    let (job, key) = convert_as(&h, &alice, "live");
    wait_state(&h, &alice, &job, "caught up");
    assert!(!bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
    drop(session);
    let state = wait_for(&rx, &mut seen, "the commit", |sig| match sig {
        JobSignal::Finished { path, state } if *path == job => Some(state.clone()),
        JobSignal::Failed { path, name, message } if *path == job => panic!("{name}: {message}"),
        _ => None,
    });
    assert_eq!(state, "done");
    assert!(bool::try_from(h.status(&alice.home)["recovery_key"].try_clone().unwrap()).unwrap());
    assert_eq!(h.ok(Some(&alice), "RecoveryVerify", &[s(alice.home_str()), fd(3)], &[(3, &key)]), "(true,)");
    // Not a descriptor: refused in words, nothing started.
    let bob = h.user();
    sample_home(&bob, 1, 5);
    let args = [s(bob.home_str()), fd(3), "{'recovery_key_out': <'/tmp/key'>}".into()];
    let msg = h.fails(Some(&bob), "Convert", &args, &[(3, "pw-b")], "org.freedesktop.DBus.Error.InvalidArgs");
    assert!(msg.contains("recovery_key_out"), "{msg}");
}

/// `Convert` of `who`'s home with option `when` (b) and `recovery_key_out`, as `who`: gdbus passes
/// only top-level descriptors, so the call is made by this test binary itself
/// (`convert_with_recovery_key_out`), with zbus. Returns the job's path and the key written.
fn convert_as(h: &Harness, who: &User, when: &str) -> (String, String) {
    let o = std::os::unix::process::CommandExt::uid(
        &mut std::process::Command::new(std::env::current_exe().unwrap()),
        who.uid,
    )
    .args(["--exact", "convert_with_recovery_key_out", "--ignored", "--nocapture", "--test-threads=1"])
    .env("DBUS_SYSTEM_BUS_ADDRESS", &h.bus.address)
    .env("DS_HELPER_HOME", who.home_str())
    .env("DS_HELPER_WHEN", when)
    .current_dir("/")
    .output()
    .expect("the helper");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{out}{}\n{}", String::from_utf8_lossy(&o.stderr), h.daemon.log_text());
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.split_once(name).map(|(_, v)| v))
            .unwrap_or_else(|| panic!("no {name} in {out}"))
            .trim()
            .to_string()
    };
    let (job, key) = (field("job="), field("key="));
    assert!(key.len() > 30, "the key was written as the job started: {key:?}");
    (job, key)
}

/// Scheduled for the next boot with `recovery_key_out`: the key is written at once, while the home
/// is still plaintext, and after the boot-time run that key opens the converted home.
#[test]
fn a_conversion_scheduled_with_recovery_key_out_opens_with_that_key_after_the_boot() {
    dirseal_testfs::needs_root!();
    let mut h = Harness::new();
    let alice = h.user();
    sample_home(&alice, 1, 20);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    let (job, key) = convert_as(&h, &alice, "at_next_boot");
    let state = wait_for(&rx, &mut seen, "the scheduling job", |sig| match sig {
        JobSignal::Finished { path, state } if *path == job => Some(state.clone()),
        JobSignal::Failed { path, name, message } if *path == job => panic!("{name}: {message}"),
        _ => None,
    });
    assert_eq!(state, "scheduled");
    let st = h.status(&alice.home);
    assert!(!bool::try_from(st["encrypted"].try_clone().unwrap()).unwrap());
    h.daemon.kill();
    h.fs.remount();
    let ds = dirseal::Dirseal::open(&h.config(), Some(&h.keystore())).expect("keystore");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let hooks = dirseal::convert::Hooks { progress: &|_| {}, stop: &stop };
    let runs = dirseal::convert::run_scheduled(&ds, &mut Refuses, &hooks).expect("boot-time run");
    assert_eq!(runs[0].result.as_ref().expect("converted").outcome.state, dirseal::convert::State::Done);
    h.restart();
    assert!(bool::try_from(h.status(&alice.home)["recovery_key"].try_clone().unwrap()).unwrap());
    assert_eq!(h.ok(Some(&alice), "RecoveryVerify", &[s(alice.home_str()), fd(3)], &[(3, &key)]), "(true,)");
}

/// Not a test of its own: [`convert_as`] runs it as the home's owner (`DS_HELPER_HOME`): `Convert`
/// with option `DS_HELPER_WHEN` and `recovery_key_out`, then prints the job's path and the key read
/// from the descriptor.
#[test]
#[ignore = "a helper, run by another test as a user"]
fn convert_with_recovery_key_out() {
    use std::io::{Read, Write};
    let Ok(home) = std::env::var("DS_HELPER_HOME") else { return };
    let conn = zbus::blocking::Connection::system().expect("the bus");
    let (secret_r, secret_w) = rustix::pipe::pipe().unwrap();
    std::fs::File::from(secret_w).write_all(b"pw-a").unwrap();
    let (key_r, key_w) = rustix::pipe::pipe().unwrap();
    let mut options = std::collections::HashMap::new();
    let when = std::env::var("DS_HELPER_WHEN").expect("DS_HELPER_WHEN");
    options.insert(when.as_str(), zbus::zvariant::Value::from(true));
    options.insert("recovery_key_out", zbus::zvariant::Value::from(zbus::zvariant::Fd::from(&key_w)));
    let reply = conn
        .call_method(
            Some("org.dirseal.Dirseal1"),
            "/org/dirseal/Dirseal1",
            Some("org.dirseal.Dirseal1"),
            "Convert",
            &(home.as_str(), zbus::zvariant::Fd::from(&secret_r), options),
        )
        .expect("Convert");
    let job: zbus::zvariant::OwnedObjectPath = reply.body().deserialize().expect("a job");
    drop(key_w);
    let mut key = String::new();
    std::fs::File::from(key_r).read_to_string(&mut key).unwrap();
    println!("job={}\nkey={}", job.as_str(), key.trim());
}

/// A live conversion cancelled while it waits for the logout: the job ends "aborted", the home is
/// as it was, and nothing of the conversion is left in the keystore (no held key, no schedule).
#[test]
fn a_live_conversion_cancelled_while_caught_up_leaves_nothing() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    sample_home(&alice, 2, 50);
    let original = contents(&alice.home);
    let ks = h.keystore();
    let listing = |sub: &str| std::fs::read_dir(ks.join(sub)).map(|d| d.count()).unwrap_or(0);
    let rx = watch_jobs(&h.bus);
    let mut seen = Vec::new();
    let _session = Running(
        std::os::unix::process::CommandExt::uid(std::process::Command::new("sleep").arg("600"), alice.uid)
            .current_dir(&alice.home)
            .spawn()
            .expect("sleep"),
    );
    let args = [s(alice.home_str()), fd(3), "{'live': <true>}".into()];
    let job = job_path(&h.ok(Some(&alice), "Convert", &args, &[(3, "pw-a")]));
    wait_state(&h, &alice, &job, "caught up");
    assert_eq!((listing("held"), listing("scheduled")), (1, 1));
    h.call_at(Some(&alice), &job, "org.dirseal.Dirseal1.Job.Cancel", &[], &[], None).expect("Cancel");
    let state = wait_for(&rx, &mut seen, "the cancelled job", |sig| match sig {
        JobSignal::Finished { path, state } if *path == job => Some(state.clone()),
        JobSignal::Failed { path, name, message } if *path == job => panic!("{name}: {message}"),
        _ => None,
    });
    assert_eq!(state, "aborted");
    assert!(contents(&alice.home) == original, "the home is as it was");
    assert!(!bool::try_from(h.status(&alice.home)["encrypted"].try_clone().unwrap()).unwrap());
    assert_eq!((listing("protectors"), listing("policies"), listing("held"), listing("scheduled")), (0, 0, 0, 0));
}
