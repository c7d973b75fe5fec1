//! End-to-end writeback (`sluice mount --writeback`) through the real binary
//! and a kernel FUSE mount:
//!
//! - with uploads held back (`--upload-delay 3600`), fsync'ed files are
//!   staged on local disk and absent from the bucket; after a kill -9 and a
//!   new mount, every fsync'ed byte reads back, the staged blocks reach the
//!   bucket by themselves and staging empties — and a mount without
//!   writeback then reads the same bytes from the bucket alone;
//! - a clean unmount uploads delayed blocks before it exits, and `sluice
//!   umount --flush` returns only once they are in the bucket;
//! - `--writeback` with an unusable cache directory fails in one line.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Mount, Volume, Watchdog, seed, sha256_file, sluice, text, walk_files};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

/// CACHE/<volume uuid>/rawstaging.
fn staging_dir(vol: &Volume, cache: &Path) -> PathBuf {
    let uuid = std::fs::read_to_string(vol.bucket.join(&vol.name).join("juicefs_uuid"))
        .expect("the volume's juicefs_uuid object");
    cache.join(uuid.trim()).join("rawstaging")
}

/// Staged block objects: key (relative to staging) → bytes. A block the
/// daemon uploads and removes between the listing and the read is no
/// longer staged, and left out.
fn staged_blocks(staging: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = Vec::new();
    walk_files(staging, &mut files);
    files
        .into_iter()
        .filter_map(|p| {
            let data = match std::fs::read(&p) {
                Ok(data) => data,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                Err(e) => panic!("read the staged block {}: {e}", p.display()),
            };
            Some((
                p.strip_prefix(staging).expect("under staging").to_owned(),
                data,
            ))
        })
        .collect()
}

fn mount_with(vol: &Volume, sub: &str, extra: &[&str]) -> Mount {
    let mnt = vol.dir.path().join(sub);
    std::fs::create_dir_all(&mnt).expect("a mount point");
    let log = vol.dir.path().join(format!("{sub}.log"));
    Mount::start(&vol.meta_url, &mnt, &log, extra)
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn fsynced_staged_blocks_survive_a_sigkill_and_reach_the_bucket() {
    let _dog = Watchdog::new("staged_blocks_survive_a_sigkill", Duration::from_secs(600));
    let base = seed("staged_blocks_survive_a_sigkill");
    let vol = Volume::format("wb", &["--block-size", "1M"]);
    let cache = vol.dir.path().join("cache");
    let cache_s = cache.to_str().expect("UTF-8").to_owned();
    let held = [
        "--writeback",
        "--upload-delay",
        "3600",
        "--cache-dir",
        cache_s.as_str(),
    ];
    let mount = mount_with(&vol, "mnt", &held);
    let mnt = mount.path.clone();
    std::fs::create_dir(mnt.join("dir")).expect("mkdir");
    // A one-byte file, and sizes around the 1 MiB block size.
    let sizes = [
        1usize,
        700_000,
        (1 << 20) + 1,
        3 * (1 << 20) + 12_345,
        5 << 20,
    ];
    let mut files: Vec<(PathBuf, [u8; 32], usize)> = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let data = content(base + i as u64, len);
        let rel = PathBuf::from(if i % 2 == 0 {
            format!("f{i}")
        } else {
            format!("dir/f{i}")
        });
        let mut f = std::fs::File::create(mnt.join(&rel)).expect("create");
        f.write_all(&data).expect("write");
        f.sync_all().expect("fsync");
        files.push((rel, sha256(&data), len));
    }
    let expected_blocks: usize = sizes.iter().map(|s| s.div_ceil(1 << 20)).sum();

    // Nothing reached the bucket; every block is staged.
    assert!(
        vol.objects().is_empty(),
        "uploads were held back, yet the bucket has {:?}",
        vol.objects()
    );
    let staging = staging_dir(&vol, &cache);
    let staged = staged_blocks(&staging);
    assert_eq!(
        staged.len(),
        expected_blocks,
        "staged: {:?}",
        staged.keys().collect::<Vec<_>>()
    );
    // `sluice status` shows the backlog of the running mount.
    wait_for(
        "sluice status shows the backlog",
        Duration::from_secs(20),
        || {
            let out = sluice(&["status", &vol.meta_url, "--cache-dir", &cache_s]);
            assert!(out.status.success(), "sluice status: {}", text(&out));
            text(&out).contains(&format!("backlog: {expected_blocks} blocks"))
        },
    );
    let out = text(&sluice(&["status", "--cache-dir", &cache_s]));
    assert!(out.contains("(running)"), "{out}");

    mount.kill9();
    // The crash left every block staged and none uploaded.
    assert!(vol.objects().is_empty());
    assert_eq!(staged_blocks(&staging), staged);
    let out = text(&sluice(&["status", &vol.meta_url, "--cache-dir", &cache_s]));
    assert!(
        out.contains("not running")
            && out.contains(&format!("staged on disk now: {expected_blocks} blocks")),
        "{out}"
    );

    // A new mount (no delay) reads everything back and uploads the backlog.
    let mount = mount_with(&vol, "mnt", &["--writeback", "--cache-dir", &cache_s]);
    for (rel, sum, len) in &files {
        let path = mnt.join(rel);
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            *len as u64,
            "{rel:?}: length after the crash"
        );
        assert!(
            sha256_file(&path) == *sum,
            "{rel:?}: fsync'ed content differs after the crash"
        );
    }
    wait_for(
        "staging empties and the bucket holds every block",
        Duration::from_secs(120),
        || staged_blocks(&staging).is_empty() && vol.objects().len() == expected_blocks,
    );
    // The bucket holds exactly the staged bytes.
    for (rel, data) in &staged {
        let obj = vol.bucket.join(rel);
        assert!(
            std::fs::read(&obj).expect("an uploaded object") == *data,
            "{rel:?}: the uploaded object differs from the staged block"
        );
    }
    assert!(
        mount
            .log_text()
            .contains(&format!("found {expected_blocks} staged blocks")),
        "{}",
        mount.log_text()
    );
    mount.unmount();

    // Without writeback (and without the cache), the bucket alone serves it.
    std::fs::remove_dir_all(&cache).expect("remove the cache directory");
    let mount = vol.mount("mnt");
    for (rel, sum, _) in &files {
        assert!(
            sha256_file(&mnt.join(rel)) == *sum,
            "{rel:?}: differs when read from the bucket"
        );
    }
    mount.unmount();
}

#[test]
fn a_clean_unmount_uploads_delayed_blocks() {
    let _dog = Watchdog::new("a_clean_unmount_uploads", Duration::from_secs(300));
    let base = seed("a_clean_unmount_uploads");
    let vol = Volume::format("wbclean", &["--block-size", "1M"]);
    let cache = vol.dir.path().join("cache");
    let cache_s = cache.to_str().expect("UTF-8").to_owned();
    let mount = mount_with(
        &vol,
        "mnt",
        &[
            "--writeback",
            "--upload-delay",
            "3600",
            "--cache-dir",
            &cache_s,
        ],
    );
    let data = content(base, (2 << 20) + 5);
    std::fs::write(mount.path.join("file"), &data).expect("write");
    let staging = staging_dir(&vol, &cache);
    assert_eq!(staged_blocks(&staging).len(), 3, "closed file, staged");
    assert!(vol.objects().is_empty());
    let log = mount.log.clone();
    mount.unmount();
    assert!(staged_blocks(&staging).is_empty(), "staging after unmount");
    assert_eq!(vol.objects().len(), 3);
    let log = std::fs::read_to_string(log).unwrap_or_default();
    assert!(log.contains("every staged block is uploaded"), "{log}");
    let mount = vol.mount("mnt");
    assert!(std::fs::read(mount.path.join("file")).expect("read") == data);
    mount.unmount();
}

/// `sluice umount --flush` (as `juicefs umount --flush`) returns only once
/// every block the mount staged, delayed ones too, is in the bucket and the
/// mount's process has finished.
#[test]
fn umount_flush_returns_once_every_staged_block_is_uploaded() {
    let _dog = Watchdog::new("umount_flush", Duration::from_secs(300));
    let vol = Volume::format("wbflush", &["--block-size", "1M"]);
    let cache = vol.dir.path().join("cache");
    let cache_s = cache.to_str().expect("UTF-8").to_owned();
    let held = [
        "--writeback",
        "--upload-delay",
        "3600",
        "--cache-dir",
        &cache_s,
    ];
    let mount = mount_with(&vol, "mnt", &held);
    let data = content(seed("umount_flush"), (3 << 20) + 77);
    std::fs::write(mount.path.join("file"), &data).expect("write");
    let staging = staging_dir(&vol, &cache);
    assert_eq!(staged_blocks(&staging).len(), 4, "closed file, staged");
    assert!(vol.objects().is_empty(), "held back by --upload-delay");
    let pid = mount.pid();
    mount.unmount_with(&["--flush"], |out| {
        // Checked before the test collects the process: the command waited.
        assert!(out.contains("every staged block is uploaded"), "{out}");
        assert_eq!(vol.objects().len(), 4, "in the bucket when umount returns");
        assert!(
            staged_blocks(&staging).is_empty(),
            "staging when umount returns"
        );
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().chars().next());
        assert!(
            matches!(state, None | Some(Some('Z'))),
            "the mount's process still runs: {stat}"
        );
    });
    let mount = vol.mount("mnt");
    assert!(std::fs::read(mount.path.join("file")).expect("read") == data);
    mount.unmount();
}

#[test]
fn writeback_without_a_usable_directory_fails_in_one_line() {
    let vol = Volume::format("wbbad", &[]);
    let not_dir = vol.dir.path().join("plain-file");
    std::fs::write(&not_dir, b"x").expect("write");
    let mnt = vol.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    let out = sluice(&[
        "mount",
        &vol.meta_url,
        mnt.to_str().expect("UTF-8"),
        "--writeback",
        "--cache-dir",
        not_dir.to_str().expect("UTF-8"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let last: Vec<&str> = err.lines().filter(|l| l.starts_with("sluice:")).collect();
    assert_eq!(last.len(), 1, "{err}");
    assert!(
        last[0].contains("--writeback cannot stage blocks") && last[0].contains("--cache-dir"),
        "{err}"
    );
    assert_eq!(common::mount_type(&mnt), None);
}
