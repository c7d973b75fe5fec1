//! Unix sockets created with their final owner group and mode.
//!
//! `bind(2)` creates the socket file with mode `0777 & ~umask`, and a
//! `chmod` by path afterwards leaves a window in which anyone may connect,
//! and follows a symbolic link an attacker put in place of the socket. The
//! umask is process-wide, so changing it around `bind` races every other
//! thread that creates files. Instead the socket is bound inside a fresh
//! directory only this process can enter (mode 0700), given its group and
//! mode there, and renamed onto its path: `rename(2)` replaces a stale
//! socket (or a link planted there) without following it, and the socket is
//! never reachable with another mode. No crate does this, hence this file.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// Binds a listening socket at `path`, mode 0600, or 0660 owned by group
/// `group` when one is given; a socket or file already at `path` is
/// replaced.
pub fn bind_private(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    bind_private_with(path, group, |tmp| UnixListener::bind(tmp))
}

/// [`bind_private`] for any kind of socket: `bind` binds one at the path
/// it is given (in the private directory) and returns it.
pub fn bind_private_with<T>(
    path: &Path,
    group: Option<u32>,
    bind: impl FnOnce(&Path) -> io::Result<T>,
) -> io::Result<T> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let private = private_dir(&parent, name.as_bytes())?;
    let result = bind_in(&private, path, group, bind);
    let _ = std::fs::remove_dir(&private);
    result
}

fn bind_in<T>(
    private: &Path,
    path: &Path,
    group: Option<u32>,
    bind: impl FnOnce(&Path) -> io::Result<T>,
) -> io::Result<T> {
    let tmp = private.join("s");
    let listener = bind(&tmp)?;
    let placed = (|| {
        let mode = match group {
            Some(gid) => {
                std::os::unix::fs::lchown(&tmp, None, Some(gid))?;
                0o660
            }
            None => 0o600,
        };
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// A new directory next to the socket (the rename must stay on one file
/// system), mode 0700.
fn private_dir(parent: &Path, name: &[u8]) -> io::Result<PathBuf> {
    let pid = std::process::id();
    let stem = String::from_utf8_lossy(name);
    let mut last = None;
    for n in 0..100u32 {
        let dir = parent.join(format!(".{stem}.{pid}.{n}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no private directory")))
}

/// The group id `name` names: a group name, or a number.
pub fn group_id(name: &str) -> io::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let c = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a group name with NUL"))?;
    // SAFETY: `group` is plain data (integers and pointers); all zeros is a
    // valid value, overwritten by getgrnam_r.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives `grp`'s
    // use, which is reading `gr_gid` right after.
    let r = unsafe {
        libc::getgrnam_r(
            c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    if found.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no group named {name:?}"),
        ));
    }
    Ok(grp.gr_gid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn sockets_are_born_private_and_replace_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.sock");
        // A link planted where the socket goes must be replaced, not followed.
        let target = dir.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let l = bind_private(&path, None).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        drop(l);
        // Again over the stale socket, with a group.
        let gid = group_id("0").unwrap();
        let _l = bind_private(&path, Some(gid)).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, gid));
        // Nothing is left behind but the socket and the file.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn groups_resolve_by_name_or_number() {
        assert_eq!(group_id("root").unwrap(), 0);
        assert_eq!(group_id("1234").unwrap(), 1234);
        assert!(group_id("no-such-group-sluice").is_err());
    }
}
