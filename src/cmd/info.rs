//! `sluice info META_URL|PATH`: a volume's settings, or what a file in a
//! mounted volume is made of.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{Context as _, bail};
use sluice_engine::info::file_chunks;
use sluice_engine::meta::{Context, FileType, MetaUrl, ROOT_INO};
use sluice_engine::redact::redact_url;
use sluice_engine::size::format_size_exact;
use sluice_engine::volume::open_volume_url;

use super::mount::sluice_mount_of;

/// Arguments of `sluice info`.
#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    /// A metadata URL (sqlite3://PATH) or a path inside a sluice mount.
    pub target: MetaUrl,
    /// Print one JSON object (for scripts) instead of text: a volume's
    /// `settings` and `usage`, or a file's `inode`, `type`, `mode`,
    /// `nlink`, `length` and `chunks` (each slice with its object keys).
    #[arg(long)]
    pub json: bool,
}

/// Settings that must never be printed.
const SECRETS: [&str; 4] = ["AccessKey", "SecretKey", "SessionToken", "EncryptKey"];

/// Runs `sluice info`.
pub fn run(args: InfoArgs) -> anyhow::Result<()> {
    if args.target.expose().contains("://") {
        return volume_info(&args.target, args.json);
    }
    let path = std::path::absolute(args.target.expose())?;
    let meta = std::fs::symlink_metadata(&path)
        .with_context(|| format!("cannot stat {}", path.display()))?;
    let Some((mountpoint, meta_url)) = sluice_mount_of(&path)? else {
        bail!(
            "{} is not inside a sluice mount; pass a metadata URL (sqlite3://PATH) for volume settings",
            path.display()
        );
    };
    file_info(
        &MetaUrl::new(meta_url),
        &mountpoint,
        &path,
        meta.ino(),
        args.json,
    )
}

fn volume_info(meta_url: &MetaUrl, json: bool) -> anyhow::Result<()> {
    let volume = open_volume_url(meta_url.expose())
        .with_context(|| format!("cannot open the volume at {meta_url}"))?;
    let mut settings = serde_json::to_value(&volume.format)?;
    if let Some(map) = settings.as_object_mut() {
        for key in SECRETS {
            if map.contains_key(key) {
                map.insert(key.into(), "(removed)".into());
            }
        }
        // JuiceFS keeps a bucket URL as given, keys and all for some stores.
        if let Some(serde_json::Value::String(bucket)) = map.get_mut("Bucket") {
            *bucket = redact_url(bucket);
        }
    }
    let stat = volume.meta.statfs(&Context::internal(), ROOT_INO)?;
    if json {
        let used = stat.total_space.saturating_sub(stat.avail_space);
        let out = serde_json::json!({
            "settings": settings,
            "usage": {
                "used_bytes": used,
                "used_inodes": stat.used_inodes,
                "available_bytes": stat.avail_space,
                "available_inodes": stat.avail_inodes,
            },
        });
        println!("{out}");
        return Ok(());
    }
    println!("{}", serde_json::to_string_pretty(&settings)?);
    println!(
        "used: {} in {} inodes; available: {}, {} inodes",
        format_size_exact(stat.total_space.saturating_sub(stat.avail_space)),
        stat.used_inodes,
        format_size_exact(stat.avail_space),
        stat.avail_inodes
    );
    Ok(())
}

fn file_info(
    meta_url: &MetaUrl,
    mountpoint: &Path,
    path: &Path,
    ino: u64,
    json: bool,
) -> anyhow::Result<()> {
    let volume = open_volume_url(meta_url.expose())
        .with_context(|| format!("cannot open the volume at {meta_url}"))?;
    let attr = volume.meta.getattr(ino)?;
    if json {
        let chunks = if attr.typ == FileType::File {
            file_chunks(&volume, ino, attr.length)?
        } else {
            Vec::new()
        };
        let out = serde_json::json!({
            "path": path.display().to_string(),
            "volume": volume.name(),
            "mountpoint": mountpoint.display().to_string(),
            "inode": ino,
            "type": format!("{:?}", attr.typ),
            "mode": format!("{:o}", attr.mode),
            "nlink": attr.nlink,
            "length": attr.length,
            "chunks": chunks.iter().map(|c| serde_json::json!({
                "index": c.indx,
                "slices": c.slices.iter().zip(&c.objects).map(|(s, objects)| serde_json::json!({
                    "id": s.id,
                    "size": s.size,
                    "pos": s.pos,
                    "off": s.off,
                    "len": s.len,
                    "hole": s.id == 0,
                    "objects": objects,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        println!("{out}");
        return Ok(());
    }
    println!("{}", path.display());
    println!(
        "  volume: {} (mounted on {})",
        volume.name(),
        mountpoint.display()
    );
    println!("  inode: {ino}");
    println!(
        "  type: {:?}, mode {:o}, nlink {}",
        attr.typ, attr.mode, attr.nlink
    );
    println!("  length: {}", format_size_exact(attr.length));
    if attr.typ != FileType::File {
        return Ok(());
    }
    let chunks = file_chunks(&volume, ino, attr.length)?;
    if chunks.is_empty() {
        println!("  no data stored (empty or sparse)");
    }
    for chunk in chunks {
        println!("  chunk {}: {} slice(s)", chunk.indx, chunk.slices.len());
        for (slice, objects) in chunk.slices.iter().zip(&chunk.objects) {
            if slice.id == 0 {
                println!("    hole at {} len {}", slice.pos, slice.len);
                continue;
            }
            println!(
                "    slice {} (size {}) pos {} off {} len {}",
                slice.id, slice.size, slice.pos, slice.off, slice.len
            );
            for key in objects {
                println!("      {key}");
            }
        }
    }
    Ok(())
}
