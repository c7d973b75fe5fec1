//! End-to-end: the Prometheus endpoint of a running `sluice mount` and
//! `sluice serve` (driven by the virtio-fs harness) during traffic. The
//! exposition parses with Prometheus's own `promtool`, carries JuiceFS's
//! metric names and labels, and its counters move exactly as the traffic
//! does; `sluice stats` prints its frames.

mod common;

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Mount, SLUICE, Serve, Volume, Watchdog, metrics_addr, scrape, text};
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
/// same: its histogram names contain "histogram").
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
    let kept = [
        "juicefs_fuse_ops_durations_histogram_seconds",
        "juicefs_object_request_durations_histogram_seconds",
        "juicefs_transaction_durations_histogram_seconds",
    ];
    for finding in said.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            kept.iter()
                .any(|k| finding == format!("{k} metric name should not include type 'histogram'")),
            "promtool: {finding}"
        );
    }
}

fn assert_juicefs_names(s: &Series, mp: &str) {
    for name in [
        "juicefs_uptime",
        "juicefs_cpu_usage",
        "juicefs_used_space",
        "juicefs_used_inodes",
        "juicefs_fuse_ops_durations_histogram_seconds_count",
        "juicefs_fuse_ops_total",
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
    assert!(d("juicefs_fuse_ops_total", &[("method", "WRITE")]) >= 5.0);
    assert!(d("juicefs_fuse_ops_total", &[("method", "READ")]) >= 1.0);
    assert!(value(&after, "sluice_fuse_errors_total", &[("errno", "ENOENT")]) >= 1.0);
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

    let scraped = scrape(&addr);
    promtool_check(&scraped);
    let s = parse(&scraped);
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
    assert!(value(&s, "sluice_fuse_errors_total", &[("errno", "ENOENT")]) >= 1.0);
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
    for part in dashboard.split("sluice_").skip(1) {
        let name: String = part
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        let name = format!("sluice_{}", name.trim_end_matches("_bucket"));
        assert!(
            scraped.contains(&format!("\n{name}")),
            "the dashboard queries {name}, which the daemon does not serve"
        );
        queried += 1;
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
