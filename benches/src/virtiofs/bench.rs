//! `sluice bench virtiofs`: many READs in flight on several queues from
//! several threads, against any vhost-user-fs socket.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::device::{Device, DeviceOptions};
use super::error::{HarnessError, Result};
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
    /// Bytes per READ (suffixes K, M, G).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
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
    /// Size of the file when it has to be created (suffixes K, M, G).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
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
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
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
#[derive(Debug, Clone, PartialEq)]
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
    pub elapsed: Duration,
    /// READs completed.
    pub ops: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Whether LOOKUP/GETATTR were measured (`--meta`) rather than READs.
    pub meta: bool,
    /// READs per second.
    pub iops: f64,
    /// Read throughput in GB/s (10^9 bytes).
    pub gb_per_s: f64,
    /// Per-READ latency.
    pub latency: Latency,
    /// Single-core memcpy throughput at the block size, with `--vs-memcpy`.
    pub memcpy_gb_per_s: Option<f64>,
    /// The same measurement against `--vs-socket`.
    pub reference: Option<Box<Report>>,
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
            "virtiofs read  tag={}  queues={}  block={}  depth={}  time={:.2}s",
            self.tag.as_deref().unwrap_or("-"),
            self.queues,
            self.block_size,
            self.depth,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(
            f,
            "  {:>12.0} IOPS  {:>8.3} GB/s  latency us: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            self.iops,
            self.gb_per_s,
            self.latency.p50,
            self.latency.p90,
            self.latency.p99,
            self.latency.p999,
            self.latency.max
        )?;
        if let Some(reference) = &self.reference {
            writeln!(
                f,
                "  reference {:>12.0} IOPS  {:>8.3} GB/s  latency us: p50 {:.1}  p99 {:.1}",
                reference.iops, reference.gb_per_s, reference.latency.p50, reference.latency.p99
            )?;
            writeln!(
                f,
                "  ours/reference: GB/s {:.3}  p50 latency {:.3}  p99 latency {:.3}",
                ratio(self.gb_per_s, reference.gb_per_s),
                ratio(self.latency.p50, reference.latency.p50),
                ratio(self.latency.p99, reference.latency.p99)
            )?;
        }
        if let Some(memcpy) = self.memcpy_gb_per_s {
            writeln!(
                f,
                "  memcpy 1 core {:>8.3} GB/s   virtiofs/memcpy = {:.3}",
                memcpy,
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

/// Parses sizes like `4096`, `4K`, `1M`, `2G`, `1MiB`.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 4096, 4K, 1M or 2G"))?;
    n.checked_mul(1 << shift)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{text:?} is zero or too large"))
}

/// Runs the benchmark described by `args`: the socket, then the reference
/// socket if given, then memcpy if asked for.
pub fn run(args: &VirtiofsArgs) -> anyhow::Result<Report> {
    let mut report = measure(&args.socket, args)?;
    if let Some(reference) = &args.vs_socket {
        report.reference = Some(Box::new(measure(reference, args)?));
    }
    if args.vs_memcpy {
        report.memcpy_gb_per_s = Some(memcpy_throughput(
            args.block_size as usize,
            args.depth,
            Duration::from_secs(args.seconds.clamp(1, 5)),
        ));
    }
    Ok(report)
}

/// Measures READs against the device at `socket`.
fn measure(socket: &std::path::Path, args: &VirtiofsArgs) -> anyhow::Result<Report> {
    if args.meta {
        return measure_meta(socket, args);
    }
    let block = u32::try_from(args.block_size)
        .map_err(|_| anyhow::anyhow!("--block-size must be below 4 GiB"))?;
    anyhow::ensure!(args.queues >= 1, "--queues must be at least 1");
    anyhow::ensure!(
        args.depth >= 1 && args.depth * 3 <= usize::from(args.queue_size),
        "--depth must be between 1 and {} (three descriptors per READ)",
        usize::from(args.queue_size) / 3
    );
    anyhow::ensure!(
        args.file_size >= args.block_size,
        "--file-size must be at least --block-size"
    );
    let setup_io: u32 = block.min(1 << 20);
    let per_queue =
        args.depth as u64 * (u64::from(block) + 4096) + u64::from(args.queue_size) * 32 + 3 * 4096;
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
        for _ in 0..args.depth {
            slots.push(Slot {
                request: device.alloc(128)?,
                reply_header: device.alloc(OUT_HEADER_LEN as u64)?,
                data: device.alloc(u64::from(block))?,
                submitted: Instant::now(),
            });
        }
        workers.push((queue, slots));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let plan = Plan {
        nodeid,
        fh,
        block,
        blocks: file_size / args.block_size,
    };
    let started = Instant::now();
    let handles: Vec<_> = workers
        .into_iter()
        .enumerate()
        .map(|(i, (queue, slots))| {
            let mem = mem.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("virtiofs-q{}", i + 1))
                .spawn(move || drive_queue(queue, &mem, slots, plan, i as u64 + 1, &stop))
        })
        .collect::<std::io::Result<_>>()?;
    std::thread::sleep(Duration::from_secs(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut ops = 0u64;
    let mut first_error = None;
    for handle in handles {
        match handle.join() {
            Ok(Ok(stats)) => {
                ops += stats.latencies_ns.len() as u64;
                latencies.extend(stats.latencies_ns);
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => anyhow::bail!("a queue thread panicked"),
        }
    }
    let elapsed = started.elapsed();
    if let Some(e) = first_error {
        return Err(e.into());
    }
    let bytes = ops * args.block_size;
    let secs = elapsed.as_secs_f64();
    Ok(Report {
        tag,
        queues: args.queues,
        block_size: args.block_size,
        depth: args.depth,
        elapsed,
        ops,
        bytes,
        meta: false,
        iops: ops as f64 / secs,
        gb_per_s: bytes as f64 / secs / 1e9,
        latency: percentiles(&mut latencies),
        memcpy_gb_per_s: None,
        reference: None,
    })
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
        ops,
        bytes: 0,
        meta: true,
        iops: ops as f64 / elapsed.as_secs_f64(),
        gb_per_s: 0.0,
        latency: percentiles(&mut latencies),
        memcpy_gb_per_s: None,
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

/// What every queue thread reads.
#[derive(Debug, Clone, Copy)]
struct Plan {
    nodeid: u64,
    fh: u64,
    block: u32,
    blocks: u64,
}

/// Buffers of one in-flight READ.
#[derive(Debug)]
struct Slot {
    request: GuestAddress,
    reply_header: GuestAddress,
    data: GuestAddress,
    submitted: Instant,
}

#[derive(Debug, Default)]
struct QueueStats {
    latencies_ns: Vec<u64>,
}

/// Keeps `slots.len()` READs in flight on `queue` until `stop` is set.
fn drive_queue(
    mut queue: SplitQueue,
    mem: &GuestMemoryMmap,
    mut slots: Vec<Slot>,
    plan: Plan,
    seed: u64,
    stop: &AtomicBool,
) -> Result<QueueStats> {
    let mut stats = QueueStats::default();
    let mut by_head = vec![usize::MAX; usize::from(queue.size())];
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unique = seed << 48;
    for (index, slot) in slots.iter_mut().enumerate() {
        submit(
            &mut queue,
            mem,
            slot,
            index,
            &mut by_head,
            plan,
            &mut rng,
            &mut unique,
        )?;
    }
    queue.publish()?;
    let mut in_flight = slots.len();
    let expected = (OUT_HEADER_LEN as u32) + plan.block;
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
            stats
                .latencies_ns
                .push(slot.submitted.elapsed().as_nanos() as u64);
            if len != expected {
                let error: i32 = mem.read_obj(GuestAddress(slot.reply_header.0 + 4))?;
                if error != 0 {
                    return Err(HarnessError::Errno {
                        opcode: opcode::READ,
                        errno: error.wrapping_neg(),
                    });
                }
                return Err(HarnessError::BadReply {
                    opcode: opcode::READ,
                    why: format!("{len} bytes instead of {expected}"),
                });
            }
            completed += 1;
            if stopping {
                in_flight -= 1;
            } else {
                submit(
                    &mut queue,
                    mem,
                    slot,
                    index,
                    &mut by_head,
                    plan,
                    &mut rng,
                    &mut unique,
                )?;
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

#[allow(clippy::too_many_arguments)]
fn submit(
    queue: &mut SplitQueue,
    mem: &GuestMemoryMmap,
    slot: &mut Slot,
    index: usize,
    by_head: &mut [usize],
    plan: Plan,
    rng: &mut u64,
    unique: &mut u64,
) -> Result<()> {
    // xorshift64: cheap, and good enough to spread offsets over the file.
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let offset = (*rng % plan.blocks) * u64::from(plan.block);
    *unique += 1;
    let request = wire::request(
        opcode::READ,
        *unique,
        plan.nodeid,
        &wire::read_in(plan.fh, offset, plan.block),
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
            (slot.data, plan.block),
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
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("ten").is_err());
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
