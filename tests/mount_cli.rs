//! `sluice mount` refuses bad flags with one clear error, before it mounts
//! anything, and takes sizes with units as JuiceFS does.

mod common;

use std::os::unix::fs::MetadataExt;

use common::{Volume, sluice, sluice_ok};

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
