//! The bytes of a write, as the file system takes them: a [`WriteSource`]
//! hands out the next bytes in order, straight into the buffer the file
//! system keeps them in. A transport whose message is one host buffer
//! (`/dev/fuse`, tests) gives a [`SliceSource`]; the virtio-fs device gives
//! a source over the guest's descriptors, so WRITE data is copied once,
//! from guest memory into the engine's write buffer.

use crate::error::{Error, Result};

/// The data of one write, taken in order. What is not taken stays
/// untouched: a file system that takes fewer bytes than [`WriteSource::len`]
/// just leaves the rest.
pub trait WriteSource {
    /// Bytes not taken yet.
    fn len(&self) -> usize;

    /// Whether every byte was taken.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the next `dst.len()` bytes into `dst`. Asking for more than
    /// [`WriteSource::len`] is an error, and so is a source that cannot be
    /// read (guest memory gone); after an error `dst` holds some mix of
    /// its old bytes and the source's, and how much was taken is unknown.
    fn take(&mut self, dst: &mut [u8]) -> Result<()>;

    /// Appends the next `n` bytes to `dst`. The default zero-fills the room
    /// and then [`take`](WriteSource::take)s into it; a source overrides
    /// it to copy into `dst`'s spare capacity directly, writing each byte
    /// once. On an error `dst` keeps its old length.
    fn take_append(&mut self, dst: &mut Vec<u8>, n: usize) -> Result<()> {
        check_len(self.len(), n)?;
        let start = dst.len();
        dst.resize(start + n, 0);
        let taken = self.take(&mut dst[start..]);
        if taken.is_err() {
            dst.truncate(start);
        }
        taken
    }
}

/// The error a source answers when asked for `want` bytes of its `left`.
pub fn check_len(left: usize, want: usize) -> Result<()> {
    if want > left {
        return Err(Error::Invalid(format!(
            "{want} bytes of write data asked for, {left} left"
        )));
    }
    Ok(())
}

/// Write data in one host buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceSource<'a> {
    rest: &'a [u8],
}

impl<'a> SliceSource<'a> {
    /// A source handing out `bytes`.
    pub fn new(bytes: &'a [u8]) -> SliceSource<'a> {
        SliceSource { rest: bytes }
    }

    /// The bytes not taken yet.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

impl WriteSource for SliceSource<'_> {
    fn len(&self) -> usize {
        self.rest.len()
    }

    fn take(&mut self, dst: &mut [u8]) -> Result<()> {
        check_len(self.rest.len(), dst.len())?;
        let (head, tail) = self.rest.split_at(dst.len());
        dst.copy_from_slice(head);
        self.rest = tail;
        Ok(())
    }

    fn take_append(&mut self, dst: &mut Vec<u8>, n: usize) -> Result<()> {
        check_len(self.rest.len(), n)?;
        let (head, tail) = self.rest.split_at(n);
        dst.extend_from_slice(head);
        self.rest = tail;
        Ok(())
    }
}

/// At most a given number of the bytes of another source: a transport's
/// source that holds more than the write's data (request extensions after
/// it) is handed on as just the data.
#[derive(Debug)]
pub struct Limited<'a, S: WriteSource + ?Sized> {
    inner: &'a mut S,
    left: usize,
}

impl<'a, S: WriteSource + ?Sized> Limited<'a, S> {
    /// The next `limit` bytes of `inner` (all of them, if it holds fewer).
    pub fn new(inner: &'a mut S, limit: usize) -> Limited<'a, S> {
        let left = limit.min(inner.len());
        Limited { inner, left }
    }
}

impl<S: WriteSource + ?Sized> WriteSource for Limited<'_, S> {
    fn len(&self) -> usize {
        self.left
    }

    fn take(&mut self, dst: &mut [u8]) -> Result<()> {
        check_len(self.left, dst.len())?;
        self.inner.take(dst)?;
        self.left -= dst.len();
        Ok(())
    }

    fn take_append(&mut self, dst: &mut Vec<u8>, n: usize) -> Result<()> {
        check_len(self.left, n)?;
        self.inner.take_append(dst, n)?;
        self.left -= n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_hands_out_its_bytes_in_order() {
        let mut src = SliceSource::new(b"hello, world");
        assert_eq!(src.len(), 12);
        let mut first = [0u8; 5];
        src.take(&mut first).unwrap();
        assert_eq!(&first, b"hello");
        let mut buf = b"x".to_vec();
        src.take_append(&mut buf, 2).unwrap();
        assert_eq!(buf, b"x, ");
        assert_eq!(src.rest(), b"world");
        // Asking past the end takes nothing.
        let mut big = [0u8; 6];
        assert!(matches!(src.take(&mut big), Err(Error::Invalid(_))));
        assert!(src.take_append(&mut buf, 6).is_err());
        assert_eq!((src.len(), buf.len()), (5, 3));
        src.take(&mut big[..5]).unwrap();
        assert!(src.is_empty());
    }

    /// A source with only `take`: the default `take_append`.
    struct Bytes(Vec<u8>);

    impl WriteSource for Bytes {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn take(&mut self, dst: &mut [u8]) -> Result<()> {
            check_len(self.0.len(), dst.len())?;
            dst.copy_from_slice(&self.0[..dst.len()]);
            self.0.drain(..dst.len());
            Ok(())
        }
    }

    #[test]
    fn a_limited_source_stops_at_its_limit() {
        let mut inner = Bytes(b"data+extension".to_vec());
        let mut data = Limited::new(&mut inner, 4);
        assert_eq!(data.len(), 4);
        let mut out = Vec::new();
        assert!(data.take_append(&mut out, 5).is_err());
        assert!(out.is_empty());
        data.take_append(&mut out, 3).unwrap();
        let mut last = [0u8; 1];
        data.take(&mut last).unwrap();
        assert!(data.is_empty());
        assert_eq!((out.as_slice(), &last), (&b"dat"[..], b"a"));
        assert_eq!(inner.0, b"+extension");
        // A limit past the inner source's end is its end.
        let mut short = SliceSource::new(b"ab");
        assert_eq!(Limited::new(&mut short, 10).len(), 2);
    }
}
