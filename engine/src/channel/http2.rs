//! The pooled HTTP/2 client the APNs and FCM providers share: a few long-lived
//! HTTP/2 connections used round-robin, a bound on requests in flight (a send
//! waits for a slot: backpressure), and an optional rate limit (governor).

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus::{IntCounter, IntGauge};
use tokio::sync::Semaphore;

/// Provider answers are small JSON objects; anything longer is cut off and
/// classified on its status alone.
const MAX_RESPONSE_BODY: usize = 64 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections are kept this long: providers prefer long-lived ones.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// HTTP/2 PINGs keep NATs and load balancers from dropping a connection
/// silently and detect a dead one before a send waits on it.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(60);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) type HttpsClient = Client<HttpsConnector<CountingConnector>, Full<Bytes>>;

/// A TCP connector that counts the connections it opens
/// (fanout_provider_connections_opened_total): reconnects show up as a rate.
#[derive(Clone)]
pub(crate) struct CountingConnector {
    inner: HttpConnector,
    opened: Option<IntCounter>,
}

impl tower_service::Service<Uri> for CountingConnector {
    type Response = <HttpConnector as tower_service::Service<Uri>>::Response;
    type Error = <HttpConnector as tower_service::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let opened = self.opened.clone();
        Box::pin(async move {
            let connection = connecting.await?;
            if let Some(opened) = opened {
                opened.inc();
            }
            Ok(connection)
        })
    }
}

/// The metric series of one provider's pool.
#[derive(Clone)]
pub(crate) struct PoolMetrics {
    pub connections_opened: IntCounter,
    /// Sends waiting for an in-flight slot or the rate limit.
    pub waiting: IntGauge,
}

impl PoolMetrics {
    pub(crate) fn new(metrics: &crate::metrics::Metrics, channel: &str) -> Self {
        Self {
            connections_opened: metrics.provider_connections_opened.with_label_values(&[channel]),
            waiting: metrics.provider_waiting_sends.with_label_values(&[channel]),
        }
    }
}

/// How a provider's pool is sized.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolOptions {
    pub connections: usize,
    pub max_in_flight: usize,
    /// 0 = no limit.
    pub rate_limit_per_second: u32,
}

/// A complete answer: status, headers and at most `MAX_RESPONSE_BODY` bytes.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// An HTTPS client over `tls` (whose ALPN must be unset: the connector sets
/// it). `http2_only` pins HTTP/2 (APNs requires it); otherwise ALPN picks
/// HTTP/2 or HTTP/1.1 (for OAuth token endpoints).
pub(crate) fn https_client(tls: rustls::ClientConfig, http2_only: bool, opened: Option<IntCounter>) -> HttpsClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let http = CountingConnector { inner: http, opened };
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only();
    let connector = if http2_only {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.enable_http1().enable_http2().wrap_connector(http)
    };
    Client::builder(TokioExecutor::new())
        .http2_only(http2_only)
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .build(connector)
}

/// Sends a request and reads the whole (bounded) answer.
pub(crate) async fn request(
    client: &HttpsClient,
    request: Request<Full<Bytes>>,
) -> Result<Answer, hyper_util::client::legacy::Error> {
    let response = client.request(request).await?;
    let (parts, body) = response.into_parts();
    // A body that is too long or cut off is classified on its status alone.
    let body = Limited::new(body, MAX_RESPONSE_BODY).collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Ok(Answer { status: parts.status, headers: parts.headers, body })
}

/// `connections` HTTP/2 clients, each holding one connection per host, used
/// round-robin; at most `max_in_flight` requests at once.
pub(crate) struct H2Pool {
    clients: Vec<HttpsClient>,
    next: AtomicUsize,
    in_flight: Semaphore,
    limiter: Option<governor::DefaultDirectRateLimiter>,
    metrics: Option<PoolMetrics>,
}

impl H2Pool {
    pub(crate) fn new(tls: &rustls::ClientConfig, options: PoolOptions, metrics: Option<PoolMetrics>) -> Self {
        let opened = metrics.as_ref().map(|m| m.connections_opened.clone());
        let clients = (0..options.connections.max(1)).map(|_| https_client(tls.clone(), true, opened.clone())).collect();
        let limiter = NonZeroU32::new(options.rate_limit_per_second)
            .map(|rate| governor::RateLimiter::direct(governor::Quota::per_second(rate)));
        let in_flight = Semaphore::new(options.max_in_flight.max(1));
        Self { clients, next: AtomicUsize::new(0), in_flight, limiter, metrics }
    }

    /// Waits for an in-flight slot and the rate limit, then sends. The caller's
    /// attempt timeout covers the wait too.
    pub(crate) async fn send(&self, req: Request<Full<Bytes>>) -> Result<Answer, hyper_util::client::legacy::Error> {
        if let Some(m) = &self.metrics {
            m.waiting.inc();
        }
        // The semaphore is never closed, so acquire cannot fail.
        let permit = self.in_flight.acquire().await;
        if let Some(limiter) = &self.limiter {
            limiter.until_ready().await;
        }
        if let Some(m) = &self.metrics {
            m.waiting.dec();
        }
        let _permit = permit.expect("the in-flight semaphore is never closed");
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        request(&self.clients[i], req).await
    }

    #[cfg(test)]
    pub(crate) fn available_slots(&self) -> usize {
        self.in_flight.available_permits()
    }
}

/// Percent-encodes `text` for one URL path segment: RFC 3986 unreserved
/// characters pass, every other byte becomes `%XX`.
pub(crate) fn encode_path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Unix time in whole seconds.
pub(crate) fn unix_now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_path_segment("0123abcdefABCDEF"), "0123abcdefABCDEF");
        assert_eq!(encode_path_segment("a/../b?c#d e"), "a%2F..%2Fb%3Fc%23d%20e");
        assert_eq!(encode_path_segment("é"), "%C3%A9");
    }

    #[tokio::test]
    async fn pool_sizes_follow_the_options() {
        let tls = crate::channel::client_tls_config(&[]).unwrap();
        let pool = H2Pool::new(&tls, PoolOptions { connections: 3, max_in_flight: 7, rate_limit_per_second: 0 }, None);
        assert_eq!(pool.clients.len(), 3);
        assert_eq!(pool.available_slots(), 7);
        assert!(pool.limiter.is_none());
        let limited = H2Pool::new(&tls, PoolOptions { connections: 1, max_in_flight: 1, rate_limit_per_second: 5 }, None);
        assert!(limited.limiter.is_some());
    }
}
