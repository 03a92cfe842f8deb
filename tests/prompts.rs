//! What a person at a terminal sees: `convert` and `unlock` driven through a real pseudo-terminal.
//! Yes/no questions re-ask on anything but an answer and show what was typed; secrets never echo;
//! a mistyped or empty secret is asked again; Ctrl-D cancels; Ctrl-C at any question cancels at
//! once with nothing written; `--yes` asks nothing but the secret.
mod common;

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{fresh_uid, p, Env};
use nix::sys::termios::{tcgetattr, LocalFlags};

/// A child process on the slave side of a pty, and everything it wrote to the master.
struct Term {
    master: std::fs::File,
    seen: Arc<Mutex<Vec<u8>>>,
    /// Set when the reader thread has read all the program wrote (EOF or EIO on the master).
    eof: Arc<AtomicBool>,
    child: Child,
}

impl Term {
    fn spawn(env: &Env, args: &[&str]) -> Term {
        // An 80-column terminal, as the bar must fit one.
        let size = nix::pty::Winsize { ws_row: 24, ws_col: 80, ws_xpixel: 0, ws_ypixel: 0 };
        let pty = nix::pty::openpty(Some(&size), None).unwrap();
        let slave: OwnedFd = pty.slave;
        // In a session of its own whose controlling terminal is the pty (`setsid --ctty`), as in
        // a terminal: Ctrl-C typed at the master is SIGINT to dirseal, not just a byte.
        let inner = env.cmd(args);
        let mut cmd = std::process::Command::new("setsid");
        cmd.arg("--ctty")
            .arg(inner.get_program())
            .args(inner.get_args())
            .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))));
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        let child = cmd.spawn().unwrap();
        drop(cmd); // closes our copies of the slave, so the master sees EOF/EIO at exit
        let master = std::fs::File::from(pty.master);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().unwrap();
        let sink = seen.clone();
        let eof = Arc::new(AtomicBool::new(false));
        let at_eof = eof.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            at_eof.store(true, Ordering::Release);
        });
        Term { master, seen, eof, child }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }

    /// Waits until `needle` has appeared `n` times in the output.
    fn wait_for(&mut self, needle: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.text().matches(needle).count() < n {
            if let Ok(Some(st)) = self.child.try_wait() {
                // The reader thread may not have drained the pty yet (a busy machine schedules it
                // late): give it until EOF, then judge.
                let drained = Instant::now() + Duration::from_secs(10);
                while !self.eof.load(Ordering::Acquire) && Instant::now() < drained {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if self.text().matches(needle).count() >= n {
                    return;
                }
                panic!("dirseal exited ({st}) before {needle:?} x{n}:\n{}", self.text());
            }
            assert!(Instant::now() < deadline, "timed out waiting for {needle:?} x{n}:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Types `line` once the program has turned echo off (the master reports the slave's modes),
    /// so anything that shows up in the output was echoed by the program, not by a race.
    fn type_unechoed(&mut self, line: &str) {
        self.type_raw_unechoed(format!("{line}\n").as_bytes());
    }

    /// Types `line` now (a question's answer: echo stays on).
    fn type_line(&mut self, line: &str) {
        self.master.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    /// Writes `bytes` once echo is off (a control character at a secret prompt).
    fn type_raw_unechoed(&mut self, bytes: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while tcgetattr(self.master.as_fd()).unwrap().local_flags.contains(LocalFlags::ECHO) {
            assert!(Instant::now() < deadline, "echo never turned off:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(2));
        }
        self.master.write_all(bytes).unwrap();
    }

    /// Answers the new-password prompt and its repetition.
    fn new_password(&mut self, pw: &str) {
        self.wait_for("New password for protector o", 1);
        self.type_unechoed(pw);
        self.wait_for("Repeat the new password", 1);
        self.type_unechoed(pw);
    }

    fn finish(mut self) -> (bool, String) {
        let st = self.child.wait().unwrap();
        // Let the reader drain what is left (until EOF; a busy machine schedules it late).
        let drained = Instant::now() + Duration::from_secs(10);
        while !self.eof.load(Ordering::Acquire) && Instant::now() < drained {
            std::thread::sleep(Duration::from_millis(10));
        }
        (st.success(), self.text())
    }
}

fn home(env: &Env) -> std::path::PathBuf {
    let d = env.mnt().join("home");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("f"), b"data").unwrap();
    d
}

#[test]
fn questions_re_ask_and_answers_are_echoed() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = home(&env);
    let mut t = Term::spawn(&env, &["convert", p(&d), "--protector-name", "o"]);
    t.wait_for("[y/N]", 1);
    // The summary comes first, from the preflight walk and a measured write rate.
    let text = t.text();
    for needle in [
        "contents:     1 entry, 4 B of data",
        "free space:   needs",
        "time:         about",
        "MiB/s encrypted writes",
        "programs must not write in the directory",
        "recovery key: asked next",
        "`--scrub`",
    ] {
        assert!(text.contains(needle), "{needle:?} missing before the question:\n{text}");
    }
    // Not an answer: asked again. Answers are shown as typed (only secrets are hidden).
    t.type_line("maybe");
    t.wait_for("please answer y or n", 1);
    t.wait_for("[y/N]", 2);
    t.type_line("y");
    t.wait_for("[y/N] y", 1);
    t.wait_for("recovery key", 1);
    t.wait_for("[y/N]", 3);
    t.type_line("n");
    t.new_password("Zq9-secret-pw");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert!(out.contains("is now encrypted"), "{out}");
    assert!(!out.contains("Zq9"), "a secret was echoed:\n{out}");
    assert_eq!(env.status_json(&d)["encrypted"], true);
}

/// An encrypted, locked directory whose protector's password is `right`.
fn locked(env: &Env) -> std::path::PathBuf {
    let d = env.mnt().join("locked");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "o"], "right-pw\n");
    env.ok(&["lock", p(&d)], "");
    d
}

#[test]
fn unlock_forgives_a_typo_and_an_empty_line() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = locked(&env);
    let mut t = Term::spawn(&env, &["unlock", p(&d)]);
    t.wait_for("Password for protector o", 1);
    t.type_unechoed("Zq9-wrong");
    t.wait_for("incorrect password; try again", 1);
    t.wait_for("Password for protector o", 2);
    // An empty line is not tried (no KDF, no wrong try): the prompt comes back.
    t.type_unechoed("");
    t.wait_for("nothing was typed", 1);
    t.wait_for("Password for protector o", 3);
    t.type_unechoed("right-pw");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert!(!out.contains("Zq9"), "a secret was echoed:\n{out}");
    assert_eq!(env.status_json(&d)["key"], "unlocked");
}

/// Every command that asks for a protector's current password forgives a typo on a terminal, as
/// unlock does (before, change-password, protector verify and recovery add ended at once).
#[test]
fn commands_that_ask_a_current_password_forgive_a_typo() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = locked(&env);
    let id = env.status_json(&d)["protectors"][0]["id"].as_str().expect("protector id").to_string();
    for args in
        [vec!["protector", "verify", id.as_str()], vec!["recovery", "add", p(&d)], vec!["change-password", p(&d)]]
    {
        let mut t = Term::spawn(&env, &args);
        t.wait_for("Password for protector o", 1);
        t.type_unechoed("Zq9-wrong");
        t.wait_for("incorrect password; try again", 1);
        t.wait_for("Password for protector o", 2);
        t.type_unechoed("right-pw");
        match args[0] {
            "recovery" => {
                t.wait_for("Type the recovery key back", 1);
                let text = t.text();
                let key = text
                    .lines()
                    .map(str::trim)
                    .find(|l| l.len() == 55 && l.split('-').count() == 8)
                    .unwrap_or_else(|| panic!("no key shown: {text}"))
                    .to_string();
                t.type_unechoed(&key);
            }
            "change-password" => {
                t.wait_for("New password for protector o", 1);
                t.type_unechoed("right-pw");
                t.wait_for("Repeat the new password", 1);
                t.type_unechoed("right-pw");
            }
            _ => {}
        }
        let (ok, out) = t.finish();
        assert!(ok, "{args:?}: {out}");
        assert!(!out.contains("Zq9"), "a secret was echoed:\n{out}");
    }
}

#[test]
fn three_wrong_passwords_end_with_the_way_out() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = locked(&env);
    let mut t = Term::spawn(&env, &["unlock", p(&d)]);
    for n in 1..=3 {
        t.wait_for("Password for protector o", n);
        t.type_unechoed("Zq9-wrong");
    }
    let (ok, out) = t.finish();
    assert!(!ok, "{out}");
    assert_eq!(out.matches("try again").count(), 2, "{out}");
    assert!(out.contains("dirseal unlock --recovery"), "{out}");
    assert_eq!(env.status_json(&d)["key"], "locked");
}

#[test]
fn ctrl_d_at_a_secret_prompt_cancels_on_its_own_line() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = locked(&env);
    let mut t = Term::spawn(&env, &["unlock", p(&d)]);
    t.wait_for("Password for protector o", 1);
    t.type_raw_unechoed(b"\x04");
    let st = t.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = t.text();
    assert_eq!(st.code(), Some(130), "{out}");
    assert!(out.contains("\ndirseal: cancelled; nothing was changed"), "not on its own line:\n{out:?}");
    assert_eq!(env.status_json(&d)["key"], "locked");
}

#[test]
fn yes_asks_nothing_but_the_secret() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = home(&env);
    let mut t = Term::spawn(&env, &["convert", p(&d), "--yes", "--protector-name", "o"]);
    t.new_password("Zq9-secret-pw");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert!(!out.contains("[y/N]"), "--yes asked a question:\n{out}");
    assert!(!out.contains("Zq9"), "{out}");
    assert_eq!(env.status_json(&d)["recovery_key"], false);
}

#[test]
fn end_of_input_at_a_question_is_no() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = home(&env);
    let mut t = Term::spawn(&env, &["convert", p(&d)]);
    t.wait_for("[y/N]", 1);
    // Ctrl-D at the start of a line.
    t.master.write_all(b"\x04").unwrap();
    let (ok, out) = t.finish();
    assert!(!ok && out.contains("cancelled; nothing was changed"), "{out}");
    assert_eq!(env.status_json(&d)["encrypted"], false);
}

/// A home's new password is its owner's login password, or login will not open it: the prompt
/// says so, and a short one is warned about.
#[test]
fn the_new_password_says_what_it_is_for() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = home(&env);
    let uid = fresh_uid();
    std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
    let mut t = Term::spawn(&env, &["convert", p(&d), "--yes", "--protector-name", "o"]);
    t.wait_for("New password for protector o", 1);
    assert!(t.text().contains(&format!("only while this password is uid {uid}'s login password")), "{}", t.text());
    t.type_unechoed("Zq9");
    t.wait_for("quick to guess", 1);
    t.wait_for("Repeat the new password", 1);
    t.type_unechoed("Zq9");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert_eq!(env.status_json(&d)["encrypted"], true);
}

/// The protector's own owner decides what a new password prompt says, whatever the command: a
/// changed password of a user's protector is still that user's login password (before, every
/// command but convert, encrypt, restore and home create said "no login opens it").
#[test]
fn a_changed_password_of_a_users_protector_still_names_the_user() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = home(&env);
    let uid = fresh_uid();
    std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
    env.ok(&["convert", p(&d), "--yes", "--no-recovery-key"], "old-password\n");
    let mut t = Term::spawn(&env, &["change-password", p(&d)]);
    t.wait_for("Password for protector", 1);
    t.type_unechoed("old-password");
    t.wait_for("New password for protector", 1);
    let text = t.text();
    assert!(text.contains(&format!("only while this password is uid {uid}'s login password")), "{text}");
    assert!(!text.contains("no login opens it"), "{text}");
    t.type_unechoed("new-password");
    t.wait_for("Repeat the new password", 1);
    t.type_unechoed("new-password");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");

    // A protector of no user says so.
    let mut t = Term::spawn(&env, &["protector", "create", "--name", "spare"]);
    t.wait_for("New password", 1);
    assert!(t.text().contains("no login opens it"), "{}", t.text());
    t.type_unechoed("spare-password");
    t.wait_for("Repeat the new password", 1);
    t.type_unechoed("spare-password");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
}

/// Two protectors open the directory: a terminal offers them as a numbered menu, re-asks on a
/// non-number, and the chosen one's password unlocks.
#[test]
fn unlock_offers_a_menu_of_protectors() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = locked(&env);
    env.ok(&["unlock", p(&d)], "right-pw\n");
    env.ok(&["policy", "add-protector", p(&d), "--protector-name", "second"], "right-pw\nsecond-pw\n");
    env.ok(&["lock", p(&d)], "");
    let mut t = Term::spawn(&env, &["unlock", p(&d)]);
    t.wait_for("Which one (1-2)?", 1);
    assert!(t.text().contains("1) ") && t.text().contains("2) "), "{}", t.text());
    t.type_line("x");
    t.wait_for("type a number from 1 to 2", 1);
    let text = t.text();
    let line = text.lines().find(|l| l.ends_with("second")).unwrap_or_else(|| panic!("{text}"));
    t.type_line(&line.trim()[..1]);
    t.wait_for("Password for protector second", 1);
    t.type_unechoed("second-pw");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert_eq!(env.status_json(&d)["key"], "unlocked");
}

/// A protector that needs nothing typed (a TPM without PIN) is tried before any menu or prompt;
/// when it cannot open (its PCR changed), the one password protector left is asked directly.
#[test]
fn unlock_tries_what_needs_no_typing_first() {
    dirseal_testfs::needs_root!();
    let tpm = dirseal_testfs::Swtpm::start();
    let env = Env::new();
    let mut f = fs::OpenOptions::new().append(true).open(env.config()).unwrap();
    writeln!(f, "[tpm2]\ntcti = \"{}\"", tpm.tcti()).unwrap();
    drop(f);
    let d = env.mnt().join("quiet");
    fs::create_dir(&d).unwrap();
    env.ok(&["protector", "create", "--type", "tpm2", "--name", "boot", "--no-pin", "--pcr", "7"], "");
    env.ok(&["encrypt", p(&d), "--protector", "boot", "--no-recovery-key"], "");
    env.ok(&["policy", "add-protector", p(&d), "--protector-name", "pw"], "pw-secret\n");
    env.ok(&["lock", p(&d)], "");
    let mut t = Term::spawn(&env, &["unlock", p(&d)]);
    // A menu or a prompt would wait for input: this times out then, naming what was shown.
    t.wait_for("unlocked ", 1);
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert!(!out.contains("Which one") && !out.contains("Password"), "something was asked:\n{out}");
    assert_eq!(env.status_json(&d)["key"], "unlocked");

    env.ok(&["lock", p(&d)], "");
    tpm.pcr_extend(7);
    let mut t = Term::spawn(&env, &["unlock", p(&d)]);
    t.wait_for("Password for protector pw", 1);
    assert!(t.text().contains("protector boot (") && t.text().contains("did not open it"), "{}", t.text());
    assert!(!t.text().contains("Which one"), "{}", t.text());
    t.type_unechoed("pw-secret");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert_eq!(env.status_json(&d)["key"], "unlocked");
}

/// Root converting a user's home may check the new password against the account's: said plainly
/// when it differs, and when it matches. A directory of no user asks "New password:", not "for
/// protector password".
#[test]
fn a_new_home_password_is_checked_against_the_login_password() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let user = dirseal_testfs::User::new(env.mnt());
    user.set_system_password("Login-pw-42");
    fs::write(user.home.join("f"), b"data").unwrap();
    let mut t = Term::spawn(&env, &["convert", user.home_str(), "--yes"]);
    t.wait_for(&format!("New password for protector {}", user.name), 1);
    t.type_unechoed("Other-pw-42");
    t.wait_for("Repeat the new password", 1);
    t.type_unechoed("Other-pw-42");
    t.wait_for("login password now? [y/N]", 1);
    t.type_line("y");
    t.wait_for("this is not", 1);
    t.wait_for("all the same (nothing is saved yet)? [y/N]", 1);
    t.type_line("y");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert!(out.contains(&format!("warning: this is not {}'s login password", user.name)), "{out}");
    assert!(!out.contains("Other-pw") && !out.contains("Login-pw"), "a secret was echoed:\n{out}");

    let d = env.mnt().join("rootdir");
    fs::create_dir(&d).unwrap();
    let mut t = Term::spawn(&env, &["encrypt", p(&d), "--no-recovery-key"]);
    t.wait_for("New password: ", 1);
    assert!(t.text().contains("no login opens it"), "{}", t.text());
    assert!(!t.text().contains("protector password"), "{}", t.text());
    t.type_unechoed("Root-dir-pw-1");
    t.wait_for("Repeat the new password", 1);
    t.type_unechoed("Root-dir-pw-1");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert!(!out.contains("login password now?"), "{out}");
}

/// Issue 44: `change-password` said "not alice's login password" and saved it all the same; it
/// asks first, and a "no" asks for another password, nothing saved.
#[test]
fn a_password_that_is_not_the_login_password_is_confirmed_before_it_is_saved() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let user = dirseal_testfs::User::new(env.mnt());
    user.set_system_password("Login-pw-42");
    fs::write(user.home.join("f"), b"data").unwrap();
    env.ok(&["convert", user.home_str(), "--yes", "--no-recovery-key"], "Old-pw-42\n");
    // change-password up to its last question: a new password that is not the login password.
    let to_the_question = || {
        let mut t = Term::spawn(&env, &["change-password", user.home_str()]);
        t.wait_for("Password for protector", 1);
        t.type_unechoed("Old-pw-42");
        t.wait_for("New password for protector", 1);
        t.type_unechoed("Other-pw-42");
        t.wait_for("Repeat the new password", 1);
        t.type_unechoed("Other-pw-42");
        t.wait_for("login password now? [y/N]", 1);
        t.type_line("y");
        t.wait_for("all the same (nothing is saved yet)? [y/N]", 1);
        t
    };
    let mut t = to_the_question();
    t.type_line("n");
    t.wait_for("New password for protector", 2);
    t.type_raw_unechoed(b"");
    t.ctrl_c();
    env.ok(&["protector", "verify", &user.name], "Old-pw-42\n");
    // "yes" saves it.
    let mut t = to_the_question();
    t.type_line("y");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    env.ok(&["protector", "verify", &user.name], "Other-pw-42\n");
}

/// The matching password is confirmed as such.
#[test]
fn the_login_password_check_confirms_a_match() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let user = dirseal_testfs::User::new(env.mnt());
    user.set_system_password("Login-pw-42");
    let mut t = Term::spawn(&env, &["encrypt", user.home_str(), "--no-recovery-key"]);
    t.wait_for(&format!("New password for protector {}", user.name), 1);
    t.type_unechoed("Login-pw-42");
    t.wait_for("Repeat the new password", 1);
    t.type_unechoed("Login-pw-42");
    t.wait_for("login password now? [y/N]", 1);
    t.type_line("y");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert!(out.contains(&format!("It is {}'s login password", user.name)), "{out}");
}

/// What a terminal shows of `out`: escape sequences removed, one entry per line or redraw.
fn frames(out: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut chars = out.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters, then one final letter.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        plain.push(c);
    }
    plain.split(['\r', '\n']).map(str::to_string).collect()
}

/// The conversion's bar on an 80-column terminal: never wider than the terminal, bytes and files
/// with an estimate; each phase starts a bar of its own.
#[test]
fn the_progress_bar_fits_80_columns() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = home(&env);
    for i in 0..3000 {
        fs::write(d.join(format!("s{i}")), vec![b'x'; 3000]).unwrap();
    }
    fs::write(d.join("big"), vec![7u8; 40 << 20]).unwrap();
    let args = ["convert", p(&d), "--yes", "--no-recovery-key", "--protector-name", "o", "--mode", "copy"];
    let mut t = Term::spawn(&env, &args);
    t.new_password("Zq9-secret-pw");
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    let frames = frames(&out);
    let bars: Vec<&String> = frames.iter().filter(|f| f.contains(" [") && f.contains("] ")).collect();
    assert!(bars.iter().any(|f| f.starts_with("copying") && f.contains("/3002 files")), "{bars:#?}");
    assert!(bars.iter().any(|f| f.contains("ETA ")), "no estimate shown: {bars:#?}");
    assert!(bars.iter().any(|f| f.starts_with("verifying") && f.contains(" 0 B/")), "{bars:#?}");
    // ... and ends with what it compared, kept on screen as each counting phase's last line is
    // (a verify shorter than one progress interval showed only "0 B").
    assert!(
        bars.iter().any(|f| f.starts_with("verifying") && f.contains("48.58 MiB/48.58 MiB  3002/3002")),
        "{bars:#?}"
    );
    assert!(!out.contains("ETA 0 sverifying"), "the next phase's bar was drawn on the kept line: {out:?}");
    // Issue 24: the swap and the disposal count no bytes; their bars read "0 B/120 MiB" to the
    // end. The swap shows a spinner, the disposal the files removed.
    for phase in ["swapping", "disposing"] {
        let shown: Vec<&String> = frames.iter().filter(|f| f.contains(phase)).collect();
        assert!(!shown.is_empty(), "no {phase} line: {frames:#?}");
        assert!(shown.iter().all(|f| !f.contains(" B/")), "{shown:#?}");
    }
    assert!(bars.iter().any(|f| f.starts_with("disposing") && f.contains("/300")), "{bars:#?}");
    for f in &bars {
        // Trailing blanks are the redraw's padding, not text.
        let width = f.trim_end().chars().count();
        assert!(width <= 80, "{width} columns: {f:?}");
    }
}

impl Term {
    /// Types Ctrl-C (the terminal makes it SIGINT), then Enter, as the user did: dirseal
    /// must end at once with status 130, without taking the Enter for an answer. The output.
    fn ctrl_c(mut self) -> String {
        self.master.write_all(b"\x03").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // The pty may be gone already (dirseal exited): nothing to type into then.
        let _ = self.master.write_all(b"\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("dirseal still runs 10 s after Ctrl-C:\n{}", self.text());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let drained = Instant::now() + Duration::from_secs(10);
        while !self.eof.load(Ordering::Acquire) && Instant::now() < drained {
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = self.text();
        assert_eq!(st.code(), Some(130), "{st}:\n{out}");
        assert!(out.contains("cancelled; nothing was changed"), "{out}");
        out
    }
}

/// Nothing in the keystore: no protector, no policy.
fn keystore_empty(env: &Env) {
    let out = env.ok(&["status"], "");
    assert!(out.contains("no protectors"), "{out}");
    assert!(out.contains("no encrypted directories yet"), "{out}");
}

/// Issue 44: Ctrl-C at each of convert's questions cancels it at once, with nothing written (no
/// protector, no policy, no journal). Before, the stop flag swallowed it and the Enter typed next
/// was taken as the answer: at the login-password question that made the protector and started
/// the copy.
#[test]
fn ctrl_c_at_each_convert_question_cancels_with_nothing_written() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let user = dirseal_testfs::User::new(env.mnt());
    user.set_system_password("Login-pw-42");
    fs::write(user.home.join("f"), b"data").unwrap();
    let d = user.home.clone();
    let unchanged = |env: &Env| {
        assert_eq!(env.status_json(&d)["encrypted"], false);
        keystore_empty(env);
        let st = env.ok(&["convert", "--status", p(&d)], "");
        assert!(st.contains("no conversion recorded"), "{st}");
    };
    // The y/N of the summary.
    let mut t = Term::spawn(&env, &["convert", p(&d)]);
    t.wait_for("in place? [y/N]", 1);
    t.ctrl_c();
    unchanged(&env);
    // The recovery key's question.
    let mut t = Term::spawn(&env, &["convert", p(&d)]);
    t.wait_for("in place? [y/N]", 1);
    t.type_line("y");
    t.wait_for("Create a recovery key", 1);
    t.ctrl_c();
    unchanged(&env);
    // The recovery key typed back.
    let mut t = Term::spawn(&env, &["convert", p(&d), "--yes", "--recovery-key"]);
    t.wait_for("Type the recovery key back", 1);
    t.ctrl_c();
    unchanged(&env);
    // The new password, and its repetition.
    for n in 0..2 {
        let mut t = Term::spawn(&env, &["convert", p(&d), "--yes"]);
        t.wait_for("New password for protector", 1);
        if n == 1 {
            t.type_unechoed("Other-pw-42");
            t.wait_for("Repeat the new password", 1);
        }
        // At the prompt itself: its read has turned echo off.
        t.type_raw_unechoed(b"");
        t.ctrl_c();
        unchanged(&env);
    }
    // "Check it against ...'s login password now?", the issue's own case.
    let mut t = Term::spawn(&env, &["convert", p(&d), "--yes"]);
    t.wait_for("New password for protector", 1);
    t.type_unechoed("Other-pw-42");
    t.wait_for("Repeat the new password", 1);
    t.type_unechoed("Other-pw-42");
    t.wait_for("login password now? [y/N]", 1);
    t.ctrl_c();
    unchanged(&env);
}

/// Ctrl-C at decrypt's question, at a password prompt and at the menu of protectors leaves the
/// directory as it was.
#[test]
fn ctrl_c_at_decrypt_unlock_and_the_menu_cancels() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = locked(&env);
    // A password prompt.
    let mut t = Term::spawn(&env, &["unlock", p(&d)]);
    t.wait_for("Password for protector o", 1);
    t.ctrl_c();
    assert_eq!(env.status_json(&d)["key"], "locked");
    // The menu.
    env.ok(&["unlock", p(&d)], "right-pw\n");
    env.ok(&["policy", "add-protector", p(&d), "--protector-name", "second"], "right-pw\nsecond-pw\n");
    env.ok(&["lock", p(&d)], "");
    let mut t = Term::spawn(&env, &["unlock", p(&d)]);
    t.wait_for("Which one (1-2)?", 1);
    t.ctrl_c();
    assert_eq!(env.status_json(&d)["key"], "locked");
    // Decrypt's y/N.
    env.ok(&["unlock", p(&d), "--protector", "o"], "right-pw\n");
    fs::write(d.join("f"), b"data").unwrap();
    let mut t = Term::spawn(&env, &["decrypt", p(&d), "--protector", "o"]);
    t.wait_for("in place? [y/N]", 1);
    // Issue 44: a decrypt writes plaintext; its summary said "encrypted writes".
    assert!(t.text().contains("/s plaintext writes"), "{}", t.text());
    t.ctrl_c();
    let st = env.status_json(&d);
    assert_eq!(st["encrypted"], true, "{st}");
    assert_eq!(st["protectors"].as_array().map(Vec::len), Some(2), "{st}");
    let conv = env.ok(&["decrypt", "--status", p(&d)], "");
    assert!(conv.contains("no conversion recorded"), "{conv}");
}

/// Ctrl-C at the questions of encrypt (the recovery key typed back comes before anything is
/// encrypted now), protector create, recovery add and change-password writes nothing.
#[test]
fn ctrl_c_at_the_other_commands_questions_writes_nothing() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let e = env.mnt().join("empty");
    fs::create_dir(&e).unwrap();
    let mut t = Term::spawn(&env, &["encrypt", p(&e)]);
    t.wait_for("Create a recovery key", 1);
    t.ctrl_c();
    let mut t = Term::spawn(&env, &["encrypt", p(&e)]);
    t.wait_for("Create a recovery key", 1);
    t.type_line("y");
    t.wait_for("Type the recovery key back", 1);
    t.ctrl_c();
    let mut t = Term::spawn(&env, &["encrypt", p(&e), "--no-recovery-key"]);
    t.wait_for("New password", 1);
    t.ctrl_c();
    assert_eq!(env.status_json(&e)["encrypted"], false);
    keystore_empty(&env);
    let mut t = Term::spawn(&env, &["protector", "create", "--name", "spare"]);
    t.wait_for("New password", 1);
    t.ctrl_c();
    keystore_empty(&env);

    let d = locked(&env);
    env.ok(&["unlock", p(&d)], "right-pw\n");
    let mut t = Term::spawn(&env, &["recovery", "add", p(&d)]);
    t.wait_for("Password for protector o", 1);
    t.type_unechoed("right-pw");
    t.wait_for("Type the recovery key back", 1);
    t.ctrl_c();
    assert_eq!(env.status_json(&d)["recovery_key"], false);
    for at in ["Password for protector o", "New password for protector o", "Repeat the new password"] {
        let mut t = Term::spawn(&env, &["change-password", p(&d)]);
        t.wait_for("Password for protector o", 1);
        if at != "Password for protector o" {
            t.type_unechoed("right-pw");
            t.wait_for("New password for protector o", 1);
        }
        if at == "Repeat the new password" {
            t.type_unechoed("Zq9-changed");
            t.wait_for(at, 1);
        }
        // At the prompt itself: its read has turned echo off.
        t.type_raw_unechoed(b"");
        t.ctrl_c();
    }
    env.ok(&["protector", "verify", "o"], "right-pw\n");
}

/// Issue 44: Ctrl-C at `home create`'s recovery-key question leaves no home and no protector
/// (before, the home was encrypted first: a Ctrl-C there left an empty, root-only, encrypted home
/// nobody could log in to, and a rerun said "already encrypted").
#[test]
fn ctrl_c_at_home_creates_recovery_key_question_leaves_nothing() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let u = dirseal_testfs::User::new(env.mnt());
    fs::remove_dir(&u.home).unwrap();
    let mut t = Term::spawn(&env, &["home", "create", &u.name]);
    t.wait_for("Create a recovery key", 1);
    t.ctrl_c();
    assert!(!u.home.exists(), "the home was made");
    keystore_empty(&env);
}

/// Issue 44: a mistyped recovery key (its check digits catch it) ended the command; on a terminal
/// it is asked again, as a mistyped password is.
#[test]
fn a_mistyped_recovery_key_is_asked_again() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("rk");
    fs::create_dir(&d).unwrap();
    let out = env.ok(&["encrypt", p(&d), "--protector-name", "o", "--recovery-key"], "pw\n");
    let key = out
        .split_whitespace()
        .find(|w| w.len() == 55 && w.split('-').count() == 8)
        .unwrap_or_else(|| panic!("no key shown: {out}"))
        .to_string();
    env.ok(&["lock", p(&d)], "");
    let mut t = Term::spawn(&env, &["unlock", "--recovery", p(&d)]);
    t.wait_for("Recovery key for", 1);
    // One digit off in the last group.
    let mut typo = key.clone().into_bytes();
    typo[54] = if typo[54] == b'9' { b'0' } else { typo[54] + 1 };
    t.type_unechoed(std::str::from_utf8(&typo).unwrap());
    t.wait_for("type it again", 1);
    t.wait_for("Recovery key for", 2);
    t.type_unechoed(&key);
    let (ok, out) = t.finish();
    assert!(ok, "{out}");
    assert!(out.contains("the recovery key is mistyped"), "{out}");
    assert_eq!(env.status_json(&d)["key"], "unlocked");
}

/// Issue 44: a resumed move's bar stayed at 54 % once the move was done (the run counts only
/// what it moved itself, and a phase's bar is kept on screen as it last was); a phase that is
/// over is shown full, with its totals.
#[cfg(feature = "fault-injection")]
#[test]
fn a_resumed_moves_bar_ends_full() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = home(&env);
    for i in 0..1000 {
        fs::write(d.join(format!("s{i}")), vec![b'x'; 3000]).unwrap();
    }
    fs::write(d.join("big"), vec![7u8; 8 << 20]).unwrap();
    let args = ["convert", p(&d), "--yes", "--no-recovery-key", "--protector-name", "o", "--mode", "move"];
    // Stopped (as by a crash) after a good part of the small files was moved.
    let mut c = env
        .cmd(&args)
        .env("DIRSEAL_FAULT", "move-entry-removed:600")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b"pw\n").unwrap();
    let out = c.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(99), "{}", String::from_utf8_lossy(&out.stderr));
    let (ok, out) = Term::spawn(&env, &["convert", p(&d)]).finish();
    assert!(ok, "{out}");
    let frames = frames(&out);
    let moving: Vec<&String> =
        frames.iter().filter(|f| f.starts_with("moving") && f.contains(" [") && f.contains("] ")).collect();
    let last = moving.last().unwrap_or_else(|| panic!("no moving bar: {frames:#?}"));
    let bar = &last[last.find(" [").unwrap() + 2..last.find("] ").unwrap()];
    assert!(!bar.contains(' ') && !bar.contains('>'), "the move's last bar is not full: {last:?}\n{moving:#?}");
    assert!(last.contains("1002/1002 files"), "{last:?}");
}
