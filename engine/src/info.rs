//! What a file is made of, for `sluice info`: its chunks, their slices and
//! the objects that hold them.

use crate::block_key::slice_keys;
use crate::error::Result;
use crate::meta::{CHUNK_SIZE, Ino, Slice};
use crate::volume::Volume;

/// One chunk of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkInfo {
    /// The chunk index (file offset / 64 MiB).
    pub indx: u32,
    /// The slice records, in write order.
    pub slices: Vec<Slice>,
    /// The object keys of each slice (empty for holes), parallel to `slices`.
    pub objects: Vec<Vec<String>>,
}

/// The chunks of a regular file of `length` bytes that hold slices.
pub fn file_chunks(vol: &Volume, ino: Ino, length: u64) -> Result<Vec<ChunkInfo>> {
    let mut out = Vec::new();
    for indx in 0..length.div_ceil(CHUNK_SIZE) {
        let indx = indx as u32;
        let slices = vol.meta.read_chunk(ino, indx)?;
        if slices.is_empty() {
            continue;
        }
        let objects = slices
            .iter()
            .map(|s| {
                if s.id == 0 {
                    Vec::new()
                } else {
                    slice_keys(vol.name(), s.id, s.size, vol.block_size)
                }
            })
            .collect();
        out.push(ChunkInfo {
            indx,
            slices,
            objects,
        });
    }
    Ok(out)
}
