//! Where sluice's work and memory live.
//!
//! * [`topology`]: nodes, CPUs, memory, distances, sockets and SMT siblings from sysfs.
//! * [`placement`]: which cores run each VM's queue workers and the service work.
//! * [`pinning`]: pinning threads to those cores.
//! * [`memory`]: node-local buffers (mmap + mbind) and where a mapping's pages live.
//! * [`memlock`]: raising RLIMIT_MEMLOCK for fixed buffers.
//! * [`reactor`]: the per-core I/O reactor (io_uring, or a pread/pwrite pool as fallback).
//!
//! This crate depends on no other sluice crate. The placement policy is in `DESIGN.md`.

pub mod cpuset;
pub mod memlock;
pub mod memory;
pub mod pinning;
pub mod placement;
pub mod reactor;
pub mod topology;

pub use cpuset::CpuSet;
pub use memory::{NodeBuffer, PageLocations, PageSize, PreferNode};
pub use placement::{PlacementOptions, Plan, VmRequest, plan};
pub use reactor::{BackendKind, Reactor, ReactorConfig, ReactorHandle};
pub use topology::{NodeId, Topology};

/// Prints the host topology and the placement of `vms` on it, for `sluice serve`.
pub fn describe(
    topology: &Topology,
    vms: &[VmRequest],
    options: PlacementOptions,
) -> Result<String, placement::PlacementError> {
    let plan = plan(topology, vms, options)?;
    Ok(format!("{topology}{}", plan.describe()))
}
