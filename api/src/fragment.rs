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
