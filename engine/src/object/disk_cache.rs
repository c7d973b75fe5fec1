//! The disk block cache: raw block objects kept on local NVMe, in front of
//! any [`ObjectStore`].
//!
//! [`CachedStore`] decorates a store: `get` serves a cached copy when one is
//! there and valid, else fetches from the inner store and caches what it got;
//! `put` writes through and caches the block; `delete` drops the cached copy.
//! What is cached is the object as stored (compressed on a compressed
//! volume), as JuiceFS's disk cache does, so a cached block is decompressed
//! and checked by the same code as a fetched one.
//!
//! # Layout
//!
//! Each cache directory holds `DIR/<volume uuid>/raw/chunks/...`, a file per
//! block named like the object key without the volume name (JuiceFS's
//! layout). A key always goes to the same directory (a hash of the key), so a
//! restart finds it again. `rawstaging/` beside `raw/` is left to writeback.
//!
//! # File format
//!
//! A cache file is the object's bytes followed by a trailer: the CRC32C of
//! every 32 KiB of payload (u32 LE each), the payload length (u64 LE) and a
//! magic. The payload starts at offset 0, so a range of the object is the
//! same range of the file (a reader can pread it straight into its
//! destination). Files are written under a temporary name and renamed, so a
//! crash leaves a temporary file (dropped by the rescan), never a half file
//! under a block's name; a file damaged later (a torn write that reached the
//! disk, a flipped bit) fails the trailer or its CRCs and is dropped.
//!
//! # Checksum policy ([`VerifyPolicy`])
//!
//! `full`: no byte of a cached block is used unchecked.
//!
//! - A read of an uncompressed block the memory cache does not hold (what
//!   the reader does for every such block, sequential or random) takes the
//!   file itself with its segment CRCs ([`DiskCache::cached_file`],
//!   [`ObjectStore::cached_file`]): the consumer reads the range straight
//!   into its destination — guest memory under `serve`, O_DIRECT where
//!   `--guest-io` allows: no CPU copy — and checks there, in place, the
//!   CRC32C of every 32 KiB segment the range touches (the parts of its
//!   first and last segment outside the range are read from the file
//!   beside them) before the bytes count (`sluice_api::fragment::
//!   check_landed`). A mismatch drops the file ([`DiskCache::drop_damaged`])
//!   and the reader fetches the block from the object store. The block is
//!   not promoted into the memory cache. The CRCs are kept in the index
//!   (about 512 bytes per 4 MiB block): an insert had them in hand, a file
//!   the restart rescan found has its trailer read at its first use.
//! - A whole-block read ([`ObjectStore::get`]: a compressed volume's
//!   blocks, warmup, compaction, what goes into the memory cache) verifies
//!   every CRC.
//! - Ranged reads of an S3 object served by [`ObjectStore::get_range`] and
//!   [`ObjectStore::local_file`] (unchecked ranges) are only offered for a
//!   file verified whole since this process indexed it: inserted from bytes
//!   we had in hand, or read and checked once.
//!
//! `none`: only the trailer's shape (magic, length against the file size)
//! is checked, which catches partial files but not flipped bits; cached
//! files are handed out without CRCs.
//!
//! # Files that vanish
//!
//! The cache removes a file in three places, each taking the index entry
//! out before the file: `remove` (the block's object was deleted: a
//! released slice), eviction, and dropping a damaged file. A read that
//! found the entry just before may then find no file; that is a miss, not
//! damage, and is neither logged nor counted as dropped (`lost_file`). A
//! file missing while its entry is still there was removed behind the
//! cache's back: it is dropped and said in the log.
//!
//! Each of those unlinks runs under the shard's index lock, and so does an
//! insert's rename of its finished file into place with the index entry
//! it adds. So a file and its entry change together: a removal whose entry
//! went out before a new insert of the same key cannot then unlink the new
//! file (which left an entry without a file: a "No such file" drop with no
//! eviction, seen under fsx at unmount). The lock is held for one rename
//! or unlink of a local file at a time, never for a read or a write of
//! its bytes.
//!
//! # I/O
//!
//! Each cache directory has a few I/O threads, each running a
//! [`sluice_numa::Reactor`] (io_uring, or the pread/pwrite pool where
//! io_uring is unavailable or `SLUICE_IO_BACKEND=threads`) with one fixed
//! buffer on the directory's NUMA node. Files are opened O_DIRECT (buffered
//! where the file system refuses it, e.g. tmpfs) so the cache does not fill
//! the page cache twice. The store's API is synchronous, so a read submits
//! and waits; inserts are queued and written in the background (a miss
//! returns as soon as the object is fetched), bounded by
//! [`MAX_PENDING_BYTES`] beyond which blocks are not cached. The fixed buffer
//! costs one copy between it and the caller's `Vec` — the same copy the page
//! cache would make; the no-copy read is the `cached_file` path above.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use sluice_metrics::{Histogram, HistogramSnapshot};
use sluice_numa::reactor::{BackendChoice, BufferId, DirectError, Event, FileSlot, open_direct};
use sluice_numa::{NodeBuffer, NodeId, PageSize, Reactor, ReactorConfig};

use super::{ObjectInfo, ObjectStore};
use crate::error::{Error, Result};

/// Bytes of payload covered by one CRC32C in the trailer.
pub const SEGMENT: usize = 32 << 10;
/// The last 8 bytes of every cache file.
const MAGIC: &[u8; 8] = b"SLCACHE1";
/// Length + magic at the end of the trailer.
const TAIL: usize = 16;
/// Bytes of inserts queued for the I/O threads beyond which new blocks are
/// not cached (the disk is slower than the network; do not pile up memory).
pub const MAX_PENDING_BYTES: u64 = 256 << 20;
/// The fixed buffer of one I/O thread (a multiple of any O_DIRECT alignment).
const IO_BUFFER: usize = 4 << 20;
/// I/O threads per cache directory.
const IO_THREADS: usize = 2;

/// Which cached block goes when the cache is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Eviction {
    /// Of two entries picked at random, the one used longer ago (JuiceFS's
    /// default: close to LRU at no bookkeeping cost per hit).
    #[default]
    TwoRandom,
    /// The least recently used entry.
    Lru,
    /// Nothing: a full cache stops caching new blocks.
    None,
}

impl std::str::FromStr for Eviction {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "2-random" => Ok(Eviction::TwoRandom),
            "lru" => Ok(Eviction::Lru),
            "none" => Ok(Eviction::None),
            other => Err(format!(
                "unknown eviction policy {other:?}; use 2-random, lru or none"
            )),
        }
    }
}

/// How much of a cached block is checked when it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyPolicy {
    /// The trailer's shape only (catches partial files).
    None,
    /// Every 32 KiB CRC32C on every whole-block read (see the module docs
    /// for ranged reads).
    #[default]
    Full,
}

impl std::str::FromStr for VerifyPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(VerifyPolicy::None),
            "full" => Ok(VerifyPolicy::Full),
            other => Err(format!(
                "unknown checksum policy {other:?}; use none or full"
            )),
        }
    }
}

/// One cache directory, optionally tied to a NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDir {
    /// The directory (the volume's files go under `PATH/<uuid>/raw`).
    pub path: PathBuf,
    /// The NUMA node of the device holding it: the I/O threads' buffers are
    /// allocated there, and a later change can prefer node-local dirs.
    pub node: Option<NodeId>,
}

/// Parses `--cache-dir`: `DIR[@NODE][:DIR[@NODE]...]`. A `@` followed by
/// anything but digits is part of the path.
pub fn parse_cache_dirs(spec: &str) -> std::result::Result<Vec<CacheDir>, String> {
    let mut dirs = Vec::new();
    for part in spec.split(':') {
        if part.is_empty() {
            return Err(format!(
                "--cache-dir {spec:?} has an empty entry; separate directories with a single ':'"
            ));
        }
        let (path, node) = match part.rsplit_once('@') {
            Some((p, n))
                if !p.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) =>
            {
                let node = n
                    .parse()
                    .map_err(|_| format!("--cache-dir: NUMA node {n:?} is too large"))?;
                (p, Some(node))
            }
            _ => (part, None),
        };
        let dir = CacheDir {
            path: PathBuf::from(path),
            node,
        };
        if dirs.iter().any(|d: &CacheDir| d.path == dir.path) {
            return Err(format!("--cache-dir names {path} twice"));
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

/// Settings of a disk cache.
#[derive(Debug, Clone)]
pub struct DiskCacheConfig {
    /// Where blocks are cached (at least one).
    pub dirs: Vec<CacheDir>,
    /// Bytes the cache may hold over all dirs (split evenly), trailers included.
    pub capacity: u64,
    /// Below this share of free space in a dir's file system the cache
    /// evicts and stops growing.
    pub free_space_ratio: f64,
    /// Which block goes when the cache is full.
    pub eviction: Eviction,
    /// How cached blocks are checked when read.
    pub verify: VerifyPolicy,
    /// Whether written blocks are cached too.
    pub cache_writes: bool,
    /// The I/O backend of the cache's reactors.
    pub backend: BackendChoice,
}

impl DiskCacheConfig {
    /// A cache of `capacity` bytes over `dirs` with the defaults.
    pub fn new(dirs: Vec<CacheDir>, capacity: u64) -> Self {
        DiskCacheConfig {
            dirs,
            capacity,
            free_space_ratio: 0.1,
            eviction: Eviction::default(),
            verify: VerifyPolicy::default(),
            cache_writes: true,
            backend: BackendChoice::Auto,
        }
    }
}

/// Counters of a disk cache, for logs and a metrics endpoint.
#[derive(Debug)]
pub struct DiskCacheStats {
    hits: AtomicU64,
    misses: AtomicU64,
    hit_bytes: AtomicU64,
    miss_bytes: AtomicU64,
    inserts: AtomicU64,
    insert_bytes: AtomicU64,
    evictions: AtomicU64,
    dropped: AtomicU64,
    skipped: AtomicU64,
    used_bytes: AtomicU64,
    entries: AtomicU64,
    /// How long reading a cached block took (whole blocks and ranges read
    /// here; not the files handed to the caller, `local_file` and
    /// `cached_file`, which it reads itself), in nanoseconds.
    read_latency: Histogram,
    /// How long writing a block's cache file took, in nanoseconds.
    write_latency: Histogram,
}

impl Default for DiskCacheStats {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        DiskCacheStats {
            hits: z(),
            misses: z(),
            hit_bytes: z(),
            miss_bytes: z(),
            inserts: z(),
            insert_bytes: z(),
            evictions: z(),
            dropped: z(),
            skipped: z(),
            used_bytes: z(),
            entries: z(),
            read_latency: Histogram::new(cache_latency_bounds()),
            write_latency: Histogram::new(cache_latency_bounds()),
        }
    }
}

/// The buckets JuiceFS gives `blockcache_read_hist_seconds` and
/// `blockcache_write_hist_seconds` (10 µs × 2^k, 20 of them), in
/// nanoseconds.
pub fn cache_latency_bounds() -> Vec<u64> {
    sluice_metrics::exponential_bounds(10_000.0, 2.0, 20)
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskCacheCounters {
    /// Reads served from the cache (whole blocks, ranges, local files).
    pub hits: u64,
    /// Reads that went to the object store.
    pub misses: u64,
    /// Bytes served from the cache (local-file hits count their file's size).
    pub hit_bytes: u64,
    /// Bytes fetched from the object store on misses.
    pub miss_bytes: u64,
    /// Blocks written to the cache.
    pub inserts: u64,
    /// Bytes of the blocks written to the cache (their payload).
    pub insert_bytes: u64,
    /// Blocks evicted for room (capacity or free space).
    pub evictions: u64,
    /// Cache files dropped as partial or damaged.
    pub dropped: u64,
    /// Blocks not cached (cache full with eviction off, low disk space,
    /// too many inserts pending, write errors).
    pub skipped: u64,
    /// Bytes of cache files, trailers and inserts in flight included.
    pub used_bytes: u64,
    /// Cached blocks.
    pub entries: u64,
}

impl DiskCacheStats {
    /// The counters now.
    pub fn snapshot(&self) -> DiskCacheCounters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskCacheCounters {
            hits: l(&self.hits),
            misses: l(&self.misses),
            hit_bytes: l(&self.hit_bytes),
            miss_bytes: l(&self.miss_bytes),
            inserts: l(&self.inserts),
            insert_bytes: l(&self.insert_bytes),
            evictions: l(&self.evictions),
            dropped: l(&self.dropped),
            skipped: l(&self.skipped),
            used_bytes: l(&self.used_bytes),
            entries: l(&self.entries),
        }
    }

    /// How long reads of cached blocks took (nanoseconds).
    pub fn read_latency(&self) -> HistogramSnapshot {
        self.read_latency.snapshot()
    }

    /// How long writes of cache files took (nanoseconds).
    pub fn write_latency(&self) -> HistogramSnapshot {
        self.write_latency.snapshot()
    }
}

impl std::fmt::Display for DiskCacheCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} hits ({} MiB), {} misses ({} MiB), {} inserts, {} evictions, {} dropped, \
             {} not cached; {} blocks, {} MiB used",
            self.hits,
            self.hit_bytes >> 20,
            self.misses,
            self.miss_bytes >> 20,
            self.inserts,
            self.evictions,
            self.dropped,
            self.skipped,
            self.entries,
            self.used_bytes >> 20
        )
    }
}

/// Free and total bytes of the file system holding a path.
pub type FreeSpaceProbe = Arc<dyn Fn(&Path) -> io::Result<(u64, u64)> + Send + Sync>;

/// statvfs(2): (bytes available to unprivileged users, total bytes).
fn statvfs_probe(path: &Path) -> io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: plain data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and st is writable for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

// ---------------------------------------------------------------------------
// The trailer.

/// Trailer bytes after a payload of `len` bytes.
fn trailer_len(len: u64) -> u64 {
    len.div_ceil(SEGMENT as u64) * 4 + TAIL as u64
}

/// The trailer of `payload`.
fn trailer(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(trailer_len(payload.len() as u64) as usize);
    for seg in payload.chunks(SEGMENT) {
        out.extend_from_slice(&sluice_simd::crc32c(0, seg).to_le_bytes());
    }
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(MAGIC);
    out
}

/// The segment CRCs a trailer holds (its bytes before the length and magic).
fn segment_crcs(trailer: &[u8]) -> Arc<[u32]> {
    trailer[..trailer.len().saturating_sub(TAIL)]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The payload length a file of `file_len` bytes ending in `tail` claims,
/// or why it is not a cache file.
fn parse_tail(tail: &[u8], file_len: u64) -> std::result::Result<u64, String> {
    if file_len < TAIL as u64 || tail.len() != TAIL {
        return Err(format!("{file_len} bytes is too short for a cache file"));
    }
    if &tail[8..] != MAGIC {
        return Err("no cache trailer at its end (a partial write?)".into());
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&tail[..8]);
    let len = u64::from_le_bytes(len);
    let expect = len.checked_add(trailer_len(len));
    if expect != Some(file_len) {
        return Err(format!(
            "its trailer claims {len} bytes of data, which does not fit its {file_len} bytes"
        ));
    }
    Ok(len)
}

/// Checks a whole cache file; returns the payload length.
fn check_file(bytes: &[u8], verify: VerifyPolicy) -> std::result::Result<usize, String> {
    let n = bytes.len();
    let len = parse_tail(&bytes[n.saturating_sub(TAIL)..], n as u64)? as usize;
    if verify == VerifyPolicy::Full {
        let crcs = &bytes[len..n - TAIL];
        for (i, seg) in bytes[..len].chunks(SEGMENT).enumerate() {
            let stored = u32::from_le_bytes([
                crcs[4 * i],
                crcs[4 * i + 1],
                crcs[4 * i + 2],
                crcs[4 * i + 3],
            ]);
            let actual = sluice_simd::crc32c(0, seg);
            if stored != actual {
                return Err(format!(
                    "bytes {}..{} fail their CRC32C (stored {stored:08x}, data has {actual:08x})",
                    i * SEGMENT,
                    i * SEGMENT + seg.len()
                ));
            }
        }
    }
    Ok(len)
}

/// A cache file handed to a reader that checks what it reads of it in
/// place ([`DiskCache::cached_file`]).
#[derive(Debug)]
pub struct CachedFile {
    /// The file, open for reading; the payload starts at offset 0.
    pub file: File,
    /// The CRC32C of each [`SEGMENT`] of the payload, and the payload
    /// length; `None` under [`VerifyPolicy::None`].
    pub crcs: Option<(Arc<[u32]>, u64)>,
}

/// Reads an open cache file's trailer: its segment CRCs and payload
/// length, with the no-wait rule of [`sluice_api::read_file_exact`].
fn load_crcs(file: &File) -> Result<(Arc<[u32]>, u64)> {
    let size = file.metadata()?.len();
    let mut tail = [0u8; TAIL];
    if size >= TAIL as u64 {
        sluice_api::read_file_exact(file, size - TAIL as u64, &mut tail)?;
    }
    let payload = parse_tail(&tail, size).map_err(Error::Corrupt)?;
    let mut trailer = vec![0u8; (size - payload) as usize];
    sluice_api::read_file_exact(file, payload, &mut trailer)?;
    Ok((segment_crcs(&trailer), payload))
}

/// Reads the last bytes of an open cache file and returns its payload length.
fn check_tail(file: &File) -> std::result::Result<u64, String> {
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut tail = [0u8; TAIL];
    if size >= TAIL as u64 {
        file.read_exact_at(&mut tail, size - TAIL as u64)
            .map_err(|e| e.to_string())?;
    }
    parse_tail(&tail, size)
}

// ---------------------------------------------------------------------------
// The I/O threads.

enum Job {
    Read {
        path: PathBuf,
        reply: Sender<io::Result<Vec<u8>>>,
    },
    Write {
        path: PathBuf,
        parts: [Vec<u8>; 2],
        /// Told how long the write took, or why it failed.
        done: Box<dyn FnOnce(io::Result<Duration>) + Send>,
    },
}

/// One I/O thread's reactor and fixed buffer.
struct ReactorIo {
    reactor: Reactor<()>,
    buffer: BufferId,
}

impl ReactorIo {
    fn new(backend: BackendChoice, node: Option<NodeId>) -> std::result::Result<Self, String> {
        let config = ReactorConfig {
            backend,
            entries: 8,
            max_files: 4,
            max_buffers: 1,
            pool_threads: 1,
            ..ReactorConfig::default()
        };
        let mut reactor = Reactor::new(&config).map_err(|e| e.to_string())?;
        // A buffer bound to a node that does not exist falls back to any node.
        let buf = NodeBuffer::new(IO_BUFFER, node, PageSize::Normal)
            .or_else(|_| NodeBuffer::new(IO_BUFFER, None, PageSize::Normal))
            .map_err(|e| e.to_string())?;
        let buffer = reactor.register_buffer(buf).map_err(|e| e.to_string())?;
        Ok(ReactorIo { reactor, buffer })
    }

    /// Runs the one queued operation to completion.
    fn complete(&mut self) -> io::Result<usize> {
        let mut events = Vec::new();
        loop {
            self.reactor.wait(&mut events).map_err(io::Error::other)?;
            for e in events.drain(..) {
                if let Event::Io(c) = e {
                    return c.result;
                }
            }
        }
    }

    fn open(path: &Path, write: bool) -> io::Result<File> {
        match open_direct(path, write) {
            Ok(f) => Ok(f),
            // tmpfs and some other file systems refuse O_DIRECT: buffered I/O.
            Err(DirectError::Unsupported { .. }) => {
                let mut o = fs::OpenOptions::new();
                o.read(true);
                if write {
                    o.write(true)
                        .create(true)
                        .truncate(false)
                        .mode(CACHE_FILE_MODE);
                }
                o.open(path)
            }
            Err(DirectError::Open { source, .. }) => Err(source),
        }
    }

    fn read(&mut self, path: &Path) -> io::Result<Vec<u8>> {
        let file = Self::open(path, false)?;
        let size = file.metadata()?.len();
        let slot = self.reactor.register_file(file).map_err(io::Error::other)?;
        let res = self.read_slot(slot, size);
        let _ = self.reactor.unregister_file(slot);
        res
    }

    fn read_slot(&mut self, slot: FileSlot, size: u64) -> io::Result<Vec<u8>> {
        let align = self
            .reactor
            .file_direct_align(slot)
            .map_err(io::Error::other)?
            .map_or(1, |a| u64::from(a.offset));
        let mut out = Vec::with_capacity(size as usize);
        let mut off = 0u64;
        while off < size {
            let want = (size - off).min(IO_BUFFER as u64).next_multiple_of(align) as usize;
            self.reactor
                .read_fixed(0, slot, off, self.buffer, 0, want.min(IO_BUFFER))
                .map_err(io::Error::other)?;
            let n = self.complete()?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let take = (n as u64).min(size - off) as usize;
            let buf = self.reactor.buffer(self.buffer).map_err(io::Error::other)?;
            out.extend_from_slice(&buf[..take]);
            off += take as u64;
        }
        Ok(out)
    }

    fn write(&mut self, path: &Path, parts: &[Vec<u8>; 2]) -> io::Result<()> {
        let file = Self::open(path, true)?;
        let slot = self.reactor.register_file(file).map_err(io::Error::other)?;
        let res = self.write_slot(slot, parts);
        let file = self
            .reactor
            .unregister_file(slot)
            .map_err(io::Error::other)?;
        res?;
        // The last O_DIRECT write was padded to the alignment: cut it off.
        file.set_len((parts[0].len() + parts[1].len()) as u64)
    }

    fn write_slot(&mut self, slot: FileSlot, parts: &[Vec<u8>; 2]) -> io::Result<()> {
        let align = self
            .reactor
            .file_direct_align(slot)
            .map_err(io::Error::other)?
            .map_or(1, |a| a.offset as usize);
        let total = parts[0].len() + parts[1].len();
        let mut off = 0usize;
        while off < total {
            let n = (total - off).min(IO_BUFFER);
            let buf = self
                .reactor
                .buffer_mut(self.buffer)
                .map_err(io::Error::other)?;
            gather(parts, off, &mut buf[..n]);
            let padded = n.next_multiple_of(align).min(IO_BUFFER);
            buf[n..padded].fill(0);
            self.reactor
                .write_fixed(0, slot, off as u64, self.buffer, 0, padded)
                .map_err(io::Error::other)?;
            let written = self.complete()?;
            if written < n {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
            }
            off += n;
        }
        Ok(())
    }
}

/// Copies bytes `at..at + dst.len()` of the concatenation of `parts` into `dst`.
fn gather(parts: &[Vec<u8>; 2], mut at: usize, dst: &mut [u8]) {
    let mut filled = 0;
    for p in parts {
        if filled == dst.len() {
            break;
        }
        if at >= p.len() {
            at -= p.len();
            continue;
        }
        let n = (p.len() - at).min(dst.len() - filled);
        dst[filled..filled + n].copy_from_slice(&p[at..at + n]);
        filled += n;
        at = 0;
    }
}

fn io_thread(rx: Receiver<Job>, backend: BackendChoice, node: Option<NodeId>) {
    let mut io = match ReactorIo::new(backend, node) {
        Ok(io) => Some(io),
        Err(e) => {
            log::warn!("disk cache I/O: {e}; trying the thread-pool backend");
            match ReactorIo::new(BackendChoice::Threads, node) {
                Ok(io) => Some(io),
                Err(e) => {
                    log::error!("disk cache I/O cannot start ({e}); nothing will be cached");
                    None
                }
            }
        }
    };
    let down = || io::Error::other("the disk cache's I/O could not start");
    for job in rx {
        match job {
            Job::Read { path, reply } => {
                let r = io.as_mut().map_or_else(|| Err(down()), |io| io.read(&path));
                let _ = reply.send(r);
            }
            Job::Write { path, parts, done } => {
                let started = Instant::now();
                let r = io
                    .as_mut()
                    .map_or_else(|| Err(down()), |io| io.write(&path, &parts));
                done(r.map(|()| started.elapsed()));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The index.

#[derive(Debug)]
struct Entry {
    /// Index in `Index::keys`.
    pos: usize,
    /// File size (payload + trailer).
    size: u64,
    /// Last use (a tick of the shard's clock).
    tick: u64,
    /// Verified whole since this process indexed it.
    verified: bool,
    /// The trailer's segment CRCs and the payload length, once known (an
    /// insert had them in hand, or a checked read loaded them): a ranged
    /// read checks what it read against them.
    crcs: Option<(Arc<[u32]>, u64)>,
}

#[derive(Debug, Default)]
struct Index {
    map: HashMap<Arc<str>, Entry>,
    /// Every key, for picking random ones.
    keys: Vec<Arc<str>>,
    /// Keys by last use, for LRU.
    by_tick: BTreeMap<u64, Arc<str>>,
    clock: u64,
    /// Bytes of entries plus inserts in flight.
    used: u64,
    /// xorshift state for 2-random.
    rng: u64,
}

impl Index {
    fn touch(&mut self, key: &str) -> Option<&mut Entry> {
        self.clock += 1;
        let tick = self.clock;
        let (k, e) = self.map.get_key_value(key)?;
        let k = k.clone();
        let old = e.tick;
        self.by_tick.remove(&old);
        self.by_tick.insert(tick, k);
        let e = self.map.get_mut(key)?;
        e.tick = tick;
        Some(e)
    }

    /// Adds an entry whose bytes are already counted in `used`; returns the
    /// size of an entry it replaced.
    fn add(
        &mut self,
        key: &str,
        size: u64,
        verified: bool,
        crcs: Option<(Arc<[u32]>, u64)>,
    ) -> Option<u64> {
        let old = self.remove(key).map(|e| e.size);
        self.clock += 1;
        let k: Arc<str> = Arc::from(key);
        self.by_tick.insert(self.clock, k.clone());
        self.keys.push(k.clone());
        self.map.insert(
            k,
            Entry {
                pos: self.keys.len() - 1,
                size,
                tick: self.clock,
                verified,
                crcs,
            },
        );
        old
    }

    /// Removes an entry (its bytes stay in `used`; the caller subtracts).
    fn remove(&mut self, key: &str) -> Option<Entry> {
        let e = self.map.remove(key)?;
        self.by_tick.remove(&e.tick);
        self.keys.swap_remove(e.pos);
        if let Some(moved) = self.keys.get(e.pos).cloned()
            && let Some(m) = self.map.get_mut(&moved)
        {
            m.pos = e.pos;
        }
        Some(e)
    }

    fn random(&mut self) -> usize {
        let mut x = self.rng | 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        (x % self.keys.len() as u64) as usize
    }

    fn victim(&mut self, policy: Eviction) -> Option<Arc<str>> {
        if self.keys.is_empty() {
            return None;
        }
        match policy {
            Eviction::None => None,
            Eviction::Lru => self.by_tick.values().next().cloned(),
            Eviction::TwoRandom => {
                let (i, j) = (self.random(), self.random());
                let (a, b) = (self.keys[i].clone(), self.keys[j].clone());
                let ta = self.map.get(&a).map_or(0, |e| e.tick);
                let tb = self.map.get(&b).map_or(0, |e| e.tick);
                Some(if ta <= tb { a } else { b })
            }
        }
    }
}

/// One cache directory: its index and I/O threads.
struct Shard {
    /// `DIR/<uuid>/raw`.
    root: PathBuf,
    capacity: u64,
    index: Mutex<Index>,
    jobs: Mutex<Option<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    scan: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("root", &self.root)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// Writes queued and not yet done, to bound memory and wait for at shutdown.
#[derive(Debug, Default)]
struct Pending {
    bytes: Mutex<u64>,
    idle: Condvar,
}

/// The disk cache of one volume; see the module documentation.
pub struct DiskCache {
    /// The volume name: keys are `NAME/chunks/...`.
    name: String,
    shards: Vec<Arc<Shard>>,
    cfg: DiskCacheConfig,
    stats: Arc<DiskCacheStats>,
    pending: Arc<Pending>,
    free_space: FreeSpaceProbe,
    tmp_seq: AtomicU64,
    /// Whether the free-space floor is refusing inserts now (said once in
    /// the log when it starts, and again when it ends).
    short_of_space: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("shards", &self.shards)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// Mode of cached blocks: they are file data, so the owner's only (as
/// JuiceFS's default `--cache-mode 0600`).
const CACHE_FILE_MODE: u32 = 0o600;

/// Creates `dir` and its missing parents 0700 (the owner's only, whatever
/// the umask); existing ones keep their modes.
fn create_private_dirs(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn cache_err(path: &Path, source: io::Error) -> Error {
    Error::Object {
        key: format!("disk cache {}", path.display()),
        source,
    }
}

impl DiskCache {
    /// Opens the cache of volume `name` (uuid `uuid`): creates its
    /// directories, starts the I/O threads and the background rescan of what
    /// an earlier run left.
    pub fn open(name: &str, uuid: &str, cfg: DiskCacheConfig) -> Result<Arc<DiskCache>> {
        Self::open_with_probe(name, uuid, cfg, Arc::new(statvfs_probe))
    }

    /// [`DiskCache::open`] with another way to learn free space (tests).
    pub fn open_with_probe(
        name: &str,
        uuid: &str,
        cfg: DiskCacheConfig,
        free_space: FreeSpaceProbe,
    ) -> Result<Arc<DiskCache>> {
        if cfg.dirs.is_empty() {
            return Err(Error::Invalid("a disk cache needs a directory".into()));
        }
        if !(0.0..1.0).contains(&cfg.free_space_ratio) {
            return Err(Error::Invalid(format!(
                "the free space ratio must be in [0, 1), not {}",
                cfg.free_space_ratio
            )));
        }
        if uuid.is_empty() || uuid.contains('/') || name.is_empty() {
            return Err(Error::Invalid(
                "a disk cache needs a volume name and uuid".into(),
            ));
        }
        let stats = Arc::new(DiskCacheStats::default());
        let per_dir = cfg.capacity / cfg.dirs.len() as u64;
        let mut shards = Vec::new();
        for (i, dir) in cfg.dirs.iter().enumerate() {
            let root = dir.path.join(uuid).join("raw");
            create_private_dirs(&root).map_err(|e| cache_err(&root, e))?;
            let (tx, rx) = crossbeam_channel::unbounded();
            let mut threads = Vec::new();
            for t in 0..IO_THREADS {
                let (rx, backend, node) = (rx.clone(), cfg.backend, dir.node);
                threads.push(
                    std::thread::Builder::new()
                        .name(format!("dcache-io-{i}.{t}"))
                        .spawn(move || io_thread(rx, backend, node))?,
                );
            }
            let shard = Arc::new(Shard {
                root,
                capacity: per_dir,
                index: Mutex::new(Index {
                    rng: 0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1),
                    ..Index::default()
                }),
                jobs: Mutex::new(Some(tx)),
                threads: Mutex::new(threads),
                scan: Mutex::new(None),
            });
            shards.push(shard);
        }
        let cache = Arc::new(DiskCache {
            name: name.to_string(),
            shards,
            cfg,
            stats,
            pending: Arc::default(),
            free_space,
            tmp_seq: AtomicU64::new(0),
            short_of_space: std::sync::atomic::AtomicBool::new(false),
        });
        for (i, shard) in cache.shards.iter().enumerate() {
            let (shard2, stats, n, eviction, name) = (
                shard.clone(),
                cache.stats.clone(),
                cache.shards.len(),
                cache.cfg.eviction,
                cache.name.clone(),
            );
            let scan = std::thread::Builder::new()
                .name(format!("dcache-scan-{i}"))
                .spawn(move || rescan(&shard2, i, n, &name, &stats, eviction))?;
            *shard.scan.lock() = Some(scan);
        }
        Ok(cache)
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<DiskCacheStats> {
        &self.stats
    }

    /// The settings.
    pub fn config(&self) -> &DiskCacheConfig {
        &self.cfg
    }

    /// Waits until the startup rescan of every directory is done.
    pub fn wait_rescan(&self) {
        for s in &self.shards {
            if let Some(t) = s.scan.lock().take() {
                let _ = t.join();
            }
        }
    }

    /// Waits until every queued insert is on disk (or failed).
    pub fn wait_idle(&self) {
        let mut bytes = self.pending.bytes.lock();
        while *bytes > 0 {
            self.pending.idle.wait(&mut bytes);
        }
    }

    /// Finishes queued inserts and stops the I/O threads; later inserts are
    /// skipped and reads miss.
    pub fn shutdown(&self) {
        self.wait_rescan();
        self.wait_idle();
        for s in &self.shards {
            s.jobs.lock().take();
            for t in s.threads.lock().drain(..) {
                let _ = t.join();
            }
        }
    }

    /// The shard and relative path of a cacheable key (`NAME/chunks/...`).
    fn locate<'a>(&'a self, key: &'a str) -> Option<(&'a Arc<Shard>, &'a str)> {
        let rel = key.strip_prefix(&self.name)?.strip_prefix('/')?;
        if !rel.starts_with("chunks/") || rel.split('/').any(|c| c.is_empty() || c == "..") {
            return None;
        }
        let i = shard_of(rel, self.shards.len());
        Some((&self.shards[i], rel))
    }

    /// The cache file of `key`, if the key is cacheable.
    pub fn path_of(&self, key: &str) -> Option<PathBuf> {
        self.locate(key).map(|(s, rel)| s.root.join(rel))
    }

    fn read_job(shard: &Shard, path: PathBuf) -> io::Result<Vec<u8>> {
        let (reply, rx) = crossbeam_channel::bounded(1);
        let jobs = shard.jobs.lock().clone();
        let Some(jobs) = jobs else {
            return Err(io::Error::other("the disk cache is shut down"));
        };
        jobs.send(Job::Read { path, reply })
            .map_err(|_| io::Error::other("the disk cache's I/O threads are gone"))?;
        rx.recv()
            .map_err(|_| io::Error::other("the disk cache's I/O thread died"))?
    }

    /// The cached object `key`, checked; `None` on a miss (a damaged file is
    /// dropped and counts as a miss).
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let (shard, rel) = self.locate(key)?;
        shard.index.lock().touch(rel)?;
        let path = shard.root.join(rel);
        let started = Instant::now();
        let bytes = match Self::read_job(shard, path.clone()) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.lost_file(shard, rel, &path, &e);
                return None;
            }
        };
        let checked = check_file(&bytes, self.cfg.verify).map(|len| (bytes, len));
        match checked {
            Ok((mut bytes, len)) => {
                self.stats.read_latency.observe_since(started);
                bytes.truncate(len);
                if let Some(e) = shard.index.lock().map.get_mut(rel) {
                    e.verified |= self.cfg.verify == VerifyPolicy::Full;
                }
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .hit_bytes
                    .fetch_add(len as u64, Ordering::Relaxed);
                Some(bytes)
            }
            Err(why) => {
                self.drop_file(shard, rel, &path, &why);
                None
            }
        }
    }

    /// `len` bytes at `off` of the cached object `key`, or `None` on a miss.
    /// A file not verified since it was indexed is read and checked whole.
    pub fn get_range(&self, key: &str, off: u64, len: usize) -> Option<Vec<u8>> {
        let (shard, rel) = self.locate(key)?;
        let verified = shard.index.lock().touch(rel)?.verified;
        if self.cfg.verify == VerifyPolicy::Full && !verified {
            let whole = self.get(key)?;
            let start = (off as usize).min(whole.len());
            let end = start.saturating_add(len).min(whole.len());
            return Some(whole[start..end].to_vec());
        }
        let path = shard.root.join(rel);
        let started = Instant::now();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                self.lost_file(shard, rel, &path, &e);
                return None;
            }
        };
        let res = check_tail(&file)
            .map_err(io::Error::other)
            .and_then(|payload| {
                let end = off.saturating_add(len as u64).min(payload);
                let mut buf = vec![0u8; end.saturating_sub(off) as usize];
                file.read_exact_at(&mut buf, off)?;
                Ok(buf)
            });
        match res {
            Ok(buf) => {
                self.stats.read_latency.observe_since(started);
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .hit_bytes
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                Some(buf)
            }
            Err(e) => {
                self.drop_file(shard, rel, &path, &e.to_string());
                None
            }
        }
    }

    /// The cache file of `key` opened for ranged reads by the caller, when
    /// the checksum policy allows serving it unverified (see the module
    /// docs); `None` otherwise.
    pub fn local_file(&self, key: &str) -> Option<File> {
        let (shard, rel) = self.locate(key)?;
        let (verified, size) = {
            let mut index = shard.index.lock();
            let e = index.touch(rel)?;
            (e.verified, e.size)
        };
        if self.cfg.verify == VerifyPolicy::Full && !verified {
            return None;
        }
        let path = shard.root.join(rel);
        match File::open(&path) {
            Ok(f) => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                self.stats.hit_bytes.fetch_add(size, Ordering::Relaxed);
                Some(f)
            }
            Err(e) => {
                self.lost_file(shard, rel, &path, &e);
                None
            }
        }
    }

    /// The cache file of `key` opened for a read of `len` bytes that the
    /// caller checks in place against the file's segment CRCs, which come
    /// with it (see the module docs); `None` on a miss. The CRCs are read
    /// from the trailer once and kept in the index; that read follows the
    /// no-wait rule ([`sluice_api::read_file_exact`]): `WouldBlock` on a
    /// thread that must not wait when the trailer is not in the page cache.
    /// Under [`VerifyPolicy::None`] the file comes without CRCs.
    pub fn cached_file(&self, key: &str, len: usize) -> Option<Result<CachedFile>> {
        let (shard, rel) = self.locate(key)?;
        let known = shard.index.lock().touch(rel)?.crcs.clone();
        let path = shard.root.join(rel);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                self.lost_file(shard, rel, &path, &e);
                return None;
            }
        };
        let crcs = match (self.cfg.verify, known) {
            (VerifyPolicy::None, _) => None,
            (VerifyPolicy::Full, Some(crcs)) => Some(crcs),
            (VerifyPolicy::Full, None) => match load_crcs(&file) {
                Ok(crcs) => {
                    if let Some(e) = shard.index.lock().map.get_mut(rel) {
                        e.crcs = Some(crcs.clone());
                    }
                    Some(crcs)
                }
                Err(Error::WouldBlock) => return Some(Err(Error::WouldBlock)),
                Err(e) => {
                    self.drop_file(shard, rel, &path, &e.to_string());
                    return None;
                }
            },
        };
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.stats
            .hit_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        Some(Ok(CachedFile { file, crcs }))
    }

    /// A read of `key`'s cache file found it damaged (its bytes failed their
    /// CRC where they landed): the file is dropped, and counted so.
    pub fn drop_damaged(&self, key: &str, why: &str) {
        let Some((shard, rel)) = self.locate(key) else {
            return;
        };
        let path = shard.root.join(rel);
        self.drop_file(shard, rel, &path, why);
    }

    /// Opening or reading the cache file of an indexed key failed with `e`.
    /// A file missing because the cache itself removed it meanwhile — the
    /// block's object was deleted (`remove`: a released slice) or evicted,
    /// each of which takes the index entry out before the file — is a plain
    /// miss: nothing is logged or counted. Anything else (the entry still
    /// there: the file was removed behind the cache's back, or cannot be
    /// read) drops the entry.
    fn lost_file(&self, shard: &Shard, rel: &str, path: &Path, e: &io::Error) {
        if e.kind() == io::ErrorKind::NotFound && !shard.index.lock().map.contains_key(rel) {
            return;
        }
        self.drop_file(shard, rel, path, &e.to_string());
    }

    /// Counts a miss of `bytes` fetched from the object store.
    fn count_miss(&self, bytes: usize) {
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        self.stats
            .miss_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn drop_file(&self, shard: &Shard, rel: &str, path: &Path, why: &str) {
        log::warn!(
            "disk cache: dropping {}: {why}; the block is read from the object store",
            path.display()
        );
        let mut index = shard.index.lock();
        let removed = index.remove(rel);
        // Under the index lock (see "Files that vanish").
        let _ = fs::remove_file(path);
        drop(index);
        if let Some(e) = removed {
            self.forget_bytes(shard, e.size);
        }
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
    }

    fn forget_bytes(&self, shard: &Shard, size: u64) {
        let mut index = shard.index.lock();
        index.used = index.used.saturating_sub(size);
        drop(index);
        self.stats.used_bytes.fetch_sub(size, Ordering::Relaxed);
        self.stats.entries.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether the cache holds `key` (an index lookup; the file is not
    /// read or checked).
    pub fn contains(&self, key: &str) -> bool {
        self.locate(key)
            .is_some_and(|(shard, rel)| shard.index.lock().map.contains_key(rel))
    }

    /// Forgets and deletes the cached copy of `key`; whether there was one.
    pub fn remove(&self, key: &str) -> bool {
        let Some((shard, rel)) = self.locate(key) else {
            return false;
        };
        let mut index = shard.index.lock();
        let Some(e) = index.remove(rel) else {
            return false;
        };
        // Under the index lock (see "Files that vanish").
        let _ = fs::remove_file(shard.root.join(rel));
        drop(index);
        self.forget_bytes(shard, e.size);
        true
    }

    /// Makes room for `size` more bytes in `shard` (capacity and free
    /// space) and reserves them; false when there is no room.
    fn reserve(&self, shard: &Shard, size: u64) -> bool {
        let (free, total) = (self.free_space)(&shard.root).unwrap_or((u64::MAX, u64::MAX));
        let keep_free = (total as f64 * self.cfg.free_space_ratio) as u64;
        // Bytes the file system must give back before this insert fits.
        let mut fs_short = keep_free.saturating_add(size).saturating_sub(free);
        let mut victims = Vec::new();
        let ok = {
            let mut index = shard.index.lock();
            let ok = loop {
                let over = (index.used + size).saturating_sub(shard.capacity);
                if over == 0 && fs_short == 0 {
                    break true;
                }
                // Only evict for room the cache itself can give back.
                if index.keys.is_empty() || size > shard.capacity {
                    break false;
                }
                let Some(key) = index.victim(self.cfg.eviction) else {
                    break false;
                };
                let Some(e) = index.remove(&key) else {
                    break false;
                };
                index.used -= e.size;
                fs_short = fs_short.saturating_sub(e.size);
                // Under the index lock (see "Files that vanish").
                let _ = fs::remove_file(shard.root.join(&*key));
                victims.push((key, e.size));
            };
            if ok {
                index.used += size;
            }
            ok
        };
        for (_, esize) in victims {
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            self.stats.entries.fetch_sub(1, Ordering::Relaxed);
            self.stats.used_bytes.fetch_sub(esize, Ordering::Relaxed);
        }
        if ok {
            self.stats.used_bytes.fetch_add(size, Ordering::Relaxed);
        }
        // An operator whose cache stops filling must learn why: the file
        // system is below --free-space-ratio (other data, not the cache).
        let short = !ok && fs_short > 0;
        if short != self.short_of_space.swap(short, Ordering::Relaxed) {
            if short {
                log::warn!(
                    "disk cache {}: its file system has {} MiB free of {} MiB, under \
                     --free-space-ratio {}: new blocks are not cached until space is freed",
                    shard.root.display(),
                    free >> 20,
                    total >> 20,
                    self.cfg.free_space_ratio
                );
            } else if ok {
                log::info!(
                    "disk cache {}: free space is back above --free-space-ratio; caching again",
                    shard.root.display()
                );
            }
        }
        ok
    }

    /// Queues `data` (the object `key` as stored) to be cached; skipped when
    /// the key is not a block, there is no room or too much is pending.
    pub fn insert(&self, key: &str, data: Vec<u8>) {
        let Some((shard, rel)) = self.locate(key) else {
            return;
        };
        let trailer = trailer(&data);
        let payload = data.len() as u64;
        let size = (data.len() + trailer.len()) as u64;
        let crcs = (segment_crcs(&trailer), data.len() as u64);
        {
            let mut pending = self.pending.bytes.lock();
            if *pending + size > MAX_PENDING_BYTES || !self.reserve(shard, size) {
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            *pending += size;
        }
        let path = shard.root.join(rel);
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp{seq}"));
        let tmp_path = tmp.clone();
        let (shard2, stats, pending, rel2) = (
            shard.clone(),
            self.stats.clone(),
            self.pending.clone(),
            rel.to_string(),
        );
        let done = Box::new(move |res: io::Result<Duration>| {
            // The file goes into place and its entry into the index under
            // the index lock (see "Files that vanish").
            let placed = res.and_then(|took| {
                let mut index = shard2.index.lock();
                fs::rename(&tmp, &path)?;
                Ok((took, index.add(&rel2, size, true, Some(crcs.clone()))))
            });
            match placed {
                Ok((took, old)) => {
                    stats
                        .write_latency
                        .observe(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
                    stats.inserts.fetch_add(1, Ordering::Relaxed);
                    stats.insert_bytes.fetch_add(payload, Ordering::Relaxed);
                    stats.entries.fetch_add(1, Ordering::Relaxed);
                    if let Some(old) = old {
                        let mut index = shard2.index.lock();
                        index.used = index.used.saturating_sub(old);
                        drop(index);
                        stats.used_bytes.fetch_sub(old, Ordering::Relaxed);
                        stats.entries.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    log::warn!("disk cache: cannot write {}: {e}", path.display());
                    let _ = fs::remove_file(&tmp);
                    let mut index = shard2.index.lock();
                    index.used = index.used.saturating_sub(size);
                    drop(index);
                    stats.used_bytes.fetch_sub(size, Ordering::Relaxed);
                    stats.skipped.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut bytes = pending.bytes.lock();
            *bytes -= size;
            if *bytes == 0 {
                pending.idle.notify_all();
            }
        });
        if let Some(dir) = tmp_path.parent()
            && let Err(e) = create_private_dirs(dir)
        {
            done(Err(e));
            return;
        }
        let jobs = shard.jobs.lock().clone();
        let job = Job::Write {
            path: tmp_path,
            parts: [data, trailer],
            done,
        };
        match jobs {
            Some(jobs) => {
                if let Err(crossbeam_channel::SendError(Job::Write { done, .. })) = jobs.send(job) {
                    done(Err(io::Error::other(
                        "the disk cache's I/O threads are gone",
                    )));
                }
            }
            None => {
                if let Job::Write { done, .. } = job {
                    done(Err(io::Error::other("the disk cache is shut down")));
                }
            }
        }
    }
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Which of `n` directories holds a block (stable across runs: the rescan
/// finds blocks where lookups look for them).
fn shard_of(rel: &str, n: usize) -> usize {
    (sluice_simd::crc32c(0, rel.as_bytes()) as usize) % n
}

/// Indexes what an earlier run left in a shard: drops temporary files,
/// files with a bad trailer and files that belong to another directory
/// (the dir list changed), then evicts down to the capacity.
fn rescan(
    shard: &Shard,
    i: usize,
    n: usize,
    name: &str,
    stats: &DiskCacheStats,
    eviction: Eviction,
) {
    let mut files = Vec::new();
    walk(&shard.root, &shard.root, &mut files);
    let (mut found, mut bytes, mut dropped) = (0u64, 0u64, 0u64);
    for (path, rel) in files {
        let base = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bad = if base.starts_with('.') {
            Some("a temporary file left by an unfinished write".to_string())
        } else if !rel.starts_with("chunks/") || shard_of(&rel, n) != i {
            Some("not a block of this directory".to_string())
        } else {
            match File::open(&path)
                .map_err(|e| e.to_string())
                .and_then(|f| check_tail(&f))
            {
                Ok(len) => {
                    let size = len + trailer_len(len);
                    let mut index = shard.index.lock();
                    if !index.map.contains_key(rel.as_str()) {
                        index.used += size;
                        index.add(&rel, size, false, None);
                        stats.entries.fetch_add(1, Ordering::Relaxed);
                        stats.used_bytes.fetch_add(size, Ordering::Relaxed);
                        found += 1;
                        bytes += size;
                    }
                    None
                }
                Err(why) => Some(why),
            }
        };
        if let Some(why) = bad {
            log::warn!("disk cache: dropping {}: {why}", path.display());
            let _ = fs::remove_file(&path);
            if !base.starts_with('.') {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
            dropped += 1;
        }
    }
    // A smaller --disk-cache-size than last time: evict down to it.
    let mut victims = Vec::new();
    {
        let mut index = shard.index.lock();
        while index.used > shard.capacity {
            let policy = if eviction == Eviction::None {
                Eviction::Lru
            } else {
                eviction
            };
            let Some(key) = index.victim(policy) else {
                break;
            };
            let Some(e) = index.remove(&key) else { break };
            index.used -= e.size;
            victims.push((key, e.size));
        }
    }
    for (key, size) in victims {
        let _ = fs::remove_file(shard.root.join(&*key));
        stats.evictions.fetch_add(1, Ordering::Relaxed);
        stats.entries.fetch_sub(1, Ordering::Relaxed);
        stats.used_bytes.fetch_sub(size, Ordering::Relaxed);
    }
    log::info!(
        "disk cache {} ({name}): rescan found {found} cached blocks ({} MiB), dropped {dropped} files",
        shard.root.display(),
        bytes >> 20
    );
}

/// Every regular file under `dir`, with its path relative to `root`.
fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(root, &p, out),
            Ok(t) if t.is_file() => {
                if let Ok(rel) = p.strip_prefix(root)
                    && let Some(rel) = rel.to_str()
                {
                    let rel = rel.to_string();
                    out.push((p, rel));
                }
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------
// The store decorator.

/// An [`ObjectStore`] with a disk cache in front; see the module docs.
#[derive(Debug)]
pub struct CachedStore {
    inner: Arc<dyn ObjectStore>,
    cache: Arc<DiskCache>,
}

impl CachedStore {
    /// `inner` with `cache` in front.
    pub fn new(inner: Arc<dyn ObjectStore>, cache: Arc<DiskCache>) -> Self {
        CachedStore { inner, cache }
    }

    /// The cache.
    pub fn cache(&self) -> &Arc<DiskCache> {
        &self.cache
    }
}

impl ObjectStore for CachedStore {
    fn describe(&self) -> String {
        let dirs: Vec<_> = self
            .cache
            .cfg
            .dirs
            .iter()
            .map(|d| d.path.display().to_string())
            .collect();
        format!(
            "{} (disk cache in {})",
            self.inner.describe(),
            dirs.join(":")
        )
    }

    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
        self.inner.put(key, data, crc)?;
        if self.cache.cfg.cache_writes && self.cache.locate(key).is_some() {
            self.cache.insert(key, data.to_vec());
        }
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        if let Some(bytes) = self.cache.get(key) {
            return Ok(bytes);
        }
        let data = self.inner.get(key)?;
        if self.cache.locate(key).is_some() {
            self.cache.count_miss(data.len());
            self.cache.insert(key, data.clone());
        }
        Ok(data)
    }

    fn get_to(&self, key: &str, out: &mut [u8]) -> Result<usize> {
        if let Some(bytes) = self.cache.get(key) {
            return super::copy_whole(key, &bytes, out);
        }
        let n = self.inner.get_to(key, out)?;
        if self.cache.locate(key).is_some() {
            self.cache.count_miss(n);
            self.cache.insert(key, out[..n].to_vec());
        }
        Ok(n)
    }

    fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
        if let Some(bytes) = self.cache.get_range(key, off, len) {
            return Ok(bytes);
        }
        let data = self.inner.get_range(key, off, len)?;
        if self.cache.locate(key).is_some() {
            self.cache.count_miss(data.len());
        }
        Ok(data)
    }

    fn head(&self, key: &str) -> Result<ObjectInfo> {
        self.inner.head(key)
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.cache.remove(key);
        self.inner.delete(key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }

    fn needs_sync(&self) -> bool {
        self.inner.needs_sync()
    }

    fn sync_objects(&self, keys: &[String]) -> std::result::Result<(), super::Unsynced> {
        self.inner.sync_objects(keys)
    }

    fn local_file(&self, key: &str) -> Option<Result<File>> {
        if let Some(f) = self.cache.local_file(key) {
            return Some(Ok(f));
        }
        self.inner.local_file(key)
    }

    fn cached_file(&self, key: &str, len: usize) -> Option<Result<CachedFile>> {
        self.cache.cached_file(key, len)
    }

    fn drop_cached(&self, key: &str, why: &str) {
        self.cache.drop_damaged(key, why);
    }

    fn is_cached(&self, key: &str) -> bool {
        self.cache.contains(key) || self.inner.is_cached(key)
    }

    fn evict_cached(&self, key: &str) -> bool {
        // Both, not the first that holds it: `sluice warmup --evict` means
        // no local copy is left.
        let here = self.cache.remove(key);
        self.inner.evict_cached(key) || here
    }

    fn drain_uploads(&self, limit: std::time::Duration) -> usize {
        self.inner.drain_uploads(limit)
    }

    fn upload_backlog(&self) -> Option<super::WritebackStats> {
        self.inner.upload_backlog()
    }
}

#[cfg(test)]
mod tests;
