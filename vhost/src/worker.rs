//! The per-queue worker: pops descriptor chains in batches, checks their
//! framing, hands each request to the [`RequestHandler`] — on the worker when
//! it can be answered at once, on a waiter thread when it has to wait
//! ([`crate::waiting`]) — and signals the guest once per batch.

use std::io::{self, Write};
use std::sync::Arc;
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
use crate::waiting::{Completion, Job, Parked, Waiters};

/// The guest memory as the backend shares it with its vrings.
pub(crate) type GuestMem = GuestMemoryAtomic<GuestMemoryMmap>;

/// What one queue has carried since the device started: the daemon's
/// per-queue counters (read them with [`crate::VirtioFsDevice::stats`]).
/// The queue's worker writes them, and the waiters for the chains they
/// answer: relaxed atomic adds.
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
    /// Requests that would have waited on the worker (a block not in the
    /// memory cache, a commit, a sync) and were answered by a waiter thread
    /// instead, out of order.
    pub handed_on: AtomicU64,
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
            handed_on: AtomicU64::new(0),
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
    /// Reused list of the chains of the batch being answered, and of those
    /// the waiters finished since the last batch.
    completed: Vec<Completion>,
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
    /// At most this many chains of the queue are with the waiters (0: none
    /// is handed on; every request is answered on the worker).
    pub max_waiting: usize,
}

/// What a worker works with: its queue, the device's shared parts.
pub(crate) struct QueueCtx<'a, H: ?Sized> {
    pub queue: u16,
    pub vring: &'a VringRwLock<GuestMem>,
    pub mem: &'a GuestMem,
    pub event_idx: bool,
    pub limits: Limits,
    pub handler: &'a Arc<H>,
    /// The device's counters, one per queue (index `queue`).
    pub stats: &'a Arc<[QueueStats]>,
    /// This queue's chains with the waiters.
    pub parked: &'a Arc<Parked>,
    /// Every queue's (DESTROY waits until none is with a waiter).
    pub all_parked: &'a [Arc<Parked>],
    /// The device's waiters; `None` when requests are never handed on.
    pub waiters: Option<&'a Waiters>,
}

impl<H: ?Sized> QueueCtx<'_, H> {
    fn stats(&self) -> &QueueStats {
        &self.stats[usize::from(self.queue)]
    }
}

/// How a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// Chains were handled; there may be more.
    Handled,
    /// The ring had no chain.
    Empty,
    /// The queue has [`Limits::max_waiting`] chains with the waiters: take
    /// no more until one comes back (its completion wakes the worker).
    Full,
}

/// What answering one chain came to.
enum Answer {
    /// The reply is in the chain: this many bytes.
    Done(u32),
    /// The request has to wait: hand the chain on.
    Wait,
}

/// Serves the queue until it has no more available chains, or until it has
/// as many chains with the waiters as it may (then a completion wakes the
/// worker again). Also returns to the guest every chain the waiters
/// finished: the worker calls this on a kick and on a completion.
///
/// With EVENT_IDX the worker turns guest notifications off while it drains the
/// queue and back on when it is empty, re-checking for chains that raced in.
/// A full queue leaves them off: it does not read the ring until a chain
/// comes back, and the guest need not kick meanwhile.
pub(crate) fn process_queue<H: RequestHandler + ?Sized>(
    ctx: &QueueCtx<'_, H>,
    state: &mut WorkerState,
) -> io::Result<()> {
    // A stopped ring (GET_VRING_BASE) is not ours to touch: `stop_vring`
    // returned what the waiters held. A completion wake-up that arrives
    // after that only clears the eventfd.
    if !ctx.vring.get_ref().get_queue().ready() {
        ctx.parked.clear_event();
        return Ok(());
    }
    loop {
        if ctx.event_idx {
            ctx.vring.disable_notification().map_err(io::Error::other)?;
        }
        loop {
            match process_batch(ctx, state)? {
                Batch::Handled => {}
                Batch::Empty => break,
                Batch::Full => return Ok(()),
            }
        }
        if !ctx.event_idx || !ctx.vring.enable_notification().map_err(io::Error::other)? {
            return Ok(());
        }
    }
}

/// Handles up to `limits.batch` chains (fewer when the waiters hold many of
/// the queue's), then returns them and the chains the waiters finished to
/// the used ring under one lock, signalling the guest at most once.
fn process_batch<H: RequestHandler + ?Sized>(
    ctx: &QueueCtx<'_, H>,
    state: &mut WorkerState,
) -> io::Result<Batch> {
    let (queue, vring, limits) = (ctx.queue, ctx.vring, ctx.limits);
    let stats = ctx.stats();
    // One snapshot of the memory table for the whole batch: a concurrent
    // SET_MEM_TABLE or REM_MEM_REG swaps in a new table but leaves these
    // mappings alive until the snapshot is dropped (and a chain handed on
    // keeps it alive until its waiter is done).
    let mem = ctx.mem.memory().into_inner();
    if limits.guest_io == GuestIoMode::Uring {
        guest_io::release_stale(&mem);
    }
    let waiting = ctx.parked.outstanding();
    let room = match ctx.waiters {
        Some(_) => limits.batch.min(limits.max_waiting.saturating_sub(waiting)),
        None => limits.batch,
    };
    let chains: Vec<_> = if room == 0 {
        Vec::new()
    } else {
        let mut guard = vring.get_mut();
        let queue_state = guard.get_queue_mut();
        match queue_state.iter(&*mem) {
            Ok(iter) => iter.take(room).collect(),
            Err(e) => {
                warn!("queue {queue}: cannot read the available ring: {e}");
                Vec::new()
            }
        }
    };
    // A frontend adds memory (ADD_MEM_REG, SET_MEM_TABLE) before the driver
    // may place buffers in it, so a table swapped in while the ring was read
    // may be the one these chains need. Read them again against it rather
    // than answer a valid request with EFAULT.
    if !chains.is_empty() && !Arc::ptr_eq(&mem, &ctx.mem.memory().into_inner()) {
        let rewind = u16::try_from(chains.len()).unwrap_or(u16::MAX);
        drop(chains);
        let mut guard = vring.get_mut();
        let queue_state = guard.get_queue_mut();
        let next = queue_state.next_avail().wrapping_sub(rewind);
        queue_state.set_next_avail(next);
        debug!("queue {queue}: guest memory changed while reading the ring; reading it again");
        return Ok(Batch::Handled);
    }
    let popped_any = !chains.is_empty();
    state.completed.clear();
    if popped_any {
        stats.batches.fetch_add(1, Ordering::Relaxed);
    }
    let popped = Instant::now();
    stats
        .in_flight
        .store((chains.len() + waiting) as u64, Ordering::Relaxed);
    // The worker answers what it can answer at once; whatever would wait
    // fails with WouldBlock and goes to a waiter (`sluice_api::wait`).
    let no_wait = ctx.waiters.map(|_| sluice_api::wait::no_wait());
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
            waiter: false,
        };
        // DESTROY ends the session: the requests handed on before it (a
        // RELEASE, a FLUSH, on any queue) are answered first, as they would
        // have been in ring order.
        let before_destroy = || {
            for p in ctx.all_parked {
                p.wait_idle();
            }
        };
        match handle_chain(
            queue,
            route,
            &buffers,
            problem,
            limits,
            &**ctx.handler,
            &mut state.request,
            &before_destroy,
        ) {
            Answer::Done(used) => {
                stats
                    .bytes_out
                    .fetch_add(u64::from(used), Ordering::Relaxed);
                state.completed.push(Completion { head, used, popped });
            }
            Answer::Wait => {
                // A copy of the request's bytes (a READ's or FSYNC's are
                // a hundred or so): the worker keeps its grown buffer, and
                // a parked chain holds no more than its request.
                let request = state.request.clone();
                if let Some(done) = hand_on(ctx, &mem, head, buffers, request, popped) {
                    state.completed.push(done);
                }
            }
        }
    }
    drop(no_wait);
    ctx.parked.take_done(&mut state.completed);
    if state.completed.is_empty() {
        return Ok(match (popped_any, room) {
            (true, _) => Batch::Handled,
            (false, 0) => Batch::Full,
            (false, _) => Batch::Empty,
        });
    }
    let mut guard = vring.get_mut();
    for c in &state.completed {
        if let Err(e) = guard.get_queue_mut().add_used(&*mem, c.head, c.used) {
            warn!("queue {queue}: cannot return descriptor {}: {e}", c.head);
        }
    }
    let notify = guard
        .get_queue_mut()
        .needs_notification(&*mem)
        .map_err(io::Error::other)?;
    drop(guard);
    for c in &state.completed {
        let waited = u64::try_from(c.popped.elapsed().as_nanos()).unwrap_or(u64::MAX);
        stats.latency.observe(waited);
    }
    stats
        .in_flight
        .store(ctx.parked.outstanding() as u64, Ordering::Relaxed);
    if notify {
        vring.signal_used_queue()?;
    }
    // Chains came back from the waiters: the room they held is free again,
    // so a queue that was full looks at the ring once more (answering
    // `Full` here would leave notifications off with nothing left to wake
    // the worker: the queue would stall for good).
    Ok(if popped_any || room == 0 {
        Batch::Handled
    } else {
        Batch::Empty
    })
}

/// Hands a chain whose request has to wait to a waiter thread, which runs
/// it again where it may wait, writes the reply into the chain and returns
/// the chain to the queue. When no waiter runs any more (the connection is
/// ending) the request is answered here instead, waiting; that answer is
/// returned.
fn hand_on<H: RequestHandler + ?Sized>(
    ctx: &QueueCtx<'_, H>,
    mem: &Arc<vm_memory::GuestMemoryMmap>,
    head: u16,
    buffers: ChainBuffers,
    request: Vec<u8>,
    popped: Instant,
) -> Option<Completion> {
    let queue = ctx.queue;
    let stats = ctx.stats();
    sluice_metrics::add(&stats.handed_on, 1);
    let run = {
        let handler = ctx.handler.clone();
        let all_stats = ctx.stats.clone();
        let mem = mem.clone();
        let guest_io = ctx.limits.guest_io;
        move || -> u32 {
            let stats = &all_stats[usize::from(queue)];
            // A waiter has no io_uring ring of its own registered with the
            // guest's memory: it reads files with pread, O_DIRECT where
            // the mode allows (`DirectReader`).
            let route = GuestIoRoute {
                table: &mem,
                mode: guest_io,
                stats,
                waiter: true,
            };
            // A handler that panics must still give its chain back (the
            // guest would wait for it, and GET_VRING_BASE for the queue):
            // with EIO, as the worker answers a handler's failure.
            let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                answer(queue, &buffers, route, &*handler, &request)
            }));
            let used = answered.unwrap_or_else(|_| {
                warn!("queue {queue}: a request panicked on a waiter; answering EIO");
                let unique = InHeader::parse(&request).map_or(0, |h| h.unique);
                let mut reply = buffers.routed_writer(route);
                answer_error(&mut reply, libc::EIO, unique)
            });
            stats
                .bytes_out
                .fetch_add(u64::from(used), Ordering::Relaxed);
            used
        }
    };
    let Some(waiters) = ctx.waiters else {
        let _wait = sluice_api::wait::allow_wait();
        return Some(Completion {
            head,
            used: run(),
            popped,
        });
    };
    ctx.parked.hand_on();
    let parked = ctx.parked.clone();
    let job: Job = Box::new(move |closing| {
        if closing {
            // The connection is ending: the guest will not see this chain.
            parked.complete(None);
            return;
        }
        let used = run();
        parked.complete(Some(Completion { head, used, popped }));
    });
    match waiters.submit(job) {
        Ok(()) => None,
        Err(job) => {
            // No waiter left: the connection is ending. Say so to the job,
            // which gives the chain up.
            job(true);
            None
        }
    }
}

/// Runs a request whose chain has already been checked and framed, on a
/// thread that may wait; returns the used length.
fn answer<H: RequestHandler + ?Sized>(
    queue: u16,
    buffers: &ChainBuffers,
    route: GuestIoRoute<'_>,
    handler: &H,
    request: &[u8],
) -> u32 {
    // A fresh writer: whatever the first attempt placed is overwritten.
    let mut reply = buffers.routed_writer(route);
    let unique = InHeader::parse(request).map_or(0, |h| h.unique);
    match handler.handle(queue, request, &mut reply) {
        Ok(()) => used_len(&reply),
        Err(e) => {
            debug!("queue {queue}: handler failed on a request that waited: {e}");
            if reply.bytes_written() == 0 {
                answer_error(&mut reply, libc::EIO, unique)
            } else {
                used_len(&reply)
            }
        }
    }
}

/// Answers one chain: the number of bytes written into it, or that its
/// request has to wait (its bytes are left in `request`).
#[allow(clippy::too_many_arguments)]
fn handle_chain<H: RequestHandler + ?Sized>(
    queue: u16,
    route: GuestIoRoute<'_>,
    buffers: &ChainBuffers,
    problem: Option<ChainError>,
    limits: Limits,
    handler: &H,
    request: &mut Vec<u8>,
    before_destroy: &dyn Fn(),
) -> Answer {
    Answer::Done(
        match frame_and_handle(
            queue,
            route,
            buffers,
            problem,
            limits,
            handler,
            request,
            before_destroy,
        ) {
            Some(used) => used,
            None => return Answer::Wait,
        },
    )
}

/// [`handle_chain`]'s work: `None` when the handler said the request has
/// to wait.
#[allow(clippy::too_many_arguments)]
fn frame_and_handle<H: RequestHandler + ?Sized>(
    queue: u16,
    route: GuestIoRoute<'_>,
    buffers: &ChainBuffers,
    problem: Option<ChainError>,
    limits: Limits,
    handler: &H,
    request: &mut Vec<u8>,
    before_destroy: &dyn Fn(),
) -> Option<u32> {
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
        return Some(answer_error(&mut reply, libc::EFAULT, 0));
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
        return Some(answer_error(&mut reply, errno, unique));
    }
    let Some(header) = header else {
        guest_fault(format_args!(
            "queue {queue}: request of {readable} bytes is shorter than a FUSE header"
        ));
        return Some(answer_error(&mut reply, libc::EINVAL, 0));
    };
    if readable > limits.max_request_size {
        guest_fault(format_args!(
            "queue {queue}: request of {readable} bytes exceeds the {} byte limit",
            limits.max_request_size
        ));
        return Some(answer_error(&mut reply, libc::E2BIG, unique));
    }
    if header.len as usize != readable {
        guest_fault(format_args!(
            "queue {queue}: request header says {} bytes but the chain holds {readable}",
            header.len
        ));
        return Some(answer_error(&mut reply, libc::EINVAL, unique));
    }
    if header.opcode == sluice_fuse::abi::opcode::DESTROY {
        before_destroy();
    }
    if let Err(e) = handler.handle(queue, request, &mut reply) {
        if e.kind() == io::ErrorKind::WouldBlock {
            return None;
        }
        debug!(
            "queue {queue}: handler failed on opcode {}: {e}",
            header.opcode
        );
        if reply.bytes_written() == 0 {
            return Some(answer_error(&mut reply, libc::EIO, unique));
        }
    }
    Some(used_len(&reply))
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

/// The worker against a hand-built split ring (EVENT_IDX) and a handler
/// that always has to wait under `no_wait`: the regressions a review found.
#[cfg(test)]
mod tests {
    use vhost_user_backend::VringRwLock;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

    use super::*;

    const QSIZE: u16 = 16;
    const DESC: u64 = 0x0;
    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;
    /// Where the used ring's `avail_event` lives.
    const AVAIL_EVENT: u64 = USED + 4 + 8 * QSIZE as u64;

    /// Answers with an empty reply, but only where it may wait.
    struct Slow;

    impl RequestHandler for Slow {
        fn handle(&self, _q: u16, req: &[u8], reply: &mut Writer<'_>) -> io::Result<()> {
            if sluice_api::wait::mode() == sluice_api::wait::Mode::NoWait {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let h = InHeader::parse(req).expect("a header");
            reply.write_all(&crate::frame::out_header(16, 0, h.unique))
        }
    }

    /// The driver's side: request `i` (a 40-byte header, 256 bytes of room)
    /// on the available ring.
    fn post(mem: &GuestMemoryMmap, i: u16) {
        let req = 0x3000 + u64::from(i) * 0x100;
        let rep = 0x8000 + u64::from(i) * 0x100;
        let mut hdr = [0u8; 40];
        hdr[0..4].copy_from_slice(&40u32.to_le_bytes());
        hdr[4..8].copy_from_slice(&15u32.to_le_bytes());
        hdr[8..16].copy_from_slice(&(u64::from(i) + 1).to_le_bytes());
        mem.write_slice(&hdr, GuestAddress(req)).unwrap();
        let desc = |n: u16, addr: u64, len: u32, flags: u16, next: u16| {
            let mut e = [0u8; 16];
            e[0..8].copy_from_slice(&addr.to_le_bytes());
            e[8..12].copy_from_slice(&len.to_le_bytes());
            e[12..14].copy_from_slice(&flags.to_le_bytes());
            e[14..16].copy_from_slice(&next.to_le_bytes());
            mem.write_slice(&e, GuestAddress(DESC + 16 * u64::from(n)))
                .unwrap();
        };
        desc(2 * i, req, 40, 1, 2 * i + 1);
        desc(2 * i + 1, rep, 256, 2, 0);
        let idx: u16 = mem.read_obj(GuestAddress(AVAIL + 2)).unwrap();
        mem.write_obj(2 * i, GuestAddress(AVAIL + 4 + 2 * u64::from(idx % QSIZE)))
            .unwrap();
        mem.write_obj(idx.wrapping_add(1), GuestAddress(AVAIL + 2))
            .unwrap();
    }

    fn readable(fd: std::os::fd::RawFd, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the call's length.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    struct Rig {
        mmap: GuestMemoryMmap,
        mem: GuestMem,
        vring: VringRwLock<GuestMem>,
        handler: Arc<Slow>,
        stats: Arc<[QueueStats]>,
        parked: Arc<Parked>,
        all: Vec<Arc<Parked>>,
        waiters: Waiters,
    }

    fn rig() -> Rig {
        let mmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mem: GuestMem = GuestMemoryAtomic::new(mmap.clone());
        let vring = VringRwLock::new(mem.clone(), QSIZE).unwrap();
        vring.set_queue_size(QSIZE);
        vring.set_queue_info(DESC, AVAIL, USED).unwrap();
        vring.set_queue_event_idx(true);
        vring.set_queue_ready(true);
        let parked = Arc::new(Parked::new().unwrap());
        Rig {
            mmap,
            mem,
            vring,
            handler: Arc::new(Slow),
            stats: vec![QueueStats::default()].into(),
            all: vec![parked.clone()],
            parked,
            waiters: Waiters::start("vfs-wait", 2).unwrap(),
        }
    }

    impl Rig {
        fn ctx(&self, max_waiting: usize) -> QueueCtx<'_, Slow> {
            QueueCtx {
                queue: 0,
                vring: &self.vring,
                mem: &self.mem,
                event_idx: true,
                limits: Limits {
                    max_request_size: 1 << 20,
                    batch: 16,
                    guest_io: GuestIoMode::Pread,
                    max_waiting,
                },
                handler: &self.handler,
                stats: &self.stats,
                parked: &self.parked,
                all_parked: &self.all,
                waiters: Some(&self.waiters),
            }
        }
    }

    /// A queue at its bound of waiting chains must look at the ring again
    /// when they come back: with `--max-waiting 1` and two requests, the
    /// wake-up that returned the first once returned `Full` and left
    /// notifications off with nothing left to wake the worker.
    #[test]
    fn a_full_queue_takes_the_rest_when_its_chains_come_back() {
        let r = rig();
        let ctx = r.ctx(1);
        let mut state = WorkerState::default();
        post(&r.mmap, 0);
        post(&r.mmap, 1);
        process_queue(&ctx, &mut state).unwrap();
        // The epoll loop: the worker runs whenever a completion arrives.
        while readable(r.parked.event_fd(), 2000) {
            process_queue(&ctx, &mut state).unwrap();
        }
        let used: u16 = r.mmap.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(used, 2, "both requests answered");
        assert_eq!(r.parked.outstanding(), 0);
        // And the driver is asked to kick for the next one.
        let avail_event: u16 = r.mmap.read_obj(GuestAddress(AVAIL_EVENT)).unwrap();
        assert_eq!(avail_event, 2, "notifications are on again");
        assert_eq!(
            sluice_metrics::get(&r.stats[0].handed_on),
            2,
            "both waited on a waiter"
        );
    }

    /// After GET_VRING_BASE (the ring not ready, the waiters' chains
    /// returned) a late completion wake-up must not write into the ring's
    /// old memory, which the guest may have reused.
    #[test]
    fn a_stopped_ring_is_not_touched_by_a_late_wakeup() {
        let r = rig();
        let ctx = r.ctx(4);
        let mut state = WorkerState::default();
        post(&r.mmap, 0);
        process_queue(&ctx, &mut state).unwrap();
        r.vring.set_queue_ready(false);
        let mut done = Vec::new();
        r.parked.drain(&mut done);
        assert_eq!(done.len(), 1, "the drain returned the waiting chain");
        r.mmap
            .write_obj(0xabcdu16, GuestAddress(AVAIL_EVENT))
            .unwrap();
        assert!(readable(r.parked.event_fd(), 100), "a wake-up is pending");
        process_queue(&ctx, &mut state).unwrap();
        let after: u16 = r.mmap.read_obj(GuestAddress(AVAIL_EVENT)).unwrap();
        assert_eq!(after, 0xabcd, "the worker wrote into a stopped ring");
        assert!(!readable(r.parked.event_fd(), 0), "the wake-up was cleared");
    }
}
