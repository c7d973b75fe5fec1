//! sluice benches crate.

pub mod kernels;
