//! The io_uring backend: one ring, a sparse registered-file table, a sparse fixed-buffer table
//! and a poll on the inbox eventfd.

use std::io;
use std::os::fd::RawFd;

use io_uring::{IoUring, opcode, squeue, types};

use super::{OpDesc, ReactorError};

/// user_data of the eventfd poll; operation ids are slab indexes far below it.
const WAKE: u64 = u64::MAX;

pub(super) struct UringBackend {
    ring: IoUring,
    wake_fd: RawFd,
    wake_armed: bool,
    single_issuer: bool,
}

impl UringBackend {
    pub(super) fn new(
        entries: u32,
        max_files: u32,
        max_buffers: u32,
        wake_fd: RawFd,
    ) -> io::Result<Self> {
        let entries = entries.clamp(8, 32768);
        let (ring, single_issuer) = match IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(entries * 2)
            .build(entries)
        {
            Ok(ring) => (ring, true),
            // Kernels before 6.1 reject the flags with EINVAL; anything else is final.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (
                IoUring::builder()
                    .setup_cqsize(entries * 2)
                    .build(entries)?,
                false,
            ),
            Err(e) => return Err(e),
        };
        let submitter = ring.submitter();
        if let Err(e) = submitter.register_files_sparse(max_files) {
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
            // Before 5.19: a table of -1 entries is sparse too.
            submitter.register_files(&vec![-1; max_files as usize])?;
        }
        submitter.register_buffers_sparse(max_buffers)?;
        let mut backend = Self {
            ring,
            wake_fd,
            wake_armed: false,
            single_issuer,
        };
        backend.arm_wake()?;
        backend.ring.submit()?;
        Ok(backend)
    }

    /// The ring's optional features, for the log line.
    pub(super) fn features(&self) -> &'static str {
        if self.single_issuer {
            "single issuer, deferred task run, fixed files and buffers"
        } else {
            "fixed files and buffers"
        }
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let entry = opcode::PollAdd::new(types::Fd(self.wake_fd), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        self.push_entry(&entry)?;
        self.wake_armed = true;
        Ok(())
    }

    fn push_entry(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every entry pushed refers to memory that outlives the operation: fixed
            // buffers stay registered (and their memory alive) while operations on them are in
            // flight, which the reactor's inflight counts enforce; a poll has no buffer.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            // The submission queue is full: hand it to the kernel and retry.
            self.ring.submit()?;
        }
    }

    pub(super) fn update_file(&mut self, slot: u32, fd: RawFd) -> Result<(), ReactorError> {
        self.ring
            .submitter()
            .register_files_update(slot, &[fd])
            .map(drop)
            .map_err(|source| ReactorError::Os {
                what: "registering a file with io_uring",
                source,
            })
    }

    /// # Safety
    ///
    /// `addr/len` must stay valid until the slot is cleared and its operations are complete.
    pub(super) unsafe fn update_buffer(
        &mut self,
        slot: u16,
        addr: *mut u8,
        len: usize,
    ) -> io::Result<()> {
        let iov = libc::iovec {
            iov_base: addr.cast(),
            iov_len: len,
        };
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.ring
                .submitter()
                .register_buffers_update(slot.into(), &[iov], None)
        }
    }

    pub(super) fn push(&mut self, op: &OpDesc) -> io::Result<()> {
        let entry = if op.write {
            opcode::WriteFixed::new(types::Fixed(op.slot), op.addr, op.len, op.buffer)
                .offset(op.offset)
                .build()
        } else {
            opcode::ReadFixed::new(types::Fixed(op.slot), op.addr, op.len, op.buffer)
                .offset(op.offset)
                .build()
        };
        self.push_entry(&entry.user_data(op.id))
    }

    pub(super) fn submit(&mut self) -> io::Result<()> {
        transient_ok(self.ring.submit())
    }

    /// Submits what is queued and runs the completions a DEFER_TASKRUN ring deferred to this
    /// thread, without waiting for any: io_uring_enter with GETEVENTS and no minimum (a plain
    /// submit does not run them).
    pub(super) fn submit_and_reap(&mut self) -> io::Result<()> {
        /// `IORING_ENTER_GETEVENTS` of the kernel's uapi (the io-uring crate keeps its copy
        /// private).
        const GETEVENTS: u32 = 1;
        let queued = u32::try_from(self.ring.submission().len()).unwrap_or(u32::MAX);
        // SAFETY: no argument struct is passed; the queued entries were pushed under
        // `push_entry`'s contract.
        let entered = unsafe {
            self.ring
                .submitter()
                .enter::<libc::sigset_t>(queued, 0, GETEVENTS, None)
        };
        transient_ok(entered)
    }

    pub(super) fn register_eventfd(&mut self, fd: RawFd) -> io::Result<()> {
        self.ring.submitter().register_eventfd(fd)
    }

    pub(super) fn wait_one(&mut self) -> io::Result<()> {
        transient_ok(self.ring.submit_and_wait(1))
    }

    pub(super) fn reap(&mut self, done: &mut Vec<(u64, i32)>) {
        let mut woke = false;
        for cqe in self.ring.completion() {
            if cqe.user_data() == WAKE {
                woke = true;
            } else {
                done.push((cqe.user_data(), cqe.result()));
            }
        }
        if woke {
            self.wake_armed = false;
            super::drain_eventfd(self.wake_fd);
        }
        if !self.wake_armed
            && let Err(e) = self.arm_wake()
        {
            log::warn!("cannot re-arm the reactor's wake-up poll: {e}");
        }
    }
}

/// io_uring_enter's transient failures are not errors for the reactor: EBUSY/EAGAIN mean
/// completions are backed up (they are reaped next; unsubmitted SQEs stay queued), EINTR a
/// signal. The caller's loop simply comes round again.
fn transient_ok(result: io::Result<usize>) -> io::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EBUSY | libc::EAGAIN | libc::EINTR)
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}
