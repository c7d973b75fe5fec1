//! The one-time choice of kernels, held in function pointers.
//!
//! As in memchr, each operation's entry point is an `AtomicPtr` that starts
//! out pointing at a detecting function: the first call inspects the CPU and
//! `SLUICE_SIMD`, stores the chosen kernel's address and calls it; every
//! later call is one relaxed load and an indirect call.
//!
//! # `SLUICE_SIMD`
//!
//! Unset or `auto`: the fastest kernels this CPU runs. Otherwise a path name
//! caps the kernels at that path (see [`crate::arch::PATHS`]): the best
//! kernel whose path is at or below the cap and which the CPU supports is
//! used. `scalar` forces the portable reference on every architecture.
//! An unknown value is reported by [`crate::check_env`] and [`crate::selected`]
//! and otherwise treated as `auto`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::SimdError;
use crate::arch;

/// A CRC32C kernel: advances the raw CRC register (no inversions) over data.
///
/// # Safety
/// Only callable when the CPU has the kernel's target features.
pub(crate) type CrcFn = unsafe fn(u32, &[u8]) -> u32;

/// A copy kernel.
///
/// # Safety
/// Only callable when the CPU has the kernel's target features, with the
/// contract of [`crate::copy_raw`] on the pointers.
pub(crate) type CopyFn = unsafe fn(*mut u8, *const u8, usize);

/// One kernel and what it needs.
#[derive(Debug)]
pub(crate) struct Kernel<F> {
    /// Name printed by [`crate::selected`], e.g. `avx2-vpclmulqdq`.
    pub(crate) name: &'static str,
    /// Index into [`arch::PATHS`]: the lowest `SLUICE_SIMD` cap that allows it.
    pub(crate) path: usize,
    /// The entry point.
    pub(crate) func: F,
    /// Whether this CPU has the target features `func` is compiled for.
    pub(crate) supported: fn() -> bool,
    /// Whether automatic selection should take it on this CPU (a kernel
    /// that exists but measures slower than the next one answers false).
    pub(crate) preferred: fn() -> bool,
}

/// Always true.
pub(crate) fn always() -> bool {
    true
}

/// The kernels in use and how they were chosen.
#[derive(Debug)]
pub(crate) struct Selection {
    pub(crate) crc: &'static Kernel<CrcFn>,
    pub(crate) copy: &'static Kernel<CopyFn>,
    pub(crate) request: Result<Option<usize>, SimdError>,
}

/// Parses a `SLUICE_SIMD` value into a path cap (`None` for automatic).
pub(crate) fn parse_request(value: Option<&str>) -> Result<Option<usize>, SimdError> {
    let value = match value.map(str::trim) {
        None | Some("") => return Ok(None),
        Some(v) => v.to_ascii_lowercase(),
    };
    if value == "auto" {
        return Ok(None);
    }
    match arch::PATHS.iter().position(|&p| p == value) {
        Some(i) => Ok(Some(i)),
        None => Err(SimdError::UnknownPath {
            value,
            known: arch::PATHS.join(", "),
        }),
    }
}

/// The first kernel of `list` (best first) allowed by `cap` and the CPU.
pub(crate) fn choose<F>(list: &'static [Kernel<F>], cap: Option<usize>) -> &'static Kernel<F> {
    let fits = |k: &&'static Kernel<F>| match cap {
        Some(cap) => k.path <= cap && (k.supported)(),
        None => (k.supported)() && (k.preferred)(),
    };
    // Every list ends with the scalar kernel (path 0, always supported).
    list.iter()
        .find(fits)
        .unwrap_or_else(|| &list[list.len() - 1])
}

fn selection() -> &'static Selection {
    static SELECTION: OnceLock<Selection> = OnceLock::new();
    SELECTION.get_or_init(|| {
        let env = std::env::var("SLUICE_SIMD").ok();
        let request = parse_request(env.as_deref());
        let cap = request.as_ref().ok().copied().flatten();
        Selection {
            crc: choose(arch::CRC_KERNELS, cap),
            copy: choose(arch::COPY_KERNELS, cap),
            request,
        }
    })
}

/// The report behind [`crate::selected`].
pub(crate) fn describe() -> String {
    let s = selection();
    let how = match &s.request {
        Ok(None) => "auto".to_string(),
        Ok(Some(cap)) => format!("SLUICE_SIMD={}", arch::PATHS[*cap]),
        Err(e) => format!("auto; {e}"),
    };
    format!(
        "crc32c={}/{} copy={}/{} ({how})",
        arch::NAME,
        s.crc.name,
        arch::NAME,
        s.copy.name
    )
}

/// The `SLUICE_SIMD` check behind [`crate::check_env`].
pub(crate) fn check_env() -> Result<(), SimdError> {
    selection().request.clone().map(|_| ())
}

static CRC: AtomicPtr<()> = AtomicPtr::new(detect_crc as CrcFn as *mut ());
static COPY: AtomicPtr<()> = AtomicPtr::new(detect_copy as CopyFn as *mut ());

/// First call of [`crc32c_raw`]: chooses, stores and runs the kernel.
///
/// # Safety
/// None beyond the [`CrcFn`] type's: this function needs no CPU feature.
unsafe fn detect_crc(state: u32, data: &[u8]) -> u32 {
    let f = selection().crc.func;
    CRC.store(f as *mut (), Ordering::Relaxed);
    // SAFETY: `choose` only returns kernels whose features the CPU has.
    unsafe { f(state, data) }
}

/// First call of [`copy_raw`]: chooses, stores and runs the kernel.
///
/// # Safety
/// The contract of [`crate::copy_raw`].
unsafe fn detect_copy(dst: *mut u8, src: *const u8, len: usize) {
    let f = selection().copy.func;
    COPY.store(f as *mut (), Ordering::Relaxed);
    // SAFETY: the CPU has `f`'s features (`choose`); the caller upholds the
    // pointer contract.
    unsafe { f(dst, src, len) }
}

/// Advances the raw CRC register with the selected kernel.
pub(crate) fn crc32c_raw(state: u32, data: &[u8]) -> u32 {
    let p = CRC.load(Ordering::Relaxed);
    // SAFETY: CRC only ever holds a `CrcFn` (the detector or a kernel the
    // CPU supports), stored from a function pointer of that exact type.
    let f = unsafe { std::mem::transmute::<*mut (), CrcFn>(p) };
    // SAFETY: the kernel's CPU features are present (see above).
    unsafe { f(state, data) }
}

/// Copies with the selected kernel.
///
/// # Safety
/// The contract of [`crate::copy_raw`].
pub(crate) unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    let p = COPY.load(Ordering::Relaxed);
    // SAFETY: COPY only ever holds a `CopyFn` (the detector or a supported
    // kernel), stored from a function pointer of that exact type.
    let f = unsafe { std::mem::transmute::<*mut (), CopyFn>(p) };
    // SAFETY: the CPU has the kernel's features; the caller upholds the
    // pointer contract.
    unsafe { f(dst, src, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints the selection; `.ci/aarch64.sh` greps this line.
    #[test]
    fn print_selected() {
        let line = describe();
        println!("sluice-simd selected: {line}");
        assert!(line.starts_with("crc32c="), "{line}");
    }

    #[test]
    fn parse_accepts_every_path_and_auto() {
        assert_eq!(parse_request(None), Ok(None));
        assert_eq!(parse_request(Some("auto")), Ok(None));
        assert_eq!(parse_request(Some(" Scalar ")), Ok(Some(0)));
        for (i, p) in arch::PATHS.iter().enumerate() {
            assert_eq!(parse_request(Some(p)), Ok(Some(i)));
        }
    }

    #[test]
    fn parse_rejects_unknown_paths_with_the_list() {
        let err = parse_request(Some("avx9000")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("SLUICE_SIMD=avx9000"), "{msg}");
        assert!(msg.contains("scalar"), "{msg}");
    }

    #[test]
    fn scalar_cap_selects_scalar_kernels() {
        assert_eq!(choose(arch::CRC_KERNELS, Some(0)).name, "scalar");
        assert_eq!(choose(arch::COPY_KERNELS, Some(0)).name, "scalar");
    }

    #[test]
    fn each_cap_selects_a_supported_kernel_within_it() {
        for cap in 0..arch::PATHS.len() {
            let crc = choose(arch::CRC_KERNELS, Some(cap));
            let copy = choose(arch::COPY_KERNELS, Some(cap));
            assert!(crc.path <= cap && (crc.supported)(), "{}", crc.name);
            assert!(copy.path <= cap && (copy.supported)(), "{}", copy.name);
        }
    }

    #[test]
    fn kernel_lists_end_with_scalar() {
        let crc = arch::CRC_KERNELS.last().map(|k| (k.name, k.path));
        let copy = arch::COPY_KERNELS.last().map(|k| (k.name, k.path));
        assert_eq!(crc, Some(("scalar", 0)));
        assert_eq!(copy, Some(("scalar", 0)));
    }

    #[test]
    fn dispatched_entry_points_match_the_oracle() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + 7) as u8).collect();
        for _ in 0..2 {
            // The second round goes through the stored pointer.
            assert_eq!(crc32c_raw(!0, &data), crate::scalar::crc32c_raw(!0, &data));
            let mut dst = vec![0u8; data.len()];
            // SAFETY: distinct live buffers of the same length.
            unsafe { copy_raw(dst.as_mut_ptr(), data.as_ptr(), data.len()) };
            assert_eq!(dst, data);
        }
    }
}
