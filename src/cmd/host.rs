//! `sluice host`: the host daemon of one volume, which owns the block
//! caches and object fetches that every `sluice serve --host` of the volume
//! on this host shares (host/DESIGN.md).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use sluice_engine::meta::MetaUrl;
use sluice_engine::object::ObjectStore;
use sluice_engine::object::disk_cache::{CachedStore, DiskCache};
use sluice_engine::object::s3::S3Options;
use sluice_engine::volume::open_volume_with;
use sluice_host::{FillMode, Host, HostConfig};

use super::cache_args::CacheArgs;
use crate::sandbox::{Sandbox, SandboxArgs};

/// Arguments of `sluice host`.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Metadata engine URL of the volume, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: MetaUrl,
    /// The socket the VM servers (`sluice serve --host PATH`) connect to (a
    /// stale socket is replaced); `sluice stats PATH` shows the host and
    /// each VM. A link to it in /run/sluice/hosts/ (named by the volume's
    /// UUID) is where virtiofsd drop-ins of the volume find it.
    #[arg(long, value_name = "PATH")]
    pub control: PathBuf,
    /// Give the socket to this group, mode 0660, for VM servers that run
    /// as other users of the group; without it the socket is 0600, owned
    /// by the user the daemon runs as (`--user`): servers running as that
    /// user attach.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Memory block cache shared by the VMs: a size (16G; a bare number is
    /// MiB). Each block is held once, however many VMs read it — once per
    /// NUMA node on a host with several, each node's table a share of it.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "1G",
        value_parser = sluice_engine::size::size_parser(
            sluice_engine::size::Unit::Mib,
            sluice_engine::size::SizeRange::new(1 << 20, u64::MAX)
        )
    )]
    pub cache_size: u64,
    /// Threads that fetch blocks from the object store, for all VMs (taken
    /// round robin across the VMs that wait).
    #[arg(long, value_name = "N", default_value_t = HostConfig::default().fetchers)]
    pub fetchers: usize,
    /// Most block requests one VM may have unanswered; at the bound the
    /// host reads no more of its requests until one is answered.
    #[arg(long, value_name = "N", default_value_t = HostConfig::default().max_outstanding)]
    pub vm_outstanding: u32,
    /// Most of the memory cache one VM's blocks may hold, in percent (a
    /// block counts for the VM whose request fetched it): past it a VM's
    /// own least recently used blocks go first, so one VM streaming a big
    /// data set cannot push out every other VM's. 100: no cap.
    #[arg(
        long,
        value_name = "PERCENT",
        default_value_t = 100,
        value_parser = clap::value_parser!(u8).range(1..=100)
    )]
    pub vm_cache_share: u8,
    /// The disk block cache (the host is its only owner).
    #[command(flatten)]
    pub cache: CacheArgs,
    /// The sandbox the daemon runs in once set up.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub metrics: super::metrics_args::MetricsArgs,
}

/// Runs `sluice host`.
pub fn run(args: HostArgs) -> anyhow::Result<()> {
    let signals = super::mount::block_termination_signals();
    if args.fetchers == 0 || args.vm_outstanding == 0 {
        anyhow::bail!("--fetchers and --vm-outstanding must be at least 1");
    }
    let sandbox = Sandbox::new(&args.sandbox)?;
    let notifier = crate::notify::Notifier::from_env();
    let disk_cache = args.cache.disk_cache()?;
    let meta = sluice_engine::meta::open_existing_meta(args.meta_url.expose())
        .with_context(|| format!("cannot open the volume at {}", args.meta_url))?;
    let group = args
        .socket_group
        .as_deref()
        .map(|g| {
            sluice_vhost::socket::group_id(g)
                .with_context(|| format!("--socket-group {g}: no such group"))
        })
        .transpose()?;
    let listener = sluice_host::socket::listen(&args.control, group)
        .with_context(|| format!("cannot listen on {}", args.control.display()))?;
    // The VM servers connect as the user they run as: the socket is the
    // service user's (mode 0600), or its group's with --socket-group (0660).
    if let Some(uid) = sandbox.target_uid() {
        std::os::unix::fs::lchown(&args.control, Some(uid), None).with_context(|| {
            format!("cannot give {} to the service user", args.control.display())
        })?;
    }
    // Bound while still root and unconfined, served once the sandbox is
    // up: `sluice stats PATH` asks PATH.control, as of a `serve` socket.
    let metrics_socket = args.metrics.bind()?;
    let stats_path = super::control::socket_for_serve(&args.control);
    let stats = super::control::ControlServer::bind(&stats_path, group)
        .map_err(|e| log::warn!("no control socket, so no `sluice stats` for this daemon: {e:#}"))
        .ok();
    // Where a virtiofsd drop-in of the volume finds this daemon.
    let mut ours = vec![args.control.clone(), stats_path];
    match meta
        .load()
        .map_err(anyhow::Error::from)
        .and_then(|f| super::host_registry::advertise(&f.uuid, &args.control))
    {
        Ok(link) => ours.push(link),
        Err(e) => log::warn!(
            "virtiofsd drop-ins of this volume will not find this daemon by themselves              (give their volume `--host {}` in SLUICE_ARGS): {e:#}",
            args.control.display()
        ),
    }
    super::socket_cleanup::remove_at_exit(&ours);
    let cache_roots: Vec<&std::path::Path> = disk_cache
        .iter()
        .flat_map(|c| c.dirs.iter().map(|d| d.path.as_path()))
        .collect();
    let state = super::serve::volume_state(args.meta_url.expose(), meta.as_ref(), &cache_roots);
    sandbox.confine_files(&state)?;
    let volume = open_volume_with(meta, &S3Options::default())
        .with_context(|| format!("cannot open the volume at {}", args.meta_url))?;
    let volume = match disk_cache {
        Some(cfg) => {
            let cache = DiskCache::open(volume.name(), &volume.format.uuid, cfg)
                .context("cannot open the disk cache")?;
            let store: Arc<dyn ObjectStore> =
                Arc::new(CachedStore::new(volume.store.clone(), cache.clone()));
            log::info!(
                "disk cache: {} MiB over {}",
                cache.config().capacity >> 20,
                store.describe()
            );
            volume.with_store(store)
        }
        None => volume,
    };
    // Read before the sandbox closes /sys to the daemon.
    let fill = FillMode::for_this_host();
    let nodes = memory_nodes();
    sandbox.lock_down(&state)?;
    let cfg = HostConfig {
        cache_bytes: args.cache_size,
        fetchers: args.fetchers,
        max_outstanding: args.vm_outstanding,
        vm_cache_share: if args.vm_cache_share >= 100 {
            u64::MAX
        } else {
            args.cache_size / 100 * u64::from(args.vm_cache_share)
        },
        fill: Some(fill),
        nodes,
        ..HostConfig::default()
    };
    let host =
        Host::start(volume.clone(), cfg, listener).context("cannot start the host daemon")?;
    let metrics = crate::metrics::Metrics::new(
        crate::metrics::Sources {
            volume: volume.clone(),
            ops: Arc::new(sluice_fuse::OpMetrics::default()),
            queues: None,
            session: Default::default(),
            cache_node: None,
            subdir: String::new(),
            started: std::time::Instant::now(),
            host: Some(host.clone()),
            host_client: None,
        },
        &args.control.to_string_lossy(),
    );
    let _endpoint = metrics_socket.and_then(|m| {
        m.start(metrics.clone())
            .map_err(|e| log::warn!("no metrics endpoint: {e:#}"))
            .ok()
    });
    let _stats = stats.and_then(|c| {
        c.start(Default::default(), Some(metrics))
            .map_err(|e| {
                log::warn!("no control socket, so no `sluice stats` for this daemon: {e:#}")
            })
            .ok()
    });
    log::info!(
        "host daemon of volume {} on {} ({} MiB memory cache, {} fetchers)",
        volume.name(),
        args.control.display(),
        args.cache_size >> 20,
        args.fetchers
    );
    if let Some(notifier) = &notifier {
        notifier.ready(&format!(
            "host daemon of volume {} on {}",
            volume.name(),
            args.control.display()
        ));
    }
    let sig = super::mount::wait_for_signal(&signals);
    log::info!("signal {sig}: the VM servers go on standalone; exiting");
    let clients = host.clients().len();
    host.stop();
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let stats = host.stats();
    log::info!(
        "the host fetched {} blocks ({} bytes, {} failed); {} memory hits, {} disk-cache hits, \
         {} joined a fetch in flight; {clients} VM(s) attached at the end",
        n(&stats.fetches),
        n(&stats.fetched_bytes),
        n(&stats.fetch_errors),
        n(&stats.memory_hits),
        n(&stats.file_hits),
        n(&stats.joined)
    );
    Ok(())
}

/// The NUMA nodes with both CPUs and memory, where the host holds blocks
/// (one memory table each); empty where the topology cannot be read.
/// Memory-only nodes (CXL expanders, the GPU memory Grace Hopper shows as
/// nodes) get none: guest memory lives on CPU nodes, and a table each
/// would split `--cache-size` among nodes no VM reads from.
fn memory_nodes() -> Vec<usize> {
    match sluice_numa::topology::Topology::host() {
        Ok(t) => t
            .nodes()
            .iter()
            .filter(|n| n.mem_bytes > 0 && !n.cpus.is_empty())
            .map(|n| n.id)
            .collect(),
        Err(e) => {
            log::warn!("cannot read the NUMA topology ({e}); one memory table for all VMs");
            Vec::new()
        }
    }
}
