//! Errors of the virtio-fs device.

use std::io;

/// Why the device could not be set up or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tag is empty, too long or contains a NUL byte.
    #[error("the virtio-fs tag {0:?} must be 1 to 36 bytes without NUL bytes")]
    InvalidTag(String),
    /// The number of request queues is out of range.
    #[error("the number of request queues must be between 1 and {max}, got {got}")]
    InvalidQueueCount {
        /// The number asked for.
        got: usize,
        /// The largest number supported.
        max: usize,
    },
    /// The queue size is not a power of two between 2 and 32768.
    #[error("the queue size must be a power of two between 2 and 32768, got {0}")]
    InvalidQueueSize(u32),
    /// The request size limit is too small to hold a FUSE request header.
    #[error("the request size limit must be at least {min} bytes, got {got}")]
    InvalidRequestLimit {
        /// The limit asked for.
        got: usize,
        /// The smallest limit accepted.
        min: usize,
    },
    /// The per-queue counters given do not match the number of queues.
    #[error("{got} queue counters given for {queues} queues")]
    QueueStatsMismatch {
        /// Counters given.
        got: usize,
        /// Queues of the device (hiprio included).
        queues: usize,
    },
    /// The bound on waiting requests or the number of waiter threads is out
    /// of range.
    #[error("--max-waiting/--waiters: {0}")]
    InvalidWaiting(String),
    /// An eventfd for stopping the workers could not be created.
    #[error("cannot create a worker exit eventfd")]
    ExitEvent(#[source] io::Error),
    /// The waiter threads or their completion eventfds could not be set up.
    #[error("cannot start the threads that answer waiting requests")]
    Waiters(#[source] io::Error),
    /// The vhost-user socket could not be created.
    #[error("cannot listen on the vhost-user socket {path}")]
    Listen {
        /// The socket path.
        path: String,
        /// What went wrong.
        #[source]
        cause: vhost::vhost_user::Error,
    },
    /// The vhost-user daemon failed while serving a connection. The daemon's
    /// error is kept as text: it can hold a thread's panic payload, which is
    /// not `Sync`, and this error must travel into `anyhow`.
    #[error("the vhost-user connection failed: {0}")]
    Daemon(String),
}

/// Result of device setup and serving.
pub type Result<T> = std::result::Result<T, Error>;
