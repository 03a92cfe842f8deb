//! `dirseal home create` on a scratch ext4 with real users (issue 27): the home is encrypted
//! before the skeleton goes in, everything in it is the user's, and homes it must not touch are
//! refused. Creates users: run under the global suite lock (scripts/test.sh).
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{p, Env, Options};
use dirseal_testfs::User;

fn lsattr_encrypted(dir: &Path) -> bool {
    let o = Command::new("lsattr").arg("-d").arg(dir).output().unwrap();
    String::from_utf8_lossy(&o.stdout).split_whitespace().next().is_some_and(|f| f.contains('E'))
}

/// A skeleton with what a faithful copy must keep: modes (a private file, a set-gid dir), a
/// symlink, a nested dir, an xattr and a modification time.
fn skeleton(at: &Path) {
    std::fs::create_dir_all(at.join(".config/app")).unwrap();
    std::fs::write(at.join(".bashrc"), "# rc\n").unwrap();
    std::fs::set_permissions(at.join(".bashrc"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(at.join(".private"), "p").unwrap();
    std::fs::set_permissions(at.join(".private"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(at.join(".config/app/settings"), "x=1\n").unwrap();
    std::fs::set_permissions(at.join(".config"), std::fs::Permissions::from_mode(0o2750)).unwrap();
    std::os::unix::fs::symlink(".bashrc", at.join("rc-link")).unwrap();
    let o =
        Command::new("setfattr").args(["-n", "user.origin", "-v", "skel"]).arg(at.join(".bashrc")).output().unwrap();
    assert!(o.status.success(), "setfattr: {}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new("touch").args(["-h", "-d", "2001-02-03 04:05:06"]).arg(at.join(".private")).output().unwrap();
    assert!(o.status.success());
}

#[test]
fn home_create_makes_an_encrypted_home_from_the_skeleton() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let skel = env.mnt().join("skel");
    skeleton(&skel);
    let u = User::new(env.mnt());
    std::fs::remove_dir(&u.home).unwrap();
    let out =
        env.ok(&["home", "create", &u.name, "--skel", p(&skel), "--no-recovery-key", "--json"], "pw-home\npw-home\n");
    let v: serde_json::Value =
        serde_json::from_str(out.lines().last().unwrap()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let r = &v["result"];
    assert_eq!(r["home"], p(&u.home));
    assert_eq!(r["entries"], 6, "{r}");
    // Encrypted, as an independent tool sees it.
    assert!(lsattr_encrypted(&u.home));
    let gid = nix::unistd::User::from_name(&u.name).unwrap().unwrap().gid.as_raw();
    let meta = std::fs::metadata(&u.home).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (u.uid, gid));
    let defs = dirseal::home::LoginDefs::read(Path::new("/etc/login.defs"));
    assert_eq!(meta.mode() & 0o7777, defs.home_mode);
    // The skeleton, faithfully, and the user's.
    for rel in [".bashrc", ".private", ".config", ".config/app", ".config/app/settings", "rc-link"] {
        let (a, b) =
            (std::fs::symlink_metadata(skel.join(rel)).unwrap(), std::fs::symlink_metadata(u.home.join(rel)).unwrap());
        assert_eq!(b.mode(), a.mode(), "{rel}");
        assert_eq!((b.uid(), b.gid()), (u.uid, gid), "{rel}");
        if !a.file_type().is_symlink() {
            assert_eq!(b.mtime(), a.mtime(), "{rel}");
        }
    }
    assert_eq!(std::fs::read_link(u.home.join("rc-link")).unwrap(), Path::new(".bashrc"));
    assert_eq!(std::fs::read_to_string(u.home.join(".config/app/settings")).unwrap(), "x=1\n");
    let o = Command::new("getfattr")
        .args(["--only-values", "-n", "user.origin"])
        .arg(u.home.join(".bashrc"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "skel");
    // One protector, the user's, named after them, opens it.
    let st = env.status_json(&u.home);
    assert_eq!(st["encrypted"], true);
    let prots = st["protectors"].as_array().unwrap();
    assert_eq!(prots.len(), 1, "{st}");
    assert_eq!(prots[0]["name"], u.name.as_str());
    assert_eq!(prots[0]["uid"], u.uid);
    env.ok(&["lock", p(&u.home)], "");
    env.ok(&["unlock", p(&u.home)], "pw-home\n");
    assert_eq!(std::fs::read_to_string(u.home.join(".bashrc")).unwrap(), "# rc\n");
    // An existing empty home is fine too; the skeleton may be absent (an empty home).
    let w = User::new(env.mnt());
    let none = env.mnt().join("no-skel");
    env.ok(&["home", "create", &w.name, "--skel", p(&none), "--no-recovery-key"], "pw-w\npw-w\n");
    assert!(lsattr_encrypted(&w.home));
    assert_eq!(std::fs::read_dir(&w.home).unwrap().count(), 0);
    // Issue 44: piped, "created ..." was said twice (the library's notice, then the CLI's line),
    // and one entry was "1 entries".
    let x = User::new(env.mnt());
    std::fs::remove_dir(&x.home).unwrap();
    let one = env.mnt().join("one-skel");
    std::fs::create_dir(&one).unwrap();
    std::fs::write(one.join(".profile"), "# p\n").unwrap();
    let out = env.ok(&["home", "create", &x.name, "--skel", p(&one), "--no-recovery-key"], "pw-x\npw-x\n");
    assert_eq!(out.matches("created ").count(), 1, "{out}");
    assert!(out.contains("1 entry copied from"), "{out}");
}

#[test]
fn home_create_refuses_a_home_with_files_and_a_filesystem_that_cannot_encrypt() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let u = User::new(env.mnt());
    std::fs::write(u.home.join("notes"), "mine").unwrap();
    let err = env.fails(&["home", "create", &u.name, "--no-recovery-key"], "pw\npw\n");
    assert!(err.contains("dirseal convert"), "{err}");
    assert_eq!(std::fs::read_to_string(u.home.join("notes")).unwrap(), "mine");
    assert!(!lsattr_encrypted(&u.home));
    let err = env.fails(&["home", "create", "dst-no-such-user", "--no-recovery-key"], "pw\npw\n");
    assert!(err.contains("useradd"), "{err}");

    let plain = Env::with(Options { encrypt: false, ..Default::default() });
    let v = User::new(plain.mnt());
    std::fs::remove_dir(&v.home).unwrap();
    let err = plain.fails(&["home", "create", &v.name, "--no-recovery-key"], "pw\npw\n");
    assert!(err.contains("encrypt"), "{err}");
    assert!(!v.home.exists(), "nothing may be created on a filesystem that cannot encrypt");
    assert!(plain.ok(&["protector", "list"], "").lines().all(|l| !l.contains(&v.name)));
}

/// Issue 44: a home left encrypted but unfinished (empty, root's, 0700: where `home create`
/// stopped when it was interrupted after encrypting) is finished by running it again, instead of
/// "already encrypted" and a home nobody could log in to. Made here as the code leaves it: the
/// user's own protector, named after them, encrypts the root-only home; its key is then unloaded
/// (a reboot), so the rerun asks for the password.
#[test]
fn home_create_finishes_a_half_made_home() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let skel = env.mnt().join("skel");
    skeleton(&skel);
    let u = User::new(env.mnt());
    std::os::unix::fs::chown(&u.home, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&u.home, std::fs::Permissions::from_mode(0o700)).unwrap();
    env.ok(&["encrypt", p(&u.home), "--user", &u.name, "--no-recovery-key"], "pw-half\n");
    env.ok(&["lock", p(&u.home)], "");
    let out = env.ok(&["home", "create", &u.name, "--skel", p(&skel), "--no-recovery-key"], "pw-half\n");
    assert!(out.contains("not finished: finishing it"), "{out}");
    let meta = std::fs::metadata(&u.home).unwrap();
    assert_eq!(meta.uid(), u.uid);
    let defs = dirseal::home::LoginDefs::read(Path::new("/etc/login.defs"));
    assert_eq!(meta.mode() & 0o7777, defs.home_mode);
    assert_eq!(std::fs::read_to_string(u.home.join(".bashrc")).unwrap(), "# rc\n");
    assert_eq!(std::fs::symlink_metadata(u.home.join(".bashrc")).unwrap().uid(), u.uid);
    let st = env.status_json(&u.home);
    assert_eq!(st["protectors"].as_array().map(Vec::len), Some(1), "{st}");
    // Finished: a further run refuses, as for any home that holds files.
    let err = env.fails(&["home", "create", &u.name, "--skel", p(&skel), "--no-recovery-key"], "pw-half\n");
    assert!(err.contains("already holds files"), "{err}");
    // An encrypted empty home of another making (not root's) is not taken for a half-made one.
    let v = User::new(env.mnt());
    env.ok(&["encrypt", p(&v.home), "--user", &v.name, "--no-recovery-key"], "pw-v\n");
    let err = env.fails(&["home", "create", &v.name, "--no-recovery-key"], "pw-v\npw-v\n");
    assert!(err.contains("already encrypted"), "{err}");
}
