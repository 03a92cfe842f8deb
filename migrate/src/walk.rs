//! A parallel walk of a directory tree, one task per directory. Homes hold their small files in
//! many small directories, so parallel loops over one directory's entries leave the cores idle
//! between directories (and the idle workers spin); one task per directory keeps them busy.
//!
//! A task handles a directory's own entries and spawns a task per subdirectory; a directory is
//! *left* (post-order: directory metadata, rmdir) when every task below it has finished. Only
//! directories with a task running below them hold their handles, and rayon runs the newest
//! task of a thread first, so the open handles stay near depth × threads, not the tree's size.

use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What a walk does in each directory.
pub(crate) trait Visitor: Sync {
    /// A directory as the visitor holds it (its handles, its path for messages).
    type Dir: Send + Sync;
    type Error: Send;

    /// Opens subdirectory `name` of `parent`; `None` skips it (it vanished or is no longer a
    /// directory, which the visitor has dealt with).
    fn enter(&self, parent: &Self::Dir, name: &OsStr) -> Result<Option<Self::Dir>, Self::Error>;

    /// Handles the entries of `dir` that are not directories, and hands the subdirectories to walk
    /// to `subdirs` (in one call or several). Hand them over as soon as they are known, before
    /// the files: other threads walk them meanwhile. (Handed over last, a large file at the top
    /// of a home held back the whole tree, the file counter with it.)
    fn visit(&self, dir: &Self::Dir, subdirs: &mut dyn FnMut(Vec<OsString>)) -> Result<(), Self::Error>;

    /// Runs once everything below `dir` is done (never once the walk has failed).
    fn leave(&self, _parent: Option<&Self::Dir>, _dir: &Self::Dir) -> Result<(), Self::Error> {
        Ok(())
    }
}

struct Node<D> {
    dir: D,
    parent: Option<Arc<Node<D>>>,
    /// Unfinished work at or below this directory: its own visit plus one per child task.
    pending: AtomicUsize,
}

struct Walk<'v, V: Visitor> {
    v: &'v V,
    failed: AtomicBool,
    error: Mutex<Option<V::Error>>,
}

/// Walks the tree below `root` (visited too) on the current rayon pool (run it inside
/// `pool.install` to pick the pool). Returns the first error; once one happened no new
/// directory is started, so the walk stops soon after.
pub(crate) fn walk<V: Visitor>(v: &V, root: V::Dir) -> Result<(), V::Error> {
    let w = Walk { v, failed: AtomicBool::new(false), error: Mutex::new(None) };
    let root = Arc::new(Node { dir: root, parent: None, pending: AtomicUsize::new(1) });
    rayon::in_place_scope(|s| w.run(s, root));
    // A poisoned slot only means a visitor panicked, which the scope has re-raised already.
    match w.error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

impl<'v, V: Visitor> Walk<'v, V> {
    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn fail(&self, e: V::Error) {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        self.failed.store(true, Ordering::Relaxed);
    }

    fn run<'s>(&'s self, s: &rayon::Scope<'s>, node: Arc<Node<V::Dir>>) {
        if !self.failed() {
            // The directory's own visit holds one count of `pending` until it returns, so it is
            // not left while its files are still handled, whatever its subdirectories do.
            let mut spawn = |subdirs: Vec<OsString>| {
                node.pending.fetch_add(subdirs.len(), Ordering::AcqRel);
                for name in subdirs {
                    let parent = Arc::clone(&node);
                    s.spawn(move |s| self.child(s, parent, name));
                }
            };
            if let Err(e) = self.v.visit(&node.dir, &mut spawn) {
                self.fail(e);
            }
        }
        self.done(node);
    }

    fn child<'s>(&'s self, s: &rayon::Scope<'s>, parent: Arc<Node<V::Dir>>, name: OsString) {
        if self.failed() {
            return self.done(parent);
        }
        match self.v.enter(&parent.dir, &name) {
            Ok(Some(dir)) => {
                self.run(s, Arc::new(Node { dir, parent: Some(parent), pending: AtomicUsize::new(1) }));
            }
            Ok(None) => self.done(parent),
            Err(e) => {
                self.fail(e);
                self.done(parent);
            }
        }
    }

    /// One piece of work at or below `node` finished; the last one leaves the directory and
    /// passes the news up.
    fn done(&self, node: Arc<Node<V::Dir>>) {
        let mut node = node;
        loop {
            if node.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
                return;
            }
            if !self.failed() {
                if let Err(e) = self.v.leave(node.parent.as_deref().map(|p| &p.dir), &node.dir) {
                    self.fail(e);
                }
            }
            match node.parent.clone() {
                Some(parent) => node = parent,
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MigrateError;
    use std::path::PathBuf;

    /// Records the order of visits and leaves over a real tree.
    struct Recorder {
        log: Mutex<Vec<(bool, PathBuf)>>,
        fail_at: Option<&'static str>,
        /// The root's visit goes on handling "files" until another directory was visited.
        slow_root: bool,
    }

    impl Visitor for Recorder {
        type Dir = PathBuf;
        type Error = MigrateError;
        fn enter(&self, parent: &PathBuf, name: &OsStr) -> Result<Option<PathBuf>, MigrateError> {
            Ok(Some(parent.join(name)))
        }
        fn visit(&self, dir: &PathBuf, subdirs: &mut dyn FnMut(Vec<OsString>)) -> Result<(), MigrateError> {
            if self.fail_at.is_some_and(|f| dir.ends_with(f)) {
                return Err(MigrateError::Internal("planned failure"));
            }
            self.log.lock().unwrap().push((true, dir.clone()));
            let mut found = Vec::new();
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    found.push(e.file_name());
                }
            }
            subdirs(found);
            if self.slow_root && dir.ends_with("root") {
                // A large file at the top: its copy must not hold back the tree below.
                let t0 = std::time::Instant::now();
                while self.log.lock().unwrap().len() < 2 && t0.elapsed() < std::time::Duration::from_secs(10) {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                self.log.lock().unwrap().push((true, dir.join("root's files done")));
            }
            Ok(())
        }
        fn leave(&self, parent: Option<&PathBuf>, dir: &PathBuf) -> Result<(), MigrateError> {
            assert_eq!(parent.map(PathBuf::as_path), if dir.ends_with("root") { None } else { dir.parent() });
            self.log.lock().unwrap().push((false, dir.clone()));
            Ok(())
        }
    }

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        for a in 0..6 {
            for b in 0..5 {
                std::fs::create_dir_all(root.join(format!("a{a}/b{b}/c"))).unwrap();
            }
        }
        (t, root)
    }

    fn pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap()
    }

    #[test]
    fn every_directory_is_visited_once_and_left_after_everything_below_it() {
        let (_t, root) = tree();
        let r = Recorder { log: Mutex::new(Vec::new()), fail_at: None, slow_root: false };
        pool().install(|| walk(&r, root.clone())).unwrap();
        let log = r.log.into_inner().unwrap();
        // root + 6 + 30 + 30 directories, each visited and left once.
        assert_eq!(log.len(), 2 * 67);
        for (i, (visit, dir)) in log.iter().enumerate() {
            if !*visit {
                // Left after every visit and leave of its descendants.
                for (j, (_, below)) in log.iter().enumerate() {
                    if below != dir && below.starts_with(dir) {
                        assert!(j < i, "{} left before {}", dir.display(), below.display());
                    }
                }
                assert!(log.iter().position(|e| e == &(true, dir.clone())).unwrap() < i);
            }
        }
    }

    /// Issue 24: the file counter stood at 3/3905 while a big file copied. The subdirectories of
    /// a directory are walked by other threads while its own files are handled.
    #[test]
    fn subdirectories_are_walked_while_a_directory_handles_its_files() {
        let (_t, root) = tree();
        let r = Recorder { log: Mutex::new(Vec::new()), fail_at: None, slow_root: true };
        pool().install(|| walk(&r, root.clone())).unwrap();
        let log = r.log.into_inner().unwrap();
        let done = log.iter().position(|(_, d)| d.ends_with("root's files done")).unwrap();
        assert!(
            log[..done].iter().any(|(visit, d)| *visit && *d != root),
            "nothing below the root was walked meanwhile"
        );
    }

    #[test]
    fn a_failure_is_returned_and_nothing_above_it_is_left() {
        let (_t, root) = tree();
        let r = Recorder { log: Mutex::new(Vec::new()), fail_at: Some("a3/b2"), slow_root: false };
        let e = pool().install(|| walk(&r, root.clone())).unwrap_err();
        assert!(matches!(e, MigrateError::Internal("planned failure")), "{e}");
        let log = r.log.into_inner().unwrap();
        for dir in [root.clone(), root.join("a3")] {
            assert!(!log.iter().any(|(visit, d)| !visit && *d == dir), "{} was left", dir.display());
        }
    }
}
