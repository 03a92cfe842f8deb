//! Shared by the engine tests: a tree with every kind of entry; the manifest of everything the
//! conversion must preserve is dirseal-testfs's (`tree`).
#![allow(dead_code)]

pub mod changes;
pub mod host;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use dirseal_migrate::Request;
pub use dirseal_testfs::tree::{assert_same, walk};
use dirseal_testfs::{Options, TestFs};
use rustix::fs::{AtFlags, Timespec, Timestamps, CWD};

pub fn req<'a>(src: &'a Path, wd: &'a Path) -> Request<'a> {
    Request {
        source: src,
        workdir: wd,
        keep_backup: false,
        wipe: false,
        force: false,
        threads: std::num::NonZeroUsize::new(2).unwrap(),
        mode: dirseal_migrate::Mode::Copy,
        direction: dirseal_migrate::Direction::Encrypt,
        schedule: dirseal_migrate::Schedule::Now,
    }
}

/// The inode flags a conversion keeps (`lsattr`'s s u S D d A c t T C F P m j); the others are the
/// filesystem's own (extents, an index, encryption).
const KEPT_FLAGS: u32 = 0x10 // immutable
    | 0x20 // append-only
    | 0x1
    | 0x2
    | 0x8
    | 0x1_0000
    | 0x40
    | 0x80
    | 0x4
    | 0x8000
    | 0x2_0000
    | 0x80_0000
    | 0x4000_0000
    | 0x2000_0000
    | 0x400
    | 0x4000;

/// dirseal-testfs's manifest of everything a conversion keeps, and the inode flags of every
/// regular file and directory (read with the ioctl itself, not through the engine).
pub fn manifest(root: &Path) -> std::collections::BTreeMap<Vec<u8>, String> {
    use rustix::fs::{Mode, OFlags};
    let mut m = dirseal_testfs::tree::manifest(root);
    for (k, v) in m.iter_mut() {
        let path = if k.as_slice() == b"." { root.to_path_buf() } else { root.join(OsStr::from_bytes(k)) };
        let ft = fs::symlink_metadata(&path).unwrap().file_type();
        if !ft.is_file() && !ft.is_dir() {
            continue;
        }
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NOATIME | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let fd = rustix::fs::open(&path, flags, Mode::empty()).unwrap();
        let f = rustix::fs::ioctl_getflags(&fd).unwrap().bits() & KEPT_FLAGS;
        v.push_str(&format!(" iflags={f:#x}"));
    }
    m
}

/// `chattr` with `args` on `rel` below `root`.
pub fn chattr(root: &Path, args: &[&str], rel: &str) {
    let mut all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let p = root.join(rel);
    all.push(p.as_os_str());
    run("chattr", &all);
}

pub fn run(cmd: &str, args: &[&OsStr]) {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn os(p: &Path) -> &OsStr {
    p.as_os_str()
}

// Not every suite that includes this module uses both.
#[allow(unused_imports)]
pub use dirseal_testfs::{fresh_id as rand_id, names as wd_names};

/// A loop-mounted ext4 with one source directory and its work dir.
pub struct Case {
    pub fs: TestFs,
    pub src: PathBuf,
    pub wd: PathBuf,
}

impl Case {
    pub fn new() -> Case {
        Case::with(Options::default())
    }

    pub fn with(opts: Options) -> Case {
        let fs = TestFs::with(opts);
        let src = fs.path().join("home");
        let wd = fs.path().join(".dirseal/convert/home");
        Case { fs, src, wd }
    }

    /// Another source on the same filesystem, with its own work dir.
    pub fn other(&self, name: &str) -> (PathBuf, PathBuf) {
        (self.fs.path().join(name), self.fs.path().join(".dirseal/convert").join(name))
    }
}

fn set_times(path: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let ts = Timestamps {
        last_access: Timespec { tv_sec: atime.0, tv_nsec: atime.1 },
        last_modification: Timespec { tv_sec: mtime.0, tv_nsec: mtime.1 },
    };
    rustix::fs::utimensat(CWD, path, &ts, AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

fn chown(path: &Path, uid: u32, gid: u32) {
    rustix::fs::chownat(
        CWD,
        path,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

fn xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty()).unwrap();
}

/// Every kind of entry a home can hold, owned by random ids, with odd modes, names, xattrs, ACLs,
/// holes, hard links and nanosecond times. `root` must not exist yet.
pub fn build_tree(root: &Path) {
    let ids: Vec<u32> = (0..8).map(|_| rand_id()).collect();
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("a/plain.txt"), b"hello").unwrap();
    fs::write(root.join("a/empty-file"), b"").unwrap();
    fs::write(root.join("a/b/c/deep.bin"), (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect::<Vec<u8>>()).unwrap();
    {
        use std::os::unix::fs::FileExt;
        // Data at 0, 5 MiB and the end of a 12 MiB file.
        let f = fs::File::create(root.join("sparse.img")).unwrap();
        f.write_all_at(&[1u8; 4096], 0).unwrap();
        f.write_all_at(&[2u8; 8192], 5 << 20).unwrap();
        f.set_len(12 << 20).unwrap();
        f.write_all_at(&[3u8; 100], (12 << 20) - 100).unwrap();
        // Nothing but a hole.
        fs::File::create(root.join("all-hole")).unwrap().set_len(3 << 20).unwrap();
        // One hole block, and an external xattr block that makes st_blocks cover the size.
        let f = fs::File::create(root.join("a/hole-then-data")).unwrap();
        f.write_all_at(&[4u8; 4096], 4096).unwrap();
        drop(f);
        xattr(&root.join("a/hole-then-data"), "user.big", &[0x5a; 3000]);
    }
    // Hard links across directories, of a file, a FIFO and a symlink.
    fs::write(root.join("a/linked"), b"one inode").unwrap();
    fs::hard_link(root.join("a/linked"), root.join("a/b/linked-too")).unwrap();
    fs::hard_link(root.join("a/linked"), root.join("linked-three")).unwrap();
    run("mkfifo", &[os(&root.join("fifo"))]);
    fs::hard_link(root.join("fifo"), root.join("a/fifo-link")).unwrap();
    std::os::unix::fs::symlink("a/plain.txt", root.join("rel-link")).unwrap();
    fs::hard_link(root.join("rel-link"), root.join("a/b/rel-link-too")).unwrap();
    // Symlinks: absolute, dangling, a loop, non-UTF-8 and long targets. Never followed.
    std::os::unix::fs::symlink("/etc/shadow", root.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("nowhere/at/all", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("loop2", root.join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", root.join("loop2")).unwrap();
    std::os::unix::fs::symlink(OsStr::from_bytes(b"t\xff\xfe/x"), root.join("odd-target")).unwrap();
    std::os::unix::fs::symlink("d/".repeat(600), root.join("long-target")).unwrap();
    // Special files.
    drop(std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap());
    run("mknod", &[os(&root.join("null-dev")), OsStr::new("c"), OsStr::new("1"), OsStr::new("3")]);
    run("mknod", &[os(&root.join("a/blk-dev")), OsStr::new("b"), OsStr::new("7"), OsStr::new("200")]);
    // Names: 255 bytes, not UTF-8, newline and spaces, a leading dash.
    fs::write(root.join("n".repeat(255)), b"long name").unwrap();
    fs::create_dir(root.join("d".repeat(255))).unwrap();
    fs::write(root.join("d".repeat(255)).join("e".repeat(255)), b"long in long").unwrap();
    fs::write(root.join(OsStr::from_bytes(b"bad-\xff\xfe-utf8")), b"bytes").unwrap();
    fs::write(root.join("with\nnewline and spaces"), b"odd").unwrap();
    fs::write(root.join("-rf"), b"dash").unwrap();
    // Modes: setuid+setgid, setgid dir, sticky dir, no permissions, a read-only dir with content.
    fs::write(root.join("suid"), b"#!/bin/sh\n").unwrap();
    fs::write(root.join("nothing"), b"secret").unwrap();
    fs::create_dir(root.join("sticky")).unwrap();
    fs::create_dir(root.join("setgid-dir")).unwrap();
    fs::create_dir(root.join("ro-dir")).unwrap();
    fs::write(root.join("ro-dir/inside"), b"in a dir its owner cannot write").unwrap();
    // Xattrs: user (binary, with NUL), trusted (file, dir, symlink), security.capability, ACLs.
    xattr(&root.join("a/plain.txt"), "user.color", b"blue");
    xattr(&root.join("a/plain.txt"), "trusted.secret", b"\x00\xff\x10");
    xattr(&root.join("a/b"), "user.dir", b"yes");
    xattr(&root.join("a/b"), "trusted.dir", b"t");
    xattr(&root.join("abs-link"), "trusted.on-link", b"l");
    let acl_user = ids[6].to_string();
    run("setfacl", &[OsStr::new("-m"), OsStr::new(&format!("u:{acl_user}:r--")), os(&root.join("a/plain.txt"))]);
    run(
        "setfacl",
        &[OsStr::new("-d"), OsStr::new("-m"), OsStr::new(&format!("u:{acl_user}:rwx")), os(&root.join("a"))],
    );
    // Owners (random), then modes (chown clears setuid), then a file capability (chown clears it).
    for entry in walk(root) {
        chown(&root.join(&entry), ids[0], ids[1]);
    }
    chown(root, ids[0], ids[1]);
    chown(&root.join("rel-link"), ids[2], ids[3]);
    chown(&root.join("a/b/c/deep.bin"), ids[4], 0);
    chown(&root.join("null-dev"), 0, ids[5]);
    chown(&root.join("suid"), ids[2], ids[7]);
    fs::set_permissions(root.join("suid"), fs::Permissions::from_mode(0o6755)).unwrap();
    fs::set_permissions(root.join("nothing"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::set_permissions(root.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::set_permissions(root.join("setgid-dir"), fs::Permissions::from_mode(0o2770)).unwrap();
    fs::set_permissions(root.join("ro-dir"), fs::Permissions::from_mode(0o500)).unwrap();
    fs::set_permissions(root.join("a/b/c/deep.bin"), fs::Permissions::from_mode(0o640)).unwrap();
    // VFS_CAP_REVISION_2 without the effective bit, CAP_NET_BIND_SERVICE permitted.
    xattr(
        &root.join("a/b/c/deep.bin"),
        "security.capability",
        &[0, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    // Inode flags the copy keeps (issue 43): on files, directories and the root, on one with
    // hard links, on one set while empty (compression), on a directory with entries.
    chattr(root, &["+d", "+A"], "a/plain.txt");
    chattr(root, &["+S"], "a/linked");
    chattr(root, &["+c", "+s", "+u"], "a/b/c/deep.bin");
    chattr(root, &["+D", "+d", "+T"], "a");
    chattr(root, &["+c"], "a/b");
    chattr(root, &["+P", "+S"], "empty");
    chattr(root, &["+t"], "sparse.img");
    chattr(root, &["+A"], ".");
    // Nanosecond times, atime apart from mtime, directories after their children.
    let mut entries = walk(root);
    entries.sort_by_key(|e| std::cmp::Reverse(e.components().count()));
    entries.push(PathBuf::new());
    for (i, rel) in entries.iter().enumerate() {
        let i = i as i64;
        set_times(&root.join(rel), (1_000_000_000 + i, 111_111_111 + i), (1_500_000_000 + i, 987_654_321 - i));
    }
}

/// Makes entries of a [`build_tree`] tree immutable or append-only: files, a directory, and one
/// inside an append-only directory (set last: nothing could be changed in them after).
pub fn add_sealed(root: &Path) {
    chattr(root, &["+i"], "a/plain.txt");
    chattr(root, &["+a"], "a/b/c/deep.bin");
    chattr(root, &["+i"], "ro-dir/inside");
    chattr(root, &["+a"], "ro-dir");
    chattr(root, &["+i"], "sticky");
    chattr(root, &["+i"], "a/linked");
}

/// Adds `n` small files (and one of `big_mib` MiB) under `root/bulk`, owned like `root`.
pub fn add_bulk(root: &Path, n: usize, big_mib: usize) {
    let m = fs::metadata(root).unwrap();
    let bulk = root.join("bulk");
    fs::create_dir(&bulk).unwrap();
    for i in 0..n {
        let p = bulk.join(format!("f{i:04}"));
        fs::write(&p, vec![(i % 251) as u8; 4096 + i]).unwrap();
        chown(&p, m.uid(), m.gid());
    }
    if big_mib > 0 {
        fs::write(bulk.join("big"), vec![7u8; big_mib << 20]).unwrap();
    }
    chown(&bulk, m.uid(), m.gid());
}

/// Adds files that move chunk by chunk (the tests set a 1 MiB chunk) under `root/large`: a sparse
/// one with data islands across chunk boundaries, setuid and a file capability (which shrinking a
/// file drops), and a dense one; owned like `root`, with set times.
/// A file of several chunks with three names in three directories (after [`add_large`]): move
/// mode moves its data once and links the names again.
pub fn add_large_group(root: &Path) {
    let first = root.join("large/group-3m");
    fs::write(&first, (0..(3u32 << 20) + 777).map(|i| (i.wrapping_mul(40_503) >> 8) as u8).collect::<Vec<u8>>())
        .unwrap();
    fs::hard_link(&first, root.join("a/group-link")).unwrap();
    fs::hard_link(&first, root.join("group-three")).unwrap();
    let m = fs::metadata(root).unwrap();
    chown(&first, m.uid(), m.gid());
    fs::set_permissions(&first, fs::Permissions::from_mode(0o640)).unwrap();
    xattr(&first, "user.group", b"three names");
    set_times(&first, (1_100_000_003, 7), (1_600_000_003, 8));
    // The directories the links went into keep their times.
    set_times(&root.join("large"), (1_100_000_002, 5), (1_600_000_002, 6));
}

pub fn add_large(root: &Path) {
    use std::os::unix::fs::FileExt;
    let m = fs::metadata(root).unwrap();
    let dir = root.join("large");
    fs::create_dir(&dir).unwrap();
    let sparse = dir.join("sparse-5m");
    let f = fs::File::create(&sparse).unwrap();
    f.write_all_at(&[9u8; 8192], 0).unwrap();
    f.write_all_at(&(0..300_000u32).map(|i| (i % 253) as u8).collect::<Vec<u8>>(), (1 << 20) - 100_000).unwrap();
    f.set_len(5 << 20).unwrap();
    f.write_all_at(&[8u8; 5000], (5 << 20) - 5000).unwrap();
    drop(f);
    let dense = dir.join("dense-3m");
    fs::write(&dense, (0..(3u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect::<Vec<u8>>())
        .unwrap();
    for p in [&sparse, &dense, &dir] {
        chown(p, m.uid(), m.gid());
    }
    fs::set_permissions(&sparse, fs::Permissions::from_mode(0o4755)).unwrap();
    xattr(&sparse, "security.capability", &[0, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    xattr(&dense, "user.big", b"dense");
    // Moved in chunks: its flags travel in the journal's record of the file in flight.
    chattr(root, &["+d", "+c"], "large/sparse-5m");
    set_times(&sparse, (1_100_000_000, 1), (1_600_000_000, 2));
    set_times(&dense, (1_100_000_001, 3), (1_600_000_001, 4));
    set_times(&dir, (1_100_000_002, 5), (1_600_000_002, 6));
}
