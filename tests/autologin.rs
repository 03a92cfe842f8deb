//! Display managers' autologin onto an encrypted home (docs/pam.md, "Handhelds: automatic
//! login"), through the `dirseal` binary: real users whose homes are on a loop-mounted ext4, a
//! software TPM, and SDDM, LightDM and GDM configurations below a temporary root. What a display
//! manager would see is read here the way it reads it (its files in its order, through the bind
//! mounts), not through dirseal's own parser.
mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{p, Env};
use dirseal_testfs::{Swtpm, User};

fn put(root: &Path, path: &str, text: &str) {
    let f = root.join(path.trim_start_matches('/'));
    fs::create_dir_all(f.parent().unwrap()).unwrap();
    fs::write(f, text).unwrap();
}

/// The three managers configured to log `user` in: SDDM in a conf.d file (SteamOS's layout),
/// LightDM in its main file (which a drop-in cannot override), GDM in daemon.conf (no drop-ins).
fn configure(root: &Path, user: &str) {
    // As on a running system (the runtime copies go there).
    fs::create_dir_all(root.join("run")).unwrap();
    put(root, "/usr/lib/sddm/sddm.conf.d/default.conf", "[Autologin]\nUser=\nSession=\n\n[General]\nInputMethod=\n");
    put(root, "/etc/sddm.conf.d/steamos.conf", &format!("[Autologin]\nUser={user}\nSession=gamescope-wayland\n"));
    put(
        root,
        "/etc/lightdm/lightdm.conf",
        &format!("[LightDM]\n\n[Seat:*]\n#autologin-guest=false\nautologin-user={user}\nautologin-user-timeout=0\n"),
    );
    put(
        root,
        "/etc/gdm3/daemon.conf",
        &format!("[daemon]\nAutomaticLoginEnable=true\nAutomaticLogin={user}\n\n[security]\n"),
    );
}

/// Every file below `root` (but dirseal's runtime directory) with its contents as read now, so a
/// copy still mounted over a file shows.
fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if rel == Path::new("run/dirseal-autologin") {
                continue;
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                out.insert(rel, "<dir>".into());
                walk(root, &path, out);
            } else if meta.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&path).unwrap().display()));
            } else {
                out.insert(rel, fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The last value of `key` in `sections` over `files` in order, as the manager reads them.
fn last(files: &[PathBuf], sections: &[&str], key: &str) -> Option<String> {
    let mut found = None;
    for f in files {
        let Ok(text) = fs::read_to_string(f) else { continue };
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.trim_matches(['[', ']']).to_string();
            } else if let Some((k, v)) = line.split_once('=') {
                if !line.starts_with('#') && k.trim() == key && sections.contains(&section.as_str()) {
                    found = Some(v.trim().to_string());
                }
            }
        }
    }
    found
}

fn sorted(dir: PathBuf) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "conf"));
    v.sort();
    v
}

/// Whom each manager logs in automatically as it would read its configuration now ("" = nobody),
/// and SDDM's input method.
fn seen(root: &Path) -> (String, String, String, String) {
    let sddm = [
        sorted(root.join("usr/lib/sddm/sddm.conf.d")),
        sorted(root.join("etc/sddm.conf.d")),
        vec![root.join("etc/sddm.conf")],
    ]
    .concat();
    let lightdm =
        [sorted(root.join("etc/lightdm/lightdm.conf.d")), vec![root.join("etc/lightdm/lightdm.conf")]].concat();
    let gdm = [root.join("etc/gdm3/daemon.conf")];
    let gdm_on = last(&gdm, &["daemon"], "AutomaticLoginEnable").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    (
        last(&sddm, &["Autologin"], "User").unwrap_or_default(),
        last(&lightdm, &["Seat:*", "SeatDefaults"], "autologin-user").unwrap_or_default(),
        if gdm_on { last(&gdm, &["daemon"], "AutomaticLogin").unwrap_or_default() } else { String::new() },
        last(&sddm, &["General"], "InputMethod").unwrap_or_default(),
    )
}

fn json(env: &Env, args: &[&str]) -> Vec<serde_json::Value> {
    let out = env.ok(args, "");
    serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}")).as_array().unwrap().clone()
}

/// `field` of each manager's entry, in the order sddm, lightdm, gdm.
fn each(list: &[serde_json::Value], field: &str) -> Vec<serde_json::Value> {
    assert_eq!(list.iter().map(|v| v["manager"].as_str().unwrap()).collect::<Vec<_>>(), ["sddm", "lightdm", "gdm"]);
    list.iter().map(|v| v[field].clone()).collect()
}

fn check(env: &Env, root: &Path) -> Vec<serde_json::Value> {
    json(env, &["autologin", "check", "--root", p(root), "--json"])
}

fn status(env: &Env, root: &Path) -> Vec<serde_json::Value> {
    json(env, &["autologin", "status", "--root", p(root), "--json"])
}

#[test]
fn password_only_home_gets_the_greeter_on_every_manager_an_open_or_plain_home_leaves_them_as_configured() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let u = User::new(env.mnt());
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    configure(r, &u.name);
    let before = tree(r);
    let name = u.name.clone();
    let autologin_on = (name.clone(), name.clone(), name.clone(), String::new());
    assert_eq!(seen(r), autologin_on);

    // 3: not encrypted.
    assert_eq!(each(&status(&env, r), "next_boot"), [3, 3, 3]);
    let out = check(&env, r);
    assert_eq!(each(&out, "case"), [3, 3, 3]);
    assert_eq!(tree(r), before, "a plain home leaves every file as it was");

    // 2: encrypted, only a password opens it.
    env.ok(&["encrypt", u.home_str(), "--user", &u.name, "--no-recovery-key"], "pw-of-u\n");
    env.ok(&["lock", u.home_str()], "");
    let st = status(&env, r);
    assert_eq!(each(&st, "next_boot"), [2, 2, 2]);
    assert_eq!(each(&st, "state"), ["locked", "locked", "locked"]);
    let out = check(&env, r);
    assert_eq!(each(&out, "case"), [2, 2, 2], "{out:?}");
    assert_eq!(seen(r), (String::new(), String::new(), String::new(), "qtvirtualkeyboard".into()));
    assert_eq!(env.status_json(&u.home)["key"], "locked", "nothing opened it");
    // The managers' own files are untouched beneath the copies: only dirseal's drop-ins are new.
    let now = tree(r);
    let added: Vec<&PathBuf> = now.keys().filter(|k| !before.contains_key(*k)).collect();
    assert_eq!(added, [Path::new("etc/sddm.conf.d/zz-dirseal-autologin.conf")]);
    // Status still reads the configuration (the originals beneath the copies), and says this boot's.
    let st = status(&env, r);
    assert_eq!(each(&st, "user"), [name.as_str(), name.as_str(), name.as_str()]);
    assert_eq!(each(&st, "greeter_now"), [true, true, true]);
    // A second check (the unit restarted) finds the same and leaves one copy per file.
    assert_eq!(each(&check(&env, r), "case"), [2, 2, 2]);
    assert_eq!(seen(r).0, "");

    // 1 with nothing to do: the home is open (a display manager restarted in a session).
    env.ok(&["unlock", u.home_str()], "pw-of-u\n");
    let out = check(&env, r);
    assert_eq!(each(&out, "case"), [1, 1, 1]);
    assert_eq!(each(&out, "plan"), ["already-open", "already-open", "already-open"]);
    assert_eq!(seen(r), autologin_on);
    assert_eq!(tree(r), before, "dirseal's files are gone, the managers' are as they were");
    // At the next boot it is locked again: the greeter.
    assert_eq!(each(&status(&env, r), "next_boot"), [2, 2, 2]);

    // `clear` (uninstall) removes everything a check made.
    env.ok(&["lock", u.home_str()], "");
    assert_eq!(each(&check(&env, r), "case"), [2, 2, 2]);
    env.ok(&["autologin", "clear", "--root", p(r)], "");
    assert_eq!(tree(r), before);
    assert_eq!(seen(r), autologin_on);

    // 3 again: SDDM now logs in a user whose home is not encrypted; the drop-in made for the
    // first one goes (LightDM and GDM still log in the first).
    assert_eq!(each(&check(&env, r), "case"), [2, 2, 2]);
    let v = User::new(env.mnt());
    put(r, "/etc/sddm.conf.d/steamos.conf", &format!("[Autologin]\nUser={}\n", v.name));
    assert_eq!(each(&check(&env, r), "case"), [3, 2, 2]);
    assert!(!r.join("etc/sddm.conf.d/zz-dirseal-autologin.conf").exists());
    assert_eq!(seen(r), (v.name.clone(), String::new(), String::new(), String::new()));
    env.ok(&["autologin", "clear", "--root", p(r)], "");
}

#[test]
fn a_tpm_without_pin_opens_the_home_before_the_manager_a_changed_pcr_shows_the_greeter() {
    dirseal_testfs::needs_root!();
    let tpm = Swtpm::start();
    let env = Env::new();
    writeln!(fs::OpenOptions::new().append(true).open(env.config()).unwrap(), "[tpm2]\ntcti = \"{}\"", tpm.tcti())
        .unwrap();
    let u = User::new(env.mnt());
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    configure(r, &u.name);
    let before = tree(r);
    let create = ["encrypt", u.home_str(), "--user", &u.name, "--protector-type", "tpm2", "--no-pin", "--pcr", "7"];
    env.ok(&[&create[..], &["--protector-name", "boot", "--no-recovery-key"]].concat(), "");
    fs::write(u.home.join("f"), b"game saves").unwrap();
    env.ok(
        &[
            "policy",
            "add-protector",
            u.home_str(),
            "--protector-type",
            "password",
            "--protector-name",
            "pw",
            "--user",
            &u.name,
        ],
        "pw-of-u\n",
    );
    env.ok(&["lock", u.home_str()], "");

    let st = status(&env, r);
    assert_eq!(each(&st, "next_boot"), [1, 1, 1]);
    assert_eq!(st[0]["no_typing"][0]["name"], "boot");
    let out = check(&env, r);
    assert_eq!(each(&out, "case"), [1, 1, 1], "{out:?}");
    assert_eq!(out[0]["opened_with"]["name"], "boot", "the first manager's check opened it");
    assert_eq!(out[1]["plan"], "already-open", "the others found it open");
    assert_eq!(env.status_json(&u.home)["key"], "unlocked");
    assert_eq!(fs::read(u.home.join("f")).unwrap(), b"game saves");
    assert_eq!(tree(r), before, "autologin proceeds as configured");

    // The boot chain changed (PCR 7): the TPM refuses, so no session may start on the locked home.
    env.ok(&["lock", u.home_str()], "");
    tpm.pcr_extend(7);
    let out = check(&env, r);
    assert_eq!(each(&out, "case"), [2, 2, 2], "{out:?}");
    assert_eq!(out[0]["plan"], "open-without-typing");
    let problems = out[0]["problems"].to_string();
    assert!(problems.contains("PCR"), "{problems}");
    assert_eq!(env.status_json(&u.home)["key"], "locked");
    assert_eq!(seen(r), (String::new(), String::new(), String::new(), "qtvirtualkeyboard".into()));
    env.ok(&["autologin", "clear", "--root", p(r)], "");
}

#[test]
fn install_and_uninstall_leave_the_display_managers_files_as_they_were() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let u = User::new(env.mnt());
    env.ok(&["encrypt", u.home_str(), "--user", &u.name, "--no-recovery-key"], "pw-of-u\n");
    env.ok(&["lock", u.home_str()], "");
    let dest = tempfile::tempdir().unwrap();
    let d = dest.path();
    configure(d, &u.name);
    let before = tree(d);
    // install.sh takes the binaries from a build directory: the real CLI (it clears the drop-ins
    // at uninstall) and the man pages its build wrote, stand-ins for the others.
    let build = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dirseal"), build.path().join("dirseal")).unwrap();
    std::os::unix::fs::symlink(env!("DIRSEAL_DOCS_DIR"), build.path().join("dirseal-docs")).unwrap();
    fs::write(build.path().join("dirsealed"), "").unwrap();
    fs::write(build.path().join("dirseal-tpm2"), "").unwrap();
    fs::write(build.path().join("dirseal-fido2"), "").unwrap();
    fs::write(build.path().join("libpam_dirseal.so"), "").unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let sh = |args: &[&str]| {
        let out = Command::new("bash").arg(&script).args(args).output().unwrap();
        assert!(out.status.success(), "install.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    sh(&["--destdir", p(d), "--build-dir", p(build.path())]);
    let unit = fs::read_to_string(d.join("usr/lib/systemd/system/dirseal-autologin.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/sbin/dirseal autologin check") && unit.contains("Before=display-manager.service")
    );
    let link = d.join("etc/systemd/system/graphical.target.wants/dirseal-autologin.service");
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("/usr/lib/systemd/system/dirseal-autologin.service"));

    // The installed binary's check at "boot": the greeter for all three.
    let installed = d.join("usr/sbin/dirseal");
    let out = Command::new(&installed)
        .args(["autologin", "check", "--root", p(d)])
        .env("DIRSEAL_CONFIG", env.config())
        .env("DIRSEAL_KEYSTORE", env.keystore())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(seen(d).0, "");
    assert_eq!(seen(d).1, "", "the copy is mounted over lightdm.conf");

    sh(&["--uninstall", "--destdir", p(d)]);
    let mut expected = before.clone();
    // Kept on purpose: the config dir (it may hold settings).
    expected.insert("etc/dirseal".into(), "<dir>".into());
    assert_eq!(tree(d), expected, "the uninstall leaves exactly the managers' files, as they were");
    assert_eq!(seen(d).1, u.name);
}
