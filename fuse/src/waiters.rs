//! Waiter threads: where a transport runs the requests that would have
//! waited on its worker (`sluice_api::wait`). One pool type serves both
//! transports — the `/dev/fuse` session (`session.rs`) and the virtio-fs
//! device (`sluice-vhost`, one pool per connection) — each handing it
//! boxed jobs that answer one request and report back their own way.
//!
//! Every job runs as a second attempt ([`sluice_api::wait::retry`]): it may
//! wait, and the engine knows not to count the request twice. A job is
//! told whether the pool is shutting down: a transport whose replies go to
//! memory that is about to go away (a VM's) then gives the request up,
//! while one that can still answer (`/dev/fuse`) answers it.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A request to run again where waiting is allowed. It gets whether the
/// pool is shutting down.
pub type Job = Box<dyn FnOnce(bool) + Send>;

/// A pool of waiter threads.
#[derive(Debug)]
pub struct Waiters {
    jobs: Mutex<Option<crossbeam_channel::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    closing: Arc<AtomicBool>,
}

impl Waiters {
    /// Starts `count` threads named `{name}-N`.
    pub fn start(name: &str, count: usize) -> io::Result<Waiters> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let closing = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            let rx = rx.clone();
            let closing = closing.clone();
            let t = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    // Everything a waiter runs is a second attempt.
                    let _retry = sluice_api::wait::retry();
                    for job in rx {
                        job(closing.load(Ordering::Acquire));
                    }
                })?;
            threads.push(t);
        }
        Ok(Waiters {
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
            closing,
        })
    }

    /// Hands `job` to a waiter; gives it back once the pool is shut down.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        match &*jobs {
            Some(tx) => tx.send(job).map_err(|e| e.into_inner()),
            None => Err(job),
        }
    }

    /// Ends the pool: every job not yet run runs told the pool is closing,
    /// the running ones finish; returns once every thread has ended, so no
    /// job runs after this.
    pub fn shut_down(&self) {
        self.closing.store(true, Ordering::Release);
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            if t.join().is_err() {
                log::warn!("a waiter thread panicked");
            }
        }
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        self.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn jobs_run_as_second_attempts_that_may_wait() {
        let waiters = Waiters::start("test-wait", 2).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..4 {
            let tx = tx.clone();
            let job: Job = Box::new(move |closing| {
                let may = sluice_api::wait::may_wait().is_ok();
                tx.send((i, closing, may, sluice_api::wait::is_retry()))
                    .unwrap();
            });
            assert!(waiters.submit(job).is_ok());
        }
        let mut got: Vec<_> = (0..4).map(|_| rx.recv().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(
            got,
            (0..4).map(|i| (i, false, true, true)).collect::<Vec<_>>()
        );
        waiters.shut_down();
        assert!(
            waiters.submit(Box::new(|_| {})).is_err(),
            "no job runs after shut_down"
        );
    }

    #[test]
    fn jobs_queued_at_shutdown_are_told_the_pool_is_closing() {
        let waiters = Waiters::start("test-wait", 1).unwrap();
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let first: Job = Box::new(move |_| {
            gate_rx.recv().unwrap();
            r.fetch_add(1, Ordering::AcqRel);
        });
        assert!(waiters.submit(first).is_ok());
        let told = Arc::new(AtomicBool::new(false));
        let t = told.clone();
        let r = ran.clone();
        let second: Job = Box::new(move |closing| {
            t.store(closing, Ordering::Release);
            r.fetch_add(1, Ordering::AcqRel);
        });
        assert!(waiters.submit(second).is_ok());
        // The first job finishes only once shut_down has begun.
        let closing = waiters.closing.clone();
        let releaser = std::thread::spawn(move || {
            while !closing.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            gate_tx.send(()).unwrap();
        });
        waiters.shut_down();
        releaser.join().unwrap();
        assert!(told.load(Ordering::Acquire));
        assert_eq!(ran.load(Ordering::Acquire), 2, "both jobs ran");
    }
}
