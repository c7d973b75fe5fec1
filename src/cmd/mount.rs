//! `sluice mount` and `sluice umount`: the host FUSE mount.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sluice_engine::meta::MetaUrl;
use sluice_engine::size::{SizeRange, Unit, format_size, size_parser};
use sluice_engine::vfs::{AtimeMode, Vfs, VfsConfig};
use sluice_fuse::{Config, MountOptions, Session, Timeouts};

use super::cache_args::CacheArgs;
use super::writeback_args::WritebackArgs;

/// Arguments of `sluice mount`.
#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: MetaUrl,
    /// An existing, empty directory to mount on (see --nonempty).
    pub mountpoint: PathBuf,
    /// Mount on a directory that is not empty: its files stay hidden
    /// under the mount until it goes (libfuse 2's `nonempty`). JuiceFS
    /// always does; sluice refuses unless asked, so that a mistyped mount
    /// point does not hide data without a word.
    #[arg(long)]
    pub nonempty: bool,
    /// Return once the mount is ready and keep serving it in the background.
    #[arg(long, short = 'd')]
    pub background: bool,
    /// Log file of a background mount (default: /var/log/sluice-<mountpoint>.log).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Seconds the kernel caches attributes.
    #[arg(long, default_value_t = 1.0)]
    pub attr_cache: f64,
    /// Seconds the kernel caches name lookups.
    #[arg(long, default_value_t = 1.0)]
    pub entry_cache: f64,
    #[command(flatten)]
    pub memory: super::memory_args::MemoryArgs,
    /// Threads serving the mount (each with its own /dev/fuse clone).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Most requests answered out of order while they wait (a block not in
    /// the memory cache, a file range not in the page cache, a commit, a
    /// sync) on the waiter threads, so the serving threads go on with
    /// requests that need no waiting; past it a serving thread answers the
    /// request itself. 0 answers every request on the thread that read it.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_waiting: usize,
    /// Threads that run the requests that wait.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub waiters: usize,
    /// Mount read-only.
    #[arg(long)]
    pub read_only: bool,
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
    /// How far the kernel reads ahead of a sequential reader (the mount's
    /// `read_ahead_kb`): a size up to 1G (a bare number is MiB); 0 keeps
    /// the kernel's default of 128 KiB.
    #[arg(
        long,
        default_value = "4M",
        value_name = "SIZE",
        value_parser = size_parser(Unit::Mib, SizeRange::new(0, 1 << 30))
    )]
    pub kernel_readahead: u64,
    #[command(flatten)]
    pub readahead: super::readahead_args::ReadaheadArgs,
    #[command(flatten)]
    pub commit: super::commit_args::CommitArgs,
    #[command(flatten)]
    pub writeback: WritebackArgs,
    /// The disk block cache.
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub metrics: super::metrics_args::MetricsArgs,
}

/// Arguments of `sluice umount`.
#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Detach now even if files are open (the mount goes away when they close).
    #[arg(long)]
    pub lazy: bool,
    /// First upload every block the mount's --writeback staged (the
    /// delayed ones at once; as `juicefs umount --flush`), then unmount and
    /// wait for the mount's process to finish. Refused, leaving the mount
    /// as it is, when blocks are still staged after 10 minutes.
    #[arg(long)]
    pub flush: bool,
}

/// The file-system type of a sluice mount in /proc/self/mountinfo.
const FSTYPE: &str = "fuse.sluice";

/// Runs `sluice mount`.
pub fn run(args: MountArgs) -> anyhow::Result<()> {
    let mountpoint = check_mountpoint(&args.mountpoint, args.nonempty)?;
    // Settings are checked before a background mount detaches.
    args.commit.apply(VfsConfig::default())?;
    args.memory.apply(VfsConfig::default())?;
    if args.background {
        return spawn_background(&args, &mountpoint);
    }
    // Connected now, before any thread starts (see src/notify.rs).
    let notifier = crate::notify::Notifier::from_env();
    let seconds_ok = |s: f64| s.is_finite() && s >= 0.0;
    if !seconds_ok(args.attr_cache) || !seconds_ok(args.entry_cache) {
        bail!("--attr-cache and --entry-cache take a number of seconds ≥ 0");
    }
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    if args.max_waiting > 0 && !(1..=1024).contains(&args.waiters) {
        bail!("--waiters must be between 1 and 1024 (or --max-waiting 0)");
    }
    let metrics_socket = args.metrics.bind()?;
    let disk_cache = args.cache.disk_cache()?;
    let volume = args
        .writeback
        .open_volume(&args.meta_url, &args.cache.staging_root()?)?;
    let name = volume.name().to_owned();
    if name.is_empty() {
        bail!("the volume at {} has no name", args.meta_url);
    }
    let vfs = Vfs::new(
        volume,
        args.commit
            .apply(args.readahead.apply(args.memory.apply(VfsConfig {
                disk_cache,
                atime: args.atime_mode,
                read_only: args.read_only,
                ..VfsConfig::default()
            })?)?)?,
    )
    .context("cannot start the file system")?;
    let options = MountOptions {
        // The source column of /proc/mounts names the metadata URL, so that
        // `sluice info PATH` finds the volume (credentials removed).
        fsname: args.meta_url.redacted(),
        read_only: args.read_only,
        ..MountOptions::default()
    };
    // Block SIGINT/SIGTERM before any thread starts, so every thread inherits
    // the mask and only the waiter below receives them.
    let signals = block_termination_signals();
    let mount = sluice_fuse::dev::mount(&mountpoint, &options)
        .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    let config = Config {
        timeouts: Timeouts {
            attr: Duration::from_secs_f64(args.attr_cache),
            entry: Duration::from_secs_f64(args.entry_cache),
        },
        ..Config::default()
    };
    let slot = std::sync::Arc::new(parking_lot::Mutex::new(Some(vfs.reader().clone())));
    let view = crate::metrics::SessionView {
        reader: vfs.reader().clone(),
        disk: vfs.disk_cache_counters(),
        gauges: vfs.gauges(),
    };
    let volume = vfs.volume().clone();
    let session = Session::new(vfs, mount, config)
        .with_waiting(sluice_fuse::Waiting {
            max_waiting: args.max_waiting,
            waiters: args.waiters,
        })
        .spawn(args.threads)?;
    set_kernel_readahead(&mountpoint, args.kernel_readahead);
    let metrics = crate::metrics::Metrics::new(
        crate::metrics::Sources {
            volume,
            ops: session.dispatcher().metrics().clone(),
            queues: None,
            cache_node: None,
            subdir: String::new(),
            session: std::sync::Arc::new(parking_lot::Mutex::new(Some(view))),
            started: Instant::now(),
            host: None,
            host_client: None,
        },
        &mountpoint.to_string_lossy(),
    );
    let _endpoint = metrics_socket.and_then(|m| {
        m.start(metrics.clone())
            .map_err(|e| log::warn!("no metrics endpoint: {e:#}"))
            .ok()
    });
    // `sluice warmup` and `sluice stats` reach this mount here.
    let control = super::control::ControlServer::start(
        &super::control::socket_for_mount(&mountpoint),
        slot.clone(),
        Some(metrics),
        None,
    )
    .map_err(|e| log::warn!("no control socket, so no `sluice warmup` for this mount: {e:#}"))
    .ok();
    log::info!(
        "volume {name} mounted on {} ({} threads; simd {})",
        mountpoint.display(),
        args.threads,
        sluice_simd::selected()
    );
    if let Some(notifier) = &notifier {
        notifier.ready(&format!(
            "volume {name} mounted on {}",
            mountpoint.display()
        ));
        notifier.start_watchdog(mount_probe(mountpoint.clone()))?;
    }
    let waiter_path = mountpoint.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = wait_for_signal(&signals);
            log::info!("signal {sig}: unmounting {}", waiter_path.display());
            if let Err(e) = sluice_fuse::unmount(&waiter_path) {
                log::error!("cannot unmount {}: {e}", waiter_path.display());
            }
        })?;
    let ended = session.join();
    drop(control);
    slot.lock().take();
    ended.context("the mount ended with an error")?;
    log::info!("{} unmounted; all data committed", mountpoint.display());
    Ok(())
}

/// The watchdog's probe of a mount: a LOOKUP of a name that does not
/// exist (a new one each time, so no cached entry answers) through the
/// kernel mount. Any answer (ENOENT, even an error of the metadata store)
/// shows the kernel and a FUSE worker serve; a dead connection does not,
/// and a hung worker keeps the probe from returning at all.
fn mount_probe(mountpoint: PathBuf) -> impl FnMut() -> Result<(), String> + Send + 'static {
    let mut n = 0u64;
    move || {
        n += 1;
        let name = mountpoint.join(format!(".sluice-watchdog-{}-{n}", std::process::id()));
        match std::fs::symlink_metadata(&name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                Err(format!("{} no longer answers: {e}", mountpoint.display()))
            }
            _ => Ok(()),
        }
    }
}

/// Runs `sluice umount`.
pub fn umount(args: UmountArgs) -> anyhow::Result<()> {
    let path = std::path::absolute(&args.mountpoint)?;
    if mount_type(&path)?.as_deref() != Some(FSTYPE) {
        bail!("{} is not a sluice mount point", path.display());
    }
    let server = if args.flush {
        Some(flush_staged(&path)?)
    } else {
        None
    };
    let target = CString::new(path.as_os_str().as_bytes())?;
    let flags = if args.lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `target` is a NUL-terminated path alive across the call.
    if unsafe { libc::umount2(target.as_ptr(), flags) } != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EBUSY) {
            bail!(
                "{} is busy: close the files open there, or detach it now with --lazy",
                path.display()
            );
        }
        return Err(err).with_context(|| format!("cannot unmount {}", path.display()));
    }
    if let Some(pid) = server {
        wait_for_exit(pid, &path)?;
        println!(
            "unmounted {}: every staged block is uploaded, and its process has finished",
            path.display()
        );
    } else {
        println!("unmounted {}", path.display());
    }
    Ok(())
}

/// Asks the mount's process (through its control socket) to upload every
/// block it staged, shows the backlog while it does, and returns the
/// process's id; fails when blocks are still staged at the end.
fn flush_staged(mountpoint: &Path) -> anyhow::Result<libc::pid_t> {
    use std::io::{BufRead as _, Write as _};
    use std::os::unix::net::UnixStream;

    use super::control::{FlushRequest, Reply, socket_for_mount};
    let socket = socket_for_mount(mountpoint);
    let mut conn = UnixStream::connect(&socket).with_context(|| {
        format!(
            "--flush: cannot reach the mount's control socket {}; unmount without --flush \
             (staged blocks are then uploaded at the volume's next mount)",
            socket.display()
        )
    })?;
    let pid = peer_pid(&conn).context("--flush: cannot tell the mount's process")?;
    let mut line = serde_json::to_string(&FlushRequest { flush: true })?;
    line.push('\n');
    conn.write_all(line.as_bytes())?;
    let mut shown = false;
    for line in io::BufReader::new(conn).lines() {
        let reply: Reply = serde_json::from_str(&line?).context("--flush: a bad answer")?;
        match reply {
            Reply::Uploads {
                pending_blocks,
                pending_bytes,
                done: false,
            } => {
                eprint!(
                    "\ruploading staged blocks: {pending_blocks} left ({})   ",
                    format_size(pending_bytes)
                );
                shown = true;
            }
            Reply::Uploads {
                pending_blocks,
                pending_bytes,
                done: true,
            } => {
                if shown {
                    eprintln!();
                }
                if pending_blocks > 0 {
                    bail!(
                        "{pending_blocks} staged blocks ({}) are not uploaded yet (is the \
                         bucket reachable? see the mount's log); {} stays mounted: run \
                         `sluice umount --flush` again, or unmount without --flush to leave \
                         them staged for the next mount",
                        format_size(pending_bytes),
                        mountpoint.display()
                    );
                }
                return Ok(pid);
            }
            Reply::Error { message } => bail!("--flush: {message}"),
            _ => {}
        }
    }
    bail!("--flush: the mount's process closed its control socket before the flush ended")
}

/// The process at the other end of a Unix socket.
fn peer_pid(conn: &std::os::unix::net::UnixStream) -> io::Result<libc::pid_t> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for the call, which writes at most
    // `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid)
}

/// Waits until process `pid` (a mount's server, unmounted now) has ended:
/// it commits, uploads what is left and exits.
fn wait_for_exit(pid: libc::pid_t, mountpoint: &Path) -> anyhow::Result<()> {
    let gone = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie has ended; its parent has not collected it yet.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    };
    let deadline = Instant::now() + sluice_engine::vfs::DEFAULT_UPLOAD_DRAIN;
    while !gone() {
        if Instant::now() > deadline {
            bail!(
                "{} is unmounted, but its process (pid {pid}) has not finished; see its log",
                mountpoint.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The mount point must be an existing directory that is not mounted yet,
/// and empty unless `nonempty`.
fn check_mountpoint(path: &Path, nonempty: bool) -> anyhow::Result<PathBuf> {
    let path = std::path::absolute(path)?;
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("mount point {} is not a directory", path.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
            "mount point {} does not exist; create it with `mkdir -p {}`",
            path.display(),
            path.display()
        ),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => bail!(
            "{} is a dead mount (its server exited); run `sluice umount --lazy {}` first",
            path.display(),
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot use {}", path.display())),
    }
    if let Some(fstype) = mount_type(&path)? {
        bail!(
            "{} is already a mount point ({fstype}); unmount it first",
            path.display()
        );
    }
    if !nonempty {
        let first = std::fs::read_dir(&path)
            .with_context(|| format!("cannot list the mount point {}", path.display()))?
            .next()
            .transpose()
            .with_context(|| format!("cannot list the mount point {}", path.display()))?;
        if let Some(entry) = first {
            bail!(
                "mount point {} is not empty (it holds {:?}, ...), and the mount would hide \
                 what is there: mount on an empty directory, or add --nonempty to mount over it",
                path.display(),
                entry.file_name()
            );
        }
    }
    Ok(path)
}

/// The innermost sluice mount holding `path`: (mount point, metadata URL).
pub fn sluice_mount_of(path: &Path) -> anyhow::Result<Option<(PathBuf, String)>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .context("cannot read /proc/self/mountinfo")?;
    let mut best: Option<(PathBuf, String)> = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() <= 4 || fields.get(dash + 1) != Some(&FSTYPE) {
            continue;
        }
        let mp = PathBuf::from(std::ffi::OsStr::from_bytes(&unescape_mountinfo(fields[4])));
        let source = fields
            .get(dash + 2)
            .map(|s| unescape_mountinfo(s))
            .unwrap_or_default();
        let longer = best
            .as_ref()
            .is_none_or(|(b, _)| mp.as_os_str().len() > b.as_os_str().len());
        if path.starts_with(&mp) && longer {
            best = Some((mp, String::from_utf8_lossy(&source).into_owned()));
        }
    }
    Ok(best)
}

/// The file-system type mounted exactly at `path`, if any.
fn mount_type(path: &Path) -> anyhow::Result<Option<String>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .context("cannot read /proc/self/mountinfo")?;
    let want = path.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        // Fields: id parent major:minor root mountpoint options ... - fstype source super
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() > 4 && unescape_mountinfo(fields[4]) == want {
            found = fields.get(dash + 1).map(|s| s.to_string());
        }
    }
    Ok(found)
}

/// Undoes the octal escapes (`\040` for space) of /proc/self/mountinfo.
pub(crate) fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Starts this program again without `--background` in a new session, and
/// returns once the mount is up (or reports why the child failed).
fn spawn_background(args: &MountArgs, mountpoint: &Path) -> anyhow::Result<()> {
    let log_path = args.log.clone().unwrap_or_else(|| {
        let name: String = mountpoint
            .to_string_lossy()
            .trim_matches('/')
            .replace('/', "-");
        PathBuf::from(format!("/var/log/sluice-{name}.log"))
    });
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open log file {}", log_path.display()))?;
    let exe = std::env::current_exe().context("cannot find the sluice executable")?;
    let mut child_args: Vec<std::ffi::OsString> = Vec::new();
    let mut skip = false;
    for a in std::env::args_os().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        if a == "--background" || a == "-d" {
            continue;
        }
        if a == "--log" {
            skip = true;
            continue;
        }
        if a.as_bytes().starts_with(b"--log=") {
            continue;
        }
        child_args.push(a);
    }
    let mut command = Command::new(exe);
    command
        .args(&child_args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of ours; it
    // only detaches the child from our terminal and process group.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .context("cannot start the background mount")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if mount_type(mountpoint)?.as_deref() == Some(FSTYPE) {
            // The mount sets this too; setting it here as well means it is
            // in place when this command returns.
            set_kernel_readahead(mountpoint, args.kernel_readahead);
            println!(
                "mounted {} in the background (pid {}, log {})",
                mountpoint.display(),
                child.id(),
                log_path.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = tail
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            bail!("the background mount exited ({status}): {last}");
        }
        if Instant::now() > deadline {
            bail!(
                "the mount did not come up within 60 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Widens the kernel's readahead for the mount to `bytes` (0: leaves it),
/// in whole KiB. The stat inside waits for the session to have answered
/// INIT, which is where the kernel sets its own value.
fn set_kernel_readahead(mountpoint: &Path, bytes: u64) {
    let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
    if kib == 0 {
        return;
    }
    if let Err(e) = sluice_fuse::dev::set_kernel_readahead(mountpoint, kib) {
        log::warn!("the kernel's readahead for this mount stays at its default: {e}");
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread (and the threads it
/// starts afterwards) and returns the set for [`wait_for_signal`].
pub(crate) fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the calls only
    // write into it and into this thread's signal mask.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// Waits for one of the blocked termination signals.
pub(crate) fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` is an initialised sigset_t and `sig` a valid out pointer.
    while unsafe { libc::sigwait(set, &mut sig) } != 0 {}
    sig
}

#[cfg(test)]
mod tests {
    use super::unescape_mountinfo;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b"), b"/mnt/a b");
        assert_eq!(unescape_mountinfo("/plain"), b"/plain");
        assert_eq!(unescape_mountinfo(r"/end\04"), br"/end\04");
    }
}
