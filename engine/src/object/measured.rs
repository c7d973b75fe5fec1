//! An object store that counts its requests in [`crate::metrics::OBJECTS`]:
//! [`crate::object::open_store`] wraps every store it opens in one.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::metrics::OBJECTS;
use crate::object::{ObjectInfo, ObjectStore, WritebackStats};

const GET: usize = 0;
const PUT: usize = 1;
const HEAD: usize = 2;
const DELETE: usize = 3;
const LIST: usize = 4;

/// `S` with its requests counted.
#[derive(Debug)]
pub struct Measured<S: ?Sized>(pub Box<S>);

fn count<T>(method: usize, started: Instant, r: &Result<T>, bytes: impl Fn(&T) -> usize) {
    let moved = r.as_ref().map_or(0, &bytes);
    OBJECTS.record(method, started, moved, r.is_ok());
}

impl<S: ObjectStore + ?Sized> ObjectStore for Measured<S> {
    fn describe(&self) -> String {
        self.0.describe()
    }

    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
        let t = Instant::now();
        OBJECTS.uploading(true);
        let r = self.0.put(key, data, crc);
        OBJECTS.uploading(false);
        count(PUT, t, &r, |_| data.len());
        r
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let t = Instant::now();
        let r = self.0.get(key);
        count(GET, t, &r, Vec::len);
        r
    }

    fn get_into(&self, key: &str, buf: Vec<u8>) -> Result<Vec<u8>> {
        let t = Instant::now();
        let r = self.0.get_into(key, buf);
        count(GET, t, &r, Vec::len);
        r
    }

    fn get_to(&self, key: &str, out: &mut [u8]) -> Result<usize> {
        let t = Instant::now();
        let r = self.0.get_to(key, out);
        count(GET, t, &r, |n| *n);
        r
    }

    fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
        let t = Instant::now();
        let r = self.0.get_range(key, off, len);
        count(GET, t, &r, Vec::len);
        r
    }

    fn head(&self, key: &str) -> Result<ObjectInfo> {
        let t = Instant::now();
        let r = self.0.head(key);
        count(HEAD, t, &r, |_| 0);
        r
    }

    fn delete(&self, key: &str) -> Result<()> {
        let t = Instant::now();
        let r = self.0.delete(key);
        count(DELETE, t, &r, |_| 0);
        r
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let t = Instant::now();
        let r = self.0.list(prefix);
        count(LIST, t, &r, |_| 0);
        r
    }

    fn needs_sync(&self) -> bool {
        self.0.needs_sync()
    }

    fn sync_objects(&self, keys: &[String]) -> std::result::Result<(), super::Unsynced> {
        self.0.sync_objects(keys)
    }

    fn local_file(&self, key: &str) -> Option<Result<std::fs::File>> {
        self.0.local_file(key)
    }

    fn is_cached(&self, key: &str) -> bool {
        self.0.is_cached(key)
    }

    fn evict_cached(&self, key: &str) -> bool {
        self.0.evict_cached(key)
    }

    fn drain_uploads(&self, limit: Duration) -> usize {
        self.0.drain_uploads(limit)
    }

    fn upload_backlog(&self) -> Option<WritebackStats> {
        self.0.upload_backlog()
    }
}
