//! Accepting connections, the same way on every listener (issue 16): at
//! most `max_connections` open at once (the next is not accepted until one
//! closes; the kernel's backlog holds it), the TLS handshake bounded by
//! `handshake_timeout` and done in its own task so a slow client never
//! holds up the others, and the identities of a verified client certificate
//! handed on with the connection. HTTP listeners serve an axum `Router`
//! (`serve_http`) with a bound on reading request headers; the gRPC listener
//! gets the same connections as tonic's incoming stream (`GrpcConn`).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;
use tower_service::Service;

use crate::auth::Peer;

/// Handshaken connections waiting for their server; the connection cap is
/// what really bounds them.
const QUEUE: usize = 64;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
}

/// Where a listener's TLS configuration comes from: read at each handshake,
/// so a reloaded certificate applies to the next connection.
pub type TlsSource = Arc<dyn Fn() -> Arc<ServerConfig> + Send + Sync>;

type Io = Either<TcpStream, TlsStream<TcpStream>>;

/// One accepted (and, with TLS, handshaken) connection. Holds its slot of
/// the connection cap until dropped.
pub struct Accepted {
    io: Io,
    peer: Peer,
    /// The TCP peer's address (the Station trusts its front proxy's account
    /// header only from configured addresses, spec 002).
    remote: std::net::SocketAddr,
    _slot: OwnedSemaphorePermit,
}

/// Accepts until `shutdown`, yielding connections ready to serve.
pub fn accept(
    listener: TcpListener,
    tls: Option<TlsSource>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) -> mpsc::Receiver<Accepted> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        loop {
            // The cap is enforced before accepting, where the work is spawned.
            let slot = tokio::select! {
                slot = slots.clone().acquire_owned() => match slot { Ok(s) => s, Err(_) => return },
                _ = shutdown.changed() => return,
            };
            let (stream, remote) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and the like: wait instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.changed() => return,
            };
            let _ = stream.set_nodelay(true);
            let tx = tx.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let accepted = match tls {
                    None => Accepted { io: Either::Left(stream), peer: Peer::default(), remote, _slot: slot },
                    Some(config) => {
                        let handshake = TlsAcceptor::from(config()).accept(stream);
                        let stream = match tokio::time::timeout(limits.handshake_timeout, handshake).await {
                            Ok(Ok(s)) => s,
                            // Not worth more than debug: scanners, plaintext
                            // clients, expired client certificates.
                            Ok(Err(e)) => return tracing::debug!(error = %e, "TLS handshake failed"),
                            Err(_) => return tracing::debug!("TLS handshake timed out"),
                        };
                        let peer = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|chain| chain.first())
                            .map(|leaf| Peer::from_certificate(leaf))
                            .unwrap_or_default();
                        Accepted { io: Either::Right(stream), peer, remote, _slot: slot }
                    }
                };
                let _ = tx.send(accepted).await;
            });
        }
    });
    rx
}

/// Serves `router` on the connections of `incoming` until `shutdown`, then
/// lets open requests finish (the caller bounds that with its drain timeout).
pub async fn serve_http(
    mut incoming: mpsc::Receiver<Accepted>,
    router: Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Slow-loris: a client that does not finish its headers is dropped.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(Duration::from_secs(30)));
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            a = incoming.recv() => match a { Some(a) => a, None => break },
            _ = shutdown.changed() => break,
        };
        let Accepted { io, peer, remote, _slot } = accepted;
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(peer.clone());
            req.extensions_mut().insert(axum::extract::ConnectInfo(remote));
            let mut router = router.clone();
            async move { router.call(req).await }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _slot = _slot;
            let _ = connection.await;
        });
    }
    graceful.shutdown().await;
}

/// A connection as tonic's `serve_with_incoming` takes it; the peer's
/// identities reach every request's extensions as `Peer`.
pub struct GrpcConn(Accepted);

impl GrpcConn {
    /// tonic's incoming stream over `incoming`.
    pub fn stream(
        incoming: mpsc::Receiver<Accepted>,
    ) -> impl futures::Stream<Item = Result<GrpcConn, io::Error>> + Send + 'static {
        futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(incoming), |a| Ok(GrpcConn(a)))
    }
}

impl tonic::transport::server::Connected for GrpcConn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.0.peer.clone()
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.io.is_write_vectored()
    }
}

/// Binds a listener, naming the key on failure.
pub async fn bind(address: SocketAddr, key: &str) -> anyhow::Result<TcpListener> {
    use anyhow::Context as _;
    TcpListener::bind(address).await.with_context(|| format!("{key}: cannot listen on {address}"))
}
