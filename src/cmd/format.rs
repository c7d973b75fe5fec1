//! `sluice format META_URL NAME --storage file --bucket DIR`, or
//! `--storage s3 --bucket http(s)://HOST:PORT/BUCKET [--access-key K --secret-key S]`.

use anyhow::{Context as _, bail};
use sluice_engine::Error;
use sluice_engine::format::{Compression, Credentials, Secret};
use sluice_engine::meta::{MetaUrl, open_meta};
use sluice_engine::object::S3Options;
use sluice_engine::volume::{Storage, format_volume_on, set_volume_limits};

/// Arguments of `sluice format`.
#[derive(Debug, clap::Args)]
pub struct FormatArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: MetaUrl,
    /// Volume name (letters, digits, '-' and '_'); also the object-key prefix.
    pub name: String,
    /// Object storage kind: file or s3.
    #[arg(long, default_value = "file", value_parser = ["file", "s3"])]
    pub storage: String,
    /// Where objects live: a directory for --storage file; for --storage s3
    /// http(s)://HOST[:PORT]/BUCKET or https://BUCKET.s3.REGION.amazonaws.com
    /// (the bucket is created if missing).
    #[arg(long)]
    pub bucket: String,
    /// S3 access key id; kept in the volume settings as JuiceFS keeps it
    /// (default: $ACCESS_KEY). Without either, the environment's
    /// (AWS_ACCESS_KEY_ID, ...) or the AWS profile's keys are used, and not
    /// stored.
    #[arg(long)]
    pub access_key: Option<String>,
    /// S3 secret access key; stored sealed with the volume UUID, never
    /// printed (default: $SECRET_KEY, which keeps it off the command line).
    #[arg(long)]
    pub secret_key: Option<Secret>,
    /// S3 region to sign for while formatting (default: the AWS host's, then
    /// AWS_REGION, then us-east-1).
    #[arg(long)]
    pub region: Option<String>,
    /// Block size (64K .. 16M), as JuiceFS's --block-size.
    #[arg(long, default_value = "4M", value_parser = sluice_benches::size::parse_size)]
    pub block_size: u64,
    /// Block compression: none, lz4 or zstd.
    #[arg(long, default_value = "none", value_parser = ["none", "lz4", "zstd"])]
    pub compress: String,
    /// Days deleted files stay in the trash (0 disables the trash).
    #[arg(long, default_value_t = 1)]
    pub trash_days: u32,
    /// The volume's space limit, in GiB unless a unit is given (as
    /// `juicefs format --capacity`); writes past it fail with ENOSPC.
    /// 0 = unlimited; left out, a volume formatted again keeps its limit.
    #[arg(long, allow_hyphen_values = true, value_parser = super::quota::parse_gib)]
    pub capacity: Option<u64>,
    /// The volume's inode limit; creating past it fails with ENOSPC.
    /// 0 = unlimited; left out, a volume formatted again keeps its limit.
    #[arg(long, allow_hyphen_values = true, value_parser = super::quota::parse_count)]
    pub inodes: Option<u64>,
}

/// Runs `sluice format`.
pub fn run(mut args: FormatArgs) -> anyhow::Result<()> {
    // As `juicefs format`: keys from ACCESS_KEY/SECRET_KEY when the flags
    // are absent, so the secret need not be on the command line.
    if args.storage == "s3" {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if args.access_key.is_none() {
            args.access_key = env("ACCESS_KEY");
        }
        if args.secret_key.is_none() {
            args.secret_key = env("SECRET_KEY").map(Secret::from);
        }
    }
    if args.storage == "file" && (args.access_key.is_some() || args.secret_key.is_some()) {
        bail!("--access-key and --secret-key are for --storage s3");
    }
    if args.access_key.is_some() != args.secret_key.is_some() {
        bail!("give --access-key and --secret-key together");
    }
    if !(64 << 10..=16 << 20).contains(&args.block_size) || !args.block_size.is_multiple_of(1024) {
        bail!("--block-size must be a multiple of 1K between 64K and 16M (JuiceFS's range)");
    }
    let compression = match args.compress.as_str() {
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        _ => Compression::None,
    };
    let meta = open_meta(args.meta_url.expose())
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
    let storage = Storage {
        kind: args.storage.clone(),
        bucket: args.bucket.clone(),
        credentials: Credentials {
            access_key: args.access_key.clone().unwrap_or_default(),
            secret_key: args.secret_key.clone().unwrap_or_default(),
            session_token: Secret::default(),
        },
        s3: S3Options {
            region: args.region.clone(),
            ..S3Options::default()
        },
    };
    let format = format_volume_on(
        &*meta,
        &args.name,
        &storage,
        (args.block_size / 1024) as u32,
        compression,
        args.trash_days,
    )
    .with_context(|| format!("cannot format volume {:?}", args.name))?;
    let format = if args.capacity.is_some() || args.inodes.is_some() {
        set_volume_limits(&*meta, args.capacity, args.inodes)
            .with_context(|| format!("cannot set the limits of volume {:?}", args.name))?
    } else {
        format
    };
    println!(
        "volume {} ({}) ready: metadata {}, objects in {}, block size {} KiB, compression {}, trash {} day(s){}",
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
        format.trash_days,
        match (format.capacity, format.inodes) {
            (0, 0) => String::new(),
            (c, i) => format!(", capacity {c} bytes, inodes {i} (0 = unlimited)"),
        }
    );
    Ok(())
}
