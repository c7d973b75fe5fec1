//! Resolved slice lists, cached briefly and tied to write generations.
//!
//! Block contents never change (a slice id is never reused, so the bytes of
//! block `indx` of slice `id` are fixed once stored), which is why the block
//! caches need no invalidation. The one mutable mapping the read path caches
//! is a chunk's visible pieces: (inode, chunk index) → pieces. A commit, a
//! truncate, a fallocate or a compaction changes it. See `engine/DESIGN.md`
//! ("Coherence") for the whole rule; this module enforces its core:
//!
//! - every change bumps the *generation* of the inode (sharded: inodes that
//!   share a shard share a counter, which costs at most a needless miss) in
//!   the same critical section that drops the cached lists;
//! - a lookup that misses notes the generation *before* it asks the metadata
//!   engine, and installs what it read only if the generation is unchanged
//!   when it comes back. A resolution that raced a change is used by its own
//!   (concurrent) caller at most, never cached for later readers.
//!
//! Writers call [`ChunkCache::invalidate`] right after each chunk commit and
//! before their commit lock is released, so a reader that waited for that
//! lock (every read first commits the file's buffered writes) finds the new
//! list.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::chunk::{Piece, visible};
use crate::error::Result;
use crate::meta::{Ino, Meta};

/// How long a chunk's resolved slice list is trusted without asking the
/// metadata engine again. Changes made through this process invalidate it at
/// once; the limit bounds how stale another client's writes may look.
const CHUNK_TTL: Duration = Duration::from_secs(1);

/// Generation counters, one per shard of inodes.
const GEN_SHARDS: usize = 256;

/// Entries past which expired ones are swept at the next insert.
const SWEEP_AT: usize = 65_536;

#[derive(Debug)]
struct Entry {
    pieces: Arc<Vec<Piece>>,
    at: Instant,
}

#[derive(Debug)]
struct State {
    /// Per inode, per chunk index: so an inode's lists go in one step.
    entries: HashMap<Ino, HashMap<u32, Entry>>,
    /// Lists held in `entries`.
    count: usize,
    gens: Box<[u64; GEN_SHARDS]>,
}

impl State {
    fn gen_slot(&mut self, ino: Ino) -> &mut u64 {
        // Fibonacci hashing spreads consecutive inode numbers.
        let shard = (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % GEN_SHARDS;
        &mut self.gens[shard]
    }

    fn remove_inode(&mut self, ino: Ino) {
        if let Some(m) = self.entries.remove(&ino) {
            self.count -= m.len();
        }
    }

    fn remove(&mut self, ino: Ino, indx: u32) {
        if let Some(m) = self.entries.get_mut(&ino)
            && m.remove(&indx).is_some()
        {
            self.count -= 1;
            if m.is_empty() {
                self.entries.remove(&ino);
            }
        }
    }

    fn insert(&mut self, ino: Ino, indx: u32, e: Entry) {
        if self.count >= SWEEP_AT {
            self.entries.retain(|_, m| {
                m.retain(|_, e| e.at.elapsed() < CHUNK_TTL);
                !m.is_empty()
            });
            self.count = self.entries.values().map(HashMap::len).sum();
        }
        if self
            .entries
            .entry(ino)
            .or_default()
            .insert(indx, e)
            .is_none()
        {
            self.count += 1;
        }
    }
}

/// A function run between the metadata read and the install of a missed
/// lookup.
#[cfg(test)]
pub(crate) struct Hook(pub(crate) Box<dyn Fn(Ino, u32) + Send>);

#[cfg(test)]
impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

/// The resolved slice lists of one volume's chunks.
#[derive(Debug)]
pub struct ChunkCache {
    state: Mutex<State>,
    /// Runs between the metadata read and the install of a missed lookup
    /// (tests use it to change the chunk in exactly that window).
    #[cfg(test)]
    pub(crate) after_resolve: Mutex<Option<Hook>>,
}

impl Default for ChunkCache {
    fn default() -> Self {
        ChunkCache {
            state: Mutex::new(State {
                entries: HashMap::new(),
                count: 0,
                gens: Box::new([0; GEN_SHARDS]),
            }),
            #[cfg(test)]
            after_resolve: Mutex::new(None),
        }
    }
}

impl ChunkCache {
    /// An empty cache.
    pub fn new() -> Arc<ChunkCache> {
        Arc::new(ChunkCache::default())
    }

    /// The visible pieces of chunk `indx` of `ino`: the cached list while it
    /// is fresh, else the list `meta` holds now (cached unless the chunk
    /// changed while it was read).
    pub fn pieces(&self, meta: &dyn Meta, ino: Ino, indx: u32) -> Result<Arc<Vec<Piece>>> {
        let seen = {
            let mut st = self.state.lock();
            if let Some(e) = st.entries.get(&ino).and_then(|m| m.get(&indx))
                && e.at.elapsed() < CHUNK_TTL
            {
                return Ok(e.pieces.clone());
            }
            *st.gen_slot(ino)
        };
        // A metadata round trip waits.
        sluice_api::wait::may_wait()?;
        let slices =
            crate::metrics::meta_op(crate::metrics::MetaOp::Read, || meta.read_chunk(ino, indx))?;
        let pieces = Arc::new(visible(&slices));
        #[cfg(test)]
        if let Some(hook) = &*self.after_resolve.lock() {
            (hook.0)(ino, indx);
        }
        let mut st = self.state.lock();
        if *st.gen_slot(ino) == seen {
            st.insert(
                ino,
                indx,
                Entry {
                    pieces: pieces.clone(),
                    at: Instant::now(),
                },
            );
        }
        Ok(pieces)
    }

    /// Chunk `indx` of `ino` changed (a commit or compaction of it).
    pub fn invalidate(&self, ino: Ino, indx: u32) {
        let mut st = self.state.lock();
        *st.gen_slot(ino) += 1;
        st.remove(ino, indx);
    }

    /// Every chunk of `ino` may have changed (truncate, fallocate, a failed
    /// commit whose extent is unknown, or an open: another host may have
    /// written the file).
    pub fn invalidate_inode(&self, ino: Ino) {
        let mut st = self.state.lock();
        *st.gen_slot(ino) += 1;
        st.remove_inode(ino);
    }
}
