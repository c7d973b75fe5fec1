//! File contents on Redis: chunks as lists of 24-byte slice records
//! (`c{ino}_{indx}`), slice references (`sliceRef`, JuiceFS's "references
//! − 1": a slice written once has no field), truncation, fallocate,
//! compaction and the deletion of removed files' data.

use std::ops::RangeInclusive;

use super::Inner;
use super::codec::encode_delayed;
use super::keys::{parse_chunk_key, slice_field};
use super::namespace::Ns;
use super::node;
use super::tx::{Conn, Read, Tx, TxError, TxResult};
use crate::error::{Error, Result};
use crate::meta::bounded::PROBE_SPAN;
use crate::meta::chunks;
use crate::meta::{
    CHUNK_SIZE, ChunkWrite, CommitResult, FileType, Ino, Slice, Timestamp, WorkCounters,
};

/// Chunk keys one pipeline probes.
const PROBE_BATCH: u32 = 512;

fn decode(ino: Ino, indx: u32, records: &[Vec<u8>]) -> TxResult<Vec<Slice>> {
    records
        .iter()
        .map(|r| {
            Slice::decode(r).ok_or_else(|| {
                TxError::Fs(Error::Corrupt(format!(
                    "chunk {indx} of inode {ino} holds a {}-byte record, not 24",
                    r.len()
                )))
            })
        })
        .collect()
}

fn push(tx: &mut Tx<'_>, op: &str, key: &str, record: &[u8]) -> usize {
    let mut c = redis::cmd(op);
    c.arg(key).arg(record);
    tx.cmd(c)
}

/// Drops one reference of each record's slice.
fn unref(tx: &mut Tx<'_>, slices: &[Slice]) {
    for s in slices.iter().filter(|s| s.id != 0) {
        tx.unref(s.id, s.size);
    }
}

/// The slice list of one chunk, in write order.
pub(super) fn read_chunk(inner: &Inner, ino: Ino, indx: u32) -> Result<Vec<Slice>> {
    inner.read(|tx| {
        let key = tx.keys.chunk(ino, indx);
        let records = tx.lrange(&key, -1)?;
        if records.is_empty() {
            let a = node::must_get(tx, ino)?;
            if a.typ != FileType::File {
                return Err(Error::Perm.into());
            }
            return Ok(Vec::new());
        }
        decode(ino, indx, &records)
    })
}

/// The most chunks of one removed file [`Inner::delete_files_data`] reads
/// with others (1 GiB of file); a longer file is deleted on its own.
const BATCH_CHUNKS: u64 = 16;

/// Appends a written slice (JuiceFS `Write`).
pub(super) fn write_chunk(
    inner: &Inner,
    ino: Ino,
    indx: u32,
    slice: Slice,
    mtime: Timestamp,
) -> Result<usize> {
    chunks::check_fits(&slice)?;
    inner.format()?;
    let (at, results) = inner.write_returning(ino, |tx| {
        chunks::write(&mut Ns::new(tx, inner), ino, indx, &slice, mtime)
    })?;
    Ok(slice_count(&results, at))
}

/// The chunk's slice count after a write: what its `RPUSH` (queued at
/// `at`) answered.
fn slice_count(results: &[redis::Value], at: usize) -> usize {
    match results.get(at) {
        Some(redis::Value::Int(n)) => usize::try_from(*n).unwrap_or(1),
        _ => 1,
    }
}

/// A group commit's writes in one transaction: one round trip reads (and
/// watches) every file's node, one commits them all. Each file's writes are
/// all or none: a file refused (removed, a quota, a limit) is rolled back
/// alone ([`Tx::rollback`]) and the others commit. A failure of Redis
/// itself fails every file of the group.
pub(super) fn write_chunks(inner: &Inner, commits: &[Vec<ChunkWrite>]) -> Vec<CommitResult> {
    if let Err(e) = inner.format() {
        return chunks::commit_results(commits.len(), Err(e), |&n: &usize| n);
    }
    let Some(first) = commits.iter().flatten().next().map(|w| w.ino) else {
        return commits.iter().map(|_| CommitResult::default()).collect();
    };
    let res = inner.write_returning(first, |tx| {
        let nodes: Vec<String> = commits
            .iter()
            .flatten()
            .map(|w| tx.keys.inode(w.ino))
            .collect();
        let reads: Vec<Read<'_>> = nodes.iter().map(|k| Read::Get(k)).collect();
        tx.prefetch(&reads)?;
        let mut out = Vec::with_capacity(commits.len());
        for writes in commits {
            if let Some(e) = writes
                .iter()
                .find_map(|w| chunks::check_fits(&w.slice).err())
            {
                out.push(Err(e));
                continue;
            }
            let mark = tx.mark();
            let mut ats = Vec::with_capacity(writes.len());
            let mut failed = None;
            for w in writes {
                match chunks::write(&mut Ns::new(tx, inner), w.ino, w.indx, &w.slice, w.mtime) {
                    Ok(at) => ats.push(at),
                    Err(TxError::Fs(e)) => {
                        failed = Some(e);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            match failed {
                None => out.push(Ok(ats)),
                Some(e) => {
                    tx.rollback(mark);
                    out.push(Err(e));
                }
            }
        }
        Ok(out)
    });
    match res {
        Ok((out, results)) => {
            chunks::commit_results(commits.len(), Ok(out), |&at| slice_count(&results, at))
        }
        Err(e) => chunks::commit_results(commits.len(), Err(e), |&at: &usize| at),
    }
}

/// Replaces the chunk's first `old.len()` records by `new` if they are still
/// exactly `old` (JuiceFS `CompactChunk`). With a trash, the replaced slices
/// are kept for `TrashDays` in `delSlices`, as JuiceFS keeps them.
pub(super) fn compact_chunk(
    inner: &Inner,
    ino: Ino,
    indx: u32,
    old: &[Slice],
    new: &[Slice],
) -> Result<bool> {
    if old.is_empty() {
        return Ok(false);
    }
    inner.format()?;
    let done = inner.write(ino, |tx| {
        chunks::compact(&mut Ns::new(tx, inner), ino, indx, old, new)
    })?;
    if !done {
        // The compacted slice was written for nothing: let its objects go, as
        // JuiceFS does (a negative reference that cleanup also finds).
        inner.write(ino, |tx| {
            for s in new.iter().filter(|s| s.id != 0) {
                tx.unref(s.id, s.size);
            }
            Ok(())
        })?;
    }
    Ok(done)
}

/// The chunks a fallocate of `ino` writes holes into, listed once before
/// its transactions (see [`existing`]), after its checks. JuiceFS queues
/// a hole for every chunk of the range in one MULTI, which over a
/// 2^58-byte range would block the server that every client shares.
pub(super) fn fallocate_chunks(
    inner: &Inner,
    f: &chunks::Fallocate<'_>,
    ino: Ino,
) -> Result<Vec<u32>> {
    inner.read(|tx| {
        let a = f.allowed(&mut Ns::new(tx, inner))?;
        match f.span(a.length) {
            Some(span) => existing(tx, &inner.work, ino, span, usize::MAX),
            None => Ok(Vec::new()),
        }
    })
}

/// The indexes of the chunks of `ino` in `range` that exist, ascending, at
/// most `limit`, read outside the transaction (nothing watched). Redis
/// keeps no index of a file's chunks, so a range of at most [`PROBE_SPAN`]
/// indexes is probed key by key (pipelined `EXISTS`), and a longer one is
/// found by one `SCAN` of `c{ino}_*` over the database: its cost follows the
/// number of keys in the database, never the length of the range, and the
/// server is free between the calls.
fn existing(
    tx: &mut Tx<'_>,
    work: &WorkCounters,
    ino: Ino,
    range: RangeInclusive<u32>,
    limit: usize,
) -> TxResult<Vec<u32>> {
    let (first, last) = (*range.start(), *range.end());
    if first > last || limit == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    if last - first < PROBE_SPAN {
        let mut at = first;
        loop {
            let stop = last.min(at.saturating_add(PROBE_BATCH - 1));
            let mut p = redis::pipe();
            for i in at..=stop {
                p.cmd("EXISTS").arg(tx.keys.chunk(ino, i));
            }
            let found: Vec<bool> = tx.now_pipe(&p)?;
            work.probed((stop - at) as usize + 1);
            out.extend((at..=stop).zip(found).filter(|(_, e)| *e).map(|(i, _)| i));
            if out.len() >= limit || stop == last {
                break;
            }
            at = stop + 1;
        }
    } else {
        let prefix = tx.keys.prefix().to_string();
        let pattern = format!("{prefix}c{ino}_*");
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = tx.now(
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(10_000),
            )?;
            work.scanned();
            out.extend(
                keys.iter()
                    .filter_map(|k| parse_chunk_key(k.get(prefix.len()..)?))
                    .filter(|(i, indx)| *i == ino && range.contains(indx))
                    .map(|(_, indx)| indx),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
        out.sort_unstable();
        out.dedup();
    }
    out.truncate(limit);
    work.visited(out.len());
    Ok(out)
}

/// [`Store::chunk_indices`](crate::meta::Store::chunk_indices).
pub(super) fn chunk_indices(
    inner: &Inner,
    ino: Ino,
    range: RangeInclusive<u32>,
    limit: usize,
) -> Result<Vec<u32>> {
    inner.read(|tx| existing(tx, &inner.work, ino, range.clone(), limit))
}

/// Every chunk key of the volume, as (inode, index).
fn chunk_keys(inner: &Inner) -> Result<Vec<(Ino, u32)>> {
    let pattern = inner.keys.chunk_pattern();
    let prefix = inner.keys.prefix().len();
    let mut keys: Vec<String> = Vec::new();
    scan(inner, &pattern, |_, batch| {
        keys.extend(batch);
        Ok(())
    })?;
    let mut out: Vec<(Ino, u32)> = keys
        .iter()
        .filter_map(|k| parse_chunk_key(k.get(prefix..)?))
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The space records whose node is gone, deleted with `remove`. A node
/// and its record are written and deleted together, and inode numbers are
/// never reused, so a record found without its node stays so.
pub(super) fn orphan_space_records(inner: &Inner, remove: bool) -> Result<u64> {
    let prefix = format!("{}sluiceSpace", inner.keys.prefix());
    let mut found = 0u64;
    scan(inner, &format!("{prefix}*"), |c, keys| {
        let inos: Vec<(String, Ino)> = keys
            .into_iter()
            .filter_map(|k| {
                let ino = k.strip_prefix(prefix.as_str())?.parse().ok()?;
                Some((k, ino))
            })
            .collect();
        if inos.is_empty() {
            return Ok(());
        }
        let mut p = redis::pipe();
        for (_, ino) in &inos {
            p.cmd("EXISTS").arg(inner.keys.inode(*ino));
        }
        let exists: Vec<bool> = p.query(c)?;
        let gone: Vec<&String> = inos
            .iter()
            .zip(exists)
            .filter(|(_, e)| !e)
            .map(|((k, _), _)| k)
            .collect();
        found += gone.len() as u64;
        if remove && !gone.is_empty() {
            let () = redis::cmd("DEL").arg(&gone).query(c)?;
        }
        Ok(())
    })?;
    Ok(found)
}

/// Runs `each` on every batch of the keys `pattern` matches (`SCAN`, on
/// one connection).
fn scan(
    inner: &Inner,
    pattern: &str,
    mut each: impl FnMut(&mut Conn, Vec<String>) -> redis::RedisResult<()>,
) -> Result<()> {
    inner.pool.with_conn(|c| {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(10_000)
                .query(c)?;
            each(c, keys)?;
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    })
}

/// Every chunk of the volume.
pub(super) fn list_chunks(inner: &Inner) -> Result<Vec<(Ino, u32, Vec<Slice>)>> {
    let keys = chunk_keys(inner)?;
    let mut out = Vec::with_capacity(keys.len());
    for batch in keys.chunks(1000) {
        let lists: Vec<Vec<Vec<u8>>> = inner.pool.with_conn(|c| {
            let mut p = redis::pipe();
            for (ino, indx) in batch {
                p.cmd("LRANGE")
                    .arg(inner.keys.chunk(*ino, *indx))
                    .arg(0)
                    .arg(-1);
            }
            p.query(c)
        })?;
        for ((ino, indx), records) in batch.iter().zip(lists) {
            if records.is_empty() {
                continue;
            }
            match decode(*ino, *indx, &records) {
                Ok(slices) => out.push((*ino, *indx, slices)),
                Err(TxError::Fs(e)) => return Err(e),
                Err(TxError::Redis(e)) => return Err(super::tx::redis_error(e)),
            }
        }
    }
    Ok(out)
}

/// Whether a slice is still referenced: by its `sliceRef` field when it has
/// one (≥ 0), otherwise by the trash's delayed slices or any chunk holding
/// it (a slice written once has no field). Slow without a field: it scans.
pub(super) fn slice_referenced(inner: &Inner, id: u64, size: u32) -> Result<bool> {
    let key = inner.keys.slice_refs();
    let field = slice_field(id, size);
    let refs: Option<i64> = inner
        .pool
        .with_conn(|c| redis::cmd("HGET").arg(&key).arg(&field).query(c))?;
    if let Some(r) = refs {
        return Ok(r >= 0);
    }
    let dkey = inner.keys.delayed_slices();
    let delayed: Vec<Vec<u8>> = inner
        .pool
        .with_conn(|c| redis::cmd("HVALS").arg(&dkey).query(c))?;
    if delayed
        .iter()
        .any(|v| super::codec::decode_delayed(v).contains(&(id, size)))
    {
        return Ok(true);
    }
    Ok(list_chunks(inner)?
        .iter()
        .any(|(_, _, slices)| slices.iter().any(|s| s.id == id && s.size == size)))
}

impl Inner {
    /// Deletes the chunks of a removed file (a `delfiles` member and no
    /// node), releasing its slices, then forgets the member.
    pub(super) fn delete_file_data(&self, ino: Ino, length: u64) -> Result<()> {
        let alive = self.read(|tx| node::get(tx, ino))?.is_some();
        if !alive {
            // Only the chunks that exist (a sparse file may be 2^58 bytes).
            let last = length.div_ceil(CHUNK_SIZE).max(1) - 1;
            let last = u32::try_from(last).unwrap_or(u32::MAX);
            let found = self.read(|tx| existing(tx, &self.work, ino, 0..=last, usize::MAX))?;
            for indx in found {
                self.delete_chunk(ino, indx)?;
            }
        }
        let key = self.keys.delfiles();
        let member = format!("{ino}:{length}");
        self.pool
            .with_conn(|c| redis::cmd("ZREM").arg(&key).arg(&member).query::<()>(c))
    }

    /// [`Inner::delete_file_data`] for many files in one transaction: one
    /// round trip reads (and watches) every node and every chunk of them,
    /// one commits. A file of more than [`BATCH_CHUNKS`] chunks goes alone
    /// (its chunks are found as `delete_file_data` finds them: only those
    /// that exist).
    pub(super) fn delete_files_data(&self, files: &[(Ino, u64)]) -> Result<()> {
        let chunks = |length: u64| length.div_ceil(CHUNK_SIZE).max(1);
        type Files = Vec<(Ino, u64)>;
        let (small, big): (Files, Files) = files
            .iter()
            .copied()
            .partition(|(_, len)| chunks(*len) <= BATCH_CHUNKS);
        for (ino, length) in big {
            if let Err(e) = self.delete_file_data(ino, length) {
                log::warn!(
                    "deleting the data of removed inode {ino} failed (cleanup retries): {e}"
                );
            }
        }
        for batch in small.chunks(256) {
            self.write(batch[0].0, |tx| {
                let nodes: Vec<String> = batch.iter().map(|(i, _)| tx.keys.inode(*i)).collect();
                let lists: Vec<Vec<String>> = batch
                    .iter()
                    .map(|(i, len)| {
                        (0..chunks(*len) as u32)
                            .map(|k| tx.keys.chunk(*i, k))
                            .collect()
                    })
                    .collect();
                let mut reads: Vec<Read<'_>> = nodes.iter().map(|k| Read::Get(k)).collect();
                reads.extend(lists.iter().flatten().map(|k| Read::LRange(k)));
                tx.prefetch(&reads)?;
                let del = tx.keys.delfiles();
                for (((ino, length), node), keys) in batch.iter().zip(&nodes).zip(&lists) {
                    // An inode whose node is alive keeps its data (numbers
                    // are never reused: a record a crash left).
                    if tx.get(node)?.is_none() {
                        for (indx, key) in keys.iter().enumerate() {
                            let records = tx.lrange(key, -1)?;
                            if records.is_empty() {
                                continue;
                            }
                            match decode(*ino, indx as u32, &records) {
                                Ok(slices) => unref(tx, &slices),
                                Err(e) => log::error!("{e:?}; its slices are left for gc"),
                            }
                            tx.del(key);
                        }
                    }
                    let mut c = redis::cmd("ZREM");
                    c.arg(&del).arg(format!("{ino}:{length}"));
                    tx.cmd(c);
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Deletes one chunk and drops its references.
    fn delete_chunk(&self, ino: Ino, indx: u32) -> Result<()> {
        self.write(ino, |tx| {
            let key = tx.keys.chunk(ino, indx);
            let records = tx.lrange(&key, -1)?;
            if records.is_empty() {
                return Ok(());
            }
            match decode(ino, indx, &records) {
                Ok(slices) => unref(tx, &slices),
                Err(e) => log::error!("{e:?}; its slices are left for gc"),
            }
            tx.del(&key);
            Ok(())
        })
    }

    /// Drops the references compaction kept for the trash once they expire
    /// (`delSlices` fields named `{id}_{secs}` with secs before `edge`).
    pub(super) fn cleanup_delayed_slices(&self, edge: i64) -> Result<()> {
        let key = self.keys.delayed_slices();
        let fields: Vec<Vec<u8>> = self
            .pool
            .with_conn(|c| redis::cmd("HKEYS").arg(&key).query(c))?;
        for field in fields {
            let ts = std::str::from_utf8(&field)
                .ok()
                .and_then(|f| f.split_once('_'))
                .and_then(|(_, ts)| ts.parse::<i64>().ok());
            let Some(ts) = ts else {
                log::warn!("unexpected delSlices field {field:?}");
                continue;
            };
            if ts >= edge {
                continue;
            }
            self.write(0, |tx| {
                let Some(value) = tx.hget(&key, &field)? else {
                    return Ok(());
                };
                for (id, size) in super::codec::decode_delayed(&value) {
                    if id != 0 {
                        tx.unref(id, size);
                    }
                }
                tx.hdel(&key, &field);
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// The content rules' view of a Redis transaction (`meta/chunks.rs`).
impl chunks::ChunkTx for Ns<'_, '_> {
    /// Where the chunk's `RPUSH` was queued: its answer is the list's new
    /// length (no `LLEN` first).
    type Appended = usize;

    fn prefetch_chunks(&mut self, ino: Ino, indxs: &[u32]) -> TxResult<()> {
        let node = self.tx.keys.inode(ino);
        let keys: Vec<String> = indxs.iter().map(|&i| self.tx.keys.chunk(ino, i)).collect();
        let mut reads = vec![Read::Get(&node)];
        reads.extend(keys.iter().map(|k| Read::LRange(k)));
        self.tx.prefetch(&reads)
    }
    fn chunk(&mut self, ino: Ino, indx: u32) -> TxResult<Option<Vec<Slice>>> {
        let key = self.tx.keys.chunk(ino, indx);
        let records = self.tx.lrange(&key, -1)?;
        if records.is_empty() {
            return Ok(None);
        }
        decode(ino, indx, &records).map(Some)
    }
    fn append(&mut self, ino: Ino, indx: u32, records: &[Slice]) -> TxResult<usize> {
        let mut c = redis::cmd("RPUSH");
        c.arg(self.tx.keys.chunk(ino, indx));
        for r in records {
            c.arg(&r.encode()[..]);
        }
        Ok(self.tx.cmd(c))
    }
    fn append_if_exists(&mut self, ino: Ino, indx: u32, record: &Slice) -> TxResult<()> {
        let key = self.tx.keys.chunk(ino, indx);
        push(self.tx, "RPUSHX", &key, &record.encode());
        Ok(())
    }
    fn delete_chunk(&mut self, ino: Ino, indx: u32) -> TxResult<()> {
        let key = self.tx.keys.chunk(ino, indx);
        let records = self.tx.lrange(&key, -1)?;
        if records.is_empty() {
            return Ok(());
        }
        match decode(ino, indx, &records) {
            Ok(slices) => unref(self.tx, &slices),
            Err(e) => log::error!("{e:?}; its slices are left for gc"),
        }
        self.tx.del(&key);
        Ok(())
    }
    fn new_slice(&mut self, _s: &Slice) -> TxResult<()> {
        // `sliceRef` holds references − 1: a slice written once has no
        // field.
        Ok(())
    }
    fn add_slice_refs(&mut self, id: u64, size: u32, n: i64) -> TxResult<()> {
        // References − 1, so a slice written once (no field yet) ends at
        // exactly the records that show it.
        let refs = self.tx.keys.slice_refs();
        self.tx.hincrby(&refs, slice_field(id, size).as_bytes(), n);
        Ok(())
    }
    fn existing_chunks(
        &mut self,
        ino: Ino,
        range: RangeInclusive<u32>,
        limit: usize,
    ) -> TxResult<Vec<u32>> {
        existing(self.tx, &self.inner.work, ino, range, limit)
    }
    fn replace_head(
        &mut self,
        ino: Ino,
        indx: u32,
        old: &[Slice],
        new: &[Slice],
    ) -> TxResult<bool> {
        let key = self.tx.keys.chunk(ino, indx);
        // Watched: a write or compaction elsewhere restarts the commit.
        let head = self.tx.lrange(&key, old.len() as i64 - 1)?;
        if head.len() != old.len() || head.iter().zip(old).any(|(r, s)| r[..] != s.encode()) {
            return Ok(false);
        }
        let mut c = redis::cmd("LTRIM");
        c.arg(&key).arg(old.len()).arg(-1);
        self.tx.cmd(c);
        for s in new.iter().rev() {
            push(self.tx, "LPUSH", &key, &s.encode());
        }
        Ok(true)
    }
    fn release(&mut self, slices: &[Slice]) -> TxResult<()> {
        unref(self.tx, slices);
        Ok(())
    }
    fn delay_release(&mut self, anchor: u64, slices: &[Slice]) -> TxResult<()> {
        let dkey = self.tx.keys.delayed_slices();
        let field = format!("{anchor}_{}", Timestamp::now().secs);
        let value = encode_delayed(slices.iter().map(|s| (s.id, s.size)));
        self.tx.hset(&dkey, field.as_bytes(), &value);
        Ok(())
    }
    fn trash_days(&self) -> u32 {
        self.tx.trash_days
    }
}
