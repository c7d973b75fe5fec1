//! One host, many VMs: the host daemon of a volume (`sluice host`), which
//! owns the block caches and object fetches that every VM's server of that
//! volume shares, and the client those servers use (`sluice serve
//! --host`). See DESIGN.md beside this crate for the protocol, who owns
//! what, the threat model and the failure rules.
//!
//! - [`wire`]: the messages, decoded with every length checked.
//! - [`socket`]: the `SOCK_SEQPACKET` control socket and descriptor passing.
//! - [`block_memory`]: sealed memfds (host) and read-only mappings (VM).
//! - [`server`]: the daemon's block service.
//! - [`client`]: the VM server's block source.

pub mod block_memory;
pub mod client;
mod lru;
pub mod server;
pub mod socket;
pub mod wire;

pub use client::{ClientConfig, HostClient, Locator};
pub use server::{FillMode, Host, HostConfig};
