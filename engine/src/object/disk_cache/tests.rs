//! The disk cache against a real directory store and real files.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use super::*;
use crate::object::FileStore;

const NAME: &str = "vol";
const UUID: &str = "0f1e2d3c-uuid";

fn key(id: u64, len: usize) -> String {
    format!("{NAME}/chunks/0/0/{id}_0_{len}")
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    cache_dir: PathBuf,
    inner: Arc<FileStore>,
}

fn fixture() -> Fixture {
    // The temp dir is tmpfs on some hosts: O_DIRECT then falls back to
    // buffered I/O, which these tests also accept.
    let dir = tempfile::tempdir().unwrap();
    let inner = Arc::new(FileStore::new(dir.path().join("bucket")).unwrap());
    Fixture {
        cache_dir: dir.path().join("cache"),
        inner,
        _dir: dir,
    }
}

fn config(f: &Fixture, capacity: u64) -> DiskCacheConfig {
    DiskCacheConfig::new(
        vec![CacheDir {
            path: f.cache_dir.clone(),
            node: None,
        }],
        capacity,
    )
}

/// Plenty of free space, whatever the test host's disk holds.
fn roomy() -> FreeSpaceProbe {
    Arc::new(|_: &Path| Ok((900 << 30, 1000 << 30)))
}

fn store(f: &Fixture, cfg: DiskCacheConfig) -> CachedStore {
    let cache = DiskCache::open_with_probe(NAME, UUID, cfg, roomy()).unwrap();
    cache.wait_rescan();
    CachedStore::new(f.inner.clone(), cache)
}

#[test]
fn a_miss_is_cached_and_the_next_read_hits() {
    let f = fixture();
    let s = store(&f, config(&f, 64 << 20));
    let data = pattern(100_000, 1);
    let k = key(1, data.len());
    f.inner.put(&k, &data, None).unwrap();
    assert_eq!(s.get(&k).unwrap(), data);
    s.cache().wait_idle();
    let c = s.cache().stats().snapshot();
    assert_eq!(
        (c.hits, c.misses, c.inserts, c.entries),
        (0, 1, 1, 1),
        "{c}"
    );
    let path = s.cache().path_of(&k).unwrap();
    assert!(path.starts_with(f.cache_dir.join(UUID).join("raw").join("chunks")));
    let file = fs::read(&path).unwrap();
    assert_eq!(
        file.len() as u64,
        data.len() as u64 + trailer_len(data.len() as u64)
    );
    assert_eq!(&file[..data.len()], &data[..]);
    assert_eq!(c.used_bytes, file.len() as u64);

    assert_eq!(s.get(&k).unwrap(), data);
    assert_eq!(s.get_range(&k, 50_000, 10).unwrap(), &data[50_000..50_010]);
    let c = s.cache().stats().snapshot();
    assert_eq!((c.hits, c.misses), (2, 1), "{c}");
    assert_eq!(c.hit_bytes, data.len() as u64 + 10);
    // Objects that are not blocks are never cached.
    let uuid_key = format!("{NAME}/juicefs_uuid");
    f.inner.put(&uuid_key, b"u", None).unwrap();
    assert_eq!(s.get(&uuid_key).unwrap(), b"u");
    s.cache().wait_idle();
    assert_eq!(s.cache().stats().snapshot().entries, 1);
}

#[test]
fn writes_are_cached_and_deletes_drop_the_copy() {
    let f = fixture();
    let s = store(&f, config(&f, 64 << 20));
    let data = pattern(5 << 20, 2);
    let k = key(2, data.len());
    s.put(&k, &data, None).unwrap();
    s.cache().wait_idle();
    let path = s.cache().path_of(&k).unwrap();
    assert!(path.exists());
    // Served from the cache even with the object gone from the bucket.
    fs::remove_file(f.inner.root().join(&k)).unwrap();
    assert_eq!(s.get(&k).unwrap(), data);
    // A written block was verified as it was written: ranged reads may take
    // the file itself.
    let file = s.local_file(&k).unwrap().unwrap();
    let mut b = [0u8; 3];
    file.read_exact_at(&mut b, 4 << 20).unwrap();
    assert_eq!(b, data[4 << 20..(4 << 20) + 3]);
    s.delete(&k).unwrap();
    assert!(!path.exists());
    assert_eq!(s.cache().stats().snapshot().entries, 0);
    assert!(s.get(&k).is_err());
}

#[test]
fn a_cached_file_comes_with_the_crcs_of_its_trailer() {
    let f = fixture();
    let data = pattern(100_000, 9);
    let k = key(9, data.len());
    let want: Vec<u32> = data
        .chunks(SEGMENT)
        .map(|c| sluice_simd::crc32c(0, c))
        .collect();
    {
        let s = store(&f, config(&f, 64 << 20));
        s.put(&k, &data, None).unwrap();
        s.cache().wait_idle();
        // Inserted: the CRCs were in hand.
        let cf = s.cached_file(&k, 10).unwrap().unwrap();
        let (crcs, payload) = cf.crcs.unwrap();
        assert_eq!((&crcs[..], payload), (&want[..], data.len() as u64));
    }
    // Found by the rescan: read from the trailer at the first use.
    let s = store(&f, config(&f, 64 << 20));
    let cf = s.cached_file(&k, 10).unwrap().unwrap();
    let (crcs, payload) = cf.crcs.unwrap();
    assert_eq!((&crcs[..], payload), (&want[..], data.len() as u64));
    let mut b = [0u8; 5];
    cf.file.read_exact_at(&mut b, 77_777).unwrap();
    assert_eq!(b, data[77_777..77_782]);
    let c = s.cache().stats().snapshot();
    assert_eq!((c.hits, c.hit_bytes), (1, 10), "{c}");
    // Under `none` no CRCs come with it.
    let mut cfg = config(&f, 64 << 20);
    cfg.verify = VerifyPolicy::None;
    drop(s);
    let s = store(&f, cfg);
    assert!(s.cached_file(&k, 10).unwrap().unwrap().crcs.is_none());
    // A miss is a miss.
    assert!(s.cached_file(&key(10, 5), 5).is_none());
}

#[test]
fn a_block_deleted_while_it_is_read_is_a_miss_not_damage() {
    let f = fixture();
    let s = store(&f, config(&f, 64 << 20));
    let data = pattern(10_000, 4);
    let k = key(4, data.len());
    s.put(&k, &data, None).unwrap();
    s.cache().wait_idle();
    let (shard, rel) = s.cache().locate(&k).unwrap();
    let path = shard.root.join(rel);
    // A read looked the block up; its object is deleted (a released
    // slice) before the read opens the file, which is gone with its entry.
    s.delete(&k).unwrap();
    let gone = io::Error::from(io::ErrorKind::NotFound);
    s.cache().lost_file(shard, rel, &path, &gone);
    assert_eq!(s.cache().stats().snapshot().dropped, 0);
    // Reads racing deletes of the very blocks they read: none of them
    // counts as damage, whatever the interleaving.
    let keys: Vec<String> = (100..164).map(|i| key(i, data.len())).collect();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for _ in 0..4 {
                for k in &keys {
                    s.put(k, &data, None).unwrap();
                }
                s.cache().wait_idle();
                for k in &keys {
                    s.delete(k).unwrap();
                }
            }
        });
        scope.spawn(|| {
            for _ in 0..40 {
                for k in &keys {
                    let _ = s.cached_file(k, 100);
                    let _ = s.cache().get(k);
                    let _ = s.cache().get_range(k, 5, 100);
                    let _ = s.cache().local_file(k);
                }
            }
        });
    });
    assert_eq!(s.cache().stats().snapshot().dropped, 0);
    // A cache file removed behind the cache's back (its entry is still
    // there) is a file lost: dropped, counted, and said in the log.
    s.put(&k, &data, None).unwrap();
    s.cache().wait_idle();
    fs::remove_file(&path).unwrap();
    assert!(s.cache().get(&k).is_none());
    let c = s.cache().stats().snapshot();
    assert_eq!((c.dropped, c.entries), (1, 0), "{c}");
}

#[test]
fn damaged_or_truncated_cache_files_are_dropped_and_refetched() {
    let f = fixture();
    let s = store(&f, config(&f, 64 << 20));
    let data = pattern(200_000, 3);
    let k = key(3, data.len());
    s.put(&k, &data, None).unwrap();
    s.cache().wait_idle();
    let path = s.cache().path_of(&k).unwrap();

    // One flipped bit in the payload.
    let mut bytes = fs::read(&path).unwrap();
    bytes[123_456] ^= 0x10;
    fs::write(&path, &bytes).unwrap();
    assert_eq!(s.get(&k).unwrap(), data);
    assert_eq!(s.cache().stats().snapshot().dropped, 1);
    s.cache().wait_idle();
    assert_eq!(fs::read(&path).unwrap()[..data.len()], data[..], "recached");

    // Cut short (a partial write that still got its name).
    let len = fs::metadata(&path).unwrap().len();
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    assert_eq!(s.get(&k).unwrap(), data);
    assert_eq!(s.get_range(&k, 7, 5).unwrap(), data[7..12]);
    let c = s.cache().stats().snapshot();
    assert_eq!(c.dropped, 2, "{c}");
    s.cache().wait_idle();
    assert_eq!(s.cache().stats().snapshot().entries, 1);
}

#[test]
fn eviction_keeps_the_cache_within_its_size() {
    for eviction in [Eviction::TwoRandom, Eviction::Lru, Eviction::None] {
        let f = fixture();
        let block = 64 << 10;
        let file_size = block + trailer_len(block as u64) as usize;
        let capacity = 10 * file_size as u64 + 1000;
        let s = store(
            &f,
            DiskCacheConfig {
                eviction,
                ..config(&f, capacity)
            },
        );
        let keys: Vec<_> = (0..100).map(|i| key(100 + i, block)).collect();
        for (i, k) in keys.iter().enumerate() {
            s.put(k, &pattern(block, i as u64), None).unwrap();
            if i == 0 && eviction == Eviction::Lru {
                s.cache().wait_idle();
            }
            if eviction == Eviction::Lru {
                // Keep the first block hot: LRU must never evict it.
                s.cache().wait_idle();
                assert!(s.cache().get(&keys[0]).is_some(), "{eviction:?} {i}");
            }
        }
        s.cache().wait_idle();
        let c = s.cache().stats().snapshot();
        assert!(c.used_bytes <= capacity, "{eviction:?}: {c}");
        assert_eq!(c.entries, 10, "{eviction:?}: {c}");
        let mut on_disk = Vec::new();
        walk(&f.cache_dir, &f.cache_dir, &mut on_disk);
        let disk_bytes: u64 = on_disk
            .iter()
            .map(|(p, _)| fs::metadata(p).unwrap().len())
            .sum();
        assert_eq!(on_disk.len(), 10, "{eviction:?}");
        assert!(disk_bytes <= capacity, "{eviction:?}");
        match eviction {
            Eviction::None => {
                assert_eq!((c.evictions, c.skipped), (0, 90), "{c}");
                assert!(s.cache().get(&keys[0]).is_some());
            }
            // Inserts still queued are not evictable: one that finds the
            // cache full of them is skipped rather than overrun the bound.
            _ => assert_eq!(c.evictions + c.skipped, 90, "{eviction:?}: {c}"),
        }
    }
}

#[test]
fn a_restart_finds_the_cache_and_drops_partial_files() {
    let f = fixture();
    let blocks: Vec<_> = (0..5)
        .map(|i| {
            (
                key(200 + i, 1000 + i as usize),
                pattern(1000 + i as usize, i),
            )
        })
        .collect();
    {
        let s = store(&f, config(&f, 64 << 20));
        for (k, d) in &blocks {
            s.put(k, d, None).unwrap();
        }
        s.cache().wait_idle();
    }
    let raw = f.cache_dir.join(UUID).join("raw").join("chunks/0/0");
    fs::write(raw.join(".299_0_10.tmp7"), b"half").unwrap();
    fs::write(raw.join("298_0_10"), b"no trailer here").unwrap();
    // A trailer claiming more bytes than the file has.
    let mut cut = pattern(10, 9);
    cut.extend_from_slice(&trailer(&pattern(20, 9))[..]);
    fs::write(raw.join("297_0_20"), &cut).unwrap();

    let s = store(&f, config(&f, 64 << 20));
    let c = s.cache().stats().snapshot();
    assert_eq!((c.entries, c.dropped), (5, 2), "{c}");
    assert!(!raw.join(".299_0_10.tmp7").exists());
    assert!(!raw.join("298_0_10").exists());
    assert!(!raw.join("297_0_20").exists());
    // Rescanned files are verified by their first read before ranged
    // readers get the file itself.
    assert!(s.cache().local_file(&blocks[0].0).is_none());
    for (k, d) in &blocks {
        fs::remove_file(f.inner.root().join(k)).unwrap();
        assert_eq!(&s.get(k).unwrap(), d);
    }
    assert!(s.cache().local_file(&blocks[0].0).is_some());
    assert_eq!(s.cache().stats().snapshot().hits, 5 + 1);
}

#[test]
fn verify_none_serves_rescanned_files_directly_and_checks_only_the_trailer() {
    let f = fixture();
    let cfg = DiskCacheConfig {
        verify: VerifyPolicy::None,
        ..config(&f, 64 << 20)
    };
    let data = pattern(70_000, 4);
    let k = key(300, data.len());
    {
        let s = store(&f, cfg.clone());
        s.put(&k, &data, None).unwrap();
    }
    let s = store(&f, cfg);
    assert!(s.cache().local_file(&k).is_some());
    let path = s.cache().path_of(&k).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    bytes[10] ^= 1;
    fs::write(&path, &bytes).unwrap();
    // Not detected: that is what `none` means.
    assert_eq!(s.get(&k).unwrap()[10], data[10] ^ 1);
}

#[test]
fn low_free_space_evicts_and_stops_caching() {
    let f = fixture();
    let free = Arc::new(AtomicU64::new(2 << 30));
    let probe_free = free.clone();
    let probe: FreeSpaceProbe =
        Arc::new(move |_: &Path| Ok((probe_free.load(Ordering::Relaxed), 10 << 30)));
    let cache = DiskCache::open_with_probe(NAME, UUID, config(&f, 1 << 30), probe).unwrap();
    cache.wait_rescan();
    let s = CachedStore::new(f.inner.clone(), cache);
    let block = 100_000;
    for i in 0..4 {
        s.put(&key(400 + i, block), &pattern(block, i), None)
            .unwrap();
    }
    s.cache().wait_idle();
    assert_eq!(s.cache().stats().snapshot().entries, 4);
    // 10% of 10 GiB must stay free: at exactly 1 GiB free an insert fits
    // once the cache gives back an older block of the same size.
    free.store(1 << 30, Ordering::Relaxed);
    s.put(&key(410, block), &pattern(block, 10), None).unwrap();
    s.cache().wait_idle();
    let c = s.cache().stats().snapshot();
    assert_eq!((c.entries, c.evictions, c.skipped), (4, 1, 0), "{c}");
    // Far below: the cache gives back all it holds, and still caches nothing.
    free.store(512 << 20, Ordering::Relaxed);
    s.put(&key(411, block), &pattern(block, 11), None).unwrap();
    s.cache().wait_idle();
    let c = s.cache().stats().snapshot();
    assert_eq!((c.entries, c.evictions, c.skipped), (0, 5, 1), "{c}");
    free.store(5 << 30, Ordering::Relaxed);
    s.put(&key(412, block), &pattern(block, 12), None).unwrap();
    s.cache().wait_idle();
    assert_eq!(s.cache().stats().snapshot().entries, 1);
}

/// The backends this host can run: always the pool, io_uring where it sets up.
fn backends() -> Vec<BackendChoice> {
    let mut out = vec![BackendChoice::Threads];
    let uring = ReactorConfig {
        backend: BackendChoice::Uring,
        ..ReactorConfig::default()
    };
    match Reactor::<()>::new(&uring) {
        Ok(_) => out.push(BackendChoice::Uring),
        Err(e) => eprintln!("io_uring unavailable here ({e}); checking the pool only"),
    }
    out
}

#[test]
fn io_uring_and_the_thread_pool_store_and_read_identical_bytes() {
    // Larger than the I/O buffer, not a multiple of any alignment.
    let data = pattern(IO_BUFFER + 3 * SEGMENT + 12_345, 5);
    let k = key(500, data.len());
    let mut files = Vec::new();
    for backend in backends() {
        let f = fixture();
        let s = store(
            &f,
            DiskCacheConfig {
                backend,
                ..config(&f, 64 << 20)
            },
        );
        s.put(&k, &data, None).unwrap();
        s.cache().wait_idle();
        fs::remove_file(f.inner.root().join(&k)).unwrap();
        assert!(s.get(&k).unwrap() == data, "{backend:?}");
        let file = fs::read(s.cache().path_of(&k).unwrap()).unwrap();
        assert_eq!(check_file(&file, VerifyPolicy::Full), Ok(data.len()));
        files.push(file);
    }
    assert!(files.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn cache_dir_lists_parse_with_optional_nodes() {
    let d = parse_cache_dirs("/nvme0/c@0:/nvme1/c@1:/mnt/a@b").unwrap();
    assert_eq!(
        d,
        vec![
            CacheDir {
                path: "/nvme0/c".into(),
                node: Some(0)
            },
            CacheDir {
                path: "/nvme1/c".into(),
                node: Some(1)
            },
            CacheDir {
                path: "/mnt/a@b".into(),
                node: None
            },
        ]
    );
    assert!(
        parse_cache_dirs("/a::/b")
            .unwrap_err()
            .contains("empty entry")
    );
    assert!(parse_cache_dirs("/a:/a@1").unwrap_err().contains("twice"));
    assert_eq!("lru".parse::<Eviction>(), Ok(Eviction::Lru));
    assert!(
        "fifo"
            .parse::<Eviction>()
            .unwrap_err()
            .contains("2-random, lru or none")
    );
    assert!("some".parse::<VerifyPolicy>().is_err());
}
