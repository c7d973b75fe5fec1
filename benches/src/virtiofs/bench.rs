//! `sluice bench virtiofs`: many READs in flight on several queues from
//! several threads, against any vhost-user-fs socket.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_engine::size::{SizeRange, Unit, size_parser};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::device::{Device, DeviceOptions};
use super::error::{HarnessError, Result};
use super::process_cpu;
use super::session::{FuseQueue, REQUEST_TIMEOUT};
use super::virtqueue::{NUDGE_AFTER, SplitQueue};
use super::wire::{self, IN_HEADER_LEN, OUT_HEADER_LEN, ROOT_ID, opcode};

/// Command-line arguments of `sluice bench virtiofs`.
#[derive(Debug, Clone, clap::Args)]
pub struct VirtiofsArgs {
    /// The vhost-user-fs socket (sluice's or virtiofsd's).
    #[arg(long)]
    pub socket: PathBuf,
    /// Request queues to drive, one thread each.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Bytes per READ (a size: 4K, 1M, 2G).
    #[arg(long, default_value = "1M", value_parser = size_parser(Unit::Bytes, SizeRange::new(1, u64::MAX)))]
    pub block_size: u64,
    /// READs in flight per queue.
    #[arg(long, default_value_t = 16)]
    pub depth: usize,
    /// How long to measure.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Also measure single-core memcpy at the block size and print the ratio.
    #[arg(long)]
    pub vs_memcpy: bool,
    /// File to read, relative to the export's root; created and filled if missing.
    #[arg(long, default_value = "sluice-virtiofs-bench.dat")]
    pub file: String,
    /// Size of the file when it has to be created (a size: 4K, 1M, 2G).
    #[arg(long, default_value = "256M", value_parser = size_parser(Unit::Bytes, SizeRange::new(1, u64::MAX)))]
    pub file_size: u64,
    /// Entries per virtqueue.
    #[arg(long, default_value_t = 1024)]
    pub queue_size: u16,
    /// A second vhost-user-fs socket (e.g. virtiofsd's) measured the same way
    /// in the same run, printed beside the first with the ratio.
    #[arg(long)]
    pub vs_socket: Option<PathBuf>,
    /// Measure metadata instead of READs: one queue sends LOOKUP of each
    /// component of `--file` (a path, which must exist) and GETATTR of the
    /// file, one request at a time; IOPS counts these requests.
    #[arg(long)]
    pub meta: bool,
    /// Which blocks the READs ask for: `random` (uniformly random blocks of
    /// the file, repeats allowed) or `once` (every block of the file once, in
    /// a scattered order shared by the queues; the run ends when all are
    /// read or `--seconds` pass, whichever comes first).
    #[arg(long, value_enum, default_value = "random")]
    pub pattern: Pattern,
    /// Read the whole file once (1 MiB READs, or `--block-size` if larger,
    /// in order) on the same connection before measuring: the device's
    /// caches are warm when the measured interval starts.
    #[arg(long)]
    pub warm_first: bool,
    /// A process of the device under `--socket` (e.g. `sluice serve`) whose
    /// CPU time (utime + stime of all its threads, /proc/PID/stat) is sampled
    /// around the measured interval: prints daemon CPU-seconds per GB read.
    /// Repeatable; the processes' times are summed.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// The same for the device under `--vs-socket` (e.g. virtiofsd and the
    /// juicefs process behind it). Repeatable.
    #[arg(long = "vs-pid", value_name = "PID")]
    pub vs_pids: Vec<u32>,
    /// Mixed mode: a file (relative to the export's root; it must exist and
    /// should be one the device has never read) of which `--cold-depth`
    /// READs of `--block-size` are kept in flight on the first queue beside
    /// its `--depth` READs of `--file`, each at an offset never read before
    /// (`--cold-stride` apart, in a scattered order). The two kinds'
    /// latencies are reported apart. The run ends when every cold offset has
    /// been asked for (the report says so) or `--seconds` pass.
    #[arg(long, value_name = "PATH")]
    pub cold_file: Option<String>,
    /// Cold READs in flight with `--cold-file`.
    #[arg(long, default_value_t = 4)]
    pub cold_depth: usize,
    /// Distance between cold READs' offsets (a size: 4K, 1M, 2G); the default,
    /// JuiceFS's 4 MiB block, makes every cold READ need an object of its own.
    #[arg(long, default_value = "4M", value_parser = size_parser(Unit::Bytes, SizeRange::new(1, u64::MAX)))]
    pub cold_stride: u64,
    /// Seconds to wait between the measurement of `--socket` and that of
    /// `--vs-socket`, so that background work the first device started
    /// (readahead, disk-cache writes, fetches still in flight) is over
    /// before the second is measured: they may share a store and CPUs.
    #[arg(long, default_value_t = 0.0)]
    pub settle: f64,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Measure WRITEs instead of READs: each queue writes `--block-size`
    /// WRITEs (`--depth` in flight, data in a descriptor of its own, as the
    /// Linux driver sends it) in order into a file of its own (`--file`
    /// with `.wN` appended, created, or truncated if it exists), at most
    /// `--file-size` bytes each, for at most `--seconds`; then one FLUSH of
    /// each file, inside the measured interval (the figures are those of
    /// data stored). With `--pid`, the daemon CPU per GB written shows what
    /// the write path costs: its copies, and the commit and upload of the
    /// blocks.
    #[arg(long, conflicts_with_all = ["meta", "cold_file", "warm_first"])]
    pub write: bool,
}

/// Which blocks of the file the READs ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Uniformly random blocks, repeats allowed.
    Random,
    /// Every block once, in a scattered order.
    Once,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest request.
    pub max: f64,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// Tag from the device's configuration space, if offered.
    pub tag: Option<String>,
    /// Request queues driven.
    pub queues: usize,
    /// Bytes per READ.
    pub block_size: u64,
    /// READs in flight per queue.
    pub depth: usize,
    /// Measured wall time.
    #[serde(rename = "elapsed_s", serialize_with = "seconds")]
    pub elapsed: Duration,
    /// Which blocks were read.
    pub pattern: Pattern,
    /// With `--pattern once`: every block was read before `--seconds` passed.
    pub ran_out: bool,
    /// READs completed (of `--file`; cold READs are counted in `cold`).
    pub ops: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Whether LOOKUP/GETATTR were measured (`--meta`) rather than READs.
    pub meta: bool,
    /// Whether WRITEs were measured (`--write`) rather than READs.
    pub write: bool,
    /// READs per second.
    pub iops: f64,
    /// Read throughput in GB/s (10^9 bytes).
    pub gb_per_s: f64,
    /// Per-READ latency.
    pub latency: Latency,
    /// CPU-seconds the `--pid` processes used over the measured interval.
    pub cpu_seconds: Option<f64>,
    /// `cpu_seconds` per GB (10^9 bytes) read, cold READs included.
    pub cpu_s_per_gb: Option<f64>,
    /// The cold READs of mixed mode (`--cold-file`).
    pub cold: Option<ColdReport>,
    /// Single-core memcpy throughput at the block size, with `--vs-memcpy`.
    pub memcpy_gb_per_s: Option<f64>,
    /// The CPU-seconds per GB of that memcpy: one core busy for 1/(GB/s).
    pub memcpy_cpu_s_per_gb: Option<f64>,
    /// The same measurement against `--vs-socket`.
    pub reference: Option<Box<Report>>,
}

/// The cold READs of mixed mode.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ColdReport {
    /// The file read, relative to the export's root.
    pub file: String,
    /// Cold READs in flight.
    pub depth: usize,
    /// Distance between their offsets.
    pub stride: u64,
    /// Cold READs completed.
    pub ops: u64,
    /// Bytes they read.
    pub bytes: u64,
    /// Their latency.
    pub latency: Latency,
    /// Every offset of the file was asked for, which ended the run.
    pub ran_out: bool,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Writes one side's READ lines (throughput, CPU, cold READs).
fn write_side(f: &mut fmt::Formatter<'_>, label: &str, r: &Report) -> fmt::Result {
    let kind = if r.cold.is_some() { "cached " } else { "" };
    writeln!(
        f,
        "  {label}{:>12.0} IOPS  {:>8.3} GB/s  {kind}latency us: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        r.iops,
        r.gb_per_s,
        r.latency.p50,
        r.latency.p90,
        r.latency.p99,
        r.latency.p999,
        r.latency.max
    )?;
    if r.ran_out {
        writeln!(
            f,
            "  {label}every block read once after {:.2}s (--pattern once)",
            r.elapsed.as_secs_f64()
        )?;
    }
    if let Some(cold) = &r.cold {
        writeln!(
            f,
            "  {label}cold {} ({} in flight, {} apart): {} READs  latency us: p50 {:.1}  p99 {:.1}  max {:.1}{}",
            cold.file,
            cold.depth,
            cold.stride,
            cold.ops,
            cold.latency.p50,
            cold.latency.p99,
            cold.latency.max,
            if cold.ran_out {
                "  (ran out of cold offsets: that ended the run)"
            } else {
                ""
            }
        )?;
    }
    if let (Some(cpu), Some(per_gb)) = (r.cpu_seconds, r.cpu_s_per_gb) {
        write!(f, "  {label}daemon CPU {cpu:.3} s  {per_gb:.3} CPU-s/GB")?;
        match r.memcpy_cpu_s_per_gb {
            Some(m) => writeln!(f, "  / memcpy's {m:.3} = {:.3}", ratio(per_gb, m))?,
            None => writeln!(f)?,
        }
    }
    Ok(())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.meta {
            writeln!(
                f,
                "virtiofs lookup+getattr  tag={}  time={:.2}s",
                self.tag.as_deref().unwrap_or("-"),
                self.elapsed.as_secs_f64()
            )?;
            writeln!(
                f,
                "  {:>12.0} requests/s  latency us: p50 {:.1}  p99 {:.1}  max {:.1}",
                self.iops, self.latency.p50, self.latency.p99, self.latency.max
            )?;
            if let Some(reference) = &self.reference {
                writeln!(
                    f,
                    "  reference {:>12.0} requests/s  latency us: p50 {:.1}  p99 {:.1}",
                    reference.iops, reference.latency.p50, reference.latency.p99
                )?;
                writeln!(
                    f,
                    "  ours/reference: requests/s {:.3}  p50 latency {:.3}",
                    ratio(self.iops, reference.iops),
                    ratio(self.latency.p50, reference.latency.p50)
                )?;
            }
            return Ok(());
        }
        writeln!(
            f,
            "virtiofs {}  tag={}  queues={}  block={}  depth={}  time={:.2}s",
            if self.write { "write" } else { "read" },
            self.tag.as_deref().unwrap_or("-"),
            self.queues,
            self.block_size,
            self.depth,
            self.elapsed.as_secs_f64()
        )?;
        write_side(f, "", self)?;
        if let Some(reference) = &self.reference {
            write_side(f, "reference ", reference)?;
            writeln!(
                f,
                "  ours/reference: GB/s {:.3}  p50 latency {:.3}  p99 latency {:.3}{}",
                ratio(self.gb_per_s, reference.gb_per_s),
                ratio(self.latency.p50, reference.latency.p50),
                ratio(self.latency.p99, reference.latency.p99),
                match (self.cpu_s_per_gb, reference.cpu_s_per_gb) {
                    (Some(ours), Some(theirs)) => format!("  CPU-s/GB {:.3}", ratio(ours, theirs)),
                    _ => String::new(),
                }
            )?;
        }
        if let Some(memcpy) = self.memcpy_gb_per_s {
            writeln!(
                f,
                "  memcpy 1 core {:>8.3} GB/s  {:.3} CPU-s/GB   virtiofs/memcpy = {:.3}",
                memcpy,
                1.0 / memcpy.max(f64::MIN_POSITIVE),
                if memcpy > 0.0 {
                    self.gb_per_s / memcpy
                } else {
                    0.0
                }
            )?;
        }
        Ok(())
    }
}

fn ratio(ours: f64, reference: f64) -> f64 {
    if reference > 0.0 {
        ours / reference
    } else {
        0.0
    }
}

/// Runs the benchmark described by `args`: the socket, then the reference
/// socket if given, then memcpy if asked for.
pub fn run(args: &VirtiofsArgs) -> anyhow::Result<Report> {
    let mut report = measure(&args.socket, &args.pids, args)?;
    if let Some(reference) = &args.vs_socket {
        anyhow::ensure!(
            args.settle.is_finite() && args.settle >= 0.0,
            "--settle takes a number of seconds, not {}",
            args.settle
        );
        std::thread::sleep(Duration::from_secs_f64(args.settle));
        report.reference = Some(Box::new(measure(reference, &args.vs_pids, args)?));
    }
    if args.vs_memcpy {
        let memcpy = memcpy_throughput(
            args.block_size as usize,
            args.depth,
            Duration::from_secs(args.seconds.clamp(1, 5)),
        );
        let per_gb = (memcpy > 0.0).then(|| 1.0 / memcpy);
        report.memcpy_gb_per_s = Some(memcpy);
        report.memcpy_cpu_s_per_gb = per_gb;
        if let Some(reference) = &mut report.reference {
            reference.memcpy_cpu_s_per_gb = per_gb;
        }
    }
    Ok(report)
}

/// Index of the cached stream in [`Slot::stream`]; the cold one is next.
const CACHED: usize = 0;
/// `fuse_write_out`.
const WRITE_OUT_LEN: usize = 8;
/// Room for a reply's header and fixed part (READ: the header; WRITE: the
/// header and `fuse_write_out`).
const REPLY_ROOM: u64 = 64;
/// Index of mixed mode's cold stream.
const COLD: usize = 1;

/// Measures READs against the device at `socket`, sampling the CPU time
/// of `pids` around the measured interval.
fn measure(socket: &std::path::Path, pids: &[u32], args: &VirtiofsArgs) -> anyhow::Result<Report> {
    if args.meta {
        return measure_meta(socket, args);
    }
    if args.write {
        return measure_writes(socket, pids, args);
    }
    let block = u32::try_from(args.block_size)
        .map_err(|_| anyhow::anyhow!("--block-size must be below 4 GiB"))?;
    anyhow::ensure!(args.queues >= 1, "--queues must be at least 1");
    let cold_depth = if args.cold_file.is_some() {
        anyhow::ensure!(args.cold_depth >= 1, "--cold-depth must be at least 1");
        args.cold_depth
    } else {
        0
    };
    anyhow::ensure!(
        args.depth >= 1 && (args.depth + cold_depth) * 3 <= usize::from(args.queue_size),
        "--depth (plus --cold-depth) must be between 1 and {} (three descriptors per READ)",
        usize::from(args.queue_size) / 3
    );
    anyhow::ensure!(
        args.file_size >= args.block_size,
        "--file-size must be at least --block-size"
    );
    // The warm-up pass reads 1 MiB at a time (or a larger --block-size).
    let warm_len: u32 = if args.warm_first {
        block.max(1 << 20)
    } else {
        block
    };
    let setup_io: u32 = block.min(1 << 20);
    // Per slot: the data (page-aligned, so up to a page of padding), the
    // request and the reply header.
    let per_queue = args.depth as u64 * (u64::from(warm_len) + 8192)
        + cold_depth as u64 * (u64::from(block) + 8192)
        + u64::from(args.queue_size) * 32
        + 3 * 4096;
    let memory_size = per_queue * (args.queues as u64 + 1) + 2 * u64::from(setup_io) + (1 << 20);
    let mut device = Device::connect(
        socket,
        DeviceOptions {
            request_queues: args.queues,
            queue_size: args.queue_size,
            memory_size: usize::try_from(memory_size)?,
        },
    )?;
    let tag = device.tag().map(str::to_owned);
    let mut setup = FuseQueue::new(&mut device, 1, setup_io)?;
    let init = setup.init()?;
    log::info!(
        "INIT: protocol {}.{}, max_write {}",
        init.major,
        init.minor,
        init.max_write
    );
    let (nodeid, file_size) = prepare_file(&mut setup, args, init.max_write.clamp(4096, setup_io))?;
    anyhow::ensure!(
        file_size >= args.block_size,
        "{} holds {file_size} bytes, less than one block",
        args.file
    );
    let fh = setup.open(nodeid, libc::O_RDONLY as u32)?;
    let blocks = file_size / args.block_size;
    let cached = Stream {
        nodeid,
        fh,
        write: false,
        len: block,
        stride: args.block_size,
        offsets: match args.pattern {
            Pattern::Random => Offsets::Random { count: blocks },
            Pattern::Once => Offsets::once(Permutation::scattered(blocks)),
        },
    };
    let cold = match &args.cold_file {
        Some(name) => {
            let entry = setup
                .lookup(ROOT_ID, name.as_bytes())
                .map_err(|e| anyhow::anyhow!("--cold-file {name}: {e}"))?;
            let size = entry.attr.size;
            anyhow::ensure!(
                size >= args.block_size,
                "--cold-file {name} holds {size} bytes, less than one block"
            );
            let fh = setup.open(entry.nodeid, libc::O_RDONLY as u32)?;
            Some(Stream {
                nodeid: entry.nodeid,
                fh,
                write: false,
                len: block,
                stride: args.cold_stride,
                offsets: Offsets::once(Permutation::scattered(
                    (size - args.block_size) / args.cold_stride + 1,
                )),
            })
        }
        None => None,
    };

    let mem = device.memory().memory().clone();
    let mut workers = Vec::with_capacity(args.queues);
    let mut first = Some(setup.into_queue());
    for index in 1..=args.queues {
        let queue = match index {
            1 => first.take(),
            _ => device.take_queue(index),
        }
        .ok_or(HarnessError::QueueFull(0))?;
        let mut slots = Vec::with_capacity(args.depth + cold_depth);
        let colds = if index == 1 { cold_depth } else { 0 };
        for n in 0..args.depth + colds {
            let (stream, len) = if n < args.depth {
                (CACHED, warm_len)
            } else {
                (COLD, block)
            };
            slots.push(Slot {
                request: device.alloc(128)?,
                reply_header: device.alloc(REPLY_ROOM)?,
                // Page-aligned, as the Linux driver's READ pages are (and
                // as O_DIRECT into guest memory needs).
                data: device.memory().alloc(u64::from(len), 4096)?,
                stream,
                submitted: Instant::now(),
            });
        }
        workers.push(Worker { queue, slots });
    }

    if args.warm_first {
        // A file smaller than 1 MiB is warmed with --block-size READs.
        let warm_len = if file_size >= u64::from(warm_len) {
            warm_len
        } else {
            block
        };
        let warm_blocks = file_size / u64::from(warm_len);
        let warm = Stream {
            len: warm_len,
            stride: u64::from(warm_len),
            offsets: Offsets::once(Permutation::in_order(warm_blocks)),
            ..cached.clone()
        };
        let pass = run_phase(&mut workers, &mem, &[warm], None)?;
        log::info!(
            "warm-up: read {} MiB in {:.2}s",
            (pass.latencies_ns[CACHED].len() as u64 * u64::from(warm_len)) >> 20,
            pass.elapsed.as_secs_f64()
        );
    }

    let mut streams = vec![cached];
    streams.extend(cold);
    let cpu_before = match pids {
        [] => None,
        pids => Some(process_cpu::cpu_seconds(pids)?),
    };
    let outcome = run_phase(
        &mut workers,
        &mem,
        &streams,
        Some(Duration::from_secs(args.seconds)),
    )?;
    let cpu_seconds = match cpu_before {
        Some(before) => Some(process_cpu::cpu_seconds(pids)? - before),
        None => None,
    };
    let [mut cached_ns, mut cold_ns] = outcome.latencies_ns;
    let ops = cached_ns.len() as u64;
    let bytes = ops * args.block_size;
    let cold_bytes = cold_ns.len() as u64 * args.block_size;
    let secs = outcome.elapsed.as_secs_f64();
    let cold = args.cold_file.as_ref().map(|file| ColdReport {
        file: file.clone(),
        depth: cold_depth,
        stride: args.cold_stride,
        ops: cold_ns.len() as u64,
        bytes: cold_bytes,
        latency: percentiles(&mut cold_ns),
        ran_out: streams.get(COLD).is_some_and(|s| s.offsets.ran_out()),
    });
    Ok(Report {
        tag,
        queues: args.queues,
        block_size: args.block_size,
        depth: args.depth,
        elapsed: outcome.elapsed,
        pattern: args.pattern,
        ran_out: args.pattern == Pattern::Once && streams[CACHED].offsets.ran_out(),
        ops,
        bytes,
        meta: false,
        write: args.write,
        iops: ops as f64 / secs,
        gb_per_s: bytes as f64 / secs / 1e9,
        latency: percentiles(&mut cached_ns),
        cpu_seconds,
        cpu_s_per_gb: cpu_seconds.and_then(|c| process_cpu::per_gb(c, bytes + cold_bytes)),
        cold,
        memcpy_gb_per_s: None,
        memcpy_cpu_s_per_gb: None,
        reference: None,
    })
}

/// One request queue and the buffers of the READs it keeps in flight.
#[derive(Debug)]
struct Worker {
    queue: SplitQueue,
    slots: Vec<Slot>,
}

/// What one phase (warm-up or measurement) measured.
#[derive(Debug)]
struct PhaseOutcome {
    elapsed: Duration,
    /// Latencies of the cached and the cold READs.
    latencies_ns: [Vec<u64>; 2],
}

/// Drives every worker's queue with READs of `streams` until `limit`
/// passes, every queue runs out of offsets, or the cold stream (if any)
/// runs out; then waits for the READs in flight.
fn run_phase(
    workers: &mut [Worker],
    mem: &GuestMemoryMmap,
    streams: &[Stream],
    limit: Option<Duration>,
) -> anyhow::Result<PhaseOutcome> {
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let results: Vec<_> = std::thread::scope(|scope| {
        let spawned: std::io::Result<Vec<_>> = workers
            .iter_mut()
            .enumerate()
            .map(|(i, worker)| {
                let stop = &stop;
                std::thread::Builder::new()
                    .name(format!("virtiofs-q{}", i + 1))
                    .spawn_scoped(scope, move || {
                        drive_queue(worker, mem, streams, i as u64 + 1, stop)
                    })
            })
            .collect();
        // The threads already started stop (and the scope joins them).
        let handles = spawned.inspect_err(|_| stop.store(true, Ordering::Relaxed))?;
        loop {
            if stop.load(Ordering::Relaxed) || handles.iter().all(|h| h.is_finished()) {
                break;
            }
            match limit {
                Some(limit) if started.elapsed() >= limit => break,
                Some(limit) => std::thread::sleep(
                    limit
                        .saturating_sub(started.elapsed())
                        .min(Duration::from_millis(5)),
                ),
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        stop.store(true, Ordering::Relaxed);
        anyhow::Ok(handles.into_iter().map(|h| h.join()).collect())
    })?;
    let elapsed = started.elapsed();
    let mut latencies_ns = [Vec::new(), Vec::new()];
    let mut first_error = None;
    for result in results {
        match result {
            Ok(Ok(stats)) => {
                for (all, queue) in latencies_ns.iter_mut().zip(stats.latencies_ns) {
                    all.extend(queue);
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => anyhow::bail!("a queue thread panicked"),
        }
    }
    if let Some(e) = first_error {
        return Err(e.into());
    }
    Ok(PhaseOutcome {
        elapsed,
        latencies_ns,
    })
}

/// Measures WRITEs (`--write`): each queue writes its own file in order.
fn measure_writes(
    socket: &std::path::Path,
    pids: &[u32],
    args: &VirtiofsArgs,
) -> anyhow::Result<Report> {
    let block = u32::try_from(args.block_size)
        .map_err(|_| anyhow::anyhow!("--block-size must be below 4 GiB"))?;
    anyhow::ensure!(args.queues >= 1, "--queues must be at least 1");
    anyhow::ensure!(
        args.depth >= 1 && args.depth * 3 <= usize::from(args.queue_size),
        "--depth must be between 1 and {} (three descriptors per WRITE)",
        usize::from(args.queue_size) / 3
    );
    anyhow::ensure!(
        args.file_size >= args.block_size,
        "--file-size must be at least --block-size"
    );
    let per_queue =
        args.depth as u64 * (u64::from(block) + 8192) + u64::from(args.queue_size) * 32 + 3 * 4096;
    let memory_size = per_queue * (args.queues as u64 + 1) + (1 << 20);
    let mut device = Device::connect(
        socket,
        DeviceOptions {
            request_queues: args.queues,
            queue_size: args.queue_size,
            memory_size: usize::try_from(memory_size)?,
        },
    )?;
    let tag = device.tag().map(str::to_owned);
    let mut setup = FuseQueue::new(&mut device, 1, 64 << 10)?;
    let init = setup.init()?;
    anyhow::ensure!(
        init.max_write >= block,
        "the device takes WRITEs of at most {} bytes, less than --block-size",
        init.max_write
    );
    let mut streams = Vec::with_capacity(args.queues);
    for q in 1..=args.queues {
        let name = format!("{}.w{q}", args.file);
        let (entry, fh) = setup.create(
            ROOT_ID,
            name.as_bytes(),
            (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC) as u32,
            libc::S_IFREG | 0o644,
        )?;
        streams.push(Stream {
            nodeid: entry.nodeid,
            fh,
            write: true,
            len: block,
            stride: args.block_size,
            offsets: Offsets::once(Permutation::in_order(args.file_size / args.block_size)),
        });
    }
    let mem = device.memory().memory().clone();
    let mut workers = Vec::with_capacity(args.queues);
    let mut first = Some(setup.into_queue());
    for index in 1..=args.queues {
        let queue = match index {
            1 => first.take(),
            _ => device.take_queue(index),
        }
        .ok_or(HarnessError::QueueFull(0))?;
        let mut slots = Vec::with_capacity(args.depth);
        let mut pattern = vec![0u8; block as usize];
        for n in 0..args.depth {
            let data = device.memory().alloc(u64::from(block), 4096)?;
            fill_pattern(&mut pattern, (n as u64) << 32);
            mem.write_slice(&pattern, data)?;
            slots.push(Slot {
                request: device.alloc(128)?,
                reply_header: device.alloc(REPLY_ROOM)?,
                data,
                stream: CACHED,
                submitted: Instant::now(),
            });
        }
        workers.push(Worker { queue, slots });
    }
    let cpu_before = match pids {
        [] => None,
        pids => Some(process_cpu::cpu_seconds(pids)?),
    };
    let started = Instant::now();
    let (mut latencies, _) = run_write_phase(
        &mut workers,
        &mem,
        &streams,
        Duration::from_secs(args.seconds),
    )?;
    // A FLUSH of each file commits what the device still buffers, inside
    // the measured interval: the figures are those of data stored, and the
    // commit's CPU is counted whether the device did it during the WRITEs
    // or at the end.
    for (worker, stream) in workers.iter_mut().zip(&streams) {
        flush_file(worker, &mem, stream)?;
    }
    let elapsed = started.elapsed();
    let cpu_seconds = match cpu_before {
        Some(before) => Some(process_cpu::cpu_seconds(pids)? - before),
        None => None,
    };
    let ops = latencies.len() as u64;
    let bytes = ops * args.block_size;
    let secs = elapsed.as_secs_f64();
    Ok(Report {
        tag,
        queues: args.queues,
        block_size: args.block_size,
        depth: args.depth,
        elapsed,
        pattern: Pattern::Once,
        ran_out: streams.iter().all(|s| s.offsets.ran_out()),
        ops,
        bytes,
        meta: false,
        write: true,
        iops: ops as f64 / secs,
        gb_per_s: bytes as f64 / secs / 1e9,
        latency: percentiles(&mut latencies),
        cpu_seconds,
        cpu_s_per_gb: cpu_seconds.and_then(|c| process_cpu::per_gb(c, bytes)),
        cold: None,
        memcpy_gb_per_s: None,
        memcpy_cpu_s_per_gb: None,
        reference: None,
    })
}

/// FLUSHes `stream`'s file on `worker`'s queue (its first slot's buffers,
/// idle once the phase is over) and waits for the reply.
fn flush_file(worker: &mut Worker, mem: &GuestMemoryMmap, stream: &Stream) -> Result<()> {
    let slot = &worker.slots[0];
    let request = wire::request(
        opcode::FLUSH,
        u64::MAX - 1,
        stream.nodeid,
        &wire::flush_in(stream.fh),
    );
    mem.write_slice(&request, slot.request)?;
    worker.queue.add(
        &[(slot.request, request.len() as u32)],
        &[(slot.reply_header, OUT_HEADER_LEN as u32)],
    )?;
    worker.queue.publish()?;
    worker.queue.wait_used(REQUEST_TIMEOUT)?;
    let error: i32 = mem.read_obj(GuestAddress(slot.reply_header.0 + 4))?;
    if error != 0 {
        return Err(HarnessError::Errno {
            opcode: opcode::FLUSH,
            errno: error.wrapping_neg(),
        });
    }
    Ok(())
}

/// [`run_phase`] for `--write`: worker `i` drives stream `i` alone (each
/// queue its own file). Returns the WRITEs' latencies and the time taken.
fn run_write_phase(
    workers: &mut [Worker],
    mem: &GuestMemoryMmap,
    streams: &[Stream],
    limit: Duration,
) -> anyhow::Result<(Vec<u64>, Duration)> {
    let mut all = Vec::new();
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .iter_mut()
            .zip(streams.chunks(1))
            .enumerate()
            .map(|(i, (worker, own))| {
                let stop = &stop;
                scope.spawn(move || drive_queue(worker, mem, own, i as u64 + 1, stop))
            })
            .collect();
        while started.elapsed() < limit && !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(
                limit
                    .saturating_sub(started.elapsed())
                    .min(Duration::from_millis(5)),
            );
        }
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join()).collect()
    });
    let elapsed = started.elapsed();
    for result in results {
        match result {
            Ok(Ok(stats)) => {
                let [writes, _] = stats.latencies_ns;
                all.extend(writes);
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => anyhow::bail!("a queue thread panicked"),
        }
    }
    Ok((all, elapsed))
}

/// Measures LOOKUP (each component of `--file`) and GETATTR (the file),
/// one request at a time on one queue, for `--seconds`.
fn measure_meta(socket: &std::path::Path, args: &VirtiofsArgs) -> anyhow::Result<Report> {
    let mut device = Device::connect(
        socket,
        DeviceOptions {
            request_queues: 1,
            queue_size: args.queue_size,
            memory_size: 4 << 20,
        },
    )?;
    let tag = device.tag().map(str::to_owned);
    let mut q = FuseQueue::new(&mut device, 1, 64 << 10)?;
    q.init()?;
    let names: Vec<&str> = args.file.split('/').filter(|c| !c.is_empty()).collect();
    anyhow::ensure!(!names.is_empty(), "--file names no path");
    let mut latencies = Vec::new();
    let mut looked_up: Vec<(u64, u64)> = Vec::new();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    while Instant::now() < deadline {
        let mut node = ROOT_ID;
        for name in &names {
            let t = Instant::now();
            node = q.lookup(node, name.as_bytes())?.nodeid;
            latencies.push(t.elapsed().as_nanos() as u64);
            match looked_up.iter_mut().find(|(n, _)| *n == node) {
                Some((_, count)) => *count += 1,
                None => looked_up.push((node, 1)),
            }
        }
        let t = Instant::now();
        q.getattr(node)?;
        latencies.push(t.elapsed().as_nanos() as u64);
    }
    let elapsed = started.elapsed();
    for (node, count) in looked_up {
        q.forget(node, count)?;
    }
    let ops = latencies.len() as u64;
    Ok(Report {
        tag,
        queues: 1,
        block_size: 0,
        depth: 1,
        elapsed,
        pattern: args.pattern,
        ran_out: false,
        ops,
        bytes: 0,
        meta: true,
        write: false,
        iops: ops as f64 / elapsed.as_secs_f64(),
        gb_per_s: 0.0,
        latency: percentiles(&mut latencies),
        cpu_seconds: None,
        cpu_s_per_gb: None,
        cold: None,
        memcpy_gb_per_s: None,
        memcpy_cpu_s_per_gb: None,
        reference: None,
    })
}

/// Looks the file up, creating and filling it if it is missing; returns its
/// node id and size.
fn prepare_file(setup: &mut FuseQueue, args: &VirtiofsArgs, max_write: u32) -> Result<(u64, u64)> {
    match setup.lookup(ROOT_ID, args.file.as_bytes()) {
        Ok(entry) => return Ok((entry.nodeid, entry.attr.size)),
        Err(HarnessError::Errno { errno, .. }) if errno == libc::ENOENT => {}
        Err(e) => return Err(e),
    }
    let (entry, fh) = setup.create(
        ROOT_ID,
        args.file.as_bytes(),
        (libc::O_WRONLY | libc::O_CREAT) as u32,
        libc::S_IFREG | 0o644,
    )?;
    let chunk = u64::from(max_write);
    let mut data = vec![0u8; chunk as usize];
    let mut offset = 0;
    while offset < args.file_size {
        let n = chunk.min(args.file_size - offset) as usize;
        fill_pattern(&mut data[..n], offset);
        let written = setup.write(entry.nodeid, fh, offset, &data[..n])?;
        offset += u64::from(written.max(1));
    }
    setup.flush(entry.nodeid, fh)?;
    setup.release(entry.nodeid, fh)?;
    Ok((entry.nodeid, args.file_size))
}

/// The bytes the bench writes at `offset`: recognisable, never all zero.
pub fn fill_pattern(buf: &mut [u8], offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        let at = offset + i as u64;
        *b = (at ^ (at >> 8) ^ (at >> 16)) as u8 | 1;
    }
}

/// READs of one open file: where they go and how long they are.
#[derive(Debug, Clone)]
struct Stream {
    nodeid: u64,
    fh: u64,
    /// WRITEs (of the pattern) rather than READs.
    write: bool,
    /// Bytes per READ or WRITE.
    len: u32,
    /// Bytes between the offsets: offset = index × stride.
    stride: u64,
    offsets: Offsets,
}

/// Which offset indices a stream's READs take.
#[derive(Debug, Clone)]
enum Offsets {
    /// Uniformly random indices below `count`, repeats allowed.
    Random { count: u64 },
    /// Each index of `order` once, handed out to the queues in turn.
    Once {
        order: Permutation,
        next: Arc<AtomicU64>,
    },
}

impl Offsets {
    fn once(order: Permutation) -> Self {
        Offsets::Once {
            order,
            next: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The next index, or `None` once every index of a `Once` was taken.
    fn next(&self, rng: &mut u64) -> Option<u64> {
        match self {
            Offsets::Random { count } => {
                // xorshift64: cheap, and good enough to spread offsets over the file.
                *rng ^= *rng << 13;
                *rng ^= *rng >> 7;
                *rng ^= *rng << 17;
                Some(*rng % count)
            }
            Offsets::Once { order, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed);
                (i < order.len).then(|| order.at(i))
            }
        }
    }

    /// Whether every index of a `Once` was handed out.
    fn ran_out(&self) -> bool {
        match self {
            Offsets::Random { .. } => false,
            Offsets::Once { order, next } => next.load(Ordering::Relaxed) >= order.len,
        }
    }
}

/// A permutation of `0..len` that needs no table: i ↦ (i × step + start)
/// mod len, with `step` coprime to `len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Permutation {
    len: u64,
    step: u64,
    start: u64,
}

impl Permutation {
    /// 0, 1, 2, ...: a sequential pass.
    fn in_order(len: u64) -> Self {
        Permutation {
            len,
            step: 1,
            start: 0,
        }
    }

    /// Consecutive indices about 0.618 × len apart (the golden ratio, made
    /// coprime to `len`): no two neighbours close, so no readahead helps.
    fn scattered(len: u64) -> Self {
        let mut step = ((len as f64 * 0.618_033_988_7) as u64).max(1);
        while gcd(step, len) != 1 {
            step += 1;
        }
        Permutation {
            len,
            step,
            start: len / 3,
        }
    }

    /// The `i`-th index, for `i < len`.
    fn at(&self, i: u64) -> u64 {
        ((u128::from(i) * u128::from(self.step) + u128::from(self.start)) % u128::from(self.len))
            as u64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Buffers of one in-flight READ.
#[derive(Debug)]
struct Slot {
    request: GuestAddress,
    reply_header: GuestAddress,
    data: GuestAddress,
    /// Index of the stream the slot reads ([`CACHED`] or [`COLD`]); a slot
    /// whose stream the phase does not have stays idle.
    stream: usize,
    submitted: Instant,
}

#[derive(Debug, Default)]
struct QueueStats {
    /// Latencies of the cached and the cold READs.
    latencies_ns: [Vec<u64>; 2],
}

/// Keeps the worker's slots' READs in flight until `stop` is set or the
/// slots' streams run out. When the cold stream runs out it sets `stop`:
/// mixed mode measures only while cold READs are in flight.
fn drive_queue(
    worker: &mut Worker,
    mem: &GuestMemoryMmap,
    streams: &[Stream],
    seed: u64,
    stop: &AtomicBool,
) -> Result<QueueStats> {
    let Worker { queue, slots } = worker;
    let mut stats = QueueStats::default();
    let mut by_head = vec![usize::MAX; usize::from(queue.size())];
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unique = seed << 48;
    let mut in_flight = 0usize;
    for (index, slot) in slots.iter_mut().enumerate() {
        let Some(stream) = streams.get(slot.stream) else {
            continue;
        };
        let Some(at) = stream.offsets.next(&mut rng) else {
            continue;
        };
        submit(
            queue,
            mem,
            slot,
            index,
            &mut by_head,
            stream,
            at,
            &mut unique,
        )?;
        in_flight += 1;
    }
    queue.publish()?;
    let mut idle_polls = 0u64;
    let mut last_progress: Option<Instant> = None;
    let mut last_nudge: Option<Instant> = None;
    while in_flight > 0 {
        let stopping = stop.load(Ordering::Relaxed);
        let mut completed = 0;
        while let Some((head, len)) = queue.poll_used()? {
            let index = by_head
                .get(usize::from(head))
                .copied()
                .filter(|&i| i < slots.len())
                .ok_or(HarnessError::BadUsedHead(u32::from(head)))?;
            let slot = &mut slots[index];
            let stream = &streams[slot.stream];
            stats.latencies_ns[slot.stream].push(slot.submitted.elapsed().as_nanos() as u64);
            let (op, expected) = if stream.write {
                (opcode::WRITE, (OUT_HEADER_LEN + WRITE_OUT_LEN) as u32)
            } else {
                (opcode::READ, (OUT_HEADER_LEN as u32) + stream.len)
            };
            let error: i32 = mem.read_obj(GuestAddress(slot.reply_header.0 + 4))?;
            if error != 0 {
                return Err(HarnessError::Errno {
                    opcode: op,
                    errno: error.wrapping_neg(),
                });
            }
            if len != expected {
                return Err(HarnessError::BadReply {
                    opcode: op,
                    why: format!("{len} bytes instead of {expected}"),
                });
            }
            if stream.write {
                let took: u32 =
                    mem.read_obj(GuestAddress(slot.reply_header.0 + OUT_HEADER_LEN as u64))?;
                if took != stream.len {
                    return Err(HarnessError::BadReply {
                        opcode: op,
                        why: format!("wrote {took} of {} bytes", stream.len),
                    });
                }
            }
            completed += 1;
            let next = if stopping {
                None
            } else {
                let next = stream.offsets.next(&mut rng);
                if next.is_none() && slot.stream == COLD {
                    stop.store(true, Ordering::Relaxed);
                }
                next
            };
            match next {
                Some(at) => submit(
                    queue,
                    mem,
                    slot,
                    index,
                    &mut by_head,
                    stream,
                    at,
                    &mut unique,
                )?,
                None => in_flight -= 1,
            }
        }
        if completed > 0 {
            queue.publish()?;
            idle_polls = 0;
            continue;
        }
        // Poll the used ring as a guest driver in polling mode would, but
        // give the CPU away while idle: the device's workers may share it.
        idle_polls += 1;
        if idle_polls.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        if idle_polls.is_multiple_of(4096) {
            let now = Instant::now();
            let since = *last_progress.get_or_insert(now);
            let quiet = now.duration_since(since);
            if quiet > REQUEST_TIMEOUT {
                return Err(HarnessError::Timeout(REQUEST_TIMEOUT));
            }
            if quiet > NUDGE_AFTER
                && now.duration_since(*last_nudge.get_or_insert(since)) > NUDGE_AFTER
            {
                queue.nudge()?;
                last_nudge = Some(now);
            }
        }
        if idle_polls == 1 {
            last_progress = None;
            last_nudge = None;
        }
    }
    Ok(stats)
}

/// Puts a READ of `stream` at offset index `at` on the queue (unpublished).
#[allow(clippy::too_many_arguments)]
fn submit(
    queue: &mut SplitQueue,
    mem: &GuestMemoryMmap,
    slot: &mut Slot,
    index: usize,
    by_head: &mut [usize],
    stream: &Stream,
    at: u64,
    unique: &mut u64,
) -> Result<()> {
    let offset = at * stream.stride;
    *unique += 1;
    if stream.write {
        // The header and `fuse_write_in` in one buffer, the data (filled
        // with the pattern when the slot was made) in another.
        let mut request = wire::request(
            opcode::WRITE,
            *unique,
            stream.nodeid,
            &wire::write_in_header(stream.fh, offset, stream.len),
        );
        let total = u32::try_from(request.len())
            .ok()
            .and_then(|n| n.checked_add(stream.len))
            .ok_or(HarnessError::OutOfGuestMemory(u64::from(stream.len)))?;
        request[..4].copy_from_slice(&total.to_le_bytes());
        mem.write_slice(&request, slot.request)?;
        let head = queue.add(
            &[
                (slot.request, request.len() as u32),
                (slot.data, stream.len),
            ],
            &[(slot.reply_header, (OUT_HEADER_LEN + WRITE_OUT_LEN) as u32)],
        )?;
        by_head[usize::from(head)] = index;
        slot.submitted = Instant::now();
        return Ok(());
    }
    let request = wire::request(
        opcode::READ,
        *unique,
        stream.nodeid,
        &wire::read_in(stream.fh, offset, stream.len),
    );
    mem.write_slice(&request, slot.request)?;
    let head = queue.add(
        &[
            (slot.request, IN_HEADER_LEN as u32),
            (
                GuestAddress(slot.request.0 + IN_HEADER_LEN as u64),
                (request.len() - IN_HEADER_LEN) as u32,
            ),
        ],
        &[
            (slot.reply_header, OUT_HEADER_LEN as u32),
            (slot.data, stream.len),
        ],
    )?;
    by_head[usize::from(head)] = index;
    slot.submitted = Instant::now();
    Ok(())
}

fn percentiles(ns: &mut [u64]) -> Latency {
    if ns.is_empty() {
        return Latency::default();
    }
    ns.sort_unstable();
    let at = |q: f64| {
        let i = ((ns.len() as f64 * q).ceil() as usize).clamp(1, ns.len()) - 1;
        ns[i] as f64 / 1000.0
    };
    Latency {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        p999: at(0.999),
        max: ns[ns.len() - 1] as f64 / 1000.0,
    }
}

/// Single-core memcpy throughput in GB/s copying `block` bytes at a time from
/// a 64 MiB source into `depth` destination buffers, as the device copies
/// file data into the guest's READ buffers.
pub fn memcpy_throughput(block: usize, depth: usize, duration: Duration) -> f64 {
    let source_len = (64 << 20).max(block);
    let source: Vec<u8> = (0..source_len).map(|i| (i as u8) | 1).collect();
    let mut targets = vec![vec![0u8; block]; depth.max(1)];
    let blocks = source_len / block;
    let mut copied = 0u64;
    let mut i = 0usize;
    let started = Instant::now();
    while started.elapsed() < duration {
        for _ in 0..64 {
            let src = &source[(i % blocks) * block..][..block];
            let count = targets.len();
            let dst = &mut targets[i % count];
            dst.copy_from_slice(src);
            std::hint::black_box(&dst[..]);
            copied += block as u64;
            i += 1;
        }
    }
    copied as f64 / started.elapsed().as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_visit_every_index_once() {
        for len in [1u64, 2, 3, 10, 64, 255, 256, 1000, 4099] {
            for order in [Permutation::in_order(len), Permutation::scattered(len)] {
                let mut seen = vec![false; len as usize];
                for i in 0..len {
                    let at = order.at(i);
                    assert!(at < len);
                    assert!(!seen[at as usize], "{order:?} repeats {at}");
                    seen[at as usize] = true;
                }
            }
        }
    }

    #[test]
    fn a_scattered_order_keeps_neighbours_apart() {
        let order = Permutation::scattered(1024);
        for i in 1..1024 {
            assert!(order.at(i).abs_diff(order.at(i - 1)) > 1);
        }
    }

    #[test]
    fn once_runs_out_and_random_never_does() {
        let once = Offsets::once(Permutation::in_order(3));
        let mut rng = 1;
        let taken: Vec<_> = std::iter::from_fn(|| once.next(&mut rng)).collect();
        assert_eq!(taken, [0, 1, 2]);
        assert!(once.ran_out());
        let random = Offsets::Random { count: 5 };
        for _ in 0..100 {
            assert!(random.next(&mut rng).is_some_and(|i| i < 5));
        }
        assert!(!random.ran_out());
    }

    #[test]
    fn percentiles_pick_ranks() {
        let mut ns: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let l = percentiles(&mut ns);
        assert_eq!(l.p50, 500.0);
        assert_eq!(l.p99, 990.0);
        assert_eq!(l.max, 1000.0);
    }
}
