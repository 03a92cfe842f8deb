//! scripts/install.sh into a temp destdir: every file in its place (checked by listing), the unit
//! accepted by `systemd-analyze verify`, and --uninstall leaving the tree as it was.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").to_path_buf()
}

/// Where the workspace's debug artifacts are (dirseal, dirsealed, libpam_dirseal.so).
fn build_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_dirsealed")).parent().expect("bin dir").to_path_buf();
    for f in ["dirseal", "libpam_dirseal.so"] {
        assert!(dir.join(f).exists(), "{} is missing: build the whole workspace first (scripts/test.sh does)", f);
    }
    dir
}

fn install(destdir: &Path, extra: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(repo().join("scripts/install.sh"))
        .arg("--destdir")
        .arg(destdir)
        .arg("--build-dir")
        .arg(build_dir())
        .args(extra)
        .output()
        .expect("install.sh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "install.sh {extra:?} failed:\n{text}");
    text
}

/// Every entry under `root`, relative, sorted, with its permission bits; directories end in `/`.
fn listing(root: &Path) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = dirseal_testfs::tree::walk(root)
        .into_iter()
        .map(|rel| {
            let meta = std::fs::symlink_metadata(root.join(&rel)).expect("stat");
            let slash = if meta.is_dir() { "/" } else { "" };
            (format!("{}{slash}", rel.display()), meta.permissions().mode() & 0o7777)
        })
        .collect();
    out.sort();
    out
}

fn multiarch() -> String {
    let out = Command::new("dpkg-architecture").arg("-qDEB_HOST_MULTIARCH").output().expect("dpkg-architecture");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The man pages the build wrote beside the binaries (dirseal's build.rs), independently of the script.
fn man_pages() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(build_dir().join("dirseal-docs/man"))
        .expect("man")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    assert!(v.contains(&"dirseal.8".to_string()) && v.len() > 10, "{v:?}");
    v
}

#[test]
fn install_lays_out_every_file_and_uninstall_restores_the_tree() {
    let dest = tempfile::tempdir().expect("tempdir");
    let root = dest.path();
    // Something that was there before and must survive: a shared directory with a foreign file.
    std::fs::create_dir_all(root.join("usr/share/man/man1")).unwrap();
    std::fs::write(root.join("usr/share/man/man1/other.1"), b"not ours").unwrap();
    let before = listing(root);

    let text = install(root, &["--prefix", "/usr"]);
    assert!(text.contains("pam-auth-update --enable dirseal"), "says what to do next: {text}");
    let ma = multiarch();
    let mut expected: Vec<(String, u32)> = vec![
        ("usr/sbin/dirseal".into(), 0o755),
        ("usr/libexec/dirsealed".into(), 0o755),
        ("usr/libexec/dirseal-tpm2".into(), 0o755),
        ("usr/libexec/dirseal-fido2".into(), 0o755),
        (format!("usr/lib/{ma}/security/pam_dirseal.so"), 0o644),
        ("usr/share/pam-configs/dirseal".into(), 0o644),
        ("usr/share/pam-configs/dirseal-pin".into(), 0o644),
        ("usr/share/pam-configs/dirseal-mkhome".into(), 0o644),
        ("usr/share/dbus-1/system.d/org.dirseal.Dirseal1.conf".into(), 0o644),
        ("usr/share/dbus-1/system-services/org.dirseal.Dirseal1.service".into(), 0o644),
        ("usr/share/dbus-1/interfaces/org.dirseal.Dirseal1.xml".into(), 0o644),
        ("usr/share/polkit-1/actions/org.dirseal.Dirseal1.policy".into(), 0o644),
        ("usr/lib/systemd/system/dirsealed.service".into(), 0o644),
        ("usr/lib/systemd/system/dirseal-autologin.service".into(), 0o644),
        // The unit's enable link (a symlink: its mode is 0777).
        ("etc/systemd/system/graphical.target.wants/dirseal-autologin.service".into(), 0o777),
        ("usr/lib/systemd/system/dirseal-convert-boot.service".into(), 0o644),
        ("etc/systemd/system/graphical.target.wants/dirseal-convert-boot.service".into(), 0o777),
        ("etc/systemd/system/multi-user.target.wants/dirseal-convert-boot.service".into(), 0o777),
        // Network-bound unlock at boot: installed, not enabled (opt-in).
        ("usr/lib/systemd/system/dirseal-unlock-boot.service".into(), 0o644),
        ("usr/share/bash-completion/completions/dirseal".into(), 0o644),
        ("usr/share/zsh/vendor-completions/_dirseal".into(), 0o644),
        ("usr/share/fish/vendor_completions.d/dirseal.fish".into(), 0o644),
        ("usr/share/dirseal/install-manifest".into(), 0o644),
        ("usr/share/dirseal/install-manifest.dirs".into(), 0o644),
        ("usr/share/man/man1/other.1".into(), 0o644),
        ("etc/dirseal/".into(), 0o700),
    ];
    for m in man_pages() {
        // A page's section is its file's extension: dirsealed.8 goes to man8.
        let section = m.rsplit('.').next().unwrap_or("1");
        expected.push((format!("usr/share/man/man{section}/{m}"), 0o644));
    }
    expected.sort();
    let files: Vec<(String, u32)> =
        listing(root).into_iter().filter(|(p, _)| !p.ends_with('/') || p == "etc/dirseal/").collect();
    assert_eq!(files, expected);
    // Installed files are the shipped ones.
    for (src, dst) in [
        ("data/dbus-1/system.d/org.dirseal.Dirseal1.conf", "usr/share/dbus-1/system.d/org.dirseal.Dirseal1.conf"),
        ("data/pam-configs/dirseal", "usr/share/pam-configs/dirseal"),
        ("data/pam-configs/dirseal-pin", "usr/share/pam-configs/dirseal-pin"),
        ("data/pam-configs/dirseal-mkhome", "usr/share/pam-configs/dirseal-mkhome"),
        ("data/systemd/dirsealed.service", "usr/lib/systemd/system/dirsealed.service"),
        ("data/polkit-1/actions/org.dirseal.Dirseal1.policy", "usr/share/polkit-1/actions/org.dirseal.Dirseal1.policy"),
    ] {
        assert_eq!(std::fs::read(repo().join(src)).unwrap(), std::fs::read(root.join(dst)).unwrap(), "{dst}");
    }

    // The installed unit passes systemd's own checks (its ExecStart pointed into the destdir).
    if Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let unit = std::fs::read_to_string(root.join("usr/lib/systemd/system/dirsealed.service")).unwrap();
        let exe = root.join("usr/libexec/dirsealed");
        let vdir = tempfile::tempdir().unwrap();
        let vunit = vdir.path().join("dirsealed.service");
        std::fs::write(&vunit, unit.replace("/usr/libexec/dirsealed", exe.to_str().unwrap())).unwrap();
        let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&vunit).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.trim().is_empty(), "systemd-analyze verify: {text}");
        // The check can fail: an unknown directive is reported.
        std::fs::write(
            &vunit,
            format!("{}\nNoSuchDirective=1\n", unit.replace("/usr/libexec/dirsealed", exe.to_str().unwrap())),
        )
        .unwrap();
        let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&vunit).output().unwrap();
        assert!(!String::from_utf8_lossy(&out.stderr).trim().is_empty(), "verify reports unknown directives");
    } else {
        eprintln!("systemd-analyze not present: unit verification skipped");
    }

    install(root, &["--uninstall", "--prefix", "/usr"]);
    let mut after = listing(root);
    // Kept on purpose: the config dir may hold settings (and the keystore lives beside it).
    after.retain(|(p, _)| p != "etc/dirseal/" && p != "etc/");
    assert_eq!(after, before, "uninstall leaves the tree as it was");
}

#[test]
fn another_prefix_moves_binaries_and_the_unit_but_not_what_only_one_place_reads() {
    let dest = tempfile::tempdir().expect("tempdir");
    let root = dest.path();
    install(root, &["--prefix", "/opt/ds"]);
    assert!(root.join("opt/ds/sbin/dirseal").exists() && root.join("opt/ds/libexec/dirsealed").exists());
    let unit = std::fs::read_to_string(root.join("opt/ds/lib/systemd/system/dirsealed.service")).unwrap();
    assert!(unit.contains("ExecStart=/opt/ds/libexec/dirsealed "), "{unit}");
    // libpam, pam-auth-update, dbus-daemon and polkitd read only these places.
    assert!(root.join(format!("usr/lib/{}/security/pam_dirseal.so", multiarch())).exists());
    assert!(root.join("usr/share/pam-configs/dirseal").exists());
    assert!(root.join("usr/share/dbus-1/system.d/org.dirseal.Dirseal1.conf").exists());
    assert!(root.join("usr/share/polkit-1/actions/org.dirseal.Dirseal1.policy").exists());
    install(root, &["--uninstall", "--prefix", "/opt/ds"]);
    let left: Vec<String> = listing(root).into_iter().map(|(p, _)| p).collect();
    assert_eq!(left, vec!["etc/".to_string(), "etc/dirseal/".to_string()]);
}

#[test]
fn a_file_that_was_there_before_is_backed_up_and_restored_not_deleted() {
    let dest = tempfile::tempdir().expect("tempdir");
    let root = dest.path();
    let theirs = root.join("usr/share/zsh/vendor-completions/_dirseal");
    std::fs::create_dir_all(theirs.parent().unwrap()).unwrap();
    std::fs::write(&theirs, b"# someone else's completion\n").unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = listing(root);

    let text = install(root, &["--prefix", "/usr"]);
    assert!(text.contains("kept a copy of 1 file"), "says it kept the old file: {text}");
    assert_ne!(std::fs::read(&theirs).unwrap(), b"# someone else's completion\n", "ours is installed");
    // A second install over the first backs up nothing of its own and keeps the first backup.
    let text = install(root, &["--prefix", "/usr"]);
    assert!(text.contains("kept a copy of 1 file"), "the earlier backup is still recorded: {text}");

    install(root, &["--uninstall", "--prefix", "/usr"]);
    assert_eq!(std::fs::read(&theirs).unwrap(), b"# someone else's completion\n", "restored, not deleted");
    let mut after = listing(root);
    after.retain(|(p, _)| p != "etc/dirseal/" && p != "etc/");
    assert_eq!(after, before, "uninstall leaves the tree as it was, modes included");
}
