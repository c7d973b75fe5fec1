//! `sluice warmup PATH…`: pull files into a running daemon's caches before a
//! training run (or `--evict` them, or `--check` how much is cached), in the
//! manner of `juicefs warmup`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, bail};
use sluice_engine::warmup::{CacheOp, Progress};

use super::control::{Reply, Request, socket_for_mount, socket_for_serve};
use super::mount::sluice_mount_of;

/// Arguments of `sluice warmup`.
#[derive(Debug, clap::Args)]
pub struct WarmupArgs {
    /// Files or directories inside a sluice mount (directories are walked);
    /// with --serve-socket, paths from the volume's root.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Blocks fetched in parallel.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// Drop the blocks from the caches instead.
    #[arg(long, conflicts_with = "check")]
    pub evict: bool,
    /// Only report how much of the data is cached.
    #[arg(long)]
    pub check: bool,
    /// Talk to `sluice serve --socket SOCKET` (a VM's daemon) instead of a
    /// host mount.
    #[arg(long, value_name = "SOCKET")]
    pub serve_socket: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Runs `sluice warmup`.
pub fn run(args: WarmupArgs) -> anyhow::Result<()> {
    if args.threads == 0 || args.threads > 256 {
        bail!("--threads takes 1 to 256");
    }
    let op = if args.evict {
        CacheOp::Evict
    } else if args.check {
        CacheOp::Check
    } else {
        CacheOp::Warmup
    };
    // Which daemon, and the paths as it knows them (from the volume's root).
    let (socket, paths) = match &args.serve_socket {
        Some(s) => (
            socket_for_serve(s),
            args.paths
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect::<Vec<_>>(),
        ),
        None => {
            let mut mount: Option<PathBuf> = None;
            let mut rel = Vec::new();
            for p in &args.paths {
                let abs = std::path::absolute(p)?;
                std::fs::symlink_metadata(&abs)
                    .with_context(|| format!("cannot stat {}", abs.display()))?;
                let Some((mp, _)) = sluice_mount_of(&abs)? else {
                    bail!(
                        "{} is not inside a sluice mount (for a VM's daemon, pass --serve-socket)",
                        abs.display()
                    );
                };
                if mount.as_ref().is_some_and(|m| *m != mp) {
                    bail!("the paths are in different sluice mounts; warm one mount at a time");
                }
                let r = abs.strip_prefix(&mp).unwrap_or(&abs);
                rel.push(r.to_string_lossy().into_owned());
                mount = Some(mp);
            }
            let mp = mount.unwrap_or_default();
            (socket_for_mount(&mp), rel)
        }
    };
    let conn = UnixStream::connect(&socket).with_context(|| {
        format!(
            "cannot reach the daemon's control socket {} (is the mount or `sluice serve` running, and are you root?)",
            socket.display()
        )
    })?;
    let mut line = serde_json::to_string(&Request {
        op,
        paths,
        threads: args.threads,
    })?;
    line.push('\n');
    (&conn).write_all(line.as_bytes())?;
    let started = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let mut size = (0u64, 0u64);
    for line in BufReader::new(&conn).lines() {
        let line = line.context("the daemon closed the control connection")?;
        let reply: Reply = serde_json::from_str(&line)
            .with_context(|| format!("unexpected answer from the daemon: {line}"))?;
        match reply {
            Reply::Start {
                files,
                bytes,
                blocks,
            } => {
                size = (files, bytes);
                if !args.quiet {
                    let b = indicatif::ProgressBar::new(blocks);
                    b.set_style(
                        indicatif::ProgressStyle::with_template(
                            "{msg} [{bar:40}] {pos}/{len} blocks, {elapsed}",
                        )
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                    );
                    b.set_message(format!("{op:?}"));
                    bar = Some(b);
                }
            }
            Reply::Progress(p) => {
                if let Some(b) = &bar {
                    b.set_position(p.done);
                }
            }
            Reply::Done(p) => {
                if let Some(b) = bar.take() {
                    b.finish_and_clear();
                }
                println!("{}", summary(op, size, &p, started.elapsed().as_secs_f64()));
                if p.failed > 0 {
                    bail!(
                        "{} blocks could not be fetched (the daemon's log says why)",
                        p.failed
                    );
                }
                return Ok(());
            }
            Reply::Error { message } => bail!("{message}"),
            Reply::Stats(_) | Reply::Uploads { .. } => {
                bail!("unexpected answer from the daemon: {line}")
            }
        }
    }
    bail!("the daemon closed the control connection before finishing")
}

fn summary(op: CacheOp, (files, bytes): (u64, u64), p: &Progress, secs: f64) -> String {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let pct = if p.blocks == 0 {
        100.0
    } else {
        100.0 * p.hit as f64 / p.blocks as f64
    };
    match op {
        CacheOp::Warmup => format!(
            "warmed up {files} files ({:.1} MiB): {} of {} blocks cached, {:.1} MiB in {secs:.1} s ({:.1} MiB/s){}",
            mib(bytes),
            p.hit,
            p.blocks,
            mib(p.hit_bytes),
            mib(p.hit_bytes) / secs.max(1e-9),
            if p.failed > 0 {
                format!(", {} failed", p.failed)
            } else {
                String::new()
            }
        ),
        CacheOp::Check => format!(
            "{files} files ({:.1} MiB): {} of {} blocks cached ({pct:.1} %), {:.1} MiB",
            mib(bytes),
            p.hit,
            p.blocks,
            mib(p.hit_bytes)
        ),
        CacheOp::Evict => format!(
            "{files} files ({:.1} MiB): dropped {} cached blocks ({:.1} MiB) of {}",
            mib(bytes),
            p.hit,
            mib(p.hit_bytes),
            p.blocks
        ),
    }
}
