//! The order the data path keeps so that a power loss never leaves metadata
//! naming an object that is not on disk: every object a commit names was
//! made durable (`ObjectStore::sync_objects` of its key) before the commit,
//! on the write path (small files, full blocks uploaded while writing,
//! several slices in one flush, closes that do not wait for their group)
//! and in compaction; `fsync` ends with the metadata sync.
//!
//! A recording store sits in front of the volume's `file` bucket. Each time
//! it is asked to sync, it notes the keys and which slices the metadata
//! names at that moment; afterwards every slice the metadata names must
//! have had all its objects put, then synced by a sync that found it not
//! yet committed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use sluice_engine::Result;
use sluice_engine::block_key::{parse_block_key, slice_keys};
use sluice_engine::format::Compression;
use sluice_engine::meta::{Context, Meta, ROOT_INO, open_meta};
use sluice_engine::object::{FileStore, ObjectInfo, ObjectStore, Unsynced};
use sluice_engine::vfs::Filesystem as _;
use sluice_engine::vfs::{Vfs, VfsConfig};
use sluice_engine::volume::{format_volume, open_volume};

#[derive(Debug)]
enum Event {
    Put(String),
    /// A sync of some keys, with the slice ids the metadata named when it
    /// started.
    Sync(HashSet<String>, HashSet<u64>),
}

#[derive(Debug)]
struct Recorder {
    inner: FileStore,
    meta: Arc<dyn Meta>,
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    fn committed(&self) -> HashSet<u64> {
        self.meta
            .list_chunks()
            .expect("list chunks")
            .into_iter()
            .flat_map(|(_, _, slices)| slices)
            .filter(|s| s.id != 0)
            .map(|s| s.id)
            .collect()
    }
}

impl ObjectStore for Recorder {
    fn describe(&self) -> String {
        format!("recorder of {}", self.inner.describe())
    }
    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
        self.inner.put(key, data, crc)?;
        self.events.lock().push(Event::Put(key.to_string()));
        Ok(())
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
        self.inner.get_range(key, off, len)
    }
    fn head(&self, key: &str) -> Result<ObjectInfo> {
        self.inner.head(key)
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
    fn needs_sync(&self) -> bool {
        self.inner.needs_sync()
    }
    fn sync_objects(&self, keys: &[String]) -> std::result::Result<(), Unsynced> {
        // Held across the metadata read, so a put recorded after this sync
        // is never mistaken for one it covered.
        let mut events = self.events.lock();
        events.push(Event::Sync(
            keys.iter().cloned().collect(),
            self.committed(),
        ));
        self.inner.sync_objects(keys)
    }
}

/// Checks that every slice the metadata names had all its objects put, and
/// then a sync that started before the slice was committed.
fn assert_synced_before_committed(rec: &Recorder, name: &str, block_size: u32) {
    let events = rec.events.lock();
    let mut put_at: HashMap<&str, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Event::Put(k) = e {
            put_at.insert(k, i);
        }
    }
    let slices: HashMap<u64, u32> = rec
        .meta
        .list_chunks()
        .expect("list chunks")
        .into_iter()
        .flat_map(|(_, _, s)| s)
        .filter(|s| s.id != 0)
        .map(|s| (s.id, s.size))
        .collect();
    assert!(!slices.is_empty());
    for (id, size) in slices {
        let keys = slice_keys(name, id, size, block_size);
        let last_put = keys
            .iter()
            .map(|k| {
                *put_at
                    .get(k.as_str())
                    .unwrap_or_else(|| panic!("object {k} of slice {id} was never put"))
            })
            .max()
            .expect("a slice has objects");
        let synced = events[last_put..].iter().any(|e| {
            matches!(e, Event::Sync(synced, committed)
                if !committed.contains(&id) && keys.iter().all(|k| synced.contains(k)))
        });
        assert!(
            synced,
            "slice {id} was committed without a sync after its objects were put"
        );
    }
}

#[test]
fn objects_are_synced_before_the_commit_that_names_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite3://{}/meta.db", dir.path().display());
    let meta = open_meta(&url).expect("meta");
    let bucket = dir.path().join("bucket");
    // 1 MiB blocks, so a few MiB make full blocks that upload while written.
    format_volume(&*meta, "dur", &bucket, 1024, Compression::None, 0).expect("format");
    let vol = open_volume(meta.clone()).expect("open");
    let rec = Arc::new(Recorder {
        inner: FileStore::new(&bucket).expect("store"),
        meta: meta.clone(),
        events: Mutex::new(Vec::new()),
    });
    let vfs = Vfs::new(
        vol.with_store(rec.clone()),
        VfsConfig {
            cache_bytes: 64 << 20,
            cleanup_interval: None,
            ..VfsConfig::default()
        },
    )
    .expect("vfs");
    let ctx = Context::default();
    let create = |name: &str| {
        let (e, out) = vfs
            .create(
                &ctx,
                ROOT_INO,
                name.as_bytes(),
                0o644,
                0o022,
                libc::O_RDWR as u32,
            )
            .expect("create");
        (e.inode, out.fh)
    };
    // A small file, fsync'ed.
    let (small, fh) = create("small");
    vfs.write_buf(&ctx, small, fh, 0, b"hello", false)
        .expect("write");
    vfs.fsync(&ctx, small, fh, false).expect("fsync");
    vfs.release(&ctx, small, fh).expect("close");
    // 3.5 MiB: three full blocks stored while writing, the rest at close.
    let (big, fh) = create("big");
    let data: Vec<u8> = (0..(7u32 << 19)).map(|i| (i % 251) as u8).collect();
    for (i, part) in data.chunks(256 << 10).enumerate() {
        vfs.write_buf(&ctx, big, fh, (i as u64) * (256 << 10), part, false)
            .expect("write");
    }
    vfs.release(&ctx, big, fh).expect("close");
    // Scattered writes: many slices in one flush, then compaction (a chunk
    // of 16 slices or more is compacted in the background).
    let (frag, fh) = create("frag");
    for i in (0..20u64).rev() {
        vfs.write_buf(&ctx, frag, fh, i * 8192, &[i as u8; 4096], false)
            .expect("write");
    }
    vfs.flush(&ctx, frag, fh).expect("flush");
    let deadline = Instant::now() + Duration::from_secs(30);
    while meta.read_chunk(frag, 0).expect("chunk").len() > 1 {
        assert!(Instant::now() < deadline, "the chunk was never compacted");
        std::thread::sleep(Duration::from_millis(20));
    }
    vfs.fsync(&ctx, frag, fh, false).expect("fsync");
    vfs.release(&ctx, frag, fh).expect("close");
    // Small files closed from several threads at once, without fsync: the
    // closes do not wait for their groups, which still sync first.
    std::thread::scope(|s| {
        for t in 0..8 {
            let (vfs, ctx, create) = (&vfs, &ctx, &create);
            s.spawn(move || {
                for i in 0..20 {
                    let (ino, fh) = create(&format!("burst-{t}-{i}"));
                    vfs.write_buf(ctx, ino, fh, 0, &[t as u8; 3000], false)
                        .expect("write");
                    vfs.release(ctx, ino, fh).expect("close");
                }
            });
        }
    });
    // syncfs waits for every group a close handed its commit to.
    vfs.syncfs(&ctx).expect("syncfs");
    assert_eq!(
        meta.list_chunks().expect("list").len(),
        3 + 8 * 20,
        "every file closed is committed after syncfs"
    );
    assert_synced_before_committed(&rec, "dur", 1 << 20);
    // The objects of every slice the metadata names are where it says.
    for (_, _, slices) in meta.list_chunks().expect("list") {
        for s in slices.iter().filter(|s| s.id != 0) {
            for key in slice_keys("dur", s.id, s.size, 1 << 20) {
                let (_, _, len) = parse_block_key(&key).expect("a block key");
                assert_eq!(rec.head(&key).expect("object").size, u64::from(len));
            }
        }
    }
}

/// A bucket whose syncs fail for every object while `failing` is set, as a
/// disk that returns EIO on write-back.
#[derive(Debug)]
struct FailingSyncs {
    inner: FileStore,
    failing: std::sync::atomic::AtomicBool,
}

impl ObjectStore for FailingSyncs {
    fn describe(&self) -> String {
        "failing syncs".into()
    }
    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
        self.inner.put(key, data, crc)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
        self.inner.get_range(key, off, len)
    }
    fn head(&self, key: &str) -> Result<ObjectInfo> {
        self.inner.head(key)
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
    fn needs_sync(&self) -> bool {
        true
    }
    fn sync_objects(&self, keys: &[String]) -> std::result::Result<(), Unsynced> {
        if !self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return self.inner.sync_objects(keys);
        }
        Err(Unsynced(
            keys.iter()
                .enumerate()
                .map(|(i, k)| {
                    (
                        i,
                        sluice_engine::Error::Object {
                            key: k.clone(),
                            source: std::io::Error::from_raw_os_error(libc::EIO),
                        },
                    )
                })
                .collect(),
        ))
    }
}

#[test]
fn a_failed_object_sync_fails_the_fsync_that_covered_it_and_no_other() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite3://{}/meta.db", dir.path().display());
    let meta = open_meta(&url).expect("meta");
    let bucket = dir.path().join("bucket");
    format_volume(&*meta, "err", &bucket, 1024, Compression::None, 0).expect("format");
    let vol = open_volume(meta.clone()).expect("open");
    let store = Arc::new(FailingSyncs {
        inner: FileStore::new(&bucket).expect("store"),
        failing: std::sync::atomic::AtomicBool::new(false),
    });
    let vfs = Vfs::new(
        vol.with_store(store.clone()),
        VfsConfig {
            cleanup_interval: None,
            ..VfsConfig::default()
        },
    )
    .expect("vfs");
    let ctx = Context::default();
    let create = |name: &[u8]| {
        let (e, out) = vfs
            .create(&ctx, ROOT_INO, name, 0o644, 0o022, libc::O_RDWR as u32)
            .expect("create");
        (e.inode, out.fh)
    };
    let (a, fa) = create(b"a");
    vfs.write_buf(&ctx, a, fa, 0, b"first", false)
        .expect("write");
    vfs.fsync(&ctx, a, fa, false).expect("a clean fsync");
    // The disk fails while "a" is written again.
    store.failing.store(true, SeqCst);
    vfs.write_buf(&ctx, a, fa, 0, b"SECOND!", false)
        .expect("write");
    let err = vfs.fsync(&ctx, a, fa, false).expect_err("the failed sync");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    store.failing.store(false, SeqCst);
    // Another file carries on; the error was reported once.
    let (b, fb) = create(b"b");
    vfs.write_buf(&ctx, b, fb, 0, b"other", false)
        .expect("write");
    vfs.fsync(&ctx, b, fb, false).expect("b's fsync");
    vfs.fsync(&ctx, a, fa, false).expect("reported once");
    // What could not be made durable is dropped, as Linux drops pages
    // whose write-back failed: "a" holds what its clean fsync covered, and
    // no object of the failed commit is named or left behind.
    let mut got = vec![0u8; 16];
    let n = vfs.read_buf(&ctx, a, fa, 0, &mut got).expect("read");
    assert_eq!(&got[..n], b"first");
    vfs.release(&ctx, a, fa).expect("close");
    vfs.release(&ctx, b, fb).expect("close");
    vfs.syncfs(&ctx).expect("syncfs");
    let named: HashSet<String> = meta
        .list_chunks()
        .expect("list")
        .into_iter()
        .flat_map(|(_, _, s)| s)
        .filter(|s| s.id != 0)
        .flat_map(|s| slice_keys("err", s.id, s.size, 1 << 20))
        .collect();
    let stored: HashSet<String> = store
        .list("err/chunks/")
        .expect("list")
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(named, stored);
}
