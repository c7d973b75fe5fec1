//! libvirt starts sluice as it starts virtiofsd: `<binary path='/usr/bin/sluice'/>`
//! in a `<filesystem>` with `<driver type='virtiofs'/>`.
//!
//! libvirt runs the binary with virtiofsd's command line, which no `sluice`
//! subcommand takes, so `main` hands any command line that starts with one
//! of virtiofsd's options ([`is_virtiofsd_command_line`]) to [`run`].
//! libvirt 9.0 (Debian 12) passes `--fd=N` (a listening socket it created
//! and labelled for QEMU), `-o source=DIR[,cache=…][,sandbox=…][,xattr|
//! no_xattr][,flock|no_flock][,posix_lock|no_posix_lock]`,
//! `--thread-pool-size=N` and `-d`; management tools probe a backend with
//! `--print-capabilities`. sluice takes the volume from the `<source
//! dir=…>` path: a directory holding [`CONFIG_FILE`], or such a file itself
//! (`META_URL=`, `SLUICE_ARGS=`, the format of
//! `packaging/systemd/example.env`), and serves it on the inherited socket
//! until the VM leaves (`--once`). Options that tune only virtiofsd's own
//! passthrough are accepted and logged as ignored; any other option is an
//! error, never a silent guess.
//!
//! `sluice install-libvirt` writes the vhost-user backend descriptor (QEMU's
//! `docs/interop/vhost-user.json`, `"type": "fs"`). `docs/qemu-libvirt.md`,
//! "libvirt starts sluice", has the domain XML.

use std::os::fd::{BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Args, Parser};

/// The file in `<source dir=…>` that names the volume and serve's flags.
pub const CONFIG_FILE: &str = "sluice.env";

/// The descriptor's file name: after the distributions' `50-*` virtiofsd
/// descriptors, so a domain without `<binary>` keeps getting virtiofsd
/// (libvirt takes the first `"fs"` descriptor in file-name order).
pub const DESCRIPTOR_NAME: &str = "90-sluice.json";

/// Where `install-libvirt` writes the descriptor by default: the folder the
/// vhost-user schema keeps for the administrator's own additions (the
/// Debian package puts it in `/usr/share/qemu/vhost-user/` instead).
pub const DEFAULT_DESCRIPTOR_DIR: &str = "/etc/qemu/vhost-user";

/// What `--print-capabilities` prints: the backend type and no optional
/// features (so a newer libvirt keeps passing virtiofsd's `-o` options,
/// the form parsed here, not its "separate-options" form).
pub const CAPABILITIES: &str = "{\n  \"type\": \"fs\",\n  \"features\": []\n}\n";

/// virtiofsd's options that may come first on its command line: a command
/// line starting with one of these is libvirt's (or a person's) virtiofsd
/// command line, not a `sluice` subcommand.
const VIRTIOFSD_FIRST_OPTIONS: [&str; 5] = [
    "--fd",
    "--print-capabilities",
    "--socket-path",
    "--shared-dir",
    "-o",
];

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

/// Whether `args` (the program name excluded) is virtiofsd's command line.
pub fn is_virtiofsd_command_line(args: &[String]) -> bool {
    args.first().is_some_and(|first| {
        let name = first.split_once('=').map_or(first.as_str(), |(n, _)| n);
        VIRTIOFSD_FIRST_OPTIONS.contains(&name)
    })
}

/// What libvirt asked for, in sluice's terms.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    /// `--print-capabilities`: print [`CAPABILITIES`] and exit.
    pub print_capabilities: bool,
    /// `--fd=N`: the listening socket libvirt created.
    pub fd: Option<RawFd>,
    /// `--socket-path=P` (or `-o vhost_user_socket=P`): create the socket.
    pub socket_path: Option<PathBuf>,
    /// `-o source=PATH` or `--shared-dir=PATH`: libvirt's `<source dir=…>`.
    pub source: Option<PathBuf>,
    /// virtiofsd options accepted without effect, for the log.
    pub ignored: Vec<String>,
}

/// Splits virtiofsd's `-o a,b=c` list; `,,` is an escaped comma (libvirt
/// doubles commas in the source path).
fn split_options(list: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = list.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' && chars.peek() != Some(&',') {
            out.push(String::new());
            continue;
        }
        if c == ',' {
            chars.next();
        }
        if let Some(s) = out.last_mut() {
            s.push(c);
        }
    }
    out.into_iter().filter(|s| !s.is_empty()).collect()
}

/// virtiofsd's `-o` flags that only tune its own passthrough file system.
const IGNORED_FLAGS: [&str; 9] = [
    "xattr",
    "no_xattr",
    "flock",
    "no_flock",
    "posix_lock",
    "no_posix_lock",
    "announce_submounts",
    "writeback",
    "no_writeback",
];

/// virtiofsd's `--name=value` options that only tune its own work.
const IGNORED_VALUED: [&str; 5] = [
    "--thread-pool-size",
    "--cache",
    "--sandbox",
    "--log-level",
    "--rlimit-nofile",
];

/// virtiofsd's valueless options that only tune its own work.
const IGNORED_SWITCHES: [&str; 14] = [
    "-d",
    "--debug",
    "-f",
    "--foreground",
    "--syslog",
    "--xattr",
    "--no-xattr",
    "--announce-submounts",
    "--posix-lock",
    "--no-posix-lock",
    "--flock",
    "--no-flock",
    "--writeback",
    "--no-writeback",
];

/// Parses virtiofsd's command line (the program name excluded).
pub fn parse(args: &[String]) -> anyhow::Result<Invocation> {
    let mut inv = Invocation::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = |what: &str| -> anyhow::Result<String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => args
                    .next()
                    .cloned()
                    .with_context(|| format!("{what} needs a value")),
            }
        };
        match name {
            "--print-capabilities" => inv.print_capabilities = true,
            "--fd" => {
                let v = value("--fd")?;
                inv.fd = Some(
                    v.parse()
                        .with_context(|| format!("--fd={v}: not a number"))?,
                );
            }
            "--socket-path" => inv.socket_path = Some(value("--socket-path")?.into()),
            "--shared-dir" => inv.source = Some(value("--shared-dir")?.into()),
            "-o" => {
                for opt in split_options(&value("-o")?) {
                    match opt.split_once('=') {
                        Some(("source", dir)) => inv.source = Some(dir.into()),
                        Some(("vhost_user_socket", p)) => inv.socket_path = Some(p.into()),
                        Some(("cache" | "sandbox" | "log_level", _)) => inv.ignored.push(opt),
                        None if IGNORED_FLAGS.contains(&opt.as_str()) => inv.ignored.push(opt),
                        _ => bail!("virtiofsd option -o {opt} is not supported by sluice"),
                    }
                }
            }
            _ if IGNORED_VALUED.contains(&name) => {
                let v = value(name)?;
                inv.ignored.push(format!("{name}={v}"));
            }
            _ if IGNORED_SWITCHES.contains(&name) && inline.is_none() => {
                inv.ignored.push(name.to_owned())
            }
            _ => bail!("virtiofsd option {arg} is not supported by sluice"),
        }
    }
    Ok(inv)
}

/// The contents of [`CONFIG_FILE`]: the volume and serve's further flags.
#[derive(Debug, PartialEq, Eq)]
pub struct SourceConfig {
    /// `META_URL=`: the metadata engine URL.
    pub meta_url: String,
    /// `SLUICE_ARGS=`: further `sluice serve` flags, split on spaces.
    pub serve_args: Vec<String>,
}

/// Reads `VAR=value` lines (`#` comments, blank lines). `SOCKET=` and
/// `MOUNTPOINT=` (the systemd units' settings, so one file can serve both)
/// are skipped: libvirt gives the socket. Other names are an error, so
/// that a typo does not serve the wrong thing.
pub fn parse_config(text: &str) -> anyhow::Result<SourceConfig> {
    let mut meta_url = None;
    let mut serve_args = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            bail!("line {}: expected VAR=value", n + 1);
        };
        match key.trim() {
            "META_URL" => meta_url = Some(value.trim().to_owned()),
            "SLUICE_ARGS" => serve_args = value.split_whitespace().map(str::to_owned).collect(),
            "SOCKET" | "MOUNTPOINT" => {}
            other => bail!(
                "line {}: unknown setting {other} (META_URL, SLUICE_ARGS)",
                n + 1
            ),
        }
    }
    let meta_url = meta_url
        .filter(|u| !u.is_empty())
        .context("no META_URL= line")?;
    Ok(SourceConfig {
        meta_url,
        serve_args,
    })
}

/// The settings file for libvirt's `<source dir=…>` path: the path itself
/// when it is a file, else [`CONFIG_FILE`] inside it.
pub fn config_path(source: &Path) -> PathBuf {
    if source.is_file() {
        source.to_path_buf()
    } else {
        source.join(CONFIG_FILE)
    }
}

/// `sluice serve`'s arguments, parsed the way the subcommand parses them.
#[derive(Debug, Parser)]
#[command(name = "sluice serve")]
struct ServeCommand {
    #[command(flatten)]
    args: super::serve::ServeArgs,
}

/// Fails unless `fd` is an open descriptor of this process.
fn check_open(fd: RawFd) -> anyhow::Result<()> {
    // SAFETY: fcntl(F_GETFD) only reads the descriptor table entry.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!("--fd={fd}: no such open file descriptor");
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
    let addr = listener.local_addr().context("--fd: not a Unix socket")?;
    addr.as_pathname()
        .map(Path::to_path_buf)
        .context("--fd: the socket has no path")
}

/// Takes the listening socket libvirt passed down as `--fd=N`.
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

/// Runs sluice as libvirt's virtio-fs backend: `args` without the program name.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let inv = parse(args)?;
    if inv.print_capabilities {
        print!("{CAPABILITIES}");
        return Ok(());
    }
    let source = inv
        .source
        .as_deref()
        .context("no -o source=PATH (or --shared-dir): libvirt's <source dir=...>")?;
    let file = config_path(source);
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let config = parse_config(&text).with_context(|| format!("in {}", file.display()))?;
    for opt in &inv.ignored {
        log::info!("virtiofsd option {opt} has no effect on sluice (ignored)");
    }
    let mut argv = vec!["sluice serve".to_owned(), config.meta_url];
    match (inv.fd, &inv.socket_path) {
        (Some(fd), None) => {
            let path = bound_path(fd)?;
            argv.extend(["--socket".into(), path.display().to_string()]);
            argv.extend(["--listen-fd".into(), fd.to_string()]);
        }
        (None, Some(path)) => argv.extend(["--socket".into(), path.display().to_string()]),
        (Some(_), Some(_)) => bail!("--fd and --socket-path together: give one"),
        (None, None) => bail!("no --fd=N or --socket-path: where does QEMU connect?"),
    }
    argv.push("--once".into());
    argv.extend(config.serve_args);
    let command = ServeCommand::try_parse_from(&argv)
        .with_context(|| format!("SLUICE_ARGS in {}", file.display()))?;
    log::info!(
        "started as a virtio-fs backend; settings from {}",
        file.display()
    );
    super::serve::run(command.args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// libvirt 9.0's command line for `<filesystem>` with a `<binary>`,
    /// every `<driver>`/`<binary>` setting given.
    #[test]
    fn libvirt_command_line_maps_to_fd_and_source() {
        let line = args(&[
            "--fd=23",
            "-o",
            "source=/srv/vol,,a,cache=always,sandbox=chroot,xattr,no_flock,posix_lock",
            "--thread-pool-size=16",
            "-d",
        ]);
        assert!(is_virtiofsd_command_line(&line));
        let inv = parse(&line).unwrap();
        assert_eq!(inv.fd, Some(23));
        assert_eq!(inv.source, Some(PathBuf::from("/srv/vol,a")));
        assert_eq!(
            inv.ignored,
            [
                "cache=always",
                "sandbox=chroot",
                "xattr",
                "no_flock",
                "posix_lock",
                "--thread-pool-size=16",
                "-d"
            ]
        );
    }

    /// The Rust virtiofsd's spelling, which newer libvirt uses for a backend
    /// that reports "separate-options" (sluice does not, but takes it).
    #[test]
    fn separate_options_parse_too() {
        let inv = parse(&args(&[
            "--socket-path",
            "/run/vm.sock",
            "--shared-dir",
            "/etc/sluice/vm1",
            "--cache",
            "auto",
            "--xattr",
            "--announce-submounts",
        ]))
        .unwrap();
        assert_eq!(inv.socket_path, Some(PathBuf::from("/run/vm.sock")));
        assert_eq!(inv.source, Some(PathBuf::from("/etc/sluice/vm1")));
        assert_eq!(inv.ignored.len(), 3);
    }

    #[test]
    fn unknown_options_are_errors() {
        assert!(parse(&args(&["--fd=3", "-o", "source=/x,killpriv_v2"])).is_err());
        assert!(parse(&args(&["--inode-file-handles=mandatory"])).is_err());
        assert!(parse(&args(&["--fd=x"])).is_err());
        assert!(parse(&args(&["--xattr=1"])).is_err());
        assert!(
            parse(&args(&["--print-capabilities"]))
                .unwrap()
                .print_capabilities
        );
    }

    #[test]
    fn subcommands_are_not_virtiofsd_command_lines() {
        assert!(!is_virtiofsd_command_line(&args(&["serve", "--fd=3"])));
        assert!(!is_virtiofsd_command_line(&args(&["--help"])));
        assert!(!is_virtiofsd_command_line(&[]));
        assert!(is_virtiofsd_command_line(&args(&["--print-capabilities"])));
        assert!(is_virtiofsd_command_line(&args(&["--socket-path=/x"])));
    }

    #[test]
    fn capabilities_are_json_of_type_fs() {
        let v: serde_json::Value = serde_json::from_str(CAPABILITIES).unwrap();
        assert_eq!(v["type"], "fs");
        assert_eq!(v["features"], serde_json::json!([]));
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
        assert!(parse_config("SOKET=/x\nMETA_URL=a").is_err());
        assert!(parse_config("SLUICE_ARGS=").is_err());
    }
}
