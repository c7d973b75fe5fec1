//! aarch64 kernels and their order of preference.

mod copy;
mod crc32c;

use std::arch::is_aarch64_feature_detected as has;

use super::{SCALAR_COPY, SCALAR_CRC};
use crate::dispatch::{CopyFn, CrcFn, Kernel, always};

/// Architecture name printed by `selected()`.
pub(crate) const NAME: &str = "aarch64";

/// `SLUICE_SIMD` values, lowest first. Each caps the kernels at that path:
/// `neon` = NEON copy, scalar CRC; `crc` = one `crc32cx` stream; `pmull` =
/// PMULL folding fused with three `crc32cx` streams; `sha3` = the same with
/// EOR3; `sve` = the SVE copy.
pub(crate) const PATHS: &[&str] = &["scalar", "neon", "crc", "pmull", "sha3", "sve"];

fn crc_pmull_sha3() -> bool {
    has!("crc") && has!("aes") && has!("sha3")
}

fn crc_pmull() -> bool {
    has!("crc") && has!("aes")
}

fn crc() -> bool {
    has!("crc")
}

fn sve() -> bool {
    has!("sve")
}

/// The SVE copy is taken automatically only where vectors are wider than
/// NEON's 16 bytes: at 128-bit SVE (Neoverse N2/V2, Graviton 4) the NEON
/// `ldp`/`stp` loop moves the same 32 bytes per instruction pair and
/// measures at least as fast; at 256 bits and up (Graviton 3, A64FX) SVE
/// moves more per instruction. `SLUICE_SIMD=sve` forces it anywhere.
fn sve_wider_than_neon() -> bool {
    // SAFETY: only called after `sve()` (see `dispatch::choose`, which
    // checks `supported` first).
    sve() && unsafe { copy::sve_vector_bytes() } > 16
}

/// CRC kernels, best first.
pub(crate) static CRC_KERNELS: &[Kernel<CrcFn>] = &[
    Kernel {
        name: "pmull-eor3-fused",
        path: 4,
        func: crc32c::crc_pmull_eor3_fused,
        supported: crc_pmull_sha3,
        preferred: always,
    },
    Kernel {
        name: "pmull-fused",
        path: 3,
        func: crc32c::crc_pmull_fused,
        supported: crc_pmull,
        preferred: always,
    },
    Kernel {
        name: "crc32c",
        path: 2,
        func: crc32c::crc_words,
        supported: crc,
        preferred: always,
    },
    SCALAR_CRC,
];

/// Copy kernels, best first.
pub(crate) static COPY_KERNELS: &[Kernel<CopyFn>] = &[
    Kernel {
        name: "sve",
        path: 5,
        func: copy::copy_sve,
        supported: sve,
        preferred: sve_wider_than_neon,
    },
    Kernel {
        name: "neon",
        path: 1,
        func: copy::copy_neon,
        supported: always,
        preferred: always,
    },
    SCALAR_COPY,
];
