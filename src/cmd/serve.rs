//! `sluice serve`: the virtio-fs device over vhost-user for one VM.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use sluice_engine::vfs::{Vfs, VfsConfig};
use sluice_engine::volume::open_volume_url;
use sluice_fuse::{Config, Dispatcher};
use sluice_numa::memory::PageLocations;
use sluice_numa::{PlacementOptions, Topology, VmRequest};
use sluice_vhost::{DeviceConfig, FuseHandler, VirtioFsDevice};

/// Arguments of `sluice serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: String,
    /// The vhost-user socket QEMU connects to (a stale socket is replaced).
    #[arg(long)]
    pub socket: PathBuf,
    /// The tag the guest mounts (`mount -t virtiofs TAG /data`), at most 36 bytes.
    #[arg(long, default_value = "sluice")]
    pub tag: String,
    /// Request queues offered to the guest (QEMU's num-request-queues must match).
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// The NUMA node that holds the guest's memory, for the placement plan.
    #[arg(long, default_value_t = 0)]
    pub node: usize,
    /// Memory block cache, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub cache_size: usize,
    /// Write buffer per file, in MiB.
    #[arg(long, default_value_t = 64)]
    pub buffer_size: usize,
    /// Serve one VM connection, then exit (default: accept the VM again after
    /// it disconnects or reboots).
    #[arg(long)]
    pub once: bool,
}

/// Runs `sluice serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.queues == 0 || args.cache_size == 0 || args.buffer_size == 0 {
        bail!("--queues, --cache-size and --buffer-size must be at least 1");
    }
    let device_config = DeviceConfig::new(args.tag.clone(), args.queues);
    device_config
        .validate()
        .context("invalid device settings")?;
    print_plan(&args);
    let volume = open_volume_url(&args.meta_url)
        .with_context(|| format!("cannot open the volume at {}", args.meta_url))?;
    let mut listener = sluice_vhost::listen(&args.socket)
        .with_context(|| format!("cannot listen on {}", args.socket.display()))?;
    log::info!(
        "serving volume {} as virtio-fs tag {:?} with {} request queue(s) on {} (simd {})",
        volume.name(),
        args.tag,
        args.queues,
        args.socket.display(),
        sluice_simd::selected()
    );
    loop {
        // Each connection gets its own file-system session: a rebooted guest
        // starts with a fresh FUSE INIT, and the previous session has flushed
        // and closed when `serve` returns.
        let vfs = Vfs::new(
            volume.clone(),
            VfsConfig {
                cache_bytes: args.cache_size << 20,
                buffer_bytes: args.buffer_size << 20,
                ..VfsConfig::default()
            },
        )
        .context("cannot start the file system")?;
        let handler = Arc::new(FuseHandler::new(
            Dispatcher::new(vfs, Config::default()),
            device_config.num_queues(),
        ));
        let device = VirtioFsDevice::new(device_config.clone(), handler)
            .context("cannot create the virtio-fs device")?;
        log::info!("waiting for a VM on {}", args.socket.display());
        device
            .serve(&mut listener)
            .context("the vhost-user connection failed")?;
        log::info!("the VM disconnected; its session is flushed and closed");
        if args.once {
            return Ok(());
        }
    }
}

/// Prints the host topology and where this VM's queue workers belong.
fn print_plan(args: &ServeArgs) {
    let topology = match Topology::host() {
        Ok(t) => t,
        Err(e) => {
            log::warn!("cannot read the NUMA topology ({e}); no placement plan");
            return;
        }
    };
    let vm = VmRequest {
        name: args.tag.clone(),
        queues: args.queues,
        memory: PageLocations::from_counts([(args.node, 1)]),
    };
    match sluice_numa::describe(&topology, &[vm], PlacementOptions::default()) {
        Ok(plan) => println!("{plan}"),
        Err(e) => log::warn!("no placement plan: {e}"),
    }
}
