//! Block compression exactly as JuiceFS 1.x does it.
//!
//! JuiceFS (`pkg/compress`) compresses each block on its own, with no header
//! of its own around the result:
//! - `lz4`: the LZ4 *block* format (no frame, no size prefix) from the C
//!   library's `LZ4_compress_default`; the reader knows the raw size from the
//!   object key. The `lz4` crate wraps the same C library, so
//!   `CompressionMode::DEFAULT` without a size prefix gives the same bytes.
//! - `zstd`: a Zstandard frame from `ZSTD_compress(.., level 1)` (the frame
//!   header carries the content size). `zstd::bulk::compress(.., 1)` runs the
//!   same C code.
//!
//! Checked against objects written by JuiceFS 1.4.2 (the fixtures in
//! `engine/tests/fixtures`): sluice decodes JuiceFS's objects and produces
//! byte-identical objects for the same block.

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::format::Compression;

/// Compresses one block for storage (uncompressed volumes store the raw
/// bytes, borrowed rather than copied).
pub fn compress(algo: Compression, raw: &[u8]) -> Result<Cow<'_, [u8]>> {
    match algo {
        Compression::None => Ok(Cow::Borrowed(raw)),
        Compression::Lz4 => {
            lz4::block::compress(raw, Some(lz4::block::CompressionMode::DEFAULT), false)
                .map(Cow::Owned)
                .map_err(|e| Error::Invalid(format!("lz4 cannot compress a block: {e}")))
        }
        Compression::Zstd => zstd::bulk::compress(raw, 1)
            .map(Cow::Owned)
            .map_err(|e| Error::Invalid(format!("zstd cannot compress a block: {e}"))),
    }
}

/// Decompresses a stored block whose raw size is `raw_len` (from its key).
/// `key` names the object in errors.
pub fn decompress(
    algo: Compression,
    stored: Vec<u8>,
    raw_len: usize,
    key: &str,
) -> Result<Vec<u8>> {
    if algo == Compression::None {
        // The stored bytes are the block: no copy.
        check_len(stored.len(), raw_len, key)?;
        return Ok(stored);
    }
    let mut out = vec![0u8; raw_len];
    decompress_to(algo, &stored, raw_len, &mut out, key)?;
    Ok(out)
}

/// [`decompress`] into the start of `out`, which must have room for
/// `raw_len` bytes (the host daemon decompresses straight into the shared
/// memory it hands out). Returns `raw_len`.
pub fn decompress_to(
    algo: Compression,
    stored: &[u8],
    raw_len: usize,
    out: &mut [u8],
    key: &str,
) -> Result<usize> {
    let room = out.len();
    let Some(out) = out.get_mut(..raw_len) else {
        return Err(Error::Corrupt(format!(
            "object {key}: its key says {raw_len} bytes, more than the {room} expected"
        )));
    };
    let n = match algo {
        Compression::None => {
            check_len(stored.len(), raw_len, key)?;
            out.copy_from_slice(stored);
            raw_len
        }
        Compression::Lz4 => {
            let n = i32::try_from(raw_len)
                .map_err(|_| Error::Corrupt(format!("object {key}: block too large")))?;
            lz4::block::decompress_to_buffer(stored, Some(n), out)
                .map_err(|e| Error::Corrupt(format!("object {key} is not valid lz4: {e}")))?
        }
        Compression::Zstd => zstd::bulk::decompress_to_buffer(stored, out)
            .map_err(|e| Error::Corrupt(format!("object {key} is not valid zstd: {e}")))?,
    };
    check_len(n, raw_len, key)?;
    Ok(n)
}

/// Fails unless a block's `len` bytes are the `raw_len` its key says.
fn check_len(len: usize, raw_len: usize, key: &str) -> Result<()> {
    if len != raw_len {
        return Err(Error::Corrupt(format!(
            "object {key} holds {len} bytes, its key says {raw_len}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Compression; 3] = [Compression::None, Compression::Lz4, Compression::Zstd];

    fn fixture(name: &str) -> Vec<u8> {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/");
        std::fs::read(format!("{p}{name}")).unwrap()
    }

    fn suffix(c: Compression) -> &'static str {
        match c {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    #[test]
    fn round_trip() {
        let mut data = Vec::new();
        for i in 0..200_000u32 {
            data.extend_from_slice(&(i / 7).to_le_bytes());
        }
        for c in ALL {
            for raw in [&data[..], b"", b"a"] {
                let z = compress(c, raw).unwrap();
                assert_eq!(decompress(c, z.into_owned(), raw.len(), "k").unwrap(), raw);
            }
        }
    }

    /// Objects JuiceFS 1.4.2 wrote for "hello sluice\n" and for 1000 × 'X'
    /// (see the module comment): we decode them, and our encoding of the same
    /// block is byte-identical.
    #[test]
    fn juicefs_objects_decode_and_match() {
        let cases: [(&str, Vec<u8>); 2] = [
            ("hello", b"hello sluice\n".to_vec()),
            ("x1000", vec![b'X'; 1000]),
        ];
        for (name, raw) in cases {
            for c in ALL {
                let stored = fixture(&format!("{name}_{}", suffix(c)));
                assert_eq!(*compress(c, &raw).unwrap(), stored[..], "{name} {c:?}");
                assert_eq!(decompress(c, stored, raw.len(), "k").unwrap(), raw);
            }
        }
    }

    #[test]
    fn garbage_is_corrupt() {
        for c in [Compression::Lz4, Compression::Zstd] {
            let err = decompress(c, vec![0xff; 16], 1000, "vol/chunks/0/0/1_0_1000").unwrap_err();
            assert!(
                matches!(err, Error::Corrupt(ref m) if m.contains("1_0_1000")),
                "{err}"
            );
        }
        let err = decompress(Compression::None, vec![1, 2], 3, "k").unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)));
    }
}
