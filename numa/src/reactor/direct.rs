//! Opening files for O_DIRECT and learning their alignment rules.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Alignment assumed when the kernel does not report one (STATX_DIOALIGN needs Linux 6.1).
pub const DEFAULT_DIRECT_ALIGN: u32 = 512;

/// A file could not be opened for O_DIRECT.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    /// The file system refuses O_DIRECT.
    #[error(
        "the file system holding {path} does not support O_DIRECT (tmpfs does not); put the \
         cache on a disk file system such as ext4 or xfs"
    )]
    Unsupported {
        /// The file.
        path: PathBuf,
    },
    /// Any other open error.
    #[error("cannot open {path} for O_DIRECT: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// How a file opened for direct I/O must be addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectAlign {
    /// Required alignment of the memory address.
    pub memory: u32,
    /// Required alignment of file offsets and lengths.
    pub offset: u32,
}

/// Opens `path` with O_DIRECT for reading, or reading and writing (creating it) when `write`.
/// A file it creates is the owner's only (mode 0600, less what the umask removes): what goes
/// through direct I/O here is cached file data.
pub fn open_direct(path: &Path, write: bool) -> Result<File, DirectError> {
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_DIRECT);
    if write {
        options.write(true).create(true).truncate(false).mode(0o600);
    }
    options
        .open(path)
        .map_err(|source| open_error(path, source))
}

/// EINVAL from open(O_DIRECT) means the file system refuses direct I/O (tmpfs before 6.6,
/// some FUSE and network file systems).
fn open_error(path: &Path, source: io::Error) -> DirectError {
    if source.raw_os_error() == Some(libc::EINVAL) {
        DirectError::Unsupported {
            path: path.to_path_buf(),
        }
    } else {
        DirectError::Open {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Whether `file` was opened with O_DIRECT.
pub fn is_direct(file: &File) -> bool {
    // SAFETY: F_GETFL on a live descriptor has no memory effects.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_DIRECT != 0
}

/// The direct-I/O alignment the kernel reports for `file`, or 512-byte defaults.
pub fn direct_align(file: &File) -> DirectAlign {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is an empty C string with AT_EMPTY_PATH on a live descriptor, and stx is
    // writable.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align != 0 {
        DirectAlign {
            memory: stx.stx_dio_mem_align.max(1),
            offset: stx.stx_dio_offset_align,
        }
    } else {
        DirectAlign {
            memory: DEFAULT_DIRECT_ALIGN,
            offset: DEFAULT_DIRECT_ALIGN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn einval_from_open_names_the_file_system_problem() {
        let err = open_error(
            Path::new("/dev/shm/x"),
            io::Error::from_raw_os_error(libc::EINVAL),
        );
        assert!(matches!(err, DirectError::Unsupported { .. }));
        assert!(
            err.to_string().contains("does not support O_DIRECT"),
            "{err}"
        );
        let err = open_direct(Path::new("/nonexistent/x"), false).unwrap_err();
        assert!(matches!(err, DirectError::Open { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/x"), "{err}");
    }
}
