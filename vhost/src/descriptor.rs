//! Bounds-checked views of a descriptor chain's buffers in guest memory.
//!
//! A chain is walked once, up front: every descriptor is checked to lie wholly
//! inside the guest's memory regions and every running total is overflow-checked,
//! so the [`Reader`] and [`Writer`] built from it never touch host memory outside
//! the guest's regions. All access still goes through `vm-memory`'s bounds-checked
//! `Bytes` interface; the up-front walk only lets a bad chain be answered with an
//! error reply before any request byte is interpreted.

use std::io;
use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// What is wrong with a descriptor chain the guest made available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// A descriptor points (partly) outside the guest's memory regions.
    #[error("descriptor at {addr:#x} of {len} bytes lies outside guest memory")]
    OutsideGuestMemory {
        /// Guest physical address of the descriptor's buffer.
        addr: u64,
        /// Length of the descriptor's buffer.
        len: u32,
    },
    /// The chain's buffers add up to more bytes than can be addressed.
    #[error("descriptor chain lengths overflow")]
    LengthOverflow,
    /// A device-readable descriptor follows a device-writable one.
    #[error("a readable descriptor follows a writable one")]
    ReadableAfterWritable,
    /// The chain ends in a descriptor that still claims a successor: it loops,
    /// is longer than the queue, or has a broken indirect table.
    #[error("descriptor chain is truncated, loops or has a broken indirect table")]
    Truncated,
}

/// One guest buffer: a guest physical address and a length, already checked to
/// lie inside guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GuestRegion {
    addr: GuestAddress,
    len: usize,
}

/// The buffers of one descriptor chain, split into the device-readable part (the
/// request) and the device-writable part (room for the reply).
#[derive(Debug, Default)]
pub struct ChainBuffers {
    readable: Vec<GuestRegion>,
    writable: Vec<GuestRegion>,
    readable_len: usize,
    writable_len: usize,
}

impl ChainBuffers {
    /// Walks `chain` and checks every descriptor against `mem`.
    ///
    /// Returns the valid buffers together with the first problem found, if any.
    /// On a problem the valid writable buffers are still returned, so that the
    /// caller can put an error reply into them: they are inside guest memory.
    pub fn parse<M>(mem: &GuestMemoryMmap, chain: DescriptorChain<M>) -> (Self, Option<ChainError>)
    where
        M: Deref,
        M::Target: vm_memory::GuestMemory,
    {
        let mut buffers = ChainBuffers::default();
        let mut error = None;
        let mut seen_writable = false;
        let mut last_has_next = false;
        for desc in chain {
            last_has_next = desc.has_next();
            let len = desc.len();
            let addr = desc.addr();
            if len == 0 {
                continue;
            }
            let len_usize = len as usize;
            let inside =
                addr.checked_add(u64::from(len) - 1).is_some() && mem.check_range(addr, len_usize);
            if !inside {
                error.get_or_insert(ChainError::OutsideGuestMemory { addr: addr.0, len });
                continue;
            }
            let region = GuestRegion {
                addr,
                len: len_usize,
            };
            if desc.is_write_only() {
                seen_writable = true;
                match buffers.writable_len.checked_add(len_usize) {
                    Some(total) if total <= u32::MAX as usize => {
                        buffers.writable_len = total;
                        buffers.writable.push(region);
                    }
                    _ => {
                        error.get_or_insert(ChainError::LengthOverflow);
                    }
                }
            } else if seen_writable {
                error.get_or_insert(ChainError::ReadableAfterWritable);
            } else {
                match buffers.readable_len.checked_add(len_usize) {
                    Some(total) if total <= u32::MAX as usize => {
                        buffers.readable_len = total;
                        buffers.readable.push(region);
                    }
                    _ => {
                        error.get_or_insert(ChainError::LengthOverflow);
                    }
                }
            }
        }
        if last_has_next {
            error.get_or_insert(ChainError::Truncated);
        }
        (buffers, error)
    }

    /// Total bytes the device may read (the request).
    pub fn readable_len(&self) -> usize {
        self.readable_len
    }

    /// Total bytes the device may write (room for the reply).
    pub fn writable_len(&self) -> usize {
        self.writable_len
    }

    /// A reader over the readable buffers.
    pub fn reader<'a>(&self, mem: &'a GuestMemoryMmap) -> Reader<'a> {
        Reader {
            mem,
            regions: self.readable.clone(),
            index: 0,
            offset: 0,
            bytes_read: 0,
            available: self.readable_len,
        }
    }

    /// A writer over the writable buffers.
    pub fn writer<'a>(&self, mem: &'a GuestMemoryMmap) -> Writer<'a> {
        Writer {
            mem,
            regions: self.writable.clone(),
            index: 0,
            offset: 0,
            bytes_written: 0,
            available: self.writable_len,
        }
    }
}

/// Reads the request bytes of a chain from guest memory, in order.
#[derive(Debug)]
pub struct Reader<'a> {
    mem: &'a GuestMemoryMmap,
    regions: Vec<GuestRegion>,
    index: usize,
    offset: usize,
    bytes_read: usize,
    available: usize,
}

impl Reader<'_> {
    /// Bytes not read yet.
    pub fn available_bytes(&self) -> usize {
        self.available
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> usize {
        self.bytes_read
    }

    /// Appends all remaining bytes to `buf`.
    pub fn read_to_vec(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let start = buf.len();
        let count = self.available;
        buf.resize(start + count, 0);
        self.read_exact_into(&mut buf[start..])?;
        Ok(count)
    }

    fn read_exact_into(&mut self, mut dst: &mut [u8]) -> io::Result<()> {
        while !dst.is_empty() {
            let n = io::Read::read(self, dst)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            dst = &mut dst[n..];
        }
        Ok(())
    }
}

impl io::Read for Reader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let Some(region) = self.regions.get(self.index) else {
                break;
            };
            let left = region.len - self.offset;
            let n = left.min(buf.len() - done);
            // `offset < region.len` and the region was checked to be inside guest
            // memory, so this addition cannot overflow.
            let addr = GuestAddress(region.addr.0 + self.offset as u64);
            self.mem
                .read_slice(&mut buf[done..done + n], addr)
                .map_err(io::Error::other)?;
            done += n;
            self.offset += n;
            if self.offset == region.len {
                self.index += 1;
                self.offset = 0;
            }
        }
        self.bytes_read += done;
        self.available -= done;
        Ok(done)
    }
}

/// Writes a reply into a chain's writable buffers in guest memory, in order.
#[derive(Debug)]
pub struct Writer<'a> {
    mem: &'a GuestMemoryMmap,
    regions: Vec<GuestRegion>,
    index: usize,
    offset: usize,
    bytes_written: usize,
    available: usize,
}

impl<'a> Writer<'a> {
    /// Room left for the reply.
    pub fn available_bytes(&self) -> usize {
        self.available
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> usize {
        self.bytes_written
    }

    /// Splits off the room after the next `offset` bytes into a second writer.
    ///
    /// `self` keeps the first `offset` bytes (fewer if less room is left), the
    /// returned writer gets the rest. This lets a reply's payload be written
    /// before its header, whose length field depends on the payload.
    pub fn split_at(&mut self, offset: usize) -> Writer<'a> {
        let offset = offset.min(self.available);
        let mut rest = Vec::new();
        let mut remaining = offset;
        let mut index = self.index;
        let mut first_offset = self.offset;
        while index < self.regions.len() {
            let region = self.regions[index];
            let left = region.len - first_offset;
            if remaining < left {
                let split = first_offset + remaining;
                rest.push(GuestRegion {
                    addr: GuestAddress(region.addr.0 + split as u64),
                    len: region.len - split,
                });
                rest.extend_from_slice(&self.regions[index + 1..]);
                self.regions.truncate(index + 1);
                self.regions[index].len = split;
                break;
            }
            remaining -= left;
            first_offset = 0;
            index += 1;
        }
        let tail_len = self.available - offset;
        self.available = offset;
        Writer {
            mem: self.mem,
            regions: rest,
            index: 0,
            offset: 0,
            bytes_written: 0,
            available: tail_len,
        }
    }
}

impl io::Write for Writer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let Some(region) = self.regions.get(self.index) else {
                break;
            };
            let left = region.len - self.offset;
            let n = left.min(buf.len() - done);
            // `offset < region.len` and the region was checked to be inside guest
            // memory, so this addition cannot overflow.
            let addr = GuestAddress(region.addr.0 + self.offset as u64);
            self.mem
                .write_slice(&buf[done..done + n], addr)
                .map_err(io::Error::other)?;
            done += n;
            self.offset += n;
            if self.offset == region.len {
                self.index += 1;
                self.offset = 0;
            }
        }
        self.bytes_written += done;
        self.available -= done;
        Ok(done)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
