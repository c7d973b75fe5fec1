//! `sluice stats MOUNTPOINT|SOCKET`: a running daemon's activity, one line
//! per interval, in the manner of `juicefs stats`. It asks the daemon's
//! control socket for its metrics (so it works with `--no-metrics` too)
//! and prints the rates between two samples.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::FileTypeExt as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::control::{MetricsRequest, Reply, socket_for_mount, socket_for_serve};

/// Arguments of `sluice stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// A sluice mount point (or a path in one), or the vhost-user socket of
    /// a `sluice serve` (or its `.control` socket).
    pub target: PathBuf,
    /// Seconds between lines.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Lines to print, then exit (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

/// Runs `sluice stats`.
pub fn run(args: StatsArgs) -> anyhow::Result<()> {
    if !(args.interval.is_finite() && args.interval >= 0.1 && args.interval <= 3600.0) {
        bail!("--interval takes 0.1 to 3600 seconds");
    }
    let socket = control_socket(&args.target)?;
    let interval = Duration::from_secs_f64(args.interval);
    let mut before = Sample::take(&socket)?;
    let queues = before.queues();
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    loop {
        std::thread::sleep(interval);
        let now = Sample::take(&socket)?;
        let mut out = stdout.lock();
        if printed.is_multiple_of(20) {
            writeln!(out, "{}", header(&queues))?;
        }
        writeln!(out, "{}", line(&before, &now, &queues))?;
        out.flush()?;
        printed += 1;
        if args.count > 0 && printed >= args.count {
            return Ok(());
        }
        before = now;
    }
}

/// The control socket of the daemon `target` names.
fn control_socket(target: &Path) -> anyhow::Result<PathBuf> {
    let meta =
        std::fs::metadata(target).with_context(|| format!("cannot stat {}", target.display()))?;
    if meta.file_type().is_socket() {
        if target.extension().is_some_and(|e| e == "control") {
            return Ok(target.to_owned());
        }
        return Ok(socket_for_serve(target));
    }
    let abs = std::path::absolute(target)?;
    match super::mount::sluice_mount_of(&abs)? {
        Some((mp, _)) => Ok(socket_for_mount(&mp)),
        None => bail!(
            "{} is neither in a sluice mount nor a `sluice serve` socket",
            target.display()
        ),
    }
}

/// Every series of a scrape: by name, (labels, value).
type Series = HashMap<String, Vec<(Vec<(String, String)>, f64)>>;

/// One scrape.
#[derive(Debug)]
struct Sample {
    at: Instant,
    series: Series,
}

impl Sample {
    fn take(socket: &Path) -> anyhow::Result<Sample> {
        let mut conn = UnixStream::connect(socket).with_context(|| {
            format!(
                "cannot reach the daemon's control socket {} (is it running, and are you root?)",
                socket.display()
            )
        })?;
        let mut req = serde_json::to_string(&MetricsRequest { metrics: true })?;
        req.push('\n');
        conn.write_all(req.as_bytes())?;
        let mut line = String::new();
        BufReader::new(&conn)
            .read_line(&mut line)
            .context("the daemon closed the control connection")?;
        let reply: Reply = serde_json::from_str(&line)
            .with_context(|| format!("unexpected answer from the daemon: {line}"))?;
        match reply {
            Reply::Metrics { text } => Ok(Sample {
                at: Instant::now(),
                series: parse(&text),
            }),
            Reply::Error { message } => bail!("{message}"),
            _ => bail!("unexpected answer from the daemon: {line}"),
        }
    }

    /// The sum of the series of `name` whose labels include `with`.
    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.series.get(name).map_or(0.0, |all| {
            all.iter()
                .filter(|(labels, _)| {
                    with.iter()
                        .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
                })
                .map(|(_, v)| v)
                .sum()
        })
    }

    /// The request queues of a `serve` daemon (hiprio left out).
    fn queues(&self) -> Vec<String> {
        let mut q: Vec<String> = self
            .series
            .get("sluice_virtiofs_requests_total")
            .into_iter()
            .flatten()
            .filter_map(|(labels, _)| labels.iter().find(|(k, _)| k == "queue"))
            .map(|(_, v)| v.clone())
            .filter(|v| v != "0")
            .collect();
        q.sort_by_key(|v| v.parse::<u32>().unwrap_or(u32::MAX));
        q.dedup();
        q
    }
}

/// Parses the Prometheus text format: `name{k="v",...} value` lines.
fn parse(text: &str) -> Series {
    let mut out: HashMap<String, Vec<_>> = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (head, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
            None => (head, Vec::new()),
        };
        out.entry(name.to_owned())
            .or_default()
            .push((labels, value));
    }
    out
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = s;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').trim().to_owned(), value));
        rest = &after[end..];
    }
    labels
}

fn header(queues: &[String]) -> String {
    let mut top = String::from(
        "-----usage----- --------------fuse-------------- ----meta---- ---blockcache--- \
         -------------object-------------",
    );
    let mut bottom = String::from(
        "  cpu      mem |   ops/s  lat(ms) rdMiB/s wrMiB/s |  tx/s lat(ms)| hit%  hit MiB/s | \
         get/s  get MiB/s put/s  put MiB/s",
    );
    for q in queues {
        top.push_str(&format!(" ------queue {q:<3}-----"));
        bottom.push_str(" |   ops/s  out MiB/s");
    }
    format!("{top}\n{bottom}")
}

fn line(a: &Sample, b: &Sample, queues: &[String]) -> String {
    let dt = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
    let d = |name: &str, with: &[(&str, &str)]| (b.sum(name, with) - a.sum(name, with)).max(0.0);
    let rate = |name: &str, with: &[(&str, &str)]| d(name, with) / dt;
    let mib = |x: f64| x / (1u64 << 20) as f64;
    let lat = |base: &str, with: &[(&str, &str)]| {
        let n = d(&format!("{base}_count"), with);
        if n > 0.0 {
            d(&format!("{base}_sum"), with) / n * 1000.0
        } else {
            0.0
        }
    };
    let cpu = rate("juicefs_cpu_usage", &[]) * 100.0;
    let mem = mib(b.sum("juicefs_memory", &[]));
    let fuse = "juicefs_fuse_ops_durations_histogram_seconds";
    let tx = "juicefs_transaction_durations_histogram_seconds";
    let obj = "juicefs_object_request_durations_histogram_seconds";
    let hits = d("juicefs_blockcache_hits", &[]);
    let miss = d("juicefs_blockcache_miss", &[]);
    let hit_pct = if hits + miss > 0.0 {
        hits / (hits + miss) * 100.0
    } else {
        0.0
    };
    let get = [("method", "GET")];
    let put = [("method", "PUT")];
    let mut s = format!(
        "{cpu:4.0}% {mem:6.0}M | {:7.0} {:8.2} {:7.1} {:7.1} | {:5.0} {:7.2}| {hit_pct:4.0} {:10.1} | \
         {:5.0} {:10.1} {:5.0} {:10.1}",
        rate(&format!("{fuse}_count"), &[]),
        lat(fuse, &[]),
        mib(rate("juicefs_fuse_read_size_bytes_sum", &[])),
        mib(rate("juicefs_fuse_written_size_bytes_sum", &[])),
        rate(&format!("{tx}_count"), &[]),
        lat(tx, &[]),
        mib(rate("juicefs_blockcache_hit_bytes", &[])),
        rate(&format!("{obj}_count"), &get),
        mib(rate("juicefs_object_request_data_bytes", &get)),
        rate(&format!("{obj}_count"), &put),
        mib(rate("juicefs_object_request_data_bytes", &put)),
    );
    for q in queues {
        let with = [("queue", q.as_str())];
        s.push_str(&format!(
            " | {:7.0} {:10.1}",
            rate("sluice_virtiofs_requests_total", &with),
            mib(rate("sluice_virtiofs_reply_bytes_total", &with)),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_parses_into_series() {
        let text = "# HELP x help\n# TYPE x counter\n\
                    x_total{vol_name=\"v\",mp=\"/m\"} 3\n\
                    y{method=\"GET\",vol_name=\"a \\\"b\\\"\"} 1.5\n\
                    y{method=\"PUT\"} 2\nz 7\n";
        let s = Sample {
            at: Instant::now(),
            series: parse(text),
        };
        assert_eq!(s.sum("x_total", &[]), 3.0);
        assert_eq!(s.sum("y", &[("method", "GET")]), 1.5);
        assert_eq!(s.sum("y", &[]), 3.5);
        assert_eq!(s.sum("z", &[]), 7.0);
        let y = &s.series["y"][0].0;
        assert_eq!(y[1], ("vol_name".to_owned(), "a \"b\"".to_owned()));
    }

    #[test]
    fn every_column_names_its_unit() {
        let h = header(&["1".to_owned()]);
        let (_, bottom) = h.split_once('\n').unwrap();
        for column in [
            "rdMiB/s",
            "wrMiB/s",
            "hit MiB/s",
            "get MiB/s",
            "put MiB/s",
            "out MiB/s",
        ] {
            assert!(bottom.contains(column), "{column}: {h}");
        }
        assert!(
            !bottom.contains(" read/s") && !bottom.contains(" write/s"),
            "{h}"
        );
    }

    #[test]
    fn rates_are_differences_over_time() {
        let t = Instant::now();
        let a = Sample {
            at: t,
            series: parse("sluice_virtiofs_requests_total{queue=\"1\"} 10\n"),
        };
        let b = Sample {
            at: t + Duration::from_secs(2),
            series: parse("sluice_virtiofs_requests_total{queue=\"1\"} 30\n"),
        };
        assert_eq!(a.queues(), vec!["1".to_owned()]);
        let l = line(&a, &b, &a.queues());
        assert!(l.ends_with("|      10        0.0"), "{l}");
    }
}
