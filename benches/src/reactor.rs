//! io_uring with fixed buffers versus pread on a thread pool: O_DIRECT random reads of one
//! file, 4 KiB and 1 MiB blocks, both backends in the same run, IOPS side by side with ratios.
//!
//! Both sides keep the same number of reads in flight through the same [`Reactor`] API; the
//! only difference is the backend (one io_uring thread vs. `threads` blocking preads).

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_numa::reactor::{BackendChoice, Event, ReactorConfig, open_direct};
use sluice_numa::{NodeBuffer, PageSize, Reactor};

/// Block sizes measured.
pub const BLOCKS: [usize; 2] = [4 << 10, 1 << 20];

/// Reads kept in flight on both sides.
pub const DEPTH: usize = 32;

/// One backend's result for one block size.
#[derive(Clone, Debug)]
pub struct Measurement {
    /// The backend as the reactor describes it.
    pub backend: String,
    /// Reads completed.
    pub ops: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Process CPU time (user + system) spent.
    pub cpu: Duration,
}

impl Measurement {
    /// Reads per second.
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// CPU microseconds per read.
    pub fn cpu_us_per_op(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / (self.ops.max(1) as f64)
    }
}

/// Both backends at one block size.
#[derive(Clone, Debug)]
pub struct Row {
    /// Block size in bytes.
    pub block: usize,
    /// io_uring with fixed buffers.
    pub uring: Measurement,
    /// pread on the thread pool.
    pub pool: Measurement,
}

/// The whole comparison.
#[derive(Clone, Debug)]
pub struct ReactorReport {
    /// The file read.
    pub path: PathBuf,
    /// Its size.
    pub file_size: u64,
    /// Pool threads.
    pub threads: usize,
    /// One row per block size.
    pub rows: Vec<Row>,
}

impl fmt::Display for ReactorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "reactor: O_DIRECT random reads of {} ({} MiB), {DEPTH} in flight",
            self.path.display(),
            self.file_size >> 20
        )?;
        if let Some(row) = self.rows.first() {
            writeln!(f, "  ours:      {}", row.uring.backend)?;
            writeln!(f, "  reference: {}", row.pool.backend)?;
        }
        writeln!(
            f,
            "{:>7} | {:>10} {:>9} {:>8} | {:>10} {:>9} {:>8} | {:>11} {:>11}",
            "block",
            "uring IOPS",
            "MiB/s",
            "CPU us/op",
            "pool IOPS",
            "MiB/s",
            "CPU us/op",
            "IOPS ratio",
            "CPU ratio"
        )?;
        for row in &self.rows {
            let mib = |m: &Measurement| m.iops() * row.block as f64 / f64::from(1 << 20);
            writeln!(
                f,
                "{:>7} | {:>10.0} {:>9.1} {:>8.2} | {:>10.0} {:>9.1} {:>8.2} | {:>10.2}x {:>10.2}x",
                if row.block >= 1 << 20 {
                    format!("{} MiB", row.block >> 20)
                } else {
                    format!("{} KiB", row.block >> 10)
                },
                row.uring.iops(),
                mib(&row.uring),
                row.uring.cpu_us_per_op(),
                row.pool.iops(),
                mib(&row.pool),
                row.pool.cpu_us_per_op(),
                row.uring.iops() / row.pool.iops().max(1e-9),
                row.uring.cpu_us_per_op() / row.pool.cpu_us_per_op().max(1e-9),
            )?;
        }
        Ok(())
    }
}

/// Runs the comparison on `path` (created or extended to `file_size` bytes first; it must be on
/// a file system with O_DIRECT), `seconds` per backend and block size, `threads` pool threads.
pub fn run(path: &Path, file_size: u64, seconds: f64, threads: usize) -> Result<ReactorReport> {
    let file_size = file_size - file_size % (1 << 20);
    if file_size < 1 << 20 {
        bail!("the benchmark file must be at least 1 MiB");
    }
    prepare(path, file_size)?;
    let duration = Duration::from_secs_f64(seconds.max(0.01));
    let mut rows = Vec::new();
    for block in BLOCKS {
        let uring = measure(
            path,
            file_size,
            block,
            duration,
            BackendChoice::Uring,
            threads,
        )
        .context("io_uring side")?;
        let pool = measure(
            path,
            file_size,
            block,
            duration,
            BackendChoice::Threads,
            threads,
        )
        .context("thread pool side")?;
        rows.push(Row { block, uring, pool });
    }
    Ok(ReactorReport {
        path: path.to_path_buf(),
        file_size,
        threads,
        rows,
    })
}

/// Writes the file with non-zero data (reads of never-written extents would skip the disk).
fn prepare(path: &Path, size: u64) -> Result<()> {
    if std::fs::metadata(path)
        .map(|m| m.len() >= size)
        .unwrap_or(false)
    {
        return Ok(());
    }
    let file = File::options()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let chunk: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i % 251) as u8 + 1).collect();
    let mut off = 0;
    while off < size {
        file.write_all_at(&chunk, off)?;
        off += chunk.len() as u64;
    }
    file.sync_all()?;
    Ok(())
}

fn cpu_time() -> Duration {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: usage is a writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn measure(
    path: &Path,
    file_size: u64,
    block: usize,
    duration: Duration,
    backend: BackendChoice,
    threads: usize,
) -> Result<Measurement> {
    let config = ReactorConfig {
        backend,
        pool_threads: threads,
        entries: (2 * DEPTH) as u32,
        ..ReactorConfig::default()
    };
    let mut reactor = Reactor::<()>::new(&config)?;
    let file = reactor.register_file(open_direct(path, false)?)?;
    let buffer = reactor.register_buffer(NodeBuffer::new(
        DEPTH * block,
        None,
        PageSize::HugeIfAvailable,
    )?)?;
    let blocks = file_size / block as u64;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next_offset = || {
        // xorshift64: enough randomness to defeat readahead and device caches' locality.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % blocks) * block as u64
    };
    for slot in 0..DEPTH {
        reactor.read_fixed(
            slot as u64,
            file,
            next_offset(),
            buffer,
            slot * block,
            block,
        )?;
    }
    let (start, cpu_start) = (Instant::now(), cpu_time());
    let mut ops = 0u64;
    let mut events = Vec::with_capacity(DEPTH);
    let mut stopping = false;
    while reactor.in_flight() > 0 {
        events.clear();
        reactor.wait(&mut events)?;
        if !stopping && start.elapsed() >= duration {
            stopping = true;
        }
        for event in &events {
            let Event::Io(done) = event else { continue };
            let n = done
                .result
                .as_ref()
                .map_err(|e| anyhow::anyhow!("read failed: {e}"))?;
            if *n != block {
                bail!("short read of {n} bytes");
            }
            ops += 1;
            if !stopping {
                let slot = done.token as usize;
                reactor.read_fixed(done.token, file, next_offset(), buffer, slot * block, block)?;
            }
        }
    }
    Ok(Measurement {
        backend: reactor.describe_backend().to_string(),
        ops,
        elapsed: start.elapsed(),
        cpu: cpu_time().saturating_sub(cpu_start),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short run on a small file: both sides complete reads and the report shows both.
    #[test]
    fn compares_both_backends_side_by_side() {
        // The temp dir, unless its file system refuses O_DIRECT (tmpfs before Linux 6.6).
        let mut dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        if let Err(sluice_numa::reactor::DirectError::Unsupported { .. }) =
            open_direct(&dir.path().join("probe"), true)
        {
            dir = tempfile::tempdir_in("/var/tmp").unwrap();
        }
        let path = dir.path().join("reactor-bench");
        let report = match run(&path, 8 << 20, 0.05, 2) {
            Ok(r) => r,
            // Where io_uring cannot be set up (qemu-user) there is nothing to compare.
            Err(e) if format!("{e:#}").contains("io_uring is unavailable") => return,
            Err(e) => panic!("{e:#}"),
        };
        assert_eq!(report.rows.len(), 2);
        for row in &report.rows {
            assert!(row.uring.ops > 0 && row.pool.ops > 0);
            assert!(row.uring.backend.starts_with("io_uring"));
            assert!(row.pool.backend.starts_with("pread/pwrite thread pool"));
        }
        let text = report.to_string();
        assert!(text.contains("4 KiB") && text.contains("1 MiB") && text.contains("IOPS ratio"));
    }

    /// The full benchmark: `SLUICE_BENCH_DIR=/var/tmp cargo test --release -p sluice-benches
    /// reactor::tests::full -- --ignored --nocapture`.
    #[test]
    #[ignore = "benchmark: 1 GiB file, 5 s per measurement"]
    fn full() {
        let dir = std::env::var_os("SLUICE_BENCH_DIR").map_or(std::env::temp_dir(), PathBuf::from);
        let path = dir.join("sluice-reactor-bench.dat");
        let report = run(&path, 1 << 30, 5.0, 4).unwrap();
        println!("{report}");
    }
}
