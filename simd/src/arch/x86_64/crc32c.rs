//! CRC32C kernels for x86_64.
//!
//! - `sse42-3way`: three independent streams of the 64-bit `crc32`
//!   instruction, joined with a carry-less multiply (PCLMULQDQ) shift.
//! - `pclmul-fused`: four 128-bit PCLMULQDQ folding lanes and three `crc32`
//!   streams in the same loop (the instructions issue on different ports),
//!   joined at the end.
//! - `avx2-vpclmulqdq`: four 256-bit VPCLMULQDQ folding lanes.
//! - `avx512-vpclmulqdq`: four 512-bit VPCLMULQDQ folding lanes with
//!   three-way XOR (`vpternlogq`).
//!
//! All of them finish a folded 128-bit remainder with two `crc32`
//! instructions rather than a Barrett reduction: the remainder is congruent
//! to the data it replaced, so its CRC is the data's CRC. The constants come
//! from [`crate::polynomial`] at compile time.

use core::arch::x86_64::*;

use crate::polynomial::{SHIFT_TABLE, fold_constants};

/// Fold constants for `distance` bytes as a 128-bit lane.
const fn k(distance: u64) -> [u64; 2] {
    let (lo, hi) = fold_constants(distance);
    [lo, hi]
}

const K16: [u64; 2] = k(16);
const K32: [u64; 2] = k(32);
const K48: [u64; 2] = k(48);
const K64: [u64; 2] = k(64);
const K96: [u64; 2] = k(96);
const K128: [u64; 2] = k(128);
const K192: [u64; 2] = k(192);
const K256: [u64; 2] = k(256);

/// One `crc32` instruction per 8 bytes, then per byte.
#[target_feature(enable = "sse4.2")]
fn crc_words(mut crc: u32, data: &[u8]) -> u32 {
    let (words, tail) = data.as_chunks::<8>();
    for w in words {
        crc = _mm_crc32_u64(u64::from(crc), u64::from_le_bytes(*w)) as u32;
    }
    for &b in tail {
        crc = _mm_crc32_u8(crc, b);
    }
    crc
}

/// `a · b · x^33 mod P` (see `polynomial::SHIFT_TABLE`).
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn mul_x33(a: u32, b: u32) -> u32 {
    let p = _mm_clmulepi64_si128(
        _mm_cvtsi32_si128(a as i32),
        _mm_cvtsi32_si128(b as i32),
        0x00,
    );
    _mm_crc32_u64(0, _mm_cvtsi128_si64(p) as u64) as u32
}

/// `x^(8n - 33) mod P` for `n` a positive multiple of 8: `mul_x33(crc, k)`
/// then moves `crc` past `n` bytes.
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn shift_constant(n: usize) -> u32 {
    let mut bits = n as u64 * 8;
    debug_assert!(bits != 0 && bits.is_multiple_of(64), "shift by {n} bytes");
    let mut k = SHIFT_TABLE[bits.trailing_zeros() as usize];
    bits &= bits - 1;
    while bits != 0 {
        k = mul_x33(k, SHIFT_TABLE[bits.trailing_zeros() as usize]);
        bits &= bits - 1;
    }
    k
}

/// The CRC register after `crc_of_a`, continued over `|b|` bytes whose
/// own CRC (from state 0) is `crc_of_b`, with `k = shift_constant(|b|)`.
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn join(crc_of_a: u32, crc_of_b: u32, k: u32) -> u32 {
    mul_x33(crc_of_a, k) ^ crc_of_b
}

/// Three `crc32` streams over three equal thirds, then the tail.
///
/// # Safety
/// The CPU must support SSE4.2 and PCLMULQDQ.
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(crate) fn crc_sse42_3way(state: u32, data: &[u8]) -> u32 {
    let words = data.len() / 24;
    if words < 8 {
        return crc_words(state, data);
    }
    let stream = words * 8;
    let (a, rest) = data.split_at(stream);
    let (b, rest) = rest.split_at(stream);
    let (c, tail) = rest.split_at(stream);
    let (mut ca, mut cb, mut cc) = (state, 0u32, 0u32);
    let a = a.as_chunks::<8>().0;
    let b = b.as_chunks::<8>().0;
    let c = c.as_chunks::<8>().0;
    for ((x, y), z) in a.iter().zip(b).zip(c) {
        ca = _mm_crc32_u64(u64::from(ca), u64::from_le_bytes(*x)) as u32;
        cb = _mm_crc32_u64(u64::from(cb), u64::from_le_bytes(*y)) as u32;
        cc = _mm_crc32_u64(u64::from(cc), u64::from_le_bytes(*z)) as u32;
    }
    let k = shift_constant(stream);
    crc_words(join(join(ca, cb, k), cc, k), tail)
}

#[target_feature(enable = "sse2")]
fn load128(b: &[u8; 16]) -> __m128i {
    // SAFETY: `b` is 16 readable bytes; the load has no alignment need.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[target_feature(enable = "sse2")]
fn lane(k: [u64; 2]) -> __m128i {
    _mm_set_epi64x(k[1] as i64, k[0] as i64)
}

/// Moves a 128-bit lane `k`'s distance forward (still to be XORed with the
/// data found there).
#[target_feature(enable = "sse2,pclmulqdq")]
fn fold128(acc: __m128i, k: __m128i) -> __m128i {
    _mm_xor_si128(
        _mm_clmulepi64_si128(acc, k, 0x00),
        _mm_clmulepi64_si128(acc, k, 0x11),
    )
}

/// The CRC of a 16-byte remainder.
#[target_feature(enable = "sse4.2")]
fn finish128(r: __m128i) -> u32 {
    let lo = _mm_cvtsi128_si64(r) as u64;
    let hi = _mm_extract_epi64::<1>(r) as u64;
    _mm_crc32_u64(_mm_crc32_u64(0, lo), hi) as u32
}

/// Four lanes at consecutive 16-byte offsets into one CRC.
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn finish4x128(acc: [__m128i; 4]) -> u32 {
    let r = _mm_xor_si128(
        _mm_xor_si128(acc[3], fold128(acc[0], lane(K48))),
        _mm_xor_si128(fold128(acc[1], lane(K32)), fold128(acc[2], lane(K16))),
    );
    finish128(r)
}

/// Splits a 64-byte block into its four 16-byte lanes.
fn quarters(b: &[u8; 64]) -> [&[u8; 16]; 4] {
    let (q, _) = b.as_chunks::<16>();
    [&q[0], &q[1], &q[2], &q[3]]
}

/// Bytes of one `crc32` stream per loop iteration of `crc_pclmul_fused`.
const FUSED_STREAM: usize = 24;
/// Bytes one loop iteration of `crc_pclmul_fused` consumes.
const FUSED_STEP: usize = 64 + 3 * FUSED_STREAM;

/// Four PCLMULQDQ lanes over the first part, three `crc32` streams over
/// the three parts after it, all in one loop.
///
/// # Safety
/// The CPU must support SSE4.2 and PCLMULQDQ.
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(crate) fn crc_pclmul_fused(state: u32, data: &[u8]) -> u32 {
    let iters = data.len() / FUSED_STEP;
    if iters < 4 {
        return crc_sse42_3way(state, data);
    }
    let stream = FUSED_STREAM * iters;
    let (v, rest) = data.split_at(64 * iters);
    let (s1, rest) = rest.split_at(stream);
    let (s2, rest) = rest.split_at(stream);
    let (s3, tail) = rest.split_at(stream);
    let v = v.as_chunks::<64>().0;
    let s1 = s1.as_chunks::<FUSED_STREAM>().0;
    let s2 = s2.as_chunks::<FUSED_STREAM>().0;
    let s3 = s3.as_chunks::<FUSED_STREAM>().0;

    let [q0, q1, q2, q3] = quarters(&v[0]);
    let mut acc = [
        _mm_xor_si128(load128(q0), _mm_cvtsi32_si128(state as i32)),
        load128(q1),
        load128(q2),
        load128(q3),
    ];
    let (mut c1, mut c2, mut c3) = (0u32, 0u32, 0u32);
    let k64 = lane(K64);
    for (i, ((x, y), z)) in s1.iter().zip(s2).zip(s3).enumerate() {
        if i > 0 {
            let q = quarters(&v[i]);
            for (a, d) in acc.iter_mut().zip(q) {
                *a = _mm_xor_si128(fold128(*a, k64), load128(d));
            }
        }
        let (x, y, z) = (
            x.as_chunks::<8>().0,
            y.as_chunks::<8>().0,
            z.as_chunks::<8>().0,
        );
        for j in 0..FUSED_STREAM / 8 {
            c1 = _mm_crc32_u64(u64::from(c1), u64::from_le_bytes(x[j])) as u32;
            c2 = _mm_crc32_u64(u64::from(c2), u64::from_le_bytes(y[j])) as u32;
            c3 = _mm_crc32_u64(u64::from(c3), u64::from_le_bytes(z[j])) as u32;
        }
    }
    let k = shift_constant(stream);
    let crc = join(join(join(finish4x128(acc), c1, k), c2, k), c3, k);
    crc_words(crc, tail)
}

#[target_feature(enable = "avx")]
fn load256(b: &[u8; 32]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; the load has no alignment need.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx")]
fn lane256(k: [u64; 2]) -> __m256i {
    _mm256_set_epi64x(k[1] as i64, k[0] as i64, k[1] as i64, k[0] as i64)
}

#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold256(acc: __m256i, k: __m256i) -> __m256i {
    _mm256_xor_si256(
        _mm256_clmulepi64_epi128(acc, k, 0x00),
        _mm256_clmulepi64_epi128(acc, k, 0x11),
    )
}

/// Inputs from this size on are folded as [`REGIONS`] independent parts in
/// one loop: out of cache, several sequential streams keep more memory
/// requests in flight than one.
const TWO_STREAM_MIN: usize = 256 << 10;

/// How many independent regions large inputs are split into.
const REGIONS: usize = 3;

/// The four 32-byte lanes of a 128-byte block.
#[target_feature(enable = "avx")]
fn lanes256(b: &[u8; 128]) -> [__m256i; 4] {
    let (q, _) = b.as_chunks::<32>();
    [
        load256(&q[0]),
        load256(&q[1]),
        load256(&q[2]),
        load256(&q[3]),
    ]
}

/// Starts four 256-bit lanes on the first block, with the CRC register
/// folded into its first four bytes.
#[target_feature(enable = "avx2")]
fn start256(state: u32, first: &[u8; 128]) -> [__m256i; 4] {
    let mut acc = lanes256(first);
    acc[0] = _mm256_xor_si256(
        acc[0],
        _mm256_zextsi128_si256(_mm_cvtsi32_si128(state as i32)),
    );
    acc
}

/// Folds four lanes 128 bytes forward onto the next block.
#[target_feature(enable = "avx2,vpclmulqdq")]
fn step256(acc: &mut [__m256i; 4], next: &[u8; 128], k128: __m256i) {
    for (a, d) in acc.iter_mut().zip(lanes256(next)) {
        *a = _mm256_xor_si256(fold256(*a, k128), d);
    }
}

/// The CRC of four lanes at consecutive 32-byte offsets.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
fn finish256(acc: [__m256i; 4]) -> u32 {
    let r = _mm256_xor_si256(
        _mm256_xor_si256(acc[3], fold256(acc[0], lane256(K96))),
        _mm256_xor_si256(fold256(acc[1], lane256(K64)), fold256(acc[2], lane256(K32))),
    );
    let lo = _mm256_castsi256_si128(r);
    let hi = _mm256_extracti128_si256::<1>(r);
    finish128(_mm_xor_si128(hi, fold128(lo, lane(K16))))
}

/// Four 256-bit VPCLMULQDQ lanes, 128 bytes per iteration; from
/// [`TWO_STREAM_MIN`] on, one such set per region.
///
/// # Safety
/// The CPU must support AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.2.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
pub(crate) fn crc_avx2_vpclmul(state: u32, data: &[u8]) -> u32 {
    if data.len() < 512 {
        return crc_sse42_3way(state, data);
    }
    let k128 = lane256(K128);
    if data.len() < TWO_STREAM_MIN {
        let (blocks, tail) = data.as_chunks::<128>();
        let mut acc = start256(state, &blocks[0]);
        for b in &blocks[1..] {
            step256(&mut acc, b, k128);
        }
        return crc_words(finish256(acc), tail);
    }
    let part = data.len() / (REGIONS * 128) * 128;
    let (body, tail) = data.split_at(REGIONS * part);
    let (regions, _) = body.as_chunks::<128>();
    let per = part / 128;
    let mut acc: [[__m256i; 4]; REGIONS] =
        core::array::from_fn(|r| start256(if r == 0 { state } else { 0 }, &regions[r * per]));
    for i in 1..per {
        for (r, acc) in acc.iter_mut().enumerate() {
            step256(acc, &regions[r * per + i], k128);
        }
    }
    let k = shift_constant(part);
    let mut crc = finish256(acc[0]);
    for a in &acc[1..] {
        crc = join(crc, finish256(*a), k);
    }
    crc_words(crc, tail)
}

#[target_feature(enable = "avx512f")]
fn load512(b: &[u8; 64]) -> __m512i {
    // SAFETY: `b` is 64 readable bytes; the load has no alignment need.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx512f")]
fn lane512(k: [u64; 2]) -> __m512i {
    let (lo, hi) = (k[0] as i64, k[1] as i64);
    _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
}

/// `fold(acc) ^ d` with one three-way XOR.
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold512_xor(acc: __m512i, k: __m512i, d: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64::<0x96>(
        _mm512_clmulepi64_epi128(acc, k, 0x00),
        _mm512_clmulepi64_epi128(acc, k, 0x11),
        d,
    )
}

/// Four 512-bit VPCLMULQDQ lanes, 256 bytes per iteration.
///
/// # Safety
/// The CPU must support AVX-512F/VL, VPCLMULQDQ, PCLMULQDQ and SSE4.2.
#[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.2")]
pub(crate) fn crc_avx512_vpclmul(state: u32, data: &[u8]) -> u32 {
    if data.len() < 1024 {
        return crc_sse42_3way(state, data);
    }
    let (blocks, tail) = data.as_chunks::<256>();
    let lanes = |b: &[u8; 256]| -> [__m512i; 4] {
        let (q, _) = b.as_chunks::<64>();
        [
            load512(&q[0]),
            load512(&q[1]),
            load512(&q[2]),
            load512(&q[3]),
        ]
    };
    let mut acc = lanes(&blocks[0]);
    acc[0] = _mm512_xor_si512(
        acc[0],
        _mm512_zextsi128_si512(_mm_cvtsi32_si128(state as i32)),
    );
    let k256 = lane512(K256);
    for b in &blocks[1..] {
        let d = lanes(b);
        for (a, d) in acc.iter_mut().zip(d) {
            *a = fold512_xor(*a, k256, d);
        }
    }
    let r = fold512_xor(acc[0], lane512(K192), acc[3]);
    let r = fold512_xor(acc[1], lane512(K128), r);
    let r = fold512_xor(acc[2], lane512(K64), r);
    let l0 = _mm512_extracti32x4_epi32::<0>(r);
    let l1 = _mm512_extracti32x4_epi32::<1>(r);
    let l2 = _mm512_extracti32x4_epi32::<2>(r);
    let l3 = _mm512_extracti32x4_epi32::<3>(r);
    let x = _mm_ternarylogic_epi64::<0x96>(l3, fold128(l0, lane(K48)), fold128(l1, lane(K32)));
    let crc = finish128(_mm_xor_si128(x, fold128(l2, lane(K16))));
    crc_words(crc, tail)
}
