//! Issue 44, 9: `status` without arguments lists the portable directories of mounted media (their
//! records are on the medium, not in this keystore), and a finished conversion of a portable
//! directory leaves no journal (which names its original path) on the medium.
mod common;

use std::path::Path;

use common::{p, Env};

/// Every `journal.json` under `dir`.
fn journals(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(journals(&path));
        } else if e.file_name() == "journal.json" {
            out.push(path);
        }
    }
    out
}

#[test]
fn status_lists_portable_directories_on_mounted_media() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let games = env.mnt().join("games");
    std::fs::create_dir(&games).unwrap();
    env.ok(&["encrypt", p(&games), "--portable", "--no-recovery-key", "--protector-name", "card"], "pw\n");
    let policy = env.status_json(&games)["policy"].as_str().expect("policy").to_string();
    let text = env.ok(&["status"], "");
    let line = text.lines().find(|l| l.starts_with(&format!("portable {policy}"))).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("unlocked") && line.contains(p(&games)) && line.contains(".dirseal/portable"), "{line}");
    assert!(!text.contains("no encrypted directories yet"), "{text}");
    let j: serde_json::Value = serde_json::from_str(&env.ok(&["status", "--json"], "")).unwrap();
    // Other mounted test filesystems may have portable directories too: this one is among them.
    let list = j["portable"].as_array().unwrap_or_else(|| panic!("{j}"));
    let ours = list.iter().find(|d| d["policy"] == policy.as_str()).unwrap_or_else(|| panic!("{j}"));
    assert_eq!((ours["key"].as_str(), ours["path_hint"].as_str()), (Some("unlocked"), Some(p(&games))), "{j}");
    env.ok(&["lock", p(&games)], "");
    let text = env.ok(&["status"], "");
    assert!(text.lines().any(|l| l.starts_with(&format!("portable {policy}  locked"))), "{text}");
}

#[test]
fn a_finished_portable_conversion_leaves_no_journal_on_the_medium() {
    dirseal_testfs::needs_root!();
    let env = Env::new();
    let music = env.mnt().join("music");
    std::fs::create_dir(&music).unwrap();
    std::fs::write(music.join("song"), b"la la").unwrap();
    env.ok(&["convert", p(&music), "--portable", "--yes", "--no-recovery-key"], "pw\n");
    assert_eq!(env.status_json(&music)["encrypted"], true);
    assert_eq!(std::fs::read(music.join("song")).unwrap(), b"la la");
    let left = journals(&env.mnt().join(".dirseal"));
    assert!(left.is_empty(), "a finished portable conversion left {left:?}");
    // Run again (a power cut just past "done"): still said to be done, exit 0.
    let again = env.ok(&["convert", p(&music), "--portable", "--yes", "--no-recovery-key"], "");
    assert!(again.contains("already encrypted") && again.contains("finished"), "{again}");
    // A directory of this machine keeps its finished journal (`convert --status` reads it).
    let local = env.mnt().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::write(local.join("f"), b"x").unwrap();
    env.ok(&["convert", p(&local), "--yes", "--no-recovery-key"], "pw2\n");
    assert_eq!(journals(&env.mnt().join(".dirseal")).len(), 1);
}
