//! `sluice bench files DIR`: small-file metadata rates and a checkpoint burst, the
//! workloads that pay for durability one operation at a time.
//!
//! Phases, each on its own set of files in a scratch directory inside DIR:
//!
//! - `create`: each thread creates its files (open with `O_CREAT`, one write of the file
//!   size, close), no fsync;
//! - `stat`: each thread stats the files it created;
//! - `read`: each thread opens, reads whole and closes the files it created;
//! - `list`: one thread lists the directory of what `create` made and stats every entry
//!   (`ls -l`);
//! - `unlink`: each thread removes the files it created;
//! - `create-fsync`: as `create`, with an fsync before the close;
//! - `checkpoint`: `--checkpoint-threads` threads each write `--checkpoint-files` files of
//!   `--checkpoint-size` (1 MiB writes), each fsync'ed before its close — a training job
//!   saving a sharded checkpoint.
//!
//! Each phase prints files per second (the checkpoint also MiB/s); `--json` prints one
//! object per phase instead, for `benches/vs-smallfiles.sh`. With `--redis URL` (the
//! metadata server of the file system under test) each phase also reports the round trips
//! it cost that server per file: the change of its `total_reads_processed` (one per
//! command or pipeline a client sent), as `benches/vs-redis-meta.sh` compares them.
//! `--settle S` waits between phases, so the kernel's attribute and entry caches (1 s by
//! default on both sluice and JuiceFS) have expired when the next one starts.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use sluice_engine::size::{SizeRange, Unit, format_size, parse_size};

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s, Unit::Bytes, SizeRange::ANY).map_err(|e| e.to_string())
}

/// The phases of `sluice bench files`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Create, write, close.
    Create,
    /// Stat what `create` made.
    Stat,
    /// Open, read and close what `create` made.
    Read,
    /// List and stat what `create` made (`ls -l`).
    List,
    /// Remove what `create` made.
    Unlink,
    /// Create, write, fsync, close.
    CreateFsync,
    /// Many threads writing big files, each fsync'ed.
    Checkpoint,
}

/// Arguments of `sluice bench files`.
#[derive(Debug, Clone, clap::Args)]
pub struct FilesArgs {
    /// Directory to benchmark (a scratch directory is made inside it and removed after).
    pub path: PathBuf,
    /// Phases to run, in order (`unlink` removes what `create` made, so it needs it first).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "create,unlink,create-fsync,checkpoint"
    )]
    pub phases: Vec<Phase>,
    /// Threads of the create, unlink and create-fsync phases.
    #[arg(short = 'p', long, default_value_t = 1)]
    pub threads: usize,
    /// Files per thread in the create, unlink and create-fsync phases.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// Size of each small file.
    #[arg(long, default_value = "4K", value_parser = size_arg)]
    pub size: u64,
    /// Threads of the checkpoint phase.
    #[arg(long, default_value_t = 8)]
    pub checkpoint_threads: usize,
    /// Files per thread in the checkpoint phase.
    #[arg(long, default_value_t = 125)]
    pub checkpoint_files: usize,
    /// Size of each checkpoint file.
    #[arg(long, default_value = "1M", value_parser = size_arg)]
    pub checkpoint_size: u64,
    /// One JSON object per phase instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The metadata engine's Redis server (`redis://HOST:PORT`): each phase reports the
    /// round trips per file it cost that server.
    #[arg(long)]
    pub redis: Option<String>,
    /// Seconds to wait between phases (let the kernel's caches expire).
    #[arg(long, default_value_t = 0.0)]
    pub settle: f64,
}

/// What one phase measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseResult {
    /// The phase.
    pub phase: Phase,
    /// Files the phase handled.
    pub files: usize,
    /// Bytes it wrote.
    pub bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Files per second.
    pub files_per_sec: f64,
    /// MiB written per second.
    pub mib_per_sec: f64,
    /// Round trips to the metadata server per file (with `--redis`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trips_per_file: Option<f64>,
}

/// Errors of `sluice bench files`.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// A file-system call failed.
    #[error("cannot {action} {path}: {source}")]
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

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FilesError + 'a {
    move |source| FilesError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes one file of `size` bytes from `buf` (repeated), fsync'ed when asked.
fn write_one(path: &Path, size: u64, buf: &[u8], fsync: bool) -> Result<(), FilesError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io_err("create", path))?;
    let mut left = size as usize;
    while left > 0 {
        let n = left.min(buf.len());
        f.write_all(&buf[..n]).map_err(io_err("write", path))?;
        left -= n;
    }
    if fsync {
        f.sync_all().map_err(io_err("fsync", path))?;
    }
    Ok(())
}

/// Runs `per_thread(t)` on `threads` threads at once and returns the wall time.
fn timed(
    threads: usize,
    per_thread: impl Fn(usize) -> Result<(), FilesError> + Sync,
) -> Result<f64, FilesError> {
    let start = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &per_thread;
                s.spawn(move || f(t))
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(FilesError::InvalidParameter("a thread panicked".into())))
        })
    })?;
    Ok(start.elapsed().as_secs_f64())
}

fn result(phase: Phase, files: usize, bytes: u64, seconds: f64) -> PhaseResult {
    let s = seconds.max(1e-9);
    PhaseResult {
        phase,
        files,
        bytes,
        seconds,
        files_per_sec: files as f64 / s,
        mib_per_sec: bytes as f64 / s / (1 << 20) as f64,
        round_trips_per_file: None,
    }
}

/// Runs the phases in a scratch directory under `args.path` (removed after).
pub fn run(args: &FilesArgs) -> Result<Vec<PhaseResult>, FilesError> {
    if args.threads == 0 || args.checkpoint_threads == 0 {
        return Err(FilesError::InvalidParameter(
            "--threads and --checkpoint-threads must be at least 1".into(),
        ));
    }
    if args.size > 1 << 30 || args.checkpoint_size > 16 << 30 {
        return Err(FilesError::InvalidParameter(
            "--size is for small files (at most 1 GiB), --checkpoint-size at most 16 GiB".into(),
        ));
    }
    let create = args.phases.iter().position(|p| *p == Phase::Create);
    for (i, p) in args.phases.iter().enumerate() {
        if matches!(p, Phase::Stat | Phase::Read | Phase::List | Phase::Unlink)
            && create.is_none_or(|c| c > i)
        {
            return Err(FilesError::InvalidParameter(format!(
                "the {} phase uses what create made: put create first",
                phase_name(*p)
            )));
        }
    }
    if !(args.settle.is_finite() && (0.0..=60.0).contains(&args.settle)) {
        return Err(FilesError::InvalidParameter(
            "--settle takes 0 to 60 seconds".into(),
        ));
    }
    let scratch = args
        .path
        .join(format!("sluice-bench-files-{}", std::process::id()));
    fs::create_dir(&scratch).map_err(io_err("create", &scratch))?;
    let out = run_in(args, &scratch);
    let removed = fs::remove_dir_all(&scratch).map_err(io_err("remove", &scratch));
    let out = out?;
    removed?;
    Ok(out)
}

fn run_in(args: &FilesArgs, scratch: &Path) -> Result<Vec<PhaseResult>, FilesError> {
    let small = vec![0x5au8; (args.size as usize).clamp(1, 1 << 20)];
    let big = vec![0xa5u8; (args.checkpoint_size as usize).clamp(1, 1 << 20)];
    let dir = |name: &str| -> Result<PathBuf, FilesError> {
        let d = scratch.join(name);
        fs::create_dir(&d).map_err(io_err("create", &d))?;
        Ok(d)
    };
    let mut out = Vec::new();
    let mut created: Option<PathBuf> = None;
    let mut server = match &args.redis {
        Some(url) => Some(RoundTrips::connect(url)?),
        None => None,
    };
    for (n, phase) in args.phases.iter().enumerate() {
        if n > 0 && args.settle > 0.0 {
            std::thread::sleep(std::time::Duration::from_secs_f64(args.settle));
        }
        let before = match &mut server {
            Some(s) => Some(s.count()?),
            None => None,
        };
        let (files, threads) = match phase {
            Phase::Checkpoint => (args.checkpoint_files, args.checkpoint_threads),
            _ => (args.count, args.threads),
        };
        let name = |d: &Path, t: usize, i: usize| d.join(format!("f{t}-{i}"));
        let r = match phase {
            Phase::Create | Phase::CreateFsync => {
                let d = dir(if *phase == Phase::Create {
                    "create"
                } else {
                    "fsync"
                })?;
                let fsync = *phase == Phase::CreateFsync;
                let secs = timed(threads, |t| {
                    (0..files)
                        .try_for_each(|i| write_one(&name(&d, t, i), args.size, &small, fsync))
                })?;
                if *phase == Phase::Create {
                    created = Some(d);
                }
                result(
                    *phase,
                    files * threads,
                    (files * threads) as u64 * args.size,
                    secs,
                )
            }
            Phase::Stat | Phase::Read => {
                let d = created.clone().ok_or_else(|| {
                    FilesError::InvalidParameter("this phase needs the create phase".into())
                })?;
                let read = *phase == Phase::Read;
                let secs = timed(threads, |t| {
                    let mut buf = vec![0u8; 1 << 20];
                    (0..files).try_for_each(|i| {
                        let p = name(&d, t, i);
                        if read {
                            let mut f = fs::File::open(&p).map_err(io_err("open", &p))?;
                            while std::io::Read::read(&mut f, &mut buf)
                                .map_err(io_err("read", &p))?
                                > 0
                            {}
                            Ok(())
                        } else {
                            fs::metadata(&p).map(drop).map_err(io_err("stat", &p))
                        }
                    })
                })?;
                result(*phase, files * threads, 0, secs)
            }
            Phase::List => {
                let d = created.clone().ok_or_else(|| {
                    FilesError::InvalidParameter("the list phase needs the create phase".into())
                })?;
                let mut seen = 0usize;
                let start = Instant::now();
                for e in fs::read_dir(&d).map_err(io_err("list", &d))? {
                    let e = e.map_err(io_err("list", &d))?;
                    e.metadata().map_err(io_err("stat", &e.path()))?;
                    seen += 1;
                }
                result(*phase, seen, 0, start.elapsed().as_secs_f64())
            }
            Phase::Unlink => {
                let d = created.take().ok_or_else(|| {
                    FilesError::InvalidParameter("the unlink phase needs the create phase".into())
                })?;
                let secs = timed(threads, |t| {
                    (0..files).try_for_each(|i| {
                        let p = name(&d, t, i);
                        fs::remove_file(&p).map_err(io_err("unlink", &p))
                    })
                })?;
                result(*phase, files * threads, 0, secs)
            }
            Phase::Checkpoint => {
                let d = dir("checkpoint")?;
                let secs = timed(threads, |t| {
                    (0..files).try_for_each(|i| {
                        write_one(&name(&d, t, i), args.checkpoint_size, &big, true)
                    })
                })?;
                result(
                    *phase,
                    files * threads,
                    (files * threads) as u64 * args.checkpoint_size,
                    secs,
                )
            }
        };
        let mut r = r;
        if let (Some(s), Some(before)) = (&mut server, before) {
            // The sample itself is one command the server counts.
            let trips = s.count()?.saturating_sub(before + 1);
            r.round_trips_per_file = Some(trips as f64 / r.files.max(1) as f64);
        }
        out.push(r);
    }
    Ok(out)
}

/// The name a phase has on the command line and in the output.
fn phase_name(p: Phase) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A connection to the metadata server that reads how many commands (or pipelines: a
/// client's round trips) it has read from its clients.
struct RoundTrips(redis::Connection);

impl RoundTrips {
    fn connect(url: &str) -> Result<RoundTrips, FilesError> {
        let bad =
            |e: redis::RedisError| FilesError::InvalidParameter(format!("--redis {url}: {e}"));
        let c = redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .map_err(bad)?;
        Ok(RoundTrips(c))
    }

    /// `total_reads_processed` of the server's `INFO stats`.
    fn count(&mut self) -> Result<u64, FilesError> {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut self.0)
            .map_err(|e| FilesError::InvalidParameter(format!("Redis INFO: {e}")))?;
        info.lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                FilesError::InvalidParameter(
                    "the Redis server reports no total_reads_processed".into(),
                )
            })
    }
}

/// The results as a table.
pub fn format_table(args: &FilesArgs, results: &[PhaseResult]) -> String {
    let mut s = format!(
        "Small files: {} thread(s) × {} files of {}; checkpoint {} thread(s) × {} files of {}, each fsync'ed\n",
        args.threads,
        args.count,
        format_size(args.size),
        args.checkpoint_threads,
        args.checkpoint_files,
        format_size(args.checkpoint_size)
    );
    s.push_str(&format!(
        "{:<14} {:>8} {:>10} {:>12} {:>10} {:>12}\n",
        "phase", "files", "seconds", "files/s", "MiB/s", "trips/file"
    ));
    for r in results {
        let trips = r
            .round_trips_per_file
            .map_or_else(|| "-".to_string(), |t| format!("{t:.2}"));
        s.push_str(&format!(
            "{:<14} {:>8} {:>10.3} {:>12.1} {:>10.1} {:>12}\n",
            phase_name(r.phase),
            r.files,
            r.seconds,
            r.files_per_sec,
            r.mib_per_sec,
            trips
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_runs_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let args = FilesArgs {
            path: dir.path().to_path_buf(),
            phases: vec![
                Phase::Create,
                Phase::Stat,
                Phase::Read,
                Phase::List,
                Phase::Unlink,
                Phase::CreateFsync,
                Phase::Checkpoint,
            ],
            threads: 2,
            count: 5,
            size: 4096,
            checkpoint_threads: 2,
            checkpoint_files: 2,
            checkpoint_size: 3 << 20,
            json: false,
            redis: None,
            settle: 0.0,
        };
        let r = run(&args).unwrap();
        assert_eq!(
            r.iter().map(|r| (r.phase, r.files)).collect::<Vec<_>>(),
            [
                (Phase::Create, 10),
                (Phase::Stat, 10),
                (Phase::Read, 10),
                (Phase::List, 10),
                (Phase::Unlink, 10),
                (Phase::CreateFsync, 10),
                (Phase::Checkpoint, 4)
            ]
        );
        assert_eq!(r[6].bytes, 4 * (3 << 20));
        assert!(format_table(&args, &r).contains("create-fsync"));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn unlink_needs_create_first() {
        let dir = tempfile::tempdir().unwrap();
        let args = FilesArgs {
            path: dir.path().to_path_buf(),
            phases: vec![Phase::Unlink, Phase::Create],
            threads: 1,
            count: 1,
            size: 1,
            checkpoint_threads: 1,
            checkpoint_files: 1,
            checkpoint_size: 1,
            json: false,
            redis: None,
            settle: 0.0,
        };
        assert!(matches!(run(&args), Err(FilesError::InvalidParameter(_))));
    }
}
