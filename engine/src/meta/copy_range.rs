//! `copy_file_range` by reference: the rules both engines share.
//!
//! A copy writes no data. The destination's chunks get slice records that
//! point at the slices the source shows over the copied range (with their
//! `off`/`len` moved to the copied part), and a hole record wherever the
//! source reads as zeros, so whatever the destination held there before is
//! hidden. Each data record is one more reference to its slice, so the
//! engines raise the slice's reference count by one per record, and a slice
//! lives until both files let go of it — as JuiceFS's `CopyFileRange` does.
//!
//! The engines read the source's chunks and both nodes inside one
//! transaction, ask [`bound`] how much to copy and [`plan`] what to append,
//! then append the records, count the references and update the
//! destination's node in the same transaction.

use std::collections::{BTreeMap, HashMap};

use crate::chunk::visible;
use crate::error::{Error, Result};
use crate::meta::rules::align4k;
use crate::meta::rules::{FLAG_APPEND, FLAG_IMMUTABLE};
use crate::meta::{Attr, CHUNK_SIZE, FileType, MAX_FILE_LENGTH, Slice, Timestamp};
pub use sluice_api::meta::{CopyRange, MAX_COPY_LEN};

// MAX_COPY_LEN is the API's (the FUSE layer bounds its replies by it);
// it is 32 chunks.
const _: () = assert!(MAX_COPY_LEN == 32 * CHUNK_SIZE);

/// Refuses what needs no metadata to refuse: flags and offsets past the
/// largest file.
pub(crate) fn check(req: &CopyRange) -> Result<()> {
    if req.flags != 0 {
        return Err(Error::Invalid(format!(
            "copy_file_range flags {:#x}: none are defined",
            req.flags
        )));
    }
    if req.off_in >= MAX_FILE_LENGTH || req.off_out >= MAX_FILE_LENGTH {
        return Err(Error::FileTooBig);
    }
    Ok(())
}

/// The source chunk indices the first `len` bytes of the copy read
/// (`len` as [`bound`] returned it, so the indices fit a `u32`).
pub(crate) fn source_chunks(req: &CopyRange, len: u64) -> std::ops::Range<u32> {
    let first = req.off_in / CHUNK_SIZE;
    let end = if len == 0 {
        first
    } else {
        (req.off_in + len).div_ceil(CHUNK_SIZE)
    };
    first as u32..end as u32
}

/// Checks both nodes and returns how many bytes to copy: what was asked,
/// bounded by the source's length and [`MAX_COPY_LEN`].
pub(crate) fn bound(req: &CopyRange, src: &Attr, dst: &Attr) -> Result<u64> {
    if src.typ == FileType::Directory || dst.typ == FileType::Directory {
        return Err(Error::IsDir);
    }
    if src.typ != FileType::File || dst.typ != FileType::File {
        return Err(Error::Invalid(
            "copy_file_range copies between regular files only".into(),
        ));
    }
    // The handle the caller holds proves write access; these flags refuse
    // a change whoever asks, as for a write.
    if dst.flags & (FLAG_IMMUTABLE | FLAG_APPEND) != 0 {
        return Err(Error::Perm);
    }
    let len = req
        .len
        .min(src.length.saturating_sub(req.off_in))
        .min(MAX_COPY_LEN);
    if len == 0 {
        return Ok(0);
    }
    if req.fin == req.fout && req.off_in < req.off_out + len && req.off_out < req.off_in + len {
        return Err(Error::Invalid(
            "copy_file_range within one file with overlapping ranges".into(),
        ));
    }
    if req.off_out + len > MAX_FILE_LENGTH {
        return Err(Error::FileTooBig);
    }
    Ok(len)
}

/// The records a copy of `len` bytes appends to each destination chunk, in
/// order. `source` holds the slice lists of the chunks
/// [`source_chunks`] names (a missing chunk holds no data).
/// Records never cross a chunk boundary, and neighbouring holes are merged.
pub(crate) fn plan(
    req: &CopyRange,
    len: u64,
    source: &BTreeMap<u32, Vec<Slice>>,
) -> BTreeMap<u32, Vec<Slice>> {
    let mut out: BTreeMap<u32, Vec<Slice>> = BTreeMap::new();
    let end = req.off_in + len;
    for indx in source_chunks(req, len) {
        let base = u64::from(indx) * CHUNK_SIZE;
        let lo = req.off_in.max(base) - base;
        let hi = end.min(base + CHUNK_SIZE) - base;
        let mut at = lo;
        let pieces = source.get(&indx).map(|s| visible(s)).unwrap_or_default();
        for p in pieces {
            if p.end() <= at {
                continue;
            }
            if u64::from(p.pos) >= hi {
                break;
            }
            if u64::from(p.pos) > at {
                let gap_end = u64::from(p.pos);
                emit(&mut out, req, base + at, gap_end - at, 0, 0, 0);
                at = gap_end;
            }
            let stop = p.end().min(hi);
            let (id, size, off) = if p.is_hole() {
                (0, 0, 0)
            } else {
                (p.id, p.size, p.off + (at - u64::from(p.pos)) as u32)
            };
            emit(&mut out, req, base + at, stop - at, id, size, off);
            at = stop;
        }
        if at < hi {
            emit(&mut out, req, base + at, hi - at, 0, 0, 0);
        }
    }
    out
}

/// Appends the copy of the source bytes `src..src+len` (shown by slice `id`
/// from `off` on; `id` 0 is a hole) to the destination chunks it lands in.
fn emit(
    out: &mut BTreeMap<u32, Vec<Slice>>,
    req: &CopyRange,
    src: u64,
    len: u64,
    id: u64,
    size: u32,
    mut off: u32,
) {
    let mut dst = src - req.off_in + req.off_out;
    let mut left = len;
    while left > 0 {
        let indx = (dst / CHUNK_SIZE) as u32;
        let pos = (dst % CHUNK_SIZE) as u32;
        let n = left.min(CHUNK_SIZE - u64::from(pos)) as u32;
        let records = out.entry(indx).or_default();
        match records.last_mut() {
            Some(prev) if id == 0 && prev.id == 0 && prev.pos + prev.len == pos => prev.len += n,
            _ => records.push(Slice {
                pos,
                id,
                size,
                off: if id == 0 { 0 } else { off },
                len: n,
            }),
        }
        if id != 0 {
            off += n;
        }
        dst += u64::from(n);
        left -= u64::from(n);
    }
}

/// How many references the planned records add to each slice, as
/// ((id, size), count).
pub(crate) fn references(planned: &BTreeMap<u32, Vec<Slice>>) -> Vec<((u64, u32), i64)> {
    let mut refs: HashMap<(u64, u32), i64> = HashMap::new();
    for s in planned.values().flatten().filter(|s| s.id != 0) {
        *refs.entry((s.id, s.size)).or_default() += 1;
    }
    let mut refs: Vec<_> = refs.into_iter().collect();
    refs.sort_unstable();
    refs
}

/// Grows the destination to cover the copy and stamps its times; returns
/// the (length, space) deltas for the usage counters and directory
/// statistics, counted as JuiceFS counts them (4 KiB granules).
pub(crate) fn update_destination(dst: &mut Attr, off_out: u64, len: u64) -> (i64, i64) {
    let end = off_out + len;
    let mut delta = (0, 0);
    if end > dst.length {
        delta = (
            (end - dst.length) as i64,
            align4k(end) - align4k(dst.length),
        );
        dst.length = end;
    }
    let now = Timestamp::now();
    dst.mtime = now;
    dst.ctime = now;
    delta
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::chunks::hole;

    fn req(off_in: u64, off_out: u64, len: u64) -> CopyRange {
        CopyRange {
            fin: 2,
            off_in,
            fout: 3,
            off_out,
            len,
            flags: 0,
        }
    }

    fn data(pos: u32, id: u64, len: u32) -> Slice {
        Slice {
            pos,
            id,
            size: len,
            off: 0,
            len,
        }
    }

    #[test]
    fn gaps_become_holes_and_pieces_keep_their_offsets() {
        // Slice 7 over 0..1000, slice 8 over 200..300 on top, nothing after.
        let source = BTreeMap::from([(0, vec![data(0, 7, 1000), data(200, 8, 100)])]);
        let r = req(100, 5000, 2000);
        let got = plan(&r, 2000, &source);
        let mid = Slice {
            pos: 5100,
            id: 8,
            size: 100,
            off: 0,
            len: 100,
        };
        assert_eq!(
            got,
            BTreeMap::from([(
                0,
                vec![
                    Slice {
                        pos: 5000,
                        id: 7,
                        size: 1000,
                        off: 100,
                        len: 100
                    },
                    mid,
                    Slice {
                        pos: 5200,
                        id: 7,
                        size: 1000,
                        off: 300,
                        len: 700
                    },
                    hole(5900, 1100),
                ]
            )])
        );
        assert_eq!(references(&got), vec![((7, 1000), 2), ((8, 100), 1)]);
    }

    #[test]
    fn records_split_at_destination_chunk_boundaries() {
        let c = CHUNK_SIZE as u32;
        let source = BTreeMap::from([(0, vec![data(0, 9, 4096)])]);
        let r = req(0, CHUNK_SIZE - 96, 4096);
        let got = plan(&r, 4096, &source);
        assert_eq!(
            got,
            BTreeMap::from([
                (
                    0,
                    vec![Slice {
                        pos: c - 96,
                        id: 9,
                        size: 4096,
                        off: 0,
                        len: 96
                    }]
                ),
                (
                    1,
                    vec![Slice {
                        pos: 0,
                        id: 9,
                        size: 4096,
                        off: 96,
                        len: 4000
                    }]
                ),
            ])
        );
    }

    #[test]
    fn missing_chunks_and_explicit_holes_merge_into_one_hole_per_chunk() {
        // Source chunk 0 absent, chunk 1 an explicit hole then nothing.
        let source = BTreeMap::from([(1, vec![hole(0, 10)])]);
        let r = req(CHUNK_SIZE - 5, 0, 20);
        assert_eq!(source_chunks(&r, 20), 0..2);
        assert!(source_chunks(&r, 0).is_empty());
        let got = plan(&r, 20, &source);
        assert_eq!(got, BTreeMap::from([(0, vec![hole(0, 20)])]));
        assert!(references(&got).is_empty());
    }

    fn file(length: u64) -> Attr {
        Attr {
            flags: 0,
            typ: FileType::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            nlink: 1,
            length,
            parent: 1,
            access_acl: 0,
            default_acl: 0,
            space: None,
        }
    }

    #[test]
    fn bounds_and_refusals() {
        let (src, dst) = (file(1000), file(0));
        assert_eq!(bound(&req(0, 0, 5000), &src, &dst).unwrap(), 1000);
        assert_eq!(bound(&req(400, 0, 100), &src, &dst).unwrap(), 100);
        assert_eq!(bound(&req(1000, 0, 100), &src, &dst).unwrap(), 0);
        assert_eq!(bound(&req(5000, 0, 100), &src, &dst).unwrap(), 0);
        let huge = file(3 * MAX_COPY_LEN);
        assert_eq!(
            bound(&req(0, 0, u64::MAX), &huge, &dst).unwrap(),
            MAX_COPY_LEN
        );
        let same = CopyRange {
            fout: 2,
            ..req(0, 500, 600)
        };
        assert!(matches!(bound(&same, &src, &src), Err(Error::Invalid(_))));
        // Bounded by the length first, the ranges no longer overlap.
        let same = CopyRange {
            fout: 2,
            ..req(500, 0, 600)
        };
        assert_eq!(bound(&same, &src, &src).unwrap(), 500);
        let mut dir = file(4096);
        dir.typ = FileType::Directory;
        assert!(matches!(
            bound(&req(0, 0, 1), &dir, &dst),
            Err(Error::IsDir)
        ));
        assert!(matches!(
            bound(&req(0, 0, 1), &src, &dir),
            Err(Error::IsDir)
        ));
        let mut fifo = file(0);
        fifo.typ = FileType::Fifo;
        assert!(matches!(
            bound(&req(0, 0, 1), &src, &fifo),
            Err(Error::Invalid(_))
        ));
        let mut append = file(0);
        append.flags = FLAG_APPEND;
        assert!(matches!(
            bound(&req(0, 0, 1), &src, &append),
            Err(Error::Perm)
        ));
        assert!(matches!(
            check(&CopyRange {
                flags: 1,
                ..req(0, 0, 1)
            }),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            check(&req(0, MAX_FILE_LENGTH, 1)),
            Err(Error::FileTooBig)
        ));
    }

    #[test]
    fn the_destination_grows_by_what_lies_past_its_end() {
        let mut dst = file(100);
        assert_eq!(update_destination(&mut dst, 50, 8000), (7950, 8192 - 4096));
        assert_eq!(dst.length, 8050);
        assert_eq!(update_destination(&mut dst, 0, 10), (0, 0));
        assert_eq!(dst.length, 8050);
        assert!(dst.mtime > Timestamp::default());
    }
}
