//! Criterion benchmarks of every copy and CRC32C kernel this CPU runs,
//! side by side with the references in one group per size:
//! `std::ptr::copy_nonoverlapping` (the C library's `memcpy`) for copy, the
//! `crc-fast` and `crc32c` crates for CRC32C. Criterion prints each
//! function's GB/s; `sluice bench copy` prints the same comparison as
//! ratios.
//!
//! `cargo bench -p sluice-simd --bench kernels`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const SIZES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 64 << 20];

fn label(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{}MiB", size >> 20)
    } else {
        format!("{}KiB", size >> 10)
    }
}

fn data(size: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn tune<'c>(
    c: &'c mut Criterion,
    size: usize,
    name: &str,
) -> criterion::BenchmarkGroup<'c, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(format!("{name}/{}", label(size)));
    g.throughput(Throughput::Bytes(size as u64));
    if size >= 4 << 20 {
        g.sample_size(10);
    }
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(500));
    g
}

fn crc(c: &mut Criterion) {
    eprintln!("sluice-simd selected: {}", sluice_simd::selected());
    for size in SIZES {
        let buf = data(size);
        let mut g = tune(c, size, "crc32c");
        for k in sluice_simd::crc32c_kernels() {
            g.bench_function(BenchmarkId::new("sluice", k.name()), |b| {
                b.iter(|| k.crc32c(0, black_box(&buf)))
            });
        }
        g.bench_function("crc-fast", |b| {
            b.iter(|| crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, black_box(&buf)))
        });
        g.bench_function("crc32c-crate", |b| {
            b.iter(|| crc32c::crc32c(black_box(&buf)))
        });
        g.finish();
    }
}

fn copy(c: &mut Criterion) {
    for size in SIZES {
        let src = data(size);
        let mut dst = vec![0u8; size];
        let mut g = tune(c, size, "copy");
        for k in sluice_simd::copy_kernels() {
            g.bench_function(BenchmarkId::new("sluice", k.name()), |b| {
                b.iter(|| k.copy(black_box(&mut dst), black_box(&src)))
            });
        }
        g.bench_function("copy_nonoverlapping", |b| {
            b.iter(|| {
                // SAFETY: distinct live buffers of `size` bytes each.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        black_box(src.as_ptr()),
                        black_box(dst.as_mut_ptr()),
                        size,
                    )
                }
            })
        });
        g.finish();
    }
}

criterion_group!(kernels, crc, copy);
criterion_main!(kernels);
