//! A mock Web Push service (RFC 8030) on 127.0.0.1: it hands out
//! subscriptions (an endpoint and a browser's keys, [`Subscriber`]), and for
//! every push it checks the VAPID token (RFC 8292: signature, `aud` = its
//! origin, `exp` within 24 hours, and `k` when a key is expected) and
//! decrypts the body with the subscription's private key (RFC 8291),
//! recording what arrived. Answers 201 unless scripted; 404 for an unknown
//! subscription, 401 for a bad token, 400 for a body that does not decrypt.
//!
//! For load runs, [`start_with_hook`] hands every push (token checked) to a
//! [`WebPushHook`] that decrypts with its own subscriptions and answers;
//! nothing is recorded.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;

use super::provider::{MAX_CONCURRENT_STREAMS, unix_now};
use crate::lock;
use crate::pki::{ALPN_H2, ALPN_HTTP1, TestPki};
use crate::recorder::Recorder;
use crate::request::{header, header_list};
use crate::server::{self, Server};
use crate::webpush::{Subscriber, Vapid, check_vapid, decrypt};

/// A subscription the mock created, as a browser would send it to fanout.
#[derive(Clone, Debug)]
pub struct MockSubscription {
    /// The path segment naming it in `endpoint`.
    pub id: String,
    pub endpoint: String,
    pub p256dh: Vec<u8>,
    pub auth: Vec<u8>,
}

/// One push as the mock received it.
#[derive(Clone, Debug)]
pub struct WebPushRequest {
    /// The subscription id from the path (unknown ids are recorded too).
    pub subscription: String,
    /// "HTTP/2.0" or "HTTP/1.1".
    pub version: String,
    /// Names lowercase.
    pub headers: Vec<(String, String)>,
    /// The checked token, or why it failed.
    pub vapid: Result<Vapid, String>,
    /// The decrypted payload, or why it did not decrypt.
    pub plaintext: Result<Vec<u8>, String>,
    pub status_sent: u16,
}

impl WebPushRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The decrypted payload as JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        self.plaintext.as_ref().ok().and_then(|p| serde_json::from_slice(p).ok())
    }
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct WebPushReply {
    pub status: u16,
    pub retry_after: Option<String>,
    /// Wait before answering.
    pub delay: Duration,
}

impl WebPushReply {
    pub fn status(status: u16) -> Self {
        Self { status, retry_after: None, delay: Duration::ZERO }
    }

    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn with_retry_after(mut self, value: &str) -> Self {
        self.retry_after = Some(value.to_owned());
        self
    }
}

/// A push as a [`WebPushHook`] sees it (borrowed, nothing copied).
pub struct WebPushHookRequest<'a> {
    /// The subscription id from the path `/push/<id>`.
    pub subscription: &'a str,
    /// Names lowercase.
    pub headers: &'a [(String, String)],
    /// The encrypted body.
    pub body: &'a [u8],
    /// The VAPID token checked as for any push (signature, `aud`, `exp`,
    /// `k`), or why it failed.
    pub vapid: &'a Result<Vapid, String>,
}

impl WebPushHookRequest<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(self.headers, name)
    }
}

type WebPushHookFn = dyn Fn(&WebPushHookRequest<'_>) -> WebPushReply + Send + Sync;

/// Answers every POST in place of the mock's subscriptions, scripts and
/// recording (the load harness accounts for pushes itself).
#[derive(Clone)]
pub struct WebPushHook(pub Arc<WebPushHookFn>);

impl WebPushHook {
    pub fn new(f: impl Fn(&WebPushHookRequest<'_>) -> WebPushReply + Send + Sync + 'static) -> Self {
        WebPushHook(Arc::new(f))
    }
}

struct State {
    origin: String,
    on_request: Option<WebPushHook>,
    /// `k` every token must carry, when set (RFC 8292 section 4: the key
    /// the browser subscribed with).
    expected_key: Option<String>,
    subscribers: Mutex<HashMap<String, Arc<Subscriber>>>,
    scripts: Mutex<HashMap<String, VecDeque<WebPushReply>>>,
    received: Recorder<WebPushRequest>,
    next_id: AtomicU64,
}

pub struct MockWebPush {
    server: Server,
    state: Arc<State>,
}

/// Starts the mock on 127.0.0.1 with the PKI's certificate, HTTP/2 or
/// HTTP/1.1 by ALPN. `expected_key`: the VAPID public key every token must
/// carry, or `None` to accept any key whose signature verifies.
pub async fn start(pki: &TestPki, expected_key: Option<String>) -> anyhow::Result<MockWebPush> {
    start_inner(pki, expected_key, None).await
}

/// `start`, with every push answered by `hook` after the token check.
pub async fn start_with_hook(
    pki: &TestPki,
    expected_key: Option<String>,
    hook: WebPushHook,
) -> anyhow::Result<MockWebPush> {
    start_inner(pki, expected_key, Some(hook)).await
}

async fn start_inner(
    pki: &TestPki,
    expected_key: Option<String>,
    on_request: Option<WebPushHook>,
) -> anyhow::Result<MockWebPush> {
    let listener = server::bind("mock Web Push", SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let state = Arc::new(State {
        origin: server::base_url(listener.local_addr()?),
        expected_key,
        on_request,
        subscribers: Mutex::new(HashMap::new()),
        scripts: Mutex::new(HashMap::new()),
        received: Recorder::new(),
        next_id: AtomicU64::new(1),
    });
    let options = server::Options {
        alpn: vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()],
        max_concurrent_streams: MAX_CONCURRENT_STREAMS,
        wire: None,
        outage: None,
        unavailable_body: "",
    };
    let handler_state = state.clone();
    let server = Server::serve(listener, pki, options, move |req| handle(req, handler_state.clone()))?;
    Ok(MockWebPush { server, state })
}

impl MockWebPush {
    /// `https://127.0.0.1:<port>`: also the `aud` every token must name.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// Stops accepting and aborts open connections; waits for the listener to close.
    pub async fn shutdown(self) {
        self.server.stop().await;
    }

    /// A new subscription with fresh browser keys.
    pub fn subscribe(&self) -> MockSubscription {
        let id = format!("sub-{}", self.state.next_id.fetch_add(1, Ordering::Relaxed));
        let subscriber = Subscriber::generate();
        let subscription = MockSubscription {
            endpoint: format!("{}/push/{id}", self.base_url()),
            p256dh: subscriber.p256dh(),
            auth: subscriber.auth().to_vec(),
            id: id.clone(),
        };
        lock(&self.state.subscribers).insert(id, Arc::new(subscriber));
        subscription
    }

    /// The next answers for subscription `id`, in order; then 201 again.
    pub fn script(&self, id: &str, replies: Vec<WebPushReply>) {
        lock(&self.state.scripts).insert(id.to_owned(), replies.into());
    }

    /// Every push received, in arrival order.
    pub fn received(&self) -> Vec<WebPushRequest> {
        self.state.received.all()
    }

    /// Waits until `n` pushes for `id` arrived or `timeout` passed.
    pub async fn wait_for(&self, id: &str, n: usize, timeout: Duration) -> Vec<WebPushRequest> {
        self.state
            .received
            .wait_until(timeout, |r| r.iter().filter(|q| q.subscription == id).count() >= n)
            .await
            .into_iter()
            .filter(|q| q.subscription == id)
            .collect()
    }
}

async fn handle(req: Request<Incoming>, state: Arc<State>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = server::read_body(body).await;
    let id = parts.uri.path().strip_prefix("/push/").unwrap_or_default().to_owned();
    let headers = header_list(&parts.headers);
    let vapid = check_vapid(header(&headers, "authorization").unwrap_or_default())
        .map_err(|e| e.to_string())
        .and_then(|v| check_claims(&state, v));
    if let Some(hook) = &state.on_request {
        let reply = if parts.method == http::Method::POST {
            (hook.0)(&WebPushHookRequest { subscription: &id, headers: &headers, body: &body, vapid: &vapid })
        } else {
            WebPushReply::status(405)
        };
        return answer(reply).await;
    }
    let subscriber = lock(&state.subscribers).get(&id).cloned();
    let plaintext = match (&subscriber, header(&headers, "content-encoding")) {
        (None, _) => Err("no such subscription".to_owned()),
        (Some(_), encoding) if encoding != Some("aes128gcm") => Err("Content-Encoding is not aes128gcm".to_owned()),
        (Some(s), _) => decrypt(s, &body).map_err(|e| e.to_string()),
    };
    let scripted = lock(&state.scripts).get_mut(&id).and_then(VecDeque::pop_front);
    let reply = if parts.method != http::Method::POST {
        WebPushReply::status(405)
    } else if subscriber.is_none() {
        WebPushReply::status(404)
    } else if vapid.is_err() {
        WebPushReply::status(401)
    } else if plaintext.is_err() {
        WebPushReply::status(400)
    } else {
        scripted.unwrap_or(WebPushReply::status(201))
    };
    state.received.record(WebPushRequest {
        subscription: id,
        version: format!("{:?}", parts.version),
        headers,
        vapid,
        plaintext,
        status_sent: reply.status,
    });
    answer(reply).await
}

async fn answer(reply: WebPushReply) -> Response<Full<Bytes>> {
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let extra: Vec<(&str, String)> = reply.retry_after.iter().map(|v| ("retry-after", v.clone())).collect();
    server::response(reply.status, String::new(), &extra)
}

/// RFC 8292 section 2: `aud` is this service's origin, `exp` in the future
/// and at most 24 hours ahead, and `k` the expected key when one is set.
fn check_claims(state: &State, vapid: Vapid) -> Result<Vapid, String> {
    let now = unix_now();
    if vapid.aud != state.origin {
        return Err(format!("aud {:?} is not this origin {:?}", vapid.aud, state.origin));
    }
    if vapid.exp <= now || vapid.exp > now + 24 * 3600 {
        return Err(format!("exp {} is not within 24 hours of {now}", vapid.exp));
    }
    if state.expected_key.as_ref().is_some_and(|k| *k != vapid.key) {
        return Err("k is not the key the subscription was made with".to_owned());
    }
    Ok(vapid)
}
