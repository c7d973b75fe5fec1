//! Arithmetic on polynomials over GF(2) modulo the CRC32C polynomial, in the
//! reflected bit order CRC32C uses: bit 31 of a `u32` is the coefficient of
//! x^0 and bit 0 that of x^31.
//!
//! Everything here is `const`: the SIMD kernels derive their folding and
//! shifting constants from these functions at compile time instead of
//! carrying tables of magic numbers.

/// The reflected Castagnoli polynomial (x^32 implicit).
pub(crate) const POLY: u32 = 0x82F6_3B78;

/// x^0, the multiplicative identity, in reflected form.
const ONE: u32 = 0x8000_0000;

/// `a · b mod P`.
pub(crate) const fn mul(mut a: u32, mut b: u32) -> u32 {
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

/// `x^n mod P`, by square-and-multiply.
pub(crate) const fn x_pow(n: u64) -> u32 {
    pow(ONE >> 1, n)
}

/// `x^(8n) mod P`: the factor that moves a CRC past `n` bytes.
pub(crate) const fn x_pow_8n(n: u64) -> u32 {
    pow(ONE >> 8, n)
}

/// `base^n mod P`.
const fn pow(mut base: u32, mut n: u64) -> u32 {
    let mut result = ONE;
    while n != 0 {
        if n & 1 != 0 {
            result = mul(result, base);
        }
        base = mul(base, base);
        n >>= 1;
    }
    result
}

/// Constants for one carry-less fold over `distance` bytes: multiplying the
/// low (earlier) 64 bits of a 128-bit lane by `.0` and the high 64 bits by
/// `.1` moves the lane `distance` bytes forward in the message, modulo P.
///
/// A carry-less product of two reflected 64-bit values is the true product
/// times x in the 128-bit reflected frame, and a reflected 32-bit constant
/// held in the low half of a 64-bit lane stands for itself times x^32;
/// hence the `+ 31` and `- 33`.
pub(crate) const fn fold_constants(distance: u64) -> (u64, u64) {
    (
        x_pow(8 * distance + 31) as u64,
        x_pow(8 * distance - 33) as u64,
    )
}

/// `x^(2^i - 33) mod P` for i in 6..64 (entries below 6 are unused).
///
/// Multiplying a CRC by `x^(8n)` on hardware is a carry-less product with
/// `x^(8n - 33)` followed by a 64-bit `crc32c` instruction (which multiplies
/// by x^33 in this frame). The exponent `8n - 33` is assembled from these
/// entries with the same hardware product, which also adds 33 to each
/// exponent; so each entry is stored with 33 taken off.
pub(crate) const SHIFT_TABLE: [u32; 64] = {
    let mut t = [0u32; 64];
    let mut i = 6;
    while i < 64 {
        t[i] = x_pow((1u64 << i) - 33);
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_agree_with_repeated_multiplication() {
        let x = ONE >> 1;
        let mut p = ONE;
        for n in 0..200u64 {
            assert_eq!(x_pow(n), p, "x^{n}");
            p = mul(p, x);
        }
    }

    #[test]
    fn multiplication_is_commutative_and_has_identity() {
        let samples = [0u32, 1, 0x8000_0000, 0xDEAD_BEEF, 0x1234_5678, u32::MAX];
        for &a in &samples {
            assert_eq!(mul(a, ONE), a);
            for &b in &samples {
                assert_eq!(mul(a, b), mul(b, a));
            }
        }
    }
}
