//! The FUSE kernel ABI: the structs, opcodes and flags of
//! `include/uapi/linux/fuse.h` (protocol 7.38), written by hand.
//!
//! Every struct is `#[repr(C)]` with its padding spelled out as fields, so it
//! has no implicit padding and `zerocopy` can prove that reading one from any
//! byte slice and writing one out as bytes is sound (`FromBytes`/`IntoBytes`).
//! Reading copies the bytes out (`read_from_prefix`), so untrusted input is
//! never reinterpreted in place and alignment does not matter.
//!
//! FUSE messages are in the host's byte order (the kernel and the daemon
//! share one machine; for virtio-fs the guest and host architectures match,
//! and both x86_64 and aarch64 are little-endian), so the fields are native
//! integers.
//!
//! The tests at the bottom assert every struct's size against the C header.

// zerocopy's derives generate private helper types without Debug; every
// type written here derives Debug.
#![allow(missing_debug_implementations)]

use zerocopy::{FromBytes, Immutable, IntoBytes};

/// The protocol major version this crate speaks.
pub const KERNEL_VERSION: u32 = 7;
/// The newest protocol minor version this crate knows.
pub const KERNEL_MINOR_VERSION: u32 = 38;
/// The oldest minor version accepted at INIT: 7.28 (Linux 4.20) brought
/// `max_pages`, and everything else this crate relies on (readdirplus,
/// parallel dirops, rename2, lseek) is older.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 28;
/// The node id of the root directory.
pub const ROOT_ID: u64 = 1;
/// The smallest read buffer the kernel accepts on `/dev/fuse`.
pub const MIN_READ_BUFFER: usize = 8192;

/// FUSE request opcodes (`enum fuse_opcode`).
pub mod opcode {
    #![allow(missing_docs)]
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
}

/// `fuse_init_in.flags` / `fuse_init_out.flags` bits (the low 32 bits).
pub mod init_flags {
    #![allow(missing_docs)]
    pub const ASYNC_READ: u32 = 1 << 0;
    pub const POSIX_LOCKS: u32 = 1 << 1;
    pub const FILE_OPS: u32 = 1 << 2;
    pub const ATOMIC_O_TRUNC: u32 = 1 << 3;
    pub const EXPORT_SUPPORT: u32 = 1 << 4;
    pub const BIG_WRITES: u32 = 1 << 5;
    pub const DONT_MASK: u32 = 1 << 6;
    pub const SPLICE_WRITE: u32 = 1 << 7;
    pub const SPLICE_MOVE: u32 = 1 << 8;
    pub const SPLICE_READ: u32 = 1 << 9;
    pub const FLOCK_LOCKS: u32 = 1 << 10;
    pub const HAS_IOCTL_DIR: u32 = 1 << 11;
    pub const AUTO_INVAL_DATA: u32 = 1 << 12;
    pub const DO_READDIRPLUS: u32 = 1 << 13;
    pub const READDIRPLUS_AUTO: u32 = 1 << 14;
    pub const ASYNC_DIO: u32 = 1 << 15;
    pub const WRITEBACK_CACHE: u32 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u32 = 1 << 17;
    pub const PARALLEL_DIROPS: u32 = 1 << 18;
    pub const HANDLE_KILLPRIV: u32 = 1 << 19;
    pub const POSIX_ACL: u32 = 1 << 20;
    pub const ABORT_ERROR: u32 = 1 << 21;
    pub const MAX_PAGES: u32 = 1 << 22;
    pub const CACHE_SYMLINKS: u32 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u32 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u32 = 1 << 25;
    pub const MAP_ALIGNMENT: u32 = 1 << 26;
    pub const SUBMOUNTS: u32 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u32 = 1 << 28;
    pub const SETXATTR_EXT: u32 = 1 << 29;
    pub const INIT_EXT: u32 = 1 << 30;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    #![allow(missing_docs)]
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_write_in.write_flags`: the writer lacks CAP_FSETID, so the write
/// drops setuid/setgid (sent with `HANDLE_KILLPRIV_V2`, and on direct I/O).
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// `fuse_open_out.open_flags` bits.
pub mod fopen {
    #![allow(missing_docs)]
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
}

/// `fuse_fsync_in.fsync_flags`: sync data only (fdatasync).
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// `renameat2` flag: fail if the destination exists.
pub const RENAME_NOREPLACE: u32 = 1 << 0;
/// `renameat2` flag: swap source and destination.
pub const RENAME_EXCHANGE: u32 = 1 << 1;
/// `renameat2` flag: leave a whiteout (overlayfs); not supported.
pub const RENAME_WHITEOUT: u32 = 1 << 2;
/// `setxattr` flag: fail if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `setxattr` flag: fail if the attribute is missing.
pub const XATTR_REPLACE: u32 = 2;

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`. Attaches a fresh
/// `/dev/fuse` file to the connection of the fd passed as argument, so each
/// worker thread reads and replies on its own file.
pub const FUSE_DEV_IOC_CLONE: u64 = (2 << 30) | (4 << 16) | (229 << 8);

/// Derives the traits that make a struct readable from and writable to bytes.
macro_rules! abi_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty,)* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }
    };
}

abi_struct! {
    /// `struct fuse_attr`: a node's attributes as the kernel wants them.
    pub struct FuseAttr {
        /// Inode number.
        pub ino: u64,
        /// Length in bytes.
        pub size: u64,
        /// Allocated 512-byte blocks.
        pub blocks: u64,
        /// Access time, seconds.
        pub atime: u64,
        /// Modification time, seconds.
        pub mtime: u64,
        /// Change time, seconds.
        pub ctime: u64,
        /// Access time, nanoseconds.
        pub atimensec: u32,
        /// Modification time, nanoseconds.
        pub mtimensec: u32,
        /// Change time, nanoseconds.
        pub ctimensec: u32,
        /// `st_mode` (type and permission bits).
        pub mode: u32,
        /// Hard links.
        pub nlink: u32,
        /// Owner.
        pub uid: u32,
        /// Group.
        pub gid: u32,
        /// Device number.
        pub rdev: u32,
        /// Preferred I/O size.
        pub blksize: u32,
        /// `FUSE_ATTR_*` flags.
        pub flags: u32,
    }
}

abi_struct! {
    /// `struct fuse_kstatfs`.
    pub struct FuseKstatfs {
        /// Total blocks.
        pub blocks: u64,
        /// Free blocks.
        pub bfree: u64,
        /// Blocks available to unprivileged users.
        pub bavail: u64,
        /// Total inodes.
        pub files: u64,
        /// Free inodes.
        pub ffree: u64,
        /// Block size.
        pub bsize: u32,
        /// Longest name.
        pub namelen: u32,
        /// Fragment size.
        pub frsize: u32,
        /// Padding.
        pub padding: u32,
        /// Spare.
        pub spare: [u32; 6],
    }
}

abi_struct! {
    /// `struct fuse_in_header`: the start of every request.
    pub struct InHeader {
        /// Length of the whole request, header included.
        pub len: u32,
        /// The operation.
        pub opcode: u32,
        /// Request id, echoed in the reply.
        pub unique: u64,
        /// The node the operation is about.
        pub nodeid: u64,
        /// Caller's effective uid.
        pub uid: u32,
        /// Caller's effective gid.
        pub gid: u32,
        /// Caller's pid (thread group id).
        pub pid: u32,
        /// Length of request extensions after the arguments, in 8-byte units.
        pub total_extlen: u16,
        /// Padding.
        pub padding: u16,
    }
}

abi_struct! {
    /// `struct fuse_out_header`: the start of every reply.
    pub struct OutHeader {
        /// Length of the whole reply, header included.
        pub len: u32,
        /// 0, or a negated errno.
        pub error: i32,
        /// The request id this answers.
        pub unique: u64,
    }
}

abi_struct! {
    /// `struct fuse_entry_out`: the reply to LOOKUP and the creating operations.
    pub struct EntryOut {
        /// Inode number (0 = negative entry).
        pub nodeid: u64,
        /// Inode generation.
        pub generation: u64,
        /// Name cache timeout, seconds.
        pub entry_valid: u64,
        /// Attribute cache timeout, seconds.
        pub attr_valid: u64,
        /// Name cache timeout, nanoseconds.
        pub entry_valid_nsec: u32,
        /// Attribute cache timeout, nanoseconds.
        pub attr_valid_nsec: u32,
        /// The node's attributes.
        pub attr: FuseAttr,
    }
}

abi_struct! {
    /// `struct fuse_forget_in`.
    pub struct ForgetIn {
        /// How many lookups to forget.
        pub nlookup: u64,
    }
}

abi_struct! {
    /// `struct fuse_forget_one`: one entry of a BATCH_FORGET.
    pub struct ForgetOne {
        /// The node.
        pub nodeid: u64,
        /// How many lookups to forget.
        pub nlookup: u64,
    }
}

abi_struct! {
    /// `struct fuse_batch_forget_in`.
    pub struct BatchForgetIn {
        /// Number of `ForgetOne` records that follow.
        pub count: u32,
        /// Padding.
        pub dummy: u32,
    }
}

abi_struct! {
    /// `struct fuse_getattr_in`.
    pub struct GetattrIn {
        /// `FUSE_GETATTR_FH` when `fh` is valid.
        pub getattr_flags: u32,
        /// Padding.
        pub dummy: u32,
        /// File handle.
        pub fh: u64,
    }
}

abi_struct! {
    /// `struct fuse_attr_out`: the reply to GETATTR and SETATTR.
    pub struct AttrOut {
        /// Attribute cache timeout, seconds.
        pub attr_valid: u64,
        /// Attribute cache timeout, nanoseconds.
        pub attr_valid_nsec: u32,
        /// Padding.
        pub dummy: u32,
        /// The attributes.
        pub attr: FuseAttr,
    }
}

abi_struct! {
    /// `struct fuse_mknod_in`.
    pub struct MknodIn {
        /// `st_mode` of the new node.
        pub mode: u32,
        /// Device number.
        pub rdev: u32,
        /// The caller's umask.
        pub umask: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_mkdir_in`.
    pub struct MkdirIn {
        /// Mode of the new directory.
        pub mode: u32,
        /// The caller's umask.
        pub umask: u32,
    }
}

abi_struct! {
    /// `struct fuse_rename_in`.
    pub struct RenameIn {
        /// The destination directory.
        pub newdir: u64,
    }
}

abi_struct! {
    /// `struct fuse_rename2_in`.
    pub struct Rename2In {
        /// The destination directory.
        pub newdir: u64,
        /// `RENAME_*` flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_link_in`.
    pub struct LinkIn {
        /// The node to link.
        pub oldnodeid: u64,
    }
}

abi_struct! {
    /// `struct fuse_setattr_in`.
    pub struct SetattrIn {
        /// `FATTR_*` bits naming the valid fields.
        pub valid: u32,
        /// Padding.
        pub padding: u32,
        /// File handle (with `FATTR_FH`).
        pub fh: u64,
        /// New length.
        pub size: u64,
        /// Lock owner.
        pub lock_owner: u64,
        /// New access time, seconds.
        pub atime: u64,
        /// New modification time, seconds.
        pub mtime: u64,
        /// New change time, seconds.
        pub ctime: u64,
        /// New access time, nanoseconds.
        pub atimensec: u32,
        /// New modification time, nanoseconds.
        pub mtimensec: u32,
        /// New change time, nanoseconds.
        pub ctimensec: u32,
        /// New mode.
        pub mode: u32,
        /// Unused.
        pub unused4: u32,
        /// New owner.
        pub uid: u32,
        /// New group.
        pub gid: u32,
        /// Unused.
        pub unused5: u32,
    }
}

abi_struct! {
    /// `struct fuse_open_in`.
    pub struct OpenIn {
        /// `open(2)` flags.
        pub flags: u32,
        /// `FUSE_OPEN_*` flags.
        pub open_flags: u32,
    }
}

abi_struct! {
    /// `struct fuse_create_in`.
    pub struct CreateIn {
        /// `open(2)` flags.
        pub flags: u32,
        /// Mode of the new file.
        pub mode: u32,
        /// The caller's umask.
        pub umask: u32,
        /// `FUSE_OPEN_*` flags.
        pub open_flags: u32,
    }
}

abi_struct! {
    /// `struct fuse_open_out`.
    pub struct OpenOut {
        /// File handle.
        pub fh: u64,
        /// `FOPEN_*` flags.
        pub open_flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_release_in`.
    pub struct ReleaseIn {
        /// File handle.
        pub fh: u64,
        /// `open(2)` flags.
        pub flags: u32,
        /// `FUSE_RELEASE_*` flags.
        pub release_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
    }
}

abi_struct! {
    /// `struct fuse_flush_in`.
    pub struct FlushIn {
        /// File handle.
        pub fh: u64,
        /// Unused.
        pub unused: u32,
        /// Padding.
        pub padding: u32,
        /// Lock owner.
        pub lock_owner: u64,
    }
}

abi_struct! {
    /// `struct fuse_read_in` (also READDIR's argument).
    pub struct ReadIn {
        /// File handle.
        pub fh: u64,
        /// Offset.
        pub offset: u64,
        /// Bytes wanted.
        pub size: u32,
        /// `FUSE_READ_*` flags.
        pub read_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
        /// `open(2)` flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_write_in`; the data follows it.
    pub struct WriteIn {
        /// File handle.
        pub fh: u64,
        /// Offset.
        pub offset: u64,
        /// Bytes of data that follow.
        pub size: u32,
        /// `FUSE_WRITE_*` flags.
        pub write_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
        /// `open(2)` flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_write_out`.
    pub struct WriteOut {
        /// Bytes written.
        pub size: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_statfs_out`.
    pub struct StatfsOut {
        /// The numbers.
        pub st: FuseKstatfs,
    }
}

abi_struct! {
    /// `struct fuse_syncfs_in` (SYNCFS).
    pub struct SyncfsIn {
        /// Padding.
        pub padding: u64,
    }
}

abi_struct! {
    /// `struct fuse_fsync_in` (FSYNC and FSYNCDIR).
    pub struct FsyncIn {
        /// File handle.
        pub fh: u64,
        /// `FUSE_FSYNC_FDATASYNC`.
        pub fsync_flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// The first 8 bytes of `struct fuse_setxattr_in`
    /// (`FUSE_COMPAT_SETXATTR_IN_SIZE`): the layout the kernel sends unless
    /// `FUSE_SETXATTR_EXT` was negotiated, which this crate never does.
    pub struct SetxattrIn {
        /// Length of the value.
        pub size: u32,
        /// `XATTR_CREATE` / `XATTR_REPLACE`.
        pub flags: u32,
    }
}

abi_struct! {
    /// `struct fuse_getxattr_in` (GETXATTR and LISTXATTR).
    pub struct GetxattrIn {
        /// Size of the caller's buffer (0 = ask for the size).
        pub size: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_getxattr_out`: the size answer when the buffer size was 0.
    pub struct GetxattrOut {
        /// Size of the value (or of the name list).
        pub size: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_access_in`.
    pub struct AccessIn {
        /// `R_OK | W_OK | X_OK` or `F_OK`.
        pub mask: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// The first 16 bytes of `struct fuse_init_in`, which every protocol
    /// 7.x kernel sends.
    pub struct InitInCompat {
        /// Major version.
        pub major: u32,
        /// Minor version.
        pub minor: u32,
        /// Largest readahead the kernel will do.
        pub max_readahead: u32,
        /// `init_flags` the kernel supports.
        pub flags: u32,
    }
}

abi_struct! {
    /// `struct fuse_init_in` as sent by 7.36+ kernels.
    pub struct InitIn {
        /// Major version.
        pub major: u32,
        /// Minor version.
        pub minor: u32,
        /// Largest readahead the kernel will do.
        pub max_readahead: u32,
        /// `init_flags` the kernel supports.
        pub flags: u32,
        /// The high 32 flag bits (with `FUSE_INIT_EXT`).
        pub flags2: u32,
        /// Unused.
        pub unused: [u32; 11],
    }
}

abi_struct! {
    /// `struct fuse_init_out`.
    pub struct InitOut {
        /// Major version.
        pub major: u32,
        /// Minor version.
        pub minor: u32,
        /// Readahead to use.
        pub max_readahead: u32,
        /// `init_flags` agreed on.
        pub flags: u32,
        /// Most background (async) requests in flight.
        pub max_background: u16,
        /// Background requests at which the kernel throttles.
        pub congestion_threshold: u16,
        /// Largest WRITE payload.
        pub max_write: u32,
        /// Timestamp granularity in nanoseconds.
        pub time_gran: u32,
        /// Largest request in pages.
        pub max_pages: u16,
        /// DAX map alignment.
        pub map_alignment: u16,
        /// The high 32 flag bits.
        pub flags2: u32,
        /// Unused.
        pub unused: [u32; 7],
    }
}

abi_struct! {
    /// `struct fuse_interrupt_in`.
    pub struct InterruptIn {
        /// The interrupted request.
        pub unique: u64,
    }
}

abi_struct! {
    /// `struct fuse_fallocate_in`.
    pub struct FallocateIn {
        /// File handle.
        pub fh: u64,
        /// Offset.
        pub offset: u64,
        /// Length.
        pub length: u64,
        /// `FALLOC_FL_*` bits.
        pub mode: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_lseek_in`.
    pub struct LseekIn {
        /// File handle.
        pub fh: u64,
        /// Offset to start from.
        pub offset: u64,
        /// `SEEK_DATA` or `SEEK_HOLE`.
        pub whence: u32,
        /// Padding.
        pub padding: u32,
    }
}

abi_struct! {
    /// `struct fuse_lseek_out`.
    pub struct LseekOut {
        /// The resulting offset.
        pub offset: u64,
    }
}

abi_struct! {
    /// `struct fuse_copy_file_range_in`; the source is the header's node.
    /// Answered with a `fuse_write_out` holding the bytes copied.
    pub struct CopyFileRangeIn {
        /// Source file handle.
        pub fh_in: u64,
        /// Source offset.
        pub off_in: u64,
        /// Destination node id.
        pub nodeid_out: u64,
        /// Destination file handle.
        pub fh_out: u64,
        /// Destination offset.
        pub off_out: u64,
        /// Bytes to copy.
        pub len: u64,
        /// `copy_file_range(2)` flags (none are defined).
        pub flags: u64,
    }
}

abi_struct! {
    /// `struct fuse_dirent` without its trailing name.
    pub struct Dirent {
        /// Inode number.
        pub ino: u64,
        /// Offset of the next entry.
        pub off: u64,
        /// Length of the name that follows.
        pub namelen: u32,
        /// `DT_*` type.
        pub typ: u32,
    }
}

abi_struct! {
    /// `struct fuse_direntplus` without its trailing name.
    pub struct DirentPlus {
        /// The entry's lookup reply.
        pub entry_out: EntryOut,
        /// The directory entry.
        pub dirent: Dirent,
    }
}

/// `FUSE_DIRENT_ALIGN`: rounds a record length up to 8 bytes.
pub const fn dirent_align(len: usize) -> usize {
    (len + 7) & !7
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn struct_sizes_match_fuse_h() {
        assert_eq!(size_of::<FuseAttr>(), 88);
        assert_eq!(size_of::<FuseKstatfs>(), 80);
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        // FUSE_COMPAT_ENTRY_OUT_SIZE is 120 (pre-7.9); the full struct is 128.
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<ForgetIn>(), 8);
        assert_eq!(size_of::<ForgetOne>(), 16);
        assert_eq!(size_of::<BatchForgetIn>(), 8);
        assert_eq!(size_of::<GetattrIn>(), 16);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<MknodIn>(), 16);
        assert_eq!(size_of::<MkdirIn>(), 8);
        assert_eq!(size_of::<RenameIn>(), 8);
        assert_eq!(size_of::<Rename2In>(), 16);
        assert_eq!(size_of::<LinkIn>(), 8);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<OpenIn>(), 8);
        assert_eq!(size_of::<CreateIn>(), 16);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<ReleaseIn>(), 24);
        assert_eq!(size_of::<FlushIn>(), 24);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<WriteOut>(), 8);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<FsyncIn>(), 16);
        assert_eq!(size_of::<SetxattrIn>(), 8);
        assert_eq!(size_of::<GetxattrIn>(), 8);
        assert_eq!(size_of::<GetxattrOut>(), 8);
        assert_eq!(size_of::<AccessIn>(), 8);
        assert_eq!(size_of::<InitInCompat>(), 16);
        assert_eq!(size_of::<InitIn>(), 64);
        assert_eq!(size_of::<InitOut>(), 64);
        assert_eq!(size_of::<InterruptIn>(), 8);
        assert_eq!(size_of::<FallocateIn>(), 32);
        assert_eq!(size_of::<LseekIn>(), 24);
        assert_eq!(size_of::<LseekOut>(), 8);
        assert_eq!(size_of::<CopyFileRangeIn>(), 56);
        assert_eq!(size_of::<Dirent>(), 24);
        assert_eq!(size_of::<DirentPlus>(), 152);
    }

    #[test]
    fn field_offsets_match_fuse_h() {
        assert_eq!(offset_of!(FuseAttr, atimensec), 48);
        assert_eq!(offset_of!(FuseAttr, mode), 60);
        assert_eq!(offset_of!(FuseAttr, blksize), 80);
        assert_eq!(offset_of!(InHeader, unique), 8);
        assert_eq!(offset_of!(InHeader, nodeid), 16);
        assert_eq!(offset_of!(InHeader, pid), 32);
        assert_eq!(offset_of!(InHeader, total_extlen), 36);
        assert_eq!(offset_of!(EntryOut, attr), 40);
        assert_eq!(offset_of!(SetattrIn, atimensec), 56);
        assert_eq!(offset_of!(SetattrIn, uid), 76);
        assert_eq!(offset_of!(InitOut, max_background), 16);
        assert_eq!(offset_of!(InitOut, max_write), 20);
        assert_eq!(offset_of!(InitOut, max_pages), 28);
        assert_eq!(offset_of!(InitOut, flags2), 32);
        assert_eq!(offset_of!(DirentPlus, dirent), 128);
        assert_eq!(offset_of!(ReadIn, lock_owner), 24);
    }

    #[test]
    fn dev_ioc_clone_matches_the_ioctl_encoding() {
        // _IOR(229, 0, uint32_t) as computed by the C preprocessor on Linux.
        assert_eq!(FUSE_DEV_IOC_CLONE, 0x8004_e500);
    }

    #[test]
    fn dirent_alignment_rounds_up_to_eight() {
        assert_eq!(dirent_align(24), 24);
        assert_eq!(dirent_align(25), 32);
        assert_eq!(dirent_align(31), 32);
        assert_eq!(dirent_align(152 + 1), 160);
    }
}
