//! The APNs channel (spec 000 section 7): token-based authentication (an
//! ES256 provider token), HTTP/2 POSTs to `/3/device/<token>` on the host of
//! the configured environment, and the APNs row of the outcome table.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderValue, Request, Uri};
use http_body_util::Full;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

use super::http2::{H2Pool, PoolMetrics, PoolOptions, encode_path_segment, unix_now_secs};
use super::{Outcome, Provider, Push, client_tls_config};
use crate::domain::{Channel, DeliveryTarget, StoredEnvelope};
use crate::metrics::Metrics;
use crate::settings::ApnsSettings;

/// Section 7, APNs row: 429, 500, 503, timeout, connection error.
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// APNs accepts a provider token for an hour; refresh well before.
const TOKEN_REFRESH_AFTER: Duration = Duration::from_secs(50 * 60);
/// APNs answers TooManyProviderTokenUpdates to tokens replaced more often
/// than this; only the forced refresh after ExpiredProviderToken may.
const MIN_TOKEN_REFRESH_INTERVAL: Duration = Duration::from_secs(20 * 60);
const _: () = assert!(TOKEN_REFRESH_AFTER.as_secs() >= MIN_TOKEN_REFRESH_INTERVAL.as_secs());

/// The APNs push body (PUSH-259): a background push carrying only the topic
/// (standard base64) and the sequence id (decimal text). The values hold only
/// base64 characters and digits, so nothing needs escaping.
pub fn apns_body(envelope: &StoredEnvelope) -> String {
    format!(
        r#"{{"aps":{{"content-available":1}},"topic":"{}","sequence_id":"{}"}}"#,
        envelope.topic.to_base64(),
        envelope.sequence_id
    )
}

#[derive(Serialize)]
struct ProviderClaims<'a> {
    iss: &'a str,
    iat: u64,
}

/// One signed provider token.
struct ProviderToken {
    /// `bearer <jwt>`, marked sensitive so it is never printed.
    authorization: HeaderValue,
    issued: Instant,
    generation: u64,
}

/// The cached provider token: signed on first use, replaced after
/// `TOKEN_REFRESH_AFTER`, or at once when APNs answered ExpiredProviderToken
/// to the current one.
struct ProviderTokens {
    key: EncodingKey,
    key_id: String,
    team_id: String,
    current: Mutex<Option<Arc<ProviderToken>>>,
    metrics: Arc<Metrics>,
}

impl ProviderTokens {
    fn sign(&self, generation: u64) -> Result<ProviderToken, jsonwebtoken::errors::Error> {
        let mut header = Header::new(Algorithm::ES256);
        header.typ = None;
        header.kid = Some(self.key_id.clone());
        let claims = ProviderClaims { iss: &self.team_id, iat: unix_now_secs() };
        let jwt = jsonwebtoken::encode(&header, &claims, &self.key)?;
        let mut authorization = HeaderValue::try_from(format!("bearer {jwt}"))
            .map_err(|_| jsonwebtoken::errors::ErrorKind::InvalidToken)?;
        authorization.set_sensitive(true);
        Ok(ProviderToken { authorization, issued: Instant::now(), generation })
    }

    /// Replaces the current token; counts the refresh or the failure.
    fn replace(&self, current: &mut Option<Arc<ProviderToken>>) -> Option<Arc<ProviderToken>> {
        let generation = current.as_ref().map_or(0, |t| t.generation + 1);
        match self.sign(generation) {
            Ok(token) => {
                self.metrics.provider_token_refreshes.with_label_values(&["apns"]).inc();
                let token = Arc::new(token);
                *current = Some(token.clone());
                Some(token)
            }
            Err(e) => {
                self.metrics.provider_token_failures.with_label_values(&["apns"]).inc();
                tracing::warn!(error = %e, "cannot sign an APNs provider token");
                None
            }
        }
    }

    /// The token to send with, refreshed when it is due.
    fn get(&self) -> Option<Arc<ProviderToken>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match current.as_ref() {
            Some(token) if token.issued.elapsed() < TOKEN_REFRESH_AFTER => Some(token.clone()),
            _ => self.replace(&mut current),
        }
    }

    /// After ExpiredProviderToken for `used`: a new token, unless another
    /// attempt already replaced `used` (one refresh for many such answers).
    fn refresh_after_expired(&self, used: &ProviderToken) -> Option<Arc<ProviderToken>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match current.as_ref() {
            Some(token) if token.generation != used.generation => Some(token.clone()),
            _ => self.replace(&mut current),
        }
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    reason: Option<String>,
}

/// What one request's answer means, before the refresh rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Classified {
    Outcome(Outcome),
    /// 403 ExpiredProviderToken: refresh the token and resend once.
    ExpiredProviderToken,
}

/// The APNs row of the outcome table, first match wins.
fn classify(status: u16, reason: Option<&str>) -> Classified {
    let outcome = match (status, reason) {
        (200, _) => Outcome::Delivered,
        (410, Some("Unregistered" | "ExpiredToken")) => Outcome::Terminal,
        (400, Some("BadDeviceToken" | "DeviceTokenNotForTopic")) => Outcome::Mismatch,
        (429 | 500 | 503, _) => Outcome::transient(RETRY_DELAY),
        (403, Some("ExpiredProviderToken")) => return Classified::ExpiredProviderToken,
        _ => Outcome::Rejected,
    };
    Classified::Outcome(outcome)
}

/// The reason of an APNs error body, `{"reason":"..."}`.
fn reason(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<ErrorBody>(body).ok().and_then(|b| b.reason)
}

pub struct ApnsProvider {
    pool: H2Pool,
    /// The environment's base URL without a trailing slash.
    base: String,
    bundle_id: HeaderValue,
    tokens: ProviderTokens,
}

impl ApnsProvider {
    /// Reads the key file and builds the client. Fails on an unreadable file,
    /// a key that is not a PKCS#8 EC P-256 key, or a bad CA file.
    pub fn from_settings(settings: &ApnsSettings, metrics: Arc<Metrics>) -> Result<Self, String> {
        settings.validate().map_err(|e| format!("channels.apns.{e}"))?;
        let pem = std::fs::read(&settings.key_file)
            .map_err(|e| format!("channels.apns.key_file: cannot read {}: {e}", settings.key_file.display()))?;
        let key = EncodingKey::from_ec_pem(&pem).map_err(|_| {
            format!("channels.apns.key_file: {} is not a PEM PKCS#8 EC key", settings.key_file.display())
        })?;
        let tls =
            client_tls_config(&settings.extra_ca_files).map_err(|e| format!("channels.apns.extra_ca_files: {e}"))?;
        let pool = H2Pool::new(
            &tls,
            PoolOptions {
                connections: settings.connections,
                max_in_flight: settings.max_in_flight,
                rate_limit_per_second: settings.rate_limit_per_second,
            },
            Some(PoolMetrics::new(&metrics, "apns")),
        );
        let bundle_id = HeaderValue::try_from(settings.bundle_id.as_str())
            .map_err(|_| "channels.apns.bundle_id is not a valid header value".to_string())?;
        let tokens = ProviderTokens {
            key,
            key_id: settings.key_id.clone(),
            team_id: settings.team_id.clone(),
            current: Mutex::new(None),
            metrics,
        };
        // Sign once now, so a key of the wrong curve fails at start and not
        // at the first push. Not cached: the first push signs its own.
        tokens
            .sign(0)
            .map_err(|_| format!("channels.apns.key_file: {} is not an EC P-256 key", settings.key_file.display()))?;
        let base = settings.base_url().trim_end_matches('/').to_string();
        Ok(Self { pool, base, bundle_id, tokens })
    }

    fn request(
        &self,
        uri: &Uri,
        token: &ProviderToken,
        collapse_id: &HeaderValue,
        body: Bytes,
    ) -> Option<Request<Full<Bytes>>> {
        Request::post(uri.clone())
            .header(http::header::AUTHORIZATION, token.authorization.clone())
            .header("apns-topic", self.bundle_id.clone())
            .header("apns-push-type", "background")
            .header("apns-priority", "5")
            .header("apns-collapse-id", collapse_id.clone())
            .body(Full::new(body))
            .ok()
    }

    /// One request and its classification.
    async fn post(&self, uri: &Uri, token: &ProviderToken, collapse_id: &HeaderValue, body: Bytes) -> Classified {
        let Some(request) = self.request(uri, token, collapse_id, body) else {
            return Classified::Outcome(Outcome::Rejected);
        };
        match self.pool.send(request).await {
            Ok(answer) => {
                let reason = if answer.status == http::StatusCode::OK { None } else { reason(&answer.body) };
                classify(answer.status.as_u16(), reason.as_deref())
            }
            // Connection errors are transient per the table.
            Err(_) => Classified::Outcome(Outcome::transient(RETRY_DELAY)),
        }
    }
}

#[async_trait]
impl Provider for ApnsProvider {
    fn channel(&self) -> Channel {
        Channel::Apns
    }

    async fn send(&self, push: Push<'_>) -> Outcome {
        let DeliveryTarget::Apns { token: device } = &push.recipient.target else {
            return Outcome::Rejected;
        };
        let Ok(uri) = format!("{}/3/device/{}", self.base, encode_path_segment(device)).parse::<Uri>() else {
            return Outcome::Rejected;
        };
        let Ok(collapse_id) = HeaderValue::try_from(push.envelope.topic.to_base64()) else {
            return Outcome::Rejected;
        };
        let body = Bytes::from(apns_body(push.envelope));
        let Some(token) = self.tokens.get() else {
            return Outcome::transient(RETRY_DELAY);
        };
        match self.post(&uri, &token, &collapse_id, body.clone()).await {
            Classified::Outcome(outcome) => outcome,
            Classified::ExpiredProviderToken => {
                // One refresh and resend within the same attempt, then rejected.
                let Some(fresh) = self.tokens.refresh_after_expired(&token) else {
                    return Outcome::Rejected;
                };
                match self.post(&uri, &fresh, &collapse_id, body).await {
                    Classified::Outcome(outcome) => outcome,
                    Classified::ExpiredProviderToken => {
                        tracing::warn!("APNs answered ExpiredProviderToken to a refreshed provider token");
                        Outcome::Rejected
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EnvelopeKind, RecipientId, SecretHash, ShardId, Topic};
    use crate::settings::ApnsEnvironment;
    use crate::store::Recipient;
    use fanout_loadtest::TestPki;
    use fanout_loadtest::mock::apns::{self as mock, ApnsReply, ApnsTestKey, MockApnsConfig};

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn apns_outcome_table() {
        use Classified::ExpiredProviderToken as Expired;
        let o = Classified::Outcome;
        assert_eq!(classify(200, None), o(Outcome::Delivered));
        assert_eq!(classify(410, Some("Unregistered")), o(Outcome::Terminal));
        assert_eq!(classify(410, Some("ExpiredToken")), o(Outcome::Terminal));
        assert_eq!(classify(410, None), o(Outcome::Rejected));
        assert_eq!(classify(410, Some("Other")), o(Outcome::Rejected));
        assert_eq!(classify(400, Some("BadDeviceToken")), o(Outcome::Mismatch));
        assert_eq!(classify(400, Some("DeviceTokenNotForTopic")), o(Outcome::Mismatch));
        assert_eq!(classify(400, Some("BadCollapseId")), o(Outcome::Rejected));
        assert_eq!(classify(400, None), o(Outcome::Rejected));
        // Status decides for the transient row, whatever the reason.
        assert_eq!(classify(429, Some("TooManyRequests")), o(Outcome::transient(RETRY_DELAY)));
        assert_eq!(classify(500, None), o(Outcome::transient(RETRY_DELAY)));
        assert_eq!(classify(503, Some("ServiceUnavailable")), o(Outcome::transient(RETRY_DELAY)));
        assert_eq!(classify(403, Some("ExpiredProviderToken")), Expired);
        assert_eq!(classify(403, Some("InvalidProviderToken")), o(Outcome::Rejected));
        assert_eq!(classify(403, Some("TooManyProviderTokenUpdates")), o(Outcome::Rejected));
        // The reason only matters with its own status.
        assert_eq!(classify(400, Some("Unregistered")), o(Outcome::Rejected));
        assert_eq!(classify(410, Some("BadDeviceToken")), o(Outcome::Rejected));
        assert_eq!(classify(502, None), o(Outcome::Rejected));
        assert_eq!(classify(201, None), o(Outcome::Rejected));
        assert_eq!(classify(404, Some("BadPath")), o(Outcome::Rejected));
    }

    #[test]
    fn reasons_are_read_from_the_json_body() {
        assert_eq!(reason(br#"{"reason":"BadDeviceToken"}"#).as_deref(), Some("BadDeviceToken"));
        assert_eq!(reason(br#"{"reason":"Unregistered","timestamp":1700000000000}"#).as_deref(), Some("Unregistered"));
        assert_eq!(reason(b"not json"), None);
        assert_eq!(reason(b""), None);
    }

    fn envelope(sequence_id: u64) -> StoredEnvelope {
        StoredEnvelope {
            shard: ShardId(0),
            sequence_id,
            topic: Topic::parse(&[0, 1, 2, 3]).unwrap(),
            kind: EnvelopeKind::Application,
            server_ts_ns: 0,
            sender_hmac: vec![],
            data: b"secret payload".to_vec(),
        }
    }

    #[test]
    fn body_is_a_content_free_background_push() {
        let body = apns_body(&envelope(9_007_199_254_740_993));
        assert_eq!(body, r#"{"aps":{"content-available":1},"topic":"AAECAw==","sequence_id":"9007199254740993"}"#);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["aps"]["content-available"], 1);
    }

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
        let settings = ApnsSettings {
            key_file,
            key_id: "KEY1234567".into(),
            team_id: "TEAM123456".into(),
            bundle_id: "com.example.app".into(),
            environment,
            // Only the configured environment's host answers.
            production_url: if environment == ApnsEnvironment::Production {
                mock.base_url()
            } else {
                "https://127.0.0.1:9".into()
            },
            sandbox_url: if environment == ApnsEnvironment::Sandbox {
                mock.base_url()
            } else {
                "https://127.0.0.1:9".into()
            },
            extra_ca_files: vec![ca],
            max_in_flight,
            connections: 2,
            rate_limit_per_second: rate,
        };
        let metrics = Arc::new(Metrics::new());
        let provider = ApnsProvider::from_settings(&settings, metrics.clone()).unwrap();
        Setup { mock, provider, metrics, _dir: dir }
    }

    fn recipient(token: &str) -> Recipient {
        Recipient {
            id: RecipientId([1u8; 32]),
            secret_hash: SecretHash([2u8; 32]),
            target: DeliveryTarget::Apns { token: token.into() },
            renewed_at_ns: 0,
            topic_count: 1,
        }
    }

    async fn send(s: &Setup, token: &str) -> Outcome {
        let r = recipient(token);
        let e = envelope(42);
        s.provider.send(Push { recipient: &r, envelope: &e }).await
    }

    fn refreshes(m: &Metrics) -> u64 {
        m.provider_token_refreshes.with_label_values(&["apns"]).get()
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
            assert_eq!(r.body, r#"{"aps":{"content-available":1},"topic":"AAECAw==","sequence_id":"42"}"#.as_bytes());
        }
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
            key_id: "K".into(),
            team_id: "T".into(),
            bundle_id: "b".into(),
            environment: ApnsEnvironment::Sandbox,
            production_url: crate::settings::DEFAULT_APNS_PRODUCTION_URL.into(),
            sandbox_url: crate::settings::DEFAULT_APNS_SANDBOX_URL.into(),
            extra_ca_files: vec![],
            max_in_flight: 1,
            connections: 1,
            rate_limit_per_second: 0,
        };
        let metrics = Arc::new(Metrics::new());
        let missing = ApnsProvider::from_settings(&settings, metrics.clone()).err().unwrap();
        assert!(missing.contains("cannot read"), "{missing}");
        std::fs::write(&key_file, "not a key").unwrap();
        let garbage = ApnsProvider::from_settings(&settings, metrics.clone()).err().unwrap();
        assert!(garbage.contains("not a PEM PKCS#8 EC key"), "{garbage}");
        // A P-384 key is EC but not ES256.
        let p384 = rcgen_p384();
        std::fs::write(&key_file, p384).unwrap();
        let wrong_curve = ApnsProvider::from_settings(&settings, metrics.clone()).err().unwrap();
        assert!(wrong_curve.contains("P-256"), "{wrong_curve}");
        // A good key works, and the start-up check caches nothing.
        ApnsTestKey::generate().unwrap().write_p8(&key_file).unwrap();
        let provider = ApnsProvider::from_settings(&settings, metrics.clone()).unwrap();
        assert!(provider.tokens.current.lock().unwrap().is_none());
        assert_eq!(refreshes(&metrics), 0);
    }

    fn rcgen_p384() -> String {
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap().serialize_pem()
    }
}
