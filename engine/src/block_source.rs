//! Blocks held by another process of the same host: the host daemon
//! (`sluice host`, the `sluice-host` crate), which owns the volume's block
//! caches and fetches each block once for every VM's server. The reader
//! asks a [`BlockSource`] before it fetches a block itself; `None` means
//! "not from here" (the source is detached, or holds no copy and was told
//! not to fetch), and the reader then reads the block as a standalone
//! server does.

use std::sync::Arc;

use crate::error::Result;
use crate::object::disk_cache::CachedFile;

/// How far a [`BlockSource`] may go for a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Fetch it if no cache holds it (one fetch however many ask).
    Fetch,
    /// Only a copy already cached; `None` on a miss (a small random read
    /// then fetches just its bytes, as standalone).
    CachedOnly,
}

/// A block's bytes, mapped from memory another process holds (read-only).
pub trait BlockBytes: AsRef<[u8]> + Send + Sync + std::fmt::Debug {}

/// A block as a [`BlockSource`] hands it out.
#[derive(Debug)]
pub enum SourcedBlock {
    /// The decompressed block in memory (a read-only mapping).
    Memory(Arc<dyn BlockBytes>),
    /// A disk-cache file holding the raw (uncompressed) block, with its
    /// segment CRCs: the reader's destination checks what lands.
    File(CachedFile),
}

/// Where blocks come from before the reader's own fetch.
pub trait BlockSource: Send + Sync + std::fmt::Debug {
    /// Block `indx` of slice `id` (of `size` bytes). `None`: not from this
    /// source now (detached, or a miss with [`Ask::CachedOnly`]); an
    /// error is `WouldBlock` on a thread that must not wait (the fetch is
    /// started, so a retry finds it), or why the source failed.
    fn block(&self, id: u64, size: u32, indx: u32, ask: Ask) -> Option<Result<SourcedBlock>>;

    /// A [`SourcedBlock::File`] this source handed out failed the check
    /// where its bytes landed (`why`); the source checks it itself before
    /// dropping it.
    fn damaged(&self, id: u64, size: u32, indx: u32, why: &str);
}
