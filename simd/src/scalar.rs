//! Portable reference kernels: the oracle every SIMD kernel is tested against.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

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

/// Plain byte copy.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

/// Table-driven CRC32C.
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    let mut crc = !seed;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Multiplies two polynomials modulo the CRC polynomial (reflected).
fn gf2_mul(mut a: u32, mut b: u32) -> u32 {
    let mut p = 0u32;
    while b != 0 {
        if b & 0x8000_0000 != 0 {
            p ^= a;
        }
        b <<= 1;
        a = if a & 1 != 0 { (a >> 1) ^ POLY } else { a >> 1 };
    }
    p
}

/// x^(8·len) mod P in the reflected domain, by square-and-multiply.
fn x_pow_8n(mut len: u64) -> u32 {
    // x^8 in reflected form, then repeated squaring.
    let mut result = 0x8000_0000u32; // x^0
    let mut base = 0x0080_0000u32; // x^8
    while len != 0 {
        if len & 1 != 0 {
            result = gf2_mul(result, base);
        }
        base = gf2_mul(base, base);
        len >>= 1;
    }
    result
}

/// CRC32C of the concatenation from the CRCs of the parts.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    gf2_mul(crc_a, x_pow_8n(len_b)) ^ crc_b
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
