//! The passes' maps of multiply-linked inodes (inode number → a small fixed-size record), with
//! bounded memory: the first [`in_memory`] entries are kept in a hash map, later ones in an
//! open-addressing hash table in an unnamed temporary file (`O_TMPFILE`, freed when the pass ends
//! or the process dies), with any variable-length part (a path) appended to a second such file.
//!
//! A tree of a million hard-linked files then costs a few MiB of memory and some page cache,
//! which the kernel may write out, instead of growing the process by a hundred bytes per inode.
//! Nothing here is ever read back by another run: a resumed pass rebuilds its map from the trees.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fault;
use crate::fsx;

/// Entries kept in memory before the rest go to disk: a few MiB.
const IN_MEMORY: usize = 1 << 16;

/// Bytes of a record on disk.
pub(crate) const VALUE: usize = 24;

/// A slot of the table on disk: key, used mark, value.
const SLOT: usize = 16 + VALUE;

/// Slots read at once while probing.
const PROBE: usize = 8;

/// How many entries stay in memory (`DIRSEAL_LINKS_IN_MEMORY` in tests, so a small tree spills).
fn in_memory() -> usize {
    fault::test_override("DIRSEAL_LINKS_IN_MEMORY").map_or(IN_MEMORY, |n| n as usize)
}

/// What a map holds for an inode, on disk as [`VALUE`] bytes; a variable-length part goes to
/// `blob` (which grows in `dir`).
pub(crate) trait Record: Clone {
    fn encode(&self, blob: &mut Blob, dir: &OwnedFd) -> io::Result<[u8; VALUE]>;
    fn decode(b: &[u8; VALUE], blob: &Blob) -> io::Result<Self>;
}

/// The little-endian number in `b[r]` (at most 8 bytes), for decoding records.
pub(crate) fn word(b: &[u8; VALUE], r: std::ops::Range<usize>) -> u64 {
    let mut w = [0; 8];
    w[..r.len()].copy_from_slice(&b[r]);
    u64::from_le_bytes(w)
}

/// Bytes appended to an unnamed file and read back by position.
#[derive(Default)]
pub(crate) struct Blob {
    file: Option<File>,
    len: u64,
}

impl Blob {
    /// Appends `data`; returns where it is.
    pub(crate) fn push(&mut self, data: &[u8], dir: &OwnedFd) -> io::Result<(u64, u32)> {
        let file = match &mut self.file {
            Some(f) => f,
            f => f.insert(File::from(fsx::tmpfile(dir)?)),
        };
        let at = self.len;
        file.write_all_at(data, at)?;
        self.len += data.len() as u64;
        let len = u32::try_from(data.len()).map_err(|_| io::Error::other("a path too long to keep"))?;
        Ok((at, len))
    }

    pub(crate) fn read(&self, at: u64, len: u32) -> io::Result<Vec<u8>> {
        let file = self.file.as_ref().ok_or_else(|| io::Error::other("the hard-link map lost its names"))?;
        let mut v = vec![0; len as usize];
        file.read_exact_at(&mut v, at)?;
        Ok(v)
    }
}

/// The on-disk part: linear probing, at most half full, doubled (into a new file) when it would
/// be fuller.
struct Table {
    file: File,
    bits: u32,
    count: u64,
}

impl Table {
    fn new(dir: &OwnedFd, bits: u32) -> io::Result<Table> {
        let file = File::from(fsx::tmpfile(dir)?);
        file.set_len((SLOT as u64) << bits)?;
        Ok(Table { file, bits, count: 0 })
    }

    fn home(&self, key: u64) -> u64 {
        key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)
    }

    /// The slot holding `key`, or the free one where it would go, and its value if present.
    fn find(&self, key: u64) -> io::Result<(u64, Option<[u8; VALUE]>)> {
        let mask = (1u64 << self.bits) - 1;
        let mut i = self.home(key);
        let mut buf = [0u8; SLOT * PROBE];
        loop {
            // A window of slots, not wrapping past the end (the next read starts at slot 0).
            let n = PROBE.min(((mask + 1) - i) as usize);
            self.file.read_exact_at(&mut buf[..n * SLOT], i * SLOT as u64)?;
            for s in buf[..n * SLOT].chunks_exact(SLOT) {
                let used = s[8] != 0;
                if !used {
                    return Ok((i, None));
                }
                if u64::from_le_bytes(s[..8].try_into().expect("8 bytes")) == key {
                    return Ok((i, Some(s[16..].try_into().expect("VALUE bytes"))));
                }
                i = (i + 1) & mask;
            }
        }
    }

    fn put_at(&self, slot: u64, key: u64, value: &[u8; VALUE]) -> io::Result<()> {
        let mut s = [0u8; SLOT];
        s[..8].copy_from_slice(&key.to_le_bytes());
        s[8] = 1;
        s[16..].copy_from_slice(value);
        self.file.write_all_at(&s, slot * SLOT as u64)
    }

    fn insert(&mut self, dir: &OwnedFd, key: u64, value: &[u8; VALUE]) -> io::Result<()> {
        let (slot, old) = self.find(key)?;
        if old.is_some() {
            return self.put_at(slot, key, value);
        }
        if (self.count + 1) * 2 > 1u64 << self.bits {
            let mut bigger = Table::new(dir, self.bits + 1)?;
            self.each(&mut |k, v| {
                let (s, _) = bigger.find(k)?;
                bigger.count += 1;
                bigger.put_at(s, k, v)
            })?;
            SPILLED.fetch_sub(bigger.count, Ordering::Relaxed);
            *self = bigger;
            return self.insert(dir, key, value);
        }
        self.count += 1;
        SPILLED.fetch_add(1, Ordering::Relaxed);
        self.put_at(slot, key, value)
    }

    fn each(&self, f: &mut dyn FnMut(u64, &[u8; VALUE]) -> io::Result<()>) -> io::Result<()> {
        let slots = 1u64 << self.bits;
        let mut buf = vec![0u8; SLOT * 1024];
        let mut i = 0;
        while i < slots {
            let n = 1024.min(slots - i) as usize;
            self.file.read_exact_at(&mut buf[..n * SLOT], i * SLOT as u64)?;
            for s in buf[..n * SLOT].chunks_exact(SLOT) {
                if s[8] != 0 {
                    f(u64::from_le_bytes(s[..8].try_into().expect("8 bytes")), s[16..].try_into().expect("VALUE"))?;
                }
            }
            i += n as u64;
        }
        Ok(())
    }
}

/// Inode number → `V`, in memory up to [`in_memory`] entries, then on disk in `dir`'s filesystem.
pub(crate) struct LinkMap<V> {
    mem: HashMap<u64, V>,
    limit: usize,
    dir: OwnedFd,
    disk: Option<Table>,
    blob: Blob,
}

impl<V: Record> LinkMap<V> {
    /// A map that spills into unnamed files made in `dir` (a directory of the tree's filesystem).
    pub(crate) fn new(dir: impl AsFd) -> io::Result<LinkMap<V>> {
        Ok(LinkMap {
            mem: HashMap::new(),
            limit: in_memory(),
            dir: dir.as_fd().try_clone_to_owned()?,
            disk: None,
            blob: Blob::default(),
        })
    }

    pub(crate) fn get(&self, key: u64) -> io::Result<Option<V>> {
        if let Some(v) = self.mem.get(&key) {
            return Ok(Some(v.clone()));
        }
        match &self.disk {
            Some(t) => t.find(key)?.1.map(|b| V::decode(&b, &self.blob)).transpose(),
            None => Ok(None),
        }
    }

    pub(crate) fn insert(&mut self, key: u64, value: V) -> io::Result<()> {
        if let Some(v) = self.mem.get_mut(&key) {
            *v = value;
            return Ok(());
        }
        if self.disk.is_none() && self.mem.len() < self.limit {
            self.mem.insert(key, value);
            return Ok(());
        }
        let LinkMap { disk, dir, blob, .. } = self;
        let disk = match disk {
            Some(t) => t,
            t => t.insert(Table::new(dir, 10)?),
        };
        let b = value.encode(blob, dir)?;
        disk.insert(dir, key, &b)
    }

    /// Every entry, in no particular order.
    pub(crate) fn each(&self, f: &mut dyn FnMut(u64, V)) -> io::Result<()> {
        for (k, v) in &self.mem {
            f(*k, v.clone());
        }
        match &self.disk {
            Some(t) => t.each(&mut |k, b| {
                f(k, V::decode(b, &self.blob)?);
                Ok(())
            }),
            None => Ok(()),
        }
    }
}

/// Entries every map of this process has put on disk (a test checks that a tree of many
/// hard-linked files did spill).
static SPILLED: AtomicU64 = AtomicU64::new(0);

/// How many hard-linked inodes the passes of this process have kept on disk rather than in memory.
pub fn links_spilled() -> u64 {
    SPILLED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Name(Vec<u8>);

    impl Record for Name {
        fn encode(&self, blob: &mut Blob, dir: &OwnedFd) -> io::Result<[u8; VALUE]> {
            let (at, len) = blob.push(&self.0, dir)?;
            let mut b = [0; VALUE];
            b[..8].copy_from_slice(&at.to_le_bytes());
            b[8..12].copy_from_slice(&len.to_le_bytes());
            Ok(b)
        }

        fn decode(b: &[u8; VALUE], blob: &Blob) -> io::Result<Name> {
            Ok(Name(blob.read(word(b, 0..8), word(b, 8..12) as u32)?))
        }
    }

    /// Past the in-memory part, through several doublings of the table: every key keeps its last
    /// value, absent keys stay absent, and `each` sees every entry once.
    #[test]
    fn spilled_entries_read_back_through_growth() {
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        let mut m: LinkMap<Name> = LinkMap::new(&dir).unwrap();
        m.limit = 10;
        // Keys that share low bits and one at 0, so probing wraps and collides.
        let key = |i: u64| i << 20;
        for i in 0..5000 {
            m.insert(key(i), Name(format!("first {i}").into_bytes())).unwrap();
        }
        for i in (0..5000).step_by(3) {
            m.insert(key(i), Name(format!("again {i}").into_bytes())).unwrap();
        }
        assert_eq!(m.mem.len(), 10);
        assert_eq!(m.disk.as_ref().unwrap().count, 4990);
        for i in 0..5000 {
            let want = if i % 3 == 0 { format!("again {i}") } else { format!("first {i}") };
            assert_eq!(m.get(key(i)).unwrap(), Some(Name(want.into_bytes())), "key {i}");
        }
        assert_eq!(m.get(key(5000)).unwrap(), None);
        assert_eq!(m.get(1).unwrap(), None);
        let mut seen = std::collections::BTreeSet::new();
        m.each(&mut |k, _| assert!(seen.insert(k), "{k} twice")).unwrap();
        assert_eq!(seen.len(), 5000);
    }
}
