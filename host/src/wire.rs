//! The host protocol's messages: fixed layouts, little-endian, one message
//! per `SOCK_SEQPACKET` packet (host/DESIGN.md, "Protocol"). Decoding
//! checks every length and value; a message that does not decode ends the
//! sender's connection.

/// The magic a `HELLO` starts its body with.
pub const MAGIC: [u8; 4] = *b"SLHB";
/// The protocol version this build speaks.
pub const VERSION: u16 = 1;
/// The longest message either side sends (a `BLOCK` with the most CRCs).
pub const MAX_MESSAGE: usize = BLOCK_HEAD + 4 * MAX_CRCS;
/// Most segment CRCs a `BLOCK` carries: 32 MiB blocks of 32 KiB segments.
pub const MAX_CRCS: usize = 1024;
/// Longest VM name in a `HELLO`.
pub const MAX_NAME: usize = 64;
/// A volume UUID's text length.
pub const UUID_LEN: usize = 36;

const HELLO: u8 = 1;
const GET: u8 = 2;
const DAMAGED: u8 = 3;
const WELCOME: u8 = 0x81;
const BLOCK: u8 = 0x82;

const HELLO_LEN: usize = 12 + UUID_LEN + MAX_NAME;
const GET_LEN: usize = 32;
const DAMAGED_LEN: usize = 24;
const WELCOME_LEN: usize = 12;
const BLOCK_HEAD: usize = 32;

/// `GET` flag: answer at once; a miss is answered `EWOULDBLOCK` and its
/// fetch started.
pub const NO_WAIT: u32 = 1;
/// `GET` flag: only a cached copy; a miss is answered `ENODATA` and
/// nothing is fetched.
pub const CACHED_ONLY: u32 = 2;
const KNOWN_FLAGS: u32 = NO_WAIT | CACHED_ONLY;

/// A block named by its slice: the host computes the object key itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockName {
    /// The slice id.
    pub slice: u64,
    /// The block's index in the slice.
    pub index: u32,
    /// The slice's size in bytes.
    pub slice_size: u32,
}

/// What a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The first message: who is asking, for which volume.
    Hello {
        /// Protocol version.
        version: u16,
        /// The volume's UUID.
        volume: String,
        /// The VM's name (a label).
        name: String,
        /// The NUMA node of the VM's guest memory, if the server knows it
        /// (bytes 2–3: the node + 1, 0 for unknown — what a client built
        /// before the field sends, so both sides of either age agree).
        node: Option<u16>,
    },
    /// A block.
    Get {
        /// Chosen by the client, echoed in the reply.
        tag: u64,
        /// Which block.
        block: BlockName,
        /// [`NO_WAIT`], [`CACHED_ONLY`].
        flags: u32,
    },
    /// A disk-cache copy handed out failed the client's check.
    Damaged(BlockName),
}

/// What the host sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The answer to a `HELLO`.
    Welcome {
        /// Protocol version.
        version: u16,
        /// The volume's block size.
        block_size: u32,
        /// Most GETs the client may have unanswered.
        max_outstanding: u32,
    },
    /// The answer to a `GET`; a descriptor comes with it when `status` is 0.
    Block {
        /// The request's tag.
        tag: u64,
        /// 0, or an errno.
        status: i32,
        /// What the descriptor is.
        kind: BlockKind,
        /// The block's length in bytes.
        len: u32,
        /// For [`BlockKind::File`]: the payload length the CRCs cover.
        payload: u64,
        /// For [`BlockKind::File`]: the segment CRCs.
        crcs: Vec<u32>,
    },
}

/// What a `BLOCK`'s descriptor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// No descriptor (an error).
    None,
    /// A sealed memfd of exactly the block.
    Memory,
    /// A disk-cache file opened read-only.
    File,
}

/// A message that does not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The message is empty or of an unknown type.
    #[error("unknown message type {0:#x}")]
    UnknownType(u8),
    /// The message's length is not its type's.
    #[error("message of type {kind:#x} is {len} bytes, not {want}")]
    Length {
        /// The type.
        kind: u8,
        /// Its length.
        len: usize,
        /// The length the type has.
        want: usize,
    },
    /// A field holds a value the protocol does not allow.
    #[error("bad {0}")]
    Field(&'static str),
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn check_len(b: &[u8], want: usize) -> Result<(), WireError> {
    if b.len() == want {
        Ok(())
    } else {
        Err(WireError::Length {
            kind: b[0],
            len: b.len(),
            want,
        })
    }
}

fn block_name_at(b: &[u8], at: usize) -> BlockName {
    BlockName {
        slice: u64_at(b, at),
        index: u32_at(b, at + 8),
        slice_size: u32_at(b, at + 12),
    }
}

fn put_block_name(out: &mut Vec<u8>, n: &BlockName) {
    out.extend_from_slice(&n.slice.to_le_bytes());
    out.extend_from_slice(&n.index.to_le_bytes());
    out.extend_from_slice(&n.slice_size.to_le_bytes());
}

impl Request {
    /// Decodes one packet.
    pub fn decode(b: &[u8]) -> Result<Request, WireError> {
        let kind = *b.first().ok_or(WireError::UnknownType(0))?;
        match kind {
            HELLO => {
                check_len(b, HELLO_LEN)?;
                if b[4..8] != MAGIC {
                    return Err(WireError::Field("magic"));
                }
                let name_len = usize::from(b[10]);
                if name_len > MAX_NAME {
                    return Err(WireError::Field("name length"));
                }
                let volume = std::str::from_utf8(&b[12..12 + UUID_LEN])
                    .map_err(|_| WireError::Field("volume"))?
                    .to_string();
                let name = String::from_utf8_lossy(&b[12 + UUID_LEN..12 + UUID_LEN + name_len])
                    .into_owned();
                Ok(Request::Hello {
                    version: u16_at(b, 8),
                    volume,
                    name,
                    node: u16_at(b, 2).checked_sub(1),
                })
            }
            GET => {
                check_len(b, GET_LEN)?;
                let flags = u32_at(b, 4);
                if flags & !KNOWN_FLAGS != 0 {
                    return Err(WireError::Field("flags"));
                }
                Ok(Request::Get {
                    tag: u64_at(b, 8),
                    block: block_name_at(b, 16),
                    flags,
                })
            }
            DAMAGED => {
                check_len(b, DAMAGED_LEN)?;
                Ok(Request::Damaged(block_name_at(b, 8)))
            }
            other => Err(WireError::UnknownType(other)),
        }
    }

    /// The packet of this message. A `HELLO`'s name is cut at
    /// [`MAX_NAME`] bytes and its volume must be [`UUID_LEN`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HELLO_LEN);
        match self {
            Request::Hello {
                version,
                volume,
                name,
                node,
            } => {
                let name = &name.as_bytes()[..name.len().min(MAX_NAME)];
                // A node past u16::MAX - 1 cannot be said: unknown.
                let node = node.and_then(|n| n.checked_add(1)).unwrap_or(0);
                out.extend_from_slice(&[HELLO, 0]);
                out.extend_from_slice(&node.to_le_bytes());
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(&version.to_le_bytes());
                out.push(name.len() as u8);
                out.push(0);
                let mut uuid = [b' '; UUID_LEN];
                let v = volume.as_bytes();
                uuid[..v.len().min(UUID_LEN)].copy_from_slice(&v[..v.len().min(UUID_LEN)]);
                out.extend_from_slice(&uuid);
                let mut padded = [0u8; MAX_NAME];
                padded[..name.len()].copy_from_slice(name);
                out.extend_from_slice(&padded);
            }
            Request::Get { tag, block, flags } => {
                out.extend_from_slice(&[GET, 0, 0, 0]);
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&tag.to_le_bytes());
                put_block_name(&mut out, block);
            }
            Request::Damaged(block) => {
                out.extend_from_slice(&[DAMAGED, 0, 0, 0, 0, 0, 0, 0]);
                put_block_name(&mut out, block);
            }
        }
        out
    }
}

impl Reply {
    /// Decodes one packet.
    pub fn decode(b: &[u8]) -> Result<Reply, WireError> {
        let kind = *b.first().ok_or(WireError::UnknownType(0))?;
        match kind {
            WELCOME => {
                check_len(b, WELCOME_LEN)?;
                Ok(Reply::Welcome {
                    version: u16_at(b, 2),
                    block_size: u32_at(b, 4),
                    max_outstanding: u32_at(b, 8),
                })
            }
            BLOCK => {
                if b.len() < BLOCK_HEAD {
                    return Err(WireError::Length {
                        kind,
                        len: b.len(),
                        want: BLOCK_HEAD,
                    });
                }
                let count = usize::from(u16_at(b, 2));
                if count > MAX_CRCS {
                    return Err(WireError::Field("CRC count"));
                }
                check_len(b, BLOCK_HEAD + 4 * count)?;
                let kind = match b[1] {
                    0 => BlockKind::None,
                    1 => BlockKind::Memory,
                    2 => BlockKind::File,
                    _ => return Err(WireError::Field("block kind")),
                };
                let status = u32_at(b, 4) as i32;
                if (status == 0) == (kind == BlockKind::None) || status < 0 {
                    return Err(WireError::Field("status"));
                }
                let crcs = (0..count).map(|i| u32_at(b, BLOCK_HEAD + 4 * i)).collect();
                Ok(Reply::Block {
                    tag: u64_at(b, 8),
                    status,
                    kind,
                    payload: u64_at(b, 16),
                    len: u32_at(b, 24),
                    crcs,
                })
            }
            other => Err(WireError::UnknownType(other)),
        }
    }

    /// The packet of this message (at most [`MAX_CRCS`] CRCs are sent).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Welcome {
                version,
                block_size,
                max_outstanding,
            } => {
                let mut out = vec![WELCOME, 0];
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&block_size.to_le_bytes());
                out.extend_from_slice(&max_outstanding.to_le_bytes());
                out
            }
            Reply::Block {
                tag,
                status,
                kind,
                len,
                payload,
                crcs,
            } => {
                let crcs = &crcs[..crcs.len().min(MAX_CRCS)];
                let mut out = Vec::with_capacity(BLOCK_HEAD + 4 * crcs.len());
                let kind = match kind {
                    BlockKind::None => 0,
                    BlockKind::Memory => 1,
                    BlockKind::File => 2,
                };
                out.extend_from_slice(&[BLOCK, kind]);
                out.extend_from_slice(&(crcs.len() as u16).to_le_bytes());
                out.extend_from_slice(&status.to_le_bytes());
                out.extend_from_slice(&tag.to_le_bytes());
                out.extend_from_slice(&payload.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
                for c in crcs {
                    out.extend_from_slice(&c.to_le_bytes());
                }
                out
            }
        }
    }

    /// An error answer to the `GET` tagged `tag`.
    pub fn error(tag: u64, errno: i32) -> Reply {
        Reply::Block {
            tag,
            status: errno,
            kind: BlockKind::None,
            len: 0,
            payload: 0,
            crcs: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> BlockName {
        BlockName {
            slice: 0x0102_0304_0506_0708,
            index: 3,
            slice_size: 12 << 20,
        }
    }

    #[test]
    fn every_message_survives_a_round_trip() {
        for r in [
            Request::Hello {
                version: VERSION,
                volume: "0123456789abcdef0123456789abcdef0123".into(),
                name: "vm-1".into(),
                node: Some(1),
            },
            Request::Hello {
                version: VERSION,
                volume: "0123456789abcdef0123456789abcdef0123".into(),
                name: "vm-2".into(),
                node: None,
            },
            Request::Get {
                tag: 77,
                block: name(),
                flags: NO_WAIT,
            },
            Request::Damaged(name()),
        ] {
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        for r in [
            Reply::Welcome {
                version: VERSION,
                block_size: 4 << 20,
                max_outstanding: 64,
            },
            Reply::Block {
                tag: 9,
                status: 0,
                kind: BlockKind::File,
                len: 4 << 20,
                payload: 4 << 20,
                crcs: (0..128).collect(),
            },
            Reply::error(5, libc::EIO),
        ] {
            assert_eq!(Reply::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn a_bad_message_is_an_error_not_a_panic() {
        let get = Request::Get {
            tag: 1,
            block: name(),
            flags: 0,
        }
        .encode();
        assert_eq!(Request::decode(&[]), Err(WireError::UnknownType(0)));
        assert_eq!(
            Request::decode(&[0x42; 32]),
            Err(WireError::UnknownType(0x42))
        );
        assert!(matches!(
            Request::decode(&get[..31]),
            Err(WireError::Length { .. })
        ));
        let mut flags = get.clone();
        flags[4] = 0x80;
        assert_eq!(Request::decode(&flags), Err(WireError::Field("flags")));
        let mut hello = Request::Hello {
            version: 1,
            volume: "u".repeat(36),
            name: "n".into(),
            node: Some(0),
        }
        .encode();
        assert_eq!(&hello[2..4], &[1, 0], "node 0 is sent as 1");
        hello[10] = 200;
        assert_eq!(
            Request::decode(&hello),
            Err(WireError::Field("name length"))
        );
        hello[4] = b'X';
        assert_eq!(Request::decode(&hello), Err(WireError::Field("magic")));
        // A BLOCK whose CRC count says more than it carries, an OK without a
        // kind, an error with one.
        let mut block = Reply::error(1, libc::EIO).encode();
        block[2] = 5;
        assert!(matches!(
            Reply::decode(&block),
            Err(WireError::Length { .. })
        ));
        block[2] = 0;
        block[4..8].copy_from_slice(&0i32.to_le_bytes());
        assert_eq!(Reply::decode(&block), Err(WireError::Field("status")));
        // Every prefix of every message decodes to an error or a message.
        for m in [get, hello, Reply::error(1, 2).encode()] {
            for cut in 0..m.len() {
                let _ = Request::decode(&m[..cut]);
                let _ = Reply::decode(&m[..cut]);
            }
        }
    }
}
