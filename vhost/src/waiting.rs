//! Requests that wait, off the queue workers.
//!
//! A queue worker answers every request it can answer without waiting and
//! publishes it with its batch. A request that would wait — a READ whose
//! block is not in the memory cache, an FSYNC, a FLUSH — fails its first run
//! with `WouldBlock` (the worker runs it under [`sluice_api::wait::no_wait`])
//! and is handed on, with its descriptor chain, to a waiter thread of the
//! device ([`Waiters`]). The waiter runs it again where it may wait, writing
//! the reply straight into the chain's buffers, and hands the chain back to
//! the queue ([`Parked::complete`]): the completion goes on the queue's list
//! and the queue's eventfd wakes its worker, which returns every finished
//! chain to the used ring under one lock and signals the guest once.
//!
//! Bounds: a queue has at most [`crate::DeviceConfig::max_waiting`] chains
//! handed on and not yet returned; a worker that reaches the bound stops
//! taking chains off the ring (they stay there, the guest's back-pressure)
//! until a completion wakes it. The waiter threads are the device's, at most
//! [`crate::DeviceConfig::waiters`], and end with the connection.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use log::warn;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

/// A chain a waiter finished: its head, the bytes written into it, and when
/// the worker took it off the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    pub head: u16,
    pub used: u32,
    pub popped: Instant,
}

#[derive(Debug, Default)]
struct ParkedState {
    /// Chains handed to waiters and not finished.
    running: usize,
    /// Chains finished and not yet returned to the used ring.
    done: Vec<Completion>,
}

/// One queue's chains that are with the waiters.
#[derive(Debug)]
pub(crate) struct Parked {
    state: Mutex<ParkedState>,
    /// Signalled whenever a chain finishes (for [`Parked::drain`]).
    finished: Condvar,
    /// Written when a chain finishes; the queue's worker polls it.
    event: EventFd,
}

impl Parked {
    pub fn new() -> io::Result<Parked> {
        Ok(Parked {
            state: Mutex::new(ParkedState::default()),
            finished: Condvar::new(),
            event: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// The eventfd the queue's worker polls.
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        self.event.as_raw_fd()
    }

    fn lock(&self) -> MutexGuard<'_, ParkedState> {
        // Nothing panics while holding it; a poisoned lock still holds
        // consistent counts.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Chains handed on and not yet returned to the ring.
    pub fn outstanding(&self) -> usize {
        let s = self.lock();
        s.running + s.done.len()
    }

    /// Counts a chain as handed on.
    pub fn hand_on(&self) {
        self.lock().running += 1;
    }

    /// A waiter finished a chain (or dropped it, `None`, at the end of the
    /// connection): queue it for the worker and wake the worker.
    pub fn complete(&self, done: Option<Completion>) {
        let mut s = self.lock();
        s.running = s.running.saturating_sub(1);
        if let Some(c) = done {
            s.done.push(c);
        }
        // The worker's wake-up is written before the chain can be seen
        // finished: whoever `drain` or `wait_idle` lets go may rely on it.
        if let Err(e) = self.event.write(1) {
            warn!("cannot wake a queue worker: {e}");
        }
        drop(s);
        self.finished.notify_all();
    }

    /// A chain the worker itself finished (its reads on the worker's ring
    /// are done): queued for the worker's next publication without writing
    /// the eventfd, since the worker is awake.
    pub fn complete_here(&self, done: Completion) {
        let mut s = self.lock();
        s.running = s.running.saturating_sub(1);
        s.done.push(done);
        drop(s);
        self.finished.notify_all();
    }

    /// Takes the finished chains (the worker, woken by the eventfd). The
    /// worker resets the eventfd ([`Parked::clear_event`]) and reaps its
    /// ring before: a completion after the reset writes it again.
    pub fn take_done(&self, into: &mut Vec<Completion>) {
        into.append(&mut self.lock().done);
    }

    /// Resets the eventfd (a wake-up with nothing to do).
    pub fn clear_event(&self) {
        let _ = self.event.read();
    }

    /// Waits until no chain of this queue is with a waiter; the finished
    /// ones stay for the worker (DESTROY must not overtake a RELEASE).
    pub fn wait_idle(&self) {
        let mut s = self.lock();
        while s.running > 0 {
            s = self.finished.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits until no chain is with a waiter and takes the finished ones:
    /// the ring is being stopped (GET_VRING_BASE) and must not change after.
    pub fn drain(&self, into: &mut Vec<Completion>) {
        let mut s = self.lock();
        while s.running > 0 {
            s = self.finished.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        into.append(&mut s.done);
    }
}

/// The device's waiter threads: the pool the host mount uses too. A job
/// told the connection is closing only gives its chain up.
pub(crate) use sluice_fuse::waiters::{Job, Waiters};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn completions_wake_the_worker_and_drain_waits_for_running_chains() {
        let parked = Arc::new(Parked::new().unwrap());
        let waiters = Waiters::start("vfs-wait", 2).unwrap();
        let now = Instant::now();
        for head in 0..4u16 {
            parked.hand_on();
            let p = parked.clone();
            let job: Job = Box::new(move |closing| {
                assert!(!closing);
                // A waiter may wait.
                assert!(sluice_api::wait::may_wait().is_ok());
                std::thread::sleep(std::time::Duration::from_millis(5));
                p.complete(Some(Completion {
                    head,
                    used: u32::from(head) * 10,
                    popped: now,
                }));
            });
            assert!(waiters.submit(job).is_ok());
        }
        let mut done = Vec::new();
        parked.drain(&mut done);
        done.sort_by_key(|c| c.head);
        assert_eq!(
            done.iter().map(|c| c.used).collect::<Vec<_>>(),
            [0, 10, 20, 30]
        );
        assert_eq!(parked.outstanding(), 0);
        // The eventfd was written; the worker resets it before taking.
        parked.clear_event();
        let mut more = Vec::new();
        parked.take_done(&mut more);
        assert!(more.is_empty());
        assert!(parked.event.read().is_err(), "the eventfd was reset");
        waiters.shut_down();
        let job: Job = Box::new(|_| {});
        assert!(
            waiters.submit(job).is_err(),
            "no waiter runs after shut_down"
        );
    }
}
