//! The record sluice keeps beside a file's node for [`Attr::space`] (the
//! bytes a file with holes stores, which `st_blocks` shows), in a SQLite
//! table or a Redis key of its own: JuiceFS's node has no field for it.
//!
//! A record is stamped with the node's length and mtime it was counted
//! for, and read only while they still match: a JuiceFS client (or any
//! other that keeps no record) that changes a file's data moves its
//! mtime, so the record it left behind is ignored, and the file shows its
//! length, as JuiceFS shows it. sluice writes the record in the same
//! transaction as the node, from the node it writes
//! ([`SpaceRecord::of`]), so a node sluice changed and its record always
//! agree. See engine/DESIGN.md, "Space a file shows".

use crate::meta::{Attr, FileType, Timestamp};

/// A file's stored bytes, with the (length, mtime) they were counted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpaceRecord {
    /// The bytes the file's data covers at most (less than `length`).
    pub space: u64,
    /// The node's length when counted.
    pub length: u64,
    /// The node's mtime when counted.
    pub mtime: Timestamp,
}

/// Encoded size: space, length, mtime seconds (8 bytes each, big-endian)
/// and mtime nanoseconds (4).
const ENCODED: usize = 28;

impl SpaceRecord {
    /// The record to keep beside `a` as it is written (None: none, the
    /// length stands).
    pub(crate) fn of(a: &Attr) -> Option<SpaceRecord> {
        match a.space {
            Some(space) if a.typ == FileType::File && space < a.length => Some(SpaceRecord {
                space,
                length: a.length,
                mtime: a.mtime,
            }),
            _ => None,
        }
    }

    /// Sets `a.space` from this record if it was counted for `a` as it is.
    pub(crate) fn apply(&self, a: &mut Attr) {
        if a.typ == FileType::File
            && self.length == a.length
            && self.mtime == a.mtime
            && self.space < a.length
        {
            a.space = Some(self.space);
        }
    }

    /// The bytes a Redis value holds.
    pub(crate) fn encode(&self) -> [u8; ENCODED] {
        let mut b = [0u8; ENCODED];
        b[0..8].copy_from_slice(&self.space.to_be_bytes());
        b[8..16].copy_from_slice(&self.length.to_be_bytes());
        b[16..24].copy_from_slice(&self.mtime.secs.to_be_bytes());
        b[24..28].copy_from_slice(&self.mtime.nsecs.to_be_bytes());
        b
    }

    /// Decodes [`SpaceRecord::encode`]'s bytes; None for any other length
    /// (a value another client wrote is ignored, never trusted).
    pub(crate) fn decode(b: &[u8]) -> Option<SpaceRecord> {
        if b.len() != ENCODED {
            return None;
        }
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(x)
        };
        let mut n = [0u8; 4];
        n.copy_from_slice(&b[24..28]);
        Some(SpaceRecord {
            space: u64_at(0),
            length: u64_at(8),
            mtime: Timestamp {
                secs: u64_at(16) as i64,
                nsecs: u32::from_be_bytes(n),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(typ: FileType) -> Attr {
        Attr {
            flags: 0,
            typ,
            mode: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            nlink: 1,
            length: 0,
            parent: 1,
            access_acl: 0,
            default_acl: 0,
            space: None,
        }
    }

    fn file(length: u64, space: Option<u64>) -> Attr {
        let mut a = node(FileType::File);
        a.length = length;
        a.mtime = Timestamp { secs: 7, nsecs: 9 };
        a.space = space;
        a
    }

    #[test]
    fn a_record_round_trips_and_applies_only_to_the_node_it_was_counted_for() {
        let a = file(1 << 20, Some(4096));
        let r = SpaceRecord::of(&a).expect("a file with holes has a record");
        assert_eq!(SpaceRecord::decode(&r.encode()), Some(r));
        let mut same = file(1 << 20, None);
        r.apply(&mut same);
        assert_eq!(same.space, Some(4096));
        // Another client wrote the file: its mtime moved.
        let mut moved = file(1 << 20, None);
        moved.mtime.nsecs += 1;
        r.apply(&mut moved);
        assert_eq!(moved.space, None);
        let mut longer = file(2 << 20, None);
        r.apply(&mut longer);
        assert_eq!(longer.space, None);
        assert!(SpaceRecord::decode(&r.encode()[..27]).is_none());
    }

    #[test]
    fn files_without_holes_and_other_nodes_keep_no_record() {
        assert_eq!(SpaceRecord::of(&file(4096, None)), None);
        assert_eq!(SpaceRecord::of(&file(4096, Some(4096))), None);
        let mut dir = node(FileType::Directory);
        dir.space = Some(1);
        assert_eq!(SpaceRecord::of(&dir), None);
    }
}
