//! `sluice objbench --storage s3|file --bucket ...`: throughput of an object
//! store as the engine uses it — block-sized objects up and down, small
//! objects, HEAD, LIST and DELETE — from N threads, printed the way
//! `juicefs objbench` prints it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sluice_engine::format::{Credentials, Secret};
use sluice_engine::object::{ObjectStore, S3Options, open_store};
use sluice_engine::size::{SizeRange, Unit, size_parser};

/// Arguments of `sluice objbench`.
#[derive(Debug, clap::Args)]
pub struct ObjbenchArgs {
    /// Object storage kind: file or s3.
    #[arg(long, default_value = "file", value_parser = ["file", "s3"])]
    pub storage: String,
    /// A directory (file) or a bucket URL (s3: http(s)://HOST[:PORT]/BUCKET);
    /// a missing bucket is created. Objects go under objbench/RANDOM/ and
    /// are deleted at the end.
    #[arg(long)]
    pub bucket: String,
    /// S3 access key id (default: the environment's or the AWS profile's).
    #[arg(long)]
    pub access_key: Option<String>,
    /// S3 secret access key.
    #[arg(long)]
    pub secret_key: Option<Secret>,
    /// S3 region (default: the AWS host's, then AWS_REGION, then us-east-1).
    #[arg(long)]
    pub region: Option<String>,
    /// Concurrent requests.
    #[arg(long, short = 'p', default_value_t = 4)]
    pub threads: usize,
    /// Size of a big object (a block; a size, a bare number is bytes).
    #[arg(long, default_value = "4M", value_parser = size_parser(Unit::Bytes, SizeRange::new(1, 1 << 30)))]
    pub big_size: u64,
    /// Number of big objects.
    #[arg(long, default_value_t = 32)]
    pub big_count: usize,
    /// Size of a small object (a size, a bare number is bytes).
    #[arg(long, default_value = "4K", value_parser = size_parser(Unit::Bytes, SizeRange::new(1, 1 << 30)))]
    pub small_size: u64,
    /// Number of small objects.
    #[arg(long, default_value_t = 100)]
    pub count: usize,
}

/// Full listings timed in the LIST phase.
const LIST_ROUNDS: usize = 3;

/// One measured phase.
struct Phase {
    item: &'static str,
    ops: usize,
    bytes: u64,
    wall: Duration,
    busy: Duration,
}

impl Phase {
    fn row(&self, unit: &str) -> (String, String) {
        let secs = self.wall.as_secs_f64().max(1e-9);
        let value = if unit == "MiB/s" {
            format!("{:.2} MiB/s", self.bytes as f64 / secs / (1 << 20) as f64)
        } else {
            format!("{:.1} {unit}", self.ops as f64 / secs)
        };
        let cost = self.busy.as_secs_f64() * 1000.0 / self.ops.max(1) as f64;
        (value, format!("{cost:.2} ms/object"))
    }
}

/// Runs `op(i)` for i in 0..n over `threads` threads; returns the wall
/// time and the summed time of the calls.
fn parallel<F>(n: usize, threads: usize, op: F) -> anyhow::Result<(Duration, Duration)>
where
    F: Fn(usize) -> anyhow::Result<()> + Sync,
{
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let results: Vec<anyhow::Result<Duration>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.clamp(1, n.max(1)))
            .map(|_| {
                s.spawn(|| {
                    let mut busy = Duration::ZERO;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(busy);
                        }
                        let t = Instant::now();
                        op(i)?;
                        busy += t.elapsed();
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a benchmark thread panicked")))
            })
            .collect()
    });
    let wall = start.elapsed();
    let mut busy = Duration::ZERO;
    for r in results {
        busy += r?;
    }
    Ok((wall, busy))
}

/// Bytes that differ per object, cheap to make.
fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn phase<F>(item: &'static str, n: usize, size: u64, threads: usize, op: F) -> anyhow::Result<Phase>
where
    F: Fn(usize) -> anyhow::Result<()> + Sync,
{
    let (wall, busy) = parallel(n, threads, op).with_context(|| format!("{item} failed"))?;
    Ok(Phase {
        item,
        ops: n,
        bytes: n as u64 * size,
        wall,
        busy,
    })
}

/// Runs `sluice objbench`.
pub fn run(args: ObjbenchArgs) -> anyhow::Result<()> {
    if args.threads == 0 || args.count == 0 || args.big_count == 0 {
        bail!("--threads, --count and --big-count must be at least 1");
    }
    if args.access_key.is_some() != args.secret_key.is_some() {
        bail!("give --access-key and --secret-key together");
    }
    let creds = Credentials {
        access_key: args.access_key.clone().unwrap_or_default(),
        secret_key: args.secret_key.clone().unwrap_or_default(),
        session_token: Secret::default(),
    };
    let s3 = S3Options {
        region: args.region.clone(),
        max_uploads: args.threads.max(S3Options::default().max_uploads),
        ..S3Options::default()
    };
    let store = open_store(&args.storage, &args.bucket, &creds, &s3, true)
        .with_context(|| format!("cannot open {} bucket {}", args.storage, args.bucket))?;
    let store: &dyn ObjectStore = &*store;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let prefix = format!("objbench/{stamp:x}-{}/", std::process::id());
    let big_key = |i: usize| format!("{prefix}big/{i:06}");
    let small_key = |i: usize| format!("{prefix}small/{i:06}");
    let (big_n, small_n, threads) = (args.big_count, args.count, args.threads);
    let big_len = args.big_size as usize;
    let small_len = args.small_size as usize;
    println!(
        "objbench on {}: {} x {} big, {} x {} small objects, {} threads",
        store.describe(),
        big_n,
        human(args.big_size),
        small_n,
        human(args.small_size),
        threads
    );

    // Payloads are made before the clock starts; each object differs.
    let bigs: Vec<Vec<u8>> = (0..big_n.min(threads * 2))
        .map(|i| payload(big_len, i as u64 + 1))
        .collect();
    let big_of = |i: usize| &bigs[i % bigs.len()];
    let smalls: Vec<Vec<u8>> = (0..small_n.min(64))
        .map(|i| payload(small_len, 1_000_000 + i as u64))
        .collect();
    let small_of = |i: usize| &smalls[i % smalls.len()];

    let mut rows: Vec<(Phase, &str)> = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        rows.push((
            phase("upload objects", big_n, args.big_size, threads, |i| {
                Ok(store.put(&big_key(i), big_of(i), None)?)
            })?,
            "MiB/s",
        ));
        rows.push((
            phase("download objects", big_n, args.big_size, threads, |i| {
                let got = store.get(&big_key(i))?;
                if &got != big_of(i) {
                    bail!("{} came back different", big_key(i));
                }
                Ok(())
            })?,
            "MiB/s",
        ));
        rows.push((
            phase(
                "put small objects",
                small_n,
                args.small_size,
                threads,
                |i| Ok(store.put(&small_key(i), small_of(i), None)?),
            )?,
            "objects/s",
        ));
        rows.push((
            phase(
                "get small objects",
                small_n,
                args.small_size,
                threads,
                |i| {
                    let got = store.get(&small_key(i))?;
                    if &got != small_of(i) {
                        bail!("{} came back different", small_key(i));
                    }
                    Ok(())
                },
            )?,
            "objects/s",
        ));
        // LIST: a few full listings of everything written; objects/s counts
        // the entries listed.
        let total = big_n + small_n;
        let list = phase("list objects", LIST_ROUNDS, 0, 1, |_| {
            let n = store.list(&prefix)?.len();
            if n != total {
                bail!("listed {n} objects under {prefix}, wrote {total}");
            }
            Ok(())
        })?;
        rows.push((
            Phase {
                ops: LIST_ROUNDS * total,
                ..list
            },
            "list",
        ));
        rows.push((
            phase("head objects", small_n, 0, threads, |i| {
                let info = store.head(&small_key(i))?;
                if info.size != small_len as u64 {
                    bail!(
                        "{} has {} bytes, wrote {small_len}",
                        small_key(i),
                        info.size
                    );
                }
                Ok(())
            })?,
            "objects/s",
        ));
        rows.push((
            phase("delete objects", small_n + big_n, 0, threads, |i| {
                if i < small_n {
                    Ok(store.delete(&small_key(i))?)
                } else {
                    Ok(store.delete(&big_key(i - small_n))?)
                }
            })?,
            "objects/s",
        ));
        Ok(())
    })();
    if result.is_err() {
        // Leave no benchmark objects behind, best effort.
        for i in 0..big_n {
            let _ = store.delete(&big_key(i));
        }
        for i in 0..small_n {
            let _ = store.delete(&small_key(i));
        }
    }
    result?;

    let table: Vec<(String, String, String)> = rows
        .iter()
        .map(|(p, unit)| {
            let (value, cost) = if *unit == "list" {
                // The cost of one full listing (pages of up to 1000 entries).
                let per_call = p.busy.as_secs_f64() * 1000.0 / LIST_ROUNDS as f64;
                (
                    format!(
                        "{:.1} objects/s",
                        p.ops as f64 / p.wall.as_secs_f64().max(1e-9)
                    ),
                    format!("{per_call:.2} ms/op"),
                )
            } else {
                p.row(unit)
            };
            (p.item.to_string(), value, cost)
        })
        .collect();
    print_table(&table);
    Ok(())
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn print_table(rows: &[(String, String, String)]) {
    let head = ("ITEM", "VALUE", "COST");
    let w0 = rows
        .iter()
        .map(|r| r.0.len())
        .chain([head.0.len()])
        .max()
        .unwrap_or(4)
        + 2;
    let w1 = rows
        .iter()
        .map(|r| r.1.len())
        .chain([head.1.len()])
        .max()
        .unwrap_or(5)
        + 2;
    let w2 = rows
        .iter()
        .map(|r| r.2.len())
        .chain([head.2.len()])
        .max()
        .unwrap_or(4)
        + 2;
    let rule = format!("+{}+{}+{}+", "-".repeat(w0), "-".repeat(w1), "-".repeat(w2));
    println!("{rule}");
    println!("|{:^w0$}|{:^w1$}|{:^w2$}|", head.0, head.1, head.2);
    println!("{rule}");
    for (a, b, c) in rows {
        println!(
            "|{a:>w0$}|{b:>w1$}|{c:>w2$}|",
            a = format!("{a} "),
            b = format!("{b} "),
            c = format!("{c} ")
        );
    }
    println!("{rule}");
}
