//! Portable reference kernels: the oracle every SIMD kernel is tested against.

use crate::polynomial::{self, POLY};

const fn make_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut k = 0;
        while k < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            k += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

static TABLE: [u32; 256] = make_table();

/// Plain copy (`memcpy` from the C library, through `copy_from_slice`).
pub fn copy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

/// Plain copy between raw ranges.
///
/// # Safety
/// As [`crate::copy_raw`]: `src` readable and `dst` writable for `len`
/// bytes, not overlapping.
pub(crate) unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller guarantees both ranges are valid and disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Table-driven CRC32C.
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    !crc32c_raw(!seed, data)
}

/// The CRC register after feeding `data` into `state`, without the initial
/// and final inversions: the form the SIMD kernels share.
pub(crate) fn crc32c_raw(mut state: u32, data: &[u8]) -> u32 {
    for &b in data {
        state = TABLE[((state ^ u32::from(b)) & 0xFF) as usize] ^ (state >> 8);
    }
    state
}

/// CRC32C of the concatenation from the CRCs of the parts.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    polynomial::mul(crc_a, polynomial::x_pow_8n(len_b)) ^ crc_b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3720_known_answers() {
        assert_eq!(crc32c(0, &[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(0, &[0xFFu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(0, &inc), 0x46DD_794E);
    }

    #[test]
    fn combine_equals_concatenation() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for split in [0usize, 1, 17, 500, 999, 1000] {
            let (a, b) = data.split_at(split);
            let combined = crc32c_combine(crc32c(0, a), crc32c(0, b), b.len() as u64);
            assert_eq!(combined, crc32c(0, &data), "split at {split}");
        }
    }
}
