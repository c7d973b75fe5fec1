//! End-to-end: `sluice warmup` against a real mount — check, warm up, check,
//! evict, check — counting the blocks of a directory tree in the mount's
//! caches over its control socket; and the errors a user gets.

mod common;

use std::time::Duration;

use common::{Volume, Watchdog, sluice, sluice_ok, text};

#[test]
fn warmup_check_and_evict_through_a_mount() {
    let _dog = Watchdog::new("warmup", Duration::from_secs(300));
    // 1 MiB blocks: a 2.5 MiB file is 3 blocks, two small files 1 each.
    let vol = Volume::format("warm", &["--block-size", "1M"]);
    let mount = vol.mount("mnt");
    let data = mount.path.join("data");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("a.bin"), vec![7u8; (5 << 20) / 2]).unwrap();
    std::fs::write(data.join("sub/b.bin"), b"hello").unwrap();
    std::fs::write(data.join("sub/c.bin"), b"world").unwrap();
    std::fs::write(mount.path.join("outside.bin"), vec![1u8; 1 << 20]).unwrap();
    mount.unmount();
    // A fresh mount: nothing cached.
    let mount = vol.mount("mnt");
    let data = mount.path.join("data");
    let d = data.to_str().unwrap();
    let check = sluice_ok(&["warmup", "--check", "--quiet", d]);
    assert!(
        check.contains("3 files") && check.contains("0 of 5 blocks cached"),
        "{check}"
    );
    let warm = sluice_ok(&["warmup", "--threads", "2", "--quiet", d]);
    assert!(warm.contains("5 of 5 blocks cached"), "{warm}");
    let check = sluice_ok(&["warmup", "--check", "--quiet", d]);
    assert!(check.contains("5 of 5 blocks cached (100.0 %)"), "{check}");
    // One file of the tree, named directly.
    let one = data.join("sub/b.bin");
    let check = sluice_ok(&["warmup", "--check", "--quiet", one.to_str().unwrap()]);
    assert!(
        check.contains("1 files") && check.contains("1 of 1 blocks"),
        "{check}"
    );
    let evict = sluice_ok(&["warmup", "--evict", "--quiet", d]);
    assert!(evict.contains("dropped 5 cached blocks"), "{evict}");
    let check = sluice_ok(&["warmup", "--check", "--quiet", d]);
    assert!(check.contains("0 of 5 blocks cached"), "{check}");
    // The data is still all there, read through the mount.
    assert_eq!(
        std::fs::read(data.join("a.bin")).unwrap(),
        vec![7u8; (5 << 20) / 2]
    );
    // Errors: a path outside any sluice mount, one that does not exist.
    let out = sluice(&["warmup", "/tmp"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("not inside a sluice mount"),
        "{}",
        text(&out)
    );
    let missing = data.join("missing");
    let out = sluice(&["warmup", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("cannot stat"), "{}", text(&out));
    let out = sluice(&["warmup", "--serve-socket", "/nonexistent/vm.sock", "x"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("control socket"), "{}", text(&out));
    mount.unmount();
}
