//! Removal of a whole tree, fd-relative and without following symlinks, optionally overwriting
//! file contents first. Used for the old plaintext after the swap, for staging on abort and
//! rollback, and for stale staging entries. Idempotent: a missing tree is already removed.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::flags;
use crate::fsx::{self, Kind, Meta};
use crate::walk::{self, Visitor};

/// Called after each removed entry; an error stops the removal (what is left stays for a later
/// run). Called from several threads.
pub(crate) type OnRemoved<'a> = &'a (dyn Fn(&Meta) -> io::Result<()> + Sync);

/// Removes `name` in `parent`, whatever it is, directories in parallel on the current rayon pool.
/// With `wipe`, regular files whose last link this is are overwritten with zeros and synced
/// before the unlink.
pub(crate) fn remove_tree(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    wipe: bool,
    on_removed: OnRemoved<'_>,
) -> io::Result<()> {
    let Some(m) = fsx::stat_at(parent, name)? else { return Ok(()) };
    if m.kind != Kind::Dir {
        return remove_file(parent, name, &m, wipe, on_removed);
    }
    let fd = match fsx::open_dir(parent, name) {
        Ok(fd) => fd,
        Err(e) if fsx::is_errno(&e, Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    let r = Remover { wipe, on_removed, top: parent };
    walk::walk(&r, Dir { fd, name: name.to_os_string() })
}

struct Remover<'a> {
    wipe: bool,
    on_removed: OnRemoved<'a>,
    /// The directory holding the removed tree's root.
    top: BorrowedFd<'a>,
}

struct Dir {
    fd: OwnedFd,
    name: OsString,
}

impl Visitor for Remover<'_> {
    type Dir = Dir;
    type Error = io::Error;

    fn enter(&self, parent: &Dir, name: &OsStr) -> io::Result<Option<Dir>> {
        match fsx::open_dir(&parent.fd, name) {
            Ok(fd) => Ok(Some(Dir { fd, name: name.to_os_string() })),
            Err(e) if fsx::is_errno(&e, Errno::NOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Hands over the subdirectories the listing names, then removes the non-directories (and
    /// hands over any that turn out to be directories).
    fn visit(&self, d: &Dir, subdirs: &mut dyn FnMut(Vec<OsString>)) -> io::Result<()> {
        // An immutable or append-only directory lets nothing in it go, nor itself: cleared now
        // (an original is disposed of, or a copy that was sealed is given up).
        if fsx::stat_fd(&d.fd)?.sealed != 0 {
            flags::unseal(d.fd.as_fd())?;
        }
        let (mut dirs, mut rest) = (Vec::new(), Vec::new());
        for (n, kind) in fsx::list(&d.fd)? {
            if kind == Some(Kind::Dir) {
                dirs.push(n);
            } else {
                rest.push(n);
            }
        }
        subdirs(dirs);
        let mut late = Vec::new();
        for n in rest {
            match fsx::stat_at(&d.fd, &n)? {
                None => {}
                Some(m) if m.kind == Kind::Dir => late.push(n),
                Some(m) => remove_file(d.fd.as_fd(), &n, &m, self.wipe, self.on_removed)?,
            }
        }
        subdirs(late);
        Ok(())
    }

    fn leave(&self, parent: Option<&Dir>, d: &Dir) -> io::Result<()> {
        let meta = fsx::stat_fd(&d.fd)?;
        let up = parent.map(|p| p.fd.as_fd()).unwrap_or(self.top);
        match fsx::rmdir(up, &d.name) {
            Ok(()) => (self.on_removed)(&meta),
            Err(e) if fsx::is_errno(&e, Errno::NOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A regular file with no other name anywhere: its contents may be overwritten.
fn sole_file(m: &Meta) -> bool {
    m.kind == Kind::File && m.nlink == 1
}

fn remove_file(dir: BorrowedFd<'_>, name: &OsStr, m: &Meta, wipe: bool, on_removed: OnRemoved<'_>) -> io::Result<()> {
    if m.sealed != 0 && m.kind == Kind::File {
        let pfd = fsx::open_path(dir, name)?;
        let fd = fsx::reopen(pfd.as_fd(), OFlags::RDONLY | OFlags::NOATIME)?;
        flags::unseal(fd.as_fd())?;
    }
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
        remove_file(dir.as_fd(), OsStr::new("f"), &stale, true, &|_| Ok(())).unwrap();
        assert!(!f.exists());
        assert_eq!(std::fs::read(&other).unwrap(), b"still needed");
        // With one link, it is wiped before the unlink (seen through a handle kept open).
        let keep = std::fs::File::open(&other).unwrap();
        let m = fsx::stat_at(&dir, OsStr::new("other")).unwrap().unwrap();
        remove_file(dir.as_fd(), OsStr::new("other"), &m, true, &|_| Ok(())).unwrap();
        let mut left = Vec::new();
        std::io::Read::read_to_end(&mut &keep, &mut left).unwrap();
        assert!(left.iter().all(|b| *b == 0), "{left:?}");
    }
}
