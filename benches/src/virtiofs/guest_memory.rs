//! The driver's "guest RAM": memfd-backed regions mapped here and shared with
//! the device over vhost-user, plus a bump allocator that hands out the
//! virtqueue structures and request buffers.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use vhost::VhostUserMemoryRegionInfo;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap, MmapRegion,
};

use super::error::{HarnessError, Result};

/// Guest physical address where the driver's memory starts. Not zero, so a
/// zeroed descriptor never points at valid memory by accident.
pub const GUEST_BASE: u64 = 0x1_0000_0000;

/// Memory shared with the device, and where the next allocation goes.
#[derive(Debug)]
pub struct SharedMemory {
    mem: Arc<GuestMemoryMmap>,
    size: u64,
    next: u64,
}

impl SharedMemory {
    /// Creates `size` bytes of shared memory at [`GUEST_BASE`].
    pub fn new(size: usize) -> Result<Self> {
        let file = memfd("sluice-virtiofs-guest")?;
        file.set_len(size as u64)
            .map_err(HarnessError::GuestMemory)?;
        let region = MmapRegion::from_file(FileOffset::new(file, 0), size)
            .map_err(|e| HarnessError::GuestMemory(std::io::Error::other(e)))?;
        let region = GuestRegionMmap::new(region, GuestAddress(GUEST_BASE)).ok_or_else(|| {
            HarnessError::GuestMemory(std::io::Error::other("guest region does not fit"))
        })?;
        let mem = GuestMemoryMmap::from_regions(vec![region])
            .map_err(|e| HarnessError::GuestMemory(std::io::Error::other(e)))?;
        Ok(SharedMemory {
            mem: Arc::new(mem),
            size: size as u64,
            next: GUEST_BASE,
        })
    }

    /// The memory, for reading and writing through `vm-memory`.
    pub fn memory(&self) -> &Arc<GuestMemoryMmap> {
        &self.mem
    }

    /// The regions as SET_MEM_TABLE describes them.
    pub fn regions(&self) -> Result<Vec<VhostUserMemoryRegionInfo>> {
        self.mem
            .iter()
            .map(|region| {
                VhostUserMemoryRegionInfo::from_guest_region(region).map_err(HarnessError::Vhost)
            })
            .collect()
    }

    /// Reserves `len` bytes aligned to `align` (a power of two).
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<GuestAddress> {
        let start = self
            .next
            .checked_add(align - 1)
            .map(|a| a & !(align - 1))
            .ok_or(HarnessError::OutOfGuestMemory(len))?;
        let end = start
            .checked_add(len)
            .ok_or(HarnessError::OutOfGuestMemory(len))?;
        if end > GUEST_BASE + self.size {
            return Err(HarnessError::OutOfGuestMemory(len));
        }
        self.next = end;
        Ok(GuestAddress(start))
    }
}

/// A memfd-backed region of `size` bytes at guest address `base`, for memory
/// hot-plugged with ADD_MEM_REG.
pub fn memfd_region(base: GuestAddress, size: usize) -> Result<GuestRegionMmap> {
    let file = memfd("sluice-virtiofs-guest")?;
    file.set_len(size as u64)
        .map_err(HarnessError::GuestMemory)?;
    let region = MmapRegion::from_file(FileOffset::new(file, 0), size)
        .map_err(|e| HarnessError::GuestMemory(std::io::Error::other(e)))?;
    GuestRegionMmap::new(region, base).ok_or_else(|| {
        HarnessError::GuestMemory(std::io::Error::other("guest region does not fit"))
    })
}

/// Creates an anonymous memory file.
fn memfd(name: &str) -> Result<File> {
    let name = std::ffi::CString::new(name)
        .map_err(|e| HarnessError::GuestMemory(std::io::Error::other(e)))?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call;
    // memfd_create does not keep the pointer.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(HarnessError::GuestMemory(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create, is valid and owned by
    // nothing else, so the File may take ownership of it.
    Ok(unsafe { File::from_raw_fd(fd) })
}
