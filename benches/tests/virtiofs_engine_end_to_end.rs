//! End to end: a SQLite + local-directory volume formatted in a temp dir,
//! served by the sluice virtio-fs device in-process (engine `Vfs` → `fuse`
//! dispatcher → vhost-user backend), driven over its unix socket by the
//! host-side virtio-fs driver harness exactly as a guest would.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use sluice_benches::virtiofs::wire::{self, ROOT_ID, opcode};
use sluice_benches::virtiofs::{
    Device, DeviceOptions, FuseQueue, HarnessError, Pattern, VirtiofsArgs, fill_pattern, run,
};
use sluice_engine::format::Compression;
use sluice_engine::meta::open_meta;
use sluice_engine::vfs::{Vfs, VfsConfig};
use sluice_engine::volume::{format_volume, open_volume};
use sluice_fuse::{Config, Dispatcher};
use sluice_vhost::{DeviceConfig, FuseHandler, VirtioFsDevice};

const REQUEST_QUEUES: usize = 2;

struct Served {
    dir: tempfile::TempDir,
    socket: PathBuf,
    server: JoinHandle<sluice_vhost::Result<()>>,
}

fn format(dir: &Path) {
    let meta = open_meta(&meta_url(dir)).expect("open meta");
    format_volume(
        &*meta,
        "e2e",
        &dir.join("bucket"),
        1024,
        Compression::None,
        0,
    )
    .expect("format volume");
}

fn meta_url(dir: &Path) -> String {
    format!("sqlite3://{}/meta.db", dir.display())
}

fn open_vfs(dir: &Path) -> Vfs {
    open_vfs_buffering(dir, VfsConfig::default().buffer_bytes)
}

/// [`open_vfs`] with a write buffer of `buffer_bytes` per file.
fn open_vfs_buffering(dir: &Path, buffer_bytes: usize) -> Vfs {
    let meta = open_meta(&meta_url(dir)).expect("open meta");
    let config = VfsConfig {
        cache_bytes: 64 << 20,
        cleanup_interval: None,
        buffer_bytes,
        ..VfsConfig::default()
    };
    Vfs::new(open_volume(meta).expect("open volume"), config).expect("vfs")
}

/// Serves the volume in `dir` for one connection.
fn serve_in(dir: tempfile::TempDir) -> Served {
    serve_vfs(open_vfs(dir.path()), dir)
}

/// Serves `vfs` (the volume in `dir`) for one connection.
fn serve_vfs(vfs: Vfs, dir: tempfile::TempDir) -> Served {
    let config = DeviceConfig::new("sluice-e2e", REQUEST_QUEUES);
    let handler = FuseHandler::new(Dispatcher::new(vfs, Config::default()));
    let socket = dir.path().join("vhost-fs.sock");
    let mut listener = sluice_vhost::listen(&socket, None).expect("listen");
    let device = VirtioFsDevice::new(config, Arc::new(handler)).expect("device");
    let server = std::thread::spawn(move || device.serve(&mut listener));
    Served {
        dir,
        socket,
        server,
    }
}

/// Formats a fresh volume and serves it.
fn serve() -> Served {
    let dir = tempfile::tempdir().expect("temp dir");
    format(dir.path());
    serve_in(dir)
}

/// Waits for the connection to end; gives the volume's directory back.
fn stop(served: Served) -> tempfile::TempDir {
    served
        .server
        .join()
        .expect("server thread")
        .expect("clean shutdown");
    served.dir
}

fn connect(served: &Served) -> Device {
    Device::connect(
        &served.socket,
        DeviceOptions {
            request_queues: REQUEST_QUEUES,
            queue_size: 256,
            memory_size: 32 << 20,
        },
    )
    .expect("connect")
}

fn errno(result: Result<impl std::fmt::Debug, HarnessError>) -> i32 {
    match result {
        Err(HarnessError::Errno { errno, .. }) => errno,
        other => panic!("expected an errno reply, got {other:?}"),
    }
}

/// Compares byte strings, reporting the first difference instead of both.
fn assert_same(got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("bytes differ first at {at}");
    }
}

#[test]
fn guest_reads_what_it_wrote_through_the_engine() {
    let served = serve();
    let mut device = connect(&served);
    let mut hiprio = FuseQueue::new(&mut device, 0, 4096).expect("hiprio");
    let mut q1 = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue 1");
    let mut q2 = FuseQueue::new(&mut device, 2, 1 << 20).expect("queue 2");

    let init = q1.init().expect("INIT");
    assert_eq!(init.major, 7);
    assert!(init.max_write >= 4096);
    assert_eq!(device.tag(), Some("sluice-e2e"));

    // Unknown opcodes get ENOSYS.
    let reply = q1.call(9999, ROOT_ID, &[]).expect("reply");
    assert_eq!(reply.error, -libc::ENOSYS);

    assert_eq!(errno(q1.lookup(ROOT_ID, b"data.bin")), libc::ENOENT);
    let (entry, fh) = q1
        .create(
            ROOT_ID,
            b"data.bin",
            (libc::O_RDWR | libc::O_CREAT) as u32,
            libc::S_IFREG | 0o644,
        )
        .expect("CREATE");
    let len = 3 * (1 << 20) + 12_345;
    let mut data = vec![0u8; len];
    fill_pattern(&mut data, 0);
    let chunk = init.max_write.min(1 << 20) as usize;
    for (i, piece) in data.chunks(chunk).enumerate() {
        let written = q1
            .write(entry.nodeid, fh, (i * chunk) as u64, piece)
            .expect("WRITE");
        assert_eq!(written as usize, piece.len());
    }
    q1.flush(entry.nodeid, fh).expect("FLUSH");
    q1.release(entry.nodeid, fh).expect("RELEASE");

    // Read back on the other queue, across block boundaries and past EOF.
    let found = q2.lookup(ROOT_ID, b"data.bin").expect("LOOKUP");
    assert_eq!(found.nodeid, entry.nodeid);
    assert_eq!(found.attr.size, len as u64);
    let fh = q2.open(found.nodeid, libc::O_RDONLY as u32).expect("OPEN");
    for (offset, size) in [
        (0usize, 4096usize),
        (1_000_000, 100_000),
        ((1 << 20) - 7, 1 << 20),
        (len - 100, 4096),
    ] {
        let got = q2
            .read(found.nodeid, fh, offset as u64, size as u32)
            .expect("READ");
        let end = (offset + size).min(len);
        assert_same(&got, &data[offset..end]);
    }
    q2.release(found.nodeid, fh).expect("RELEASE");

    // READDIRPLUS lists the file with its size.
    let dh = q1.opendir(ROOT_ID).expect("OPENDIR");
    let entries = q1
        .readdirplus(ROOT_ID, dh, 0, 64 << 10)
        .expect("READDIRPLUS");
    let listed = entries
        .iter()
        .find(|e| e.name == b"data.bin")
        .expect("data.bin listed");
    assert_eq!(listed.entry.attr.size, len as u64);
    assert_eq!(listed.entry.nodeid, entry.nodeid);
    q1.releasedir(ROOT_ID, dh).expect("RELEASEDIR");

    // Names with a slash, or `..` where a new entry is made, are refused.
    assert_eq!(errno(q1.lookup(ROOT_ID, b"a/b")), libc::EINVAL);
    for bad in [&b"x/y"[..], b"..", b"."] {
        let result = q1.create(ROOT_ID, bad, libc::O_CREAT as u32, libc::S_IFREG | 0o644);
        assert_eq!(errno(result), libc::EINVAL, "name {bad:?}");
    }
    // `..` of the root does not leave the export.
    if let Ok(up) = q1.lookup(ROOT_ID, b"..") {
        assert_eq!(up.nodeid, ROOT_ID);
    }

    // A WRITE whose header claims more data than it carries is refused.
    let unique = q1.unique();
    let mut lying = wire::request(
        opcode::WRITE,
        unique,
        entry.nodeid,
        &wire::write_in_header(1, 0, 4096),
    );
    lying.extend_from_slice(&[0u8; 100]);
    let reply = q1
        .call_raw(opcode::WRITE, &lying, 4096)
        .expect("reply to a short WRITE");
    assert!(
        reply.error < 0,
        "short WRITE must fail, got {}",
        reply.error
    );

    // FORGET goes on the hiprio queue and takes no reply.
    assert_eq!(hiprio.forget(entry.nodeid, 1).expect("FORGET"), 0);

    // The session still works after all of that.
    assert_eq!(q1.getattr(entry.nodeid).expect("GETATTR").size, len as u64);

    drop(device);
    stop(served);
}

#[test]
fn unflushed_writes_survive_the_guest_going_away() {
    let served = serve();
    let mut device = connect(&served);
    let mut queue = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    queue.init().expect("INIT");
    let (entry, fh) = queue
        .create(
            ROOT_ID,
            b"unflushed",
            (libc::O_WRONLY | libc::O_CREAT) as u32,
            libc::S_IFREG | 0o644,
        )
        .expect("CREATE");
    let mut data = vec![0u8; 300_000];
    fill_pattern(&mut data, 7);
    queue.write(entry.nodeid, fh, 0, &data).expect("WRITE");
    // The guest vanishes: no FLUSH, no RELEASE, no DESTROY.
    drop(device);
    let dir = stop(served);

    let served = serve_in(dir);
    let mut device = connect(&served);
    let mut queue = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    queue.init().expect("INIT");
    let found = queue.lookup(ROOT_ID, b"unflushed").expect("LOOKUP");
    assert_eq!(found.attr.size, data.len() as u64);
    let fh = queue
        .open(found.nodeid, libc::O_RDONLY as u32)
        .expect("OPEN");
    let got = queue
        .read(found.nodeid, fh, 0, data.len() as u32)
        .expect("READ");
    assert_same(&got, &data);
    drop(device);
    stop(served);
}

#[test]
fn bench_drives_the_sluice_device() {
    let served = serve();
    let report = run(&VirtiofsArgs {
        socket: served.socket.clone(),
        queues: REQUEST_QUEUES,
        block_size: 256 << 10,
        depth: 4,
        seconds: 1,
        vs_memcpy: false,
        file: "bench.dat".to_string(),
        file_size: 8 << 20,
        queue_size: 128,
        vs_socket: None,
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
    .expect("bench");
    assert!(report.ops > 0);
    assert_eq!(report.bytes, report.ops * (256 << 10));
    assert_eq!(report.tag.as_deref(), Some("sluice-e2e"));
    stop(served);
}

fn bench_args(served: &Served, file: &str, block_size: u64) -> VirtiofsArgs {
    VirtiofsArgs {
        socket: served.socket.clone(),
        queues: 1,
        block_size,
        depth: 4,
        seconds: 60,
        vs_memcpy: false,
        file: file.to_string(),
        file_size: 8 << 20,
        queue_size: 128,
        vs_socket: None,
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
    }
}

#[test]
fn bench_write_fills_a_file_per_queue_in_order() {
    check_bench_write(serve());
}

/// With a 256 KiB write buffer the files commit behind the WRITEs every
/// few of them, and WRITEs that meet a commit still running are handed to
/// waiters, which take their data from the guest's descriptors again: the
/// files must hold the same bytes.
#[test]
fn bench_write_with_commits_behind_every_few_writes_stores_every_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    format(dir.path());
    let vfs = open_vfs_buffering(dir.path(), 256 << 10);
    check_bench_write(serve_vfs(vfs, dir));
}

/// Runs `bench --write` (two queues, 4 MiB each in 256 KiB WRITEs) on
/// `served` and reads the files back.
fn check_bench_write(served: Served) {
    let block = 256u64 << 10;
    let depth = 4;
    let report = run(&VirtiofsArgs {
        write: true,
        queues: REQUEST_QUEUES,
        file_size: 4 << 20,
        pids: vec![std::process::id()],
        ..bench_args(&served, "w.dat", block)
    })
    .expect("bench --write");
    assert!(report.write && report.ran_out, "{report}");
    assert_eq!(report.ops, 2 * 16, "two files of 4 MiB in 256 KiB WRITEs");
    assert!(report.cpu_s_per_gb.is_some());
    assert!(format!("{report}").starts_with("virtiofs write"));
    // Every block of each file holds the data of one of the WRITE slots.
    let slots: Vec<Vec<u8>> = (0..depth)
        .map(|n: u64| {
            let mut p = vec![0u8; block as usize];
            fill_pattern(&mut p, n << 32);
            p
        })
        .collect();
    // The device serves one connection: serve the volume again to read.
    let served = serve_in(stop(served));
    let mut device = connect(&served);
    let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    q.init().expect("INIT");
    for name in ["w.dat.w1", "w.dat.w2"] {
        let entry = q.lookup(1, name.as_bytes()).expect("LOOKUP");
        assert_eq!(entry.attr.size, 4 << 20, "{name}");
        let fh = q.open(entry.nodeid, libc::O_RDONLY as u32).expect("OPEN");
        for at in (0..4u64 << 20).step_by(block as usize) {
            let got = q.read(entry.nodeid, fh, at, block as u32).expect("READ");
            assert!(slots.contains(&got), "{name} at {at}: not a slot's data");
        }
        q.release(entry.nodeid, fh).expect("RELEASE");
    }
    drop(device);
    stop(served);
}

#[test]
fn bench_once_reads_every_block_once_and_stops() {
    let served = serve();
    let report = run(&VirtiofsArgs {
        pattern: Pattern::Once,
        pids: vec![std::process::id()],
        ..bench_args(&served, "once.dat", 256 << 10)
    })
    .expect("bench");
    assert_eq!(report.ops, 32, "8 MiB in 256 KiB READs, each once");
    assert!(report.ran_out);
    let cpu = report.cpu_seconds.expect("--pid samples CPU");
    assert!(cpu >= 0.0);
    assert!(report.cpu_s_per_gb.is_some());
    assert!(format!("{report}").contains("every block read once"));
    stop(served);
}

#[test]
fn bench_mixed_mode_reports_cold_reads_apart_and_ends_with_them() {
    // The cold file: written (and read) through one connection, then served
    // afresh so that the second run sees it as a file to read.
    let served = serve();
    run(&VirtiofsArgs {
        pattern: Pattern::Once,
        ..bench_args(&served, "cold.dat", 1 << 20)
    })
    .expect("create the cold file");
    let served = serve_in(stop(served));
    let report = run(&VirtiofsArgs {
        warm_first: true,
        cold_file: Some("cold.dat".to_string()),
        cold_depth: 2,
        cold_stride: 1 << 20,
        ..bench_args(&served, "hot.dat", 64 << 10)
    })
    .expect("bench");
    let cold = report.cold.as_ref().expect("cold READs reported");
    // (8 MiB - 64 KiB) / 1 MiB + 1 offsets, each asked for once.
    assert_eq!(cold.ops, 8);
    assert_eq!(cold.bytes, 8 * (64 << 10));
    assert!(cold.ran_out, "the run ends when the cold file runs out");
    assert!(report.ops > 0);
    assert_eq!(report.bytes, report.ops * (64 << 10));
    let text = format!("{report}");
    assert!(text.contains("cached latency"), "{text}");
    assert!(text.contains("ran out of cold offsets"), "{text}");
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(json["cold"]["ops"], 8);
    stop(served);
}
