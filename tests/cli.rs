//! The `dirseal` binary against the real kernel on loop-mounted ext4.
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{names, p, Env};

fn protector_ids(env: &Env, dir: &std::path::Path) -> Vec<String> {
    let st = env.status_json(dir);
    st["protectors"].as_array().unwrap().iter().map(|x| x["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn encrypt_lock_unlock_round_trip() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("secret");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "main"], "pw1\n");
    fs::write(d.join("hello.txt"), b"hello world").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("sub/deep.bin"), vec![7u8; 100_000]).unwrap();

    let st = env.status_json(&d);
    assert_eq!(st["encrypted"], true);
    assert_eq!(st["key"], "unlocked");
    assert_eq!(st["managed"], true);
    assert_eq!(st["protectors"][0]["name"], "main");

    env.ok(&["lock", p(&d)], "");
    assert_eq!(env.status_json(&d)["key"], "locked");
    // Locking again is not an error, and --json answers it.
    let again = env.ok(&["lock", p(&d)], "");
    assert!(again.contains("is already locked"), "{again}");
    let j: serde_json::Value = serde_json::from_str(&env.ok(&["lock", "--json", p(&d)], "")).unwrap();
    assert_eq!((j["locked"].as_bool(), j["already_locked"].as_bool()), (Some(true), Some(true)), "{j}");
    let locked = names(&d);
    assert_eq!(locked.len(), 2);
    assert!(!locked.contains(&"hello.txt".to_string()), "names must be ciphertext: {locked:?}");
    let enc = d.join(&locked[0]);
    assert!(fs::read(&enc).is_err() || fs::read_dir(&enc).is_ok(), "contents must not be readable");
    assert!(fs::write(d.join("new"), b"x").is_err(), "creating files in a locked dir must fail");

    let err = env.fails(&["unlock", p(&d)], "wrong\n");
    assert!(err.contains("incorrect password for protector main"), "{err}");
    assert_eq!(env.status_json(&d)["key"], "locked");

    // Unlocking answers in JSON too, naming the encrypted tree from a subdirectory; again, it
    // asks nothing and says it was unlocked already.
    let sub = names(&d).into_iter().find(|n| fs::metadata(d.join(n)).unwrap().is_dir()).unwrap();
    let j: serde_json::Value = serde_json::from_str(&env.ok(&["unlock", "--json", p(&d.join(&sub))], "pw1\n")).unwrap();
    assert_eq!(j["path"], p(&d), "{j}");
    assert_eq!((j["unlocked"].as_bool(), j["already_unlocked"].as_bool()), (Some(true), Some(false)), "{j}");
    let j: serde_json::Value = serde_json::from_str(&env.ok(&["unlock", "--json", p(&d)], "")).unwrap();
    assert_eq!((j["unlocked"].as_bool(), j["already_unlocked"].as_bool()), (Some(true), Some(true)), "{j}");
    env.ok(&["lock", p(&d)], "");
    env.ok(&["unlock", p(&d)], "pw1\n");
    assert_eq!(fs::read(d.join("hello.txt")).unwrap(), b"hello world");
    assert_eq!(fs::read(d.join("sub/deep.bin")).unwrap(), vec![7u8; 100_000]);
}

#[test]
fn encrypt_refuses_non_empty_and_symlinks() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("full");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("f"), b"x").unwrap();
    let err = env.fails(&["encrypt", p(&d)], "pw\n");
    assert!(err.contains("dirseal convert"), "{err}");
    let e = env.mnt().join("empty");
    fs::create_dir(&e).unwrap();
    let l = env.mnt().join("link");
    std::os::unix::fs::symlink(&e, &l).unwrap();
    let err = env.fails(&["encrypt", p(&l)], "pw\n");
    assert!(err.contains("symlink") || err.contains("symbolic link"), "{err}");
    assert_eq!(env.status_json(&e)["encrypted"], false);
    // Nothing was left behind in the keystore by the refusals.
    let o: serde_json::Value = serde_json::from_str(&env.ok(&["status", "--json"], "")).unwrap();
    assert_eq!(o["policies"].as_array().unwrap().len(), 0);
}

#[test]
fn two_protectors_one_policy_and_one_protector_two_policies() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let a = env.mnt().join("a");
    let b = env.mnt().join("b");
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    env.ok(&["encrypt", p(&a), "--protector-name", "alice"], "apw\n");
    let alice = protector_ids(&env, &a)[0].clone();
    // The same protector opens a second directory.
    env.ok(&["encrypt", p(&b), "--protector", &alice], "apw\n");
    assert_eq!(protector_ids(&env, &b), vec![alice.clone()]);
    // A second protector (bob) for a.
    env.ok(&["policy", "add-protector", p(&a), "--protector-name", "bob"], "apw\nbpw\n");
    let ids = protector_ids(&env, &a);
    assert_eq!(ids.len(), 2);
    let bob = ids.iter().find(|i| **i != alice).unwrap().clone();
    fs::write(a.join("f"), b"data").unwrap();
    fs::write(b.join("g"), b"more").unwrap();
    env.ok(&["lock", p(&a)], "");
    env.ok(&["lock", p(&b)], "");
    // Either protector opens a; ambiguous without --protector.
    let err = env.fails(&["unlock", p(&a)], "bpw\n");
    assert!(err.contains("--protector"), "{err}");
    // A protector is named by its name as well as its id.
    env.ok(&["unlock", p(&a), "--protector", "bob"], "bpw\n");
    assert_eq!(fs::read(a.join("f")).unwrap(), b"data");
    env.ok(&["lock", p(&a)], "");
    env.ok(&["protector", "verify", "alice"], "apw\n");
    let err = env.fails(&["unlock", p(&a), "--protector", "carol"], "");
    assert!(err.contains("carol"), "{err}");
    env.ok(&["unlock", p(&a), "--protector", &alice], "apw\n");
    env.ok(&["unlock", p(&b)], "apw\n");
    assert_eq!(fs::read(b.join("g")).unwrap(), b"more");
    // bob does not open b (locked: unlocking an unlocked directory asks nothing).
    env.ok(&["lock", p(&b)], "");
    let err = env.fails(&["unlock", p(&b), "--protector", &bob], "bpw\n");
    assert!(err.contains("does not protect"), "{err}");

    // alice protects two policies: it cannot be deleted; removing it from a leaves bob.
    let err = env.fails(&["protector", "remove", &alice], "");
    assert!(err.contains("still protects") && err.contains("`dirseal policy remove-protector`"), "{err}");
    env.ok(&["policy", "remove-protector", p(&a), "--protector", &alice], "");
    assert_eq!(protector_ids(&env, &a), vec![bob.clone()]);
    // The last protector cannot be removed.
    let err = env.fails(&["policy", "remove-protector", p(&a), "--protector", &bob], "");
    assert!(err.contains("no other usable protector"), "{err}");
    let list: serde_json::Value = serde_json::from_str(&env.ok(&["protector", "list", "--json"], "")).unwrap();
    assert_eq!(list["protectors"].as_array().unwrap().len(), 2);
}

#[test]
fn change_password_and_remove_protector() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("d");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "me"], "old\n");
    let id = protector_ids(&env, &d)[0].clone();
    let err = env.fails(&["change-password", p(&d)], "bad\nnew\n");
    assert!(err.contains("incorrect password"), "{err}");
    env.ok(&["change-password", p(&d)], "old\nnew\n");
    env.ok(&["lock", p(&d)], "");
    env.fails(&["unlock", p(&d)], "old\n");
    env.ok(&["unlock", p(&d)], "new\n");
    env.ok(&["protector", "verify", &id], "new\n");
    env.fails(&["protector", "verify", &id], "old\n");
    env.ok(&["protector", "change-password", &id], "new\nnewer\n");
    env.ok(&["protector", "verify", &id], "newer\n");

    // A standalone protector can be created and removed; one in use cannot.
    let out = env.ok(&["protector", "create", "--name", "spare"], "s\n");
    let spare = out.split_whitespace().nth(2).unwrap().to_string();
    env.ok(&["protector", "verify", &spare], "s\n");
    env.ok(&["protector", "remove", &spare], "");
    env.fails(&["protector", "verify", &spare], "s\n");
    env.fails(&["protector", "remove", &id], "");
}

#[test]
fn corrupted_keystore_files_give_clear_errors() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let a = env.mnt().join("a");
    let b = env.mnt().join("b");
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    env.ok(&["encrypt", p(&a), "--protector-name", "pa"], "x\n");
    env.ok(&["encrypt", p(&b), "--protector-name", "pb"], "y\n");
    let st = env.status_json(&a);
    let policy = st["policy"].as_str().unwrap().to_string();
    let pa = st["protectors"][0]["id"].as_str().unwrap().to_string();
    env.ok(&["lock", p(&a)], "");
    env.ok(&["lock", p(&b)], "");

    let pfile = env.keystore().join("policies").join(format!("{policy}.json"));
    let good = fs::read(&pfile).unwrap();
    fs::write(&pfile, &good[..good.len() / 3]).unwrap();
    let err = env.fails(&["unlock", p(&a)], "x\n");
    assert!(err.contains("corrupt") && err.contains(p(&pfile)), "{err}");
    // The other policy is unaffected.
    env.ok(&["unlock", p(&b)], "y\n");
    let o = env.ok(&["status"], "");
    assert!(o.contains("problem:"), "{o}");

    // A wrapped key swapped in from elsewhere (same length, valid JSON) never unlocks.
    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    let w = v["protectors"][&pa]["ciphertext"].as_str().unwrap().to_string();
    let mut bytes = hex::decode(&w).unwrap();
    bytes[5] ^= 0x40;
    v["protectors"][&pa]["ciphertext"] = serde_json::Value::String(hex::encode(bytes));
    fs::write(&pfile, serde_json::to_vec(&v).unwrap()).unwrap();
    let err = env.fails(&["unlock", p(&a)], "x\n");
    assert!(err.contains("altered or copied"), "{err}");
    assert_eq!(env.status_json(&a)["key"], "locked");

    // A group-writable protector file is refused, not trusted.
    fs::write(&pfile, &good).unwrap();
    let prfile = env.keystore().join("protectors").join(format!("{pa}.json"));
    fs::set_permissions(&prfile, fs::Permissions::from_mode(0o664)).unwrap();
    let err = env.fails(&["unlock", p(&a)], "x\n");
    assert!(err.contains("not writable by group or others"), "{err}");
    fs::set_permissions(&prfile, fs::Permissions::from_mode(0o600)).unwrap();
    env.ok(&["unlock", p(&a)], "x\n");
}

#[test]
fn busy_lock_names_the_process_and_finishes_later() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("busy");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "b"], "pw\n");
    fs::write(d.join("open.txt"), b"held").unwrap();
    // A child process holds the file open until we close its stdin.
    let mut holder = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("exec 3<'{}'; read _", d.join("open.txt").display()))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the shell has opened fd 3 (it is ours to poll; no sleep-based guess).
    let fd3 = format!("/proc/{}/fd/3", holder.id());
    while fs::read_link(&fd3).is_err() {
        assert!(holder.try_wait().unwrap().is_none(), "the holder shell exited early");
        std::thread::yield_now();
    }
    let out = env.run(&["lock", p(&d)], "");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only partly locked") && err.contains(&format!("pid {}", holder.id())), "{err}");
    assert!(err.contains("run `dirseal lock"), "{err}");
    assert_eq!(env.status_json(&d)["key"], "partially-locked");
    drop(holder.stdin.take());
    holder.wait().unwrap();
    env.ok(&["lock", p(&d)], "");
    assert_eq!(env.status_json(&d)["key"], "locked");
}

/// A name is looked up among the protectors that open the directory: another directory's
/// protector of the same name is no ambiguity there. Where the whole keystore is searched
/// (`protector verify NAME`) the ambiguity lists both by id.
#[test]
fn a_name_is_looked_up_among_the_directorys_protectors() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (a, b) = (env.mnt().join("a"), env.mnt().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    env.ok(&["encrypt", p(&a), "--protector-name", "pin", "--no-recovery-key"], "a-pw\n");
    env.ok(&["encrypt", p(&b), "--protector-name", "pin", "--no-recovery-key"], "b-pw\n");
    env.ok(&["lock", p(&a)], "");
    env.ok(&["lock", p(&b)], "");
    env.ok(&["unlock", p(&b), "--protector", "pin"], "b-pw\n");
    env.ok(&["change-password", p(&a), "--protector", "pin"], "a-pw\na-new\n");
    env.ok(&["unlock", p(&a), "--protector", "pin"], "a-new\n");
    let err = env.fails(&["protector", "verify", "pin"], "");
    assert!(err.contains("names several protectors in the keystore") && err.matches("(pin)").count() == 2, "{err}");
    assert!(err.contains("--protector NAME or ID") || err.contains("by its id"), "{err}");
    let err = env.fails(&["unlock", p(&a), "--protector", "nobody"], "");
    assert!(err.contains("no protector named \"nobody\" in the keystore"), "{err}");
}

#[test]
fn errors_are_one_line_and_the_clis_hint_another() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("plain");
    fs::create_dir(&d).unwrap();
    let err = env.fails(&["unlock", p(&d)], "");
    // The library names the problem, the CLI adds its commands.
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].starts_with("dirseal: error: ") && lines[0].ends_with("is not encrypted"), "{err}");
    assert!(lines[1].starts_with("dirseal: encrypt an empty directory with `dirseal encrypt "), "{err}");
    assert!(lines[1].contains(&format!("`dirseal convert {}`", p(&d))), "{err}");
    let err = env.fails(&["lock", p(&d)], "");
    assert!(err.contains("not encrypted"), "{err}");
    // A file is not offered `dirseal encrypt FILE`.
    let f = env.mnt().join("file");
    fs::write(&f, "x").unwrap();
    let err = env.fails(&["unlock", p(&f)], "");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("not encrypted") && !err.contains("dirseal encrypt"), "{err}");
    // A missing path: what happened, once.
    let err = env.fails(&["unlock", p(&env.mnt().join("missing"))], "");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    let err = env.fails(&["protector", "verify", "0011223344556677"], "");
    assert!(err.contains("no protector 0011223344556677"), "{err}");
    let err = env.fails(&["unlock", p(&env.mnt().join("missing"))], "");
    assert!(err.starts_with("dirseal: error: "), "{err}");
    // No input where a secret is needed.
    let e = env.mnt().join("e");
    fs::create_dir(&e).unwrap();
    let err = env.fails(&["encrypt", p(&e)], "");
    assert!(err.contains("no secret was given"), "{err}");
    let err = env.fails(&["encrypt", p(&e)], "\n");
    assert!(err.contains("empty password"), "{err}");
    assert_eq!(env.status_json(&e)["encrypted"], false);
}

/// Issue 44 (2): a read-only mount was found only after every question (a recovery key written
/// down, a password set), then `creating …/.dirseal failed: Read-only file system`, leaving an
/// unused protector. `status` says so, and convert, encrypt and home create refuse before asking.
#[test]
fn a_read_only_filesystem_is_refused_before_any_question() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let (home, empty) = (env.mnt().join("home"), env.mnt().join("empty"));
    fs::create_dir_all(home.join("docs")).unwrap();
    fs::write(home.join("docs/a.txt"), b"a").unwrap();
    fs::create_dir(&empty).unwrap();
    let remount = |how: &str| {
        let st = std::process::Command::new("mount").args(["-o", &format!("remount,{how}"), p(env.mnt())]).status();
        assert!(st.unwrap().success(), "remount {how}");
    };
    remount("ro");
    let st = env.status_json(&home);
    assert_eq!(st["filesystem"]["encryption"], "read-only", "{st}");
    let text = env.ok(&["status", p(&home)], "");
    assert!(text.contains("mounted read-only") && text.contains("mount -o remount,rw"), "{text}");
    // No answers given: a question asked would fail differently.
    for args in [vec!["convert", p(&home)], vec!["encrypt", p(&empty)]] {
        let err = env.fails(&args, "");
        assert!(err.contains("is mounted read-only") && err.contains("remount it read-write"), "{args:?}: {err}");
    }
    remount("rw");
    assert!(!env.mnt().join(".dirseal").exists());
    assert!(protector_ids(&env, &home).is_empty());
    assert!(fs::read_dir(env.keystore().join("protectors")).map_or(true, |mut d| d.next().is_none()));
}

#[test]
fn filesystem_without_encrypt_feature_is_explained() {
    dirseal_testfs::needs_root!();
    let env = Env::with(common::Options { encrypt: false, ..Default::default() });
    let d = env.mnt().join("d");
    fs::create_dir(&d).unwrap();
    // Locking or unlocking a plain directory there is answered plainly, no feature advice.
    for cmd in ["lock", "unlock"] {
        let err = env.fails(&[cmd, p(&d)], "");
        assert!(err.contains("is not encrypted") && !err.contains("tune2fs"), "{cmd}: {err}");
    }
    let err = env.fails(&["encrypt", p(&d)], "pw\n");
    // The advice is followed literally, on the mounted filesystem (ext4 allows it online): a
    // rescue boot would be needless.
    let advice = err.split('`').nth(1).unwrap_or_else(|| panic!("no command in: {err}"));
    assert!(advice.starts_with("tune2fs -O encrypt /dev/"), "{err}");
    assert!(!err.contains("unmounted"), "{err}");
    let words: Vec<&str> = advice.split_whitespace().collect();
    let st =
        std::process::Command::new(words[0]).args(&words[1..]).stdout(std::process::Stdio::null()).status().unwrap();
    assert!(st.success(), "{advice} failed");
    env.ok(&["encrypt", p(&d)], "pw\n");
    assert_eq!(env.status_json(&d)["encrypted"], true);
}

#[test]
fn the_build_writes_completions_and_man_pages() {
    // build.rs, beside the binary.
    let out = Path::new(env!("DIRSEAL_DOCS_DIR"));
    assert_eq!(Some(out), Path::new(env!("CARGO_BIN_EXE_dirseal")).parent().map(|d| d.join("dirseal-docs")).as_deref());
    // What build.rs read from the library's sources is the library's.
    assert_eq!(env!("DIRSEAL_DOCS_CONFIG_PATH"), dirseal::config::DEFAULT_CONFIG_PATH);
    assert_eq!(env!("DIRSEAL_DOCS_SKEL"), dirseal::home::DEFAULT_SKEL);
    assert_eq!(env!("DIRSEAL_DOCS_KIND_NAMES"), dirseal::protector::KIND_NAMES.join(","));
    assert_eq!(env!("DIRSEAL_DOCS_DEFAULT_KIND"), dirseal::protector::DEFAULT_KIND);
    assert!(out.join("completions/dirseal.bash").exists());
    // Section 8: dirseal is in /usr/sbin (Debian policy 12.1), and so are its subcommands' pages.
    assert!(out.join("man/dirseal.8").exists());
    assert!(out.join("man/dirseal-convert.8").exists());
    assert!(!fs::read_dir(out.join("man")).unwrap().flatten().any(|e| e.path().extension().is_some_and(|x| x == "1")));
    let top = fs::read_to_string(out.join("man/dirseal.8")).unwrap();
    for section in [".SH EXAMPLES", ".SH FILES", ".SH SECURITY", ".SH SEE ALSO"] {
        assert!(top.contains(section), "dirseal.8 lacks {section}");
    }
    // Every subcommand's page has examples, and its synopsis the options' values.
    for e in fs::read_dir(out.join("man")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("dirseal-") {
            let text = fs::read_to_string(e.path()).unwrap();
            assert!(text.contains(".SH EXAMPLES"), "{name} has no EXAMPLES");
        }
    }
    let scrub = fs::read_to_string(out.join("man/dirseal-scrub.8")).unwrap();
    assert!(scrub.contains(r"[\fB\-\-reserve\fR \fISIZE\fR]"), "the synopsis drops --reserve's value");
    for page in ["dirsealed.8", "pam_dirseal.8"] {
        let text = fs::read_to_string(out.join("man").join(page)).unwrap();
        for section in [".SH NAME", ".SH OPTIONS", ".SH EXAMPLES", ".SH FILES", ".SH SECURITY"] {
            assert!(text.contains(section), "{page} lacks {section}");
        }
    }
    // Rendered as a reader sees it, where man is installed: no roff warnings.
    if std::process::Command::new("man").arg("--version").output().is_ok_and(|o| o.status.success()) {
        for page in ["dirseal.8", "dirseal-policy-add-protector.8", "dirsealed.8", "pam_dirseal.8"] {
            let o = std::process::Command::new("man")
                .args(["--warnings", "-l"])
                .arg(out.join("man").join(page))
                .env("MANWIDTH", "80")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success() && err.trim().is_empty(), "{page}: {err}");
        }
    }
    assert!(out.join("man/dirseal-decrypt.8").exists());
}

#[test]
fn argon2_cost_is_calibrated_once_and_flags_override_it() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    // No [argon2] in the config: the first protector calibrates (~1 s) and records the cost.
    std::fs::write(env.config(), "").unwrap();
    env.ok(&["protector", "create", "--name", "calibrated"], "pw\n");
    let cfg = std::fs::read_to_string(env.config()).unwrap();
    assert!(cfg.contains("[argon2]") && cfg.contains("time_cost") && cfg.contains("memory_kib"), "{cfg}");
    let list: serde_json::Value = serde_json::from_str(&env.ok(&["protector", "list", "--json"], "")).unwrap();
    let id = list["protectors"][0]["id"].as_str().unwrap().to_string();
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(env.keystore().join(format!("protectors/{id}.json"))).unwrap()).unwrap();
    let recorded: toml::Value = toml::from_str(&cfg).unwrap();
    assert_eq!(rec["kind"]["argon2"]["memory_kib"].as_i64(), recorded["argon2"]["memory_kib"].as_integer());
    // Per-protector flags override the machine cost.
    let out =
        env.ok(&["protector", "create", "--name", "cheap", "--kdf-time-ms", "20", "--kdf-memory-mib", "8"], "pw\n");
    let cheap = out.split_whitespace().nth(2).unwrap();
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(env.keystore().join(format!("protectors/{cheap}.json"))).unwrap()).unwrap();
    assert_eq!(rec["kind"]["argon2"]["memory_kib"], 8192);
    env.ok(&["protector", "verify", cheap], "pw\n");
}

#[test]
fn lock_all_users_removes_other_users_claims() {
    dirseal_testfs::needs_root!();
    use std::os::fd::AsRawFd;
    let env = Env::new();
    let d = env.mnt().join("shared");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "s"], "pw\n");
    fs::write(d.join("f"), b"shared data").unwrap();
    // The master key, as another user who knows it would have it.
    let ds = dirseal::ops::Dirseal::open(&env.config(), Some(&env.keystore())).unwrap();
    let policy = ds.policy_of(&d).unwrap();
    let pid = *policy.wrapped.keys().next().unwrap();
    let rec = ds.keystore().protector(&pid).unwrap();
    let pkey = dirseal::protector::unlock(
        &rec,
        ds.config(),
        Some(&dirseal::secret::Passphrase::from_str_copy("pw")),
        dirseal::presence::Presence::AtDevice,
    )
    .unwrap();
    let Ok(master) = ds.master_key(&policy, &pid, &pkey) else { panic!("master key") };
    // An unprivileged user adds the same key (FS_IOC_ADD_ENCRYPTION_KEY, allowed for v2 keys)
    // through an fd on the filesystem that it inherits.
    let dirfd = rustix::fs::open(
        env.mnt(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let uid = common::fresh_uid().to_string();
    let script = "import fcntl,struct,sys\n\
                  raw=bytes.fromhex(sys.stdin.read().strip())\n\
                  arg=bytearray(struct.pack('<II32sII32s',2,0,bytes(32),len(raw),0,bytes(32))+raw)\n\
                  fcntl.ioctl(int(sys.argv[1]),0xC0506617,arg,True)\n";
    let mut child = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            &uid,
            "--regid",
            &uid,
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            script,
            &dirfd.as_raw_fd().to_string(),
        ])
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let _ = child.stdin.take().unwrap().write_all(hex::encode(master.as_bytes()).as_bytes());
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "user add_key: {}", String::from_utf8_lossy(&out.stderr));
    drop(dirfd);

    let out = env.run(&["lock", p(&d)], "");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("other users also added its key") && err.contains("--all-users"), "{err}");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"shared data", "another user's claim keeps it open");
    env.ok(&["lock", "--all-users", p(&d)], "");
    assert_eq!(env.status_json(&d)["key"], "locked");
}

#[test]
fn status_answers_for_any_path() {
    dirseal_testfs::needs_root!();
    // A filesystem without the encrypt feature: an answer, not an error.
    let env = Env::with(common::Options { encrypt: false, ..Default::default() });
    let d = env.mnt().join("d");
    fs::create_dir(&d).unwrap();
    let st = env.status_json(&d);
    assert_eq!(st["encrypted"], false);
    assert_eq!(st["filesystem"]["fstype"], "ext4");
    assert_eq!(st["filesystem"]["encryption"], "not-enabled");
    assert_eq!(st["filesystem"]["mount_point"], p(env.mnt()));
    let text = env.ok(&["status", p(&d)], "");
    assert!(text.contains("encrypted:  no") && text.contains("tune2fs -O encrypt /dev/loop"), "{text}");
    // A file, on the same filesystem.
    fs::write(d.join("f"), b"x").unwrap();
    assert_eq!(env.status_json(&d.join("f"))["encrypted"], false);
    // A filesystem that can never encrypt.
    let st = env.status_json(std::path::Path::new("/proc"));
    assert_eq!(st["filesystem"]["encryption"], "unsupported", "{st}");
    assert!(env.ok(&["status", "/proc"], "").contains("cannot encrypt (fscrypt needs ext4 or f2fs)"));

    // A capable filesystem, plain and encrypted directories.
    let env = Env::new();
    let plain = env.mnt().join("plain");
    fs::create_dir(&plain).unwrap();
    let st = env.status_json(&plain);
    assert_eq!((st["encrypted"].as_bool(), st["filesystem"]["encryption"].as_str()), (Some(false), Some("enabled")));
    let e = env.mnt().join("e");
    fs::create_dir(&e).unwrap();
    env.ok(&["encrypt", p(&e), "--protector-name", "m"], "pw\n");
    let st = env.status_json(&e);
    assert_eq!((st["encrypted"].as_bool(), st["key"].as_str()), (Some(true), Some("unlocked")));
    // A missing path is still an error.
    let err = env.fails(&["status", p(&env.mnt().join("missing"))], "");
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn unlocking_an_unlocked_directory_asks_nothing() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("d");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "m", "--recovery-key"], "pw\n");
    // No input at all: a secret would be "no secret was given".
    let out = env.ok(&["unlock", p(&d)], "");
    assert!(out.contains("already unlocked"), "{out}");
    let out = env.ok(&["unlock", "--recovery", p(&d)], "");
    assert!(out.contains("already unlocked"), "{out}");
    env.ok(&["lock", p(&d)], "");
    let err = env.fails(&["unlock", p(&d)], "");
    assert!(err.contains("no secret was given"), "{err}");
    env.ok(&["unlock", p(&d)], "pw\n");
}

#[test]
fn owner_without_passwd_entry_gets_a_protector_named_by_uid() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let uid = common::fresh_uid();
    assert!(nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).unwrap().is_none());
    let d = env.mnt().join("home");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("f"), b"mine").unwrap();
    std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
    std::os::unix::fs::chown(d.join("f"), Some(uid), Some(uid)).unwrap();
    env.ok(&["convert", p(&d), "--yes", "--no-recovery-key"], "pw\n");
    let st = env.status_json(&d);
    assert_eq!(st["protectors"][0]["name"], format!("uid {uid}"));
    assert_eq!(st["protectors"][0]["uid"], uid);
}

/// Help reads well: every argument described, the global options under their own heading, and
/// `--type` accepted wherever a new protector's kind is asked (`protector create` spells it so).
#[test]
fn help_describes_every_argument_and_kinds_share_one_flag() {
    dirseal_testfs::needs_root!();
    // Every command and subcommand, as `--help` lists them: none may gain an undescribed
    // argument or option unnoticed.
    fn help(cmd: &[String]) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dirseal")).args(cmd).arg("--help").output().unwrap();
        assert!(out.status.success(), "{cmd:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(cmd) = todo.pop() {
        let text = help(&cmd);
        seen += 1;
        let mut section = "";
        // (argument or option, its description); a long one's description is on the next lines.
        let mut items: Vec<(&str, String)> = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if !line.starts_with(' ') {
                section = line;
                continue;
            }
            let (head, rest) = line.trim().split_once("  ").unwrap_or((line.trim(), ""));
            match section {
                "Commands:" if head != "help" => todo.push(cmd.iter().cloned().chain([head.to_string()]).collect()),
                "Arguments:" | "Options:" if head.starts_with(['-', '<', '[']) => {
                    items.push((head, rest.trim().into()))
                }
                "Arguments:" | "Options:" => items.last_mut().expect("an item before its description").1 += line.trim(),
                _ => {}
            }
        }
        for (head, desc) in items {
            assert!(!desc.is_empty() && !desc.starts_with('['), "{cmd:?}: {head} is not described:\n{text}");
        }
        if !cmd.is_empty() && !text.contains("Commands:") {
            assert!(text.contains("Global options:"), "{cmd:?}: {text}");
        }
    }
    assert!(seen > 30, "only {seen} commands walked");
    let env = Env::new();
    let d = env.mnt().join("typed");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--type", "password", "--no-recovery-key"], "pw\n");
    assert_eq!(env.status_json(&d)["encrypted"], true);
}

/// Commands that only read create no keystore; `convert` without a directory stops at the
/// argument check, and `convert --status` reads no keystore.
#[test]
fn reading_commands_create_no_keystore() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("plain");
    fs::create_dir(&d).unwrap();
    let ks = env.mnt().join("never");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_dirseal"))
            .arg("--keystore")
            .arg(&ks)
            .arg("--config")
            .arg(env.config())
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    assert!(run(&["status", p(&d)]).status.success());
    assert!(run(&["status"]).status.success());
    assert!(!run(&["unlock", p(&d)]).status.success());
    assert!(!run(&["lock", p(&d)]).status.success());
    assert!(run(&["protector", "list"]).status.success());
    let out = run(&["convert"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("<DIR>"), "{out:?}");
    // A look at recorded conversions reads work dirs, never the keystore.
    // (Every mounted filesystem's: other tests' conversions may be listed.)
    let out = run(&["convert", "--status"]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&["convert", "--status", p(&d)]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("no conversion recorded"), "{out:?}");
    assert!(!ks.exists(), "a reading command created {}", ks.display());
}

/// A user reads the status of a directory they can reach without root: encrypted, key loaded,
/// the tree; what only root may read (protectors, the recovery key) is said to be hidden.
#[test]
fn a_user_reads_status_without_root() {
    dirseal_testfs::needs_root!();
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let env = Env::new();
    let d = env.mnt().join("mine");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--recovery-key"], "pw\n");
    // Let the user reach the mount (test dirs are private).
    for a in env.mnt().ancestors().take_while(|a| a.starts_with(std::env::temp_dir()) && *a != std::env::temp_dir()) {
        fs::set_permissions(a, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let user = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dirseal"))
            .args(args)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = user(&["status", p(&d)]);
    assert!(text.contains("encrypted:  yes") && text.contains("key:        unlocked"), "{text}");
    assert!(text.contains("managed:    hidden") && text.contains("recovery:   hidden"), "{text}");
    assert!(!text.contains("problem"), "{text}");
    let j: serde_json::Value = serde_json::from_str(&user(&["status", "--json", p(&d)])).unwrap();
    assert_eq!((j["hidden"].as_bool(), j["recovery_key"].is_null()), (Some(true), true), "{j}");
    // Root still sees everything.
    assert_eq!(env.status_json(&d)["recovery_key"], true);
}

/// Issue 45: the front ends name only the core among dirseal's crates (the engines' types come
/// through its re-exports), and neither they nor anything under them is a TPM or FIDO2 crate: only
/// the helpers' package (hw/, `dirseal-hw`) is, so `cargo build -p dirseal-cli` (or `-p dirsealed`,
/// `-p pam_dirseal`) needs neither the TPM nor the FIDO2 development packages. Read from cargo's
/// own resolution of the manifests and the lock file (`--offline`: nothing is fetched).
#[test]
fn front_ends_depend_on_the_core_alone_and_on_no_hardware_crate() {
    // Names of the normal and build dependencies of `package`: direct ones only with `depth`.
    let deps = |package: &str, depth: Option<&str>| -> Vec<String> {
        let mut c = std::process::Command::new(env!("CARGO"));
        c.args(["tree", "--offline", "--manifest-path", concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")]);
        c.args(["-p", package, "-e", "normal,build", "--prefix", "none", "--format", "{p}"]);
        if let Some(d) = depth {
            c.args(["--depth", d]);
        }
        let out = c.output().expect("cargo tree");
        assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines().filter_map(|l| l.split_whitespace().next());
        assert_eq!(lines.next(), Some(package), "{text}");
        lines.map(str::to_string).collect()
    };
    let hardware = |n: &String| n.starts_with("tss-esapi") || n.starts_with("libfido2");
    for package in ["dirseal-cli", "dirsealed", "pam_dirseal"] {
        let direct = deps(package, Some("1"));
        assert!(direct.iter().any(|n| n == "clap" || n == "zbus" || n == "libc"), "{package}: {direct:?}");
        let ours: Vec<_> = direct.iter().filter(|n| n.starts_with("dirseal")).collect();
        assert_eq!(ours, ["dirseal"], "{package} must name only the core among dirseal's crates");
        let all = deps(package, None);
        // The core does depend on the engines: the check above could not pass by a short tree.
        assert!(all.iter().any(|n| n == "dirseal-migrate"), "{package}: {all:?}");
        let hw: Vec<_> = all.iter().filter(|n| hardware(n)).collect();
        assert!(hw.is_empty(), "{package} depends on a TPM or FIDO2 crate: {hw:?}");
    }
    // ... while the helpers do: the names above are the ones cargo uses.
    assert!(deps("dirseal-hw", Some("1")).iter().filter(|n| hardware(n)).count() >= 3);
}

/// Issue 44: a hint names the command's directory where the error does not (before: `DIR`), and
/// `policy add-protector`'s ambiguous protector is picked with `--with` (its `--protector` is the
/// protector to add).
#[test]
fn hints_name_the_directory_and_the_right_flag() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("hinted");
    std::fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "o", "--no-recovery-key"], "right-pw\n");
    env.ok(&["lock", p(&d)], "");
    let err = env.fails(&["unlock", p(&d)], "wrong-pw\n");
    assert!(err.contains(&format!("`dirseal unlock --recovery {}`", p(&d))), "{err}");
    assert!(!err.contains(" DIR`"), "{err}");
    env.ok(&["unlock", p(&d)], "right-pw\n");
    env.ok(&["policy", "add-protector", p(&d), "--protector-name", "second"], "right-pw\nsecond-pw\n");
    let err = env.fails(&["policy", "add-protector", p(&d), "--protector-name", "third"], "x\nx\n");
    assert!(err.contains("pick one with --with NAME or ID"), "{err}");
    let err = env.fails(&["change-password", p(&d)], "x\n");
    assert!(err.contains("pick one with --protector NAME or ID"), "{err}");
}
