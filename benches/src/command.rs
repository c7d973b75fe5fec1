//! The `sluice bench` command line.
//!
//! `sluice bench` takes either a subcommand (`mlperf`, `fs`, and those other modules add)
//! or a PATH, which runs the file-system benchmark: `sluice bench /mnt/jfs` is
//! `sluice bench fs /mnt/jfs`. Subcommand names win, so a directory that happens to be
//! called `mlperf` is benchmarked with `sluice bench ./mlperf` or `sluice bench fs mlperf`.

use sluice_engine::size::{SizeRange, Unit, size_parser};

use crate::fsbench::{self, FsBenchArgs, FsBenchError};
use crate::mlperf::MlperfError;
use crate::mlperf::cli::{self as mlperf_cli, MlperfArgs};

/// `sluice bench`: benchmarks and workload emulators.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    /// A benchmark; without one, PATH gets the file-system benchmark.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub fs: FsBenchArgs,
}

/// The `sluice bench` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// MLPerf Storage emulation: data generation, training runs, checkpointing.
    Mlperf(MlperfArgs),
    /// The file-system benchmark (same as `sluice bench PATH`).
    Fs(FsBenchArgs),
    /// Small files created, fsync'ed and unlinked per second, and a checkpoint burst.
    Files(crate::files::FilesArgs),
    /// Copy and CRC32C kernels vs memcpy, crc-fast and the crc32c crate.
    Copy(CopyArgs),
    /// O_DIRECT random reads: io_uring with fixed buffers vs pread on a thread pool.
    Reactor(ReactorArgs),
    /// Drive a vhost-user-fs socket as a guest would (sluice serve, virtiofsd).
    Virtiofs(crate::virtiofs::VirtiofsArgs),
}

/// `sluice bench copy`: the simd crate's kernels next to the references.
#[derive(Debug, clap::Args)]
pub struct CopyArgs {
    /// Buffer sizes to measure (default 4K 64K 1M 4M 64M).
    #[arg(long, value_delimiter = ',', value_parser = size_parser(Unit::Bytes, SizeRange::new(1, u64::MAX)))]
    pub sizes: Vec<u64>,
    /// Seconds per (kernel, size) case.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
}

/// `sluice bench reactor`: the numa crate's I/O backends side by side.
#[derive(Debug, clap::Args)]
pub struct ReactorArgs {
    /// Directory for the test file; it must support O_DIRECT (not every tmpfs does).
    #[arg(long, default_value = "/var/tmp")]
    pub dir: std::path::PathBuf,
    /// Size of the test file (e.g. 1G).
    #[arg(long, default_value = "1G", value_parser = size_parser(Unit::Bytes, SizeRange::new(1, u64::MAX)))]
    pub file_size: u64,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Threads in the pread pool.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
}

/// Errors of `sluice bench`.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The MLPerf emulation failed.
    #[error(transparent)]
    Mlperf(#[from] MlperfError),
    /// The file-system benchmark failed.
    #[error(transparent)]
    Fs(#[from] FsBenchError),
    /// The small-file benchmark failed.
    #[error(transparent)]
    Files(#[from] crate::files::FilesError),
    /// The virtio-fs benchmark failed.
    #[error("virtio-fs benchmark: {0:#}")]
    Virtiofs(anyhow::Error),
    /// The reactor benchmark failed.
    #[error("reactor benchmark: {0:#}")]
    Reactor(anyhow::Error),
}

/// Runs `sluice bench ...`.
pub fn run(args: BenchArgs) -> Result<(), BenchError> {
    match args.command {
        Some(BenchCommand::Mlperf(a)) => mlperf_cli::run(a)?,
        Some(BenchCommand::Fs(a)) => run_fs(&a)?,
        Some(BenchCommand::Files(a)) => {
            let results = crate::files::run(&a)?;
            if a.json {
                for r in &results {
                    let json = serde_json::to_string(r).unwrap_or_default();
                    println!("{json}");
                }
            } else {
                print!("{}", crate::files::format_table(&a, &results));
            }
        }
        Some(BenchCommand::Copy(a)) => {
            let sizes: Vec<usize> = if a.sizes.is_empty() {
                crate::kernels::DEFAULT_SIZES.to_vec()
            } else {
                a.sizes.iter().map(|&s| s as usize).collect()
            };
            print!("{}", crate::kernels::run(&sizes, a.seconds));
        }
        Some(BenchCommand::Virtiofs(a)) => {
            let report = crate::virtiofs::run(&a).map_err(BenchError::Virtiofs)?;
            if a.json {
                let json =
                    serde_json::to_string(&report).map_err(|e| BenchError::Virtiofs(e.into()))?;
                println!("{json}");
            } else {
                print!("{report}");
            }
        }
        Some(BenchCommand::Reactor(a)) => {
            let report = crate::reactor::run(&a.dir, a.file_size, a.seconds, a.threads)
                .map_err(BenchError::Reactor)?;
            print!("{report}");
        }
        None => run_fs(&args.fs)?,
    }
    Ok(())
}

fn run_fs(args: &FsBenchArgs) -> Result<(), FsBenchError> {
    let report = fsbench::run(args)?;
    print!("{}", fsbench::format_table(args, &report));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn a_path_or_a_subcommand() {
        let cli = Cli::try_parse_from(["bench", "/mnt/x", "-p", "4"]).unwrap();
        assert!(cli.bench.command.is_none());
        assert_eq!(
            cli.bench.fs.path.as_deref(),
            Some(std::path::Path::new("/mnt/x"))
        );
        assert_eq!(cli.bench.fs.threads, 4);

        let cli = Cli::try_parse_from([
            "bench",
            "mlperf",
            "run",
            "--workload",
            "unet3d",
            "--data-dir",
            "/d",
            "--accelerators",
            "3",
        ])
        .unwrap();
        assert!(matches!(cli.bench.command, Some(BenchCommand::Mlperf(_))));

        let cli = Cli::try_parse_from(["bench", "fs", "mlperf"]).unwrap();
        match cli.bench.command {
            Some(BenchCommand::Fs(a)) => {
                assert_eq!(a.path.as_deref(), Some(std::path::Path::new("mlperf")))
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["bench"]).is_err());
        assert!(Cli::try_parse_from(["bench", "mlperf", "run", "--workload", "unet3d"]).is_err());
    }

    #[test]
    fn mlperf_runs_through_the_engine_in_process() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite3://{}", dir.path().join("meta.db").display());
        sluice_engine::volume::format_volume_url(
            &url,
            "bench",
            &dir.path().join("bucket"),
            4096,
            sluice_engine::format::Compression::None,
            0,
        )
        .unwrap();
        let out = dir.path().join("out");
        let workload = [
            "--workload",
            "resnet50",
            "--files",
            "6",
            "--samples-per-file",
            "40",
            "--sample-size",
            "2K",
            "--sample-stdev",
            "512",
            "--batch-size",
            "10",
            "--compute-time",
            "0.001",
            "--epochs",
            "2",
        ];
        let datagen = [
            "bench",
            "mlperf",
            "datagen",
            "--engine",
            &url,
            "--no-progress",
        ];
        let cli = Cli::try_parse_from(datagen.iter().chain(&workload)).unwrap();
        run(cli.bench).unwrap();
        let out_dir = out.to_str().unwrap();
        let train = [
            "bench",
            "mlperf",
            "run",
            "--engine",
            &url,
            "--accelerators",
            "2",
            "--read-size",
            "4K",
            "--no-progress",
            "--output-dir",
            out_dir,
        ];
        let cli = Cli::try_parse_from(train.iter().chain(&workload)).unwrap();
        run(cli.bench).unwrap();
        let json = std::fs::read_to_string(out.join("mlperf-resnet50-h100-2.json")).unwrap();
        let report: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(report["accelerators"], 2);
        assert_eq!(report["epochs"].as_array().unwrap().len(), 2);
        let au = report["au_percent"].as_f64().unwrap();
        assert!(au > 0.0 && au <= 100.0, "{report}");
        // The data set really lives in the volume: no mount, nothing in the temp dir but
        // the metadata, the bucket and the results.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with("meta.db"))
            .collect();
        names.sort();
        assert_eq!(names, ["bucket", "out"]);
    }
}
