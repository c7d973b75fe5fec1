//! The records of JuiceFS's JSON dump and its string escaping.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::meta::FileType;

/// `Counters`, with JuiceFS's field names (`nextInodes` has its `s`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedCounters {
    #[serde(rename = "usedSpace")]
    pub used_space: i64,
    #[serde(rename = "usedInodes")]
    pub used_inodes: i64,
    #[serde(rename = "nextInodes")]
    pub next_inode: i64,
    #[serde(rename = "nextChunk")]
    pub next_chunk: i64,
    #[serde(rename = "nextSession")]
    pub next_session: i64,
    #[serde(rename = "nextTrash")]
    pub next_trash: i64,
    /// Deprecated by JuiceFS, always 0; read and dropped.
    #[serde(
        rename = "nextCleanupSlices",
        default,
        skip_serializing_if = "is_zero_i64"
    )]
    pub next_cleanup_slices: i64,
    /// Deprecated by JuiceFS, always 0; read and dropped.
    #[serde(rename = "lastChangelog", default, skip_serializing_if = "is_zero_i64")]
    pub last_changelog: i64,
}

/// A node's attributes (`attr`). The length is 0 for anything but a
/// regular file; a load derives the others' lengths.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedAttr {
    pub inode: u64,
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub flags: u8,
    #[serde(rename = "type")]
    pub typ: String,
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub atimensec: u32,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub mtimensec: u32,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub ctimensec: u32,
    pub nlink: u32,
    #[serde(default)]
    pub length: u64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub rdev: u32,
    /// JuiceFS's storage tier (newer than 1.4's dumps); only 0 is served.
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub tier: u8,
}

/// One slice record of a chunk; `pos` and `off` are left out when 0.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedSlice {
    /// The slice id under its pre-1.0 name; read, never written.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub chunkid: u64,
    #[serde(default)]
    pub id: u64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub pos: u32,
    pub size: u32,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub off: u32,
    pub len: u32,
}

/// A chunk: its index and slice list.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedChunk {
    pub index: u32,
    pub slices: Vec<DumpedSlice>,
}

/// An extended attribute; the value is escaped.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedXattr {
    pub name: String,
    pub value: String,
}

/// One named entry of a dumped POSIX ACL.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedAclEntry {
    pub id: u32,
    pub perm: u16,
}

/// A POSIX ACL as JuiceFS dumps it (`posix_acl_access`,
/// `posix_acl_default`): the perms, 65535 where unset, and the named users
/// and groups (`null` when there are none).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedAcl {
    pub owner: u16,
    pub group: u16,
    pub other: u16,
    pub mask: u16,
    pub users: Option<Vec<DumpedAclEntry>>,
    pub groups: Option<Vec<DumpedAclEntry>>,
}

impl DumpedAcl {
    pub(super) fn of(rule: &crate::meta::acl::Rule) -> DumpedAcl {
        let list = |l: &[crate::meta::acl::AclEntry]| {
            (!l.is_empty()).then(|| {
                l.iter()
                    .map(|e| DumpedAclEntry {
                        id: e.id,
                        perm: e.perm,
                    })
                    .collect()
            })
        };
        DumpedAcl {
            owner: rule.owner,
            group: rule.group,
            other: rule.other,
            mask: rule.mask,
            users: list(&rule.named_users),
            groups: list(&rule.named_groups),
        }
    }

    /// The rule, its named entries sorted; too many entries is an error.
    pub(super) fn rule(&self) -> crate::error::Result<crate::meta::acl::Rule> {
        use crate::meta::acl::{AclEntry, MAX_ENTRIES};
        let list = |l: &Option<Vec<DumpedAclEntry>>| -> crate::error::Result<Vec<AclEntry>> {
            let l = l.as_deref().unwrap_or_default();
            if l.len() > MAX_ENTRIES {
                return Err(crate::error::Error::Invalid(format!(
                    "a POSIX ACL with {} entries (at most {MAX_ENTRIES})",
                    l.len()
                )));
            }
            let mut v: Vec<AclEntry> = l
                .iter()
                .map(|e| AclEntry {
                    id: e.id,
                    perm: e.perm,
                })
                .collect();
            v.sort_unstable();
            Ok(v)
        };
        Ok(crate::meta::acl::Rule {
            owner: self.owner,
            group: self.group,
            mask: self.mask,
            other: self.other,
            named_users: list(&self.users)?,
            named_groups: list(&self.groups)?,
        })
    }
}

/// A directory quota's limits (the usage is recomputed by a load).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedQuota {
    #[serde(rename = "maxSpace")]
    pub max_space: i64,
    #[serde(rename = "maxInodes")]
    pub max_inodes: i64,
}

/// A file pending deletion (`DelFiles`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedDelFile {
    pub inode: u64,
    pub length: u64,
    pub expire: i64,
}

/// Files a session keeps open after their unlink (`Sustained`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpedSustained {
    pub sid: u64,
    pub inodes: Vec<u64>,
}

fn is_zero_u8(v: &u8) -> bool {
    *v == 0
}
fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}
fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// JuiceFS's name for a node type.
pub(super) fn type_name(t: FileType) -> &'static str {
    match t {
        FileType::File => "regular",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "fifo",
        FileType::BlockDev => "blockdev",
        FileType::CharDev => "chardev",
        FileType::Socket => "socket",
    }
}

/// The node type JuiceFS names `name`.
pub(super) fn type_from_name(name: &str) -> Option<FileType> {
    Some(match name {
        "regular" => FileType::File,
        "directory" => FileType::Directory,
        "symlink" => FileType::Symlink,
        "fifo" => FileType::Fifo,
        "blockdev" => FileType::BlockDev,
        "chardev" => FileType::CharDev,
        "socket" => FileType::Socket,
        _ => return None,
    })
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escaped(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        out.push('%');
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0xF)] as char);
    }
}

/// JuiceFS's escaping of names, symlink targets and xattr values: bytes
/// that are not UTF-8, control characters, `%`, `"`, `\` (and U+FFFD, which
/// JuiceFS cannot tell from a bad byte) become `%XX`; the result needs no
/// further JSON escaping. Text with none of them is returned as it is.
pub(super) fn escape(bytes: &[u8]) -> Cow<'_, str> {
    let needs = |c: char| c < ' ' || matches!(c, '%' | '"' | '\\' | '\u{FFFD}');
    if let Ok(s) = std::str::from_utf8(bytes)
        && !s.chars().any(needs)
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(bytes.len() * 2);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if needs(c) {
                let mut buf = [0u8; 4];
                push_escaped(&mut out, c.encode_utf8(&mut buf).as_bytes());
            } else {
                out.push(c);
            }
        }
        push_escaped(&mut out, chunk.invalid());
    }
    Cow::Owned(out)
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Reverses [`escape`] as JuiceFS does: `%XX` (upper-case hex) is a byte;
/// a `%` not followed by two such digits stays itself.
pub(super) fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    if !b.contains(&b'%') {
        return b.to_vec();
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex_value(b[i + 1]), hex_value(b[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_round_trips_any_bytes_and_leaves_plain_text_alone() {
        assert!(matches!(escape(b"plain name.txt"), Cow::Borrowed(_)));
        assert_eq!(escape("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(escape(b"a%b\"c\\d\ne"), "a%25b%22c%5Cd%0Ae");
        assert_eq!(escape(b"bad\xff\xfe"), "bad%FF%FE");
        assert_eq!(escape("\u{FFFD}".as_bytes()), "%EF%BF%BD");
        for sample in [
            &b"x%"[..],
            b"%41",
            b"\xc3",
            b"\x00\x01\x7f",
            "\u{FFFD}z\u{1F600}".as_bytes(),
            b"end%2",
        ] {
            assert_eq!(unescape(&escape(sample)), sample, "{sample:?}");
        }
        // JuiceFS's reading: only upper-case pairs are escapes.
        assert_eq!(unescape("%zz%4a%41"), b"%zz%4aA");
    }

    #[test]
    fn type_names_are_juicefs_names() {
        for t in [
            FileType::File,
            FileType::Directory,
            FileType::Symlink,
            FileType::Fifo,
            FileType::BlockDev,
            FileType::CharDev,
            FileType::Socket,
        ] {
            assert_eq!(type_from_name(type_name(t)), Some(t));
        }
        assert_eq!(type_from_name("file"), None);
    }
}
