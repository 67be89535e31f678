//! The FCM channel (spec 000 section 7): the HTTP v1 `messages:send` API for
//! the service account's project, an OAuth2 access token from the service
//! account's `token_uri` (JWT-bearer grant, RS256), and the FCM row of the
//! outcome table.

pub(super) mod classify;
mod request;
mod settings;
mod token;

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use jsonwebtoken::EncodingKey;

use self::classify::{CONNECTION_ERROR, RETRY_DELAY, TIMED_OUT, classify_answer};
use self::token::{AccessTokens, ServiceAccount};
use super::common::HttpsBase;
use crate::channel::common::PushLifetime;
use crate::channel::outcome::{Answer, Outcome, Sent};
use crate::channel::provider::{BuildError, ChannelContext, Provider, Push};
use crate::channel::relayed::Refusal;
use crate::domain::{Channel, DeliveryTarget};
use crate::transport::client_tls_config;
use crate::transport::pool::unix_now_secs;
use crate::transport::pool::{
    ClientOptions, Pool, PoolMetrics, PoolOptions, Protocols, Resolver, SendError, encode_path_segment, https_client,
};

pub use request::{fcm_body, relayed_fcm_body};
pub use settings::{DEFAULT_BASE_URL, FcmSettings};
pub use token::FCM_SCOPE;

/// Idle connections to FCM and its token endpoint are kept this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

pub struct FcmProvider {
    pool: Pool,
    send_uri: Uri,
    tokens: AccessTokens,
    /// Android `ttl` and `apns-expiration` of spec 000 pushes (`ttl_seconds`).
    lifetime: PushLifetime,
}

impl FcmProvider {
    /// Reads the service-account file and builds the clients. Fails on an
    /// unreadable or malformed file, a key that is not an RSA key, a
    /// `token_uri` that is not https, or a bad CA file.
    pub fn new(settings: &FcmSettings, ctx: &ChannelContext) -> Result<Self, BuildError> {
        const FILE: &str = "engine.channels.fcm.service_account_file";
        let path = settings.service_account_file.display();
        let bad = |message: String| BuildError::new(FILE, message);
        let text =
            std::fs::read(&settings.service_account_file).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
        // serde_json's messages name a position, never the content.
        let account: ServiceAccount =
            serde_json::from_slice(&text).map_err(|e| bad(format!("{path} is not a service-account key file: {e}")))?;
        if account.project_id.is_empty() || account.client_email.is_empty() {
            return Err(bad(format!("{path} has an empty project_id or client_email")));
        }
        HttpsBase::parse(&account.token_uri).map_err(|e| bad(format!("{path}: token_uri {e}")))?;
        let token_uri: Uri = account.token_uri.parse().map_err(|_| bad(format!("{path}: bad token_uri")))?;
        let key = EncodingKey::from_rsa_pem(account.private_key.as_bytes())
            .map_err(|_| bad(format!("{path}: private_key is not a PEM RSA key")))?;
        let tls = client_tls_config(&settings.extra_ca_files)
            .map_err(|e| BuildError::new("engine.channels.fcm.extra_ca_files", e))?;
        let base = settings.base_url.without_trailing_slash();
        let send_uri: Uri = format!("{base}/v1/projects/{}/messages:send", encode_path_segment(&account.project_id))
            .parse()
            .map_err(|_| BuildError::new("engine.channels.fcm.base_url", "cannot form the messages:send URL"))?;
        // The token endpoint may speak HTTP/1.1 only.
        let token_client = ClientOptions { protocols: Protocols::Http1Or2, idle_timeout: IDLE_TIMEOUT };
        let token_client = https_client(tls.clone(), token_client, ctx.dialer(Channel::Fcm, Resolver::system()), None);
        let tokens = AccessTokens::new(token_client, token_uri, account, key, &ctx.metrics);
        // Sign once now, so a bad key fails at start and not at the first push.
        tokens.assertion().map_err(|_| bad(format!("{path}: private_key cannot sign RS256")))?;
        let pool = Pool::new(
            &tls,
            PoolOptions {
                connections: settings.connections,
                max_in_flight: settings.max_in_flight,
                rate_limit_per_second: settings.rate_limit_per_second,
                client: ClientOptions { protocols: Protocols::Http2, idle_timeout: IDLE_TIMEOUT },
            },
            ctx.dialer(Channel::Fcm, Resolver::system()),
            PoolMetrics::new(&ctx.metrics, Channel::Fcm),
        );
        Ok(Self { pool, send_uri, tokens, lifetime: settings.ttl_seconds })
    }

    /// One `messages:send` attempt with `body`, classified by the table.
    async fn attempt(&self, body: String) -> Sent {
        // A failed credential fetch sends nothing: not an attempt. The fetch
        // itself is bounded to ATTEMPT_TIMEOUT.
        let Ok(access) = self.tokens.get().await else {
            return Outcome::NotSent { delay: RETRY_DELAY }.into();
        };
        let request = Request::post(self.send_uri.clone())
            .header(http::header::AUTHORIZATION, access.authorization.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Bytes::from(body));
        let Ok(request) = request else {
            return Outcome::Rejected.into();
        };
        match self.pool.send(request).await {
            Ok(answer) => {
                if answer.status == StatusCode::UNAUTHORIZED {
                    // Rejected per the table; the next attempt fetches a new token.
                    self.tokens.invalidate(&access);
                }
                let (outcome, details) =
                    classify_answer(answer.status, &answer.headers, &answer.body, SystemTime::now());
                Sent::answered(outcome, Answer::with_reason(answer.status.as_u16(), details.code()))
            }
            Err(SendError::Timeout) => TIMED_OUT.into(),
            Err(SendError::Connection(_)) => CONNECTION_ERROR.into(),
        }
    }
}

#[async_trait]
impl Provider for FcmProvider {
    fn channel(&self) -> Channel {
        Channel::Fcm
    }

    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        self.send_answered(push).await.map(|sent| sent.outcome)
    }

    async fn send_answered(&self, push: Push<'_>) -> Result<Sent, Refusal> {
        let body = match push {
            Push::Envelope { recipient, envelope } => {
                let DeliveryTarget::Fcm { token: device } = &recipient.target else {
                    return Ok(Outcome::Rejected.into());
                };
                fcm_body(envelope, device, self.lifetime, unix_now_secs())
            }
            Push::Relayed(push) => relayed_fcm_body(&push, unix_now_secs())?.body,
        };
        Ok(self.attempt(body).await)
    }

    fn timed_out(&self) -> Outcome {
        TIMED_OUT
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;
    use std::sync::Arc;

    use super::classify::{MAX_RETRY_AFTER, QUOTA_DELAY};
    use super::*;
    use crate::channel::common::Connections;
    use crate::domain::Recipient;
    use crate::metrics::Metrics;
    use crate::testing::{self, envelope};
    use fanout_testkit::TestPki;
    use fanout_testkit::mock::fcm::{self as mock, FcmReply, FcmServiceAccount, MockFcmConfig};

    const T: Duration = Duration::from_secs(5);

    struct Setup {
        mock: mock::MockFcm,
        provider: FcmProvider,
        metrics: Arc<Metrics>,
        _dir: tempfile::TempDir,
    }

    async fn setup(config: MockFcmConfig) -> Setup {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = mock::start(&pki, config).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        pki.write_ca(&ca).unwrap();
        let account = dir.path().join("sa.json");
        mock.service_account().write(&account).unwrap();
        let settings = FcmSettings {
            service_account_file: account,
            base_url: HttpsBase::parse(&mock.base_url()).unwrap(),
            extra_ca_files: vec![ca],
            max_in_flight: NonZeroUsize::new(8).unwrap(),
            connections: Connections::new(2).unwrap(),
            rate_limit_per_second: 0,
            ttl_seconds: PushLifetime::new(600).unwrap(),
        };
        let metrics = Arc::new(Metrics::new());
        let provider = FcmProvider::new(&settings, &ChannelContext::new(metrics.clone())).unwrap();
        Setup { mock, provider, metrics, _dir: dir }
    }

    fn recipient(token: &str) -> Recipient {
        testing::recipient(DeliveryTarget::Fcm { token: token.into() })
    }

    async fn send(s: &Setup, token: &str) -> Outcome {
        let r = recipient(token);
        let e = envelope(42);
        s.provider.send(Push::Envelope { recipient: &r, envelope: &e }).await.unwrap()
    }

    fn count(m: &prometheus::IntCounterVec) -> u64 {
        m.with_label_values(&["fcm"]).get()
    }

    #[tokio::test]
    async fn a_built_channel_has_its_credential_series_at_zero() {
        let s = setup(MockFcmConfig::default()).await;
        let exposed = s.metrics.render();
        crate::metrics::assert_exposed(
            &exposed,
            &[
                r#"fanout_provider_token_refreshes_total{channel="fcm"} 0"#,
                r#"fanout_provider_token_failures_total{channel="fcm"} 0"#,
            ],
        );
        assert!(!exposed.contains(r#"channel="apns""#), "{exposed}");
    }

    #[tokio::test]
    async fn a_token_endpoint_answering_expires_in_u64_max_does_not_panic() {
        // `Instant + Duration` once overflowed on such an answer.
        let lifetime = Duration::from_secs(u64::MAX);
        let s = setup(MockFcmConfig { token_lifetime: lifetime, ..MockFcmConfig::default() }).await;
        assert_eq!(send(&s, "reg-a").await, Outcome::Delivered);
        assert_eq!(send(&s, "reg-b").await, Outcome::Delivered);
        // The token is cached (for at most a day), not fetched per send.
        assert_eq!(s.mock.token_request_count(), 1);
        assert_eq!(count(&s.metrics.provider_token_failures), 0);
    }

    #[tokio::test]
    async fn sends_the_section_7_request_with_an_oauth_token() {
        let s = setup(MockFcmConfig::default()).await;
        // Concurrent first sends share one token fetch (single flight).
        let outcomes = futures::future::join_all((0..5).map(|i| {
            let s = &s;
            async move { send(s, &format!("reg-{i}")).await }
        }))
        .await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Delivered), "{outcomes:?}");
        assert_eq!(s.mock.token_request_count(), 1);
        assert_eq!(count(&s.metrics.provider_token_refreshes), 1);
        let token_request = &s.mock.token_requests()[0];
        assert_eq!(token_request.auth_valid, Some(true), "the RS256 assertion verifies");
        assert_eq!(token_request.header("content-type"), Some("application/x-www-form-urlencoded"));

        let got = s.mock.wait_for(5, T).await;
        let r = got.iter().find(|r| r.token == "reg-0").unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, format!("/v1/projects/{}/messages:send", s.mock.project_id()));
        assert_eq!(r.version, "HTTP/2.0");
        assert_eq!(r.auth_valid, Some(true));
        assert!(r.header("authorization").unwrap().starts_with("Bearer "));
        let json = r.json().unwrap();
        assert_eq!(json["message"]["token"], "reg-0");
        assert_eq!(json["message"]["data"], serde_json::json!({"topic": "AAECAw==", "sequence_id": "42"}));
        assert_eq!(json["message"]["android"], serde_json::json!({"priority": "HIGH", "ttl": "600s"}));
        let expiration: u64 = json["message"]["apns"]["headers"]["apns-expiration"].as_str().unwrap().parse().unwrap();
        assert!((unix_now_secs() + 590..=unix_now_secs() + 600).contains(&expiration), "{expiration}");
        assert!(json["message"]["android"].get("collapse_key").is_none());
        assert!(json["message"]["apns"]["headers"].get("apns-collapse-id").is_none());

        // Cached: later sends fetch nothing.
        assert_eq!(send(&s, "reg-5").await, Outcome::Delivered);
        assert_eq!(s.mock.token_request_count(), 1);
    }

    #[tokio::test]
    async fn answers_are_classified_by_the_table() {
        let s = setup(MockFcmConfig::default()).await;
        let q = Outcome::transient(QUOTA_DELAY);
        let r = Outcome::transient(RETRY_DELAY);
        let cases = [
            ("r429", FcmReply::error(429, "RESOURCE_EXHAUSTED"), q),
            ("rqf", FcmReply::error(403, "RESOURCE_EXHAUSTED").with_quota_failure(), q),
            ("rqe", FcmReply::fcm_error(403, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"), q),
            ("r500", FcmReply::error(500, "INTERNAL"), r),
            ("r503", FcmReply::error(503, "UNAVAILABLE"), r),
            ("runr", FcmReply::fcm_error(404, "NOT_FOUND", "UNREGISTERED"), Outcome::Terminal),
            ("rsid", FcmReply::fcm_error(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"), Outcome::Mismatch),
            ("runa", FcmReply::fcm_error(502, "UNAVAILABLE", "UNAVAILABLE"), r),
            ("rint", FcmReply::fcm_error(400, "INTERNAL", "INTERNAL"), r),
            ("rinv", FcmReply::fcm_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"), Outcome::Rejected),
            ("rnot", FcmReply::error(404, "NOT_FOUND"), Outcome::Rejected),
            (
                "rra1",
                FcmReply::error(503, "UNAVAILABLE").with_retry_after("42"),
                Outcome::transient(Duration::from_secs(42)),
            ),
            (
                "rra2",
                FcmReply::error(429, "RESOURCE_EXHAUSTED").with_retry_after("900"),
                Outcome::transient(MAX_RETRY_AFTER),
            ),
            ("rra3", FcmReply::error(429, "RESOURCE_EXHAUSTED").with_retry_after("5"), q),
            ("rra4", FcmReply::fcm_error(404, "NOT_FOUND", "UNREGISTERED").with_retry_after("30"), Outcome::Terminal),
        ];
        for (token, reply, expected) in cases {
            s.mock.script(token, vec![reply]);
            assert_eq!(send(&s, token).await, expected, "{token}");
        }
        assert_eq!(s.mock.token_request_count(), 1);
    }

    #[tokio::test]
    async fn token_failures_send_nothing_and_are_counted() {
        let s = setup(MockFcmConfig::default()).await;
        s.mock.script_token_endpoint(vec![500]);
        assert_eq!(send(&s, "reg").await, Outcome::NotSent { delay: RETRY_DELAY }, "not an attempt");
        assert_eq!(s.mock.received_count(), 0, "no send without a token");
        assert_eq!(count(&s.metrics.provider_token_failures), 1);
        // The next attempt fetches again and sends.
        assert_eq!(send(&s, "reg").await, Outcome::Delivered);
        assert_eq!(s.mock.token_request_count(), 2);
        assert_eq!(count(&s.metrics.provider_token_refreshes), 1);
    }

    #[tokio::test]
    async fn short_lived_tokens_are_refreshed_and_refused_ones_dropped() {
        let s = setup(MockFcmConfig { token_lifetime: Duration::from_secs(2), ..Default::default() }).await;
        assert_eq!(send(&s, "reg").await, Outcome::Delivered);
        // Refreshed at half its life: 1.1 s later on tokio's clock (the
        // cache reads it), without sleeping.
        tokio::time::pause();
        tokio::time::advance(Duration::from_millis(1100)).await;
        tokio::time::resume();
        assert_eq!(send(&s, "reg").await, Outcome::Delivered);
        assert_eq!(s.mock.token_request_count(), 2);
        // FCM no longer accepts the token: rejected, and the cache is dropped.
        s.mock.revoke_access_tokens();
        assert_eq!(send(&s, "reg").await, Outcome::Rejected);
        assert_eq!(send(&s, "reg").await, Outcome::Delivered);
        assert_eq!(s.mock.token_request_count(), 3);
    }

    #[tokio::test]
    async fn connection_errors_are_transient() {
        let s = setup(MockFcmConfig::default()).await;
        assert_eq!(send(&s, "warm").await, Outcome::Delivered, "an access token is cached");
        s.mock.shutdown_now();
        assert_eq!(send(&s, "reg").await, Outcome::transient(RETRY_DELAY));
        assert_eq!(count(&s.metrics.provider_token_failures), 0);
    }

    #[test]
    fn bad_service_accounts_fail_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sa.json");
        let settings = FcmSettings {
            service_account_file: file.clone(),
            base_url: HttpsBase::parse(DEFAULT_BASE_URL).unwrap(),
            extra_ca_files: vec![],
            max_in_flight: NonZeroUsize::MIN,
            connections: Connections::new(1).unwrap(),
            rate_limit_per_second: 0,
            ttl_seconds: PushLifetime::DEFAULT,
        };
        let metrics = Arc::new(Metrics::new());
        let err = |text: &str| {
            std::fs::write(&file, text).unwrap();
            FcmProvider::new(&settings, &ChannelContext::new(metrics.clone())).err().unwrap().to_string()
        };
        let good = FcmServiceAccount::test_only("proj", "https://oauth2.example/token");
        let mut json: serde_json::Value = serde_json::from_str(&good.to_json()).unwrap();
        assert!(err("{}").contains("not a service-account key file"));
        json["token_uri"] = "http://oauth2.example/token".into();
        assert!(err(&json.to_string()).contains("https"));
        json["token_uri"] = "https://oauth2.example/token".into();
        json["private_key"] = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into();
        let bad_key = err(&json.to_string());
        assert!(bad_key.contains("private_key"), "{bad_key}");
        assert!(!bad_key.contains("AAAA"), "never echoes key material");
        std::fs::write(&file, good.to_json()).unwrap();
        FcmProvider::new(&settings, &ChannelContext::new(metrics.clone())).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert!(
            FcmProvider::new(&settings, &ChannelContext::new(metrics))
                .err()
                .unwrap()
                .to_string()
                .contains("cannot read")
        );
    }
}
