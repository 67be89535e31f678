//! A DNS adapter for hyper-util's `HttpConnector` so every new webhook
//! connection goes only to an address checked at that moment (PUSH-256:
//! "MUST connect only to an address it resolved then").
//!
//! `HttpConnector::new_with_resolver(CheckedResolver::new(..))` calls
//! `CheckedResolver` for each new connection to a host name; it resolves the
//! name, applies the same rules as `WebhookPolicy::check` (allowed_domains and
//! the blocked address table), and hands back only those addresses.
//!
//! hyper-util does NOT call the resolver for an IP-literal host: it connects
//! to the literal directly. IP literals are covered by `WebhookPolicy::check`,
//! which the channel calls before every attempt (an IP literal is its own
//! single address, so that check is exactly the address connected to).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

use super::resolve::HostResolver;
use super::safety::{SafetyError, WebhookPolicy};

/// A `tower_service::Service<Name>` for `HttpConnector::new_with_resolver`
/// that resolves through `resolver` and refuses what `policy` refuses.
#[derive(Clone)]
pub struct CheckedResolver {
    resolver: Arc<dyn HostResolver>,
    policy: Arc<WebhookPolicy>,
}

impl CheckedResolver {
    pub fn new(resolver: Arc<dyn HostResolver>, policy: Arc<WebhookPolicy>) -> Self {
        Self { resolver, policy }
    }
}

impl std::fmt::Debug for CheckedResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedResolver").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl tower_service::Service<Name> for CheckedResolver {
    /// Port 0: `HttpConnector` sets the URL's port on each address.
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = SafetyError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, SafetyError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SafetyError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let host = name.as_str().to_ascii_lowercase();
            let addrs = this.policy.check_host(&host, this.resolver.as_ref()).await?;
            let sockets: Vec<SocketAddr> = addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect();
            Ok(sockets.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::destination::resolve::ResolveError;
    use crate::transport::destination::safety::DomainPattern;
    use std::net::IpAddr;
    use std::str::FromStr;
    use tower_service::Service;

    struct Fixed;

    #[async_trait::async_trait]
    impl HostResolver for Fixed {
        async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
            match host {
                "public.example.com" => Ok(vec!["93.184.216.34".parse().unwrap()]),
                "private.example.com" => Ok(vec!["10.1.2.3".parse().unwrap()]),
                "reserved.example.com" => Ok(vec!["198.18.0.1".parse().unwrap(), "2002:a00:1::1".parse().unwrap()]),
                _ => Err(ResolveError::NoRecords),
            }
        }
    }

    fn resolver(policy: WebhookPolicy) -> CheckedResolver {
        CheckedResolver::new(Arc::new(Fixed), Arc::new(policy))
    }

    async fn call(r: &mut CheckedResolver, host: &str) -> Result<Vec<SocketAddr>, SafetyError> {
        r.call(Name::from_str(host).unwrap()).await.map(|it| it.collect())
    }

    #[tokio::test]
    async fn checks_every_resolution() {
        let mut r = resolver(WebhookPolicy::default());
        assert_eq!(call(&mut r, "Public.Example.com").await, Ok(vec!["93.184.216.34:0".parse().unwrap()]));
        assert_eq!(call(&mut r, "private.example.com").await, Err(SafetyError::BlockedAddress));
        assert_eq!(call(&mut r, "nowhere.example.com").await, Err(SafetyError::NoAddress));

        assert_eq!(call(&mut r, "reserved.example.com").await, Err(SafetyError::BlockedAddress));

        let mut r = resolver(WebhookPolicy { allow_private_addresses: true, ..WebhookPolicy::default() });
        assert_eq!(call(&mut r, "private.example.com").await, Ok(vec!["10.1.2.3:0".parse().unwrap()]));
        assert_eq!(call(&mut r, "reserved.example.com").await, Err(SafetyError::BlockedAddress));

        let mut r = resolver(WebhookPolicy { allow_reserved_addresses: true, ..WebhookPolicy::default() });
        assert_eq!(call(&mut r, "reserved.example.com").await.map(|a| a.len()), Ok(2));
        assert_eq!(call(&mut r, "private.example.com").await, Err(SafetyError::BlockedAddress));

        let mut r = resolver(WebhookPolicy {
            allowed_domains: vec![DomainPattern::parse("hooks.example.com").unwrap()],
            allow_private_addresses: false,
            allow_reserved_addresses: false,
        });
        assert_eq!(call(&mut r, "public.example.com").await, Err(SafetyError::DomainNotAllowed));
    }

    #[tokio::test]
    async fn works_as_http_connector_resolver() {
        use hyper_util::client::legacy::connect::HttpConnector;
        // A blocked name fails at the DNS step, before any socket is opened.
        let mut connector = HttpConnector::new_with_resolver(resolver(WebhookPolicy::default()));
        let uri: http::Uri = "http://private.example.com:9/".parse().unwrap();
        let err = connector.call(uri).await.unwrap_err();
        let source = std::error::Error::source(&err).expect("dns error has a cause");
        assert_eq!(source.to_string(), SafetyError::BlockedAddress.to_string());
    }
}
