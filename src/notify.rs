//! Readiness for systemd (`Type=notify`): `sluice mount` and `sluice serve`
//! send `READY=1` to the socket named in `NOTIFY_SOCKET` once they serve —
//! the kernel mount is made, or the vhost-user socket is bound and the
//! sandbox is up — so that units ordered after them start only then.
//!
//! The socket is connected when the daemon starts, while it is still root
//! and outside its sandbox (Landlock would not let a confined daemon reach
//! the path, nor a switched user perhaps open it); the message later goes
//! over that connected socket. No watchdog: nothing in the daemon could
//! vouch, once a period, that its workers are not stuck.

use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// A connection to systemd's notification socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
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
            Ok(socket) => Some(Notifier { socket }),
            Err(e) => {
                log::warn!(
                    "cannot reach systemd's NOTIFY_SOCKET {}: {e}; readiness will not be reported",
                    name.to_string_lossy()
                );
                None
            }
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
        Notifier { socket }.ready("serving\nvol");
        let mut buf = [0u8; 256];
        let n = systemd.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving vol\n");
    }
}
