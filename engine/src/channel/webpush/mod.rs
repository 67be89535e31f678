//! The Web Push channel (RFC 8030, 8291, 8292): a browser subscription's
//! endpoint, reached with an encrypted wake-up and a VAPID token.
//!
//! - `settings`: `[engine.channels.webpush]`.
//! - `encryption`: RFC 8291 `aes128gcm` message encryption.
//! - `vapid`: RFC 8292 ES256 tokens, cached per origin.
//! - `request`: the payload and the RFC 8030 headers.
//! - `classify`: the channel's row of the outcome table.
//!
//! An endpoint is a URL a recipient chose, so it passes the HTTPS channel's
//! destination rules (PUSH-256): checked at registration, resolved and
//! checked again before every attempt, and every new connection goes only
//! to an address checked then (`http::CheckedResolver`). No error or log
//! line names an endpoint, key or token (PUSH-254).

mod classify;
pub mod encryption;
pub mod request;
mod settings;
pub mod vapid;

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use http::StatusCode;

use self::classify::{CONNECTION_ERROR, RETRY_DELAY, TIMED_OUT, classify_answer};
use crate::channel::common::PushLifetime;
use crate::channel::outcome::{Answer, Outcome, Sent};
use crate::channel::provider::{BuildError, ChannelContext, Provider, Push, Refused};
use crate::channel::relayed::Refusal;
use crate::domain::{Channel, DeliveryTarget, WebPushKeys, WebhookUrl};
use crate::transport::checked::{CheckedDestinations, DestinationSettings};
use crate::transport::destination::{HickoryResolver, SafetyError};
use crate::transport::pool::{SendError, unix_now_secs};

pub use encryption::{EncryptError, MAX_PLAINTEXT, encrypt};
pub use request::{PushHeaders, Urgency, topic_for, wake_up};
pub use settings::WebPushSettings;
pub use vapid::{Vapid, VapidKeyError, origin};

pub struct WebPushProvider {
    destinations: CheckedDestinations,
    vapid: Vapid,
    lifetime: PushLifetime,
}

impl WebPushProvider {
    /// Reads the VAPID key and builds the channel with the context's
    /// resolver, else one of `settings.dns_servers` (or the system's).
    pub fn new(settings: &WebPushSettings, ctx: &ChannelContext) -> Result<Self, BuildError> {
        let resolver = match &ctx.resolver {
            Some(resolver) => resolver.clone(),
            None => Arc::new(
                HickoryResolver::new(&settings.dns_servers)
                    .map_err(|e| BuildError::new("engine.channels.webpush.dns_servers", e.to_string()))?,
            ),
        };
        const KEY: &str = "engine.channels.webpush.vapid_key_file";
        let path = settings.vapid_key_file.display();
        let pem = std::fs::read(&settings.vapid_key_file)
            .map_err(|e| BuildError::new(KEY, format!("cannot read {path}: {e}")))?;
        let vapid =
            Vapid::from_pem(&pem, settings.subject.clone()).map_err(|e| BuildError::new(KEY, format!("{path} {e}")))?;
        // Sign once now, so a key that cannot sign fails at start.
        vapid
            .authorization("https://start.invalid", 0)
            .map_err(|_| BuildError::new(KEY, format!("{path} cannot sign ES256")))?;
        vapid.forget("https://start.invalid");
        // The same checked destinations as the HTTPS channel's (PUSH-256).
        let destinations = CheckedDestinations::new(
            DestinationSettings {
                channel: Channel::WebPush,
                allowed_domains: &settings.allowed_domains,
                allow_private_addresses: settings.allow_private_addresses,
                allow_reserved_addresses: settings.allow_reserved_addresses,
                extra_ca_files: &settings.extra_ca_files,
                connections: settings.connections,
                max_in_flight: settings.max_in_flight,
                rate_limit_per_second: settings.rate_limit_per_second,
                proxy: ctx.proxy_for(Channel::WebPush),
            },
            resolver,
            &ctx.metrics,
        )
        .map_err(|e| BuildError::new("engine.channels.webpush.extra_ca_files", e))?;
        Ok(Self { destinations, vapid, lifetime: settings.ttl_seconds })
    }

    /// The VAPID public key browsers subscribe with (`applicationServerKey`).
    pub fn vapid_public_key(&self) -> &str {
        self.vapid.public_key()
    }

    /// One attempt: check the endpoint again, encrypt, sign, send, classify.
    async fn attempt(&self, url: &WebhookUrl, keys: &WebPushKeys, plaintext: &[u8], headers: &PushHeaders) -> Sent {
        match self.destinations.check(url).await {
            Ok(()) => {}
            // A failed lookup is a connection error: transient.
            Err(e) if e.is_temporary() => return CONNECTION_ERROR.into(),
            Err(_) => return Outcome::Rejected.into(),
        };
        let origin = origin(url.host(), url.port());
        // No request leaves without a token or a body: not an attempt.
        let Ok(authorization) = self.vapid.authorization(&origin, unix_now_secs()) else {
            return Outcome::NotSent { delay: RETRY_DELAY }.into();
        };
        let body = match encrypt(plaintext, keys) {
            Ok(body) => body,
            Err(EncryptError::TooLarge) => return Outcome::Rejected.into(),
            Err(EncryptError::Crypto) => return Outcome::NotSent { delay: RETRY_DELAY }.into(),
        };
        let Ok(request) = request::request(url.uri(), authorization, headers, body) else {
            return Outcome::Rejected.into();
        };
        match self.destinations.pool.send(request).await {
            Ok(answer) => {
                if matches!(answer.status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
                    // Rejected per the table; the next push signs a new token.
                    self.vapid.forget(&origin);
                }
                let outcome = classify_answer(answer.status, &answer.headers, SystemTime::now());
                Sent::answered(outcome, Answer::status(answer.status.as_u16()))
            }
            Err(SendError::Timeout) => TIMED_OUT.into(),
            Err(SendError::Connection(_)) => CONNECTION_ERROR.into(),
        }
    }
}

/// The rule an endpoint broke, in the channel's words (PUSH-254: never the URL).
fn endpoint_refusal(e: SafetyError) -> &'static str {
    match e {
        SafetyError::DomainNotAllowed => "webpush endpoint host matches no entry of allowed_domains",
        SafetyError::NoAddress | SafetyError::BlockedAddress => {
            "webpush endpoint host does not resolve to an allowed address"
        }
        SafetyError::DnsUnavailable => "webpush endpoint host cannot be resolved right now",
    }
}

#[async_trait]
impl Provider for WebPushProvider {
    fn channel(&self) -> Channel {
        Channel::WebPush
    }

    /// PUSH-256 at registration, as for a webhook URL.
    async fn admit(&self, target: &DeliveryTarget) -> Result<(), Refused> {
        let DeliveryTarget::WebPush { endpoint, .. } = target else {
            return Ok(());
        };
        self.destinations.check(endpoint).await.map_err(|e| {
            let rule = endpoint_refusal(e).to_owned();
            if e.is_temporary() { Refused::Unavailable(rule) } else { Refused::Invalid(rule) }
        })
    }

    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        self.send_answered(push).await.map(|sent| sent.outcome)
    }

    async fn send_answered(&self, push: Push<'_>) -> Result<Sent, Refusal> {
        match push {
            Push::Envelope { recipient, envelope } => {
                let DeliveryTarget::WebPush { endpoint, keys } = &recipient.target else {
                    return Ok(Outcome::Rejected.into());
                };
                // Spec 000 wake-ups carry no collapse key (PUSH-259), so no Topic.
                let headers =
                    PushHeaders { ttl: u64::from(self.lifetime.seconds()), urgency: Urgency::Normal, topic: None };
                Ok(self.attempt(endpoint, keys, wake_up(envelope).as_bytes(), &headers).await)
            }
            // Spec 003 §3 over Web Push: §1's keys (a registration without
            // valid ones can never be delivered), the relayed payload (without
            // `mls_message` when over one record), `TTL` = the push's ttl,
            // `Urgency` from its priority, `Topic` from its collapse id.
            Push::Relayed(push) => {
                let Some(keys) = push.web_push_keys else {
                    return Ok(Outcome::Rejected.into());
                };
                let fitted = request::relayed_payload(&push)?;
                let headers = PushHeaders {
                    ttl: push.ttl.as_secs(),
                    urgency: push.priority.into(),
                    topic: push.collapse_id.map(topic_for),
                };
                // The hub's token is the endpoint, parsed here as at
                // registration; one that breaks PUSH-256's rules is refused
                // like a blocked one.
                let Ok(endpoint) = WebhookUrl::parse(push.token) else {
                    return Ok(Outcome::Rejected.into());
                };
                Ok(self.attempt(&endpoint, keys, fitted.body.as_bytes(), &headers).await)
            }
        }
    }

    fn timed_out(&self) -> Outcome {
        TIMED_OUT
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fanout_testkit::TestPki;
    use fanout_testkit::mock::webpush::{self as mock, MockSubscription, MockWebPush, WebPushReply};
    use fanout_testkit::webpush::VapidTestKey;

    use super::*;
    use crate::channel::relayed::RelayedPush;
    use crate::metrics::Metrics;
    use crate::testing::{self, NoDns};

    struct Setup {
        mock: MockWebPush,
        provider: WebPushProvider,
        key: VapidTestKey,
        _dir: tempfile::TempDir,
    }

    fn settings(dir: &tempfile::TempDir, key: &VapidTestKey, pki: &TestPki, private: bool) -> WebPushSettings {
        let (ca, pem) = (dir.path().join("ca.pem"), dir.path().join("vapid.pem"));
        pki.write_ca(&ca).unwrap();
        key.write(&pem).unwrap();
        let mut s: WebPushSettings = serde_json::from_value(serde_json::json!({
            "vapid_key_file": pem, "subject": "mailto:ops@example.com", "ttl_seconds": 600,
        }))
        .unwrap();
        s.extra_ca_files = vec![ca];
        s.allow_private_addresses = private;
        s
    }

    async fn setup() -> Setup {
        let pki = TestPki::generate(&[]).unwrap();
        let key = VapidTestKey::generate();
        let mock = mock::start(&pki, Some(key.public_key.clone())).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let provider = WebPushProvider::new(&settings(&dir, &key, &pki, true), &no_dns()).unwrap();
        Setup { mock, provider, key, _dir: dir }
    }

    fn no_dns() -> ChannelContext {
        ChannelContext { resolver: Some(Arc::new(NoDns)), ..ChannelContext::new(Arc::new(Metrics::new())) }
    }

    fn target(s: &MockSubscription) -> DeliveryTarget {
        DeliveryTarget::WebPush {
            endpoint: WebhookUrl::parse(&s.endpoint).unwrap(),
            keys: WebPushKeys::parse(&s.p256dh, &s.auth).unwrap(),
        }
    }

    async fn send(s: &Setup, sub: &MockSubscription, seq: u64) -> Outcome {
        let recipient = testing::recipient(target(sub));
        let envelope = testing::envelope(seq);
        s.provider.send(Push::Envelope { recipient: &recipient, envelope: &envelope }).await.unwrap()
    }

    #[tokio::test]
    async fn the_push_service_decrypts_the_wake_up_and_verifies_vapid() {
        let s = setup().await;
        assert_eq!(s.provider.vapid_public_key(), s.key.public_key);
        let sub = s.mock.subscribe();
        assert_eq!(send(&s, &sub, 42).await, Outcome::Delivered);
        assert_eq!(send(&s, &sub, 43).await, Outcome::Delivered);
        let got = s.mock.wait_for(&sub.id, 2, Duration::from_secs(5)).await;
        let r = &got[0];
        assert_eq!(r.json(), Some(serde_json::json!({"topic": "AAECAw==", "sequence_id": "42"})));
        let vapid = r.vapid.as_ref().unwrap();
        assert_eq!(
            (vapid.aud.as_str(), vapid.sub.as_deref()),
            (s.mock.base_url().as_str(), Some("mailto:ops@example.com"))
        );
        assert_eq!((r.header("ttl"), r.header("urgency"), r.header("topic")), (Some("600"), Some("normal"), None));
        assert_eq!(r.header("content-encoding"), Some("aes128gcm"));
        assert_eq!(r.version, "HTTP/2.0");
        assert_eq!(got[1].json().unwrap()["sequence_id"], "43");
        assert_eq!(got[0].header("authorization"), got[1].header("authorization"), "the token is cached");
    }

    #[tokio::test]
    async fn answers_are_classified_by_the_table() {
        let s = setup().await;
        let sub = s.mock.subscribe();
        let cases = [
            (WebPushReply::status(202), Outcome::Delivered),
            (WebPushReply::status(410), Outcome::Terminal),
            (WebPushReply::status(404), Outcome::Terminal),
            (WebPushReply::status(413), Outcome::Rejected),
            (WebPushReply::status(400), Outcome::Rejected),
            (WebPushReply::status(500), Outcome::transient(Duration::from_secs(1))),
            (WebPushReply::status(429), Outcome::transient(Duration::from_secs(10))),
            (WebPushReply::status(429).with_retry_after("45"), Outcome::transient(Duration::from_secs(45))),
            (WebPushReply::status(503).with_retry_after("9999"), Outcome::transient(Duration::from_secs(300))),
        ];
        for (reply, expected) in cases {
            s.mock.script(&sub.id, vec![reply.clone()]);
            assert_eq!(send(&s, &sub, 1).await, expected, "{reply:?}");
        }
        // A subscription the service does not know: 404, terminal.
        let gone = MockSubscription { endpoint: format!("{}/push/unknown", s.mock.base_url()), ..sub.clone() };
        assert_eq!(send(&s, &gone, 1).await, Outcome::Terminal);
    }

    #[tokio::test]
    async fn relayed_pushes_carry_their_payload_ttl_urgency_and_topic() {
        use crate::channel::relayed::RelayPriority;
        let s = setup().await;
        let sub = s.mock.subscribe();
        let keys = WebPushKeys::parse(&sub.p256dh, &sub.auth).unwrap();
        let payload = serde_json::json!({"v": 1, "type": "message", "collapse_id": "c1", "mls_message": "QUJD"});
        let push = RelayedPush {
            token: &sub.endpoint,
            app_id: None,
            sandbox: false,
            collapse_id: Some("c1"),
            priority: RelayPriority::High,
            payload: payload.as_object().unwrap(),
            ttl: Duration::from_secs(3600),
            web_push_keys: Some(&keys),
        };
        assert_eq!(s.provider.send(Push::Relayed(push)).await, Ok(Outcome::Delivered));
        let r = &s.mock.wait_for(&sub.id, 1, Duration::from_secs(5)).await[0];
        assert_eq!(r.json(), Some(payload.clone()));
        assert_eq!((r.header("ttl"), r.header("urgency")), (Some("3600"), Some("high")));
        assert_eq!(r.header("topic"), Some(topic_for("c1").as_str()));
        // Without §1's keys it can never be delivered.
        let keyless = RelayedPush { web_push_keys: None, ..push };
        assert_eq!(s.provider.send(Push::Relayed(keyless)).await, Ok(Outcome::Rejected));
    }

    #[tokio::test]
    async fn a_refused_token_is_signed_again() {
        let s = setup().await;
        let sub = s.mock.subscribe();
        s.mock.script(&sub.id, vec![WebPushReply::status(403)]);
        assert_eq!(send(&s, &sub, 1).await, Outcome::Rejected);
        assert_eq!(send(&s, &sub, 2).await, Outcome::Delivered);
        let got = s.mock.wait_for(&sub.id, 2, Duration::from_secs(5)).await;
        assert_ne!(got[0].header("authorization"), got[1].header("authorization"));
    }

    #[tokio::test]
    async fn endpoints_pass_the_webhook_destination_rules() {
        let pki = TestPki::generate(&[]).unwrap();
        let key = VapidTestKey::generate();
        let mock = mock::start(&pki, None).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let strict = WebPushProvider::new(&settings(&dir, &key, &pki, false), &no_dns()).unwrap();
        let sub = mock.subscribe();
        let refused = |rule: &str| Err(Refused::Invalid(rule.to_owned()));
        assert_eq!(
            strict.admit(&target(&sub)).await,
            refused("webpush endpoint host does not resolve to an allowed address")
        );
        // The syntactic rules hold when the endpoint is parsed (at
        // registration), in the channel's words.
        let plain = sub.endpoint.replace("https:", "http:");
        let e = WebhookUrl::parse(&plain).unwrap_err();
        assert_eq!(e.describe("webpush endpoint"), "webpush endpoint must use https");
        // At send too (the rules may have changed since registration): nothing leaves.
        let recipient = testing::recipient(target(&sub));
        let envelope = testing::envelope(1);
        assert_eq!(
            strict.send(Push::Envelope { recipient: &recipient, envelope: &envelope }).await,
            Ok(Outcome::Rejected)
        );
        assert!(mock.received().is_empty());
    }

    #[test]
    fn bad_vapid_keys_fail_at_start() {
        let pki = TestPki::generate(&[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(&dir, &VapidTestKey::generate(), &pki, true);
        std::fs::write(&s.vapid_key_file, "not a key").unwrap();
        let err = WebPushProvider::new(&s, &no_dns()).err().unwrap();
        assert_eq!(err.key, "engine.channels.webpush.vapid_key_file");
        assert!(err.message.contains("holds no PEM private key"), "{}", err.message);
        s.vapid_key_file = dir.path().join("missing.pem");
        let err = WebPushProvider::new(&s, &no_dns()).err().unwrap();
        assert!(err.message.contains("cannot read"), "{}", err.message);
    }
}
