//! Session and open-file rules written once (JuiceFS's): how long a
//! session lives without a heartbeat, the heartbeat thread, and what
//! deleting a file kept for an open handle does, over the storage
//! primitives each engine gives in a transaction ([`SessionTx`]).
//!
//! What stays per engine: how sessions, their open files and their locks
//! are recorded (rows in SQLite; sorted sets and hashes in Redis, where an
//! open file is recorded in `open{ino}` for other hosts to see and a last
//! close's record is deferred to save round trips).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::Error;
use crate::meta::namespace::NsTx;
use crate::meta::rules::align4k;
use crate::meta::{FileType, Ino, Timestamp};

/// How often the session's expiry is pushed forward (JuiceFS: 12 s).
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(12);
/// How long a session outlives its last heartbeat (JuiceFS: 5 heartbeats).
pub(crate) const SESSION_TTL_SECS: i64 = 60;
/// Removed files whose data is still there after this long were abandoned
/// by a crashed client (JuiceFS waits an hour too).
pub(crate) const DELFILE_GRACE_SECS: i64 = 3600;

/// When a session heartbeating now expires (unix seconds).
pub(crate) fn expire_at() -> i64 {
    Timestamp::now().secs + SESSION_TTL_SECS
}

/// The background heartbeat of a session: a thread that calls its beat
/// every [`HEARTBEAT`] until stopped (or until the beat says the engine is
/// gone).
#[derive(Debug)]
pub(crate) struct Heartbeat {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: std::thread::JoinHandle<()>,
}

impl Heartbeat {
    /// Starts the heartbeat of session `sid`; `beat` returns false once
    /// the engine it beats for is gone.
    pub(crate) fn start(
        sid: u64,
        mut beat: impl FnMut() -> bool + Send + 'static,
    ) -> Result<Heartbeat, Error> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("sluice-session-{sid}"))
            .spawn(move || {
                let (lock, cvar) = &*stop2;
                loop {
                    {
                        let mut stopped = lock.lock();
                        if !*stopped {
                            cvar.wait_for(&mut stopped, HEARTBEAT);
                        }
                        if *stopped {
                            return;
                        }
                    }
                    if !beat() {
                        return;
                    }
                }
            })
            .map_err(Error::Io)?;
        Ok(Heartbeat { stop, thread })
    }

    /// Stops the thread and waits for it (unless called from it).
    pub(crate) fn stop(self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if self.thread.thread().id() != std::thread::current().id() {
            let _ = self.thread.join();
        }
    }
}

/// What deleting a kept file needs of an engine inside one transaction,
/// beyond the namespace's primitives.
pub(crate) trait SessionTx: NsTx {
    /// Session `sid` no longer keeps `ino` (its record of the file kept
    /// for its open handle, and of the handle itself, go).
    fn forget_kept(&mut self, sid: u64, ino: Ino) -> Result<(), Self::Error>;
    /// Whether a live session other than `sid` still holds `ino` open
    /// (where the engine records other clients' opens; else false).
    fn held_elsewhere(&mut self, sid: u64, ino: Ino) -> Result<bool, Self::Error>;
    /// The file `ino` of `length` bytes is gone: its data is deleted after
    /// the commit (recorded first, so a crash leaves it for cleanup).
    fn delete_data_later(&mut self, ino: Ino, length: u64) -> Result<(), Self::Error>;
}

/// Deletes a file kept for an open handle of session `sid` after its last
/// link went (JuiceFS `doDeleteSustainedInode`), unless it was linked
/// again meanwhile or another live session still holds it open (that one
/// deletes it on its last close).
pub(crate) fn delete_kept<T: SessionTx>(tx: &mut T, sid: u64, ino: Ino) -> Result<(), T::Error> {
    tx.forget_kept(sid, ino)?;
    let Some(a) = tx.node(ino)? else {
        return Ok(());
    };
    if a.nlink > 0 || a.typ != FileType::File || tx.held_elsewhere(sid, ino)? {
        return Ok(());
    }
    tx.delete_data_later(ino, a.length)?;
    tx.delete_node(ino)?;
    tx.add_usage(-align4k(a.length), -1)
}
