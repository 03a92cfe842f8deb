//! `CreateHome` (issue 27): root, or an administrator through polkit, creates a user's home
//! encrypted from the start; anyone else is refused. Creates users: run only under the global
//! suite lock (scripts/test.sh).
mod support;

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::PathBuf;

use support::{fd, s, strings, Harness, DENIED};

/// A skeleton where one named over D-Bus may be: `/etc/skel.dirseal-test-PID-N`, root's, removed
/// on drop.
struct Skel(PathBuf);

impl Skel {
    fn new() -> Skel {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = PathBuf::from(format!("/etc/skel.dirseal-test-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        Skel(dir)
    }
}

impl Drop for Skel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const INVALID: &str = "org.freedesktop.DBus.Error.InvalidArgs";

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
    let skel = Skel::new();
    std::fs::write(skel.0.join(".profile"), "# profile\n").unwrap();
    let opts = format!("{{'skel': <{}>}}", s(skel.0.to_str().unwrap()));
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

/// Issue 41 item 9: a skeleton named over D-Bus (the caller may be an unprivileged administrator
/// through polkit) is copied only if it is a root-owned tree in the allowed places: `skel=/etc`
/// would hand the new user a copy of /etc/shadow. Nothing is created when refused.
#[test]
fn a_skeleton_named_over_dbus_must_be_a_root_tree_below_etc_skel() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    std::fs::remove_dir(&alice.home).unwrap();
    let protectors = h.ok(None, "ListProtectors", &[], &[]);
    let outside = h.fs.path().join("skel");
    std::fs::create_dir(&outside).unwrap();
    let planted = Skel::new();
    std::fs::write(planted.0.join(".profile"), "# hers\n").unwrap();
    chown(planted.0.join(".profile"), Some(alice.uid), None).unwrap();
    let writable = Skel::new();
    std::fs::set_permissions(&writable.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let dotdot = format!("{}/../shadow", planted.0.display());
    for skel in [
        "/etc",
        "/etc/skel/../",
        dotdot.as_str(),
        outside.to_str().unwrap(),
        planted.0.to_str().unwrap(),
        writable.0.to_str().unwrap(),
    ] {
        let opts = format!("{{'skel': <{}>}}", s(skel));
        let msg = h.fails(None, "CreateHome", &[s(&alice.name), fd(3), opts], &[(3, "pw-a")], INVALID);
        assert!(msg.contains("/etc/skel") && msg.contains("dirseal home create"), "{skel}: {msg}");
        assert!(!alice.home.exists(), "{skel}: no home is made");
        assert_eq!(h.ok(None, "ListProtectors", &[], &[]), protectors, "{skel}: no protector is made");
    }
    // The same tree once it is root's: copied.
    chown(planted.0.join(".profile"), Some(0), None).unwrap();
    let opts = format!("{{'skel': <{}>}}", s(planted.0.to_str().unwrap()));
    h.ok(None, "CreateHome", &[s(&alice.name), fd(3), opts], &[(3, "pw-a")]);
    assert_eq!(std::fs::read_to_string(alice.home.join(".profile")).unwrap(), "# hers\n");
}
