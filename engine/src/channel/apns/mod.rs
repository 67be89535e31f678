//! The APNs channel (spec 000 section 7): token-based authentication (an
//! ES256 provider token), HTTP/2 POSTs to `/3/device/<token>` on the host of
//! the configured environment, and the APNs row of the outcome table.

mod classify;
mod request;
mod settings;
mod token;

use std::time::Duration;

use async_trait::async_trait;
use http::HeaderValue;
use jsonwebtoken::EncodingKey;

use self::classify::{CONNECTION_ERROR, Classified, RETRY_DELAY, TIMED_OUT, classify, reason};
use self::request::{ApnsRequest, relayed_apns_body};
use self::token::{ProviderToken, ProviderTokens};
use crate::channel::common::PushLifetime;
use crate::channel::outcome::{Answer, Outcome, Sent};
use crate::channel::provider::{BuildError, ChannelContext, Provider, Push};
use crate::channel::relayed::Refusal;
use crate::domain::{Channel, DeliveryTarget};
use crate::transport::client_tls_config;
use crate::transport::pool::{
    ClientOptions, Pool, PoolMetrics, PoolOptions, Protocols, Resolver, SendError, unix_now_secs,
};

pub use request::apns_body;
pub use settings::{ApnsEnvironment, ApnsSettings, AsciiId, DEFAULT_PRODUCTION_URL, DEFAULT_SANDBOX_URL};

/// APNs prefers long-lived connections: idle ones are kept this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

pub struct ApnsProvider {
    pool: Pool,
    /// The environment's base URL without a trailing slash.
    base: String,
    /// Both hosts, for relayed pushes (spec 003), whose registration's
    /// `sandbox` picks the host per push. One pool serves both: the HTTP/2
    /// client keeps a connection per host.
    production: String,
    sandbox: String,
    bundle_id: HeaderValue,
    tokens: ProviderTokens,
    /// `apns-expiration` of spec 000 pushes (`expiration_seconds`).
    lifetime: PushLifetime,
}

impl ApnsProvider {
    /// Reads the key file and builds the client. Fails on an unreadable file,
    /// a key that is not a PKCS#8 EC P-256 key, or a bad CA file.
    pub fn new(settings: &ApnsSettings, ctx: &ChannelContext) -> Result<Self, BuildError> {
        const KEY_FILE: &str = "engine.channels.apns.key_file";
        let path = settings.key_file.display();
        let pem = std::fs::read(&settings.key_file)
            .map_err(|e| BuildError::new(KEY_FILE, format!("cannot read {path}: {e}")))?;
        let key = EncodingKey::from_ec_pem(&pem)
            .map_err(|_| BuildError::new(KEY_FILE, format!("{path} is not a PEM PKCS#8 EC key")))?;
        let tls = client_tls_config(&settings.extra_ca_files)
            .map_err(|e| BuildError::new("engine.channels.apns.extra_ca_files", e))?;
        let pool = Pool::new(
            &tls,
            PoolOptions {
                connections: settings.connections,
                max_in_flight: settings.max_in_flight,
                rate_limit_per_second: settings.rate_limit_per_second,
                client: ClientOptions { protocols: Protocols::Http2, idle_timeout: IDLE_TIMEOUT },
            },
            ctx.dialer(Channel::Apns, Resolver::system()),
            PoolMetrics::new(&ctx.metrics, Channel::Apns),
        );
        let bundle_id = HeaderValue::try_from(settings.bundle_id.as_str())
            .map_err(|_| BuildError::new("engine.channels.apns.bundle_id", "not a valid header value"))?;
        let tokens = ProviderTokens::new(key, settings.key_id.to_string(), settings.team_id.to_string(), &ctx.metrics);
        // Sign once now, so a key of the wrong curve fails at start and not
        // at the first push. Not cached: the first push signs its own.
        tokens.sign(0).map_err(|_| BuildError::new(KEY_FILE, format!("{path} is not an EC P-256 key")))?;
        let base = settings.base_url().without_trailing_slash().to_owned();
        let production = settings.production_url.without_trailing_slash().to_owned();
        let sandbox = settings.sandbox_url.without_trailing_slash().to_owned();
        Ok(Self { pool, base, production, sandbox, bundle_id, tokens, lifetime: settings.expiration_seconds })
    }

    /// One request, its classification and APNs's answer.
    async fn post(&self, request: &ApnsRequest, token: &ProviderToken) -> (Classified, Option<Answer>) {
        let Some(request) = request.build(token, &self.bundle_id) else {
            return (Classified::Outcome(Outcome::Rejected), None);
        };
        match self.pool.send(request).await {
            Ok(answer) => {
                let reason = if answer.status == http::StatusCode::OK { None } else { reason(&answer.body) };
                let status = answer.status.as_u16();
                (classify(status, reason.as_deref()), Some(Answer::with_reason(status, reason.as_deref())))
            }
            Err(SendError::Timeout) => (Classified::Outcome(TIMED_OUT), None),
            Err(SendError::Connection(_)) => (Classified::Outcome(CONNECTION_ERROR), None),
        }
    }

    /// One attempt: a request under the current provider token, and after
    /// ExpiredProviderToken one refresh and resend, then the table decides.
    async fn attempt(&self, request: &ApnsRequest) -> Sent {
        let Some(token) = self.tokens.get() else {
            // Signing failed locally: nothing was sent.
            return Outcome::NotSent { delay: RETRY_DELAY }.into();
        };
        match self.post(request, &token).await {
            (Classified::Outcome(outcome), answer) => Sent { outcome, answer },
            (Classified::ExpiredProviderToken, answer) => {
                // One refresh and resend within the same attempt, then rejected.
                let Some(fresh) = self.tokens.refresh_after_expired(&token) else {
                    return Sent { outcome: Outcome::Rejected, answer };
                };
                match self.post(request, &fresh).await {
                    (Classified::Outcome(outcome), answer) => Sent { outcome, answer },
                    (Classified::ExpiredProviderToken, answer) => {
                        tracing::warn!("APNs answered ExpiredProviderToken to a refreshed provider token");
                        Sent { outcome: Outcome::Rejected, answer }
                    }
                }
            }
        }
    }
}

#[async_trait]
impl Provider for ApnsProvider {
    fn channel(&self) -> Channel {
        Channel::Apns
    }

    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        self.send_answered(push).await.map(|sent| sent.outcome)
    }

    async fn send_answered(&self, push: Push<'_>) -> Result<Sent, Refusal> {
        let request = match push {
            Push::Envelope { recipient, envelope } => {
                let DeliveryTarget::Apns { token: device } = &recipient.target else {
                    return Ok(Outcome::Rejected.into());
                };
                let expires_at = self.lifetime.expires_at(unix_now_secs());
                ApnsRequest::new(&self.base, device, envelope, expires_at)
            }
            Push::Relayed(push) => {
                let body = relayed_apns_body(push.payload)?;
                let base = if push.sandbox { &self.sandbox } else { &self.production };
                ApnsRequest::relayed(base, &push, body.body, unix_now_secs())
            }
        };
        match request {
            Some(request) => Ok(self.attempt(&request).await),
            None => Ok(Outcome::Rejected.into()),
        }
    }

    fn timed_out(&self) -> Outcome {
        TIMED_OUT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::relayed::RelayedPush;
    use std::num::NonZeroUsize;
    use std::sync::Arc;
    use std::time::Instant;

    use crate::channel::collapse::fit_collapse_id;
    use crate::channel::common::{Connections, HttpsBase};
    use crate::domain::Recipient;
    use crate::domain::StoredEnvelope;
    use crate::metrics::Metrics;
    use crate::testing::{self, envelope};
    use fanout_testkit::TestPki;
    use fanout_testkit::mock::apns::{self as mock, ApnsReply, ApnsTestKey, MockApnsConfig};

    const T: Duration = Duration::from_secs(5);

    struct Setup {
        mock: mock::MockApns,
        provider: ApnsProvider,
        metrics: Arc<Metrics>,
        _dir: tempfile::TempDir,
    }

    async fn setup(environment: ApnsEnvironment) -> Setup {
        setup_with(environment, Duration::ZERO, 8, 0).await
    }

    async fn setup_with(environment: ApnsEnvironment, latency: Duration, max_in_flight: usize, rate: u32) -> Setup {
        let pki = TestPki::generate(&[]).unwrap();
        let key = ApnsTestKey::generate().unwrap();
        let mock = mock::start(
            &pki,
            MockApnsConfig {
                team_id: "TEAM123456".into(),
                key_id: "KEY1234567".into(),
                public_key_pem: Some(key.public_pem.clone()),
                latency,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("key.p8");
        key.write_p8(&key_file).unwrap();
        let ca = dir.path().join("ca.pem");
        pki.write_ca(&ca).unwrap();
        let (answering, silent) =
            (HttpsBase::parse(&mock.base_url()).unwrap(), HttpsBase::parse("https://127.0.0.1:9").unwrap());
        let settings = ApnsSettings {
            key_file,
            key_id: "KEY1234567".try_into().unwrap(),
            team_id: "TEAM123456".try_into().unwrap(),
            bundle_id: "com.example.app".try_into().unwrap(),
            environment,
            // Only the configured environment's host answers.
            production_url: if environment == ApnsEnvironment::Production { answering.clone() } else { silent.clone() },
            sandbox_url: if environment == ApnsEnvironment::Sandbox { answering } else { silent },
            extra_ca_files: vec![ca],
            max_in_flight: NonZeroUsize::new(max_in_flight).unwrap(),
            connections: Connections::new(2).unwrap(),
            rate_limit_per_second: rate,
            expiration_seconds: PushLifetime::new(3600).unwrap(),
        };
        let metrics = Arc::new(Metrics::new());
        let provider = ApnsProvider::new(&settings, &ChannelContext::new(metrics.clone())).unwrap();
        Setup { mock, provider, metrics, _dir: dir }
    }

    fn recipient(token: &str) -> Recipient {
        testing::recipient(DeliveryTarget::Apns { token: token.into() })
    }

    async fn send(s: &Setup, token: &str) -> Outcome {
        let r = recipient(token);
        let e = envelope(42);
        s.provider.send(Push::Envelope { recipient: &r, envelope: &e }).await.unwrap()
    }

    fn refreshes(m: &Metrics) -> u64 {
        m.provider_token_refreshes.with_label_values(&["apns"]).get()
    }

    #[tokio::test]
    async fn a_built_channel_has_its_credential_and_pool_series_at_zero() {
        let s = setup(ApnsEnvironment::Sandbox).await;
        let exposed = s.metrics.render();
        crate::metrics::assert_exposed(
            &exposed,
            &[
                r#"fanout_provider_token_refreshes_total{channel="apns"} 0"#,
                r#"fanout_provider_token_failures_total{channel="apns"} 0"#,
                r#"fanout_provider_connections_opened_total{channel="apns"} 0"#,
                r#"fanout_provider_waiting_sends{channel="apns"} 0"#,
            ],
        );
        assert!(!exposed.contains(r#"channel="fcm""#), "{exposed}");
    }

    #[tokio::test]
    async fn sends_the_section_7_request_over_http2() {
        for environment in [ApnsEnvironment::Sandbox, ApnsEnvironment::Production] {
            let s = setup(environment).await;
            assert_eq!(send(&s, "00aa11bb").await, Outcome::Delivered);
            let got = s.mock.wait_for(1, T).await;
            assert_eq!(got.len(), 1);
            let r = &got[0];
            assert_eq!(r.method, "POST");
            assert_eq!(r.path, "/3/device/00aa11bb");
            assert_eq!(r.token, "00aa11bb");
            assert_eq!(r.version, "HTTP/2.0");
            assert_eq!(r.auth_valid, Some(true));
            assert!(r.header("authorization").unwrap().starts_with("bearer "));
            assert_eq!(r.header("apns-topic"), Some("com.example.app"));
            assert_eq!(r.header("apns-push-type"), Some("background"));
            assert_eq!(r.header("apns-priority"), Some("5"));
            assert_eq!(r.header("apns-collapse-id"), Some("AAECAw=="));
            // `apns-expiration` is explicit: `expiration_seconds` (3600 here) from now.
            let expiration: u64 = r.header("apns-expiration").unwrap().parse().unwrap();
            let now = unix_now_secs();
            assert!((now + 3590..=now + 3600).contains(&expiration), "{expiration} vs now {now}");
            assert_eq!(r.body, r#"{"aps":{"content-available":1},"topic":"AAECAw==","sequence_id":"42"}"#.as_bytes());
        }
    }

    /// Deviation from PUSH-259: a topic with a 64-byte identifier (base64 of
    /// 88 bytes) is delivered under a 45-byte stand-in collapse id, the same for each of
    /// its pushes; the mock refuses collapse ids over 64 bytes as APNs does.
    #[tokio::test]
    async fn long_topics_get_a_collapse_id_apns_accepts() {
        let s = setup(ApnsEnvironment::Sandbox).await;
        let mut topic = vec![0x00];
        topic.extend((0..64u8).map(|i| i.wrapping_mul(7)));
        let r = recipient("long");
        for seq in [1, 2] {
            let e = StoredEnvelope { topic: crate::domain::Topic::parse(&topic).unwrap(), ..envelope(seq) };
            assert_eq!(s.provider.send(Push::Envelope { recipient: &r, envelope: &e }).await, Ok(Outcome::Delivered));
        }
        let got = s.mock.wait_for(2, T).await;
        let ids: Vec<&str> = got.iter().map(|r| r.header("apns-collapse-id").unwrap()).collect();
        let spec = crate::domain::Topic::parse(&topic).unwrap().to_base64();
        assert_eq!(ids[0], fit_collapse_id(&spec));
        assert_eq!((ids[0].len(), ids[0] == ids[1]), (45, true));
        assert!(got[0].body.starts_with(format!(r#"{{"aps":{{"content-available":1}},"topic":"{spec}""#).as_bytes()));
    }

    #[tokio::test]
    async fn answers_are_classified_by_the_table() {
        let s = setup(ApnsEnvironment::Sandbox).await;
        let cases = [
            ("t410u", ApnsReply::reason(410, "Unregistered"), Outcome::Terminal),
            ("t410e", ApnsReply::reason(410, "ExpiredToken"), Outcome::Terminal),
            ("t400b", ApnsReply::reason(400, "BadDeviceToken"), Outcome::Mismatch),
            ("t400t", ApnsReply::reason(400, "DeviceTokenNotForTopic"), Outcome::Mismatch),
            ("t400x", ApnsReply::reason(400, "BadCollapseId"), Outcome::Rejected),
            ("t429", ApnsReply::reason(429, "TooManyRequests"), Outcome::transient(RETRY_DELAY)),
            ("t500", ApnsReply::reason(500, "InternalServerError"), Outcome::transient(RETRY_DELAY)),
            ("t503", ApnsReply::reason(503, "ServiceUnavailable"), Outcome::transient(RETRY_DELAY)),
            ("t403", ApnsReply::reason(403, "InvalidProviderToken"), Outcome::Rejected),
            ("t413", ApnsReply::reason(413, "PayloadTooLarge"), Outcome::Rejected),
        ];
        for (token, reply, expected) in cases {
            s.mock.script(token, vec![reply]);
            assert_eq!(send(&s, token).await, expected, "{token}");
        }
        // A device token that is not a path segment is encoded, not interpreted.
        assert_eq!(send(&s, "../x?y").await, Outcome::Delivered);
        assert_eq!(s.mock.received().last().unwrap().path, "/3/device/..%2Fx%3Fy");
        // One provider token served all of them.
        assert_eq!(refreshes(&s.metrics), 1);
    }

    async fn relay(
        s: &Setup,
        token: &str,
        sandbox: bool,
        app_id: Option<&str>,
        payload: &serde_json::Value,
    ) -> Outcome {
        let push = RelayedPush {
            token,
            app_id,
            sandbox,
            collapse_id: Some("b76b4f49cf0d311f53af81576f61d459"),
            priority: crate::channel::relayed::RelayPriority::High,
            payload: payload.as_object().unwrap(),
            ttl: Duration::from_secs(86_400),
            web_push_keys: None,
        };
        s.provider.send(Push::Relayed(push)).await.unwrap()
    }

    /// Spec 003 ingress: the registration's `sandbox` picks the host per push,
    /// `app_id` is the topic, the collapse id and payload go through, and a
    /// background push keeps priority 5.
    #[tokio::test]
    async fn relayed_pushes_pick_the_host_and_topic_per_push() {
        let payload = serde_json::json!({"v": 1, "type": "wake", "collapse_id": "b76b4f49cf0d311f53af81576f61d459"});
        // Only the sandbox host answers in this setup.
        let s = setup(ApnsEnvironment::Sandbox).await;
        assert_eq!(relay(&s, "dev1", true, Some("im.g.apps"), &payload).await, Outcome::Delivered);
        let got = s.mock.wait_for(1, T).await;
        let r = &got[0];
        assert_eq!(r.path, "/3/device/dev1");
        assert_eq!(r.header("apns-topic"), Some("im.g.apps"));
        assert_eq!(r.header("apns-collapse-id"), Some("b76b4f49cf0d311f53af81576f61d459"));
        assert_eq!((r.header("apns-push-type"), r.header("apns-priority")), (Some("background"), Some("5")));
        assert!(r.header("apns-expiration").unwrap().parse::<u64>().unwrap() > 1_700_000_000);
        let body = r.json().unwrap();
        assert_eq!(body, serde_json::json!({"aps": {"content-available": 1}, "payload": payload}));
        // Without app_id: the channel's bundle id.
        assert_eq!(relay(&s, "dev2", true, None, &payload).await, Outcome::Delivered);
        assert_eq!(s.mock.wait_for(2, T).await[1].header("apns-topic"), Some("com.example.app"));
        // sandbox = false goes to the production host, which does not answer here.
        assert_eq!(relay(&s, "dev3", false, None, &payload).await, Outcome::transient(RETRY_DELAY));
        assert_eq!(s.mock.received_count(), 2);
        // The table applies: a dead token is terminal.
        s.mock.script("dead", vec![ApnsReply::reason(410, "Unregistered")]);
        assert_eq!(relay(&s, "dead", true, None, &payload).await, Outcome::Terminal);
        // A collapse id over 64 bytes gets its stand-in instead of BadCollapseId.
        let long = "m".repeat(80);
        let push = RelayedPush {
            token: "dev4",
            app_id: None,
            sandbox: true,
            collapse_id: Some(&long),
            priority: crate::channel::relayed::RelayPriority::Normal,
            payload: payload.as_object().unwrap(),
            ttl: Duration::from_secs(60),
            web_push_keys: None,
        };
        assert_eq!(s.provider.send(Push::Relayed(push)).await.unwrap(), Outcome::Delivered);
        let r = s.mock.received_for("dev4").pop().unwrap();
        assert_eq!(r.header("apns-collapse-id"), Some(fit_collapse_id(&long).as_ref()));
        let expiration: u64 = r.header("apns-expiration").unwrap().parse().unwrap();
        assert!((unix_now_secs() + 50..=unix_now_secs() + 60).contains(&expiration), "the relayed ttl: {expiration}");
    }

    #[tokio::test]
    async fn connection_errors_are_transient() {
        let s = setup(ApnsEnvironment::Sandbox).await;
        s.mock.shutdown_now();
        assert_eq!(send(&s, "abcd").await, Outcome::transient(RETRY_DELAY));
    }

    #[tokio::test]
    async fn expired_provider_token_refreshes_once_and_resends() {
        let s = setup(ApnsEnvironment::Sandbox).await;
        s.mock.script("dev1", vec![ApnsReply::reason(403, "ExpiredProviderToken")]);
        assert_eq!(send(&s, "dev1").await, Outcome::Delivered);
        let got = s.mock.received();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].status_sent, 403);
        assert_eq!(got[1].status_sent, 200);
        assert!(got.iter().all(|r| r.auth_valid == Some(true)));
        assert_ne!(got[0].header("authorization"), got[1].header("authorization"));
        assert_eq!(refreshes(&s.metrics), 2);

        // The refreshed token is kept for later sends.
        assert_eq!(send(&s, "dev2").await, Outcome::Delivered);
        assert_eq!(s.mock.received()[2].header("authorization"), got[1].header("authorization"));

        // Twice in a row: rejected after the one resend.
        s.mock.script("dev3", vec![ApnsReply::reason(403, "ExpiredProviderToken"); 2]);
        assert_eq!(send(&s, "dev3").await, Outcome::Rejected);
        assert_eq!(s.mock.received().len(), 5);
        assert_eq!(refreshes(&s.metrics), 3);

        // The resend's answer is classified by the table.
        s.mock.script(
            "dev4",
            vec![ApnsReply::reason(403, "ExpiredProviderToken"), ApnsReply::reason(410, "Unregistered")],
        );
        assert_eq!(send(&s, "dev4").await, Outcome::Terminal);
    }

    #[tokio::test]
    async fn expired_tokens_in_flight_refresh_only_once() {
        let s = setup(ApnsEnvironment::Sandbox).await;
        assert_eq!(send(&s, "warm").await, Outcome::Delivered);
        // Every token seen so far is now expired; many sends race on it.
        s.mock.expire_provider_tokens();
        let sends = (0..6).map(|i| {
            let token = format!("dev{i}");
            let s = &s;
            async move { send(s, &token).await }
        });
        let outcomes = futures::future::join_all(sends).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Delivered), "{outcomes:?}");
        assert_eq!(refreshes(&s.metrics), 2, "one forced refresh for all of them");
    }

    async fn send_concurrently(s: &Setup, n: usize) -> Duration {
        let started = Instant::now();
        let outcomes = futures::future::join_all((0..n).map(|i| {
            let token = format!("c{i}");
            async move { send(s, &token).await }
        }))
        .await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Delivered), "{outcomes:?}");
        started.elapsed()
    }

    #[tokio::test]
    async fn in_flight_bound_makes_sends_wait() {
        // One slot, 200 ms per answer: four sends take at least 800 ms.
        let s = setup_with(ApnsEnvironment::Sandbox, Duration::from_millis(200), 1, 0).await;
        let took = send_concurrently(&s, 4).await;
        assert!(took >= Duration::from_millis(790), "{took:?}");
        // Eight slots: the same four overlap.
        let s = setup_with(ApnsEnvironment::Sandbox, Duration::from_millis(200), 8, 0).await;
        send(&s, "warm").await; // connect and sign outside the measurement
        let took = send_concurrently(&s, 4).await;
        assert!(took < Duration::from_millis(750), "{took:?}");
    }

    #[tokio::test]
    async fn rate_limit_spaces_sends() {
        // 4 per second with a burst of 4: the 9th send waits about a second.
        let s = setup_with(ApnsEnvironment::Sandbox, Duration::ZERO, 100, 4).await;
        let took = send_concurrently(&s, 9).await;
        assert!(took >= Duration::from_millis(900), "{took:?}");
        assert_eq!(s.mock.received_count(), 9);
    }

    #[test]
    fn bad_keys_fail_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("key.p8");
        let settings = ApnsSettings {
            key_file: key_file.clone(),
            key_id: "K".try_into().unwrap(),
            team_id: "T".try_into().unwrap(),
            bundle_id: "b".try_into().unwrap(),
            environment: ApnsEnvironment::Sandbox,
            production_url: HttpsBase::parse(DEFAULT_PRODUCTION_URL).unwrap(),
            sandbox_url: HttpsBase::parse(DEFAULT_SANDBOX_URL).unwrap(),
            extra_ca_files: vec![],
            max_in_flight: NonZeroUsize::MIN,
            connections: Connections::new(1).unwrap(),
            rate_limit_per_second: 0,
            expiration_seconds: PushLifetime::DEFAULT,
        };
        let metrics = Arc::new(Metrics::new());
        let missing = ApnsProvider::new(&settings, &ChannelContext::new(metrics.clone())).err().unwrap().to_string();
        assert!(missing.contains("cannot read"), "{missing}");
        std::fs::write(&key_file, "not a key").unwrap();
        let garbage = ApnsProvider::new(&settings, &ChannelContext::new(metrics.clone())).err().unwrap().to_string();
        assert!(garbage.contains("not a PEM PKCS#8 EC key"), "{garbage}");
        // A P-384 key is EC but not ES256.
        let p384 = rcgen_p384();
        std::fs::write(&key_file, p384).unwrap();
        let wrong_curve =
            ApnsProvider::new(&settings, &ChannelContext::new(metrics.clone())).err().unwrap().to_string();
        assert!(wrong_curve.contains("P-256"), "{wrong_curve}");
        // A good key works, and the start-up check caches nothing.
        ApnsTestKey::generate().unwrap().write_p8(&key_file).unwrap();
        let provider = ApnsProvider::new(&settings, &ChannelContext::new(metrics.clone())).unwrap();
        assert!(provider.tokens.current.lock().unwrap().is_none());
        assert_eq!(refreshes(&metrics), 0);
    }

    fn rcgen_p384() -> String {
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap().serialize_pem()
    }
}
