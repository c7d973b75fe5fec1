//! Raw access for `sluice dump` and `sluice load` (see [`crate::dump`]):
//! the volume's counters as JuiceFS's dump names them, and [`Restore`], the
//! records an engine writes to fill an empty store from a dump.
//!
//! A restore writes records as they are given — inode numbers, slice ids
//! and counters stay what the dump says, so the blocks in the object store
//! still match — and checks nothing a file-system operation would check:
//! the dump reader ([`crate::dump::load`]) validates the tree before it
//! hands records over. The volume becomes visible only at
//! [`Restore::finish`], which writes its settings last (SQLite: the whole
//! restore is one transaction), so a load that fails half way never leaves
//! a store that looks like a volume.

use crate::error::Result;
use crate::format::Format;
use crate::meta::{Attr, DirQuota, FileType, Ino, Slice};

/// The volume-wide counters, with JuiceFS's dump semantics (those of its
/// SQL engines): `next_inode` and `next_slice` are the next ids not yet
/// handed out (a Redis store keeps the last one handed out and converts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes in use, each node rounded up to 4 KiB (`usedSpace`).
    pub used_space: i64,
    /// Nodes in use (`totalInodes`, dumped as `usedInodes`).
    pub used_inodes: i64,
    /// The next inode number to hand out (`nextInode`).
    pub next_inode: i64,
    /// The next slice id to hand out (`nextChunk`).
    pub next_slice: i64,
    /// The session counter (`nextSession`).
    pub next_session: i64,
    /// The last hourly trash directory number (`nextTrash`).
    pub next_trash: i64,
}

/// Directory statistics of one directory (JuiceFS `jfs_dir_stats`): its
/// direct entries' file bytes, space (4 KiB-rounded) and count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirStat {
    /// Sum of the lengths of the regular files directly in it.
    pub data_length: i64,
    /// Sum of the 4 KiB-rounded space of its direct entries.
    pub used_space: i64,
    /// Number of its direct entries.
    pub used_inodes: i64,
}

/// The writer of a load: an empty store being filled record by record.
/// Dropping it before [`Restore::finish`] abandons the load (SQLite rolls
/// everything back; Redis keeps what was written, without settings, so the
/// store is still not a volume and a new load refuses it until it is
/// emptied).
pub trait Restore {
    /// Writes a node. `attr.parent` is 0 and `attr.nlink` the number of
    /// names for a node with several parents; `parents` then lists each
    /// parent with its number of entries naming the node (Redis keeps them
    /// in `p{ino}`), and is empty otherwise.
    fn node(&mut self, ino: Ino, attr: &Attr, parents: &[(Ino, u32)]) -> Result<()>;
    /// Writes a directory entry.
    fn entry(&mut self, parent: Ino, name: &[u8], ino: Ino, typ: FileType) -> Result<()>;
    /// Writes a symlink's target.
    fn symlink(&mut self, ino: Ino, target: &[u8]) -> Result<()>;
    /// Writes an extended attribute.
    fn xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()>;
    /// Stores a POSIX ACL rule (once per distinct rule) and returns the id
    /// the nodes that have it name.
    fn acl(&mut self, rule: &crate::meta::acl::Rule) -> Result<u32>;
    /// Writes a chunk's slice list (in write order).
    fn chunk(&mut self, ino: Ino, indx: u32, slices: &[Slice]) -> Result<()>;
    /// Writes how many chunk records name slice `(id, size)`.
    fn slice_refs(&mut self, id: u64, size: u32, refs: u32) -> Result<()>;
    /// Writes a directory's statistics.
    fn dir_stat(&mut self, ino: Ino, stat: &DirStat) -> Result<()>;
    /// Writes a directory quota with its usage.
    fn dir_quota(&mut self, ino: Ino, quota: &DirQuota) -> Result<()>;
    /// Writes the counters and the settings, and makes the volume visible.
    fn finish(self: Box<Self>, format: &Format, counters: &Counters) -> Result<()>;
}
