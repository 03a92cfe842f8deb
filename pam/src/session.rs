//! Per-user session counts in a root-only run directory, so the home is locked only when the
//! user's last session ends.
use std::io::{Read, Seek, Write};
use std::path::Path;

/// Adds `delta` to the count of `uid` (never below zero) and returns the new count.
pub fn adjust(rundir: &Path, uid: u32, delta: i64) -> Result<u64, String> {
    dirseal::securefile::ensure_private_dir(rundir).map_err(|e| e.to_string())?;
    let path = rundir.join(format!("{uid}.sessions"));
    let mut f = dirseal::securefile::lock_file(&path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    (&mut *f).take(64).read_to_string(&mut text).map_err(|e| e.to_string())?;
    let current: u64 = text.trim().parse().unwrap_or(0);
    let next =
        if delta < 0 { current.saturating_sub(delta.unsigned_abs()) } else { current.saturating_add(delta as u64) };
    f.set_len(0).map_err(|e| e.to_string())?;
    f.rewind().map_err(|e| e.to_string())?;
    write!(&mut *f, "{next}").map_err(|e| e.to_string())?;
    f.sync_all().map_err(|e| e.to_string())?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_up_and_down_never_below_zero() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        assert_eq!(super::adjust(&run, 4242, 1).unwrap(), 1);
        assert_eq!(super::adjust(&run, 4242, 1).unwrap(), 2);
        assert_eq!(super::adjust(&run, 4243, 1).unwrap(), 1);
        assert_eq!(super::adjust(&run, 4242, -1).unwrap(), 1);
        assert_eq!(super::adjust(&run, 4242, -1).unwrap(), 0);
        assert_eq!(super::adjust(&run, 4242, -1).unwrap(), 0);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o7777, 0o700);
        assert_eq!(std::fs::metadata(run.join("4242.sessions")).unwrap().permissions().mode() & 0o7777, 0o600);
    }

    #[test]
    fn symlinks_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        // A symlinked run directory.
        let link = d.path().join("run-link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(super::adjust(&link, 4242, 1).is_err());
        // A symlinked counter inside a good run directory.
        let run = d.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::os::unix::fs::symlink(target.join("victim"), run.join("4242.sessions")).unwrap();
        assert!(super::adjust(&run, 4242, 1).is_err());
        assert!(!target.join("victim").exists(), "nothing may be created through the link");
    }

    #[test]
    fn a_world_writable_run_directory_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(super::adjust(&run, 4242, 1).is_err());
    }
}
