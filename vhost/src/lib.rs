//! sluice vhost crate.
