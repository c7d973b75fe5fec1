//! The name service's files. glibc's `getaddrinfo` reads them for every
//! connection the daemon makes to a Redis or S3 host given by name, from
//! inside the sandbox, and reads them again whenever they change. The
//! system changes them by *replacing* them: a new file written beside the
//! old one and renamed over it (DHCP clients, NetworkManager and
//! systemd-resolved rewrite `resolv.conf` so; `sed -i` and most editors
//! `hosts`). A Landlock rule on a file holds the file it was at start (its
//! inode), so the new one would be refused, and glibc, refused, falls back
//! without a word to its defaults (no hosts file, a name server on
//! 127.0.0.1): names would stop resolving hours after start, at the next
//! DHCP renewal. The rules therefore name the directories the files are
//! replaced in.

use std::path::{Path, PathBuf};

use super::user::is_shared;

/// What glibc's resolver reads (`nsswitch.conf`'s `files` and `dns`
/// sources), at the paths compiled into it.
const FILES: &[&str] = &[
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/host.conf",
    "/etc/services",
];

/// What Landlock must let the daemon read so that it sees the name
/// service's files as the system replaces them: for each, the directory
/// its real file is in (`/etc/resolv.conf` is often a link to
/// systemd-resolved's `/run/systemd/resolve/stub-resolv.conf`, replaced
/// there). That is `/etc` itself when the daemon runs as a user other than
/// root, whose permissions keep it out of root's files there
/// (`/etc/shadow`); as root, only the files, which the daemon then reads as
/// they were at start (a missing one not at all). In any other directory
/// the system shares, only the file.
pub fn paths(as_root: bool) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for file in FILES {
        let place = replaced_in(Path::new(file), as_root);
        if !out.contains(&place) {
            out.push(place);
        }
    }
    out
}

/// Where the system replaces `file` (see [`paths`]).
fn replaced_in(file: &Path, as_root: bool) -> PathBuf {
    let real = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
    let Some(dir) = real.parent() else {
        return real;
    };
    if dir == Path::new("/etc") {
        if as_root { real } else { dir.to_owned() }
    } else if is_shared(dir).unwrap_or(true) {
        real
    } else {
        dir.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_file_is_allowed_through_the_directory_it_is_replaced_in() {
        let real = tempfile::tempdir().unwrap();
        std::fs::set_permissions(real.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let real_dir = std::fs::canonicalize(real.path()).unwrap();
        let stub = real_dir.join("stub-resolv.conf");
        std::fs::write(&stub, b"nameserver 127.0.0.53\n").unwrap();
        let links = tempfile::tempdir().unwrap();
        let link = links.path().join("resolv.conf");
        std::os::unix::fs::symlink(&stub, &link).unwrap();
        // A link into a directory of its own: that directory, as root too.
        assert_eq!(replaced_in(&link, true), real_dir);
        assert_eq!(replaced_in(&link, false), real_dir);
        // In /etc: /etc for a user other than root; for root the file
        // alone.
        let hosts = Path::new("/etc/hosts");
        if std::fs::canonicalize(hosts).is_ok_and(|r| r == hosts) {
            assert_eq!(replaced_in(hosts, false), Path::new("/etc"));
            assert_eq!(replaced_in(hosts, true), hosts);
        }
        // A directory the system shares gives only the file.
        std::fs::set_permissions(real.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(replaced_in(&link, false), stub);
        let in_tmp = Path::new("/tmp/sluice-no-such-resolv.conf");
        assert_eq!(replaced_in(in_tmp, false), in_tmp);
    }
}
