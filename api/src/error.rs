//! The error type of file-system operations. Every error one can return is
//! one variant here; the FUSE layer maps them to errno values in one place
//! (`Error::errno`).

use std::io;

/// Result alias for engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error from the engine. Each message is a sentence a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// The name already exists.
    #[error("file exists")]
    Exists,
    /// A path component is not a directory.
    #[error("not a directory")]
    NotDir,
    /// The operation needs a non-directory.
    #[error("is a directory")]
    IsDir,
    /// The directory still has entries.
    #[error("directory not empty")]
    NotEmpty,
    /// The caller lacks the permission (EACCES).
    #[error("permission denied")]
    Access,
    /// The operation is not permitted for this caller (EPERM).
    #[error("operation not permitted")]
    Perm,
    /// An argument is invalid.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A name is longer than 255 bytes.
    #[error("file name too long")]
    NameTooLong,
    /// The extended attribute does not exist.
    #[error("no such extended attribute")]
    NoXattr,
    /// A caller's buffer is too small for the value.
    #[error("result does not fit the buffer")]
    Range,
    /// A file would grow beyond the largest size the format can hold.
    #[error("file too large")]
    FileTooBig,
    /// No space: the volume's capacity or inode limit (`Capacity`,
    /// `Inodes`) would be passed, or a node's attribute list is full.
    #[error("no space left on the volume")]
    NoSpace,
    /// A directory quota would be passed.
    #[error("a directory quota is exceeded")]
    QuotaExceeded,
    /// A rename across volumes or exports.
    #[error("cross-device link")]
    CrossDevice,
    /// The volume is mounted read-only.
    #[error("read-only file system")]
    ReadOnly,
    /// The operation is not supported by this engine or volume.
    #[error("operation not supported: {0}")]
    NotSupported(String),
    /// The file handle is unknown or closed.
    #[error("bad file handle")]
    BadHandle,
    /// A node id that named a file no longer does: the file was deleted,
    /// or (in an export) it is out of the client's reach. What a decoded
    /// NFS / `open_by_handle_at` handle of a deleted file must answer.
    #[error("the file this handle named no longer exists")]
    Stale,
    /// One of the limits a client (a guest) is held to was reached; the
    /// request did nothing.
    #[error("{0}")]
    Limit(Limit),
    /// The stored data failed its integrity check or could not be read.
    #[error("data integrity or I/O failure: {0}")]
    Corrupt(String),
    /// The metadata engine failed (connection, SQL, schema).
    #[error("metadata engine failure: {0}")]
    Meta(String),
    /// The object store failed.
    #[error("object store failure on {key}: {source}")]
    Object {
        /// The object key involved.
        key: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// Writes to this file could not be stored since the handle last
    /// reported an error (sticky write errors: fsync and close say so once
    /// per handle).
    #[error("writes to inode {0} could not be stored")]
    WriteBack(u64),
    /// Any other I/O error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The operation would have to wait, and the calling thread marked
    /// itself as one that must not ([`crate::wait`]); nothing was done that
    /// running it again would repeat. Transports run it again on a thread
    /// that may wait; it never reaches a client.
    #[error("the operation would wait on a thread that must not")]
    WouldBlock,
}

impl Error {
    /// The errno a FUSE reply carries for this error. This is the one place
    /// where engine errors become errno values.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::Access => libc::EACCES,
            Error::Perm => libc::EPERM,
            Error::Invalid(_) => libc::EINVAL,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::NoXattr => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::FileTooBig => libc::EFBIG,
            Error::NoSpace => libc::ENOSPC,
            Error::QuotaExceeded => libc::EDQUOT,
            Error::CrossDevice => libc::EXDEV,
            Error::ReadOnly => libc::EROFS,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::BadHandle => libc::EBADF,
            Error::Stale => libc::ESTALE,
            Error::Limit(l) => l.errno(),
            Error::Corrupt(_) | Error::Meta(_) | Error::Object { .. } | Error::WriteBack(_) => {
                libc::EIO
            }
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::WouldBlock => libc::EAGAIN,
        }
    }
}

/// The limits a client of the file system (one guest VM, one mount) is held
/// to, so one client cannot take the daemon's memory or the volume's
/// metadata engine for itself. Each names the flag that sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Open file and directory handles (`--max-handles`): ENFILE.
    Handles(u64),
    /// Node ids the client holds (`--max-nodes`): ENFILE.
    Nodes(u64),
    /// Directory entries held in the snapshots of open directory handles
    /// (`--max-dir-entries`): ENOMEM, as a directory read that cannot get
    /// its memory.
    DirEntries(u64),
    /// The size of one extended attribute value (`--max-xattr-size`):
    /// E2BIG, as Linux answers a value past its own limit.
    XattrSize(u64),
}

impl Limit {
    /// The errno a request that hit this limit answers.
    pub fn errno(&self) -> i32 {
        match self {
            Limit::Handles(_) | Limit::Nodes(_) => libc::ENFILE,
            Limit::DirEntries(_) => libc::ENOMEM,
            Limit::XattrSize(_) => libc::E2BIG,
        }
    }

    /// The flag that sets this limit.
    pub fn flag(&self) -> &'static str {
        match self {
            Limit::Handles(_) => "--max-handles",
            Limit::Nodes(_) => "--max-nodes",
            Limit::DirEntries(_) => "--max-dir-entries",
            Limit::XattrSize(_) => "--max-xattr-size",
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, n) = match self {
            Limit::Handles(n) => ("open handles", n),
            Limit::Nodes(n) => ("node ids held", n),
            Limit::DirEntries(n) => ("directory entries held by open listings", n),
            Limit::XattrSize(n) => ("bytes in one extended attribute value", n),
        };
        write!(
            f,
            "the client reached its limit of {n} {what} ({})",
            self.flag()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_answers_the_errno_linux_would() {
        assert_eq!(Error::NotFound.errno(), libc::ENOENT);
        assert_eq!(Error::NoXattr.errno(), libc::ENODATA);
        assert_eq!(Error::QuotaExceeded.errno(), libc::EDQUOT);
        assert_eq!(Error::Stale.errno(), libc::ESTALE);
        assert_eq!(Error::Meta("down".into()).errno(), libc::EIO);
        assert_eq!(Error::WriteBack(7).errno(), libc::EIO);
        // An I/O error keeps its own errno; one without an errno is EIO.
        let raw = io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(Error::Io(raw).errno(), libc::ENOSPC);
        assert_eq!(Error::Io(io::Error::other("x")).errno(), libc::EIO);
    }

    #[test]
    fn a_limit_names_its_flag_and_answers_its_errno() {
        let l = Limit::Nodes(10);
        assert_eq!(Error::Limit(l).errno(), libc::ENFILE);
        assert_eq!(Limit::DirEntries(1).errno(), libc::ENOMEM);
        assert_eq!(Limit::XattrSize(1).errno(), libc::E2BIG);
        let msg = Error::Limit(l).to_string();
        assert!(msg.contains("--max-nodes") && msg.contains("10"), "{msg}");
    }
}
