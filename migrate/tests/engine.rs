//! The engine on real loop-mounted ext4 with a host whose staging directory is plain (the
//! engine is generic; encrypted staging is covered by the dirseal CLI tests). Deterministic hooks
//! run at phase starts through `Host::progress`.
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use dirseal_migrate::{self as migrate, Host, HostError, MigrateError, Phase, Progress, Request, State};
use dirseal_testfs::{Options, TestFs};

type Hook = Box<dyn Fn(Phase) + Send + Sync>;

/// Plain staging, real RENAME_EXCHANGE, and a hook called once at the start of each phase.
struct PlainHost {
    hook: Option<Hook>,
    seen: Mutex<Vec<Phase>>,
    stop: AtomicBool,
}

impl PlainHost {
    fn new() -> PlainHost {
        PlainHost { hook: None, seen: Mutex::new(Vec::new()), stop: AtomicBool::new(false) }
    }
    fn with(hook: impl Fn(Phase) + Send + Sync + 'static) -> PlainHost {
        PlainHost { hook: Some(Box::new(hook)), ..PlainHost::new() }
    }
}

impl Host for PlainHost {
    fn prepare_staging(&self, _: &Path) -> Result<String, HostError> {
        Ok("plain".into())
    }
    fn ensure_unlocked(&self, _: &str, _: &Path) -> Result<(), HostError> {
        Ok(())
    }
    fn is_encrypted(&self, _: &Path) -> Result<bool, HostError> {
        Ok(false)
    }
    fn exchange(&self, a: &Path, b: &Path) -> Result<(), HostError> {
        use rustix::fs::{renameat_with, RenameFlags, CWD};
        renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(|e| HostError(e.to_string()))
    }
    fn trim(&self, _: &Path) -> Result<(), HostError> {
        Ok(())
    }
    fn progress(&self, p: &Progress) {
        let mut seen = self.seen.lock().unwrap();
        if !seen.contains(&p.phase) {
            seen.push(p.phase);
            drop(seen);
            if let Some(h) = &self.hook {
                h(p.phase);
            }
        }
    }
    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

fn req<'a>(src: &'a Path, wd: &'a Path) -> Request<'a> {
    Request { source: src, workdir: wd, keep_backup: false, wipe: false, force: false, threads: 2 }
}

fn run(cmd: &str, args: &[&str]) {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Every kind of entry a home can hold, owned by assorted uids.
fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("a/plain.txt"), b"hello").unwrap();
    fs::write(root.join("a/b/c/deep.bin"), (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect::<Vec<u8>>()).unwrap();
    // Sparse: data at 0, 5 MiB and the end of a 12 MiB file.
    {
        use std::os::unix::fs::FileExt;
        let f = fs::File::create(root.join("sparse.img")).unwrap();
        f.write_all_at(&[1u8; 4096], 0).unwrap();
        f.write_all_at(&[2u8; 8192], 5 << 20).unwrap();
        f.set_len(12 << 20).unwrap();
        f.write_all_at(&[3u8; 100], (12 << 20) - 100).unwrap();
    }
    // Hard links across directories.
    fs::write(root.join("a/linked"), b"one inode").unwrap();
    fs::hard_link(root.join("a/linked"), root.join("a/b/linked-too")).unwrap();
    fs::hard_link(root.join("a/linked"), root.join("linked-three")).unwrap();
    // Symlinks: relative, absolute and dangling, a loop; never followed.
    std::os::unix::fs::symlink("a/plain.txt", root.join("rel-link")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", root.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("nowhere/at/all", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("loop2", root.join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", root.join("loop2")).unwrap();
    // Special files.
    run("mkfifo", &[p(&root.join("fifo"))]);
    let sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    drop(sock);
    run("mknod", &[p(&root.join("null-dev")), "c", "1", "3"]);
    run("mknod", &[p(&root.join("blk-dev")), "b", "7", "200"]);
    // Names: 255 bytes, not UTF-8, with newline and spaces.
    fs::write(root.join("n".repeat(255)), b"long name").unwrap();
    fs::write(root.join(OsStr::from_bytes(b"bad-\xff\xfe-utf8")), b"bytes").unwrap();
    fs::write(root.join("with\nnewline and spaces"), b"odd").unwrap();
    // Modes: setuid, setgid, sticky, no permissions at all.
    fs::write(root.join("suid"), b"#!/bin/sh\n").unwrap();
    fs::write(root.join("nothing"), b"secret").unwrap();
    fs::create_dir(root.join("sticky")).unwrap();
    // Xattrs: user, trusted, and POSIX ACLs (access and default).
    run("setfattr", &["-n", "user.color", "-v", "blue", p(&root.join("a/plain.txt"))]);
    run("setfattr", &["-n", "trusted.secret", "-v", "0x00ff10", p(&root.join("a/plain.txt"))]);
    run("setfattr", &["-n", "user.dir", "-v", "yes", p(&root.join("a/b"))]);
    run("setfacl", &["-m", "u:250001:r--", p(&root.join("a/plain.txt"))]);
    run("setfacl", &["-d", "-m", "u:250002:rwx", p(&root.join("a"))]);
    // Owners, then modes (chown clears setuid).
    run("chown", &["-hR", "250010:250011", p(root)]);
    run("chown", &["-h", "250020:250021", p(&root.join("rel-link"))]);
    run("chown", &["250030:0", p(&root.join("a/b/c/deep.bin"))]);
    fs::set_permissions(root.join("suid"), fs::Permissions::from_mode(0o6755)).unwrap();
    fs::set_permissions(root.join("nothing"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::set_permissions(root.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    // Nanosecond times, on files and directories (after their children were made).
    for (i, rel) in ["a/plain.txt", "a/b", "a", "sparse.img", "fifo", "empty", ""].iter().enumerate() {
        let t = rustix::fs::Timespec { tv_sec: 1_600_000_000 + i as i64, tv_nsec: 123_456_789 + i as i64 };
        let ts = rustix::fs::Timestamps { last_access: t, last_modification: t };
        rustix::fs::utimensat(rustix::fs::CWD, root.join(rel), &ts, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).unwrap();
    }
}

/// Everything about a tree except atimes (reading the source updates them).
fn manifest(root: &Path) -> BTreeMap<Vec<u8>, String> {
    let mut m = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        for n in names {
            let r = rel.join(&n);
            let path = root.join(&r);
            let md = fs::symlink_metadata(&path).unwrap();
            let ft = md.file_type();
            let mut desc = format!(
                "mode={:o} uid={} gid={} mtime={}.{} rdev={} ",
                md.mode(),
                md.uid(),
                md.gid(),
                md.mtime(),
                md.mtime_nsec(),
                md.rdev()
            );
            if ft.is_symlink() {
                desc += &format!("link->{:?}", fs::read_link(&path).unwrap());
            } else if ft.is_dir() {
                desc += "dir";
                stack.push(r.clone());
            } else if ft.is_file() {
                use sha2::Digest;
                let data = fs::read(&path).unwrap();
                desc += &format!(
                    "file size={} sha={} data={:?}",
                    md.len(),
                    hex::encode(sha2::Sha256::digest(&data)),
                    segments(&path)
                );
                if md.nlink() > 1 {
                    inodes.entry(md.ino()).or_default().push(r.as_os_str().as_bytes().to_vec());
                }
            } else {
                desc += &format!("special {:?}", ft);
            }
            if !ft.is_symlink() {
                desc += &format!(" xattrs={:?}", xattrs(&path));
            }
            m.insert(r.as_os_str().as_bytes().to_vec(), desc);
        }
    }
    for group in inodes.values() {
        for name in group {
            let e = m.get_mut(name).unwrap();
            *e += &format!(" linkgroup={group:?}");
        }
    }
    let rootmd = fs::metadata(root).unwrap();
    m.insert(
        b".".to_vec(),
        format!("mode={:o} uid={} mtime={}.{}", rootmd.mode(), rootmd.uid(), rootmd.mtime(), rootmd.mtime_nsec()),
    );
    m
}

fn xattrs(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names = vec![0u8; 4096];
    let n = rustix::fs::llistxattr(path, &mut names).unwrap();
    let mut out: Vec<(String, Vec<u8>)> = names[..n]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|name| {
            let name = String::from_utf8_lossy(name).into_owned();
            let mut v = vec![0u8; 4096];
            let len = rustix::fs::lgetxattr(path, name.as_str(), &mut v).unwrap();
            v.truncate(len);
            (name, v)
        })
        .collect();
    out.sort();
    out
}

/// Data segments of a file (SEEK_DATA/SEEK_HOLE), in 4 KiB units.
fn segments(path: &Path) -> Vec<(u64, u64)> {
    use rustix::fs::{seek, SeekFrom};
    let f = fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < len {
        let Ok(start) = seek(&f, SeekFrom::Data(at)) else { break };
        let end = seek(&f, SeekFrom::Hole(start)).unwrap();
        out.push((start / 4096, end.div_ceil(4096)));
        at = end;
    }
    out
}

struct Case {
    fs: TestFs,
    src: PathBuf,
    wd: PathBuf,
}

impl Case {
    fn new(opts: Options) -> Case {
        let fs = TestFs::with(opts);
        let src = fs.path().join("home");
        let wd = fs.path().join(".work/conv");
        Case { fs, src, wd }
    }
}

#[test]
fn every_kind_of_entry_survives_exactly() {
    let c = Case::new(Options::default());
    build_tree(&c.src);
    let before = manifest(&c.src);
    let out = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Done);
    let after = manifest(&c.src);
    for (k, v) in &before {
        assert_eq!(after.get(k), Some(v), "entry {:?}", String::from_utf8_lossy(k));
    }
    assert_eq!(after, before);
    let _ = &c.fs;
}

#[test]
fn a_file_changed_before_verification_is_recopied() {
    let c = Case::new(Options::default());
    build_tree(&c.src);
    let target = c.src.join("a/plain.txt");
    let t2 = target.clone();
    let host = PlainHost::with(move |phase| {
        if phase == Phase::Verifying {
            fs::write(&t2, b"changed while the copy was being verified").unwrap();
        }
    });
    let out = migrate::convert(&req(&c.src, &c.wd), &host).unwrap();
    assert_eq!(out.state, State::Done);
    assert_eq!(fs::read(&target).unwrap(), b"changed while the copy was being verified");
}

#[test]
fn out_of_space_mid_copy_keeps_the_source_and_resumes() {
    let c = Case::new(Options { size_mib: 96, ..Default::default() });
    fs::create_dir(&c.src).unwrap();
    for i in 0..20 {
        fs::write(c.src.join(format!("f{i}")), vec![i as u8; 1 << 20]).unwrap();
    }
    let before = manifest(&c.src);
    let filler = c.fs.path().join("filler");
    let f2 = filler.clone();
    // Preflight sees room; then something else eats the space as the copy starts.
    let host = PlainHost::with(move |phase| {
        if phase == Phase::Copying {
            let vfs = rustix::fs::statvfs(f2.parent().unwrap()).unwrap();
            let free = vfs.f_bavail * vfs.f_frsize;
            let f = fs::File::create(&f2).unwrap();
            rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, free - (2 << 20)).unwrap();
        }
    });
    let err = migrate::convert(&req(&c.src, &c.wd), &host).unwrap_err();
    assert!(matches!(err, MigrateError::OutOfSpace { .. }), "{err:?}");
    assert!(err.to_string().contains("free some space"), "{err}");
    assert_eq!(manifest(&c.src), before, "the source must be untouched");
    fs::remove_file(&filler).unwrap();
    let out = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Done);
    assert_eq!(manifest(&c.src), before);
}

#[test]
fn preflight_refusals_change_nothing() {
    let c = Case::new(Options { size_mib: 64, inodes: Some(4096), ..Default::default() });
    let host = PlainHost::new();
    // Filesystem root.
    let e = migrate::preflight(&req(c.fs.path(), &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::FilesystemRoot { .. }), "{e:?}");
    // Not enough space: a 40 MiB file cannot be copied next to itself on 64 MiB.
    let big = c.fs.path().join("big");
    fs::create_dir(&big).unwrap();
    let f = fs::File::create(big.join("data")).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 40 << 20).unwrap();
    let e = migrate::preflight(&req(&big, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::NoSpace { .. }), "{e:?}");
    assert!(e.to_string().contains("free some space"), "{e}");
    fs::remove_dir_all(&big).unwrap();
    // Not enough inodes.
    let many = c.fs.path().join("many");
    fs::create_dir(&many).unwrap();
    let vfs = rustix::fs::statvfs(c.fs.path()).unwrap();
    for i in 0..(vfs.f_favail * 2 / 3) {
        fs::write(many.join(i.to_string()), b"").unwrap();
    }
    let e = migrate::preflight(&req(&many, &c.wd), &host).unwrap_err();
    assert!(matches!(e, MigrateError::NoInodes { .. }), "{e:?}");
    fs::remove_dir_all(&many).unwrap();
    // A mount point inside the tree.
    fs::create_dir_all(c.src.join("mnt")).unwrap();
    run("mount", &["-t", "tmpfs", "none", p(&c.src.join("mnt"))]);
    let e = migrate::preflight(&req(&c.src, &c.wd), &host);
    run("umount", &[p(&c.src.join("mnt"))]);
    let e = e.unwrap_err();
    assert!(matches!(e, MigrateError::MountPointInside { .. }), "{e:?}");
    // In use: a process with its working directory inside.
    let mut child = std::process::Command::new("sh")
        .args(["-c", "read _"])
        .current_dir(&c.src)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let e = migrate::preflight(&req(&c.src, &c.wd), &host);
    drop(child.stdin.take());
    child.wait().unwrap();
    let e = e.unwrap_err();
    assert!(matches!(e, MigrateError::InUse { .. }), "{e:?}");
    assert!(e.to_string().contains(&format!("pid {}", child.id())), "{e}");
    // --force skips only that check.
    let mut r = req(&c.src, &c.wd);
    r.force = true;
    migrate::preflight(&r, &host).unwrap();
    assert!(!c.wd.exists(), "preflight must write nothing");
}

#[test]
fn a_second_converter_is_refused_while_the_first_runs() {
    let c = Case::new(Options::default());
    build_tree(&c.src);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let started_tx = Mutex::new(started_tx);
    let host = PlainHost::with(move |phase| {
        if phase == Phase::Copying {
            started_tx.lock().unwrap().send(()).unwrap();
            rx.lock().unwrap().recv().unwrap();
        }
    });
    std::thread::scope(|s| {
        let first = s.spawn(|| migrate::convert(&req(&c.src, &c.wd), &host));
        started_rx.recv().unwrap();
        let e = migrate::convert(&req(&c.src, &c.wd), &PlainHost::new()).unwrap_err();
        assert!(matches!(e, MigrateError::Busy { .. }), "{e:?}");
        tx.send(()).unwrap();
        assert_eq!(first.join().unwrap().unwrap().state, State::Done);
    });
}

#[test]
fn interrupt_then_resume_keeps_backup_then_rollback() {
    let c = Case::new(Options::default());
    build_tree(&c.src);
    let before = manifest(&c.src);
    let host = PlainHost::new();
    host.stop.store(true, Ordering::Relaxed);
    let mut r = req(&c.src, &c.wd);
    r.keep_backup = true;
    let e = migrate::convert(&r, &host).unwrap_err();
    assert!(matches!(e, MigrateError::Interrupted { .. }), "{e:?}");
    assert!(e.to_string().contains("run the same command again"), "{e}");
    let out = migrate::convert(&r, &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Swapped);
    assert!(out.backup.is_some());
    assert_eq!(manifest(&c.src), before);
    let out = migrate::rollback(&c.wd, &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::RolledBack);
    assert_eq!(manifest(&c.src), before);
}

#[test]
fn wipe_overwrites_and_reports_its_limits() {
    let c = Case::new(Options::default());
    fs::create_dir(&c.src).unwrap();
    fs::write(c.src.join("secret"), b"plaintext that must go").unwrap();
    let mut r = req(&c.src, &c.wd);
    r.wipe = true;
    let out = migrate::convert(&r, &PlainHost::new()).unwrap();
    assert_eq!(out.state, State::Done);
    assert!(out.notes.iter().any(|n| n.contains("SSD") || n.contains("flash")), "{:?}", out.notes);
    assert_eq!(fs::read(c.src.join("secret")).unwrap(), b"plaintext that must go");
}

#[test]
fn a_corrupt_journal_is_named() {
    let c = Case::new(Options::default());
    build_tree(&c.src);
    let mut r = req(&c.src, &c.wd);
    r.keep_backup = true;
    migrate::convert(&r, &PlainHost::new()).unwrap();
    let journal = c.wd.join("journal.json");
    fs::write(&journal, b"{ not json").unwrap();
    let e = migrate::status(&c.wd).unwrap_err();
    assert!(matches!(e, MigrateError::CorruptJournal { .. }), "{e:?}");
    assert!(e.to_string().contains("journal.json"), "{e}");
    let e = migrate::convert(&r, &PlainHost::new()).unwrap_err();
    assert!(matches!(e, MigrateError::CorruptJournal { .. }), "{e:?}");
}

#[test]
fn a_hostile_tree_cannot_make_root_follow_a_symlink() {
    let c = Case::new(Options::default());
    fs::create_dir_all(c.src.join("docs/inner")).unwrap();
    fs::write(c.src.join("docs/inner/note"), b"mine").unwrap();
    fs::write(c.src.join("docs/f"), b"x").unwrap();
    // Outside the tree: what a hostile user would like root to copy (or overwrite).
    let outside = c.fs.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"root only").unwrap();
    let src = c.src.clone();
    let out2 = outside.clone();
    // As the copy starts, the user swaps a directory for a symlink to the outside.
    let host = PlainHost::with(move |phase| {
        if phase == Phase::Copying {
            fs::remove_dir_all(src.join("docs/inner")).unwrap();
            std::os::unix::fs::symlink(&out2, src.join("docs/inner")).unwrap();
        }
    });
    let out = migrate::convert(&req(&c.src, &c.wd), &host);
    // Whatever the engine decides (copy the link as a link, or refuse), it never follows it.
    if let Ok(o) = &out {
        assert_eq!(o.state, State::Done);
        let m = fs::symlink_metadata(c.src.join("docs/inner")).unwrap();
        assert!(m.file_type().is_symlink(), "the swapped-in symlink must be copied as a symlink");
    }
    // Disposing of the old tree (which held the symlink) must not have followed it either.
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"root only");
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 1, "nothing may be written outside the tree");
}
