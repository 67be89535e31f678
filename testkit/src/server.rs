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
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

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
    // Owns the connection tasks: aborted together with this loop.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _peer)) => {
                    connections.spawn(serve_connection(tcp, acceptor.clone(), options.clone(), handler.clone()));
                }
                Err(error) => {
                    // E.g. out of file descriptors under load: back off briefly.
                    tracing::warn!(%error, "mock server accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
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
    let service = service_fn(move |req| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler(req).await) }
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
        Options { alpn: alpn.iter().map(|p| p.to_vec()).collect(), max_concurrent_streams: 100, wire: None }
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
