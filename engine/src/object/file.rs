//! `FileStore`: the `storage=file` object store, a local directory laid out
//! exactly as JuiceFS's `file` store lays it out.
//!
//! Findings from JuiceFS 1.4.2 (`juicefs mount` on a `--storage file` volume):
//! the object for key `K` is the file `BUCKET/K` (the bucket is a directory
//! path ending in '/'); directories are created as needed with mode 0777 and
//! objects are written with mode 0666 (the mount process runs with umask 0),
//! through a temporary file `.{name}.tmp{random}` in the same directory that
//! is renamed over the final name. sluice lays objects out the same way but
//! keeps them private to the owner: the bucket, the directories it creates
//! and the objects are 0700 / 0700 / 0600 whatever the umask (objects are
//! file data; on a shared host other users must not read or replace them).
//! Directories and objects that exist already keep their modes. Like JuiceFS it
//! does not fsync each object as it is put: the write + rename is atomic and
//! survives a crash of the process, and the kernel is asked to start writing
//! it back at once. [`ObjectStore::sync_objects`] makes objects survive a
//! power loss: the writer's group commit calls it once for every object of
//! the commits it gathered, before the metadata that names them.
//!
//! A put keeps its object's descriptor open until a sync covers it, and the
//! sync is an `fdatasync` of each object (plus an `fsync` of each directory
//! that gained an entry), many at once ([`super::sync_pool`]), never a
//! `syncfs` of the whole file system, which waits for every other writer's
//! dirty data on the disk. The descriptor is the one that wrote the object:
//! Linux reports a write-back error to the descriptors open when it happened
//! (and to later openers only while the inode stays in memory), so the sync
//! sees every error of its object, and a failure is the failed object's
//! alone: commits of other objects carry on. At most a quarter of the
//! process's open-file limit (up to [`MAX_UNSYNCED`]) objects wait for a
//! sync; a put past that syncs its own object before it returns, so a
//! writer far ahead of its commits cannot run the process out of
//! descriptors.
//!
//! The CRC32C of the stored bytes is kept in the extended attribute
//! [`CRC_XATTR`] (4 bytes, big-endian). JuiceFS neither writes nor reads it;
//! objects without it (all of JuiceFS's) are served unchecked.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{ObjectInfo, ObjectStore, Unsynced};
use crate::error::{Error, Result};

/// The extended attribute holding an object's CRC32C (4 bytes, big-endian).
pub const CRC_XATTR: &str = "user.sluice.crc32c";

/// Mode of object files: the owner's only (JuiceFS's mount leaves 0666).
const OBJECT_MODE: u32 = 0o600;
/// Mode of the bucket and the directories below it that sluice creates
/// (JuiceFS's: 0777).
const DIR_MODE: u32 = 0o700;

/// The `file://` object store: one file per object under a root directory.
#[derive(Debug)]
pub struct FileStore {
    root: PathBuf,
    /// Set once the file system refused user xattrs, so we stop trying.
    no_xattr: AtomicBool,
    /// Distinguishes temporary files of concurrent puts.
    tmp_seq: AtomicU64,
    /// Whether `put` makes the object durable (file and directory fsync'ed)
    /// before it returns.
    durable: bool,
    /// Objects put and not yet synced, by key, with the descriptor that
    /// wrote each (see the module documentation).
    unsynced: parking_lot::Mutex<HashMap<String, Written>>,
    /// How many may wait ([`unsynced_limit`]).
    max_unsynced: usize,
    /// When this process runs as root and another user owns the bucket (a
    /// sandboxed `sluice serve` was given it): that user and group, which
    /// every object and directory made here gets too, so the daemon can
    /// still read what a root `sluice mount` beside it writes (SQLite gives
    /// its -wal and -shm the database's owner the same way).
    owner: Option<(u32, u32)>,
}

/// The most put objects that may wait for a sync, each holding its
/// descriptor; a store takes a quarter of the process's open-file limit, up
/// to this ([`unsynced_limit`]).
pub const MAX_UNSYNCED: usize = 1024;

/// How many objects this store lets wait for a sync: a quarter of the soft
/// limit of open files (the `sluice` binary raises it to the hard limit at
/// start), between 16 and [`MAX_UNSYNCED`].
fn unsynced_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the rlimit struct we own.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    usize::try_from(soft / 4)
        .unwrap_or(MAX_UNSYNCED)
        .clamp(16, MAX_UNSYNCED)
}

/// An object put and not yet synced.
#[derive(Debug)]
struct Written {
    /// The descriptor that wrote it.
    file: File,
    /// Where it is.
    path: PathBuf,
    /// Whether its put created directories (their parents' entries must be
    /// synced too).
    created: bool,
}

fn obj_err(key: &str, source: io::Error) -> Error {
    Error::Object {
        key: key.to_string(),
        source,
    }
}

impl FileStore {
    /// A store rooted at directory `root` (created if missing).
    pub fn new(root: impl AsRef<Path>) -> Result<FileStore> {
        let root = root.as_ref().to_path_buf();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&root)
            .map_err(|e| obj_err(&root.to_string_lossy(), e))?;
        let meta = fs::metadata(&root).map_err(|e| obj_err(&root.to_string_lossy(), e))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let as_root = unsafe { libc::geteuid() } == 0;
        let owner = (as_root && meta.uid() != 0).then(|| (meta.uid(), meta.gid()));
        Ok(FileStore {
            owner,
            root,
            no_xattr: AtomicBool::new(false),
            unsynced: parking_lot::Mutex::new(HashMap::new()),
            max_unsynced: unsynced_limit(),
            tmp_seq: AtomicU64::new(u64::from(std::process::id()) << 32),
            durable: false,
        })
    }

    /// The store of a volume's bucket directory, which must exist: a bucket
    /// that has vanished (a data disk that failed to mount, a mistyped
    /// path) is refused with a message naming it, never created empty.
    pub fn open_existing(root: impl AsRef<Path>) -> Result<FileStore> {
        let dir = root.as_ref();
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => FileStore::new(dir),
            Ok(_) => Err(Error::Invalid(format!(
                "the bucket {} is not a directory",
                dir.display()
            ))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::Invalid(format!(
                "the bucket directory {} does not exist: is the disk that holds it mounted? \
                 (sluice makes a bucket directory only when it formats a new volume)",
                dir.display()
            ))),
            Err(e) => Err(obj_err(&dir.to_string_lossy(), e)),
        }
    }

    /// A store for objects that must survive a power loss as soon as `put`
    /// returns (the writeback staging area): each put fsyncs the object and
    /// the directories it changed.
    pub fn durable(root: impl AsRef<Path>) -> Result<FileStore> {
        Ok(FileStore {
            durable: true,
            ..FileStore::new(root)?
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        // Keys come from our own code or from a listing, but a key that climbs
        // out of the bucket must never reach the file system.
        if key.is_empty() || key.starts_with('/') || key.split('/').any(|c| c == "..") {
            return Err(obj_err(
                key,
                io::Error::new(io::ErrorKind::InvalidInput, "invalid object key"),
            ));
        }
        Ok(self.root.join(key))
    }

    /// Creates the temporary file of a put; the flag says whether
    /// directories had to be created for it.
    fn create_tmp(&self, path: &Path, key: &str) -> Result<(File, PathBuf, bool)> {
        let dir = path.parent().unwrap_or(&self.root);
        let name = path.file_name().map(|n| n.as_bytes()).unwrap_or(b"obj");
        let name = &name[..name.len().min(200)];
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = Vec::with_capacity(name.len() + 32);
        tmp_name.push(b'.');
        tmp_name.extend_from_slice(name);
        tmp_name.extend_from_slice(format!(".tmp{seq}").as_bytes());
        let tmp = dir.join(std::ffi::OsStr::from_bytes(&tmp_name));
        let open = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(OBJECT_MODE)
                .open(&tmp)
        };
        let (file, created) = match open() {
            Ok(f) => (f, false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Directories below the root only: a root that vanished
                // (its disk unmounted) is not made again, empty.
                if !self.root.is_dir() {
                    return Err(obj_err(
                        key,
                        io::Error::new(
                            io::ErrorKind::NotFound,
                            format!("the bucket directory {} has vanished", self.root.display()),
                        ),
                    ));
                }
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(DIR_MODE)
                    .create(dir)
                    .map_err(|e| obj_err(key, e))?;
                self.give_dirs(dir).map_err(|e| obj_err(key, e))?;
                (open().map_err(|e| obj_err(key, e))?, true)
            }
            Err(e) => return Err(obj_err(key, e)),
        };
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(|e| obj_err(key, e))?;
        }
        Ok((file, tmp, created))
    }

    /// Gives `dir` and its parents below the root to the bucket's owner
    /// (see `owner`), where they are not already its.
    fn give_dirs(&self, dir: &Path) -> io::Result<()> {
        let Some((uid, gid)) = self.owner else {
            return Ok(());
        };
        for d in dir.ancestors() {
            if d == self.root || !d.starts_with(&self.root) {
                break;
            }
            let meta = d.symlink_metadata()?;
            if meta.uid() != uid || meta.gid() != gid {
                std::os::unix::fs::lchown(d, Some(uid), Some(gid))?;
            }
        }
        Ok(())
    }

    /// fsyncs the directory holding `path`, and when `created`, every
    /// directory up to the root (their new entries must survive too).
    fn sync_dirs(&self, path: &Path, created: bool) -> io::Result<()> {
        for d in self.dirs_to_sync(path, created) {
            File::open(d)?.sync_all()?;
        }
        Ok(())
    }

    /// The directories whose entries a put at `path` changed: its own, and
    /// when it `created` directories, each one up to the root.
    fn dirs_to_sync<'p>(&self, path: &'p Path, created: bool) -> Vec<&'p Path> {
        let mut out = Vec::new();
        let mut dir = path.parent();
        while let Some(d) = dir {
            out.push(d);
            if !created || d == self.root || !d.starts_with(&self.root) {
                break;
            }
            dir = d.parent();
        }
        out
    }

    fn set_crc(&self, file: &File, key: &str, crc: u32) {
        if self.no_xattr.load(Ordering::Relaxed) {
            return;
        }
        let name = CString::new(CRC_XATTR).unwrap_or_default();
        let value = crc.to_be_bytes();
        // SAFETY: the fd is open for the call's duration; name is a valid
        // NUL-terminated string and value points to 4 readable bytes.
        let rc = unsafe {
            libc::fsetxattr(
                file.as_raw_fd(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::ENOTSUP)) {
                self.no_xattr.store(true, Ordering::Relaxed);
                log::warn!(
                    "{}: the file system does not keep user xattrs; block checksums are not stored",
                    self.root.display()
                );
            } else {
                log::warn!("{key}: cannot store the block checksum: {e}");
            }
        }
    }

    /// The first half of a put: writes `data` (and its CRC32C, computed
    /// when `None`) to a temporary file beside the object's place, synced
    /// when the store is durable. Nothing is visible until
    /// [`PreparedPut::rename`]; dropping the result removes the file. Split
    /// so that a caller can publish the object under its own lock.
    pub fn prepare_put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<PreparedPut<'_>> {
        let path = self.path(key)?;
        let crc = crc.unwrap_or_else(|| sluice_simd::crc32c(0, data));
        let (file, tmp, created) = self.create_tmp(&path, key)?;
        let mut put = PreparedPut {
            store: self,
            key: key.to_string(),
            tmp,
            path,
            created,
            renamed: false,
            file: None,
        };
        let written = (|| -> io::Result<bool> {
            let direct = write_object(&file, data)?;
            file.set_permissions(fs::Permissions::from_mode(OBJECT_MODE))?;
            Ok(direct)
        })();
        let direct = written.map_err(|e| obj_err(key, e))?;
        self.set_crc(&file, key, crc);
        // A bucket store has no fsync here (JuiceFS's file store has none
        // either): a put is atomic, and `sync_objects` — which the writer's
        // group commit runs before it commits the slice — makes it durable.
        // A durable store syncs the data (and the xattr) first.
        if self.durable {
            file.sync_all().map_err(|e| obj_err(key, e))?;
        } else if !direct {
            start_writeback(&file);
        }
        put.file = Some(file);
        Ok(put)
    }

    /// The stored CRC32C of an open object, if it has one.
    fn stored_crc(file: &File) -> Option<u32> {
        let name = CString::new(CRC_XATTR).ok()?;
        let mut value = [0u8; 4];
        // SAFETY: the fd is open; name is NUL-terminated; value has room for
        // the 4 bytes we pass as its size.
        let n = unsafe {
            libc::fgetxattr(
                file.as_raw_fd(),
                name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        (n == 4).then(|| u32::from_be_bytes(value))
    }

    /// Logs and returns the error of an object whose bytes (CRC32C
    /// `actual`) fail the checksum stored with it, read twice.
    fn fails_checksum(&self, key: &str, stored: u32, actual: u32) -> Error {
        log::error!(
            "object {key} in {} fails its checksum: stored crc32c {stored:08x}, data has {actual:08x}",
            self.describe(),
        );
        Error::Corrupt(format!("object {key} does not match its stored CRC32C"))
    }

    fn read_whole(&self, key: &str, mut buf: Vec<u8>) -> Result<(Vec<u8>, Option<u32>)> {
        let path = self.path(key)?;
        let mut file = File::open(&path).map_err(|e| obj_err(key, e))?;
        let len = file.metadata().map_err(|e| obj_err(key, e))?.len() as usize;
        let want = len.next_multiple_of(DIRECT_ALIGN);
        buf.clear();
        if buf.capacity() < want {
            buf = Vec::with_capacity(want);
        }
        if !read_direct(&file, &mut buf, len) {
            buf.clear();
            file.read_to_end(&mut buf).map_err(|e| obj_err(key, e))?;
        }
        Ok((buf, Self::stored_crc(&file)))
    }

    /// [`FileStore::read_whole`] into `out`: the object's length and stored
    /// CRC.
    fn read_whole_to(&self, key: &str, out: &mut [u8]) -> Result<(usize, Option<u32>)> {
        let path = self.path(key)?;
        let file = File::open(&path).map_err(|e| obj_err(key, e))?;
        let len = file.metadata().map_err(|e| obj_err(key, e))?.len();
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= out.len())
            .ok_or_else(|| super::too_long(key, len as usize, out.len()))?;
        if !read_direct_to(&file, out, len) {
            // A file cut while it is read ends early: an error, not zeros.
            file.read_exact_at(&mut out[..len], 0)
                .map_err(|e| obj_err(key, e))?;
        }
        Ok((len, Self::stored_crc(&file)))
    }
}

/// An object written to its temporary file by [`FileStore::prepare_put`],
/// not yet in place.
#[derive(Debug)]
pub struct PreparedPut<'a> {
    store: &'a FileStore,
    key: String,
    tmp: PathBuf,
    path: PathBuf,
    /// Whether directories were created for it.
    created: bool,
    renamed: bool,
    /// The descriptor that wrote it (kept until a sync covers the object).
    file: Option<File>,
}

impl PreparedPut<'_> {
    /// Renames the object into place: readers see it from now on. For a
    /// bucket store the object then waits for the
    /// [`ObjectStore::sync_objects`] of its key, unless the store's limit
    /// of objects wait already: then it is synced here, with its
    /// directories.
    pub fn rename(&mut self) -> Result<()> {
        fs::rename(&self.tmp, &self.path).map_err(|e| obj_err(&self.key, e))?;
        self.renamed = true;
        let Some(file) = self.file.take() else {
            return Ok(());
        };
        if self.store.durable {
            return Ok(());
        }
        let written = Written {
            file,
            path: self.path.clone(),
            created: self.created,
        };
        let full = {
            let mut unsynced = self.store.unsynced.lock();
            if unsynced.len() < self.store.max_unsynced {
                unsynced.insert(self.key.clone(), written);
                None
            } else {
                Some(written)
            }
        };
        if let Some(w) = full {
            w.file
                .sync_data()
                .and_then(|()| self.store.sync_dirs(&w.path, w.created))
                .map_err(|e| obj_err(&self.key, e))?;
        }
        Ok(())
    }

    /// For a durable store, fsyncs the directories the put changed, so
    /// that the renamed object survives a power loss; a no-op otherwise.
    pub fn sync_dirs(&self) -> Result<()> {
        if !self.store.durable {
            return Ok(());
        }
        self.store
            .sync_dirs(&self.path, self.created)
            .map_err(|e| obj_err(&self.key, e))
    }
}

impl Drop for PreparedPut<'_> {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// The alignment of address and length that direct I/O needs (the largest
/// logical block size in use; 512-byte devices accept it too).
const DIRECT_ALIGN: usize = 4096;

/// The smallest object written with direct I/O. A small object goes through
/// the page cache: its write returns at once and the disk takes it while the
/// slice is committed, so an fsync right after waits for one sync, not a
/// synchronous write and then a sync.
const DIRECT_MIN: usize = 1 << 20;

/// Sets or clears `O_DIRECT` on an open file.
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl(2) F_GETFL/F_SETFL on a descriptor we own; no memory is
    // passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_DIRECT
        } else {
            flags & !libc::O_DIRECT
        };
        if libc::fcntl(fd, libc::F_SETFL, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Writes a new object's bytes at the start of `file`; returns whether they
/// went by direct I/O. A buffer whose address and length are page-aligned —
/// a full block straight from a write buffer — goes with `O_DIRECT`: the
/// disk takes it from our memory, with no copy into the page cache and no
/// page-cache pages to find for it (on a VM each new page can cost a fault
/// in the host; measured here, writes through the page cache fell from
/// 850 to 150 MiB/s once its free pages ran out). Whole-object reads go
/// around the page cache too ([`read_direct`]); the memory and disk block
/// caches keep what is read. Anything else — partial
/// blocks, compressed objects, a file system without direct I/O — is
/// written through the page cache.
fn write_object(file: &File, data: &[u8]) -> io::Result<bool> {
    let aligned = data.len() >= DIRECT_MIN
        && (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
        && data.len().is_multiple_of(DIRECT_ALIGN);
    if aligned && set_direct(file, true).is_ok() {
        match file.write_all_at(data, 0) {
            Ok(()) => return Ok(true),
            // The file system refused direct I/O after all: write buffered.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => set_direct(file, false)?,
            Err(e) => return Err(e),
        }
    }
    file.write_all_at(data, 0)?;
    Ok(false)
}

/// Reads a whole object of `len` bytes into `buf` (empty, with capacity for
/// `len` rounded up to [`DIRECT_ALIGN`]) by direct I/O, when the buffer is
/// aligned for it; returns false, with `buf` holding an unknown part, when
/// it could not (the caller reads it through the page cache instead).
/// Objects are read whole into the memory block cache, which keeps what is
/// read again: going around the page cache saves a copy and a second copy
/// of the block in memory, as [`write_object`] does for writes.
fn read_direct(file: &File, buf: &mut Vec<u8>, len: usize) -> bool {
    let spare = buf.spare_capacity_mut();
    // SAFETY: `spare` is memory `buf` owns and does not count as
    // initialised; `pread_direct` writes only into it, and the length is
    // set below only to the `len` bytes it read.
    let ok = unsafe { pread_direct(file, spare.as_mut_ptr().cast(), spare.len(), len) };
    if ok {
        // SAFETY: pread initialised the first `len` bytes.
        unsafe { buf.set_len(len) };
    }
    ok
}

/// [`read_direct`] into a slice: the object's `len` bytes into the start
/// of `out`, around the page cache, if `out` is aligned for it and has
/// room for the last aligned read.
fn read_direct_to(file: &File, out: &mut [u8], len: usize) -> bool {
    // SAFETY: `out` is initialised memory we borrow mutably; any bytes
    // pread writes into it are valid `u8`s.
    unsafe { pread_direct(file, out.as_mut_ptr(), out.len(), len) }
}

/// Reads the first `len` bytes of `file` with O_DIRECT into `dst`, which
/// has room for `room` bytes. Returns false, having written an unknown part
/// of `dst`, when it could not: `dst` unaligned, too small for the last
/// aligned read, an object under one alignment unit, or a short read.
///
/// # Safety
/// `dst` must be valid for writes of `room` bytes for the whole call.
unsafe fn pread_direct(file: &File, dst: *mut u8, room: usize, len: usize) -> bool {
    let want = len.next_multiple_of(DIRECT_ALIGN);
    if len < DIRECT_ALIGN
        || room < want
        || !(dst as usize).is_multiple_of(DIRECT_ALIGN)
        || set_direct(file, true).is_err()
    {
        return false;
    }
    let mut done = 0;
    let ok = loop {
        // SAFETY: `dst[done..want]` lies inside the `room` bytes the caller
        // vouched for; pread(2) writes at most `want - done` bytes there.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                dst.add(done).cast(),
                want - done,
                done as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => break done == len,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => break false,
        }
        if done >= len {
            break done == len;
        }
        if !done.is_multiple_of(DIRECT_ALIGN) {
            // A short read mid-file leaves the next one misaligned.
            break false;
        }
    };
    let _ = set_direct(file, false);
    ok
}

/// Asks the kernel to start writing a new object's pages to disk now,
/// without waiting. Puts run on upload threads while the application keeps
/// writing, so the disk works in parallel with it, and the `syncfs` that an
/// fsync ends with finds little left to do (measured: the fsync after a
/// 256 MiB write otherwise waits ~0.2 s for the disk). A hint: a failure
/// only means the data is written back later, as without it.
fn start_writeback(file: &File) {
    // SAFETY: sync_file_range(2) on a descriptor we own; no memory is passed.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

impl FileStore {
    /// Opens an object for reads of parts of it. Those are the random-read
    /// path (sequential readers fetch whole blocks), so the kernel is told
    /// not to read ahead: its readahead on the object would read 4 times or
    /// more the bytes asked for from the disk (cold 4 KiB random reads here
    /// ran at a third of the disk's rate).
    fn open_for_range(&self, key: &str) -> Result<File> {
        let path = self.path(key)?;
        let file = File::open(&path).map_err(|e| obj_err(key, e))?;
        // SAFETY: posix_fadvise(2) on a descriptor we own; it is only advice.
        let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        Ok(file)
    }
}

impl ObjectStore for FileStore {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
        let mut put = self.prepare_put(key, data, crc)?;
        put.rename()?;
        put.sync_dirs()
    }

    fn local_file(&self, key: &str) -> Option<Result<File>> {
        Some(self.open_for_range(key))
    }

    /// A bucket's puts wait for a sync; a durable store's are synced as
    /// they are put.
    fn needs_sync(&self) -> bool {
        !self.durable
    }

    /// `fdatasync` of each object in `keys` still waiting for a sync,
    /// through the descriptor that wrote it, and `fsync` of each directory
    /// those puts changed, all at once (the sync pool). A failed object
    /// fails its own key; a failed directory every key whose entry it
    /// holds. Keys not waiting (synced already, or never put here) are
    /// durable.
    fn sync_objects(&self, keys: &[String]) -> std::result::Result<(), Unsynced> {
        let taken: Vec<(usize, Written)> = {
            let mut unsynced = self.unsynced.lock();
            keys.iter()
                .enumerate()
                .filter_map(|(i, k)| unsynced.remove(k).map(|w| (i, w)))
                .collect()
        };
        if taken.is_empty() {
            return Ok(());
        }
        let mut dirs: Vec<PathBuf> = taken
            .iter()
            .flat_map(|(_, w)| self.dirs_to_sync(&w.path, w.created))
            .map(Path::to_path_buf)
            .collect();
        dirs.sort();
        dirs.dedup();
        // Directories and files together: each directory already holds its
        // renamed entries, and nothing is named by metadata before all of
        // them are done.
        let mut tasks: Vec<Box<dyn FnOnce() -> io::Result<()> + Send>> = Vec::new();
        for d in &dirs {
            let d = d.clone();
            tasks.push(Box::new(move || File::open(&d)?.sync_all()));
        }
        let mut paths = Vec::with_capacity(taken.len());
        let mut indexes = Vec::with_capacity(taken.len());
        for (i, w) in taken {
            paths.push(w.path);
            indexes.push(i);
            let file = w.file;
            tasks.push(Box::new(move || file.sync_data()));
        }
        let results = super::sync_pool::run_all(tasks);
        let (dir_results, file_results) = results.split_at(dirs.len());
        let outcome = |r: &Option<io::Result<()>>| -> io::Result<()> {
            match r {
                Some(Ok(())) => Ok(()),
                Some(Err(e)) => Err(io::Error::new(e.kind(), e.to_string())),
                None => Err(io::Error::other("a sync thread panicked")),
            }
        };
        let mut failed = Vec::new();
        for ((path, i), r) in paths.iter().zip(&indexes).zip(file_results) {
            let key = &keys[*i];
            let res = outcome(r).and_then(|()| {
                // A directory on the way from the object up to the root
                // that failed loses the object's entry.
                dirs.iter()
                    .zip(dir_results)
                    .filter(|(d, _)| path.starts_with(d))
                    .try_for_each(|(d, r)| {
                        outcome(r).map_err(|e| {
                            io::Error::new(
                                e.kind(),
                                format!("syncing the directory {} failed: {e}", d.display()),
                            )
                        })
                    })
            });
            if let Err(e) = res {
                failed.push((*i, obj_err(key, e)));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Unsynced(failed))
        }
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_into(key, Vec::new())
    }

    fn get_into(&self, key: &str, buf: Vec<u8>) -> Result<Vec<u8>> {
        let (buf, stored) = self.read_whole(key, buf)?;
        let Some(stored) = stored else {
            return Ok(buf);
        };
        if sluice_simd::crc32c(0, &buf) == stored {
            return Ok(buf);
        }
        // A torn read (or a flaky disk) may pass on a second try.
        let (buf, stored) = self.read_whole(key, buf)?;
        let actual = sluice_simd::crc32c(0, &buf);
        if stored.is_none_or(|s| s == actual) {
            return Ok(buf);
        }
        Err(self.fails_checksum(key, stored.unwrap_or_default(), actual))
    }

    fn get_to(&self, key: &str, out: &mut [u8]) -> Result<usize> {
        let mut actual = 0;
        let mut stored = None;
        for _ in 0..2 {
            // A torn read (or a flaky disk) may pass on a second try.
            let (len, crc) = self.read_whole_to(key, out)?;
            let Some(crc) = crc else {
                return Ok(len);
            };
            actual = sluice_simd::crc32c(0, &out[..len]);
            if actual == crc {
                return Ok(len);
            }
            stored = Some(crc);
        }
        Err(self.fails_checksum(key, stored.unwrap_or_default(), actual))
    }

    fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
        let file = self.open_for_range(key)?;
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match file.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(obj_err(key, e)),
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    fn head(&self, key: &str) -> Result<ObjectInfo> {
        let path = self.path(key)?;
        let md = fs::metadata(&path).map_err(|e| obj_err(key, e))?;
        if !md.is_file() {
            return Err(obj_err(
                key,
                io::Error::new(io::ErrorKind::NotFound, "not an object"),
            ));
        }
        Ok(ObjectInfo {
            key: key.to_string(),
            size: md.len(),
            mtime: md.modified().map_err(|e| obj_err(key, e))?,
        })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        // A deleted object needs no sync (and its descriptor can go).
        self.unsynced.lock().remove(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(obj_err(key, e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        // Walk only the directory the prefix names (or its parent when the
        // prefix ends inside a name), then filter by the full prefix.
        let start = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let mut out = Vec::new();
        let dir = if start.is_empty() {
            self.root.clone()
        } else {
            self.path(start)?
        };
        let mut stack = vec![(dir, start.to_string())];
        while let Some((dir, key_dir)) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(obj_err(&key_dir, e)),
            };
            for ent in rd {
                let ent = ent.map_err(|e| obj_err(&key_dir, e))?;
                let name = ent.file_name();
                let Some(name) = name.to_str() else { continue };
                let key = if key_dir.is_empty() {
                    name.to_string()
                } else {
                    format!("{key_dir}/{name}")
                };
                let ft = ent.file_type().map_err(|e| obj_err(&key, e))?;
                if ft.is_dir() {
                    if key.starts_with(prefix) || prefix.starts_with(&format!("{key}/")) {
                        stack.push((ent.path(), key));
                    }
                } else if ft.is_file() && key.starts_with(prefix) && !name.starts_with('.') {
                    // Dot files are temporaries of puts in flight. An object
                    // deleted between the directory read and this stat (by
                    // gc or compaction running beside the listing) is simply
                    // not listed, as a listing of S3 would not show it.
                    let md = match ent.metadata() {
                        Ok(md) => md,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(obj_err(&key, e)),
                    };
                    let mtime = md.modified().map_err(|e| obj_err(&key, e))?;
                    out.push(ObjectInfo {
                        key,
                        size: md.len(),
                        mtime,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::is_not_found;

    #[test]
    fn as_root_objects_and_directories_take_the_owner_of_a_bucket_given_away() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("skipped: only root creates files for another user");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (uid, gid) = (65534, 65533);
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        let key = "vol/chunks/0/0/5_0_11";
        store.put(key, b"hello world", None).unwrap();
        for p in [key, "vol/chunks/0/0", "vol/chunks/0", "vol"] {
            let md = fs::symlink_metadata(dir.path().join(p)).unwrap();
            assert_eq!((md.uid(), md.gid()), (uid, gid), "{p}");
        }
        // A bucket root owns stays root's.
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        store.put(key, b"hello world", None).unwrap();
        assert_eq!(fs::metadata(dir.path().join(key)).unwrap().uid(), 0);
    }

    #[test]
    fn a_vanished_bucket_directory_is_never_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("bucket");
        let err = FileStore::open_existing(&root).unwrap_err().to_string();
        assert!(
            err.contains("does not exist") && err.contains("mounted"),
            "{err}"
        );
        assert!(!root.exists());
        let store = FileStore::open_existing(dir.path()).unwrap();
        store.put("v/chunks/0/0/1_0_3", b"abc", None).unwrap();
        // The root goes while the store is open: puts fail, and nothing
        // is created in its place.
        let store = FileStore::new(&root).unwrap();
        fs::remove_dir(&root).unwrap();
        let err = store.put("v/chunks/0/0/2_0_3", b"abc", None).unwrap_err();
        assert!(err.to_string().contains("has vanished"), "{err}");
        assert!(!root.exists());
    }

    #[test]
    fn put_get_range_head_delete() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        let key = "vol/chunks/0/0/5_0_11";
        store.put(key, b"hello world", None).unwrap();
        assert_eq!(store.get(key).unwrap(), b"hello world");
        assert_eq!(store.get_range(key, 6, 100).unwrap(), b"world");
        assert_eq!(store.head(key).unwrap().size, 11);
        let path = dir.path().join(key);
        let md = fs::metadata(&path).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, OBJECT_MODE);
        let d = fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(d.permissions().mode() & 0o777, DIR_MODE);
        let root = fs::metadata(dir.path().join("vol")).unwrap();
        assert_eq!(root.permissions().mode() & 0o777, DIR_MODE);
        // No temporary file is left beside the object.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        // Overwrite replaces the whole object.
        store.put(key, b"bye", None).unwrap();
        assert_eq!(store.get(key).unwrap(), b"bye");
        store.delete(key).unwrap();
        store.delete(key).unwrap();
        assert!(is_not_found(&store.get(key).unwrap_err()));
        assert!(is_not_found(&store.head(key).unwrap_err()));
    }

    #[test]
    fn a_bucket_syncs_the_objects_it_was_asked_for_and_a_staging_store_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path().join("bucket")).unwrap();
        assert!(store.needs_sync());
        store.sync_objects(&[]).unwrap();
        let keys: Vec<String> = (0..5).map(|i| format!("v/chunks/0/{i}/{i}_0_3")).collect();
        for k in &keys {
            store.put(k, b"abc", None).unwrap();
        }
        assert_eq!(store.unsynced.lock().len(), 5);
        // Only the keys asked for are synced (and forgotten); one never put
        // is durable.
        store
            .sync_objects(&[keys[1].clone(), keys[3].clone(), "v/none".into()])
            .unwrap();
        let mut left: Vec<String> = store.unsynced.lock().keys().cloned().collect();
        left.sort();
        assert_eq!(left, [keys[0].clone(), keys[2].clone(), keys[4].clone()]);
        // A deleted object waits for nothing.
        store.delete(&keys[0]).unwrap();
        store.sync_objects(&keys).unwrap();
        assert!(store.unsynced.lock().is_empty());
        let staging = FileStore::durable(dir.path().join("staging")).unwrap();
        assert!(!staging.needs_sync());
        staging.put("v/chunks/0/0/1_0_3", b"abc", None).unwrap();
        assert!(staging.unsynced.lock().is_empty());
    }

    #[test]
    fn puts_past_the_limit_sync_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        let max = store.max_unsynced;
        assert!((16..=MAX_UNSYNCED).contains(&max));
        for i in 0..max + 10 {
            store
                .put(&format!("v/chunks/0/0/{i}_0_1"), b"x", None)
                .unwrap();
        }
        assert_eq!(store.unsynced.lock().len(), max);
        for i in 0..max + 10 {
            assert_eq!(store.get(&format!("v/chunks/0/0/{i}_0_1")).unwrap(), b"x");
        }
    }

    #[test]
    fn page_aligned_blocks_go_direct_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        let n = DIRECT_MIN;
        let mut backing = vec![0u8; n + 2 * DIRECT_ALIGN];
        let at = backing.as_ptr().align_offset(DIRECT_ALIGN);
        for (i, b) in backing.iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        let aligned = &backing[at..at + n];
        let key = "v/chunks/0/0/1_0_1048576";
        store.put(key, aligned, None).unwrap();
        assert_eq!(store.get(key).unwrap(), aligned);
        let file = File::open(dir.path().join(key)).unwrap();
        assert_eq!(
            FileStore::stored_crc(&file),
            Some(sluice_simd::crc32c(0, aligned))
        );
        // Misaligned address or length: through the page cache, same bytes.
        let odd = &backing[at + 1..at + 1 + n];
        store.put("v/chunks/0/0/2_0_1048576", odd, None).unwrap();
        assert_eq!(store.get("v/chunks/0/0/2_0_1048576").unwrap(), odd);
        let short = &backing[at..at + n - 100];
        store.put("v/chunks/0/0/3_0_1048476", short, None).unwrap();
        assert_eq!(store.get("v/chunks/0/0/3_0_1048476").unwrap(), short);
        // Small, aligned: through the page cache too (its write overlaps
        // the metadata commit instead of waiting for the disk).
        let small = &backing[at..at + (64 << 10)];
        store.put("v/chunks/0/0/4_0_65536", small, None).unwrap();
        assert_eq!(store.get("v/chunks/0/0/4_0_65536").unwrap(), small);
        // Which way each went.
        let probe = |name: &str, data: &[u8]| {
            let f = File::create(dir.path().join(name)).unwrap();
            write_object(&f, data).unwrap()
        };
        assert!(probe("p1", aligned));
        assert!(!probe("p2", odd));
        assert!(!probe("p3", short));
        assert!(!probe("p4", small));
    }

    #[test]
    fn crc_mismatch_is_corrupt_and_unchecked_objects_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        let key = "v/chunks/0/0/1_0_4";
        store.put(key, b"abcd", None).unwrap();
        let path = dir.path().join(key);
        assert_eq!(
            FileStore::stored_crc(&File::open(&path).unwrap()),
            Some(sluice_simd::crc32c(0, b"abcd"))
        );
        // Flip a byte in place (keeps the xattr).
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_at(b"X", 1).unwrap();
        let err = store.get(key).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt(ref m) if m.contains(key)),
            "{err}"
        );
        // An object written by someone else (no xattr) is served as is.
        fs::write(dir.path().join("v/chunks/0/0/2_0_3"), b"xyz").unwrap();
        assert_eq!(store.get("v/chunks/0/0/2_0_3").unwrap(), b"xyz");
    }

    /// `get_to` reads an object into the caller's memory: around the page
    /// cache where the memory is aligned and has room for the last aligned
    /// read, through it otherwise; the checksum is checked either way, and
    /// an object larger than the room is an error, not a short copy.
    #[test]
    fn get_to_reads_into_the_callers_memory_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        let data: Vec<u8> = (0..3 * DIRECT_ALIGN as u32 + 100)
            .map(|i| (i % 253) as u8)
            .collect();
        let key = "v/chunks/0/0/1_0_12388";
        store.put(key, &data, None).unwrap();
        // Page-aligned memory with room for whole units: the direct path.
        let layout = std::alloc::Layout::from_size_align(4 * DIRECT_ALIGN, DIRECT_ALIGN).unwrap();
        // SAFETY: a non-zero size; freed below with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        // SAFETY: `ptr` holds `layout.size()` initialised bytes, ours alone.
        let aligned = unsafe { std::slice::from_raw_parts_mut(ptr, layout.size()) };
        assert_eq!(store.get_to(key, aligned).unwrap(), data.len());
        assert!(aligned[..data.len()] == data[..]);
        // Exactly the object's length (no room for the last unit), and
        // unaligned memory: through the page cache.
        let mut exact = vec![0u8; data.len()];
        assert_eq!(store.get_to(key, &mut exact).unwrap(), data.len());
        assert_eq!(exact, data);
        assert_eq!(store.get_to(key, &mut aligned[1..]).unwrap(), data.len());
        assert!(aligned[1..=data.len()] == data[..]);
        // Too little room.
        let err = store.get_to(key, &mut exact[1..]).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt(ref m) if m.contains(key)),
            "{err}"
        );
        // A damaged object is corrupt on both paths.
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(key))
            .unwrap();
        f.write_at(b"X", 5000).unwrap();
        let err = store.get_to(key, aligned).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt(ref m) if m.contains("CRC32C")),
            "{err}"
        );
        let err = store.get_to(key, &mut exact).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt(ref m) if m.contains("CRC32C")),
            "{err}"
        );
        // SAFETY: allocated above with this layout; `aligned` is not used
        // after this.
        unsafe { std::alloc::dealloc(ptr, layout) };
        assert!(is_not_found(
            &store.get_to("v/chunks/0/0/9_0_1", &mut exact).unwrap_err()
        ));
    }

    #[test]
    fn list_by_prefix_skips_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        for k in [
            "v/chunks/0/0/1_0_3",
            "v/chunks/0/1/1001_0_3",
            "v/juicefs_uuid",
            "w/chunks/0/0/1_0_3",
        ] {
            store.put(k, b"abc", None).unwrap();
        }
        fs::write(dir.path().join("v/chunks/0/0/.1_0_3.tmp9"), b"t").unwrap();
        let keys: Vec<_> = store
            .list("v/chunks/")
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, ["v/chunks/0/0/1_0_3", "v/chunks/0/1/1001_0_3"]);
        assert_eq!(store.list("v/").unwrap().len(), 3);
        assert_eq!(store.list("").unwrap().len(), 4);
    }

    #[test]
    fn listing_beside_deletes_skips_what_vanished() {
        // A listing racing deletes once failed with NotFound for an object
        // removed between readdir and stat (compaction's test saw it in CI).
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(FileStore::new(dir.path()).unwrap());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for i in 0..200 {
                        store
                            .put(&format!("v/chunks/0/0/{i}_0_3"), b"abc", None)
                            .unwrap();
                    }
                    for i in 0..200 {
                        store.delete(&format!("v/chunks/0/0/{i}_0_3")).unwrap();
                    }
                }
            })
        };
        for _ in 0..300 {
            let listed = store.list("v/chunks/").unwrap();
            assert!(listed.iter().all(|o| o.size == 3), "{listed:?}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
    }

    #[test]
    fn keys_outside_the_bucket_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        assert!(store.put("../x", b"a", None).is_err());
        assert!(store.get("/etc/passwd").is_err());
    }
}
