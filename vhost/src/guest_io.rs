//! READ data from local files read by the kernel straight into guest memory
//! through the queue worker's io_uring ring.
//!
//! When the engine answers a READ from a local file (a block object of a
//! `file://` store, a disk-cache file), the [`Writer`](crate::Writer) asks
//! this module to read it into the guest's buffers. Each worker thread keeps
//! one context in a thread local (a [`Reactor`] is not `Send` and must live on
//! the thread that submits to it), created at its first such READ:
//!
//! * the guest's memory regions are registered with the ring as fixed buffers
//!   (the kernel pins them; pieces of at most 1 GiB);
//! * the file is registered in the ring's file table, once per (device, inode)
//!   for the last [`FILE_CACHE`] files;
//! * each guest buffer piece becomes one `READ_FIXED` (split where it crosses
//!   a 1 GiB fixed-buffer boundary); a piece whose file offset, length and
//!   guest address meet the file system's O_DIRECT alignment is read through a
//!   second, O_DIRECT descriptor of the same file (the device writes into
//!   guest memory, no CPU copy), any other piece through the page cache (one
//!   kernel copy);
//! * on a worker that must not wait (the device has waiters), the reads are
//!   queued for the chain being answered ([`queue_into`]) and not waited
//!   for: the worker parks the chain ([`take_current`], [`park`]), submits
//!   the batch's reads at its end, and the ring signals the queue's
//!   completion eventfd as they complete ([`submit_and_reap`] collects
//!   them). A read that fails or comes back short sends the request to a
//!   waiter, which answers it again with `pread`;
//! * on a worker that may wait (`--max-waiting 0`) all pieces are submitted
//!   together and waited for before the writer returns ([`read_into`]). A
//!   piece that comes back short (an O_DIRECT read stops at end of file) or
//!   fails is finished with `pread`, which also reports a file that is
//!   really too short.
//!
//! The context keeps the `Arc` of the memory table it registered: while it is
//! registered, its mappings cannot go away. A READ on a different table (after
//! SET_MEM_TABLE, ADD_MEM_REG or REM_MEM_REG) re-registers first, and the
//! worker drops a stale registration at the start of its next batch
//! ([`release_stale`]), so a removed region stays mapped at most until then.
//!
//! Where the ring cannot be used — `--guest-io pread`, `SLUICE_IO_BACKEND=threads`,
//! io_uring unavailable (old kernel, `io_uring_disabled`, qemu-user), guest
//! memory the kernel refuses to pin — the writer falls back to one `pread` per
//! guest buffer piece, and the reason is logged once.

use std::cell::RefCell;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use log::{debug, info, warn};
use sluice_numa::reactor::{
    BackendChoice, BufferId, DirectAlign, Event, FileSlot, MAX_BUFFERS, RegionHandle, direct_align,
    open_direct,
};
use sluice_numa::{BackendKind, Reactor, ReactorConfig};
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress,
};

use crate::worker::QueueStats;

/// Files kept registered per worker, most recently read last. As many as a
/// queue holds chains by default (`--max-waiting`): a file with reads in
/// flight is never evicted, and with 16 half of the cold 4 KiB READs of a
/// benchmark at depth 32 found every slot busy and went to a waiter.
pub const FILE_CACHE: usize = 64;

/// How READ data from local files reaches guest memory (`sluice serve
/// --guest-io`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GuestIoMode {
    /// io_uring reads into the guest's memory registered as fixed buffers,
    /// O_DIRECT where the request is aligned; `pread` where io_uring cannot
    /// be used. Registering pins the guest's memory.
    Uring,
    /// One `pread` per guest buffer piece (one kernel copy, as virtiofsd
    /// does); guest memory is never pinned. The default: measured faster for
    /// the small reads that reach local files (see docs/tuning.md).
    #[default]
    Pread,
    /// What the page cache holds is read by the queue's worker with `pread`
    /// (one kernel copy); the rest — what a waiter reads — goes from the
    /// disk straight into guest memory with O_DIRECT where the piece is
    /// aligned (no CPU copy, the page cache left alone), `pread` for the
    /// unaligned edges. Guest memory is pinned only for each read's length,
    /// as any O_DIRECT read pins its buffer.
    Direct,
}

impl fmt::Display for GuestIoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GuestIoMode::Uring => "uring",
            GuestIoMode::Pread => "pread",
            GuestIoMode::Direct => "direct",
        })
    }
}

/// The guest I/O path must be "uring", "pread" or "direct".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the guest I/O path must be \"uring\", \"pread\" or \"direct\", not {0:?}")]
pub struct ParseGuestIoModeError(pub String);

impl FromStr for GuestIoMode {
    type Err = ParseGuestIoModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "uring" | "io_uring" => Ok(GuestIoMode::Uring),
            "pread" => Ok(GuestIoMode::Pread),
            "direct" | "o_direct" => Ok(GuestIoMode::Direct),
            other => Err(ParseGuestIoModeError(other.to_string())),
        }
    }
}

/// What a [`Writer`](crate::Writer) needs to read files into guest memory
/// through the worker's ring: the memory table it writes into (as an `Arc`,
/// so that a registration can keep it alive), the mode and the counters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GuestIoRoute<'a> {
    pub table: &'a Arc<GuestMemoryMmap>,
    pub mode: GuestIoMode,
    pub stats: &'a QueueStats,
    /// Whether a waiter is reading (a read the page cache could not serve
    /// on the worker): with [`GuestIoMode::Direct`] or
    /// [`GuestIoMode::Uring`], aligned pieces go O_DIRECT ([`DirectReader`]).
    pub waiter: bool,
    /// The queue's completion eventfd, which the worker polls: a worker
    /// that must not wait queues its reads on its ring ([`queue_into`]) and
    /// the ring signals this when they complete. `None` on a waiter.
    pub wake: Option<RawFd>,
}

thread_local! {
    static CONTEXT: RefCell<Context> = const { RefCell::new(Context::Unstarted) };
}

enum Context {
    Unstarted,
    Ready(Box<GuestIo>),
    /// This thread has no io_uring ring; every READ goes through `pread`.
    Unavailable,
}

/// Logged once per process, not once per worker or per READ.
static SAID_UNAVAILABLE: AtomicBool = AtomicBool::new(false);
static SAID_UNREGISTRABLE: AtomicBool = AtomicBool::new(false);
static SAID_FILE_REFUSED: AtomicBool = AtomicBool::new(false);
static SAID_QUEUE_FAILED: AtomicBool = AtomicBool::new(false);

fn say_once(flag: &AtomicBool, message: impl FnOnce() -> String) {
    if !flag.swap(true, Ordering::Relaxed) {
        warn!(
            "{}; guest READs of local files fall back to pread",
            message()
        );
    }
}

/// Reads the bytes of `file` from `offset` into the guest buffers `pieces`,
/// in order, through this thread's ring.
///
/// Returns `Ok(false)` without having read anything the caller relies on
/// when this path cannot serve (no ring, memory the kernel would not register,
/// a piece straddling two memory regions): the caller then reads with
/// `pread`, overwriting whatever was placed. A file shorter than asked for is
/// an `UnexpectedEof` error.
pub(crate) fn read_into(
    route: GuestIoRoute<'_>,
    file: &File,
    offset: u64,
    pieces: &[(GuestAddress, usize)],
) -> io::Result<bool> {
    with_io(true, Ok(false), |io| io.read(route, file, offset, pieces))
}

/// Queues reads of the bytes of `file` from `offset` into the guest buffers
/// `pieces` on this thread's ring, for the chain being answered, without
/// waiting for them: the worker parks the chain ([`take_current`],
/// [`park`]) and publishes it when they are done. The ring signals
/// `route.wake` as they complete.
///
/// Returns `Ok(false)` when the ring cannot take them (no ring, no wake-up
/// eventfd, memory the kernel would not register, a piece straddling two
/// memory regions, every registered file busy); reads queued for the chain
/// before that still count, and the chain still waits for them.
pub(crate) fn queue_into(
    route: GuestIoRoute<'_>,
    file: &File,
    offset: u64,
    pieces: &[(GuestAddress, usize)],
) -> io::Result<bool> {
    with_io(true, Ok(false), |io| io.queue(route, file, offset, pieces))
}

/// The chain being answered has reads queued on this thread's ring: it must
/// be [`park`]ed, whatever its answer, and not given back to the guest (nor
/// handed on) until they are done. Resets the chain being answered.
pub(crate) fn take_current() -> Option<RingTicket> {
    with_io(false, None, |io| io.current.take().map(RingTicket))
}

/// Leaves the chain of `ticket` to `then`, which runs on this thread once
/// every read queued for it is done (at once when they already are), from
/// [`submit_and_reap`], [`drain`], a memory table change or the end of the
/// thread.
pub(crate) fn park(ticket: RingTicket, then: RingDone) {
    let mut then = Some(then);
    with_io(false, (), |io| {
        if let Some(then) = then.take() {
            io.park(ticket.0, then);
        }
    });
    if then.is_some() {
        // Unreachable: the ticket came from this thread's context, which
        // lives as long as the thread and is never borrowed across a call.
        log::error!("a chain with reads on the ring could not be parked; it is lost");
    }
}

/// Hands the reads queued in this batch to the kernel and runs the `then`
/// of every parked chain whose reads are done, without waiting. The worker
/// calls it after each batch and on every completion wake-up (after
/// resetting the eventfd the ring signals, so that no completion goes
/// unnoticed).
pub(crate) fn submit_and_reap() {
    with_io(false, (), GuestIo::submit_and_reap);
}

/// Waits until every read on this thread's ring is done and runs the
/// `then` of their chains (DESTROY: every chain must be answered first).
pub(crate) fn drain() {
    with_io(false, (), GuestIo::drain_all);
}

/// Drops this thread's registration of guest memory if it is not `current`:
/// the frontend changed the memory table, and the old mappings should go as
/// soon as no batch uses them any more. Waits for reads in flight into the
/// old table first.
pub(crate) fn release_stale(current: &Arc<GuestMemoryMmap>) {
    with_io(false, (), |io| {
        if io
            .registered
            .as_ref()
            .is_some_and(|r| !Arc::ptr_eq(&r.table, current))
        {
            io.unregister_memory();
        }
    });
}

/// Runs `f` on this thread's context (started first when `start`; `default`
/// where there is none), then the `then` of every chain whose reads finished
/// meanwhile, once the context is let go: they may hand the chain to a
/// waiter, and nothing they do comes back here.
fn with_io<T>(start: bool, default: T, f: impl FnOnce(&mut GuestIo) -> T) -> T {
    let (out, finished) = CONTEXT.with(|cell| {
        // Never nested on one thread (a `then` runs after the borrow ends);
        // a busy cell would be a bug, and the callers' fallbacks are correct.
        let Ok(mut context) = cell.try_borrow_mut() else {
            return (default, Vec::new());
        };
        if start && let Context::Unstarted = *context {
            *context = GuestIo::start().map_or(Context::Unavailable, Context::Ready);
        }
        match &mut *context {
            Context::Ready(io) => {
                let out = f(io);
                (out, std::mem::take(&mut io.finished))
            }
            _ => (default, Vec::new()),
        }
    });
    for (then, outcome) in finished {
        then(outcome);
    }
    out
}

/// The number of `cachestat(2)`: the same on every Linux architecture
/// (it came after the syscall tables were unified); the libc crate names it
/// for only a few. The sandbox's seccomp allowlist lets it through.
pub const SYS_CACHESTAT: libc::c_long = 451;

/// Whether every page of `file` in `[off, off + len)` is in the page cache,
/// asked with `cachestat(2)` (Linux 6.5), which unlike a `RWF_NOWAIT` read
/// that misses starts no readahead: a range the ring then reads with
/// O_DIRECT is not read from the disk twice. `None` where the kernel (or
/// the sandbox) does not offer it.
pub(crate) fn cached(file: &File, off: u64, len: usize) -> Option<bool> {
    static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    if UNSUPPORTED.load(Ordering::Relaxed) || len == 0 {
        return None;
    }
    let range = Range {
        off,
        len: len as u64,
    };
    let mut stat = Stat::default();
    // SAFETY: both structs are live, laid out as the kernel's
    // `cachestat_range` and `cachestat`; the kernel reads one and writes the
    // other, nothing else.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &raw const range,
            &raw mut stat,
            0u32,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
            UNSUPPORTED.store(true, Ordering::Relaxed);
            debug!("no cachestat ({e}): a READ tries the page cache with RWF_NOWAIT first");
        }
        return None;
    }
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096);
    let pages = (off + len as u64).div_ceil(page) - off / page;
    Some(stat.nr_cache >= pages)
}

/// What came of a parked chain's reads, handed to its [`RingDone`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingOutcome {
    /// Every read came back in full. When one failed or came back short the
    /// chain's reply cannot be trusted: the worker hands the request to a
    /// waiter, which answers it again with `pread`.
    pub complete: bool,
    /// Bytes read through the page cache (the kernel copied them).
    pub fixed: u64,
    /// Bytes read with O_DIRECT (the device wrote them, no CPU copy).
    pub direct: u64,
}

/// What the worker does with a parked chain once its reads are done.
pub(crate) type RingDone = Box<dyn FnOnce(RingOutcome)>;

/// A chain with reads queued on this thread's ring ([`take_current`]).
#[derive(Debug)]
pub(crate) struct RingTicket(usize);

/// A chain with reads on the ring.
struct RingChain {
    /// Reads queued or in flight.
    pending: usize,
    outcome: RingOutcome,
    /// Set when the worker parks the chain; `None` while it is answered.
    then: Option<RingDone>,
}

/// One read on the ring for a chain.
struct Ticket {
    chain: usize,
    len: usize,
    direct: bool,
}

/// Puts `value` in a free slot of `slots` (one listed in `free`, else a new
/// one) and returns its index.
fn slab_insert<T>(slots: &mut Vec<Option<T>>, free: &mut Vec<usize>, value: T) -> usize {
    match free.pop() {
        Some(i) => {
            slots[i] = Some(value);
            i
        }
        None => {
            slots.push(Some(value));
            slots.len() - 1
        }
    }
}

/// Tokens of [`read_into`]'s reads, which wait in place, carry this bit;
/// the others index [`GuestIo::tickets`].
const SYNC: u64 = 1 << 63;

/// One worker thread's ring with the guest memory and recent files registered.
///
/// Field order is drop order: the ring goes (and waits for anything in
/// flight) before the memory table whose mappings it points into. Its
/// `Drop` first waits for the reads of parked chains and runs their `then`.
struct GuestIo {
    reactor: Reactor,
    files: Vec<CachedFile>,
    events: Vec<Event<()>>,
    ops: Vec<Op>,
    registered: Option<Registered>,
    /// Parked chains (and the one being answered), by [`RingTicket`].
    chains: Vec<Option<RingChain>>,
    free_chains: Vec<usize>,
    /// Reads on the ring for chains, by token.
    tickets: Vec<Option<Ticket>>,
    free_tickets: Vec<usize>,
    /// The chain being answered, once it has queued a read.
    current: Option<usize>,
    /// Chains whose reads are done, to hand to their `then` once the
    /// context is let go.
    finished: Vec<(RingDone, RingOutcome)>,
    /// The eventfd registered with the ring (the queue's completion event).
    wake: Option<RawFd>,
}

impl Drop for GuestIo {
    fn drop(&mut self) {
        // The connection is ending (the worker thread exits): the reads of
        // parked chains finish into mappings `registered` keeps alive, and
        // each chain's `then` learns of it (a waiter may finish it; nobody
        // returns it to the guest).
        self.drain_all();
        for (then, outcome) in std::mem::take(&mut self.finished) {
            then(outcome);
        }
    }
}

/// The memory table registered with the ring.
struct Registered {
    /// (host address, length, fixed buffers) of each region, or `None` when
    /// the kernel refused to register this table (pread for it, no retry).
    regions: Option<Vec<(usize, usize, RegionHandle)>>,
    /// Kept alive so that the registered mappings stay mapped.
    table: Arc<GuestMemoryMmap>,
}

struct CachedFile {
    dev: u64,
    ino: u64,
    buffered: FileSlot,
    direct: Direct,
}

#[derive(Clone, Copy)]
enum Direct {
    Untried,
    Unsupported,
    Open { slot: FileSlot, align: DirectAlign },
}

/// One READ_FIXED of a guest buffer piece.
struct Op {
    ptr: *mut u8,
    len: usize,
    file_offset: u64,
    buffer: BufferId,
    buffer_offset: usize,
    direct: bool,
    result: Option<io::Result<usize>>,
}

impl GuestIo {
    fn start() -> Option<Box<GuestIo>> {
        let backend = match BackendChoice::from_env() {
            Ok(BackendChoice::Threads) => {
                say_once(&SAID_UNAVAILABLE, || {
                    "SLUICE_IO_BACKEND=threads asks for no io_uring".to_string()
                });
                return None;
            }
            Ok(choice) => choice,
            Err(e) => {
                say_once(&SAID_UNAVAILABLE, || e.to_string());
                return None;
            }
        };
        let config = ReactorConfig {
            backend,
            max_files: 2 * FILE_CACHE as u32,
            max_buffers: MAX_BUFFERS,
            pool_threads: 1,
            ..ReactorConfig::default()
        };
        let reactor = match Reactor::new(&config) {
            Ok(reactor) => reactor,
            Err(e) => {
                say_once(&SAID_UNAVAILABLE, || format!("no io_uring ring: {e}"));
                return None;
            }
        };
        if reactor.backend() != BackendKind::Uring {
            say_once(&SAID_UNAVAILABLE, || {
                format!("the reactor runs a {}", reactor.describe_backend())
            });
            return None;
        }
        debug!("guest I/O ring ready: {}", reactor.describe_backend());
        Some(Box::new(GuestIo {
            reactor,
            files: Vec::with_capacity(FILE_CACHE),
            events: Vec::new(),
            ops: Vec::new(),
            registered: None,
            chains: Vec::new(),
            free_chains: Vec::new(),
            tickets: Vec::new(),
            free_tickets: Vec::new(),
            current: None,
            finished: Vec::new(),
            wake: None,
        }))
    }

    /// [`queue_into`]'s work.
    fn queue(
        &mut self,
        route: GuestIoRoute<'_>,
        file: &File,
        offset: u64,
        pieces: &[(GuestAddress, usize)],
    ) -> io::Result<bool> {
        let Some(wake) = route.wake else {
            return Ok(false);
        };
        match self.wake {
            Some(registered) if registered == wake => {}
            // One worker thread serves one queue: a second eventfd would be
            // a bug; its chains go to the waiters instead.
            Some(_) => return Ok(false),
            None => {
                if let Err(e) = self.reactor.register_eventfd(wake) {
                    say_once(&SAID_QUEUE_FAILED, || {
                        format!("io_uring cannot signal the worker's eventfd: {e}")
                    });
                    return Ok(false);
                }
                self.wake = Some(wake);
            }
        }
        if !self.register_memory(route.table) || !self.plan(route.table, offset, pieces) {
            return Ok(false);
        }
        let (buffered, direct) = match self.file(file) {
            Ok(found) => found,
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock {
                    say_once(&SAID_FILE_REFUSED, || {
                        format!("io_uring refused to register a file: {e}")
                    });
                }
                return Ok(false);
            }
        };
        let direct = self.direct_for(file, direct);
        self.split_direct(direct.map(|(_, align)| align));
        let chain = match self.current {
            Some(chain) => chain,
            None => {
                let chain = RingChain {
                    pending: 0,
                    outcome: RingOutcome {
                        complete: true,
                        fixed: 0,
                        direct: 0,
                    },
                    then: None,
                };
                let id = slab_insert(&mut self.chains, &mut self.free_chains, chain);
                self.current = Some(id);
                id
            }
        };
        for i in 0..self.ops.len() {
            let op = &self.ops[i];
            let ticket = Ticket {
                chain,
                len: op.len,
                direct: op.direct,
            };
            let slot = match (op.direct, direct) {
                (true, Some((slot, _))) => slot,
                _ => buffered,
            };
            let (file_offset, buffer, buffer_offset, len) =
                (op.file_offset, op.buffer, op.buffer_offset, op.len);
            let token = slab_insert(&mut self.tickets, &mut self.free_tickets, ticket);
            if let Err(e) =
                self.reactor
                    .read_fixed(token as u64, slot, file_offset, buffer, buffer_offset, len)
            {
                self.tickets[token] = None;
                self.free_tickets.push(token);
                say_once(&SAID_QUEUE_FAILED, || {
                    format!("io_uring refused a read into guest memory: {e}")
                });
                return Ok(false);
            }
            if let Some(Some(c)) = self.chains.get_mut(chain) {
                c.pending += 1;
            }
        }
        Ok(true)
    }

    /// [`park`]'s work.
    fn park(&mut self, chain: usize, then: RingDone) {
        let Some(Some(c)) = self.chains.get_mut(chain) else {
            log::error!("parking an unknown chain on the ring");
            return;
        };
        if c.pending > 0 {
            c.then = Some(then);
            return;
        }
        let outcome = c.outcome;
        self.chains[chain] = None;
        self.free_chains.push(chain);
        self.finished.push((then, outcome));
    }

    fn submit_and_reap(&mut self) {
        if self.reactor.in_flight() == 0 {
            return;
        }
        if let Err(e) = self.reactor.poll(&mut self.events) {
            warn!("cannot submit or reap reads into guest memory: {e}");
        }
        self.route();
    }

    fn drain_all(&mut self) {
        if self.reactor.in_flight() == 0 {
            return;
        }
        if let Err(e) = self.reactor.drain(&mut self.events) {
            // As in `submit_and_wait`: the reads may land later; keep the
            // table mapped for good. Their chains stay parked.
            warn!("cannot wait for reads into guest memory: {e}");
            if let Some(registered) = &self.registered {
                std::mem::forget(Arc::clone(&registered.table));
            }
        }
        self.route();
    }

    /// Hands every collected completion to its read: a waited-for read of
    /// [`GuestIo::read`] gets its result, a parked chain's read counts
    /// towards its chain, and a chain with none left goes to `finished`.
    fn route(&mut self) {
        for event in self.events.drain(..) {
            let Event::Io(done) = event else { continue };
            if done.token & SYNC != 0 {
                if let Some(op) = usize::try_from(done.token & !SYNC)
                    .ok()
                    .and_then(|i| self.ops.get_mut(i))
                {
                    op.result = Some(done.result);
                }
                continue;
            }
            let Some(ticket) = usize::try_from(done.token)
                .ok()
                .and_then(|t| self.tickets.get_mut(t))
                .and_then(Option::take)
            else {
                warn!("a ring completion for no read ({})", done.token);
                continue;
            };
            self.free_tickets.push(done.token as usize);
            let Some(Some(chain)) = self.chains.get_mut(ticket.chain) else {
                continue;
            };
            chain.pending -= 1;
            match done.result {
                Ok(n) if n == ticket.len => {
                    if ticket.direct {
                        chain.outcome.direct += n as u64;
                    } else {
                        chain.outcome.fixed += n as u64;
                    }
                }
                _ => chain.outcome.complete = false,
            }
            if chain.pending == 0
                && let Some(then) = chain.then.take()
            {
                let outcome = chain.outcome;
                self.chains[ticket.chain] = None;
                self.free_chains.push(ticket.chain);
                self.finished.push((then, outcome));
            }
        }
    }

    fn read(
        &mut self,
        route: GuestIoRoute<'_>,
        file: &File,
        offset: u64,
        pieces: &[(GuestAddress, usize)],
    ) -> io::Result<bool> {
        if !self.register_memory(route.table) || !self.plan(route.table, offset, pieces) {
            return Ok(false);
        }
        let (buffered, direct) = match self.file(file) {
            Ok(found) => found,
            Err(e) => {
                say_once(&SAID_FILE_REFUSED, || {
                    format!("io_uring refused to register a file: {e}")
                });
                return Ok(false);
            }
        };
        let direct = self.direct_for(file, direct);
        self.split_direct(direct.map(|(_, align)| align));
        if !self.submit_and_wait(buffered, direct.map(|(slot, _)| slot))? {
            return Ok(false);
        }
        self.finish(route.stats, file)?;
        Ok(true)
    }

    /// Makes `table` the registered memory; false when it cannot be.
    fn register_memory(&mut self, table: &Arc<GuestMemoryMmap>) -> bool {
        if let Some(registered) = &self.registered
            && Arc::ptr_eq(&registered.table, table)
        {
            return registered.regions.is_some();
        }
        let ranges: Vec<(*mut u8, usize)> = table
            .iter()
            .filter_map(|region| {
                let host = region.get_host_address(MemoryRegionAddress(0)).ok()?;
                Some((host, usize::try_from(region.len()).ok()?))
            })
            .collect();
        // SAFETY: every range is a whole mapping of `table` (read/write guest
        // RAM), which stays mapped while `self.registered` holds its `Arc`:
        // until the regions are replaced or unregistered, which happens only
        // with no I/O in flight (`replace_regions` waits for every read,
        // a parked chain's too, first), or until the
        // ring is dropped first (field order of `GuestIo`). Guest memory is
        // only ever accessed through raw pointers and volatile slices, never
        // through Rust references.
        let replaced = unsafe { self.reactor.replace_regions(&ranges, &mut self.events) };
        self.route();
        let regions = match replaced {
            Ok(handles) => Some(
                ranges
                    .iter()
                    .zip(handles)
                    .map(|(&(host, len), handle)| (host as usize, len, handle))
                    .collect(),
            ),
            Err(e) => {
                say_once(&SAID_UNREGISTRABLE, || {
                    format!("guest memory cannot be registered with io_uring: {e}")
                });
                if !self.clear_regions() {
                    // Some region of either table may still be registered.
                    std::mem::forget(Arc::clone(table));
                    if let Some(old) = &self.registered {
                        std::mem::forget(Arc::clone(&old.table));
                    }
                }
                None
            }
        };
        info!(
            "guest memory table of {} region(s) {} with the worker's io_uring ring",
            ranges.len(),
            if regions.is_some() {
                "registered"
            } else {
                "not registered"
            }
        );
        let usable = regions.is_some();
        // The previous table's `Arc` goes only now, after its regions were
        // replaced.
        self.registered = Some(Registered {
            regions,
            table: Arc::clone(table),
        });
        usable
    }

    fn unregister_memory(&mut self) {
        let cleared = self.clear_regions();
        if let Some(old) = self.registered.take()
            && !cleared
        {
            // Its regions may still be registered: keep them mapped for good.
            std::mem::forget(old.table);
        }
    }

    /// Unregisters every region; false when the ring could not.
    fn clear_regions(&mut self) -> bool {
        // SAFETY: no new region is registered.
        let cleared = unsafe { self.reactor.replace_regions(&[], &mut self.events) };
        self.route();
        match cleared {
            Ok(_) => true,
            Err(e) => {
                warn!("cannot unregister guest memory from the io_uring ring: {e}");
                false
            }
        }
    }

    /// Turns the guest pieces into fixed-buffer reads in `self.ops`; false
    /// when a piece is not inside one registered region.
    fn plan(
        &mut self,
        table: &GuestMemoryMmap,
        offset: u64,
        pieces: &[(GuestAddress, usize)],
    ) -> bool {
        self.ops.clear();
        let Some(regions) = self.registered.as_ref().and_then(|r| r.regions.as_ref()) else {
            return false;
        };
        let mut file_offset = offset;
        for &(addr, len) in pieces {
            // `get_slice` refuses a piece that straddles two memory regions.
            let Ok(slice) = table.get_slice(addr, len) else {
                return false;
            };
            let host = slice.ptr_guard_mut().as_ptr();
            let Some((start, handle)) = regions
                .iter()
                .find(|&&(start, size, _)| {
                    (host as usize) >= start && (host as usize) - start + len <= size
                })
                .map(|(start, _, handle)| (*start, handle))
            else {
                return false;
            };
            let mut done = 0;
            while done < len {
                let at = host as usize - start + done;
                let Some(piece) = handle
                    .pieces()
                    .iter()
                    .find(|p| p.region_offset <= at && at < p.region_offset + p.len)
                else {
                    return false;
                };
                let n = (len - done).min(piece.region_offset + piece.len - at);
                let Some((buffer, buffer_offset)) = handle.locate(at, n) else {
                    return false;
                };
                let ptr = host.wrapping_add(done);
                let here = file_offset + done as u64;
                // Guest pages that follow each other in host memory and in
                // the file (the Linux driver gives a READ one descriptor per
                // page) are one read.
                if let Some(last) = self.ops.last_mut()
                    && last.buffer == buffer
                    && last.ptr.wrapping_add(last.len) == ptr
                    && last.buffer_offset + last.len == buffer_offset
                    && last.file_offset + last.len as u64 == here
                {
                    last.len += n;
                    done += n;
                    continue;
                }
                self.ops.push(Op {
                    ptr: host.wrapping_add(done),
                    len: n,
                    file_offset: file_offset + done as u64,
                    buffer,
                    buffer_offset,
                    direct: false,
                    result: None,
                });
                done += n;
            }
            file_offset += len as u64;
        }
        true
    }

    /// Marks the planned reads that go O_DIRECT with `align`: the aligned
    /// middle of each, split off from its unaligned head and tail, which go
    /// through the page cache.
    fn split_direct(&mut self, align: Option<DirectAlign>) {
        let Some(align) = align else { return };
        let (block, memory) = (align.offset as usize, align.memory as usize);
        let planned = std::mem::take(&mut self.ops);
        for op in planned {
            let head = (block - (op.file_offset % block as u64) as usize) % block;
            let middle = op.len.saturating_sub(head) / block * block;
            if middle == 0 || !(op.ptr as usize + head).is_multiple_of(memory) {
                self.ops.push(op);
                continue;
            }
            let mut at = 0;
            for (len, direct) in [
                (head, false),
                (middle, true),
                (op.len - head - middle, false),
            ] {
                if len > 0 {
                    self.ops.push(Op {
                        ptr: op.ptr.wrapping_add(at),
                        len,
                        file_offset: op.file_offset + at as u64,
                        buffer: op.buffer,
                        buffer_offset: op.buffer_offset + at,
                        direct,
                        result: None,
                    });
                }
                at += len;
            }
        }
    }

    /// Whether a registered file has reads queued or in flight.
    fn busy(&self, entry: &CachedFile) -> bool {
        self.reactor.file_busy(entry.buffered)
            || matches!(entry.direct, Direct::Open { slot, .. } if self.reactor.file_busy(slot))
    }

    /// The registered slot of `file` and what is known about its O_DIRECT
    /// twin, registering it (and evicting the least recent file with no
    /// read in flight) on a miss; `WouldBlock` when every one has.
    fn file(&mut self, file: &File) -> io::Result<(FileSlot, Direct)> {
        let meta = file.metadata()?;
        let (dev, ino) = (meta.dev(), meta.ino());
        if let Some(at) = self.files.iter().position(|f| f.dev == dev && f.ino == ino) {
            let entry = self.files.remove(at);
            let found = (entry.buffered, entry.direct);
            self.files.push(entry);
            return Ok(found);
        }
        if self.files.len() >= FILE_CACHE {
            let Some(idle) = self.files.iter().position(|f| !self.busy(f)) else {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "every registered file has reads in flight",
                ));
            };
            let old = self.files.remove(idle);
            self.forget_file(&old);
        }
        let slot = self
            .reactor
            .register_file(file.try_clone()?)
            .map_err(io::Error::other)?;
        self.files.push(CachedFile {
            dev,
            ino,
            buffered: slot,
            direct: Direct::Untried,
        });
        Ok((slot, Direct::Untried))
    }

    fn forget_file(&mut self, entry: &CachedFile) {
        let mut slots = vec![entry.buffered];
        if let Direct::Open { slot, .. } = entry.direct {
            slots.push(slot);
        }
        for slot in slots {
            if let Err(e) = self.reactor.unregister_file(slot) {
                warn!("cannot unregister a file from the io_uring ring: {e}");
            }
        }
    }

    /// The O_DIRECT descriptor of `file` when some planned read could use
    /// it, opening it through `/proc/self/fd` the first time.
    fn direct_for(&mut self, file: &File, known: Direct) -> Option<(FileSlot, DirectAlign)> {
        match known {
            Direct::Open { slot, align } => return Some((slot, align)),
            Direct::Unsupported => return None,
            Direct::Untried => {}
        }
        let guess = direct_align(file);
        let worth_it = self.ops.iter().any(|op| {
            let block = guess.offset as usize;
            let head = (block - (op.file_offset % block as u64) as usize) % block;
            op.len.saturating_sub(head) >= block
                && (op.ptr as usize + head).is_multiple_of(guess.memory as usize)
        });
        if !worth_it {
            return None;
        }
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let opened = open_direct(path.as_ref(), false)
            .map_err(|e| e.to_string())
            .and_then(|direct| {
                let slot = self
                    .reactor
                    .register_file(direct)
                    .map_err(|e| e.to_string())?;
                match self.reactor.file_direct_align(slot) {
                    Ok(Some(align)) => Ok((slot, align)),
                    _ => {
                        let _ = self.reactor.unregister_file(slot);
                        Err("the reopened file is not O_DIRECT".to_string())
                    }
                }
            });
        let state = match &opened {
            Ok((slot, align)) => Direct::Open {
                slot: *slot,
                align: *align,
            },
            Err(e) => {
                debug!("READs of this file go through the page cache: {e}");
                Direct::Unsupported
            }
        };
        if let Some(entry) = self.files.last_mut() {
            entry.direct = state;
        }
        opened.ok()
    }

    /// Queues every planned read, submits them and waits for all; false
    /// (after waiting for whatever was queued) when the ring refused one.
    fn submit_and_wait(
        &mut self,
        buffered: FileSlot,
        direct: Option<FileSlot>,
    ) -> io::Result<bool> {
        let mut queued = true;
        for (token, op) in self.ops.iter().enumerate() {
            let slot = match (op.direct, direct) {
                (true, Some(slot)) => slot,
                _ => buffered,
            };
            if let Err(e) = self.reactor.read_fixed(
                SYNC | token as u64,
                slot,
                op.file_offset,
                op.buffer,
                op.buffer_offset,
                op.len,
            ) {
                say_once(&SAID_QUEUE_FAILED, || {
                    format!("io_uring refused a read into guest memory: {e}")
                });
                queued = false;
                break;
            }
        }
        self.events.clear();
        if let Err(e) = self.reactor.drain(&mut self.events) {
            // The ring cannot be waited on: the reads may still land in guest
            // memory later. Keep the registered table mapped for good rather
            // than free anything they point into.
            warn!("cannot wait for reads into guest memory: {e}");
            if let Some(registered) = &self.registered {
                std::mem::forget(Arc::clone(&registered.table));
            }
            return Err(io::Error::other(format!(
                "cannot wait for reads into guest memory: {e}"
            )));
        }
        self.route();
        Ok(queued)
    }

    /// Checks every read, finishes short or failed ones with pread and counts
    /// the bytes by path.
    fn finish(&mut self, stats: &QueueStats, file: &File) -> io::Result<()> {
        let (mut fixed, mut direct, mut pread) = (0u64, 0u64, 0u64);
        let mut outcome = Ok(());
        for op in &self.ops {
            let got = match &op.result {
                Some(Ok(n)) => (*n).min(op.len),
                _ => 0,
            };
            if op.direct {
                direct += got as u64;
            } else {
                fixed += got as u64;
            }
            if got < op.len {
                // SAFETY: `op.ptr .. op.ptr + op.len` lies inside a region of
                // the registered table (checked in `plan`), which is mapped
                // while `self.registered` holds it; no read is in flight.
                let rest = unsafe {
                    pread_exact(
                        file,
                        op.ptr.wrapping_add(got),
                        op.len - got,
                        op.file_offset + got as u64,
                    )
                };
                match rest {
                    Ok(()) => pread += (op.len - got) as u64,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
        }
        stats
            .guest_io_fixed_bytes
            .fetch_add(fixed, Ordering::Relaxed);
        stats
            .guest_io_direct_bytes
            .fetch_add(direct, Ordering::Relaxed);
        stats
            .guest_io_pread_bytes
            .fetch_add(pread, Ordering::Relaxed);
        outcome
    }
}

/// A local file read into guest memory by a waiter: the aligned middle of
/// each piece through an O_DIRECT twin of the file (reopened through
/// `/proc/self/fd` at the first aligned piece), the edges and anything
/// O_DIRECT refuses with `pread`.
pub(crate) struct DirectReader<'f> {
    file: &'f File,
    align: Option<DirectAlign>,
    /// `None`: not tried yet; `Some(None)`: O_DIRECT cannot be used.
    twin: Option<Option<File>>,
}

/// Said once: O_DIRECT cannot be used for local files.
static SAID_NO_DIRECT: AtomicBool = AtomicBool::new(false);

impl<'f> DirectReader<'f> {
    pub fn new(file: &'f File) -> Self {
        DirectReader {
            file,
            align: None,
            twin: None,
        }
    }

    fn twin(&mut self) -> Option<&File> {
        if self.twin.is_none() {
            let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
            let opened = open_direct(path.as_ref(), false);
            if let Err(e) = &opened {
                say_once(&SAID_NO_DIRECT, || {
                    format!("local files are read through the page cache: {e}")
                });
            }
            self.twin = Some(opened.ok());
        }
        self.twin.as_ref().and_then(Option::as_ref)
    }

    /// Reads exactly `len` bytes at `offset` into `dst`; returns how many
    /// of them came O_DIRECT.
    ///
    /// # Safety
    ///
    /// As [`pread_exact`]: `dst` is valid for `len` bytes of writes, with no
    /// Rust reference to them alive.
    pub unsafe fn read(&mut self, dst: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
        let align = *self.align.get_or_insert_with(|| direct_align(self.file));
        let oa = u64::from(align.offset.max(1));
        let first = offset.div_ceil(oa) * oa;
        let last = (offset + len as u64) / oa * oa;
        let (start, end) = (
            (first - offset) as usize,
            last.saturating_sub(offset) as usize,
        );
        let aligned =
            end > start && (dst as usize + start).is_multiple_of(align.memory.max(1) as usize);
        let twin = if aligned {
            self.twin().map(AsRawFd::as_raw_fd)
        } else {
            None
        };
        let Some(twin) = twin else {
            // SAFETY: this function's contract.
            unsafe { pread_exact(self.file, dst, len, offset)? };
            return Ok(0);
        };
        // SAFETY: `dst..dst + start` lies inside `dst..dst + len`
        // (`start ≤ end ≤ len`), valid for writes by this function's
        // contract.
        unsafe { pread_exact(self.file, dst, start, offset)? };
        let mut got = 0;
        while start + got < end {
            let at = libc::off_t::try_from(first + got as u64)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            // SAFETY: as above; the device writes at most `end - start - got`
            // bytes at `dst + start + got`.
            let r =
                unsafe { libc::pread(twin, dst.add(start + got).cast(), end - start - got, at) };
            if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // End of file, a refusal (EINVAL: alignment) or an odd length:
            // the rest goes through the page cache, which also reports a
            // file that is really too short.
            if r <= 0 || !(r as u64).is_multiple_of(oa) {
                if r > 0 {
                    got += r as usize;
                }
                break;
            }
            got += r as usize;
        }
        // SAFETY: `start + got ≤ len`: the rest of `dst`, valid for writes
        // by this function's contract.
        unsafe {
            pread_exact(
                self.file,
                dst.add(start + got),
                len - start - got,
                offset + (start + got) as u64,
            )?
        };
        Ok(got)
    }
}

/// The one exact-read loop with the no-wait rule (RWF_NOWAIT on a thread
/// that must not wait), shared with the engine's reads into host memory.
pub(crate) use sluice_api::fragment::pread_exact;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_numa::reactor::{BackendChoice, ReactorConfig};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::*;
    use crate::descriptor::ChainBuffers;

    const BASE: u64 = 0x10_0000;
    const REGION: usize = 1 << 20;
    /// The second region starts here, leaving a hole after the first.
    const SECOND: u64 = BASE + 2 * REGION as u64;

    fn table() -> Arc<GuestMemoryMmap> {
        Arc::new(
            GuestMemoryMmap::from_ranges(&[
                (GuestAddress(BASE), REGION),
                (GuestAddress(SECOND), REGION),
            ])
            .expect("guest memory"),
        )
    }

    /// Whether this machine gives the worker an io_uring ring: where it does
    /// not (qemu-user, io_uring_disabled), only the bytes are checked.
    fn uring_available() -> bool {
        let config = ReactorConfig {
            backend: BackendChoice::Uring,
            ..ReactorConfig::default()
        };
        std::env::var("SLUICE_IO_BACKEND").as_deref() != Ok("threads")
            && Reactor::<()>::new(&config).is_ok()
    }

    /// A file of `len` bytes, each a function of its offset.
    fn object(dir: &tempfile::TempDir, len: usize) -> (File, Vec<u8>) {
        let data: Vec<u8> = (0..len)
            .map(|i| (i % 251) as u8 ^ (i >> 12) as u8)
            .collect();
        let path = dir.path().join("object");
        std::fs::write(&path, &data).expect("write object");
        (File::open(&path).expect("open object"), data)
    }

    /// Reads `len` bytes at `off` of `file` into `writable`, then gathers them
    /// back from guest memory.
    fn read_through(
        table: &Arc<GuestMemoryMmap>,
        mode: GuestIoMode,
        stats: &QueueStats,
        writable: &[(u64, usize)],
        file: &File,
        off: u64,
        len: usize,
    ) -> io::Result<Vec<u8>> {
        read_through_as(false, table, mode, stats, writable, file, off, len)
    }

    /// [`read_through`] by a worker (`waiter` false) or a waiter.
    #[allow(clippy::too_many_arguments)]
    fn read_through_as(
        waiter: bool,
        table: &Arc<GuestMemoryMmap>,
        mode: GuestIoMode,
        stats: &QueueStats,
        writable: &[(u64, usize)],
        file: &File,
        off: u64,
        len: usize,
    ) -> io::Result<Vec<u8>> {
        // Stale bytes must not pass for data.
        for &(addr, n) in writable {
            table
                .write_slice(&vec![0xEE; n], GuestAddress(addr))
                .expect("scribble");
        }
        let chain = ChainBuffers::writable_for_test(writable);
        let route = GuestIoRoute {
            table,
            mode,
            stats,
            waiter,
            wake: None,
        };
        let mut writer = chain.routed_writer(route);
        writer.write_from_file(file, off, len)?;
        assert_eq!(writer.bytes_written(), len);
        let mut got = Vec::with_capacity(len);
        let mut left = len;
        for &(addr, n) in writable {
            let n = n.min(left);
            let mut part = vec![0u8; n];
            table
                .read_slice(&mut part, GuestAddress(addr))
                .expect("gather");
            got.extend_from_slice(&part);
            left -= n;
        }
        Ok(got)
    }

    /// Pieces that cross guest buffers, both memory regions, odd lengths
    /// and page-aligned ones.
    fn scattered() -> Vec<(u64, usize)> {
        vec![
            (BASE + 0x1000, 7),
            (BASE + 0x2003, 4093),
            (BASE + 0x10_000, 64 << 10),
            (SECOND + 0x3000, 128 << 10),
            (BASE + REGION as u64 - 100, 100),
            (SECOND + 0x40_000, 300_000),
        ]
    }

    #[test]
    fn uring_and_pread_place_the_same_bytes_as_the_file_holds() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (file, data) = object(&dir, (1 << 20) + 1234);
        let table = table();
        let pieces = scattered();
        let total: usize = pieces.iter().map(|p| p.1).sum();
        for off in [0u64, 4096, 77] {
            let uring = QueueStats::default();
            let got = read_through(
                &table,
                GuestIoMode::Uring,
                &uring,
                &pieces,
                &file,
                off,
                total,
            )
            .expect("uring read");
            assert!(
                got == data[off as usize..off as usize + total],
                "uring bytes at {off}"
            );
            let pread = QueueStats::default();
            let got = read_through(
                &table,
                GuestIoMode::Pread,
                &pread,
                &pieces,
                &file,
                off,
                total,
            )
            .expect("pread read");
            assert!(
                got == data[off as usize..off as usize + total],
                "pread bytes at {off}"
            );
            assert_eq!(pread.guest_io_snapshot(), (0, 0, total as u64));
            let (fixed, direct, by_pread) = uring.guest_io_snapshot();
            assert_eq!(fixed + direct + by_pread, total as u64);
            if uring_available() {
                assert_eq!(by_pread, 0, "io_uring served every byte at {off}");
            }
        }
    }

    #[test]
    fn the_short_tail_of_an_object_is_read_and_reading_past_it_fails() {
        let dir = tempfile::tempdir().expect("temp dir");
        let len = (256 << 10) + 1000;
        let (file, data) = object(&dir, len);
        let table = table();
        for mode in [GuestIoMode::Uring, GuestIoMode::Pread] {
            let stats = QueueStats::default();
            // Aligned head, unaligned tail up to the very last byte.
            let pieces = [
                (BASE + 0x8000, 128 << 10),
                (SECOND, 128 << 10),
                (SECOND + 0x2_0000, 1000),
            ];
            let got = read_through(&table, mode, &stats, &pieces, &file, 0, len).expect("whole");
            assert!(got == data, "{mode}: whole object");
            // An aligned 4 KiB piece that reaches past the end: O_DIRECT comes
            // back short there; the rest must be an error, never stale bytes.
            let err = read_through(
                &table,
                mode,
                &stats,
                &[(BASE + 0x1000, 4096)],
                &file,
                (256 << 10) as u64,
                4096,
            )
            .expect_err("past the end");
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{mode}");
        }
    }

    #[test]
    fn aligned_pieces_are_read_with_o_direct_where_the_file_system_allows() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (file, data) = object(&dir, 1 << 20);
        let path = dir.path().join("object");
        let direct_ok = open_direct(&path, false).is_ok();
        let table = table();
        let stats = QueueStats::default();
        let pieces = [(BASE + 0x1_0000, 64 << 10), (SECOND + 0x4_0000, 192 << 10)];
        let got = read_through(
            &table,
            GuestIoMode::Uring,
            &stats,
            &pieces,
            &file,
            8192,
            256 << 10,
        )
        .expect("aligned read");
        assert!(got == data[8192..8192 + (256 << 10)]);
        let (fixed, direct, pread) = stats.guest_io_snapshot();
        if uring_available() && direct_ok {
            assert_eq!((fixed, direct, pread), (0, 256 << 10, 0));
        }
        // The same file, unaligned: through the page cache.
        let stats = QueueStats::default();
        let got = read_through(
            &table,
            GuestIoMode::Uring,
            &stats,
            &[(BASE + 0x1_0001, 5000)],
            &file,
            3,
            5000,
        )
        .expect("unaligned read");
        assert!(got == data[3..5003]);
        if uring_available() {
            assert_eq!(stats.guest_io_snapshot(), (5000, 0, 0));
        }
    }

    #[test]
    fn a_waiter_reads_aligned_middles_o_direct_and_every_byte_right() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (file, data) = object(&dir, 3 << 20);
        let direct_ok = open_direct(&dir.path().join("object"), false).is_ok();
        let table = table();
        let mut saw_direct = false;
        for off in [0u64, 1, 511, 4096, 8195, (1 << 20) - 7] {
            for len in [1usize, 4095, 4096, 65536, (128 << 10) + 5, 1 << 20] {
                for (guest_at, split) in [(0x1_0000u64, 0usize), (0x1_0003, 0), (0x1_0000, 4096)] {
                    // One piece, or two (the second in the other region).
                    // A region holds 1 MiB: a long read always spans two.
                    let split = if len > 512 << 10 {
                        len / 2 / 4096 * 4096
                    } else {
                        split
                    };
                    let pieces: Vec<(u64, usize)> = if split == 0 || split >= len {
                        vec![(BASE + guest_at, len)]
                    } else {
                        vec![(BASE + guest_at, split), (SECOND + 0x2_0000, len - split)]
                    };
                    for mode in [GuestIoMode::Direct, GuestIoMode::Pread] {
                        let stats = QueueStats::default();
                        let got =
                            read_through_as(true, &table, mode, &stats, &pieces, &file, off, len)
                                .expect("read");
                        let at = off as usize;
                        assert!(
                            got == data[at..at + len],
                            "{mode} read of {len} at {off} into {pieces:?}"
                        );
                        let (fixed, direct, pread) = stats.guest_io_snapshot();
                        assert_eq!(fixed, 0);
                        assert_eq!(direct + pread, len as u64, "every byte counted once");
                        if mode == GuestIoMode::Pread {
                            assert_eq!(direct, 0, "pread never goes O_DIRECT");
                        }
                        saw_direct |= direct > 0;
                    }
                }
            }
        }
        if direct_ok {
            assert!(saw_direct, "aligned pieces went O_DIRECT");
        }
        // Reading past the end of the object fails, O_DIRECT or not.
        let stats = QueueStats::default();
        let err = read_through_as(
            true,
            &table,
            GuestIoMode::Direct,
            &stats,
            &[(BASE + 0x1_0000, 8192)],
            &file,
            (3 << 20) - 4096,
            8192,
        )
        .expect_err("past the end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_new_memory_table_is_registered_and_the_old_one_let_go() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (file, data) = object(&dir, 64 << 10);
        let first = table();
        let stats = QueueStats::default();
        let pieces = [(BASE + 0x100, 10_000), (SECOND + 0x200, 20_000)];
        let got = read_through(
            &first,
            GuestIoMode::Uring,
            &stats,
            &pieces,
            &file,
            5,
            30_000,
        )
        .expect("first");
        assert!(got == data[5..30_005]);
        if uring_available() {
            assert_eq!(
                Arc::strong_count(&first),
                2,
                "the registration holds the table"
            );
        }
        // A new table (another mapping of the same guest addresses), as after
        // SET_MEM_TABLE: the worker lets the old one go at its next batch.
        let second = table();
        release_stale(&second);
        assert_eq!(Arc::strong_count(&first), 1, "the old table is released");
        let got = read_through(
            &second,
            GuestIoMode::Uring,
            &stats,
            &pieces,
            &file,
            17,
            30_000,
        )
        .expect("second");
        assert!(got == data[17..30_017]);
        // The old mapping got nothing of the second read.
        let mut old = vec![0u8; 10_000];
        first
            .read_slice(&mut old, GuestAddress(BASE + 0x100))
            .expect("old");
        assert!(old == data[5..10_005]);
        // Without a batch in between, a read on yet another table re-registers too.
        let third = table();
        let got = read_through(
            &third,
            GuestIoMode::Uring,
            &stats,
            &pieces,
            &file,
            0,
            30_000,
        )
        .expect("third");
        assert!(got == data[..30_000]);
        if uring_available() {
            assert_eq!(Arc::strong_count(&second), 1);
            assert_eq!(stats.guest_io_snapshot().2, 0, "no pread fallback");
        }
    }

    #[test]
    fn mode_names_parse() {
        assert_eq!("direct".parse::<GuestIoMode>(), Ok(GuestIoMode::Direct));
        assert_eq!(GuestIoMode::Direct.to_string(), "direct");
        assert_eq!("uring".parse(), Ok(GuestIoMode::Uring));
        assert_eq!("pread".parse(), Ok(GuestIoMode::Pread));
        let err = "mmap".parse::<GuestIoMode>().unwrap_err();
        assert!(err.to_string().contains("\"pread\" or \"direct\""), "{err}");
        assert_eq!(GuestIoMode::default().to_string(), "pread");
    }
}
