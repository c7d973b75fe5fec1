//! Deletion off the critical path: the data of removed files and the
//! objects of released slices are deleted by one background thread, not by
//! the unlink, truncate or overwrite that released them.
//!
//! What must survive a crash is already in the metadata the releasing
//! change committed: a removed file's `delfile` record, a released slice's
//! reference count at zero (or below). The queue here is only the order of
//! work; a crash loses nothing but the order, and the engine's `cleanup`
//! (run at start and every minute) finds the rest. So the queue is bounded:
//! work past [`MAX_QUEUED`] is left to `cleanup`.
//!
//! The thread lets work gather for up to [`LINGER`] (not while a
//! [`Deleter::drain`] waits), then takes everything queued at once: it
//! deletes the removed files' chunk records first (each a transaction of the engine, whose
//! released slices come back to this queue), then releases the slices —
//! one [`Store::sync`](super::Store::sync) for all of them (an object is
//! deleted only once the change that released it is durable), then the
//! objects, then one transaction forgetting their references. Many unlinks
//! pay for one sync.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{Ino, ReleasedSlice};
use crate::error::Result;

/// The most files and slices waiting; more are left to `cleanup`.
pub const MAX_QUEUED: usize = 1 << 16;

/// How long the thread lets work gather before it takes a batch smaller
/// than [`BATCH`]. Deletion is on no caller's path, so the wait costs no
/// one, while a stream of unlinks (one at a time through the kernel)
/// becomes batches: one metadata sync and a few round trips for many files
/// instead of for each (measured on Redis through a mount: 7.0 round trips
/// per unlink without it, the deleter waking for each file).
const LINGER: Duration = Duration::from_millis(10);

/// A batch the thread takes at once, without lingering.
const BATCH: usize = 1024;

/// What an engine does for the deleter.
pub(crate) trait Deletes: Send + Sync + 'static {
    /// Deletes the chunk records of removed file `ino` (`length` bytes
    /// long) and forgets its `delfile` record; the slices that lose their
    /// last reference come back through [`Deleter::queue_slices`].
    fn delete_file_data(&self, ino: Ino, length: u64) -> Result<()>;
    /// [`Deletes::delete_file_data`] for many files, in as few round trips
    /// as the engine can; errors are logged per file (what failed stays
    /// for `cleanup`).
    fn delete_files_data(&self, files: &[(Ino, u64)]) -> Result<()> {
        for (ino, length) in files {
            if let Err(e) = self.delete_file_data(*ino, *length) {
                log::warn!(
                    "deleting the data of removed inode {ino} failed (cleanup retries): {e}"
                );
            }
        }
        Ok(())
    }
    /// Syncs the metadata, deletes the slices' objects and forgets their
    /// references (what failed stays for `cleanup`).
    fn release_slices(&self, released: &[ReleasedSlice]);
}

#[derive(Debug, Default)]
struct Queue {
    files: VecDeque<(Ino, u64)>,
    slices: Vec<ReleasedSlice>,
    /// Whether the thread is working on what it took.
    busy: bool,
    stop: bool,
    /// Work left to `cleanup` because the queue was full (logged once per
    /// run of it).
    overflowed: bool,
    /// Holds in force ([`Deleter::hold`]): the thread takes nothing.
    held: usize,
    /// Callers of [`Deleter::drain`] waiting: the thread takes what is
    /// queued at once, without lingering.
    drainers: usize,
}

impl Queue {
    fn len(&self) -> usize {
        self.files.len() + self.slices.len()
    }
}

#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Work arrived, or stop.
    work: Condvar,
    /// The thread finished what it took.
    idle: Condvar,
}

/// The background deleter of one metadata engine.
#[derive(Debug)]
pub(crate) struct Deleter {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Deleter {
    /// Starts the thread; it works for `backend` while the engine lives.
    pub(crate) fn start<B: Deletes>(backend: Weak<B>) -> Result<Deleter> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-delete".into())
            .spawn(move || run(&s, &backend))?;
        Ok(Deleter {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues the data of removed files (inode, length) for deletion.
    pub(crate) fn queue_files(&self, files: &[(Ino, u64)]) {
        if files.is_empty() {
            return;
        }
        let mut q = self.shared.queue.lock();
        for f in files {
            if q.len() >= MAX_QUEUED {
                overflow(&mut q);
                break;
            }
            q.files.push_back(*f);
        }
        self.shared.work.notify_one();
    }

    /// Queues released slices for the deletion of their objects.
    pub(crate) fn queue_slices(&self, slices: &[ReleasedSlice]) {
        if slices.is_empty() {
            return;
        }
        let mut q = self.shared.queue.lock();
        let room = MAX_QUEUED.saturating_sub(q.len());
        if slices.len() > room {
            overflow(&mut q);
        }
        q.slices
            .extend_from_slice(&slices[..slices.len().min(room)]);
        self.shared.work.notify_one();
    }

    /// Waits until everything queued so far (and what it released) is
    /// done.
    pub(crate) fn drain(&self) {
        let mut q = self.shared.queue.lock();
        q.drainers += 1;
        self.shared.work.notify_all();
        while (q.len() > 0 || q.busy) && !q.stop {
            self.shared.idle.wait(&mut q);
        }
        q.drainers -= 1;
    }

    /// Keeps the thread from taking work until the guard is dropped: what
    /// is queued meanwhile is then taken as one batch. For tests that count
    /// the round trips of a batch, which otherwise depend on when the
    /// thread wakes (a loaded host wakes it between unlinks).
    #[cfg(test)]
    pub(crate) fn hold(&self) -> Hold {
        self.shared.queue.lock().held += 1;
        Hold(self.shared.clone())
    }

    /// Stops the thread (what is queued is left to `cleanup`).
    pub(crate) fn stop(&self) {
        self.shared.queue.lock().stop = true;
        self.shared.work.notify_all();
        self.shared.idle.notify_all();
        if let Some(t) = self.thread.lock().take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

impl Drop for Deleter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A hold on the deleter's thread ([`Deleter::hold`]).
#[cfg(test)]
pub(crate) struct Hold(Arc<Shared>);

#[cfg(test)]
impl Drop for Hold {
    fn drop(&mut self) {
        self.0.queue.lock().held -= 1;
        self.0.work.notify_all();
    }
}

fn overflow(q: &mut Queue) {
    if !q.overflowed {
        q.overflowed = true;
        log::warn!(
            "more than {MAX_QUEUED} removed files and released slices wait for deletion; \
             the rest is left to the periodic cleanup"
        );
    }
}

fn run<B: Deletes>(shared: &Shared, backend: &Weak<B>) {
    loop {
        let (files, slices) = {
            let mut q = shared.queue.lock();
            q.busy = false;
            if q.len() == 0 {
                q.overflowed = false;
                shared.idle.notify_all();
            }
            loop {
                while (q.len() == 0 || q.held > 0) && !q.stop {
                    shared.work.wait(&mut q);
                }
                // Let more gather (see `LINGER`), unless someone waits
                // for the queue to empty.
                let deadline = Instant::now() + LINGER;
                while q.len() < BATCH && q.drainers == 0 && q.held == 0 && !q.stop {
                    if shared.work.wait_until(&mut q, deadline).timed_out() {
                        break;
                    }
                }
                if q.stop {
                    return;
                }
                if q.held == 0 {
                    break;
                }
            }
            q.busy = true;
            (std::mem::take(&mut q.files), std::mem::take(&mut q.slices))
        };
        let Some(backend) = backend.upgrade() else {
            return;
        };
        let files: Vec<(Ino, u64)> = files.into_iter().collect();
        if let Err(e) = backend.delete_files_data(&files) {
            log::warn!(
                "deleting the data of {} removed file(s) failed (cleanup retries): {e}",
                files.len()
            );
        }
        backend.release_slices(&slices);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        deleter: Mutex<Option<Arc<Deleter>>>,
        calls: Mutex<Vec<String>>,
    }

    impl Deletes for Recorder {
        fn delete_file_data(&self, ino: Ino, length: u64) -> Result<()> {
            self.calls.lock().push(format!("file {ino} {length}"));
            // Each removed file releases one slice, which comes back.
            let d = self.deleter.lock().clone();
            if let Some(d) = d {
                d.queue_slices(&[ReleasedSlice { id: ino, size: 1 }]);
            }
            Ok(())
        }
        fn release_slices(&self, released: &[ReleasedSlice]) {
            if !released.is_empty() {
                let ids: Vec<u64> = released.iter().map(|s| s.id).collect();
                self.calls.lock().push(format!("release {ids:?}"));
            }
        }
    }

    #[test]
    fn files_release_their_slices_in_one_batch_and_drain_waits_for_both() {
        let backend = Arc::new(Recorder::default());
        let d = Arc::new(Deleter::start(Arc::downgrade(&backend)).unwrap());
        *backend.deleter.lock() = Some(d.clone());
        d.queue_files(&[(7, 10), (8, 20)]);
        d.drain();
        let calls = backend.calls.lock().clone();
        assert!(calls.contains(&"file 7 10".to_string()), "{calls:?}");
        assert!(calls.contains(&"file 8 20".to_string()), "{calls:?}");
        // Every slice the files released was released by the time drain
        // returned.
        let mut released: Vec<u64> = calls
            .iter()
            .filter_map(|c| c.strip_prefix("release "))
            .flat_map(|l| {
                l.trim_matches(|c| c == '[' || c == ']')
                    .split(", ")
                    .map(|n| n.parse::<u64>().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        released.sort();
        assert_eq!(released, [7, 8]);
        *backend.deleter.lock() = None;
    }

    #[test]
    fn a_full_queue_leaves_the_rest_to_cleanup() {
        let backend = Arc::new(Recorder::default());
        let d = Deleter::start(Arc::downgrade(&backend)).unwrap();
        let many: Vec<ReleasedSlice> = (0..MAX_QUEUED as u64 + 100)
            .map(|id| ReleasedSlice { id, size: 1 })
            .collect();
        d.queue_slices(&many);
        assert!(d.shared.queue.lock().len() <= MAX_QUEUED);
        d.drain();
        assert_eq!(d.shared.queue.lock().len(), 0);
    }
}
