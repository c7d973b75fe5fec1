//! Quotas shared with real JuiceFS 1.4 on one volume, SQLite and Redis: a
//! quota `juicefs quota set` made is listed by `sluice quota get` and
//! enforced by a sluice mount (EDQUOT), and the usage sluice keeps while it
//! writes passes `juicefs quota check` (plain, which compares JuiceFS's
//! directory statistics, and `--strict`, which walks the tree) and shows
//! the same numbers in `juicefs quota get`.
//!
//! The path of the `juicefs` binary comes from SLUICE_JUICEFS_BIN; without
//! it every test here says why and returns.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Mount, Watchdog, sluice_ok, text, write_refused};
use sluice_engine::meta::{Context, ROOT_INO, open_meta};

const MIB: usize = 1 << 20;

fn juicefs_bin(test: &str) -> Option<PathBuf> {
    match std::env::var_os("SLUICE_JUICEFS_BIN") {
        Some(p) if Path::new(&p).is_file() => Some(PathBuf::from(p)),
        Some(p) => panic!("SLUICE_JUICEFS_BIN={p:?} is not a file"),
        None => {
            eprintln!("{test}: skipped: SLUICE_JUICEFS_BIN is not set");
            None
        }
    }
}

fn juicefs_ok(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).output().expect("juicefs runs");
    assert!(
        out.status.success(),
        "juicefs {args:?} failed: {}",
        text(&out)
    );
    text(&out)
}

/// The cells of the table row for `path` in `juicefs quota` or `sluice
/// quota` output (both print `|`-separated columns: path, size, used,
/// use%, inodes, iused, iuse%).
fn row(out: &str, path: &str) -> Vec<String> {
    out.lines()
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>()
        })
        .find(|cells| cells.first().map(String::as_str) == Some(path))
        .unwrap_or_else(|| panic!("no row for {path} in:\n{out}"))
}

/// go-humanize's `IBytes`, which `juicefs quota` prints sizes with.
fn ibytes(n: i64) -> String {
    let n = n as f64;
    if n < 10.0 {
        return format!("{n} B");
    }
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let e = (n.ln() / 1024f64.ln()).floor() as i32;
    let val = (n / 1024f64.powi(e) * 10.0 + 0.5).floor() / 10.0;
    if val < 10.0 {
        format!("{val:.1} {}", units[e as usize])
    } else {
        format!("{val:.0} {}", units[e as usize])
    }
}

fn write_file(path: &Path, len: usize) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(&vec![3u8; len])?;
    f.sync_all()
}

fn edquot<T: std::fmt::Debug>(r: std::io::Result<T>, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected EDQUOT, got {v:?}"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{what}: {e}"),
    }
}

/// The whole round trip on the volume at `meta` (formatted here).
fn quotas_agree_with_juicefs(bin: &Path, meta: &str, dir: &Path) {
    let bucket = dir.join("bucket");
    sluice_ok(&[
        "format",
        meta,
        "quotas",
        "--bucket",
        bucket.to_str().expect("a path"),
        "--trash-days",
        "0",
    ]);
    // A quota JuiceFS sets: sluice lists it and enforces it.
    juicefs_ok(
        bin,
        &[
            "quota",
            "set",
            meta,
            "--path",
            "/jq",
            "--capacity",
            "1M",
            "--inodes",
            "3",
            "--create",
        ],
    );
    let got = sluice_ok(&["quota", "get", meta, "--path", "/jq"]);
    let r = row(&got, "/jq");
    assert_eq!((r[1].as_str(), r[4].as_str()), ("1.00 MiB", "3"), "{got}");
    // And one sluice sets.
    sluice_ok(&[
        "quota",
        "set",
        meta,
        "--path",
        "/sq",
        "--capacity",
        "1",
        "--inodes",
        "100",
        "--create",
    ]);
    let listed = juicefs_ok(bin, &["quota", "list", meta]);
    assert!(listed.contains("/sq") && listed.contains("/jq"), "{listed}");

    let mnt = dir.join("mnt");
    fs::create_dir_all(&mnt).expect("a mount point");
    let m = Mount::start(meta, &mnt, &dir.join("sluice.log"), &[]);
    let jq = mnt.join("jq");
    // 2 MiB do not fit 1 MiB; "big" keeps one of the 3 inodes.
    write_refused(&jq.join("big"), 2 * MIB, libc::EDQUOT);
    File::create(jq.join("a")).expect("a");
    File::create(jq.join("b")).expect("b");
    edquot(File::create(jq.join("c")), "a fourth inode");
    edquot(fs::create_dir(jq.join("d")), "a fourth inode");
    // Writes of every kind below /sq.
    let sq = mnt.join("sq");
    fs::create_dir_all(sq.join("a/b")).expect("dirs");
    write_file(&sq.join("a/small"), 5000).expect("small");
    write_file(&sq.join("a/b/mid"), 100_001).expect("mid");
    write_file(&sq.join("big"), MIB + 1).expect("big");
    fs::hard_link(sq.join("a/small"), sq.join("a/b/link")).expect("link");
    std::os::unix::fs::symlink("a/small", sq.join("sym")).expect("symlink");
    write_file(&mnt.join("outside"), 9000).expect("outside");
    fs::create_dir_all(mnt.join("tree/x")).expect("tree");
    write_file(&mnt.join("tree/x/f"), 70_000).expect("tree file");
    fs::rename(mnt.join("tree"), sq.join("tree")).expect("a tree moves in");
    fs::rename(sq.join("big"), mnt.join("big")).expect("a file moves out");
    fs::rename(mnt.join("outside"), sq.join("a/inside")).expect("a file moves in");
    {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(sq.join("a/b/mid"))
            .expect("append");
        f.write_all(&[1u8; 40_000]).expect("append");
    }
    File::options()
        .write(true)
        .open(sq.join("a/small"))
        .and_then(|f| f.set_len(20_000))
        .expect("truncate up");
    fs::remove_file(sq.join("sym")).expect("unlink");
    m.unmount();

    for path in ["/sq", "/jq"] {
        juicefs_ok(bin, &["quota", "check", meta, "--path", path]);
        juicefs_ok(bin, &["quota", "check", meta, "--path", path, "--strict"]);
        let ours = sluice_ok(&["quota", "check", meta, "--path", path]);
        assert!(ours.contains("consistent"), "{ours}");
    }
    // The same usage in juicefs quota get as sluice stored.
    let engine = open_meta(meta).expect("open the metadata");
    engine.load().expect("load");
    let (sq_ino, _) = engine
        .lookup(&Context::internal(), ROOT_INO, b"sq")
        .expect("sq");
    let q = engine.get_dir_quota(sq_ino).expect("get").expect("a quota");
    drop(engine);
    let theirs = juicefs_ok(bin, &["quota", "get", meta, "--path", "/sq"]);
    let r = row(&theirs, "/sq");
    assert_eq!(r[2], ibytes(q.used_space), "used space: {theirs}");
    assert_eq!(r[5], q.used_inodes.to_string(), "used inodes: {theirs}");
    // a, a/b, a/small, a/b/mid, a/b/link, a/inside, tree, tree/x, tree/x/f.
    assert_eq!(q.used_inodes, 9);
}

#[test]
fn sqlite_quotas_agree_with_juicefs() {
    let test = "sqlite_quotas_agree_with_juicefs";
    let Some(bin) = juicefs_bin(test) else { return };
    let _dog = Watchdog::new("sqlite_quotas", Duration::from_secs(300));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let meta = format!("sqlite3://{}", dir.path().join("meta.db").display());
    quotas_agree_with_juicefs(&bin, &meta, dir.path());
}

#[test]
fn redis_quotas_agree_with_juicefs() {
    let test = "redis_quotas_agree_with_juicefs";
    let Some(bin) = juicefs_bin(test) else { return };
    let Some(redis) = common::RedisServer::start(test) else {
        return;
    };
    let _dog = Watchdog::new("redis_quotas", Duration::from_secs(300));
    let dir = tempfile::tempdir().expect("a temporary directory");
    quotas_agree_with_juicefs(&bin, &redis.url(1), dir.path());
}
