//! MLPerf Storage v2.0 checkpointing: write, then read back, N checkpoints of a model split
//! over ranks. Unlike the reference DLIO code, every rank fsyncs its shard before the save
//! counts as done, so the save rate is the storage's and not the page cache's.

use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Instant;

use serde::Serialize;

use super::MlperfError;
use super::record::{FillPattern, WRITE_CHUNK};
use super::source::DataSource;
use crate::page_cache;

/// Directory (under the data source's root) the checkpoints are written in.
pub const CHECKPOINT_DIR: &str = "checkpoints";

/// A published checkpoint size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelPreset {
    /// Llama 3 8B: 105 GB over 8 ranks.
    Llama3_8b,
    /// Llama 3 70B: 912 GB over 64 ranks.
    Llama3_70b,
    /// Llama 3 405B: 5.29 TB over 512 ranks.
    Llama3_405b,
    /// Llama 3 1T: 18 TB over 1024 ranks.
    Llama3_1t,
}

impl ModelPreset {
    /// (total checkpoint bytes, ranks).
    pub fn size_and_ranks(self) -> (u64, usize) {
        match self {
            ModelPreset::Llama3_8b => (105_000_000_000, 8),
            ModelPreset::Llama3_70b => (912_000_000_000, 64),
            ModelPreset::Llama3_405b => (5_290_000_000_000, 512),
            ModelPreset::Llama3_1t => (18_000_000_000_000, 1024),
        }
    }
}

/// What to checkpoint.
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    /// Total bytes of one checkpoint.
    pub size: u64,
    /// Ranks sharing it (one shard file each).
    pub ranks: usize,
    /// Checkpoints to write and then read.
    pub count: usize,
    /// Bytes per write/read call.
    pub io_size: usize,
    /// Drop the page cache between the saves and the loads (root only).
    pub drop_caches: bool,
    /// Keep the checkpoint files afterwards.
    pub keep: bool,
}

/// The time of one checkpoint save or load.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CheckpointTiming {
    /// Checkpoint number, from 1.
    pub index: usize,
    /// Seconds until the slowest rank finished (for saves: its fsync returned).
    pub seconds: f64,
    /// Decimal GB/s.
    pub gb_per_second: f64,
}

/// The result of a checkpoint run.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointReport {
    /// Where the checkpoints went.
    pub source: String,
    /// Bytes per checkpoint.
    pub size: u64,
    /// Ranks.
    pub ranks: usize,
    /// Each save.
    pub saves: Vec<CheckpointTiming>,
    /// Each load.
    pub loads: Vec<CheckpointTiming>,
    /// Total bytes ÷ total save time, GB/s.
    pub save_gb_per_second: f64,
    /// Total bytes ÷ total load time, GB/s.
    pub load_gb_per_second: f64,
    /// Reasons the result may not measure storage.
    pub warnings: Vec<String>,
}

fn shard_len(size: u64, ranks: usize, rank: usize) -> u64 {
    let base = size / ranks as u64;
    if rank + 1 == ranks {
        size - base * (ranks as u64 - 1)
    } else {
        base
    }
}

fn shard_path(index: usize, rank: usize) -> PathBuf {
    PathBuf::from(format!(
        "{CHECKPOINT_DIR}/ckpt_{index:04}/rank_{rank:05}.bin"
    ))
}

/// Runs all ranks of one phase: each calls `work(rank)`; the phase ends when all are done.
fn timed_phase(
    ranks: usize,
    work: impl Fn(usize) -> Result<(), MlperfError> + Sync,
) -> Result<f64, MlperfError> {
    let start_line = Barrier::new(ranks + 1);
    let (started, results) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let (work, start_line) = (&work, &start_line);
                scope.spawn(move || {
                    start_line.wait();
                    work(rank)
                })
            })
            .collect();
        start_line.wait();
        let started = Instant::now();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or(Err(MlperfError::InvalidParameter(
                    "a checkpoint rank thread panicked".into(),
                )))
            })
            .collect();
        (started, results)
    });
    let seconds = started.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    Ok(seconds)
}

/// Saves then loads `options.count` checkpoints.
pub fn run(
    source: &dyn DataSource,
    options: &CheckpointOptions,
) -> Result<CheckpointReport, MlperfError> {
    if options.ranks == 0 || options.count == 0 || options.size < options.ranks as u64 {
        return Err(MlperfError::InvalidParameter(
            "checkpointing needs at least 1 rank, 1 checkpoint and 1 byte per rank".into(),
        ));
    }
    if options.io_size == 0 || options.io_size > WRITE_CHUNK {
        return Err(MlperfError::InvalidParameter(format!(
            "the I/O size must be between 1 byte and {WRITE_CHUNK} bytes"
        )));
    }
    let mut warnings = Vec::new();
    if !options.drop_caches
        && let Some(ram) = page_cache::total_memory_bytes()
        && options.size.saturating_mul(options.count as u64) < ram.saturating_mul(5)
    {
        warnings.push(
            "the checkpoints are smaller than 5 × RAM and --drop-caches is off: loads may come from the page cache".into(),
        );
    }
    let pattern = FillPattern::new(0xc4ec);
    let gb = |seconds: f64| options.size as f64 / seconds.max(f64::MIN_POSITIVE) / 1e9;
    let mut saves = Vec::new();
    for index in 0..options.count {
        source.create_dir_all(&PathBuf::from(format!("{CHECKPOINT_DIR}/ckpt_{index:04}")))?;
        let seconds = timed_phase(options.ranks, |rank| {
            let rel = shard_path(index, rank);
            let len = shard_len(options.size, options.ranks, rank);
            let mut sink = source.create(&rel)?;
            let mut written = 0u64;
            let mut chunk = 0u64;
            while written < len {
                let n = (len - written).min(options.io_size as u64) as usize;
                sink.write_all(pattern.chunk(rank as u64, chunk, n))
                    .map_err(|e| MlperfError::io("write", source.display_path(&rel), e))?;
                written += n as u64;
                chunk += 1;
            }
            sink.sync()
                .map_err(|e| MlperfError::io("fsync", source.display_path(&rel), e))
        })?;
        saves.push(CheckpointTiming {
            index: index + 1,
            seconds,
            gb_per_second: gb(seconds),
        });
    }
    if options.drop_caches {
        page_cache::drop_caches().map_err(MlperfError::DropCaches)?;
    }
    let mut loads = Vec::new();
    for index in 0..options.count {
        let seconds = timed_phase(options.ranks, |rank| {
            let rel = shard_path(index, rank);
            let want = shard_len(options.size, options.ranks, rank);
            let mut file = source.open(&rel)?;
            if file.len() != want {
                return Err(MlperfError::CorruptFile {
                    path: source.display_path(&rel),
                    offset: file.len(),
                    reason: format!("the shard should be {want} bytes long"),
                });
            }
            let mut buf = vec![0u8; options.io_size];
            let mut offset = 0u64;
            while offset < want {
                let n = (want - offset).min(buf.len() as u64) as usize;
                file.read_exact_at(&mut buf[..n], offset)
                    .map_err(|e| MlperfError::io("read", source.display_path(&rel), e))?;
                offset += n as u64;
            }
            Ok(())
        })?;
        loads.push(CheckpointTiming {
            index: index + 1,
            seconds,
            gb_per_second: gb(seconds),
        });
    }
    if !options.keep {
        source.remove_dir_all(&PathBuf::from(CHECKPOINT_DIR))?;
    }
    let total = options.size as f64 * options.count as f64;
    let rate = |t: &[CheckpointTiming]| {
        total
            / t.iter()
                .map(|c| c.seconds)
                .sum::<f64>()
                .max(f64::MIN_POSITIVE)
            / 1e9
    };
    Ok(CheckpointReport {
        source: source.describe(),
        size: options.size,
        ranks: options.ranks,
        save_gb_per_second: rate(&saves),
        load_gb_per_second: rate(&loads),
        saves,
        loads,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlperf::source::DirSource;

    #[test]
    fn saves_and_loads_every_shard() {
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        let options = CheckpointOptions {
            size: 1_000_003,
            ranks: 4,
            count: 2,
            io_size: 65536,
            drop_caches: false,
            keep: true,
        };
        let report = run(&source, &options).unwrap();
        assert_eq!((report.saves.len(), report.loads.len()), (2, 2));
        assert!(report.save_gb_per_second > 0.0 && report.load_gb_per_second > 0.0);
        let mut total = 0;
        for rank in 0..4 {
            total += std::fs::metadata(dir.path().join(shard_path(1, rank)))
                .unwrap()
                .len();
        }
        assert_eq!(total, 1_000_003);
        let options = CheckpointOptions {
            keep: false,
            ..options
        };
        run(&source, &options).unwrap();
        assert!(!dir.path().join(CHECKPOINT_DIR).exists());
    }

    #[test]
    fn presets_split_over_their_ranks() {
        assert_eq!(
            ModelPreset::Llama3_70b.size_and_ranks(),
            (912_000_000_000, 64)
        );
        assert_eq!(shard_len(10, 3, 0), 3);
        assert_eq!(shard_len(10, 3, 2), 4);
    }
}
