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

/// Whether shared memory (a memfd's pages) may use transparent huge pages
/// on this host: `/sys/kernel/mm/transparent_hugepage/shmem_enabled` names
/// a mode other than `never` and `deny` (read once; unreadable: no).
pub fn shmem_huge_pages() -> bool {
    static HUGE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HUGE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
            .is_ok_and(|s| huge_mode(&s))
    })
}

/// Whether the mode the `shmem_enabled` text selects (in brackets) lets
/// shared memory take huge pages.
fn huge_mode(text: &str) -> bool {
    let chosen = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')));
    matches!(chosen, Some("always" | "within_size" | "advise" | "force"))
}

/// A block's bytes in a sealed memfd.
#[derive(Debug)]
pub struct SealedBlock {
    fd: OwnedFd,
    len: usize,
}

impl SealedBlock {
    /// A new memfd holding `data`, sealed.
    pub fn new(data: &[u8]) -> io::Result<SealedBlock> {
        SealedBlock::fill(data.len(), |room| {
            room[..data.len()].copy_from_slice(data);
            Ok::<(), io::Error>(())
        })
    }

    /// A new memfd of `len` bytes that `fill` writes, then sealed. `fill`
    /// gets a writable shared mapping of the memfd, `len` rounded up to
    /// whole pages (an O_DIRECT read writes whole 4 KiB units), and must
    /// write the first `len` bytes; the rest is zeroed after it. The bytes
    /// land straight in the pages every client maps: a fetch reads or
    /// decompresses the object into them, with no buffer in between.
    ///
    /// The mapping asks for transparent huge pages (`MADV_HUGEPAGE`):
    /// where the host allows them for shared memory
    /// (`/sys/kernel/mm/transparent_hugepage/shmem_enabled` at `advise`,
    /// `within_size` or `always`) a 4 MiB block is two 2 MiB pages, which
    /// clients then map with two TLB entries instead of 1,024.
    pub fn fill<E: From<io::Error>>(
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<SealedBlock, E> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an empty block").into());
        }
        let fd = rustix::fs::memfd_create(
            "sluice-block",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(io::Error::from)?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(io::Error::from)?;
        let room = len.next_multiple_of(rustix::param::page_size());
        // SAFETY: a fresh mapping the kernel places, of a memfd only we
        // hold; `room` ends inside the memfd's last page, so every byte of
        // it may be touched without SIGBUS.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                room,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(io::Error::from)?;
        let map = Unmap { ptr, len: room };
        // SAFETY: our mapping; only a hint (an error means no huge pages).
        let _ = unsafe { rustix::mm::madvise(ptr, room, rustix::mm::Advice::LinuxHugepage) };
        // SAFETY: `ptr` maps `room` writable bytes, ours alone until `map`
        // is dropped below, and nothing else borrows them.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), room) };
        fill(bytes)?;
        bytes[len..].fill(0);
        // A writable shared mapping would make F_SEAL_WRITE fail (EBUSY).
        drop(map);
        rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(io::Error::from)?;
        Ok(SealedBlock { fd, len })
    }

    /// A read-only mapping of the block (to copy it).
    pub fn map(&self) -> io::Result<MappedBlock> {
        MappedBlock::map(&self.fd, self.len)
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

/// Unmaps a mapping when dropped (also when a fill fails part way).
struct Unmap {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

impl Drop for Unmap {
    fn drop(&mut self) {
        // SAFETY: our mapping; the slice over it is gone by the time this
        // runs (it is dropped after the `fill` call that used it).
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
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

    #[test]
    fn the_shmem_huge_page_mode_is_read_from_its_brackets() {
        assert!(!huge_mode("always within_size advise [never] deny force"));
        assert!(!huge_mode("always within_size advise never [deny] force"));
        assert!(huge_mode("always within_size [advise] never deny force"));
        assert!(huge_mode("[always] within_size advise never deny force"));
        assert!(huge_mode("always [within_size] advise never deny force\n"));
        assert!(!huge_mode(""));
    }

    /// A block filled in place: clients see exactly what the fill wrote,
    /// the memfd is the block's length, and the rest of its last page is
    /// zero whatever the fill left there. A fill that fails leaves nothing.
    #[test]
    fn a_block_filled_in_place_is_sealed_with_its_tail_zeroed() {
        let len = 10_000;
        let block = SealedBlock::fill(len, |room| {
            assert!(room.len() >= len && room.len().is_multiple_of(4096));
            room.fill(0xee);
            room[..len].fill(7);
            Ok::<(), io::Error>(())
        })
        .unwrap();
        assert_eq!(block.len(), len);
        let fd = block.fd().try_clone_to_owned().unwrap();
        assert_eq!(rustix::fs::fstat(&fd).unwrap().st_size, len as i64);
        assert!(rustix::io::pwrite(&fd, b"x", 0).is_err(), "sealed");
        let mapped = MappedBlock::map(&fd, len).unwrap();
        assert!(mapped.as_ref().iter().all(|&b| b == 7));
        // The tail of the last page, past the block, reads as zeros.
        let mut tail = vec![1u8; 4096];
        let page = len.next_multiple_of(4096);
        // SAFETY: the mapping covers whole pages; bytes past `len` up to
        // the page's end are mapped and readable (no SIGBUS inside the
        // memfd's last page).
        let past =
            unsafe { std::slice::from_raw_parts(mapped.as_ref().as_ptr().add(len), page - len) };
        tail.truncate(page - len);
        tail.copy_from_slice(past);
        assert!(tail.iter().all(|&b| b == 0));
        let err = SealedBlock::fill(len, |_| Err(io::Error::other("no object")));
        assert!(err.is_err());
        assert!(SealedBlock::fill(0, |_| Ok::<(), io::Error>(())).is_err());
    }
}
