//! The metrics of a running daemon (`sluice mount`, `sluice serve`,
//! `sluice host`): what the engine, the FUSE dispatcher, the virtio-fs
//! queues and the host daemon's block service count, read when a scrape
//! comes in and written in the Prometheus text format as a JuiceFS mount
//! writes it (`text`). Nothing here runs on the data path:
//! the data path only adds to atomic counters (`sluice-metrics`).
//!
//! Names: where a metric means what a JuiceFS metric means, it carries
//! JuiceFS's name, type, labels, label values and unit, and every sample
//! JuiceFS's `vol_name`, `mp`, `instance` (the host name) and
//! `juicefs_version` labels, so JuiceFS dashboards and alerts work
//! unchanged. sluice's own metrics are under `sluice_`, counters ending in
//! `_total`. docs/deployment.md lists both, and what differs from JuiceFS.

pub mod http;
pub mod text;

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_engine::block_cache::BlockCacheStats;
use sluice_engine::meta::{Context, ROOT_INO};
use sluice_engine::object::disk_cache::{DiskCacheCounters, DiskCacheStats};
use sluice_engine::reader::Reader;
use sluice_engine::vfs::VfsGauges;
use sluice_engine::volume::Volume;
use sluice_fuse::OpMetrics;
use sluice_host::server::ClientView;
use sluice_vhost::{QueueStats, REJECT_ERRNOS};

use text::{Exposition, Kind};

pub use text::CONTENT_TYPE;

/// What the current file-system session offers (a `serve` daemon starts a
/// new one for each VM connection).
#[derive(Debug, Clone)]
pub struct SessionView {
    /// The session's reader: its memory block cache.
    pub reader: Arc<Reader>,
    /// The disk cache's counters, if there is one.
    pub disk: Option<Arc<DiskCacheStats>>,
    /// Its open handles and write buffers.
    pub gauges: VfsGauges,
}

/// The slot the daemon puts the current session's view in.
pub type SessionSlot = Arc<Mutex<Option<SessionView>>>;

/// Everything a scrape reads.
#[derive(Debug)]
pub struct Sources {
    /// The volume: its metadata (usage) and object store (writeback).
    pub volume: Arc<Volume>,
    /// The FUSE requests of every session.
    pub ops: Arc<OpMetrics>,
    /// The virtio-fs queues (`serve`), hiprio first.
    pub queues: Option<Arc<[QueueStats]>>,
    /// The current session.
    pub session: SessionSlot,
    /// The NUMA node the memory cache's blocks are allocated on (`serve`
    /// with a placement plan: its prefetch threads run there), if known.
    pub cache_node: Option<String>,
    /// The directory of the volume served (`""`: its root), as JuiceFS's
    /// `subdir_info` names it.
    pub subdir: String,
    /// When the daemon started.
    pub started: Instant,
    /// The block service of `sluice host`: its fetches, its memory table,
    /// and each attached VM (`vm` label).
    pub host: Option<Arc<sluice_host::Host>>,
    /// The client of `sluice serve --host`: where its blocks came from.
    pub host_client: Option<Arc<sluice_host::HostClient>>,
}

/// A daemon's metrics: renders them in the Prometheus text format.
#[derive(Debug)]
pub struct Metrics {
    sources: Sources,
    /// The labels of every sample.
    labels: Vec<(String, String)>,
}

/// The `juicefs_version` label sluice gives its samples: which program
/// and version served them (JuiceFS puts its own version there).
pub fn version_label() -> String {
    format!("sluice-{}", env!("CARGO_PKG_VERSION"))
}

/// This host's name, as JuiceFS's `instance` label carries it (`None`
/// when the kernel does not say).
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec())
        .ok()
        .filter(|h| !h.is_empty())
}

impl Metrics {
    /// Metrics of `sources`, labelled with the volume name and `mp` (the
    /// mount point, or the vhost-user socket of `serve`), the host name
    /// and the version, as JuiceFS labels its own.
    pub fn new(sources: Sources, mp: &str) -> Arc<Metrics> {
        let mut labels = vec![
            ("vol_name".to_owned(), sources.volume.name().to_owned()),
            ("mp".to_owned(), mp.to_owned()),
            ("juicefs_version".to_owned(), version_label()),
        ];
        match host_name() {
            Some(h) => labels.push(("instance".to_owned(), h)),
            None => log::warn!("metrics: cannot get the host name; no instance label"),
        }
        Arc::new(Metrics { sources, labels })
    }

    /// The totals `sluice stats` reads, now.
    pub fn snapshot(&self) -> Snapshot {
        let s = &self.sources;
        let ops = s.ops.snapshot();
        let (tx, _) = sluice_engine::metrics::TRANSACTIONS.snapshot();
        let objects = sluice_engine::metrics::OBJECTS.snapshot();
        let object = |method: &str| {
            objects
                .methods
                .iter()
                .find(|(m, _, _)| *m == method)
                .map_or((0, 0), |(_, h, bytes)| (h.count(), *bytes))
        };
        let (object_gets, object_get_bytes) = object("GET");
        let (object_puts, object_put_bytes) = object("PUT");
        let cache = s.session.lock().as_ref().map(|v| {
            let disk = v.disk.as_ref().map(|d| d.snapshot());
            BlockCacheTotals::of(&v.reader.cache().stats(), disk.as_ref())
        });
        let queues = s.queues.as_deref().unwrap_or_default();
        Snapshot {
            cpu_seconds: cpu_seconds().unwrap_or_default(),
            memory_bytes: resident_bytes(),
            fuse_requests: ops.latency.count(),
            fuse_seconds: ops.latency.sum as f64 / NS,
            fuse_read_bytes: ops.read_size.sum,
            fuse_written_bytes: ops.written_size.sum,
            transactions: tx.count(),
            transaction_seconds: tx.sum as f64 / NS,
            blockcache_hits: cache.map_or(0, |c| c.hits),
            blockcache_misses: cache.map_or(0, |c| c.misses),
            blockcache_hit_bytes: cache.map_or(0, |c| c.hit_bytes),
            object_gets,
            object_get_bytes,
            object_puts,
            object_put_bytes,
            queues: queues
                .iter()
                .map(|q| QueueSnapshot {
                    requests: sluice_metrics::get(&q.requests),
                    reply_bytes: sluice_metrics::get(&q.bytes_out),
                })
                .collect(),
            host: s.host.as_deref().map(HostSnapshot::of),
        }
    }

    /// All metrics now, in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut x = Exposition::new(self.labels.clone());
        let s = &self.sources;
        process(&mut x, s.started);
        usage(&mut x, &s.volume, &s.subdir);
        fuse_ops(&mut x, &s.ops);
        meta_ops(&mut x);
        objects(&mut x);
        transactions(&mut x);
        commits(&mut x);
        meta_cache(&mut x);
        let session = s.session.lock().clone();
        if let Some(session) = &session {
            handles(&mut x, &session.gauges);
        }
        caches(&mut x, session.as_ref(), s.cache_node.as_deref());
        staging(&mut x, &s.volume);
        if let Some(queues) = &s.queues {
            virtio_queues(&mut x, queues);
        }
        if let Some(host) = &s.host {
            host_daemon(&mut x, host);
        }
        if let Some(client) = &s.host_client {
            host_client(&mut x, client);
        }
        x.finish()
    }
}

/// Nanoseconds per second: what the histograms of durations divide by.
const NS: f64 = 1e9;

/// The totals `sluice stats` prints the rates of, as the control socket
/// sends them (JSON): the same counts the exposition carries, since the
/// daemon started, in bytes and seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// CPU time used (`juicefs_cpu_usage`).
    pub cpu_seconds: f64,
    /// Resident memory (`juicefs_memory`), where /proc shows it.
    pub memory_bytes: Option<u64>,
    /// FUSE requests answered.
    pub fuse_requests: u64,
    /// Seconds the FUSE requests took, summed.
    pub fuse_seconds: f64,
    /// Bytes of READ replies.
    pub fuse_read_bytes: u64,
    /// Bytes of WRITE requests.
    pub fuse_written_bytes: u64,
    /// Metadata write transactions.
    pub transactions: u64,
    /// Seconds they took, summed.
    pub transaction_seconds: f64,
    /// Block-cache hits (`juicefs_blockcache_hits`).
    pub blockcache_hits: u64,
    /// Block-cache misses (`juicefs_blockcache_miss`).
    pub blockcache_misses: u64,
    /// Bytes of the hits (`juicefs_blockcache_hit_bytes`).
    pub blockcache_hit_bytes: u64,
    /// Object-store GETs.
    pub object_gets: u64,
    /// Bytes the GETs fetched.
    pub object_get_bytes: u64,
    /// Object-store PUTs.
    pub object_puts: u64,
    /// Bytes the PUTs stored.
    pub object_put_bytes: u64,
    /// The virtio-fs queues of a `serve` daemon, by number (0: hiprio);
    /// empty for a mount.
    pub queues: Vec<QueueSnapshot>,
    /// A host daemon's block service (`sluice host`); absent for a mount
    /// or a VM's server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostSnapshot>,
}

/// A host daemon's totals in a [`Snapshot`] (the `sluice_host_*` metrics
/// `sluice stats` shows).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostSnapshot {
    /// Blocks fetched from the object store, for all VMs.
    pub fetches: u64,
    /// Their bytes (decompressed).
    pub fetched_bytes: u64,
    /// Bytes of blocks in its memory table now.
    pub memory_bytes: u64,
    /// The VM servers attached now, by name.
    pub vms: Vec<VmSnapshot>,
}

impl HostSnapshot {
    fn of(host: &sluice_host::Host) -> HostSnapshot {
        use std::sync::atomic::Ordering::Relaxed;
        let st = host.stats();
        let mut vms: Vec<VmSnapshot> = host
            .clients()
            .iter()
            .map(|vm| VmSnapshot {
                name: vm.name.clone(),
                requests: vm.counts[0],
                hits: vm.counts[1] + vm.counts[2],
            })
            .collect();
        vms.sort_by(|a, b| a.name.cmp(&b.name));
        HostSnapshot {
            fetches: st.fetches.load(Relaxed),
            fetched_bytes: st.fetched_bytes.load(Relaxed),
            memory_bytes: host.memory_used().0,
            vms,
        }
    }
}

/// One attached VM's totals in a [`HostSnapshot`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmSnapshot {
    /// The name its server gave, made unique by its pid (the `vm` label).
    pub name: String,
    /// Blocks it asked for.
    pub requests: u64,
    /// Those answered from the host's memory or its disk cache.
    pub hits: u64,
}

/// One virtio-fs queue's totals in a [`Snapshot`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    /// Requests answered.
    pub requests: u64,
    /// Reply bytes written into the guest.
    pub reply_bytes: u64,
}

/// The CPU time this process has used, in seconds.
fn cpu_seconds() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the kernel (or vDSO) to fill.
    (unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0)
        .then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / NS)
}

/// This process's resident memory in bytes; `None` where the sandbox of
/// `serve` hides /proc.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let rss = statm.split_whitespace().nth(1)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    Some(rss * page)
}

fn process(x: &mut Exposition, started: Instant) {
    x.single(
        "juicefs_uptime",
        "Total running time in seconds.",
        Kind::Gauge,
        started.elapsed().as_secs_f64(),
    );
    if let Some(cpu) = cpu_seconds() {
        x.single(
            "juicefs_cpu_usage",
            "Accumulated CPU usage in seconds.",
            Kind::Gauge,
            cpu,
        );
    }
    if let Some(rss) = resident_bytes() {
        x.single(
            "juicefs_memory",
            "Used memory in bytes.",
            Kind::Gauge,
            rss as f64,
        );
    }
}

fn usage(x: &mut Exposition, volume: &Volume, subdir: &str) {
    match volume.meta.statfs(&Context::internal(), ROOT_INO) {
        Ok(st) => {
            x.single(
                "juicefs_used_space",
                "Total used space in bytes.",
                Kind::Gauge,
                st.total_space.saturating_sub(st.avail_space) as f64,
            );
            x.single(
                "juicefs_used_inodes",
                "Total used number of inodes.",
                Kind::Gauge,
                st.used_inodes as f64,
            );
            x.single(
                "juicefs_total_space",
                "Total space in bytes.",
                Kind::Gauge,
                st.total_space as f64,
            );
            x.single(
                "juicefs_total_inodes",
                "Total number of inodes.",
                Kind::Gauge,
                st.used_inodes.saturating_add(st.avail_inodes) as f64,
            );
        }
        Err(err) => log::debug!("metrics: no volume usage: {err}"),
    }
    x.family(
        "juicefs_subdir_info",
        "Subdir configuration for JuiceFS mount (empty string means root mount)",
        Kind::Gauge,
    )
    .sample(&[("subdir", subdir)], 1.0);
}

fn fuse_ops(x: &mut Exposition, ops: &OpMetrics) {
    let s = ops.snapshot();
    x.family(
        "juicefs_fuse_ops_durations_histogram_seconds",
        "Operations latency distributions.",
        Kind::Histogram,
    )
    .histogram(&[], &s.latency, NS);
    let mut total = x.family(
        "juicefs_fuse_ops_total",
        "Total number of operations.",
        Kind::Counter,
    );
    for (method, n, _) in &s.ops {
        total.sample(&[("method", method)], *n as f64);
    }
    drop(total);
    let mut seconds = x.family(
        "juicefs_fuse_ops_durations_seconds",
        "Operations latency in seconds.",
        Kind::Counter,
    );
    for (method, _, nanos) in &s.ops {
        seconds.sample(&[("method", method)], *nanos as f64 / NS);
    }
    drop(seconds);
    x.family(
        "juicefs_fuse_read_size_bytes",
        "size of read distributions.",
        Kind::Histogram,
    )
    .histogram(&[], &s.read_size, 1.0);
    x.family(
        "juicefs_fuse_written_size_bytes",
        "size of write distributions.",
        Kind::Histogram,
    )
    .histogram(&[], &s.written_size, 1.0);
    if !s.errors.is_empty() {
        let mut errors = x.family(
            "juicefs_fuse_ops_io_errors",
            "Number of IO errors.",
            Kind::Counter,
        );
        for &(errno, n) in &s.errors {
            errors.sample(&[("errno", &errno_name(errno))], n as f64);
        }
    }
}

fn meta_ops(x: &mut Exposition) {
    let s = sluice_engine::metrics::META_OPS.snapshot();
    x.family(
        "juicefs_meta_ops_durations_histogram_seconds",
        "Operation latency distributions.",
        Kind::Histogram,
    )
    .histogram(&[], &s.latency, NS);
    if s.ops.is_empty() {
        return;
    }
    let mut total = x.family(
        "juicefs_meta_ops_total",
        "Meta operation count",
        Kind::Counter,
    );
    for (method, n, _) in &s.ops {
        total.sample(&[("method", method)], *n as f64);
    }
    drop(total);
    let mut seconds = x.family(
        "juicefs_meta_ops_duration_seconds",
        "Meta operation duration in seconds.",
        Kind::Counter,
    );
    for (method, _, nanos) in &s.ops {
        seconds.sample(&[("method", method)], *nanos as f64 / NS);
    }
}

/// The `storage_class` label JuiceFS gives a method's requests: GET and
/// PUT carry the class objects are stored in (sluice sets none, so the
/// bucket's default, which S3 and JuiceFS call `STANDARD`); the rest none.
fn storage_class(method: &str) -> &'static str {
    match method {
        "GET" | "PUT" => "STANDARD",
        _ => "",
    }
}

fn objects(x: &mut Exposition) {
    let s = sluice_engine::metrics::OBJECTS.snapshot();
    let mut lat = x.family(
        "juicefs_object_request_durations_histogram_seconds",
        "Object requests latency distributions.",
        Kind::Histogram,
    );
    for (m, h, _) in &s.methods {
        lat.histogram(&[("method", m), ("storage_class", storage_class(m))], h, NS);
    }
    drop(lat);
    let mut bytes = x.family(
        "juicefs_object_request_data_bytes",
        "Object requests size in bytes.",
        Kind::Counter,
    );
    for (m, _, b) in &s.methods {
        bytes.sample(
            &[("method", m), ("storage_class", storage_class(m))],
            *b as f64,
        );
    }
    drop(bytes);
    x.single(
        "juicefs_object_request_errors",
        "failed requests to object store",
        Kind::Counter,
        s.errors as f64,
    );
    x.single(
        "juicefs_object_request_uploading",
        "number of uploading requests",
        Kind::Gauge,
        s.uploading as f64,
    );
    let compacted = sluice_engine::metrics::COMPACTED.snapshot();
    x.family(
        "juicefs_compact_size_histogram_bytes",
        "Distribution of size of compacted data in bytes.",
        Kind::Histogram,
    )
    .histogram(&[], &compacted, 1.0);
}

fn transactions(x: &mut Exposition) {
    let (lat, restarts) = sluice_engine::metrics::TRANSACTIONS.snapshot();
    x.family(
        "juicefs_transaction_durations_histogram_seconds",
        "Transactions latency distributions.",
        Kind::Histogram,
    )
    .histogram(&[], &lat, NS);
    x.single(
        "juicefs_transaction_restart",
        "The number of times a transaction is restarted.",
        Kind::Counter,
        restarts as f64,
    );
}

fn meta_cache(x: &mut Exposition) {
    let (hits, misses, invalidations) = sluice_engine::metrics::META_CACHE.snapshot();
    x.single(
        "sluice_meta_cache_hits_total",
        "Attribute and entry reads the host-local metadata cache answered (Redis: no round trip).",
        Kind::Counter,
        hits as f64,
    );
    x.single(
        "sluice_meta_cache_misses_total",
        "Attribute and entry reads the host-local metadata cache could not answer.",
        Kind::Counter,
        misses as f64,
    );
    x.single(
        "sluice_meta_cache_invalidations_total",
        "Keys the host-local metadata cache dropped because Redis said another client changed them.",
        Kind::Counter,
        invalidations as f64,
    );
}

fn commits(x: &mut Exposition) {
    let c = sluice_engine::metrics::COMMITS.snapshot();
    x.single(
        "sluice_commit_groups_total",
        "Group commits run: each syncs its files' objects at once and records them in one metadata transaction.",
        Kind::Counter,
        c.groups as f64,
    );
    x.single(
        "sluice_commit_files_total",
        "Files' commits (closes, fsyncs, full write buffers) the group commits held.",
        Kind::Counter,
        c.jobs as f64,
    );
    x.family(
        "sluice_commit_sync_duration_seconds",
        "How long a group's object sync took.",
        Kind::Histogram,
    )
    .histogram(&[], &c.sync, NS);
    x.family(
        "sluice_commit_record_duration_seconds",
        "How long a group's metadata transaction took.",
        Kind::Histogram,
    )
    .histogram(&[], &c.record, NS);
}

fn handles(x: &mut Exposition, gauges: &VfsGauges) {
    x.single(
        "juicefs_fuse_open_handlers",
        "number of open files and directories.",
        Kind::Gauge,
        gauges.open_handles() as f64,
    );
    x.single(
        "juicefs_used_buffer_size_bytes",
        "size of currently used buffer.",
        Kind::Gauge,
        gauges.buffered_bytes() as f64,
    );
}

fn caches(x: &mut Exposition, session: Option<&SessionView>, node: Option<&str>) {
    let Some(session) = session else {
        return;
    };
    let mem: BlockCacheStats = session.reader.cache().stats();
    let disk = session.disk.as_ref().map(|d| d.snapshot());
    let BlockCacheTotals {
        hits, hit_bytes, ..
    } = BlockCacheTotals::of(&mem, disk.as_ref());
    let c = |x: &mut Exposition, name: &str, help: &str, v: u64| {
        x.single(name, help, Kind::Counter, v as f64);
    };
    let g = |x: &mut Exposition, name: &str, help: &str, v: u64| {
        x.single(name, help, Kind::Gauge, v as f64);
    };
    c(x, "juicefs_blockcache_hits", "read from cached block", hits);
    c(
        x,
        "juicefs_blockcache_hit_bytes",
        "read bytes from cached block",
        hit_bytes,
    );
    match disk {
        Some(d) => {
            c(
                x,
                "juicefs_blockcache_miss",
                "missed read from cached block",
                d.misses,
            );
            c(
                x,
                "juicefs_blockcache_miss_bytes",
                "missed bytes from cached block",
                d.miss_bytes,
            );
            c(
                x,
                "juicefs_blockcache_writes",
                "written cached block",
                d.inserts,
            );
            c(
                x,
                "juicefs_blockcache_write_bytes",
                "write bytes of cached block",
                d.insert_bytes,
            );
            c(
                x,
                "juicefs_blockcache_evicts",
                "evicted cache blocks",
                d.evictions,
            );
            c(
                x,
                "juicefs_blockcache_drops",
                "dropped block",
                d.dropped + d.skipped,
            );
            g(
                x,
                "juicefs_blockcache_blocks",
                "number of cached blocks",
                d.entries,
            );
            g(
                x,
                "juicefs_blockcache_bytes",
                "number of cached bytes",
                d.used_bytes,
            );
        }
        None => {
            // The memory cache alone: a miss went to the object store (its
            // bytes are those of the GETs); nothing is ever dropped.
            c(
                x,
                "juicefs_blockcache_miss",
                "missed read from cached block",
                mem.misses,
            );
            c(
                x,
                "juicefs_blockcache_writes",
                "written cached block",
                mem.inserts,
            );
            c(
                x,
                "juicefs_blockcache_write_bytes",
                "write bytes of cached block",
                mem.insert_bytes,
            );
            c(
                x,
                "juicefs_blockcache_evicts",
                "evicted cache blocks",
                mem.evictions,
            );
            c(x, "juicefs_blockcache_drops", "dropped block", 0);
            g(
                x,
                "juicefs_blockcache_blocks",
                "number of cached blocks",
                mem.blocks,
            );
            g(
                x,
                "juicefs_blockcache_bytes",
                "number of cached bytes",
                mem.used_bytes,
            );
        }
    }
    g(
        x,
        "juicefs_store_cache_size_bytes",
        "size of store cache.",
        mem.used_bytes,
    );
    if let Some(d) = &session.disk {
        x.family(
            "juicefs_blockcache_read_hist_seconds",
            "read cached block latency distribution",
            Kind::Histogram,
        )
        .histogram(&[], &d.read_latency(), NS);
        x.family(
            "juicefs_blockcache_write_hist_seconds",
            "write cached block latency distribution",
            Kind::Histogram,
        )
        .histogram(&[], &d.write_latency(), NS);
    }
    c(
        x,
        "sluice_memcache_hits_total",
        "Memory block cache lookups that found the block.",
        mem.hits,
    );
    c(
        x,
        "sluice_memcache_hit_bytes_total",
        "Bytes of the blocks the memory cache found.",
        mem.hit_bytes,
    );
    c(
        x,
        "sluice_memcache_misses_total",
        "Memory block cache lookups that did not find the block.",
        mem.misses,
    );
    c(
        x,
        "sluice_memcache_inserts_total",
        "Blocks added to the memory cache.",
        mem.inserts,
    );
    c(
        x,
        "sluice_memcache_evictions_total",
        "Blocks pushed out of the memory cache for room.",
        mem.evictions,
    );
    x.family(
        "sluice_memcache_bytes",
        "Bytes the memory block cache holds, by the NUMA node its blocks are allocated on \
         (\"unplaced\" without a placement plan).",
        Kind::Gauge,
    )
    .sample(
        &[("node", node.unwrap_or("unplaced"))],
        mem.used_bytes as f64,
    );
    if let Some(d) = disk {
        c(
            x,
            "sluice_diskcache_hits_total",
            "Reads the disk cache served.",
            d.hits,
        );
        c(
            x,
            "sluice_diskcache_misses_total",
            "Reads that went past the disk cache to the object store.",
            d.misses,
        );
        c(
            x,
            "sluice_diskcache_skipped_total",
            "Blocks not cached (full, low space, too many pending, errors).",
            d.skipped,
        );
        g(
            x,
            "sluice_diskcache_bytes",
            "Bytes of the disk cache's files.",
            d.used_bytes,
        );
    }
}

/// JuiceFS's block cache is one cache (its memory or disk store); here a
/// read is a hit when either cache had the block, and a miss when it went
/// further: past the disk cache where there is one, past the memory cache
/// where there is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BlockCacheTotals {
    hits: u64,
    hit_bytes: u64,
    misses: u64,
}

impl BlockCacheTotals {
    fn of(mem: &BlockCacheStats, disk: Option<&DiskCacheCounters>) -> BlockCacheTotals {
        BlockCacheTotals {
            hits: mem.hits + disk.map_or(0, |d| d.hits),
            hit_bytes: mem.hit_bytes + disk.map_or(0, |d| d.hit_bytes),
            misses: disk.map_or(mem.misses, |d| d.misses),
        }
    }
}

fn staging(x: &mut Exposition, volume: &Volume) {
    // Without --writeback nothing is staged: JuiceFS shows zeros then too.
    let w = volume.store.upload_backlog();
    let v = w.clone().unwrap_or_default();
    let g = |x: &mut Exposition, name: &str, help: &str, v: u64| {
        x.single(name, help, Kind::Gauge, v as f64);
    };
    let c = |x: &mut Exposition, name: &str, help: &str, v: f64| {
        x.single(name, help, Kind::Counter, v);
    };
    g(
        x,
        "juicefs_staging_blocks",
        "Number of blocks in the staging path.",
        v.pending_blocks,
    );
    g(
        x,
        "juicefs_staging_block_bytes",
        "Total bytes of blocks in the staging path.",
        v.pending_bytes,
    );
    g(
        x,
        "juicefs_staging_writing_blocks",
        "Number of writing blocks in staging.",
        v.staging_now,
    );
    c(
        x,
        "juicefs_staging_write_bytes",
        "write bytes of blocks in the staging path.",
        v.staged_bytes as f64,
    );
    c(
        x,
        "juicefs_staging_block_errors",
        "Total errors when staging blocks",
        v.stage_errors as f64,
    );
    c(
        x,
        "juicefs_staging_block_delay_seconds",
        "Total seconds of delay for staging blocks",
        v.staged_wait_nanos as f64 / NS,
    );
    if w.is_none() {
        return;
    }
    x.single(
        "sluice_writeback_uploaded_blocks_total",
        "Staged blocks uploaded.",
        Kind::Counter,
        v.uploaded_blocks as f64,
    );
    x.single(
        "sluice_writeback_uploaded_bytes_total",
        "Bytes of staged blocks uploaded.",
        Kind::Counter,
        v.uploaded_bytes as f64,
    );
    x.single(
        "sluice_writeback_failures_total",
        "Failed upload attempts (each is retried).",
        Kind::Counter,
        v.failures as f64,
    );
}

fn host_daemon(x: &mut Exposition, host: &sluice_host::Host) {
    use std::sync::atomic::Ordering::Relaxed;
    let st = host.stats();
    x.single(
        "sluice_host_fetches_total",
        "Blocks the host daemon fetched from the object store, for all VMs.",
        Kind::Counter,
        st.fetches.load(Relaxed) as f64,
    );
    x.single(
        "sluice_host_fetched_bytes_total",
        "Bytes of the blocks the host daemon fetched (decompressed).",
        Kind::Counter,
        st.fetched_bytes.load(Relaxed) as f64,
    );
    x.single(
        "sluice_host_fetch_errors_total",
        "Block fetches of the host daemon that failed.",
        Kind::Counter,
        st.fetch_errors.load(Relaxed) as f64,
    );
    x.single(
        "sluice_host_joined_total",
        "Block requests that joined a fetch already in flight (another VM's or their own).",
        Kind::Counter,
        st.joined.load(Relaxed) as f64,
    );
    x.single(
        "sluice_host_node_copies_total",
        "Blocks copied from one NUMA node's memory table into another's for that node's VMs \
         (no object GET).",
        Kind::Counter,
        st.node_copies.load(Relaxed) as f64,
    );
    x.single(
        "sluice_host_dropped_total",
        "VM servers dropped for breaking the protocol.",
        Kind::Counter,
        st.dropped.load(Relaxed) as f64,
    );
    let (bytes, blocks) = host.memory_used();
    x.single(
        "sluice_host_memory_bytes",
        "Bytes of blocks in the host daemon's memory tables (each held once per NUMA node).",
        Kind::Gauge,
        bytes as f64,
    );
    x.single(
        "sluice_host_memory_blocks",
        "Blocks in the host daemon's memory table.",
        Kind::Gauge,
        blocks as f64,
    );
    let vms = host.clients();
    x.single(
        "sluice_host_vms",
        "VM servers attached to the host daemon.",
        Kind::Gauge,
        vms.len() as f64,
    );
    let per =
        |x: &mut Exposition, name: &str, help: &str, kind: Kind, f: &dyn Fn(&ClientView) -> u64| {
            let mut fam = x.family(name, help, kind);
            for vm in &vms {
                fam.sample(&[("vm", &vm.name)], f(vm) as f64);
            }
        };
    per(
        x,
        "sluice_host_vm_requests_total",
        "Blocks a VM asked the host daemon for.",
        Kind::Counter,
        &|vm| vm.counts[0],
    );
    let mut hits = x.family(
        "sluice_host_vm_hits_total",
        "A VM's block requests answered from the host's memory or its disk cache.",
        Kind::Counter,
    );
    for vm in &vms {
        hits.sample(&[("vm", &vm.name), ("kind", "memory")], vm.counts[1] as f64);
        hits.sample(&[("vm", &vm.name), ("kind", "file")], vm.counts[2] as f64);
    }
    drop(hits);
    per(
        x,
        "sluice_host_vm_fetched_total",
        "A VM's block requests answered once a fetch ended.",
        Kind::Counter,
        &|vm| vm.counts[3],
    );
    per(
        x,
        "sluice_host_vm_errors_total",
        "A VM's block requests answered with an error (not cached, would wait included).",
        Kind::Counter,
        &|vm| vm.counts[4],
    );
    per(
        x,
        "sluice_host_vm_outstanding",
        "A VM's block requests not yet answered.",
        Kind::Gauge,
        &|vm| u64::from(vm.outstanding),
    );
}

fn host_client(x: &mut Exposition, client: &sluice_host::HostClient) {
    use std::sync::atomic::Ordering::Relaxed;
    let c = client.counters();
    x.single(
        "sluice_host_attached",
        "1 while this server is attached to its host daemon (serve --host).",
        Kind::Gauge,
        f64::from(u8::from(client.attached())),
    );
    x.single(
        "sluice_host_attaches_total",
        "Times this server attached to its host daemon (the first included).",
        Kind::Counter,
        c.attaches.load(Relaxed) as f64,
    );
    let mut blocks = x.family(
        "sluice_host_blocks_total",
        "Blocks this server read: from its own mappings of the host's memory, from the host's \
         memory or disk cache, or standalone (the host away, or a small random read's miss).",
        Kind::Counter,
    );
    for (from, n) in [
        ("mapped", &c.mapped_hits),
        ("memory", &c.memory),
        ("file", &c.files),
        ("standalone", &c.standalone),
    ] {
        blocks.sample(&[("from", from)], n.load(Relaxed) as f64);
    }
}

fn virtio_queues(x: &mut Exposition, queues: &[QueueStats]) {
    use sluice_metrics::get;
    let per =
        |x: &mut Exposition, name: &str, help: &str, kind: Kind, f: &dyn Fn(&QueueStats) -> u64| {
            let mut fam = x.family(name, help, kind);
            for (i, s) in queues.iter().enumerate() {
                fam.sample(&[("queue", &i.to_string())], f(s) as f64);
            }
        };
    per(
        x,
        "sluice_virtiofs_requests_total",
        "Requests a virtio-fs queue answered (queue 0: hiprio).",
        Kind::Counter,
        &|s| get(&s.requests),
    );
    per(
        x,
        "sluice_virtiofs_request_bytes_total",
        "Request bytes read from the guest.",
        Kind::Counter,
        &|s| get(&s.bytes_in),
    );
    per(
        x,
        "sluice_virtiofs_reply_bytes_total",
        "Reply bytes written into the guest.",
        Kind::Counter,
        &|s| get(&s.bytes_out),
    );
    per(
        x,
        "sluice_virtiofs_batches_total",
        "Batches of requests a queue worker took off its ring.",
        Kind::Counter,
        &|s| get(&s.batches),
    );
    per(
        x,
        "sluice_virtiofs_in_flight",
        "Requests taken off the ring and not yet returned to the guest.",
        Kind::Gauge,
        &|s| get(&s.in_flight),
    );
    per(
        x,
        "sluice_virtiofs_handed_on_total",
        "Requests that would have waited on the queue's worker (a block not in the memory \
         cache, a commit, a sync) and were answered by a waiter thread, out of order.",
        Kind::Counter,
        &|s| get(&s.handed_on),
    );
    let mut lat = x.family(
        "sluice_virtiofs_request_duration_seconds",
        "Time from taking a request off the ring to returning it to the guest.",
        Kind::Histogram,
    );
    for (i, s) in queues.iter().enumerate() {
        lat.histogram(&[("queue", &i.to_string())], &s.latency.snapshot(), NS);
    }
    drop(lat);
    let mut paths = x.family(
        "sluice_virtiofs_read_bytes_total",
        "READ bytes placed in guest memory, by how: CPU copy from the engine's memory, \
         io_uring through the page cache, io_uring O_DIRECT (no CPU copy), pread.",
        Kind::Counter,
    );
    for (i, s) in queues.iter().enumerate() {
        for (path, v) in [
            ("memcpy", get(&s.guest_copy_bytes)),
            ("io_uring", get(&s.guest_io_fixed_bytes)),
            ("io_uring_direct", get(&s.guest_io_direct_bytes)),
            ("pread", get(&s.guest_io_pread_bytes)),
        ] {
            paths.sample(&[("queue", &i.to_string()), ("path", path)], v as f64);
        }
    }
    drop(paths);
    let mut rejected = x.family(
        "sluice_virtiofs_rejected_total",
        "Descriptor chains refused before FUSE decoding (malformed by the guest), by errno.",
        Kind::Counter,
    );
    for (i, s) in queues.iter().enumerate() {
        for (errno, c) in REJECT_ERRNOS.iter().zip(s.rejected.iter()) {
            rejected.sample(
                &[("queue", &i.to_string()), ("errno", &errno_name(*errno))],
                get(c) as f64,
            );
        }
    }
}

/// The symbolic name of `errno` (`E<n>` for the rare ones).
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EPROTO => "EPROTO",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EDQUOT => "EDQUOT",
        libc::ESTALE => "ESTALE",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => return format!("E{errno}"),
    };
    name.to_owned()
}
