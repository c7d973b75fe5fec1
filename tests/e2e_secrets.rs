//! Secrets stay secret: a Redis password given in the metadata URL appears
//! in no mount source (`/proc/mounts`), daemon log or error message, the
//! environment (`META_PASSWORD`/`REDIS_PASSWORD`) keeps it off command
//! lines, and what a volume stores on this host (the SQLite database, the
//! `file://` bucket, the disk cache) is the owner's only whatever the umask.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{Mount, RedisServer, SLUICE, Volume, Watchdog, text, walk_files};

/// The password Redis asks for: '@', ':' and '/' test the parser; the
/// tail is what must never show up.
const PASSWORD: &str = "p@ss:w/0rd-XYZZY";
/// The same, percent-encoded where a URL needs it.
const PASSWORD_IN_URL: &str = "p@ss:w%2F0rd-XYZZY";
/// What no output may contain.
const TELLTALE: &str = "XYZZY";

/// `sluice ARGS` with extra environment variables.
fn sluice_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(SLUICE)
        .args(args)
        .env("RUST_LOG", "debug")
        .env_remove("META_PASSWORD")
        .env_remove("REDIS_PASSWORD")
        .envs(env.iter().copied())
        .output()
        .expect("the sluice binary runs")
}

fn assert_no_secret(what: &str, out: &str) {
    assert!(
        !out.contains(TELLTALE) && !out.contains("w/0rd") && !out.contains("w%2F0rd"),
        "{what} shows the password: {out}"
    );
}

#[test]
fn a_redis_password_stays_out_of_mounts_logs_and_errors() {
    let _watchdog = Watchdog::new("redis_password", std::time::Duration::from_secs(120));
    let Some(redis) = RedisServer::start_with_password("redis_password", PASSWORD) else {
        return;
    };
    let port = redis.port();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let bucket = dir.path().join("bucket");
    let bucket = bucket.to_str().expect("a UTF-8 path");
    let url = format!("redis://:{PASSWORD_IN_URL}@127.0.0.1:{port}/1");
    let shown = format!("redis://127.0.0.1:{port}/1");

    // format: the password works and its report does not show it.
    let out = sluice_env(&["format", &url, "secrets", "--bucket", bucket], &[]);
    assert!(out.status.success(), "format failed: {}", text(&out));
    assert_no_secret("format", &text(&out));
    assert!(text(&out).contains(&shown), "{}", text(&out));

    // A wrong password: an error that names the server, not the password.
    for wrong in [
        format!("redis://:wrong-{TELLTALE}@127.0.0.1:{port}/1"),
        format!("redis://default:wrong/{TELLTALE}@127.0.0.1:{port}/1"),
    ] {
        for args in [vec!["info", wrong.as_str()], vec!["gc", wrong.as_str()]] {
            let out = sluice_env(&args, &[]);
            assert!(!out.status.success(), "{args:?} succeeded");
            assert_no_secret(&format!("{args:?}"), &text(&out));
            assert!(
                text(&out).contains(&format!("127.0.0.1:{port}")),
                "{}",
                text(&out)
            );
        }
    }
    // Without any password the server refuses, and says so.
    let out = sluice_env(&["info", &shown], &[]);
    assert!(!out.status.success(), "info without a password succeeded");
    // clap's own errors echo no values.
    let out = sluice_env(&["mount", &url], &[]);
    assert!(!out.status.success());
    assert_no_secret("a usage error", &text(&out));

    // The password from the environment instead of the command line.
    for var in ["META_PASSWORD", "REDIS_PASSWORD"] {
        let out = sluice_env(&["info", &shown], &[(var, PASSWORD)]);
        assert!(
            out.status.success(),
            "info with {var} failed: {}",
            text(&out)
        );
        assert!(text(&out).contains("\"secrets\""), "{}", text(&out));
    }

    // The mount: the kernel's mount table and the daemon's log.
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("a mount point");
    let log = dir.path().join("mount.log");
    let m = Mount::start(&url, &mnt, &log, &["--threads", "2"]);
    std::fs::write(mnt.join("f"), b"hello").expect("a write through the mount");
    let mounts = std::fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == mnt.to_str())
        .expect("the mount in /proc/mounts");
    assert_no_secret("/proc/mounts", line);
    assert!(line.starts_with(&format!("{shown} ")), "{line}");
    // `sluice info PATH` reopens the volume from that source, with the
    // password from the environment.
    let f = mnt.join("f");
    let out = sluice_env(
        &["info", f.to_str().expect("a UTF-8 path")],
        &[("META_PASSWORD", PASSWORD)],
    );
    assert!(out.status.success(), "info PATH failed: {}", text(&out));
    assert_no_secret("info PATH", &text(&out));
    m.unmount();
    assert_no_secret(
        "the daemon's log",
        &std::fs::read_to_string(&log).unwrap_or_default(),
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Every directory under `dir` (itself included).
fn walk_dirs(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    out.push(dir.to_owned());
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk_dirs(&e.path(), out);
        }
    }
}

#[test]
fn a_fresh_volume_is_private_to_its_owner_even_with_umask_0() {
    let _watchdog = Watchdog::new("private_files", std::time::Duration::from_secs(120));
    // The loosest umask there is (children inherit it): every mode below
    // is the one sluice asked for, not what the umask left of 0666/0777.
    // SAFETY: umask(2) only sets this process's file-mode mask.
    unsafe { libc::umask(0) };
    let vol = Volume::format("private", &[]);
    let cache = vol.dir.path().join("cache");
    let mnt = vol.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("a mount point");
    let m = Mount::start(
        &vol.meta_url,
        &mnt,
        &vol.dir.path().join("mnt.log"),
        &["--cache-dir", cache.to_str().expect("a UTF-8 path")],
    );
    std::fs::write(mnt.join("a"), vec![7u8; 3 << 20]).expect("a write");
    std::fs::create_dir(mnt.join("d")).expect("a mkdir");
    std::fs::write(mnt.join("d/b"), b"bytes").expect("a write");
    assert_eq!(std::fs::read(mnt.join("d/b")).expect("a read"), b"bytes");
    m.unmount();

    let db = vol.dir.path().join("meta.db");
    assert_eq!(mode(&db), 0o600, "{}", db.display());
    for side in ["meta.db-wal", "meta.db-shm"] {
        let p = vol.dir.path().join(side);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }
    let mut files = Vec::new();
    walk_files(&vol.bucket, &mut files);
    assert!(!vol.objects().is_empty(), "the writes reached the bucket");
    let mut dirs = Vec::new();
    walk_dirs(&vol.bucket, &mut dirs);
    if cache.exists() {
        walk_files(&cache, &mut files);
        walk_dirs(&cache, &mut dirs);
    }
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    for d in &dirs {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
}
