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
//! each slice is stored and its uploads are waited for; the stored slices
//! then go to the volume's group commit ([`crate::commit`]), which makes
//! their objects durable and records them with `Store::write_chunk`, in
//! write order, with the commits of other files. So a sequential writer's
//! fsync waits for about one block, not for the whole buffer, and a commit
//! is never durable before the objects it names. A close does not wait for
//! its group ([`FileWriter::commit_behind`]); everything else that commits
//! does. Each committed chunk is dropped from the reader's [`ChunkCache`]
//! before the commit is reported done, and a commit that fails keeps its
//! writes for the next try (the durability, coherence and sticky-error
//! rules of `engine/DESIGN.md`).

use std::collections::BTreeMap;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};
use sluice_api::source::WriteSource;

use crate::block_cache::BlockCache;
use crate::block_key::{block_count, block_key, block_len, slice_keys};
use crate::chunk_cache::ChunkCache;
use crate::commit::{self, Committer, Outcome};
use crate::compress::compress;
use crate::error::{Error, Result};
use crate::meta::{CHUNK_SIZE, ChunkWrite, Ino, Slice, Timestamp};
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

/// The uploads of one slice's sealed blocks: how many still run, the first
/// failure, and the bytes of the blocks that failed (kept for a retry).
#[derive(Debug, Default)]
struct Uploads {
    state: Mutex<UploadState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct UploadState {
    running: usize,
    error: Option<Error>,
    failed: Vec<(u32, Vec<u8>)>,
}

impl Uploads {
    fn start(&self) {
        self.state.lock().running += 1;
    }

    /// Block `indx` was stored (`res` is Ok) or not; a block that failed
    /// comes back with its bytes.
    fn finish(&self, indx: u32, res: std::result::Result<(), (Error, Vec<u8>)>) {
        let mut st = self.state.lock();
        st.running -= 1;
        if let Err((e, data)) = res {
            if st.error.is_none() {
                st.error = Some(e);
            }
            st.failed.push((indx, data));
        }
        if st.running == 0 {
            self.done.notify_all();
        }
    }

    /// Waits until every upload ended; the first failure and the blocks
    /// that failed, if any.
    fn wait(&self) -> (Result<()>, Vec<(u32, Vec<u8>)>) {
        let mut st = self.state.lock();
        while st.running > 0 {
            self.done.wait(&mut st);
        }
        let failed = std::mem::take(&mut st.failed);
        (st.error.take().map_or(Ok(()), Err), failed)
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
                            match store_block(&vol, job.id, job.indx, &job.data) {
                                Ok(()) => {
                                    job.uploads.finish(job.indx, Ok(()));
                                    if let Some(cache) = &cache {
                                        cache.give_buffer(job.data);
                                    }
                                }
                                Err(e) => job.uploads.finish(job.indx, Err((e, job.data))),
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
            job.uploads.finish(job.indx, res.map_err(|e| (e, job.data)));
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
    /// The slice's bytes, one buffer per block. A block's buffer is empty
    /// once the block is stored or while the uploader stores it; a block
    /// whose store failed gets its bytes back for the next try.
    blocks: Vec<Vec<u8>>,
    /// The slice's length in bytes.
    len: usize,
    /// Leading blocks sealed (being stored, stored, or failed and waiting
    /// for a retry; never written again).
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

    /// Writes the next `len` bytes of `data` at slice offset `start` (at
    /// most the slice's length, and past its sealed blocks), growing the
    /// slice as needed: each byte is copied once, from the source into its
    /// block's buffer. Whole-block buffers come from `spares` when it has
    /// one (warm memory). When the source fails, the bytes taken before
    /// stay written (the slice's length covers them) and the error is
    /// returned.
    fn put(
        &mut self,
        bs: usize,
        mut start: usize,
        len: usize,
        data: &mut dyn WriteSource,
        spares: Option<&BlockCache>,
    ) -> Result<()> {
        debug_assert!(start <= self.len && start >= self.sealed * bs);
        let end = start + len;
        let mut taken = Ok(());
        while start < end {
            let (i, o) = (start / bs, start % bs);
            if i == self.blocks.len() {
                // A big write fills whole blocks: give the buffer its full
                // size at once rather than growing it by copies.
                let buf = if end - start >= BIG_WRITE {
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
            let n = (bs - o).min(end - start);
            let overlap = b.len().saturating_sub(o).min(n);
            taken = data
                .take(&mut b[o..o + overlap])
                .and_then(|()| data.take_append(b, n - overlap));
            if taken.is_err() {
                // What reached the block counts; nothing past it does.
                start = (i * bs + b.len()).max(start);
                if b.is_empty() && i + 1 == self.blocks.len() {
                    self.blocks.pop();
                }
                break;
            }
            start += n;
        }
        self.len = self.len.max(start);
        taken
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

    /// Stores every block not stored yet (all but the last through the
    /// uploader when there is one, the last on this thread), waits for every
    /// upload of the slice and returns its record. On failure the slice
    /// keeps the bytes of each block that was not stored (and its id), so
    /// calling this again retries just those blocks.
    fn finish(&mut self, vol: &Volume, up: Option<&BlockUploader>) -> Result<Slice> {
        let size = u32::try_from(self.len)
            .map_err(|_| Error::Invalid("a slice cannot exceed 4 GiB".into()))?;
        let id = match self.id {
            Some(id) => id,
            None => *self.id.insert(vol.meta.new_slice_id()?),
        };
        let last = self.blocks.len().saturating_sub(1);
        let mut inline = Ok(());
        for i in 0..self.blocks.len() {
            if self.blocks[i].is_empty() {
                // Stored, or being stored by the uploader.
                continue;
            }
            match up {
                Some(up) if i < last => up.submit(Job {
                    id,
                    indx: i as u32,
                    data: std::mem::take(&mut self.blocks[i]),
                    uploads: self.uploads.clone(),
                }),
                _ => {
                    if let Err(e) = store_block(vol, id, i as u32, &self.blocks[i]) {
                        if inline.is_ok() {
                            inline = Err(e);
                        }
                        continue;
                    }
                    let data = std::mem::take(&mut self.blocks[i]);
                    let Some(cache) = up.and_then(|u| u.cache.as_ref()) else {
                        continue;
                    };
                    if data.len() < vol.block_size as usize {
                        // The cache moves the bytes into a buffer of their
                        // size and keeps the block-sized one as a spare.
                        cache.insert((id, i as u32), Arc::new(data));
                    } else {
                        cache.give_buffer(data);
                    }
                }
            }
        }
        self.sealed = self.blocks.len();
        let (uploaded, failed) = self.uploads.wait();
        for (i, data) in failed {
            self.blocks[i as usize] = data;
        }
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
    /// When the latest buffered write was made: the mtime (and ctime) its
    /// commit records, as a write on a local file system sets them.
    mtime: Option<Timestamp>,
}

/// A chunk that a flush committed, with its slice count after the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The chunk index.
    pub indx: u32,
    /// How many slices the chunk holds now.
    pub slices: usize,
}

/// What a commit handed on without waiting ([`FileWriter::commit_behind`])
/// calls once its group ran, with the chunks it committed.
pub type OnCommitted = Box<dyn FnOnce(&[Committed]) + Send>;

/// A commit handed to the group commit: done once the group ran.
#[derive(Debug, Default)]
struct Ticket {
    /// Set when the group ran: the chunks committed, and the commit's own
    /// error (taken by the caller that waits for it; a commit nobody waits
    /// for reports it through the file's error count).
    result: Mutex<Option<(Vec<Committed>, Option<Error>)>>,
    done: Condvar,
}

impl Ticket {
    fn finish(&self, committed: Vec<Committed>, error: Option<Error>) {
        *self.result.lock() = Some((committed, error));
        self.done.notify_all();
    }

    fn is_finished(&self) -> bool {
        self.result.lock().is_some()
    }

    /// Waits until the group ran; the chunks committed and the error.
    fn wait(&self) -> (Vec<Committed>, Option<Error>) {
        let mut r = self.result.lock();
        loop {
            if let Some((done, e)) = r.as_mut() {
                return (std::mem::take(done), e.take());
            }
            self.done.wait(&mut r);
        }
    }
}

/// The write buffer of one inode, shared by all its open handles.
///
/// Write errors are sticky: a commit that fails keeps its writes (they go
/// back to the front of the buffer and every later flush tries them again)
/// and counts one more error in [`FileWriter::errors`], which the handles
/// compare with what they last reported (errseq, as the kernel keeps it for
/// page-cache writeback).
#[derive(Debug, Default)]
pub struct FileWriter {
    buf: Mutex<Buffer>,
    /// Serialises commits, so slices commit in write order and a reader that
    /// flushes first sees every write made before it. Holds the last commit
    /// handed on (to a background thread or the group commit) until someone
    /// waits for it; whoever holds the lock waits for that commit before
    /// committing anything else.
    flushing: Mutex<Option<Arc<Ticket>>>,
    /// Whether a commit handed on has not run yet (read without the
    /// commit lock, by whoever decides that an unused writer may go).
    pending: AtomicBool,
    /// The mtime a commit handed on will record, until it ran.
    pending_mtime: Mutex<Option<Timestamp>>,
    /// The bytes of writes a commit handed on will record, until it ran
    /// (with the buffer's, what a stat adds to the stored bytes).
    pending_bytes: AtomicUsize,
    /// Bytes buffered by every writer sharing this counter (one per Vfs),
    /// until their commit ends.
    budget: Arc<AtomicUsize>,
    /// Stores full blocks while the file is written (None: every block is
    /// stored at commit, on the committing thread).
    uploader: Option<Arc<BlockUploader>>,
    /// The resolved slice lists of the reader: each chunk committed is
    /// dropped from it before the commit is reported done.
    chunks: Option<Arc<ChunkCache>>,
    /// The volume's group commit (None: each commit is a group of its own,
    /// run on the committing thread).
    committer: Option<Arc<Committer>>,
    /// A counter shared by the writers of one file system (the Vfs's,
    /// [`FileWriter::with_uploader`]), bumped when one of their commits has
    /// run, before the writer lets go of its writes.
    landed: Option<Arc<AtomicU64>>,
    /// The value `landed` took at this writer's last bump.
    landed_at: AtomicU64,
    /// Commits that failed so far (the error sequence handles compare).
    errors: AtomicU64,
    /// Whether the last commit failed (the first failure of a run of them is
    /// logged; the rest would repeat it).
    failing: AtomicBool,
    /// Whether the last failed commit was refused for a limit (volume
    /// capacity or inodes, a directory quota): its writes were dropped, and
    /// handles report that error rather than EIO.
    refused: Mutex<Option<LimitError>>,
}

/// A commit refused because it would pass a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitError {
    /// The volume's capacity or inode limit (ENOSPC).
    NoSpace,
    /// A directory quota (EDQUOT).
    Quota,
}

impl LimitError {
    fn of(e: &Error) -> Option<LimitError> {
        match e {
            Error::NoSpace => Some(LimitError::NoSpace),
            Error::QuotaExceeded => Some(LimitError::Quota),
            _ => None,
        }
    }

    /// The error a handle reports for it.
    pub fn error(self) -> Error {
        match self {
            LimitError::NoSpace => Error::NoSpace,
            LimitError::Quota => Error::QuotaExceeded,
        }
    }
}

/// A taken buffer whose slices are stored: what the group commit records.
#[derive(Debug)]
struct Staged {
    /// Every pending slice in write order (chunk by chunk, oldest first),
    /// with its stored record.
    slices: Vec<(u32, Pending, Slice)>,
    /// The bytes the buffer counted, the file end it reached, and when
    /// its latest write was made.
    bytes: usize,
    end: u64,
    mtime: Option<Timestamp>,
}

/// Stores the slices of a taken buffer (every block not stored yet; the
/// uploads of sealed blocks are waited for). On failure the whole buffer
/// comes back with the error: slices keep the blocks that were stored (and
/// their ids), so a retry stores only what is missing.
fn stage(
    vol: &Volume,
    up: Option<&BlockUploader>,
    mut taken: Buffer,
) -> std::result::Result<Staged, (Error, Buffer)> {
    let mut queue: Vec<(u32, Pending)> = std::mem::take(&mut taken.chunks)
        .into_iter()
        .flat_map(|(indx, slices)| slices.into_iter().map(move |p| (indx, p)))
        .collect();
    let mut records = Vec::with_capacity(queue.len());
    for (_, p) in &mut queue {
        match p.finish(vol, up) {
            Ok(slice) => records.push(slice),
            Err(e) => {
                for (indx, p) in queue {
                    taken.chunks.entry(indx).or_default().push(p);
                }
                return Err((e, taken));
            }
        }
    }
    Ok(Staged {
        slices: queue
            .into_iter()
            .zip(records)
            .map(|((indx, p), s)| (indx, p, s))
            .collect(),
        bytes: taken.bytes,
        end: taken.end,
        mtime: taken.mtime,
    })
}

impl FileWriter {
    /// An empty write buffer that stores every block at commit.
    pub fn new() -> FileWriter {
        FileWriter::default()
    }

    /// An empty write buffer that counts its bytes in `budget`, a counter
    /// shared by the writers of one file system, hands full blocks to
    /// `uploader` as they fill, and drops each chunk it commits from
    /// `chunks` (the reader's resolved slice lists), and bumps `landed`
    /// each time a commit has run, before it lets go of the commit's
    /// writes ([`FileWriter::landed_at`]).
    pub fn with_uploader(
        budget: Arc<AtomicUsize>,
        uploader: Arc<BlockUploader>,
        chunks: Arc<ChunkCache>,
        committer: Arc<Committer>,
        landed: Arc<AtomicU64>,
    ) -> FileWriter {
        FileWriter {
            budget,
            landed: Some(landed),
            uploader: Some(uploader),
            chunks: Some(chunks),
            committer: Some(committer),
            ..FileWriter::default()
        }
    }

    /// Buffers the bytes of `data` at file offset `off`, taking them from
    /// it straight into the slice buffers (one copy); returns the bytes now
    /// buffered. Blocks it fills start uploading (which may fail here only
    /// for want of a slice id; an upload's own failure reaches the commit).
    /// When the source or a slice id fails part way, what was taken before
    /// stays buffered and counted, and the error is returned.
    pub fn write(&self, off: u64, data: &mut dyn WriteSource) -> Result<usize> {
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
        let mut written = Ok(());
        while at < end {
            let indx = (at / CHUNK_SIZE) as u32;
            let coff = at % CHUNK_SIZE;
            let n = ((CHUNK_SIZE - coff) as usize).min((end - at) as usize);
            let spares = self.uploader.as_ref().and_then(|u| u.cache.as_deref());
            let slices = b.chunks.entry(indx).or_default();
            let sealed = match add(slices, bs, coff, n, data, spares) {
                Ok(p) => {
                    let sealed = match &self.uploader {
                        Some(up) => p.seal_full(&up.vol, up, bs),
                        None => Ok(()),
                    };
                    // Counted in the buffer and the budget alike: a commit
                    // gives back what the buffer counts. (A source that
                    // failed part way counts nothing; what it left in a
                    // slice is committed uncounted.)
                    b.bytes += n;
                    self.budget.fetch_add(n, Ordering::AcqRel);
                    sealed
                }
                Err(e) => Err(e),
            };
            if let Err(e) = sealed {
                // The chunk's slices reach as far as the bytes taken.
                let reached = b
                    .chunks
                    .get(&indx)
                    .and_then(|v| v.iter().map(Pending::end).max());
                if let Some(reached) = reached {
                    b.end = b.end.max(u64::from(indx) * CHUNK_SIZE + reached);
                } else {
                    b.chunks.remove(&indx);
                }
                written = Err(e);
                break;
            }
            at += n as u64;
        }
        b.mtime = Some(Timestamp::now());
        if written.is_ok() {
            b.end = b.end.max(end);
        } else if at > off {
            // The parts before the one that failed.
            b.end = b.end.max(at);
        }
        written.map(|()| b.bytes)
    }

    /// The file end the buffered writes reach (0 when nothing is buffered).
    pub fn end(&self) -> u64 {
        self.buf.lock().end
    }

    /// Whether writes are buffered.
    pub fn is_dirty(&self) -> bool {
        self.buf.lock().bytes > 0
    }

    /// How many commits of this file have failed so far: a handle that saw
    /// fewer has an error to report (errseq).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Acquire)
    }

    /// Whether the last failed commit was refused for a limit (its writes
    /// were dropped, as JuiceFS drops them: trying again cannot succeed
    /// until something else frees space).
    pub fn refused(&self) -> Option<LimitError> {
        *self.refused.lock()
    }

    /// Whether buffering `len` more bytes would wait: the buffer would
    /// reach `limit`, so the write starts a commit behind it, which first
    /// waits for the one still running (or for the commit lock, held by a
    /// commit). A transport's worker that must not wait hands such a write
    /// on before it takes any of its bytes (`Vfs`'s `write`).
    pub fn write_would_wait(&self, len: usize, limit: usize) -> bool {
        if self.buf.lock().bytes.saturating_add(len) < limit {
            return false;
        }
        match self.flushing.try_lock() {
            Some(bg) => bg.as_ref().is_some_and(|t| !t.is_finished()),
            None => true,
        }
    }

    /// Whether a [`FileWriter::flush`] now would have nothing to commit and
    /// nothing to wait for: no buffered writes, no commit handed on that has
    /// not run, no other thread committing.
    pub fn nothing_to_flush(&self) -> bool {
        match self.flushing.try_lock() {
            Some(bg) => {
                bg.as_ref().is_none_or(|t| t.is_finished()) && self.buf.lock().chunks.is_empty()
            }
            None => false,
        }
    }

    /// Whether a commit handed on (by [`FileWriter::commit_behind`] or
    /// [`FileWriter::flush_behind`]) has not run yet.
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// The value of the shared `landed` counter when this writer's last
    /// commit ran (0: none yet). Read after the writer's state: attributes
    /// read before the counter reached it may lack that commit, which the
    /// state no longer shows.
    pub fn landed_at(&self) -> u64 {
        self.landed_at.load(Ordering::Acquire)
    }

    fn clear_pending(&self) {
        // First the count: whoever sees the writes gone from here sees it.
        if let Some(l) = &self.landed {
            let at = l.fetch_add(1, Ordering::AcqRel) + 1;
            self.landed_at.store(at, Ordering::Release);
        }
        *self.pending_mtime.lock() = None;
        self.pending_bytes.store(0, Ordering::Release);
        self.pending.store(false, Ordering::Release);
    }

    /// Takes the buffered writes for a commit. Their mtime becomes the
    /// pending one under the buffer's lock, before the lock is let go: a
    /// stat while their blocks are stored (which can take long) must still
    /// see it, as it sees their length (`OpenFile::length`). Between
    /// taking the buffer and handing the commit on, neither the buffer nor
    /// the pending mtime held it, and a stat then showed the mtime from
    /// before the writes (the `requests` fuzz target, on a read-only
    /// export whose host had just closed a file).
    fn take_buffer(&self) -> Buffer {
        let mut b = self.buf.lock();
        let taken = std::mem::take(&mut *b);
        if !taken.chunks.is_empty() {
            let mut pending = self.pending_mtime.lock();
            *pending = (*pending).max(taken.mtime);
            self.pending_bytes.fetch_add(taken.bytes, Ordering::AcqRel);
        }
        taken
    }

    /// A commit whose blocks could not be stored: its writes went back to
    /// the buffer (or were dropped), whose mtime now stands for them.
    fn stage_failed(&self, ino: Ino, e: &Error, left: Buffer) {
        self.failed(ino, e, left);
        if !self.pending.load(Ordering::Acquire) {
            *self.pending_mtime.lock() = None;
            self.pending_bytes.store(0, Ordering::Release);
        }
    }

    /// The mtime writes not recorded yet — buffered, or handed on to a
    /// commit that has not run — will record when they are: what `stat`
    /// shows meanwhile, as a write on a local file system moves mtime at
    /// once. None when every write is recorded.
    pub fn unrecorded_mtime(&self) -> Option<Timestamp> {
        let buffered = {
            let b = self.buf.lock();
            if b.chunks.is_empty() { None } else { b.mtime }
        };
        let pending = *self.pending_mtime.lock();
        buffered.max(pending)
    }

    /// The bytes of writes that attributes whose mtime is `recorded` do
    /// not count yet (buffered, or handed on to a commit that has not
    /// run), counted as written (overlapping writes twice): what a stat
    /// adds to the bytes the file stores meanwhile. Writes whose mtime
    /// `recorded` already reaches are in the attributes (a commit that
    /// landed before its writer let go of them), and are not added twice.
    pub fn unrecorded_bytes(&self, recorded: Timestamp) -> u64 {
        let buffered = {
            let b = self.buf.lock();
            match b.mtime {
                Some(t) if t > recorded && !b.chunks.is_empty() => b.bytes,
                _ => 0,
            }
        };
        let pending = match *self.pending_mtime.lock() {
            Some(t) if t > recorded => self.pending_bytes.load(Ordering::Acquire),
            _ => 0,
        };
        (buffered + pending) as u64
    }

    /// Stores and commits every buffered write, in write order, after any
    /// commit handed on before (a failed one's writes are part of this
    /// commit). Waits for the group commit. Returns the chunks changed. On
    /// failure the writes not committed stay buffered for the next flush,
    /// and the error is counted in [`FileWriter::errors`].
    pub fn flush(self: &Arc<Self>, vol: &Arc<Volume>, ino: Ino) -> Result<Vec<Committed>> {
        let mut bg = self.flushing.lock();
        let mut done = self.join(bg.take());
        let taken = self.take_buffer();
        if taken.chunks.is_empty() {
            self.budget.fetch_sub(taken.bytes, Ordering::AcqRel);
            return Ok(done);
        }
        let staged = match stage(vol, self.uploader.as_deref(), taken) {
            Ok(s) => s,
            Err((e, left)) => {
                self.stage_failed(ino, &e, left);
                return Err(e);
            }
        };
        let ticket = Arc::new(Ticket::default());
        self.hand_on(vol, ino, staged, &ticket, true, None);
        let (committed, error) = ticket.wait();
        done.extend(committed);
        match error {
            None => Ok(done),
            Some(e) => Err(e),
        }
    }

    /// Stores the buffered writes and hands them to the group commit
    /// without waiting for it (a close: `close(2)` need not wait for
    /// durability, as on a local file system). Anything that needs the
    /// commit — a read, fsync, the next commit of the file — waits for it
    /// first. `done` is called on the committer's thread once the group
    /// ran, with the chunks committed (a failure is counted for the handles
    /// to report, and its writes are kept, as any failed commit's). A store
    /// that fails here is reported at once.
    pub fn commit_behind(
        self: &Arc<Self>,
        vol: &Arc<Volume>,
        ino: Ino,
        done: OnCommitted,
    ) -> Result<Vec<Committed>> {
        let mut bg = self.flushing.lock();
        // One commit of a file at a time, in write order.
        let earlier = self.join(bg.take());
        let taken = self.take_buffer();
        if taken.chunks.is_empty() {
            self.budget.fetch_sub(taken.bytes, Ordering::AcqRel);
            return Ok(earlier);
        }
        let staged = match stage(vol, self.uploader.as_deref(), taken) {
            Ok(s) => s,
            Err((e, left)) => {
                self.stage_failed(ino, &e, left);
                return Err(e);
            }
        };
        let ticket = Arc::new(Ticket::default());
        *bg = Some(ticket.clone());
        self.hand_on(vol, ino, staged, &ticket, false, Some(done));
        Ok(earlier)
    }

    /// Starts committing the buffered writes in the background, so the
    /// writer can keep filling the buffer meanwhile (at most one commit runs
    /// per file), if the buffer still holds `limit` bytes once the commit
    /// lock is taken: several writers that filled it at once (waiter
    /// threads, the host mount's workers) start one commit, not one each
    /// behind the other's. Returns what the previous commit handed on
    /// committed; if it failed, its writes are part of this commit (and the
    /// error is counted for the handles to report).
    pub fn flush_behind(
        self: &Arc<Self>,
        vol: &Arc<Volume>,
        ino: Ino,
        limit: usize,
    ) -> Result<Vec<Committed>> {
        let mut bg = self.flushing.lock();
        if self.buf.lock().bytes < limit {
            // Another writer took the buffer while this one waited.
            return Ok(Vec::new());
        }
        let done = self.join(bg.take());
        // Keep `end` so the file length still counts these writes until the
        // next full flush has committed them.
        let taken = {
            let mut b = self.buf.lock();
            let taken = Buffer {
                chunks: std::mem::take(&mut b.chunks),
                bytes: std::mem::take(&mut b.bytes),
                end: b.end,
                mtime: b.mtime,
            };
            // Pending before the buffer's lock goes (see `take_buffer`).
            *self.pending_mtime.lock() = taken.mtime;
            self.pending_bytes.store(taken.bytes, Ordering::Release);
            taken
        };
        let ticket = Arc::new(Ticket::default());
        self.pending.store(true, Ordering::Release);
        let (me, vol, t) = (self.clone(), vol.clone(), ticket.clone());
        // Storing a full buffer waits for its uploads: on a thread of its
        // own, which then hands the slices to the group commit.
        std::thread::Builder::new()
            .name("sluice-writeback".into())
            .spawn(move || match stage(&vol, me.uploader.as_deref(), taken) {
                Ok(staged) => me.hand_on(&vol, ino, staged, &t, false, None),
                Err((e, left)) => {
                    me.failed(ino, &e, left);
                    me.clear_pending();
                    t.finish(Vec::new(), Some(e));
                }
            })?;
        *bg = Some(ticket);
        Ok(done)
    }

    /// Hands stored slices to the group commit (or, for a writer without
    /// one, commits them here); `ticket` is finished once they ran, after
    /// their outcome was applied to this writer.
    fn hand_on(
        self: &Arc<Self>,
        vol: &Arc<Volume>,
        ino: Ino,
        staged: Staged,
        ticket: &Arc<Ticket>,
        waited: bool,
        done: Option<OnCommitted>,
    ) {
        let now = staged.mtime.unwrap_or_else(Timestamp::now);
        let writes: Vec<ChunkWrite> = staged
            .slices
            .iter()
            .map(|(indx, _, slice)| ChunkWrite {
                ino,
                indx: *indx,
                slice: *slice,
                mtime: now,
            })
            .collect();
        let keys: Vec<String> = staged
            .slices
            .iter()
            .flat_map(|(_, _, s)| slice_keys(vol.name(), s.id, s.size, vol.block_size))
            .collect();
        *self.pending_mtime.lock() = Some(now);
        self.pending.store(true, Ordering::Release);
        let (me, t) = (self.clone(), ticket.clone());
        let job = commit::Job {
            ino,
            keys,
            writes,
            waited,
            done: Box::new(move |outcome| {
                let committed = me.apply(ino, staged, outcome, &t);
                if let Some(done) = done {
                    done(&committed);
                }
            }),
        };
        match &self.committer {
            Some(c) => c.submit(job),
            None => commit::commit_now(vol, self.chunks.as_ref(), job),
        }
    }

    /// Applies what the group commit did with `staged`: the memory of what
    /// was committed is given back; a failure puts the writes back in front
    /// of newer ones (or drops them: a refused commit, objects the disk
    /// could not make durable, or a file removed meanwhile) and counts the
    /// error. Then finishes `ticket`. Returns the chunks committed.
    fn apply(&self, ino: Ino, staged: Staged, outcome: Outcome, ticket: &Ticket) -> Vec<Committed> {
        let result = match outcome {
            Outcome::Recorded(r) => r,
            Outcome::Unsynced(e) => {
                // The blocks' bytes are gone from the buffer and their
                // objects may be torn: these writes cannot be tried again.
                // As Linux drops pages whose write-back failed, they are
                // dropped, and fsync and close report EIO once per handle.
                self.budget.fetch_sub(staged.bytes, Ordering::AcqRel);
                self.errors.fetch_add(1, Ordering::AcqRel);
                *self.refused.lock() = None;
                log::error!(
                    "inode {ino}: {} bytes of writes are lost: their objects could not be made durable ({e})",
                    staged.bytes
                );
                self.clear_pending();
                ticket.finish(Vec::new(), Some(e));
                return Vec::new();
            }
        };
        let mut committed: Vec<Committed> = Vec::new();
        let applied = result.counts.len();
        for ((indx, _, _), count) in staged.slices.iter().zip(&result.counts) {
            match committed.last_mut() {
                Some(c) if c.indx == *indx => c.slices = *count,
                _ => committed.push(Committed {
                    indx: *indx,
                    slices: *count,
                }),
            }
        }
        let error = match result.error {
            None if applied < staged.slices.len() => Some(Error::Invalid(format!(
                "inode {ino}: the metadata engine recorded {applied} of {} slices",
                staged.slices.len()
            ))),
            e => e,
        };
        let total = staged.bytes;
        let mut kept = 0;
        let error = match error {
            None => {
                self.failing.store(false, Ordering::Release);
                None
            }
            Some(Error::NotFound) => {
                // Removed (and closed everywhere) before this commit ran:
                // nothing can read these writes any more.
                log::debug!("inode {ino}: removed before its last writes were recorded");
                None
            }
            Some(e) => {
                let mut left = Buffer {
                    end: staged.end,
                    mtime: staged.mtime,
                    ..Buffer::default()
                };
                for (indx, p, _) in staged.slices.into_iter().skip(applied) {
                    left.chunks.entry(indx).or_default().push(p);
                }
                left.bytes = left
                    .chunks
                    .values()
                    .flatten()
                    .map(|p| p.len)
                    .sum::<usize>()
                    .min(total);
                kept = left.bytes;
                self.failed(ino, &e, left);
                Some(e)
            }
        };
        // The memory of what was committed (or dropped) is given back; what
        // is kept for a retry stays counted (`failed` gives a refused
        // commit's back itself).
        self.budget.fetch_sub(total - kept, Ordering::AcqRel);
        self.clear_pending();
        ticket.finish(committed.clone(), error);
        committed
    }

    /// Drops the buffered writes (the last handle closed and the writes
    /// could not be stored: the error was reported at flush or fsync),
    /// without waiting for anything — no commit lock, so it is safe on the
    /// committer's thread and under the `Vfs`'s lock of open files. Returns
    /// how many bytes went.
    pub fn drop_buffered(&self) -> usize {
        let taken = std::mem::take(&mut *self.buf.lock());
        self.budget.fetch_sub(taken.bytes, Ordering::AcqRel);
        taken.bytes
    }

    /// Waits for a commit handed on (the caller holds `flushing`); its
    /// outcome was applied to this writer when it ran. Returns the chunks
    /// it committed.
    fn join(&self, bg: Option<Arc<Ticket>>) -> Vec<Committed> {
        bg.map(|t| t.wait().0).unwrap_or_default()
    }

    /// A commit failed: its writes go back in front of newer ones, the
    /// error is counted, and the first of a run of failures is logged.
    fn failed(&self, ino: Ino, e: &Error, left: Buffer) {
        let bytes = left.bytes;
        let limit = LimitError::of(e);
        *self.refused.lock() = limit;
        if limit.is_some() {
            // A refused commit is not tried again: its writes go (and their
            // memory with them), as JuiceFS drops a slice refused with
            // ENOSPC or EDQUOT.
            self.budget.fetch_sub(left.bytes, Ordering::AcqRel);
            self.errors.fetch_add(1, Ordering::AcqRel);
            log::warn!("inode {ino}: {bytes} bytes of writes were refused and dropped: {e}");
            return;
        }
        {
            let mut b = self.buf.lock();
            for (indx, mut older) in left.chunks {
                let newer = b.chunks.entry(indx).or_default();
                older.append(newer);
                *newer = older;
            }
            b.bytes += left.bytes;
            b.end = b.end.max(left.end);
            b.mtime = b.mtime.max(left.mtime);
        }
        self.errors.fetch_add(1, Ordering::AcqRel);
        if !self.failing.swap(true, Ordering::AcqRel) {
            log::error!(
                "inode {ino}: {bytes} bytes of writes could not be stored ({e}); \
                 they stay buffered and are tried again at the next flush, and \
                 fsync and close report EIO"
            );
        } else {
            log::debug!("inode {ino}: storing buffered writes failed again: {e}");
        }
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
    len: usize,
    data: &mut dyn WriteSource,
    spares: Option<&BlockCache>,
) -> Result<&'a mut Pending> {
    let (a, b) = (coff, coff + len as u64);
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
    if let Err(e) = p.put(bs, (a - u64::from(p.pos)) as usize, len, data, spares) {
        // A new slice that took nothing is no slice.
        if slices[i].len == 0 {
            slices.remove(i);
        }
        return Err(e);
    }
    Ok(&mut slices[i])
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

    /// A test's write of one buffer.
    trait WriteBuf {
        fn write_buf(&self, off: u64, data: &[u8]) -> Result<usize>;
    }

    impl WriteBuf for FileWriter {
        fn write_buf(&self, off: u64, data: &[u8]) -> Result<usize> {
            self.write(off, &mut sluice_api::SliceSource::new(data))
        }
    }

    /// A bucket whose puts wait at a gate while it is shut.
    #[derive(Debug)]
    struct PutGate {
        inner: crate::object::FileStore,
        open: Mutex<bool>,
        opened: Condvar,
        waiting: AtomicUsize,
    }

    impl crate::object::ObjectStore for PutGate {
        fn describe(&self) -> String {
            "put-gated".into()
        }
        fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let mut open = self.open.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
            drop(open);
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            self.inner.put(key, data, crc)
        }
        fn get(&self, key: &str) -> Result<Vec<u8>> {
            self.inner.get(key)
        }
        fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
            self.inner.get_range(key, off, len)
        }
        fn head(&self, key: &str) -> Result<crate::object::ObjectInfo> {
            self.inner.head(key)
        }
        fn delete(&self, key: &str) -> Result<()> {
            self.inner.delete(key)
        }
        fn list(&self, prefix: &str) -> Result<Vec<crate::object::ObjectInfo>> {
            self.inner.list(prefix)
        }
    }

    /// The regression of the `requests` fuzz target's finding: while a
    /// close stores its blocks, the writes' mtime is still what a stat
    /// shows (it was lost between taking the buffer and handing the commit
    /// on), and it is recorded once the commit ran.
    #[test]
    fn a_stat_while_a_close_stores_its_blocks_shows_the_writes_mtime() {
        use crate::meta::{Context, ROOT_INO, open_meta};
        let dir = tempfile::tempdir().unwrap();
        let meta = open_meta(&format!("sqlite3://{}/m.db", dir.path().display())).unwrap();
        let bucket = dir.path().join("bucket");
        crate::volume::format_volume(
            &*meta,
            "test",
            &bucket,
            1024,
            crate::format::Compression::None,
            0,
        )
        .unwrap();
        let store = Arc::new(PutGate {
            inner: crate::object::FileStore::new(&bucket).unwrap(),
            open: Mutex::new(false),
            opened: Condvar::new(),
            waiting: AtomicUsize::new(0),
        });
        let vol = crate::volume::open_volume(meta)
            .unwrap()
            .with_store(store.clone());
        let (ino, created) = vol
            .meta
            .create(&Context::default(), ROOT_INO, b"f", 0o644, 0)
            .unwrap();
        let w = Arc::new(FileWriter::new());
        w.write_buf(0, b"guest data").unwrap();
        let written = w.unrecorded_mtime().expect("buffered writes have an mtime");
        assert!(written >= created.mtime);
        let (w2, vol2) = (w.clone(), vol.clone());
        let closing =
            std::thread::spawn(move || w2.commit_behind(&vol2, ino, Box::new(|_| {})).map(|_| ()));
        while store.waiting.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // The buffer is taken and its block is being stored: its bytes
        // are still counted for attributes that do not record them.
        assert!(w.buf.lock().chunks.is_empty());
        assert_eq!(w.unrecorded_mtime(), Some(written));
        assert_eq!(w.unrecorded_bytes(created.mtime), 10);
        *store.open.lock() = true;
        store.opened.notify_all();
        closing.join().unwrap().unwrap();
        // Attributes that record the writes (their mtime) never get
        // their bytes added again, even before the writer lets go.
        assert_eq!(w.unrecorded_bytes(written), 0);
        w.flush(&vol, ino).unwrap();
        assert_eq!(w.unrecorded_mtime(), None);
        assert_eq!(w.unrecorded_bytes(created.mtime), 0);
        assert_eq!(vol.meta.getattr(ino).unwrap().mtime, written);
    }

    #[test]
    fn a_write_would_wait_only_past_the_limit_while_a_commit_runs() {
        let w = FileWriter::new();
        w.write_buf(0, &[1u8; 100]).unwrap();
        // Below the limit: no commit starts, nothing to wait for.
        assert!(!w.write_would_wait(50, 200));
        // At the limit with no commit running: a commit starts behind the
        // buffer, which waits for nothing.
        assert!(!w.write_would_wait(100, 200));
        // A commit holds the commit lock: the next one would wait for it.
        let held = w.flushing.lock();
        assert!(w.write_would_wait(100, 200));
        assert!(
            !w.write_would_wait(50, 200),
            "below the limit it never waits"
        );
        drop(held);
        // A commit handed on and not run yet: the same.
        let ticket = Arc::new(Ticket::default());
        *w.flushing.lock() = Some(ticket.clone());
        assert!(w.write_would_wait(100, 200));
        ticket.finish(Vec::new(), None);
        assert!(!w.write_would_wait(100, 200));
    }

    #[test]
    fn contiguous_writes_merge_and_overlaps_stack() {
        let w = FileWriter::new();
        w.write_buf(0, b"aaaa").unwrap();
        w.write_buf(4, b"bb").unwrap();
        w.write_buf(2, b"CC").unwrap(); // inside the newest slice: in place
        assert_eq!(layout(&w), [(0, 0, b"aaCCbb".to_vec())]);
        w.write_buf(100, b"zz").unwrap(); // elsewhere: a new slice
        w.write_buf(5, b"XYZ").unwrap(); // overlaps older slice 0 only: extends it
        assert_eq!(
            layout(&w),
            [(0, 0, b"aaCCbXYZ".to_vec()), (0, 100, b"zz".to_vec())]
        );
        w.write_buf(99, b"12345").unwrap(); // starts before the newest: new slice
        assert_eq!(layout(&w).len(), 3);
        assert_eq!(w.end(), 104);
        // A write across a chunk boundary splits.
        w.write_buf(CHUNK_SIZE - 2, b"abcd").unwrap();
        let l = layout(&w);
        assert_eq!(l[3], (0, (CHUNK_SIZE - 2) as u32, b"ab".to_vec()));
        assert_eq!(l[4], (1, 0, b"cd".to_vec()));
    }

    /// Write data that cannot be read past `fail_at` (guest memory gone).
    struct Failing {
        data: Vec<u8>,
        at: usize,
        fail_at: usize,
    }

    impl WriteSource for Failing {
        fn len(&self) -> usize {
            self.data.len() - self.at
        }
        fn take(&mut self, dst: &mut [u8]) -> Result<()> {
            sluice_api::source::check_len(self.len(), dst.len())?;
            let ok = dst.len().min(self.fail_at.saturating_sub(self.at));
            dst[..ok].copy_from_slice(&self.data[self.at..self.at + ok]);
            self.at += ok;
            if ok < dst.len() {
                return Err(Error::Io(std::io::Error::other("gone")));
            }
            Ok(())
        }
    }

    /// A source that fails part way leaves the buffer whole: what reached
    /// a slice stays (torn where it overwrote), no slice is made of
    /// nothing, and the buffer's count and the budget still agree.
    #[test]
    fn a_source_that_fails_part_way_leaves_the_buffer_whole() {
        let w = FileWriter::new();
        w.write_buf(0, b"0123456789").unwrap();
        let fail = |off: u64, fail_at: usize| {
            let mut src = Failing {
                data: b"abcdefghij".to_vec(),
                at: 0,
                fail_at,
            };
            assert!(w.write(off, &mut src).is_err());
        };
        fail(100, 0); // a new slice
        fail(10, 4); // appended to the slice
        assert_eq!(layout(&w), [(0, 0, b"0123456789".to_vec())]);
        fail(2, 2); // over the slice's bytes: torn
        assert_eq!(layout(&w), [(0, 0, b"01ab456789".to_vec())]);
        assert_eq!(w.end(), 10);
        assert_eq!(w.buf.lock().bytes, w.budget.load(Ordering::Acquire));
        // A source split into pieces lands as one buffer would.
        let mut src = Failing {
            data: b"abcdefghij".to_vec(),
            at: 0,
            fail_at: usize::MAX,
        };
        w.write(5, &mut src).unwrap();
        assert!(src.is_empty());
        assert_eq!(layout(&w), [(0, 0, b"01ab4abcdefghij".to_vec())]);
        assert_eq!(w.end(), 15);
    }
}
