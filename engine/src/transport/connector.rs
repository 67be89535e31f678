//! How a connection is opened: resolved by the system or through the
//! destination guard, directly or through the outbound proxy, counted, then
//! TLS offering HTTP/2 (and HTTP/1.1) by ALPN; and the keep-alive both
//! HTTP/2 clients use.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::str::FromStr as _;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use hyper_util::rt::TokioIo;
use prometheus::IntCounter;
use tokio::net::TcpStream;

use super::destination::CheckedResolver;
use super::proxy::{OutboundProxy, ProxyError};

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

/// How new connections reach their destination: the addresses come from
/// `resolver`; with a `proxy`, each connection is a tunnel through it.
#[derive(Clone)]
pub struct Dialer {
    resolver: Resolver,
    proxy: Option<Arc<OutboundProxy>>,
}

impl Dialer {
    /// Straight to the addresses `resolver` finds.
    pub fn direct(resolver: Resolver) -> Self {
        Self { resolver, proxy: None }
    }

    /// Through `proxy` when there is one.
    pub fn through(resolver: Resolver, proxy: Option<Arc<OutboundProxy>>) -> Self {
        Self { resolver, proxy }
    }
}

/// A TCP connector that counts the connections it opens
/// (fanout_provider_connections_opened_total): reconnects show up as a rate.
#[derive(Clone)]
pub struct CountingConnector {
    dial: Dial,
    opened: Option<IntCounter>,
}

#[derive(Clone)]
enum Dial {
    Direct(HttpConnector<Resolver>),
    Proxied { proxy: Arc<OutboundProxy>, resolver: Resolver },
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;

impl tower_service::Service<Uri> for CountingConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match &mut self.dial {
            Dial::Direct(http) => http.poll_ready(cx).map_err(Into::into),
            Dial::Proxied { .. } => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting: Connecting = match &mut self.dial {
            Dial::Direct(http) => {
                let connecting = http.call(uri);
                Box::pin(async move { Ok(connecting.await?) })
            }
            Dial::Proxied { proxy, resolver } => Box::pin(tunnel(proxy.clone(), resolver.clone(), uri)),
        };
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

/// A tunnel through `proxy` to `uri`'s host and port. A name the destination
/// guard checks is resolved and checked here, and the proxy is asked for the
/// checked address (each in turn), so it never resolves the name itself; a
/// provider's host is asked for by name.
async fn tunnel(proxy: Arc<OutboundProxy>, mut resolver: Resolver, uri: Uri) -> Result<TokioIo<TcpStream>, BoxError> {
    let host = uri.host().ok_or("the URL has no host")?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("http") { 80 } else { 443 });
    let checked = matches!(resolver, Resolver::Checked(_));
    let authorities: Vec<String> = match host.parse::<IpAddr>() {
        // An IP literal: what the channel's own check covered (checked.rs).
        Ok(ip) => vec![SocketAddr::new(ip, port).to_string()],
        Err(_) if !checked => vec![format!("{host}:{port}")],
        Err(_) => {
            let name = Name::from_str(host)?;
            let addrs = tower_service::Service::call(&mut resolver, name).await?;
            addrs.map(|a| SocketAddr::new(a.ip(), port).to_string()).collect()
        }
    };
    let mut last: Option<BoxError> = None;
    for authority in authorities {
        match tokio::time::timeout(CONNECT_TIMEOUT, proxy.tunnel(&authority)).await {
            Ok(Ok(stream)) => return Ok(TokioIo::new(stream)),
            Ok(Err(e)) => last = Some(e.into()),
            Err(_) => last = Some(ProxyError::Timeout(CONNECT_TIMEOUT).into()),
        }
    }
    Err(last.unwrap_or_else(|| "the host has no address".into()))
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

/// TCP (counted, checked or system-resolved, direct or tunnelled) then TLS
/// offering `protocols` by ALPN.
pub fn connector(
    tls: rustls::ClientConfig,
    protocols: Protocols,
    dialer: Dialer,
    opened: Option<IntCounter>,
    allow_plain_http: bool,
) -> HttpsConnector<CountingConnector> {
    let dial = match dialer.proxy {
        Some(proxy) => Dial::Proxied { proxy, resolver: dialer.resolver },
        None => {
            let mut http = HttpConnector::new_with_resolver(dialer.resolver);
            http.enforce_http(false);
            http.set_nodelay(true);
            http.set_connect_timeout(Some(CONNECT_TIMEOUT));
            Dial::Direct(http)
        }
    };
    let http = CountingConnector { dial, opened };
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
    let builder = if allow_plain_http { builder.https_or_http() } else { builder.https_only() };
    match protocols {
        Protocols::Http2 => builder.enable_http2().wrap_connector(http),
        Protocols::Http1Or2 => builder.enable_http1().enable_http2().wrap_connector(http),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    use super::*;
    use crate::transport::destination::resolve::{HostResolver, ResolveError};
    use crate::transport::destination::safety::WebhookPolicy;
    use crate::transport::proxy::OutboundProxySettings;

    /// A proxy that answers every CONNECT with 200 and records its target.
    async fn recording_proxy() -> (Arc<OutboundProxy>, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let settings: OutboundProxySettings = serde_json::from_value(serde_json::json!({"url": url})).unwrap();
        let targets = Arc::new(Mutex::new(Vec::new()));
        let recorded = targets.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut chunk = [0u8; 512];
                while !head.ends_with(b"\r\n\r\n") {
                    let n = socket.read(&mut chunk).await.unwrap();
                    head.extend_from_slice(&chunk[..n]);
                }
                let line = String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_owned();
                recorded.lock().unwrap().push(line);
                socket.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.unwrap();
                tokio::spawn(async move {
                    let _ = socket.read(&mut chunk).await;
                });
            }
        });
        (Arc::new(OutboundProxy::new(&settings).unwrap()), targets)
    }

    struct Rebound;

    #[async_trait::async_trait]
    impl HostResolver for Rebound {
        async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
            match host {
                "hooks.example.com" => Ok(vec!["93.184.216.34".parse().unwrap(), "2606:2800:220::1".parse().unwrap()]),
                "inside.example.com" => Ok(vec!["10.0.0.7".parse().unwrap()]),
                _ => Err(ResolveError::NoRecords),
            }
        }
    }

    fn checked() -> Resolver {
        Resolver::Checked(CheckedResolver::new(Arc::new(Rebound), Arc::new(WebhookPolicy::default())))
    }

    #[tokio::test]
    async fn a_provider_host_is_asked_for_by_name() {
        let (proxy, targets) = recording_proxy().await;
        let uri: Uri = "https://api.push.apple.com/3/device/x".parse().unwrap();
        tunnel(proxy.clone(), Resolver::system(), uri).await.expect("tunnel");
        let uri: Uri = "https://[2001:db8::1]:2197/".parse().unwrap();
        tunnel(proxy, Resolver::system(), uri).await.expect("tunnel");
        assert_eq!(
            *targets.lock().unwrap(),
            ["CONNECT api.push.apple.com:443 HTTP/1.1", "CONNECT [2001:db8::1]:2197 HTTP/1.1"]
        );
    }

    #[tokio::test]
    async fn a_checked_host_is_asked_for_by_its_checked_address_and_a_blocked_one_not_at_all() {
        let (proxy, targets) = recording_proxy().await;
        let uri: Uri = "https://hooks.example.com:8443/hook".parse().unwrap();
        tunnel(proxy.clone(), checked(), uri).await.expect("tunnel");
        assert_eq!(*targets.lock().unwrap(), ["CONNECT 93.184.216.34:8443 HTTP/1.1"], "the first address that tunnels");

        let uri: Uri = "https://inside.example.com/hook".parse().unwrap();
        let err = tunnel(proxy, checked(), uri).await.unwrap_err();
        assert!(err.to_string().contains("allowed address"), "{err}");
        assert_eq!(targets.lock().unwrap().len(), 1, "the proxy was not asked for a blocked address");
    }
}
