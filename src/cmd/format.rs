//! `sluice format META_URL NAME --storage file --bucket DIR`, or
//! `--storage s3 --bucket http(s)://HOST:PORT/BUCKET [--access-key K --secret-key S]`.
//! Run again on a volume the metadata holds, it keeps every setting it is
//! not given, as `juicefs format` does.

use anyhow::{Context as _, bail};
use sluice_engine::Error;
use sluice_engine::format::{Compression, Credentials, Format, Secret, juicefs_block_size};
use sluice_engine::meta::{MetaUrl, open_meta};
use sluice_engine::object::S3Options;
use sluice_engine::size::{SizeRange, Unit, format_size, size_parser};
use sluice_engine::volume::{FormatRequest, Storage, format_volume_with, set_volume_limits};

/// Arguments of `sluice format`.
#[derive(Debug, clap::Args)]
pub struct FormatArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: MetaUrl,
    /// Volume name (letters, digits, '-' and '_'); also the object-key prefix.
    pub name: String,
    /// Object storage kind: file or s3 (a new volume: file; left out, a
    /// volume formatted again keeps its own).
    #[arg(long, value_parser = ["file", "s3"])]
    pub storage: Option<String>,
    /// Where objects live: a directory for --storage file; for --storage s3
    /// http(s)://HOST[:PORT]/BUCKET or https://BUCKET.s3.REGION.amazonaws.com
    /// (the bucket is created if missing). Needed for a new volume; left
    /// out, a volume formatted again keeps its own, and another one is
    /// refused without --change-bucket.
    #[arg(long)]
    pub bucket: Option<String>,
    /// Let --bucket (or --storage) move a formatted volume to another
    /// place, which must already hold a copy of its objects (its
    /// NAME/juicefs_uuid): the files' data is read from there from now on.
    #[arg(long)]
    pub change_bucket: bool,
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
    /// Block size, as `juicefs format --block-size` stores it: rounded down
    /// to a power of two, from 64K to 16M (3M stores 2M; a bare number is
    /// KiB); a new volume: 4M. Fixed for the life of the volume: left out,
    /// a volume formatted again keeps its own.
    #[arg(long, value_parser = size_parser(Unit::Kib, SizeRange::ANY))]
    pub block_size: Option<u64>,
    /// Block compression: none, lz4 or zstd (a new volume: none). Fixed
    /// for the life of the volume: left out, a volume formatted again keeps
    /// its own.
    #[arg(long, value_parser = ["none", "lz4", "zstd"])]
    pub compress: Option<String>,
    /// Days deleted files stay in the trash, 0 disables the trash (a new
    /// volume: 1; left out, a volume formatted again keeps its own).
    #[arg(long)]
    pub trash_days: Option<u32>,
    /// The volume's space limit, in GiB unless a unit is given (as
    /// `juicefs format --capacity`); writes past it fail with ENOSPC.
    /// 0 = unlimited; left out, a volume formatted again keeps its limit.
    #[arg(long, allow_hyphen_values = true, value_parser = super::quota::parse_gib)]
    pub capacity: Option<u64>,
    /// The volume's inode limit; creating past it fails with ENOSPC.
    /// 0 = unlimited; left out, a volume formatted again keeps its limit.
    #[arg(long, allow_hyphen_values = true, value_parser = super::quota::parse_count)]
    pub inodes: Option<u64>,
    /// Keep POSIX ACLs (`setfacl`/`getfacl`), stored and checked as JuiceFS
    /// does (`juicefs format --enable-acl`). Once on it stays on; left
    /// out, a volume formatted again keeps its setting.
    #[arg(long)]
    pub enable_acl: bool,
}

/// The block size, in KiB, `sluice format` stores for `--block-size
/// requested` (bytes): JuiceFS's, with a warning when it is not the one
/// asked for.
fn block_size_kib(requested: u64) -> u32 {
    let stored = juicefs_block_size(requested);
    if stored != requested {
        log::warn!(
            "--block-size {}: JuiceFS stores only powers of two from 64 KiB to 16 MiB, and \
             rounds this request to {} KiB; so does sluice, so that JuiceFS reads the volume \
             as sluice does",
            format_size(requested),
            stored >> 10
        );
    }
    (stored >> 10) as u32
}

/// Runs `sluice format`.
pub fn run(mut args: FormatArgs) -> anyhow::Result<()> {
    let compression = match args.compress.as_deref() {
        None => None,
        Some("lz4") => Some(Compression::Lz4),
        Some("zstd") => Some(Compression::Zstd),
        Some(_) => Some(Compression::None),
    };
    let meta = open_meta(args.meta_url.expose())
        .with_context(|| format!("cannot open metadata engine {}", args.meta_url))?;
    let existing = match meta.load() {
        Ok(existing) if existing.name != args.name => bail!(
            "{} already holds volume {:?}; sluice never overwrites a different volume \
             (use another metadata URL, or mount {:?})",
            args.meta_url,
            existing.name,
            existing.name
        ),
        Ok(existing) => {
            existing
                .check_supported()
                .with_context(|| format!("{} holds a volume sluice cannot serve", args.meta_url))?;
            Some(existing)
        }
        Err(Error::NotFound) => None,
        Err(e) => return Err(e).context("cannot read the volume settings"),
    };
    let kind = args
        .storage
        .clone()
        .or_else(|| existing.as_ref().map(|f| f.storage.clone()))
        .unwrap_or_else(|| "file".into());
    // As `juicefs format`: a new volume takes its keys from
    // ACCESS_KEY/SECRET_KEY when the flags are absent, so the secret need
    // not be on the command line; one formatted again keeps its own.
    if kind == "s3" && existing.is_none() {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if args.access_key.is_none() {
            args.access_key = env("ACCESS_KEY");
        }
        if args.secret_key.is_none() {
            args.secret_key = env("SECRET_KEY").map(Secret::from);
        }
    }
    if kind == "file" && (args.access_key.is_some() || args.secret_key.is_some()) {
        bail!("--access-key and --secret-key are for --storage s3");
    }
    if args.access_key.is_some() != args.secret_key.is_some() {
        bail!("give --access-key and --secret-key together");
    }
    let storage_given = args.storage.is_some()
        || args.bucket.is_some()
        || args.access_key.is_some()
        || args.region.is_some();
    let storage = if storage_given || existing.is_none() {
        let bucket = match (&args.bucket, &existing) {
            (Some(b), _) => b.clone(),
            (None, Some(f)) if f.storage == kind => f.bucket.clone(),
            (None, Some(f)) => bail!(
                "--storage {kind}: volume {:?} keeps its objects in {} storage; give the \
                 --bucket that holds a copy of them, with --change-bucket",
                f.name,
                f.storage
            ),
            (None, None) => bail!(
                "volume {:?} is new: say where its objects go with --bucket (a directory, or \
                 an S3 bucket URL with --storage s3)",
                args.name
            ),
        };
        Some(Storage {
            kind,
            bucket,
            credentials: Credentials {
                access_key: args.access_key.clone().unwrap_or_default(),
                secret_key: args.secret_key.clone().unwrap_or_default(),
                session_token: Secret::default(),
            },
            s3: S3Options {
                region: args.region.clone(),
                ..S3Options::default()
            },
        })
    } else {
        None
    };
    let request = FormatRequest {
        name: args.name.clone(),
        storage,
        block_size_kib: args.block_size.map(block_size_kib),
        compression,
        trash_days: args.trash_days,
        change_bucket: args.change_bucket,
        enable_acl: args.enable_acl.then_some(true),
    };
    let formatted = format_volume_with(&*meta, &request)
        .with_context(|| format!("cannot format volume {:?}", args.name))?;
    let format = if args.capacity.is_some() || args.inodes.is_some() {
        set_volume_limits(&*meta, args.capacity, args.inodes)
            .with_context(|| format!("cannot set the limits of volume {:?}", args.name))?
    } else {
        formatted.format
    };
    if let Some(warning) = format.block_size_warning() {
        log::warn!("{warning}");
    }
    println!(
        "volume {} ({}) ready: metadata {}, objects in {}, block size {} KiB, compression {}, trash {} day(s){}{}",
        format.name,
        format.uuid,
        args.meta_url,
        sluice_engine::redact::redact_url(&format.bucket),
        format.block_size,
        if format.compression.is_empty() {
            "none"
        } else {
            &format.compression
        },
        format.trash_days,
        match (format.capacity, format.inodes) {
            (0, 0) => String::new(),
            (c, i) => format!(", capacity {}, inodes {}", capacity(c), inodes(i)),
        },
        if format.enable_acl {
            ", POSIX ACLs"
        } else {
            ""
        }
    );
    if let Some(previous) = &formatted.previous {
        let changed = changes(previous, &format);
        if changed.is_empty() {
            println!("it was formatted before: every setting kept");
        } else {
            println!(
                "it was formatted before: changed {}; every other setting kept",
                changed.join(", ")
            );
        }
    }
    Ok(())
}

/// A volume's capacity for people (0: no limit).
fn capacity(bytes: u64) -> String {
    if bytes == 0 {
        "unlimited".into()
    } else {
        sluice_engine::size::format_size_exact(bytes)
    }
}

/// A volume's inode limit for people (0: no limit).
fn inodes(n: u64) -> String {
    if n == 0 {
        "unlimited".into()
    } else {
        n.to_string()
    }
}

/// The settings `format` run again may change that differ, as
/// "name OLD → NEW".
fn changes(before: &Format, after: &Format) -> Vec<String> {
    let mut out = Vec::new();
    let mut note = |what: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{what} {a} → {b}"));
        }
    };
    note("storage", before.storage.clone(), after.storage.clone());
    let redact = sluice_engine::redact::redact_url;
    note("bucket", redact(&before.bucket), redact(&after.bucket));
    note(
        "trash days",
        before.trash_days.to_string(),
        after.trash_days.to_string(),
    );
    note(
        "POSIX ACLs",
        before.enable_acl.to_string(),
        after.enable_acl.to_string(),
    );
    note(
        "capacity",
        capacity(before.capacity),
        capacity(after.capacity),
    );
    note("inodes", inodes(before.inodes), inodes(after.inodes));
    let key = |f: &Format| {
        f.extra
            .get("AccessKey")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    if key(before) != key(after) || before.extra.get("SecretKey") != after.extra.get("SecretKey") {
        out.push("the object-store keys".into());
    }
    out
}
