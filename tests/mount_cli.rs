//! `sluice mount`, `serve` and the other commands that open a volume refuse
//! bad input (flags, a mistyped path, a missing disk) with one clear error,
//! before they mount anything, and leave nothing behind; sizes take units
//! as in JuiceFS.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{SLUICE, Volume, sluice, sluice_ok, text};

/// The first line of what a refused command printed on stderr.
fn refusal(args: &[&str], code: i32) -> String {
    let out = sluice(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    err.lines().next().unwrap_or_default().to_string()
}

#[test]
fn sizes_out_of_range_or_not_sizes_are_refused_before_anything_is_mounted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite3://{}/meta.db", dir.path().display());
    let mnt = dir.path().display().to_string();
    for background in [false, true] {
        let with = |flag: &'static str, value: &'static str| {
            let mut args = vec!["mount", url.as_str(), mnt.as_str(), flag, value];
            if background {
                args.push("-d");
            }
            args
        };
        let err = refusal(&with("--kernel-readahead", "4096"), 2);
        assert!(
            err.contains("\"4096\" is 4.00 GiB, more than the most this takes, 1.00 GiB"),
            "{err}"
        );
        let err = refusal(&with("--cache-size", "1X"), 2);
        assert!(
            err.contains("\"1X\" is not a size") && err.contains("MiB"),
            "{err}"
        );
        // 99999999999 MiB: accepted silently before; no host has that much.
        let err = refusal(&with("--cache-size", "99999999999"), 1);
        assert!(
            err.contains("--cache-size 93.13 PiB is more than this host's memory"),
            "{err}"
        );
        let err = refusal(&with("--buffer-size", "512K"), 2);
        assert!(
            err.contains("less than the least this takes, 1.00 MiB"),
            "{err}"
        );
    }
    assert!(
        !dir.path().join("meta.db").exists(),
        "a refused mount opened the database"
    );
}

/// `--cache-size 1G` and the other sizes with units reach the mount: the
/// kernel's readahead is what `--kernel-readahead 1536K` asked for.
#[test]
fn sizes_with_units_work_as_in_juicefs() {
    let vol = Volume::format("sizevol", &[]);
    let mnt = vol.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("a mount point");
    let m = common::Mount::start(
        &vol.meta_url,
        &mnt,
        &vol.dir.path().join("mnt.log"),
        &[
            "--cache-size",
            "1G",
            "--buffer-size",
            "300M",
            "--max-readahead",
            "8M",
            "--kernel-readahead",
            "1536K",
            "--cache-dir",
            vol.dir.path().join("cache").to_str().expect("UTF-8"),
            "--disk-cache-size",
            "1.5G",
        ],
    );
    std::fs::write(m.path.join("f"), b"sized").expect("write");
    assert_eq!(std::fs::read(m.path.join("f")).expect("read"), b"sized");
    let dev = std::fs::metadata(&m.path).expect("stat").dev();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    if let Ok(kb) = std::fs::read_to_string(&knob) {
        assert_eq!(kb.trim(), "1536", "{knob}");
    }
    m.unmount();
    // The same meaning in `format`: a bare --capacity is GiB, GB is 10^9.
    sluice_ok(&["config", &vol.meta_url, "--capacity", "2GB"]);
    let meta = sluice_engine::meta::open_meta(&vol.meta_url).expect("the metadata opens");
    assert_eq!(meta.load().expect("a volume").capacity, 2_000_000_000);
}

/// Every command that opens a volume, given a mistyped `sqlite3://` path,
/// names the path and creates no database there.
#[test]
fn a_mistyped_sqlite_path_is_named_and_no_empty_database_is_left() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("missing.db");
    let url = format!("sqlite3://{}", db.display());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let sock = dir.path().join("s.sock");
    let (mnt, sock) = (mnt.to_str().expect("UTF-8"), sock.to_str().expect("UTF-8"));
    let commands: [&[&str]; 9] = [
        &["mount", &url, mnt],
        &["serve", &url, "--socket", sock, "--no-metrics"],
        &["info", &url],
        &["fsck", &url],
        &["gc", &url],
        &["dump", &url],
        &["status", &url],
        &["quota", "list", &url],
        &["config", &url, "--capacity", "1"],
    ];
    for args in commands {
        let out = sluice(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.contains(&format!("no SQLite database at {}", db.display())),
            "{args:?}: {err}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, ["mnt"], "{args:?} left files behind");
    }
}

/// A volume whose bucket directory is gone (a data disk that did not
/// mount) is not served on a new, empty directory: the mount is refused
/// and the directory not made; an empty directory in its place is refused
/// too, because the volume has data.
#[test]
fn a_vanished_bucket_is_refused_never_recreated() {
    let vol = Volume::format("gonevol", &[]);
    let m = vol.mount("mnt");
    std::fs::write(m.path.join("f"), b"on the data disk").expect("write");
    m.unmount();
    let moved = vol.dir.path().join("unmounted-disk");
    std::fs::rename(&vol.bucket, &moved).expect("the disk goes");
    let mnt = vol.dir.path().join("mnt");
    let mnt_s = mnt.to_str().expect("UTF-8");
    let out = sluice(&["mount", &vol.meta_url, mnt_s]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("does not exist: is the disk that holds it mounted?"),
        "{}",
        text(&out)
    );
    assert!(!vol.bucket.exists(), "the bucket directory was made again");
    for args in [&["info", &vol.meta_url][..], &["fsck", &vol.meta_url]] {
        assert_eq!(sluice(args).status.code(), Some(1), "{args:?}");
        assert!(
            !vol.bucket.exists(),
            "{args:?} made the bucket directory again"
        );
    }
    // The mount point of the disk is there, empty.
    std::fs::create_dir(&vol.bucket).expect("an empty mount point");
    let out = sluice(&["mount", &vol.meta_url, mnt_s]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("yet the volume has stored data"),
        "{}",
        text(&out)
    );
    assert_eq!(std::fs::read_dir(&vol.bucket).expect("ls").count(), 0);
    // Nor does `format` run again write the volume's UUID there.
    let out = sluice(&["format", &vol.meta_url, "gonevol"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("holds none of volume"),
        "{}",
        text(&out)
    );
    assert_eq!(std::fs::read_dir(&vol.bucket).expect("ls").count(), 0);
    // The disk is back, but its UUID object was lost: `format` writes it
    // back (the objects are there), and the volume is served as before.
    std::fs::remove_dir(&vol.bucket).expect("rmdir");
    std::fs::rename(&moved, &vol.bucket).expect("the disk is back");
    let uuid = vol.bucket.join("gonevol/juicefs_uuid");
    std::fs::remove_file(&uuid).expect("the UUID object goes");
    assert_eq!(
        sluice(&["mount", &vol.meta_url, mnt_s]).status.code(),
        Some(1)
    );
    sluice_ok(&["format", &vol.meta_url, "gonevol"]);
    assert!(uuid.exists());
    let m = vol.mount("mnt");
    assert_eq!(
        std::fs::read(m.path.join("f")).expect("read"),
        b"on the data disk"
    );
    m.unmount();
}

/// A mount on a directory that holds files is refused, naming one, unless
/// `--nonempty` (libfuse 2's name); the files are there again afterwards.
#[test]
fn a_non_empty_mount_point_needs_nonempty() {
    let vol = Volume::format("nonemptyvol", &[]);
    let mnt = vol.dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    std::fs::write(mnt.join("precious"), b"under the mount").expect("write");
    let mnt_s = mnt.to_str().expect("UTF-8");
    for background in [false, true] {
        let mut args = vec!["mount", &vol.meta_url, mnt_s];
        if background {
            args.push("-d");
        }
        let out = sluice(&args);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is not empty (it holds \"precious\"") && err.contains("--nonempty"),
            "{err}"
        );
        assert_eq!(common::mount_type(&mnt), None);
    }
    let m = common::Mount::start(
        &vol.meta_url,
        &mnt,
        &vol.dir.path().join("mnt.log"),
        &["--nonempty"],
    );
    assert!(!m.path.join("precious").exists(), "hidden under the mount");
    m.unmount();
    assert_eq!(
        std::fs::read(mnt.join("precious")).expect("read"),
        b"under the mount"
    );
}

/// Waits until `path` is gone, up to `limit`.
fn gone_within(path: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// `sluice serve` removes its vhost-user and control sockets when SIGTERM
/// ends it (at once, without unwinding, from inside its sandbox), and when
/// its start fails after it made them (the bucket is gone); a failed start
/// prints no placement plan, only why it failed.
#[test]
fn serve_leaves_no_socket_behind_after_sigterm_or_a_failed_start() {
    let vol = Volume::format("sockvol", &[]);
    let sock = vol.dir.path().join("vol.sock");
    let control = vol.dir.path().join("vol.sock.control");
    let serve = || {
        Command::new(SLUICE)
            .args(["serve", &vol.meta_url, "--no-metrics", "--socket"])
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sluice serve starts")
    };
    let mut child = serve();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(sock.exists() && control.exists()) {
        assert!(Instant::now() < deadline, "no sockets");
        assert!(child.try_wait().expect("waitpid").is_none(), "serve exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().expect("serve ends");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        gone_within(&sock, Duration::from_secs(10)),
        "vhost-user socket left"
    );
    assert!(
        gone_within(&control, Duration::from_secs(10)),
        "control socket left"
    );

    std::fs::remove_dir_all(&vol.bucket).expect("the bucket goes");
    let out = serve().wait_with_output().expect("serve ends");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("does not exist"), "{}", text(&out));
    assert!(!text(&out).contains("placement"), "{}", text(&out));
    assert!(
        gone_within(&sock, Duration::from_secs(10)),
        "vhost-user socket left"
    );
    assert!(
        gone_within(&control, Duration::from_secs(10)),
        "control socket left"
    );
    assert!(!vol.bucket.exists(), "the bucket directory was made again");
}
