//! Architecture-specific kernels and the per-architecture kernel lists.
//!
//! Each architecture module exports `NAME`, `PATHS` (the `SLUICE_SIMD`
//! values, lowest first, `scalar` at index 0) and `CRC_KERNELS` /
//! `COPY_KERNELS` (best first, ending with the scalar kernel).

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::{COPY_KERNELS, CRC_KERNELS, NAME, PATHS};

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::{COPY_KERNELS, CRC_KERNELS, NAME, PATHS};

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod portable;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) use portable::{COPY_KERNELS, CRC_KERNELS, NAME, PATHS};

use crate::dispatch::{CopyFn, CrcFn, Kernel, always};
use crate::scalar;

/// The scalar CRC kernel, last in every list.
pub(crate) const SCALAR_CRC: Kernel<CrcFn> = Kernel {
    name: "scalar",
    path: 0,
    func: scalar_crc,
    supported: always,
    preferred: always,
};

/// The scalar copy kernel, last in every list.
pub(crate) const SCALAR_COPY: Kernel<CopyFn> = Kernel {
    name: "scalar",
    path: 0,
    func: scalar::copy_raw,
    supported: always,
    preferred: always,
};

/// [`scalar::crc32c_raw`] with the kernel signature.
///
/// # Safety
/// None: the kernel type is `unsafe fn` for the SIMD kernels' sake.
unsafe fn scalar_crc(state: u32, data: &[u8]) -> u32 {
    scalar::crc32c_raw(state, data)
}
