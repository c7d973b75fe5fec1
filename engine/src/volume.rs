//! Making and opening a volume: the settings in the metadata engine plus the
//! object store they name.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{Compression, Credentials, Format, is_juicefs_block_size};
use crate::meta::Meta;
use crate::object::{ObjectStore, S3Options, STORAGE_KINDS, is_not_found, open_store};
use crate::redact::redact_url;

/// An open volume: its settings, metadata engine and object store.
#[derive(Debug)]
pub struct Volume {
    /// The metadata engine.
    pub meta: Arc<dyn Meta>,
    /// The volume settings as loaded.
    pub format: Format,
    /// Where block objects live.
    pub store: Arc<dyn ObjectStore>,
    /// Block compression.
    pub compression: Compression,
    /// Block size in bytes.
    pub block_size: u32,
}

impl Volume {
    /// The volume name (the object key prefix).
    pub fn name(&self) -> &str {
        &self.format.name
    }

    /// The same volume with its objects going through `store` (such as a
    /// writeback stage wrapped around [`Volume::store`]).
    pub fn with_store(&self, store: Arc<dyn ObjectStore>) -> Arc<Volume> {
        Arc::new(Volume {
            meta: self.meta.clone(),
            format: self.format.clone(),
            store,
            compression: self.compression,
            block_size: self.block_size,
        })
    }
}

/// The key of the object holding the volume UUID, as JuiceFS names it.
pub fn uuid_key(name: &str) -> String {
    format!("{name}/juicefs_uuid")
}

fn compression_name(c: Compression) -> &'static str {
    match c {
        Compression::None => "none",
        Compression::Lz4 => "lz4",
        Compression::Zstd => "zstd",
    }
}

/// Where a volume's objects live: `sluice format`'s `--storage`,
/// `--bucket`, `--access-key` and `--secret-key`.
#[derive(Debug, Clone)]
pub struct Storage {
    /// "file" or "s3".
    pub kind: String,
    /// A directory for "file"; a bucket URL for "s3".
    pub bucket: String,
    /// Keys for "s3"; empty ones mean the environment's or the profile's.
    /// Given ones are kept (sealed) in the volume settings, as JuiceFS
    /// keeps them.
    pub credentials: Credentials,
    /// How to talk to S3 while formatting.
    pub s3: S3Options,
}

impl Storage {
    /// A local directory.
    pub fn file(dir: &Path) -> Storage {
        Storage {
            kind: "file".into(),
            bucket: dir.to_string_lossy().into_owned(),
            credentials: Credentials::default(),
            s3: S3Options::default(),
        }
    }

    /// An S3 bucket URL (`http(s)://HOST[:PORT]/BUCKET` or an AWS name).
    pub fn s3(url: &str, credentials: Credentials) -> Storage {
        Storage {
            kind: "s3".into(),
            bucket: url.to_string(),
            credentials,
            s3: S3Options::default(),
        }
    }
}

/// The block size of a new volume when none is asked for: 4 MiB, in KiB.
pub const DEFAULT_BLOCK_SIZE_KIB: u32 = 4096;

/// The trash days of a new volume when none are asked for.
pub const DEFAULT_TRASH_DAYS: u32 = 1;

/// What `sluice format` asks for. A field left `None` takes the default on
/// a new volume ([`DEFAULT_BLOCK_SIZE_KIB`], no compression,
/// [`DEFAULT_TRASH_DAYS`]; `storage` has none and must be given) and keeps
/// the stored setting on a volume the metadata already holds, as `juicefs
/// format` keeps every setting it is not given.
#[derive(Debug, Clone)]
pub struct FormatRequest {
    /// The volume name (also the object-key prefix).
    pub name: String,
    /// Where the objects live.
    pub storage: Option<Storage>,
    /// Block size in KiB: a power of two from 64 KiB to 16 MiB (what
    /// JuiceFS formats; [`crate::format::juicefs_block_size`] rounds a
    /// request as JuiceFS does). Fixed for the life of the volume.
    pub block_size_kib: Option<u32>,
    /// Block compression; fixed for the life of the volume.
    pub compression: Option<Compression>,
    /// Days deleted files stay in the trash (0: no trash).
    pub trash_days: Option<u32>,
    /// Whether `storage` may name another bucket (or storage kind) than the
    /// volume's own: the new one must already hold the volume (its
    /// `NAME/juicefs_uuid` with the volume's UUID, as a copy of the
    /// objects does), unless the volume has never stored data.
    pub change_bucket: bool,
    /// Whether the volume keeps POSIX ACLs (JuiceFS `--enable-acl`).
    /// `Some(true)` turns them on, for good: JuiceFS cannot turn them off
    /// again (nodes would keep ACL ids nothing reads), so `Some(false)`
    /// on a volume that has them is refused. `None` keeps the volume's.
    pub enable_acl: Option<bool>,
}

impl FormatRequest {
    /// A request that gives every setting (as for a new volume).
    pub fn new(
        name: &str,
        storage: Storage,
        block_size_kib: u32,
        compression: Compression,
        trash_days: u32,
    ) -> FormatRequest {
        FormatRequest {
            name: name.to_string(),
            storage: Some(storage),
            block_size_kib: Some(block_size_kib),
            compression: Some(compression),
            trash_days: Some(trash_days),
            change_bucket: false,
            enable_acl: None,
        }
    }
}

/// What [`format_volume_with`] did.
#[derive(Debug, Clone)]
pub struct Formatted {
    /// The settings as stored now.
    pub format: Format,
    /// The settings the metadata held before (`None`: a new volume).
    pub previous: Option<Format>,
}

/// Creates a volume the way `juicefs format --storage file` does: the bucket
/// directory, the object `NAME/juicefs_uuid` holding the UUID, and the
/// settings record plus root directory in the metadata engine. `bucket` is
/// a directory; `block_size_kib` is the block size in KiB (4096 = 4 MiB).
/// Formatting an existing volume again with the same name succeeds and
/// updates the trash days, as JuiceFS does; see [`format_volume_with`] for
/// what it refuses.
pub fn format_volume(
    meta: &dyn Meta,
    name: &str,
    bucket: &Path,
    block_size_kib: u32,
    compression: Compression,
    trash_days: u32,
) -> Result<Format> {
    format_volume_on(
        meta,
        name,
        &Storage::file(bucket),
        block_size_kib,
        compression,
        trash_days,
    )
}

/// [`format_volume`] on any storage: for "s3" the bucket is created when it
/// does not exist, and given keys are stored in the settings.
pub fn format_volume_on(
    meta: &dyn Meta,
    name: &str,
    storage: &Storage,
    block_size_kib: u32,
    compression: Compression,
    trash_days: u32,
) -> Result<Format> {
    format_volume_with(
        meta,
        &FormatRequest::new(
            name,
            storage.clone(),
            block_size_kib,
            compression,
            trash_days,
        ),
    )
    .map(|f| f.format)
}

/// The bucket as the settings hold it: an absolute directory ending in '/'
/// for "file" (as JuiceFS stores it), a URL for "s3".
fn bucket_setting(storage: &Storage) -> Result<String> {
    match storage.kind.as_str() {
        "file" => {
            let dir = std::path::absolute(&storage.bucket)?;
            let mut b = dir.to_string_lossy().into_owned();
            if !b.ends_with('/') {
                b.push('/');
            }
            Ok(b)
        }
        "s3" if !storage.bucket.contains("://") => Ok(format!("https://{}", storage.bucket)),
        "s3" => Ok(storage.bucket.clone()),
        other => Err(Error::NotSupported(format!(
            "storage {other:?}; this build serves {}",
            STORAGE_KINDS.join(" and ")
        ))),
    }
}

/// Whether the volume has ever stored data: a slice id was handed out.
pub fn volume_has_data(meta: &dyn Meta) -> Result<bool> {
    Ok(meta.counters()?.next_slice > 1)
}

/// Formats a volume, or formats one the metadata already holds again: a
/// new volume gets the settings asked for (the defaults where `None`); an
/// existing one of the same name keeps every setting the request leaves
/// out, takes new trash days and keys, and refuses what would lose data: a
/// different name (another volume), a different block size or compression
/// (its objects are stored that way), and another bucket without
/// [`FormatRequest::change_bucket`]. A new volume's block size must be one
/// JuiceFS formats (a power of two from 64 KiB to 16 MiB); an existing
/// volume of another block size (an older sluice's) keeps it.
pub fn format_volume_with(meta: &dyn Meta, req: &FormatRequest) -> Result<Formatted> {
    let name = req.name.as_str();
    if name.is_empty()
        || name.len() > 63
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(Error::Invalid(format!(
            "volume name {name:?} must be 1..63 letters, digits, '-' or '_'"
        )));
    }
    let previous = match meta.load() {
        Ok(existing) if existing.name == name => Some(existing),
        Ok(existing) => {
            return Err(Error::Exists).inspect_err(|_| {
                log::error!("the metadata already holds volume {:?}", existing.name)
            });
        }
        Err(Error::NotFound) => None,
        Err(e) => return Err(e),
    };
    let format = match &previous {
        None => new_format(req)?,
        Some(existing) => reformat(existing, req)?,
    };
    format.check_supported()?;
    let credentials = if format.storage == "file" {
        Credentials::default()
    } else {
        format.credentials()?
    };
    let s3 = req
        .storage
        .as_ref()
        .map(|s| s.s3.clone())
        .unwrap_or_default();
    let moved = previous
        .as_ref()
        .is_some_and(|p| p.bucket != format.bucket || p.storage != format.storage);
    let copy_first = || {
        Error::Invalid(format!(
            "bucket {} does not hold volume {name} (no {} with its UUID): copy the volume's \
             objects there first (everything under {}{name}/), then run format \
             --change-bucket again",
            redact_url(&format.bucket),
            uuid_key(name),
            previous
                .as_ref()
                .map(|p| redact_url(&p.bucket))
                .unwrap_or_default()
        ))
    };
    if moved && format.storage == "file" && !Path::new(&format.bucket).is_dir() {
        return Err(copy_first());
    }
    // A new volume's bucket is created; a volume's own (or, with
    // --change-bucket, the one its objects were copied to) must exist: one
    // that vanished with its disk is not made again, empty.
    let store = open_store(
        &format.storage,
        &format.bucket,
        &credentials,
        &s3,
        previous.is_none(),
    )?;
    let key = uuid_key(name);
    match store.get(&key) {
        Ok(existing) if existing != format.uuid.as_bytes() => {
            return Err(Error::Invalid(format!(
                "bucket {} already holds volume {name} with another UUID",
                format.bucket
            )));
        }
        Ok(_) => {}
        Err(e) if is_not_found(&e) => {
            if previous.is_some() && volume_has_data(meta)? {
                if moved {
                    return Err(copy_first());
                }
                // Its own bucket without the UUID (JuiceFS formats with
                // JFS_NO_CHECK_OBJECT_STORAGE skip it): written back only
                // where the volume's objects are.
                if store.list(&format!("{name}/chunks/"))?.is_empty() {
                    return Err(Error::Invalid(format!(
                        "bucket {} holds none of volume {name}'s objects, yet the volume has \
                         stored data: is the disk that holds the bucket mounted?",
                        redact_url(&format.bucket)
                    )));
                }
                log::info!(
                    "writing the missing {key} back into {}",
                    redact_url(&format.bucket)
                );
            }
            store.put(&key, format.uuid.as_bytes(), None)?
        }
        Err(e) => return Err(e),
    }
    meta.init(&format)?;
    Ok(Formatted { format, previous })
}

/// The settings of a new volume.
fn new_format(req: &FormatRequest) -> Result<Format> {
    let Some(storage) = &req.storage else {
        return Err(Error::Invalid(format!(
            "volume {:?} is new: say where its objects go (--bucket)",
            req.name
        )));
    };
    let block_size = req.block_size_kib.unwrap_or(DEFAULT_BLOCK_SIZE_KIB);
    if !is_juicefs_block_size(block_size) {
        return Err(Error::Invalid(format!(
            "block size {block_size} KiB: JuiceFS formats (and reads) only powers of two from \
             64 KiB to 16 MiB"
        )));
    }
    // The same fields, in spirit, as JuiceFS 1.4.2 writes: it records
    // EncryptAlgo even for unencrypted volumes, MinClientVersion 1.1.0-A and
    // DirStats on.
    let mut extra = serde_json::Map::new();
    extra.insert(
        "Tiers".into(),
        serde_json::json!({"0": {"ID": 0, "StorageClass": "", "Tag": ""}}),
    );
    let mut format = Format {
        name: req.name.clone(),
        uuid: uuid::Uuid::new_v4().to_string(),
        storage: storage.kind.clone(),
        bucket: bucket_setting(storage)?,
        block_size,
        compression: compression_name(req.compression.unwrap_or(Compression::None)).into(),
        capacity: 0,
        inodes: 0,
        encrypt_algo: "aes256gcm-rsa".into(),
        encrypt_key: String::new(),
        trash_days: req.trash_days.unwrap_or(DEFAULT_TRASH_DAYS),
        meta_version: 1,
        min_client_version: "1.1.0-A".into(),
        dir_stats: true,
        enable_acl: req.enable_acl.unwrap_or(false),
        extra,
    };
    format.set_credentials(&storage.credentials)?;
    Ok(format)
}

/// The settings of a volume formatted again: the stored ones, with what
/// the request may change changed.
fn reformat(existing: &Format, req: &FormatRequest) -> Result<Format> {
    let mut format = existing.clone();
    let name = &existing.name;
    if let Some(kib) = req.block_size_kib
        && kib != existing.block_size
    {
        return Err(Error::Invalid(format!(
            "volume {name:?} has block size {} KiB, and a block size cannot change (its objects \
             are cut that way; JuiceFS refuses too): leave --block-size out to keep it",
            existing.block_size
        )));
    }
    if let Some(c) = req.compression
        && c != existing.compression()?
    {
        return Err(Error::Invalid(format!(
            "volume {name:?} is compressed with {}, and compression cannot change (its objects \
             are stored that way; JuiceFS refuses too): leave --compress out to keep it",
            compression_name(existing.compression()?)
        )));
    }
    if let Some(days) = req.trash_days {
        format.trash_days = days;
    }
    match req.enable_acl {
        Some(true) => format.enable_acl = true,
        Some(false) if existing.enable_acl => {
            return Err(Error::Invalid(format!(
                "volume {name:?} keeps POSIX ACLs, and they cannot be turned off again (its \
                 nodes name their ACLs; JuiceFS refuses too)"
            )));
        }
        _ => {}
    }
    if let Some(storage) = &req.storage {
        let bucket = bucket_setting(storage)?;
        let moved = bucket.trim_end_matches('/') != existing.bucket.trim_end_matches('/')
            || storage.kind != existing.storage;
        if moved && !req.change_bucket {
            return Err(Error::Invalid(format!(
                "volume {name:?} keeps its objects in {} ({}); this names {} ({}), and \
                 pointing the volume there would leave every file without its data. To move the \
                 volume, copy its objects there, then add --change-bucket; to keep it where it \
                 is, leave --bucket out",
                redact_url(&existing.bucket),
                existing.storage,
                redact_url(&bucket),
                storage.kind
            )));
        }
        if moved {
            format.storage = storage.kind.clone();
            format.bucket = bucket;
        }
        // Formatting again without keys keeps the stored ones, as JuiceFS
        // does (another storage kind takes none of the old one's).
        if !storage.credentials.access_key.is_empty() || storage.kind != existing.storage {
            format.set_credentials(&storage.credentials)?;
        }
    }
    // Limits change through `set_volume_limits` only.
    Ok(format)
}

/// Changes a formatted volume's limits, as `juicefs config --capacity
/// --inodes` does: `capacity` in bytes, `inodes` in nodes, 0 for no limit,
/// `None` to keep. Clients that have the volume mounted pick the change up
/// at their next heartbeat. Returns the new settings.
pub fn set_volume_limits(
    meta: &dyn Meta,
    capacity: Option<u64>,
    inodes: Option<u64>,
) -> Result<Format> {
    let mut format = meta.load()?;
    if let Some(c) = capacity {
        format.capacity = c;
    }
    if let Some(i) = inodes {
        format.inodes = i;
    }
    meta.init(&format)?;
    meta.reload_quotas()?;
    Ok(format)
}

/// Turns on the directory statistics (`DirStats`) a directory quota needs,
/// as `juicefs quota set` does; nothing when they are on.
pub fn enable_dir_stats(meta: &dyn Meta) -> Result<()> {
    let mut format = meta.load()?;
    if !format.dir_stats {
        format.dir_stats = true;
        meta.init(&format)?;
        meta.reload_quotas()?;
    }
    Ok(())
}

/// Opens a formatted volume: loads and checks the settings and connects the
/// object store they name.
pub fn open_volume(meta: Arc<dyn Meta>) -> Result<Arc<Volume>> {
    open_volume_with(meta, &S3Options::default())
}

/// [`open_volume`] with chosen S3 client settings (timeouts, retries,
/// upload bound); they matter only for `storage=s3` volumes.
pub fn open_volume_with(meta: Arc<dyn Meta>, s3: &S3Options) -> Result<Arc<Volume>> {
    let format = match meta.load() {
        Err(Error::NotFound) => {
            return Err(Error::Invalid(
                "the metadata engine holds no volume; run `sluice format` first".into(),
            ));
        }
        r => r?,
    };
    format.check_supported()?;
    if let Some(warning) = format.block_size_warning() {
        log::warn!("{warning}");
    }
    if !STORAGE_KINDS.contains(&format.storage.as_str()) {
        return Err(Error::NotSupported(format!(
            "volume {:?} uses storage {:?}; this build serves {}",
            format.name,
            format.storage,
            STORAGE_KINDS.join(" and ")
        )));
    }
    let credentials = if format.storage == "file" {
        Credentials::default()
    } else {
        format.credentials()?
    };
    let store: Arc<dyn ObjectStore> =
        open_store(&format.storage, &format.bucket, &credentials, s3, false)?;
    let key = uuid_key(&format.name);
    match store.get(&key) {
        Ok(u) if u != format.uuid.as_bytes() => {
            return Err(Error::Invalid(format!(
                "bucket {} belongs to another volume (its juicefs_uuid differs)",
                format.bucket
            )));
        }
        Ok(_) => {}
        // A volume that stored data has its UUID in its bucket (format
        // wrote it): without it the bucket is not the one that holds the
        // data (an empty directory where a disk failed to mount), and
        // writing there would hide the loss until reads fail.
        Err(e) if is_not_found(&e) && volume_has_data(meta.as_ref())? => {
            return Err(Error::Invalid(format!(
                "bucket {} does not hold volume {:?} (no {key}), yet the volume has stored \
                 data: is the disk that holds the bucket mounted? (If the objects are there, \
                 `sluice format` run again on the volume writes the UUID back.)",
                redact_url(&format.bucket),
                format.name
            )));
        }
        Err(e) if is_not_found(&e) => store.put(&key, format.uuid.as_bytes(), None)?,
        Err(e) => return Err(e),
    }
    Ok(Arc::new(Volume {
        meta,
        compression: format.compression()?,
        block_size: format.block_bytes() as u32,
        store,
        format,
    }))
}

/// [`format_volume`] on the metadata engine a URL names (`sqlite3://PATH`).
pub fn format_volume_url(
    meta_url: &str,
    name: &str,
    bucket: &Path,
    block_size_kib: u32,
    compression: Compression,
    trash_days: u32,
) -> Result<Format> {
    let meta = crate::meta::open_meta(meta_url)?;
    format_volume(
        &*meta,
        name,
        bucket,
        block_size_kib,
        compression,
        trash_days,
    )
}

/// [`open_volume`] on the metadata engine a URL names (`sqlite3://PATH`,
/// which must exist: see [`crate::meta::open_existing_meta`]).
pub fn open_volume_url(meta_url: &str) -> Result<Arc<Volume>> {
    open_volume(crate::meta::open_existing_meta(meta_url)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_writes_uuid_and_settings_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite3://{}/m.db", dir.path().display());
        let bucket = dir.path().join("b");
        let f = format_volume_url(&url, "vol-1", &bucket, 1024, Compression::Zstd, 1).unwrap();
        assert_eq!(
            std::fs::read(bucket.join("vol-1/juicefs_uuid")).unwrap(),
            f.uuid.as_bytes()
        );
        assert!(f.bucket.ends_with("/b/"));
        // Formatting again keeps the UUID and takes the new trash days.
        let g = format_volume_url(&url, "vol-1", &bucket, 1024, Compression::Zstd, 3).unwrap();
        assert_eq!(g.uuid, f.uuid);
        let vol = open_volume_url(&url).unwrap();
        assert_eq!(
            (vol.block_size, vol.compression),
            (1 << 20, Compression::Zstd)
        );
        assert_eq!(vol.format.trash_days, 3);
        // Another name on the same metadata is refused.
        assert!(format_volume_url(&url, "other", &bucket, 1024, Compression::None, 0).is_err());
        assert!(format_volume_url(&url, "bad name", &bucket, 1024, Compression::None, 0).is_err());
        // A bucket holding another volume's UUID is refused at open.
        std::fs::write(bucket.join("vol-1/juicefs_uuid"), "someone-else").unwrap();
        assert!(open_volume_url(&url).is_err());
    }

    #[test]
    fn block_sizes_are_juicefs_s_and_never_change() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite3://{}/m.db", dir.path().display());
        let bucket = dir.path().join("b");
        // A new volume takes only what JuiceFS formats.
        let err = format_volume_url(&url, "v", &bucket, 3072, Compression::None, 1).unwrap_err();
        assert!(err.to_string().contains("powers of two"), "{err}");
        format_volume_url(&url, "v", &bucket, 2048, Compression::None, 1).unwrap();
        let err = format_volume_url(&url, "v", &bucket, 4096, Compression::None, 1).unwrap_err();
        assert!(err.to_string().contains("2048 KiB"), "{err}");
        // A volume an older sluice formatted with 3 MiB blocks keeps them,
        // opens, and formats again with its own block size.
        let db = rusqlite::Connection::open(dir.path().join("m.db")).unwrap();
        let json: String = db
            .query_row(
                "SELECT value FROM jfs_setting WHERE name = 'format'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let json = json.replace("\"BlockSize\": 2048", "\"BlockSize\": 3072");
        assert!(json.contains("3072"), "{json}");
        db.execute(
            "UPDATE jfs_setting SET value = ?1 WHERE name = 'format'",
            [&json],
        )
        .unwrap();
        drop(db);
        let vol = open_volume_url(&url).unwrap();
        assert_eq!(vol.block_size, 3 << 20);
        assert!(vol.format.block_size_warning().is_some());
        let again = format_volume_url(&url, "v", &bucket, 3072, Compression::None, 2).unwrap();
        assert_eq!((again.block_size, again.trash_days), (3072, 2));
        assert!(format_volume_url(&url, "v", &bucket, 2048, Compression::None, 2).is_err());
    }
}
