//! The HTTP client every channel sends through: a few long-lived connections
//! per host used round-robin, a bound on requests in flight (a send waits for
//! a slot: backpressure), an optional rate limit (governor), and a cap on how
//! much of an answer's body is read.

use std::fmt::Write as _;
use std::future::Future;
use std::num::{NonZeroU32, NonZeroUsize};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt as _;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus::{IntCounter, IntGauge};
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::ATTEMPT_TIMEOUT;
use super::alpn::{HostProtocols, Route};
use super::connector::{BoxError, KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT, connector};
use super::http2::{Http2Body, Http2Client, Http2Error};

pub use super::connector::{CountingConnector, Dialer, Protocols, Resolver};

/// `connections`: how many connections (or pools) a channel uses
/// round-robin, 1 to 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "usize")]
pub struct Connections(usize);

impl Connections {
    pub const MAX: usize = 64;

    pub const fn new(n: usize) -> Option<Self> {
        if matches!(n, 1..=Self::MAX) { Some(Self(n)) } else { None }
    }

    pub const fn get(self) -> usize {
        self.0
    }
}

impl TryFrom<usize> for Connections {
    type Error = String;

    fn try_from(n: usize) -> Result<Self, String> {
        Self::new(n).ok_or_else(|| format!("must be between 1 and {}", Self::MAX))
    }
}

/// Answers are small JSON objects; anything longer is cut off and classified
/// on its status alone. The same cap applies to every channel.
pub const MAX_RESPONSE_BODY: usize = 64 * 1024;
pub type HttpsClient = Client<HttpsConnector<CountingConnector>, Full<Bytes>>;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No answer within `ATTEMPT_TIMEOUT` of the request leaving.
    #[error("no answer within the attempt timeout")]
    Timeout,
    /// The connection could not be made or broke.
    #[error("connection error: {0}")]
    Connection(BoxError),
}

impl From<hyper_util::client::legacy::Error> for SendError {
    fn from(e: hyper_util::client::legacy::Error) -> Self {
        Self::Connection(e.into())
    }
}

impl From<Http2Error> for SendError {
    fn from(e: Http2Error) -> Self {
        Self::Connection(e.into())
    }
}

/// How one client is built.
#[derive(Debug, Clone, Copy)]
pub struct ClientOptions {
    pub protocols: Protocols,
    /// Idle connections are closed after this.
    pub idle_timeout: Duration,
}

/// The one constructor of an HTTPS client: the engine's channels and the load
/// harness's ceiling both build theirs here, so the ratio between them
/// compares like with like. `tls` must have no ALPN set: the connector sets it.
pub fn https_client(
    tls: rustls::ClientConfig,
    options: ClientOptions,
    dialer: Dialer,
    opened: Option<IntCounter>,
) -> HttpsClient {
    client(tls, options, dialer, opened, false)
}

/// `https_client`, or with `allow_plain_http` one that also sends to
/// `http://` URLs (the relay channel's `dangerous_allow_plain_http`, tests only).
fn client(
    tls: rustls::ClientConfig,
    options: ClientOptions,
    dialer: Dialer,
    opened: Option<IntCounter>,
    allow_plain_http: bool,
) -> HttpsClient {
    let http2_only = options.protocols == Protocols::Http2;
    Client::builder(TokioExecutor::new())
        .http2_only(http2_only)
        .timer(TokioTimer::new())
        // Without a pool timer the idle timeout is not enforced.
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(options.idle_timeout)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .build(connector(tls, options.protocols, dialer, opened, allow_plain_http))
}

/// The HTTP/2 client of `transport::http2` over the same connector: what a
/// pool sends through to a host that speaks HTTP/2.
pub fn http2_client(
    tls: rustls::ClientConfig,
    idle_timeout: Duration,
    dialer: Dialer,
    opened: Option<IntCounter>,
    allow_plain_http: bool,
) -> Http2Client {
    Http2Client::new(connector(tls, Protocols::Http2, dialer, opened, allow_plain_http), idle_timeout)
}

/// A complete answer: status, headers and at most `MAX_RESPONSE_BODY` bytes.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// `ATTEMPT_TIMEOUT` on one request.
///
/// Not an `async fn`: that would keep `request` in its state next to the
/// `Timeout` it moves it into, twice the size (3,336 bytes instead of
/// about 1,700 for a pool request), allocated for every attempt.
pub fn bounded<T>(request: impl Future<Output = Result<T, SendError>>) -> impl Future<Output = Result<T, SendError>> {
    within(ATTEMPT_TIMEOUT, request)
}

/// `bounded` with a bound of the caller's.
fn within<T>(
    bound: Duration,
    request: impl Future<Output = Result<T, SendError>>,
) -> impl Future<Output = Result<T, SendError>> {
    tokio::time::timeout(bound, request).map(|answer| answer.unwrap_or(Err(SendError::Timeout)))
}

/// Sends a request and reads the whole (capped) answer.
pub async fn request(client: &HttpsClient, request: Request<Full<Bytes>>) -> Result<Answer, SendError> {
    Ok(read_answer(client.request(request).await?).await)
}

/// Status, headers and the (capped) body of `response`.
async fn read_answer<B>(response: hyper::Response<B>) -> Answer
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    // A body that is too long or cut off is classified on its status alone.
    let body = Limited::new(body, MAX_RESPONSE_BODY).collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Answer { status: parts.status, headers: parts.headers, body }
}

/// The metric series of one channel's pool.
#[derive(Clone)]
pub struct PoolMetrics {
    pub connections_opened: IntCounter,
    /// Sends waiting for an in-flight slot or the rate limit.
    pub waiting: IntGauge,
}

impl PoolMetrics {
    pub fn new(metrics: &crate::metrics::Metrics, channel: crate::domain::Channel) -> Self {
        let channel = channel.as_str();
        Self {
            connections_opened: metrics.provider_connections_opened.with_label_values(&[channel]),
            waiting: metrics.provider_waiting_sends.with_label_values(&[channel]),
        }
    }
}

/// How a channel's pool is sized.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    /// Independent clients used round-robin; each holds one HTTP/2
    /// connection per host, so a host's per-connection stream limit does not
    /// cap the channel's concurrency to it.
    pub connections: Connections,
    pub max_in_flight: NonZeroUsize,
    /// 0 = no limit.
    pub rate_limit_per_second: u32,
    pub client: ClientOptions,
}

/// One of a pool's `connections` independent clients: HTTP/2 only, or for
/// `Protocols::Http1Or2` the HTTP/2 client and an ALPN one, picked per
/// host by what the host spoke (`alpn`).
struct Lane {
    http2: Http2Client,
    alpn: Option<HttpsClient>,
}

/// `connections` lanes used round-robin; at most `max_in_flight` requests
/// at once, at most `rate_limit_per_second`.
pub struct Pool {
    lanes: Vec<Lane>,
    /// What each host spoke, for pools whose lanes have an ALPN client.
    hosts: Option<HostProtocols>,
    next: AtomicUsize,
    in_flight: Arc<Semaphore>,
    /// Answer bodies read and thrown away after their status decided the
    /// attempt (`send_for_status`): at most `max_in_flight` at once, never
    /// waited for.
    draining: Arc<Semaphore>,
    limiter: Option<governor::DefaultDirectRateLimiter>,
    metrics: PoolMetrics,
}

impl Pool {
    pub fn new(tls: &rustls::ClientConfig, options: PoolOptions, dialer: Dialer, metrics: PoolMetrics) -> Self {
        Self::build(tls, options, dialer, metrics, false)
    }

    /// A pool whose clients also send to `http://` URLs: only for a
    /// configuration flag named `dangerous_*` (tests).
    pub fn allowing_plain_http(
        tls: &rustls::ClientConfig,
        options: PoolOptions,
        dialer: Dialer,
        metrics: PoolMetrics,
    ) -> Self {
        Self::build(tls, options, dialer, metrics, true)
    }

    fn build(
        tls: &rustls::ClientConfig,
        options: PoolOptions,
        dialer: Dialer,
        metrics: PoolMetrics,
        allow_plain_http: bool,
    ) -> Self {
        let opened = Some(metrics.connections_opened.clone());
        let with_alpn = options.client.protocols == Protocols::Http1Or2;
        let idle_timeout = options.client.idle_timeout;
        let lanes = (0..options.connections.get())
            .map(|_| {
                let connect =
                    |protocols| connector(tls.clone(), protocols, dialer.clone(), opened.clone(), allow_plain_http);
                // With ALPN, the HTTP/2 client's connector offers both, and a host that picks
                // http/1.1 is told apart on the connection, before any request is sent (`alpn`).
                let http2 = if with_alpn {
                    Http2Client::probing(connect(Protocols::Http1Or2), idle_timeout)
                } else {
                    Http2Client::new(connect(Protocols::Http2), idle_timeout)
                };
                let alpn = with_alpn
                    .then(|| client(tls.clone(), options.client, dialer.clone(), opened.clone(), allow_plain_http));
                Lane { http2, alpn }
            })
            .collect();
        let hosts = with_alpn.then(HostProtocols::default);
        let limiter = NonZeroU32::new(options.rate_limit_per_second)
            .map(|rate| governor::RateLimiter::direct(governor::Quota::per_second(rate)));
        let in_flight = Arc::new(Semaphore::new(options.max_in_flight.get()));
        let draining = Arc::new(Semaphore::new(options.max_in_flight.get()));
        Self { lanes, hosts, next: AtomicUsize::new(0), in_flight, draining, limiter, metrics }
    }

    /// Waits for an in-flight slot and the rate limit (not part of the
    /// attempt), then sends and reads the (capped) body within
    /// `ATTEMPT_TIMEOUT` (spec 000 section 7: every attempt is bounded).
    pub async fn send(&self, req: Request<Bytes>) -> Result<Answer, SendError> {
        self.send_within(req, ATTEMPT_TIMEOUT).await
    }

    /// `send` with the attempt bounded to `bound` (at most `ATTEMPT_TIMEOUT`):
    /// the wait for a slot and the rate limit is not part of it, so an
    /// attempt that times out is one whose request had its whole bound to
    /// leave and be answered.
    pub async fn send_within(&self, req: Request<Bytes>, bound: Duration) -> Result<Answer, SendError> {
        let _permit = self.slot().await;
        within(bound.min(ATTEMPT_TIMEOUT), async { Ok(read_answer(self.request(req).await?).await) }).await
    }

    /// Like `send`, but the answer is decided on the status line, and the
    /// in-flight slot is free again as soon as it is in: a receiver that
    /// streams a long, slow or endless body holds neither the attempt, nor
    /// the slot, nor memory.
    ///
    /// The body is read and thrown away in the background, frame by frame,
    /// up to the 64 KiB cap and for at most `DRAIN_TIMEOUT`, so that a
    /// kept-alive connection can carry the next request. At most
    /// `max_in_flight` bodies drain at once; a body that finds no room, or
    /// passes the cap or the time, is dropped (HTTP/2 resets its stream,
    /// HTTP/1.1 closes its connection).
    pub async fn send_for_status(&self, req: Request<Bytes>) -> Result<StatusCode, SendError> {
        let permit = self.slot().await;
        let response = bounded(self.request(req)).await?;
        drop(permit);
        let status = response.status();
        let body = response.into_body();
        if hyper::body::Body::is_end_stream(&body) {
            return Ok(status); // nothing to drain: no task for the common case
        }
        if let Ok(room) = self.draining.clone().try_acquire_owned() {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(DRAIN_TIMEOUT, discard(body, MAX_RESPONSE_BODY)).await;
                drop(room);
            });
        }
        Ok(status)
    }

    async fn slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.metrics.waiting.inc();
        // The semaphore is never closed, so acquire cannot fail.
        let permit = self.in_flight.clone().acquire_owned().await.expect("the in-flight semaphore is never closed");
        if let Some(limiter) = &self.limiter {
            limiter.until_ready().await;
        }
        self.metrics.waiting.dec();
        permit
    }

    /// Sends on the next lane: to an HTTP/2 host through its HTTP/2 client
    /// (one connection per host, opened once), to an HTTP/1.1 host through
    /// its ALPN client. A request to an unknown host goes through the
    /// probing HTTP/2 client: it waits at most for that host's connection
    /// (its ALPN result), never for another request's answer, and is sent
    /// at once over h2, or through the ALPN client when the host picked
    /// http/1.1 (`alpn`).
    async fn request(&self, req: Request<Bytes>) -> Result<hyper::Response<AnswerBody>, SendError> {
        let lane = &self.lanes[self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()];
        let (Some(hosts), Some(alpn), Some(host)) = (&self.hosts, &lane.alpn, req.uri().authority().cloned()) else {
            return Ok(lane.http2.request(req).await?.map(AnswerBody::Http2));
        };
        let over_http1 = async |req: Request<Bytes>| Ok(alpn.request(req.map(Full::new)).await?.map(AnswerBody::Hyper));
        match hosts.route(&host) {
            Route::Http1 => over_http1(req).await,
            Route::Http2 => match lane.http2.request(req).await {
                Ok(response) => Ok(response.map(AnswerBody::Http2)),
                Err(e) => {
                    hosts.forget(&host);
                    Err(e.into())
                }
            },
            Route::Probe => {
                // Kept until the connection says which client sends it.
                let copy = copy_of(&req);
                match lane.http2.request(req).await {
                    Ok(response) => {
                        hosts.learned(&host, http::Version::HTTP_2);
                        Ok(response.map(AnswerBody::Http2))
                    }
                    Err(Http2Error::Http1) => {
                        hosts.learned(&host, http::Version::HTTP_11);
                        over_http1(copy).await
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn available_slots(&self) -> usize {
        self.in_flight.available_permits()
    }

    /// Room for more bodies to drain.
    #[cfg(test)]
    pub(crate) fn drain_room(&self) -> usize {
        self.draining.available_permits()
    }

    /// Waits until `n` drains' room is free again (each drain gives its room
    /// back when it ends), for at most `within`.
    #[cfg(test)]
    pub(crate) async fn drain_room_returns(&self, n: u32, within: std::time::Duration) -> bool {
        matches!(tokio::time::timeout(within, self.draining.acquire_many(n)).await, Ok(Ok(_)))
    }
}

/// A request as it was before it was handed to a client: the body is
/// shared, the head copied.
fn copy_of(req: &Request<Bytes>) -> Request<Bytes> {
    let mut copy = Request::new(req.body().clone());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    copy
}

/// An answer's body: from the ALPN client (HTTP/1.1) or from an HTTP/2
/// stream.
pub enum AnswerBody {
    Hyper(hyper::body::Incoming),
    Http2(Http2Body),
}

impl hyper::body::Body for AnswerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Hyper(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Self::Http2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Hyper(body) => body.is_end_stream(),
            Self::Http2(body) => body.is_end_stream(),
        }
    }
}

/// How long an answer's body may take to arrive after its status line before
/// it is dropped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads `body` to its end and keeps nothing; stops (dropping it) at an error
/// or once more than `cap` bytes came.
async fn discard<B: hyper::body::Body + Unpin>(mut body: B, cap: usize) {
    let mut left = cap;
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(data) = frame.data_ref() {
            match left.checked_sub(bytes::Buf::remaining(data)) {
                Some(rest) => left = rest,
                None => return,
            }
        }
    }
}

/// Percent-encodes `text` for one URL path segment: RFC 3986 unreserved
/// characters pass, every other byte becomes `%XX`.
pub fn encode_path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    push_path_segment(&mut out, text);
    out
}

/// How many characters `n` takes in decimal: request bodies carry the
/// sequence id as decimal text and are allocated at their exact length.
pub fn decimal_len(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// `encode_path_segment(text)` appended to `out`.
pub fn push_path_segment(out: &mut String, text: &str) {
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

/// Unix time in whole seconds.
pub(crate) fn unix_now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::client::legacy::connect::dns::GaiResolver;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_path_segment("0123abcdefABCDEF"), "0123abcdefABCDEF");
        assert_eq!(encode_path_segment("a/../b?c#d e"), "a%2F..%2Fb%3Fc%23d%20e");
        assert_eq!(encode_path_segment("é"), "%C3%A9");
        for n in [0, 9, 10, 99, 100, u64::MAX] {
            assert_eq!(decimal_len(n), n.to_string().len(), "{n}");
        }
    }

    /// `chunk` bytes per frame, for ever; counts the frames it gave.
    struct Endless {
        chunk: usize,
        frames: Arc<AtomicUsize>,
    }

    impl hyper::body::Body for Endless {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            self.frames.fetch_add(1, Ordering::SeqCst);
            Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from(vec![0; self.chunk])))))
        }
    }

    #[tokio::test]
    async fn discard_reads_to_the_end_or_to_the_cap_and_keeps_nothing() {
        // A body that ends is read to its end.
        discard(Full::new(Bytes::from(vec![1; 1000])), MAX_RESPONSE_BODY).await;
        // An endless one is read until it passes the cap: 64 KiB in 16 KiB
        // frames is four, the fifth passes it.
        let frames = Arc::new(AtomicUsize::new(0));
        discard(Endless { chunk: 16 * 1024, frames: frames.clone() }, MAX_RESPONSE_BODY).await;
        assert_eq!(frames.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn pool_sizes_follow_the_options() {
        let tls = crate::transport::client_tls_config(&[]).unwrap();
        let metrics = PoolMetrics::new(&crate::metrics::Metrics::new(), crate::domain::Channel::Apns);
        let client = ClientOptions { protocols: Protocols::Http2, idle_timeout: Duration::from_secs(1) };
        let options = |connections, max_in_flight, rate_limit_per_second| PoolOptions {
            connections: Connections::new(connections).unwrap(),
            max_in_flight: NonZeroUsize::new(max_in_flight).unwrap(),
            rate_limit_per_second,
            client,
        };
        let resolver = || Resolver::System(GaiResolver::new());
        let pool = Pool::new(&tls, options(3, 7, 0), Dialer::direct(resolver()), metrics.clone());
        assert_eq!(pool.lanes.len(), 3);
        assert!(pool.hosts.is_none() && pool.lanes.iter().all(|lane| lane.alpn.is_none()));
        assert_eq!(pool.available_slots(), 7);
        assert_eq!(pool.drain_room(), 7);
        assert!(pool.limiter.is_none());
        let limited = Pool::new(&tls, options(1, 1, 5), Dialer::direct(resolver()), metrics);
        assert!(limited.limiter.is_some());
    }

    /// A pool of one lane with the webhook channel's client options,
    /// trusting `pki`; counts the connections it opens.
    fn webhook_pool(pki: &fanout_testkit::TestPki, dir: &tempfile::TempDir) -> (Pool, IntCounter) {
        let ca = dir.path().join("ca.pem");
        pki.write_ca(&ca).unwrap();
        let tls = crate::transport::client_tls_config(&[ca]).unwrap();
        let metrics = PoolMetrics::new(&crate::metrics::Metrics::new(), crate::domain::Channel::Http);
        let options = PoolOptions {
            connections: Connections::new(1).unwrap(),
            max_in_flight: NonZeroUsize::new(256).unwrap(),
            rate_limit_per_second: 0,
            client: crate::transport::checked::CLIENT_OPTIONS,
        };
        let opened = metrics.connections_opened.clone();
        (Pool::new(&tls, options, Dialer::direct(Resolver::system()), metrics), opened)
    }

    fn post(url: &str) -> Request<Bytes> {
        Request::post(url).body(Bytes::from_static(b"{}")).unwrap()
    }

    /// A burst of 200 requests to a new host opens one connection to learn
    /// its protocol, which an HTTP/2 host's requests all share (hyper-util's
    /// ALPN client alone opened one per request). An HTTP/1.1 host gets a
    /// connection per request in flight, and keeps them: requests after the
    /// burst open none.
    #[tokio::test]
    async fn a_burst_to_a_new_host_opens_connections_by_protocol_not_by_request() {
        use fanout_testkit::mock::webhook::{self as mock, MockWebhookConfig};
        for (receiver, version) in [
            (MockWebhookConfig::default(), http::Version::HTTP_2),
            (MockWebhookConfig::http1_only(), http::Version::HTTP_11),
        ] {
            let pki = fanout_testkit::TestPki::generate(&[]).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let receiver = mock::start(&pki, receiver).await.unwrap();
            let (pool, opened) = webhook_pool(&pki, &dir);
            let url = receiver.url("/burst");
            let sends = (0..200).map(|_| pool.send_for_status(post(&url)));
            for status in futures::future::join_all(sends).await {
                assert_eq!(status.unwrap(), StatusCode::OK);
            }
            assert_eq!(receiver.received_count(), 200);
            let host = http::Uri::try_from(url.as_str()).unwrap().authority().cloned().unwrap();
            assert_eq!(pool.hosts.as_ref().unwrap().knows(&host), Some(version));
            if version == http::Version::HTTP_2 {
                assert_eq!(opened.get(), 1, "the probing connection is the shared HTTP/2 one");
            } else {
                // HTTP/1.1: the probing connection, then one per request in
                // flight (how many were in flight at once is the scheduler's).
                let after_burst = opened.get();
                assert!(after_burst >= 2, "{after_burst}");
                // Reused: one request at a time, each connection back in the
                // pool before the next (the pause lets the response's end
                // reach hyper's pool), opens none.
                for _ in 0..20 {
                    assert_eq!(pool.send_for_status(post(&url)).await.unwrap(), StatusCode::OK);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert_eq!(opened.get(), after_burst, "idle connections are reused");
                assert_eq!(receiver.received_count(), 220);
                assert!(receiver.received().iter().all(|r| r.version == "HTTP/1.1"));
            }
        }
    }

    /// A slow first answer from a new host holds up no other request to it:
    /// a request waits at most for the host's connection (its ALPN result),
    /// never for another request's answer, and each request leaves at once.
    #[tokio::test]
    async fn a_slow_first_answer_from_a_new_host_holds_up_no_other_request() {
        use fanout_testkit::ScriptedResponse;
        use fanout_testkit::mock::webhook::{self as mock, MockWebhookConfig};
        for receiver in [MockWebhookConfig::default(), MockWebhookConfig::http1_only()] {
            let pki = fanout_testkit::TestPki::generate(&[]).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let receiver = mock::start(&pki, receiver).await.unwrap();
            receiver.script("/slow", vec![ScriptedResponse::status(200).with_delay(Duration::from_secs(5))]);
            let (pool, _) = webhook_pool(&pki, &dir);
            let slow = pool.send(post(&receiver.url("/slow")));
            tokio::pin!(slow);
            // The slow request is the host's first, and has left.
            tokio::select! {
                answer = &mut slow => panic!("answered before it was received: {answer:?}"),
                received = receiver.wait_for(1, Duration::from_secs(5)) => assert_eq!(received.len(), 1),
            }
            let fast = async {
                let answers = futures::future::join_all((0..3).map(|_| pool.send(post(&receiver.url("/fast"))))).await;
                answers.into_iter().map(|a| a.unwrap().status).collect::<Vec<_>>()
            };
            tokio::select! {
                answer = &mut slow => panic!("the others waited for the first answer: {answer:?}"),
                statuses = fast => assert_eq!(statuses, [StatusCode::OK; 3]),
            }
            assert_eq!(receiver.received_count(), 4, "every request left while the first was unanswered");
            assert_eq!(slow.await.unwrap().status, StatusCode::OK);
        }
    }
}
