//! The per-queue worker: pops descriptor chains in batches, checks their
//! framing, hands each request to the [`RequestHandler`] and signals the guest
//! once per batch.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use log::{debug, warn};
use sluice_fuse::log_limit::{LogLimit, suppressed_note};
use sluice_metrics::Histogram;
use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};

use crate::RequestHandler;
use crate::descriptor::{ChainBuffers, ChainError, Writer};
use crate::frame::{IN_HEADER_LEN, InHeader, OUT_HEADER_LEN, error_reply};
use crate::guest_io::{self, GuestIoMode, GuestIoRoute};

/// The guest memory as the backend shares it with its vrings.
pub(crate) type GuestMem = GuestMemoryAtomic<GuestMemoryMmap>;

/// What one queue has carried since the device started: the daemon's
/// per-queue counters (read them with [`crate::VirtioFsDevice::stats`]).
/// Only the queue's worker thread writes them: plain relaxed adds, no
/// cache line shared with another writer.
#[derive(Debug)]
pub struct QueueStats {
    /// Requests answered (malformed ones included).
    pub requests: AtomicU64,
    /// Request bytes read from the guest.
    pub bytes_in: AtomicU64,
    /// Reply bytes written into the guest.
    pub bytes_out: AtomicU64,
    /// Batches, i.e. guest notifications considered.
    pub batches: AtomicU64,
    /// READ bytes the worker's io_uring ring read from local files through
    /// the page cache into guest memory registered as fixed buffers.
    pub guest_io_fixed_bytes: AtomicU64,
    /// READ bytes the worker's io_uring ring read from local files with
    /// O_DIRECT into registered guest memory (no CPU copy).
    pub guest_io_direct_bytes: AtomicU64,
    /// READ bytes read from local files into guest memory with pread
    /// (`--guest-io pread`, or where io_uring could not serve).
    pub guest_io_pread_bytes: AtomicU64,
    /// READ bytes the CPU copied into guest memory from the engine's
    /// memory (cached blocks, write buffers).
    pub guest_copy_bytes: AtomicU64,
    /// Chains popped and not yet returned to the guest.
    pub in_flight: AtomicU64,
    /// Time from popping a chain to returning it on the used ring, in
    /// nanoseconds.
    pub latency: Histogram,
    /// Chains refused before any FUSE decoding, by the errno answered:
    /// see [`REJECT_ERRNOS`].
    pub rejected: [AtomicU64; REJECT_ERRNOS.len()],
}

/// The errnos a worker answers malformed chains with, in the order of
/// [`QueueStats::rejected`]: outside guest memory, malformed, oversized,
/// the handler failing with nothing written.
pub const REJECT_ERRNOS: [i32; 4] = [libc::EFAULT, libc::EINVAL, libc::E2BIG, libc::EIO];

/// Latency buckets of a queue: 10 µs × 1.5^k, 36 of them (to ~15 s).
pub fn queue_latency_bounds() -> Vec<u64> {
    sluice_metrics::exponential_bounds(10_000.0, 1.5, 36)
}

impl Default for QueueStats {
    fn default() -> Self {
        QueueStats {
            requests: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            guest_io_fixed_bytes: AtomicU64::new(0),
            guest_io_direct_bytes: AtomicU64::new(0),
            guest_io_pread_bytes: AtomicU64::new(0),
            guest_copy_bytes: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            latency: Histogram::new(queue_latency_bounds()),
            rejected: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl QueueStats {
    /// (requests, bytes in, bytes out, batches) at this moment.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.bytes_in.load(Ordering::Relaxed),
            self.bytes_out.load(Ordering::Relaxed),
            self.batches.load(Ordering::Relaxed),
        )
    }

    /// READ bytes from local files by path: (io_uring through the page
    /// cache, io_uring O_DIRECT, pread) at this moment.
    pub fn guest_io_snapshot(&self) -> (u64, u64, u64) {
        (
            self.guest_io_fixed_bytes.load(Ordering::Relaxed),
            self.guest_io_direct_bytes.load(Ordering::Relaxed),
            self.guest_io_pread_bytes.load(Ordering::Relaxed),
        )
    }
}

/// What a worker keeps between batches.
#[derive(Debug, Default)]
pub(crate) struct WorkerState {
    /// Whether this worker thread has applied its CPU pinning.
    pub pinned: bool,
    /// Reused buffer the request bytes are gathered into.
    request: Vec<u8>,
    /// Reused list of (head index, used length) of the batch being answered.
    completed: Vec<(u16, u32)>,
}

/// The rules one worker applies to every chain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Requests larger than this get `E2BIG`.
    pub max_request_size: usize,
    /// At most this many chains are popped before the guest is signalled.
    pub batch: usize,
    /// How READ data from local files reaches guest memory.
    pub guest_io: GuestIoMode,
}

/// Serves `vring` until it has no more available chains.
///
/// With EVENT_IDX the worker turns guest notifications off while it drains the
/// queue and back on when it is empty, re-checking for chains that raced in.
#[allow(clippy::too_many_arguments)]
pub(crate) fn process_queue<H: RequestHandler + ?Sized>(
    queue: u16,
    vring: &VringRwLock<GuestMem>,
    mem: &GuestMem,
    event_idx: bool,
    limits: Limits,
    handler: &H,
    state: &mut WorkerState,
    stats: &QueueStats,
) -> io::Result<()> {
    loop {
        if event_idx {
            vring.disable_notification().map_err(io::Error::other)?;
        }
        while process_batch(queue, vring, mem, limits, handler, state, stats)? {}
        if !event_idx || !vring.enable_notification().map_err(io::Error::other)? {
            return Ok(());
        }
    }
}

/// Handles up to `limits.batch` chains; returns whether any chain was handled
/// or is to be read again.
fn process_batch<H: RequestHandler + ?Sized>(
    queue: u16,
    vring: &VringRwLock<GuestMem>,
    atomic: &GuestMem,
    limits: Limits,
    handler: &H,
    state: &mut WorkerState,
    stats: &QueueStats,
) -> io::Result<bool> {
    // One snapshot of the memory table for the whole batch: a concurrent
    // SET_MEM_TABLE or REM_MEM_REG swaps in a new table but leaves these
    // mappings alive until the snapshot is dropped.
    let mem = atomic.memory().into_inner();
    if limits.guest_io == GuestIoMode::Uring {
        guest_io::release_stale(&mem);
    }
    let chains: Vec<_> = {
        let mut guard = vring.get_mut();
        let queue_state = guard.get_queue_mut();
        match queue_state.iter(&*mem) {
            Ok(iter) => iter.take(limits.batch).collect(),
            Err(e) => {
                warn!("queue {queue}: cannot read the available ring: {e}");
                return Ok(false);
            }
        }
    };
    if chains.is_empty() {
        return Ok(false);
    }
    // A frontend adds memory (ADD_MEM_REG, SET_MEM_TABLE) before the driver
    // may place buffers in it, so a table swapped in while the ring was read
    // may be the one these chains need. Read them again against it rather
    // than answer a valid request with EFAULT.
    if !std::sync::Arc::ptr_eq(&mem, &atomic.memory().into_inner()) {
        let rewind = u16::try_from(chains.len()).unwrap_or(u16::MAX);
        drop(chains);
        let mut guard = vring.get_mut();
        let queue_state = guard.get_queue_mut();
        let next = queue_state.next_avail().wrapping_sub(rewind);
        queue_state.set_next_avail(next);
        debug!("queue {queue}: guest memory changed while reading the ring; reading it again");
        return Ok(true);
    }
    state.completed.clear();
    stats.batches.fetch_add(1, Ordering::Relaxed);
    let popped = Instant::now();
    stats
        .in_flight
        .store(chains.len() as u64, Ordering::Relaxed);
    for chain in chains {
        let head = chain.head_index();
        let (buffers, problem) = ChainBuffers::parse(&mem, chain);
        stats.requests.fetch_add(1, Ordering::Relaxed);
        stats
            .bytes_in
            .fetch_add(buffers.readable_len() as u64, Ordering::Relaxed);
        let route = GuestIoRoute {
            table: &mem,
            mode: limits.guest_io,
            stats,
        };
        let used = handle_chain(
            queue,
            route,
            &buffers,
            problem,
            limits,
            handler,
            &mut state.request,
        );
        stats
            .bytes_out
            .fetch_add(u64::from(used), Ordering::Relaxed);
        state.completed.push((head, used));
    }
    let mut guard = vring.get_mut();
    for &(head, used) in &state.completed {
        if let Err(e) = guard.get_queue_mut().add_used(&*mem, head, used) {
            warn!("queue {queue}: cannot return descriptor {head}: {e}");
        }
    }
    let notify = guard
        .get_queue_mut()
        .needs_notification(&*mem)
        .map_err(io::Error::other)?;
    drop(guard);
    let waited = u64::try_from(popped.elapsed().as_nanos()).unwrap_or(u64::MAX);
    for _ in &state.completed {
        stats.latency.observe(waited);
    }
    stats.in_flight.store(0, Ordering::Relaxed);
    if notify {
        vring.signal_used_queue()?;
    }
    Ok(true)
}

/// Answers one chain; returns the number of bytes written into it.
fn handle_chain<H: RequestHandler + ?Sized>(
    queue: u16,
    route: GuestIoRoute<'_>,
    buffers: &ChainBuffers,
    problem: Option<ChainError>,
    limits: Limits,
    handler: &H,
    request: &mut Vec<u8>,
) -> u32 {
    let mut reply = buffers.routed_writer(route);
    request.clear();
    let mut reader = buffers.reader(route.table);
    let readable = buffers.readable_len();
    // Read at most the header when the request is oversized or malformed: the
    // unique id is all an error reply needs.
    let gather = if problem.is_some() || readable > limits.max_request_size {
        readable.min(IN_HEADER_LEN)
    } else {
        readable
    };
    request.resize(gather, 0);
    if let Err(e) = io::Read::read_exact(&mut reader, request) {
        guest_fault(format_args!(
            "queue {queue}: cannot read the request from guest memory: {e}"
        ));
        return answer_error(&mut reply, libc::EFAULT, 0);
    }
    let header = InHeader::parse(request);
    let unique = header.map_or(0, |h| h.unique);
    if let Some(problem) = problem {
        guest_fault(format_args!(
            "queue {queue}: malformed descriptor chain: {problem}"
        ));
        let errno = match problem {
            ChainError::OutsideGuestMemory { .. } => libc::EFAULT,
            _ => libc::EINVAL,
        };
        return answer_error(&mut reply, errno, unique);
    }
    let Some(header) = header else {
        guest_fault(format_args!(
            "queue {queue}: request of {readable} bytes is shorter than a FUSE header"
        ));
        return answer_error(&mut reply, libc::EINVAL, 0);
    };
    if readable > limits.max_request_size {
        guest_fault(format_args!(
            "queue {queue}: request of {readable} bytes exceeds the {} byte limit",
            limits.max_request_size
        ));
        return answer_error(&mut reply, libc::E2BIG, unique);
    }
    if header.len as usize != readable {
        guest_fault(format_args!(
            "queue {queue}: request header says {} bytes but the chain holds {readable}",
            header.len
        ));
        return answer_error(&mut reply, libc::EINVAL, unique);
    }
    if let Err(e) = handler.handle(queue, request, &mut reply) {
        debug!(
            "queue {queue}: handler failed on opcode {}: {e}",
            header.opcode
        );
        if reply.bytes_written() == 0 {
            return answer_error(&mut reply, libc::EIO, unique);
        }
    }
    used_len(&reply)
}

/// Warns about a request the guest got wrong: at most
/// [`LogLimit::PER_SECOND`] lines a second, since a guest can send them as
/// fast as it likes.
fn guest_fault(msg: std::fmt::Arguments<'_>) {
    static LIMIT: LogLimit = LogLimit::new();
    if let Some(left_out) = LIMIT.allow() {
        warn!("{msg}{}", suppressed_note(left_out));
    }
}

/// Writes an error reply if there is room for one; returns the used length.
fn answer_error(reply: &mut Writer<'_>, errno: i32, unique: u64) -> u32 {
    reply.count_rejected(errno);
    if reply.available_bytes() < OUT_HEADER_LEN {
        guest_fault(format_args!(
            "no room for an error reply; returning the chain empty"
        ));
        return used_len(reply);
    }
    if let Err(e) = reply.write_all(&error_reply(errno, unique)) {
        guest_fault(format_args!("cannot write an error reply: {e}"));
    }
    used_len(reply)
}

fn used_len(reply: &Writer<'_>) -> u32 {
    // Writable room was checked to fit in u32 when the chain was parsed.
    u32::try_from(reply.bytes_written()).unwrap_or(u32::MAX)
}
