//! The volume settings record: JuiceFS's `Format`, stored as JSON under the
//! name `format` (SQL `jfs_setting`, Redis key `setting`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Volume settings, field for field as JuiceFS 1.x writes them. Fields this
/// version does not know are kept in `extra` and written back unchanged;
/// the object-store credentials (`AccessKey`, `SecretKey`, `SessionToken`,
/// `KeyEncrypted`) live there too, read through [`Format::credentials`].
/// `Debug` leaves the secrets out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
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

/// Settings whose values are secrets: never logged, never printed.
pub const SECRET_FIELDS: [&str; 3] = ["SecretKey", "SessionToken", "EncryptKey"];

impl std::fmt::Debug for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extra: serde_json::Map<String, serde_json::Value> = self
            .extra
            .iter()
            .map(|(k, v)| {
                if SECRET_FIELDS.contains(&k.as_str()) {
                    (k.clone(), serde_json::Value::from("(removed)"))
                } else {
                    (k.clone(), v.clone())
                }
            })
            .collect();
        f.debug_struct("Format")
            .field("name", &self.name)
            .field("uuid", &self.uuid)
            .field("storage", &self.storage)
            .field("bucket", &self.bucket)
            .field("block_size", &self.block_size)
            .field("compression", &self.compression)
            .field("capacity", &self.capacity)
            .field("inodes", &self.inodes)
            .field("encrypt_algo", &self.encrypt_algo)
            .field("encrypt_key", &Secret(self.encrypt_key.clone()))
            .field("trash_days", &self.trash_days)
            .field("meta_version", &self.meta_version)
            .field("min_client_version", &self.min_client_version)
            .field("dir_stats", &self.dir_stats)
            .field("enable_acl", &self.enable_acl)
            .field("extra", &extra)
            .finish()
    }
}

/// A secret string (an S3 secret key, a session token). `Debug` and
/// `Display` never show it; [`Secret::expose`] is the one way to read it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no secret was given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("\"(removed)\"")
        }
    }
}

/// Object-store credentials as a volume's settings hold them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// Access key id (not secret; empty = take them from the environment).
    pub access_key: String,
    /// Secret access key.
    pub secret_key: Secret,
    /// Temporary session token (empty when none).
    pub session_token: Secret,
}

/// The smallest block size JuiceFS 1.x formats a volume with: 64 KiB.
pub const MIN_BLOCK_SIZE: u64 = 64 << 10;

/// The largest block size JuiceFS 1.x formats a volume with: 16 MiB.
pub const MAX_BLOCK_SIZE: u64 = 16 << 20;

/// The block size, in bytes, that `juicefs format --block-size` stores for
/// a request of `requested` bytes (JuiceFS 1.x's `fixObjectSize`): the
/// largest power of two not above the request, then held to
/// [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`]. JuiceFS reads only such block
/// sizes right (a 3 MiB block size reads back zeros past a file's first
/// 64 MiB), so sluice formats volumes with exactly what JuiceFS would.
pub fn juicefs_block_size(requested: u64) -> u64 {
    let power = match requested {
        0 => 0,
        r => 1 << (63 - r.leading_zeros()),
    };
    power.clamp(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE)
}

/// Whether `kib` KiB is a block size JuiceFS formats and reads: a power of
/// two from 64 KiB to 16 MiB.
pub fn is_juicefs_block_size(kib: u32) -> bool {
    let bytes = u64::from(kib) << 10;
    juicefs_block_size(bytes) == bytes
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

    /// The object-store credentials the settings hold, decrypted the way
    /// JuiceFS encrypts them (`KeyEncrypted`: AES-GCM keyed by the MD5 of
    /// the volume UUID, a random 12-byte nonce in front, base64).
    pub fn credentials(&self) -> Result<Credentials> {
        let text = |k: &str| {
            self.extra
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let encrypted = self
            .extra
            .get("KeyEncrypted")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let open = |field: &str| -> Result<Secret> {
            let value = text(field);
            if !encrypted || value.is_empty() {
                return Ok(Secret(value));
            }
            if value == "removed" {
                return Err(Error::Invalid(format!(
                    "the volume's {field} was removed from its settings; set it again with `juicefs config`"
                )));
            }
            self.secret_cipher()?.open(field, &value).map(Secret)
        };
        Ok(Credentials {
            access_key: text("AccessKey"),
            secret_key: open("SecretKey")?,
            session_token: open("SessionToken")?,
        })
    }

    /// Stores object-store credentials in the settings, the secret parts
    /// encrypted as JuiceFS 1.x stores them (so JuiceFS mounts the volume
    /// with them, and a dump of the metadata does not show them). Empty
    /// credentials remove any stored ones.
    pub fn set_credentials(&mut self, creds: &Credentials) -> Result<()> {
        for k in ["AccessKey", "SecretKey", "SessionToken", "KeyEncrypted"] {
            self.extra.remove(k);
        }
        if !creds.access_key.is_empty() {
            self.extra
                .insert("AccessKey".into(), creds.access_key.clone().into());
        }
        let mut encrypted = false;
        for (field, secret) in [
            ("SecretKey", &creds.secret_key),
            ("SessionToken", &creds.session_token),
        ] {
            if secret.is_empty() {
                continue;
            }
            let sealed = self.secret_cipher()?.seal(secret.expose())?;
            self.extra.insert(field.into(), sealed.into());
            encrypted = true;
        }
        if encrypted {
            self.extra.insert("KeyEncrypted".into(), true.into());
        }
        Ok(())
    }

    /// What an operator must know about a volume whose block size JuiceFS
    /// does not format (not a power of two from 64 KiB to 16 MiB: older
    /// sluice versions stored `--block-size 3M` as it was asked). sluice
    /// reads and writes such a volume correctly; JuiceFS reads wrong bytes
    /// from it. `None` for every block size JuiceFS formats.
    pub fn block_size_warning(&self) -> Option<String> {
        if is_juicefs_block_size(self.block_size) {
            return None;
        }
        Some(format!(
            "volume {:?} has block size {} KiB, which JuiceFS never formats (it takes a power of \
             two from 64 KiB to 16 MiB): sluice reads and writes this volume correctly, but \
             JuiceFS reads wrong bytes from it (zeros past a file's first 64 MiB), and the block \
             size cannot change; keep it away from JuiceFS, or copy its files to a volume \
             formatted with a power-of-two --block-size",
            self.name, self.block_size
        ))
    }

    fn secret_cipher(&self) -> Result<SecretCipher> {
        if self.encrypt_algo.eq_ignore_ascii_case("sm4gcm") {
            return Err(Error::NotSupported(
                "the volume's keys are sealed with SM4-GCM; sluice reads AES-GCM-sealed keys only"
                    .into(),
            ));
        }
        Ok(SecretCipher::for_uuid(&self.uuid))
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

/// JuiceFS's sealing of the secrets in the settings: AES-128-GCM whose key
/// is the MD5 of the volume UUID.
struct SecretCipher(aes_gcm::Aes128Gcm);

impl SecretCipher {
    fn for_uuid(uuid: &str) -> SecretCipher {
        use aes_gcm::KeyInit;
        use md5::Digest;
        let key = md5::Md5::digest(uuid.as_bytes());
        SecretCipher(aes_gcm::Aes128Gcm::new(&key))
    }

    fn seal(&self, plain: &str) -> Result<String> {
        use aes_gcm::aead::{Aead, AeadCore, OsRng};
        use base64::Engine;
        let nonce = aes_gcm::Aes128Gcm::generate_nonce(&mut OsRng);
        let sealed = self
            .0
            .encrypt(&nonce, plain.as_bytes())
            .map_err(|_| Error::Invalid("cannot seal a secret key".into()))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    fn open(&self, field: &str, text: &str) -> Result<String> {
        use aes_gcm::aead::Aead;
        use base64::Engine;
        let bad = || {
            Error::Invalid(format!(
                "the volume's {field} cannot be decrypted with its UUID; set it again with `sluice format` or `juicefs config`"
            ))
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| bad())?;
        if raw.len() < 12 {
            return Err(bad());
        }
        let (nonce, sealed) = raw.split_at(12);
        let plain = self
            .0
            .decrypt(aes_gcm::Nonce::from_slice(nonce), sealed)
            .map_err(|_| bad())?;
        String::from_utf8(plain).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format() -> Format {
        serde_json::from_str(
            r#"{"Name":"v","UUID":"1f0e7f5c-6d0b-4a44-9f3b-0c5a5bb2c001","Storage":"s3",
                "Bucket":"http://127.0.0.1:9000/b","BlockSize":4096,"TrashDays":1,
                "EncryptAlgo":"aes256gcm-rsa","EnableACL":false}"#,
        )
        .unwrap()
    }

    #[test]
    fn block_sizes_round_as_juicefs_format_rounds_them() {
        // What `juicefs format --block-size` 1.4.2 stored for each request.
        for (requested, stored) in [
            (3 << 20, 2 << 20),
            (3072 << 10, 2 << 20),
            (100 << 10, 64 << 10),
            (20 << 20, 16 << 20),
            (0, 64 << 10),
            (3 << 19, 1 << 20),
            (4 << 20, 4 << 20),
            (64 << 10, 64 << 10),
            (32 << 10, 64 << 10),
            (5000 << 10, 4 << 20),
            (2 << 30, 16 << 20),
            (u64::MAX, 16 << 20),
        ] {
            assert_eq!(juicefs_block_size(requested), stored, "{requested}");
        }
        assert!(is_juicefs_block_size(4096) && is_juicefs_block_size(64));
        assert!(!is_juicefs_block_size(3072) && !is_juicefs_block_size(32));
        assert!(
            !is_juicefs_block_size(32 << 10),
            "32 MiB: beyond JuiceFS's range"
        );
        let mut f = format();
        assert_eq!(f.block_size_warning(), None);
        f.block_size = 3072;
        let warning = f.block_size_warning().unwrap();
        assert!(
            warning.contains("3072 KiB") && warning.contains("JuiceFS"),
            "{warning}"
        );
    }

    #[test]
    fn credentials_are_sealed_like_juicefs_and_never_shown() {
        let mut f = format();
        let creds = Credentials {
            access_key: "AKID".into(),
            secret_key: Secret::new("s3cr3t-value"),
            session_token: Secret::default(),
        };
        f.set_credentials(&creds).unwrap();
        let json = serde_json::to_string(&f).unwrap();
        assert!(json.contains(r#""AccessKey":"AKID""#), "{json}");
        assert!(json.contains(r#""KeyEncrypted":true"#), "{json}");
        assert!(!json.contains("s3cr3t-value"), "{json}");
        assert!(!json.contains("SessionToken"), "{json}");
        let back: Format = serde_json::from_str(&json).unwrap();
        assert_eq!(back.credentials().unwrap(), creds);
        // Debug shows neither the secret nor its sealed form.
        let sealed = f.extra["SecretKey"].as_str().unwrap().to_string();
        let dbg = format!("{f:?} {:?}", back.credentials().unwrap());
        assert!(!dbg.contains("s3cr3t") && !dbg.contains(&sealed), "{dbg}");
        // Another UUID cannot open it.
        let mut other = back.clone();
        other.uuid = "00000000-0000-4000-8000-000000000000".into();
        assert!(other.credentials().is_err());
    }

    #[test]
    fn opens_a_key_sealed_by_juicefs() {
        // What JuiceFS 1.x's Format.Encrypt does, step by step: AES-128-GCM
        // keyed by md5(UUID), nonce || ciphertext+tag, standard base64.
        use aes_gcm::KeyInit;
        use aes_gcm::aead::Aead;
        use base64::Engine;
        use md5::Digest;
        let mut f = format();
        let key = md5::Md5::digest(f.uuid.as_bytes());
        let nonce = [7u8; 12];
        let sealed = aes_gcm::Aes128Gcm::new(&key)
            .encrypt(
                aes_gcm::Nonce::from_slice(&nonce),
                b"minio-secret".as_slice(),
            )
            .unwrap();
        let text =
            base64::engine::general_purpose::STANDARD.encode([&nonce[..], &sealed[..]].concat());
        f.extra.insert("AccessKey".into(), "minio".into());
        f.extra.insert("SecretKey".into(), text.into());
        f.extra.insert("KeyEncrypted".into(), true.into());
        let c = f.credentials().unwrap();
        assert_eq!(
            (c.access_key.as_str(), c.secret_key.expose()),
            ("minio", "minio-secret")
        );
        // Unsealed keys (KeyEncrypted absent) are taken as they are.
        f.extra.remove("KeyEncrypted");
        f.extra.insert("SecretKey".into(), "plain".into());
        assert_eq!(f.credentials().unwrap().secret_key.expose(), "plain");
    }
}
