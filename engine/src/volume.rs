//! Making and opening a volume: the settings in the metadata engine plus the
//! object store they name.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{Compression, Credentials, Format};
use crate::meta::Meta;
use crate::object::{ObjectStore, S3Options, STORAGE_KINDS, is_not_found, open_store};

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

/// Creates a volume the way `juicefs format --storage file` does: the bucket
/// directory, the object `NAME/juicefs_uuid` holding the UUID, and the
/// settings record plus root directory in the metadata engine. `bucket` is
/// a directory; `block_size_kib` is the block size in KiB (4096 = 4 MiB).
/// Formatting an existing volume again with the same name succeeds and
/// updates the trash days, as JuiceFS does.
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
    let bucket_str = match storage.kind.as_str() {
        "file" => {
            let dir = std::path::absolute(&storage.bucket)?;
            let mut b = dir.to_string_lossy().into_owned();
            if !b.ends_with('/') {
                b.push('/');
            }
            b
        }
        "s3" if !storage.bucket.contains("://") => format!("https://{}", storage.bucket),
        "s3" => storage.bucket.clone(),
        other => {
            return Err(Error::NotSupported(format!(
                "storage {other:?}; this build serves {}",
                STORAGE_KINDS.join(" and ")
            )));
        }
    };
    let mut kept_credentials = None;
    let mut kept_limits = (0, 0);
    let uuid = match meta.load() {
        Ok(existing) if existing.name == name => {
            // Limits change through `set_volume_limits` only.
            kept_limits = (existing.capacity, existing.inodes);
            // Formatting again without keys keeps the stored ones, as
            // JuiceFS does.
            if storage.credentials.access_key.is_empty() && storage.kind == existing.storage {
                kept_credentials = Some(existing.credentials()?);
            }
            existing.uuid
        }
        Ok(existing) => {
            return Err(Error::Exists).inspect_err(|_| {
                log::error!("the metadata already holds volume {:?}", existing.name)
            });
        }
        Err(Error::NotFound) => uuid::Uuid::new_v4().to_string(),
        Err(e) => return Err(e),
    };
    // The same fields, in spirit, as JuiceFS 1.4.2 writes: it records
    // EncryptAlgo even for unencrypted volumes, MinClientVersion 1.1.0-A and
    // DirStats on.
    let mut extra = serde_json::Map::new();
    extra.insert(
        "Tiers".into(),
        serde_json::json!({"0": {"ID": 0, "StorageClass": "", "Tag": ""}}),
    );
    let mut format = Format {
        name: name.to_string(),
        uuid: uuid.clone(),
        storage: storage.kind.clone(),
        bucket: bucket_str,
        block_size: block_size_kib,
        compression: compression_name(compression).into(),
        capacity: kept_limits.0,
        inodes: kept_limits.1,
        encrypt_algo: "aes256gcm-rsa".into(),
        encrypt_key: String::new(),
        trash_days,
        meta_version: 1,
        min_client_version: "1.1.0-A".into(),
        dir_stats: true,
        enable_acl: false,
        extra,
    };
    format.check_supported()?;
    let credentials = kept_credentials.unwrap_or_else(|| storage.credentials.clone());
    format.set_credentials(&credentials)?;
    let store = open_store(
        &format.storage,
        &format.bucket,
        &credentials,
        &storage.s3,
        true,
    )?;
    let key = uuid_key(name);
    match store.get(&key) {
        Ok(existing) if existing != uuid.as_bytes() => {
            return Err(Error::Invalid(format!(
                "bucket {} already holds volume {name} with another UUID",
                format.bucket
            )));
        }
        Ok(_) => {}
        Err(e) if is_not_found(&e) => store.put(&key, uuid.as_bytes(), None)?,
        Err(e) => return Err(e),
    }
    meta.init(&format)?;
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
    match store.get(&uuid_key(&format.name)) {
        Ok(u) if u != format.uuid.as_bytes() => {
            return Err(Error::Invalid(format!(
                "bucket {} belongs to another volume (its juicefs_uuid differs)",
                format.bucket
            )));
        }
        Ok(_) => {}
        Err(e) if is_not_found(&e) => {
            store.put(&uuid_key(&format.name), format.uuid.as_bytes(), None)?
        }
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

/// [`open_volume`] on the metadata engine a URL names (`sqlite3://PATH`).
pub fn open_volume_url(meta_url: &str) -> Result<Arc<Volume>> {
    open_volume(crate::meta::open_meta(meta_url)?)
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
}
