//! sluice as a drop-in for virtiofsd: libvirt, Kata Containers and Cloud
//! Hypervisor users start it with virtiofsd's command line, and it serves
//! the shared directory from the volume itself.
//!
//! `main` hands any command line whose first argument is an option (other
//! than `--help`/`--version`) to [`run`]: no `sluice` subcommand starts with
//! one. The launchers' lines, as they pass them:
//!
//! - libvirt: `--fd=N` (a listening socket it created and labelled for
//!   QEMU), `-o source=DIR,cache=…,sandbox=…,xattr,…` or, once it reads
//!   "separate-options" from `--print-capabilities`, `--shared-dir DIR
//!   --cache … --sandbox … --xattr`; `--thread-pool-size`,
//!   `--rlimit-nofile`, `-d`/`--log-level debug`;
//! - Kata's Go runtime: `--syslog --cache=auto --shared-dir=DIR --fd=3
//!   --thread-pool-size=1 --announce-submounts` (it creates the socket, and
//!   stops the daemon with SIGKILL);
//! - Kata's runtime-rs: `--socket-path P --shared-dir DIR --cache auto
//!   --thread-pool-size=1 -o announce_submounts [--xattr]`; it starts the VM
//!   once stderr shows [`super::serve::READY_LINE`];
//! - Cloud Hypervisor's documentation: `--socket-path=P --shared-dir=DIR
//!   --cache=never --thread-pool-size=N`.
//!
//! [`options`] reads the line: `--readonly`, `--seccomp`, `--tag`,
//! `--socket-group`, `--cache`, `--log-level`, `--syslog` and
//! `--rlimit-nofile` map onto sluice's settings; options that tune only
//! virtiofsd's passthrough are accepted with one log line each; id maps,
//! xattr maps and migration are refused with the reason. [`shared_dir`]
//! finds the volume and the directory: a directory of a sluice or JuiceFS
//! mount is served natively (metadata engine and objects opened here, the
//! directory exported by inode, no FUSE hop); a `sluice.env` settings file
//! (the earlier form) serves the volume it names. The socket, the options
//! and the directory are all checked before anything is served: bad input
//! ends in one error line and a non-zero exit, never a half-started daemon.
//! The daemon then runs as `sluice serve … --once`: it exits when the VMM
//! disconnects, as virtiofsd does.
//!
//! `sluice install-libvirt` writes the vhost-user backend descriptor (QEMU's
//! `docs/interop/vhost-user.json`, `"type": "fs"`). `docs/qemu-libvirt.md`
//! has the domain XML, the Kata configuration and the Cloud Hypervisor
//! command line.

mod env_file;
mod options;
mod shared_dir;
mod syslog;

use std::os::fd::{BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Args, Parser};
use log::LevelFilter;

use super::serve::{DropIn, ServeArgs};

/// The file in `<source dir=…>` that names the volume and serve's flags
/// (the settings-file form) and the format of the files keyed by volume
/// name in `/etc/sluice/volumes/`.
pub const CONFIG_FILE: &str = "sluice.env";

/// The descriptor's file name: after the distributions' `50-*` virtiofsd
/// descriptors, so a domain without `<binary>` keeps getting virtiofsd
/// (libvirt takes the first `"fs"` descriptor in file-name order).
pub const DESCRIPTOR_NAME: &str = "90-sluice.json";

/// Where `install-libvirt` writes the descriptor by default: the folder the
/// vhost-user schema keeps for the administrator's own additions (the
/// Debian package puts it in `/usr/share/qemu/vhost-user/` instead).
pub const DEFAULT_DESCRIPTOR_DIR: &str = "/etc/qemu/vhost-user";

/// What `--print-capabilities` prints (QEMU's vhost-user.json "Backend
/// programs conventions"): the backend type and the features sluice has.
/// "separate-options": it takes virtiofsd 1.x's own options, so libvirt
/// passes `--shared-dir DIR --cache …` instead of `-o source=DIR,…`. No
/// "migrate-precopy": sluice cannot hand a device's state to another host.
pub const CAPABILITIES: &str =
    "{\n  \"type\": \"fs\",\n  \"features\": [\n    \"separate-options\"\n  ]\n}\n";

/// Request queues a drop-in daemon offers unless its settings say
/// `--queues`: the VMM uses as many as it was told (QEMU's
/// `num-request-queues`, Cloud Hypervisor's `num_queues`; one by default,
/// and Kata asks for one), up to this many. A queue the VMM never starts
/// costs an idle thread.
pub const DEFAULT_QUEUES: usize = 16;

/// sluice's own top-level options: a command line starting with any other
/// option is virtiofsd's.
const SLUICE_TOP_LEVEL_OPTIONS: [&str; 4] = ["-h", "--help", "-V", "--version"];

/// `sluice install-libvirt`: write the vhost-user backend descriptor.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The folder to write `90-sluice.json` into (created when missing);
    /// `/usr/share/qemu/vhost-user` is the distribution's folder.
    #[arg(long, default_value = DEFAULT_DESCRIPTOR_DIR)]
    pub dir: PathBuf,
    /// The program the descriptor names (default: this `sluice`).
    #[arg(long)]
    pub binary: Option<PathBuf>,
}

/// The vhost-user backend descriptor naming `binary`.
pub fn descriptor(binary: &Path) -> String {
    // The path as a JSON string (quoted, escaped); the rest is fixed, in
    // the schema's order.
    let binary = serde_json::Value::from(binary.to_string_lossy()).to_string();
    format!(
        "{{\n  \"description\": \"sluice: a JuiceFS-format volume as a virtio-fs device\",\n  \
         \"type\": \"fs\",\n  \"binary\": {binary}\n}}\n"
    )
}

/// Writes the descriptor (`sluice install-libvirt`).
pub fn install(args: InstallArgs) -> anyhow::Result<()> {
    let binary = match args.binary {
        Some(b) => b,
        None => std::env::current_exe().context("cannot find this program's path")?,
    };
    if !binary.is_absolute() {
        bail!(
            "--binary {}: libvirt needs an absolute path",
            binary.display()
        );
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let path = args.dir.join(DESCRIPTOR_NAME);
    std::fs::write(&path, descriptor(&binary))
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "wrote {} (vhost-user fs backend {})",
        path.display(),
        binary.display()
    );
    Ok(())
}

/// Whether `args` (the program name excluded) is virtiofsd's command line:
/// it starts with an option, and `sluice` itself takes none but `--help`
/// and `--version` before its subcommand.
pub fn is_virtiofsd_command_line(args: &[String]) -> bool {
    args.first().is_some_and(|first| {
        first.starts_with('-') && !SLUICE_TOP_LEVEL_OPTIONS.contains(&first.as_str())
    })
}

/// The contents of [`CONFIG_FILE`]: the volume and serve's further flags.
#[derive(Debug, PartialEq, Eq)]
pub struct SourceConfig {
    /// `META_URL=`: the metadata engine URL.
    pub meta_url: String,
    /// `SLUICE_ARGS=`: further `sluice serve` flags, split on blanks (as
    /// systemd splits `$SLUICE_ARGS` in the units' command line).
    pub serve_args: Vec<String>,
    /// The variables the file sets for the daemon's environment, as
    /// systemd's `EnvironmentFile=` sets them for the units
    /// ([`DAEMON_ENVIRONMENT`]).
    pub environment: Vec<(String, String)>,
}

/// The environment variables the daemon reads that a settings file may
/// set (besides `AWS_*`, the S3 client's): the metadata passwords kept out
/// of the URL, the log filter, the I/O backend, TLS roots.
pub const DAEMON_ENVIRONMENT: [&str; 8] = [
    "META_PASSWORD",
    "REDIS_PASSWORD",
    "SENTINEL_PASSWORD",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "SLUICE_IO_BACKEND",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// Reads a settings file, in the format of systemd's `EnvironmentFile=`
/// ([`env_file`]), as the systemd units read the same file. `SOCKET=`,
/// `MOUNTPOINT=` and `CONTROL=` (the units' settings, so one file can serve
/// them all) are skipped: libvirt gives the socket. The daemon's environment variables
/// ([`DAEMON_ENVIRONMENT`], `AWS_*`) are kept for it. Other names are an
/// error, so that a typo does not serve the wrong thing.
pub fn parse_config(text: &str) -> anyhow::Result<SourceConfig> {
    let mut meta_url = None;
    let mut serve_args = Vec::new();
    let mut environment = Vec::new();
    for (name, value) in env_file::parse(text)? {
        match name.as_str() {
            "META_URL" => meta_url = Some(value),
            "SLUICE_ARGS" => serve_args = value.split_whitespace().map(str::to_owned).collect(),
            "SOCKET" | "MOUNTPOINT" | "CONTROL" => {}
            n if DAEMON_ENVIRONMENT.contains(&n) || n.starts_with("AWS_") => {
                environment.push((name, value))
            }
            other => bail!(
                "unknown setting {other}: the settings are META_URL and SLUICE_ARGS \
                 (SOCKET, MOUNTPOINT and CONTROL are the systemd units'), and the daemon's \
                 environment: {}, AWS_*",
                DAEMON_ENVIRONMENT.join(", ")
            ),
        }
    }
    let meta_url = meta_url
        .filter(|u| !u.trim().is_empty())
        .context("no META_URL= line")?;
    if meta_url.split_whitespace().count() != 1 {
        bail!("META_URL={meta_url:?}: a URL is one word");
    }
    Ok(SourceConfig {
        meta_url,
        serve_args,
        environment,
    })
}

/// `sluice serve`'s arguments, parsed the way the subcommand parses them.
#[derive(Debug, Parser)]
#[command(name = "sluice serve")]
struct ServeCommand {
    #[command(flatten)]
    args: ServeArgs,
}

/// Fails unless `fd` is an open descriptor of this process.
fn check_open(fd: RawFd) -> anyhow::Result<()> {
    // SAFETY: fcntl(F_GETFD) only reads the descriptor table entry.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!("--fd={fd}: no such open file descriptor");
    }
    Ok(())
}

/// An integer socket option of `fd`.
fn socket_option(fd: RawFd, option: libc::c_int) -> std::io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of the sizes given;
    // getsockopt only reads the descriptor's socket state.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(value)
}

/// Fails unless `fd` is a listening Unix stream socket: what a launcher
/// that creates the socket (libvirt, Kata's Go runtime) must pass. Checked
/// before anything else is opened.
fn check_listening(fd: RawFd) -> anyhow::Result<()> {
    check_open(fd)?;
    let fix = "the launcher must pass a listening Unix socket (socket, bind, listen)";
    match socket_option(fd, libc::SO_DOMAIN) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => {
            bail!("--fd={fd} is not a socket; {fix}")
        }
        Err(e) => return Err(e).with_context(|| format!("--fd={fd}")),
        Ok(domain) if domain != libc::AF_UNIX => bail!("--fd={fd} is not a Unix socket; {fix}"),
        Ok(_) => {}
    }
    if socket_option(fd, libc::SO_TYPE)? != libc::SOCK_STREAM {
        bail!("--fd={fd} is not a stream socket; {fix}");
    }
    if socket_option(fd, libc::SO_ACCEPTCONN)? == 0 {
        bail!("--fd={fd} is a socket that is not listening (connected, or never listened); {fix}");
    }
    Ok(())
}

/// The path the inherited listening socket `fd` is bound to (for logs and
/// the control socket beside it); `fd` itself stays open.
fn bound_path(fd: RawFd) -> anyhow::Result<PathBuf> {
    check_open(fd)?;
    // SAFETY: the descriptor is open (checked above) and stays open while
    // borrowed: it is only duplicated here.
    let copy = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    let listener = std::os::unix::net::UnixListener::from(copy);
    let addr = listener
        .local_addr()
        .with_context(|| format!("--fd={fd}: not a Unix socket"))?;
    addr.as_pathname()
        .map(Path::to_path_buf)
        .with_context(|| format!("--fd={fd}: the socket has no path"))
}

/// Takes the listening socket the launcher passed down as `--fd=N`.
pub fn inherited_socket(fd: RawFd) -> anyhow::Result<OwnedFd> {
    check_open(fd)?;
    // SAFETY: the descriptor is open (checked above) and was handed to this
    // process by its parent for it alone; this is the one place that takes
    // ownership of it, once (`serve --listen-fd` is given it once).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: F_SETFD on a descriptor we own; nothing else reads its flags.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(owned)
}

/// Sets the open-file limit to `n`, soft and hard, as virtiofsd's
/// `--rlimit-nofile` does (0 leaves it).
fn set_open_file_limit(n: u64) -> anyhow::Result<()> {
    if n == 0 {
        return Ok(());
    }
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads a valid rlimit struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("--rlimit-nofile={n}: cannot set the open-file limit"));
    }
    Ok(())
}

/// Sets up logging as virtiofsd does: `--log-level` (default info; a
/// `RUST_LOG` in the environment wins, as in virtiofsd), to stderr or, with
/// `--syslog`, to the system log.
fn init_logging(level: Option<LevelFilter>, syslog: bool) {
    let level = level.unwrap_or(LevelFilter::Info);
    if syslog && std::env::var_os("RUST_LOG").is_none() {
        match syslog::Syslog::connect(level) {
            Ok(logger) => {
                if logger.install().is_ok() {
                    return;
                }
            }
            Err(e) => eprintln!("sluice: cannot log to syslog ({e}); logging to stderr"),
        }
    }
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or(level.to_string().to_ascii_lowercase()),
    )
    .init();
}

/// What `-h`/`--help` prints in this mode.
const USAGE: &str = "\
sluice as a virtiofsd drop-in: serves a directory of a sluice or JuiceFS
mount to a VM over vhost-user, from the volume itself.

Usage: sluice --shared-dir DIR (--socket-path PATH | --fd N) [OPTIONS]

Mapped:   --shared-dir, -o source=    the directory (in a sluice or JuiceFS mount)
          --socket-path, --fd         where the VMM connects (--socket-group G)
          --readonly, --tag T, --seccomp none|kill|log|trap
          --cache never|metadata|auto|always (entry/attribute timeouts, page cache)
          --log-level L, -d, --syslog, --rlimit-nofile N, --print-capabilities
Ignored:  --thread-pool-size, --sandbox, --xattr, --posix-acl, --announce-submounts,
          --inode-file-handles, --writeback, --allow-direct-io, --allow-mmap, ... (logged)
Refused:  --uid-map, --gid-map, --translate-uid/gid, --xattrmap, --migration-*

Settings: /etc/sluice/volumes/NAME.env (META_URL=, SLUICE_ARGS=); see
docs/qemu-libvirt.md. `sluice --help` lists sluice's own commands.
";

/// Runs sluice with virtiofsd's command line: `args` without the program name.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let inv = options::parse(args)?;
    if inv.help {
        print!("{USAGE}");
        return Ok(());
    }
    if inv.version {
        println!("sluice {} (virtiofsd drop-in)", env!("CARGO_PKG_VERSION"));
        return Ok(());
    }
    if inv.print_capabilities {
        print!("{CAPABILITIES}");
        return Ok(());
    }
    // Where the VMM connects, checked before anything is opened.
    let socket = match (inv.fd, &inv.socket_path) {
        (Some(fd), None) => {
            if inv.socket_group.is_some() {
                bail!(
                    "--socket-group gives a socket sluice creates (--socket-path) to a group; \
                     the socket of --fd is the launcher's"
                );
            }
            check_listening(fd)?;
            bound_path(fd)?
        }
        (None, Some(path)) => path.clone(),
        (Some(_), Some(_)) => bail!("--fd and --socket-path together: give one"),
        (None, None) => bail!("no --socket-path=PATH or --fd=N: where does the VMM connect?"),
    };
    let shared = inv
        .shared_dir
        .as_deref()
        .context("no --shared-dir=DIR (or -o source=DIR): the directory to share")?;
    // Before logging is set up: the volume's settings file may set
    // RUST_LOG (and the rest of the daemon's environment), as systemd's
    // EnvironmentFile= does for the units.
    let source = shared_dir::find(shared, &shared_dir::volumes_dir())?;
    init_logging(inv.log_level, inv.syslog);
    for (opt, why) in &inv.ignored {
        log::info!("virtiofsd option {opt} has no effect on sluice: {why}");
    }
    for note in &inv.notes {
        log::info!("virtiofsd option {note}");
    }
    if let Some(n) = inv.rlimit_nofile {
        set_open_file_limit(n)?;
    }
    let mut argv = vec!["sluice serve".to_owned(), source.meta_url.clone()];
    argv.extend(["--socket".into(), socket.display().to_string()]);
    if let Some(fd) = inv.fd {
        argv.extend(["--listen-fd".into(), fd.to_string()]);
    }
    argv.push("--once".into());
    let given = |flag: &str| {
        source
            .serve_args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    if !given("--queues") {
        argv.extend(["--queues".into(), DEFAULT_QUEUES.to_string()]);
    }
    // A volume mounted on this host: its local files stay its owner's.
    if let Some(uid) = source.files_owner
        && !given("--user")
    {
        argv.extend(["--user".into(), uid.to_string()]);
    }
    argv.extend(source.serve_args.iter().cloned());
    let mut serve = ServeCommand::try_parse_from(&argv)
        .context("the volume's SLUICE_ARGS are not `sluice serve` flags")?
        .args;
    if source.shared_dir.is_some() && serve.export.is_some() {
        bail!(
            "--export in SLUICE_ARGS and --shared-dir {} both name the directory to serve; \
             drop --export",
            shared.display()
        );
    }
    serve.read_only |= inv.read_only;
    if let Some(tag) = &inv.tag {
        serve.tag = tag.clone();
    }
    if let Some(mode) = inv.seccomp {
        serve.sandbox.seccomp = mode;
    }
    if inv.socket_group.is_some() {
        serve.socket_group = inv.socket_group.clone();
    }
    serve.drop_in = DropIn {
        shared_dir: source.shared_dir,
        timeouts: Some(inv.timeout()),
        data_cache: inv.cache.data_cache(),
        ready_line: true,
        find_host: true,
    };
    // Not the readiness line's words: Kata's runtime-rs starts the VM on
    // the first stderr line that holds them.
    log::info!(
        "started as a virtio-fs backend (virtiofsd's command line): serving {}, cache {:?} \
         ({:?} timeouts), for the VMM on {}",
        source.found,
        inv.cache,
        inv.timeout(),
        socket.display(),
    );
    super::serve::run(serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn option_lines_are_virtiofsd_command_lines() {
        assert!(!is_virtiofsd_command_line(&args(&["serve", "--fd=3"])));
        assert!(!is_virtiofsd_command_line(&args(&["--help"])));
        assert!(!is_virtiofsd_command_line(&args(&["-V"])));
        assert!(!is_virtiofsd_command_line(&[]));
        assert!(is_virtiofsd_command_line(&args(&["--print-capabilities"])));
        assert!(is_virtiofsd_command_line(&args(&["--socket-path=/x"])));
        // Kata's Go runtime starts with --syslog.
        assert!(is_virtiofsd_command_line(&args(&["--syslog", "--fd=3"])));
        assert!(is_virtiofsd_command_line(&args(&["-o", "source=/x"])));
    }

    /// The capabilities as libvirt reads them (qemu_vhost_user.c): a JSON
    /// object whose "type" is "fs" and whose "features" are strings, of
    /// which libvirt acts on "separate-options" and "migrate-precopy".
    #[test]
    fn capabilities_are_what_libvirt_reads() {
        let v: serde_json::Value = serde_json::from_str(CAPABILITIES).unwrap();
        assert_eq!(v["type"], "fs");
        let features: Vec<&str> = v["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert_eq!(features, ["separate-options"]);
    }

    /// The packaged descriptor is what `install-libvirt --binary /usr/bin/sluice` writes.
    #[test]
    fn packaged_descriptor_is_the_installed_one() {
        let packaged = include_str!("../../packaging/vhost-user/90-sluice.json");
        assert_eq!(packaged, descriptor(Path::new("/usr/bin/sluice")));
        let v: serde_json::Value = serde_json::from_str(packaged).unwrap();
        assert_eq!(v["type"], "fs");
        assert_eq!(v["binary"], "/usr/bin/sluice");
    }

    #[test]
    fn config_names_the_volume_and_flags() {
        let c = parse_config(
            "# x\nMETA_URL=sqlite3:///v.db\nSOCKET=/run/x.sock\nSLUICE_ARGS=--queues 2 --read-only\n",
        )
        .unwrap();
        assert_eq!(c.meta_url, "sqlite3:///v.db");
        assert_eq!(c.serve_args, ["--queues", "2", "--read-only"]);
        assert!(c.environment.is_empty());
        assert!(parse_config("SOKET=/x\nMETA_URL=a").is_err());
        assert!(parse_config("SLUICE_ARGS=").is_err());
        assert!(parse_config("META_URL=a b").is_err());
    }

    /// What the systemd units' files hold reads the same here: quotes,
    /// empty values, the daemon's own variables.
    #[test]
    fn config_reads_the_systemd_units_files() {
        let c = parse_config(
            "META_URL='redis://r:6379/1'\nRUST_LOG=\nMETA_PASSWORD=\"s e#c\\\"ret\"\n\
             SLUICE_ARGS=\"--queues 2\" \\\n  --read-only\nAWS_REGION=eu-1\n",
        )
        .unwrap();
        assert_eq!(c.meta_url, "redis://r:6379/1");
        assert_eq!(c.serve_args, ["--queues", "2", "--read-only"]);
        assert_eq!(
            c.environment,
            [
                ("RUST_LOG".into(), String::new()),
                ("META_PASSWORD".into(), "s e#c\"ret".into()),
                ("AWS_REGION".into(), "eu-1".into()),
            ] as [(String, String); 3]
        );
        // The packaged example is such a file.
        let example = include_str!("../../packaging/systemd/example.env");
        assert_eq!(
            parse_config(example).unwrap().meta_url,
            "sqlite3:///var/lib/sluice/vol.db"
        );
        let err = parse_config("META_URL=a\nMETA_PASWORD=x").unwrap_err();
        assert!(
            err.to_string().contains("unknown setting META_PASWORD"),
            "{err}"
        );
    }

    /// An inherited descriptor must be a listening Unix stream socket.
    #[test]
    fn only_a_listening_socket_is_taken_as_fd() {
        use std::os::fd::AsRawFd as _;
        let dir = tempfile::tempdir().unwrap();
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join("l")).unwrap();
        check_listening(listener.as_raw_fd()).unwrap();
        assert_eq!(
            bound_path(listener.as_raw_fd()).unwrap(),
            dir.path().join("l")
        );
        let file = std::fs::File::open("/dev/null").unwrap();
        let e = check_listening(file.as_raw_fd()).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let e = check_listening(a.as_raw_fd()).unwrap_err().to_string();
        assert!(e.contains("not listening"), "{e}");
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = check_listening(udp.as_raw_fd()).unwrap_err().to_string();
        assert!(e.contains("not a Unix socket"), "{e}");
        let e = check_listening(1 << 20).unwrap_err().to_string();
        assert!(e.contains("no such open file descriptor"), "{e}");
    }
}
