//! N emulated accelerators training over a data set, each with its own data loader.
//!
//! Per epoch the file list is shuffled (if the workload shuffles files) with a seed derived
//! from the run's seed and the epoch, split into equal contiguous shards, one per rank
//! (remainders dropped, as DLIO drops them), and cut to the files the rank's steps need.
//! Each rank runs `read_threads` readers that take the shard's files in turn and read every
//! sample in full (records in shuffled order inside multi-sample files when the workload
//! shuffles samples), pushing each finished sample into a bounded prefetch queue of
//! `prefetch_batches × batch` samples. The rank's training loop takes a batch from the queue
//! (the data wait), sleeps the compute time, then waits at a barrier with every other rank.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use super::MlperfError;
use super::metrics::{self, RankEpoch, StepTiming};
use super::record::{self, RecordOrder};
use super::source::DataSource;
use super::workload::Workload;
use crate::page_cache;

/// How to run the emulation, beyond the workload itself.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Emulated accelerators (ranks).
    pub accelerators: usize,
    /// Bytes per read call.
    pub read_size: usize,
    /// Drop the page cache before every epoch (root only).
    pub drop_caches: bool,
    /// Show a progress bar.
    pub show_progress: bool,
}

/// One epoch's results.
#[derive(Debug, Clone, Serialize)]
pub struct EpochReport {
    /// Epoch number, from 1.
    pub epoch: u32,
    /// AU in percent (mean over ranks).
    pub au_percent: f64,
    /// Samples per second, summed over ranks.
    pub samples_per_second: f64,
    /// DLIO's figure: samples/s × nominal sample size, in MiB/s.
    pub mib_per_second: f64,
    /// Payload bytes actually delivered to the steps ÷ epoch wall time, in MiB/s.
    pub measured_mib_per_second: f64,
    /// Wall time of the epoch (slowest rank), in seconds.
    pub wall_seconds: f64,
}

/// A whole run's results.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The workload as run.
    pub workload: Workload,
    /// Emulated accelerators.
    pub accelerators: usize,
    /// Where the data came from.
    pub source: String,
    /// Steps per epoch per rank.
    pub steps_per_epoch: u64,
    /// Per-epoch results.
    pub epochs: Vec<EpochReport>,
    /// The run's AU in percent (mean over epochs).
    pub au_percent: f64,
    /// Samples/s (mean over epochs).
    pub samples_per_second: f64,
    /// DLIO's MiB/s (mean over epochs).
    pub mib_per_second: f64,
    /// Measured MiB/s (mean over epochs).
    pub measured_mib_per_second: f64,
    /// Whether the AU reaches the workload's threshold.
    pub pass: bool,
    /// Data-wait time of every step in milliseconds (mean over ranks), epochs concatenated.
    pub step_wait_ms: Vec<f64>,
    /// Reasons the result may not measure what it claims to.
    pub warnings: Vec<String>,
}

/// A barrier that a failing rank can break, so the others do not wait forever.
#[derive(Debug)]
struct StepBarrier {
    parties: usize,
    state: Mutex<BarrierState>,
    released: Condvar,
}

#[derive(Debug, Default)]
struct BarrierState {
    arrived: usize,
    generation: u64,
    broken: bool,
}

/// The barrier was broken by a failing rank.
#[derive(Debug)]
struct Broken;

impl StepBarrier {
    fn new(parties: usize) -> StepBarrier {
        StepBarrier {
            parties,
            state: Mutex::new(BarrierState::default()),
            released: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BarrierState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait(&self) -> Result<(), Broken> {
        let mut state = self.lock();
        if state.broken {
            return Err(Broken);
        }
        state.arrived += 1;
        if state.arrived == self.parties {
            state.arrived = 0;
            state.generation += 1;
            self.released.notify_all();
            return Ok(());
        }
        let generation = state.generation;
        while state.generation == generation && !state.broken {
            state = self
                .released
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if state.generation == generation {
            Err(Broken)
        } else {
            Ok(())
        }
    }

    fn break_it(&self) {
        self.lock().broken = true;
        self.released.notify_all();
    }
}

enum RankFailure {
    Error(MlperfError),
    Broken,
}

struct RankOutcome {
    epoch: RankEpoch,
    payload_bytes: u64,
}

/// Warnings about a run whose data set is too small to measure storage.
pub fn dataset_warnings(
    workload: &Workload,
    accelerators: usize,
    drop_caches: bool,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let spec = &workload.dataset;
    if let Some(ram) = page_cache::total_memory_bytes()
        && spec.nominal_bytes() < ram.saturating_mul(5)
    {
        let remedy = if drop_caches {
            "--drop-caches empties it between epochs, but reads within an epoch may still hit it"
        } else {
            "use a data set of at least 5 × RAM or --drop-caches (root)"
        };
        warnings.push(format!(
            "the data set ({}) is smaller than 5 × RAM ({}): the page cache can hold it, so the result measures memory, not storage; {remedy}",
            sluice_engine::size::format_size(spec.nominal_bytes()),
            sluice_engine::size::format_size(ram.saturating_mul(5)),
        ));
    }
    let rule = 500 * accelerators as u64 * workload.batch_size / spec.samples_per_file.max(1);
    if spec.files < rule {
        warnings.push(format!(
            "MLPerf Storage asks for at least 500 × accelerators × batch ÷ samples per file = {rule} files; this data set has {}",
            spec.files
        ));
    }
    warnings
}

/// Runs the emulation and computes its metrics.
pub fn run(
    source: &dyn DataSource,
    workload: &Workload,
    options: &RunOptions,
) -> Result<RunReport, MlperfError> {
    workload.validate()?;
    let n = options.accelerators;
    if n == 0 {
        return Err(MlperfError::InvalidParameter(
            "emulate at least 1 accelerator".into(),
        ));
    }
    if options.read_size < 64 {
        return Err(MlperfError::InvalidParameter(
            "the read size must be at least 64 bytes".into(),
        ));
    }
    let spec = &workload.dataset;
    let steps = workload.steps_per_epoch(n);
    if steps < 2 {
        return Err(MlperfError::DatasetTooSmall {
            files: spec.files,
            samples_per_file: spec.samples_per_file,
            accelerators: n,
            batch: workload.batch_size,
        });
    }
    let files_per_rank = (spec.files / n as u64) as usize;
    let files_needed = (steps * workload.batch_size).div_ceil(spec.samples_per_file) as usize;
    debug_assert!(files_needed <= files_per_rank);

    let bar = if options.show_progress {
        let bar = ProgressBar::new(steps * u64::from(workload.epochs));
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] step {pos}/{len} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };

    let mut epochs = Vec::new();
    let mut step_wait_ms = Vec::new();
    for epoch in 0..workload.epochs {
        if options.drop_caches {
            page_cache::drop_caches().map_err(MlperfError::DropCaches)?;
        }
        bar.set_message(format!(
            "{n} × {} epoch {}/{}",
            workload.dataset.workload,
            epoch + 1,
            workload.epochs
        ));
        let mut order: Vec<u64> = (0..spec.files).collect();
        if workload.file_shuffle {
            order.shuffle(&mut StdRng::seed_from_u64(epoch_seed(
                workload.seed,
                epoch,
                0,
            )));
        }
        let barrier = StepBarrier::new(n);
        let origin = Instant::now();
        let outcomes: Vec<Result<RankOutcome, RankFailure>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let shard = &order[rank * files_per_rank..rank * files_per_rank + files_needed];
                    let (barrier, bar) = (&barrier, &bar);
                    scope.spawn(move || {
                        let result = run_rank(
                            source,
                            workload,
                            options,
                            RankContext {
                                rank,
                                epoch,
                                steps,
                                shard,
                                barrier,
                                origin,
                                bar,
                            },
                        );
                        if result.is_err() {
                            barrier.break_it();
                        }
                        result
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(RankFailure::Broken)))
                .collect()
        });
        let mut ranks = Vec::with_capacity(n);
        let mut payload = 0u64;
        let mut first_error = None;
        for outcome in outcomes {
            match outcome {
                Ok(o) => {
                    payload += o.payload_bytes;
                    ranks.push(o.epoch);
                }
                Err(RankFailure::Error(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(RankFailure::Broken) => {}
            }
        }
        if let Some(e) = first_error {
            bar.abandon();
            return Err(e);
        }
        if ranks.len() != n {
            bar.abandon();
            return Err(MlperfError::InvalidParameter(
                "an accelerator thread stopped without a result".into(),
            ));
        }
        let m = metrics::epoch_metrics(&ranks, workload.batch_size);
        let start = ranks.iter().map(|r| r.start).fold(f64::INFINITY, f64::min);
        let end = ranks.iter().map(|r| r.end).fold(0.0, f64::max);
        let wall = (end - start).max(f64::MIN_POSITIVE);
        for step in 0..steps as usize {
            let wait: f64 = ranks.iter().map(|r| r.steps[step].load).sum::<f64>() / n as f64;
            step_wait_ms.push(wait * 1e3);
        }
        epochs.push((
            m,
            EpochReport {
                epoch: epoch + 1,
                au_percent: m.au * 100.0,
                samples_per_second: m.throughput,
                mib_per_second: metrics::nominal_mib_per_second(m.throughput, spec.sample_size),
                measured_mib_per_second: payload as f64 / wall / (1u64 << 20) as f64,
                wall_seconds: wall,
            },
        ));
    }
    bar.finish_and_clear();
    let per_epoch: Vec<_> = epochs.iter().map(|(m, _)| *m).collect();
    let total = metrics::run_metrics(&per_epoch);
    let epochs: Vec<EpochReport> = epochs.into_iter().map(|(_, e)| e).collect();
    let measured = epochs
        .iter()
        .map(|e| e.measured_mib_per_second)
        .sum::<f64>()
        / epochs.len() as f64;
    Ok(RunReport {
        workload: workload.clone(),
        accelerators: n,
        source: source.describe(),
        steps_per_epoch: steps,
        au_percent: total.au * 100.0,
        samples_per_second: total.throughput,
        mib_per_second: metrics::nominal_mib_per_second(total.throughput, spec.sample_size),
        measured_mib_per_second: measured,
        pass: total.au >= workload.threshold,
        epochs,
        step_wait_ms,
        warnings: dataset_warnings(workload, n, options.drop_caches),
    })
}

fn epoch_seed(seed: u64, epoch: u32, salt: u64) -> u64 {
    seed.wrapping_mul(0x100_0000_01b3)
        .wrapping_add(u64::from(epoch).wrapping_mul(0x9e37_79b9))
        .wrapping_add(salt)
}

struct RankContext<'a> {
    rank: usize,
    epoch: u32,
    steps: u64,
    shard: &'a [u64],
    barrier: &'a StepBarrier,
    origin: Instant,
    bar: &'a ProgressBar,
}

fn run_rank(
    source: &dyn DataSource,
    workload: &Workload,
    options: &RunOptions,
    ctx: RankContext<'_>,
) -> Result<RankOutcome, RankFailure> {
    let spec = &workload.dataset;
    let capacity = workload.prefetch_batches * workload.batch_size as usize;
    let (tx, rx) = bounded::<Result<u64, MlperfError>>(capacity);
    let next = AtomicUsize::new(0);
    let compute = workload.compute_time();
    std::thread::scope(|scope| {
        for thread in 0..workload.read_threads {
            let tx = tx.clone();
            let next = &next;
            scope.spawn(move || {
                let mut scratch = vec![0u8; options.read_size];
                let salt = ((ctx.rank as u64) << 16) | thread as u64;
                let mut rng = StdRng::seed_from_u64(epoch_seed(workload.seed, ctx.epoch, salt + 1));
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&file) = ctx.shard.get(i) else { break };
                    let rel = PathBuf::from(spec.file_name(file));
                    let order = if workload.sample_shuffle && spec.samples_per_file > 1 {
                        RecordOrder::Shuffled(&mut rng)
                    } else {
                        RecordOrder::Sequential
                    };
                    let result = source.open(&rel).and_then(|mut f| {
                        record::read_samples(
                            f.as_mut(),
                            &source.display_path(&rel),
                            spec.format,
                            order,
                            &mut scratch,
                            false,
                            &mut |len| tx.send(Ok(len)).is_ok(),
                        )
                    });
                    if let Err(e) = result {
                        let _ = tx.send(Err(e));
                        break;
                    }
                }
            });
        }
        drop(tx);
        let result = train(workload, &ctx, compute, &rx, source);
        // Dropping the queue makes the readers stop after their current sample.
        drop(rx);
        result
    })
}

fn train(
    workload: &Workload,
    ctx: &RankContext<'_>,
    compute: Duration,
    rx: &crossbeam_channel::Receiver<Result<u64, MlperfError>>,
    source: &dyn DataSource,
) -> Result<RankOutcome, RankFailure> {
    ctx.barrier.wait().map_err(|Broken| RankFailure::Broken)?;
    let start = ctx.origin.elapsed().as_secs_f64();
    let mut steps = Vec::with_capacity(ctx.steps as usize);
    let mut payload_bytes = 0u64;
    for _ in 0..ctx.steps {
        let t0 = Instant::now();
        for _ in 0..workload.batch_size {
            match rx.recv() {
                Ok(Ok(len)) => payload_bytes += len,
                Ok(Err(e)) => return Err(RankFailure::Error(e)),
                Err(_) => {
                    return Err(RankFailure::Error(MlperfError::CorruptFile {
                        path: source.display_path(Path::new("train")),
                        offset: 0,
                        reason: "the files hold fewer samples than the data set's manifest says"
                            .into(),
                    }));
                }
            }
        }
        let loaded = Instant::now();
        if !compute.is_zero() {
            std::thread::sleep(compute);
        }
        let done = Instant::now();
        steps.push(StepTiming {
            load: (loaded - t0).as_secs_f64(),
            compute: (done - loaded).as_secs_f64(),
        });
        ctx.barrier.wait().map_err(|Broken| RankFailure::Broken)?;
        if ctx.rank == 0 {
            ctx.bar.inc(1);
        }
    }
    let end = ctx.origin.elapsed().as_secs_f64();
    Ok(RankOutcome {
        epoch: RankEpoch { start, end, steps },
        payload_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlperf::datagen;
    use crate::mlperf::source::DirSource;
    use crate::mlperf::workload::{Accelerator, WorkloadKind};

    fn tiny(kind: WorkloadKind, files: u64, spf: u64, size: u64, batch: u64) -> Workload {
        let mut w = Workload::preset(kind, Accelerator::H100).unwrap();
        w.dataset.files = files;
        w.dataset.samples_per_file = spf;
        w.dataset.sample_size = size;
        w.dataset.sample_stdev = size / 4;
        w.batch_size = batch;
        w.compute_time_s = 0.002;
        w.epochs = 2;
        w
    }

    #[test]
    fn a_short_run_on_a_local_directory_reports_a_sane_au() {
        for (w, accelerators) in [
            (tiny(WorkloadKind::Unet3d, 24, 1, 20_000, 2), 3),
            (tiny(WorkloadKind::Resnet50, 8, 50, 1_000, 20), 2),
            (tiny(WorkloadKind::Cosmoflow, 16, 1, 5_000, 1), 4),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let source = DirSource::new(dir.path()).unwrap();
            datagen::generate(&source, &w.dataset, 2, false).unwrap();
            let options = RunOptions {
                accelerators,
                read_size: 4096,
                drop_caches: false,
                show_progress: false,
            };
            let report = run(&source, &w, &options).unwrap();
            assert_eq!(report.epochs.len(), 2);
            assert!(
                report.au_percent > 0.0 && report.au_percent <= 100.0,
                "{report:?}"
            );
            assert!(report.samples_per_second > 0.0);
            assert_eq!(report.step_wait_ms.len() as u64, 2 * report.steps_per_epoch);
            assert_eq!(report.steps_per_epoch, w.steps_per_epoch(accelerators));
            assert_eq!(report.pass, report.au_percent >= w.threshold * 100.0);
        }
    }

    #[test]
    fn shuffled_records_are_all_read() {
        let mut w = tiny(WorkloadKind::Resnet50, 4, 30, 700, 10);
        w.sample_shuffle = true;
        w.file_shuffle = true;
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        datagen::generate(&source, &w.dataset, 1, false).unwrap();
        let options = RunOptions {
            accelerators: 2,
            read_size: 256,
            drop_caches: false,
            show_progress: false,
        };
        let report = run(&source, &w, &options).unwrap();
        assert_eq!(report.steps_per_epoch, 6);
    }

    #[test]
    fn a_missing_file_fails_the_run_without_hanging() {
        let w = tiny(WorkloadKind::Unet3d, 12, 1, 3_000, 2);
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        datagen::generate(&source, &w.dataset, 1, false).unwrap();
        std::fs::remove_file(dir.path().join(w.dataset.file_name(7))).unwrap();
        let options = RunOptions {
            accelerators: 3,
            read_size: 4096,
            drop_caches: false,
            show_progress: false,
        };
        let err = run(&source, &w, &options).unwrap_err();
        assert!(err.to_string().contains("cannot open"), "{err}");
    }

    #[test]
    fn too_many_accelerators_is_a_clear_error() {
        let w = tiny(WorkloadKind::Unet3d, 12, 1, 3_000, 2);
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        let options = RunOptions {
            accelerators: 4,
            read_size: 4096,
            drop_caches: false,
            show_progress: false,
        };
        let err = run(&source, &w, &options).unwrap_err();
        assert!(
            err.to_string().contains("too few for 4 accelerators"),
            "{err}"
        );
    }

    #[test]
    fn a_broken_barrier_releases_waiters() {
        let barrier = StepBarrier::new(2);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| barrier.wait());
            std::thread::sleep(Duration::from_millis(20));
            barrier.break_it();
            assert!(waiter.join().unwrap().is_err());
        });
        let barrier = StepBarrier::new(2);
        std::thread::scope(|s| {
            let a = s.spawn(|| barrier.wait());
            assert!(barrier.wait().is_ok());
            assert!(a.join().unwrap().is_ok());
        });
    }
}
