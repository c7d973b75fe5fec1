//! Whether the calling thread may wait.
//!
//! A transport's worker thread (a virtio-fs queue worker) answers what it
//! can answer at once and hands everything that has to wait — an object
//! store GET, a disk-cache read, a metadata round trip, a commit — to
//! threads that may wait, so one slow request never holds up the cheap ones
//! queued behind it. It marks the attempt with [`no_wait`]; the file system
//! calls [`may_wait`] right before each step that could wait and, under the
//! mark, fails with [`Error::WouldBlock`] instead of waiting. The transport
//! then runs the same request again on a thread that may wait, marked with
//! [`retry`], so that side effects the first attempt already had (the
//! readahead window it moved, the prefetch it queued) are not repeated.
//!
//! The mark is per thread and undone when its guard drops; a file system
//! that never calls [`may_wait`] simply waits where it always did.
//!
//! Only operations whose first attempt has no side effect that a second
//! run would repeat wrongly may fail with `WouldBlock` (reads; never a
//! create, a rename or a write): an operation checks before its first
//! change, or not at all.

use std::cell::Cell;

use crate::error::{Error, Result};

/// How the current thread runs file-system operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Waiting is fine (any thread that is not a transport's worker).
    #[default]
    Wait,
    /// Waiting is not allowed: fail with [`Error::WouldBlock`] instead.
    NoWait,
    /// Waiting is fine, and this is the second run of an operation whose
    /// first run (under [`Mode::NoWait`]) failed with `WouldBlock`.
    Retry,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::Wait) };
}

/// The current thread's mode until the guard drops.
#[derive(Debug)]
#[must_use = "the mode lasts only as long as the guard"]
pub struct ModeGuard {
    before: Mode,
}

impl Drop for ModeGuard {
    fn drop(&mut self) {
        MODE.with(|m| m.set(self.before));
    }
}

fn enter(mode: Mode) -> ModeGuard {
    ModeGuard {
        before: MODE.with(|m| m.replace(mode)),
    }
}

/// Marks the current thread as one that must not wait, until the guard
/// drops.
pub fn no_wait() -> ModeGuard {
    enter(Mode::NoWait)
}

/// Lets the current thread wait until the guard drops (an operation a
/// worker runs inline rather than hand on).
pub fn allow_wait() -> ModeGuard {
    enter(Mode::Wait)
}

/// Marks the current thread as running the second attempt of an operation
/// that would have waited, until the guard drops.
pub fn retry() -> ModeGuard {
    enter(Mode::Retry)
}

/// The current thread's mode.
pub fn mode() -> Mode {
    MODE.with(Cell::get)
}

/// `Err(Error::WouldBlock)` when the current thread must not wait; call it
/// right before a step that may wait.
pub fn may_wait() -> Result<()> {
    if mode() == Mode::NoWait {
        Err(Error::WouldBlock)
    } else {
        Ok(())
    }
}

/// Whether this is the second attempt of an operation (see [`retry`]).
pub fn is_retry() -> bool {
    mode() == Mode::Retry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_sets_the_mode_and_restores_the_one_before() {
        assert_eq!(mode(), Mode::Wait);
        assert!(may_wait().is_ok());
        {
            let _outer = no_wait();
            assert!(matches!(may_wait(), Err(Error::WouldBlock)));
            {
                let _inner = retry();
                assert!(may_wait().is_ok());
                assert!(is_retry());
            }
            assert!(matches!(may_wait(), Err(Error::WouldBlock)));
        }
        assert_eq!(mode(), Mode::Wait);
        // Another thread starts in its own default mode.
        let _g = no_wait();
        std::thread::spawn(|| assert_eq!(mode(), Mode::Wait))
            .join()
            .unwrap();
    }
}
