//! End-to-end: `copy_file_range(2)` through a kernel mount of the real
//! `sluice` binary shares the source's slices: the copy reads back equal,
//! before and after a remount and after the source is gone, and the bucket
//! gains no object.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use common::{Volume, Watchdog, seed, sha256_file};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

const MIB: usize = 1 << 20;

/// Copies `len` bytes from `off_in` of `src` to `off_out` of `dst` with the
/// copy_file_range system call, looping over short copies as `cp` does.
fn copy_range(src: &File, mut off_in: i64, dst: &File, mut off_out: i64, len: usize) {
    let mut left = len;
    while left > 0 {
        // SAFETY: both descriptors are open for the whole call and the
        // offsets are i64 (loff_t) variables the kernel updates.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                left,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range returned {n}: {}",
            std::io::Error::last_os_error()
        );
        left -= n as usize;
    }
}

#[test]
fn copy_file_range_shares_blocks_through_the_kernel() {
    let _dog = Watchdog::new("copy_file_range", Duration::from_secs(600));
    let mut rng = StdRng::seed_from_u64(seed("copy_file_range"));
    let vol = Volume::format("cfr", &["--trash-days", "0"]);
    let mount = vol.mount("mnt");
    let src_path = mount.path.join("src.bin");
    let mut data = vec![0u8; 10 * MIB + 12_345];
    rng.fill_bytes(&mut data);
    {
        let mut f = File::create(&src_path).expect("create the source");
        f.write_all(&data).expect("write the source");
        f.sync_all().expect("fsync the source");
    }
    let before = vol.objects();
    assert!(!before.is_empty());

    // The whole file into a new one.
    let src = File::open(&src_path).expect("open the source");
    let copy_path = mount.path.join("copy.bin");
    {
        let dst = File::create(&copy_path).expect("create the copy");
        copy_range(&src, 0, &dst, 0, data.len());
    }
    assert_eq!(fs::read(&copy_path).expect("read the copy"), data);
    assert_eq!(sha256_file(&copy_path), sha256_file(&src_path));
    // Metadata only: the copy stored nothing (the kernel's fallback, a
    // read and a write, would have stored new blocks).
    assert_eq!(vol.objects(), before, "the copy stored block objects");

    // A middle piece into the middle of another file, at another offset.
    let mid_path = mount.path.join("mid.bin");
    let mut filler = vec![0u8; 6 * MIB];
    rng.fill_bytes(&mut filler);
    fs::write(&mid_path, &filler).expect("write the filler");
    let with_filler = vol.objects();
    {
        let dst = OpenOptions::new()
            .write(true)
            .open(&mid_path)
            .expect("open the filler");
        copy_range(&src, 3 * MIB as i64 + 17, &dst, MIB as i64 + 5, 4 * MIB);
    }
    let mut want = filler.clone();
    want[MIB + 5..][..4 * MIB].copy_from_slice(&data[3 * MIB + 17..][..4 * MIB]);
    assert_eq!(fs::read(&mid_path).expect("read mid"), want);
    drop(src);

    assert_eq!(vol.objects(), with_filler, "the copy stored block objects");

    mount.unmount();
    let mount = vol.mount("mnt");
    assert_eq!(fs::read(&copy_path).expect("copy after remount"), data);
    assert_eq!(fs::read(&mid_path).expect("mid after remount"), want);
    // The source goes; the copies keep its blocks.
    fs::remove_file(&src_path).expect("remove the source");
    assert_eq!(fs::read(&copy_path).expect("copy without source"), data);
    assert_eq!(vol.objects(), with_filler);
    mount.unmount();
}
