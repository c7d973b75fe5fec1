//! Architectures without SIMD kernels here: the scalar reference only.

use super::{SCALAR_COPY, SCALAR_CRC};
use crate::dispatch::{CopyFn, CrcFn, Kernel};

/// Architecture name printed by `selected()`.
pub(crate) const NAME: &str = std::env::consts::ARCH;

/// `SLUICE_SIMD` values.
pub(crate) const PATHS: &[&str] = &["scalar"];

/// CRC kernels, best first.
pub(crate) static CRC_KERNELS: &[Kernel<CrcFn>] = &[SCALAR_CRC];

/// Copy kernels, best first.
pub(crate) static COPY_KERNELS: &[Kernel<CopyFn>] = &[SCALAR_COPY];
