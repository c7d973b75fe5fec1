//! The node and request types the file-system operations speak in: inode
//! numbers, attributes, directory entries, credentials, and the arguments of
//! setattr, rename, setxattr and copy_file_range. The engine re-exports them
//! as `sluice_engine::meta::*`, where its metadata engines use them.

/// An inode number. JuiceFS's root is 1.
pub type Ino = u64;

/// The root directory's inode.
pub const ROOT_INO: Ino = 1;
/// The longest name a directory entry may have.
pub const MAX_NAME_LEN: usize = 255;

/// The type of a node, with JuiceFS's numeric codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileType {
    /// A regular file.
    File = 1,
    /// A directory.
    Directory = 2,
    /// A symbolic link.
    Symlink = 3,
    /// A named pipe.
    Fifo = 4,
    /// A block device.
    BlockDev = 5,
    /// A character device.
    CharDev = 6,
    /// A unix socket.
    Socket = 7,
}

impl FileType {
    /// The type for JuiceFS's numeric code.
    pub fn from_code(code: u8) -> Option<FileType> {
        Some(match code {
            1 => FileType::File,
            2 => FileType::Directory,
            3 => FileType::Symlink,
            4 => FileType::Fifo,
            5 => FileType::BlockDev,
            6 => FileType::CharDev,
            7 => FileType::Socket,
            _ => return None,
        })
    }

    /// The `S_IF*` bits of `st_mode` for this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::File => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::BlockDev => libc::S_IFBLK,
            FileType::CharDev => libc::S_IFCHR,
            FileType::Socket => libc::S_IFSOCK,
        }
    }

    /// The type named by the `S_IF*` bits of a mode, if any.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::File,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFBLK => FileType::BlockDev,
            libc::S_IFCHR => FileType::CharDev,
            libc::S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }
}

/// A point in time: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Timestamp {
    /// Whole seconds since the epoch.
    pub secs: i64,
    /// Nanoseconds within the second (0..1e9).
    pub nsecs: u32,
}

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Timestamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            secs: d.as_secs() as i64,
            nsecs: d.subsec_nanos(),
        }
    }
}

/// The attributes of a node, as JuiceFS keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// JuiceFS node flags (immutable, append-only, ...).
    pub flags: u8,
    /// The node type.
    pub typ: FileType,
    /// Permission bits, including setuid/setgid/sticky (no type bits).
    pub mode: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number for device nodes.
    pub rdev: u32,
    /// Last access.
    pub atime: Timestamp,
    /// Last data modification.
    pub mtime: Timestamp,
    /// Last attribute change.
    pub ctime: Timestamp,
    /// Number of hard links (for a directory: 2 + subdirectories).
    pub nlink: u32,
    /// Length in bytes of a regular file (of a symlink: its target; of a
    /// directory: JuiceFS's nominal 4096).
    pub length: u64,
    /// The parent directory; 0 when the node has several parents (hard links).
    pub parent: Ino,
    /// The id of the node's access ACL (JuiceFS `AccessACL`); 0 = none, the
    /// mode alone decides.
    pub access_acl: u32,
    /// The id of a directory's default ACL (JuiceFS `DefaultACL`); 0 = none.
    pub default_acl: u32,
    /// For a regular file that holds fewer bytes than its length (holes
    /// never written, or punched): the bytes its data covers at most, which
    /// is what `st_blocks` shows. None: as many as its length (a file
    /// without holes, or one whose count is not known: JuiceFS keeps none).
    /// Kept by sluice beside the node, not in JuiceFS's record of it (see
    /// engine/DESIGN.md, "Space a file shows").
    pub space: Option<u64>,
}

impl Attr {
    /// `st_mode`: type bits plus permission bits.
    pub fn st_mode(&self) -> u32 {
        self.typ.mode_bits() | u32::from(self.mode)
    }

    /// The bytes the node's data takes: [`Attr::space`] where it is known
    /// to be less than the length, the length otherwise.
    pub fn stored(&self) -> u64 {
        self.space.map_or(self.length, |s| s.min(self.length))
    }

    /// `st_blocks`: [`Attr::stored`] in 512-byte units, rounded up.
    pub fn blocks(&self) -> u64 {
        self.stored().div_ceil(512)
    }
}

/// A directory entry with the attributes of the node it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The node's inode.
    pub inode: Ino,
    /// The entry's name (bytes: names need not be UTF-8).
    pub name: Vec<u8>,
    /// The node's attributes.
    pub attr: Attr,
}

/// Who is asking: the caller's credentials, for permission checks and for
/// the owner of new nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups (may be empty when the transport doesn't say).
    pub gids: Vec<u32>,
    /// The calling process.
    pub pid: u32,
    /// Whether permission checks are skipped (internal maintenance work).
    pub privileged: bool,
    /// Whether the kernel that sent the request has already checked the
    /// caller's permission to do it, with the caller's full credentials
    /// (supplementary groups included, which FUSE does not pass on): a
    /// session that negotiated `FUSE_POSIX_ACL`, which makes the kernel
    /// check as `default_permissions` does. The engine then skips its own
    /// mode and ACL check ([`Context::gids`] being empty would refuse what
    /// the kernel rightly allowed), and keeps every other rule (sticky
    /// directories, immutable and append-only flags, ownership for
    /// setattr and ACL changes, the trash).
    pub kernel_checked: bool,
}

impl Context {
    /// A context for the engine's own maintenance work (root, no checks).
    pub fn internal() -> Context {
        Context {
            privileged: true,
            ..Context::default()
        }
    }
}

/// A time change requested by setattr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeChange {
    /// Set to this time.
    At(Timestamp),
    /// Set to the current time.
    Now,
}

/// The fields a setattr changes; `None` leaves a field as it is. A size change
/// goes through the engine's truncate, not here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u16>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time.
    pub atime: Option<TimeChange>,
    /// New modification time.
    pub mtime: Option<TimeChange>,
    /// Clear the setuid/setgid bits of a regular file as a change of its
    /// data by the caller does (Linux's `file_remove_privs`: setuid always,
    /// setgid when group-executable or the caller is not in the file's
    /// group; nothing for root). Set by the Vfs alongside a write,
    /// truncate or fallocate the caller was allowed to make, never from a
    /// request alone.
    pub kill_suidgid: bool,
}

/// Flags of a rename (Linux `renameat2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenameFlags {
    /// Fail with `Exists` if the destination exists.
    pub noreplace: bool,
    /// Atomically swap source and destination (both must exist).
    pub exchange: bool,
}

/// How setxattr treats an existing or missing attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with `Exists` if it exists (`XATTR_CREATE`).
    Create,
    /// Fail with `NoXattr` if it is missing (`XATTR_REPLACE`).
    Replace,
}

/// Space and inode usage of the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Total bytes (capacity quota, or a large nominal number when unlimited).
    pub total_space: u64,
    /// Bytes still available.
    pub avail_space: u64,
    /// Inodes in use.
    pub used_inodes: u64,
    /// Inodes still available.
    pub avail_inodes: u64,
}

/// The most bytes one call copies. A shorter copy is allowed (callers loop
/// until done, as `cp` does); the bound keeps one transaction to at most 33
/// source and 34 destination chunks, and the count fits the 32-bit size of
/// FUSE's `fuse_write_out` reply. It is 32 of the engine's 64 MiB chunks
/// (the engine checks that at compile time).
pub const MAX_COPY_LEN: u64 = 32 * (64 << 20);

/// One copy request, as `copy_file_range(2)` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRange {
    /// The source file.
    pub fin: Ino,
    /// Where the copy starts in the source.
    pub off_in: u64,
    /// The destination file.
    pub fout: Ino,
    /// Where the copy lands in the destination.
    pub off_out: u64,
    /// Bytes asked for (the source's length bounds them).
    pub len: u64,
    /// `copy_file_range` flags; none are defined, so any is refused.
    pub flags: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_types_round_trip_through_codes_and_modes() {
        for code in 1..=7 {
            let t = FileType::from_code(code).unwrap();
            assert_eq!(t as u8, code);
            assert_eq!(FileType::from_mode(t.mode_bits() | 0o644), Some(t));
        }
        assert_eq!(FileType::from_code(0), None);
        assert_eq!(FileType::from_code(8), None);
        assert_eq!(FileType::from_mode(0o644), None);
    }

    #[test]
    fn st_mode_joins_type_and_permission_bits() {
        let a = Attr {
            flags: 0,
            typ: FileType::Directory,
            mode: 0o1777,
            uid: 0,
            gid: 0,
            rdev: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            nlink: 2,
            length: 4096,
            parent: ROOT_INO,
            access_acl: 0,
            default_acl: 0,
            space: None,
        };
        assert_eq!(a.st_mode(), libc::S_IFDIR | 0o1777);
    }
}
