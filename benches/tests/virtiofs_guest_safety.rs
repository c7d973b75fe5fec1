//! Guest-safety tests of the sluice virtio-fs device, driven through the
//! host-side virtio-fs driver harness: every kind of bad descriptor chain gets
//! an error reply (or, without room for one, an empty completion), never
//! reaches the request handler, and never stops the device.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use sluice_benches::virtiofs::wire::{self, IN_HEADER_LEN, OUT_HEADER_LEN, Reply};
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue, GUEST_BASE, RawDescriptor};
use sluice_vhost::{DeviceConfig, RequestHandler, VirtioFsDevice, WriteSource, Writer, frame};
use vm_memory::{Bytes, GuestAddress};

/// Records every request that reaches it and answers ENOSYS, so a test can
/// tell whether the device let a request through.
#[derive(Debug, Default)]
struct RecordingHandler {
    calls: AtomicUsize,
}

impl RequestHandler for RecordingHandler {
    fn handle(
        &self,
        _queue: u16,
        request: &[u8],
        _data: &mut dyn WriteSource,
        reply: &mut Writer<'_>,
    ) -> std::io::Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let header = frame::InHeader::parse(request).expect("device checked the header");
        if reply.available_bytes() == 0 {
            return Ok(());
        }
        reply.write_all(&frame::error_reply(libc::ENOSYS, header.unique))
    }
}

struct Running {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    handler: Arc<RecordingHandler>,
    server: JoinHandle<sluice_vhost::Result<()>>,
}

fn start(max_request_size: usize) -> Running {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("fs.sock");
    let mut listener = sluice_vhost::listen(&socket, None).expect("listen");
    let mut config = DeviceConfig::new("safety", 2);
    config.max_request_size = max_request_size;
    config.queue_size = 256;
    let handler = Arc::new(RecordingHandler::default());
    let device = VirtioFsDevice::new(config, handler.clone()).expect("device");
    let server = std::thread::spawn(move || device.serve(&mut listener));
    Running {
        _dir: dir,
        socket,
        handler,
        server,
    }
}

fn connect(running: &Running, memory_size: usize) -> (Device, FuseQueue) {
    let mut device = Device::connect(
        &running.socket,
        DeviceOptions {
            request_queues: 2,
            queue_size: 256,
            memory_size,
        },
    )
    .expect("connect");
    let queue = FuseQueue::new(&mut device, 1, 128 << 10).expect("queue");
    (device, queue)
}

/// The error a reply of `written` bytes carries, checking its framing.
fn reply_errno(queue: &FuseQueue, written: u32) -> (i32, u64) {
    assert_eq!(
        written as usize, OUT_HEADER_LEN,
        "an error reply is a bare header"
    );
    let bytes = queue.read_reply(written).expect("read reply");
    let reply = Reply::parse(0, &bytes).expect("well-framed reply");
    (reply.error.wrapping_neg(), reply.unique)
}

/// Writes a valid request with opcode 9999 (unknown) into the request buffer.
fn put_request(queue: &mut FuseQueue, unique: u64, args: &[u8]) -> (GuestAddress, u32) {
    let request = wire::request(9999, unique, 1, args);
    let (addr, _) = queue.request_buffer();
    queue
        .memory()
        .write_slice(&request, addr)
        .expect("write request");
    (addr, request.len() as u32)
}

fn reply_room(queue: &FuseQueue) -> RawDescriptor {
    let (addr, _) = queue.reply_buffer();
    RawDescriptor::buffer(addr, 4096, true)
}

fn finish(running: Running, device: Device) {
    drop(device);
    running
        .server
        .join()
        .expect("server thread did not panic")
        .expect("server ended cleanly on disconnect");
}

#[test]
fn device_offers_tag_and_event_idx() {
    let running = start(1 << 20);
    let (device, _) = connect(&running, 8 << 20);
    assert_eq!(device.tag(), Some("safety"));
    assert!(device.event_idx());
    finish(running, device);
}

#[test]
fn well_formed_request_reaches_the_handler() {
    let running = start(1 << 20);
    let (device, mut queue) = connect(&running, 8 << 20);
    let reply = queue.call(9999, 1, b"args").expect("reply");
    assert_eq!(reply.error, -libc::ENOSYS);
    assert_eq!(running.handler.calls.load(Ordering::SeqCst), 1);
    finish(running, device);
}

#[test]
fn bad_chains_get_error_replies_and_never_reach_the_handler() {
    let running = start(64 << 10);
    let (device, mut queue) = connect(&running, 8 << 20);
    let (reply_addr, _) = queue.reply_buffer();

    // A readable descriptor outside guest memory.
    let below = RawDescriptor::buffer(GuestAddress(0x1000), 64, false);
    let written = queue.send_chain(&[below, reply_room(&queue)]).unwrap();
    assert_eq!(reply_errno(&queue, written).0, libc::EFAULT);

    // A descriptor whose end wraps around the address space.
    let wraps = RawDescriptor::buffer(GuestAddress(u64::MAX - 15), 64, false);
    let written = queue.send_chain(&[wraps, reply_room(&queue)]).unwrap();
    assert_eq!(reply_errno(&queue, written).0, libc::EFAULT);

    // A chain too short for the FUSE header.
    let (addr, _) = put_request(&mut queue, 11, &[]);
    let short = RawDescriptor::buffer(addr, (IN_HEADER_LEN - 1) as u32, false);
    let written = queue.send_chain(&[short, reply_room(&queue)]).unwrap();
    assert_eq!(reply_errno(&queue, written), (libc::EINVAL, 0));

    // A header whose length disagrees with the chain.
    let (addr, len) = put_request(&mut queue, 12, b"12345678");
    let truncated = RawDescriptor::buffer(addr, len - 4, false);
    let written = queue.send_chain(&[truncated, reply_room(&queue)]).unwrap();
    assert_eq!(reply_errno(&queue, written), (libc::EINVAL, 12));

    // An oversized request (the device was started with a 64 KiB limit).
    let big = vec![7u8; 70 << 10];
    let (addr, len) = put_request(&mut queue, 13, &big);
    let oversized = RawDescriptor::buffer(addr, len, false);
    let written = queue.send_chain(&[oversized, reply_room(&queue)]).unwrap();
    assert_eq!(reply_errno(&queue, written), (libc::E2BIG, 13));

    // A readable descriptor after a writable one.
    let (addr, len) = put_request(&mut queue, 14, &[]);
    let first_half = RawDescriptor::buffer(addr, 16, false);
    let rest = RawDescriptor::buffer(GuestAddress(addr.0 + 16), len - 16, false);
    let written = queue
        .send_chain(&[first_half, reply_room(&queue), rest])
        .unwrap();
    assert_eq!(reply_errno(&queue, written).0, libc::EINVAL);

    // A chain whose `next` loops back to its head.
    let (addr, len) = put_request(&mut queue, 15, &[]);
    let mut looping = reply_room(&queue);
    looping.next = Some(0);
    let written = queue
        .send_chain(&[RawDescriptor::buffer(addr, len, false), looping])
        .unwrap();
    assert_eq!(reply_errno(&queue, written).0, libc::EINVAL);

    // A loop through a writable buffer too small for a reply: walked again
    // and again it would seem to offer room, but each buffer counts once,
    // so nothing is written (found by fuzz/ `chains`).
    let (addr, len) = put_request(&mut queue, 15, &[]);
    let (reply_addr4, _) = queue.reply_buffer();
    let mut small_loop = RawDescriptor::buffer(reply_addr4, 4, true);
    small_loop.next = Some(0);
    let written = queue
        .send_chain(&[RawDescriptor::buffer(addr, len, false), small_loop])
        .unwrap();
    assert_eq!(written, 0, "no more written than the 4-byte buffer holds");

    // A `next` that points past the descriptor table.
    let (addr, len) = put_request(&mut queue, 16, &[]);
    let mut dangling = reply_room(&queue);
    dangling.next = Some(5000);
    let written = queue
        .send_chain(&[RawDescriptor::buffer(addr, len, false), dangling])
        .unwrap();
    assert_eq!(reply_errno(&queue, written).0, libc::EINVAL);

    // An indirect table whose length is not a whole number of descriptors.
    let (addr, _) = put_request(&mut queue, 17, &[]);
    let broken_indirect = RawDescriptor {
        addr: addr.0,
        len: 20,
        writable: false,
        indirect: true,
        next: None,
    };
    let written = queue.send_chain(&[broken_indirect]).unwrap();
    assert_eq!(written, 0, "no writable room: the chain comes back empty");

    // A valid request whose reply buffer lies outside guest memory: the
    // device must not write there, and returns the chain empty.
    let (addr, len) = put_request(&mut queue, 18, &[]);
    let outside_reply = RawDescriptor::buffer(GuestAddress(GUEST_BASE - 4096), 4096, true);
    let written = queue
        .send_chain(&[RawDescriptor::buffer(addr, len, false), outside_reply])
        .unwrap();
    assert_eq!(written, 0);

    // A malformed request with no room for any reply.
    let short = RawDescriptor::buffer(reply_addr, 8, false);
    assert_eq!(queue.send_chain(&[short]).unwrap(), 0);

    assert_eq!(
        running.handler.calls.load(Ordering::SeqCst),
        0,
        "no malformed request may reach the handler"
    );

    // The device is still serving.
    let reply = queue.call(9999, 1, &[]).expect("reply after bad chains");
    assert_eq!(reply.error, -libc::ENOSYS);
    assert_eq!(running.handler.calls.load(Ordering::SeqCst), 1);
    finish(running, device);
}

#[test]
fn chain_longer_than_4_gib_is_rejected() {
    let running = start(1 << 20);
    // Sparse: only the rings and buffers the harness writes are touched.
    let (device, mut queue) = connect(&running, (2 << 30) + (4 << 20));
    let half = RawDescriptor::buffer(GuestAddress(GUEST_BASE), 0x8000_0000, false);
    // The chain stops being walked where its length passes 4 GiB, so the
    // device never sees the reply buffer behind it: the chain comes back empty.
    let written = queue.send_chain(&[half, half, reply_room(&queue)]).unwrap();
    assert_eq!(written, 0);
    assert_eq!(running.handler.calls.load(Ordering::SeqCst), 0);
    let reply = queue
        .call(9999, 1, &[])
        .expect("reply after the huge chain");
    assert_eq!(reply.error, -libc::ENOSYS);
    finish(running, device);
}

#[test]
fn memory_added_and_removed_while_serving() {
    use vhost::VhostBackend;
    use vhost::VhostUserMemoryRegionInfo;
    use vhost::vhost_user::VhostUserFrontend;
    use vm_memory::{GuestMemoryRegion, MemoryRegionAddress};

    let running = start(1 << 20);
    let (mut device, mut queue) = connect(&running, 8 << 20);
    let hotplug_base = GuestAddress(GUEST_BASE + (1 << 30));
    let region = sluice_benches::virtiofs::memfd_region(hotplug_base, 1 << 20).expect("region");
    let info = VhostUserMemoryRegionInfo::from_guest_region(&region).expect("region info");
    device
        .frontend()
        .add_mem_region(&info)
        .expect("ADD_MEM_REG");
    // The harness does not ask for REPLY_ACK, so the message above may still
    // be in the backend's queue: a request with a reply is handled after it.
    device.frontend().get_features().expect("GET_FEATURES");

    // A request that lives in the hot-plugged memory is served.
    let request = wire::request(9999, 21, 1, b"in new memory");
    region
        .write_slice(&request, MemoryRegionAddress(0))
        .expect("write into region");
    assert_eq!(region.start_addr(), hotplug_base);
    let in_new = RawDescriptor::buffer(hotplug_base, request.len() as u32, false);
    let written = queue.send_chain(&[in_new, reply_room(&queue)]).unwrap();
    assert_eq!(reply_errno(&queue, written), (libc::ENOSYS, 21));
    assert_eq!(running.handler.calls.load(Ordering::SeqCst), 1);

    // Once the region is removed, the same chain points outside guest memory.
    device
        .frontend()
        .remove_mem_region(&info)
        .expect("REM_MEM_REG");
    device.frontend().get_features().expect("GET_FEATURES");
    let written = queue.send_chain(&[in_new, reply_room(&queue)]).unwrap();
    assert_eq!(reply_errno(&queue, written).0, libc::EFAULT);
    assert_eq!(running.handler.calls.load(Ordering::SeqCst), 1);
    finish(running, device);
}

#[test]
fn indirect_descriptor_tables_are_followed() {
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::split::Descriptor;

    let running = start(1 << 20);
    let (mut device, mut queue) = connect(&running, 8 << 20);
    let (request_addr, request_len) = put_request(&mut queue, 31, b"via an indirect table");
    let (reply_addr, _) = queue.reply_buffer();
    let table = device.alloc(32).expect("table");
    let entries = [
        Descriptor::new(request_addr.0, request_len, VRING_DESC_F_NEXT as u16, 1),
        Descriptor::new(reply_addr.0, 4096, VRING_DESC_F_WRITE as u16, 0),
    ];
    for (i, entry) in entries.into_iter().enumerate() {
        queue
            .memory()
            .write_obj(entry, GuestAddress(table.0 + 16 * i as u64))
            .expect("write table");
    }
    let head = RawDescriptor {
        addr: table.0,
        len: 32,
        writable: false,
        indirect: true,
        next: None,
    };
    let written = queue.send_chain(&[head]).unwrap();
    assert_eq!(reply_errno(&queue, written), (libc::ENOSYS, 31));
    assert_eq!(running.handler.calls.load(Ordering::SeqCst), 1);
    finish(running, device);
}
