//! `sluice status`: the writeback backlog of the volumes staged under a
//! cache directory, from the status file the running mount or server
//! rewrites every second and from the staging folder itself.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use sluice_engine::meta::MetaUrl;
use sluice_engine::object::writeback::{read_status, staged_on_disk, volume_dir};

use super::writeback_args::{DEFAULT_CACHE_DIR, first_cache_dir};

/// Arguments of `sluice status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Metadata engine URL of the volume (default: every volume found under
    /// --cache-dir).
    pub meta_url: Option<MetaUrl>,
    /// The cache directories given to `sluice mount`/`serve` (the first one
    /// holds the staging folders).
    #[arg(long, value_name = "DIR[:DIR...]", default_value = DEFAULT_CACHE_DIR)]
    pub cache_dir: String,
}

/// Runs `sluice status`.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let root = first_cache_dir(&args.cache_dir)?;
    let dirs: Vec<PathBuf> = match &args.meta_url {
        Some(url) => {
            let meta = sluice_engine::meta::open_existing_meta(url.expose())
                .with_context(|| format!("cannot open the metadata at {url}"))?;
            let format = meta
                .load()
                .with_context(|| format!("cannot read the volume settings at {url}"))?;
            vec![volume_dir(&root, &format.uuid)]
        }
        None => {
            let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
                .with_context(|| format!("cannot read the cache directory {}", root.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("status").is_file() || p.join("rawstaging").is_dir())
                .collect();
            dirs.sort();
            dirs
        }
    };
    if dirs.is_empty() {
        println!("no writeback staging under {}", root.display());
    }
    for dir in dirs {
        print_volume(&dir)?;
    }
    Ok(())
}

fn print_volume(dir: &Path) -> anyhow::Result<()> {
    let uuid = dir.file_name().unwrap_or_default().to_string_lossy();
    let (blocks, bytes) = staged_on_disk(dir)?;
    println!("volume {uuid}");
    println!("  staging: {}", dir.join("rawstaging").display());
    println!("  staged on disk now: {blocks} blocks, {bytes} bytes");
    let Some(status) = read_status(dir)? else {
        println!("  no status file: no writeback mount or server has run here");
        return Ok(());
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let running = Path::new(&format!("/proc/{}", status.pid)).exists();
    println!(
        "  process: pid {} ({}), status written {} s ago",
        status.pid,
        if running { "running" } else { "not running" },
        now.saturating_sub(status.updated_unix)
    );
    println!("  uploading to: {}", status.bucket);
    let s = &status.stats;
    println!(
        "  backlog: {} blocks, {} bytes ({} uploading)",
        s.pending_blocks, s.pending_bytes, s.uploading
    );
    println!(
        "  since start: {} blocks recovered from an earlier run, {} uploaded ({} bytes), {} failed attempts",
        s.recovered_blocks, s.uploaded_blocks, s.uploaded_bytes, s.failures
    );
    if let Some(e) = &s.last_error {
        println!("  last error: {e}");
    }
    Ok(())
}
