//! The two file layouts of MLPerf Storage data sets, written and read back.
//!
//! - npz-like: one sample per file, laid out as a NumPy `.npy` array of `uint8`
//!   (magic, version, a padded header dict, then the payload), named `.npz` as DLIO names it.
//! - tfrecord-like: records framed exactly as TFRecord frames them — `u64` little-endian
//!   length, masked CRC32C of the length, payload, masked CRC32C of the payload.
//!
//! Payload bytes come from a seeded random pattern, so they do not compress.

use std::io;
use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};

use super::MlperfError;
use super::source::{SinkFile, SourceFile};
use super::workload::FileFormat;

const NPY_MAGIC: &[u8; 6] = b"\x93NUMPY";
const NPY_PREFIX: usize = 10;
const TFRECORD_HEADER: u64 = 12;
const TFRECORD_FOOTER: u64 = 4;
/// Largest chunk written at once.
pub const WRITE_CHUNK: usize = 1 << 20;
const PATTERN_SLACK: usize = 4096;

/// The TFRecord CRC mask: rotate right by 15, add a constant.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    mask(crc32c::crc32c(data))
}

fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn npy_header(payload: u64) -> Vec<u8> {
    let dict = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({payload},), }}");
    let total = (NPY_PREFIX + dict.len() + 1).div_ceil(64) * 64;
    let header_len = total - NPY_PREFIX;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(NPY_MAGIC);
    out.extend_from_slice(&[1, 0]);
    // The dict is a few dozen bytes, so its padded length always fits the u16 field.
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

/// The length of a file holding samples of `sizes` in `format`.
pub fn file_len(format: FileFormat, sizes: &[u64]) -> u64 {
    match format {
        FileFormat::Npz => sizes.iter().map(|&s| npy_header(s).len() as u64 + s).sum(),
        FileFormat::Tfrecord => sizes
            .iter()
            .map(|&s| TFRECORD_HEADER + s + TFRECORD_FOOTER)
            .sum(),
    }
}

/// Random bytes that payloads are cut from.
#[derive(Debug, Clone)]
pub struct FillPattern {
    bytes: Vec<u8>,
}

impl FillPattern {
    /// A pattern drawn from `seed`.
    pub fn new(seed: u64) -> FillPattern {
        let mut bytes = vec![0u8; WRITE_CHUNK + PATTERN_SLACK];
        StdRng::seed_from_u64(seed).fill_bytes(&mut bytes);
        FillPattern { bytes }
    }

    /// `len` (≤ 1 MiB) pattern bytes for chunk `chunk` of a file salted with `salt`.
    pub fn chunk(&self, salt: u64, chunk: u64, len: usize) -> &[u8] {
        let start = (salt
            .wrapping_mul(131)
            .wrapping_add(chunk.wrapping_mul(4099))
            % PATTERN_SLACK as u64) as usize;
        &self.bytes[start..start + len.min(WRITE_CHUNK)]
    }
}

fn write_payload(
    sink: &mut dyn SinkFile,
    pattern: &FillPattern,
    salt: u64,
    len: u64,
    mut crc: Option<&mut u32>,
) -> io::Result<()> {
    let mut written = 0u64;
    let mut chunk = 0u64;
    while written < len {
        let n = (len - written).min(WRITE_CHUNK as u64) as usize;
        let bytes = pattern.chunk(salt, chunk, n);
        if let Some(crc) = crc.as_deref_mut() {
            *crc = crc32c::crc32c_append(*crc, bytes);
        }
        sink.write_all(bytes)?;
        written += n as u64;
        chunk += 1;
    }
    Ok(())
}

/// Writes a file with samples of `sizes` in `format`; payloads come from `pattern` salted
/// with `salt` (the file index), so different files hold different bytes.
pub fn write_file(
    sink: &mut dyn SinkFile,
    format: FileFormat,
    sizes: &[u64],
    pattern: &FillPattern,
    salt: u64,
) -> io::Result<()> {
    for (i, &size) in sizes.iter().enumerate() {
        let salt = salt.wrapping_mul(1_000_003).wrapping_add(i as u64);
        match format {
            FileFormat::Npz => {
                sink.write_all(&npy_header(size))?;
                write_payload(sink, pattern, salt, size, None)?;
            }
            FileFormat::Tfrecord => {
                let len = size.to_le_bytes();
                let mut header = [0u8; TFRECORD_HEADER as usize];
                header[..8].copy_from_slice(&len);
                header[8..].copy_from_slice(&masked_crc32c(&len).to_le_bytes());
                sink.write_all(&header)?;
                let mut crc = 0u32;
                write_payload(sink, pattern, salt, size, Some(&mut crc))?;
                sink.write_all(&mask(crc).to_le_bytes())?;
            }
        }
    }
    Ok(())
}

/// How a file's samples were read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Samples delivered.
    pub samples: u64,
    /// Payload bytes of those samples.
    pub payload_bytes: u64,
    /// Bytes read from the file, framing included.
    pub file_bytes: u64,
}

/// In what order the records of a multi-sample file are read.
#[derive(Debug)]
pub enum RecordOrder<'a> {
    /// Front to back with large sequential reads (TFRecordDataset, no sample shuffle).
    Sequential,
    /// Every record, in an order drawn from the generator (random access inside the file).
    Shuffled(&'a mut StdRng),
}

/// Reads a whole data file, sample by sample, calling `on_sample(payload_len)` after each
/// sample has been read in full; stops early (without error) when `on_sample` returns false.
/// `scratch` sets the I/O size. With `verify`, record payload CRCs are checked too (the
/// framing is always checked).
pub fn read_samples(
    file: &mut dyn SourceFile,
    path: &Path,
    format: FileFormat,
    order: RecordOrder<'_>,
    scratch: &mut [u8],
    verify: bool,
    on_sample: &mut dyn FnMut(u64) -> bool,
) -> Result<ReadStats, MlperfError> {
    match format {
        FileFormat::Npz => read_npz(file, path, scratch, on_sample),
        FileFormat::Tfrecord => match order {
            RecordOrder::Sequential => {
                read_tfrecord_sequential(file, path, scratch, verify, on_sample)
            }
            RecordOrder::Shuffled(rng) => {
                read_tfrecord_shuffled(file, path, scratch, verify, rng, on_sample)
            }
        },
    }
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> MlperfError {
    MlperfError::CorruptFile {
        path: path.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

fn read_range(
    file: &mut dyn SourceFile,
    path: &Path,
    scratch: &mut [u8],
    mut offset: u64,
    len: u64,
    mut crc: Option<&mut u32>,
) -> Result<(), MlperfError> {
    let end = offset + len;
    while offset < end {
        let n = (end - offset).min(scratch.len() as u64) as usize;
        file.read_exact_at(&mut scratch[..n], offset)
            .map_err(|e| MlperfError::io("read", path, e))?;
        if let Some(crc) = crc.as_deref_mut() {
            *crc = crc32c::crc32c_append(*crc, &scratch[..n]);
        }
        offset += n as u64;
    }
    Ok(())
}

fn read_npz(
    file: &mut dyn SourceFile,
    path: &Path,
    scratch: &mut [u8],
    on_sample: &mut dyn FnMut(u64) -> bool,
) -> Result<ReadStats, MlperfError> {
    let mut prefix = [0u8; NPY_PREFIX];
    file.read_exact_at(&mut prefix, 0)
        .map_err(|e| MlperfError::io("read", path, e))?;
    if &prefix[..6] != NPY_MAGIC {
        return Err(corrupt(path, 0, "no NumPy array magic"));
    }
    let header_len = u16::from_le_bytes([prefix[8], prefix[9]]) as usize;
    let mut header = vec![0u8; header_len];
    file.read_exact_at(&mut header, NPY_PREFIX as u64)
        .map_err(|e| MlperfError::io("read", path, e))?;
    let header = String::from_utf8_lossy(&header);
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|rest| rest.split([',', ')']).next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .ok_or_else(|| corrupt(path, NPY_PREFIX as u64, "the array header has no 1-D shape"))?;
    let data_start = (NPY_PREFIX + header_len) as u64;
    if data_start + shape != file.len() {
        return Err(corrupt(
            path,
            data_start,
            format!(
                "the header promises {shape} bytes but the file holds {}",
                file.len().saturating_sub(data_start)
            ),
        ));
    }
    read_range(file, path, scratch, data_start, shape, None)?;
    on_sample(shape);
    Ok(ReadStats {
        samples: 1,
        payload_bytes: shape,
        file_bytes: file.len(),
    })
}

fn parse_header(path: &Path, offset: u64, header: &[u8]) -> Result<u64, MlperfError> {
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[..8]);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&header[8..12]);
    if masked_crc32c(&len) != u32::from_le_bytes(crc) {
        return Err(corrupt(path, offset, "record length CRC mismatch"));
    }
    Ok(u64::from_le_bytes(len))
}

/// A forward-only window over a file, refilled with `scratch`-sized reads.
struct SequentialWindow<'a> {
    file: &'a mut dyn SourceFile,
    path: &'a Path,
    buf: &'a mut [u8],
    /// File offset of `buf[0]`.
    base: u64,
    filled: usize,
    pos: usize,
    bytes_read: u64,
}

impl SequentialWindow<'_> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn at_end(&self) -> bool {
        self.offset() >= self.file.len()
    }

    /// Makes at least `n` (≤ buffer size) bytes available at `pos`.
    fn fill(&mut self, n: usize) -> Result<(), MlperfError> {
        if self.filled - self.pos >= n {
            return Ok(());
        }
        self.buf.copy_within(self.pos..self.filled, 0);
        self.base += self.pos as u64;
        self.filled -= self.pos;
        self.pos = 0;
        while self.filled < n {
            let offset = self.base + self.filled as u64;
            let want = (self.buf.len() - self.filled).min((self.file.len() - offset) as usize);
            if want == 0 {
                return Err(corrupt(self.path, offset, "the file ends inside a record"));
            }
            let got = self
                .file
                .read_at(&mut self.buf[self.filled..self.filled + want], offset)
                .map_err(|e| MlperfError::io("read", self.path, e))?;
            if got == 0 {
                return Err(corrupt(self.path, offset, "the file ends inside a record"));
            }
            self.filled += got;
            self.bytes_read += got as u64;
        }
        Ok(())
    }

    /// Consumes `n` bytes, feeding them to `crc` if given.
    fn consume(&mut self, mut n: u64, mut crc: Option<&mut u32>) -> Result<(), MlperfError> {
        while n > 0 {
            if self.pos == self.filled {
                self.fill(1)?;
            }
            let take = (n.min((self.filled - self.pos) as u64)) as usize;
            if let Some(crc) = crc.as_deref_mut() {
                *crc = crc32c::crc32c_append(*crc, &self.buf[self.pos..self.pos + take]);
            }
            self.pos += take;
            n -= take as u64;
        }
        Ok(())
    }

    fn take_u32(&mut self) -> Result<u32, MlperfError> {
        self.fill(4)?;
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buf[self.pos..self.pos + 4]);
        self.pos += 4;
        Ok(u32::from_le_bytes(b))
    }
}

fn read_tfrecord_sequential(
    file: &mut dyn SourceFile,
    path: &Path,
    scratch: &mut [u8],
    verify: bool,
    on_sample: &mut dyn FnMut(u64) -> bool,
) -> Result<ReadStats, MlperfError> {
    if scratch.len() < TFRECORD_HEADER as usize {
        return Err(MlperfError::InvalidParameter(
            "the read size must be at least 12 bytes".into(),
        ));
    }
    let mut window = SequentialWindow {
        file,
        path,
        buf: scratch,
        base: 0,
        filled: 0,
        pos: 0,
        bytes_read: 0,
    };
    let mut stats = ReadStats::default();
    while !window.at_end() {
        let offset = window.offset();
        window.fill(TFRECORD_HEADER as usize)?;
        let len = parse_header(path, offset, &window.buf[window.pos..window.pos + 12])?;
        window.pos += TFRECORD_HEADER as usize;
        if window.offset() + len + TFRECORD_FOOTER > window.file.len() {
            return Err(corrupt(
                path,
                offset,
                "a record runs past the end of the file",
            ));
        }
        let mut crc = 0u32;
        window.consume(len, verify.then_some(&mut crc))?;
        let stored = window.take_u32()?;
        if verify && stored != mask(crc) {
            return Err(corrupt(path, offset, "record payload CRC mismatch"));
        }
        stats.samples += 1;
        stats.payload_bytes += len;
        if !on_sample(len) {
            break;
        }
    }
    stats.file_bytes = window.bytes_read;
    Ok(stats)
}

fn read_tfrecord_shuffled(
    file: &mut dyn SourceFile,
    path: &Path,
    scratch: &mut [u8],
    verify: bool,
    rng: &mut StdRng,
    on_sample: &mut dyn FnMut(u64) -> bool,
) -> Result<ReadStats, MlperfError> {
    let mut records = Vec::new();
    let mut offset = 0u64;
    let mut stats = ReadStats::default();
    let mut header = [0u8; TFRECORD_HEADER as usize];
    while offset < file.len() {
        file.read_exact_at(&mut header, offset)
            .map_err(|e| MlperfError::io("read", path, e))?;
        stats.file_bytes += TFRECORD_HEADER;
        let len = parse_header(path, offset, &header)?;
        let data = offset + TFRECORD_HEADER;
        if data + len + TFRECORD_FOOTER > file.len() {
            return Err(corrupt(
                path,
                offset,
                "a record runs past the end of the file",
            ));
        }
        records.push((offset, len));
        offset = data + len + TFRECORD_FOOTER;
    }
    records.shuffle(rng);
    for (offset, len) in records {
        let data = offset + TFRECORD_HEADER;
        let mut crc = 0u32;
        read_range(file, path, scratch, data, len, verify.then_some(&mut crc))?;
        let mut footer = [0u8; 4];
        file.read_exact_at(&mut footer, data + len)
            .map_err(|e| MlperfError::io("read", path, e))?;
        if verify && u32::from_le_bytes(footer) != mask(crc) {
            return Err(corrupt(path, offset, "record payload CRC mismatch"));
        }
        stats.samples += 1;
        stats.payload_bytes += len;
        stats.file_bytes += len + TFRECORD_FOOTER;
        if !on_sample(len) {
            break;
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlperf::source::{DataSource, DirSource};

    fn write(source: &DirSource, name: &str, format: FileFormat, sizes: &[u64]) {
        let mut sink = source.create(Path::new(name)).unwrap();
        write_file(sink.as_mut(), format, sizes, &FillPattern::new(1), 9).unwrap();
        sink.sync().unwrap();
    }

    fn read_all(
        source: &DirSource,
        name: &str,
        format: FileFormat,
        order: RecordOrder<'_>,
        io: usize,
    ) -> (ReadStats, Vec<u64>) {
        let mut file = source.open(Path::new(name)).unwrap();
        let mut scratch = vec![0u8; io];
        let mut seen = Vec::new();
        let stats = read_samples(
            file.as_mut(),
            Path::new(name),
            format,
            order,
            &mut scratch,
            true,
            &mut |n| {
                seen.push(n);
                true
            },
        )
        .unwrap();
        (stats, seen)
    }

    #[test]
    fn tfrecord_framing_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        let sizes = [1u64, 5000, 3, 70_000, 12];
        write(&source, "a.tfrecord", FileFormat::Tfrecord, &sizes);
        let len = std::fs::metadata(dir.path().join("a.tfrecord"))
            .unwrap()
            .len();
        assert_eq!(len, file_len(FileFormat::Tfrecord, &sizes));
        // Small I/O size so records straddle window refills.
        let (stats, seen) = read_all(
            &source,
            "a.tfrecord",
            FileFormat::Tfrecord,
            RecordOrder::Sequential,
            64,
        );
        assert_eq!(seen, sizes);
        assert_eq!(stats.file_bytes, len);
        assert_eq!(stats.payload_bytes, sizes.iter().sum::<u64>());
        let mut rng = StdRng::seed_from_u64(3);
        let (stats, mut seen) = read_all(
            &source,
            "a.tfrecord",
            FileFormat::Tfrecord,
            RecordOrder::Shuffled(&mut rng),
            100,
        );
        seen.sort();
        let mut want = sizes.to_vec();
        want.sort();
        assert_eq!(seen, want);
        assert_eq!(stats.file_bytes, len);
    }

    #[test]
    fn tfrecord_mask_is_tensorflows() {
        // TensorFlow: masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8, over CRC32C
        // (whose check value for "123456789" is 0xe3069283).
        let crc = crc32c::crc32c(b"123456789");
        assert_eq!(crc, 0xe306_9283);
        // Written as TensorFlow writes it, to check our rotate against it.
        #[allow(clippy::manual_rotate)]
        let tensorflow = ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8);
        assert_eq!(masked_crc32c(b"123456789"), tensorflow);
    }

    #[test]
    fn corrupted_tfrecord_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        write(&source, "b.tfrecord", FileFormat::Tfrecord, &[100, 100]);
        let path = dir.path().join("b.tfrecord");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[12 + 50] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let mut file = source.open(Path::new("b.tfrecord")).unwrap();
        let mut scratch = vec![0u8; 4096];
        let err = read_samples(
            file.as_mut(),
            &path,
            FileFormat::Tfrecord,
            RecordOrder::Sequential,
            &mut scratch,
            true,
            &mut |_| true,
        )
        .unwrap_err();
        assert!(err.to_string().contains("payload CRC mismatch"), "{err}");
        bytes[3] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let mut file = source.open(Path::new("b.tfrecord")).unwrap();
        let err = read_samples(
            file.as_mut(),
            &path,
            FileFormat::Tfrecord,
            RecordOrder::Sequential,
            &mut scratch,
            false,
            &mut |_| true,
        )
        .unwrap_err();
        assert!(err.to_string().contains("length CRC mismatch"), "{err}");
    }

    #[test]
    fn npz_reads_back_and_is_a_numpy_array() {
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        write(&source, "c.npz", FileFormat::Npz, &[123_457]);
        let bytes = std::fs::read(dir.path().join("c.npz")).unwrap();
        assert_eq!(&bytes[..6], NPY_MAGIC);
        let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((NPY_PREFIX + header_len) % 64, 0);
        assert_eq!(bytes.len() as u64, file_len(FileFormat::Npz, &[123_457]));
        let (stats, seen) = read_all(
            &source,
            "c.npz",
            FileFormat::Npz,
            RecordOrder::Sequential,
            4096,
        );
        assert_eq!(seen, vec![123_457]);
        assert_eq!(stats.file_bytes, bytes.len() as u64);
        std::fs::write(dir.path().join("d.npz"), &bytes[..bytes.len() - 1]).unwrap();
        let mut file = source.open(Path::new("d.npz")).unwrap();
        let mut scratch = vec![0u8; 4096];
        let err = read_samples(
            file.as_mut(),
            Path::new("d.npz"),
            FileFormat::Npz,
            RecordOrder::Sequential,
            &mut scratch,
            false,
            &mut |_| true,
        )
        .unwrap_err();
        assert!(err.to_string().contains("promises 123457 bytes"), "{err}");
    }
}
