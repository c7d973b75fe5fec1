//! The daemons as systemd runs them: `sluice serve` and `sluice mount` send
//! `READY=1` to `$NOTIFY_SOCKET` once they serve (`Type=notify` in
//! packaging/systemd/), and the unit files there pass `systemd-analyze
//! verify` with this build's binary in their command lines.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{SLUICE, Volume, Watchdog, mount_type, sluice_ok};
use sluice_benches::virtiofs::wire::ROOT_ID;
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A `sluice ARGS` started with NOTIFY_SOCKET pointing at a socket of ours;
/// killed when dropped.
struct Notified {
    child: Child,
    systemd: UnixDatagram,
    log: std::path::PathBuf,
}

impl Notified {
    fn start(dir: &Path, args: &[&str]) -> Notified {
        let notify = dir.join("notify.sock");
        let systemd = UnixDatagram::bind(&notify).expect("bind the notify socket");
        systemd
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("a read timeout");
        let log = dir.join(format!("{}.log", args[0]));
        let logf = std::fs::File::create(&log).expect("a log file");
        let child = Command::new(SLUICE)
            .args(args)
            .env("NOTIFY_SOCKET", &notify)
            // `WatchdogSec=400ms`: the daemon pings every 200 ms.
            .env("WATCHDOG_USEC", "400000")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(logf.try_clone().expect("a log file"))
            .stderr(logf)
            .spawn()
            .expect("sluice starts");
        Notified {
            child,
            systemd,
            log,
        }
    }

    /// The first message the daemon sends, within 60 s.
    fn wait_message(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = [0u8; 4096];
        loop {
            if let Ok(n) = self.systemd.recv(&mut buf) {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!(
                    "sluice exited ({status}) before notifying: {}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no READY=1 in 60 s: {}",
                self.log_text()
            );
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// After READY=1: the watchdog pings (the daemon's probe passes).
    fn wait_pings(&mut self, n: usize) {
        for _ in 0..n {
            let message = self.wait_message();
            assert_eq!(message, "WATCHDOG=1\n", "{}", self.log_text());
        }
    }
}

impl Drop for Notified {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn serve_is_ready_once_its_socket_is_bound_and_its_sandbox_up() {
    let _watchdog = Watchdog::new("serve_is_ready", Duration::from_secs(120));
    let vol = Volume::format("notify", &[]);
    let socket = vol.dir.path().join("vm.sock");
    let socket_s = socket.to_str().expect("a UTF-8 path");
    let mut args = vec!["serve", &vol.meta_url, "--socket", socket_s, "--no-pin"];
    if is_root() {
        // Keep root so that the temporary directory needs no hand-over;
        // Landlock and seccomp still apply, so the message crosses them.
        args.extend(["--user", "root"]);
    }
    let mut serve = Notified::start(vol.dir.path(), &args);
    let message = serve.wait_message();
    assert!(message.starts_with("READY=1\n"), "{message:?}");
    assert!(
        message.contains(&format!("STATUS=serving volume notify on {socket_s}")),
        "{message:?}"
    );
    assert!(socket.exists(), "READY=1 came before the socket was bound");
    serve.wait_pings(3);
    assert!(serve.child.try_wait().expect("try_wait").is_none());
}

#[test]
fn mount_is_ready_once_the_kernel_shows_the_mount() {
    if !is_root() || !Path::new("/dev/fuse").exists() {
        println!("skipped: a kernel mount needs root and /dev/fuse");
        return;
    }
    let _watchdog = Watchdog::new("mount_is_ready", Duration::from_secs(120));
    let vol = Volume::format("notify", &[]);
    let mnt = vol.dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("a mount point");
    let mnt_s = mnt.to_str().expect("a UTF-8 path");
    let mut mount = Notified::start(vol.dir.path(), &["mount", &vol.meta_url, mnt_s]);
    let message = mount.wait_message();
    let shown = mount_type(&mnt);
    // Its probe (a LOOKUP through the mount) passes: it pings.
    mount.wait_pings(3);
    sluice_ok(&["umount", mnt_s]);
    let status = mount.child.wait().expect("wait");
    assert!(message.starts_with("READY=1\n"), "{message:?}");
    assert!(
        message.contains(&format!("STATUS=volume notify mounted on {mnt_s}")),
        "{message:?}"
    );
    assert_eq!(
        shown.as_deref(),
        Some("fuse.sluice"),
        "READY=1 before the mount"
    );
    assert!(status.success(), "{status}: {}", mount.log_text());
}

/// `systemctl stop` (SIGTERM) of a `sluice serve` with a VM connected:
/// what the guest wrote and had not flushed yet is committed before the
/// daemon exits, and a mount then reads it.
#[test]
fn serve_commits_the_guests_writes_at_sigterm() {
    let _watchdog = Watchdog::new("serve_sigterm", Duration::from_secs(180));
    let vol = Volume::format("notify", &[]);
    let socket = vol.dir.path().join("vm.sock");
    let socket_s = socket.to_str().expect("a UTF-8 path");
    let mut args = vec!["serve", &vol.meta_url, "--socket", socket_s, "--no-pin"];
    if is_root() {
        args.extend(["--user", "root"]);
    }
    let mut serve = Notified::start(vol.dir.path(), &args);
    assert!(serve.wait_message().starts_with("READY=1\n"));

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
    let data: Vec<u8> = (0..(3 << 20) + 777).map(|i: u32| (i % 253) as u8).collect();
    let (file, fh) = q
        .create(ROOT_ID, b"unflushed", libc::O_RDWR as u32, 0o644)
        .expect("CREATE");
    for (i, piece) in data.chunks(256 << 10).enumerate() {
        q.write(file.nodeid, fh, (i * (256 << 10)) as u64, piece)
            .expect("WRITE");
    }
    // No FLUSH, FSYNC nor RELEASE: the bytes sit in the daemon's buffers.
    let pid = serve.child.id() as i32;
    // SAFETY: kill has no memory-safety preconditions.
    let killed = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(killed, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = serve.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running 60 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", serve.log_text());
    drop(q);
    drop(device);

    if is_root() && Path::new("/dev/fuse").exists() {
        let mount = vol.mount("after");
        let back = std::fs::read(mount.path.join("unflushed")).expect("the file");
        assert!(back == data, "the unflushed writes were not committed");
        mount.unmount();
    }
}

#[test]
fn without_notify_socket_nothing_is_sent_and_serving_starts_anyway() {
    // The other tests cover the variable set; an unreachable one is only a
    // warning, never a failure to start.
    let vol = Volume::format("notify", &[]);
    let socket = vol.dir.path().join("vm.sock");
    let mut args = vec![
        "serve".to_owned(),
        vol.meta_url.clone(),
        "--socket".to_owned(),
        socket.display().to_string(),
        "--no-pin".to_owned(),
    ];
    if is_root() {
        args.extend(["--user".to_owned(), "root".to_owned()]);
    }
    let log = vol.dir.path().join("serve.log");
    let mut child = Command::new(SLUICE)
        .args(&args)
        .env("NOTIFY_SOCKET", vol.dir.path().join("nobody-listens"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("a log"))
        .stderr(std::fs::File::create(log.with_extension("err")).expect("a log"))
        .spawn()
        .expect("sluice serve starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
        if text.contains("waiting for a VM") {
            break text;
        }
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("sluice serve exited ({status}): {text}");
        }
        assert!(Instant::now() < deadline, "not serving in 60 s: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        text.contains("cannot reach systemd's NOTIFY_SOCKET"),
        "{text}"
    );
}

#[test]
fn the_unit_files_pass_systemd_analyze_verify() {
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("skipped: systemd-analyze is not installed");
        return;
    };
    assert!(version.status.success());
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut paths = Vec::new();
    for (template, instance) in [
        ("sluice-mount@.service", "sluice-mount@vol.service"),
        ("sluice-serve@.service", "sluice-serve@vm1.service"),
        ("sluice-host@.service", "sluice-host@vol.service"),
    ] {
        let text = std::fs::read_to_string(units.join(template)).expect("a unit file");
        assert!(text.contains("ExecStart=/usr/bin/sluice "), "{template}");
        let path = dir.path().join(instance);
        std::fs::write(&path, text.replace("/usr/bin/sluice", SLUICE)).expect("write");
        paths.push(path);
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&paths)
        .output()
        .expect("systemd-analyze runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    // verify reports unknown keys and bad values but still succeeds.
    assert!(report.trim().is_empty(), "{report}");
}
