//! End-to-end: the sandbox of `sluice serve` (the real daemon, started as
//! root, driven by the virtio-fs driver harness). Once set up it runs as
//! `nobody` on every thread and still serves a SQLite + `file://` volume
//! with a disk cache and writeback; Landlock stops it opening a file
//! outside the volume that `nobody` could otherwise read; a system call
//! outside the seccomp allowlist kills it with SIGSYS. Those two use the
//! debug-build hook `SLUICE_DEBUG_SANDBOX_PROBE` (src/sandbox/mod.rs). On
//! Redis metadata (a real `redis-server`, named by address and by host
//! name) it keeps serving after Redis drops its connections and after Redis
//! restarts: it resolves the name and connects again inside the sandbox,
//! also after the system replaced `/etc/hosts` (in a mount namespace of the
//! test's, in `/etc` and where a link from there points), and through a
//! DNS server of the test's after `resolv.conf` was replaced.
//! Over TLS it reads the system's roots (here through `SSL_CERT_DIR` links)
//! for every new connection, a CA installed while it serves included, and
//! refuses to start when its user cannot; on
//! a Unix socket likewise, refusing one only root may connect to.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{RedisServer, SLUICE, Volume, Watchdog, sluice};
use sluice_benches::virtiofs::wire::ROOT_ID;
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue, HarnessError};

/// FUSE_UNLINK, FUSE_RENAME and FUSE_FSYNC, which the harness has no
/// helpers for.
const FUSE_UNLINK: u32 = 10;
const FUSE_RENAME: u32 = 12;
const FUSE_FSYNC: u32 = 20;

struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    fn start(vol: &Volume, socket: &Path, extra: &[&str], probe: Option<&str>) -> Serve {
        let env: Vec<(&str, &str)> = probe
            .map(|p| ("SLUICE_DEBUG_SANDBOX_PROBE", p))
            .into_iter()
            .collect();
        Serve::start_on(&vol.meta_url, vol.dir.path(), socket, extra, &env)
    }

    /// `sluice serve META_URL` with its disk cache and writeback staging
    /// in `dir`, and `env` added to its environment.
    fn start_on(
        meta_url: &str,
        dir: &Path,
        socket: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Serve {
        Serve::start_in(&[], meta_url, dir, socket, extra, env)
    }

    /// The same, with the test's directories `mounts` mounted over the
    /// host's in the daemon's view (see [`sluice_command`]).
    fn start_in(
        mounts: &[(&Path, &str)],
        meta_url: &str,
        dir: &Path,
        socket: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Serve {
        let log = socket.with_extension("log");
        let logf = fs::File::create(&log).unwrap();
        let cache = dir.join("cache");
        let mut cmd = sluice_command(mounts);
        cmd.args(["serve", meta_url, "--socket"])
            .arg(socket)
            .args([
                "--no-pin",
                "--cache-size",
                "64",
                "--writeback",
                "--cache-dir",
            ])
            .arg(&cache)
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("SLUICE_DEBUG_SANDBOX_PROBE")
            .envs(env.iter().copied());
        let child = cmd
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("sluice serve starts");
        Serve { child, log }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `needle`; panics if the daemon exits first.
    fn wait_for_log(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = self.log_text();
            if text.contains(needle) {
                return text;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("sluice serve exited ({status}) before logging {needle:?}:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the log:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice serve still runs:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the log of sluice serve:\n{}", self.log_text());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A command running `sluice`; with `mounts` (a directory of the test's,
/// where the daemon sees it), in a mount namespace of its own where each
/// is mounted there, so that the test can change the host's files (replace
/// `/etc/hosts`) without touching the host's.
fn sluice_command(mounts: &[(&Path, &str)]) -> Command {
    if mounts.is_empty() {
        return Command::new(SLUICE);
    }
    let script: String = mounts
        .iter()
        .map(|(_, at)| format!(r#"mount --bind "$1" {at} && shift && "#))
        .chain(std::iter::once(r#"exec "$@""#.to_owned()))
        .collect();
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(script)
        .arg("sh")
        .args(mounts.iter().map(|(dir, _)| dir))
        .arg(SLUICE);
    cmd
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `nobody`'s uid and gid, from the passwd database.
fn nobody() -> (u32, u32) {
    let name = c"nobody";
    // SAFETY: `name` is a C string; the entry is read at once, before any
    // other passwd call in this process can overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(!pw.is_null(), "this host has a `nobody` user");
    // SAFETY: getpwnam returned a valid entry.
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

/// The value of `field` (e.g. `Uid:`) in a /proc status file.
fn status_field(status: &str, field: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn a_sandboxed_daemon_runs_as_nobody_on_every_thread_and_still_serves() {
    if !is_root() {
        println!("skipped: sluice serve switches users only when started as root");
        return;
    }
    let _dog = Watchdog::new("sandbox", Duration::from_secs(300));
    let vol = Volume::format("sandbox", &[]);
    let socket = vol.dir.path().join("vm.sock");
    let mut serve = Serve::start(&vol, &socket, &["--metrics", "127.0.0.1:0"], None);
    let log = serve.wait_for_log("waiting for a VM");
    assert!(log.contains("running as nobody"), "{log}");

    let mut device = Device::connect(
        &socket,
        DeviceOptions {
            request_queues: 1,
            queue_size: 256,
            memory_size: 8 << 20,
        },
    )
    .expect("connect");
    let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    q.init().expect("INIT");

    // Create, write (more than one block, so objects and staged blocks are
    // made after the switch), fsync, close; read it back through a new
    // handle.
    let data: Vec<u8> = (0..6 << 20).map(|i: u32| (i % 251) as u8).collect();
    let dir = q.mkdir(ROOT_ID, b"d", 0o755).expect("MKDIR");
    let (file, fh) = q
        .create(dir.nodeid, b"f", libc::O_RDWR as u32, 0o644)
        .expect("CREATE");
    for (i, piece) in data.chunks(512 << 10).enumerate() {
        let n = q
            .write(file.nodeid, fh, (i * (512 << 10)) as u64, piece)
            .expect("WRITE");
        assert_eq!(n as usize, piece.len());
    }
    let mut fsync_in = fh.to_le_bytes().to_vec();
    fsync_in.extend_from_slice(&[0; 8]);
    q.call(FUSE_FSYNC, file.nodeid, &fsync_in)
        .expect("FSYNC sent")
        .ok(FUSE_FSYNC)
        .expect("FSYNC succeeds");
    q.flush(file.nodeid, fh).expect("FLUSH");
    q.release(file.nodeid, fh).expect("RELEASE");
    let fh = q.open(file.nodeid, libc::O_RDONLY as u32).expect("OPEN");
    let mut back = Vec::new();
    while back.len() < data.len() {
        let piece = q
            .read(file.nodeid, fh, back.len() as u64, 512 << 10)
            .expect("READ");
        assert!(!piece.is_empty(), "short file");
        back.extend_from_slice(&piece);
    }
    assert!(back == data, "the data read back differs");
    q.release(file.nodeid, fh).expect("RELEASE");
    assert_eq!(
        q.getattr(file.nodeid).expect("GETATTR").size,
        data.len() as u64
    );

    // Every thread runs as nobody, without privileges, under seccomp.
    let (uid, gid) = nobody();
    let pid = serve.child.id();
    let mut threads = 0;
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        assert_eq!(
            status_field(&status, "Uid:"),
            format!("{uid} {uid} {uid} {uid}")
        );
        assert_eq!(
            status_field(&status, "Gid:"),
            format!("{gid} {gid} {gid} {gid}")
        );
        // No capability, or CAP_IPC_LOCK alone where the locked-memory
        // limit could not be lifted (root without CAP_SYS_RESOURCE, as in
        // most containers), and then the log says so.
        let caps = status_field(&status, "CapEff:");
        if caps == "0000000000004000" {
            assert!(log.contains("keeps CAP_IPC_LOCK alone"), "{log}");
        } else {
            assert_eq!(caps, "0000000000000000");
        }
        assert_eq!(status_field(&status, "NoNewPrivs:"), "1");
        assert_eq!(status_field(&status, "Seccomp:"), "2", "filter mode");
        threads += 1;
    }
    assert!(threads > 1, "the daemon has its worker threads");

    // The files it made after the switch are nobody's: the bucket's objects.
    let objects = vol.objects();
    assert!(!objects.is_empty(), "the written blocks reached the bucket");
    for o in &objects {
        assert_eq!(fs::metadata(o).unwrap().uid(), uid, "{}", o.display());
    }

    // Scrapes (HTTP and `sluice stats` on the control socket) are answered
    // from inside the sandbox, and the guest's bytes are counted.
    let metrics = common::scrape(&common::metrics_addr(&|| serve.log_text()));
    assert!(
        metrics.contains("sluice_virtiofs_requests_total"),
        "{metrics}"
    );
    assert!(metrics.contains("juicefs_used_space"), "{metrics}");
    let stats = common::sluice(&["stats", socket.to_str().unwrap(), "--count", "1"]);
    assert!(stats.status.success(), "{}", common::text(&stats));

    drop(q);
    drop(device);
    assert!(serve.child.try_wait().unwrap().is_none(), "still serving");
}

#[test]
fn the_daemon_cannot_open_a_file_outside_its_volume() {
    if !is_root() || !cfg!(debug_assertions) {
        println!("skipped: needs root and a debug build (the probe hook)");
        return;
    }
    let _dog = Watchdog::new("sandbox-landlock", Duration::from_secs(300));
    let vol = Volume::format("landlock", &[]);
    // A file nobody may read by its permissions: only Landlock stops it.
    let outside = tempfile::tempdir().unwrap();
    fs::set_permissions(outside.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let secret = outside.path().join("other-tenant.txt");
    fs::write(&secret, b"not yours").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o644)).unwrap();
    let probe = format!("open:{}", secret.display());

    let socket = vol.dir.path().join("on.sock");
    let mut serve = Serve::start(&vol, &socket, &[], Some(&probe));
    let log = serve.wait_for_log("sandbox probe:");
    if log.contains("this kernel has no Landlock") {
        println!("skipped: this kernel has no Landlock");
        return;
    }
    serve.wait_for_log(&format!(
        "sandbox probe: cannot open {}: errno {}",
        secret.display(),
        libc::EACCES
    ));
    drop(serve);

    // The same daemon without Landlock opens it: the refusal above was
    // Landlock's, not the file's permissions.
    let socket = vol.dir.path().join("off.sock");
    let mut serve = Serve::start(&vol, &socket, &["--landlock", "off"], Some(&probe));
    serve.wait_for_log(&format!("sandbox probe: opened {}", secret.display()));
    drop(serve);

    // Kept as root, the daemon may read the name service's files in /etc,
    // not /etc: root's own files there stay out of its reach (as nobody,
    // /etc is readable and its permissions keep it out of them).
    let shadow = Path::new("/etc/shadow");
    if shadow.exists() {
        let socket = vol.dir.path().join("root.sock");
        let probe = format!("open:{}", shadow.display());
        let mut serve = Serve::start(&vol, &socket, &["--user", "root"], Some(&probe));
        let log = serve.wait_for_log(&format!(
            "sandbox probe: cannot open /etc/shadow: errno {}",
            libc::EACCES
        ));
        assert!(log.contains("kept as root"), "{log}");
    }
}

#[test]
fn a_forbidden_system_call_kills_the_daemon() {
    if !cfg!(debug_assertions) {
        println!("skipped: needs a debug build (the probe hook)");
        return;
    }
    let _dog = Watchdog::new("sandbox-seccomp", Duration::from_secs(300));
    let vol = Volume::format("seccomp", &[]);
    let socket = vol.dir.path().join("kill.sock");
    let mut serve = Serve::start(&vol, &socket, &[], Some("syscall"));
    let status = serve.wait_exit();
    let log = serve.log_text();
    assert!(log.contains("calling personality"), "{log}");
    assert!(!log.contains("personality returned"), "{log}");
    assert_eq!(status.signal(), Some(libc::SIGSYS), "{status}: {log}");

    // `--seccomp log` lets the call through (and the kernel logs it).
    let socket = vol.dir.path().join("log.sock");
    let mut serve = Serve::start(&vol, &socket, &["--seccomp", "log"], Some("syscall"));
    serve.wait_for_log("sandbox probe: personality returned");
    assert!(serve.child.try_wait().unwrap().is_none(), "still running");
}

#[test]
fn bad_sandbox_flags_are_refused_with_a_clear_message() {
    let vol = Volume::format("flags", &[]);
    let socket = vol.dir.path().join("s.sock");
    let socket = socket.to_str().unwrap();
    let out = sluice(&[
        "serve",
        &vol.meta_url,
        "--socket",
        socket,
        "--user",
        "no-such-user-here",
    ]);
    let text = common::text(&out);
    assert!(!out.status.success());
    assert!(
        text.contains("--user no-such-user-here: no such user"),
        "{text}"
    );
    assert!(!Path::new(socket).exists(), "nothing was opened: {text}");
    for (flag, value) in [("--seccomp", "maybe"), ("--landlock", "sometimes")] {
        let out = sluice(&["serve", &vol.meta_url, "--socket", socket, flag, value]);
        let text = common::text(&out);
        assert!(!out.status.success());
        assert!(
            text.contains(&format!("invalid value '{value}' for '{flag}")),
            "{text}"
        );
    }
}

/// The data of file `name` (a few blocks, so objects are made and staged).
fn pattern(name: &[u8]) -> Vec<u8> {
    let seed = name.iter().map(|&b| u32::from(b)).sum::<u32>();
    (0..(3 << 20) + 4097)
        .map(|i: u32| (i.wrapping_mul(31).wrapping_add(seed) % 253) as u8)
        .collect()
}

/// The errno of a refused request.
fn errno<T: std::fmt::Debug>(r: Result<T, HarnessError>) -> i32 {
    match r {
        Err(HarnessError::Errno { errno, .. }) => errno,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

/// Reads all of file `node` through a new handle.
fn read_all(q: &mut FuseQueue, node: u64) -> Vec<u8> {
    let fh = q.open(node, libc::O_RDONLY as u32).expect("OPEN");
    let mut back = Vec::new();
    loop {
        let piece = q
            .read(node, fh, back.len() as u64, 512 << 10)
            .expect("READ");
        if piece.is_empty() {
            break;
        }
        back.extend_from_slice(&piece);
    }
    q.release(node, fh).expect("RELEASE");
    back
}

/// The names in directory `dir`, sorted, without `.` and `..`.
fn list(q: &mut FuseQueue, dir: u64) -> Vec<String> {
    let dh = q.opendir(dir).expect("OPENDIR");
    let mut names: Vec<String> = q
        .readdirplus(dir, dh, 0, 64 << 10)
        .expect("READDIRPLUS")
        .iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    q.releasedir(dir, dh).expect("RELEASEDIR");
    names.sort();
    names
}

/// One round of guest traffic in a new directory `round`: create, write,
/// fsync and read back a file, list the directory, rename the file, unlink
/// a second one. Leaves `round/kept` with [`pattern`]`(round)`.
fn guest_round(q: &mut FuseQueue, round: &[u8]) {
    let dir = q.mkdir(ROOT_ID, round, 0o755).expect("MKDIR").nodeid;
    let data = pattern(round);
    for name in [&b"new"[..], b"scratch"] {
        let (file, fh) = q
            .create(dir, name, libc::O_RDWR as u32, 0o644)
            .expect("CREATE");
        for (i, piece) in data.chunks(512 << 10).enumerate() {
            let n = q
                .write(file.nodeid, fh, (i * (512 << 10)) as u64, piece)
                .expect("WRITE");
            assert_eq!(n as usize, piece.len());
        }
        let mut fsync_in = fh.to_le_bytes().to_vec();
        fsync_in.extend_from_slice(&[0; 8]);
        q.call(FUSE_FSYNC, file.nodeid, &fsync_in)
            .expect("FSYNC sent")
            .ok(FUSE_FSYNC)
            .expect("FSYNC succeeds");
        q.flush(file.nodeid, fh).expect("FLUSH");
        q.release(file.nodeid, fh).expect("RELEASE");
        assert!(
            read_all(q, file.nodeid) == data,
            "the data read back differs"
        );
    }
    assert_eq!(list(q, dir), ["new", "scratch"]);

    let mut rename_in = dir.to_le_bytes().to_vec();
    rename_in.extend_from_slice(b"new\0kept\0");
    q.call(FUSE_RENAME, dir, &rename_in)
        .expect("RENAME sent")
        .ok(FUSE_RENAME)
        .expect("RENAME succeeds");
    q.call(FUSE_UNLINK, dir, b"scratch\0")
        .expect("UNLINK sent")
        .ok(FUSE_UNLINK)
        .expect("UNLINK succeeds");
    assert_eq!(errno(q.lookup(dir, b"new")), libc::ENOENT);
    assert_eq!(errno(q.lookup(dir, b"scratch")), libc::ENOENT);
    assert_eq!(list(q, dir), ["kept"]);
    let kept = q.lookup(dir, b"kept").expect("LOOKUP kept").nodeid;
    assert!(read_all(q, kept) == data, "the renamed file differs");
}

/// Checks that every round so far left its `kept` file intact.
fn check_rounds(q: &mut FuseQueue, rounds: &[&[u8]]) {
    let mut want: Vec<String> = rounds
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect();
    want.sort();
    assert_eq!(list(q, ROOT_ID), want);
    for round in rounds {
        let dir = q.lookup(ROOT_ID, round).expect("LOOKUP round").nodeid;
        let kept = q.lookup(dir, b"kept").expect("LOOKUP kept").nodeid;
        assert!(read_all(q, kept) == pattern(round), "a kept file differs");
    }
}

/// Runs one command on database `db` of the Redis server on `port`; the
/// values of its answer (one for a number or a string, one per element of
/// an array).
fn redis_query(port: u16, db: u32, args: &[&str]) -> Vec<String> {
    use std::io::{BufReader, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to Redis");
    let db = db.to_string();
    let mut request = String::new();
    for command in [&["SELECT", db.as_str()][..], args] {
        request.push_str(&format!("*{}\r\n", command.len()));
        for a in command {
            request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
    }
    conn.write_all(request.as_bytes()).expect("send to Redis");
    let mut reader = BufReader::new(conn);
    let mut selected = Vec::new();
    read_resp(&mut reader, &mut selected);
    assert_eq!(selected, ["OK"], "SELECT {db}");
    let mut out = Vec::new();
    read_resp(&mut reader, &mut out);
    out
}

/// Reads one RESP value into `out` (arrays flattened).
fn read_resp(r: &mut impl std::io::BufRead, out: &mut Vec<String>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("an answer from Redis");
    let line = line.trim_end();
    let (kind, rest) = line.split_at(1);
    match kind {
        "+" | ":" => out.push(rest.to_owned()),
        "$" => {
            let Ok(len) = rest.parse::<usize>() else {
                return; // $-1: nil
            };
            let mut bytes = vec![0; len + 2];
            r.read_exact(&mut bytes).expect("a string from Redis");
            bytes.truncate(len);
            out.push(String::from_utf8(bytes).expect("UTF-8 from Redis"));
        }
        "*" => {
            for _ in 0..rest.parse::<usize>().unwrap_or(0) {
                read_resp(r, out);
            }
        }
        _ => panic!("Redis answered {line}"),
    }
}

/// The number of connections the Redis server on `port` has accepted.
fn redis_connections(port: u16) -> u64 {
    let info = redis_query(port, 0, &["INFO", "stats"]).concat();
    status_field(&info.replace(':', ": "), "total_connections_received:")
        .parse()
        .expect("a number of connections")
}

/// The daemon under the full sandbox (nobody, Landlock, seccomp kill) on
/// Redis metadata named by `host`: it serves, and keeps serving once Redis
/// drops its connections and once Redis restarts, which makes it resolve
/// `host` and connect again from inside the sandbox.
fn sandboxed_daemon_on_redis(test: &'static str, host: &str) {
    if !is_root() {
        println!("skipped: sluice serve switches users only when started as root");
        return;
    }
    let _dog = Watchdog::new(test, Duration::from_secs(300));
    let Some(mut redis) = RedisServer::start_persistent(test) else {
        return;
    };
    let port = redis.port();
    let meta_url = format!("redis://{host}:{port}/1");
    // Redis restarts (its data kept): every connection is new again, made
    // while the server may still be down.
    let mut restart = || redis.restart(Duration::from_millis(300));
    serve_through_reconnects(
        &meta_url,
        port,
        Reconnects {
            restart: Some(&mut restart),
            ..Reconnects::default()
        },
    );
}

/// How [`serve_through_reconnects`] runs the daemon, and what it does to
/// it besides dropping its Redis connections.
#[derive(Default)]
struct Reconnects<'a> {
    /// Added to the daemon's environment.
    env: &'a [(&'a str, &'a str)],
    /// The test's directories mounted over the host's in the daemon's view
    /// (see [`sluice_command`]).
    mounts: &'a [(&'a Path, &'a str)],
    /// Runs after the first guest traffic, just before Redis drops the
    /// daemon's connections.
    before_kill: Option<&'a mut dyn FnMut()>,
    /// Restarts Redis (its data kept) once the daemon has connected again.
    restart: Option<&'a mut dyn FnMut()>,
}

/// Formats a volume on `meta_url` (a `file://` bucket), serves it under the
/// full sandbox as `with` says, drives guest traffic, makes Redis (plain
/// TCP on `port` for the test's commands) drop the daemon's connections
/// and checks that it connects again and keeps serving; then the same
/// after `with.restart`, if given. Returns the directory that holds the
/// volume's bucket, for a caller that serves the volume again.
fn serve_through_reconnects(meta_url: &str, port: u16, with: Reconnects) -> tempfile::TempDir {
    // The bucket and caches live here; nobody must be able to pass through.
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let bucket = dir.path().join("bucket");
    let out = sluice_command(with.mounts)
        .args(["format", meta_url, "redis-sandbox", "--bucket"])
        .arg(&bucket)
        .output()
        .expect("sluice format runs");
    assert!(out.status.success(), "{}", common::text(&out));
    let socket = dir.path().join("vm.sock");
    let mut serve = Serve::start_in(with.mounts, meta_url, dir.path(), &socket, &[], with.env);
    let log = serve.wait_for_log("waiting for a VM");
    assert!(log.contains("running as nobody"), "{log}");
    assert!(log.contains("seccomp:"), "{log}");
    let pid = serve.child.id();
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert_eq!(status_field(&status, "Seccomp:"), "2", "filter mode");

    let mut device = Device::connect(
        &socket,
        DeviceOptions {
            request_queues: 1,
            queue_size: 256,
            memory_size: 8 << 20,
        },
    )
    .expect("connect");
    let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    q.init().expect("INIT");
    guest_round(&mut q, b"first");

    // The session it registered (what `juicefs status` lists) names this
    // host, read inside the sandbox.
    let host_name = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let sessions = redis_query(port, 1, &["HVALS", "sessionInfos"]);
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let session: serde_json::Value = serde_json::from_str(&sessions[0]).unwrap();
    assert_eq!(session["HostName"], host_name.trim(), "{session}");
    assert_eq!(session["ProcessID"], pid, "{session}");

    if let Some(before_kill) = with.before_kill {
        before_kill();
    }
    // Redis drops every client connection: the daemon connects anew, from
    // inside the sandbox.
    let before = redis_connections(port);
    let killed = redis_query(port, 1, &["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(
        killed.concat().parse::<u64>().unwrap() > 0,
        "the daemon had connections to Redis"
    );
    check_rounds(&mut q, &[b"first"]);
    guest_round(&mut q, b"after-kill");
    assert!(
        redis_connections(port) > before + 1,
        "the daemon connected again"
    );

    if let Some(restart) = with.restart {
        restart();
        check_rounds(&mut q, &[b"after-kill", b"first"]);
        guest_round(&mut q, b"after-restart");
        check_rounds(&mut q, &[b"after-kill", b"after-restart", b"first"]);
    }

    drop(q);
    drop(device);
    assert!(
        serve.child.try_wait().unwrap().is_none(),
        "still serving:\n{}",
        serve.log_text()
    );
    dir
}

#[test]
fn a_sandboxed_daemon_on_redis_by_address_reconnects() {
    sandboxed_daemon_on_redis("sandbox-redis-ip", "127.0.0.1");
}

#[test]
fn a_sandboxed_daemon_on_redis_by_host_name_reconnects() {
    sandboxed_daemon_on_redis("sandbox-redis-name", "localhost");
}

/// A host name for Redis that only the test's `/etc/hosts` or DNS server
/// knows (`.test` is reserved: no other DNS server answers for it).
const REDIS_NAME: &str = "sluice-redis.test";

/// Where the daemon finds the address of [`REDIS_NAME`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameSource {
    /// In `/etc/hosts`.
    Hosts,
    /// From the DNS server `/etc/resolv.conf` names (a [`DnsServer`]).
    Dns,
}

/// The daemon under the full sandbox on Redis named by [`REDIS_NAME`], in a
/// mount namespace whose `/etc` is a copy of the host's, with
/// `nsswitch.conf` asking `hosts: files dns` and the name in `source`.
/// While it serves, the system replaces the file that leads to the name
/// (`hosts`, or `resolv.conf`), writing it beside the old one and renaming
/// it over, as `sed -i` does and DHCP clients and systemd-resolved do with
/// `resolv.conf`; then Redis drops the daemon's connections, and the daemon
/// must read the new file to connect again. `linked`: that file in `/etc`
/// is a link into a directory of its own, where the file is replaced (as
/// `/etc/resolv.conf` links to systemd-resolved's
/// `/run/systemd/resolve/stub-resolv.conf`).
fn follows_replaced_resolver_files(test: &'static str, source: NameSource, linked: bool) {
    if !is_root() {
        println!("skipped: sluice serve switches users only when started as root");
        return;
    }
    let namespaces = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .status();
    if !namespaces.is_ok_and(|s| s.success()) {
        println!("skipped: no `unshare --mount` here (util-linux, CAP_SYS_ADMIN)");
        return;
    }
    let _dog = Watchdog::new(test, Duration::from_secs(300));
    let Some(redis) = RedisServer::start(test) else {
        return;
    };
    let dns = match source {
        NameSource::Hosts => None,
        NameSource::Dns => {
            let Some(dns) = DnsServer::start() else {
                println!("skipped: cannot serve DNS on a loopback address's port 53");
                return;
            };
            Some(dns)
        }
    };
    let etc = tempfile::tempdir().unwrap();
    let cp = Command::new("cp")
        .args(["-a", "/etc/."])
        .arg(etc.path())
        .output()
        .expect("cp runs");
    assert!(cp.status.success(), "copying /etc: {}", common::text(&cp));
    fs::set_permissions(etc.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // Files of the copy are replaced, never written through: one may be a
    // link to the host's.
    let nsswitch: String = fs::read_to_string("/etc/nsswitch.conf")
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim_start().starts_with("hosts:"))
        .map(|l| format!("{l}\n"))
        .chain(std::iter::once("hosts: files dns\n".to_owned()))
        .collect();
    let _ = fs::remove_file(etc.path().join("nsswitch.conf"));
    fs::write(etc.path().join("nsswitch.conf"), nsswitch).unwrap();
    let resolver = tempfile::tempdir().unwrap();
    fs::set_permissions(resolver.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let name = match source {
        NameSource::Hosts => "hosts",
        NameSource::Dns => "resolv.conf",
    };
    let _ = fs::remove_file(etc.path().join(name));
    let dir = if linked {
        std::os::unix::fs::symlink(resolver.path().join(name), etc.path().join(name)).unwrap();
        resolver.path()
    } else {
        etc.path()
    };
    let host_lines = fs::read_to_string("/etc/hosts").unwrap_or_default();
    let replace_file = |generation: u32| {
        let text = match &dns {
            None => format!("{host_lines}\n127.0.0.1 {REDIS_NAME}\n"),
            Some(dns) => format!("nameserver {}\noptions timeout:1 attempts:2\n", dns.addr),
        };
        let new = dir.join(format!("{name}.new"));
        fs::write(&new, format!("{text}# generation {generation}\n")).unwrap();
        fs::set_permissions(&new, fs::Permissions::from_mode(0o644)).unwrap();
        fs::rename(&new, dir.join(name)).unwrap();
    };
    replace_file(0);
    let meta_url = format!("redis://{REDIS_NAME}:{}/1", redis.port());
    let queries_at_replace = std::cell::Cell::new(0);
    let mut replace = || {
        replace_file(1);
        queries_at_replace.set(dns.as_ref().map_or(0, DnsServer::queries));
    };
    serve_through_reconnects(
        &meta_url,
        redis.port(),
        Reconnects {
            mounts: &[(etc.path(), "/etc")],
            before_kill: Some(&mut replace),
            ..Reconnects::default()
        },
    );
    if let Some(dns) = &dns {
        assert!(
            dns.queries() > queries_at_replace.get(),
            "the daemon asked the DNS server again once Redis dropped its connections"
        );
    }
}

#[test]
fn a_sandboxed_daemon_on_redis_reads_a_hosts_file_replaced_in_etc() {
    follows_replaced_resolver_files("sandbox-redis-hosts", NameSource::Hosts, false);
}

#[test]
fn a_sandboxed_daemon_on_redis_reads_a_hosts_file_replaced_where_it_links() {
    follows_replaced_resolver_files("sandbox-redis-hosts-link", NameSource::Hosts, true);
}

#[test]
fn a_sandboxed_daemon_on_redis_asks_dns_with_a_resolv_conf_replaced_where_it_links() {
    follows_replaced_resolver_files("sandbox-redis-dns-link", NameSource::Dns, true);
}

/// A DNS server on port 53 of a loopback address of its own (glibc asks
/// name servers on port 53 only) that answers every A query with
/// 127.0.0.1 and any other with no records, and counts the queries.
struct DnsServer {
    addr: std::net::Ipv4Addr,
    queries: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DnsServer {
    /// `None` where no such address's port 53 is free.
    fn start() -> Option<DnsServer> {
        let pid = std::process::id();
        let (addr, socket) = (1..=8u8).find_map(|n| {
            let addr = std::net::Ipv4Addr::new(127, 53, n, (pid % 250) as u8 + 2);
            std::net::UdpSocket::bind((addr, 53))
                .ok()
                .map(|s| (addr, s))
        })?;
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let queries = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (queries, stop) = (queries.clone(), stop.clone());
            move || {
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    if let Some(reply) = dns_answer(&buf[..n]) {
                        queries.fetch_add(1, Ordering::Relaxed);
                        let _ = socket.send_to(&reply, peer);
                    }
                }
            }
        });
        Some(DnsServer {
            addr,
            queries,
            stop,
            thread: Some(thread),
        })
    }

    /// The queries answered so far.
    fn queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The answer to the DNS `query` (RFC 1035 4.1): its id and question, and
/// for type A one record, 127.0.0.1 with no time to live; `None` for what
/// is not a query.
fn dns_answer(query: &[u8]) -> Option<Vec<u8>> {
    const HEADER: usize = 12;
    if query.len() < HEADER || query[2] & 0x80 != 0 {
        return None;
    }
    // The question's name: labels up to a zero length; then type, class.
    let mut at = HEADER;
    while *query.get(at)? != 0 {
        at += 1 + usize::from(query[at]);
    }
    let question = query.get(HEADER..at + 5)?;
    let is_a = query[at + 1..at + 3] == [0, 1];
    let mut reply = query[..2].to_vec();
    // A response, recursion desired and available, no error; one question.
    reply.extend_from_slice(&[0x81, 0x80, 0, 1, 0, u8::from(is_a), 0, 0, 0, 0]);
    reply.extend_from_slice(question);
    if is_a {
        // The question's name (a pointer to it), A, IN, TTL 0, 4 bytes.
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 127, 0, 0, 1]);
    }
    Some(reply)
}

/// A `redis-server` that speaks TLS on `tls_port` (a certificate for
/// `localhost` signed by the test CA `ca.crt` in `dir`) and plain TCP on
/// `port` for the test's own commands; killed on drop.
struct TlsRedis {
    child: Child,
    port: u16,
    tls_port: u16,
    dir: tempfile::TempDir,
}

impl TlsRedis {
    /// `None` (with the reason printed) without `redis-server` built with
    /// TLS or without `openssl`.
    fn start(test: &str) -> Option<TlsRedis> {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(
            dir.path().join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        let steps: [&[&str]; 3] = [
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=sluice test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
            ],
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=localhost",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ],
            &[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-extfile",
                "san.ext",
                "-out",
                "server.crt",
            ],
        ];
        for step in steps {
            match Command::new("openssl")
                .args(step)
                .current_dir(dir.path())
                .output()
            {
                Ok(out) if out.status.success() => {}
                Ok(out) => panic!("openssl {step:?}: {}", common::text(&out)),
                Err(e) => {
                    eprintln!("{test}: skipped: no openssl ({e})");
                    return None;
                }
            }
        }
        for f in ["ca.crt", "server.crt", "server.key"] {
            fs::set_permissions(dir.path().join(f), fs::Permissions::from_mode(0o644)).unwrap();
        }
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        };
        let (port, tls_port) = (free_port(), free_port());
        let Ok(mut child) = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--tls-port",
                &tls_port.to_string(),
            ])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args([
                "--tls-cert-file",
                "server.crt",
                "--tls-key-file",
                "server.key",
            ])
            .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
            .arg("--dir")
            .arg(dir.path())
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        else {
            eprintln!("{test}: skipped: redis-server is not installed");
            return None;
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_err() {
            if child.try_wait().unwrap().is_some() {
                eprintln!("{test}: skipped: this redis-server has no TLS");
                return None;
            }
            assert!(Instant::now() < deadline, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(TlsRedis {
            child,
            port,
            tls_port,
            dir,
        })
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_sandboxed_daemon_on_redis_over_tls_reconnects_with_the_systems_roots() {
    if !is_root() {
        println!("skipped: sluice serve switches users only when started as root");
        return;
    }
    let test = "sandbox-rediss";
    let _dog = Watchdog::new(test, Duration::from_secs(300));
    let Some(redis) = TlsRedis::start(test) else {
        return;
    };
    // The system's roots as an administrator may keep them: SSL_CERT_DIR
    // names a directory of links to certificates kept elsewhere (as
    // update-ca-certificates links /usr/local/share/ca-certificates into
    // /etc/ssl/certs). The TLS client reads them at every new connection,
    // so inside the sandbox too.
    let roots = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    for d in [roots.path(), store.path()] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::copy(
        redis.dir.path().join("ca.crt"),
        store.path().join("test-ca.crt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        store.path().join("test-ca.crt"),
        roots.path().join("test-ca.pem"),
    )
    .unwrap();
    let meta_url = format!(
        "rediss://localhost:{}/1?tls-ca-cert-file={}",
        redis.tls_port,
        redis.dir.path().join("ca.crt").display()
    );
    let env = [("SSL_CERT_DIR", roots.path().to_str().unwrap())];
    serve_through_reconnects(
        &meta_url,
        redis.port,
        Reconnects {
            env: &env,
            ..Reconnects::default()
        },
    );
}

/// Where `update-ca-certificates` takes an administrator's own CAs from,
/// linking each into `/etc/ssl/certs`.
const LOCAL_CAS: &str = "/usr/local/share/ca-certificates";

#[test]
fn a_sandboxed_daemon_on_redis_over_tls_reads_a_ca_installed_later() {
    if !is_root() || !Path::new(LOCAL_CAS).is_dir() {
        println!("skipped: needs root and {LOCAL_CAS}");
        return;
    }
    let test = "sandbox-rediss-later";
    let _dog = Watchdog::new(test, Duration::from_secs(300));
    let Some(redis) = TlsRedis::start(test) else {
        return;
    };
    // The daemon sees an empty LOCAL_CAS (a directory of the test's), and
    // SSL_CERT_DIR (as /etc/ssl/certs) holds only the test CA. While it
    // serves, the administrator installs a CA of their own as
    // update-ca-certificates does: the file in LOCAL_CAS, a link to it in
    // the roots' directory. The TLS client reads every file there at each
    // new connection, and fails the connection on one it cannot read.
    let local_cas = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    for d in [local_cas.path(), roots.path()] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let ca = redis.dir.path().join("ca.crt");
    fs::copy(&ca, roots.path().join("test-ca.pem")).unwrap();
    let meta_url = format!(
        "rediss://localhost:{}/1?tls-ca-cert-file={}",
        redis.tls_port,
        ca.display()
    );
    let mut install = || {
        fs::copy(&ca, local_cas.path().join("later.crt")).unwrap();
        std::os::unix::fs::symlink(
            Path::new(LOCAL_CAS).join("later.crt"),
            roots.path().join("later.pem"),
        )
        .unwrap();
    };
    let env = [("SSL_CERT_DIR", roots.path().to_str().unwrap())];
    serve_through_reconnects(
        &meta_url,
        redis.port,
        Reconnects {
            env: &env,
            mounts: &[(local_cas.path(), LOCAL_CAS)],
            before_kill: Some(&mut install),
            ..Reconnects::default()
        },
    );
}

#[test]
fn roots_the_service_user_cannot_read_stop_serve_at_start() {
    if !is_root() {
        println!("skipped: sluice serve switches users only when started as root");
        return;
    }
    let test = "sandbox-rediss-roots";
    let _dog = Watchdog::new(test, Duration::from_secs(300));
    let Some(redis) = TlsRedis::start(test) else {
        return;
    };
    // Roots only root may read: after the switch to nobody every new TLS
    // connection would fail, so serve refuses to start.
    let roots = tempfile::tempdir().unwrap();
    fs::set_permissions(roots.path(), fs::Permissions::from_mode(0o700)).unwrap();
    fs::copy(redis.dir.path().join("ca.crt"), roots.path().join("ca.pem")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let meta_url = format!(
        "rediss://localhost:{}/1?tls-ca-cert-file={}",
        redis.tls_port,
        redis.dir.path().join("ca.crt").display()
    );
    let bucket = dir.path().join("bucket");
    common::sluice_ok(&[
        "format",
        &meta_url,
        "roots",
        "--bucket",
        bucket.to_str().unwrap(),
    ]);
    let env = [("SSL_CERT_DIR", roots.path().to_str().unwrap())];
    let socket = dir.path().join("vm.sock");
    let mut serve = Serve::start_on(&meta_url, dir.path(), &socket, &[], &env);
    let status = serve.wait_exit();
    let log = serve.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("the Redis TLS client cannot read the system's TLS roots inside the sandbox"),
        "{log}"
    );
    assert!(log.contains(&roots.path().display().to_string()), "{log}");
    assert!(!log.contains("waiting for a VM"), "{log}");
}

#[test]
fn a_sandboxed_daemon_on_redis_over_a_unix_socket_reconnects_or_refuses_to_start() {
    if !is_root() {
        println!("skipped: sluice serve switches users only when started as root");
        return;
    }
    let test = "sandbox-redis-unix";
    let _dog = Watchdog::new(test, Duration::from_secs(300));
    // The shared helper's skip rules (no redis-server, SLUICE_SKIP_REDIS=1);
    // this test needs its own server, on a Unix socket.
    if RedisServer::start(test).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("redis.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--unixsocketperm",
            "777",
        ])
        .arg("--unixsocket")
        .arg(&sock)
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _redis = Kill(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let meta_url = format!("unix://{}?db=1", sock.display());
    // The bucket stays: a volume whose bucket is gone is refused first.
    let _bucket = serve_through_reconnects(&meta_url, port, Reconnects::default());

    // A socket only root may use: the daemon, as nobody, could not connect
    // again, so it refuses to start.
    fs::set_permissions(&sock, fs::Permissions::from_mode(0o700)).unwrap();
    let cache = tempfile::tempdir().unwrap();
    fs::set_permissions(cache.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let socket = cache.path().join("vm.sock");
    let mut serve = Serve::start_on(&meta_url, cache.path(), &socket, &[], &[]);
    let status = serve.wait_exit();
    let log = serve.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "nobody cannot connect to the Redis socket {} inside the sandbox",
            sock.display()
        )),
        "{log}"
    );
    assert!(!log.contains("waiting for a VM"), "{log}");
}

/// With `--guest-io uring` the sandboxed daemon reads what the page cache
/// does not hold on its queue worker's own io_uring ring, straight into the
/// guest's memory registered as fixed buffers (locked memory raised before
/// the switch to `nobody`, or CAP_IPC_LOCK kept where it cannot be: 64 MiB
/// of guest memory, past the usual 8 MiB limit; `cachestat`, the ring's
/// eventfd and its reads allowed by the seccomp filter), and the bytes are
/// right.
#[test]
fn a_sandboxed_daemon_reads_local_files_on_its_workers_ring() {
    if !is_root() {
        println!("skipped: sluice serve switches users only when started as root");
        return;
    }
    let _dog = Watchdog::new("sandbox_ring", Duration::from_secs(300));
    let vol = Volume::format("ring", &[]);
    // Guest memory above the 8 MiB locked-memory limit a host gives by
    // default: registering it works only because the daemon lifted the
    // limit before the switch, or, where root may not (no
    // CAP_SYS_RESOURCE), kept CAP_IPC_LOCK.
    let options = DeviceOptions {
        request_queues: 1,
        queue_size: 256,
        memory_size: 64 << 20,
    };
    let data: Vec<u8> = (0..12u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    // Written by one daemon...
    {
        let socket = vol.dir.path().join("w.sock");
        let mut serve = Serve::start(&vol, &socket, &[], None);
        serve.wait_for_log("waiting for a VM");
        let mut device = Device::connect(&socket, options).expect("connect");
        let mut q = FuseQueue::new(&mut device, 1, 256 << 10).expect("queue");
        q.init().expect("INIT");
        let (file, fh) = q
            .create(ROOT_ID, b"f", libc::O_RDWR as u32, 0o644)
            .expect("CREATE");
        for (i, piece) in data.chunks(256 << 10).enumerate() {
            q.write(file.nodeid, fh, (i * (256 << 10)) as u64, piece)
                .expect("WRITE");
        }
        let mut fsync_in = fh.to_le_bytes().to_vec();
        fsync_in.extend_from_slice(&[0; 8]);
        q.call(FUSE_FSYNC, file.nodeid, &fsync_in)
            .expect("FSYNC sent")
            .ok(FUSE_FSYNC)
            .expect("FSYNC succeeds");
        q.release(file.nodeid, fh).expect("RELEASE");
        drop(q);
        drop(device);
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(serve.child.id() as i32, libc::SIGTERM) };
        assert!(serve.wait_exit().success(), "{}", serve.log_text());
    }
    // ...its files dropped from the page cache...
    let mut files = Vec::new();
    common::walk_files(vol.dir.path(), &mut files);
    for f in files {
        use std::os::fd::AsRawFd;
        let Ok(f) = fs::File::open(&f) else { continue };
        let _ = f.sync_all();
        // SAFETY: a plain advice call on a descriptor we own.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    // ...and read at scattered offsets by another, whose memory cache is
    // empty, which fetches nothing ahead and has no disk cache (a
    // disk-cache hit is a checked range, read by a waiter so that it has
    // landed to be checked, never on the ring): the `file://` objects'
    // ranges go on the ring.
    let socket = vol.dir.path().join("r.sock");
    let mut serve = Serve::start(
        &vol,
        &socket,
        &[
            "--disk-cache-size",
            "0",
            "--guest-io",
            "uring",
            "--prefetch",
            "0",
            "--max-readahead",
            "0",
            "--metrics",
            "127.0.0.1:0",
        ],
        None,
    );
    serve.wait_for_log("waiting for a VM");
    let mut device = Device::connect(&socket, options).expect("connect");
    let mut q = FuseQueue::new(&mut device, 1, 256 << 10).expect("queue");
    q.init().expect("INIT");
    let node = q.lookup(ROOT_ID, b"f").expect("LOOKUP").nodeid;
    let fh = q.open(node, libc::O_RDONLY as u32).expect("OPEN");
    for (off, size) in [
        ((5 << 20) + 4096, 128 << 10),
        (1 << 20, 4096),
        ((9 << 20) + 12_345, (64 << 10) + 100),
        (2 << 20, 256 << 10),
        (11 << 20, 256 << 10),
        ((7 << 20) + 512, 4096),
    ] {
        let got = q.read(node, fh, off as u64, size as u32).expect("READ");
        assert!(
            got == data[off..off + size],
            "READ of {size} at {off} returned other bytes"
        );
    }
    let metrics = common::scrape(&common::metrics_addr(&|| serve.log_text()));
    let ring: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_virtiofs_read_bytes_total") && l.contains("io_uring"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        ring > 0.0,
        "no READ bytes went through the worker's ring:\n{metrics}\n{}",
        serve.log_text()
    );
    drop(q);
    drop(device);
    assert!(serve.child.try_wait().unwrap().is_none(), "still serving");
}
