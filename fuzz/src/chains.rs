//! Hand-made descriptor chains through the real vhost-user-fs device; see
//! the crate docs for the invariants.
//!
//! One device serves the whole process: `VirtioFsDevice` over a confined
//! `Export` of the real engine, on a socket the harness's driver connects
//! to, as QEMU would. Each input is a few chains: descriptors that point
//! into the request or reply buffer at any offset and length, below or past
//! guest memory, loop, dangle, or lead to an indirect table (built from the
//! same descriptions), with arbitrary request bytes. Some chains carry a
//! WRITE to a file of the export cut into readable descriptors anywhere
//! (inside the header, inside `fuse_write_in`, in small pieces of data),
//! its lengths honest or lying: a lie is refused with EINVAL, and an honest
//! write that succeeds reads back byte for byte. Device-writable
//! buffers only ever start in the request or reply buffer or outside guest
//! memory: the driver's own rings lie below both buffers, and a device
//! that wrote into them because the driver told it to would break the
//! driver, not the device.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use arbitrary::{Arbitrary, Unstructured};
use sluice_benches::virtiofs::wire::{self, OUT_HEADER_LEN};
use sluice_benches::virtiofs::{
    Device, DeviceOptions, FuseQueue, GUEST_BASE, HarnessError, RawDescriptor,
};
use sluice_engine::format::Compression;
use sluice_engine::meta::{Context, ROOT_INO, open_meta};
use sluice_engine::vfs::{Filesystem as _, Vfs, VfsConfig};
use sluice_engine::volume::{format_volume, open_volume};
use sluice_fuse::abi::opcode;
use sluice_fuse::{Config, Dispatcher, Export};
use sluice_vhost::{DeviceConfig, FuseHandler, VirtioFsDevice};
use vm_memory::{Bytes, GuestAddress};

use crate::msg::message;

/// Guest memory the driver shares with the device.
const MEMORY: usize = 8 << 20;
/// Payload room of the request and reply buffers.
const MAX_IO: u32 = 64 << 10;
/// Where, in the request buffer, an indirect table goes.
const TABLE_AT: u64 = 48 << 10;

#[derive(Debug, Arbitrary)]
enum Addr {
    Request(u16),
    Reply(u16),
    /// Just below guest memory.
    Below(u16),
    /// Past the end of guest memory.
    Past(u32),
    /// Anywhere, read-only descriptors only.
    Raw(u64),
}

#[derive(Debug, Arbitrary)]
enum Len {
    /// The request's own length.
    Request,
    Small(u16),
    Raw(u32),
}

#[derive(Debug, Arbitrary)]
struct Desc {
    addr: Addr,
    len: Len,
    writable: bool,
    /// Points at an indirect table built from the chain's `table`.
    indirect: bool,
    next: Option<u8>,
}

#[derive(Debug, Arbitrary)]
enum Request {
    /// Any bytes.
    Raw(Vec<u8>),
    /// A well-formed header with this opcode and node, then any body.
    Framed(u32, u64, Vec<u8>),
    /// A WRITE to the rig's open file, cut into readable descriptors (the
    /// chain's own descriptors are not used).
    Write(SplitWrite),
}

/// A WRITE whose header, arguments and data the driver cuts into pieces.
#[derive(Debug, Arbitrary)]
struct SplitWrite {
    offset: u16,
    data: Vec<u8>,
    /// The lengths of the readable descriptors the request is cut into,
    /// in order (zero-length ones too); what is left goes in one more.
    cuts: Vec<u8>,
    /// Added to the header's `len` and to `fuse_write_in.size` (none, or
    /// zeros: the truth).
    lie: Option<(i8, i8)>,
}

/// At most this much data in a split WRITE (its pieces and the gaps
/// between them stay below the indirect table's area).
const SPLIT_DATA: usize = 16 << 10;
/// At most this many readable descriptors in a split WRITE.
const SPLIT_PIECES: usize = 40;

/// Honest split WRITEs whose data was read back.
static SPLIT_WRITES_CHECKED: AtomicU64 = AtomicU64::new(0);

/// How many honest split WRITEs were read back and compared so far.
pub fn split_writes_checked() -> u64 {
    SPLIT_WRITES_CHECKED.load(Ordering::Relaxed)
}

#[derive(Debug, Arbitrary)]
struct Chain {
    request: Request,
    descs: Vec<Desc>,
    table: Vec<Desc>,
}

struct Rig {
    _dir: tempfile::TempDir,
    server: Option<JoinHandle<sluice_vhost::Result<()>>>,
    // The queue borrows nothing from the device, but the device must live
    // as long as the connection does.
    _device: Device,
    q: FuseQueue,
    unique: u64,
    /// A file of the export, open for writing: (node, handle).
    file: (u64, u64),
}

/// The device and its driver; a new pair after the guest ended its session.
fn rig() -> &'static Mutex<Option<Rig>> {
    static RIG: OnceLock<Mutex<Option<Rig>>> = OnceLock::new();
    RIG.get_or_init(|| Mutex::new(None))
}

fn new_rig() -> Rig {
    {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite3://{}/meta.db", dir.path().display());
        let meta = open_meta(&url).expect("open meta");
        format_volume(
            &*meta,
            "chains",
            &dir.path().join("bucket"),
            1024,
            Compression::None,
            1,
        )
        .expect("format");
        let volume = open_volume(meta).expect("open volume");
        let vfs = Vfs::new(
            volume,
            VfsConfig {
                cache_bytes: 8 << 20,
                cleanup_interval: None,
                prefetch_threads: 0,
                upload_threads: 1,
                ..VfsConfig::default()
            },
        )
        .expect("vfs");
        let ctx = Context::internal();
        let root = vfs.mkdir(&ctx, ROOT_INO, b"vm", 0o777, 0).unwrap().inode;
        vfs.mkdir(&ctx, ROOT_INO, b"other", 0o700, 0).unwrap();
        let socket = dir.path().join("fs.sock");
        let mut listener = sluice_vhost::listen(&socket, None).expect("listen");
        let mut config = DeviceConfig::new("fuzz", 1);
        config.queue_size = 256;
        config.max_request_size = (MAX_IO as usize) + 4096;
        let handler = Arc::new(FuseHandler::new(Dispatcher::new(
            Export::new(vfs, root, false),
            Config::default(),
        )));
        let device = VirtioFsDevice::new(config, handler).expect("device");
        let server = std::thread::spawn(move || device.serve(&mut listener));
        let mut driver = Device::connect(
            &socket,
            DeviceOptions {
                request_queues: 1,
                queue_size: 256,
                memory_size: MEMORY,
            },
        )
        .expect("connect");
        let mut q = FuseQueue::new(&mut driver, 1, MAX_IO).expect("queue");
        q.init().expect("INIT");
        let (entry, fh) = q
            .create(1, b"written", libc::O_RDWR as u32, 0o644)
            .expect("create the file split writes go to");
        Rig {
            _dir: dir,
            server: Some(server),
            _device: driver,
            q,
            unique: 1 << 40,
            file: (entry.nodeid, fh),
        }
    }
}

/// Where a `next` leads in a chain (or table) of `n` descriptors: back
/// into it (a loop), or past any table (dangling). Never to a stale slot
/// of the driver's table outside the chain, whose room nobody counted.
fn next_of(k: u8, n: usize) -> u16 {
    if k < 200 {
        (usize::from(k) % n.max(1)) as u16
    } else {
        300 + u16::from(k)
    }
}

/// The descriptor `d` stands for, and the writable room it offers, in a
/// chain of `n` descriptors.
fn raw(
    d: &Desc,
    q: &FuseQueue,
    request_len: u32,
    table_len: u32,
    n: usize,
) -> (RawDescriptor, u64) {
    let (req, req_cap) = q.request_buffer();
    let (rep, rep_cap) = q.reply_buffer();
    let end = GUEST_BASE + MEMORY as u64;
    let len = match d.len {
        Len::Request => request_len,
        Len::Small(n) => u32::from(n),
        Len::Raw(n) => n,
    };
    let (addr, len) = if d.indirect {
        // The table, or a broken length; never past the zeroed table area,
        // whose further entries (zeros) end the walk: stale bytes elsewhere
        // could be descriptors whose room nobody counted.
        let len = if matches!(d.len, Len::Request) {
            table_len
        } else {
            len % (req_cap - TABLE_AT as u32 + 1)
        };
        (req.0 + TABLE_AT, len)
    } else {
        let addr = match d.addr {
            Addr::Request(o) => req.0 + u64::from(o) % u64::from(req_cap),
            Addr::Reply(o) => rep.0 + u64::from(o) % u64::from(rep_cap),
            Addr::Below(o) => GUEST_BASE.saturating_sub(1 + u64::from(o)),
            Addr::Past(o) => end + u64::from(o),
            Addr::Raw(a) if !d.writable => a,
            Addr::Raw(a) => end.saturating_add(a),
        };
        (addr, len)
    };
    let desc = RawDescriptor {
        addr,
        len,
        writable: d.writable && !d.indirect,
        indirect: d.indirect,
        next: d.next.map(|k| next_of(k, n)),
    };
    let room = if desc.writable { u64::from(len) } else { 0 };
    (desc, room)
}

/// Sends `w` as a WRITE to the rig's file, cut into readable descriptors
/// placed apart in the request buffer; checks the answer.
fn split_write(rig: &mut Rig, unique: u64, w: &SplitWrite) {
    let (node, fh) = rig.file;
    let data = &w.data[..w.data.len().min(SPLIT_DATA)];
    let (len_lie, size_lie) = w.lie.unwrap_or_default();
    let size = (data.len() as u32).wrapping_add_signed(i32::from(size_lie));
    let offset = u64::from(w.offset);
    let args = wire::write_in_header(fh, offset, size);
    let mut request = message(opcode::WRITE, unique, node, 0, &[&args, data]);
    let len = (request.len() as u32).wrapping_add_signed(i32::from(len_lie));
    request[0..4].copy_from_slice(&len.to_le_bytes());
    let q = &mut rig.q;
    let (req, _) = q.request_buffer();
    let (rep, _) = q.reply_buffer();
    let mut descs = Vec::new();
    let mut at = req.0;
    let mut rest = &request[..];
    let cuts = w.cuts.iter().take(SPLIT_PIECES).map(|&c| usize::from(c));
    for cut in cuts.chain(std::iter::once(usize::MAX)) {
        let (piece, tail) = rest.split_at(cut.min(rest.len()));
        q.memory()
            .write_slice(piece, GuestAddress(at))
            .expect("write a piece");
        descs.push(RawDescriptor::buffer(
            GuestAddress(at),
            piece.len() as u32,
            false,
        ));
        // A gap, so that no two pieces touch.
        at += piece.len() as u64 + 16;
        rest = tail;
    }
    descs.push(RawDescriptor::buffer(rep, 256, true));
    let written = q
        .send_chain(&descs)
        .unwrap_or_else(|e| panic!("the device did not return a split WRITE {w:?}: {e}"));
    assert!(written <= 256, "{written} bytes written into 256");
    let reply = q.read_reply(written).expect("read the reply");
    assert!(written as usize >= OUT_HEADER_LEN, "a WRITE is answered");
    let error = i32::from_le_bytes(reply[4..8].try_into().expect("4 bytes"));
    if (len_lie, size_lie) != (0, 0) {
        assert_eq!(error, -libc::EINVAL, "a WRITE whose lengths lie: {w:?}");
        return;
    }
    if error != 0 {
        // The file's handle may be gone (a fuzzed RELEASE), the session
        // ended (DESTROY), the volume full.
        return;
    }
    let done = wire::parse_write_out(&reply[OUT_HEADER_LEN..]).expect("fuse_write_out");
    assert_eq!(
        done as usize,
        data.len(),
        "a whole WRITE was answered short"
    );
    if let Ok(back) = q.read(node, fh, offset, data.len() as u32) {
        assert!(back == data, "a split WRITE read back differently: {w:?}");
        SPLIT_WRITES_CHECKED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    let mut slot = rig().lock().unwrap_or_else(|e| e.into_inner());
    let rig = slot.get_or_insert_with(new_rig);
    let mut u = Unstructured::new(data);
    for _ in 0..4 {
        let Ok(chain) = u.arbitrary::<Chain>() else {
            break;
        };
        if chain.descs.is_empty() {
            continue;
        }
        rig.unique += 1;
        let unique = rig.unique;
        let request = match &chain.request {
            Request::Raw(b) => b.clone(),
            Request::Framed(op, node, body) => message(*op, unique, *node, 0, &[body]),
            Request::Write(w) => {
                split_write(rig, unique, w);
                continue;
            }
        };
        let request = &request[..request.len().min(TABLE_AT as usize)];
        let q = &mut rig.q;
        let (req, _) = q.request_buffer();
        q.memory()
            .write_slice(request, req)
            .expect("write the request");
        // The indirect table: the descriptors `table` describes, in the
        // virtio layout (addr, len, flags, next), sixteen at most.
        let mut table = Vec::new();
        let mut table_room = 0u64;
        let entries = chain.table.len().min(16);
        for (i, d) in chain.table.iter().take(16).enumerate() {
            let (r, room) = raw(d, q, request.len() as u32, 0, entries);
            table_room += room;
            let mut flags = 0u16;
            if r.writable {
                flags |= 2;
            }
            // An indirect descriptor inside a table is invalid (virtio
            // 2.7.5.3.1); the device must refuse the chain.
            if r.indirect {
                flags |= 4;
            }
            let next = match r.next {
                Some(n) => {
                    flags |= 1;
                    n
                }
                None if i + 1 < entries => {
                    flags |= 1;
                    (i + 1) as u16
                }
                None => 0,
            };
            table.extend_from_slice(&r.addr.to_le_bytes());
            table.extend_from_slice(&r.len.to_le_bytes());
            table.extend_from_slice(&flags.to_le_bytes());
            table.extend_from_slice(&next.to_le_bytes());
        }
        let (_, req_cap) = q.request_buffer();
        table.resize((req_cap as usize) - TABLE_AT as usize, 0);
        q.memory()
            .write_slice(&table, GuestAddress(req.0 + TABLE_AT))
            .expect("write the table");
        let table_len = (entries * 16) as u32;
        let mut descs = Vec::new();
        let mut room = 0u64;
        let n = chain.descs.len().min(16);
        for d in chain.descs.iter().take(16) {
            let (r, w) = raw(d, q, request.len() as u32, table_len, n);
            room += w;
            if r.indirect {
                room += table_room;
            }
            descs.push(r);
        }
        let written = q
            .send_chain(&descs)
            .unwrap_or_else(|e| panic!("the device did not return chain {descs:?}: {e}"));
        assert!(
            u64::from(written) <= room,
            "the device wrote {written} bytes into a chain offering {room}: {descs:?}"
        );
    }
    // Still answering a well-formed request; or, when a chain carried
    // DESTROY (any readable bytes may), the session is over and says so
    // (ENODEV): then the driver disconnects, as a guest resets its device,
    // the daemon must end the connection cleanly, and the next input gets a
    // new device.
    match rig.q.getattr(1) {
        Ok(_) => {}
        Err(HarnessError::Errno { errno, .. }) if errno == libc::ENODEV => {
            let mut rig = slot.take().expect("the rig");
            let server = rig.server.take().expect("the server thread");
            drop(rig);
            server
                .join()
                .expect("the device thread did not panic")
                .expect("the device ended the connection cleanly");
        }
        Err(e) => panic!("GETATTR of the root after the chains: {e}"),
    }
}
