//! The write path: per-inode write buffers committed as slices.
//!
//! Writes to an inode collect in memory as pending slices, one per run of
//! contiguous writes inside a chunk (a write that lands inside or right after
//! the newest pending slice it touches extends that slice; anything that
//! would need an older slice to win over a newer one starts a new slice).
//! A pending slice keeps its bytes one buffer per block. As soon as a block
//! is full it is sealed: the slice gets its id and the [`BlockUploader`]
//! stores the block in the background while the application keeps writing
//! (a later write into a sealed block starts a new slice instead). On flush,
//! fsync, release — or early, once the buffer passes its limit — the rest of
//! each slice is stored, its uploads are waited for, and it is committed with
//! `Meta::write_chunk`, in write order. So a sequential writer's fsync waits
//! for about one block, not for the whole buffer.

use std::collections::BTreeMap;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};

use crate::block_cache::BlockCache;
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
        store_block(
            vol,
            id,
            indx,
            &data[start..start + block_len(size, bs, indx) as usize],
        )
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

/// Compresses and stores block `indx` of slice `id`.
fn store_block(vol: &Volume, id: u64, indx: u32, raw: &[u8]) -> Result<()> {
    let key = block_key(vol.name(), id, indx, raw.len() as u32);
    let stored = compress(vol.compression, raw)?;
    let crc = sluice_simd::crc32c(0, &stored);
    vol.store.put(&key, &stored, Some(crc))
}

/// The uploads of one slice's sealed blocks: how many still run, and the
/// first failure.
#[derive(Debug, Default)]
struct Uploads {
    state: Mutex<(usize, Option<Error>)>,
    done: Condvar,
}

impl Uploads {
    fn start(&self) {
        self.state.lock().0 += 1;
    }

    fn finish(&self, res: Result<()>) {
        let mut st = self.state.lock();
        st.0 -= 1;
        if let Err(e) = res
            && st.1.is_none()
        {
            st.1 = Some(e);
        }
        if st.0 == 0 {
            self.done.notify_all();
        }
    }

    /// Waits until every upload ended; the first failure, if any.
    fn wait(&self) -> Result<()> {
        let mut st = self.state.lock();
        while st.0 > 0 {
            self.done.wait(&mut st);
        }
        st.1.take().map_or(Ok(()), Err)
    }
}

/// One sealed block to store.
struct Job {
    id: u64,
    indx: u32,
    data: Vec<u8>,
    uploads: Arc<Uploads>,
}

/// Threads that store sealed blocks of slices still being written, shared
/// by the write buffers of one file system.
#[derive(Debug)]
pub struct BlockUploader {
    vol: Arc<Volume>,
    /// Where the last, partial block of a committed slice is kept (as
    /// JuiceFS keeps blocks smaller than a block): a small file just
    /// written is read from memory.
    cache: Option<Arc<BlockCache>>,
    jobs: Option<Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Job({}_{}, {} bytes)",
            self.id,
            self.indx,
            self.data.len()
        )
    }
}

impl BlockUploader {
    /// Starts `threads` upload threads (at least one) for `vol`; committed
    /// partial blocks go into `cache` when there is one.
    pub fn start(
        vol: Arc<Volume>,
        threads: usize,
        cache: Option<Arc<BlockCache>>,
    ) -> Result<BlockUploader> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let threads = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                let vol = vol.clone();
                let cache = cache.clone();
                std::thread::Builder::new()
                    .name(format!("sluice-upload-{i}"))
                    .spawn(move || {
                        for job in rx {
                            let res = store_block(&vol, job.id, job.indx, &job.data);
                            job.uploads.finish(res);
                            if let Some(cache) = &cache {
                                cache.give_buffer(job.data);
                            }
                        }
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(BlockUploader {
            vol,
            cache,
            jobs: Some(tx),
            threads,
        })
    }

    fn submit(&self, job: Job) {
        job.uploads.start();
        if let Some(tx) = &self.jobs
            && let Err(crossbeam_channel::SendError(job)) = tx.send(job)
        {
            // Only after shutdown, which needs every writer gone: store it here.
            let res = store_block(&self.vol, job.id, job.indx, &job.data);
            job.uploads.finish(res);
        }
    }
}

impl Drop for BlockUploader {
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A slice being written, not yet committed.
#[derive(Debug)]
struct Pending {
    /// Chunk offset of the first byte.
    pos: u32,
    /// The slice's bytes, one buffer per block; sealed blocks are handed to
    /// the uploader and left empty here.
    blocks: Vec<Vec<u8>>,
    /// The slice's length in bytes.
    len: usize,
    /// Leading blocks sealed (being or been stored; never written again).
    sealed: usize,
    /// The slice id, taken when the first block is sealed.
    id: Option<u64>,
    uploads: Arc<Uploads>,
}

impl Pending {
    fn new(pos: u32) -> Pending {
        Pending {
            pos,
            blocks: Vec::new(),
            len: 0,
            sealed: 0,
            id: None,
            uploads: Arc::default(),
        }
    }

    fn end(&self) -> u64 {
        u64::from(self.pos) + self.len as u64
    }

    /// Writes `data` at slice offset `start` (at most the slice's length, and
    /// past its sealed blocks), growing the slice as needed.
    /// Whole-block buffers come from `spares` when it has one (warm memory).
    fn put(&mut self, bs: usize, mut start: usize, mut data: &[u8], spares: Option<&BlockCache>) {
        debug_assert!(start <= self.len && start >= self.sealed * bs);
        while !data.is_empty() {
            let (i, o) = (start / bs, start % bs);
            if i == self.blocks.len() {
                // A big write fills whole blocks: give the buffer its full
                // size at once rather than growing it by copies.
                let buf = if data.len() >= BIG_WRITE {
                    spares
                        .and_then(BlockCache::take_buffer)
                        .filter(|b| b.capacity() >= bs)
                        .unwrap_or_else(|| Vec::with_capacity(bs))
                } else {
                    Vec::new()
                };
                self.blocks.push(buf);
            }
            let b = &mut self.blocks[i];
            let n = (bs - o).min(data.len());
            let overlap = b.len().saturating_sub(o).min(n);
            sluice_simd::copy(&mut b[o..o + overlap], &data[..overlap]);
            b.extend_from_slice(&data[overlap..n]);
            start += n;
            data = &data[n..];
        }
        self.len = self.len.max(start);
    }

    /// Hands every full block not yet sealed to the uploader.
    fn seal_full(&mut self, vol: &Volume, up: &BlockUploader, bs: usize) -> Result<()> {
        while self.sealed < self.blocks.len() && self.blocks[self.sealed].len() == bs {
            let id = match self.id {
                Some(id) => id,
                None => *self.id.insert(vol.meta.new_slice_id()?),
            };
            up.submit(Job {
                id,
                indx: self.sealed as u32,
                data: std::mem::take(&mut self.blocks[self.sealed]),
                uploads: self.uploads.clone(),
            });
            self.sealed += 1;
        }
        Ok(())
    }

    /// Stores the blocks not yet sealed (all but the last through the
    /// uploader when there is one, the last on this thread), waits for every
    /// upload of the slice and returns its record.
    fn finish(mut self, vol: &Volume, up: Option<&BlockUploader>) -> Result<Slice> {
        let size = u32::try_from(self.len)
            .map_err(|_| Error::Invalid("a slice cannot exceed 4 GiB".into()))?;
        let id = match self.id {
            Some(id) => id,
            None => vol.meta.new_slice_id()?,
        };
        let last = self.blocks.len().saturating_sub(1);
        let mut inline = Ok(());
        for (i, data) in self.blocks.drain(..).enumerate().skip(self.sealed) {
            match up {
                Some(up) if i < last => up.submit(Job {
                    id,
                    indx: i as u32,
                    data,
                    uploads: self.uploads.clone(),
                }),
                _ => {
                    if inline.is_ok() {
                        inline = store_block(vol, id, i as u32, &data);
                    }
                    let Some(cache) = up.and_then(|u| u.cache.as_ref()) else {
                        continue;
                    };
                    if inline.is_ok() && data.len() < vol.block_size as usize {
                        // The cache moves the bytes into a buffer of their
                        // size and keeps the block-sized one as a spare.
                        cache.insert((id, i as u32), Arc::new(data));
                    } else {
                        cache.give_buffer(data);
                    }
                }
            }
        }
        let uploaded = self.uploads.wait();
        inline.and(uploaded)?;
        Ok(Slice {
            pos: self.pos,
            id,
            size,
            off: 0,
            len: size,
        })
    }
}

/// A write at least this big into a new block gets the block's whole buffer.
const BIG_WRITE: usize = 64 << 10;

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
    /// Stores full blocks while the file is written (None: every block is
    /// stored at commit, on the committing thread).
    uploader: Option<Arc<BlockUploader>>,
}

/// Stores and commits the slices of a taken buffer, in write order.
fn commit_buffer(
    vol: &Volume,
    up: Option<&BlockUploader>,
    ino: Ino,
    taken: Buffer,
    budget: &AtomicUsize,
) -> Result<Vec<Committed>> {
    let bytes = taken.bytes;
    let res = commit_slices(vol, up, ino, taken);
    // The memory is given back whether the commit worked or not.
    budget.fetch_sub(bytes, Ordering::AcqRel);
    res
}

fn commit_slices(
    vol: &Volume,
    up: Option<&BlockUploader>,
    ino: Ino,
    taken: Buffer,
) -> Result<Vec<Committed>> {
    let mut done: Vec<Committed> = Vec::new();
    for (indx, slices) in taken.chunks {
        for p in slices {
            let slice = p.finish(vol, up)?;
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
    /// An empty write buffer that stores every block at commit.
    pub fn new() -> FileWriter {
        FileWriter::default()
    }

    /// An empty write buffer that counts its bytes in `budget`, a counter
    /// shared by the writers of one file system, and hands full blocks to
    /// `uploader` as they fill.
    pub fn with_uploader(budget: Arc<AtomicUsize>, uploader: Arc<BlockUploader>) -> FileWriter {
        FileWriter {
            budget,
            uploader: Some(uploader),
            ..FileWriter::default()
        }
    }

    /// Buffers `data` at file offset `off`; returns the bytes now buffered.
    /// Blocks it fills start uploading (which may fail here only for want
    /// of a slice id; an upload's own failure reaches the commit).
    pub fn write(&self, off: u64, data: &[u8]) -> Result<usize> {
        let end = off
            .checked_add(data.len() as u64)
            .filter(|e| *e / CHUNK_SIZE <= u64::from(u32::MAX))
            .ok_or(Error::FileTooBig)?;
        let bs = self
            .uploader
            .as_ref()
            .map_or(DEFAULT_BLOCK, |u| u.vol.block_size as usize);
        let mut b = self.buf.lock();
        let mut at = off;
        let mut rest = data;
        while !rest.is_empty() {
            let indx = (at / CHUNK_SIZE) as u32;
            let coff = at % CHUNK_SIZE;
            let n = ((CHUNK_SIZE - coff) as usize).min(rest.len());
            let (part, tail) = rest.split_at(n);
            let spares = self.uploader.as_ref().and_then(|u| u.cache.as_deref());
            let p = add(b.chunks.entry(indx).or_default(), bs, coff, part, spares);
            if let Some(up) = &self.uploader {
                p.seal_full(&up.vol, up, bs)?;
            }
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
    pub fn flush(&self, vol: &Volume, ino: Ino) -> Result<Vec<Committed>> {
        let mut bg = self.flushing.lock();
        let mut done = join(bg.take())?;
        let taken = std::mem::take(&mut *self.buf.lock());
        let up = self.uploader.as_deref();
        done.extend(commit_buffer(vol, up, ino, taken, &self.budget)?);
        Ok(done)
    }

    /// Starts committing the buffered writes in the background, so the
    /// writer can keep filling the buffer meanwhile (at most one commit runs
    /// per file). Returns what the previous background commit committed.
    pub fn flush_behind(&self, vol: &Arc<Volume>, ino: Ino) -> Result<Vec<Committed>> {
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
        let up = self.uploader.clone();
        *bg = Some(
            std::thread::Builder::new()
                .name("sluice-writeback".into())
                .spawn(move || commit_buffer(&vol, up.as_deref(), ino, taken, &budget))?,
        );
        done
    }
}

/// The block size a writer without an uploader splits slices by (JuiceFS's
/// default; such a writer only serves tests of the buffer layout).
const DEFAULT_BLOCK: usize = 4 << 20;

/// Adds a write at chunk offset `coff` to a chunk's pending slices and
/// returns the slice that took it.
fn add<'a>(
    slices: &'a mut Vec<Pending>,
    bs: usize,
    coff: u64,
    data: &[u8],
    spares: Option<&BlockCache>,
) -> &'a mut Pending {
    let (a, b) = (coff, coff + data.len() as u64);
    // Newest first: the first slice the write overlaps or touches decides.
    let mut into = None;
    for (i, p) in slices.iter().enumerate().rev() {
        let (pa, pb) = (u64::from(p.pos), p.end());
        if a >= pa && a <= pb && a - pa >= (p.sealed * bs) as u64 {
            into = Some(i);
            break;
        }
        if a < pb && b > pa {
            // Overlaps an older region without starting inside it, or starts
            // in a sealed block: a new slice must win over this one.
            break;
        }
    }
    let i = into.unwrap_or_else(|| {
        slices.push(Pending::new(coff as u32));
        slices.len() - 1
    });
    let p = &mut slices[i];
    p.put(bs, (a - u64::from(p.pos)) as usize, data, spares);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(w: &FileWriter) -> Vec<(u32, u32, Vec<u8>)> {
        let b = w.buf.lock();
        b.chunks
            .iter()
            .flat_map(|(i, v)| v.iter().map(move |p| (*i, p.pos, p.blocks.concat())))
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
