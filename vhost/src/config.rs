//! The device's settings and its virtio-fs configuration space.

use crate::error::{Error, Result};
use crate::frame::IN_HEADER_LEN;
use crate::guest_io::GuestIoMode;

/// Length of the `tag` field of the virtio-fs configuration space.
pub const TAG_LEN: usize = 36;

/// Length of the virtio-fs configuration space this device exposes:
/// `tag[36]` followed by `num_request_queues` (le32).
pub const CONFIG_SPACE_LEN: usize = TAG_LEN + 4;

/// The most request queues the device offers: the vhost-user-backend worker map
/// is a 64-bit mask per thread and the hiprio queue takes one bit.
pub const MAX_REQUEST_QUEUES: usize = 63;

/// Settings of one virtio-fs device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The tag the guest mounts (`mount -t virtiofs TAG /mnt`).
    pub tag: String,
    /// Number of request queues (queue 0 is the hiprio queue, request queues
    /// are 1..=N). Each gets its own worker thread.
    pub request_queues: usize,
    /// Largest queue size the device accepts.
    pub queue_size: u16,
    /// Largest request (header, arguments and WRITE payload) the device
    /// accepts; larger requests are answered with `E2BIG`.
    pub max_request_size: usize,
    /// The CPU each queue's worker thread pins itself to, by queue index
    /// (0 = hiprio); `None` or a missing entry leaves that worker unpinned.
    /// `sluice serve` fills it from the NUMA placement plan.
    pub worker_cpus: Vec<Option<usize>>,
    /// How READ data from local files (`file://` objects, disk-cache files)
    /// reaches guest memory: io_uring into registered guest memory, or pread.
    pub guest_io: GuestIoMode,
    /// Most requests of one queue that wait (a block not in the memory
    /// cache, a commit, a sync) on the waiter threads while the queue's
    /// worker goes on with the others; at the bound the worker stops taking
    /// requests off the ring until one comes back. 0 answers every request
    /// on the worker, in ring order (the behaviour before out-of-order
    /// completion).
    pub max_waiting: usize,
    /// Threads that run the requests that wait, for all queues of the
    /// device.
    pub waiters: usize,
}

impl DeviceConfig {
    /// Default largest queue size, as virtiofsd offers.
    pub const DEFAULT_QUEUE_SIZE: u16 = 1024;
    /// Default request size limit: a 4 MiB write plus room for headers.
    pub const DEFAULT_MAX_REQUEST_SIZE: usize = 4 * 1024 * 1024 + 4096;
    /// Default bound on a queue's requests with the waiters.
    pub const DEFAULT_MAX_WAITING: usize = 64;
    /// Default number of waiter threads.
    pub const DEFAULT_WAITERS: usize = 16;
    /// The most waiter threads a device may have.
    pub const MAX_WAITERS: usize = 1024;

    /// A configuration with the given tag and queue count and default limits.
    pub fn new(tag: impl Into<String>, request_queues: usize) -> Self {
        DeviceConfig {
            tag: tag.into(),
            request_queues,
            queue_size: Self::DEFAULT_QUEUE_SIZE,
            max_request_size: Self::DEFAULT_MAX_REQUEST_SIZE,
            worker_cpus: Vec::new(),
            guest_io: GuestIoMode::default(),
            max_waiting: Self::DEFAULT_MAX_WAITING,
            waiters: Self::DEFAULT_WAITERS,
        }
    }

    /// Checks every setting and says which one is wrong.
    pub fn validate(&self) -> Result<()> {
        let tag = self.tag.as_bytes();
        if tag.is_empty() || tag.len() > TAG_LEN || tag.contains(&0) {
            return Err(Error::InvalidTag(self.tag.clone()));
        }
        if self.request_queues == 0 || self.request_queues > MAX_REQUEST_QUEUES {
            return Err(Error::InvalidQueueCount {
                got: self.request_queues,
                max: MAX_REQUEST_QUEUES,
            });
        }
        if self.queue_size < 2 || !self.queue_size.is_power_of_two() {
            return Err(Error::InvalidQueueSize(u32::from(self.queue_size)));
        }
        if self.max_waiting > usize::from(u16::MAX) {
            return Err(Error::InvalidWaiting(format!(
                "at most {} requests of a queue can wait, not {}",
                u16::MAX,
                self.max_waiting
            )));
        }
        if self.max_waiting > 0 && !(1..=Self::MAX_WAITERS).contains(&self.waiters) {
            return Err(Error::InvalidWaiting(format!(
                "between 1 and {} waiter threads, not {}",
                Self::MAX_WAITERS,
                self.waiters
            )));
        }
        if self.max_request_size < IN_HEADER_LEN {
            return Err(Error::InvalidRequestLimit {
                got: self.max_request_size,
                min: IN_HEADER_LEN,
            });
        }
        Ok(())
    }

    /// Total virtqueues: the hiprio queue plus the request queues.
    pub fn num_queues(&self) -> usize {
        1 + self.request_queues
    }

    /// The configuration space as the guest reads it (virtio-fs spec 5.11.4).
    pub fn config_space(&self) -> [u8; CONFIG_SPACE_LEN] {
        let mut space = [0u8; CONFIG_SPACE_LEN];
        let tag = self.tag.as_bytes();
        let n = tag.len().min(TAG_LEN);
        space[..n].copy_from_slice(&tag[..n]);
        // `request_queues` is at most MAX_REQUEST_QUEUES once validated.
        let queues = u32::try_from(self.request_queues).unwrap_or(u32::MAX);
        space[TAG_LEN..].copy_from_slice(&queues.to_le_bytes());
        space
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_space_holds_tag_and_queue_count() {
        let config = DeviceConfig::new("training", 4);
        config.validate().expect("valid config");
        let space = config.config_space();
        assert_eq!(&space[..8], b"training");
        assert!(space[8..TAG_LEN].iter().all(|&b| b == 0));
        assert_eq!(&space[TAG_LEN..], &4u32.to_le_bytes());
    }

    #[test]
    fn bad_settings_are_rejected() {
        assert!(matches!(
            DeviceConfig::new("", 1).validate(),
            Err(Error::InvalidTag(_))
        ));
        assert!(matches!(
            DeviceConfig::new("x".repeat(37), 1).validate(),
            Err(Error::InvalidTag(_))
        ));
        assert!(matches!(
            DeviceConfig::new("fs", 0).validate(),
            Err(Error::InvalidQueueCount { .. })
        ));
        assert!(matches!(
            DeviceConfig::new("fs", 64).validate(),
            Err(Error::InvalidQueueCount { .. })
        ));
        let mut none = DeviceConfig::new("fs", 1);
        none.waiters = 0;
        assert!(matches!(none.validate(), Err(Error::InvalidWaiting(_))));
        none.max_waiting = 0;
        none.validate()
            .expect("no waiters needed when nothing waits");
        let mut odd = DeviceConfig::new("fs", 1);
        odd.queue_size = 100;
        assert!(matches!(odd.validate(), Err(Error::InvalidQueueSize(100))));
    }
}
