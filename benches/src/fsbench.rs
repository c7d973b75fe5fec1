//! `sluice bench PATH`: a quick file-system benchmark in the manner of `juicefs bench`.
//!
//! N threads each write one big file with fixed-size I/O, then read it back; then each
//! writes, reads and stats its share of small files. Every written file is fsync'd before
//! it is closed (JuiceFS persists on close, a local disk on fsync), and the page cache is
//! dropped before each read phase when the process may do so, as `juicefs bench` does.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::mlperf::record::FillPattern;
use crate::page_cache;
use sluice_engine::size::{SizeRange, Unit, format_size, size_parser};

/// Errors of the file-system benchmark.
#[derive(Debug, thiserror::Error)]
pub enum FsBenchError {
    /// A file-system call failed.
    #[error("cannot {action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A parameter makes no sense.
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FsBenchError + 'a {
    move |source| FsBenchError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Arguments of `sluice bench PATH`.
#[derive(Debug, Clone, clap::Args)]
pub struct FsBenchArgs {
    /// Directory to benchmark (a scratch directory is made inside it and removed after).
    #[arg(value_name = "PATH", required = true)]
    pub path: Option<PathBuf>,
    /// Threads, each with its own big file and small files.
    #[arg(short = 'p', long, default_value_t = 1)]
    pub threads: usize,
    /// Size of each big file (a bare number is MiB, as in `juicefs bench`).
    #[arg(long, default_value = "1G", value_parser = size_parser(Unit::Mib, SizeRange::ANY))]
    pub big_file_size: u64,
    /// I/O size for big files (a bare number is MiB, as in `juicefs bench`).
    #[arg(long, default_value = "1M", value_parser = size_parser(Unit::Mib, SizeRange::ANY))]
    pub block_size: u64,
    /// Size of each small file (a bare number is KiB, as in `juicefs bench`).
    #[arg(long, default_value = "128K", value_parser = size_parser(Unit::Kib, SizeRange::ANY))]
    pub small_file_size: u64,
    /// Small files per thread.
    #[arg(long, default_value_t = 100)]
    pub small_file_count: usize,
}

/// One line of the result table.
#[derive(Debug, Clone, PartialEq)]
pub struct FsBenchLine {
    /// What was measured.
    pub item: &'static str,
    /// MiB/s (0 for stat).
    pub mib_per_second: f64,
    /// Operations per second: I/O calls for big files, files for small files.
    pub ops_per_second: f64,
    /// Seconds per file, per thread.
    pub seconds_per_file: f64,
}

/// The whole result.
#[derive(Debug, Clone)]
pub struct FsBenchReport {
    /// The table lines in order.
    pub lines: Vec<FsBenchLine>,
    /// Whether the page cache was dropped before the read phases.
    pub caches_dropped: bool,
}

struct Phase {
    seconds: f64,
    bytes: u64,
    ops: u64,
    files: u64,
}

fn run_threads(
    threads: usize,
    work: impl Fn(usize) -> Result<(u64, u64, u64), FsBenchError> + Sync,
) -> Result<Phase, FsBenchError> {
    let started = Instant::now();
    let results: Vec<Result<(u64, u64, u64), FsBenchError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let work = &work;
                scope.spawn(move || work(t))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or(Err(FsBenchError::InvalidParameter(
                    "a benchmark thread panicked".into(),
                )))
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    let mut phase = Phase {
        seconds,
        bytes: 0,
        ops: 0,
        files: 0,
    };
    for r in results {
        let (bytes, ops, files) = r?;
        phase.bytes += bytes;
        phase.ops += ops;
        phase.files += files;
    }
    Ok(phase)
}

fn write_file(
    path: &Path,
    size: u64,
    block: usize,
    pattern: &FillPattern,
    salt: u64,
) -> Result<u64, FsBenchError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io_err("create", path))?;
    let mut written = 0u64;
    let mut ops = 0u64;
    while written < size {
        let n = (size - written).min(block as u64) as usize;
        file.write_all(pattern.chunk(salt, ops, n))
            .map_err(io_err("write", path))?;
        written += n as u64;
        ops += 1;
    }
    file.sync_all().map_err(io_err("fsync", path))?;
    Ok(ops)
}

fn read_file(path: &Path, buf: &mut [u8], expected: u64) -> Result<u64, FsBenchError> {
    let mut file = File::open(path).map_err(io_err("open", path))?;
    let mut total = 0u64;
    let mut ops = 0u64;
    loop {
        let n = file.read(buf).map_err(io_err("read", path))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        ops += 1;
    }
    if total != expected {
        return Err(FsBenchError::Io {
            action: "read back",
            path: path.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read {total} bytes of the {expected} written"),
            ),
        });
    }
    Ok(ops)
}

fn line(item: &'static str, phase: &Phase, threads: usize) -> FsBenchLine {
    FsBenchLine {
        item,
        mib_per_second: phase.bytes as f64 / phase.seconds / (1u64 << 20) as f64,
        ops_per_second: phase.ops as f64 / phase.seconds,
        seconds_per_file: if phase.files == 0 {
            0.0
        } else {
            phase.seconds * threads as f64 / phase.files as f64
        },
    }
}

/// Runs the benchmark in a scratch directory inside `args.path`.
pub fn run(args: &FsBenchArgs) -> Result<FsBenchReport, FsBenchError> {
    let root = args
        .path
        .as_ref()
        .ok_or_else(|| FsBenchError::InvalidParameter("give the PATH to benchmark".into()))?;
    if args.threads == 0 || args.block_size == 0 || args.block_size > 1 << 20 {
        return Err(FsBenchError::InvalidParameter(
            "use at least 1 thread and a block size between 1 byte and 1 MiB".into(),
        ));
    }
    let block = args.block_size as usize;
    let scratch = root.join(format!("__sluice_bench_{}", std::process::id()));
    fs::create_dir(&scratch).map_err(io_err("create directory", &scratch))?;
    let result = run_in(args, &scratch, block);
    let cleanup = fs::remove_dir_all(&scratch).map_err(io_err("remove", &scratch));
    let report = result?;
    cleanup?;
    Ok(report)
}

fn run_in(args: &FsBenchArgs, scratch: &Path, block: usize) -> Result<FsBenchReport, FsBenchError> {
    let threads = args.threads;
    let pattern = FillPattern::new(0xbe7c);
    let big = |t: usize| scratch.join(format!("big_{t}"));
    let small = |t: usize, i: usize| scratch.join(format!("small_{t}_{i}"));
    let mut caches_dropped = true;
    let mut drop = || {
        if page_cache::drop_caches().is_err() {
            caches_dropped = false;
        }
    };
    let mut lines = Vec::new();
    if args.big_file_size > 0 {
        let phase = run_threads(threads, |t| {
            let ops = write_file(&big(t), args.big_file_size, block, &pattern, t as u64)?;
            Ok((args.big_file_size, ops, 1))
        })?;
        lines.push(line("Write big file", &phase, threads));
        drop();
        let phase = run_threads(threads, |t| {
            let mut buf = vec![0u8; block];
            let ops = read_file(&big(t), &mut buf, args.big_file_size)?;
            Ok((args.big_file_size, ops, 1))
        })?;
        lines.push(line("Read big file", &phase, threads));
    }
    if args.small_file_count > 0 {
        let size = args.small_file_size;
        let count = args.small_file_count as u64;
        let phase = run_threads(threads, |t| {
            for i in 0..args.small_file_count {
                write_file(&small(t, i), size, block, &pattern, (t * 7919 + i) as u64)?;
            }
            Ok((size * count, count, count))
        })?;
        lines.push(line("Write small file", &phase, threads));
        drop();
        let phase = run_threads(threads, |t| {
            let mut buf = vec![0u8; block.max(size as usize).min(1 << 20)];
            for i in 0..args.small_file_count {
                read_file(&small(t, i), &mut buf, size)?;
            }
            Ok((size * count, count, count))
        })?;
        lines.push(line("Read small file", &phase, threads));
        let phase = run_threads(threads, |t| {
            for i in 0..args.small_file_count {
                let path = small(t, i);
                fs::metadata(&path).map_err(io_err("stat", &path))?;
            }
            Ok((0, count, count))
        })?;
        lines.push(line("Stat file", &phase, threads));
    }
    Ok(FsBenchReport {
        lines,
        caches_dropped,
    })
}

/// Renders the report as a table like `juicefs bench` prints.
pub fn format_table(args: &FsBenchArgs, report: &FsBenchReport) -> String {
    let header = ["ITEM", "MiB/s", "ops/s", "COST"];
    let rows: Vec<[String; 4]> = report
        .lines
        .iter()
        .map(|l| {
            let mib = if l.item == "Stat file" {
                "-".to_string()
            } else {
                format!("{:.2} MiB/s", l.mib_per_second)
            };
            let unit = if l.item.contains("big") {
                "I/O"
            } else {
                "files"
            };
            let cost = if l.seconds_per_file >= 1.0 {
                format!("{:.2} s/file", l.seconds_per_file)
            } else {
                format!("{:.2} ms/file", l.seconds_per_file * 1e3)
            };
            [
                l.item.to_string(),
                mib,
                format!("{:.1} {unit}/s", l.ops_per_second),
                cost,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let rule: String = widths
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let mut out = String::new();
    out.push_str(&format!(
        "Benchmark {}: {} thread(s), big file {} ({} I/O), small file {} × {} per thread\n",
        args.path.as_deref().unwrap_or(Path::new("?")).display(),
        args.threads,
        format_size(args.big_file_size),
        format_size(args.block_size),
        format_size(args.small_file_size),
        args.small_file_count
    ));
    out.push_str(&rule);
    let centered: Vec<String> = header
        .iter()
        .zip(widths)
        .map(|(h, w)| format!(" {h:^w$} "))
        .collect();
    out.push_str(&format!("|{}|\n", centered.join("|")));
    out.push_str(&rule);
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!(" {c:>w$} "))
            .collect();
        out.push_str(&format!("|{}|\n", cells.join("|")));
    }
    out.push_str(&rule);
    if !report.caches_dropped {
        out.push_str("note: the page cache could not be dropped (not root?), so reads may come from memory\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_phase_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let args = FsBenchArgs {
            path: Some(dir.path().to_path_buf()),
            threads: 2,
            big_file_size: 3 << 20,
            block_size: 1 << 20,
            small_file_size: 10_000,
            small_file_count: 5,
        };
        let report = run(&args).unwrap();
        let items: Vec<_> = report.lines.iter().map(|l| l.item).collect();
        assert_eq!(
            items,
            [
                "Write big file",
                "Read big file",
                "Write small file",
                "Read small file",
                "Stat file"
            ]
        );
        assert!(report.lines.iter().all(|l| l.ops_per_second > 0.0));
        // 2 threads × 3 MiB in 1 MiB blocks: the read phase did 6 I/Os.
        assert!(report.lines[0].mib_per_second > 0.0);
        let table = format_table(&args, &report);
        assert!(table.contains("| Write big file |") || table.contains("Write big file"));
        assert_eq!(table.lines().filter(|l| l.starts_with('|')).count(), 6);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_path_is_a_clear_error() {
        let args = FsBenchArgs {
            path: Some(PathBuf::from("/nonexistent/sluice")),
            threads: 1,
            big_file_size: 1,
            block_size: 1,
            small_file_size: 1,
            small_file_count: 1,
        };
        let err = run(&args).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot create directory /nonexistent/sluice"),
            "{err}"
        );
    }
}
