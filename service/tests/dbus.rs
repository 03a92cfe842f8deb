//! dirsealed on a private system bus, called by real users through gdbus (secrets by fd) and by
//! root through zbus. Creates users: run only under the global suite lock (scripts/test.sh).
mod support;

use std::path::Path;

use support::{s, snapshot, strings, write_as_root, Daemon, Harness, User};

const DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";

fn root_only() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: needs root (loop mounts, users, a system bus)");
    false
}

fn fd(n: u32) -> String {
    format!("@h {n}")
}

/// A user encrypts their own empty home through the service: returns (policy, protector).
fn encrypt_home(h: &Harness, u: &User, pw: &str) -> (String, String) {
    let r = h.ok(Some(u), "Encrypt", &[s(u.home_str()), s(""), fd(3)], &[(3, pw)]);
    let v = strings(&r);
    assert_eq!(v.len(), 2, "{r}");
    (v[0].clone(), v[1].clone())
}

#[test]
fn introspection_matches_the_shipped_xml() {
    if !root_only() {
        return;
    }
    let h = Harness::new();
    let shipped = std::fs::read_to_string(support::repo().join("data/org.dirseal.Dirseal1.xml")).expect("xml");
    let live = h.introspect(support::PATH);
    let iface = |xml: &str, name: &str| -> String {
        let start = xml.find(&format!("<interface name=\"{name}\">")).unwrap_or_else(|| panic!("{name} in:\n{xml}"));
        let end = start + xml[start..].find("</interface>").expect("end") + "</interface>".len();
        xml[start..end].split_whitespace().collect::<Vec<_>>().join(" ")
    };
    assert_eq!(iface(&live, "org.dirseal.Dirseal1"), iface(&shipped, "org.dirseal.Dirseal1"));
}

#[test]
fn a_user_manages_their_own_home_through_every_method() {
    if !root_only() {
        return;
    }
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
    // With several of hers, an unnamed protector is ambiguous; naming one works.
    h.fails(
        Some(&alice),
        "Unlock",
        &[s(alice.home_str()), s(""), fd(3)],
        &[(3, "pw-2")],
        "org.freedesktop.DBus.Error.InvalidArgs",
    );
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(&second), fd(3)], &[(3, "pw-2")]);
    h.ok(Some(&alice), "RemoveProtectorFromPolicy", &[s(alice.home_str()), s(&second)], &[]);
    h.ok(Some(&alice), "RemoveProtectorFromPolicy", &[s(alice.home_str()), s(&third)], &[]);
    h.ok(Some(&alice), "RemoveProtector", &[s(&second)], &[]);
    assert!(!h.ok(Some(&alice), "ListProtectors", &[], &[]).contains(&second));
    // The last protector of a policy stays.
    h.fails(
        Some(&alice),
        "RemoveProtectorFromPolicy",
        &[s(alice.home_str()), s(&prot)],
        &[],
        "org.dirseal.Dirseal1.Error.Failed",
    );

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

    // TPM tries left: this build has no TPM2 kind, and says so.
    let msg = h.fails(Some(&alice), "GetTpmTriesLeft", &[s(&prot)], &[], "org.dirseal.Dirseal1.Error.NotSupported");
    assert!(msg.contains("TPM2"), "{msg}");

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
    if !root_only() {
        return;
    }
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

    let before = (snapshot(&h.keystore()), h.key(&alice.home), snapshot(&h.config()));
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

    let after = (snapshot(&h.keystore()), h.key(&alice.home), snapshot(&h.config()));
    assert!(before == after, "a denied call changed the keystore, the config or the key status");
    assert!(!bool::try_from(h.status(&spare)["encrypted"].try_clone().unwrap()).unwrap());
}

#[test]
fn the_service_takes_its_paths_from_options_never_the_environment() {
    if !root_only() {
        return;
    }
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
