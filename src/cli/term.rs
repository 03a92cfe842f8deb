//! The CLI's [`Ui`]: secrets from the terminal without echo, or one line per prompt from a pipe.
use std::io::{self, IsTerminal, Write};

use dirseal::ids::ProtectorId;
use dirseal::presence::Presence;
use dirseal::secret::Passphrase;
use std::path::Path;

use dirseal::recovery::RecoveryKey;
use dirseal::ui::{Question, SecretPrompt, Ui, UiError};
use zeroize::Zeroizing;

/// Longest secret line accepted; longer input is a mistake (a file piped by accident).
const MAX_SECRET: usize = 4096;

pub struct TermUi {
    /// Notices go to stderr when stdout carries JSON.
    pub json: bool,
    /// `--yes`: the conversion question is answered yes without asking.
    pub assume_yes: bool,
}

/// Shorter passwords are accepted, with a warning: whoever copies the keystore can try them
/// offline, at the KDF's cost per guess.
const SHORT_PASSWORD: usize = 8;

/// Turns off terminal echo for its lifetime.
struct NoEcho {
    saved: nix::sys::termios::Termios,
}

impl NoEcho {
    /// No echo, but the newline that ends the line is shown (password prompts).
    fn new() -> Option<NoEcho> {
        use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
        let stdin = io::stdin();
        let saved = tcgetattr(&stdin).ok()?;
        let mut t = saved.clone();
        t.local_flags.remove(LocalFlags::ECHO);
        t.local_flags.insert(LocalFlags::ECHONL);
        tcsetattr(&stdin, SetArg::TCSANOW, &t).ok()?;
        Some(NoEcho { saved })
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(io::stdin(), nix::sys::termios::SetArg::TCSANOW, &self.saved);
    }
}

/// Reads one line from fd 0 a byte at a time into a buffer that never reallocates, without the
/// line terminator; `None` at end of input, an error past `max` bytes. Never through std's
/// `Stdin`: its 8 KiB buffer would keep the secret, and the lines read ahead with it, until the
/// process exits. Every read of standard input in the CLI goes through here, so none is buffered.
///
/// Ctrl-C (or SIGTERM) while it waits, or before it began, is [`UiError::Cancelled`]: the wait
/// is a `poll` that the signal ends (and a short timeout, for a signal taken by another thread),
/// so the line typed after a Ctrl-C is never taken as the answer ([`super::interrupt`]).
fn read_raw_line(max: usize) -> Result<Option<Zeroizing<Vec<u8>>>, UiError> {
    let _catch = super::interrupt::catching();
    let mut buf = Zeroizing::new(Vec::with_capacity(max));
    let mut byte = [0u8; 1];
    loop {
        wait_readable()?;
        match rustix::io::read(io::stdin(), &mut byte[..]) {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                if buf.len() == max {
                    return Err(io::Error::other(format!("input line longer than {max} bytes")).into());
                }
                buf.push(byte[0]);
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        }
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    byte.fill(0);
    Ok(Some(buf))
}

/// Waits until standard input has something to read (or its end); [`UiError::Cancelled`] once a
/// signal has come. On a terminal the cursor is then moved past the prompt (the terminal echoed
/// `^C`, or nothing without echo), so the message that follows starts a line of its own.
fn wait_readable() -> Result<(), UiError> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let stdin = io::stdin();
    loop {
        if super::interrupt::arrived() {
            if stdin.is_terminal() {
                eprintln!();
            }
            return Err(UiError::Cancelled);
        }
        let mut fds = [PollFd::new(&stdin, PollFlags::IN)];
        match poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 100_000_000 })) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(io::Error::from(e).into()),
        }
    }
}

fn read_line() -> Result<Option<Passphrase>, UiError> {
    Ok(read_raw_line(MAX_SECRET)?.map(Passphrase::new))
}

/// Asks for one secret line on stderr, without echo on a terminal. An empty line is never a
/// secret (no KDF runs for it): a terminal asks again, a script gets [`UiError::Empty`]. Ctrl-D
/// on a terminal cancels, on a line of its own.
pub fn ask(prompt: &str) -> Result<Passphrase, UiError> {
    let tty = io::stdin().is_terminal();
    // Caught from the moment the prompt shows: a Ctrl-C at it always cancels.
    let _catch = super::interrupt::catching();
    loop {
        if tty {
            eprint!("{prompt}");
            let _ = io::stderr().flush();
        }
        let echo = if tty { NoEcho::new() } else { None };
        let line = read_line()?;
        drop(echo);
        match line {
            Some(s) if !s.as_bytes().is_empty() => return Ok(s),
            Some(_) if tty => eprintln!("nothing was typed; type it again (Ctrl-D cancels)"),
            Some(_) => return Err(UiError::Empty),
            None if tty => {
                // Ctrl-D leaves the cursor after the prompt: the message goes on its own line.
                eprintln!();
                return Err(UiError::Cancelled);
            }
            None => {
                return Err(UiError::NoInput {
                    hint: "type it on a terminal, or pipe one line per prompt on stdin".into(),
                })
            }
        }
    }
}

/// Asks for one visible line (a menu choice) on a terminal; Ctrl-D cancels.
pub fn ask_visible(prompt: &str) -> Result<String, UiError> {
    let _catch = super::interrupt::catching();
    eprint!("{prompt}");
    let _ = io::stderr().flush();
    match read_raw_line(64)? {
        Some(line) => Ok(String::from_utf8_lossy(&line).into_owned()),
        None => {
            eprintln!();
            Err(UiError::Cancelled)
        }
    }
}

/// "TPM PIN for alice (3 tries left): ": for a device that counts tries, the tries are what matters
/// to the person typing.
fn pin_prompt(name: &str, id: &ProtectorId, device: &str, tries_left: Option<u32>) -> String {
    match (device, tries_left) {
        ("", _) => format!("PIN for protector {} ({id}): ", clean(name)),
        (d, Some(1)) => format!("{d} PIN for {} (1 try left): ", clean(name)),
        (d, Some(n)) => format!("{d} PIN for {} ({n} tries left): ", clean(name)),
        (d, None) => format!("{d} PIN for {} ({id}): ", clean(name)),
    }
}

/// A new secret; asked twice only where a human types (scripts pipe one line per prompt).
fn ask_new(prompt: &str, repeat: &str) -> Result<Passphrase, UiError> {
    let first = ask(prompt)?;
    if io::stdin().is_terminal() {
        let again = ask(repeat)?;
        if again != first {
            return Err(UiError::Mismatch);
        }
    }
    Ok(first)
}

impl Ui for TermUi {
    fn presence(&self) -> Presence {
        dirseal::presence::of_this_process()
    }

    fn secret(&mut self, prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        match prompt {
            SecretPrompt::Password { name, id } => ask(&format!("Password for protector {} ({id}): ", clean(name))),
            SecretPrompt::Pin { name, id, device, tries_left } => ask(&pin_prompt(name, id, device, *tries_left)),
            SecretPrompt::NewPassword { name, uid } => {
                // PAM opens a user's directories with their login password, so the prompt says
                // the two must be the same; the protector's own owner decides, whatever the command.
                let login_user = uid.map(dirseal::account::user_name);
                let tty = io::stdin().is_terminal();
                if tty {
                    match &login_user {
                        Some(user) => eprintln!(
                            "Logging in unlocks this directory only while this password is {}'s login password.",
                            clean(user)
                        ),
                        None => eprintln!(
                            "This password opens the directory with `dirseal unlock`; no login opens it (it belongs to no user)."
                        ),
                    }
                }
                // A protector of no user is named after its kind: "for protector password" would
                // read as a stutter.
                let prompt = match (&login_user, *name) {
                    (None, "password") => "New password: ".to_string(),
                    _ => format!("New password for protector {}: ", clean(name)),
                };
                loop {
                    let first = ask(&prompt)?;
                    if tty {
                        let len = String::from_utf8_lossy(first.as_bytes()).chars().count();
                        if len < SHORT_PASSWORD {
                            eprintln!(
                                "warning: {len} characters are quick to guess for anyone who copies the keystore; a longer one is safer"
                            );
                        }
                        if ask("Repeat the new password: ")? != first {
                            return Err(UiError::Mismatch);
                        }
                        if let Some(user) = &login_user {
                            if !check_login_password(user, &first)? {
                                continue;
                            }
                        }
                    }
                    return Ok(first);
                }
            }
            SecretPrompt::NewPin { name } => {
                ask_new(&format!("New PIN for protector {}: ", clean(name)), "Repeat the new PIN: ")
            }
            SecretPrompt::KeyPin { name } => ask(&format!("PIN of the security key for protector {}: ", clean(name))),
            SecretPrompt::RecoveryKey { dir } => {
                let prompt = format!("Recovery key for {}: ", clean(&dir.display().to_string()));
                // A typo is caught by the key's own check before anything uses it: on a terminal
                // it is asked again, as a mistyped password is (before, the command ended).
                let tries = if io::stdin().is_terminal() { 3 } else { 1 };
                let mut n = 1;
                loop {
                    let typed = ask(&prompt)?;
                    match RecoveryKey::parse(std::str::from_utf8(typed.as_bytes()).unwrap_or("\u{fffd}")) {
                        Err(e) if n < tries => eprintln!("the recovery key is mistyped: {e}; type it again"),
                        // The library parses it again and says what is wrong.
                        _ => return Ok(typed),
                    }
                    n += 1;
                }
            }
        }
    }

    fn confirm(&mut self, q: &Question<'_>) -> Result<bool, UiError> {
        match q {
            Question::Convert { dir, summary } | Question::Decrypt { dir, summary } => {
                let way = Way::of(q);
                let d = clean(&dir.display().to_string());
                if self.assume_yes {
                    // Nothing asked, but a person watching still learns what is starting.
                    if !self.json && io::stderr().is_terminal() {
                        eprintln!("{}", summary_text_for(summary, way));
                    } else {
                        eprintln!("dirseal: {} {d}: {}", way.ing, method_text(summary, way));
                    }
                    return Ok(true);
                }
                if !io::stdin().is_terminal() {
                    return Err(UiError::Unconfirmed {
                        what: format!("{} {d}", way.ing),
                        hint: "pass --yes when not on a terminal".into(),
                    });
                }
                eprintln!("{}", summary_text_for(summary, way));
                confirm(&format!("{} {d} in place?", way.verb))
            }
            // Only on a terminal: scripts say --recovery-key or --no-recovery-key. `--yes` asks
            // nothing but secrets, so no key unless --recovery-key says so.
            Question::CreateRecoveryKey { .. } if self.assume_yes || !io::stdin().is_terminal() => Ok(false),
            Question::CreateRecoveryKey { .. } => confirm(
                "Create a recovery key (the way back in if every password is forgotten or the keystore is lost)?",
            ),
            // As clevis asks; a script pins the key with --thumbprint instead (`--yes` trusts no
            // server: a key it was not told to trust could be anyone's).
            Question::TrustTangServer { url, thumbprints } => {
                if !io::stdin().is_terminal() {
                    return Err(UiError::Unconfirmed {
                        what: format!("trusting the tang server at {}", clean(url)),
                        hint: format!(
                            "pass --thumbprint with the key its tang-show-keys prints (it offers {})",
                            thumbprints.join(", ")
                        ),
                    });
                }
                eprintln!("The advertisement of the tang server at {} is signed by these keys:\n", clean(url));
                for t in thumbprints.iter() {
                    eprintln!("    {t}");
                }
                eprintln!("\nCompare them with what tang-show-keys prints on the server.");
                confirm("Trust these keys?")
            }
        }
    }

    /// Shows the key; on a terminal, has it typed back so a miswritten copy is caught now.
    fn show_recovery_key(&mut self, dir: &Path, key: &RecoveryKey) -> Result<(), UiError> {
        println!(
            "Recovery key for {} — write it down and keep it away from the device; it is shown only once:\n\n    {}\n",
            clean(&dir.display().to_string()),
            &*key.to_display()
        );
        if !io::stdin().is_terminal() {
            return Ok(());
        }
        for _ in 0..3 {
            // Not echoed: the key is a secret, and a typed copy would stay in the scrollback.
            let line = ask("Type the recovery key back to confirm: ")?;
            match RecoveryKey::parse(std::str::from_utf8(line.as_bytes()).unwrap_or("\u{fffd}")) {
                Ok(k) if k == *key => return Ok(()),
                Ok(_) => eprintln!("that is a valid key, but not this one; check what you wrote"),
                Err(e) => eprintln!("{e}"),
            }
        }
        Err(UiError::RecoveryKeyNotConfirmed)
    }

    /// On stderr, so it shows even when stdout is a pipe or JSON.
    fn touch(&mut self, name: &str, _id: Option<&dirseal::ids::ProtectorId>) {
        eprintln!("Touch your security key ({})…", clean(name));
    }

    fn notice(&mut self, msg: &str) {
        if self.json {
            eprintln!("{}", clean(msg));
        } else {
            println!("{}", clean(msg));
        }
    }
}

/// A new password for a user's directory: whether it is their login password decides whether
/// logging in opens it, and root (the CLI always is) can check that against /etc/shadow, the hash
/// `pam_unix` tests, instead of leaving it to the first login. Offered, not done unasked: the
/// answer tells whoever types whether a word is the user's password.
///
/// Whether to keep `typed`: asked before anything is saved when it is not the login password
/// (before, the warning came and the password was saved all the same); false: type another.
fn check_login_password(user: &str, typed: &Passphrase) -> Result<bool, UiError> {
    let u = clean(user);
    if !dirseal::account::has_password(user).unwrap_or(false) {
        return Ok(true);
    }
    if !confirm(&format!("Check it against {u}'s login password now?"))? {
        return Ok(true);
    }
    match dirseal::account::password_is(user, typed) {
        Ok(true) => eprintln!("It is {u}'s login password: logging in as {u} will unlock the directory."),
        Ok(false) => {
            eprintln!(
                "warning: this is not {u}'s login password: logging in as {u} will leave the directory locked until \
                 the two are the same (`passwd {u}` makes them so)"
            );
            if !confirm("Use this password all the same (nothing is saved yet)?")? {
                eprintln!("Type another one (Ctrl-C cancels).");
                return Ok(false);
            }
        }
        Err(e) => eprintln!("could not read {u}'s password entry ({e}); not checked"),
    }
    Ok(true)
}

/// "about 40 s", "about 12 min", "about 3 h 5 min".
fn duration(secs: u64) -> String {
    match secs {
        0..=59 => format!("about {} s", secs.max(1)),
        60..=3599 => format!("about {} min", secs.div_ceil(60)),
        _ => format!("about {} h {} min", secs / 3600, (secs % 3600) / 60),
    }
}

/// What the conversion involves, before the question (issue: a person must know the size, the
/// time, the space, who is locked out and whether a recovery key is made before saying yes).
/// The words that differ between a convert's summary and a decrypt's.
#[derive(Clone, Copy)]
pub struct Way {
    verb: &'static str,
    ing: &'static str,
    /// The command, for "resume with", "--abort", "--commit".
    cmd: &'static str,
    /// What the staging directory is.
    into: &'static str,
    /// What the old tree is, once replaced.
    old: &'static str,
    decrypt: bool,
}

impl Way {
    pub const CONVERT: Way = Way {
        verb: "Encrypt",
        ing: "converting",
        cmd: "convert",
        into: "an encrypted directory",
        old: "the old plaintext",
        decrypt: false,
    };
    pub const DECRYPT: Way = Way {
        verb: "Decrypt",
        ing: "decrypting",
        cmd: "decrypt",
        into: "a plain root-only directory",
        old: "the encrypted tree",
        decrypt: true,
    };

    fn of(q: &Question<'_>) -> Way {
        if matches!(q, Question::Decrypt { .. }) {
            Way::DECRYPT
        } else {
            Way::CONVERT
        }
    }
}

pub fn summary_text_for(s: &dirseal::convert::Summary, way: Way) -> String {
    use indicatif::HumanBytes;
    let d = clean(&s.path.display().to_string());
    let mut out =
        format!("{} {d} in place. {}\n", if way.decrypt { "Decrypting" } else { "Encrypting" }, method_text(s, way));
    let mut data = format!("{}, {} of data", entries(s.entries), HumanBytes(s.data_bytes));
    if s.apparent_bytes > s.data_bytes {
        data.push_str(&format!(" ({} apparent: sparse files count only their data)", HumanBytes(s.apparent_bytes)));
    }
    out.push_str(&format!("  contents:     {data}\n"));
    if let Some(kept) = kept_flags_text(s) {
        out.push_str(&format!("  inode flags:  {kept}\n"));
    }
    out.push_str(&format!(
        "  free space:   needs {}, has {}\n",
        HumanBytes(s.space_needed),
        HumanBytes(s.space_available)
    ));
    out.push_str(&match &s.estimate {
        Some(e) => format!(
            "  time:         {} (measured here: {}/s {} writes, {} µs per file)\n",
            duration(e.seconds),
            HumanBytes(e.write_bytes_per_sec),
            // What the run writes: a decrypt writes plaintext.
            if way.decrypt { "plaintext" } else { "encrypted" },
            e.micros_per_entry
        ),
        None => "  time:         unknown (the write-rate probe could not run)\n".to_string(),
    });
    let who = match (&s.owner_name, s.owner_uid) {
        (_, 0) => "programs must not write in the directory".to_string(),
        (Some(n), uid) => format!("{} (uid {uid}) cannot log in, and nothing may use the directory", clean(n)),
        (None, uid) => format!("uid {uid} cannot log in, and nothing may use the directory"),
    };
    out.push_str(&format!("  meanwhile:    {who}; an interrupted run resumes with `dirseal {} {d}`\n", way.cmd));
    if way.decrypt {
        out.push_str(
            "  keys:         once done, its policy, the protectors only it used and its recovery keys are removed \
             (--keep-protectors keeps the protectors), and the owner logs in with the account password\n",
        );
    } else {
        out.push_str(match s.recovery_key {
            Some(true) => "  recovery key: yes, shown before anything is encrypted\n",
            Some(false) => "  recovery key: no (if every password is lost, so is the data)\n",
            None => "  recovery key: asked next\n",
        });
    }
    out.push_str(&if s.keep_backup {
        format!("  afterwards:   {} is kept until `dirseal {} --commit {d}`", way.old, way.cmd)
    } else if way.decrypt {
        "  afterwards:   the encrypted tree is deleted (its key is removed, so its blocks stay unreadable)".to_string()
    } else if s.wipe {
        "  afterwards:   the old plaintext is overwritten, then deleted".to_string()
    } else {
        "  afterwards:   the old plaintext's blocks are freed, not overwritten; `--scrub` (or `dirseal scrub`) overwrites them"
            .to_string()
    });
    out
}

/// What the summary says of inode flags: "3 entries with kept inode flags (nodump, noatime);
/// 1,204 casefolded directories (kept)", or nothing when there are none.
pub fn kept_flags_text(s: &dirseal::convert::Summary) -> Option<String> {
    let mut parts = Vec::new();
    if s.flagged_entries > 0 {
        let what = if s.kept_flags.is_empty() { "project ids".to_string() } else { s.kept_flags.join(", ") };
        let noun = if s.flagged_entries == 1 { "entry" } else { "entries" };
        parts.push(format!("{} {noun} with kept inode flags ({what})", thousands(s.flagged_entries)));
    }
    if s.casefolded_dirs > 0 {
        let noun = if s.casefolded_dirs == 1 { "directory" } else { "directories" };
        parts.push(format!("{} casefolded {noun} (kept)", thousands(s.casefolded_dirs)));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// 1204 as "1,204".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "1 entry", "2 entries": a count with its noun (before: "1 entries").
pub fn entries(n: u64) -> String {
    if n == 1 {
        "1 entry".to_string()
    } else {
        format!("{n} entries")
    }
}

/// Escapes control characters so a hostile file name or protector name cannot drive the terminal.
pub fn clean(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// y/yes or n/no in any case, around blanks; an empty line takes the default (no). Anything else
/// is not an answer.
fn yes_no(line: &[u8]) -> Option<bool> {
    match line.trim_ascii().to_ascii_lowercase().as_slice() {
        b"y" | b"yes" => Some(true),
        b"n" | b"no" | b"" => Some(false),
        _ => None,
    }
}

/// Asks a yes/no question until it gets an answer (the default is no; end of input is no);
/// Ctrl-C cancels ([`UiError::Cancelled`]), it is never an answer.
///
/// The answer is echoed as typed (only secrets are hidden); anything but an answer is not taken
/// as "no", the question is asked again.
pub fn confirm(question: &str) -> Result<bool, UiError> {
    let tty = io::stdin().is_terminal();
    let _catch = super::interrupt::catching();
    loop {
        eprint!("{question} [y/N] ");
        let _ = io::stderr().flush();
        let answer = match read_line() {
            Ok(Some(l)) => yes_no(l.as_bytes()),
            Err(UiError::Cancelled) => return Err(UiError::Cancelled),
            // End of input or an unreadable line: nothing was agreed to.
            Ok(None) | Err(_) => {
                if tty {
                    eprintln!();
                }
                Some(false)
            }
        };
        match answer {
            Some(a) => return Ok(a),
            None => eprintln!("please answer y or n"),
        }
    }
}

/// Which way the data goes (copy or move) and why, for the confirmation.
fn method_text(c: &dirseal::convert::Summary, way: Way) -> String {
    use indicatif::HumanBytes as B;
    match c.method {
        dirseal::convert::Method::Copy => format!(
            "Its data is copied into {} that replaces it (copy mode{}).",
            way.into,
            if c.auto { ": there is room for a second copy" } else { "" }
        ),
        dirseal::convert::Method::Move => format!(
            "Its data moves into {}, large files chunk by chunk (move mode: {}). \
             There is no backup window: until the move finishes the directory is unusable (logins are \
             refused) and `dirseal {} --abort` moves everything back; once it finishes, {} is gone.",
            way.into,
            if c.auto {
                format!(
                    "a copy needs {}, only {} is free; a move needs {}",
                    B(c.copy_needed),
                    B(c.space_available),
                    B(c.move_needed)
                )
            } else {
                "as asked".to_string()
            },
            way.cmd,
            way.old
        ),
    }
}

#[cfg(test)]
mod tests {
    /// Issue 43: the confirmation says which flags are kept, and how many casefolded directories.
    #[test]
    fn the_summary_names_kept_flags_and_casefolded_directories() {
        let mut s = dirseal::convert::Summary {
            path: "/home/deck".into(),
            entries: 5000,
            data_bytes: 1,
            apparent_bytes: 1,
            space_needed: 1,
            space_available: 2,
            owner_uid: 1000,
            owner_name: None,
            recovery_key: None,
            keep_backup: false,
            wipe: false,
            method: dirseal::convert::Method::Copy,
            auto: false,
            copy_needed: 1,
            move_needed: 1,
            estimate: None,
            flagged_entries: 3,
            kept_flags: vec!["nodump", "noatime"],
            casefolded_dirs: 1204,
        };
        assert_eq!(
            super::kept_flags_text(&s).as_deref(),
            Some("3 entries with kept inode flags (nodump, noatime); 1,204 casefolded directories (kept)")
        );
        let text = super::summary_text_for(&s, super::Way::CONVERT);
        assert!(text.contains("  inode flags:  3 entries with kept inode flags (nodump, noatime)"), "{text}");
        (s.flagged_entries, s.casefolded_dirs) = (0, 0);
        assert_eq!(super::kept_flags_text(&s), None);
        assert!(!super::summary_text_for(&s, super::Way::CONVERT).contains("inode flags"));
    }

    #[test]
    fn yes_no_answers_and_non_answers() {
        use super::yes_no;
        for y in [&b"y"[..], b"Y", b" yes ", b"YES\r"] {
            assert_eq!(yes_no(y), Some(true), "{y:?}");
        }
        for n in [&b"n"[..], b"No", b"", b"  "] {
            assert_eq!(yes_no(n), Some(false), "{n:?}");
        }
        for other in [&b"hunter2"[..], b"yy", b"ja", b"ye s", b"y\x1b"] {
            assert_eq!(yes_no(other), None, "{other:?}");
        }
    }

    #[test]
    fn clean_escapes_controls() {
        assert_eq!(super::clean("a\x1b[31mb\n"), "a\\u{1b}[31mb\\n");
        assert_eq!(super::clean("plain ü"), "plain ü");
    }

    #[test]
    fn pin_prompts_show_tries_left() {
        let id: super::ProtectorId = "0123456789abcdef".parse().unwrap();
        assert_eq!(super::pin_prompt("alice", &id, "TPM", Some(3)), "TPM PIN for alice (3 tries left): ");
        assert_eq!(super::pin_prompt("a\nb", &id, "TPM", Some(1)), "TPM PIN for a\\nb (1 try left): ");
        assert_eq!(super::pin_prompt("k", &id, "", None), "PIN for protector k (0123456789abcdef): ");
    }
}
