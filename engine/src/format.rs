//! The volume settings record: JuiceFS's `Format`, stored as JSON under the
//! name `format` (SQL `jfs_setting`, Redis key `setting`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Volume settings, field for field as JuiceFS 1.x writes them. Fields this
/// version does not know are kept in `extra` and written back unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Format {
    /// Volume name; also the object-key prefix.
    pub name: String,
    /// Volume UUID.
    #[serde(rename = "UUID")]
    pub uuid: String,
    /// Object store kind: "file", "s3", ...
    pub storage: String,
    /// Bucket: a directory for "file" (ends with '/'), a URL for "s3".
    pub bucket: String,
    /// Block size in KiB (4096 = 4 MiB).
    pub block_size: u32,
    /// "none", "lz4" or "zstd" (absent = none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub compression: String,
    /// Capacity quota in bytes (0 = unlimited).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub capacity: u64,
    /// Inode quota (0 = unlimited).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inodes: u64,
    /// Encryption algorithm. JuiceFS writes one even for unencrypted volumes;
    /// only `encrypt_key` marks a volume as encrypted.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub encrypt_algo: String,
    /// Encrypted key (PEM); sluice refuses encrypted volumes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub encrypt_key: String,
    /// Days deleted files stay in the trash (0 = no trash).
    pub trash_days: u32,
    /// Metadata schema version (1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub meta_version: u32,
    /// Oldest client version allowed to mount.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub min_client_version: String,
    /// Whether per-directory statistics are kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dir_stats: bool,
    /// Whether POSIX ACLs are enabled.
    #[serde(default, rename = "EnableACL")]
    pub enable_acl: bool,
    /// Settings this version does not interpret, kept as they are.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Block compression of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Objects hold the raw bytes.
    None,
    /// LZ4 block format, as JuiceFS writes it.
    Lz4,
    /// Zstandard, as JuiceFS writes it.
    Zstd,
}

impl Format {
    /// The block size in bytes.
    pub fn block_bytes(&self) -> usize {
        self.block_size as usize * 1024
    }

    /// The compression named by the settings.
    pub fn compression(&self) -> Result<Compression> {
        match self.compression.to_ascii_lowercase().as_str() {
            "" | "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(Error::NotSupported(format!(
                "the volume uses compression {other:?}; sluice reads none, lz4 and zstd"
            ))),
        }
    }

    /// Fails with a clear message when sluice cannot serve this volume
    /// (encryption, unknown compression, a nonsensical block size).
    pub fn check_supported(&self) -> Result<()> {
        // JuiceFS writes `EncryptAlgo` ("aes256gcm-rsa") into every volume, encrypted
        // or not; only an `EncryptKey` means the objects are encrypted.
        if !self.encrypt_key.is_empty() {
            return Err(Error::NotSupported(format!(
                "volume {:?} is encrypted; sluice does not serve encrypted JuiceFS volumes yet",
                self.name
            )));
        }
        self.compression()?;
        if self.block_size == 0 || self.block_size > 64 * 1024 {
            return Err(Error::Invalid(format!(
                "block size {} KiB is outside 1 KiB..64 MiB",
                self.block_size
            )));
        }
        Ok(())
    }
}
