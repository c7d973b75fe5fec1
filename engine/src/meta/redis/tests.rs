//! The conformance suite on a real `redis-server`, plus checks of the keys
//! themselves against JuiceFS's schema and of reconnection after a restart.
//!
//! Each test starts its own `redis-server` on a free loopback port in a
//! temporary directory (nothing saved unless asked) and kills it on drop.
//! Without `redis-server` on the PATH, or with `SLUICE_SKIP_REDIS=1`, the
//! tests say why and pass.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::RedisMeta;
use crate::Error;
use crate::meta::conformance::{self, test_format};
use crate::meta::{Context, FileType, Meta, ROOT_INO, SetAttr, Slice, Store, Timestamp};

/// A `redis-server` of one test.
pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    persistent: bool,
    cluster: bool,
    /// Serves TLS only (certificates in `dir`, see [`make_certificates`]).
    tls: bool,
}

fn redis_server_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
}

impl RedisServer {
    /// Starts a server, or says why not (and the test then passes vacuously).
    pub(crate) fn start(persistent: bool) -> Option<RedisServer> {
        RedisServer::start_with(persistent, false)
    }

    /// Starts a one-node Redis Cluster that serves every slot.
    pub(crate) fn start_cluster() -> Option<RedisServer> {
        RedisServer::start_with(false, true)
    }

    /// A server that speaks TLS only, its certificate signed by `ca.pem` in
    /// [`RedisServer::dir`].
    pub(crate) fn start_tls() -> Option<RedisServer> {
        let mut s = RedisServer::prepare(false, false)?;
        s.tls = true;
        make_certificates(s.dir.path());
        s.spawn();
        Some(s)
    }

    fn start_with(persistent: bool, cluster: bool) -> Option<RedisServer> {
        let mut s = RedisServer::prepare(persistent, cluster)?;
        s.spawn();
        Some(s)
    }

    fn prepare(persistent: bool, cluster: bool) -> Option<RedisServer> {
        if std::env::var("SLUICE_SKIP_REDIS").is_ok_and(|v| v == "1") {
            eprintln!("skipping: SLUICE_SKIP_REDIS=1");
            return None;
        }
        if redis_server_binary().is_none() {
            eprintln!("skipping: redis-server is not installed (apt-get install redis-server)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        Some(RedisServer {
            child: None,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            persistent,
            cluster,
            tls: false,
        })
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        if self.tls {
            let d = self.dir.path();
            cmd.args(["--port", "0", "--tls-port"])
                .arg(self.port.to_string())
                .arg("--tls-cert-file")
                .arg(d.join("server.pem"))
                .arg("--tls-key-file")
                .arg(d.join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(d.join("ca.pem"))
                .args(["--tls-auth-clients", "no"]);
        } else {
            cmd.arg("--port").arg(self.port.to_string());
        }
        cmd.arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", "", "--daemonize", "no", "--protected-mode", "yes"]);
        if self.persistent {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(self.dir.path().join("nodes.conf"));
        }
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        self.child = Some(cmd.spawn().expect("start redis-server"));
        wait_ready(self.port, self.tls);
        if self.cluster {
            let mut c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port).as_str())
                .and_then(|c| c.get_connection())
                .expect("connect");
            redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(0)
                .arg(16383)
                .query::<()>(&mut c)
                .expect("take every slot");
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .expect("info");
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster did not come up: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The metadata URL of database `db`.
    pub(crate) fn url(&self, db: u32) -> String {
        format!("redis://127.0.0.1:{}/{db}", self.port)
    }

    /// The server's directory.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server at once (SIGKILL).
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and directory.
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A CA (`ca.pem`) and a server certificate it signed for 127.0.0.1
/// (`server.pem`, `server.key`) in `dir`, made with the openssl command.
fn make_certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    run(&[
        &[
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=sluice test CA",
        ][..],
        &ec,
        &["-keyout", "ca.key", "-out", "ca.pem"],
    ]
    .concat());
    run(&[
        &["req", "-nodes", "-subj", "/CN=localhost"][..],
        &ec,
        &["-keyout", "server.key", "-out", "server.csr"],
    ]
    .concat());
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("ext file");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
}

fn wait_ready(port: u16, tls: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let url = if tls {
        format!("rediss://127.0.0.1:{port}/#insecure")
    } else {
        format!("redis://127.0.0.1:{port}/")
    };
    loop {
        let ok = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if ok.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server on port {port} did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fresh() -> Option<(RedisServer, RedisMeta)> {
    let s = RedisServer::start(false)?;
    let m = RedisMeta::open(&s.url(1)).expect("open");
    Some((s, m))
}

fn raw(s: &RedisServer, db: u32) -> redis::Connection {
    redis::Client::open(s.url(db).as_str())
        .and_then(|c| c.get_connection())
        .expect("connect")
}

macro_rules! conformance_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let Some((_server, m)) = fresh() else { return };
                conformance::$name(&m);
            }
        )*
        #[test]
        fn every_conformance_check_runs_here() {
            let here = [$(stringify!($name)),*];
            for (name, _) in conformance::ALL {
                assert!(here.contains(name), "conformance check {name} is not run on Redis");
            }
        }
    };
}

conformance_tests!(
    format_and_load,
    refuse_different_volume,
    refuse_encrypted,
    posix_acls,
    create_lookup_getattr,
    names_are_checked,
    mkdir_rmdir_nlink,
    readdir_lists_entries,
    readdir_pages,
    rename_moves_and_replaces,
    rename_flags,
    rename_directories,
    hard_links,
    symlinks,
    mknod_special_files,
    xattrs,
    set_atime_alone,
    setattr_rules,
    chown_chgrp_rules,
    data_changes_drop_setid,
    permissions,
    exec_open_needs_execute,
    write_read_and_refs,
    truncate_and_fallocate,
    sparse_files_show_what_they_store,
    range_work_visits_existing_chunks,
    xattr_names_are_bounded,
    compact_chunk,
    copy_file_range_shares_slices,
    copy_file_range_rules,
    truncate_through_a_handle,
    open_unlink_close,
    trash_keeps_removed_files,
    trash_links_are_counted,
    no_trash_releases_at_once,
    statfs_counts_usage,
    volume_limits_give_enospc,
    dir_quotas_give_edquot,
    renames_move_quota_usage,
    concurrent_creates,
    sessions,
);

/// `rediss://` with JuiceFS's TLS options against a TLS-only redis-server:
/// the CA file makes the server trusted, without it the certificate is
/// refused (no fallback to plain text), `insecure-skip-verify` accepts it,
/// and the engine works over the encrypted connection.
#[test]
fn tls_with_a_ca_file_works_and_an_unknown_certificate_is_refused() {
    let Some(s) = RedisServer::start_tls() else {
        return;
    };
    let ca = s.dir().join("ca.pem");
    // Each check wants a fresh volume: a database each.
    let checks: [conformance::Check; 3] = [
        conformance::format_and_load,
        conformance::create_lookup_getattr,
        conformance::write_read_and_refs,
    ];
    for (db, check) in (3..).zip(checks) {
        let url = format!(
            "rediss://127.0.0.1:{}/{db}?tls-ca-cert-file={}",
            s.port,
            ca.display()
        );
        check(&RedisMeta::open(&url).expect("TLS with the CA file"));
    }
    let base = format!("rediss://127.0.0.1:{}/3", s.port);

    let err = RedisMeta::open(&base).expect_err("a certificate no system root signed");
    assert!(err.to_string().contains("cannot reach Redis"), "{err}");
    let m = RedisMeta::open(&format!("{base}?insecure-skip-verify=true")).expect("insecure");
    m.load().expect("the volume formatted above");

    let plain = format!(
        "redis://127.0.0.1:{}/3?tls-ca-cert-file={}",
        s.port,
        ca.display()
    );
    let err = RedisMeta::open(&plain).expect_err("a TLS option on redis://");
    assert!(err.to_string().contains("use a rediss:// URL"), "{err}");
    let err = RedisMeta::open(&format!("{base}?tls-ca-cert-file=/nonexistent.pem"))
        .expect_err("missing CA");
    assert!(
        err.to_string().contains("cannot read the CA certificate"),
        "{err}"
    );
    let err = RedisMeta::open(&format!("{base}?tls-cert-file={}", ca.display()))
        .expect_err("half a client pair");
    assert!(err.to_string().contains("go together"), "{err}");
}

#[test]
fn keys_follow_the_juicefs_schema() {
    let Some((s, m)) = fresh() else { return };
    m.init(&test_format(0)).expect("format");
    m.load().expect("load");
    let c = Context::default();
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("mkdir");
    let (f, _) = m.create(&c, d, b"f", 0o644, 0).expect("create");
    let id = m.new_slice_id().expect("slice id");
    let slice = Slice {
        pos: 0,
        id,
        size: 10,
        off: 0,
        len: 10,
    };
    m.write_chunk(f, 0, slice, Timestamp::now()).expect("write");
    m.link(&c, f, ROOT_INO, b"h").expect("link");
    m.symlink(&c, ROOT_INO, b"s", b"d/f").expect("symlink");
    let mut r = raw(&s, 1);
    // The settings JSON.
    let setting: String = redis::cmd("GET").arg("setting").query(&mut r).expect("get");
    assert!(
        setting.starts_with("{\n\"Name\": \"conformance\",\n"),
        "{setting}"
    );
    // Entries: type byte + inode big-endian.
    let e: Vec<u8> = redis::cmd("HGET")
        .arg(format!("d{d}"))
        .arg("f")
        .query(&mut r)
        .expect("hget");
    let mut want = vec![FileType::File as u8];
    want.extend_from_slice(&f.to_be_bytes());
    assert_eq!(e, want);
    // Attributes: 72 bytes, type in the top bits of the mode.
    let a: Vec<u8> = redis::cmd("GET")
        .arg(format!("i{f}"))
        .query(&mut r)
        .expect("attr");
    assert_eq!(a.len(), 72);
    assert_eq!(u16::from_be_bytes([a[1], a[2]]), 0x1000 | 0o644);
    // Chunks: 24-byte records.
    let recs: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(format!("c{f}_0"))
        .arg(0)
        .arg(-1)
        .query(&mut r)
        .expect("lrange");
    assert_eq!(recs, vec![slice.encode().to_vec()]);
    // Hard links: nlink 2, parent 0, p{ino} counts both directories.
    let parents: std::collections::HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(format!("p{f}"))
        .query(&mut r)
        .expect("parents");
    assert_eq!(parents.get(&d.to_string()), Some(&1));
    assert_eq!(parents.get("1"), Some(&1));
    // Symlink target; counters; a written-once slice has no sliceRef field.
    let (sl, _) = m.lookup(&c, ROOT_INO, b"s").expect("lookup");
    let t: Vec<u8> = redis::cmd("GET")
        .arg(format!("s{sl}"))
        .query(&mut r)
        .expect("target");
    assert_eq!(t, b"d/f");
    let next: i64 = redis::cmd("GET")
        .arg("nextinode")
        .query(&mut r)
        .expect("nextinode");
    assert!(
        next >= sl as i64,
        "nextinode {next} holds the last inode handed out"
    );
    let inodes: i64 = redis::cmd("GET")
        .arg("totalInodes")
        .query(&mut r)
        .expect("totalInodes");
    assert_eq!(inodes, 3);
    let refs: Option<i64> = redis::cmd("HGET")
        .arg("sliceRef")
        .arg(format!("k{id}_10"))
        .query(&mut r)
        .expect("sliceRef");
    assert_eq!(refs, None);
    let used: i64 = redis::cmd("HGET")
        .arg("dirUsedInodes")
        .arg(d.to_string())
        .query(&mut r)
        .expect("dir stats");
    assert_eq!(used, 1);
    m.close(f).expect("close");
}

#[test]
fn a_restarted_server_is_reconnected() {
    let Some(mut s) = RedisServer::start(true) else {
        return;
    };
    let m = RedisMeta::open(&s.url(2)).expect("open");
    m.init(&test_format(0)).expect("format");
    m.load().expect("load");
    let c = Context::default();
    let (d, _) = m.mkdir(&c, ROOT_INO, b"before", 0o755, 0).expect("mkdir");
    s.kill();
    // While the server is down an operation waits for it, then goes on.
    let restarter = std::thread::scope(|scope| {
        let h = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            s.restart();
        });
        let r = m.mkdir(&c, ROOT_INO, b"after", 0o755, 0);
        h.join().expect("restart");
        r
    });
    let (after, _) = restarter.expect("mkdir once the server is back");
    assert_eq!(m.lookup(&c, ROOT_INO, b"before").expect("kept").0, d);
    assert_eq!(m.lookup(&c, ROOT_INO, b"after").expect("made").0, after);
    // A restart between two operations is invisible.
    s.restart();
    let names: Vec<Vec<u8>> = m
        .readdir(&c, ROOT_INO, false)
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"before".to_vec()) && names.contains(&b"after".to_vec()));
    assert!(s.dir().join("appendonlydir").exists() || s.dir().join("appendonly.aof").exists());
}

#[test]
fn urls_with_juicefs_options_open() {
    let Some(s) = RedisServer::start(false) else {
        return;
    };
    let url = format!("{}?read-timeout=5s&max-retry-backoff=1s", s.url(3));
    let m = crate::meta::open_meta(&url).expect("open");
    assert_eq!(m.name(), "redis");
    assert!(matches!(m.load(), Err(crate::Error::NotFound)));
    let dead = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let err = RedisMeta::open(&format!("redis://u:secret@127.0.0.1:{dead}/1"))
        .expect_err("nothing listens there")
        .to_string();
    assert!(err.contains("cannot reach Redis"), "{err}");
    assert!(!err.contains("secret"), "{err}");
}

fn formatted(trash_days: u32) -> Option<(RedisServer, RedisMeta, redis::Connection)> {
    let (s, m) = fresh()?;
    m.init(&test_format(trash_days)).expect("format");
    m.load().expect("load");
    let r = raw(&s, 1);
    Some((s, m, r))
}

fn write10(m: &RedisMeta, f: u64, pos: u32) -> Slice {
    let id = m.new_slice_id().expect("id");
    let s = Slice {
        pos,
        id,
        size: 10,
        off: 0,
        len: 10,
    };
    m.write_chunk(f, 0, s, Timestamp::now()).expect("write");
    s
}

fn keys(r: &mut redis::Connection) -> Vec<String> {
    let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(r).expect("keys");
    k.sort();
    k
}

#[test]
fn unlink_without_trash_leaves_no_keys() {
    let Some((_s, m, mut r)) = formatted(0) else {
        return;
    };
    m.set_slice_releaser(std::sync::Arc::new(|_| true));
    let c = Context::default();
    let before = keys(&mut r);
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    write10(&m, f, 0);
    m.setxattr(&c, f, b"user.x", b"y", crate::meta::XattrMode::Any)
        .expect("xattr");
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink");
    let after: Vec<String> = keys(&mut r)
        .into_iter()
        .filter(|k| !before.contains(k))
        .collect();
    // Only the counters touched on the way remain.
    assert_eq!(
        after,
        vec!["nextchunk", "nextinode", "totalInodes", "usedSpace"]
    );
    let refs: usize = redis::cmd("HLEN")
        .arg("sliceRef")
        .query(&mut r)
        .expect("hlen");
    assert_eq!(refs, 0);
}

/// copy_file_range counts its records in `sliceRef` as JuiceFS does
/// (references − 1, one per record) and pushes 24-byte records to the
/// destination's chunk lists.
#[test]
fn copy_file_range_counts_references_in_slice_ref() {
    let Some((_s, m, mut r)) = formatted(0) else {
        return;
    };
    let c = Context::default();
    let (src, _) = m.create(&c, ROOT_INO, b"src", 0o644, 0).expect("src");
    let (dst, _) = m.create(&c, ROOT_INO, b"dst", 0o644, 0).expect("dst");
    let s = write10(&m, src, 0);
    let field = format!("k{}_10", s.id);
    let refs = |r: &mut redis::Connection| -> Option<i64> {
        redis::cmd("HGET")
            .arg("sliceRef")
            .arg(&field)
            .query(r)
            .expect("hget")
    };
    assert_eq!(refs(&mut r), None, "written once: no field");
    let req = crate::meta::CopyRange {
        fin: src,
        off_in: 0,
        fout: dst,
        off_out: 0,
        len: 10,
        flags: 0,
    };
    assert_eq!(m.copy_file_range(&req).expect("copy").0, 10);
    assert_eq!(refs(&mut r), Some(1));
    let req = crate::meta::CopyRange {
        off_in: 2,
        off_out: 100,
        len: 3,
        ..req
    };
    assert_eq!(m.copy_file_range(&req).expect("copy").0, 3);
    assert_eq!(refs(&mut r), Some(2));
    let records: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(format!("c{dst}_0"))
        .arg(0)
        .arg(-1)
        .query(&mut r)
        .expect("lrange");
    let records: Vec<Slice> = records
        .iter()
        .map(|b| Slice::decode(b).expect("a 24-byte record"))
        .collect();
    assert_eq!(
        records,
        vec![
            s,
            Slice {
                pos: 100,
                off: 2,
                len: 3,
                ..s
            }
        ]
    );
    let used: i64 = redis::cmd("GET")
        .arg("usedSpace")
        .query(&mut r)
        .expect("usedSpace");
    assert_eq!(used, 2 * 4096, "two small files, one 4 KiB granule each");
    for f in [src, dst] {
        m.close(f).expect("close");
    }
}

#[test]
fn failed_object_deletion_is_retried_by_cleanup() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let Some((_s, m, mut r)) = formatted(0) else {
        return;
    };
    let fail = std::sync::Arc::new(AtomicBool::new(true));
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let (f2, c2) = (fail.clone(), calls.clone());
    m.set_slice_releaser(std::sync::Arc::new(move |_| {
        c2.fetch_add(1, Ordering::SeqCst);
        !f2.load(Ordering::SeqCst)
    }));
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let s = write10(&m, f, 0);
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink");
    let field = format!("k{}_10", s.id);
    let refs: Option<i64> = redis::cmd("HGET")
        .arg("sliceRef")
        .arg(&field)
        .query(&mut r)
        .expect("hget");
    assert_eq!(refs, Some(-1), "kept for a retry, as JuiceFS keeps it");
    fail.store(false, Ordering::SeqCst);
    m.cleanup().expect("cleanup");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let refs: Option<i64> = redis::cmd("HGET")
        .arg("sliceRef")
        .arg(&field)
        .query(&mut r)
        .expect("hget");
    assert_eq!(refs, None);
}

#[test]
fn stale_sessions_release_their_sustained_files() {
    let Some((s, m, mut r)) = formatted(0) else {
        return;
    };
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let sid = m.new_session("{}").expect("session");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink while open");
    let held: Vec<u64> = redis::cmd("SMEMBERS")
        .arg(format!("session{sid}"))
        .query(&mut r)
        .expect("smembers");
    assert_eq!(held, vec![f]);
    let info: Option<String> = redis::cmd("HGET")
        .arg("sessionInfos")
        .arg(sid)
        .query(&mut r)
        .expect("info");
    assert!(info.is_some_and(|i| i.starts_with('{')));
    // The client dies: its session expires; another client cleans up.
    redis::cmd("ZADD")
        .arg("allSessions")
        .arg(1)
        .arg(sid)
        .query::<()>(&mut r)
        .expect("expire");
    std::mem::forget(m);
    let other = RedisMeta::open(&s.url(1)).expect("reopen");
    other.load().expect("load");
    other.cleanup().expect("cleanup");
    let sessions: usize = redis::cmd("ZCARD")
        .arg("allSessions")
        .query(&mut r)
        .expect("zcard");
    assert_eq!(sessions, 0);
    let held: usize = redis::cmd("SCARD")
        .arg(format!("session{sid}"))
        .query(&mut r)
        .expect("scard");
    assert_eq!(held, 0);
    assert!(matches!(other.getattr(f), Err(crate::Error::NotFound)));
}

#[test]
fn a_file_unlinked_elsewhere_stays_while_open_here() {
    let Some((s, a, mut r)) = formatted(0) else {
        return;
    };
    let b = RedisMeta::open(&s.url(1)).expect("second client");
    b.load().expect("load");
    for m in [&a, &b] {
        m.set_slice_releaser(std::sync::Arc::new(|_| true));
        m.new_session("{}").expect("session");
    }
    let c = Context::default();
    let (f, _) = a.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    write10(&a, f, 0);
    a.close(f).expect("close");
    // A last close is recorded in Redis with others, later (here: now).
    a.drain_deletes();
    let held = |r: &mut redis::Connection| -> Vec<u64> {
        let mut v: Vec<u64> = redis::cmd("HKEYS")
            .arg(format!("open{f}"))
            .query(r)
            .expect("hkeys");
        v.sort();
        v
    };
    assert!(held(&mut r).is_empty(), "closed everywhere");

    // Open on both hosts; a unlinks it: both keep it.
    a.open(&c, f, libc::O_RDONLY as u32).expect("open on a");
    b.open(&c, f, libc::O_RDONLY as u32).expect("open on b");
    assert_eq!(held(&mut r), vec![a.session_id(), b.session_id()]);
    a.unlink(&c, ROOT_INO, b"f").expect("unlink on a");
    assert!(matches!(
        b.lookup(&c, ROOT_INO, b"f"),
        Err(crate::Error::NotFound)
    ));
    for sid in [a.session_id(), b.session_id()] {
        let kept: Vec<u64> = redis::cmd("SMEMBERS")
            .arg(format!("session{sid}"))
            .query(&mut r)
            .expect("smembers");
        assert_eq!(kept, vec![f], "session {sid} keeps the file");
    }
    // a closes first: b still holds it and reads it.
    a.close(f).expect("close on a");
    assert_eq!(b.getattr(f).expect("still there").nlink, 0);
    assert_eq!(b.read_chunk(f, 0).expect("chunk").len(), 1);
    // b's last close deletes it, and leaves no record behind.
    b.close(f).expect("close on b");
    a.drain_deletes();
    b.drain_deletes();
    assert!(matches!(a.getattr(f), Err(crate::Error::NotFound)));
    let chunk: bool = redis::cmd("EXISTS")
        .arg(format!("c{f}_0"))
        .query(&mut r)
        .expect("exists");
    assert!(!chunk, "the file's slices went with it");
    assert!(held(&mut r).is_empty());

    // A host that dies with the file open: its session's cleanup deletes it.
    let (g, _) = a.create(&c, ROOT_INO, b"g", 0o644, 0).expect("g");
    write10(&a, g, 0);
    a.close(g).expect("close");
    b.open(&c, g, libc::O_RDONLY as u32).expect("open on b");
    a.unlink(&c, ROOT_INO, b"g").expect("unlink on a");
    assert_eq!(a.getattr(g).expect("kept for b").nlink, 0);
    redis::cmd("ZADD")
        .arg("allSessions")
        .arg(1)
        .arg(b.session_id())
        .query::<()>(&mut r)
        .expect("expire b");
    b.inner.stop_heartbeat();
    a.cleanup().expect("cleanup");
    assert!(matches!(a.getattr(g), Err(crate::Error::NotFound)));
}

#[test]
fn expired_trash_is_emptied() {
    let Some((_s, m, mut r)) = formatted(1) else {
        return;
    };
    let released = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let r2 = released.clone();
    m.set_slice_releaser(std::sync::Arc::new(move |s| {
        r2.lock().push(s);
        true
    }));
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    write10(&m, f, 0);
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("to trash");
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    m.rmdir(&c, ROOT_INO, b"d").expect("dir to trash");
    // Make the hour old: rename its trash directory to 2001.
    let trash = format!("d{}", crate::meta::TRASH_INO);
    let hours: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(&trash)
        .query(&mut r)
        .expect("hours");
    assert_eq!(hours.len(), 1);
    redis::pipe()
        .cmd("HDEL")
        .arg(&trash)
        .arg(&hours[0].0)
        .cmd("HSET")
        .arg(&trash)
        .arg("2001-01-01-00")
        .arg(&hours[0].1)
        .query::<()>(&mut r)
        .expect("age");
    m.cleanup().expect("cleanup");
    assert!(matches!(m.getattr(f), Err(crate::Error::NotFound)));
    assert!(matches!(m.getattr(d), Err(crate::Error::NotFound)));
    let trash_ino = crate::meta::TRASH_INO;
    assert_eq!(m.readdir(&c, trash_ino, false).expect("trash").len(), 2);
    assert_eq!(released.lock().len(), 1);
    for counter in ["usedSpace", "totalInodes"] {
        let v: i64 = redis::cmd("GET")
            .arg(counter)
            .query(&mut r)
            .expect("counter");
        assert_eq!(v, 0, "{counter}");
    }
}

#[test]
fn compaction_with_trash_delays_the_old_slices() {
    let Some((_s, m, mut r)) = formatted(1) else {
        return;
    };
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let old = vec![write10(&m, f, 0), write10(&m, f, 10)];
    let id = m.new_slice_id().expect("id");
    let merged = Slice {
        pos: 0,
        id,
        size: 20,
        off: 0,
        len: 20,
    };
    assert!(m.compact_chunk(f, 0, &old, &[merged]).expect("compact"));
    let delayed: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
        .arg("delSlices")
        .query(&mut r)
        .expect("delSlices");
    assert_eq!(delayed.len(), 1);
    assert!(delayed[0].0.starts_with(&format!("{id}_")));
    assert_eq!(delayed[0].1.len(), 24);
    assert!(
        m.slice_referenced(old[0].id, 10)
            .expect("kept for the trash")
    );
    redis::pipe()
        .cmd("HDEL")
        .arg("delSlices")
        .arg(&delayed[0].0)
        .cmd("HSET")
        .arg("delSlices")
        .arg(format!("{id}_1"))
        .arg(&delayed[0].1)
        .query::<()>(&mut r)
        .expect("age");
    m.cleanup().expect("cleanup");
    assert!(!m.slice_referenced(old[0].id, 10).expect("released"));
    assert!(m.slice_referenced(id, 20).expect("merged"));
    m.close(f).expect("close");
}

#[test]
fn rename_over_a_file_into_trash() {
    let Some((_s, m, mut r)) = formatted(1) else {
        return;
    };
    let c = Context::default();
    let (a, _) = m.create(&c, ROOT_INO, b"a", 0o644, 0).expect("a");
    let (b, _) = m.create(&c, ROOT_INO, b"b", 0o644, 0).expect("b");
    m.close(a).and_then(|_| m.close(b)).expect("close");
    m.link(&c, b, ROOT_INO, b"b2").expect("link");
    m.rename(
        &c,
        ROOT_INO,
        b"a",
        ROOT_INO,
        b"b",
        crate::meta::RenameFlags::default(),
    )
    .expect("rename");
    let hour = crate::meta::TRASH_INO + 1;
    let name = format!("1-{b}-b").into_bytes();
    assert_eq!(m.lookup(&c, hour, &name).expect("in trash").0, b);
    // A hard-linked node keeps its parents in p{ino}: one in the trash now.
    let ba = m.getattr(b).expect("kept");
    assert_eq!((ba.parent, ba.nlink), (0, 2));
    let parents: std::collections::HashMap<u64, i64> = redis::cmd("HGETALL")
        .arg(format!("p{b}"))
        .query(&mut r)
        .expect("parents");
    assert_eq!(parents.get(&ROOT_INO), Some(&1));
    assert_eq!(parents.get(&hour), Some(&1));
}

#[test]
fn two_clients_on_one_volume_stay_consistent() {
    let Some((s, a)) = fresh() else { return };
    a.init(&test_format(0)).expect("format");
    a.load().expect("load");
    let b = RedisMeta::open(&s.url(1)).expect("second client");
    b.load().expect("load");
    let c = Context::default();
    let (d, _) = a.mkdir(&c, ROOT_INO, b"shared", 0o755, 0).expect("mkdir");
    let (f, _) = a.create(&c, ROOT_INO, b"f", 0o644, 0).expect("create");
    // Each client serialises its own writers; between clients only WATCH
    // keeps the directory and the file consistent.
    std::thread::scope(|scope| {
        for (t, m) in [(0, &a), (1, &b)] {
            scope.spawn(move || {
                let c = Context::default();
                for i in 0..40 {
                    let name = format!("c{t}-{i}");
                    m.mkdir(&c, d, name.as_bytes(), 0o755, 0).expect("mkdir");
                    let id = m.new_slice_id().expect("id");
                    let s = Slice {
                        pos: (t * 40 + i) * 100,
                        id,
                        size: 100,
                        off: 0,
                        len: 100,
                    };
                    m.write_chunk(f, 0, s, Timestamp::now()).expect("write");
                }
            });
        }
    });
    assert_eq!(a.getattr(d).expect("d").nlink, 2 + 80);
    assert_eq!(b.readdir(&c, d, false).expect("readdir").len(), 2 + 80);
    assert_eq!(a.read_chunk(f, 0).expect("chunk").len(), 80);
    assert_eq!(b.getattr(f).expect("f").length, 80 * 100);
    let ids: std::collections::HashSet<u64> = a
        .read_chunk(f, 0)
        .expect("chunk")
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids.len(), 80, "the clients' slice ids never collide");
    a.close(f).expect("close");
}

/// The host-local metadata cache: what one client caches is dropped when
/// another changes it — at once, with no wait (Redis writes the push
/// before the writer's answer) — and nothing is served from it while its
/// invalidation feed is down.
#[test]
fn a_cached_entry_or_node_changed_by_another_client_is_not_served() {
    let Some((s, a)) = fresh() else { return };
    a.init(&test_format(0)).expect("format");
    a.load().expect("load");
    let b = RedisMeta::open(&s.url(1)).expect("second client");
    b.load().expect("load");
    // The cache starts with the session.
    b.new_session("b").expect("session");
    let c = Context::default();
    let (x, _) = a.create(&c, ROOT_INO, b"x", 0o644, 0).expect("create");
    a.close(x).expect("close");

    // b caches the entry, the node, and an absent name.
    for _ in 0..2 {
        assert_eq!(b.lookup(&c, ROOT_INO, b"x").expect("x").0, x);
        assert!(matches!(
            b.lookup(&c, ROOT_INO, b"later"),
            Err(Error::NotFound)
        ));
        assert_eq!(b.getattr(x).expect("x").mode, 0o644);
    }
    let before = b.round_trips();
    assert_eq!(b.lookup(&c, ROOT_INO, b"x").expect("x").0, x);
    assert_eq!(b.getattr(x).expect("x").mode, 0o644);
    assert_eq!(b.round_trips(), before, "b answers from its cache");

    // a changes each; b sees every change on its next call.
    a.setattr(
        &c,
        x,
        &SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .expect("chmod");
    assert_eq!(b.getattr(x).expect("x").mode, 0o600, "a's chmod");
    a.rename(
        &c,
        ROOT_INO,
        b"x",
        ROOT_INO,
        b"y",
        crate::meta::RenameFlags::default(),
    )
    .expect("rename");
    assert!(matches!(b.lookup(&c, ROOT_INO, b"x"), Err(Error::NotFound)));
    assert_eq!(b.lookup(&c, ROOT_INO, b"y").expect("y").0, x);
    let (later, _) = a.mkdir(&c, ROOT_INO, b"later", 0o755, 0).expect("mkdir");
    assert_eq!(b.lookup(&c, ROOT_INO, b"later").expect("later").0, later);
    a.unlink(&c, ROOT_INO, b"y").expect("unlink");
    assert!(matches!(b.lookup(&c, ROOT_INO, b"y"), Err(Error::NotFound)));

    // The feed goes away: b serves nothing from its cache, and changes
    // made meanwhile are seen.
    assert_eq!(b.getattr(later).expect("later").mode, 0o755);
    let mut r = raw(&s, 1);
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("SKIPME")
        .arg("yes")
        .arg("TYPE")
        .arg("normal")
        .query(&mut r)
        .expect("kill the clients' connections");
    assert!(killed >= 2, "both clients' feeds and pools: {killed}");
    a.setattr(
        &c,
        later,
        &SetAttr {
            mode: Some(0o700),
            ..Default::default()
        },
    )
    .expect("chmod after the kill");
    assert_eq!(b.getattr(later).expect("later").mode, 0o700);

    // A flush of the database drops everything (a null push). Redis
    // queues that push while the flush runs, before its own answer, so it
    // may reach b a moment after the flush returns: b must see it well
    // within the cache's 60 s expiry.
    let cache = b.inner.cache().expect("b has a cache");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while cache.ticket().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the feed never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(b.getattr(later).expect("later").mode, 0o700);
    assert_eq!(b.getattr(later).expect("later").mode, 0o700);
    redis::cmd("FLUSHDB").query::<()>(&mut r).expect("flushdb");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while b.getattr(later).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "b serves a node the flush removed"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(matches!(b.getattr(later), Err(Error::NotFound)));
}

/// A feed that stops answering (a host cut off without a word: no FIN,
/// no RST; here the server pauses every client) turns the cache off within
/// its heartbeat's limit rather than serve what it can no longer hear
/// being changed.
#[test]
fn a_feed_that_goes_quiet_turns_the_cache_off() {
    let Some((s, m, mut r)) = formatted(0) else {
        return;
    };
    m.new_session("quiet").expect("session");
    let c = Context::default();
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("mkdir");
    m.getattr(d).expect("cache it");
    let before = m.round_trips();
    m.getattr(d).expect("cached");
    assert_eq!(m.round_trips(), before, "served from the cache");
    let cache = m.inner.cache().expect("a cache");
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(8000)
        .arg("ALL")
        .query::<()>(&mut r)
        .expect("pause");
    let paused = Instant::now();
    while cache.ticket().is_some() {
        assert!(
            paused.elapsed() < Duration::from_secs(7),
            "the cache still serves with its feed silent"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        paused.elapsed() > Duration::from_secs(2),
        "turned off only once the PING went unanswered: {:?}",
        paused.elapsed()
    );
    drop(s);
}

#[test]
fn a_cluster_volume_lives_behind_its_hash_tag() {
    let Some(s) = RedisServer::start_cluster() else {
        return;
    };
    let checks: [conformance::Check; 5] = [
        conformance::format_and_load,
        conformance::rename_moves_and_replaces,
        conformance::write_read_and_refs,
        conformance::trash_keeps_removed_files,
        conformance::open_unlink_close,
    ];
    for (db, check) in checks.iter().enumerate() {
        // Database numbers only name the hash tag in a cluster.
        let m = RedisMeta::open(&s.url(db as u32 + 1)).expect("open the cluster");
        check(&m);
    }
    let mut r = raw(&s, 0);
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut r).expect("keys");
    assert!(keys.iter().any(|k| k == "{1}setting"), "{keys:?}");
    assert!(keys.iter().any(|k| k == "{3}nextchunk"), "{keys:?}");
    let stray: Vec<&String> = keys.iter().filter(|k| !k.starts_with('{')).collect();
    assert!(stray.is_empty(), "keys without the hash tag: {stray:?}");
}

#[test]
fn the_durability_warning_names_what_the_server_lacks() {
    let Some(s) = RedisServer::start(true) else {
        return;
    };
    let m = RedisMeta::open(&s.url(1)).expect("open");
    // appendonly yes, appendfsync always: commits are durable when acked.
    assert_eq!(m.durability_gap(), None);
    let mut admin = redis::Client::open(s.url(0).as_str())
        .and_then(|c| c.get_connection())
        .expect("connect");
    let set = |c: &mut redis::Connection, k: &str, v: &str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query::<()>(c)
            .expect("config set");
    };
    set(&mut admin, "appendfsync", "everysec");
    let gap = m.durability_gap().expect("a gap");
    assert!(gap.contains("appendfsync everysec"), "{gap}");
    assert!(gap.contains("appendfsync always"), "{gap}");
    set(&mut admin, "appendonly", "no");
    let gap = m.durability_gap().expect("a gap");
    assert!(gap.contains("appendonly no"), "{gap}");
    assert!(!gap.contains('\n'));
    // A user that may not run CONFIG: the warning says it could not check.
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-config")
        .query::<()>(&mut admin)
        .expect("acl");
    let url = format!("redis://app:secret@127.0.0.1:{}/1", s.port);
    let limited = RedisMeta::open(&url).expect("open as app");
    let gap = limited.durability_gap().expect("a gap");
    assert!(gap.contains("cannot read appendonly"), "{gap}");
    assert!(!gap.contains("secret"), "{gap}");
}

#[test]
fn persistence_settings_map_to_one_line_each() {
    use super::persistence_gap;
    assert_eq!(persistence_gap("h", Some("yes"), Some("always")), None);
    for (a, f, says) in [
        (Some("no"), Some("always"), "appendonly no"),
        (Some("yes"), Some("everysec"), "everysec"),
        (Some("yes"), Some("no"), "appendfsync no"),
        (None, None, "did not report"),
    ] {
        let gap = persistence_gap("h", a, f).expect("a gap");
        assert!(gap.contains(says), "{gap}");
        assert!(gap.contains("Redis at h"), "{gap}");
    }
}

/// Round trips per file operation through the `Vfs` on a Redis volume (a
/// `file://` bucket), 100 files of 4 KiB: what each costs between hosts.
/// Counted by the pool (a command or a pipeline is one), a number that does
/// not depend on load; the bounds keep a change from adding trips back.
#[test]
fn round_trips_per_file_operation() {
    if let Some(s) = RedisServer::start(false) {
        round_trips_on(&s);
    }
}

/// The same on a Redis Cluster (every key behind the volume's hash tag, so
/// each transaction still goes to one node).
#[test]
fn round_trips_per_file_operation_on_a_cluster() {
    if let Some(s) = RedisServer::start_cluster() {
        round_trips_on(&s);
    }
}

fn round_trips_on(s: &RedisServer) {
    use crate::vfs::{Filesystem as _, Vfs, VfsConfig};
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = std::sync::Arc::new(RedisMeta::open(&s.url(1)).expect("open"));
    let meta: std::sync::Arc<dyn Meta> = redis.clone();
    crate::volume::format_volume(
        &*meta,
        "trips",
        &dir.path().join("bucket"),
        4096,
        crate::format::Compression::None,
        0,
    )
    .expect("format");
    let vol = crate::volume::open_volume(meta.clone()).expect("volume");
    let vfs = Vfs::new(
        vol,
        VfsConfig {
            cleanup_interval: None,
            compaction: false,
            prefetch_threads: 0,
            ..VfsConfig::default()
        },
    )
    .expect("vfs");
    let ctx = Context::default();
    const N: u64 = 100;
    let data = vec![7u8; 4096];
    let phase = |f: &mut dyn FnMut(u64)| -> u64 {
        let before = meta.round_trips();
        // The background deleter takes the phase's deletes as one batch,
        // as it does when unlinks come faster than it wakes: otherwise how
        // many batches it makes depends on the host's load.
        let hold = redis.hold_deletes();
        for i in 0..N {
            f(i);
        }
        drop(hold);
        // The commits closes handed on, and the deletes unlinks queued,
        // are part of what the operation costs.
        vfs.syncfs(&ctx).expect("syncfs");
        meta.drain_deletes();
        meta.round_trips() - before
    };
    let mut inos = Vec::new();
    let create = phase(&mut |i| {
        let (e, out) = vfs
            .create(
                &ctx,
                ROOT_INO,
                format!("f{i}").as_bytes(),
                0o644,
                0,
                libc::O_RDWR as u32,
            )
            .expect("create");
        // What the kernel asks before a write (to drop file capabilities):
        // a node made here has no extended attributes, known without a
        // round trip.
        assert!(matches!(
            vfs.getxattr(&ctx, e.inode, b"security.capability"),
            Err(Error::NoXattr)
        ));
        vfs.write_buf(&ctx, e.inode, out.fh, 0, &data, false)
            .expect("write");
        vfs.flush(&ctx, e.inode, out.fh).expect("flush");
        vfs.release(&ctx, e.inode, out.fh).expect("close");
        inos.push(e.inode);
    });
    let stat = phase(&mut |i| {
        vfs.getattr(&ctx, inos[i as usize]).expect("stat");
    });
    // Unchanged since, the attributes come from the host-local cache.
    let stat_again = phase(&mut |i| {
        vfs.getattr(&ctx, inos[i as usize]).expect("stat");
    });
    let lookup = phase(&mut |i| {
        vfs.lookup(&ctx, ROOT_INO, format!("f{i}").as_bytes())
            .expect("lookup");
    });
    let lookup_again = phase(&mut |i| {
        vfs.lookup(&ctx, ROOT_INO, format!("f{i}").as_bytes())
            .expect("lookup");
    });
    let read = phase(&mut |i| {
        let ino = inos[i as usize];
        let out = vfs.open(&ctx, ino, libc::O_RDONLY as u32).expect("open");
        let mut buf = vec![0u8; 4096];
        assert_eq!(
            vfs.read_buf(&ctx, ino, out.fh, 0, &mut buf).expect("read"),
            4096
        );
        vfs.flush(&ctx, ino, out.fh).expect("flush");
        vfs.release(&ctx, ino, out.fh).expect("close");
    });
    let unlink = phase(&mut |i| {
        vfs.unlink(&ctx, ROOT_INO, format!("f{i}").as_bytes())
            .expect("unlink");
    });
    let per = |t: u64| t as f64 / N as f64;
    eprintln!(
        "round trips per operation: create+write+close {:.2}, stat {:.2} (again {:.2}), lookup {:.2} (again {:.2}), open+read+close {:.2}, unlink {:.2}",
        per(create),
        per(stat),
        per(stat_again),
        per(lookup),
        per(lookup_again),
        per(read),
        per(unlink)
    );
    // The goals of the metadata path (JuiceFS 1.4 on the same server: 11,
    // 1, 4, 15). A quarter of a trip per operation covers what is shared
    // by many (slice and inode ids taken in batches, closes and deletes
    // recorded in batches, a heartbeat).
    for (what, got, goal) in [
        ("create + write + close", per(create), 4.0),
        ("stat", per(stat), 1.0),
        ("stat of an unchanged file", per(stat_again), 0.0),
        ("lookup", per(lookup), 1.0),
        ("lookup of an unchanged entry", per(lookup_again), 0.0),
        ("open + read + close", per(read), 2.0),
        ("unlink", per(unlink), 4.0),
    ] {
        assert!(
            got <= goal + 0.25,
            "{what}: {got:.2} round trips per file, more than {goal}"
        );
    }
    vfs.destroy();
}

/// A lookup is one round trip by the script's digest; a server that lost
/// its scripts (`SCRIPT FLUSH`, a restart, a failover) is sent the script
/// again, and the lookup answers as before.
#[test]
fn lookups_survive_a_script_flush() {
    let Some((_s, m, mut r)) = formatted(0) else {
        return;
    };
    m.new_session("flush").expect("session");
    let c = Context::default();
    // The first lookup loads the script.
    assert!(matches!(
        m.lookup(&c, ROOT_INO, b"f"),
        Err(crate::Error::NotFound)
    ));
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let (g, _) = m.create(&c, ROOT_INO, b"g", 0o644, 0).expect("g");
    let before = m.round_trips();
    assert_eq!(m.lookup(&c, ROOT_INO, b"f").expect("lookup").0, f);
    assert_eq!(m.round_trips() - before, 1, "a lookup is one round trip");
    let before = m.round_trips();
    assert_eq!(m.lookup(&c, ROOT_INO, b"f").expect("lookup").0, f);
    assert_eq!(
        m.round_trips() - before,
        0,
        "an unchanged entry is looked up in the host-local cache"
    );
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut r)
        .expect("flush");
    assert_eq!(m.lookup(&c, ROOT_INO, b"g").expect("after a flush").0, g);
    assert!(matches!(
        m.lookup(&c, ROOT_INO, b"none"),
        Err(crate::Error::NotFound)
    ));
}

/// A group commit's writes on Redis: one round trip reads every file's
/// node, one commits; a file that fails (here: removed) is rolled back
/// alone.
#[test]
fn a_group_of_writes_is_two_round_trips_and_a_failure_stays_its_own() {
    use crate::meta::ChunkWrite;
    let Some((_s, m, _r)) = formatted(0) else {
        return;
    };
    let c = Context::default();
    let mut files = Vec::new();
    for name in [b"a".as_slice(), b"b", b"c"] {
        let (f, _) = m.create(&c, ROOT_INO, name, 0o644, 0).expect("create");
        m.close(f).expect("close");
        files.push(f);
    }
    m.unlink(&c, ROOT_INO, b"b").expect("unlink");
    let write = |ino: crate::meta::Ino, id: u64| ChunkWrite {
        ino,
        indx: 0,
        slice: Slice {
            pos: 0,
            id,
            size: 10,
            off: 0,
            len: 10,
        },
        mtime: Timestamp::now(),
    };
    let ids: Vec<u64> = (0..4).map(|_| m.new_slice_id().expect("id")).collect();
    let before = m.round_trips();
    let out = m.write_chunks(&[
        vec![write(files[0], ids[0]), write(files[0], ids[1])],
        vec![write(files[1], ids[2])],
        vec![write(files[2], ids[3])],
    ]);
    assert_eq!(m.round_trips() - before, 2);
    assert_eq!(out[0].counts, [1, 2]);
    assert!(out[0].error.is_none());
    assert!(
        matches!(out[1].error, Some(crate::Error::NotFound)),
        "{:?}",
        out[1]
    );
    assert!(out[1].counts.is_empty());
    assert_eq!(out[2].counts, [1]);
    assert_eq!(m.getattr(files[0]).expect("a").length, 10);
    assert_eq!(m.read_chunk(files[0], 0).expect("chunk").len(), 2);
    assert_eq!(m.getattr(files[2]).expect("c").length, 10);
}

/// A free port on loopback.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A redis-server process the test started (killed when dropped).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A replica of `master` on a port of its own.
fn start_replica(dir: &Path, master: u16) -> (Proc, u16) {
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--replicaof", "127.0.0.1", &master.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the replica");
    wait_ready(port, false);
    (Proc(child), port)
}

/// A sentinel watching `master` as `mymaster` (quorum 2), quick to act.
fn start_sentinel(dir: &Path, master: u16) -> (Proc, u16) {
    let port = free_port();
    let conf = dir.join(format!("sentinel-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor mymaster 127.0.0.1 {master} 2\n\
             sentinel down-after-milliseconds mymaster 1000\n\
             sentinel failover-timeout mymaster 10000\n\
             sentinel parallel-syncs mymaster 1\n",
            dir.display()
        ),
    )
    .expect("sentinel.conf");
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a sentinel");
    wait_ready(port, false);
    (Proc(child), port)
}

/// Waits until `check` holds (20 s at most).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The master a sentinel names for `mymaster`.
fn master_of(sentinel: u16) -> Option<u16> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{sentinel}/").as_str())
        .and_then(|c| c.get_connection())
        .ok()?;
    let addr: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg("mymaster")
        .query(&mut c)
        .ok()?;
    addr.and_then(|(_, p)| p.parse().ok())
}

/// A volume on a Redis Sentinel deployment (JuiceFS's URL form), its
/// master killed while files are written and fsync'ed: the mount carries on
/// on the promoted replica, and every file fsync'ed (with
/// `?fsync-replicas=1`: fsync waits until the replica holds every write) is
/// there, whole, after the failover.
#[test]
fn a_sentinel_failover_loses_nothing_fsynced() {
    use crate::vfs::{Filesystem as _, Vfs, VfsConfig};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(mut master) = RedisServer::start(false) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Two replicas: after the failover one is the master, and the other
    // follows it, so fsync still has a replica to wait for.
    let (_replica, replica_port) = start_replica(dir.path(), master.port);
    let (_second, second_port) = start_replica(dir.path(), master.port);
    let mut sentinels = Vec::new();
    for _ in 0..3 {
        sentinels.push(start_sentinel(dir.path(), master.port));
    }
    let ports: Vec<u16> = sentinels.iter().map(|(_, p)| *p).collect();
    eventually("the replica to be in sync", || {
        let mut c = raw(&master, 0);
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut c)
            .unwrap_or_default();
        info.matches("state=online").count() == 2
    });
    eventually("the sentinels to see the master", || {
        ports.iter().all(|p| master_of(*p) == Some(master.port))
    });
    let url = format!(
        "redis://mymaster,{}/1?fsync-replicas=1",
        ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let meta: Arc<dyn Meta> = Arc::new(RedisMeta::open(&url).expect("open by sentinel"));
    crate::volume::format_volume(
        &*meta,
        "sentinel",
        &dir.path().join("bucket"),
        4096,
        crate::format::Compression::None,
        0,
    )
    .expect("format");
    let vfs = Arc::new(
        Vfs::new(
            crate::volume::open_volume(meta.clone()).expect("volume"),
            VfsConfig {
                cleanup_interval: None,
                ..VfsConfig::default()
            },
        )
        .expect("vfs"),
    );
    let done = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (vfs, done) = (vfs.clone(), done.clone());
        std::thread::spawn(move || {
            let ctx = Context::default();
            let mut fsynced = Vec::new();
            for i in 0..60u32 {
                let name = format!("f{i}");
                let data = vec![i as u8; 4096];
                // The operation in flight when the master dies may fail
                // (its outcome is unknown): that file is not counted.
                let r = vfs
                    .create(
                        &ctx,
                        ROOT_INO,
                        name.as_bytes(),
                        0o644,
                        0,
                        libc::O_RDWR as u32,
                    )
                    .and_then(|(e, out)| {
                        vfs.write_buf(&ctx, e.inode, out.fh, 0, &data, false)?;
                        let synced = vfs.fsync(&ctx, e.inode, out.fh, false);
                        vfs.release(&ctx, e.inode, out.fh)?;
                        synced
                    });
                match r {
                    Ok(()) => fsynced.push(i),
                    Err(e) => eprintln!("{name}: {e} (during the failover)"),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            fsynced
        })
    };
    eventually("20 files", || done.load(Ordering::SeqCst) >= 20);
    master.kill();
    let fsynced = writer.join().expect("the writer");
    eventually("the failover", || {
        ports
            .iter()
            .all(|p| matches!(master_of(*p), Some(m) if m == replica_port || m == second_port))
    });
    assert!(
        fsynced.len() >= 50,
        "the mount did not carry on after the failover: {} files fsync'ed",
        fsynced.len()
    );
    // Read back through a new client of the new master.
    vfs.destroy();
    drop(vfs);
    let again = RedisMeta::open(&url).expect("open after the failover");
    again.load().expect("load");
    let c = Context::default();
    for i in fsynced {
        let (ino, attr) = again
            .lookup(&c, ROOT_INO, format!("f{i}").as_bytes())
            .unwrap_or_else(|e| panic!("f{i} was fsync'ed and is gone: {e}"));
        assert_eq!(attr.length, 4096, "f{i}");
        assert_eq!(again.read_chunk(ino, 0).expect("chunk").len(), 1, "f{i}");
    }
}

/// POSIX ACLs travel through a dump: a SQLite volume's rules load into
/// Redis under new ids (the `acl` hash, `aclMaxId`), the nodes name them,
/// and a dump of the Redis volume is the dump it was loaded from.
#[test]
fn acls_travel_from_sqlite_to_redis_through_a_dump() {
    use crate::meta::acl::{AclEntry, AclType, Rule};
    use crate::meta::{Meta, SqliteMeta, Store};
    let Some((server, m)) = fresh() else { return };
    let dir = tempfile::tempdir().unwrap();
    let a = SqliteMeta::open(dir.path().join("a.db")).unwrap();
    let mut f = conformance::test_format(0);
    f.enable_acl = true;
    a.init(&f).unwrap();
    a.load().unwrap();
    let ctx = Context::internal();
    let (d, _) = a.mkdir(&ctx, ROOT_INO, b"d", 0o755, 0).unwrap();
    let (file, _) = a.create(&ctx, d, b"f", 0o644, 0).unwrap();
    a.close(file).unwrap();
    let rule = Rule {
        owner: 6,
        group: 4,
        mask: 6,
        other: 0,
        named_users: vec![AclEntry { id: 2000, perm: 6 }],
        named_groups: vec![],
    };
    a.set_facl(&ctx, file, AclType::Access, &rule).unwrap();
    a.set_facl(&ctx, d, AclType::Default, &rule).unwrap();
    let mut first = Vec::new();
    crate::dump::dump(&a, &mut first, &Default::default(), &mut |_| {}).unwrap();
    crate::dump::load(&m, &mut &first[..], &mut |_| {}).unwrap();
    m.load().unwrap();
    assert_eq!(
        m.get_facl(file, AclType::Access).unwrap(),
        Some(rule.clone())
    );
    assert_eq!(m.get_facl(d, AclType::Default).unwrap(), Some(rule));
    // One rule, stored once, under id 1.
    let mut c = raw(&server, 1);
    let max: i64 = redis::cmd("GET").arg("aclMaxId").query(&mut c).unwrap();
    let n: i64 = redis::cmd("HLEN").arg("acl").query(&mut c).unwrap();
    assert_eq!((max, n), (1, 1));
    let mut second = Vec::new();
    crate::dump::dump(&m, &mut second, &Default::default(), &mut |_| {}).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&first),
        String::from_utf8_lossy(&second)
    );
}

/// Preallocation lists no chunks: a fallocate that only changes the length
/// costs its transaction alone; one that punches a hole also reads which
/// chunks of its range exist (one pipeline of probes).
#[test]
fn preallocation_costs_no_listing_of_chunks() {
    use crate::meta::bounded::{FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE};
    let Some((_s, m, _r)) = formatted(0) else {
        return;
    };
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    write10(&m, f, 0);
    let before = m.round_trips();
    m.fallocate(&c, f, 0, 0, 1 << 20).expect("preallocate");
    let prealloc = m.round_trips() - before;
    let before = m.round_trips();
    m.fallocate(&c, f, FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE, 0, 5)
        .expect("punch");
    let punch = m.round_trips() - before;
    assert_eq!(
        punch,
        prealloc + 2,
        "a punch reads the node and probes the range's chunks first"
    );
}

/// A file with holes keeps its space record under `sluiceSpace{ino}`
/// (no key JuiceFS uses or scans), written with its node; a file whose
/// data another client changed without one (its mtime moved) shows its
/// length; the record goes with the node's next write, or with the node.
#[test]
fn a_space_record_is_kept_beside_the_node_and_holds_only_for_it() {
    let Some(s) = RedisServer::start(false) else {
        return;
    };
    // No host-local cache: the test changes a node behind the engine.
    let url = format!("{}?client-cache=false", s.url(1));
    let m = RedisMeta::open(&url).expect("open");
    conformance::format_and_load(&m);
    let c = Context::internal();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let id = m.new_slice_id().expect("id");
    let slice = Slice {
        pos: 1 << 20,
        id,
        size: 4096,
        off: 0,
        len: 4096,
    };
    m.write_chunk(f, 0, slice, Timestamp::now()).expect("write");
    assert_eq!(m.getattr(f).expect("getattr").space, Some(4096));
    let mut r = raw(&s, 1);
    let rec: Vec<u8> = redis::cmd("GET")
        .arg(format!("sluiceSpace{f}"))
        .query(&mut r)
        .expect("record");
    assert_eq!(rec.len(), 28);
    assert_eq!(rec[..8], 4096u64.to_be_bytes());
    // Another client writes the file: its mtime (bytes 23..31) moves.
    let mut node: Vec<u8> = redis::cmd("GET")
        .arg(format!("i{f}"))
        .query(&mut r)
        .expect("node");
    node[30] = node[30].wrapping_add(1);
    let () = redis::cmd("SET")
        .arg(format!("i{f}"))
        .arg(&node)
        .query(&mut r)
        .expect("set");
    assert_eq!(m.getattr(f).expect("getattr").space, None);
    m.setattr(
        &c,
        f,
        &SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    )
    .expect("chmod");
    let left: bool = redis::cmd("EXISTS")
        .arg(format!("sluiceSpace{f}"))
        .query(&mut r)
        .expect("exists");
    assert!(!left, "the stale record went with the node's next write");
    m.close(f).expect("close");
    // A client that keeps no records removes a file with holes: fsck
    // finds its record and removes it with --repair.
    let (g, _) = m.create(&c, ROOT_INO, b"g", 0o644, 0).expect("g");
    let slice = Slice {
        id: m.new_slice_id().expect("id"),
        ..slice
    };
    m.write_chunk(g, 0, slice, Timestamp::now()).expect("write");
    m.close(g).expect("close");
    let () = redis::cmd("DEL")
        .arg(format!("i{g}"))
        .query(&mut r)
        .expect("del");
    assert_eq!(m.orphan_space_records(false).expect("count"), 1);
    assert_eq!(m.orphan_space_records(true).expect("remove"), 1);
    assert_eq!(m.orphan_space_records(false).expect("count"), 0);
}
