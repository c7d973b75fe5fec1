//! End-to-end: the Prometheus endpoint of a running `sluice mount` and
//! `sluice serve` (driven by the virtio-fs harness) during traffic. The
//! exposition parses with Prometheus's own `promtool`, carries JuiceFS's
//! metric names and labels, and its counters move exactly as the traffic
//! does; its families, types and label names are those of a live `juicefs
//! mount --metrics` (SLUICE_JUICEFS_BIN) but for a listed few; it is
//! gzipped for a scraper that asks; `sluice stats` prints its frames.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    Mount, SLUICE, Serve, Volume, Watchdog, lazy_unmount, metrics_addr, mount_type, scrape, text,
};
use sluice_benches::virtiofs::wire::ROOT_ID;
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue};

/// Series by name: (labels, value).
type Series = HashMap<String, Vec<(HashMap<String, String>, f64)>>;

fn parse(text: &str) -> Series {
    let mut out: Series = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (head, value) = line.rsplit_once(' ').expect("NAME VALUE");
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => {
                let labels = rest
                    .trim_end_matches('}')
                    .split("\",")
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once("=\"").expect("k=\"v\"");
                        (k.to_owned(), v.trim_end_matches('"').to_owned())
                    })
                    .collect();
                (n, labels)
            }
            None => (head, HashMap::new()),
        };
        out.entry(name.to_owned())
            .or_default()
            .push((labels, value.parse().expect("a number")));
    }
    out
}

/// The sum of `name`'s series whose labels include `with`.
fn value(s: &Series, name: &str, with: &[(&str, &str)]) -> f64 {
    s.get(name)
        .unwrap_or_else(|| panic!("no {name} in the scrape"))
        .iter()
        .filter(|(l, _)| with.iter().all(|(k, v)| l.get(*k).is_some_and(|x| x == v)))
        .map(|(_, v)| v)
        .sum()
}

/// `promtool check metrics` on `text`: it must parse (exit 0, or 3 for
/// lint findings), and the only findings allowed are those about the
/// JuiceFS names sluice keeps on purpose (JuiceFS's own endpoint draws the
/// same: its histogram names contain "histogram", its counters have no
/// `_total`).
fn promtool_check(text: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        if std::env::var_os("CI").is_some() {
            panic!("promtool is missing (test.sh installs Debian's prometheus package)");
        }
        eprintln!("SKIPPED: promtool check (no promtool; apt-get install prometheus)");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let code = out.status.code();
    assert!(
        matches!(code, Some(0 | 3)),
        "promtool failed ({code:?}): {said}"
    );
    for finding in said.lines().filter(|l| !l.trim().is_empty()) {
        let juicefs_name = finding.starts_with("juicefs_");
        let kept = finding.ends_with(" metric name should not include type 'histogram'")
            || finding.ends_with(" counter metrics should have \"_total\" suffix");
        assert!(juicefs_name && kept, "promtool: {finding}");
    }
}

fn assert_juicefs_names(s: &Series, mp: &str) {
    let version = format!("sluice-{}", env!("CARGO_PKG_VERSION"));
    for name in [
        "juicefs_uptime",
        "juicefs_cpu_usage",
        "juicefs_used_space",
        "juicefs_used_inodes",
        "juicefs_fuse_ops_durations_histogram_seconds_count",
        "juicefs_fuse_ops_total",
        "juicefs_fuse_ops_io_errors",
        "juicefs_meta_ops_total",
        "juicefs_meta_ops_durations_histogram_seconds_count",
        "juicefs_total_space",
        "juicefs_total_inodes",
        "juicefs_fuse_open_handlers",
        "juicefs_used_buffer_size_bytes",
        "juicefs_staging_blocks",
        "juicefs_fuse_read_size_bytes_sum",
        "juicefs_fuse_written_size_bytes_sum",
        "juicefs_blockcache_hits",
        "juicefs_blockcache_miss",
        "juicefs_blockcache_hit_bytes",
        "juicefs_blockcache_bytes",
        "juicefs_object_request_durations_histogram_seconds_bucket",
        "juicefs_object_request_data_bytes",
        "juicefs_object_request_errors",
        "juicefs_transaction_durations_histogram_seconds_count",
        "juicefs_transaction_restart",
    ] {
        let series = s.get(name).unwrap_or_else(|| panic!("no {name}"));
        for (labels, _) in series {
            assert_eq!(
                labels.get("vol_name").map(String::as_str),
                Some("metrics"),
                "{name}"
            );
            assert_eq!(labels.get("mp").map(String::as_str), Some(mp), "{name}");
            assert_eq!(
                labels.get("juicefs_version").map(String::as_str),
                Some(version.as_str()),
                "{name}"
            );
            assert!(
                labels.get("instance").is_some_and(|h| !h.is_empty()),
                "{name}: no instance label"
            );
        }
    }
}

#[test]
fn a_mount_reports_its_traffic() {
    let _dog = Watchdog::new("metrics-mount", Duration::from_secs(300));
    let vol = Volume::format("metrics", &[]);
    let mnt = vol.dir.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let log = vol.dir.path().join("mount.log");
    let mount = Mount::start(&vol.meta_url, &mnt, &log, &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&|| mount.log_text());
    let mp = mnt.to_str().unwrap();

    let before = parse(&scrape(&addr));
    let data: Vec<u8> = (0..5 << 20).map(|i: u32| (i % 251) as u8).collect();
    fs::write(mnt.join("f"), &data).unwrap();
    // A file the kernel has not cached: reopen after dropping its pages.
    fs::write("/proc/sys/vm/drop_caches", "1").ok();
    assert_eq!(fs::read(mnt.join("f")).unwrap(), data);
    assert!(fs::metadata(mnt.join("missing")).is_err());
    let scraped = scrape(&addr);
    promtool_check(&scraped);
    let after = parse(&scraped);
    assert_juicefs_names(&after, mp);

    let d = |name: &str, with: &[(&str, &str)]| {
        value(&after, name, with) - before.get(name).map_or(0.0, |_| value(&before, name, with))
    };
    // Every byte written went through WRITE requests.
    assert_eq!(
        d("juicefs_fuse_written_size_bytes_sum", &[]),
        data.len() as f64
    );
    // The kernel reads at least the file (readahead may add a little).
    let read = d("juicefs_fuse_read_size_bytes_sum", &[]);
    assert!(read >= data.len() as f64, "{read} bytes of READ replies");
    // JuiceFS's method names: lower case, one per operation.
    assert!(d("juicefs_fuse_ops_total", &[("method", "write")]) >= 5.0);
    assert!(d("juicefs_fuse_ops_total", &[("method", "read")]) >= 1.0);
    assert_eq!(d("juicefs_fuse_ops_total", &[("method", "create")]), 1.0);
    for (labels, _) in &after["juicefs_fuse_ops_total"] {
        let m = &labels["method"];
        assert_eq!(*m, m.to_lowercase(), "method {m}");
    }
    assert!(value(&after, "juicefs_fuse_ops_io_errors", &[("errno", "ENOENT")]) >= 1.0);
    // The metadata operations behind them, by JuiceFS's Meta method names.
    assert_eq!(d("juicefs_meta_ops_total", &[("method", "Mknod")]), 1.0);
    assert!(d("juicefs_meta_ops_total", &[("method", "Lookup")]) >= 1.0);
    assert!(d("juicefs_meta_ops_total", &[("method", "Write")]) >= 1.0);
    // Histogram buckets are cumulative and end at the count.
    let buckets = &after["juicefs_fuse_ops_durations_histogram_seconds_bucket"];
    let inf = buckets
        .iter()
        .find(|(l, _)| l["le"] == "+Inf")
        .expect("a +Inf bucket")
        .1;
    assert_eq!(
        inf,
        value(
            &after,
            "juicefs_fuse_ops_durations_histogram_seconds_count",
            &[]
        )
    );
    let counts: Vec<f64> = buckets.iter().map(|(_, v)| *v).collect();
    let sorted = {
        let mut c = counts.clone();
        c.sort_by(f64::total_cmp);
        c
    };
    assert_eq!(counts, sorted, "bucket counts never fall");
    // The file is closed (the kernel's RELEASE comes a little after) and
    // its writes committed: no handle, no buffer.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = parse(&scrape(&addr));
        let open = value(&now, "juicefs_fuse_open_handlers", &[]);
        let buffered = value(&now, "juicefs_used_buffer_size_bytes", &[]);
        if open == 0.0 && buffered == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} handles open, {buffered} bytes buffered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(value(&after, "juicefs_total_space", &[]) >= data.len() as f64);
    // The 5 MiB went to the object store as 2 blocks (4 MiB + 1 MiB).
    assert_eq!(
        d("juicefs_object_request_data_bytes", &[("method", "PUT")]),
        data.len() as f64
    );
    assert_eq!(value(&after, "juicefs_used_space", &[]), data.len() as f64);
    assert_eq!(value(&after, "juicefs_used_inodes", &[]), 1.0);
    assert!(d("juicefs_transaction_durations_histogram_seconds_count", &[]) >= 1.0);

    // `sluice stats` prints a frame a line while a reader runs.
    let reader_path = mnt.join("f");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let reader = std::thread::spawn(move || {
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = fs::read(&reader_path);
        }
    });
    let out = Command::new(SLUICE)
        .args(["stats", mp, "--count", "3", "--interval", "0.5"])
        .output()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reader.join().unwrap();
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(
        lines.len(),
        5,
        "a two-line header and three frames: {printed}"
    );
    assert!(
        lines[0].contains("fuse") && lines[1].contains("ops/s"),
        "{printed}"
    );
    mount.unmount();
}

#[test]
fn serve_counts_each_queue() {
    let _dog = Watchdog::new("metrics-serve", Duration::from_secs(300));
    let vol = Volume::format("metrics", &[]);
    let host = vol.mount("host");
    let data: Vec<u8> = (0..(3 << 20) + 123).map(|i: u32| (i % 249) as u8).collect();
    fs::write(host.path.join("data"), &data).unwrap();
    host.unmount();

    let socket = vol.dir.path().join("vm.sock");
    let cache = vol.dir.path().join("cache");
    let serve = Serve::start(
        &vol.meta_url,
        &socket,
        &[
            "--queues",
            "2",
            "--no-pin",
            "--cache-size",
            "64",
            "--metrics",
            "127.0.0.1:0",
            "--writeback",
            "--cache-dir",
            cache.to_str().expect("a UTF-8 path"),
            // The test asserts the disk cache's counters: it must not
            // depend on how full the machine's disk is (the default floor
            // keeps 10% free, and CI's disk can be fuller).
            "--free-space-ratio",
            "0",
        ],
    );
    let addr = metrics_addr(&|| serve.log_text());

    let mut device = Device::connect(
        &socket,
        DeviceOptions {
            request_queues: 2,
            queue_size: 256,
            memory_size: 8 << 20,
        },
    )
    .expect("connect");
    let mut q1 = FuseQueue::new(&mut device, 1, 1 << 20).expect("queue 1");
    let mut q2 = FuseQueue::new(&mut device, 2, 1 << 20).expect("queue 2");
    q1.init().expect("INIT");
    let entry = q1.lookup(ROOT_ID, b"data").expect("LOOKUP");
    let fh = q2.open(entry.nodeid, libc::O_RDONLY as u32).expect("OPEN");
    // Queue 2: OPEN, then READs of 1 MiB (the last one short), twice over
    // (cold, then from the memory cache).
    let mut q2_requests = 1;
    let mut read_bytes = 0usize;
    for _ in 0..2 {
        let mut off = 0usize;
        while off < data.len() {
            let got = q2
                .read(entry.nodeid, fh, off as u64, 1 << 20)
                .expect("READ");
            assert_eq!(got[..], data[off..off + got.len()]);
            off += got.len();
            read_bytes += got.len();
            q2_requests += 1;
        }
    }
    assert!(q1.lookup(ROOT_ID, b"missing").is_err());

    // The disk cache writes what a miss fetched in the background (its
    // inserts are queued: engine/src/object/disk_cache.rs), so its write
    // counters move a moment after the READs are answered: scrape until
    // they have, within a bound a background write never needs.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (scraped, s) = loop {
        let scraped = scrape(&addr);
        let s = parse(&scraped);
        if value(&s, "juicefs_blockcache_write_bytes", &[]) >= 1.0 {
            break (scraped, s);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the disk cache wrote none of the fetched blocks: {scraped}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    promtool_check(&scraped);
    let mp = socket.to_str().unwrap();
    for (labels, _) in &s["sluice_virtiofs_requests_total"] {
        assert_eq!(labels.get("vol_name").map(String::as_str), Some("metrics"));
        assert_eq!(labels.get("mp").map(String::as_str), Some(mp));
    }
    // Queue 2 answered exactly what the harness sent it.
    assert_eq!(
        value(&s, "sluice_virtiofs_requests_total", &[("queue", "2")]),
        q2_requests as f64
    );
    assert_eq!(
        value(&s, "sluice_virtiofs_requests_total", &[("queue", "1")]),
        3.0
    );
    // Every READ byte the harness got is counted on queue 2, by path.
    assert_eq!(
        value(&s, "sluice_virtiofs_read_bytes_total", &[("queue", "2")]),
        read_bytes as f64
    );
    assert_eq!(
        value(&s, "sluice_virtiofs_read_bytes_total", &[("queue", "1")]),
        0.0
    );
    // Its replies: the data plus a 16-byte header each, and OPEN's reply.
    let reply_bytes = value(&s, "sluice_virtiofs_reply_bytes_total", &[("queue", "2")]);
    assert_eq!(
        reply_bytes,
        (read_bytes + 16 * (q2_requests - 1) + 16 + 16) as f64
    );
    assert_eq!(
        value(
            &s,
            "sluice_virtiofs_request_duration_seconds_count",
            &[("queue", "2")]
        ),
        q2_requests as f64
    );
    assert_eq!(
        value(&s, "sluice_virtiofs_in_flight", &[("queue", "2")]),
        0.0
    );
    // The same requests, seen by the FUSE layer.
    assert_eq!(
        value(&s, "juicefs_fuse_read_size_bytes_sum", &[]),
        read_bytes as f64
    );
    assert!(value(&s, "juicefs_fuse_ops_io_errors", &[("errno", "ENOENT")]) >= 1.0);
    assert!(value(&s, "juicefs_blockcache_write_bytes", &[]) >= 1.0);
    assert!(value(&s, "juicefs_blockcache_hits", &[]) >= 1.0);
    assert!(
        value(
            &s,
            "juicefs_object_request_data_bytes",
            &[("method", "GET")]
        ) >= data.len() as f64
    );

    // The Grafana dashboard's panels query metrics the daemon serves.
    let dashboard = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/grafana/sluice.json"
    ))
    .unwrap();
    let mut queried = 0;
    for prefix in ["sluice_", "juicefs_"] {
        for part in dashboard.split(prefix).skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            let name = format!("{prefix}{}", name.trim_end_matches("_bucket"));
            assert!(
                scraped.contains(&format!("\n{name}")),
                "the dashboard queries {name}, which the daemon does not serve"
            );
            queried += 1;
        }
    }
    assert!(queried >= 10, "{queried} metrics queried");

    // `sluice stats` names the VM's queues.
    let out = Command::new(SLUICE)
        .arg("stats")
        .arg(&socket)
        .args(["--count", "1", "--interval", "0.2"])
        .output()
        .unwrap();
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(
        printed.contains("queue 1") && printed.contains("queue 2"),
        "{printed}"
    );
    assert_eq!(printed.lines().count(), 3, "{printed}");
}

#[test]
fn a_bad_metrics_address_is_refused_and_a_taken_port_moves_on() {
    let vol = Volume::format("metrics", &[]);
    let mnt = vol.dir.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let out = common::sluice(&[
        "mount",
        &vol.meta_url,
        mnt.to_str().unwrap(),
        "--metrics",
        "not an address",
    ]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--metrics"), "{}", text(&out));

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let log = vol.dir.path().join("mount.log");
    let mount = Mount::start(
        &vol.meta_url,
        &mnt,
        &log,
        &["--metrics", &format!("127.0.0.1:{port}")],
    );
    let addr = metrics_addr(&|| mount.log_text());
    assert_ne!(
        addr,
        format!("127.0.0.1:{port}"),
        "the taken port was skipped"
    );
    assert!(scrape(&addr).contains("juicefs_uptime"));
    assert!(
        mount.log_text().contains("is taken"),
        "{}",
        mount.log_text()
    );
    mount.unmount();
}

/// `GET /metrics` asking for gzip: the reply's head and its body unpacked.
fn scrape_gzip(addr: &str) -> (String, String) {
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: sluice\r\nAccept-Encoding: gzip\r\n\r\n")
        .unwrap();
    let mut reply = Vec::new();
    conn.read_to_end(&mut reply).unwrap();
    let split = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP reply");
    let head = String::from_utf8_lossy(&reply[..split]).into_owned();
    let mut body = String::new();
    flate2::read::GzDecoder::new(&reply[split + 4..])
        .read_to_string(&mut body)
        .expect("a gzip body");
    (head, body)
}

/// A family: its type and the names of its samples' labels (`le` aside).
type Families = BTreeMap<String, (String, BTreeSet<String>)>;

/// The families of an exposition, the Go runtime's and process's aside
/// (`juicefs_go_*`, `juicefs_process_*`: JuiceFS is a Go program).
fn families(text: &str) -> Families {
    let mut out = Families::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE NAME KIND");
            out.insert(name.to_owned(), (kind.to_owned(), BTreeSet::new()));
        }
    }
    for (name, series) in parse(text) {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|base| out.get(*base).is_some_and(|f| f.0 == "histogram"))
            .unwrap_or(&name)
            .to_owned();
        if let Some(f) = out.get_mut(&family) {
            for (labels, _) in series {
                f.1.extend(labels.into_keys().filter(|k| k != "le"));
            }
        }
    }
    out.retain(|name, _| !name.starts_with("juicefs_go_") && !name.starts_with("juicefs_process_"));
    out
}

/// What a mount is given to do before it is scraped: a 5 MiB file
/// written and read back, and a name that does not exist looked up.
fn traffic(mnt: &Path) {
    let data: Vec<u8> = (0..5 << 20).map(|i: u32| (i % 253) as u8).collect();
    fs::write(mnt.join("f"), &data).unwrap();
    fs::write("/proc/sys/vm/drop_caches", "1").ok();
    assert_eq!(fs::read(mnt.join("f")).unwrap(), data);
    assert!(fs::metadata(mnt.join("missing")).is_err());
}

/// A foreground `juicefs mount --metrics 127.0.0.1:0`, killed on drop.
struct JfsMount {
    path: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl JfsMount {
    fn start(bin: &Path, meta_url: &str, mnt: &Path, cache: &Path, log: &Path) -> JfsMount {
        fs::create_dir_all(mnt).unwrap();
        let logf = fs::File::create(log).unwrap();
        let child = Command::new(bin)
            .args(["mount", meta_url])
            .arg(mnt)
            .arg("--cache-dir")
            .arg(cache)
            .args([
                "--metrics",
                "127.0.0.1:0",
                "--no-usage-report",
                "--no-bgjob",
            ])
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("juicefs mount starts");
        let mut m = JfsMount {
            path: mnt.to_owned(),
            log: log.to_owned(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while mount_type(mnt).as_deref() != Some("fuse.juicefs") {
            if let Some(s) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("juicefs mount exited ({s}): {}", m.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "juicefs did not mount within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The address its log says it serves metrics on.
    fn metrics_addr(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log_text();
            if let Some(rest) = log.split("Prometheus metrics listening on \"").nth(1) {
                return rest.split('"').next().unwrap().to_owned();
            }
            assert!(Instant::now() < deadline, "no metrics address: {log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for JfsMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            lazy_unmount(&self.path);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The JuiceFS families a sluice mount does not serve, and why (each is
/// in docs/deployment.md). JuiceFS's automatic metadata backups
/// (`juicefs_last_backup_duration`, `juicefs_last_successful_backup`) are
/// not among them only because the JuiceFS mount here runs with
/// `--no-bgjob`: sluice makes no backups (`sluice dump` does).
const NOT_SERVED: [&str; 1] = [
    // JuiceFS's readahead buffers: sluice's readahead fills the memory
    // block cache (juicefs_store_cache_size_bytes).
    "juicefs_used_read_buffer_size_bytes",
];

/// Served only with a disk cache (JuiceFS always has one: /var/jfsCache by
/// default); the memory cache alone does not time its reads and writes,
/// nor know the bytes of its misses.
const DISK_CACHE_ONLY: [&str; 3] = [
    "juicefs_blockcache_miss_bytes",
    "juicefs_blockcache_read_hist_seconds",
    "juicefs_blockcache_write_hist_seconds",
];

/// Holds `ours` against `theirs`: every JuiceFS family is served with its
/// type and label names, but for `missing`, which must be exactly what is
/// missing.
fn compare(what: &str, theirs: &Families, ours: &Families, missing: &[&str]) {
    let mut absent = Vec::new();
    for (name, (kind, labels)) in theirs {
        match ours.get(name) {
            None => absent.push(name.as_str()),
            Some((k, l)) => {
                assert_eq!(k, kind, "{what}: the type of {name}");
                assert_eq!(l, labels, "{what}: the labels of {name}");
            }
        }
    }
    let mut want = missing.to_vec();
    want.sort_unstable();
    assert_eq!(absent, want, "{what}: JuiceFS families not served");
}

#[test]
fn families_types_and_labels_are_juicefs_ones_and_gzip_is_offered() {
    let _dog = Watchdog::new("metrics-juicefs", Duration::from_secs(300));
    let vol = Volume::format("metrics", &["--trash-days", "0"]);
    let dir = vol.dir.path();
    let scraped_sluice = |name: &str, extra: &[&str]| {
        let mnt = dir.join(name);
        fs::create_dir_all(&mnt).unwrap();
        let mut args = vec!["--metrics", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mount = Mount::start(&vol.meta_url, &mnt, &dir.join(format!("{name}.log")), &args);
        let addr = metrics_addr(&|| mount.log_text());
        traffic(&mnt);
        let text = scrape(&addr);
        let (head, unpacked) = scrape_gzip(&addr);
        assert!(
            head.to_ascii_lowercase().contains("content-encoding: gzip"),
            "{head}"
        );
        assert!(
            unpacked.contains("# TYPE juicefs_fuse_ops_total counter"),
            "{unpacked}"
        );
        fs::remove_file(mnt.join("f")).unwrap();
        mount.unmount();
        (families(&text), parse(&text))
    };
    let cache = dir.join("cache");
    let cache_s = cache.to_str().unwrap().to_owned();
    let (plain, plain_values) = scraped_sluice("plain", &[]);
    let (writeback, writeback_values) =
        scraped_sluice("writeback", &["--cache-dir", &cache_s, "--writeback"]);
    // The 5 MiB file's two blocks went through staging with --writeback
    // only, and none failed there.
    assert_eq!(
        value(&plain_values, "juicefs_staging_write_bytes", &[]),
        0.0
    );
    assert_eq!(
        value(&writeback_values, "juicefs_staging_write_bytes", &[]),
        (5 << 20) as f64
    );
    assert_eq!(
        value(&writeback_values, "juicefs_staging_block_errors", &[]),
        0.0
    );
    // The file was created once: one JuiceFS `Mknod`.
    for v in [&plain_values, &writeback_values] {
        assert_eq!(
            value(v, "juicefs_meta_ops_total", &[("method", "Mknod")]),
            1.0
        );
    }
    for f in [
        "juicefs_fuse_ops_total",
        "juicefs_blockcache_hits",
        "juicefs_total_space",
    ] {
        assert!(plain.contains_key(f), "no {f}");
    }

    let Some(bin) = std::env::var_os("SLUICE_JUICEFS_BIN") else {
        eprintln!("SKIPPED: the comparison with JuiceFS (SLUICE_JUICEFS_BIN is not set)");
        return;
    };
    // The same volume, mounted by JuiceFS itself, with the same traffic.
    let jfs = JfsMount::start(
        Path::new(&bin),
        &vol.meta_url,
        &dir.join("jfs"),
        &dir.join("jfs-cache"),
        &dir.join("jfs.log"),
    );
    let addr = jfs.metrics_addr();
    traffic(&jfs.path);
    let theirs = families(&scrape(&addr));
    drop(jfs);
    assert!(
        theirs.len() >= 40,
        "{} JuiceFS families: {theirs:?}",
        theirs.len()
    );
    compare(
        "a plain mount",
        &theirs,
        &plain,
        &[&NOT_SERVED[..], &DISK_CACHE_ONLY[..]].concat(),
    );
    compare(
        "a --cache-dir --writeback mount",
        &theirs,
        &writeback,
        &NOT_SERVED,
    );
}
