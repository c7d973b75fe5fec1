//! sluice benches crate.

pub mod reactor;
