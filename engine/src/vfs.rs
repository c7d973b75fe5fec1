//! The file-system facade the FUSE dispatcher calls (for the host mount and
//! virtio-fs alike): inode operations go to the metadata engine, file data
//! through the write buffers, the reader and the block cache.
//! `engine/DESIGN.md` gives the rules it keeps (coherence, sticky write
//! errors).
//!
//! Every method takes `&self` and may run on many threads at once.

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::block_cache::BlockCache;
use crate::commit::{CommitConfig, CommitStats, Committer};
use crate::compaction::{COMPACT_THRESHOLD, Compactor};
use crate::error::{Error, Limit, Result};
use crate::gc::slice_releaser;
use crate::meta::acl::{self, AclType};
use crate::meta::{
    Attr, CHUNK_SIZE, Context, CopyRange, DirCursor, Entry, FileType, Ino, ROOT_INO, RenameFlags,
    SetAttr, StatFs, TruncateVia, XattrMode,
};
use crate::metrics::{MetaOp, meta_op};
use crate::object::ObjectStore;
use crate::object::disk_cache::{CachedStore, DiskCache, DiskCacheConfig, DiskCacheCounters};
use crate::readahead::{Readahead, ReadaheadConfig};
use crate::reader::{Fragment, ReadDest, Reader};
use crate::volume::Volume;
use crate::writer::{BlockUploader, Committed, FileWriter};

/// The handle and open types, the trait `Vfs` implements and its listing
/// mode are the API crate's; here under their old names.
pub use sluice_api::filesystem::{Fh, Filesystem, Listed, OpenOut};
use sluice_api::source::WriteSource;

/// Tunables of a [`Vfs`].
#[derive(Debug, Clone)]
pub struct VfsConfig {
    /// Bytes of decompressed blocks kept in memory.
    pub cache_bytes: usize,
    /// Whether the memory cache faults in all its memory at start (in the
    /// background), so fetched blocks land in warm pages.
    pub cache_prefault: bool,
    /// Buffered bytes per file that start a background commit.
    pub buffer_bytes: usize,
    /// Buffered bytes over all files (commits in flight included) past
    /// which a writer commits its file before returning.
    pub total_buffer_bytes: usize,
    /// Threads that upload one slice's blocks in parallel.
    pub upload_threads: usize,
    /// Whether fragmented chunks are compacted in the background.
    pub compaction: bool,
    /// How often the metadata engine's background cleanup runs (None: never).
    pub cleanup_interval: Option<Duration>,
    /// Readahead windows and random-read prefetch.
    pub readahead: ReadaheadConfig,
    /// Threads that fetch blocks in the background (0: no readahead or
    /// prefetch at all).
    pub prefetch_threads: usize,
    /// The CPUs the prefetch threads run on, so the blocks they fetch are
    /// allocated on those CPUs' NUMA node (None: unpinned).
    pub prefetch_cpus: Option<sluice_numa::CpuSet>,
    /// How long `destroy` (unmount) waits for the object store's background
    /// uploads (writeback staging) to finish; what is left stays staged and
    /// is uploaded at the next start. `None`: do not wait (a server that
    /// outlives this session keeps uploading anyway).
    pub upload_drain: Option<Duration>,
    /// The disk block cache in front of the object store (None: no disk
    /// cache). It caches raw objects, below the memory cache of
    /// decompressed blocks.
    pub disk_cache: Option<DiskCacheConfig>,
    /// Where the reader takes blocks from before fetching them itself: the
    /// host daemon of `sluice serve --host` (`crate::block_source`); None:
    /// standalone.
    pub block_source: Option<Arc<dyn crate::block_source::BlockSource>>,
    /// When reads and directory listings move access times.
    pub atime: AtimeMode,
    /// Whether the file system is served read-only (no access-time
    /// updates either).
    pub read_only: bool,
    /// Directory entries all open directory handles may hold in their
    /// snapshots together; a listing that would pass it fails with ENOMEM
    /// ([`crate::Limit::DirEntries`]) and holds nothing. Unlimited by
    /// default (the host's own kernel); `sluice serve` holds a guest to
    /// [`DEFAULT_MAX_DIR_ENTRIES`] unless told otherwise.
    pub max_dir_entries: u64,
    /// How the group commit gathers files' commits (`--commit-delay`).
    pub commit: CommitConfig,
}

/// The limit of directory entries `sluice serve` holds a guest's open
/// listings to by default: 4 Mi entries, a few hundred MiB; a client that
/// lists its largest directories one or a few at a time never comes near
/// it.
pub const DEFAULT_MAX_DIR_ENTRIES: u64 = 4 << 20;

/// How many times [`Vfs::adjusted`] reads a file's attributes again while
/// its commits keep running (then the last read stands).
const ADJUST_TRIES: usize = 4;

/// The counters attributes read from the metadata engine are checked
/// against before they go out ([`Vfs::adjusted`]).
#[derive(Debug, Clone, Copy)]
struct Epoch {
    /// `Vfs::forgotten` when they were read.
    forgotten: u64,
    /// `Vfs::landed` when they were read.
    landed: u64,
}

/// The entries a directory listing reads from the metadata engine at a
/// time: more than a 128 KiB READDIRPLUS reply holds of typical names, so
/// a reply costs one or two pages, and few enough that a page is one short
/// read of the engine.
pub const READDIR_PAGE: usize = 512;

/// When reads move a file's access time (JuiceFS's `--atime-mode`). The
/// engine sees only the reads the kernel's page cache did not answer, so
/// a re-read of cached pages (the host mount keeps pages while a file stays
/// open) moves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeMode {
    /// Never: reads cost no metadata writes (JuiceFS's default).
    #[default]
    NoAtime,
    /// Linux's `relatime`: when the access time is not after the last
    /// modification or change, or is a day old.
    RelAtime,
    /// On every read and listing.
    StrictAtime,
}

impl std::fmt::Display for AtimeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AtimeMode::NoAtime => "noatime",
            AtimeMode::RelAtime => "relatime",
            AtimeMode::StrictAtime => "strictatime",
        })
    }
}

/// The atime mode must be one of the three names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the atime mode must be \"noatime\", \"relatime\" or \"strictatime\", not {0:?}")]
pub struct ParseAtimeModeError(pub String);

impl std::str::FromStr for AtimeMode {
    type Err = ParseAtimeModeError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim() {
            "noatime" => Ok(AtimeMode::NoAtime),
            "relatime" => Ok(AtimeMode::RelAtime),
            "strictatime" => Ok(AtimeMode::StrictAtime),
            other => Err(ParseAtimeModeError(other.to_string())),
        }
    }
}

impl AtimeMode {
    /// Whether a read at `now` moves an access time of `a`.
    fn due(self, a: &Attr, now: crate::meta::Timestamp) -> bool {
        match self {
            AtimeMode::NoAtime => false,
            AtimeMode::StrictAtime => true,
            AtimeMode::RelAtime => {
                a.atime <= a.mtime || a.atime <= a.ctime || now.secs - a.atime.secs >= 24 * 3600
            }
        }
    }
}

impl Default for VfsConfig {
    fn default() -> Self {
        VfsConfig {
            cache_bytes: 1 << 30,
            cache_prefault: false,
            buffer_bytes: 64 << 20,
            total_buffer_bytes: 1 << 30,
            upload_threads: 8,
            compaction: true,
            cleanup_interval: Some(Duration::from_secs(60)),
            readahead: ReadaheadConfig::default(),
            prefetch_threads: crate::reader::PREFETCH_THREADS,
            prefetch_cpus: None,
            upload_drain: Some(DEFAULT_UPLOAD_DRAIN),
            disk_cache: None,
            block_source: None,
            atime: AtimeMode::NoAtime,
            read_only: false,
            max_dir_entries: u64::MAX,
            commit: CommitConfig::default(),
        }
    }
}

/// How long an unmount waits for writeback uploads by default: long enough
/// for a backlog of a few GiB, short enough that a dead bucket does not hold
/// the unmount for ever (the blocks stay staged and safe).
pub const DEFAULT_UPLOAD_DRAIN: Duration = Duration::from_secs(600);

/// The state of a regular file while some handle holds it open.
#[derive(Debug)]
struct OpenFile {
    writer: Arc<FileWriter>,
    /// The file length as this process knows it, buffered writes included.
    length: AtomicU64,
    /// Open handles.
    handles: AtomicU64,
    /// Whether the file's mode had setuid or setgid when this host last saw
    /// it (at each open, and each setattr here): a write that must drop
    /// those bits asks the metadata engine only then. Another host's chmod
    /// is seen at the next open here (close-to-open).
    setid: AtomicBool,
}

#[derive(Debug)]
enum Handle {
    File {
        ino: Ino,
        file: Arc<OpenFile>,
        readable: bool,
        writable: bool,
        /// The handle's read streams.
        readahead: Mutex<Readahead>,
        /// The file's write errors this handle's fsync has reported (errseq:
        /// flush and fsync report an error while the file's count is past
        /// it; fsync moves it up).
        reported: AtomicU64,
    },
    Dir {
        ino: Ino,
        /// The listing, read a page at a time as the calls reach its end.
        entries: Mutex<Option<Listing>>,
        /// The directory's attributes at open: what fstat of the handle
        /// answers once the directory is removed (with no links).
        attr: Attr,
    },
}

/// The listing of a directory an open handle reads from: the entries read
/// so far (an offset is an index into them), and where the next page of
/// the directory starts. What it holds is counted against
/// [`VfsConfig::max_dir_entries`] for as long as it is held.
#[derive(Debug)]
struct Listing {
    entries: Vec<Entry>,
    /// Where the next page starts; `None` once the directory is read.
    next: Option<DirCursor>,
    /// Whether the entries carry full attributes.
    plus: bool,
    /// The names listed so far, where the engine may repeat one (Redis).
    seen: Option<HashSet<Vec<u8>>>,
    held: Arc<AtomicU64>,
}

impl Drop for Listing {
    fn drop(&mut self) {
        self.held
            .fetch_sub(self.entries.len() as u64, Ordering::Relaxed);
    }
}

/// Live gauges of a [`Vfs`] (shared counters: they outlive a borrow of it).
#[derive(Debug, Clone)]
pub struct VfsGauges {
    open_handles: Arc<AtomicU64>,
    buffered: Arc<AtomicUsize>,
}

impl VfsGauges {
    /// Open file and directory handles (JuiceFS's `fuse_open_handlers`).
    pub fn open_handles(&self) -> u64 {
        self.open_handles.load(Ordering::Relaxed)
    }

    /// Bytes the write buffers hold (JuiceFS's `used_buffer_size_bytes`).
    pub fn buffered_bytes(&self) -> u64 {
        self.buffered.load(Ordering::Relaxed) as u64
    }
}

/// The background thread that runs the metadata engine's cleanup.
#[derive(Debug)]
struct Janitor {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

/// The file system of one mounted volume.
#[derive(Debug)]
pub struct Vfs {
    vol: Arc<Volume>,
    reader: Arc<Reader>,
    compactor: Option<Arc<Compactor>>,
    cfg: VfsConfig,
    handles: Mutex<HashMap<Fh, Arc<Handle>>>,
    next_fh: AtomicU64,
    /// How many `handles` there are, for [`VfsGauges`].
    open_handles: Arc<AtomicU64>,
    /// Directory entries the snapshots of open directory handles hold.
    listed: Arc<AtomicU64>,
    /// Files open here, or closed with a commit the group has not run yet
    /// (their buffered length still counts).
    files: Arc<Mutex<HashMap<Ino, Arc<OpenFile>>>>,
    /// The group commit of every file's writes.
    committer: Arc<Committer>,
    /// Files forgotten once the commit their close handed on ran: a
    /// metadata read taken before one may miss that commit, with nothing
    /// left to adjust it ([`Vfs::adjusted`]).
    forgotten: Arc<AtomicU64>,
    /// Moves each time a commit of a file open here has run, before its
    /// writer lets go of the writes (`FileWriter::landed_at`).
    landed: Arc<AtomicU64>,
    /// Bytes held by all write buffers.
    buffered: Arc<AtomicUsize>,
    /// Stores the blocks write buffers fill, while their files are written.
    uploader: Arc<BlockUploader>,
    janitor: Mutex<Option<Janitor>>,
    disk_cache: Option<Arc<DiskCache>>,
}

/// Whether `name` is one of the extended attributes through which Linux
/// sets and reads POSIX ACLs. On a volume with ACLs (`format
/// --enable-acl`) they are the node's ACLs, kept as JuiceFS keeps them and
/// checked by the metadata engine ([`crate::meta::acl`]). On one without,
/// they are refused with EOPNOTSUPP, as JuiceFS refuses them: storing them
/// as plain attributes would let `setfacl` succeed while granting and
/// denying nothing. The FUSE kernel passes these names through to the file
/// system, so this is the one place that decides, for host mounts and
/// virtio-fs guests alike.
fn is_posix_acl(name: &[u8]) -> bool {
    AclType::of_xattr(name).is_some()
}

fn acls_not_supported() -> Error {
    Error::NotSupported("POSIX ACLs are not supported".into())
}

/// Whether a mode carries setuid or setgid.
fn has_setid(a: &Attr) -> bool {
    a.mode & 0o6000 != 0
}

fn enxio() -> Error {
    Error::Io(io::Error::from_raw_os_error(libc::ENXIO))
}

impl Vfs {
    /// Serves `vol`: registers a session, installs the slice releaser and
    /// starts the background compactor and cleanup.
    pub fn new(vol: Arc<Volume>, cfg: VfsConfig) -> Result<Vfs> {
        let (vol, disk_cache) = with_disk_cache(vol, cfg.disk_cache.clone())?;
        let cache = Arc::new(BlockCache::with_block_size(
            cfg.cache_bytes,
            vol.block_size as usize,
        ));
        if cfg.cache_prefault {
            cache.prefault();
        }
        vol.meta.set_slice_releaser(slice_releaser(
            vol.store.clone(),
            vol.name().to_string(),
            vol.block_size,
            cache.clone(),
        ));
        vol.meta.delete_in_background()?;
        let reader = Reader::new(
            vol.clone(),
            cache,
            cfg.prefetch_threads,
            cfg.prefetch_cpus.clone(),
        );
        if let Some(source) = &cfg.block_source {
            reader.set_block_source(source.clone());
        }
        let compactor = if cfg.compaction {
            Some(Arc::new(Compactor::start(
                vol.clone(),
                reader.clone(),
                cfg.upload_threads,
            )?))
        } else {
            None
        };
        let committer = Arc::new(Committer::start(
            vol.clone(),
            Some(reader.chunk_cache().clone()),
            cfg.commit,
        )?);
        vol.meta.new_session(
            &serde_json::json!({
                "Version": concat!("sluice ", env!("CARGO_PKG_VERSION")),
                "HostName": crate::meta::session_info::host_name(),
                "ProcessID": std::process::id(),
            })
            .to_string(),
        )?;
        let janitor = match cfg.cleanup_interval {
            Some(every) => {
                let (stop, rx) = mpsc::channel::<()>();
                let meta = vol.meta.clone();
                let thread = std::thread::Builder::new()
                    .name("sluice-cleanup".into())
                    .spawn(move || {
                        // Once at start too: what a crash left (slices
                        // released but not deleted, sessions gone stale)
                        // is taken up at once, not a minute later.
                        loop {
                            if let Err(e) = meta.cleanup() {
                                log::warn!("metadata cleanup failed: {e}");
                            }
                            if !matches!(
                                rx.recv_timeout(every),
                                Err(mpsc::RecvTimeoutError::Timeout)
                            ) {
                                break;
                            }
                        }
                    })?;
                Some(Janitor { stop, thread })
            }
            None => None,
        };
        let uploader = Arc::new(BlockUploader::start(
            vol.clone(),
            cfg.upload_threads,
            Some(reader.cache().clone()),
        )?);
        Ok(Vfs {
            vol,
            reader,
            compactor,
            cfg,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            listed: Arc::new(AtomicU64::new(0)),
            files: Arc::new(Mutex::new(HashMap::new())),
            committer,
            forgotten: Arc::new(AtomicU64::new(0)),
            landed: Arc::new(AtomicU64::new(0)),
            buffered: Arc::new(AtomicUsize::new(0)),
            open_handles: Arc::new(AtomicU64::new(0)),
            uploader,
            janitor: Mutex::new(janitor),
            disk_cache,
        })
    }

    /// The memory block cache's counters, for a metrics endpoint.
    pub fn memory_cache_stats(&self) -> crate::block_cache::BlockCacheStats {
        self.reader.cache().stats()
    }

    /// What the metadata engine's range operations visited (chunks, probes,
    /// scans, transactions), for a metrics endpoint and the bounded-work
    /// tests.
    pub fn meta_work(&self) -> crate::meta::WorkStats {
        self.vol.meta.work()
    }

    /// The disk cache's counters (None without a disk cache), for a metrics
    /// endpoint.
    pub fn disk_cache_stats(&self) -> Option<DiskCacheCounters> {
        self.disk_cache.as_ref().map(|c| c.stats().snapshot())
    }

    /// The disk cache's live counters (None without a disk cache), for a
    /// metrics endpoint that outlives this session's borrow.
    pub fn disk_cache_counters(&self) -> Option<Arc<crate::object::disk_cache::DiskCacheStats>> {
        self.disk_cache.as_ref().map(|c| c.stats().clone())
    }

    /// Gauges of this file system that a metrics endpoint reads while it
    /// serves.
    pub fn gauges(&self) -> VfsGauges {
        VfsGauges {
            open_handles: self.open_handles.clone(),
            buffered: self.buffered.clone(),
        }
    }

    /// The volume served.
    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    /// The reader (for callers that want fragments, such as virtio-fs).
    pub fn reader(&self) -> &Arc<Reader> {
        &self.reader
    }

    fn handle(&self, fh: Fh) -> Result<Arc<Handle>> {
        self.handles
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(Error::BadHandle)
    }

    /// Removes handle `fh` if it is a handle of `ino` of the right kind (a
    /// file's when `dir` is false), in one step: a handle is released once,
    /// and a request naming a handle of another kind or another inode
    /// releases nothing (EBADF).
    fn take_handle(&self, ino: Ino, fh: Fh, dir: bool) -> Result<Arc<Handle>> {
        let mut handles = self.handles.lock();
        let fits = match handles.get(&fh).map(|h| &**h) {
            Some(Handle::File { ino: i, .. }) => !dir && *i == ino,
            Some(Handle::Dir { ino: i, .. }) => dir && *i == ino,
            None => false,
        };
        if !fits {
            return Err(Error::BadHandle);
        }
        let h = handles.remove(&fh).ok_or(Error::BadHandle)?;
        self.open_handles.fetch_sub(1, Ordering::Relaxed);
        Ok(h)
    }

    fn file_handle(&self, ino: Ino, fh: Fh) -> Result<(Arc<OpenFile>, bool)> {
        match &*self.handle(fh)? {
            Handle::File {
                ino: i,
                file,
                writable,
                ..
            } if *i == ino => Ok((file.clone(), *writable)),
            _ => Err(Error::BadHandle),
        }
    }

    /// Commits the file's buffered writes for handle `fh` and reports a
    /// write error: the commit's own, or one that happened (in a background
    /// commit, or a commit another caller triggered) since the handle's
    /// fsync last reported one. Only fsync (`advance`) marks an error as
    /// reported, as Linux advances a file's errseq only at fsync: a FLUSH
    /// comes at every close of every descriptor of the open file — a
    /// forked child's close at exec among them — and one of those must not
    /// hide the error from the owner's fsync. A close (`!advance`) does not
    /// wait for its commit where the group commit would make it wait for a
    /// sync ([`Vfs::close_file`]); its error is reported by a later call.
    fn flush_reporting(&self, ino: Ino, fh: Fh, advance: bool) -> Result<()> {
        let h = self.handle(fh)?;
        let Handle::File {
            ino: i,
            file,
            reported,
            ..
        } = &*h
        else {
            return Err(Error::BadHandle);
        };
        if *i != ino {
            return Err(Error::BadHandle);
        }
        // A commit waits: a thread that must not wait hands the call on
        // (nothing changed yet).
        if !file.writer.nothing_to_flush() {
            sluice_api::wait::may_wait()?;
        }
        let res = if advance {
            self.flush_file(ino, file)
        } else {
            self.close_file(ino, file)
        };
        let errors = file.writer.errors();
        let unseen = if advance {
            reported.fetch_max(errors, Ordering::AcqRel) < errors
        } else {
            reported.load(Ordering::Acquire) < errors
        };
        if res.is_err() || unseen {
            self.resync_length(ino, file);
        }
        match res {
            Ok(()) if unseen => Err(file
                .writer
                .refused()
                .map_or(Error::WriteBack(ino), |l| l.error())),
            r => r,
        }
    }

    /// After a failed commit: writes it dropped (refused for a limit, or
    /// objects the disk could not make durable) no longer count in the
    /// length this process gives the file; what is recorded, and what is
    /// still buffered or being committed, does.
    fn resync_length(&self, ino: Ino, file: &OpenFile) {
        if file.writer.has_pending() {
            return;
        }
        if let Ok(a) = self.vol.meta.getattr(ino) {
            file.length
                .store(a.length.max(file.writer.end()), Ordering::Release);
        }
    }

    fn add_handle(&self, h: Handle) -> Fh {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Arc::new(h));
        self.open_handles.fetch_add(1, Ordering::Relaxed);
        fh
    }

    /// Registers one more open handle of `ino` and returns its state.
    fn open_file(&self, ino: Ino, attr: &Attr) -> Arc<OpenFile> {
        let length = attr.length;
        let mut files = self.files.lock();
        let f = files.entry(ino).or_insert_with(|| {
            Arc::new(OpenFile {
                writer: Arc::new(FileWriter::with_uploader(
                    self.buffered.clone(),
                    self.uploader.clone(),
                    self.reader.chunk_cache().clone(),
                    self.committer.clone(),
                    self.landed.clone(),
                )),
                length: AtomicU64::new(length),
                handles: AtomicU64::new(0),
                setid: AtomicBool::new(false),
            })
        });
        f.setid.store(has_setid(attr), Ordering::Release);
        if f.handles.load(Ordering::Relaxed) == 0 {
            f.length
                .store(length.max(f.writer.end()), Ordering::Relaxed);
        }
        f.handles.fetch_add(1, Ordering::Relaxed);
        f.clone()
    }

    fn open_out(&self, ino: Ino, flags: u32, attr: Attr) -> OpenOut {
        let acc = flags & libc::O_ACCMODE as u32;
        let readable = acc == libc::O_RDONLY as u32 || acc == libc::O_RDWR as u32;
        let writable = acc == libc::O_WRONLY as u32 || acc == libc::O_RDWR as u32;
        let file = self.open_file(ino, &attr);
        // Errors from before the open are not this handle's to report.
        let reported = AtomicU64::new(file.writer.errors());
        let fh = self.add_handle(Handle::File {
            ino,
            file,
            readable,
            writable,
            readahead: Mutex::new(Readahead::default()),
            reported,
        });
        OpenOut {
            fh,
            attr,
            keep_cache: false,
            direct_io: false,
        }
    }

    /// Commits the buffered writes of an open file and schedules compaction
    /// of chunks that grew fragmented.
    fn flush_file(&self, ino: Ino, file: &OpenFile) -> Result<()> {
        self.after_commit(ino, file.writer.flush(&self.vol, ino))
    }

    /// Commits the buffered writes of a file being closed. Where objects
    /// become durable only by a sync (a `file://` bucket), the close does
    /// not wait for the group commit that syncs them: as on a local file
    /// system, `close(2)` promises nothing about durability, and a reader
    /// here, an fsync or the next commit of the file waits for it. Where
    /// objects are durable once stored (S3, writeback staging) there is no
    /// sync to wait for and the close waits for its record, so another host
    /// that opens the file next sees the data (close-to-open).
    fn close_file(&self, ino: Ino, file: &Arc<OpenFile>) -> Result<()> {
        if !self.vol.store.needs_sync() {
            return self.flush_file(ino, file);
        }
        let files = self.files.clone();
        let forgotten = self.forgotten.clone();
        let compactor = self.compactor.clone();
        let open = file.clone();
        let done = Box::new(move |committed: &[Committed]| {
            schedule_compaction(compactor.as_deref(), ino, committed);
            forget_if_unused(&files, &forgotten, ino, &open);
        });
        let earlier = file.writer.commit_behind(&self.vol, ino, done);
        self.after_commit(ino, earlier)
    }

    /// Schedules compaction of the chunks a commit left fragmented (the
    /// writer already dropped their resolved slice lists).
    fn after_commit(&self, ino: Ino, res: Result<Vec<Committed>>) -> Result<()> {
        schedule_compaction(self.compactor.as_deref(), ino, &res?);
        Ok(())
    }

    /// Before a rename moves `name`: if it is a file whose close handed its
    /// commit on and the group has not run it yet, waits for that commit.
    /// Otherwise the rename's record could become durable before the data's
    /// (the rename needs no sync, the data does), and the common pattern
    /// "write a new file, close it, rename it over the old one" would leave
    /// an empty file under the old name after a power loss — what ext4's
    /// `auto_da_alloc` prevents for the same pattern. Costs a lookup only
    /// where closes hand commits on (a `file://` bucket) and while a file
    /// is open or committing here.
    fn commit_before_rename(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        if !self.vol.store.needs_sync() || self.files.lock().is_empty() {
            return Ok(());
        }
        let Ok((ino, _)) = self.vol.meta.lookup(ctx, parent, name) else {
            // The rename reports what is wrong with the name.
            return Ok(());
        };
        let Some(file) = self.open_state(ino) else {
            return Ok(());
        };
        if !file.writer.has_pending() {
            return Ok(());
        }
        sluice_api::wait::may_wait()?;
        self.flush_file(ino, &file)
    }

    /// The group commit's counters (tests assert on them: a burst of closes
    /// shares groups).
    pub fn commit_stats(&self) -> CommitStats {
        self.committer.stats()
    }

    fn open_state(&self, ino: Ino) -> Option<Arc<OpenFile>> {
        self.files.lock().get(&ino).cloned()
    }

    /// Flushes `ino`'s buffered writes, and waits for a commit a close
    /// handed on, if it is open (or committing) here. A commit waits: a
    /// thread that must not wait hands the call on first (the callers flush
    /// before they change anything).
    fn flush_ino(&self, ino: Ino) -> Result<()> {
        match self.open_state(ino) {
            Some(f) => {
                if !f.writer.nothing_to_flush() {
                    sluice_api::wait::may_wait()?;
                }
                self.flush_file(ino, &f)
            }
            None => Ok(()),
        }
    }

    /// Adjusts attributes for writes still in the buffer.
    fn with_buffered(&self, ino: Ino, attr: Attr) -> Attr {
        match self.open_state(ino) {
            Some(f) if attr.typ == FileType::File => Self::with_state(&f, attr),
            _ => attr,
        }
    }

    /// [`Vfs::with_buffered`] with the open state already looked up.
    fn with_state(f: &OpenFile, mut attr: Attr) -> Attr {
        let (stored, recorded) = (attr.stored(), attr.mtime);
        // `writer.end()` drops to 0 while a flush uploads the taken
        // buffer, before meta has the new length; `length` covers that
        // window (a stale length here made O_APPEND writers overwrite
        // each other through the kernel's i_size).
        attr.length = attr
            .length
            .max(f.writer.end())
            .max(f.length.load(Ordering::Acquire));
        // Writes not recorded yet store their bytes already (at most: as
        // the commit will count them), so a sparse file shows its holes
        // before its commit lands.
        let unrecorded = f.writer.unrecorded_bytes(recorded);
        if unrecorded > 0 {
            let s = stored.saturating_add(unrecorded);
            attr.space = (s < attr.length).then_some(s);
        } else if attr.space.is_some() {
            attr.space = Some(stored);
        }
        // Writes not recorded yet moved mtime and ctime already, as
        // their commit will record them.
        if let Some(t) = f.writer.unrecorded_mtime() {
            attr.mtime = attr.mtime.max(t);
            attr.ctime = attr.ctime.max(t);
        }
        attr
    }

    /// [`Vfs::with_buffered`] for attributes read from the metadata engine
    /// after `epoch` was taken ([`Vfs::forgotten`]). A closed file whose
    /// commit ran after they were read, and which was forgotten before the
    /// buffered state could be looked at, has attributes from before its
    /// commit and nothing here to adjust them: they are read again (the
    /// commit is recorded by then).
    ///
    /// The open state is looked up once: looked up twice (once to decide,
    /// once to adjust), a commit finishing in between could forget it after
    /// the first look, and the attributes read before that commit went out
    /// unadjusted — a file's length from before its last write, right after
    /// the close (`e2e_model`, seed 1796588928589598516; the kernel then
    /// shrinks its i_size to it).
    ///
    /// A commit of an open file that ran between the read and the
    /// adjustment is the same hazard: its writer no longer shows the
    /// writes (their mtime) that the attributes, read before, lack (the
    /// `requests` fuzz target, on a read-only export whose host had just
    /// closed a file: the length, which the open state keeps, but the
    /// mtime from before the writes). A writer marks when its last commit
    /// ran before it lets go of the writes ([`FileWriter::landed_at`]),
    /// looked at after its state: a commit that ran after `epoch` was
    /// taken has the attributes read again.
    fn adjusted(&self, ino: Ino, attr: Attr, epoch: Epoch) -> Result<Attr> {
        if attr.typ != FileType::File {
            return self.without_trash_links(ino, attr);
        }
        let (mut attr, mut epoch) = (attr, epoch);
        for _ in 0..ADJUST_TRIES {
            match self.open_state(ino) {
                Some(f) => {
                    let shown = Self::with_state(&f, attr.clone());
                    if f.writer.landed_at() <= epoch.landed {
                        return self.without_trash_links(ino, shown);
                    }
                }
                None if self.forgotten.load(Ordering::Acquire) == epoch.forgotten => {
                    return self.without_trash_links(ino, attr);
                }
                None => {}
            }
            // A commit ran after the read: read again (it is recorded).
            epoch = self.epoch();
            attr = meta_op(MetaOp::GetAttr, || self.vol.meta.getattr(ino))?;
        }
        // Commits kept running meanwhile: the last read is recent.
        let attr = self.with_buffered(ino, attr);
        self.without_trash_links(ino, attr)
    }

    /// What [`Vfs::adjusted`] compares with: taken before attributes are
    /// read from the metadata engine.
    fn epoch(&self) -> Epoch {
        Epoch {
            forgotten: self.forgotten.load(Ordering::Acquire),
            landed: self.landed.load(Ordering::Acquire),
        }
    }

    /// A hard-linked file's link count as POSIX counts it: without the
    /// names the trash keeps (an unlinked name of a file with several goes
    /// to the trash, the stored count unchanged, as in JuiceFS; `ln` then
    /// `rm` must show one link again). Only files with several parents
    /// (`parent` 0) can have such names: one more metadata read for them,
    /// none for any other node.
    fn without_trash_links(&self, ino: Ino, mut attr: Attr) -> Result<Attr> {
        if attr.typ == FileType::File && attr.parent == 0 && attr.nlink > 1 {
            let in_trash = self.vol.meta.trash_links(ino)?;
            attr.nlink = attr.nlink.saturating_sub(in_trash);
        }
        Ok(attr)
    }

    fn entry(&self, ino: Ino, name: &[u8], attr: Attr) -> Entry {
        Entry {
            inode: ino,
            name: name.to_vec(),
            attr: self.with_buffered(ino, attr),
        }
    }

    /// Moves the access time of `ino` after a read or listing, as the
    /// atime mode says. Best effort: the read succeeded, and a failed
    /// update is only logged.
    fn touch_atime(&self, ino: Ino) {
        if self.cfg.atime == AtimeMode::NoAtime || self.cfg.read_only {
            return;
        }
        // The update is part of the read, and it ignores failures: it must
        // not fail for want of waiting (a remote metadata engine fails
        // calls on a thread that must not wait), so it waits, even on a
        // transport's worker. The default (`noatime`) never gets here.
        let _waits = sluice_api::wait::allow_wait();
        let now = crate::meta::Timestamp::now();
        let due = match self.cfg.atime {
            AtimeMode::StrictAtime => true,
            mode => self.vol.meta.getattr(ino).is_ok_and(|a| mode.due(&a, now)),
        };
        if due && let Err(e) = self.vol.meta.set_atime(ino, now) {
            log::debug!("inode {ino}: access time not updated: {e}");
        }
    }

    /// The attributes of a directory that is gone from the volume but open
    /// through a handle here.
    fn removed_open_dir(&self, ino: Ino) -> Option<Attr> {
        self.handles.lock().values().find_map(|h| match &**h {
            Handle::Dir { ino: i, attr, .. } if *i == ino => Some(Attr {
                nlink: 0,
                ..attr.clone()
            }),
            _ => None,
        })
    }

    /// Drops the setuid/setgid bits a write by `ctx` to `ino` through `fh`
    /// drops (Linux's `file_remove_privs`; the kernel asks with
    /// FUSE_WRITE_KILL_SUIDGID, having granted the file system
    /// HANDLE_KILLPRIV_V2): `write` with `kill_suidgid` calls it first.
    pub fn kill_suidgid(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        let (file, writable) = self.file_handle(ino, fh)?;
        if !writable {
            return Err(Error::BadHandle);
        }
        self.drop_setid(ctx, ino, &file)
    }

    /// Clears the setuid/setgid bits a change of the open file's data by
    /// `ctx` drops ([`SetAttr::kill_suidgid`]), when this host saw any.
    fn drop_setid(&self, ctx: &Context, ino: Ino, file: &OpenFile) -> Result<()> {
        if !file.setid.load(Ordering::Acquire) || ctx.privileged || ctx.uid == 0 {
            return Ok(());
        }
        let kill = SetAttr {
            kill_suidgid: true,
            ..SetAttr::default()
        };
        let a = meta_op(MetaOp::SetAttr, || self.vol.meta.setattr(ctx, ino, &kill))?;
        file.setid.store(has_setid(&a), Ordering::Release);
        Ok(())
    }

    /// Reads the next page of `listing` (of directory `ino`) into it.
    fn read_page(&self, ctx: &Context, ino: Ino, listing: &mut Listing) -> Result<()> {
        let Some(cursor) = listing.next.take() else {
            return Ok(());
        };
        let epoch = self.epoch();
        let page = match meta_op(MetaOp::Readdir, || {
            self.vol
                .meta
                .readdir_page(ctx, ino, listing.plus, &cursor, READDIR_PAGE)
        }) {
            Ok(page) => page,
            Err(e) => {
                // The same page is read again by the next call.
                listing.next = Some(cursor);
                return Err(e);
            }
        };
        let mut list = page.entries;
        if page.may_repeat {
            let seen = listing.seen.get_or_insert_with(|| {
                listing
                    .entries
                    .iter()
                    .map(|e| e.name.clone())
                    .collect::<HashSet<_>>()
            });
            list.retain(|e| seen.insert(e.name.clone()));
        }
        let n = list.len() as u64;
        let max = self.cfg.max_dir_entries;
        let held = self.listed.fetch_add(n, Ordering::Relaxed);
        if held.saturating_add(n) > max {
            self.listed.fetch_sub(n, Ordering::Relaxed);
            if let Some(seen) = &mut listing.seen {
                for e in &list {
                    seen.remove(&e.name);
                }
            }
            listing.next = Some(cursor);
            return Err(Error::Limit(Limit::DirEntries(max)));
        }
        if listing.plus {
            for ent in &mut list {
                ent.attr = self.adjusted(ent.inode, ent.attr.clone(), epoch)?;
            }
        }
        listing.entries.extend(list);
        listing.next = page.next;
        Ok(())
    }

    /// The open file behind a handle copy_file_range uses: a file handle of
    /// `ino` that may write (`write`) or read. A directory's handle is
    /// `IsDir`, as copy_file_range(2) answers for directories.
    fn copy_handle(&self, ino: Ino, fh: Fh, write: bool) -> Result<Arc<OpenFile>> {
        match &*self.handle(fh)? {
            Handle::File {
                ino: i,
                file,
                readable,
                writable,
                ..
            } if *i == ino && (if write { *writable } else { *readable }) => Ok(file.clone()),
            Handle::Dir { ino: i, .. } if *i == ino => Err(Error::IsDir),
            _ => Err(Error::BadHandle),
        }
    }

    /// The first hole at or after `at` (the file end counts as one). It
    /// visits chunks only while they are full of data: the first chunk
    /// that does not exist (no pieces) is a hole.
    fn next_hole(&self, ino: Ino, mut at: u64, length: u64) -> Result<u64> {
        while at < length {
            let indx = u32::try_from(at / CHUNK_SIZE).map_err(|_| Error::FileTooBig)?;
            let base = u64::from(indx) * CHUNK_SIZE;
            let pieces = self.reader.pieces(ino, indx)?;
            let mut coff = at - base;
            for (start, end) in data_extents(&pieces) {
                if end <= coff {
                    continue;
                }
                if start > coff {
                    return Ok((base + coff).min(length));
                }
                coff = end;
            }
            if coff < CHUNK_SIZE {
                return Ok((base + coff).min(length));
            }
            at = base + CHUNK_SIZE;
        }
        Ok(length)
    }
}

/// The file-system operations: what the FUSE dispatcher calls (through an
/// `Export` or directly) and what the engine's tools and tests call, one
/// definition of each. Callers outside this module bring the trait into
/// scope (`use sluice_engine::vfs::Filesystem as _;`).
impl Filesystem for Vfs {
    /// Pushes the bytes `offset..offset+len` of an open file (bounded by
    /// its length) into `dst` as fragments; returns how many bytes were
    /// pushed. The one read path, whatever the destination.
    fn read(
        &self,
        _ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        len: usize,
        dst: &mut dyn ReadDest,
    ) -> Result<usize> {
        let h = self.handle(fh)?;
        let Handle::File {
            ino: hino,
            file,
            readahead,
            ..
        } = &*h
        else {
            return Err(Error::BadHandle);
        };
        if *hino != ino {
            return Err(Error::BadHandle);
        }
        // The read as the file's readahead sees it (once per read: see
        // below), given the file's length.
        let count = |length: u64| {
            let n = (len as u64).min(length.saturating_sub(offset));
            readahead.lock().on_read(
                &self.cfg.readahead,
                offset,
                n,
                length,
                self.reader.readahead_room(),
            )
        };
        // Reads see every write made before them: commit what is buffered.
        // A commit waits (metadata, maybe uploads): a thread that must not
        // wait hands the read on first (`sluice_api::wait`), having counted
        // it for readahead (the length includes the buffered writes), since
        // the second run does not.
        if !file.writer.nothing_to_flush() && sluice_api::wait::may_wait().is_err() {
            let length = file.length.load(Ordering::Acquire);
            if offset < length
                && let Some((at, bytes)) = count(length).fetch
            {
                self.reader.prefetch(ino, at, bytes);
            }
            return Err(Error::WouldBlock);
        }
        self.flush_file(ino, file)?;
        let length = file.length.load(Ordering::Acquire);
        if offset >= length {
            return Ok(0);
        }
        let n = (len as u64).min(length - offset);
        // The second run of a read that would have waited already moved the
        // readahead window and queued its prefetch: counting the read again
        // would take it for a new stream.
        let plan = if sluice_api::wait::is_retry() {
            crate::readahead::Plan {
                sequential: readahead.lock().is_sequential_at(offset, n),
                fetch: None,
            }
        } else {
            count(length)
        };
        if let Some((at, bytes)) = plan.fetch {
            self.reader.prefetch(ino, at, bytes);
        }
        // Fragments arrive in order; count what was delivered so a retry
        // resumes right after it.
        let done = std::cell::Cell::new(0u64);
        let mut counted = |frag: Fragment<'_>| {
            let len = frag.len() as u64;
            dst.put(frag)?;
            done.set(done.get() + len);
            Ok(())
        };
        // A random reader fetches only the bytes it asks for, and the whole
        // block in the background when the memory cache has room to spare
        // (filling it costs nothing else) or its readahead credit allows;
        // never with a ratio of 0.
        let bs = u64::from(self.vol.block_size);
        let prefetch_whole = self.cfg.readahead.ratio > 0.0;
        let mut whole =
            || prefetch_whole && (self.reader.cache_has_room() || readahead.lock().take_block(bs));
        let random = !plan.sequential;
        match self.reader.visit_with(
            ino,
            offset,
            n,
            random.then_some(&mut whole as &mut dyn FnMut() -> bool),
            &mut counted,
        ) {
            Err(e) if crate::object::is_not_found(&e) => {
                // A compaction may have replaced the slices we resolved and
                // deleted their objects: resolve again and resume once.
                self.reader.invalidate_inode(ino);
                let resume = offset + done.get();
                match self.reader.visit_with(
                    ino,
                    resume,
                    n - done.get(),
                    random.then_some(&mut whole as &mut dyn FnMut() -> bool),
                    &mut counted,
                ) {
                    Err(e) if crate::object::is_not_found(&e) => {
                        log::error!("inode {ino}: {e}");
                        Err(Error::Corrupt(format!(
                            "a block of inode {ino} is missing from the object store: {e}"
                        )))
                    }
                    r => r.map(|()| n as usize),
                }
            }
            r => r.map(|()| n as usize),
        }
        .inspect(|_| self.touch_atime(ino))
    }

    /// At FUSE_INIT; nothing to do (the session is registered by `new`).
    fn init(&self) -> Result<()> {
        Ok(())
    }

    /// Whether the metadata engine is another machine (Redis).
    fn metadata_is_remote(&self) -> bool {
        self.vol.meta.remote()
    }

    /// Whether the volume keeps POSIX ACLs (`format --enable-acl`).
    fn posix_acl(&self) -> bool {
        self.vol.format.enable_acl
    }

    /// Flushes every open file, stops background work, waits (bounded) for
    /// writeback uploads and closes the session.
    fn destroy(&self) {
        let files: Vec<_> = self
            .files
            .lock()
            .iter()
            .map(|(i, f)| (*i, f.clone()))
            .collect();
        for (ino, f) in files {
            if let Err(e) = self.flush_file(ino, &f) {
                log::error!("inode {ino}: buffered writes lost at unmount: {e}");
            }
        }
        if let Some(c) = &self.compactor {
            c.stop();
        }
        // Every commit a close handed on has run (the flushes above waited
        // for those of files still here).
        self.committer.wait_idle();
        self.reader.stop_prefetch();
        if let Some(j) = self.janitor.lock().take() {
            drop(j.stop);
            let _ = j.thread.join();
        }
        // After the flushes and the compactor: nothing stages blocks now.
        // As JuiceFS does, a clean unmount leaves nothing staged when the
        // bucket is reachable.
        if let Some(limit) = self.cfg.upload_drain {
            self.vol.store.drain_uploads(limit);
        }
        if let Err(e) = self.vol.meta.close_session() {
            log::warn!("closing the metadata session failed: {e}");
        }
        // Deletions queued by unlinks (and by the session's end) are done
        // before the process goes; the metadata records them anyway.
        self.vol.meta.drain_deletes();
        // Unmount waits for durability, as fsync does: every commit so far.
        if let Err(e) = self.vol.meta.sync() {
            log::error!("making the metadata durable at unmount failed: {e}");
        }
        if let Some(c) = &self.disk_cache {
            // Blocks queued for the cache are written before the log line,
            // so the next mount finds what this one counted.
            c.shutdown();
            log::info!("disk cache: {}", c.stats().snapshot());
        }
        log::info!("memory cache: {}", self.reader.cache().stats());
    }

    /// Looks up `name` in `parent`.
    ///
    /// `.` and `..` are how the kernel decodes a file handle whose inode
    /// left its cache (`open_by_handle_at`, an NFS server re-exporting the
    /// mount): `.` answers the node `parent` itself, whatever its type, and
    /// `..` the parent of the directory `parent`. A path walk never sends
    /// them, so no search permission is checked: the kernel checked that
    /// the caller may decode handles. A node that no longer exists answers
    /// [`Error::Stale`], as a handle of a deleted file must.
    fn lookup(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<Entry> {
        match name {
            b"." => {
                let attr = self.getattr(ctx, parent).map_err(stale)?;
                Ok(Entry {
                    inode: parent,
                    name: name.to_vec(),
                    attr,
                })
            }
            b".." => {
                let attr = self.getattr(ctx, parent).map_err(stale)?;
                if attr.typ != FileType::Directory {
                    // A hard-linked file has no single parent; the kernel
                    // asks only for directories' parents.
                    return Err(Error::NotDir);
                }
                let up = if parent == ROOT_INO {
                    ROOT_INO
                } else {
                    attr.parent
                };
                let attr = self.getattr(ctx, up).map_err(stale)?;
                Ok(Entry {
                    inode: up,
                    name: name.to_vec(),
                    attr,
                })
            }
            _ => {
                let epoch = self.epoch();
                let (ino, attr) =
                    meta_op(MetaOp::Lookup, || self.vol.meta.lookup(ctx, parent, name))?;
                Ok(Entry {
                    inode: ino,
                    name: name.to_vec(),
                    attr: self.adjusted(ino, attr, epoch)?,
                })
            }
        }
    }

    /// The kernel dropped `nlookup` references; nothing is kept per lookup.
    fn forget(&self, _ino: Ino, _nlookup: u64) {}

    /// The attributes of `ino` (length includes buffered writes). A
    /// directory removed while a handle here holds it open still answers,
    /// with no links (as a removed open file does: the engine keeps those).
    fn getattr(&self, _ctx: &Context, ino: Ino) -> Result<Attr> {
        let epoch = self.epoch();
        match meta_op(MetaOp::GetAttr, || self.vol.meta.getattr(ino)) {
            Ok(attr) => self.adjusted(ino, attr, epoch),
            Err(Error::NotFound) => self.removed_open_dir(ino).ok_or(Error::NotFound),
            Err(e) => Err(e),
        }
    }

    /// Changes attributes; `size` truncates (or extends) a regular file.
    /// With `fh` (ftruncate, or an `O_TRUNC` open) a handle open for writing
    /// proves the right to truncate, whatever the mode says now.
    /// `set.kill_suidgid` (FATTR_KILL_SUIDGID: the caller lacks CAP_FSETID)
    /// counts only with a size change: the truncate drops setuid/setgid as
    /// a write does.
    fn setattr(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Option<Fh>,
        set: &SetAttr,
        size: Option<u64>,
    ) -> Result<Attr> {
        let epoch = self.epoch();
        let mut attr = None;
        if let Some(size) = size {
            // A read-only handle (`O_RDONLY|O_TRUNC`) proves nothing: the
            // mode decides, as for truncate(2).
            let via = match fh {
                Some(fh) if self.file_handle(ino, fh)?.1 => TruncateVia::Handle,
                _ => TruncateVia::Path,
            };
            // Writes made before the truncate must land before it.
            self.flush_ino(ino)?;
            let a = meta_op(MetaOp::Truncate, || {
                self.vol.meta.truncate(ctx, ino, size, via)
            })?;
            self.reader.invalidate_inode(ino);
            if let Some(f) = self.open_state(ino) {
                f.length.store(a.length, Ordering::Release);
            }
            attr = Some(a);
        }
        let set = SetAttr {
            kill_suidgid: set.kill_suidgid && size.is_some(),
            ..set.clone()
        };
        if set.mtime.is_some() && size.is_none() {
            // Writes made before a utimes land before it: their commit
            // would otherwise record its own mtime over the one set here
            // (`cp -p`, `tar` and `rsync -t` set times right after they
            // write, often before or just after the close).
            self.flush_ino(ino)?;
        }
        if set != SetAttr::default() {
            let a = meta_op(MetaOp::SetAttr, || self.vol.meta.setattr(ctx, ino, &set))?;
            if let Some(f) = self.open_state(ino) {
                f.setid.store(has_setid(&a), Ordering::Release);
            }
            attr = Some(a);
        }
        match attr {
            Some(a) => self.adjusted(ino, a, epoch),
            None => self.getattr(ctx, ino),
        }
    }

    /// The target of a symlink.
    fn readlink(&self, _ctx: &Context, ino: Ino) -> Result<Vec<u8>> {
        meta_op(MetaOp::ReadLink, || self.vol.meta.readlink(ino))
    }

    /// Creates a node; `mode` carries the `S_IF*` type bits.
    fn mknod(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Entry> {
        let typ = FileType::from_mode(mode)
            .ok_or_else(|| Error::Invalid(format!("mknod with unknown file type {mode:o}")))?;
        let perm = (mode & 0o7777) as u16;
        let umask = (umask & 0o7777) as u16;
        if typ == FileType::Symlink {
            return Err(Error::Invalid("mknod cannot make a symlink".into()));
        }
        let (ino, attr) = meta_op(MetaOp::Mknod, || match typ {
            FileType::Directory => self.vol.meta.mkdir(ctx, parent, name, perm, umask),
            _ => self
                .vol
                .meta
                .mknod(ctx, parent, name, typ, perm, umask, rdev),
        })?;
        Ok(self.entry(ino, name, attr))
    }

    /// Creates a directory.
    fn mkdir(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Entry> {
        let (ino, attr) = meta_op(MetaOp::Mknod, || {
            self.vol.meta.mkdir(
                ctx,
                parent,
                name,
                (mode & 0o7777) as u16,
                (umask & 0o7777) as u16,
            )
        })?;
        Ok(self.entry(ino, name, attr))
    }

    /// Removes a non-directory entry.
    fn unlink(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        meta_op(MetaOp::Unlink, || self.vol.meta.unlink(ctx, parent, name))
    }

    /// Removes an empty directory.
    fn rmdir(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        meta_op(MetaOp::Rmdir, || self.vol.meta.rmdir(ctx, parent, name))
    }

    /// Creates a symbolic link.
    fn symlink(&self, ctx: &Context, parent: Ino, name: &[u8], target: &[u8]) -> Result<Entry> {
        let (ino, attr) = meta_op(MetaOp::Mknod, || {
            self.vol.meta.symlink(ctx, parent, name, target)
        })?;
        Ok(self.entry(ino, name, attr))
    }

    /// Renames (or exchanges) an entry.
    fn rename(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.commit_before_rename(ctx, parent, name)?;
        if flags.exchange {
            self.commit_before_rename(ctx, new_parent, new_name)?;
        }
        meta_op(MetaOp::Rename, || {
            self.vol
                .meta
                .rename(ctx, parent, name, new_parent, new_name, flags)
        })
        .map(|_| ())
    }

    /// Adds a hard link.
    fn link(&self, ctx: &Context, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Entry> {
        let epoch = self.epoch();
        let attr = meta_op(MetaOp::Link, || {
            self.vol.meta.link(ctx, ino, new_parent, new_name)
        })?;
        Ok(Entry {
            inode: ino,
            name: new_name.to_vec(),
            attr: self.adjusted(ino, attr, epoch)?,
        })
    }

    /// Opens a file. Close-to-open consistency: the attributes come fresh
    /// from the metadata engine and the chunks resolved before are dropped,
    /// so an open sees everything another host committed before it closed.
    fn open(&self, ctx: &Context, ino: Ino, flags: u32) -> Result<OpenOut> {
        let epoch = self.epoch();
        let attr = self.vol.meta.open(ctx, ino, flags)?;
        self.reader.invalidate_inode(ino);
        let attr = self.adjusted(ino, attr, epoch)?;
        Ok(self.open_out(ino, flags, attr))
    }

    /// Creates and opens a regular file.
    fn create(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: u32,
    ) -> Result<(Entry, OpenOut)> {
        let (ino, attr) = meta_op(MetaOp::Mknod, || {
            self.vol.meta.create(
                ctx,
                parent,
                name,
                (mode & 0o7777) as u16,
                (umask & 0o7777) as u16,
            )
        })?;
        let out = self.open_out(ino, flags, attr.clone());
        Ok((self.entry(ino, name, attr), out))
    }

    /// Buffers a write; it becomes a slice on flush, fsync or release (or
    /// earlier when the file's buffer is full). With `kill_suidgid` the
    /// write first drops setuid/setgid ([`Vfs::kill_suidgid`]).
    fn write(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        data: &mut dyn WriteSource,
        kill_suidgid: bool,
    ) -> Result<usize> {
        if kill_suidgid {
            self.kill_suidgid(ctx, ino, fh)?;
        }
        let (file, writable) = self.file_handle(ino, fh)?;
        if !writable {
            return Err(Error::BadHandle);
        }
        let len = data.len();
        // A transport's worker that must not wait (`sluice_api::wait`)
        // hands the write on before it takes a byte, where it would wait:
        // memory short (this file's buffer would be written back first), or
        // a commit behind the buffer to start while the last one still runs.
        if sluice_api::wait::may_wait().is_err()
            && (self.buffered.load(Ordering::Acquire).saturating_add(len)
                > self.cfg.total_buffer_bytes
                || file.writer.write_would_wait(len, self.cfg.buffer_bytes))
        {
            return Err(Error::WouldBlock);
        }
        // From here the write changes the buffer: whatever waits in it (a
        // slice id from the metadata engine, a commit the guess above did
        // not foresee) waits, on a worker too, so it never stops half done.
        let _waits = sluice_api::wait::allow_wait();
        // The one copy: from the source into the file's slice buffers.
        let buffered = file.writer.write(offset, data)?;
        file.length.fetch_max(offset + len as u64, Ordering::AcqRel);
        if self.buffered.load(Ordering::Acquire) > self.cfg.total_buffer_bytes {
            // Memory is short: write this file's buffer back before going on.
            self.flush_file(ino, &file)?;
        } else if buffered >= self.cfg.buffer_bytes {
            let behind = file
                .writer
                .flush_behind(&self.vol, ino, self.cfg.buffer_bytes);
            self.after_commit(ino, behind)?;
        }
        Ok(len)
    }

    /// Commits the file's buffered writes (at each close of a descriptor);
    /// reports a write error the handle's fsync has not reported yet.
    fn flush(&self, _ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        self.flush_reporting(ino, fh, false)
    }

    /// Flushes and closes a handle. When the last handle of a file goes and
    /// its writes still cannot be stored, they are dropped (flush and fsync
    /// reported the error; the kernel ignores RELEASE's reply).
    fn release(&self, _ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        let h = self.take_handle(ino, fh, false)?;
        let Handle::File { file, .. } = &*h else {
            return Err(Error::BadHandle);
        };
        let file = file.clone();
        let flushed = self.close_file(ino, &file);
        {
            let mut files = self.files.lock();
            if file.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
                if flushed.is_err() {
                    // The commit failed before it was handed on (storing
                    // its objects): everything is still in the buffer, and
                    // nothing is waited for under the lock.
                    let lost = file.writer.drop_buffered();
                    log::error!(
                        "inode {ino}: {lost} bytes of writes that could not be stored are \
                         dropped at the last close"
                    );
                }
                // A commit the group has not run yet keeps the file here
                // (its length still counts): the group's end forgets it.
                // Forgetting it here counts as one (under the lock, with
                // the removal): a getattr that read the engine before the
                // commit this close waited for, and finds no state now,
                // must read again (`Vfs::adjusted`).
                if !file.writer.is_dirty() && !file.writer.has_pending() {
                    self.forgotten.fetch_add(1, Ordering::AcqRel);
                    files.remove(&ino);
                }
            }
        }
        let closed = self.vol.meta.close(ino);
        flushed.and(closed)
    }

    /// Commits the file's buffered writes and makes every commit so far
    /// durable: once this returns, the file's data and metadata survive a
    /// power loss. Reports a write error once per handle (then marks it
    /// reported for the handle).
    fn fsync(&self, _ctx: &Context, ino: Ino, fh: Fh, _datasync: bool) -> Result<()> {
        // Every commit, this one and the file's earlier ones, came after a
        // sync of the objects it names (the writer syncs the store before
        // it commits; staged and S3 objects are durable when stored), so
        // syncing the metadata is what is left.
        self.flush_reporting(ino, fh, true)?;
        self.vol.meta.sync()
    }

    /// Opens a directory.
    fn opendir(&self, _ctx: &Context, ino: Ino) -> Result<Fh> {
        let attr = meta_op(MetaOp::GetAttr, || self.vol.meta.getattr(ino))?;
        if attr.typ != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok(self.add_handle(Handle::Dir {
            ino,
            entries: Mutex::new(None),
            attr,
        }))
    }

    /// Hands the entries from index `offset` of the handle's listing to
    /// `add`, in order, until it returns `false` (the caller's reply is
    /// full). Offset 0 starts a new listing. The listing reads the
    /// directory a page ([`READDIR_PAGE`] entries) at a time, only as far
    /// as the calls reach, and keeps what it read: a call costs the entries
    /// it hands out plus at most one page, so listing a directory of N
    /// entries costs O(N) in all and no call reads the whole directory —
    /// except one whose offset lies past what was read (a seek on a
    /// rewound handle), which reads up to it.
    fn readdir(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        plus: bool,
        add: &mut dyn FnMut(&Entry, Listed) -> bool,
    ) -> Result<()> {
        let h = self.handle(fh)?;
        let Handle::Dir {
            ino: dino, entries, ..
        } = &*h
        else {
            return Err(Error::BadHandle);
        };
        if *dino != ino {
            return Err(Error::BadHandle);
        }
        // Held for the call: calls on one handle take turns (the kernel
        // sends them one at a time anyway), calls on others do not wait.
        let mut guard = entries.lock();
        if offset == 0 || guard.is_none() {
            // A new listing replaces this handle's old one first, so a
            // rewind never counts both.
            *guard = None;
            *guard = Some(Listing {
                entries: Vec::new(),
                next: Some(DirCursor::Start),
                plus,
                seen: None,
                held: self.listed.clone(),
            });
            self.touch_atime(ino);
        }
        let listing = guard.as_mut().expect("set above");
        let mut at = usize::try_from(offset).unwrap_or(usize::MAX);
        let mut handed = false;
        loop {
            while at >= listing.entries.len() && listing.next.is_some() {
                if let Err(e) = self.read_page(ctx, ino, listing) {
                    // Entries already handed out stay in the caller's reply
                    // (a READDIRPLUS reply holds references to them); the
                    // next call reads the failed page again.
                    return if handed { Ok(()) } else { Err(e) };
                }
            }
            let Some(entry) = listing.entries.get(at) else {
                return Ok(());
            };
            if !add(entry, Listed::Node) {
                return Ok(());
            }
            handed = true;
            at += 1;
        }
    }

    /// Closes a directory handle.
    fn releasedir(&self, _ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        self.take_handle(ino, fh, true).map(drop)
    }

    /// Makes the directory's changes (all metadata committed so far)
    /// durable.
    fn fsyncdir(&self, _ctx: &Context, ino: Ino, fh: Fh, _datasync: bool) -> Result<()> {
        match &*self.handle(fh)? {
            Handle::Dir { ino: i, .. } if *i == ino => {}
            _ => return Err(Error::BadHandle),
        }
        self.vol.meta.sync()
    }

    /// Commits every file's buffered writes, waits for every commit a
    /// close handed on, and makes the metadata durable: after this,
    /// everything written before survives a power loss. Reports the first
    /// commit that failed.
    fn syncfs(&self, _ctx: &Context) -> Result<()> {
        let files: Vec<_> = self
            .files
            .lock()
            .iter()
            .map(|(i, f)| (*i, f.clone()))
            .collect();
        let mut first = Ok(());
        for (ino, f) in files {
            if let Err(e) = self.flush_file(ino, &f) {
                log::warn!("inode {ino}: syncfs could not commit its writes: {e}");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        self.committer.wait_idle();
        first.and(self.vol.meta.sync())
    }

    /// Space and inode usage.
    fn statfs(&self, ctx: &Context, ino: Ino) -> Result<StatFs> {
        meta_op(MetaOp::StatFs, || self.vol.meta.statfs(ctx, ino))
    }

    /// Sets an extended attribute; a POSIX ACL's name sets the ACL (see
    /// [`is_posix_acl`]).
    fn setxattr(
        &self,
        ctx: &Context,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        if let Some(typ) = AclType::of_xattr(name) {
            if !self.vol.format.enable_acl {
                return Err(acls_not_supported());
            }
            let rule = acl::Rule::from_xattr(value)?;
            // Counted as the attribute request it is (JuiceFS: SetFacl).
            return meta_op(MetaOp::SetXattr, || {
                self.vol.meta.set_facl(ctx, ino, typ, &rule)
            });
        }
        meta_op(MetaOp::SetXattr, || {
            self.vol.meta.setxattr(ctx, ino, name, value, mode)
        })
    }

    /// Reads an extended attribute. A POSIX ACL the node does not have (or
    /// any, on a volume without ACLs) is ENODATA: the file's mode is its
    /// whole ACL, which is what `getfacl` then shows, whatever an older
    /// client stored under its name.
    fn getxattr(&self, _ctx: &Context, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        if let Some(typ) = AclType::of_xattr(name) {
            if !self.vol.format.enable_acl {
                return Err(Error::NoXattr);
            }
            return match meta_op(MetaOp::GetXattr, || self.vol.meta.get_facl(ino, typ))? {
                Some(rule) => Ok(rule.to_xattr()),
                None => Err(Error::NoXattr),
            };
        }
        meta_op(MetaOp::GetXattr, || self.vol.meta.getxattr(ino, name))
    }

    /// Lists extended attribute names, with the POSIX ACLs the node has.
    fn listxattr(&self, _ctx: &Context, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let mut names = meta_op(MetaOp::ListXattr, || self.vol.meta.listxattr(ino))?;
        names.retain(|n| !is_posix_acl(n));
        if self.vol.format.enable_acl {
            let a = self.vol.meta.getattr(ino)?;
            for typ in [AclType::Access, AclType::Default] {
                if acl::acl_id(&a, typ) != 0 {
                    names.push(typ.xattr_name().to_vec());
                }
            }
        }
        Ok(names)
    }

    /// Removes an extended attribute; a POSIX ACL's name removes the ACL
    /// (refused on a volume without ACLs, as setting one is).
    fn removexattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()> {
        if let Some(typ) = AclType::of_xattr(name) {
            if !self.vol.format.enable_acl {
                return Err(acls_not_supported());
            }
            return meta_op(MetaOp::RemoveXattr, || {
                self.vol.meta.set_facl(ctx, ino, typ, &acl::Rule::empty())
            });
        }
        meta_op(MetaOp::RemoveXattr, || {
            self.vol.meta.removexattr(ctx, ino, name)
        })
    }

    /// Checks access permissions.
    fn access(&self, ctx: &Context, ino: Ino, mask: u32) -> Result<()> {
        self.vol.meta.access(ctx, ino, mask)
    }

    /// Preallocates, punches a hole or zeroes a range (`FALLOC_FL_*` bits).
    fn fallocate(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        mode: u32,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        let (file, writable) = self.file_handle(ino, fh)?;
        if !writable {
            return Err(Error::BadHandle);
        }
        // Linux drops setuid/setgid on every fallocate by a caller without
        // CAP_FSETID (file_modified); FALLOCATE carries no flag for it, and
        // with HANDLE_KILLPRIV_V2 the kernel leaves it to the file system.
        self.drop_setid(ctx, ino, &file)?;
        self.flush_file(ino, &file)?;
        let attr = meta_op(MetaOp::Fallocate, || {
            self.vol.meta.fallocate(ctx, ino, mode, offset, len)
        })?;
        self.reader.invalidate_inode(ino);
        file.length.store(attr.length, Ordering::Release);
        Ok(())
    }

    /// `copy_file_range` by reference: the destination comes to show the
    /// source's slices over the range, without reading or writing a byte of
    /// data (see [`crate::meta::copy_range`]). `fh_in` must be a readable
    /// handle of `req.fin` and `fh_out` a writable one of `req.fout`; the
    /// handles are what grant access. Returns the bytes copied: bounded by
    /// the source's length and [`crate::meta::MAX_COPY_LEN`] (callers loop,
    /// as for a short write), 0 from the source's end on.
    fn copy_file_range(
        &self,
        ctx: &Context,
        req: &CopyRange,
        fh_in: Fh,
        fh_out: Fh,
    ) -> Result<u64> {
        crate::meta::copy_range::check(req)?;
        self.copy_handle(req.fin, fh_in, false)?;
        let dst = self.copy_handle(req.fout, fh_out, true)?;
        // The destination's data changes: setuid/setgid go as for a write
        // (the kernel's file_modified, left to the file system).
        self.drop_setid(ctx, req.fout, &dst)?;
        // The copy shows every write made before it, to either file.
        self.flush_ino(req.fin)?;
        self.flush_ino(req.fout)?;
        let (copied, attr) = meta_op(MetaOp::CopyFileRange, || self.vol.meta.copy_file_range(req))?;
        self.reader.invalidate_inode(req.fout);
        dst.length.store(attr.length, Ordering::Release);
        Ok(copied)
    }

    /// SEEK_DATA / SEEK_HOLE: the next offset at or after `offset` that holds
    /// data (or is a hole). Zeros written as data count as data; the end of
    /// the file counts as a hole. Data is reported in whole
    /// [`SEEK_GRANULE`]s, as block file systems report whole blocks: a hole
    /// shorter than a granule, or the part of one sharing a granule with
    /// data, counts as data (POSIX lets a file system report less hole than
    /// there is; tools that probe the allocation unit with SEEK_DATA find a
    /// page, not a byte).
    fn lseek(&self, _ctx: &Context, ino: Ino, fh: Fh, offset: u64, whence: u32) -> Result<u64> {
        let (file, _) = self.file_handle(ino, fh)?;
        self.flush_file(ino, &file)?;
        let want_data = match whence as i32 {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return Err(Error::Invalid(format!("lseek whence {whence}"))),
        };
        let length = file.length.load(Ordering::Acquire);
        if offset >= length {
            return Err(enxio());
        }
        if !want_data {
            return self.next_hole(ino, offset, length);
        }
        // Only the chunks that exist are visited (the metadata engine lists
        // them, a few at a time): a 2^58-byte sparse file with data in one
        // chunk costs one listing and one chunk, not 2^32 chunks.
        let first = u32::try_from(offset / CHUNK_SIZE).map_err(|_| Error::FileTooBig)?;
        let last = u32::try_from((length - 1) / CHUNK_SIZE).map_err(|_| Error::FileTooBig)?;
        let mut from = first;
        loop {
            let found = self
                .vol
                .meta
                .chunk_indices(ino, from..=last, SEEK_CHUNKS_PER_LISTING)?;
            for &indx in &found {
                let base = u64::from(indx) * CHUNK_SIZE;
                let coff = offset.saturating_sub(base);
                let pieces = self.reader.pieces(ino, indx)?;
                if let Some((start, _)) = data_extents(&pieces).find(|&(_, end)| end > coff) {
                    let at = base + start.max(coff);
                    return if at < length { Ok(at) } else { Err(enxio()) };
                }
            }
            match found.last() {
                Some(&indx) if found.len() == SEEK_CHUNKS_PER_LISTING && indx < last => {
                    from = indx + 1;
                }
                _ => return Err(enxio()),
            }
        }
    }
}

/// How many existing chunks SEEK_DATA asks the metadata engine for at once.
const SEEK_CHUNKS_PER_LISTING: usize = 64;

/// The unit SEEK_DATA and SEEK_HOLE report data in (a page; it divides
/// [`CHUNK_SIZE`], so a granule never spans two chunks).
pub const SEEK_GRANULE: u64 = 4096;

/// The chunk-relative ranges of a chunk's visible pieces that hold data,
/// each widened to whole [`SEEK_GRANULE`]s, in order (neighbours may touch
/// or overlap).
fn data_extents(pieces: &[crate::chunk::Piece]) -> impl Iterator<Item = (u64, u64)> + '_ {
    pieces.iter().filter(|p| !p.is_hole()).map(|p| {
        (
            u64::from(p.pos) / SEEK_GRANULE * SEEK_GRANULE,
            p.end().div_ceil(SEEK_GRANULE) * SEEK_GRANULE,
        )
    })
}

/// `vol` with its object store behind a disk cache, when one is configured.
fn with_disk_cache(
    vol: Arc<Volume>,
    cfg: Option<DiskCacheConfig>,
) -> Result<(Arc<Volume>, Option<Arc<DiskCache>>)> {
    let Some(cfg) = cfg else {
        return Ok((vol, None));
    };
    let cache = DiskCache::open(vol.name(), &vol.format.uuid, cfg)?;
    let store: Arc<dyn ObjectStore> = Arc::new(CachedStore::new(vol.store.clone(), cache.clone()));
    log::info!(
        "disk cache: {} MiB over {}",
        cache.config().capacity >> 20,
        store.describe()
    );
    let vol = Arc::new(Volume {
        meta: vol.meta.clone(),
        format: vol.format.clone(),
        store,
        compression: vol.compression,
        block_size: vol.block_size,
    });
    Ok((vol, Some(cache)))
}

/// Asks for compaction of the chunks a commit left fragmented.
fn schedule_compaction(compactor: Option<&Compactor>, ino: Ino, committed: &[Committed]) {
    let Some(comp) = compactor else {
        return;
    };
    for c in committed {
        if c.slices >= COMPACT_THRESHOLD {
            comp.request(ino, c.indx);
        }
    }
}

/// Once the group commit ran a closed file's last commit: forgets the file
/// if no handle holds it and nothing else waits to be committed. Writes a
/// failed commit put back, with no handle left to flush or report them,
/// are dropped (the error was counted and logged), as a close that fails
/// drops them. Runs on the committer's thread: takes no commit lock.
/// Returns whether it forgot the file.
fn forget_if_unused(
    files: &Mutex<HashMap<Ino, Arc<OpenFile>>>,
    forgotten: &AtomicU64,
    ino: Ino,
    file: &Arc<OpenFile>,
) -> bool {
    let mut files = files.lock();
    let ours = files.get(&ino).is_some_and(|f| Arc::ptr_eq(f, file));
    if !ours || file.handles.load(Ordering::Acquire) > 0 || file.writer.has_pending() {
        return false;
    }
    let lost = file.writer.drop_buffered();
    if lost > 0 {
        log::error!(
            "inode {ino}: {lost} bytes of writes that could not be stored are dropped: \
             the file was closed"
        );
    }
    // Counted under the lock, with the removal: whoever finds the state
    // gone finds the count moved ([`Vfs::adjusted`]).
    forgotten.fetch_add(1, Ordering::AcqRel);
    files.remove(&ino);
    true
}

impl Drop for Vfs {
    fn drop(&mut self) {
        self.committer.stop();
        self.reader.stop_prefetch();
        if let Some(j) = self.janitor.lock().take() {
            drop(j.stop);
            let _ = j.thread.join();
        }
    }
}

/// A node id that names nothing (any more) is a stale handle, not a
/// missing name: the answer to `.` / `..` lookups of deleted nodes.
fn stale(e: Error) -> Error {
    match e {
        Error::NotFound => Error::Stale,
        e => e,
    }
}

#[cfg(test)]
mod tests;
