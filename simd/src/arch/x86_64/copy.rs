//! Copy kernels for x86_64: AVX2 and AVX-512 loops.
//!
//! Short copies use overlapping loads and stores from both ends, so there is
//! no byte loop. Long copies store to an aligned destination four vectors at
//! a time; from [`NON_TEMPORAL_THRESHOLD`] up the stores bypass the cache
//! (`vmovntdq`), since a copy that large evicts everything anyway and the
//! read-for-ownership of each destination line would double the traffic.
//!
//! Every kernel reads all of its source before it writes the overlapping
//! parts of its destination only in the sense of the non-overlap contract:
//! source and destination never share a byte.

use core::arch::x86_64::*;
use core::ptr::{read_unaligned, write_unaligned};

/// Copies at least this long use non-temporal stores. Measured on an AMD
/// EPYC (Zen 3, 32 MiB L3) against glibc's `memcpy`: below it the data of a
/// copy and its destination still fit in the last-level cache and a later
/// read of the destination hits there.
pub(crate) const NON_TEMPORAL_THRESHOLD: usize = 8 << 20;

/// Copies up to 32 bytes with two overlapping moves of the largest size
/// that fits.
///
/// # Safety
/// `src` readable and `dst` writable for `len ≤ 32` bytes, disjoint.
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn copy_upto32(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len <= 32);
    // SAFETY: every access below stays within [0, len) of its range, which
    // the caller guarantees valid; the widths are chosen by `len`.
    unsafe {
        if len >= 16 {
            let a = _mm_loadu_si128(src.cast());
            let b = _mm_loadu_si128(src.add(len - 16).cast());
            _mm_storeu_si128(dst.cast(), a);
            _mm_storeu_si128(dst.add(len - 16).cast(), b);
        } else if len >= 8 {
            let a = read_unaligned(src.cast::<u64>());
            let b = read_unaligned(src.add(len - 8).cast::<u64>());
            write_unaligned(dst.cast::<u64>(), a);
            write_unaligned(dst.add(len - 8).cast::<u64>(), b);
        } else if len >= 4 {
            let a = read_unaligned(src.cast::<u32>());
            let b = read_unaligned(src.add(len - 4).cast::<u32>());
            write_unaligned(dst.cast::<u32>(), a);
            write_unaligned(dst.add(len - 4).cast::<u32>(), b);
        } else if len >= 2 {
            let a = read_unaligned(src.cast::<u16>());
            let b = read_unaligned(src.add(len - 2).cast::<u16>());
            write_unaligned(dst.cast::<u16>(), a);
            write_unaligned(dst.add(len - 2).cast::<u16>(), b);
        } else if len == 1 {
            *dst = *src;
        }
    }
}

/// Generates a copy kernel over one vector width.
macro_rules! vector_copy {
    (
        $(#[$doc:meta])*
        $name:ident, $features:literal, $vec:ty, $width:literal,
        load: $load:ident, store_unaligned: $storeu:ident,
        store_aligned: $store:ident, stream: $stream:ident,
        short: $short:path, short_max: $short_max:literal
    ) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must have the target features; the pointers follow the
        /// contract of `crate::copy_raw`.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(dst: *mut u8, src: *const u8, len: usize) {
            const W: usize = $width;
            // SAFETY: (whole body) all loads stay within [src, src+len) and
            // all stores within [dst, dst+len): each access of W bytes
            // starts at an offset in [0, len - W] given the length tier it
            // sits in; the caller guarantees those ranges valid and
            // disjoint. Aligned stores are made only at addresses rounded
            // up to W.
            unsafe {
                let ld = |p: *const u8| -> $vec { $load(p.cast()) };
                if len <= $short_max {
                    return $short(dst, src, len);
                }
                if len <= 2 * W {
                    let (a, b) = (ld(src), ld(src.add(len - W)));
                    $storeu(dst.cast(), a);
                    $storeu(dst.add(len - W).cast(), b);
                    return;
                }
                if len <= 4 * W {
                    let (a, b) = (ld(src), ld(src.add(W)));
                    let (c, d) = (ld(src.add(len - 2 * W)), ld(src.add(len - W)));
                    $storeu(dst.cast(), a);
                    $storeu(dst.add(W).cast(), b);
                    $storeu(dst.add(len - 2 * W).cast(), c);
                    $storeu(dst.add(len - W).cast(), d);
                    return;
                }
                if len <= 8 * W {
                    let front = [ld(src), ld(src.add(W)), ld(src.add(2 * W)), ld(src.add(3 * W))];
                    let t = src.add(len - 4 * W);
                    let back = [ld(t), ld(t.add(W)), ld(t.add(2 * W)), ld(t.add(3 * W))];
                    let u = dst.add(len - 4 * W);
                    for i in 0..4 {
                        $storeu(dst.add(i * W).cast(), front[i]);
                        $storeu(u.add(i * W).cast(), back[i]);
                    }
                    return;
                }
                // Long: the first vector unaligned, then aligned groups of
                // four up to the last 4·W bytes, which go last, unaligned.
                let head = ld(src);
                let skip = W - (dst as usize & (W - 1));
                let mut d = dst.add(skip);
                let mut s = src.add(skip);
                let end = dst.add(len - 4 * W);
                if len >= NON_TEMPORAL_THRESHOLD {
                    while d < end {
                        let v = [ld(s), ld(s.add(W)), ld(s.add(2 * W)), ld(s.add(3 * W))];
                        for (i, v) in v.into_iter().enumerate() {
                            $stream(d.add(i * W).cast(), v);
                        }
                        d = d.add(4 * W);
                        s = s.add(4 * W);
                    }
                    // Non-temporal stores are weakly ordered: fence them
                    // before anyone can observe the copy as done.
                    _mm_sfence();
                } else {
                    while d < end {
                        let v = [ld(s), ld(s.add(W)), ld(s.add(2 * W)), ld(s.add(3 * W))];
                        for (i, v) in v.into_iter().enumerate() {
                            $store(d.add(i * W).cast(), v);
                        }
                        d = d.add(4 * W);
                        s = s.add(4 * W);
                    }
                }
                let t = src.add(len - 4 * W);
                let back = [ld(t), ld(t.add(W)), ld(t.add(2 * W)), ld(t.add(3 * W))];
                let u = dst.add(len - 4 * W);
                for (i, v) in back.into_iter().enumerate() {
                    $storeu(u.add(i * W).cast(), v);
                }
                $storeu(dst.cast(), head);
            }
        }
    };
}

vector_copy!(
    /// AVX2 copy: 32-byte vectors, 128 bytes per loop iteration.
    copy_avx2, "avx2", __m256i, 32,
    load: _mm256_loadu_si256, store_unaligned: _mm256_storeu_si256,
    store_aligned: _mm256_store_si256, stream: _mm256_stream_si256,
    short: copy_upto32, short_max: 32
);

/// Copies up to 64 bytes for the AVX-512 kernel.
///
/// # Safety
/// `src` readable and `dst` writable for `len ≤ 64` bytes, disjoint.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn copy_upto64(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len <= 64);
    // SAFETY: the two 32-byte moves cover [0, len) for 32 < len ≤ 64;
    // shorter lengths go to `copy_upto32` with the same contract.
    unsafe {
        if len <= 32 {
            return copy_upto32(dst, src, len);
        }
        let a = _mm256_loadu_si256(src.cast());
        let b = _mm256_loadu_si256(src.add(len - 32).cast());
        _mm256_storeu_si256(dst.cast(), a);
        _mm256_storeu_si256(dst.add(len - 32).cast(), b);
    }
}

vector_copy!(
    /// AVX-512 copy: 64-byte vectors, 256 bytes per loop iteration.
    copy_avx512, "avx512f,avx2", __m512i, 64,
    load: _mm512_loadu_si512, store_unaligned: _mm512_storeu_si512,
    store_aligned: _mm512_store_si512, stream: _mm512_stream_si512,
    short: copy_upto64, short_max: 64
);
