//! sluice benches crate.
