//! The disk-cache flags shared by `sluice mount` and `sluice serve`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use sluice_engine::object::disk_cache::{
    DiskCacheConfig, Eviction, VerifyPolicy, parse_cache_dirs,
};
use sluice_engine::size::{SizeRange, Unit, size_parser};
use sluice_numa::reactor::BackendChoice;

use super::writeback_args::{DEFAULT_CACHE_DIR, first_cache_dir};

/// Where and how block objects are cached on local disks. The disk cache is
/// on only when `--cache-dir` is given: operators choose the NVMe devices
/// (and their NUMA nodes) it lives on. `--writeback` stages in the first
/// directory (the default one without `--cache-dir`).
#[derive(Debug, Clone, clap::Args)]
pub struct CacheArgs {
    /// Disk cache directories, one per NVMe device, separated by ':'; each
    /// may name the NUMA node of its device as DIR@NODE. Blocks go under
    /// DIR/<volume uuid>/raw/ (JuiceFS's layout); --writeback stages blocks
    /// in DIR/<volume uuid>/rawstaging of the first (default
    /// /var/cache/sluice, which turns on no disk cache).
    #[arg(long, value_name = "DIR[@NODE][:DIR[@NODE]...]")]
    pub cache_dir: Option<String>,
    /// Disk cache size over all cache directories: a size (100G; a bare
    /// number is MiB, as JuiceFS's --cache-size); 0: no disk cache.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "100G",
        value_parser = size_parser(Unit::Mib, SizeRange::ANY)
    )]
    pub disk_cache_size: u64,
    /// Share of each cache file system kept free: below it the cache evicts
    /// and stops growing.
    #[arg(long, value_name = "RATIO", default_value_t = 0.1)]
    pub free_space_ratio: f64,
    /// Which cached block goes when the disk cache is full: 2-random, lru
    /// or none (stop caching).
    #[arg(long, value_name = "POLICY", default_value = "2-random")]
    pub cache_eviction: Eviction,
    /// How cached blocks are checked when read: full (every 32 KiB CRC32C)
    /// or none (only that the file is whole).
    #[arg(long, value_name = "POLICY", default_value = "full")]
    pub verify_cache_checksum: VerifyPolicy,
}

impl CacheArgs {
    /// Where `--writeback` stages blocks: the first cache directory.
    pub fn staging_root(&self) -> anyhow::Result<PathBuf> {
        first_cache_dir(self.cache_dir.as_deref().unwrap_or(DEFAULT_CACHE_DIR))
    }

    /// The disk cache these flags ask for, or `None` for no disk cache.
    pub fn disk_cache(&self) -> anyhow::Result<Option<DiskCacheConfig>> {
        let Some(spec) = &self.cache_dir else {
            return Ok(None);
        };
        if !(0.0..1.0).contains(&self.free_space_ratio) {
            bail!(
                "--free-space-ratio takes a share of the disk in [0, 1), such as 0.1, not {}",
                self.free_space_ratio
            );
        }
        if self.disk_cache_size == 0 {
            log::info!("--disk-cache-size 0: the disk cache is off");
            return Ok(None);
        }
        let dirs = parse_cache_dirs(spec).map_err(anyhow::Error::msg)?;
        let backend = BackendChoice::from_env().context("cannot choose the disk cache's I/O")?;
        Ok(Some(DiskCacheConfig {
            free_space_ratio: self.free_space_ratio,
            eviction: self.cache_eviction,
            verify: self.verify_cache_checksum,
            backend,
            ..DiskCacheConfig::new(dirs, self.disk_cache_size)
        }))
    }
}
