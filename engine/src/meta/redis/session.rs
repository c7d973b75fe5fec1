//! Client sessions on Redis (`allSessions` zset scored by expiry,
//! `sessionInfos`, `session{sid}` for files kept open past their unlink),
//! the heartbeat, and background cleanup.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::keys::{counter, parse_slice_field};
use super::tx::{Tx, TxResult};
use super::{Inner, namespace};
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
    let next = inner.keys.counter(counter::NEXT_SESSION);
    let sid: i64 = inner
        .pool
        .with_conn(|c| redis::cmd("INCR").arg(&next).query(c))?;
    let sid = sid as u64;
    register(inner, sid, &info)?;
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

/// Writes (or refreshes) a session's expiry and description.
fn register(inner: &Inner, sid: u64, info: &str) -> Result<()> {
    let all = inner.keys.all_sessions();
    let infos = inner.keys.session_infos();
    inner.pool.with_conn(|c| {
        redis::pipe()
            .cmd("ZADD")
            .arg(&all)
            .arg(expire_at())
            .arg(sid)
            .cmd("HSET")
            .arg(&infos)
            .arg(sid)
            .arg(info)
            .query::<()>(c)
    })
}

/// One heartbeat: the session's expiry pushed forward (registered again
/// if another client cleaned it up as stale), deferred closes recorded,
/// the limits reloaded.
fn beat(inner: &Inner, sid: u64, info: &str) {
    let infos = inner.keys.session_infos();
    let r = inner
        .pool
        .with_conn(|c| redis::cmd("HEXISTS").arg(&infos).arg(sid).query::<bool>(c))
        .and_then(|known| {
            if !known {
                log::warn!("session {sid} was cleaned up as stale; registering it again");
            }
            register(inner, sid, info)
        });
    if let Err(e) = r {
        log::warn!("session {sid} heartbeat failed: {e}");
    }
    if let Err(e) = flush_closes(inner) {
        log::warn!("session {sid}: recording closed files failed (tried again later): {e}");
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
/// deleted, then the session goes.
pub(super) fn close_session(inner: &Inner) -> Result<()> {
    inner.stop_heartbeat();
    flush_closes(inner)?;
    let sid = inner.sid.swap(0, Ordering::Relaxed);
    if sid == 0 {
        return Ok(());
    }
    let (removed, open) = inner.open_files.lock().take_all();
    for ino in removed {
        delete_sustained(inner, sid, ino)?;
    }
    for ino in open {
        let key = inner.keys.opened(ino);
        inner
            .pool
            .with_conn(|c| redis::cmd("HDEL").arg(&key).arg(sid).query::<()>(c))?;
    }
    clean_session(inner, sid)
}

/// Releases what session `sid` held and removes it (JuiceFS
/// `doCleanStaleSession`).
fn clean_session(inner: &Inner, sid: u64) -> Result<()> {
    let locked = inner.keys.locked(sid);
    let lock_keys: Vec<String> = inner
        .pool
        .with_conn(|c| redis::cmd("SMEMBERS").arg(&locked).query(c))?;
    let owner_prefix = format!("{sid}_");
    for lk in lock_keys {
        let owners: Vec<String> = inner
            .pool
            .with_conn(|c| redis::cmd("HKEYS").arg(&lk).query(c))?;
        let mine: Vec<&String> = owners
            .iter()
            .filter(|o| o.starts_with(&owner_prefix))
            .collect();
        inner.pool.with_conn(|c| {
            if !mine.is_empty() {
                redis::cmd("HDEL").arg(&lk).arg(&mine).query::<()>(c)?;
            }
            redis::cmd("SREM").arg(&locked).arg(&lk).query::<()>(c)
        })?;
    }
    let key = inner.keys.sustained(sid);
    let sustained: Vec<u64> = inner
        .pool
        .with_conn(|c| redis::cmd("SMEMBERS").arg(&key).query(c))?;
    for ino in sustained {
        delete_sustained(inner, sid, ino)?;
    }
    let (infos, all) = (inner.keys.session_infos(), inner.keys.all_sessions());
    inner.pool.with_conn(|c| {
        redis::pipe()
            .cmd("DEL")
            .arg(&key)
            .arg(&locked)
            .cmd("HDEL")
            .arg(&infos)
            .arg(sid)
            .cmd("ZREM")
            .arg(&all)
            .arg(sid)
            .query::<()>(c)
    })
}

/// Deletes a file kept for an open handle of session `sid` after its last
/// link went ([`session::delete_kept`]).
fn delete_sustained(inner: &Inner, sid: u64, ino: Ino) -> Result<()> {
    inner.write(ino, |tx| {
        session::delete_kept(&mut namespace::Ns::new(tx, inner), sid, ino)
    })
}

/// The session rules' view of a Redis transaction (`meta/session.rs`).
impl SessionTx for namespace::Ns<'_, '_> {
    fn forget_kept(&mut self, sid: u64, ino: Ino) -> TxResult<()> {
        let key = self.tx.keys.sustained(sid);
        let mut c = redis::cmd("SREM");
        c.arg(&key).arg(ino.to_string());
        self.tx.cmd(c);
        let opened = self.tx.keys.opened(ino);
        self.tx.hdel(&opened, sid.to_string().as_bytes());
        Ok(())
    }
    fn held_elsewhere(&mut self, sid: u64, ino: Ino) -> TxResult<bool> {
        Ok(!other_holders(self.tx, self.inner, sid, ino)?.is_empty())
    }
    fn delete_data_later(&mut self, ino: Ino, length: u64) -> TxResult<()> {
        let opened = self.tx.keys.opened(ino);
        self.tx.del(&opened);
        let del = self.tx.keys.delfiles();
        let mut c = redis::cmd("ZADD");
        c.arg(&del)
            .arg(Timestamp::now().secs)
            .arg(format!("{ino}:{length}"));
        self.tx.cmd(c);
        self.tx.post.deleted_files.push((ino, length));
        Ok(())
    }
}

/// Records one more open handle on `ino`. The first one of this session is
/// also recorded in Redis (`open{ino}`), so that an unlink on another host
/// keeps the file until this session closes it. `attr_key` (the node's)
/// is read in the same round trip, after the record (so an unlink elsewhere
/// either sees this open or has removed the node before it is read);
/// returns its value when read.
pub(super) fn opened(
    inner: &Inner,
    ino: Ino,
    read: Option<&[String]>,
) -> Result<Option<Vec<Option<Vec<u8>>>>> {
    let sid = inner.sid.load(Ordering::Relaxed);
    // Serialises this session's first open and the record of its last
    // close of `ino`, so that their records in Redis land in the order the
    // counts changed.
    let _stripe = inner.stripes[(ino % super::STRIPES as u64) as usize].lock();
    let first = inner.open_files.lock().open(ino);
    if !(first && sid > 0) {
        return match read {
            Some(keys) => inner
                .pool
                .with_conn(|c| redis::cmd("MGET").arg(keys).query(c))
                .map(Some),
            None => Ok(None),
        };
    }
    let key = inner.keys.opened(ino);
    let r = inner.pool.with_conn(|c| {
        let mut p = redis::pipe();
        p.cmd("HSET").arg(&key).arg(sid).arg(1).ignore();
        match read {
            Some(keys) => {
                p.cmd("MGET").arg(keys);
                let (v,): (Vec<Option<Vec<u8>>>,) = p.query(c)?;
                Ok(Some(v))
            }
            None => p.query::<()>(c).map(|()| None),
        }
    });
    if r.is_err() {
        // Undo the count; the open failed, so nothing is deleted.
        let _ = inner.open_files.lock().close(ino);
    }
    r
}

/// Records a file this session just created as open (its first open),
/// when the creating transaction already wrote the record.
pub(super) fn created_open(inner: &Inner, ino: Ino) {
    inner.open_files.lock().open(ino);
}

/// The most closes whose records wait to be sent; more are sent at once,
/// on the closing thread.
const MAX_DEFERRED_CLOSES: usize = 4096;

/// Records a close; the last close of a file unlinked while open — here or
/// on another host — deletes it. The record of a last close (the removal of
/// this session from `open{ino}`, and the check whether another host's
/// unlink kept the file for it) costs a round trip, so it is deferred:
/// records of many closes go in one pipeline at the next heartbeat, at the
/// end of the session, or when [`MAX_DEFERRED_CLOSES`] wait. Until then an
/// unlink elsewhere takes the file for still open here and keeps it for
/// this session (`session{sid}`); the deferred record finds that and
/// deletes it then. A file this session's own unlink kept is deleted at
/// once.
pub(super) fn closed(inner: &Inner, ino: Ino) -> Result<()> {
    let sid = inner.sid.load(Ordering::Relaxed);
    let removed = {
        let _stripe = inner.stripes[(ino % super::STRIPES as u64) as usize].lock();
        let Some(removed) = inner.open_files.lock().close(ino)? else {
            return Ok(());
        };
        removed
    };
    if removed {
        return delete_sustained(inner, sid, ino);
    }
    if sid == 0 {
        return Ok(());
    }
    let full = {
        let mut pending = inner.closes.lock();
        pending.push(ino);
        pending.len() >= MAX_DEFERRED_CLOSES
    };
    if full {
        flush_closes(inner)?;
    }
    Ok(())
}

/// Sends the records of the closes [`closed`] deferred, in pipelines of up
/// to 1024 files; deletes the files another host's unlink kept for this
/// session. A file opened again here meanwhile keeps its record. On a
/// failure the records not sent wait for the next try.
pub(super) fn flush_closes(inner: &Inner) -> Result<()> {
    let sid = inner.sid.load(Ordering::Relaxed);
    loop {
        let batch: Vec<Ino> = {
            let mut pending = inner.closes.lock();
            let n = pending.len().min(1024);
            pending.drain(..n).collect()
        };
        if batch.is_empty() || sid == 0 {
            return Ok(());
        }
        // The stripes of the batch, in order (no deadlock with a thread
        // holding one): an open of one of these files waits until its
        // record is settled.
        let mut stripes: Vec<usize> = batch
            .iter()
            .map(|i| (i % super::STRIPES as u64) as usize)
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let guards: Vec<_> = stripes.iter().map(|s| inner.stripes[*s].lock()).collect();
        let closed: Vec<Ino> = {
            let open = inner.open_files.lock();
            let mut v: Vec<Ino> = batch
                .iter()
                .copied()
                .filter(|i| !open.is_open(*i))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let kept = inner.keys.sustained(sid);
        let sent = inner.pool.with_conn(|c| {
            let mut p = redis::pipe();
            for ino in &closed {
                p.cmd("HDEL").arg(inner.keys.opened(*ino)).arg(sid).ignore();
                p.cmd("SISMEMBER").arg(&kept).arg(*ino);
            }
            p.query::<Vec<bool>>(c)
        });
        drop(guards);
        let members = match sent {
            Ok(m) => m,
            Err(e) => {
                inner.closes.lock().extend(batch);
                return Err(e);
            }
        };
        for (ino, sustained) in closed.iter().zip(members) {
            if sustained {
                delete_sustained(inner, sid, *ino)?;
            }
        }
    }
}

/// The live sessions other than `sid` that hold `ino` open, as recorded in
/// `open{ino}` (watched: an open elsewhere restarts the transaction). This
/// client's own session counts only while it holds the file open: its
/// record of a last close may not be sent yet ([`closed`]).
pub(super) fn other_holders(
    tx: &mut Tx<'_>,
    inner: &Inner,
    sid: u64,
    ino: Ino,
) -> TxResult<Vec<u64>> {
    let local = inner.sid.load(Ordering::Relaxed);
    let open_here = inner.open_files.lock().is_open(ino);
    let key = tx.keys.opened(ino);
    let fields = tx.hgetall(&key)?;
    let all = tx.keys.all_sessions();
    let now = Timestamp::now().secs as f64;
    let mut out = Vec::new();
    for (f, _) in fields {
        let Some(s) = std::str::from_utf8(&f)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        if s == sid || (s == local && !open_here) {
            continue;
        }
        let expiry: Option<f64> = tx.now(redis::cmd("ZSCORE").arg(&all).arg(s))?;
        if expiry.is_some_and(|e| e >= now) {
            out.push(s);
        }
    }
    Ok(out)
}

/// Called inside the transaction that drops a file's last link: if this
/// client holds it open, it is marked to go on the last close instead.
pub(super) fn mark_removed_if_open(inner: &Inner, ino: Ino) -> bool {
    inner.open_files.lock().mark_removed(ino)
}

/// Background maintenance (JuiceFS's periodic jobs, run when called).
pub(super) fn cleanup(inner: &Inner, trash: &dyn TrashOps) -> Result<()> {
    let fmt = inner.format()?;
    let now = Timestamp::now().secs;
    // Sessions whose client stopped heartbeating.
    let all = inner.keys.all_sessions();
    let stale: Vec<u64> = inner.pool.with_conn(|c| {
        redis::cmd("ZRANGEBYSCORE")
            .arg(&all)
            .arg("-inf")
            .arg(now)
            .arg("LIMIT")
            .arg(0)
            .arg(100)
            .query(c)
    })?;
    for sid in stale {
        if sid != inner.sid.load(Ordering::Relaxed) {
            log::info!("cleaning up stale session {sid}");
            clean_session(inner, sid)?;
        }
    }
    // Removed files whose data a crashed client left behind.
    let del = inner.keys.delfiles();
    let files: Vec<String> = inner.pool.with_conn(|c| {
        redis::cmd("ZRANGEBYSCORE")
            .arg(&del)
            .arg("-inf")
            .arg(now - DELFILE_GRACE_SECS)
            .arg("LIMIT")
            .arg(0)
            .arg(1000)
            .query(c)
    })?;
    for member in files {
        let parsed = member
            .split_once(':')
            .and_then(|(i, l)| Some((i.parse::<Ino>().ok()?, l.parse::<u64>().ok()?)));
        match parsed {
            Some((ino, length)) => inner.delete_file_data(ino, length)?,
            None => log::warn!("unexpected delfiles member {member:?}"),
        }
    }
    // A trash left from when TrashDays was larger still empties (as JuiceFS).
    match trash::empty_before(trash, now - (24 * i64::from(fmt.trash_days) + 2) * 3600) {
        Ok(()) | Err(Error::NotFound) => {}
        Err(e) => return Err(e),
    }
    inner.cleanup_delayed_slices(now - i64::from(fmt.trash_days) * 86_400)?;
    // Slices whose objects could not be deleted before.
    let refs = inner.keys.slice_refs();
    let all: Vec<(Vec<u8>, i64)> = inner
        .pool
        .with_conn(|c| redis::cmd("HGETALL").arg(&refs).query(c))?;
    let pending: Vec<ReleasedSlice> = all
        .into_iter()
        .filter(|(_, v)| *v < 0)
        .filter_map(|(f, _)| parse_slice_field(&f))
        .map(|(id, size)| ReleasedSlice { id, size })
        .collect();
    inner.release_slices(&pending);
    Ok(())
}
