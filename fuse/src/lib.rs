//! The FUSE wire protocol, written once and independent of the transport,
//! and the `/dev/fuse` transport for host mounts.
//!
//! - [`abi`]: the kernel ABI structs of `linux/fuse.h` (protocol 7.38).
//! - [`request`]: bytes → [`Request`], every length checked.
//! - [`reply`]: results → reply bytes; payloads stay where they are.
//! - [`Filesystem`] (from `sluice-api`): the trait the dispatcher calls;
//!   the engine's `Vfs` implements it, and this crate never sees the engine.
//! - [`dispatch`]: [`Dispatcher`] runs a request against a file system and
//!   sends the reply through a [`ReplySink`]; errno mapping happens here,
//!   through `sluice_api::Error::errno`, and nowhere else.
//! - [`log_limit`]: rate limits for warnings a client can cause.
//! - [`dev`] and [`session`]: mounting through `/dev/fuse` and serving the
//!   mount with several worker threads.
//! - [`waiters`]: the pool of waiter threads both transports hand the
//!   requests that would wait to (`sluice_api::wait`).
//!
//! # Why our own codec
//!
//! The virtio-fs device (the `vhost` crate) must decode requests straight
//! out of guest descriptor chains and decide itself where READ data lands —
//! in guest memory, with at most one copy. Existing codecs do not allow
//! that combination: `fuse-backend-rs` 0.14 pins `vm-memory =0.17.1`, so its
//! types cannot be shared with `vhost-user-backend` 0.24 (built on
//! `vm-memory` 0.18), and its reply path owns the data buffers. Here the
//! decoder works on any byte slice (a WRITE's data may stay with the
//! transport, for the file system to take straight from guest memory), and
//! a reply is a small header block plus payload slices the transport sends
//! from wherever they already are.
//!
//! # Mounting
//!
//! ```no_run
//! # fn demo<F: sluice_fuse::Filesystem + 'static>(fs: F) -> Result<(), sluice_fuse::DevError> {
//! use sluice_fuse::{Config, MountOptions, Session};
//! let mount = sluice_fuse::dev::mount("/mnt/vol".as_ref(), &MountOptions::default())?;
//! let session = Session::new(fs, mount, Config::default());
//! session.run(4)?; // returns after `umount /mnt/vol`
//! # Ok(()) }
//! ```

pub mod abi;
pub mod confine;
pub mod dev;
pub mod dispatch;
pub mod export;
pub mod log_limit;
pub mod metrics;
pub mod reply;
pub mod request;
pub mod session;
pub mod waiters;

pub use dev::{DevError, Mount, MountOptions, unmount};
pub use dispatch::{Config, DataCache, Dispatcher, Outcome, ReadReply, ReplySink, Scratch};
pub use export::Export;
pub use metrics::{OpMetrics, OpSnapshot, method_name};
pub use reply::{ReplyHead, Timeouts};
pub use request::{BadRequest, DecodeError, Limits, Operation, Request, WriteData};
pub use session::{BackgroundSession, Session, Waiting};
/// The source a WRITE's data is taken from.
pub use sluice_api::source::{SliceSource, WriteSource};
/// The trait the dispatcher calls and the types it speaks in are
/// `sluice-api`'s; re-exported so transports and tests name one crate.
pub use sluice_api::{BufDest, Fh, Filesystem, Fragment, Listed, OpenOut, ReadDest};
