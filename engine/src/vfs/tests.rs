//! Vfs tests on real SQLite volumes in temporary directories.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};
use sha2::{Digest, Sha256};

use super::*;
use crate::format::Compression;
use crate::gc::collect_garbage;
use crate::meta::{ROOT_INO, open_meta};
use crate::object::ObjectStore;
use crate::volume::{format_volume, open_volume};

struct TestVol {
    dir: tempfile::TempDir,
    vfs: Vfs,
}

const MIB: u64 = 1 << 20;

fn ctx() -> Context {
    Context::default()
}

fn open_vol(dir: &std::path::Path, cfg: VfsConfig) -> Vfs {
    let meta = open_meta(&format!("sqlite3://{}/meta.db", dir.display())).unwrap();
    Vfs::new(open_volume(meta).unwrap(), cfg).unwrap()
}

fn setup_with(block_kib: u32, compression: Compression, cfg: VfsConfig) -> TestVol {
    let dir = tempfile::tempdir().unwrap();
    let meta = open_meta(&format!("sqlite3://{}/meta.db", dir.path().display())).unwrap();
    format_volume(&*meta, "test", &dir.path().join("bucket"), block_kib, compression, 0).unwrap();
    drop(meta);
    let vfs = open_vol(dir.path(), cfg);
    TestVol { dir, vfs }
}

fn test_cfg() -> VfsConfig {
    VfsConfig {
        cache_bytes: 64 << 20,
        cleanup_interval: None,
        ..VfsConfig::default()
    }
}

fn setup() -> TestVol {
    setup_with(1024, Compression::None, test_cfg())
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

impl TestVol {
    fn create(&self, name: &str) -> (Ino, Fh) {
        let (e, out) = self
            .vfs
            .create(&ctx(), ROOT_INO, name.as_bytes(), 0o644, 0o022, libc::O_RDWR as u32)
            .unwrap();
        (e.inode, out.fh)
    }

    fn write(&self, ino: Ino, fh: Fh, off: u64, data: &[u8]) {
        // In pieces of at most 128 KiB, as the kernel sends them.
        for (i, part) in data.chunks(128 << 10).enumerate() {
            let n = self
                .vfs
                .write(&ctx(), ino, fh, off + (i as u64) * (128 << 10), part)
                .unwrap();
            assert_eq!(n, part.len());
        }
    }

    fn read(&self, ino: Ino, fh: Fh, off: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0xAAu8; len];
        let n = self.vfs.read(&ctx(), ino, fh, off, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn objects(&self) -> Vec<String> {
        self.vfs
            .volume()
            .store
            .list("test/chunks/")
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect()
    }
}

#[test]
fn writes_across_block_and_chunk_boundaries() {
    let t = setup();
    let (ino, fh) = t.create("f");
    let a = random(3 * MIB as usize + 12_345, 1);
    t.write(ino, fh, 0, &a);
    let start = CHUNK_SIZE - 1_000_000;
    let b = random(2_500_000, 2);
    t.write(ino, fh, start, &b);
    // Read-your-writes before anything is flushed; the length counts them.
    assert_eq!(t.vfs.getattr(&ctx(), ino).unwrap().length, start + b.len() as u64);
    assert_eq!(t.read(ino, fh, 0, a.len()), a);
    t.vfs.release(&ctx(), ino, fh).unwrap();

    let out = t.vfs.open(&ctx(), ino, libc::O_RDONLY as u32).unwrap();
    assert_eq!(out.attr.length, start + b.len() as u64);
    assert_eq!(t.read(ino, out.fh, 0, a.len()), a);
    assert_eq!(t.read(ino, out.fh, start, b.len()), b);
    // Across the chunk boundary, unaligned.
    assert_eq!(t.read(ino, out.fh, CHUNK_SIZE - 10, 20), b[999_990..1_000_010]);
    // The gap between the writes reads as zeros.
    assert!(t.read(ino, out.fh, a.len() as u64, 1 << 20).iter().all(|&x| x == 0));
    // Reads stop at the end of the file.
    assert_eq!(t.read(ino, out.fh, start + b.len() as u64 - 5, 100).len(), 5);
    assert!(t.read(ino, out.fh, start + b.len() as u64 + 5, 100).is_empty());
    // 1 MiB blocks: a is 4 blocks, b is split into two slices (one per chunk).
    assert_eq!(t.objects().len(), 4 + 1 + 2);
    t.vfs.release(&ctx(), ino, out.fh).unwrap();
}

#[test]
fn overwrites_and_read_your_writes() {
    let t = setup();
    let (ino, fh) = t.create("f");
    let mut model = random(300_000, 3);
    t.write(ino, fh, 0, &model);
    t.vfs.flush(&ctx(), ino, fh).unwrap();
    for (i, (off, len)) in [(100_000usize, 50_000usize), (10, 5), (290_000, 20_000), (0, 1)]
        .into_iter()
        .enumerate()
    {
        let patch = random(len, 10 + i as u64);
        t.write(ino, fh, off as u64, &patch);
        if model.len() < off + len {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&patch);
        assert_eq!(t.read(ino, fh, 0, model.len() + 10), model, "after write {i}");
    }
    t.vfs.fsync(&ctx(), ino, fh, false).unwrap();
    t.vfs.release(&ctx(), ino, fh).unwrap();
    // A new Vfs on the same volume sees the same bytes.
    t.vfs.destroy();
    let vfs2 = open_vol(t.dir.path(), test_cfg());
    let out = vfs2.open(&ctx(), ino, libc::O_RDONLY as u32).unwrap();
    let mut buf = vec![0u8; model.len()];
    assert_eq!(vfs2.read(&ctx(), ino, out.fh, 0, &mut buf).unwrap(), model.len());
    assert_eq!(buf, model);
    vfs2.release(&ctx(), ino, out.fh).unwrap();
    vfs2.destroy();
}

#[test]
fn sparse_files_and_seek_data_hole() {
    let t = setup();
    let (ino, fh) = t.create("sparse");
    let data = random(1000, 4);
    let at = 10 * MIB;
    t.write(ino, fh, at, &data);
    t.vfs.flush(&ctx(), ino, fh).unwrap();
    assert_eq!(t.vfs.getattr(&ctx(), ino).unwrap().length, at + 1000);
    let head = t.read(ino, fh, 0, at as usize);
    assert!(head.iter().all(|&x| x == 0));
    assert_eq!(t.read(ino, fh, at, 1000), data);
    let seek = |off, whence: i32| t.vfs.lseek(&ctx(), ino, fh, off, whence as u32);
    assert_eq!(seek(0, libc::SEEK_DATA).unwrap(), at);
    assert_eq!(seek(0, libc::SEEK_HOLE).unwrap(), 0);
    assert_eq!(seek(at + 10, libc::SEEK_HOLE).unwrap(), at + 1000);
    assert_eq!(seek(at + 10, libc::SEEK_DATA).unwrap(), at + 10);
    assert_eq!(seek(at + 1000, libc::SEEK_DATA).unwrap_err().errno(), libc::ENXIO);
    // Grow past a chunk: the tail is a hole, data is still only at `at`.
    t.vfs
        .setattr(&ctx(), ino, Some(fh), &SetAttr::default(), Some(CHUNK_SIZE + 5))
        .unwrap();
    assert_eq!(seek(at + 1000, libc::SEEK_DATA).unwrap_err().errno(), libc::ENXIO);
    assert_eq!(seek(at + 1000, libc::SEEK_HOLE).unwrap(), at + 1000);
    assert!(t.read(ino, fh, CHUNK_SIZE - 3, 100).iter().all(|&x| x == 0));
    assert_eq!(t.read(ino, fh, CHUNK_SIZE - 3, 100).len(), 8);
    t.vfs.release(&ctx(), ino, fh).unwrap();
}

#[test]
fn truncate_shrinks_and_grows_with_zeros() {
    let t = setup();
    let (ino, fh) = t.create("t");
    let data = random(2 * MIB as usize, 5);
    t.write(ino, fh, 0, &data);
    // Truncate with writes still buffered: they land first, then the cut.
    let a = t
        .vfs
        .setattr(&ctx(), ino, Some(fh), &SetAttr::default(), Some(100_000))
        .unwrap();
    assert_eq!(a.length, 100_000);
    assert_eq!(t.read(ino, fh, 0, 200_000), data[..100_000]);
    let a = t
        .vfs
        .setattr(&ctx(), ino, Some(fh), &SetAttr::default(), Some(3 * MIB))
        .unwrap();
    assert_eq!(a.length, 3 * MIB);
    let all = t.read(ino, fh, 0, 3 * MIB as usize);
    assert_eq!(all.len(), 3 * MIB as usize);
    assert_eq!(all[..100_000], data[..100_000]);
    assert!(all[100_000..].iter().all(|&x| x == 0), "regrown bytes are zeros");
    // Writing after the shrink point still works.
    t.write(ino, fh, 150_000, b"tail");
    assert_eq!(t.read(ino, fh, 149_999, 6), b"\0tail\0");
    t.vfs
        .setattr(&ctx(), ino, Some(fh), &SetAttr::default(), Some(0))
        .unwrap();
    assert!(t.read(ino, fh, 0, 10).is_empty());
    t.vfs.release(&ctx(), ino, fh).unwrap();
}

#[test]
fn fallocate_punch_hole_and_extend() {
    let t = setup();
    let (ino, fh) = t.create("fa");
    let data = random(MIB as usize, 6);
    t.write(ino, fh, 0, &data);
    let punch = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
    t.vfs.fallocate(&ctx(), ino, fh, punch, 1000, 5000).unwrap();
    let got = t.read(ino, fh, 0, MIB as usize);
    assert_eq!(got.len(), MIB as usize);
    assert_eq!(got[..1000], data[..1000]);
    assert!(got[1000..6000].iter().all(|&x| x == 0));
    assert_eq!(got[6000..], data[6000..]);
    // Plain fallocate past the end grows the file with zeros.
    t.vfs.fallocate(&ctx(), ino, fh, 0, MIB, 4096).unwrap();
    assert_eq!(t.vfs.getattr(&ctx(), ino).unwrap().length, MIB + 4096);
    assert!(t.read(ino, fh, MIB, 4096).iter().all(|&x| x == 0));
    t.vfs.release(&ctx(), ino, fh).unwrap();
}

#[test]
fn concurrent_writers_on_distinct_files() {
    let t = setup();
    let files: Vec<_> = (0..4).map(|i| t.create(&format!("c{i}"))).collect();
    std::thread::scope(|s| {
        for (i, &(ino, fh)) in files.iter().enumerate() {
            let t = &t;
            s.spawn(move || {
                let data = random(3 * MIB as usize, 100 + i as u64);
                t.write(ino, fh, 0, &data);
                t.vfs.release(&ctx(), ino, fh).unwrap();
            });
        }
    });
    for (i, &(ino, _)) in files.iter().enumerate() {
        let out = t.vfs.open(&ctx(), ino, libc::O_RDONLY as u32).unwrap();
        assert_eq!(t.read(ino, out.fh, 0, 4 * MIB as usize), random(3 * MIB as usize, 100 + i as u64));
        t.vfs.release(&ctx(), ino, out.fh).unwrap();
    }
}

#[test]
fn compressed_volumes_round_trip() {
    for c in [Compression::Lz4, Compression::Zstd] {
        let t = setup_with(1024, c, test_cfg());
        let (ino, fh) = t.create("z");
        let mut data = random(MIB as usize, 7);
        data.extend(std::iter::repeat_n(b'z', 2 * MIB as usize));
        t.write(ino, fh, 0, &data);
        t.vfs.release(&ctx(), ino, fh).unwrap();
        let out = t.vfs.open(&ctx(), ino, libc::O_RDONLY as u32).unwrap();
        assert_eq!(t.read(ino, out.fh, 0, data.len()), data, "{c:?}");
        // The zero-entropy blocks were stored compressed.
        let stored: u64 = t.vfs.volume().store.list("test/chunks/").unwrap().iter().map(|o| o.size).sum();
        assert!(stored < 2 * MIB, "{c:?} stored {stored} bytes");
        t.vfs.release(&ctx(), ino, out.fh).unwrap();
    }
}

/// Waits until `cond` holds, failing after a generous deadline (no timing
/// is asserted: the deadline only keeps a broken build from hanging).
fn wait_for(mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(Instant::now() < deadline, "condition never became true");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn compaction_keeps_content_and_deletes_old_objects() {
    let t = setup();
    let (ino, fh) = t.create("frag");
    let mut model = vec![0u8; 400_000];
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    for i in 0..COMPACT_THRESHOLD + 4 {
        let off = rng.random_range(0..390_000usize);
        let len = rng.random_range(1..10_000usize);
        let patch = random(len, 200 + i as u64);
        model[off..off + len].copy_from_slice(&patch);
        t.write(ino, fh, off as u64, &patch);
        // Each flush commits one slice.
        t.vfs.flush(&ctx(), ino, fh).unwrap();
    }
    let end = t.vfs.getattr(&ctx(), ino).unwrap().length as usize;
    model.truncate(end);
    let meta = t.vfs.volume().meta.clone();
    wait_for(|| meta.read_chunk(ino, 0).unwrap().len() < COMPACT_THRESHOLD);
    let slices = meta.read_chunk(ino, 0).unwrap();
    assert!(slices.len() <= 5, "{slices:?}");
    assert_eq!(t.read(ino, fh, 0, end + 10), model);
    // Only the objects of the remaining slices are left.
    let mut want: Vec<String> = slices
        .iter()
        .filter(|s| s.id != 0)
        .flat_map(|s| crate::block_key::slice_keys("test", s.id, s.size, 1 << 20))
        .collect();
    want.sort();
    wait_for(|| t.objects() == want);
    t.vfs.release(&ctx(), ino, fh).unwrap();
}

#[test]
fn gc_removes_orphans_and_keeps_referenced_objects() {
    let t = setup();
    let (ino, fh) = t.create("g");
    let data = random(2 * MIB as usize + 5, 9);
    t.write(ino, fh, 0, &data);
    t.vfs.release(&ctx(), ino, fh).unwrap();
    let store = t.vfs.volume().store.clone();
    let orphan = crate::block_key::block_key("test", 999_999, 0, 3);
    store.put(&orphan, b"abc", None).unwrap();
    // Young orphans are spared: they may belong to a slice being written.
    let r = collect_garbage(t.vfs.volume(), Duration::from_secs(3600), false).unwrap();
    assert_eq!((r.scanned, r.referenced, r.too_recent), (4, 3, 1));
    assert!(r.orphans.is_empty());
    let r = collect_garbage(t.vfs.volume(), Duration::ZERO, false).unwrap();
    assert_eq!(r.orphans, [orphan.clone()]);
    assert_eq!(r.orphan_bytes, 3);
    assert!(store.head(&orphan).is_err());
    assert_eq!(t.objects().len(), 3);
    let out = t.vfs.open(&ctx(), ino, libc::O_RDONLY as u32).unwrap();
    assert_eq!(t.read(ino, out.fh, 0, data.len()), data);
    t.vfs.release(&ctx(), ino, out.fh).unwrap();
}

#[test]
fn unlinked_files_release_their_objects() {
    let t = setup();
    let (ino, fh) = t.create("u");
    t.write(ino, fh, 0, &random(MIB as usize + 1, 11));
    t.vfs.release(&ctx(), ino, fh).unwrap();
    assert_eq!(t.objects().len(), 2);
    t.vfs.unlink(&ctx(), ROOT_INO, b"u").unwrap();
    t.vfs.volume().meta.cleanup().unwrap();
    wait_for(|| t.objects().is_empty());
}

#[test]
fn directories_and_handles() {
    let t = setup();
    let d = t.vfs.mkdir(&ctx(), ROOT_INO, b"dir", 0o755, 0o022).unwrap();
    for i in 0..5 {
        let (e, out) = t
            .vfs
            .create(&ctx(), d.inode, format!("f{i}").as_bytes(), 0o644, 0, libc::O_WRONLY as u32)
            .unwrap();
        t.vfs.write(&ctx(), e.inode, out.fh, 0, b"x").unwrap();
        // Writing through a read-only handle is refused.
        let ro = t.vfs.open(&ctx(), e.inode, libc::O_RDONLY as u32).unwrap();
        assert_eq!(t.vfs.write(&ctx(), e.inode, ro.fh, 0, b"y").unwrap_err().errno(), libc::EBADF);
        t.vfs.release(&ctx(), e.inode, ro.fh).unwrap();
        t.vfs.release(&ctx(), e.inode, out.fh).unwrap();
    }
    let fh = t.vfs.opendir(&ctx(), d.inode).unwrap();
    let all = t.vfs.readdir(&ctx(), d.inode, fh, 0, true).unwrap();
    assert_eq!(all.len(), 7);
    assert_eq!(all[0].name, b".");
    assert!(all[2..].iter().all(|e| e.attr.length == 1));
    let rest = t.vfs.readdir(&ctx(), d.inode, fh, 4, false).unwrap();
    assert_eq!(rest.len(), 3);
    assert!(rest.iter().zip(&all[4..]).all(|(a, b)| a.name == b.name && a.inode == b.inode));
    t.vfs.releasedir(&ctx(), d.inode, fh).unwrap();
    assert_eq!(t.vfs.readdir(&ctx(), d.inode, fh, 0, false).unwrap_err().errno(), libc::EBADF);
    assert_eq!(t.vfs.opendir(&ctx(), all[2].inode).unwrap_err().errno(), libc::ENOTDIR);
    let l = t.vfs.symlink(&ctx(), ROOT_INO, b"ln", b"dir/f0").unwrap();
    assert_eq!(t.vfs.readlink(&ctx(), l.inode).unwrap(), b"dir/f0");
    assert_eq!(t.vfs.lookup(&ctx(), d.inode, b"f3").unwrap().attr.length, 1);
}

#[test]
fn large_random_file_round_trip() {
    let t = setup_with(4096, Compression::None, test_cfg());
    let (ino, fh) = t.create("big");
    const LEN: usize = 300 << 20;
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut off = 0;
    while off < LEN {
        rng.fill_bytes(&mut buf);
        hasher.update(&buf);
        t.write(ino, fh, off as u64, &buf);
        off += buf.len();
    }
    let want = hasher.finalize();
    t.vfs.release(&ctx(), ino, fh).unwrap();
    let out = t.vfs.open(&ctx(), ino, libc::O_RDONLY as u32).unwrap();
    assert_eq!(out.attr.length, LEN as u64);
    let mut hasher = Sha256::new();
    let mut off = 0u64;
    let mut part = vec![0u8; 1 << 20];
    loop {
        let n = t.vfs.read(&ctx(), ino, out.fh, off, &mut part).unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&part[..n]);
        off += n as u64;
    }
    assert_eq!(off, LEN as u64);
    assert_eq!(hasher.finalize(), want);
    t.vfs.release(&ctx(), ino, out.fh).unwrap();
}
