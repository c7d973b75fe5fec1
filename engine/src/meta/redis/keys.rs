//! JuiceFS's Redis key names. In Redis Cluster JuiceFS puts every key behind
//! the hash tag `{DB}` so one volume lives in one slot; `prefix` carries that.

use crate::meta::Ino;

/// The key names of one volume.
#[derive(Debug, Clone, Default)]
pub(super) struct Keys {
    prefix: String,
}

/// Counter names as JuiceFS spells them in Redis.
pub(super) mod counter {
    /// The last inode number handed out.
    pub const NEXT_INODE: &str = "nextinode";
    /// The last slice id handed out.
    pub const NEXT_SLICE: &str = "nextchunk";
    /// The last session id handed out.
    pub const NEXT_SESSION: &str = "nextsession";
    /// Bytes in use (each node rounded up to 4 KiB).
    pub const USED_SPACE: &str = "usedSpace";
    /// Nodes in use.
    pub const TOTAL_INODES: &str = "totalInodes";
    /// The last hourly trash directory number handed out.
    pub const NEXT_TRASH: &str = "nextTrash";
    /// The last ACL rule id handed out.
    pub const ACL_MAX_ID: &str = "aclMaxId";
}

impl Keys {
    /// Keys with a prefix (`{N}` in cluster mode, empty otherwise).
    pub(super) fn with_prefix(prefix: impl Into<String>) -> Keys {
        Keys {
            prefix: prefix.into(),
        }
    }

    /// The prefix itself.
    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn k(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The volume settings (JSON).
    pub(super) fn setting(&self) -> String {
        self.k("setting")
    }
    /// The ACL rules: id → encoded rule.
    pub(super) fn acl(&self) -> String {
        self.k("acl")
    }
    /// A counter.
    pub(super) fn counter(&self, name: &str) -> String {
        self.k(name)
    }
    /// A node's attributes.
    pub(super) fn inode(&self, ino: Ino) -> String {
        format!("{}i{ino}", self.prefix)
    }
    /// A directory's entries: name → type + inode.
    pub(super) fn entry(&self, dir: Ino) -> String {
        format!("{}d{ino}", self.prefix, ino = dir)
    }
    /// A hard-linked node's parents: parent → link count.
    /// sluice's record of the bytes a file with holes stores
    /// ([`crate::meta::space`]); JuiceFS has no such key and none of its
    /// scans (`i*`, `c*`, `k*`, `d[0-9]*`, `session[0-9]*`) matches it.
    pub(super) fn space(&self, ino: Ino) -> String {
        format!("{}sluiceSpace{ino}", self.prefix)
    }

    /// The [`space`](Keys::space) key of the node whose key is `key`, if
    /// `key` is a node's.
    pub(super) fn space_of_node_key(&self, key: &str) -> Option<String> {
        let digits = key.strip_prefix(self.prefix.as_str())?.strip_prefix('i')?;
        let ino: Ino = digits.parse().ok()?;
        (ino.to_string() == digits).then(|| self.space(ino))
    }

    pub(super) fn parent(&self, ino: Ino) -> String {
        format!("{}p{ino}", self.prefix)
    }
    /// A chunk's slice list.
    pub(super) fn chunk(&self, ino: Ino, indx: u32) -> String {
        format!("{}c{ino}_{indx}", self.prefix)
    }
    /// The `SCAN` pattern of every chunk key.
    pub(super) fn chunk_pattern(&self) -> String {
        self.k("c*_*")
    }
    /// A symlink's target.
    pub(super) fn symlink(&self, ino: Ino) -> String {
        format!("{}s{ino}", self.prefix)
    }
    /// A node's extended attributes.
    pub(super) fn xattr(&self, ino: Ino) -> String {
        format!("{}x{ino}", self.prefix)
    }
    /// Slice reference counts: `k{id}_{size}` → references − 1.
    pub(super) fn slice_refs(&self) -> String {
        self.k("sliceRef")
    }
    /// Slices compaction keeps for the trash: `{id}_{unix secs}` → records.
    pub(super) fn delayed_slices(&self) -> String {
        self.k("delSlices")
    }
    /// Removed files whose data is still to delete: `{ino}:{length}` → secs.
    pub(super) fn delfiles(&self) -> String {
        self.k("delfiles")
    }
    /// Live sessions: sid → expiry (unix secs).
    pub(super) fn all_sessions(&self) -> String {
        self.k("allSessions")
    }
    /// Session descriptions: sid → JSON.
    pub(super) fn session_infos(&self) -> String {
        self.k("sessionInfos")
    }
    /// Files a session keeps open after their last unlink.
    pub(super) fn sustained(&self, sid: u64) -> String {
        format!("{}session{sid}", self.prefix)
    }
    /// sluice's own (JuiceFS has no such key): the sessions holding a file
    /// open, sid → 1, so that an unlink on another host keeps the file for
    /// them. JuiceFS's tools never read it.
    pub(super) fn opened(&self, ino: Ino) -> String {
        format!("{}open{ino}", self.prefix)
    }
    /// Lock keys a session holds locks in.
    pub(super) fn locked(&self, sid: u64) -> String {
        format!("{}locked{sid}", self.prefix)
    }
    /// Directory statistics: dir → data length.
    pub(super) fn dir_data_length(&self) -> String {
        self.k("dirDataLength")
    }
    /// Directory statistics: dir → used space.
    pub(super) fn dir_used_space(&self) -> String {
        self.k("dirUsedSpace")
    }
    /// Directory statistics: dir → used inodes.
    pub(super) fn dir_used_inodes(&self) -> String {
        self.k("dirUsedInodes")
    }
    /// Directory quotas and their usage.
    pub(super) fn dir_quota_keys(&self) -> [String; 3] {
        [
            self.k("dirQuota"),
            self.k("dirQuotaUsedSpace"),
            self.k("dirQuotaUsedInodes"),
        ]
    }
}

/// The `sliceRef` field of a slice.
pub(super) fn slice_field(id: u64, size: u32) -> String {
    format!("k{id}_{size}")
}

/// Parses a `sliceRef` field back into (id, size).
pub(super) fn parse_slice_field(f: &[u8]) -> Option<(u64, u32)> {
    let s = std::str::from_utf8(f).ok()?.strip_prefix('k')?;
    let (id, size) = s.split_once('_')?;
    Some((id.parse().ok()?, size.parse().ok()?))
}

/// Parses a chunk key (without prefix) into (inode, index).
pub(super) fn parse_chunk_key(key: &str) -> Option<(Ino, u32)> {
    let (ino, indx) = key.strip_prefix('c')?.split_once('_')?;
    Some((ino.parse().ok()?, indx.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_juicefs() {
        let k = Keys::default();
        assert_eq!(k.inode(1), "i1");
        assert_eq!(k.entry(9), "d9");
        assert_eq!(k.chunk(5, 2), "c5_2");
        assert_eq!(k.setting(), "setting");
        assert_eq!(k.sustained(3), "session3");
        assert_eq!(k.space(7), "sluiceSpace7");
        assert_eq!(k.space_of_node_key("i7").as_deref(), Some("sluiceSpace7"));
        assert_eq!(k.space_of_node_key("i07"), None);
        assert_eq!(k.space_of_node_key("d7"), None);
        assert_eq!(slice_field(12, 4096), "k12_4096");
        assert_eq!(parse_slice_field(b"k12_4096"), Some((12, 4096)));
        assert_eq!(parse_chunk_key("c5_2"), Some((5, 2)));
        let c = Keys::with_prefix("{1}");
        assert_eq!(c.inode(1), "{1}i1");
        assert_eq!(c.counter(counter::NEXT_INODE), "{1}nextinode");
        assert_eq!(c.chunk_pattern(), "{1}c*_*");
    }
}
