//! Where a host daemon says it serves a volume, so that a server started
//! with virtiofsd's command line (which has no `--host`) finds it.
//!
//! `sluice host` makes `/run/sluice/hosts/UUID` (the volume's UUID), a
//! symbolic link to its `--control` socket, and removes it when it ends
//! (the socket-cleanup helper, like its sockets). The virtiofsd drop-in
//! looks there for the volume it serves and attaches as `serve --host`
//! would. The directory is trusted only as root's (or this user's) and
//! writable by nobody else, and so is the link: whoever could plant one
//! could feed blocks to every VM of the volume.
//!
//! `SLUICE_HOST_REGISTRY` names another directory (tests; several daemons
//! in one test host).

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// The directory of the links.
pub const DEFAULT_DIR: &str = "/run/sluice/hosts";

/// The directory of the links: `SLUICE_HOST_REGISTRY`, else [`DEFAULT_DIR`].
pub fn dir() -> PathBuf {
    std::env::var_os("SLUICE_HOST_REGISTRY")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from)
}

/// Why `meta` (a directory's or a link's) may not be trusted; None when it
/// may: owned by root or by this process's user, writable by no one else.
fn untrusted(meta: &std::fs::Metadata, what: &Path) -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Some(format!(
            "{} belongs to uid {}, neither root nor this user ({me})",
            what.display(),
            meta.uid()
        ));
    }
    if meta.is_dir() && meta.permissions().mode() & 0o022 != 0 {
        return Some(format!(
            "{} is writable by its group or others (mode {:o})",
            what.display(),
            meta.permissions().mode() & 0o7777
        ));
    }
    None
}

/// Says that the host daemon of volume `uuid` listens on `control`: makes
/// the link (replacing one a daemon that died left behind) and returns its
/// path, for removal at exit.
pub fn advertise(uuid: &str, control: &Path) -> anyhow::Result<PathBuf> {
    if uuid.is_empty() || uuid.contains(['/', '\0']) || uuid.starts_with('.') {
        bail!("the volume's UUID {uuid:?} cannot name a file");
    }
    let dir = dir();
    if !dir.exists() {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
    }
    let meta = std::fs::symlink_metadata(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    if let Some(why) = untrusted(&meta, &dir) {
        bail!("{why}: the virtiofsd drop-in would not trust it");
    }
    let control = std::path::absolute(control)
        .with_context(|| format!("cannot make {} absolute", control.display()))?;
    let link = dir.join(uuid);
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {
            if let Ok(old) = std::fs::read_link(&link)
                && old != control
            {
                log::warn!(
                    "{} named {} (a host daemon that did not end cleanly?); now {}",
                    link.display(),
                    old.display(),
                    control.display()
                );
            }
            std::fs::remove_file(&link)
                .with_context(|| format!("cannot replace {}", link.display()))?;
        }
        Ok(_) => bail!("{} exists and is not a link", link.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", link.display())),
    }
    std::os::unix::fs::symlink(&control, &link)
        .with_context(|| format!("cannot make {}", link.display()))?;
    Ok(link)
}

/// The control socket of the host daemon serving volume `uuid` here, if
/// one says so (and the registry may be trusted); why not, otherwise.
pub fn find(uuid: &str) -> Result<PathBuf, String> {
    if uuid.is_empty() || uuid.contains(['/', '\0']) || uuid.starts_with('.') {
        return Err(format!("the volume's UUID {uuid:?} cannot name a file"));
    }
    let dir = dir();
    let meta =
        std::fs::symlink_metadata(&dir).map_err(|e| format!("no {} ({e})", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if let Some(why) = untrusted(&meta, &dir) {
        return Err(why);
    }
    let link = dir.join(uuid);
    let meta = std::fs::symlink_metadata(&link)
        .map_err(|e| format!("no host daemon of this volume ({}: {e})", link.display()))?;
    if !meta.file_type().is_symlink() {
        return Err(format!("{} is not a link", link.display()));
    }
    if let Some(why) = untrusted(&meta, &link) {
        return Err(why);
    }
    let target = std::fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
    match std::fs::metadata(&target) {
        Ok(m) if m.file_type().is_socket() => Ok(target),
        Ok(_) => Err(format!(
            "{} names {}, not a socket",
            link.display(),
            target.display()
        )),
        Err(e) => Err(format!(
            "{} names {}, which is gone ({e}): its host daemon ended",
            link.display(),
            target.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test: the registry directory comes from the environment.
    #[test]
    fn a_host_daemon_is_found_by_its_volume_and_only_in_a_trusted_place() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = tmp.path().join("hosts");
        // SAFETY: the only test of this binary that reads the variable.
        unsafe { std::env::set_var("SLUICE_HOST_REGISTRY", &reg) };
        let control = tmp.path().join("host.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&control).unwrap();

        assert!(find("u-1").unwrap_err().contains("no "), "no registry yet");
        let link = advertise("u-1", &control).unwrap();
        assert_eq!(link, reg.join("u-1"));
        assert_eq!(find("u-1").unwrap(), control);
        assert!(find("u-2").is_err(), "another volume has no host daemon");
        // Replaced by a new daemon's.
        let again = tmp.path().join("again.sock");
        let _l2 = std::os::unix::net::UnixListener::bind(&again).unwrap();
        advertise("u-1", &again).unwrap();
        assert_eq!(find("u-1").unwrap(), again);

        // A link to something that is not a socket, or to nothing.
        std::fs::remove_file(&again).unwrap();
        assert!(find("u-1").unwrap_err().contains("gone"));
        std::fs::write(&again, b"x").unwrap();
        assert!(find("u-1").unwrap_err().contains("not a socket"));

        // A registry others may write is not trusted.
        std::fs::set_permissions(&reg, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(find("u-1").unwrap_err().contains("writable"));
        assert!(advertise("u-1", &control).is_err());
        std::fs::set_permissions(&reg, std::fs::Permissions::from_mode(0o755)).unwrap();

        for bad in ["", "../x", "a/b", ".hidden"] {
            assert!(find(bad).is_err(), "{bad:?}");
            assert!(advertise(bad, &control).is_err(), "{bad:?}");
        }
        // SAFETY: as above.
        unsafe { std::env::remove_var("SLUICE_HOST_REGISTRY") };
    }
}
