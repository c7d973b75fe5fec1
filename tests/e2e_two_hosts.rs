//! End-to-end: two hosts, one volume (issue #6 item 7). Two `sluice mount`
//! processes — two sessions, as on two hosts — serve the same volume, its
//! metadata in a real `redis-server` and its data in an S3 bucket (the
//! loopback S3 server). Checked through the kernel FUSE mounts:
//! close-to-open consistency, setattrs, renames and unlinks seen by the
//! other host (through its host-local metadata cache), a
//! file unlinked on one host staying readable where it is open, and a Redis
//! restart that loses nothing committed.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Mount, RedisServer, Watchdog, seed, sha256_file, sluice_ok, walk_files};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use sluice_engine::object::s3_test_server::TestS3Server;

const AK: &str = "two-hosts-access";
const SK: &str = "two-hosts-secret";
const BUCKET: &str = "shared";
const VOLUME: &str = "twohosts";
/// The kernel keeps no attributes or entries: what one host changed is seen
/// by the other on its next call (see docs/deployment.md, "Several hosts").
const MOUNT_OPTS: &[&str] = &["--attr-cache", "0", "--entry-cache", "0"];

/// Redis + S3 + two mounts of one volume.
struct Hosts {
    redis: RedisServer,
    _s3: TestS3Server,
    dir: tempfile::TempDir,
    a: Option<Mount>,
    b: Option<Mount>,
}

impl Hosts {
    fn start(test: &str) -> Option<Hosts> {
        let redis = RedisServer::start_persistent(test)?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let s3 = TestS3Server::start(&dir.path().join("s3"), AK, SK).expect("the S3 server");
        let meta = redis.url(1);
        sluice_ok(&[
            "format",
            &meta,
            VOLUME,
            "--storage",
            "s3",
            "--bucket",
            &s3.bucket_url(BUCKET),
            "--access-key",
            AK,
            "--secret-key",
            SK,
            // Unlinked files go for good (no trash): the deferred deletion
            // of files still open elsewhere is what is checked.
            "--trash-days",
            "0",
        ]);
        let mount = |sub: &str| {
            let mnt = dir.path().join(sub);
            std::fs::create_dir_all(&mnt).expect("a mount point");
            let log = dir.path().join(format!("{sub}.log"));
            Mount::start(&meta, &mnt, &log, MOUNT_OPTS)
        };
        let a = mount("a");
        let b = mount("b");
        Some(Hosts {
            redis,
            _s3: s3,
            a: Some(a),
            b: Some(b),
            dir,
        })
    }

    fn a(&self) -> &Path {
        &self.a.as_ref().expect("mount a").path
    }

    fn b(&self) -> &Path {
        &self.b.as_ref().expect("mount b").path
    }

    /// Every object of the volume in the bucket.
    fn objects(&self) -> BTreeSet<PathBuf> {
        let mut out = Vec::new();
        let chunks = self.dir.path().join("s3").join(BUCKET).join(VOLUME);
        walk_files(&chunks.join("chunks"), &mut out);
        out.into_iter().collect()
    }

    fn logs(&self) -> String {
        let a = self.a.as_ref().map(Mount::log_text).unwrap_or_default();
        let b = self.b.as_ref().map(Mount::log_text).unwrap_or_default();
        format!("--- host a ---\n{a}\n--- host b ---\n{b}")
    }
}

fn random(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("readdir")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

fn assert_enoent(path: &Path) {
    let err = std::fs::metadata(path).expect_err("the name is gone");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{path:?}: {err}");
}

/// Waits until `ok` holds, for up to `limit`.
fn eventually(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// (a) A file closed on one host is complete when opened on the other, after
/// a rewrite, an overwrite in place and an append too.
fn close_to_open(h: &Hosts, rng: &mut StdRng) {
    std::fs::create_dir(h.a().join("data")).expect("mkdir on a");
    let mut want = random(rng, 5 << 20);
    std::fs::write(h.a().join("data/f"), &want).expect("write on a");
    assert_eq!(sha256_file(&h.b().join("data/f")), sha256(&want));

    // Read on b first, so that b has the file's chunks cached, then change it.
    let mut f = std::fs::File::options()
        .write(true)
        .open(h.a().join("data/f"))
        .expect("open on a");
    let patch = random(rng, 1 << 20);
    f.seek(SeekFrom::Start(3 << 20)).expect("seek");
    f.write_all(&patch).expect("overwrite on a");
    drop(f);
    want[3 << 20..4 << 20].copy_from_slice(&patch);
    assert_eq!(
        sha256_file(&h.b().join("data/f")),
        sha256(&want),
        "b reads the overwrite a closed"
    );

    let tail = random(rng, (1 << 20) + 12345);
    let mut f = std::fs::File::options()
        .append(true)
        .open(h.a().join("data/f"))
        .expect("open for append on a");
    f.write_all(&tail).expect("append on a");
    drop(f);
    want.extend_from_slice(&tail);
    assert_eq!(
        std::fs::metadata(h.b().join("data/f"))
            .expect("stat on b")
            .len(),
        want.len() as u64
    );
    assert_eq!(sha256_file(&h.b().join("data/f")), sha256(&want));

    // Rewritten shorter from b, read on a.
    let short = random(rng, 777_777);
    std::fs::write(h.b().join("data/f"), &short).expect("rewrite on b");
    assert_eq!(
        std::fs::read(h.a().join("data/f")).expect("read on a"),
        short
    );
}

/// (b) Setattrs, renames and unlinks on one host are seen by the other
/// (through its host-local metadata cache: Redis pushes each change).
fn renames_and_unlinks(h: &Hosts, rng: &mut StdRng) {
    use std::os::unix::fs::PermissionsExt;
    let v = random(rng, 300_000);
    std::fs::write(h.a().join("data/r"), &v).expect("write on a");
    assert_eq!(std::fs::read(h.b().join("data/r")).expect("read on b"), v);
    // b has the file's attributes and entry in its metadata cache now; a's
    // setattrs reach it (a chmod, a truncate).
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
    assert_eq!(mode(&h.b().join("data/r")), 0o644);
    std::fs::set_permissions(h.a().join("data/r"), std::fs::Permissions::from_mode(0o600))
        .expect("chmod on a");
    assert_eq!(mode(&h.b().join("data/r")), 0o600, "b sees a's chmod");
    std::fs::File::options()
        .write(true)
        .open(h.a().join("data/r"))
        .and_then(|f| f.set_len(200_000))
        .expect("truncate on a");
    assert_eq!(
        std::fs::metadata(h.b().join("data/r"))
            .expect("stat on b")
            .len(),
        200_000,
        "b sees a's truncate"
    );
    let v = v[..200_000].to_vec();
    assert_eq!(std::fs::read(h.b().join("data/r")).expect("read on b"), v);
    std::fs::rename(h.a().join("data/r"), h.a().join("data/renamed")).expect("rename on a");
    assert_enoent(&h.b().join("data/r"));
    assert_eq!(
        std::fs::read(h.b().join("data/renamed")).expect("read renamed on b"),
        v
    );
    assert!(names(&h.b().join("data")).contains("renamed"));
    assert!(!names(&h.b().join("data")).contains("r"));

    std::fs::remove_file(h.a().join("data/renamed")).expect("unlink on a");
    assert_enoent(&h.b().join("data/renamed"));
    assert!(!names(&h.b().join("data")).contains("renamed"));

    std::fs::create_dir(h.b().join("data/sub")).expect("mkdir on b");
    std::fs::rename(h.a().join("data/sub"), h.a().join("moved")).expect("rename dir on a");
    assert!(h.b().join("moved").is_dir());
    assert_enoent(&h.b().join("data/sub"));
    std::fs::remove_dir(h.b().join("moved")).expect("rmdir on b");
    assert_enoent(&h.a().join("moved"));
}

/// (c) A file unlinked on one host while open on the other stays readable
/// there until closed; then its objects go.
fn unlinked_while_open_elsewhere(h: &Hosts, rng: &mut StdRng) {
    let before = h.objects();
    let v = random(rng, (17 << 20) + 4321);
    std::fs::write(h.a().join("data/open"), &v).expect("write on a");
    let mine: BTreeSet<PathBuf> = h.objects().difference(&before).cloned().collect();
    assert!(
        mine.len() >= 5,
        "a 17 MiB file is 5 blocks or more: {mine:?}"
    );

    let mut f = std::fs::File::open(h.b().join("data/open")).expect("open on b");
    let mut head = vec![0u8; 4096];
    f.read_exact(&mut head).expect("read the head on b");
    assert_eq!(head, v[..4096]);

    std::fs::remove_file(h.a().join("data/open")).expect("unlink on a");
    assert_enoent(&h.b().join("data/open"));
    // Long enough for b's resolved chunks to expire: b reads from Redis again.
    std::thread::sleep(Duration::from_millis(1500));
    let mut rest = Vec::new();
    f.read_to_end(&mut rest)
        .expect("read the rest on b after the unlink");
    head.extend_from_slice(&rest);
    assert!(head == v, "b read back what a wrote, though a unlinked it");
    assert!(
        mine.iter().all(|p| p.is_file()),
        "the objects stay while b holds the file open"
    );

    drop(f);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<&PathBuf> = mine.iter().filter(|p| p.exists()).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the objects of the file stay after b closed it: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// (d) Redis restarts: nothing committed is lost and both hosts carry on.
fn redis_restart(h: &mut Hosts, rng: &mut StdRng) {
    let va = random(rng, (2 << 20) + 99);
    let vb = random(rng, 500_000);
    std::fs::write(h.a().join("data/before-a"), &va).expect("write on a");
    std::fs::write(h.b().join("data/before-b"), &vb).expect("write on b");
    let listing = names(&h.a().join("data"));

    // A file written while Redis is down: it either waits for the
    // reconnection or fails with EIO; it never comes back half there.
    let during = h.a().join("data/during");
    let vd = random(rng, 700_000);
    let writer = {
        let (path, data) = (during.clone(), vd.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            std::fs::write(path, data)
        })
    };
    h.redis.restart(Duration::from_secs(2));
    let written = writer.join().expect("the writer thread");
    eprintln!("a write during the Redis outage: {written:?}");

    // The first calls after the restart may fail (EIO) while the clients
    // reconnect; they must work again soon after.
    eventually(
        Duration::from_secs(60),
        "host a reads after the restart",
        || std::fs::read(h.a().join("data/before-b")).is_ok_and(|d| d == vb),
    );
    eventually(
        Duration::from_secs(60),
        "host b reads after the restart",
        || std::fs::read(h.b().join("data/before-a")).is_ok_and(|d| d == va),
    );
    match written {
        Ok(()) => {
            let back = std::fs::read(h.b().join("data/during")).expect("read on b");
            assert!(back == vd, "the file written during the outage reads back");
        }
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
    }
    let _ = std::fs::remove_file(&during);
    assert_eq!(names(&h.a().join("data")), listing);
    assert_eq!(names(&h.b().join("data")), listing);

    let va2 = random(rng, 1 << 20);
    let vb2 = random(rng, 3 << 20);
    std::fs::write(h.a().join("data/after-a"), &va2).expect("write on a after the restart");
    std::fs::write(h.b().join("data/after-b"), &vb2).expect("write on b after the restart");
    std::fs::create_dir(h.a().join("after-dir")).expect("mkdir on a after the restart");
    assert_eq!(
        std::fs::read(h.b().join("data/after-a")).expect("read"),
        va2
    );
    assert_eq!(
        std::fs::read(h.a().join("data/after-b")).expect("read"),
        vb2
    );
    assert!(h.b().join("after-dir").is_dir());
}

/// One step of the scenario.
type Step = fn(&mut Hosts, &mut StdRng);

#[test]
fn two_hosts_share_a_redis_s3_volume() {
    let test = "two_hosts_share_a_redis_s3_volume";
    let _dog = Watchdog::new(test, Duration::from_secs(600));
    let Some(mut h) = Hosts::start(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(seed(test));
    let steps: [(&str, Step); 4] = [
        ("close-to-open", |h, r| close_to_open(h, r)),
        ("renames and unlinks", |h, r| renames_and_unlinks(h, r)),
        ("unlinked while open elsewhere", |h, r| {
            unlinked_while_open_elsewhere(h, r)
        }),
        ("redis restart", redis_restart),
    ];
    for (name, step) in steps {
        eprintln!("{test}: {name}");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&mut h, &mut rng)));
        if let Err(e) = r {
            eprintln!("{test}: step {name} failed; mount logs:\n{}", h.logs());
            std::panic::resume_unwind(e);
        }
    }
    h.a.take().expect("mount a").unmount();
    h.b.take().expect("mount b").unmount();
}
