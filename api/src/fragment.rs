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
/// in part); a short object is corrupt.
pub fn read_file_exact(file: &std::fs::File, off: u64, dst: &mut [u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(dst, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Corrupt(format!(
                "a block object is shorter than {} bytes",
                off + dst.len() as u64
            ))
        } else {
            Error::Io(e)
        }
    })
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
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    }
}
