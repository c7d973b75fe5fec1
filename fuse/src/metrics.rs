//! Per-operation counters of a FUSE session, whichever transport carries it
//! (the host's `/dev/fuse` or a virtio-fs queue): requests and their
//! latency by operation (named as JuiceFS names them: [`method_name`]), the
//! errno of every error reply, READ and WRITE sizes.
//! The dispatcher updates them in [`crate::Dispatcher::handle_message`];
//! a metrics endpoint reads [`OpMetrics::snapshot`] when it is scraped.

use std::io;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use sluice_metrics::{Histogram, HistogramSnapshot, Sharded, add, get};

use crate::abi::opcode;
use crate::dispatch::{ReadReply, ReplySink};
use crate::reply::ReplyHead;

/// Opcodes below this are counted one by one; the rest as `unknown`.
const OPCODES: usize = 64;
/// Errnos below this are counted one by one; the rest as this.
const ERRNOS: usize = 134;

/// The latency buckets JuiceFS 1.4 gives
/// `fuse_ops_durations_histogram_seconds` (10 µs × 1.8^k, 29 of them), in
/// nanoseconds.
pub fn op_latency_bounds() -> Vec<u64> {
    sluice_metrics::exponential_bounds(10_000.0, 1.8, 29)
}

/// The `method` label of an opcode's requests: the name JuiceFS's access
/// log and its `fuse_ops_*` metrics give the operation (`lookup`, `read`,
/// …), so that JuiceFS dashboards and alerts find them. Where one JuiceFS
/// operation has several opcodes they share its name (RENAME2 is `rename`,
/// READDIRPLUS `readdir`, SETLKW `setlk`); an opcode JuiceFS does not log
/// (INIT, FORGET, …) is its FUSE name in lower case.
pub fn method_name(op: u32) -> &'static str {
    match op {
        opcode::LOOKUP => "lookup",
        opcode::FORGET => "forget",
        opcode::GETATTR => "getattr",
        opcode::SETATTR => "setattr",
        opcode::READLINK => "readlink",
        opcode::SYMLINK => "symlink",
        opcode::MKNOD => "mknod",
        opcode::MKDIR => "mkdir",
        opcode::UNLINK => "unlink",
        opcode::RMDIR => "rmdir",
        opcode::RENAME | opcode::RENAME2 => "rename",
        opcode::LINK => "link",
        opcode::OPEN => "open",
        opcode::READ => "read",
        opcode::WRITE => "write",
        opcode::STATFS => "statfs",
        opcode::RELEASE => "release",
        opcode::FSYNC => "fsync",
        opcode::SETXATTR => "setxattr",
        opcode::GETXATTR => "getxattr",
        opcode::LISTXATTR => "listxattr",
        opcode::REMOVEXATTR => "removexattr",
        opcode::FLUSH => "flush",
        opcode::INIT => "init",
        opcode::OPENDIR => "opendir",
        opcode::READDIR | opcode::READDIRPLUS => "readdir",
        opcode::RELEASEDIR => "releasedir",
        opcode::FSYNCDIR => "fsyncdir",
        opcode::GETLK => "getlk",
        opcode::SETLK | opcode::SETLKW => "setlk",
        opcode::ACCESS => "access",
        opcode::CREATE => "create",
        opcode::INTERRUPT => "interrupt",
        opcode::BMAP => "bmap",
        opcode::DESTROY => "destroy",
        opcode::IOCTL => "ioctl",
        opcode::POLL => "poll",
        opcode::NOTIFY_REPLY => "notify_reply",
        opcode::BATCH_FORGET => "batch_forget",
        opcode::FALLOCATE => "fallocate",
        opcode::LSEEK => "lseek",
        opcode::COPY_FILE_RANGE => "copy_file_range",
        opcode::SETUPMAPPING => "setupmapping",
        opcode::REMOVEMAPPING => "removemapping",
        opcode::SYNCFS => "syncfs",
        opcode::TMPFILE => "tmpfile",
        _ => "unknown",
    }
}

/// The size buckets JuiceFS gives `fuse_read_size_bytes` and
/// `fuse_written_size_bytes` (4 KiB steps up to 128 KiB).
pub fn io_size_bounds() -> Vec<u64> {
    sluice_metrics::linear_bounds(4096, 4096, 32)
}

/// One thread's share of the counters.
#[derive(Debug)]
struct Shard {
    count: [AtomicU64; OPCODES],
    nanos: [AtomicU64; OPCODES],
    errors: [AtomicU64; ERRNOS],
    latency: Histogram,
    read_size: Histogram,
    written_size: Histogram,
}

impl Default for Shard {
    fn default() -> Self {
        Shard {
            count: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: Histogram::new(op_latency_bounds()),
            read_size: Histogram::new(io_size_bounds()),
            written_size: Histogram::new(io_size_bounds()),
        }
    }
}

/// A session's per-operation counters (share one `Arc` between the
/// sessions of a daemon so its counts outlive each connection).
#[derive(Debug, Default)]
pub struct OpMetrics {
    shards: Sharded<Shard>,
}

/// [`OpMetrics`] summed at one moment.
#[derive(Debug, Clone, Default)]
pub struct OpSnapshot {
    /// (method name, requests, nanoseconds spent) for each method seen
    /// ([`method_name`]; opcodes of one method summed), sorted by name.
    pub ops: Vec<(&'static str, u64, u64)>,
    /// Latency of every request, in nanoseconds.
    pub latency: HistogramSnapshot,
    /// (errno, error replies) for each errno sent.
    pub errors: Vec<(i32, u64)>,
    /// Bytes returned by each READ.
    pub read_size: HistogramSnapshot,
    /// Bytes carried by each WRITE.
    pub written_size: HistogramSnapshot,
}

impl OpSnapshot {
    /// Requests of all opcodes.
    pub fn requests(&self) -> u64 {
        self.ops.iter().map(|o| o.1).sum()
    }
}

impl OpMetrics {
    /// Counts one request of `opcode` that started at `started` and was
    /// answered with `errno` (0: success).
    pub fn record(&self, opcode: u32, started: Instant, errno: i32) {
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let shard = self.shards.local();
        let op = (opcode as usize).min(OPCODES - 1);
        add(&shard.count[op], 1);
        add(&shard.nanos[op], nanos);
        shard.latency.observe(nanos);
        if errno != 0 {
            let e = (errno.unsigned_abs() as usize).min(ERRNOS - 1);
            add(&shard.errors[e], 1);
        }
    }

    /// Counts a READ that returned `bytes`.
    pub fn read(&self, bytes: usize) {
        self.shards.local().read_size.observe(bytes as u64);
    }

    /// Counts a WRITE of `bytes`.
    pub fn written(&self, bytes: usize) {
        self.shards.local().written_size.observe(bytes as u64);
    }

    /// The counters of all threads, summed.
    pub fn snapshot(&self) -> OpSnapshot {
        let mut s = OpSnapshot::default();
        let mut count = [0u64; OPCODES];
        let mut nanos = [0u64; OPCODES];
        let mut errors = [0u64; ERRNOS];
        for shard in self.shards.slots() {
            for i in 0..OPCODES {
                count[i] += get(&shard.count[i]);
                nanos[i] += get(&shard.nanos[i]);
            }
            for (e, c) in errors.iter_mut().zip(shard.errors.iter()) {
                *e += get(c);
            }
            shard.latency.add_to(&mut s.latency);
            shard.read_size.add_to(&mut s.read_size);
            shard.written_size.add_to(&mut s.written_size);
        }
        let mut by_method: std::collections::BTreeMap<&'static str, (u64, u64)> =
            Default::default();
        for i in (0..OPCODES).filter(|&i| count[i] > 0) {
            let m = by_method.entry(method_name(i as u32)).or_default();
            m.0 += count[i];
            m.1 += nanos[i];
        }
        s.ops = by_method.into_iter().map(|(m, (n, t))| (m, n, t)).collect();
        s.errors = (1..ERRNOS)
            .filter(|&e| errors[e] > 0)
            .map(|e| (e as i32, errors[e]))
            .collect();
        s
    }
}

/// A reply sink that notes the errno of what went out, for [`OpMetrics`]
/// (a READ's data length is counted where the read ends).
pub(crate) struct Observed<'s, S: ReplySink + ?Sized> {
    pub inner: &'s mut S,
    /// The errno of the last reply (0: success or no reply).
    pub errno: i32,
}

impl<S: ReplySink + ?Sized> ReplySink for Observed<'_, S> {
    fn send(&mut self, head: &ReplyHead, payload: &[u8]) -> io::Result<()> {
        self.errno = -head.header().error;
        self.inner.send(head, payload)
    }

    fn read_reply(&mut self, unique: u64, size: usize) -> io::Result<Option<&mut dyn ReadReply>> {
        self.inner.read_reply(unique, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_errors_and_sizes_add_up() {
        let m = OpMetrics::default();
        let t = Instant::now();
        m.record(opcode::LOOKUP, t, 0);
        m.record(opcode::LOOKUP, t, libc::ENOENT);
        m.record(opcode::READ, t, 0);
        m.record(opcode::READDIR, t, 0);
        m.record(opcode::READDIRPLUS, t, 0);
        m.record(9999, t, 100_000);
        m.read(8192);
        m.written(100);
        let s = m.snapshot();
        assert_eq!(s.requests(), 6);
        let names: Vec<_> = s.ops.iter().map(|o| (o.0, o.1)).collect();
        assert_eq!(
            names,
            [("lookup", 2), ("read", 1), ("readdir", 2), ("unknown", 1)]
        );
        assert_eq!(s.errors, vec![(libc::ENOENT, 1), (ERRNOS as i32 - 1, 1)]);
        assert_eq!(s.latency.count(), 6);
        assert_eq!(s.read_size.count(), 1);
        assert_eq!(s.read_size.sum, 8192);
        assert_eq!(s.written_size.sum, 100);
    }
}
