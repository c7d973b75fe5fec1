//! End-to-end: `sluice objbench` and `sluice format --storage s3` run as a
//! user runs them, against a real S3 HTTP server (s3s-fs) on loopback and
//! against a local directory.

use std::process::{Command, Output};

use sluice_engine::object::s3_test_server::TestS3Server;

const AK: &str = "cli-access";
const SK: &str = "cli-secret-do-not-print";

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
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

/// The table rows `juicefs objbench` prints, in its order.
const ROWS: [&str; 7] = [
    "upload objects",
    "download objects",
    "put small objects",
    "get small objects",
    "list objects",
    "head objects",
    "delete objects",
];

fn assert_table(printed: &str) {
    for row in ROWS {
        let line = printed
            .lines()
            .find(|l| l.contains(&format!("| {row} ")) || l.contains(&format!(" {row} |")))
            .unwrap_or_else(|| panic!("no {row:?} row in:\n{printed}"));
        let unit = if row.contains("load") {
            "MiB/s"
        } else {
            "objects/s"
        };
        assert!(line.contains(unit) && line.contains("ms/"), "{line}");
    }
}

#[test]
fn objbench_on_a_loopback_s3_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestS3Server::start(dir.path(), AK, SK).unwrap();
    let url = server.bucket_url("bench");
    let out = sluice(&[
        "objbench",
        "--storage",
        "s3",
        "--bucket",
        &url,
        "--access-key",
        AK,
        "--secret-key",
        SK,
        "--threads",
        "3",
        "--big-size",
        "256K",
        "--big-count",
        "6",
        "--small-size",
        "1K",
        "--count",
        "20",
    ]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(
        printed.contains(&format!("s3://bench at http://{}", server.addr())),
        "{printed}"
    );
    assert_table(&printed);
    assert!(!printed.contains(SK), "{printed}");
    // Everything it wrote it deleted again.
    let left: Vec<_> = walk(&dir.path().join("bench"));
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn objbench_on_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let out = sluice(&[
        "objbench",
        "--bucket",
        bucket.to_str().unwrap(),
        "--threads",
        "2",
        "--big-size",
        "128K",
        "--big-count",
        "4",
        "--count",
        "10",
    ]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert_table(&printed);
    assert!(walk(&bucket).is_empty());
}

#[test]
fn objbench_with_wrong_keys_fails_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestS3Server::start(dir.path(), AK, SK).unwrap();
    let out = sluice(&[
        "objbench",
        "--storage",
        "s3",
        "--bucket",
        &server.bucket_url("bench"),
        "--access-key",
        AK,
        "--secret-key",
        "wrong-secret",
        "--count",
        "1",
        "--big-count",
        "1",
    ]);
    let printed = text(&out);
    assert!(!out.status.success());
    let err = printed
        .lines()
        .find(|l| l.starts_with("sluice: "))
        .unwrap_or_else(|| panic!("no error line in:\n{printed}"));
    assert!(err.contains("403"), "{err}");
    assert!(!printed.contains("wrong-secret"), "{printed}");
}

#[test]
fn format_on_s3_keeps_the_secret_sealed_and_info_hides_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestS3Server::start(&dir.path().join("s3"), AK, SK).unwrap();
    let meta = format!("sqlite3://{}/meta.db", dir.path().display());
    let url = server.bucket_url("newbucket");
    let out = sluice(&[
        "format",
        &meta,
        "vol",
        "--storage",
        "s3",
        "--bucket",
        &url,
        "--access-key",
        AK,
        "--secret-key",
        SK,
    ]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains(&url), "{printed}");
    assert!(!printed.contains(SK), "{printed}");
    // The bucket was created and holds the volume's UUID object.
    assert!(dir.path().join("s3/newbucket/vol/juicefs_uuid").is_file());
    // Formatting again without keys keeps the stored ones.
    let out = sluice(&["format", &meta, "vol", "--storage", "s3", "--bucket", &url]);
    assert!(out.status.success(), "{}", text(&out));

    let out = sluice(&["info", &meta]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("\"Storage\": \"s3\""), "{printed}");
    assert!(
        printed.contains("\"SecretKey\": \"(removed)\""),
        "{printed}"
    );
    assert!(!printed.contains(SK), "{printed}");

    // Half a key pair is refused with a one-line error.
    let out = sluice(&[
        "format",
        &meta,
        "vol",
        "--storage",
        "s3",
        "--bucket",
        &url,
        "--access-key",
        AK,
    ]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--access-key and --secret-key together"));
}

/// Every file under `dir` (the benchmark's objects would be files there).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}
