//! End-to-end crash test: the `sluice mount` process is SIGKILLed while files
//! are being written. After `sluice umount --lazy` and a new mount:
//!
//! - every file fsync'ed before the kill has exactly its full content;
//! - a file changed after its fsync holds, at every byte, either its synced
//!   content or the new content;
//! - a file never fsync'ed may be missing or shorter, but every byte present
//!   is either the byte written there or zero (a slice not committed reads as
//!   a hole), and it is never longer than what was written;
//! - every file reads without error and the volume takes new writes.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{Volume, Watchdog, seed};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Every byte of `got` is `want`'s byte or zero, and `got` is no longer.
fn written_or_zero(path: &Path, got: &[u8], want: &[u8]) {
    assert!(
        got.len() <= want.len(),
        "{}: {} bytes after the crash, only {} were written",
        path.display(),
        got.len(),
        want.len()
    );
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w && *g != 0) {
        panic!(
            "{}: byte {i} is {:#04x}: neither what was written ({:#04x}) nor zero",
            path.display(),
            got[i],
            want[i]
        );
    }
}

#[test]
fn fsynced_files_survive_a_sigkill_of_the_mount() {
    let _dog = Watchdog::new("fsynced_files_survive_a_sigkill", Duration::from_secs(600));
    let base = seed("fsynced_files_survive_a_sigkill");
    let mut rng = StdRng::seed_from_u64(base);
    let vol = Volume::format("crash", &[]);
    let mount = vol.mount("mnt");
    let mnt = mount.path.clone();
    std::fs::create_dir(mnt.join("dir")).expect("mkdir");

    // Synced files, sizes straddling 4 MiB blocks.
    let mut synced: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    for i in 0..6u64 {
        let len = rng.random_range(1..(9 << 20));
        let data = content(base + i, len);
        let rel = PathBuf::from(if i % 2 == 0 {
            format!("s{i}")
        } else {
            format!("dir/s{i}")
        });
        let mut f = std::fs::File::create(mnt.join(&rel)).expect("create");
        f.write_all(&data).expect("write");
        f.sync_all().expect("fsync");
        synced.push((rel, data));
    }
    // A synced file overwritten in the middle without a second fsync.
    let old = content(base + 20, 6 << 20);
    let mut f = std::fs::File::create(mnt.join("over")).expect("create");
    f.write_all(&old).expect("write");
    f.sync_all().expect("fsync");
    let patch = content(base + 21, 3 << 20);
    let patch_at = 1_500_000u64;
    f.seek(SeekFrom::Start(patch_at)).expect("seek");
    f.write_all(&patch).expect("write");
    drop(f);

    // Files never synced, two of them still being written when the kill lands.
    let unsynced: Vec<(PathBuf, Vec<u8>)> = (0..3u64)
        .map(|i| {
            (
                PathBuf::from(format!("u{i}")),
                content(base + 30 + i, 7 << 20),
            )
        })
        .collect();
    for (rel, data) in &unsynced {
        std::fs::write(mnt.join(rel), data).expect("write");
    }
    let stop = AtomicBool::new(false);
    let written = [AtomicU64::new(0), AtomicU64::new(0)];
    let streams: Vec<Vec<u8>> = (0..2u64)
        .map(|i| content(base + 40 + i, 40 << 20))
        .collect();
    std::thread::scope(|s| {
        for (i, data) in streams.iter().enumerate() {
            let (mnt, stop, written) = (&mnt, &stop, &written[i]);
            s.spawn(move || {
                let Ok(mut f) = std::fs::File::create(mnt.join(format!("live{i}"))) else {
                    return;
                };
                let mut off = 0;
                while off < data.len() && !stop.load(Ordering::Relaxed) {
                    let n = (256 << 10).min(data.len() - off);
                    // Errors are expected once the server is gone.
                    if f.write_all(&data[off..off + n]).is_err() {
                        return;
                    }
                    off += n;
                    written.store(off as u64, Ordering::Relaxed);
                }
            });
        }
        // Let the writers get going (by progress, not by time), then crash.
        while written
            .iter()
            .any(|w| w.load(Ordering::Relaxed) < (6 << 20))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        mount.kill9();
        stop.store(true, Ordering::Relaxed);
    });

    let mount = vol.mount("mnt");
    for (rel, data) in &synced {
        let got = std::fs::read(mnt.join(rel)).unwrap_or_else(|e| panic!("read {rel:?}: {e}"));
        assert!(
            got.len() == data.len(),
            "{rel:?}: {} bytes, {} were fsync'ed",
            got.len(),
            data.len()
        );
        assert!(
            &got == data,
            "{rel:?}: fsync'ed content differs after the crash"
        );
    }
    let got = std::fs::read(mnt.join("over")).expect("read over");
    assert_eq!(got.len(), old.len(), "over: length after the crash");
    for (i, g) in got.iter().enumerate() {
        let in_patch = (i as u64) >= patch_at && (i as u64) < patch_at + patch.len() as u64;
        let new = if in_patch {
            patch[i - patch_at as usize]
        } else {
            old[i]
        };
        assert!(
            *g == old[i] || *g == new,
            "over: byte {i} is {g:#04x}, neither old nor new"
        );
    }
    for (rel, data) in &unsynced {
        match std::fs::read(mnt.join(rel)) {
            Ok(got) => {
                eprintln!(
                    "{rel:?}: {} of {} bytes after the crash",
                    got.len(),
                    data.len()
                );
                written_or_zero(&mnt.join(rel), &got, data)
            }
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{rel:?}: {e}"),
        }
    }
    for (i, data) in streams.iter().enumerate() {
        let path = mnt.join(format!("live{i}"));
        match std::fs::read(&path) {
            Ok(got) => {
                eprintln!(
                    "live{i}: {} of {} bytes after the crash",
                    got.len(),
                    data.len()
                );
                written_or_zero(&path, &got, data)
            }
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "live{i}: {e}"),
        }
    }
    // The volume still works.
    let fresh = content(base + 99, 5 << 20);
    std::fs::write(mnt.join("after"), &fresh).expect("write after the crash");
    mount.unmount();
    let mount = vol.mount("mnt");
    assert!(
        std::fs::read(mnt.join("after")).expect("read") == fresh,
        "a file written after the crash"
    );
    mount.unmount();
}
