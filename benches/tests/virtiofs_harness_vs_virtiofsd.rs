//! The virtio-fs driver harness against an independent vhost-user-fs
//! implementation, QEMU's virtiofsd, exporting a real directory: what the
//! harness writes must appear in the directory, what is in the directory
//! must come back through READ and READDIRPLUS.
//!
//! Skipped (with a notice) where virtiofsd is not installed
//! (`apt-get install qemu-system-common` provides /usr/lib/qemu/virtiofsd).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_benches::virtiofs::wire::ROOT_ID;
use sluice_benches::virtiofs::{
    Device, DeviceOptions, FuseQueue, Pattern, VirtiofsArgs, fill_pattern, run,
};

const VIRTIOFSD_PATHS: &[&str] = &["/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd"];

fn virtiofsd() -> Option<PathBuf> {
    VIRTIOFSD_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

struct Virtiofsd {
    child: Child,
    socket: PathBuf,
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(binary: &Path, dir: &Path) -> Virtiofsd {
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).expect("shared dir");
    let socket = dir.join("virtiofsd.sock");
    let child = Command::new(binary)
        .arg(format!("--socket-path={}", socket.display()))
        .arg("-o")
        .arg(format!("source={}", shared.display()))
        .args(["-o", "cache=none", "-o", "sandbox=chroot", "-f"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start virtiofsd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "virtiofsd did not create its socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Virtiofsd { child, socket }
}

/// Compares byte strings, reporting the first difference instead of both.
fn assert_same(got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "bytes differ first at {at}: got {:?}, want {:?}",
            &got[at..(at + 16).min(got.len())],
            &want[at..(at + 16).min(want.len())]
        );
    }
}

#[test]
fn harness_round_trips_files_through_virtiofsd() {
    let Some(binary) = virtiofsd() else {
        eprintln!("virtiofsd not installed; skipping");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let daemon = start(&binary, dir.path());
    let shared = dir.path().join("shared");
    std::fs::write(shared.join("existing"), b"written on the host").expect("host file");

    let mut device = Device::connect(
        &daemon.socket,
        DeviceOptions {
            request_queues: 1,
            queue_size: 128,
            memory_size: 16 << 20,
        },
    )
    .expect("connect to virtiofsd");
    let mut queue = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    let init = queue.init().expect("INIT");
    assert_eq!(init.major, 7);

    // READ a file the host wrote.
    let existing = queue.lookup(ROOT_ID, b"existing").expect("LOOKUP");
    assert_eq!(existing.attr.size, 19);
    let fh = queue
        .open(existing.nodeid, libc::O_RDONLY as u32)
        .expect("OPEN");
    assert_eq!(
        queue.read(existing.nodeid, fh, 0, 4096).expect("READ"),
        b"written on the host"
    );
    queue.release(existing.nodeid, fh).expect("RELEASE");

    // CREATE + WRITE a file; the host sees the bytes.
    let mut data = vec![0u8; 300_000];
    fill_pattern(&mut data, 0);
    let (entry, fh) = queue
        .create(
            ROOT_ID,
            b"from-guest",
            (libc::O_RDWR | libc::O_CREAT) as u32,
            libc::S_IFREG | 0o644,
        )
        .expect("CREATE");
    for (i, chunk) in data.chunks(128 << 10).enumerate() {
        let written = queue
            .write(entry.nodeid, fh, (i * (128 << 10)) as u64, chunk)
            .expect("WRITE");
        assert_eq!(written as usize, chunk.len());
    }
    assert_same(
        &queue.read(entry.nodeid, fh, 1000, 5000).expect("READ back"),
        &data[1000..6000],
    );
    queue.flush(entry.nodeid, fh).expect("FLUSH");
    queue.release(entry.nodeid, fh).expect("RELEASE");
    assert_same(
        &std::fs::read(shared.join("from-guest")).expect("host read"),
        &data,
    );

    // READDIRPLUS lists both.
    let dh = queue.opendir(ROOT_ID).expect("OPENDIR");
    let entries = queue
        .readdirplus(ROOT_ID, dh, 0, 64 << 10)
        .expect("READDIRPLUS");
    let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
    assert!(names.contains(&&b"existing"[..]), "{names:?}");
    assert!(names.contains(&&b"from-guest"[..]), "{names:?}");
    let listed = entries
        .iter()
        .find(|e| e.name == b"from-guest")
        .expect("listed");
    assert_eq!(listed.entry.attr.size, data.len() as u64);
    queue.releasedir(ROOT_ID, dh).expect("RELEASEDIR");

    // A missing name is ENOENT.
    assert!(matches!(
        queue.lookup(ROOT_ID, b"missing"),
        Err(sluice_benches::virtiofs::HarnessError::Errno { errno, .. }) if errno == libc::ENOENT
    ));
}

#[test]
fn bench_runs_against_virtiofsd() {
    let Some(binary) = virtiofsd() else {
        eprintln!("virtiofsd not installed; skipping");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let daemon = start(&binary, dir.path());
    let other_dir = tempfile::tempdir().expect("temp dir");
    let other = start(&binary, other_dir.path());
    let report = run(&VirtiofsArgs {
        socket: daemon.socket.clone(),
        queues: 1,
        block_size: 64 << 10,
        depth: 8,
        seconds: 1,
        vs_memcpy: true,
        file: "bench.dat".to_string(),
        file_size: 4 << 20,
        queue_size: 128,
        vs_socket: Some(other.socket.clone()),
        meta: false,
        pattern: Pattern::Random,
        warm_first: false,
        pids: Vec::new(),
        vs_pids: Vec::new(),
        cold_file: None,
        cold_depth: 4,
        cold_stride: 4 << 20,
        settle: 0.0,
        json: false,
        write: false,
    })
    .expect("bench run");
    let reference = report.reference.as_ref().expect("reference measured");
    assert!(reference.ops > 0);
    assert!(report.ops > 0);
    assert_eq!(report.bytes, report.ops * (64 << 10));
    assert!(report.memcpy_gb_per_s.is_some_and(|g| g > 0.0));
    let on_host = std::fs::read(dir.path().join("shared/bench.dat")).expect("bench file");
    let mut expected = vec![0u8; 4 << 20];
    fill_pattern(&mut expected, 0);
    assert_same(&on_host, &expected);
    println!("{report}");
}
