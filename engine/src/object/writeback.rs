//! `WritebackStore`: `--writeback`. Block objects are staged on local disk
//! and uploaded to the volume's real store in the background.
//!
//! The store wraps the volume's object store, so the writer, the reader,
//! compaction and the slice releaser use it unchanged:
//!
//! - `put` writes the object to `DIR/<volume uuid>/rawstaging/<object key>`
//!   (the folder JuiceFS names `rawstaging`) through a temporary file that
//!   is fsync'ed, renamed into place, and whose directory is fsync'ed,
//!   *before* `put` returns. The writer commits a slice to the metadata only
//!   after its puts return, so metadata never names a block that a power
//!   loss could take away. The CRC32C sits in the file's xattr, as in the
//!   `file` store, so the uploaded object is the staged bytes exactly. (The
//!   full key, volume name included, is kept under `rawstaging`: a JuiceFS
//!   client pointed at the same directory would not take our compressed
//!   blocks for its raw ones, which it stages as `rawstaging/chunks/...`.)
//! - Background uploaders (`max_uploads` threads) wait `upload_delay`, copy
//!   the staged file to the real store, make it durable there, and only then
//!   remove the staged file. A failed upload is retried with backoff, for
//!   ever: a staged block is never dropped, since metadata already names it.
//! - Reads look in staging first, then in the real store: a committed slice
//!   whose blocks are not uploaded yet reads back from local disk.
//! - `delete` (a released or compacted slice) removes the staged file, which
//!   cancels its upload, and deletes the object from the real store.
//! - At open, every block found in staging (a crash, a kill, an unmount that
//!   could not finish uploading) is queued for upload at once.
//!
//! The backlog is counted ([`WritebackStats`]), logged every
//! [`LOG_EVERY`] while it is not empty, and written once a second (while it
//! changes) to `DIR/<uuid>/status` for `sluice status`. One process at a
//! time stages in a volume directory (`DIR/<uuid>/lock`).
//!
//! Locking: a staged file is created (renamed into place) and removed only
//! under the state lock, and each put gets a new generation number, so an
//! uploader that finishes never removes a newer version of the same key and
//! a delete never races a half-done put of the same key.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use super::{FileStore, ObjectInfo, ObjectStore, is_not_found};
use crate::backoff::Backoff;
use crate::error::{Error, Result};

/// The staging folder under a volume's directory (JuiceFS's name).
pub const STAGING_DIR: &str = "rawstaging";
/// The status file under a volume's directory.
pub const STATUS_FILE: &str = "status";
/// The lock file under a volume's directory, held by the process staging.
pub const LOCK_FILE: &str = "lock";
/// How often a non-empty backlog is logged.
pub const LOG_EVERY: Duration = Duration::from_secs(30);
/// How often the status file is rewritten while the counters change.
const STATUS_EVERY: Duration = Duration::from_secs(1);
/// How often it is rewritten when nothing changes.
const STATUS_REFRESH: Duration = Duration::from_secs(10);
/// The first retry of a failed upload waits this long, doubling up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How a [`WritebackStore`] stages and uploads.
#[derive(Debug, Clone)]
pub struct WritebackOptions {
    /// The volume's local directory, `CACHE_DIR/<volume uuid>`; blocks are
    /// staged in its `rawstaging` folder.
    pub dir: PathBuf,
    /// How long a staged block waits before its upload starts. A block
    /// deleted meanwhile (a temporary file) is never uploaded.
    pub upload_delay: Duration,
    /// Uploads running at once.
    pub max_uploads: usize,
}

/// The staging backlog and upload counters, for logs, `sluice status` and
/// a metrics endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritebackStats {
    /// Blocks staged and not uploaded yet (uploads in flight included).
    pub pending_blocks: u64,
    /// Bytes of those blocks.
    pub pending_bytes: u64,
    /// Uploads in flight now.
    pub uploading: u64,
    /// Blocks found in staging at start (left by an earlier run).
    pub recovered_blocks: u64,
    /// Blocks uploaded since start.
    pub uploaded_blocks: u64,
    /// Bytes uploaded since start.
    pub uploaded_bytes: u64,
    /// Failed upload attempts since start (each is retried).
    pub failures: u64,
    /// The last upload failure, if any.
    pub last_error: Option<String>,
    /// Blocks written into staging since start.
    #[serde(default)]
    pub staged_blocks: u64,
    /// Bytes of those blocks.
    #[serde(default)]
    pub staged_bytes: u64,
    /// Blocks being written into staging now.
    #[serde(default)]
    pub staging_now: u64,
    /// Blocks that could not be staged (uploaded at once instead).
    #[serde(default)]
    pub stage_errors: u64,
    /// The time blocks waited in staging before their upload started,
    /// summed over every upload started (nanoseconds).
    #[serde(default)]
    pub staged_wait_nanos: u64,
}

/// What the running store writes to `DIR/<uuid>/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritebackStatus {
    /// The process that wrote it.
    pub pid: u32,
    /// When it was written (seconds since the Unix epoch).
    pub updated_unix: u64,
    /// The staging folder.
    pub staging: String,
    /// Where blocks are uploaded to.
    pub bucket: String,
    /// The counters at that time.
    #[serde(flatten)]
    pub stats: WritebackStats,
}

/// One staged version of an object.
#[derive(Debug, Clone, Copy)]
struct Staged {
    generation: u64,
    size: u64,
    /// When it was staged.
    at: Instant,
}

/// An upload to run once `ready`.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Job {
    ready: Instant,
    generation: u64,
    key: String,
    attempts: u32,
}

#[derive(Debug, Default)]
struct State {
    /// Every staged object not uploaded yet.
    staged: HashMap<String, Staged>,
    /// Uploads by readiness (stale jobs, whose generation is no longer
    /// staged, are skipped when popped).
    queue: BinaryHeap<Reverse<Job>>,
    next_generation: u64,
    /// Whether uploads start at once, whatever the delay (while draining).
    expedite: bool,
    stop: bool,
    stats: WritebackStats,
}

impl State {
    fn unstage(&mut self, key: &str) -> Option<Staged> {
        let s = self.staged.remove(key)?;
        self.stats.pending_blocks -= 1;
        self.stats.pending_bytes -= s.size;
        Some(s)
    }
}

#[derive(Debug)]
struct Shared {
    inner: Arc<dyn ObjectStore>,
    staging: FileStore,
    status_path: PathBuf,
    delay: Duration,
    state: Mutex<State>,
    /// Wakes uploaders: a job was queued, or stop.
    work: Condvar,
    /// Wakes drainers and the reporter: an upload ended, or stop.
    progress: Condvar,
}

/// An object store that stages puts on local disk and uploads them to
/// `inner` in the background. See the module documentation.
#[derive(Debug)]
pub struct WritebackStore {
    shared: Arc<Shared>,
    /// Set once a put went straight to `inner` (staging failed): from then
    /// on `sync_all` syncs `inner` too (a flag that is never cleared cannot
    /// let a caller skip a sync another caller has started but not ended).
    direct_puts: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The volume directory's lock, held while this store lives.
    _lock: fs::File,
}

/// Takes the exclusive lock of a volume directory. Two processes staging
/// in one folder would upload (and remove) each other's blocks and
/// overwrite each other's status; the kernel drops the lock when its
/// holder dies, so a crashed run never blocks the next one.
fn lock_volume_dir(dir: &Path) -> Result<fs::File> {
    use std::os::unix::io::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::Object {
            key: path.to_string_lossy().into_owned(),
            source: e,
        })?;
    // SAFETY: flock(2) on a descriptor we own for the call's duration; no
    // memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(Error::Invalid(format!(
                "another sluice process stages blocks of this volume in {}; give each process its own cache directory",
                dir.display()
            )));
        }
        return Err(Error::Object {
            key: path.to_string_lossy().into_owned(),
            source: e,
        });
    }
    Ok(file)
}

/// The wait before an upload's retry.
const BACKOFF: Backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Removes the temporary files (`.NAME.tmpN`) of puts a crash interrupted.
fn remove_temporaries(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for ent in fs::read_dir(&d)? {
            let ent = ent?;
            let ft = ent.file_type()?;
            if ft.is_dir() {
                stack.push(ent.path());
            } else if ent.file_name().as_encoded_bytes().starts_with(b".") {
                fs::remove_file(ent.path())?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

impl WritebackStore {
    /// Opens the staging area under `opts.dir` (created if missing), queues
    /// every block a previous run left there, and starts the uploaders.
    pub fn open(inner: Arc<dyn ObjectStore>, opts: &WritebackOptions) -> Result<WritebackStore> {
        let staging_dir = opts.dir.join(STAGING_DIR);
        let staging = FileStore::durable(&staging_dir)?;
        let lock = lock_volume_dir(&opts.dir)?;
        let dir_err = |e: io::Error| Error::Object {
            key: staging_dir.to_string_lossy().into_owned(),
            source: e,
        };
        let temporaries = remove_temporaries(&staging_dir).map_err(dir_err)?;
        if temporaries > 0 {
            log::info!(
                "writeback: removed {temporaries} half-written staging files of an interrupted run"
            );
        }
        let found = staging.list("")?;
        let mut state = State::default();
        let now = Instant::now();
        for obj in found {
            let generation = state.next_generation;
            state.next_generation += 1;
            state.stats.pending_blocks += 1;
            state.stats.pending_bytes += obj.size;
            state.staged.insert(
                obj.key.clone(),
                Staged {
                    generation,
                    size: obj.size,
                    // Its wait counts from this start.
                    at: now,
                },
            );
            // Found blocks waited long enough: upload them now.
            state.queue.push(Reverse(Job {
                ready: now,
                generation,
                key: obj.key,
                attempts: 0,
            }));
        }
        state.stats.recovered_blocks = state.stats.pending_blocks;
        if state.stats.recovered_blocks > 0 {
            log::info!(
                "writeback: found {} staged blocks ({} bytes) from a previous run in {}; uploading them to {}",
                state.stats.recovered_blocks,
                state.stats.pending_bytes,
                staging_dir.display(),
                inner.describe()
            );
        }
        let shared = Arc::new(Shared {
            inner,
            staging,
            status_path: opts.dir.join(STATUS_FILE),
            delay: opts.upload_delay,
            state: Mutex::new(state),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        // The first status write also proves the directory is writable.
        shared.write_status().map_err(|e| Error::Object {
            key: shared.status_path.to_string_lossy().into_owned(),
            source: e,
        })?;
        let mut threads = Vec::new();
        for i in 0..opts.max_uploads.max(1) {
            let sh = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("sluice-upload{i}"))
                    .spawn(move || sh.uploader())?,
            );
        }
        let sh = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("sluice-wb-status".into())
                .spawn(move || sh.reporter())?,
        );
        Ok(WritebackStore {
            shared,
            direct_puts: AtomicBool::new(false),
            threads: Mutex::new(threads),
            _lock: lock,
        })
    }

    /// The staging backlog and upload counters now.
    pub fn stats(&self) -> WritebackStats {
        self.shared.stats()
    }

    /// The staging folder.
    pub fn staging_dir(&self) -> &Path {
        self.shared.staging.root()
    }

    /// Whether `key` is staged and not uploaded yet.
    fn is_staged(&self, key: &str) -> bool {
        self.shared.state.lock().staged.contains_key(key)
    }

    /// Stages `data` durably and queues its upload.
    fn stage(&self, key: &str, data: &[u8], crc: u32) -> Result<()> {
        let sh = &self.shared;
        sh.state.lock().stats.staging_now += 1;
        let r = self.stage_counted(key, data, crc);
        let mut st = sh.state.lock();
        st.stats.staging_now -= 1;
        match &r {
            Ok(()) => {
                st.stats.staged_blocks += 1;
                st.stats.staged_bytes += data.len() as u64;
            }
            Err(_) => st.stats.stage_errors += 1,
        }
        r
    }

    /// [`WritebackStore::stage`] itself.
    fn stage_counted(&self, key: &str, data: &[u8], crc: u32) -> Result<()> {
        let sh = &self.shared;
        let mut put = sh.staging.prepare_put(key, data, Some(crc))?;
        {
            let mut st = sh.state.lock();
            put.rename()?;
            let generation = st.next_generation;
            st.next_generation += 1;
            if st.unstage(key).is_some() {
                log::debug!("writeback: {key} staged again before its upload");
            }
            let size = data.len() as u64;
            st.staged.insert(
                key.to_string(),
                Staged {
                    generation,
                    size,
                    at: Instant::now(),
                },
            );
            st.stats.pending_blocks += 1;
            st.stats.pending_bytes += size;
            let ready = if st.expedite {
                Instant::now()
            } else {
                Instant::now() + sh.delay
            };
            st.queue.push(Reverse(Job {
                ready,
                generation,
                key: key.to_string(),
                attempts: 0,
            }));
        }
        sh.work.notify_one();
        // The rename is durable before the slice can be committed.
        put.sync_dirs()
    }
}

impl Shared {
    fn stats(&self) -> WritebackStats {
        self.state.lock().stats.clone()
    }

    fn write_status(&self) -> io::Result<()> {
        let status = WritebackStatus {
            pid: std::process::id(),
            updated_unix: unix_now(),
            staging: self.staging.root().to_string_lossy().into_owned(),
            bucket: self.inner.describe(),
            stats: self.stats(),
        };
        let text = serde_json::to_vec_pretty(&status).map_err(io::Error::other)?;
        let tmp = self.status_path.with_extension("tmp");
        fs::write(&tmp, text)?;
        fs::rename(&tmp, &self.status_path)
    }

    /// Rewrites the status file every second while the counters change
    /// (every [`STATUS_REFRESH`] when idle) and logs a non-empty backlog.
    fn reporter(&self) {
        let mut last_log = Instant::now();
        let mut written: Option<(WritebackStats, Instant)> = None;
        let mut due = Instant::now() + STATUS_EVERY;
        let mut st = self.state.lock();
        loop {
            // Woken by every upload too (`progress`): write on the tick only.
            self.progress.wait_until(&mut st, due);
            if st.stop {
                return;
            }
            if Instant::now() < due {
                continue;
            }
            due = Instant::now() + STATUS_EVERY;
            let s = st.stats.clone();
            drop(st);
            let fresh = written
                .as_ref()
                .is_some_and(|(w, at)| *w == s && at.elapsed() < STATUS_REFRESH);
            if !fresh {
                match self.write_status() {
                    Ok(()) => written = Some((s.clone(), Instant::now())),
                    Err(e) => log::warn!(
                        "writeback: cannot write {}: {e}",
                        self.status_path.display()
                    ),
                }
            }
            if s.pending_blocks > 0 && last_log.elapsed() >= LOG_EVERY {
                last_log = Instant::now();
                log::info!(
                    "writeback backlog: {} blocks ({} bytes) staged, {} uploading; {} uploaded since start, {} failed attempts{}",
                    s.pending_blocks,
                    s.pending_bytes,
                    s.uploading,
                    s.uploaded_blocks,
                    s.failures,
                    s.last_error
                        .as_deref()
                        .map(|e| format!(" (last: {e})"))
                        .unwrap_or_default()
                );
            }
            st = self.state.lock();
        }
    }

    /// The next job due, or `None` at stop.
    fn next_job(&self) -> Option<Job> {
        let mut st = self.state.lock();
        loop {
            if st.stop {
                return None;
            }
            let now = Instant::now();
            let ready = st.queue.peek().map(|Reverse(j)| j.ready);
            match ready {
                None => self.work.wait(&mut st),
                Some(at) if at > now => {
                    self.work.wait_until(&mut st, at);
                }
                Some(_) => {
                    let Some(Reverse(job)) = st.queue.pop() else {
                        continue;
                    };
                    let waited = st
                        .staged
                        .get(&job.key)
                        .filter(|s| s.generation == job.generation)
                        .map(|s| s.at.elapsed());
                    if let Some(waited) = waited {
                        st.stats.uploading += 1;
                        st.stats.staged_wait_nanos +=
                            u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
                        return Some(job);
                    }
                    // Deleted or staged again since: nothing to do.
                }
            }
        }
    }

    /// Copies a staged object to `inner` and makes it durable there.
    fn upload(&self, key: &str) -> Result<u64> {
        let data = self.staging.get(key)?;
        let crc = sluice_simd::crc32c(0, &data);
        self.inner.put(key, &data, Some(crc))?;
        // The staged copy goes once the upload is durable (a file bucket
        // needs its sync; remote stores are durable when put returns).
        self.inner
            .sync_objects(std::slice::from_ref(&key.to_string()))
            .map_err(super::Unsynced::into_error)?;
        Ok(data.len() as u64)
    }

    fn uploader(&self) {
        while let Some(job) = self.next_job() {
            let res = self.upload(&job.key);
            let key = job.key.clone();
            let mut deleted_meanwhile = false;
            {
                let mut st = self.state.lock();
                st.stats.uploading -= 1;
                let current = st.staged.get(&job.key).map(|s| s.generation);
                match res {
                    Ok(bytes) if current == Some(job.generation) => {
                        if let Err(e) = self.staging.delete(&job.key) {
                            // Left behind, it is uploaded again at the next
                            // start: harmless.
                            log::warn!("writeback: cannot remove the staged {}: {e}", job.key);
                        }
                        st.unstage(&job.key);
                        st.stats.uploaded_blocks += 1;
                        st.stats.uploaded_bytes += bytes;
                    }
                    // Staged again meanwhile: the newer version's job
                    // uploads it again.
                    Ok(_) if current.is_some() => {}
                    // Deleted while we uploaded: the upload brought it back.
                    Ok(_) => deleted_meanwhile = true,
                    Err(_) if current != Some(job.generation) => {}
                    Err(e) if is_not_found(&e) && self.staging.head(&job.key).is_err() => {
                        log::error!(
                            "writeback: the staged {} vanished before its upload (removed by hand?); its data is lost",
                            job.key
                        );
                        st.unstage(&job.key);
                        st.stats.failures += 1;
                        st.stats.last_error = Some(format!("{}: staged file vanished", job.key));
                    }
                    Err(e) => {
                        let wait = BACKOFF.delay(job.attempts + 1);
                        log::warn!(
                            "writeback: uploading {} failed (attempt {}): {e}; retrying in {wait:?}",
                            job.key,
                            job.attempts + 1
                        );
                        st.stats.failures += 1;
                        st.stats.last_error = Some(e.to_string());
                        st.queue.push(Reverse(Job {
                            ready: Instant::now() + wait,
                            attempts: job.attempts + 1,
                            ..job
                        }));
                        self.work.notify_one();
                    }
                }
            }
            self.progress.notify_all();
            if deleted_meanwhile && let Err(e) = self.inner.delete(&key) {
                log::warn!("writeback: cannot delete {key} after its upload: {e}");
            }
        }
    }
}

impl ObjectStore for WritebackStore {
    fn describe(&self) -> String {
        format!(
            "{} (writeback via {})",
            self.shared.inner.describe(),
            self.shared.staging.root().display()
        )
    }

    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
        let crc = crc.unwrap_or_else(|| sluice_simd::crc32c(0, data));
        match self.stage(key, data, crc) {
            Ok(()) => Ok(()),
            Err(e) => {
                // A full or failing cache disk must not fail the write while
                // the bucket takes it: upload synchronously, as JuiceFS does.
                log::warn!("writeback: cannot stage {key} ({e}); uploading it now");
                self.shared.inner.put(key, data, Some(crc))?;
                self.direct_puts.store(true, Ordering::Release);
                Ok(())
            }
        }
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        if self.is_staged(key) {
            // Not found: uploaded (and removed) since the check.
            match self.shared.staging.get(key) {
                Err(e) if is_not_found(&e) => {}
                r => return r,
            }
        }
        self.shared.inner.get(key)
    }

    fn get_to(&self, key: &str, out: &mut [u8]) -> Result<usize> {
        if self.is_staged(key) {
            match self.shared.staging.get_to(key, out) {
                Err(e) if is_not_found(&e) => {}
                r => return r,
            }
        }
        self.shared.inner.get_to(key, out)
    }

    fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
        if self.is_staged(key) {
            match self.shared.staging.get_range(key, off, len) {
                Err(e) if is_not_found(&e) => {}
                r => return r,
            }
        }
        self.shared.inner.get_range(key, off, len)
    }

    fn head(&self, key: &str) -> Result<ObjectInfo> {
        if self.is_staged(key) {
            match self.shared.staging.head(key) {
                Err(e) if is_not_found(&e) => {}
                r => return r,
            }
        }
        self.shared.inner.head(key)
    }

    fn local_file(&self, key: &str) -> Option<Result<fs::File>> {
        if self.is_staged(key) {
            match self.shared.staging.local_file(key) {
                Some(Err(e)) if is_not_found(&e) => {}
                r => return r,
            }
        }
        self.shared.inner.local_file(key)
    }

    fn delete(&self, key: &str) -> Result<()> {
        {
            let mut st = self.shared.state.lock();
            if st.staged.contains_key(key) {
                // Unstaged only once the file is gone: a failed delete is
                // retried by the releaser, and the upload stays queued.
                self.shared.staging.delete(key)?;
                st.unstage(key);
            }
        }
        self.shared.inner.delete(key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut all: std::collections::BTreeMap<String, ObjectInfo> = self
            .shared
            .inner
            .list(prefix)?
            .into_iter()
            .map(|o| (o.key.clone(), o))
            .collect();
        for o in self.shared.staging.list(prefix)? {
            all.insert(o.key.clone(), o);
        }
        Ok(all.into_values().collect())
    }

    /// Staged blocks are durable when `put` returns, so there is nothing to
    /// sync, unless puts went straight to the real store (staging failed):
    /// then that store is synced as it would be without writeback (a key
    /// that was staged is not waiting there, and counts as durable).
    fn needs_sync(&self) -> bool {
        self.direct_puts.load(Ordering::Acquire) && self.shared.inner.needs_sync()
    }

    fn sync_objects(&self, keys: &[String]) -> std::result::Result<(), super::Unsynced> {
        if self.direct_puts.load(Ordering::Acquire) {
            return self.shared.inner.sync_objects(keys);
        }
        Ok(())
    }

    fn upload_backlog(&self) -> Option<WritebackStats> {
        Some(self.stats())
    }

    fn drain_uploads(&self, limit: Duration) -> usize {
        let sh = &self.shared;
        let deadline = Instant::now() + limit;
        let mut st = sh.state.lock();
        // Delayed uploads start now; retries keep their backoff.
        st.expedite = true;
        let now = Instant::now();
        let jobs = std::mem::take(&mut st.queue);
        st.queue = jobs
            .into_iter()
            .map(|Reverse(mut j)| {
                if j.attempts == 0 {
                    j.ready = j.ready.min(now);
                }
                Reverse(j)
            })
            .collect();
        sh.work.notify_all();
        if !st.staged.is_empty() {
            log::info!(
                "writeback: waiting up to {limit:?} for {} staged blocks ({} bytes) to upload",
                st.stats.pending_blocks,
                st.stats.pending_bytes
            );
        }
        while !st.staged.is_empty() && Instant::now() < deadline {
            sh.progress.wait_until(&mut st, deadline);
        }
        st.expedite = false;
        let left = st.staged.len();
        let bytes = st.stats.pending_bytes;
        drop(st);
        if left > 0 {
            log::warn!(
                "writeback: {left} staged blocks ({bytes} bytes) are not uploaded yet; they stay in {} and are uploaded at the next start",
                sh.staging.root().display()
            );
        } else {
            log::info!("writeback: every staged block is uploaded");
        }
        if let Err(e) = sh.write_status() {
            log::warn!("writeback: cannot write {}: {e}", sh.status_path.display());
        }
        left
    }
}

impl Drop for WritebackStore {
    /// Stops the uploaders after their current upload; whatever is still
    /// staged is uploaded at the next start.
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.work.notify_all();
        self.shared.progress.notify_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        let _ = self.shared.write_status();
    }
}

/// The directory of a volume under a cache directory: `CACHE_DIR/<uuid>`
/// (as JuiceFS names it), holding `rawstaging` and `status`.
pub fn volume_dir(cache_dir: &Path, uuid: &str) -> PathBuf {
    cache_dir.join(uuid)
}

/// The status a running (or the last) writeback store wrote under the
/// volume directory `dir` (`CACHE_DIR/<uuid>`); `None` if there is none.
pub fn read_status(dir: &Path) -> Result<Option<WritebackStatus>> {
    let path = dir.join(STATUS_FILE);
    let text = match fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    serde_json::from_slice(&text).map(Some).map_err(|e| {
        Error::Invalid(format!(
            "{} is not a sluice status file: {e}",
            path.display()
        ))
    })
}

/// The blocks (count, bytes) staged on disk under the volume directory
/// `dir` now, whatever process staged them.
pub fn staged_on_disk(dir: &Path) -> Result<(u64, u64)> {
    let staging = dir.join(STAGING_DIR);
    if !staging.is_dir() {
        return Ok((0, 0));
    }
    let objects = FileStore::new(&staging)?.list("")?;
    Ok((objects.len() as u64, objects.iter().map(|o| o.size).sum()))
}

#[cfg(test)]
mod tests;
