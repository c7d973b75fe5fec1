//! End-to-end: one `sluice host` and two `sluice serve --host` of the same
//! volume (the real programs, sandboxed as they start — as `nobody` when
//! the test runs as root), each VM driven by the virtio-fs driver harness.
//! Both VMs read one data set (each file SHA-256-checked); the servers
//! fetch nothing themselves and the host fetches each block once;
//! `sluice stats` on the host's socket shows it and both VMs. A third VM
//! on the same host daemon, confined to another directory (`--export`),
//! reads its own file and names nothing outside it. Killing
//! the host under them changes nothing the guests see (the servers go on
//! standalone); a new host is attached again and serves them. And with
//! real guests: two QEMU guests (`vm-images/`) on one host daemon hash the
//! data set in the guest, every block fetched once; one guest killed and
//! the host restarted, the other reads on, every round right.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{SLUICE, Serve, Volume, Watchdog};
use sha2::{Digest, Sha256};
use sluice_benches::virtiofs::wire::ROOT_ID;
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue, HarnessError};

const FUSE_FSYNC: u32 = 20;
/// Files of the data set and their size: 2 blocks of 4 MiB each, the
/// second one partial.
const FILES: usize = 3;
const FILE_SIZE: usize = 6 << 20;
/// Distinct blocks of the data set.
const BLOCKS: u64 = 2 * FILES as u64;
/// Blocks of the other tenant's file (5 MiB: 4 MiB and 1 MiB).
const TENANT_BLOCKS: u64 = 2;

fn options() -> DeviceOptions {
    DeviceOptions {
        request_queues: 1,
        queue_size: 256,
        memory_size: 8 << 20,
    }
}

fn content(i: usize) -> Vec<u8> {
    (0..FILE_SIZE as u32)
        .map(|j| (j.wrapping_mul(2_654_435_761) >> 24) as u8 ^ i as u8)
        .collect()
}

/// `sluice host META_URL --control SOCKET`, logging to SOCKET.log.
struct HostDaemon {
    child: Child,
    log: PathBuf,
}

impl HostDaemon {
    /// With its drop-in registry (`/run/sluice/hosts` in production) in
    /// the control socket's folder.
    fn start(meta_url: &str, control: &Path) -> HostDaemon {
        let log = control.with_extension("log");
        let logf = std::fs::File::create(&log).unwrap();
        let child = Command::new(SLUICE)
            .args(["host", meta_url, "--control"])
            .arg(control)
            .args(["--metrics", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env("SLUICE_HOST_REGISTRY", registry_of(control))
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("sluice host starts");
        let host = HostDaemon { child, log };
        host.wait_for("host daemon of volume");
        host
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for(&self, needle: &str) -> String {
        wait_for_log(&|| self.log_text(), needle)
    }

    /// SIGTERM, then the log once it exited.
    fn stop(mut self) -> String {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}: {}", self.log_text());
        self.log_text()
    }
}

impl Drop for HostDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The drop-in registry of the host daemon whose socket is `control`.
fn registry_of(control: &Path) -> PathBuf {
    control.parent().unwrap().join("hosts")
}

fn wait_for_log(log: &dyn Fn() -> String, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = log();
        if text.contains(needle) {
            return text;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Object GETs a daemon made, from its metrics.
fn object_gets(serve: &Serve) -> f64 {
    let metrics = common::scrape(&common::metrics_addr(&|| serve.log_text()));
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("juicefs_object_request_durations_histogram_seconds_count")
                && l.contains("method=\"GET\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every file of the data set read through `socket`, SHA-256 by file.
fn read_data_set(socket: &Path) -> Vec<[u8; 32]> {
    let mut device = Device::connect(socket, options()).expect("connect");
    let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    q.init().expect("INIT");
    let mut sums = Vec::new();
    for i in 0..FILES {
        let node = q
            .lookup(ROOT_ID, format!("f{i}").as_bytes())
            .expect("LOOKUP")
            .nodeid;
        let fh = q.open(node, libc::O_RDONLY as u32).expect("OPEN");
        let mut h = Sha256::new();
        let mut off = 0;
        while off < FILE_SIZE {
            let piece = q.read(node, fh, off as u64, 1 << 20).expect("READ");
            assert!(!piece.is_empty(), "f{i} is short");
            h.update(&piece);
            off += piece.len();
        }
        q.release(node, fh).expect("RELEASE");
        sums.push(h.finalize().into());
    }
    sums
}

fn write_data_set(vol: &Volume) -> Vec<[u8; 32]> {
    let socket = vol.dir.path().join("writer.sock");
    let _serve = Serve::start(&vol.meta_url, &socket, &["--no-pin"]);
    wait_for_log(&|| _serve.log_text(), "waiting for a VM");
    let mut device = Device::connect(&socket, options()).expect("connect");
    let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    q.init().expect("INIT");
    let mut sums = Vec::new();
    for i in 0..FILES {
        let data = content(i);
        let (file, fh) = q
            .create(
                ROOT_ID,
                format!("f{i}").as_bytes(),
                libc::O_RDWR as u32,
                0o644,
            )
            .expect("CREATE");
        for (k, piece) in data.chunks(512 << 10).enumerate() {
            q.write(file.nodeid, fh, (k * (512 << 10)) as u64, piece)
                .expect("WRITE");
        }
        let mut fsync_in = fh.to_le_bytes().to_vec();
        fsync_in.extend_from_slice(&[0; 8]);
        q.call(FUSE_FSYNC, file.nodeid, &fsync_in)
            .expect("FSYNC sent")
            .ok(FUSE_FSYNC)
            .expect("FSYNC");
        q.release(file.nodeid, fh).expect("RELEASE");
        sums.push(Sha256::digest(&data).into());
    }
    // Another tenant's directory, served to a third VM as its export.
    let dir = q.mkdir(ROOT_ID, b"tenant", 0o755).expect("MKDIR");
    let (file, fh) = q
        .create(dir.nodeid, b"own", libc::O_RDWR as u32, 0o644)
        .expect("CREATE");
    for (k, piece) in tenant_bytes().chunks(512 << 10).enumerate() {
        q.write(file.nodeid, fh, (k * (512 << 10)) as u64, piece)
            .expect("WRITE");
    }
    let mut fsync_in = fh.to_le_bytes().to_vec();
    fsync_in.extend_from_slice(&[0; 8]);
    q.call(FUSE_FSYNC, file.nodeid, &fsync_in)
        .expect("FSYNC sent")
        .ok(FUSE_FSYNC)
        .expect("FSYNC");
    q.release(file.nodeid, fh).expect("RELEASE");
    sums
}

fn tenant_bytes() -> Vec<u8> {
    (0..(5u32 << 20)).map(|i| (i % 249) as u8).collect()
}

/// The errno of a refused request.
fn errno<T: std::fmt::Debug>(r: Result<T, HarnessError>) -> i32 {
    match r {
        Err(HarnessError::Errno { errno, .. }) => errno,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn two_vms_on_one_host_daemon_fetch_each_block_once_and_survive_its_restart() {
    let _dog = Watchdog::new("host", Duration::from_secs(600));
    let vol = Volume::format("hostvms", &[]);
    let want = write_data_set(&vol);
    let control = vol.dir.path().join("host.sock");
    let host = HostDaemon::start(&vol.meta_url, &control);
    let control_s = control.to_str().unwrap();
    // Mappings of one block and a memory cache smaller than a block (as a
    // server of a host daemon needs: the host holds the blocks): a read of
    // another block asks the host again, or, without it, the object store,
    // so who serves it shows.
    let serve_args = [
        "--no-pin",
        "--cache-size",
        "1",
        "--host",
        control_s,
        "--host-mappings",
        "1",
        "--metrics",
        "127.0.0.1:0",
    ];
    let sockets = [
        vol.dir.path().join("vm1.sock"),
        vol.dir.path().join("vm2.sock"),
    ];
    let serves: Vec<Serve> = sockets
        .iter()
        .map(|s| Serve::start(&vol.meta_url, s, &serve_args))
        .collect();
    for s in &serves {
        wait_for_log(&|| s.log_text(), "attached to the host daemon");
        wait_for_log(&|| s.log_text(), "waiting for a VM");
    }
    let before: Vec<f64> = serves.iter().map(object_gets).collect();
    // Both VMs read the whole data set at once.
    let got: Vec<Vec<[u8; 32]>> = std::thread::scope(|scope| {
        let handles: Vec<_> = sockets
            .iter()
            .map(|s| scope.spawn(move || read_data_set(s)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for sums in &got {
        assert_eq!(sums, &want, "a VM read other bytes");
    }
    let after: Vec<f64> = serves.iter().map(object_gets).collect();
    assert_eq!(before, after, "a VM server fetched blocks itself");

    // A third VM on the same host daemon, confined to another tenant's
    // directory: it reads its own file and names nothing of the others',
    // whose blocks the host holds at this moment.
    let tenant_socket = vol.dir.path().join("vm3.sock");
    let mut tenant_args = serve_args.to_vec();
    tenant_args.extend_from_slice(&["--export", "tenant"]);
    let tenant = Serve::start(&vol.meta_url, &tenant_socket, &tenant_args);
    wait_for_log(&|| tenant.log_text(), "attached to the host daemon");
    wait_for_log(&|| tenant.log_text(), "waiting for a VM");
    {
        let mut device = Device::connect(&tenant_socket, options()).expect("connect");
        let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
        q.init().expect("INIT");
        for name in [&b"f0"[..], b"f1", b"tenant"] {
            assert_eq!(errno(q.lookup(ROOT_ID, name)), libc::ENOENT, "{name:?}");
        }
        let dh = q.opendir(ROOT_ID).expect("OPENDIR");
        let names: Vec<Vec<u8>> = q
            .readdirplus(ROOT_ID, dh, 0, 64 << 10)
            .expect("READDIRPLUS")
            .into_iter()
            .map(|e| e.name)
            .filter(|n| n != b"." && n != b"..")
            .collect();
        q.releasedir(ROOT_ID, dh).expect("RELEASEDIR");
        assert_eq!(names, vec![b"own".to_vec()]);
        let node = q.lookup(ROOT_ID, b"own").expect("LOOKUP").nodeid;
        let fh = q.open(node, libc::O_RDONLY as u32).expect("OPEN");
        let mut back = Vec::new();
        loop {
            let piece = q.read(node, fh, back.len() as u64, 1 << 20).expect("READ");
            if piece.is_empty() {
                break;
            }
            back.extend_from_slice(&piece);
        }
        assert!(back == tenant_bytes(), "the tenant's file differs");
    }
    drop(tenant);
    // `sluice stats` on the host's socket shows the host and each VM.
    let stats = common::sluice(&["stats", control_s, "--count", "1", "--interval", "0.2"]);
    let text = common::text(&stats);
    assert!(stats.status.success(), "{text}");
    assert!(
        text.contains("host") && text.contains("vm vm1-") && text.contains("vm vm2-"),
        "{text}"
    );
    // Its metrics say the same: the sluice_host_* families, each VM's by
    // its `vm` label; and each server's where its blocks came from.
    let metrics = common::scrape(&common::metrics_addr(&|| host.log_text()));
    for family in [
        "# TYPE sluice_host_fetches_total counter",
        "# TYPE sluice_host_fetched_bytes_total counter",
        "# TYPE sluice_host_memory_bytes gauge",
        "# TYPE sluice_host_vms gauge",
        "# TYPE sluice_host_vm_requests_total counter",
        "# TYPE sluice_host_vm_hits_total counter",
        "# TYPE sluice_host_vm_outstanding gauge",
    ] {
        assert!(metrics.contains(family), "{family}:\n{metrics}");
    }
    let sample = |text: &str, name: &str, with: &[&str]| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter(|l| with.iter().all(|w| l.contains(w)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        sample(&metrics, "sluice_host_fetches_total", &[]),
        (BLOCKS + TENANT_BLOCKS) as f64,
        "{metrics}"
    );
    for vm in ["vm=\"vm1-", "vm=\"vm2-"] {
        assert!(
            sample(&metrics, "sluice_host_vm_requests_total", &[vm]) > 0.0,
            "{vm}:\n{metrics}"
        );
        for kind in ["kind=\"memory\"", "kind=\"file\""] {
            assert!(
                metrics
                    .lines()
                    .any(|l| l.starts_with("sluice_host_vm_hits_total{")
                        && l.contains(vm)
                        && l.contains(kind)),
                "{vm} {kind}:\n{metrics}"
            );
        }
    }
    let server = common::scrape(&common::metrics_addr(&|| serves[0].log_text()));
    assert_eq!(
        sample(&server, "sluice_host_attached", &[]),
        1.0,
        "{server}"
    );
    assert!(
        server.contains("# TYPE sluice_host_blocks_total counter")
            && server.contains("from=\"mapped\"")
            && server.contains("from=\"standalone\""),
        "{server}"
    );
    // The host daemon goes (an upgrade): the guests read on, served
    // standalone by their servers...
    let log = host.stop();
    assert!(
        log.contains(&format!(
            "the host fetched {} blocks",
            BLOCKS + TENANT_BLOCKS
        )),
        "each block once for all VMs:\n{log}"
    );
    assert!(log.contains("VM vm1-") && log.contains("VM vm2-"), "{log}");
    for ((s, socket), a) in serves.iter().zip(&sockets).zip(&after) {
        assert_eq!(read_data_set(socket), want);
        assert!(object_gets(s) > *a, "served standalone");
    }
    // ...and attach again to the next one, which then fetches for them.
    let host = HostDaemon::start(&vol.meta_url, &control);
    for s in &serves {
        let deadline = Instant::now() + Duration::from_secs(60);
        while s.log_text().matches("attached to the host daemon").count() < 2 {
            assert!(
                Instant::now() < deadline,
                "never attached again:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let attached: Vec<f64> = serves.iter().map(object_gets).collect();
    for socket in &sockets {
        assert_eq!(read_data_set(socket), want);
    }
    let now: Vec<f64> = serves.iter().map(object_gets).collect();
    assert_eq!(attached, now, "attached again, the servers fetch nothing");
    // Killed outright: the guests still read every byte.
    drop(host);
    for socket in &sockets {
        assert_eq!(read_data_set(socket), want);
    }
}

/// What each guest runs in its mount: a SHA-256 of every file of the data
/// set per round, its page cache dropped after each round so that the
/// next reads through virtio-fs again; before rounds 1 and 2 it waits for
/// the files `go1` and `go2`, which the test creates when it wants.
const GUEST_ROUNDS: &str = r#"set -e
for round in 0 1 2 3; do
    if [ "$round" = 1 ] || [ "$round" = 2 ]; then
        while [ ! -e "go$round" ]; do sleep 0.3; done
    fi
    for f in f0 f1 f2; do
        echo "E2E r${round}_$f $(sha256sum $f | cut -d' ' -f1)"
    done
    echo "E2E round $round"
    sync
    echo 3 >/proc/sys/vm/drop_caches || true
done
echo "E2E done"
"#;

/// Creates the empty file `name` at the volume's root through `socket` (a
/// standalone `serve` of the test's).
fn touch(socket: &Path, name: &[u8]) {
    let mut device = Device::connect(socket, options()).expect("connect");
    let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    q.init().expect("INIT");
    let (file, fh) = q
        .create(ROOT_ID, name, libc::O_RDWR as u32, 0o644)
        .expect("CREATE");
    q.release(file.nodeid, fh).expect("RELEASE");
}

/// Two real Linux guests (QEMU, `vm-images/`) on one host daemon read one
/// data set at once, each file SHA-256-checked in the guest, every block
/// fetched once. Then guest 2 is killed and the host daemon stopped: guest
/// 1 reads a round served standalone; a new host daemon is started, guest
/// 1's server attaches to it and guest 1 reads two more rounds through it,
/// each block fetched once again. Every round of guest 1 is right.
#[test]
fn two_qemu_guests_on_one_host_daemon_read_one_data_set() {
    if let Some(why) = common::vm_prerequisite_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let _dog = Watchdog::new("host_vms", Duration::from_secs(1500));
    common::build_guest();
    let vol = Volume::format("hostqemu", &[]);
    let want: Vec<String> = write_data_set(&vol)
        .iter()
        .map(|d| common::hex(d))
        .collect();
    // A standalone server of the test's, to create the guests' gates.
    let gate_socket = vol.dir.path().join("gates.sock");
    let gates = Serve::start(&vol.meta_url, &gate_socket, &["--no-pin"]);
    wait_for_log(&|| gates.log_text(), "waiting for a VM");
    let control = vol.dir.path().join("host.sock");
    let host = HostDaemon::start(&vol.meta_url, &control);
    let control_s = control.to_str().unwrap();
    let serve_args = [
        "--no-pin",
        "--cache-size",
        "1",
        "--host",
        control_s,
        "--host-mappings",
        "1",
    ];
    let sockets = [
        vol.dir.path().join("vm1.sock"),
        vol.dir.path().join("vm2.sock"),
    ];
    let serves: Vec<Serve> = sockets
        .iter()
        .map(|s| Serve::start(&vol.meta_url, s, &serve_args))
        .collect();
    for s in &serves {
        wait_for_log(&|| s.log_text(), "attached to the host daemon");
        wait_for_log(&|| s.log_text(), "waiting for a VM");
    }
    let script = vol.dir.path().join("rounds.sh");
    std::fs::write(&script, GUEST_ROUNDS).unwrap();
    let consoles: Vec<PathBuf> = (1..=2)
        .map(|i| vol.dir.path().join(format!("console{i}.log")))
        .collect();
    let pidfiles: Vec<PathBuf> = (1..=2)
        .map(|i| vol.dir.path().join(format!("qemu{i}.pid")))
        .collect();
    let mut guests: Vec<Child> = (0..2)
        .map(|i| {
            Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("vm-images/run-vm.sh"))
                .arg("--socket")
                .arg(&sockets[i])
                .args([
                    "--cpus",
                    "1",
                    "--mem",
                    "512M",
                    "--timeout",
                    "1200",
                    "--script",
                ])
                .arg(&script)
                .arg("--log")
                .arg(&consoles[i])
                .arg("--pidfile")
                .arg(&pidfiles[i])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("vm-images/run-vm.sh starts")
        })
        .collect();
    let console = |i: usize| std::fs::read_to_string(&consoles[i]).unwrap_or_default();
    let round_of = |i: usize, r: u32| -> Vec<String> {
        let text = console(i);
        (0..FILES)
            .map(|f| common::guest_value(&text, &format!("r{r}_f{f}")).unwrap_or_default())
            .collect()
    };
    let wait_round = |guests: &mut Vec<Child>, which: &[usize], round: u32| {
        let deadline = Instant::now() + Duration::from_secs(1200);
        let mark = format!("E2E round {round}");
        while !which.iter().all(|&i| console(i).contains(&mark)) {
            assert!(
                Instant::now() < deadline,
                "no {mark:?}:\n{}\n{}",
                console(0),
                console(1)
            );
            for &i in which {
                assert!(
                    guests[i].try_wait().unwrap().is_none(),
                    "guest {} ended early:\n{}",
                    i + 1,
                    console(i)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // Both guests read the data set once, at the same time.
    wait_round(&mut guests, &[0, 1], 0);
    for i in 0..2 {
        assert_eq!(round_of(i, 0), want, "guest {} read other bytes", i + 1);
    }
    // Guest 2 dies; the host daemon goes; guest 1 reads a round standalone.
    let qemu2: i32 = std::fs::read_to_string(&pidfiles[1])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: a signal to the QEMU this test started.
    unsafe { libc::kill(qemu2, libc::SIGKILL) };
    let _ = guests[1].wait();
    let log = host.stop();
    assert!(
        log.contains(&format!("the host fetched {BLOCKS} blocks")),
        "each block once for both guests:\n{log}"
    );
    touch(&gate_socket, b"go1");
    wait_round(&mut guests, &[0], 1);
    assert_eq!(round_of(0, 1), want, "guest 1's round served standalone");
    // A new host daemon: guest 1's server attaches again and guest 1
    // reads through it.
    let host = HostDaemon::start(&vol.meta_url, &control);
    let deadline = Instant::now() + Duration::from_secs(60);
    while serves[0]
        .log_text()
        .matches("attached to the host daemon")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "never attached again");
        std::thread::sleep(Duration::from_millis(20));
    }
    touch(&gate_socket, b"go2");
    let status = guests[0].wait().unwrap();
    let text = console(0);
    assert!(status.success(), "guest 1 failed ({status}):\n{text}");
    assert!(text.contains("E2E done"), "{text}");
    for r in 0..4 {
        assert_eq!(round_of(0, r), want, "guest 1's round {r}");
    }
    let log = host.stop();
    assert!(
        log.contains(&format!("the host fetched {BLOCKS} blocks")),
        "rounds 2 and 3 through the new host, each block once:\n{log}"
    );
}

/// A server started with virtiofsd's command line (as libvirt and Kata
/// start one: no `--host` there) finds the host daemon of its volume by
/// itself and takes every block from it; the daemon's registry entry goes
/// with the daemon.
#[test]
fn a_virtiofsd_drop_in_attaches_to_the_host_daemon_of_its_volume() {
    let _dog = Watchdog::new("host drop-in", Duration::from_secs(300));
    let vol = Volume::format("hostdropin", &[]);
    let want = write_data_set(&vol);
    let control = vol.dir.path().join("host.sock");
    let host = HostDaemon::start(&vol.meta_url, &control);
    let registry = registry_of(&control);
    let entries: Vec<PathBuf> = std::fs::read_dir(&registry)
        .expect("the host daemon made its registry")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(std::fs::read_link(&entries[0]).unwrap(), control);

    let (socket, mut child, log) = start_drop_in(&vol, &registry);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for_log(&log_text, "attached to the host daemon");
    wait_for_log(&log_text, "Waiting for vhost-user socket connection");
    assert_eq!(read_data_set(&socket), want, "the VM read other bytes");
    // The VMM went: the drop-in ends, as virtiofsd does.
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {}", log_text());

    let host_log = host.stop();
    assert!(
        host_log.contains(&format!("the host fetched {BLOCKS} blocks")),
        "the host fetched the data set once, for the drop-in: {host_log}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&registry).unwrap().next().is_some() {
        assert!(
            Instant::now() < deadline,
            "the registry entry outlived its host daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The virtiofsd drop-in on `vol` (the settings-file form of
/// --shared-dir names the volume), looking for host daemons in
/// `registry`: its socket, its process and its log.
fn start_drop_in(vol: &Volume, registry: &Path) -> (PathBuf, std::process::Child, PathBuf) {
    let shared = vol.dir.path().join("vm-share");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(
        shared.join("sluice.env"),
        format!(
            "META_URL={}\nSLUICE_ARGS=--no-pin --cache-size 1 --no-metrics\n",
            vol.meta_url
        ),
    )
    .unwrap();
    let socket = vol.dir.path().join("dropin.sock");
    let log = vol.dir.path().join("dropin.log");
    let logf = std::fs::File::create(&log).unwrap();
    let child = Command::new(SLUICE)
        .arg(format!("--socket-path={}", socket.display()))
        .arg(format!("--shared-dir={}", shared.display()))
        .env("SLUICE_HOST_REGISTRY", registry)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("the drop-in starts");
    (socket, child, log)
}

#[test]
fn a_virtiofsd_drop_in_started_before_the_host_daemon_attaches_once_it_runs() {
    let _dog = Watchdog::new("host drop-in first", Duration::from_secs(300));
    let vol = Volume::format("hostdropinfirst", &[]);
    let want = write_data_set(&vol);
    let control = vol.dir.path().join("host.sock");
    let registry = registry_of(&control);
    let (socket, mut child, log) = start_drop_in(&vol, &registry);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for_log(&log_text, "Waiting for vhost-user socket connection");
    wait_for_log(&log_text, "no host daemon to attach to now");
    // The drop-in serves standalone, then finds the daemon that starts
    // after it (the registry is looked at again, with its trust checks).
    let host = HostDaemon::start(&vol.meta_url, &control);
    wait_for_log(&log_text, "attached to the host daemon");
    assert_eq!(read_data_set(&socket), want, "the VM read other bytes");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {}", log_text());
    let host_log = host.stop();
    assert!(
        host_log.contains(&format!("the host fetched {BLOCKS} blocks")),
        "the host fetched the data set, for the drop-in that started first: {host_log}"
    );
}
