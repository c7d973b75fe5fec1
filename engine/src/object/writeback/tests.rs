use std::sync::atomic::AtomicUsize;

use super::*;
use crate::vfs::Filesystem as _;

const HOUR: Duration = Duration::from_secs(3600);

/// A bucket directory, a staging directory and the real store.
struct Setup {
    _dir: tempfile::TempDir,
    bucket: Arc<FileStore>,
    opts: WritebackOptions,
}

fn setup(delay: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let bucket = Arc::new(FileStore::new(dir.path().join("bucket")).unwrap());
    let opts = WritebackOptions {
        dir: dir.path().join("cache/uuid-1"),
        upload_delay: delay,
        max_uploads: 2,
    };
    Setup {
        _dir: dir,
        bucket,
        opts,
    }
}

fn key(i: u64) -> String {
    format!("vol/chunks/0/0/{i}_0_5")
}

/// Polls `cond` for up to 20 s.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn staged_blocks_read_back_before_their_upload() {
    let s = setup(HOUR);
    let wb = WritebackStore::open(s.bucket.clone(), &s.opts).unwrap();
    wb.put(&key(1), b"hello", None).unwrap();
    // Durable in staging, absent from the bucket, readable every way.
    let staged = s.opts.dir.join(STAGING_DIR).join(key(1));
    assert_eq!(fs::read(&staged).unwrap(), b"hello");
    assert!(is_not_found(&s.bucket.get(&key(1)).unwrap_err()));
    assert_eq!(wb.get(&key(1)).unwrap(), b"hello");
    assert_eq!(wb.get_range(&key(1), 1, 3).unwrap(), b"ell");
    assert_eq!(wb.head(&key(1)).unwrap().size, 5);
    assert!(wb.local_file(&key(1)).unwrap().is_ok());
    s.bucket.put(&key(2), b"other", None).unwrap();
    let keys: Vec<_> = wb
        .list("vol/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys, [key(1), key(2)]);
    // Objects only in the bucket read through.
    assert_eq!(wb.get(&key(2)).unwrap(), b"other");
    let st = wb.stats();
    assert_eq!((st.pending_blocks, st.pending_bytes), (1, 5));
    assert_eq!(st.uploaded_blocks, 0);
    // The same counters through the trait, for a metrics endpoint.
    let dyn_store: &dyn ObjectStore = &wb;
    assert_eq!(dyn_store.upload_backlog(), Some(st));
    // Staged files are private to the owner.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&staged).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn blocks_are_uploaded_in_the_background_and_leave_staging() {
    let s = setup(Duration::ZERO);
    let wb = WritebackStore::open(s.bucket.clone(), &s.opts).unwrap();
    for i in 0..10 {
        wb.put(&key(i), format!("blk{i:02}").as_bytes(), None)
            .unwrap();
    }
    eventually("every block uploaded", || wb.stats().pending_blocks == 0);
    for i in 0..10 {
        assert_eq!(
            s.bucket.get(&key(i)).unwrap(),
            format!("blk{i:02}").as_bytes()
        );
        assert_eq!(wb.get(&key(i)).unwrap(), format!("blk{i:02}").as_bytes());
    }
    assert_eq!(staged_on_disk(&s.opts.dir).unwrap(), (0, 0));
    let st = wb.stats();
    assert_eq!((st.uploaded_blocks, st.uploaded_bytes), (10, 50));
    assert_eq!(st.failures, 0);
    // The status file says the same.
    drop(wb);
    let status = read_status(&s.opts.dir).unwrap().unwrap();
    assert_eq!(status.stats.uploaded_blocks, 10);
    assert_eq!(status.pid, std::process::id());
}

#[test]
fn deleting_a_staged_block_cancels_its_upload() {
    let s = setup(HOUR);
    let wb = WritebackStore::open(s.bucket.clone(), &s.opts).unwrap();
    wb.put(&key(1), b"temp!", None).unwrap();
    wb.put(&key(2), b"kept!", None).unwrap();
    wb.delete(&key(1)).unwrap();
    wb.delete(&key(1)).unwrap();
    assert!(is_not_found(&wb.get(&key(1)).unwrap_err()));
    assert_eq!(staged_on_disk(&s.opts.dir).unwrap(), (1, 5));
    assert_eq!(wb.drain_uploads(Duration::from_secs(20)), 0);
    assert!(is_not_found(&s.bucket.get(&key(1)).unwrap_err()));
    assert_eq!(s.bucket.get(&key(2)).unwrap(), b"kept!");
    // Deleting an uploaded block deletes it from the bucket.
    wb.delete(&key(2)).unwrap();
    assert!(is_not_found(&s.bucket.get(&key(2)).unwrap_err()));
}

#[test]
fn draining_uploads_delayed_blocks_at_once() {
    let s = setup(HOUR);
    let wb = WritebackStore::open(s.bucket.clone(), &s.opts).unwrap();
    wb.put(&key(1), b"abcde", None).unwrap();
    let t = Instant::now();
    assert_eq!(wb.drain_uploads(Duration::from_secs(20)), 0);
    assert!(t.elapsed() < Duration::from_secs(20));
    assert_eq!(s.bucket.get(&key(1)).unwrap(), b"abcde");
    assert_eq!(staged_on_disk(&s.opts.dir).unwrap(), (0, 0));
}

#[test]
fn a_restart_uploads_what_an_earlier_run_staged() {
    let s = setup(HOUR);
    let wb = WritebackStore::open(s.bucket.clone(), &s.opts).unwrap();
    for i in 0..3 {
        wb.put(&key(i), format!("run{i}!").as_bytes(), None)
            .unwrap();
    }
    // The process "dies": nothing uploaded, the blocks stay staged.
    drop(wb);
    assert_eq!(staged_on_disk(&s.opts.dir).unwrap(), (3, 15));
    // A put interrupted halfway left its temporary file.
    let tmp = s
        .opts
        .dir
        .join(STAGING_DIR)
        .join("vol/chunks/0/0/.9_0_5.tmp7");
    fs::write(&tmp, b"half").unwrap();
    assert!(s.bucket.list("vol/").unwrap().is_empty());

    let opts = WritebackOptions {
        upload_delay: Duration::ZERO,
        ..s.opts.clone()
    };
    let wb = WritebackStore::open(s.bucket.clone(), &opts).unwrap();
    assert!(!tmp.exists(), "the temporary file is removed");
    assert_eq!(wb.stats().recovered_blocks, 3);
    // Readable while they upload, and uploaded without being asked.
    assert_eq!(wb.get(&key(1)).unwrap(), b"run1!");
    eventually("recovered blocks uploaded", || {
        wb.stats().pending_blocks == 0
    });
    for i in 0..3 {
        assert_eq!(
            s.bucket.get(&key(i)).unwrap(),
            format!("run{i}!").as_bytes()
        );
    }
    assert_eq!(staged_on_disk(&s.opts.dir).unwrap(), (0, 0));
}

/// A store whose first `fail` puts fail.
#[derive(Debug)]
struct Flaky {
    inner: Arc<FileStore>,
    fail: AtomicUsize,
}

impl ObjectStore for Flaky {
    fn describe(&self) -> String {
        "flaky".into()
    }
    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
        let left = self.fail.load(Ordering::SeqCst);
        if left > 0 {
            self.fail.store(left - 1, Ordering::SeqCst);
            return Err(Error::Object {
                key: key.into(),
                source: io::Error::new(io::ErrorKind::TimedOut, "the bucket is down"),
            });
        }
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
}

#[test]
fn failed_uploads_are_retried_and_nothing_is_lost() {
    let s = setup(Duration::ZERO);
    let flaky = Arc::new(Flaky {
        inner: s.bucket.clone(),
        fail: AtomicUsize::new(3),
    });
    let wb = WritebackStore::open(flaky, &s.opts).unwrap();
    wb.put(&key(1), b"one!!", None).unwrap();
    wb.put(&key(2), b"two!!", None).unwrap();
    // Readable all along from staging.
    assert_eq!(wb.get(&key(1)).unwrap(), b"one!!");
    eventually("uploads retried until they succeed", || {
        wb.stats().pending_blocks == 0
    });
    assert_eq!(s.bucket.get(&key(1)).unwrap(), b"one!!");
    assert_eq!(s.bucket.get(&key(2)).unwrap(), b"two!!");
    let st = wb.stats();
    assert_eq!(st.failures, 3);
    assert_eq!(st.uploaded_blocks, 2);
    assert!(
        st.last_error
            .as_deref()
            .unwrap()
            .contains("the bucket is down"),
        "{st:?}"
    );
}

#[test]
fn an_unwritable_staging_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = Arc::new(FileStore::new(dir.path().join("bucket")).unwrap());
    let file = dir.path().join("not-a-dir");
    fs::write(&file, b"x").unwrap();
    let opts = WritebackOptions {
        dir: file.join("uuid"),
        upload_delay: Duration::ZERO,
        max_uploads: 1,
    };
    assert!(WritebackStore::open(bucket, &opts).is_err());
}

#[test]
fn one_process_at_a_time_stages_in_a_directory() {
    let s = setup(HOUR);
    let wb = WritebackStore::open(s.bucket.clone(), &s.opts).unwrap();
    let err = WritebackStore::open(s.bucket.clone(), &s.opts).unwrap_err();
    assert!(err.to_string().contains("another sluice process"), "{err}");
    drop(wb);
    WritebackStore::open(s.bucket.clone(), &s.opts).unwrap();
}

/// The whole engine on a writeback volume: a committed file reads back from
/// staging, a deleted file's blocks are never uploaded, and destroy (the
/// unmount) uploads the rest.
#[test]
fn a_vfs_reads_staged_blocks_and_uploads_them_at_destroy() {
    use crate::format::Compression;
    use crate::meta::{Context, ROOT_INO, open_meta};
    use crate::vfs::{Vfs, VfsConfig};
    use crate::volume::{format_volume, open_volume};
    use rand::{RngCore, SeedableRng};

    let dir = tempfile::tempdir().unwrap();
    let meta = open_meta(&format!("sqlite3://{}/meta.db", dir.path().display())).unwrap();
    let bucket = dir.path().join("bucket");
    format_volume(&*meta, "test", &bucket, 64, Compression::Lz4, 0).unwrap();
    let vol = open_volume(meta).unwrap();
    let opts = WritebackOptions {
        dir: dir.path().join("cache").join(&vol.format.uuid),
        upload_delay: HOUR,
        max_uploads: 2,
    };
    let wb = WritebackStore::open(vol.store.clone(), &opts).unwrap();
    let vol = vol.with_store(Arc::new(wb));
    let vfs = Vfs::new(
        vol.clone(),
        VfsConfig {
            cache_bytes: 1 << 20,
            cleanup_interval: None,
            compaction: false,
            ..VfsConfig::default()
        },
    )
    .unwrap();
    let ctx = Context::default();
    let flags = libc::O_RDWR as u32;
    let mut data = vec![0u8; 300 << 10];
    rand::rngs::StdRng::seed_from_u64(7).fill_bytes(&mut data);
    let (a, fh) = vfs.create(&ctx, ROOT_INO, b"a", 0o644, 0, flags).unwrap();
    vfs.write_buf(&ctx, a.inode, fh.fh, 0, &data, false)
        .unwrap();
    vfs.fsync(&ctx, a.inode, fh.fh, false).unwrap();
    vfs.release(&ctx, a.inode, fh.fh).unwrap();
    let (t, fh) = vfs.create(&ctx, ROOT_INO, b"tmp", 0o644, 0, flags).unwrap();
    vfs.write_buf(&ctx, t.inode, fh.fh, 0, &data[..100 << 10], false)
        .unwrap();
    vfs.release(&ctx, t.inode, fh.fh).unwrap();
    // 5 blocks of "a", 2 of "tmp"; none uploaded.
    assert_eq!(staged_on_disk(&opts.dir).unwrap().0, 7);
    let bucket_blocks = || {
        FileStore::new(&bucket)
            .unwrap()
            .list("test/chunks/")
            .unwrap()
    };
    assert!(bucket_blocks().is_empty());
    vfs.unlink(&ctx, ROOT_INO, b"tmp").unwrap();
    // The unlinked file's objects go in the background.
    vol.meta.drain_deletes();
    assert_eq!(staged_on_disk(&opts.dir).unwrap().0, 5);

    let fh = vfs.open(&ctx, a.inode, libc::O_RDONLY as u32).unwrap();
    let mut got = vec![0u8; data.len() + 10];
    let n = vfs.read_buf(&ctx, a.inode, fh.fh, 0, &mut got).unwrap();
    assert!(
        n == data.len() && got[..n] == data[..],
        "read back from staging"
    );
    vfs.release(&ctx, a.inode, fh.fh).unwrap();

    vfs.destroy();
    assert_eq!(staged_on_disk(&opts.dir).unwrap(), (0, 0));
    assert_eq!(bucket_blocks().len(), 5);
}
