//! Bounds on the work one request does over a file's chunks, whatever its
//! arguments (engine/DESIGN.md, "Bounded work per request").
//!
//! A file may be 2^58 bytes long and hold data in three chunks. Work over a
//! byte range — fallocate's punch and zero, SEEK_DATA — visits only the
//! chunks that exist (the engines list them: SQLite by an index range on
//! `jfs_chunk`, Redis by probing the keys of a short range or SCANning for
//! `c{ino}_*` over a long one), and changes them [`CHUNKS_PER_TX`] at a time,
//! one transaction each, so no transaction holds the volume's write lock
//! for long. A chunk that does not exist reads as zeros, so a hole written
//! over it would change nothing: it is skipped.
//!
//! Directory listings are bounded the same way: the VFS reads a directory
//! a page at a time ([`crate::meta::Meta::readdir_page`]).
//!
//! [`WorkCounters`] count what was visited, for tests and metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::meta::{CHUNK_SIZE, MAX_FILE_LENGTH};

/// `FALLOC_FL_KEEP_SIZE`.
pub(crate) const FALLOC_KEEP_SIZE: u32 = 0x01;
/// `FALLOC_FL_PUNCH_HOLE`.
pub(crate) const FALLOC_PUNCH_HOLE: u32 = 0x02;
/// `FALLOC_FL_COLLAPSE_RANGE`.
const FALLOC_COLLAPSE_RANGE: u32 = 0x08;
/// `FALLOC_FL_ZERO_RANGE`.
pub(crate) const FALLOC_ZERO_RANGE: u32 = 0x10;
/// `FALLOC_FL_INSERT_RANGE`.
const FALLOC_INSERT_RANGE: u32 = 0x20;

/// The most chunks one transaction of a range operation changes.
pub const CHUNKS_PER_TX: usize = 256;

/// Redis: a range of at most this many chunk indexes is probed key by key
/// (one pipelined `EXISTS` each); a longer one is found with `SCAN`, whose
/// cost is the size of the database, not the length of the range.
pub const PROBE_SPAN: u32 = 4096;

/// The most bytes a node's list of extended attribute names may take, NULs
/// included (Linux `XATTR_LIST_MAX`: no LISTXATTR could return more). A new
/// name past it is refused with ENOSPC, so LISTXATTR's work is bounded.
pub(crate) const XATTR_LIST_MAX: usize = 65536;

/// Checks fallocate's arguments (the rules both engines share); returns
/// the end of the range.
pub(crate) fn check_fallocate(mode: u32, offset: u64, len: u64) -> Result<u64> {
    if mode & (FALLOC_COLLAPSE_RANGE | FALLOC_INSERT_RANGE) != 0 {
        return Err(Error::NotSupported(
            "fallocate collapse/insert range is not supported".into(),
        ));
    }
    if mode & FALLOC_PUNCH_HOLE != 0 && mode & FALLOC_KEEP_SIZE == 0 {
        return Err(Error::Invalid(
            "punching a hole needs FALLOC_FL_KEEP_SIZE".into(),
        ));
    }
    if len == 0 {
        return Err(Error::Invalid("fallocate of zero bytes".into()));
    }
    let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
    if end > MAX_FILE_LENGTH {
        return Err(Error::FileTooBig);
    }
    Ok(end)
}

/// Whether a fallocate mode writes holes (punch or zero).
pub(crate) fn writes_holes(mode: u32) -> bool {
    mode & (FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0
}

/// The chunk indexes `[start, stop)` touches (`stop > start`).
pub(crate) fn chunk_span(start: u64, stop: u64) -> std::ops::RangeInclusive<u32> {
    let first = (start / CHUNK_SIZE) as u32;
    let last = ((stop - 1) / CHUNK_SIZE) as u32;
    first..=last
}

/// The part of chunk `indx` inside the byte range `[start, stop)`, as
/// (chunk offset, length); None when they do not meet.
pub(crate) fn part_in_chunk(indx: u32, start: u64, stop: u64) -> Option<(u32, u32)> {
    let base = u64::from(indx) * CHUNK_SIZE;
    let from = start.max(base);
    let to = stop.min(base + CHUNK_SIZE);
    (from < to).then(|| ((from - base) as u32, (to - from) as u32))
}

/// What range operations of one metadata engine visited, since it opened.
#[derive(Debug, Default)]
pub struct WorkCounters {
    chunks_visited: AtomicU64,
    chunk_probes: AtomicU64,
    scan_calls: AtomicU64,
    range_transactions: AtomicU64,
    dir_entries_read: AtomicU64,
}

/// A copy of [`WorkCounters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkStats {
    /// Existing chunks that range operations (fallocate, chunk listings for
    /// SEEK_DATA) read or changed.
    pub chunks_visited: u64,
    /// Chunk keys probed one by one (Redis, short ranges).
    pub chunk_probes: u64,
    /// `SCAN` calls made to find a file's chunks (Redis, long ranges).
    pub scan_calls: u64,
    /// Transactions that range operations committed.
    pub range_transactions: u64,
    /// Directory entries that paged listings ([`crate::meta::Meta::readdir_page`])
    /// read from the store.
    pub dir_entries_read: u64,
}

impl WorkCounters {
    /// Counts `n` existing chunks visited.
    pub(crate) fn visited(&self, n: usize) {
        self.chunks_visited.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts `n` chunk keys probed.
    pub(crate) fn probed(&self, n: usize) {
        self.chunk_probes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts one SCAN call.
    pub(crate) fn scanned(&self) {
        self.scan_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one committed transaction of a range operation.
    pub(crate) fn transaction(&self) {
        self.range_transactions.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` directory entries read by a paged listing.
    pub(crate) fn listed(&self, n: usize) {
        self.dir_entries_read.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> WorkStats {
        WorkStats {
            chunks_visited: self.chunks_visited.load(Ordering::Relaxed),
            chunk_probes: self.chunk_probes.load(Ordering::Relaxed),
            scan_calls: self.scan_calls.load(Ordering::Relaxed),
            range_transactions: self.range_transactions.load(Ordering::Relaxed),
            dir_entries_read: self.dir_entries_read.load(Ordering::Relaxed),
        }
    }
}

impl WorkStats {
    /// The work done between `earlier` and `self`.
    pub fn since(&self, earlier: &WorkStats) -> WorkStats {
        WorkStats {
            chunks_visited: self.chunks_visited - earlier.chunks_visited,
            chunk_probes: self.chunk_probes - earlier.chunk_probes,
            scan_calls: self.scan_calls - earlier.scan_calls,
            range_transactions: self.range_transactions - earlier.range_transactions,
            dir_entries_read: self.dir_entries_read - earlier.dir_entries_read,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_chunks() {
        assert_eq!(chunk_span(0, 1), 0..=0);
        assert_eq!(chunk_span(CHUNK_SIZE - 1, CHUNK_SIZE + 1), 0..=1);
        assert_eq!(part_in_chunk(0, 100, 200), Some((100, 100)));
        assert_eq!(
            part_in_chunk(1, 100, 3 * CHUNK_SIZE),
            Some((0, CHUNK_SIZE as u32))
        );
        assert_eq!(part_in_chunk(2, 100, 2 * CHUNK_SIZE), None);
        assert_eq!(
            part_in_chunk(2, 2 * CHUNK_SIZE + 5, 2 * CHUNK_SIZE + 7),
            Some((5, 2))
        );
    }

    #[test]
    fn fallocate_arguments() {
        assert!(matches!(
            check_fallocate(0x08, 0, 1),
            Err(Error::NotSupported(_))
        ));
        assert!(matches!(
            check_fallocate(0x02, 0, 1),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(check_fallocate(0, 0, 0), Err(Error::Invalid(_))));
        assert!(matches!(
            check_fallocate(0, u64::MAX, 2),
            Err(Error::FileTooBig)
        ));
        assert_eq!(check_fallocate(0x03, 10, 5).ok(), Some(15));
    }
}
