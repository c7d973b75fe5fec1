//! The destination-neutral form of a read: a walk over [`Fragment`]s (a
//! stretch of zeros, bytes of a cached block, or a range of a local file),
//! so each transport lands the bytes where it wants them — a plain buffer
//! for the host mount, guest memory for virtio-fs — with one copy.

use crate::error::{Error, Result};
use std::os::fd::AsRawFd;

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

/// Where a read's bytes go. The transport makes one destination per READ
/// (a plain buffer, or the request's own buffers in guest memory) and
/// hands it down once; the file system pushes the read's fragments into it
/// in order and never calls back up.
pub trait ReadDest {
    /// Takes the next fragment. An error ends the read with that error
    /// ([`Error::WouldBlock`] where placing it would wait).
    fn put(&mut self, frag: Fragment<'_>) -> Result<()>;
}

/// A closure is a destination (tests, and the engine's own walks).
impl<F: FnMut(Fragment<'_>) -> Result<()>> ReadDest for F {
    fn put(&mut self, frag: Fragment<'_>) -> Result<()> {
        self(frag)
    }
}

/// A plain buffer as a [`ReadDest`]: the one place fragments become bytes
/// in host memory (the host mount's reply buffer, tools, tests). Guest
/// memory has its own (`sluice-vhost`'s reply writer), since it is written
/// with volatile copies.
#[derive(Debug)]
pub struct BufDest<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl<'a> BufDest<'a> {
    /// Fills `buf` from its start.
    pub fn new(buf: &'a mut [u8]) -> Self {
        BufDest { buf, at: 0 }
    }

    /// How many bytes were placed.
    pub fn filled(&self) -> usize {
        self.at
    }
}

impl ReadDest for BufDest<'_> {
    fn put(&mut self, frag: Fragment<'_>) -> Result<()> {
        let (at, total) = (self.at, self.buf.len());
        let dst = self
            .buf
            .get_mut(at..)
            .and_then(|rest| rest.get_mut(..frag.len()))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "a {}-byte fragment past byte {} of a {}-byte read",
                    frag.len(),
                    at,
                    total
                ))
            })?;
        match frag {
            Fragment::Zeros(_) => dst.fill(0),
            Fragment::Data(d) => sluice_simd::copy(dst, d),
            Fragment::File { file, off, .. } => read_file_exact(file, off, dst)?,
        }
        self.at += dst.len();
        Ok(())
    }
}

/// Reads exactly `dst.len()` bytes of `file` at `off` (a local object read
/// in part); a short object is corrupt. On a thread that must not wait
/// ([`crate::wait::no_wait`]) it reads only what the page cache holds
/// (RWF_NOWAIT) and fails with [`Error::WouldBlock`] where the disk would
/// be read.
pub fn read_file_exact(file: &std::fs::File, off: u64, dst: &mut [u8]) -> Result<()> {
    let len = dst.len();
    // SAFETY: the pointer and length are those of `dst`, a live buffer
    // borrowed exclusively for this call and not touched while it runs.
    unsafe { pread_exact(file, dst.as_mut_ptr(), len, off) }.map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Error::WouldBlock
        } else {
            short_or_io(e, off, len)
        }
    })
}

/// Reads exactly `len` bytes of `file` at `offset` into `dst`. On a thread
/// that must not wait ([`crate::wait::no_wait`], a queue worker) only
/// from the page cache (RWF_NOWAIT): bytes that need the disk are a
/// `WouldBlock` error, and the request goes to a waiter. Volatile-safe:
/// the kernel writes `dst`, so it may be guest memory.
///
/// # Safety
///
/// `dst` must be valid for `len` bytes of writes, with no Rust reference to
/// those bytes alive.
pub unsafe fn pread_exact(
    file: &std::fs::File,
    dst: *mut u8,
    len: usize,
    offset: u64,
) -> std::io::Result<()> {
    // A thread that must not wait (a queue worker) reads only what the
    // page cache holds; the rest is read by a waiter.
    let mut no_wait = crate::wait::mode() == crate::wait::Mode::NoWait;
    let mut got = 0;
    while got < len {
        let at = offset
            .checked_add(got as u64)
            .and_then(|at| libc::off_t::try_from(at).ok())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let r = if no_wait {
            let iov = libc::iovec {
                // SAFETY: as below, `dst + got` is inside the buffer.
                iov_base: unsafe { dst.add(got).cast() },
                iov_len: len - got,
            };
            // SAFETY: the one iovec describes `dst + got .. dst + len`, valid
            // for writes (this function's contract); preadv2 writes at most
            // that many bytes there.
            unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) }
        } else {
            // SAFETY: `dst + got .. dst + len` is valid for writes (this
            // function's contract); pread writes at most `len - got` bytes
            // there.
            unsafe { libc::pread(file.as_raw_fd(), dst.add(got).cast(), len - got, at) }
        };
        match r {
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the object is shorter than the slice says",
                ));
            }
            r if r < 0 => {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    // Not in the page cache (RWF_NOWAIT): the read would
                    // wait for the disk.
                    Some(libc::EAGAIN) if no_wait => {
                        return Err(std::io::ErrorKind::WouldBlock.into());
                    }
                    // A file system without RWF_NOWAIT: read as before.
                    Some(libc::EOPNOTSUPP) if no_wait => no_wait = false,
                    _ => return Err(e),
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
    fn a_buffer_takes_fragments_in_order_and_nothing_past_its_end() {
        let path = std::env::temp_dir().join(format!("sluice-api-buf-{}", std::process::id()));
        std::fs::write(&path, b"0123456789").unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut buf = [9u8; 8];
        let mut dst = BufDest::new(&mut buf);
        dst.put(Fragment::Data(b"ab")).unwrap();
        dst.put(Fragment::Zeros(2)).unwrap();
        dst.put(Fragment::File {
            file: &f,
            off: 3,
            len: 3,
        })
        .unwrap();
        assert_eq!(dst.filled(), 7);
        let err = dst.put(Fragment::Data(b"xy")).unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{err:?}");
        assert_eq!(dst.filled(), 7);
        assert_eq!(&buf, &[b'a', b'b', 0, 0, b'3', b'4', b'5', 9]);
        std::fs::remove_file(&path).unwrap();
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
