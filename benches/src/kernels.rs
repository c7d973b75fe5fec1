//! `sluice bench copy`: the copy and CRC32C kernels against their
//! references, measured side by side in one run on the user's own host.
//!
//! Copy is compared with `std::ptr::copy_nonoverlapping` (the C library's
//! `memcpy`), CRC32C with the `crc-fast` and `crc32c` crates. Every kernel
//! this CPU runs is measured, the dispatched one (what sluice uses) first;
//! the ratios compare the dispatched kernel with each reference.

use std::fmt;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// The sizes the issue asks for: 4 KiB, 64 KiB, 1 MiB, 4 MiB, 64 MiB.
pub const DEFAULT_SIZES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 64 << 20];

/// Rounds per contender: the best round counts, so a burst of noise from
/// another process costs one round, not the result.
const ROUNDS: u32 = 5;

/// One measured contender at one size.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// What was measured, e.g. `sluice avx2` or `memcpy`.
    pub name: String,
    /// Best-round throughput in GB/s (10^9 bytes per second).
    pub gbps: f64,
}

/// All contenders of one operation at one size.
#[derive(Debug, Clone)]
pub struct Case {
    /// `copy` or `crc32c`.
    pub operation: &'static str,
    /// Bytes per call.
    pub size: usize,
    /// The dispatched sluice kernel first, then every other sluice kernel,
    /// then the references.
    pub results: Vec<Measurement>,
    /// How many entries at the end of `results` are references.
    pub references: usize,
}

impl Case {
    /// Dispatched sluice kernel's throughput over the reference named `name`.
    pub fn ratio_to(&self, name: &str) -> Option<f64> {
        let ours = self.results.first()?.gbps;
        let theirs = self.results.iter().find(|m| m.name == name)?.gbps;
        Some(ours / theirs)
    }
}

/// The outcome of [`run`]; `Display` prints it as tables.
#[derive(Debug, Clone)]
pub struct Report {
    /// `sluice_simd::selected()` at the time of the run.
    pub selected: String,
    /// One entry per operation and size.
    pub cases: Vec<Case>,
}

/// Measures copy and CRC32C at each of `sizes`, each contender for about
/// `seconds_per_case` seconds of CPU time in total. Throughput is bytes per
/// second of the measuring thread's CPU time.
pub fn run(sizes: &[usize], seconds_per_case: f64) -> Report {
    let per_round = Duration::from_secs_f64((seconds_per_case / f64::from(ROUNDS)).max(0.001));
    let mut cases = Vec::new();
    for &size in sizes {
        let src = test_data(size);
        cases.push(copy_case(&src, per_round));
        cases.push(crc_case(&src, per_round));
    }
    Report {
        selected: sluice_simd::selected(),
        cases,
    }
}

/// A contender: one call processes `size` bytes.
type Contender<'a> = (String, Box<dyn FnMut() + 'a>);

fn copy_case(src: &[u8], per_round: Duration) -> Case {
    let size = src.len();
    let dispatched = sluice_simd::selected();
    let mut dst = vec![0u8; size];
    let dst_ptr = dst.as_mut_ptr();
    let mut contenders: Vec<Contender<'_>> = Vec::new();
    contenders.push((
        format!("sluice {}", field(&dispatched, "copy")),
        Box::new(move || {
            // SAFETY: `dst` (owned by this function, outliving the
            // closures) and `src` are distinct buffers of `size` bytes.
            unsafe { sluice_simd::copy_raw(black_box(dst_ptr), black_box(src.as_ptr()), size) }
        }),
    ));
    for k in sluice_simd::copy_kernels() {
        contenders.push((
            format!("{} kernel", k.name()),
            Box::new(move || {
                // SAFETY: as above; a shared pointer keeps the closures
                // from each holding `&mut dst`.
                let d = unsafe { std::slice::from_raw_parts_mut(dst_ptr, size) };
                k.copy(black_box(d), black_box(src));
            }),
        ));
    }
    contenders.push((
        "memcpy".to_string(),
        Box::new(move || {
            // SAFETY: as above.
            unsafe {
                std::ptr::copy_nonoverlapping(black_box(src.as_ptr()), black_box(dst_ptr), size)
            }
        }),
    ));
    let results = measure(size, contenders, per_round);
    // Keep `dst` alive to here: the closures write through its pointer.
    black_box(&mut dst);
    Case {
        operation: "copy",
        size,
        results,
        references: 1,
    }
}

fn crc_case(data: &[u8], per_round: Duration) -> Case {
    let dispatched = sluice_simd::selected();
    let mut contenders: Vec<Contender<'_>> = vec![(
        format!("sluice {}", field(&dispatched, "crc32c")),
        Box::new(move || {
            black_box(sluice_simd::crc32c(0, black_box(data)));
        }),
    )];
    for k in sluice_simd::crc32c_kernels() {
        contenders.push((
            format!("{} kernel", k.name()),
            Box::new(move || {
                black_box(k.crc32c(0, black_box(data)));
            }),
        ));
    }
    contenders.push((
        "crc-fast".to_string(),
        Box::new(move || {
            black_box(crc_fast::checksum(
                crc_fast::CrcAlgorithm::Crc32Iscsi,
                black_box(data),
            ));
        }),
    ));
    contenders.push((
        "crc32c crate".to_string(),
        Box::new(move || {
            black_box(crc32c::crc32c(black_box(data)));
        }),
    ));
    Case {
        operation: "crc32c",
        size: data.len(),
        results: measure(data.len(), contenders, per_round),
        references: 2,
    }
}

/// CPU time of the calling thread: time the scheduler gives to other
/// processes on a shared host does not count against a kernel.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        // Not expected on Linux; fall back to a monotonic clock reading.
        return Instant::now().duration_since(*EPOCH.get_or_init(Instant::now));
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Runs the contenders round-robin, `ROUNDS` times, each for `per_round`
/// of thread CPU time, and keeps each one's best round.
fn measure(
    size: usize,
    mut contenders: Vec<Contender<'_>>,
    per_round: Duration,
) -> Vec<Measurement> {
    let mut best = vec![0f64; contenders.len()];
    // Reading the thread's CPU clock is a system call: read it about every
    // 256 KiB processed so that it costs nothing measurable.
    let batch = (256usize << 10).div_ceil(size.max(1)) as u64;
    for (_, f) in contenders.iter_mut() {
        f(); // warm caches, page in the destination, resolve dispatch
    }
    for _ in 0..ROUNDS {
        for (i, (_, f)) in contenders.iter_mut().enumerate() {
            let start = thread_cpu_time();
            let mut calls = 0u64;
            let elapsed = loop {
                for _ in 0..batch {
                    f();
                }
                calls += batch;
                let e = thread_cpu_time().saturating_sub(start);
                if e >= per_round {
                    break e;
                }
            };
            let gbps = (calls as f64 * size as f64) / elapsed.as_secs_f64() / 1e9;
            best[i] = best[i].max(gbps);
        }
    }
    contenders
        .into_iter()
        .zip(best)
        .map(|((name, _), gbps)| Measurement { name, gbps })
        .collect()
}

/// The value of `key=` in a `selected()` line, e.g. `avx2` for `copy`.
fn field(selected: &str, key: &str) -> String {
    selected
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.rsplit('/').next().unwrap_or(v).to_string())
        .unwrap_or_else(|| "?".to_string())
}

/// Deterministic, incompressible-looking bytes.
fn test_data(size: usize) -> Vec<u8> {
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

fn size_label(size: usize) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 && size.is_multiple_of(1 << 10) {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kernels: {}", self.selected)?;
        for operation in ["copy", "crc32c"] {
            let cases: Vec<&Case> = self
                .cases
                .iter()
                .filter(|c| c.operation == operation)
                .collect();
            let Some(first) = cases.first() else { continue };
            writeln!(f)?;
            write!(f, "{operation:<8} {:>8}", "size")?;
            for m in &first.results {
                write!(f, " {:>16}", m.name)?;
            }
            let refs = &first.results[first.results.len() - first.references..];
            for r in refs {
                write!(f, " {:>14}", format!("vs {}", r.name))?;
            }
            writeln!(f, "   (GB/s; ratio = sluice / reference)")?;
            for c in cases {
                write!(f, "{:<8} {:>8}", "", size_label(c.size))?;
                for m in &c.results {
                    write!(f, " {:>16.2}", m.gbps)?;
                }
                for r in &c.results[c.results.len() - c.references..] {
                    match c.ratio_to(&r.name) {
                        Some(x) => write!(f, " {:>13.2}×", x)?,
                        None => write!(f, " {:>14}", "-")?,
                    }
                }
                writeln!(f)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_measures_every_contender_and_formats_ratios() {
        let report = run(&[4096], 0.01);
        assert_eq!(report.cases.len(), 2);
        for c in &report.cases {
            assert!(c.results.iter().all(|m| m.gbps > 0.0), "{c:?}");
        }
        let copy = &report.cases[0];
        assert_eq!(copy.results.last().map(|m| m.name.as_str()), Some("memcpy"));
        assert!(copy.ratio_to("memcpy").is_some());
        let crc = &report.cases[1];
        assert!(crc.ratio_to("crc-fast").is_some() && crc.ratio_to("crc32c crate").is_some());
        let text = report.to_string();
        assert!(
            text.contains("vs memcpy") && text.contains("vs crc-fast"),
            "{text}"
        );
        assert!(text.contains("4 KiB"), "{text}");
    }

    #[test]
    fn field_reads_the_selected_line() {
        let line = "crc32c=x86_64/avx2-vpclmulqdq copy=x86_64/avx2 (auto)";
        assert_eq!(field(line, "copy"), "avx2");
        assert_eq!(field(line, "crc32c"), "avx2-vpclmulqdq");
        assert_eq!(field(line, "none"), "?");
    }
}
