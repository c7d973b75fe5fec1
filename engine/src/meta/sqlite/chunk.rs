//! File contents: chunks as slice lists (`jfs_chunk`), slice reference counts
//! (`jfs_chunk_ref`), truncation, fallocate, compaction and the deletion of
//! removed files' data.

use std::collections::{BTreeMap, HashSet};
use std::ops::RangeInclusive;

use rusqlite::{Connection, OptionalExtension, params};

use super::node;
use super::{Inner, Tx, TxError, TxResult};
use crate::error::{Error, Result};
use crate::meta::bounded::{self, CHUNKS_PER_TX, FALLOC_KEEP_SIZE};
use crate::meta::copy_range::{self, CopyRange};
use crate::meta::rules::align4k;
use crate::meta::rules::{self, MASK_W};
use crate::meta::{
    Attr, CHUNK_SIZE, ChunkWrite, CommitResult, Context, FileType, Ino, MAX_FILE_LENGTH,
    ReleasedSlice, Slice, Timestamp, TruncateVia,
};

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

/// A hole record covering `len` bytes at chunk offset `pos`.
fn hole(pos: u32, len: u32) -> [u8; Slice::RECORD_LEN] {
    Slice {
        pos,
        id: 0,
        size: 0,
        off: 0,
        len,
    }
    .encode()
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
    check_fits(&slice)?;
    inner.format()?;
    inner.write(|tx| apply_write(tx, ino, indx, &slice, mtime))
}

/// A slice that does not fit its chunk or its stored size is refused.
fn check_fits(slice: &Slice) -> Result<()> {
    let end = u64::from(slice.pos) + u64::from(slice.len);
    if end > CHUNK_SIZE || u64::from(slice.off) + u64::from(slice.len) > u64::from(slice.size) {
        return Err(Error::Invalid(format!(
            "slice {} does not fit its chunk or its stored size",
            slice.id
        )));
    }
    Ok(())
}

/// The body of [`write_chunk`], inside the caller's transaction.
fn apply_write(
    tx: &mut Tx<'_>,
    ino: Ino,
    indx: u32,
    slice: &Slice,
    mtime: Timestamp,
) -> TxResult<usize> {
    let end = u64::from(slice.pos) + u64::from(slice.len);
    let mut a = node::must_get(tx, ino)?;
    if a.typ != FileType::File {
        return Err(Error::Perm.into());
    }
    let new_len = u64::from(indx) * CHUNK_SIZE + end;
    let (mut dlen, mut dspace) = (0, 0);
    if new_len > a.length {
        dlen = (new_len - a.length) as i64;
        dspace = align4k(new_len) - align4k(a.length);
        a.length = new_len;
    }
    // A write moves mtime and ctime together, to when it was made (never
    // ctime backwards: a chmod since then keeps its later ctime).
    a.mtime = mtime;
    a.ctime = a.ctime.max(mtime);
    let count = append(tx, ino, indx, &slice.encode())?;
    if slice.id != 0 {
        add_ref(tx, slice)?;
    }
    node::update(tx, ino, &a)?;
    node::add_file_stat(tx, ino, &a, dlen, dspace)?;
    Ok(count)
}

/// A group commit's writes in one transaction (one WAL commit): each
/// commit's writes run under a savepoint, so a commit that fails (a quota,
/// a removed file) is rolled back alone — its usage with it — and the
/// others still commit. A failure of the transaction itself (SQLite busy
/// past its retries, an I/O error) fails every commit of the group.
pub(super) fn write_chunks(inner: &Inner, commits: &[Vec<ChunkWrite>]) -> Vec<CommitResult> {
    if let Err(e) = inner.format() {
        return fail_all(commits.len(), e);
    }
    let res = inner.write(|tx| {
        let mut out = Vec::with_capacity(commits.len());
        for writes in commits {
            // Records that cannot be stored fail their commit untried.
            if let Some(e) = writes.iter().find_map(|w| check_fits(&w.slice).err()) {
                out.push(Err(e));
                continue;
            }
            tx.execute_batch("SAVEPOINT sluice_commit")?;
            let usage = tx.usage.borrow().clone();
            let mut counts = Vec::with_capacity(writes.len());
            let mut failed = None;
            for w in writes {
                match apply_write(tx, w.ino, w.indx, &w.slice, w.mtime) {
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
    match res {
        Ok(out) => out
            .into_iter()
            .map(|r| match r {
                Ok(counts) => CommitResult {
                    counts,
                    error: None,
                },
                Err(e) => CommitResult {
                    counts: Vec::new(),
                    error: Some(e),
                },
            })
            .collect(),
        Err(e) => fail_all(commits.len(), e),
    }
}

/// `n` commits that all failed with `e` (the first gets it, the others its
/// message: errors are not copied).
fn fail_all(n: usize, e: Error) -> Vec<CommitResult> {
    let msg = e.to_string();
    let mut first = Some(e);
    (0..n)
        .map(|_| CommitResult {
            counts: Vec::new(),
            error: Some(
                first
                    .take()
                    .unwrap_or_else(|| Error::Meta(format!("the group's commit failed: {msg}"))),
            ),
        })
        .collect()
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
    let origin = encode(old);
    let done = inner.write(|tx| {
        let Some(cur) = get_chunk(tx, ino, indx)? else {
            return Ok(false);
        };
        if cur.len() < origin.len() || cur[..origin.len()] != origin[..] {
            return Ok(false);
        }
        let mut blob = encode(new);
        blob.extend_from_slice(&cur[origin.len()..]);
        tx.execute(
            "UPDATE jfs_chunk SET slices=? WHERE inode=? AND indx=?",
            params![blob, ino as i64, indx],
        )?;
        for s in new.iter().filter(|s| s.id != 0) {
            add_ref(tx, s)?;
        }
        if tx.trash_days > 0 {
            let delayed: Vec<u8> = old
                .iter()
                .filter(|s| s.id != 0)
                .flat_map(|s| {
                    let mut r = s.id.to_be_bytes().to_vec();
                    r.extend_from_slice(&s.size.to_be_bytes());
                    r
                })
                .collect();
            let key = new.iter().find(|s| s.id != 0).map(|s| s.id);
            match key {
                Some(key) if !delayed.is_empty() => {
                    tx.execute(
                        "INSERT OR REPLACE INTO jfs_delslices (chunkid, deleted, slices) \
                         VALUES (?,?,?)",
                        params![key as i64, Timestamp::now().secs, delayed],
                    )?;
                }
                _ => unref(tx, old)?,
            }
        } else {
            unref(tx, old)?;
        }
        Ok(true)
    })?;
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

/// Sets a file's length. Growing adds a hole; shrinking hides the cut part
/// of the last chunk behind a hole and drops whole chunks past the end,
/// releasing their slices. Through an open handle neither the mode nor the
/// trash is checked (JuiceFS's `skipPermCheck` and open-file flag).
pub(super) fn truncate(
    inner: &Inner,
    ctx: &Context,
    ino: Ino,
    length: u64,
    via: TruncateVia,
) -> Result<Attr> {
    if length > MAX_FILE_LENGTH {
        return Err(Error::FileTooBig);
    }
    inner.format()?;
    inner.write(|tx| {
        let mut a = node::must_get(tx, ino)?;
        let in_trash = a.parent > crate::meta::TRASH_INO;
        if a.typ != FileType::File
            || a.flags & (rules::FLAG_IMMUTABLE | rules::FLAG_APPEND) != 0
            || (via == TruncateVia::Path && in_trash)
        {
            return Err(Error::Perm.into());
        }
        if via == TruncateVia::Path {
            node::check(tx, ctx, &a, MASK_W)?;
        }
        if length == a.length {
            return Ok(a);
        }
        let old = a.length;
        let (left, right) = (old.min(length), old.max(length));
        if length < old {
            // Chunks wholly past the new end go, with their references.
            let first_gone = length.div_ceil(CHUNK_SIZE);
            let gone: Vec<(u32, Vec<u8>)> = {
                let mut stmt =
                    tx.prepare("SELECT indx, slices FROM jfs_chunk WHERE inode=? AND indx>=?")?;
                let rows = stmt.query_map(params![ino as i64, first_gone as i64], |r| {
                    Ok((r.get::<_, i64>(0)? as u32, bytes_at(r, 1)?))
                })?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for (indx, blob) in gone {
                let slices = decode(ino, indx, &blob)?;
                unref(tx, &slices)?;
                tx.execute(
                    "DELETE FROM jfs_chunk WHERE inode=? AND indx=?",
                    params![ino as i64, indx],
                )?;
            }
            if !length.is_multiple_of(CHUNK_SIZE) {
                let indx = (length / CHUNK_SIZE) as u32;
                let pos = (length % CHUNK_SIZE) as u32;
                let end = right.min((u64::from(indx) + 1) * CHUNK_SIZE);
                let len = (end - length) as u32;
                if get_chunk(tx, ino, indx)?.is_some() {
                    append(tx, ino, indx, &hole(pos, len))?;
                }
            }
        } else {
            // Growing: a hole over the new range, as JuiceFS writes it, so
            // stale data past the old end can never show through.
            let first = (left / CHUNK_SIZE) as u32;
            let pos = (left % CHUNK_SIZE) as u32;
            let end = right.min((u64::from(first) + 1) * CHUNK_SIZE);
            append(tx, ino, first, &hole(pos, (end - left) as u32))?;
            let between: Vec<u32> = {
                let mut stmt =
                    tx.prepare("SELECT indx FROM jfs_chunk WHERE inode=? AND indx>? AND indx<?")?;
                let rows = stmt.query_map(
                    params![ino as i64, first, (right / CHUNK_SIZE) as i64],
                    |r| r.get::<_, i64>(0),
                )?;
                rows.map(|r| r.map(|v| v as u32))
                    .collect::<rusqlite::Result<_>>()?
            };
            for indx in between {
                append(tx, ino, indx, &hole(0, CHUNK_SIZE as u32))?;
            }
            let last = (right / CHUNK_SIZE) as u32;
            if last > first && right % CHUNK_SIZE > 0 && get_chunk(tx, ino, last)?.is_some() {
                append(tx, ino, last, &hole(0, (right % CHUNK_SIZE) as u32))?;
            }
        }
        let dlen = length as i64 - old as i64;
        let dspace = align4k(length) - align4k(old);
        let now = Timestamp::now();
        a.length = length;
        a.mtime = now;
        a.ctime = now;
        node::update(tx, ino, &a)?;
        node::add_file_stat(tx, ino, &a, dlen, dspace)?;
        Ok(a)
    })
}

/// Linux fallocate (JuiceFS `Fallocate`): preallocation only changes the
/// length; punching or zeroing writes holes over the chunks of the range
/// that exist (one that does not already reads as zeros), at most
/// [`CHUNKS_PER_TX`] chunks per transaction, in index order; the last
/// transaction sets the length and times. JuiceFS writes a hole into every
/// chunk of the range in one transaction, which over a 2^58-byte range of a
/// sparse file would hold the volume's write lock for hours.
pub(super) fn fallocate(
    inner: &Inner,
    ctx: &Context,
    ino: Ino,
    mode: u32,
    offset: u64,
    len: u64,
) -> Result<Attr> {
    let end = bounded::check_fallocate(mode, offset, len)?;
    inner.format()?;
    // The next chunk index the holes start from.
    let mut from = (offset / CHUNK_SIZE) as u32;
    loop {
        let done = inner.write(|tx| {
            let mut a = node::must_get(tx, ino)?;
            if a.typ == FileType::Directory {
                return Err(Error::IsDir.into());
            }
            if a.typ != FileType::File || a.flags & rules::FLAG_IMMUTABLE != 0 {
                return Err(Error::Perm.into());
            }
            node::check(tx, ctx, &a, MASK_W)?;
            if a.flags & rules::FLAG_APPEND != 0 && mode & !FALLOC_KEEP_SIZE != 0 {
                return Err(Error::Perm.into());
            }
            let old = a.length;
            if bounded::writes_holes(mode) && offset < old {
                let stop = end.min(old);
                let span = bounded::chunk_span(offset, stop);
                if from <= *span.end() {
                    let found = existing(tx, ino, from..=*span.end(), CHUNKS_PER_TX + 1)?;
                    let batch = &found[..found.len().min(CHUNKS_PER_TX)];
                    for &indx in batch {
                        if let Some((pos, l)) = bounded::part_in_chunk(indx, offset, stop) {
                            append(tx, ino, indx, &hole(pos, l))?;
                        }
                    }
                    inner.work.visited(batch.len());
                    if let Some(&next) = found.get(CHUNKS_PER_TX) {
                        // More chunks than one transaction may change:
                        // commit these, go on in the next.
                        return Ok(Err(next));
                    }
                }
            }
            let mut length = old;
            if end > old && mode & FALLOC_KEEP_SIZE == 0 {
                length = end;
            }
            let now = Timestamp::now();
            let dlen = length as i64 - old as i64;
            let dspace = align4k(length) - align4k(old);
            a.length = length;
            a.mtime = now;
            a.ctime = now;
            node::update(tx, ino, &a)?;
            node::add_file_stat(tx, ino, &a, dlen, dspace)?;
            Ok(Ok(a))
        })?;
        inner.work.transaction();
        match done {
            Ok(a) => return Ok(a),
            Err(next) => from = next,
        }
    }
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

/// [`Meta::chunk_indices`](crate::meta::Meta::chunk_indices).
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

/// Linux `copy_file_range` by reference (JuiceFS `CopyFileRange`): the
/// destination gets records pointing at the source's slices, in the same
/// transaction as their references and the destination's new length.
pub(super) fn copy_file_range(inner: &Inner, req: &CopyRange) -> Result<(u64, Attr)> {
    copy_range::check(req)?;
    inner.format()?;
    inner.write(|tx| {
        let src = node::must_get(tx, req.fin)?;
        let mut dst = node::must_get(tx, req.fout)?;
        let len = copy_range::bound(req, &src, &dst)?;
        if len == 0 {
            return Ok((0, dst));
        }
        let chunks = copy_range::source_chunks(req, len);
        let rows: Vec<(u32, Vec<u8>)> = {
            let mut stmt = tx.prepare(
                "SELECT indx, slices FROM jfs_chunk WHERE inode=? AND indx>=? AND indx<?",
            )?;
            let rows = stmt.query_map(params![req.fin as i64, chunks.start, chunks.end], |r| {
                Ok((r.get::<_, i64>(0)? as u32, bytes_at(r, 1)?))
            })?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let mut source = BTreeMap::new();
        for (indx, blob) in rows {
            source.insert(indx, decode(req.fin, indx, &blob)?);
        }
        let planned = copy_range::plan(req, len, &source);
        for (indx, records) in &planned {
            append(tx, req.fout, *indx, &encode(records))?;
        }
        // As JuiceFS: a slice without a reference row (never counted) stays
        // without one, so it is never released while a chunk shows it.
        for ((id, size), n) in copy_range::references(&planned) {
            tx.execute(
                "UPDATE jfs_chunk_ref SET refs=refs+? WHERE chunkid=? AND size=?",
                params![n, id as i64, size],
            )?;
        }
        let (dlen, dspace) = copy_range::update_destination(&mut dst, req.off_out, len);
        node::update(tx, req.fout, &dst)?;
        node::add_file_stat(tx, req.fout, &dst, dlen, dspace)?;
        Ok((len, dst))
    })
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
