//! The FCM channel (spec 000 section 7): the HTTP v1 `messages:send` API for
//! the service account's project, an OAuth2 access token from the service
//! account's `token_uri` (JWT-bearer grant, RS256), and the FCM row of the
//! outcome table.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, Uri};
use http_body_util::Full;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

use super::http2::{
    H2Pool, HttpsClient, PoolMetrics, PoolOptions, encode_path_segment, https_client, request, unix_now_secs,
};
use super::{Outcome, Provider, Push, client_tls_config};
use crate::domain::{Channel, DeliveryTarget, StoredEnvelope};
use crate::metrics::Metrics;
use crate::settings::{ATTEMPT_TIMEOUT, FcmSettings, check_https_base};

/// Section 7, FCM row: 429, QuotaFailure, QUOTA_EXCEEDED.
const QUOTA_DELAY: Duration = Duration::from_secs(60);
/// Section 7, FCM row: 500, 503, timeout, connection error, UNAVAILABLE,
/// INTERNAL; and a failed token fetch, which is part of the attempt.
const RETRY_DELAY: Duration = Duration::from_secs(10);
/// A Retry-After longer than the delay is honoured up to this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// An access token is replaced this long before it expires.
const TOKEN_EXPIRY_MARGIN: Duration = Duration::from_secs(300);
/// The OAuth2 scope of the FCM HTTP v1 API.
pub const FCM_SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Lifetime of the signed assertion (Google accepts at most an hour).
const ASSERTION_LIFETIME_SECS: u64 = 3600;

const QUOTA_FAILURE_TYPE: &str = "type.googleapis.com/google.rpc.QuotaFailure";
const FCM_ERROR_TYPE: &str = "type.googleapis.com/google.firebase.fcm.v1.FcmError";

/// The FCM message (PUSH-259): data holding only the topic (standard base64)
/// and the sequence id (decimal text), a high-priority Android message, a
/// background APNs push at priority 5, and no collapse key.
pub fn fcm_body(envelope: &StoredEnvelope, token: &str) -> String {
    // The token is caller-supplied text: JSON-escape it. The other values are
    // base64 and digits.
    let token = serde_json::Value::from(token).to_string();
    format!(
        concat!(
            r#"{{"message":{{"token":{},"data":{{"topic":"{}","sequence_id":"{}"}},"#,
            r#""android":{{"priority":"HIGH"}},"#,
            r#""apns":{{"headers":{{"apns-priority":"5","apns-push-type":"background"}},"payload":{{"aps":{{"content-available":1}}}}}}}}}}"#
        ),
        token,
        envelope.topic.to_base64(),
        envelope.sequence_id
    )
}

/// The parts of a Google service-account JSON key file FCM needs. Other
/// fields are ignored. Not `Debug`: it holds the private key.
#[derive(Deserialize)]
struct ServiceAccount {
    project_id: String,
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    token_uri: String,
}

#[derive(Serialize)]
struct AssertionClaims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: u64,
}

/// A cached access token.
struct AccessToken {
    /// `Bearer <token>`, marked sensitive.
    authorization: HeaderValue,
    refresh_at: Instant,
}

/// Why no access token could be had; kept free of any credential text.
#[derive(Debug, thiserror::Error)]
enum TokenError {
    #[error("cannot sign the service-account assertion: {0}")]
    Sign(jsonwebtoken::errors::Error),
    #[error("token endpoint unreachable")]
    Connect,
    #[error("token endpoint answered {0}")]
    Status(StatusCode),
    #[error("token endpoint answered an unreadable body")]
    Body,
}

/// OAuth2 access tokens for the service account, cached until
/// `TOKEN_EXPIRY_MARGIN` before they expire and fetched by one caller at a
/// time (single flight).
struct AccessTokens {
    client: HttpsClient,
    token_uri: Uri,
    token_uri_text: String,
    client_email: String,
    key: EncodingKey,
    key_id: Option<String>,
    current: RwLock<Option<Arc<AccessToken>>>,
    refresh: tokio::sync::Mutex<()>,
    metrics: Arc<Metrics>,
}

impl AccessTokens {
    fn assertion(&self) -> Result<String, jsonwebtoken::errors::Error> {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = self.key_id.clone();
        let iat = unix_now_secs();
        let claims = AssertionClaims {
            iss: &self.client_email,
            scope: FCM_SCOPE,
            aud: &self.token_uri_text,
            iat,
            exp: iat + ASSERTION_LIFETIME_SECS,
        };
        jsonwebtoken::encode(&header, &claims, &self.key)
    }

    fn cached(&self) -> Option<Arc<AccessToken>> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        current.as_ref().filter(|t| Instant::now() < t.refresh_at).cloned()
    }

    /// A valid access token, fetched when none is cached.
    async fn get(&self) -> Result<Arc<AccessToken>, TokenError> {
        if let Some(token) = self.cached() {
            return Ok(token);
        }
        let _single_flight = self.refresh.lock().await;
        // Whoever held the lock before may have fetched one.
        if let Some(token) = self.cached() {
            return Ok(token);
        }
        match self.fetch().await {
            Ok(token) => {
                self.metrics.provider_token_refreshes.with_label_values(&["fcm"]).inc();
                let token = Arc::new(token);
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
                Ok(token)
            }
            Err(e) => {
                self.metrics.provider_token_failures.with_label_values(&["fcm"]).inc();
                tracing::warn!(error = %e, "cannot obtain an FCM access token");
                Err(e)
            }
        }
    }

    /// Drops `used` if it is still the cached token (FCM refused it).
    fn invalidate(&self, used: &Arc<AccessToken>) {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|t| Arc::ptr_eq(t, used)) {
            *current = None;
        }
    }

    async fn fetch(&self) -> Result<AccessToken, TokenError> {
        let assertion = self.assertion().map_err(TokenError::Sign)?;
        let form = format!("grant_type={}&assertion={}", form_encode(JWT_BEARER_GRANT), form_encode(&assertion));
        let req = Request::post(self.token_uri.clone())
            .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(form)))
            .map_err(|_| TokenError::Connect)?;
        // The caller's attempt timeout bounds this too; this bound only
        // matters for a caller without one.
        let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, request(&self.client, req))
            .await
            .map_err(|_| TokenError::Connect)?
            .map_err(|_| TokenError::Connect)?;
        if answer.status != StatusCode::OK {
            return Err(TokenError::Status(answer.status));
        }
        let parsed: TokenResponse = serde_json::from_slice(&answer.body).map_err(|_| TokenError::Body)?;
        let mut authorization =
            HeaderValue::try_from(format!("Bearer {}", parsed.access_token)).map_err(|_| TokenError::Body)?;
        authorization.set_sensitive(true);
        let lifetime = Duration::from_secs(parsed.expires_in);
        // Replace it 5 minutes early; a short-lived token at half its life.
        let margin = TOKEN_EXPIRY_MARGIN.min(lifetime / 2);
        Ok(AccessToken { authorization, refresh_at: Instant::now() + lifetime - margin })
    }
}

/// application/x-www-form-urlencoded for one value: unreserved characters
/// pass, everything else is `%XX` (the same set as a path segment).
fn form_encode(value: &str) -> String {
    encode_path_segment(value)
}

#[derive(Deserialize)]
struct ErrorBody {
    error: Option<ErrorInfo>,
}

#[derive(Deserialize)]
struct ErrorInfo {
    #[serde(default)]
    details: Vec<serde_json::Value>,
}

/// What an FCM error body says: a QuotaFailure detail and the typed FcmError code.
#[derive(Debug, Default, PartialEq, Eq)]
struct ErrorDetails {
    quota_failure: bool,
    fcm_error: Option<String>,
}

fn error_details(body: &[u8]) -> ErrorDetails {
    let mut found = ErrorDetails::default();
    let Ok(ErrorBody { error: Some(info) }) = serde_json::from_slice::<ErrorBody>(body) else {
        return found;
    };
    for detail in &info.details {
        match detail.get("@type").and_then(|t| t.as_str()) {
            Some(QUOTA_FAILURE_TYPE) => found.quota_failure = true,
            Some(FCM_ERROR_TYPE) if found.fcm_error.is_none() => {
                found.fcm_error = detail.get("errorCode").and_then(|c| c.as_str()).map(str::to_owned);
            }
            _ => {}
        }
    }
    found
}

/// The FCM row of the outcome table, first match wins, before Retry-After.
fn classify(status: u16, details: &ErrorDetails) -> Outcome {
    let code = details.fcm_error.as_deref();
    if status == 200 {
        Outcome::Delivered
    } else if status == 429 || details.quota_failure || code == Some("QUOTA_EXCEEDED") {
        Outcome::transient(QUOTA_DELAY)
    } else if status == 500 || status == 503 {
        Outcome::transient(RETRY_DELAY)
    } else if code == Some("UNREGISTERED") {
        Outcome::Terminal
    } else if code == Some("SENDER_ID_MISMATCH") {
        Outcome::Mismatch
    } else if matches!(code, Some("UNAVAILABLE" | "INTERNAL")) {
        Outcome::transient(RETRY_DELAY)
    } else {
        Outcome::Rejected
    }
}

/// A Retry-After longer than a transient outcome's delay is honoured up to
/// 300 seconds: the delay becomes max(delay, min(retry_after, 300 s)).
fn honour_retry_after(outcome: Outcome, retry_after: Option<Duration>) -> Outcome {
    match (outcome, retry_after) {
        (Outcome::Transient { delay, gone }, Some(after)) => {
            Outcome::Transient { delay: delay.max(after.min(MAX_RETRY_AFTER)), gone }
        }
        (outcome, _) => outcome,
    }
}

/// Retry-After as delay-seconds. (An HTTP-date is not used by FCM and is ignored.)
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim();
    value.parse::<u64>().ok().map(Duration::from_secs)
}

pub struct FcmProvider {
    pool: H2Pool,
    send_uri: Uri,
    tokens: AccessTokens,
}

impl FcmProvider {
    /// Reads the service-account file and builds the clients. Fails on an
    /// unreadable or malformed file, a key that is not an RSA key, a
    /// `token_uri` that is not https, or a bad CA file.
    pub fn from_settings(settings: &FcmSettings, metrics: Arc<Metrics>) -> Result<Self, String> {
        settings.validate().map_err(|e| format!("channels.fcm.{e}"))?;
        let path = settings.service_account_file.display();
        let text = std::fs::read(&settings.service_account_file)
            .map_err(|e| format!("channels.fcm.service_account_file: cannot read {path}: {e}"))?;
        // serde_json's messages name a position, never the content.
        let account: ServiceAccount = serde_json::from_slice(&text)
            .map_err(|e| format!("channels.fcm.service_account_file: {path} is not a service-account key file: {e}"))?;
        if account.project_id.is_empty() || account.client_email.is_empty() {
            return Err(format!("channels.fcm.service_account_file: {path} has an empty project_id or client_email"));
        }
        check_https_base("token_uri", &account.token_uri)
            .map_err(|e| format!("channels.fcm.service_account_file: {path}: {e}"))?;
        let token_uri: Uri = account
            .token_uri
            .parse()
            .map_err(|_| format!("channels.fcm.service_account_file: {path}: bad token_uri"))?;
        let key = EncodingKey::from_rsa_pem(account.private_key.as_bytes())
            .map_err(|_| format!("channels.fcm.service_account_file: {path}: private_key is not a PEM RSA key"))?;
        let tls =
            client_tls_config(&settings.extra_ca_files).map_err(|e| format!("channels.fcm.extra_ca_files: {e}"))?;
        let base = settings.base_url.trim_end_matches('/');
        let send_uri: Uri = format!("{base}/v1/projects/{}/messages:send", encode_path_segment(&account.project_id))
            .parse()
            .map_err(|_| "channels.fcm.base_url: cannot form the messages:send URL".to_string())?;
        let tokens = AccessTokens {
            client: https_client(tls.clone(), false, None),
            token_uri,
            token_uri_text: account.token_uri.clone(),
            client_email: account.client_email,
            key,
            key_id: account.private_key_id.filter(|k| !k.is_empty()),
            current: RwLock::new(None),
            refresh: tokio::sync::Mutex::new(()),
            metrics: metrics.clone(),
        };
        // Sign once now, so a bad key fails at start and not at the first push.
        tokens
            .assertion()
            .map_err(|_| format!("channels.fcm.service_account_file: {path}: private_key cannot sign RS256"))?;
        let pool = H2Pool::new(
            &tls,
            PoolOptions {
                connections: settings.connections,
                max_in_flight: settings.max_in_flight,
                rate_limit_per_second: settings.rate_limit_per_second,
            },
            Some(PoolMetrics::new(&metrics, "fcm")),
        );
        Ok(Self { pool, send_uri, tokens })
    }
}

#[async_trait]
impl Provider for FcmProvider {
    fn channel(&self) -> Channel {
        Channel::Fcm
    }

    async fn send(&self, push: Push<'_>) -> Outcome {
        let DeliveryTarget::Fcm { token: device } = &push.recipient.target else {
            return Outcome::Rejected;
        };
        // The credential fetch is part of the attempt (and of its 10 s bound).
        let Ok(access) = self.tokens.get().await else {
            return Outcome::transient(RETRY_DELAY);
        };
        let request = Request::post(self.send_uri.clone())
            .header(http::header::AUTHORIZATION, access.authorization.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(fcm_body(push.envelope, device))));
        let Ok(request) = request else {
            return Outcome::Rejected;
        };
        match self.pool.send(request).await {
            Ok(answer) => {
                if answer.status == StatusCode::UNAUTHORIZED {
                    // Rejected per the table; the next attempt fetches a new token.
                    self.tokens.invalidate(&access);
                }
                let details =
                    if answer.status == StatusCode::OK { ErrorDetails::default() } else { error_details(&answer.body) };
                honour_retry_after(classify(answer.status.as_u16(), &details), retry_after(&answer.headers))
            }
            Err(_) => Outcome::transient(RETRY_DELAY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EnvelopeKind, RecipientId, SecretHash, ShardId, Topic};
    use crate::store::Recipient;
    use fanout_loadtest::TestPki;
    use fanout_loadtest::mock::fcm::{self as mock, FcmReply, FcmServiceAccount, MockFcmConfig};

    const T: Duration = Duration::from_secs(5);

    fn details(quota_failure: bool, code: Option<&str>) -> ErrorDetails {
        ErrorDetails { quota_failure, fcm_error: code.map(str::to_owned) }
    }

    #[test]
    fn fcm_outcome_table_first_match_wins() {
        let none = details(false, None);
        let q = Outcome::transient(QUOTA_DELAY);
        let r = Outcome::transient(RETRY_DELAY);
        assert_eq!(classify(200, &none), Outcome::Delivered);
        // 200 wins over anything in a body.
        assert_eq!(classify(200, &details(true, Some("UNREGISTERED"))), Outcome::Delivered);
        assert_eq!(classify(429, &none), q);
        assert_eq!(classify(429, &details(false, Some("UNREGISTERED"))), q);
        assert_eq!(classify(403, &details(true, None)), q);
        assert_eq!(classify(400, &details(false, Some("QUOTA_EXCEEDED"))), q);
        // Quota beats 500/503.
        assert_eq!(classify(503, &details(true, None)), q);
        assert_eq!(classify(500, &details(false, Some("QUOTA_EXCEEDED"))), q);
        assert_eq!(classify(500, &none), r);
        assert_eq!(classify(503, &none), r);
        // 500/503 beat the typed codes below them.
        assert_eq!(classify(500, &details(false, Some("UNREGISTERED"))), r);
        assert_eq!(classify(503, &details(false, Some("SENDER_ID_MISMATCH"))), r);
        assert_eq!(classify(404, &details(false, Some("UNREGISTERED"))), Outcome::Terminal);
        assert_eq!(classify(400, &details(false, Some("UNREGISTERED"))), Outcome::Terminal);
        assert_eq!(classify(403, &details(false, Some("SENDER_ID_MISMATCH"))), Outcome::Mismatch);
        assert_eq!(classify(502, &details(false, Some("UNAVAILABLE"))), r);
        assert_eq!(classify(400, &details(false, Some("INTERNAL"))), r);
        // Anything else, including an error with no typed FcmError.
        assert_eq!(classify(400, &details(false, Some("INVALID_ARGUMENT"))), Outcome::Rejected);
        assert_eq!(classify(401, &details(false, Some("THIRD_PARTY_AUTH_ERROR"))), Outcome::Rejected);
        assert_eq!(classify(404, &none), Outcome::Rejected);
        assert_eq!(classify(502, &none), Outcome::Rejected);
        assert_eq!(classify(401, &none), Outcome::Rejected);
        assert_eq!(classify(204, &none), Outcome::Rejected);
    }

    #[test]
    fn error_details_are_parsed_from_google_rpc_errors() {
        let body = br#"{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND",
            "details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}"#;
        assert_eq!(error_details(body), details(false, Some("UNREGISTERED")));
        let quota = br#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"subject":"s","description":"d"}]},
            {"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"}]}}"#;
        assert_eq!(error_details(quota), details(true, Some("QUOTA_EXCEEDED")));
        // Status text alone is not a typed FcmError.
        assert_eq!(error_details(br#"{"error":{"code":400,"status":"UNREGISTERED"}}"#), details(false, None));
        // Another detail type with an errorCode is not an FcmError.
        assert_eq!(
            error_details(br#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","errorCode":"UNREGISTERED"}]}}"#),
            details(false, None)
        );
        assert_eq!(error_details(b"<html>bad gateway</html>"), details(false, None));
        assert_eq!(error_details(b""), details(false, None));
    }

    #[test]
    fn retry_after_is_honoured_up_to_300_seconds() {
        let s = Duration::from_secs;
        let t = |d| Outcome::transient(s(d));
        assert_eq!(honour_retry_after(t(10), Some(s(30))), t(30));
        assert_eq!(honour_retry_after(t(10), Some(s(5))), t(10), "shorter than the delay: the delay");
        assert_eq!(honour_retry_after(t(60), Some(s(3600))), t(300), "capped");
        assert_eq!(honour_retry_after(t(60), Some(s(120))), t(120));
        assert_eq!(honour_retry_after(t(10), None), t(10));
        assert_eq!(honour_retry_after(Outcome::Rejected, Some(s(30))), Outcome::Rejected);
        assert_eq!(honour_retry_after(Outcome::Terminal, Some(s(30))), Outcome::Terminal);

        let mut headers = http::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static(" 120 "));
        assert_eq!(retry_after(&headers), Some(s(120)));
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&headers), None);
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
    fn body_carries_data_priorities_and_no_collapse_key() {
        let body = fcm_body(&envelope(9_007_199_254_740_993), "reg\"token");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let expected = serde_json::json!({"message": {
            "token": "reg\"token",
            "data": {"topic": "AAECAw==", "sequence_id": "9007199254740993"},
            "android": {"priority": "HIGH"},
            "apns": {"headers": {"apns-priority": "5", "apns-push-type": "background"},
                     "payload": {"aps": {"content-available": 1}}}
        }});
        assert_eq!(json, expected);
        assert!(!body.contains("collapse"));
        assert!(!body.contains("secret payload"));
    }

    #[test]
    fn form_values_are_encoded() {
        assert_eq!(form_encode(JWT_BEARER_GRANT), "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer");
        assert_eq!(form_encode("a.b-c_d"), "a.b-c_d");
    }

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
            base_url: mock.base_url(),
            extra_ca_files: vec![ca],
            max_in_flight: 8,
            connections: 2,
            rate_limit_per_second: 0,
        };
        let metrics = Arc::new(Metrics::new());
        let provider = FcmProvider::from_settings(&settings, metrics.clone()).unwrap();
        Setup { mock, provider, metrics, _dir: dir }
    }

    fn recipient(token: &str) -> Recipient {
        Recipient {
            id: RecipientId([1u8; 32]),
            secret_hash: SecretHash([2u8; 32]),
            target: DeliveryTarget::Fcm { token: token.into() },
            renewed_at_ns: 0,
            topic_count: 1,
        }
    }

    async fn send(s: &Setup, token: &str) -> Outcome {
        let r = recipient(token);
        let e = envelope(42);
        s.provider.send(Push { recipient: &r, envelope: &e }).await
    }

    fn count(m: &prometheus::IntCounterVec) -> u64 {
        m.with_label_values(&["fcm"]).get()
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
        assert_eq!(json["message"]["android"], serde_json::json!({"priority": "HIGH"}));
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
    async fn token_failures_are_transient_and_counted() {
        let s = setup(MockFcmConfig::default()).await;
        s.mock.script_token_endpoint(vec![500]);
        assert_eq!(send(&s, "reg").await, Outcome::transient(RETRY_DELAY));
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
        // Refreshed at half its life.
        tokio::time::sleep(Duration::from_millis(1100)).await;
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
        s.mock.shutdown_now();
        assert_eq!(send(&s, "reg").await, Outcome::transient(RETRY_DELAY));
        assert_eq!(count(&s.metrics.provider_token_failures), 1);
    }

    #[test]
    fn bad_service_accounts_fail_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sa.json");
        let settings = FcmSettings {
            service_account_file: file.clone(),
            base_url: crate::settings::DEFAULT_FCM_BASE_URL.into(),
            extra_ca_files: vec![],
            max_in_flight: 1,
            connections: 1,
            rate_limit_per_second: 0,
        };
        let metrics = Arc::new(Metrics::new());
        let err = |text: &str| {
            std::fs::write(&file, text).unwrap();
            FcmProvider::from_settings(&settings, metrics.clone()).err().unwrap()
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
        FcmProvider::from_settings(&settings, metrics.clone()).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert!(FcmProvider::from_settings(&settings, metrics).err().unwrap().contains("cannot read"));
    }
}
