//! `sluice virtiofsd`: the command line libvirt uses when it starts a
//! virtio-fs backend itself (`<binary path=.../>` in a `<filesystem>`).
//!
//! libvirt 9.x starts the backend as virtiofsd: `--fd=N` (a listening
//! socket it created), `-o source=DIR[,cache=…][,sandbox=…][,xattr|no_xattr]
//! [,flock|no_flock][,posix_lock|no_posix_lock]`, `--thread-pool-size=N`
//! and `-d`; and `--print-capabilities` to probe. sluice takes the volume
//! from `DIR/sluice.env` (`META_URL=`, `SLUICE_ARGS=`, the format of
//! `packaging/systemd/example.env`) and serves it on the inherited socket
//! until the VM leaves (`--once`). Options that only tune virtiofsd's own
//! passthrough are accepted and logged as ignored; any other option is an
//! error, never a silent guess. `docs/qemu-libvirt.md`, "libvirt starts
//! sluice", has the domain XML.

use std::os::fd::{BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::Parser;

/// The name the vhost-user descriptor's `binary` points at (a link to
/// `sluice`): invoked under it, sluice parses virtiofsd's command line.
pub const PROGRAM_NAME: &str = "sluice-virtiofsd";

/// The file in `<source dir=…>` that names the volume and serve's flags.
pub const CONFIG_FILE: &str = "sluice.env";

/// What `--print-capabilities` prints (QEMU's `docs/interop/vhost-user.json`).
pub const CAPABILITIES: &str = "{\n  \"type\": \"fs\",\n  \"features\": []\n}\n";

/// What libvirt asked for, in sluice's terms.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    /// `--print-capabilities`: print [`CAPABILITIES`] and exit.
    pub print_capabilities: bool,
    /// `--fd=N`: the listening socket libvirt created.
    pub fd: Option<RawFd>,
    /// `--socket-path=P` (or `-o vhost_user_socket=P`): create the socket.
    pub socket_path: Option<PathBuf>,
    /// `-o source=DIR` or `--shared-dir=DIR`: the folder holding [`CONFIG_FILE`].
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
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                out.last_mut().map(|s| s.push(','));
            } else {
                out.push(String::new());
            }
        } else if let Some(s) = out.last_mut() {
            s.push(c);
        }
    }
    out.into_iter().filter(|s| !s.is_empty()).collect()
}

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
                        None if matches!(
                            opt.as_str(),
                            "xattr"
                                | "no_xattr"
                                | "flock"
                                | "no_flock"
                                | "posix_lock"
                                | "no_posix_lock"
                                | "announce_submounts"
                        ) =>
                        {
                            inv.ignored.push(opt)
                        }
                        _ => bail!("virtiofsd option -o {opt} is not supported by sluice"),
                    }
                }
            }
            "--thread-pool-size" | "--cache" | "--sandbox" | "--log-level" => {
                let v = value(name)?;
                inv.ignored.push(format!("{name}={v}"));
            }
            "-d"
            | "--debug"
            | "--xattr"
            | "--announce-submounts"
            | "--syslog"
            | "-f"
            | "--foreground" => inv.ignored.push(name.to_owned()),
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

/// Reads `VAR=value` lines (`#` comments, blank lines); unknown names are
/// an error so that a typo does not serve the wrong thing.
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

/// `sluice serve`'s arguments, parsed the way the subcommand parses them.
#[derive(Debug, Parser)]
#[command(name = "sluice serve")]
struct ServeCommand {
    #[command(flatten)]
    args: super::serve::ServeArgs,
}

/// The path the inherited listening socket `fd` is bound to (for logs and
/// the control socket beside it); `fd` itself stays open.
fn bound_path(fd: RawFd) -> anyhow::Result<PathBuf> {
    // SAFETY: fcntl(F_GETFD) only reads the descriptor table entry.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!("--fd={fd}: no such open file descriptor");
    }
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
    // SAFETY: fcntl(F_GETFD) only reads the descriptor table entry.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!("--fd={fd}: no such open file descriptor");
    }
    // SAFETY: the descriptor is open (checked above) and was handed to this
    // process by its parent for it alone; this is the one place that takes
    // ownership of it, once (`serve --listen-fd` is given it once).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: F_SETFD on a descriptor we own; nothing else reads the flags.
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
        .context("no -o source=DIR (or --shared-dir): libvirt's <source dir=...>")?;
    let file = source.join(CONFIG_FILE);
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
    super::serve::run(command.args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// libvirt 9.x's command line for `<filesystem>` with a `<binary>`.
    #[test]
    fn libvirt_command_line_maps_to_fd_and_source() {
        let inv = parse(&args(&[
            "--fd=23",
            "-o",
            "source=/srv/vol,,a,cache=always,sandbox=chroot,xattr,no_flock,posix_lock",
            "--thread-pool-size=16",
            "-d",
        ]))
        .unwrap();
        assert_eq!(inv.fd, Some(23));
        assert_eq!(inv.source, Some(PathBuf::from("/srv/vol,a")));
        assert_eq!(inv.ignored.len(), 7);
    }

    #[test]
    fn unknown_options_are_errors() {
        assert!(parse(&args(&["--fd=3", "-o", "source=/x,writeback"])).is_err());
        assert!(parse(&args(&["--inode-file-handles=mandatory"])).is_err());
        assert!(
            parse(&args(&["--print-capabilities"]))
                .unwrap()
                .print_capabilities
        );
    }

    #[test]
    fn config_names_the_volume_and_flags() {
        let c = parse_config("# x\nMETA_URL=sqlite3:///v.db\nSLUICE_ARGS=--queues 2 --read-only\n")
            .unwrap();
        assert_eq!(c.meta_url, "sqlite3:///v.db");
        assert_eq!(c.serve_args, ["--queues", "2", "--read-only"]);
        assert!(parse_config("SOCKET=/x\nMETA_URL=a").is_err());
        assert!(parse_config("SLUICE_ARGS=").is_err());
    }
}
