//! A real ext4 filesystem on a loop device, for tests that must exercise the kernel; a software
//! TPM ([`Swtpm`]) per test; and system users that exist for one test ([`User`]).
//!
//! Each [`TestFs`] creates a sparse image in its own temp dir, formats it with `mkfs.ext4 -O encrypt`,
//! and mounts it with `mount -o loop`. Dropping it unmounts and detaches exactly the loop device it
//! attached — never another test's — even when the test panicked.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod logwrites;
pub mod modgraph;
mod swtpm;
pub mod tree;
#[cfg(feature = "ui")]
pub mod ui;
mod users;
mod util;

pub use swtpm::Swtpm;
pub use users::{accounts, passwd_lock, User};
pub use util::{fresh_id, is_root, names, rand_hex, FAST_CONFIG};

/// How to build the filesystem.
#[derive(Clone, Debug)]
pub struct Options {
    pub size_mib: u64,
    /// Format with `-O encrypt`. Off to test the "filesystem lacks the encrypt feature" path.
    pub encrypt: bool,
    /// Inode count (`mkfs -N`), to test running out of inodes. `None` lets mkfs choose.
    pub inodes: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options { size_mib: 256, encrypt: true, inodes: None }
    }
}

/// A mounted scratch filesystem. Requires root.
pub struct TestFs {
    dir: tempfile::TempDir,
    mnt: PathBuf,
    image: PathBuf,
    loopdev: Option<String>,
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Default for TestFs {
    fn default() -> Self {
        TestFs::new()
    }
}

impl TestFs {
    /// A 256 MiB encrypt-capable ext4. Panics with the failing command if the harness cannot work.
    pub fn new() -> TestFs {
        TestFs::with(Options::default())
    }

    pub fn with(opts: Options) -> TestFs {
        match TestFs::try_with(opts) {
            Ok(fs) => fs,
            Err(e) => panic!("test filesystem: {e} (tests must run as root with loop devices)"),
        }
    }

    pub fn try_with(opts: Options) -> Result<TestFs, String> {
        let dir = tempfile::Builder::new().prefix("dirseal-testfs.").tempdir().map_err(|e| e.to_string())?;
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        let f = std::fs::File::create(&image).map_err(|e| e.to_string())?;
        f.set_len(opts.size_mib * 1024 * 1024).map_err(|e| e.to_string())?;
        drop(f);
        let mut mkfs = Command::new("mkfs.ext4");
        mkfs.args(["-q", "-F", "-b", "4096"]);
        if opts.encrypt {
            mkfs.args(["-O", "encrypt"]);
        }
        if let Some(n) = opts.inodes {
            mkfs.args(["-N", &n.to_string()]);
        }
        run(mkfs.arg(&image))?;
        // Attach the loop device ourselves so Drop detaches only this one.
        let loopdev = run(Command::new("losetup").args(["--find", "--show"]).arg(&image))?;
        let mut fs = TestFs { dir, mnt, image, loopdev: Some(loopdev) };
        fs.mount()?;
        Ok(fs)
    }

    /// After an unmount: waits (up to 20 s) until the kernel has let the filesystem go (its
    /// /proc/fs/ext4 entry gone). A mount before that would get the same superblock back, with
    /// its keys still loaded: not what a test of a reboot wants.
    fn wait_released(&self) -> Result<(), String> {
        let dev = self.loopdev.clone().ok_or("no loop device")?;
        let name = Path::new(&dev).file_name().map(|n| n.to_os_string()).unwrap_or_default();
        let entry = Path::new("/proc/fs/ext4").join(name);
        let start = std::time::Instant::now();
        while entry.exists() {
            if start.elapsed() > std::time::Duration::from_secs(20) {
                return Err(format!("{dev} is still in use 20 s after its unmount ({} exists)", entry.display()));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(())
    }

    fn mount(&mut self) -> Result<(), String> {
        let dev = self.loopdev.clone().ok_or("no loop device")?;
        run(Command::new("mount").args(["-t", "ext4", &dev]).arg(&self.mnt))?;
        Ok(())
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// A directory outside the filesystem, private to this test, for keystores and configs.
    pub fn scratch(&self) -> PathBuf {
        let p = self.dir.path().join("scratch");
        let _ = std::fs::create_dir(&p);
        p
    }

    /// The image file backing the filesystem.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// Unmount and mount again: drops every cached key and inode, like a reboot does.
    pub fn remount(&mut self) {
        if let Err(e) = run(Command::new("umount").arg(&self.mnt)).and_then(|_| self.wait_released()) {
            panic!("remount: {e}");
        }
        if let Err(e) = self.mount() {
            panic!("remount: {e}");
        }
    }

    /// Unmount, attach the image to another loop device and mount that: like a reboot that
    /// numbers the devices differently, the filesystem comes back with a new device number.
    pub fn reattach(&mut self) {
        if let Err(e) = run(Command::new("umount").arg(&self.mnt)) {
            panic!("reattach: {e}");
        }
        // Attached while the old one still is, so the new device cannot get the old number.
        let new = match run(Command::new("losetup").args(["--find", "--show"]).arg(&self.image)) {
            Ok(d) => d,
            Err(e) => panic!("reattach: {e}"),
        };
        if let Some(old) = self.loopdev.replace(new) {
            let _ = run(Command::new("losetup").args(["-d", &old]));
        }
        if let Err(e) = self.mount() {
            panic!("reattach: {e}");
        }
    }
}

impl Drop for TestFs {
    fn drop(&mut self) {
        // Lazy unmount so a process still holding a file (a failed test's child) cannot keep the loop
        // device attached forever.
        let _ = run(Command::new("umount").arg(&self.mnt));
        let _ = run(Command::new("umount").arg("-l").arg(&self.mnt));
        if let Some(dev) = self.loopdev.take() {
            let _ = run(Command::new("losetup").args(["-d", &dev]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_a_real_ext4_and_cleans_up() {
        crate::needs_root!();
        let fs = TestFs::new();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mnt = fs.path().to_string_lossy().to_string();
        assert!(mounts.lines().any(|l| l.split(' ').nth(1) == Some(mnt.as_str())));
        std::fs::write(fs.path().join("x"), b"hi").unwrap_or_else(|e| panic!("{e}"));
        drop(fs);
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        assert!(!mounts.lines().any(|l| l.split(' ').nth(1) == Some(mnt.as_str())));
    }
}
