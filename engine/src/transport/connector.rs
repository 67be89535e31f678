//! How a connection is opened: resolved by the system or through the
//! destination guard, counted, then TLS offering HTTP/2 (and HTTP/1.1) by
//! ALPN; and the keep-alive both HTTP/2 clients use.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use prometheus::IntCounter;

use super::destination::CheckedResolver;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 PINGs keep NATs and load balancers from dropping a connection
/// silently and detect a dead one before a send waits on it.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(60);
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How new connections find their addresses: the system resolver (provider
/// hosts), or the webhook safety check (PUSH-256) for receivers' hosts.
#[derive(Clone)]
pub enum Resolver {
    System(GaiResolver),
    Checked(CheckedResolver),
}

impl Resolver {
    pub fn system() -> Self {
        Self::System(GaiResolver::new())
    }
}

type Addrs = std::vec::IntoIter<SocketAddr>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Name> for Resolver {
    type Response = Addrs;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Addrs, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        match self {
            Self::System(gai) => {
                let resolving = gai.call(name);
                Box::pin(async move { Ok(resolving.await?.collect::<Vec<_>>().into_iter()) })
            }
            Self::Checked(checked) => {
                let resolving = checked.call(name);
                Box::pin(async move { Ok(resolving.await?) })
            }
        }
    }
}

/// A TCP connector that counts the connections it opens
/// (fanout_provider_connections_opened_total): reconnects show up as a rate.
#[derive(Clone)]
pub struct CountingConnector {
    inner: HttpConnector<Resolver>,
    opened: Option<IntCounter>,
}

impl tower_service::Service<Uri> for CountingConnector {
    type Response = <HttpConnector<Resolver> as tower_service::Service<Uri>>::Response;
    type Error = <HttpConnector<Resolver> as tower_service::Service<Uri>>::Error;
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

/// Which protocols ALPN may pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocols {
    /// HTTP/2 only (APNs requires it; FCM and the harness use it).
    Http2,
    /// HTTP/2 or HTTP/1.1, as the server prefers (webhook receivers, OAuth
    /// token endpoints).
    Http1Or2,
}

/// TCP (counted, checked or system-resolved) then TLS offering `protocols`
/// by ALPN.
pub fn connector(
    tls: rustls::ClientConfig,
    protocols: Protocols,
    resolver: Resolver,
    opened: Option<IntCounter>,
    allow_plain_http: bool,
) -> HttpsConnector<CountingConnector> {
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let http = CountingConnector { inner: http, opened };
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
    let builder = if allow_plain_http { builder.https_or_http() } else { builder.https_only() };
    match protocols {
        Protocols::Http2 => builder.enable_http2().wrap_connector(http),
        Protocols::Http1Or2 => builder.enable_http1().enable_http2().wrap_connector(http),
    }
}
