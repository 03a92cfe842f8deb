//! `CreateHome` (issue 27): root, or an administrator through polkit, creates a user's home
//! encrypted from the start; anyone else is refused. Creates users: run only under the global
//! suite lock (scripts/test.sh).
mod support;

use support::{fd, s, strings, Harness, DENIED};

#[test]
fn root_creates_a_users_home_encrypted_and_others_are_refused() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let bob = h.user();
    std::fs::remove_dir(&alice.home).unwrap();
    // Bob may not make (or take over) alice's home.
    h.fails(Some(&bob), "CreateHome", &[s(&alice.name), fd(3), "{}".into()], &[(3, "pw-b")], DENIED);
    assert!(!alice.home.exists());
    let skel = h.fs.path().join("skel");
    std::fs::create_dir(&skel).unwrap();
    std::fs::write(skel.join(".profile"), "# profile\n").unwrap();
    let opts = format!("{{'skel': <{}>}}", s(skel.to_str().unwrap()));
    let r = strings(&h.ok(None, "CreateHome", &[s(&alice.name), fd(3), opts], &[(3, "pw-a")]));
    assert_eq!(r[0], alice.home_str());
    let st = h.status(&alice.home);
    assert!(bool::try_from(st["encrypted"].try_clone().unwrap()).unwrap());
    assert_eq!(String::try_from(st["policy"].try_clone().unwrap()).unwrap(), r[1]);
    assert_eq!(h.key(&alice.home), "unlocked");
    assert_eq!(std::fs::read_to_string(alice.home.join(".profile")).unwrap(), "# profile\n");
    // The protector is hers: she locks and unlocks her home with the password given.
    let mine = h.ok(Some(&alice), "ListProtectors", &[], &[]);
    assert!(mine.contains(&r[2]) && mine.contains(&format!("'{}'", alice.name)), "{mine}");
    h.ok(Some(&alice), "Lock", &[s(alice.home_str()), "false".into()], &[]);
    h.ok(Some(&alice), "Unlock", &[s(alice.home_str()), s(""), fd(3)], &[(3, "pw-a")]);
    // A home that holds files is refused, naming the conversion.
    std::fs::write(bob.home.join("notes"), "mine").unwrap();
    let msg = h.fails(
        None,
        "CreateHome",
        &[s(&bob.name), fd(3), "{}".into()],
        &[(3, "pw")],
        "org.dirseal.Dirseal1.Error.Busy",
    );
    assert!(msg.contains("convert"), "{msg}");
}
