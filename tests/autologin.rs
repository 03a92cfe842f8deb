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
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    let gdm_on = |key: &str| last(&gdm, &["daemon"], key).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let gdm_user = if gdm_on("AutomaticLoginEnable") {
        last(&gdm, &["daemon"], "AutomaticLogin").unwrap_or_default()
    } else if gdm_on("TimedLoginEnable") {
        last(&gdm, &["daemon"], "TimedLogin").unwrap_or_default()
    } else {
        String::new()
    };
    (
        last(&sddm, &["Autologin"], "User").unwrap_or_default(),
        last(&lightdm, &["Seat:*", "SeatDefaults"], "autologin-user").unwrap_or_default(),
        gdm_user,
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

/// SDDM's files in its order, for keys `seen` does not cover.
fn sddm_files(root: &Path) -> Vec<PathBuf> {
    [
        sorted(root.join("usr/lib/sddm/sddm.conf.d")),
        sorted(root.join("etc/sddm.conf.d")),
        vec![root.join("etc/sddm.conf")],
    ]
    .concat()
}

#[test]
fn gdm_timed_login_and_lightdm_timed_login_get_the_greeter_a_guest_is_left_alone() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let u = User::new(env.mnt());
    env.ok(&["encrypt", u.home_str(), "--user", &u.name, "--no-recovery-key"], "pw-of-u\n");
    env.ok(&["lock", u.home_str()], "");
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    fs::create_dir_all(r.join("run")).unwrap();
    // A guest has a fresh account and no home of dirseal's: as configured, nothing written.
    put(r, "/etc/lightdm/lightdm.conf", "[Seat:*]\nautologin-guest=true\nautologin-session=gnome\n");
    assert_eq!(status(&env, r), Vec::<serde_json::Value>::new());
    let before = tree(r);
    assert_eq!(check(&env, r), Vec::<serde_json::Value>::new());
    assert_eq!(tree(r), before);

    // GDM logs the user in from its greeter after 10 s; LightDM after 10 s too.
    put(
        r,
        "/etc/gdm3/daemon.conf",
        &format!("[daemon]\nTimedLoginEnable=true\nTimedLogin={}\nTimedLoginDelay=10\n", u.name),
    );
    put(
        r,
        "/etc/lightdm/lightdm.conf",
        &format!("[SeatDefaults]\nautologin-user={}\nautologin-user-timeout=10\n", u.name),
    );
    assert_eq!(seen(r).1, u.name);
    assert_eq!(seen(r).2, u.name);
    let st = status(&env, r);
    let field = |v: &[serde_json::Value], f: &str| v.iter().map(|x| x[f].clone()).collect::<Vec<_>>();
    assert_eq!(field(&st, "manager"), ["lightdm", "gdm"]);
    assert_eq!(field(&st, "kind"), ["timed", "timed"]);
    assert_eq!(field(&st, "next_boot"), [2, 2]);
    let out = check(&env, r);
    assert_eq!(field(&out, "case"), [2, 2], "{out:?}");
    assert_eq!((seen(r).1, seen(r).2), (String::new(), String::new()), "no timed login onto the locked home");
    let gdm = fs::read_to_string(r.join("etc/gdm3/daemon.conf")).unwrap();
    assert!(gdm.contains("TimedLoginEnable=false") && gdm.contains("TimedLoginDelay=10"), "{gdm}");
    assert_eq!(field(&status(&env, r), "greeter_now"), [true, true]);
    env.ok(&["autologin", "clear", "--root", p(r)], "");
    assert_eq!(seen(r).2, u.name);
}

/// The command dirseal-autologin.service runs after the check (ExecStopPost), as systemd would
/// run it with `result` in SERVICE_RESULT, the dirseal binary `bin`, the display managers below
/// `root`, and a `systemctl` that only logs its arguments to `root/systemctl.log`.
fn stop_post(root: &Path, bin: &str, result: &str) {
    let unit = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/systemd/dirseal-autologin.service"))
        .unwrap();
    let line = unit.lines().find_map(|l| l.strip_prefix("ExecStopPost=")).expect("the unit has an ExecStopPost");
    let script = line.strip_prefix("/bin/sh -c '").and_then(|l| l.strip_suffix('\'')).expect("/bin/sh -c '…'");
    let script = script
        .replace("$$", "$")
        .replace("/usr/sbin/dirseal autologin off", &format!("{bin} autologin off --root {}", p(root)));
    let stub = root.join("stub");
    fs::create_dir_all(&stub).unwrap();
    let log = root.join("systemctl.log");
    put(&stub, "systemctl", &format!("#!/bin/sh\necho \"$*\" >> {}\n[ \"$1\" != is-active ]\n", p(&log)));
    Command::new("chmod").arg("755").arg(stub.join("systemctl")).status().unwrap();
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .env("SERVICE_RESULT", result)
        .env("PATH", format!("{}:/usr/bin:/bin", p(&stub)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_failed_check_leaves_autologin_off_and_a_dirseal_that_cannot_run_keeps_the_manager_from_starting() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let u = User::new(env.mnt());
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    configure(r, &u.name);
    let on = seen(r);
    let bin = env!("CARGO_BIN_EXE_dirseal");
    // A check that succeeded: nothing more.
    stop_post(r, bin, "success");
    assert_eq!(seen(r), on);
    // It failed (exit status, signal, timeout): every autologin off, whatever the home; this needs
    // no keystore (here one that cannot be read: the check itself fails on it).
    let bad = env.etc.path().join("bad-keystore");
    fs::create_dir_all(&bad).unwrap();
    Command::new("chmod").arg("777").arg(&bad).status().unwrap();
    let out = env.cmd(&["autologin", "check", "--root", p(r)]).env("DIRSEAL_KEYSTORE", &bad).output().unwrap();
    assert!(!out.status.success(), "a world-writable keystore is refused");
    for result in ["exit-code", "timeout", "signal"] {
        stop_post(r, bin, result);
        assert_eq!(seen(r), (String::new(), String::new(), String::new(), "qtvirtualkeyboard".into()), "{result}");
    }
    assert!(!r.join("systemctl.log").exists(), "the display manager starts (with its greeter)");
    env.ok(&["autologin", "clear", "--root", p(r)], "");
    assert_eq!(seen(r), on);
    // dirseal does not run at all: the display manager's queued start is stopped.
    stop_post(r, "/nonexistent/dirseal", "exit-code");
    let log = fs::read_to_string(r.join("systemctl.log")).unwrap();
    assert_eq!(log, "is-active --quiet display-manager.service\n--no-block stop display-manager.service\n");
}

#[test]
fn a_check_killed_while_the_tpm_hangs_leaves_autologin_off_an_opened_home_turns_sddm_relogin_off() {
    dirseal_testfs::needs_root!();
    let mut tpm = Swtpm::start();
    let env = Env::new();
    writeln!(fs::OpenOptions::new().append(true).open(env.config()).unwrap(), "[tpm2]\ntcti = \"{}\"", tpm.tcti())
        .unwrap();
    let u = User::new(env.mnt());
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    configure(r, &u.name);
    put(r, "/etc/sddm.conf.d/steamos.conf", &format!("[Autologin]\nUser={}\nRelogin=true\n", u.name));
    let on = seen(r);
    let create = ["encrypt", u.home_str(), "--user", &u.name, "--protector-type", "tpm2", "--no-pin", "--pcr", "7"];
    env.ok(&[&create[..], &["--protector-name", "boot", "--no-recovery-key"]].concat(), "");

    // Case 1 with SDDM's Relogin: autologin proceeds, but a logout (which locks the home) must not
    // log the user in again onto the locked home.
    env.ok(&["lock", u.home_str()], "");
    let out = check(&env, r);
    assert_eq!(each(&out, "case"), [1, 1, 1], "{out:?}");
    assert_eq!(seen(r), on);
    assert_eq!(last(&sddm_files(r), &["Autologin"], "Relogin").as_deref(), Some("false"));
    assert_eq!(each(&out, "relogin"), [true, false, false]);

    // The TPM stops answering (its port accepts, nothing replies): the check hangs until systemd's
    // timeout kills it. Autologin must be off by then.
    env.ok(&["lock", u.home_str()], "");
    let port: u16 = tpm.tcti().rsplit_once("port=").unwrap().1.parse().unwrap();
    tpm.stop();
    let _hang = (
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap(),
        std::net::TcpListener::bind(("127.0.0.1", port + 1)).unwrap(),
    );
    let mut child =
        env.cmd(&["autologin", "check", "--root", p(r)]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let off = (String::new(), String::new(), String::new(), "qtvirtualkeyboard".to_string());
    let start = Instant::now();
    while seen(r) != off && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "the check is still waiting for the TPM");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(seen(r), off, "killed on the way, the check left autologin off");
    assert_eq!(env.status_json(&u.home)["key"], "locked");
    env.ok(&["autologin", "clear", "--root", p(r)], "");
    assert_eq!(seen(r), on);
}
