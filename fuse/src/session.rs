//! A FUSE session on `/dev/fuse`: worker threads that read requests, run
//! them through the [`Dispatcher`] and write the replies.
//!
//! Each worker has its own `/dev/fuse` file cloned from the mount's
//! (`FUSE_DEV_IOC_CLONE`), its own request buffer (`max_write` plus a page
//! of headroom for the header and arguments) and its own reply scratch, so
//! workers share nothing but the dispatcher.
//!
//! Read errors: ENOENT (the request was interrupted and withdrawn before we
//! read it), EINTR and EAGAIN are retried; ENODEV (unmounted) and
//! ECONNABORTED (the connection was aborted) end the worker cleanly. A
//! reply write failing with ENOENT (the kernel no longer waits for that
//! request) is ignored. When the last
//! worker ends — by DESTROY or by unmount — `Filesystem::destroy` runs once.
//!
//! A worker does not wait on the object store, the disk or a commit while
//! requests queue behind it: it runs each request under
//! `sluice_api::wait::no_wait`, and one that would wait (a block not in
//! the memory cache, a file range not in the page cache, a commit, a sync)
//! is copied and handed to a waiter thread, which runs it again and writes
//! its reply to `/dev/fuse` itself; the kernel matches replies to requests
//! by their id, in any order. Metadata operations are handed on too when
//! the metadata engine is another machine (Redis); with local metadata
//! (SQLite) they run on the worker. At most [`Waiting::max_waiting`] requests wait at once;
//! past that a worker answers the request itself, waiting — the
//! back-pressure. DESTROY waits until the waiters are idle.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::dev::{self, DevError, Mount};
use sluice_api::Result as EngineResult;
use sluice_api::fragment::{BufDest, Fragment, ReadDest};

use crate::dispatch::{Config, Dispatcher, Outcome, ReadReply, ReplySink, Scratch, page_size};
use crate::reply::ReplyHead;
use sluice_api::filesystem::Filesystem;

/// Replies written to one `/dev/fuse` file.
struct DevSink<'a> {
    fd: &'a OwnedFd,
    /// Gathers the fragments of a READ that is not one piece of a block. It
    /// never shrinks, so it is zero-filled once, not on every read.
    gather: Vec<u8>,
    /// The READ being answered.
    read: DevRead,
}

/// The state of one READ reply on `/dev/fuse`.
#[derive(Debug, Default)]
struct DevRead {
    unique: u64,
    size: usize,
    /// Bytes placed in `gather`.
    at: usize,
    /// Whether the whole reply already went out (the first fragment was
    /// all of it), and how its write ended.
    sent: Option<io::Result<()>>,
}

impl<'a> DevSink<'a> {
    fn new(fd: &'a OwnedFd, gather: Vec<u8>) -> Self {
        DevSink {
            fd,
            gather,
            read: DevRead::default(),
        }
    }
}

impl ReplySink for DevSink<'_> {
    fn send(&mut self, head: &ReplyHead, payload: &[u8]) -> io::Result<()> {
        dev::write_reply(self.fd.as_fd(), head, payload)
    }

    /// The usual READ — one piece of one cached block — is written to the
    /// kernel straight from the block, so the kernel's copy into the
    /// reader's pages is the only one. Other reads (several fragments,
    /// holes, local object ranges) are gathered into one buffer first.
    fn read_reply(&mut self, unique: u64, size: usize) -> io::Result<Option<&mut dyn ReadReply>> {
        if self.gather.len() < size {
            self.gather.resize(size, 0);
        }
        self.read = DevRead {
            unique,
            size,
            at: 0,
            sent: None,
        };
        Ok(Some(self))
    }
}

impl ReadDest for DevSink<'_> {
    fn put(&mut self, frag: Fragment<'_>) -> EngineResult<()> {
        let r = &mut self.read;
        if let Fragment::Data(d) = frag
            && r.at == 0
            && r.sent.is_none()
            && d.len() == r.size
        {
            let head = ReplyHead::data(r.unique, d.len());
            r.sent = Some(dev::write_reply(self.fd.as_fd(), &head, d));
            return Ok(());
        }
        if r.sent.is_some() {
            return Err(sluice_api::Error::Invalid(format!(
                "a fragment past the {}-byte read {}",
                r.size, r.unique
            )));
        }
        let len = frag.len();
        let room = self.gather.get_mut(r.at..r.size).unwrap_or_default();
        BufDest::new(room).put(frag)?;
        r.at += len;
        Ok(())
    }
}

impl ReadReply for DevSink<'_> {
    fn finish(&mut self, read: EngineResult<usize>) -> io::Result<EngineResult<usize>> {
        let r = std::mem::take(&mut self.read);
        match (read, r.sent) {
            (Ok(n), Some(sent)) => sent.map(|()| Ok(n)),
            // The whole reply is out; the read failing after it cannot
            // take it back.
            (Err(e), Some(sent)) => {
                log::warn!("read {} failed after its data was sent: {e}", r.unique);
                sent.map(|()| Ok(r.size))
            }
            (Err(e), None) => Ok(Err(e)),
            (Ok(n), None) => {
                let n = n.min(r.at);
                let head = ReplyHead::data(r.unique, n);
                dev::write_reply(self.fd.as_fd(), &head, &self.gather[..n])?;
                Ok(Ok(n))
            }
        }
    }
}

/// How a session answers requests that would wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// Most requests waiting on the waiter threads at once (0: every
    /// request is answered by the worker that read it, waiting).
    pub max_waiting: usize,
    /// Waiter threads.
    pub waiters: usize,
}

impl Default for Waiting {
    fn default() -> Self {
        Waiting {
            max_waiting: 64,
            waiters: 16,
        }
    }
}

/// Requests handed on and not yet answered, with the condition DESTROY
/// waits on.
#[derive(Debug, Default)]
struct Count {
    n: Mutex<usize>,
    idle: Condvar,
}

impl Count {
    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.n.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn done(&self) {
        let mut n = self.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.idle.notify_all();
        }
    }
}

/// Runs a request that waited and writes its reply. A request that panics
/// is answered EIO: the kernel would otherwise wait for it for ever.
fn answer_waiting<F: Filesystem>(
    dispatcher: &Dispatcher<F>,
    request: &[u8],
    fd: &OwnedFd,
    scratch: &mut Scratch,
    gather: &mut Vec<u8>,
) {
    let mut sink = DevSink::new(fd, std::mem::take(gather));
    let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dispatcher.handle_message(request, scratch, &mut sink)
    }));
    *gather = std::mem::take(&mut sink.gather);
    let result = match answered {
        Ok(r) => r.map(|_| ()),
        Err(_) => {
            log::warn!("a FUSE request panicked on a waiter; answering EIO");
            *scratch = Scratch::new();
            let unique = request
                .get(8..16)
                .and_then(|u| u.try_into().ok())
                .map_or(0, u64::from_le_bytes);
            dev::write_reply(fd.as_fd(), &ReplyHead::error(unique, libc::EIO), &[])
        }
    };
    match result {
        Ok(()) => {}
        // The kernel no longer waits for it, or the mount is gone.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => {}
        Err(e) => log::warn!("a reply to /dev/fuse failed: {e}"),
    }
}

thread_local! {
    /// A waiter thread's reply buffers (its READ gather and scratch).
    static WAITER_BUFS: RefCell<(Scratch, Vec<u8>)> = RefCell::new((Scratch::new(), Vec::new()));
}

/// The session's waiter threads (a [`crate::waiters::Waiters`] pool) and
/// the bound on the requests handed to them.
struct HandOn<F> {
    pool: crate::waiters::Waiters,
    dispatcher: Arc<Dispatcher<F>>,
    waiting: Arc<Count>,
    max_waiting: usize,
}

impl<F> std::fmt::Debug for HandOn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandOn")
            .field("pool", &self.pool)
            .field("max_waiting", &self.max_waiting)
            .finish_non_exhaustive()
    }
}

impl<F: Filesystem + 'static> HandOn<F> {
    fn start(
        dispatcher: &Arc<Dispatcher<F>>,
        settings: Waiting,
    ) -> Result<Option<HandOn<F>>, DevError> {
        if settings.max_waiting == 0 || settings.waiters == 0 {
            return Ok(None);
        }
        let pool = crate::waiters::Waiters::start("sluice-wait", settings.waiters)
            .map_err(DevError::Spawn)?;
        Ok(Some(HandOn {
            pool,
            dispatcher: Arc::clone(dispatcher),
            waiting: Arc::new(Count::default()),
            max_waiting: settings.max_waiting,
        }))
    }

    /// Hands `request` (answered on `fd`) to a waiter; returns `false` when
    /// as many requests as allowed wait already.
    fn submit(&self, request: &[u8], fd: &Arc<OwnedFd>) -> bool {
        {
            let mut n = self.waiting.lock();
            if *n >= self.max_waiting {
                return false;
            }
            *n += 1;
        }
        let (request, fd) = (request.to_vec(), Arc::clone(fd));
        let (dispatcher, waiting) = (Arc::clone(&self.dispatcher), Arc::clone(&self.waiting));
        // The kernel waits for every request it sent: a job answers even
        // while the pool shuts down (the session is ending; a reply to a
        // connection that is gone fails harmlessly).
        let job: crate::waiters::Job = Box::new(move |_closing| {
            WAITER_BUFS.with(|bufs| {
                let mut bufs = bufs.borrow_mut();
                let (scratch, gather) = &mut *bufs;
                answer_waiting(&dispatcher, &request, &fd, scratch, gather);
            });
            waiting.done();
        });
        if self.pool.submit(job).is_err() {
            self.waiting.done();
            return false;
        }
        true
    }
}

impl<F> HandOn<F> {
    /// Waits until no request is with a waiter (DESTROY must not overtake
    /// a RELEASE handed on before it).
    fn wait_idle(&self) {
        let mut n = self.waiting.lock();
        while *n > 0 {
            n = self.waiting.idle.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lets the waiters answer what they hold and ends them.
    fn join(self) {
        self.pool.shut_down();
    }
}

/// A mounted file system ready to be served.
#[derive(Debug)]
pub struct Session<F> {
    dispatcher: Arc<Dispatcher<F>>,
    fd: Arc<OwnedFd>,
    path: PathBuf,
    waiting: Waiting,
}

/// A session served by background threads.
#[derive(Debug)]
pub struct BackgroundSession<F> {
    dispatcher: Arc<Dispatcher<F>>,
    path: PathBuf,
    workers: Vec<JoinHandle<Result<(), DevError>>>,
    /// Shared with the workers, which end first.
    waiters: Option<Arc<HandOn<F>>>,
}

impl<F: Filesystem + 'static> Session<F> {
    /// A session serving `fs` on `mount`.
    pub fn new(fs: F, mount: Mount, config: Config) -> Session<F> {
        let (fd, path) = mount.into_parts();
        Session {
            dispatcher: Arc::new(Dispatcher::new(fs, config)),
            fd: Arc::new(fd),
            path,
            waiting: Waiting::default(),
        }
    }

    /// How requests that would wait are answered (default: by 16 waiter
    /// threads, at most 64 at once).
    pub fn with_waiting(mut self, waiting: Waiting) -> Self {
        self.waiting = waiting;
        self
    }

    /// The dispatcher (and through it, the file system).
    pub fn dispatcher(&self) -> &Arc<Dispatcher<F>> {
        &self.dispatcher
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Starts `workers` threads (at least one), each on its own cloned
    /// `/dev/fuse` file. A kernel without `FUSE_DEV_IOC_CLONE` gets workers
    /// sharing the mount's file instead, which is correct, only slower.
    fn start(
        &self,
        workers: usize,
        waiters: Option<&Arc<HandOn<F>>>,
    ) -> Result<Vec<JoinHandle<Result<(), DevError>>>, DevError> {
        let mut handles = Vec::new();
        // One page beyond max_write holds the header and WRITE arguments
        // (libfuse allows the same headroom).
        let buf_size = self.dispatcher.limits().max_write as usize + page_size();
        for i in 0..workers.max(1) {
            let fd = if i == 0 {
                Arc::clone(&self.fd)
            } else {
                match dev::clone_fd(self.fd.as_fd()) {
                    Ok(fd) => Arc::new(fd),
                    Err(e) => {
                        log::warn!("{e}; worker {i} shares the mount's /dev/fuse file");
                        Arc::clone(&self.fd)
                    }
                }
            };
            let dispatcher = Arc::clone(&self.dispatcher);
            let waiters = waiters.cloned();
            let handle = std::thread::Builder::new()
                .name(format!("sluice-fuse-{i}"))
                .spawn(move || serve(&fd, &dispatcher, buf_size, waiters.as_deref()))
                .map_err(DevError::Spawn)?;
            handles.push(handle);
        }
        Ok(handles)
    }

    /// Serves the mount with `workers` threads until it is unmounted (or the
    /// kernel sends DESTROY), then calls `Filesystem::destroy`.
    pub fn run(self, workers: usize) -> Result<(), DevError> {
        self.spawn(workers)?.join()
    }

    /// Serves the mount in the background with `workers` threads.
    pub fn spawn(self, workers: usize) -> Result<BackgroundSession<F>, DevError> {
        let waiters = HandOn::start(&self.dispatcher, self.waiting)?.map(Arc::new);
        let workers = self.start(workers, waiters.as_ref())?;
        Ok(BackgroundSession {
            dispatcher: self.dispatcher,
            path: self.path,
            workers,
            waiters,
        })
    }
}

impl<F: Filesystem> BackgroundSession<F> {
    /// The dispatcher (and through it, the file system).
    pub fn dispatcher(&self) -> &Arc<Dispatcher<F>> {
        &self.dispatcher
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until every worker has stopped (after the mount is unmounted),
    /// then calls `Filesystem::destroy` (once). Returns the first worker
    /// error.
    pub fn join(self) -> Result<(), DevError> {
        let mut first = Ok(());
        for h in self.workers {
            let r = h.join().unwrap_or(Err(DevError::WorkerPanicked));
            if first.is_ok() {
                first = r;
            }
        }
        // The workers are gone, and their references with them: let the
        // waiters answer what they hold, then close the file system.
        if let Some(waiters) = self.waiters.and_then(Arc::into_inner) {
            waiters.join();
        }
        self.dispatcher.shutdown();
        first
    }

    /// Unmounts the mount point and waits for the workers to stop.
    pub fn unmount_and_join(self) -> Result<(), DevError> {
        dev::unmount(&self.path)?;
        self.join()
    }
}

/// One worker's loop.
fn serve<F: Filesystem + 'static>(
    fd: &Arc<OwnedFd>,
    dispatcher: &Dispatcher<F>,
    buf_size: usize,
    waiters: Option<&HandOn<F>>,
) -> Result<(), DevError> {
    let mut buf = vec![0u8; buf_size.max(crate::abi::MIN_READ_BUFFER)];
    let mut scratch = Scratch::new();
    let mut sink = DevSink::new(fd, Vec::new());
    loop {
        let n = match dev::read_request(fd.as_fd(), &mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => continue,
                Some(libc::ENODEV) => return Ok(()),
                // The kernel tore the connection down (an unmount racing
                // this read, or an abort through fusectl): nothing more
                // will come, the same as ENODEV.
                Some(libc::ECONNABORTED) => {
                    log::info!("the kernel aborted the FUSE connection; the worker stops");
                    return Ok(());
                }
                _ => return Err(DevError::Read(e)),
            },
        };
        if let Some(waiters) = waiters
            && buf.get(4..8) == Some(&crate::abi::opcode::DESTROY.to_le_bytes()[..])
        {
            waiters.wait_idle();
        }
        let answered = match waiters {
            Some(waiters) => {
                let tried = {
                    let _no_wait = sluice_api::wait::no_wait();
                    dispatcher.handle_message(&buf[..n], &mut scratch, &mut sink)
                };
                match tried {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if waiters.submit(&buf[..n], fd) {
                            Ok(Outcome::Continue)
                        } else {
                            // As many wait as may: answer it here, waiting.
                            let _retry = sluice_api::wait::retry();
                            dispatcher.handle_message(&buf[..n], &mut scratch, &mut sink)
                        }
                    }
                    other => other,
                }
            }
            None => dispatcher.handle_message(&buf[..n], &mut scratch, &mut sink),
        };
        match answered {
            Ok(Outcome::Continue) => {}
            Ok(Outcome::Destroyed) => return Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(libc::ENOENT) => {}
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(DevError::Write(e)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::abi::OutHeader;
    use zerocopy::FromBytes;

    /// A `DevSink` writing to a pipe, and the pipe's read end.
    fn pipe() -> (OwnedFd, std::io::PipeReader) {
        let (r, w) = std::io::pipe().unwrap();
        (OwnedFd::from(w), r)
    }

    /// One reply off the pipe: its header and data.
    fn reply(r: &mut std::io::PipeReader) -> (OutHeader, Vec<u8>) {
        let mut head = [0u8; size_of::<OutHeader>()];
        r.read_exact(&mut head).unwrap();
        let h = OutHeader::read_from_bytes(&head[..]).unwrap();
        let mut data = vec![0u8; h.len as usize - head.len()];
        r.read_exact(&mut data).unwrap();
        (h, data)
    }

    #[test]
    fn a_read_of_one_block_piece_goes_out_from_the_block() {
        let (w, mut r) = pipe();
        let mut sink = DevSink::new(&w, Vec::new());
        let dst = sink.read_reply(7, 4).unwrap().unwrap();
        dst.put(Fragment::Data(b"abcd")).unwrap();
        assert_eq!(dst.finish(Ok(4)).unwrap().unwrap(), 4);
        // Nothing was gathered: the reply was written from the block.
        assert!(sink.gather.iter().all(|&b| b == 0));
        let (h, data) = reply(&mut r);
        assert_eq!((h.unique, h.error), (7, 0));
        assert_eq!(data, b"abcd");
    }

    #[test]
    fn a_read_of_several_fragments_is_gathered_once() {
        let (w, mut r) = pipe();
        let mut sink = DevSink::new(&w, Vec::new());
        let dst = sink.read_reply(8, 10).unwrap().unwrap();
        dst.put(Fragment::Data(b"ab")).unwrap();
        dst.put(Fragment::Zeros(3)).unwrap();
        dst.put(Fragment::Data(b"cd")).unwrap();
        // Short: end of file after 7 of the 10 bytes asked for.
        assert_eq!(dst.finish(Ok(7)).unwrap().unwrap(), 7);
        let (h, data) = reply(&mut r);
        assert_eq!(h.unique, 8);
        assert_eq!(data, b"ab\0\0\0cd");
        // A fragment past the read is refused, not written past it.
        let dst = sink.read_reply(9, 2).unwrap().unwrap();
        assert!(dst.put(Fragment::Zeros(3)).is_err());
    }

    #[test]
    fn a_failed_read_sends_nothing_unless_its_data_already_went() {
        let (w, mut r) = pipe();
        let mut sink = DevSink::new(&w, Vec::new());
        let dst = sink.read_reply(10, 4).unwrap().unwrap();
        dst.put(Fragment::Data(b"ab")).unwrap();
        let got = dst.finish(Err(sluice_api::Error::WouldBlock)).unwrap();
        assert!(matches!(got, Err(sluice_api::Error::WouldBlock)));
        // Then the whole data goes out in one piece, and the read fails
        // after it: the reply stands (it cannot be taken back).
        let dst = sink.read_reply(11, 2).unwrap().unwrap();
        dst.put(Fragment::Data(b"xy")).unwrap();
        let err = sluice_api::Error::Io(io::Error::other("late"));
        assert_eq!(dst.finish(Err(err)).unwrap().unwrap(), 2);
        drop(sink);
        drop(w);
        let (h, data) = reply(&mut r);
        assert_eq!((h.unique, data.as_slice()), (11, &b"xy"[..]));
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "read 10 sent something: {rest:?}");
    }
}
