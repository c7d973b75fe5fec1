//! The per-core I/O reactor.
//!
//! One reactor per data core, created on (and never leaving) the thread that owns it. It owns
//! an io_uring instance (SINGLE_ISSUER + DEFER_TASKRUN where the kernel has them) with a table
//! of registered files and a table of fixed buffers, or — where io_uring cannot be set up — a
//! pool of threads doing blocking pread/pwrite behind the same API.
//!
//! * Files are registered once ([`Reactor::register_file`]) and addressed by [`FileSlot`].
//! * Memory is registered as fixed buffers and addressed by [`BufferId`] + offset: node-local
//!   buffers the reactor then owns ([`Reactor::register_buffer`]), or foreign memory such as a
//!   guest's RAM ([`Reactor::register_region`]), split into pieces of at most 1 GiB and
//!   replaceable when the guest's memory table changes ([`Reactor::replace_regions`]).
//! * Reads and writes are queued ([`Reactor::read_fixed`], [`Reactor::write_fixed`]) and
//!   submitted in one batch by [`Reactor::submit`], [`Reactor::poll`] or [`Reactor::wait`].
//! * Other threads (the tokio runtime of S3 and Redis clients) hand results back through a
//!   [`ReactorHandle`]: a crossbeam channel plus an eventfd the ring watches, so a reactor
//!   blocked in `wait` wakes for them.
//!
//! `SLUICE_IO_BACKEND=uring|threads` forces a backend (see [`BackendChoice::from_env`]).

mod direct;
mod threads;
mod uring;

use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

pub use direct::{DEFAULT_DIRECT_ALIGN, DirectAlign, DirectError, direct_align, open_direct};

use crate::cpuset::CpuSet;
use crate::memlock::{self, MemlockError};
use crate::memory::NodeBuffer;
use crate::pinning::{self, PinError};

/// The environment variable that forces a backend: `uring` or `threads`.
pub const BACKEND_ENV: &str = "SLUICE_IO_BACKEND";

/// The largest fixed buffer the kernel accepts; larger regions are split.
pub const MAX_FIXED_BUFFER: usize = 1 << 30;

/// Bytes registered as fixed buffers by all io_uring reactors of this process: RLIMIT_MEMLOCK
/// must cover their sum, not one reactor's share.
static LOCKED_BYTES: AtomicU64 = AtomicU64::new(0);

/// The most fixed buffers one ring can hold (the kernel's limit, and `u16` buffer indexes).
pub const MAX_BUFFERS: u32 = 1 << 14;

/// Why a reactor operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ReactorError {
    /// `SLUICE_IO_BACKEND` holds something else than `uring` or `threads`.
    #[error("{BACKEND_ENV} must be \"uring\" or \"threads\", not {0:?}")]
    BadBackendName(String),
    /// io_uring was asked for explicitly and cannot be set up.
    #[error("io_uring is unavailable ({source}); unset {BACKEND_ENV} or set it to \"threads\"")]
    UringUnavailable {
        /// The setup error (ENOSYS: no io_uring; EPERM: io_uring_disabled or a sandbox).
        #[source]
        source: io::Error,
    },
    /// A kernel call of the reactor failed.
    #[error("{what} failed: {source}")]
    Os {
        /// The call.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The reactor's thread could not be started or pinned.
    #[error("cannot start the reactor thread: {0}")]
    Pin(#[from] PinError),
    /// Not enough lockable memory for fixed buffers.
    #[error(transparent)]
    Memlock(#[from] MemlockError),
    /// All slots of a table are taken.
    #[error("all {capacity} {table} slots are in use; raise the reactor's {table} limit")]
    TableFull {
        /// `file` or `buffer`.
        table: &'static str,
        /// Its size.
        capacity: u32,
    },
    /// A slot or buffer id that is not registered.
    #[error("{table} {index} is not registered")]
    NotRegistered {
        /// `file` or `buffer`.
        table: &'static str,
        /// The index.
        index: u32,
    },
    /// A slot is still used by I/O in flight.
    #[error("{table} {index} still has I/O in flight; wait for it before unregistering")]
    Busy {
        /// `file` or `buffer`.
        table: &'static str,
        /// The index.
        index: u32,
    },
    /// An operation reaches past the end of its buffer, or is too long for one request.
    #[error("I/O of {len} bytes at offset {offset} does not fit buffer {buffer} of {size} bytes")]
    OutOfBounds {
        /// The buffer.
        buffer: u16,
        /// Offset in the buffer.
        offset: usize,
        /// Length of the operation.
        len: usize,
        /// Size of the buffer.
        size: usize,
    },
    /// An O_DIRECT operation is not aligned as the file system requires.
    #[error(
        "O_DIRECT I/O must be aligned: memory to {} bytes, file offset and length to {} bytes \
         (got address {address:#x}, offset {offset}, length {len})", align.memory, align.offset
    )]
    Misaligned {
        /// What the file requires.
        align: DirectAlign,
        /// Memory address.
        address: usize,
        /// File offset.
        offset: u64,
        /// Length.
        len: usize,
    },
    /// A buffer larger than the kernel's 1 GiB limit for one fixed buffer.
    #[error("a fixed buffer may hold at most 1 GiB, not {len} bytes; register it as a region")]
    BufferTooLarge {
        /// Its length.
        len: usize,
    },
    /// A region handed to [`Reactor::register_region`] is empty or null.
    #[error("a memory region to register must be non-null and non-empty")]
    EmptyRegion,
}

/// Which I/O backend a reactor runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// io_uring with registered files and fixed buffers.
    Uring,
    /// Blocking pread/pwrite on a thread pool.
    Threads,
}

/// Which backend to ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// io_uring if it can be set up, else the thread pool (logged).
    #[default]
    Auto,
    /// io_uring or an error.
    Uring,
    /// The thread pool.
    Threads,
}

impl BackendChoice {
    /// Parses a `SLUICE_IO_BACKEND` value (`None`/empty/`auto` mean [`BackendChoice::Auto`]).
    pub fn parse(value: Option<&str>) -> Result<Self, ReactorError> {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => Ok(Self::Auto),
            Some("uring") | Some("io_uring") => Ok(Self::Uring),
            Some("threads") => Ok(Self::Threads),
            Some(other) => Err(ReactorError::BadBackendName(other.to_string())),
        }
    }

    /// Reads `SLUICE_IO_BACKEND`.
    pub fn from_env() -> Result<Self, ReactorError> {
        Self::parse(std::env::var(BACKEND_ENV).ok().as_deref())
    }
}

/// How to build a reactor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReactorConfig {
    /// Submission queue entries (the completion queue is twice as large).
    pub entries: u32,
    /// Size of the registered file table.
    pub max_files: u32,
    /// Size of the fixed buffer table (at most [`MAX_BUFFERS`]).
    pub max_buffers: u32,
    /// The backend to use.
    pub backend: BackendChoice,
    /// Threads of the fallback pool.
    pub pool_threads: usize,
    /// CPUs the fallback pool's threads are pinned to (None: unpinned).
    pub pool_cpus: Option<CpuSet>,
    /// Largest piece a registered region is split into (at most [`MAX_FIXED_BUFFER`]).
    pub max_piece: usize,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        Self {
            entries: 256,
            max_files: 64,
            max_buffers: 256,
            backend: BackendChoice::Auto,
            pool_threads: 4,
            pool_cpus: None,
            max_piece: MAX_FIXED_BUFFER,
        }
    }
}

impl ReactorConfig {
    /// The defaults with the backend taken from `SLUICE_IO_BACKEND`.
    pub fn from_env() -> Result<Self, ReactorError> {
        Ok(Self {
            backend: BackendChoice::from_env()?,
            ..Self::default()
        })
    }
}

/// A registered file, by its index in the reactor's file table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileSlot(pub u32);

/// A fixed buffer, by its index in the reactor's buffer table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferId(pub u16);

/// One ≤ 1 GiB piece of a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionPiece {
    /// The fixed buffer holding the piece.
    pub buffer: BufferId,
    /// Where the piece starts within the region.
    pub region_offset: usize,
    /// Its length.
    pub len: usize,
}

/// A foreign memory region registered as fixed buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionHandle {
    pieces: Vec<RegionPiece>,
    len: usize,
}

impl RegionHandle {
    /// The pieces, in address order.
    pub fn pieces(&self) -> &[RegionPiece] {
        &self.pieces
    }

    /// The region's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: registration rejects empty regions).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer and offset within it for `len` bytes at `offset` into the region, or `None`
    /// when the range leaves the region or straddles two pieces (split the I/O there).
    pub fn locate(&self, offset: usize, len: usize) -> Option<(BufferId, usize)> {
        let end = offset.checked_add(len)?;
        let piece = self
            .pieces
            .iter()
            .find(|p| p.region_offset <= offset && offset < p.region_offset + p.len)?;
        (end <= piece.region_offset + piece.len)
            .then_some((piece.buffer, offset - piece.region_offset))
    }
}

/// A finished read or write.
#[derive(Debug)]
pub struct Completion {
    /// The token given when the operation was queued.
    pub token: u64,
    /// Bytes transferred, or the error.
    pub result: io::Result<usize>,
}

/// What [`Reactor::poll`] and [`Reactor::wait`] hand back.
#[derive(Debug)]
pub enum Event<M> {
    /// An I/O operation finished.
    Io(Completion),
    /// Another thread sent a message through a [`ReactorHandle`].
    Message(M),
}

/// The sending side of a reactor's inbox; cheap to clone and usable from any thread (tokio
/// tasks included).
#[derive(Debug)]
pub struct ReactorHandle<M> {
    tx: Sender<M>,
    wake: Arc<OwnedFd>,
}

impl<M> Clone for ReactorHandle<M> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            wake: Arc::clone(&self.wake),
        }
    }
}

/// The reactor is gone; the message comes back.
#[derive(Debug, thiserror::Error)]
#[error("the reactor has stopped; the message was not delivered")]
pub struct ReactorGone<M>(pub M);

impl<M> ReactorHandle<M> {
    /// Sends `msg` to the reactor and wakes it.
    pub fn send(&self, msg: M) -> Result<(), ReactorGone<M>> {
        self.tx.send(msg).map_err(|e| ReactorGone(e.0))?;
        signal_eventfd(self.wake.as_raw_fd());
        Ok(())
    }
}

fn signal_eventfd(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd; a full counter (EAGAIN) means the
    // reactor is already due to wake, so the result is deliberately ignored.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd's counter (nonblocking; nothing to do when already zero).
fn drain_eventfd(fd: RawFd) {
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a nonblocking eventfd.
    unsafe { libc::read(fd, (&mut value as *mut u64).cast(), 8) };
}

struct Inbox<M> {
    rx: Receiver<M>,
    handle: ReactorHandle<M>,
}

fn inbox<M>() -> Result<Inbox<M>, ReactorError> {
    // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(ReactorError::Os {
            what: "eventfd",
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
    let (tx, rx) = crossbeam_channel::unbounded();
    Ok(Inbox {
        rx,
        handle: ReactorHandle { tx, wake },
    })
}

/// One operation handed to a backend.
#[derive(Clone, Copy, Debug)]
struct OpDesc {
    id: u64,
    write: bool,
    slot: u32,
    buffer: u16,
    addr: *mut u8,
    len: u32,
    offset: u64,
}

struct FileEntry {
    file: Arc<File>,
    align: Option<DirectAlign>,
    inflight: u32,
}

struct BufferEntry {
    addr: *mut u8,
    len: usize,
    owned: Option<NodeBuffer>,
    inflight: u32,
}

struct OpState {
    token: u64,
    file: u32,
    buffer: u16,
}

enum Backend {
    Uring(uring::UringBackend),
    Threads(threads::ThreadPool),
}

/// A per-core I/O reactor; see the module documentation. Not `Send`: it lives and dies on the
/// thread that created it (io_uring's SINGLE_ISSUER requires as much).
pub struct Reactor<M: Send + 'static = ()> {
    backend: Backend,
    description: String,
    files: Vec<Option<FileEntry>>,
    buffers: Vec<Option<BufferEntry>>,
    regions: Vec<RegionHandle>,
    ops: Vec<Option<OpState>>,
    free_ops: Vec<u32>,
    inflight: usize,
    max_piece: usize,
    inbox: Inbox<M>,
    done: Vec<(u64, i32)>,
    _not_send: PhantomData<*const ()>,
}

impl<M: Send + 'static> std::fmt::Debug for Reactor<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("backend", &self.description)
            .field("inflight", &self.inflight)
            .finish_non_exhaustive()
    }
}

impl<M: Send + 'static> Reactor<M> {
    /// Builds a reactor on the calling thread.
    pub fn new(config: &ReactorConfig) -> Result<Self, ReactorError> {
        Self::with_inbox(config, inbox()?)
    }

    fn with_inbox(config: &ReactorConfig, inbox: Inbox<M>) -> Result<Self, ReactorError> {
        let max_buffers = config.max_buffers.clamp(1, MAX_BUFFERS);
        let max_files = config.max_files.max(1);
        let wake_fd = inbox.handle.wake.as_raw_fd();
        let pool = |reason: Option<String>| -> Result<(Backend, String), ReactorError> {
            let pool =
                threads::ThreadPool::new(config.pool_threads.max(1), config.pool_cpus.clone())?;
            let mut text = format!(
                "pread/pwrite thread pool ({} threads)",
                config.pool_threads.max(1)
            );
            if let Some(reason) = reason {
                text.push_str(&format!(": {reason}"));
            }
            Ok((Backend::Threads(pool), text))
        };
        let (backend, description) = match config.backend {
            BackendChoice::Threads => pool(Some("requested".to_string()))?,
            choice => {
                match uring::UringBackend::new(config.entries, max_files, max_buffers, wake_fd) {
                    Ok(ring) => {
                        let text = format!("io_uring ({})", ring.features());
                        (Backend::Uring(ring), text)
                    }
                    Err(source) if choice == BackendChoice::Uring => {
                        return Err(ReactorError::UringUnavailable { source });
                    }
                    Err(source) => pool(Some(format!("io_uring unavailable: {source}")))?,
                }
            }
        };
        log::info!("reactor backend: {description}");
        Ok(Self {
            backend,
            description,
            files: (0..max_files).map(|_| None).collect(),
            buffers: (0..max_buffers).map(|_| None).collect(),
            regions: Vec::new(),
            ops: Vec::new(),
            free_ops: Vec::new(),
            inflight: 0,
            max_piece: config.max_piece.clamp(1, MAX_FIXED_BUFFER),
            inbox,
            done: Vec::new(),
            _not_send: PhantomData,
        })
    }

    /// Starts a thread named `name` (pinned to `cpu` when given) that builds a reactor and runs
    /// `body` with it; returns the thread and a handle to the reactor's inbox.
    #[allow(clippy::type_complexity)]
    pub fn spawn<T, F>(
        name: String,
        cpu: Option<usize>,
        config: ReactorConfig,
        body: F,
    ) -> Result<(JoinHandle<Result<T, ReactorError>>, ReactorHandle<M>), ReactorError>
    where
        F: FnOnce(Reactor<M>) -> T + Send + 'static,
        T: Send + 'static,
    {
        let inbox = inbox::<M>()?;
        let handle = inbox.handle.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                if let Some(cpu) = cpu {
                    pinning::pin_current_thread(cpu)?;
                }
                let reactor = Reactor::with_inbox(&config, inbox)?;
                Ok(body(reactor))
            })
            .map_err(|source| ReactorError::Os {
                what: "spawning the reactor thread",
                source,
            })?;
        Ok((thread, handle))
    }

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        match self.backend {
            Backend::Uring(_) => BackendKind::Uring,
            Backend::Threads(_) => BackendKind::Threads,
        }
    }

    /// The backend in words, with the reason for a fallback.
    pub fn describe_backend(&self) -> &str {
        &self.description
    }

    /// A handle other threads use to send messages to this reactor.
    pub fn handle(&self) -> ReactorHandle<M> {
        self.inbox.handle.clone()
    }

    /// Operations queued or in flight.
    pub fn in_flight(&self) -> usize {
        self.inflight
    }

    /// Registers `file`; the reactor keeps it open until [`Reactor::unregister_file`].
    pub fn register_file(&mut self, file: File) -> Result<FileSlot, ReactorError> {
        let capacity = self.files.len() as u32;
        let slot = self
            .files
            .iter()
            .position(Option::is_none)
            .ok_or(ReactorError::TableFull {
                table: "file",
                capacity,
            })? as u32;
        if let Backend::Uring(ring) = &mut self.backend {
            ring.update_file(slot, file.as_raw_fd())?;
        }
        let align = direct::is_direct(&file).then(|| direct_align(&file));
        self.files[slot as usize] = Some(FileEntry {
            file: Arc::new(file),
            align,
            inflight: 0,
        });
        Ok(FileSlot(slot))
    }

    /// Unregisters a file with no I/O in flight and gives it back.
    pub fn unregister_file(&mut self, slot: FileSlot) -> Result<Arc<File>, ReactorError> {
        if self.file_entry(slot.0)?.inflight > 0 {
            return Err(ReactorError::Busy {
                table: "file",
                index: slot.0,
            });
        }
        if let Backend::Uring(ring) = &mut self.backend {
            ring.update_file(slot.0, -1)?;
        }
        let entry = self.files[slot.0 as usize]
            .take()
            .ok_or(ReactorError::NotRegistered {
                table: "file",
                index: slot.0,
            })?;
        Ok(entry.file)
    }

    /// The O_DIRECT alignment of a registered file (None when it was not opened O_DIRECT).
    pub fn file_direct_align(&self, slot: FileSlot) -> Result<Option<DirectAlign>, ReactorError> {
        Ok(self.file_entry(slot.0)?.align)
    }

    fn file_entry(&self, slot: u32) -> Result<&FileEntry, ReactorError> {
        self.files
            .get(slot as usize)
            .and_then(Option::as_ref)
            .ok_or(ReactorError::NotRegistered {
                table: "file",
                index: slot,
            })
    }

    fn free_buffer_slot(&self) -> Result<u16, ReactorError> {
        self.buffers
            .iter()
            .position(Option::is_none)
            .map(|i| i as u16)
            .ok_or(ReactorError::TableFull {
                table: "buffer",
                capacity: self.buffers.len() as u32,
            })
    }

    fn install_buffer(
        &mut self,
        slot: u16,
        addr: *mut u8,
        len: usize,
        owned: Option<NodeBuffer>,
    ) -> Result<(), ReactorError> {
        if let Backend::Uring(ring) = &mut self.backend {
            let needed = LOCKED_BYTES.load(Ordering::Relaxed) + len as u64;
            memlock::ensure(needed)?;
            // SAFETY: addr/len is either an owned NodeBuffer kept in the table until the slot is
            // cleared, or foreign memory whose validity the caller of register_region promised.
            unsafe { ring.update_buffer(slot, addr, len) }.map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOMEM) {
                    ReactorError::Memlock(MemlockError {
                        needed_mib: needed.div_ceil(1 << 20),
                        hard_mib: memlock::current().map(|l| l.1 >> 20).unwrap_or(0),
                        source: e,
                    })
                } else {
                    ReactorError::Os {
                        what: "registering a fixed buffer",
                        source: e,
                    }
                }
            })?;
            LOCKED_BYTES.fetch_add(len as u64, Ordering::Relaxed);
        }
        self.buffers[slot as usize] = Some(BufferEntry {
            addr,
            len,
            owned,
            inflight: 0,
        });
        Ok(())
    }

    fn clear_buffer(&mut self, slot: u16) -> Result<Option<NodeBuffer>, ReactorError> {
        let entry = self
            .buffers
            .get(slot as usize)
            .and_then(Option::as_ref)
            .ok_or(ReactorError::NotRegistered {
                table: "buffer",
                index: slot.into(),
            })?;
        if entry.inflight > 0 {
            return Err(ReactorError::Busy {
                table: "buffer",
                index: slot.into(),
            });
        }
        let len = entry.len as u64;
        if let Backend::Uring(ring) = &mut self.backend {
            // SAFETY: a null, zero-length iovec clears the slot.
            unsafe { ring.update_buffer(slot, std::ptr::null_mut(), 0) }.map_err(|source| {
                ReactorError::Os {
                    what: "unregistering a fixed buffer",
                    source,
                }
            })?;
            LOCKED_BYTES.fetch_sub(len, Ordering::Relaxed);
        }
        Ok(self.buffers[slot as usize].take().and_then(|e| e.owned))
    }

    /// Registers a node-local buffer (at most 1 GiB) as a fixed buffer the reactor owns.
    pub fn register_buffer(&mut self, mut buffer: NodeBuffer) -> Result<BufferId, ReactorError> {
        if buffer.len() > MAX_FIXED_BUFFER {
            return Err(ReactorError::BufferTooLarge { len: buffer.len() });
        }
        let slot = self.free_buffer_slot()?;
        let (addr, len) = (buffer.as_mut_ptr(), buffer.len());
        self.install_buffer(slot, addr, len, Some(buffer))?;
        Ok(BufferId(slot))
    }

    /// Unregisters an owned buffer with no I/O in flight and gives it back.
    pub fn unregister_buffer(&mut self, id: BufferId) -> Result<Option<NodeBuffer>, ReactorError> {
        self.clear_buffer(id.0)
    }

    /// The bytes of an owned buffer with no I/O in flight.
    pub fn buffer(&self, id: BufferId) -> Result<&[u8], ReactorError> {
        let entry = self.idle_owned(id)?;
        Ok(entry.owned.as_ref().map_or(&[][..], NodeBuffer::as_slice))
    }

    /// The bytes of an owned buffer with no I/O in flight, writable.
    pub fn buffer_mut(&mut self, id: BufferId) -> Result<&mut [u8], ReactorError> {
        self.idle_owned(id)?;
        let entry = self.buffers[id.0 as usize].as_mut();
        Ok(entry
            .and_then(|e| e.owned.as_mut())
            .map_or(&mut [][..], NodeBuffer::as_mut_slice))
    }

    fn idle_owned(&self, id: BufferId) -> Result<&BufferEntry, ReactorError> {
        let entry = self
            .buffers
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .filter(|e| e.owned.is_some())
            .ok_or(ReactorError::NotRegistered {
                table: "buffer",
                index: id.0.into(),
            })?;
        if entry.inflight > 0 {
            return Err(ReactorError::Busy {
                table: "buffer",
                index: id.0.into(),
            });
        }
        Ok(entry)
    }

    /// Registers foreign memory (a guest RAM region) as fixed buffers of at most 1 GiB each.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` must be readable and writable memory that stays mapped until the
    /// region is unregistered or replaced and every operation on it has completed (or the
    /// reactor is dropped), and that the program does not access through Rust references while
    /// I/O on it is in flight.
    pub unsafe fn register_region(
        &mut self,
        addr: *mut u8,
        len: usize,
    ) -> Result<RegionHandle, ReactorError> {
        if addr.is_null() || len == 0 {
            return Err(ReactorError::EmptyRegion);
        }
        let mut pieces = Vec::new();
        let mut offset = 0;
        while offset < len {
            let piece_len = (len - offset).min(self.max_piece);
            let slot = match self.free_buffer_slot() {
                Ok(slot) => slot,
                Err(e) => {
                    self.release_pieces(&pieces);
                    return Err(e);
                }
            };
            // SAFETY: offset < len, inside the caller's region.
            let piece_addr = unsafe { addr.add(offset) };
            if let Err(e) = self.install_buffer(slot, piece_addr, piece_len, None) {
                self.release_pieces(&pieces);
                return Err(e);
            }
            pieces.push(RegionPiece {
                buffer: BufferId(slot),
                region_offset: offset,
                len: piece_len,
            });
            offset += piece_len;
        }
        let handle = RegionHandle { pieces, len };
        self.regions.push(handle.clone());
        Ok(handle)
    }

    fn release_pieces(&mut self, pieces: &[RegionPiece]) {
        for piece in pieces {
            if let Err(e) = self.clear_buffer(piece.buffer.0) {
                log::warn!("cannot release buffer {}: {e}", piece.buffer.0);
            }
        }
    }

    /// Unregisters a region with no I/O in flight.
    pub fn unregister_region(&mut self, region: &RegionHandle) -> Result<(), ReactorError> {
        for piece in &region.pieces {
            let busy = self
                .buffers
                .get(piece.buffer.0 as usize)
                .and_then(Option::as_ref)
                .is_some_and(|e| e.inflight > 0);
            if busy {
                return Err(ReactorError::Busy {
                    table: "buffer",
                    index: piece.buffer.0.into(),
                });
            }
        }
        for piece in &region.pieces {
            self.clear_buffer(piece.buffer.0)?;
        }
        self.regions.retain(|r| r != region);
        Ok(())
    }

    /// Replaces every registered region with `regions` (a new guest memory table). Waits for
    /// I/O in flight first; events that arrive meanwhile go to `events`.
    ///
    /// # Safety
    ///
    /// As for [`Reactor::register_region`], for every new region.
    pub unsafe fn replace_regions(
        &mut self,
        regions: &[(*mut u8, usize)],
        events: &mut Vec<Event<M>>,
    ) -> Result<Vec<RegionHandle>, ReactorError> {
        self.drain(events)?;
        for old in std::mem::take(&mut self.regions) {
            for piece in &old.pieces {
                self.clear_buffer(piece.buffer.0)?;
            }
        }
        let mut handles = Vec::with_capacity(regions.len());
        for (addr, len) in regions {
            // SAFETY: forwarded from this function's contract.
            handles.push(unsafe { self.register_region(*addr, *len) }?);
        }
        Ok(handles)
    }

    /// Queues a read of `len` bytes at `file_offset` of `file` into fixed buffer `buffer` at
    /// `buffer_offset`. It starts at the next submit, poll or wait; `token` comes back in its
    /// [`Completion`].
    pub fn read_fixed(
        &mut self,
        token: u64,
        file: FileSlot,
        file_offset: u64,
        buffer: BufferId,
        buffer_offset: usize,
        len: usize,
    ) -> Result<(), ReactorError> {
        self.queue(token, false, file, file_offset, buffer, buffer_offset, len)
    }

    /// Queues a write of `len` bytes from fixed buffer `buffer` at `buffer_offset` to `file` at
    /// `file_offset`; see [`Reactor::read_fixed`].
    pub fn write_fixed(
        &mut self,
        token: u64,
        file: FileSlot,
        file_offset: u64,
        buffer: BufferId,
        buffer_offset: usize,
        len: usize,
    ) -> Result<(), ReactorError> {
        self.queue(token, true, file, file_offset, buffer, buffer_offset, len)
    }

    #[allow(clippy::too_many_arguments)]
    fn queue(
        &mut self,
        token: u64,
        write: bool,
        file: FileSlot,
        file_offset: u64,
        buffer: BufferId,
        buffer_offset: usize,
        len: usize,
    ) -> Result<(), ReactorError> {
        let entry = self.file_entry(file.0)?;
        let align = entry.align;
        let pool_file =
            matches!(self.backend, Backend::Threads(_)).then(|| Arc::clone(&entry.file));
        let buf = self
            .buffers
            .get(buffer.0 as usize)
            .and_then(Option::as_ref)
            .ok_or(ReactorError::NotRegistered {
                table: "buffer",
                index: buffer.0.into(),
            })?;
        let fits = buffer_offset
            .checked_add(len)
            .is_some_and(|end| end <= buf.len)
            && u32::try_from(len).is_ok();
        if !fits {
            return Err(ReactorError::OutOfBounds {
                buffer: buffer.0,
                offset: buffer_offset,
                len,
                size: buf.len,
            });
        }
        // SAFETY: buffer_offset + len <= buf.len, checked above.
        let addr = unsafe { buf.addr.add(buffer_offset) };
        if let Some(align) = align {
            let aligned = (addr as usize).is_multiple_of(align.memory as usize)
                && file_offset.is_multiple_of(align.offset.into())
                && len.is_multiple_of(align.offset as usize);
            if !aligned {
                return Err(ReactorError::Misaligned {
                    align,
                    address: addr as usize,
                    offset: file_offset,
                    len,
                });
            }
        }
        let id = match self.free_ops.pop() {
            Some(id) => id,
            None => {
                self.ops.push(None);
                (self.ops.len() - 1) as u32
            }
        };
        let op = OpDesc {
            id: id.into(),
            write,
            slot: file.0,
            buffer: buffer.0,
            addr,
            len: len as u32,
            offset: file_offset,
        };
        let pushed = match &mut self.backend {
            Backend::Uring(ring) => ring.push(&op),
            Backend::Threads(pool) => {
                if let Some(file) = pool_file {
                    pool.push(op, file);
                }
                Ok(())
            }
        };
        if let Err(source) = pushed {
            self.free_ops.push(id);
            return Err(ReactorError::Os {
                what: "io_uring submit",
                source,
            });
        }
        self.ops[id as usize] = Some(OpState {
            token,
            file: file.0,
            buffer: buffer.0,
        });
        if let Some(Some(f)) = self.files.get_mut(file.0 as usize) {
            f.inflight += 1;
        }
        if let Some(Some(b)) = self.buffers.get_mut(buffer.0 as usize) {
            b.inflight += 1;
        }
        self.inflight += 1;
        Ok(())
    }

    /// Hands every queued operation to the kernel (or the pool) in one batch.
    pub fn submit(&mut self) -> Result<(), ReactorError> {
        self.submit_then(false)
    }

    /// [`Reactor::submit`]; with `reap`, an io_uring ring also runs the completions it
    /// deferred to this thread.
    fn submit_then(&mut self, reap: bool) -> Result<(), ReactorError> {
        match &mut self.backend {
            Backend::Uring(ring) if reap => ring.submit_and_reap(),
            Backend::Uring(ring) => ring.submit(),
            Backend::Threads(pool) => {
                pool.submit();
                Ok(())
            }
        }
        .map_err(|source| ReactorError::Os {
            what: "io_uring submit",
            source,
        })
    }

    /// Submits queued operations and collects whatever has finished, without blocking. On a
    /// DEFER_TASKRUN ring this also runs the completions the kernel deferred to this thread
    /// (a plain submit would leave them unposted).
    pub fn poll(&mut self, events: &mut Vec<Event<M>>) -> Result<usize, ReactorError> {
        self.submit_then(true)?;
        Ok(self.collect(events))
    }

    /// Has the kernel signal the eventfd `fd` whenever an operation of this ring completes, so
    /// a thread that sleeps in `epoll` (not in [`Reactor::wait`]) learns it has completions to
    /// [`poll`](Reactor::poll). On a DEFER_TASKRUN ring the eventfd is signalled when the
    /// completion is queued for this thread, before it is posted; `poll` posts it. The io_uring
    /// backend only: the thread pool has no such signal (`Unsupported`).
    pub fn register_eventfd(&mut self, fd: RawFd) -> Result<(), ReactorError> {
        match &mut self.backend {
            Backend::Uring(ring) => ring.register_eventfd(fd),
            Backend::Threads(_) => Err(io::Error::from(io::ErrorKind::Unsupported)),
        }
        .map_err(|source| ReactorError::Os {
            what: "registering an eventfd with io_uring",
            source,
        })
    }

    /// Whether operations on the registered file `slot` are queued or in flight (it cannot be
    /// unregistered until they are done).
    pub fn file_busy(&self, slot: FileSlot) -> bool {
        self.file_entry(slot.0).is_ok_and(|f| f.inflight > 0)
    }

    /// Submits queued operations and blocks until at least one event is collected; with
    /// nothing in flight it sleeps until a message arrives through a [`ReactorHandle`].
    pub fn wait(&mut self, events: &mut Vec<Event<M>>) -> Result<usize, ReactorError> {
        self.submit()?;
        loop {
            let n = self.collect(events);
            if n > 0 {
                return Ok(n);
            }
            let waited = match &mut self.backend {
                Backend::Uring(ring) => ring.wait_one(),
                Backend::Threads(pool) => {
                    pool.wait_one(&self.inbox.rx);
                    Ok(())
                }
            };
            waited.map_err(|source| ReactorError::Os {
                what: "io_uring wait",
                source,
            })?;
        }
    }

    /// Waits until no operation is in flight; events go to `events`.
    pub fn drain(&mut self, events: &mut Vec<Event<M>>) -> Result<(), ReactorError> {
        while self.inflight > 0 {
            self.wait(events)?;
        }
        Ok(())
    }

    fn collect(&mut self, events: &mut Vec<Event<M>>) -> usize {
        let before = events.len();
        self.done.clear();
        match &mut self.backend {
            Backend::Uring(ring) => ring.reap(&mut self.done),
            Backend::Threads(pool) => pool.reap(&mut self.done),
        }
        for i in 0..self.done.len() {
            let (id, res) = self.done[i];
            let Some(op) = self.ops.get_mut(id as usize).and_then(Option::take) else {
                log::warn!("completion for unknown operation {id}");
                continue;
            };
            self.free_ops.push(id as u32);
            self.inflight -= 1;
            if let Some(Some(f)) = self.files.get_mut(op.file as usize) {
                f.inflight -= 1;
            }
            if let Some(Some(b)) = self.buffers.get_mut(op.buffer as usize) {
                b.inflight -= 1;
            }
            let result = if res >= 0 {
                Ok(res as usize)
            } else {
                Err(io::Error::from_raw_os_error(-res))
            };
            events.push(Event::Io(Completion {
                token: op.token,
                result,
            }));
        }
        while let Ok(msg) = self.inbox.rx.try_recv() {
            events.push(Event::Message(msg));
        }
        events.len() - before
    }
}

impl<M: Send + 'static> Drop for Reactor<M> {
    fn drop(&mut self) {
        // The kernel or pool threads may still write into buffers this reactor owns: wait.
        let mut sink = Vec::new();
        while self.inflight > 0 {
            if let Err(e) = self.wait(&mut sink) {
                log::error!("reactor dropped with I/O in flight that cannot be waited for: {e}");
                if let Backend::Uring(_) = self.backend {
                    // Registered buffers are pinned by the kernel; leaking owned buffers keeps
                    // the rest of memory safe.
                    for entry in self.buffers.iter_mut().flatten() {
                        if let Some(buf) = entry.owned.take() {
                            std::mem::forget(buf);
                        }
                    }
                }
                break;
            }
            sink.clear();
        }
        if let Backend::Uring(_) = self.backend {
            let registered: u64 = self.buffers.iter().flatten().map(|e| e.len as u64).sum();
            LOCKED_BYTES.fetch_sub(registered, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
