//! File contents: chunks as slice lists (`jfs_chunk`), slice reference counts
//! (`jfs_chunk_ref`), truncation, fallocate, compaction and the deletion of
//! removed files' data.

use std::collections::HashSet;
use std::ops::RangeInclusive;

use rusqlite::{Connection, OptionalExtension, params};

use super::namespace::Ns;
use super::node;
use super::{Inner, Tx, TxError, TxResult};
use crate::error::{Error, Result};
use crate::meta::chunks;
use crate::meta::{ChunkWrite, CommitResult, FileType, Ino, ReleasedSlice, Slice, Timestamp};

fn encode(slices: &[Slice]) -> Vec<u8> {
    slices.iter().flat_map(|s| s.encode()).collect()
}

fn decode(ino: Ino, indx: u32, blob: &[u8]) -> TxResult<Vec<Slice>> {
    Slice::decode_all(blob).ok_or_else(|| {
        TxError::Fs(Error::Corrupt(format!(
            "chunk {indx} of inode {ino} holds {} bytes, not a whole number of slice records",
            blob.len()
        )))
    })
}

/// A BLOB column that JuiceFS's `slices || ?` may have turned into TEXT.
fn bytes_at(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Vec<u8>> {
    Ok(r.get_ref(i)?.as_bytes()?.to_vec())
}

fn get_chunk(c: &Connection, ino: Ino, indx: u32) -> TxResult<Option<Vec<u8>>> {
    Ok(c.query_row(
        "SELECT slices FROM jfs_chunk WHERE inode=? AND indx=?",
        params![ino as i64, indx],
        |r| bytes_at(r, 0),
    )
    .optional()?)
}

/// Appends records to a chunk, creating it if needed; returns the record count.
fn append(c: &Connection, ino: Ino, indx: u32, records: &[u8]) -> TxResult<usize> {
    let n = c.execute(
        "UPDATE jfs_chunk SET slices=CAST(slices || ? AS BLOB) WHERE inode=? AND indx=?",
        params![records, ino as i64, indx],
    )?;
    if n == 0 {
        c.execute(
            "INSERT INTO jfs_chunk (inode, indx, slices) VALUES (?,?,?)",
            params![ino as i64, indx, records],
        )?;
    }
    let len: i64 = c.query_row(
        "SELECT length(slices) FROM jfs_chunk WHERE inode=? AND indx=?",
        params![ino as i64, indx],
        |r| r.get(0),
    )?;
    Ok(len as usize / Slice::RECORD_LEN)
}

/// Drops one reference of each record's slice; slices left without
/// references are queued for release after the commit.
fn unref(tx: &mut Tx<'_>, slices: &[Slice]) -> TxResult<()> {
    let mut seen = HashSet::new();
    for s in slices.iter().filter(|s| s.id != 0) {
        tx.execute(
            "UPDATE jfs_chunk_ref SET refs=refs-1 WHERE chunkid=? AND size=?",
            params![s.id as i64, s.size],
        )?;
        seen.insert((s.id, s.size));
    }
    for (id, size) in seen {
        let refs: Option<i64> = tx
            .query_row(
                "SELECT refs FROM jfs_chunk_ref WHERE chunkid=? AND size=?",
                params![id as i64, size],
                |r| r.get(0),
            )
            .optional()?;
        if refs.is_some_and(|r| r <= 0) {
            tx.post.released.push(ReleasedSlice { id, size });
        }
    }
    Ok(())
}

/// Adds one reference to a slice, creating its row at 1.
fn add_ref(c: &Connection, s: &Slice) -> TxResult<()> {
    c.execute(
        "INSERT INTO jfs_chunk_ref (chunkid, size, refs) VALUES (?,?,1) \
         ON CONFLICT (chunkid) DO UPDATE SET refs=refs+1",
        params![s.id as i64, s.size],
    )?;
    Ok(())
}

/// The slice list of one chunk, in write order.
pub(super) fn read_chunk(inner: &Inner, ino: Ino, indx: u32) -> Result<Vec<Slice>> {
    inner.read(|c| match get_chunk(c, ino, indx)? {
        Some(blob) => decode(ino, indx, &blob),
        None => {
            let a = node::must_get(c, ino)?;
            if a.typ != FileType::File {
                return Err(Error::Perm.into());
            }
            Ok(Vec::new())
        }
    })
}

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
    inner.write(|tx| chunks::write(&mut Ns::new(tx, inner), ino, indx, &slice, mtime))
}

/// A group commit's writes in one transaction (one WAL commit): each
/// commit's writes run under a savepoint, so a commit that fails (a quota,
/// a removed file) is rolled back alone — its usage with it — and the
/// others still commit. A failure of the transaction itself (SQLite busy
/// past its retries, an I/O error) fails every commit of the group.
pub(super) fn write_chunks(inner: &Inner, commits: &[Vec<ChunkWrite>]) -> Vec<CommitResult> {
    if let Err(e) = inner.format() {
        return chunks::commit_results(commits.len(), Err(e), |&n: &usize| n);
    }
    let res = inner.write(|tx| {
        let mut out = Vec::with_capacity(commits.len());
        for writes in commits {
            // Records that cannot be stored fail their commit untried.
            if let Some(e) = writes
                .iter()
                .find_map(|w| chunks::check_fits(&w.slice).err())
            {
                out.push(Err(e));
                continue;
            }
            tx.execute_batch("SAVEPOINT sluice_commit")?;
            let usage = tx.usage.borrow().clone();
            let mut counts = Vec::with_capacity(writes.len());
            let mut failed = None;
            for w in writes {
                match chunks::write(&mut Ns::new(tx, inner), w.ino, w.indx, &w.slice, w.mtime) {
                    Ok(n) => counts.push(n),
                    Err(TxError::Fs(e)) => {
                        failed = Some(e);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            match failed {
                None => {
                    tx.execute_batch("RELEASE sluice_commit")?;
                    out.push(Ok(counts));
                }
                Some(e) => {
                    tx.execute_batch("ROLLBACK TO sluice_commit; RELEASE sluice_commit")?;
                    *tx.usage.borrow_mut() = usage;
                    out.push(Err(e));
                }
            }
        }
        Ok(out)
    });
    chunks::commit_results(commits.len(), res, |&n| n)
}

/// Replaces the chunk's first `old.len()` records by `new` if they are still
/// exactly `old` (JuiceFS `CompactChunk`). With a trash, the replaced slices
/// are kept for `TrashDays` in `jfs_delslices`, as JuiceFS keeps them.
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
    let done = inner.write(|tx| chunks::compact(&mut Ns::new(tx, inner), ino, indx, old, new))?;
    if !done {
        // The compacted slice was written for nothing: let its objects go, as
        // JuiceFS does (a reference row at 0 that cleanup also finds).
        let wasted: Vec<ReleasedSlice> = new
            .iter()
            .filter(|s| s.id != 0)
            .map(|s| ReleasedSlice {
                id: s.id,
                size: s.size,
            })
            .collect();
        if !wasted.is_empty() {
            inner.write(|tx| {
                for s in &wasted {
                    tx.execute(
                        "INSERT OR IGNORE INTO jfs_chunk_ref (chunkid, size, refs) VALUES (?,?,0)",
                        params![s.id as i64, s.size],
                    )?;
                }
                tx.post.released.extend(wasted.iter().copied());
                Ok(())
            })?;
        }
    }
    Ok(done)
}

/// The chunks a fallocate of `ino` writes holes into, listed once before
/// its transactions on a read snapshot. JuiceFS writes a hole into every
/// chunk of the range in one transaction, which over a 2^58-byte range of
/// a sparse file would hold the volume's write lock for hours.
pub(super) fn fallocate_chunks(
    inner: &Inner,
    f: &chunks::Fallocate<'_>,
    ino: Ino,
) -> Result<Vec<u32>> {
    let found = inner.read(|c| match f.span(node::must_get(c, ino)?.length) {
        Some(span) => existing(c, ino, span, usize::MAX),
        None => Ok(Vec::new()),
    })?;
    inner.work.visited(found.len());
    Ok(found)
}

/// The indexes of the chunks of `ino` in `range` that exist, ascending, at
/// most `limit` (an index range on `jfs_chunk`'s primary key).
fn existing(
    c: &Connection,
    ino: Ino,
    range: RangeInclusive<u32>,
    limit: usize,
) -> TxResult<Vec<u32>> {
    let mut stmt = c.prepare_cached(
        "SELECT indx FROM jfs_chunk WHERE inode=? AND indx>=? AND indx<=? ORDER BY indx LIMIT ?",
    )?;
    let rows = stmt.query_map(
        params![
            ino as i64,
            range.start(),
            range.end(),
            i64::try_from(limit).unwrap_or(i64::MAX)
        ],
        |r| r.get::<_, i64>(0),
    )?;
    rows.map(|r| r.map(|v| v as u32))
        .collect::<rusqlite::Result<_>>()
        .map_err(Into::into)
}

/// [`Store::chunk_indices`](crate::meta::Store::chunk_indices).
pub(super) fn chunk_indices(
    inner: &Inner,
    ino: Ino,
    range: RangeInclusive<u32>,
    limit: usize,
) -> Result<Vec<u32>> {
    let found = inner.read(|c| existing(c, ino, range.clone(), limit))?;
    inner.work.visited(found.len());
    Ok(found)
}

/// Every chunk of the volume.
pub(super) fn list_chunks(inner: &Inner) -> Result<Vec<(Ino, u32, Vec<Slice>)>> {
    inner.read(|c| {
        let mut stmt =
            c.prepare("SELECT inode, indx, slices FROM jfs_chunk ORDER BY inode, indx")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, i64>(1)? as u32,
                bytes_at(r, 2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (ino, indx, blob) = row?;
            out.push((ino, indx, decode(ino, indx, &blob)?));
        }
        Ok(out)
    })
}

/// Whether any chunk (or the trash's delayed slices) still references a slice.
pub(super) fn slice_referenced(inner: &Inner, id: u64, size: u32) -> Result<bool> {
    inner.read(|c| {
        let refs: Option<i64> = c
            .query_row(
                "SELECT refs FROM jfs_chunk_ref WHERE chunkid=? AND size=?",
                params![id as i64, size],
                |r| r.get(0),
            )
            .optional()?;
        Ok(refs.is_some_and(|r| r > 0))
    })
}

impl Inner {
    /// Deletes the chunks of a removed file (one with a `jfs_delfile` row and
    /// no node), releasing its slices, then forgets the `jfs_delfile` row.
    pub(super) fn delete_file_data(&self, ino: Ino) -> Result<()> {
        self.write(|tx| {
            if node::get(tx, ino)?.is_some() {
                // The inode is alive (a row left by a crash that reused it is
                // impossible: inode numbers are never reused); keep its data.
                tx.execute("DELETE FROM jfs_delfile WHERE inode=?", params![ino as i64])?;
                return Ok(());
            }
            let chunks: Vec<(u32, Vec<u8>)> = {
                let mut stmt = tx.prepare("SELECT indx, slices FROM jfs_chunk WHERE inode=?")?;
                let rows = stmt.query_map(params![ino as i64], |r| {
                    Ok((r.get::<_, i64>(0)? as u32, bytes_at(r, 1)?))
                })?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for (indx, blob) in chunks {
                match decode(ino, indx, &blob) {
                    Ok(slices) => unref(tx, &slices)?,
                    Err(e) => log::error!("{e:?}; its slices are left for gc"),
                }
            }
            tx.execute("DELETE FROM jfs_chunk WHERE inode=?", params![ino as i64])?;
            tx.execute("DELETE FROM jfs_delfile WHERE inode=?", params![ino as i64])?;
            Ok(())
        })
    }
}

/// The content rules' view of a SQLite transaction (`meta/chunks.rs`).
impl chunks::ChunkTx for Ns<'_, '_> {
    type Appended = usize;

    fn chunk(&mut self, ino: Ino, indx: u32) -> TxResult<Option<Vec<Slice>>> {
        get_chunk(self.tx, ino, indx)?
            .map(|blob| decode(ino, indx, &blob))
            .transpose()
    }
    fn append(&mut self, ino: Ino, indx: u32, records: &[Slice]) -> TxResult<usize> {
        append(self.tx, ino, indx, &encode(records))
    }
    fn append_if_exists(&mut self, ino: Ino, indx: u32, record: &Slice) -> TxResult<()> {
        self.tx.execute(
            "UPDATE jfs_chunk SET slices=CAST(slices || ? AS BLOB) WHERE inode=? AND indx=?",
            params![&record.encode()[..], ino as i64, indx],
        )?;
        Ok(())
    }
    fn delete_chunk(&mut self, ino: Ino, indx: u32) -> TxResult<()> {
        if let Some(blob) = get_chunk(self.tx, ino, indx)? {
            match decode(ino, indx, &blob) {
                Ok(slices) => unref(self.tx, &slices)?,
                Err(e) => log::error!("{e:?}; its slices are left for gc"),
            }
            self.tx.execute(
                "DELETE FROM jfs_chunk WHERE inode=? AND indx=?",
                params![ino as i64, indx],
            )?;
        }
        Ok(())
    }
    fn new_slice(&mut self, s: &Slice) -> TxResult<()> {
        add_ref(self.tx, s)
    }
    fn add_slice_refs(&mut self, id: u64, size: u32, n: i64) -> TxResult<()> {
        // As JuiceFS: a slice without a reference row (never counted) stays
        // without one, so it is never released while a chunk shows it.
        self.tx.execute(
            "UPDATE jfs_chunk_ref SET refs=refs+? WHERE chunkid=? AND size=?",
            params![n, id as i64, size],
        )?;
        Ok(())
    }
    fn existing_chunks(
        &mut self,
        ino: Ino,
        range: RangeInclusive<u32>,
        limit: usize,
    ) -> TxResult<Vec<u32>> {
        existing(self.tx, ino, range, limit)
    }
    fn replace_head(
        &mut self,
        ino: Ino,
        indx: u32,
        old: &[Slice],
        new: &[Slice],
    ) -> TxResult<bool> {
        let origin = encode(old);
        let Some(cur) = get_chunk(self.tx, ino, indx)? else {
            return Ok(false);
        };
        if cur.len() < origin.len() || cur[..origin.len()] != origin[..] {
            return Ok(false);
        }
        let mut blob = encode(new);
        blob.extend_from_slice(&cur[origin.len()..]);
        self.tx.execute(
            "UPDATE jfs_chunk SET slices=? WHERE inode=? AND indx=?",
            params![blob, ino as i64, indx],
        )?;
        Ok(true)
    }
    fn release(&mut self, slices: &[Slice]) -> TxResult<()> {
        unref(self.tx, slices)
    }
    fn delay_release(&mut self, anchor: u64, slices: &[Slice]) -> TxResult<()> {
        let delayed: Vec<u8> = slices
            .iter()
            .flat_map(|s| {
                let mut r = s.id.to_be_bytes().to_vec();
                r.extend_from_slice(&s.size.to_be_bytes());
                r
            })
            .collect();
        self.tx.execute(
            "INSERT OR REPLACE INTO jfs_delslices (chunkid, deleted, slices) VALUES (?,?,?)",
            params![anchor as i64, Timestamp::now().secs, delayed],
        )?;
        Ok(())
    }
    fn trash_days(&self) -> u32 {
        self.tx.trash_days
    }
}
