//! The host-local metadata cache: nodes' attributes and directory entries
//! read from Redis, kept until Redis says they changed.
//!
//! Redis's client-side caching in broadcast mode (`CLIENT TRACKING ON BCAST`,
//! RESP3) does the telling: one connection of this client (the *feed*)
//! registers the key prefixes of nodes (`i1`..`i9`) and directories
//! (`d1`..`d9`), and the server pushes the name of every such key any client
//! changes to it. Reads go on the pool's connections as before; what they
//! read is kept here, and dropped when its key's push arrives.
//!
//! Correctness rests on four rules (engine/DESIGN.md, "The host-local
//! metadata cache"):
//!
//! - **Nothing served before the feed is drained.** A cached value is served
//!   only after every push already in the feed's socket has been applied
//!   (a non-blocking read, [`MetaCache::drain`]). Redis writes a change's
//!   pushes before the changing client's answer (both in the same event
//!   loop pass, the tracking client's first), so once a host is told its
//!   change is done, a host on the same server has the push in its socket.
//! - **A value read before a change is never kept after it.** A read takes a
//!   [`Ticket`] (the invalidation count) before it goes to the server; a
//!   push for its key applied meanwhile raises the key's invalidation mark
//!   past the ticket, and the value is refused.
//! - **This client's own writes invalidate at once**, when their `EXEC`
//!   answers (the keys of the queued commands), not when the push comes.
//! - **No feed, no cache.** While the feed is down (not yet connected, lost,
//!   a server without RESP3 or tracking) nothing is served or kept; when it
//!   comes back everything kept before is dropped.
//!
//! `open` never takes attributes from here (close-to-open: it reads the
//! node from Redis, and keeps what it read).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::Mutex;
use redis::{PushKind, Value};

use crate::meta::{Attr, Ino};

/// How many attributes, and how many entries, are kept by default
/// (JuiceFS's `client-cache-size` default is 12800; a training set's
/// directory listing is often larger).
pub(super) const DEFAULT_SIZE: usize = 100_000;
/// How long a value is kept at most, pushes or not (JuiceFS's
/// `client-cache-expire` default).
pub(super) const DEFAULT_EXPIRE: Duration = Duration::from_secs(60);
/// How many invalidation marks are kept before they are folded into one
/// floor (everything cached before is dropped).
const MAX_MARKS: usize = 1 << 18;
/// A duration as JuiceFS's options write it: `500ms`, `60s`, `5m`, `1h`
/// (a bare number is seconds).
pub(super) fn parse_expire(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

/// How often the feed's thread checks that the feed still answers.
const PING_EVERY: Duration = Duration::from_secs(1);
/// A feed whose `PING` is unanswered this long is taken for lost: a host
/// cut off without a word (no FIN, no RST) would otherwise keep serving
/// what it cannot hear being changed. The most a cached value can be
/// served stale after such a cut is about this long.
const SILENT_AFTER: Duration = Duration::from_secs(3);
/// Connect and handshake timeout of the feed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the feed's thread waits between reconnection attempts.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// How long it waits after a server refused the feed (no RESP3 or no
/// `CLIENT TRACKING`: Redis before 6, a managed service that renamed the
/// command) before it asks again.
const REFUSED_RETRY: Duration = Duration::from_secs(60);
/// How the handshake says the server refused a command.
const REFUSED: &str = "the server refused";
/// The largest frame the feed accepts from the server (a push names keys;
/// anything near this is not one).
const MAX_FRAME: usize = 16 << 20;

/// What the cache is configured with (the URL's `client-cache`,
/// `client-cache-size`, `client-cache-expire`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    pub(super) size: usize,
    pub(super) expire: Duration,
}

/// Where the feed connects, and as whom.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) addr: Addr,
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) enum Addr {
    Tcp(String, u16),
    Unix(std::path::PathBuf),
}

/// Finds where the feed goes (the current master, for Sentinel).
pub(super) type Locate = Box<dyn Fn() -> Result<Target, String> + Send + Sync>;

/// A read's place in the invalidation order, taken before it is sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket(u64);

/// A key the cache holds values of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// `i{ino}`: a node's attributes.
    Node(Ino),
    /// `d{ino}`: a directory's entries.
    Dir(Ino),
    /// `x{ino}`: a node's extended attributes.
    Xattr(Ino),
}

/// What is known of a node's extended attributes.
#[derive(Default)]
struct Xattrs {
    /// Names read: their values (None: absent).
    names: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// Whether every attribute is in `names` (a node made here has none):
    /// a name not there is absent.
    complete: bool,
}

/// The largest attribute value kept (the cache is for the attributes
/// asked on every write, `security.capability`, mostly absent).
const MAX_XATTR_KEPT: usize = 1024;
/// The most nodes whose extended attributes are kept (at most about
/// 16 MiB of values).
const MAX_XATTR_NODES: usize = 16_384;

struct Kept<T> {
    value: T,
    /// The ticket of the read it came from.
    stamp: u64,
    at: Instant,
}

struct State {
    /// Whether the feed is connected and tracking: only then is anything
    /// served or kept.
    live: bool,
    /// Invalidations applied so far (tickets count in it).
    epoch: u64,
    /// Every value read at a ticket below this is stale.
    floor: u64,
    /// The epoch of the last invalidation of each key (above `floor`).
    marks: HashMap<Key, u64>,
    attrs: LruCache<Ino, Kept<Attr>>,
    /// (directory, name) → the child's inode (None: no such entry).
    entries: LruCache<(Ino, Vec<u8>), Kept<Option<Ino>>>,
    xattrs: LruCache<Ino, Kept<Xattrs>>,
}

impl State {
    /// The newest invalidation that applies to `key`.
    fn mark(&self, key: Key) -> u64 {
        self.marks.get(&key).copied().unwrap_or(0).max(self.floor)
    }

    fn invalidate(&mut self, key: Key) {
        self.epoch += 1;
        if self.marks.len() >= MAX_MARKS {
            self.marks.clear();
            self.floor = self.epoch;
        }
        self.marks.insert(key, self.epoch);
        match key {
            Key::Node(ino) => {
                self.attrs.pop(&ino);
            }
            Key::Xattr(ino) => {
                self.xattrs.pop(&ino);
            }
            Key::Dir(_) => {}
        }
    }

    /// Drops everything (a flush, a lost feed).
    fn reset(&mut self) {
        self.epoch += 1;
        self.floor = self.epoch;
        self.marks.clear();
        self.attrs.clear();
        self.entries.clear();
        self.xattrs.clear();
    }

    /// Whether a value read at `stamp` for `key`, kept at `at`, may be
    /// served (`t` the cache's expiry).
    fn fresh(&self, key: Key, stamp: u64, at: Instant, expire: Duration) -> bool {
        stamp >= self.mark(key) && at.elapsed() < expire
    }
}

/// The feed's connection.
enum Stream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Stream {
    fn connect(addr: &Addr) -> std::io::Result<Stream> {
        match addr {
            Addr::Tcp(host, port) => {
                use std::net::ToSocketAddrs;
                let mut last = None;
                for a in (host.as_str(), *port).to_socket_addrs()? {
                    match std::net::TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                        Ok(s) => {
                            s.set_nodelay(true)?;
                            s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
                            s.set_write_timeout(Some(CONNECT_TIMEOUT))?;
                            return Ok(Stream::Tcp(s));
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                }))
            }
            Addr::Unix(path) => {
                let s = std::os::unix::net::UnixStream::connect(path)?;
                s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
                s.set_write_timeout(Some(CONNECT_TIMEOUT))?;
                Ok(Stream::Unix(s))
            }
        }
    }

    fn set_nonblocking(&self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(true),
            Stream::Unix(s) => s.set_nonblocking(true),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

/// The end of the RESP2/RESP3 frame that starts at `at` in `b`: `Ok(None)`
/// while it is incomplete. Written here because the driver's parser reads
/// from a stream it owns, and the feed must tell "nothing more yet" (a
/// non-blocking socket) from "half a frame" without losing bytes.
fn frame_end(b: &[u8], at: usize, depth: u32) -> Result<Option<usize>, String> {
    if depth > 8 {
        return Err("a RESP frame nested too deep".into());
    }
    let Some(&kind) = b.get(at) else {
        return Ok(None);
    };
    let Some(nl) = b[at..].windows(2).position(|w| w == b"\r\n") else {
        if b.len() - at > 1024 {
            return Err("a RESP header line without its end".into());
        }
        return Ok(None);
    };
    let line_end = at + nl + 2;
    let head = &b[at + 1..at + nl];
    let number = || -> Result<i64, String> {
        std::str::from_utf8(head)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| format!("a RESP length that is not a number: {head:?}"))
    };
    match kind {
        b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => Ok(Some(line_end)),
        b'$' | b'!' | b'=' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some(line_end));
            }
            let n = usize::try_from(n).map_err(|e| e.to_string())?;
            if n > MAX_FRAME {
                return Err(format!("a RESP string of {n} bytes"));
            }
            let end = line_end + n + 2;
            Ok((b.len() >= end).then_some(end))
        }
        b'*' | b'>' | b'~' | b'%' | b'|' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some(line_end));
            }
            let n = usize::try_from(n).map_err(|e| e.to_string())?;
            if n > MAX_FRAME / 4 {
                return Err(format!("a RESP aggregate of {n} elements"));
            }
            let count = if matches!(kind, b'%' | b'|') {
                n * 2
            } else {
                n
            };
            let mut pos = line_end;
            for _ in 0..count {
                match frame_end(b, pos, depth + 1)? {
                    Some(p) => pos = p,
                    None => return Ok(None),
                }
            }
            Ok(Some(pos))
        }
        other => Err(format!("an unknown RESP type byte {other:#04x}")),
    }
}

struct Feed {
    stream: Stream,
    buf: Vec<u8>,
    /// When the `PING` not yet answered was sent (the feed's heartbeat).
    ping: Option<Instant>,
    /// When the last one was sent.
    last_ping: Instant,
}

impl Feed {
    /// Connects, says `HELLO 3` and turns on broadcast tracking of
    /// `prefixes`.
    fn open(target: &Target, prefixes: &[String]) -> Result<Feed, String> {
        let mut feed = Feed {
            stream: Stream::connect(&target.addr).map_err(|e| format!("cannot connect: {e}"))?,
            buf: Vec::new(),
            ping: None,
            last_ping: Instant::now(),
        };
        let mut hello = redis::cmd("HELLO");
        hello.arg(3);
        if let Some(pw) = &target.password {
            hello
                .arg("AUTH")
                .arg(target.user.as_deref().unwrap_or("default"))
                .arg(pw);
        }
        feed.call(&hello)?;
        let mut track = redis::cmd("CLIENT");
        track.arg("TRACKING").arg("ON").arg("BCAST");
        for p in prefixes {
            track.arg("PREFIX").arg(p);
        }
        feed.call(&track)?;
        feed.stream
            .set_nonblocking()
            .map_err(|e| format!("cannot make the connection non-blocking: {e}"))?;
        Ok(feed)
    }

    /// Sends `cmd` and waits for its answer (the handshake only: nothing is
    /// pushed before tracking is on).
    fn call(&mut self, cmd: &redis::Cmd) -> Result<Value, String> {
        self.stream
            .write_all(&cmd.get_packed_command())
            .map_err(|e| format!("cannot send: {e}"))?;
        loop {
            if let Some(v) = self.next()? {
                return match v {
                    Value::ServerError(e) => Err(format!("{REFUSED}: {e:?}")),
                    v => Ok(v),
                };
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("no answer: {e}")),
            }
        }
    }

    /// The next whole frame in the buffer, parsed.
    fn next(&mut self) -> Result<Option<Value>, String> {
        let Some(end) = frame_end(&self.buf, 0, 0)? else {
            return Ok(None);
        };
        let v = redis::parse_redis_value(&self.buf[..end])
            .map_err(|e| format!("an unreadable frame: {e}"))?;
        self.buf.drain(..end);
        Ok(Some(v))
    }

    /// Whether the feed has gone quiet: a `PING` unanswered for longer
    /// than [`SILENT_AFTER`] (a peer gone without a word, a partition).
    fn silent(&self) -> bool {
        self.ping.is_some_and(|t| t.elapsed() > SILENT_AFTER)
    }

    /// Sends a `PING` when none is outstanding and the last went out
    /// [`PING_EVERY`] ago; its `PONG` comes back among the pushes, after
    /// every push the server sent before it.
    fn heartbeat(&mut self) -> Result<(), String> {
        if self.ping.is_some() || self.last_ping.elapsed() < PING_EVERY {
            return Ok(());
        }
        let ping = b"*1\r\n$4\r\nPING\r\n";
        match self.stream.write(ping) {
            Ok(n) if n == ping.len() => {
                let now = Instant::now();
                self.ping = Some(now);
                self.last_ping = now;
                Ok(())
            }
            Ok(_) => Err("a PING written only in part".into()),
            Err(e) => Err(format!("cannot send a PING: {e}")),
        }
    }

    /// Reads what the socket holds now, without waiting. `Err`: the
    /// connection is gone or spoke nonsense.
    fn fill(&mut self) -> Result<(), String> {
        let mut chunk = [0u8; 16384];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.len() > MAX_FRAME * 2 {
                        return Err("more than 32 MiB of pushes unread".into());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("lost: {e}")),
            }
        }
    }
}

/// Counts for the log and the metrics.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) invalidations: AtomicU64,
}

/// The cache of one client (see the module's documentation).
pub(super) struct MetaCache {
    settings: Settings,
    /// The key prefix of the volume (`{DB}` on a cluster).
    prefix: String,
    state: Mutex<State>,
    /// The feed; `None` while it is down. Only the feed's thread opens or
    /// replaces it; anyone may drain it, and mark it lost (`lost`).
    feed: Mutex<Option<Feed>>,
    /// The raw descriptor of the feed, for the thread's `poll` (-1: none).
    fd: std::sync::atomic::AtomicI32,
    pub(super) stats: Stats,
}

impl std::fmt::Debug for MetaCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaCache")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl MetaCache {
    /// A cache for keys under `prefix`, fed from where `locate` says; its
    /// thread connects in the background (nothing is cached until it has).
    pub(super) fn start(settings: Settings, prefix: &str, locate: Locate) -> Arc<MetaCache> {
        let size = NonZeroUsize::new(settings.size.max(1)).expect("at least 1");
        let xattr_nodes =
            NonZeroUsize::new(settings.size.clamp(1, MAX_XATTR_NODES)).expect("at least 1");
        let cache = Arc::new(MetaCache {
            settings,
            prefix: prefix.to_string(),
            state: Mutex::new(State {
                live: false,
                epoch: 1,
                floor: 1,
                marks: HashMap::new(),
                attrs: LruCache::new(size),
                entries: LruCache::new(size),
                xattrs: LruCache::new(xattr_nodes),
            }),
            feed: Mutex::new(None),
            fd: std::sync::atomic::AtomicI32::new(-1),
            stats: Stats::default(),
        });
        // The first connection is made here, so the cache works from the
        // first operation (and a client's round trips do not depend on how
        // soon a thread got to run); the thread makes later ones.
        let first = cache.connect(&locate);
        let weak = Arc::downgrade(&cache);
        let spawned = std::thread::Builder::new()
            .name("sluice-meta-feed".into())
            .spawn(move || run_feed(weak, locate, first.err()));
        if let Err(e) = spawned {
            // Without its thread the feed has no heartbeat: a cut would go
            // unnoticed. No cache then.
            let mut feed = cache.feed.lock();
            cache.lost(&mut feed, &format!("cannot start its thread: {e}"));
        }
        cache
    }

    /// The prefixes the feed tracks: node, directory and extended
    /// attribute keys (an inode number never starts with 0).
    fn prefixes(&self) -> Vec<String> {
        ['i', 'd', 'x']
            .iter()
            .flat_map(|k| (1..=9).map(move |d| format!("{}{k}{d}", self.prefix)))
            .collect()
    }

    /// The cached key `name` stands for, if it is one.
    fn key_of(&self, name: &[u8]) -> Option<Key> {
        let rest = name.strip_prefix(self.prefix.as_bytes())?;
        let (&kind, digits) = rest.split_first()?;
        if digits.first().is_none_or(|d| !(b'1'..=b'9').contains(d)) {
            return None;
        }
        let ino: Ino = std::str::from_utf8(digits).ok()?.parse().ok()?;
        match kind {
            b'i' => Some(Key::Node(ino)),
            b'd' => Some(Key::Dir(ino)),
            b'x' => Some(Key::Xattr(ino)),
            _ => None,
        }
    }

    /// Applies every push the feed holds now. A feed that fails is dropped:
    /// the cache goes dark until the thread reconnects.
    fn drain(&self) {
        let mut feed = self.feed.lock();
        let Some(f) = feed.as_mut() else { return };
        let mut keys = Vec::new();
        let mut flush = false;
        let r = f.fill().and_then(|()| {
            if f.silent() {
                return Err(format!(
                    "no answer to a PING in {} s",
                    SILENT_AFTER.as_secs()
                ));
            }
            while let Some(v) = f.next()? {
                match v {
                    Value::Push {
                        kind: PushKind::Invalidate,
                        data,
                    } => match data.into_iter().next() {
                        Some(Value::Array(names)) => {
                            for n in names {
                                if let Value::BulkString(n) = n
                                    && let Some(k) = self.key_of(&n)
                                {
                                    keys.push(k);
                                }
                            }
                        }
                        // A null list: every key (FLUSHALL, FLUSHDB).
                        _ => flush = true,
                    },
                    Value::Push { .. } => {}
                    Value::SimpleString(pong) if pong == "PONG" && f.ping.is_some() => {
                        f.ping = None;
                    }
                    other => {
                        return Err(format!("an unexpected frame on the feed: {other:?}"));
                    }
                }
            }
            Ok(())
        });
        {
            let mut s = self.state.lock();
            self.stats
                .invalidations
                .fetch_add(keys.len() as u64, Ordering::Relaxed);
            crate::metrics::META_CACHE.invalidated(keys.len() as u64);
            for k in keys {
                s.invalidate(k);
            }
            if flush {
                s.reset();
            }
        }
        if let Err(e) = r {
            self.lost(&mut feed, &e);
        }
    }

    /// Sends the feed's heartbeat when it is due; a feed that cannot take
    /// it is dropped, as in [`MetaCache::drain`].
    fn heartbeat(&self) {
        let mut feed = self.feed.lock();
        let Some(f) = feed.as_mut() else { return };
        if let Err(e) = f.heartbeat() {
            self.lost(&mut feed, &e);
        }
    }

    /// Drops a failed feed: nothing is served or kept until the thread
    /// connects again.
    fn lost(&self, feed: &mut Option<Feed>, why: &str) {
        {
            let mut s = self.state.lock();
            s.reset();
            s.live = false;
        }
        log::warn!(
            "metadata cache: the invalidation feed failed ({why}); cache off until it reconnects"
        );
        self.fd.store(-1, Ordering::Release);
        *feed = None;
    }

    /// A ticket for a read about to be sent; `None` when nothing read now
    /// may be kept (the feed is down).
    pub(super) fn ticket(&self) -> Option<Ticket> {
        self.drain();
        let s = self.state.lock();
        s.live.then_some(Ticket(s.epoch))
    }

    /// A node's cached attributes.
    pub(super) fn attr(&self, ino: Ino) -> Option<Attr> {
        self.drain();
        let hit = self.kept_attr(&mut self.state.lock(), ino);
        self.count(hit.is_some());
        hit
    }

    /// A cached entry: `Some(Some(ino))` the name's inode, `Some(None)`
    /// known absent, `None` not known.
    #[cfg(test)]
    fn entry(&self, dir: Ino, name: &[u8]) -> Option<Option<Ino>> {
        self.drain();
        let hit = self.kept_entry(&mut self.state.lock(), dir, name);
        self.count(hit.is_some());
        hit
    }

    /// A lookup from the cache alone, the feed drained once: the
    /// directory's attributes and the entry, with the child's attributes
    /// when the name is there; `None` when any of them is not kept.
    pub(super) fn lookup(&self, dir: Ino, name: &[u8]) -> Option<(Attr, Option<(Ino, Attr)>)> {
        self.drain();
        let mut s = self.state.lock();
        let hit = (|| {
            let entry = self.kept_entry(&mut s, dir, name)?;
            let pa = self.kept_attr(&mut s, dir)?;
            let child = match entry {
                None => None,
                Some(ino) => Some((ino, self.kept_attr(&mut s, ino)?)),
            };
            Some((pa, child))
        })();
        drop(s);
        self.count(hit.is_some());
        hit
    }

    /// A node's attributes as kept (dropped if stale).
    fn kept_attr(&self, s: &mut State, ino: Ino) -> Option<Attr> {
        if !s.live {
            return None;
        }
        match s.attrs.get(&ino).map(|k| (k.value.clone(), k.stamp, k.at)) {
            Some((a, stamp, at)) if s.fresh(Key::Node(ino), stamp, at, self.settings.expire) => {
                Some(a)
            }
            Some(_) => {
                s.attrs.pop(&ino);
                None
            }
            None => None,
        }
    }

    /// An entry as kept (dropped if stale).
    fn kept_entry(&self, s: &mut State, dir: Ino, name: &[u8]) -> Option<Option<Ino>> {
        if !s.live {
            return None;
        }
        let key = (dir, name.to_vec());
        match s.entries.get(&key).map(|k| (k.value, k.stamp, k.at)) {
            Some((v, stamp, at)) if s.fresh(Key::Dir(dir), stamp, at, self.settings.expire) => {
                Some(v)
            }
            Some(_) => {
                s.entries.pop(&key);
                None
            }
            None => None,
        }
    }

    fn count(&self, hit: bool) {
        let c = if hit {
            &self.stats.hits
        } else {
            &self.stats.misses
        };
        c.fetch_add(1, Ordering::Relaxed);
        crate::metrics::META_CACHE.read(hit);
    }

    /// Keeps attributes read at `ticket`, unless their key changed since.
    pub(super) fn put_attr(&self, ticket: Option<Ticket>, ino: Ino, attr: &Attr) {
        let Some(Ticket(stamp)) = ticket else { return };
        let mut s = self.state.lock();
        if s.live && stamp >= s.mark(Key::Node(ino)) {
            s.attrs.put(
                ino,
                Kept {
                    value: attr.clone(),
                    stamp,
                    at: Instant::now(),
                },
            );
        }
    }

    /// Keeps an entry read at `ticket` (None: the name is absent), unless
    /// the directory changed since.
    pub(super) fn put_entry(
        &self,
        ticket: Option<Ticket>,
        dir: Ino,
        name: &[u8],
        ino: Option<Ino>,
    ) {
        let Some(Ticket(stamp)) = ticket else { return };
        let mut s = self.state.lock();
        if s.live && stamp >= s.mark(Key::Dir(dir)) {
            s.entries.put(
                (dir, name.to_vec()),
                Kept {
                    value: ino,
                    stamp,
                    at: Instant::now(),
                },
            );
        }
    }

    /// A cached extended attribute: `Some(Some(value))`, `Some(None)` known
    /// absent, `None` not known.
    pub(super) fn xattr(&self, ino: Ino, name: &[u8]) -> Option<Option<Vec<u8>>> {
        self.drain();
        let mut s = self.state.lock();
        if !s.live {
            return None;
        }
        let expire = self.settings.expire;
        let found = s.xattrs.get(&ino).map(|k| {
            let known = match k.value.names.get(name) {
                Some(v) => Some(v.clone()),
                None if k.value.complete => Some(None),
                None => None,
            };
            (known, k.stamp, k.at)
        });
        let hit = match found {
            Some((known, stamp, at)) if s.fresh(Key::Xattr(ino), stamp, at, expire) => known,
            Some(_) => {
                s.xattrs.pop(&ino);
                None
            }
            None => None,
        };
        drop(s);
        self.count(hit.is_some());
        hit
    }

    /// Keeps an extended attribute read at `ticket` (None: absent), unless
    /// the node's attributes changed since.
    pub(super) fn put_xattr(
        &self,
        ticket: Option<Ticket>,
        ino: Ino,
        name: &[u8],
        value: Option<&[u8]>,
    ) {
        let Some(Ticket(stamp)) = ticket else { return };
        if value.is_some_and(|v| v.len() > MAX_XATTR_KEPT) {
            return;
        }
        let mut s = self.state.lock();
        if !(s.live && stamp >= s.mark(Key::Xattr(ino))) {
            return;
        }
        let now = Instant::now();
        let kept = s.xattrs.get_or_insert_mut(ino, || Kept {
            value: Xattrs::default(),
            stamp,
            at: now,
        });
        kept.stamp = kept.stamp.min(stamp);
        kept.value
            .names
            .insert(name.to_vec(), value.map(<[u8]>::to_vec));
    }

    /// Knows that the node `ino`, made by this client in a transaction that
    /// began after `ticket`, has no extended attributes. Its creation did
    /// not write `x{ino}`, so any mark of that key is another client's
    /// change (a new node's number is never reused).
    pub(super) fn put_no_xattrs(&self, ticket: Option<Ticket>, ino: Ino) {
        let Some(Ticket(stamp)) = ticket else { return };
        let mut s = self.state.lock();
        if s.live && stamp >= s.mark(Key::Xattr(ino)) {
            s.xattrs.put(
                ino,
                Kept {
                    value: Xattrs {
                        names: HashMap::new(),
                        complete: true,
                    },
                    stamp,
                    at: Instant::now(),
                },
            );
        }
    }

    /// Drops what this client's own writes changed: every cached key named
    /// among the commands' arguments (a value that happens to look like a
    /// key only costs a miss).
    pub(super) fn forget_written<'a>(&self, cmds: impl Iterator<Item = &'a redis::Cmd>) {
        let mut keys = Vec::new();
        for c in cmds {
            for a in c.args_iter() {
                if let redis::Arg::Simple(b) = a
                    && let Some(k) = self.key_of(b)
                {
                    keys.push(k);
                }
            }
        }
        if keys.is_empty() {
            return;
        }
        let mut s = self.state.lock();
        for k in keys {
            s.invalidate(k);
        }
    }

    /// Forgets a node (its attributes), as a write of it would.
    #[cfg(test)]
    fn forget_node(&self, ino: Ino) {
        self.state.lock().invalidate(Key::Node(ino));
    }
}

impl Drop for MetaCache {
    fn drop(&mut self) {
        let (h, m, i) = (
            self.stats.hits.load(Ordering::Relaxed),
            self.stats.misses.load(Ordering::Relaxed),
            self.stats.invalidations.load(Ordering::Relaxed),
        );
        if h + m > 0 {
            log::info!("metadata cache: {h} hits, {m} misses, {i} invalidations");
        }
    }
}

impl MetaCache {
    /// Opens the feed and turns the cache on (everything kept before is
    /// dropped: pushes may have been missed while the feed was down).
    fn connect(&self, locate: &Locate) -> Result<(), String> {
        let feed = locate().and_then(|t| Feed::open(&t, &self.prefixes()))?;
        let raw = feed.stream.as_raw_fd();
        let mut slot = self.feed.lock();
        *slot = Some(feed);
        self.fd.store(raw, Ordering::Release);
        let mut s = self.state.lock();
        s.reset();
        s.live = true;
        drop(s);
        drop(slot);
        log::debug!("metadata cache: on (Redis pushes what other clients change)");
        Ok(())
    }
}

/// The feed's thread: connects again after a loss (`first`: why the first
/// connection failed), and applies pushes as they come, so the server
/// never holds many for this client. Ends when the cache is dropped.
fn run_feed(cache: Weak<MetaCache>, locate: Locate, first: Option<String>) {
    let mut refused_logged = false;
    if let Some(e) = first {
        log::warn!("metadata cache: off until its invalidation feed connects: {e}");
        refused_logged = true;
    }
    loop {
        let Some(c) = cache.upgrade() else { return };
        let fd = c.fd.load(Ordering::Acquire);
        if fd < 0 {
            match c.connect(&locate) {
                Ok(()) => {
                    if refused_logged {
                        log::info!("metadata cache: on again (its invalidation feed connected)");
                    }
                    refused_logged = false;
                }
                Err(e) => {
                    if !refused_logged {
                        log::warn!("metadata cache: off until its invalidation feed connects: {e}");
                        refused_logged = true;
                    }
                    drop(c);
                    std::thread::sleep(if e.starts_with(REFUSED) {
                        REFUSED_RETRY
                    } else {
                        RECONNECT_EVERY
                    });
                }
            }
            continue;
        }
        // Wait for pushes without holding the cache's locks. A drain on
        // another thread may drop a failed feed (and close its descriptor)
        // meanwhile: the poll then wakes or times out, and the drain it
        // leads to finds no feed.
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the length given.
        unsafe { libc::poll(&mut pfd, 1, 500) };
        c.drain();
        c.heartbeat();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_found_whole_or_not_at_all() {
        let push = b">2\r\n$10\r\ninvalidate\r\n*2\r\n$2\r\ni5\r\n$3\r\nd17\r\n";
        assert_eq!(frame_end(push, 0, 0), Ok(Some(push.len())));
        for cut in 0..push.len() {
            assert_eq!(frame_end(&push[..cut], 0, 0), Ok(None), "cut at {cut}");
        }
        let flush = b">2\r\n$10\r\ninvalidate\r\n_\r\n+OK\r\n";
        assert_eq!(frame_end(flush, 0, 0), Ok(Some(flush.len() - 5)));
        let hello = b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n";
        assert_eq!(frame_end(hello, 0, 0), Ok(Some(hello.len())));
        assert!(frame_end(b"?what\r\n", 0, 0).is_err());
        assert!(frame_end(b"$x\r\n", 0, 0).is_err());
        let mut deep = Vec::new();
        for _ in 0..20 {
            deep.extend_from_slice(b"*1\r\n");
        }
        assert!(frame_end(&deep, 0, 0).is_err());
    }

    #[test]
    fn a_value_read_before_an_invalidation_is_refused() {
        let locate: Locate = Box::new(|| Err("no server in this test".into()));
        let c = MetaCache::start(
            Settings {
                size: 16,
                expire: DEFAULT_EXPIRE,
            },
            "",
            locate,
        );
        c.state.lock().live = true;
        let attr = Attr {
            flags: 0,
            typ: crate::meta::FileType::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            nlink: 1,
            length: 0,
            parent: 1,
            access_acl: 0,
            default_acl: 0,
            space: None,
        };
        let t = c.ticket();
        c.forget_node(7);
        c.put_attr(t, 7, &attr);
        assert!(c.attr(7).is_none(), "read before the change: not kept");
        let t = c.ticket();
        c.put_attr(t, 7, &attr);
        assert!(c.attr(7).is_some());

        let t = c.ticket();
        let mut set = redis::cmd("HSET");
        set.arg("d3").arg("name").arg("x");
        c.put_entry(t, 3, b"name", None);
        assert_eq!(c.entry(3, b"name"), Some(None));
        c.forget_written(std::iter::once(&set));
        assert_eq!(c.entry(3, b"name"), None, "the directory changed");
        c.put_entry(t, 3, b"other", Some(9));
        assert_eq!(c.entry(3, b"other"), None, "read before the change");

        let t = c.ticket();
        c.put_no_xattrs(t, 11);
        assert_eq!(c.xattr(11, b"security.capability"), Some(None));
        let mut set = redis::cmd("HSET");
        set.arg("x11").arg("user.a").arg("1");
        c.forget_written(std::iter::once(&set));
        assert_eq!(c.xattr(11, b"security.capability"), None);
        c.put_xattr(t, 11, b"user.a", Some(b"1"));
        assert_eq!(c.xattr(11, b"user.a"), None, "read before the change");
        let t = c.ticket();
        c.put_xattr(t, 11, b"user.a", Some(b"1"));
        assert_eq!(c.xattr(11, b"user.a"), Some(Some(b"1".to_vec())));
        assert_eq!(c.xattr(11, b"user.b"), None, "not known: not complete");

        assert_eq!(c.key_of(b"i0"), None);
        assert_eq!(c.key_of(b"x5"), Some(Key::Xattr(5)));
        assert_eq!(c.key_of(b"i12"), Some(Key::Node(12)));
        assert_eq!(c.key_of(b"dirQuota"), None);
        assert_eq!(c.key_of(b"d1x"), None);
    }

    #[test]
    fn expiry_durations_read_as_juicefs_writes_them() {
        assert_eq!(parse_expire("60s"), Some(Duration::from_secs(60)));
        assert_eq!(parse_expire("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_expire("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_expire("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_expire("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_expire("1d"), None);
        assert_eq!(parse_expire("s"), None);
        assert_eq!(parse_expire(""), None);
    }
}
