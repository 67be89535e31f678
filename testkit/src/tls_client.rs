//! Clients for an engine whose listeners speak TLS: HTTP/1.1
//! requests and gRPC channels over rustls, checking the engine's
//! certificate against the test CA as `localhost`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP/1.1 request on `stream`, `Connection: close`: (status, body).
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    host: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<(u16, String)> {
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut buf = Vec::new();
    // Generous: a loaded engine's /metrics can take a while. A TLS peer that
    // closes without close_notify still gave us its answer.
    match tokio::time::timeout(ANSWER_TIMEOUT, stream.read_to_end(&mut buf)).await? {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => {}
        Err(e) => return Err(e.into()),
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).context("no status line")?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

/// A TLS connection to `addr` checked against `config`'s roots as `localhost`.
pub async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await??;
    let name = ServerName::try_from("localhost").expect("a valid name");
    TlsConnector::from(config).connect(name, tcp).await
}

/// An HTTP/1.1 request over TLS (the config's ALPN is narrowed to http/1.1).
pub async fn https_request(
    addr: SocketAddr,
    config: &Arc<ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<(u16, String)> {
    let mut http1 = (**config).clone();
    http1.alpn_protocols = vec![b"http/1.1".to_vec()];
    let stream = connect(addr, Arc::new(http1)).await?;
    exchange(stream, addr, method, path, headers, body).await
}

/// A gRPC channel over TLS (ALPN h2).
pub async fn grpc_channel(addr: SocketAddr, config: &Arc<ClientConfig>) -> anyhow::Result<Channel> {
    let mut h2 = (**config).clone();
    h2.alpn_protocols = vec![b"h2".to_vec()];
    let connector = TlsConnect { addr, config: Arc::new(h2) };
    Ok(Endpoint::from_shared(format!("http://{addr}"))?.connect_with_connector(connector).await?)
}

#[derive(Clone)]
struct TlsConnect {
    addr: SocketAddr,
    config: Arc<ClientConfig>,
}

impl tower_service::Service<Uri> for TlsConnect {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (addr, config) = (self.addr, self.config.clone());
        Box::pin(async move { connect(addr, config).await.map(TokioIo::new) })
    }
}
