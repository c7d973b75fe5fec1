//! End-to-end: a 300 MiB random file (several 64 MiB chunks) written and read
//! back through a kernel mount of the real `sluice` binary, equal by SHA-256,
//! and still equal after an unmount + remount (with a small, prefaulted
//! memory cache, so block buffers are recycled).

mod common;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::{Mount, Volume, Watchdog, seed, sha256_file};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use sha2::Digest;

const SIZE: usize = 300 << 20;

#[test]
fn a_300_mib_file_reads_back_equal_before_and_after_remount() {
    let _dog = Watchdog::new("a_300_mib_file", Duration::from_secs(900));
    let mut rng = StdRng::seed_from_u64(seed("a_300_mib_file"));
    let vol = Volume::format("big", &[]);
    let mount = vol.mount("mnt");
    let path = mount.path.join("big.bin");
    // The mount widens the kernel's readahead window to 4 MiB, before it
    // logs that it is mounted (the kernel shows the mount a moment earlier).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !mount.log_text().contains(" mounted on ") {
        assert!(std::time::Instant::now() < deadline, "{}", mount.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let dev = std::fs::metadata(&mount.path)
        .expect("stat the mount")
        .dev();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    assert_eq!(
        std::fs::read_to_string(&knob)
            .expect("read read_ahead_kb")
            .trim(),
        "4096"
    );
    let mut want = sha2::Sha256::new();
    {
        let mut f = std::fs::File::create(&path).expect("create through the mount");
        // Odd-sized pieces, so writes straddle block and chunk boundaries.
        let mut buf = vec![0u8; (1 << 20) + 4093];
        let mut left = SIZE;
        while left > 0 {
            let n = left.min(buf.len());
            rng.fill_bytes(&mut buf[..n]);
            f.write_all(&buf[..n]).expect("write through the mount");
            want.update(&buf[..n]);
            left -= n;
        }
        f.sync_all().expect("fsync through the mount");
    }
    let want: [u8; 32] = want.finalize().into();
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), SIZE as u64);
    assert_eq!(sha256_file(&path), want, "read back through the same mount");
    mount.unmount();
    let objects = vol.objects();
    assert!(
        objects.len() >= SIZE / (4 << 20),
        "{} block objects for {SIZE} bytes",
        objects.len()
    );
    // The remount reads through a prefaulted memory cache smaller than the
    // file, so blocks are read into spare buffers and recycled as they are
    // evicted.
    let mnt = vol.dir.path().join("mnt");
    let log = vol.dir.path().join("mnt-prefault.log");
    let mount = Mount::start(
        &vol.meta_url,
        &mnt,
        &log,
        &["--cache-size", "64", "--cache-prefault"],
    );
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), SIZE as u64);
    assert_eq!(sha256_file(&path), want, "read back after a remount");
    assert_eq!(sha256_file(&path), want, "read back again");
    mount.unmount();
}
