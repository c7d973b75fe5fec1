//! The main job end to end: a real Linux guest (Debian's 6.12 cloud kernel
//! under QEMU, built by `vm-images/build.sh`) mounts a sluice volume served
//! by `sluice serve --queues 2 --export share` and reads and writes it,
//! while the host looks at the same volume through a `sluice mount`.
//!
//! Checks: host-written files read back in the guest with equal SHA-256;
//! guest-written files read back on the host; a directory of 1,000 files
//! lists correctly; rename and unlink; nothing outside the export is
//! visible; both request queues carried traffic (the daemon's per-queue
//! counters, logged when the VM disconnects).
//!
//! Skips (printing why) with `SLUICE_SKIP_VM=1`, or when QEMU or FUSE is
//! missing; `test.sh` installs QEMU, so CI checks it.

mod common;

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{SLUICE, Volume, Watchdog, guest_value, hex, sha256_file};

const FILES: usize = 1000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `sluice serve`, killed if the test fails before it exits by itself.
struct Serve {
    child: Option<Child>,
    log: PathBuf,
}

impl Serve {
    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for `--once` to end the daemon after the VM disconnected.
    fn wait(&mut self, limit: Duration) -> String {
        let child = self.child.as_mut().expect("serve runs");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("waitpid") {
                self.child = None;
                assert!(
                    status.success(),
                    "sluice serve: {status}: {}",
                    self.log_text()
                );
                return self.log_text();
            }
            assert!(
                Instant::now() < deadline,
                "sluice serve did not exit after the VM left: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Requests each queue served, from the daemon's "queue N: R requests" lines.
fn queue_requests(log: &str) -> Vec<(usize, u64)> {
    log.lines()
        .filter_map(|line| {
            let rest = &line[line.find("queue ")? + 6..];
            let (queue, rest) = rest.split_once(": ")?;
            let (requests, rest) = rest.split_once(' ')?;
            rest.starts_with("requests in")
                .then(|| Some((queue.parse().ok()?, requests.parse().ok()?)))?
        })
        .collect()
}

const GUEST_SCRIPT: &str = r#"set -e
echo "E2E input $(sha256sum input.bin | cut -d' ' -f1)"
echo "E2E count $(ls many | wc -l)"
echo "E2E listing $(ls many | sha256sum | cut -d' ' -f1)"
echo "E2E sample $(cat many/f0777)"
if [ -e outside ] || [ -e ../outside/secret ] || [ -e /data/../outside ]; then
    echo "E2E outside visible"
else
    echo "E2E outside hidden"
fi
# An odd size: the last read and write are partial pages.
head -c 3000001 /dev/urandom >from-guest.bin
echo "E2E wrote $(sha256sum from-guest.bin | cut -d' ' -f1)"
mv to-rename.txt renamed.txt
rm to-delete.txt
mkdir guest-dir
echo "written in the guest" >guest-dir/note.txt
# One reader and writer per vCPU: the driver maps each CPU to its own
# request queue, so both queues carry traffic.
pin() { if command -v taskset >/dev/null; then taskset "$@"; else shift; "$@"; fi; }
pin 1 sh -c 'cat many/*0 many/*2 many/*4 >/dev/null; head -c 100000 /dev/urandom >cpu0.bin' &
pin 2 sh -c 'cat many/*1 many/*3 many/*5 >/dev/null; head -c 100000 /dev/urandom >cpu1.bin' &
wait
sync
echo "E2E done"
"#;

#[test]
fn a_linux_guest_reads_and_writes_a_volume_over_virtio_fs() {
    if let Some(why) = common::vm_prerequisite_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let _dog = Watchdog::new("e2e_vm", Duration::from_secs(900));
    common::build_guest();

    let vol = Volume::format("vm", &["--trash-days", "0"]);
    let host_mnt = vol.dir.path().join("host");
    fs::create_dir(&host_mnt).unwrap();
    let host = common::Mount::start(
        &vol.meta_url,
        &host_mnt,
        &vol.dir.path().join("host.log"),
        &["--attr-cache", "0", "--entry-cache", "0"],
    );

    // What the host puts in the volume before the guest starts.
    let share = host_mnt.join("share");
    fs::create_dir_all(share.join("many")).unwrap();
    fs::create_dir_all(host_mnt.join("outside")).unwrap();
    fs::write(host_mnt.join("outside/secret"), b"host only").unwrap();
    let mut state = common::seed("e2e_vm") | 1;
    let mut input = vec![0u8; 4 << 20];
    for chunk in input.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    fs::write(share.join("input.bin"), &input).unwrap();
    let mut names = Vec::new();
    for i in 0..FILES {
        let name = format!("f{i:04}");
        fs::write(share.join("many").join(&name), format!("{i}\n")).unwrap();
        names.push(name);
    }
    fs::write(share.join("to-rename.txt"), b"rename me\n").unwrap();
    fs::write(share.join("to-delete.txt"), b"delete me\n").unwrap();
    let input_sha = hex(&sha256_file(&share.join("input.bin")));
    names.sort();
    let listing_sha = {
        use sha2::Digest;
        let joined: String = names.iter().map(|n| format!("{n}\n")).collect();
        hex(&sha2::Sha256::digest(joined.as_bytes()))
    };

    let socket = vol.dir.path().join("vhost-fs.sock");
    let serve_log = vol.dir.path().join("serve.log");
    let logf = fs::File::create(&serve_log).unwrap();
    let child = Command::new(SLUICE)
        .args(["serve", &vol.meta_url, "--socket"])
        .arg(&socket)
        .args(["--queues", "2", "--once", "--export", "share"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("sluice serve starts");
    let mut serve = Serve {
        child: Some(child),
        log: serve_log,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "sluice serve made no socket: {}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let script = vol.dir.path().join("guest.sh");
    fs::File::create(&script)
        .and_then(|mut f| f.write_all(GUEST_SCRIPT.as_bytes()))
        .unwrap();
    let console_log = vol.dir.path().join("console.log");
    let vm = Command::new(repo().join("vm-images/run-vm.sh"))
        .arg("--socket")
        .arg(&socket)
        .args([
            "--queues",
            "2",
            "--cpus",
            "2",
            "--timeout",
            "600",
            "--script",
        ])
        .arg(&script)
        .arg("--log")
        .arg(&console_log)
        .stdin(Stdio::null())
        .output()
        .expect("vm-images/run-vm.sh runs");
    let console = fs::read_to_string(&console_log).unwrap_or_default();
    assert!(
        vm.status.success(),
        "the guest script failed ({}): {}\nconsole:\n{console}\nserve log:\n{}",
        vm.status,
        common::text(&vm),
        serve.log_text()
    );
    let log = serve.wait(Duration::from_secs(60));
    let value = |name: &str| guest_value(&console, name).unwrap_or_default();

    // Host-written files, as the guest saw them.
    assert_eq!(
        value("input"),
        input_sha,
        "input.bin's SHA-256 in the guest"
    );
    assert_eq!(value("count"), FILES.to_string(), "files the guest listed");
    assert_eq!(
        value("listing"),
        listing_sha,
        "the guest's listing of many/"
    );
    assert_eq!(value("sample"), "777");
    assert_eq!(value("outside"), "hidden", "the export leaked its parent");
    assert!(
        console.lines().any(|l| l.trim_end() == "E2E done"),
        "the guest script did not finish: {console}"
    );

    // Guest-written changes, as the host sees them.
    assert_eq!(
        hex(&sha256_file(&share.join("from-guest.bin"))),
        value("wrote"),
        "from-guest.bin's SHA-256 on the host"
    );
    assert_eq!(
        fs::metadata(share.join("from-guest.bin")).unwrap().len(),
        3_000_001
    );
    assert!(share.join("renamed.txt").exists() && !share.join("to-rename.txt").exists());
    assert!(!share.join("to-delete.txt").exists());
    assert_eq!(
        fs::read_to_string(share.join("guest-dir/note.txt")).unwrap(),
        "written in the guest\n"
    );
    for cpu in ["cpu0.bin", "cpu1.bin"] {
        assert_eq!(
            fs::metadata(share.join(cpu)).unwrap().len(),
            100_000,
            "{cpu}"
        );
    }
    assert_eq!(
        fs::read(host_mnt.join("outside/secret")).unwrap(),
        b"host only"
    );

    // Both request queues (1 and 2; 0 is hiprio) carried requests.
    let counts = queue_requests(&log);
    for queue in [1, 2] {
        let requests = counts
            .iter()
            .find(|(q, _)| *q == queue)
            .map(|(_, r)| *r)
            .unwrap_or(0);
        assert!(
            requests > 0,
            "request queue {queue} carried no requests: {counts:?}\n{log}"
        );
    }
    eprintln!("requests per queue: {counts:?}");
    host.unmount();
}

#[test]
fn queue_counter_lines_parse() {
    let log = "[INFO] queue 0: 3 requests in 3 batches, 1 bytes in, 2 bytes out\n\
               [INFO] queue 2: 40 requests in 9 batches, 1 bytes in, 2 bytes out\n\
               [INFO] queue 1: waiting\n";
    assert_eq!(queue_requests(log), vec![(0, 3), (2, 40)]);
}
