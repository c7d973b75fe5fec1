//! The destination-neutral form of a read: a walk over [`Fragment`]s (a
//! stretch of zeros, bytes of a cached block, or a range of a local file),
//! so each transport lands the bytes where it wants them — a plain buffer
//! for the host mount, guest memory for virtio-fs — with one copy.

use crate::error::{Error, Result};

/// One stretch of the bytes a read returns.
#[derive(Debug)]
pub enum Fragment<'a> {
    /// This many zero bytes (a hole).
    Zeros(usize),
    /// Bytes of a block.
    Data(&'a [u8]),
    /// `len` bytes at offset `off` of a local file (an object of a `file://`
    /// store): the consumer reads them straight into its destination (guest
    /// memory, for virtio-fs), so they are copied once, by the kernel.
    File {
        /// The open object file.
        file: &'a std::fs::File,
        /// Where the bytes start in it.
        off: u64,
        /// How many bytes.
        len: usize,
    },
}

impl Fragment<'_> {
    /// How many bytes the fragment stands for.
    pub fn len(&self) -> usize {
        match self {
            Fragment::Zeros(n) => *n,
            Fragment::Data(d) => d.len(),
            Fragment::File { len, .. } => *len,
        }
    }

    /// Whether the fragment is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads exactly `dst.len()` bytes of `file` at `off` (a local object read
/// in part); a short object is corrupt. On a thread that must not wait
/// ([`crate::wait::no_wait`]) it reads only what the page cache holds
/// (RWF_NOWAIT) and fails with [`Error::WouldBlock`] where the disk would
/// be read.
pub fn read_file_exact(file: &std::fs::File, off: u64, dst: &mut [u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    if crate::wait::mode() == crate::wait::Mode::NoWait {
        return read_cached_exact(file, off, dst);
    }
    file.read_exact_at(dst, off)
        .map_err(|e| short_or_io(e, off, dst.len()))
}

/// [`read_file_exact`] from the page cache only.
fn read_cached_exact(file: &std::fs::File, off: u64, dst: &mut [u8]) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < dst.len() {
        let rest = &mut dst[got..];
        let at = off
            .checked_add(got as u64)
            .and_then(|at| libc::off_t::try_from(at).ok())
            .ok_or_else(|| Error::Invalid(format!("file offset {off} + {got}")))?;
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        // SAFETY: the iovec describes `rest`, a live, exclusively borrowed
        // buffer; preadv2 writes at most its length into it.
        let r = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
        match r {
            0 => {
                let e = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                return Err(short_or_io(e, off, dst.len()));
            }
            r if r < 0 => {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) => return Err(Error::WouldBlock),
                    // No RWF_NOWAIT on this file system: read, waiting.
                    Some(libc::EOPNOTSUPP) => {
                        return file
                            .read_exact_at(&mut dst[got..], at as u64)
                            .map_err(|e| short_or_io(e, off, dst.len()));
                    }
                    _ => return Err(Error::Io(e)),
                }
            }
            r => got += r as usize,
        }
    }
    Ok(())
}

fn short_or_io(e: std::io::Error, off: u64, len: usize) -> Error {
    {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Corrupt(format!(
                "a block object is shorter than {} bytes",
                off + len as u64
            ))
        } else {
            Error::Io(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_fragment_counts_the_bytes_it_stands_for() {
        assert_eq!(Fragment::Zeros(5).len(), 5);
        assert!(Fragment::Data(&[]).is_empty());
        let f = std::fs::File::open("/dev/null").unwrap();
        let frag = Fragment::File {
            file: &f,
            off: 3,
            len: 9,
        };
        assert_eq!(frag.len(), 9);
    }

    #[test]
    fn a_short_file_reads_as_corrupt() {
        let path = std::env::temp_dir().join(format!("sluice-api-{}", std::process::id()));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(b"0123456789")
            .unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut buf = [0u8; 4];
        read_file_exact(&f, 2, &mut buf).unwrap();
        assert_eq!(&buf, b"2345");
        let err = read_file_exact(&f, 8, &mut buf).unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
        // The same from the page cache only (the file was just written:
        // its pages are there).
        let _g = crate::wait::no_wait();
        read_file_exact(&f, 2, &mut buf).unwrap();
        assert_eq!(&buf, b"2345");
        let err = read_file_exact(&f, 8, &mut buf).unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
        std::fs::remove_file(&path).unwrap();
    }
}
