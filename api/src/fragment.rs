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
    /// store, a disk-cache file): the consumer reads them straight into its
    /// destination (guest memory, for virtio-fs), so they are copied once,
    /// by the kernel, or not at all (O_DIRECT).
    File {
        /// The open object file.
        file: &'a std::fs::File,
        /// Where the bytes start in it.
        off: u64,
        /// How many bytes.
        len: usize,
        /// The CRC32C of each segment of the file, when it has them (a
        /// disk-cache file): the consumer checks the bytes where they
        /// landed against them ([`check_landed`]) before it counts them,
        /// and on a mismatch fails with [`Error::Corrupt`], its position
        /// back where the fragment began (the bytes placed are overwritten
        /// by whatever comes next, or never sent). `None`: the bytes
        /// are taken as read (a `file://` object, whose CRC covers the
        /// whole object).
        crcs: Option<SegmentCrcs<'a>>,
    },
}

/// The CRC32C of each `segment`-byte piece of a file's payload, from its
/// first byte (the last piece ends at the payload's end and may be
/// shorter): what a disk-cache file's trailer holds.
#[derive(Debug, Clone, Copy)]
pub struct SegmentCrcs<'a> {
    /// Bytes covered by one CRC.
    pub segment: usize,
    /// The CRCs, in file order.
    pub crcs: &'a [u32],
    /// Bytes of payload in the file (the CRCs cover exactly these).
    pub payload: u64,
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
            Fragment::File {
                file,
                off,
                len,
                crcs,
            } => {
                read_file_exact(file, off, dst)?;
                if let Some(crcs) = crcs {
                    let landed = [(dst.as_ptr(), len)];
                    // SAFETY: `dst` is a live host buffer of `len` bytes,
                    // only read during the call.
                    unsafe { check_landed(file, off, len, crcs, &landed) }?;
                }
            }
        }
        self.at += dst.len();
        Ok(())
    }
}

/// Most bytes of a segment read from the file around a range to check it:
/// a CRC segment is at most this long (the disk cache's is 32 KiB).
pub const MAX_SEGMENT: usize = 1 << 20;

/// Checks the bytes `off..off + len` of `file` that landed in `landed` (the
/// destination's pieces, in order, adding up to `len` bytes) against
/// `crcs`, in place: each segment the range touches is CRC'd from the
/// landed bytes, with the parts of its first and last segment outside the
/// range read from `file` beside them (at most a segment each, with the
/// no-wait rule of [`read_file_exact`]: [`Error::WouldBlock`] on a thread
/// that must not wait, where they are not in the page cache). A segment
/// whose CRC differs, a range past the payload or CRCs that do not cover
/// it is [`Error::Corrupt`].
///
/// # Safety
///
/// Each piece `(ptr, n)` must be valid for reads of `n` bytes for the call
/// and have no Rust `&mut` reference alive. The bytes may be memory another
/// party changes meanwhile (a guest racing its own READ's buffers): the
/// check then passes or fails on what it read, which concerns that party
/// alone.
pub unsafe fn check_landed(
    file: &std::fs::File,
    off: u64,
    len: usize,
    crcs: SegmentCrcs<'_>,
    landed: &[(*const u8, usize)],
) -> Result<()> {
    let seg = crcs.segment as u64;
    let end = off.saturating_add(len as u64);
    if len == 0 {
        return Ok(());
    }
    if seg == 0 || crcs.segment > MAX_SEGMENT || end > crcs.payload {
        return Err(Error::Corrupt(format!(
            "bytes {off}..{end} of a cached block cannot be checked against \
             {} CRCs of {seg}-byte segments over {} bytes",
            crcs.crcs.len(),
            crcs.payload
        )));
    }
    let total: usize = landed.iter().map(|&(_, n)| n).sum();
    if total != len {
        return Err(Error::Invalid(format!(
            "{total} bytes landed for a {len}-byte range"
        )));
    }
    let first = off / seg;
    let last = (end - 1) / seg;
    if last >= crcs.crcs.len() as u64 {
        return Err(Error::Corrupt(format!(
            "a cached block's {} CRCs do not cover bytes {off}..{end}",
            crcs.crcs.len()
        )));
    }
    let seg_end = |s: u64| ((s + 1) * seg).min(crcs.payload);
    // The part of the first segment before the range.
    let head_len = (off - first * seg) as usize;
    let mut crc = 0u32;
    if head_len > 0 {
        let mut head = vec![0u8; head_len];
        read_file_exact(file, first * seg, &mut head)?;
        crc = sluice_simd::crc32c(0, &head);
    }
    let mut at = off;
    let mut s = first;
    let mismatch = |s: u64, stored: u32, actual: u32| {
        Error::Corrupt(format!(
            "bytes {}..{} of a cached block fail their CRC32C (stored {stored:08x}, \
             landed {actual:08x})",
            s * seg,
            seg_end(s)
        ))
    };
    for &(ptr, n) in landed {
        let mut done = 0usize;
        while done < n {
            let stop = seg_end(s);
            let take = ((stop - at) as usize).min(n - done);
            // SAFETY: `ptr + done .. ptr + done + take` lies inside the
            // piece (`done + take <= n`), valid for reads by this
            // function's contract.
            crc = unsafe { sluice_simd::crc32c_raw(crc, ptr.add(done), take) };
            done += take;
            at += take as u64;
            if at == stop {
                let stored = crcs.crcs[s as usize];
                if crc != stored {
                    return Err(mismatch(s, stored, crc));
                }
                crc = 0;
                s += 1;
            }
        }
    }
    // The part of the last segment after the range.
    if at < seg_end(last) && s == last {
        let mut tail = vec![0u8; (seg_end(last) - at) as usize];
        read_file_exact(file, at, &mut tail)?;
        crc = sluice_simd::crc32c(crc, &tail);
        let stored = crcs.crcs[last as usize];
        if crc != stored {
            return Err(mismatch(last, stored, crc));
        }
    }
    Ok(())
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
            crcs: None,
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
            crcs: None,
        })
        .unwrap();
        assert_eq!(dst.filled(), 7);
        let err = dst.put(Fragment::Data(b"xy")).unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{err:?}");
        assert_eq!(dst.filled(), 7);
        assert_eq!(&buf, &[b'a', b'b', 0, 0, b'3', b'4', b'5', 9]);
        std::fs::remove_file(&path).unwrap();
    }

    /// A file of `payload` bytes and the CRC of each `seg` bytes.
    fn segmented(name: &str, payload: usize, seg: usize) -> (std::fs::File, Vec<u8>, Vec<u32>) {
        let data: Vec<u8> = (0..payload).map(|i| (i * 7 + i / 251) as u8).collect();
        let crcs = data
            .chunks(seg)
            .map(|c| sluice_simd::crc32c(0, c))
            .collect();
        let path = std::env::temp_dir().join(format!("sluice-api-{name}-{}", std::process::id()));
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        (f, data, crcs)
    }

    #[test]
    fn landed_bytes_are_checked_against_every_segment_they_touch() {
        let seg = 1024;
        let (f, data, crcs) = segmented("segments", 10 * seg + 300, seg);
        let sc = SegmentCrcs {
            segment: seg,
            crcs: &crcs,
            payload: data.len() as u64,
        };
        for (off, len) in [
            (0, data.len()),
            (0, seg),
            (seg, 3 * seg),
            (5, 1),
            (seg - 1, 2),
            (3 * seg + 17, 4 * seg),
            (10 * seg, 300),
            (10 * seg + 299, 1),
        ] {
            let mut landed = data[off..off + len].to_vec();
            // In one piece, and cut in three anywhere.
            let cut = [len / 3, 2 * len / 3];
            let p = landed.as_ptr();
            let whole = [(p, len)];
            // SAFETY: every piece lies inside `landed`, alive and unchanged.
            let pieces = unsafe {
                [
                    (p, cut[0]),
                    (p.add(cut[0]), cut[1] - cut[0]),
                    (p.add(cut[1]), len - cut[1]),
                ]
            };
            for pieces in [&whole[..], &pieces[..]] {
                // SAFETY: as above.
                unsafe { check_landed(&f, off as u64, len, sc, pieces) }
                    .unwrap_or_else(|e| panic!("{off}+{len}: {e}"));
            }
            // One byte off anywhere fails the check.
            landed[len / 2] ^= 0x20;
            let p = landed.as_ptr();
            // SAFETY: as above.
            let e = unsafe { check_landed(&f, off as u64, len, sc, &[(p, len)]) }.unwrap_err();
            assert!(matches!(e, Error::Corrupt(_)), "{off}+{len}: {e:?}");
        }
        // Past the payload, or CRCs that stop short: corrupt, not a panic.
        let one = [0u8; 8];
        let short = SegmentCrcs {
            crcs: &crcs[..2],
            ..sc
        };
        for (sc, off) in [(sc, data.len() as u64 - 4), (short, 3 * seg as u64)] {
            // SAFETY: `one` is a live 8-byte buffer.
            let e = unsafe { check_landed(&f, off, 8, sc, &[(one.as_ptr(), 8)]) }.unwrap_err();
            assert!(matches!(e, Error::Corrupt(_)), "{e:?}");
        }
    }

    #[test]
    fn a_buffer_refuses_a_damaged_range_and_does_not_count_it() {
        let seg = 512;
        let (f, data, mut crcs) = segmented("damaged", 4 * seg, seg);
        crcs[2] ^= 1;
        let sc = SegmentCrcs {
            segment: seg,
            crcs: &crcs,
            payload: data.len() as u64,
        };
        let mut buf = vec![0u8; 4 * seg];
        let mut dst = BufDest::new(&mut buf);
        let frag = |off: usize, len: usize| Fragment::File {
            file: &f,
            off: off as u64,
            len,
            crcs: Some(sc),
        };
        dst.put(frag(0, 2 * seg)).unwrap();
        let e = dst.put(frag(2 * seg, seg)).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e:?}");
        assert_eq!(dst.filled(), 2 * seg, "the damaged fragment does not count");
        dst.put(Fragment::Data(&data[2 * seg..3 * seg])).unwrap();
        dst.put(frag(3 * seg + 10, seg - 10)).unwrap();
        assert_eq!(dst.filled(), 4 * seg - 10);
        assert_eq!(&buf[..2 * seg], &data[..2 * seg]);
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
