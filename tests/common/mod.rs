//! Shared helpers of the end-to-end tests: they drive the real `sluice`
//! binary (format, mount, umount) against real kernel FUSE mounts.
//!
//! Every mount is unmounted (and its server stopped) when its [`Mount`]
//! drops, even when the test panics, and a [`Watchdog`] turns a hang into a
//! failure: past its deadline it kills every server this process started
//! (which aborts the kernel's pending requests) and exits.

#![allow(dead_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The binary under test.
pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Process ids of the mount servers alive now, with their mount points.
static SERVERS: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// Creates `path` with `len` bytes and fsyncs it, expecting a limit to
/// refuse the writes with `errno` (ENOSPC, EDQUOT), then empties the file,
/// so that only its inode (4 KiB) counts. What was committed before the
/// refusal stays, as on a local disk that fills mid-write, and how much
/// that is depends on timing: a child another test thread forks while the
/// file is open closes its copy of the descriptor at exec, and the FLUSH
/// the kernel sends for it commits the writes made so far (one 1 MiB WRITE
/// of a 2 MiB file, seen in CI), which may fit. Emptying the file makes
/// what the next steps of a test can fit the same every run.
pub fn write_refused(path: &Path, len: usize, errno: i32) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create");
    let res = f.write_all(&vec![7u8; len]).and_then(|()| f.sync_all());
    match res {
        Ok(()) => panic!("{}: {len} bytes fit", path.display()),
        Err(e) => assert_eq!(e.raw_os_error(), Some(errno), "{}: {e}", path.display()),
    }
    f.set_len(0).expect("truncate to empty");
}

/// Runs `sluice ARGS` to completion and returns its output.
pub fn sluice(args: &[&str]) -> Output {
    Command::new(SLUICE)
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .expect("the sluice binary runs")
}

/// stdout and stderr of a finished command, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `sluice ARGS` and panics with its output unless it succeeds.
pub fn sluice_ok(args: &[&str]) -> String {
    let out = sluice(args);
    assert!(
        out.status.success(),
        "sluice {args:?} failed: {}",
        text(&out)
    );
    text(&out)
}

/// A `sluice serve` daemon, killed when dropped.
#[derive(Debug)]
pub struct Serve {
    child: Child,
    /// The daemon's stdout + stderr (SOCKET.log).
    pub log: PathBuf,
}

impl Serve {
    /// Starts `sluice serve META_URL --socket SOCKET ARGS...` (logging at
    /// info to SOCKET.log) and waits until its socket exists.
    pub fn start(meta_url: &str, socket: &Path, args: &[&str]) -> Serve {
        let log = socket.with_extension("log");
        let logf = std::fs::File::create(&log).expect("a log file");
        let child = Command::new(SLUICE)
            .args(["serve", meta_url, "--socket"])
            .arg(socket)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(logf.try_clone().expect("a log file"))
            .stderr(logf)
            .spawn()
            .expect("sluice serve starts");
        let serve = Serve { child, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "sluice serve made no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        serve
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A volume formatted by `sluice format` in a temporary directory.
#[derive(Debug)]
pub struct Volume {
    /// Holds meta.db, the bucket and the mount points.
    pub dir: tempfile::TempDir,
    /// `sqlite3:///DIR/meta.db`.
    pub meta_url: String,
    /// The object-store directory given as `--bucket`.
    pub bucket: PathBuf,
    /// The volume name (also the object-key prefix under the bucket).
    pub name: String,
}

impl Volume {
    /// Formats a new volume named `name` with extra `sluice format` options.
    pub fn format(name: &str, extra: &[&str]) -> Volume {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let meta_url = format!("sqlite3://{}", dir.path().join("meta.db").display());
        let bucket = dir.path().join("bucket");
        let bucket_s = bucket.to_str().expect("a UTF-8 path").to_owned();
        let mut args = vec!["format", &meta_url, name, "--bucket", &bucket_s];
        args.extend_from_slice(extra);
        sluice_ok(&args);
        Volume {
            dir,
            meta_url,
            bucket,
            name: name.to_owned(),
        }
    }

    /// Mounts the volume on DIR/`sub` (created if missing).
    pub fn mount(&self, sub: &str) -> Mount {
        let mnt = self.dir.path().join(sub);
        std::fs::create_dir_all(&mnt).expect("a mount point");
        let log = self.dir.path().join(format!("{sub}.log"));
        Mount::start(&self.meta_url, &mnt, &log, &[])
    }

    /// Every object file under BUCKET/NAME/chunks.
    pub fn objects(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        walk_files(&self.bucket.join(&self.name).join("chunks"), &mut out);
        out.sort();
        out
    }
}

/// Every regular file under `dir`, recursively.
pub fn walk_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let ft = e.file_type().expect("a file type");
        if ft.is_dir() {
            walk_files(&p, out);
        } else if ft.is_file() {
            out.push(p);
        }
    }
}

/// A `sluice mount` process serving a kernel FUSE mount in the foreground.
#[derive(Debug)]
pub struct Mount {
    /// The mount point.
    pub path: PathBuf,
    /// The server's stdout + stderr.
    pub log: PathBuf,
    child: Option<Child>,
}

/// The file-system type at exactly `path` in /proc/self/mountinfo.
pub fn mount_type(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_str()?;
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() > 4 && fields[4] == want {
            found = fields.get(dash + 1).map(|s| s.to_string());
        }
    }
    found
}

/// Detaches whatever is mounted on `path` (MNT_DETACH), ignoring errors.
pub fn lazy_unmount(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: `c` is a NUL-terminated path alive across the call.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

impl Mount {
    /// Starts `sluice mount META_URL MNT EXTRA...` and waits until the
    /// kernel shows the mount (fuse.sluice in /proc/self/mountinfo).
    pub fn start(meta_url: &str, mnt: &Path, log: &Path, extra: &[&str]) -> Mount {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("a log file");
        let child = Command::new(SLUICE)
            .arg("mount")
            .arg(meta_url)
            .arg(mnt)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(logf.try_clone().expect("a log file"))
            .stderr(logf)
            .spawn()
            .expect("sluice mount starts");
        SERVERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((child.id(), mnt.to_owned()));
        let mut m = Mount {
            path: mnt.to_owned(),
            log: log.to_owned(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while mount_type(mnt).as_deref() != Some("fuse.sluice") {
            let exited = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!(
                    "sluice mount exited ({status}) before mounting: {}",
                    m.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the mount did not come up within 60 s: {}",
                m.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// `sluice umount MNT`, then waits (with a deadline) for the server to
    /// commit everything and exit successfully.
    pub fn unmount(mut self) {
        let mnt = self.path.to_str().expect("a UTF-8 path").to_owned();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = sluice(&["umount", &mnt]);
            if out.status.success() {
                break;
            }
            // A file closed by the test may still be releasing: retry a busy mount.
            assert!(
                text(&out).contains("busy") && Instant::now() < deadline,
                "sluice umount failed: {}",
                text(&out)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let status = self.wait_exit(Duration::from_secs(120));
        assert!(
            status.success(),
            "sluice mount exited with {status}: {}",
            self.log_text()
        );
    }

    /// `sluice umount EXTRA... MNT` (such as `--flush`), which must succeed
    /// at once; runs `check` on its output before the server is waited
    /// for, then waits for the server to exit successfully.
    pub fn unmount_with(mut self, extra: &[&str], check: impl FnOnce(&str)) {
        let mnt = self.path.to_str().expect("a UTF-8 path").to_owned();
        let mut args = vec!["umount"];
        args.extend_from_slice(extra);
        args.push(&mnt);
        let out = sluice(&args);
        assert!(out.status.success(), "sluice {args:?}: {}", text(&out));
        check(&text(&out));
        let status = self.wait_exit(Duration::from_secs(120));
        assert!(
            status.success(),
            "sluice mount exited with {status}: {}",
            self.log_text()
        );
    }

    /// SIGKILLs the server (a crash) and detaches the dead mount point.
    pub fn kill9(mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.forget();
        let out = sluice(&["umount", "--lazy", self.path.to_str().expect("UTF-8")]);
        assert!(out.status.success(), "sluice umount --lazy: {}", text(&out));
    }

    fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("a running server");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = child.try_wait().expect("waitpid") {
                self.forget();
                return s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "sluice mount did not exit within {limit:?} of its unmount: {}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn forget(&mut self) {
        if let Some(c) = self.child.take() {
            let pid = c.id();
            SERVERS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(p, _)| *p != pid);
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Only after a failure: tear down without waiting on anything.
        lazy_unmount(&self.path);
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        let pid = child.id();
        SERVERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(p, _)| *p != pid);
    }
}

/// Fails the whole test process if a test runs past its deadline: a hung
/// FUSE request would otherwise block CI forever.
#[derive(Debug)]
pub struct Watchdog {
    done: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Arms a deadline of `limit` for the test `name`.
    pub fn new(name: &'static str, limit: Duration) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("test {name} ran past its deadline of {limit:?}: killing its mounts");
                let servers = SERVERS.lock().unwrap_or_else(|e| e.into_inner()).clone();
                for (pid, mnt) in servers {
                    // SAFETY: plain kill(2) on a child we started.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    lazy_unmount(&mnt);
                }
                std::process::exit(101);
            }
        });
        Watchdog {
            done: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A seed from SLUICE_TEST_SEED or the clock, printed so a failure can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("SLUICE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: seed {seed} (replay with SLUICE_TEST_SEED={seed})");
    seed
}

/// SHA-256 of a file read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> [u8; 32] {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path).expect("open for hashing");
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read for hashing");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().into()
}

/// A `redis-server` of one test on a free loopback port, in a temporary
/// directory, killed on drop. [`RedisServer::start`] saves nothing;
/// [`RedisServer::start_persistent`] logs every write to an append-only file
/// (fsynced per write) so that [`RedisServer::restart`] keeps the data.
/// `None` (with the reason printed) without `redis-server` on the PATH or
/// with SLUICE_SKIP_REDIS=1.
pub struct RedisServer {
    child: Child,
    port: u16,
    persistent: bool,
    password: Option<String>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start(test: &str) -> Option<RedisServer> {
        Self::start_with(test, false, None)
    }

    /// A server whose data survives [`RedisServer::restart`].
    pub fn start_persistent(test: &str) -> Option<RedisServer> {
        Self::start_with(test, true, None)
    }

    /// A server that asks for `password` (`requirepass`).
    pub fn start_with_password(test: &str, password: &str) -> Option<RedisServer> {
        Self::start_with(test, false, Some(password.to_owned()))
    }

    fn start_with(test: &str, persistent: bool, password: Option<String>) -> Option<RedisServer> {
        if std::env::var("SLUICE_SKIP_REDIS").is_ok_and(|v| v == "1") {
            eprintln!("{test}: skipped: SLUICE_SKIP_REDIS=1");
            return None;
        }
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("redis-server").is_file()));
        if !found {
            eprintln!(
                "{test}: skipped: redis-server is not installed (apt-get install redis-server)"
            );
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let child = spawn_redis(port, dir.path(), persistent, password.as_deref());
        Some(RedisServer {
            child,
            port,
            persistent,
            password,
            dir,
        })
    }

    /// Kills the server (SIGKILL: no shutdown save) and starts it again on
    /// the same port and directory after `down`; with a persistent server,
    /// every write it acknowledged is back.
    pub fn restart(&mut self, down: Duration) {
        assert!(self.persistent, "restart needs start_persistent");
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        self.child = spawn_redis(self.port, self.dir.path(), true, self.password.as_deref());
    }

    /// Stops the server (SIGSTOP) until [`RedisServer::resume`]: every
    /// request to it waits, as on a slow or far metadata server.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).expect("a pid");
        // SAFETY: a signal to our own child process.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill {sig}");
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The metadata URL of database `db`.
    pub fn url(&self, db: u32) -> String {
        format!("redis://127.0.0.1:{}/{db}", self.port)
    }
}

/// Starts `redis-server` on `port` in `dir` and waits until it accepts
/// connections.
fn spawn_redis(port: u16, dir: &Path, persistent: bool, password: Option<&str>) -> Child {
    let persistence: &[&str] = if persistent {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &["--appendonly", "no"]
    };
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .args(["--save", ""])
        .args(persistence)
        .args(["--daemonize", "no"])
        .args(password.map(|p| ["--requirepass", p]).into_iter().flatten())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address a daemon started with `--metrics 127.0.0.1:0` logged.
pub fn metrics_addr(log: &dyn Fn() -> String) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = log();
        if let Some(rest) = text.split("metrics on http://").nth(1) {
            return rest.split('/').next().expect("an address").to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address in the log: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET /metrics` over plain HTTP/1.0.
pub fn scrape(addr: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.0\r\nHost: sluice\r\n\r\n").unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut conn, &mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_owned()
}

/// Why this host cannot run a guest-VM test, if it cannot: the tests skip
/// with this reason (SLUICE_SKIP_VM=1, no /dev/fuse, no QEMU).
pub fn vm_prerequisite_missing() -> Option<String> {
    if std::env::var("SLUICE_SKIP_VM").as_deref() == Ok("1") {
        return Some("SLUICE_SKIP_VM=1".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !matches!(qemu, Ok(s) if s.success()) {
        return Some("qemu-system-x86_64 is not installed (test.sh installs it)".into());
    }
    None
}

/// Builds (or finds built) the guest kernel and initramfs
/// (`vm-images/build.sh`), panicking with its output when it fails.
pub fn build_guest() {
    let build = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("vm-images/build.sh"))
        .output()
        .expect("vm-images/build.sh runs");
    assert!(
        build.status.success(),
        "vm-images/build.sh failed: {}",
        text(&build)
    );
}

/// The value of the guest's last `E2E NAME value` console line.
pub fn guest_value(console: &str, name: &str) -> Option<String> {
    let prefix = format!("E2E {name} ");
    console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix(&prefix))
        .next_back()
        .map(str::to_owned)
}

/// A digest in lowercase hex.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
