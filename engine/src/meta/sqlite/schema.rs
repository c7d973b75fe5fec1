//! JuiceFS 1.4's SQL schema for SQLite, statement for statement as JuiceFS
//! (xorm) creates it, so `juicefs` finds nothing to migrate in a volume
//! sluice formatted.

/// Table and index creation, in JuiceFS's order. `IF NOT EXISTS` keeps a
/// second `init` (or one on a JuiceFS-made volume) harmless.
/// sluice's own table of space records ([`crate::meta::space`]): created
/// with JuiceFS's at format, and when a volume is loaded (one JuiceFS
/// formatted has none yet).
pub(super) const CREATE_SPACE: &str = "CREATE TABLE IF NOT EXISTS `sluice_space` \
     (`inode` INTEGER PRIMARY KEY NOT NULL, `space` INTEGER NOT NULL, \
     `length` INTEGER NOT NULL, `mtime` INTEGER NOT NULL, `mtimensec` INTEGER NOT NULL)";

pub(super) const CREATE_TABLES: &str = r#"
CREATE TABLE IF NOT EXISTS `jfs_setting` (`name` TEXT PRIMARY KEY NOT NULL, `value` TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS `jfs_counter` (`name` TEXT PRIMARY KEY NOT NULL, `value` INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS `jfs_edge` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `parent` INTEGER NOT NULL, `name` BLOB NOT NULL, `inode` INTEGER NOT NULL, `type` INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS `UQE_jfs_edge_edge` ON `jfs_edge` (`parent`,`name`);
CREATE INDEX IF NOT EXISTS `IDX_jfs_edge_inode` ON `jfs_edge` (`inode`);
CREATE TABLE IF NOT EXISTS `jfs_node` (`inode` INTEGER PRIMARY KEY NOT NULL, `type` INTEGER NOT NULL, `flags` INTEGER NOT NULL, `mode` INTEGER NOT NULL, `uid` INTEGER NOT NULL, `gid` INTEGER NOT NULL, `atime` INTEGER NOT NULL, `mtime` INTEGER NOT NULL, `ctime` INTEGER NOT NULL, `atimensec` INTEGER DEFAULT 0 NOT NULL, `mtimensec` INTEGER DEFAULT 0 NOT NULL, `ctimensec` INTEGER DEFAULT 0 NOT NULL, `nlink` INTEGER NOT NULL, `length` INTEGER NOT NULL, `rdev` INTEGER NULL, `parent` INTEGER NULL, `access_acl_id` INTEGER NULL, `default_acl_id` INTEGER NULL, `tier_id` INTEGER NULL);
CREATE TABLE IF NOT EXISTS `jfs_symlink` (`inode` INTEGER PRIMARY KEY NOT NULL, `target` BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS `jfs_xattr` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `inode` INTEGER NOT NULL, `name` TEXT NOT NULL, `value` BLOB NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS `UQE_jfs_xattr_name` ON `jfs_xattr` (`inode`,`name`);
CREATE TABLE IF NOT EXISTS `jfs_chunk` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `inode` INTEGER NOT NULL, `indx` INTEGER NOT NULL, `slices` BLOB NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS `UQE_jfs_chunk_chunk` ON `jfs_chunk` (`inode`,`indx`);
CREATE TABLE IF NOT EXISTS `jfs_chunk_ref` (`chunkid` INTEGER PRIMARY KEY NOT NULL, `size` INTEGER NOT NULL, `refs` INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS `IDX_jfs_chunk_ref_refs` ON `jfs_chunk_ref` (`refs`);
CREATE TABLE IF NOT EXISTS `jfs_delslices` (`chunkid` INTEGER PRIMARY KEY NOT NULL, `deleted` INTEGER NOT NULL, `slices` BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS `jfs_session2` (`sid` INTEGER PRIMARY KEY NOT NULL, `expire` INTEGER NOT NULL, `info` BLOB NULL);
CREATE TABLE IF NOT EXISTS `jfs_sustained` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `sid` INTEGER NOT NULL, `inode` INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS `UQE_jfs_sustained_sustained` ON `jfs_sustained` (`sid`,`inode`);
CREATE TABLE IF NOT EXISTS `jfs_delfile` (`inode` INTEGER PRIMARY KEY NOT NULL, `length` INTEGER NOT NULL, `expire` INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS `jfs_flock` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `inode` INTEGER NOT NULL, `sid` INTEGER NOT NULL, `owner` INTEGER NOT NULL, `ltype` INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS `UQE_jfs_flock_flock` ON `jfs_flock` (`inode`,`sid`,`owner`);
CREATE TABLE IF NOT EXISTS `jfs_plock` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `inode` INTEGER NOT NULL, `sid` INTEGER NOT NULL, `owner` INTEGER NOT NULL, `records` BLOB NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS `UQE_jfs_plock_plock` ON `jfs_plock` (`inode`,`sid`,`owner`);
CREATE TABLE IF NOT EXISTS `jfs_dir_quota` (`inode` INTEGER PRIMARY KEY NOT NULL, `max_space` INTEGER NOT NULL, `max_inodes` INTEGER NOT NULL, `used_space` INTEGER NOT NULL, `used_inodes` INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS `jfs_user_group_quota` (`qtype` INTEGER NOT NULL, `qkey` INTEGER NOT NULL, `max_space` INTEGER NOT NULL, `max_inodes` INTEGER NOT NULL, `used_space` INTEGER NOT NULL, `used_inodes` INTEGER NOT NULL, PRIMARY KEY ( `qtype`,`qkey` ));
CREATE TABLE IF NOT EXISTS `jfs_dir_stats` (`inode` INTEGER PRIMARY KEY NOT NULL, `data_length` INTEGER NOT NULL, `used_space` INTEGER NOT NULL, `used_inodes` INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS `jfs_detached_node` (`inode` INTEGER PRIMARY KEY NOT NULL, `added` INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS `jfs_acl` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `owner` INTEGER NULL, `group` INTEGER NULL, `mask` INTEGER NULL, `other` INTEGER NULL, `named_users` BLOB NULL, `named_groups` BLOB NULL);
CREATE TABLE IF NOT EXISTS `jfs_delegation_token` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `token` BLOB NULL);
CREATE TABLE IF NOT EXISTS `jfs_change_log` (`id` INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, `entry` TEXT NOT NULL);
"#;

/// The counters a fresh volume starts with (JuiceFS `doInit`): inode 1 is
/// the root, so the next inode is 2; slice ids start at 1.
pub(super) const INITIAL_COUNTERS: &[(&str, i64)] = &[
    ("nextInode", 2),
    ("nextChunk", 1),
    ("nextSession", 0),
    ("usedSpace", 0),
    ("totalInodes", 0),
    ("nextCleanupSlices", 0),
];

/// Counter names, spelled as JuiceFS spells them.
pub(super) mod counter {
    /// The next inode number not yet handed out.
    pub const NEXT_INODE: &str = "nextInode";
    /// The next slice id not yet handed out.
    pub const NEXT_SLICE: &str = "nextChunk";
    /// The last session id handed out.
    pub const NEXT_SESSION: &str = "nextSession";
    /// Bytes in use (each node rounded up to 4 KiB).
    pub const USED_SPACE: &str = "usedSpace";
    /// Nodes in use.
    pub const TOTAL_INODES: &str = "totalInodes";
    /// The last hourly trash directory number handed out.
    pub const NEXT_TRASH: &str = "nextTrash";
}
