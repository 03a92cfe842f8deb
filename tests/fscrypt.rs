//! The kernel layer against a real loop-mounted ext4: policies, keys, locking, exchange.
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use dirseal::fscrypt::{self, FscryptError, KeyIdentifier, KeyStatus, PolicyV2, RemoveOutcome};
use dirseal::secret::MasterKey;
use dirseal_testfs::{Options, TestFs};

fn small_fs() -> TestFs {
    TestFs::with(Options { size_mib: 64, ..Options::default() })
}

/// Names in `dir` as a set (locked and unlocked listings are compared as sets).
fn names(dir: &Path) -> BTreeSet<String> {
    dirseal_testfs::names(dir).into_iter().collect()
}

/// A fresh encrypted, unlocked, empty directory `name` under the mount.
fn encrypted_dir(tfs: &TestFs, name: &str) -> (PathBuf, MasterKey, KeyIdentifier) {
    let dir = tfs.path().join(name);
    fs::create_dir(&dir).unwrap();
    let key = MasterKey::random();
    let id = fscrypt::key_identifier(&key);
    fscrypt::set_policy(&dir, &id).unwrap();
    assert_eq!(fscrypt::add_key(tfs.path(), &key).unwrap(), id);
    (dir, key, id)
}

#[test]
fn lock_hides_names_and_contents_and_unlock_restores_them() {
    dirseal_testfs::needs_root!();
    let tfs = small_fs();
    let mp = tfs.path();
    fscrypt::check_supported(mp).unwrap();
    let dir = mp.join("secret");
    fs::create_dir(&dir).unwrap();
    assert_eq!(fscrypt::get_policy(&dir).unwrap(), None);
    assert!(!fscrypt::is_encrypted(&dir).unwrap());

    let key = MasterKey::random();
    let id = fscrypt::key_identifier(&key);
    fscrypt::set_policy(&dir, &id).unwrap();
    assert_eq!(fscrypt::get_policy(&dir).unwrap(), Some(PolicyV2::new(id)));
    assert!(fscrypt::is_encrypted(&dir).unwrap());
    // Setting the identical policy again is allowed; the kernel treats it as a no-op.
    fscrypt::set_policy(&dir, &id).unwrap();
    assert_eq!(fscrypt::key_status(mp, &id).unwrap(), KeyStatus::Absent);

    assert_eq!(fscrypt::add_key(mp, &key).unwrap(), id);
    assert_eq!(fscrypt::key_status(mp, &id).unwrap(), KeyStatus::Present);
    fs::write(dir.join("hello.txt"), b"hello world").unwrap();
    fs::create_dir(dir.join("sub")).unwrap();
    fs::write(dir.join("sub/nested.txt"), b"nested").unwrap();
    let plain: BTreeSet<String> = ["hello.txt", "sub"].map(String::from).into();
    assert_eq!(names(&dir), plain);
    assert!(fscrypt::is_encrypted(&dir.join("hello.txt")).unwrap());
    assert_eq!(fscrypt::get_policy(&dir.join("sub")).unwrap(), Some(PolicyV2::new(id)));

    let out = fscrypt::remove_key(mp, &id, false).unwrap();
    assert_eq!(out, RemoveOutcome::default());
    assert_eq!(fscrypt::key_status(mp, &id).unwrap(), KeyStatus::Absent);

    let locked = names(&dir);
    assert_eq!(locked.len(), 2);
    assert!(locked.is_disjoint(&plain), "names still visible: {locked:?}");
    assert!(fs::read(dir.join("hello.txt")).is_err());
    // The ciphertext names exist, but their contents cannot be opened without the key.
    for n in &locked {
        let p = dir.join(n);
        assert!(fscrypt::is_encrypted(&p).unwrap());
        if p.symlink_metadata().unwrap().is_file() {
            let err = fs::read(&p).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::ENOKEY), "{err}");
        }
    }
    // Directories can still be opened while locked, so the policy stays readable.
    assert_eq!(fscrypt::get_policy(&dir).unwrap(), Some(PolicyV2::new(id)));

    assert_eq!(fscrypt::add_key(mp, &key).unwrap(), id);
    assert_eq!(names(&dir), plain);
    assert_eq!(fs::read(dir.join("hello.txt")).unwrap(), b"hello world");
    assert_eq!(fs::read(dir.join("sub/nested.txt")).unwrap(), b"nested");

    // Removing twice: the second time there is nothing to remove.
    fscrypt::remove_key(mp, &id, true).unwrap();
    let err = fscrypt::remove_key(mp, &id, false).unwrap_err();
    assert!(matches!(err, FscryptError::KeyNotPresent { .. }), "{err:?}");
}

#[test]
fn kernel_identifier_equals_local_derivation() {
    dirseal_testfs::needs_root!();
    let tfs = small_fs();
    // The same vector as the unit test, so the unit test is anchored to the kernel.
    let fixed = MasterKey::from_slice(&(0u8..64).collect::<Vec<_>>()).unwrap();
    let kernel = fscrypt::add_key(tfs.path(), &fixed).unwrap();
    assert_eq!(kernel.to_string(), "8699c2c53707405da5aba5ae4d8583c0");
    assert_eq!(kernel, fscrypt::key_identifier(&fixed));
    for _ in 0..3 {
        let key = MasterKey::random();
        assert_eq!(fscrypt::add_key(tfs.path(), &key).unwrap(), fscrypt::key_identifier(&key));
    }
}

#[test]
fn set_policy_refuses_what_it_cannot_encrypt() {
    dirseal_testfs::needs_root!();
    let tfs = small_fs();
    let mp = tfs.path();
    let id = fscrypt::key_identifier(&MasterKey::random());

    let full = mp.join("full");
    fs::create_dir(&full).unwrap();
    fs::write(full.join("f"), b"x").unwrap();
    let err = fscrypt::set_policy(&full, &id).unwrap_err();
    assert!(matches!(err, FscryptError::NotEmpty { .. }), "{err:?}");
    // The library says what to do in words; the CLI names the command (cli::hint).
    assert!(
        err.to_string().contains("one that holds data is converted") && !err.to_string().contains("`dirseal"),
        "{err}"
    );

    let file = full.join("f");
    let err = fscrypt::set_policy(&file, &id).unwrap_err();
    assert!(matches!(err, FscryptError::NotADirectory { .. }), "{err:?}");

    let empty = mp.join("empty");
    fs::create_dir(&empty).unwrap();
    let link = mp.join("link");
    std::os::unix::fs::symlink(&empty, &link).unwrap();
    let err = fscrypt::set_policy(&link, &id).unwrap_err();
    assert!(matches!(err, FscryptError::Symlink { .. }), "{err:?}");
    let err = fscrypt::get_policy(&link).unwrap_err();
    assert!(matches!(err, FscryptError::Symlink { .. }), "{err:?}");
    assert!(!fscrypt::is_encrypted(&link).unwrap());
    assert_eq!(fscrypt::get_policy(&empty).unwrap(), None, "the symlink must not have been followed");

    fscrypt::set_policy(&empty, &id).unwrap();
    let other = fscrypt::key_identifier(&MasterKey::random());
    let err = fscrypt::set_policy(&empty, &other).unwrap_err();
    assert!(matches!(err, FscryptError::AlreadyEncrypted { .. }), "{err:?}");
    assert_eq!(fscrypt::get_policy(&empty).unwrap(), Some(PolicyV2::new(id)));
}

#[test]
fn filesystem_without_encrypt_feature_is_reported_with_a_fix() {
    dirseal_testfs::needs_root!();
    let tfs = TestFs::with(Options { size_mib: 64, encrypt: false, ..Options::default() });
    let mp = tfs.path();
    let err = fscrypt::check_supported(mp).unwrap_err();
    let FscryptError::NotSupported { mountpoint, fstype, device } = &err else { panic!("{err:?}") };
    assert_eq!(mountpoint, &fs::canonicalize(mp).unwrap());
    assert_eq!(fstype.as_deref(), Some("ext4"));
    let device = device.clone().unwrap();
    assert!(device.starts_with("/dev/loop"), "{device}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("tune2fs -O encrypt {device}")), "{msg}");

    let dir = mp.join("d");
    fs::create_dir(&dir).unwrap();
    let key = MasterKey::random();
    let err = fscrypt::set_policy(&dir, &fscrypt::key_identifier(&key)).unwrap_err();
    assert!(matches!(err, FscryptError::NotSupported { .. }), "{err:?}");
    let err = fscrypt::add_key(mp, &key).unwrap_err();
    assert!(matches!(err, FscryptError::NotSupported { .. }), "{err:?}");
    assert!(!fscrypt::is_encrypted(&dir).unwrap());
}

#[test]
fn open_file_keeps_key_incompletely_removed_until_closed() {
    dirseal_testfs::needs_root!();
    let tfs = small_fs();
    let mp = tfs.path();
    let (dir, _key, id) = encrypted_dir(&tfs, "busy");
    fs::write(dir.join("held"), b"in use").unwrap();
    let held = fs::File::open(dir.join("held")).unwrap();

    let out = fscrypt::remove_key(mp, &id, false).unwrap();
    assert_eq!(out, RemoveOutcome { files_busy: true, other_users: false });
    assert_eq!(fscrypt::key_status(mp, &id).unwrap(), KeyStatus::IncompletelyRemoved);

    drop(held);
    let out = fscrypt::remove_key(mp, &id, false).unwrap();
    assert_eq!(out, RemoveOutcome::default());
    assert_eq!(fscrypt::key_status(mp, &id).unwrap(), KeyStatus::Absent);
    assert!(!names(&dir).contains("held"));
}

#[test]
fn mount_point_is_the_filesystem_root() {
    dirseal_testfs::needs_root!();
    let tfs = small_fs();
    let root = fs::canonicalize(tfs.path()).unwrap();
    let sub = tfs.path().join("a/b");
    fs::create_dir_all(&sub).unwrap();
    assert_eq!(fscrypt::mount_point(&sub).unwrap(), root);
    assert_eq!(fscrypt::mount_point(tfs.path()).unwrap(), root);
    // A symlink on the test fs pointing off it belongs to the test fs: it is not followed.
    let link = tfs.path().join("a/out");
    std::os::unix::fs::symlink("/", &link).unwrap();
    assert_eq!(fscrypt::mount_point(&link).unwrap(), root);
    // The scratch dir is on another filesystem.
    assert_ne!(fscrypt::mount_point(&tfs.scratch()).unwrap(), root);
    let err = fscrypt::mount_point(&tfs.path().join("missing")).unwrap_err();
    assert!(matches!(err, FscryptError::Io { .. }), "{err:?}");
}

#[test]
fn rename_exchange_swaps_an_encrypted_and_a_plain_directory() {
    dirseal_testfs::needs_root!();
    let tfs = small_fs();
    let parent = tfs.path().join("p");
    fs::create_dir(&parent).unwrap();
    let (enc, _key, id) = encrypted_dir(&tfs, "p/enc");
    fs::write(enc.join("secret"), b"s").unwrap();
    let plain = parent.join("plain");
    fs::create_dir(&plain).unwrap();
    fs::write(plain.join("open"), b"o").unwrap();
    assert!(fscrypt::is_encrypted(&enc).unwrap());
    assert!(!fscrypt::is_encrypted(&plain).unwrap());

    fscrypt::rename_exchange(&enc, &plain).unwrap();
    assert!(fscrypt::is_encrypted(&plain).unwrap());
    assert!(!fscrypt::is_encrypted(&enc).unwrap());
    assert_eq!(fscrypt::get_policy(&plain).unwrap(), Some(PolicyV2::new(id)));
    assert_eq!(fs::read(plain.join("secret")).unwrap(), b"s");
    assert_eq!(fs::read(enc.join("open")).unwrap(), b"o");

    let err = fscrypt::rename_exchange(&plain, &parent.join("missing")).unwrap_err();
    assert!(matches!(err, FscryptError::Io { .. }), "{err:?}");
    // Swapping a plain directory into an encrypted one would break the policy invariant.
    fs::create_dir(plain.join("inner")).unwrap();
    let err = fscrypt::rename_exchange(&enc, &plain.join("inner")).unwrap_err();
    assert!(matches!(err, FscryptError::ExchangeRefused { .. }), "{err:?}");
    let err = fscrypt::rename_exchange(&parent.join("."), &plain).unwrap_err();
    assert!(matches!(err, FscryptError::InvalidPath { .. }), "{err:?}");
}

#[test]
fn is_encrypted_does_not_follow_symlinks() {
    dirseal_testfs::needs_root!();
    let tfs = small_fs();
    let (enc, _key, _id) = encrypted_dir(&tfs, "enc");
    fs::write(enc.join("f"), b"x").unwrap();
    let link = tfs.path().join("to-enc");
    std::os::unix::fs::symlink(&enc, &link).unwrap();
    assert!(!fscrypt::is_encrypted(&link).unwrap());
    assert!(fscrypt::is_encrypted(&enc.join("f")).unwrap());
    assert!(!fscrypt::is_encrypted(tfs.path()).unwrap());
    // A symlink inside an encrypted directory is itself encrypted.
    std::os::unix::fs::symlink("f", enc.join("l")).unwrap();
    assert!(fscrypt::is_encrypted(&enc.join("l")).unwrap());
}

#[test]
fn rename_exchange_never_follows_a_symlink_in_a_parent() {
    dirseal_testfs::needs_root!();
    let tfs = small_fs();
    let real = tfs.path().join("real");
    fs::create_dir_all(real.join("a")).unwrap();
    fs::create_dir_all(real.join("b")).unwrap();
    let link = tfs.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    fs::write(real.join("a/marker"), b"a").unwrap();
    let err = fscrypt::rename_exchange(&link.join("a"), &link.join("b")).unwrap_err();
    assert!(matches!(err, FscryptError::Symlink { .. }), "{err:?}");
    // Nothing moved; through real paths the exchange works.
    assert!(real.join("a/marker").exists());
    fscrypt::rename_exchange(&real.join("a"), &real.join("b")).unwrap();
    assert!(real.join("b/marker").exists());
}
