//! Removing objects no slice references: the slice releaser the metadata
//! engine calls when a slice loses its last reference, and a full sweep
//! (`sluice gc`) for objects left behind by crashes or failed deletions.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::block_cache::BlockCache;
use crate::block_key::{block_len, chunks_prefix, parse_block_key, slice_keys};
use crate::error::Result;
use crate::meta::{ReleasedSlice, SliceReleaser};
use crate::object::ObjectStore;
use crate::volume::Volume;

/// A releaser that deletes a released slice's objects and drops its blocks
/// from `cache`. It reports failure if any object could not be deleted, so
/// the engine keeps the slice for a later retry.
pub fn slice_releaser(
    store: Arc<dyn ObjectStore>,
    volume: String,
    block_size: u32,
    cache: Arc<BlockCache>,
) -> SliceReleaser {
    Arc::new(move |s: ReleasedSlice| {
        cache.remove_slice(s.id);
        let mut ok = true;
        for key in slice_keys(&volume, s.id, s.size, block_size) {
            if let Err(e) = store.delete(&key) {
                log::warn!("cannot delete released object {key}: {e}");
                ok = false;
            }
        }
        ok
    })
}

/// What a gc sweep found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Objects listed under the volume's `chunks/` (what the sweep looks
    /// at; known once the listing is done).
    pub listed: usize,
    /// Block objects looked at.
    pub scanned: usize,
    /// Objects some slice references.
    pub referenced: usize,
    /// Unreferenced objects spared because they are younger than the limit
    /// (they may belong to a slice being written).
    pub too_recent: usize,
    /// Unreferenced objects deleted (or, in a dry run, that would be).
    pub orphans: Vec<String>,
    /// Bytes those orphans hold.
    pub orphan_bytes: u64,
}

/// Sweeps the volume's block objects and deletes those no slice references
/// and that are older than `min_age` (slices still being written have
/// objects but no reference yet). With `dry_run`, deletes nothing.
/// `progress` is told the report so far: once the objects are listed, then
/// after every [`GC_PROGRESS_EVERY`] objects looked at and at the end.
pub fn collect_garbage(
    vol: &Volume,
    min_age: Duration,
    dry_run: bool,
    progress: &mut dyn FnMut(&GcReport),
) -> Result<GcReport> {
    // List objects before reading the chunks: a slice committed in between
    // then counts as referenced, and one committed later is protected by age.
    let objects = vol.store.list(&chunks_prefix(vol.name()))?;
    let mut sizes: HashMap<u64, u32> = HashMap::new();
    for (_, _, slices) in vol.meta.list_chunks()? {
        for s in slices.iter().filter(|s| s.id != 0) {
            sizes.insert(s.id, s.size);
        }
    }
    let now = SystemTime::now();
    let mut report = GcReport {
        listed: objects.len(),
        ..GcReport::default()
    };
    progress(&report);
    for (i, obj) in objects.into_iter().enumerate() {
        if i > 0 && i % GC_PROGRESS_EVERY == 0 {
            progress(&report);
        }
        let Some((id, indx, bsize)) = parse_block_key(&obj.key) else {
            continue;
        };
        report.scanned += 1;
        let referenced = sizes.get(&id).is_some_and(|&size| {
            indx < size.div_ceil(vol.block_size) && block_len(size, vol.block_size, indx) == bsize
        });
        if referenced {
            report.referenced += 1;
            continue;
        }
        let age = now.duration_since(obj.mtime).unwrap_or_default();
        if age < min_age {
            report.too_recent += 1;
            continue;
        }
        if !dry_run {
            vol.store.delete(&obj.key)?;
            log::info!("gc: deleted unreferenced object {}", obj.key);
        }
        report.orphan_bytes += obj.size;
        report.orphans.push(obj.key);
    }
    progress(&report);
    Ok(report)
}

/// How many objects `collect_garbage` looks at between two progress reports.
pub const GC_PROGRESS_EVERY: usize = 256;
