//! The changes a live conversion's catch-up passes must bring into staging, one of each kind, on
//! a [`build_tree`](super::build_tree) tree: shared by tests/live.rs (caught up, then committed)
//! and tests/crash.rs (the same, killed at every live journal step).
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Overwrites bytes of a file in place, then puts its times back: same size, same times, other
/// bytes (only its ctime tells).
pub fn scribble(f: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let m = fs::symlink_metadata(f).unwrap();
    fs::OpenOptions::new().write(true).open(f).unwrap().write_all_at(bytes, at).unwrap();
    let t = |s, ns| rustix::fs::Timespec { tv_sec: s, tv_nsec: ns };
    let ts = rustix::fs::Timestamps {
        last_access: t(m.atime(), m.atime_nsec()),
        last_modification: t(m.mtime(), m.mtime_nsec()),
    };
    rustix::fs::utimensat(rustix::fs::CWD, f, &ts, rustix::fs::AtFlags::empty()).unwrap();
    let after = fs::symlink_metadata(f).unwrap();
    assert_eq!((after.len(), after.mtime(), after.mtime_nsec()), (m.len(), m.mtime(), m.mtime_nsec()));
}

/// Puts back the times a change gave a directory (so only ctimes tell a test's changes).
pub fn keep_times(dir: &Path, f: impl FnOnce()) {
    let m = fs::symlink_metadata(dir).unwrap();
    f();
    let t = |s, ns| rustix::fs::Timespec { tv_sec: s, tv_nsec: ns };
    let ts = rustix::fs::Timestamps {
        last_access: t(m.atime(), m.atime_nsec()),
        last_modification: t(m.mtime(), m.mtime_nsec()),
    };
    rustix::fs::utimensat(rustix::fs::CWD, dir, &ts, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

pub fn append(f: &Path, bytes: &[u8]) {
    use std::io::Write;
    fs::OpenOptions::new().append(true).open(f).unwrap().write_all(bytes).unwrap();
}

pub type Change = fn(&Path);

/// Each kind of change, named. None touches the file [`rewrite_known`] rewrites.
pub const EVERY_KIND: &[(&str, Change)] = &[
    ("appended", |s| append(&s.join("a/plain.txt"), b" world")),
    // (Not deep.bin: a write drops its file capability, which metadata shows.)
    ("rewritten in place, same size and times", |s| {
        scribble(&s.join("a/linked"), 1, b"XYZ");
        scribble(&s.join("n".repeat(255)), 0, b"N");
    }),
    ("renamed across directories", |s| {
        fs::rename(s.join("a/b/c/deep.bin"), s.join("empty/deep.bin")).unwrap();
        fs::rename(s.join("a/b"), s.join("sticky/b-moved")).unwrap();
    }),
    ("renamed over another", |s| fs::rename(s.join("-rf"), s.join("suid")).unwrap()),
    ("a directory replaced by a file", |s| {
        fs::remove_dir_all(s.join("a/b/c")).unwrap();
        fs::write(s.join("a/b/c"), b"now a file").unwrap();
    }),
    ("a file replaced by a directory", |s| {
        fs::remove_file(s.join("a/plain.txt")).unwrap();
        fs::create_dir(s.join("a/plain.txt")).unwrap();
        fs::write(s.join("a/plain.txt/inside"), b"x").unwrap();
    }),
    ("deleted", |s| {
        fs::remove_file(s.join("sparse.img")).unwrap();
        fs::remove_dir(s.join("empty")).unwrap();
        fs::remove_file(s.join("a/b/linked-too")).unwrap();
    }),
    ("new hard links", |s| {
        fs::hard_link(s.join("a/plain.txt"), s.join("empty/plain-too")).unwrap();
        fs::hard_link(s.join("a/linked"), s.join("empty/linked-four")).unwrap();
    }),
    ("xattrs, mode and owner", |s| {
        rustix::fs::lsetxattr(s.join("a/empty-file"), "user.new", b"v", rustix::fs::XattrFlags::empty()).unwrap();
        rustix::fs::lremovexattr(s.join("a/plain.txt"), "user.color").unwrap();
        keep_times(&s.join("nothing"), || {
            fs::set_permissions(s.join("nothing"), fs::Permissions::from_mode(0o604)).unwrap()
        });
        keep_times(&s.join("a/b"), || {
            rustix::fs::chownat(
                rustix::fs::CWD,
                s.join("a/b"),
                Some(rustix::fs::Uid::from_raw(4321)),
                None,
                rustix::fs::AtFlags::empty(),
            )
            .unwrap()
        });
    }),
    ("new files and directories", |s| {
        fs::create_dir_all(s.join("new/deeper")).unwrap();
        fs::write(s.join("new/deeper/f"), vec![5u8; 300_000]).unwrap();
        std::os::unix::fs::symlink("new/deeper/f", s.join("new-link")).unwrap();
    }),
];

/// The file [`rewrite_known`] rewrites, relative to the root.
pub const KNOWN: &str = "with\nnewline and spaces";

/// A change no kind touches: a file rewritten in place with the same size and times (three
/// bytes), so a pass always has a file to copy.
pub fn rewrite_known(src: &Path, bytes: &[u8; 3]) {
    scribble(&src.join(KNOWN), 0, bytes);
}
