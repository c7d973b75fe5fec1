//! The sluice virtio-fs device: a vhost-user-fs backend.
//!
//! The guest's virtiofs driver places FUSE requests on virtqueues: queue 0 is
//! the hiprio queue (FORGET, INTERRUPT), queues 1..=N are request queues. Each
//! queue is owned by one worker thread, which pops descriptor chains in
//! batches, checks each chain against the guest's memory regions
//! ([`descriptor`]), checks the FUSE framing ([`frame`]), hands the request
//! bytes — for a WRITE its header and arguments, the data left in guest
//! memory behind a [`Reader`] — to a [`RequestHandler`] together with a
//! [`Writer`] that scatters the reply straight into the guest's writable
//! buffers, and signals the guest once per batch (EVENT_IDX). A request that would wait goes with its chain to a
//! waiter thread and comes back through the queue's eventfd, so the requests
//! behind it are answered meanwhile.
//!
//! A malformed chain or request never reaches the handler: it is answered with
//! an error reply (`EFAULT` for buffers outside guest memory, `EINVAL` for bad
//! framing, `E2BIG` for oversized requests).

mod backend;
pub mod config;
pub mod descriptor;
mod error;
pub mod frame;
mod fuse_handler;
pub mod guest_io;
pub mod socket;
mod waiting;
mod worker;

use std::io;

/// The source a WRITE's data is taken from ([`RequestHandler::handle`]'s
/// `data`).
pub use sluice_api::source::WriteSource;

pub use backend::{
    DEVICE_FEATURES, Socket, VirtioFsDevice, listen, listen_inherited, protocol_features,
};
pub use config::DeviceConfig;
pub use descriptor::{ChainBuffers, ChainError, Reader, Writer};
pub use error::{Error, Result};
pub use guest_io::{GuestIoMode, ParseGuestIoModeError, SYS_CACHESTAT};

/// The device's errors must convert into `anyhow::Error` at the binary.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Error>();
};
pub use fuse_handler::FuseHandler;
pub use worker::{QueueStats, REJECT_ERRNOS, queue_latency_bounds};

/// Answers FUSE requests taken off a virtqueue.
///
/// This is the boundary between the device and the FUSE protocol layer: the
/// device has already checked that `request` and `data` together are one
/// complete FUSE message (the header's `len` equal to the chain's readable
/// length, within the size limit).
pub trait RequestHandler: Send + Sync + 'static {
    /// Handles one request taken from queue `queue` (0 = hiprio).
    ///
    /// `request` holds the bytes the device read into host memory: the
    /// whole message, except for a WRITE, where it holds the header and the
    /// `fuse_write_in` and `data` the bytes after them, still in the
    /// guest's descriptors (the file system takes them from there into its
    /// write buffer: one copy). `data` is empty for every other request.
    ///
    /// The reply (out header and payload) is written to `reply`, which writes
    /// straight into the guest's buffers; requests that take no reply (FORGET)
    /// write nothing. If this returns an error before writing anything, the
    /// device answers `EIO` — except an error of kind `WouldBlock`: the
    /// request would wait (a queue worker runs it under
    /// `sluice_api::wait::no_wait`), and the device runs it again on a
    /// waiter thread, with a fresh `reply` and `data` (the same bytes, read
    /// again from the chain, which the guest gets back only once answered).
    fn handle(
        &self,
        queue: u16,
        request: &[u8],
        data: &mut dyn WriteSource,
        reply: &mut Writer<'_>,
    ) -> io::Result<()>;

    /// Called once the frontend has disconnected and every worker has
    /// stopped: no request will come any more on this connection. A file
    /// system flushes here what the guest did not.
    fn connection_closed(&self) {}
}

impl<T: RequestHandler + ?Sized> RequestHandler for std::sync::Arc<T> {
    fn handle(
        &self,
        queue: u16,
        request: &[u8],
        data: &mut dyn WriteSource,
        reply: &mut Writer<'_>,
    ) -> io::Result<()> {
        (**self).handle(queue, request, data, reply)
    }

    fn connection_closed(&self) {
        (**self).connection_closed()
    }
}
