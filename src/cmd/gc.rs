//! `sluice gc META_URL [--delete]`: objects no slice references.

use std::time::Duration;

use anyhow::Context as _;
use sluice_engine::gc::collect_garbage;
use sluice_engine::meta::MetaUrl;
use sluice_engine::volume::open_volume_url;

/// Arguments of `sluice gc`.
#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: MetaUrl,
    /// Delete the leaked objects (without it, only report them).
    #[arg(long)]
    pub delete: bool,
    /// Spare objects younger than this many seconds (slices still being written).
    #[arg(long, default_value_t = 3600)]
    pub min_age: u64,
}

/// Runs `sluice gc`.
pub fn run(args: GcArgs) -> anyhow::Result<()> {
    let volume = open_volume_url(args.meta_url.expose())
        .with_context(|| format!("cannot open the volume at {}", args.meta_url))?;
    let report = collect_garbage(&volume, Duration::from_secs(args.min_age), !args.delete)?;
    println!(
        "scanned {} objects: {} referenced, {} unreferenced but recent (spared), {} leaked ({} bytes){}",
        report.scanned,
        report.referenced,
        report.too_recent,
        report.orphans.len(),
        report.orphan_bytes,
        if args.delete {
            ", deleted"
        } else {
            "; run with --delete to remove them"
        }
    );
    for key in &report.orphans {
        println!("  {key}");
    }
    Ok(())
}
