//! A portable directory (its records on its own filesystem, docs/portable.md) over D-Bus: its
//! protectors are added and removed where its records are, as the CLI's `policy add-protector` /
//! `remove-protector` do. Creates users: run only under the global suite lock (scripts/test.sh).
mod support;

use std::path::{Path, PathBuf};

use dirseal::ops::{NewProtector, ProtectorChoice};
use dirseal::protector::{KindOptions, NewKind};
use support::{fd, s, strings, write_as_root, Harness};

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "json")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn protectors_of_a_portable_directory_are_added_and_removed_over_dbus() {
    dirseal_testfs::needs_root!();
    let h = Harness::new();
    let alice = h.user();
    let dir = alice.home.clone();
    let d = dir.to_str().unwrap();

    // Made on another machine (its own config and keystore), the card then brought here.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("config.toml"), support::FAST_CONFIG).unwrap();
    let mut ds = dirseal::Dirseal::open(&other.path().join("config.toml"), Some(&other.path().join("ks"))).unwrap();
    let kind = NewKind::named("password", KindOptions::new(Vec::new())).unwrap();
    let choice = ProtectorChoice::New(NewProtector { name: alice.name.as_str().into(), uid: Some(alice.uid), kind });
    ds.encrypt_portable(&dir, choice, &mut dirseal_testfs::ui::Scripted::new(&["pw-card", "pw-card"])).unwrap();
    write_as_root(&dir.join("save.dat"), b"level 9");
    assert!(ds.lock(&dir, false).unwrap().locked);
    let card = h.fs.path().join(".dirseal/portable");
    let policy = json_files(&card.join("policies")).remove(0);

    // Alice adds a new password, proved by the card's: it goes to the card, nothing to the service's
    // keystore.
    let added = h.ok(
        Some(&alice),
        "AddProtectorToPolicy",
        &[s(d), s(""), fd(3), s(""), fd(4), s("laptop")],
        &[(3, "pw-card"), (4, "pw-2")],
    );
    let added = strings(&added).remove(0);
    assert_eq!(json_files(&card.join("protectors")).len(), 2);
    assert!(std::fs::read_to_string(&policy).unwrap().contains(&added));
    assert!(json_files(&h.keystore().join("protectors")).is_empty(), "the service's keystore holds nothing of it");
    assert!(json_files(&h.keystore().join("policies")).is_empty());
    let st = h.ok(Some(&alice), "GetStatus", &[s(d)], &[]);
    assert!(st.contains(&added) && st.contains("'laptop'"), "{st}");
    // Unnamed: Unlock looks a protector it is given by id up in this machine's keystore only.
    h.ok(Some(&alice), "Unlock", &[s(d), s(""), fd(3)], &[(3, "pw-2")]);
    assert_eq!(std::fs::read(dir.join("save.dat")).unwrap(), b"level 9");
    h.ok(Some(&alice), "Lock", &[s(d), "false".into()], &[]);

    // And removes it again: the card's policy no longer lists it.
    h.ok(Some(&alice), "RemoveProtectorFromPolicy", &[s(d), s(&added)], &[]);
    assert!(!std::fs::read_to_string(&policy).unwrap().contains(&added));
    let st = h.ok(Some(&alice), "GetStatus", &[s(d)], &[]);
    assert!(!st.contains(&added), "{st}");
    h.ok(Some(&alice), "Unlock", &[s(d), s(""), fd(3)], &[(3, "pw-card")]);
    assert_eq!(std::fs::read(dir.join("save.dat")).unwrap(), b"level 9");
}
