//! `sluice serve`: the virtio-fs device over vhost-user for one VM.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use sluice_engine::meta::{Context, FileType, Ino, Meta, MetaUrl, ROOT_INO, TRASH_INO};
use sluice_engine::object::disk_cache::DiskCacheConfig;
use sluice_engine::object::writeback::volume_dir;
use sluice_engine::vfs::{AtimeMode, DEFAULT_UPLOAD_DRAIN, Filesystem as _, Vfs, VfsConfig};
use sluice_engine::volume::Volume;
use sluice_fuse::{Config, DataCache, Dispatcher, Export, OpMetrics, Timeouts};
use sluice_numa::memory::PageLocations;
use sluice_numa::{PlacementOptions, Plan, Topology, VmRequest};
use sluice_vhost::{DeviceConfig, FuseHandler, GuestIoMode, QueueStats, VirtioFsDevice};

use super::cache_args::CacheArgs;
use super::writeback_args::WritebackArgs;
use crate::sandbox::{self, LocalState, Sandbox, SandboxArgs};

/// Arguments of `sluice serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: MetaUrl,
    /// The vhost-user socket QEMU connects to (a stale socket is replaced).
    #[arg(long)]
    pub socket: PathBuf,
    /// Serve on this already-listening socket instead of creating `--socket`
    /// (libvirt's `--fd=N` to its `<binary>`; see src/cmd/libvirt.rs).
    #[arg(long, hide = true, value_name = "FD")]
    pub listen_fd: Option<i32>,
    /// The tag the guest mounts (`mount -t virtiofs TAG /data`), at most 36 bytes.
    #[arg(long, default_value = "sluice")]
    pub tag: String,
    /// Request queues offered to the guest: QEMU's num-request-queues (Cloud
    /// Hypervisor's num_queues) may be at most this; a queue the VMM never
    /// starts costs an idle thread.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// The NUMA node that holds the guest's memory, for the placement plan.
    #[arg(long, default_value_t = 0)]
    pub node: usize,
    #[command(flatten)]
    pub memory: super::memory_args::MemoryArgs,
    /// Serve one VM connection, then exit (default: accept the VM again after
    /// it disconnects or reboots).
    #[arg(long)]
    pub once: bool,
    /// Leave the queue workers unpinned (default: each request queue's worker
    /// is pinned to the core the placement plan gives it).
    #[arg(long)]
    pub no_pin: bool,
    /// Serve only this directory of the volume (a path from the volume's
    /// root, e.g. `datasets/imagenet`); the guest sees it as its root and
    /// cannot reach anything above it.
    #[arg(long, value_name = "SUBDIR")]
    pub export: Option<String>,
    /// Refuse every change from the guest (EROFS).
    #[arg(long)]
    pub read_only: bool,
    /// Give the vhost-user socket (and the control socket) to this group,
    /// mode 0660, for a QEMU that runs as another user of the group
    /// (libvirt's `qemu` user); without it the sockets are 0600, for QEMU
    /// running as the daemon's user.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// When reads and directory listings move access times: never
    /// (`noatime`, no metadata write per read, as JuiceFS defaults),
    /// `relatime` (Linux's rule: when older than the last change, or a day
    /// old) or `strictatime` (every read the engine sees).
    #[arg(
        long,
        value_name = "noatime|relatime|strictatime",
        default_value = "noatime"
    )]
    pub atime_mode: AtimeMode,
    /// How READ data from local files (a file:// store's objects, disk-cache
    /// files) reaches guest memory: `pread` lets the kernel copy it once
    /// from its page cache, without pinning; `direct` does the same for
    /// what the page cache holds and reads the rest (on a waiter thread)
    /// with O_DIRECT straight into guest memory where aligned (no CPU copy,
    /// the page cache left alone); `uring` reads it with the queue worker's
    /// io_uring ring into the guest's memory registered as fixed buffers,
    /// O_DIRECT where aligned (registering pins the guest's memory). See
    /// docs/tuning.md for which measured faster where.
    #[arg(long, value_name = "pread|direct|uring", default_value = "pread")]
    pub guest_io: GuestIoMode,
    /// Most requests of one queue answered out of order while they wait (a
    /// block not in the memory cache, a commit, a sync) on the waiter
    /// threads; the queue's worker goes on with the requests behind them,
    /// and stops taking requests from the guest at this bound until one
    /// comes back. 0 answers every request on the worker, in order.
    #[arg(long, value_name = "N", default_value_t = DeviceConfig::DEFAULT_MAX_WAITING)]
    pub max_waiting: usize,
    /// Threads that run the requests that wait, for all queues of the VM.
    #[arg(long, value_name = "N", default_value_t = DeviceConfig::DEFAULT_WAITERS)]
    pub waiters: usize,
    #[command(flatten)]
    pub limits: super::limit_args::LimitArgs,
    #[command(flatten)]
    pub readahead: super::readahead_args::ReadaheadArgs,
    #[command(flatten)]
    pub commit: super::commit_args::CommitArgs,
    #[command(flatten)]
    pub writeback: WritebackArgs,
    /// The disk block cache.
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Take blocks from the host daemon of this volume (`sluice host
    /// --control PATH`), which fetches each block once for every VM and
    /// holds it once; this server then keeps no disk cache of its own.
    /// Without the daemon (not started yet, restarting) it serves
    /// standalone and attaches again within a second of its return.
    #[arg(long, value_name = "PATH")]
    pub host: Option<PathBuf>,
    /// With `--host`: blocks kept mapped from the host daemon's memory (read
    /// only, no copy), so that a block read again is not asked for again.
    #[arg(long, value_name = "N", default_value_t = 256, requires = "host")]
    pub host_mappings: usize,
    /// The sandbox the daemon runs in once set up.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub metrics: super::metrics_args::MetricsArgs,
    /// What the virtiofsd drop-in (src/cmd/libvirt.rs) sets; not on the
    /// command line.
    #[arg(skip)]
    pub drop_in: DropIn,
}

/// How the virtiofsd drop-in runs `serve`: what virtiofsd's command line
/// asked for that `serve`'s own flags do not say.
#[derive(Debug, Clone, Default)]
pub struct DropIn {
    /// The directory served as the guest's root (virtiofsd's
    /// `--shared-dir`), found in the volume; instead of `--export`.
    pub shared_dir: Option<SharedDir>,
    /// The entry and attribute timeouts in replies (virtiofsd's
    /// `--cache`); `None`: one second, as `serve` gives.
    pub timeouts: Option<Duration>,
    /// Whether the guest caches file data (virtiofsd's `--cache`).
    pub data_cache: DataCache,
    /// Print virtiofsd's readiness line on stderr once the socket accepts
    /// (Kata's runtime-rs waits for it before it starts the VM).
    pub ready_line: bool,
    /// Attach to the host daemon of the volume when one runs here (found
    /// in `/run/sluice/hosts`, `src/cmd/host_registry.rs`), as `--host`
    /// would: virtiofsd's command line has no way to say it.
    pub find_host: bool,
}

/// Where the drop-in finds the host daemon of its volume.
enum Found {
    /// Its control socket, now.
    Now(PathBuf),
    /// Not running now: the volume's UUID, to look for it again.
    Later(String),
    /// The volume's settings cannot be read (said by what opens it next).
    Never,
}

/// The control socket of the host daemon of `meta`'s volume, if one runs
/// here; says either way.
fn find_host(meta: &dyn Meta) -> Found {
    let Ok(format) = meta.load() else {
        return Found::Never;
    };
    match super::host_registry::find(&format.uuid) {
        Ok(path) => {
            log::info!(
                "the host daemon of this volume listens on {} (from {}): taking blocks from it",
                path.display(),
                super::host_registry::dir().display()
            );
            Found::Now(path)
        }
        Err(why) => {
            log::info!("no host daemon to attach to now, serving standalone: {why}");
            Found::Later(format.uuid)
        }
    }
}

/// The readiness line virtiofsd prints (and Kata's runtime-rs waits for).
pub const READY_LINE: &str = "Waiting for vhost-user socket connection...";

/// A directory of the volume served as the guest's root, by inode: a
/// rename on the host does not change what the guest sees (as virtiofsd,
/// which holds the directory open); its removal ends the daemon.
#[derive(Debug, Clone)]
pub struct SharedDir {
    /// Its inode in the volume.
    pub ino: Ino,
    /// The host path it was given as (a mount's directory), for messages.
    pub host_path: PathBuf,
    /// Its names from the volume's root, to notice a rename.
    pub names: Vec<Vec<u8>>,
}

/// Where a served shared directory is now.
#[derive(Debug, PartialEq, Eq)]
enum SharedDirState {
    /// Under its names.
    InPlace,
    /// In the volume, under other names.
    Moved,
    /// Removed, or in the trash: the guest's root is gone.
    Gone(String),
}

/// Ends the current VM's file-system session (set while a VM is connected).
type SessionStop = Arc<parking_lot::Mutex<Option<Box<dyn FnOnce() + Send>>>>;

/// Runs `sluice serve`.
pub fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    // Before any thread starts, so that every thread inherits the mask and
    // only the signal thread (started once the sandbox is up) takes them.
    let signals = super::mount::block_termination_signals();
    if args.queues == 0 {
        bail!("--queues must be at least 1");
    }
    args.memory.apply(VfsConfig::default())?;
    args.readahead.apply(VfsConfig::default())?;
    args.commit.apply(VfsConfig::default())?;
    let client_limits = args.limits.apply(&mut VfsConfig::default())?;
    let sandbox = Sandbox::new(&args.sandbox)?;
    // Connected while still root and unconfined (see src/notify.rs).
    let notifier = crate::notify::Notifier::from_env();
    let mut device_config = DeviceConfig::new(args.tag.clone(), args.queues);
    device_config.guest_io = args.guest_io;
    device_config.max_waiting = args.max_waiting;
    device_config.waiters = args.waiters;
    device_config
        .validate()
        .context("invalid device settings")?;
    let mut prefetch_cpus = None;
    // The NUMA node the memory cache's blocks are allocated on, if placed.
    let mut cache_node = None;
    // Printed once the volume is open: a daemon that fails to start says
    // only why.
    let placement = plan_placement(&args);
    if let Some((plan, _)) = &placement
        && !args.no_pin
    {
        // Queue 0 (hiprio: FORGET, INTERRUPT) floats; request queue q is
        // served by the plan's worker for the VM's queue q - 1.
        device_config.worker_cpus = std::iter::once(None)
            .chain((0..args.queues).map(|q| plan.worker_for(0, q).map(|w| w.cpu)))
            .collect();
        // Readahead buffers are allocated by the prefetch threads: on the
        // service CPUs of the workers' node, they land on that node.
        prefetch_cpus = plan
            .worker_for(0, 0)
            .and_then(|w| plan.service_cpus(w.node))
            .filter(|cpus| !cpus.is_empty())
            .cloned();
        if prefetch_cpus.is_some() {
            cache_node = plan.worker_for(0, 0).map(|w| w.node.to_string());
        }
    }
    let meta = sluice_engine::meta::open_existing_meta(args.meta_url.expose())
        .with_context(|| format!("cannot open the volume at {}", args.meta_url))?;
    let mut disk_cache = args.cache.disk_cache()?;
    // The drop-in's host daemon: found now, or watched for in the registry.
    let mut locate = None;
    if args.drop_in.find_host && args.host.is_none() {
        match find_host(meta.as_ref()) {
            Found::Now(path) => args.host = Some(path),
            Found::Later(uuid) if disk_cache.is_none() => {
                log::info!(
                    "looking in {} every {:?} for a host daemon of this volume to attach to",
                    super::host_registry::dir().display(),
                    sluice_host::client::REATTACH_EVERY
                );
                args.host = Some(super::host_registry::dir().join(&uuid));
                locate = Some(sluice_host::Locator(std::sync::Arc::new(move || {
                    super::host_registry::find(&uuid).map_err(std::io::Error::other)
                })));
            }
            Found::Later(_) => log::info!(
                "this server has a disk cache of its own, so it stays standalone; restart \
                 it once a host daemon of the volume runs to attach to that"
            ),
            Found::Never => {}
        }
    }
    if args.host.is_some() && disk_cache.take().is_some() {
        // Two owners of one cache directory remove each other's files.
        log::info!(
            "--host: the disk cache is the host daemon's; this server keeps none \
             (--cache-dir stays the --writeback staging root)"
        );
    }
    let staging_root = args.cache.staging_root()?;
    let group = args
        .socket_group
        .as_deref()
        .map(|g| {
            sluice_vhost::socket::group_id(g)
                .with_context(|| format!("--socket-group {g}: no such group"))
        })
        .transpose()?;
    let mut listener = match args.listen_fd {
        Some(fd) => sluice_vhost::listen_inherited(super::libvirt::inherited_socket(fd)?),
        None => sluice_vhost::listen(&args.socket, group)
            .with_context(|| format!("cannot listen on {}", args.socket.display()))?,
    };
    // Bound while still root and unconfined; served once the sandbox is up.
    let metrics_socket = args.metrics.bind()?;
    let control_path = super::control::socket_for_serve(&args.socket);
    let control = super::control::ControlServer::bind(&control_path, group)
        .map_err(|e| log::warn!("no control socket, so no `sluice warmup` for this daemon: {e:#}"))
        .ok();
    // Both socket files go when the daemon does, however it ends (still
    // one thread, still root: see socket_cleanup).
    let mut ours = vec![control_path];
    if args.listen_fd.is_none() {
        ours.push(args.socket.clone());
    }
    super::socket_cleanup::remove_at_exit(&ours);
    // Still one thread: the file system is confined before the volume
    // starts any (see src/sandbox/mod.rs).
    let state = local_state(&args, meta.as_ref(), &disk_cache, &staging_root);
    sandbox.confine_files(&state)?;
    let volume = args
        .writeback
        .open_volume_on(meta, &args.meta_url, &staging_root)?;
    sandbox.lock_down(&state)?;
    // Connected inside the sandbox, as every re-attach will be.
    let block_source = args.host.as_ref().map(|path| {
        let name = args
            .socket
            .file_stem()
            .map_or_else(|| args.tag.clone(), |s| s.to_string_lossy().into_owned());
        sluice_host::HostClient::start(sluice_host::ClientConfig {
            path: path.clone(),
            volume: volume.format.uuid.clone(),
            name,
            mappings: args.host_mappings,
            locate: locate.clone(),
            // The host holds this VM's blocks on its guest memory's node.
            node: placement
                .as_ref()
                .and_then(|(plan, _)| plan.vms.first())
                .and_then(|vm| vm.memory_node.or(Some(vm.worker_node)))
                .and_then(|n| u16::try_from(n).ok()),
        })
    });
    if let Some((_, described)) = &placement {
        println!("{described}");
    }
    log::info!(
        "serving volume {}{}{} as virtio-fs tag {:?} with {} request queue(s) on {} \
         (simd {}, guest I/O {})",
        volume.name(),
        match (&args.drop_in.shared_dir, &args.export) {
            (Some(dir), _) => format!(
                " (directory {}, inode {})",
                dir.host_path.display(),
                dir.ino
            ),
            (None, Some(e)) => format!(" (directory /{})", e.trim_start_matches('/')),
            (None, None) => String::new(),
        },
        if args.read_only { " read-only" } else { "" },
        args.tag,
        args.queues,
        args.socket.display(),
        sluice_simd::selected(),
        args.guest_io
    );
    // The counters outlive each VM connection: Prometheus sees one series
    // per queue for the daemon's life.
    let queue_stats: Arc<[QueueStats]> = (0..device_config.num_queues())
        .map(|_| QueueStats::default())
        .collect();
    let ops = Arc::new(OpMetrics::default());
    let view: crate::metrics::SessionSlot = Default::default();
    let metrics = crate::metrics::Metrics::new(
        crate::metrics::Sources {
            volume: volume.clone(),
            ops: ops.clone(),
            queues: Some(queue_stats.clone()),
            session: view.clone(),
            cache_node,
            subdir: args.export.clone().unwrap_or_default(),
            started: std::time::Instant::now(),
            host: None,
            host_client: block_source.clone(),
        },
        &args.socket.to_string_lossy(),
    );
    let _endpoint = metrics_socket.and_then(|m| {
        m.start(metrics.clone())
            .map_err(|e| log::warn!("no metrics endpoint: {e:#}"))
            .ok()
    });
    // `sluice warmup --serve-socket` reaches the current session's caches
    // here, and `sluice stats` the metrics.
    let slot: super::control::ReaderSlot = Default::default();
    let _control = control.and_then(|c| {
        c.start(slot.clone(), Some(metrics))
            .map_err(|e| {
                log::warn!("no control socket, so no `sluice warmup` for this daemon: {e:#}")
            })
            .ok()
    });
    // SIGTERM/SIGINT: end the connected VM's file-system session (its
    // buffered writes are committed, as at a guest's DESTROY), wait for
    // the uploads, exit.
    let current: SessionStop = Default::default();
    {
        let current = current.clone();
        let volume = volume.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let sig = super::mount::wait_for_signal(&signals);
                log::info!("signal {sig}: ending the VM's session and exiting");
                end_session_and_exit(&current, &volume, 0);
            })?;
    }
    if let Some(notifier) = &notifier {
        notifier.ready(&format!(
            "serving volume {} on {}",
            volume.name(),
            args.socket.display()
        ));
        notifier.start_watchdog(queue_probe(queue_stats.clone()))?;
    }
    if let Some(dir) = &args.drop_in.shared_dir {
        watch_shared_dir(dir.clone(), volume.clone(), current.clone())?;
    }
    let dispatch_config = Config {
        timeouts: args
            .drop_in
            .timeouts
            .map(|t| Timeouts { entry: t, attr: t })
            .unwrap_or_default(),
        data_cache: args.drop_in.data_cache,
        ..Config::default()
    };
    let mut ready_line = args.drop_in.ready_line;
    loop {
        // Each connection gets its own file-system session: a rebooted guest
        // starts with a fresh FUSE INIT, and the previous session has flushed
        // and closed when `serve` returns.
        let mut vfs_config = args.commit.apply(
            args.readahead.apply(
                args.memory.apply(VfsConfig {
                    // Between VMs the server lives on and keeps uploading; only
                    // its last session waits for the uploads.
                    upload_drain: args.once.then_some(DEFAULT_UPLOAD_DRAIN),
                    disk_cache: disk_cache.clone(),
                    block_source: block_source
                        .clone()
                        .map(|c| c as Arc<dyn sluice_engine::block_source::BlockSource>),
                    prefetch_cpus: prefetch_cpus.clone(),
                    atime: args.atime_mode,
                    read_only: args.read_only,
                    ..VfsConfig::default()
                })?,
            )?,
        )?;
        args.limits.apply(&mut vfs_config)?;
        let vfs = Vfs::new(volume.clone(), vfs_config).context("cannot start the file system")?;
        let root = match (&args.drop_in.shared_dir, &args.export) {
            (Some(dir), _) => dir.ino,
            (None, Some(path)) => export_root(&vfs, path)?,
            (None, None) => ROOT_INO,
        };
        *slot.lock() = Some(vfs.reader().clone());
        *view.lock() = Some(crate::metrics::SessionView {
            reader: vfs.reader().clone(),
            disk: vfs.disk_cache_counters(),
            gauges: vfs.gauges(),
        });
        let handler = Arc::new(FuseHandler::new(
            Dispatcher::new(
                Export::new(vfs, root, args.read_only).with_limits(client_limits),
                dispatch_config,
            )
            .with_metrics(ops.clone()),
        ));
        {
            let handler = handler.clone();
            *current.lock() = Some(Box::new(move || handler.dispatcher().shutdown()));
        }
        let device =
            VirtioFsDevice::with_stats(device_config.clone(), handler, queue_stats.clone())
                .context("cannot create the virtio-fs device")?;
        let stats = device.stats();
        log::info!("waiting for a VM on {}", args.socket.display());
        if std::mem::take(&mut ready_line) {
            eprintln!("{READY_LINE}");
        }
        let served = device.serve(&mut listener);
        let mut idle = 0;
        for (queue, q) in stats.iter().enumerate() {
            let (requests, bytes_in, bytes_out, batches) = q.snapshot();
            let (fixed, direct, pread) = q.guest_io_snapshot();
            // A request queue the VMM never used (it may start fewer than
            // `--queues`) is counted, not listed.
            if requests == 0 && queue > 1 {
                idle += 1;
                continue;
            }
            log::info!(
                "queue {queue}: {requests} requests in {batches} batches, \
                 {bytes_in} bytes in, {bytes_out} bytes out; file READ bytes: \
                 {fixed} io_uring, {direct} io_uring O_DIRECT, {pread} pread \
                 (since the daemon started)"
            );
        }
        if idle > 0 {
            log::info!("{idle} more request queue(s) answered no requests");
        }
        slot.lock().take();
        view.lock().take();
        current.lock().take();
        served.context("the vhost-user connection failed")?;
        log::info!("the VM disconnected; its session is flushed and closed");
        if args.once {
            return Ok(());
        }
    }
}

/// Ends the connected VM's file-system session (its buffered writes are
/// committed, as at a guest's DESTROY), waits for the uploads and exits
/// with `code`.
fn end_session_and_exit(current: &SessionStop, volume: &Volume, code: i32) -> ! {
    if let Some(stop) = current.lock().take() {
        stop();
    }
    volume.store.drain_uploads(DEFAULT_UPLOAD_DRAIN);
    log::info!("the VM's writes are committed; exiting");
    std::process::exit(code);
}

/// The most parents a walk to the volume's root follows (a longer chain is
/// corrupt metadata; the walk then gives up and calls the directory in place).
const MAX_PARENTS: usize = 1 << 12;

/// How often the shared directory's place in the volume is checked.
const SHARED_DIR_CHECK: Duration = Duration::from_secs(1);

/// Watches the drop-in's shared directory: a rename is logged once (the
/// guest goes on seeing the same directory, as with virtiofsd); its
/// removal ends the session and the daemon with exit status 1, since the
/// guest's whole file system is gone.
fn watch_shared_dir(
    dir: SharedDir,
    volume: Arc<Volume>,
    current: SessionStop,
) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("shared-dir".into())
        .spawn(move || {
            let mut moved = false;
            loop {
                std::thread::sleep(SHARED_DIR_CHECK);
                match shared_dir_state(volume.meta.as_ref(), &dir) {
                    SharedDirState::InPlace => moved = false,
                    SharedDirState::Moved => {
                        if !moved {
                            log::warn!(
                                "the shared directory {} was renamed or moved in the volume; \
                                 the guest goes on seeing it (as with virtiofsd)",
                                dir.host_path.display()
                            );
                        }
                        moved = true;
                    }
                    SharedDirState::Gone(why) => {
                        log::error!(
                            "the shared directory {} {why} while served: the guest's file \
                             system is gone; ending its session and exiting",
                            dir.host_path.display()
                        );
                        end_session_and_exit(&current, &volume, 1);
                    }
                }
            }
        })?;
    Ok(())
}

/// Where `dir` is in the volume now. A metadata error other than "no such
/// node" is taken as "in place": a Redis hiccup must not end the VM's
/// file system.
fn shared_dir_state(meta: &dyn Meta, dir: &SharedDir) -> SharedDirState {
    let gone = |e: &sluice_engine::Error| matches!(e, sluice_engine::Error::NotFound);
    let attr = match meta.getattr(dir.ino) {
        Ok(a) => a,
        Err(e) if gone(&e) => return SharedDirState::Gone("was removed".into()),
        Err(_) => return SharedDirState::InPlace,
    };
    if attr.typ != FileType::Directory || attr.nlink == 0 {
        return SharedDirState::Gone("was removed".into());
    }
    // Its parents up to the volume's root: none may be the trash.
    let mut parent = attr.parent;
    let mut ino = dir.ino;
    for _ in 0..MAX_PARENTS {
        if ino == ROOT_INO {
            break;
        }
        if parent >= TRASH_INO {
            return SharedDirState::Gone("was removed into the volume's trash".into());
        }
        ino = parent;
        parent = match meta.getattr(ino) {
            Ok(a) => a.parent,
            Err(e) if gone(&e) => return SharedDirState::Gone("was removed".into()),
            Err(_) => return SharedDirState::InPlace,
        };
    }
    let ctx = Context::internal();
    let mut at = ROOT_INO;
    for name in &dir.names {
        match meta.lookup(&ctx, at, name) {
            Ok((ino, _)) => at = ino,
            Err(_) => return SharedDirState::Moved,
        }
    }
    if at == dir.ino {
        SharedDirState::InPlace
    } else {
        SharedDirState::Moved
    }
}

/// The watchdog's probe of a `serve` daemon: every request queue moved
/// since the last probe, or had nothing in flight then or now. A queue
/// whose worker sits on the same request from one probe to the next (half
/// the watchdog period) is stuck.
fn queue_probe(stats: Arc<[QueueStats]>) -> impl FnMut() -> Result<(), String> + Send + 'static {
    let mut before: Vec<(u64, u64)> = Vec::new();
    move || {
        let now: Vec<(u64, u64)> = stats
            .iter()
            .map(|q| {
                (
                    sluice_metrics::get(&q.requests),
                    sluice_metrics::get(&q.in_flight),
                )
            })
            .collect();
        let stuck = stuck_queues(&before, &now);
        before = now;
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "request queue(s) {stuck:?} made no progress since the last probe"
            ))
        }
    }
}

/// The queues (by index) that had requests in flight at both samples of
/// (requests answered, in flight) and answered none in between.
fn stuck_queues(before: &[(u64, u64)], now: &[(u64, u64)]) -> Vec<usize> {
    before
        .iter()
        .zip(now)
        .enumerate()
        .filter(|(_, (b, n))| b.1 > 0 && n.1 > 0 && b.0 == n.0)
        .map(|(i, _)| i)
        .collect()
}

/// The local files `serve` keeps using ([`volume_state`]), with the disk
/// cache's directories and, with `--writeback`, the staging root.
fn local_state(
    args: &ServeArgs,
    meta: &dyn Meta,
    disk_cache: &Option<DiskCacheConfig>,
    staging_root: &Path,
) -> LocalState {
    let mut cache_roots: Vec<&Path> = disk_cache
        .iter()
        .flat_map(|c| c.dirs.iter().map(|d| d.path.as_path()))
        .collect();
    if args.writeback.writeback {
        cache_roots.push(staging_root);
    }
    volume_state(args.meta_url.expose(), meta, &cache_roots)
}

/// The local files a daemon of the volume at `url` keeps using (`serve`,
/// `host`): the SQLite database, the `file://` bucket, each of
/// `cache_roots`' folders for the volume (disk cache, writeback staging),
/// and files read later (Redis TLS certificates, the AWS shared
/// configuration).
pub(crate) fn volume_state(url: &str, meta: &dyn Meta, cache_roots: &[&Path]) -> LocalState {
    let mut state = LocalState {
        database: sandbox::sqlite_path(url),
        read: sandbox::tls_files(url),
        tls_roots: sandbox::is_tls_url(url),
        sockets: sandbox::unix_socket(url).into_iter().collect(),
        ..LocalState::default()
    };
    // A volume that does not load is reported when it is opened.
    let Ok(format) = meta.load() else {
        return state;
    };
    if format.storage == "file" {
        // A bucket directory that is missing is not made here (the sandbox
        // creates the trees it is given): opening the volume says it is
        // gone.
        let bucket = PathBuf::from(&format.bucket);
        if bucket.is_dir() {
            state.trees.push(bucket);
        }
    } else {
        state.read.extend(sandbox::aws_config_files());
    }
    for root in cache_roots {
        let dir = volume_dir(root, &format.uuid);
        if !state.trees.contains(&dir) {
            state.trees.push(dir);
        }
    }
    state
}

/// The inode of the directory `path` (relative to the volume's root) names.
/// Symbolic links are not followed: an export is a real directory.
fn export_root(vfs: &Vfs, path: &str) -> anyhow::Result<Ino> {
    let ctx = Context::internal();
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." {
            bail!("--export {path:?}: `..` is not allowed; give a path from the volume's root");
        }
        let entry = vfs.lookup(&ctx, ino, part.as_bytes()).map_err(|e| {
            anyhow::anyhow!("--export {path:?}: {part:?} cannot be found in the volume ({e})")
        })?;
        if entry.attr.typ != FileType::Directory {
            bail!("--export {path:?}: {part:?} is not a directory");
        }
        ino = entry.inode;
    }
    Ok(ino)
}

/// The placement plan of this VM's queue workers, with its description
/// (the host topology and where the workers belong) to print.
fn plan_placement(args: &ServeArgs) -> Option<(Plan, String)> {
    let topology = match Topology::host() {
        Ok(t) => t,
        Err(e) => {
            log::warn!("cannot read the NUMA topology ({e}); no placement plan");
            return None;
        }
    };
    let vm = VmRequest {
        name: args.tag.clone(),
        queues: args.queues,
        memory: PageLocations::from_counts([(args.node, 1)]),
    };
    match sluice_numa::plan(&topology, &[vm], PlacementOptions::default()) {
        Ok(plan) => {
            let described = format!("{topology}{}", plan.describe());
            Some((plan, described))
        }
        Err(e) => {
            log::warn!("no placement plan: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stuck_queues;

    #[test]
    fn a_queue_is_stuck_only_when_busy_without_progress_at_both_probes() {
        assert!(stuck_queues(&[], &[(5, 1)]).is_empty(), "first probe");
        assert!(stuck_queues(&[(5, 0)], &[(5, 0)]).is_empty(), "idle");
        assert!(
            stuck_queues(&[(5, 2)], &[(9, 2)]).is_empty(),
            "busy, moving"
        );
        assert!(
            stuck_queues(&[(5, 0)], &[(5, 3)]).is_empty(),
            "just started"
        );
        assert_eq!(stuck_queues(&[(1, 0), (5, 2)], &[(1, 0), (5, 2)]), vec![1]);
    }
}
