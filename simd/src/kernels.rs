//! Every kernel this CPU can run, for tests, benchmarks and users comparing
//! paths on their host; and the tests of every kernel against the oracle.

use crate::arch;
use crate::dispatch::{CopyFn, CrcFn, Kernel};

/// A CRC32C kernel the running CPU supports.
#[derive(Clone, Copy, Debug)]
pub struct CrcKernel(&'static Kernel<CrcFn>);

impl CrcKernel {
    /// The kernel's name, as [`crate::selected`] prints it.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// The `SLUICE_SIMD` path that enables this kernel.
    pub fn path(&self) -> &'static str {
        arch::PATHS[self.0.path]
    }

    /// [`crate::crc32c`] computed by this kernel.
    pub fn crc32c(&self, seed: u32, data: &[u8]) -> u32 {
        // SAFETY: a `CrcKernel` exists only for kernels the CPU supports
        // (`crc32c_kernels` filters on `supported`).
        !unsafe { (self.0.func)(!seed, data) }
    }
}

/// A copy kernel the running CPU supports.
#[derive(Clone, Copy, Debug)]
pub struct CopyKernel(&'static Kernel<CopyFn>);

impl CopyKernel {
    /// The kernel's name, as [`crate::selected`] prints it.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// The `SLUICE_SIMD` path that enables this kernel.
    pub fn path(&self) -> &'static str {
        arch::PATHS[self.0.path]
    }

    /// [`crate::copy`] done by this kernel. Panics when the lengths differ.
    pub fn copy(&self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(
            dst.len(),
            src.len(),
            "copy: destination and source lengths differ"
        );
        if src.is_empty() {
            return;
        }
        // SAFETY: the CPU supports the kernel (`copy_kernels` filters on
        // `supported`); the slices are valid, equally long and disjoint.
        unsafe { (self.0.func)(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
    }
}

/// The CRC32C kernels this CPU can run, fastest first, the scalar oracle last.
pub fn crc32c_kernels() -> Vec<CrcKernel> {
    arch::CRC_KERNELS
        .iter()
        .filter(|k| (k.supported)())
        .map(CrcKernel)
        .collect()
}

/// The copy kernels this CPU can run, fastest first, the scalar copy last.
pub fn copy_kernels() -> Vec<CopyKernel> {
    arch::COPY_KERNELS
        .iter()
        .filter(|k| (k.supported)())
        .map(CopyKernel)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scalar;

    /// xorshift64*: deterministic test data without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// A buffer whose byte `i` of the returned range sits at address ≡ i
    /// (mod 64), so `&buf[m..]` is misaligned by exactly `m`.
    struct Aligned {
        storage: Vec<u8>,
        start: usize,
        len: usize,
    }

    impl Aligned {
        fn new(len: usize) -> Self {
            let storage = vec![0u8; len + 64];
            let start = (64 - storage.as_ptr() as usize % 64) % 64;
            Aligned {
                storage,
                start,
                len,
            }
        }

        fn bytes(&mut self) -> &mut [u8] {
            &mut self.storage[self.start..self.start + self.len]
        }
    }

    fn simd_crc_kernels() -> Vec<CrcKernel> {
        let all = crc32c_kernels();
        println!("crc32c kernels: {:?}", names(all.iter().map(|k| k.name())));
        all
    }

    fn names<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
        it.collect()
    }

    #[test]
    fn rfc3720_b4_known_answers_for_every_kernel() {
        let inc: Vec<u8> = (0u8..32).collect();
        let dec: Vec<u8> = (0u8..32).rev().collect();
        // The iSCSI SCSI Read (10) command PDU of RFC 3720 B.4.
        let mut pdu = [0u8; 48];
        pdu[0] = 0x01;
        pdu[1] = 0xC0;
        pdu[16] = 0x14;
        pdu[22] = 0x04;
        pdu[27] = 0x14;
        pdu[31] = 0x18;
        pdu[32] = 0x28;
        pdu[40] = 0x02;
        let cases: [(&[u8], u32); 5] = [
            (&[0u8; 32], 0x8A91_36AA),
            (&[0xFFu8; 32], 0x62A8_AB43),
            (&inc, 0x46DD_794E),
            (&dec, 0x113F_DB5C),
            (&pdu, 0xD996_3A56),
        ];
        for k in simd_crc_kernels() {
            for (data, want) in cases {
                assert_eq!(k.crc32c(0, data), want, "{} on {data:02x?}", k.name());
            }
            assert_eq!(k.crc32c(0, b"123456789"), 0xE306_9283, "{}", k.name());
        }
    }

    #[test]
    fn crc_every_length_to_4096_at_every_misalignment() {
        let mut rng = Rng(0x5EED_0001);
        let max = 4096;
        let mut buf = Aligned::new(max + 64);
        let fill = rng.bytes(max + 64);
        buf.bytes().copy_from_slice(&fill);
        let kernels = simd_crc_kernels();
        let buf = buf.bytes();
        for misalign in 0..64 {
            let data = &buf[misalign..misalign + max];
            let seed = rng.next() as u32;
            // The oracle for every prefix, incrementally.
            let mut state = !seed;
            let mut want = Vec::with_capacity(max + 1);
            want.push(!state);
            for &b in data {
                state = scalar::crc32c_raw(state, &[b]);
                want.push(!state);
            }
            for k in &kernels {
                for len in 0..=max {
                    let got = k.crc32c(seed, &data[..len]);
                    assert_eq!(
                        got,
                        want[len],
                        "{} len {len} misalignment {misalign}",
                        k.name()
                    );
                }
            }
        }
    }

    #[test]
    fn crc_random_lengths_up_to_16_mib() {
        let mut rng = Rng(0x5EED_0002);
        let max = 16 << 20;
        let data = rng.bytes(max + 64);
        let kernels = simd_crc_kernels();
        let mut lengths = vec![max, max - 1, (1 << 20) + 7, 65_536 + 13];
        for _ in 0..6 {
            lengths.push(rng.below(max + 1));
        }
        for len in lengths {
            let off = rng.below(64);
            let seed = rng.next() as u32;
            let piece = &data[off..off + len];
            let want = scalar::crc32c(seed, piece);
            for k in &kernels {
                assert_eq!(k.crc32c(seed, piece), want, "{} len {len}", k.name());
            }
        }
    }

    #[test]
    fn combine_equals_crc_of_concatenation_for_every_kernel() {
        let mut rng = Rng(0x5EED_0003);
        let data = rng.bytes(300_000);
        for k in simd_crc_kernels() {
            for _ in 0..20 {
                let split = rng.below(data.len() + 1);
                let (a, b) = data.split_at(split);
                let whole = k.crc32c(0, &data);
                let combined =
                    crate::crc32c_combine(k.crc32c(0, a), k.crc32c(0, b), b.len() as u64);
                assert_eq!(combined, whole, "{} split {split}", k.name());
                assert_eq!(k.crc32c(k.crc32c(0, a), b), whole, "{} chained", k.name());
            }
        }
    }

    fn copy_kernels_logged() -> Vec<CopyKernel> {
        let all = copy_kernels();
        println!("copy kernels: {:?}", names(all.iter().map(|k| k.name())));
        all
    }

    const GUARD: usize = 64;
    const CANARY: u8 = 0xA5;

    /// Copies `len` bytes at source misalignment `s` and destination
    /// misalignment `d` with `k`, checking the bytes and that nothing
    /// outside the destination range was written.
    fn check_copy(
        k: &CopyKernel,
        src_buf: &mut Aligned,
        dst_buf: &mut Aligned,
        s: usize,
        d: usize,
        len: usize,
    ) {
        let dst_all = dst_buf.bytes();
        let region = &mut dst_all[..GUARD + d + len + GUARD];
        region.fill(CANARY);
        let src = &src_buf.bytes()[s..s + len];
        k.copy(&mut region[GUARD + d..GUARD + d + len], src);
        let ok_bytes = region[GUARD + d..GUARD + d + len] == *src;
        let ok_before = region[..GUARD + d].iter().all(|&b| b == CANARY);
        let ok_after = region[GUARD + d + len..].iter().all(|&b| b == CANARY);
        assert!(
            ok_bytes && ok_before && ok_after,
            "{}: len {len} src misalignment {s} dst misalignment {d}: \
             bytes {ok_bytes} guard-before {ok_before} guard-after {ok_after}",
            k.name()
        );
    }

    #[test]
    fn copy_every_length_to_4096_at_every_misalignment() {
        let mut rng = Rng(0x5EED_0004);
        let max = 4096;
        let mut src = Aligned::new(max + 64);
        let fill = rng.bytes(max + 64);
        src.bytes().copy_from_slice(&fill);
        let mut dst = Aligned::new(max + 64 + 2 * GUARD);
        for k in copy_kernels_logged() {
            for len in 0..=max {
                // Every source misalignment for every length, the
                // destination misalignment walking through 0..64 too.
                for s in 0..64 {
                    let d = (s * 7 + len) % 64;
                    check_copy(&k, &mut src, &mut dst, s, d, len);
                }
            }
            // The full 64 × 64 grid at the sizes where kernels change tier.
            for len in [
                1, 15, 16, 33, 64, 100, 128, 129, 255, 256, 257, 511, 1024, 4096,
            ] {
                for s in 0..64 {
                    for d in 0..64 {
                        check_copy(&k, &mut src, &mut dst, s, d, len);
                    }
                }
            }
        }
    }

    #[test]
    fn copy_random_lengths_up_to_16_mib() {
        let mut rng = Rng(0x5EED_0005);
        let max = 16 << 20;
        let mut src = Aligned::new(max + 64);
        let fill = rng.bytes(max + 64);
        src.bytes().copy_from_slice(&fill);
        let mut dst = Aligned::new(max + 64 + 2 * GUARD);
        let mut lengths = vec![max, max - 1, (8 << 20) + 3, (1 << 20) + 5];
        for _ in 0..4 {
            lengths.push(rng.below(max + 1));
        }
        for k in copy_kernels_logged() {
            for &len in &lengths {
                let (s, d) = (rng.below(64), rng.below(64));
                check_copy(&k, &mut src, &mut dst, s, d, len);
            }
        }
    }

    #[test]
    fn kernel_lists_name_their_paths() {
        for k in crc32c_kernels() {
            assert!(arch::PATHS.contains(&k.path()), "{}", k.name());
        }
        for k in copy_kernels() {
            assert!(arch::PATHS.contains(&k.path()), "{}", k.name());
        }
        assert_eq!(crc32c_kernels().last().map(|k| k.name()), Some("scalar"));
        assert_eq!(copy_kernels().last().map(|k| k.name()), Some("scalar"));
    }
}
