//! The read path: (chunk, offset, length) → visible pieces → blocks.
//!
//! Blocks are always fetched whole (and decompressed whole: a compressed
//! block cannot be read in part) and go through the block cache, so a
//! sequential reader of small requests fetches each block once. Reads are
//! expressed as a walk over fragments (a stretch of zeros, or a range of a
//! cached block) so a caller can land the bytes wherever it wants — a plain
//! buffer here, guest memory for virtio-fs later — with one copy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::block_cache::BlockCache;
use crate::block_key::{block_key, block_len};
use crate::chunk::{Piece, visible};
use crate::compress::decompress;
use crate::error::{Error, Result};
use crate::meta::{CHUNK_SIZE, Ino};
use crate::volume::Volume;

/// One stretch of the bytes a read returns.
#[derive(Debug)]
pub enum Fragment<'a> {
    /// This many zero bytes (a hole).
    Zeros(usize),
    /// Bytes of a block.
    Data(&'a [u8]),
}

/// How long a chunk's resolved slice list is trusted without asking the
/// metadata engine again. Changes made through this process invalidate it at
/// once; the limit bounds how stale another client's writes may look.
const CHUNK_TTL: Duration = Duration::from_secs(1);

type ChunkEntry = (Arc<Vec<Piece>>, Instant);

/// Reads file data of one volume.
#[derive(Debug)]
pub struct Reader {
    vol: Arc<Volume>,
    cache: Arc<BlockCache>,
    chunks: Mutex<HashMap<(Ino, u32), ChunkEntry>>,
}

impl Reader {
    /// A reader over `vol` using `cache` for blocks.
    pub fn new(vol: Arc<Volume>, cache: Arc<BlockCache>) -> Reader {
        Reader {
            vol,
            cache,
            chunks: Mutex::new(HashMap::new()),
        }
    }

    /// The block cache.
    pub fn cache(&self) -> &Arc<BlockCache> {
        &self.cache
    }

    /// The visible pieces of chunk `indx` of `ino` (cached briefly).
    pub fn pieces(&self, ino: Ino, indx: u32) -> Result<Arc<Vec<Piece>>> {
        if let Some((p, at)) = self.chunks.lock().get(&(ino, indx))
            && at.elapsed() < CHUNK_TTL
        {
            return Ok(p.clone());
        }
        let slices = self.vol.meta.read_chunk(ino, indx)?;
        let p = Arc::new(visible(&slices));
        let mut map = self.chunks.lock();
        if map.len() > 65_536 {
            map.retain(|_, (_, at)| at.elapsed() < CHUNK_TTL);
        }
        map.insert((ino, indx), (p.clone(), Instant::now()));
        Ok(p)
    }

    /// Forgets the resolved slice list of one chunk (it changed).
    pub fn invalidate_chunk(&self, ino: Ino, indx: u32) {
        self.chunks.lock().remove(&(ino, indx));
    }

    /// Forgets every resolved chunk of `ino` (truncate, fallocate).
    pub fn invalidate_inode(&self, ino: Ino) {
        self.chunks.lock().retain(|k, _| k.0 != ino);
    }

    /// Block `indx` of slice `id` (of `size` bytes), decompressed, through
    /// the cache.
    pub fn block(&self, id: u64, size: u32, indx: u32) -> Result<Arc<Vec<u8>>> {
        if let Some(b) = self.cache.get((id, indx)) {
            return Ok(b);
        }
        let bs = self.vol.block_size;
        let raw_len = block_len(size, bs, indx);
        let key = block_key(self.vol.name(), id, indx, raw_len);
        let stored = self.vol.store.get(&key)?;
        let data = Arc::new(decompress(
            self.vol.compression,
            stored,
            raw_len as usize,
            &key,
        )?);
        self.cache.insert((id, indx), data.clone());
        Ok(data)
    }

    /// Walks the bytes `off..off+len` of a slice piece in order.
    fn visit_slice(
        &self,
        id: u64,
        size: u32,
        mut off: u32,
        mut len: u32,
        f: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<()> {
        let bs = self.vol.block_size;
        if u64::from(off) + u64::from(len) > u64::from(size) {
            return Err(Error::Corrupt(format!(
                "slice {id} of {size} bytes is referenced at {off}+{len}"
            )));
        }
        while len > 0 {
            let indx = off / bs;
            let boff = (off % bs) as usize;
            let n = len.min(bs - off % bs);
            let block = self.block(id, size, indx)?;
            let part = block
                .get(boff..boff + n as usize)
                .ok_or_else(|| Error::Corrupt(format!("block {indx} of slice {id} is short")))?;
            f(Fragment::Data(part))?;
            off += n;
            len -= n;
        }
        Ok(())
    }

    /// Walks the bytes at chunk offsets `off..off+len` of `pieces`, calling
    /// `f` with each fragment in order (their lengths add up to `len`).
    pub fn visit_pieces(
        &self,
        pieces: &[Piece],
        off: u64,
        len: u64,
        f: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<()> {
        let end = off + len;
        let mut at = off;
        let first = pieces.partition_point(|p| p.end() <= off);
        for p in &pieces[first..] {
            if at >= end {
                break;
            }
            let (pa, pb) = (u64::from(p.pos), p.end());
            if pa >= end {
                break;
            }
            if pa > at {
                f(Fragment::Zeros((pa - at) as usize))?;
                at = pa;
            }
            let stop = pb.min(end);
            let n = (stop - at) as u32;
            if p.is_hole() {
                f(Fragment::Zeros(n as usize))?;
            } else {
                let soff = p.off + (at - pa) as u32;
                self.visit_slice(p.id, p.size, soff, n, f)?;
            }
            at = stop;
        }
        if at < end {
            f(Fragment::Zeros((end - at) as usize))?;
        }
        Ok(())
    }

    /// Walks the file bytes `off..off+len` of `ino` (the caller bounds them
    /// by the file length), chunk by chunk.
    pub fn visit(
        &self,
        ino: Ino,
        off: u64,
        len: u64,
        f: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<()> {
        let end = off + len;
        let mut at = off;
        while at < end {
            let indx = u32::try_from(at / CHUNK_SIZE).map_err(|_| Error::FileTooBig)?;
            let coff = at % CHUNK_SIZE;
            let n = (CHUNK_SIZE - coff).min(end - at);
            let pieces = self.pieces(ino, indx)?;
            self.visit_pieces(&pieces, coff, n, f)?;
            at += n;
        }
        Ok(())
    }

    /// Reads the file bytes `off..off+buf.len()` of `ino` into `buf`.
    pub fn read(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<()> {
        let mut at = 0usize;
        self.visit(ino, off, buf.len() as u64, &mut |frag| {
            at += fill(&mut buf[at..], frag);
            Ok(())
        })
    }

    /// Reads the visible bytes `off..off+buf.len()` of a resolved chunk.
    pub fn read_pieces(&self, pieces: &[Piece], off: u64, buf: &mut [u8]) -> Result<()> {
        let mut at = 0usize;
        self.visit_pieces(pieces, off, buf.len() as u64, &mut |frag| {
            at += fill(&mut buf[at..], frag);
            Ok(())
        })
    }
}

/// Puts one fragment at the start of `dst`; returns its length.
fn fill(dst: &mut [u8], frag: Fragment<'_>) -> usize {
    match frag {
        Fragment::Zeros(n) => {
            dst[..n].fill(0);
            n
        }
        Fragment::Data(d) => {
            sluice_simd::copy(&mut dst[..d.len()], d);
            d.len()
        }
    }
}
