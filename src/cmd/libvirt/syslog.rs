//! virtiofsd's `--syslog`: log records go to the system log (`/dev/log`,
//! RFC 3164 lines, facility `user`) instead of stderr.
//!
//! The socket is connected once, at start, while the daemon is still
//! unconfined: afterwards Landlock would not let it reach `/dev/log`, and
//! each record is one `send` on the connected socket, a call the seccomp
//! allowlist keeps. A record the system log does not take (journald
//! restarting, its queue full) goes to stderr instead, so nothing is lost
//! silently.

use std::io::Write as _;
use std::os::unix::net::UnixDatagram;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Where the system logger listens.
const DEV_LOG: &str = "/dev/log";

/// syslog's `user` facility, shifted into the priority value.
const FACILITY_USER: u8 = 1 << 3;

/// A logger that sends each record to the system log.
#[derive(Debug)]
pub struct Syslog {
    socket: UnixDatagram,
    level: LevelFilter,
    pid: u32,
}

impl Syslog {
    /// Connects to `/dev/log`; records above `level` are dropped.
    pub fn connect(level: LevelFilter) -> std::io::Result<Syslog> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(DEV_LOG)?;
        Ok(Syslog {
            socket,
            level,
            pid: std::process::id(),
        })
    }

    /// Installs the logger for the process.
    pub fn install(self) -> Result<(), log::SetLoggerError> {
        let level = self.level;
        log::set_boxed_logger(Box::new(self))?;
        log::set_max_level(level);
        Ok(())
    }
}

/// syslog's severity for a log level.
fn severity(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// One record as an RFC 3164 message without the timestamp and host
/// (the local syslog daemon adds them): `<PRI>sluice[PID]: LEVEL target: text`.
fn format_line(pid: u32, level: Level, target: &str, text: &str) -> String {
    let pri = FACILITY_USER | severity(level);
    // One record, one line: a newline inside would read as another message.
    let text = text.replace('\n', " ");
    format!("<{pri}>sluice[{pid}]: {level} {target}: {text}")
}

impl Log for Syslog {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format_line(
            self.pid,
            record.level(),
            record.target(),
            &record.args().to_string(),
        );
        if self.socket.send(line.as_bytes()).is_err() {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_facility_severity_and_pid() {
        assert_eq!(
            format_line(42, Level::Error, "sluice::cmd", "disk\nfull"),
            "<11>sluice[42]: ERROR sluice::cmd: disk full"
        );
        assert!(format_line(1, Level::Info, "t", "x").starts_with("<14>"));
        assert!(format_line(1, Level::Debug, "t", "x").starts_with("<15>"));
    }

    /// Records reach a socket standing in for `/dev/log`.
    #[test]
    fn records_are_sent_as_datagrams() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let server = UnixDatagram::bind(&path).unwrap();
        let socket = UnixDatagram::unbound().unwrap();
        socket.connect(&path).unwrap();
        let logger = Syslog {
            socket,
            level: LevelFilter::Info,
            pid: 7,
        };
        logger.log(
            &Record::builder()
                .level(Level::Warn)
                .target("sluice")
                .args(format_args!("hello"))
                .build(),
        );
        logger.log(
            &Record::builder()
                .level(Level::Debug)
                .target("sluice")
                .args(format_args!("dropped"))
                .build(),
        );
        let mut buf = [0u8; 256];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"<12>sluice[7]: WARN sluice: hello");
        server.set_nonblocking(true).unwrap();
        assert!(
            server.recv(&mut buf).is_err(),
            "the debug record is dropped"
        );
    }
}
