//! The limits `sluice serve` holds its guest to (issue 19: one hostile
//! guest must not take the daemon's memory for itself).

use anyhow::bail;
use sluice_engine::size::{SizeRange, Unit, size_parser};
use sluice_engine::vfs::{DEFAULT_MAX_DIR_ENTRIES, VfsConfig};
use sluice_fuse::export::ClientLimits;

/// What one guest may hold. Past a limit a request does nothing and
/// answers its errno, with one rate-limited warning naming the flag.
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Open file and directory handles the guest may hold (ENFILE past it).
    #[arg(long, value_name = "N", default_value_t = ClientLimits::DEFAULT_MAX_HANDLES)]
    pub max_handles: u64,
    /// Node ids the guest may hold in an `--export`ed directory (ENFILE for
    /// LOOKUP and creates past it; READDIRPLUS then lists by name only).
    #[arg(long, value_name = "N", default_value_t = ClientLimits::DEFAULT_MAX_NODES)]
    pub max_nodes: u64,
    /// Directory entries the guest's open directory listings may hold in
    /// memory together (ENOMEM for a listing past it).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_DIR_ENTRIES)]
    pub max_dir_entries: u64,
    /// The largest extended attribute value the guest may set: a size (a
    /// bare number is bytes) up to 64K, Linux's limit (E2BIG past it).
    #[arg(
        long,
        value_name = "SIZE",
        default_value_t = ClientLimits::MAX_XATTR_SIZE,
        value_parser = size_parser(Unit::Bytes, SizeRange::new(0, ClientLimits::MAX_XATTR_SIZE))
    )]
    pub max_xattr_size: u64,
}

impl LimitArgs {
    /// Checks the values; returns the export's limits and puts the
    /// engine's into `cfg`.
    pub fn apply(&self, cfg: &mut VfsConfig) -> anyhow::Result<ClientLimits> {
        if self.max_handles == 0 || self.max_nodes == 0 || self.max_dir_entries == 0 {
            bail!("--max-handles, --max-nodes and --max-dir-entries must be at least 1");
        }
        cfg.max_dir_entries = self.max_dir_entries;
        Ok(ClientLimits {
            max_handles: self.max_handles,
            max_nodes: self.max_nodes,
            max_xattr_size: self.max_xattr_size,
        })
    }
}
