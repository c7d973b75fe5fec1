//! `sluice bench mlperf datagen | run | checkpoint`: command-line arguments and the code
//! that runs them and prints the results.

use std::path::{Path, PathBuf};

use super::MlperfError;
use super::checkpoint::{self, CheckpointOptions, ModelPreset};
use super::datagen;
use super::engine_source::EngineSource;
use super::find_max::{self, FindMaxReport};
use super::loader::{self, RunOptions, RunReport};
use super::plot;
use super::source::{DataSource, DirSource};
use super::workload::{Accelerator, DatasetSpec, Workload, WorkloadKind};
use sluice_engine::size::{SizeRange, Unit, format_size, parse_size};

/// `sluice bench mlperf`: MLPerf Storage training and checkpoint emulation.
#[derive(Debug, clap::Args)]
pub struct MlperfArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: MlperfCommand,
}

/// The `mlperf` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum MlperfCommand {
    /// Write a workload's data set (DLIO's layout and size distribution).
    Datagen(DatagenArgs),
    /// Emulate N accelerators training on a data set; report AU and PASS/FAIL.
    Run(RunArgs),
    /// Write then read checkpoints (fsync'd) split over ranks; report save/load GB/s.
    Checkpoint(CheckpointArgs),
}

/// Where the data lives.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// Directory holding the data set: a local disk, a FUSE or virtio-fs mount.
    #[arg(long, value_name = "DIR", required_unless_present = "engine")]
    pub data_dir: Option<PathBuf>,
    /// Read through the sluice engine in-process from this metadata URL (no kernel in the way).
    #[arg(long, value_name = "META_URL", conflicts_with = "data_dir")]
    pub engine: Option<String>,
}

impl TargetArgs {
    /// Opens the data source.
    pub fn open(&self) -> Result<Box<dyn DataSource>, MlperfError> {
        if let Some(url) = &self.engine {
            return Ok(Box::new(EngineSource::open(url)?));
        }
        match &self.data_dir {
            Some(dir) => Ok(Box::new(DirSource::new(dir)?)),
            None => Err(MlperfError::InvalidParameter(
                "give --data-dir DIR or --engine META_URL".into(),
            )),
        }
    }
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s, Unit::Bytes, SizeRange::ANY).map_err(|e| e.to_string())
}

/// The workload and every parameter that can override its published values.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    /// Workload to emulate.
    #[arg(long, value_enum)]
    pub workload: WorkloadKind,
    /// Accelerator whose compute time per step is emulated.
    #[arg(long, value_enum, default_value_t = Accelerator::H100)]
    pub accelerator: Accelerator,
    /// Samples per step per accelerator.
    #[arg(long)]
    pub batch_size: Option<u64>,
    /// Reader threads per accelerator.
    #[arg(long)]
    pub read_threads: Option<usize>,
    /// Batches each accelerator's loader may prefetch.
    #[arg(long)]
    pub prefetch: Option<usize>,
    /// Compute time per step in seconds.
    #[arg(long, value_name = "SECONDS")]
    pub compute_time: Option<f64>,
    /// Number of training files.
    #[arg(long)]
    pub files: Option<u64>,
    /// Samples in each file.
    #[arg(long)]
    pub samples_per_file: Option<u64>,
    /// Mean sample size (bytes, or with a unit: 140K, 2MiB).
    #[arg(long, value_parser = size_arg)]
    pub sample_size: Option<u64>,
    /// Standard deviation of the sample size (0: fixed size).
    #[arg(long, value_parser = size_arg)]
    pub sample_stdev: Option<u64>,
    /// Epochs to run.
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Seed of the sizes, contents and shuffling.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl WorkloadArgs {
    /// The published workload with the overrides applied.
    pub fn workload(&self) -> Result<Workload, MlperfError> {
        let mut w = Workload::preset(self.workload, self.accelerator)?;
        if let Some(v) = self.batch_size {
            w.batch_size = v;
        }
        if let Some(v) = self.read_threads {
            w.read_threads = v;
        }
        if let Some(v) = self.prefetch {
            w.prefetch_batches = v;
        }
        if let Some(v) = self.compute_time {
            w.compute_time_s = v;
        }
        if let Some(v) = self.files {
            w.dataset.files = v;
        }
        if let Some(v) = self.samples_per_file {
            w.dataset.samples_per_file = v;
        }
        if let Some(v) = self.sample_size {
            w.dataset.sample_size = v;
        }
        if let Some(v) = self.sample_stdev {
            w.dataset.sample_stdev = v;
        }
        if let Some(v) = self.epochs {
            w.epochs = v;
        }
        if let Some(v) = self.seed {
            w.seed = v;
            w.dataset.seed = v;
        }
        w.validate()?;
        Ok(w)
    }

    /// Uses the data set found on disk, refusing overrides that contradict it.
    fn adopt(
        &self,
        workload: &mut Workload,
        found: DatasetSpec,
        dir: &str,
    ) -> Result<(), MlperfError> {
        let mismatch = |reason: String| MlperfError::DatasetDoesNotMatch {
            dir: dir.to_string(),
            reason,
        };
        if found.workload != workload.dataset.workload {
            return Err(mismatch(format!(
                "it is a {} data set, not {}",
                found.workload, workload.dataset.workload
            )));
        }
        let checks = [
            (self.files, found.files, "--files"),
            (
                self.samples_per_file,
                found.samples_per_file,
                "--samples-per-file",
            ),
            (self.sample_size, found.sample_size, "--sample-size"),
            (self.sample_stdev, found.sample_stdev, "--sample-stdev"),
        ];
        for (given, on_disk, name) in checks {
            if given.is_some_and(|g| g != on_disk) {
                return Err(mismatch(format!(
                    "{name} {} differs from its manifest's {on_disk}",
                    given.unwrap_or_default()
                )));
            }
        }
        workload.dataset = found;
        workload.validate()
    }
}

/// `sluice bench mlperf datagen`.
#[derive(Debug, clap::Args)]
pub struct DatagenArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub target: TargetArgs,
    /// Writer threads.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// `sluice bench mlperf run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub target: TargetArgs,
    /// Emulated accelerators (one rank and one data loader each).
    #[arg(long, default_value_t = 1)]
    pub accelerators: usize,
    /// Search for the largest accelerator count that passes, then confirm it.
    #[arg(long)]
    pub find_max: bool,
    /// Epochs of each search run (the confirming run uses the workload's epochs).
    #[arg(long, default_value_t = 1)]
    pub search_epochs: u32,
    /// Upper bound for --find-max.
    #[arg(long, default_value_t = 1024)]
    pub max_accelerators: usize,
    /// Bytes per read call.
    #[arg(long, default_value = "1M", value_parser = size_arg)]
    pub read_size: u64,
    /// Drop the page cache before every epoch (root only).
    #[arg(long)]
    pub drop_caches: bool,
    /// Directory for the JSON result and the SVG plots (a file there is
    /// never overwritten: a later run's names end `-run2`, `-run3`, …).
    #[arg(long, default_value = ".")]
    pub output_dir: PathBuf,
    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// `sluice bench mlperf checkpoint`.
#[derive(Debug, clap::Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub target: TargetArgs,
    /// Published model size and rank count.
    #[arg(long, value_enum)]
    pub model: Option<ModelPreset>,
    /// Bytes per checkpoint (overrides --model), e.g. 4GiB or 105GB.
    #[arg(long, value_parser = size_arg)]
    pub size: Option<u64>,
    /// Ranks sharing a checkpoint (overrides --model).
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Checkpoints to write, then read.
    #[arg(long, default_value_t = 10)]
    pub count: usize,
    /// Bytes per write/read call.
    #[arg(long, default_value = "1M", value_parser = size_arg)]
    pub io_size: u64,
    /// Drop the page cache between saving and loading (root only).
    #[arg(long)]
    pub drop_caches: bool,
    /// Keep the checkpoint files.
    #[arg(long)]
    pub keep: bool,
    /// Directory for the JSON result (a file there is never overwritten: a
    /// later run's name ends `-run2`, `-run3`, …).
    #[arg(long, default_value = ".")]
    pub output_dir: PathBuf,
}

/// Runs a `sluice bench mlperf` command.
pub fn run(args: MlperfArgs) -> Result<(), MlperfError> {
    match args.command {
        MlperfCommand::Datagen(a) => run_datagen(&a),
        MlperfCommand::Run(a) => run_training(&a),
        MlperfCommand::Checkpoint(a) => run_checkpoint(&a),
    }
}

fn run_datagen(args: &DatagenArgs) -> Result<(), MlperfError> {
    let workload = args.workload.workload()?;
    let source = args.target.open()?;
    let spec = &workload.dataset;
    datagen::check_target(source.as_ref(), spec)?;
    println!(
        "writing {} data set to {}: {} files × {} samples × {} (stdev {}), {} in all",
        spec.workload,
        source.describe(),
        spec.files,
        spec.samples_per_file,
        format_size(spec.sample_size),
        format_size(spec.sample_stdev),
        format_size(spec.nominal_bytes())
    );
    let report = datagen::generate(source.as_ref(), spec, args.threads, !args.no_progress)?;
    println!(
        "wrote {} files ({}), kept {} already there, in {:.1} s ({:.1} MiB/s)",
        report.files_written,
        format_size(report.bytes_written),
        report.files_kept,
        report.seconds,
        report.bytes_written as f64 / report.seconds.max(1e-9) / (1u64 << 20) as f64
    );
    Ok(())
}

/// What a run's result files add to their base path: the JSON result and
/// the plots (an SVG, and a PNG when `rsvg-convert` is there).
const RESULT_SUFFIXES: [&str; 5] = [".json", "-wait.svg", "-wait.png", "-au.svg", "-au.png"];

/// The base path in `dir` for a run's result files (`BASE.json`,
/// `BASE-wait.svg`, …) that names no file there yet: `DIR/STEM`, else
/// `DIR/STEM-run2`, `DIR/STEM-run3`, …, so that an earlier result is never
/// overwritten. Says so when it had to move on.
fn fresh_base(dir: &Path, stem: &str) -> PathBuf {
    let taken = |base: &str| {
        RESULT_SUFFIXES.iter().any(|suffix| {
            dir.join(format!("{base}{suffix}"))
                .symlink_metadata()
                .is_ok()
        })
    };
    if !taken(stem) {
        return dir.join(stem);
    }
    let mut n = 2u64;
    loop {
        let base = format!("{stem}-run{n}");
        if !taken(&base) {
            println!(
                "{} has results of an earlier run: this run's are {}.*",
                dir.join(stem).display(),
                dir.join(&base).display()
            );
            return dir.join(base);
        }
        n += 1;
    }
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), MlperfError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| MlperfError::Json {
        path: path.to_path_buf(),
        source: e,
    })?;
    std::fs::write(path, text).map_err(|e| MlperfError::io("write", path, e))
}

fn write_text(path: &Path, text: &str) -> Result<(), MlperfError> {
    std::fs::write(path, text).map_err(|e| MlperfError::io("write", path, e))
}

/// Writes an SVG plot and, when `rsvg-convert` is installed, a PNG beside it; returns the
/// paths written.
fn write_plot(svg_path: &Path, chart: &plot::LineChart) -> Result<Vec<String>, MlperfError> {
    write_text(svg_path, &chart.to_svg())?;
    let mut written = vec![svg_path.display().to_string()];
    let png = svg_path.with_extension("png");
    let converted = std::process::Command::new("rsvg-convert")
        .arg(svg_path)
        .arg("-o")
        .arg(&png)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if converted {
        written.push(png.display().to_string());
    }
    Ok(written)
}

fn print_run(report: &RunReport) {
    let w = &report.workload;
    for e in &report.epochs {
        println!(
            "  epoch {}: AU {:6.2} %  {:10.1} samples/s  {:9.1} MiB/s (measured {:9.1} MiB/s)  {:.1} s",
            e.epoch,
            e.au_percent,
            e.samples_per_second,
            e.mib_per_second,
            e.measured_mib_per_second,
            e.wall_seconds
        );
    }
    println!(
        "{} {} × {}: AU {:.2} % (threshold {:.0} %) {}  {:.1} samples/s  {:.1} MiB/s",
        w.dataset.workload,
        w.accelerator,
        report.accelerators,
        report.au_percent,
        w.threshold * 100.0,
        if report.pass { "PASS" } else { "FAIL" },
        report.samples_per_second,
        report.mib_per_second
    );
}

fn run_training(args: &RunArgs) -> Result<(), MlperfError> {
    let mut workload = args.workload.workload()?;
    let source = args.target.open()?;
    let dir = source.display_path(Path::new("")).display().to_string();
    let found = datagen::load_complete(source.as_ref())?;
    args.workload.adopt(&mut workload, found, &dir)?;
    let read_size = usize::try_from(args.read_size)
        .map_err(|_| MlperfError::InvalidParameter("the read size is too large".into()))?;
    std::fs::create_dir_all(&args.output_dir)
        .map_err(|e| MlperfError::io("create directory", &args.output_dir, e))?;
    let options = |accelerators| RunOptions {
        accelerators,
        read_size,
        drop_caches: args.drop_caches,
        show_progress: !args.no_progress,
    };
    let stem = format!(
        "mlperf-{}-{}",
        workload.dataset.workload, workload.accelerator
    );
    println!(
        "{} on {}: {} files × {} samples of {}, batch {}, {} read threads, compute {:.4} s/step, {:.1} MiB/s per accelerator at 100 % AU",
        workload.dataset.workload,
        source.describe(),
        workload.dataset.files,
        workload.dataset.samples_per_file,
        format_size(workload.dataset.sample_size),
        workload.batch_size,
        workload.read_threads,
        workload.compute_time_s,
        workload.bytes_per_second_per_accelerator() / (1u64 << 20) as f64
    );
    let warn_for = if args.find_max { 1 } else { args.accelerators };
    for warning in loader::dataset_warnings(&workload, warn_for, args.drop_caches) {
        eprintln!("warning: {warning}");
    }
    if !args.find_max {
        let report = loader::run(source.as_ref(), &workload, &options(args.accelerators))?;
        print_run(&report);
        let base = fresh_base(&args.output_dir, &format!("{stem}-{}", report.accelerators));
        let json = base.with_extension("json");
        write_json(&json, &report)?;
        let title = format!(
            "{} {}: data wait per step, {} accelerators",
            workload.dataset.workload, workload.accelerator, report.accelerators
        );
        let wait = PathBuf::from(format!("{}-wait.svg", base.display()));
        let plots = write_plot(&wait, &plot::wait_chart(&title, &report.step_wait_ms))?;
        println!("results: {} {}", json.display(), plots.join(" "));
        return Ok(());
    }
    let mut cap = args.max_accelerators.max(1);
    while cap > 1 && workload.steps_per_epoch(cap) < 2 {
        cap -= 1;
    }
    if workload.steps_per_epoch(cap) < 2 {
        return Err(MlperfError::DatasetTooSmall {
            files: workload.dataset.files,
            samples_per_file: workload.dataset.samples_per_file,
            accelerators: 1,
            batch: workload.batch_size,
        });
    }
    let full_epochs = workload.epochs;
    let report = find_max::find_max(cap, args.search_epochs.max(1), full_epochs, |n, epochs| {
        let mut w = workload.clone();
        w.epochs = epochs;
        let report = loader::run(source.as_ref(), &w, &options(n))?;
        println!(
            "  {n:4} accelerators, {epochs} epoch(s): AU {:6.2} %  {}",
            report.au_percent,
            if report.pass { "PASS" } else { "FAIL" }
        );
        Ok(report)
    })?;
    print_find_max(&workload, &report);
    let base = fresh_base(&args.output_dir, &format!("{stem}-find-max"));
    let json = base.with_extension("json");
    write_json(&json, &report)?;
    let points: Vec<(usize, f64)> = report
        .trials
        .iter()
        .map(|t| (t.accelerators, t.au_percent))
        .collect();
    let au_svg = PathBuf::from(format!("{}-au.svg", base.display()));
    let title = format!(
        "{} {}: AU against accelerators",
        workload.dataset.workload, workload.accelerator
    );
    let mut written = vec![json.display().to_string()];
    written.extend(write_plot(
        &au_svg,
        &plot::au_chart(&title, &points, workload.threshold * 100.0),
    )?);
    if let Some(confirmed) = &report.confirmed {
        let wait = PathBuf::from(format!("{}-wait.svg", base.display()));
        let title = format!(
            "{} {}: data wait per step, {} accelerators",
            workload.dataset.workload, workload.accelerator, confirmed.accelerators
        );
        written.extend(write_plot(
            &wait,
            &plot::wait_chart(&title, &confirmed.step_wait_ms),
        )?);
    }
    println!("results: {}", written.join(" "));
    Ok(())
}

fn print_find_max(workload: &Workload, report: &FindMaxReport) {
    println!(
        "{:>12} {:>7} {:>9} {:>12} {:>10}  result",
        "accelerators", "epochs", "AU %", "samples/s", "MiB/s"
    );
    for t in &report.trials {
        println!(
            "{:>12} {:>7} {:>9.2} {:>12.1} {:>10.1}  {}{}",
            t.accelerators,
            t.epochs,
            t.au_percent,
            t.samples_per_second,
            t.mib_per_second,
            if t.pass { "PASS" } else { "FAIL" },
            if t.confirming { " (confirming)" } else { "" }
        );
    }
    println!(
        "maximum: {} {} accelerators pass {} ({:.0} % AU){}",
        report.max_accelerators,
        workload.accelerator,
        workload.dataset.workload,
        workload.threshold * 100.0,
        if report.capped_by_dataset {
            "; the data set could not feed more, so generate more files to search further"
        } else {
            ""
        }
    );
}

fn run_checkpoint(args: &CheckpointArgs) -> Result<(), MlperfError> {
    let (preset_size, preset_ranks) = args
        .model
        .map(ModelPreset::size_and_ranks)
        .unwrap_or((0, 0));
    let size = args.size.unwrap_or(preset_size);
    let ranks = args.ranks.unwrap_or(preset_ranks);
    if size == 0 || ranks == 0 {
        return Err(MlperfError::InvalidParameter(
            "give --model, or --size and --ranks".into(),
        ));
    }
    let io_size = usize::try_from(args.io_size)
        .map_err(|_| MlperfError::InvalidParameter("the I/O size is too large".into()))?;
    let source = args.target.open()?;
    println!(
        "checkpointing {} over {ranks} ranks, {} times, to {}",
        format_size(size),
        args.count,
        source.describe()
    );
    let options = CheckpointOptions {
        size,
        ranks,
        count: args.count,
        io_size,
        drop_caches: args.drop_caches,
        keep: args.keep,
    };
    let report = checkpoint::run(source.as_ref(), &options)?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    for (s, l) in report.saves.iter().zip(&report.loads) {
        println!(
            "  checkpoint {:3}: save {:8.3} s {:8.3} GB/s   load {:8.3} s {:8.3} GB/s",
            s.index, s.seconds, s.gb_per_second, l.seconds, l.gb_per_second
        );
    }
    println!(
        "save {:.3} GB/s (fsync'd), load {:.3} GB/s",
        report.save_gb_per_second, report.load_gb_per_second
    );
    std::fs::create_dir_all(&args.output_dir)
        .map_err(|e| MlperfError::io("create directory", &args.output_dir, e))?;
    let json = fresh_base(&args.output_dir, "mlperf-checkpoint").with_extension("json");
    write_json(&json, &report)?;
    println!("results: {}", json.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(
            fresh_base(d, "mlperf-unet3d-h100-4"),
            d.join("mlperf-unet3d-h100-4")
        );
        // An earlier run's plot alone takes the name, as its JSON would.
        std::fs::write(d.join("mlperf-unet3d-h100-4-wait.svg"), "<svg/>").unwrap();
        assert_eq!(
            fresh_base(d, "mlperf-unet3d-h100-4"),
            d.join("mlperf-unet3d-h100-4-run2")
        );
        std::fs::write(d.join("mlperf-unet3d-h100-4-run2.json"), "{}").unwrap();
        assert_eq!(
            fresh_base(d, "mlperf-unet3d-h100-4"),
            d.join("mlperf-unet3d-h100-4-run3")
        );
        // Another accelerator count is another name.
        assert_eq!(
            fresh_base(d, "mlperf-unet3d-h100-40"),
            d.join("mlperf-unet3d-h100-40")
        );
        // What was there is untouched.
        assert_eq!(
            std::fs::read_to_string(d.join("mlperf-unet3d-h100-4-wait.svg")).unwrap(),
            "<svg/>"
        );
    }
}
