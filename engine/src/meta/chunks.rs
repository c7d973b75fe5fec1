//! File-content rules written once: what a written slice does to its file
//! (length, times, usage, directory statistics), truncate, the per-
//! transaction part of fallocate, copy_file_range by reference, and
//! compaction's commit, over
//! the chunk primitives each engine gives inside a transaction
//! ([`ChunkTx`], an extension of the namespace's [`NsTx`]).
//!
//! What stays behind the trait: how a chunk's slice list is stored (a BLOB
//! row in SQLite, a list in Redis), how slice references are counted
//! (JuiceFS keeps "references" in SQL and "references − 1" in Redis), how
//! the chunks of a file that exist are found, and how a chunk's first
//! records are compared and replaced. What stays in each engine: its
//! transaction plumbing (savepoints or marks for a group commit's files,
//! retries, where a listing runs), and the deletion of removed files'
//! data.

use std::ops::RangeInclusive;

use crate::error::Error;
use crate::meta::bounded::{self, CHUNKS_PER_TX, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE};
use crate::meta::copy_range::{self, CopyRange};
use crate::meta::namespace::NsTx;
use crate::meta::rules::{self, MASK_W, align4k};
use crate::meta::{
    Attr, CHUNK_SIZE, CommitResult, Context, FileType, Ino, MAX_FILE_LENGTH, Slice, TRASH_INO,
    Timestamp, TruncateVia,
};

/// What the content rules need of an engine inside one transaction, beyond
/// the namespace's primitives. Every read sees the transaction's own
/// writes before it, except [`existing_chunks`](ChunkTx::existing_chunks)
/// on Redis, which runs at once and is not watched (a chunk found gone is
/// guarded by [`append_if_exists`](ChunkTx::append_if_exists)).
pub(crate) trait ChunkTx: NsTx {
    /// What an append tells the caller of a chunk's record count: the
    /// count itself (SQLite), or where the count will be in the commit's
    /// replies (Redis: `RPUSH` answers the list's new length).
    type Appended;

    /// A chunk's slice records in write order (None: no such chunk).
    fn chunk(&mut self, ino: Ino, indx: u32) -> Result<Option<Vec<Slice>>, Self::Error>;
    /// Reads the node `ino` and the records of its chunks `indxs` ahead,
    /// together, for the [`node`](NsTx::node) and [`chunk`](ChunkTx::chunk)
    /// calls that follow (an engine whose reads cost nothing extra one by
    /// one need not).
    fn prefetch_chunks(&mut self, _ino: Ino, _indxs: &[u32]) -> Result<(), Self::Error> {
        Ok(())
    }
    /// Appends records to a chunk, creating it when absent.
    fn append(
        &mut self,
        ino: Ino,
        indx: u32,
        records: &[Slice],
    ) -> Result<Self::Appended, Self::Error>;
    /// Appends a record to a chunk that exists; one that does not (never
    /// written, or removed meanwhile) stays absent: it reads as zeros.
    fn append_if_exists(&mut self, ino: Ino, indx: u32, record: &Slice) -> Result<(), Self::Error>;
    /// Deletes a chunk and drops one reference of each record's slice. A
    /// chunk whose records cannot be read is deleted and its slices are
    /// left for `gc` (said in the log).
    fn delete_chunk(&mut self, ino: Ino, indx: u32) -> Result<(), Self::Error>;
    /// A slice just written: the first record that shows it.
    fn new_slice(&mut self, s: &Slice) -> Result<(), Self::Error>;
    /// `n` more records show the slice `(id, size)` (a copy by reference).
    fn add_slice_refs(&mut self, id: u64, size: u32, n: i64) -> Result<(), Self::Error>;
    /// The indexes of `ino`'s chunks in `range` that exist, ascending, at
    /// most `limit`.
    fn existing_chunks(
        &mut self,
        ino: Ino,
        range: RangeInclusive<u32>,
        limit: usize,
    ) -> Result<Vec<u32>, Self::Error>;
    /// Replaces the chunk's first `old.len()` records by `new` if they are
    /// still exactly `old` (the records after them stay); whether it did.
    fn replace_head(
        &mut self,
        ino: Ino,
        indx: u32,
        old: &[Slice],
        new: &[Slice],
    ) -> Result<bool, Self::Error>;
    /// Drops one reference of each record's slice (holes have none).
    fn release(&mut self, slices: &[Slice]) -> Result<(), Self::Error>;
    /// Keeps the references of `slices` (none a hole) for the trash's
    /// days, under the id of the slice that replaced them (JuiceFS's
    /// delayed slices), instead of dropping them now.
    fn delay_release(&mut self, anchor: u64, slices: &[Slice]) -> Result<(), Self::Error>;
    /// The days the volume keeps removed data (0: none).
    fn trash_days(&self) -> u32;
}

/// A hole record covering `len` bytes at chunk offset `pos`.
pub(crate) fn hole(pos: u32, len: u32) -> Slice {
    Slice {
        pos,
        id: 0,
        size: 0,
        off: 0,
        len,
    }
}

/// A slice that does not fit its chunk or its stored size is refused.
pub(crate) fn check_fits(slice: &Slice) -> Result<(), Error> {
    let end = u64::from(slice.pos) + u64::from(slice.len);
    if end > CHUNK_SIZE || u64::from(slice.off) + u64::from(slice.len) > u64::from(slice.size) {
        return Err(Error::Invalid(format!(
            "slice {} does not fit its chunk or its stored size",
            slice.id
        )));
    }
    Ok(())
}

/// A file's length and space changed by `length` and `space` bytes: the
/// volume's usage, and the statistics of every directory that names it (a
/// file with several names counts once per name, as JuiceFS counts it).
pub(crate) fn add_file_stat<T: ChunkTx>(
    tx: &mut T,
    ino: Ino,
    attr: &Attr,
    length: i64,
    space: i64,
) -> Result<(), T::Error> {
    if length == 0 && space == 0 {
        return Ok(());
    }
    tx.add_usage(space, 0)?;
    if attr.nlink == 0 {
        return Ok(());
    }
    if attr.parent > 0 {
        return tx.add_dir_stat(attr.parent, length, space, 0);
    }
    for (parent, links) in tx.parents(ino)? {
        tx.add_dir_stat(parent, length * links, space * links, 0)?;
    }
    Ok(())
}

/// Records that `a` stores `stored` bytes of data: a count below its
/// length is kept as [`Attr::space`] (the engine stores it beside the
/// node), one that reaches the length is not (a file without holes needs
/// no record). Every count is an upper bound of the bytes the file's
/// slices cover: exact where an operation reads the records it changes
/// (punching a hole), an overcount where it does not (a write over bytes
/// already written adds its length again, up to the file's length). See
/// engine/DESIGN.md, "Space a file shows".
pub(crate) fn set_stored(a: &mut Attr, stored: u64) {
    a.space = (stored < a.length).then_some(stored);
}

/// The bytes of `[pos, pos + len)` of a chunk that data covers (not a
/// hole, not unwritten), given the chunk's records in write order: a
/// later record hides what it overlaps of the ones before (what a read
/// sees: `chunk::visible`).
pub(crate) fn covered(records: &[Slice], pos: u32, len: u32) -> u64 {
    let (from, to) = (u64::from(pos), u64::from(pos) + u64::from(len));
    crate::chunk::visible(records)
        .iter()
        .filter(|p| !p.is_hole())
        .map(|p| p.end().min(to).saturating_sub(u64::from(p.pos).max(from)))
        .sum()
}

/// A written slice (JuiceFS `Write`), already checked by [`check_fits`]:
/// appended to its chunk; the file grows to its end if it ends past the
/// file, and its mtime and ctime move to when it was written.
pub(crate) fn write<T: ChunkTx>(
    tx: &mut T,
    ino: Ino,
    indx: u32,
    slice: &Slice,
    mtime: Timestamp,
) -> Result<T::Appended, T::Error> {
    let end = u64::from(slice.pos) + u64::from(slice.len);
    let mut a = tx.must_node(ino)?;
    if a.typ != FileType::File {
        return Err(Error::Perm.into());
    }
    let new_len = u64::from(indx) * CHUNK_SIZE + end;
    let stored = a.stored();
    let (mut dlen, mut dspace) = (0, 0);
    if new_len > a.length {
        dlen = (new_len - a.length) as i64;
        dspace = align4k(new_len) - align4k(a.length);
        a.length = new_len;
    }
    let data = if slice.id == 0 {
        0
    } else {
        u64::from(slice.len)
    };
    set_stored(&mut a, stored.saturating_add(data));
    // A write moves mtime and ctime together, to when it was made (never
    // ctime backwards: a chmod since then keeps its later ctime).
    a.mtime = mtime;
    a.ctime = a.ctime.max(mtime);
    let appended = tx.append(ino, indx, std::slice::from_ref(slice))?;
    if slice.id != 0 {
        tx.new_slice(slice)?;
    }
    tx.put_node(ino, &a)?;
    add_file_stat(tx, ino, &a, dlen, dspace)?;
    Ok(appended)
}

/// A group commit's outcome per commit: `res` is the transaction's (each
/// commit's appends, or the error that rolled that commit back alone), and
/// `count` turns an append into the chunk's record count. A failure of the
/// transaction itself fails every commit (the first gets the error, the
/// others its message: errors are not copied).
pub(crate) fn commit_results<A>(
    n: usize,
    res: Result<Vec<Result<Vec<A>, Error>>, Error>,
    count: impl Fn(&A) -> usize,
) -> Vec<CommitResult> {
    match res {
        Ok(out) => out
            .into_iter()
            .map(|r| match r {
                Ok(appended) => CommitResult {
                    counts: appended.iter().map(&count).collect(),
                    error: None,
                },
                Err(e) => CommitResult {
                    counts: Vec::new(),
                    error: Some(e),
                },
            })
            .collect(),
        Err(e) => {
            let msg = e.to_string();
            let mut first = Some(e);
            (0..n)
                .map(|_| CommitResult {
                    counts: Vec::new(),
                    error: Some(first.take().unwrap_or_else(|| {
                        Error::Meta(format!("the group's commit failed: {msg}"))
                    })),
                })
                .collect()
        }
    }
}

/// Compaction's commit (JuiceFS `CompactChunk`): the chunk's first
/// records `old` are replaced by `new` if they are still exactly `old` (a
/// write or truncate since leaves them alone: the compaction is then for
/// nothing, and the caller lets `new`'s objects go). The replaced slices'
/// references go now, or with a trash stay for its days.
pub(crate) fn compact<T: ChunkTx>(
    tx: &mut T,
    ino: Ino,
    indx: u32,
    old: &[Slice],
    new: &[Slice],
) -> Result<bool, T::Error> {
    if !tx.replace_head(ino, indx, old, new)? {
        return Ok(false);
    }
    // One data slice now covers what the old records left as holes
    // between their data (stored as zeros): a file with holes stores that
    // much more (at most: newer records may hide some of it).
    let span = CHUNK_SIZE as u32;
    let grown = covered(new, 0, span).saturating_sub(covered(old, 0, span));
    if grown > 0
        && let Some(mut a) = tx.node(ino)?
        && a.space.is_some()
    {
        let stored = a.stored().saturating_add(grown);
        set_stored(&mut a, stored);
        tx.put_node(ino, &a)?;
    }
    for s in new.iter().filter(|s| s.id != 0) {
        tx.new_slice(s)?;
    }
    let delayed: Vec<Slice> = old.iter().filter(|s| s.id != 0).copied().collect();
    match new.iter().find(|s| s.id != 0) {
        Some(anchor) if tx.trash_days() > 0 && !delayed.is_empty() => {
            tx.delay_release(anchor.id, &delayed)?;
        }
        _ => tx.release(old)?,
    }
    Ok(true)
}

/// Refuses a length no file may have, before any transaction.
pub(crate) fn check_truncate(length: u64) -> Result<(), Error> {
    if length > MAX_FILE_LENGTH {
        return Err(Error::FileTooBig);
    }
    Ok(())
}

/// Sets a file's length. Growing writes a hole over the new range, as
/// JuiceFS writes it, so stale data past the old end can never show
/// through; shrinking hides the cut part of the last chunk behind a hole
/// and deletes the chunks wholly past the end, with their references.
/// Through an open handle neither the mode nor the trash is checked
/// (JuiceFS's `skipPermCheck` and open-file flag).
pub(crate) fn truncate<T: ChunkTx>(
    tx: &mut T,
    ctx: &Context,
    ino: Ino,
    length: u64,
    via: TruncateVia,
) -> Result<Attr, T::Error> {
    let a = tx.must_node(ino)?;
    if a.typ != FileType::File
        || a.flags & (rules::FLAG_IMMUTABLE | rules::FLAG_APPEND) != 0
        || (via == TruncateVia::Path && a.parent > TRASH_INO)
    {
        return Err(Error::Perm.into());
    }
    if via == TruncateVia::Path {
        tx.check(ctx, &a, MASK_W)?;
    }
    if length == a.length {
        return Ok(a);
    }
    let old = a.length;
    // Shrinking cuts what the cut part stored (at most); growing adds a
    // hole.
    let stored = a.stored().min(length);
    let (left, right) = (old.min(length), old.max(length));
    if length < old {
        let first_gone = length.div_ceil(CHUNK_SIZE);
        let last = old.div_ceil(CHUNK_SIZE);
        if first_gone < last {
            let gone =
                tx.existing_chunks(ino, first_gone as u32..=(last - 1) as u32, usize::MAX)?;
            for indx in gone {
                tx.delete_chunk(ino, indx)?;
            }
        }
        if !length.is_multiple_of(CHUNK_SIZE) {
            let indx = (length / CHUNK_SIZE) as u32;
            let pos = (length % CHUNK_SIZE) as u32;
            let end = right.min((u64::from(indx) + 1) * CHUNK_SIZE);
            tx.append_if_exists(ino, indx, &hole(pos, (end - length) as u32))?;
        }
    } else {
        let first = (left / CHUNK_SIZE) as u32;
        let pos = (left % CHUNK_SIZE) as u32;
        let end = right.min((u64::from(first) + 1) * CHUNK_SIZE);
        tx.append(ino, first, &[hole(pos, (end - left) as u32)])?;
        let last = (right / CHUNK_SIZE) as u32;
        // Only the chunks that exist: one that does not reads as zeros.
        if last > first.saturating_add(1) {
            for indx in tx.existing_chunks(ino, first + 1..=last - 1, usize::MAX)? {
                tx.append_if_exists(ino, indx, &hole(0, CHUNK_SIZE as u32))?;
            }
        }
        if last > first && right % CHUNK_SIZE > 0 {
            tx.append_if_exists(ino, last, &hole(0, (right % CHUNK_SIZE) as u32))?;
        }
    }
    set_length(tx, ino, a, length, stored)
}

/// Stores `a` with its new `length`, the bytes it now `stored`, and its
/// mtime and ctime now, and accounts the change.
fn set_length<T: ChunkTx>(
    tx: &mut T,
    ino: Ino,
    mut a: Attr,
    length: u64,
    stored: u64,
) -> Result<Attr, T::Error> {
    let dlen = length as i64 - a.length as i64;
    let dspace = align4k(length) - align4k(a.length);
    let now = Timestamp::now();
    a.length = length;
    set_stored(&mut a, stored);
    a.mtime = now;
    a.ctime = now;
    tx.put_node(ino, &a)?;
    add_file_stat(tx, ino, &a, dlen, dspace)?;
    Ok(a)
}

/// The file fallocate may change, after its permission and flag checks.
fn fallocatable<T: ChunkTx>(
    tx: &mut T,
    ctx: &Context,
    ino: Ino,
    mode: u32,
) -> Result<Attr, T::Error> {
    let a = tx.must_node(ino)?;
    if a.typ == FileType::Directory {
        return Err(Error::IsDir.into());
    }
    if a.typ != FileType::File || a.flags & rules::FLAG_IMMUTABLE != 0 {
        return Err(Error::Perm.into());
    }
    tx.check(ctx, &a, MASK_W)?;
    if a.flags & rules::FLAG_APPEND != 0 && mode & !FALLOC_KEEP_SIZE != 0 {
        return Err(Error::Perm.into());
    }
    Ok(a)
}

/// One Linux fallocate (JuiceFS `Fallocate`), checked: preallocation only
/// changes the length; punching or zeroing writes holes over the chunks of
/// the range that exist (one that does not already reads as zeros). The
/// engine lists those chunks once ([`span`](Self::span)), then changes
/// them in [`batches`] of at most `bounded::CHUNKS_PER_TX`, one transaction
/// each ([`batch`](Self::batch)), in index order; the last transaction
/// sets the length and times.
pub(crate) struct Fallocate<'a> {
    ctx: &'a Context,
    ino: Ino,
    mode: u32,
    offset: u64,
    end: u64,
}

impl<'a> Fallocate<'a> {
    /// Refuses what needs no metadata to refuse (`bounded::check_fallocate`).
    pub(crate) fn new(
        ctx: &'a Context,
        ino: Ino,
        mode: u32,
        offset: u64,
        len: u64,
    ) -> Result<Self, Error> {
        let end = bounded::check_fallocate(mode, offset, len)?;
        Ok(Fallocate {
            ctx,
            ino,
            mode,
            offset,
            end,
        })
    }

    /// Whether it writes holes at all (punch or zero): only then are the
    /// chunks it touches listed (preallocation costs no read).
    pub(crate) fn writes_holes(&self) -> bool {
        bounded::writes_holes(self.mode)
    }

    /// The chunk indexes it writes holes into, for a file of `length`
    /// bytes (None: none).
    pub(crate) fn span(&self, length: u64) -> Option<RangeInclusive<u32>> {
        (self.writes_holes() && self.offset < length)
            .then(|| bounded::chunk_span(self.offset, self.end.min(length)))
    }

    /// Its checks on the file.
    pub(crate) fn allowed<T: ChunkTx>(&self, tx: &mut T) -> Result<Attr, T::Error> {
        fallocatable(tx, self.ctx, self.ino, self.mode)
    }

    /// One transaction: holes into the chunks of `batch`; the `last` one
    /// also sets the length and times. A punched hole takes away what the
    /// data it replaces stored (each chunk's records read first, in the
    /// same transaction); preallocating or zeroing a range counts it as
    /// stored, as a local file system allocates it.
    pub(crate) fn batch<T: ChunkTx>(
        &self,
        tx: &mut T,
        batch: &[u32],
        last: bool,
    ) -> Result<Attr, T::Error> {
        let punch = self.mode & FALLOC_PUNCH_HOLE != 0;
        if punch {
            tx.prefetch_chunks(self.ino, batch)?;
        }
        let mut a = self.allowed(tx)?;
        let old = a.length;
        let stop = self.end.min(old);
        let mut freed = 0u64;
        for &indx in batch {
            if let Some((pos, l)) = bounded::part_in_chunk(indx, self.offset, stop) {
                if punch && let Some(records) = tx.chunk(self.ino, indx)? {
                    freed += covered(&records, pos, l);
                }
                tx.append_if_exists(self.ino, indx, &hole(pos, l))?;
            }
        }
        let mut stored = a.stored().saturating_sub(freed);
        if !last {
            if freed > 0 {
                set_stored(&mut a, stored);
                tx.put_node(self.ino, &a)?;
            }
            return Ok(a);
        }
        let mut length = old;
        if self.end > old && self.mode & FALLOC_KEEP_SIZE == 0 {
            length = self.end;
        }
        if !punch {
            stored = stored.saturating_add(self.end.min(length).saturating_sub(self.offset));
        }
        set_length(tx, self.ino, a, length, stored)
    }
}

/// `found` in transactions' worth: each batch, and whether it is the last
/// (no chunks at all is one empty, last batch).
pub(crate) fn batches(found: &[u32]) -> impl Iterator<Item = (&[u32], bool)> {
    let n = found.len().div_ceil(CHUNKS_PER_TX).max(1);
    (0..n).map(move |i| {
        let from = (i * CHUNKS_PER_TX).min(found.len());
        let to = ((i + 1) * CHUNKS_PER_TX).min(found.len());
        (&found[from..to], i + 1 == n)
    })
}

/// Linux `copy_file_range` by reference (JuiceFS `CopyFileRange`), checked
/// by `copy_range::check`: the destination gets records pointing at the
/// source's slices, in the same transaction as their references and the
/// destination's new length.
pub(crate) fn copy_file_range<T: ChunkTx>(
    tx: &mut T,
    req: &CopyRange,
) -> Result<(u64, Attr), T::Error> {
    let src = tx.must_node(req.fin)?;
    let mut dst = tx.must_node(req.fout)?;
    let len = copy_range::bound(req, &src, &dst)?;
    if len == 0 {
        return Ok((0, dst));
    }
    let mut source = std::collections::BTreeMap::new();
    for indx in copy_range::source_chunks(req, len) {
        if let Some(slices) = tx.chunk(req.fin, indx)? {
            source.insert(indx, slices);
        }
    }
    let planned = copy_range::plan(req, len, &source);
    for (indx, records) in &planned {
        tx.append(req.fout, *indx, records)?;
    }
    for ((id, size), n) in copy_range::references(&planned) {
        tx.add_slice_refs(id, size, n)?;
    }
    // What the copied records show of data is what the destination stores
    // more (at most: they may land on data it had).
    let data: u64 = planned
        .values()
        .flatten()
        .filter(|r| r.id != 0)
        .map(|r| u64::from(r.len))
        .sum();
    let stored = dst.stored().saturating_add(data);
    let (dlen, dspace) = copy_range::update_destination(&mut dst, req.off_out, len);
    set_stored(&mut dst, stored);
    tx.put_node(req.fout, &dst)?;
    add_file_stat(tx, req.fout, &dst, dlen, dspace)?;
    Ok((len, dst))
}
