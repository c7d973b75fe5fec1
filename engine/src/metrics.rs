//! The engine's process-wide counters for a metrics endpoint: object-store
//! requests (what JuiceFS reports as `object_request_*`) and metadata
//! write transactions (`transaction_*`). Each is a few relaxed atomic adds
//! on a path that already waits for a network or disk round trip.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use sluice_metrics::{Histogram, HistogramSnapshot, add, get};

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
}

/// [`ObjectMetrics`] at one moment.
#[derive(Debug, Clone, Default)]
pub struct ObjectSnapshot {
    /// (method, latency in nanoseconds, data bytes) for each method.
    pub methods: Vec<(&'static str, HistogramSnapshot, u64)>,
    /// Failed requests (not found included, as JuiceFS counts them).
    pub errors: u64,
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
        }
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

/// This process's object-store requests.
pub static OBJECTS: LazyLock<ObjectMetrics> = LazyLock::new(ObjectMetrics::new);

/// This process's metadata write transactions.
pub static TRANSACTIONS: LazyLock<TxMetrics> = LazyLock::new(|| TxMetrics {
    latency: Histogram::new(tx_latency_bounds()),
    restarts: AtomicU64::new(0),
});
