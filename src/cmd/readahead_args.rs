//! Readahead and prefetch flags shared by `sluice mount` and `sluice serve`.

use anyhow::bail;
use sluice_engine::readahead::ReadaheadConfig;
use sluice_engine::size::{SizeRange, Unit, size_parser};
use sluice_engine::vfs::VfsConfig;

/// How far sluice reads ahead of sequential readers and how much it may
/// fetch for random ones.
#[derive(Debug, Clone, clap::Args)]
pub struct ReadaheadArgs {
    /// Largest readahead window per sequential stream: a size up to 1T (a
    /// bare number is MiB); 0 turns readahead off. A stream's window starts
    /// small and doubles up to it.
    #[arg(
        long,
        default_value = "32M",
        value_name = "SIZE",
        value_parser = size_parser(Unit::Mib, SizeRange::new(0, 1 << 40))
    )]
    pub max_readahead: u64,
    /// Whole-block prefetch a random reader may cause, in bytes per byte it
    /// reads, once the memory cache is full (until then its blocks are
    /// fetched whole); 0: random reads fetch only the bytes asked for.
    #[arg(long, default_value_t = 1.0, value_name = "RATIO")]
    pub readahead_ratio: f64,
    /// Threads fetching blocks in the background for readahead and prefetch
    /// (0 turns both off).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub prefetch: usize,
}

impl ReadaheadArgs {
    /// Checks the values and puts them into `cfg`.
    pub fn apply(&self, mut cfg: VfsConfig) -> anyhow::Result<VfsConfig> {
        if !(self.readahead_ratio.is_finite() && self.readahead_ratio >= 0.0) {
            bail!(
                "--readahead-ratio takes a number ≥ 0 (got {}); 1 lets a random reader fetch as much in whole blocks as it reads",
                self.readahead_ratio
            );
        }
        if self.prefetch > 256 {
            bail!("--prefetch takes at most 256 threads");
        }
        cfg.readahead = ReadaheadConfig {
            max_bytes: self.max_readahead,
            ratio: self.readahead_ratio,
        };
        cfg.prefetch_threads = self.prefetch;
        Ok(cfg)
    }
}
