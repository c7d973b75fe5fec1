//! Writes an MLPerf Storage data set: the files in DLIO's layout and size distribution,
//! in parallel, with a manifest that records what the directory holds.
//!
//! The manifest (`sluice-mlperf.json` at the data set's root) is written first, marked
//! incomplete, and marked complete at the end. A second `datagen` with the same parameters
//! resumes (files already at their final length are kept); one with different parameters
//! is refused, and so is a directory whose `train/` holds files sluice did not write.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use super::MlperfError;
use super::record::{self, FillPattern};
use super::source::DataSource;
use super::workload::DatasetSpec;

/// Name of the manifest file at the data set's root.
pub const MANIFEST: &str = "sluice-mlperf.json";
/// Directory holding the training files.
pub const TRAIN_DIR: &str = "train";
const MANIFEST_VERSION: u32 = 1;

/// What a data directory holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format version.
    pub version: u32,
    /// The data set's parameters.
    pub dataset: DatasetSpec,
    /// Whether every file has been written.
    pub complete: bool,
}

/// What `generate` did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GenerateReport {
    /// Files written by this call.
    pub files_written: u64,
    /// Files already present at their final length and kept.
    pub files_kept: u64,
    /// Bytes written by this call.
    pub bytes_written: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

fn describe(spec: &DatasetSpec) -> String {
    format!(
        "{} with {} files of {} × {} B samples, stdev {}, seed {}",
        spec.workload,
        spec.files,
        spec.samples_per_file,
        spec.sample_size,
        spec.sample_stdev,
        spec.seed
    )
}

/// Reads the manifest, if the directory has one.
pub fn read_manifest(source: &dyn DataSource) -> Result<Option<Manifest>, MlperfError> {
    let path = Path::new(MANIFEST);
    let Some(len) = source.file_len(path)? else {
        return Ok(None);
    };
    let mut file = source.open(path)?;
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| MlperfError::io("read", source.display_path(path), e))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source_err| MlperfError::Json {
            path: source.display_path(path),
            source: source_err,
        })
}

fn write_manifest(source: &dyn DataSource, manifest: &Manifest) -> Result<(), MlperfError> {
    let path = Path::new(MANIFEST);
    let display = source.display_path(path);
    let bytes = serde_json::to_vec_pretty(manifest).map_err(|e| MlperfError::Json {
        path: display.clone(),
        source: e,
    })?;
    let mut sink = source.create(path)?;
    sink.write_all(&bytes)
        .and_then(|()| sink.sync())
        .map_err(|e| MlperfError::io("write", display, e))
}

/// The complete data set in `source`, or an error saying what to run.
pub fn load_complete(source: &dyn DataSource) -> Result<DatasetSpec, MlperfError> {
    match read_manifest(source)? {
        Some(manifest) if manifest.complete => Ok(manifest.dataset),
        _ => Err(MlperfError::DatasetMissing {
            dir: source.display_path(Path::new("")).display().to_string(),
        }),
    }
}

/// Checks that `spec` may be written into `source`: the directory is empty of training
/// files, or holds the same data set (possibly unfinished).
pub fn check_target(source: &dyn DataSource, spec: &DatasetSpec) -> Result<(), MlperfError> {
    spec.validate()?;
    let dir = source.display_path(Path::new("")).display().to_string();
    match read_manifest(source)? {
        Some(manifest) if manifest.dataset != *spec => {
            return Err(MlperfError::DatasetMismatch {
                dir,
                found: describe(&manifest.dataset),
            });
        }
        Some(_) => {}
        None => {
            if !source.list(Path::new(TRAIN_DIR))?.is_empty() {
                return Err(MlperfError::DatasetMismatch {
                    dir,
                    found: "files in train/ that sluice did not write".into(),
                });
            }
        }
    }
    Ok(())
}

/// Writes the data set `spec` into `source` with `threads` writers.
pub fn generate(
    source: &dyn DataSource,
    spec: &DatasetSpec,
    threads: usize,
    show_progress: bool,
) -> Result<GenerateReport, MlperfError> {
    check_target(source, spec)?;
    let mut manifest = Manifest {
        version: MANIFEST_VERSION,
        dataset: spec.clone(),
        complete: false,
    };
    write_manifest(source, &manifest)?;
    source.create_dir_all(Path::new(TRAIN_DIR))?;

    let started = Instant::now();
    let bar = if show_progress {
        let bar = ProgressBar::new(spec.nominal_bytes());
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(format!("writing {} files", spec.files));
        bar
    } else {
        ProgressBar::hidden()
    };
    let next = AtomicU64::new(0);
    let written = AtomicU64::new(0);
    let kept = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<MlperfError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for thread in 0..threads.max(1) {
            let (next, written, kept, bytes, failed, first_error, bar) =
                (&next, &written, &kept, &bytes, &failed, &first_error, &bar);
            scope.spawn(move || {
                let pattern = FillPattern::new(spec.seed.wrapping_add(thread as u64));
                while !failed.load(Ordering::Relaxed) {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= spec.files {
                        break;
                    }
                    match write_one(source, spec, index, &pattern) {
                        Ok(Some(n)) => {
                            written.fetch_add(1, Ordering::Relaxed);
                            bytes.fetch_add(n, Ordering::Relaxed);
                            bar.inc(n);
                        }
                        Ok(None) => {
                            kept.fetch_add(1, Ordering::Relaxed);
                            bar.inc(spec.samples_per_file * spec.sample_size);
                        }
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            if let Ok(mut slot) = first_error.lock() {
                                slot.get_or_insert(e);
                            }
                        }
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    if let Some(e) = first_error.into_inner().ok().flatten() {
        return Err(e);
    }
    manifest.complete = true;
    write_manifest(source, &manifest)?;
    Ok(GenerateReport {
        files_written: written.into_inner(),
        files_kept: kept.into_inner(),
        bytes_written: bytes.into_inner(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes file `index` unless it is already there at its final length; returns the bytes
/// written, or `None` when the file was kept.
fn write_one(
    source: &dyn DataSource,
    spec: &DatasetSpec,
    index: u64,
    pattern: &FillPattern,
) -> Result<Option<u64>, MlperfError> {
    let rel = PathBuf::from(spec.file_name(index));
    let sizes = spec.sample_sizes(index);
    let len = record::file_len(spec.format, &sizes);
    if source.file_len(&rel)? == Some(len) {
        return Ok(None);
    }
    let mut sink = source.create(&rel)?;
    record::write_file(sink.as_mut(), spec.format, &sizes, pattern, index)
        .and_then(|()| sink.sync())
        .map_err(|e| MlperfError::io("write", source.display_path(&rel), e))?;
    Ok(Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlperf::source::DirSource;
    use crate::mlperf::workload::{FileFormat, WorkloadKind};

    fn spec(files: u64) -> DatasetSpec {
        DatasetSpec {
            workload: WorkloadKind::Resnet50,
            format: FileFormat::Tfrecord,
            files,
            samples_per_file: 3,
            sample_size: 2000,
            sample_stdev: 500,
            seed: 5,
        }
    }

    #[test]
    fn writes_the_layout_and_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        let spec = spec(12);
        let report = generate(&source, &spec, 3, false).unwrap();
        assert_eq!(report.files_written, 12);
        let names = source.list(Path::new(TRAIN_DIR)).unwrap();
        assert_eq!(names.len(), 12);
        assert_eq!(names[0], "img_01_of_12.tfrecord");
        for i in 0..12 {
            let len = std::fs::metadata(dir.path().join(spec.file_name(i)))
                .unwrap()
                .len();
            assert_eq!(len, record::file_len(spec.format, &spec.sample_sizes(i)));
        }
        assert_eq!(load_complete(&source).unwrap(), spec);
        // Same parameters again: everything is kept.
        let again = generate(&source, &spec, 2, false).unwrap();
        assert_eq!((again.files_written, again.files_kept), (0, 12));
    }

    #[test]
    fn refuses_a_different_data_set() {
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        generate(&source, &spec(4), 1, false).unwrap();
        let err = generate(&source, &spec(5), 1, false).unwrap_err();
        assert!(
            err.to_string()
                .contains("already holds a different data set"),
            "{err}"
        );

        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir(other.path().join(TRAIN_DIR)).unwrap();
        std::fs::write(other.path().join("train/mine.jpg"), b"x").unwrap();
        let source = DirSource::new(other.path()).unwrap();
        let err = generate(&source, &spec(4), 1, false).unwrap_err();
        assert!(err.to_string().contains("sluice did not write"), "{err}");
    }

    #[test]
    fn an_unfinished_data_set_is_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        assert!(load_complete(&source).is_err());
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            dataset: spec(3),
            complete: false,
        };
        write_manifest(&source, &manifest).unwrap();
        let err = load_complete(&source).unwrap_err();
        assert!(err.to_string().contains("no complete data set"), "{err}");
    }
}
