//! An HTTP/2 client on `h2` directly, for the hosts a pool sends to over
//! HTTP/2 (APNs, FCM, Web Push, and webhook receivers that answered over
//! HTTP/2): one connection per host, opened by the first request that finds
//! none while the others wait for it, then shared by every request.
//!
//! Why not hyper-util's pooled client, as before (docs/BENCHMARKS-HISTORY.md,
//! "Delivery throughput"): per request it checks a connection out of a
//! locked pool, hands the request to the connection's task over a channel,
//! and spawns one more task to pipe the body, which h2 can buffer itself.
//! Here a request is two calls into h2 (headers, then the whole body with
//! END_STREAM) and an await of the answer, on the attempt's own task.
//!
//! A connection lives while requests use it: it is dropped once no request
//! started on it for the idle timeout (its open streams still finish), when
//! the peer sends GOAWAY or breaks it, or when a PING gets no PONG in time.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Frame;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tower_service::Service as _;

use super::connector::{BoxError, CountingConnector, KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT};

/// Flow-control windows we grant the peer for its answers. Answers are read
/// to 64 KiB at most (`pool::MAX_RESPONSE_BODY`); the connection's window
/// lets many streams answer at once without waiting for WINDOW_UPDATEs.
const STREAM_WINDOW: u32 = 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
/// The largest header block we accept in an answer.
const MAX_HEADER_LIST: u32 = 16 * 1024;
/// Streams opened before the peer's SETTINGS tell its limit: h2 would
/// assume no limit, and a burst would be refused above the peer's
/// (REFUSED_STREAM). 100 is the least RFC 9113 section 6.5.2 recommends a
/// peer allow, and hyper's default.
const INITIAL_MAX_STREAMS: usize = 100;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum Http2Error {
    #[error("the request's URI has no scheme or host")]
    NoHost,
    #[error("connect: {0}")]
    Connect(BoxError),
    #[error("HTTP/2: {0}")]
    Protocol(#[from] h2::Error),
    /// A probing client's connection negotiated HTTP/1.1 (or no TLS): the
    /// request was not sent, and goes through an HTTP/1.1 client instead.
    #[error("the host speaks HTTP/1.1")]
    Http1,
}

/// One lane's HTTP/2 connections, one per scheme and host.
pub struct Http2Client {
    connector: HttpsConnector<CountingConnector>,
    /// The connector offers http/1.1 too, and a connection that does not
    /// negotiate h2 is refused with `Http2Error::Http1` (`probing`).
    offers_http1: bool,
    idle_timeout: Duration,
    hosts: Arc<Mutex<HashMap<HostKey, Arc<Host>>>>,
    /// Told each time a connection is let go: tests wait for it.
    #[cfg(test)]
    let_go: Arc<tokio::sync::Notify>,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct HostKey {
    scheme: Scheme,
    authority: Authority,
}

impl HostKey {
    fn of(uri: &Uri) -> Result<Self, Http2Error> {
        match (uri.scheme(), uri.authority()) {
            (Some(scheme), Some(authority)) => Ok(Self { scheme: scheme.clone(), authority: authority.clone() }),
            _ => Err(Http2Error::NoHost),
        }
    }

    fn uri(&self) -> Uri {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query("/")
            .build()
            .expect("a scheme and an authority make a URI")
    }
}

/// A host's connection, if it has one, and the lock its connecting holds.
#[derive(Default)]
struct Host {
    live: Mutex<Option<Live>>,
    connecting: tokio::sync::Mutex<()>,
    /// Connects that failed: a request that waited for a connect which
    /// failed meanwhile fails with it instead of trying again in turn, so a
    /// burst to a dead host costs one connect, not one per request in line.
    failed_connects: AtomicU64,
    /// A probing client's connect negotiated HTTP/1.1: requests that waited
    /// for it learn that, not a connect failure.
    http1: std::sync::atomic::AtomicBool,
}

#[derive(Clone)]
struct Live {
    /// Tells this connection from the host's next one.
    id: u64,
    send: SendRequest<Bytes>,
    used: Arc<LastUse>,
}

impl Host {
    fn current(&self) -> Option<Live> {
        self.live.lock().expect("a host's lock is never poisoned").clone()
    }

    /// Drops the handle of connection `id`, if it is still the host's: new
    /// requests then open another.
    fn forget(&self, id: u64) {
        let mut live = self.live.lock().expect("a host's lock is never poisoned");
        if live.as_ref().is_some_and(|l| l.id == id) {
            *live = None;
        }
    }
}

/// When a request last started on a connection, in milliseconds since it
/// opened: the idle timeout counts from there.
struct LastUse {
    opened: Instant,
    millis: AtomicU64,
}

impl LastUse {
    fn new() -> Self {
        Self { opened: Instant::now(), millis: AtomicU64::new(0) }
    }

    fn touch(&self) {
        self.millis.store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.opened + Duration::from_millis(self.millis.load(Ordering::Relaxed))
    }
}

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(0);

/// One connection's driving half.
type Connection = h2::client::Connection<TokioIo<MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>>, Bytes>;

impl Http2Client {
    /// `connector` must offer only h2 by ALPN (a plain `http://` host is
    /// spoken to with prior knowledge, as hyper's HTTP/2-only client does).
    pub fn new(connector: HttpsConnector<CountingConnector>, idle_timeout: Duration) -> Self {
        Self {
            connector,
            offers_http1: false,
            idle_timeout,
            hosts: Arc::default(),
            #[cfg(test)]
            let_go: Arc::default(),
        }
    }

    /// For hosts whose protocol is not known yet: `connector` offers h2 and
    /// http/1.1 by ALPN. A host that picks h2 gets its one shared connection
    /// as with `new`; one that picks http/1.1 (or a plain `http://` host)
    /// fails the request with `Http2Error::Http1` before it is sent, and so
    /// does every request that waited for that connect. So a host's
    /// protocol is learned from its connection, never from an answer.
    pub fn probing(connector: HttpsConnector<CountingConnector>, idle_timeout: Duration) -> Self {
        Self { offers_http1: true, ..Self::new(connector, idle_timeout) }
    }

    /// Sends `request` with its whole body and waits for the answer's head.
    /// The caller bounds the wait (the connecting one included).
    pub async fn request(&self, request: Request<Bytes>) -> Result<Response<Http2Body>, Http2Error> {
        let key = HostKey::of(request.uri())?;
        let host = self.host(&key);
        let mut live = match self.ready(&host, &key).await {
            Ok(live) => live,
            Err(e) => {
                release(&self.hosts, &key, &host);
                return Err(e);
            }
        };
        live.used.touch();
        let (mut head, body) = request.into_parts();
        if !body.is_empty() {
            // What hyper's client sends for a body of known length.
            head.headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        let end_of_stream = body.is_empty();
        let sent =
            live.send.send_request(Request::from_parts(head, ()), end_of_stream).and_then(|(answer, mut stream)| {
                if !end_of_stream {
                    // h2 buffers what the stream's window cannot take yet and
                    // sends it as the window opens.
                    stream.send_data(body, true)?;
                }
                Ok(answer)
            });
        let answer = match sent {
            Ok(answer) => answer.await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(response) => Ok(response.map(Http2Body)),
            Err(e) => {
                if e.is_io() || e.is_go_away() {
                    host.forget(live.id);
                }
                Err(e.into())
            }
        }
    }

    fn host(&self, key: &HostKey) -> Arc<Host> {
        let mut hosts = self.hosts.lock().expect("the host table's lock is never poisoned");
        if let Some(host) = hosts.get(key) {
            return host.clone();
        }
        hosts.entry(key.clone()).or_default().clone()
    }

    /// The host's connection with a handle ready for one more stream,
    /// opening it if there is none. A connection found closed is replaced once.
    async fn ready(&self, host: &Arc<Host>, key: &HostKey) -> Result<Live, Http2Error> {
        let mut last_error = None;
        for _ in 0..2 {
            // Our own copy of the handle: h2 counts every copy under the
            // connection's lock, so a request makes only this one.
            let Live { id, send, used } = match host.current() {
                Some(live) => live,
                // Boxed: connecting holds h2's whole handshake state (kilobytes),
                // which would otherwise sit in every request's future.
                None => Box::pin(self.connect(host, key)).await?,
            };
            match send.ready().await {
                Ok(send) => return Ok(Live { id, send, used }),
                Err(e) => {
                    host.forget(id);
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.expect("the loop ran").into())
    }

    /// Opens the host's connection, or waits for the request opening it.
    async fn connect(&self, host: &Arc<Host>, key: &HostKey) -> Result<Live, Http2Error> {
        let failed_before = host.failed_connects.load(Ordering::Acquire);
        let _connecting = host.connecting.lock().await;
        if let Some(live) = host.current() {
            return Ok(live);
        }
        if host.http1.load(Ordering::Acquire) {
            return Err(Http2Error::Http1);
        }
        if host.failed_connects.load(Ordering::Acquire) != failed_before {
            return Err(Http2Error::Connect("the connection this request waited for failed".into()));
        }
        let (send, connection) = self.open(key).await.inspect_err(|e| match e {
            Http2Error::Http1 => host.http1.store(true, Ordering::Release),
            _ => {
                host.failed_connects.fetch_add(1, Ordering::AcqRel);
            }
        })?;
        let live = Live { id: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed), send, used: Arc::new(LastUse::new()) };
        *host.live.lock().expect("a host's lock is never poisoned") = Some(live.clone());
        let watch = Watch {
            hosts: Arc::downgrade(&self.hosts),
            key: key.clone(),
            host: Arc::downgrade(host),
            id: live.id,
            used: live.used.clone(),
            idle_timeout: self.idle_timeout,
            #[cfg(test)]
            let_go: self.let_go.clone(),
        };
        tokio::spawn(watch.drive(connection));
        Ok(live)
    }

    /// TCP, TLS and the HTTP/2 preface to `key`'s host.
    async fn open(&self, key: &HostKey) -> Result<(SendRequest<Bytes>, Connection), Http2Error> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await.map_err(Http2Error::Connect)?;
        let stream = connector.call(key.uri()).await.map_err(Http2Error::Connect)?;
        if self.offers_http1 && !stream.connected().is_negotiated_h2() {
            // Dropped: the HTTP/1.1 client opens its own (one handshake per
            // HTTP/1.1 host, paid once per lane).
            return Err(Http2Error::Http1);
        }
        let handshake = h2::client::Builder::new()
            .enable_push(false)
            .initial_max_send_streams(INITIAL_MAX_STREAMS)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEADER_LIST)
            .handshake::<_, Bytes>(TokioIo::new(stream))
            .await;
        Ok(handshake?)
    }
}

/// Removes `host` from the table when it has no connection (a failed
/// connect, a closed connection), so hosts that are gone do not stay.
fn release(hosts: &Mutex<HashMap<HostKey, Arc<Host>>>, key: &HostKey, host: &Arc<Host>) {
    let mut hosts = hosts.lock().expect("the host table's lock is never poisoned");
    let unused = hosts.get(key).is_some_and(|h| Arc::ptr_eq(h, host)) && host.current().is_none();
    // Someone connecting holds the lock: the entry is theirs.
    if unused && host.connecting.try_lock().is_ok() {
        hosts.remove(key);
    }
}

/// What a connection's task needs to drop it from its host when it ends.
struct Watch {
    hosts: Weak<Mutex<HashMap<HostKey, Arc<Host>>>>,
    key: HostKey,
    host: Weak<Host>,
    id: u64,
    used: Arc<LastUse>,
    idle_timeout: Duration,
    #[cfg(test)]
    let_go: Arc<tokio::sync::Notify>,
}

impl Watch {
    /// Drives the connection until it ends; lets go of it when idle, and
    /// ends it when a PING goes unanswered.
    async fn drive(self, mut connection: Connection) {
        let keep_alive = keep_alive(connection.ping_pong());
        let idle = idle(&self.used, self.idle_timeout);
        tokio::pin!(keep_alive, idle);
        let mut idled = false;
        loop {
            tokio::select! {
                _ = &mut connection => break,
                () = &mut keep_alive => break,
                // No new streams: the handle goes, and h2 closes the
                // connection once its open streams are done.
                () = &mut idle, if !idled => {
                    idled = true;
                    self.forget();
                }
            }
        }
        self.forget();
    }

    fn forget(&self) {
        if let Some(host) = self.host.upgrade() {
            host.forget(self.id);
            if let Some(hosts) = self.hosts.upgrade() {
                release(&hosts, &self.key, &host);
            }
        }
        #[cfg(test)]
        self.let_go.notify_one();
    }
}

/// Resolves when a PING sent every `KEEP_ALIVE_INTERVAL` gets no PONG within
/// `KEEP_ALIVE_TIMEOUT`: a dead peer or path is found before a send waits
/// on it, and NATs keep the connection.
async fn keep_alive(ping_pong: Option<h2::PingPong>) {
    let Some(mut ping_pong) = ping_pong else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(KEEP_ALIVE_INTERVAL).await;
        match tokio::time::timeout(KEEP_ALIVE_TIMEOUT, ping_pong.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            _ => return,
        }
    }
}

/// Resolves once no request started for `timeout`.
async fn idle(used: &LastUse, timeout: Duration) {
    loop {
        let deadline = used.last() + timeout;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// An answer's body from an h2 stream. What is read is given back to the
/// peer's flow-control window at once; dropping it before its end resets
/// the stream (CANCEL).
pub struct Http2Body(h2::RecvStream);

impl hyper::body::Body for Http2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let recv = &mut self.0;
        match ready!(recv.poll_data(cx)) {
            Some(Ok(data)) => {
                let _ = recv.flow_control().release_capacity(data.len());
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e))),
            None => match ready!(recv.poll_trailers(cx)) {
                Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                Ok(None) => Poll::Ready(None),
                Err(e) => Poll::Ready(Some(Err(e))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use fanout_testkit::TestPki;
    use fanout_testkit::mock::webhook::{self as mock, MockWebhookConfig};
    use http_body_util::BodyExt as _;
    use prometheus::IntCounter;

    use super::*;
    use crate::transport::pool::{Dialer, Resolver, http2_client};

    /// A client trusting `pki` that counts the connections it opens.
    fn client(pki: &TestPki, dir: &tempfile::TempDir, idle_timeout: Duration) -> (Http2Client, IntCounter) {
        let ca = dir.path().join("ca.pem");
        pki.write_ca(&ca).unwrap();
        let tls = crate::transport::client_tls_config(&[ca]).unwrap();
        let opened = IntCounter::new("opened", "connections opened").unwrap();
        (http2_client(tls, idle_timeout, Dialer::direct(Resolver::system()), Some(opened.clone()), false), opened)
    }

    fn post(url: &str) -> Request<Bytes> {
        Request::post(url).body(Bytes::from_static(b"{\"n\":1}")).unwrap()
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_connection_and_read_their_answers() {
        let pki = TestPki::generate(&[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let receiver = mock::start(&pki, MockWebhookConfig::default()).await.unwrap();
        let (client, opened) = client(&pki, &dir, Duration::from_secs(30));
        let url = receiver.url("/burst");
        // More than the mock's 200 streams at once: h2 queues the rest.
        let sends = (0..300).map(|_| async {
            let response = client.request(post(&url)).await.unwrap();
            assert_eq!(response.version(), http::Version::HTTP_2);
            let status = response.status();
            response.into_body().collect().await.unwrap();
            status
        });
        for status in futures::future::join_all(sends).await {
            assert_eq!(status, http::StatusCode::OK);
        }
        assert_eq!(receiver.received_count(), 300);
        assert_eq!(opened.get(), 1);
        // The body arrived whole, with the length hyper's client would send.
        let request = &receiver.received()[0];
        assert_eq!(&request.body[..], b"{\"n\":1}");
        assert_eq!(request.header("content-length"), Some("7"));
        assert_eq!(request.version, "HTTP/2.0");
    }

    #[tokio::test]
    async fn an_idle_connection_is_let_go_and_the_next_request_opens_another() {
        let pki = TestPki::generate(&[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let receiver = mock::start(&pki, MockWebhookConfig::default()).await.unwrap();
        let (client, opened) = client(&pki, &dir, Duration::from_millis(100));
        let url = receiver.url("/idle");
        assert_eq!(client.request(post(&url)).await.unwrap().status(), http::StatusCode::OK);
        // Idle: the handle goes, the connection closes, the host leaves the table.
        let let_go = tokio::time::timeout(Duration::from_secs(5), client.let_go.notified()).await;
        assert!(let_go.is_ok(), "the idle connection was not let go within 5 s");
        assert!(client.hosts.lock().unwrap().is_empty(), "the idle host left the table");
        assert_eq!(client.request(post(&url)).await.unwrap().status(), http::StatusCode::OK);
        assert_eq!(opened.get(), 2);
        assert_eq!(receiver.received_count(), 2);
    }

    #[tokio::test]
    async fn a_burst_to_a_host_whose_handshake_fails_costs_one_connection() {
        let pki = TestPki::generate(&[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (client, _) = client(&pki, &dir, Duration::from_secs(30));
        // Accepts TCP and hangs up at once: every TLS handshake fails.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicU64::new(0));
        let counting = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counting.fetch_add(1, Ordering::SeqCst);
                drop(tcp);
            }
        });
        let url = format!("https://127.0.0.1:{port}/x");
        let sends = (0..50).map(|_| client.request(post(&url)));
        for sent in futures::future::join_all(sends).await {
            assert!(matches!(sent, Err(Http2Error::Connect(_))), "{:?}", sent.err());
        }
        // The 49 that waited for the first connect failed with it.
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert!(client.hosts.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_host_that_cannot_be_reached_fails_the_request_and_leaves_no_entry() {
        let pki = TestPki::generate(&[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (client, opened) = client(&pki, &dir, Duration::from_secs(30));
        // A port nothing listens on: bind one, then close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let sent = client.request(post(&format!("https://127.0.0.1:{port}/x"))).await;
        assert!(matches!(sent, Err(Http2Error::Connect(_))), "{:?}", sent.err());
        assert!(client.hosts.lock().unwrap().is_empty());
        assert_eq!(opened.get(), 0);
        assert!(matches!(client.request(post("/no-host")).await, Err(Http2Error::NoHost)));
    }
}
