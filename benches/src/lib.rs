//! sluice benchmarks: the MLPerf Storage training emulation (`sluice bench mlperf`),
//! a `juicefs bench`-style file-system benchmark (`sluice bench PATH`), small-file
//! rates and a checkpoint burst (`sluice bench files`), the
//! copy/CRC32C kernel benchmark (`sluice bench copy`), the io_uring reactor
//! benchmark (`sluice bench reactor`), the host-side virtio-fs driver harness
//! (`sluice bench virtiofs`) and the command-line glue the `sluice` binary
//! mounts under `sluice bench`.
pub mod command;
pub mod files;
pub mod fsbench;
pub mod kernels;
pub mod mlperf;
pub mod page_cache;
pub mod reactor;
pub mod virtiofs;
