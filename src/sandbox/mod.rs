//! The sandbox of `sluice serve`: once the daemon has opened what it needs
//! it runs as an unprivileged user (`user`), may touch only the volume's
//! local files (`landlock`) and may make only the system calls serving
//! needs (`seccomp`). The design, and what stays privileged, is in
//! docs/deployment.md ("The sandbox of `sluice serve`").
//!
//! The order matters, and [`Sandbox`] keeps it:
//!
//! 1. [`Sandbox::new`] checks the flags and looks the user up, before
//!    anything is opened.
//! 2. [`Sandbox::confine_files`], while the process has one thread:
//!    checks the volume's local directories and creates the missing ones,
//!    then restricts the file system to them with Landlock, and to what
//!    libraries read (the name service's files where the system replaces
//!    them: `resolver`). A Landlock domain is per thread and inherited by
//!    the threads started later (the kernel applies it to all threads only
//!    from ABI 8), so it comes before the volume starts any thread.
//! 3. The caller opens the volume (S3 clients, writeback uploads).
//! 4. [`Sandbox::lock_down`]: hands the volume's local files (the opening
//!    created some as root) to the user, lifts the locked-memory limit io_uring needs
//!    (or, where root may not, keeps CAP_IPC_LOCK alone across the switch),
//!    switches user (glibc applies set*id to every thread) and installs the
//!    seccomp filter on every thread (TSYNC). With Redis over TLS it then
//!    loads the system's TLS roots as the Redis client will for each new
//!    connection (`tls_roots`), and fails if the sandbox hides them; with
//!    Redis on a Unix socket it connects to it once, likewise.

mod landlock;
mod resolver;
mod seccomp;
mod tls_roots;
mod user;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use user::ServiceUser;

/// What a forbidden system call does (`--seccomp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SeccompMode {
    /// The kernel kills the daemon (SIGSYS).
    Kill,
    /// The call is allowed and the kernel logs it (audit log, dmesg), to
    /// find what the list misses.
    Log,
    /// No filter.
    None,
}

/// Whether Landlock confines the file system (`--landlock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LandlockMode {
    /// Only the volume's local files, and what libraries read, are reachable
    /// (where the kernel has Landlock; otherwise logged and skipped).
    On,
    /// No file-system confinement beyond the user's permissions.
    Off,
}

/// The sandbox flags of `sluice serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxArgs {
    /// The user the daemon runs as once it has opened its sockets and the
    /// volume (a name or a number; its group and supplementary groups come
    /// along). Default when started as root: `nobody`; `--user root` keeps
    /// root. The volume's local files are handed to this user at start.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// What a system call outside the daemon's allowlist does: `kill` the
    /// daemon, `log` it and let it pass (to find what is missing), or
    /// `none` (no filter).
    #[arg(long, value_name = "kill|log|none", default_value = "kill")]
    pub seccomp: SeccompMode,
    /// `on`: the daemon can open only the database, the `file://` bucket,
    /// the cache directories and what libraries read (Landlock); `off`: no
    /// such confinement.
    #[arg(long, value_name = "on|off", default_value = "on")]
    pub landlock: LandlockMode,
}

/// The files the daemon keeps using after setup.
#[derive(Debug, Default, Clone)]
pub struct LocalState {
    /// The SQLite database; its `-wal`, `-shm` and `-journal` live beside it.
    pub database: Option<PathBuf>,
    /// Directories the daemon creates, renames and removes files beneath: the
    /// `file://` bucket, each cache directory's folder for the volume.
    pub trees: Vec<PathBuf>,
    /// Files and directories it only reads later (TLS certificates, the AWS
    /// shared configuration).
    pub read: Vec<PathBuf>,
    /// Whether it makes TLS connections to Redis (`rediss://`), which read
    /// the system's TLS roots each time (see `tls_roots`).
    pub tls_roots: bool,
    /// Unix sockets it connects to again later (a `unix://` Redis).
    pub sockets: Vec<PathBuf>,
}

/// The sandbox a `sluice serve` sets up; see the module's documentation.
#[derive(Debug)]
pub struct Sandbox {
    args: SandboxArgs,
    /// The user to switch to; `None` when the daemon stays who it is.
    target: Option<ServiceUser>,
}

impl Sandbox {
    /// Checks the flags and finds the user, before anything is opened.
    pub fn new(args: &SandboxArgs) -> anyhow::Result<Sandbox> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        let target = match (&args.user, euid) {
            (None, 0) => Some(ServiceUser::lookup("nobody").context(
                "cannot find the user `nobody` to run as; name one with --user, \
                 or keep root with --user root",
            )?),
            (None, _) => None,
            (Some(name), _) => {
                let user = ServiceUser::lookup(name)
                    .with_context(|| format!("--user {name}: no such user"))?;
                if user.uid == euid {
                    None
                } else if euid != 0 {
                    bail!(
                        "--user {name}: only root can switch users, and sluice serve runs as \
                         uid {euid}; start it as root, or leave --user out"
                    );
                } else {
                    Some(user)
                }
            }
        };
        Ok(Sandbox {
            args: args.clone(),
            target,
        })
    }

    /// Checks and creates `state`'s directories and confines the file
    /// system to them. Call while the process has a single thread (see the module's
    /// documentation).
    pub fn confine_files(&self, state: &LocalState) -> anyhow::Result<()> {
        if let Some(user) = &self.target {
            user::prepare(state, user)?;
        }
        match self.args.landlock {
            LandlockMode::On => {
                landlock::restrict(state, self.runs_as_root())?;
                if self.runs_as_root() {
                    log::warn!(
                        "kept as root, sluice serve reads the name service's files in /etc \
                         (hosts, resolv.conf, ...) as they are now: one the system replaces \
                         later (a DHCP client, sed -i) is not seen until it restarts, and a \
                         Redis or S3 host name may then stop resolving; run it as another \
                         user (--user), which may read /etc"
                    );
                }
            }
            LandlockMode::Off => log::warn!("--landlock off: the file system is not confined"),
        }
        Ok(())
    }

    /// The uid the daemon will run as once sandboxed, when it switches.
    pub fn target_uid(&self) -> Option<u32> {
        self.target.as_ref().map(|u| u.uid)
    }

    /// Whether the daemon keeps running as root once sandboxed.
    fn runs_as_root(&self) -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        self.target.is_none() && unsafe { libc::geteuid() } == 0
    }

    /// Switches to the service user and installs the seccomp filter on
    /// every thread; afterwards nothing privileged is possible.
    pub fn lock_down(&self, state: &LocalState) -> anyhow::Result<()> {
        if let Some(user) = &self.target {
            user::hand_over(state, user)?;
            let lifted = user::raise_memlock_limit();
            let keep_ipc_lock = user::keeps_ipc_lock(lifted);
            user::switch_to(user, keep_ipc_lock)?;
            log::info!(
                "running as {} (uid {}, gid {})",
                user.name,
                user.uid,
                user.gid
            );
            if keep_ipc_lock {
                log::info!(
                    "RLIMIT_MEMLOCK cannot be lifted (no CAP_SYS_RESOURCE); the daemon keeps \
                     CAP_IPC_LOCK alone, so io_uring fixed buffers are not limited by it"
                );
            } else if !lifted {
                log::warn!(
                    "cannot lift RLIMIT_MEMLOCK and no CAP_IPC_LOCK to keep; it stays at {} \
                     MiB for io_uring fixed buffers, and a ring that needs more falls back to \
                     pread",
                    sluice_numa::memlock::current().map_or(0, |l| l.1 >> 20)
                );
            }
        }
        seccomp::install(self.args.seccomp)?;
        if state.tls_roots {
            tls_roots::check()?;
        }
        for socket in &state.sockets {
            check_socket(socket, self.target.as_ref())?;
        }
        #[cfg(debug_assertions)]
        probe_from_env();
        Ok(())
    }
}

/// The database file of a `sqlite3://PATH?OPTIONS` URL; `None` for other
/// engines.
pub fn sqlite_path(url: &str) -> Option<PathBuf> {
    let (scheme, rest) = url.split_once("://")?;
    if !matches!(scheme.to_ascii_lowercase().as_str(), "sqlite3" | "sqlite") {
        return None;
    }
    let path = rest.split_once('?').map_or(rest, |(p, _)| p);
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// Connects to `socket` once from inside the finished sandbox, as the
/// Redis client will for every new connection: a socket the service user
/// may not connect to would fail them all, so serve stops with the reason.
fn check_socket(socket: &Path, user: Option<&ServiceUser>) -> anyhow::Result<()> {
    if let Err(e) = std::os::unix::net::UnixStream::connect(socket) {
        let who = user.map_or("the user sluice serve runs as", |u| u.name.as_str());
        bail!(
            "{who} cannot connect to the Redis socket {} inside the sandbox ({e}), and sluice \
             serve connects again whenever Redis drops a connection; let {who} write the \
             socket and pass through its directories (Redis: unixsocketperm, or a group with \
             --user), or use a redis:// URL",
            socket.display()
        );
    }
    Ok(())
}

/// The socket of a `unix://PATH?OPTIONS` Redis URL; `None` for other URLs.
pub fn unix_socket(url: &str) -> Option<PathBuf> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("unix") {
        return None;
    }
    let path = rest.split_once('?').map_or(rest, |(p, _)| p);
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// Whether `url` names Redis over TLS.
pub fn is_tls_url(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("rediss"))
}

/// The certificate and key files a `rediss://` URL names in its options.
pub fn tls_files(url: &str) -> Vec<PathBuf> {
    let Some((_, query)) = url.split_once('?') else {
        return Vec::new();
    };
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(k, _)| matches!(*k, "tls-ca-cert-file" | "tls-cert-file" | "tls-key-file"))
        .map(|(_, v)| PathBuf::from(v))
        .collect()
}

/// The AWS shared configuration the S3 client may read while it starts.
pub fn aws_config_files() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = [
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ]
    .iter()
    .filter_map(std::env::var_os)
    .map(PathBuf::from)
    .collect();
    if let Some(home) = std::env::var_os("HOME") {
        out.push(Path::new(&home).join(".aws"));
    }
    out
}

/// Debug builds only: `SLUICE_DEBUG_SANDBOX_PROBE` makes the daemon try,
/// right after the sandbox is in place, what the sandbox must stop, so the
/// end-to-end tests can see it stopped: `open:PATH` opens PATH for reading
/// and logs the outcome; `syscall` makes a system call the daemon never
/// makes (`personality(0xffffffff)`, a harmless query), which
/// `--seccomp kill` answers with SIGSYS.
#[cfg(debug_assertions)]
fn probe_from_env() {
    let Ok(probe) = std::env::var("SLUICE_DEBUG_SANDBOX_PROBE") else {
        return;
    };
    if let Some(path) = probe.strip_prefix("open:") {
        match std::fs::File::open(path) {
            Ok(_) => log::warn!("sandbox probe: opened {path}"),
            Err(e) => log::warn!(
                "sandbox probe: cannot open {path}: errno {}",
                e.raw_os_error().unwrap_or(0)
            ),
        }
    } else if probe == "syscall" {
        log::warn!("sandbox probe: calling personality(0xffffffff)");
        // SAFETY: personality with 0xffffffff only queries the persona.
        let r = unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffff_u64) };
        log::warn!("sandbox probe: personality returned {r}");
    } else {
        log::warn!("sandbox probe: unknown probe {probe:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_come_from_the_urls() {
        assert_eq!(
            sqlite_path("sqlite3:///var/lib/sluice/vol.db?_sync=full"),
            Some(PathBuf::from("/var/lib/sluice/vol.db"))
        );
        assert_eq!(
            sqlite_path("sqlite://rel.db"),
            Some(PathBuf::from("rel.db"))
        );
        assert_eq!(sqlite_path("redis://host/1"), None);
        assert_eq!(
            tls_files(
                "rediss://h/1?tls-ca-cert-file=/etc/ca.pem&insecure-skip-verify=false&tls-key-file=/k"
            ),
            vec![PathBuf::from("/etc/ca.pem"), PathBuf::from("/k")]
        );
        assert!(tls_files("redis://h/1").is_empty());
        assert!(is_tls_url("rediss://h/1") && is_tls_url("REDISS://h/1"));
        assert_eq!(
            unix_socket("unix:///run/redis/redis.sock?db=2"),
            Some(PathBuf::from("/run/redis/redis.sock"))
        );
        assert_eq!(unix_socket("redis://h/1"), None);
        assert!(!is_tls_url("redis://h/1") && !is_tls_url("sqlite3:///x.db"));
    }

    #[test]
    fn an_unknown_user_is_refused_before_anything_opens() {
        let args = SandboxArgs {
            user: Some("no-such-user-sluice".into()),
            seccomp: SeccompMode::Kill,
            landlock: LandlockMode::On,
        };
        let e = Sandbox::new(&args).unwrap_err();
        assert!(format!("{e:#}").contains("--user no-such-user-sluice: no such user"));
    }
}
