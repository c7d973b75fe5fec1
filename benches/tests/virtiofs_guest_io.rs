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
/// alignment), served with `mode`; with `--guest-io uring` the worker
/// answers everything itself and waits for its ring.
fn start(mode: GuestIoMode) -> Running {
    start_with(mode, mode != GuestIoMode::Uring)
}

/// [`start`], with the waiters on (`waiting`) or off (`--max-waiting 0`):
/// with them, a worker that must not wait queues what the page cache
/// misses on its ring and parks the chain.
fn start_with(mode: GuestIoMode, waiting: bool) -> Running {
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
    if !waiting {
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
    memory_table_changes(false);
}

#[test]
fn parked_reads_land_correctly_after_the_memory_table_changes() {
    memory_table_changes(true);
}

/// Reads into hot-plugged and removed memory; with `parked`, on a worker
/// that must not wait (the object evicted before each read, so the ring
/// reads it and the chain is parked on it).
fn memory_table_changes(parked: bool) {
    use vhost::VhostBackend;
    use vhost::VhostUserMemoryRegionInfo;
    use vhost::vhost_user::VhostUserFrontend;

    let running = start_with(GuestIoMode::Uring, parked);
    let evict_if_parked = |running: &Running| {
        if parked {
            evict(running);
        }
    };
    let (mut device, mut queue) = connect(&running);
    let pieces = pieces(&mut device);
    let size: usize = pieces.iter().map(|p| p.1 as usize).sum();
    evict_if_parked(&running);
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
    evict_if_parked(&running);
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
    evict_if_parked(&running);
    assert_eq!(read_object(&mut queue, 999, &pieces), 0);
    assert!(same(
        &gather(&queue, &pieces),
        &running.data[999..999 + size]
    ));
    assert_eq!(region.len(), 1 << 20);

    let (fixed, direct, pread) = running.stats[1].guest_io_snapshot();
    let handed_on = running.stats[1]
        .handed_on
        .load(std::sync::atomic::Ordering::Relaxed);
    finish(running, device);
    if uring_available() {
        assert_eq!(pread, 0, "every read went through io_uring");
        assert_eq!(fixed + direct, (2 * size + want_len) as u64);
        assert_eq!(handed_on, 0, "no read went to a waiter");
    }
}

/// On a worker that must not wait, what the page cache misses is read on
/// the worker's own ring, O_DIRECT where aligned, while the chain is
/// parked; no waiter is involved. A read past the end of the object comes
/// back short on the ring and is answered again by a waiter: an error.
#[test]
fn what_the_page_cache_misses_is_read_on_the_workers_ring_while_the_chain_is_parked() {
    let running = start_with(GuestIoMode::Uring, true);
    let (mut device, mut queue) = connect(&running);
    let pieces = pieces(&mut device);
    let size: usize = pieces.iter().map(|p| p.1 as usize).sum();
    for offset in [0u64, 4096, 12_345, (running.data.len() - size) as u64] {
        scribble(&queue, &pieces);
        evict(&running);
        assert_eq!(read_object(&mut queue, offset, &pieces), 0, "at {offset}");
        let want = &running.data[offset as usize..offset as usize + size];
        assert!(same(&gather(&queue, &pieces), want), "bytes at {offset}");
    }
    // The last range again, not evicted: the ring's reads through the
    // page cache filled it (no piece is aligned with the file here), so
    // the worker reads it in place.
    let last = running.data.len() - size;
    scribble(&queue, &pieces);
    assert_eq!(read_object(&mut queue, last as u64, &pieces), 0);
    assert!(same(&gather(&queue, &pieces), &running.data[last..]));
    // One page, O_DIRECT on the ring.
    let small = [pieces[1]];
    evict(&running);
    assert_eq!(read_object(&mut queue, 8192, &small), 0);
    assert!(same(
        &gather(&queue, &small),
        &running.data[8192..8192 + 4096]
    ));
    let past = (running.data.len() - size + 4096) as u64;
    evict(&running);
    assert_eq!(read_object(&mut queue, past, &pieces), -libc::EIO);
    let handed_on = running.stats[1]
        .handed_on
        .load(std::sync::atomic::Ordering::Relaxed);
    let (fixed, direct, pread) = running.stats[1].guest_io_snapshot();
    finish(running, device);
    if uring_available() {
        assert_eq!(handed_on, 1, "only the read past the end went to a waiter");
        assert!(direct >= 4096, "the page-aligned read went O_DIRECT");
        assert!(
            fixed + direct >= 4 * size as u64,
            "the evicted reads went through the ring ({fixed} + {direct})"
        );
        // (The odd first piece leaves no guest buffer aligned with the
        // file here; the many-reads test below covers O_DIRECT.)
        assert!(pread > 0, "the page cache was read in place");
    } else {
        // No ring: the misses went to waiters (O_DIRECT where aligned).
        assert_eq!(fixed, 0);
    }
}

/// Many READs at once on one queue, each into guest buffers of its own
/// (page-aligned, odd, split across descriptors), the object evicted: the
/// worker parks them all on its ring, and every one lands where it should.
#[test]
fn many_reads_parked_on_the_ring_at_once_land_in_their_own_buffers() {
    const READS: usize = 24;
    let running = start_with(GuestIoMode::Uring, true);
    let (mut device, fuse_queue) = connect(&running);
    struct Posted {
        head: u16,
        offset: u64,
        reply: GuestAddress,
        pieces: Vec<(GuestAddress, u32)>,
    }
    let mut posted = Vec::new();
    let mut chains = Vec::new();
    for i in 0..READS {
        let memory = device.memory();
        let skew = [0u64, 0, 1, 512, 7][i % 5];
        let lens: &[u32] = match i % 4 {
            0 => &[4096; 8],
            1 => &[65536, 4096, 300],
            2 => &[13, 5000, 128 << 10],
            _ => &[1 << 20],
        };
        let pieces: Vec<(GuestAddress, u32)> = lens
            .iter()
            .map(|&len| {
                let at = memory.alloc(u64::from(len) + skew, 4096).expect("alloc");
                (GuestAddress(at.0 + skew), len)
            })
            .collect();
        let size: u32 = pieces.iter().map(|p| p.1).sum();
        let offset = (i as u64 * 77_777) % (running.data.len() as u64 - u64::from(size));
        let offset = if i % 3 == 0 { offset & !4095 } else { offset };
        let args: Vec<u8> = offset
            .to_le_bytes()
            .into_iter()
            .chain(size.to_le_bytes())
            .collect();
        let request = wire::request(READ_OBJECT, 100 + i as u64, 1, &args);
        let request_addr = memory.alloc(request.len() as u64, 64).expect("alloc");
        memory
            .memory()
            .write_slice(&request, request_addr)
            .expect("request");
        let reply = memory.alloc(OUT_HEADER_LEN as u64, 64).expect("alloc");
        for &(addr, len) in &pieces {
            memory
                .memory()
                .write_slice(&vec![0xEE; len as usize], addr)
                .expect("scribble");
        }
        let mut chain = vec![
            RawDescriptor::buffer(request_addr, request.len() as u32, false),
            RawDescriptor::buffer(reply, OUT_HEADER_LEN as u32, true),
        ];
        chain.extend(
            pieces
                .iter()
                .map(|&(addr, len)| RawDescriptor::buffer(addr, len, true)),
        );
        chains.push(chain);
        posted.push(Posted {
            head: 0,
            offset,
            reply,
            pieces,
        });
    }
    evict(&running);
    let mut queue = fuse_queue.into_queue();
    for (p, chain) in posted.iter_mut().zip(&chains) {
        p.head = queue.add_raw(chain).expect("add");
    }
    queue.publish().expect("publish");
    let mut used = std::collections::HashMap::new();
    for _ in 0..READS {
        let (head, len) = queue
            .wait_used(std::time::Duration::from_secs(30))
            .expect("a reply");
        used.insert(head, len);
    }
    let memory = device.memory().memory().clone();
    for (i, p) in posted.iter().enumerate() {
        let size: u32 = p.pieces.iter().map(|p| p.1).sum();
        assert_eq!(
            used.get(&p.head),
            Some(&(OUT_HEADER_LEN as u32 + size)),
            "read {i}"
        );
        let mut header = [0u8; OUT_HEADER_LEN];
        memory.read_slice(&mut header, p.reply).expect("header");
        assert_eq!(i32::from_le_bytes(header[4..8].try_into().unwrap()), 0);
        let mut got = Vec::new();
        for &(addr, len) in &p.pieces {
            let mut part = vec![0u8; len as usize];
            memory.read_slice(&mut part, addr).expect("gather");
            got.extend_from_slice(&part);
        }
        let want = &running.data[p.offset as usize..p.offset as usize + size as usize];
        assert!(same(&got, want), "bytes of read {i} at {}", p.offset);
    }
    let handed_on = running.stats[1]
        .handed_on
        .load(std::sync::atomic::Ordering::Relaxed);
    let (fixed, direct, _) = running.stats[1].guest_io_snapshot();
    finish(running, device);
    if uring_available() {
        assert_eq!(handed_on, 0, "no read went to a waiter");
        assert!(fixed + direct > 0 && direct > 0);
    }
}
