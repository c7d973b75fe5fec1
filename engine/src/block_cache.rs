//! A bounded in-memory cache of decompressed blocks, keyed by (slice id,
//! block index). Slices are immutable once written, so an entry never goes
//! stale; it only ages out.
//!
//! The cache is split into shards, each a small LRU behind its own lock, so
//! concurrent readers of different blocks rarely meet on a lock and no lock
//! is held while data is copied.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
}

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
}

impl std::fmt::Display for BlockCacheStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} hits ({} MiB), {} misses, {} inserts ({} MiB), {} evictions ({} MiB), {} MiB held",
            self.hits,
            self.hit_bytes >> 20,
            self.misses,
            self.inserts,
            self.insert_bytes >> 20,
            self.evictions,
            self.evicted_bytes >> 20,
            self.used_bytes >> 20
        )
    }
}

impl BlockCache {
    /// A cache holding at most about `capacity` bytes of blocks (0 disables it).
    pub fn new(capacity: usize) -> BlockCache {
        BlockCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_limit: capacity / SHARDS,
            counters: Counters::default(),
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
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .evicted_bytes
                    .fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }
        s.tick += 1;
        let tick = s.tick;
        s.order.insert(tick, id);
        s.map.insert(id, (data, tick));
        s.bytes += len;
        self.counters.inserts.fetch_add(1, Ordering::Relaxed);
        self.counters
            .insert_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Drops every block of slice `id` (its objects are gone).
    pub fn remove_slice(&self, id: u64) {
        for shard in &self.shards {
            let mut s = shard.lock();
            let keys: Vec<BlockId> = s.map.keys().filter(|k| k.0 == id).copied().collect();
            for k in keys {
                if let Some((d, t)) = s.map.remove(&k) {
                    s.bytes -= d.len();
                    s.order.remove(&t);
                }
            }
        }
    }

    /// Whether a block is cached (without marking it used).
    pub fn contains(&self, id: BlockId) -> bool {
        self.shard(id).lock().map.contains_key(&id)
    }

    /// Drops one block; whether it was cached.
    pub fn remove(&self, id: BlockId) -> bool {
        let mut s = self.shard(id).lock();
        match s.map.remove(&id) {
            Some((d, t)) => {
                s.bytes -= d.len();
                s.order.remove(&t);
                true
            }
            None => false,
        }
    }

    /// Bytes currently cached.
    pub fn used(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
