//! The shared metadata engine: Redis on JuiceFS 1.x's Redis key schema, so
//! volumes JuiceFS formatted on Redis are served as they are and JuiceFS's
//! tools keep working on what sluice writes.
//!
//! Keys (see `keys.rs`): `setting` (the settings JSON); counters `nextinode`,
//! `nextchunk`, `nextsession` (the last id handed out), `usedSpace`,
//! `totalInodes`, `nextTrash`; `i{ino}` attributes (`codec.rs`); `d{ino}`
//! entries; `p{ino}` parents of hard-linked nodes; `c{ino}_{indx}` slice
//! lists; `sliceRef` (`k{id}_{size}` → references − 1: a slice written once
//! has no field); `s{ino}` symlink targets; `x{ino}` extended attributes;
//! `delfiles`, `delSlices`; `allSessions`, `sessionInfos`, `session{sid}`;
//! `dirDataLength`/`dirUsedSpace`/`dirUsedInodes`.
//!
//! Every `Meta` or `Store` method that changes something is one optimistic
//! transaction (`tx.rs`). Work that must follow a commit — deleting the
//! objects of released slices, the chunks of removed files — runs after it.
//!
//! On a Redis Cluster every key carries JuiceFS's hash tag `{DB}`, so the
//! whole volume lives in one slot and the engine talks to that slot's master
//! (a slot that moves later needs a reopen). Sentinel URLs (JuiceFS's
//! `redis://MASTER,SENTINEL[:PORT],...` form) and `rediss://` (TLS, with
//! JuiceFS's option names) are served.

mod cache;
mod check;
mod chunk;
mod cluster;
mod codec;
mod dir_quota;
mod keys;
mod namespace;
mod node;
mod restore;
mod session;
#[cfg(test)]
pub(crate) mod tests;
mod tx;
mod xattr;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::rules;
use crate::meta::settings;
use crate::meta::{
    Attr, ChunkWrite, CommitResult, Context, DirQuota, Ino, QuotaChange, Quotas, ROOT_INO,
    ReleasedSlice, Slice, SliceReleaser, Store, TRASH_INO, Timestamp, quota,
};

use super::deleter::{Deleter, Deletes};
use keys::{Keys, counter, slice_field};
use tx::{Pool, PostCommit, Source, Tx, TxEnv, TxError, TxResult};

/// How many inode numbers one counter increment reserves (JuiceFS `inodeBatch`).
const INODE_BATCH: u64 = 1024;
/// How many slice ids one counter increment reserves (JuiceFS `sliceIdBatch`).
const SLICE_BATCH: u64 = 4096;
/// Write transactions of this process are serialised per stripe (picked by
/// the main inode), as JuiceFS's `txLock`, so local writers don't keep
/// aborting each other; other processes are handled by WATCH.
const STRIPES: usize = 64;

/// A range of ids reserved from a counter, handed out one at a time.
#[derive(Debug, Default, Clone, Copy)]
struct IdRange {
    next: u64,
    end: u64,
}

/// The Redis metadata engine. Cheap to share: all state is behind an `Arc`.
pub struct RedisMeta {
    inner: Arc<Inner>,
}

struct Inner {
    /// The URL without its password, for messages.
    addr: String,
    pool: Pool,
    keys: Keys,
    stripes: Vec<Mutex<()>>,
    format: RwLock<Option<Format>>,
    inodes: Mutex<IdRange>,
    slices: Mutex<IdRange>,
    sid: AtomicU64,
    /// Files this client holds open; one unlinked while open is kept in
    /// `session{sid}` until the last close.
    open_files: Mutex<super::open_files::OpenFiles>,
    /// Replicas every fsync waits for (`?fsync-replicas=N`; 0: none).
    fsync_replicas: u32,
    /// Files whose last close here is not yet recorded in Redis
    /// (`session::closed`).
    closes: Mutex<Vec<Ino>>,
    releaser: RwLock<Option<SliceReleaser>>,
    /// Deletes removed files' data and released slices' objects in the
    /// background, once asked to ([`Store::delete_in_background`]).
    deleter: Mutex<Option<Arc<Deleter>>>,
    heartbeat: Mutex<Option<crate::meta::session::Heartbeat>>,
    trash_dir: Mutex<Option<(String, Ino)>>,
    /// What range operations visited (`Meta::work`).
    work: crate::meta::WorkCounters,
    /// Capacity, inode limit and directory quotas, with their usage.
    quotas: Quotas,
    /// The ACL rules this client has read or made.
    acls: crate::meta::acl::RuleCache,
    /// How the host-local metadata cache is set (`?client-cache=false`:
    /// none).
    cache_settings: Option<cache::Settings>,
    /// Attributes, entries and extended attributes read, kept until Redis
    /// says they changed; started with the session ([`Inner::start_cache`]).
    cache: std::sync::OnceLock<Arc<cache::MetaCache>>,
}

impl std::fmt::Debug for RedisMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisMeta")
            .field("addr", &self.inner.addr)
            .field("sid", &self.inner.sid.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What a Redis server with these persistence settings (`CONFIG GET`
/// answers; `None`: not reported) cannot promise about fsync'ed writes.
fn persistence_gap(
    addr: &str,
    appendonly: Option<&str>,
    appendfsync: Option<&str>,
) -> Option<String> {
    let fix = "set appendonly yes and appendfsync always for fsync to mean durable";
    match (appendonly, appendfsync) {
        (Some(a), Some(f)) if a.eq_ignore_ascii_case("yes") && f.eq_ignore_ascii_case("always") => {
            None
        }
        (Some(a), _) if a.eq_ignore_ascii_case("no") => Some(format!(
            "Redis at {addr} runs with appendonly no: a Redis crash or power loss loses the \
             metadata commits since its last snapshot, fsync'ed writes included; {fix}"
        )),
        (Some(_), Some(f)) if f.eq_ignore_ascii_case("everysec") => Some(format!(
            "Redis at {addr} runs with appendfsync everysec: a power loss on the Redis host \
             can lose the last second of metadata commits, fsync'ed writes included; {fix}"
        )),
        (Some(_), Some(f)) => Some(format!(
            "Redis at {addr} runs with appendfsync {f}: a power loss on the Redis host can \
             lose the metadata commits its operating system had not written, fsync'ed \
             writes included; {fix}"
        )),
        _ => Some(format!(
            "Redis at {addr} did not report appendonly and appendfsync; fsync'ed writes \
             survive a power loss only if it runs with appendonly yes and appendfsync always"
        )),
    }
}

/// The same connection settings with another database number.
fn with_db(info: redis::ConnectionInfo, db: i64) -> redis::ConnectionInfo {
    let settings = info.redis_settings().clone().set_db(db);
    info.set_redis_settings(settings)
}

/// The TLS options of a `rediss://` URL, under JuiceFS's names:
/// `tls-ca-cert-file` (the CA that signed the server's certificate; default:
/// the system's roots), `tls-cert-file` and `tls-key-file` (a client
/// certificate, for servers that ask for one) and `insecure-skip-verify`
/// (accept any server certificate).
#[derive(Debug, Default, Clone)]
struct TlsOptions {
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    insecure: bool,
}

impl TlsOptions {
    /// Takes `key=value` if it is a TLS option (true) or leaves it (false).
    fn take(&mut self, key: &str, value: &str) -> std::result::Result<bool, String> {
        let file = |v: &str| {
            if v.is_empty() {
                Err(format!("{key} needs a file path"))
            } else {
                Ok(Some(v.to_string()))
            }
        };
        match key {
            "tls-ca-cert-file" => self.ca = file(value)?,
            "tls-cert-file" => self.cert = file(value)?,
            "tls-key-file" => self.key = file(value)?,
            "insecure-skip-verify" => {
                self.insecure = match value {
                    "" | "true" | "1" => true,
                    "false" | "0" => false,
                    v => {
                        return Err(format!(
                            "insecure-skip-verify takes true or false, not {v:?}"
                        ));
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `addr` as a TLS address with these options.
    fn addr(&self, addr: redis::ConnectionAddr) -> redis::ConnectionAddr {
        match addr {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: self.insecure,
                tls_params: None,
            },
            other => other,
        }
    }

    /// The certificates the files name, read now so a missing file is
    /// reported at open.
    fn certificates(&self) -> std::result::Result<redis::TlsCertificates, String> {
        let read = |what: &str, path: &str| {
            std::fs::read(path).map_err(|e| format!("cannot read the {what} {path}: {e}"))
        };
        let client_tls = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                client_cert: read("client certificate (tls-cert-file)", c)?,
                client_key: read("client key (tls-key-file)", k)?,
            }),
            (None, None) => None,
            _ => return Err("tls-cert-file and tls-key-file go together".into()),
        };
        let root_cert = match &self.ca {
            Some(ca) => Some(read("CA certificate (tls-ca-cert-file)", ca)?),
            None => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

impl RedisMeta {
    /// Holds the background deleter (see `Deleter::hold`); `None` before
    /// it started.
    #[cfg(test)]
    pub(crate) fn hold_deletes(&self) -> Option<super::deleter::Hold> {
        self.inner.deleter.lock().as_ref().map(|d| d.hold())
    }

    /// Connects to the Redis server a JuiceFS metadata URL names:
    /// `redis://[[user]:pass@]host[:port][/db]`, the same with `rediss://`
    /// for TLS (options in [`TlsOptions`]), `unix://[/path]?db=N`, or the
    /// master of a Redis Sentinel deployment, as JuiceFS writes it:
    /// `redis://[[user]:pass@]MASTER_NAME,SENTINEL[:PORT][,SENTINEL[:PORT]...][/db]`
    /// (sentinels on port 26379 unless given; their own password from
    /// `SENTINEL_PASSWORD`). Without a password in the URL,
    /// `REDIS_PASSWORD` or `META_PASSWORD` from the environment is used, as
    /// JuiceFS does. `?fsync-replicas=N` makes every fsync wait until N
    /// replicas hold every write so far ([`Store::sync`]).
    pub fn open(url: &str) -> Result<RedisMeta> {
        use redis::IntoConnectionInfo;
        let shown = crate::redact::redact_url(url);
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (scheme, rest) = base.split_once("://").unwrap_or(("", base));
        let (userinfo, hosts) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let (host_list, db_part) = hosts.split_once('/').unwrap_or((hosts, ""));
        let sentinel = host_list.contains(',');
        let lower = base.to_ascii_lowercase();
        let is_unix = lower.starts_with("unix://");
        let is_tls = lower.starts_with("rediss://");
        let mut tls = TlsOptions::default();
        // JuiceFS options (timeouts, retries) the driver doesn't know are
        // dropped; its TLS options are ours.
        let mut kept: Vec<&str> = Vec::new();
        let mut fsync_replicas = 0u32;
        let mut cache = Some(cache::Settings {
            size: cache::DEFAULT_SIZE,
            expire: cache::DEFAULT_EXPIRE,
        });
        let mut cache_size = None;
        let mut cache_expire = None;
        for p in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = p.split_once('=').unwrap_or((p, ""));
            if is_unix && matches!(key, "db" | "user" | "pass") {
                kept.push(p);
            } else if key == "client-cache" {
                // JuiceFS's option (there off unless given); on here unless
                // turned off.
                if matches!(value, "false" | "0" | "off" | "no") {
                    cache = None;
                }
            } else if key == "client-cache-size" {
                cache_size = Some(value.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(
                    || {
                        Error::Invalid(format!(
                            "{shown}: client-cache-size takes a number of entries above 0, not {value:?}"
                        ))
                    },
                )?);
            } else if key == "client-cache-expire" {
                cache_expire = Some(cache::parse_expire(value).ok_or_else(|| {
                    Error::Invalid(format!(
                        "{shown}: client-cache-expire takes a duration such as 60s, 5m or 500ms, not {value:?}"
                    ))
                })?);
            } else if key == "fsync-replicas" {
                fsync_replicas = value.parse().map_err(|_| {
                    Error::Invalid(format!(
                        "{shown}: fsync-replicas takes a number of replicas, not {value:?}"
                    ))
                })?;
            } else if tls
                .take(key, value)
                .map_err(|e| Error::Invalid(format!("{shown}: {e}")))?
            {
                if !is_tls {
                    return Err(Error::Invalid(format!(
                        "{shown}: {key} is a TLS option; use a rediss:// URL"
                    )));
                }
            } else {
                log::debug!("ignoring Redis URL option {key}");
            }
        }
        if let Some(c) = cache.as_mut() {
            c.size = cache_size.unwrap_or(c.size);
            c.expire = cache_expire.unwrap_or(c.expire);
        }
        let clean = if sentinel {
            // The node settings (user, password, db) as the driver reads
            // them from a URL, on a stand-in host.
            let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
            format!("{scheme}://{user}localhost/{db_part}")
        } else if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut info = clean
            .as_str()
            .into_connection_info()
            .map_err(|e| Error::Invalid(format!("{shown} is not a usable Redis URL: {e}")))?;
        if info.redis_settings().password().is_none()
            && let Some(pw) = ["REDIS_PASSWORD", "META_PASSWORD"]
                .iter()
                .find_map(|v| std::env::var(v).ok().filter(|p| !p.is_empty()))
        {
            let settings = info.redis_settings().clone().set_password(pw);
            info = info.set_redis_settings(settings);
        }
        let unusable = |e: redis::RedisError| {
            Error::Invalid(format!("{shown} is not a usable Redis URL: {e}"))
        };
        let unreachable =
            |e: redis::RedisError| Error::Meta(format!("cannot reach Redis at {shown}: {e}"));
        let certs = if is_tls {
            let addr = tls.addr(info.addr().clone());
            info = info.set_addr(addr);
            Some(
                tls.certificates()
                    .map_err(|e| Error::Invalid(format!("{shown}: {e}")))?,
            )
        } else {
            None
        };
        let client = |info: redis::ConnectionInfo| match &certs {
            Some(c) => redis::Client::build_with_tls(info, c.clone()),
            None => redis::Client::open(info),
        };
        if sentinel {
            let pool = sentinel_pool(&shown, host_list, &info, is_tls, certs.as_ref())?;
            pool.probe(|c| redis::cmd("PING").query::<()>(c))
                .map_err(unreachable)?;
            return Ok(RedisMeta::with(
                shown,
                pool,
                Keys::default(),
                fsync_replicas,
                cache,
            ));
        }
        // A cluster node refuses SELECT, so the first contact uses db 0.
        let db = info.redis_settings().db();
        let first = Pool::new(client(with_db(info.clone(), 0)).map_err(unusable)?);
        let cluster = first
            .probe(
                |c| match redis::cmd("CLUSTER").arg("INFO").query::<String>(c) {
                    Ok(s) => Ok(s.contains("cluster_state:")),
                    // "ERR This instance has cluster support disabled"
                    Err(e) if e.code().is_some() => Ok(false),
                    Err(e) => Err(e),
                },
            )
            .map_err(unreachable)?;
        let (pool, keys) = if cluster {
            // JuiceFS keeps a volume in one slot, behind the hash tag `{DB}`:
            // talk to the master of that slot.
            let prefix = format!("{{{db}}}");
            let addr = first
                .probe(|c| cluster::slot_master(c, &prefix))
                .map_err(unreachable)?;
            let addr = match addr {
                Some(a) => a,
                None => {
                    return Err(Error::Meta(format!(
                        "no node of the Redis Cluster at {shown} serves the slot of {prefix}"
                    )));
                }
            };
            let node = match (info.addr().clone(), addr) {
                (redis::ConnectionAddr::Tcp(host, _), (h, port)) if h.is_empty() => {
                    redis::ConnectionAddr::Tcp(host, port)
                }
                (redis::ConnectionAddr::TcpTls { host, .. }, (h, port)) => {
                    let host = if h.is_empty() { host } else { h };
                    tls.addr(redis::ConnectionAddr::Tcp(host, port))
                }
                (_, (h, port)) => redis::ConnectionAddr::Tcp(h, port),
            };
            log::info!("{shown} is a Redis Cluster; volume keys are prefixed {prefix}");
            let node = client(with_db(info, 0).set_addr(node)).map_err(unusable)?;
            (Pool::new(node), Keys::with_prefix(prefix))
        } else {
            (Pool::new(client(info).map_err(unusable)?), Keys::default())
        };
        Ok(RedisMeta::with(shown, pool, keys, fsync_replicas, cache))
    }

    fn with(
        shown: String,
        pool: Pool,
        keys: Keys,
        fsync_replicas: u32,
        cache: Option<cache::Settings>,
    ) -> RedisMeta {
        RedisMeta {
            inner: Arc::new(Inner {
                addr: shown,
                pool,
                keys,
                fsync_replicas,
                stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
                format: RwLock::new(None),
                inodes: Mutex::new(IdRange::default()),
                slices: Mutex::new(IdRange::default()),
                sid: AtomicU64::new(0),
                open_files: Mutex::default(),
                releaser: RwLock::new(None),
                deleter: Mutex::new(None),
                closes: Mutex::new(Vec::new()),
                heartbeat: Mutex::new(None),
                trash_dir: Mutex::new(None),
                work: Default::default(),
                quotas: Quotas::default(),
                acls: Default::default(),
                cache_settings: cache,
                cache: std::sync::OnceLock::new(),
            }),
        }
    }

    /// This client's session id (0 before `new_session`).
    pub fn session_id(&self) -> u64 {
        self.inner.sid.load(Ordering::Relaxed)
    }
}

/// How long an fsync waits for `fsync-replicas` replicas.
const FSYNC_REPLICA_WAIT_MS: u64 = 10_000;

/// The pool of a Sentinel URL's master: `hosts` is `MASTER_NAME,SENTINEL
/// [:PORT],...`; `node` holds the user, password and db for the master.
fn sentinel_pool(
    shown: &str,
    hosts: &str,
    node: &redis::ConnectionInfo,
    tls: bool,
    certs: Option<&redis::TlsCertificates>,
) -> Result<Pool> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let mut parts = hosts.split(',');
    let name = parts.next().unwrap_or_default();
    if name.is_empty() {
        return Err(Error::Invalid(format!(
            "{shown}: a Sentinel URL names the master first: redis://MASTER_NAME,HOST:PORT,..."
        )));
    }
    let mut sentinels = Vec::new();
    for h in parts {
        let (host, port) = match h.rsplit_once(':') {
            Some((host, port)) => (
                host,
                port.parse::<u16>().map_err(|_| {
                    Error::Invalid(format!("{shown}: {h:?} is not HOST[:PORT] of a sentinel"))
                })?,
            ),
            None => (h, 26379),
        };
        if host.is_empty() {
            return Err(Error::Invalid(format!(
                "{shown}: a sentinel without a host"
            )));
        }
        sentinels.push(if tls {
            redis::ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            redis::ConnectionAddr::Tcp(host.to_string(), port)
        });
    }
    let settings = node.redis_settings();
    let bad = |e: redis::RedisError| Error::Invalid(format!("{shown}: {e}"));
    let mut b = SentinelClientBuilder::new(sentinels, name, SentinelServerType::Master)
        .map_err(bad)?
        .set_client_to_redis_db(settings.db());
    if let Some(u) = settings.username() {
        b = b.set_client_to_redis_username(u);
    }
    if let Some(p) = settings.password() {
        b = b.set_client_to_redis_password(p);
    }
    if let Some(p) = std::env::var("SENTINEL_PASSWORD")
        .ok()
        .filter(|p| !p.is_empty())
    {
        b = b.set_client_to_sentinel_password(p);
    }
    if let Some(c) = certs {
        b = b
            .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
            .set_client_to_redis_certificates(c.clone())
            .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
            .set_client_to_sentinel_certificates(c.clone());
    }
    let client = b.build().map_err(bad)?;
    Ok(Pool::with_source(Source::Sentinel {
        client: Arc::new(Mutex::new(client)),
        name: name.to_string(),
        master: Mutex::new(None),
    }))
}

impl Deletes for Inner {
    fn delete_file_data(&self, ino: Ino, length: u64) -> Result<()> {
        Inner::delete_file_data(self, ino, length)
    }

    fn delete_files_data(&self, files: &[(Ino, u64)]) -> Result<()> {
        Inner::delete_files_data(self, files)
    }

    fn release_slices(&self, released: &[ReleasedSlice]) {
        Inner::release_slices(self, released);
    }
}

impl Drop for RedisMeta {
    fn drop(&mut self) {
        self.inner.stop_heartbeat();
    }
}

impl Inner {
    /// The host-local metadata cache, once started.
    fn cache(&self) -> Option<&cache::MetaCache> {
        self.cache.get().map(|c| &**c)
    }

    /// Starts the host-local metadata cache (its feed connection and
    /// thread), unless the URL turned it off or it runs already. With the
    /// session, not at open: a daemon opens the volume before its sandbox
    /// is up, and threads started then would escape the sandbox's file
    /// rules (Landlock confines the thread that asks and those it starts
    /// later) and keep the socket-cleanup helper from forking; the
    /// commands that only read or check a volume need no cache.
    fn start_cache(&self) {
        let Some(settings) = self.cache_settings else {
            return;
        };
        match self.pool.locator() {
            Some(locate) => {
                self.cache
                    .get_or_init(|| cache::MetaCache::start(settings, self.keys.prefix(), locate));
            }
            None => log::info!(
                "{}: no metadata cache over TLS (its invalidation feed speaks plain TCP or a \
                 Unix socket)",
                self.addr
            ),
        }
    }

    /// The volume settings, read once and cached.
    fn format(&self) -> Result<Format> {
        if let Some(f) = self.format.read().as_ref() {
            return Ok(f.clone());
        }
        let f = self.read_format()?.ok_or(Error::NotFound)?;
        *self.format.write() = Some(f.clone());
        Ok(f)
    }

    fn read_format(&self) -> Result<Option<Format>> {
        let key = self.keys.setting();
        let json: Option<Vec<u8>> = self
            .pool
            .with_conn(|c| redis::cmd("GET").arg(&key).query(c))?;
        json.map(|j| {
            serde_json::from_slice::<Format>(&j).map_err(|e| {
                Error::Corrupt(format!(
                    "the volume settings in {} are not valid JuiceFS JSON: {e}",
                    self.addr
                ))
            })
        })
        .transpose()
    }

    /// Runs `f` as one write transaction, then the post-commit work.
    /// `stripe` (an inode the change centres on) picks the local lock.
    fn write<T>(&self, stripe: Ino, f: impl FnMut(&mut Tx<'_>) -> TxResult<T>) -> Result<T> {
        let fmt = match self.format.read().clone() {
            Some(f) => Some(f),
            None => self.read_format().ok().flatten(),
        };
        let (dir_stats, trash_days) = fmt.map_or((false, 0), |f| (f.dir_stats, f.trash_days));
        let (value, post) = {
            let _guard = self.stripes[(stripe % STRIPES as u64) as usize].lock();
            self.pool
                .transact(&self.env(dir_stats, trash_days), true, f)?
        };
        self.after_commit(post);
        Ok(value)
    }

    /// [`Inner::write`], also returning what `EXEC` answered for each
    /// queued write (by the position [`Tx::cmd`] returned).
    fn write_returning<T>(
        &self,
        stripe: Ino,
        f: impl FnMut(&mut Tx<'_>) -> TxResult<T>,
    ) -> Result<(T, Vec<redis::Value>)> {
        let fmt = match self.format.read().clone() {
            Some(f) => Some(f),
            None => self.read_format().ok().flatten(),
        };
        let (dir_stats, trash_days) = fmt.map_or((false, 0), |f| (f.dir_stats, f.trash_days));
        let (value, mut post) = {
            let _guard = self.stripes[(stripe % STRIPES as u64) as usize].lock();
            self.pool
                .transact(&self.env(dir_stats, trash_days), true, f)?
        };
        let results = std::mem::take(&mut post.results);
        self.after_commit(post);
        Ok((value, results))
    }

    /// What this volume's transactions work with.
    fn env(&self, dir_stats: bool, trash_days: u32) -> TxEnv<'_> {
        TxEnv {
            keys: &self.keys,
            dir_stats,
            trash_days,
            quotas: &self.quotas,
            acls: &self.acls,
            cache: self.cache(),
        }
    }

    /// Runs `f` as a series of reads (nothing watched, nothing written).
    fn read<T>(&self, f: impl FnMut(&mut Tx<'_>) -> TxResult<T>) -> Result<T> {
        Ok(self.pool.transact(&self.env(false, 0), false, f)?.0)
    }

    /// Deletes the data of removed files and the objects of released slices.
    fn after_commit(&self, post: PostCommit) {
        let deleter = self.deleter.lock().clone();
        if let Some(d) = deleter {
            d.queue_files(&post.deleted_files);
            d.queue_slices(&post.released);
            return;
        }
        for (ino, length) in post.deleted_files {
            if let Err(e) = self.delete_file_data(ino, length) {
                log::warn!(
                    "deleting the data of removed inode {ino} failed (cleanup retries): {e}"
                );
            }
        }
        self.release_slices(&post.released);
    }

    /// Hands released slices to the releaser; a slice whose objects are gone
    /// loses its `sliceRef` field, a failed one keeps it (negative) so
    /// `cleanup` (or `juicefs gc`) retries it.
    fn release_slices(&self, released: &[ReleasedSlice]) {
        if released.is_empty() {
            return;
        }
        let releaser = self.releaser.read().clone();
        let Some(releaser) = releaser else {
            return;
        };
        let key = self.keys.slice_refs();
        let mut gone = Vec::with_capacity(released.len());
        for s in released {
            if !releaser(*s) {
                log::warn!(
                    "deleting the objects of slice {} ({} bytes) failed; cleanup retries it",
                    s.id,
                    s.size
                );
                continue;
            }
            gone.push(slice_field(s.id, s.size));
        }
        // The references of every slice whose objects went, in one round
        // trip.
        for fields in gone.chunks(1024) {
            let r = self
                .pool
                .with_conn(|c| redis::cmd("HDEL").arg(&key).arg(fields).query::<()>(c));
            if let Err(e) = r {
                log::warn!(
                    "dropping the references of {} released slice(s): {e}; cleanup retries them",
                    fields.len()
                );
            }
        }
    }

    /// Reserves the next id from `range`, refilling it from counter `name`
    /// `batch` at a time. Redis counters hold the last id handed out.
    fn next_id(&self, range: &Mutex<IdRange>, name: &'static str, batch: u64) -> Result<u64> {
        let mut r = range.lock();
        loop {
            if r.next >= r.end {
                let key = self.keys.counter(name);
                let last: i64 = self
                    .pool
                    .with_conn(|c| redis::cmd("INCRBY").arg(&key).arg(batch).query(c))
                    .map_err(|e| Error::Meta(format!("reserving ids from {name}: {e}")))?;
                let last = u64::try_from(last)
                    .map_err(|_| Error::Corrupt(format!("counter {name} is negative")))?;
                r.next = (last + 1).saturating_sub(batch);
                r.end = last + 1;
            }
            let id = r.next;
            r.next += 1;
            // Inode 0 does not exist and 1 is the root; slice id 0 is a hole.
            if id > 1 || (name == counter::NEXT_SLICE && id == 1) {
                return Ok(id);
            }
        }
    }

    fn next_inode(&self) -> Result<Ino> {
        self.next_id(&self.inodes, counter::NEXT_INODE, INODE_BATCH)
    }

    fn counter_value(&self, name: &str) -> Result<i64> {
        let key = self.keys.counter(name);
        let v: Option<i64> = self
            .pool
            .with_conn(|c| redis::cmd("GET").arg(&key).query(c))?;
        Ok(v.unwrap_or(0))
    }

    /// Formats the store, or updates the settings of the same volume.
    fn init(&self, format: &Format) -> Result<()> {
        settings::check_new(format)?;
        let existing = self.read_format()?;
        let fmt = settings::to_store(existing.as_ref(), format)?;
        let json = settings::to_json(&fmt)?;
        let drop_dir_stats = settings::drops_dir_stats(existing.as_ref(), &fmt);
        let new = existing.is_none();
        self.write(ROOT_INO, |tx| {
            let setting = tx.keys.setting();
            let now_there = tx.get(&setting)?;
            if new && now_there.is_some() {
                // Another client formatted it meanwhile.
                return Err(Error::Exists.into());
            }
            if drop_dir_stats {
                // Stats kept by nobody are stale; they are rebuilt on use.
                for k in [
                    tx.keys.dir_used_inodes(),
                    tx.keys.dir_used_space(),
                    tx.keys.dir_data_length(),
                ] {
                    tx.del(&k);
                }
            }
            if fmt.trash_days > 0 && node::get(tx, TRASH_INO)?.is_none() {
                node::put(tx, TRASH_INO, &namespace::new_trash_attr(ROOT_INO));
            }
            tx.set(&setting, json.as_bytes());
            if new {
                let mut root = namespace::new_trash_attr(ROOT_INO);
                root.mode = 0o777;
                node::put(tx, ROOT_INO, &root);
            }
            Ok(())
        })?;
        *self.format.write() = Some(fmt);
        Ok(())
    }
}

impl Store for RedisMeta {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn remote(&self) -> bool {
        true
    }

    fn round_trips(&self) -> u64 {
        self.inner.pool.round_trips()
    }

    fn init(&self, format: &Format) -> Result<()> {
        self.inner.init(format)
    }

    fn load(&self) -> Result<Format> {
        let f = self.inner.read_format()?.ok_or(Error::NotFound)?;
        f.check_supported()?;
        *self.inner.format.write() = Some(f.clone());
        self.inner.reload_quotas()?;
        quota::warn_unsupported(&f);
        Ok(f)
    }

    fn new_session(&self, info: &str) -> Result<u64> {
        let sid = session::new_session(&self.inner, info)?;
        self.inner.start_cache();
        Ok(sid)
    }

    fn close_session(&self) -> Result<()> {
        session::close_session(&self.inner)
    }

    fn cleanup(&self) -> Result<()> {
        session::cleanup(&self.inner, self)
    }

    fn set_slice_releaser(&self, releaser: SliceReleaser) {
        *self.inner.releaser.write() = Some(releaser);
    }

    fn delete_in_background(&self) -> Result<()> {
        let mut d = self.inner.deleter.lock();
        if d.is_none() {
            *d = Some(Arc::new(Deleter::start(Arc::downgrade(&self.inner))?));
        }
        Ok(())
    }

    /// Also sends the records of closes not sent yet (`session::closed`):
    /// a file another host's unlink kept for this session is deleted then.
    fn drain_deletes(&self) {
        if let Err(e) = session::flush_closes(&self.inner) {
            log::warn!("recording closed files failed (tried again later): {e}");
        }
        let d = self.inner.deleter.lock().clone();
        if let Some(d) = d {
            d.drain();
        }
    }

    /// A commit is durable when Redis acknowledges it only with
    /// `appendonly yes` and `appendfsync always` (Redis then replies after
    /// its fsync); there is nothing more to do at fsync time.
    /// With `?fsync-replicas=N`: waits until N replicas hold every write
    /// so far (`WAIT`), so an fsync'ed change survives the loss of the
    /// master — a failover promotes a replica that has it. `WAIT` covers
    /// the writes of the connection it runs on; a no-op write there first
    /// (`INCRBY nextinode 0`, after every commit this process made so far
    /// was acknowledged) makes that every write of this process — on that
    /// server: when some of them went to another (the old master, still
    /// taking writes while a failover chose a new one), the sync fails
    /// (`Pool::settled`), since a failover can discard them. Fails too when
    /// fewer replicas answer within [`FSYNC_REPLICA_WAIT_MS`].
    fn sync(&self) -> Result<()> {
        let want = self.inner.fsync_replicas;
        if want == 0 {
            return Ok(());
        }
        let key = self.inner.keys.counter(counter::NEXT_INODE);
        let acked: i64 = self.inner.pool.settled(|c| {
            let (acked,): (i64,) = redis::pipe()
                .cmd("INCRBY")
                .arg(&key)
                .arg(0)
                .ignore()
                .cmd("WAIT")
                .arg(want)
                .arg(FSYNC_REPLICA_WAIT_MS)
                .query(c)?;
            Ok(acked)
        })?;
        if acked < i64::from(want) {
            return Err(Error::Meta(format!(
                "only {acked} of the {want} replicas fsync waits for (fsync-replicas) acknowledged \
                 the writes within {} s",
                FSYNC_REPLICA_WAIT_MS / 1000
            )));
        }
        Ok(())
    }

    fn durability_gap(&self) -> Option<String> {
        let get = |name: &str| -> Result<Option<String>> {
            let pair: Vec<String> = self
                .inner
                .pool
                .with_conn(|c| redis::cmd("CONFIG").arg("GET").arg(name).query(c))?;
            Ok(pair.into_iter().nth(1))
        };
        let settings = get("appendonly").and_then(|a| Ok((a, get("appendfsync")?)));
        match settings {
            Ok((appendonly, appendfsync)) => persistence_gap(
                &self.inner.addr,
                appendonly.as_deref(),
                appendfsync.as_deref(),
            ),
            Err(e) => Some(format!(
                "cannot read appendonly and appendfsync of Redis at {} ({e}); fsync'ed \
                 writes survive a power loss only if it runs with appendonly yes and \
                 appendfsync always",
                self.inner.addr
            )),
        }
    }

    fn lookup(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        namespace::lookup_name(&self.inner, ctx, parent, name)
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        let cache = self.inner.cache();
        if let Some(a) = cache.and_then(|c| c.attr(ino)) {
            return Ok(a);
        }
        let ticket = cache.and_then(|c| c.ticket());
        let a = self
            .inner
            .read(|tx| node::get(tx, ino)?.ok_or(TxError::Fs(Error::NotFound)))?;
        if let Some(c) = cache {
            c.put_attr(ticket, ino, &a);
        }
        Ok(a)
    }

    fn open(&self, ctx: &Context, ino: Ino, flags: u32) -> Result<Attr> {
        // Recorded first, in the round trip that reads the attributes, so
        // that an unlink on another host either sees this open or has
        // removed the file before the attributes are read.
        let keys = [self.inner.keys.inode(ino), self.inner.keys.space(ino)];
        let cache = self.inner.cache();
        let ticket = cache.and_then(|c| c.ticket());
        let raw = session::opened(&self.inner, ino, Some(&keys))?.unwrap_or_default();
        let (raw, space) = (raw.first().and_then(Option::as_deref), raw.get(1));
        let checked = match raw {
            None => Err(Error::NotFound),
            Some(raw) => {
                node::decode(ino, raw, space.and_then(Option::as_deref)).and_then(|attr| {
                    if let Some(c) = cache {
                        c.put_attr(ticket, ino, &attr);
                    }
                    let acl = match attr.access_acl {
                        0 => None,
                        _ => self.inner.read(|tx| node::access_rule(tx, &attr))?,
                    };
                    rules::check_open(ctx, &attr, acl.as_deref(), flags).map(|()| attr)
                })
            }
        };
        if checked.is_err()
            && let Err(e) = session::closed(&self.inner, ino)
        {
            log::warn!("forgetting a refused open of inode {ino}: {e}");
        }
        checked
    }

    fn close(&self, ino: Ino) -> Result<()> {
        session::closed(&self.inner, ino)
    }

    fn read_chunk(&self, ino: Ino, indx: u32) -> Result<Vec<Slice>> {
        chunk::read_chunk(&self.inner, ino, indx)
    }

    fn chunk_indices(
        &self,
        ino: Ino,
        range: std::ops::RangeInclusive<u32>,
        limit: usize,
    ) -> Result<Vec<u32>> {
        chunk::chunk_indices(&self.inner, ino, range, limit)
    }

    fn new_slice_id(&self) -> Result<u64> {
        self.inner
            .next_id(&self.inner.slices, counter::NEXT_SLICE, SLICE_BATCH)
    }

    fn write_chunk(&self, ino: Ino, indx: u32, slice: Slice, mtime: Timestamp) -> Result<usize> {
        chunk::write_chunk(&self.inner, ino, indx, slice, mtime)
    }

    fn write_chunks(&self, commits: &[Vec<ChunkWrite>]) -> Vec<CommitResult> {
        chunk::write_chunks(&self.inner, commits)
    }

    fn compact_chunk(&self, ino: Ino, indx: u32, old: &[Slice], new: &[Slice]) -> Result<bool> {
        chunk::compact_chunk(&self.inner, ino, indx, old, new)
    }

    fn list_chunks(&self) -> Result<Vec<(Ino, u32, Vec<Slice>)>> {
        chunk::list_chunks(&self.inner)
    }

    fn slice_referenced(&self, id: u64, size: u32) -> Result<bool> {
        chunk::slice_referenced(&self.inner, id, size)
    }

    fn orphan_space_records(&self, remove: bool) -> Result<u64> {
        chunk::orphan_space_records(&self.inner, remove)
    }

    fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        xattr::get(&self.inner, ino, name)
    }

    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        xattr::list(&self.inner, ino)
    }

    fn quotas(&self) -> &Quotas {
        &self.inner.quotas
    }

    fn reload_quotas(&self) -> Result<()> {
        self.inner.reload_quotas()
    }

    fn dir_quotas(&self) -> Result<Vec<(Ino, DirQuota)>> {
        self.inner.dir_quotas()
    }

    fn get_dir_quota(&self, ino: Ino) -> Result<Option<DirQuota>> {
        self.inner.get_dir_quota(ino)
    }

    fn set_dir_quota(&self, ino: Ino, change: &QuotaChange) -> Result<bool> {
        self.inner.set_dir_quota(ino, change)
    }

    fn delete_dir_quota(&self, ino: Ino) -> Result<()> {
        self.inner.delete_dir_quota(ino)
    }

    fn add_dir_quota_usage(&self, changes: &[(Ino, i64, i64)]) -> Result<()> {
        self.inner.add_dir_quota_usage(changes)
    }

    fn counters(&self) -> Result<crate::meta::Counters> {
        self.inner.counters()
    }

    fn restore(&self) -> Result<Box<dyn crate::meta::Restore + '_>> {
        Ok(Box::new(self.inner.restore()?))
    }

    fn dir_stat(&self, ino: Ino) -> Result<Option<crate::meta::DirStat>> {
        self.inner.dir_stat(ino)
    }

    fn set_dir_stat(&self, ino: Ino, stat: &crate::meta::DirStat) -> Result<()> {
        self.inner.set_dir_stat(ino, stat)
    }

    fn add_usage(&self, space: i64, inodes: i64) -> Result<()> {
        self.inner.add_usage(space, inodes)
    }

    fn deleted_files(&self) -> Result<Vec<Ino>> {
        self.inner.deleted_files()
    }
}

impl crate::meta::engine::Engine for RedisMeta {
    type TxError = TxError;
    type Ns<'a, 'c>
        = namespace::Ns<'a, 'c>
    where
        'c: 'a;
    type View<'a, 'c>
        = namespace::Ns<'a, 'c>
    where
        'c: 'a;

    fn write_ns<R>(
        &self,
        hint: Ino,
        mut f: impl FnMut(&mut namespace::Ns<'_, '_>) -> TxResult<R>,
    ) -> Result<R> {
        let inner = &*self.inner;
        inner.write(hint, |tx| f(&mut namespace::Ns::new(tx, inner)))
    }

    fn read_ns<R>(
        &self,
        mut f: impl FnMut(&mut namespace::Ns<'_, '_>) -> TxResult<R>,
    ) -> Result<R> {
        let inner = &*self.inner;
        inner.read(|tx| f(&mut namespace::Ns::new(tx, inner)))
    }

    fn next_inode(&self) -> Result<Ino> {
        self.inner.format()?;
        self.inner.next_inode()
    }

    /// A create's open is recorded in `open{ino}` with the node, as
    /// `session::opened` records later opens; the metadata cache learns
    /// the new node has no extended attributes.
    fn make_node(
        &self,
        parent: Ino,
        ino: Ino,
        open: bool,
        mut make: impl FnMut(&mut namespace::Ns<'_, '_>) -> TxResult<Attr>,
    ) -> Result<Attr> {
        let inner = &*self.inner;
        let sid = inner.sid.load(Ordering::Relaxed);
        let ticket = inner.cache().and_then(|c| c.ticket());
        let attr = inner.write(parent, |tx| {
            let attr = make(&mut namespace::Ns::new(tx, inner))?;
            if open && sid > 0 {
                let key = tx.keys.opened(ino);
                tx.hset(&key, sid.to_string().as_bytes(), b"1");
            }
            Ok(attr)
        })?;
        if let Some(c) = inner.cache() {
            c.put_no_xattrs(ticket, ino);
        }
        if open {
            session::created_open(inner, ino);
        }
        Ok(attr)
    }

    fn format(&self) -> Result<Format> {
        self.inner.format()
    }

    fn fallocate_chunks(
        &self,
        f: &crate::meta::chunks::Fallocate<'_>,
        ino: Ino,
    ) -> Result<Vec<u32>> {
        chunk::fallocate_chunks(&self.inner, f, ino)
    }

    fn work_counters(&self) -> &crate::meta::WorkCounters {
        &self.inner.work
    }

    fn usage(&self) -> Result<(i64, i64)> {
        let used = self.inner.counter_value(counter::USED_SPACE)?;
        let inodes = self.inner.counter_value(counter::TOTAL_INODES)?;
        Ok((used, inodes))
    }

    fn trash_hour(&self) -> &Mutex<Option<(String, Ino)>> {
        &self.inner.trash_dir
    }
}
