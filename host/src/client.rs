//! The VM server's side (`sluice serve --host PATH`): a
//! [`BlockSource`] that asks the host daemon for blocks, maps the ones it
//! holds in memory read-only, and hands disk-cache files on as checked
//! file ranges. When the host daemon is not there, or goes away, every
//! answer is "not from here" and the reader serves standalone; a thread
//! tries to attach again every second (host/DESIGN.md, "Failure and
//! restart").

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use sluice_engine::Error;
use sluice_engine::block_key::block_len;
use sluice_engine::block_source::{Ask, BlockSource, SourcedBlock};
use sluice_engine::object::disk_cache::CachedFile;

use crate::block_memory::MappedBlock;
use crate::lru::Lru;
use crate::socket;
use crate::wire::{self, BlockKind, BlockName, CACHED_ONLY, MAX_MESSAGE, NO_WAIT, Reply, Request};

/// How often a detached client tries the host daemon again.
pub const REATTACH_EVERY: Duration = Duration::from_secs(1);

/// How long the host daemon has to answer a `HELLO`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a request waits for its answer before the client takes the
/// host daemon for hung, detaches and serves standalone (a fetch with its
/// retries fits well within it).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings of a [`HostClient`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The host daemon's control socket.
    pub path: PathBuf,
    /// The volume's UUID (the host refuses another volume).
    pub volume: String,
    /// This VM's name, for the host's logs and counters.
    pub name: String,
    /// Most blocks kept mapped here (each a read-only mapping of the
    /// host's memory, no copy): a block read again is then not asked for.
    pub mappings: usize,
    /// Where the daemon listens, asked before each attach instead of
    /// taking `path` as it is (`path` then only names it in the log): the
    /// virtiofsd drop-in looks in the registry of host daemons, with its
    /// trust checks, so a daemon started after the server is found.
    pub locate: Option<Locator>,
    /// The NUMA node of this VM's guest memory, if known: the host holds
    /// this VM's blocks in that node's memory.
    pub node: Option<u16>,
}

/// Finds the host daemon's control socket now (an error: not there, or
/// not to be trusted; the client stays standalone and asks again).
#[derive(Clone)]
pub struct Locator(pub Arc<dyn Fn() -> std::io::Result<PathBuf> + Send + Sync>);

impl std::fmt::Debug for Locator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Locator")
    }
}

/// A client's counters (relaxed atomics).
#[derive(Debug, Default)]
pub struct ClientCounters {
    /// Blocks found among this client's mappings.
    pub mapped_hits: AtomicU64,
    /// Blocks the host answered from its memory (or by fetching them).
    pub memory: AtomicU64,
    /// Blocks the host answered with a disk-cache file.
    pub files: AtomicU64,
    /// Asks answered "not from here" (detached, or a cached-only miss).
    pub standalone: AtomicU64,
    /// Times this client attached (the first included).
    pub attaches: AtomicU64,
}

/// What a waiting request gets: the reply and its descriptor, or nothing
/// (the connection ended).
type Answer = Option<(Reply, Option<OwnedFd>)>;

/// One connection to the host daemon.
#[derive(Debug)]
struct Conn {
    sock: OwnedFd,
    pending: Mutex<HashMap<u64, SyncSender<Answer>>>,
    next_tag: AtomicU64,
    alive: AtomicBool,
    block_size: u32,
}

impl Conn {
    /// Ends the connection: every waiting request gets nothing.
    fn fail(&self) {
        self.alive.store(false, Ordering::SeqCst);
        socket::shutdown(&self.sock);
        for (_, tx) in self.pending.lock().drain() {
            let _ = tx.try_send(None);
        }
    }
}

/// The host daemon as a block source.
#[derive(Debug)]
pub struct HostClient {
    cfg: ClientConfig,
    conn: Mutex<Option<Arc<Conn>>>,
    mappings: Mutex<Lru<BlockName, Arc<MappedBlock>>>,
    counters: ClientCounters,
}

impl HostClient {
    /// A client of the host daemon at `cfg.path`: attached now if the
    /// daemon answers, and kept attached (or re-attached) by a thread for
    /// as long as the client lives.
    pub fn start(cfg: ClientConfig) -> Arc<HostClient> {
        let client = Arc::new(HostClient {
            mappings: Mutex::new(Lru::new(cfg.mappings as u64)),
            cfg,
            conn: Mutex::new(None),
            counters: ClientCounters::default(),
        });
        match client.attach() {
            Ok(()) => {}
            Err(e) => log::warn!(
                "no host daemon at {} ({e}); serving standalone until it is there",
                client.cfg.path.display()
            ),
        }
        let weak = Arc::downgrade(&client);
        let spawned = std::thread::Builder::new()
            .name("host-attach".into())
            .spawn(move || keep_attached(weak));
        if let Err(e) = spawned {
            log::warn!("cannot start the host daemon's re-attach thread: {e}");
        }
        client
    }

    /// Whether the client is attached now.
    pub fn attached(&self) -> bool {
        self.conn
            .lock()
            .as_ref()
            .is_some_and(|c| c.alive.load(Ordering::SeqCst))
    }

    /// The client's counters.
    pub fn counters(&self) -> &ClientCounters {
        &self.counters
    }

    /// Connects, says HELLO, and starts the thread that reads replies.
    fn attach(self: &Arc<Self>) -> std::io::Result<()> {
        let path = match &self.cfg.locate {
            Some(locate) => (locate.0)()?,
            None => self.cfg.path.clone(),
        };
        let sock = socket::connect(&path)?;
        let hello = Request::Hello {
            version: wire::VERSION,
            volume: self.cfg.volume.clone(),
            name: self.cfg.name.clone(),
            node: self.cfg.node,
        };
        socket::send(sock.as_fd(), &hello.encode(), None)?;
        rustix::net::sockopt::set_socket_timeout(
            &sock,
            rustix::net::sockopt::Timeout::Recv,
            Some(HELLO_TIMEOUT),
        )?;
        let mut buf = Box::new([0u8; MAX_MESSAGE]);
        let refused = || std::io::Error::other("the host daemon refused this volume or version");
        let packet = socket::recv(sock.as_fd(), &mut buf)?.ok_or_else(refused)?;
        let block_size = match Reply::decode(&buf[..packet.len]) {
            Ok(Reply::Welcome {
                version,
                block_size,
                ..
            }) if version == wire::VERSION && block_size > 0 => block_size,
            _ => return Err(refused()),
        };
        rustix::net::sockopt::set_socket_timeout(&sock, rustix::net::sockopt::Timeout::Recv, None)?;
        let conn = Arc::new(Conn {
            sock,
            pending: Mutex::new(HashMap::new()),
            next_tag: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            block_size,
        });
        let reader = conn.clone();
        std::thread::Builder::new()
            .name("host-replies".into())
            .spawn(move || read_replies(reader, buf))?;
        *self.conn.lock() = Some(conn);
        self.counters.attaches.fetch_add(1, Ordering::Relaxed);
        log::info!("attached to the host daemon at {}", path.display());
        Ok(())
    }

    /// The live connection, if any.
    fn live(&self) -> Option<Arc<Conn>> {
        let mut conn = self.conn.lock();
        match &*conn {
            Some(c) if c.alive.load(Ordering::SeqCst) => Some(c.clone()),
            Some(_) => {
                *conn = None;
                log::warn!(
                    "the host daemon at {} went away; serving standalone until it is back",
                    self.cfg.path.display()
                );
                None
            }
            None => None,
        }
    }

    /// Asks for a block; `None` when the connection is gone or ends.
    fn ask(&self, conn: &Conn, name: BlockName, flags: u32) -> Answer {
        let tag = conn.next_tag.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        conn.pending.lock().insert(tag, tx);
        let get = Request::Get {
            tag,
            block: name,
            flags,
        };
        if socket::send(conn.sock.as_fd(), &get.encode(), None).is_err() {
            conn.pending.lock().remove(&tag);
            conn.fail();
            return None;
        }
        match rx.recv_timeout(ANSWER_TIMEOUT) {
            Ok(answer) => answer,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                log::warn!(
                    "the host daemon at {} left a block unanswered for {}s; detaching",
                    self.cfg.path.display(),
                    ANSWER_TIMEOUT.as_secs()
                );
                conn.fail();
                None
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => None,
        }
    }

    /// A block as the host answered it.
    fn get(&self, name: BlockName, ask: Ask) -> Option<sluice_engine::Result<SourcedBlock>> {
        if let Some(m) = self.mappings.lock().get(&name) {
            self.counters.mapped_hits.fetch_add(1, Ordering::Relaxed);
            return Some(Ok(SourcedBlock::Memory(m)));
        }
        let conn = self.live()?;
        let mut flags = 0;
        if ask == Ask::CachedOnly {
            flags |= CACHED_ONLY;
        }
        if sluice_api::wait::may_wait().is_err() {
            flags |= NO_WAIT;
        }
        let expected = block_len(name.slice_size, conn.block_size, name.index);
        let (reply, fd) = self.ask(&conn, name, flags)?;
        let Reply::Block {
            status,
            kind,
            len,
            payload,
            crcs,
            ..
        } = reply
        else {
            conn.fail();
            return None;
        };
        match (status, kind, fd) {
            (0, BlockKind::Memory, Some(fd)) if len == expected => {
                match MappedBlock::map(&fd, len as usize) {
                    Ok(m) => {
                        let m = Arc::new(m);
                        self.mappings.lock().insert(name, m.clone(), 1);
                        self.counters.memory.fetch_add(1, Ordering::Relaxed);
                        Some(Ok(SourcedBlock::Memory(m)))
                    }
                    Err(e) => Some(Err(Error::Io(e))),
                }
            }
            (0, BlockKind::File, Some(fd)) if len == expected => {
                self.counters.files.fetch_add(1, Ordering::Relaxed);
                let crcs = (!crcs.is_empty()).then(|| (Arc::<[u32]>::from(crcs), payload));
                Some(Ok(SourcedBlock::File(CachedFile {
                    file: File::from(fd),
                    crcs,
                })))
            }
            (libc::EWOULDBLOCK, ..) => Some(Err(Error::WouldBlock)),
            (libc::ENODATA, ..) => None,
            (0, ..) => {
                // A reply that does not fit its request: the host is not
                // one this build can trust; serve standalone.
                conn.fail();
                None
            }
            (errno, ..) => Some(Err(Error::Io(std::io::Error::from_raw_os_error(errno)))),
        }
    }
}

impl Drop for HostClient {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.lock().take() {
            conn.fail();
        }
    }
}

impl BlockSource for HostClient {
    fn block(
        &self,
        id: u64,
        size: u32,
        indx: u32,
        ask: Ask,
    ) -> Option<sluice_engine::Result<SourcedBlock>> {
        let name = BlockName {
            slice: id,
            index: indx,
            slice_size: size,
        };
        let got = self.get(name, ask);
        if got.is_none() {
            self.counters.standalone.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    fn damaged(&self, id: u64, size: u32, indx: u32, why: &str) {
        log::warn!("block {indx} of slice {id} from the host's disk cache is damaged: {why}");
        if let Some(conn) = self.live() {
            let msg = Request::Damaged(BlockName {
                slice: id,
                index: indx,
                slice_size: size,
            });
            if socket::send(conn.sock.as_fd(), &msg.encode(), None).is_err() {
                conn.fail();
            }
        }
    }
}

/// Reads the host's replies and hands each to the request waiting for its
/// tag; anything else ends the connection.
fn read_replies(conn: Arc<Conn>, mut buf: Box<[u8; MAX_MESSAGE]>) {
    while conn.alive.load(Ordering::SeqCst) {
        let packet = match socket::recv(conn.sock.as_fd(), &mut buf) {
            Ok(Some(p)) => p,
            _ => break,
        };
        let reply = match Reply::decode(&buf[..packet.len]) {
            Ok(r @ Reply::Block { .. }) => r,
            _ => break,
        };
        let Reply::Block { tag, .. } = &reply else {
            break;
        };
        let Some(tx) = conn.pending.lock().remove(tag) else {
            break;
        };
        let _ = tx.try_send(Some((reply, packet.fd)));
    }
    conn.fail();
}

/// Attaches again whenever the connection is gone, until the client is.
fn keep_attached(client: Weak<HostClient>) {
    loop {
        std::thread::sleep(REATTACH_EVERY);
        let Some(client) = client.upgrade() else {
            return;
        };
        if client.live().is_none()
            && let Err(e) = client.attach()
        {
            log::debug!("host daemon at {}: {e}", client.cfg.path.display());
        }
    }
}
