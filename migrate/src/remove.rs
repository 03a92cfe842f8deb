//! Removal of a whole tree, fd-relative and without following symlinks, optionally overwriting
//! file contents first. Used for the old plaintext after the swap, for staging on abort and
//! rollback, and for stale staging entries. Idempotent: a missing tree is already removed.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::fsx::{self, Kind, Meta};

struct Frame {
    fd: OwnedFd,
    name: OsString,
    subdirs: Vec<OsString>,
}

/// Removes `name` in `parent`, whatever it is. With `wipe`, regular files whose last link this is
/// are overwritten with zeros and synced before the unlink. `on_removed` runs after each entry; an error
/// from it stops the removal (what is left stays for a later run).
pub(crate) fn remove_tree(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    wipe: bool,
    on_removed: &mut dyn FnMut(&Meta) -> io::Result<()>,
) -> io::Result<()> {
    let Some(m) = fsx::stat_at(parent, name)? else { return Ok(()) };
    if m.kind != Kind::Dir {
        return remove_file(parent, name, &m, wipe, on_removed);
    }
    let fd = fsx::open_dir(parent, name)?;
    let subdirs = clear_files(&fd, wipe, on_removed)?;
    let mut stack = vec![Frame { fd, name: name.to_os_string(), subdirs }];
    while let Some(top) = stack.last_mut() {
        if let Some(sub) = top.subdirs.pop() {
            let fd = match fsx::open_dir(&top.fd, &sub) {
                Ok(fd) => fd,
                Err(e) if fsx::is_errno(&e, Errno::NOENT) => continue,
                Err(e) => return Err(e),
            };
            let subdirs = clear_files(&fd, wipe, on_removed)?;
            stack.push(Frame { fd, name: sub, subdirs });
            continue;
        }
        if let Some(done) = stack.pop() {
            let dir_meta = fsx::stat_fd(&done.fd)?;
            let up = stack.last().map(|f| f.fd.as_fd()).unwrap_or(parent);
            match fsx::rmdir(up, &done.name) {
                Ok(()) => on_removed(&dir_meta)?,
                Err(e) if fsx::is_errno(&e, Errno::NOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Removes the non-directories of `dir`, returning its subdirectories.
fn clear_files(
    dir: &OwnedFd,
    wipe: bool,
    on_removed: &mut dyn FnMut(&Meta) -> io::Result<()>,
) -> io::Result<Vec<OsString>> {
    let mut subdirs = Vec::new();
    for n in fsx::list_names(dir)? {
        match fsx::stat_at(dir, &n)? {
            None => {}
            Some(m) if m.kind == Kind::Dir => subdirs.push(n),
            Some(m) => remove_file(dir.as_fd(), &n, &m, wipe, on_removed)?,
        }
    }
    Ok(subdirs)
}

/// A regular file with no other name anywhere: its contents may be overwritten.
fn sole_file(m: &Meta) -> bool {
    m.kind == Kind::File && m.nlink == 1
}

fn remove_file(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    m: &Meta,
    wipe: bool,
    on_removed: &mut dyn FnMut(&Meta) -> io::Result<()>,
) -> io::Result<()> {
    // Other links (possibly outside the tree) still need the contents. The link count is
    // checked again on the handle that is written: the name may lead to another inode by now.
    if wipe && m.kind == Kind::File && m.nlink == 1 {
        let pfd = fsx::open_path(dir, name)?;
        if sole_file(&fsx::stat_fd(&pfd)?) {
            let wfd = fsx::reopen(pfd.as_fd(), OFlags::WRONLY | OFlags::NOATIME)?;
            if sole_file(&fsx::stat_fd(&wfd)?) {
                fsx::zero_data(wfd.as_fd())?;
            }
        }
    }
    match fsx::unlink(dir, name) {
        Ok(()) => on_removed(m)?,
        Err(e) if fsx::is_errno(&e, Errno::NOENT) => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first look said "one link", but by the time the file is opened its inode has another
    /// name (a link made in between): wiping must not destroy what that name still shows.
    #[test]
    fn wipe_rechecks_the_link_count_on_the_handle_it_writes() {
        let d = tempfile::tempdir().unwrap();
        let (f, other) = (d.path().join("f"), d.path().join("other"));
        std::fs::write(&f, b"still needed").unwrap();
        let dir = fsx::open_dir_path(d.path()).unwrap();
        let stale = fsx::stat_at(&dir, OsStr::new("f")).unwrap().unwrap();
        assert_eq!(stale.nlink, 1);
        std::fs::hard_link(&f, &other).unwrap();
        remove_file(dir.as_fd(), OsStr::new("f"), &stale, true, &mut |_| Ok(())).unwrap();
        assert!(!f.exists());
        assert_eq!(std::fs::read(&other).unwrap(), b"still needed");
        // With one link, it is wiped before the unlink (seen through a handle kept open).
        let keep = std::fs::File::open(&other).unwrap();
        let m = fsx::stat_at(&dir, OsStr::new("other")).unwrap().unwrap();
        remove_file(dir.as_fd(), OsStr::new("other"), &m, true, &mut |_| Ok(())).unwrap();
        let mut left = Vec::new();
        std::io::Read::read_to_end(&mut &keep, &mut left).unwrap();
        assert!(left.iter().all(|b| *b == 0), "{left:?}");
    }
}
