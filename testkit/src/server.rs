//! The TLS server under every mock provider: binds, accepts TLS connections,
//! speaks HTTP/2 or HTTP/1.1 as ALPN chose, and hands each request to the
//! mock's handler. Written once, so each mock keeps only its own protocol.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::outage::{Gate, Outage, OutageKind};
use crate::pki::{ALPN_H2, ALPN_HTTP1, TestPki};
use crate::wire::{Tap, WireStats};

/// How a server speaks HTTP.
#[derive(Clone, Debug)]
pub struct Options {
    /// ALPN ids offered, most preferred first. A client that negotiates none
    /// gets HTTP/2 from a server offering only h2 (as APNs), a sniffed
    /// protocol from one offering both, and HTTP/1.1 otherwise.
    pub alpn: Vec<Vec<u8>>,
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Counts what clients send on the wire ([`crate::wire`]), when set.
    pub wire: Option<Arc<WireStats>>,
    /// Switches the server into and out of provider outages
    /// ([`crate::outage`]), when set.
    pub outage: Option<Outage>,
    /// The body of the 503 an [`OutageKind::Unavailable`] outage answers
    /// with: the provider's own error shape (empty: no body).
    pub unavailable_body: &'static str,
}

/// The protocol a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
    /// Either: read the client's first bytes.
    Sniff,
}

impl Options {
    fn protocol(&self, negotiated: Option<&[u8]>) -> Protocol {
        let offers = |id: &[u8]| self.alpn.iter().any(|p| p == id);
        match negotiated {
            Some(ALPN_H2) => Protocol::Http2,
            Some(_) => Protocol::Http1,
            None if offers(ALPN_H2) && offers(ALPN_HTTP1) => Protocol::Sniff,
            None if offers(ALPN_H2) => Protocol::Http2,
            None => Protocol::Http1,
        }
    }
}

/// What a handler may answer with: a whole body (`Full<Bytes>`, as most
/// mocks) or one that streams (the webhook mock's endless body).
pub trait ResponseBody: hyper::body::Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

impl<B: hyper::body::Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static> ResponseBody for B {}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Binds `addr` for the server named `what` (for the error message). Port 0
/// picks a free port; the caller learns it from the listener before serving.
pub async fn bind(what: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("binding {what} to {addr}"))
}

/// A running server. It stops, aborting open connections, when dropped.
pub struct Server {
    addr: SocketAddr,
    accept_task: JoinHandle<()>,
}

impl Server {
    /// Serves `listener` with the PKI's server certificate until stopped,
    /// answering every request with `handler`. A streamed answer body is
    /// dropped when the client resets its stream or closes the connection.
    pub fn serve<H, F, B>(listener: TcpListener, pki: &TestPki, options: Options, handler: H) -> anyhow::Result<Server>
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: ResponseBody,
    {
        let addr = listener.local_addr()?;
        let alpn: Vec<&[u8]> = options.alpn.iter().map(Vec::as_slice).collect();
        let acceptor = TlsAcceptor::from(pki.server_config(&alpn));
        let accept_task = tokio::spawn(accept_loop(listener, acceptor, options, handler));
        Ok(Server { addr, accept_task })
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://<addr>`, an unspecified address replaced by loopback (the
    /// server certificate covers 127.0.0.1 and ::1).
    pub fn base_url(&self) -> String {
        base_url(self.addr)
    }

    /// Stops accepting and aborts open connections, without waiting.
    pub fn stop_now(&self) {
        self.accept_task.abort();
    }

    /// Stops accepting and aborts open connections; waits for the listener to close.
    pub async fn stop(mut self) {
        self.accept_task.abort();
        let _ = (&mut self.accept_task).await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every connection.
        self.accept_task.abort();
    }
}

/// `https://<addr>`, an unspecified address replaced by loopback.
pub fn base_url(addr: SocketAddr) -> String {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
            IpAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("https://{addr}")
}

/// The whole request body; empty when the client went away mid-body.
pub async fn read_body(body: Incoming) -> Bytes {
    body.collect().await.map(|collected| collected.to_bytes()).unwrap_or_default()
}

/// A response with `status`, `extra` headers and `body`, typed JSON when not empty.
pub fn response(status: u16, body: String, extra: &[(&str, String)]) -> Response<Full<Bytes>> {
    // An invalid scripted status (not 100..=999) is answered as 500.
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = Response::builder().status(status);
    if !body.is_empty() {
        builder = builder.header(http::header::CONTENT_TYPE, "application/json");
    }
    for (name, value) in extra {
        builder = builder.header(*name, value.as_str());
    }
    builder.body(Full::new(Bytes::from(body))).unwrap_or_else(|_| {
        // Only an invalid scripted header value gets here.
        let mut fallback = Response::new(Full::new(Bytes::new()));
        *fallback.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        fallback
    })
}

async fn accept_loop<H, F, B>(listener: TcpListener, acceptor: TlsAcceptor, options: Options, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: ResponseBody,
{
    let addr = listener.local_addr();
    let mut outage = options.outage.as_ref().map(Outage::subscribe);
    let mut current: Option<OutageKind> = None;
    // `None` while an outage refuses connections; the port is then held by
    // `reserved`, bound but not listening, so connecting is refused.
    let mut listener = Some(listener);
    let mut reserved: Option<TcpSocket> = None;
    // Owns the connection tasks: aborted together with this loop.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((tcp, _peer)) => match (current, &outage) {
                    (Some(OutageKind::TlsStall), Some(rx)) => {
                        if let Some(o) = &options.outage {
                            o.count();
                        }
                        connections.spawn(stall(tcp, rx.clone()));
                    }
                    _ => {
                        connections.spawn(serve_connection(tcp, acceptor.clone(), options.clone(), handler.clone()));
                    }
                },
                Err(error) => {
                    // E.g. out of file descriptors under load: back off briefly.
                    tracing::warn!(%error, "mock server accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            next = changed(outage.as_mut()) => {
                let (Some(next), Ok(addr)) = (next, &addr) else { continue };
                if next == current {
                    continue;
                }
                let entering = |kind| next == Some(kind) && current != Some(kind);
                if entering(OutageKind::Refuse) || entering(OutageKind::TlsStall) {
                    // The provider went away: its open connections with it.
                    connections.abort_all();
                }
                if next == Some(OutageKind::Refuse) && listener.take().is_some() {
                    reserved = reserve(*addr)
                        .inspect_err(|error| tracing::warn!(%error, "mock server could not keep its port"))
                        .ok();
                }
                if next != Some(OutageKind::Refuse) && listener.is_none() {
                    listener = Some(relisten(reserved.take(), *addr).await);
                }
                current = next;
            },
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The next connection, or never while no listener is open.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// The outage after its next change, or never without one.
async fn changed(outage: Option<&mut watch::Receiver<Option<OutageKind>>>) -> Option<Option<OutageKind>> {
    let Some(rx) = outage else { return std::future::pending().await };
    match rx.changed().await {
        Ok(()) => Some(*rx.borrow_and_update()),
        // The switch is gone with the mock: no change will come.
        Err(_) => std::future::pending().await,
    }
}

/// `addr` bound without listening, so that connecting to it is refused and
/// no other socket takes the port while the outage lasts.
fn reserve(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // As the first listener (tokio binds with it): connections it left in
    // TIME_WAIT do not keep the port.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// Listens on `addr` again (on the reserved socket when there is one),
/// trying for a few seconds if another socket holds the port.
async fn relisten(reserved: Option<TcpSocket>, addr: SocketAddr) -> TcpListener {
    if let Some(socket) = reserved {
        match socket.listen(1024) {
            Ok(listener) => return listener,
            Err(error) => tracing::warn!(%error, "mock server could not listen again on its port"),
        }
    }
    let mut pause = Duration::from_millis(10);
    loop {
        match reserve(addr).and_then(|s| s.listen(1024)) {
            Ok(listener) => return listener,
            Err(error) => {
                tracing::warn!(%error, "mock server could not listen again on its port; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// A connection met by a TLS stall: held without reading or writing a byte
/// until the stall ends, then closed (the client has given up by then, or
/// connects again).
async fn stall(tcp: TcpStream, mut outage: watch::Receiver<Option<OutageKind>>) {
    let _ = outage.wait_for(|kind| *kind != Some(OutageKind::TlsStall)).await;
    drop(tcp);
}

async fn serve_connection<H, F, B>(tcp: TcpStream, acceptor: TlsAcceptor, options: Options, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: ResponseBody,
{
    let _ = tcp.set_nodelay(true);
    let tls = match acceptor.accept(tcp).await {
        Ok(tls) => tls,
        Err(error) => {
            tracing::debug!(%error, "mock server TLS handshake failed");
            return;
        }
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(options.max_concurrent_streams);
    let builder = match options.protocol(tls.get_ref().1.alpn_protocol()) {
        Protocol::Http1 => builder.http1_only(),
        Protocol::Http2 => builder.http2_only(),
        Protocol::Sniff => builder,
    };
    let (outage, unavailable) = (options.outage.clone(), options.unavailable_body);
    let service = service_fn(move |req| {
        let (handler, outage) = (handler.clone(), outage.clone());
        async move {
            if let Some(outage) = &outage
                && let Gate::Unavailable = outage.gate().await
            {
                return Ok::<_, Infallible>(response(503, unavailable.into(), &[]).map(Either::Left));
            }
            Ok(handler(req).await.map(Either::Right))
        }
    });
    let served = match options.wire {
        Some(stats) => builder.serve_connection(TokioIo::new(Tap::new(tls, stats)), service).await,
        None => builder.serve_connection(TokioIo::new(tls), service).await,
    };
    if let Err(error) = served {
        tracing::debug!(%error, "mock server connection ended with error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(alpn: &[&[u8]]) -> Options {
        Options {
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            max_concurrent_streams: 100,
            wire: None,
            outage: None,
            unavailable_body: "",
        }
    }

    #[test]
    fn alpn_decides_the_protocol_and_its_absence_what_was_offered() {
        let both = options(&[ALPN_H2, ALPN_HTTP1]);
        assert_eq!(both.protocol(Some(ALPN_H2)), Protocol::Http2);
        assert_eq!(both.protocol(Some(ALPN_HTTP1)), Protocol::Http1);
        assert_eq!(both.protocol(None), Protocol::Sniff);
        assert_eq!(options(&[ALPN_H2]).protocol(None), Protocol::Http2);
        assert_eq!(options(&[ALPN_HTTP1]).protocol(None), Protocol::Http1);
        assert_eq!(options(&[]).protocol(None), Protocol::Http1);
    }

    #[test]
    fn base_url_replaces_an_unspecified_address() {
        assert_eq!(base_url("0.0.0.0:8443".parse().unwrap()), "https://127.0.0.1:8443");
        assert_eq!(base_url("[::]:8443".parse().unwrap()), "https://[::1]:8443");
        assert_eq!(base_url("127.0.0.1:1".parse().unwrap()), "https://127.0.0.1:1");
    }
}
