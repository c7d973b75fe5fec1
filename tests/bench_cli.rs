//! End-to-end: the `sluice bench` commands run as a user runs them, on real directories.

use std::path::Path;
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("the sluice binary runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The AU printed on the summary line ("AU 93.12 % (threshold ...").
fn summary_au(out: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.contains("(threshold"))
        .expect("a summary line");
    let after = line.split("AU ").nth(1).expect("an AU figure");
    after
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a number")
}

#[test]
fn mlperf_datagen_then_run_on_a_local_directory() {
    let data = tempfile::tempdir().unwrap();
    let results = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let out = sluice(&[
        "bench",
        "mlperf",
        "datagen",
        "--workload",
        "resnet50",
        "--data-dir",
        dir,
        "--files",
        "8",
        "--samples-per-file",
        "40",
        "--sample-size",
        "2K",
        "--no-progress",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_dir(data.path().join("train"))
            .unwrap()
            .count(),
        8
    );

    let out = sluice(&[
        "bench",
        "mlperf",
        "run",
        "--workload",
        "resnet50",
        "--data-dir",
        dir,
        "--accelerators",
        "2",
        "--batch-size",
        "20",
        "--compute-time",
        "0.005",
        "--epochs",
        "2",
        "--no-progress",
        "--output-dir",
        results.path().to_str().unwrap(),
    ]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    let au = summary_au(&printed);
    assert!(au > 0.0 && au <= 100.0, "{printed}");
    assert!(printed.contains("PASS") || printed.contains("FAIL"));
    assert!(
        printed.contains("smaller than 5 × RAM"),
        "the page-cache warning: {printed}"
    );
    let json = std::fs::read_to_string(results.path().join("mlperf-resnet50-h100-2.json")).unwrap();
    assert!(json.contains("\"au_percent\""));
    let svg =
        std::fs::read_to_string(results.path().join("mlperf-resnet50-h100-2-wait.svg")).unwrap();
    assert!(svg.starts_with("<svg"));

    // A different data set in the same directory is refused.
    let out = sluice(&[
        "bench",
        "mlperf",
        "datagen",
        "--workload",
        "resnet50",
        "--data-dir",
        dir,
        "--files",
        "9",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("already holds a different data set"));
}

#[test]
fn mlperf_find_max_writes_the_table_and_plot() {
    let data = tempfile::tempdir().unwrap();
    let results = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let out = sluice(&[
        "bench",
        "mlperf",
        "datagen",
        "--workload",
        "unet3d",
        "--data-dir",
        dir,
        "--files",
        "24",
        "--sample-size",
        "8K",
        "--sample-stdev",
        "2K",
        "--no-progress",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = sluice(&[
        "bench",
        "mlperf",
        "run",
        "--workload",
        "unet3d",
        "--data-dir",
        dir,
        "--find-max",
        "--batch-size",
        "2",
        "--compute-time",
        "0.005",
        "--epochs",
        "1",
        "--max-accelerators",
        "4",
        "--no-progress",
        "--output-dir",
        results.path().to_str().unwrap(),
    ]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("maximum:"), "{printed}");
    assert!(
        results
            .path()
            .join("mlperf-unet3d-h100-find-max.json")
            .exists()
    );
    let svg =
        std::fs::read_to_string(results.path().join("mlperf-unet3d-h100-find-max-au.svg")).unwrap();
    assert!(svg.contains("pass 90 %"));
}

#[test]
fn mlperf_checkpoint_and_fs_bench() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let out = sluice(&[
        "bench",
        "mlperf",
        "checkpoint",
        "--data-dir",
        dir,
        "--size",
        "2M",
        "--ranks",
        "4",
        "--count",
        "2",
        "--output-dir",
        dir,
    ]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(
        printed.contains("save ") && printed.contains("GB/s (fsync'd)"),
        "{printed}"
    );
    assert!(!Path::new(dir).join("checkpoints").exists());

    let out = sluice(&[
        "bench",
        dir,
        "-p",
        "2",
        "--big-file-size",
        "2M",
        "--small-file-size",
        "4K",
        "--small-file-count",
        "3",
    ]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    for item in [
        "Write big file",
        "Read big file",
        "Write small file",
        "Read small file",
        "Stat file",
    ] {
        assert!(printed.contains(item), "{printed}");
    }
}

#[test]
fn bad_input_is_one_line_and_exit_code_1() {
    let out = sluice(&[
        "bench",
        "mlperf",
        "run",
        "--workload",
        "unet3d",
        "--data-dir",
        "/nonexistent/sluice",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("sluice: cannot open /nonexistent/sluice"),
        "{err}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite3://{}/empty.db", dir.path().display());
    let out = sluice(&[
        "bench",
        "mlperf",
        "run",
        "--workload",
        "unet3d",
        "--engine",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A missing database is named, and nothing is created in its place.
    assert!(err.contains("no SQLite database at"), "{err}");
    assert!(err.contains("`sluice format`"), "{err}");
    assert!(!dir.path().join("empty.db").exists());
}
