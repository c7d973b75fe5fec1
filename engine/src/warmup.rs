//! Cache control for `sluice warmup`: pull the blocks of files and
//! directories into the caches ahead of a training run, drop them again, or
//! report how much of them is cached — in the manner of `juicefs warmup`.
//!
//! The work runs inside the daemon that serves the volume (its caches are
//! the ones that matter); the command line reaches it over the daemon's
//! control socket. Paths are resolved from the volume's root through the
//! metadata engine, directories are walked to every regular file below them,
//! and each file's *visible* blocks (what its reads would fetch, not slices
//! overwritten since) are collected once each.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::block_key::block_len;
use crate::error::{Error, Result};
use crate::meta::{CHUNK_SIZE, Context, FileType, Ino, ROOT_INO};
use crate::reader::Reader;

/// What to do with the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheOp {
    /// Fetch every block into the caches.
    Warmup,
    /// Drop every block from the caches.
    Evict,
    /// Count the blocks that are cached.
    Check,
}

/// One block of a file, as the reader fetches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRef {
    /// The slice id.
    pub id: u64,
    /// The slice's stored size.
    pub size: u32,
    /// The block index within the slice.
    pub indx: u32,
}

/// The files and blocks under some paths.
#[derive(Debug, Default)]
pub struct Target {
    /// Regular files found.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Their visible blocks, each once.
    pub blocks: Vec<BlockRef>,
}

/// Counts of a cache operation, updated while it runs.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Blocks to handle.
    pub blocks: u64,
    /// Blocks handled so far.
    pub done: u64,
    /// Bytes of the blocks handled so far.
    pub done_bytes: u64,
    /// Blocks found in a cache (check), fetched (warmup) or dropped (evict).
    pub hit: u64,
    /// Their bytes.
    pub hit_bytes: u64,
    /// Blocks that failed (warmup: could not be fetched).
    pub failed: u64,
}

/// Resolves `paths` (from the volume's root; `/` separated) to the regular
/// files at or below them and their visible blocks.
pub fn collect(reader: &Reader, paths: &[String]) -> Result<Target> {
    let meta = &reader.volume().meta;
    let ctx = Context::internal();
    let mut target = Target::default();
    let mut seen_files = HashSet::new();
    let mut seen_blocks = HashSet::new();
    let mut stack: Vec<Ino> = Vec::new();
    for path in paths {
        let mut ino = ROOT_INO;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            if part == ".." {
                return Err(Error::Invalid(format!("{path}: `..` is not allowed")));
            }
            ino = meta.lookup(&ctx, ino, part.as_bytes())?.0;
        }
        stack.push(ino);
    }
    let bs = reader.volume().block_size;
    while let Some(ino) = stack.pop() {
        let attr = meta.getattr(ino)?;
        match attr.typ {
            FileType::Directory => {
                for e in meta.readdir(&ctx, ino, false)? {
                    if e.name != b"." && e.name != b".." {
                        stack.push(e.inode);
                    }
                }
            }
            FileType::File if seen_files.insert(ino) => {
                target.files += 1;
                target.bytes += attr.length;
                for indx in 0..attr.length.div_ceil(CHUNK_SIZE) {
                    let indx = u32::try_from(indx).map_err(|_| Error::FileTooBig)?;
                    for p in reader.pieces(ino, indx)?.iter().filter(|p| !p.is_hole()) {
                        let first = p.off / bs;
                        let last = (p.off + p.len - 1) / bs;
                        for b in first..=last {
                            let r = BlockRef {
                                id: p.id,
                                size: p.size,
                                indx: b,
                            };
                            if seen_blocks.insert(r) {
                                target.blocks.push(r);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(target)
}

/// Runs `op` over `blocks` with `threads` threads, calling `report` with
/// the counts now and then (from one of the threads) and returning the
/// final counts.
pub fn run(
    reader: &Reader,
    op: CacheOp,
    blocks: &[BlockRef],
    threads: usize,
    report: &(dyn Fn(&Progress) + Sync),
) -> Progress {
    let bs = reader.volume().block_size;
    let next = AtomicU64::new(0);
    let [done, done_bytes, hit, hit_bytes, failed] = std::array::from_fn(|_| AtomicU64::new(0));
    let snapshot = || Progress {
        blocks: blocks.len() as u64,
        done: done.load(Ordering::Relaxed),
        done_bytes: done_bytes.load(Ordering::Relaxed),
        hit: hit.load(Ordering::Relaxed),
        hit_bytes: hit_bytes.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
    };
    let last_report = parking_lot::Mutex::new(std::time::Instant::now());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(b) = blocks.get(i) else { break };
                    let len = u64::from(block_len(b.size, bs, b.indx));
                    let found = match op {
                        CacheOp::Warmup => match reader.block(b.id, b.size, b.indx) {
                            Ok(_) => true,
                            Err(e) => {
                                log::warn!("warmup: block {} of slice {}: {e}", b.indx, b.id);
                                failed.fetch_add(1, Ordering::Relaxed);
                                false
                            }
                        },
                        CacheOp::Evict => reader.evict_block(b.id, b.size, b.indx),
                        CacheOp::Check => reader.is_cached(b.id, b.size, b.indx),
                    };
                    if found {
                        hit.fetch_add(1, Ordering::Relaxed);
                        hit_bytes.fetch_add(len, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    done_bytes.fetch_add(len, Ordering::Relaxed);
                    let mut at = last_report.lock();
                    if at.elapsed() >= std::time::Duration::from_millis(200) {
                        *at = std::time::Instant::now();
                        report(&snapshot());
                    }
                }
            });
        }
    });
    snapshot()
}
