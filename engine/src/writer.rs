//! The write path: per-inode write buffers committed as slices.
//!
//! Writes to an inode collect in memory as pending slices, one per run of
//! contiguous writes inside a chunk (a write that lands inside or right after
//! the newest pending slice it touches extends that slice; anything that
//! would need an older slice to win over a newer one starts a new slice).
//! On flush, fsync, release — or early, once the buffer passes its limit —
//! each pending slice gets an id, its blocks are compressed and uploaded in
//! parallel, and it is committed with `Meta::write_chunk`, in write order.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::block_key::{block_count, block_key, block_len};
use crate::compress::compress;
use crate::error::{Error, Result};
use crate::meta::{CHUNK_SIZE, Ino, Slice, Timestamp};
use crate::volume::Volume;

/// Stores `data` as a new slice's blocks (in parallel over up to `threads`
/// threads) and returns the slice record for chunk offset `pos`. The slice
/// is not yet referenced by any chunk.
pub fn upload_slice(vol: &Volume, data: &[u8], pos: u32, threads: usize) -> Result<Slice> {
    let size = u32::try_from(data.len())
        .map_err(|_| Error::Invalid("a slice cannot exceed 4 GiB".into()))?;
    let id = vol.meta.new_slice_id()?;
    let bs = vol.block_size;
    let n = block_count(size, bs);
    let put = |indx: u32| -> Result<()> {
        let start = indx as usize * bs as usize;
        let raw = &data[start..start + block_len(size, bs, indx) as usize];
        let key = block_key(vol.name(), id, indx, raw.len() as u32);
        let stored = compress(vol.compression, raw)?;
        let crc = sluice_simd::crc32c(0, &stored);
        vol.store.put(&key, &stored, Some(crc))
    };
    let threads = threads.clamp(1, n.max(1) as usize);
    if threads == 1 {
        (0..n).try_for_each(put)?;
    } else {
        let next = std::sync::atomic::AtomicU32::new(0);
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= n {
                                return Ok(());
                            }
                            put(i)?;
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Invalid("a block upload thread panicked".into()))
                    })
                })
                .collect()
        });
        results.into_iter().collect::<Result<()>>()?;
    }
    Ok(Slice {
        pos,
        id,
        size,
        off: 0,
        len: size,
    })
}

/// A slice being written, not yet stored.
#[derive(Debug)]
struct Pending {
    /// Chunk offset of the first byte.
    pos: u32,
    data: Vec<u8>,
}

impl Pending {
    fn end(&self) -> u64 {
        u64::from(self.pos) + self.data.len() as u64
    }
}

#[derive(Debug, Default)]
struct Buffer {
    /// Pending slices per chunk index, oldest first.
    chunks: BTreeMap<u32, Vec<Pending>>,
    bytes: usize,
    /// The file end the buffered writes reach (0 when none).
    end: u64,
}

/// A chunk that a flush committed, with its slice count after the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The chunk index.
    pub indx: u32,
    /// How many slices the chunk holds now.
    pub slices: usize,
}

/// The write buffer of one inode, shared by all its open handles.
#[derive(Debug, Default)]
pub struct FileWriter {
    buf: Mutex<Buffer>,
    /// Serialises flushes, so slices commit in write order and a reader that
    /// flushes first sees every write made before it.
    flushing: Mutex<()>,
}

impl FileWriter {
    /// An empty write buffer.
    pub fn new() -> FileWriter {
        FileWriter::default()
    }

    /// Buffers `data` at file offset `off`; returns the bytes now buffered.
    pub fn write(&self, off: u64, data: &[u8]) -> Result<usize> {
        let end = off
            .checked_add(data.len() as u64)
            .filter(|e| *e / CHUNK_SIZE <= u64::from(u32::MAX))
            .ok_or(Error::FileTooBig)?;
        let mut b = self.buf.lock();
        let mut at = off;
        let mut rest = data;
        while !rest.is_empty() {
            let indx = (at / CHUNK_SIZE) as u32;
            let coff = at % CHUNK_SIZE;
            let n = ((CHUNK_SIZE - coff) as usize).min(rest.len());
            let (part, tail) = rest.split_at(n);
            add(b.chunks.entry(indx).or_default(), coff, part);
            b.bytes += n;
            at += n as u64;
            rest = tail;
        }
        b.end = b.end.max(end);
        Ok(b.bytes)
    }

    /// The file end the buffered writes reach (0 when nothing is buffered).
    pub fn end(&self) -> u64 {
        self.buf.lock().end
    }

    /// Whether writes are buffered.
    pub fn is_dirty(&self) -> bool {
        self.buf.lock().bytes > 0
    }

    /// Stores and commits every buffered write, in write order. Returns the
    /// chunks it changed. On failure the remaining writes of that flush are
    /// dropped (the error reaches the caller of flush/fsync/close).
    pub fn flush(&self, vol: &Volume, ino: Ino, threads: usize) -> Result<Vec<Committed>> {
        let _order = self.flushing.lock();
        let taken = std::mem::take(&mut *self.buf.lock());
        let mut done = Vec::new();
        for (indx, slices) in taken.chunks {
            for p in slices {
                let slice = upload_slice(vol, &p.data, p.pos, threads)?;
                let count = vol.meta.write_chunk(ino, indx, slice, Timestamp::now())?;
                match done.last_mut() {
                    Some(Committed { indx: i, slices }) if *i == indx => *slices = count,
                    _ => done.push(Committed {
                        indx,
                        slices: count,
                    }),
                }
            }
        }
        Ok(done)
    }

    /// Drops buffered writes at or past file offset `len` and cuts the ones
    /// that cross it (truncate while writes are buffered).
    pub fn discard_from(&self, len: u64) {
        let mut b = self.buf.lock();
        let first = len / CHUNK_SIZE;
        let cut = len % CHUNK_SIZE;
        let mut bytes = 0;
        b.chunks.retain(|&indx, slices| {
            let indx = u64::from(indx);
            if indx > first || (indx == first && cut == 0) {
                return false;
            }
            if indx == first {
                slices.retain_mut(|p| {
                    if u64::from(p.pos) >= cut {
                        return false;
                    }
                    p.data.truncate((cut - u64::from(p.pos)) as usize);
                    true
                });
            }
            bytes += slices.iter().map(|p| p.data.len()).sum::<usize>();
            !slices.is_empty()
        });
        b.bytes = bytes;
        b.end = b.end.min(len);
        if bytes == 0 {
            b.end = 0;
        }
    }
}

/// Adds a write at chunk offset `coff` to a chunk's pending slices.
fn add(slices: &mut Vec<Pending>, coff: u64, data: &[u8]) {
    let (a, b) = (coff, coff + data.len() as u64);
    // Newest first: the first slice the write overlaps or touches decides.
    for p in slices.iter_mut().rev() {
        let (pa, pb) = (u64::from(p.pos), p.end());
        if a >= pa && a <= pb {
            let start = (a - pa) as usize;
            let overlap = (pb.min(b) - a) as usize;
            sluice_simd::copy(&mut p.data[start..start + overlap], &data[..overlap]);
            p.data.extend_from_slice(&data[overlap..]);
            return;
        }
        if a < pb && b > pa {
            // Overlaps an older region without starting inside it: a new
            // slice must win over this one.
            break;
        }
    }
    slices.push(Pending {
        pos: coff as u32,
        data: data.to_vec(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(w: &FileWriter) -> Vec<(u32, u32, Vec<u8>)> {
        let b = w.buf.lock();
        b.chunks
            .iter()
            .flat_map(|(i, v)| v.iter().map(move |p| (*i, p.pos, p.data.clone())))
            .collect()
    }

    #[test]
    fn contiguous_writes_merge_and_overlaps_stack() {
        let w = FileWriter::new();
        w.write(0, b"aaaa").unwrap();
        w.write(4, b"bb").unwrap();
        w.write(2, b"CC").unwrap(); // inside the newest slice: in place
        assert_eq!(layout(&w), [(0, 0, b"aaCCbb".to_vec())]);
        w.write(100, b"zz").unwrap(); // elsewhere: a new slice
        w.write(5, b"XYZ").unwrap(); // overlaps older slice 0 only: extends it
        assert_eq!(
            layout(&w),
            [(0, 0, b"aaCCbXYZ".to_vec()), (0, 100, b"zz".to_vec())]
        );
        w.write(99, b"12345").unwrap(); // starts before the newest: new slice
        assert_eq!(layout(&w).len(), 3);
        assert_eq!(w.end(), 104);
        // A write across a chunk boundary splits.
        w.write(CHUNK_SIZE - 2, b"abcd").unwrap();
        let l = layout(&w);
        assert_eq!(l[3], (0, (CHUNK_SIZE - 2) as u32, b"ab".to_vec()));
        assert_eq!(l[4], (1, 0, b"cd".to_vec()));
        w.discard_from(CHUNK_SIZE - 1);
        let l = layout(&w);
        assert_eq!(l.len(), 4);
        assert_eq!(l[3].2, b"a");
        assert_eq!(w.end(), CHUNK_SIZE - 1);
        w.discard_from(0);
        assert!(!w.is_dirty());
        assert_eq!(w.end(), 0);
    }
}
