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

use sluice_api::source::WriteSource;
use virtio_queue::DescriptorChain;
use vm_memory::bitmap::Bitmap;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

use crate::guest_io::{self, GuestIoMode, GuestIoRoute};

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
            // A chain that loops yields its descriptors again and again
            // until the walk's bound: its writable buffers repeat. The error
            // reply goes into each buffer once, so the used length never
            // claims more bytes than the guest's buffers hold (the fuzzer
            // found a 4-byte buffer looped into a 16-byte reply).
            let mut seen = std::collections::HashSet::new();
            buffers.writable.retain(|r| seen.insert((r.addr.0, r.len)));
            buffers.writable_len = buffers.writable.iter().map(|r| r.len).sum();
        }
        (buffers, error)
    }

    /// Writable buffers at the given (guest address, length) pairs, which the
    /// caller promises lie inside guest memory.
    #[cfg(test)]
    pub(crate) fn writable_for_test(writable: &[(u64, usize)]) -> Self {
        ChainBuffers {
            writable: writable
                .iter()
                .map(|&(addr, len)| GuestRegion {
                    addr: GuestAddress(addr),
                    len,
                })
                .collect(),
            writable_len: writable.iter().map(|r| r.1).sum(),
            ..ChainBuffers::default()
        }
    }

    /// Readable and writable buffers at the given (guest address, length)
    /// pairs, which the caller promises lie inside guest memory.
    #[cfg(test)]
    pub(crate) fn for_test(readable: &[(u64, usize)], writable: &[(u64, usize)]) -> Self {
        let regions = |list: &[(u64, usize)]| -> Vec<GuestRegion> {
            list.iter()
                .map(|&(addr, len)| GuestRegion {
                    addr: GuestAddress(addr),
                    len,
                })
                .collect()
        };
        ChainBuffers {
            readable: regions(readable),
            writable: regions(writable),
            readable_len: readable.iter().map(|r| r.1).sum(),
            writable_len: writable.iter().map(|r| r.1).sum(),
        }
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

    /// A writer over the writable buffers. It reads files into guest memory
    /// with `pread` ([`Writer::write_from_file`]).
    pub fn writer<'a>(&self, mem: &'a GuestMemoryMmap) -> Writer<'a> {
        Writer {
            mem,
            regions: self.writable.clone(),
            index: 0,
            offset: 0,
            bytes_written: 0,
            available: self.writable_len,
            io: None,
        }
    }

    /// A writer over the writable buffers that reads files into guest memory
    /// the way `route` says (the worker's io_uring ring, or `pread`).
    pub(crate) fn routed_writer<'a>(&self, route: GuestIoRoute<'a>) -> Writer<'a> {
        Writer {
            io: Some(route),
            ..self.writer(route.table)
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

    /// Moves past the next `len` bytes without reading them (at most
    /// [`Reader::available_bytes`]): a waiter running a request again
    /// skips the request bytes the worker gathered to reach a WRITE's data.
    pub fn skip(&mut self, len: usize) {
        let mut left = len.min(self.available);
        self.bytes_read += left;
        self.available -= left;
        while left > 0 {
            let Some(region) = self.regions.get(self.index) else {
                break;
            };
            let n = (region.len - self.offset).min(left);
            left -= n;
            self.offset += n;
            if self.offset == region.len {
                self.index += 1;
                self.offset = 0;
            }
        }
    }

    /// Walks the next `len` bytes (at most what is left) region by region,
    /// calling `piece(guest address, n)` for each piece; stops at the first
    /// error, having moved past the pieces that succeeded.
    fn pieces(
        &mut self,
        len: usize,
        mut piece: impl FnMut(GuestAddress, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        if len > self.available {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let mut done = 0;
        while done < len {
            let Some(region) = self.regions.get(self.index) else {
                return Err(io::ErrorKind::UnexpectedEof.into());
            };
            let n = (region.len - self.offset).min(len - done);
            // `offset < region.len` and the region was checked to be inside
            // guest memory, so this addition cannot overflow.
            piece(GuestAddress(region.addr.0 + self.offset as u64), n)?;
            done += n;
            self.bytes_read += n;
            self.available -= n;
            self.offset += n;
            if self.offset == region.len {
                self.index += 1;
                self.offset = 0;
            }
        }
        Ok(())
    }
}

/// The reader is the source of a WRITE's data: the file system takes it
/// straight from the guest's descriptors into its write buffer, one copy.
/// Guest memory may change under us (the guest owns it): every byte is
/// read once, with `vm-memory`'s volatile slice copies, and a racing guest
/// only tears the data it is writing — the request's header and
/// arguments were read into host memory before.
impl WriteSource for Reader<'_> {
    fn len(&self) -> usize {
        self.available
    }

    fn take(&mut self, dst: &mut [u8]) -> sluice_api::Result<()> {
        sluice_api::source::check_len(self.available, dst.len())?;
        self.read_exact_into(dst).map_err(guest_read_error)
    }

    fn take_append(&mut self, dst: &mut Vec<u8>, n: usize) -> sluice_api::Result<()> {
        sluice_api::source::check_len(self.available, n)?;
        let start = dst.len();
        dst.reserve(n);
        let mem = self.mem;
        let appended = self.pieces(n, |addr, len| {
            let at = dst.len();
            match mem.get_slice(addr, len) {
                Ok(guest) => {
                    let spare = &mut dst.spare_capacity_mut()[..len];
                    // SAFETY: `spare` is `len` bytes of `dst`'s spare
                    // capacity (reserved above: `len` ≤ `n`, less what
                    // the pieces before took), exclusively borrowed and
                    // never read while this volatile slice exists, which
                    // lives only for the copy.
                    let room = unsafe { VolatileSlice::new(spare.as_mut_ptr().cast(), len) };
                    guest.copy_to_volatile_slice(room);
                    // SAFETY: the copy initialised the `len` bytes after
                    // `at` (both slices are `len` bytes long).
                    unsafe { dst.set_len(at + len) };
                    Ok(())
                }
                // A descriptor straddling two memory regions: the
                // bounds-checked copy, which walks them.
                Err(_) => {
                    dst.resize(at + len, 0);
                    mem.read_slice(&mut dst[at..], addr)
                        .map_err(io::Error::other)
                }
            }
        });
        if let Err(e) = appended {
            dst.truncate(start);
            return Err(guest_read_error(e));
        }
        Ok(())
    }
}

fn guest_read_error(e: io::Error) -> sluice_api::Error {
    sluice_api::Error::Io(io::Error::new(
        e.kind(),
        format!("reading WRITE data from guest memory: {e}"),
    ))
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
    io: Option<GuestIoRoute<'a>>,
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
            io: self.io,
        }
    }
}

/// A position in a [`Writer`], to come back to (see [`Writer::rewind`] and
/// [`Writer::write_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    index: usize,
    offset: usize,
    bytes_written: usize,
    available: usize,
}

impl<'a> Writer<'a> {
    /// The current position.
    pub fn mark(&self) -> Mark {
        Mark {
            index: self.index,
            offset: self.offset,
            bytes_written: self.bytes_written,
            available: self.available,
        }
    }

    /// Goes back to `mark` (taken from this writer, with no [`split_at`]
    /// since): what was written after it no longer counts as reply.
    ///
    /// [`split_at`]: Writer::split_at
    pub fn rewind(&mut self, mark: Mark) {
        self.index = mark.index;
        self.offset = mark.offset;
        self.bytes_written = mark.bytes_written;
        self.available = mark.available;
    }

    /// Overwrites bytes already passed, starting at `mark`, without moving
    /// the current position: a header written after its payload.
    pub fn write_at(&self, mark: Mark, bytes: &[u8]) -> io::Result<()> {
        if mark.bytes_written + bytes.len() > self.bytes_written {
            return Err(io::Error::other("write_at past the bytes written"));
        }
        let mut at = Writer {
            mem: self.mem,
            regions: Vec::new(),
            index: 0,
            offset: mark.offset,
            bytes_written: 0,
            available: bytes.len(),
            io: None,
        };
        at.regions.extend_from_slice(&self.regions[mark.index..]);
        io::Write::write_all(&mut at, bytes)
    }

    /// Copies `src` into the guest's buffers with the `simd` copy kernel
    /// (one copy, no bounce buffer): the zero-copy path for READ data.
    pub fn write_copy(&mut self, src: &[u8]) -> io::Result<()> {
        self.put(src.len(), |dst, done, n| {
            // SAFETY: `dst` is valid for `n` bytes of writes (a slice of a
            // guest region `vm-memory` bounds-checked); `src[done..done+n]`
            // is host memory, which guest memory never overlaps; no Rust
            // reference to the guest bytes exists during the copy.
            unsafe { sluice_simd::copy_raw(dst, src[done..].as_ptr(), n) }
        })?;
        if let Some(route) = self.io {
            sluice_metrics::add(&route.stats.guest_copy_bytes, src.len() as u64);
        }
        Ok(())
    }

    /// Counts a chain refused with `errno` in its queue's counters.
    pub(crate) fn count_rejected(&self, errno: i32) {
        if let Some(route) = self.io
            && let Some(i) = crate::worker::REJECT_ERRNOS
                .iter()
                .position(|&e| e == errno)
        {
            sluice_metrics::add(&route.stats.rejected[i], 1);
        }
    }

    /// Reads `len` bytes of `file` from offset `off` straight into the
    /// guest's buffers: one pread per guest buffer piece (the kernel copies
    /// the bytes once, from its page cache into guest memory), except
    /// where `--guest-io uring` routes them through the worker's io_uring
    /// ring into the guest's memory registered as fixed buffers (O_DIRECT
    /// where aligned: no CPU copy):
    ///
    /// * on a worker that must not wait (`sluice_api::wait`), what the page
    ///   cache does not hold is queued on the ring and not waited for: the
    ///   worker parks the chain until the reads complete
    ///   (`guest_io::queue_into`);
    /// * on a worker that may wait (`--max-waiting 0`), the ring is waited
    ///   for here (`guest_io::read_into`).
    ///
    /// A file shorter than asked for is an `UnexpectedEof` error (where it
    /// is found out on the ring, the request is answered again by a waiter,
    /// which finds it out with pread).
    pub fn write_from_file(
        &mut self,
        file: &std::fs::File,
        off: u64,
        len: usize,
    ) -> io::Result<()> {
        self.write_from_file_as(file, off, len, true)
    }

    /// [`Writer::write_from_file`] with the bytes checked where they landed
    /// against the file's segment CRCs (a disk-cache file) before this
    /// returns: a mismatch is `Corrupt`, with the writer back where it was.
    /// The bytes are never left to the worker's ring (they must have
    /// landed to be checked): what the page cache does not hold goes to a
    /// waiter (`WouldBlock`), which reads it with `pread`, or O_DIRECT
    /// where `--guest-io direct`/`uring` allows.
    pub fn write_from_file_checked(
        &mut self,
        file: &std::fs::File,
        off: u64,
        len: usize,
        crcs: sluice_api::SegmentCrcs<'_>,
    ) -> sluice_api::Result<()> {
        let mark = self.mark();
        if let Err(e) = self.write_from_file_as(file, off, len, false) {
            self.rewind(mark);
            return Err(match e.kind() {
                io::ErrorKind::WouldBlock => sluice_api::Error::WouldBlock,
                io::ErrorKind::UnexpectedEof => sluice_api::Error::Corrupt(format!(
                    "a cached block is shorter than {} bytes",
                    off + len as u64
                )),
                _ => sluice_api::Error::Io(e),
            });
        }
        let checked = self.landed_since(mark, |pieces| {
            // SAFETY: `landed_since` hands pieces of guest memory this
            // writer placed, inside the checked mappings `self.mem` keeps
            // alive, or staged copies it holds; only read during the call.
            unsafe { sluice_api::fragment::check_landed(file, off, len, crcs, pieces) }
        });
        let checked = checked.map_err(sluice_api::Error::Io).and_then(|r| r);
        if checked.is_err() {
            self.rewind(mark);
        }
        checked
    }

    /// Calls `check` with the host address and length of each piece of
    /// guest memory written since `mark`, in order. A piece that straddles
    /// two memory regions (no one host mapping) is read into a staged copy
    /// first.
    fn landed_since<R>(
        &self,
        mark: Mark,
        check: impl FnOnce(&[(*const u8, usize)]) -> R,
    ) -> io::Result<R> {
        let mut left = self.bytes_written.saturating_sub(mark.bytes_written);
        let mut pieces = Vec::new();
        let mut staged: Vec<Vec<u8>> = Vec::new();
        let mut index = mark.index;
        let mut offset = mark.offset;
        while left > 0 {
            let Some(region) = self.regions.get(index) else {
                return Err(io::Error::other("fewer buffers than bytes written"));
            };
            let n = (region.len - offset).min(left);
            // As in `put`: `offset < region.len`, inside checked guest memory.
            let addr = GuestAddress(region.addr.0 + offset as u64);
            match self.mem.get_slice(addr, n) {
                Ok(slice) => pieces.push((slice.ptr_guard().as_ptr(), n)),
                Err(_) => {
                    let mut copy = vec![0u8; n];
                    self.mem
                        .read_slice(&mut copy, addr)
                        .map_err(io::Error::other)?;
                    pieces.push((copy.as_ptr(), n));
                    // The heap buffer does not move when `staged` grows.
                    staged.push(copy);
                }
            }
            left -= n;
            offset += n;
            if offset == region.len {
                index += 1;
                offset = 0;
            }
        }
        Ok(check(&pieces))
    }

    fn write_from_file_as(
        &mut self,
        file: &std::fs::File,
        off: u64,
        len: usize,
        may_queue: bool,
    ) -> io::Result<()> {
        if let Some(route) = self.io
            && route.mode == GuestIoMode::Uring
            && !route.waiter
            && len > 0
            && len <= self.available
        {
            if sluice_api::wait::mode() != sluice_api::wait::Mode::NoWait {
                let pieces = self.next_pieces(len);
                if guest_io::read_into(route, file, off, &pieces)? {
                    self.skip(len);
                    return Ok(());
                }
            } else if route.wake.is_some() && may_queue {
                // What the page cache holds is read at once (one kernel
                // copy); the rest goes to the ring. `cachestat` asks, of the
                // range's first page (a whole range costs a walk of every
                // page: 3 % of the daemon's CPU on warm 1 MiB reads),
                // without starting readahead. Where it cannot, or where the
                // first page is held and a later one is not, a RWF_NOWAIT
                // read tries (and its miss may start readahead the ring
                // then duplicates).
                if guest_io::cached(file, off, 1) != Some(false) {
                    let mark = self.mark();
                    match self.read_pieces(file, off, len) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.rewind(mark),
                        done => return done,
                    }
                }
                let pieces = self.next_pieces(len);
                if guest_io::queue_into(route, file, off, &pieces)? {
                    self.skip(len);
                    return Ok(());
                }
                // The ring cannot take it: a waiter reads it.
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        // `--guest-io direct`: a range whose first page the page cache does
        // not hold goes straight to a waiter, which reads it O_DIRECT; a
        // RWF_NOWAIT read that missed would first start readahead of the
        // same bytes through the page cache, reading them from the disk
        // twice. The same for `--guest-io uring` where the ring may not
        // take the read (a checked one).
        if let Some(route) = self.io
            && (route.mode == GuestIoMode::Direct
                || (route.mode == GuestIoMode::Uring && !may_queue))
            && !route.waiter
            && sluice_api::wait::mode() == sluice_api::wait::Mode::NoWait
            && guest_io::cached(file, off, 1) == Some(false)
        {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.read_pieces(file, off, len)
    }

    /// [`Writer::write_from_file`] with one pread per guest buffer piece
    /// (`RWF_NOWAIT` on a worker that must not wait: `WouldBlock` when the
    /// page cache does not hold the bytes), or on a waiter with
    /// `--guest-io direct`/`uring` the aligned middle of each piece
    /// O_DIRECT (`DirectReader`).
    fn read_pieces(&mut self, file: &std::fs::File, off: u64, len: usize) -> io::Result<()> {
        let mut failed: Option<io::Error> = None;
        // A waiter reads what the page cache did not hold: with O_DIRECT
        // where the operator allows it.
        let mut direct = match self.io {
            Some(route)
                if route.waiter
                    && matches!(route.mode, GuestIoMode::Direct | GuestIoMode::Uring) =>
            {
                Some(guest_io::DirectReader::new(file))
            }
            _ => None,
        };
        let mut direct_bytes = 0;
        self.put(len, |dst, done, n| {
            if failed.is_some() {
                return;
            }
            let at = off + done as u64;
            let read = match &mut direct {
                // SAFETY: `dst` is valid for `n` bytes of writes (see
                // `write_copy`), with no Rust reference to them.
                Some(reader) => unsafe { reader.read(dst, n, at) },
                // SAFETY: as above.
                None => unsafe { guest_io::pread_exact(file, dst, n, at).map(|()| 0) },
            };
            match read {
                Ok(d) => direct_bytes += d,
                Err(e) => failed = Some(e),
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => {
                if let Some(route) = self.io {
                    use std::sync::atomic::Ordering::Relaxed;
                    let direct_bytes = direct_bytes as u64;
                    route
                        .stats
                        .guest_io_direct_bytes
                        .fetch_add(direct_bytes, Relaxed);
                    route
                        .stats
                        .guest_io_pread_bytes
                        .fetch_add(len as u64 - direct_bytes, Relaxed);
                }
                Ok(())
            }
        }
    }

    /// The guest buffer pieces (address, length) holding the next `len`
    /// bytes of room, which must be available.
    fn next_pieces(&self, len: usize) -> Vec<(GuestAddress, usize)> {
        let mut pieces = Vec::new();
        let mut left = len;
        let mut offset = self.offset;
        for region in self.regions.iter().skip(self.index) {
            if left == 0 {
                break;
            }
            let n = (region.len - offset).min(left);
            // As in `put`: `offset < region.len`, inside checked guest memory.
            pieces.push((GuestAddress(region.addr.0 + offset as u64), n));
            left -= n;
            offset = 0;
        }
        pieces
    }

    /// Moves past the next `len` bytes of room, which must be available.
    fn skip(&mut self, len: usize) {
        let mut left = len;
        while left > 0 {
            let Some(region) = self.regions.get(self.index) else {
                break;
            };
            let n = (region.len - self.offset).min(left);
            left -= n;
            self.offset += n;
            if self.offset == region.len {
                self.index += 1;
                self.offset = 0;
            }
        }
        self.bytes_written += len;
        self.available -= len;
    }

    /// Writes `len` zero bytes into the guest's buffers.
    pub fn write_zeros(&mut self, len: usize) -> io::Result<()> {
        self.put(len, |dst, _, n| {
            // SAFETY: as in `write_copy`, `dst` is valid for `n` bytes.
            unsafe { std::ptr::write_bytes(dst, 0, n) }
        })
    }

    /// Walks the next `len` bytes of room region by region, calling
    /// `fill(pointer, bytes done so far, n)` for each piece.
    fn put(&mut self, len: usize, mut fill: impl FnMut(*mut u8, usize, usize)) -> io::Result<()> {
        if len > self.available {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("{len} bytes do not fit the {} left", self.available),
            ));
        }
        let mut done = 0;
        while done < len {
            let Some(region) = self.regions.get(self.index) else {
                return Err(io::ErrorKind::WriteZero.into());
            };
            let n = (region.len - self.offset).min(len - done);
            // `offset < region.len` and the region was checked to be inside
            // guest memory, so this addition cannot overflow.
            let addr = GuestAddress(region.addr.0 + self.offset as u64);
            // A checked descriptor may still straddle two memory regions;
            // `get_slice` refuses that, and such a piece goes through the
            // bounds-checked staged path instead.
            match self.mem.get_slice(addr, n) {
                Ok(slice) => {
                    let guard = slice.ptr_guard_mut();
                    fill(guard.as_ptr(), done, n);
                    slice.bitmap().mark_dirty(0, n);
                }
                Err(_) => {
                    let mut staged = vec![0u8; n];
                    fill(staged.as_mut_ptr(), done, n);
                    self.mem
                        .write_slice(&staged, addr)
                        .map_err(io::Error::other)?;
                }
            }
            done += n;
            self.offset += n;
            if self.offset == region.len {
                self.index += 1;
                self.offset = 0;
            }
        }
        self.bytes_written += len;
        self.available -= len;
        Ok(())
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::*;

    const BASE: u64 = 0x10_000;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(BASE), 0x10_000)]).expect("memory")
    }

    fn buffers(readable: &[(u64, usize)], writable: &[(u64, usize)]) -> ChainBuffers {
        let region = |&(addr, len): &(u64, usize)| GuestRegion {
            addr: GuestAddress(addr),
            len,
        };
        ChainBuffers {
            readable: readable.iter().map(region).collect(),
            writable: writable.iter().map(region).collect(),
            readable_len: readable.iter().map(|r| r.1).sum(),
            writable_len: writable.iter().map(|r| r.1).sum(),
        }
    }

    #[test]
    fn reader_gathers_across_buffers() {
        let mem = memory();
        mem.write_slice(b"hello ", GuestAddress(BASE + 0x100))
            .unwrap();
        mem.write_slice(b"guest", GuestAddress(BASE + 0x900))
            .unwrap();
        let chain = buffers(&[(BASE + 0x100, 6), (BASE + 0x900, 5)], &[]);
        let mut reader = chain.reader(&mem);
        let mut first = [0u8; 4];
        reader.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"hell");
        assert_eq!(reader.available_bytes(), 7);
        let mut rest = Vec::new();
        reader.read_to_vec(&mut rest).unwrap();
        assert_eq!(rest, b"o guest");
        assert_eq!(reader.bytes_read(), 11);
        assert_eq!(reader.read(&mut first).unwrap(), 0);
    }

    #[test]
    fn writer_scatters_and_stops_at_the_end() {
        let mem = memory();
        let chain = buffers(&[], &[(BASE + 0x200, 3), (BASE + 0x400, 4)]);
        let mut writer = chain.writer(&mem);
        assert_eq!(writer.write(b"abcdefghij").unwrap(), 7);
        assert_eq!(writer.write(b"k").unwrap(), 0);
        assert!(writer.write_all(b"k").is_err());
        let mut got = [0u8; 4];
        mem.read_slice(&mut got[..3], GuestAddress(BASE + 0x200))
            .unwrap();
        assert_eq!(&got[..3], b"abc");
        mem.read_slice(&mut got, GuestAddress(BASE + 0x400))
            .unwrap();
        assert_eq!(&got, b"defg");
        assert_eq!(writer.bytes_written(), 7);
    }

    #[test]
    fn placed_data_header_last_and_rewind() {
        let mem = memory();
        // A header slot that straddles two buffers, then data across three.
        let chain = buffers(
            &[],
            &[(BASE + 0x100, 10), (BASE + 0x200, 12), (BASE + 0x300, 64)],
        );
        let mut writer = chain.writer(&mem);
        let start = writer.mark();
        writer.write_zeros(16).unwrap();
        writer.write_copy(b"abcdefgh").unwrap();
        writer.write_zeros(3).unwrap();
        writer.write_copy(b"XYZ").unwrap();
        writer.write_at(start, b"HEADER-HEADER-16").unwrap();
        assert_eq!(writer.bytes_written(), 30);
        let mut got = vec![0u8; 30];
        let mut reader = buffers(
            &[(BASE + 0x100, 10), (BASE + 0x200, 12), (BASE + 0x300, 64)],
            &[],
        );
        reader.readable_len = 30;
        reader.reader(&mem).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"HEADER-HEADER-16abcdefgh\0\0\0XYZ");
        // Past the end: refused whole, nothing counted.
        let room = writer.available_bytes();
        assert!(writer.write_copy(&vec![1u8; room + 1]).is_err());
        assert_eq!(writer.bytes_written(), 30);
        // A header may only overwrite bytes already passed.
        let here = writer.mark();
        assert!(writer.write_at(here, b"x").is_err());
        // Rewinding forgets what came after the mark.
        writer.rewind(start);
        assert_eq!(writer.bytes_written(), 0);
        assert_eq!(writer.available_bytes(), 86);
        writer.write_all(b"err-header-16byt").unwrap();
        assert_eq!(writer.bytes_written(), 16);
    }

    #[test]
    fn file_ranges_are_read_straight_into_guest_buffers() {
        let mem = memory();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        let data: Vec<u8> = (0..200u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // Across three guest buffers.
        let chain = buffers(
            &[],
            &[(BASE + 0x100, 7), (BASE + 0x200, 20), (BASE + 0x300, 64)],
        );
        let mut writer = chain.writer(&mem);
        writer.write_from_file(&file, 50, 40).unwrap();
        assert_eq!(writer.bytes_written(), 40);
        let mut got = vec![0u8; 40];
        let mut reader = buffers(
            &[(BASE + 0x100, 7), (BASE + 0x200, 20), (BASE + 0x300, 64)],
            &[],
        );
        reader.readable_len = 40;
        reader.reader(&mem).read_exact(&mut got).unwrap();
        assert_eq!(got, &data[50..90]);
        // Past the end of the file: an error, not zeros or stale bytes.
        let err = writer.write_from_file(&file, 190, 20).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn checked_file_ranges_land_and_are_checked_in_guest_memory() {
        // Two regions, back to back: a buffer may straddle them.
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(BASE), 0x1000),
            (GuestAddress(BASE + 0x1000), 0x2000),
        ])
        .expect("memory");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cached");
        let data: Vec<u8> = (0..3 * 4096).map(|i| (i * 31 + i / 509) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let seg = 1024;
        let crcs: Vec<u32> = data
            .chunks(seg)
            .map(|c| sluice_simd::crc32c(0, c))
            .collect();
        let writable = [
            (BASE + 0x100, 700),
            (BASE + 0xF00, 0x200),
            (BASE + 0x1400, 4000),
        ];
        let chain = buffers(&[], &writable);
        let mut writer = chain.writer(&mem);
        writer.write_copy(b"head").unwrap();
        let sc = sluice_api::SegmentCrcs {
            segment: seg,
            crcs: &crcs,
            payload: data.len() as u64,
        };
        writer
            .write_from_file_checked(&file, 1000, 4000, sc)
            .unwrap();
        assert_eq!(writer.bytes_written(), 4004);
        let mut got = vec![0u8; 4004];
        let mut reader = buffers(&writable, &[]);
        reader.readable_len = 4004;
        reader.reader(&mem).read_exact(&mut got).unwrap();
        assert_eq!(&got[..4], b"head");
        assert!(got[4..] == data[1000..5000]);
        // A segment whose CRC does not match what landed: corrupt, and
        // nothing of it counts.
        let mut damaged = crcs.clone();
        damaged[5] ^= 0x8000;
        let sc = sluice_api::SegmentCrcs {
            crcs: &damaged,
            ..sc
        };
        let before = writer.mark();
        let e = writer
            .write_from_file_checked(&file, 5000, 1000, sc)
            .unwrap_err();
        assert!(matches!(e, sluice_api::Error::Corrupt(_)), "{e:?}");
        assert_eq!(writer.mark(), before);
        // Past the payload: corrupt too, never stale bytes.
        let e = writer
            .write_from_file_checked(&file, 12_000, 400, sc)
            .unwrap_err();
        assert!(matches!(e, sluice_api::Error::Corrupt(_)), "{e:?}");
        assert_eq!(writer.mark(), before);
    }

    #[test]
    fn split_writer_lets_payload_go_before_header() {
        let mem = memory();
        // The split point falls inside the second buffer.
        let chain = buffers(&[], &[(BASE + 0x300, 10), (BASE + 0x500, 10)]);
        let mut header = chain.writer(&mem);
        let mut payload = header.split_at(16);
        assert_eq!(header.available_bytes(), 16);
        assert_eq!(payload.available_bytes(), 4);
        payload.write_all(b"DATA").unwrap();
        header.write_all(b"0123456789abcdef").unwrap();
        assert_eq!(header.available_bytes(), 0);
        let mut got = [0u8; 10];
        mem.read_slice(&mut got, GuestAddress(BASE + 0x500))
            .unwrap();
        assert_eq!(&got, b"abcdefDATA");
    }

    #[test]
    fn split_at_a_buffer_boundary_and_past_the_end() {
        let mem = memory();
        let chain = buffers(&[], &[(BASE + 0x300, 8), (BASE + 0x500, 8)]);
        let mut head = chain.writer(&mem);
        let mut tail = head.split_at(8);
        tail.write_all(b"tailtail").unwrap();
        head.write_all(b"headhead").unwrap();
        let mut got = [0u8; 8];
        mem.read_slice(&mut got, GuestAddress(BASE + 0x500))
            .unwrap();
        assert_eq!(&got, b"tailtail");
        let mut all = chain.writer(&mem);
        let empty = all.split_at(100);
        assert_eq!(all.available_bytes(), 16);
        assert_eq!(empty.available_bytes(), 0);
    }
}
