//! CRC32C kernels for aarch64.
//!
//! - `crc32c`: one stream of the 64-bit `crc32cx` instruction.
//! - `pmull-fused`: four 128-bit PMULL folding lanes and three `crc32cx`
//!   streams in the same loop, joined at the end with a PMULL shift.
//! - `pmull-eor3-fused`: the same with the SHA3 extension's three-way XOR
//!   (EOR3) in the folding step.
//!
//! The folded 128-bit remainder is finished with two `crc32cx` instructions
//! (it is congruent to the data it replaced), and the constants come from
//! [`crate::polynomial`] at compile time.

use core::arch::aarch64::*;

use crate::polynomial::{SHIFT_TABLE, fold_constants};

const K16: (u64, u64) = fold_constants(16);
const K32: (u64, u64) = fold_constants(32);
const K48: (u64, u64) = fold_constants(48);
const K64: (u64, u64) = fold_constants(64);

/// One `crc32cx` per 8 bytes, then `crc32cb` per byte.
///
/// # Safety
/// The CPU must support the CRC extension.
#[target_feature(enable = "crc")]
pub(crate) fn crc_words(mut crc: u32, data: &[u8]) -> u32 {
    let (words, tail) = data.as_chunks::<8>();
    for w in words {
        crc = __crc32cd(crc, u64::from_le_bytes(*w));
    }
    for &b in tail {
        crc = __crc32cb(crc, b);
    }
    crc
}

/// `a · b · x^33 mod P` (see `polynomial::SHIFT_TABLE`).
#[target_feature(enable = "crc,aes")]
fn mul_x33(a: u32, b: u32) -> u32 {
    let p = vmull_p64(u64::from(a), u64::from(b));
    __crc32cd(0, p as u64)
}

/// `x^(8n - 33) mod P` for `n` a positive multiple of 8.
#[target_feature(enable = "crc,aes")]
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

/// The CRC register after `crc_of_a` continued over bytes whose own CRC is
/// `crc_of_b`, with `k` the shift constant of their length.
#[target_feature(enable = "crc,aes")]
fn join(crc_of_a: u32, crc_of_b: u32, k: u32) -> u32 {
    mul_x33(crc_of_a, k) ^ crc_of_b
}

#[target_feature(enable = "neon")]
fn load(b: &[u8; 16]) -> uint64x2_t {
    // SAFETY: `b` is 16 readable bytes; `ld1 {v.16b}` needs no alignment.
    vreinterpretq_u64_u8(unsafe { vld1q_u8(b.as_ptr()) })
}

/// The two carry-less products of a fold (to be XORed with each other and
/// with the data `k`'s distance ahead).
#[target_feature(enable = "neon,aes")]
fn fold_products(acc: uint64x2_t, k: (u64, u64)) -> (uint64x2_t, uint64x2_t) {
    let lo = vmull_p64(vgetq_lane_u64::<0>(acc), k.0);
    let hi = vmull_p64(vgetq_lane_u64::<1>(acc), k.1);
    (vreinterpretq_u64_p128(lo), vreinterpretq_u64_p128(hi))
}

#[target_feature(enable = "neon,aes")]
fn fold_xor(acc: uint64x2_t, k: (u64, u64), d: uint64x2_t) -> uint64x2_t {
    let (a, b) = fold_products(acc, k);
    veorq_u64(veorq_u64(a, b), d)
}

#[target_feature(enable = "neon,aes,sha3")]
fn fold_eor3(acc: uint64x2_t, k: (u64, u64), d: uint64x2_t) -> uint64x2_t {
    let (a, b) = fold_products(acc, k);
    veor3q_u64(a, b, d)
}

/// The CRC of a 16-byte remainder.
#[target_feature(enable = "neon,crc")]
fn finish128(r: uint64x2_t) -> u32 {
    __crc32cd(__crc32cd(0, vgetq_lane_u64::<0>(r)), vgetq_lane_u64::<1>(r))
}

/// Splits a 64-byte block into its four 16-byte lanes.
fn quarters(b: &[u8; 64]) -> [&[u8; 16]; 4] {
    let (q, _) = b.as_chunks::<16>();
    [&q[0], &q[1], &q[2], &q[3]]
}

/// Bytes of one `crc32cx` stream per loop iteration.
const FUSED_STREAM: usize = 16;
/// Bytes one loop iteration consumes.
const FUSED_STEP: usize = 64 + 3 * FUSED_STREAM;

/// Generates a fused PMULL + `crc32cx` kernel around a fold step.
macro_rules! fused_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $fold:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must have the target features.
        #[target_feature(enable = $features)]
        pub(crate) fn $name(state: u32, data: &[u8]) -> u32 {
            let iters = data.len() / FUSED_STEP;
            if iters < 4 {
                return crc_words(state, data);
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
                veorq_u64(load(q0), vsetq_lane_u64::<0>(u64::from(state), vdupq_n_u64(0))),
                load(q1),
                load(q2),
                load(q3),
            ];
            let (mut c1, mut c2, mut c3) = (0u32, 0u32, 0u32);
            for (i, ((x, y), z)) in s1.iter().zip(s2).zip(s3).enumerate() {
                if i > 0 {
                    let q = quarters(&v[i]);
                    for (a, d) in acc.iter_mut().zip(q) {
                        *a = $fold(*a, K64, load(d));
                    }
                }
                let (x, y, z) = (x.as_chunks::<8>().0, y.as_chunks::<8>().0, z.as_chunks::<8>().0);
                for j in 0..FUSED_STREAM / 8 {
                    c1 = __crc32cd(c1, u64::from_le_bytes(x[j]));
                    c2 = __crc32cd(c2, u64::from_le_bytes(y[j]));
                    c3 = __crc32cd(c3, u64::from_le_bytes(z[j]));
                }
            }
            let r = $fold(acc[0], K48, acc[3]);
            let r = $fold(acc[1], K32, r);
            let r = $fold(acc[2], K16, r);
            let k = shift_constant(stream);
            let crc = join(join(join(finish128(r), c1, k), c2, k), c3, k);
            crc_words(crc, tail)
        }
    };
}

fused_kernel!(
    /// Four PMULL lanes over the first part, three `crc32cx` streams over
    /// the three parts after it, in one loop.
    crc_pmull_fused, "neon,crc,aes", fold_xor
);

fused_kernel!(
    /// [`crc_pmull_fused`] with EOR3 joining each fold's two products and
    /// the new data in one instruction.
    crc_pmull_eor3_fused, "neon,crc,aes,sha3", fold_eor3
);
