//! Readiness for systemd (`Type=notify`): `sluice mount` and `sluice serve`
//! send `READY=1` to the socket named in `NOTIFY_SOCKET` once they serve —
//! the kernel mount is made, or the vhost-user socket is bound and the
//! sandbox is up — so that units ordered after them start only then.
//!
//! The socket is connected when the daemon starts, while it is still root
//! and outside its sandbox (Landlock would not let a confined daemon reach
//! the path, nor a switched user perhaps open it); the message later goes
//! over that connected socket.
//!
//! **Watchdog** (`WatchdogSec=` in the unit): a thread pings `WATCHDOG=1`
//! twice a period, but only after a probe of the serving path came back:
//! a `sluice mount` looks up a name that does not exist through its own
//! kernel mount (the kernel and a FUSE worker must answer), a `sluice
//! serve` checks that no request queue has been stuck on the same request
//! since the last probe. A hung daemon stops pinging and systemd restarts
//! it; one that answers errors (its metadata store down) still pings, since
//! a restart would not help it.

use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

/// A connection to systemd's notification socket.
#[derive(Debug, Clone)]
pub struct Notifier {
    socket: Arc<UnixDatagram>,
}

impl Notifier {
    /// Connects to `$NOTIFY_SOCKET` (a path, or `@name` for an abstract
    /// socket); `None` when the variable is unset (not started by systemd
    /// as `Type=notify`) or the socket cannot be reached (logged).
    pub fn from_env() -> Option<Notifier> {
        let name = std::env::var_os("NOTIFY_SOCKET")?;
        let connect = || -> std::io::Result<UnixDatagram> {
            let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
            let addr = match bytes.strip_prefix(b"@") {
                Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name)?,
                None => SocketAddr::from_pathname(&name)?,
            };
            let socket = UnixDatagram::unbound()?;
            socket.connect_addr(&addr)?;
            Ok(socket)
        };
        match connect() {
            Ok(socket) => Some(Notifier {
                socket: Arc::new(socket),
            }),
            Err(e) => {
                log::warn!(
                    "cannot reach systemd's NOTIFY_SOCKET {}: {e}; readiness will not be reported",
                    name.to_string_lossy()
                );
                None
            }
        }
    }

    /// The watchdog period systemd asked for (`WATCHDOG_USEC`, for this
    /// process when `WATCHDOG_PID` names one), if any.
    pub fn watchdog_period() -> Option<Duration> {
        if let Some(pid) = std::env::var_os("WATCHDOG_PID")
            && pid.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(std::process::id())
        {
            return None;
        }
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        (usec > 0).then(|| Duration::from_micros(usec))
    }

    /// Starts the watchdog thread when systemd asked for one: every half
    /// period it runs `probe`, and pings `WATCHDOG=1` when the probe says
    /// the daemon serves (a probe that hangs stops the pings).
    pub fn start_watchdog(
        &self,
        mut probe: impl FnMut() -> Result<(), String> + Send + 'static,
    ) -> std::io::Result<()> {
        let Some(period) = Self::watchdog_period() else {
            return Ok(());
        };
        let every = period / 2;
        let notifier = self.clone();
        log::info!("systemd watchdog: probing and pinging every {every:?}");
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                let mut failing = false;
                loop {
                    match probe() {
                        Ok(()) => {
                            if failing {
                                log::info!("watchdog: the daemon serves again");
                                failing = false;
                            }
                            notifier.send("WATCHDOG=1\n");
                        }
                        Err(why) => {
                            if !failing {
                                log::error!(
                                    "watchdog: {why}; not telling systemd the daemon is alive"
                                );
                                failing = true;
                            }
                        }
                    }
                    std::thread::sleep(every);
                }
            })?;
        Ok(())
    }

    fn send(&self, message: &str) {
        if let Err(e) = self.socket.send(message.as_bytes()) {
            log::warn!("cannot notify systemd ({}): {e}", message.trim_end());
        }
    }

    /// Tells systemd the daemon is ready, with a one-line status for
    /// `systemctl status`.
    pub fn ready(&self, status: &str) {
        let message = format!("READY=1\nSTATUS={}\n", status.replace('\n', " "));
        if let Err(e) = self.socket.send(message.as_bytes()) {
            log::warn!("cannot tell systemd the daemon is ready: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Notifier;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn ready_sends_one_datagram_with_ready_and_status() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let systemd = UnixDatagram::bind(&path).expect("bind");
        let socket = UnixDatagram::unbound().expect("socket");
        socket.connect(&path).expect("connect");
        Notifier {
            socket: std::sync::Arc::new(socket),
        }
        .ready("serving\nvol");
        let mut buf = [0u8; 256];
        let n = systemd.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving vol\n");
    }
}
