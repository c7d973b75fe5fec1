//! A block held in memory that several processes map: a sealed memfd
//! (host side, [`SealedBlock`]) and a read-only mapping of one (VM side,
//! [`MappedBlock`]).
//!
//! The seals are what make sharing safe: once `F_SEAL_WRITE`,
//! `F_SEAL_SHRINK` and `F_SEAL_GROW` are set nobody — not the host, not a
//! client holding the descriptor — can change the bytes or the size, so a
//! mapping never sees a torn block and never faults past the end (SIGBUS).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// The seals a shared block must carry.
const SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::SHRINK)
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A block's bytes in a sealed memfd.
#[derive(Debug)]
pub struct SealedBlock {
    fd: OwnedFd,
    len: usize,
}

impl SealedBlock {
    /// A new memfd holding `data`, sealed.
    pub fn new(data: &[u8]) -> io::Result<SealedBlock> {
        if data.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty block",
            ));
        }
        let fd = rustix::fs::memfd_create(
            "sluice-block",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let mut at = 0;
        while at < data.len() {
            match rustix::io::pwrite(&fd, &data[at..], at as u64) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => at += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        rustix::fs::fcntl_add_seals(&fd, SEALS)?;
        Ok(SealedBlock {
            fd,
            len: data.len(),
        })
    }

    /// The memfd, to send.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The block's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty (never: [`SealedBlock::new`] refuses).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A read-only shared mapping of a sealed memfd.
#[derive(Debug)]
pub struct MappedBlock {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and its bytes never change (the memfd
// is sealed against writes, checked in `map`); it is unmapped only on
// drop, when no reference to it is left.
unsafe impl Send for MappedBlock {}
// SAFETY: as above: shared references only read immutable bytes.
unsafe impl Sync for MappedBlock {}

impl MappedBlock {
    /// Maps the first `len` bytes of `fd`, which must be a memfd sealed
    /// against writes and size changes and at least `len` bytes long.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<MappedBlock> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let seals = rustix::fs::fcntl_get_seals(fd)?;
        if !seals.contains(SealFlags::WRITE | SealFlags::SHRINK) {
            return Err(bad("a block descriptor that is not sealed"));
        }
        let size = rustix::fs::fstat(fd)?.st_size;
        if len == 0 || u64::try_from(size).map_or(true, |s| s < len as u64) {
            return Err(bad("a block descriptor shorter than its block"));
        }
        // Populated at once: a block is mostly read whole (a stream), and
        // one call maps its pages cheaper than a fault per page.
        // SAFETY: a fresh mapping chosen by the kernel (no address given),
        // of a descriptor we own; nothing else refers to it yet.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED | MapFlags::POPULATE,
                fd,
                0,
            )
        }?;
        Ok(MappedBlock { ptr, len })
    }
}

impl AsRef<[u8]> for MappedBlock {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self`
        // lives; the memfd is sealed, so they never change and never go
        // away under the mapping (no shrink: no SIGBUS).
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl sluice_engine::block_source::BlockBytes for MappedBlock {}

impl Drop for MappedBlock {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` is our mapping, and no borrow of it outlives
        // `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_block_maps_read_only_and_cannot_change() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let block = SealedBlock::new(&data).unwrap();
        // What a client receives is a duplicate of the descriptor.
        let fd = block.fd().try_clone_to_owned().unwrap();
        let mapped = MappedBlock::map(&fd, data.len()).unwrap();
        assert!(mapped.as_ref() == &data[..]);
        // Neither a write nor a truncation goes through the descriptor.
        assert!(rustix::io::pwrite(&fd, b"x", 0).is_err());
        assert!(rustix::fs::ftruncate(&fd, 10).is_err());
        // SAFETY: a new mapping the kernel places; refused, as it must be.
        let writable = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                data.len(),
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        };
        assert!(
            writable.is_err(),
            "a writable shared mapping of a sealed block"
        );
        // More than the block, or an unsealed memfd, is refused.
        assert!(MappedBlock::map(&fd, data.len() + 1).is_err());
        let plain = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&plain, 4096).unwrap();
        assert!(MappedBlock::map(&plain, 4096).is_err());
        assert!(SealedBlock::new(&[]).is_err());
    }
}
