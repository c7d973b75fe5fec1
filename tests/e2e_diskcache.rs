//! End-to-end: the disk block cache of `sluice mount --cache-dir`, through the
//! real binary and a kernel FUSE mount. Written blocks land in the cache dir
//! in JuiceFS's layout; a remount reuses them (the rescan finds them, reads
//! hit); a damaged cache file is detected and dropped, and the data still
//! reads correctly from the object store.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Mount, Volume, Watchdog, seed, walk_files};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

fn mount_cached(vol: &Volume, cache: &Path) -> Mount {
    let mnt = vol.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("a mount point");
    let cache = cache.to_str().expect("UTF-8").to_owned();
    Mount::start(
        &vol.meta_url,
        &mnt,
        &vol.dir.path().join("mnt.log"),
        // The test host's disk may be fuller than the default 10% reserve.
        &["--cache-dir", &cache, "--free-space-ratio", "0"],
    )
}

/// The numbers of the last "disk cache: N hits ..." line of a log.
fn counters(log: &str) -> (u64, u64, u64) {
    let line = log
        .lines()
        .rfind(|l| l.contains("disk cache: ") && l.contains(" hits ("))
        .unwrap_or_else(|| panic!("no disk cache counters in the log: {log}"));
    let num = |word: &str| -> u64 {
        let at = line
            .find(word)
            .unwrap_or_else(|| panic!("{word} in {line}"));
        line[..at]
            .split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a number before {word} in {line}"))
    };
    (num(" hits ("), num(" inserts"), num(" dropped"))
}

#[test]
fn blocks_are_cached_reused_after_a_remount_and_a_damaged_copy_is_dropped() {
    let _dog = Watchdog::new("e2e_diskcache", Duration::from_secs(300));
    let mut data = vec![0u8; 10 << 20];
    StdRng::seed_from_u64(seed("diskcache")).fill_bytes(&mut data);
    let vol = Volume::format("dcache", &[]);
    let cache = vol.dir.path().join("cache");

    let mount = mount_cached(&vol, &cache);
    let path = mount.path.join("data");
    std::fs::write(&path, &data).expect("write");
    assert!(std::fs::read(&path).expect("read") == data);
    let log = mount.log.clone();
    mount.unmount();
    let (_, inserts, _) = counters(&std::fs::read_to_string(&log).unwrap());

    // DIR/<uuid>/raw/chunks/..., one file per block object, named alike.
    let uuids: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().collect();
    assert_eq!(uuids.len(), 1, "one volume under {}", cache.display());
    let raw = uuids[0].path().join("raw");
    let mut cached = Vec::new();
    walk_files(&raw.join("chunks"), &mut cached);
    cached.sort();
    let objects = vol.objects();
    let name = |p: &PathBuf| p.file_name().unwrap().to_owned();
    assert_eq!(
        cached.iter().map(name).collect::<Vec<_>>(),
        objects.iter().map(name).collect::<Vec<_>>(),
        "every written block is cached"
    );
    // A read racing the queued insert of a block it just wrote misses and
    // inserts it again (same file): at least one insert per object.
    assert!(inserts >= objects.len() as u64, "{inserts} inserts");

    // Damage the cached copy of a full block, in its middle.
    let victim = cached
        .iter()
        .find(|p| p.to_string_lossy().ends_with("_4194304"))
        .expect("a full 4 MiB block")
        .clone();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&victim)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 2 << 20).unwrap();
    b[0] ^= 0x20;
    f.write_all_at(&b, 2 << 20).unwrap();
    drop(f);

    let mount = mount_cached(&vol, &cache);
    assert!(
        std::fs::read(mount.path.join("data")).expect("read after remount") == data,
        "the data reads correctly despite the damaged cache file"
    );
    let log = mount.log.clone();
    mount.unmount();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("rescan found {} cached blocks", objects.len())),
        "the remount finds the cache: {text}"
    );
    let victim_name = victim.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        text.lines()
            .any(|l| l.contains("dropping") && l.contains(&victim_name) && l.contains("CRC32C")),
        "the log names the dropped cache file: {text}"
    );
    let (hits, _, dropped) = counters(&text);
    assert_eq!(dropped, 1, "{text}");
    assert!(
        hits >= objects.len() as u64 - 1,
        "intact blocks hit: {text}"
    );
    // The dropped block was fetched again and cached whole: the cache file
    // starts with the object's bytes (its trailer follows).
    let bytes = std::fs::read(&victim).expect("recached");
    let object = objects
        .iter()
        .find(|p| p.file_name() == victim.file_name())
        .expect("the victim's object");
    let want = std::fs::read(object).expect("read the object");
    assert!(
        bytes.len() > want.len() && bytes[..want.len()] == want[..],
        "the recached copy of {victim_name} holds the object"
    );
}
