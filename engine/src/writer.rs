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

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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

type Background = std::thread::JoinHandle<Result<Vec<Committed>>>;

/// The write buffer of one inode, shared by all its open handles.
#[derive(Debug, Default)]
pub struct FileWriter {
    buf: Mutex<Buffer>,
    /// Serialises commits, so slices commit in write order and a reader that
    /// flushes first sees every write made before it. Whoever holds it
    /// finishes the background commit before committing anything else.
    flushing: Mutex<Option<Background>>,
    /// Bytes buffered by every writer sharing this counter (one per Vfs),
    /// until their commit ends.
    budget: Arc<AtomicUsize>,
}

/// Stores and commits the slices of a taken buffer, in write order.
fn commit_buffer(
    vol: &Volume,
    ino: Ino,
    threads: usize,
    taken: Buffer,
    budget: &AtomicUsize,
) -> Result<Vec<Committed>> {
    let bytes = taken.bytes;
    let res = commit_slices(vol, ino, threads, taken);
    // The memory is given back whether the commit worked or not.
    budget.fetch_sub(bytes, Ordering::AcqRel);
    res
}

fn commit_slices(vol: &Volume, ino: Ino, threads: usize, taken: Buffer) -> Result<Vec<Committed>> {
    let mut done: Vec<Committed> = Vec::new();
    for (indx, slices) in taken.chunks {
        for p in slices {
            let slice = upload_slice(vol, &p.data, p.pos, threads)?;
            let count = vol.meta.write_chunk(ino, indx, slice, Timestamp::now())?;
            match done.last_mut() {
                Some(c) if c.indx == indx => c.slices = count,
                _ => done.push(Committed {
                    indx,
                    slices: count,
                }),
            }
        }
    }
    Ok(done)
}

/// Waits for a background commit and returns what it committed.
fn join(bg: Option<Background>) -> Result<Vec<Committed>> {
    match bg {
        None => Ok(Vec::new()),
        Some(h) => h
            .join()
            .unwrap_or_else(|_| Err(Error::Invalid("a write-back thread panicked".into()))),
    }
}

impl FileWriter {
    /// An empty write buffer.
    pub fn new() -> FileWriter {
        FileWriter::default()
    }

    /// An empty write buffer that counts its bytes in `budget`, a counter
    /// shared by the writers of one file system.
    pub fn with_budget(budget: Arc<AtomicUsize>) -> FileWriter {
        FileWriter {
            budget,
            ..FileWriter::default()
        }
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
        self.budget.fetch_add(data.len(), Ordering::AcqRel);
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

    /// Stores and commits every buffered write, in write order, after any
    /// commit running in the background. Returns the chunks changed. On
    /// failure the remaining writes of that flush are dropped (the error
    /// reaches the caller of flush/fsync/close).
    pub fn flush(&self, vol: &Volume, ino: Ino, threads: usize) -> Result<Vec<Committed>> {
        let mut bg = self.flushing.lock();
        let mut done = join(bg.take())?;
        let taken = std::mem::take(&mut *self.buf.lock());
        done.extend(commit_buffer(vol, ino, threads, taken, &self.budget)?);
        Ok(done)
    }

    /// Starts committing the buffered writes in the background, so the
    /// writer can keep filling the buffer meanwhile (at most one commit runs
    /// per file). Returns what the previous background commit committed.
    pub fn flush_behind(
        &self,
        vol: &Arc<Volume>,
        ino: Ino,
        threads: usize,
    ) -> Result<Vec<Committed>> {
        let mut bg = self.flushing.lock();
        let done = join(bg.take());
        // Keep `end` so the file length still counts these writes until the
        // next full flush has committed them.
        let taken = {
            let mut b = self.buf.lock();
            Buffer {
                chunks: std::mem::take(&mut b.chunks),
                bytes: std::mem::take(&mut b.bytes),
                end: b.end,
            }
        };
        let vol = vol.clone();
        let budget = self.budget.clone();
        *bg = Some(
            std::thread::Builder::new()
                .name("sluice-writeback".into())
                .spawn(move || commit_buffer(&vol, ino, threads, taken, &budget))?,
        );
        done
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
    }
}
