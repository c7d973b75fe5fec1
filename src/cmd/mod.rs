//! One module per subcommand of the `sluice` program.

pub mod cache_args;
pub mod format;
pub mod gc;
pub mod info;
pub mod mount;
pub mod objbench;
pub mod serve;
