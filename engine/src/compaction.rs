//! Background compaction: a chunk that collected many slices (many small or
//! overlapping writes) is rewritten as one slice holding what it shows, so
//! reads resolve fewer pieces and fetch fewer objects. Slices that lose
//! their last reference are released by the metadata engine, which calls the
//! slice releaser to delete their objects.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::block_key::slice_keys;
use crate::chunk::visible;
use crate::error::Result;
use crate::meta::{Ino, Slice};
use crate::reader::Reader;
use crate::volume::Volume;
use crate::writer::upload_slice;

/// A chunk with at least this many slices is compacted.
pub const COMPACT_THRESHOLD: usize = 16;

/// Rewrites chunk `indx` of `ino` as one data slice (plus hole records for
/// leading or trailing holes). Returns whether the chunk was changed; `false`
/// when there was nothing to gain or the chunk changed meanwhile (the new
/// slice's objects are then deleted).
pub fn compact_chunk(
    vol: &Volume,
    reader: &Reader,
    ino: Ino,
    indx: u32,
    threads: usize,
) -> Result<bool> {
    let old = vol.meta.read_chunk(ino, indx)?;
    if old.len() < 2 {
        return Ok(false);
    }
    let pieces = visible(&old);
    let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else {
        // Only empty records: nothing shows, so nothing needs to stay.
        return commit(vol, reader, ino, indx, &old, &[]);
    };
    let data_start = pieces
        .iter()
        .find(|p| !p.is_hole())
        .map(|p| u64::from(p.pos));
    let data_end = pieces.iter().rev().find(|p| !p.is_hole()).map(|p| p.end());
    let hole = |a: u64, b: u64| Slice {
        pos: a as u32,
        id: 0,
        size: 0,
        off: 0,
        len: (b - a) as u32,
    };
    let mut new = Vec::new();
    let (Some(ds), Some(de)) = (data_start, data_end) else {
        new.push(hole(u64::from(first.pos), last.end()));
        return commit(vol, reader, ino, indx, &old, &new);
    };
    if u64::from(first.pos) < ds {
        new.push(hole(u64::from(first.pos), ds));
    }
    let mut buf = vec![0u8; (de - ds) as usize];
    reader.read_pieces(&pieces, ds, &mut buf)?;
    let slice = upload_slice(vol, &buf, ds as u32, threads)?;
    drop(buf);
    // The new objects are durable before the commit that replaces the old
    // slices (whose objects it then deletes) can be.
    vol.store
        .sync_objects(&slice_keys(
            vol.name(),
            slice.id,
            slice.size,
            vol.block_size,
        ))
        .map_err(crate::object::Unsynced::into_error)?;
    new.push(slice);
    if last.end() > de {
        new.push(hole(de, last.end()));
    }
    let changed = commit(vol, reader, ino, indx, &old, &new);
    match changed {
        Ok(true) => crate::metrics::COMPACTED.observe(de - ds),
        // Not committed: the new objects are orphans. On a clean "changed
        // meanwhile" drop them; on an error (unknown) leave them for gc.
        Ok(false) => {
            for key in slice_keys(vol.name(), slice.id, slice.size, vol.block_size) {
                if let Err(e) = vol.store.delete(&key) {
                    log::warn!("cannot delete unused compaction object {key}: {e}");
                }
            }
        }
        Err(_) => {}
    }
    changed
}

fn commit(
    vol: &Volume,
    reader: &Reader,
    ino: Ino,
    indx: u32,
    old: &[Slice],
    new: &[Slice],
) -> Result<bool> {
    let ok = vol.meta.compact_chunk(ino, indx, old, new)?;
    reader.invalidate_chunk(ino, indx);
    if ok {
        log::debug!(
            "compacted chunk {indx} of inode {ino}: {} slices into {}",
            old.len(),
            new.len()
        );
    }
    Ok(ok)
}

/// The background compactor: a thread that compacts the chunks it is told
/// about, each at most once while queued.
#[derive(Debug)]
pub struct Compactor {
    tx: Mutex<Option<mpsc::Sender<(Ino, u32)>>>,
    queued: Arc<Mutex<HashSet<(Ino, u32)>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Compactor {
    /// Starts the compaction thread.
    pub fn start(vol: Arc<Volume>, reader: Arc<Reader>, threads: usize) -> Result<Compactor> {
        let (tx, rx) = mpsc::channel::<(Ino, u32)>();
        let queued = Arc::new(Mutex::new(HashSet::new()));
        let q = queued.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-compact".into())
            .spawn(move || {
                for (ino, indx) in rx {
                    q.lock().remove(&(ino, indx));
                    if let Err(e) = compact_chunk(&vol, &reader, ino, indx, threads) {
                        log::warn!("compaction of chunk {indx} of inode {ino} failed: {e}");
                    }
                }
            })?;
        Ok(Compactor {
            tx: Mutex::new(Some(tx)),
            queued,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Asks for chunk `indx` of `ino` to be compacted soon.
    pub fn request(&self, ino: Ino, indx: u32) {
        if !self.queued.lock().insert((ino, indx)) {
            return;
        }
        if let Some(tx) = self.tx.lock().as_ref() {
            let _ = tx.send((ino, indx));
        }
    }

    /// Finishes the queued work and stops the thread.
    pub fn stop(&self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.stop();
    }
}
