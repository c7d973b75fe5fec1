//! The metrics of a running daemon (`sluice mount`, `sluice serve`): what
//! the engine, the FUSE dispatcher and the virtio-fs queues count, read
//! when a scrape comes in and written in the Prometheus text format (the
//! `prometheus-client` crate's encoder). Nothing here runs on the data
//! path: the data path only adds to atomic counters (`sluice-metrics`).
//!
//! Names: where a metric means what a JuiceFS metric means, it carries
//! JuiceFS's name and its `vol_name`/`mp` labels, so JuiceFS dashboards and
//! alerts work unchanged. JuiceFS's counters are named without `_total`
//! (Go's client allows that; OpenMetrics does not), so they are written
//! as `untyped` with their exact JuiceFS names — a counter would be renamed
//! `…_total` by the encoder and no JuiceFS query would find it. sluice's
//! own metrics are under `sluice_`, typed, counters ending in `_total`.

pub mod http;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sluice_engine::block_cache::BlockCacheStats;
use sluice_engine::meta::{Context, ROOT_INO};
use sluice_engine::object::disk_cache::DiskCacheStats;
use sluice_engine::reader::Reader;
use sluice_engine::volume::Volume;
use sluice_fuse::OpMetrics;
use sluice_metrics::HistogramSnapshot;
use sluice_vhost::{QueueStats, REJECT_ERRNOS};

/// What the current file-system session offers (a `serve` daemon starts a
/// new one for each VM connection).
#[derive(Debug, Clone)]
pub struct SessionView {
    /// The session's reader: its memory block cache.
    pub reader: Arc<Reader>,
    /// The disk cache's counters, if there is one.
    pub disk: Option<Arc<DiskCacheStats>>,
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
    registry: Registry,
}

impl Metrics {
    /// Metrics of `sources`, labelled with the volume name and `mp` (the
    /// mount point, or the vhost-user socket of `serve`), as JuiceFS labels
    /// its own.
    pub fn new(sources: Sources, mp: &str) -> Arc<Metrics> {
        let labels = vec![
            (
                Cow::Borrowed("vol_name"),
                Cow::Owned(sources.volume.name().to_owned()),
            ),
            (Cow::Borrowed("mp"), Cow::Owned(mp.to_owned())),
        ];
        let mut registry = Registry::with_labels(labels.into_iter());
        registry.register_collector(Box::new(Collect(sources)));
        Arc::new(Metrics { registry })
    }

    /// All metrics now, in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        {
            log::warn!("cannot encode the metrics: {e}");
        }
        out
    }
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug)]
struct Collect(Sources);

type Enc<'a> = DescriptorEncoder<'a>;
type Res = Result<(), std::fmt::Error>;

/// A JuiceFS counter: its exact name, written `untyped` (see the module
/// comment).
fn juicefs_counter(e: &mut Enc<'_>, name: &str, help: &str, v: u64) -> Res {
    let m = e.encode_descriptor(name, help, None, MetricType::Unknown)?;
    ConstGauge::new(v).encode(m)
}

fn gauge<V>(e: &mut Enc<'_>, name: &str, help: &str, v: V) -> Res
where
    V: prometheus_client::encoding::EncodeGaugeValue,
{
    let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

/// A counter; the encoder appends `_total` to `name`.
fn counter(e: &mut Enc<'_>, name: &str, help: &str, v: u64) -> Res {
    let m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(v).encode(m)
}

/// `(upper bound, cumulative count)` pairs, the sum and the count of `h`,
/// whose values are multiplied by `scale` (1e-9: nanoseconds to seconds).
fn histogram_parts(h: &HistogramSnapshot, scale: f64) -> (f64, u64, Vec<(f64, u64)>) {
    (h.sum as f64 * scale, h.count(), h.cumulative(scale))
}

fn histogram(e: &mut Enc<'_>, name: &str, help: &str, h: &HistogramSnapshot, scale: f64) -> Res {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    let (sum, count, buckets) = histogram_parts(h, scale);
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
}

/// One metric, one series per label value.
fn family<T>(
    e: &mut Enc<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    series: &[(Vec<(&'static str, String)>, T)],
    mut write: impl FnMut(prometheus_client::encoding::MetricEncoder<'_>, &T) -> Res,
) -> Res {
    if series.is_empty() {
        return Ok(());
    }
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in series {
        let fam = m.encode_family(labels)?;
        write(fam, v)?;
    }
    Ok(())
}

fn histogram_family(
    e: &mut Enc<'_>,
    name: &str,
    help: &str,
    series: &[(Vec<(&'static str, String)>, HistogramSnapshot)],
    scale: f64,
) -> Res {
    family(e, name, help, MetricType::Histogram, series, |mut m, h| {
        let (sum, count, buckets) = histogram_parts(h, scale);
        m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    })
}

fn value_family(
    e: &mut Enc<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    series: &[(Vec<(&'static str, String)>, u64)],
) -> Res {
    family(e, name, help, kind, series, |m, v| match kind {
        MetricType::Counter => ConstCounter::new(*v).encode(m),
        _ => ConstGauge::new(*v).encode(m),
    })
}

const NS: f64 = 1e-9;

impl Collector for Collect {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Res {
        let s = &self.0;
        let e = &mut e;
        process(e, s.started)?;
        usage(e, &s.volume)?;
        fuse_ops(e, &s.ops)?;
        objects(e)?;
        transactions(e)?;
        commits(e)?;
        let session = s.session.lock().clone();
        caches(e, session.as_ref(), s.cache_node.as_deref())?;
        writeback(e, &s.volume)?;
        if let Some(queues) = &s.queues {
            virtio_queues(e, queues)?;
        }
        if let Some(host) = &s.host {
            host_daemon(e, host)?;
        }
        if let Some(client) = &s.host_client {
            host_client(e, client)?;
        }
        Ok(())
    }
}

fn process(e: &mut Enc<'_>, started: Instant) -> Res {
    gauge(
        e,
        "juicefs_uptime",
        "Total running time in seconds.",
        started.elapsed().as_secs_f64(),
    )?;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the kernel (or vDSO) to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0 {
        gauge(
            e,
            "juicefs_cpu_usage",
            "Accumulated CPU usage in seconds.",
            ts.tv_sec as f64 + ts.tv_nsec as f64 * NS,
        )?;
    }
    // The sandbox of `serve` may hide /proc; then there is no memory figure.
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm")
        && let Some(rss) = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u64>().ok())
    {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        gauge(e, "juicefs_memory", "Used memory in bytes.", rss * page)?;
    }
    Ok(())
}

fn usage(e: &mut Enc<'_>, volume: &Volume) -> Res {
    match volume.meta.statfs(&Context::internal(), ROOT_INO) {
        Ok(st) => {
            gauge(
                e,
                "juicefs_used_space",
                "Total used space in bytes.",
                st.total_space.saturating_sub(st.avail_space),
            )?;
            gauge(
                e,
                "juicefs_used_inodes",
                "Total used number of inodes.",
                st.used_inodes,
            )?;
        }
        Err(err) => log::debug!("metrics: no volume usage: {err}"),
    }
    Ok(())
}

fn fuse_ops(e: &mut Enc<'_>, ops: &OpMetrics) -> Res {
    let s = ops.snapshot();
    histogram(
        e,
        "juicefs_fuse_ops_durations_histogram_seconds",
        "Operations latency distributions.",
        &s.latency,
        NS,
    )?;
    let by_method = |f: fn(&(&'static str, u64, u64)) -> u64| -> Vec<_> {
        s.ops
            .iter()
            .map(|o| (vec![("method", o.0.to_owned())], f(o)))
            .collect()
    };
    value_family(
        e,
        "juicefs_fuse_ops",
        "Total number of operations.",
        MetricType::Counter,
        &by_method(|o| o.1),
    )?;
    let seconds: Vec<_> = s
        .ops
        .iter()
        .map(|o| (vec![("method", o.0.to_owned())], o.2 as f64 * NS))
        .collect();
    family(
        e,
        "juicefs_fuse_ops_durations_seconds",
        "Operations latency in seconds.",
        MetricType::Unknown,
        &seconds,
        |m, v| ConstGauge::new(*v).encode(m),
    )?;
    histogram(
        e,
        "juicefs_fuse_read_size_bytes",
        "size of read distributions.",
        &s.read_size,
        1.0,
    )?;
    histogram(
        e,
        "juicefs_fuse_written_size_bytes",
        "size of write distributions.",
        &s.written_size,
        1.0,
    )?;
    let errors: Vec<_> = s
        .errors
        .iter()
        .map(|&(errno, n)| (vec![("errno", errno_name(errno))], n))
        .collect();
    value_family(
        e,
        "sluice_fuse_errors",
        "Error replies to FUSE requests (host mount or guest), by errno.",
        MetricType::Counter,
        &errors,
    )
}

fn objects(e: &mut Enc<'_>) -> Res {
    let s = sluice_engine::metrics::OBJECTS.snapshot();
    let lat: Vec<_> = s
        .methods
        .iter()
        .map(|(m, h, _)| (vec![("method", (*m).to_owned())], h.clone()))
        .collect();
    histogram_family(
        e,
        "juicefs_object_request_durations_histogram_seconds",
        "Object requests latency distributions.",
        &lat,
        NS,
    )?;
    let bytes: Vec<_> = s
        .methods
        .iter()
        .map(|(m, _, b)| (vec![("method", (*m).to_owned())], *b))
        .collect();
    value_family(
        e,
        "juicefs_object_request_data_bytes",
        "Object requests size in bytes.",
        MetricType::Unknown,
        &bytes,
    )?;
    juicefs_counter(
        e,
        "juicefs_object_request_errors",
        "failed requests to object store",
        s.errors,
    )
}

fn transactions(e: &mut Enc<'_>) -> Res {
    let (lat, restarts) = sluice_engine::metrics::TRANSACTIONS.snapshot();
    histogram(
        e,
        "juicefs_transaction_durations_histogram_seconds",
        "Transactions latency distributions.",
        &lat,
        NS,
    )?;
    juicefs_counter(
        e,
        "juicefs_transaction_restart",
        "The number of times a transaction is restarted.",
        restarts,
    )
}

fn commits(e: &mut Enc<'_>) -> Res {
    let c = sluice_engine::metrics::COMMITS.snapshot();
    counter(
        e,
        "sluice_commit_groups",
        "Group commits run: each syncs its files' objects at once and records them in one metadata transaction.",
        c.groups,
    )?;
    counter(
        e,
        "sluice_commit_files",
        "Files' commits (closes, fsyncs, full write buffers) the group commits held.",
        c.jobs,
    )?;
    histogram(
        e,
        "sluice_commit_sync_duration_seconds",
        "How long a group's object sync took.",
        &c.sync,
        NS,
    )?;
    histogram(
        e,
        "sluice_commit_record_duration_seconds",
        "How long a group's metadata transaction took.",
        &c.record,
        NS,
    )
}

fn caches(e: &mut Enc<'_>, session: Option<&SessionView>, node: Option<&str>) -> Res {
    let Some(session) = session else {
        return Ok(());
    };
    let mem: BlockCacheStats = session.reader.cache().stats();
    let disk = session.disk.as_ref().map(|d| d.snapshot());
    // JuiceFS's block cache is one cache (its memory or disk store); here
    // a read is a hit when either cache had the block, and a miss when it
    // went to the object store.
    let (hits, hit_bytes) = (
        mem.hits + disk.map_or(0, |d| d.hits),
        mem.hit_bytes + disk.map_or(0, |d| d.hit_bytes),
    );
    let (miss, miss_bytes) = match disk {
        Some(d) => (d.misses, d.miss_bytes),
        None => (mem.misses, 0),
    };
    juicefs_counter(e, "juicefs_blockcache_hits", "read from cached block", hits)?;
    juicefs_counter(
        e,
        "juicefs_blockcache_hit_bytes",
        "read bytes from cached block",
        hit_bytes,
    )?;
    juicefs_counter(
        e,
        "juicefs_blockcache_miss",
        "missed read from cached block",
        miss,
    )?;
    if disk.is_some() {
        juicefs_counter(
            e,
            "juicefs_blockcache_miss_bytes",
            "missed bytes from cached block",
            miss_bytes,
        )?;
    }
    let (writes, evicts) = match disk {
        Some(d) => (d.inserts, d.evictions),
        None => (mem.inserts, mem.evictions),
    };
    juicefs_counter(
        e,
        "juicefs_blockcache_writes",
        "written cached block",
        writes,
    )?;
    juicefs_counter(
        e,
        "juicefs_blockcache_evicts",
        "evicted cache blocks",
        evicts,
    )?;
    if let Some(d) = disk {
        juicefs_counter(
            e,
            "juicefs_blockcache_drops",
            "dropped block",
            d.dropped + d.skipped,
        )?;
        gauge(
            e,
            "juicefs_blockcache_blocks",
            "number of cached blocks",
            d.entries,
        )?;
        gauge(
            e,
            "juicefs_blockcache_bytes",
            "number of cached bytes",
            d.used_bytes,
        )?;
    } else {
        gauge(
            e,
            "juicefs_blockcache_bytes",
            "number of cached bytes",
            mem.used_bytes,
        )?;
    }
    counter(
        e,
        "sluice_memcache_hits",
        "Memory block cache lookups that found the block.",
        mem.hits,
    )?;
    counter(
        e,
        "sluice_memcache_hit_bytes",
        "Bytes of the blocks the memory cache found.",
        mem.hit_bytes,
    )?;
    counter(
        e,
        "sluice_memcache_misses",
        "Memory block cache lookups that did not find the block.",
        mem.misses,
    )?;
    counter(
        e,
        "sluice_memcache_inserts",
        "Blocks added to the memory cache.",
        mem.inserts,
    )?;
    counter(
        e,
        "sluice_memcache_evictions",
        "Blocks pushed out of the memory cache for room.",
        mem.evictions,
    )?;
    value_family(
        e,
        "sluice_memcache_bytes",
        "Bytes the memory block cache holds, by the NUMA node its blocks are allocated on \
         (\"unplaced\" without a placement plan).",
        MetricType::Gauge,
        &[(
            vec![("node", node.unwrap_or("unplaced").to_owned())],
            mem.used_bytes,
        )],
    )?;
    if let Some(d) = disk {
        counter(
            e,
            "sluice_diskcache_hits",
            "Reads the disk cache served.",
            d.hits,
        )?;
        counter(
            e,
            "sluice_diskcache_misses",
            "Reads that went past the disk cache to the object store.",
            d.misses,
        )?;
        counter(
            e,
            "sluice_diskcache_skipped",
            "Blocks not cached (full, low space, too many pending, errors).",
            d.skipped,
        )?;
        gauge(
            e,
            "sluice_diskcache_bytes",
            "Bytes of the disk cache's files.",
            d.used_bytes,
        )?;
    }
    Ok(())
}

fn writeback(e: &mut Enc<'_>, volume: &Volume) -> Res {
    let Some(w) = volume.store.upload_backlog() else {
        return Ok(());
    };
    gauge(
        e,
        "juicefs_staging_blocks",
        "Number of blocks in the staging path.",
        w.pending_blocks,
    )?;
    gauge(
        e,
        "juicefs_staging_block_bytes",
        "Total bytes of blocks in the staging path.",
        w.pending_bytes,
    )?;
    gauge(
        e,
        "juicefs_object_request_uploading",
        "number of uploading requests",
        w.uploading,
    )?;
    counter(
        e,
        "sluice_writeback_uploaded_blocks",
        "Staged blocks uploaded.",
        w.uploaded_blocks,
    )?;
    counter(
        e,
        "sluice_writeback_uploaded_bytes",
        "Bytes of staged blocks uploaded.",
        w.uploaded_bytes,
    )?;
    counter(
        e,
        "sluice_writeback_failures",
        "Failed upload attempts (each is retried).",
        w.failures,
    )
}

fn host_daemon(e: &mut Enc<'_>, host: &sluice_host::Host) -> Res {
    use std::sync::atomic::Ordering::Relaxed;
    let st = host.stats();
    counter(
        e,
        "sluice_host_fetches",
        "Blocks the host daemon fetched from the object store, for all VMs.",
        st.fetches.load(Relaxed),
    )?;
    counter(
        e,
        "sluice_host_fetched_bytes",
        "Bytes of the blocks the host daemon fetched (decompressed).",
        st.fetched_bytes.load(Relaxed),
    )?;
    counter(
        e,
        "sluice_host_fetch_errors",
        "Block fetches of the host daemon that failed.",
        st.fetch_errors.load(Relaxed),
    )?;
    counter(
        e,
        "sluice_host_joined",
        "Block requests that joined a fetch already in flight (another VM's or their own).",
        st.joined.load(Relaxed),
    )?;
    counter(
        e,
        "sluice_host_dropped",
        "VM servers dropped for breaking the protocol.",
        st.dropped.load(Relaxed),
    )?;
    let (bytes, blocks) = host.memory_used();
    gauge(
        e,
        "sluice_host_memory_bytes",
        "Bytes of blocks in the host daemon's memory table (each held once).",
        bytes,
    )?;
    gauge(
        e,
        "sluice_host_memory_blocks",
        "Blocks in the host daemon's memory table.",
        blocks as u64,
    )?;
    let vms = host.clients();
    gauge(
        e,
        "sluice_host_vms",
        "VM servers attached to the host daemon.",
        vms.len() as u64,
    )?;
    let per = |i: usize| -> Vec<_> {
        vms.iter()
            .map(|v| (vec![("vm", v.name.clone())], v.counts[i]))
            .collect()
    };
    value_family(
        e,
        "sluice_host_vm_requests",
        "Blocks a VM asked the host daemon for.",
        MetricType::Counter,
        &per(0),
    )?;
    let hits: Vec<_> = vms
        .iter()
        .flat_map(|v| {
            [
                (
                    vec![("vm", v.name.clone()), ("kind", "memory".to_owned())],
                    v.counts[1],
                ),
                (
                    vec![("vm", v.name.clone()), ("kind", "file".to_owned())],
                    v.counts[2],
                ),
            ]
        })
        .collect();
    value_family(
        e,
        "sluice_host_vm_hits",
        "A VM's block requests answered from the host's memory or its disk cache.",
        MetricType::Counter,
        &hits,
    )?;
    value_family(
        e,
        "sluice_host_vm_fetched",
        "A VM's block requests answered once a fetch ended.",
        MetricType::Counter,
        &per(3),
    )?;
    value_family(
        e,
        "sluice_host_vm_errors",
        "A VM's block requests answered with an error (not cached, would wait included).",
        MetricType::Counter,
        &per(4),
    )?;
    let outstanding: Vec<_> = vms
        .iter()
        .map(|v| (vec![("vm", v.name.clone())], u64::from(v.outstanding)))
        .collect();
    value_family(
        e,
        "sluice_host_vm_outstanding",
        "A VM's block requests not yet answered.",
        MetricType::Gauge,
        &outstanding,
    )
}

fn host_client(e: &mut Enc<'_>, client: &sluice_host::HostClient) -> Res {
    use std::sync::atomic::Ordering::Relaxed;
    let c = client.counters();
    gauge(
        e,
        "sluice_host_attached",
        "1 while this server is attached to its host daemon (serve --host).",
        u64::from(client.attached()),
    )?;
    counter(
        e,
        "sluice_host_attaches",
        "Times this server attached to its host daemon (the first included).",
        c.attaches.load(Relaxed),
    )?;
    let from = [
        ("mapped", c.mapped_hits.load(Relaxed)),
        ("memory", c.memory.load(Relaxed)),
        ("file", c.files.load(Relaxed)),
        ("standalone", c.standalone.load(Relaxed)),
    ];
    let series: Vec<_> = from
        .iter()
        .map(|(k, v)| (vec![("from", (*k).to_owned())], *v))
        .collect();
    value_family(
        e,
        "sluice_host_blocks",
        "Blocks this server read: from its own mappings of the host's memory, from the host's \
         memory or disk cache, or standalone (the host away, or a small random read's miss).",
        MetricType::Counter,
        &series,
    )
}

fn virtio_queues(e: &mut Enc<'_>, queues: &[QueueStats]) -> Res {
    use sluice_metrics::get;
    let q = |i: usize| i.to_string();
    let per = |f: &dyn Fn(&QueueStats) -> u64| -> Vec<_> {
        queues
            .iter()
            .enumerate()
            .map(|(i, s)| (vec![("queue", q(i))], f(s)))
            .collect()
    };
    value_family(
        e,
        "sluice_virtiofs_requests",
        "Requests a virtio-fs queue answered (queue 0: hiprio).",
        MetricType::Counter,
        &per(&|s| get(&s.requests)),
    )?;
    value_family(
        e,
        "sluice_virtiofs_request_bytes",
        "Request bytes read from the guest.",
        MetricType::Counter,
        &per(&|s| get(&s.bytes_in)),
    )?;
    value_family(
        e,
        "sluice_virtiofs_reply_bytes",
        "Reply bytes written into the guest.",
        MetricType::Counter,
        &per(&|s| get(&s.bytes_out)),
    )?;
    value_family(
        e,
        "sluice_virtiofs_batches",
        "Batches of requests a queue worker took off its ring.",
        MetricType::Counter,
        &per(&|s| get(&s.batches)),
    )?;
    value_family(
        e,
        "sluice_virtiofs_in_flight",
        "Requests taken off the ring and not yet returned to the guest.",
        MetricType::Gauge,
        &per(&|s| get(&s.in_flight)),
    )?;
    value_family(
        e,
        "sluice_virtiofs_handed_on",
        "Requests that would have waited on the queue's worker (a block not in the memory \
         cache, a commit, a sync) and were answered by a waiter thread, out of order.",
        MetricType::Counter,
        &per(&|s| get(&s.handed_on)),
    )?;
    let lat: Vec<_> = queues
        .iter()
        .enumerate()
        .map(|(i, s)| (vec![("queue", q(i))], s.latency.snapshot()))
        .collect();
    histogram_family(
        e,
        "sluice_virtiofs_request_duration_seconds",
        "Time from taking a request off the ring to returning it to the guest.",
        &lat,
        NS,
    )?;
    let mut paths = Vec::new();
    for (i, s) in queues.iter().enumerate() {
        for (path, v) in [
            ("memcpy", get(&s.guest_copy_bytes)),
            ("io_uring", get(&s.guest_io_fixed_bytes)),
            ("io_uring_direct", get(&s.guest_io_direct_bytes)),
            ("pread", get(&s.guest_io_pread_bytes)),
        ] {
            paths.push((vec![("queue", q(i)), ("path", path.to_owned())], v));
        }
    }
    value_family(
        e,
        "sluice_virtiofs_read_bytes",
        "READ bytes placed in guest memory, by how: CPU copy from the engine's memory, \
         io_uring through the page cache, io_uring O_DIRECT (no CPU copy), pread.",
        MetricType::Counter,
        &paths,
    )?;
    let mut rejected = Vec::new();
    for (i, s) in queues.iter().enumerate() {
        for (errno, c) in REJECT_ERRNOS.iter().zip(s.rejected.iter()) {
            rejected.push((vec![("queue", q(i)), ("errno", errno_name(*errno))], get(c)));
        }
    }
    value_family(
        e,
        "sluice_virtiofs_rejected",
        "Descriptor chains refused before FUSE decoding (malformed by the guest), by errno.",
        MetricType::Counter,
        &rejected,
    )
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
