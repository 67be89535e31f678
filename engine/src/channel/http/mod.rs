//! The HTTPS webhook channel: signed POSTs (PUSH-235) to checked addresses only
//! (PUSH-256), pooled keep-alive connections, HTTP/2 or HTTP/1.1 by ALPN.
//! `signing` makes the three PUSH-235 headers.
//!
//! The destination guard (`transport::destination`) and the checked pool
//! (`transport::checked`) are the transport's: the channel calls
//! `WebhookPolicy::check` before every attempt (this also covers IP-literal
//! hosts, which the connector connects to without calling its resolver), and
//! connects through `CheckedResolver`. No error or log line here names a URL,
//! host, address or key (PUSH-254).

mod body;
mod classify;
mod settings;
pub mod signing;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};

use self::classify::{CONNECTION_ERROR, TIMED_OUT, classify};
use crate::channel::outcome::{Answer, Outcome, Sent};
use crate::channel::provider::{BuildError, ChannelContext, Provider, Push, Refused};
use crate::channel::relayed::Refusal;
use crate::domain::{Channel, DeliveryTarget, SigningKey, Timestamp, WebhookUrl};
use crate::metrics::Metrics;
use crate::transport::checked::{CheckedDestinations, DestinationSettings};
use crate::transport::destination::HickoryResolver;
use crate::transport::pool::SendError;

pub use body::webhook_body;
pub use settings::HttpSettings;
pub use signing::{HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, WebhookHeaders, new_webhook_id, sign};

pub struct WebhookProvider {
    destinations: CheckedDestinations,
    metrics: Arc<Metrics>,
}

impl WebhookProvider {
    /// Builds the channel with the context's resolver, else one of
    /// `settings.dns_servers` (or the system's configuration).
    pub fn new(settings: &HttpSettings, ctx: &ChannelContext) -> Result<Self, BuildError> {
        let resolver = match &ctx.resolver {
            Some(resolver) => resolver.clone(),
            None => Arc::new(
                HickoryResolver::new(&settings.dns_servers)
                    .map_err(|e| BuildError::new("engine.channels.http.dns_servers", e.to_string()))?,
            ),
        };
        let destinations = CheckedDestinations::new(
            DestinationSettings {
                channel: Channel::Http,
                allowed_domains: &settings.allowed_domains,
                allow_private_addresses: settings.allow_private_addresses,
                allow_reserved_addresses: settings.allow_reserved_addresses,
                extra_ca_files: &settings.extra_ca_files,
                connections: settings.connections,
                max_in_flight: settings.max_in_flight,
                rate_limit_per_second: settings.rate_limit_per_second,
                proxy: ctx.proxy_for(Channel::Http),
            },
            resolver,
            &ctx.metrics,
        )
        .map_err(|e| BuildError::new("engine.channels.http.extra_ca_files", e))?;
        Ok(Self { destinations, metrics: ctx.metrics.clone() })
    }
}

#[async_trait]
impl Provider for WebhookProvider {
    fn channel(&self) -> Channel {
        Channel::Http
    }

    /// PUSH-256 at registration.
    async fn admit(&self, target: &DeliveryTarget) -> Result<(), Refused> {
        let DeliveryTarget::Http { url, .. } = target else {
            return Ok(());
        };
        self.destinations.check(url).await.map_err(|e| {
            if e.is_temporary() {
                return Refused::Unavailable(e.to_string());
            }
            self.metrics.webhook_refused_at_register.inc();
            Refused::Invalid(e.to_string())
        })
    }

    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        self.send_answered(push).await.map(|sent| sent.outcome)
    }

    async fn send_answered(&self, push: Push<'_>) -> Result<Sent, Refusal> {
        // A webhook carries spec 000's wake-up only (PUSH-259).
        let Push::Envelope { recipient, envelope } = push else {
            return Err(Refusal::Unsupported);
        };
        let DeliveryTarget::Http { url, signing_key } = &recipient.target else {
            return Ok(Outcome::Rejected.into());
        };
        // PUSH-256: resolve again and check before every attempt; the list of
        // allowed domains binds at send time too.
        match self.destinations.check(url).await {
            Ok(()) => {}
            // A failed lookup is a connection error of the table: transient.
            Err(e) if e.is_temporary() => return Ok(CONNECTION_ERROR.into()),
            Err(_) => {
                self.metrics.webhook_refused_at_send.inc();
                return Ok(Outcome::Rejected.into());
            }
        }
        let Ok(request) = webhook_request(url, signing_key, webhook_body(envelope, recipient)) else {
            return Ok(Outcome::Rejected.into());
        };
        // The outcome is decided on the status line (section 7's HTTPS row
        // names statuses only); the body is drained in the background.
        Ok(match self.destinations.pool.send_for_status(request).await {
            Ok(status) => Sent::answered(classify(status.as_u16()), Answer::status(status.as_u16())),
            Err(SendError::Timeout) => TIMED_OUT.into(),
            Err(SendError::Connection(_)) => CONNECTION_ERROR.into(),
        })
    }

    fn timed_out(&self) -> Outcome {
        TIMED_OUT
    }
}

/// The signed POST of one attempt (PUSH-235). The id and the signature are
/// new for every attempt, so they are sent as never-indexed literals (RFC
/// 7541 section 7.1.3): indexing them would only churn both sides' HPACK
/// tables, and a signature is a value no table should keep.
fn webhook_request(url: &WebhookUrl, key: &SigningKey, body: String) -> Result<http::Request<Bytes>, http::Error> {
    let headers = WebhookHeaders::for_attempt(key, body.as_bytes(), Timestamp::now().as_secs());
    let mut request = http::Request::new(Bytes::from(body));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = url.uri().clone();
    let fields = request.headers_mut();
    fields.reserve(4);
    fields.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    fields.insert(WEBHOOK_ID, never_indexed(headers.id)?);
    fields.insert(WEBHOOK_TIMESTAMP, HeaderValue::try_from(headers.timestamp)?);
    fields.insert(WEBHOOK_SIGNATURE, never_indexed(headers.signature)?);
    Ok(request)
}

// Parsed once: a `&str` name is parsed again on every insert.
const WEBHOOK_ID: HeaderName = HeaderName::from_static(HEADER_ID);
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static(HEADER_TIMESTAMP);
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static(HEADER_SIGNATURE);

fn never_indexed(value: String) -> Result<HeaderValue, http::Error> {
    let mut value = HeaderValue::try_from(value)?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use fanout_testkit::TestPki;
    use fanout_testkit::mock::webhook::{self as mock, AnswerBody, MockWebhookConfig};

    use super::*;
    use crate::channel::common::Connections;
    use crate::domain::SigningKey;
    use crate::testing::{self, NoDns};
    use std::time::Duration;

    /// A provider with one in-flight slot, trusting `pki`.
    fn provider(pki: &TestPki, dir: &tempfile::TempDir) -> WebhookProvider {
        let ca = dir.path().join("ca.pem");
        pki.write_ca(&ca).unwrap();
        let settings = HttpSettings {
            allow_private_addresses: true,
            extra_ca_files: vec![ca],
            max_in_flight: NonZeroUsize::MIN,
            connections: Connections::new(1).unwrap(),
            ..HttpSettings::default()
        };
        let ctx = ChannelContext { resolver: Some(Arc::new(NoDns)), ..ChannelContext::new(Arc::new(Metrics::new())) };
        WebhookProvider::new(&settings, &ctx).unwrap()
    }

    async fn send(provider: &WebhookProvider, url: &str) -> Outcome {
        let recipient = testing::recipient(DeliveryTarget::Http {
            url: crate::domain::WebhookUrl::parse(url).unwrap(),
            signing_key: SigningKey::parse(&[7; 32]).unwrap(),
        });
        let envelope = testing::envelope(1);
        provider.send(Push::Envelope { recipient: &recipient, envelope: &envelope }).await.unwrap()
    }

    #[tokio::test]
    async fn endless_answer_bodies_hold_neither_the_attempt_nor_the_slot() {
        // A few bytes now, then nothing for an hour: the drain would wait
        // DRAIN_TIMEOUT on each.
        let trickle = AnswerBody::Endless { chunk_bytes: 16, every: Duration::from_secs(3600) };
        for receiver in [MockWebhookConfig::default(), MockWebhookConfig::http1_only()] {
            let pki = TestPki::generate(&[]).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let mock = mock::start(&pki, MockWebhookConfig { default_body: trickle, ..receiver }).await.unwrap();
            let provider = provider(&pki, &dir);

            // One slot, five sends: each is decided on its 200 at once.
            for _ in 0..5 {
                let outcome =
                    tokio::time::timeout(Duration::from_secs(5), send(&provider, &mock.url("/trickle"))).await;
                assert_eq!(outcome, Ok(Outcome::Delivered), "a send waited for a body's slot");
                assert_eq!(provider.destinations.pool.available_slots(), 1);
            }
            // One body drains (the room of one slot); the others were dropped.
            assert_eq!(provider.destinations.pool.drain_room(), 0);
            assert_eq!(mock.wait_for_open_bodies_at_most(1, Duration::from_secs(5)).await, 1);
            assert_eq!(mock.received_count(), 5);
        }
    }

    #[tokio::test]
    async fn a_flooding_body_is_read_to_the_cap_then_dropped() {
        let pki = TestPki::generate(&[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let flood = AnswerBody::Endless { chunk_bytes: 16 * 1024, every: Duration::from_millis(1) };
        let mock = mock::start(&pki, MockWebhookConfig { default_body: flood, ..Default::default() }).await.unwrap();
        let provider = provider(&pki, &dir);
        assert_eq!(send(&provider, &mock.url("/flood")).await, Outcome::Delivered);
        assert_eq!(mock.wait_for_open_bodies_at_most(0, Duration::from_secs(5)).await, 0);
        // The drain gave its room back.
        assert!(provider.destinations.pool.drain_room_returns(1, Duration::from_secs(5)).await);
        assert_eq!(provider.destinations.pool.drain_room(), 1);
    }
}
