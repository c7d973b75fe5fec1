//! The host daemon's block service: every VM server of the volume connects
//! to its control socket and asks for blocks; each block is fetched once
//! however many ask, held once (a sealed memfd), and handed out as a
//! descriptor (host/DESIGN.md).
//!
//! Threads: one accepting, two per client (one reads its requests and
//! answers what is cached, one writes its replies, so a client that does
//! not read its replies blocks only its own writer), and `fetchers` that
//! fetch misses round robin across clients.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};
use sluice_api::{BufDest, Fragment, ReadDest, SegmentCrcs};
use sluice_engine::block_key::{block_key, block_len};
use sluice_engine::compress::{decompress, decompress_to};
use sluice_engine::format::Compression;
use sluice_engine::object::disk_cache::SEGMENT;
use sluice_engine::volume::Volume;
use sluice_engine::{Error, object};

use crate::block_memory::SealedBlock;
use crate::lru::Lru;
use crate::socket;
use crate::wire::{
    self, BlockKind, BlockName, CACHED_ONLY, MAX_CRCS, MAX_MESSAGE, NO_WAIT, Reply, Request,
};

/// Settings of the block service.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Bytes of blocks held in memory (sealed memfds), at most.
    pub cache_bytes: u64,
    /// Threads that fetch blocks from the object store.
    pub fetchers: usize,
    /// Most GETs one client may have unanswered; at the bound the host
    /// stops reading its requests until one is answered.
    pub max_outstanding: u32,
    /// Most clients connected at once; more are refused.
    pub max_clients: usize,
    /// Most bytes of the memory table charged to one client (a block is
    /// charged to the client whose request fetched it): a client over it
    /// gives up its own least recently used blocks first, so one VM
    /// streaming a large data set cannot push out every other VM's.
    pub vm_cache_share: u64,
    /// How long a reply may wait for its client to take it: a client that
    /// reads none for this long is dropped. Without the bound a client that
    /// stops reading pins its two threads for good — and one that passed
    /// its own socket to the host (a descriptor the host has not read yet,
    /// because the client is at its bound) never even closes: the host's
    /// queue holds it open.
    pub reply_timeout: std::time::Duration,
    /// How a fetch writes a block into its memfd (`None`: as this host's
    /// shared-memory huge pages allow, [`FillMode::for_this_host`]).
    pub fill: Option<FillMode>,
    /// The NUMA nodes blocks are held on, one memory table each, which
    /// share `cache_bytes` evenly: a VM's blocks are held in its guest
    /// memory's node's table (a VM whose node is unknown or not listed
    /// uses the first). Empty or one node: one table, placed nowhere.
    pub nodes: Vec<usize>,
}

/// How a fetch writes a block's bytes into its memfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillMode {
    /// Read (or decompress) the object straight into a writable mapping of
    /// the memfd ([`SealedBlock::fill`]): no buffer in between, and the
    /// mapping can take huge pages. Each new page costs a fault and is
    /// zeroed by the kernel first, so this pays only with huge pages (two
    /// faults per 4 MiB block).
    InPlace,
    /// Get the object into a buffer, then write it into the memfd: one
    /// CPU copy, which the kernel's full-page writes make no dearer than
    /// the zeroing a fault would do, and no page faults.
    Copy,
}

impl FillMode {
    /// In place where shared memory may use transparent huge pages
    /// (`/sys/kernel/mm/transparent_hugepage/shmem_enabled` other than
    /// `never` or `deny`), by copy otherwise. Measured with
    /// `benches/vs-many-vms.sh` (docs/tuning.md, "Many VMs on one host").
    pub fn for_this_host() -> FillMode {
        if crate::block_memory::shmem_huge_pages() {
            FillMode::InPlace
        } else {
            FillMode::Copy
        }
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            cache_bytes: 1 << 30,
            fetchers: 16,
            max_outstanding: 64,
            max_clients: 256,
            vm_cache_share: u64::MAX,
            reply_timeout: std::time::Duration::from_secs(10),
            fill: None,
            nodes: Vec::new(),
        }
    }
}

/// The host's counters (relaxed atomics).
#[derive(Debug, Default)]
pub struct HostStats {
    /// Object-store GETs the host made (one per block fetched).
    pub fetches: AtomicU64,
    /// Bytes those GETs brought (decompressed).
    pub fetched_bytes: AtomicU64,
    /// GETs that failed.
    pub fetch_errors: AtomicU64,
    /// GETs answered from the memory table.
    pub memory_hits: AtomicU64,
    /// GETs answered with a disk-cache file.
    pub file_hits: AtomicU64,
    /// GETs that joined a fetch another GET started.
    pub joined: AtomicU64,
    /// Blocks copied from one NUMA node's memory table into another's
    /// (no GET: another node's VMs had it already).
    pub node_copies: AtomicU64,
    /// Clients dropped for a protocol error.
    pub dropped: AtomicU64,
}

/// One client's counters.
#[derive(Debug, Default)]
pub struct ClientStats {
    /// GETs asked.
    pub gets: AtomicU64,
    /// GETs answered from memory.
    pub memory_hits: AtomicU64,
    /// GETs answered with a disk-cache file.
    pub file_hits: AtomicU64,
    /// GETs answered once a fetch ended.
    pub fetched: AtomicU64,
    /// GETs answered with an error (`WouldBlock` and `NotCached` included).
    pub errors: AtomicU64,
}

/// What `sluice stats` shows of a client.
#[derive(Debug, Clone)]
pub struct ClientView {
    /// The name it gave, made unique by its pid.
    pub name: String,
    /// Its process and user.
    pub pid: i32,
    /// Its user.
    pub uid: u32,
    /// GETs asked, memory hits, file hits, fetched, errors.
    pub counts: [u64; 5],
    /// GETs unanswered now.
    pub outstanding: u32,
}

/// A descriptor a reply carries.
#[derive(Debug)]
enum Attached {
    None,
    Memory(Arc<SealedBlock>),
    File(File),
}

impl Attached {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Attached::None => None,
            Attached::Memory(b) => Some(b.fd()),
            Attached::File(f) => Some(f.as_fd()),
        }
    }
}

/// A connected client.
#[derive(Debug)]
struct Client {
    id: u64,
    /// The memory table its blocks are held in (its node's).
    slot: usize,
    name: String,
    pid: i32,
    uid: u32,
    sock: OwnedFd,
    /// Replies for the writer thread, and whether the client is gone.
    out: Mutex<(VecDeque<(Reply, Attached)>, bool)>,
    out_cv: Condvar,
    /// GETs read and not yet answered (the reply sent).
    outstanding: Mutex<u32>,
    outstanding_cv: Condvar,
    stats: ClientStats,
}

impl Client {
    fn reply(&self, reply: Reply, attached: Attached) {
        let mut out = self.out.lock();
        if out.1 {
            return;
        }
        out.0.push_back((reply, attached));
        self.out_cv.notify_one();
    }

    fn answer_error(&self, tag: u64, errno: i32) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        self.reply(Reply::error(tag, errno), Attached::None);
    }

    fn answer_memory(&self, tag: u64, block: Arc<SealedBlock>) {
        let reply = Reply::Block {
            tag,
            status: 0,
            kind: BlockKind::Memory,
            len: block.len() as u32,
            payload: 0,
            crcs: Vec::new(),
        };
        self.reply(reply, Attached::Memory(block));
    }

    /// Marks the client gone: its writer stops, its reader's socket is shut.
    fn close(&self) {
        let mut out = self.out.lock();
        out.1 = true;
        out.0.clear();
        self.out_cv.notify_all();
        drop(out);
        socket::shutdown(&self.sock);
        // Under the lock the reader holds while it checks `is_closed` and
        // goes to wait: notified without it, the wake-up could fall between
        // the reader's check and its wait, and the reader would wait for
        // good on a client that is gone (the `host` fuzz target found it).
        let _n = self.outstanding.lock();
        self.outstanding_cv.notify_all();
    }

    fn is_closed(&self) -> bool {
        self.out.lock().1
    }
}

/// A fetch in progress, who waits for it, and the memory tables (NUMA
/// nodes) it is to land in: the first is fetched into, the others get
/// copies before the flight ends.
#[derive(Debug, Default)]
struct Flight {
    waiters: Vec<(Arc<Client>, u64)>,
    slots: Vec<usize>,
}

impl Flight {
    fn wants(&mut self, slot: usize) {
        if !self.slots.contains(&slot) {
            self.slots.push(slot);
        }
    }
}

/// One NUMA node's memory table: sealed blocks by name, weighed in bytes.
#[derive(Debug)]
struct Table {
    node: Option<usize>,
    lru: Mutex<Lru<BlockName, Arc<SealedBlock>>>,
    /// Most bytes of it one client may be charged.
    share: u64,
}

/// Fetches queued per client, served round robin.
#[derive(Debug, Default)]
struct Schedule {
    order: VecDeque<u64>,
    queues: HashMap<u64, VecDeque<BlockName>>,
    stopping: bool,
}

impl Schedule {
    fn push(&mut self, client: u64, name: BlockName) {
        let q = self.queues.entry(client).or_default();
        if q.is_empty() {
            self.order.push_back(client);
        }
        q.push_back(name);
    }

    /// The next fetch, and the client it is charged to.
    fn pop(&mut self) -> Option<(u64, BlockName)> {
        while let Some(client) = self.order.pop_front() {
            let Some(q) = self.queues.get_mut(&client) else {
                continue;
            };
            let Some(name) = q.pop_front() else {
                self.queues.remove(&client);
                continue;
            };
            if q.is_empty() {
                self.queues.remove(&client);
            } else {
                self.order.push_back(client);
            }
            return Some((client, name));
        }
        None
    }
}

/// The shared state of the service.
#[derive(Debug)]
struct Service {
    vol: Arc<Volume>,
    cfg: HostConfig,
    /// The memory tables, one per NUMA node blocks are held on.
    tables: Vec<Table>,
    flights: Mutex<HashMap<BlockName, Flight>>,
    schedule: Mutex<Schedule>,
    schedule_cv: Condvar,
    clients: Mutex<BTreeMap<u64, Arc<Client>>>,
    next_client: AtomicU64,
    stats: HostStats,
    /// Whether placing a block's pages on its node failed once already
    /// (said once in the log, not at every fetch).
    placing_failed: AtomicBool,
}

/// The running block service of `sluice host`.
#[derive(Debug)]
pub struct Host {
    service: Arc<Service>,
    listener: Arc<OwnedFd>,
    stopped: AtomicBool,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Host {
    /// Serves `vol`'s blocks to the clients of `listener` (a listening
    /// `SOCK_SEQPACKET` socket: [`socket::listen`]). `vol`'s store is the
    /// one the host fetches through: with a disk cache in front when the
    /// host has one.
    pub fn start(
        vol: Arc<Volume>,
        mut cfg: HostConfig,
        listener: OwnedFd,
    ) -> std::io::Result<Arc<Host>> {
        let fill = *cfg.fill.get_or_insert_with(FillMode::for_this_host);
        match fill {
            FillMode::InPlace => log::info!(
                "host: shared memory may use huge pages here: blocks are fetched straight \
                 into the memory the VMs map"
            ),
            FillMode::Copy => log::info!(
                "host: shared memory uses 4 KiB pages here \
                 (/sys/kernel/mm/transparent_hugepage/shmem_enabled): blocks are copied into \
                 the memory the VMs map; `advise` makes warm reads and fetches cheaper \
                 (docs/tuning.md)"
            ),
        }
        let placed: Vec<Option<usize>> = if cfg.nodes.len() > 1 {
            cfg.nodes.iter().copied().map(Some).collect()
        } else {
            vec![None]
        };
        let n = placed.len() as u64;
        let tables = placed
            .into_iter()
            .map(|node| Table {
                node,
                lru: Mutex::new(Lru::new(cfg.cache_bytes / n)),
                share: if cfg.vm_cache_share == u64::MAX {
                    u64::MAX
                } else {
                    cfg.vm_cache_share / n
                },
            })
            .collect::<Vec<_>>();
        if tables.len() > 1 {
            log::info!(
                "host: one memory table per NUMA node ({}), {} MiB each",
                cfg.nodes
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                (cfg.cache_bytes / n) >> 20
            );
        }
        let service = Arc::new(Service {
            tables,
            vol,
            cfg,
            flights: Mutex::new(HashMap::new()),
            schedule: Mutex::new(Schedule::default()),
            schedule_cv: Condvar::new(),
            clients: Mutex::new(BTreeMap::new()),
            next_client: AtomicU64::new(1),
            stats: HostStats::default(),
            placing_failed: AtomicBool::new(false),
        });
        let host = Arc::new(Host {
            service: service.clone(),
            listener: Arc::new(listener),
            stopped: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        for i in 0..service.cfg.fetchers.max(1) {
            let s = service.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("host-fetch-{i}"))
                    .spawn(move || s.fetch_loop())?,
            );
        }
        let s = service.clone();
        let listener = host.listener.clone();
        threads.push(
            std::thread::Builder::new()
                .name("host-accept".into())
                .spawn(move || accept_loop(s, listener))?,
        );
        *host.threads.lock() = threads;
        Ok(host)
    }

    /// The host's counters.
    pub fn stats(&self) -> &HostStats {
        &self.service.stats
    }

    /// Bytes and blocks in the memory tables, all nodes together.
    pub fn memory_used(&self) -> (u64, usize) {
        self.memory_by_node()
            .iter()
            .fold((0, 0), |(b, n), (_, tb, tn)| (b + tb, n + tn))
    }

    /// Bytes and blocks in each node's memory table (node `None`: one
    /// table, placed nowhere).
    pub fn memory_by_node(&self) -> Vec<(Option<usize>, u64, usize)> {
        self.service
            .tables
            .iter()
            .map(|t| {
                let l = t.lru.lock();
                (t.node, l.used(), l.len())
            })
            .collect()
    }

    /// The connected clients.
    pub fn clients(&self) -> Vec<ClientView> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.service
            .clients
            .lock()
            .values()
            .map(|c| ClientView {
                name: c.name.clone(),
                pid: c.pid,
                uid: c.uid,
                counts: [
                    get(&c.stats.gets),
                    get(&c.stats.memory_hits),
                    get(&c.stats.file_hits),
                    get(&c.stats.fetched),
                    get(&c.stats.errors),
                ],
                outstanding: *c.outstanding.lock(),
            })
            .collect()
    }

    /// Stops accepting, drops every client and stops the fetchers.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        socket::shutdown(&*self.listener);
        {
            let mut s = self.service.schedule.lock();
            s.stopping = true;
            self.service.schedule_cv.notify_all();
        }
        let clients: Vec<_> = self.service.clients.lock().values().cloned().collect();
        for c in clients {
            c.close();
        }
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(service: Arc<Service>, listener: Arc<OwnedFd>) {
    loop {
        let sock = match socket::accept(listener.as_fd()) {
            Ok(s) => s,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                log::warn!("host: cannot accept a client: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            Err(_) => return,
        };
        if service.schedule.lock().stopping {
            return;
        }
        if service.clients.lock().len() >= service.cfg.max_clients {
            log::warn!(
                "host: refusing a client: {} are connected (the most)",
                service.cfg.max_clients
            );
            continue;
        }
        let s = service.clone();
        let spawned = std::thread::Builder::new()
            .name("host-client".into())
            .spawn(move || s.serve_client(sock));
        if let Err(e) = spawned {
            log::warn!("host: cannot start a client's thread: {e}");
        }
    }
}

/// Why a client is dropped.
#[derive(Debug, thiserror::Error)]
enum Dropped {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Wire(#[from] wire::WireError),
    #[error("{0}")]
    Protocol(String),
}

/// The errno a failed fetch is answered with.
fn errno_of(e: &Error) -> i32 {
    match e {
        Error::Corrupt(_) => libc::EBADMSG,
        e if object::is_not_found(e) => libc::ENOENT,
        _ => libc::EIO,
    }
}

impl Service {
    /// The key and length of a block, or `None` for a name that names no
    /// block (an index past the slice's end).
    fn key(&self, name: &BlockName) -> Option<(String, u32)> {
        let len = block_len(name.slice_size, self.vol.block_size, name.index);
        (len > 0).then(|| (block_key(self.vol.name(), name.slice, name.index, len), len))
    }

    fn serve_client(self: Arc<Self>, sock: OwnedFd) {
        let (pid, uid) = socket::peer(sock.as_fd()).unwrap_or((0, u32::MAX));
        let mut buf = Box::new([0u8; MAX_MESSAGE]);
        // The first message must be a HELLO for this volume.
        let hello = match socket::recv(sock.as_fd(), &mut buf) {
            Ok(Some(p)) if p.fd.is_none() => Request::decode(&buf[..p.len]),
            _ => return,
        };
        let (name, node) = match hello {
            Ok(Request::Hello {
                version,
                volume,
                name,
                node,
            }) if version == wire::VERSION && volume == self.vol.format.uuid => (name, node),
            Ok(Request::Hello {
                version, volume, ..
            }) => {
                log::warn!(
                    "host: refusing pid {pid}: protocol {version} for volume {volume:?} \
                     (this is protocol {} for volume {})",
                    wire::VERSION,
                    self.vol.format.uuid
                );
                return;
            }
            _ => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let label: String = name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            .take(wire::MAX_NAME)
            .collect();
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let slot = self.slot_of(node);
        let client = Arc::new(Client {
            id,
            slot,
            name: format!("{}-{pid}", if label.is_empty() { "vm" } else { &label }),
            pid,
            uid,
            sock,
            out: Mutex::new((VecDeque::new(), false)),
            out_cv: Condvar::new(),
            outstanding: Mutex::new(0),
            outstanding_cv: Condvar::new(),
            stats: ClientStats::default(),
        });
        if let Err(e) = rustix::net::sockopt::set_socket_timeout(
            &client.sock,
            rustix::net::sockopt::Timeout::Send,
            Some(self.cfg.reply_timeout),
        ) {
            log::warn!("host: refusing VM {}: {e}", client.name);
            return;
        }
        self.clients.lock().insert(id, client.clone());
        let placed = match (node, self.tables[slot].node) {
            (_, None) => String::new(),
            (Some(n), Some(t)) if usize::from(n) == t => format!(", node {t}"),
            (n, Some(t)) => format!(
                ", node {} not one of the host's: blocks held on node {t}",
                n.map_or_else(|| "unknown".to_string(), |n| n.to_string())
            ),
        };
        log::info!(
            "host: VM {} attached (pid {pid}, uid {uid}{placed})",
            client.name
        );
        client.reply(
            Reply::Welcome {
                version: wire::VERSION,
                block_size: self.vol.block_size,
                max_outstanding: self.cfg.max_outstanding,
            },
            Attached::None,
        );
        let writer = {
            let c = client.clone();
            std::thread::Builder::new()
                .name("host-reply".into())
                .spawn(move || write_loop(c))
        };
        let why = match writer {
            Ok(_) => self.read_loop(&client, &mut buf),
            Err(e) => Err(Dropped::Io(e)),
        };
        match &why {
            Ok(()) => log::info!("host: VM {} detached", client.name),
            Err(e) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                log::warn!("host: dropping VM {}: {e}", client.name);
            }
        }
        client.close();
        self.forget_client(&client);
    }

    /// Reads and answers `client`'s requests until it goes away (`Ok`) or
    /// breaks the protocol.
    fn read_loop(&self, client: &Arc<Client>, buf: &mut [u8; MAX_MESSAGE]) -> Result<(), Dropped> {
        loop {
            {
                let mut n = client.outstanding.lock();
                while *n >= self.cfg.max_outstanding && !client.is_closed() {
                    client.outstanding_cv.wait(&mut n);
                }
            }
            if client.is_closed() {
                return Ok(());
            }
            let packet = match socket::recv(client.sock.as_fd(), buf) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => return Err(e.into()),
                Err(_) => return Ok(()),
            };
            if packet.fd.is_some() {
                return Err(Dropped::Protocol("a request carried a descriptor".into()));
            }
            match Request::decode(&buf[..packet.len])? {
                Request::Hello { .. } => {
                    return Err(Dropped::Protocol("a second HELLO".into()));
                }
                Request::Get { tag, block, flags } => {
                    *client.outstanding.lock() += 1;
                    client.stats.gets.fetch_add(1, Ordering::Relaxed);
                    self.get(client, tag, block, flags);
                }
                Request::Damaged(block) => self.check_damaged(&block),
            }
        }
    }

    /// Answers a GET: from memory, from the disk cache, or by a fetch.
    fn get(&self, client: &Arc<Client>, tag: u64, name: BlockName, flags: u32) {
        let Some((key, len)) = self.key(&name) else {
            client.answer_error(tag, libc::EINVAL);
            return;
        };
        let table = &self.tables[client.slot].lru;
        if let Some(block) = table.lock().get(&name) {
            self.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
            client.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
            client.answer_memory(tag, block);
            return;
        }
        if self.vol.compression == Compression::None
            && let Some(Ok(cf)) = self.vol.store.cached_file(&key, len as usize)
        {
            let (crcs, payload) = match &cf.crcs {
                Some((crcs, payload)) if crcs.len() <= MAX_CRCS => (crcs.to_vec(), *payload),
                Some(_) => (Vec::new(), u64::MAX),
                None => (Vec::new(), 0),
            };
            // A file whose CRCs do not fit a message is fetched instead.
            if payload != u64::MAX {
                self.stats.file_hits.fetch_add(1, Ordering::Relaxed);
                client.stats.file_hits.fetch_add(1, Ordering::Relaxed);
                client.reply(
                    Reply::Block {
                        tag,
                        status: 0,
                        kind: BlockKind::File,
                        len,
                        payload,
                        crcs,
                    },
                    Attached::File(cf.file),
                );
                return;
            }
        }
        if flags & CACHED_ONLY != 0 {
            // A small read: another node's copy beats a ranged GET, and is
            // not worth a copy to this node.
            match self.held_elsewhere(&name, client.slot) {
                Some(block) => {
                    self.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
                    client.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
                    client.answer_memory(tag, block);
                }
                None => client.answer_error(tag, libc::ENODATA),
            }
            return;
        }
        let mut flights = self.flights.lock();
        // A fetch may have ended between the look-up and here: it puts the
        // block in every table it was wanted in before it leaves the flight
        // map.
        if let Some(block) = table.lock().get(&name) {
            drop(flights);
            self.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
            client.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
            client.answer_memory(tag, block);
            return;
        }
        let started = !flights.contains_key(&name);
        let flight = flights.entry(name).or_default();
        flight.wants(client.slot);
        if flags & NO_WAIT == 0 {
            flight.waiters.push((client.clone(), tag));
        }
        drop(flights);
        if started {
            let mut s = self.schedule.lock();
            s.push(client.id, name);
            self.schedule_cv.notify_one();
        } else {
            self.stats.joined.fetch_add(1, Ordering::Relaxed);
        }
        if flags & NO_WAIT != 0 {
            client.answer_error(tag, libc::EWOULDBLOCK);
        }
    }

    /// A client found a disk-cache copy damaged: the host reads it again
    /// against its CRCs and drops it only if it is.
    fn check_damaged(&self, name: &BlockName) {
        let Some((key, len)) = self.key(name) else {
            return;
        };
        let Some(Ok(cf)) = self.vol.store.cached_file(&key, len as usize) else {
            return;
        };
        let Some((crcs, payload)) = &cf.crcs else {
            return;
        };
        let mut buf = vec![0u8; len as usize];
        let mut dst = BufDest::new(&mut buf);
        let checked = dst.put(Fragment::File {
            file: &cf.file,
            off: 0,
            len: len as usize,
            crcs: Some(SegmentCrcs {
                segment: SEGMENT,
                crcs,
                payload: *payload,
            }),
        });
        if let Err(Error::Corrupt(why)) = checked {
            self.vol.store.drop_cached(&key, &why);
        }
    }

    /// A fetcher: takes queued fetches round robin and answers their
    /// waiters.
    fn fetch_loop(&self) {
        loop {
            let (owner, name) = {
                let mut s = self.schedule.lock();
                loop {
                    if s.stopping {
                        return;
                    }
                    if let Some(n) = s.pop() {
                        break n;
                    }
                    self.schedule_cv.wait(&mut s);
                }
            };
            let first = self
                .flights
                .lock()
                .get(&name)
                .and_then(|f| f.slots.first().copied())
                .unwrap_or(0);
            let fetched = {
                let _placed = self.prefer(first);
                self.fetch_or_copy(&name, first)
            };
            let block = match fetched {
                Ok(block) => block,
                Err(e) => {
                    let waiters = self
                        .flights
                        .lock()
                        .remove(&name)
                        .map(|f| f.waiters)
                        .unwrap_or_default();
                    for (client, tag) in waiters {
                        client.answer_error(tag, errno_of(&e));
                    }
                    continue;
                }
            };
            for (client, tag, own) in self.hold_everywhere(name, first, &block, owner) {
                client.stats.fetched.fetch_add(1, Ordering::Relaxed);
                client.answer_memory(tag, own);
            }
        }
    }

    /// Holds a fetched `block` in table `first`, then copies it into every
    /// other table its flight wants (askers may join meanwhile: loops until
    /// none is missing) and only then ends the flight. Returns its waiters,
    /// each with the copy on its own node.
    fn hold_everywhere(
        &self,
        name: BlockName,
        first: usize,
        block: &Arc<SealedBlock>,
        owner: u64,
    ) -> Vec<(Arc<Client>, u64, Arc<SealedBlock>)> {
        self.hold(first, name, block, owner);
        let mut held = vec![(first, block.clone())];
        let waiters = loop {
            let missing: Vec<(usize, u64)> = {
                let mut flights = self.flights.lock();
                let Some(f) = flights.get(&name) else {
                    break Vec::new();
                };
                let missing: Vec<(usize, u64)> = f
                    .slots
                    .iter()
                    .filter(|s| !held.iter().any(|(h, _)| h == *s))
                    .map(|&s| {
                        // Charged to a VM of that node that waits for it.
                        let payer = f.waiters.iter().find(|(c, _)| c.slot == s);
                        (s, payer.map_or(owner, |(c, _)| c.id))
                    })
                    .collect();
                if missing.is_empty() {
                    break flights.remove(&name).map(|f| f.waiters).unwrap_or_default();
                }
                missing
            };
            for (slot, payer) in missing {
                let copy = {
                    let _placed = self.prefer(slot);
                    self.copy_block(block)
                };
                match copy {
                    Ok(copy) => {
                        self.stats.node_copies.fetch_add(1, Ordering::Relaxed);
                        self.hold(slot, name, &copy, payer);
                        held.push((slot, copy));
                    }
                    Err(e) => {
                        // Served from the other node's copy, not held.
                        log::warn!("host: cannot copy a block to another node: {e}");
                        held.push((slot, block.clone()));
                    }
                }
            }
        };
        waiters
            .into_iter()
            .map(|(client, tag)| {
                let own = held
                    .iter()
                    .find(|(s, _)| *s == client.slot)
                    .map_or_else(|| block.clone(), |(_, b)| b.clone());
                (client, tag, own)
            })
            .collect()
    }

    /// Which memory table a client whose guest memory is on `node` uses.
    fn slot_of(&self, node: Option<u16>) -> usize {
        node.and_then(|n| {
            self.tables
                .iter()
                .position(|t| t.node == Some(usize::from(n)))
        })
        .unwrap_or(0)
    }

    /// Makes the calling thread allocate on the node of table `slot`
    /// while the guard lives (nothing with one table).
    fn prefer(&self, slot: usize) -> Option<sluice_numa::PreferNode> {
        let node = self.tables.get(slot)?.node?;
        match sluice_numa::PreferNode::new(node) {
            Ok(g) => Some(g),
            Err(e) => {
                if !self.placing_failed.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "host: cannot place blocks' pages on NUMA node {node} ({e}); \
                         they go where the kernel puts them (said once)"
                    );
                }
                None
            }
        }
    }

    /// The block from a memory table other than `slot`'s, if one holds it.
    fn held_elsewhere(&self, name: &BlockName, slot: usize) -> Option<Arc<SealedBlock>> {
        self.tables
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != slot)
            .find_map(|(_, t)| t.lru.lock().get(name))
    }

    /// Inserts a block into table `slot`, charged to client `owner`.
    fn hold(&self, slot: usize, name: BlockName, block: &Arc<SealedBlock>, owner: u64) {
        let t = &self.tables[slot];
        t.lru
            .lock()
            .insert_within(name, block.clone(), block.len() as u64, owner, t.share);
    }

    /// The block for table `slot`: copied from another node's table that
    /// holds it (no GET), fetched otherwise.
    fn fetch_or_copy(
        &self,
        name: &BlockName,
        slot: usize,
    ) -> sluice_engine::Result<Arc<SealedBlock>> {
        if let Some(other) = self.held_elsewhere(name, slot)
            && let Ok(copy) = self.copy_block(&other)
        {
            self.stats.node_copies.fetch_add(1, Ordering::Relaxed);
            return Ok(copy);
        }
        self.fetch(name)
    }

    /// A copy of `block` in a new sealed memfd, its pages where the
    /// calling thread allocates ([`Service::prefer`]).
    fn copy_block(&self, block: &SealedBlock) -> std::io::Result<Arc<SealedBlock>> {
        let src = block.map()?;
        let bytes = src.as_ref();
        let copy = match self.cfg.fill {
            Some(FillMode::InPlace) => SealedBlock::fill(bytes.len(), |room| {
                room[..bytes.len()].copy_from_slice(bytes);
                Ok::<(), std::io::Error>(())
            })?,
            _ => SealedBlock::new(bytes)?,
        };
        Ok(Arc::new(copy))
    }

    /// Gets, checks and decompresses a block into a sealed memfd, in place
    /// or by copy ([`FillMode`]).
    fn fetch(&self, name: &BlockName) -> sluice_engine::Result<Arc<SealedBlock>> {
        let Some((key, len)) = self.key(name) else {
            return Err(Error::Corrupt("no such block".into()));
        };
        let len = len as usize;
        self.stats.fetches.fetch_add(1, Ordering::Relaxed);
        let (store, algo) = (&self.vol.store, self.vol.compression);
        let filled = match self.cfg.fill {
            Some(FillMode::InPlace) => SealedBlock::fill(len, |room| {
                let n = match algo {
                    Compression::None => store.get_to(&key, room)?,
                    _ => decompress_to(algo, &store.get(&key)?, len, room, &key)?,
                };
                check_len(&key, n, len)
            }),
            _ => store
                .get(&key)
                .and_then(|stored| decompress(algo, stored, len, &key))
                .and_then(|data| {
                    check_len(&key, data.len(), len)?;
                    Ok(SealedBlock::new(&data)?)
                }),
        };
        match filled {
            Ok(block) => {
                self.stats
                    .fetched_bytes
                    .fetch_add(len as u64, Ordering::Relaxed);
                Ok(Arc::new(block))
            }
            Err(e) => {
                self.stats.fetch_errors.fetch_add(1, Ordering::Relaxed);
                log::warn!("host: cannot fetch {key}: {e}");
                Err(e)
            }
        }
    }

    /// A client is gone: its queued fetches that nobody else waits for are
    /// dropped; those others wait for move to one of them.
    fn forget_client(&self, client: &Arc<Client>) {
        self.clients.lock().remove(&client.id);
        let queued = self
            .schedule
            .lock()
            .queues
            .remove(&client.id)
            .unwrap_or_default();
        let mut flights = self.flights.lock();
        for f in flights.values_mut() {
            f.waiters.retain(|(c, _)| c.id != client.id);
        }
        let mut s = self.schedule.lock();
        for name in queued {
            let heir = flights
                .get(&name)
                .and_then(|f| f.waiters.first().map(|(c, _)| c.id));
            match heir {
                Some(other) => s.push(other, name),
                None => {
                    flights.remove(&name);
                }
            }
        }
        self.schedule_cv.notify_all();
    }
}

/// Sends `client`'s replies in order; a reply to a GET frees its slot.
fn write_loop(client: Arc<Client>) {
    loop {
        let (reply, attached) = {
            let mut out = client.out.lock();
            loop {
                if out.1 {
                    return;
                }
                if let Some(r) = out.0.pop_front() {
                    break r;
                }
                client.out_cv.wait(&mut out);
            }
        };
        let sent = socket::send(client.sock.as_fd(), &reply.encode(), attached.fd());
        if matches!(reply, Reply::Block { .. }) {
            let mut n = client.outstanding.lock();
            *n = n.saturating_sub(1);
            client.outstanding_cv.notify_all();
        }
        if let Err(e) = sent {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                log::warn!(
                    "host: dropping VM {}: it took no reply for the reply timeout",
                    client.name
                );
            }
            client.close();
            return;
        }
    }
}

/// Fails unless the object `key` gave the `len` bytes its block holds.
fn check_len(key: &str, got: usize, len: usize) -> sluice_engine::Result<()> {
    if got != len {
        return Err(Error::Corrupt(format!(
            "object {key} holds {got} bytes, not {len}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
