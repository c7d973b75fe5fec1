//! Request decoding: a FUSE message as bytes → a typed [`Request`].
//!
//! The decoder works on a contiguous `&[u8]` holding the header and the
//! arguments. A WRITE's data may either follow in the same slice (the
//! `/dev/fuse` case: one `read(2)` returns the whole message) or stay with
//! the transport (the virtio-fs case: the data stays in the guest's
//! descriptors, and the file system takes it from there through a
//! `sluice_api::WriteSource`), see [`Request::decode_split`] and
//! [`WriteData`].
//!
//! Every length is checked before it is used: the header's length against
//! the bytes that arrived, each argument against its struct, names against
//! their NUL terminator and the name rules, WRITE data against `max_write`,
//! READ/READDIR sizes against the largest reply allowed. Bad input yields a
//! [`BadRequest`] that says whether (and to which request id) an error
//! reply is owed; nothing here panics on any input.

use std::mem::size_of;

use sluice_api::meta::{Context, MAX_NAME_LEN, RenameFlags, XattrMode};
use zerocopy::FromBytes;

use crate::abi::{self, InHeader, opcode};

/// The longest symlink target accepted (Linux's `PATH_MAX` less the NUL).
pub const MAX_SYMLINK_LEN: usize = 4095;
/// The longest extended-attribute name (Linux `XATTR_NAME_MAX`).
pub const MAX_XATTR_NAME_LEN: usize = 255;
/// The largest extended-attribute value (Linux `XATTR_SIZE_MAX`).
pub const MAX_XATTR_VALUE_LEN: usize = 65536;

/// The size limits agreed at INIT that requests are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest WRITE payload.
    pub max_write: u32,
    /// Largest READ / READDIR reply payload.
    pub max_read: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_write: 1 << 20,
            max_read: 1 << 20,
        }
    }
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message is shorter than a FUSE header.
    #[error("the message is {0} bytes, shorter than the 40-byte FUSE header")]
    ShortHeader(usize),
    /// The header's length field disagrees with what arrived.
    #[error("the header says the message is {declared} bytes but {actual} arrived")]
    LengthMismatch {
        /// `InHeader::len`.
        declared: u32,
        /// Bytes that arrived.
        actual: usize,
    },
    /// The extension area is longer than the message.
    #[error("the request extensions ({0} bytes) do not fit in the message")]
    BadExtensions(usize),
    /// An argument struct is cut short.
    #[error("the arguments of {op} are cut short: {need} bytes needed, {got} present")]
    ShortArgs {
        /// The operation.
        op: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// A string argument lacks its NUL terminator.
    #[error("a name in {0} is not NUL-terminated")]
    Unterminated(&'static str),
    /// A name is empty.
    #[error("a name in {0} is empty")]
    EmptyName(&'static str),
    /// A name contains a slash.
    #[error("a name in {0} contains '/'")]
    SlashInName(&'static str),
    /// `.` or `..` where a real entry name is required.
    #[error("{0} cannot take the name '.' or '..'")]
    DotName(&'static str),
    /// A name is longer than 255 bytes.
    #[error("a name in {0} is longer than 255 bytes")]
    NameTooLong(&'static str),
    /// A symlink target is longer than `MAX_SYMLINK_LEN`.
    #[error("the symlink target is longer than 4095 bytes")]
    TargetTooLong,
    /// An extended-attribute name is longer than 255 bytes.
    #[error("the extended attribute name is longer than 255 bytes")]
    XattrNameTooLong,
    /// An extended-attribute value is longer than 64 KiB or disagrees with
    /// its declared size.
    #[error("the extended attribute value is {actual} bytes, declared {declared}")]
    XattrValue {
        /// Declared size.
        declared: u32,
        /// Bytes present.
        actual: usize,
    },
    /// A WRITE exceeds `max_write`.
    #[error("a write of {size} bytes exceeds max_write ({max} bytes)")]
    WriteTooLarge {
        /// Requested size.
        size: u32,
        /// The limit.
        max: u32,
    },
    /// A WRITE's declared size disagrees with the data present.
    #[error("the write declares {declared} bytes of data but {actual} are present")]
    WriteLength {
        /// `WriteIn::size`.
        declared: u32,
        /// Bytes present.
        actual: usize,
    },
    /// A READ / READDIR asks for more than the largest reply allowed.
    #[error("a read of {size} bytes exceeds the {max}-byte limit")]
    ReadTooLarge {
        /// Requested size.
        size: u32,
        /// The limit.
        max: u32,
    },
    /// RENAME2 flags outside NOREPLACE / EXCHANGE, or both at once.
    #[error("unsupported rename flags {0:#x}")]
    RenameFlags(u32),
    /// SETXATTR flags outside XATTR_CREATE / XATTR_REPLACE, or both at once.
    #[error("unsupported setxattr flags {0:#x}")]
    XattrFlags(u32),
    /// BATCH_FORGET's count disagrees with the records present.
    #[error("batch forget announces {count} records but {got} bytes hold them")]
    ForgetCount {
        /// Announced records.
        count: u32,
        /// Bytes present.
        got: usize,
    },
    /// A separate payload was given for an operation that takes none.
    #[error("{0} takes no separate data payload")]
    UnexpectedPayload(&'static str),
}

impl DecodeError {
    /// The errno the error reply carries.
    pub fn errno(&self) -> i32 {
        match self {
            DecodeError::ShortHeader(_)
            | DecodeError::LengthMismatch { .. }
            | DecodeError::BadExtensions(_) => libc::EIO,
            DecodeError::NameTooLong(_) | DecodeError::TargetTooLong => libc::ENAMETOOLONG,
            DecodeError::XattrNameTooLong => libc::ERANGE,
            DecodeError::XattrValue { declared, .. }
                if *declared as usize > MAX_XATTR_VALUE_LEN =>
            {
                libc::E2BIG
            }
            _ => libc::EINVAL,
        }
    }
}

/// A message that could not be decoded, with what is known of its header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad FUSE request: {error}")]
pub struct BadRequest {
    /// The header, when at least that much arrived.
    pub header: Option<InHeader>,
    /// What is wrong.
    #[source]
    pub error: DecodeError,
}

impl BadRequest {
    /// The request id an error reply must go to: `None` when the header
    /// could not be read or the operation never gets a reply (FORGET,
    /// BATCH_FORGET, INTERRUPT, NOTIFY_REPLY), in which case the message is
    /// dropped.
    pub fn reply_to(&self) -> Option<u64> {
        let h = self.header.as_ref()?;
        expects_reply(h.opcode).then_some(h.unique)
    }
}

/// Whether the kernel waits for a reply to this opcode.
pub fn expects_reply(op: u32) -> bool {
    !matches!(
        op,
        opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT | opcode::NOTIFY_REPLY
    )
}

/// The name of an opcode, for logs.
pub fn opcode_name(op: u32) -> &'static str {
    match op {
        opcode::LOOKUP => "LOOKUP",
        opcode::FORGET => "FORGET",
        opcode::GETATTR => "GETATTR",
        opcode::SETATTR => "SETATTR",
        opcode::READLINK => "READLINK",
        opcode::SYMLINK => "SYMLINK",
        opcode::MKNOD => "MKNOD",
        opcode::MKDIR => "MKDIR",
        opcode::UNLINK => "UNLINK",
        opcode::RMDIR => "RMDIR",
        opcode::RENAME => "RENAME",
        opcode::LINK => "LINK",
        opcode::OPEN => "OPEN",
        opcode::READ => "READ",
        opcode::WRITE => "WRITE",
        opcode::STATFS => "STATFS",
        opcode::RELEASE => "RELEASE",
        opcode::FSYNC => "FSYNC",
        opcode::SETXATTR => "SETXATTR",
        opcode::GETXATTR => "GETXATTR",
        opcode::LISTXATTR => "LISTXATTR",
        opcode::REMOVEXATTR => "REMOVEXATTR",
        opcode::FLUSH => "FLUSH",
        opcode::INIT => "INIT",
        opcode::OPENDIR => "OPENDIR",
        opcode::READDIR => "READDIR",
        opcode::RELEASEDIR => "RELEASEDIR",
        opcode::FSYNCDIR => "FSYNCDIR",
        opcode::GETLK => "GETLK",
        opcode::SETLK => "SETLK",
        opcode::SETLKW => "SETLKW",
        opcode::ACCESS => "ACCESS",
        opcode::CREATE => "CREATE",
        opcode::INTERRUPT => "INTERRUPT",
        opcode::BMAP => "BMAP",
        opcode::DESTROY => "DESTROY",
        opcode::IOCTL => "IOCTL",
        opcode::POLL => "POLL",
        opcode::NOTIFY_REPLY => "NOTIFY_REPLY",
        opcode::BATCH_FORGET => "BATCH_FORGET",
        opcode::FALLOCATE => "FALLOCATE",
        opcode::READDIRPLUS => "READDIRPLUS",
        opcode::RENAME2 => "RENAME2",
        opcode::LSEEK => "LSEEK",
        opcode::COPY_FILE_RANGE => "COPY_FILE_RANGE",
        opcode::SETUPMAPPING => "SETUPMAPPING",
        opcode::REMOVEMAPPING => "REMOVEMAPPING",
        opcode::SYNCFS => "SYNCFS",
        opcode::TMPFILE => "TMPFILE",
        _ => "UNKNOWN",
    }
}

/// The records of a BATCH_FORGET, read lazily from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForgetList<'a> {
    bytes: &'a [u8],
}

impl<'a> ForgetList<'a> {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.bytes.len() / size_of::<abi::ForgetOne>()
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The records as (node id, lookup count).
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.bytes
            .chunks_exact(size_of::<abi::ForgetOne>())
            .filter_map(|c| abi::ForgetOne::read_from_bytes(c).ok())
            .map(|f| (f.nodeid, f.nlookup))
    }
}

/// A decoded operation with its arguments. The node the operation is about
/// is the header's `nodeid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation<'a> {
    /// FUSE_INIT.
    Init {
        /// Kernel's major version.
        major: u32,
        /// Kernel's minor version.
        minor: u32,
        /// Kernel's largest readahead.
        max_readahead: u32,
        /// Kernel's capability flags (flags2 in the high half with INIT_EXT).
        flags: u64,
    },
    /// FUSE_DESTROY.
    Destroy,
    /// FUSE_LOOKUP of `name` in the node.
    Lookup {
        /// Entry name.
        name: &'a [u8],
    },
    /// FUSE_FORGET (no reply).
    Forget {
        /// Lookups to forget.
        nlookup: u64,
    },
    /// FUSE_BATCH_FORGET (no reply).
    BatchForget(ForgetList<'a>),
    /// FUSE_GETATTR.
    Getattr {
        /// The handle, when the kernel passed one.
        fh: Option<u64>,
    },
    /// FUSE_SETATTR.
    Setattr(abi::SetattrIn),
    /// FUSE_READLINK.
    Readlink,
    /// FUSE_SYMLINK: entry `name` in the node pointing to `target`.
    Symlink {
        /// Entry name.
        name: &'a [u8],
        /// Link target.
        target: &'a [u8],
    },
    /// FUSE_MKNOD.
    Mknod {
        /// Entry name.
        name: &'a [u8],
        /// `st_mode` with type bits.
        mode: u32,
        /// Device number.
        rdev: u32,
        /// Caller's umask.
        umask: u32,
    },
    /// FUSE_MKDIR.
    Mkdir {
        /// Entry name.
        name: &'a [u8],
        /// Permission bits.
        mode: u32,
        /// Caller's umask.
        umask: u32,
    },
    /// FUSE_UNLINK.
    Unlink {
        /// Entry name.
        name: &'a [u8],
    },
    /// FUSE_RMDIR.
    Rmdir {
        /// Entry name.
        name: &'a [u8],
    },
    /// FUSE_RENAME or FUSE_RENAME2.
    Rename {
        /// Source name in the node.
        name: &'a [u8],
        /// Destination directory.
        new_parent: u64,
        /// Destination name.
        new_name: &'a [u8],
        /// NOREPLACE / EXCHANGE.
        flags: RenameFlags,
    },
    /// FUSE_LINK: a new entry `new_name` in the node for `ino`.
    Link {
        /// The existing node.
        ino: u64,
        /// The new entry's name.
        new_name: &'a [u8],
    },
    /// FUSE_OPEN.
    Open {
        /// `open(2)` flags.
        flags: u32,
    },
    /// FUSE_READ.
    Read {
        /// File handle.
        fh: u64,
        /// Offset.
        offset: u64,
        /// Bytes wanted (≤ `max_read`).
        size: u32,
    },
    /// FUSE_WRITE.
    Write {
        /// File handle.
        fh: u64,
        /// Offset.
        offset: u64,
        /// `FUSE_WRITE_*` flags.
        write_flags: u32,
        /// The data (exactly the declared size, ≤ `max_write`).
        data: WriteData<'a>,
    },
    /// FUSE_STATFS.
    Statfs,
    /// FUSE_SYNCFS.
    Syncfs,
    /// FUSE_RELEASE.
    Release {
        /// File handle.
        fh: u64,
    },
    /// FUSE_FSYNC.
    Fsync {
        /// File handle.
        fh: u64,
        /// Data only.
        datasync: bool,
    },
    /// FUSE_SETXATTR.
    Setxattr {
        /// Attribute name.
        name: &'a [u8],
        /// Value.
        value: &'a [u8],
        /// Create / replace semantics.
        mode: XattrMode,
    },
    /// FUSE_GETXATTR.
    Getxattr {
        /// Attribute name.
        name: &'a [u8],
        /// Caller's buffer size (0 = ask for the size).
        size: u32,
    },
    /// FUSE_LISTXATTR.
    Listxattr {
        /// Caller's buffer size (0 = ask for the size).
        size: u32,
    },
    /// FUSE_REMOVEXATTR.
    Removexattr {
        /// Attribute name.
        name: &'a [u8],
    },
    /// FUSE_FLUSH.
    Flush {
        /// File handle.
        fh: u64,
    },
    /// FUSE_OPENDIR.
    Opendir {
        /// `open(2)` flags.
        flags: u32,
    },
    /// FUSE_READDIR or FUSE_READDIRPLUS.
    Readdir {
        /// Directory handle.
        fh: u64,
        /// Offset (index of the next entry).
        offset: u64,
        /// Bytes the kernel's buffer holds.
        size: u32,
        /// READDIRPLUS.
        plus: bool,
    },
    /// FUSE_RELEASEDIR.
    Releasedir {
        /// Directory handle.
        fh: u64,
    },
    /// FUSE_FSYNCDIR.
    Fsyncdir {
        /// Directory handle.
        fh: u64,
        /// Data only.
        datasync: bool,
    },
    /// FUSE_ACCESS.
    Access {
        /// Access mask.
        mask: u32,
    },
    /// FUSE_CREATE.
    Create {
        /// Entry name.
        name: &'a [u8],
        /// Permission bits (type bits may be present).
        mode: u32,
        /// Caller's umask.
        umask: u32,
        /// `open(2)` flags.
        flags: u32,
    },
    /// FUSE_INTERRUPT (no reply; interrupts are not acted on).
    Interrupt {
        /// The interrupted request.
        unique: u64,
    },
    /// FUSE_FALLOCATE.
    Fallocate {
        /// File handle.
        fh: u64,
        /// Offset.
        offset: u64,
        /// Length.
        length: u64,
        /// `FALLOC_FL_*` bits.
        mode: u32,
    },
    /// FUSE_LSEEK.
    Lseek {
        /// File handle.
        fh: u64,
        /// Offset.
        offset: u64,
        /// `SEEK_DATA` / `SEEK_HOLE`.
        whence: u32,
    },
    /// FUSE_COPY_FILE_RANGE: from the node to `nodeid_out`.
    CopyFileRange {
        /// Source file handle.
        fh_in: u64,
        /// Source offset.
        off_in: u64,
        /// Destination node.
        nodeid_out: u64,
        /// Destination file handle.
        fh_out: u64,
        /// Destination offset.
        off_out: u64,
        /// Bytes to copy.
        len: u64,
        /// `copy_file_range(2)` flags, as sent (64 bits on the wire).
        flags: u64,
    },
    /// FUSE_NOTIFY_REPLY (no reply; this crate sends no retrieve notifications).
    NotifyReply,
    /// An opcode this crate does not implement; answered with ENOSYS.
    Unsupported(u32),
}

/// Where a WRITE's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteData<'a> {
    /// In the message, after the `fuse_write_in` (`/dev/fuse`).
    Inline(&'a [u8]),
    /// This many bytes the transport kept apart (virtio-fs: in the guest's
    /// descriptors, after the `fuse_write_in`); it hands them to the
    /// dispatcher as a `sluice_api::WriteSource`
    /// ([`crate::Dispatcher::handle_split`]).
    Apart(usize),
}

impl WriteData<'_> {
    /// How many bytes the write carries.
    pub fn len(&self) -> usize {
        match self {
            WriteData::Inline(d) => d.len(),
            WriteData::Apart(n) => *n,
        }
    }

    /// Whether the write carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A decoded FUSE request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The header: opcode, request id, node id, caller credentials.
    pub header: InHeader,
    /// The operation and its arguments.
    pub op: Operation<'a>,
}

/// Which name rules apply.
#[derive(Clone, Copy)]
enum NameRule {
    /// A lookup: `.` and `..` are fine.
    Lookup,
    /// A name that creates, removes or renames an entry: `.` and `..` are not.
    Entry,
}

/// A cursor over the argument bytes.
struct Args<'a> {
    op: &'static str,
    bytes: &'a [u8],
}

impl<'a> Args<'a> {
    fn fixed<T: FromBytes>(&mut self) -> Result<T, DecodeError> {
        let (v, rest) = T::read_from_prefix(self.bytes).map_err(|_| DecodeError::ShortArgs {
            op: self.op,
            need: size_of::<T>(),
            got: self.bytes.len(),
        })?;
        self.bytes = rest;
        Ok(v)
    }

    /// A NUL-terminated string, without its NUL.
    fn cstr(&mut self) -> Result<&'a [u8], DecodeError> {
        let nul = self
            .bytes
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::Unterminated(self.op))?;
        let s = &self.bytes[..nul];
        self.bytes = &self.bytes[nul + 1..];
        Ok(s)
    }

    fn name(&mut self, rule: NameRule) -> Result<&'a [u8], DecodeError> {
        let name = self.cstr()?;
        check_name(self.op, name, rule)?;
        Ok(name)
    }

    fn xattr_name(&mut self) -> Result<&'a [u8], DecodeError> {
        let name = self.cstr()?;
        if name.is_empty() {
            return Err(DecodeError::EmptyName(self.op));
        }
        if name.len() > MAX_XATTR_NAME_LEN {
            return Err(DecodeError::XattrNameTooLong);
        }
        Ok(name)
    }
}

fn check_name(op: &'static str, name: &[u8], rule: NameRule) -> Result<(), DecodeError> {
    if name.is_empty() {
        return Err(DecodeError::EmptyName(op));
    }
    if name.contains(&b'/') {
        return Err(DecodeError::SlashInName(op));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(DecodeError::NameTooLong(op));
    }
    if matches!(rule, NameRule::Entry) && (name == b"." || name == b"..") {
        return Err(DecodeError::DotName(op));
    }
    Ok(())
}

impl<'a> Request<'a> {
    /// Decodes a whole message held in one slice (the `/dev/fuse` case).
    pub fn decode(msg: &'a [u8], limits: &Limits) -> Result<Request<'a>, BadRequest> {
        Request::decode_split(msg, 0, limits)
    }

    /// Decodes a message whose header and arguments are in `head` and
    /// whose last `payload_len` bytes the transport kept apart (the
    /// virtio-fs case: a WRITE's data left in the guest's descriptors).
    /// The header's length must equal `head.len() + payload_len`. With
    /// `payload_len` 0 this is [`Request::decode`]. Otherwise the opcode
    /// must be WRITE and `head` must end right after the `fuse_write_in`;
    /// the data is [`WriteData::Apart`]: the payload less any request
    /// extensions at its end, which must be the declared size. Nothing of
    /// the payload is read here.
    pub fn decode_split(
        head: &'a [u8],
        payload_len: usize,
        limits: &Limits,
    ) -> Result<Request<'a>, BadRequest> {
        let (header, rest) = InHeader::read_from_prefix(head).map_err(|_| BadRequest {
            header: None,
            error: DecodeError::ShortHeader(head.len()),
        })?;
        let fail = |error| BadRequest {
            header: Some(header),
            error,
        };
        let actual = head.len().saturating_add(payload_len);
        if header.len as usize != actual {
            return Err(fail(DecodeError::LengthMismatch {
                declared: header.len,
                actual,
            }));
        }
        // Extensions (security context, supplementary groups) follow the
        // arguments — and a WRITE's data. None are negotiated, but a kernel
        // that sends some anyway must not have them read as arguments.
        let ext_len = usize::from(header.total_extlen) * 8;
        let (rest, payload) = if payload_len == 0 {
            let keep = rest
                .len()
                .checked_sub(ext_len)
                .ok_or(fail(DecodeError::BadExtensions(ext_len)))?;
            (&rest[..keep], None)
        } else {
            if header.opcode != opcode::WRITE {
                return Err(fail(DecodeError::UnexpectedPayload(opcode_name(
                    header.opcode,
                ))));
            }
            let data = payload_len
                .checked_sub(ext_len)
                .ok_or(fail(DecodeError::BadExtensions(ext_len)))?;
            (rest, Some(data))
        };
        let args = Args {
            op: opcode_name(header.opcode),
            bytes: rest,
        };
        let op = decode_op(header.opcode, args, payload, limits).map_err(fail)?;
        Ok(Request { header, op })
    }

    /// The request id.
    pub fn unique(&self) -> u64 {
        self.header.unique
    }

    /// The node id the operation is about.
    pub fn nodeid(&self) -> u64 {
        self.header.nodeid
    }

    /// The caller's credentials from the header. The kernel sends no
    /// supplementary groups (`FUSE_EXT_GROUPS` is not negotiated), so
    /// `gids` is empty.
    pub fn context(&self) -> Context {
        Context {
            uid: self.header.uid,
            gid: self.header.gid,
            gids: Vec::new(),
            pid: self.header.pid,
            privileged: false,
            kernel_checked: false,
        }
    }
}

/// Decodes the arguments of opcode `code`; `payload` is the length of a
/// WRITE's data the transport kept apart, if it did.
fn decode_op<'a>(
    code: u32,
    mut a: Args<'a>,
    payload: Option<usize>,
    limits: &Limits,
) -> Result<Operation<'a>, DecodeError> {
    use NameRule::{Entry, Lookup};
    Ok(match code {
        opcode::INIT => {
            let compat: abi::InitInCompat = a.fixed()?;
            let mut flags = u64::from(compat.flags);
            if compat.flags & abi::init_flags::INIT_EXT != 0 {
                let flags2: u32 = a.fixed()?;
                flags |= u64::from(flags2) << 32;
            }
            Operation::Init {
                major: compat.major,
                minor: compat.minor,
                max_readahead: compat.max_readahead,
                flags,
            }
        }
        opcode::DESTROY => Operation::Destroy,
        opcode::LOOKUP => Operation::Lookup {
            name: a.name(Lookup)?,
        },
        opcode::FORGET => {
            let f: abi::ForgetIn = a.fixed()?;
            Operation::Forget { nlookup: f.nlookup }
        }
        opcode::BATCH_FORGET => {
            let b: abi::BatchForgetIn = a.fixed()?;
            let need = (b.count as usize).checked_mul(size_of::<abi::ForgetOne>());
            match need {
                Some(n) if n <= a.bytes.len() => Operation::BatchForget(ForgetList {
                    bytes: &a.bytes[..n],
                }),
                _ => {
                    return Err(DecodeError::ForgetCount {
                        count: b.count,
                        got: a.bytes.len(),
                    });
                }
            }
        }
        opcode::GETATTR => {
            let g: abi::GetattrIn = a.fixed()?;
            Operation::Getattr {
                fh: (g.getattr_flags & 1 != 0).then_some(g.fh),
            }
        }
        opcode::SETATTR => Operation::Setattr(a.fixed()?),
        opcode::READLINK => Operation::Readlink,
        opcode::SYMLINK => {
            let name = a.name(Entry)?;
            let target = a.cstr()?;
            if target.is_empty() {
                return Err(DecodeError::EmptyName(a.op));
            }
            if target.len() > MAX_SYMLINK_LEN {
                return Err(DecodeError::TargetTooLong);
            }
            Operation::Symlink { name, target }
        }
        opcode::MKNOD => {
            let m: abi::MknodIn = a.fixed()?;
            Operation::Mknod {
                name: a.name(Entry)?,
                mode: m.mode,
                rdev: m.rdev,
                umask: m.umask,
            }
        }
        opcode::MKDIR => {
            let m: abi::MkdirIn = a.fixed()?;
            Operation::Mkdir {
                name: a.name(Entry)?,
                mode: m.mode,
                umask: m.umask,
            }
        }
        opcode::UNLINK => Operation::Unlink {
            name: a.name(Entry)?,
        },
        opcode::RMDIR => Operation::Rmdir {
            name: a.name(Entry)?,
        },
        opcode::RENAME => {
            let r: abi::RenameIn = a.fixed()?;
            Operation::Rename {
                name: a.name(Entry)?,
                new_parent: r.newdir,
                new_name: a.name(Entry)?,
                flags: RenameFlags::default(),
            }
        }
        opcode::RENAME2 => {
            let r: abi::Rename2In = a.fixed()?;
            let known = abi::RENAME_NOREPLACE | abi::RENAME_EXCHANGE;
            let both = abi::RENAME_NOREPLACE | abi::RENAME_EXCHANGE;
            if r.flags & !known != 0 || r.flags & both == both {
                return Err(DecodeError::RenameFlags(r.flags));
            }
            Operation::Rename {
                name: a.name(Entry)?,
                new_parent: r.newdir,
                new_name: a.name(Entry)?,
                flags: RenameFlags {
                    noreplace: r.flags & abi::RENAME_NOREPLACE != 0,
                    exchange: r.flags & abi::RENAME_EXCHANGE != 0,
                },
            }
        }
        opcode::LINK => {
            let l: abi::LinkIn = a.fixed()?;
            Operation::Link {
                ino: l.oldnodeid,
                new_name: a.name(Entry)?,
            }
        }
        opcode::OPEN => {
            let o: abi::OpenIn = a.fixed()?;
            Operation::Open { flags: o.flags }
        }
        opcode::OPENDIR => {
            let o: abi::OpenIn = a.fixed()?;
            Operation::Opendir { flags: o.flags }
        }
        opcode::READ | opcode::READDIR | opcode::READDIRPLUS => {
            let r: abi::ReadIn = a.fixed()?;
            if r.size > limits.max_read {
                return Err(DecodeError::ReadTooLarge {
                    size: r.size,
                    max: limits.max_read,
                });
            }
            if code == opcode::READ {
                Operation::Read {
                    fh: r.fh,
                    offset: r.offset,
                    size: r.size,
                }
            } else {
                Operation::Readdir {
                    fh: r.fh,
                    offset: r.offset,
                    size: r.size,
                    plus: code == opcode::READDIRPLUS,
                }
            }
        }
        opcode::WRITE => {
            let w: abi::WriteIn = a.fixed()?;
            if w.size > limits.max_write {
                return Err(DecodeError::WriteTooLarge {
                    size: w.size,
                    max: limits.max_write,
                });
            }
            let data = match payload {
                None => WriteData::Inline(a.bytes),
                Some(n) if a.bytes.is_empty() => WriteData::Apart(n),
                Some(n) => {
                    // Data split between the head and the payload cannot
                    // be handed out as one source; the transport keeps all
                    // of it apart.
                    return Err(DecodeError::WriteLength {
                        declared: w.size,
                        actual: a.bytes.len().saturating_add(n),
                    });
                }
            };
            if data.len() != w.size as usize {
                return Err(DecodeError::WriteLength {
                    declared: w.size,
                    actual: data.len(),
                });
            }
            Operation::Write {
                fh: w.fh,
                offset: w.offset,
                write_flags: w.write_flags,
                data,
            }
        }
        opcode::STATFS => Operation::Statfs,
        opcode::SYNCFS => {
            let _: abi::SyncfsIn = a.fixed()?;
            Operation::Syncfs
        }
        opcode::RELEASE => {
            let r: abi::ReleaseIn = a.fixed()?;
            Operation::Release { fh: r.fh }
        }
        opcode::RELEASEDIR => {
            let r: abi::ReleaseIn = a.fixed()?;
            Operation::Releasedir { fh: r.fh }
        }
        opcode::FSYNC | opcode::FSYNCDIR => {
            let f: abi::FsyncIn = a.fixed()?;
            let datasync = f.fsync_flags & abi::FSYNC_FDATASYNC != 0;
            if code == opcode::FSYNC {
                Operation::Fsync { fh: f.fh, datasync }
            } else {
                Operation::Fsyncdir { fh: f.fh, datasync }
            }
        }
        opcode::FLUSH => {
            let f: abi::FlushIn = a.fixed()?;
            Operation::Flush { fh: f.fh }
        }
        opcode::SETXATTR => {
            let s: abi::SetxattrIn = a.fixed()?;
            let mode = match s.flags {
                0 => XattrMode::Any,
                abi::XATTR_CREATE => XattrMode::Create,
                abi::XATTR_REPLACE => XattrMode::Replace,
                other => return Err(DecodeError::XattrFlags(other)),
            };
            let name = a.xattr_name()?;
            let declared = s.size as usize;
            if declared > MAX_XATTR_VALUE_LEN || a.bytes.len() < declared {
                return Err(DecodeError::XattrValue {
                    declared: s.size,
                    actual: a.bytes.len(),
                });
            }
            Operation::Setxattr {
                name,
                value: &a.bytes[..declared],
                mode,
            }
        }
        opcode::GETXATTR => {
            let g: abi::GetxattrIn = a.fixed()?;
            Operation::Getxattr {
                name: a.xattr_name()?,
                size: g.size,
            }
        }
        opcode::LISTXATTR => {
            let g: abi::GetxattrIn = a.fixed()?;
            Operation::Listxattr { size: g.size }
        }
        opcode::REMOVEXATTR => Operation::Removexattr {
            name: a.xattr_name()?,
        },
        opcode::ACCESS => {
            let x: abi::AccessIn = a.fixed()?;
            Operation::Access { mask: x.mask }
        }
        opcode::CREATE => {
            let c: abi::CreateIn = a.fixed()?;
            Operation::Create {
                name: a.name(Entry)?,
                mode: c.mode,
                umask: c.umask,
                flags: c.flags,
            }
        }
        opcode::INTERRUPT => {
            let i: abi::InterruptIn = a.fixed()?;
            Operation::Interrupt { unique: i.unique }
        }
        opcode::FALLOCATE => {
            let f: abi::FallocateIn = a.fixed()?;
            Operation::Fallocate {
                fh: f.fh,
                offset: f.offset,
                length: f.length,
                mode: f.mode,
            }
        }
        opcode::LSEEK => {
            let l: abi::LseekIn = a.fixed()?;
            Operation::Lseek {
                fh: l.fh,
                offset: l.offset,
                whence: l.whence,
            }
        }
        opcode::COPY_FILE_RANGE => {
            let c: abi::CopyFileRangeIn = a.fixed()?;
            Operation::CopyFileRange {
                fh_in: c.fh_in,
                off_in: c.off_in,
                nodeid_out: c.nodeid_out,
                fh_out: c.fh_out,
                off_out: c.off_out,
                len: c.len,
                flags: c.flags,
            }
        }
        opcode::NOTIFY_REPLY => Operation::NotifyReply,
        other => Operation::Unsupported(other),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    /// Builds a request message: header (with `len` filled in) + parts.
    pub(crate) fn message(op: u32, unique: u64, nodeid: u64, parts: &[&[u8]]) -> Vec<u8> {
        let body: Vec<u8> = parts.concat();
        let header = InHeader {
            len: (size_of::<InHeader>() + body.len()) as u32,
            opcode: op,
            unique,
            nodeid,
            uid: 1000,
            gid: 100,
            pid: 42,
            total_extlen: 0,
            padding: 0,
        };
        let mut m = header.as_bytes().to_vec();
        m.extend_from_slice(&body);
        m
    }

    fn decode(msg: &[u8]) -> Result<Request<'_>, BadRequest> {
        Request::decode(msg, &Limits::default())
    }

    #[test]
    fn lookup_decodes_name_and_credentials() {
        let m = message(opcode::LOOKUP, 7, 1, &[b"hello\0"]);
        let r = decode(&m).expect("valid lookup");
        assert_eq!(r.unique(), 7);
        assert_eq!(r.nodeid(), 1);
        assert_eq!((r.header.uid, r.header.gid, r.header.pid), (1000, 100, 42));
        assert_eq!(r.op, Operation::Lookup { name: b"hello" });
    }

    #[test]
    fn short_header_is_dropped_without_reply() {
        let m = message(opcode::LOOKUP, 7, 1, &[b"x\0"]);
        let e = decode(&m[..39]).unwrap_err();
        assert_eq!(e.error, DecodeError::ShortHeader(39));
        assert_eq!(e.reply_to(), None);
    }

    #[test]
    fn length_mismatch_gets_eio_reply() {
        let mut m = message(opcode::GETATTR, 9, 1, &[&[0u8; 16]]);
        m.push(0);
        let e = decode(&m).unwrap_err();
        assert_eq!(e.reply_to(), Some(9));
        assert_eq!(e.error.errno(), libc::EIO);
        let m = message(opcode::GETATTR, 9, 1, &[&[0u8; 16]]);
        let e = decode(&m[..50]).unwrap_err();
        assert!(matches!(
            e.error,
            DecodeError::LengthMismatch {
                declared: 56,
                actual: 50
            }
        ));
    }

    #[test]
    fn short_arguments_are_rejected() {
        let m = message(opcode::GETATTR, 3, 1, &[&[0u8; 15]]);
        let e = decode(&m).unwrap_err();
        assert_eq!(
            e.error,
            DecodeError::ShortArgs {
                op: "GETATTR",
                need: 16,
                got: 15
            }
        );
        assert_eq!(e.error.errno(), libc::EINVAL);
        assert_eq!(e.reply_to(), Some(3));
    }

    #[test]
    fn forget_errors_are_never_replied() {
        let m = message(opcode::FORGET, 3, 5, &[&[0u8; 4]]);
        let e = decode(&m).unwrap_err();
        assert_eq!(e.reply_to(), None);
    }

    #[test]
    fn names_are_validated() {
        let cases: &[(&[u8], DecodeError)] = &[
            (b"abc", DecodeError::Unterminated("UNLINK")),
            (b"\0", DecodeError::EmptyName("UNLINK")),
            (b"a/b\0", DecodeError::SlashInName("UNLINK")),
            (b".\0", DecodeError::DotName("UNLINK")),
            (b"..\0", DecodeError::DotName("UNLINK")),
        ];
        for (name, want) in cases {
            let m = message(opcode::UNLINK, 1, 1, &[name]);
            assert_eq!(&decode(&m).unwrap_err().error, want);
        }
        let long = [b'a'; 256];
        let m = message(opcode::UNLINK, 1, 1, &[&long, b"\0"]);
        let e = decode(&m).unwrap_err();
        assert_eq!(e.error.errno(), libc::ENAMETOOLONG);
        let ok = [b'a'; 255];
        let m = message(opcode::UNLINK, 1, 1, &[&ok, b"\0"]);
        assert!(decode(&m).is_ok());
        // Lookup accepts "." and "..".
        let m = message(opcode::LOOKUP, 1, 1, &[b"..\0"]);
        assert_eq!(decode(&m).unwrap().op, Operation::Lookup { name: b".." });
    }

    #[test]
    fn rename2_flags() {
        let arg = abi::Rename2In {
            newdir: 9,
            flags: abi::RENAME_EXCHANGE,
            padding: 0,
        };
        let m = message(opcode::RENAME2, 1, 2, &[arg.as_bytes(), b"a\0b\0"]);
        assert_eq!(
            decode(&m).unwrap().op,
            Operation::Rename {
                name: b"a",
                new_parent: 9,
                new_name: b"b",
                flags: RenameFlags {
                    noreplace: false,
                    exchange: true
                }
            }
        );
        for bad in [
            abi::RENAME_WHITEOUT,
            abi::RENAME_EXCHANGE | abi::RENAME_NOREPLACE,
            1 << 9,
        ] {
            let arg = abi::Rename2In {
                newdir: 9,
                flags: bad,
                padding: 0,
            };
            let m = message(opcode::RENAME2, 1, 2, &[arg.as_bytes(), b"a\0b\0"]);
            assert_eq!(decode(&m).unwrap_err().error, DecodeError::RenameFlags(bad));
        }
    }

    #[test]
    fn write_data_contiguous_and_split() {
        let w = abi::WriteIn {
            fh: 3,
            offset: 4096,
            size: 5,
            ..Default::default()
        };
        let m = message(opcode::WRITE, 1, 2, &[w.as_bytes(), b"hello"]);
        let want = |data| Operation::Write {
            fh: 3,
            offset: 4096,
            write_flags: 0,
            data,
        };
        assert_eq!(decode(&m).unwrap().op, want(WriteData::Inline(b"hello")));
        let limits = Limits::default();
        // With nothing kept apart, decode_split is decode.
        assert_eq!(Request::decode_split(&m, 0, &limits), decode(&m));

        // Split: header says 85 bytes, head holds 80, 5 stay apart.
        let head = &m[..80];
        let r = Request::decode_split(head, 5, &limits).unwrap();
        assert_eq!(r.op, want(WriteData::Apart(5)));
        // The header's length must count what stayed apart.
        let e = Request::decode_split(head, 4, &limits).unwrap_err();
        assert!(matches!(e.error, DecodeError::LengthMismatch { .. }));
        // Data partly in the head, partly apart.
        let e = Request::decode_split(&m[..82], 3, &limits).unwrap_err();
        assert_eq!(
            e.error,
            DecodeError::WriteLength {
                declared: 5,
                actual: 5
            }
        );
        // Request extensions after the data are not data.
        let mut x = m.clone();
        x[0..4].copy_from_slice(&(m.len() as u32 + 8).to_le_bytes());
        x[36..38].copy_from_slice(&1u16.to_le_bytes());
        let r = Request::decode_split(&x[..80], 13, &limits).unwrap();
        assert_eq!(r.op, want(WriteData::Apart(5)));
        let e = Request::decode_split(&x[..80], 5 + 3, &limits).unwrap_err();
        assert!(matches!(e.error, DecodeError::LengthMismatch { .. }));
        // Payload given for a non-WRITE opcode.
        let g = message(opcode::GETATTR, 1, 1, &[&[0u8; 16]]);
        let mut h = g.clone();
        h[0..4].copy_from_slice(&(g.len() as u32 + 3).to_ne_bytes());
        let e = Request::decode_split(&h, 3, &limits).unwrap_err();
        assert_eq!(e.error, DecodeError::UnexpectedPayload("GETATTR"));
    }

    #[test]
    fn write_sizes_are_checked() {
        let w = abi::WriteIn {
            size: 6,
            ..Default::default()
        };
        let m = message(opcode::WRITE, 1, 2, &[w.as_bytes(), b"hello"]);
        assert_eq!(
            decode(&m).unwrap_err().error,
            DecodeError::WriteLength {
                declared: 6,
                actual: 5
            }
        );
        let limits = Limits {
            max_write: 4,
            max_read: 4,
        };
        let w = abi::WriteIn {
            size: 5,
            ..Default::default()
        };
        let m = message(opcode::WRITE, 1, 2, &[w.as_bytes(), b"hello"]);
        let e = Request::decode(&m, &limits).unwrap_err();
        assert_eq!(e.error, DecodeError::WriteTooLarge { size: 5, max: 4 });
        let r = abi::ReadIn {
            size: 5,
            ..Default::default()
        };
        for op in [opcode::READ, opcode::READDIR, opcode::READDIRPLUS] {
            let m = message(op, 1, 2, &[r.as_bytes()]);
            let e = Request::decode(&m, &limits).unwrap_err();
            assert_eq!(e.error, DecodeError::ReadTooLarge { size: 5, max: 4 });
        }
    }

    #[test]
    fn setxattr_uses_the_compat_layout() {
        let s = abi::SetxattrIn {
            size: 3,
            flags: abi::XATTR_CREATE,
        };
        let m = message(opcode::SETXATTR, 1, 2, &[s.as_bytes(), b"user.k\0", b"abc"]);
        assert_eq!(
            decode(&m).unwrap().op,
            Operation::Setxattr {
                name: b"user.k",
                value: b"abc",
                mode: XattrMode::Create
            }
        );
        let s = abi::SetxattrIn { size: 4, flags: 0 };
        let m = message(opcode::SETXATTR, 1, 2, &[s.as_bytes(), b"user.k\0", b"abc"]);
        assert!(matches!(
            decode(&m).unwrap_err().error,
            DecodeError::XattrValue { .. }
        ));
        let s = abi::SetxattrIn { size: 0, flags: 3 };
        let m = message(opcode::SETXATTR, 1, 2, &[s.as_bytes(), b"user.k\0"]);
        assert_eq!(decode(&m).unwrap_err().error, DecodeError::XattrFlags(3));
    }

    #[test]
    fn batch_forget_count_is_checked() {
        let b = abi::BatchForgetIn { count: 2, dummy: 0 };
        let one = abi::ForgetOne {
            nodeid: 5,
            nlookup: 2,
        };
        let two = abi::ForgetOne {
            nodeid: 6,
            nlookup: 1,
        };
        let m = message(
            opcode::BATCH_FORGET,
            0,
            0,
            &[b.as_bytes(), one.as_bytes(), two.as_bytes()],
        );
        match decode(&m).unwrap().op {
            Operation::BatchForget(list) => {
                assert_eq!(list.iter().collect::<Vec<_>>(), vec![(5, 2), (6, 1)]);
            }
            other => panic!("unexpected {other:?}"),
        }
        let b = abi::BatchForgetIn {
            count: u32::MAX,
            dummy: 0,
        };
        let m = message(opcode::BATCH_FORGET, 0, 0, &[b.as_bytes(), one.as_bytes()]);
        let e = decode(&m).unwrap_err();
        assert!(matches!(e.error, DecodeError::ForgetCount { .. }));
        assert_eq!(e.reply_to(), None);
    }

    #[test]
    fn init_reads_flags2_only_with_init_ext() {
        let i = abi::InitIn {
            major: 7,
            minor: 38,
            max_readahead: 131072,
            flags: abi::init_flags::INIT_EXT | abi::init_flags::ASYNC_READ,
            flags2: 1,
            unused: [0; 11],
        };
        let m = message(opcode::INIT, 1, 0, &[i.as_bytes()]);
        match decode(&m).unwrap().op {
            Operation::Init { flags, minor, .. } => {
                assert_eq!(minor, 38);
                assert_eq!(flags >> 32, 1);
            }
            other => panic!("unexpected {other:?}"),
        }
        // An old kernel's 16-byte INIT without INIT_EXT.
        let m = message(
            opcode::INIT,
            1,
            0,
            &[&i.as_bytes()[..12], &1u32.to_ne_bytes()],
        );
        assert!(matches!(
            decode(&m).unwrap().op,
            Operation::Init { flags: 1, .. }
        ));
    }

    #[test]
    fn extensions_are_stripped() {
        let mut m = message(opcode::LOOKUP, 1, 1, &[b"abc\0", &[0xffu8; 8]]);
        m[36..38].copy_from_slice(&1u16.to_ne_bytes());
        assert_eq!(decode(&m).unwrap().op, Operation::Lookup { name: b"abc" });
        m[36..38].copy_from_slice(&9u16.to_ne_bytes());
        assert_eq!(
            decode(&m).unwrap_err().error,
            DecodeError::BadExtensions(72)
        );
    }

    #[test]
    fn copy_file_range_decodes_both_ends() {
        let c = abi::CopyFileRangeIn {
            fh_in: 3,
            off_in: 4096,
            nodeid_out: 77,
            fh_out: 9,
            off_out: 1 << 40,
            len: u64::MAX,
            flags: 0,
        };
        let m = message(opcode::COPY_FILE_RANGE, 6, 55, &[c.as_bytes()]);
        let r = decode(&m).expect("valid copy_file_range");
        assert_eq!(r.nodeid(), 55);
        assert_eq!(
            r.op,
            Operation::CopyFileRange {
                fh_in: 3,
                off_in: 4096,
                nodeid_out: 77,
                fh_out: 9,
                off_out: 1 << 40,
                len: u64::MAX,
                flags: 0,
            }
        );
        let e = decode(&m[..m.len() - 8]).unwrap_err();
        assert!(matches!(e.error, DecodeError::LengthMismatch { .. }));
        let short = message(opcode::COPY_FILE_RANGE, 7, 55, &[&c.as_bytes()[..48]]);
        assert_eq!(
            decode(&short).unwrap_err().error,
            DecodeError::ShortArgs {
                op: "COPY_FILE_RANGE",
                need: 56,
                got: 48
            }
        );
    }

    #[test]
    fn unknown_opcodes_decode_as_unsupported() {
        let m = message(4242, 1, 1, &[b"whatever"]);
        assert_eq!(decode(&m).unwrap().op, Operation::Unsupported(4242));
        let m = message(opcode::GETLK, 1, 1, &[]);
        assert_eq!(
            decode(&m).unwrap().op,
            Operation::Unsupported(opcode::GETLK)
        );
    }
}
