//! scripts/try-dbus.sh, the newcomer's demo, end to end with a small sample and the dirsealed this
//! build made: it must show the job's Progress and Finished signals and a refusal named
//! AccessDenied, and leave nothing behind. Creates a user: run only under the global suite lock.
use std::process::Command;

#[test]
fn the_dbus_demo_runs_and_leaves_nothing_behind() {
    dirseal_testfs::needs_root!();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace");
    let out = Command::new("bash")
        .arg(repo.join("scripts/try-dbus.sh"))
        .env("DIRSEALED", env!("CARGO_BIN_EXE_dirsealed"))
        .env("SAMPLE_MIB", "4")
        .env("SAMPLE_FILES", "200")
        .output()
        .expect("bash");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the demo failed:\n{text}");
    assert!(!text.contains('\x1b'), "terminal escape codes written into a pipe:\n{text}");
    for want in [
        "org.dirseal.Dirseal1.Job.Progress ('copying'",
        "org.dirseal.Dirseal1.Job.Finished ('done'",
        "job state: done",
        "'encrypted': <true>",
        "dear diary",
        "GDBus.Error:org.freedesktop.DBus.Error.AccessDenied: ",
    ] {
        assert!(text.contains(want), "the demo's output lacks {want:?}:\n{text}");
    }
    // What it made: its temp dir (named in the bus address) and its user (in a heading).
    let work = text
        .split("unix:path=")
        .nth(1)
        .and_then(|r| r.split("/bus").next())
        .unwrap_or_else(|| panic!("no bus address in:\n{text}"));
    let user = text
        .split("sample home for user ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_alphanumeric()).next())
        .unwrap_or_else(|| panic!("no user in:\n{text}"));
    assert!(work.starts_with("/tmp/dirseal-try-dbus.") && !user.is_empty(), "{work} {user}");
    assert!(!std::path::Path::new(work).exists(), "{work} is left behind");
    for db in ["/etc/passwd", "/etc/group"] {
        let text = std::fs::read_to_string(db).expect(db);
        assert!(!text.lines().any(|l| l.starts_with(&format!("{user}:"))), "{user} is left in {db}");
    }
    let loops = Command::new("losetup").arg("-a").output().expect("losetup");
    assert!(!String::from_utf8_lossy(&loops.stdout).contains(work), "a loop device of {work} is left attached");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(work), "{work} is left mounted");
}
