//! The embedded metadata engine: SQLite (bundled, WAL mode) on JuiceFS 1.4's
//! SQL schema, so `juicefs` mounts what sluice writes and sluice serves what
//! `juicefs` wrote.
//!
//! Every `Meta` or `Store` method is one SQLite transaction: writes take the
//! single writer connection and begin `IMMEDIATE` (SQLite has one writer at
//! a time; taking the lock up front avoids the deadlock-then-retry dance),
//! reads use a small pool of reader connections that WAL lets run beside a
//! writer.
//! `SQLITE_BUSY` (another process, e.g. a `juicefs` client, holding the lock
//! past the busy timeout) restarts the transaction, as JuiceFS does.
//!
//! Work that must follow a commit — deleting the objects of slices that lost
//! their last reference, deleting the data of removed files — is collected in
//! the transaction and run after it commits, so no object disappears for a
//! change that rolled back.

mod check;
mod chunk;
mod dir_quota;
pub(crate) mod namespace;
pub(crate) mod node;
mod restore;
mod schema;
pub(crate) mod session;
#[cfg(test)]
mod tests;
pub(crate) mod volume;
mod xattr;

use std::cell::RefCell;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior, params};

use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::rules::{self};
use crate::meta::{
    Attr, ChunkWrite, CommitResult, Context, DirQuota, Ino, QuotaChange, Quotas, ReleasedSlice,
    Slice, SliceReleaser, Store, Timestamp, quota,
};

use super::deleter::{Deleter, Deletes};
use schema::counter;

/// How many inode numbers one counter increment reserves (JuiceFS `inodeBatch`).
const INODE_BATCH: i64 = 1024;
/// How many slice ids one counter increment reserves (JuiceFS `sliceIdBatch`).
const SLICE_BATCH: i64 = 4096;
/// How many reader connections run beside the writer.
const READERS: usize = 4;
/// How long SQLite waits on a lock held by another connection or process
/// (JuiceFS's `_timeout=5000`).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// When a commit reaches the disk (SQLite `PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// WAL is synced at checkpoints only: a committed change survives a
    /// process crash but may be lost with the machine. JuiceFS's default (the
    /// Go driver's `_sync=NORMAL`).
    #[default]
    Normal,
    /// Every commit is synced: changes survive power loss too, at a cost of
    /// one fsync per metadata change.
    Full,
}

/// How the SQLite database is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Commit durability.
    pub synchronous: Synchronous,
    /// How long to wait for a lock another process holds.
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::default(),
            busy_timeout: BUSY_TIMEOUT,
        }
    }
}
/// How often a transaction is restarted after `SQLITE_BUSY` before giving up.
const MAX_TRIES: u32 = 50;

/// An error inside a transaction: a file-system answer, or a SQLite failure
/// (which may only mean "busy, try again").
#[derive(Debug)]
pub(crate) enum TxError {
    Fs(Error),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        TxError::Sql(e)
    }
}

impl From<Error> for TxError {
    fn from(e: Error) -> Self {
        TxError::Fs(e)
    }
}

pub(crate) type TxResult<T> = std::result::Result<T, TxError>;

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked)
    )
}

fn sql_error(e: rusqlite::Error) -> Error {
    Error::Meta(format!("SQLite: {e}"))
}

/// Work to do once a transaction has committed.
#[derive(Debug, Default)]
struct PostCommit {
    /// Slices whose reference count reached zero: delete their objects.
    released: Vec<ReleasedSlice>,
    /// Files removed for good (a `jfs_delfile` row each): delete their chunks.
    deleted_files: Vec<Ino>,
}

/// A write transaction with what the volume settings say about it.
struct Tx<'c> {
    tx: rusqlite::Transaction<'c>,
    post: PostCommit,
    /// Whether `jfs_dir_stats` is maintained (`DirStats`).
    dir_stats: bool,
    /// Days deleted files stay in the trash (0 = no trash).
    trash_days: u32,
    /// The limits changes are checked against.
    quotas: &'c Quotas,
    /// Whether growth below a quota directory is checked (a rename checks
    /// before its transaction, by JuiceFS's rule, and turns this off).
    check_quota: bool,
    /// What this transaction adds to the usage the quotas count.
    usage: RefCell<quota::UsageDelta>,
}

impl Deref for Tx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.tx
    }
}

/// A range of ids reserved from a counter, handed out one at a time.
#[derive(Debug, Default, Clone, Copy)]
struct IdRange {
    next: u64,
    end: u64,
}

/// The SQLite metadata engine. Cheap to share: all state is behind an `Arc`.
pub struct SqliteMeta {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    format: RwLock<Option<Format>>,
    inodes: Mutex<IdRange>,
    slices: Mutex<IdRange>,
    sid: AtomicU64,
    /// Files this client holds open; one unlinked while open is kept in
    /// `jfs_sustained` until the last close.
    open_files: Mutex<super::open_files::OpenFiles>,
    releaser: RwLock<Option<SliceReleaser>>,
    /// Deletes removed files' data and released slices' objects in the
    /// background, once asked to ([`Store::delete_in_background`]).
    deleter: Mutex<Option<Arc<Deleter>>>,
    heartbeat: Mutex<Option<crate::meta::session::Heartbeat>>,
    /// The hourly trash directory in use: (name, inode).
    trash_dir: Mutex<Option<(String, Ino)>>,
    /// Whether a commit can be lost to a power loss until [`Store::sync`]
    /// syncs the WAL (WAL mode with `synchronous=NORMAL`).
    lazy_commits: bool,
    /// Write transactions committed by this client so far, plus one for
    /// what the WAL held when it was opened (a process killed before may
    /// have left commits in the page cache only), so the first sync always
    /// runs.
    commits: AtomicU64,
    /// How many of them the last WAL sync covered; held while one runs, so
    /// concurrent `sync` calls wait for it and share the next.
    synced: Mutex<u64>,
    /// What range operations visited (`Meta::work`).
    work: crate::meta::WorkCounters,
    /// Capacity, inode limit and directory quotas, with their usage.
    quotas: Quotas,
}

impl std::fmt::Debug for SqliteMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteMeta")
            .field("path", &self.inner.path)
            .field("sid", &self.inner.sid.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Mode of a database file sluice creates: the volume's settings hold the
/// object store's secret key, sealed with the volume's UUID from the same
/// database, so whoever reads the file has the key.
const DB_MODE: u32 = 0o600;

/// Creates the database file with [`DB_MODE`] before SQLite opens it, so
/// that neither a permissive umask nor SQLite's default (0644) applies;
/// SQLite gives the `-wal` and `-shm` files the mode of the database file.
/// An existing file keeps its mode (it is the owner's choice, and a
/// database JuiceFS made is 0644): one that others may read or write gets
/// a warning naming the fix.
fn create_private(path: &Path) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(DB_MODE)
        .open(path);
    match created {
        // umask can only have removed bits; set exactly ours on our new file.
        Ok(file) => file
            .set_permissions(std::fs::Permissions::from_mode(DB_MODE))
            .map_err(|e| {
                Error::Meta(format!(
                    "cannot set the mode of the new SQLite database {}: {e}",
                    path.display()
                ))
            }),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if let Ok(md) = std::fs::metadata(path)
                && md.permissions().mode() & 0o006 != 0
            {
                log::warn!(
                    "SQLite database {} is {:o}: other users can read (or change) the \
                     volume, its object-store keys included; `chmod 600 {}` (and its -wal \
                     and -shm files) unless that is intended",
                    path.display(),
                    md.permissions().mode() & 0o777,
                    path.display()
                );
            }
            Ok(())
        }
        Err(e) => Err(Error::Meta(format!(
            "cannot create SQLite database {}: {e}",
            path.display()
        ))),
    }
}

/// Opens one connection in WAL mode with the options' settings; the flag
/// says whether WAL mode is on (a file system without shared memory keeps
/// the rollback journal).
/// Prepared statements each connection keeps.
const STATEMENT_CACHE: usize = 128;

fn open_connection(path: &Path, opts: &SqliteOptions) -> Result<(Connection, bool)> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| {
        Error::Meta(format!(
            "cannot open SQLite database {}: {e}",
            path.display()
        ))
    })?;
    conn.busy_timeout(opts.busy_timeout).map_err(sql_error)?;
    // Every statement the engine prepares stays prepared: they outnumber
    // rusqlite's default of 16 (the space record's two made them), and
    // one pushed out of the cache is prepared again at its next use.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(sql_error)?;
    let sync = match opts.synchronous {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    };
    // Temporary tables and sorts stay in memory: a sandboxed `sluice serve`
    // may create files only beside the database, not in /var/tmp.
    conn.execute_batch(&format!(
        "PRAGMA synchronous={sync}; PRAGMA temp_store=MEMORY"
    ))
    .map_err(sql_error)?;
    let wal = mode.eq_ignore_ascii_case("wal");
    if !wal {
        log::warn!(
            "SQLite database {} stays in journal mode {mode}; WAL is not available there",
            path.display()
        );
    }
    Ok((conn, wal))
}

/// fsyncs the WAL of `conn` (the caller holds the connection, so nothing
/// else uses it meanwhile) through SQLite's own open file: SQLite's VFS
/// syncs it as a commit with `synchronous=FULL` would (the directory too,
/// the first time), and the long-lived descriptor sees every write error
/// the kernel reported on the file since SQLite opened it. Nothing to do
/// when no WAL is open yet (nothing committed through this connection).
fn sync_wal(conn: &Connection, path: &Path) -> Result<()> {
    use rusqlite::ffi;
    let failed = |what: &str, rc: std::ffi::c_int| {
        Error::Meta(format!(
            "cannot sync the SQLite WAL of {}: {what} failed ({})",
            path.display(),
            rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None)
        ))
    };
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: `conn.handle()` is the open database handle of `conn`, used by
    // no other thread during this call (the caller holds `conn`
    // exclusively). SQLITE_FCNTL_JOURNAL_POINTER stores one
    // `sqlite3_file *` (the WAL in WAL mode) through the argument, which
    // points to `file`, a local of exactly that type. "main" is a
    // NUL-terminated schema name.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
            (&raw mut file).cast(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(failed("SQLITE_FCNTL_JOURNAL_POINTER", rc));
    }
    if file.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null pointer from SQLITE_FCNTL_JOURNAL_POINTER is the
    // pager's file object, which lives as long as the connection; its
    // `pMethods` is null while the file is not open.
    let methods = unsafe { (*file).pMethods };
    if methods.is_null() {
        return Ok(());
    }
    // SAFETY: `methods` is the open file's method table (non-null, static
    // in SQLite's unix VFS).
    let Some(x_sync) = (unsafe { (*methods).xSync }) else {
        return Ok(());
    };
    // SAFETY: xSync is called on the open file object it belongs to, with
    // a valid flag, while no other thread uses the connection.
    let rc = unsafe { x_sync(file, ffi::SQLITE_SYNC_NORMAL) };
    if rc != ffi::SQLITE_OK {
        return Err(failed("fsync", rc));
    }
    Ok(())
}

impl SqliteMeta {
    /// Opens (creating if needed) the SQLite database at `path`. The volume
    /// itself is created by [`Store::init`]; [`Store::load`] reads it.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteMeta> {
        SqliteMeta::open_with(path, SqliteOptions::default())
    }

    /// Opens the database with explicit options.
    pub fn open_with(path: impl AsRef<Path>, opts: SqliteOptions) -> Result<SqliteMeta> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(Error::Invalid(format!(
                "the directory {} of the SQLite database does not exist",
                dir.display()
            )));
        }
        create_private(&path)?;
        let (writer, wal) = open_connection(&path, &opts)?;
        let readers = (0..READERS)
            .map(|_| open_connection(&path, &opts).map(|(c, _)| Mutex::new(c)))
            .collect::<Result<Vec<_>>>()?;
        Ok(SqliteMeta {
            inner: Arc::new(Inner {
                path,
                writer: Mutex::new(writer),
                readers,
                next_reader: AtomicUsize::new(0),
                format: RwLock::new(None),
                inodes: Mutex::new(IdRange::default()),
                slices: Mutex::new(IdRange::default()),
                sid: AtomicU64::new(0),
                open_files: Mutex::default(),
                releaser: RwLock::new(None),
                deleter: Mutex::new(None),
                heartbeat: Mutex::new(None),
                trash_dir: Mutex::new(None),
                lazy_commits: wal && opts.synchronous == Synchronous::Normal,
                commits: AtomicU64::new(1),
                synced: Mutex::new(0),
                work: Default::default(),
                quotas: Quotas::default(),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// This client's session id (0 before `new_session`).
    pub fn session_id(&self) -> u64 {
        self.inner.sid.load(Ordering::Relaxed)
    }
}

impl Deletes for Inner {
    fn delete_file_data(&self, ino: Ino, _length: u64) -> Result<()> {
        Inner::delete_file_data(self, ino)
    }

    fn release_slices(&self, released: &[ReleasedSlice]) {
        Inner::release_slices(self, released);
    }
}

impl Drop for SqliteMeta {
    fn drop(&mut self) {
        self.inner.stop_heartbeat();
    }
}

impl Inner {
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
        let json: Option<String> = self.read(|c| {
            let exists: bool = c.query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type='table' AND name='jfs_setting'",
                [],
                |r| r.get(0),
            )?;
            if !exists {
                return Ok(None);
            }
            Ok(c.query_row(
                "SELECT value FROM jfs_setting WHERE name='format'",
                [],
                |r| r.get(0),
            )
            .optional()?)
        })?;
        json.map(|j| {
            serde_json::from_str::<Format>(&j).map_err(|e| {
                Error::Corrupt(format!(
                    "the volume settings in {} are not valid JuiceFS JSON: {e}",
                    self.path.display()
                ))
            })
        })
        .transpose()
    }

    /// Runs `f` in one write transaction (`BEGIN IMMEDIATE`), restarting it
    /// while SQLite reports the database busy, then does the post-commit work.
    fn write<T>(&self, mut f: impl FnMut(&mut Tx<'_>) -> TxResult<T>) -> Result<T> {
        let cached = self.format.read().clone();
        // Before `load`, the settings come from the store if it has any yet.
        let fmt = match cached {
            Some(f) => Some(f),
            None => self.read_format().ok().flatten(),
        };
        let (dir_stats, trash_days) = fmt.map_or((false, 0), |f| (f.dir_stats, f.trash_days));
        let mut tries = 0;
        let started = std::time::Instant::now();
        loop {
            let attempt = {
                let mut conn = self.writer.lock();
                let mut run = |conn: &mut Connection| -> TxResult<(T, PostCommit)> {
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let mut tx = Tx {
                        tx,
                        post: PostCommit::default(),
                        dir_stats,
                        trash_days,
                        quotas: &self.quotas,
                        check_quota: true,
                        usage: RefCell::default(),
                    };
                    let value = f(&mut tx)?;
                    let post = std::mem::take(&mut tx.post);
                    let usage = tx.usage.take();
                    for (dir, space, inodes) in usage.dir_changes() {
                        tx.prepare_cached(
                            "UPDATE jfs_dir_quota SET used_space=used_space+?, \
                             used_inodes=used_inodes+? WHERE inode=?",
                        )?
                        .execute(params![space, inodes, dir as i64])?;
                    }
                    tx.tx.commit()?;
                    self.commits.fetch_add(1, Ordering::AcqRel);
                    // Still holding the writer: the next transaction checks
                    // against a copy that includes this one.
                    self.quotas.apply(&usage);
                    Ok((value, post))
                };
                run(&mut conn)
            };
            match attempt {
                Ok((value, post)) => {
                    crate::metrics::TRANSACTIONS.record(started);
                    self.after_commit(post);
                    return Ok(value);
                }
                Err(TxError::Sql(e)) if is_busy(&e) && tries < MAX_TRIES => {
                    tries += 1;
                    crate::metrics::TRANSACTIONS.restarted();
                    log::debug!("SQLite busy, restarting transaction (try {tries}): {e}");
                    std::thread::sleep(Duration::from_millis(u64::from(tries * tries)));
                }
                Err(TxError::Sql(e)) => return Err(sql_error(e)),
                Err(TxError::Fs(e)) => return Err(e),
            }
        }
    }

    /// Runs `f` in one read transaction on a reader connection.
    fn read<T>(&self, mut f: impl FnMut(&Connection) -> TxResult<T>) -> Result<T> {
        let start = self.next_reader.fetch_add(1, Ordering::Relaxed);
        let n = self.readers.len();
        let mut guard = None;
        for i in 0..n {
            if let Some(g) = self.readers[(start + i) % n].try_lock() {
                guard = Some(g);
                break;
            }
        }
        let conn = match guard {
            Some(g) => g,
            None => self.readers[start % n].lock(),
        };
        let mut tries = 0;
        loop {
            let attempt = (|| -> TxResult<T> {
                let tx =
                    rusqlite::Transaction::new_unchecked(&conn, TransactionBehavior::Deferred)?;
                let v = f(&tx)?;
                tx.finish()?;
                Ok(v)
            })();
            match attempt {
                Ok(v) => return Ok(v),
                Err(TxError::Sql(e)) if is_busy(&e) && tries < MAX_TRIES => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(u64::from(tries * tries)));
                }
                Err(TxError::Sql(e)) => return Err(sql_error(e)),
                Err(TxError::Fs(e)) => return Err(e),
            }
        }
    }

    /// Deletes the data of removed files and the objects of released slices
    /// (or queues them for the background deleter).
    fn after_commit(&self, post: PostCommit) {
        let deleter = self.deleter.lock().clone();
        if let Some(d) = deleter {
            let files: Vec<(Ino, u64)> = post.deleted_files.iter().map(|i| (*i, 0)).collect();
            d.queue_files(&files);
            d.queue_slices(&post.released);
            return;
        }
        for ino in post.deleted_files {
            if let Err(e) = self.delete_file_data(ino) {
                log::warn!(
                    "deleting the data of removed inode {ino} failed (cleanup retries): {e}"
                );
            }
        }
        self.release_slices(&post.released);
    }

    /// Makes every commit so far durable: fsyncs the WAL, once for all the
    /// callers that arrive while a sync runs (group commit).
    fn sync(&self) -> Result<()> {
        if !self.lazy_commits {
            return Ok(());
        }
        let wanted = self.commits.load(Ordering::Acquire);
        let mut synced = self.synced.lock();
        if *synced >= wanted {
            return Ok(());
        }
        // No commit runs while the writer connection is held, so the sync
        // covers exactly the commits counted now.
        let conn = self.writer.lock();
        let covers = self.commits.load(Ordering::Acquire);
        sync_wal(&conn, &self.path)?;
        drop(conn);
        *synced = covers;
        Ok(())
    }

    /// Hands released slices to the releaser once the commits that released
    /// them are durable; a slice whose objects are gone loses its
    /// `jfs_chunk_ref` row, a failed one keeps it (refs 0) so `cleanup` (or
    /// `juicefs gc`) retries it.
    fn release_slices(&self, released: &[ReleasedSlice]) {
        if released.is_empty() {
            return;
        }
        let releaser = self.releaser.read().clone();
        let Some(releaser) = releaser else {
            return;
        };
        // An object deleted before the change that released it is durable
        // would be named again by the metadata a power loss rolls back to.
        if let Err(e) = self.sync() {
            log::warn!(
                "not deleting the objects of {} released slice(s) for now: {e}; cleanup retries them",
                released.len()
            );
            return;
        }
        let mut gone = Vec::with_capacity(released.len());
        for s in released {
            if releaser(*s) {
                gone.push(s.id);
            } else {
                log::warn!(
                    "deleting the objects of slice {} ({} bytes) failed; cleanup retries it",
                    s.id,
                    s.size
                );
            }
        }
        if gone.is_empty() {
            return;
        }
        // One transaction for the rows of every slice whose objects went.
        let r = self.write(|tx| {
            let mut stmt =
                tx.prepare_cached("DELETE FROM jfs_chunk_ref WHERE chunkid=? AND refs<=0")?;
            for id in &gone {
                stmt.execute(params![*id as i64])?;
            }
            Ok(())
        });
        if let Err(e) = r {
            log::warn!(
                "dropping the reference rows of {} released slice(s): {e}",
                gone.len()
            );
        }
    }

    /// Reserves the next id from `range`, refilling it from counter `name`
    /// `batch` at a time. Never called inside a write transaction.
    fn next_id(&self, range: &Mutex<IdRange>, name: &'static str, batch: i64) -> Result<u64> {
        let mut r = range.lock();
        loop {
            if r.next >= r.end {
                let v = self.write(|tx| incr_counter(tx, name, batch))?;
                let end = u64::try_from(v)
                    .map_err(|_| Error::Corrupt(format!("counter {name} is negative")))?;
                r.next = end.saturating_sub(batch as u64);
                r.end = end;
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
}

/// Adds `delta` to counter `name` (creating it at `delta`) and returns the
/// new value.
fn incr_counter(c: &Connection, name: &str, delta: i64) -> TxResult<i64> {
    let cur: Option<i64> = c
        .prepare_cached("SELECT value FROM jfs_counter WHERE name=?")?
        .query_row(params![name], |r| r.get(0))
        .optional()?;
    let v = cur.unwrap_or(0) + delta;
    if cur.is_some() {
        c.prepare_cached("UPDATE jfs_counter SET value=? WHERE name=?")?
            .execute(params![v, name])?;
    } else {
        c.execute(
            "INSERT INTO jfs_counter (name, value) VALUES (?, ?)",
            params![name, v],
        )?;
    }
    Ok(v)
}

/// Reads counter `name` (0 when missing).
fn get_counter(c: &Connection, name: &str) -> TxResult<i64> {
    Ok(c.query_row(
        "SELECT value FROM jfs_counter WHERE name=?",
        params![name],
        |r| r.get(0),
    )
    .optional()?
    .unwrap_or(0))
}

impl Store for SqliteMeta {
    fn name(&self) -> &'static str {
        "sqlite3"
    }

    fn init(&self, format: &Format) -> Result<()> {
        self.inner.init(format)
    }

    fn load(&self) -> Result<Format> {
        let f = self.inner.read_format()?.ok_or(Error::NotFound)?;
        f.check_supported()?;
        // sluice's own table, which a volume JuiceFS formatted lacks.
        self.inner.write(|tx| {
            tx.execute_batch(schema::CREATE_SPACE)?;
            Ok(())
        })?;
        *self.inner.format.write() = Some(f.clone());
        self.inner.reload_quotas()?;
        quota::warn_unsupported(&f);
        Ok(f)
    }

    fn new_session(&self, info: &str) -> Result<u64> {
        session::new_session(&self.inner, info)
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

    fn drain_deletes(&self) {
        let d = self.inner.deleter.lock().clone();
        if let Some(d) = d {
            d.drain();
        }
    }

    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }

    fn lookup(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        namespace::lookup(&self.inner, ctx, parent, name)
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.inner
            .read(|c| node::get(c, ino)?.ok_or(TxError::Fs(Error::NotFound)))
    }

    fn open(&self, ctx: &Context, ino: Ino, flags: u32) -> Result<Attr> {
        let attr = self.inner.read(|c| {
            let attr = node::must_get(c, ino)?;
            let acl = node::access_rule(c, &attr)?;
            rules::check_open(ctx, &attr, acl.as_deref(), flags)?;
            Ok(attr)
        })?;
        session::opened(&self.inner, ino);
        Ok(attr)
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
        const ORPHANS: &str = "FROM sluice_space WHERE inode NOT IN (SELECT inode FROM jfs_node)";
        self.inner.write(|tx| {
            let n: i64 = tx.query_row(&format!("SELECT count(*) {ORPHANS}"), [], |r| r.get(0))?;
            if remove && n > 0 {
                tx.execute(&format!("DELETE {ORPHANS}"), [])?;
            }
            Ok(n as u64)
        })
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

impl crate::meta::engine::Engine for SqliteMeta {
    type TxError = TxError;
    type Ns<'a, 'c>
        = namespace::Ns<'a, 'c>
    where
        'c: 'a;
    type View<'a, 'c>
        = namespace::View<'a>
    where
        'c: 'a;

    fn write_ns<R>(
        &self,
        _hint: Ino,
        mut f: impl FnMut(&mut namespace::Ns<'_, '_>) -> TxResult<R>,
    ) -> Result<R> {
        let inner = &*self.inner;
        inner.write(|tx| f(&mut namespace::Ns::new(tx, inner)))
    }

    fn read_ns<R>(&self, mut f: impl FnMut(&mut namespace::View<'_>) -> TxResult<R>) -> Result<R> {
        self.inner.read(|c| f(&mut namespace::View(c)))
    }

    fn next_inode(&self) -> Result<Ino> {
        self.inner.format()?;
        self.inner.next_inode()
    }

    /// A create's open is recorded after the commit, in this client's
    /// table of open files.
    fn make_node(
        &self,
        _parent: Ino,
        ino: Ino,
        open: bool,
        mut make: impl FnMut(&mut namespace::Ns<'_, '_>) -> TxResult<Attr>,
    ) -> Result<Attr> {
        let inner = &*self.inner;
        let attr = inner.write(|tx| make(&mut namespace::Ns::new(tx, inner)))?;
        if open {
            session::opened(inner, ino);
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
        self.inner.read(|c| {
            Ok((
                get_counter(c, counter::USED_SPACE)?,
                get_counter(c, counter::TOTAL_INODES)?,
            ))
        })
    }

    fn trash_hour(&self) -> &Mutex<Option<(String, Ino)>> {
        &self.inner.trash_dir
    }

    fn check_xattr_name(&self, name: &[u8]) -> Result<()> {
        xattr::text_name(name).map(|_| ())
    }
}
