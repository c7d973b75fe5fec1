//! `sluice format META_URL NAME --storage file --bucket DIR`.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use sluice_engine::Error;
use sluice_engine::format::Compression;
use sluice_engine::meta::open_meta;
use sluice_engine::volume::format_volume;

/// Arguments of `sluice format`.
#[derive(Debug, clap::Args)]
pub struct FormatArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: String,
    /// Volume name (letters, digits, '-' and '_'); also the object-key prefix.
    pub name: String,
    /// Object storage kind (this build: file).
    #[arg(long, default_value = "file")]
    pub storage: String,
    /// Where objects live: a directory for --storage file.
    #[arg(long)]
    pub bucket: PathBuf,
    /// Block size (64K .. 16M), as JuiceFS's --block-size.
    #[arg(long, default_value = "4M", value_parser = sluice_benches::size::parse_size)]
    pub block_size: u64,
    /// Block compression: none, lz4 or zstd.
    #[arg(long, default_value = "none", value_parser = ["none", "lz4", "zstd"])]
    pub compress: String,
    /// Days deleted files stay in the trash (0 disables the trash).
    #[arg(long, default_value_t = 1)]
    pub trash_days: u32,
}

/// Runs `sluice format`.
pub fn run(args: FormatArgs) -> anyhow::Result<()> {
    if args.storage != "file" {
        bail!(
            "storage {:?} is not supported by this build; use --storage file --bucket DIR",
            args.storage
        );
    }
    if !(64 << 10..=16 << 20).contains(&args.block_size) || !args.block_size.is_multiple_of(1024) {
        bail!("--block-size must be a multiple of 1K between 64K and 16M (JuiceFS's range)");
    }
    let compression = match args.compress.as_str() {
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        _ => Compression::None,
    };
    let meta = open_meta(&args.meta_url)
        .with_context(|| format!("cannot open metadata engine {}", args.meta_url))?;
    match meta.load() {
        Ok(existing) if existing.name != args.name => bail!(
            "{} already holds volume {:?}; sluice never overwrites a different volume \
             (use another metadata URL, or mount {:?})",
            args.meta_url,
            existing.name,
            existing.name
        ),
        Ok(existing) => existing
            .check_supported()
            .with_context(|| format!("{} holds a volume sluice cannot serve", args.meta_url))?,
        Err(Error::NotFound) => {}
        Err(e) => return Err(e).context("cannot read the volume settings"),
    }
    let format = format_volume(
        &*meta,
        &args.name,
        &args.bucket,
        (args.block_size / 1024) as u32,
        compression,
        args.trash_days,
    )
    .with_context(|| format!("cannot format volume {:?}", args.name))?;
    println!(
        "volume {} ({}) ready: metadata {}, objects in {}, block size {} KiB, compression {}, trash {} day(s)",
        format.name,
        format.uuid,
        args.meta_url,
        format.bucket,
        format.block_size,
        if format.compression.is_empty() {
            "none"
        } else {
            &format.compression
        },
        format.trash_days
    );
    Ok(())
}
