//! x86_64 kernels and their order of preference.

mod copy;
mod crc32c;

use super::{SCALAR_COPY, SCALAR_CRC};
use crate::dispatch::{CopyFn, CrcFn, Kernel, always};

/// Architecture name printed by `selected()`.
pub(crate) const NAME: &str = "x86_64";

/// `SLUICE_SIMD` values, lowest first. Each caps the kernels at that path:
/// `sse42` = `crc32` instruction streams (with PCLMULQDQ to join them) and
/// the C library's `memcpy`; `pclmul` = PCLMULQDQ folding fused with `crc32`
/// streams; `avx2` = 256-bit VPCLMULQDQ CRC and the AVX2 copy; `avx512` =
/// 512-bit VPCLMULQDQ CRC and the AVX-512 copy.
pub(crate) const PATHS: &[&str] = &["scalar", "sse42", "pclmul", "avx2", "avx512"];

macro_rules! detected {
    ($($f:tt),+) => {{
        fn check() -> bool {
            true $(&& std::arch::is_x86_feature_detected!($f))+
        }
        check
    }};
}

/// CRC kernels, best first.
pub(crate) static CRC_KERNELS: &[Kernel<CrcFn>] = &[
    Kernel {
        name: "avx512-vpclmulqdq",
        path: 4,
        func: crc32c::crc_avx512_vpclmul,
        supported: detected!("avx512f", "avx512vl", "vpclmulqdq", "pclmulqdq", "sse4.2"),
        preferred: always,
    },
    Kernel {
        name: "avx2-vpclmulqdq",
        path: 3,
        func: crc32c::crc_avx2_vpclmul,
        supported: detected!("avx2", "vpclmulqdq", "pclmulqdq", "sse4.2"),
        preferred: always,
    },
    Kernel {
        name: "pclmul-fused",
        path: 2,
        func: crc32c::crc_pclmul_fused,
        supported: detected!("pclmulqdq", "sse4.2"),
        preferred: always,
    },
    Kernel {
        name: "sse42-3way",
        path: 1,
        func: crc32c::crc_sse42_3way,
        supported: detected!("pclmulqdq", "sse4.2"),
        preferred: always,
    },
    SCALAR_CRC,
];

/// Copy kernels, best first.
pub(crate) static COPY_KERNELS: &[Kernel<CopyFn>] = &[
    Kernel {
        name: "avx512",
        path: 4,
        func: copy::copy_avx512,
        supported: detected!("avx512f", "avx2"),
        preferred: always,
    },
    Kernel {
        name: "avx2",
        path: 3,
        func: copy::copy_avx2,
        supported: detected!("avx2"),
        preferred: always,
    },
    SCALAR_COPY,
];
