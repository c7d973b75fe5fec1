//! The MLPerf Storage training workloads and their published parameters
//! (MLCommons `storage` v1.0/v2.0 workload configs; see `reference/mlperf-storage.md`).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::MlperfError;

/// A training workload of MLPerf Storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// 3D U-Net image segmentation: one large npz sample per file.
    Unet3d,
    /// ResNet-50 image classification: many small samples per tfrecord file.
    Resnet50,
    /// CosmoFlow: one medium sample per tfrecord file, tiny compute time.
    Cosmoflow,
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkloadKind::Unet3d => "unet3d",
            WorkloadKind::Resnet50 => "resnet50",
            WorkloadKind::Cosmoflow => "cosmoflow",
        })
    }
}

/// The accelerator whose compute time per step is emulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Accelerator {
    /// NVIDIA A100.
    A100,
    /// NVIDIA H100.
    H100,
    /// NVIDIA B200 (published for unet3d only).
    B200,
}

impl fmt::Display for Accelerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Accelerator::A100 => "a100",
            Accelerator::H100 => "h100",
            Accelerator::B200 => "b200",
        })
    }
}

/// How samples are laid out in files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    /// One sample per file, a NumPy array (`.npz` name, npy layout).
    Npz,
    /// Length-framed records with masked CRC32C, as TFRecord writes them.
    Tfrecord,
}

impl FileFormat {
    /// The file name extension DLIO uses.
    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::Npz => "npz",
            FileFormat::Tfrecord => "tfrecord",
        }
    }
}

/// The shape of a data set: what `datagen` writes and what the loader reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetSpec {
    /// The workload the data set belongs to.
    pub workload: WorkloadKind,
    /// File layout.
    pub format: FileFormat,
    /// Number of training files.
    pub files: u64,
    /// Samples in each file.
    pub samples_per_file: u64,
    /// Mean sample size in bytes (DLIO's `record_length`).
    pub sample_size: u64,
    /// Standard deviation of the sample size in bytes (0: every sample has the mean size).
    pub sample_stdev: u64,
    /// Seed of the size distribution and the file contents.
    pub seed: u64,
}

/// The smallest sample the size distribution produces.
const MIN_SAMPLE_SIZE: u64 = 1;

impl DatasetSpec {
    /// Relative path of file `index` (0-based): `train/img_0001_of_0168.npz`, as DLIO names them.
    pub fn file_name(&self, index: u64) -> String {
        let width = self.files.to_string().len();
        format!(
            "train/img_{:0width$}_of_{}.{}",
            index + 1,
            self.files,
            self.format.extension()
        )
    }

    /// The sizes of the samples of file `index`: a normal distribution with the spec's mean
    /// and standard deviation, redrawn below 1 byte, deterministic in (seed, index).
    pub fn sample_sizes(&self, index: u64) -> Vec<u64> {
        let mut rng = StdRng::seed_from_u64(
            self.seed ^ index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        (0..self.samples_per_file)
            .map(|_| self.draw_size(&mut rng))
            .collect()
    }

    fn draw_size(&self, rng: &mut StdRng) -> u64 {
        if self.sample_stdev == 0 {
            return self.sample_size.max(MIN_SAMPLE_SIZE);
        }
        for _ in 0..64 {
            // Box-Muller: two uniforms in (0, 1] give one standard normal variate.
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random::<f64>();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            let size = self.sample_size as f64 + z * self.sample_stdev as f64;
            if size >= MIN_SAMPLE_SIZE as f64 {
                return size.round() as u64;
            }
        }
        self.sample_size.max(MIN_SAMPLE_SIZE)
    }

    /// Total number of samples.
    pub fn total_samples(&self) -> u64 {
        self.files.saturating_mul(self.samples_per_file)
    }

    /// Nominal size of the whole data set (files × samples × mean sample size).
    pub fn nominal_bytes(&self) -> u64 {
        self.total_samples().saturating_mul(self.sample_size)
    }

    /// Checks that the spec can be generated.
    pub fn validate(&self) -> Result<(), MlperfError> {
        if self.files == 0 {
            return Err(MlperfError::InvalidParameter(
                "the data set needs at least 1 file".into(),
            ));
        }
        if self.samples_per_file == 0 {
            return Err(MlperfError::InvalidParameter(
                "samples per file must be at least 1".into(),
            ));
        }
        if self.format == FileFormat::Npz && self.samples_per_file != 1 {
            return Err(MlperfError::InvalidParameter(
                "npz files hold exactly 1 sample".into(),
            ));
        }
        if self.sample_size == 0 {
            return Err(MlperfError::InvalidParameter(
                "the sample size must be at least 1 byte".into(),
            ));
        }
        Ok(())
    }
}

/// A complete emulation setup: the data set plus the training loop around it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// The data set.
    pub dataset: DatasetSpec,
    /// The accelerator profile the compute time came from.
    pub accelerator: Accelerator,
    /// Samples per step per accelerator.
    pub batch_size: u64,
    /// Reader threads per accelerator.
    pub read_threads: usize,
    /// Batches each accelerator's loader may hold ready ahead of the step that needs them.
    pub prefetch_batches: usize,
    /// Emulated compute time of one step, in seconds.
    pub compute_time_s: f64,
    /// Epochs to run.
    pub epochs: u32,
    /// The AU an accelerator must keep to pass, as a fraction (0.9 = 90 %).
    pub threshold: f64,
    /// Shuffle the order of files every epoch.
    pub file_shuffle: bool,
    /// Shuffle the order of samples inside multi-sample files every epoch.
    pub sample_shuffle: bool,
    /// Seed of all shuffling.
    pub seed: u64,
}

/// Seed the MLPerf configs use (`seed: 123`, DLIO's default).
pub const DEFAULT_SEED: u64 = 123;

impl Workload {
    /// The published parameters of `kind` on `accelerator`.
    pub fn preset(kind: WorkloadKind, accelerator: Accelerator) -> Result<Workload, MlperfError> {
        let unknown = |available: &str| MlperfError::UnknownProfile {
            workload: kind.to_string(),
            accelerator: accelerator.to_string(),
            available: available.to_string(),
        };
        let workload = match kind {
            WorkloadKind::Unet3d => Workload {
                dataset: DatasetSpec {
                    workload: kind,
                    format: FileFormat::Npz,
                    files: 168,
                    samples_per_file: 1,
                    sample_size: 146_600_628,
                    sample_stdev: 68_341_808,
                    seed: DEFAULT_SEED,
                },
                accelerator,
                batch_size: 7,
                read_threads: 4,
                prefetch_batches: 2,
                compute_time_s: match accelerator {
                    Accelerator::A100 => 0.636,
                    Accelerator::H100 => 0.323,
                    Accelerator::B200 => 0.162,
                },
                epochs: 5,
                threshold: 0.9,
                file_shuffle: true,
                sample_shuffle: true,
                seed: DEFAULT_SEED,
            },
            WorkloadKind::Resnet50 => Workload {
                dataset: DatasetSpec {
                    workload: kind,
                    format: FileFormat::Tfrecord,
                    files: 1024,
                    samples_per_file: 1251,
                    sample_size: 114_660,
                    sample_stdev: 0,
                    seed: DEFAULT_SEED,
                },
                accelerator,
                batch_size: 400,
                read_threads: 8,
                prefetch_batches: 2,
                compute_time_s: match accelerator {
                    Accelerator::A100 => 0.435,
                    Accelerator::H100 => 0.224,
                    Accelerator::B200 => return Err(unknown("a100, h100")),
                },
                epochs: 5,
                threshold: 0.9,
                file_shuffle: false,
                sample_shuffle: false,
                seed: DEFAULT_SEED,
            },
            WorkloadKind::Cosmoflow => Workload {
                dataset: DatasetSpec {
                    workload: kind,
                    format: FileFormat::Tfrecord,
                    files: 524_288,
                    samples_per_file: 1,
                    sample_size: 2_828_486,
                    sample_stdev: 71_311,
                    seed: DEFAULT_SEED,
                },
                accelerator,
                batch_size: 1,
                read_threads: 4,
                prefetch_batches: 2,
                compute_time_s: match accelerator {
                    Accelerator::A100 => 0.00551,
                    Accelerator::H100 => 0.00350,
                    Accelerator::B200 => return Err(unknown("a100, h100")),
                },
                epochs: 5,
                threshold: 0.7,
                file_shuffle: true,
                sample_shuffle: true,
                seed: DEFAULT_SEED,
            },
        };
        Ok(workload)
    }

    /// The emulated compute time of one step.
    pub fn compute_time(&self) -> Duration {
        Duration::from_secs_f64(self.compute_time_s)
    }

    /// Bytes per second one accelerator consumes at 100 % AU (batch × sample ÷ compute time).
    pub fn bytes_per_second_per_accelerator(&self) -> f64 {
        if self.compute_time_s <= 0.0 {
            return f64::INFINITY;
        }
        (self.batch_size * self.dataset.sample_size) as f64 / self.compute_time_s
    }

    /// Steps per epoch for each of `accelerators` ranks: the files are split evenly over the
    /// ranks (remainder dropped) and the last partial batch is dropped, as DLIO does.
    pub fn steps_per_epoch(&self, accelerators: usize) -> u64 {
        if accelerators == 0 || self.batch_size == 0 {
            return 0;
        }
        let files_per_rank = self.dataset.files / accelerators as u64;
        files_per_rank * self.dataset.samples_per_file / self.batch_size
    }

    /// Checks the training-loop parameters.
    pub fn validate(&self) -> Result<(), MlperfError> {
        self.dataset.validate()?;
        if self.batch_size == 0 {
            return Err(MlperfError::InvalidParameter(
                "the batch size must be at least 1".into(),
            ));
        }
        if self.read_threads == 0 {
            return Err(MlperfError::InvalidParameter(
                "each accelerator needs at least 1 read thread".into(),
            ));
        }
        if self.prefetch_batches == 0 {
            return Err(MlperfError::InvalidParameter(
                "the prefetch queue must hold at least 1 batch".into(),
            ));
        }
        if !(self.compute_time_s >= 0.0 && self.compute_time_s.is_finite()) {
            return Err(MlperfError::InvalidParameter(
                "the compute time must be a non-negative number of seconds".into(),
            ));
        }
        if self.epochs == 0 {
            return Err(MlperfError::InvalidParameter("run at least 1 epoch".into()));
        }
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(MlperfError::InvalidParameter(
                "the AU threshold must be between 0 and 100 %".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_match_the_published_bandwidth_per_accelerator() {
        let unet = Workload::preset(WorkloadKind::Unet3d, Accelerator::H100).unwrap();
        let gbs = unet.bytes_per_second_per_accelerator() / 1e9;
        assert!((gbs - 3.18).abs() < 0.01, "{gbs}");
        let resnet = Workload::preset(WorkloadKind::Resnet50, Accelerator::H100).unwrap();
        let mbs = resnet.bytes_per_second_per_accelerator() / 1e6;
        assert!((mbs - 205.0).abs() < 1.0, "{mbs}");
        let cosmo = Workload::preset(WorkloadKind::Cosmoflow, Accelerator::H100).unwrap();
        let mbs = cosmo.bytes_per_second_per_accelerator() / 1e6;
        assert!((mbs - 808.0).abs() < 1.0, "{mbs}");
        assert_eq!(cosmo.threshold, 0.7);
    }

    #[test]
    fn b200_exists_for_unet3d_only() {
        assert!(Workload::preset(WorkloadKind::Unet3d, Accelerator::B200).is_ok());
        let err = Workload::preset(WorkloadKind::Resnet50, Accelerator::B200).unwrap_err();
        assert!(err.to_string().contains("no b200 profile"), "{err}");
    }

    #[test]
    fn sample_sizes_follow_the_distribution() {
        // The unet3d shape: a wide distribution, redrawn below 1 byte.
        let spec = DatasetSpec {
            workload: WorkloadKind::Unet3d,
            format: FileFormat::Npz,
            files: 4_000,
            samples_per_file: 1,
            sample_size: 146_600_628,
            sample_stdev: 68_341_808,
            seed: 7,
        };
        let sizes: Vec<f64> = (0..spec.files)
            .map(|i| spec.sample_sizes(i)[0] as f64)
            .collect();
        let n = sizes.len() as f64;
        let mean = sizes.iter().sum::<f64>() / n;
        let stdev = (sizes.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(
            (mean / spec.sample_size as f64 - 1.0).abs() < 0.05,
            "mean {mean}"
        );
        assert!(
            (stdev / spec.sample_stdev as f64 - 1.0).abs() < 0.08,
            "stdev {stdev}"
        );
        assert!(sizes.iter().all(|&s| s >= 1.0));
        // Deterministic in (seed, index).
        assert_eq!(spec.sample_sizes(5), spec.sample_sizes(5));
    }

    #[test]
    fn steps_drop_remainders() {
        let mut w = Workload::preset(WorkloadKind::Unet3d, Accelerator::H100).unwrap();
        // 168 files / 5 ranks = 33 files each; 33 / 7 = 4 steps.
        assert_eq!(w.steps_per_epoch(5), 4);
        w.dataset.files = 10;
        assert_eq!(w.steps_per_epoch(2), 0);
        assert_eq!(w.steps_per_epoch(0), 0);
    }
}
