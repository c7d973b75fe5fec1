//! virtiofsd's command line, read the way virtiofsd 1.x reads it, and put
//! in sluice's terms: what maps onto a `sluice serve` setting, what is
//! accepted and has no effect on a volume served from its metadata (one
//! log line each), and what is refused because sluice cannot keep its
//! meaning (an error that says why).
//!
//! The spellings are virtiofsd's: `--name=value` or `--name value`, the
//! switches, and the deprecated `-o a,b=c` form of the C virtiofsd that
//! libvirt before "separate-options" and older scripts pass (`,,` is a
//! comma inside a value: libvirt doubles the commas of the source path).
//! A later option overrides an earlier one, as in virtiofsd.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use log::LevelFilter;
use sluice_fuse::DataCache;

use crate::sandbox::SeccompMode;

/// The longest tag virtio-fs carries (the configuration space's field).
pub const MAX_TAG_LEN: usize = 36;

/// virtiofsd's `--cache` policies: how long the guest may trust names and
/// attributes, and whether it caches file data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CachePolicy {
    /// No caching: names and attributes are asked for every time, file
    /// data bypasses the guest's page cache.
    Never,
    /// Names and attributes for a day, file data not cached.
    Metadata,
    /// Names and attributes for a second, file data cached until the file
    /// is opened again or changes (virtiofsd's default).
    #[default]
    Auto,
    /// Names and attributes for a day, file data kept across opens.
    Always,
}

impl CachePolicy {
    /// The policy `value` names (`none` is the C virtiofsd's `never`).
    fn parse(value: &str) -> Option<CachePolicy> {
        Some(match value {
            "never" | "none" => CachePolicy::Never,
            "metadata" => CachePolicy::Metadata,
            "auto" => CachePolicy::Auto,
            "always" => CachePolicy::Always,
            _ => return None,
        })
    }

    /// The entry and attribute timeout virtiofsd puts in its replies.
    pub fn timeout(self) -> Duration {
        match self {
            CachePolicy::Never => Duration::ZERO,
            CachePolicy::Auto => Duration::from_secs(1),
            CachePolicy::Metadata | CachePolicy::Always => Duration::from_secs(86_400),
        }
    }

    /// What OPEN replies say about the guest's page cache.
    pub fn data_cache(self) -> DataCache {
        match self {
            CachePolicy::Never | CachePolicy::Metadata => DataCache::Never,
            CachePolicy::Auto => DataCache::Auto,
            CachePolicy::Always => DataCache::Always,
        }
    }
}

/// What the command line asked for, in sluice's terms.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    /// `--print-capabilities`: print the capabilities and exit.
    pub print_capabilities: bool,
    /// `-h`/`--help`: print what this mode takes and exit.
    pub help: bool,
    /// `-V`/`--version`.
    pub version: bool,
    /// `--fd=N`: a listening socket the launcher created.
    pub fd: Option<RawFd>,
    /// `--socket-path=P` (`--socket`, `-o vhost_user_socket=P`): create it.
    pub socket_path: Option<PathBuf>,
    /// `--socket-group=G`: the group the created socket is given to.
    pub socket_group: Option<String>,
    /// `--shared-dir=DIR` (`-o source=DIR`).
    pub shared_dir: Option<PathBuf>,
    /// `--tag=T`: the tag in the device's configuration space.
    pub tag: Option<String>,
    /// `--readonly`.
    pub read_only: bool,
    /// `--seccomp=…` as sluice's `--seccomp`.
    pub seccomp: Option<SeccompMode>,
    /// `--cache=…` (`-o cache=…`).
    pub cache: CachePolicy,
    /// `-o timeout=SECONDS` (the C virtiofsd's): overrides the policy's
    /// entry and attribute timeout.
    pub timeout: Option<Duration>,
    /// `--log-level`, `-d`, `-o log_level=`/`loglevel=`/`debug`.
    pub log_level: Option<LevelFilter>,
    /// `--syslog`: log to syslog instead of stderr.
    pub syslog: bool,
    /// `--rlimit-nofile=N` (0: leave the limit alone).
    pub rlimit_nofile: Option<u64>,
    /// Options accepted without effect, with why: one log line each.
    pub ignored: Vec<(String, &'static str)>,
    /// Options read otherwise than their words say (deprecated spellings,
    /// a mode sluice lacks): one log line each.
    pub notes: Vec<String>,
}

impl Invocation {
    /// The entry and attribute timeout the guest gets.
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or_else(|| self.cache.timeout())
    }
}

/// Why each option without effect has none (the log line's reason).
mod why {
    pub const THREADS: &str = "sluice answers each request queue on its own worker and runs \
                               requests that wait on its waiter threads (--waiters)";
    pub const SANDBOX: &str = "sluice always sandboxes itself (service user, Landlock, seccomp)";
    pub const XATTR: &str = "the volume's extended attributes are always served";
    pub const ACL: &str = "POSIX ACLs follow the volume: kept and checked where it was \
                           formatted with --enable-acl (as JuiceFS), refused with EOPNOTSUPP \
                           elsewhere";
    pub const SUBMOUNTS: &str = "a volume served from its metadata has no submounts";
    pub const HANDLES: &str = "sluice names nodes by the volume's inode numbers, not by host \
                               file handles";
    pub const LOCKS: &str = "locks stay in the guest's kernel, as with virtiofsd's default";
    pub const WRITEBACK: &str = "sluice buffers writes itself and does not ask the guest for \
                                 FUSE writeback caching";
    pub const DIRECT_IO: &str = "sluice reads and writes the volume the same way for O_DIRECT \
                                 opens";
    pub const MMAP: &str = "the guest may map files as it does with --cache=auto";
    pub const READDIRPLUS: &str = "sluice always answers READDIRPLUS";
    pub const KILLPRIV: &str = "sluice always clears setuid/setgid on writes as Linux does \
                                (FUSE_HANDLE_KILLPRIV_V2)";
    pub const SECURITY_LABEL: &str = "the guest sets security labels as extended attributes, \
                                      which sluice stores";
    pub const NOATIME: &str = "sluice opens no host files for the guest";
    pub const CAPS: &str = "sluice drops privileges by switching user, not by capability sets";
    pub const AS_IS: &str = "it asks for what sluice does anyway";
    pub const FOREGROUND: &str = "sluice always runs in the foreground";
    pub const NORACE: &str = "sluice has no racy fallback to disable";
}

/// Why each refused option is refused.
mod refused {
    pub const IDMAP: &str = "virtiofsd maps guest ids through a user namespace; sluice serves \
                             the owners the volume stores and does not translate ids, so files \
                             the guest creates would be owned by other ids than virtiofsd gives \
                             them. Start the domain from the system libvirt (qemu:///system), \
                             which passes no id map";
    pub const TRANSLATE: &str = "sluice serves the owners the volume stores and does not \
                                 translate ids between guest and host";
    pub const XATTRMAP: &str = "sluice stores extended attributes under the names the guest \
                                gives; remapping them would change what other clients of the \
                                volume see";
    pub const MIGRATION: &str = "sluice cannot migrate a virtio-fs device's state to another \
                                 host (it reports no \"migrate-precopy\" capability)";
}

/// Options that take a value.
const VALUED: &[&str] = &[
    "--fd",
    "--socket-path",
    "--socket",
    "--socket-group",
    "--shared-dir",
    "--tag",
    "--thread-pool-size",
    "--xattrmap",
    "--sandbox",
    "--seccomp",
    "--inode-file-handles",
    "--cache",
    "--modcaps",
    "--log-level",
    "--rlimit-nofile",
    "--uid-map",
    "--gid-map",
    "--translate-uid",
    "--translate-gid",
    "--migration-mode",
    "--migration-on-error",
];

/// Parses virtiofsd's command line (the program name excluded).
pub fn parse(args: &[String]) -> anyhow::Result<Invocation> {
    let mut inv = Invocation::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        // `-oVALUE` and `-o VALUE`; `--name=value` and `--name value`.
        let (name, inline) = if let Some(v) = arg.strip_prefix("-o").filter(|v| !v.is_empty()) {
            ("-o", Some(v.trim_start_matches('=').to_owned()))
        } else {
            match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
                _ => (arg.as_str(), None),
            }
        };
        if name == "-o" || VALUED.contains(&name) {
            let value = match inline {
                Some(v) => v,
                None => args
                    .next()
                    .cloned()
                    .with_context(|| format!("virtiofsd option {name} needs a value"))?,
            };
            valued(&mut inv, name, &value)?;
            continue;
        }
        if inline.is_some() {
            bail!("virtiofsd option {name} takes no value ({arg})");
        }
        switch(&mut inv, arg)?;
    }
    Ok(inv)
}

/// One option that takes a value.
fn valued(inv: &mut Invocation, name: &str, value: &str) -> anyhow::Result<()> {
    let shown = format!("{name}={value}");
    match name {
        "--fd" => {
            let fd: RawFd = value
                .parse()
                .ok()
                .filter(|fd| *fd >= 0)
                .with_context(|| format!("{shown}: not a file descriptor number"))?;
            inv.fd = Some(fd);
        }
        "--socket-path" => inv.socket_path = Some(path(&shown, value)?),
        "--socket" => {
            inv.socket_path = Some(path(&shown, value)?);
            inv.notes.push(format!(
                "{shown} is virtiofsd's deprecated spelling of --socket-path, read as it"
            ));
        }
        "--socket-group" => inv.socket_group = Some(value.to_owned()),
        "--shared-dir" => inv.shared_dir = Some(path(&shown, value)?),
        "--tag" => {
            if value.is_empty() || value.len() > MAX_TAG_LEN {
                bail!("{shown}: a tag is 1 to {MAX_TAG_LEN} bytes");
            }
            inv.tag = Some(value.to_owned());
        }
        "--thread-pool-size" => {
            value
                .parse::<usize>()
                .with_context(|| format!("{shown}: not a number"))?;
            inv.ignored.push((shown, why::THREADS));
        }
        "--sandbox" => {
            if !matches!(value, "namespace" | "chroot" | "none") {
                bail!("{shown}: virtiofsd's sandbox modes are namespace, chroot and none");
            }
            inv.ignored.push((shown, why::SANDBOX));
        }
        "--seccomp" => {
            inv.seccomp = Some(match value {
                "kill" => SeccompMode::Kill,
                "log" => SeccompMode::Log,
                "none" => SeccompMode::None,
                "trap" => {
                    inv.notes.push(format!(
                        "{shown} is read as --seccomp=kill: a forbidden system call stops \
                         sluice (SIGSYS) without virtiofsd's report of which one"
                    ));
                    SeccompMode::Kill
                }
                _ => bail!("{shown}: the seccomp actions are none, kill, log and trap"),
            });
        }
        "--inode-file-handles" => {
            if !matches!(value, "never" | "prefer" | "fallback" | "mandatory") {
                bail!("{shown}: the modes are never, prefer and mandatory");
            }
            inv.ignored.push((shown, why::HANDLES));
        }
        "--cache" => {
            inv.cache = CachePolicy::parse(value).with_context(|| {
                format!("{shown}: the cache policies are never, metadata, auto and always")
            })?;
        }
        "--modcaps" => inv.ignored.push((shown, why::CAPS)),
        "--log-level" => inv.log_level = Some(log_level(&shown, value)?),
        "--rlimit-nofile" => {
            inv.rlimit_nofile = Some(
                value
                    .parse()
                    .with_context(|| format!("{shown}: not a number"))?,
            );
        }
        "--uid-map" | "--gid-map" => bail!("{shown}: {}", refused::IDMAP),
        "--translate-uid" | "--translate-gid" => bail!("{shown}: {}", refused::TRANSLATE),
        "--xattrmap" => bail!("{shown}: {}", refused::XATTRMAP),
        "--migration-mode" | "--migration-on-error" => bail!("{shown}: {}", refused::MIGRATION),
        "-o" => {
            for opt in split_options(value) {
                compat(inv, &opt)?;
            }
        }
        _ => bail!("virtiofsd option {shown} is not known"),
    }
    Ok(())
}

/// One option without a value.
fn switch(inv: &mut Invocation, arg: &str) -> anyhow::Result<()> {
    let reason = match arg {
        "--print-capabilities" => {
            inv.print_capabilities = true;
            return Ok(());
        }
        "-h" | "--help" => {
            inv.help = true;
            return Ok(());
        }
        "-V" | "--version" => {
            inv.version = true;
            return Ok(());
        }
        "--readonly" => {
            inv.read_only = true;
            return Ok(());
        }
        "--syslog" => {
            inv.syslog = true;
            return Ok(());
        }
        "-d" => {
            inv.log_level = Some(LevelFilter::Debug);
            inv.notes.push(
                "-d is virtiofsd's deprecated spelling of --log-level debug, read as it".into(),
            );
            return Ok(());
        }
        "-f" => why::FOREGROUND,
        "--xattr" => why::XATTR,
        "--posix-acl" => why::ACL,
        "--announce-submounts" | "--no-announce-submounts" => why::SUBMOUNTS,
        "--allow-mmap" => why::MMAP,
        "--no-readdirplus" => why::READDIRPLUS,
        "--writeback" => why::WRITEBACK,
        "--allow-direct-io" => why::DIRECT_IO,
        "--killpriv-v2" | "--no-killpriv-v2" => why::KILLPRIV,
        "--security-label" => why::SECURITY_LABEL,
        "--preserve-noatime" => why::NOATIME,
        "--migration-verify-handles" | "--migration-confirm-paths" => {
            bail!("{arg}: {}", refused::MIGRATION)
        }
        _ if arg.starts_with('-') => bail!(
            "virtiofsd option {arg} is not known (sluice takes virtiofsd 1.x's options; \
             `sluice --shared-dir x --help` lists them)"
        ),
        _ => bail!(
            "unexpected argument {arg:?}: virtiofsd takes options only (the shared \
             directory is --shared-dir DIR)"
        ),
    };
    inv.ignored.push((arg.to_owned(), reason));
    Ok(())
}

/// One option of the `-o` list.
fn compat(inv: &mut Invocation, opt: &str) -> anyhow::Result<()> {
    let shown = format!("-o {opt}");
    if let Some((key, value)) = opt.split_once('=') {
        match key {
            "source" => inv.shared_dir = Some(path(&shown, value)?),
            "vhost_user_socket" => inv.socket_path = Some(path(&shown, value)?),
            "cache" => {
                inv.cache = CachePolicy::parse(value).with_context(|| {
                    format!("{shown}: the cache policies are none, metadata, auto and always")
                })?;
            }
            "timeout" => {
                let secs: f64 = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .with_context(|| format!("{shown}: not a number of seconds"))?;
                inv.timeout = Some(Duration::from_secs_f64(secs));
            }
            "log_level" | "loglevel" => inv.log_level = Some(log_level(&shown, value)?),
            "sandbox" => {
                if !matches!(value, "namespace" | "chroot") {
                    bail!("{shown}: the sandbox modes are namespace and chroot");
                }
                inv.ignored.push((shown, why::SANDBOX));
            }
            "modcaps" => inv.ignored.push((shown, why::CAPS)),
            "xattrmap" => bail!("{shown}: {}", refused::XATTRMAP),
            _ => bail!("virtiofsd option {shown} is not known"),
        }
        return Ok(());
    }
    let reason = match opt {
        "debug" => {
            inv.log_level = Some(LevelFilter::Debug);
            return Ok(());
        }
        "xattr" | "no_xattr" => why::XATTR,
        "posix_acl" => why::ACL,
        "no_posix_acl" => why::AS_IS,
        "flock" | "no_flock" | "posix_lock" | "no_posix_lock" => why::LOCKS,
        "announce_submounts" => why::SUBMOUNTS,
        "writeback" | "no_writeback" => why::WRITEBACK,
        "readdirplus" | "no_readdirplus" => why::READDIRPLUS,
        "allow_direct_io" | "no_allow_direct_io" => why::DIRECT_IO,
        "killpriv_v2" | "no_killpriv_v2" => why::KILLPRIV,
        "security_label" | "no_security_label" => why::SECURITY_LABEL,
        "norace" => why::NORACE,
        _ => bail!("virtiofsd option {shown} is not known"),
    };
    inv.ignored.push((shown, reason));
    Ok(())
}

/// A path option's value: not empty.
fn path(shown: &str, value: &str) -> anyhow::Result<PathBuf> {
    if value.is_empty() {
        bail!("{shown}: an empty path");
    }
    Ok(PathBuf::from(value))
}

/// A log level in virtiofsd's words (`err` is the C virtiofsd's `error`).
fn log_level(shown: &str, value: &str) -> anyhow::Result<LevelFilter> {
    let value = if value == "err" { "error" } else { value };
    value.parse().ok().with_context(|| {
        format!("{shown}: the log levels are error, warn, info, debug, trace and off")
    })
}

/// Splits virtiofsd's `-o a,b=c` list; `,,` is an escaped comma (libvirt
/// doubles the commas in the source path).
pub fn split_options(list: &str) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn ignored(inv: &Invocation) -> Vec<&str> {
        inv.ignored.iter().map(|(o, _)| o.as_str()).collect()
    }

    /// libvirt 9.0's command line for `<filesystem>` with a `<binary>`,
    /// every `<driver>`/`<binary>` setting given.
    #[test]
    fn libvirt_compat_command_line() {
        let inv = parse(&args(&[
            "--fd=23",
            "-o",
            "source=/srv/vol,,a,cache=always,sandbox=chroot,xattr,no_flock,posix_lock",
            "--thread-pool-size=16",
            "--rlimit-nofile=4096",
            "-d",
        ]))
        .unwrap();
        assert_eq!(inv.fd, Some(23));
        assert_eq!(inv.shared_dir, Some(PathBuf::from("/srv/vol,a")));
        assert_eq!(inv.cache, CachePolicy::Always);
        assert_eq!(inv.rlimit_nofile, Some(4096));
        assert_eq!(inv.log_level, Some(LevelFilter::Debug));
        assert_eq!(
            ignored(&inv),
            [
                "-o sandbox=chroot",
                "-o xattr",
                "-o no_flock",
                "-o posix_lock",
                "--thread-pool-size=16",
            ]
        );
    }

    /// What a libvirt that reads "separate-options" passes, unprivileged
    /// id maps aside.
    #[test]
    fn libvirt_separate_options_command_line() {
        let inv = parse(&args(&[
            "--fd=5",
            "--shared-dir",
            "/srv/vol",
            "--cache",
            "never",
            "--sandbox",
            "chroot",
            "--xattr",
            "--thread-pool-size=2",
            "--log-level",
            "debug",
        ]))
        .unwrap();
        assert_eq!(inv.cache, CachePolicy::Never);
        assert_eq!(inv.timeout(), Duration::ZERO);
        assert_eq!(inv.log_level, Some(LevelFilter::Debug));
        assert_eq!(inv.shared_dir, Some(PathBuf::from("/srv/vol")));
    }

    /// Kata Containers' Go runtime (virtcontainers/virtiofsd.go) with its
    /// default `virtio_fs_extra_args`.
    #[test]
    fn kata_go_command_line() {
        let inv = parse(&args(&[
            "--syslog",
            "--cache=auto",
            "--shared-dir=/run/kata-containers/shared/sandboxes/x/shared",
            "--fd=3",
            "--thread-pool-size=1",
            "--announce-submounts",
        ]))
        .unwrap();
        assert!(inv.syslog);
        assert_eq!(inv.fd, Some(3));
        assert_eq!(inv.cache, CachePolicy::Auto);
        assert_eq!(inv.timeout(), Duration::from_secs(1));
        assert_eq!(
            ignored(&inv),
            ["--thread-pool-size=1", "--announce-submounts"]
        );
    }

    /// Kata's runtime-rs (share_virtio_fs_standalone.rs), guest SELinux on.
    #[test]
    fn kata_runtime_rs_command_line() {
        let inv = parse(&args(&[
            "--socket-path",
            "/run/kata/x/vhost-fs.sock",
            "--shared-dir",
            "/run/kata/x/ro",
            "--cache",
            "auto",
            "--thread-pool-size=1",
            "-o",
            "announce_submounts",
            "--xattr",
        ]))
        .unwrap();
        assert_eq!(
            inv.socket_path,
            Some(PathBuf::from("/run/kata/x/vhost-fs.sock"))
        );
        assert_eq!(inv.fd, None);
        assert_eq!(
            ignored(&inv),
            ["--thread-pool-size=1", "-o announce_submounts", "--xattr"]
        );
    }

    /// virtiofsd's documented line for Cloud Hypervisor, and the options
    /// sluice maps.
    #[test]
    fn cloud_hypervisor_command_line_and_mapped_options() {
        let inv = parse(&args(&[
            "--log-level",
            "debug",
            "--socket-path=/tmp/virtiofs",
            "--shared-dir=/tmp/shared_dir",
            "--cache=never",
            "--thread-pool-size=4",
            "--readonly",
            "--seccomp=log",
            "--tag=myfs",
            "--socket-group=kvm",
            "--inode-file-handles=mandatory",
            "--posix-acl",
            "--no-announce-submounts",
        ]))
        .unwrap();
        assert!(inv.read_only);
        assert_eq!(inv.seccomp, Some(SeccompMode::Log));
        assert_eq!(inv.tag.as_deref(), Some("myfs"));
        assert_eq!(inv.socket_group.as_deref(), Some("kvm"));
        assert_eq!(inv.cache.data_cache(), DataCache::Never);
        let trap = parse(&args(&["--seccomp", "trap"])).unwrap();
        assert_eq!(trap.seccomp, Some(SeccompMode::Kill));
        assert_eq!(trap.notes.len(), 1);
    }

    #[test]
    fn cache_policies_follow_virtiofsd() {
        for (v, t, d) in [
            ("never", 0, DataCache::Never),
            ("none", 0, DataCache::Never),
            ("metadata", 86_400, DataCache::Never),
            ("auto", 1, DataCache::Auto),
            ("always", 86_400, DataCache::Always),
        ] {
            let p = CachePolicy::parse(v).unwrap();
            assert_eq!(p.timeout(), Duration::from_secs(t), "{v}");
            assert_eq!(p.data_cache(), d, "{v}");
        }
        let inv = parse(&args(&["-o", "cache=always,timeout=2.5"])).unwrap();
        assert_eq!(inv.timeout(), Duration::from_millis(2500));
        assert_eq!(
            parse(&args(&["-ocache=none"])).unwrap().cache,
            CachePolicy::Never
        );
    }

    #[test]
    fn refusals_say_why() {
        let err = |a: &[&str]| parse(&args(a)).unwrap_err().to_string();
        assert!(err(&["--uid-map=:0:1000:1:"]).contains("user namespace"));
        assert!(err(&["--gid-map", ":0:1000:1:"]).contains("qemu:///system"));
        assert!(err(&["--translate-uid=map:0:1000:1"]).contains("translate"));
        assert!(err(&["--xattrmap=:map::user.virtiofs.:"]).contains("names the guest"));
        assert!(err(&["--migration-mode=file-handles"]).contains("migrate"));
        assert!(err(&["--migration-confirm-paths"]).contains("migrate"));
        assert!(err(&["-o", "source=/x,xattrmap=:ok:all:::"]).contains("names the guest"));
    }

    #[test]
    fn bad_input_is_an_error_naming_it() {
        let err = |a: &[&str]| parse(&args(a)).unwrap_err().to_string();
        assert!(err(&["--fd=3", "-o", "source=/x,killpriv"]).contains("-o killpriv"));
        assert!(err(&["--frobnicate"]).contains("--frobnicate"));
        assert!(err(&["--fd=x"]).contains("--fd=x"));
        assert!(err(&["--fd=-1"]).contains("--fd=-1"));
        assert!(err(&["--fd"]).contains("needs a value"));
        assert!(err(&["--xattr=1"]).contains("takes no value"));
        assert!(err(&["--cache=sometimes"]).contains("sometimes"));
        assert!(err(&["--seccomp=maybe"]).contains("maybe"));
        assert!(err(&["--log-level=loud"]).contains("loud"));
        assert!(err(&["--tag=0123456789012345678901234567890123456"]).contains("36"));
        assert!(err(&["--shared-dir="]).contains("empty"));
        assert!(err(&["/srv/vol"]).contains("--shared-dir"));
        assert!(err(&["-o", "cache=sometimes"]).contains("-o cache=sometimes"));
        assert!(err(&["-o", "sandbox=none"]).contains("-o sandbox=none"));
    }

    #[test]
    fn later_options_override_earlier_ones() {
        let inv = parse(&args(&[
            "--cache=never",
            "--cache",
            "always",
            "--shared-dir=/a",
            "-o",
            "source=/b",
        ]))
        .unwrap();
        assert_eq!(inv.cache, CachePolicy::Always);
        assert_eq!(inv.shared_dir, Some(PathBuf::from("/b")));
        assert!(
            parse(&args(&["--print-capabilities"]))
                .unwrap()
                .print_capabilities
        );
    }

    #[test]
    fn option_lists_split_on_single_commas() {
        assert_eq!(
            split_options("source=/a,,b,xattr"),
            ["source=/a,b", "xattr"]
        );
        assert_eq!(split_options(",cache=auto,"), ["cache=auto"]);
    }
}
