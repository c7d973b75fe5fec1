//! The FUSE wire protocol seen from the driver's side: encoding requests and
//! decoding replies, as the Linux virtiofs driver does (protocol 7.31+).

use super::error::{HarnessError, Result};

/// Size of `fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// Size of `fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;
/// Size of `fuse_entry_out`.
pub const ENTRY_OUT_LEN: usize = 128;
/// Size of `fuse_attr`.
pub const ATTR_LEN: usize = 88;

/// FUSE kernel protocol major version.
pub const KERNEL_VERSION: u32 = 7;
/// FUSE kernel protocol minor version the harness speaks.
pub const KERNEL_MINOR_VERSION: u32 = 38;

/// Root inode.
pub const ROOT_ID: u64 = 1;

/// FUSE opcodes the harness sends.
#[allow(missing_docs)]
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const MKDIR: u32 = 9;
    pub const RMDIR: u32 = 11;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const RELEASE: u32 = 18;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const RELEASEDIR: u32 = 29;
    pub const CREATE: u32 = 35;
    pub const DESTROY: u32 = 38;
    pub const READDIRPLUS: u32 = 44;
}

/// INIT flags the harness asks for.
pub const INIT_FLAGS: u32 = (1 << 0) // ASYNC_READ
    | (1 << 4) // ATOMIC_O_TRUNC
    | (1 << 5) // EXPORT_SUPPORT
    | (1 << 6) // BIG_WRITES
    | (1 << 13) // DO_READDIRPLUS
    | (1 << 22) // MAX_PAGES
    | (1 << 25); // INIT_EXT

/// Appends little-endian integers and raw bytes.
#[derive(Debug, Default)]
pub struct Encoder(Vec<u8>);

impl Encoder {
    /// An empty message.
    pub fn new() -> Self {
        Encoder(Vec::new())
    }
    /// Appends a u16.
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u32.
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u64.
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends raw bytes.
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    /// Appends a name and its terminating NUL.
    pub fn name(self, name: &[u8]) -> Self {
        self.bytes(name).bytes(&[0])
    }
    /// The encoded bytes.
    pub fn finish(self) -> Vec<u8> {
        self.0
    }
}

/// Builds a complete request: header followed by `args`.
pub fn request(opcode: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
    let len = u32::try_from(IN_HEADER_LEN + args.len()).unwrap_or(u32::MAX);
    Encoder::new()
        .u32(len)
        .u32(opcode)
        .u64(unique)
        .u64(nodeid)
        .u32(0) // uid
        .u32(0) // gid
        .u32(std::process::id())
        .u16(0) // total_extlen
        .u16(0)
        .bytes(args)
        .finish()
}

/// `fuse_init_in`.
pub fn init_in(max_readahead: u32) -> Vec<u8> {
    let mut enc = Encoder::new()
        .u32(KERNEL_VERSION)
        .u32(KERNEL_MINOR_VERSION)
        .u32(max_readahead)
        .u32(INIT_FLAGS)
        .u32(0); // flags2
    for _ in 0..11 {
        enc = enc.u32(0);
    }
    enc.finish()
}

/// `fuse_open_in`.
pub fn open_in(flags: u32) -> Vec<u8> {
    Encoder::new().u32(flags).u32(0).finish()
}

/// `fuse_read_in` (also READDIRPLUS).
pub fn read_in(fh: u64, offset: u64, size: u32) -> Vec<u8> {
    Encoder::new()
        .u64(fh)
        .u64(offset)
        .u32(size)
        .u32(0) // read_flags
        .u64(0) // lock_owner
        .u32(0) // flags
        .u32(0)
        .finish()
}

/// `fuse_write_in` followed by the data.
pub fn write_in(fh: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    Encoder::new()
        .u64(fh)
        .u64(offset)
        .u32(u32::try_from(data.len()).unwrap_or(u32::MAX))
        .u32(0) // write_flags
        .u64(0) // lock_owner
        .u32(0) // flags
        .u32(0)
        .bytes(data)
        .finish()
}

/// The header of a `fuse_write_in` whose data follows in another buffer.
pub fn write_in_header(fh: u64, offset: u64, size: u32) -> Vec<u8> {
    Encoder::new()
        .u64(fh)
        .u64(offset)
        .u32(size)
        .u32(0)
        .u64(0)
        .u32(0)
        .u32(0)
        .finish()
}

/// `fuse_release_in`.
pub fn release_in(fh: u64, flags: u32) -> Vec<u8> {
    Encoder::new().u64(fh).u32(flags).u32(0).u64(0).finish()
}

/// `fuse_flush_in`.
pub fn flush_in(fh: u64) -> Vec<u8> {
    Encoder::new().u64(fh).u32(0).u32(0).u64(0).finish()
}

/// `fuse_create_in` followed by the name.
pub fn create_in(name: &[u8], flags: u32, mode: u32) -> Vec<u8> {
    Encoder::new()
        .u32(flags)
        .u32(mode)
        .u32(0o022) // umask
        .u32(0) // open_flags
        .name(name)
        .finish()
}

/// `fuse_getattr_in`.
pub fn getattr_in() -> Vec<u8> {
    Encoder::new().u32(0).u32(0).u64(0).finish()
}

/// `fuse_forget_in`.
pub fn forget_in(nlookup: u64) -> Vec<u8> {
    Encoder::new().u64(nlookup).finish()
}

/// A decoded `fuse_out_header` and the payload after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Length the header states.
    pub len: u32,
    /// Zero or a negated errno.
    pub error: i32,
    /// Echo of the request's unique id.
    pub unique: u64,
    /// Bytes after the header.
    pub payload: Vec<u8>,
}

impl Reply {
    /// Decodes a reply of which the device wrote `bytes`.
    pub fn parse(opcode: u32, bytes: &[u8]) -> Result<Reply> {
        let mut d = Decoder::new(opcode, bytes);
        let len = d.u32()?;
        let error = d.u32()? as i32;
        let unique = d.u64()?;
        if len as usize != bytes.len() {
            return Err(bad(
                opcode,
                format!("header says {len} bytes, device wrote {}", bytes.len()),
            ));
        }
        Ok(Reply {
            len,
            error,
            unique,
            payload: bytes[OUT_HEADER_LEN..].to_vec(),
        })
    }

    /// The payload, or the errno as an error.
    pub fn ok(self, opcode: u32) -> Result<Vec<u8>> {
        if self.error != 0 {
            return Err(HarnessError::Errno {
                opcode,
                errno: self.error.wrapping_neg(),
            });
        }
        Ok(self.payload)
    }
}

fn bad(opcode: u32, why: String) -> HarnessError {
    HarnessError::BadReply { opcode, why }
}

/// Reads little-endian fields off a reply.
#[derive(Debug)]
pub struct Decoder<'a> {
    opcode: u32,
    bytes: &'a [u8],
}

impl<'a> Decoder<'a> {
    /// Starts decoding `bytes` of a reply to `opcode`.
    pub fn new(opcode: u32, bytes: &'a [u8]) -> Self {
        Decoder { opcode, bytes }
    }
    /// Takes `n` raw bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(bad(
                self.opcode,
                format!("needs {n} more bytes, {} left", self.bytes.len()),
            ));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    /// Takes a u16.
    pub fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    /// Takes a u32.
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// Takes a u64.
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut raw = [0u8; 8];
        raw.copy_from_slice(b);
        Ok(u64::from_le_bytes(raw))
    }
    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }
}

/// The parts of `fuse_init_out` the harness uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitOut {
    /// Protocol major version.
    pub major: u32,
    /// Protocol minor version.
    pub minor: u32,
    /// Negotiated flags.
    pub flags: u32,
    /// Largest WRITE payload.
    pub max_write: u32,
    /// Largest request in pages (with MAX_PAGES).
    pub max_pages: u16,
}

impl InitOut {
    /// Decodes `fuse_init_out` (at least the 7.23 layout).
    pub fn parse(payload: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(opcode::INIT, payload);
        let major = d.u32()?;
        let minor = d.u32()?;
        let _max_readahead = d.u32()?;
        let flags = d.u32()?;
        let _max_background = d.u16()?;
        let _congestion = d.u16()?;
        let max_write = d.u32()?;
        let _time_gran = d.u32()?;
        let max_pages = if d.remaining() >= 2 { d.u16()? } else { 0 };
        Ok(InitOut {
            major,
            minor,
            flags,
            max_write,
            max_pages,
        })
    }
}

/// The parts of `fuse_attr` the harness uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// `st_mode`.
    pub mode: u32,
    /// Link count.
    pub nlink: u32,
}

impl Attr {
    fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        let ino = d.u64()?;
        let size = d.u64()?;
        let _blocks = d.u64()?;
        d.take(24 + 12)?; // atime, mtime, ctime and their nsec
        let mode = d.u32()?;
        let nlink = d.u32()?;
        d.take(ATTR_LEN - 8 * 6 - 4 * 5)?; // uid gid rdev blksize flags
        Ok(Attr {
            ino,
            size,
            mode,
            nlink,
        })
    }
}

/// `fuse_entry_out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryOut {
    /// Node id for later requests.
    pub nodeid: u64,
    /// Generation number.
    pub generation: u64,
    /// The entry's attributes.
    pub attr: Attr,
}

impl EntryOut {
    /// Decodes one `fuse_entry_out` off `d`.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        let nodeid = d.u64()?;
        let generation = d.u64()?;
        d.take(8 + 8 + 4 + 4)?; // entry_valid, attr_valid and nsec
        let attr = Attr::decode(d)?;
        Ok(EntryOut {
            nodeid,
            generation,
            attr,
        })
    }
}

/// `fuse_attr_out`.
pub fn parse_attr_out(payload: &[u8]) -> Result<Attr> {
    let mut d = Decoder::new(opcode::GETATTR, payload);
    d.take(16)?;
    Attr::decode(&mut d)
}

/// `fuse_open_out`: the file handle.
pub fn parse_open_out(opcode: u32, payload: &[u8]) -> Result<u64> {
    Decoder::new(opcode, payload).u64()
}

/// `fuse_write_out`: bytes written.
pub fn parse_write_out(payload: &[u8]) -> Result<u32> {
    Decoder::new(opcode::WRITE, payload).u32()
}

/// One READDIRPLUS entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryPlus {
    /// The entry's lookup result (node id 0 for `.` and `..` on some servers).
    pub entry: EntryOut,
    /// Inode number from the dirent.
    pub ino: u64,
    /// Offset of the next entry.
    pub off: u64,
    /// File type (DT_*).
    pub typ: u32,
    /// Name.
    pub name: Vec<u8>,
}

/// Decodes a READDIRPLUS reply payload.
pub fn parse_readdirplus(payload: &[u8]) -> Result<Vec<DirEntryPlus>> {
    let mut d = Decoder::new(opcode::READDIRPLUS, payload);
    let mut out = Vec::new();
    while d.remaining() > 0 {
        let entry = EntryOut::decode(&mut d)?;
        let ino = d.u64()?;
        let off = d.u64()?;
        let namelen = d.u32()? as usize;
        let typ = d.u32()?;
        let name = d.take(namelen)?.to_vec();
        let pad = (8 - (24 + namelen) % 8) % 8;
        d.take(pad.min(d.remaining()))?;
        out.push(DirEntryPlus {
            entry,
            ino,
            off,
            typ,
            name,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_states_total_length() {
        let req = request(opcode::OPEN, 9, 5, &open_in(0));
        assert_eq!(req.len(), IN_HEADER_LEN + 8);
        assert_eq!(u32::from_le_bytes(req[0..4].try_into().unwrap()), 48);
        assert_eq!(u32::from_le_bytes(req[4..8].try_into().unwrap()), 14);
        assert_eq!(u64::from_le_bytes(req[8..16].try_into().unwrap()), 9);
        assert_eq!(u64::from_le_bytes(req[16..24].try_into().unwrap()), 5);
    }

    #[test]
    fn reply_length_must_match() {
        let mut raw = Encoder::new().u32(24).u32(0).u64(3).u64(77).finish();
        let reply = Reply::parse(opcode::WRITE, &raw).expect("well-formed");
        assert_eq!(reply.unique, 3);
        assert_eq!(parse_write_out(&reply.payload).unwrap(), 77);
        raw.truncate(20);
        assert!(Reply::parse(opcode::WRITE, &raw).is_err());
    }
}
