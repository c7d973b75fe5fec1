//! Group commit: the one way a file's writes become part of the volume.
//!
//! A commit of one file (a close, an fsync, a read after writes, a full
//! write buffer) first stores its slices' blocks as objects (the writer
//! does that on its own thread), then hands a [`Job`] — the object keys,
//! the chunk records to add — to the volume's [`Committer`]. One thread
//! takes the jobs that are waiting as a group and, in this order:
//!
//! 1. makes every object of the group durable with one
//!    [`ObjectStore::sync_objects`](crate::object::ObjectStore::sync_objects)
//!    (a `file://` bucket: an `fdatasync` of each object and an `fsync` of
//!    each directory, all at once; S3 and writeback staging: nothing);
//! 2. records the slices of every job whose objects are durable with one
//!    [`Store::write_chunks`](crate::meta::Store::write_chunks) (SQLite: one transaction for the group);
//! 3. drops each chunk it recorded from the reader's resolved slice lists,
//!    and only then tells each job how it went.
//!
//! So a record is never written — and so can never become durable, however
//! the metadata engine or the kernel writes it back — before the objects it
//! names are on stable storage, and many files pay for one sync and one
//! transaction. A job whose objects could not be synced is not recorded
//! (its error is its own; the others of the group carry on).
//!
//! A caller that waits for its job (fsync, a read) starts the group at
//! once; jobs nobody waits for (closes) wait for company at most
//! [`CommitConfig::delay`], or until [`CommitConfig::max_group`] are
//! waiting. While a group runs, the next one gathers. At most
//! [`MAX_QUEUED`] jobs wait; a caller past that waits for room.
//! `engine/DESIGN.md` ("Durability") says why this order is enough.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::chunk_cache::ChunkCache;
use crate::error::{Error, Result};
use crate::meta::{ChunkWrite, CommitResult, Ino};

use crate::volume::Volume;

/// How long a group waits for company, and how large it may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitConfig {
    /// How long the first job nobody waits for (a close) waits for others
    /// before its group starts. A job someone waits for (an fsync) starts
    /// its group at once.
    pub delay: Duration,
    /// The most jobs in one group.
    pub max_group: usize,
}

/// The default wait for company: closes arriving within a millisecond
/// share a sync (a close returns before its commit, so only the time until
/// another process sees the data grows by it).
pub const DEFAULT_COMMIT_DELAY: Duration = Duration::from_millis(1);

/// The default largest group.
pub const DEFAULT_MAX_GROUP: usize = 512;

/// The most jobs waiting for a group; a caller past it waits for room.
pub const MAX_QUEUED: usize = 4096;

impl Default for CommitConfig {
    fn default() -> Self {
        CommitConfig {
            delay: DEFAULT_COMMIT_DELAY,
            max_group: DEFAULT_MAX_GROUP,
        }
    }
}

/// What became of a [`Job`].
#[derive(Debug)]
pub enum Outcome {
    /// Its objects could not be made durable (they may be lost, and were
    /// deleted): nothing was recorded.
    Unsynced(Error),
    /// Its objects are durable; what the metadata engine did with its
    /// records.
    Recorded(CommitResult),
}

/// What [`Job::done`] is: called once with the job's [`Outcome`].
pub type Done = Box<dyn FnOnce(Outcome) + Send>;

/// One file's commit: its stored objects and the records that name them.
pub struct Job {
    /// The file.
    pub ino: Ino,
    /// The keys of every object its records name (to sync).
    pub keys: Vec<String>,
    /// The records, in write order.
    pub writes: Vec<ChunkWrite>,
    /// Whether a caller waits for it: the group starts without waiting
    /// for company.
    pub waited: bool,
    /// Called once, on the committer's thread, with what became of the
    /// writes (after the chunks were dropped from the resolved lists). It
    /// must not wait for another commit.
    pub done: Done,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("ino", &self.ino)
            .field("objects", &self.keys.len())
            .field("writes", &self.writes.len())
            .field("waited", &self.waited)
            .finish()
    }
}

/// Counters of the groups run so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CommitStats {
    /// Groups run.
    pub groups: u64,
    /// Jobs committed or failed in them.
    pub jobs: u64,
    /// Groups that had objects to sync.
    pub object_syncs: u64,
}

#[derive(Debug, Default)]
struct Counters {
    groups: AtomicU64,
    jobs: AtomicU64,
    object_syncs: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Job>,
    /// Jobs in the queue someone waits for.
    waited: usize,
    /// Jobs submitted so far, and jobs whose group finished.
    submitted: u64,
    finished: u64,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    vol: Arc<Volume>,
    chunks: Option<Arc<ChunkCache>>,
    cfg: CommitConfig,
    state: Mutex<State>,
    /// A job arrived (or stop).
    arrived: Condvar,
    /// A group took jobs off the queue, or finished.
    progress: Condvar,
    counters: Counters,
}

/// The group-commit thread of one volume.
#[derive(Debug)]
pub struct Committer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Committer {
    /// Starts the committer of `vol`; each chunk it records is dropped from
    /// `chunks` (the reader's resolved slice lists) before its job is told.
    pub fn start(
        vol: Arc<Volume>,
        chunks: Option<Arc<ChunkCache>>,
        cfg: CommitConfig,
    ) -> Result<Committer> {
        let shared = Arc::new(Shared {
            vol,
            chunks,
            cfg: CommitConfig {
                max_group: cfg.max_group.max(1),
                ..cfg
            },
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
            progress: Condvar::new(),
            counters: Counters::default(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-commit".into())
            .spawn(move || s.run())?;
        Ok(Committer {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues `job` for the next group (waiting first while
    /// [`MAX_QUEUED`] jobs wait). After [`Committer::stop`] the job is
    /// committed on the calling thread.
    pub fn submit(&self, job: Job) {
        let mut st = self.shared.state.lock();
        while st.queue.len() >= MAX_QUEUED && !st.stop {
            self.shared.progress.wait(&mut st);
        }
        if st.stop {
            drop(st);
            self.shared.group(vec![job]);
            return;
        }
        st.waited += usize::from(job.waited);
        st.submitted += 1;
        st.queue.push_back(job);
        self.shared.arrived.notify_one();
    }

    /// Waits until every job submitted before the call has been told how
    /// it went (what `syncfs` and unmount wait for).
    pub fn wait_idle(&self) {
        let mut st = self.shared.state.lock();
        let target = st.submitted;
        while st.finished < target {
            self.shared.progress.wait(&mut st);
        }
    }

    /// The groups run so far.
    pub fn stats(&self) -> CommitStats {
        let c = &self.shared.counters;
        CommitStats {
            groups: c.groups.load(Ordering::Relaxed),
            jobs: c.jobs.load(Ordering::Relaxed),
            object_syncs: c.object_syncs.load(Ordering::Relaxed),
        }
    }

    /// Commits what is queued and stops the thread; later jobs commit on
    /// their callers' threads.
    pub fn stop(&self) {
        self.shared.state.lock().stop = true;
        self.shared.arrived.notify_all();
        self.shared.progress.notify_all();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Commits `job` on the calling thread, as a group of one (writers without
/// a committer: tests of the write buffer).
pub fn commit_now(vol: &Arc<Volume>, chunks: Option<&Arc<ChunkCache>>, job: Job) {
    let shared = Shared {
        vol: vol.clone(),
        chunks: chunks.cloned(),
        cfg: CommitConfig::default(),
        state: Mutex::new(State::default()),
        arrived: Condvar::new(),
        progress: Condvar::new(),
        counters: Counters::default(),
    };
    shared.group(vec![job]);
}

impl Shared {
    fn run(&self) {
        loop {
            let jobs = {
                let mut st = self.state.lock();
                while st.queue.is_empty() && !st.stop {
                    self.arrived.wait(&mut st);
                }
                if st.queue.is_empty() {
                    return;
                }
                // Company for jobs nobody waits for, briefly.
                if st.waited == 0 && !st.stop && !self.cfg.delay.is_zero() {
                    let until = Instant::now() + self.cfg.delay;
                    while st.waited == 0 && !st.stop && st.queue.len() < self.cfg.max_group {
                        if self.arrived.wait_until(&mut st, until).timed_out() {
                            break;
                        }
                    }
                }
                let n = st.queue.len().min(self.cfg.max_group);
                let jobs: Vec<Job> = st.queue.drain(..n).collect();
                st.waited -= jobs.iter().filter(|j| j.waited).count();
                self.progress.notify_all();
                jobs
            };
            let n = jobs.len() as u64;
            self.group(jobs);
            self.state.lock().finished += n;
            self.progress.notify_all();
        }
    }

    /// Syncs the objects of `jobs`, records the writes of those whose
    /// objects are durable, drops their chunks from the resolved lists and
    /// tells each job.
    fn group(&self, jobs: Vec<Job>) {
        let c = &self.counters;
        c.groups.fetch_add(1, Ordering::Relaxed);
        c.jobs.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        crate::metrics::COMMITS.group(jobs.len());
        // 1. The objects, all at once.
        let mut errors: Vec<Option<Error>> = jobs.iter().map(|_| None).collect();
        let keys: Vec<String> = jobs.iter().flat_map(|j| j.keys.iter().cloned()).collect();
        if !keys.is_empty() {
            c.object_syncs.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            let synced = self.vol.store.sync_objects(&keys);
            crate::metrics::COMMITS.synced(started);
            if let Err(unsynced) = synced {
                // Which job each key belongs to.
                let mut owner = Vec::with_capacity(keys.len());
                for (j, job) in jobs.iter().enumerate() {
                    owner.extend(std::iter::repeat_n(j, job.keys.len()));
                }
                for (k, e) in unsynced.0 {
                    if let Some(&j) = owner.get(k)
                        && errors[j].is_none()
                    {
                        errors[j] = Some(e);
                    }
                }
            }
        }
        // 2. The records of the jobs whose objects are durable.
        let ready: Vec<usize> = (0..jobs.len()).filter(|j| errors[*j].is_none()).collect();
        let commits: Vec<Vec<ChunkWrite>> = ready.iter().map(|j| jobs[*j].writes.clone()).collect();
        let mut results: Vec<Option<CommitResult>> = jobs.iter().map(|_| None).collect();
        if !commits.is_empty() {
            let started = Instant::now();
            let recorded = self.vol.meta.write_chunks(&commits);
            crate::metrics::COMMITS.recorded(started);
            // JuiceFS's `Write` records one slice; a group's one
            // transaction records them all, and counts once.
            crate::metrics::META_OPS.record(crate::metrics::MetaOp::Write, started);
            for (j, r) in ready.iter().zip(recorded) {
                results[*j] = Some(r);
            }
        }
        // 3. Every chunk a record may have reached is dropped from the
        // resolved lists (a failed one too: its outcome may be unknown, and
        // a lookup costs little), then each job is told.
        if let Some(chunks) = &self.chunks {
            for j in &ready {
                for w in &jobs[*j].writes {
                    chunks.invalidate(w.ino, w.indx);
                }
            }
        }
        for ((job, error), result) in jobs.into_iter().zip(errors).zip(results) {
            let outcome = match error {
                Some(e) => Outcome::Unsynced(e),
                None => Outcome::Recorded(result.unwrap_or_default()),
            };
            let orphans = match &outcome {
                // What a failed sync left may be torn.
                Outcome::Unsynced(_) => true,
                // The file was removed (and closed) before its last writes
                // were recorded: nothing names their objects.
                Outcome::Recorded(r) => matches!(r.error, Some(Error::NotFound)),
            };
            if orphans {
                for key in &job.keys {
                    if let Err(e) = self.vol.store.delete(key) {
                        log::warn!("cannot delete the unrecorded object {key}: {e}");
                    }
                }
            }
            (job.done)(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Compression;
    use crate::meta::{Context, ROOT_INO, Slice, Timestamp, open_meta};
    use crate::object::{FileStore, ObjectInfo, ObjectStore, Unsynced};
    use crate::volume::{format_volume, open_volume};
    use std::collections::HashSet;
    use std::sync::mpsc;

    /// A bucket whose syncs can be held at a gate and fail chosen keys.
    #[derive(Debug)]
    struct Gated {
        inner: FileStore,
        gate: Mutex<bool>,
        opened: Condvar,
        /// Syncs that reached the gate.
        arrived: Mutex<usize>,
        failing: Mutex<HashSet<String>>,
        synced: Mutex<Vec<Vec<String>>>,
    }

    impl ObjectStore for Gated {
        fn describe(&self) -> String {
            "gated".into()
        }
        fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
            self.inner.put(key, data, crc)
        }
        fn get(&self, key: &str) -> Result<Vec<u8>> {
            self.inner.get(key)
        }
        fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
            self.inner.get_range(key, off, len)
        }
        fn head(&self, key: &str) -> Result<ObjectInfo> {
            self.inner.head(key)
        }
        fn delete(&self, key: &str) -> Result<()> {
            self.inner.delete(key)
        }
        fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
            self.inner.list(prefix)
        }
        fn needs_sync(&self) -> bool {
            true
        }
        fn sync_objects(&self, keys: &[String]) -> std::result::Result<(), Unsynced> {
            *self.arrived.lock() += 1;
            let mut open = self.gate.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
            drop(open);
            self.synced.lock().push(keys.to_vec());
            let failing = self.failing.lock();
            let bad: Vec<(usize, Error)> = keys
                .iter()
                .enumerate()
                .filter(|(_, k)| failing.contains(*k))
                .map(|(i, k)| {
                    (
                        i,
                        Error::Object {
                            key: k.clone(),
                            source: std::io::Error::from_raw_os_error(libc::EIO),
                        },
                    )
                })
                .collect();
            drop(failing);
            self.inner.sync_objects(keys)?;
            if bad.is_empty() {
                Ok(())
            } else {
                Err(Unsynced(bad))
            }
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        vol: Arc<Volume>,
        store: Arc<Gated>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let meta = open_meta(&format!("sqlite3://{}/m.db", dir.path().display())).unwrap();
        let bucket = dir.path().join("bucket");
        format_volume(&*meta, "test", &bucket, 1024, Compression::None, 0).unwrap();
        let vol = open_volume(meta).unwrap();
        let store = Arc::new(Gated {
            inner: FileStore::new(&bucket).unwrap(),
            gate: Mutex::new(true),
            opened: Condvar::new(),
            arrived: Mutex::new(0),
            failing: Mutex::new(HashSet::new()),
            synced: Mutex::new(Vec::new()),
        });
        let vol = vol.with_store(store.clone());
        Fixture {
            _dir: dir,
            vol,
            store,
        }
    }

    /// A file with one stored 3-byte slice, and the job that commits it;
    /// the job sends its outcome on the channel.
    fn job(
        f: &Fixture,
        name: &str,
        waited: bool,
        tx: &mpsc::Sender<(String, Outcome)>,
    ) -> (Ino, Job) {
        let ctx = Context::default();
        let (ino, _) = f
            .vol
            .meta
            .create(&ctx, ROOT_INO, name.as_bytes(), 0o644, 0)
            .unwrap();
        let id = f.vol.meta.new_slice_id().unwrap();
        let key = crate::block_key::block_key(f.vol.name(), id, 0, 3);
        f.vol.store.put(&key, b"abc", None).unwrap();
        let (tx, name) = (tx.clone(), name.to_string());
        let job = Job {
            ino,
            keys: vec![key],
            writes: vec![ChunkWrite {
                ino,
                indx: 0,
                slice: Slice {
                    pos: 0,
                    id,
                    size: 3,
                    off: 0,
                    len: 3,
                },
                mtime: Timestamp::now(),
            }],
            waited,
            done: Box::new(move |o| {
                let _ = tx.send((name, o));
            }),
        };
        (ino, job)
    }

    #[test]
    fn jobs_queued_behind_a_running_group_share_the_next_sync_and_transaction() {
        let f = fixture();
        let committer = Committer::start(
            f.vol.clone(),
            None,
            CommitConfig {
                delay: Duration::ZERO,
                max_group: 64,
            },
        )
        .unwrap();
        let (tx, rx) = mpsc::channel();
        // The first group is held at its sync...
        *f.store.gate.lock() = false;
        let (_, first) = job(&f, "first", true, &tx);
        committer.submit(first);
        while *f.store.arrived.lock() == 0 {
            std::thread::yield_now();
        }
        // ...while twenty closes queue behind it.
        let inos: Vec<Ino> = (0..20)
            .map(|i| {
                let (ino, j) = job(&f, &format!("f{i}"), false, &tx);
                committer.submit(j);
                ino
            })
            .collect();
        *f.store.gate.lock() = true;
        f.store.opened.notify_all();
        committer.wait_idle();
        let outcomes: Vec<(String, Outcome)> = rx.try_iter().collect();
        assert_eq!(outcomes.len(), 21);
        assert!(outcomes.iter().all(
            |(_, o)| matches!(o, Outcome::Recorded(r) if r.error.is_none() && r.counts == [1])
        ));
        // Two groups: one sync of one key, then one of the twenty.
        let stats = committer.stats();
        assert_eq!((stats.groups, stats.jobs, stats.object_syncs), (2, 21, 2));
        let synced = f.store.synced.lock().clone();
        assert_eq!(synced.iter().map(Vec::len).collect::<Vec<_>>(), [1, 20]);
        for ino in inos {
            assert_eq!(f.vol.meta.getattr(ino).unwrap().length, 3);
        }
    }

    #[test]
    fn a_key_that_fails_to_sync_fails_its_own_job_and_is_not_recorded() {
        let f = fixture();
        let (tx, rx) = mpsc::channel();
        let (good, j1) = job(&f, "good", true, &tx);
        let (bad, j2) = job(&f, "bad", true, &tx);
        let bad_key = j2.keys[0].clone();
        f.store.failing.lock().insert(bad_key.clone());
        Shared {
            vol: f.vol.clone(),
            chunks: None,
            cfg: CommitConfig::default(),
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
            progress: Condvar::new(),
            counters: Counters::default(),
        }
        .group(vec![j1, j2]);
        let outcomes: std::collections::HashMap<String, Outcome> = rx.try_iter().collect();
        assert!(matches!(&outcomes["good"], Outcome::Recorded(r) if r.error.is_none()));
        assert!(matches!(
            &outcomes["bad"],
            Outcome::Unsynced(Error::Object { .. })
        ));
        assert_eq!(f.vol.meta.getattr(good).unwrap().length, 3);
        // Nothing names the failed object, which is gone.
        assert_eq!(f.vol.meta.getattr(bad).unwrap().length, 0);
        assert!(f.vol.meta.read_chunk(bad, 0).unwrap().is_empty());
        assert!(f.vol.store.head(&bad_key).is_err());
    }

    #[test]
    fn a_file_removed_before_its_group_ran_leaves_no_object() {
        let f = fixture();
        let (tx, rx) = mpsc::channel();
        let (ino, j) = job(&f, "gone", false, &tx);
        let key = j.keys[0].clone();
        // Closed (create opened it), then removed: no one holds it.
        f.vol.meta.close(ino).unwrap();
        f.vol
            .meta
            .unlink(&Context::default(), ROOT_INO, b"gone")
            .unwrap();
        commit_now(&f.vol, None, j);
        let (_, o) = rx.try_recv().unwrap();
        assert!(
            matches!(&o, Outcome::Recorded(r) if matches!(r.error, Some(Error::NotFound))),
            "{o:?}"
        );
        assert!(f.vol.store.head(&key).is_err());
    }

    #[test]
    fn a_lone_close_waits_for_company_at_most_the_delay() {
        let f = fixture();
        let committer = Committer::start(
            f.vol.clone(),
            None,
            CommitConfig {
                delay: Duration::from_secs(3600),
                max_group: 3,
            },
        )
        .unwrap();
        let (tx, rx) = mpsc::channel();
        // Closes wait for company until the group is full (here: never by
        // time; the third close fills it).
        for i in 0..3 {
            committer.submit(job(&f, &format!("c{i}"), false, &tx).1);
        }
        committer.wait_idle();
        assert_eq!(rx.try_iter().count(), 3);
        assert_eq!(committer.stats().groups, 1);
        // A job someone waits for starts its group at once, with whatever
        // closes wait.
        committer.submit(job(&f, "c3", false, &tx).1);
        committer.submit(job(&f, "w", true, &tx).1);
        committer.wait_idle();
        assert_eq!(rx.try_iter().count(), 2);
        assert_eq!(committer.stats().groups, 2);
    }
}
