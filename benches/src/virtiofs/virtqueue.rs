//! A split virtqueue driven from the driver's side (virtio 1.x, 2.7): the
//! descriptor table, available ring and used ring live in the shared memory;
//! the driver fills the available ring, kicks the device through an eventfd
//! and polls the used ring.

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use vhost::VringConfigData;
use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::error::{HarnessError, Result};
use super::guest_memory::SharedMemory;

/// Size of one descriptor table entry.
const DESC_SIZE: u64 = 16;
/// Size of one used ring element.
const USED_ELEM_SIZE: u64 = 8;

/// A descriptor of a hand-made chain, for feeding the device bad input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDescriptor {
    /// Buffer address as the descriptor states it.
    pub addr: u64,
    /// Buffer length as the descriptor states it.
    pub len: u32,
    /// Device-writable buffer.
    pub writable: bool,
    /// Points at an indirect descriptor table.
    pub indirect: bool,
    /// Where `next` points: `None` links to the following descriptor of the
    /// chain (or ends the chain); `Some(k)` sets the NEXT flag and points at
    /// the k-th descriptor of this chain if it has one, else at raw table
    /// index `k`.
    pub next: Option<u16>,
}

impl RawDescriptor {
    /// A plain readable or writable buffer.
    pub fn buffer(addr: GuestAddress, len: u32, writable: bool) -> Self {
        RawDescriptor {
            addr: addr.0,
            len,
            writable,
            indirect: false,
            next: None,
        }
    }
}

/// How long a driver waits on a quiet device before it sends a spurious
/// notification (see [`SplitQueue::nudge`]).
pub const NUDGE_AFTER: Duration = Duration::from_secs(1);

/// The driver side of one split virtqueue.
#[derive(Debug)]
pub struct SplitQueue {
    mem: Arc<GuestMemoryMmap>,
    size: u16,
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    free: Vec<u16>,
    /// Descriptor slots of each in-flight chain, by head index.
    chains: Vec<Vec<u16>>,
    avail_idx: u16,
    published_idx: u16,
    last_used: u16,
    event_idx: bool,
    kick: EventFd,
    call: EventFd,
}

impl SplitQueue {
    /// Lays out a queue of `size` entries (a power of two) in `memory`.
    pub fn new(memory: &mut SharedMemory, size: u16, event_idx: bool) -> Result<Self> {
        let n = u64::from(size);
        let desc = memory.alloc(DESC_SIZE * n, 4096)?;
        let avail = memory.alloc(6 + 2 * n, 4096)?;
        let used = memory.alloc(6 + USED_ELEM_SIZE * n, 4096)?;
        let mem = memory.memory().clone();
        for (addr, len) in [
            (desc, DESC_SIZE * n),
            (avail, 6 + 2 * n),
            (used, 6 + USED_ELEM_SIZE * n),
        ] {
            mem.write_slice(&vec![0u8; len as usize], addr)?;
        }
        Ok(SplitQueue {
            mem,
            size,
            desc,
            avail,
            used,
            free: (0..size).rev().collect(),
            chains: vec![Vec::new(); usize::from(size)],
            avail_idx: 0,
            published_idx: 0,
            last_used: 0,
            event_idx,
            kick: EventFd::new(libc::EFD_NONBLOCK).map_err(HarnessError::EventFd)?,
            call: EventFd::new(libc::EFD_NONBLOCK).map_err(HarnessError::EventFd)?,
        })
    }

    /// Number of entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Free descriptor slots.
    pub fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// The eventfd the driver writes to notify the device.
    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    /// The eventfd the device writes to interrupt the driver.
    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }

    /// The ring addresses as SET_VRING_ADDR wants them: in this process's
    /// address space, which the device maps back to guest addresses.
    pub fn config_data(&self) -> Result<VringConfigData> {
        let host =
            |addr: GuestAddress| -> Result<u64> { Ok(self.mem.get_host_address(addr)? as u64) };
        Ok(VringConfigData {
            queue_max_size: self.size,
            queue_size: self.size,
            flags: 0,
            desc_table_addr: host(self.desc)?,
            used_ring_addr: host(self.used)?,
            avail_ring_addr: host(self.avail)?,
            log_addr: None,
        })
    }

    /// Adds a chain of readable then writable buffers; returns its head.
    /// The chain becomes visible to the device at the next [`publish`](Self::publish).
    pub fn add(
        &mut self,
        readable: &[(GuestAddress, u32)],
        writable: &[(GuestAddress, u32)],
    ) -> Result<u16> {
        let descs: Vec<RawDescriptor> = readable
            .iter()
            .map(|&(addr, len)| RawDescriptor::buffer(addr, len, false))
            .chain(
                writable
                    .iter()
                    .map(|&(addr, len)| RawDescriptor::buffer(addr, len, true)),
            )
            .collect();
        self.add_raw(&descs)
    }

    /// Adds a hand-made chain exactly as described; returns its head.
    pub fn add_raw(&mut self, descs: &[RawDescriptor]) -> Result<u16> {
        if descs.is_empty() || descs.len() > self.free.len() {
            return Err(HarnessError::QueueFull(descs.len()));
        }
        let slots: Vec<u16> = (0..descs.len()).filter_map(|_| self.free.pop()).collect();
        for (i, d) in descs.iter().enumerate() {
            let mut flags = 0u16;
            if d.writable {
                flags |= VRING_DESC_F_WRITE as u16;
            }
            if d.indirect {
                flags |= VRING_DESC_F_INDIRECT as u16;
            }
            let next = match d.next {
                Some(k) => {
                    flags |= VRING_DESC_F_NEXT as u16;
                    slots.get(usize::from(k)).copied().unwrap_or(k)
                }
                None if i + 1 < descs.len() => {
                    flags |= VRING_DESC_F_NEXT as u16;
                    slots[i + 1]
                }
                None => 0,
            };
            let entry = Descriptor::new(d.addr, d.len, flags, next);
            self.mem.write_obj(entry, self.desc_entry(slots[i]))?;
        }
        let head = slots[0];
        let ring_slot = u64::from(self.avail_idx % self.size);
        self.mem.write_obj(
            head.to_le(),
            self.avail.unchecked_add_bytes(4 + 2 * ring_slot),
        )?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.chains[usize::from(head)] = slots;
        Ok(head)
    }

    /// Makes the chains added since the last call visible to the device and
    /// kicks it if it asked to be kicked (EVENT_IDX) or did not suppress kicks.
    pub fn publish(&mut self) -> Result<()> {
        let old = self.published_idx;
        let new = self.avail_idx;
        if old == new {
            return Ok(());
        }
        self.mem.store(
            new.to_le(),
            self.avail.unchecked_add_bytes(2),
            Ordering::Release,
        )?;
        self.published_idx = new;
        // The device reads our index before it writes avail_event / flags;
        // order our store before our read of its suppression state.
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            let avail_event: u16 = self.mem.load(
                self.used
                    .unchecked_add_bytes(4 + USED_ELEM_SIZE * u64::from(self.size)),
                Ordering::Acquire,
            )?;
            new.wrapping_sub(avail_event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            let flags: u16 = self.mem.load(self.used, Ordering::Acquire)?;
            flags & VRING_USED_F_NO_NOTIFY as u16 == 0
        };
        if kick {
            self.kick.write(1).map_err(HarnessError::EventFd)?;
        }
        Ok(())
    }

    /// Notifies the device whether or not it asked to be kicked. The virtio
    /// spec lets a driver send spurious notifications; the bench loop sends
    /// one after a long quiet spell so a notification lost between two
    /// processes on a loaded host costs a second, not the whole run.
    pub fn nudge(&self) -> Result<()> {
        self.kick.write(1).map_err(HarnessError::EventFd)
    }

    /// Takes the next completed chain off the used ring: its head and the
    /// number of bytes the device wrote.
    pub fn poll_used(&mut self) -> Result<Option<(u16, u32)>> {
        let used_idx: u16 = self
            .mem
            .load(self.used.unchecked_add_bytes(2), Ordering::Acquire)?;
        if used_idx == self.last_used {
            return Ok(None);
        }
        let slot = u64::from(self.last_used % self.size);
        let elem = self.used.unchecked_add_bytes(4 + USED_ELEM_SIZE * slot);
        let id: u32 = self.mem.read_obj(elem)?;
        let len: u32 = self.mem.read_obj(elem.unchecked_add_bytes(4))?;
        self.last_used = self.last_used.wrapping_add(1);
        if self.event_idx {
            // Ask for an interrupt at the next completion (used_event).
            self.mem.store(
                self.last_used.to_le(),
                self.avail.unchecked_add_bytes(4 + 2 * u64::from(self.size)),
                Ordering::Release,
            )?;
        }
        let head = u16::try_from(id).map_err(|_| HarnessError::BadUsedHead(id))?;
        let slots = self
            .chains
            .get_mut(usize::from(head))
            .filter(|slots| !slots.is_empty())
            .ok_or(HarnessError::BadUsedHead(id))?;
        self.free.append(slots);
        Ok(Some((head, u32::from_le(len))))
    }

    /// Waits up to `timeout` for the next completed chain.
    pub fn wait_used(&mut self, timeout: Duration) -> Result<(u16, u32)> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut next_nudge = start + NUDGE_AFTER;
        let mut spins = 0u32;
        loop {
            if let Some(done) = self.poll_used()? {
                return Ok(done);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(HarnessError::Timeout(timeout));
            }
            if now >= next_nudge {
                self.nudge()?;
                next_nudge = now + NUDGE_AFTER;
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    fn desc_entry(&self, index: u16) -> GuestAddress {
        self.desc.unchecked_add_bytes(DESC_SIZE * u64::from(index))
    }
}

trait AddBytes {
    fn unchecked_add_bytes(self, bytes: u64) -> Self;
}

impl AddBytes for GuestAddress {
    /// Offsets inside a ring this driver allocated; they cannot overflow.
    fn unchecked_add_bytes(self, bytes: u64) -> Self {
        GuestAddress(self.0 + bytes)
    }
}
