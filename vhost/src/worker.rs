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

/// The bytes of a WRITE the worker reads into host memory: the header and
/// the `fuse_write_in`. The data after them stays in guest memory.
const WRITE_HEAD_LEN: usize = IN_HEADER_LEN + std::mem::size_of::<sluice_fuse::abi::WriteIn>();

/// What a worker keeps between batches.
#[derive(Debug, Default)]
pub(crate) struct WorkerState {
    /// Whether this worker thread has applied its CPU pinning.
    pub pinned: bool,
    /// Reused buffer the request bytes are gathered into (of a WRITE, the
    /// header and arguments: its data stays in guest memory).
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
    pub waiters: Option<&'a Arc<Waiters>>,
}

impl<H: ?Sized> QueueCtx<'_, H> {
    fn stats(&self) -> &QueueStats {
        &self.stats[usize::from(self.queue)]
    }

    /// Whether READs of local files are queued on the worker's ring and
    /// their chains parked there (`--guest-io uring` on a worker that must
    /// not wait).
    fn ring(&self) -> bool {
        self.limits.guest_io == GuestIoMode::Uring && self.waiters.is_some()
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
        // Chains parked on the ring still finish (into the completion list
        // `stop_vring` drains): reaped after the reset, as in a batch.
        if ctx.ring() {
            guest_io::submit_and_reap();
        }
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
            wake: ctx.ring().then(|| ctx.parked.event_fd()),
        };
        // DESTROY ends the session: the requests handed on before it (a
        // RELEASE, a FLUSH, on any queue) are answered first, as they would
        // have been in ring order. This worker's own parked chains wait
        // for its ring, which only it reaps: it waits for that first.
        let before_destroy = || {
            if ctx.ring() {
                guest_io::drain();
            }
            for p in ctx.all_parked {
                p.wait_idle();
            }
        };
        let answer = handle_chain(
            queue,
            route,
            &buffers,
            problem,
            limits,
            &**ctx.handler,
            &mut state.request,
            &before_destroy,
        );
        // Reads queued on the ring for this chain: whatever its answer, it
        // waits for them (they write into its buffers) before it goes back
        // to the guest or to a waiter.
        if ctx.ring()
            && let Some(waiters) = ctx.waiters
            && let Some(ticket) = guest_io::take_current()
        {
            let used = match answer {
                Answer::Done(used) => Some(used),
                Answer::Wait => None,
            };
            let request = state.request.clone();
            let parked = ParkedChain {
                head,
                buffers,
                request,
                popped,
                used,
            };
            park_on_ring(ctx, waiters, &mem, parked, ticket);
            continue;
        }
        match answer {
            Answer::Done(used) => {
                stats
                    .bytes_out
                    .fetch_add(u64::from(used), Ordering::Relaxed);
                state.completed.push(Completion { head, used, popped });
            }
            Answer::Wait => {
                // A copy of the request's bytes (a READ's or FSYNC's are
                // a hundred or so; a WRITE's data is not among them — the
                // waiter reads it again from the chain): the worker keeps
                // its buffer, and a parked chain holds no more than its
                // request.
                let request = state.request.clone();
                if let Some(done) = hand_on(ctx, &mem, head, buffers, request, popped) {
                    state.completed.push(done);
                }
            }
        }
    }
    drop(no_wait);
    // Reset the completion eventfd, then collect: the ring's completions
    // (it signals the same eventfd) and the waiters'. One that comes after
    // the reset writes it again and wakes the worker.
    ctx.parked.clear_event();
    if ctx.ring() {
        guest_io::submit_and_reap();
    }
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
    let stats = ctx.stats();
    sluice_metrics::add(&stats.handed_on, 1);
    let run = waiter_run(ctx, mem, buffers, request);
    let Some(waiters) = ctx.waiters else {
        let _wait = sluice_api::wait::allow_wait();
        return Some(Completion {
            head,
            used: run(),
            popped,
        });
    };
    ctx.parked.hand_on();
    submit_to_waiters(waiters, ctx.parked, head, popped, run);
    None
}

/// Submits `run` (a chain counted as handed on) to the waiters, which
/// return its chain to `parked`.
fn submit_to_waiters(
    waiters: &Waiters,
    parked: &Arc<Parked>,
    head: u16,
    popped: Instant,
    run: impl FnOnce() -> u32 + Send + 'static,
) {
    let parked = parked.clone();
    let job: Job = Box::new(move |closing| {
        if closing {
            // The connection is ending: the guest will not see this chain.
            parked.complete(None);
            return;
        }
        let used = run();
        parked.complete(Some(Completion { head, used, popped }));
    });
    if let Err(job) = waiters.submit(job) {
        // No waiter left: the connection is ending. Say so to the job,
        // which gives the chain up.
        job(true);
    }
}

/// The request of a chain, answered again on a waiter: returns the used
/// length.
fn waiter_run<H: RequestHandler + ?Sized>(
    ctx: &QueueCtx<'_, H>,
    mem: &Arc<vm_memory::GuestMemoryMmap>,
    buffers: ChainBuffers,
    request: Vec<u8>,
) -> impl FnOnce() -> u32 + Send + 'static {
    let queue = ctx.queue;
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
            wake: None,
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
}

/// A chain to park on the worker's ring: its answer (`used`; `None` when
/// the request must also wait for something else) and what a waiter needs
/// to answer it again.
struct ParkedChain {
    head: u16,
    buffers: ChainBuffers,
    request: Vec<u8>,
    popped: Instant,
    used: Option<u32>,
}

/// Parks a chain whose READ queued reads on the worker's ring (`ticket`)
/// until they are done. Then, if its answer was complete (`used`) and
/// every read came back in full, it goes back to the guest with the
/// worker's next batch; otherwise (a read failed or came back short, or
/// the request must wait for something else too) a waiter answers it
/// again from the start, with pread. It counts as handed on meanwhile
/// (`--max-waiting` bounds it, `stop_vring` and DESTROY wait for it).
fn park_on_ring<H: RequestHandler + ?Sized>(
    ctx: &QueueCtx<'_, H>,
    waiters: &Arc<Waiters>,
    mem: &Arc<vm_memory::GuestMemoryMmap>,
    chain: ParkedChain,
    ticket: guest_io::RingTicket,
) {
    let ParkedChain {
        head,
        buffers,
        request,
        popped,
        used,
    } = chain;
    let waiters = waiters.clone();
    ctx.parked.hand_on();
    let parked = ctx.parked.clone();
    let all_stats = ctx.stats.clone();
    let queue = usize::from(ctx.queue);
    let run = waiter_run(ctx, mem, buffers, request);
    guest_io::park(
        ticket,
        Box::new(move |outcome: guest_io::RingOutcome| {
            let stats = &all_stats[queue];
            sluice_metrics::add(&stats.guest_io_fixed_bytes, outcome.fixed);
            sluice_metrics::add(&stats.guest_io_direct_bytes, outcome.direct);
            match used {
                Some(used) if outcome.complete => {
                    sluice_metrics::add(&stats.bytes_out, u64::from(used));
                    parked.complete_here(Completion { head, used, popped });
                }
                _ => {
                    if !outcome.complete {
                        debug!("queue {queue}: a read on the ring failed; a waiter answers again");
                    }
                    sluice_metrics::add(&stats.handed_on, 1);
                    submit_to_waiters(&waiters, &parked, head, popped, run);
                }
            }
        }),
    );
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
    // A WRITE's data is read again from the chain, which is not the
    // guest's until it is answered: past the bytes the worker gathered.
    let mut data = buffers.reader(route.table);
    data.skip(request.len());
    let unique = InHeader::parse(request).map_or(0, |h| h.unique);
    match handler.handle(queue, request, &mut data, &mut reply) {
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
/// request has to wait (the bytes gathered are left in `request`: a
/// WRITE's header and arguments, without its data, which a waiter reads
/// again from the chain).
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
    let framed = problem.is_none() && readable <= limits.max_request_size;
    let gather = if framed {
        readable
    } else {
        readable.min(IN_HEADER_LEN)
    };
    // The header first: a WRITE's data is not gathered but left in the
    // guest's descriptors, for the file system to take straight into its
    // write buffer (`reader` is its source). Every byte is read from guest
    // memory once: what is decoded is host memory.
    request.resize(gather.min(IN_HEADER_LEN), 0);
    let mut gathered = io::Read::read_exact(&mut reader, request);
    if gathered.is_ok() && gather > IN_HEADER_LEN {
        let head = match InHeader::parse(request) {
            Some(h) if framed && h.opcode == sluice_fuse::abi::opcode::WRITE => {
                gather.min(WRITE_HEAD_LEN)
            }
            _ => gather,
        };
        request.resize(head, 0);
        gathered = io::Read::read_exact(&mut reader, &mut request[IN_HEADER_LEN..]);
    }
    if let Err(e) = gathered {
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
    // What is left to read is a WRITE's data (nothing, for other requests).
    if let Err(e) = handler.handle(queue, request, &mut reader, &mut reply) {
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
    use sluice_api::source::WriteSource;
    use vhost_user_backend::VringRwLock;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

    use super::*;

    const QSIZE: u16 = 16;
    const DESC: u64 = 0x0;
    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;
    /// Where the used ring's `avail_event` lives.
    const AVAIL_EVENT: u64 = USED + 4 + 8 * QSIZE as u64;

    /// Answers with an empty reply, but only where it may wait; keeps the
    /// data it was handed.
    #[derive(Default)]
    struct Slow {
        taken: std::sync::Mutex<Vec<Vec<u8>>>,
    }

    impl RequestHandler for Slow {
        fn handle(
            &self,
            _q: u16,
            req: &[u8],
            data: &mut dyn WriteSource,
            reply: &mut Writer<'_>,
        ) -> io::Result<()> {
            if sluice_api::wait::mode() == sluice_api::wait::Mode::NoWait {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut bytes = Vec::new();
            data.take_append(&mut bytes, data.len())
                .map_err(io::Error::other)?;
            self.taken.lock().unwrap().push(bytes);
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
        waiters: Arc<Waiters>,
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
            handler: Arc::new(Slow::default()),
            stats: vec![QueueStats::default()].into(),
            all: vec![parked.clone()],
            parked,
            waiters: Arc::new(Waiters::start("vfs-wait", 2).unwrap()),
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

    /// A WRITE handed on to a waiter carries its data: the waiter reads it
    /// again from the chain's descriptors, past the header and arguments
    /// the worker gathered. (The dispatcher hands a WRITE on when it would
    /// start a commit while the file's last one still runs, or find the
    /// write memory short.)
    #[test]
    fn a_write_handed_on_carries_its_data() {
        let r = rig();
        let ctx = r.ctx(4);
        let mut state = WorkerState::default();
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut msg = Vec::new();
        let len = (80 + data.len()) as u32;
        msg.extend_from_slice(&len.to_le_bytes());
        msg.extend_from_slice(&sluice_fuse::abi::opcode::WRITE.to_le_bytes());
        msg.extend_from_slice(&9u64.to_le_bytes());
        msg.extend_from_slice(&[0u8; 24]);
        msg.extend_from_slice(&[0u8; 16]); // fh, offset
        msg.extend_from_slice(&(data.len() as u32).to_le_bytes());
        msg.extend_from_slice(&[0u8; 20]);
        msg.extend_from_slice(&data);
        // Three readable pieces, cut inside `fuse_write_in` and inside the
        // data, then the reply's room.
        let pieces = [
            (0x3000u64, 0..50),
            (0x5000, 50..1000),
            (0x9000, 1000..msg.len()),
        ];
        let desc = |n: u16, addr: u64, len: usize, flags: u16, next: u16| {
            let mut e = [0u8; 16];
            e[0..8].copy_from_slice(&addr.to_le_bytes());
            e[8..12].copy_from_slice(&(len as u32).to_le_bytes());
            e[12..14].copy_from_slice(&flags.to_le_bytes());
            e[14..16].copy_from_slice(&next.to_le_bytes());
            r.mmap
                .write_slice(&e, GuestAddress(DESC + 16 * u64::from(n)))
                .unwrap();
        };
        for (n, (addr, range)) in pieces.iter().enumerate() {
            r.mmap
                .write_slice(&msg[range.clone()], GuestAddress(*addr))
                .unwrap();
            desc(n as u16, *addr, range.len(), 1, n as u16 + 1);
        }
        desc(3, 0xc000, 256, 2, 0);
        r.mmap.write_obj(0u16, GuestAddress(AVAIL + 4)).unwrap();
        r.mmap.write_obj(1u16, GuestAddress(AVAIL + 2)).unwrap();
        process_queue(&ctx, &mut state).unwrap();
        while readable(r.parked.event_fd(), 2000) {
            process_queue(&ctx, &mut state).unwrap();
        }
        let used: u16 = r.mmap.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(used, 1, "answered");
        assert_eq!(sluice_metrics::get(&r.stats[0].handed_on), 1);
        assert!(state.request.len() <= 80, "the worker gathered the data");
        let taken = r.handler.taken.lock().unwrap();
        assert_eq!(taken.len(), 1);
        assert!(taken[0] == data, "the waiter's data differs");
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

/// WRITE decoded in place: the worker reads a WRITE's header and
/// `fuse_write_in` into host memory and the file system takes the data
/// from the guest's descriptors, however they split it.
#[cfg(test)]
mod write_tests {
    use std::sync::Mutex;

    use sluice_api::meta::{
        Attr, Context, CopyRange, Entry, Ino, RenameFlags, SetAttr, StatFs, XattrMode,
    };
    use sluice_api::source::WriteSource;
    use sluice_api::{Error, Fh, Filesystem, Listed, OpenOut, Result};
    use sluice_fuse::{Config, Dispatcher};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::*;
    use crate::FuseHandler;

    /// Where the request pieces go, and the reply.
    const PIECES: u64 = 0x1_0000;
    const REPLY: u64 = 0xf_0000;
    const MAX_WRITE: u32 = 8192;

    /// One write a file system was given: node, handle, offset, the
    /// bytes, kill_suidgid.
    type Written = (Ino, Fh, u64, Vec<u8>, bool);

    /// A file system that keeps every write it is given and refuses the
    /// rest.
    #[derive(Default)]
    struct Recorder {
        writes: Mutex<Vec<Written>>,
    }

    fn no<T>() -> Result<T> {
        Err(Error::NotSupported("a test file system".into()))
    }

    impl Filesystem for Recorder {
        fn init(&self) -> Result<()> {
            Ok(())
        }
        fn destroy(&self) {}
        fn lookup(&self, _: &Context, _: Ino, _: &[u8]) -> Result<Entry> {
            no()
        }
        fn forget(&self, _: Ino, _: u64) {}
        fn getattr(&self, _: &Context, _: Ino) -> Result<Attr> {
            no()
        }
        fn setattr(
            &self,
            _: &Context,
            _: Ino,
            _: Option<Fh>,
            _: &SetAttr,
            _: Option<u64>,
        ) -> Result<Attr> {
            no()
        }
        fn readlink(&self, _: &Context, _: Ino) -> Result<Vec<u8>> {
            no()
        }
        fn mknod(&self, _: &Context, _: Ino, _: &[u8], _: u32, _: u32, _: u32) -> Result<Entry> {
            no()
        }
        fn mkdir(&self, _: &Context, _: Ino, _: &[u8], _: u32, _: u32) -> Result<Entry> {
            no()
        }
        fn unlink(&self, _: &Context, _: Ino, _: &[u8]) -> Result<()> {
            no()
        }
        fn rmdir(&self, _: &Context, _: Ino, _: &[u8]) -> Result<()> {
            no()
        }
        fn symlink(&self, _: &Context, _: Ino, _: &[u8], _: &[u8]) -> Result<Entry> {
            no()
        }
        fn rename(
            &self,
            _: &Context,
            _: Ino,
            _: &[u8],
            _: Ino,
            _: &[u8],
            _: RenameFlags,
        ) -> Result<()> {
            no()
        }
        fn link(&self, _: &Context, _: Ino, _: Ino, _: &[u8]) -> Result<Entry> {
            no()
        }
        fn open(&self, _: &Context, _: Ino, _: u32) -> Result<OpenOut> {
            no()
        }
        fn create(
            &self,
            _: &Context,
            _: Ino,
            _: &[u8],
            _: u32,
            _: u32,
            _: u32,
        ) -> Result<(Entry, OpenOut)> {
            no()
        }
        fn read(
            &self,
            _: &Context,
            _: Ino,
            _: Fh,
            _: u64,
            _: usize,
            _: &mut dyn sluice_api::ReadDest,
        ) -> Result<usize> {
            no()
        }
        fn write(
            &self,
            _: &Context,
            ino: Ino,
            fh: Fh,
            offset: u64,
            data: &mut dyn WriteSource,
            kill: bool,
        ) -> Result<usize> {
            // In two takes, the way the engine fills a block it has part of.
            let mut bytes = vec![0u8; data.len() / 3];
            data.take(&mut bytes)?;
            data.take_append(&mut bytes, data.len())?;
            let n = bytes.len();
            self.writes
                .lock()
                .unwrap()
                .push((ino, fh, offset, bytes, kill));
            Ok(n)
        }
        fn flush(&self, _: &Context, _: Ino, _: Fh) -> Result<()> {
            no()
        }
        fn release(&self, _: &Context, _: Ino, _: Fh) -> Result<()> {
            no()
        }
        fn fsync(&self, _: &Context, _: Ino, _: Fh, _: bool) -> Result<()> {
            no()
        }
        fn opendir(&self, _: &Context, _: Ino) -> Result<Fh> {
            no()
        }
        fn readdir(
            &self,
            _: &Context,
            _: Ino,
            _: Fh,
            _: u64,
            _: bool,
            _: &mut dyn FnMut(&Entry, Listed) -> bool,
        ) -> Result<()> {
            no()
        }
        fn releasedir(&self, _: &Context, _: Ino, _: Fh) -> Result<()> {
            no()
        }
        fn fsyncdir(&self, _: &Context, _: Ino, _: Fh, _: bool) -> Result<()> {
            no()
        }
        fn statfs(&self, _: &Context, _: Ino) -> Result<StatFs> {
            no()
        }
        fn setxattr(&self, _: &Context, _: Ino, _: &[u8], _: &[u8], _: XattrMode) -> Result<()> {
            no()
        }
        fn getxattr(&self, _: &Context, _: Ino, _: &[u8]) -> Result<Vec<u8>> {
            no()
        }
        fn listxattr(&self, _: &Context, _: Ino) -> Result<Vec<Vec<u8>>> {
            no()
        }
        fn removexattr(&self, _: &Context, _: Ino, _: &[u8]) -> Result<()> {
            no()
        }
        fn access(&self, _: &Context, _: Ino, _: u32) -> Result<()> {
            no()
        }
        fn fallocate(&self, _: &Context, _: Ino, _: Fh, _: u32, _: u64, _: u64) -> Result<()> {
            no()
        }
        fn lseek(&self, _: &Context, _: Ino, _: Fh, _: u64, _: u32) -> Result<u64> {
            no()
        }
        fn copy_file_range(&self, _: &Context, _: &CopyRange, _: Fh, _: Fh) -> Result<u64> {
            no()
        }
    }

    /// A FUSE message: the header (its `len` = `len`, or the real length),
    /// then `body`.
    fn message(opcode: u32, unique: u64, len: Option<u32>, body: &[u8]) -> Vec<u8> {
        let real = (IN_HEADER_LEN + body.len()) as u32;
        let mut m = Vec::new();
        m.extend_from_slice(&len.unwrap_or(real).to_le_bytes());
        m.extend_from_slice(&opcode.to_le_bytes());
        m.extend_from_slice(&unique.to_le_bytes());
        m.extend_from_slice(&5u64.to_le_bytes()); // node
        m.extend_from_slice(&[0u8; 16]); // uid, gid, pid, extlen, padding
        m.extend_from_slice(body);
        m
    }

    /// A WRITE of `data` at `offset` on handle 4, declaring `size` bytes.
    fn write_msg(unique: u64, offset: u64, size: u32, len: Option<u32>, data: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&4u64.to_le_bytes()); // fh
        body.extend_from_slice(&offset.to_le_bytes());
        body.extend_from_slice(&size.to_le_bytes());
        body.extend_from_slice(&sluice_fuse::abi::WRITE_KILL_SUIDGID.to_le_bytes());
        body.extend_from_slice(&[0u8; 16]); // lock owner, flags, padding
        assert_eq!(body.len() + IN_HEADER_LEN, WRITE_HEAD_LEN);
        body.extend_from_slice(data);
        message(sluice_fuse::abi::opcode::WRITE, unique, len, &body)
    }

    struct Rig {
        mem: Arc<GuestMemoryMmap>,
        stats: QueueStats,
        handler: FuseHandler<Recorder>,
    }

    impl Rig {
        fn new() -> Rig {
            let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
            let config = Config {
                max_write: MAX_WRITE,
                ..Config::default()
            };
            let rig = Rig {
                mem: Arc::new(mem),
                stats: QueueStats::default(),
                handler: FuseHandler::new(Dispatcher::new(Recorder::default(), config)),
            };
            let mut init = Vec::new();
            for v in [7u32, 38, 1 << 17, 0] {
                init.extend_from_slice(&v.to_le_bytes());
            }
            let (errno, _) = rig.send(&message(26, 1, None, &init), &[]);
            assert_eq!(errno, 0, "INIT");
            rig
        }

        /// Sends `msg` cut into readable descriptors of the lengths in
        /// `cuts` (the rest in one last descriptor), each at its own place
        /// with gaps between; returns the reply's errno and its length.
        fn send(&self, msg: &[u8], cuts: &[usize]) -> (i32, u32) {
            let mut readable = Vec::new();
            let mut at = PIECES;
            let mut rest = msg;
            for &cut in cuts.iter().chain(std::iter::once(&usize::MAX)) {
                let (piece, tail) = rest.split_at(cut.min(rest.len()));
                if !piece.is_empty() {
                    self.mem.write_slice(piece, GuestAddress(at)).unwrap();
                    readable.push((at, piece.len()));
                    at += piece.len() as u64 + 0x41;
                }
                rest = tail;
            }
            let buffers = ChainBuffers::for_test(&readable, &[(REPLY, 256)]);
            let route = GuestIoRoute {
                table: &self.mem,
                mode: GuestIoMode::Pread,
                stats: &self.stats,
                waiter: false,
                wake: None,
            };
            let limits = Limits {
                max_request_size: (MAX_WRITE as usize) * 2,
                batch: 16,
                guest_io: GuestIoMode::Pread,
                max_waiting: 0,
            };
            let mut request = Vec::new();
            let used = frame_and_handle(
                1,
                route,
                &buffers,
                None,
                limits,
                &self.handler,
                &mut request,
                &|| {},
            )
            .expect("answered on the worker");
            let mut reply = [0u8; 16];
            self.mem
                .read_slice(&mut reply, GuestAddress(REPLY))
                .unwrap();
            let errno = -i32::from_le_bytes(reply[4..8].try_into().unwrap());
            (errno, used)
        }

        fn writes(&self) -> Vec<Written> {
            let fs = self.handler.dispatcher().filesystem();
            std::mem::take(&mut *fs.writes.lock().unwrap())
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn a_write_split_across_descriptors_arrives_byte_exact() {
        let rig = Rig::new();
        let data = pattern(5000);
        let msg = write_msg(2, 12345, 5000, None, &data);
        let cases: Vec<Vec<usize>> = vec![
            // Header and arguments in one, the data in another (the Linux
            // driver's layout).
            vec![WRITE_HEAD_LEN],
            // All in one descriptor.
            vec![],
            // A boundary inside the header, one inside `fuse_write_in`,
            // data from the same descriptor as its tail.
            vec![17, 40, 10, 100, 4000],
            // The data in many small descriptors.
            std::iter::once(WRITE_HEAD_LEN)
                .chain((0..400).map(|i| 1 + i % 13))
                .collect(),
        ];
        for cuts in cases {
            let (errno, used) = rig.send(&msg, &cuts);
            assert_eq!((errno, used), (0, 24), "cuts {cuts:?}");
            let writes = rig.writes();
            assert_eq!(writes.len(), 1, "cuts {cuts:?}");
            let (ino, fh, off, bytes, kill) = &writes[0];
            assert_eq!((*ino, *fh, *off, *kill), (5, 4, 12345, true));
            assert!(*bytes == data, "cuts {cuts:?}: the data differs");
        }
        let mut written = [0u8; 4];
        rig.mem
            .read_slice(&mut written, GuestAddress(REPLY + 16))
            .unwrap();
        assert_eq!(u32::from_le_bytes(written), 5000, "fuse_write_out.size");
    }

    #[test]
    fn a_write_whose_lengths_lie_writes_nothing() {
        let rig = Rig::new();
        let data = pattern(300);
        let real = (WRITE_HEAD_LEN + data.len()) as u32;
        let cases = [
            // The header's length says more, or less, than the chain holds.
            (write_msg(3, 0, 300, Some(real + 1), &data), libc::EINVAL),
            (write_msg(4, 0, 300, Some(real - 1), &data), libc::EINVAL),
            // `fuse_write_in.size` disagrees with the data.
            (write_msg(5, 0, 301, None, &data), libc::EINVAL),
            (write_msg(6, 0, 299, None, &data), libc::EINVAL),
            (write_msg(7, 0, u32::MAX, None, &data), libc::EINVAL),
            // Cut short inside `fuse_write_in`.
            (
                write_msg(8, 0, 0, Some(60), &[])[..60].to_vec(),
                libc::EINVAL,
            ),
        ];
        for (msg, want) in &cases {
            for cuts in [&[][..], &[WRITE_HEAD_LEN][..], &[20, 30, 41, 2][..]] {
                let (errno, used) = rig.send(msg, cuts);
                assert_eq!((errno, used), (*want, 16), "cuts {cuts:?}");
            }
        }
        assert!(rig.writes().is_empty(), "a bad WRITE wrote");
    }

    #[test]
    fn a_write_past_max_write_writes_nothing() {
        let rig = Rig::new();
        let size = MAX_WRITE as usize + 1;
        let msg = write_msg(9, 0, size as u32, None, &pattern(size));
        for cuts in [&[][..], &[WRITE_HEAD_LEN][..], &[50, 4000][..]] {
            let (errno, used) = rig.send(&msg, cuts);
            assert_eq!((errno, used), (libc::EINVAL, 16), "cuts {cuts:?}");
        }
        // Past the device's request size limit: refused before decoding.
        let size = 2 * MAX_WRITE as usize;
        let msg = write_msg(10, 0, size as u32, None, &pattern(size));
        assert_eq!(rig.send(&msg, &[WRITE_HEAD_LEN]), (libc::E2BIG, 16));
        assert!(rig.writes().is_empty(), "an oversized WRITE wrote");
        // A write of exactly max_write is fine.
        let size = MAX_WRITE as usize;
        let data = pattern(size);
        let msg = write_msg(11, 0, size as u32, None, &data);
        assert_eq!(rig.send(&msg, &[WRITE_HEAD_LEN, 1]), (0, 24));
        assert!(rig.writes()[0].3 == data);
    }
}
