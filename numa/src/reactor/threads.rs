//! The fallback backend: blocking pread/pwrite on a pool of threads, for kernels or sandboxes
//! without io_uring (qemu-user, `io_uring_disabled`, seccomp).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Select, Sender};

use super::{OpDesc, ReactorError};
use crate::cpuset::CpuSet;
use crate::pinning;

struct Job {
    op: OpDesc,
    file: Arc<File>,
}

// SAFETY: the raw buffer pointer inside OpDesc stays valid until the job's completion is
// reaped: the reactor refuses to unregister (or drop) a buffer with operations in flight.
unsafe impl Send for Job {}

pub(super) struct ThreadPool {
    jobs: Option<Sender<Job>>,
    done_rx: Receiver<(u64, i32)>,
    queued: Vec<Job>,
    threads: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    pub(super) fn new(threads: usize, cpus: Option<CpuSet>) -> Result<Self, ReactorError> {
        let (jobs, jobs_rx) = crossbeam_channel::unbounded::<Job>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let jobs_rx = jobs_rx.clone();
            let done_tx = done_tx.clone();
            let cpus = cpus.clone();
            let handle = std::thread::Builder::new()
                .name(format!("sluice-io-{i}"))
                .spawn(move || worker(jobs_rx, done_tx, cpus))
                .map_err(|source| ReactorError::Os {
                    what: "spawning an I/O pool thread",
                    source,
                })?;
            handles.push(handle);
        }
        Ok(Self {
            jobs: Some(jobs),
            done_rx,
            queued: Vec::new(),
            threads: handles,
        })
    }

    pub(super) fn push(&mut self, op: OpDesc, file: Arc<File>) {
        self.queued.push(Job { op, file });
    }

    pub(super) fn submit(&mut self) {
        if let Some(jobs) = &self.jobs {
            for job in self.queued.drain(..) {
                // The pool threads only stop when `jobs` is dropped, so sending cannot fail.
                let _ = jobs.send(job);
            }
        }
    }

    pub(super) fn reap(&mut self, done: &mut Vec<(u64, i32)>) {
        done.extend(self.done_rx.try_iter());
    }

    /// Blocks until a completion or a message is ready (consuming neither).
    pub(super) fn wait_one<M>(&mut self, inbox: &Receiver<M>) {
        let mut select = Select::new();
        select.recv(&self.done_rx);
        select.recv(inbox);
        select.ready();
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.jobs = None;
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

fn worker(jobs: Receiver<Job>, done: Sender<(u64, i32)>, cpus: Option<CpuSet>) {
    if let Some(Err(e)) = cpus.map(|cpus| pinning::pin_current_thread_to(&cpus)) {
        log::warn!("I/O pool thread stays unpinned: {e}");
    }
    for job in jobs {
        let op = job.op;
        let fd = job.file.as_raw_fd();
        let offset = op.offset as libc::off_t;
        // SAFETY: op.addr points at op.len bytes of a registered buffer that stays valid and
        // untouched by the reactor until this completion is reaped (see `Job`).
        let n = unsafe {
            if op.write {
                libc::pwrite(fd, op.addr.cast_const().cast(), op.len as usize, offset)
            } else {
                libc::pread(fd, op.addr.cast(), op.len as usize, offset)
            }
        };
        let res = if n < 0 {
            -std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        } else {
            i32::try_from(n).unwrap_or(i32::MAX)
        };
        if done.send((op.id, res)).is_err() {
            return;
        }
    }
}
