//! sluice benches crate.

pub mod virtiofs;
