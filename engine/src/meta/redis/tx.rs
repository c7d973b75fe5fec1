//! Connections and transactions. A write transaction is Redis's optimistic
//! one: every key the transaction reads is `WATCH`ed first, writes are queued
//! and sent as one `MULTI`/`EXEC`; if a watched key changed meanwhile `EXEC`
//! answers nil and the whole transaction runs again, as JuiceFS's `txn` does.
//!
//! A lost connection is replaced. The transaction is run again when that is
//! safe — the connection failed before `EXEC` was sent, so nothing of it was
//! applied — and reported otherwise (the outcome is unknown).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Cmd, Connection, ConnectionLike, Pipeline, RedisError, RedisResult, Value};

use super::keys::{Keys, slice_field};
use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::meta::acl::RuleCache;
use crate::meta::quota::UsageDelta;
use crate::meta::{Ino, Quotas, ReleasedSlice};

/// How often a transaction is restarted after a conflict before giving up
/// (JuiceFS: 50).
const MAX_CONFLICTS: u32 = 50;
/// How often a connection is re-established before an operation fails.
const MAX_RECONNECTS: u32 = 30;
/// The longest wait between two reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Read timeout (JuiceFS: 30 s).
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Write timeout (JuiceFS: 5 s).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// An error inside a transaction.
#[derive(Debug)]
pub(crate) enum TxError {
    /// A file-system answer: ends the transaction.
    Fs(Error),
    /// Redis failed.
    Redis(RedisError),
}

impl From<RedisError> for TxError {
    fn from(e: RedisError) -> Self {
        TxError::Redis(e)
    }
}

impl From<Error> for TxError {
    fn from(e: Error) -> Self {
        TxError::Fs(e)
    }
}

pub(crate) type TxResult<T> = std::result::Result<T, TxError>;

/// Whether the connection is unusable after this error.
fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
}

/// Whether the server asks to try again later (still loading its data after
/// a restart, a replica being promoted, ...).
fn is_transient(e: &RedisError) -> bool {
    matches!(
        e.code(),
        Some("LOADING" | "TRYAGAIN" | "MASTERDOWN" | "READONLY" | "CLUSTERDOWN")
    )
}

pub(super) fn redis_error(e: RedisError) -> Error {
    Error::Meta(format!("Redis: {e}"))
}

/// Work to do once a transaction has committed.
#[derive(Debug, Default)]
pub(super) struct PostCommit {
    /// Slices whose reference count went below zero: delete their objects.
    pub(super) released: Vec<ReleasedSlice>,
    /// Files removed for good (a `delfiles` member each): delete their chunks.
    pub(super) deleted_files: Vec<(Ino, u64)>,
    /// What `EXEC` answered for each queued write, by its position (the
    /// value a command such as `RPUSH` returns).
    pub(super) results: Vec<Value>,
}

/// A connection of the pool that counts its round trips: each command, or
/// pipeline, sent and answered is one. The count is what the metadata path
/// costs between hosts (tests assert it per operation, so a refactor cannot
/// quietly add a round trip).
pub(super) struct Conn {
    inner: Connection,
    trips: Arc<AtomicU64>,
    /// The server it talks to (for Sentinel: the master it was opened on).
    server: String,
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.inner.check_connection()
    }

    fn is_open(&self) -> bool {
        self.inner.is_open()
    }
}

/// Where a pool's connections go.
pub(super) enum Source {
    /// One server (or one node of a cluster).
    Server(redis::Client),
    /// The master of a Redis Sentinel deployment: asked of the sentinels
    /// for each new connection, so a failover is followed once the old
    /// master's connections fail (or answer `READONLY`) and are replaced.
    Sentinel {
        /// The sentinels, and the master's name.
        client: Arc<Mutex<redis::sentinel::SentinelClient>>,
        /// The master's name.
        name: String,
        /// The master's address at the last connection (for the log line
        /// of a failover).
        master: Mutex<Option<String>>,
    },
}

impl Source {
    /// A new connection, and the server it goes to.
    fn connect(&self) -> std::result::Result<(Connection, String), RedisError> {
        match self {
            Source::Server(c) => Ok((
                c.get_connection_with_timeout(CONNECT_TIMEOUT)?,
                c.get_connection_info().addr().to_string(),
            )),
            Source::Sentinel {
                client,
                name,
                master,
            } => {
                let c = client.lock().get_client()?;
                let addr = c.get_connection_info().addr().to_string();
                let mut last = master.lock();
                match last.as_deref() {
                    Some(a) if a == addr => {}
                    Some(a) => log::warn!(
                        "Redis Sentinel: the master of {name} is now {addr} (was {a}); carrying on there"
                    ),
                    None => log::info!("Redis Sentinel: the master of {name} is {addr}"),
                }
                *last = Some(addr.clone());
                drop(last);
                Ok((c.get_connection_with_timeout(CONNECT_TIMEOUT)?, addr))
            }
        }
    }

    /// Where the metadata cache's feed connects (the master now, for
    /// Sentinel); `None` where it cannot (TLS: the feed speaks plain TCP
    /// or a Unix socket).
    pub(super) fn locator(&self) -> Option<super::cache::Locate> {
        use super::cache::{Addr, Target};
        fn target(info: &redis::ConnectionInfo) -> Result<Target, String> {
            let addr = match info.addr() {
                redis::ConnectionAddr::Tcp(h, p) => Addr::Tcp(h.clone(), *p),
                redis::ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
                _ => return Err("not over TLS".into()),
            };
            let settings = info.redis_settings();
            Ok(Target {
                addr,
                user: settings.username().map(str::to_string),
                password: settings.password().map(str::to_string),
            })
        }
        match self {
            Source::Server(c) => {
                let info = c.get_connection_info().clone();
                target(&info).ok()?;
                Some(Box::new(move || target(&info)))
            }
            Source::Sentinel { client, .. } => {
                let client = client.clone();
                Some(Box::new(move || {
                    let c = client
                        .lock()
                        .get_client()
                        .map_err(|e| format!("no master from the sentinels: {e}"))?;
                    target(c.get_connection_info())
                }))
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Source::Server(c) => c.get_connection_info().addr().to_string(),
            Source::Sentinel { name, .. } => format!("the master {name} (Sentinel)"),
        }
    }
}

/// A small pool of connections to one server.
pub(super) struct Pool {
    source: Source,
    idle: Mutex<Vec<Conn>>,
    /// Round trips of every connection of the pool so far.
    trips: Arc<AtomicU64>,
    /// The server new connections go to: a connection to another (the old
    /// master of a failover) is dropped rather than kept.
    current: Mutex<String>,
    /// The servers this client talked to since the last [`Pool::settled`]
    /// (a Sentinel failover can leave it writing to the old master while
    /// a new one is chosen: an fsync must not vouch for those writes).
    used: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("addr", &self.source.describe())
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(super) fn new(client: redis::Client) -> Pool {
        Pool::with_source(Source::Server(client))
    }

    /// A pool whose connections go where `source` says.
    pub(super) fn with_source(source: Source) -> Pool {
        Pool {
            source,
            idle: Mutex::new(Vec::new()),
            trips: Arc::new(AtomicU64::new(0)),
            current: Mutex::new(String::new()),
            used: Mutex::new(HashSet::new()),
        }
    }

    /// Notes that `c` is used (see `used`).
    fn used(&self, c: &Conn) {
        let mut used = self.used.lock();
        if !used.contains(&c.server) {
            used.insert(c.server.clone());
        }
    }

    /// Runs `f` on a connection as [`Pool::with_conn`] does, and passes
    /// only if every command this client sent since the last success went
    /// to the server `f` ran on: what an fsync needs to vouch for writes
    /// with `WAIT`, which covers one server's replication stream.
    pub(super) fn settled<T>(
        &self,
        mut f: impl FnMut(&mut Conn) -> std::result::Result<T, RedisError>,
    ) -> Result<T> {
        // What was used before this sync; what is used from now on is the
        // next sync's to check.
        let before = std::mem::take(&mut *self.used.lock());
        let mut on = String::new();
        let v = match self.with_conn(|c| {
            on = c.server.clone();
            f(c)
        }) {
            Ok(v) => v,
            Err(e) => {
                self.used.lock().extend(before);
                return Err(e);
            }
        };
        let others: Vec<String> = before.into_iter().filter(|s| *s != on).collect();
        if !others.is_empty() {
            return Err(Error::Meta(format!(
                "the Redis master changed (a failover) since changes this sync covers were \
                 sent to {}; they may be lost (now on {on})",
                others.join(", ")
            )));
        }
        Ok(v)
    }

    /// Where the metadata cache's feed connects ([`Source::locator`]).
    pub(super) fn locator(&self) -> Option<super::cache::Locate> {
        self.source.locator()
    }

    /// Round trips to the server so far (connection set-up not counted).
    pub(super) fn round_trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }

    fn take(&self) -> std::result::Result<Conn, RedisError> {
        if let Some(c) = self.idle.lock().pop() {
            return Ok(c);
        }
        let (c, server) = self.source.connect()?;
        {
            let mut current = self.current.lock();
            if *current != server {
                // A failover moved the master: connections to the old one
                // go, and are not taken again.
                *current = server.clone();
                self.idle.lock().clear();
            }
        }
        c.set_read_timeout(Some(READ_TIMEOUT))?;
        c.set_write_timeout(Some(WRITE_TIMEOUT))?;
        Ok(Conn {
            inner: c,
            trips: self.trips.clone(),
            server,
        })
    }

    fn give_back(&self, c: Conn) {
        if c.server != *self.current.lock() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < 16 {
            idle.push(c);
        }
    }

    /// Drops every idle connection (after the server went away).
    fn forget_idle(&self) {
        self.idle.lock().clear();
    }

    /// Runs `f` once on a fresh connection (no retries): for a first contact
    /// that should fail fast.
    pub(super) fn probe<T>(
        &self,
        f: impl FnOnce(&mut Conn) -> std::result::Result<T, RedisError>,
    ) -> std::result::Result<T, RedisError> {
        let mut c = self.take()?;
        let v = f(&mut c)?;
        self.give_back(c);
        Ok(v)
    }

    /// Runs `f` on a connection, retrying on connection loss; `f` must be
    /// safe to run twice (reads, idempotent writes). On a thread that must
    /// not wait (`sluice_api::wait`) it fails with `Error::WouldBlock`
    /// before it talks to the server: a round trip waits.
    pub(super) fn with_conn<T>(
        &self,
        mut f: impl FnMut(&mut Conn) -> std::result::Result<T, RedisError>,
    ) -> Result<T> {
        sluice_api::wait::may_wait()?;
        let mut tries = 0;
        loop {
            let r = self.take().and_then(|mut c| {
                self.used(&c);
                let r = f(&mut c);
                if r.as_ref().err().is_none_or(|e| !is_connection_error(e)) {
                    self.give_back(c);
                }
                r
            });
            match r {
                Ok(v) => return Ok(v),
                Err(e)
                    if (is_connection_error(&e) || is_transient(&e)) && tries < MAX_RECONNECTS =>
                {
                    tries += 1;
                    self.forget_idle();
                    log::debug!("Redis connection failed, retrying (try {tries}): {e}");
                    backoff(tries);
                }
                Err(e) => return Err(redis_error(e)),
            }
        }
    }
}

/// Sleeps before reconnection `tries` (1-based): 20 ms, doubling, at most
/// [`MAX_BACKOFF`].
fn backoff(tries: u32) {
    const RECONNECT: Backoff = Backoff::new(Duration::from_millis(20), MAX_BACKOFF);
    std::thread::sleep(RECONNECT.delay(tries));
}

/// What every transaction of a volume works with: its key names, the
/// settings its rules follow, and the client's shared state.
#[derive(Clone, Copy)]
pub(super) struct TxEnv<'a> {
    pub(super) keys: &'a Keys,
    /// Whether directory statistics are kept.
    pub(super) dir_stats: bool,
    /// Days deleted files stay in the trash (0 = no trash).
    pub(super) trash_days: u32,
    /// The limits changes are checked against.
    pub(super) quotas: &'a Quotas,
    /// The ACL rules this client has read or made.
    pub(super) acls: &'a RuleCache,
    /// The host-local metadata cache: a commit drops what it changed.
    pub(super) cache: Option<&'a super::cache::MetaCache>,
}

/// One transaction attempt on one connection.
pub(super) struct Tx<'c> {
    conn: &'c mut Conn,
    pub(super) keys: &'c Keys,
    /// Read-only transactions watch nothing and queue nothing.
    writing: bool,
    watched: HashSet<String>,
    /// Whether any command reached the server in this attempt.
    talked: bool,
    /// The writes queued for `MULTI`/`EXEC`.
    queue: Vec<Cmd>,
    queued: usize,
    /// String values as this transaction leaves them (None = deleted).
    strings: HashMap<String, Option<Vec<u8>>>,
    /// String values as read in this attempt (watched: a change by another
    /// client since makes the commit fail and the attempt run again).
    read_strings: HashMap<String, Option<Vec<u8>>>,
    /// Hash fields as read in this attempt.
    read_fields: HashMap<(String, Vec<u8>), Option<Vec<u8>>>,
    /// Whole hashes as read in this attempt.
    read_hashes: HashMap<String, HashFields>,
    /// Whole lists as read in this attempt (read before any change: a
    /// transaction never reads a list it changed).
    read_lists: HashMap<String, Vec<Vec<u8>>>,
    /// The raw values read, for what the decoders don't keep.
    raw: HashMap<String, Vec<u8>>,
    /// Hash fields as this transaction leaves them.
    fields: HashMap<(String, Vec<u8>), Option<Vec<u8>>>,
    /// Queue positions of reference decrements, with their slice.
    ref_checks: Vec<(usize, ReleasedSlice)>,
    pub(super) post: PostCommit,
    /// Whether directory statistics are kept (`DirStats`).
    pub(super) dir_stats: bool,
    /// Days deleted files stay in the trash (0 = no trash).
    pub(super) trash_days: u32,
    /// The limits changes are checked against.
    pub(super) quotas: &'c Quotas,
    /// The ACL rules this client has read or made.
    pub(super) acls: &'c RuleCache,
    cache: Option<&'c super::cache::MetaCache>,
    /// Whether growth below a quota directory is checked (a rename checks
    /// before its transaction, by JuiceFS's rule, and turns this off).
    pub(super) check_quota: bool,
    /// What this transaction adds to the usage the quotas count; written
    /// to the quota hashes with its other writes.
    pub(super) usage: UsageDelta,
}

/// A hash's fields and values, as `HGETALL` answers.
type HashFields = Vec<(Vec<u8>, Vec<u8>)>;

/// One value of a pipeline's answer, as `T`; a value of another shape is a
/// corrupt answer (an error naming it, never a panic).
fn parse<T: redis::FromRedisValue>(v: Value) -> TxResult<T> {
    redis::from_redis_value(v).map_err(|e| {
        TxError::Fs(Error::Corrupt(format!(
            "Redis answered a read with a value of an unexpected shape: {e}"
        )))
    })
}

/// A read [`Tx::prefetch`] sends ahead, with others, in one round trip.
#[derive(Debug, Clone, Copy)]
pub(super) enum Read<'a> {
    /// A string value (watched).
    Get(&'a str),
    /// A hash field (the hash watched).
    HGet(&'a str, &'a [u8]),
    /// A whole hash (watched).
    HGetAll(&'a str),
    /// A whole list (watched).
    LRange(&'a str),
}

impl<'c> Tx<'c> {
    fn run<T: redis::FromRedisValue>(&mut self, cmd: &Cmd) -> TxResult<T> {
        self.talked = true;
        Ok(cmd.query(self.conn)?)
    }

    /// Runs a read of `key` in one round trip with the `WATCH` of the key,
    /// in a write transaction that has not watched it yet (a `WATCH` of its
    /// own would cost a round trip more).
    fn watched_read<T: redis::FromRedisValue>(&mut self, key: &str, read: Cmd) -> TxResult<T> {
        if !self.writing || self.watched.contains(key) {
            return self.run(&read);
        }
        let mut p = redis::pipe();
        p.cmd("WATCH").arg(key).ignore();
        p.add_command(read);
        self.talked = true;
        let (v,): (T,) = p.query(self.conn)?;
        self.watched.insert(key.to_string());
        Ok(v)
    }

    /// Reads `reads` in one round trip — the `WATCH` of their keys (in a
    /// write transaction) and the reads, as one pipeline — and keeps the
    /// values, so the [`Tx::get`] and [`Tx::hget`] calls that follow answer
    /// without a round trip. What a transaction will read is often known
    /// at its start (a parent's attributes and an entry of it); reading it
    /// together is what keeps an operation to a few round trips.
    ///
    /// A node's space record is read with the node (its key added here),
    /// so every read of a node costs what it cost without one.
    pub(super) fn prefetch(&mut self, reads: &[Read<'_>]) -> TxResult<()> {
        let records: Vec<String> = reads
            .iter()
            .filter_map(|r| match r {
                Read::Get(k) => self.keys.space_of_node_key(k),
                _ => None,
            })
            .collect();
        let todo: Vec<Read<'_>> = reads
            .iter()
            .copied()
            .chain(records.iter().map(|k| Read::Get(k)))
            .filter(|r| match r {
                Read::Get(k) => {
                    !self.strings.contains_key(*k) && !self.read_strings.contains_key(*k)
                }
                Read::HGet(k, f) => {
                    let kf = (k.to_string(), f.to_vec());
                    !self.fields.contains_key(&kf) && !self.read_fields.contains_key(&kf)
                }
                Read::HGetAll(k) => !self.read_hashes.contains_key(*k),
                Read::LRange(k) => !self.read_lists.contains_key(*k),
            })
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let mut p = redis::pipe();
        let mut watch: Vec<&str> = Vec::new();
        if self.writing {
            for r in &todo {
                let (Read::Get(k) | Read::HGet(k, _) | Read::HGetAll(k) | Read::LRange(k)) = r;
                if !self.watched.contains(*k) && !watch.contains(k) {
                    watch.push(k);
                }
            }
            if !watch.is_empty() {
                p.cmd("WATCH").arg(&watch).ignore();
            }
        }
        for r in &todo {
            match r {
                Read::Get(k) => p.cmd("GET").arg(*k),
                Read::HGet(k, f) => p.cmd("HGET").arg(*k).arg(*f),
                Read::HGetAll(k) => p.cmd("HGETALL").arg(*k),
                Read::LRange(k) => p.cmd("LRANGE").arg(*k).arg(0).arg(-1),
            };
        }
        self.talked = true;
        let values: Vec<Value> = p.query(self.conn)?;
        for k in watch {
            self.watched.insert(k.to_string());
        }
        for (r, v) in todo.iter().zip(values) {
            match r {
                Read::Get(k) => {
                    let v: Option<Vec<u8>> = parse(v)?;
                    if let Some(v) = &v {
                        self.raw.insert(k.to_string(), v.clone());
                    }
                    self.read_strings.insert(k.to_string(), v);
                }
                Read::HGet(k, f) => {
                    let v: Option<Vec<u8>> = parse(v)?;
                    self.read_fields.insert((k.to_string(), f.to_vec()), v);
                }
                Read::HGetAll(k) => {
                    let v: Vec<(Vec<u8>, Vec<u8>)> = parse(v)?;
                    self.read_hashes.insert(k.to_string(), v);
                }
                Read::LRange(k) => {
                    let v: Vec<Vec<u8>> = parse(v)?;
                    self.read_lists.insert(k.to_string(), v);
                }
            }
        }
        Ok(())
    }

    /// Reads a string value.
    pub(super) fn get(&mut self, key: &str) -> TxResult<Option<Vec<u8>>> {
        if let Some(v) = self.strings.get(key) {
            return Ok(v.clone());
        }
        if let Some(v) = self.read_strings.get(key) {
            return Ok(v.clone());
        }
        let mut read = redis::cmd("GET");
        read.arg(key);
        let v: Option<Vec<u8>> = self.watched_read(key, read)?;
        if let Some(v) = &v {
            self.raw.insert(key.to_string(), v.clone());
        }
        self.read_strings.insert(key.to_string(), v.clone());
        Ok(v)
    }

    /// Whether `key` is known to hold nothing: read as absent, or deleted,
    /// in this transaction.
    pub(super) fn known_absent(&self, key: &str) -> bool {
        match self.strings.get(key) {
            Some(v) => v.is_none(),
            None => matches!(self.read_strings.get(key), Some(None)),
        }
    }

    /// The value `key` had when read in this transaction.
    pub(super) fn raw(&self, key: &str) -> Option<&[u8]> {
        self.raw.get(key).map(Vec::as_slice)
    }

    /// Reads a hash field.
    pub(super) fn hget(&mut self, key: &str, field: &[u8]) -> TxResult<Option<Vec<u8>>> {
        let kf = (key.to_string(), field.to_vec());
        if let Some(v) = self.fields.get(&kf) {
            return Ok(v.clone());
        }
        if let Some(v) = self.read_fields.get(&kf) {
            return Ok(v.clone());
        }
        let mut read = redis::cmd("HGET");
        read.arg(key).arg(field);
        let v: Option<Vec<u8>> = self.watched_read(key, read)?;
        self.read_fields.insert(kf, v.clone());
        Ok(v)
    }

    /// Every field of a hash, with this transaction's changes applied.
    pub(super) fn hgetall(&mut self, key: &str) -> TxResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut all: Vec<(Vec<u8>, Vec<u8>)> = match self.read_hashes.get(key) {
            Some(all) => all.clone(),
            None => {
                let mut read = redis::cmd("HGETALL");
                read.arg(key);
                let all: Vec<(Vec<u8>, Vec<u8>)> = self.watched_read(key, read)?;
                self.read_hashes.insert(key.to_string(), all.clone());
                all
            }
        };
        let changed: Vec<(&Vec<u8>, &Option<Vec<u8>>)> = self
            .fields
            .iter()
            .filter(|((k, _), _)| k == key)
            .map(|((_, f), v)| (f, v))
            .collect();
        if !changed.is_empty() {
            all.retain(|(f, _)| !changed.iter().any(|(cf, _)| *cf == f));
            for (f, v) in changed {
                if let Some(v) = v {
                    all.push((f.clone(), v.clone()));
                }
            }
        }
        Ok(all)
    }

    /// How many fields a hash has, with this transaction's changes applied.
    pub(super) fn hlen(&mut self, key: &str) -> TxResult<u64> {
        if self.fields.keys().any(|(k, _)| k == key) {
            return Ok(self.hgetall(key)?.len() as u64);
        }
        let mut read = redis::cmd("HLEN");
        read.arg(key);
        self.watched_read(key, read)
    }

    /// A whole list (chunks are never read after being changed in the same
    /// transaction).
    pub(super) fn lrange(&mut self, key: &str, stop: i64) -> TxResult<Vec<Vec<u8>>> {
        if stop == -1
            && let Some(all) = self.read_lists.get(key)
        {
            return Ok(all.clone());
        }
        let mut read = redis::cmd("LRANGE");
        read.arg(key).arg(0).arg(stop);
        self.watched_read(key, read)
    }

    /// Runs a command at once, outside the transaction (JuiceFS's `INCR
    /// nextTrash`: a number wasted by a conflict is harmless).
    pub(super) fn now<T: redis::FromRedisValue>(&mut self, cmd: &Cmd) -> TxResult<T> {
        self.run(cmd)
    }

    /// Runs a pipeline of reads at once, outside the transaction (nothing
    /// watched).
    pub(super) fn now_pipe<T: redis::FromRedisValue>(&mut self, p: &Pipeline) -> TxResult<T> {
        self.talked = true;
        Ok(p.query(self.conn)?)
    }

    fn queue(&mut self, cmd: Cmd) -> usize {
        debug_assert!(self.writing, "a read transaction queued a write");
        self.queue.push(cmd);
        self.queued += 1;
        self.queued - 1
    }

    /// Sets a string value.
    pub(super) fn set(&mut self, key: &str, value: &[u8]) {
        self.strings.insert(key.to_string(), Some(value.to_vec()));
        let mut c = redis::cmd("SET");
        c.arg(key).arg(value);
        self.queue(c);
    }

    /// Deletes keys.
    pub(super) fn del(&mut self, key: &str) {
        self.strings.insert(key.to_string(), None);
        self.fields.retain(|(k, _), _| k != key);
        let mut c = redis::cmd("DEL");
        c.arg(key);
        self.queue(c);
    }

    /// Sets a hash field.
    pub(super) fn hset(&mut self, key: &str, field: &[u8], value: &[u8]) {
        self.fields
            .insert((key.to_string(), field.to_vec()), Some(value.to_vec()));
        let mut c = redis::cmd("HSET");
        c.arg(key).arg(field).arg(value);
        self.queue(c);
    }

    /// Deletes a hash field.
    pub(super) fn hdel(&mut self, key: &str, field: &[u8]) {
        self.fields.insert((key.to_string(), field.to_vec()), None);
        let mut c = redis::cmd("HDEL");
        c.arg(key).arg(field);
        self.queue(c);
    }

    /// Adds to a hash field (not readable in this transaction).
    pub(super) fn hincrby(&mut self, key: &str, field: &[u8], by: i64) -> usize {
        let mut c = redis::cmd("HINCRBY");
        c.arg(key).arg(field).arg(by);
        self.queue(c)
    }

    /// Adds to a counter.
    pub(super) fn incrby(&mut self, key: &str, by: i64) {
        let mut c = redis::cmd("INCRBY");
        c.arg(key).arg(by);
        self.queue(c);
    }

    /// Queues any other write; its position, whose result the commit's
    /// [`PostCommit::results`] holds.
    pub(super) fn cmd(&mut self, cmd: Cmd) -> usize {
        self.queue(cmd)
    }

    /// Drops one reference of a slice; if it was the last, the slice is
    /// released after the commit.
    pub(super) fn unref(&mut self, id: u64, size: u32) {
        let key = self.keys.slice_refs();
        let at = self.hincrby(&key, slice_field(id, size).as_bytes(), -1);
        self.ref_checks.push((at, ReleasedSlice { id, size }));
    }

    /// Where the transaction's writes stand now, for [`Tx::rollback`].
    pub(super) fn mark(&self) -> Mark {
        Mark {
            queued: self.queued,
            strings: self.strings.clone(),
            fields: self.fields.clone(),
            ref_checks: self.ref_checks.len(),
            released: self.post.released.len(),
            deleted_files: self.post.deleted_files.len(),
            usage: self.usage.clone(),
        }
    }

    /// Forgets every write queued since `mark` (the reads and watches
    /// stay): one part of a transaction that holds several (a group
    /// commit's files) failed alone.
    pub(super) fn rollback(&mut self, mark: Mark) {
        self.queue.truncate(mark.queued);
        self.queued = mark.queued;
        self.strings = mark.strings;
        self.fields = mark.fields;
        self.ref_checks.truncate(mark.ref_checks);
        self.post.released.truncate(mark.released);
        self.post.deleted_files.truncate(mark.deleted_files);
        self.usage = mark.usage;
    }

    /// Sends the queued writes. `None`: a watched key changed.
    fn commit(&mut self) -> std::result::Result<Option<PostCommit>, RedisError> {
        let [_, used_space, used_inodes] = self.keys.dir_quota_keys();
        let changes: Vec<(Ino, i64, i64)> = self.usage.dir_changes().collect();
        for (dir, space, inodes) in changes {
            let field = dir.to_string();
            if space != 0 {
                self.hincrby(&used_space, field.as_bytes(), space);
            }
            if inodes != 0 {
                self.hincrby(&used_inodes, field.as_bytes(), inodes);
            }
        }
        if self.queued == 0 {
            if !self.watched.is_empty() {
                redis::cmd("UNWATCH").query::<()>(self.conn)?;
            }
            return Ok(Some(std::mem::take(&mut self.post)));
        }
        if !self.talked {
            // The first command of this attempt would be EXEC: make sure
            // the connection is alive, so a failure means "not applied".
            redis::cmd("PING").query::<()>(self.conn)?;
        }
        let mut exec = redis::pipe();
        exec.atomic();
        for c in self.queue.drain(..) {
            exec.add_command(c);
        }
        let answer = exec.query::<Option<Vec<Value>>>(self.conn);
        // Whatever the answer (applied, a conflict, unknown), what this
        // commit may have changed is no longer trusted here.
        if let Some(cache) = self.cache {
            cache.forget_written(exec.cmd_iter());
        }
        let Some(results) = answer? else {
            return Ok(None);
        };
        let mut post = std::mem::take(&mut self.post);
        let mut seen = HashSet::new();
        for (at, s) in &self.ref_checks {
            if let Some(Value::Int(n)) = results.get(*at)
                && *n < 0
                && seen.insert(*s)
            {
                post.released.push(*s);
            }
        }
        post.results = results;
        Ok(Some(post))
    }
}

/// What [`Tx::mark`] saw, to roll back to.
pub(super) struct Mark {
    queued: usize,
    strings: HashMap<String, Option<Vec<u8>>>,
    fields: HashMap<(String, Vec<u8>), Option<Vec<u8>>>,
    ref_checks: usize,
    released: usize,
    deleted_files: usize,
    usage: UsageDelta,
}

/// Where a transaction attempt failed.
enum Attempt<T> {
    Done(T, PostCommit),
    Conflict,
    /// Failed before anything was sent for commit: safe to run again.
    Retry(RedisError),
    Failed(Error),
}

/// Runs transactions on a pool.
impl Pool {
    /// Runs `f` as one transaction (`writing`) or one series of reads,
    /// restarting it on conflicts and on connection loss before commit.
    /// Fails with `Error::WouldBlock` before anything is sent on a thread
    /// that must not wait, as [`Pool::with_conn`] does.
    pub(super) fn transact<T>(
        &self,
        env: &TxEnv<'_>,
        writing: bool,
        mut f: impl FnMut(&mut Tx<'_>) -> TxResult<T>,
    ) -> Result<(T, PostCommit)> {
        let TxEnv {
            keys,
            dir_stats,
            trash_days,
            quotas,
            acls,
            cache,
        } = *env;
        sluice_api::wait::may_wait()?;
        let (mut conflicts, mut reconnects) = (0u32, 0u32);
        let started = std::time::Instant::now();
        loop {
            let attempt = match self.take() {
                Err(e) => Attempt::Retry(e),
                Ok(mut conn) => {
                    self.used(&conn);
                    let mut keep = true;
                    let a = {
                        let mut tx = Tx {
                            conn: &mut conn,
                            keys,
                            writing,
                            watched: HashSet::new(),
                            talked: false,
                            queue: Vec::new(),
                            queued: 0,
                            strings: HashMap::new(),
                            read_strings: HashMap::new(),
                            read_fields: HashMap::new(),
                            read_hashes: HashMap::new(),
                            read_lists: HashMap::new(),
                            raw: HashMap::new(),
                            fields: HashMap::new(),
                            ref_checks: Vec::new(),
                            post: PostCommit::default(),
                            dir_stats,
                            trash_days,
                            quotas,
                            acls,
                            cache,
                            check_quota: true,
                            usage: UsageDelta::default(),
                        };
                        match f(&mut tx) {
                            Ok(v) => match tx.commit() {
                                Ok(Some(post)) => {
                                    quotas.apply(&tx.usage);
                                    Attempt::Done(v, post)
                                }
                                Ok(None) => Attempt::Conflict,
                                Err(e) if is_connection_error(&e) => {
                                    keep = false;
                                    if writing && tx.queued > 0 {
                                        Attempt::Failed(Error::Meta(format!(
                                            "the Redis connection was lost while committing; \
                                             the change may or may not have been applied: {e}"
                                        )))
                                    } else {
                                        Attempt::Retry(e)
                                    }
                                }
                                Err(e) if is_transient(&e) => Attempt::Retry(e),
                                Err(e) => Attempt::Failed(redis_error(e)),
                            },
                            Err(TxError::Redis(e)) if is_connection_error(&e) => {
                                keep = false;
                                Attempt::Retry(e)
                            }
                            Err(e) => {
                                if !tx.watched.is_empty()
                                    && redis::cmd("UNWATCH").query::<()>(tx.conn).is_err()
                                {
                                    keep = false;
                                }
                                match e {
                                    TxError::Redis(e) if is_transient(&e) => Attempt::Retry(e),
                                    TxError::Redis(e) => Attempt::Failed(redis_error(e)),
                                    TxError::Fs(e) => Attempt::Failed(e),
                                }
                            }
                        }
                    };
                    if keep {
                        self.give_back(conn);
                    }
                    a
                }
            };
            match attempt {
                Attempt::Done(v, post) => {
                    if writing {
                        crate::metrics::TRANSACTIONS.record(started);
                    }
                    return Ok((v, post));
                }
                Attempt::Failed(e) => return Err(e),
                Attempt::Conflict if conflicts < MAX_CONFLICTS => {
                    conflicts += 1;
                    crate::metrics::TRANSACTIONS.restarted();
                    log::debug!("Redis transaction conflicted, restarting (try {conflicts})");
                    let jitter =
                        u64::from(std::process::id() ^ conflicts.wrapping_mul(2_654_435_761))
                            % u64::from(conflicts * conflicts).max(1);
                    std::thread::sleep(Duration::from_millis(jitter));
                }
                Attempt::Conflict => {
                    return Err(Error::Meta(format!(
                        "a Redis transaction conflicted {MAX_CONFLICTS} times; giving up"
                    )));
                }
                Attempt::Retry(e) if reconnects < MAX_RECONNECTS => {
                    reconnects += 1;
                    self.forget_idle();
                    log::debug!("Redis connection failed, retrying (try {reconnects}): {e}");
                    backoff(reconnects);
                }
                Attempt::Retry(e) => return Err(redis_error(e)),
            }
        }
    }
}
