//! Overwriting a filesystem's free space, so that plaintext left in free blocks (files deleted
//! before a conversion, the old copy a conversion released) cannot be read back from the device.
//!
//! A fill file of fresh random data grows in bounded chunks until the space left to ordinary
//! programs falls to a safety reserve, checked before every chunk, so other programs keep working;
//! it is synced and released, and then `FITRIM` tells the device which blocks are free.
//!
//! The fill file is an unnamed `O_TMPFILE`: whatever ends the process (an error, a signal, even
//! SIGKILL) its space returns to the filesystem when the descriptor closes, or at the next mount
//! after a crash (the filesystem's orphan list), and no name is ever left behind.
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use rand::{RngCore, SeedableRng};
use serde::Serialize;

use crate::fscrypt::{self, FscryptError};
use crate::ui::Progress;

/// Bytes written per step: the unit of free-space checks and of stopping.
const CHUNK: u64 = 1 << 20;
/// Bytes between syncs: bounds the dirty page cache (the rest of the system keeps its cache) and
/// keeps progress honest about what reached the device.
const SYNC_EVERY: u64 = 64 << 20;
const MIB: u64 = 1 << 20;

/// Why a scrub could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    /// Finding the filesystem (mount table) failed.
    #[error(transparent)]
    Fscrypt(#[from] FscryptError),
    /// The filesystem is mounted read-only.
    #[error("the filesystem at {mount_point} is mounted read-only; its free space cannot be overwritten")]
    ReadOnly {
        /// Its mount point.
        mount_point: PathBuf,
    },
    /// An unfinished conversion on the filesystem still needs its free space or old plaintext.
    #[error("the conversion of {source_dir} on {mount_point} is not finished ({state}): it needs the free space, or keeps the old plaintext on purpose; finish it (or abort or roll it back), then scrub")]
    Converting {
        /// The filesystem's mount point.
        mount_point: PathBuf,
        /// The directory being converted.
        source_dir: PathBuf,
        /// Where the conversion stopped, in the engine's words.
        state: String,
    },
    /// Any other I/O error.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// The path the operation was on.
        path: PathBuf,
        /// What was attempted, as a verb for the message.
        op: &'static str,
        /// The underlying error.
        source: io::Error,
    },
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> ScrubError + 'a {
    move |source| match source.raw_os_error() {
        Some(libc::EROFS) => ScrubError::ReadOnly { mount_point: path.to_path_buf() },
        _ => ScrubError::Io { path: path.to_path_buf(), op, source },
    }
}

/// How to scrub (the defaults suit every front end).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Free space (as ordinary programs see it) never to fill; `None`: 1% of the filesystem, at
    /// least 16 MiB and at most 1 GiB.
    pub reserve: Option<u64>,
    /// Skip `FITRIM` after the overwrite.
    pub no_trim: bool,
}

/// 1% of the filesystem, at least 16 MiB and at most 1 GiB: room for logs, caches and a running
/// game while the disk is otherwise full.
pub(crate) fn default_reserve(fs_size: u64) -> u64 {
    (fs_size / 100).clamp(16 * MIB, 1024 * MIB)
}

/// What kind of storage holds the filesystem, as the kernel reports it: it decides what an
/// overwrite reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Medium {
    /// A spinning disk: a block written is the block that held the old data.
    Rotational,
    /// Flash (SSD, NVMe, eMMC, SD): the controller writes elsewhere and remaps.
    SolidState,
    /// A loop device: what reaches a disk depends on the filesystem holding its backing file.
    Loop,
    /// The kernel does not say (no block device found for the filesystem).
    Unknown,
}

/// The result of `FITRIM`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "result")]
pub enum Trim {
    /// The filesystem passed its free blocks to the device as discards (`bytes` as it counts them).
    Done {
        /// Bytes discarded.
        bytes: u64,
    },
    /// The device (or the filesystem) does not support discard.
    Unsupported,
    /// Not attempted: asked not to, or the overwrite was interrupted.
    Skipped,
    /// `FITRIM` returned an error.
    Failed {
        /// The error.
        reason: String,
    },
}

/// What a scrub did, for the front end to report (and print as JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The filesystem scrubbed.
    pub mount_point: PathBuf,
    /// Its type (ext4, f2fs, …) from the mount table.
    pub fstype: String,
    /// Its device from the mount table.
    pub device: String,
    /// What kind of storage holds it: decides what the overwrite reaches.
    pub medium: Medium,
    /// Size of the filesystem.
    pub(crate) size: u64,
    /// Free space to ordinary programs before the overwrite.
    pub(crate) available_before: u64,
    /// ... and after the fill file was released: the space is back.
    pub available_after: u64,
    /// The safety reserve kept for other programs.
    pub reserve: u64,
    /// Free blocks only root may use (ext4's reserved blocks): left unwritten too, since filling
    /// them first takes all space from ordinary programs.
    pub root_reserved: u64,
    /// All free space before the scrub, root's reserved blocks included.
    pub free_before: u64,
    /// Distinct free space overwritten for certain: what the fill held at once, at its peak.
    pub covered: u64,
    /// Random data written and synced to the device, the sweep's included: more than `covered`
    /// (and possibly more than the free space), since the sweep writes into space it released.
    pub written: u64,
    /// Free space the fill never held: what stayed free at its peak. The sweep then wrote
    /// `swept` more bytes into free space beyond the fill's end, which usually covers much of it
    /// (the kernel, not dirseal, picks the blocks).
    pub unwritten: u64,
    /// Bytes the sweep wrote (part of `written`).
    pub swept: u64,
    /// What `FITRIM` did after the overwrite.
    pub trim: Trim,
    /// Stopped by a signal: the fill file was released, nothing was trimmed.
    pub interrupted: bool,
    /// Why the fill stopped before the reserve, if it did.
    pub stopped_early: Option<String>,
}

/// Free space as ordinary programs see it, all free space, and the filesystem's size, in bytes.
struct Space {
    available: u64,
    free: u64,
    size: u64,
    block: u64,
}

fn space(f: &impl AsFd, path: &Path) -> Result<Space, ScrubError> {
    let v = rustix::fs::fstatvfs(f).map_err(|e| io_err(path, "check the free space of")(e.into()))?;
    Ok(Space {
        available: v.f_bavail.saturating_mul(v.f_frsize),
        free: v.f_bfree.saturating_mul(v.f_frsize),
        size: v.f_blocks.saturating_mul(v.f_frsize),
        block: v.f_frsize.max(1),
    })
}

/// Refuses while a conversion on this filesystem is unfinished: its copy needs the free space.
fn check_no_conversion(mount_point: &Path) -> Result<(), ScrubError> {
    match crate::convert::recorded_on(mount_point).into_iter().find(|v| !v.state.is_final()) {
        Some(v) => Err(ScrubError::Converting {
            mount_point: mount_point.to_path_buf(),
            source_dir: v.source,
            state: v.state.to_string(),
        }),
        None => Ok(()),
    }
}

/// The storage kind of block device `major:minor` from sysfs (a partition's queue is its disk's).
fn medium(major: u64, minor: u64) -> Medium {
    let dev = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if dev.join("loop").exists() {
        return Medium::Loop;
    }
    for q in [dev.join("queue/rotational"), dev.join("../queue/rotational")] {
        match std::fs::read_to_string(q).as_deref().map(str::trim) {
            Ok("1") => return Medium::Rotational,
            Ok("0") => return Medium::SolidState,
            _ => {}
        }
    }
    Medium::Unknown
}

/// An unnamed file on the filesystem at `mount_point` (readable by root only, though it never has a
/// name to open it by). Filesystems without `O_TMPFILE` get a fresh name that is removed at once.
fn fill_file(mount_point: &Path) -> Result<File, ScrubError> {
    let mut o = OpenOptions::new();
    o.write(true).mode(0o600);
    match o.clone().custom_flags(libc::O_TMPFILE | libc::O_NOFOLLOW).open(mount_point) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {}
        r => return r.map_err(io_err(mount_point, "create a fill file on")),
    }
    let name = mount_point.join(format!(".dirseal-scrub.{:016x}", rand::random::<u64>()));
    let f = o.create_new(true).custom_flags(libc::O_NOFOLLOW).open(&name).map_err(io_err(&name, "create"))?;
    std::fs::remove_file(&name).map_err(io_err(&name, "remove"))?;
    Ok(f)
}

/// Overwrites the free space of the filesystem holding `path` with random data, keeping `reserve`
/// free for other programs, then releases it and trims. `stop` is checked before every chunk;
/// progress phases are "filling", "syncing" and "trimming".
pub fn scrub(
    path: &Path,
    opts: &Options,
    stop: &AtomicBool,
    on_progress: &(dyn Fn(&Progress) + Sync),
) -> Result<Report, ScrubError> {
    let m = fscrypt::mount_entry(path)?;
    let mp = m.mount_point.clone();
    check_no_conversion(&mp)?;
    let file = fill_file(&mp)?;
    let start = space(&file, &mp)?;
    let reserve = opts.reserve.unwrap_or_else(|| default_reserve(start.size));
    let progress = |phase: &str, done: u64, total: u64| {
        on_progress(&Progress { phase: phase.into(), bytes_done: done, bytes_total: total, ..Default::default() })
    };

    let mut fill = Fill {
        file,
        mp: &mp,
        // Fresh random data: a repeated pattern could be compressed or deduplicated by the device,
        // so fewer cells would be overwritten than the filesystem counts.
        rng: rand::rngs::StdRng::from_entropy(),
        buf: vec![0u8; CHUNK as usize],
        reserve,
        stop,
        end: 0,
        head: 0,
        since_sync: 0,
        allocate: true,
        written: 0,
        interrupted: false,
        stopped_early: None,
    };
    // Filling: grow the file until only the reserve is left.
    let mut peak_free = start.free;
    while let Some(room) = fill.room()? {
        progress("filling", fill.written, fill.written + room);
        if !fill.append(room)? {
            break;
        }
        peak_free = peak_free.min(space(&fill.file, &mp)?.free);
    }
    fill.sync()?;
    peak_free = peak_free.min(space(&fill.file, &mp)?.free);
    // One file holding these bytes at once: each is a distinct block of the free space.
    let covered = fill.end;
    // Sweeping: the allocator left some free blocks aside (small holes, the reserve, root's
    // blocks), often exactly where small deleted files were. Release the oldest part of the fill
    // and write as much at its end, repeatedly: an append is placed after the file's last block,
    // so the writes move on through the free space the fill has not reached yet, while what is
    // held never grows past the reserve.
    let sweep = (6 * peak_free).min(fill.end);
    let mut swept = 0;
    while !fill.interrupted && fill.stopped_early.is_none() && swept < sweep {
        progress("sweeping", swept, sweep);
        let k = (sweep - swept).min(CHUNK);
        if !fill.release_head(k)? {
            break;
        }
        if !fill.append(k)? {
            break;
        }
        swept += k;
    }
    if !fill.interrupted {
        progress("syncing", fill.written, fill.written);
        fill.sync()?;
    }
    let Fill { file, written, interrupted, stopped_early, .. } = fill;
    // Release the space, then commit the transaction that frees it: freed blocks are neither
    // counted as free nor trimmable until the journal commits.
    drop(file);
    let root = File::open(&mp).map_err(io_err(&mp, "open"))?;
    rustix::fs::syncfs(&root).map_err(|e| io_err(&mp, "sync")(e.into()))?;

    let trim = if interrupted || opts.no_trim {
        Trim::Skipped
    } else {
        progress("trimming", written, written);
        match crate::sys::fitrim(root.as_fd()) {
            Ok(bytes) => Trim::Done { bytes },
            Err(Errno::EOPNOTSUPP | Errno::ENOTTY) => Trim::Unsupported,
            Err(e) => Trim::Failed { reason: e.desc().to_string() },
        }
    };
    let end = space(&root, &mp)?;
    Ok(Report {
        medium: medium(m.major, m.minor),
        mount_point: mp,
        fstype: m.fstype,
        device: m.source,
        size: start.size,
        available_before: start.available,
        available_after: end.available,
        reserve,
        root_reserved: start.free.saturating_sub(start.available),
        free_before: start.free,
        covered,
        written,
        unwritten: if interrupted { start.free.saturating_sub(written) } else { peak_free },
        swept,
        trim,
        interrupted,
        stopped_early,
    })
}

/// The fill file and its bookkeeping. Its data lives at `head..end`; `head..` grows as the sweep
/// releases the oldest part.
struct Fill<'a> {
    file: File,
    mp: &'a Path,
    rng: rand::rngs::StdRng,
    buf: Vec<u8>,
    reserve: u64,
    stop: &'a AtomicBool,
    end: u64,
    head: u64,
    since_sync: u64,
    /// Allocate each chunk before writing it (cleared when the filesystem cannot).
    allocate: bool,
    /// Random bytes written, including those later released by the sweep.
    written: u64,
    interrupted: bool,
    stopped_early: Option<String>,
}

impl Fill<'_> {
    /// Room left above the reserve, rounded down to whole blocks (a partial block allocates a
    /// whole one, which would cross the reserve); `None` when there is none or the fill must stop.
    /// Below the reserve (the fill's own metadata, or another program writing) the difference is
    /// given back first.
    fn room(&mut self) -> Result<Option<u64>, ScrubError> {
        if self.stop.load(Ordering::Relaxed) {
            self.interrupted = true;
            return Ok(None);
        }
        let now = space(&self.file, self.mp)?;
        if now.available < self.reserve {
            let deficit = self.reserve - now.available;
            let give = (deficit.div_ceil(now.block) * now.block).min(self.end - self.head);
            self.end -= give;
            self.file.set_len(self.end).map_err(io_err(self.mp, "shrink the fill file on"))?;
            if deficit > CHUNK {
                self.stopped_early =
                    Some("other programs were using the space, so the fill gave it back and stopped".into());
            }
            return Ok(None);
        }
        let room = (now.available - self.reserve) / now.block * now.block;
        Ok((room > 0).then_some(room))
    }

    /// Writes up to one chunk of `max` bytes of random data at the end. `false` when the fill
    /// must stop (interrupted, no room, filesystem full).
    fn append(&mut self, max: u64) -> Result<bool, ScrubError> {
        let Some(room) = self.room()? else { return Ok(false) };
        let n = room.min(max).min(CHUNK) as usize;
        // Allocate the chunk before writing it. Written into the page cache, ext4 allocates the
        // blocks at writeback, up to 8 MiB at a time, and for the length of each allocation
        // counts them both as dirty and as used: free space dips by up to 8 MiB below what the
        // fill holds, for every program that looks. Allocated here, the dip is at most the chunk.
        let full = || "the filesystem was full earlier than its free-space count said".to_string();
        if self.allocate {
            match rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::empty(), self.end, n as u64) {
                Ok(()) => {}
                Err(rustix::io::Errno::OPNOTSUPP) => self.allocate = false,
                Err(rustix::io::Errno::NOSPC) => {
                    self.stopped_early = Some(full());
                    return Ok(false);
                }
                Err(e) => return Err(io_err(self.mp, "allocate the fill file on")(e.into())),
            }
        }
        self.rng.fill_bytes(&mut self.buf[..n]);
        match self.file.write_all_at(&self.buf[..n], self.end) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                self.stopped_early = Some(full());
                return Ok(false);
            }
            Err(e) => return Err(io_err(self.mp, "write the fill file on")(e)),
        }
        self.end += n as u64;
        self.written += n as u64;
        self.since_sync += n as u64;
        if self.since_sync >= SYNC_EVERY {
            self.sync()?;
        }
        Ok(true)
    }

    /// Frees `k` bytes at the start of the data (a hole; the size stays). `false` when the
    /// filesystem cannot punch holes, which ends the sweep.
    fn release_head(&mut self, k: u64) -> Result<bool, ScrubError> {
        // The released part must be on the device first: a hole punched in unwritten page cache
        // overwrote nothing.
        if self.head + k > self.end - self.since_sync {
            self.sync()?;
        }
        let flags = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.file, flags, self.head, k) {
            Ok(()) => {
                self.head += k;
                Ok(true)
            }
            Err(rustix::io::Errno::OPNOTSUPP) => Ok(false),
            Err(e) => Err(io_err(self.mp, "release part of the fill file on")(e.into())),
        }
    }

    fn sync(&mut self) -> Result<(), ScrubError> {
        if self.since_sync > 0 {
            sync_and_drop_cache(&self.file, self.mp)?;
            self.since_sync = 0;
        }
        Ok(())
    }
}

/// Makes what was written durable and lets the kernel drop it from the page cache, so the fill
/// does not push the rest of the system's cache out.
fn sync_and_drop_cache(f: &File, mp: &Path) -> Result<(), ScrubError> {
    f.sync_data().map_err(io_err(mp, "sync the fill file on"))?;
    // Advice only: a kernel that ignores it just keeps the pages cached.
    let _ = rustix::fs::fadvise(f, 0, None, rustix::fs::Advice::DontNeed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_reserve_is_one_percent_within_bounds() {
        assert_eq!(default_reserve(256 * MIB), 16 * MIB);
        assert_eq!(default_reserve(64 * 1024 * MIB), 64 * 1024 * MIB / 100);
        assert_eq!(default_reserve(4 * 1024 * 1024 * MIB), 1024 * MIB);
    }
}
