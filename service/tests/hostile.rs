//! dirsealed against a local user who wants to disturb it or learn about others (issue 21): a
//! stalled caller holds up no one else, the log cannot be forged, jobs are private, a cancelled
//! move is undone, and an unnamed Unlock follows the caller's login order. Creates users: run
//! only under the global suite lock (scripts/test.sh).
mod support;

use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

#[cfg(feature = "fault-injection")]
use dirseal_testfs::tree::{assert_same, entries_manifest};
use zbus::zvariant::OwnedValue;

use support::{encrypt_home, fd, fill, job_path, s, strings, watch_jobs, Harness, JobSignal, User, DENIED, NAME, PATH};

const INVALID: &str = "org.freedesktop.DBus.Error.InvalidArgs";

/// `gdbus` run as `u` in the background (stdout and stderr piped); `fd3` is shell redirection
/// text for descriptor 3, if any.
fn gdbus_as(h: &Harness, u: &User, args: &[&str], fd3: Option<&str>) -> Child {
    let mut script = "exec gdbus \"$@\"".to_string();
    if let Some(r) = fd3 {
        script.push_str(&format!(" 3{r}"));
    }
    Command::new("setpriv")
        .args([format!("--reuid={}", u.uid), format!("--regid={}", u.uid)])
        .args(["--clear-groups", "--", "bash", "-c", &script, "gdbus"])
        .args(args)
        .env_clear()
        .env("DBUS_SYSTEM_BUS_ADDRESS", &h.bus.address)
        .env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdbus")
}

fn output(mut c: Child) -> String {
    let _ = c.wait();
    let mut out = String::new();
    c.stdout.take().expect("stdout").read_to_string(&mut out).expect("read");
    c.stderr.take().expect("stderr").read_to_string(&mut out).expect("read");
    out
}

/// Four calls whose secret pipe is never closed (the most one user may have in flight; a fifth is
/// refused at once): another user's and root's GetStatus answer within 2 s meanwhile.
#[test]
fn a_caller_that_never_sends_its_secret_stalls_no_one_else() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let bob = h.user();
    encrypt_home(&h, &alice, "pw-a");
    encrypt_home(&h, &bob, "pw-b");
    let method = format!("{NAME}.Unlock");
    let home = format!("'{}'", alice.home_str());
    let args = ["call", "--system", "--dest", NAME, "--object-path", PATH, "--method", &method, &home, "''", "@h 3"];
    // The pipe's writer (a sleep) never writes and outlives the service's 10 s limit.
    let mut stuck: Vec<Child> = (0..5).map(|_| gdbus_as(&h, &alice, &args, Some("< <(exec sleep 15)"))).collect();
    let t = Instant::now();
    let refused = loop {
        assert!(t.elapsed() < Duration::from_secs(8), "no fifth call was refused: {}", h.daemon.log_text());
        if let Some(i) = stuck.iter_mut().position(|c| c.try_wait().expect("wait").is_some()) {
            break output(stuck.remove(i));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(refused.contains("org.freedesktop.DBus.Error.LimitsExceeded"), "{refused}");
    // Four of alice's calls are now waiting for their secrets, for 10 s: others ask, repeatedly
    // over the first few seconds of that (more asking only gives a stall more chances to show).
    for _ in 0..4 {
        let t = Instant::now();
        h.ok(Some(&bob), "GetStatus", &[s(bob.home_str())], &[]);
        h.ok(Some(&bob), "ListProtectors", &[], &[]);
        assert_eq!(h.key(&alice.home), "unlocked");
        let took = t.elapsed();
        assert!(took < Duration::from_secs(2), "other callers waited {took:?} behind a stalled one");
        std::thread::sleep(Duration::from_millis(500));
    }
    // A call that needs the one-at-a-time lock is not held up either.
    let t = Instant::now();
    h.ok(Some(&bob), "Lock", &[s(bob.home_str()), "false".into()], &[]);
    h.ok(Some(&bob), "Unlock", &[s(bob.home_str()), s(""), fd(3)], &[(3, "pw-b")]);
    assert!(t.elapsed() < Duration::from_secs(2), "bob's Unlock waited {:?}", t.elapsed());
    // Each stalled call waited for its own secret, side by side: none queued behind another
    // (queued, the later ones would read only after the writer exited, an empty secret).
    for c in stuck {
        let out = output(c);
        assert!(out.contains("timed out"), "{out}\n{}", h.daemon.log_text());
    }
}

/// A directory argument with a newline cannot plant a line in the log.
#[test]
fn a_newline_in_an_argument_is_escaped_in_the_log() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let bob = h.user();
    let forged = "dirsealed: Lock(/home/victim) by uid 0: ok";
    h.fails(
        Some(&bob),
        "GetStatus",
        &[format!("'/nonexistent\\n{forged}'")],
        &[],
        "org.dirseal.Dirseal1.Error.NotFound",
    );
    let long = format!("/{}", "x".repeat(5000));
    h.fails(Some(&bob), "GetStatus", &[s(&long)], &[], "org.dirseal.Dirseal1.Error.NotFound");
    let log = h.daemon.log_text();
    assert!(!log.lines().any(|l| l.starts_with(forged)), "a forged line:\n{log}");
    assert!(log.contains(&format!("GetStatus(/nonexistent\\n{forged}) by uid {}", bob.uid)), "{log}");
    assert!(log.lines().all(|l| l.len() < 3000), "a log line is not capped");
}

/// Waits for the end of job `job` among `rx`'s signals.
fn wait_end(rx: &Receiver<JobSignal>, job: &str, h: &Harness) -> String {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(JobSignal::Finished { path, state }) if path == job => return state,
            Ok(JobSignal::Failed { path, name, message }) if path == job => {
                panic!("{name}: {message}\n{}", h.daemon.log_text())
            }
            _ => {}
        }
    }
    panic!("{job} did not end within 120 s\n{}", h.daemon.log_text());
}

fn encrypted(h: &Harness, dir: &std::path::Path) -> bool {
    bool::try_from(h.status(dir)["encrypted"].try_clone().unwrap()).unwrap()
}

/// Another user can read nothing of a job: Get and GetAll are refused, and no Progress or
/// Finished reaches their connection; the owner (and root) get both.
#[test]
fn another_users_job_is_private() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let bob = h.user();
    fill(&alice.home, 16, 1 << 20, alice.uid);
    let rx = watch_jobs(&h.bus);
    // Bob listens to everything the service sends, from before the job starts.
    let mut monitor = gdbus_as(&h, &bob, &["monitor", "--system", "--dest", NAME], None);
    let mut first = [0u8; 1];
    monitor.stdout.as_mut().expect("stdout").read_exact(&mut first).expect("gdbus monitor started");
    let job = job_path(&h.ok(Some(&alice), "Convert", &[s(alice.home_str()), fd(3), "{}".into()], &[(3, "pw-a")]));
    assert_eq!(wait_end(&rx, &job, &h), "done");
    let props = "org.freedesktop.DBus.Properties";
    let iface = s("org.dirseal.Dirseal1.Job");
    for prop in ["Dir", "Owner", "State"] {
        let args = [iface.clone(), s(prop)];
        let e = h.call_at(Some(&bob), &job, &format!("{props}.Get"), &args, &[], None).unwrap_err();
        assert_eq!(e.name, DENIED, "{prop}: {}", e.message);
    }
    // GetAll too (zbus alone would answer an empty dictionary).
    let e =
        h.call_at(Some(&bob), &job, &format!("{props}.GetAll"), std::slice::from_ref(&iface), &[], None).unwrap_err();
    assert_eq!(e.name, DENIED, "GetAll: {}", e.message);
    let own = h
        .call_at(Some(&alice), &job, &format!("{props}.GetAll"), std::slice::from_ref(&iface), &[], None)
        .expect("GetAll");
    assert!(own.contains("'done'") && own.contains(alice.home_str()), "{own}");
    // The owner's own monitor would have seen the signals; bob's saw none of them.
    let _ = monitor.kill();
    let seen = output(monitor);
    assert!(!seen.contains("Progress") && !seen.contains("Finished"), "bob received job signals:\n{seen}");
}

/// Unlock with no protector named tries the caller's own protectors in the login order; a name
/// two of them share is refused, naming both.
#[test]
fn unlock_follows_the_callers_login_order() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let home = s(alice.home_str());
    encrypt_home(&h, &alice, "pw-a");
    h.ok(
        Some(&alice),
        "AddProtectorToPolicy",
        &[home.clone(), s(""), fd(3), s(""), fd(4), s("zz-second")],
        &[(3, "pw-a"), (4, "pw-z")],
    );
    h.ok(Some(&alice), "Lock", &[home.clone(), "false".into()], &[]);
    // The second in the order (by name) opens it.
    h.ok(Some(&alice), "Unlock", &[home.clone(), s(""), fd(3)], &[(3, "pw-z")]);
    assert_eq!(h.key(&alice.home), "unlocked");
    h.ok(Some(&alice), "Lock", &[home.clone(), "false".into()], &[]);
    let msg = h.fails(
        Some(&alice),
        "Unlock",
        &[home.clone(), s(""), fd(3)],
        &[(3, "nope")],
        "org.dirseal.Dirseal1.Error.IncorrectSecret",
    );
    assert!(msg.contains("zz-second"), "{msg}");
    h.ok(Some(&alice), "Unlock", &[home.clone(), s("zz-second"), fd(3)], &[(3, "pw-z")]);
    // Two of hers named alike.
    let a = strings(&h.ok(Some(&alice), "CreateProtector", &[s("dup"), fd(3), "{}".into()], &[(3, "x")]))[0].clone();
    let b = strings(&h.ok(Some(&alice), "CreateProtector", &[s("dup"), fd(3), "{}".into()], &[(3, "y")]))[0].clone();
    let msg = h.fails(Some(&alice), "Unlock", &[home.clone(), s("dup"), fd(3)], &[(3, "x")], INVALID);
    assert!(msg.contains(&a) && msg.contains(&b), "{msg}");
}

/// An unnamed Unlock does not fail whole because the PIN rule refuses one of the caller's
/// protectors a try: that one is skipped and the next in the login order is tried (here the
/// password, which opens). Only when none could be tried is the refusal the answer.
#[test]
fn unlock_skips_a_protector_the_pin_rule_refuses() {
    dirseal_testfs::needs_root!();
    // Ten tries reserved for someone at the device: while the TPM allows twelve, root adds her
    // TPM protector (one right PIN); then four, so no try is left for a caller over the bus.
    let tpm = dirseal_testfs::Swtpm::start_owned();
    let auth = dirseal_testfs::Swtpm::OWNER_AUTH;
    let tries = |n: &str| tpm.tool(&["tpm2_dictionarylockout", "-s", "-n", n, "-t", "1000", "-l", "1000", "-p", auth]);
    tries("12").unwrap();
    let h = Harness::with_config(&format!("[tpm2]\ntcti = \"{}\"\nmin_local_tries = 10\n", tpm.tcti()));
    let alice = h.user();
    let home = s(alice.home_str());
    let (_, pw) = encrypt_home(&h, &alice, "pw-a");
    let pin = h.ok(Some(&alice), "CreateProtector", &[s("a-pin"), fd(3), "{'kind': <'tpm2'>}".into()], &[(3, "1234")]);
    let pin = strings(&pin)[0].clone();
    h.ok(
        None,
        "AddProtectorToPolicy",
        &[home.clone(), s(&pw), fd(3), s(&pin), fd(4), s("")],
        &[(3, "pw-a"), (4, "1234")],
    );
    tries("4").unwrap();
    h.ok(Some(&alice), "Lock", &[home.clone(), "false".into()], &[]);
    h.ok(Some(&alice), "Unlock", &[home.clone(), s(""), fd(3)], &[(3, "pw-a")]);
    assert_eq!(h.key(&alice.home), "unlocked");
    // With the password protector gone, the one left is refused: that refusal is the answer.
    h.ok(None, "RemoveProtectorFromPolicy", &[home.clone(), s(&pw)], &[]);
    h.ok(Some(&alice), "Lock", &[home.clone(), "false".into()], &[]);
    let msg = h.fails(Some(&alice), "Unlock", &[home.clone(), s(""), fd(3)], &[(3, "1234")], DENIED);
    assert!(msg.contains("tries"), "{msg}");
    assert_eq!(h.key(&alice.home), "locked");
}

/// Cancel while a move-mode conversion is moving (held there by the fault-injection build):
/// the files move back and the home is as it was, in plaintext.
#[cfg(feature = "fault-injection")]
#[test]
fn cancelling_a_move_moves_the_data_back() {
    dirseal_testfs::needs_root!();
    let mut h = Harness::new();
    let hold = h.etc.path().join("hold");
    h.restart_with(&[("DIRSEAL_FAULT", "move-entry-copied:50"), ("DIRSEAL_FAULT_HOLD", hold.to_str().unwrap())]);
    let alice = h.user();
    fill(&alice.home, 8, 1 << 20, alice.uid);
    let small = alice.home.join("small");
    std::fs::create_dir(&small).unwrap();
    std::os::unix::fs::chown(&small, Some(alice.uid), Some(alice.uid)).unwrap();
    fill(&small, 300, 512, alice.uid);
    let original = entries_manifest(&alice.home);
    let rx = watch_jobs(&h.bus);
    let opts = "{'mode': <'move'>}".to_string();
    let job = job_path(&h.ok(Some(&alice), "Convert", &[s(alice.home_str()), fd(3), opts], &[(3, "pw-a")]));
    let t = Instant::now();
    while !hold.exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "the move never reached the hold\n{}", h.daemon.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = dirseal::convert::status(&alice.home).unwrap().expect("journal");
    assert_eq!(st.state, dirseal::convert::State::Moving);
    h.call_at(Some(&alice), &job, "org.dirseal.Dirseal1.Job.Cancel", &[], &[], None).expect("Cancel");
    std::fs::remove_file(&hold).unwrap();
    assert_eq!(wait_end(&rx, &job, &h), "aborted");
    assert!(!encrypted(&h, &alice.home));
    assert_same(&entries_manifest(&alice.home), &original, "not as before the move");
}

/// PlanConvert answers what the CLI's `convert --json` shows as its `plan` before asking, field
/// for field (the measured estimate aside: two probes never measure alike).
#[test]
fn plan_convert_is_the_clis_plan() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    fill(&alice.home, 4, 1 << 20, alice.uid);
    // An inode flag the copy keeps: listed by both (`kept_flags`, a list: `as` on the bus).
    let flagged = std::fs::read_dir(&alice.home).unwrap().flatten().find(|e| e.path().is_file()).unwrap().path();
    assert!(Command::new("chattr").arg("+d").arg(&flagged).status().unwrap().success());
    let reply = h
        .root
        .call_method(
            Some(NAME),
            PATH,
            Some(NAME),
            "PlanConvert",
            &(alice.home_str(), HashMap::<String, OwnedValue>::new()),
        )
        .expect("PlanConvert");
    let plan: HashMap<String, OwnedValue> = reply.body().deserialize().expect("a{sv}");
    let cli = std::path::Path::new(env!("CARGO_BIN_EXE_dirsealed")).with_file_name("dirseal");
    assert!(cli.exists(), "{} is missing: build the whole workspace first (scripts/test.sh does)", cli.display());
    // No --yes: the CLI prints its plan, then cannot ask (no terminal) and converts nothing.
    let out = Command::new(&cli)
        .arg("--config")
        .arg(h.config())
        .arg("--keystore")
        .arg(h.keystore())
        .args(["convert", "--json", "--no-recovery-key", alice.home_str()])
        .stdin(Stdio::null())
        .output()
        .expect("dirseal");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("{\"plan\"")).unwrap_or_else(|| panic!("no plan line: {text}"));
    let json: serde_json::Value = serde_json::from_str(line).expect("json");
    let want = json["plan"].as_object().expect("plan object");
    assert!(!encrypted(&h, &alice.home), "the CLI converted without a yes");
    for (k, v) in want {
        if k == "estimate" {
            continue;
        }
        if k == "space_available" {
            // The first rate probe makes the filesystem's root-only .dirseal (a block or two).
            let (got, want) = (u64::try_from(plan.get(k.as_str()).expect(k)).unwrap(), v.as_u64().unwrap());
            assert!(got.abs_diff(want) <= 64 << 10, "{k}: {got} against {want}");
            continue;
        }
        let got = plan.get(k.as_str());
        match v {
            serde_json::Value::Null => assert!(got.is_none(), "{k}: {got:?}"),
            serde_json::Value::Bool(b) => assert_eq!(bool::try_from(got.expect(k)).ok(), Some(*b), "{k}"),
            serde_json::Value::Number(n) => assert_eq!(u64::try_from(got.expect(k)).ok(), n.as_u64(), "{k}"),
            serde_json::Value::String(s) => {
                assert_eq!(String::try_from(got.expect(k).try_clone().unwrap()).ok().as_ref(), Some(s), "{k}")
            }
            serde_json::Value::Array(a) => {
                let words: Vec<String> = a.iter().map(|w| w.as_str().expect("a word").to_owned()).collect();
                let got = <Vec<String>>::try_from(got.expect(k).try_clone().unwrap()).expect("as");
                assert_eq!(got, words, "{k}");
                if k == "kept_flags" {
                    assert_eq!(words, ["nodump"], "the +d file's flag");
                }
            }
            other => panic!("{k}: unexpected {other}"),
        }
    }
    for k in plan.keys() {
        assert!(want.contains_key(k.as_str()), "PlanConvert has {k}, the CLI's plan does not");
    }
}

/// A new protector for a directory whose owner has no passwd entry (a disk from another system,
/// a container's files) is named alike by every front end (issue 45): the CLI's `encrypt`, the
/// service's Encrypt and its Convert all say whose it is ("uid N"), none a misleading "password".
#[test]
fn an_unknown_owners_new_protector_is_named_alike_everywhere() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let uid = 424_242;
    let known = Command::new("getent").args(["passwd", &uid.to_string()]).status().expect("getent");
    assert!(!known.success(), "uid {uid} has a passwd entry here; the test needs one without");
    let dir = |name: &str| {
        let d = h.fs.path().join(name);
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
        d
    };
    let (by_cli, by_encrypt, by_convert) = (dir("cli"), dir("encrypt"), dir("convert"));
    fill(&by_convert, 2, 4096, uid);
    let cli = std::path::Path::new(env!("CARGO_BIN_EXE_dirsealed")).with_file_name("dirseal");
    let mut child = Command::new(&cli)
        .arg("--config")
        .arg(h.config())
        .arg("--keystore")
        .arg(h.keystore())
        .args(["encrypt", "--no-recovery-key"])
        .arg(&by_cli)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dirseal");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"pw-cli\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "dirseal encrypt: {}", String::from_utf8_lossy(&out.stderr));
    h.ok(None, "Encrypt", &[s(by_encrypt.to_str().unwrap()), s(""), fd(3)], &[(3, "pw-encrypt")]);
    let rx = watch_jobs(&h.bus);
    let job = job_path(&h.ok(None, "Convert", &[s(by_convert.to_str().unwrap()), fd(3), "{}".into()], &[(3, "pw-c")]));
    assert_eq!(wait_end(&rx, &job, &h), "done");
    let ds = dirseal::ops::Dirseal::open_existing(&h.config(), Some(&h.keystore())).expect("keystore");
    let mut names: Vec<(String, Option<u32>)> =
        ds.keystore().protectors().unwrap().into_iter().map(|(_, r)| r.unwrap()).map(|r| (r.name, r.uid)).collect();
    names.sort();
    let want = (format!("uid {uid}"), Some(uid));
    assert_eq!(names, vec![want.clone(), want.clone(), want], "CLI encrypt, D-Bus Encrypt, D-Bus Convert");
}
