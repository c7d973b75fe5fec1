//! The `/dev/fuse` device: opening it, mounting with `mount(2)`, cloning
//! per-worker files (`FUSE_DEV_IOC_CLONE`), reading requests, writing
//! replies, and unmounting.
//!
//! Mounting calls `mount(2)` directly (as root, or with `CAP_SYS_ADMIN`);
//! no `fusermount` helper is involved. The mount is `fuse.sluice` with
//! `allow_other` (a training job's processes run as many users) and, by
//! default, *without* `default_permissions`: the engine checks permissions
//! itself against the caller's credentials, as JuiceFS's metadata engine
//! does, so the host mount and the virtio-fs guests (where the host kernel
//! checks nothing) see exactly the same rules from one implementation.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::abi::FUSE_DEV_IOC_CLONE;
use crate::reply::ReplyHead;

/// The FUSE character device.
pub const DEV_FUSE: &str = "/dev/fuse";

/// Errors of the `/dev/fuse` transport.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// `/dev/fuse` could not be opened.
    #[error("cannot open /dev/fuse (is the fuse module loaded?): {0}")]
    Open(#[source] io::Error),
    /// The mount point is missing or unusable.
    #[error("the mount point {path} is not usable: {source}")]
    MountPoint {
        /// The mount point.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// A path contains a NUL byte.
    #[error("the path {0} contains a NUL byte")]
    NulInPath(PathBuf),
    /// An option string contains a NUL byte or a comma.
    #[error("the mount option value {0:?} contains a NUL byte or a comma")]
    BadOption(String),
    /// `mount(2)` failed.
    #[error("mounting {path} failed (mounting needs root or CAP_SYS_ADMIN): {source}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// `umount2(2)` failed.
    #[error("unmounting {path} failed: {source}")]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// `FUSE_DEV_IOC_CLONE` failed.
    #[error("cloning the /dev/fuse connection for a worker failed: {0}")]
    Clone(#[source] io::Error),
    /// Reading a request failed.
    #[error("reading a request from /dev/fuse failed: {0}")]
    Read(#[source] io::Error),
    /// Writing a reply failed.
    #[error("writing a reply to /dev/fuse failed: {0}")]
    Write(#[source] io::Error),
    /// A worker thread could not be started.
    #[error("starting a FUSE worker thread failed: {0}")]
    Spawn(#[source] io::Error),
    /// A worker thread panicked.
    #[error("a FUSE worker thread panicked")]
    WorkerPanicked,
}

/// How to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// The source shown in `/proc/mounts` (`fsname`).
    pub fsname: String,
    /// The type suffix: the file system type is `fuse.<subtype>`.
    pub subtype: String,
    /// Let users other than the mounter in (`allow_other`).
    pub allow_other: bool,
    /// Let the kernel check permissions from the mode bits before asking
    /// the engine (`default_permissions`). Off by default: the engine checks.
    pub default_permissions: bool,
    /// Mount read-only.
    pub read_only: bool,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            fsname: "sluice".to_owned(),
            subtype: "sluice".to_owned(),
            allow_other: true,
            default_permissions: false,
            read_only: false,
        }
    }
}

/// A mounted FUSE file system: the `/dev/fuse` file of its connection and
/// its mount point. Dropping it closes the file, which aborts the
/// connection (the mount point then reports ENOTCONN until unmounted).
#[derive(Debug)]
pub struct Mount {
    fd: OwnedFd,
    path: PathBuf,
}

impl Mount {
    /// The connection's `/dev/fuse` file.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Splits the mount into its file and path.
    pub fn into_parts(self) -> (OwnedFd, PathBuf) {
        (self.fd, self.path)
    }
}

fn cstring(path: &Path) -> Result<CString, DevError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| DevError::NulInPath(path.to_owned()))
}

fn open_dev() -> Result<OwnedFd, DevError> {
    // std opens with O_CLOEXEC.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(DEV_FUSE)
        .map_err(DevError::Open)?;
    Ok(OwnedFd::from(f))
}

/// The `data` string passed to `mount(2)`.
fn mount_data(
    fd: i32,
    root_mode: u32,
    uid: u32,
    gid: u32,
    opts: &MountOptions,
) -> Result<String, DevError> {
    let mut data = format!("fd={fd},rootmode={root_mode:o},user_id={uid},group_id={gid}");
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    if opts.default_permissions {
        data.push_str(",default_permissions");
    }
    for v in [&opts.fsname, &opts.subtype] {
        if v.contains(',') || v.contains('\0') || v.is_empty() {
            return Err(DevError::BadOption(v.clone()));
        }
    }
    Ok(data)
}

/// Opens `/dev/fuse` and mounts a FUSE file system on `path` (an existing
/// directory). Needs root or `CAP_SYS_ADMIN`.
pub fn mount(path: &Path, opts: &MountOptions) -> Result<Mount, DevError> {
    let meta = std::fs::metadata(path).map_err(|source| DevError::MountPoint {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(DevError::MountPoint {
            path: path.to_owned(),
            source: io::Error::from_raw_os_error(libc::ENOTDIR),
        });
    }
    let fd = open_dev()?;
    // SAFETY: getuid and getgid only read the caller's credentials.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = mount_data(fd.as_raw_fd(), libc::S_IFDIR, uid, gid, opts)?;
    let target = cstring(path)?;
    let source =
        CString::new(opts.fsname.as_str()).map_err(|_| DevError::BadOption(opts.fsname.clone()))?;
    let fstype = CString::new(format!("fuse.{}", opts.subtype))
        .map_err(|_| DevError::BadOption(opts.subtype.clone()))?;
    let data = CString::new(data).map_err(|e| DevError::BadOption(e.to_string()))?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if opts.read_only {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: every pointer is a NUL-terminated string that lives across
    // the call; mount(2) only reads them.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(DevError::Mount {
            path: path.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(Mount {
        fd,
        path: path.to_owned(),
    })
}

/// Unmounts `path`; if it is busy, detaches it lazily (`MNT_DETACH`) so it
/// disappears from the namespace now and goes away when the last user
/// leaves.
pub fn unmount(path: &Path) -> Result<(), DevError> {
    let target = cstring(path)?;
    // SAFETY: `target` is a NUL-terminated string alive across the call.
    let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EBUSY) {
        return Err(DevError::Unmount {
            path: path.to_owned(),
            source: err,
        });
    }
    // SAFETY: as above.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    if rc == 0 {
        Ok(())
    } else {
        Err(DevError::Unmount {
            path: path.to_owned(),
            source: io::Error::last_os_error(),
        })
    }
}

/// Sets how far the kernel reads ahead of sequential readers of the mount
/// at `path`, in KiB (its backing device's `read_ahead_kb` in sysfs).
///
/// A FUSE mount starts with the kernel's default of 128 KiB, and the INIT
/// reply can only lower it. With 128 KiB a reader's 1 MiB `read` waits
/// for each FUSE round trip in turn; a window of a few MiB keeps several
/// 1 MiB requests in flight. Call it after the session has answered INIT
/// (the kernel sets the window while it handles INIT's reply); the `stat`
/// of the mount point here waits for INIT.
pub fn set_kernel_readahead(path: &Path, kib: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    std::fs::write(&knob, format!("{kib}\n"))
        .map_err(|e| io::Error::new(e.kind(), format!("{knob}: {e}")))
}

/// Opens a new `/dev/fuse` file attached to the same connection as `fd`,
/// so a worker thread can read requests and write replies on its own file
/// (the kernel then spreads requests over the files' queues).
pub fn clone_fd(fd: BorrowedFd<'_>) -> Result<OwnedFd, DevError> {
    let new = open_dev()?;
    let mut master: u32 = fd.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the source fd number) from
    // the pointer, which points at a live local; `new` is an open fd.
    let rc = unsafe { libc::ioctl(new.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &mut master) };
    if rc != 0 {
        return Err(DevError::Clone(io::Error::last_os_error()));
    }
    Ok(new)
}

/// Reads one request into `buf`; the kernel delivers exactly one whole
/// message per read.
pub fn read_request(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Writes one reply as a single `writev` (the kernel requires each reply
/// in one write): the head, then the payload from where it lies.
pub fn write_reply(fd: BorrowedFd<'_>, head: &ReplyHead, payload: &[u8]) -> io::Result<()> {
    let head = head.as_bytes();
    let iov = [
        libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        },
    ];
    let count = if payload.is_empty() { 1 } else { 2 };
    // SAFETY: both iovecs describe live, initialised slices that outlive the
    // call; writev only reads them.
    let n = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), count) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let want = head.len() + payload.len();
    if n as usize != want {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short reply write: {n} of {want} bytes"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_data_string() {
        let opts = MountOptions::default();
        let d = mount_data(7, libc::S_IFDIR, 0, 0, &opts).unwrap();
        assert_eq!(d, "fd=7,rootmode=40000,user_id=0,group_id=0,allow_other");
        let opts = MountOptions {
            allow_other: false,
            default_permissions: true,
            ..MountOptions::default()
        };
        let d = mount_data(3, libc::S_IFDIR, 1000, 100, &opts).unwrap();
        assert_eq!(
            d,
            "fd=3,rootmode=40000,user_id=1000,group_id=100,default_permissions"
        );
        let bad = MountOptions {
            fsname: "a,b".into(),
            ..MountOptions::default()
        };
        assert!(matches!(
            mount_data(3, libc::S_IFDIR, 0, 0, &bad),
            Err(DevError::BadOption(_))
        ));
    }

    #[test]
    fn mount_point_must_exist() {
        let e = mount(
            Path::new("/nonexistent/sluice-mnt"),
            &MountOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(e, DevError::MountPoint { .. }), "{e}");
    }

    #[test]
    fn write_reply_sends_head_and_payload_in_one_message() {
        // A pipe stands in for /dev/fuse: one writev, all bytes in order.
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: pipe just returned these descriptors and nothing else owns them.
        let (r, w) = unsafe {
            use std::os::fd::FromRawFd;
            (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
        };
        use std::os::fd::AsFd;
        let head = ReplyHead::data(9, 5);
        write_reply(w.as_fd(), &head, b"hello").unwrap();
        let mut buf = [0u8; 64];
        let n = read_request(r.as_fd(), &mut buf).unwrap();
        assert_eq!(n, 21);
        assert_eq!(&buf[..16], head.as_bytes());
        assert_eq!(&buf[16..21], b"hello");
    }
}
