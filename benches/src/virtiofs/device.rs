//! Connecting to a vhost-user-fs device the way QEMU does: feature and
//! protocol negotiation, the memory table, and one split virtqueue per queue.

use std::path::Path;

use vhost::VhostBackend;
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::GuestAddress;

use super::error::{HarnessError, Result};
use super::guest_memory::SharedMemory;
use super::virtqueue::SplitQueue;

/// Length of the virtio-fs tag in the configuration space.
const TAG_LEN: usize = 36;

/// How to set up the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Request queues to use (the hiprio queue comes on top).
    pub request_queues: usize,
    /// Entries per virtqueue.
    pub queue_size: u16,
    /// Bytes of shared guest memory.
    pub memory_size: usize,
}

/// A connected, running virtio-fs device.
pub struct Device {
    /// Kept open for the life of the device: closing it resets the device.
    frontend: Frontend,
    memory: SharedMemory,
    queues: Vec<Option<SplitQueue>>,
    tag: Option<String>,
    event_idx: bool,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("tag", &self.tag)
            .field("event_idx", &self.event_idx)
            .field("queues", &self.queues.len())
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Connects to the vhost-user socket at `socket` and starts the queues.
    pub fn connect(socket: &Path, options: DeviceOptions) -> Result<Self> {
        let num_queues = 1 + options.request_queues;
        let mut frontend =
            Frontend::connect(socket, num_queues as u64).map_err(HarnessError::Vhost)?;
        frontend.set_owner().map_err(HarnessError::Vhost)?;
        let offered = frontend.get_features().map_err(HarnessError::Vhost)?;
        let protocol_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if offered & (1 << VIRTIO_F_VERSION_1) == 0 {
            return Err(HarnessError::MissingFeature("VIRTIO_F_VERSION_1"));
        }
        if offered & protocol_bit == 0 {
            return Err(HarnessError::MissingFeature(
                "VHOST_USER_F_PROTOCOL_FEATURES",
            ));
        }
        let protocol = frontend
            .get_protocol_features()
            .map_err(HarnessError::Vhost)?;
        let wanted = protocol
            & (VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS);
        frontend
            .set_protocol_features(wanted)
            .map_err(HarnessError::Vhost)?;
        if wanted.contains(VhostUserProtocolFeatures::MQ) {
            let offered_queues = frontend.get_queue_num().map_err(HarnessError::Vhost)?;
            if offered_queues < num_queues as u64 {
                return Err(HarnessError::TooFewQueues {
                    offered: offered_queues.saturating_sub(1),
                    wanted: options.request_queues,
                });
            }
        } else if options.request_queues > 1 {
            return Err(HarnessError::TooFewQueues {
                offered: 1,
                wanted: options.request_queues,
            });
        }
        let tag = if wanted.contains(VhostUserProtocolFeatures::CONFIG) {
            let (_, space) = frontend
                .get_config(
                    0,
                    TAG_LEN as u32,
                    VhostUserConfigFlags::empty(),
                    &[0u8; TAG_LEN],
                )
                .map_err(HarnessError::Vhost)?;
            let end = space.iter().position(|&b| b == 0).unwrap_or(space.len());
            Some(String::from_utf8_lossy(&space[..end]).into_owned())
        } else {
            None
        };
        let event_idx = offered & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let acked = (1 << VIRTIO_F_VERSION_1)
            | protocol_bit
            | if event_idx {
                1 << VIRTIO_RING_F_EVENT_IDX
            } else {
                0
            };
        frontend.set_features(acked).map_err(HarnessError::Vhost)?;

        let mut memory = SharedMemory::new(options.memory_size)?;
        frontend
            .set_mem_table(&memory.regions()?)
            .map_err(HarnessError::Vhost)?;
        let mut queues = Vec::with_capacity(num_queues);
        for index in 0..num_queues {
            let queue = SplitQueue::new(&mut memory, options.queue_size, event_idx)?;
            frontend
                .set_vring_num(index, options.queue_size)
                .map_err(HarnessError::Vhost)?;
            frontend
                .set_vring_base(index, 0)
                .map_err(HarnessError::Vhost)?;
            frontend
                .set_vring_addr(index, &queue.config_data()?)
                .map_err(HarnessError::Vhost)?;
            frontend
                .set_vring_kick(index, queue.kick_fd())
                .map_err(HarnessError::Vhost)?;
            frontend
                .set_vring_call(index, queue.call_fd())
                .map_err(HarnessError::Vhost)?;
            frontend
                .set_vring_enable(index, true)
                .map_err(HarnessError::Vhost)?;
            queues.push(Some(queue));
        }
        Ok(Device {
            frontend,
            memory,
            queues,
            tag,
            event_idx,
        })
    }

    /// The tag from the configuration space, if the device offers CONFIG.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// Whether EVENT_IDX was negotiated.
    pub fn event_idx(&self) -> bool {
        self.event_idx
    }

    /// The shared memory, for allocating buffers.
    pub fn memory(&mut self) -> &mut SharedMemory {
        &mut self.memory
    }

    /// Takes queue `index` (0 = hiprio) out of the device, to drive it from
    /// another thread. Returns `None` if it was taken already.
    pub fn take_queue(&mut self, index: usize) -> Option<SplitQueue> {
        self.queues.get_mut(index)?.take()
    }

    /// Allocates a buffer of `len` bytes in the shared memory.
    pub fn alloc(&mut self, len: u64) -> Result<GuestAddress> {
        self.memory.alloc(len, 64)
    }

    /// The vhost-user connection, for sending further control messages.
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.frontend
    }
}
