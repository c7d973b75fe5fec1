//! The host page cache: how big memory is, and dropping the cache so that a benchmark
//! measures storage rather than RAM.

use std::io;

/// Total physical memory of this machine in bytes (from `/proc/meminfo`), if it can be read.
pub fn total_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Flushes dirty pages and drops the clean page cache, dentries and inodes
/// (`sync; echo 3 > /proc/sys/vm/drop_caches`). Needs root.
pub fn drop_caches() -> io::Result<()> {
    // SAFETY: sync() takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n")
}
