//! Copy and CRC32C kernels with a run-time choice of the fastest path.
//!
//! Every byte sluice serves is copied into a guest or user buffer and
//! checksummed with CRC32C; this crate owns both operations.
//!
//! - [`copy`] / [`copy_raw`]: AVX2 / AVX-512 loops with non-temporal stores
//!   for large copies on x86_64; NEON `ldp`/`stp` and SVE loops on aarch64.
//! - [`crc32c`] / [`crc32c_combine`]: carry-less-multiply folding
//!   (PCLMULQDQ, VPCLMULQDQ, PMULL, with EOR3 where SHA3 exists) fused with
//!   several independent streams of the CPU's `crc32c` instruction.
//!
//! The kernels are chosen once, on first use, from the CPU's features and
//! the `SLUICE_SIMD` environment variable (see [`dispatch`](crate::selected)
//! and DEVELOPERS.md): `SLUICE_SIMD=scalar` forces the portable reference,
//! other values cap the path, e.g. `avx2` on x86_64 or `neon` on aarch64.
//! [`selected`] reports the choice. [`crc32c_kernels`] and [`copy_kernels`]
//! list every kernel this CPU can run, for tests and benchmarks.
//!
//! Layout (as memchr): `arch/x86_64`, `arch/aarch64` hold the SIMD kernels,
//! [`scalar`] the oracle they are all tested against, `dispatch` the choice.

mod arch;
mod dispatch;
mod error;
mod kernels;
mod polynomial;
pub mod scalar;

pub use error::SimdError;
pub use kernels::{CopyKernel, CrcKernel, copy_kernels, crc32c_kernels};

/// Copies `src` into `dst` with the selected copy kernel. Panics when the
/// lengths differ, as `<[u8]>::copy_from_slice` does.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy: destination and source lengths differ"
    );
    // SAFETY: `dst` is writable and `src` readable for their common length,
    // and a `&mut` slice never overlaps a live `&` slice.
    unsafe { dispatch::copy_raw(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// Copies `len` bytes from `src` to `dst` with the selected copy kernel.
///
/// Overlapping ranges are a caller bug: debug builds panic on them, release
/// builds do not check. Use [`try_copy_raw`] where the ranges come from
/// outside (a guest) and may overlap.
///
/// # Safety
/// - When `len > 0`, `src` must be valid for reads and `dst` valid for
///   writes of `len` bytes; when `len == 0` nothing is accessed and any
///   pointers are accepted.
/// - The two ranges must not overlap.
/// - Either range may be memory another party changes concurrently (guest
///   memory shared with a VM): the bytes copied are then some mix of the
///   values the loads observed, each byte a value that byte held. No Rust
///   reference to such memory may be alive during the copy.
pub unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(
        !overlaps(dst as usize, src as usize, len),
        "copy_raw: source and destination overlap"
    );
    if len == 0 {
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { dispatch::copy_raw(dst, src, len) }
}

/// [`copy_raw`] that checks the ranges first and returns
/// [`SimdError::Overlap`] instead of copying when they overlap.
///
/// # Safety
/// As [`copy_raw`], except that overlapping ranges are allowed (and
/// rejected).
pub unsafe fn try_copy_raw(dst: *mut u8, src: *const u8, len: usize) -> Result<(), SimdError> {
    if overlaps(dst as usize, src as usize, len) {
        return Err(SimdError::Overlap {
            dst: dst as usize,
            src: src as usize,
            len,
        });
    }
    // SAFETY: the caller guarantees validity; the ranges are disjoint.
    unsafe { copy_raw(dst, src, len) };
    Ok(())
}

/// Whether `[dst, dst+len)` and `[src, src+len)` share a byte.
fn overlaps(dst: usize, src: usize, len: usize) -> bool {
    len != 0 && dst.abs_diff(src) < len
}

/// CRC32C (Castagnoli) of `data`, continuing from `seed` (0 for a fresh CRC):
/// `crc32c(crc32c(0, a), b) == crc32c(0, a ‖ b)`.
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    !dispatch::crc32c_raw(!seed, data)
}

/// [`crc32c`] of the `len` bytes at `data`: for memory that is not a Rust
/// slice, such as guest memory a READ's data just landed in.
///
/// # Safety
/// - When `len > 0`, `data` must be valid for reads of `len` bytes; when
///   `len == 0` nothing is read and any pointer is accepted.
/// - The range may be memory another party changes concurrently (guest
///   memory shared with a VM): the CRC is then that of some mix of the
///   values the loads observed. No Rust `&mut` reference to the range may be
///   alive during the call.
pub unsafe fn crc32c_raw(seed: u32, data: *const u8, len: usize) -> u32 {
    if len == 0 {
        return seed;
    }
    // SAFETY: `data` is valid for reads of `len` bytes (the caller's
    // contract). The kernels only load through the slice and nothing here
    // writes it; a change by another process while they load is the mix
    // described above (as for `copy_raw`'s sources).
    let bytes = unsafe { std::slice::from_raw_parts(data, len) };
    crc32c(seed, bytes)
}

/// The CRC32C of `a ‖ b` from `crc_a = crc32c(0, a)`, `crc_b = crc32c(0, b)`
/// and `len_b = b.len()`, without reading the data again.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    scalar::crc32c_combine(crc_a, crc_b, len_b)
}

/// The kernels in use and how they were chosen, for the command line and
/// the logs, e.g. `crc32c=x86_64/avx2-vpclmulqdq copy=x86_64/avx2 (auto)`.
pub fn selected() -> String {
    dispatch::describe()
}

/// Checks `SLUICE_SIMD`: an unknown value is otherwise ignored (the kernels
/// fall back to automatic choice), so the command line calls this at start
/// to tell the user.
pub fn check_env() -> Result<(), SimdError> {
    dispatch::check_env()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_rule() {
        assert!(!overlaps(100, 200, 0));
        assert!(!overlaps(100, 200, 100)); // adjacent
        assert!(!overlaps(200, 100, 100)); // adjacent, other order
        assert!(overlaps(100, 200, 101));
        assert!(overlaps(200, 100, 101));
        assert!(overlaps(100, 100, 1));
    }

    #[test]
    fn try_copy_raw_rejects_overlap_and_copies_disjoint() {
        let mut buf: Vec<u8> = (0..64u8).collect();
        let p = buf.as_mut_ptr();
        for (d, s, len) in [
            (0usize, 1usize, 2usize),
            (1, 0, 2),
            (0, 0, 1),
            (10, 20, 11),
            (20, 10, 11),
        ] {
            // SAFETY: all ranges lie inside `buf`, which outlives the calls.
            let r = unsafe { try_copy_raw(p.add(d), p.add(s), len) };
            assert!(matches!(r, Err(SimdError::Overlap { len: l, .. }) if l == len));
        }
        assert_eq!(buf, (0..64u8).collect::<Vec<_>>(), "a rejected copy wrote");
        // SAFETY: [32, 64) and [0, 32) are disjoint parts of `buf`.
        unsafe { try_copy_raw(p.add(32), p, 32) }.expect("disjoint halves");
        assert_eq!(&buf[32..], &buf[..32]);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "overlap")]
    fn copy_raw_panics_on_overlap_in_debug_builds() {
        let mut buf = [0u8; 16];
        let p = buf.as_mut_ptr();
        // SAFETY: in bounds; the overlap is the point (debug_assert fires
        // before any access).
        unsafe { copy_raw(p.add(1), p, 8) };
    }

    #[test]
    fn zero_length_raw_copy_touches_nothing() {
        // SAFETY: len 0 accepts any pointers.
        unsafe { copy_raw(std::ptr::null_mut(), std::ptr::null(), 0) };
    }

    #[test]
    fn public_crc_known_answer_and_seed_chaining() {
        assert_eq!(crc32c(0, b"123456789"), 0xE306_9283);
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 13) as u8).collect();
        let (a, b) = data.split_at(1234);
        assert_eq!(crc32c(crc32c(0, a), b), crc32c(0, &data));
        assert_eq!(
            crc32c_combine(crc32c(0, a), crc32c(0, b), b.len() as u64),
            crc32c(0, &data)
        );
        // SAFETY: `data` is a live buffer of that length; len 0 reads nothing.
        unsafe {
            assert_eq!(crc32c_raw(0, data.as_ptr(), data.len()), crc32c(0, &data));
            assert_eq!(crc32c_raw(7, std::ptr::null(), 0), 7);
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn copy_panics_on_length_mismatch() {
        copy(&mut [0u8; 3], &[0u8; 4]);
    }
}
