//! A host-side virtio-fs driver that plays the guest.
//!
//! It shares memfd-backed "guest RAM" with a vhost-user-fs device through
//! `vhost`'s frontend, lays out split virtqueues in that memory, fills and
//! drains them itself and speaks FUSE over them: INIT, LOOKUP, OPEN, READ,
//! WRITE, READDIRPLUS, RELEASE. It drives any vhost-user-fs socket, sluice's
//! or virtiofsd's. [`run`] is `sluice bench virtiofs`; the integration tests
//! use [`Device`] and [`FuseQueue`] directly.

mod bench;
mod device;
mod error;
mod guest_memory;
mod process_cpu;
mod session;
mod virtqueue;
pub mod wire;

pub use bench::{
    ColdReport, Latency, Pattern, Report, VirtiofsArgs, fill_pattern, memcpy_throughput, run,
};
pub use device::{Device, DeviceOptions};
pub use error::{HarnessError, Result};
pub use guest_memory::{GUEST_BASE, SharedMemory, memfd_region};
pub use process_cpu::{cpu_seconds, parse_stat_ticks};
pub use session::{FuseQueue, REQUEST_TIMEOUT};
pub use virtqueue::{RawDescriptor, SplitQueue};
