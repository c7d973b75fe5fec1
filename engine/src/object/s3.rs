//! `S3Store`: the `storage=s3` object store, any S3-compatible service
//! (AWS S3, MinIO, Ceph RGW, ...), laid out as JuiceFS lays it out: the
//! object for key `K` is `K` in the bucket, holding the raw (possibly
//! compressed) block bytes.
//!
//! The bucket is named by JuiceFS's URL forms: `https://BUCKET.s3.REGION.amazonaws.com`
//! (virtual-hosted, AWS) or `http(s)://HOST[:PORT]/BUCKET` (path-style, any
//! other endpoint). A block's CRC32C travels as the object's S3 checksum
//! (`x-amz-checksum-crc32c`, precomputed by the writer, checked by the
//! server on upload) and is compared again on every whole-object GET that
//! returns it. JuiceFS neither sends nor asks for it, so it reads these
//! objects unchanged; its own objects carry none and are served unchecked.
//!
//! The trait is synchronous and called from many threads; the store owns a
//! small tokio runtime that drives the AWS SDK. Every request runs under a
//! per-attempt timeout and is retried, with exponential backoff and jitter,
//! on 5xx answers, throttling, timeouts and cut connections, up to a fixed
//! number of attempts; then the caller gets an error naming the key and the
//! last cause (the engine turns it into EIO). Uploads in flight are bounded
//! by [`S3Options::max_uploads`], however many threads call `put`.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    SharedCredentialsProvider,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ChecksumAlgorithm;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use base64::Engine as _;
use bytes::Bytes;
use tokio::sync::Semaphore;

use super::{ObjectInfo, ObjectStore};
use crate::backoff::{Backoff, Jitter};
use crate::error::{Error, Result};
use crate::format::Credentials;

/// How the store talks to the service. The defaults follow JuiceFS's
/// (`--get-timeout`/`--put-timeout` 60 s, `--io-retries` 10,
/// `--max-uploads` 20).
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Region to sign for; `None` takes the region from an AWS bucket URL,
    /// then `AWS_REGION` / `AWS_DEFAULT_REGION`, then `us-east-1`.
    pub region: Option<String>,
    /// Limit on one attempt of one request, body transfer included.
    pub request_timeout: Duration,
    /// Limit on opening a connection.
    pub connect_timeout: Duration,
    /// Attempts per call before the caller gets the error (at least 1).
    pub max_attempts: u32,
    /// First backoff between attempts; it doubles each retry.
    pub backoff_base: Duration,
    /// Longest backoff between attempts.
    pub backoff_max: Duration,
    /// PUTs in flight at once, over all callers.
    pub max_uploads: usize,
    /// Threads of the store's own tokio runtime.
    pub runtime_threads: usize,
}

impl Default for S3Options {
    fn default() -> S3Options {
        S3Options {
            region: None,
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            max_attempts: 10,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            max_uploads: 20,
            runtime_threads: 4,
        }
    }
}

/// Where a bucket URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    /// The endpoint to send requests to (`http://127.0.0.1:9000`); `None`
    /// lets the SDK pick AWS's endpoint for the region.
    pub endpoint: Option<String>,
    /// The bucket name.
    pub bucket: String,
    /// Whether the bucket goes in the path (every endpoint but AWS's
    /// virtual-hosted names).
    pub path_style: bool,
    /// The region an AWS host name carries.
    pub region: Option<String>,
}

impl S3Location {
    /// Parses a bucket URL as JuiceFS accepts it for `--storage s3`:
    /// `https://BUCKET.s3[.-]REGION.amazonaws.com[.cn]`, `https://s3.REGION.amazonaws.com/BUCKET`,
    /// or `http(s)://HOST[:PORT]/BUCKET` for other services. Without a
    /// scheme, https is meant.
    pub fn parse(url: &str) -> Result<S3Location> {
        // Keys written into the URL never reach the message.
        let shown = if url.contains("://") {
            crate::redact::redact_url(url)
        } else {
            crate::redact::redact_url(&format!("https://{url}"))
                .trim_start_matches("https://")
                .to_string()
        };
        let bad = |why: &str| {
            Error::Invalid(format!(
                "bucket URL {shown:?} {why}; use http(s)://HOST[:PORT]/BUCKET or https://BUCKET.s3.REGION.amazonaws.com"
            ))
        };
        let (scheme, rest) = match url.split_once("://") {
            Some((s, r)) => (s.to_ascii_lowercase(), r),
            None => ("https".to_string(), url),
        };
        if scheme != "http" && scheme != "https" {
            return Err(bad("has a scheme other than http or https"));
        }
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        // No host, bucket or option holds an '@': one anywhere means keys
        // (whose secret may hold '/' or '?') are written into the URL.
        if host.is_empty() || rest.contains('@') {
            return Err(bad(
                "has no host (or carries credentials; pass them as --access-key/--secret-key)",
            ));
        }
        let path = path
            .split(['?', '#'])
            .next()
            .unwrap_or("")
            .trim_matches('/');
        if path.contains('/') {
            return Err(bad("has a path below the bucket"));
        }
        let host_name = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        let aws = host_name.ends_with(".amazonaws.com") || host_name.ends_with(".amazonaws.com.cn");
        if aws {
            // Labels before "s3" name the bucket (virtual-hosted); the label
            // after it, or its "s3-" suffix, names the region.
            let labels: Vec<&str> = host_name.split('.').collect();
            let Some(s3_at) = labels
                .iter()
                .position(|l| *l == "s3" || l.starts_with("s3-") || *l == "s3express")
            else {
                return Err(bad("is an AWS host without an s3 label"));
            };
            let region = match labels[s3_at].strip_prefix("s3-") {
                Some(r) => Some(r.to_string()),
                None => labels
                    .get(s3_at + 1)
                    .filter(|l| **l != "amazonaws" && **l != "dualstack")
                    .map(|l| l.to_string()),
            };
            let region = region.filter(|r| r != "external-1");
            if s3_at > 0 {
                if !path.is_empty() {
                    return Err(bad("names the bucket both in the host and in the path"));
                }
                return Ok(S3Location {
                    endpoint: None,
                    bucket: labels[..s3_at].join("."),
                    path_style: false,
                    region,
                });
            }
            if path.is_empty() {
                return Err(bad("names no bucket"));
            }
            return Ok(S3Location {
                endpoint: None,
                bucket: path.to_string(),
                path_style: true,
                region,
            });
        }
        if path.is_empty() {
            return Err(bad("names no bucket (the first path component)"));
        }
        Ok(S3Location {
            endpoint: Some(format!("{scheme}://{host}")),
            bucket: path.to_string(),
            path_style: true,
            region: None,
        })
    }
}

/// The tokio runtime the store drives the SDK on. Dropped without waiting
/// for stray tasks, so dropping a store never blocks or panics, even on a
/// runtime thread.
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    fn handle(&self) -> &tokio::runtime::Handle {
        match &self.0 {
            Some(rt) => rt.handle(),
            None => unreachable!("the runtime lives as long as the store"),
        }
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The `s3` object store.
pub struct S3Store {
    client: Client,
    location: S3Location,
    region: String,
    options: S3Options,
    uploads: Arc<Semaphore>,
    runtime: OwnedRuntime,
    jitter: Jitter,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client's config holds the credentials: leave it out.
        f.debug_struct("S3Store")
            .field("location", &self.location)
            .field("region", &self.region)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Why one attempt failed, and whether another may succeed.
struct Failure {
    retry: bool,
    error: io::Error,
}

impl Failure {
    fn fatal(kind: io::ErrorKind, msg: impl Into<String>) -> Failure {
        Failure {
            retry: false,
            error: io::Error::new(kind, msg.into()),
        }
    }

    fn transient(kind: io::ErrorKind, msg: impl Into<String>) -> Failure {
        Failure {
            retry: true,
            error: io::Error::new(kind, msg.into()),
        }
    }
}

/// Classifies an SDK error: which answers are worth another attempt.
fn classify<E>(op: &str, err: SdkError<E>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ServiceError(ctx) => {
            let status = ctx.raw().status().as_u16();
            let code = ctx.err().code().unwrap_or("");
            let message = ctx.err().message().unwrap_or("");
            let text = format!("{op}: HTTP {status} {code} {message}")
                .trim_end()
                .to_string();
            let throttled = matches!(
                code,
                "SlowDown"
                    | "Throttling"
                    | "ThrottlingException"
                    | "RequestThrottled"
                    | "RequestTimeout"
                    | "RequestTimeTooSkewed"
                    | "InternalError"
                    | "ServiceUnavailable"
                    // The body the server got does not match its checksum:
                    // damaged in transit, worth sending again.
                    | "BadDigest"
            );
            if status >= 500 || status == 429 || throttled {
                Failure::transient(io::ErrorKind::Other, text)
            } else if status == 404 || matches!(code, "NoSuchKey" | "NotFound" | "NoSuchBucket") {
                Failure::fatal(io::ErrorKind::NotFound, text)
            } else if status == 403 {
                Failure::fatal(io::ErrorKind::PermissionDenied, text)
            } else {
                Failure::fatal(io::ErrorKind::Other, text)
            }
        }
        SdkError::TimeoutError(_) => Failure::transient(
            io::ErrorKind::TimedOut,
            format!("{op}: {}", DisplayErrorContext(&err)),
        ),
        SdkError::DispatchFailure(d) if d.is_user() => Failure::fatal(
            io::ErrorKind::Other,
            format!("{op}: {}", DisplayErrorContext(&err)),
        ),
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => Failure::transient(
            io::ErrorKind::ConnectionAborted,
            format!("{op}: {}", DisplayErrorContext(&err)),
        ),
        // Request construction failed (no credentials, a bad key): the next
        // attempt would fail the same way.
        _ => Failure::fatal(
            io::ErrorKind::Other,
            format!("{op}: {}", DisplayErrorContext(&err)),
        ),
    }
}

fn obj_err(key: &str, source: io::Error) -> Error {
    Error::Object {
        key: key.to_string(),
        source,
    }
}

/// The HTTP(S) client: rustls with the ring provider, so no C toolchain
/// beyond ring's is needed.
fn http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls;
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

fn env_region() -> Option<String> {
    ["AWS_REGION", "AWS_DEFAULT_REGION"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .find(|r| !r.is_empty())
}

impl S3Store {
    /// Connects to the bucket a URL names. Credentials come from `creds`
    /// when it has an access key, else from the environment
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`)
    /// or the shared profile (`~/.aws/credentials`, `AWS_PROFILE`). Nothing
    /// is sent until the first call.
    pub fn new(bucket_url: &str, creds: &Credentials, options: S3Options) -> Result<S3Store> {
        let location = S3Location::parse(bucket_url)?;
        let region = options
            .region
            .clone()
            .filter(|r| !r.is_empty())
            .or_else(|| location.region.clone())
            .or_else(env_region)
            .unwrap_or_else(|| "us-east-1".to_string());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.runtime_threads.max(1))
            .thread_name("sluice-s3")
            .enable_all()
            .build()?;
        let provider = if creds.access_key.is_empty() {
            if !creds.secret_key.is_empty() {
                return Err(Error::Invalid(
                    "an S3 secret key was given without its access key".into(),
                ));
            }
            Self::ambient_credentials()
        } else {
            if creds.secret_key.is_empty() {
                return Err(Error::Invalid(format!(
                    "S3 access key {:?} was given without its secret key",
                    creds.access_key
                )));
            }
            let token = Some(creds.session_token.expose().to_string()).filter(|t| !t.is_empty());
            SharedCredentialsProvider::new(aws_credential_types::Credentials::new(
                creds.access_key.clone(),
                creds.secret_key.expose().to_string(),
                token,
                None,
                "sluice-volume-settings",
            ))
        };
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(http_client())
            .region(Region::new(region.clone()))
            .credentials_provider(provider)
            .force_path_style(location.path_style)
            // Retries are ours (they also cover reading the body), so the
            // SDK makes exactly one attempt per send.
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(options.connect_timeout)
                    .operation_attempt_timeout(options.request_timeout)
                    .build(),
            )
            // The CRC32C is ours, precomputed; the SDK adds no checksum of
            // its own and validates none.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(endpoint) = &location.endpoint {
            config = config.endpoint_url(endpoint.clone());
        }
        let client = Client::from_conf(config.build());
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        Ok(S3Store {
            client,
            region,
            uploads: Arc::new(Semaphore::new(options.max_uploads.max(1))),
            options,
            location,
            runtime: OwnedRuntime(Some(runtime)),
            jitter: Jitter::new(seed),
        })
    }

    fn ambient_credentials() -> SharedCredentialsProvider {
        use aws_config::environment::credentials::EnvironmentVariableCredentialsProvider;
        use aws_config::meta::credentials::CredentialsProviderChain;
        use aws_config::profile::ProfileFileCredentialsProvider;
        SharedCredentialsProvider::new(
            CredentialsProviderChain::first_try(
                "Environment",
                EnvironmentVariableCredentialsProvider::new(),
            )
            .or_else("Profile", ProfileFileCredentialsProvider::builder().build()),
        )
    }

    /// The bucket name.
    pub fn bucket(&self) -> &str {
        &self.location.bucket
    }

    /// The region requests are signed for.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// Creates the bucket unless it exists (as `juicefs format` does).
    pub fn ensure_bucket(&self) -> Result<()> {
        let bucket = self.location.bucket.clone();
        let client = self.client.clone();
        let exists = self.run(
            self.retrying("head bucket", &self.location.bucket, move || {
                let req = client.head_bucket().bucket(bucket.clone());
                async move {
                    match req.send().await {
                        Ok(_) => Ok(true),
                        Err(e) => {
                            let f = classify("head bucket", e);
                            if f.error.kind() == io::ErrorKind::NotFound {
                                Ok(false)
                            } else {
                                Err(f)
                            }
                        }
                    }
                }
            }),
        )?;
        if exists {
            return Ok(());
        }
        log::info!(
            "creating bucket {} ({})",
            self.location.bucket,
            self.describe()
        );
        let bucket = self.location.bucket.clone();
        let client = self.client.clone();
        let region = self.region.clone();
        self.run(
            self.retrying("create bucket", &self.location.bucket, move || {
                let mut req = client.create_bucket().bucket(bucket.clone());
                if region != "us-east-1" {
                    req = req.create_bucket_configuration(
                        aws_sdk_s3::types::CreateBucketConfiguration::builder()
                            .location_constraint(aws_sdk_s3::types::BucketLocationConstraint::from(
                                region.as_str(),
                            ))
                            .build(),
                    );
                }
                async move {
                    match req.send().await {
                        Ok(_) => Ok(()),
                        Err(e) => {
                            let code = e.code().unwrap_or("").to_string();
                            if code == "BucketAlreadyOwnedByYou" {
                                Ok(())
                            } else {
                                Err(classify("create bucket", e))
                            }
                        }
                    }
                }
            }),
        )
    }

    /// Runs a future on the store's runtime and waits for it. From a
    /// thread that is not a tokio worker this drives it in place; from
    /// inside some runtime it hands it to ours and blocks on the answer,
    /// so a caller in async code gets no panic (though it blocks a worker).
    fn run<T, F>(&self, fut: F) -> T
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.runtime.handle().block_on(fut);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.handle().spawn(async move {
            let _ = tx.send(fut.await);
        });
        match rx.recv() {
            Ok(v) => v,
            Err(_) => unreachable!("the store's runtime ran the task to its end"),
        }
    }

    /// The backoff before retry `n` (1-based): exponential, capped, with
    /// "equal jitter" (half fixed, half random) so that threads which
    /// failed together do not come back together.
    fn backoff(&self, n: u32) -> Duration {
        Backoff::new(self.options.backoff_base, self.options.backoff_max).jittered(n, &self.jitter)
    }

    /// Runs `attempt` under the per-attempt timeout until it succeeds,
    /// fails for good, or uses up the attempts; the error names the key,
    /// the operation, the attempts made and the last cause.
    fn retrying<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        mut attempt: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = std::result::Result<T, Failure>> + Send,
        T: Send + 'static,
    {
        let key = key.to_string();
        let max = self.options.max_attempts.max(1);
        let timeout = self.options.request_timeout;
        let delays: Vec<Duration> = (1..max).map(|n| self.backoff(n)).collect();
        async move {
            let mut n = 0;
            loop {
                n += 1;
                let failure = match tokio::time::timeout(timeout, attempt()).await {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(f)) => f,
                    Err(_) => Failure::transient(
                        io::ErrorKind::TimedOut,
                        format!("{op}: no answer within {timeout:?}"),
                    ),
                };
                if !failure.retry {
                    return Err(obj_err(&key, failure.error));
                }
                if n >= max {
                    log::error!(
                        "S3 {op} of {key} failed {n} times; giving up: {}",
                        failure.error
                    );
                    return Err(obj_err(
                        &key,
                        io::Error::new(
                            failure.error.kind(),
                            format!("gave up after {n} attempts; last: {}", failure.error),
                        ),
                    ));
                }
                let delay = delays[n as usize - 1];
                log::warn!(
                    "S3 {op} of {key} failed (attempt {n} of {max}), retrying in {delay:?}: {}",
                    failure.error
                );
                tokio::time::sleep(delay).await;
            }
        }
    }

    /// The whole object, checked against its stored CRC32C (fetched a
    /// second time on a mismatch), as the body arrived.
    fn get_checked(&self, key: &str) -> Result<Bytes> {
        for round in 0..2 {
            let got = self.run(self.get_object(key, None))?;
            let Some((body, stored)) = got else {
                unreachable!("a whole-object GET has no range to miss");
            };
            let Some(stored) = stored else {
                return Ok(body);
            };
            let actual = sluice_simd::crc32c(0, &body);
            if actual == stored {
                return Ok(body);
            }
            log::error!(
                "object {key} in {} fails its checksum (fetch {}): stored crc32c {stored:08x}, data has {actual:08x}",
                self.describe(),
                round + 1
            );
        }
        Err(Error::Corrupt(format!(
            "object {key} does not match its stored CRC32C"
        )))
    }

    /// One GET (whole object or a range) with the body read to its end.
    fn get_object(
        &self,
        key: &str,
        range: Option<(u64, usize)>,
    ) -> impl Future<Output = Result<Option<(Bytes, Option<u32>)>>> + Send + 'static {
        let client = self.client.clone();
        let bucket = self.location.bucket.clone();
        let k = key.to_string();
        self.retrying("get", key, move || {
            let mut req = client.get_object().bucket(bucket.clone()).key(k.clone());
            if let Some((off, len)) = range {
                req = req.range(format!("bytes={off}-{}", off + len as u64 - 1));
            }
            let req = req.customize().mutate_request(move |r| {
                // Ask for the stored checksum without making the SDK check
                // it: we check it ourselves, and tell a mismatch (refetch,
                // then EIO) from a cut body (retry).
                if range.is_none() {
                    r.headers_mut().insert("x-amz-checksum-mode", "ENABLED");
                }
            });
            async move {
                let out = match req.send().await {
                    Ok(out) => out,
                    Err(e) => {
                        if range.is_some()
                            && matches!(&e, SdkError::ServiceError(c) if c.raw().status().as_u16() == 416)
                        {
                            // A range that starts at or past the end.
                            return Ok(None);
                        }
                        return Err(classify("get", e));
                    }
                };
                let stored = out
                    .checksum_crc32_c()
                    .filter(|c| !c.contains('-'))
                    .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
                    .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
                    .map(u32::from_be_bytes);
                let expected = out.content_length();
                let body = out.body.collect().await.map_err(|e| {
                    Failure::transient(
                        io::ErrorKind::ConnectionAborted,
                        format!("get: reading the body: {}", DisplayErrorContext(&e)),
                    )
                })?;
                let body = body.into_bytes();
                if let Some(n) = expected
                    && n as usize != body.len()
                {
                    return Err(Failure::transient(
                        io::ErrorKind::UnexpectedEof,
                        format!("get: body has {} of {n} bytes", body.len()),
                    ));
                }
                Ok(Some((body, stored)))
            }
        })
    }
}

impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        match &self.location.endpoint {
            Some(ep) => format!("s3://{} at {ep}", self.location.bucket),
            None => format!("s3://{} in {}", self.location.bucket, self.region),
        }
    }

    fn put(&self, key: &str, data: &[u8], crc: Option<u32>) -> Result<()> {
        let crc = crc.unwrap_or_else(|| sluice_simd::crc32c(0, data));
        let crc_b64 = base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes());
        let body = Bytes::copy_from_slice(data);
        let client = self.client.clone();
        let bucket = self.location.bucket.clone();
        let k = key.to_string();
        let uploads = self.uploads.clone();
        let put = self.retrying("put", key, move || {
            let req = client
                .put_object()
                .bucket(bucket.clone())
                .key(k.clone())
                .content_length(body.len() as i64)
                .checksum_algorithm(ChecksumAlgorithm::Crc32C)
                .checksum_crc32_c(crc_b64.clone())
                .body(ByteStream::from(body.clone()));
            async move { req.send().await.map(|_| ()).map_err(|e| classify("put", e)) }
        });
        self.run(async move {
            // The permit is held across retries too, so a struggling
            // server never sees more than max_uploads uploads at once.
            let _permit = uploads.acquire_owned().await;
            put.await
        })
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_checked(key).map(Vec::from)
    }

    fn get_to(&self, key: &str, out: &mut [u8]) -> Result<usize> {
        // From the body as received: no second buffer on the way.
        let body = self.get_checked(key)?;
        super::copy_whole(key, &body, out)
    }

    fn get_range(&self, key: &str, off: u64, len: usize) -> Result<Vec<u8>> {
        if len == 0 {
            // Still say whether the object exists, as the file store does.
            self.head(key)?;
            return Ok(Vec::new());
        }
        let got = self.run(self.get_object(key, Some((off, len))))?;
        let mut data = got.map(|(b, _)| Vec::from(b)).unwrap_or_default();
        // A server that ignores Range sends the whole object.
        if data.len() > len {
            data.truncate(len);
        }
        Ok(data)
    }

    fn head(&self, key: &str) -> Result<ObjectInfo> {
        let client = self.client.clone();
        let bucket = self.location.bucket.clone();
        let k = key.to_string();
        let fut = self.retrying("head", key, move || {
            let req = client.head_object().bucket(bucket.clone()).key(k.clone());
            async move { req.send().await.map_err(|e| classify("head", e)) }
        });
        let out = self.run(fut)?;
        Ok(ObjectInfo {
            key: key.to_string(),
            size: out.content_length().unwrap_or(0).max(0) as u64,
            mtime: out
                .last_modified()
                .and_then(|t| SystemTime::try_from(*t).ok())
                .unwrap_or(SystemTime::UNIX_EPOCH),
        })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let client = self.client.clone();
        let bucket = self.location.bucket.clone();
        let k = key.to_string();
        let fut = self.retrying("delete", key, move || {
            let req = client.delete_object().bucket(bucket.clone()).key(k.clone());
            async move {
                match req.send().await {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        let f = classify("delete", e);
                        if f.error.kind() == io::ErrorKind::NotFound {
                            Ok(())
                        } else {
                            Err(f)
                        }
                    }
                }
            }
        });
        self.run(fut)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let client = self.client.clone();
            let bucket = self.location.bucket.clone();
            let p = prefix.to_string();
            let t = token.clone();
            let what = if prefix.is_empty() {
                "(bucket)"
            } else {
                prefix
            };
            let fut = self.retrying("list", what, move || {
                let mut req = client
                    .list_objects_v2()
                    .bucket(bucket.clone())
                    .max_keys(1000);
                if !p.is_empty() {
                    req = req.prefix(p.clone());
                }
                if let Some(t) = &t {
                    req = req.continuation_token(t.clone());
                }
                async move { req.send().await.map_err(|e| classify("list", e)) }
            });
            let page = self.run(fut)?;
            for obj in page.contents() {
                let Some(key) = obj.key() else { continue };
                out.push(ObjectInfo {
                    key: key.to_string(),
                    size: obj.size().unwrap_or(0).max(0) as u64,
                    mtime: obj
                        .last_modified()
                        .and_then(|t| SystemTime::try_from(*t).ok())
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) && !t.is_empty() => {
                    token = Some(t.to_string())
                }
                _ => break,
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.dedup_by(|a, b| a.key == b.key);
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
