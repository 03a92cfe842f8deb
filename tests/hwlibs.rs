//! Issue 29: what a password needs maps no TPM or FIDO2 library. Only the helpers `dirseal-tpm2`
//! and `dirseal-fido2` link them (docs/architecture.md, "Hardware helpers"); without them a
//! password conversion, unlock and status still work, and the TPM and FIDO2 commands say what to
//! install. The PAM side (a password login under pamtester) is in pam/tests/pamtester.rs, the
//! service's in service/tests/hwlibs.rs.
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::LazyLock;

use common::{p, Env};

/// The libraries only the helpers may link (sonames, as ldd and the dynamic loader name them).
const HARDWARE: &[&str] = &["libtss2-", "libfido2.so", "libcbor.so", "libudev.so"];

static TPM_HELPER: LazyLock<String> = LazyLock::new(|| built_helper("dirseal-tpm2"));
static FIDO2_HELPER: LazyLock<String> = LazyLock::new(|| built_helper("dirseal-fido2"));

/// A helper as the workspace built it. The helpers are the package `dirseal-hw` (hw/), so that
/// this package links no TPM or FIDO2 crate; cargo then gives this test no `CARGO_BIN_EXE_` for
/// them, but builds them into the same directory as `dirseal` (target/<profile>) when it builds
/// the workspace, where the library looks for them too (core/src/sys/helper.rs).
fn built_helper(name: &str) -> String {
    let path = Path::new(env!("CARGO_BIN_EXE_dirseal")).with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing: build or test the whole workspace (cargo build --workspace; scripts/test.sh does)",
        path.display()
    );
    path.into_os_string().into_string().expect("a UTF-8 target directory")
}

/// `ldd FILE`: soname → resolved path.
fn ldd(file: &Path) -> Vec<(String, String)> {
    let out = Command::new("ldd").arg(file).output().expect("ldd");
    assert!(out.status.success(), "ldd {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            Some((name.to_string(), rest.split(" (").next()?.trim().to_string()))
        })
        .collect()
}

fn hardware_in(names: &[String]) -> Vec<String> {
    names.iter().filter(|n| HARDWARE.iter().any(|h| n.contains(h))).cloned().collect()
}

/// The files of `sonames` as the helpers resolve them, symlinks followed: what to hide.
fn library_files(helper: &str, sonames: &[&str]) -> Vec<PathBuf> {
    let libs = ldd(Path::new(helper));
    sonames
        .iter()
        .map(|s| {
            let (_, path) = libs.iter().find(|(n, _)| n == s).unwrap_or_else(|| panic!("{helper} does not link {s}"));
            fs::canonicalize(path).unwrap_or_else(|e| panic!("{path}: {e}"))
        })
        .collect()
}

#[test]
fn only_the_helpers_link_tpm_and_fido2_libraries() {
    let dirseal = Path::new(env!("CARGO_BIN_EXE_dirseal"));
    let names = |f: &Path| ldd(f).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    let linked = names(dirseal);
    assert!(linked.iter().any(|n| n.starts_with("libc.so")), "ldd must list libraries: {linked:?}");
    assert_eq!(hardware_in(&linked), Vec::<String>::new(), "dirseal links a hardware library");
    // The check above could not pass by ldd missing them: the helpers do list them.
    let tpm = names(Path::new(&*TPM_HELPER));
    assert!(tpm.iter().any(|n| n.starts_with("libtss2-esys")), "{tpm:?}");
    assert!(!tpm.iter().any(|n| n.starts_with("libfido2")), "the TPM helper must not need libfido2: {tpm:?}");
    let fido = names(Path::new(&*FIDO2_HELPER));
    assert!(fido.iter().any(|n| n.starts_with("libfido2")), "{fido:?}");
    assert!(!fido.iter().any(|n| n.starts_with("libtss2")), "the FIDO2 helper must not need libtss2: {fido:?}");
}

/// Every library the dynamic loader loaded for a run (`LD_DEBUG=files`: at start and by dlopen).
fn loaded(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| l.split("file=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn status_and_unlock_of_a_password_directory_load_no_hardware_library() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("secret");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "main"], "pw1\n");
    env.ok(&["lock", p(&d)], "");
    for (args, stdin) in [(&["unlock", p(&d)][..], "pw1\n"), (&["status", p(&d)][..], "")] {
        let mut c = env.cmd(args);
        c.env("LD_DEBUG", "files").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let libs = loaded(&out.stderr);
        assert!(libs.iter().any(|l| l.starts_with("libc.so")), "LD_DEBUG must show the loads: {libs:?}");
        assert_eq!(hardware_in(&libs), Vec::<String>::new(), "{args:?} loaded a hardware library");
    }
}

/// Runs dirseal in a mount namespace where the TPM and FIDO2 libraries are empty files, as on a
/// machine without them.
fn without_hardware_libraries(env: &Env, args: &[&str], stdin: &str) -> Output {
    let mut hide = library_files(&TPM_HELPER, &["libtss2-esys.so.0"]);
    hide.extend(library_files(&FIDO2_HELPER, &["libfido2.so.1"]));
    let empty = env.etc.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let mut script = String::from("set -e\n");
    for h in &hide {
        script.push_str(&format!("mount --bind {} {}\n", p(&empty), p(h)));
    }
    script.push_str("exec \"$@\"\n");
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh", env!("CARGO_BIN_EXE_dirseal")]);
    c.args(args).env("DIRSEAL_CONFIG", env.config()).env("DIRSEAL_KEYSTORE", env.keystore());
    c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("unshare");
    let _ = std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn show(o: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn without_tpm_and_fido2_libraries_passwords_work_and_the_hardware_commands_say_what_to_install() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let d = env.mnt().join("data");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("notes.txt"), b"kept").unwrap();
    let ok = |args: &[&str], stdin: &str| {
        let o = without_hardware_libraries(&env, args, stdin);
        assert!(o.status.success(), "{args:?}: {}", show(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // A conversion of a directory with data, lock, unlock, status: all with a password.
    ok(&["convert", p(&d), "--yes", "--no-recovery-key", "--protector-name", "main"], "pw1\n");
    ok(&["lock", p(&d)], "");
    assert!(fs::read(d.join("notes.txt")).is_err(), "locked");
    ok(&["unlock", p(&d)], "pw1\n");
    assert_eq!(fs::read(d.join("notes.txt")).unwrap(), b"kept");
    assert!(ok(&["status", p(&d)], "").contains("unlocked"));

    // The hardware commands fail cleanly, naming what is missing.
    let fails = |args: &[&str], stdin: &str| {
        let o = without_hardware_libraries(&env, args, stdin);
        assert!(!o.status.success(), "{args:?} must fail: {}", show(&o));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // `tpm2 status` reports, as for a machine without a TPM, and succeeds.
    let st = ok(&["tpm2", "status"], "");
    assert!(st.contains("present:           no (TPM support needs libtss2-esys.so.0, which is not installed"), "{st}");
    let e = fails(&["fido2", "list"], "");
    assert!(e.contains("FIDO2) support needs libfido2.so.1") && e.contains("not installed"), "{e}");
    let e = fails(&["protector", "create", "--name", "t", "--type", "tpm2", "--no-pin"], "");
    assert!(e.contains("TPM support needs libtss2-esys.so.0"), "{e}");
    // Outside the namespace the libraries are there again: the same command reaches the TPM
    // layer (no TPM configured here, so it fails, but not for a missing library).
    let out = env.run(&["tpm2", "status"], "");
    assert!(!show(&out).contains("not installed") && show(&out).contains("present:"), "{}", show(&out));
}

#[test]
fn a_helper_that_crashes_or_hangs_is_a_clear_error_and_is_stopped() {
    use dirseal::fido2::wire::{Request, Response};
    use dirseal::helper::{Helper, HelperError, Session};
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};

    let pid = |s: &Session| Pid::from_raw(s.pid() as i32);
    // Only stdin, stdout and stderr reach a helper, not the caller's other descriptors (here one
    // opened without O_CLOEXEC, as a host program's may be).
    let leak = nix::fcntl::open("/dev/null", nix::fcntl::OFlag::O_RDONLY, nix::sys::stat::Mode::empty()).unwrap();
    let s = Session::start(Helper::Tpm2).unwrap_or_else(|e| panic!("{e:?}"));
    let mut fds: Vec<String> = fs::read_dir(format!("/proc/{}/fd", s.pid()))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    fds.sort();
    assert_eq!(fds, ["0", "1", "2"]);
    drop(s);
    nix::unistd::close(leak).unwrap();
    // A crash (here an abort from outside) is the helper's alone, reported with its signal.
    let mut s = Session::start(Helper::Fido2).unwrap_or_else(|e| panic!("{e:?}"));
    kill(pid(&s), Signal::SIGABRT).unwrap();
    match s.call::<_, Response>(&Request::ListHid, Duration::from_secs(10)) {
        Err(HelperError::Failed(e)) => assert!(e.contains("dirseal-fido2") && e.contains("signal 6"), "{e}"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("a dead helper cannot answer"),
    }
    // A hang (a stopped helper) ends at the timeout, and the helper is killed.
    let mut s = Session::start(Helper::Fido2).unwrap_or_else(|e| panic!("{e:?}"));
    let p = pid(&s);
    kill(p, Signal::SIGSTOP).unwrap();
    let t = Instant::now();
    match s.call::<_, Response>(&Request::ListHid, Duration::from_secs(1)) {
        Err(HelperError::Failed(e)) => assert!(e.contains("did not answer within 1 s"), "{e}"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("a stopped helper cannot answer"),
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(s);
    assert!(kill(p, None).is_err(), "the stopped helper must be gone (killed and reaped)");
}

/// Issue 41, item 10: each helper turns off core dumps and makes itself not dumpable as it
/// starts, before it reads any secret (exec made it dumpable again, whatever its caller set).
/// Run as another user, a non-dumpable process's /proc/PID/status belongs to root: that tells
/// the two apart from outside (for a process of root's own, nothing does).
#[test]
fn each_helper_turns_off_core_dumps_itself() {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    dirseal_testfs::needs_root!();
    for helper in [&*TPM_HELPER, &*FIDO2_HELPER] {
        let mut child = Command::new(helper)
            .uid(65534)
            .gid(65534)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // Its greeting: by then it has done what it does before reading a request.
        let mut len = [0u8; 4];
        child.stdout.as_mut().unwrap().read_exact(&mut len).unwrap();
        let mut hello = vec![0u8; u32::from_le_bytes(len) as usize];
        child.stdout.as_mut().unwrap().read_exact(&mut hello).unwrap();
        assert!(hello.starts_with(b"dirseal-helper/"), "{helper}: {:?}", String::from_utf8_lossy(&hello));
        let proc = format!("/proc/{}", child.id());
        let status = fs::read_to_string(format!("{proc}/status")).unwrap();
        assert!(status.lines().any(|l| l.starts_with("Uid:\t65534\t")), "{helper}: {status}");
        // (/proc/PID itself keeps the user as owner; the files in it change.)
        let owner = fs::metadata(format!("{proc}/status")).unwrap().uid();
        assert_eq!(owner, 0, "{helper} is dumpable: /proc/PID/status is its user's");
        let limits = fs::read_to_string(format!("{proc}/limits")).unwrap();
        let core = limits.lines().find(|l| l.starts_with("Max core file size")).unwrap();
        assert_eq!(core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(), ["0", "0"], "{helper}: {core}");
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success(), "{helper}");
    }
}
