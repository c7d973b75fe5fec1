//! Making and opening a volume: the settings in the metadata engine plus the
//! object store they name.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{Compression, Format};
use crate::meta::Meta;
use crate::object::{FileStore, ObjectStore, is_not_found};

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
    let bucket = std::path::absolute(bucket)?;
    let mut bucket_str = bucket.to_string_lossy().into_owned();
    if !bucket_str.ends_with('/') {
        bucket_str.push('/');
    }
    let uuid = match meta.load() {
        Ok(existing) if existing.name == name => existing.uuid,
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
    let format = Format {
        name: name.to_string(),
        uuid: uuid.clone(),
        storage: "file".into(),
        bucket: bucket_str,
        block_size: block_size_kib,
        compression: compression_name(compression).into(),
        capacity: 0,
        inodes: 0,
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
    let store = FileStore::new(&bucket)?;
    let key = uuid_key(name);
    match store.get(&key) {
        Ok(existing) if existing != uuid.as_bytes() => {
            return Err(Error::Invalid(format!(
                "bucket {} already holds volume {name} with another UUID",
                bucket.display()
            )));
        }
        Ok(_) => {}
        Err(e) if is_not_found(&e) => store.put(&key, uuid.as_bytes(), None)?,
        Err(e) => return Err(e),
    }
    meta.init(&format)?;
    Ok(format)
}

/// Opens a formatted volume: loads and checks the settings and connects the
/// object store they name.
pub fn open_volume(meta: Arc<dyn Meta>) -> Result<Arc<Volume>> {
    let format = match meta.load() {
        Err(Error::NotFound) => {
            return Err(Error::Invalid(
                "the metadata engine holds no volume; run `sluice format` first".into(),
            ));
        }
        r => r?,
    };
    format.check_supported()?;
    let store: Arc<dyn ObjectStore> = match format.storage.as_str() {
        "file" => Arc::new(FileStore::new(&format.bucket)?),
        other => {
            return Err(Error::NotSupported(format!(
                "volume {:?} uses storage {other:?}; this build serves storage \"file\"",
                format.name
            )));
        }
    };
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
