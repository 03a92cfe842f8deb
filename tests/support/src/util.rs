//! Small helpers every test suite needs, written once.
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Argon2id at its minimum cost, as a config file: tests check behaviour, not strength.
pub const FAST_CONFIG: &str = "[argon2]\ntime_cost = 1\nmemory_kib = 1024\nparallelism = 1\n";

/// Names in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).expect("/dev/urandom");
    b
}

/// A random id in 200000..900000, for uids and gids no real account has (process scans by uid
/// then see only the test's own).
pub fn fresh_id() -> u32 {
    200_000 + u32::from_le_bytes(random_bytes()) % 700_000
}

/// Ten random hex digits, for unique user and service names.
pub fn rand_hex() -> String {
    random_bytes::<5>().iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Returns from the calling test, saying why, unless it runs as root: tests that mount
/// filesystems, load kernel keys or create users skip rather than fail elsewhere.
#[macro_export]
macro_rules! needs_root {
    () => {
        if !$crate::is_root() {
            eprintln!("skipped: this test needs root (loop mounts, fscrypt keys, users); run it as root");
            return;
        }
    };
}
