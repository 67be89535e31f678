//! The HTTPS webhook channel: signed POSTs (PUSH-235) to checked addresses only
//! (PUSH-256), pooled keep-alive connections, HTTP/2 or HTTP/1.1 by ALPN.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{Outcome, Provider, Push, webhook_body};
use crate::clock::unix_now_ns;
use crate::domain::{Channel, DeliveryTarget};
use crate::metrics::Metrics;
use crate::webhook::{CheckedResolver, HostResolver, WebhookHeaders, WebhookPolicy, WebhookUrl};

/// Section 7, HTTPS row: every retry waits at least one second.
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// Idle pooled connections are closed after this, so a connection never
/// outlives the address check that opened it by long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

type HttpsClient = Client<HttpsConnector<HttpConnector<CheckedResolver>>, Full<Bytes>>;

pub struct WebhookProvider {
    client: HttpsClient,
    policy: Arc<WebhookPolicy>,
    resolver: Arc<dyn HostResolver>,
    metrics: Arc<Metrics>,
}

impl WebhookProvider {
    pub fn new(
        policy: Arc<WebhookPolicy>,
        resolver: Arc<dyn HostResolver>,
        tls: rustls::ClientConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let mut http = HttpConnector::new_with_resolver(CheckedResolver::new(
            resolver.clone(),
            policy.clone(),
        ));
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(connector);
        Self { client, policy, resolver, metrics }
    }

    async fn post(&self, url: &WebhookUrl, body: String, headers: WebhookHeaders) -> Outcome {
        let request = http::Request::post(url.uri().clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", headers.id)
            .header("webhook-timestamp", headers.timestamp)
            .header("webhook-signature", headers.signature)
            .body(Full::new(Bytes::from(body)));
        let Ok(request) = request else {
            return Outcome::Rejected;
        };
        match self.client.request(request).await {
            Ok(response) => {
                let status = response.status();
                // Drain the body so the connection goes back to the pool.
                let _ = response.into_body().collect().await;
                classify(status.as_u16())
            }
            // Connection errors, including a connect refused by the address
            // check, are transient per the table.
            Err(_) => Outcome::transient(RETRY_DELAY),
        }
    }
}

/// The HTTPS row of the outcome table, first match wins. Redirects are never
/// followed: a 3xx is "anything else".
fn classify(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered,
        404 | 410 => Outcome::Transient { delay: RETRY_DELAY, gone: true },
        500..=599 => Outcome::transient(RETRY_DELAY),
        _ => Outcome::Rejected,
    }
}

#[async_trait]
impl Provider for WebhookProvider {
    fn channel(&self) -> Channel {
        Channel::Http
    }

    async fn send(&self, push: Push<'_>) -> Outcome {
        let DeliveryTarget::Http { url, signing_key } = &push.recipient.target else {
            return Outcome::Rejected;
        };
        let Ok(url) = WebhookUrl::parse(url) else {
            return Outcome::Rejected;
        };
        // PUSH-256: resolve again and check before every attempt; the list of
        // allowed domains binds at send time too.
        if self.policy.check(&url, self.resolver.as_ref()).await.is_err() {
            self.metrics.webhook_refused_at_send.inc();
            return Outcome::Rejected;
        }
        let body = webhook_body(push.envelope, push.recipient);
        let now = unix_now_ns() / 1_000_000_000;
        let headers = WebhookHeaders::for_attempt(signing_key, body.as_bytes(), now);
        self.post(&url, body, headers).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_outcome_table() {
        assert_eq!(classify(200), Outcome::Delivered);
        assert_eq!(classify(204), Outcome::Delivered);
        assert_eq!(classify(404), Outcome::Transient { delay: RETRY_DELAY, gone: true });
        assert_eq!(classify(410), Outcome::Transient { delay: RETRY_DELAY, gone: true });
        assert_eq!(classify(500), Outcome::transient(RETRY_DELAY));
        assert_eq!(classify(503), Outcome::transient(RETRY_DELAY));
        assert_eq!(classify(301), Outcome::Rejected);
        assert_eq!(classify(302), Outcome::Rejected);
        assert_eq!(classify(400), Outcome::Rejected);
        assert_eq!(classify(429), Outcome::Rejected);
    }
}
