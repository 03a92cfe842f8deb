//! Issue 43: convert, decrypt and move mode keep inode flags, through the real binary on a real
//! encrypted staging directory, checked with the real `lsattr` (an independent reader). The host
//! kernel has no CONFIG_UNICODE and no CONFIG_QUOTA, so casefold and project ids are proven in
//! the guest (scripts/vm); here +P is kept without a project id.
mod common;

use std::fs;
use std::path::Path;

use common::{p, Env};

fn chattr(args: &[&str], path: &Path) {
    let out = std::process::Command::new("chattr").args(args).arg(path).output().unwrap();
    assert!(out.status.success(), "chattr {args:?} {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
}

/// `lsattr -R -a -p` of the tree and `-d` of its root, with the encryption flag (`E`, the
/// conversion's own) blanked: every line names a path and its flags and project id.
fn lsattr(root: &Path) -> String {
    let mut text = String::new();
    for args in [&["-d", "-p"][..], &["-R", "-a", "-p"][..]] {
        let out = std::process::Command::new("lsattr").args(args).arg(root).output().unwrap();
        assert!(out.status.success(), "lsattr: {}", String::from_utf8_lossy(&out.stderr));
        text.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    // Entry lines only (not the headers of `-R`), sorted: a copy lists its names in another
    // order. The filesystem's own flags (encryption, an index, inline data) are blanked.
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.ends_with("/.") && !l.ends_with("/.."))
        .filter_map(|l| {
            let (proj, rest) = l.trim_start().split_once(' ')?;
            let (flags, path) = rest.split_once(' ')?;
            let flags: String = flags.chars().map(|c| if "EIN".contains(c) { '-' } else { c }).collect();
            Some(format!("{proj} {flags} {path}\n"))
        })
        .collect();
    lines.sort();
    lines.concat()
}

/// A home with the flags people set: nodump on a backup-excluded cache, noatime on a mail store,
/// sync and dirsync on a database, project inheritance and top-dir on a games folder, and more.
fn flagged_home(root: &Path) {
    fs::create_dir_all(root.join(".cache/thumbs")).unwrap();
    fs::create_dir_all(root.join("Mail/cur")).unwrap();
    fs::create_dir_all(root.join("db")).unwrap();
    fs::create_dir_all(root.join("Games/Data")).unwrap();
    fs::write(root.join(".cache/thumbs/a.png"), vec![1u8; 5000]).unwrap();
    fs::write(root.join("Mail/cur/1"), b"Subject: hi\n\nbody").unwrap();
    fs::write(root.join("db/data.sqlite"), vec![2u8; 70_000]).unwrap();
    fs::write(root.join("Games/Data/Data.PAK"), vec![3u8; 3 << 20]).unwrap();
    fs::write(root.join("notes.txt"), b"plain, no flags").unwrap();
    chattr(&["+d"], &root.join(".cache"));
    chattr(&["+d"], &root.join(".cache/thumbs/a.png"));
    chattr(&["+A"], &root.join("Mail/cur/1"));
    chattr(&["+A", "+D"], &root.join("Mail"));
    chattr(&["+S"], &root.join("db/data.sqlite"));
    chattr(&["+D", "+S"], &root.join("db"));
    chattr(&["+P", "+T"], &root.join("Games"));
    chattr(&["+c", "+d"], &root.join("Games/Data/Data.PAK"));
    chattr(&["+d"], root);
}

/// Runs `c` with the password on its stdin.
fn piped(c: &mut std::process::Command) -> std::process::Output {
    use std::process::Stdio;
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let _ = std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"pw\n");
    child.wait_with_output().unwrap()
}

fn run_ok(env: &Env, args: &[&str]) -> (String, String) {
    let out = env.run(args, "pw\n");
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "dirseal {args:?}:\n{o}{e}");
    (o, e)
}

#[test]
fn convert_decrypt_and_move_keep_every_inode_flag_lsattr_shows() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    flagged_home(&home);
    let before = lsattr(&home);
    assert!(before.contains("--S-----") && before.contains("P--"), "the flags were not set:\n{before}");

    // The plan counts them, as JSON and as the confirmation says it.
    let (out, _) = run_ok(&env, &["convert", p(&home), "--yes", "--json", "--protector-name", "o", "--mode", "copy"]);
    let plan = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("plan").cloned())
        .unwrap_or_else(|| panic!("no plan in {out}"));
    // The root, .cache, its png, Mail, Mail/cur/1, db, its file, Games, Data.PAK.
    assert_eq!(plan["flagged_entries"], 9, "{plan}");
    assert_eq!(plan["casefolded_dirs"], 0, "{plan}");
    let kept: Vec<&str> = plan["kept_flags"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(
        kept,
        ["sync", "dirsync", "nodump", "noatime", "compression", "top of directory hierarchy", "project inheritance"],
        "{plan}"
    );
    assert_eq!(lsattr(&home), before, "after convert");
    assert_eq!(env.status_json(&home)["encrypted"], true);

    let (_, err) = run_ok(&env, &["decrypt", p(&home), "--yes"]);
    assert_eq!(lsattr(&home), before, "after decrypt\n{err}");

    let (_, err) = run_ok(&env, &["convert", p(&home), "--yes", "--protector-name", "o", "--mode", "move"]);
    assert_eq!(lsattr(&home), before, "after convert by moving\n{err}");
    let (_, _) = run_ok(&env, &["decrypt", p(&home), "--yes", "--mode", "move"]);
    assert_eq!(lsattr(&home), before, "after decrypt by moving");
}

/// A crash at every step that touches flags (a new staging directory before its casefold and
/// compression, a file linked with its flags, a directory's flags at the end, a compared entry; in
/// move mode a file in flight with its flags in the journal, its chunks, a settled directory), in
/// a real encrypted conversion and decrypt, each run again: the flags come out as they were.
#[cfg(feature = "fault-injection")]
#[test]
fn a_crash_at_every_flag_step_then_a_resume_keeps_the_flags() {
    dirseal_testfs::needs_root!();
    let env = Env::with(common::Options { size_mib: 512, ..Default::default() });
    let copy = [
        "copy-dir-made:1",
        "copy-dir-made:4",
        "copy-file:2",
        "copy-file:5",
        "copy-dir:1",
        "copy-dir:5",
        "verify-entry:3",
    ];
    let moving = [
        "move-dir-made:1",
        "move-dir-made:4",
        "move-entry-copied:2",
        "move-file-started:1",
        "move-chunk-recorded:2",
        "move-file-done:1",
        "settle-times-kept:2",
        "settle-dir:3",
    ];
    let runs = copy.iter().map(|p| ("convert", "copy", p)).chain(moving.iter().map(|p| ("convert", "move", p)));
    let runs = runs.chain([("decrypt", "copy", &"copy-dir-made:3"), ("decrypt", "move", &"move-file-started:1")]);
    for (i, (cmd, mode, point)) in runs.enumerate() {
        let home = env.mnt().join(format!("h{i}"));
        flagged_home(&home);
        let args = match cmd {
            "convert" => vec!["convert", p(&home), "--yes", "--protector-name", "o", "--mode", mode],
            _ => {
                run_ok(&env, &["convert", p(&home), "--yes", "--protector-name", "o"]);
                vec!["decrypt", p(&home), "--yes", "--mode", mode]
            }
        };
        let before = lsattr(&home);
        let out = piped(env.cmd(&args).env("DIRSEAL_FAULT", point).env("DIRSEAL_MOVE_CHUNK", "1048576"));
        assert_eq!(
            out.status.code(),
            Some(99),
            "{cmd} {mode} did not die at {point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if mode == "copy" {
            // A move has taken files out of the original by now.
            assert_eq!(lsattr(&home), before, "right after the crash at {point} ({cmd} {mode})");
        }
        let out = piped(env.cmd(&args).env("DIRSEAL_MOVE_CHUNK", "1048576"));
        assert!(out.status.success(), "{cmd} {mode} after {point}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(lsattr(&home), before, "after resuming from {point} ({cmd} {mode})");
    }
}

/// Immutable and append-only entries through the binary: kept by an encrypted conversion and its
/// decrypt (copy mode), the originals disposed of; a move is refused before anything is written.
#[test]
fn immutable_and_append_only_entries_are_kept_by_copying_and_refused_by_moving() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let home = env.mnt().join("home");
    flagged_home(&home);
    fs::write(home.join("Mail/archive.mbox"), b"From a\n").unwrap();
    chattr(&["+a"], &home.join("Mail/archive.mbox"));
    chattr(&["+i"], &home.join("notes.txt"));
    chattr(&["+i"], &home.join("Games/Data"));
    let before = lsattr(&home);
    assert!(before.contains("----i---") && before.contains("-----a-A"), "{before}");
    let err = env.fails(&["convert", p(&home), "--yes", "--protector-name", "o", "--mode", "move"], "pw\n");
    assert!(err.contains("Games/Data") || err.contains("archive.mbox") || err.contains("notes.txt"), "{err}");
    assert!(err.contains("--mode copy"), "{err}");
    assert_eq!(lsattr(&home), before, "after the refused move");
    let (out, _) = run_ok(&env, &["convert", p(&home), "--yes", "--json", "--protector-name", "o", "--mode", "copy"]);
    assert!(out.contains(r#""immutable""#) && out.contains(r#""append-only""#), "the plan names them: {out}");
    assert_eq!(lsattr(&home), before, "after convert");
    assert_eq!(env.status_json(&home)["encrypted"], true);
    run_ok(&env, &["decrypt", p(&home), "--yes", "--mode", "copy"]);
    assert_eq!(lsattr(&home), before, "after decrypt");
    // The originals were removed (their flags cleared first): only the journal and lock remain.
    for e in fs::read_dir(env.mnt().join(".dirseal/convert")).unwrap() {
        let mut left = common::names(&e.unwrap().path());
        left.sort();
        assert_eq!(left, ["journal.json", "lock"]);
    }
}
