//! `sluice stats MOUNTPOINT|SOCKET`: a running daemon's activity, one line
//! per interval, in the manner of `juicefs stats`. It asks the daemon's
//! control socket for its totals (JSON: [`Snapshot`]; so it works with
//! `--no-metrics` too) and prints the rates between two samples; for a
//! host daemon (`sluice host`), its fetches and memory and each VM's
//! requests and hits.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::FileTypeExt as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::control::{Reply, StatsRequest, socket_for_mount, socket_for_serve};
use crate::metrics::Snapshot;

/// Arguments of `sluice stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// A sluice mount point (or a path in one), the vhost-user socket of a
    /// `sluice serve` (or its `.control` socket), or the socket of a `sluice
    /// host` (its `--control PATH`): the host's fetches and each VM.
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
    let mut vms = before.vms();
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    loop {
        std::thread::sleep(interval);
        let now = Sample::take(&socket)?;
        let mut out = stdout.lock();
        // A host daemon's VMs come and go: a new set gets a new header.
        let now_vms = now.vms();
        if printed.is_multiple_of(20) || now_vms != vms {
            vms = now_vms;
            writeln!(out, "{}", header(&queues, before.is_host(), &vms))?;
        }
        writeln!(out, "{}", line(&before, &now, &queues, &vms))?;
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
            "{} is neither in a sluice mount nor a `sluice serve` or `sluice host` socket",
            target.display()
        ),
    }
}

/// The daemon's totals at one moment.
#[derive(Debug)]
struct Sample {
    at: Instant,
    totals: Snapshot,
}

impl Sample {
    fn take(socket: &Path) -> anyhow::Result<Sample> {
        let mut conn = UnixStream::connect(socket).with_context(|| {
            format!(
                "cannot reach the daemon's control socket {} (is it running, and are you root?)",
                socket.display()
            )
        })?;
        let mut req = serde_json::to_string(&StatsRequest { stats: true })?;
        req.push('\n');
        conn.write_all(req.as_bytes())?;
        let mut line = String::new();
        BufReader::new(&conn)
            .read_line(&mut line)
            .context("the daemon closed the control connection")?;
        let reply: Reply = serde_json::from_str(&line).with_context(|| {
            format!(
                "unexpected answer from the daemon (one of another sluice version?): {}",
                line.trim_end()
            )
        })?;
        match reply {
            Reply::Stats(totals) => Ok(Sample {
                at: Instant::now(),
                totals,
            }),
            Reply::Error { message } => bail!("{message}"),
            _ => bail!("unexpected answer from the daemon: {}", line.trim_end()),
        }
    }

    /// Whether the daemon is a host daemon (`sluice host`).
    fn is_host(&self) -> bool {
        self.totals.host.is_some()
    }

    /// The VMs attached to a host daemon, by name.
    fn vms(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .totals
            .host
            .iter()
            .flat_map(|h| h.vms.iter().map(|vm| vm.name.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The request queues of a `serve` daemon (hiprio, queue 0, left out).
    fn queues(&self) -> Vec<String> {
        (1..self.totals.queues.len())
            .map(|q| q.to_string())
            .collect()
    }
}

fn header(queues: &[String], host: bool, vms: &[String]) -> String {
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
    if host || !vms.is_empty() {
        top.push_str(" -------------host-------------");
        bottom.push_str(" | fetch/s fetch MiB/s  mem MiB");
    }
    for vm in vms {
        let name: String = vm.chars().take(12).collect();
        top.push_str(&format!(" ---vm {name:-<12}-"));
        bottom.push_str(" |   req/s  hit%");
    }
    format!("{top}\n{bottom}")
}

fn line(a: &Sample, b: &Sample, queues: &[String], vms: &[String]) -> String {
    let dt = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
    let (a, b) = (&a.totals, &b.totals);
    // A total's growth (a restarted daemon starts again at 0: no growth).
    let d = |f: &dyn Fn(&Snapshot) -> f64| (f(b) - f(a)).max(0.0);
    let rate = |f: &dyn Fn(&Snapshot) -> f64| d(f) / dt;
    let mib = |x: f64| x / (1u64 << 20) as f64;
    // Milliseconds per operation over the interval.
    let lat = |n: &dyn Fn(&Snapshot) -> f64, secs: &dyn Fn(&Snapshot) -> f64| {
        let n = d(n);
        if n > 0.0 { d(secs) / n * 1000.0 } else { 0.0 }
    };
    let cpu = rate(&|s| s.cpu_seconds) * 100.0;
    let mem = mib(b.memory_bytes.unwrap_or_default() as f64);
    let hits = d(&|s| s.blockcache_hits as f64);
    let miss = d(&|s| s.blockcache_misses as f64);
    let hit_pct = if hits + miss > 0.0 {
        hits / (hits + miss) * 100.0
    } else {
        0.0
    };
    let mut line = format!(
        "{cpu:4.0}% {mem:6.0}M | {:7.0} {:8.2} {:7.1} {:7.1} | {:5.0} {:7.2}| {hit_pct:4.0} {:10.1} | \
         {:5.0} {:10.1} {:5.0} {:10.1}",
        rate(&|s| s.fuse_requests as f64),
        lat(&|s| s.fuse_requests as f64, &|s| s.fuse_seconds),
        mib(rate(&|s| s.fuse_read_bytes as f64)),
        mib(rate(&|s| s.fuse_written_bytes as f64)),
        rate(&|s| s.transactions as f64),
        lat(&|s| s.transactions as f64, &|s| s.transaction_seconds),
        mib(rate(&|s| s.blockcache_hit_bytes as f64)),
        rate(&|s| s.object_gets as f64),
        mib(rate(&|s| s.object_get_bytes as f64)),
        rate(&|s| s.object_puts as f64),
        mib(rate(&|s| s.object_put_bytes as f64)),
    );
    for q in queues {
        let i: usize = q.parse().unwrap_or(usize::MAX);
        let queue = |s: &Snapshot| s.queues.get(i).cloned().unwrap_or_default();
        line.push_str(&format!(
            " | {:7.0} {:10.1}",
            rate(&|s| queue(s).requests as f64),
            mib(rate(&|s| queue(s).reply_bytes as f64)),
        ));
    }
    if let Some(host) = &b.host {
        let fetched = |s: &Snapshot| s.host.as_ref().map_or(0, |h| h.fetches) as f64;
        let bytes = |s: &Snapshot| s.host.as_ref().map_or(0, |h| h.fetched_bytes) as f64;
        line.push_str(&format!(
            " | {:7.0} {:11.1} {:8.0}",
            rate(&fetched),
            mib(rate(&bytes)),
            mib(host.memory_bytes as f64),
        ));
    }
    for vm in vms {
        let of = |s: &Snapshot| {
            s.host
                .as_ref()
                .and_then(|h| h.vms.iter().find(|v| v.name == *vm))
                .cloned()
                .unwrap_or_default()
        };
        let asked = d(&|s| of(s).requests as f64);
        let hits = d(&|s| of(s).hits as f64);
        let hit_pct = if asked > 0.0 {
            hits / asked * 100.0
        } else {
            0.0
        };
        line.push_str(&format!(" | {:7.0} {hit_pct:5.0}", asked / dt));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{HostSnapshot, QueueSnapshot, VmSnapshot};

    #[test]
    fn the_daemons_totals_come_as_json() {
        let totals = Snapshot {
            cpu_seconds: 1.5,
            memory_bytes: Some(64 << 20),
            fuse_requests: 7,
            queues: vec![
                Default::default(),
                QueueSnapshot {
                    requests: 3,
                    reply_bytes: 4096,
                },
            ],
            ..Snapshot::default()
        };
        let line = serde_json::to_string(&Reply::Stats(totals.clone())).unwrap();
        assert!(line.starts_with("{\"kind\":\"stats\""), "{line}");
        match serde_json::from_str::<Reply>(&line).unwrap() {
            Reply::Stats(back) => assert_eq!(back, totals),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_column_names_its_unit() {
        let h = header(&["1".to_owned()], false, &[]);
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
        let queue = |requests, reply_bytes| QueueSnapshot {
            requests,
            reply_bytes,
        };
        let a = Sample {
            at: t,
            totals: Snapshot {
                cpu_seconds: 1.0,
                fuse_requests: 100,
                fuse_seconds: 1.0,
                fuse_read_bytes: 0,
                blockcache_hits: 10,
                blockcache_misses: 10,
                queues: vec![queue(5, 0), queue(10, 0)],
                ..Snapshot::default()
            },
        };
        let b = Sample {
            at: t + Duration::from_secs(2),
            totals: Snapshot {
                cpu_seconds: 2.0,
                fuse_requests: 300,
                fuse_seconds: 1.4,
                fuse_read_bytes: 8 << 20,
                blockcache_hits: 40,
                blockcache_misses: 20,
                queues: vec![queue(9, 0), queue(30, 4 << 20)],
                ..Snapshot::default()
            },
        };
        assert_eq!(a.queues(), vec!["1".to_owned()]);
        let l = line(&a, &b, &a.queues(), &[]);
        // 50 % CPU; 100 requests/s of 2 ms each; 4 MiB/s read; 75 % hits;
        // queue 1: 10 requests/s, 2 MiB/s out.
        assert!(
            l.starts_with("  50%      0M |     100     2.00     4.0     0.0 |"),
            "{l}"
        );
        assert!(l.contains("|   75 "), "{l}");
        assert!(l.ends_with("|      10        2.0"), "{l}");
        // A restarted daemon (totals back near 0) shows no negative rate.
        let l = line(&b, &a, &a.queues(), &[]);
        assert!(!l.contains('-'), "{l}");
    }

    #[test]
    fn a_host_daemon_shows_its_fetches_and_each_vm() {
        let t = Instant::now();
        let vm = |requests, hits| VmSnapshot {
            name: "vm1-7".to_owned(),
            requests,
            hits,
        };
        let a = Sample {
            at: t,
            totals: Snapshot {
                host: Some(HostSnapshot {
                    fetches: 4,
                    vms: vec![vm(10, 5)],
                    ..HostSnapshot::default()
                }),
                ..Snapshot::default()
            },
        };
        let b = Sample {
            at: t + Duration::from_secs(2),
            totals: Snapshot {
                host: Some(HostSnapshot {
                    fetches: 8,
                    memory_bytes: 16 << 20,
                    vms: vec![vm(30, 25)],
                    ..HostSnapshot::default()
                }),
                ..Snapshot::default()
            },
        };
        assert!(b.is_host());
        assert_eq!(b.vms(), vec!["vm1-7".to_owned()]);
        let h = header(&[], true, &b.vms());
        assert!(h.contains("host") && h.contains("vm vm1-7"), "{h}");
        let l = line(&a, &b, &[], &b.vms());
        // 4 fetches in 2 s; 16 MiB held; 20 requests in 2 s, all hits.
        assert!(
            l.ends_with("|       2         0.0       16 |      10   100"),
            "{l}"
        );
        // The host's part travels in the control socket's JSON; a mount's
        // or a VM server's snapshot has none.
        let json = serde_json::to_string(&Reply::Stats(b.totals.clone())).unwrap();
        match serde_json::from_str::<Reply>(&json).unwrap() {
            Reply::Stats(back) => assert_eq!(back, b.totals),
            other => panic!("{other:?}"),
        }
        let plain = serde_json::to_string(&Snapshot::default()).unwrap();
        assert!(!plain.contains("host"), "{plain}");
        assert!(
            !Sample {
                at: t,
                totals: serde_json::from_str(&plain).unwrap()
            }
            .is_host()
        );
    }
}
