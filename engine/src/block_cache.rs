//! A bounded in-memory cache of decompressed blocks, keyed by (slice id,
//! block index). Slices are immutable once written, so an entry never goes
//! stale; it only ages out.
//!
//! The cache is split into shards, each a small LRU behind its own lock, so
//! concurrent readers of different blocks rarely meet on a lock and no lock
//! is held while data is copied.
//!
//! Whole-block buffers that leave the cache are kept as spares, up to the
//! cache's size, and fetches read into them instead of fresh memory: fresh
//! anonymous pages cost a fault and a kernel clear per page (the largest item
//! in a profile of a first sequential read). [`BlockCache::prefault`] fills
//! the spares up front, so the cache's memory is faulted in once, at mount.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// A block's identity: slice id and block index within the slice.
pub type BlockId = (u64, u32);

const SHARDS: usize = 16;

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<BlockId, (Arc<Vec<u8>>, u64)>,
    /// Last-use tick → block, oldest first.
    order: BTreeMap<u64, BlockId>,
    bytes: usize,
    tick: u64,
}

impl Shard {
    fn touch(&mut self, id: BlockId) -> Option<Arc<Vec<u8>>> {
        self.tick += 1;
        let tick = self.tick;
        let (data, t) = self.map.get_mut(&id)?;
        self.order.remove(t);
        *t = tick;
        self.order.insert(tick, id);
        Some(data.clone())
    }
}

/// Thread-safe, byte-bounded block cache.
#[derive(Debug)]
pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    shard_limit: usize,
    counters: Counters,
    /// Bytes held by all shards together.
    held: AtomicUsize,
    /// The capacity of a recyclable buffer: a whole block rounded up to the
    /// direct-I/O alignment (0: buffers are not recycled).
    spare_len: usize,
    /// Whole-block buffers not in use, already faulted in.
    spares: Mutex<Vec<Vec<u8>>>,
}

/// The alignment whole-object reads need for direct I/O.
const SPARE_ALIGN: usize = 4096;

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    insert_bytes: AtomicU64,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
}

/// What the memory block cache has done since it started, for logs and a
/// metrics endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCacheStats {
    /// Lookups that found the block, and the bytes they found.
    pub hits: u64,
    /// Bytes of the blocks found.
    pub hit_bytes: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Blocks added, and their bytes.
    pub inserts: u64,
    /// Bytes of the blocks added.
    pub insert_bytes: u64,
    /// Blocks pushed out to make room (not explicit removals), and their bytes.
    pub evictions: u64,
    /// Bytes of the blocks pushed out.
    pub evicted_bytes: u64,
    /// Bytes held now.
    pub used_bytes: u64,
    /// Blocks held now.
    pub blocks: u64,
    /// Spare whole-block buffers kept for reuse now.
    pub spare_buffers: u64,
}

impl std::fmt::Display for BlockCacheStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} hits ({} MiB), {} misses, {} inserts ({} MiB), {} evictions ({} MiB), {} MiB held, {} spare buffers",
            self.hits,
            self.hit_bytes >> 20,
            self.misses,
            self.inserts,
            self.insert_bytes >> 20,
            self.evictions,
            self.evicted_bytes >> 20,
            self.used_bytes >> 20,
            self.spare_buffers
        )
    }
}

impl BlockCache {
    /// A cache holding at most about `capacity` bytes of blocks (0 disables it).
    pub fn new(capacity: usize) -> BlockCache {
        BlockCache::with_block_size(capacity, 0)
    }

    /// A cache like [`BlockCache::new`] that keeps the buffers of whole
    /// `block_size` blocks it lets go, for [`BlockCache::take_buffer`]
    /// (0: keeps none).
    pub fn with_block_size(capacity: usize, block_size: usize) -> BlockCache {
        BlockCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_limit: capacity / SHARDS,
            counters: Counters::default(),
            held: AtomicUsize::new(0),
            spare_len: block_size.next_multiple_of(SPARE_ALIGN),
            spares: Mutex::new(Vec::new()),
        }
    }

    /// An empty buffer with room for a whole block, from the spares, if
    /// there is one.
    pub fn take_buffer(&self) -> Option<Vec<u8>> {
        self.spares.lock().pop()
    }

    /// How many spare buffers are kept now.
    pub fn spare_buffers(&self) -> usize {
        self.spares.lock().len()
    }

    /// The cache counts bytes, not capacity: a block in a buffer more than
    /// twice its size (a small file's bytes in a block-sized write buffer)
    /// moves into a buffer of its own size, and the big buffer becomes a
    /// spare. Else every small file would pin, and freshly fault, a block.
    fn fit(&self, data: Arc<Vec<u8>>) -> Arc<Vec<u8>> {
        if data.capacity() <= 2 * data.len() {
            return data;
        }
        match Arc::try_unwrap(data) {
            Ok(buf) => {
                let exact = Arc::new(buf.to_vec());
                self.give_buffer(buf);
                exact
            }
            Err(shared) => shared,
        }
    }

    /// Keeps the buffer of a block that left the cache, if nothing else
    /// holds it, it is a whole block's, and cache plus spares stay within
    /// the capacity.
    fn recycle(&self, data: Arc<Vec<u8>>) {
        if let Ok(buf) = Arc::try_unwrap(data) {
            self.give_buffer(buf);
        }
    }

    /// Keeps a whole-block buffer its user is done with (a block just
    /// stored) as a spare, within the same bounds as blocks that leave the
    /// cache; drops it otherwise.
    pub fn give_buffer(&self, mut buf: Vec<u8>) {
        if self.spare_len == 0 || buf.capacity() != self.spare_len {
            return;
        }
        buf.clear();
        let mut spares = self.spares.lock();
        if self.held.load(Ordering::Relaxed) + (spares.len() + 1) * self.spare_len
            <= self.capacity()
        {
            spares.push(buf);
        }
    }

    /// Faults in spare buffers until cache and spares fill the capacity, on
    /// a background thread, so that fetches find warm memory from the start.
    /// The cache's memory is then resident for the life of the mount.
    pub fn prefault(self: &Arc<Self>) {
        if self.spare_len == 0 {
            return;
        }
        let cache = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("sluice-prefault".into())
            .spawn(move || {
                let mut made = 0usize;
                let started = std::time::Instant::now();
                let done = |made: usize, len: usize| {
                    log::info!(
                        "memory cache prefaulted: {} MiB in {:.1} s",
                        (made * len) >> 20,
                        started.elapsed().as_secs_f64()
                    );
                };
                while let Some(cache) = cache.upgrade() {
                    let len = cache.spare_len;
                    // A cache larger than the machine can spare stops
                    // prefaulting rather than wake the OOM killer.
                    if made.is_multiple_of(16) && !memory_to_spare() {
                        log::warn!(
                            "memory cache prefault stopped after {} MiB: the machine is low on \
                             free memory (lower --cache-size)",
                            (made * len) >> 20
                        );
                        return;
                    }
                    made += 1;
                    let full = cache.held.load(Ordering::Relaxed)
                        + (cache.spare_buffers() + 1) * len
                        > cache.capacity();
                    if full {
                        done(made - 1, len);
                        return;
                    }
                    let buf = faulted_buffer(len);
                    let mut spares = cache.spares.lock();
                    if cache.held.load(Ordering::Relaxed) + (spares.len() + 1) * len
                        > cache.capacity()
                    {
                        drop(spares);
                        done(made - 1, len);
                        return;
                    }
                    spares.push(buf);
                }
            });
        if let Err(e) = spawned {
            log::warn!("cannot start the cache prefault thread: {e}");
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> BlockCacheStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BlockCacheStats {
            hits: get(&c.hits),
            hit_bytes: get(&c.hit_bytes),
            misses: get(&c.misses),
            inserts: get(&c.inserts),
            insert_bytes: get(&c.insert_bytes),
            evictions: get(&c.evictions),
            evicted_bytes: get(&c.evicted_bytes),
            used_bytes: self.used() as u64,
            blocks: self.shards.iter().map(|s| s.lock().map.len() as u64).sum(),
            spare_buffers: self.spare_buffers() as u64,
        }
    }

    fn shard(&self, id: BlockId) -> &Mutex<Shard> {
        // Blocks of one slice spread over the shards.
        let h = id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(id.1);
        &self.shards[(h as usize ^ (h >> 32) as usize) % SHARDS]
    }

    /// About how many bytes the cache holds at most.
    pub fn capacity(&self) -> usize {
        self.shard_limit * SHARDS
    }

    /// The cached block, if present (and marks it recently used).
    pub fn get(&self, id: BlockId) -> Option<Arc<Vec<u8>>> {
        let found = self.shard(id).lock().touch(id);
        match &found {
            Some(d) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .hit_bytes
                    .fetch_add(d.len() as u64, Ordering::Relaxed);
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        found
    }

    /// Adds a block, evicting the least recently used ones to stay in bounds.
    /// Blocks larger than a shard's share are not cached.
    pub fn insert(&self, id: BlockId, data: Arc<Vec<u8>>) {
        let len = data.len();
        if len > self.shard_limit {
            return;
        }
        let data = self.fit(data);
        let mut evicted = Vec::new();
        {
            let mut s = self.shard(id).lock();
            if s.touch(id).is_some() {
                return;
            }
            while s.bytes + len > self.shard_limit {
                let Some((_, victim)) = s.order.pop_first() else {
                    break;
                };
                if let Some((d, _)) = s.map.remove(&victim) {
                    s.bytes -= d.len();
                    self.held.fetch_sub(d.len(), Ordering::Relaxed);
                    self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .evicted_bytes
                        .fetch_add(d.len() as u64, Ordering::Relaxed);
                    evicted.push(d);
                }
            }
            s.tick += 1;
            let tick = s.tick;
            s.order.insert(tick, id);
            s.map.insert(id, (data, tick));
            s.bytes += len;
            self.held.fetch_add(len, Ordering::Relaxed);
        }
        self.counters.inserts.fetch_add(1, Ordering::Relaxed);
        self.counters
            .insert_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        for d in evicted {
            self.recycle(d);
        }
    }

    /// Drops every block of slice `id` (its objects are gone).
    pub fn remove_slice(&self, id: u64) {
        let mut removed = Vec::new();
        for shard in &self.shards {
            let mut s = shard.lock();
            let keys: Vec<BlockId> = s.map.keys().filter(|k| k.0 == id).copied().collect();
            for k in keys {
                if let Some((d, t)) = s.map.remove(&k) {
                    s.bytes -= d.len();
                    self.held.fetch_sub(d.len(), Ordering::Relaxed);
                    s.order.remove(&t);
                    removed.push(d);
                }
            }
        }
        for d in removed {
            self.recycle(d);
        }
    }

    /// Whether a block is cached (without marking it used).
    pub fn contains(&self, id: BlockId) -> bool {
        self.shard(id).lock().map.contains_key(&id)
    }

    /// Drops one block; whether it was cached.
    pub fn remove(&self, id: BlockId) -> bool {
        let removed = {
            let mut s = self.shard(id).lock();
            let removed = s.map.remove(&id);
            if let Some((d, t)) = &removed {
                s.bytes -= d.len();
                self.held.fetch_sub(d.len(), Ordering::Relaxed);
                s.order.remove(t);
            }
            removed
        };
        match removed {
            Some((d, _)) => {
                self.recycle(d);
                true
            }
            None => false,
        }
    }

    /// Bytes currently cached (kept beside the shards, so asking takes no
    /// lock: random reads ask on every miss).
    pub fn used(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// `MADV_POPULATE_WRITE` (Linux 5.14; the asm-generic value, shared by
/// x86_64 and aarch64): faults a range in without touching it from user space.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Whether the machine has memory to spare for more prefaulting: at least
/// a tenth of it (and 512 MiB) still available. Unknown counts as yes.
fn memory_to_spare() -> bool {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| meminfo_spare(&m))
        .unwrap_or(true)
}

/// [`memory_to_spare`] on the text of /proc/meminfo.
fn meminfo_spare(meminfo: &str) -> Option<bool> {
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    Some(available > (total / 10).max(512 << 10))
}

/// An empty buffer of `len` bytes' capacity whose pages are faulted in.
fn faulted_buffer(len: usize) -> Vec<u8> {
    let mut buf = Vec::<u8>::with_capacity(len);
    let spare = buf.spare_capacity_mut();
    let start = spare.as_mut_ptr() as usize;
    let page_start = start.next_multiple_of(SPARE_ALIGN);
    let page_end = (start + spare.len()) / SPARE_ALIGN * SPARE_ALIGN;
    let populated = page_end > page_start && {
        // SAFETY: the range lies inside memory `buf` owns; MADV_POPULATE_WRITE
        // only faults pages in (their contents stay zero or as they were).
        unsafe {
            libc::madvise(
                page_start as *mut libc::c_void,
                page_end - page_start,
                MADV_POPULATE_WRITE,
            ) == 0
        }
    };
    if !populated {
        // Older kernels (and qemu-user): touch every page instead.
        for byte in spare.iter_mut().step_by(SPARE_ALIGN) {
            byte.write(0);
        }
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole block of the 8 KiB block size the recycling tests use, in a
    /// buffer of exactly the capacity the cache recycles.
    fn whole_block(fill: u8) -> Arc<Vec<u8>> {
        let mut v = Vec::with_capacity(8192);
        v.resize(8192, fill);
        Arc::new(v)
    }

    #[test]
    fn buffers_of_whole_blocks_that_leave_are_reused() {
        // Two whole blocks per shard.
        let cache = BlockCache::with_block_size(SHARDS * 2 * 8192, 8192);
        cache.insert((1, 0), whole_block(7));
        assert!(cache.remove((1, 0)));
        assert_eq!(cache.spare_buffers(), 1);
        let buf = cache.take_buffer().expect("a spare");
        assert_eq!((buf.len(), buf.capacity()), (0, 8192));
        assert!(cache.take_buffer().is_none());

        // A block someone still reads is not taken from them.
        let held = whole_block(8);
        cache.insert((2, 0), held.clone());
        cache.remove_slice(2);
        assert_eq!(cache.spare_buffers(), 0);
        // Nor is a partial block's buffer kept.
        cache.insert((3, 0), Arc::new(vec![1; 100]));
        cache.remove((3, 0));
        assert_eq!(cache.spare_buffers(), 0);

        // Evicted blocks come back as spares, and the same bytes are reused.
        let same: Vec<BlockId> = (0..1000u64)
            .map(|i| (i, 0))
            .filter(|&b| std::ptr::eq(cache.shard(b), cache.shard((0, 0))))
            .take(3)
            .collect();
        for (i, &id) in same.iter().enumerate() {
            cache.insert(id, whole_block(i as u8));
        }
        assert_eq!(cache.stats().evictions, 1);
        assert_eq!(cache.spare_buffers(), 1);
    }

    #[test]
    fn spares_and_blocks_stay_within_the_capacity() {
        let cache = BlockCache::with_block_size(SHARDS * 2 * 8192, 8192);
        cache.insert((1, 0), whole_block(1));
        for _ in 0..40 {
            cache.give_buffer(Vec::with_capacity(8192));
        }
        // 32 buffers fit; one is taken by the cached block.
        assert_eq!(cache.spare_buffers(), 31);
        // Buffers of another size are not kept.
        let cache = BlockCache::with_block_size(SHARDS * 2 * 8192, 8192);
        cache.give_buffer(Vec::with_capacity(4096));
        assert_eq!(cache.spare_buffers(), 0);
        // A cache without a block size keeps nothing.
        let cache = BlockCache::new(SHARDS * 2 * 8192);
        cache.give_buffer(Vec::with_capacity(8192));
        assert_eq!(cache.spare_buffers(), 0);
    }

    #[test]
    fn prefault_leaves_a_tenth_of_memory_free() {
        let info = |avail: u64| {
            format!("MemTotal:       16000000 kB\nMemFree: 1 kB\nMemAvailable:   {avail} kB\n")
        };
        assert_eq!(meminfo_spare(&info(8_000_000)), Some(true));
        assert_eq!(meminfo_spare(&info(1_500_000)), Some(false));
        // A small machine keeps at least 512 MiB.
        let small = "MemTotal: 2000000 kB\nMemAvailable: 500000 kB\n";
        assert_eq!(meminfo_spare(small), Some(false));
        assert_eq!(meminfo_spare("garbage"), None);
    }

    #[test]
    fn prefault_fills_the_capacity_with_spares() {
        let cache = Arc::new(BlockCache::with_block_size(SHARDS * 2 * 8192, 8192));
        cache.insert((1, 0), whole_block(1));
        cache.prefault();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while cache.spare_buffers() < 31 {
            assert!(
                std::time::Instant::now() < deadline,
                "prefault did not finish"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(cache.spare_buffers(), 31, "no more than the capacity");
        let buf = cache.take_buffer().expect("a spare");
        assert!(buf.is_empty() && buf.capacity() >= 8192);
    }

    #[test]
    fn counters_follow_hits_misses_and_evictions() {
        let cache = BlockCache::new(SHARDS * 100);
        let same: Vec<BlockId> = (0..1000u64)
            .map(|i| (i, 0))
            .filter(|&b| std::ptr::eq(cache.shard(b), cache.shard((0, 0))))
            .take(3)
            .collect();
        assert!(cache.get(same[0]).is_none());
        cache.insert(same[0], Arc::new(vec![1; 60]));
        assert!(cache.get(same[0]).is_some());
        // The second 60-byte block does not fit beside the first: it goes.
        cache.insert(same[1], Arc::new(vec![2; 60]));
        let s = cache.stats();
        assert_eq!((s.hits, s.hit_bytes, s.misses), (1, 60, 1));
        assert_eq!((s.inserts, s.insert_bytes), (2, 120));
        assert_eq!((s.evictions, s.evicted_bytes, s.used_bytes), (1, 60, 60));
        assert!(s.to_string().contains("1 evictions"), "{s}");
    }

    #[test]
    fn bounded_and_lru() {
        let cache = BlockCache::new(SHARDS * 100);
        // Find three ids in one shard so eviction order is observable.
        let same: Vec<BlockId> = (0..1000u64)
            .map(|i| (i, 0))
            .filter(|&b| std::ptr::eq(cache.shard(b), cache.shard((0, 0))))
            .take(3)
            .collect();
        cache.insert(same[0], Arc::new(vec![1; 40]));
        cache.insert(same[1], Arc::new(vec![2; 40]));
        assert_eq!(cache.get(same[0]).unwrap()[0], 1);
        cache.insert(same[2], Arc::new(vec![3; 40]));
        assert!(
            cache.get(same[1]).is_none(),
            "least recently used is evicted"
        );
        assert!(cache.get(same[0]).is_some());
        assert!(cache.get(same[2]).is_some());
        assert_eq!(cache.used(), 80);
        cache.insert((5, 5), Arc::new(vec![0; 101]));
        assert!(
            cache.get((5, 5)).is_none(),
            "oversized blocks are not cached"
        );
        assert!(cache.contains(same[2]) && cache.remove(same[2]));
        assert!(!cache.contains(same[2]) && !cache.remove(same[2]));
        cache.insert(same[2], Arc::new(vec![3; 40]));
        cache.remove_slice(same[0].0);
        assert!(cache.get(same[0]).is_none());
        assert_eq!(cache.used(), 40);
    }

    #[test]
    fn concurrent_use_stays_bounded() {
        let cache = Arc::new(BlockCache::new(64 * 1024));
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let cache = cache.clone();
                sc.spawn(move || {
                    for i in 0..500u64 {
                        cache.insert((t * 1000 + i, 0), Arc::new(vec![t as u8; 1000]));
                        if let Some(b) = cache.get((t * 1000 + i / 2, 0)) {
                            assert!(b.iter().all(|&x| x == t as u8));
                        }
                    }
                });
            }
        });
        assert!(cache.used() <= 64 * 1024);
    }
}
