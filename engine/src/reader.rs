//! The read path: (chunk, offset, length) → visible pieces → blocks.
//!
//! Blocks are normally fetched whole (and decompressed whole: a compressed
//! block cannot be read in part) and go through the block cache, so a
//! sequential reader of small requests fetches each block once. A random
//! reader's small read of a block that is not cached, on an uncompressed
//! volume, fetches only the bytes asked for (a ranged GET, as JuiceFS does):
//! a random 4 KiB reader must not pay for 4 MiB. Such a range cannot be
//! checked against the block's CRC32C (it covers the whole object);
//! sequential reads, readahead and larger reads fetch and check whole
//! blocks. Reads are
//! expressed as a walk over fragments (a stretch of zeros, or a range of a
//! cached block, or a range of a local file) so a caller can land the
//! bytes wherever it wants — a plain buffer for the host mount, guest
//! memory for virtio-fs — with one copy.

use std::collections::HashMap;
use std::sync::Arc;

use std::sync::mpsc;

use parking_lot::{Condvar, Mutex};

use crate::block_cache::{BlockCache, BlockId};
use crate::block_key::{block_key, block_len};
use crate::block_source::{Ask, BlockSource, SourcedBlock};
use crate::chunk::Piece;
use crate::chunk_cache::ChunkCache;
use crate::compress::decompress;
use crate::error::{Error, Result};
use crate::format::Compression;
use crate::meta::{CHUNK_SIZE, Ino};
use crate::volume::Volume;

pub use sluice_api::fragment::{BufDest, Fragment, ReadDest, SegmentCrcs, read_file_exact};

/// A block fetch in progress that other readers of the block wait for.
#[derive(Debug, Default)]
struct Flight {
    /// Set when the fetch ends: the block, or `None` if it failed (waiters
    /// then fetch it themselves and get their own error).
    done: Mutex<Option<Option<Arc<Vec<u8>>>>>,
    cv: Condvar,
}

/// Random reads of at most this many bytes fetch just those bytes of
/// blocks that are neither cached nor local (uncompressed volumes only):
/// a ranged GET. A larger one fetches the whole block, which serves its
/// neighbours too. The kernel's readahead asks for more at once, so it
/// never takes this path. A block in a local file (a `file://` object, a
/// disk-cache file) is handed out as a file range for a random read of any
/// size: reading it costs the same either way, and the transport may read
/// it straight into its destination.
const RANGED_READ_MAX: u32 = 64 << 10;

/// Threads that fetch blocks ahead of readers, unless configured otherwise.
pub const PREFETCH_THREADS: usize = 4;

/// Reads file data of one volume.
#[derive(Debug)]
pub struct Reader {
    vol: Arc<Volume>,
    cache: Arc<BlockCache>,
    /// Resolved slice lists, tied to write generations (shared with the
    /// writers, which invalidate what they commit).
    chunks: Arc<ChunkCache>,
    inflight: Mutex<HashMap<BlockId, Arc<Flight>>>,
    /// Blocks whose object failed its checksum: ranged reads of them fail
    /// too, though a range alone cannot be checked (the kernel retries a
    /// failed readahead page by page).
    damaged: Mutex<std::collections::HashSet<BlockId>>,
    /// Background jobs for the prefetch threads (None: stopped, or no
    /// threads).
    prefetch: Mutex<Option<mpsc::Sender<Job>>>,
    /// Bytes of background jobs queued and not yet finished.
    queued: std::sync::atomic::AtomicU64,
    /// Most bytes of background jobs at once; readahead windows shrink
    /// when they would pass it.
    budget: u64,
    /// Where blocks come from before this reader fetches them itself (the
    /// host daemon: `block_source`); unset: standalone.
    source: std::sync::OnceLock<Arc<dyn BlockSource>>,
}

/// Background work of the prefetch threads.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// Pull the file bytes (inode, offset, length) into the cache (at most
    /// one block, so that the threads fetch blocks in parallel).
    Range(Ino, u64, u64),
    /// Pull block `indx` of slice `id` (of `size` bytes) into the cache.
    Block(u64, u32, u32),
}

impl Job {
    /// Bytes the job brings in, at most.
    fn bytes(&self, bs: u32) -> u64 {
        match *self {
            Job::Range(_, _, len) => len,
            Job::Block(..) => u64::from(bs),
        }
    }
}

impl Reader {
    /// A reader over `vol` using `cache` for blocks, with `threads`
    /// background threads for readahead and prefetch (0: none), pinned to
    /// `cpus` when given: the blocks they fetch are allocated by them (first
    /// touch), so on the NUMA node of those CPUs — under `sluice serve`, the
    /// node of the guest's memory and of the workers that copy from them.
    pub fn new(
        vol: Arc<Volume>,
        cache: Arc<BlockCache>,
        threads: usize,
        cpus: Option<sluice_numa::CpuSet>,
    ) -> Arc<Reader> {
        let (tx, rx) = mpsc::channel::<Job>();
        // Background reads may hold up to half the memory cache (what they
        // fetch lands there), and at most 64 blocks.
        let bs = u64::from(vol.block_size);
        let budget = (cache.capacity() as u64 / 2).min(64 * bs);
        let reader = Arc::new(Reader {
            vol,
            cache,
            chunks: ChunkCache::new(),
            inflight: Mutex::new(HashMap::new()),
            damaged: Mutex::new(Default::default()),
            prefetch: Mutex::new((threads > 0).then_some(tx)),
            queued: Default::default(),
            budget,
            source: std::sync::OnceLock::new(),
        });
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let weak = Arc::downgrade(&reader);
            let rx = rx.clone();
            let cpus = cpus.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sluice-prefetch-{i}"))
                .spawn(move || {
                    if let Some(cpus) = cpus
                        && let Err(e) = sluice_numa::pinning::pin_current_thread_to(&cpus)
                    {
                        log::warn!("prefetch thread {i} stays unpinned: {e}");
                    }
                    loop {
                        let job = rx.lock().recv();
                        let Ok(job) = job else { return };
                        let Some(r) = weak.upgrade() else { return };
                        // Only the cache side effect matters; errors show up
                        // again (and are reported) when the data is read.
                        let _ = match job {
                            Job::Range(ino, off, len) => {
                                r.visit_with(ino, off, len, None, &mut |_| Ok(()))
                            }
                            Job::Block(id, size, indx) => match r.source.get() {
                                // The source fetches it once for every
                                // reader of the host; nothing is kept here.
                                Some(src) => match src.block(id, size, indx, Ask::Fetch) {
                                    Some(got) => got.map(drop),
                                    None => r.block(id, size, indx).map(drop),
                                },
                                None => r.block(id, size, indx).map(drop),
                            },
                        };
                        r.queued.fetch_sub(
                            job.bytes(r.vol.block_size),
                            std::sync::atomic::Ordering::Relaxed,
                        );
                    }
                });
            if let Err(e) = spawned {
                log::warn!("cannot start a prefetch thread: {e}");
            }
        }
        reader
    }

    /// Pulls the file bytes `off..off+len` of `ino` into the block cache in
    /// the background, a block per job so the threads share the work.
    pub fn prefetch(&self, ino: Ino, off: u64, len: u64) {
        let bs = u64::from(self.vol.block_size);
        let end = off + len;
        let mut at = off;
        while at < end {
            let stop = ((at / bs + 1) * bs).min(end);
            if !self.queue(Job::Range(ino, at, stop - at)) {
                return;
            }
            at = stop;
        }
    }

    /// How many more bytes background reads may bring in now.
    pub fn readahead_room(&self) -> u64 {
        self.budget
            .saturating_sub(self.queued.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Whether the memory cache has room for one more whole block beside
    /// what it holds and what background reads will bring in: a random
    /// reader's blocks are then fetched whole for free (nothing is evicted
    /// for them), however little credit the reader has.
    pub fn cache_has_room(&self) -> bool {
        let queued = self.queued.load(std::sync::atomic::Ordering::Relaxed);
        let bs = u64::from(self.vol.block_size);
        (self.cache.used() as u64)
            .saturating_add(queued)
            .saturating_add(bs)
            <= self.cache.capacity() as u64
    }

    /// Queues background work unless the budget is spent; whether it was
    /// queued.
    fn queue(&self, job: Job) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let bytes = job.bytes(self.vol.block_size);
        if self.queued.fetch_add(bytes, Relaxed) + bytes > self.budget.max(bytes) {
            self.queued.fetch_sub(bytes, Relaxed);
            return false;
        }
        let sent = match self.prefetch.lock().as_ref() {
            Some(tx) => tx.send(job).is_ok(),
            None => false,
        };
        if !sent {
            self.queued.fetch_sub(bytes, Relaxed);
        }
        sent
    }

    /// Takes blocks from `source` before fetching them (see
    /// [`crate::block_source`]); set once, before the first read. Whether
    /// it was set (a second source is refused).
    pub fn set_block_source(&self, source: Arc<dyn BlockSource>) -> bool {
        self.source.set(source).is_ok()
    }

    /// Stops the prefetch threads (they finish the job in hand).
    pub fn stop_prefetch(&self) {
        self.prefetch.lock().take();
    }

    /// The volume read.
    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    /// The block cache.
    pub fn cache(&self) -> &Arc<BlockCache> {
        &self.cache
    }

    /// The resolved slice lists this reader uses; writers invalidate what
    /// they commit in it.
    pub fn chunk_cache(&self) -> &Arc<ChunkCache> {
        &self.chunks
    }

    /// The visible pieces of chunk `indx` of `ino` (cached briefly).
    pub fn pieces(&self, ino: Ino, indx: u32) -> Result<Arc<Vec<Piece>>> {
        self.chunks.pieces(&*self.vol.meta, ino, indx)
    }

    /// Forgets the resolved slice list of one chunk (it changed).
    pub fn invalidate_chunk(&self, ino: Ino, indx: u32) {
        self.chunks.invalidate(ino, indx);
    }

    /// Forgets every resolved chunk of `ino` (truncate, fallocate, open).
    pub fn invalidate_inode(&self, ino: Ino) {
        self.chunks.invalidate_inode(ino);
    }

    /// Block `indx` of slice `id` (of `size` bytes), decompressed, through
    /// the cache.
    pub fn block(&self, id: u64, size: u32, indx: u32) -> Result<Arc<Vec<u8>>> {
        if let Some(b) = self.cache.get((id, indx)) {
            return Ok(b);
        }
        // One fetch per block: later readers wait for the first one.
        let (flight, leader) = {
            let mut map = self.inflight.lock();
            match map.get(&(id, indx)) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Arc::new(Flight::default());
                    map.insert((id, indx), f.clone());
                    (f, true)
                }
            }
        };
        if !leader {
            let mut done = flight.done.lock();
            while done.is_none() {
                flight.cv.wait(&mut done);
            }
            if let Some(Some(b)) = &*done {
                return Ok(b.clone());
            }
            drop(done);
            return self.fetch(id, size, indx);
        }
        let res = self.fetch(id, size, indx);
        *flight.done.lock() = Some(res.as_ref().ok().cloned());
        flight.cv.notify_all();
        self.inflight.lock().remove(&(id, indx));
        res
    }

    /// Whether block `indx` of slice `id` is in the memory cache or a local
    /// cache of the object store.
    pub fn is_cached(&self, id: u64, size: u32, indx: u32) -> bool {
        self.cache.contains((id, indx)) || self.vol.store.is_cached(&self.key(id, size, indx))
    }

    /// Drops block `indx` of slice `id` from the memory cache and from a
    /// local cache of the object store; whether it was cached anywhere.
    pub fn evict_block(&self, id: u64, size: u32, indx: u32) -> bool {
        let mem = self.cache.remove((id, indx));
        let local = self.vol.store.evict_cached(&self.key(id, size, indx));
        mem || local
    }

    /// The object key of block `indx` of slice `id`.
    fn key(&self, id: u64, size: u32, indx: u32) -> String {
        let raw_len = block_len(size, self.vol.block_size, indx);
        block_key(self.vol.name(), id, indx, raw_len)
    }

    /// Fetches, checks and decompresses a block and caches it.
    fn fetch(&self, id: u64, size: u32, indx: u32) -> Result<Arc<Vec<u8>>> {
        let bs = self.vol.block_size;
        let raw_len = block_len(size, bs, indx);
        let key = block_key(self.vol.name(), id, indx, raw_len);
        // An uncompressed block that fills most of a block is read straight
        // into a spare buffer of the cache (warm memory) when there is one;
        // a smaller one gets a buffer of its size (the cache counts bytes).
        let buf = match self.vol.compression {
            Compression::None if 2 * u64::from(raw_len) > u64::from(bs) => {
                self.cache.take_buffer().unwrap_or_default()
            }
            _ => Vec::new(),
        };
        let stored = match self.vol.store.get_into(&key, buf) {
            Err(e @ Error::Corrupt(_)) => {
                self.damaged.lock().insert((id, indx));
                return Err(e);
            }
            r => r?,
        };
        let data = Arc::new(decompress(
            self.vol.compression,
            stored,
            raw_len as usize,
            &key,
        )?);
        self.cache.insert((id, indx), data.clone());
        Ok(data)
    }

    /// Walks the bytes `off..off+len` of a slice piece in order; `ranged`
    /// (a random read) takes uncached blocks from their local file, or —
    /// when `small` — fetches only the bytes needed (see
    /// [`Reader::visit_with`]).
    #[allow(clippy::too_many_arguments)]
    fn visit_slice(
        &self,
        id: u64,
        size: u32,
        mut off: u32,
        mut len: u32,
        mut ranged: Option<&mut dyn FnMut() -> bool>,
        small: bool,
        f: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<()> {
        let bs = self.vol.block_size;
        if u64::from(off) + u64::from(len) > u64::from(size) {
            return Err(Error::Corrupt(format!(
                "slice {id} of {size} bytes is referenced at {off}+{len}"
            )));
        }
        while len > 0 {
            let indx = off / bs;
            let boff = (off % bs) as usize;
            let n = len.min(bs - off % bs);
            let cached = self.cache.get((id, indx));
            let uncompressed = self.vol.compression == crate::format::Compression::None;
            // A block source (the host daemon) first: a block in its
            // memory is read from its read-only mapping, one in its disk
            // cache as a checked file range, one in neither fetched there,
            // once for every VM. Where it has nothing for us (detached; a
            // small random read's miss) or fails, the block is read as a
            // standalone reader would.
            if cached.is_none()
                && let Some(src) = self.source.get()
            {
                let ask = if ranged.is_some() && small && uncompressed {
                    Ask::CachedOnly
                } else {
                    Ask::Fetch
                };
                let placed = match src.block(id, size, indx, ask) {
                    Some(Ok(SourcedBlock::Memory(block))) => {
                        let bytes: &[u8] = (*block).as_ref();
                        let part = bytes.get(boff..boff + n as usize).ok_or_else(|| {
                            Error::Corrupt(format!("block {indx} of slice {id} is short"))
                        })?;
                        f(Fragment::Data(part))?;
                        true
                    }
                    Some(Ok(SourcedBlock::File(cf))) => {
                        let crcs = cf.crcs.as_ref().map(|(crcs, payload)| SegmentCrcs {
                            segment: crate::object::disk_cache::SEGMENT,
                            crcs,
                            payload: *payload,
                        });
                        match f(Fragment::File {
                            file: &cf.file,
                            off: boff as u64,
                            len: n as usize,
                            crcs,
                        }) {
                            Ok(()) => true,
                            Err(Error::Corrupt(why)) => {
                                src.damaged(id, size, indx, &why);
                                false
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    Some(Err(Error::WouldBlock)) => return Err(Error::WouldBlock),
                    Some(Err(e)) => {
                        log::debug!("block {indx} of slice {id} from the block source: {e}");
                        false
                    }
                    None => false,
                };
                if placed {
                    off += n;
                    len -= n;
                    continue;
                }
            }
            // A disk-cache hit of an uncompressed block: its bytes go from
            // the cache file straight into the destination, which checks
            // them there against the file's segment CRCs — no promotion
            // into the memory cache, no CPU copy where the destination
            // reads O_DIRECT. A copy that fails the check is dropped and
            // the block fetched as on a miss.
            let from_disk_cache = match &cached {
                None if uncompressed => {
                    let key = self.key(id, size, indx);
                    match self.vol.store.cached_file(&key, n as usize) {
                        Some(file) => Some((key, file?)),
                        None => None,
                    }
                }
                _ => None,
            };
            if let Some((key, cf)) = from_disk_cache {
                let crcs = cf.crcs.as_ref().map(|(crcs, payload)| SegmentCrcs {
                    segment: crate::object::disk_cache::SEGMENT,
                    crcs,
                    payload: *payload,
                });
                let placed = f(Fragment::File {
                    file: &cf.file,
                    off: boff as u64,
                    len: n as usize,
                    crcs,
                });
                match placed {
                    Ok(()) => {
                        off += n;
                        len -= n;
                        continue;
                    }
                    Err(Error::Corrupt(why)) => {
                        self.vol.store.drop_cached(&key, &why);
                    }
                    Err(e) => return Err(e),
                }
            }
            let block = match cached {
                Some(block) => block,
                None if ranged.is_some() && uncompressed => {
                    let raw_len = block_len(size, bs, indx);
                    let key = block_key(self.vol.name(), id, indx, raw_len);
                    if self.damaged.lock().contains(&(id, indx)) {
                        return Err(Error::Corrupt(format!(
                            "object {key} does not match its stored CRC32C"
                        )));
                    }
                    match self.vol.store.local_file(&key) {
                        // A local object: the consumer reads the bytes
                        // straight into its destination.
                        Some(file) => {
                            let file = file?;
                            f(Fragment::File {
                                file: &file,
                                off: boff as u64,
                                len: n as usize,
                                crcs: None,
                            })?;
                        }
                        // A large read of a remote block: fetched whole
                        // and cached, as a sequential reader's.
                        None if !small => {
                            sluice_api::wait::may_wait()?;
                            let block = self.block(id, size, indx)?;
                            let part = block.get(boff..boff + n as usize).ok_or_else(|| {
                                Error::Corrupt(format!("block {indx} of slice {id} is short"))
                            })?;
                            f(Fragment::Data(part))?;
                            off += n;
                            len -= n;
                            continue;
                        }
                        None => {
                            sluice_api::wait::may_wait()?;
                            let part = self.vol.store.get_range(&key, boff as u64, n as usize)?;
                            if part.len() != n as usize {
                                return Err(Error::Corrupt(format!(
                                    "object {key} is shorter than {} bytes",
                                    boff + n as usize
                                )));
                            }
                            f(Fragment::Data(&part))?;
                        }
                    }
                    if ranged.as_mut().is_some_and(|whole| whole()) {
                        self.queue(Job::Block(id, size, indx));
                    }
                    off += n;
                    len -= n;
                    continue;
                }
                None => {
                    // A fetch (disk cache or object store) waits.
                    sluice_api::wait::may_wait()?;
                    self.block(id, size, indx)?
                }
            };
            let part = block
                .get(boff..boff + n as usize)
                .ok_or_else(|| Error::Corrupt(format!("block {indx} of slice {id} is short")))?;
            f(Fragment::Data(part))?;
            off += n;
            len -= n;
        }
        Ok(())
    }

    /// Walks the bytes at chunk offsets `off..off+len` of `pieces`, calling
    /// `f` with each fragment in order (their lengths add up to `len`).
    pub fn visit_pieces(
        &self,
        pieces: &[Piece],
        off: u64,
        len: u64,
        f: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<()> {
        self.visit_pieces_with(pieces, off, len, None, false, f)
    }

    fn visit_pieces_with(
        &self,
        pieces: &[Piece],
        off: u64,
        len: u64,
        mut ranged: Option<&mut dyn FnMut() -> bool>,
        small: bool,
        f: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<()> {
        let end = off + len;
        let mut at = off;
        let first = pieces.partition_point(|p| p.end() <= off);
        for p in &pieces[first..] {
            if at >= end {
                break;
            }
            let (pa, pb) = (u64::from(p.pos), p.end());
            if pa >= end {
                break;
            }
            if pa > at {
                f(Fragment::Zeros((pa - at) as usize))?;
                at = pa;
            }
            let stop = pb.min(end);
            let n = (stop - at) as u32;
            if p.is_hole() {
                f(Fragment::Zeros(n as usize))?;
            } else {
                let soff = p.off + (at - pa) as u32;
                self.visit_slice(p.id, p.size, soff, n, reborrow(&mut ranged), small, f)?;
            }
            at = stop;
        }
        if at < end {
            f(Fragment::Zeros((end - at) as usize))?;
        }
        Ok(())
    }

    /// Walks the file bytes `off..off+len` of `ino` (the caller bounds them
    /// by the file length), chunk by chunk.
    pub fn visit(
        &self,
        ino: Ino,
        off: u64,
        len: u64,
        f: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<()> {
        self.visit_with(ino, off, len, None, f)
    }

    /// [`Reader::visit`]; with `ranged`, small reads of uncached blocks of
    /// an uncompressed volume fetch only their bytes (for random readers),
    /// and `ranged` is asked after each such read whether the whole block
    /// should be fetched into the cache in the background. Without it every
    /// block touched is fetched whole, checked and cached (sequential
    /// readers, readahead).
    pub fn visit_with(
        &self,
        ino: Ino,
        off: u64,
        len: u64,
        ranged: Option<&mut dyn FnMut() -> bool>,
        f: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut ranged = ranged;
        let small = len <= u64::from(RANGED_READ_MAX);
        let end = off + len;
        let mut at = off;
        while at < end {
            let indx = u32::try_from(at / CHUNK_SIZE).map_err(|_| Error::FileTooBig)?;
            let coff = at % CHUNK_SIZE;
            let n = (CHUNK_SIZE - coff).min(end - at);
            let pieces = self.pieces(ino, indx)?;
            self.visit_pieces_with(&pieces, coff, n, reborrow(&mut ranged), small, f)?;
            at += n;
        }
        Ok(())
    }

    /// Reads the file bytes `off..off+buf.len()` of `ino` into `buf`.
    pub fn read(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        let mut dst = BufDest::new(buf);
        self.visit(ino, off, len, &mut |frag| dst.put(frag))
    }

    /// Reads the visible bytes `off..off+buf.len()` of a resolved chunk.
    pub fn read_pieces(&self, pieces: &[Piece], off: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        let mut dst = BufDest::new(buf);
        self.visit_pieces(pieces, off, len, &mut |frag| dst.put(frag))
    }
}

/// Lends out an optional callback for one call.
fn reborrow<'a>(
    f: &'a mut Option<&mut dyn FnMut() -> bool>,
) -> Option<&'a mut dyn FnMut() -> bool> {
    match f {
        Some(f) => Some(&mut **f),
        None => None,
    }
}
