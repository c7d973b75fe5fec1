//! Reply encoding: engine results → FUSE reply bytes.
//!
//! A reply is a [`ReplyHead`] — the `fuse_out_header` plus the operation's
//! fixed-size answer, at most [`MAX_REPLY_HEAD`] bytes on the stack — and,
//! for READ, READLINK, READDIR and the xattr calls, a variable payload that
//! the transport sends right after it from wherever it already lies
//! (`writev(head, data)` on `/dev/fuse`, guest memory for virtio-fs). The
//! header's length field counts the payload, so the head is built knowing
//! the payload's length but never copies it.
//!
//! Directory listings are packed by [`DirentPacker`] into a caller-owned
//! buffer with the kernel's 8-byte record alignment.

use std::mem::size_of;
use std::time::Duration;

use sluice_api::meta::{Attr, Entry, FileType, Ino, StatFs};
use zerocopy::IntoBytes;

use crate::abi::{self, AttrOut, Dirent, DirentPlus, EntryOut, FuseAttr, OutHeader};
use sluice_api::filesystem::{Listed, OpenOut};

/// The largest header + fixed reply: CREATE's `fuse_entry_out` and
/// `fuse_open_out` after the 16-byte header.
pub const MAX_REPLY_HEAD: usize =
    size_of::<OutHeader>() + size_of::<EntryOut>() + size_of::<abi::OpenOut>();

/// The block size reported in attributes and statfs.
pub const BLOCK_SIZE: u32 = 4096;

/// How long the kernel may cache names and attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Name → inode cache time (`entry_valid`).
    pub entry: Duration,
    /// Attribute cache time (`attr_valid`).
    pub attr: Duration,
}

impl Default for Timeouts {
    /// One second for both, JuiceFS's defaults.
    fn default() -> Timeouts {
        Timeouts {
            entry: Duration::from_secs(1),
            attr: Duration::from_secs(1),
        }
    }
}

/// The header and fixed part of one reply.
#[derive(Clone)]
pub struct ReplyHead {
    buf: [u8; MAX_REPLY_HEAD],
    len: usize,
}

impl std::fmt::Debug for ReplyHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyHead")
            .field("header", &self.header())
            .field("len", &self.len)
            .finish()
    }
}

impl ReplyHead {
    /// Builds a head from the header fields, the fixed parts and the length
    /// of the payload the transport will send after it. `payload_len` is
    /// bounded by the negotiated `max_read` (1 MiB), far below `u32::MAX`.
    fn build(unique: u64, error: i32, fixed: &[&[u8]], payload_len: usize) -> ReplyHead {
        let mut buf = [0u8; MAX_REPLY_HEAD];
        let mut len = size_of::<OutHeader>();
        for part in fixed {
            buf[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        let total = u32::try_from(len + payload_len).unwrap_or(u32::MAX);
        let header = OutHeader {
            len: total,
            error,
            unique,
        };
        buf[..size_of::<OutHeader>()].copy_from_slice(header.as_bytes());
        ReplyHead { buf, len }
    }

    /// An error reply carrying `errno` (a positive errno value; 0 is turned
    /// into EIO so that an error reply never reads as success).
    pub fn error(unique: u64, errno: i32) -> ReplyHead {
        let errno = if errno > 0 { errno } else { libc::EIO };
        ReplyHead::build(unique, -errno, &[], 0)
    }

    /// A success reply with nothing after the header.
    pub fn empty(unique: u64) -> ReplyHead {
        ReplyHead::build(unique, 0, &[], 0)
    }

    /// A success reply whose whole body is a `payload_len`-byte payload sent
    /// separately (READ, READLINK, READDIR, GETXATTR/LISTXATTR data).
    pub fn data(unique: u64, payload_len: usize) -> ReplyHead {
        ReplyHead::build(unique, 0, &[], payload_len)
    }

    /// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK.
    pub fn entry(unique: u64, entry: &EntryOut) -> ReplyHead {
        ReplyHead::build(unique, 0, &[entry.as_bytes()], 0)
    }

    /// GETATTR, SETATTR.
    pub fn attr(unique: u64, attr: &AttrOut) -> ReplyHead {
        ReplyHead::build(unique, 0, &[attr.as_bytes()], 0)
    }

    /// OPEN, OPENDIR.
    pub fn open(unique: u64, open: &abi::OpenOut) -> ReplyHead {
        ReplyHead::build(unique, 0, &[open.as_bytes()], 0)
    }

    /// CREATE.
    pub fn create(unique: u64, entry: &EntryOut, open: &abi::OpenOut) -> ReplyHead {
        ReplyHead::build(unique, 0, &[entry.as_bytes(), open.as_bytes()], 0)
    }

    /// WRITE.
    pub fn write(unique: u64, size: u32) -> ReplyHead {
        let out = abi::WriteOut { size, padding: 0 };
        ReplyHead::build(unique, 0, &[out.as_bytes()], 0)
    }

    /// STATFS.
    pub fn statfs(unique: u64, st: &abi::StatfsOut) -> ReplyHead {
        ReplyHead::build(unique, 0, &[st.as_bytes()], 0)
    }

    /// GETXATTR / LISTXATTR with a zero buffer size: the size needed.
    pub fn xattr_size(unique: u64, size: u32) -> ReplyHead {
        let out = abi::GetxattrOut { size, padding: 0 };
        ReplyHead::build(unique, 0, &[out.as_bytes()], 0)
    }

    /// LSEEK.
    pub fn lseek(unique: u64, offset: u64) -> ReplyHead {
        let out = abi::LseekOut { offset };
        ReplyHead::build(unique, 0, &[out.as_bytes()], 0)
    }

    /// INIT.
    pub fn init(unique: u64, init: &abi::InitOut) -> ReplyHead {
        ReplyHead::build(unique, 0, &[init.as_bytes()], 0)
    }

    /// The encoded bytes: header and fixed part.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The decoded header.
    pub fn header(&self) -> OutHeader {
        let mut h = OutHeader::default();
        h.as_mut_bytes()
            .copy_from_slice(&self.buf[..size_of::<OutHeader>()]);
        h
    }
}

/// Splits a duration into the (seconds, nanoseconds) pair FUSE uses.
fn valid(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// `fuse_attr` for node `ino`: the 512-byte block count of the bytes the
/// node stores (`Attr::blocks`: a file's holes do not count, so `du` adds
/// up what is stored: engine/DESIGN.md, "Space a file shows"), 4 KiB
/// preferred I/O size.
pub fn fuse_attr(ino: Ino, attr: &Attr) -> FuseAttr {
    FuseAttr {
        ino,
        size: attr.length,
        blocks: attr.blocks(),
        // Negative (pre-1970) times keep their two's-complement bits; the
        // kernel reads these fields as signed 64-bit seconds.
        atime: attr.atime.secs as u64,
        mtime: attr.mtime.secs as u64,
        ctime: attr.ctime.secs as u64,
        atimensec: attr.atime.nsecs,
        mtimensec: attr.mtime.nsecs,
        ctimensec: attr.ctime.nsecs,
        mode: attr.st_mode(),
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: BLOCK_SIZE,
        flags: 0,
    }
}

/// The generation of every node. A file handle the kernel builds is
/// (node id, generation); it must name one inode for that inode's whole
/// life and never a later one. Node ids are JuiceFS inode numbers, taken
/// from the volume's `nextInode` counter, which only grows (trash entries
/// likewise from `nextTrash`): a number is never given to a second inode,
/// so one constant generation suffices. The root's must be 0 (the kernel
/// warns and forces it otherwise).
pub const GENERATION: u64 = 0;

/// How long the kernel may keep `attr`. Not at all for a file with
/// setuid or setgid: the engine drops those bits on a write, truncate or
/// fallocate (HANDLE_KILLPRIV_V2), and the kernel, which refreshes only
/// size and times after a write, would otherwise show the old mode until
/// the timeout (xfstests generic/683–685). Such files are rare, so the
/// extra GETATTRs cost nothing in practice, and the rule needs no
/// notification channel (virtio-fs has none).
fn attr_valid(attr: &Attr, t: &Timeouts) -> (u64, u32) {
    if attr.typ != FileType::Directory && attr.mode & 0o6000 != 0 {
        (0, 0)
    } else {
        valid(t.attr)
    }
}

/// `fuse_entry_out` for an entry.
pub fn entry_out(entry: &Entry, t: &Timeouts) -> EntryOut {
    let (entry_valid, entry_valid_nsec) = valid(t.entry);
    let (attr_valid, attr_valid_nsec) = attr_valid(&entry.attr, t);
    EntryOut {
        nodeid: entry.inode,
        generation: GENERATION,
        entry_valid,
        attr_valid,
        entry_valid_nsec,
        attr_valid_nsec,
        attr: fuse_attr(entry.inode, &entry.attr),
    }
}

/// `fuse_attr_out` for node `ino`.
pub fn attr_out(ino: Ino, attr: &Attr, t: &Timeouts) -> AttrOut {
    let (attr_valid, attr_valid_nsec) = attr_valid(attr, t);
    AttrOut {
        attr_valid,
        attr_valid_nsec,
        dummy: 0,
        attr: fuse_attr(ino, attr),
    }
}

/// `fuse_open_out` for an opened file.
pub fn open_out(open: &OpenOut) -> abi::OpenOut {
    let mut flags = 0;
    if open.keep_cache {
        flags |= abi::fopen::KEEP_CACHE;
    }
    if open.direct_io {
        flags |= abi::fopen::DIRECT_IO;
    }
    abi::OpenOut {
        fh: open.fh,
        open_flags: flags,
        padding: 0,
    }
}

/// `fuse_statfs_out`, in 4 KiB blocks.
pub fn statfs_out(st: &StatFs) -> abi::StatfsOut {
    let bsize = u64::from(BLOCK_SIZE);
    abi::StatfsOut {
        st: abi::FuseKstatfs {
            blocks: st.total_space / bsize,
            bfree: st.avail_space / bsize,
            bavail: st.avail_space / bsize,
            files: st.used_inodes.saturating_add(st.avail_inodes),
            ffree: st.avail_inodes,
            bsize: BLOCK_SIZE,
            namelen: sluice_api::meta::MAX_NAME_LEN as u32,
            frsize: BLOCK_SIZE,
            padding: 0,
            spare: [0; 6],
        },
    }
}

/// The `DT_*` directory-entry type of an attribute (`S_IFMT` bits >> 12).
pub fn dirent_type(attr: &Attr) -> u32 {
    (attr.typ.mode_bits() & libc::S_IFMT) >> 12
}

/// Packs directory entries into a READDIR / READDIRPLUS payload of at most
/// `max` bytes, each record padded to 8 bytes as the kernel requires.
#[derive(Debug)]
pub struct DirentPacker<'b> {
    buf: &'b mut Vec<u8>,
    max: usize,
}

impl<'b> DirentPacker<'b> {
    /// Starts an empty payload in `buf` (its old contents are dropped).
    pub fn new(buf: &'b mut Vec<u8>, max: usize) -> DirentPacker<'b> {
        buf.clear();
        DirentPacker { buf, max }
    }

    fn append(&mut self, fixed: &[u8], name: &[u8]) -> bool {
        let rec = abi::dirent_align(fixed.len() + name.len());
        if self.buf.len() + rec > self.max {
            return false;
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(fixed);
        self.buf.extend_from_slice(name);
        self.buf.resize(start + rec, 0);
        true
    }

    /// Adds a READDIR record; `false` (and nothing added) when it does not
    /// fit. `off` is the offset of the entry after this one.
    pub fn push(&mut self, ino: Ino, off: u64, typ: u32, name: &[u8]) -> bool {
        let d = Dirent {
            ino,
            off,
            namelen: name.len() as u32,
            typ,
        };
        self.append(d.as_bytes(), name)
    }

    /// Adds a READDIRPLUS record; `false` (and nothing added) when it does
    /// not fit. A [`Listed::NameOnly`] record carries node id 0 and no
    /// attributes, so the kernel takes no reference for it.
    pub fn push_plus(&mut self, entry: &Entry, listed: Listed, off: u64, t: &Timeouts) -> bool {
        let entry_out = match listed {
            Listed::Node => entry_out(entry, t),
            Listed::NameOnly => EntryOut::default(),
        };
        let d = DirentPlus {
            entry_out,
            dirent: Dirent {
                ino: entry.inode,
                off,
                namelen: entry.name.len() as u32,
                typ: dirent_type(&entry.attr),
            },
        };
        self.append(d.as_bytes(), &entry.name)
    }

    /// Bytes packed so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing is packed.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sluice_api::meta::{FileType, Timestamp};
    use zerocopy::FromBytes;

    pub(crate) fn attr(typ: FileType, length: u64) -> Attr {
        Attr {
            flags: 0,
            typ,
            mode: 0o644,
            uid: 1000,
            gid: 100,
            rdev: 0,
            atime: Timestamp { secs: 10, nsecs: 1 },
            mtime: Timestamp { secs: 20, nsecs: 2 },
            ctime: Timestamp { secs: 30, nsecs: 3 },
            nlink: 1,
            length,
            parent: 1,
            access_acl: 0,
            default_acl: 0,
            space: None,
        }
    }

    #[test]
    fn error_reply_golden_bytes() {
        let h = ReplyHead::error(0x0102_0304_0506_0708, libc::ENOENT);
        let mut want = Vec::new();
        want.extend_from_slice(&16u32.to_ne_bytes());
        want.extend_from_slice(&(-libc::ENOENT).to_ne_bytes());
        want.extend_from_slice(&0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(h.as_bytes(), &want[..]);
        // errno 0 never reads as success.
        assert_eq!(ReplyHead::error(1, 0).header().error, -libc::EIO);
    }

    #[test]
    fn data_reply_counts_the_payload() {
        let h = ReplyHead::data(5, 4096);
        assert_eq!(h.as_bytes().len(), 16);
        assert_eq!(h.header().len, 16 + 4096);
        assert_eq!(h.header().error, 0);
    }

    #[test]
    fn set_id_files_are_never_cached() {
        let t = Timeouts {
            entry: Duration::from_secs(1),
            attr: Duration::from_secs(1),
        };
        let mut a = attr(FileType::File, 1);
        assert_eq!(attr_out(5, &a, &t).attr_valid, 1);
        for bits in [0o4000, 0o2000, 0o6000] {
            a.mode = 0o755 | bits;
            assert_eq!(attr_out(5, &a, &t).attr_valid, 0, "{bits:o}");
            let e = Entry {
                inode: 5,
                name: b"f".to_vec(),
                attr: a.clone(),
            };
            let out = entry_out(&e, &t);
            assert_eq!(
                (out.attr_valid, out.attr_valid_nsec, out.entry_valid),
                (0, 0, 1)
            );
        }
        // A setgid directory (group inheritance) is cached as any other.
        let mut d = attr(FileType::Directory, 0);
        d.mode = 0o2775;
        assert_eq!(attr_out(5, &d, &t).attr_valid, 1);
    }

    #[test]
    fn entry_reply_golden_layout() {
        let e = Entry {
            inode: 77,
            name: b"f".to_vec(),
            attr: attr(FileType::File, 1025),
        };
        let t = Timeouts {
            entry: Duration::from_millis(1500),
            attr: Duration::from_secs(2),
        };
        let h = ReplyHead::entry(9, &entry_out(&e, &t));
        let b = h.as_bytes();
        assert_eq!(b.len(), 16 + 128);
        assert_eq!(h.header().len, 144);
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let body = 16;
        assert_eq!(u64_at(body), 77); // nodeid
        assert_eq!(u64_at(body + 16), 1); // entry_valid
        assert_eq!(u64_at(body + 24), 2); // attr_valid
        assert_eq!(u32_at(body + 32), 500_000_000); // entry_valid_nsec
        let a = body + 40;
        assert_eq!(u64_at(a), 77); // ino
        assert_eq!(u64_at(a + 8), 1025); // size
        assert_eq!(u64_at(a + 16), 3); // blocks = ceil(1025 / 512)
        assert_eq!(u64_at(a + 24), 10); // atime
        assert_eq!(u64_at(a + 40), 30); // ctime
        assert_eq!(u32_at(a + 52), 2); // mtimensec
        assert_eq!(u32_at(a + 60), libc::S_IFREG | 0o644); // mode
        assert_eq!(u32_at(a + 64), 1); // nlink
        assert_eq!(u32_at(a + 68), 1000); // uid
        assert_eq!(u32_at(a + 80), 4096); // blksize
    }

    #[test]
    fn create_reply_is_entry_then_open() {
        let e = Entry {
            inode: 3,
            name: b"x".to_vec(),
            attr: attr(FileType::File, 0),
        };
        let o = OpenOut {
            fh: 11,
            attr: e.attr.clone(),
            keep_cache: true,
            direct_io: false,
        };
        let h = ReplyHead::create(1, &entry_out(&e, &Timeouts::default()), &open_out(&o));
        assert_eq!(h.as_bytes().len(), MAX_REPLY_HEAD);
        let open = abi::OpenOut::read_from_bytes(&h.as_bytes()[16 + 128..]).unwrap();
        assert_eq!(open.fh, 11);
        assert_eq!(open.open_flags, abi::fopen::KEEP_CACHE);
    }

    #[test]
    fn statfs_in_blocks() {
        let st = StatFs {
            total_space: 1 << 40,
            avail_space: (1 << 30) + 5,
            used_inodes: 10,
            avail_inodes: 90,
        };
        let out = statfs_out(&st);
        assert_eq!(out.st.blocks, (1 << 40) / 4096);
        assert_eq!(out.st.bavail, (1 << 30) / 4096);
        assert_eq!(out.st.files, 100);
        assert_eq!(out.st.ffree, 90);
        assert_eq!(out.st.namelen, 255);
        assert_eq!(ReplyHead::statfs(1, &out).header().len, 16 + 80);
    }

    #[test]
    fn readdir_packing_aligns_and_stops_when_full() {
        let mut buf = Vec::new();
        // Records: 24 + 1 -> 32, 24 + 8 -> 32, 24 + 9 -> 40.
        let mut p = DirentPacker::new(&mut buf, 100);
        assert!(p.push(1, 1, 4, b"."));
        assert!(p.push(2, 2, 8, b"abcdefgh"));
        assert_eq!(p.len(), 64);
        assert!(!p.push(3, 3, 8, b"abcdefghi"), "40 more bytes exceed 100");
        assert_eq!(p.len(), 64, "a refused record adds nothing");
        assert!(p.push(3, 3, 8, b"x"));
        assert_eq!(p.len(), 96);
        let d = Dirent::read_from_prefix(&buf[32..]).unwrap().0;
        assert_eq!((d.ino, d.off, d.namelen, d.typ), (2, 2, 8, 8));
        assert_eq!(&buf[32 + 24..32 + 32], b"abcdefgh");
        // Padding bytes are zero.
        assert_eq!(&buf[25..32], &[0u8; 7]);
    }

    #[test]
    fn readdirplus_packing() {
        let mut buf = Vec::new();
        let e = Entry {
            inode: 12,
            name: b"dir".to_vec(),
            attr: attr(FileType::Directory, 4096),
        };
        let mut p = DirentPacker::new(&mut buf, 4096);
        assert!(p.push_plus(&e, Listed::Node, 3, &Timeouts::default()));
        assert_eq!(p.len(), 160); // 152 + 3 rounded to 8
        let (d, rest) = DirentPlus::read_from_prefix(&buf).unwrap();
        assert_eq!(d.entry_out.nodeid, 12);
        assert_eq!(d.entry_out.attr.mode, libc::S_IFDIR | 0o644);
        assert_eq!(d.dirent.typ, u32::from(libc::DT_DIR));
        assert_eq!(d.dirent.off, 3);
        assert_eq!(&rest[..3], b"dir");
        let mut p = DirentPacker::new(&mut buf, 159);
        assert!(!p.push_plus(&e, Listed::Node, 3, &Timeouts::default()));
        assert!(p.is_empty());
        // By name only: node id 0 (the kernel takes no reference), the
        // dirent still names the inode and its type.
        let mut p = DirentPacker::new(&mut buf, 4096);
        assert!(p.push_plus(&e, Listed::NameOnly, 4, &Timeouts::default()));
        let (d, rest) = DirentPlus::read_from_prefix(&buf).unwrap();
        assert_eq!(d.entry_out.nodeid, 0);
        assert_eq!(d.entry_out.entry_valid, 0);
        assert_eq!(d.dirent.ino, 12);
        assert_eq!(d.dirent.typ, u32::from(libc::DT_DIR));
        assert_eq!(&rest[..3], b"dir");
    }

    #[test]
    fn dirent_types_match_dt_constants() {
        assert_eq!(
            dirent_type(&attr(FileType::File, 0)),
            u32::from(libc::DT_REG)
        );
        assert_eq!(
            dirent_type(&attr(FileType::Symlink, 0)),
            u32::from(libc::DT_LNK)
        );
        assert_eq!(
            dirent_type(&attr(FileType::Fifo, 0)),
            u32::from(libc::DT_FIFO)
        );
        assert_eq!(
            dirent_type(&attr(FileType::Socket, 0)),
            u32::from(libc::DT_SOCK)
        );
        assert_eq!(
            dirent_type(&attr(FileType::CharDev, 0)),
            u32::from(libc::DT_CHR)
        );
        assert_eq!(
            dirent_type(&attr(FileType::BlockDev, 0)),
            u32::from(libc::DT_BLK)
        );
    }
}
