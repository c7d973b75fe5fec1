//! sluice fuse crate.
