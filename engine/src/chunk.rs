//! Resolving a chunk's slice list into what a reader sees.
//!
//! A chunk's slices are kept in write order; where two overlap, the later one
//! wins. Slice id 0 is an explicit hole (zeros); offsets no slice covers also
//! read as zeros.

use crate::meta::Slice;

/// One visible stretch of a chunk: bytes `off..off+len` of stored slice `id`
/// (of `size` bytes) shown at chunk offset `pos`. `id == 0` is a hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Chunk offset where the piece starts.
    pub pos: u32,
    /// Length of the piece.
    pub len: u32,
    /// Slice id (0 = zeros).
    pub id: u64,
    /// Stored size of the slice.
    pub size: u32,
    /// Offset of the piece within the stored slice.
    pub off: u32,
}

impl Piece {
    /// The chunk offset just past the piece.
    pub fn end(&self) -> u64 {
        u64::from(self.pos) + u64::from(self.len)
    }

    /// Whether the piece reads as zeros.
    pub fn is_hole(&self) -> bool {
        self.id == 0
    }
}

/// The visible pieces of a chunk, sorted by position and not overlapping.
/// Gaps between pieces (never written) read as zeros.
pub fn visible(slices: &[Slice]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for s in slices.iter().filter(|s| s.len > 0) {
        let new = Piece {
            pos: s.pos,
            len: s.len,
            id: s.id,
            size: s.size,
            off: s.off,
        };
        let (a, b) = (u64::from(new.pos), new.end());
        let mut next = Vec::with_capacity(out.len() + 2);
        let mut inserted = false;
        for p in out {
            let (pa, pb) = (u64::from(p.pos), p.end());
            if pb <= a || pa >= b {
                if pa >= b && !inserted {
                    next.push(new);
                    inserted = true;
                }
                next.push(p);
                continue;
            }
            if pa < a {
                next.push(Piece {
                    len: (a - pa) as u32,
                    ..p
                });
            }
            if !inserted {
                next.push(new);
                inserted = true;
            }
            if pb > b {
                next.push(Piece {
                    pos: b as u32,
                    len: (pb - b) as u32,
                    off: p.off + (b - pa) as u32,
                    ..p
                });
            }
        }
        if !inserted {
            next.push(new);
        }
        out = next;
    }
    out
}

/// The chunk offset just past the last piece holding data or an explicit
/// hole (0 for an empty chunk).
pub fn extent_end(pieces: &[Piece]) -> u64 {
    pieces.last().map_or(0, Piece::end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(pos: u32, id: u64, len: u32) -> Slice {
        Slice {
            pos,
            id,
            size: len,
            off: 0,
            len,
        }
    }

    /// The bytes a chunk shows, with each byte the id of the slice that
    /// provides it (0 = zeros), computed the slow way.
    fn naive(slices: &[Slice], n: usize) -> Vec<(u64, u32)> {
        let mut v = vec![(0u64, 0u32); n];
        for sl in slices {
            for i in 0..sl.len as usize {
                v[sl.pos as usize + i] = (sl.id, sl.off + i as u32);
            }
        }
        v
    }

    fn render(pieces: &[Piece], n: usize) -> Vec<(u64, u32)> {
        let mut v = vec![(0u64, 0u32); n];
        for p in pieces {
            for i in 0..p.len as usize {
                v[p.pos as usize + i] = (p.id, if p.id == 0 { 0 } else { p.off + i as u32 });
            }
        }
        v
    }

    #[test]
    fn later_slices_win_and_gaps_stay() {
        let slices = [
            s(0, 1, 100),
            s(50, 2, 10),
            s(200, 3, 10),
            s(40, 4, 30),
            s(95, 0, 10),
        ];
        let p = visible(&slices);
        assert_eq!(
            p.iter()
                .map(|p| (p.pos, p.len, p.id, p.off))
                .collect::<Vec<_>>(),
            [
                (0, 40, 1, 0),
                (40, 30, 4, 0),
                (70, 25, 1, 70),
                (95, 10, 0, 0),
                (200, 10, 3, 0)
            ]
        );
        let mut fixed = slices;
        fixed[4].id = 0;
        let want: Vec<_> = naive(&fixed, 256)
            .into_iter()
            .map(|(id, off)| if id == 0 { (0, 0) } else { (id, off) })
            .collect();
        assert_eq!(render(&p, 256), want);
        assert_eq!(extent_end(&p), 210);
        assert!(visible(&[]).is_empty());
    }

    #[test]
    fn random_overlaps_match_naive() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..300 {
            let n = rng.random_range(1..20);
            let slices: Vec<Slice> = (0..n)
                .map(|i| {
                    let pos = rng.random_range(0..500u32);
                    let len = rng.random_range(0..100u32);
                    let off = rng.random_range(0..20u32);
                    let id = if rng.random_bool(0.2) { 0 } else { i + 1 };
                    Slice {
                        pos,
                        id,
                        size: off + len,
                        off,
                        len,
                    }
                })
                .collect();
            let want: Vec<_> = naive(&slices, 600)
                .into_iter()
                .map(|(id, off)| if id == 0 { (0, 0) } else { (id, off) })
                .collect();
            let p = visible(&slices);
            assert_eq!(render(&p, 600), want, "{slices:?}");
            assert!(p.windows(2).all(|w| w[0].end() <= u64::from(w[1].pos)));
        }
    }
}
