//! The HTTP endpoint Prometheus scrapes: `GET /metrics` on `--metrics ADDR`
//! (JuiceFS's default `127.0.0.1:9567`; when that port is taken, the next
//! free one, as JuiceFS does).

use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;

use anyhow::Context as _;

use super::{CONTENT_TYPE, Metrics};

/// The address `--metrics` defaults to (JuiceFS's).
pub const DEFAULT_ADDR: &str = "127.0.0.1:9567";

/// Ports tried after the one asked for is taken.
const NEXT_PORTS: u16 = 100;

/// A bound, not yet serving, metrics socket (`serve` binds before its
/// sandbox and starts threads after).
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
    addr: SocketAddr,
}

/// The socket address `--metrics` names (HOST:PORT).
pub fn parse(addr: &str) -> anyhow::Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("--metrics {addr:?}: not an address (HOST:PORT)"))?
        .next()
        .with_context(|| format!("--metrics {addr:?}: the name resolves to no address"))
}

/// Binds `wanted`; when its port is taken (and not 0), the next free one
/// among the following [`NEXT_PORTS`].
pub fn bind(wanted: SocketAddr) -> anyhow::Result<Bound> {
    let mut last = None;
    let tries = if wanted.port() == 0 {
        1
    } else {
        NEXT_PORTS + 1
    };
    for i in 0..tries {
        let Some(port) = wanted.port().checked_add(i) else {
            break;
        };
        let at = SocketAddr::new(wanted.ip(), port);
        match TcpListener::bind(at) {
            Ok(listener) => {
                let addr = listener.local_addr()?;
                if i > 0 {
                    log::warn!("--metrics: {wanted} is taken; serving metrics on {addr}");
                }
                return Ok(Bound { listener, addr });
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e).with_context(|| format!("--metrics: cannot listen on {at}")),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse))).with_context(|| {
        format!("--metrics: {wanted} and the {NEXT_PORTS} ports after it are taken")
    })
}

impl Bound {
    /// Starts answering scrapes with `metrics`.
    pub fn start(self, metrics: Arc<Metrics>) -> anyhow::Result<Endpoint> {
        let server = tiny_http::Server::from_listener(self.listener, None)
            .map_err(|e| anyhow::anyhow!("cannot serve metrics on {}: {e}", self.addr))?;
        let server = Arc::new(server);
        let serving = server.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for request in serving.incoming_requests() {
                    answer(request, &metrics);
                }
            })?;
        log::info!("metrics on http://{}/metrics", self.addr);
        Ok(Endpoint {
            server,
            addr: self.addr,
        })
    }
}

fn answer(request: tiny_http::Request, metrics: &Metrics) {
    use tiny_http::{Header, Method, Response};
    let path = request.url().split('?').next().unwrap_or("");
    let reply = if *request.method() != Method::Get && *request.method() != Method::Head {
        Response::from_string("only GET\n").with_status_code(405)
    } else if path == "/metrics" {
        let text = metrics.render();
        let gzip = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Accept-Encoding"))
            .is_some_and(|h| accepts_gzip(h.value.as_str()));
        let mut r = if gzip {
            match gzipped(text.as_bytes()) {
                Ok(body) => {
                    let mut r = Response::from_data(body);
                    if let Ok(h) = Header::from_bytes("Content-Encoding", "gzip") {
                        r.add_header(h);
                    }
                    r
                }
                Err(e) => {
                    log::debug!("metrics: cannot compress a scrape: {e}");
                    Response::from_data(text.into_bytes())
                }
            }
        } else {
            Response::from_data(text.into_bytes())
        };
        if let Ok(h) = Header::from_bytes("Content-Type", CONTENT_TYPE) {
            r.add_header(h);
        }
        r
    } else {
        Response::from_string("sluice: metrics are at /metrics\n").with_status_code(404)
    };
    if let Err(e) = request.respond(reply) {
        log::debug!("metrics: cannot answer a scrape: {e}");
    }
}

/// Whether an `Accept-Encoding` value lets the reply be gzipped, as Go's
/// Prometheus handler decides it (JuiceFS's endpoint): `gzip` named with
/// a quality other than 0.
fn accepts_gzip(value: &str) -> bool {
    value.split(',').any(|part| {
        let mut fields = part.split(';').map(str::trim);
        let coding = fields.next().unwrap_or("");
        let refused = fields.any(|f| {
            f.strip_prefix("q=")
                .and_then(|q| q.parse::<f64>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        coding.eq_ignore_ascii_case("gzip") && !refused
    })
}

fn gzipped(data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data)?;
    enc.finish()
}

/// A serving endpoint; stops when dropped.
pub struct Endpoint {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_when_the_scraper_accepts_it() {
        assert!(accepts_gzip("gzip"));
        assert!(accepts_gzip("deflate, GZIP;q=0.5"));
        assert!(!accepts_gzip("identity"));
        assert!(!accepts_gzip("gzip;q=0"));
        assert!(!accepts_gzip(""));
        let z = gzipped(b"juicefs_uptime 1\n").unwrap();
        let mut back = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&z[..]), &mut back)
            .unwrap();
        assert_eq!(back, "juicefs_uptime 1\n");
    }
}
