//! The FUSE message frame as the device sees it: the fixed request header and
//! the reply header. Just enough to check a request's framing and to answer a
//! malformed request with an error reply; decoding the arguments is the `fuse`
//! crate's job.

/// Size of `struct fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// Size of `struct fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;

/// The fields of `struct fuse_in_header` the device needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// Total request length, header included.
    pub len: u32,
    /// FUSE opcode.
    pub opcode: u32,
    /// Request id, echoed in the reply.
    pub unique: u64,
}

impl InHeader {
    /// Decodes the header from the first [`IN_HEADER_LEN`] bytes of `bytes`.
    ///
    /// Returns `None` when `bytes` is too short.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let header = bytes.get(..IN_HEADER_LEN)?;
        let u32_at = |at: usize| {
            let mut raw = [0u8; 4];
            raw.copy_from_slice(&header[at..at + 4]);
            u32::from_le_bytes(raw)
        };
        let mut unique = [0u8; 8];
        unique.copy_from_slice(&header[8..16]);
        Some(InHeader {
            len: u32_at(0),
            opcode: u32_at(4),
            unique: u64::from_le_bytes(unique),
        })
    }
}

/// Encodes `struct fuse_out_header` for a reply of `len` bytes in total.
///
/// `error` is zero or a negated errno.
pub fn out_header(len: u32, error: i32, unique: u64) -> [u8; OUT_HEADER_LEN] {
    let mut out = [0u8; OUT_HEADER_LEN];
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..8].copy_from_slice(&error.to_le_bytes());
    out[8..16].copy_from_slice(&unique.to_le_bytes());
    out
}

/// Encodes a reply that carries only an error: the out header with `-errno`.
pub fn error_reply(errno: i32, unique: u64) -> [u8; OUT_HEADER_LEN] {
    out_header(OUT_HEADER_LEN as u32, errno.wrapping_neg(), unique)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_header_round_trip() {
        let mut raw = [0u8; IN_HEADER_LEN];
        raw[0..4].copy_from_slice(&56u32.to_le_bytes());
        raw[4..8].copy_from_slice(&15u32.to_le_bytes());
        raw[8..16].copy_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
        let header = InHeader::parse(&raw).expect("header is complete");
        assert_eq!(
            header,
            InHeader {
                len: 56,
                opcode: 15,
                unique: 0x1234_5678_9abc_def0
            }
        );
        assert_eq!(InHeader::parse(&raw[..IN_HEADER_LEN - 1]), None);
    }

    #[test]
    fn error_reply_negates_errno() {
        let reply = error_reply(libc::ENOSYS, 7);
        assert_eq!(u32::from_le_bytes(reply[0..4].try_into().unwrap()), 16);
        assert_eq!(
            i32::from_le_bytes(reply[4..8].try_into().unwrap()),
            -libc::ENOSYS
        );
        assert_eq!(u64::from_le_bytes(reply[8..16].try_into().unwrap()), 7);
    }
}
