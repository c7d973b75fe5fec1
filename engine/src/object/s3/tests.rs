//! S3Store tests against a real S3 HTTP server (s3s-fs behind hyper) on
//! loopback, with faults injected in front of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::format::Secret;
use crate::object::is_not_found;
use crate::object::s3_test_server::TestS3Server;
use crate::vfs::Filesystem as _;

const AK: &str = "test-access";
const SK: &str = "test-secret-key";

fn creds() -> Credentials {
    Credentials {
        access_key: AK.into(),
        secret_key: Secret::new(SK),
        session_token: Secret::default(),
    }
}

/// Short timeouts and backoffs, so fault tests run in seconds (but long
/// enough that a loaded 2-core CI machine does not time out healthy
/// requests).
fn fast_options() -> S3Options {
    S3Options {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_millis(500),
        max_attempts: 12,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(80),
        max_uploads: 8,
        runtime_threads: 2,
        ..S3Options::default()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    server: TestS3Server,
    store: S3Store,
}

fn fixture(options: S3Options) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let server = TestS3Server::start(dir.path(), AK, SK).unwrap();
    let store = S3Store::new(&server.bucket_url("bucket"), &creds(), options).unwrap();
    store.ensure_bucket().unwrap();
    Fixture {
        _dir: dir,
        server,
        store,
    }
}

fn data(len: usize, seed: u64) -> Vec<u8> {
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

#[test]
fn bucket_urls_parse_as_juicefs_names_them() {
    let loc = S3Location::parse("http://127.0.0.1:9000/jfs").unwrap();
    assert_eq!(loc.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    assert_eq!((loc.bucket.as_str(), loc.path_style), ("jfs", true));
    let loc = S3Location::parse("https://minio.local/data/").unwrap();
    assert_eq!(loc.endpoint.as_deref(), Some("https://minio.local"));
    assert_eq!(loc.bucket, "data");
    let loc = S3Location::parse("https://myjfs.s3.ap-southeast-1.amazonaws.com").unwrap();
    assert_eq!(loc.endpoint, None);
    assert_eq!((loc.bucket.as_str(), loc.path_style), ("myjfs", false));
    assert_eq!(loc.region.as_deref(), Some("ap-southeast-1"));
    let loc = S3Location::parse("my.dotted.bucket.s3-eu-west-1.amazonaws.com").unwrap();
    assert_eq!(loc.bucket, "my.dotted.bucket");
    assert_eq!(loc.region.as_deref(), Some("eu-west-1"));
    let loc = S3Location::parse("https://jfs.s3.amazonaws.com").unwrap();
    assert_eq!((loc.bucket.as_str(), loc.region), ("jfs", None));
    let loc = S3Location::parse("https://s3.us-west-2.amazonaws.com/jfs").unwrap();
    assert_eq!((loc.bucket.as_str(), loc.path_style), ("jfs", true));
    assert_eq!(loc.region.as_deref(), Some("us-west-2"));
    for bad in [
        "ftp://host/b",
        "http://127.0.0.1:9000",
        "http://127.0.0.1:9000/b/sub",
        "http://user:pw@host/b",
        "https://s3.us-west-2.amazonaws.com",
    ] {
        let err = S3Location::parse(bad).unwrap_err();
        assert!(err.to_string().contains("http(s)://HOST"), "{bad}: {err}");
    }
}

#[test]
fn keys_in_a_bucket_url_stay_out_of_the_refusal() {
    for bad in [
        "http://AKID:XYZZY@127.0.0.1:9000/b",
        "http://AKID:XY/ZZY@127.0.0.1:9000/b",
        "https://AKID:XY@ZZY@bucket.s3.us-east-1.amazonaws.com",
        "AKID:XYZZY@minio.local/b",
    ] {
        let err = S3Location::parse(bad).unwrap_err().to_string();
        assert!(err.contains("credentials"), "{bad}: {err}");
        assert!(!err.contains("XY") && !err.contains("ZZY"), "{bad}: {err}");
    }
}

#[test]
fn put_get_range_head_delete_round_trip() {
    let f = fixture(fast_options());
    let s = &f.store;
    let key = "vol/chunks/0/0/5_0_11";
    s.put(key, b"hello world", None).unwrap();
    assert_eq!(s.get(key).unwrap(), b"hello world");
    assert_eq!(s.get_range(key, 6, 100).unwrap(), b"world");
    assert_eq!(s.get_range(key, 0, 5).unwrap(), b"hello");
    assert_eq!(s.get_range(key, 3, 0).unwrap(), b"");
    assert!(s.get_range(key, 11, 10).unwrap().is_empty());
    assert!(s.get_range(key, 50, 10).unwrap().is_empty());
    let info = s.head(key).unwrap();
    assert_eq!((info.key.as_str(), info.size), (key, 11));
    let age = SystemTime::now()
        .duration_since(info.mtime)
        .unwrap_or_default();
    assert!(age < Duration::from_secs(300), "mtime {:?}", info.mtime);
    // The object is the raw bytes: nothing of ours inside it.
    assert_eq!(
        std::fs::read(f.server.object_path("bucket", key)).unwrap(),
        b"hello world"
    );
    // A 4 MiB block, with the caller's CRC.
    let big = data(4 << 20, 1);
    let crc = sluice_simd::crc32c(0, &big);
    s.put("vol/chunks/0/0/6_0_4194304", &big, Some(crc))
        .unwrap();
    assert_eq!(s.get("vol/chunks/0/0/6_0_4194304").unwrap(), big);
    assert_eq!(
        s.get_range("vol/chunks/0/0/6_0_4194304", 1 << 20, 4096)
            .unwrap(),
        big[1 << 20..(1 << 20) + 4096]
    );
    // Overwrite replaces the whole object.
    s.put(key, b"bye", None).unwrap();
    assert_eq!(s.get(key).unwrap(), b"bye");
    s.delete(key).unwrap();
    s.delete(key).unwrap();
    for err in [
        s.get(key).unwrap_err(),
        s.head(key).unwrap_err(),
        s.get_range(key, 0, 4).unwrap_err(),
    ] {
        assert!(is_not_found(&err), "{err}");
        assert!(err.to_string().contains(key), "{err}");
    }
    assert!(s.describe().starts_with("s3://bucket at http://127.0.0.1:"));
}

#[test]
fn list_pages_through_more_than_a_thousand_keys() {
    let f = fixture(fast_options());
    let s = Arc::new(f.store);
    let n = 1100;
    std::thread::scope(|scope| {
        for t in 0..4 {
            let s = s.clone();
            scope.spawn(move || {
                for i in (t..n).step_by(4) {
                    s.put(&format!("v/chunks/0/{}/{i}_0_1", i / 1000), b"x", None)
                        .unwrap();
                }
            });
        }
    });
    s.put("v/juicefs_uuid", b"u", None).unwrap();
    s.put("w/chunks/0/0/1_0_1", b"y", None).unwrap();
    let listed = s.list("v/chunks/").unwrap();
    assert_eq!(listed.len(), n);
    assert!(listed.windows(2).all(|w| w[0].key < w[1].key));
    assert!(listed.iter().all(|o| o.size == 1));
    let mut want: Vec<String> = (0..n)
        .map(|i| format!("v/chunks/0/{}/{i}_0_1", i / 1000))
        .collect();
    want.sort();
    assert_eq!(listed.into_iter().map(|o| o.key).collect::<Vec<_>>(), want);
    assert_eq!(s.list("v/").unwrap().len(), n + 1);
    assert_eq!(s.list("").unwrap().len(), n + 2);
    assert!(s.list("nothing/").unwrap().is_empty());
    // Several pages were asked for (1000 keys a page at most).
    assert!(f.server.faults().requests() >= 2 + n as u64 + 2);
}

#[test]
fn crc32c_travels_as_the_s3_checksum_and_mismatches_are_caught() {
    let f = fixture(fast_options());
    let s = &f.store;
    let key = "v/chunks/0/0/1_0_8";
    s.put(key, b"abcdefgh", None).unwrap();
    // The server verified and kept the CRC32C we sent; it answers with it.
    let client = s.client.clone();
    let got = s.run(async move {
        client
            .head_object()
            .bucket("bucket")
            .key(key)
            .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
            .send()
            .await
            .unwrap()
    });
    let want = base64::engine::general_purpose::STANDARD
        .encode(sluice_simd::crc32c(0, b"abcdefgh").to_be_bytes());
    assert_eq!(got.checksum_crc32_c(), Some(want.as_str()));

    // Flip bytes behind the server's back (its stored checksum stays).
    std::fs::write(f.server.object_path("bucket", key), b"abcdXfgh").unwrap();
    let err = s.get(key).unwrap_err();
    assert!(
        matches!(err, Error::Corrupt(ref m) if m.contains(key)),
        "{err}"
    );
    assert_eq!(err.errno(), libc::EIO);
    // A range cannot be checked against the whole-object CRC.
    assert_eq!(s.get_range(key, 4, 2).unwrap(), b"Xf");

    // An object someone else wrote without a checksum (as JuiceFS does)
    // is served as it is.
    let other = f.server.object_path("bucket", "v/chunks/0/0/2_0_3");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::fs::write(&other, b"xyz").unwrap();
    assert_eq!(s.get("v/chunks/0/0/2_0_3").unwrap(), b"xyz");

    // A body that does not match the CRC the writer computed is refused
    // by the server, so it is never acknowledged.
    let bad = S3Store::new(
        &f.server.bucket_url("bucket"),
        &creds(),
        S3Options {
            max_attempts: 2,
            ..fast_options()
        },
    )
    .unwrap();
    let err = bad
        .put("v/chunks/0/0/3_0_4", b"data", Some(0x1234_5678))
        .unwrap_err();
    assert!(err.to_string().contains("3_0_4"), "{err}");
    assert!(err.to_string().contains("BadDigest"), "{err}");
}

#[test]
fn retries_ride_out_503s_timeouts_and_cut_connections() {
    let f = fixture(fast_options());
    let s = Arc::new(f.store);
    // A quarter of all requests fail, in every way the injector knows.
    f.server
        .faults()
        .set(100, 50, Duration::from_secs(5), 50, 50);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let s = s.clone();
            scope.spawn(move || {
                for i in 0..12u64 {
                    let key = format!("v/chunks/0/0/{t}{i:02}_0_262144");
                    let block = data(256 << 10, t * 100 + i);
                    s.put(&key, &block, None).unwrap();
                    assert_eq!(s.get(&key).unwrap(), block, "{key}");
                    assert_eq!(
                        s.get_range(&key, 1000, 5000).unwrap(),
                        block[1000..6000],
                        "{key}"
                    );
                    assert_eq!(s.head(&key).unwrap().size, 256 << 10);
                }
            });
        }
    });
    assert_eq!(s.list("v/chunks/").unwrap().len(), 48);
    let injected = f.server.faults().injected();
    assert!(injected >= 20, "only {injected} faults injected");
    eprintln!(
        "{injected} faults in {} requests, {:?}",
        f.server.faults().requests(),
        start.elapsed()
    );
}

#[test]
fn an_exhausted_retry_budget_names_the_key_and_loses_nothing_acknowledged() {
    let f = fixture(S3Options {
        max_attempts: 4,
        request_timeout: Duration::from_secs(1),
        ..fast_options()
    });
    let s = &f.store;
    let acked: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| (format!("v/chunks/0/0/{i}_0_4096"), data(4096, i)))
        .collect();
    for (k, v) in &acked {
        s.put(k, v, None).unwrap();
    }
    f.server.faults().fail_all(Duration::from_secs(3));
    let start = Instant::now();
    let err = s
        .put("v/chunks/0/0/99_0_4096", &data(4096, 99), None)
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("v/chunks/0/0/99_0_4096"), "{msg}");
    assert!(msg.contains("gave up after 4 attempts"), "{msg}");
    assert_eq!(err.errno(), libc::EIO);
    let err = s.get(&acked[0].0).unwrap_err();
    assert!(err.to_string().contains(&acked[0].0), "{err}");
    assert!(!is_not_found(&err), "{err}");
    assert!(s.list("v/").unwrap_err().to_string().contains("v/"));
    // Bounded: 4 attempts of at most 300 ms plus short backoffs, per call.
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );

    f.server.faults().clear();
    for (k, v) in &acked {
        assert_eq!(&s.get(k).unwrap(), v, "{k}");
    }
}

#[test]
fn uploads_in_flight_stay_within_max_uploads() {
    let f = fixture(S3Options {
        max_uploads: 2,
        ..fast_options()
    });
    let s = Arc::new(f.store);
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let s = s.clone();
            scope.spawn(move || {
                for i in 0..4u64 {
                    s.put(&format!("p/{t}_{i}"), &data(512 << 10, t), None)
                        .unwrap();
                }
            });
        }
    });
    let max = f.server.faults().max_puts_in_flight();
    assert!((1..=2).contains(&max), "{max} PUTs in flight at once");
    assert_eq!(s.list("p/").unwrap().len(), 32);
}

#[test]
fn wrong_keys_fail_at_once_and_never_show_the_secret() {
    let f = fixture(fast_options());
    let wrong = Credentials {
        access_key: AK.into(),
        secret_key: Secret::new("not-the-secret"),
        session_token: Secret::default(),
    };
    let s = S3Store::new(&f.server.bucket_url("bucket"), &wrong, fast_options()).unwrap();
    let before = f.server.faults().requests();
    let err = s.put("k", b"v", None).unwrap_err();
    assert!(err.to_string().contains("403"), "{err}");
    // Not retried: a signature error does not heal.
    assert_eq!(f.server.faults().requests() - before, 1);
    let shown = format!("{s:?} {err} {:?} {wrong:?}", f.store);
    assert!(
        !shown.contains("not-the-secret") && !shown.contains(SK),
        "{shown}"
    );
    // Half a key pair is refused before anything is sent.
    let half = Credentials {
        access_key: AK.into(),
        ..Credentials::default()
    };
    assert!(S3Store::new(&f.server.bucket_url("b"), &half, fast_options()).is_err());
}

#[test]
fn ensure_bucket_creates_a_missing_bucket_once() {
    let f = fixture(fast_options());
    let s = S3Store::new(&f.server.bucket_url("fresh"), &creds(), fast_options()).unwrap();
    let dir = f._dir.path().join("fresh");
    assert!(!dir.exists());
    s.ensure_bucket().unwrap();
    assert!(dir.is_dir());
    s.ensure_bucket().unwrap();
    s.put("k", b"v", None).unwrap();
    assert_eq!(s.get("k").unwrap(), b"v");
}

#[test]
fn calls_from_inside_a_tokio_runtime_do_not_panic() {
    let f = fixture(fast_options());
    let s = Arc::new(f.store);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let s2 = s.clone();
    rt.block_on(async move {
        s2.put("inside", b"rt", None).unwrap();
        assert_eq!(s2.get("inside").unwrap(), b"rt");
    });
    // Dropping the store inside a runtime must not panic either.
    rt.block_on(async move { drop(s) });
}

mod volume {
    //! A whole volume on SQLite + the loopback S3 server, driven through
    //! the Vfs as the FUSE and virtio-fs front ends drive it.

    use super::*;
    use crate::format::Compression;
    use crate::meta::{Context, ROOT_INO, open_meta};
    use crate::vfs::{Vfs, VfsConfig};
    use crate::volume::{Storage, format_volume_on, open_volume_with};

    fn cfg() -> VfsConfig {
        VfsConfig {
            cache_bytes: 16 << 20,
            cleanup_interval: None,
            ..VfsConfig::default()
        }
    }

    fn open(url: &str) -> Vfs {
        let vol = open_volume_with(open_meta(url).unwrap(), &fast_options()).unwrap();
        Vfs::new(vol, cfg()).unwrap()
    }

    fn write_file(vfs: &Vfs, name: &str, data: &[u8]) -> crate::error::Result<()> {
        let ctx = Context::default();
        let (e, out) = vfs.create(
            &ctx,
            ROOT_INO,
            name.as_bytes(),
            0o644,
            0o022,
            libc::O_RDWR as u32,
        )?;
        for (i, part) in data.chunks(128 << 10).enumerate() {
            vfs.write_buf(&ctx, e.inode, out.fh, (i * (128 << 10)) as u64, part, false)?;
        }
        let synced = vfs.fsync(&ctx, e.inode, out.fh, false);
        let released = vfs.release(&ctx, e.inode, out.fh);
        synced.and(released)
    }

    fn read_file(vfs: &Vfs, name: &str) -> Vec<u8> {
        let ctx = Context::default();
        let e = vfs.lookup(&ctx, ROOT_INO, name.as_bytes()).unwrap();
        let out = vfs.open(&ctx, e.inode, libc::O_RDONLY as u32).unwrap();
        let mut data = vec![0u8; out.attr.length as usize];
        let mut done = 0;
        while done < data.len() {
            let n = vfs
                .read_buf(&ctx, e.inode, out.fh, done as u64, &mut data[done..])
                .unwrap();
            assert!(n > 0, "{name}: short read at {done}");
            done += n;
        }
        vfs.release(&ctx, e.inode, out.fh).unwrap();
        data
    }

    #[test]
    fn a_volume_on_s3_writes_and_reads_back_through_the_vfs() {
        let dir = tempfile::tempdir().unwrap();
        let server = TestS3Server::start(&dir.path().join("s3"), AK, SK).unwrap();
        let url = format!("sqlite3://{}/meta.db", dir.path().display());
        let meta = open_meta(&url).unwrap();
        let storage = Storage {
            s3: fast_options(),
            ..Storage::s3(&server.bucket_url("jfs"), creds())
        };
        let format =
            format_volume_on(&*meta, "s3vol", &storage, 1024, Compression::None, 0).unwrap();
        assert_eq!(
            (format.storage.as_str(), format.bucket.as_str()),
            ("s3", server.bucket_url("jfs").as_str())
        );
        // The keys are kept as JuiceFS keeps them: the secret sealed.
        let stored = meta.load().unwrap();
        assert_eq!(stored.extra["AccessKey"], AK);
        assert_eq!(stored.extra["KeyEncrypted"], true);
        assert_ne!(stored.extra["SecretKey"], SK);
        assert_eq!(stored.credentials().unwrap().secret_key.expose(), SK);
        drop(meta);
        // The bucket was created and holds the UUID object.
        assert_eq!(
            std::fs::read(server.object_path("jfs", "s3vol/juicefs_uuid")).unwrap(),
            format.uuid.as_bytes()
        );

        let files: Vec<(String, Vec<u8>)> = [(3 << 20) + 12_345, 100_000, 1]
            .iter()
            .enumerate()
            .map(|(i, &len)| (format!("f{i}"), data(len, 50 + i as u64)))
            .collect();
        let vfs = open(&url);
        for (name, bytes) in &files {
            write_file(&vfs, name, bytes).unwrap();
        }
        vfs.destroy();
        let vfs = open(&url);
        let objects = vfs.volume().store.list("s3vol/chunks/").unwrap();
        assert_eq!(objects.len(), 4 + 1 + 1, "one object per 1 MiB block");
        vfs.destroy();

        // A fresh Vfs reads the same bytes, with a fifth of requests failing.
        server.faults().set(80, 40, Duration::from_secs(3), 40, 40);
        let vfs = open(&url);
        for (name, bytes) in &files {
            assert_eq!(&read_file(&vfs, name), bytes, "{name}");
        }
        let more = data(2 << 20, 99);
        write_file(&vfs, "under-faults", &more).unwrap();
        vfs.destroy();
        assert!(server.faults().injected() > 0);

        // With every request failing a write fails with EIO, and nothing
        // that was acknowledged before is lost.
        let vfs = open_failing(&url);
        server.faults().fail_all(Duration::from_secs(3));
        let err = write_file(&vfs, "doomed", &data(1 << 20, 7)).unwrap_err();
        assert_eq!(err.errno(), libc::EIO, "{err}");
        vfs.destroy();
        server.faults().clear();
        let vfs = open(&url);
        for (name, bytes) in files.iter().chain([&("under-faults".to_string(), more)]) {
            assert_eq!(&read_file(&vfs, name), bytes, "{name}");
        }
        vfs.destroy();
    }

    /// Write errors are sticky and lose nothing: a commit that fails (here
    /// triggered by another handle's read) keeps the buffered writes; when
    /// the store is back, the writer's fsync stores them but still reports
    /// the earlier failure, once per handle (errseq), and the bytes read
    /// back whole.
    #[test]
    fn a_failed_commit_keeps_its_writes_and_every_handle_reports_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let server = TestS3Server::start(&dir.path().join("s3"), AK, SK).unwrap();
        let url = format!("sqlite3://{}/meta.db", dir.path().display());
        let meta = open_meta(&url).unwrap();
        let storage = Storage {
            s3: fast_options(),
            ..Storage::s3(&server.bucket_url("jfs"), creds())
        };
        format_volume_on(&*meta, "sticky", &storage, 1024, Compression::None, 0).unwrap();
        drop(meta);
        let vfs = open_failing(&url);
        let ctx = Context::default();
        let (e, out) = vfs
            .create(&ctx, ROOT_INO, b"f", 0o644, 0o022, libc::O_RDWR as u32)
            .unwrap();
        let (ino, w) = (e.inode, out.fh);
        let r = vfs.open(&ctx, ino, libc::O_RDONLY as u32).unwrap().fh;
        // Two and a half blocks: full blocks go to the upload pool, the
        // rest is stored by the commit itself.
        let bytes = data((5 << 19) + 777, 12);
        for (i, part) in bytes.chunks(128 << 10).enumerate() {
            vfs.write_buf(&ctx, ino, w, (i * (128 << 10)) as u64, part, false)
                .unwrap();
        }
        server.faults().fail_all(Duration::from_secs(3));
        // The read must commit the writes first; it cannot, so it fails
        // rather than return bytes older than the writes.
        let mut buf = vec![0u8; 4096];
        let err = vfs.read_buf(&ctx, ino, r, 0, &mut buf).unwrap_err();
        assert_eq!(err.errno(), libc::EIO, "{err}");
        server.faults().clear();
        // The writer's fsync stores the kept writes and reports the failure.
        let err = vfs.fsync(&ctx, ino, w, false).unwrap_err();
        assert_eq!(err.errno(), libc::EIO, "{err}");
        // Once per handle: the next fsync has nothing new to report.
        vfs.fsync(&ctx, ino, w, false).unwrap();
        // The reader's handle was open when it happened: each close says
        // so (a FLUSH comes at every close of every descriptor of the open
        // file, a forked child's included) until its fsync reports it.
        for _ in 0..2 {
            let err = vfs.flush(&ctx, ino, r).unwrap_err();
            assert_eq!(err.errno(), libc::EIO, "{err}");
        }
        let err = vfs.fsync(&ctx, ino, r, false).unwrap_err();
        assert_eq!(err.errno(), libc::EIO, "{err}");
        vfs.flush(&ctx, ino, r).unwrap();
        // A handle opened after the failure has nothing to report.
        let late = vfs.open(&ctx, ino, libc::O_RDONLY as u32).unwrap().fh;
        vfs.flush(&ctx, ino, late).unwrap();
        let mut back = vec![0u8; bytes.len()];
        let mut done = 0;
        while done < back.len() {
            done += vfs
                .read_buf(&ctx, ino, late, done as u64, &mut back[done..])
                .unwrap();
        }
        assert!(back == bytes, "the kept writes read back whole");
        for fh in [w, r, late] {
            vfs.release(&ctx, ino, fh).unwrap();
        }
        vfs.destroy();
        // And they were really stored: a fresh Vfs reads them.
        let vfs = open(&url);
        assert!(read_file(&vfs, "f") == bytes);
        vfs.destroy();
    }

    /// A volume whose store gives up fast (the server fails everything).
    fn open_failing(url: &str) -> Vfs {
        let options = S3Options {
            max_attempts: 3,
            request_timeout: Duration::from_secs(1),
            ..fast_options()
        };
        let vol = open_volume_with(open_meta(url).unwrap(), &options).unwrap();
        Vfs::new(vol, cfg()).unwrap()
    }
}
