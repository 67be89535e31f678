//! Serving connections, the same way on every listener (gRPC, HTTP, API):
//!
//! - at most `max_connections` open at once: the next is not accepted until
//!   one closes (the kernel's backlog holds it), enforced before accepting;
//! - a deadline from accept to the first request (the TLS handshake inside
//!   it, itself bounded by `tls_handshake_timeout`), see `first_request`;
//! - after that, a connection with no request open for `idle_timeout` is
//!   closed gracefully (GOAWAY on HTTP/2), so its slot comes back without
//!   waiting for a keep-alive ping to fail; an open stream, however long
//!   (PublishStream), is never idle;
//! - on HTTP/1, every later request's head bounded by `header_read_timeout`;
//! - on the HTTP and API listeners, a request (its body included) bounded
//!   by `http_request_timeout`: one whose body drips is answered 408 and its
//!   connection closed, so an open request cannot hold a slot for ever;
//! - each connection in its own task, so a slow client holds up no other,
//!   with the identities of a verified client certificate (`Peer`) and the
//!   TCP peer's address in every request's extensions;
//! - at shutdown, no call is cut: the port closes first (a new connection
//!   is refused: never processed), the connections the kernel had already
//!   queued are still taken, and only then is every connection closed
//!   gracefully (GOAWAY on HTTP/2: the calls it already took are answered,
//!   later streams refused, and a client that reconnects finds the port
//!   closed). One still before its first request is closed once that
//!   request is in, not dropped unread.
//!
//! Closes for a limit are counted in `fanout_connections_closed_total`.

mod activity;
mod first_request;
mod metrics;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tower_service::Service;

use self::activity::{Activity, Open};
use self::first_request::FirstRequest;
pub use self::metrics::{CloseReason, Closes};
use crate::auth::Peer;

/// How long a connection closed for idleness may take to go once told
/// (GOAWAY sent, no request open): then it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub first_request_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// HTTP and API listeners: from a request's head to its response, body
    /// read included. The gRPC listener has its own call deadline.
    pub http_request_timeout: Duration,
}

/// Where a listener's TLS configuration comes from: read at each handshake,
/// so a reloaded certificate applies to the next connection.
pub type TlsSource = Arc<dyn Fn() -> Arc<ServerConfig> + Send + Sync>;

/// What a listener speaks, and its HTTP/2 settings.
#[derive(Debug, Clone, Copy)]
pub enum Protocol {
    /// HTTP/1.1 and HTTP/2 (prior knowledge or ALPN), pinged every 30 s.
    Http,
    /// HTTP/2 only, as gRPC needs.
    Grpc { max_concurrent_streams: u32, keepalive_interval: Duration },
}

/// One listener: its socket, its TLS and what it serves.
pub struct Listener {
    pub tcp: TcpListener,
    pub tls: Option<TlsSource>,
    pub router: Router,
    pub protocol: Protocol,
    pub closes: Closes,
}

/// What every connection of a listener shares.
struct Shared {
    protocol: Protocol,
    tls: Option<TlsSource>,
    router: Router,
    builder: auto::Builder<TokioExecutor>,
    limits: Limits,
    closes: Closes,
}

/// Serves `listener` until `shutdown`, then lets open requests finish (the
/// caller bounds that with its drain timeout).
pub async fn serve(listener: Listener, limits: Limits, mut shutdown: watch::Receiver<bool>) {
    let Listener { tcp, tls, router, protocol, closes } = listener;
    let shared = Arc::new(Shared { protocol, tls, router, builder: builder(protocol, &limits), limits, closes });
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Every connection task holds a sender: `recv` answers `None` once the
    // last has ended.
    let (running, mut all_ended) = mpsc::channel::<Infallible>(1);
    // Tells the connections to close, once the port is closed.
    let (close, closing) = watch::channel(false);
    let spawn = |(stream, remote): (TcpStream, SocketAddr), slot: Option<OwnedSemaphorePermit>| {
        let _ = stream.set_nodelay(true);
        let (shared, closing, running) = (shared.clone(), closing.clone(), running.clone());
        tokio::spawn(async move {
            connection(&shared, stream, remote, slot, closing).await;
            drop(running);
        });
    };
    loop {
        // The cap is enforced before accepting, where the work is spawned.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            _ = shutdown.changed() => break,
        };
        let accepted = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        spawn(accepted, Some(slot));
    }
    // The port closes before any connection is told to go: a client told
    // GOAWAY reconnects at once, and must be refused (never processed), not
    // accepted by a listener about to close nor left in its backlog, whose
    // connections the kernel resets when the socket closes, requests unread.
    // Those already queued are taken (a slot each while any is free: at most
    // `max_connections` more) and closed gracefully like the others.
    for queued in stop_listening(tcp, limits.max_connections) {
        spawn(queued, slots.clone().try_acquire_owned().ok());
    }
    let _ = close.send(true);
    drop(running);
    let _ = all_ended.recv().await;
}

/// Closes the listening socket, and returns the connections the kernel had
/// accepted for it and nobody had taken yet (at most `max`).
fn stop_listening(tcp: TcpListener, max: usize) -> Vec<(TcpStream, SocketAddr)> {
    let Ok(tcp) = tcp.into_std() else { return Vec::new() };
    // Never waits: an empty backlog answers WouldBlock.
    if tcp.set_nonblocking(true).is_err() {
        return Vec::new();
    }
    let mut queued = Vec::new();
    for _ in 0..max {
        match tcp.accept() {
            Ok((stream, remote)) => {
                if let Ok(stream) = stream.set_nonblocking(true).and_then(|()| TcpStream::from_std(stream)) {
                    queued.push((stream, remote));
                }
            }
            // One its client gave up on while it waited: the next.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
            // None left (WouldBlock), or no descriptor for it.
            Err(_) => break,
        }
    }
    queued
}

fn builder(protocol: Protocol, limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Later request heads on a kept-alive HTTP/1 connection (slow-loris);
    // the first is under the first-request deadline as well.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    match protocol {
        Protocol::Http => {
            builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(Duration::from_secs(30)));
        }
        Protocol::Grpc { max_concurrent_streams, keepalive_interval } => {
            builder = builder.http2_only();
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(max_concurrent_streams)
                .keep_alive_interval(Some(keepalive_interval));
        }
    }
    builder
}

/// One connection from accept to close; holds its `slot` of the cap.
async fn connection(
    shared: &Shared,
    stream: TcpStream,
    remote: SocketAddr,
    _slot: Option<OwnedSemaphorePermit>,
    mut close: watch::Receiver<bool>,
) {
    let accepted = Instant::now();
    let deadline = accepted + shared.limits.first_request_timeout;
    let (io, peer) = match &shared.tls {
        None => (Either::Left(stream), Peer::default()),
        Some(config) => {
            let handshake_by = deadline.min(accepted + shared.limits.tls_handshake_timeout);
            let handshake = TlsAcceptor::from(config()).accept(stream);
            match tokio::time::timeout_at(handshake_by, handshake).await {
                Ok(Ok(stream)) => {
                    let peer = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .map(|leaf| Peer::from_certificate(leaf))
                        .unwrap_or_default();
                    (Either::Right(stream), peer)
                }
                // Not worth more than debug: scanners, plaintext clients,
                // expired client certificates.
                Ok(Err(e)) => {
                    shared.closes.count(CloseReason::TlsHandshakeFailed);
                    return tracing::debug!(error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    let reason = if handshake_by == deadline {
                        CloseReason::FirstRequestTimeout
                    } else {
                        CloseReason::TlsHandshakeTimeout
                    };
                    shared.closes.count(reason);
                    return tracing::debug!("TLS handshake timed out");
                }
            }
        }
    };
    let activity = Arc::new(Activity::new());
    let io = FirstRequest::new(io, deadline, activity.clone(), shared.closes.clone());
    let router = shared.router.clone();
    let requests = activity.clone();
    let request_timeout = match shared.protocol {
        Protocol::Http => Some(shared.limits.http_request_timeout),
        Protocol::Grpc { .. } => None,
    };
    let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
        let open = requests.open();
        request.extensions_mut().insert(peer.clone());
        request.extensions_mut().insert(ConnectInfo(remote));
        let mut router = router.clone();
        async move {
            let response = match request_timeout {
                None => router.call(request).await?,
                Some(limit) => match tokio::time::timeout(limit, router.call(request)).await {
                    Ok(response) => response?,
                    Err(_) => request_timed_out(limit),
                },
            };
            Ok::<_, Infallible>(response.map(|body| Counted { body, _open: open }))
        }
    });
    let connection = shared.builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(connection);
    let idle = activity.idle_for(shared.limits.idle_timeout);
    tokio::pin!(idle);
    // Before its first request is in, hyper may not have read which
    // protocol the connection speaks, and a graceful shutdown then drops it
    // without a word (no GOAWAY): the request the client sent meanwhile
    // would be reset unanswered. So it is told once that request is in (the
    // first-request deadline bounds the wait); HTTP/2 then answers the
    // streams that came before its GOAWAY and refuses the later ones.
    let first_request = activity.clone();
    let stop = async move {
        let _ = close.wait_for(|told| *told).await;
        first_request.first_request().await;
    };
    tokio::pin!(stop);
    let mut closing = false;
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = &mut idle, if !closing => {
                shared.closes.count(CloseReason::IdleTimeout);
                connection.as_mut().graceful_shutdown();
                closing = true;
                grace.as_mut().reset(Instant::now() + CLOSE_GRACE);
            }
            () = &mut stop, if !closing => {
                // Open requests finish; the caller bounds how long.
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = &mut grace => return tracing::debug!("an idle connection did not close in time: dropped"),
        }
    }
}

/// 408 Request Timeout as an RFC 9457 problem; the connection is closed
/// after it (HTTP/1), since its request may still be half-read.
fn request_timed_out(limit: Duration) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Request Timeout",
        "status": 408,
        "detail": format!(
            "the request was not complete within {} s (server.http_request_timeout_seconds)",
            limit.as_secs()
        ),
    });
    let headers = [(http::header::CONTENT_TYPE, "application/problem+json"), (http::header::CONNECTION, "close")];
    (http::StatusCode::REQUEST_TIMEOUT, headers, body.to_string()).into_response()
}

/// A response body that counts its request open until it is dropped.
struct Counted<B> {
    body: B,
    _open: Open,
}

impl<B: Body + Unpin> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Binds a listener, naming the key on failure.
pub async fn bind(address: SocketAddr, key: &str) -> anyhow::Result<TcpListener> {
    use anyhow::Context as _;
    TcpListener::bind(address).await.with_context(|| format!("{key}: cannot listen on {address}"))
}
