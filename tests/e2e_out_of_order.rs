//! End-to-end: a READ that waits for a cold block does not hold up the
//! cached READs behind it on the same queue (issue 21, out-of-order
//! completion). The real `sluice serve` serves a volume whose blocks live
//! in the loopback S3 server, every answer of which is held 50 ms; the
//! virtio-fs driver harness plays the guest and puts one cold READ and then
//! several READs of cached blocks on one queue at once.
//!
//! The test asserts on the order in which the device returns the chains,
//! never on time: the cached READs come back before the cold one. With
//! `--max-waiting 0` (every request answered on the worker, in ring order)
//! the cold READ comes back first — which shows the test can tell the two
//! apart.
//!
//! The host mount gets the same treatment: with one thread serving
//! `/dev/fuse`, a read of a cached file finishes while a cold read waits.
//!
//! A metadata round trip is parked too: on a Redis volume whose server is
//! stopped (SIGSTOP), a GETATTR waits while the requests behind it on the
//! queue come back; they are FLUSHes of a file with nothing buffered, which
//! need no metadata (a READ's chunk list is cached for only a second, so a
//! READ could itself reach the stopped server).

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Mount, RedisServer, Serve, Watchdog, sluice_ok};
use sluice_benches::virtiofs::wire::{self, IN_HEADER_LEN, OUT_HEADER_LEN, ROOT_ID, opcode};
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue, SplitQueue};
use sluice_engine::object::s3_test_server::TestS3Server;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const AK: &str = "ooo-access";
const SK: &str = "ooo-secret";
const HOT_LEN: usize = 1 << 20;
const COLD_LEN: usize = 8 << 20;
/// Cached READs put behind the cold one.
const HOT_READS: usize = 8;
const HOT_READ: u32 = 4096;
const COLD_READ: u32 = 128 << 10;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// One READ's buffers in guest memory.
struct Slot {
    request: GuestAddress,
    reply: GuestAddress,
    data: GuestAddress,
    size: u32,
    offset: u64,
    cold: bool,
}

/// Puts a READ of `slot` on the queue (not yet published); returns its head.
fn add_read(
    queue: &mut SplitQueue,
    mem: &GuestMemoryMmap,
    slot: &Slot,
    unique: u64,
    node: u64,
    fh: u64,
) -> u16 {
    let request = wire::request(
        opcode::READ,
        unique,
        node,
        &wire::read_in(fh, slot.offset, slot.size),
    );
    mem.write_slice(&request, slot.request).unwrap();
    queue
        .add(
            &[
                (slot.request, IN_HEADER_LEN as u32),
                (
                    GuestAddress(slot.request.0 + IN_HEADER_LEN as u64),
                    (request.len() - IN_HEADER_LEN) as u32,
                ),
            ],
            &[(slot.reply, OUT_HEADER_LEN as u32), (slot.data, slot.size)],
        )
        .unwrap()
}

/// The harness's device on `socket`: one request queue of 64.
fn connect(socket: &Path) -> Device {
    Device::connect(
        socket,
        DeviceOptions {
            request_queues: 1,
            queue_size: 64,
            memory_size: 16 << 20,
        },
    )
    .expect("connect")
}

/// Serves the volume with `extra`, warms the hot file, then puts one cold
/// READ and [`HOT_READS`] hot READs on one queue at once. Returns whether
/// each returned chain was the cold READ, in the order the device returned
/// them, after checking every reply's bytes.
fn completion_order(meta: &str, dir: &Path, name: &str, extra: &[&str]) -> Vec<bool> {
    let socket = dir.join(format!("{name}.sock"));
    let mut args = vec!["--no-pin", "--cache-size", "64", "--once"];
    args.extend_from_slice(extra);
    let _serve = Serve::start(meta, &socket, &args);
    let mut device = connect(&socket);
    let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    q.init().expect("INIT");
    let hot = q.lookup(ROOT_ID, b"hot").expect("LOOKUP hot").nodeid;
    let cold = q.lookup(ROOT_ID, b"cold").expect("LOOKUP cold").nodeid;
    let hot_fh = q.open(hot, libc::O_RDONLY as u32).expect("OPEN hot");
    let cold_fh = q.open(cold, libc::O_RDONLY as u32).expect("OPEN cold");
    // Warm: the hot file's block goes into the memory cache.
    let hot_bytes = pattern(1, HOT_LEN);
    let mut off = 0;
    while off < HOT_LEN {
        let got = q
            .read(hot, hot_fh, off as u64, 1 << 20)
            .expect("READ hot to warm it");
        assert_eq!(got, hot_bytes[off..off + got.len()], "warm read at {off}");
        off += got.len();
    }

    let mem = q.memory().clone();
    let mut queue = q.into_queue();
    let mut slots = Vec::new();
    // The cold READ first, in the middle of the file (not its start, which
    // a readahead may already be fetching): it is the oldest request.
    let cold_offset = 4 << 20;
    slots.push(Slot {
        request: device.alloc(128).unwrap(),
        reply: device.alloc(OUT_HEADER_LEN as u64).unwrap(),
        data: device.alloc(u64::from(COLD_READ)).unwrap(),
        size: COLD_READ,
        offset: cold_offset,
        cold: true,
    });
    for i in 0..HOT_READS {
        slots.push(Slot {
            request: device.alloc(128).unwrap(),
            reply: device.alloc(OUT_HEADER_LEN as u64).unwrap(),
            data: device.alloc(u64::from(HOT_READ)).unwrap(),
            size: HOT_READ,
            offset: (i * 100_003) as u64 % (HOT_LEN as u64 - u64::from(HOT_READ)),
            cold: false,
        });
    }
    let mut by_head = std::collections::HashMap::new();
    for (i, slot) in slots.iter().enumerate() {
        let (node, fh) = if slot.cold {
            (cold, cold_fh)
        } else {
            (hot, hot_fh)
        };
        let head = add_read(&mut queue, &mem, slot, 1000 + i as u64, node, fh);
        by_head.insert(head, i);
    }
    // One publish: the device sees all of them in one batch.
    queue.publish().unwrap();
    let cold_bytes = pattern(2, COLD_LEN);
    let mut order = Vec::new();
    while order.len() < slots.len() {
        let (head, len) = queue
            .wait_used(Duration::from_secs(60))
            .expect("a READ comes back");
        let slot = &slots[*by_head.get(&head).expect("a head we sent")];
        assert_eq!(
            len,
            OUT_HEADER_LEN as u32 + slot.size,
            "a full READ reply (error: {})",
            mem.read_obj::<i32>(GuestAddress(slot.reply.0 + 4)).unwrap()
        );
        let mut got = vec![0u8; slot.size as usize];
        mem.read_slice(&mut got, slot.data).unwrap();
        let want = if slot.cold {
            &cold_bytes[slot.offset as usize..][..slot.size as usize]
        } else {
            &hot_bytes[slot.offset as usize..][..slot.size as usize]
        };
        assert!(got == want, "READ at {} returned other bytes", slot.offset);
        order.push(slot.cold);
    }
    order
}

#[test]
fn cached_reads_are_not_held_up_by_a_cold_read_on_the_same_queue() {
    let _dog = Watchdog::new("out_of_order", Duration::from_secs(600));
    let dir = tempfile::tempdir().unwrap();
    let (s3, meta) = s3_volume(dir.path());
    // From now on every S3 answer is held 50 ms: a remote store's first
    // byte. Each `serve` starts with an empty memory cache and no disk
    // cache, so every block it has not read yet is a GET.
    s3.faults().set(0, 1000, Duration::from_millis(50), 0, 0);

    let order = completion_order(&meta, dir.path(), "ooo", &[]);
    assert_eq!(
        order.last(),
        Some(&true),
        "the cold READ must come back after every cached one: {order:?}"
    );

    // Every request answered on the worker, in ring order: the cold READ
    // holds up the batch and is returned first.
    let order = completion_order(&meta, dir.path(), "in-order", &["--max-waiting", "0"]);
    assert_eq!(
        order.first(),
        Some(&true),
        "with --max-waiting 0 the cold READ is answered first: {order:?}"
    );
}

/// Formats a volume on a loopback S3 server and writes `hot` and `cold`
/// through a host mount.
fn s3_volume(dir: &Path) -> (TestS3Server, String) {
    let s3 = TestS3Server::start(&dir.join("s3"), AK, SK).expect("the S3 server");
    let meta = format!("sqlite3://{}", dir.join("meta.db").display());
    sluice_ok(&[
        "format",
        &meta,
        "ooo",
        "--storage",
        "s3",
        "--bucket",
        &s3.bucket_url("ooo"),
        "--access-key",
        AK,
        "--secret-key",
        SK,
    ]);
    let mnt = dir.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mount = Mount::start(&meta, &mnt, &dir.join("mount.log"), &[]);
    fs::write(mnt.join("hot"), pattern(1, HOT_LEN)).unwrap();
    fs::write(mnt.join("cold"), pattern(2, COLD_LEN)).unwrap();
    mount.unmount();
    (s3, meta)
}

/// Drops the kernel's cached pages of `path`, so the next read reaches the
/// daemon.
fn drop_pages(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap();
    // SAFETY: a plain advice call on a descriptor we own.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise");
}

/// Mounts the volume with one serving thread and `extra`; while a thread
/// reads the cold file (every S3 answer held 3 s), reads the cached hot
/// file. Returns whether the cold read had finished when the hot read
/// returned.
fn cold_done_when_hot_returns(
    s3: &TestS3Server,
    meta: &str,
    dir: &Path,
    sub: &str,
    extra: &[&str],
) -> bool {
    let mnt = dir.join(sub);
    fs::create_dir_all(&mnt).unwrap();
    let mut args = vec!["--threads", "1"];
    args.extend_from_slice(extra);
    let mount = Mount::start(meta, &mnt, &dir.join(format!("{sub}.log")), &args);
    // Warm the daemon's memory cache with the hot file, then make the
    // kernel forget its pages.
    assert_eq!(fs::read(mnt.join("hot")).unwrap(), pattern(1, HOT_LEN));
    drop_pages(&mnt.join("hot"));
    let gets_before = s3.faults().requests();
    let cold_done = Arc::new(AtomicBool::new(false));
    let cold = {
        let (path, done) = (mnt.join("cold"), cold_done.clone());
        std::thread::spawn(move || {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; COLD_READ as usize];
            fs::File::open(path)
                .unwrap()
                .read_exact_at(&mut buf, 4 << 20)
                .unwrap();
            done.store(true, Ordering::Release);
            buf
        })
    };
    // The cold READ is in the daemon once its GET reached the S3 server.
    while s3.faults().requests() == gets_before {
        std::thread::sleep(Duration::from_millis(5));
    }
    let hot = {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; HOT_READ as usize];
        fs::File::open(mnt.join("hot"))
            .unwrap()
            .read_exact_at(&mut buf, 8192)
            .unwrap();
        buf
    };
    let done_then = cold_done.load(Ordering::Acquire);
    assert_eq!(hot, pattern(1, HOT_LEN)[8192..8192 + HOT_READ as usize]);
    let got = cold.join().unwrap();
    assert!(got == pattern(2, COLD_LEN)[4 << 20..(4 << 20) + COLD_READ as usize]);
    mount.unmount();
    done_then
}

#[test]
fn the_host_mount_answers_cached_reads_while_a_cold_read_waits() {
    let _dog = Watchdog::new("out_of_order_mount", Duration::from_secs(600));
    let dir = tempfile::tempdir().unwrap();
    let (s3, meta) = s3_volume(dir.path());
    s3.faults().set(0, 1000, Duration::from_secs(3), 0, 0);
    // With `--max-waiting 0` the one serving thread answers the cached
    // read only after the cold one (checked by hand: this assertion then
    // fails); the flag is set by the cold reader once its read returned, so
    // that contrast cannot be asserted here without a race.
    assert!(
        !cold_done_when_hot_returns(&s3, &meta, dir.path(), "a", &[]),
        "the cached read waited for the cold one"
    );
}

/// Puts a request with `args` (answered with `reply_len` bytes) on the
/// queue; returns its head.
fn add_request(
    queue: &mut SplitQueue,
    device: &mut Device,
    mem: &GuestMemoryMmap,
    request: &[u8],
    reply_len: u32,
) -> u16 {
    let at = device.alloc(request.len() as u64).unwrap();
    let reply = device.alloc(u64::from(reply_len)).unwrap();
    mem.write_slice(request, at).unwrap();
    queue
        .add(&[(at, request.len() as u32)], &[(reply, reply_len)])
        .unwrap()
}

/// Serves a Redis volume with `extra`; with the Redis server stopped, puts
/// one GETATTR and then [`HOT_READS`] FLUSHes on one queue at once. With
/// `resume_after_flushes`, lets the server go on only once every FLUSH came
/// back (so they came back while the GETATTR waited); otherwise right after
/// publishing. Returns whether each returned chain was the GETATTR, in the
/// order the device returned them.
fn metadata_completion_order(
    redis: &RedisServer,
    meta: &str,
    dir: &Path,
    name: &str,
    extra: &[&str],
    resume_after_flushes: bool,
) -> Vec<bool> {
    let socket = dir.join(format!("{name}.sock"));
    let mut args = vec!["--no-pin", "--once"];
    args.extend_from_slice(extra);
    let _serve = Serve::start(meta, &socket, &args);
    let mut device = connect(&socket);
    let mut q = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue");
    q.init().expect("INIT");
    let hot = q.lookup(ROOT_ID, b"hot").expect("LOOKUP hot").nodeid;
    let fh = q.open(hot, libc::O_RDONLY as u32).expect("OPEN hot");
    let mem = q.memory().clone();
    let mut queue = q.into_queue();
    let getattr = wire::request(opcode::GETATTR, 2000, hot, &wire::getattr_in());
    let reply_len = (OUT_HEADER_LEN + 16 + wire::ATTR_LEN) as u32;
    let getattr_head = add_request(&mut queue, &mut device, &mem, &getattr, reply_len);
    for i in 0..HOT_READS {
        let flush = wire::request(opcode::FLUSH, 2001 + i as u64, hot, &wire::flush_in(fh));
        add_request(&mut queue, &mut device, &mem, &flush, OUT_HEADER_LEN as u32);
    }
    redis.freeze();
    queue.publish().unwrap();
    if !resume_after_flushes {
        redis.resume();
    }
    let mut order = Vec::new();
    while order.len() < 1 + HOT_READS {
        let (head, len) = queue
            .wait_used(Duration::from_secs(60))
            .expect("a request comes back");
        let is_getattr = head == getattr_head;
        let want = if is_getattr {
            reply_len
        } else {
            OUT_HEADER_LEN as u32
        };
        assert_eq!(len, want, "a whole reply");
        order.push(is_getattr);
        if resume_after_flushes && order.len() == HOT_READS {
            redis.resume();
        }
    }
    redis.resume();
    order
}

#[test]
fn requests_are_not_held_up_by_a_metadata_round_trip_on_the_same_queue() {
    let _dog = Watchdog::new("out_of_order_metadata", Duration::from_secs(600));
    let Some(redis) = RedisServer::start("out_of_order_metadata") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let meta = redis.url(1);
    let bucket = dir.path().join("bucket");
    sluice_ok(&[
        "format",
        &meta,
        "ooo-meta",
        "--bucket",
        bucket.to_str().unwrap(),
    ]);
    let mnt = dir.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mount = Mount::start(&meta, &mnt, &dir.path().join("mount.log"), &[]);
    fs::write(mnt.join("hot"), pattern(1, HOT_LEN)).unwrap();
    mount.unmount();

    // With the host-local metadata cache the GETATTR needs no round trip
    // (the LOOKUP and OPEN before it read the node): it is answered in
    // ring order, first, though the server is stopped.
    let order = metadata_completion_order(&redis, &meta, dir.path(), "meta-cached", &[], true);
    assert_eq!(
        order.first(),
        Some(&true),
        "the cached GETATTR is answered at once: {order:?}"
    );
    // Without it, the GETATTR is a round trip: the FLUSHes come back while
    // the server is stopped, before the GETATTR; were the worker waiting
    // on the GETATTR, none would, and the wait for them would time out.
    let meta = format!("{meta}?client-cache=false");
    let order = metadata_completion_order(&redis, &meta, dir.path(), "meta-ooo", &[], true);
    assert_eq!(
        order.last(),
        Some(&true),
        "the GETATTR must come back after every FLUSH: {order:?}"
    );
    // Every request answered on the worker, in ring order.
    let order = metadata_completion_order(
        &redis,
        &meta,
        dir.path(),
        "meta-in-order",
        &["--max-waiting", "0"],
        false,
    );
    assert_eq!(
        order.first(),
        Some(&true),
        "with --max-waiting 0 the GETATTR is answered first: {order:?}"
    );
}
