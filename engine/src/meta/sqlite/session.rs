//! Client sessions (`jfs_session2`, heartbeat), files held open across an
//! unlink (`jfs_sustained`), and background cleanup: stale sessions, removed
//! files' data, the expired trash and slices whose deletion failed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rusqlite::params;

use super::namespace;
use super::{Inner, TxResult, counter};
use crate::error::{Error, Result};
use crate::meta::session::{self, DELFILE_GRACE_SECS, Heartbeat, SessionTx, expire_at};
use crate::meta::session_info::session_info;
use crate::meta::trash::{self, TrashOps};
use crate::meta::{Ino, ReleasedSlice, Timestamp};

/// Registers a session and starts its heartbeat.
pub(super) fn new_session(inner: &Arc<Inner>, info: &str) -> Result<u64> {
    inner.format()?;
    if inner.sid.load(Ordering::Relaxed) != 0 {
        return Err(Error::Invalid("this client has a session already".into()));
    }
    let info = session_info(info);
    let sid = inner.write(|tx| {
        let sid = super::incr_counter(tx, counter::NEXT_SESSION, 1)?;
        tx.execute(
            "INSERT INTO jfs_session2 (sid, expire, info) VALUES (?,?,?)",
            params![sid, expire_at(), info.as_bytes()],
        )?;
        Ok(sid as u64)
    })?;
    inner.sid.store(sid, Ordering::Relaxed);
    let weak = Arc::downgrade(inner);
    let hb = Heartbeat::start(sid, move || {
        let Some(inner) = weak.upgrade() else {
            return false;
        };
        beat(&inner, sid, &info);
        true
    })?;
    *inner.heartbeat.lock() = Some(hb);
    Ok(sid)
}

/// One heartbeat: the session's expiry pushed forward (registered again
/// if another client cleaned it up as stale), the limits reloaded.
fn beat(inner: &Inner, sid: u64, info: &str) {
    let r = inner.write(|tx| {
        let n = tx.execute(
            "UPDATE jfs_session2 SET expire=? WHERE sid=?",
            params![expire_at(), sid as i64],
        )?;
        if n == 0 {
            log::warn!("session {sid} was cleaned up as stale; registering it again");
            tx.execute(
                "INSERT INTO jfs_session2 (sid, expire, info) VALUES (?,?,?)",
                params![sid as i64, expire_at(), info.as_bytes()],
            )?;
        }
        Ok(())
    });
    if let Err(e) = r {
        log::warn!("session {sid} heartbeat failed: {e}");
    }
    if let Err(e) = inner.reload_quotas() {
        log::warn!("reloading the volume's limits and quotas failed: {e}");
    }
}

impl Inner {
    /// Stops the heartbeat thread, if one runs.
    pub(super) fn stop_heartbeat(&self) {
        let hb = self.heartbeat.lock().take();
        if let Some(hb) = hb {
            hb.stop();
        }
    }
}

/// Ends this client's session: files it kept open past their unlink are
/// deleted, then the session row goes.
pub(super) fn close_session(inner: &Inner) -> Result<()> {
    inner.stop_heartbeat();
    let sid = inner.sid.swap(0, Ordering::Relaxed);
    if sid == 0 {
        return Ok(());
    }
    let (removed, _) = inner.open_files.lock().take_all();
    for ino in removed {
        delete_sustained(inner, sid, ino)?;
    }
    clean_session(inner, sid)
}

/// Releases what session `sid` held and removes it.
fn clean_session(inner: &Inner, sid: u64) -> Result<()> {
    let sustained: Vec<Ino> = inner.read(|c| {
        let mut stmt = c.prepare("SELECT inode FROM jfs_sustained WHERE sid=?")?;
        let rows = stmt.query_map(params![sid as i64], |r| r.get::<_, i64>(0))?;
        Ok(rows
            .map(|r| r.map(|v| v as u64))
            .collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    for ino in sustained {
        delete_sustained(inner, sid, ino)?;
    }
    inner.write(|tx| {
        tx.execute("DELETE FROM jfs_flock WHERE sid=?", params![sid as i64])?;
        tx.execute("DELETE FROM jfs_plock WHERE sid=?", params![sid as i64])?;
        tx.execute("DELETE FROM jfs_sustained WHERE sid=?", params![sid as i64])?;
        tx.execute("DELETE FROM jfs_session2 WHERE sid=?", params![sid as i64])?;
        Ok(())
    })
}

/// Deletes a file kept for an open handle of session `sid` after its last
/// link went ([`session::delete_kept`]).
fn delete_sustained(inner: &Inner, sid: u64, ino: Ino) -> Result<()> {
    inner.write(|tx| session::delete_kept(&mut namespace::Ns::new(tx, inner), sid, ino))
}

/// The session rules' view of a SQLite transaction (`meta/session.rs`).
impl SessionTx for namespace::Ns<'_, '_> {
    fn forget_kept(&mut self, sid: u64, ino: Ino) -> TxResult<()> {
        self.tx.execute(
            "DELETE FROM jfs_sustained WHERE sid=? AND inode=?",
            params![sid as i64, ino as i64],
        )?;
        Ok(())
    }
    fn held_elsewhere(&mut self, _sid: u64, _ino: Ino) -> TxResult<bool> {
        // JuiceFS's SQL schema records opens only as kept files
        // (`jfs_sustained`), written by the session whose unlink kept one.
        Ok(false)
    }
    fn delete_data_later(&mut self, ino: Ino, length: u64) -> TxResult<()> {
        self.tx.execute(
            "INSERT OR REPLACE INTO jfs_delfile (inode, length, expire) VALUES (?,?,?)",
            params![ino as i64, length as i64, Timestamp::now().secs],
        )?;
        self.tx.post.deleted_files.push(ino);
        Ok(())
    }
}

/// Records one more open handle on `ino`.
pub(super) fn opened(inner: &Inner, ino: Ino) {
    inner.open_files.lock().open(ino);
}

/// Records a close; the last close of a file unlinked while open deletes it.
pub(super) fn closed(inner: &Inner, ino: Ino) -> Result<()> {
    let Some(delete) = inner.open_files.lock().close(ino)? else {
        return Ok(());
    };
    if delete {
        delete_sustained(inner, inner.sid.load(Ordering::Relaxed), ino)?;
    }
    Ok(())
}

/// Called inside the transaction that drops a file's last link: if this
/// client holds it open, it is marked to go on the last close instead.
pub(super) fn mark_removed_if_open(inner: &Inner, ino: Ino) -> bool {
    inner.open_files.lock().mark_removed(ino)
}

/// Background maintenance (JuiceFS's hourly jobs, run when called).
pub(super) fn cleanup(inner: &Inner, trash: &dyn TrashOps) -> Result<()> {
    let fmt = inner.format()?;
    let now = Timestamp::now().secs;
    // Sessions whose client stopped heartbeating.
    let stale: Vec<u64> = inner.read(|c| {
        let mut stmt = c.prepare("SELECT sid FROM jfs_session2 WHERE expire < ?")?;
        let rows = stmt.query_map(params![now], |r| r.get::<_, i64>(0))?;
        Ok(rows
            .map(|r| r.map(|v| v as u64))
            .collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    for sid in stale {
        if sid != inner.sid.load(Ordering::Relaxed) {
            log::info!("cleaning up stale session {sid}");
            clean_session(inner, sid)?;
        }
    }
    // Removed files whose data a crashed client left behind.
    let files: Vec<Ino> = inner.read(|c| {
        let mut stmt = c.prepare("SELECT inode FROM jfs_delfile WHERE expire < ?")?;
        let rows = stmt.query_map(params![now - DELFILE_GRACE_SECS], |r| r.get::<_, i64>(0))?;
        Ok(rows
            .map(|r| r.map(|v| v as u64))
            .collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    for ino in files {
        inner.delete_file_data(ino)?;
    }
    // A trash left from when TrashDays was larger still empties (as JuiceFS).
    match trash::empty_before(trash, now - (24 * i64::from(fmt.trash_days) + 2) * 3600) {
        Ok(()) | Err(Error::NotFound) => {}
        Err(e) => return Err(e),
    }
    cleanup_delayed_slices(inner, now - i64::from(fmt.trash_days) * 86_400)?;
    // Slices whose objects could not be deleted before.
    let pending: Vec<ReleasedSlice> = inner.read(|c| {
        let mut stmt = c.prepare("SELECT chunkid, size FROM jfs_chunk_ref WHERE refs <= 0")?;
        let rows = stmt.query_map([], |r| {
            Ok(ReleasedSlice {
                id: r.get::<_, i64>(0)? as u64,
                size: r.get::<_, i64>(1)? as u32,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    inner.release_slices(&pending);
    Ok(())
}

/// Drops the references compaction kept for the trash once they expire.
fn cleanup_delayed_slices(inner: &Inner, edge: i64) -> Result<()> {
    let keys: Vec<i64> = inner.read(|c| {
        let mut stmt = c.prepare("SELECT chunkid FROM jfs_delslices WHERE deleted < ?")?;
        let rows = stmt.query_map(params![edge], |r| r.get::<_, i64>(0))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    })?;
    for key in keys {
        inner.write(|tx| -> TxResult<()> {
            let blob: Option<Vec<u8>> = rusqlite::OptionalExtension::optional(tx.query_row(
                "SELECT slices FROM jfs_delslices WHERE chunkid=?",
                params![key],
                |r| r.get(0),
            ))?;
            let Some(blob) = blob else { return Ok(()) };
            let mut released = Vec::new();
            for rec in blob.chunks_exact(12) {
                let mut id = [0u8; 8];
                id.copy_from_slice(&rec[..8]);
                let id = u64::from_be_bytes(id);
                let size = u32::from_be_bytes([rec[8], rec[9], rec[10], rec[11]]);
                tx.execute(
                    "UPDATE jfs_chunk_ref SET refs=refs-1 WHERE chunkid=? AND size=?",
                    params![id as i64, size],
                )?;
                let refs: Option<i64> = rusqlite::OptionalExtension::optional(tx.query_row(
                    "SELECT refs FROM jfs_chunk_ref WHERE chunkid=?",
                    params![id as i64],
                    |r| r.get(0),
                ))?;
                if refs.is_some_and(|r| r <= 0) {
                    released.push(ReleasedSlice { id, size });
                }
            }
            tx.execute("DELETE FROM jfs_delslices WHERE chunkid=?", params![key])?;
            tx.post.released.extend(released);
            Ok(())
        })?;
    }
    Ok(())
}
