//! sluice numa crate.
