//! Reader and replayer for the log that the kernel's dm-log-writes target records: every write,
//! flush, FUA write, discard and mark sent to a device, in the order the kernel logged them
//! (writes that completed before a flush come before that flush's entry). Replaying a prefix of
//! the log onto a zeroed device gives the disk as a power cut at that moment could have left it.
//!
//! Layout (all little-endian, `S` = the data device's logical block size, stored in the super):
//! block 0 holds the super `{magic u64, version u64, nr_entries u64, sectorsize u32}`. Entries
//! follow from byte `S`: one block with `{sector u64, nr_sectors u64, flags u64, data_len u64}`
//! (a mark's text follows inside that block), then `nr_sectors * S` bytes of data unless the entry
//! is a discard. `sector` and `nr_sectors` count blocks of `S` bytes on the data device.
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

pub const MAGIC: u64 = 0x006a_7366_7773_6872;
pub const VERSION: u64 = 1;
pub const FLUSH: u64 = 1 << 0;
pub const FUA: u64 = 1 << 1;
pub const DISCARD: u64 = 1 << 2;
pub const MARK: u64 = 1 << 3;
pub const METADATA: u64 = 1 << 4;
const ENTRY_HEADER: usize = 32;
const SUPER_LEN: usize = 28;

/// One logged operation and where its data sits in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    /// First block written on the data device, in units of the log's sector size.
    pub sector: u64,
    pub nr_sectors: u64,
    pub flags: u64,
    /// Byte offset of the entry's data in the log (meaningless for marks, flushes and discards).
    pub data_offset: u64,
    pub mark: Option<String>,
}

impl Entry {
    /// A point where the disk had been told to make earlier writes durable.
    pub fn is_flush_point(&self) -> bool {
        self.flags & (FLUSH | FUA) != 0
    }
}

/// An opened log: the super parsed, every entry located.
#[derive(Debug)]
pub struct Log {
    file: File,
    pub sectorsize: u64,
    pub entries: Vec<Entry>,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Log {
    pub fn open(mut file: File) -> io::Result<Log> {
        let len = file.seek(SeekFrom::End(0))?;
        let mut sup = [0u8; SUPER_LEN];
        file.read_exact_at(&mut sup, 0).map_err(|_| bad("log too short for its super block".into()))?;
        if le64(&sup, 0) != MAGIC {
            return Err(bad(format!("not a dm-log-writes log (magic {:#x})", le64(&sup, 0))));
        }
        if le64(&sup, 8) != VERSION {
            return Err(bad(format!("unsupported log version {}", le64(&sup, 8))));
        }
        let nr_entries = le64(&sup, 16);
        let mut ss = [0u8; 4];
        ss.copy_from_slice(&sup[24..28]);
        let sectorsize = u64::from(u32::from_le_bytes(ss));
        if !(512..=65536).contains(&sectorsize) || !sectorsize.is_power_of_two() {
            return Err(bad(format!("bad sector size {sectorsize} in the log super")));
        }
        let mut entries = Vec::new();
        let mut pos = sectorsize;
        let mut block = vec![0u8; sectorsize as usize];
        for index in 0..nr_entries {
            if pos + sectorsize > len {
                return Err(bad(format!("entry {index} of {nr_entries} lies past the end of the log")));
            }
            file.read_exact_at(&mut block, pos)?;
            let (sector, nr_sectors, flags, data_len) =
                (le64(&block, 0), le64(&block, 8), le64(&block, 16), le64(&block, 24));
            let mark = if flags & MARK != 0 {
                let end = ENTRY_HEADER.saturating_add(usize::try_from(data_len).unwrap_or(usize::MAX));
                let text = block.get(ENTRY_HEADER..end).ok_or_else(|| bad(format!("entry {index}: mark too long")))?;
                Some(String::from_utf8_lossy(text).into_owned())
            } else {
                None
            };
            let data_offset = pos + sectorsize;
            let data_bytes = if flags & DISCARD != 0 {
                0
            } else {
                nr_sectors.checked_mul(sectorsize).ok_or_else(|| bad(format!("entry {index}: size overflows")))?
            };
            if data_offset + data_bytes > len {
                return Err(bad(format!("entry {index}: its data lies past the end of the log")));
            }
            entries.push(Entry { index, sector, nr_sectors, flags, data_offset, mark });
            pos = data_offset + data_bytes;
        }
        Ok(Log { file, sectorsize, entries })
    }

    /// Applies entries `from..to` (by index) to `dev`: writes their data, zeroes discarded ranges.
    pub fn replay(&self, dev: &File, from: u64, to: u64) -> io::Result<()> {
        let to = to.min(self.entries.len() as u64);
        let mut buf = Vec::new();
        for e in self.entries.iter().take(to as usize).skip(from as usize) {
            if e.flags & MARK != 0 || e.nr_sectors == 0 {
                continue;
            }
            let bytes = (e.nr_sectors * self.sectorsize) as usize;
            buf.clear();
            buf.resize(bytes, 0);
            if e.flags & DISCARD == 0 {
                self.file.read_exact_at(&mut buf, e.data_offset)?;
            }
            dev.write_all_at(&buf, e.sector * self.sectorsize)?;
        }
        Ok(())
    }
}

/// Writes a log in the kernel's layout; for tests of the reader.
pub struct LogBuilder {
    sectorsize: u64,
    entries: Vec<u8>,
    count: u64,
}

impl LogBuilder {
    pub fn new(sectorsize: u64) -> LogBuilder {
        LogBuilder { sectorsize, entries: Vec::new(), count: 0 }
    }

    fn header(&mut self, sector: u64, nr_sectors: u64, flags: u64, extra: &[u8]) {
        let mut block = vec![0u8; self.sectorsize as usize];
        for (i, v) in [sector, nr_sectors, flags, extra.len() as u64].iter().enumerate() {
            block[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        block[ENTRY_HEADER..ENTRY_HEADER + extra.len()].copy_from_slice(extra);
        self.entries.extend_from_slice(&block);
        self.count += 1;
    }

    pub fn write(mut self, sector: u64, data: &[u8], flags: u64) -> Self {
        assert_eq!(data.len() as u64 % self.sectorsize, 0);
        self.header(sector, data.len() as u64 / self.sectorsize, flags, &[]);
        self.entries.extend_from_slice(data);
        self
    }

    pub fn flush(mut self) -> Self {
        self.header(0, 0, FLUSH, &[]);
        self
    }

    pub fn discard(mut self, sector: u64, nr_sectors: u64) -> Self {
        self.header(sector, nr_sectors, DISCARD, &[]);
        self
    }

    pub fn mark(mut self, name: &str) -> Self {
        self.header(0, 0, MARK, name.as_bytes());
        self
    }

    pub fn finish(self, out: &mut impl Write) -> io::Result<()> {
        let mut sup = vec![0u8; self.sectorsize as usize];
        sup[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        sup[8..16].copy_from_slice(&VERSION.to_le_bytes());
        sup[16..24].copy_from_slice(&self.count.to_le_bytes());
        sup[24..28].copy_from_slice(&(self.sectorsize as u32).to_le_bytes());
        out.write_all(&sup)?;
        out.write_all(&self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_file(b: LogBuilder) -> File {
        let mut f = tempfile::tempfile().unwrap();
        b.finish(&mut f).unwrap();
        f
    }

    fn dev(len: usize) -> File {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&vec![0xEE; len], 0).unwrap();
        f
    }

    fn contents(f: &File, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        f.read_exact_at(&mut v, 0).unwrap();
        v
    }

    #[test]
    fn parses_every_entry_kind_and_replays_prefixes() {
        for ss in [512u64, 4096] {
            let a = vec![0xAA; ss as usize * 2];
            let b = vec![0xBB; ss as usize];
            let log = Log::open(log_file(
                LogBuilder::new(ss).write(1, &a, 0).flush().mark("after-a").write(2, &b, FUA | METADATA).discard(0, 2),
            ))
            .unwrap();
            assert_eq!(log.sectorsize, ss);
            let kinds: Vec<u64> = log.entries.iter().map(|e| e.flags).collect();
            assert_eq!(kinds, vec![0, FLUSH, MARK, FUA | METADATA, DISCARD]);
            assert_eq!(log.entries[2].mark.as_deref(), Some("after-a"));
            let points: Vec<u64> = log.entries.iter().filter(|e| e.is_flush_point()).map(|e| e.index).collect();
            assert_eq!(points, vec![1, 3]);

            let len = ss as usize * 4;
            let d = dev(len);
            log.replay(&d, 0, 1).unwrap();
            let mut want = vec![0xEE; len];
            want[ss as usize..ss as usize * 3].fill(0xAA);
            assert_eq!(contents(&d, len), want, "after the first write");
            // Continuing from where the last replay stopped equals replaying from scratch.
            log.replay(&d, 1, 4).unwrap();
            want[ss as usize * 2..ss as usize * 3].fill(0xBB);
            assert_eq!(contents(&d, len), want, "overwrite by the FUA write");
            log.replay(&d, 4, u64::MAX).unwrap();
            want[..ss as usize * 2].fill(0);
            assert_eq!(contents(&d, len), want, "discard zeroes its range");
        }
    }

    #[test]
    fn refuses_damaged_logs() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"not a log at all, just some bytes").unwrap();
        assert!(Log::open(f).unwrap_err().to_string().contains("not a dm-log-writes log"));

        let mut buf = Vec::new();
        LogBuilder::new(512).write(0, &[1; 1024], 0).finish(&mut buf).unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&buf[..buf.len() - 1]).unwrap();
        assert!(Log::open(f).unwrap_err().to_string().contains("past the end"), "truncated data");

        let mut bad_version = buf.clone();
        bad_version[8] = 2;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bad_version).unwrap();
        assert!(Log::open(f).unwrap_err().to_string().contains("version 2"));

        let mut more = buf.clone();
        more[16] = 2; // claims two entries, holds one
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&more).unwrap();
        assert!(Log::open(f).unwrap_err().to_string().contains("entry 1 of 2"));

        let mut odd = buf;
        odd[24..28].copy_from_slice(&1000u32.to_le_bytes());
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&odd).unwrap();
        assert!(Log::open(f).unwrap_err().to_string().contains("sector size 1000"));
    }
}
