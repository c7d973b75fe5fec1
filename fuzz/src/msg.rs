//! FUSE request encoding shared by the harnesses.

use std::mem::size_of;

use sluice_fuse::abi::InHeader;
use zerocopy::IntoBytes;

/// One FUSE request: header, then the parts of its body in order.
pub fn message(op: u32, unique: u64, nodeid: u64, uid: u32, parts: &[&[u8]]) -> Vec<u8> {
    let body = parts.concat();
    let h = InHeader {
        len: (size_of::<InHeader>() + body.len()) as u32,
        opcode: op,
        unique,
        nodeid,
        uid,
        gid: uid,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    };
    let mut m = h.as_bytes().to_vec();
    m.extend_from_slice(&body);
    m
}

/// A NUL-terminated name.
pub fn cstr(name: &[u8]) -> Vec<u8> {
    let mut v = name.to_vec();
    v.push(0);
    v
}
