//! MLPerf Storage training emulation, measured the way DLIO v2.0 measures it.
//!
//! `workload` holds the published UNet3D / ResNet-50 / CosmoFlow parameters, `record` the
//! npz-like and tfrecord-like file formats, `datagen` writes a data set, `loader` runs N
//! emulated accelerators over it, `metrics` turns step timings into accelerator
//! utilisation (AU) and throughput, `checkpoint` times fsync'd checkpoint saves and loads,
//! `plot` draws the SVG reports and `cli` is the `sluice bench mlperf` command line.
//! Everything reads and writes through a [`source::DataSource`], so the same emulation runs
//! over a directory (any mount) or the sluice engine in-process.

use std::io;
use std::path::PathBuf;

pub mod checkpoint;
pub mod cli;
pub mod datagen;
pub mod engine_source;
pub mod find_max;
pub mod loader;
pub mod metrics;
pub mod plot;
pub mod record;
pub mod source;
pub mod workload;

/// Everything that can go wrong in the MLPerf emulation.
#[derive(Debug, thiserror::Error)]
pub enum MlperfError {
    /// A file-system call failed.
    #[error("cannot {action} {path}")]
    Io {
        /// What was being done ("open", "read", "fsync", ...).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A parameter on the command line or in a workload makes no sense.
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    /// The accelerator has no published profile for this workload.
    #[error("the {workload} workload has no {accelerator} profile; use one of: {available}")]
    UnknownProfile {
        /// Workload name.
        workload: String,
        /// Accelerator name asked for.
        accelerator: String,
        /// The accelerators that do have a profile.
        available: String,
    },
    /// The directory already holds another data set.
    #[error(
        "{dir} already holds a different data set ({found}); use another --data-dir or delete it first"
    )]
    DatasetMismatch {
        /// Data directory.
        dir: String,
        /// What is there.
        found: String,
    },
    /// The data set on disk is not the one the run asks for.
    #[error(
        "{dir} holds a data set that does not match this run: {reason}; generate a matching one with `sluice bench mlperf datagen` or point --data-dir at one"
    )]
    DatasetDoesNotMatch {
        /// Data directory.
        dir: String,
        /// What differs.
        reason: String,
    },
    /// No complete data set in the directory.
    #[error(
        "{dir} holds no complete data set; run `sluice bench mlperf datagen` with the same --workload first"
    )]
    DatasetMissing {
        /// Data directory.
        dir: String,
    },
    /// The data set is too small for the number of accelerators asked for.
    #[error(
        "the data set has {files} files of {samples_per_file} samples, too few for {accelerators} accelerators at batch size {batch}: each accelerator needs at least 2 steps per epoch; generate more files or use fewer accelerators"
    )]
    DatasetTooSmall {
        /// Files in the data set.
        files: u64,
        /// Samples per file.
        samples_per_file: u64,
        /// Accelerators asked for.
        accelerators: usize,
        /// Batch size.
        batch: u64,
    },
    /// A data file is not in the format its name says.
    #[error("{path} is corrupt at byte {offset}: {reason}")]
    CorruptFile {
        /// The file.
        path: PathBuf,
        /// Where the problem was found.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// `--engine`: the volume could not be opened in-process.
    #[error("cannot serve the volume of {url} in-process")]
    Engine {
        /// The metadata URL.
        url: String,
        /// The engine's error.
        #[source]
        source: sluice_engine::Error,
    },
    /// `--drop-caches` failed.
    #[error("cannot drop the page cache (this needs root)")]
    DropCaches(#[source] io::Error),
    /// A manifest or result file could not be (de)serialised.
    #[error("cannot read or write JSON in {path}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
}

impl MlperfError {
    /// Wraps an I/O error with what was being done and to which path.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        MlperfError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
