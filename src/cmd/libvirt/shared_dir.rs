//! Which volume, and which directory of it, virtiofsd's `--shared-dir`
//! names.
//!
//! A directory inside a sluice or JuiceFS FUSE mount is served from the
//! volume itself: sluice opens the volume's metadata engine and object
//! store and exports the directory by its inode, so the guest's requests
//! never pass through the host's FUSE mount. The volume is found from the
//! mount:
//!
//! - a sluice mount names its metadata URL in `/proc/self/mountinfo`
//!   (`sluice mount` puts it there without its password);
//! - a JuiceFS mount names its volume (`JuiceFS:NAME`) there, and its
//!   `.config` file holds the mounting process's id, the volume's UUID and
//!   the mounted subdirectory; the metadata URL is the `juicefs mount`
//!   command line's.
//!
//! Where the URL cannot be learned that way (a password kept out of the
//! command line, a mount made in another PID namespace, a URL without a
//! scheme), a settings file keyed by the volume's name says it:
//! `/etc/sluice/volumes/NAME.env` ([`VOLUMES_DIR`], or `$SLUICE_VOLUMES_DIR`),
//! in the format of `sluice.env` (`META_URL=`, `SLUICE_ARGS=`). Such a
//! file, when there is one, is read first; for a sluice mount it is the
//! file whose `META_URL` is the mount's without its password.
//!
//! Before serving, the directory is looked up in the volume by its path
//! from the mount's root and must be the inode the mount shows: a URL that
//! names another volume is refused. A directory on any other file system is
//! an error that says what sluice serves; the settings-file form of earlier
//! releases (`--shared-dir` naming a `sluice.env`, or a directory holding
//! one outside any mount) still serves the whole volume it names.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context as _, bail};
use sluice_engine::meta::{Context, FileType, Ino, ROOT_INO, open_meta};
use sluice_engine::redact::redact_url;

use super::{CONFIG_FILE, SourceConfig, parse_config};
use crate::cmd::mount::unescape_mountinfo;
use crate::cmd::serve::SharedDir;

/// Where the settings files keyed by volume name live.
pub const VOLUMES_DIR: &str = "/etc/sluice/volumes";

/// The environment variable that moves [`VOLUMES_DIR`].
pub const VOLUMES_DIR_ENV: &str = "SLUICE_VOLUMES_DIR";

/// The file-system type of a JuiceFS mount.
const JUICEFS_FSTYPE: &str = "fuse.juicefs";

/// The file-system type of a sluice mount.
const SLUICE_FSTYPE: &str = "fuse.sluice";

/// The metadata URL schemes JuiceFS knows (the ones sluice does not open
/// are still recognised, so the error says so rather than "no URL").
const META_SCHEMES: &[&str] = &[
    "redis", "rediss", "unix", "sqlite3", "sqlite", "mysql", "postgres", "tikv", "etcd", "badger",
    "fdb", "memkv",
];

/// The settings folder in use.
pub fn volumes_dir() -> PathBuf {
    std::env::var_os(VOLUMES_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(VOLUMES_DIR), PathBuf::from)
}

/// What to serve for a `--shared-dir`.
#[derive(Debug)]
pub struct Source {
    /// The volume's metadata URL, password included.
    pub meta_url: String,
    /// Further `sluice serve` flags from a settings file.
    pub serve_args: Vec<String>,
    /// The directory exported as the guest's root; `None`: the settings
    /// file decides (the whole volume, or its `--export`).
    pub shared_dir: Option<SharedDir>,
    /// The owner of the volume's local files (its SQLite database, else
    /// its `file://` bucket), for a volume mounted on this host: the daemon
    /// keeps that identity, so the mount's server and it can both write
    /// them.
    pub files_owner: Option<u32>,
    /// Where it came from, for the log.
    pub found: String,
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountEntry {
    mountpoint: PathBuf,
    fstype: String,
    source: String,
}

/// Finds the volume and directory `shared` names.
pub fn find(shared: &Path, volumes: &Path) -> anyhow::Result<Source> {
    let meta = std::fs::metadata(shared).map_err(|e| {
        anyhow::anyhow!(
            "--shared-dir {}: {}",
            shared.display(),
            if e.kind() == std::io::ErrorKind::NotFound {
                "no such directory (it was removed or renamed?)".to_owned()
            } else {
                e.to_string()
            }
        )
    })?;
    if meta.is_file() {
        return settings_file(shared);
    }
    if !meta.is_dir() {
        bail!("--shared-dir {}: not a directory", shared.display());
    }
    let dir = std::fs::canonicalize(shared)
        .with_context(|| format!("--shared-dir {}", shared.display()))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .context("cannot read /proc/self/mountinfo")?;
    let Some(mount) = mount_of(&info, &dir) else {
        bail!("--shared-dir {}: no mount holds it", dir.display());
    };
    match mount.fstype.as_str() {
        SLUICE_FSTYPE => in_sluice_mount(&dir, &meta, &mount, volumes),
        JUICEFS_FSTYPE => in_juicefs_mount(&dir, &meta, &mount, volumes),
        _ if dir.join(CONFIG_FILE).is_file() => settings_file(&dir.join(CONFIG_FILE)),
        other => bail!(
            "--shared-dir {} is on {other} (mounted on {}), not in a sluice or JuiceFS mount: \
             sluice serves a directory of a volume mounted with `sluice mount` or \
             `juicefs mount` (it opens the volume's metadata and objects itself), or the \
             volume a settings file names ({CONFIG_FILE}); use virtiofsd for other file \
             systems",
            dir.display(),
            mount.mountpoint.display()
        ),
    }
}

/// The settings-file form: the whole volume `file` names.
fn settings_file(file: &Path) -> anyhow::Result<Source> {
    let config = read_settings(file)?;
    apply_environment(&config.environment);
    Ok(Source {
        meta_url: config.meta_url,
        serve_args: config.serve_args,
        shared_dir: None,
        files_owner: None,
        found: format!("the volume {} names", file.display()),
    })
}

/// Sets the variables a settings file gives the daemon's environment, as
/// systemd's `EnvironmentFile=` does for the units that read the same file
/// (a value there wins over the launcher's). Called once the file is
/// chosen, before the volume is opened (its password may be among them)
/// and before logging is set up (`RUST_LOG`).
fn apply_environment(environment: &[(String, String)]) {
    for (name, value) in environment {
        // SAFETY: the virtiofsd drop-in is still single-threaded here: it
        // runs straight from `main`, and looks for its volume before it
        // sets up logging, opens anything or starts a thread, so nothing
        // reads the environment while it changes.
        unsafe { std::env::set_var(name, value) };
    }
}

fn read_settings(file: &Path) -> anyhow::Result<SourceConfig> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    parse_config(&text).with_context(|| format!("in {}", file.display()))
}

/// The innermost mount holding `path` (a canonical path): the longest
/// mount point above it, the last one mounted where several are stacked.
fn mount_of(mountinfo: &str, path: &Path) -> Option<MountEntry> {
    let mut best: Option<MountEntry> = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mountpoint options ... - fstype source super
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(mp), Some(fstype)) = (fields.get(4), fields.get(dash + 1)) else {
            continue;
        };
        let mountpoint = PathBuf::from(OsStr::from_bytes(&unescape_mountinfo(mp)));
        if !path.starts_with(&mountpoint) {
            continue;
        }
        let deeper = best
            .as_ref()
            .is_none_or(|b| mountpoint.components().count() >= b.mountpoint.components().count());
        if deeper {
            let source = fields
                .get(dash + 2)
                .map(|s| String::from_utf8_lossy(&unescape_mountinfo(s)).into_owned())
                .unwrap_or_default();
            best = Some(MountEntry {
                mountpoint,
                fstype: (*fstype).to_owned(),
                source,
            });
        }
    }
    best
}

/// The names from `base` down to `path` (`path` is below `base`).
fn names_below(base: &Path, path: &Path) -> Vec<Vec<u8>> {
    path.strip_prefix(base)
        .map(|rel| {
            rel.components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.as_bytes().to_vec()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A directory of a sluice mount.
fn in_sluice_mount(
    dir: &Path,
    stat: &std::fs::Metadata,
    mount: &MountEntry,
    volumes: &Path,
) -> anyhow::Result<Source> {
    // A settings file whose URL is the mount's, password and all.
    let mut settings = None;
    if let Ok(entries) = std::fs::read_dir(volumes) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension() != Some(OsStr::new("env")) {
                continue;
            }
            if let Ok(config) = read_settings(&path)
                && redact_url(&config.meta_url) == mount.source
            {
                settings = Some((path, config));
                break;
            }
        }
    }
    let (meta_url, serve_args, environment, from) = match settings {
        Some((path, c)) => (
            c.meta_url,
            c.serve_args,
            c.environment,
            format!(", URL from {}", path.display()),
        ),
        None => (mount.source.clone(), Vec::new(), Vec::new(), String::new()),
    };
    let names = names_below(&mount.mountpoint, dir);
    let found = format!(
        "{} in the sluice mount on {} (volume {}{from})",
        dir.display(),
        mount.mountpoint.display(),
        redact_url(&meta_url)
    );
    // A sluice mount shows the volume's own inode numbers, its root as 1.
    MountedDir {
        dir,
        meta_url,
        serve_args,
        environment,
        mount_root: Vec::new(),
        shown_ino: (!names.is_empty()).then(|| stat.ino()),
        names,
        uuid: None,
        found,
    }
    .resolve()
}

/// What a JuiceFS mount's `.config` says.
#[derive(Debug, PartialEq, Eq)]
struct JuicefsConfig {
    pid: Option<u32>,
    mountpoint: PathBuf,
    subdir: String,
    uuid: String,
    name: String,
}

/// Reads the parts of a JuiceFS mount's `.config` this module uses.
fn parse_juicefs_config(text: &str) -> anyhow::Result<JuicefsConfig> {
    let v: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
    let s = |a: &str, b: &str| v[a][b].as_str().unwrap_or_default().to_owned();
    Ok(JuicefsConfig {
        pid: v["Pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
        mountpoint: PathBuf::from(s("Meta", "MountPoint")),
        subdir: s("Meta", "Subdir"),
        uuid: s("Format", "UUID"),
        name: s("Format", "Name"),
    })
}

/// A directory of a JuiceFS mount.
fn in_juicefs_mount(
    dir: &Path,
    stat: &std::fs::Metadata,
    mount: &MountEntry,
    volumes: &Path,
) -> anyhow::Result<Source> {
    let mp = &mount.mountpoint;
    let text = [".config", ".jfs.config"]
        .iter()
        .find_map(|f| std::fs::read_to_string(mp.join(f)).ok())
        .with_context(|| {
            format!(
                "cannot read {}/.config, where the JuiceFS mount describes its volume \
                 (sluice must run as root to read it)",
                mp.display()
            )
        })?;
    let config =
        parse_juicefs_config(&text).with_context(|| format!("in {}/.config", mp.display()))?;
    let name = mount
        .source
        .strip_prefix("JuiceFS:")
        .map(str::to_owned)
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| config.name.clone());
    let file = volumes.join(format!("{name}.env"));
    let (meta_url, serve_args, environment, from) = if file.is_file() {
        let c = read_settings(&file)?;
        (
            c.meta_url,
            c.serve_args,
            c.environment,
            format!("from {}", file.display()),
        )
    } else {
        match config
            .pid
            .ok_or_else(|| "its .config names no process".to_owned())
            .and_then(|pid| juicefs_meta_url(pid, mp).map(|u| (pid, u)))
        {
            Ok((pid, url)) => (
                url,
                Vec::new(),
                Vec::new(),
                format!("from juicefs process {pid}"),
            ),
            Err(why) => bail!(
                "--shared-dir {} is in the JuiceFS mount of volume {name} on {}, whose \
                 metadata URL sluice cannot learn ({why}); write it to {} as \
                 META_URL=... (mode 0600 if it holds a password)",
                dir.display(),
                mp.display(),
                file.display()
            ),
        }
    };
    let found = format!(
        "{} in the JuiceFS mount of volume {name} on {} (URL {} {from})",
        dir.display(),
        mp.display(),
        redact_url(&meta_url)
    );
    let subdir: Vec<Vec<u8>> = config
        .subdir
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| p.as_bytes().to_vec())
        .collect();
    let names = names_below(mp, dir);
    // JuiceFS shows the mounted directory as inode 1 and every other node
    // by its own number.
    MountedDir {
        dir,
        meta_url,
        serve_args,
        environment,
        mount_root: subdir,
        shown_ino: (!names.is_empty()).then(|| stat.ino()),
        names,
        uuid: Some(config.uuid),
        found,
    }
    .resolve()
}

/// The `juicefs mount` process `pid`'s metadata URL, if its command line
/// shows it; otherwise why not.
fn juicefs_meta_url(pid: u32, mountpoint: &Path) -> Result<String, String> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let cmdline = std::fs::read(proc.join("cmdline"))
        .map_err(|e| format!("cannot read the command line of its process {pid}: {e}"))?;
    let cwd = std::fs::read_link(proc.join("cwd")).ok();
    meta_url_from_command_line(&command_line_args(&cmdline), mountpoint, cwd.as_deref())
        .map_err(|why| format!("process {pid}: {why}"))
}

/// The arguments in `/proc/PID/cmdline`. JuiceFS rewrites its own: one
/// string, the arguments joined by spaces, the password of the metadata URL
/// replaced by `****`; that is split on spaces (a path with a space in it
/// then reads as two arguments, and the URL is not learned).
fn command_line_args(cmdline: &[u8]) -> Vec<String> {
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    match args.as_slice() {
        [one] if one.contains(' ') => one.split_whitespace().map(str::to_owned).collect(),
        _ => args,
    }
}

/// The metadata URL of a `juicefs mount … META-URL MOUNTPOINT` command
/// line: the one argument after `mount` with a metadata scheme, from a
/// command line that mounts `mountpoint`. A relative SQLite path is taken
/// from the process's working directory `cwd`.
fn meta_url_from_command_line(
    args: &[String],
    mountpoint: &Path,
    cwd: Option<&Path>,
) -> Result<String, String> {
    let Some(at) = args.iter().skip(1).position(|a| a == "mount") else {
        return Err("it is not a `juicefs mount` (another PID namespace?)".into());
    };
    let after = &args[at + 2..];
    let mounts_it = after.iter().any(|a| {
        let p = Path::new(a);
        let p = match cwd {
            Some(cwd) if p.is_relative() => cwd.join(p),
            _ => p.to_path_buf(),
        };
        p == mountpoint || std::fs::canonicalize(&p).is_ok_and(|c| c == mountpoint)
    });
    if !mounts_it {
        return Err(format!(
            "its command line does not mount {} (another PID namespace?)",
            mountpoint.display()
        ));
    }
    let urls: Vec<&String> = after
        .iter()
        .filter(|a| {
            a.split_once("://")
                .is_some_and(|(s, _)| META_SCHEMES.contains(&s.to_ascii_lowercase().as_str()))
        })
        .collect();
    let [url] = urls.as_slice() else {
        return Err(if urls.is_empty() {
            "its command line shows no metadata URL with a scheme".into()
        } else {
            "its command line shows several metadata URLs".into()
        });
    };
    if url.contains(":****@") {
        return Err("its command line hides the metadata URL's password".into());
    }
    let (scheme, rest) = url.split_once("://").unwrap_or_default();
    if matches!(scheme, "sqlite3" | "sqlite") && !rest.starts_with('/') {
        let Some(cwd) = cwd else {
            return Err("its SQLite path is relative and its directory unknown".into());
        };
        return Ok(format!("{scheme}://{}", cwd.join(rest).display()));
    }
    Ok((*url).clone())
}

/// A directory of a mounted volume, before it is found in the volume.
#[derive(Debug)]
struct MountedDir<'a> {
    /// The directory on the host.
    dir: &'a Path,
    /// The volume's metadata URL, password included.
    meta_url: String,
    /// Further `sluice serve` flags from a settings file.
    serve_args: Vec<String>,
    /// The daemon's environment from that file.
    environment: Vec<(String, String)>,
    /// The names of the mount's root from the volume's root (JuiceFS's
    /// `--subdir`).
    mount_root: Vec<Vec<u8>>,
    /// The names of the directory below the mount's root.
    names: Vec<Vec<u8>>,
    /// The inode the mount shows for it; `None` for the mount's root.
    shown_ino: Option<Ino>,
    /// The mounted volume's UUID, where the mount says it.
    uuid: Option<String>,
    /// Where it came from, for the log.
    found: String,
}

impl MountedDir<'_> {
    /// Opens the volume, finds the directory by its names and checks it is
    /// the node the mount shows.
    fn resolve(self) -> anyhow::Result<Source> {
        apply_environment(&self.environment);
        let shown = redact_url(&self.meta_url);
        let meta = open_meta(&self.meta_url)
            .with_context(|| format!("cannot open the volume at {shown}"))?;
        let format = meta
            .load()
            .with_context(|| format!("cannot read the volume at {shown}"))?;
        if let Some(uuid) = self.uuid.as_deref().filter(|u| !u.is_empty())
            && format.uuid != uuid
        {
            bail!(
                "the volume at {shown} is {} ({}), not the mounted one ({uuid}): its settings \
                 name another volume",
                format.name,
                format.uuid
            );
        }
        let dir = self.dir;
        let walk = |from: Ino, names: &[Vec<u8>]| -> anyhow::Result<Ino> {
            let ctx = Context::internal();
            let mut ino = from;
            for name in names {
                let (child, attr) = meta.lookup(&ctx, ino, name).with_context(|| {
                    format!(
                        "the volume at {shown} has no {:?} where the mount shows {}",
                        String::from_utf8_lossy(name),
                        dir.display()
                    )
                })?;
                if attr.typ != FileType::Directory {
                    bail!(
                        "{:?} is not a directory in the volume at {shown}",
                        String::from_utf8_lossy(name)
                    );
                }
                ino = child;
            }
            Ok(ino)
        };
        let top = walk(ROOT_INO, &self.mount_root)?;
        let ino = walk(top, &self.names)?;
        let want = self.shown_ino.unwrap_or(top);
        if ino != want {
            bail!(
                "the volume at {shown} does not hold {} (its path there is inode {ino}, the \
                 mount shows inode {want}): the metadata URL names another volume",
                dir.display()
            );
        }
        let files_owner = local_files_owner(&self.meta_url, &format.storage, &format.bucket);
        let mut names = self.mount_root;
        names.extend(self.names);
        Ok(Source {
            meta_url: self.meta_url,
            serve_args: self.serve_args,
            shared_dir: Some(SharedDir {
                ino,
                host_path: dir.to_path_buf(),
                names,
            }),
            files_owner,
            found: self.found,
        })
    }
}

/// The owner of the volume's SQLite database, else of its `file://`
/// bucket; `None` for a volume with no local files.
fn local_files_owner(meta_url: &str, storage: &str, bucket: &str) -> Option<u32> {
    let path = crate::sandbox::sqlite_path(meta_url)
        .or_else(|| (storage == "file").then(|| PathBuf::from(bucket)))?;
    std::fs::metadata(path).ok().map(|m| m.uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:40 / /mnt/jfs rw,nosuid,nodev,relatime shared:2 - fuse.juicefs JuiceFS:vol1 rw,user_id=0
41 40 0:41 / /mnt/jfs/inner rw,relatime - tmpfs tmpfs rw
42 22 0:42 / /mnt/sl\\040x rw - fuse.sluice sqlite3:///var/lib/a\\040b.db rw
43 22 0:43 / /mnt/stack rw - tmpfs tmpfs rw
44 43 0:44 / /mnt/stack rw - fuse.sluice redis://h:6379/1 rw
";

    fn entry(path: &str) -> Option<(String, String, String)> {
        mount_of(MOUNTINFO, Path::new(path))
            .map(|m| (m.mountpoint.display().to_string(), m.fstype, m.source))
    }

    #[test]
    fn the_innermost_mount_holds_a_path() {
        assert_eq!(
            entry("/mnt/jfs/data/x").unwrap(),
            (
                "/mnt/jfs".into(),
                "fuse.juicefs".into(),
                "JuiceFS:vol1".into()
            )
        );
        assert_eq!(entry("/mnt/jfs/inner/x").unwrap().1, "tmpfs");
        assert_eq!(
            entry("/mnt/jfsx").unwrap().1,
            "ext4",
            "a name prefix is not a parent"
        );
        assert_eq!(
            entry("/mnt/sl x/d").unwrap(),
            (
                "/mnt/sl x".into(),
                "fuse.sluice".into(),
                "sqlite3:///var/lib/a b.db".into()
            )
        );
        assert_eq!(
            entry("/mnt/stack/d").unwrap().1,
            "fuse.sluice",
            "the top of a stack"
        );
    }

    #[test]
    fn names_below_a_mount() {
        assert_eq!(
            names_below(Path::new("/mnt/jfs"), Path::new("/mnt/jfs/a/b")),
            [b"a".to_vec(), b"b".to_vec()]
        );
        assert!(names_below(Path::new("/mnt/jfs"), Path::new("/mnt/jfs")).is_empty());
    }

    #[test]
    fn juicefs_config_fields() {
        let c = parse_juicefs_config(
            r#"{"Meta":{"MountPoint":"/mnt/jfs","Subdir":"a/b"},
                "Format":{"Name":"vol1","UUID":"u-1"},"Pid":2269,"PPid":2261}"#,
        )
        .unwrap();
        assert_eq!(c.pid, Some(2269));
        assert_eq!(c.mountpoint, PathBuf::from("/mnt/jfs"));
        assert_eq!(c.subdir, "a/b");
        assert_eq!((c.name.as_str(), c.uuid.as_str()), ("vol1", "u-1"));
        assert!(parse_juicefs_config("nope").is_err());
    }

    fn line(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_meta_url_of_a_juicefs_command_line() {
        let mp = Path::new("/mnt/jfs");
        let url = |a: &[&str], cwd: Option<&str>| {
            meta_url_from_command_line(&line(a), mp, cwd.map(Path::new))
        };
        assert_eq!(
            url(
                &[
                    "juicefs",
                    "mount",
                    "--cache-dir",
                    "/c",
                    "redis://:pw@h:6379/1",
                    "/mnt/jfs",
                    "-d"
                ],
                None
            )
            .unwrap(),
            "redis://:pw@h:6379/1"
        );
        assert_eq!(
            url(
                &["juicefs", "mount", "sqlite3://m.db", "/mnt/jfs"],
                Some("/var/lib/j")
            )
            .unwrap(),
            "sqlite3:///var/lib/j/m.db"
        );
        assert_eq!(
            url(
                &["/usr/bin/juicefs", "mount", "sqlite3://m.db", "jfs"],
                Some("/mnt")
            )
            .unwrap(),
            "sqlite3:///mnt/m.db"
        );
        assert!(
            url(&["juicefs", "mount", "localhost", "/mnt/jfs"], None)
                .unwrap_err()
                .contains("no metadata URL")
        );
        assert!(
            url(&["juicefs", "mount", "redis://h/1", "/mnt/other"], None)
                .unwrap_err()
                .contains("does not mount")
        );
        assert!(
            url(&["bash", "-c", "x"], None)
                .unwrap_err()
                .contains("not a `juicefs mount`")
        );
    }

    #[test]
    fn a_missing_or_foreign_directory_is_a_clear_error() {
        let err = |p: &str| {
            find(Path::new(p), Path::new("/nonexistent"))
                .unwrap_err()
                .to_string()
        };
        assert!(err("/nonexistent-sluice-dir").contains("no such directory"));
        let dir = tempfile::tempdir().unwrap();
        let e = err(dir.path().to_str().unwrap());
        assert!(e.contains("not in a sluice or JuiceFS mount"), "{e}");
        assert!(e.contains("virtiofsd"), "{e}");
    }
}
