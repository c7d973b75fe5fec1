//! Copy and CRC32C kernels with a run-time choice of the fastest path.
//!
//! This first version holds only the scalar reference kernels; the SIMD
//! kernels and the run-time dispatch grow from here (issue: simd kernels).

pub mod scalar;

/// Copies `src` into `dst`. Panics when the lengths differ, as
/// `<[u8]>::copy_from_slice` does.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy: destination and source lengths differ"
    );
    scalar::copy(dst, src);
}

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// `src` must be valid for reads and `dst` valid for writes of `len` bytes,
/// and the two ranges must not overlap. Either may be memory another party
/// changes concurrently (guest memory): the bytes copied are then whatever the
/// loads observed, and no Rust reference to that memory may be alive.
pub unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller upholds validity and non-overlap for `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// CRC32C (Castagnoli) of `data`, continuing from `seed` (0 for a fresh CRC).
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    scalar::crc32c(seed, data)
}

/// The CRC32C of `a ‖ b` from `crc_a = crc32c(0, a)`, `crc_b = crc32c(0, b)`
/// and `len_b = b.len()`, without reading the data again.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    scalar::crc32c_combine(crc_a, crc_b, len_b)
}

/// The kernels in use, for the command line and the logs.
pub fn selected() -> String {
    "copy=scalar crc32c=scalar".to_string()
}
