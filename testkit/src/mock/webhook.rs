//! Mock webhook receiver: an HTTPS server (HTTP/1.1 and HTTP/2 by ALPN) that
//! records every request, checks its signature when the path has a signing
//! key, and answers from a per-path script.
//!
//! An answer's body is empty unless asked otherwise: `AnswerBody::Endless`
//! (per script with `ScriptedResponse::with_endless_body`, or for every
//! unscripted answer with `MockWebhookConfig::default_body`) sends the status
//! line and headers at once, then a body that never ends, a chunk at a time,
//! until the client resets the stream or closes the connection;
//! `MockWebhook::open_bodies` counts those still being sent (a
//! receiver must not hold an attempt, a pool slot or memory with its body).
//!
//! Signatures are checked independently of the engine: the Standard Webhooks v1
//! scheme (`webhook-id`/`webhook-timestamp`/`webhook-signature`, spec 000 §7.1)
//! and the hub relay scheme (`x-gim-signature: t=..,v1=<hex>`, spec 003 §2.2).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use hmac::{Hmac, KeyInit as _, Mac as _};
use http::{Request, Response};
use http_body_util::{Either, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use sha2::Sha256;

use crate::lock;
use crate::outage::Outage;
use crate::pki::{ALPN_H2, ALPN_HTTP1, TestPki};
use crate::recorder::Recorder;
use crate::request::{header, header_list};
use crate::server::{self, Server};

type HmacSha256 = Hmac<Sha256>;

/// How the mock listens and answers by default.
#[derive(Clone, Debug)]
pub struct MockWebhookConfig {
    /// Listen address; port 0 picks a free port (see `MockWebhook::addr`).
    pub bind: SocketAddr,
    /// ALPN ids offered, e.g. `[b"http/1.1"]` to force HTTP/1.1.
    pub alpn: Vec<Vec<u8>>,
    /// Added before every response.
    pub latency: Duration,
    /// Status for requests no script covers.
    pub default_status: u16,
    /// Body for requests no script covers.
    pub default_body: AnswerBody,
    /// Keep every request in memory (`received`). Load runs turn this off:
    /// then only the count is kept, and signing keys set by path are not checked.
    pub record_requests: bool,
    /// Called for every request before it is answered; an answer it returns
    /// wins over the path's script and the default status.
    pub on_request: Option<RequestHook>,
}

/// A request as the `on_request` hook sees it (borrowed, nothing copied).
pub struct HookRequest<'a> {
    pub path: &'a str,
    pub headers: &'a http::HeaderMap,
    pub body: &'a [u8],
}

/// Callback for `MockWebhookConfig::on_request`. It runs on the connection
/// task, so it must be quick and must not block.
#[derive(Clone)]
pub struct RequestHook(pub Arc<HookFn>);

/// The hook's function type.
pub type HookFn = dyn Fn(&HookRequest<'_>) -> Option<ScriptedResponse> + Send + Sync;

impl RequestHook {
    pub fn new(f: impl Fn(&HookRequest<'_>) -> Option<ScriptedResponse> + Send + Sync + 'static) -> Self {
        RequestHook(Arc::new(f))
    }
}

impl std::fmt::Debug for RequestHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestHook")
    }
}

impl Default for MockWebhookConfig {
    fn default() -> Self {
        MockWebhookConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            alpn: vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()],
            latency: Duration::ZERO,
            default_status: 200,
            default_body: AnswerBody::Empty,
            record_requests: true,
            on_request: None,
        }
    }
}

impl MockWebhookConfig {
    /// Default config that offers only HTTP/1.1.
    pub fn http1_only() -> Self {
        MockWebhookConfig { alpn: vec![ALPN_HTTP1.to_vec()], ..Default::default() }
    }
}

/// What follows an answer's status line and headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AnswerBody {
    /// Nothing: the answer ends with its headers.
    #[default]
    Empty,
    /// A body that never ends: `chunk_bytes` bytes at once, then again every
    /// `every`, for as long as the client keeps the stream (HTTP/1.1: chunked).
    Endless { chunk_bytes: usize, every: Duration },
}

/// One scripted answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptedResponse {
    pub status: u16,
    pub retry_after: Option<String>,
    pub location: Option<String>,
    /// Wait before answering (on top of the config's latency). Longer than the
    /// client's timeout simulates a receiver that never answers.
    pub delay: Duration,
    pub body: AnswerBody,
}

impl ScriptedResponse {
    /// Answer `status` immediately, no extra headers, no body.
    pub fn status(status: u16) -> Self {
        ScriptedResponse { status, retry_after: None, location: None, delay: Duration::ZERO, body: AnswerBody::Empty }
    }

    /// Follows the headers with a body that never ends: `chunk_bytes` bytes
    /// every `every`.
    pub fn with_endless_body(mut self, chunk_bytes: usize, every: Duration) -> Self {
        self.body = AnswerBody::Endless { chunk_bytes, every };
        self
    }

    /// Adds a `retry-after` header.
    pub fn with_retry_after(mut self, value: impl Into<String>) -> Self {
        self.retry_after = Some(value.into());
        self
    }

    /// Adds a `location` header (for redirect answers).
    pub fn with_location(mut self, value: impl Into<String>) -> Self {
        self.location = Some(value.into());
        self
    }

    /// Waits `delay` before answering.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// A request as the mock received it.
#[derive(Clone, Debug)]
pub struct ReceivedRequest {
    pub received_at: SystemTime,
    pub method: String,
    /// URI path without the query.
    pub path: String,
    /// "HTTP/1.1" or "HTTP/2.0".
    pub version: String,
    /// Names are lowercase; non-UTF-8 values are converted lossily.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// `None` when the path has no signing key.
    pub signature_valid: Option<bool>,
    /// Status chosen for this request. With a delay longer than the client's
    /// timeout it never reached the client.
    pub status_sent: u16,
}

impl ReceivedRequest {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// HTTP/2 streams per connection: hyper's default, as a typical receiver.
const MAX_CONCURRENT_STREAMS: u32 = 200;

/// Shared between the handle and the connection tasks.
struct State {
    latency: Duration,
    default_status: u16,
    default_body: AnswerBody,
    record_requests: bool,
    on_request: Option<RequestHook>,
    /// Endless bodies started and not dropped yet.
    open_bodies: Arc<AtomicUsize>,
    recorder: Recorder<ReceivedRequest>,
    signing_keys: Mutex<HashMap<String, Vec<u8>>>,
    scripts: Mutex<HashMap<String, VecDeque<ScriptedResponse>>>,
}

/// A running mock. The server stops when this is dropped.
pub struct MockWebhook {
    server: Server,
    state: Arc<State>,
    outage: Outage,
}

/// Binds, then serves in a background task until the `MockWebhook` is dropped.
pub async fn start(pki: &TestPki, config: MockWebhookConfig) -> anyhow::Result<MockWebhook> {
    let listener = server::bind("mock webhook", config.bind).await?;
    let state = Arc::new(State {
        latency: config.latency,
        default_status: config.default_status,
        default_body: config.default_body,
        record_requests: config.record_requests,
        on_request: config.on_request.clone(),
        open_bodies: Arc::new(AtomicUsize::new(0)),
        recorder: Recorder::new(),
        signing_keys: Mutex::new(HashMap::new()),
        scripts: Mutex::new(HashMap::new()),
    });
    let outage = Outage::new();
    let options = server::Options {
        alpn: config.alpn,
        max_concurrent_streams: MAX_CONCURRENT_STREAMS,
        wire: None,
        outage: Some(outage.clone()),
        unavailable_body: "",
    };
    let handler_state = state.clone();
    let server = Server::serve(listener, pki, options, move |req| handle(req, handler_state.clone()))?;
    Ok(MockWebhook { server, state, outage })
}

impl MockWebhook {
    /// The bound address (with the real port when `bind` used port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `https://<addr><path>`; an unspecified bind address becomes loopback.
    /// The server certificate covers 127.0.0.1 and ::1.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.base_url())
    }

    /// The switch that makes this receiver hang, refuse connections, stall
    /// in the TLS handshake, answer slowly or answer 503
    /// ([`crate::outage`]). Requests an outage meets are counted there, not
    /// recorded here.
    pub fn outage(&self) -> &Outage {
        &self.outage
    }

    /// Copies of every request recorded so far, in arrival order.
    pub fn received(&self) -> Vec<ReceivedRequest> {
        self.state.recorder.all()
    }

    /// Number of requests received so far (no copying).
    pub fn received_count(&self) -> usize {
        self.state.recorder.count()
    }

    /// Waits until at least `n` requests were received or `timeout` passed,
    /// then returns all recorded requests (possibly fewer than `n`).
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<ReceivedRequest> {
        self.state.recorder.wait_for(n, timeout).await
    }

    /// Verifies the signature of every later request to `path` under `key`.
    pub fn set_signing_key(&self, path: &str, key: Vec<u8>) {
        lock(&self.state.signing_keys).insert(path.to_string(), key);
    }

    /// The next requests to `path` get `responses` in order, then
    /// `default_status`. Appends to any answers still queued for `path`.
    pub fn script(&self, path: &str, responses: Vec<ScriptedResponse>) {
        lock(&self.state.scripts).entry(path.to_string()).or_default().extend(responses);
    }

    /// Endless bodies (`AnswerBody::Endless`) still being sent: started, and
    /// the client has not yet reset the stream or closed the connection.
    pub fn open_bodies(&self) -> usize {
        self.state.open_bodies.load(Ordering::SeqCst)
    }

    /// Waits until at most `n` endless bodies are still being sent, or
    /// `timeout` passed; returns how many are.
    pub async fn wait_for_open_bodies_at_most(&self, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let open = self.open_bodies();
            if open <= n || tokio::time::Instant::now() >= deadline {
                return open;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Forgets recorded requests (scripts and keys stay).
    pub fn clear_received(&self) {
        self.state.recorder.clear();
    }

    /// Stops accepting and aborts open connections; waits for the listener to close.
    pub async fn shutdown(self) {
        self.server.stop().await;
    }
}

/// The body of an answer: whole (empty), or endless.
type AnswerStream = Either<Full<Bytes>, EndlessBody>;

async fn handle(req: Request<Incoming>, state: Arc<State>) -> Response<AnswerStream> {
    let received_at = SystemTime::now();
    let (parts, body) = req.into_parts();
    let body = server::read_body(body).await;
    let hooked = state
        .on_request
        .as_ref()
        .and_then(|hook| (hook.0)(&HookRequest { path: parts.uri.path(), headers: &parts.headers, body: &body }));
    if !state.record_requests {
        // Compact mode: count only; the hook (if any) did the bookkeeping.
        let scripted = hooked.unwrap_or_else(|| next_scripted(&state, parts.uri.path()));
        state.recorder.count_only();
        return answer(&state, scripted).await;
    }
    let path = parts.uri.path().to_string();
    let key = lock(&state.signing_keys).get(&path).cloned();
    let signature_valid = key.map(|key| verify_request(&key, &parts.headers, &body));
    let scripted = hooked.unwrap_or_else(|| next_scripted(&state, &path));

    // Record before any delay so tests see requests whose answer is still pending.
    state.recorder.record(ReceivedRequest {
        received_at,
        method: parts.method.to_string(),
        path,
        version: format!("{:?}", parts.version),
        headers: header_list(&parts.headers),
        body,
        signature_valid,
        status_sent: scripted.status,
    });
    answer(&state, scripted).await
}

/// The path's next scripted answer, else the default status and body.
fn next_scripted(state: &State, path: &str) -> ScriptedResponse {
    lock(&state.scripts).get_mut(path).and_then(VecDeque::pop_front).unwrap_or_else(|| ScriptedResponse {
        body: state.default_body,
        ..ScriptedResponse::status(state.default_status)
    })
}

/// Waits the configured and scripted delay, then answers with the scripted body.
async fn answer(state: &State, scripted: ScriptedResponse) -> Response<AnswerStream> {
    let delay = state.latency + scripted.delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let headers: Vec<(&str, String)> = [("retry-after", scripted.retry_after), ("location", scripted.location)]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
        .collect();
    let response = server::response(scripted.status, String::new(), &headers);
    match scripted.body {
        AnswerBody::Empty => response.map(Either::Left),
        AnswerBody::Endless { chunk_bytes, every } => {
            response.map(|_| Either::Right(EndlessBody::new(chunk_bytes, every, state.open_bodies.clone())))
        }
    }
}

/// A body that never ends: a chunk at once, then one every interval. Counted
/// in `open` from creation until hyper drops it (the client went away).
struct EndlessBody {
    chunk: Bytes,
    tick: tokio::time::Interval,
    open: Arc<AtomicUsize>,
}

impl EndlessBody {
    fn new(chunk_bytes: usize, every: Duration, open: Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        // An interval's first tick is immediate.
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        EndlessBody { chunk: Bytes::from(vec![b'.'; chunk_bytes.max(1)]), tick, open }
    }
}

impl hyper::body::Body for EndlessBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        ready!(self.tick.poll_tick(cx));
        Poll::Ready(Some(Ok(Frame::data(self.chunk.clone()))))
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for EndlessBody {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Verifies whichever signature scheme the request carries; no signature is invalid.
fn verify_request(key: &[u8], headers: &http::HeaderMap, body: &[u8]) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(signature) = header("webhook-signature") {
        let (Some(id), Some(timestamp)) = (header("webhook-id"), header("webhook-timestamp")) else {
            return false;
        };
        verify_standard_webhooks(key, id, timestamp, body, signature)
    } else if let Some(signature) = header("x-gim-signature") {
        verify_gim_signature_now(key, signature, body)
    } else {
        false
    }
}

/// HMAC-SHA256 over `{id}.{timestamp}.` followed by `body`.
fn standard_webhooks_mac(key: &[u8], id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The Standard Webhooks v1 signature header value: `v1,<base64 HMAC>`.
pub fn standard_webhooks_signature(key: &[u8], id: &str, timestamp: &str, body: &[u8]) -> String {
    let tag = standard_webhooks_mac(key, id, timestamp, body).finalize().into_bytes();
    format!("v1,{}", BASE64.encode(tag))
}

/// True when any space-separated `v1,<base64>` entry of `signature_header`
/// matches (constant-time compare). Other versions are ignored.
pub fn verify_standard_webhooks(key: &[u8], id: &str, timestamp: &str, body: &[u8], signature_header: &str) -> bool {
    let mac = standard_webhooks_mac(key, id, timestamp, body);
    signature_header
        .split_ascii_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|b64| BASE64.decode(b64).ok())
        .any(|tag| mac.clone().verify_slice(&tag).is_ok())
}

/// 003 §2.2's recommended receiver: the signature, and `|now - t| <= 300` s
/// (a replay outside the window is refused).
pub fn verify_gim_signature_now(key: &[u8], signature_header: &str, body: &[u8]) -> bool {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let t = signature_header
        .split(',')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == "t")
        .and_then(|(_, v)| v.parse::<i64>().ok());
    t.is_some_and(|t| (now - t).abs() <= GIM_REPLAY_WINDOW_SECONDS) && verify_gim_signature(key, signature_header, body)
}

/// 003 §2.2: the recommended replay window.
pub const GIM_REPLAY_WINDOW_SECONDS: i64 = 300;

/// Spec 003 §2.2: `t=<unix seconds>,v1=<hex HMAC-SHA256 over "{t}." ‖ body>`.
/// True when a `v1` entry matches. No replay window is enforced.
pub fn verify_gim_signature(key: &[u8], signature_header: &str, body: &[u8]) -> bool {
    let pairs: Vec<(&str, &str)> = signature_header.split(',').filter_map(|pair| pair.trim().split_once('=')).collect();
    let Some(t) = pairs.iter().find(|(k, _)| *k == "t").map(|(_, v)| *v) else {
        return false;
    };
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    pairs
        .iter()
        .filter(|(k, _)| *k == "v1")
        .filter_map(|(_, v)| hex::decode(v).ok())
        .any(|tag| mac.clone().verify_slice(&tag).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    use crate::test_client::{TestClient, Versions, client};

    const KEY: [u8; 32] = [7; 32];
    const BODY: &str = r#"{"topic":"AQID","sequence_id":"9007199254740993","recipient_id":"0101"}"#;
    const WAIT: Duration = Duration::from_secs(5);

    /// POSTs `body` with Standard Webhooks headers signed under `key`.
    async fn post_signed(client: &TestClient, url: &str, key: &[u8], body: &str) -> Response<Incoming> {
        let timestamp = "1700000000";
        let signature = standard_webhooks_signature(key, "msg-1", timestamp, body.as_bytes());
        let request = Request::post(url)
            .header("content-type", "application/json")
            .header("webhook-id", "msg-1")
            .header("webhook-timestamp", timestamp)
            .header("webhook-signature", signature)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        client.request(request).await.unwrap()
    }

    #[test]
    fn standard_webhooks_test_vector() {
        let expected = "v1,IszeBLRjxb7spJ5RLi+KW0w/aK3Buioq9E6jl3MKWZw=";
        let body = BODY.as_bytes();
        assert_eq!(standard_webhooks_signature(&KEY, "fixed-id", "1700000000", body), expected);
        assert!(verify_standard_webhooks(&KEY, "fixed-id", "1700000000", body, expected));
        // Several signatures, one valid, others of unknown version or wrong.
        let several = format!("v1a,xyz v1,AAAA {expected}");
        assert!(verify_standard_webhooks(&KEY, "fixed-id", "1700000000", body, &several));
        // Wrong key, id, timestamp, body, or garbage.
        assert!(!verify_standard_webhooks(&[8; 32], "fixed-id", "1700000000", body, expected));
        assert!(!verify_standard_webhooks(&KEY, "other-id", "1700000000", body, expected));
        assert!(!verify_standard_webhooks(&KEY, "fixed-id", "1700000001", body, expected));
        assert!(!verify_standard_webhooks(&KEY, "fixed-id", "1700000000", b"{}", expected));
        assert!(!verify_standard_webhooks(&KEY, "fixed-id", "1700000000", body, "v1,!!"));
        assert!(!verify_standard_webhooks(&KEY, "fixed-id", "1700000000", body, ""));
    }

    #[test]
    fn gim_signature_test_vector() {
        let key = b"example-secret-0123456789abcdef0123";
        let body = br#"{"v":1,"hub_id":"hubexample","delivery_id":"3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7c"}"#;
        let header = "t=1760600000,v1=41f7f7c39db767f966e6c1cd60c6a460266194f33b271d1244ac9bb7b38e544e";
        assert!(verify_gim_signature(key, header, body));
        assert!(!verify_gim_signature(key, header, b"{}"));
        assert!(!verify_gim_signature(
            key,
            "t=1760600001,v1=41f7f7c39db767f966e6c1cd60c6a460266194f33b271d1244ac9bb7b38e544e",
            body
        ));
        assert!(!verify_gim_signature(key, "v1=41f7", body));
        // The replay window: the vector's t is long past.
        assert!(!verify_gim_signature_now(key, header, body));
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        let mut mac = HmacSha256::new_from_slice(key).unwrap();
        mac.update(format!("{now}.").as_bytes());
        mac.update(body);
        let fresh = format!("t={now},v1={}", hex::encode(mac.finalize().into_bytes()));
        assert!(verify_gim_signature_now(key, &fresh, body));
        // Re-serialised JSON (a space added) is not the raw body.
        assert!(!verify_gim_signature_now(key, &fresh, &[&body[..5], b" ", &body[5..]].concat()));
    }

    #[tokio::test]
    async fn records_requests_over_http2() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockWebhookConfig::default()).await.unwrap();
        let client = client(&pki, Versions::Http2);

        let response = post_signed(&client, &mock.url("/hook?x=1"), &KEY, BODY).await;
        assert_eq!(response.status(), 200);

        let received = mock.wait_for(1, WAIT).await;
        assert_eq!(received.len(), 1);
        let request = &received[0];
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/hook");
        assert_eq!(request.version, "HTTP/2.0");
        assert_eq!(request.header("Content-Type"), Some("application/json"));
        assert_eq!(request.header("webhook-id"), Some("msg-1"));
        assert_eq!(request.body, BODY.as_bytes());
        let json = request.json().unwrap();
        assert_eq!(json["sequence_id"], "9007199254740993");
        assert_eq!(request.signature_valid, None); // no key set for /hook
        assert_eq!(request.status_sent, 200);
        assert!(request.received_at <= SystemTime::now());
        assert_eq!(mock.received_count(), 1);
    }

    #[tokio::test]
    async fn records_requests_over_http1() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockWebhookConfig::default()).await.unwrap();
        let client = client(&pki, Versions::Http1);

        let response = post_signed(&client, &mock.url("/h1"), &KEY, BODY).await;
        assert_eq!(response.status(), 200);
        let received = mock.wait_for(1, WAIT).await;
        assert_eq!(received[0].version, "HTTP/1.1");
        assert_eq!(received[0].body, BODY.as_bytes());
    }

    #[tokio::test]
    async fn http1_only_config_downgrades_alpn() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockWebhookConfig::http1_only()).await.unwrap();
        // The client offers h2 and http/1.1; the server picks http/1.1.
        let client = client(&pki, Versions::Any);
        let response = post_signed(&client, &mock.url("/h1"), &KEY, BODY).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.version(), http::Version::HTTP_11);
        assert_eq!(mock.wait_for(1, WAIT).await[0].version, "HTTP/1.1");

        // And with both offered, ALPN picks h2.
        let both = start(&pki, MockWebhookConfig::default()).await.unwrap();
        let response = post_signed(&client, &both.url("/h2"), &KEY, BODY).await;
        assert_eq!(response.version(), http::Version::HTTP_2);
    }

    #[tokio::test]
    async fn script_answers_in_order_then_default() {
        let pki = TestPki::generate(&[]).unwrap();
        let config = MockWebhookConfig { default_status: 204, ..Default::default() };
        let mock = start(&pki, config).await.unwrap();
        mock.script(
            "/scripted",
            vec![
                ScriptedResponse::status(503).with_retry_after("7"),
                ScriptedResponse::status(307).with_location("https://127.0.0.1:1/elsewhere"),
                ScriptedResponse::status(200),
            ],
        );
        let client = client(&pki, Versions::Http2);
        let url = mock.url("/scripted");

        let first = post_signed(&client, &url, &KEY, BODY).await;
        assert_eq!(first.status(), 503);
        assert_eq!(first.headers()["retry-after"], "7");

        // Another path is not affected by the script.
        let other = post_signed(&client, &mock.url("/other"), &KEY, BODY).await;
        assert_eq!(other.status(), 204);

        let second = post_signed(&client, &url, &KEY, BODY).await;
        assert_eq!(second.status(), 307);
        assert_eq!(second.headers()["location"], "https://127.0.0.1:1/elsewhere");
        assert!(second.headers().get("retry-after").is_none());

        assert_eq!(post_signed(&client, &url, &KEY, BODY).await.status(), 200);
        assert_eq!(post_signed(&client, &url, &KEY, BODY).await.status(), 204);

        let statuses: Vec<u16> = mock.received().iter().map(|r| r.status_sent).collect();
        assert_eq!(statuses, vec![503, 204, 307, 200, 204]);
    }

    #[tokio::test]
    async fn verifies_signatures_per_path() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockWebhookConfig::default()).await.unwrap();
        mock.set_signing_key("/signed", KEY.to_vec());
        let client = client(&pki, Versions::Http2);

        post_signed(&client, &mock.url("/signed"), &KEY, BODY).await;
        post_signed(&client, &mock.url("/signed"), &[9; 32], BODY).await;
        // No signature headers at all.
        let unsigned = Request::post(mock.url("/signed")).body(Full::new(Bytes::from_static(b"{}"))).unwrap();
        client.request(unsigned).await.unwrap();
        post_signed(&client, &mock.url("/unsigned-path"), &KEY, BODY).await;

        let valid: Vec<Option<bool>> = mock.wait_for(4, WAIT).await.iter().map(|r| r.signature_valid).collect();
        assert_eq!(valid, vec![Some(true), Some(false), Some(false), None]);
    }

    #[tokio::test]
    async fn delayed_answer_is_recorded_before_it_is_sent() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockWebhookConfig::default()).await.unwrap();
        mock.script("/slow", vec![ScriptedResponse::status(200).with_delay(Duration::from_secs(30))]);
        let client = client(&pki, Versions::Http2);
        let url = mock.url("/slow");
        let request = post_signed(&client, &url, &KEY, BODY);
        // The client gives up long before the mock answers.
        let outcome = tokio::time::timeout(Duration::from_millis(300), request).await;
        assert!(outcome.is_err(), "the mock answered despite the scripted delay");
        assert_eq!(mock.wait_for(1, WAIT).await.len(), 1);
    }

    #[tokio::test]
    async fn an_endless_body_streams_until_the_client_goes_away() {
        use http_body_util::BodyExt as _;
        let pki = TestPki::generate(&[]).unwrap();
        let every = Duration::from_millis(20);
        let config =
            MockWebhookConfig { default_body: AnswerBody::Endless { chunk_bytes: 1000, every }, ..Default::default() };
        let mock = start(&pki, config).await.unwrap();
        mock.script("/quiet", vec![ScriptedResponse::status(204)]);
        mock.script("/slow", vec![ScriptedResponse::status(201).with_endless_body(10, Duration::from_secs(3600))]);
        for versions in [Versions::Http2, Versions::Http1] {
            let client = client(&pki, versions);
            // The status line and headers come at once; then chunk after chunk.
            let response = post_signed(&client, &mock.url("/endless"), &KEY, BODY).await;
            assert_eq!(response.status(), 200);
            assert_eq!(mock.open_bodies(), 1);
            let mut body = response.into_body();
            let mut read = 0;
            while read < 5000 {
                let frame = body.frame().await.expect("the body never ends").expect("a frame");
                read += frame.into_data().map(|d| d.len()).unwrap_or(0);
            }
            // The client goes away: the mock drops the body.
            drop(body);
            drop(client);
            assert_eq!(mock.wait_for_open_bodies_at_most(0, WAIT).await, 0, "{versions:?}");
        }
        // A script's body wins over the default, and the default is only the default.
        let client = client(&pki, Versions::Http2);
        assert_eq!(post_signed(&client, &mock.url("/quiet"), &KEY, BODY).await.status(), 204);
        assert_eq!(mock.open_bodies(), 0);
        let slow = post_signed(&client, &mock.url("/slow"), &KEY, BODY).await;
        assert_eq!(slow.status(), 201);
        let first = slow.into_body().frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), 10, "one chunk at once, the next an hour later");
        assert_eq!(mock.wait_for_open_bodies_at_most(0, WAIT).await, 0, "the dropped response ends the body");
    }

    #[tokio::test]
    async fn wait_for_times_out_without_hanging() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockWebhookConfig::default()).await.unwrap();
        let started = std::time::Instant::now();
        let received = mock.wait_for(1, Duration::from_millis(200)).await;
        assert!(received.is_empty());
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(5));
        // n = 0 returns at once.
        assert!(mock.wait_for(0, Duration::from_secs(60)).await.is_empty());
    }

    #[tokio::test]
    async fn compact_mode_counts_and_the_hook_answers() {
        let pki = TestPki::generate(&[]).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_by_hook = seen.clone();
        let config = MockWebhookConfig {
            record_requests: false,
            on_request: Some(RequestHook::new(move |req| {
                lock(&seen_by_hook).push((req.path.to_string(), req.body.to_vec()));
                // Answer /fail with 503; leave everything else to the default.
                (req.path == "/fail").then(|| ScriptedResponse::status(503))
            })),
            ..Default::default()
        };
        let mock = start(&pki, config).await.unwrap();
        let client = client(&pki, Versions::Http2);
        assert_eq!(post_signed(&client, &mock.url("/ok"), &KEY, BODY).await.status(), 200);
        assert_eq!(post_signed(&client, &mock.url("/fail"), &KEY, BODY).await.status(), 503);
        assert_eq!(mock.received_count(), 2);
        assert!(mock.received().is_empty(), "compact mode keeps no requests");
        let seen = lock(&seen).clone();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], ("/ok".to_string(), BODY.as_bytes().to_vec()));
    }

    #[tokio::test]
    async fn shutdown_closes_the_listener() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockWebhookConfig::default()).await.unwrap();
        let addr = mock.addr();
        mock.shutdown().await;
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
