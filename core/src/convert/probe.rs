//! The write-rate probe behind a plan's time estimate: a short sample of encrypted writes and
//! file creations on the filesystem being converted.
use super::*;

/// Most bytes the rate probe writes (less when space is short or the tree small), and the most
/// small files it creates.
const PROBE_BYTES: u64 = 16 << 20;
const PROBE_FILES: u64 = 200;
/// The least it writes and creates: below that one sample is mostly noise.
const PROBE_MIN_BYTES: u64 = 2 << 20;
const PROBE_MIN_FILES: u64 = 40;

/// Measures encrypted write speed and per-file cost on the filesystem of `source`, in a
/// temporary directory under its root-only `.dirseal`, encrypted with a throwaway key; everything
/// is removed again. `None` when the probe cannot run (too little space, any error): the summary
/// then has no estimate rather than a made-up one.
///
/// The probe is sized to the tree (an eighth of its data and entries, within limits), so a small
/// conversion does not spend more on measuring than on converting.
pub(crate) fn estimate(source: &Path, census: &Census) -> Option<Estimate> {
    // A quarter of the headroom the copy leaves, whole MiB: the probe never costs the copy space.
    let room = census.space_available.saturating_sub(census.space_needed) / 4;
    let bytes = (census.data / 8).clamp(PROBE_MIN_BYTES, PROBE_BYTES).min(room) >> 20 << 20;
    if bytes < PROBE_MIN_BYTES {
        return None;
    }
    let files = (census.entries / 8).clamp(PROBE_MIN_FILES, PROBE_FILES);
    let mp = fscrypt::mount_point(source).ok()?;
    let base = probe_base(&mp).ok()?;
    let key = crate::secret::MasterKey::random();
    let id = fscrypt::add_key(&mp, &key).ok()?;
    let name = format!("probe.{:016x}", rand::random::<u64>());
    let measured = probe(&base, &name, &mp.join(".dirseal").join(&name), &id, bytes, files);
    remove_probe(&base, &name);
    let _ = fscrypt::remove_key(&mp, &id, false);
    let (write_bytes_per_sec, micros_per_entry) = measured.ok()?;
    let data_secs = census.data as f64 / write_bytes_per_sec as f64;
    let entry_secs = census.entries as f64 * micros_per_entry as f64 / 1e6;
    // Verification reads both copies back, much of it from the page cache: measured at about half
    // the copy's time on this machine's loop ext4.
    Some(Estimate { write_bytes_per_sec, micros_per_entry, seconds: (1.5 * data_secs + entry_secs).ceil() as u64 })
}

/// `<mount>/.dirseal`, opened without following symlinks and made if missing (mode 0700): only a
/// root-owned directory no one else can write is trusted, since root writes into it (a mount
/// root may be world-writable, and a user's `.dirseal` could redirect the probe). Probes of
/// killed runs are removed: their keys are gone, but their entries unlink.
fn probe_base(mp: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let root = rustix::fs::open(mp, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    match rustix::fs::mkdirat(&root, ".dirseal", Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let base = rustix::fs::openat(&root, ".dirseal", flags, Mode::empty())?;
    let st = rustix::fs::fstat(&base)?;
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(std::io::Error::other("the .dirseal directory is not root's alone"));
    }
    for e in rustix::fs::Dir::read_from(&base)?.flatten() {
        if let Some(n) = e.file_name().to_str().ok().filter(|n| n.starts_with("probe.")) {
            remove_probe(&base, n);
        }
    }
    Ok(base)
}

/// Removes a probe directory and its plain files (all it ever holds), fd-relative.
fn remove_probe(base: &OwnedFd, name: &str) {
    use rustix::fs::{AtFlags, Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if let Ok(dir) = rustix::fs::openat(base, name, flags, Mode::empty()) {
        if let Ok(entries) = rustix::fs::Dir::read_from(&dir) {
            for e in entries.flatten() {
                if e.file_name().to_bytes() != b"." && e.file_name().to_bytes() != b".." {
                    let _ = rustix::fs::unlinkat(&dir, e.file_name(), AtFlags::empty());
                }
            }
        }
    }
    let _ = rustix::fs::unlinkat(base, name, AtFlags::REMOVEDIR);
}

/// Writes `bytes` (synced) and `files` small files into a new encrypted directory `name` under
/// `base`: bytes per second and microseconds per file. `path` names it in errors.
///
/// What other writers left dirty is flushed first (a probe right after a large copy otherwise
/// pays for that copy's writeback), and each figure is the better of two half-size samples: a
/// burst of someone else's I/O slows one sample, rarely both.
fn probe(
    base: &OwnedFd,
    name: &str,
    path: &Path,
    id: &KeyIdentifier,
    bytes: u64,
    files: u64,
) -> std::io::Result<(u64, u64)> {
    use rand::RngCore;
    use rustix::fs::{Mode, OFlags};
    use std::io::Write;
    rustix::fs::mkdirat(base, name, Mode::from_raw_mode(0o700))?;
    let dir = rustix::fs::openat(base, name, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW, Mode::empty())?;
    fscrypt::set_policy_fd(dir.as_fd(), path, id).map_err(std::io::Error::other)?;
    let create = |n: &str| -> std::io::Result<std::fs::File> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        Ok(rustix::fs::openat(&dir, n, flags, Mode::from_raw_mode(0o600))?.into())
    };
    rustix::fs::syncfs(&dir)?;
    let mut buf = vec![0u8; 1 << 20];
    rand::thread_rng().fill_bytes(&mut buf);
    let (half, batch) = (bytes / 2, (files / 2).max(1));
    let (mut rate, mut per_entry) = (0u64, u64::MAX);
    for sample in 0..2 {
        let t = std::time::Instant::now();
        let mut f = create(&format!("w{sample}"))?;
        let mut left = half;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
        rate = rate.max((half as f64 / t.elapsed().as_secs_f64().max(1e-6)) as u64);
        let t = std::time::Instant::now();
        for i in 0..batch {
            create(&format!("s{sample}.{i}"))?.write_all(&buf[..4096])?;
        }
        rustix::fs::syncfs(&dir)?;
        per_entry = per_entry.min((t.elapsed().as_micros() as u64 / batch).max(1));
    }
    Ok((rate.max(1), per_entry))
}
