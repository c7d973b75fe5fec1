//! One module per subcommand of the `sluice` program.

pub mod cache_args;
pub mod commit_args;
pub mod completions;
pub mod control;
pub mod dump;
pub mod format;
pub mod fsck;
pub mod gc;
pub mod host;
pub mod host_registry;
pub mod info;
pub mod libvirt;
pub mod limit_args;
pub mod memory_args;
pub mod metrics_args;
pub mod mount;
pub mod objbench;
pub mod quota;
pub mod readahead_args;
pub mod serve;
pub mod socket_cleanup;
pub mod stats;
pub mod status;
pub mod warmup;
pub mod writeback_args;
