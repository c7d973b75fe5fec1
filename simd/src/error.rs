//! Errors of the `simd` crate.

/// What went wrong with a copy request or the `SLUICE_SIMD` setting.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SimdError {
    /// The source and destination ranges of a raw copy overlap.
    #[error(
        "copy source {src:#x} and destination {dst:#x} overlap over a length of {len} bytes; \
         the copy kernels need disjoint ranges"
    )]
    Overlap {
        /// Destination start address.
        dst: usize,
        /// Source start address.
        src: usize,
        /// Bytes to copy.
        len: usize,
    },
    /// `SLUICE_SIMD` names no path this architecture has.
    #[error("SLUICE_SIMD={value} is not a known path here; use one of: auto, {known}")]
    UnknownPath {
        /// The value found in the environment.
        value: String,
        /// The paths this architecture accepts, comma-separated.
        known: String,
    },
}
