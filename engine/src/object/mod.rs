//! Object stores: where block objects live. The trait speaks in keys and
//! bytes; each store keeps a block's CRC32C beside the object (never inside
//! it), so JuiceFS reads what sluice writes unchanged.

pub mod disk_cache;
pub mod file;
pub mod measured;
pub mod s3;
#[cfg(any(test, feature = "s3-test-server"))]
pub mod s3_test_server;
pub mod sync_pool;
pub mod writeback;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::format::Credentials;

pub use file::FileStore;
pub use s3::{S3Options, S3Store};
pub use writeback::{WritebackOptions, WritebackStats, WritebackStore};

/// What a store knows about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's key.
    pub key: String,
    /// Stored size in bytes (after compression).
    pub size: u64,
    /// Last modification time.
    pub mtime: SystemTime,
}

/// The objects a [`ObjectStore::sync_objects`] could not make durable:
/// each as its index in the keys asked for, with the error.
#[derive(Debug, Default)]
pub struct Unsynced(pub Vec<(usize, Error)>);

impl Unsynced {
    /// The first error, for a caller that treats the keys as one unit.
    pub fn into_error(self) -> Error {
        self.0.into_iter().next().map_or_else(
            || Error::Invalid("an empty sync failure".into()),
            |(_, e)| e,
        )
    }
}

/// A flat key → bytes store (a local directory, an S3 bucket).
///
/// Every method may be called from many threads at once. Errors name the key
/// (`Error::Object`); a missing object is `Error::Object` whose source has
/// kind `NotFound`.
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// A short description for logs (`file:///data/bucket/`).
    fn describe(&self) -> String;
    /// Stores `data` under `key` atomically (readers see the old object or
    /// the whole new one). `crc` is the CRC32C of `data`, kept beside the
    /// object; `None` makes the store compute it.
    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()>;
    /// The whole object, checked against its CRC32C when one is stored.
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// [`ObjectStore::get`] into `buf` (an empty buffer the caller no longer
    /// needs) where the store can use it; stores that cannot drop it.
    fn get_into(&self, key: &str, buf: Vec<u8>) -> Result<Vec<u8>> {
        drop(buf);
        self.get(key)
    }
    /// [`ObjectStore::get`] into `out`, which holds at least the object (a
    /// block's length is known from its key): returns the object's length,
    /// or `Corrupt` if the object is longer than `out`. What lies in `out`
    /// past the object, and all of it on an error, is unspecified. Stores
    /// that can read straight into `out` do (the host daemon fetches into
    /// the shared memory it hands out, saving a copy); the others get and
    /// copy.
    fn get_to(&self, key: &str, out: &mut [u8]) -> Result<usize> {
        let data = self.get(key)?;
        copy_whole(key, &data, out)
    }
    /// `len` bytes from offset `off` (fewer at the end of the object). A
    /// range cannot be checked against the whole-object CRC.
    fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>>;
    /// Size and time of an object.
    fn head(&self, key: &str) -> Result<ObjectInfo>;
    /// Deletes an object; deleting a missing object succeeds.
    fn delete(&self, key: &str) -> Result<()>;
    /// Every object whose key starts with `prefix`, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    /// Whether an object `put` stores survives a power loss only once
    /// [`ObjectStore::sync_objects`] has covered it (a `file://` bucket).
    /// Remote stores are durable once `put` returns, and so is writeback
    /// staging (each staged put is fsync'ed); they say no, and the writer
    /// then commits a close at once rather than in the next group
    /// (`engine/DESIGN.md`, "Durability").
    fn needs_sync(&self) -> bool {
        false
    }

    /// Makes the objects `keys`, which the caller stored with `put`,
    /// durable (they survive a power loss once this returns). `put` only
    /// promises atomicity, as JuiceFS's stores do. The caller syncs the
    /// keys it put itself (a slice's blocks are put by one writer), so a
    /// sync never vouches for another caller's objects; a key already
    /// synced, or one this store never needed to sync, is durable. Returns
    /// the keys that could not be made durable, each with its error (their
    /// objects may be lost: the caller must not commit metadata naming
    /// them); the others are durable either way.
    fn sync_objects(&self, keys: &[String]) -> std::result::Result<(), Unsynced> {
        let _ = keys;
        Ok(())
    }
    /// The object opened as a local file, for stores that keep objects in
    /// local files (`None` for remote stores): readers then read ranges of
    /// it straight into their destination. A range read this way cannot be
    /// checked against the object's CRC32C.
    fn local_file(&self, key: &str) -> Option<Result<std::fs::File>> {
        let _ = key;
        None
    }

    /// A local cache's copy of `key` (a disk-cache file) for a read of `len`
    /// bytes that the reader checks where the bytes land, against the
    /// copy's segment CRCs, which come with it (`disk_cache`, "Checksum
    /// policy"); `None` where no local cache holds the object. An error is
    /// `WouldBlock` on a thread that must not wait.
    fn cached_file(&self, key: &str, len: usize) -> Option<Result<disk_cache::CachedFile>> {
        let _ = (key, len);
        None
    }

    /// A read of the copy [`ObjectStore::cached_file`] handed out found it
    /// damaged (`why`): the copy is dropped, and the next read of the
    /// object goes to the store.
    fn drop_cached(&self, key: &str, why: &str) {
        let _ = (key, why);
    }

    /// Whether a local cache in front of the store holds the object (a
    /// store without one holds nothing locally).
    fn is_cached(&self, _key: &str) -> bool {
        false
    }

    /// Drops the object from a local cache in front of the store (never
    /// from the store itself); whether it was cached.
    fn evict_cached(&self, _key: &str) -> bool {
        false
    }

    /// Waits, at most `limit`, until every object `put` accepted has reached
    /// its final store, and returns how many have not. Stores that write
    /// through have nothing to wait for; the writeback store uploads its
    /// staged blocks (delayed ones too) meanwhile. Called at unmount.
    fn drain_uploads(&self, limit: Duration) -> usize {
        let _ = limit;
        0
    }

    /// The counters of a store that uploads in the background (the
    /// writeback staging backlog), for logs and metrics; `None` for stores
    /// that write through. A store wrapping another forwards this and
    /// [`ObjectStore::drain_uploads`].
    fn upload_backlog(&self) -> Option<WritebackStats> {
        None
    }
}

/// Copies a whole object's bytes `data` into `out` ([`ObjectStore::get_to`]).
pub fn copy_whole(key: &str, data: &[u8], out: &mut [u8]) -> Result<usize> {
    let Some(dst) = out.get_mut(..data.len()) else {
        return Err(too_long(key, data.len(), out.len()));
    };
    dst.copy_from_slice(data);
    Ok(data.len())
}

/// The error of an object longer than the room a caller expected it in.
pub fn too_long(key: &str, len: usize, room: usize) -> Error {
    Error::Corrupt(format!(
        "object {key} holds {len} bytes, more than the {room} its key allows"
    ))
}

/// Whether an error from a store means "no such object".
pub fn is_not_found(err: &crate::Error) -> bool {
    matches!(err, crate::Error::Object { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// The storage kinds this build serves, as `--storage` names them.
pub const STORAGE_KINDS: [&str; 2] = ["file", "s3"];

/// Opens the store a volume's `Storage` and `Bucket` settings name. With
/// `create`, a missing bucket is created (a directory, an S3 bucket), as
/// formatting does.
pub fn open_store(
    storage: &str,
    bucket: &str,
    creds: &Credentials,
    s3: &S3Options,
    create: bool,
) -> Result<Arc<dyn ObjectStore>> {
    match storage {
        "file" => {
            let store = if create {
                FileStore::new(bucket)?
            } else {
                FileStore::open_existing(bucket)?
            };
            Ok(Arc::new(measured::Measured(Box::new(store))))
        }
        "s3" => {
            let store = S3Store::new(bucket, creds, s3.clone())?;
            if create {
                store.ensure_bucket()?;
            }
            Ok(Arc::new(measured::Measured(Box::new(store))))
        }
        other => Err(Error::NotSupported(format!(
            "storage {other:?}; this build serves {}",
            STORAGE_KINDS.join(" and ")
        ))),
    }
}
