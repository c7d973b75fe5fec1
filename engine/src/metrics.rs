//! The engine's process-wide counters for a metrics endpoint: object-store
//! requests (what JuiceFS reports as `object_request_*`), metadata
//! operations (`meta_ops_*`) and write transactions (`transaction_*`),
//! compactions (`compact_size_histogram_bytes`). Each is a few relaxed
//! atomic adds on a path that already waits for a network or disk round
//! trip, or makes a metadata call.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use sluice_metrics::{Histogram, HistogramSnapshot, Sharded, add, get};

use crate::error::{Error, Result};

/// Object-store methods, as JuiceFS labels them.
pub const OBJECT_METHODS: [&str; 5] = ["GET", "PUT", "HEAD", "DELETE", "LIST"];

/// One object-store method's counters.
#[derive(Debug)]
struct Method {
    latency: Histogram,
    bytes: AtomicU64,
}

/// Requests to the object store (the real one: S3 or the `file://`
/// directory, below the disk cache and the writeback stage).
#[derive(Debug)]
pub struct ObjectMetrics {
    methods: [Method; OBJECT_METHODS.len()],
    errors: AtomicU64,
    /// PUTs under way.
    uploading: AtomicI64,
}

/// [`ObjectMetrics`] at one moment.
#[derive(Debug, Clone, Default)]
pub struct ObjectSnapshot {
    /// (method, latency in nanoseconds, data bytes) for each method.
    pub methods: Vec<(&'static str, HistogramSnapshot, u64)>,
    /// Failed requests (not found included, as JuiceFS counts them).
    pub errors: u64,
    /// PUTs under way now (JuiceFS's `object_request_uploading`).
    pub uploading: u64,
}

/// The buckets JuiceFS gives `object_request_durations_histogram_seconds`
/// (10 ms × 1.5^k, 25 of them), in nanoseconds.
pub fn object_latency_bounds() -> Vec<u64> {
    sluice_metrics::exponential_bounds(10_000_000.0, 1.5, 25)
}

impl ObjectMetrics {
    fn new() -> ObjectMetrics {
        ObjectMetrics {
            methods: std::array::from_fn(|_| Method {
                latency: Histogram::new(object_latency_bounds()),
                bytes: AtomicU64::new(0),
            }),
            errors: AtomicU64::new(0),
            uploading: AtomicI64::new(0),
        }
    }

    /// Counts a PUT that starts now (`true`) or has ended (`false`).
    pub fn uploading(&self, started: bool) {
        self.uploading
            .fetch_add(if started { 1 } else { -1 }, Ordering::Relaxed);
    }

    /// Counts one request of method `OBJECT_METHODS[method]` that started
    /// at `started`, moved `bytes` and succeeded or not.
    pub fn record(&self, method: usize, started: Instant, bytes: usize, ok: bool) {
        let m = &self.methods[method];
        m.latency.observe_since(started);
        add(&m.bytes, bytes as u64);
        if !ok {
            add(&self.errors, 1);
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> ObjectSnapshot {
        ObjectSnapshot {
            methods: OBJECT_METHODS
                .iter()
                .zip(self.methods.iter())
                .map(|(name, m)| (*name, m.latency.snapshot(), get(&m.bytes)))
                .collect(),
            errors: get(&self.errors),
            uploading: self.uploading.load(Ordering::Relaxed).max(0) as u64,
        }
    }
}

/// Metadata write transactions: how long each took (restarts included)
/// and how often one restarted (SQLite busy, a Redis WATCH conflict).
#[derive(Debug)]
pub struct TxMetrics {
    latency: Histogram,
    restarts: AtomicU64,
}

/// The buckets JuiceFS gives `transaction_durations_histogram_seconds`
/// (100 µs × 1.5^k, 30 of them), in nanoseconds.
pub fn tx_latency_bounds() -> Vec<u64> {
    sluice_metrics::exponential_bounds(100_000.0, 1.5, 30)
}

impl TxMetrics {
    /// Counts a transaction that started at `started`.
    pub fn record(&self, started: Instant) {
        self.latency.observe_since(started);
    }

    /// Counts one restart.
    pub fn restarted(&self) {
        add(&self.restarts, 1);
    }

    /// (latency in nanoseconds, restarts) now.
    pub fn snapshot(&self) -> (HistogramSnapshot, u64) {
        (self.latency.snapshot(), get(&self.restarts))
    }
}

/// Group commits (`commit.rs`): how many groups ran, how many files'
/// commits they held, and how long a group's object sync and its metadata
/// transaction took.
#[derive(Debug)]
pub struct CommitMetrics {
    groups: AtomicU64,
    jobs: AtomicU64,
    sync: Histogram,
    record: Histogram,
}

/// [`CommitMetrics`] at one moment.
#[derive(Debug, Clone, Default)]
pub struct CommitSnapshot {
    /// Groups run.
    pub groups: u64,
    /// Files' commits they held.
    pub jobs: u64,
    /// Object syncs (nanoseconds), one per group with objects to sync.
    pub sync: HistogramSnapshot,
    /// Metadata transactions recording a group (nanoseconds).
    pub record: HistogramSnapshot,
}

impl CommitMetrics {
    /// Counts one group of `jobs` commits.
    pub fn group(&self, jobs: usize) {
        add(&self.groups, 1);
        add(&self.jobs, jobs as u64);
    }

    /// Counts an object sync that started at `started`.
    pub fn synced(&self, started: Instant) {
        self.sync.observe_since(started);
    }

    /// Counts a group's metadata transaction that started at `started`.
    pub fn recorded(&self, started: Instant) {
        self.record.observe_since(started);
    }

    /// The counters now.
    pub fn snapshot(&self) -> CommitSnapshot {
        CommitSnapshot {
            groups: get(&self.groups),
            jobs: get(&self.jobs),
            sync: self.sync.snapshot(),
            record: self.record.snapshot(),
        }
    }
}

/// This process's group commits.
pub static COMMITS: LazyLock<CommitMetrics> = LazyLock::new(|| CommitMetrics {
    groups: AtomicU64::new(0),
    jobs: AtomicU64::new(0),
    sync: Histogram::new(tx_latency_bounds()),
    record: Histogram::new(tx_latency_bounds()),
});

/// The host-local metadata cache (Redis): reads it answered, reads it
/// could not, and keys other clients' changes (or this one's) dropped.
#[derive(Debug, Default)]
pub struct MetaCacheMetrics {
    hits: AtomicU64,
    misses: AtomicU64,
    invalidations: AtomicU64,
}

impl MetaCacheMetrics {
    /// Counts one cache read.
    pub fn read(&self, hit: bool) {
        add(if hit { &self.hits } else { &self.misses }, 1);
    }

    /// Counts `n` keys invalidated.
    pub fn invalidated(&self, n: u64) {
        add(&self.invalidations, n);
    }

    /// (hits, misses, invalidations) so far.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (get(&self.hits), get(&self.misses), get(&self.invalidations))
    }
}

/// This process's host-local metadata caches.
pub static META_CACHE: LazyLock<MetaCacheMetrics> = LazyLock::new(MetaCacheMetrics::default);

/// This process's object-store requests.
pub static OBJECTS: LazyLock<ObjectMetrics> = LazyLock::new(ObjectMetrics::new);

/// This process's metadata write transactions.
pub static TRANSACTIONS: LazyLock<TxMetrics> = LazyLock::new(|| TxMetrics {
    latency: Histogram::new(tx_latency_bounds()),
    restarts: AtomicU64::new(0),
});

/// A metadata operation, as JuiceFS's `meta_ops_*` metrics name it (its
/// `Meta` interface's method): the operations JuiceFS times, where sluice
/// has them. A create, a mkdir and a symlink are each a `Mknod` there; a
/// chunk's slice list read is a `Read`, a group commit's transaction a
/// `Write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaOp {
    /// `statfs`: the volume's usage.
    StatFs,
    /// A name in a directory.
    Lookup,
    /// A node's attributes.
    GetAttr,
    /// Attributes changed.
    SetAttr,
    /// A file's length changed.
    Truncate,
    /// Space allocated or punched.
    Fallocate,
    /// A node made (file, directory, symlink, device).
    Mknod,
    /// A hard link.
    Link,
    /// A symlink's target.
    ReadLink,
    /// A name removed.
    Unlink,
    /// A directory removed.
    Rmdir,
    /// A name moved.
    Rename,
    /// A page of a directory's entries.
    Readdir,
    /// A chunk's slice list.
    Read,
    /// Slices recorded in chunks.
    Write,
    /// An extended attribute set.
    SetXattr,
    /// An extended attribute read.
    GetXattr,
    /// A node's extended attribute names.
    ListXattr,
    /// An extended attribute removed.
    RemoveXattr,
    /// A range of one file's chunks copied into another's.
    CopyFileRange,
}

impl MetaOp {
    /// Every operation, in the order of their counters.
    pub const ALL: [MetaOp; 20] = [
        MetaOp::StatFs,
        MetaOp::Lookup,
        MetaOp::GetAttr,
        MetaOp::SetAttr,
        MetaOp::Truncate,
        MetaOp::Fallocate,
        MetaOp::Mknod,
        MetaOp::Link,
        MetaOp::ReadLink,
        MetaOp::Unlink,
        MetaOp::Rmdir,
        MetaOp::Rename,
        MetaOp::Readdir,
        MetaOp::Read,
        MetaOp::Write,
        MetaOp::SetXattr,
        MetaOp::GetXattr,
        MetaOp::ListXattr,
        MetaOp::RemoveXattr,
        MetaOp::CopyFileRange,
    ];

    /// The `method` label JuiceFS gives it.
    pub fn name(self) -> &'static str {
        match self {
            MetaOp::StatFs => "StatFS",
            MetaOp::Lookup => "Lookup",
            MetaOp::GetAttr => "GetAttr",
            MetaOp::SetAttr => "SetAttr",
            MetaOp::Truncate => "Truncate",
            MetaOp::Fallocate => "Fallocate",
            MetaOp::Mknod => "Mknod",
            MetaOp::Link => "Link",
            MetaOp::ReadLink => "ReadLink",
            MetaOp::Unlink => "Unlink",
            MetaOp::Rmdir => "Rmdir",
            MetaOp::Rename => "Rename",
            MetaOp::Readdir => "Readdir",
            MetaOp::Read => "Read",
            MetaOp::Write => "Write",
            MetaOp::SetXattr => "SetXattr",
            MetaOp::GetXattr => "GetXattr",
            MetaOp::ListXattr => "ListXattr",
            MetaOp::RemoveXattr => "RemoveXattr",
            MetaOp::CopyFileRange => "CopyFileRange",
        }
    }
}

/// One thread's share of [`MetaOpMetrics`].
#[derive(Debug)]
struct MetaOpShard {
    count: [AtomicU64; MetaOp::ALL.len()],
    nanos: [AtomicU64; MetaOp::ALL.len()],
    latency: Histogram,
}

impl Default for MetaOpShard {
    fn default() -> Self {
        MetaOpShard {
            count: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: Histogram::new(tx_latency_bounds()),
        }
    }
}

/// Metadata operations made for the file system's requests: how many of
/// each and how long they took (per thread, summed at scrape time: many
/// request threads make them at once).
#[derive(Debug, Default)]
pub struct MetaOpMetrics {
    shards: Sharded<MetaOpShard>,
}

/// [`MetaOpMetrics`] at one moment.
#[derive(Debug, Clone, Default)]
pub struct MetaOpSnapshot {
    /// (method, operations, nanoseconds spent) for each method made.
    pub ops: Vec<(&'static str, u64, u64)>,
    /// Latency of every operation, in nanoseconds.
    pub latency: HistogramSnapshot,
}

impl MetaOpMetrics {
    /// Counts one `op` that started at `started`.
    pub fn record(&self, op: MetaOp, started: Instant) {
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let shard = self.shards.local();
        let i = op as usize;
        add(&shard.count[i], 1);
        add(&shard.nanos[i], nanos);
        shard.latency.observe(nanos);
    }

    /// The counters of all threads, summed.
    pub fn snapshot(&self) -> MetaOpSnapshot {
        let mut s = MetaOpSnapshot::default();
        let mut count = [0u64; MetaOp::ALL.len()];
        let mut nanos = [0u64; MetaOp::ALL.len()];
        for shard in self.shards.slots() {
            for i in 0..MetaOp::ALL.len() {
                count[i] += get(&shard.count[i]);
                nanos[i] += get(&shard.nanos[i]);
            }
            shard.latency.add_to(&mut s.latency);
        }
        s.ops = MetaOp::ALL
            .iter()
            .enumerate()
            .filter(|&(i, _)| count[i] > 0)
            .map(|(i, op)| (op.name(), count[i], nanos[i]))
            .collect();
        s
    }
}

/// This process's metadata operations.
pub static META_OPS: LazyLock<MetaOpMetrics> = LazyLock::new(MetaOpMetrics::default);

/// Runs `f`, one metadata operation, and counts it in [`META_OPS`] as
/// `op`, unless it gave up because it would have waited
/// ([`Error::WouldBlock`]: it is counted when it runs again).
pub fn meta_op<T>(op: MetaOp, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    let r = f();
    if !matches!(r, Err(Error::WouldBlock)) {
        META_OPS.record(op, started);
    }
    r
}

/// The buckets JuiceFS gives `compact_size_histogram_bytes` (1 KiB × 2^k,
/// 16 of them).
pub fn compact_size_bounds() -> Vec<u64> {
    sluice_metrics::exponential_bounds(1024.0, 2.0, 16)
}

/// This process's compactions: the bytes each one wrote.
pub static COMPACTED: LazyLock<Histogram> = LazyLock::new(|| Histogram::new(compact_size_bounds()));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_ops_are_counted_by_juicefs_name_and_a_would_block_is_not() {
        let m = MetaOpMetrics::default();
        let t = Instant::now();
        m.record(MetaOp::Lookup, t);
        m.record(MetaOp::Lookup, t);
        m.record(MetaOp::Mknod, t);
        let s = m.snapshot();
        for (i, op) in MetaOp::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i, "{} is counted in its own slot", op.name());
        }
        let ops: Vec<_> = s.ops.iter().map(|o| (o.0, o.1)).collect();
        assert_eq!(ops, [("Lookup", 2), ("Mknod", 1)]);
        assert_eq!(s.latency.count(), 3);

        let before = META_OPS.snapshot().latency.count();
        let r: Result<()> = meta_op(MetaOp::Read, || Err(Error::WouldBlock));
        assert!(r.is_err());
        assert_eq!(META_OPS.snapshot().latency.count(), before);
        let r = meta_op(MetaOp::Read, || Ok(7));
        assert_eq!(r.ok(), Some(7));
        assert!(META_OPS.snapshot().latency.count() > before);
    }
}
