//! The vhost-user-fs backend: features, configuration space, memory updates
//! and the mapping of request queues onto worker threads.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use log::{info, warn};
use vhost::vhost_user::Listener;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};

use crate::RequestHandler;
use crate::config::DeviceConfig;
use crate::error::{Error, Result};
use crate::waiting::{Completion, Parked, Waiters};
use crate::worker::{GuestMem, Limits, QueueCtx, QueueStats, WorkerState, process_queue};

/// The virtio features the device offers.
pub const DEVICE_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC)
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// The vhost-user protocol features the device offers.
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
}

/// The backend state shared by the vhost-user handler thread and the workers.
struct FsBackend<H: ?Sized> {
    config: DeviceConfig,
    config_space: Vec<u8>,
    mem: GuestMem,
    event_idx: AtomicBool,
    /// One per worker thread, i.e. one per queue.
    workers: Vec<Mutex<WorkerState>>,
    /// One per queue.
    stats: Arc<[QueueStats]>,
    /// Taken once per worker by the daemon when it starts the thread.
    exit_events: Mutex<Vec<Option<(EventConsumer, EventNotifier)>>>,
    /// The descriptors of the exit-event consumers the daemon took, which
    /// it never closes (see [`VirtioFsDevice::serve`]).
    exit_consumer_fds: Mutex<Vec<RawFd>>,
    handler: Arc<H>,
    /// One per queue: its chains with the waiters.
    parked: Vec<Arc<Parked>>,
    /// The threads requests that wait run on (`None` with `max_waiting`
    /// 0); they end with the connection ([`VirtioFsDevice::serve`]).
    waiters: Option<Arc<Waiters>>,
    /// Each queue's vring, noted by its worker, so that stopping a ring
    /// (GET_VRING_BASE) can return the chains the waiters still hold.
    vrings: Mutex<Vec<Option<VringRwLock<GuestMem>>>>,
}

impl<H: RequestHandler + ?Sized> FsBackend<H> {
    /// Closes the exit-event consumers the daemon took. vhost-user-backend
    /// (0.24, and its main branch as of 2026-05) registers each with its
    /// worker's epoll through `into_raw_fd()` and never closes it: without
    /// this, every connection would leak one descriptor per queue, and a
    /// daemon whose VMs reconnect long enough would run out of them (the
    /// chains fuzzer, which reconnects after each DESTROY, hit the limit of
    /// 20000: its next INIT never got an answer). Called once the daemon is
    /// dropped, when its worker threads are joined and their epoll
    /// descriptors closed, so nothing refers to these numbers any more;
    /// the crate's version is pinned so that a release that closes them
    /// itself is noticed (its `exit_event` would then be double-closed).
    fn close_exit_consumers(&self) {
        let fds = match self.exit_consumer_fds.lock() {
            Ok(mut fds) => std::mem::take(&mut *fds),
            Err(_) => return,
        };
        for fd in fds {
            // SAFETY: `fd` is the consumer the daemon took from
            // `exit_event` and turned into a raw descriptor it never closes
            // (see above); the daemon is gone, so this is its only owner.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            max_request_size: self.config.max_request_size,
            batch: usize::from(self.config.queue_size),
            guest_io: self.config.guest_io,
            max_waiting: self.config.max_waiting,
        }
    }

    /// The epoll data of queue `thread_id`'s completion eventfd: past the
    /// ids vhost-user-backend keeps for the queues and its exit event.
    fn completion_event(&self) -> u16 {
        u16::try_from(self.config.num_queues() + 1).unwrap_or(u16::MAX)
    }
}

impl<H: RequestHandler + ?Sized> VhostUserBackend for FsBackend<H> {
    type Bitmap = ();
    type Vring = VringRwLock<GuestMem>;

    fn num_queues(&self) -> usize {
        self.config.num_queues()
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.config.queue_size)
    }

    fn features(&self) -> u64 {
        DEVICE_FEATURES
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        protocol_features()
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        // An out-of-range read gets an empty answer, which the vhost-user
        // layer reports to the frontend as a failed GET_CONFIG.
        let start = offset as usize;
        match start.checked_add(size as usize) {
            Some(end) if end <= self.config_space.len() => self.config_space[start..end].to_vec(),
            _ => Vec::new(),
        }
    }

    fn set_config(&self, _offset: u32, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the virtio-fs configuration space is read-only",
        ))
    }

    fn update_memory(&self, _mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        // The vhost-user layer swaps the new table into the same atomic handle
        // the workers hold; each batch takes its own snapshot of it.
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.config.num_queues())
            .map(|queue| 1u64 << queue)
            .collect()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let mut events = self.exit_events.lock().ok()?;
        let pair = events.get_mut(thread_index)?.take()?;
        self.exit_consumer_fds.lock().ok()?.push(pair.0.as_raw_fd());
        Some(pair)
    }

    /// GET_VRING_BASE stops queue `queue_index`: the chains the waiters
    /// hold are finished and returned to the ring first, so the ring the
    /// frontend reads back (and may hand to a new backend) has no request
    /// still being answered.
    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        let queue = queue_index as usize;
        let Some(parked) = self.parked.get(queue) else {
            return Ok(());
        };
        // A worker in the middle of a batch (it took chains before the ring
        // was marked not ready) finishes it first: taking its state waits
        // for that. No batch starts after (a worker woken now sees the
        // ring not ready, and only reaps its io_uring ring, whose parked
        // chains join the completion list drained below) — so no chain is
        // handed on, or returned, once this returns. The state is not held
        // while waiting: the worker must be free to reap its ring.
        drop(
            self.workers
                .get(queue)
                .map(|w| w.lock().unwrap_or_else(|p| p.into_inner())),
        );
        if parked.outstanding() == 0 {
            return Ok(());
        }
        let mut done = Vec::new();
        parked.drain(&mut done);
        let vring = self
            .vrings
            .lock()
            .ok()
            .and_then(|v| v.get(queue).cloned().flatten());
        if let Some(vring) = vring {
            return_to_ring(queue, &vring, &self.mem, &done);
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock<GuestMem>],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            warn!("queue {thread_id}: unexpected event set {evset:?}");
            return Ok(());
        }
        // A waiter finished a chain of this queue: its one vring. Otherwise
        // a kick of the vring with that index among this thread's.
        let index = if device_event == self.completion_event() {
            0
        } else {
            usize::from(device_event)
        };
        let Some(vring) = vrings.get(index) else {
            warn!("queue {thread_id}: event for unknown vring {device_event}");
            return Ok(());
        };
        let Some(worker) = self.workers.get(thread_id) else {
            return Ok(());
        };
        // Each worker state is only ever used by its own thread; the mutex is
        // uncontended.
        let mut state = worker
            .lock()
            .map_err(|_| io::Error::other("worker state poisoned"))?;
        if !state.pinned {
            state.pinned = true;
            if let Some(Some(cpu)) = self.config.worker_cpus.get(thread_id) {
                match sluice_numa::pinning::pin_current_thread(*cpu) {
                    Ok(()) => info!("queue {thread_id}: worker pinned to CPU {cpu}"),
                    Err(e) => warn!("queue {thread_id}: cannot pin the worker to CPU {cpu}: {e}"),
                }
            }
            if let Ok(mut noted) = self.vrings.lock()
                && let Some(slot) = noted.get_mut(thread_id)
            {
                *slot = Some(vring.clone());
            }
        }
        if self.stats.get(thread_id).is_none() {
            return Err(io::Error::other("no counters for this queue"));
        }
        let parked = self
            .parked
            .get(thread_id)
            .ok_or_else(|| io::Error::other("no completion list for this queue"))?;
        let ctx = QueueCtx {
            queue: u16::try_from(thread_id).unwrap_or(u16::MAX),
            vring,
            mem: &self.mem,
            event_idx: self.event_idx.load(Ordering::Acquire),
            limits: self.limits(),
            handler: &self.handler,
            stats: &self.stats,
            parked,
            all_parked: &self.parked,
            waiters: self
                .waiters
                .as_ref()
                .filter(|_| self.config.max_waiting > 0),
        };
        process_queue(&ctx, &mut state)
    }
}

/// Returns chains the waiters finished to `vring` and signals the guest
/// (a ring being stopped; its worker does the same for each batch).
fn return_to_ring(
    queue: usize,
    vring: &VringRwLock<GuestMem>,
    mem: &GuestMem,
    done: &[Completion],
) {
    use vhost_user_backend::VringT;
    use virtio_queue::QueueT;
    if done.is_empty() {
        return;
    }
    let mem = vm_memory::GuestAddressSpace::memory(mem).into_inner();
    let mut guard = vring.get_mut();
    for c in done {
        if let Err(e) = guard.get_queue_mut().add_used(&*mem, c.head, c.used) {
            warn!("queue {queue}: cannot return descriptor {}: {e}", c.head);
        }
    }
    drop(guard);
    if let Err(e) = vring.signal_used_queue() {
        warn!("queue {queue}: cannot signal the guest: {e}");
    }
}

/// A virtio-fs device served over a vhost-user socket.
///
/// ```no_run
/// # use std::sync::Arc;
/// # fn demo(handler: Arc<dyn sluice_vhost::RequestHandler>) -> sluice_vhost::Result<()> {
/// let config = sluice_vhost::DeviceConfig::new("training", 4);
/// let mut listener = sluice_vhost::listen("/run/sluice/fs.sock", None)?;
/// loop {
///     // One connection at a time: QEMU reconnects after a restart.
///     sluice_vhost::VirtioFsDevice::new(config.clone(), handler.clone())?.serve(&mut listener)?;
/// }
/// # }
/// ```
pub struct VirtioFsDevice<H: RequestHandler + ?Sized> {
    backend: Arc<FsBackend<H>>,
}

impl<H: RequestHandler + ?Sized> std::fmt::Debug for VirtioFsDevice<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioFsDevice")
            .field("config", &self.backend.config)
            .finish_non_exhaustive()
    }
}

impl<H: RequestHandler + ?Sized> VirtioFsDevice<H> {
    /// A device with `config` whose requests go to `handler`.
    pub fn new(config: DeviceConfig, handler: Arc<H>) -> Result<Self> {
        let stats = (0..config.num_queues())
            .map(|_| QueueStats::default())
            .collect();
        Self::with_stats(config, handler, stats)
    }

    /// A device like [`VirtioFsDevice::new`] that counts in `stats` (one
    /// per queue, hiprio first), e.g. counters a daemon keeps across the
    /// connections of successive VMs.
    pub fn with_stats(
        config: DeviceConfig,
        handler: Arc<H>,
        stats: Arc<[QueueStats]>,
    ) -> Result<Self> {
        config.validate()?;
        let num_queues = config.num_queues();
        if stats.len() != num_queues {
            return Err(Error::QueueStatsMismatch {
                got: stats.len(),
                queues: num_queues,
            });
        }
        let mut exit_events = Vec::with_capacity(num_queues);
        for _ in 0..num_queues {
            let pair = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)
                .map_err(Error::ExitEvent)?;
            exit_events.push(Some(pair));
        }
        let parked = (0..num_queues)
            .map(|_| Parked::new().map(Arc::new))
            .collect::<io::Result<Vec<_>>>()
            .map_err(Error::Waiters)?;
        let waiters = if config.max_waiting > 0 {
            Some(Arc::new(
                Waiters::start("vfs-wait", config.waiters).map_err(Error::Waiters)?,
            ))
        } else {
            None
        };
        let backend = FsBackend {
            parked,
            waiters,
            vrings: Mutex::new(vec![None; num_queues]),
            config_space: config.config_space().to_vec(),
            mem: GuestMemoryAtomic::new(GuestMemoryMmap::new()),
            event_idx: AtomicBool::new(false),
            workers: (0..num_queues).map(|_| Mutex::default()).collect(),
            stats,
            exit_events: Mutex::new(exit_events),
            exit_consumer_fds: Mutex::new(Vec::new()),
            handler,
            config,
        };
        Ok(VirtioFsDevice {
            backend: Arc::new(backend),
        })
    }

    /// The device's settings.
    pub fn config(&self) -> &DeviceConfig {
        &self.backend.config
    }

    /// The per-queue counters, indexed by queue (0 = hiprio). They stay
    /// readable after [`serve`](Self::serve) consumed the device.
    pub fn stats(&self) -> Arc<[QueueStats]> {
        self.backend.stats.clone()
    }

    /// Accepts one frontend connection on `listener` and serves it until the
    /// frontend disconnects. The worker threads stop before this returns.
    /// Afterwards the handler's
    /// [`connection_closed`](RequestHandler::connection_closed) runs.
    pub fn serve(self, listener: &mut Listener) -> Result<()> {
        let mem = self.backend.mem.clone();
        let handler = self.backend.handler.clone();
        let backend = self.backend.clone();
        let daemon = VhostUserDaemon::new("sluice-vhost".to_string(), self.backend, mem);
        let result = daemon.map_err(daemon_error).and_then(|mut daemon| {
            // Each worker polls its queue's completion eventfd beside the
            // queue's kick.
            let event = u64::from(backend.completion_event());
            for (queue, epoll_handler) in daemon.get_epoll_handlers().iter().enumerate() {
                if let Some(parked) = backend.parked.get(queue) {
                    epoll_handler
                        .register_listener(parked.event_fd(), EventSet::IN, event)
                        .map_err(|e| Error::Daemon(format!("cannot poll completions: {e}")))?;
                }
            }
            daemon.start(listener).map_err(daemon_error)?;
            info!("vhost-user frontend connected");
            let result = daemon.wait();
            for epoll_handler in daemon.get_epoll_handlers() {
                epoll_handler.send_exit_event();
            }
            // The daemon owns the vhost-user handler, whose drop joins the
            // worker threads and closes their epoll descriptors: after this
            // no request is in flight and no thread waits on an exit event.
            drop(daemon);
            Ok(result)
        });
        backend.close_exit_consumers();
        // The workers are gone; let the waiters finish what they run (it
        // writes into mappings the jobs keep alive) and drop the rest,
        // before the file system closes its session.
        if let Some(waiters) = &backend.waiters {
            waiters.shut_down();
        }
        let result = result?;
        info!("vhost-user frontend disconnected");
        handler.connection_closed();
        match result {
            Ok(()) => Ok(()),
            Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => Ok(()),
            Err(e) => Err(daemon_error(e)),
        }
    }
}

fn daemon_error(e: vhost_user_backend::Error) -> Error {
    Error::Daemon(e.to_string())
}

/// A listening vhost-user socket; the file of one it created is removed
/// when it is dropped ([`listen`]; an inherited one is left to its owner).
pub struct Socket {
    listener: Listener,
    /// The path to remove at the end; `None` for a socket inherited from
    /// the caller (libvirt owns and removes that one).
    path: Option<std::path::PathBuf>,
}

impl std::ops::Deref for Socket {
    type Target = Listener;
    fn deref(&self) -> &Listener {
        &self.listener
    }
}

impl std::ops::DerefMut for Socket {
    fn deref_mut(&mut self) -> &mut Listener {
        &mut self.listener
    }
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket").field("path", &self.path).finish()
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Creates the vhost-user socket at `path`, replacing a stale one: mode
/// 0600, or 0660 owned by `group` when QEMU runs as another user of that
/// group; never reachable with a wider mode ([`crate::socket`]).
pub fn listen(path: impl AsRef<Path>, group: Option<u32>) -> Result<Socket> {
    let path = path.as_ref();
    let listener = crate::socket::bind_private(path, group).map_err(|e| Error::Listen {
        path: path.display().to_string(),
        cause: vhost::vhost_user::Error::SocketError(e),
    })?;
    Ok(Socket {
        listener: Listener::from(listener),
        path: Some(path.to_owned()),
    })
}

/// Serves on a listening Unix socket the caller already created and passed
/// down as a file descriptor (libvirt's `--fd=N`); the socket's path, if it
/// has one, is left to its owner.
pub fn listen_inherited(fd: std::os::fd::OwnedFd) -> Socket {
    Socket {
        listener: Listener::from(std::os::unix::net::UnixListener::from(fd)),
        path: None,
    }
}
