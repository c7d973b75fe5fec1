//! The system's TLS roots, which the Redis client reads again for every new
//! `rediss://` connection: the `redis` crate builds its rustls configuration
//! per connection with `rustls-native-certs`, and fails the connection when
//! any file there cannot be read. Connections are made once the sandbox is
//! in place (the pool grows, Redis drops connections or restarts), so the
//! sandbox allows every place those roots come from and, once set up,
//! loads them the way the client will to prove it.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::user::SHARED_DIRS;

/// Where `update-ca-certificates` (Debian, Ubuntu, Alpine) takes an
/// administrator's own CAs from, to link each into `/etc/ssl/certs`.
const LOCAL_CAS: &str = "/usr/local/share/ca-certificates";

/// What Landlock must let the daemon read for the roots: the bundle file
/// and certificate directories OpenSSL's probe finds (`SSL_CERT_FILE`,
/// `SSL_CERT_DIR`, then the distribution's places), and the directories
/// their links point into (`update-ca-certificates` links
/// `/usr/local/share/ca-certificates/*.crt` into `/etc/ssl/certs`). A
/// whole directory, so a certificate added there later stays readable;
/// only the file where that directory is one the system shares (`/etc`).
/// And [`LOCAL_CAS`] whether or not a link points there at start: a CA
/// installed there while the daemon serves is linked into the directories
/// above, and one file the client cannot read fails every connection.
pub fn paths() -> Vec<PathBuf> {
    let probe = openssl_probe::probe();
    let mut out: Vec<PathBuf> = Vec::new();
    let mut add = |p: PathBuf| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    if let Some(file) = probe.cert_file {
        add(link_target(&file).unwrap_or(file));
    }
    for dir in probe.cert_dir {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            entries
                .flatten()
                .filter_map(|e| link_target(&e.path()))
                .for_each(&mut add);
        }
        add(dir);
    }
    add(PathBuf::from(LOCAL_CAS));
    out
}

/// For a link (or a path through one): the directory its target is in, or
/// the target itself in a directory the system shares. `None` for a path
/// that is its own target, or a dangling link.
fn link_target(path: &Path) -> Option<PathBuf> {
    let target = std::fs::canonicalize(path).ok()?;
    if target == path {
        return None;
    }
    match target.parent() {
        Some(dir) if !SHARED_DIRS.iter().any(|d| Path::new(d) == dir) => Some(dir.to_owned()),
        _ => Some(target),
    }
}

/// Loads the roots as the Redis client will, from inside the finished
/// sandbox: what fails here would fail every connection made from now on,
/// so serve stops with the reason instead.
pub fn check() -> anyhow::Result<()> {
    let loaded = rustls_native_certs::load_native_certs();
    if let Some(e) = loaded.errors.first() {
        bail!(
            "the Redis TLS client cannot read the system's TLS roots inside the sandbox ({e}), \
             and it reads them for every new connection; make them readable by the user \
             sluice serve runs as (--user; SSL_CERT_FILE and SSL_CERT_DIR say where they are)"
        );
    }
    log::info!(
        "the Redis TLS client reads {} system TLS roots inside the sandbox",
        loaded.certs.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_allows_its_targets_directory_and_a_file_itself_nothing_more() {
        let store = tempfile::tempdir().unwrap();
        let links = tempfile::tempdir().unwrap();
        let store_dir = std::fs::canonicalize(store.path()).unwrap();
        let cert = store_dir.join("ca.crt");
        std::fs::write(&cert, b"").unwrap();
        let link = links.path().join("ca.pem");
        std::os::unix::fs::symlink(&cert, &link).unwrap();
        assert_eq!(link_target(&link), Some(store_dir));
        assert_eq!(link_target(&cert), None);
        let dangling = links.path().join("gone.pem");
        std::os::unix::fs::symlink(store.path().join("gone.crt"), &dangling).unwrap();
        assert_eq!(link_target(&dangling), None);
    }
}
