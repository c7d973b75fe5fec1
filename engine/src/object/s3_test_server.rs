//! A real S3 HTTP server on loopback for tests and benchmarks: s3s-fs
//! (objects as files under a directory) behind hyper, with a fault
//! injector in front of it that answers a chosen share of requests with
//! 503 SlowDown, holds them past the client's timeout, cuts the connection
//! before answering, or cuts it halfway through the response body.
//!
//! Built for the engine's own tests and, with the `s3-test-server`
//! feature, for other crates' tests and the `s3_server` example. It only
//! ever listens on the address it is given (tests use 127.0.0.1:0).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use s3s::Body;
use s3s::service::S3Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Shares (in per mille of requests) of each injected fault. Changeable
/// while the server runs.
#[derive(Debug, Default)]
pub struct Faults {
    unavailable: AtomicU32,
    delayed: AtomicU32,
    cut: AtomicU32,
    cut_body: AtomicU32,
    delay_ms: AtomicU64,
    seed: AtomicU64,
    injected: AtomicU64,
    requests: AtomicU64,
    puts_in_flight: AtomicU64,
    max_puts_in_flight: AtomicU64,
}

/// What the injector does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Unavailable,
    Delay(Duration),
    Cut,
    CutBody,
}

impl Faults {
    /// Sets the shares, in per mille: 503 SlowDown answers, answers held
    /// for `delay` first, connections cut before any answer, and answers
    /// whose body stops halfway. Their sum should not pass 1000.
    pub fn set(&self, unavailable: u32, delayed: u32, delay: Duration, cut: u32, cut_body: u32) {
        self.unavailable.store(unavailable, Ordering::Relaxed);
        self.delayed.store(delayed, Ordering::Relaxed);
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
        self.cut.store(cut, Ordering::Relaxed);
        self.cut_body.store(cut_body, Ordering::Relaxed);
    }

    /// Every request fails (a 503, a cut or a delay in turn).
    pub fn fail_all(&self, delay: Duration) {
        self.set(400, 200, delay, 200, 200);
    }

    /// No more faults.
    pub fn clear(&self) {
        self.set(0, 0, Duration::ZERO, 0, 0);
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// How many requests arrived so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The most PUT requests the server was handling at one time.
    pub fn max_puts_in_flight(&self) -> u64 {
        self.max_puts_in_flight.load(Ordering::Relaxed)
    }

    fn pick(&self) -> Fault {
        self.requests.fetch_add(1, Ordering::Relaxed);
        // splitmix64 over a counter: independent per request, lock-free.
        let mut z = self
            .seed
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let mut roll = (z % 1000) as u32;
        let shares = [
            (self.unavailable.load(Ordering::Relaxed), Fault::Unavailable),
            (
                self.delayed.load(Ordering::Relaxed),
                Fault::Delay(Duration::from_millis(self.delay_ms.load(Ordering::Relaxed))),
            ),
            (self.cut.load(Ordering::Relaxed), Fault::Cut),
            (self.cut_body.load(Ordering::Relaxed), Fault::CutBody),
        ];
        for (share, fault) in shares {
            if roll < share {
                self.injected.fetch_add(1, Ordering::Relaxed);
                return fault;
            }
            roll -= share;
        }
        Fault::None
    }
}

/// A response body that delivers `left` bytes and then fails, so hyper
/// drops the connection short of the Content-Length it announced.
struct CutBody {
    inner: Body,
    left: usize,
}

impl HttpBody for CutBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.left == 0 {
            return Poll::Ready(Some(Err("connection cut by the fault injector".into())));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut data) => {
                    if data.len() > self.left {
                        data.truncate(self.left);
                    }
                    self.left -= data.len();
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Counts a PUT as in flight while it lives.
struct PutGuard(Arc<Faults>);

impl PutGuard {
    fn enter(faults: &Arc<Faults>) -> PutGuard {
        let now = faults.puts_in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        faults.max_puts_in_flight.fetch_max(now, Ordering::AcqRel);
        PutGuard(faults.clone())
    }
}

impl Drop for PutGuard {
    fn drop(&mut self) {
        self.0.puts_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The s3s service behind the fault injector.
#[derive(Clone)]
struct Faulty {
    inner: S3Service,
    faults: Arc<Faults>,
}

impl hyper::service::Service<Request<Incoming>> for Faulty {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let fault = this.faults.pick();
            let _put = (req.method() == hyper::Method::PUT).then(|| PutGuard::enter(&this.faults));
            let req = req.map(Body::from);
            match fault {
                Fault::None => Ok(this.inner.call(req).await?),
                Fault::Unavailable => {
                    let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                               <Message>Please reduce your request rate (injected).</Message></Error>";
                    Ok(Response::builder()
                        .status(StatusCode::SERVICE_UNAVAILABLE)
                        .header("content-type", "application/xml")
                        .body(Body::from(Bytes::from_static(xml.as_bytes())))?)
                }
                Fault::Delay(d) => {
                    tokio::time::sleep(d).await;
                    Ok(this.inner.call(req).await?)
                }
                Fault::Cut => Err("connection cut by the fault injector".into()),
                Fault::CutBody => {
                    let resp = this.inner.call(req).await?;
                    let len = resp
                        .headers()
                        .get("content-length")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if len < 2 {
                        // Nothing to cut in half: cut before the answer.
                        return Err("connection cut by the fault injector".into());
                    }
                    Ok(resp.map(|inner| {
                        Body::http_body_unsync(CutBody {
                            inner,
                            left: len / 2,
                        })
                    }))
                }
            }
        })
    }
}

/// An s3s-fs server on a loopback port, stopped when dropped.
pub struct TestS3Server {
    addr: SocketAddr,
    root: PathBuf,
    faults: Arc<Faults>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for TestS3Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestS3Server")
            .field("addr", &self.addr)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl TestS3Server {
    /// Serves the directory `root` (one subdirectory per bucket) on
    /// 127.0.0.1 at a free port, accepting requests signed with the given
    /// key pair.
    pub fn start(root: &Path, access_key: &str, secret_key: &str) -> io::Result<TestS3Server> {
        Self::start_on(
            root,
            SocketAddr::from(([127, 0, 0, 1], 0)),
            access_key,
            secret_key,
            2,
        )
    }

    /// Serves `root` on `addr` with `threads` runtime threads.
    pub fn start_on(
        root: &Path,
        addr: SocketAddr,
        access_key: &str,
        secret_key: &str,
        threads: usize,
    ) -> io::Result<TestS3Server> {
        std::fs::create_dir_all(root)?;
        let fs = s3s_fs::FileSystem::new(root).map_err(|e| io::Error::other(format!("{e:?}")))?;
        let mut builder = s3s::service::S3ServiceBuilder::new(fs);
        builder.set_auth(s3s::auth::SimpleAuth::from_single(access_key, secret_key));
        let faults = Arc::new(Faults::default());
        let service = Faulty {
            inner: builder.build(),
            faults: faults.clone(),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("test-s3-server")
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(addr))?;
        let addr = listener.local_addr()?;
        runtime.spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let service = service.clone();
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        Ok(TestS3Server {
            addr,
            root: root.to_path_buf(),
            faults,
            runtime: Some(runtime),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/BUCKET`, the `--bucket` URL of a bucket.
    pub fn bucket_url(&self, bucket: &str) -> String {
        format!("http://{}/{bucket}", self.addr)
    }

    /// The file holding an object's bytes.
    pub fn object_path(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(bucket).join(key)
    }

    /// The fault injector's knobs.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }
}

impl Drop for TestS3Server {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
