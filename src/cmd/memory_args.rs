//! The memory flags shared by `sluice mount` and `sluice serve`: the
//! memory block cache and the write buffer per file.

use anyhow::bail;
use sluice_engine::size::{SizeRange, Unit, format_size, size_parser};
use sluice_engine::vfs::VfsConfig;

/// At least 1 MiB, for both.
const AT_LEAST_1_MIB: SizeRange = SizeRange::new(1 << 20, u64::MAX);

/// How much memory the caches and write buffers may take.
#[derive(Debug, Clone, clap::Args)]
pub struct MemoryArgs {
    /// Memory block cache: a size (1G, 512M; a bare number is MiB), at
    /// least 1M and at most this host's memory.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "1G",
        value_parser = size_parser(Unit::Mib, AT_LEAST_1_MIB)
    )]
    pub cache_size: u64,
    /// Fault in the whole memory cache at start (in the background), so
    /// blocks are read into warm memory: the cache's memory is then resident
    /// from the start instead of growing with use.
    #[arg(long)]
    pub cache_prefault: bool,
    /// Write buffer per file: a size (64M; a bare number is MiB), at least
    /// 1M; a file commits in the background beyond it.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "64M",
        value_parser = size_parser(Unit::Mib, AT_LEAST_1_MIB)
    )]
    pub buffer_size: u64,
}

impl MemoryArgs {
    /// Checks the sizes against this host's memory and puts them into `cfg`.
    pub fn apply(&self, mut cfg: VfsConfig) -> anyhow::Result<VfsConfig> {
        let total = host_memory();
        for (flag, bytes) in [
            ("--cache-size", self.cache_size),
            ("--buffer-size", self.buffer_size),
        ] {
            if let Some(total) = total
                && bytes > total
            {
                bail!(
                    "{flag} {} is more than this host's memory ({})",
                    format_size(bytes),
                    format_size(total)
                );
            }
        }
        let usize_of = |flag: &str, bytes: u64| {
            usize::try_from(bytes)
                .map_err(|_| anyhow::anyhow!("{flag} {} is too large", format_size(bytes)))
        };
        cfg.cache_bytes = usize_of("--cache-size", self.cache_size)?;
        cfg.buffer_bytes = usize_of("--buffer-size", self.buffer_size)?;
        cfg.cache_prefault = self.cache_prefault;
        Ok(cfg)
    }
}

/// This host's memory in bytes (`MemTotal` of /proc/meminfo), if it can be
/// read.
fn host_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_past_the_hosts_memory_are_refused() {
        let total = host_memory().expect("/proc/meminfo");
        let args = |cache_size| MemoryArgs {
            cache_size,
            cache_prefault: false,
            buffer_size: 64 << 20,
        };
        let cfg = args(1 << 30).apply(VfsConfig::default()).unwrap();
        assert_eq!((cfg.cache_bytes, cfg.buffer_bytes), (1 << 30, 64 << 20));
        let err = args(total + 1).apply(VfsConfig::default()).unwrap_err();
        assert!(
            err.to_string().contains("more than this host's memory"),
            "{err}"
        );
    }
}
