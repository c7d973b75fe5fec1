//! Metadata: the types every metadata engine shares, and the two traits of
//! an engine on JuiceFS 1.x's schema: [`Store`], what the SQLite and Redis
//! engines each implement (their storage-shaped operations), and [`Meta`],
//! the operations written once over them (`engine.rs`).
//!
//! The traits speak in inodes, names, attributes and slices — never in SQL
//! or Redis keys — so the data path and the FUSE layer work with any
//! engine.

use std::sync::Arc;

pub mod acl;
pub mod bounded;
pub(crate) mod chunks;
#[cfg(test)]
pub(crate) mod conformance;
pub mod copy_range;
mod deleter;
pub(crate) mod engine;
pub(crate) mod namespace;
mod open_files;
pub mod quota;
pub mod redis;
pub mod restore;
pub mod rules;
pub(crate) mod session;
pub mod session_info;
pub(crate) mod settings;
pub(crate) mod space;
pub mod sqlite;
pub mod trash;
pub mod url;

pub use bounded::{WorkCounters, WorkStats};
pub use copy_range::{CopyRange, MAX_COPY_LEN};
pub use quota::{DirQuota, QuotaChange, Quotas};
pub use redis::RedisMeta;
pub use restore::{Counters, DirStat, Restore};
pub use sqlite::{SqliteMeta, SqliteOptions, Synchronous};
pub use url::{MetaUrl, open_existing_meta, open_meta};

/// The node and request types are the API crate's (the transports use them
/// without the engine); here under their old names.
pub use sluice_api::meta::{
    Attr, Context, Entry, FileType, Ino, MAX_NAME_LEN, ROOT_INO, RenameFlags, SetAttr, StatFs,
    TimeChange, Timestamp, XattrMode,
};

use crate::error::Result;
use crate::format::Format;

/// The trash directory's inode (JuiceFS `TrashInode`, 0x7FFFFFFF10000000 =
/// 9223372032828243968 as JuiceFS 1.4 writes it); its hourly subdirectories
/// get the inodes after it.
pub const TRASH_INO: Ino = 0x7FFF_FFFF_1000_0000;
/// The size of a chunk: 64 MiB of file offset.
pub const CHUNK_SIZE: u64 = 64 << 20;
/// The largest file length JuiceFS's chunk index can address.
pub const MAX_FILE_LENGTH: u64 = CHUNK_SIZE * (u32::MAX as u64);
/// Where a paged directory listing ([`Meta::readdir_page`]) goes on from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DirCursor {
    /// The start of the directory: the page begins with `.` and `..`.
    #[default]
    Start,
    /// SQLite: the entries after this name (in byte order of the names,
    /// the order of the `(parent, name)` index).
    AfterName(Vec<u8>),
    /// Redis: an `HSCAN` cursor of the directory's entry hash (never 0).
    Scan(u64),
}

/// One page of a directory listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirPage {
    /// The page's entries.
    pub entries: Vec<Entry>,
    /// Where the next page starts; `None` at the end of the directory.
    pub next: Option<DirCursor>,
    /// Whether a later page may repeat a name of an earlier one (Redis:
    /// `HSCAN` returns an entry more than once when the hash is resized
    /// during the scan); the caller drops the repeats.
    pub may_repeat: bool,
}

/// A slice record inside a chunk, exactly JuiceFS's 24-byte record:
/// the bytes `off..off+len` of slice `id` (which is `size` bytes long) appear
/// at chunk offset `pos`. Slice id 0 is a hole (zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slice {
    /// Offset of this piece within the chunk.
    pub pos: u32,
    /// Slice id (0 = hole).
    pub id: u64,
    /// Total size of the stored slice.
    pub size: u32,
    /// Offset of this piece within the stored slice.
    pub off: u32,
    /// Length of this piece.
    pub len: u32,
}

impl Slice {
    /// The length of one encoded record.
    pub const RECORD_LEN: usize = 24;

    /// Encodes the record big-endian, as JuiceFS stores it.
    pub fn encode(&self) -> [u8; Self::RECORD_LEN] {
        let mut b = [0u8; Self::RECORD_LEN];
        b[0..4].copy_from_slice(&self.pos.to_be_bytes());
        b[4..12].copy_from_slice(&self.id.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.off.to_be_bytes());
        b[20..24].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes one record; `None` when `b` is not exactly 24 bytes.
    pub fn decode(b: &[u8]) -> Option<Slice> {
        let b: &[u8; Self::RECORD_LEN] = b.try_into().ok()?;
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[4..12]);
        Some(Slice {
            pos: u32_at(0),
            id: u64::from_be_bytes(id),
            size: u32_at(12),
            off: u32_at(16),
            len: u32_at(20),
        })
    }

    /// Decodes a concatenation of records (a `jfs_chunk.slices` blob or a
    /// Redis list); `None` when the length is not a multiple of 24.
    pub fn decode_all(b: &[u8]) -> Option<Vec<Slice>> {
        if !b.len().is_multiple_of(Self::RECORD_LEN) {
            return None;
        }
        b.chunks_exact(Self::RECORD_LEN)
            .map(Slice::decode)
            .collect()
    }
}

/// One [`Store::write_chunk`]: slice `slice` appended to chunk `indx` of
/// `ino`, with `mtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkWrite {
    /// The file.
    pub ino: Ino,
    /// The chunk index.
    pub indx: u32,
    /// The slice record.
    pub slice: Slice,
    /// The file's new mtime.
    pub mtime: Timestamp,
}

/// What [`Store::write_chunks`] did with one commit's writes.
#[derive(Debug, Default)]
pub struct CommitResult {
    /// For each write applied, in order, how many slices its chunk holds
    /// now; the writes after these were not applied.
    pub counts: Vec<usize>,
    /// What stopped the commit, if something did.
    pub error: Option<crate::error::Error>,
}

/// How a truncate was asked for, which decides what it checks (JuiceFS's
/// `skipPermCheck`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TruncateVia {
    /// `truncate(2)` on a path: the caller needs write permission by the
    /// file's mode, and a file in the trash stays as it is.
    Path,
    /// `ftruncate(2)` on a descriptor open for writing: the open checked
    /// access already (a file created 0444 with `O_RDWR` may be truncated
    /// through that descriptor, as on a local file system), and a file moved
    /// to the trash while open may still change.
    Handle,
}

/// A stored slice that no chunk references any more: its objects may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReleasedSlice {
    /// The slice id.
    pub id: u64,
    /// The slice's stored size (names its objects).
    pub size: u32,
}

/// Called when slices lose their last reference, so the data layer deletes
/// their objects. Returns whether the deletion succeeded; failed deletions are
/// kept by the engine (JuiceFS's `jfs_delslices`) and retried by `cleanup`.
pub type SliceReleaser = Arc<dyn Fn(ReleasedSlice) -> bool + Send + Sync>;

/// What each metadata engine implements itself: the volume's settings,
/// sessions, open files, getattr and lookup, chunks and slices, reading
/// extended attributes, quota records, dump/load and fsck's scans; [`Meta`]
/// adds the operations written once. Both keep these rules.
///
/// A method that changes the
/// namespace or a node commits its change as one transaction (one SQL
/// transaction, one Redis MULTI/EXEC), so no reader sees half of it; what
/// follows a commit is not part of it — the objects and chunk records it
/// released are deleted afterwards, in the background (see `deleter`), a
/// rename whose directory quotas need checking checks them before its
/// transaction (JuiceFS's rule), an unlink or rmdir into the trash makes
/// the hour's trash directory in a transaction of its own first, and inode
/// and slice ids come from counters taken outside the transaction (numbers
/// a conflict wastes are harmless). `cleanup` finishes what a crash between
/// a commit and its follow-up left.
///
/// Permission checks (`Access`/`Perm`) happen inside the engine against
/// `ctx`, as JuiceFS's do, unless `ctx.privileged`.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// The engine's name for logs ("sqlite3", "redis").
    fn name(&self) -> &'static str;

    /// Whether a call waits on another machine — a network round trip
    /// (Redis) — rather than on local storage (SQLite). A transport's
    /// worker that must not wait hands the operations that reach such an
    /// engine to a waiter (`sluice_api::wait`; `Filesystem::metadata_is_remote`);
    /// a remote engine also fails a call made on such a worker with
    /// `Error::WouldBlock` before it sends anything.
    fn remote(&self) -> bool {
        false
    }

    /// Round trips to a remote engine's server so far (0 for a local one):
    /// a command or a pipeline sent and answered is one. Tests assert the
    /// cost of each operation in them, a count that does not depend on
    /// load.
    fn round_trips(&self) -> u64 {
        0
    }

    /// Writes the volume settings into an empty store and creates the root
    /// (and the trash directory). If a volume exists, succeeds only when it is
    /// the same volume (same name and UUID) and updates the settings that may
    /// change (trash days); otherwise fails with `Exists`.
    fn init(&self, format: &Format) -> Result<()>;
    /// Reads the volume settings; `NotFound` when the store holds no volume.
    fn load(&self) -> Result<Format>;

    /// Registers this client's session (JuiceFS `jfs_session2`) and returns
    /// its id; the engine heartbeats it in the background.
    fn new_session(&self, info: &str) -> Result<u64>;
    /// Removes this client's session, releasing what it alone kept (files
    /// unlinked while it held them open).
    fn close_session(&self) -> Result<()>;
    /// Background maintenance: expires dead sessions, deletes files whose last
    /// opener is gone, empties expired trash, retries failed slice deletions.
    fn cleanup(&self) -> Result<()>;
    /// Installs the callback that deletes the objects of released slices.
    /// The engine calls it only once the change that released them is
    /// durable ([`Store::sync`]): an object deleted while a power loss could
    /// still roll that change back would leave a file naming it.
    fn set_slice_releaser(&self, releaser: SliceReleaser);
    /// From now on, the data of removed files and the objects of released
    /// slices are deleted by a background thread, many at a time behind
    /// one [`Store::sync`], rather than by the call that removed or released
    /// them (an unlink then costs its own transaction alone). The `Vfs`
    /// asks for it; tools and tests keep deleting in the call. What the
    /// queue loses in a crash the metadata still records, and
    /// [`Store::cleanup`] finds it.
    fn delete_in_background(&self) -> Result<()> {
        Ok(())
    }
    /// Waits until every background delete queued so far is done (at
    /// unmount).
    fn drain_deletes(&self) {}

    /// Makes every change this client committed so far durable: it survives
    /// a power loss once this returns. `fsync` ends with it. Engines whose
    /// commits are durable when they return (SQLite with `synchronous=FULL`
    /// or a rollback journal; Redis, whose durability is the server's
    /// `appendfsync`) have nothing to do. Concurrent calls share one sync.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// Why this engine cannot promise that [`Store::sync`] makes commits
    /// durable, if it cannot (a Redis server without `appendonly yes` and
    /// `appendfsync always`): one line for a warning at mount.
    fn durability_gap(&self) -> Option<String> {
        None
    }

    /// Looks up `name` in directory `parent` (`.` and `..` included).
    fn lookup(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)>;
    /// The attributes of a node.
    fn getattr(&self, ino: Ino) -> Result<Attr>;

    /// Checks `flags` (`O_ACCMODE` bits; an execve's `__FMODE_EXEC` open
    /// needs execute, not read) against the node's permissions and records
    /// that this session holds it open.
    fn open(&self, ctx: &Context, ino: Ino, flags: u32) -> Result<Attr>;
    /// Records one close; the last close of an unlinked file releases it.
    fn close(&self, ino: Ino) -> Result<()>;
    /// The slice list of chunk `indx` of a file, as stored (in write order;
    /// later slices win). Empty when the chunk holds no data.
    fn read_chunk(&self, ino: Ino, indx: u32) -> Result<Vec<Slice>>;
    /// The indexes of the chunks of `ino` within `range` that hold records,
    /// ascending, at most `limit` of them. The work is bounded by the chunks
    /// that exist, not by the length of the range (see [`bounded`]).
    fn chunk_indices(
        &self,
        ino: Ino,
        range: std::ops::RangeInclusive<u32>,
        limit: usize,
    ) -> Result<Vec<u32>>;
    /// Hands out a new slice id (ids are taken from the counter in batches).
    fn new_slice_id(&self) -> Result<u64>;
    /// Appends a slice to chunk `indx`, creates its reference, grows the
    /// length to cover it, sets mtime, and updates usage and directory stats.
    /// Returns how many slices the chunk now holds (a hint for compaction).
    fn write_chunk(&self, ino: Ino, indx: u32, slice: Slice, mtime: Timestamp) -> Result<usize>;
    /// The [`Store::write_chunk`]s of several files' commits, as a group
    /// commit gathers them: each commit's writes are applied in order and
    /// stop at its first failure, which fails that commit alone. An engine
    /// that can applies the whole group as one transaction (SQLite: one
    /// commit to the WAL for the group, each file's writes all or none);
    /// the others apply one write at a time.
    fn write_chunks(&self, commits: &[Vec<ChunkWrite>]) -> Vec<CommitResult> {
        commits
            .iter()
            .map(|writes| {
                let mut done = CommitResult::default();
                for w in writes {
                    match self.write_chunk(w.ino, w.indx, w.slice, w.mtime) {
                        Ok(n) => done.counts.push(n),
                        Err(e) => {
                            done.error = Some(e);
                            break;
                        }
                    }
                }
                done
            })
            .collect()
    }
    /// Replaces the chunk's first `old.len()` slices by `new` (one slice that
    /// covers what they showed), provided those slices are still exactly
    /// `old`; releases slices that lose their last reference. Returns `false`
    /// (and changes nothing) when the chunk changed meanwhile.
    fn compact_chunk(&self, ino: Ino, indx: u32, old: &[Slice], new: &[Slice]) -> Result<bool>;
    /// Every (inode, chunk index, slice list) in the volume, for gc, fsck and
    /// `sluice info`.
    fn list_chunks(&self) -> Result<Vec<(Ino, u32, Vec<Slice>)>>;
    /// Whether a slice id with this size is referenced by any chunk.
    fn slice_referenced(&self, id: u64, size: u32) -> Result<bool>;
    /// How many space records ([`space`]) name a node that does not exist
    /// (left by a client that keeps none, such as JuiceFS, removing a file
    /// with holes); with `remove`, they are deleted. For fsck.
    fn orphan_space_records(&self, remove: bool) -> Result<u64>;

    /// Reads an extended attribute.
    fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>>;
    /// Lists extended attribute names.
    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>>;
    /// The limits and usage this client checks changes against (see
    /// [`quota`]).
    fn quotas(&self) -> &Quotas;
    /// Reads the settings, the usage counters and every directory quota
    /// again into [`Store::quotas`] (done at load and at each heartbeat).
    fn reload_quotas(&self) -> Result<()>;
    /// Every directory quota record (JuiceFS `jfs_dir_quota` / `dirQuota`).
    fn dir_quotas(&self) -> Result<Vec<(Ino, DirQuota)>>;
    /// The quota record of directory `ino`, if it has one.
    fn get_dir_quota(&self, ino: Ino) -> Result<Option<DirQuota>>;
    /// Creates or changes the quota record of directory `ino`; returns
    /// whether it was created.
    fn set_dir_quota(&self, ino: Ino, change: &QuotaChange) -> Result<bool>;
    /// Removes the quota record of directory `ino` (nothing when it has
    /// none).
    fn delete_dir_quota(&self, ino: Ino) -> Result<()>;
    /// Adds (space, inodes) to the usage of each quota record named, in one
    /// transaction.
    fn add_dir_quota_usage(&self, changes: &[(Ino, i64, i64)]) -> Result<()>;

    /// The volume-wide counters, as `sluice dump` writes them.
    fn counters(&self) -> Result<Counters>;
    /// Starts filling this store from a dump (`sluice load`); fails with a
    /// message naming the store when it is not empty.
    fn restore(&self) -> Result<Box<dyn Restore + '_>>;

    /// The statistics stored for directory `ino` (JuiceFS `jfs_dir_stats` /
    /// `dirUsedSpace`…), or `None` when it has none (`sluice fsck`).
    fn dir_stat(&self, ino: Ino) -> Result<Option<DirStat>>;
    /// Replaces the statistics of directory `ino` (`sluice fsck --repair`).
    fn set_dir_stat(&self, ino: Ino, stat: &DirStat) -> Result<()>;
    /// Adds `space` and `inodes` to the volume's usage counters
    /// (`usedSpace`, `totalInodes`) in one transaction (`sluice fsck
    /// --repair`).
    fn add_usage(&self, space: i64, inodes: i64) -> Result<()>;
    /// The removed files whose chunks still await deletion (JuiceFS
    /// `jfs_delfile` / `delfiles`): their chunk records have no node.
    fn deleted_files(&self) -> Result<Vec<Ino>>;
}

/// The operations written once over every engine (`meta/engine.rs`): the
/// namespace's changes, listings, permissions, attributes and ACLs, each
/// run as one transaction (or one read) of the engine's storage
/// primitives. An engine implements [`Store`] and the crate's `Engine`
/// (its transactions and a few hooks); `Meta` comes with them.
pub trait Meta: Store {
    /// Linux fallocate: `mode` is the `FALLOC_FL_*` bits (KEEP_SIZE,
    /// PUNCH_HOLE, ZERO_RANGE); holes are written as slice id 0.
    fn fallocate(&self, ctx: &Context, ino: Ino, mode: u32, offset: u64, len: u64) -> Result<Attr>;
    /// Sets a regular file's length; chunks past the end are dropped and
    /// their slices released. `via` says whether the caller holds the file
    /// open for writing (then the mode is not checked). Returns the new
    /// attributes.
    fn truncate(&self, ctx: &Context, ino: Ino, length: u64, via: TruncateVia) -> Result<Attr>;
    /// Linux `copy_file_range` by reference (JuiceFS `CopyFileRange`), as
    /// one transaction: the source's bytes over the range (bounded by its
    /// length and [`MAX_COPY_LEN`]) appear in the destination as slice
    /// records that reference the source's slices (zeros as holes), and
    /// each such record adds a reference to its slice. The destination
    /// grows to cover the copy, gets new mtime and ctime, and usage and
    /// directory statistics follow. Access was proven by the caller's open
    /// handles (source readable, destination writable), as for
    /// [`Store::write_chunk`]. Returns the bytes copied (0 when the source
    /// ends before `off_in`: nothing changes) and the destination's
    /// attributes.
    fn copy_file_range(&self, req: &CopyRange) -> Result<(u64, Attr)>;
    /// Space and inode usage.
    fn statfs(&self, ctx: &Context, ino: Ino) -> Result<StatFs>;
    /// The target of a symbolic link.
    fn readlink(&self, ino: Ino) -> Result<Vec<u8>>;
    /// All entries of a directory, `.` and `..` first; with `plus`, each
    /// entry carries full attributes (otherwise only `typ` is meaningful).
    fn readdir(&self, ctx: &Context, ino: Ino, plus: bool) -> Result<Vec<Entry>>;
    /// One page of a directory's entries: about `max` of them (at least
    /// one unless the directory ends; Redis may return more for a small
    /// directory), from `cursor` on. The first page ([`DirCursor::Start`])
    /// checks access as [`Meta::readdir`] does and begins with `.` and `..`.
    /// The work of a call is bounded by its page, not by the directory.
    /// An entry that exists for the whole listing appears in it (once, but
    /// see [`DirPage::may_repeat`]); one added or removed meanwhile may or
    /// may not, as POSIX allows.
    fn readdir_page(
        &self,
        ctx: &Context,
        ino: Ino,
        plus: bool,
        cursor: &DirCursor,
        max: usize,
    ) -> Result<DirPage>;
    /// What range operations (fallocate, chunk listings) visited so far.
    fn work(&self) -> WorkStats;
    /// How many of a node's names are in the trash: the links the trash
    /// keeps of a hard-linked file one of whose names was removed (JuiceFS
    /// moves the name there and keeps the link count). The stored count
    /// includes them; what a user is shown leaves them out (the Vfs).
    fn trash_links(&self, ino: Ino) -> Result<u32>;
    /// Changes mode, owner or times.
    fn setattr(&self, ctx: &Context, ino: Ino, set: &SetAttr) -> Result<Attr>;
    /// Creates a node of any type but directory and symlink (mknod).
    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        typ: FileType,
        mode: u16,
        umask: u16,
        rdev: u32,
    ) -> Result<(Ino, Attr)>;
    /// Creates a directory.
    fn mkdir(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u16,
        umask: u16,
    ) -> Result<(Ino, Attr)>;
    /// Creates a symbolic link.
    fn symlink(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        target: &[u8],
    ) -> Result<(Ino, Attr)>;
    /// Removes a non-directory entry. With trash enabled the node moves to
    /// the trash; a file still open somewhere is kept until its last close.
    fn unlink(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()>;
    /// Removes an empty directory.
    fn rmdir(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()>;
    /// Renames (or exchanges) an entry; a replaced destination is unlinked as
    /// `unlink` would. Returns the moved node.
    fn rename(
        &self,
        ctx: &Context,
        parent_src: Ino,
        name_src: &[u8],
        parent_dst: Ino,
        name_dst: &[u8],
        flags: RenameFlags,
    ) -> Result<(Ino, Attr)>;
    /// Adds a hard link to `ino` as `name` in `parent`.
    fn link(&self, ctx: &Context, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr>;
    /// Creates and opens a regular file (or fails with `Exists`).
    fn create(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u16,
        umask: u16,
    ) -> Result<(Ino, Attr)>;
    /// Checks access `mask` (`R_OK|W_OK|X_OK`, or `F_OK`).
    fn access(&self, ctx: &Context, ino: Ino, mask: u32) -> Result<()>;
    /// Sets the access time alone, as a read or a directory listing does:
    /// no permission check (the caller could read) and no ctime change.
    fn set_atime(&self, ino: Ino, atime: Timestamp) -> Result<()>;

    /// Sets an extended attribute.
    fn setxattr(
        &self,
        ctx: &Context,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()>;
    /// Removes an extended attribute.
    fn removexattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()>;
    /// A node's ACL of type `typ` (`None`: it has none, its mode is its
    /// access ACL). Only for volumes with ACLs (`Format::enable_acl`; the
    /// caller checks).
    fn get_facl(&self, ino: Ino, typ: acl::AclType) -> Result<Option<acl::Rule>>;
    /// Sets a node's ACL of type `typ` by [`rules::apply_facl`]'s rules (an
    /// empty rule removes it). Only for volumes with ACLs.
    fn set_facl(&self, ctx: &Context, ino: Ino, typ: acl::AclType, rule: &acl::Rule) -> Result<()>;
}
