//! One module per subcommand of the `sluice` program.

pub mod format;
pub mod gc;
pub mod info;
pub mod mount;
pub mod objbench;
pub mod serve;
pub mod status;
pub mod writeback_args;
