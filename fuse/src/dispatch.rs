//! Dispatch: a decoded [`Request`] → a [`Filesystem`] call → a reply handed
//! to the transport's [`ReplySink`].
//!
//! The dispatcher holds no transport state, so the `/dev/fuse` session and
//! the virtio-fs device share it. For READ it asks the transport for a
//! [`ReadReply`] ([`ReplySink::read_reply`]) — the guest's own buffers for
//! virtio-fs, the block itself or one gather buffer for `/dev/fuse` — and
//! hands it to [`Filesystem::read`] once as the read's destination: the
//! file system pushes the data into it, and the dispatcher finishes the
//! reply with the result. A sink that places nothing itself (tests) gets
//! the data read into the dispatcher's scratch buffer. It owns the
//! protocol's session state (INIT
//! negotiation, DESTROY) and turns every engine error into an errno through
//! `sluice_api::Error::errno` — the one errno mapping — and every decode
//! error through [`crate::DecodeError::errno`].

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Instant;

use sluice_api::Result as EngineResult;
use sluice_api::fragment::ReadDest;
use sluice_api::meta::{CopyRange, MAX_COPY_LEN, SetAttr, TimeChange, Timestamp};

use crate::abi::{self, fattr, init_flags};
use crate::log_limit::{LogLimit, suppressed_note};
use crate::metrics::{Observed, OpMetrics};
use crate::reply::{self, DirentPacker, ReplyHead, Timeouts};
use crate::request::{BadRequest, Limits, Operation, Request, WriteData, opcode_name};
use sluice_api::filesystem::{Filesystem, OpenOut};
use sluice_api::source::{Limited, WriteSource};

/// Where replies go. The transport implements it: `writev` on `/dev/fuse`,
/// the request's writable descriptors for virtio-fs.
pub trait ReplySink {
    /// Sends one reply: `head` immediately followed by `payload` (often
    /// empty), as one message.
    fn send(&mut self, head: &ReplyHead, payload: &[u8]) -> io::Result<()>;

    /// The reply to READ `unique` (of at most `size` bytes), placed in this
    /// sink's own buffers: the dispatcher hands it to the file system as
    /// the read's destination, then calls [`ReadReply::finish`]. `None`
    /// when this sink does not place data itself: the dispatcher then reads
    /// into its scratch buffer and calls [`ReplySink::send`].
    fn read_reply(&mut self, unique: u64, size: usize) -> io::Result<Option<&mut dyn ReadReply>> {
        let _ = (unique, size);
        Ok(None)
    }
}

/// A READ reply a [`ReplySink`] places itself (virtio-fs: in the guest's
/// buffers; `/dev/fuse`: written from the block, or gathered once). The
/// file system pushes the data into it as a [`ReadDest`]; then the
/// dispatcher finishes it with the read's result.
pub trait ReadReply: ReadDest {
    /// Ends the reply. With `Ok(n)`, sends it with the `n` bytes placed
    /// and returns `Ok(Ok(n))`. With an error, takes back what was placed
    /// and returns `Ok(Err(e))`: nothing was sent, and the dispatcher
    /// answers `e` — unless the reply already went out whole, when it
    /// returns `Ok(Ok(size))` and the error is only logged.
    fn finish(&mut self, read: EngineResult<usize>) -> io::Result<EngineResult<usize>>;
}

/// What the transport should do after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Keep serving.
    Continue,
    /// The session ended (DESTROY): stop serving.
    Destroyed,
}

/// Session parameters the dispatcher negotiates and replies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Cache timeouts put in entry and attribute replies.
    pub timeouts: Timeouts,
    /// Largest WRITE payload (`fuse_init_out.max_write`).
    pub max_write: u32,
    /// Largest request in pages (`fuse_init_out.max_pages`).
    pub max_pages: u16,
    /// Most background requests (readahead, async direct I/O) in flight.
    pub max_background: u16,
    /// Background requests at which the kernel starts throttling.
    pub congestion_threshold: u16,
    /// Whether the client keeps file data in its page cache across opens
    /// (OPEN and CREATE replies' `FOPEN_*` flags).
    pub data_cache: DataCache,
}

/// What OPEN and CREATE replies tell the client about its page cache for
/// the file: virtiofsd's `--cache` policies, the data half of them (the
/// metadata half is [`Config::timeouts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DataCache {
    /// As the file system says for each open (the engine's `Vfs` asks for
    /// neither flag: the client drops a file's cached pages when it opens
    /// it again, and sooner when another client changed it, by
    /// `AUTO_INVAL_DATA`).
    #[default]
    Auto,
    /// `FOPEN_DIRECT_IO` on every open: reads and writes go to the file
    /// system, the client caches no file data.
    Never,
    /// `FOPEN_KEEP_CACHE` on every open: the client keeps its cached
    /// pages across opens.
    Always,
}

impl DataCache {
    /// `open` with this policy applied.
    fn apply(self, mut open: OpenOut) -> OpenOut {
        match self {
            DataCache::Auto => {}
            DataCache::Never => {
                open.direct_io = true;
                open.keep_cache = false;
            }
            DataCache::Always => {
                open.keep_cache = true;
                open.direct_io = false;
            }
        }
        open
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            timeouts: Timeouts::default(),
            max_write: 1 << 20,
            max_pages: 256,
            max_background: 128,
            congestion_threshold: 96,
            data_cache: DataCache::Auto,
        }
    }
}

/// The INIT capabilities asked of the kernel (granted where it offers them):
///
/// - `ASYNC_READ`, `ASYNC_DIO`: several reads per file in flight at once;
///   the engine is thread-safe and training readers are sequential-parallel.
/// - `BIG_WRITES`, `MAX_PAGES`: writes and reads up to `max_write` (1 MiB)
///   instead of one page.
/// - `PARALLEL_DIROPS`: lookups and readdirs in one directory run in
///   parallel (the engine's metadata transactions serialise what must be).
/// - `DO_READDIRPLUS`, `READDIRPLUS_AUTO`: `ls -l` costs one round trip.
/// - `AUTO_INVAL_DATA`: cached pages are dropped when another client changes
///   a file's mtime or size (volumes are shared between hosts).
/// - `CACHE_SYMLINKS`: symlink targets never change, so the kernel keeps them.
/// - `EXPORT_SUPPORT`: file handles (`name_to_handle_at`/`open_by_handle_at`,
///   an NFS server re-exporting the mount) stay valid while the inode
///   lives, not only while it is in the kernel's cache: the kernel decodes
///   a handle of an evicted inode with LOOKUP(node, ".") and finds a
///   directory's parent with LOOKUP(node, ".."), both answered by the file
///   system (`Vfs::lookup`). Node ids are JuiceFS inode numbers, which are
///   never reused, so generation 0 in every entry keeps a handle unique.
/// - `HANDLE_KILLPRIV_V2`: the engine drops setuid/setgid when a caller
///   without CAP_FSETID changes a file's data — WRITE with
///   `WRITE_KILL_SUIDGID`, SETATTR of the size with `KILL_SUIDGID`, and
///   every FALLOCATE and COPY_FILE_RANGE by a non-root caller, which carry
///   no flag. Without it the kernel clears the bits itself by a SETATTR of
///   the mode sent as the writer (whom the engine must then let clear
///   them, and still accepts for kernels before 5.11), and keeps setgid
///   unless the file is group-executable, where Linux also drops it for a
///   writer outside the file's group (xfstests generic/683–685). The
///   engine applies the kernel's own rule (`setattr_should_drop_suidgid`).
///   OPEN's `OPEN_KILL_SUIDGID` is not needed: without `ATOMIC_O_TRUNC` an
///   `O_TRUNC` open truncates through SETATTR, which carries the flag.
///
/// Deliberately not asked for: `ATOMIC_O_TRUNC` (the kernel then truncates
/// through SETATTR, so `open` never has to), `WRITEBACK_CACHE` (the engine
/// buffers writes itself, and O_APPEND from several writers must see the
/// engine's file length), `POSIX_LOCKS`/`FLOCK_LOCKS` (the kernel keeps locks local), `DONT_MASK`
/// (on a volume without ACLs the kernel applies the umask; the engine gets it again harmlessly),
/// `HANDLE_KILLPRIV` (v1: every write, truncate and chown would have to
/// clear the bits, CAP_FSETID or not), and `SETXATTR_EXT` (so SETXATTR keeps
/// its 8-byte argument; the engine drops setgid on an ACL change by a
/// caller outside the group itself, as the kernel's
/// `FUSE_SETXATTR_ACL_KILL_SGID` would ask). `POSIX_ACL` and `DONT_MASK`
/// are asked for only where the file system keeps ACLs
/// ([`Filesystem::posix_acl`]): the kernel then caches ACLs and leaves the
/// umask to the engine, which applies it unless the parent directory has a
/// default ACL.
pub const WANTED_INIT_FLAGS: u32 = init_flags::ASYNC_READ
    | init_flags::ASYNC_DIO
    | init_flags::BIG_WRITES
    | init_flags::MAX_PAGES
    | init_flags::PARALLEL_DIROPS
    | init_flags::DO_READDIRPLUS
    | init_flags::READDIRPLUS_AUTO
    | init_flags::AUTO_INVAL_DATA
    | init_flags::CACHE_SYMLINKS
    | init_flags::EXPORT_SUPPORT
    | init_flags::HANDLE_KILLPRIV_V2;

// COPY_FILE_RANGE answers with a 32-bit count.
const _: () = assert!(MAX_COPY_LEN <= u32::MAX as u64);

/// The largest time, in seconds either side of the epoch, a setattr sets:
/// JuiceFS stores times as signed 64-bit microseconds. Times beyond it are
/// clamped to it, as the kernel clamps a local file system's times to what
/// its format holds (`timestamp_truncate`).
const MAX_TIME_SECS: u64 = (i64::MAX / 1_000_000 - 1) as u64;

const STATE_NEW: u8 = 0;
const STATE_RUNNING: u8 = 1;
const STATE_DESTROYED: u8 = 2;

/// Buffers one worker thread reuses for reply payloads, so steady-state
/// requests allocate nothing.
#[derive(Debug, Default)]
pub struct Scratch {
    read: Vec<u8>,
    list: Vec<u8>,
}

impl Scratch {
    /// Empty buffers; they grow to the largest reply seen.
    pub fn new() -> Scratch {
        Scratch::default()
    }

    /// A `size`-byte buffer for READ data. It never shrinks, so it is
    /// zero-filled once, not on every read.
    fn read_buf(&mut self, size: usize) -> &mut [u8] {
        if self.read.len() < size {
            self.read.resize(size, 0);
        }
        &mut self.read[..size]
    }
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running system; it has no
    // memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(4096)
}

/// Decodes requests' effects into [`Filesystem`] calls and encodes replies.
/// Shared by all worker threads of a session.
#[derive(Debug)]
pub struct Dispatcher<F> {
    fs: F,
    config: Config,
    limits: Limits,
    state: AtomicU8,
    destroy_called: AtomicBool,
    /// Whether INIT granted `FUSE_POSIX_ACL`: the kernel then checks every
    /// request's permissions itself (it forces `default_permissions`), with
    /// the caller's supplementary groups, and requests say so
    /// ([`sluice_api::meta::Context::kernel_checked`]).
    kernel_checks: AtomicBool,
    metrics: Arc<OpMetrics>,
}

fn time_change(valid: u32, set: u32, now: u32, secs: u64, nsecs: u32) -> Option<TimeChange> {
    if valid & set == 0 {
        None
    } else if valid & now != 0 {
        Some(TimeChange::Now)
    } else {
        let limit = MAX_TIME_SECS as i64;
        Some(TimeChange::At(Timestamp {
            secs: (secs as i64).clamp(-limit, limit),
            nsecs,
        }))
    }
}

impl<F: Filesystem> Dispatcher<F> {
    /// A dispatcher serving `fs` with `config`.
    pub fn new(fs: F, config: Config) -> Dispatcher<F> {
        let max_read = (usize::from(config.max_pages) * page_size())
            .max(config.max_write as usize)
            .min(u32::MAX as usize) as u32;
        Dispatcher {
            fs,
            config,
            limits: Limits {
                max_write: config.max_write,
                max_read,
            },
            state: AtomicU8::new(STATE_NEW),
            destroy_called: AtomicBool::new(false),
            kernel_checks: AtomicBool::new(false),
            metrics: Arc::default(),
        }
    }

    /// Counts this session's requests in `metrics` (shared by a daemon's
    /// sessions, so that its counts outlive each connection) instead of
    /// counters of its own.
    pub fn with_metrics(mut self, metrics: Arc<OpMetrics>) -> Dispatcher<F> {
        self.metrics = metrics;
        self
    }

    /// The per-operation counters.
    pub fn metrics(&self) -> &Arc<OpMetrics> {
        &self.metrics
    }

    /// The file system served.
    pub fn filesystem(&self) -> &F {
        &self.fs
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The limits requests are decoded against.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether INIT was answered and the session has not ended: a transport
    /// that answers some requests itself (virtio-fs placing READ data in
    /// guest memory) checks this first, as [`Dispatcher::handle`] does.
    pub fn is_running(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_RUNNING
    }

    /// Whether DESTROY was handled (or [`Dispatcher::shutdown`] called).
    pub fn is_destroyed(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_DESTROYED
    }

    /// Ends the session: calls [`Filesystem::destroy`] exactly once, however
    /// often and from however many threads this is called (DESTROY, then
    /// the transport seeing the unmount).
    pub fn shutdown(&self) {
        self.state.store(STATE_DESTROYED, Ordering::Release);
        if !self.destroy_called.swap(true, Ordering::AcqRel) {
            self.fs.destroy();
        }
    }

    /// Decodes one contiguous message and handles it. A message that does
    /// not decode gets an error reply, or is dropped when it has no request
    /// id or its operation takes no reply. Each message is counted in
    /// [`Dispatcher::metrics`]: its opcode, latency and reply errno.
    pub fn handle_message(
        &self,
        msg: &[u8],
        scratch: &mut Scratch,
        sink: &mut impl ReplySink,
    ) -> io::Result<Outcome> {
        let decoded = Request::decode(msg, &self.limits);
        self.handle_decoded(msg, decoded, None, scratch, sink)
    }

    /// [`Dispatcher::handle_message`] of a message whose header and
    /// arguments are `head` and whose remaining bytes — a WRITE's data —
    /// the transport kept apart in `data` (virtio-fs: the data stays in
    /// the guest's descriptors). The file system takes a WRITE's data from
    /// `data` straight into its write buffer, so it is copied once; the
    /// message is decoded ([`Request::decode_split`]) before any of it is
    /// taken. With `data` empty this is `handle_message(head)`.
    pub fn handle_split(
        &self,
        head: &[u8],
        data: &mut dyn WriteSource,
        scratch: &mut Scratch,
        sink: &mut impl ReplySink,
    ) -> io::Result<Outcome> {
        let decoded = Request::decode_split(head, data.len(), &self.limits);
        self.handle_decoded(head, decoded, Some(data), scratch, sink)
    }

    /// Handles what decoding `head` came to, counting it.
    fn handle_decoded(
        &self,
        head: &[u8],
        decoded: Result<Request<'_>, BadRequest>,
        apart: Option<&mut dyn WriteSource>,
        scratch: &mut Scratch,
        sink: &mut impl ReplySink,
    ) -> io::Result<Outcome> {
        let started = Instant::now();
        let opcode = head
            .get(4..8)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let mut observed = Observed {
            inner: sink,
            errno: 0,
        };
        let mut written = None;
        let outcome = match decoded {
            Ok(req) => {
                if let Operation::Write { data, .. } = req.op {
                    written = Some(data.len());
                }
                self.handle_with(&req, apart, scratch, &mut observed)
            }
            Err(bad) => {
                self.reject(&bad, &mut observed)?;
                Ok(Outcome::Continue)
            }
        };
        if matches!(&outcome, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            // Counted when it runs again, where it may wait.
            return outcome;
        }
        if let Some(n) = written {
            self.metrics.written(n);
        }
        self.metrics.record(opcode, started, observed.errno);
        outcome
    }

    /// Answers a message that failed to decode.
    pub fn reject(&self, bad: &BadRequest, sink: &mut impl ReplySink) -> io::Result<()> {
        log::debug!("{bad}");
        match bad.reply_to() {
            Some(unique) => sink.send(&ReplyHead::error(unique, bad.error.errno()), &[]),
            None => Ok(()),
        }
    }

    /// Handles one decoded request, sending its reply (if it takes one).
    /// A WRITE whose data was kept apart ([`WriteData::Apart`]) needs that
    /// data: [`Dispatcher::handle_split`].
    pub fn handle(
        &self,
        req: &Request<'_>,
        scratch: &mut Scratch,
        sink: &mut impl ReplySink,
    ) -> io::Result<Outcome> {
        self.handle_with(req, None, scratch, sink)
    }

    /// [`Dispatcher::handle`], with the WRITE data the transport kept
    /// apart, if it did.
    fn handle_with(
        &self,
        req: &Request<'_>,
        apart: Option<&mut dyn WriteSource>,
        scratch: &mut Scratch,
        sink: &mut impl ReplySink,
    ) -> io::Result<Outcome> {
        let unique = req.unique();
        if let Operation::Init {
            major,
            minor,
            max_readahead,
            flags,
        } = req.op
        {
            return self.init(unique, major, minor, max_readahead, flags, sink);
        }
        match self.state.load(Ordering::Acquire) {
            STATE_RUNNING => {}
            STATE_NEW => {
                // Nothing but INIT is valid before INIT.
                if crate::request::expects_reply(req.header.opcode) {
                    sink.send(&ReplyHead::error(unique, libc::EIO), &[])?;
                }
                return Ok(Outcome::Continue);
            }
            _ => {
                if crate::request::expects_reply(req.header.opcode) {
                    sink.send(&ReplyHead::error(unique, libc::ENODEV), &[])?;
                }
                return Ok(Outcome::Destroyed);
            }
        }
        // A transport's worker that must not wait (`sluice_api::wait`)
        // tries, hands on or runs the request, by `no_wait_rule`.
        let _allowed = match sluice_api::wait::mode() {
            sluice_api::wait::Mode::NoWait => {
                match no_wait_rule(req.header.opcode, self.fs.metadata_is_remote()) {
                    NoWaitRule::HandOn => return Err(io::ErrorKind::WouldBlock.into()),
                    NoWaitRule::Try => None,
                    NoWaitRule::Run => Some(sluice_api::wait::allow_wait()),
                }
            }
            _ => None,
        };
        match self.run(req, apart, scratch, sink) {
            Ok(outcome) => Ok(outcome),
            Err(Failure::Errno(errno)) => {
                sink.send(&ReplyHead::error(unique, errno), &[])?;
                Ok(Outcome::Continue)
            }
            Err(Failure::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(Failure::Io(e)) => Err(e),
        }
    }

    fn init(
        &self,
        unique: u64,
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
        sink: &mut impl ReplySink,
    ) -> io::Result<Outcome> {
        if major > abi::KERNEL_VERSION {
            // A newer major: tell the kernel ours; it retries INIT with it.
            let out = abi::InitOut {
                major: abi::KERNEL_VERSION,
                minor: abi::KERNEL_MINOR_VERSION,
                ..Default::default()
            };
            sink.send(&ReplyHead::init(unique, &out), &[])?;
            return Ok(Outcome::Continue);
        }
        if major < abi::KERNEL_VERSION || minor < abi::MIN_KERNEL_MINOR_VERSION {
            log::error!(
                "the kernel speaks FUSE {major}.{minor}; sluice needs 7.{} or newer",
                abi::MIN_KERNEL_MINOR_VERSION
            );
            sink.send(&ReplyHead::error(unique, libc::EPROTO), &[])?;
            return Ok(Outcome::Continue);
        }
        if self.state.load(Ordering::Acquire) != STATE_NEW {
            sink.send(&ReplyHead::error(unique, libc::EIO), &[])?;
            return Ok(Outcome::Continue);
        }
        if let Err(e) = self.fs.init() {
            log::error!("the file system failed to start: {e}");
            sink.send(&ReplyHead::error(unique, e.errno()), &[])?;
            return Ok(Outcome::Continue);
        }
        let acl_flags = if self.fs.posix_acl() {
            init_flags::POSIX_ACL | init_flags::DONT_MASK
        } else {
            0
        };
        let granted = (WANTED_INIT_FLAGS | acl_flags) & (flags as u32);
        let out = abi::InitOut {
            major: abi::KERNEL_VERSION,
            minor: minor.min(abi::KERNEL_MINOR_VERSION),
            max_readahead,
            flags: granted,
            max_background: self.config.max_background,
            congestion_threshold: self.config.congestion_threshold,
            max_write: self.config.max_write,
            time_gran: 1,
            max_pages: self.config.max_pages,
            map_alignment: 0,
            flags2: 0,
            unused: [0; 7],
        };
        log::debug!(
            "FUSE {major}.{minor} session: flags {granted:#x}, max_write {}, max_readahead {max_readahead}",
            self.config.max_write
        );
        self.kernel_checks
            .store(granted & init_flags::POSIX_ACL != 0, Ordering::Release);
        self.state.store(STATE_RUNNING, Ordering::Release);
        sink.send(&ReplyHead::init(unique, &out), &[])?;
        Ok(Outcome::Continue)
    }

    /// Runs one request against the file system. Engine errors come back
    /// as `Failure::Errno`, sink errors as `Failure::Io`.
    fn run(
        &self,
        req: &Request<'_>,
        apart: Option<&mut dyn WriteSource>,
        scratch: &mut Scratch,
        sink: &mut impl ReplySink,
    ) -> Result<Outcome, Failure> {
        let fs = &self.fs;
        let t = &self.config.timeouts;
        let mut ctx = req.context();
        ctx.kernel_checked = self.kernel_checks.load(Ordering::Acquire);
        let ino = req.nodeid();
        let u = req.unique();
        let head = match req.op {
            // INIT is answered by `handle` before `run` is reached.
            Operation::Init { .. } => return Err(Failure::Errno(libc::EIO)),
            Operation::Destroy => {
                self.shutdown();
                sink.send(&ReplyHead::empty(u), &[])?;
                return Ok(Outcome::Destroyed);
            }
            Operation::Forget { nlookup } => {
                fs.forget(ino, nlookup);
                return Ok(Outcome::Continue);
            }
            Operation::BatchForget(list) => {
                for (node, nlookup) in list.iter() {
                    fs.forget(node, nlookup);
                }
                return Ok(Outcome::Continue);
            }
            Operation::Interrupt { .. } | Operation::NotifyReply => return Ok(Outcome::Continue),
            Operation::Lookup { name } => {
                ReplyHead::entry(u, &reply::entry_out(&fs.lookup(&ctx, ino, name)?, t))
            }
            Operation::Getattr { .. } => {
                ReplyHead::attr(u, &reply::attr_out(ino, &fs.getattr(&ctx, ino)?, t))
            }
            Operation::Setattr(ref s) => {
                let v = s.valid;
                let bad_time = |set: u32, now: u32, nsecs: u32| {
                    v & set != 0 && v & now == 0 && nsecs >= 1_000_000_000
                };
                if bad_time(fattr::ATIME, fattr::ATIME_NOW, s.atimensec)
                    || bad_time(fattr::MTIME, fattr::MTIME_NOW, s.mtimensec)
                {
                    return Err(Failure::Errno(libc::EINVAL));
                }
                let set = SetAttr {
                    mode: (v & fattr::MODE != 0).then_some((s.mode & 0o7777) as u16),
                    uid: (v & fattr::UID != 0).then_some(s.uid),
                    gid: (v & fattr::GID != 0).then_some(s.gid),
                    atime: time_change(v, fattr::ATIME, fattr::ATIME_NOW, s.atime, s.atimensec),
                    mtime: time_change(v, fattr::MTIME, fattr::MTIME_NOW, s.mtime, s.mtimensec),
                    kill_suidgid: v & fattr::KILL_SUIDGID != 0,
                };
                let size = (v & fattr::SIZE != 0).then_some(s.size);
                let fh = (v & fattr::FH != 0).then_some(s.fh);
                let attr = fs.setattr(&ctx, ino, fh, &set, size)?;
                ReplyHead::attr(u, &reply::attr_out(ino, &attr, t))
            }
            Operation::Readlink => {
                let target = fs.readlink(&ctx, ino)?;
                sink.send(&ReplyHead::data(u, target.len()), &target)?;
                return Ok(Outcome::Continue);
            }
            Operation::Symlink { name, target } => ReplyHead::entry(
                u,
                &reply::entry_out(&fs.symlink(&ctx, ino, name, target)?, t),
            ),
            Operation::Mknod {
                name,
                mode,
                rdev,
                umask,
            } => {
                let e = fs.mknod(&ctx, ino, name, mode, umask, rdev)?;
                ReplyHead::entry(u, &reply::entry_out(&e, t))
            }
            Operation::Mkdir { name, mode, umask } => ReplyHead::entry(
                u,
                &reply::entry_out(&fs.mkdir(&ctx, ino, name, mode, umask)?, t),
            ),
            Operation::Unlink { name } => {
                fs.unlink(&ctx, ino, name)?;
                ReplyHead::empty(u)
            }
            Operation::Rmdir { name } => {
                fs.rmdir(&ctx, ino, name)?;
                ReplyHead::empty(u)
            }
            Operation::Rename {
                name,
                new_parent,
                new_name,
                flags,
            } => {
                fs.rename(&ctx, ino, name, new_parent, new_name, flags)?;
                ReplyHead::empty(u)
            }
            Operation::Link { ino: old, new_name } => {
                ReplyHead::entry(u, &reply::entry_out(&fs.link(&ctx, old, ino, new_name)?, t))
            }
            Operation::Open { flags } => {
                let open = self.config.data_cache.apply(fs.open(&ctx, ino, flags)?);
                ReplyHead::open(u, &reply::open_out(&open))
            }
            Operation::Create {
                name,
                mode,
                umask,
                flags,
            } => {
                let (entry, open) = fs.create(&ctx, ino, name, mode, umask, flags)?;
                let open = self.config.data_cache.apply(open);
                ReplyHead::create(u, &reply::entry_out(&entry, t), &reply::open_out(&open))
            }
            Operation::Read { fh, offset, size } => {
                let size = size as usize;
                let n = match sink.read_reply(u, size)? {
                    Some(reply) => {
                        let read = fs.read(&ctx, ino, fh, offset, size, reply);
                        reply.finish(read)??
                    }
                    None => {
                        let buf = scratch.read_buf(size);
                        let n = fs.read_buf(&ctx, ino, fh, offset, buf)?.min(size);
                        sink.send(&ReplyHead::data(u, n), &buf[..n])?;
                        n
                    }
                };
                self.metrics.read(n);
                return Ok(Outcome::Continue);
            }
            Operation::Write {
                fh,
                offset,
                data,
                write_flags,
            } => {
                let kill = write_flags & abi::WRITE_KILL_SUIDGID != 0;
                let n = match (data, apart) {
                    (WriteData::Inline(bytes), _) => {
                        fs.write_buf(&ctx, ino, fh, offset, bytes, kill)?
                    }
                    // The data, not the request extensions after it.
                    (WriteData::Apart(len), Some(src)) if src.len() != len => {
                        let mut src = Limited::new(src, len);
                        fs.write(&ctx, ino, fh, offset, &mut src, kill)?
                    }
                    (WriteData::Apart(_), Some(src)) => {
                        fs.write(&ctx, ino, fh, offset, src, kill)?
                    }
                    // Decoded apart, handed in without its data: a
                    // transport's bug, not the client's.
                    (WriteData::Apart(_), None) => return Err(Failure::Errno(libc::EIO)),
                };
                // n ≤ data.len() ≤ max_write, which is a u32.
                ReplyHead::write(u, n.min(data.len()) as u32)
            }
            Operation::Statfs => ReplyHead::statfs(u, &reply::statfs_out(&fs.statfs(&ctx, ino)?)),
            Operation::Flush { fh } => {
                fs.flush(&ctx, ino, fh)?;
                ReplyHead::empty(u)
            }
            Operation::Release { fh } => {
                fs.release(&ctx, ino, fh)?;
                ReplyHead::empty(u)
            }
            Operation::Fsync { fh, datasync } => {
                fs.fsync(&ctx, ino, fh, datasync)?;
                ReplyHead::empty(u)
            }
            Operation::Opendir { .. } => {
                let fh = fs.opendir(&ctx, ino)?;
                let out = abi::OpenOut {
                    fh,
                    open_flags: 0,
                    padding: 0,
                };
                ReplyHead::open(u, &out)
            }
            Operation::Readdir {
                fh,
                offset,
                size,
                plus,
            } => {
                // The file system hands out entries only while they fit:
                // a call costs the entries in the reply, and READDIRPLUS
                // counts a lookup only for those.
                let mut packer = DirentPacker::new(&mut scratch.list, size as usize);
                let mut next = offset;
                fs.readdir(&ctx, ino, fh, offset, plus, &mut |e, listed| {
                    next = next.saturating_add(1);
                    if plus {
                        packer.push_plus(e, listed, next, t)
                    } else {
                        packer.push(e.inode, next, reply::dirent_type(&e.attr), &e.name)
                    }
                })?;
                sink.send(&ReplyHead::data(u, scratch.list.len()), &scratch.list)?;
                return Ok(Outcome::Continue);
            }
            Operation::Releasedir { fh } => {
                fs.releasedir(&ctx, ino, fh)?;
                ReplyHead::empty(u)
            }
            Operation::Fsyncdir { fh, datasync } => {
                fs.fsyncdir(&ctx, ino, fh, datasync)?;
                ReplyHead::empty(u)
            }
            Operation::Syncfs => {
                fs.syncfs(&ctx)?;
                ReplyHead::empty(u)
            }
            Operation::Setxattr { name, value, mode } => {
                fs.setxattr(&ctx, ino, name, value, mode)?;
                ReplyHead::empty(u)
            }
            Operation::Getxattr { name, size } => {
                let value = fs.getxattr(&ctx, ino, name)?;
                send_sized(u, size, &value, sink)?;
                return Ok(Outcome::Continue);
            }
            Operation::Listxattr { size } => {
                let names = fs.listxattr(&ctx, ino)?;
                scratch.list.clear();
                for n in &names {
                    scratch.list.extend_from_slice(n);
                    scratch.list.push(0);
                }
                send_sized(u, size, &scratch.list, sink)?;
                return Ok(Outcome::Continue);
            }
            Operation::Removexattr { name } => {
                fs.removexattr(&ctx, ino, name)?;
                ReplyHead::empty(u)
            }
            Operation::Access { mask } => {
                fs.access(&ctx, ino, mask)?;
                ReplyHead::empty(u)
            }
            Operation::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => {
                fs.fallocate(&ctx, ino, fh, mode, offset, length)?;
                ReplyHead::empty(u)
            }
            Operation::Lseek { fh, offset, whence } => {
                if whence != libc::SEEK_DATA as u32 && whence != libc::SEEK_HOLE as u32 {
                    return Err(Failure::Errno(libc::EINVAL));
                }
                ReplyHead::lseek(u, fs.lseek(&ctx, ino, fh, offset, whence)?)
            }
            Operation::CopyFileRange {
                fh_in,
                off_in,
                nodeid_out,
                fh_out,
                off_out,
                len,
                flags,
            } => {
                let req = CopyRange {
                    fin: ino,
                    off_in,
                    fout: nodeid_out,
                    off_out,
                    // The reply's count is 32 bits: ask for no more.
                    len: len.min(MAX_COPY_LEN),
                    flags: u32::try_from(flags).map_err(|_| Failure::Errno(libc::EINVAL))?,
                };
                let n = fs.copy_file_range(&ctx, &req, fh_in, fh_out)?.min(req.len);
                // n ≤ MAX_COPY_LEN, which fits a u32 (checked below).
                ReplyHead::write(u, n as u32)
            }
            Operation::Unsupported(code) => {
                log::debug!("unsupported FUSE opcode {code} ({})", opcode_name(code));
                return Err(Failure::Errno(libc::ENOSYS));
            }
        };
        sink.send(&head, &[])?;
        Ok(Outcome::Continue)
    }
}

/// Sends a GETXATTR/LISTXATTR answer: the size when the caller's buffer
/// size is 0, ERANGE when the value does not fit, else the value.
fn send_sized(
    unique: u64,
    size: u32,
    value: &[u8],
    sink: &mut impl ReplySink,
) -> Result<(), Failure> {
    if size == 0 {
        let len = u32::try_from(value.len()).map_err(|_| Failure::Errno(libc::E2BIG))?;
        sink.send(&ReplyHead::xattr_size(unique, len), &[])?;
    } else if value.len() > size as usize {
        return Err(Failure::Errno(libc::ERANGE));
    } else {
        sink.send(&ReplyHead::data(unique, value.len()), value)?;
    }
    Ok(())
}

/// Why a request did not complete: an errno for the reply, or a failure to
/// send at all.
enum Failure {
    Errno(i32),
    Io(io::Error),
    /// The request would wait on a thread that must not; nothing was sent.
    WouldBlock,
}

/// What a transport's worker that must not wait (`sluice_api::wait`) does
/// with an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoWaitRule {
    /// Run it without waiting: where it would wait it fails with
    /// `WouldBlock` having changed nothing a second run would repeat, and
    /// is handed on then. READ and FLUSH (usually a cached block, a close
    /// with nothing buffered), WRITE (usually into the file's buffer; one
    /// that would start a commit while the last still runs, or find
    /// memory short, is handed on before it takes a byte) and the
    /// operations that only read metadata (a remote metadata engine fails
    /// them before its round trip; local metadata answers at once).
    Try,
    /// Hand it on without trying: it always waits on storage (the syncs),
    /// its first run would change something before it could wait (RELEASE
    /// drops its handle), or it changes metadata kept on another machine.
    HandOn,
    /// Run it here, waiting if it must: its metadata is local (SQLite), or
    /// it stays on the worker — DESTROY, and operations with no reply.
    Run,
}

/// The [`NoWaitRule`] for `opcode`; `remote_metadata`: the file system's
/// metadata is on another machine (`Filesystem::metadata_is_remote`).
pub(crate) fn no_wait_rule(opcode: u32, remote_metadata: bool) -> NoWaitRule {
    use abi::opcode as op;
    match opcode {
        op::FSYNC | op::FSYNCDIR | op::RELEASE | op::SYNCFS => NoWaitRule::HandOn,
        op::READ
        | op::FLUSH
        | op::WRITE
        | op::LOOKUP
        | op::GETATTR
        | op::READLINK
        | op::STATFS
        | op::GETXATTR
        | op::LISTXATTR
        | op::ACCESS => NoWaitRule::Try,
        op::DESTROY | op::INIT => NoWaitRule::Run,
        _ if remote_metadata && crate::request::expects_reply(opcode) => NoWaitRule::HandOn,
        _ => NoWaitRule::Run,
    }
}

impl From<sluice_api::Error> for Failure {
    fn from(e: sluice_api::Error) -> Failure {
        if matches!(e, sluice_api::Error::WouldBlock) {
            return Failure::WouldBlock;
        }
        let errno = e.errno();
        if errno == libc::EIO {
            // A client can make requests fail as fast as it sends them.
            static REQUEST_FAILED: LogLimit = LogLimit::new();
            if let Some(left_out) = REQUEST_FAILED.allow() {
                log::warn!("request failed: {e}{}", suppressed_note(left_out));
            }
        }
        Failure::Errno(errno)
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use proptest::prelude::*;
    use sluice_api::meta::{Attr, Context, Entry, Ino, RenameFlags, StatFs, XattrMode};
    use sluice_api::{Error, Result};
    use zerocopy::{FromBytes, IntoBytes};

    use super::*;
    use crate::abi::{OutHeader, opcode};
    use crate::request::tests::message;
    use sluice_api::filesystem::{Fh, OpenOut};
    use sluice_api::source::SliceSource;

    /// A file system that refuses every call with one errno and records the
    /// arguments it was called with, so the tests can check what the
    /// dispatcher passed down. It holds no files: it exercises the protocol
    /// layer only.
    #[derive(Default)]
    struct Refusing {
        errno: i32,
        calls: Mutex<Vec<String>>,
        destroyed: AtomicUsize,
        /// What `metadata_is_remote` says.
        remote: bool,
        /// What `posix_acl` says.
        acl: bool,
        /// Lookups whose context said the kernel had checked them.
        kernel_checked: AtomicUsize,
    }

    impl Refusing {
        fn with_errno(errno: i32) -> Refusing {
            Refusing {
                errno,
                ..Refusing::default()
            }
        }

        fn refuse<T>(&self, call: String) -> Result<T> {
            self.calls.lock().unwrap().push(call);
            Err(Error::Io(io::Error::from_raw_os_error(self.errno)))
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Filesystem for Refusing {
        fn init(&self) -> Result<()> {
            Ok(())
        }
        fn destroy(&self) {
            self.destroyed.fetch_add(1, Ordering::SeqCst);
        }
        fn posix_acl(&self) -> bool {
            self.acl
        }
        fn lookup(&self, c: &Context, p: Ino, n: &[u8]) -> Result<Entry> {
            if c.kernel_checked {
                self.kernel_checked.fetch_add(1, Ordering::SeqCst);
            }
            self.refuse(format!("lookup {} {p} {n:?}", c.uid))
        }
        fn forget(&self, ino: Ino, n: u64) {
            self.calls.lock().unwrap().push(format!("forget {ino} {n}"));
        }
        fn metadata_is_remote(&self) -> bool {
            self.remote
        }
        fn getattr(&self, _: &Context, ino: Ino) -> Result<Attr> {
            self.refuse(format!("getattr {ino}"))
        }
        fn setattr(
            &self,
            _: &Context,
            ino: Ino,
            fh: Option<Fh>,
            s: &SetAttr,
            size: Option<u64>,
        ) -> Result<Attr> {
            self.refuse(format!("setattr {ino} {fh:?} {s:?} {size:?}"))
        }
        fn readlink(&self, _: &Context, ino: Ino) -> Result<Vec<u8>> {
            self.refuse(format!("readlink {ino}"))
        }
        fn mknod(&self, _: &Context, p: Ino, n: &[u8], m: u32, u: u32, r: u32) -> Result<Entry> {
            self.refuse(format!("mknod {p} {n:?} {m:o} {u:o} {r}"))
        }
        fn mkdir(&self, _: &Context, p: Ino, n: &[u8], m: u32, u: u32) -> Result<Entry> {
            self.refuse(format!("mkdir {p} {n:?} {m:o} {u:o}"))
        }
        fn unlink(&self, _: &Context, p: Ino, n: &[u8]) -> Result<()> {
            self.refuse(format!("unlink {p} {n:?}"))
        }
        fn rmdir(&self, _: &Context, p: Ino, n: &[u8]) -> Result<()> {
            self.refuse(format!("rmdir {p} {n:?}"))
        }
        fn symlink(&self, _: &Context, p: Ino, n: &[u8], t: &[u8]) -> Result<Entry> {
            self.refuse(format!("symlink {p} {n:?} {t:?}"))
        }
        fn rename(
            &self,
            _: &Context,
            p: Ino,
            n: &[u8],
            np: Ino,
            nn: &[u8],
            f: RenameFlags,
        ) -> Result<()> {
            self.refuse(format!("rename {p} {n:?} {np} {nn:?} {f:?}"))
        }
        fn link(&self, _: &Context, ino: Ino, np: Ino, nn: &[u8]) -> Result<Entry> {
            self.refuse(format!("link {ino} {np} {nn:?}"))
        }
        fn open(&self, _: &Context, ino: Ino, f: u32) -> Result<OpenOut> {
            self.refuse(format!("open {ino} {f:o}"))
        }
        fn create(
            &self,
            _: &Context,
            p: Ino,
            n: &[u8],
            m: u32,
            u: u32,
            f: u32,
        ) -> Result<(Entry, OpenOut)> {
            self.refuse(format!("create {p} {n:?} {m:o} {u:o} {f:o}"))
        }
        fn read(
            &self,
            _: &Context,
            ino: Ino,
            fh: Fh,
            off: u64,
            size: usize,
            _: &mut dyn ReadDest,
        ) -> Result<usize> {
            self.refuse(format!("read {ino} {fh} {off} {size}"))
        }
        fn write(
            &self,
            _: &Context,
            ino: Ino,
            fh: Fh,
            off: u64,
            d: &mut dyn WriteSource,
            kill: bool,
        ) -> Result<usize> {
            let mut bytes = vec![0u8; d.len()];
            d.take(&mut bytes)?;
            self.refuse(format!("write {ino} {fh} {off} {bytes:?} {kill}"))
        }
        fn flush(&self, _: &Context, ino: Ino, fh: Fh) -> Result<()> {
            self.refuse(format!("flush {ino} {fh}"))
        }
        fn release(&self, _: &Context, ino: Ino, fh: Fh) -> Result<()> {
            self.refuse(format!("release {ino} {fh}"))
        }
        fn fsync(&self, _: &Context, ino: Ino, fh: Fh, d: bool) -> Result<()> {
            self.refuse(format!("fsync {ino} {fh} {d}"))
        }
        fn opendir(&self, _: &Context, ino: Ino) -> Result<Fh> {
            self.refuse(format!("opendir {ino}"))
        }
        fn readdir(
            &self,
            _: &Context,
            ino: Ino,
            fh: Fh,
            off: u64,
            plus: bool,
            _: &mut dyn FnMut(&Entry, sluice_api::filesystem::Listed) -> bool,
        ) -> Result<()> {
            self.refuse(format!("readdir {ino} {fh} {off} {plus}"))
        }
        fn releasedir(&self, _: &Context, ino: Ino, fh: Fh) -> Result<()> {
            self.refuse(format!("releasedir {ino} {fh}"))
        }
        fn fsyncdir(&self, _: &Context, ino: Ino, fh: Fh, d: bool) -> Result<()> {
            self.refuse(format!("fsyncdir {ino} {fh} {d}"))
        }
        fn statfs(&self, _: &Context, ino: Ino) -> Result<StatFs> {
            self.refuse(format!("statfs {ino}"))
        }
        fn setxattr(&self, _: &Context, ino: Ino, n: &[u8], v: &[u8], m: XattrMode) -> Result<()> {
            self.refuse(format!("setxattr {ino} {n:?} {v:?} {m:?}"))
        }
        fn getxattr(&self, _: &Context, ino: Ino, n: &[u8]) -> Result<Vec<u8>> {
            self.refuse(format!("getxattr {ino} {n:?}"))
        }
        fn listxattr(&self, _: &Context, ino: Ino) -> Result<Vec<Vec<u8>>> {
            self.refuse(format!("listxattr {ino}"))
        }
        fn removexattr(&self, _: &Context, ino: Ino, n: &[u8]) -> Result<()> {
            self.refuse(format!("removexattr {ino} {n:?}"))
        }
        fn access(&self, _: &Context, ino: Ino, m: u32) -> Result<()> {
            self.refuse(format!("access {ino} {m}"))
        }
        fn fallocate(&self, _: &Context, ino: Ino, fh: Fh, m: u32, o: u64, l: u64) -> Result<()> {
            self.refuse(format!("fallocate {ino} {fh} {m} {o} {l}"))
        }
        fn lseek(&self, _: &Context, ino: Ino, fh: Fh, o: u64, w: u32) -> Result<u64> {
            self.refuse(format!("lseek {ino} {fh} {o} {w}"))
        }
        fn copy_file_range(&self, _: &Context, r: &CopyRange, fi: Fh, fo: Fh) -> Result<u64> {
            self.refuse(format!("copy_file_range {r:?} {fi} {fo}"))
        }
    }

    /// Collects replies as whole messages.
    #[derive(Default)]
    struct Collect(Vec<Vec<u8>>);

    impl ReplySink for Collect {
        fn send(&mut self, head: &ReplyHead, payload: &[u8]) -> io::Result<()> {
            let mut m = head.as_bytes().to_vec();
            m.extend_from_slice(payload);
            self.0.push(m);
            Ok(())
        }
    }

    fn header(reply: &[u8]) -> OutHeader {
        OutHeader::read_from_prefix(reply).unwrap().0
    }

    fn init_msg(major: u32, minor: u32, flags: u32) -> Vec<u8> {
        let i = abi::InitIn {
            major,
            minor,
            max_readahead: 1 << 17,
            flags,
            flags2: 0,
            unused: [0; 11],
        };
        message(opcode::INIT, 1, 0, &[i.as_bytes()])
    }

    /// A dispatcher past INIT.
    fn started(errno: i32) -> Dispatcher<Refusing> {
        let d = Dispatcher::new(Refusing::with_errno(errno), Config::default());
        let mut out = Collect::default();
        d.handle_message(&init_msg(7, 38, u32::MAX), &mut Scratch::new(), &mut out)
            .unwrap();
        assert_eq!(header(&out.0[0]).error, 0);
        d
    }

    /// virtiofsd's `--cache` data policies on an OPEN reply: `never`
    /// bypasses the client's page cache, `always` keeps it across opens,
    /// `auto` passes on what the file system said.
    #[test]
    fn data_cache_sets_the_open_flags() {
        let from_fs = |keep_cache, direct_io| OpenOut {
            fh: 7,
            attr: crate::reply::tests::attr(sluice_api::meta::FileType::File, 1),
            keep_cache,
            direct_io,
        };
        let flags =
            |policy: DataCache, open: OpenOut| reply::open_out(&policy.apply(open)).open_flags;
        assert_eq!(flags(DataCache::Auto, from_fs(false, false)), 0);
        assert_eq!(
            flags(DataCache::Auto, from_fs(true, false)),
            abi::fopen::KEEP_CACHE
        );
        assert_eq!(
            flags(DataCache::Never, from_fs(true, false)),
            abi::fopen::DIRECT_IO
        );
        assert_eq!(
            flags(DataCache::Always, from_fs(false, true)),
            abi::fopen::KEEP_CACHE
        );
        assert_eq!(Config::default().data_cache, DataCache::Auto);
    }

    #[test]
    fn a_worker_that_must_not_wait_tries_hands_on_or_runs_each_operation() {
        let fsync = abi::FsyncIn {
            fh: 6,
            fsync_flags: 0,
            padding: 0,
        };
        let mkdir = abi::MkdirIn {
            mode: 0o755,
            umask: 0o22,
        };
        let getattr = message(opcode::GETATTR, 1, 1, &[&[0u8; 16]]);
        let mkdir = message(opcode::MKDIR, 2, 1, &[mkdir.as_bytes(), b"d\0"]);
        let fsync = message(opcode::FSYNC, 3, 5, &[fsync.as_bytes()]);
        let write = abi::WriteIn {
            fh: 6,
            offset: 0,
            size: 2,
            ..Default::default()
        };
        let write = message(opcode::WRITE, 4, 5, &[write.as_bytes(), b"hi"]);
        for remote in [false, true] {
            let fs = Refusing {
                remote,
                ..Refusing::with_errno(libc::EACCES)
            };
            let d = Dispatcher::new(fs, Config::default());
            let mut out = Collect::default();
            d.handle_message(&init_msg(7, 38, u32::MAX), &mut Scratch::new(), &mut out)
                .unwrap();
            let _g = sluice_api::wait::no_wait();
            let mut out = Collect::default();
            let handed_on = |m: &[u8], out: &mut Collect| {
                let r = d.handle_message(m, &mut Scratch::new(), out);
                matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            };
            // A sync always waits: handed on, never tried.
            assert!(handed_on(&fsync, &mut out));
            // Reading metadata is tried (the file system is called), and
            // so is a WRITE (it decides itself, before it takes a byte).
            assert!(!handed_on(&getattr, &mut out));
            assert!(!handed_on(&write, &mut out));
            // Changing it: run here when the metadata is local, handed on
            // untried when it is on another machine.
            assert_eq!(handed_on(&mkdir, &mut out), remote);
            let calls = d.filesystem().calls();
            assert_eq!(calls.len(), if remote { 2 } else { 3 }, "{calls:?}");
            assert!(calls[0].starts_with("getattr"), "{calls:?}");
            assert!(calls[1].starts_with("write"), "{calls:?}");
            assert!(calls.iter().all(|c| !c.starts_with("fsync")), "{calls:?}");
            // Nothing was answered for what was handed on.
            assert_eq!(out.0.len(), if remote { 2 } else { 3 });
        }
    }

    /// Runs one message; returns the replies and the outcome.
    fn run(d: &Dispatcher<Refusing>, msg: &[u8]) -> (Vec<Vec<u8>>, Outcome) {
        let mut out = Collect::default();
        let o = d
            .handle_message(msg, &mut Scratch::new(), &mut out)
            .unwrap();
        (out.0, o)
    }

    fn errno_of(replies: &[Vec<u8>]) -> i32 {
        assert_eq!(replies.len(), 1, "exactly one reply");
        let h = header(&replies[0]);
        assert_eq!(h.len as usize, replies[0].len());
        -h.error
    }

    #[test]
    fn init_negotiates_flags_and_sizes() {
        let d = Dispatcher::new(Refusing::default(), Config::default());
        let offered = init_flags::ASYNC_READ
            | init_flags::WRITEBACK_CACHE
            | init_flags::DO_READDIRPLUS
            | init_flags::MAX_PAGES
            | init_flags::POSIX_LOCKS;
        let (r, _) = run(&d, &init_msg(7, 38, offered));
        assert_eq!(header(&r[0]).len, 16 + 64);
        let out = abi::InitOut::read_from_bytes(&r[0][16..]).unwrap();
        assert_eq!((out.major, out.minor), (7, 38));
        assert_eq!(
            out.flags,
            init_flags::ASYNC_READ | init_flags::DO_READDIRPLUS | init_flags::MAX_PAGES
        );
        assert_eq!(out.max_write, 1 << 20);
        assert_eq!(out.max_pages, 256);
        assert_eq!(out.max_readahead, 1 << 17);
        // A newer kernel minor is answered with ours.
        let d = Dispatcher::new(Refusing::default(), Config::default());
        let (r, _) = run(&d, &init_msg(7, 45, 0));
        assert_eq!(
            abi::InitOut::read_from_bytes(&r[0][16..]).unwrap().minor,
            38
        );
        // A second INIT is refused.
        assert_eq!(errno_of(&run(&d, &init_msg(7, 38, 0)).0), libc::EIO);
    }

    /// A file system that keeps ACLs gets `POSIX_ACL` and `DONT_MASK`
    /// where the kernel offers them, and its requests then say the kernel
    /// checked them; one that does not gets neither.
    #[test]
    fn posix_acl_is_asked_for_where_the_file_system_keeps_acls() {
        let offered = init_flags::ASYNC_READ | init_flags::POSIX_ACL | init_flags::DONT_MASK;
        let lookup = message(opcode::LOOKUP, 5, 1, &[b"x\0"]);
        for acl in [false, true] {
            let d = Dispatcher::new(
                Refusing {
                    acl,
                    errno: libc::ENOENT,
                    ..Refusing::default()
                },
                Config::default(),
            );
            let (r, _) = run(&d, &init_msg(7, 38, offered));
            let out = abi::InitOut::read_from_bytes(&r[0][16..]).unwrap();
            let acl_flags = init_flags::POSIX_ACL | init_flags::DONT_MASK;
            assert_eq!(out.flags & acl_flags, if acl { acl_flags } else { 0 });
            assert_eq!(errno_of(&run(&d, &lookup).0), libc::ENOENT);
            assert_eq!(d.fs.kernel_checked.load(Ordering::SeqCst), usize::from(acl));
        }
        // A kernel that does not offer them: not granted, not trusted.
        let d = Dispatcher::new(
            Refusing {
                acl: true,
                errno: libc::ENOENT,
                ..Refusing::default()
            },
            Config::default(),
        );
        let (r, _) = run(&d, &init_msg(7, 38, init_flags::ASYNC_READ));
        let out = abi::InitOut::read_from_bytes(&r[0][16..]).unwrap();
        assert_eq!(out.flags & init_flags::POSIX_ACL, 0);
        run(&d, &lookup);
        assert_eq!(d.fs.kernel_checked.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn init_version_checks() {
        let d = Dispatcher::new(Refusing::default(), Config::default());
        assert_eq!(errno_of(&run(&d, &init_msg(7, 27, 0)).0), libc::EPROTO);
        assert_eq!(errno_of(&run(&d, &init_msg(6, 99, 0)).0), libc::EPROTO);
        let (r, _) = run(&d, &init_msg(8, 0, 0));
        let out = abi::InitOut::read_from_bytes(&r[0][16..]).unwrap();
        assert_eq!((header(&r[0]).error, out.major), (0, 7));
        // Still not started: other requests get EIO.
        let m = message(opcode::GETATTR, 5, 1, &[&[0u8; 16]]);
        assert_eq!(errno_of(&run(&d, &m).0), libc::EIO);
        assert!(d.filesystem().calls().is_empty());
    }

    #[test]
    fn engine_errors_map_through_errno() {
        let d = started(libc::ENOENT);
        let m = message(opcode::LOOKUP, 5, 1, &[b"missing\0"]);
        let (r, o) = run(&d, &m);
        assert_eq!(o, Outcome::Continue);
        assert_eq!(errno_of(&r), libc::ENOENT);
        assert_eq!(header(&r[0]).unique, 5);
        assert_eq!(
            d.filesystem().calls(),
            vec!["lookup 1000 1 [109, 105, 115, 115, 105, 110, 103]"]
        );
    }

    #[test]
    fn unknown_and_unimplemented_opcodes_get_enosys() {
        let d = started(libc::EIO);
        for op in [opcode::GETLK, opcode::IOCTL, opcode::TMPFILE, 9999] {
            let m = message(op, 8, 1, &[&[0u8; 64]]);
            assert_eq!(errno_of(&run(&d, &m).0), libc::ENOSYS, "opcode {op}");
        }
        assert!(d.filesystem().calls().is_empty());
    }

    #[test]
    fn malformed_requests_get_error_replies() {
        let d = started(libc::EIO);
        let m = message(opcode::GETATTR, 11, 1, &[&[0u8; 3]]);
        let (r, _) = run(&d, &m);
        assert_eq!(errno_of(&r), libc::EINVAL);
        assert_eq!(header(&r[0]).unique, 11);
        let m = message(opcode::MKDIR, 12, 1, &[&[0u8; 8], b"a/b\0"]);
        assert_eq!(errno_of(&run(&d, &m).0), libc::EINVAL);
        // Too short for a header: dropped.
        assert!(run(&d, &m[..20]).0.is_empty());
        assert!(d.filesystem().calls().is_empty());
    }

    #[test]
    fn no_reply_operations() {
        let d = started(libc::EIO);
        let m = message(opcode::FORGET, 1, 33, &[&7u64.to_ne_bytes()]);
        assert!(run(&d, &m).0.is_empty());
        let b = abi::BatchForgetIn { count: 1, dummy: 0 };
        let one = abi::ForgetOne {
            nodeid: 44,
            nlookup: 2,
        };
        let m = message(opcode::BATCH_FORGET, 2, 0, &[b.as_bytes(), one.as_bytes()]);
        assert!(run(&d, &m).0.is_empty());
        let m = message(opcode::INTERRUPT, 3, 0, &[&9u64.to_ne_bytes()]);
        assert!(run(&d, &m).0.is_empty());
        assert_eq!(d.filesystem().calls(), vec!["forget 33 7", "forget 44 2"]);
    }

    #[test]
    fn arguments_reach_the_file_system() {
        let d = started(libc::EACCES);
        let s = abi::SetattrIn {
            valid: fattr::MODE
                | fattr::SIZE
                | fattr::FH
                | fattr::ATIME
                | fattr::ATIME_NOW
                | fattr::MTIME
                | fattr::KILL_SUIDGID,
            fh: 9,
            size: 100,
            mode: libc::S_IFREG | 0o4755,
            mtime: 50,
            mtimensec: 7,
            ..Default::default()
        };
        let link = abi::LinkIn { oldnodeid: 70 };
        let mknod = abi::MknodIn {
            mode: libc::S_IFIFO | 0o600,
            rdev: 3,
            umask: 0o22,
            padding: 0,
        };
        let w = abi::WriteIn {
            fh: 4,
            offset: 8,
            size: 2,
            write_flags: abi::WRITE_KILL_SUIDGID,
            ..Default::default()
        };
        let fsync = abi::FsyncIn {
            fh: 6,
            fsync_flags: 1,
            padding: 0,
        };
        let msgs = [
            message(opcode::SETATTR, 1, 5, &[s.as_bytes()]),
            message(opcode::LINK, 2, 60, &[link.as_bytes(), b"new\0"]),
            message(opcode::MKNOD, 3, 1, &[mknod.as_bytes(), b"p\0"]),
            message(opcode::WRITE, 4, 5, &[w.as_bytes(), b"hi"]),
            message(opcode::FSYNCDIR, 5, 1, &[fsync.as_bytes()]),
        ];
        for m in &msgs {
            assert_eq!(errno_of(&run(&d, m).0), libc::EACCES);
        }
        assert_eq!(
            d.filesystem().calls(),
            vec![
                "setattr 5 Some(9) SetAttr { mode: Some(2541), uid: None, gid: None, \
                 atime: Some(Now), mtime: Some(At(Timestamp { secs: 50, nsecs: 7 })), \
                 kill_suidgid: true } \
                 Some(100)"
                    .to_owned(),
                "link 70 60 [110, 101, 119]".to_owned(),
                "mknod 1 [112] 10600 22 3".to_owned(),
                "write 5 4 8 [104, 105] true".to_owned(),
                "fsyncdir 1 6 true".to_owned(),
            ]
        );
    }

    /// A WRITE whose data the transport kept apart (virtio-fs) reaches the
    /// file system as a source with exactly the data — not request
    /// extensions after it — and is counted; decoded apart but handed in
    /// without its data it is EIO, not a client error.
    #[test]
    fn a_write_with_its_data_apart_reaches_the_file_system() {
        let d = started(libc::EACCES);
        let w = abi::WriteIn {
            fh: 4,
            offset: 8,
            size: 2,
            ..Default::default()
        };
        let whole = message(opcode::WRITE, 4, 5, &[w.as_bytes(), b"hi"]);
        let head = &whole[..whole.len() - 2];
        let mut out = Collect::default();
        let mut data = SliceSource::new(b"hi");
        d.handle_split(head, &mut data, &mut Scratch::new(), &mut out)
            .unwrap();
        assert_eq!(errno_of(&out.0), libc::EACCES);
        assert!(data.is_empty(), "the file system took the data");
        // One extension record after the data: not written.
        let mut ext = whole.clone();
        ext[0..4].copy_from_slice(&(whole.len() as u32 + 8).to_le_bytes());
        ext[36..38].copy_from_slice(&1u16.to_le_bytes());
        let mut out = Collect::default();
        let mut data = SliceSource::new(b"HIextensio");
        d.handle_split(&ext[..head.len()], &mut data, &mut Scratch::new(), &mut out)
            .unwrap();
        assert_eq!(errno_of(&out.0), libc::EACCES);
        assert_eq!(data.rest(), b"extensio");
        // A size that disagrees with the data: EINVAL, nothing taken.
        let mut out = Collect::default();
        let mut data = SliceSource::new(b"hi!");
        let mut lie = whole.clone();
        lie[0..4].copy_from_slice(&(whole.len() as u32 + 1).to_le_bytes());
        d.handle_split(&lie[..head.len()], &mut data, &mut Scratch::new(), &mut out)
            .unwrap();
        assert_eq!(errno_of(&out.0), libc::EINVAL);
        assert_eq!(data.len(), 3);
        // Decoded apart, handled without the data.
        let req = Request::decode_split(head, 2, d.limits()).unwrap();
        let mut out = Collect::default();
        d.handle(&req, &mut Scratch::new(), &mut out).unwrap();
        assert_eq!(errno_of(&out.0), libc::EIO);
        assert_eq!(
            d.filesystem().calls(),
            vec![
                "write 5 4 8 [104, 105] false".to_owned(),
                "write 5 4 8 [72, 73] false".to_owned(),
            ]
        );
        let written = d.metrics().snapshot().written_size;
        assert_eq!(written.counts.iter().sum::<u64>(), 2, "the two decoded");
        assert_eq!(written.sum, 4);
    }

    /// COPY_FILE_RANGE reaches the file system with the header's node as
    /// the source and a length the 32-bit reply can count; flags that do
    /// not fit 32 bits are refused before it.
    #[test]
    fn copy_file_range_reaches_the_file_system() {
        let d = started(libc::EXDEV);
        let c = abi::CopyFileRangeIn {
            fh_in: 3,
            off_in: 10,
            nodeid_out: 8,
            fh_out: 4,
            off_out: 20,
            len: u64::MAX,
            flags: 0,
        };
        let m = message(opcode::COPY_FILE_RANGE, 1, 7, &[c.as_bytes()]);
        assert_eq!(errno_of(&run(&d, &m).0), libc::EXDEV);
        let c = abi::CopyFileRangeIn {
            flags: 1 << 32,
            ..c
        };
        let m = message(opcode::COPY_FILE_RANGE, 2, 7, &[c.as_bytes()]);
        assert_eq!(errno_of(&run(&d, &m).0), libc::EINVAL);
        assert_eq!(
            d.filesystem().calls(),
            vec![format!(
                "copy_file_range CopyRange {{ fin: 7, off_in: 10, fout: 8, off_out: 20, \
                 len: {MAX_COPY_LEN}, flags: 0 }} 3 4"
            )]
        );
    }

    #[test]
    fn bad_lseek_whence_and_times_are_einval() {
        let d = started(libc::EIO);
        let l = abi::LseekIn {
            fh: 1,
            offset: 0,
            whence: libc::SEEK_END as u32,
            padding: 0,
        };
        let m = message(opcode::LSEEK, 1, 5, &[l.as_bytes()]);
        assert_eq!(errno_of(&run(&d, &m).0), libc::EINVAL);
        let s = abi::SetattrIn {
            valid: fattr::ATIME,
            atimensec: 1_000_000_000,
            ..Default::default()
        };
        let m = message(opcode::SETATTR, 2, 5, &[s.as_bytes()]);
        assert_eq!(errno_of(&run(&d, &m).0), libc::EINVAL);
        assert!(d.filesystem().calls().is_empty());
    }

    #[test]
    fn times_beyond_what_the_format_holds_are_clamped() {
        let d = started(libc::EIO);
        for (secs, want) in [
            (u64::MAX / 2, MAX_TIME_SECS as i64),
            ((i64::MIN / 2) as u64, -(MAX_TIME_SECS as i64)),
        ] {
            let s = abi::SetattrIn {
                valid: fattr::MTIME,
                mtime: secs,
                ..Default::default()
            };
            let m = message(opcode::SETATTR, 3, 5, &[s.as_bytes()]);
            run(&d, &m);
            let calls = d.filesystem().calls();
            let last = calls.last().expect("a setattr call");
            assert!(last.contains(&format!("secs: {want}")), "{last}");
        }
    }

    #[test]
    fn destroy_ends_the_session_once() {
        let d = started(libc::EIO);
        let (r, o) = run(&d, &message(opcode::DESTROY, 9, 0, &[]));
        assert_eq!(o, Outcome::Destroyed);
        assert_eq!(errno_of(&r), 0);
        d.shutdown();
        assert_eq!(d.filesystem().destroyed.load(Ordering::SeqCst), 1);
        let m = message(opcode::GETATTR, 10, 1, &[&[0u8; 16]]);
        let (r, o) = run(&d, &m);
        assert_eq!((errno_of(&r), o), (libc::ENODEV, Outcome::Destroyed));
    }

    /// Every reply the dispatcher produced for one message is well formed:
    /// at most one, its length field equals its size, its error is 0 or a
    /// negated errno, and it answers the message's request id.
    fn check_replies(msg: &[u8], replies: &[Vec<u8>]) -> std::result::Result<(), TestCaseError> {
        prop_assert!(replies.len() <= 1);
        if let Some(r) = replies.first() {
            let h = header(r);
            prop_assert_eq!(h.len as usize, r.len());
            prop_assert!(h.error <= 0 && h.error > -4096);
            let unique = abi::InHeader::read_from_prefix(msg).unwrap().0.unique;
            prop_assert_eq!(h.unique, unique);
        }
        Ok(())
    }

    /// Opcodes weighted toward the implemented ones.
    fn any_opcode() -> impl Strategy<Value = u32> {
        prop_oneof![9 => 1u32..=52, 1 => any::<u32>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let d = started(libc::EIO);
            let mut out = Collect::default();
            d.handle_message(&bytes, &mut Scratch::new(), &mut out).unwrap();
            if bytes.len() >= 40 {
                check_replies(&bytes, &out.0)?;
            } else {
                prop_assert!(out.0.is_empty());
            }
        }

        #[test]
        fn random_bodies_with_valid_headers_never_panic(
            op in any_opcode(),
            body in proptest::collection::vec(any::<u8>(), 0..400),
            cut in 0usize..450,
            extlen in prop_oneof![4 => Just(0u16), 1 => any::<u16>()],
        ) {
            let d = started(libc::EIO);
            let mut msg = message(op, 77, 1, &[&body]);
            msg[36..38].copy_from_slice(&extlen.to_ne_bytes());
            // Sometimes truncate the message below what the header declares.
            let msg = &msg[..msg.len().min(40 + cut)];
            let mut out = Collect::default();
            d.handle_message(msg, &mut Scratch::new(), &mut out).unwrap();
            check_replies(msg, &out.0)?;
            if !crate::request::expects_reply(op) {
                prop_assert!(out.0.is_empty());
            }
        }

        #[test]
        fn oversized_io_is_refused(size in (1u32 << 20) + 1..u32::MAX, op in prop_oneof![
            Just(opcode::WRITE), Just(opcode::READ), Just(opcode::READDIR), Just(opcode::READDIRPLUS)
        ]) {
            let d = Dispatcher::new(Refusing::with_errno(libc::EIO), Config {
                max_pages: 256,
                ..Config::default()
            });
            run(&d, &init_msg(7, 38, u32::MAX));
            let r = abi::ReadIn { size, ..Default::default() };
            let msg = message(op, 5, 2, &[r.as_bytes()]);
            let (replies, _) = run(&d, &msg);
            if size as usize > d.limits().max_read as usize || op == opcode::WRITE {
                prop_assert_eq!(errno_of(&replies), libc::EINVAL);
                prop_assert!(d.filesystem().calls().is_empty());
            }
        }
    }
}
