//! The control socket of a running daemon (`sluice mount` or `sluice
//! serve`): how `sluice warmup` reaches the caches that matter — the
//! daemon's own. One request per connection, as a JSON line; the daemon
//! answers with JSON lines: the size of the job, progress now and then, and
//! the final counts (or an error). `sluice stats` asks it for the
//! daemon's totals the same way (a [`Snapshot`], JSON like the rest), and
//! `sluice umount --flush` asks a mount to upload what `--writeback`
//! staged. A host daemon (`sluice host`) has one too, beside its
//! `--control` socket, for `sluice stats`: its [`Snapshot`] carries the
//! host's fetches and each VM.
//!
//! The socket is created mode 0600 and root's (the daemon binds it as root;
//! `sluice serve` before it switches to its service user): warming or
//! dropping caches is an operator's action.

use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_engine::reader::Reader;
use sluice_engine::warmup::{CacheOp, Progress, collect, run};

use crate::metrics::{Metrics, Snapshot};

/// A request to the daemon.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// What to do.
    pub op: CacheOp,
    /// Paths from the volume's root.
    pub paths: Vec<String>,
    /// Threads to do it with.
    pub threads: usize,
}

/// Asks for the daemon's totals (`sluice stats`): `{"stats": true}`; the
/// daemon answers with one [`Reply::Stats`] line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsRequest {
    /// Always true.
    pub stats: bool,
}

/// Asks the daemon to upload every block `--writeback` staged, now (the
/// delayed ones too), for `sluice umount --flush`: `{"flush": true}`. The
/// daemon answers with [`Reply::Uploads`] lines, every second and once
/// done.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlushRequest {
    /// Always true.
    pub flush: bool,
}

/// How long a flush waits for the uploads (the same bound as an unmount's).
const FLUSH_LIMIT: std::time::Duration = sluice_engine::vfs::DEFAULT_UPLOAD_DRAIN;

/// One line of the daemon's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Reply {
    /// What the paths hold.
    Start {
        /// Regular files.
        files: u64,
        /// Their bytes.
        bytes: u64,
        /// Their visible blocks.
        blocks: u64,
    },
    /// Counts so far.
    Progress(Progress),
    /// The final counts.
    Done(Progress),
    /// The daemon's totals now.
    Stats(Snapshot),
    /// The staged blocks not uploaded yet (a flush's progress and end).
    Uploads {
        /// Blocks staged and not uploaded.
        pending_blocks: u64,
        /// Their bytes.
        pending_bytes: u64,
        /// Whether the flush is over (what is pending then stays staged).
        done: bool,
    },
    /// The request failed.
    Error {
        /// Why.
        message: String,
    },
}

/// Where the control socket of the mount on `mountpoint` lives.
pub fn socket_for_mount(mountpoint: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    // FNV-1a: a stable, short name for any mount point path.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in mountpoint.as_os_str().as_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    PathBuf::from(format!("/run/sluice/mount-{h:016x}.sock"))
}

/// Where the control socket of `sluice serve --socket SOCKET` lives.
pub fn socket_for_serve(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".control");
    PathBuf::from(s)
}

/// The readers requests run against: the daemon swaps in the current one
/// (`serve` starts a new file-system session per VM connection).
pub type ReaderSlot = Arc<Mutex<Option<Arc<Reader>>>>;

/// A listening control socket; closed and removed when dropped.
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl ControlServer {
    /// Listens on `path` (a stale socket there is replaced), mode 0600, or
    /// 0660 owned by `group`; created with that mode, never chmod-ed after.
    pub fn start(
        path: &Path,
        slot: ReaderSlot,
        metrics: Option<Arc<Metrics>>,
        group: Option<u32>,
    ) -> anyhow::Result<ControlServer> {
        Self::bind(path, group)?.start(slot, metrics)
    }

    /// Binds the socket as [`ControlServer::start`] does, without starting
    /// the thread that serves it (`sluice serve` binds before it drops its
    /// privileges and starts threads only after).
    pub fn bind(path: &Path, group: Option<u32>) -> anyhow::Result<BoundControl> {
        use anyhow::Context as _;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let listener = sluice_vhost::socket::bind_private(path, group)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        Ok(BoundControl {
            path: path.to_owned(),
            listener: Some(listener),
        })
    }
}

/// A bound control socket whose server is not started yet; its file is
/// removed when it is dropped unstarted (a daemon whose start failed).
#[derive(Debug)]
pub struct BoundControl {
    path: PathBuf,
    listener: Option<std::os::unix::net::UnixListener>,
}

impl Drop for BoundControl {
    fn drop(&mut self) {
        if self.listener.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl BoundControl {
    /// Starts serving requests against `slot` (and `metrics`, for
    /// `sluice stats`).
    pub fn start(
        mut self,
        slot: ReaderSlot,
        metrics: Option<Arc<Metrics>>,
    ) -> anyhow::Result<ControlServer> {
        let path = self.path.clone();
        let listener = self
            .listener
            .take()
            .ok_or_else(|| anyhow::anyhow!("the control socket was started twice"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let slot = slot.clone();
                    let metrics = metrics.clone();
                    let _ = std::thread::Builder::new()
                        .name("control-request".into())
                        .spawn(move || {
                            if let Err(e) = handle(conn, &slot, metrics.as_deref()) {
                                log::warn!("control request: {e}");
                            }
                        });
                }
            })?;
        Ok(ControlServer { path, stop })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Uploads the staged blocks now, reporting the backlog every second.
fn flush(slot: &ReaderSlot, send: &dyn Fn(&Reply) -> std::io::Result<()>) -> anyhow::Result<()> {
    let Some(reader) = slot.lock().clone() else {
        send(&Reply::Error {
            message: "no file-system session is running".into(),
        })?;
        return Ok(());
    };
    let store = reader.volume().store.clone();
    let backlog = || {
        let s = store.upload_backlog().unwrap_or_default();
        (s.pending_blocks, s.pending_bytes)
    };
    log::info!("control: flushing the staged blocks");
    let finished = AtomicBool::new(false);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        scope.spawn(|| {
            store.drain_uploads(FLUSH_LIMIT);
            finished.store(true, Ordering::Release);
        });
        let mut last = std::time::Instant::now();
        while !finished.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            if last.elapsed() >= std::time::Duration::from_secs(1) {
                last = std::time::Instant::now();
                let (blocks, bytes) = backlog();
                // A client gone is no reason to stop the uploads.
                let _ = send(&Reply::Uploads {
                    pending_blocks: blocks,
                    pending_bytes: bytes,
                    done: false,
                });
            }
        }
        Ok(())
    })?;
    let (blocks, bytes) = backlog();
    send(&Reply::Uploads {
        pending_blocks: blocks,
        pending_bytes: bytes,
        done: true,
    })?;
    Ok(())
}

/// Serves one request.
fn handle(conn: UnixStream, slot: &ReaderSlot, metrics: Option<&Metrics>) -> anyhow::Result<()> {
    let mut line = String::new();
    BufReader::new(conn.try_clone()?)
        .take(1 << 20)
        .read_line(&mut line)?;
    let out = Mutex::new(conn);
    let send = |reply: &Reply| -> std::io::Result<()> {
        let mut text = serde_json::to_string(reply).map_err(std::io::Error::other)?;
        text.push('\n');
        out.lock().write_all(text.as_bytes())
    };
    if let Ok(StatsRequest { stats: true }) = serde_json::from_str(&line) {
        return match metrics {
            Some(m) => send(&Reply::Stats(m.snapshot())),
            None => send(&Reply::Error {
                message: "this daemon keeps no metrics".into(),
            }),
        }
        .map_err(Into::into);
    }
    if let Ok(FlushRequest { flush: true }) = serde_json::from_str(&line) {
        return flush(slot, &send);
    }
    let req: Request = match serde_json::from_str(&line) {
        Ok(r) => r,
        Err(e) => {
            send(&Reply::Error {
                message: format!("bad request: {e}"),
            })?;
            return Ok(());
        }
    };
    let Some(reader) = slot.lock().clone() else {
        send(&Reply::Error {
            message: "no file-system session is running (no VM connected)".into(),
        })?;
        return Ok(());
    };
    let target = match collect(&reader, &req.paths) {
        Ok(t) => t,
        Err(e) => {
            send(&Reply::Error {
                message: format!("{}: {e}", req.paths.join(", ")),
            })?;
            return Ok(());
        }
    };
    send(&Reply::Start {
        files: target.files,
        bytes: target.bytes,
        blocks: target.blocks.len() as u64,
    })?;
    log::info!(
        "control: {:?} of {} files, {} blocks, {} threads",
        req.op,
        target.files,
        target.blocks.len(),
        req.threads
    );
    let threads = req.threads.clamp(1, 256);
    let done = run(&reader, req.op, &target.blocks, threads, &|p| {
        let _ = send(&Reply::Progress(p.clone()));
    });
    send(&Reply::Done(done))?;
    Ok(())
}
