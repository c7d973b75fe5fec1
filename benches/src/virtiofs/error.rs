//! Errors of the virtio-fs driver harness.

use std::io;

/// What went wrong while driving a virtio-fs device.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The shared guest memory could not be created or mapped.
    #[error("cannot create the shared guest memory")]
    GuestMemory(#[source] io::Error),
    /// The guest memory is too small for what was asked.
    #[error("guest memory is exhausted allocating {0} bytes; use less depth or block size")]
    OutOfGuestMemory(u64),
    /// A vhost-user message failed.
    #[error("vhost-user request failed")]
    Vhost(#[source] vhost::Error),
    /// The device lacks a feature the harness needs.
    #[error("the device does not offer {0}")]
    MissingFeature(&'static str),
    /// The device has fewer request queues than asked for.
    #[error("the device offers {offered} request queues, {wanted} were asked for")]
    TooFewQueues {
        /// Request queues the device offers.
        offered: u64,
        /// Request queues asked for.
        wanted: usize,
    },
    /// An eventfd could not be created or written.
    #[error("eventfd operation failed")]
    EventFd(#[source] io::Error),
    /// Reading or writing the shared memory failed.
    #[error("access to the shared guest memory failed: {0}")]
    Memory(String),
    /// All descriptors of the queue are in use.
    #[error("the virtqueue has no free descriptors for a chain of {0}")]
    QueueFull(usize),
    /// The device returned a descriptor head the driver never made available.
    #[error("the device returned unknown descriptor head {0}")]
    BadUsedHead(u32),
    /// No reply came back in time.
    #[error("no reply from the device within {0:?}")]
    Timeout(std::time::Duration),
    /// A FUSE reply was shorter than its structure or otherwise malformed.
    #[error("malformed FUSE reply to opcode {opcode}: {why}")]
    BadReply {
        /// The request's opcode.
        opcode: u32,
        /// What is wrong with it.
        why: String,
    },
    /// The file system answered with an error.
    #[error("FUSE opcode {opcode} failed with errno {errno}")]
    Errno {
        /// The request's opcode.
        opcode: u32,
        /// The positive errno value.
        errno: i32,
    },
}

/// Result of harness operations.
pub type Result<T> = std::result::Result<T, HarnessError>;

impl From<vm_memory::GuestMemoryError> for HarnessError {
    fn from(e: vm_memory::GuestMemoryError) -> Self {
        HarnessError::Memory(e.to_string())
    }
}
