//! READ data from local files into guest memory, through the device's
//! worker threads, driven by the host-side virtio-fs driver harness: the
//! io_uring path (guest memory registered as fixed buffers, O_DIRECT where
//! aligned), the pread path and the direct path (what the page cache
//! misses read O_DIRECT by a waiter) place exactly the file's bytes into
//! the guest's buffers, also after the memory table changed under the
//! workers.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use sluice_benches::virtiofs::wire::{self, OUT_HEADER_LEN};
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue, GUEST_BASE, RawDescriptor};
use sluice_vhost::{
    DeviceConfig, GuestIoMode, QueueStats, RequestHandler, VirtioFsDevice, WriteSource, Writer,
    frame,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryRegion, MemoryRegionAddress};

/// The one opcode the test handler knows: args are (offset u64, size u32)
/// of the object file; the reply is the header then those bytes.
const READ_OBJECT: u32 = 9000;

/// Answers READ_OBJECT from one local file with `Writer::write_from_file`,
/// the way the FUSE layer answers a READ of a `file://` object.
struct ObjectHandler {
    file: File,
}

impl RequestHandler for ObjectHandler {
    fn handle(
        &self,
        _queue: u16,
        request: &[u8],
        _data: &mut dyn WriteSource,
        reply: &mut Writer<'_>,
    ) -> std::io::Result<()> {
        let header = frame::InHeader::parse(request).expect("device checked the header");
        let args = &request[frame::IN_HEADER_LEN..];
        let offset = u64::from_le_bytes(args[..8].try_into().expect("offset"));
        let size = u32::from_le_bytes(args[8..12].try_into().expect("size"));
        let len = OUT_HEADER_LEN as u32 + size;
        let start = reply.mark();
        reply.write_zeros(OUT_HEADER_LEN)?;
        match reply.write_from_file(&self.file, offset, size as usize) {
            Ok(()) => reply.write_at(start, &frame::out_header(len, 0, header.unique)),
            // Not in the page cache, on a worker that must not wait: the
            // device runs the request again on a waiter.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(e),
            Err(e) => {
                reply.rewind(start);
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                let errno = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    libc::EIO
                } else {
                    errno
                };
                std::io::Write::write_all(reply, &frame::error_reply(errno, header.unique))
            }
        }
    }
}

struct Running {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    data: Vec<u8>,
    stats: Arc<[QueueStats]>,
    server: JoinHandle<sluice_vhost::Result<()>>,
}

/// An object of a little over 2 MiB (not a multiple of any O_DIRECT
/// alignment), served with `mode`.
fn start(mode: GuestIoMode) -> Running {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("object");
    let data: Vec<u8> = (0..(2 << 20) + 777)
        .map(|i: usize| (i % 253) as u8 ^ (i >> 10) as u8)
        .collect();
    std::fs::write(&path, &data).expect("write object");
    let handler = ObjectHandler {
        file: File::open(&path).expect("open object"),
    };
    let socket = dir.path().join("fs.sock");
    let mut listener = sluice_vhost::listen(&socket, None).expect("listen");
    let mut config = DeviceConfig::new("guest-io", 1);
    config.queue_size = 256;
    config.guest_io = mode;
    // The worker's io_uring ring waits for the disk: it reads only for a
    // worker that answers everything itself.
    if mode == GuestIoMode::Uring {
        config.max_waiting = 0;
    }
    let device = VirtioFsDevice::new(config, Arc::new(handler)).expect("device");
    let stats = device.stats();
    let server = std::thread::spawn(move || device.serve(&mut listener));
    Running {
        _dir: dir,
        socket,
        data,
        stats,
        server,
    }
}

fn connect(running: &Running) -> (Device, FuseQueue) {
    let mut device = Device::connect(
        &running.socket,
        DeviceOptions {
            request_queues: 1,
            queue_size: 256,
            memory_size: 32 << 20,
        },
    )
    .expect("connect");
    let queue = FuseQueue::new(&mut device, 1, 64 << 10).expect("queue");
    (device, queue)
}

fn finish(running: Running, device: Device) {
    drop(device);
    running
        .server
        .join()
        .expect("server thread did not panic")
        .expect("server ended cleanly on disconnect");
}

/// Sends READ_OBJECT(offset, size) with the reply header in the queue's
/// reply buffer and the data in `pieces` (guest address, length); returns
/// the reply's error (0 on success).
fn read_object(queue: &mut FuseQueue, offset: u64, pieces: &[(GuestAddress, u32)]) -> i32 {
    let size: u32 = pieces.iter().map(|p| p.1).sum();
    let args: Vec<u8> = offset
        .to_le_bytes()
        .into_iter()
        .chain(size.to_le_bytes())
        .collect();
    let request = wire::request(READ_OBJECT, 7, 1, &args);
    let (request_addr, _) = queue.request_buffer();
    queue
        .memory()
        .write_slice(&request, request_addr)
        .expect("write request");
    let (reply_addr, _) = queue.reply_buffer();
    let mut chain = vec![
        RawDescriptor::buffer(request_addr, request.len() as u32, false),
        RawDescriptor::buffer(reply_addr, OUT_HEADER_LEN as u32, true),
    ];
    chain.extend(
        pieces
            .iter()
            .map(|&(addr, len)| RawDescriptor::buffer(addr, len, true)),
    );
    let written = queue.send_chain(&chain).expect("reply");
    // fuse_out_header: len u32, error i32, unique u64.
    let header = queue.read_reply(OUT_HEADER_LEN as u32).expect("header");
    let len = u32::from_le_bytes(header[..4].try_into().expect("len"));
    let error = i32::from_le_bytes(header[4..8].try_into().expect("error"));
    assert_eq!(len, written, "the header's length is what the device wrote");
    if error == 0 {
        assert_eq!(written, OUT_HEADER_LEN as u32 + size);
    }
    error
}

/// Guest buffers that cross pieces: odd lengths and addresses, page-aligned
/// ones (O_DIRECT candidates), one large one.
fn pieces(device: &mut Device) -> Vec<(GuestAddress, u32)> {
    let memory = device.memory();
    let mut at = |len: u32, align: u64, skew: u64| {
        let addr = memory.alloc(u64::from(len) + skew, align).expect("alloc");
        (GuestAddress(addr.0 + skew), len)
    };
    vec![
        at(13, 64, 3),
        at(4096, 4096, 0),
        at(5000, 64, 1),
        at(64 << 10, 4096, 0),
        at(300_000, 4096, 0),
    ]
}

/// The bytes in `pieces`, gathered back from guest memory.
fn gather(queue: &FuseQueue, pieces: &[(GuestAddress, u32)]) -> Vec<u8> {
    let mut got = Vec::new();
    for &(addr, len) in pieces {
        let mut part = vec![0u8; len as usize];
        queue.memory().read_slice(&mut part, addr).expect("gather");
        got.extend_from_slice(&part);
    }
    got
}

fn scribble(queue: &FuseQueue, pieces: &[(GuestAddress, u32)]) {
    for &(addr, len) in pieces {
        queue
            .memory()
            .write_slice(&vec![0xEE; len as usize], addr)
            .expect("scribble");
    }
}

fn same(got: &[u8], want: &[u8]) -> bool {
    got.len() == want.len() && got == want
}

/// Reads at several offsets (aligned, odd, up to the last byte) and one past
/// the end; returns the file READ bytes the device counted.
fn reads_match_the_file(mode: GuestIoMode) -> (u64, u64, u64) {
    let running = start(mode);
    let (mut device, mut queue) = connect(&running);
    let pieces = pieces(&mut device);
    let size: usize = pieces.iter().map(|p| p.1 as usize).sum();
    let mut expected = 0u64;
    for offset in [0u64, 4096, 12_345, (running.data.len() - size) as u64] {
        scribble(&queue, &pieces);
        assert_eq!(
            read_object(&mut queue, offset, &pieces),
            0,
            "{mode} at {offset}"
        );
        let want = &running.data[offset as usize..offset as usize + size];
        assert!(
            same(&gather(&queue, &pieces), want),
            "{mode}: bytes at {offset}"
        );
        expected += size as u64;
    }
    // Past the end of the object: an error, never stale bytes passed as data.
    let past = (running.data.len() - size + 4096) as u64;
    assert_eq!(read_object(&mut queue, past, &pieces), -libc::EIO, "{mode}");
    let (fixed, direct, pread) = running.stats[1].guest_io_snapshot();
    finish(running, device);
    // The failed read placed some bytes before it hit the end.
    assert!(fixed + direct + pread >= expected, "{mode}: counted");
    (fixed, direct, pread)
}

/// Whether this machine lets a worker set up io_uring.
fn uring_available() -> bool {
    std::env::var("SLUICE_IO_BACKEND").as_deref() != Ok("threads")
        && sluice_numa::Reactor::<()>::new(&sluice_numa::ReactorConfig {
            backend: sluice_numa::reactor::BackendChoice::Uring,
            ..Default::default()
        })
        .is_ok()
}

#[test]
fn uring_reads_place_the_files_bytes_in_guest_memory() {
    let (fixed, direct, pread) = reads_match_the_file(GuestIoMode::Uring);
    if uring_available() {
        assert!(fixed + direct > 0, "io_uring served");
        // Only the read past the end finishes (and fails) with pread.
        assert!(pread < 4096, "pread carried {pread} bytes");
    } else {
        assert_eq!((fixed, direct), (0, 0));
    }
}

#[test]
fn pread_reads_place_the_files_bytes_in_guest_memory() {
    let (fixed, direct, pread) = reads_match_the_file(GuestIoMode::Pread);
    assert_eq!((fixed, direct), (0, 0), "pread mode never uses the ring");
    assert!(pread > 0);
}

/// Drops the object's pages from the page cache, so the worker's
/// page-cache-only read misses and a waiter reads it.
fn evict(running: &Running) {
    use std::os::fd::AsRawFd;
    let f = File::open(running._dir.path().join("object")).expect("object");
    // Written back first: dirty pages are not dropped.
    f.sync_all().expect("fsync the object");
    // SAFETY: a plain advice call on a descriptor we own.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
}

#[test]
fn direct_reads_of_what_the_page_cache_misses_land_in_guest_memory() {
    let running = start(GuestIoMode::Direct);
    let (mut device, mut queue) = connect(&running);
    // As a guest's page cache gives them: page-aligned buffers (and, at
    // the odd offset below, a read no piece of which can go O_DIRECT).
    let pieces = {
        let memory = device.memory();
        let mut at = |len: u32| (memory.alloc(u64::from(len), 4096).expect("alloc"), len);
        vec![at(4096), at(64 << 10), at(300_000)]
    };
    let size: usize = pieces.iter().map(|p| p.1 as usize).sum();
    for offset in [0u64, 4096, 12_345, 1 << 20] {
        scribble(&queue, &pieces);
        evict(&running);
        assert_eq!(read_object(&mut queue, offset, &pieces), 0, "at {offset}");
        let want = &running.data[offset as usize..offset as usize + size];
        assert!(same(&gather(&queue, &pieces), want), "bytes at {offset}");
    }
    let handed_on = running.stats[1]
        .handed_on
        .load(std::sync::atomic::Ordering::Relaxed);
    let (fixed, direct, pread) = running.stats[1].guest_io_snapshot();
    finish(running, device);
    assert_eq!(fixed, 0, "no ring");
    assert!(
        fixed + direct + pread >= 4 * size as u64,
        "every byte counted"
    );
    // Where the file system keeps the page cache out of the way (it may
    // not have dropped the pages), the misses went to a waiter, O_DIRECT
    // where the pieces are aligned.
    if handed_on == 4 {
        assert!(direct > 0, "{handed_on} reads waited; none went O_DIRECT");
    }
}

#[test]
fn reads_land_correctly_after_the_memory_table_changes() {
    use vhost::VhostBackend;
    use vhost::VhostUserMemoryRegionInfo;
    use vhost::vhost_user::VhostUserFrontend;

    let running = start(GuestIoMode::Uring);
    let (mut device, mut queue) = connect(&running);
    let pieces = pieces(&mut device);
    let size: usize = pieces.iter().map(|p| p.1 as usize).sum();
    assert_eq!(read_object(&mut queue, 100, &pieces), 0);
    assert!(same(
        &gather(&queue, &pieces),
        &running.data[100..100 + size]
    ));

    // Hot-plug a region and read into it (and into the old memory at once).
    let base = GuestAddress(GUEST_BASE + (1 << 30));
    let region = sluice_benches::virtiofs::memfd_region(base, 1 << 20).expect("region");
    let info = VhostUserMemoryRegionInfo::from_guest_region(&region).expect("region info");
    device
        .frontend()
        .add_mem_region(&info)
        .expect("ADD_MEM_REG");
    // Without REPLY_ACK the message may still be queued: a request with a
    // reply is handled after it.
    device.frontend().get_features().expect("GET_FEATURES");
    let mixed = [
        (base, 128 << 10),
        pieces[1],
        (GuestAddress(base.0 + 0x4_0000 + 5), 7000),
    ];
    assert_eq!(read_object(&mut queue, 8192, &mixed), 0);
    let mut got = vec![0u8; 128 << 10];
    region
        .read_slice(&mut got, MemoryRegionAddress(0))
        .expect("new region");
    let mut second = vec![0u8; 4096];
    queue
        .memory()
        .read_slice(&mut second, pieces[1].0)
        .expect("old memory");
    got.extend_from_slice(&second);
    let mut third = vec![0u8; 7000];
    region
        .read_slice(&mut third, MemoryRegionAddress(0x4_0000 + 5))
        .expect("new region");
    got.extend_from_slice(&third);
    let want_len = (128 << 10) + 4096 + 7000;
    assert!(
        same(&got, &running.data[8192..8192 + want_len]),
        "bytes in hot-plugged memory"
    );

    // Remove it again: reads into the remaining memory still land.
    device
        .frontend()
        .remove_mem_region(&info)
        .expect("REM_MEM_REG");
    device.frontend().get_features().expect("GET_FEATURES");
    scribble(&queue, &pieces);
    assert_eq!(read_object(&mut queue, 999, &pieces), 0);
    assert!(same(
        &gather(&queue, &pieces),
        &running.data[999..999 + size]
    ));
    assert_eq!(region.len(), 1 << 20);

    let (fixed, direct, pread) = running.stats[1].guest_io_snapshot();
    finish(running, device);
    if uring_available() {
        assert_eq!(pread, 0, "every read went through io_uring");
        assert_eq!(fixed + direct, (2 * size + want_len) as u64);
    }
}
