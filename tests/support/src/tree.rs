//! Snapshots of a tree, for "nothing changed" checks: [`manifest`] (everything a conversion must
//! preserve) and [`contents`] (just the files' bytes), both read without disturbing access times.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// Relative paths of every entry below `root` (not following symlinks).
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for name in list(&root.join(&rel)) {
            let r = rel.join(&name);
            if fs::symlink_metadata(root.join(&r)).unwrap().is_dir() {
                stack.push(r.clone());
            }
            out.push(r);
        }
    }
    out
}

fn open_noatime(path: &Path, dir: bool) -> OwnedFd {
    let flags = OFlags::RDONLY | OFlags::NOATIME | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let flags = if dir { flags | OFlags::DIRECTORY } else { flags };
    rustix::fs::open(path, flags, Mode::empty()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Sorted names in a directory, listed without updating its access time.
fn list(dir: &Path) -> Vec<OsString> {
    let mut d = rustix::fs::Dir::new(open_noatime(dir, true)).unwrap();
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let n = e.unwrap().file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            out.push(OsString::from_vec(n));
        }
    }
    out.sort();
    out
}

/// Everything the conversion must preserve, one line per entry, keyed by the entry's path bytes
/// ("." is the root itself): type, mode (with setuid/setgid/sticky), owner, size, atime and
/// mtime in ns (atime not for symlinks: reading a link updates it), device number, symlink target,
/// content hash, data/hole layout, every xattr (ACLs, trusted.*, security.*) and hard-link group.
/// Nothing is read in a way that changes an atime.
pub fn manifest(root: &Path) -> BTreeMap<Vec<u8>, String> {
    manifest_of(root, true)
}

/// [`manifest`] of the entries below the root, without access times: for checks through a front
/// end, which reads the tree in between (listing a locked directory) and adds attributes to the
/// root (a recovery blob).
pub fn entries_manifest(root: &Path) -> BTreeMap<Vec<u8>, String> {
    let mut m = manifest_of(root, false);
    m.remove(&b"."[..]);
    m
}

fn manifest_of(root: &Path, atimes: bool) -> BTreeMap<Vec<u8>, String> {
    use sha2::Digest;
    let mut m = BTreeMap::new();
    let mut groups: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    let mut rels = walk(root);
    rels.push(PathBuf::from("."));
    for rel in rels {
        let path = if rel == Path::new(".") { root.to_path_buf() } else { root.join(&rel) };
        let md = fs::symlink_metadata(&path).unwrap();
        let ft = md.file_type();
        let key = rel.as_os_str().as_bytes().to_vec();
        let mut d = format!(
            "mode={:o} uid={} gid={} mtime={}.{:09}",
            md.mode(),
            md.uid(),
            md.gid(),
            md.mtime(),
            md.mtime_nsec()
        );
        if atimes && !ft.is_symlink() {
            write!(d, " atime={}.{:09}", md.atime(), md.atime_nsec()).unwrap();
        }
        if ft.is_symlink() {
            let t = fs::read_link(&path).unwrap();
            write!(d, " symlink->{}", hex::encode(t.as_os_str().as_bytes())).unwrap();
        } else if ft.is_file() {
            let mut data = Vec::new();
            fs::File::from(open_noatime(&path, false)).read_to_end(&mut data).unwrap();
            write!(
                d,
                " file size={} sha256={} data={:?}",
                md.len(),
                hex::encode(sha2::Sha256::digest(&data)),
                segments(&path)
            )
            .unwrap();
        } else if ft.is_dir() {
            d += " dir";
        } else {
            write!(d, " special {ft:?} rdev={}", md.rdev()).unwrap();
        }
        write!(d, " xattrs={:?}", xattrs(&path)).unwrap();
        if !ft.is_dir() && md.nlink() > 1 {
            groups.entry(md.ino()).or_default().push(key.clone());
            write!(d, " nlink={}", md.nlink()).unwrap();
        }
        m.insert(key, d);
    }
    for group in groups.values() {
        let names: Vec<String> = group.iter().map(|n| String::from_utf8_lossy(n).into_owned()).collect();
        for name in group {
            write!(m.get_mut(name).unwrap(), " linkgroup={names:?}").unwrap();
        }
    }
    m
}

/// Asserts two manifests are equal, naming the first entry that differs.
#[track_caller]
pub fn assert_same(after: &BTreeMap<Vec<u8>, String>, before: &BTreeMap<Vec<u8>, String>, what: &str) {
    for (k, v) in before {
        assert_eq!(after.get(k), Some(v), "{what}: entry {:?}", String::from_utf8_lossy(k));
    }
    for k in after.keys() {
        assert!(before.contains_key(k), "{what}: extra entry {:?}", String::from_utf8_lossy(k));
    }
}

fn xattrs(path: &Path) -> Vec<(String, String)> {
    use sha2::Digest;
    let mut names = vec![0u8; 65536];
    let n = rustix::fs::llistxattr(path, &mut names[..]).unwrap();
    let mut out: Vec<(String, String)> = names[..n]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|name| {
            let name = OsStr::from_bytes(name);
            let mut v = vec![0u8; 65536];
            let len = rustix::fs::lgetxattr(path, name, &mut v[..]).unwrap();
            let v = &v[..len];
            let shown = if len > 64 {
                format!("{len} bytes sha256={}", hex::encode(sha2::Sha256::digest(v)))
            } else {
                hex::encode(v)
            };
            (name.to_string_lossy().into_owned(), shown)
        })
        .collect();
    out.sort();
    out
}

/// Data segments of a file (SEEK_DATA/SEEK_HOLE), in 4 KiB blocks.
fn segments(path: &Path) -> Vec<(u64, u64)> {
    use rustix::fs::{seek, SeekFrom};
    let f = open_noatime(path, false);
    let len = fs::File::from(f.try_clone().unwrap()).metadata().unwrap().len();
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

/// Every regular file below `dir` (relative path, bytes), sorted; `dir` itself (empty path) when
/// it is a file; empty when it does not exist. For "these files did not change" checks where
/// times may legitimately move.
pub fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let read = |path: &Path| {
        let mut data = Vec::new();
        fs::File::from(open_noatime(path, false)).read_to_end(&mut data).unwrap();
        data
    };
    match fs::symlink_metadata(dir) {
        Err(_) => return Vec::new(),
        Ok(m) if m.is_file() => return vec![(PathBuf::new(), read(dir))],
        Ok(_) => {}
    }
    let mut out: Vec<_> = walk(dir)
        .into_iter()
        .filter(|rel| fs::symlink_metadata(dir.join(rel)).unwrap().is_file())
        .map(|rel| {
            let data = read(&dir.join(&rel));
            (rel, data)
        })
        .collect();
    out.sort();
    out
}
