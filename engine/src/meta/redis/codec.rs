//! The binary values JuiceFS keeps in Redis: node attributes (`i{ino}`),
//! directory entries (`d{ino}` hash values) and the delayed-slice records of
//! compaction (`delSlices`). Slice records are [`Slice::encode`]'s.

use crate::meta::{Attr, FileType, Ino, Timestamp};

/// The length JuiceFS gives an encoded attribute without ACLs: 71 bytes of
/// fields in a 72-byte buffer (the last byte stays zero).
#[cfg(test)]
pub(super) const ATTR_LEN: usize = 72;
/// Where the optional fields (ACL ids, storage tier) start.
const ATTR_FIELDS_END: usize = 71;
/// Where the storage tier is in a value with ACL ids.
const ATTR_ACL_END: usize = ATTR_FIELDS_END + 8;
/// The shortest attribute JuiceFS ever wrote (before `Parent` was added).
const ATTR_MIN_LEN: usize = 63;

/// Encodes attributes as JuiceFS's `Attr.Marshal`, big-endian: flags u8,
/// type<<12|mode u16, uid, gid, atime s i64 + ns u32, mtime, ctime, nlink u32,
/// length u64, rdev u32, parent u64, then the access and default ACL ids
/// (u32 each) where either is set, then the storage tier where it is not
/// 0, in a buffer one byte longer than the fields (`tier`: the stored
/// value's, [`attr_tier`], kept so a rewrite loses nothing).
pub(super) fn encode_attr(a: &Attr, tier: u8) -> Vec<u8> {
    let mut b = Vec::with_capacity(ATTR_ACL_END + 2);
    b.push(a.flags);
    b.extend_from_slice(&(((a.typ as u16) << 12) | (a.mode & 0o7777)).to_be_bytes());
    b.extend_from_slice(&a.uid.to_be_bytes());
    b.extend_from_slice(&a.gid.to_be_bytes());
    for t in [a.atime, a.mtime, a.ctime] {
        b.extend_from_slice(&t.secs.to_be_bytes());
        b.extend_from_slice(&t.nsecs.to_be_bytes());
    }
    b.extend_from_slice(&a.nlink.to_be_bytes());
    b.extend_from_slice(&a.length.to_be_bytes());
    b.extend_from_slice(&a.rdev.to_be_bytes());
    b.extend_from_slice(&a.parent.to_be_bytes());
    if a.access_acl | a.default_acl != 0 {
        b.extend_from_slice(&a.access_acl.to_be_bytes());
        b.extend_from_slice(&a.default_acl.to_be_bytes());
    }
    if tier != 0 {
        b.push(tier);
    }
    b.push(0);
    b
}

/// The storage tier a stored attribute carries (0 when it has none), as
/// JuiceFS's `Attr.Unmarshal` reads it: after the ACL ids where at least 8
/// bytes follow the fixed fields, else right after them.
pub(super) fn attr_tier(raw: &[u8]) -> u8 {
    if raw.len() >= ATTR_ACL_END {
        raw.get(ATTR_ACL_END).copied().unwrap_or(0)
    } else {
        raw.get(ATTR_FIELDS_END).copied().unwrap_or(0)
    }
}

/// Decodes JuiceFS's attribute encoding; `None` when it is too short or the
/// type is unknown.
pub(super) fn decode_attr(b: &[u8]) -> Option<Attr> {
    if b.len() < ATTR_MIN_LEN {
        return None;
    }
    let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
    let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[i..i + 8]);
        u64::from_be_bytes(x)
    };
    let time_at = |i: usize| Timestamp {
        secs: u64_at(i) as i64,
        nsecs: u32_at(i + 8),
    };
    let mode = u16_at(1);
    let typ = FileType::from_code((mode >> 12) as u8)?;
    Some(Attr {
        flags: b[0],
        typ,
        mode: mode & 0o7777,
        uid: u32_at(3),
        gid: u32_at(7),
        atime: time_at(11),
        mtime: time_at(23),
        ctime: time_at(35),
        nlink: u32_at(47),
        length: u64_at(51),
        rdev: u32_at(59),
        parent: if b.len() >= ATTR_FIELDS_END {
            u64_at(63)
        } else {
            0
        },
        access_acl: if b.len() >= ATTR_ACL_END {
            u32_at(71)
        } else {
            0
        },
        default_acl: if b.len() >= ATTR_ACL_END {
            u32_at(75)
        } else {
            0
        },
        space: None,
    })
}

/// Encodes a directory entry value: the type code, then the inode (9 bytes).
pub(super) fn encode_entry(typ: FileType, ino: Ino) -> [u8; 9] {
    let mut b = [0u8; 9];
    b[0] = typ as u8;
    b[1..].copy_from_slice(&ino.to_be_bytes());
    b
}

/// Decodes a directory entry value into (type code, inode).
pub(super) fn decode_entry(b: &[u8]) -> Option<(u8, Ino)> {
    if b.len() != 9 {
        return None;
    }
    let mut ino = [0u8; 8];
    ino.copy_from_slice(&b[1..]);
    Some((b[0], u64::from_be_bytes(ino)))
}

/// Encodes the slices compaction keeps for the trash: (id u64, size u32)
/// big-endian, 12 bytes each, as JuiceFS's `delSlices` values.
pub(super) fn encode_delayed(slices: impl Iterator<Item = (u64, u32)>) -> Vec<u8> {
    let mut b = Vec::new();
    for (id, size) in slices {
        b.extend_from_slice(&id.to_be_bytes());
        b.extend_from_slice(&size.to_be_bytes());
    }
    b
}

/// Decodes a `delSlices` value.
pub(super) fn decode_delayed(b: &[u8]) -> Vec<(u64, u32)> {
    b.chunks_exact(12)
        .map(|r| {
            let mut id = [0u8; 8];
            id.copy_from_slice(&r[..8]);
            (
                u64::from_be_bytes(id),
                u32::from_be_bytes([r[8], r[9], r[10], r[11]]),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Slice;

    fn sample() -> Attr {
        Attr {
            flags: 2,
            typ: FileType::File,
            mode: 0o4755,
            uid: 1000,
            gid: 100,
            rdev: 7,
            atime: Timestamp {
                secs: 0x0102_0304,
                nsecs: 5,
            },
            mtime: Timestamp { secs: 1, nsecs: 2 },
            ctime: Timestamp {
                secs: -1,
                nsecs: 999_999_999,
            },
            nlink: 3,
            length: 0x1_0000_0001,
            parent: 0x7FFF_FFFF_1000_0001,
            access_acl: 0,
            default_acl: 0,
            space: None,
        }
    }

    #[test]
    fn attr_bytes_match_juicefs_marshal() {
        let b = encode_attr(&sample(), 0);
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            2,                          // flags
            0x19, 0xED,                 // type 1 << 12 | 0o4755
            0, 0, 0x03, 0xE8,           // uid 1000
            0, 0, 0, 100,               // gid
            0, 0, 0, 0, 1, 2, 3, 4,     // atime
            0, 0, 0, 5,                 // atimensec
            0, 0, 0, 0, 0, 0, 0, 1,     // mtime
            0, 0, 0, 2,                 // mtimensec
            0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, // ctime -1
            0x3B, 0x9A, 0xC9, 0xFF,     // ctimensec 999999999
            0, 0, 0, 3,                 // nlink
            0, 0, 0, 1, 0, 0, 0, 1,     // length
            0, 0, 0, 7,                 // rdev
            0x7F, 0xFF, 0xFF, 0xFF, 0x10, 0, 0, 1, // parent
            0,                          // JuiceFS's buffer is 72 bytes
        ];
        assert_eq!(b, want);
        assert_eq!(b.len(), ATTR_LEN);
        assert_eq!(decode_attr(&b), Some(sample()));
    }

    #[test]
    fn acl_ids_and_tier_are_where_juicefs_puts_them() {
        let mut a = sample();
        a.access_acl = 9;
        a.default_acl = 10;
        let raw = encode_attr(&a, 0);
        assert_eq!(&raw[71..], &[0, 0, 0, 9, 0, 0, 0, 10, 0]);
        assert_eq!(decode_attr(&raw), Some(a.clone()));
        assert_eq!(attr_tier(&raw), 0);
        // A tier after the ACL ids, or after the fixed fields without them.
        let raw = encode_attr(&a, 3);
        assert_eq!(&raw[71..], &[0, 0, 0, 9, 0, 0, 0, 10, 3, 0]);
        assert_eq!(attr_tier(&raw), 3);
        assert_eq!(decode_attr(&raw), Some(a));
        let raw = encode_attr(&sample(), 2);
        assert_eq!(&raw[71..], &[2, 0]);
        assert_eq!(attr_tier(&raw), 2);
        assert_eq!(decode_attr(&raw), Some(sample()));
        assert_eq!(attr_tier(&encode_attr(&sample(), 0)), 0);
    }

    #[test]
    fn old_and_bad_attrs() {
        let b = encode_attr(&sample(), 0);
        // Before `Parent` existed attributes were 63 bytes.
        assert_eq!(decode_attr(&b[..63]).expect("old layout").parent, 0);
        assert!(decode_attr(&b[..62]).is_none());
        let mut bad = b.clone();
        bad[1] = 0xF0;
        assert!(decode_attr(&bad).is_none());
    }

    #[test]
    fn entries_are_type_then_inode() {
        let e = encode_entry(FileType::Directory, 0x0102_0304_0506_0708);
        assert_eq!(e, [2, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(decode_entry(&e), Some((2, 0x0102_0304_0506_0708)));
        assert!(decode_entry(&e[..8]).is_none());
    }

    #[test]
    fn slice_records_and_delayed_slices() {
        let s = Slice {
            pos: 1,
            id: 0x0203,
            size: 4,
            off: 5,
            len: 6,
        };
        #[rustfmt::skip]
        assert_eq!(
            s.encode(),
            [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 2, 3, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 6]
        );
        let d = encode_delayed([(7u64, 8u32), (9, 10)].into_iter());
        assert_eq!(
            d,
            vec![
                0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 10
            ]
        );
        assert_eq!(decode_delayed(&d), vec![(7, 8), (9, 10)]);
    }
}
