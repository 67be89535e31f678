//! Mock FCM provider and its OAuth2 token endpoint, on one HTTPS server
//! (HTTP/2, or HTTP/1.1 by ALPN):
//!
//! - `POST /token`: the JWT-bearer grant. Verifies the RS256 assertion against
//!   the service account's public key and issues an access token.
//! - `POST /v1/projects/<project>/messages:send`: checks the bearer is a live
//!   token it issued, refuses what FCM refuses in the fields fanout sends
//!   (`android.ttl`, the APNs block's `apns-expiration` and
//!   `apns-collapse-id`), records the request, and answers from a script per
//!   registration token (default: 200 with a message name).
//!
//! [`FcmServiceAccount`] writes the matching service-account key file, whose
//! `token_uri` points at the mock.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::provider::{MAX_CONCURRENT_STREAMS, ProviderRequest, unix_now};
use crate::lock;
use crate::outage::Outage;
use crate::pki::{ALPN_H2, ALPN_HTTP1, TestPki};
use crate::recorder::Recorder;
use crate::request::percent_decode;
use crate::server::{self, Server};

/// TEST-ONLY RSA key of the mock service account (see `testdata/README.md`).
pub const TEST_ONLY_RSA_PRIVATE_KEY_PEM: &str = include_str!("../../testdata/fcm-test-only-rsa-key.pem");
/// Public half of [`TEST_ONLY_RSA_PRIVATE_KEY_PEM`].
pub const TEST_ONLY_RSA_PUBLIC_KEY_PEM: &str = include_str!("../../testdata/fcm-test-only-rsa-key.pub.pem");

/// The OAuth2 scope of the FCM HTTP v1 API.
pub const FCM_SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const FCM_ERROR_TYPE: &str = "type.googleapis.com/google.firebase.fcm.v1.FcmError";
const QUOTA_FAILURE_TYPE: &str = "type.googleapis.com/google.rpc.QuotaFailure";
/// "Never" for a token lifetime the clock cannot add.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// A Google service-account key file for the mock. Not `Debug`: it holds a key.
#[derive(Clone)]
pub struct FcmServiceAccount {
    pub project_id: String,
    pub client_email: String,
    pub private_key_pem: String,
    pub public_key_pem: String,
    pub token_uri: String,
}

impl FcmServiceAccount {
    /// A service account on the TEST-ONLY key of `testdata/`.
    pub fn test_only(project_id: &str, token_uri: &str) -> Self {
        FcmServiceAccount {
            project_id: project_id.into(),
            client_email: format!("fanout-test@{project_id}.iam.gserviceaccount.com"),
            private_key_pem: TEST_ONLY_RSA_PRIVATE_KEY_PEM.into(),
            public_key_pem: TEST_ONLY_RSA_PUBLIC_KEY_PEM.into(),
            token_uri: token_uri.into(),
        }
    }

    /// The JSON key file, in the shape Google issues.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "type": "service_account",
            "project_id": self.project_id,
            "private_key_id": "test-only-key",
            "private_key": self.private_key_pem,
            "client_email": self.client_email,
            "client_id": "000000000000000000000",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.token_uri,
        })
        .to_string()
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, self.to_json()).with_context(|| format!("writing service account to {}", path.display()))
    }
}

/// How the mock listens and authenticates.
#[derive(Clone, Debug)]
pub struct MockFcmConfig {
    /// Listen address; port 0 picks a free port.
    pub bind: SocketAddr,
    /// Added before every `messages:send` answer.
    pub latency: Duration,
    pub project_id: String,
    /// Expected assertion `iss`; default the [`FcmServiceAccount::test_only`] email.
    pub client_email: Option<String>,
    /// The service account's public key (SPKI PEM); default the TEST-ONLY key.
    pub public_key_pem: String,
    /// `expires_in` of issued access tokens; they are refused afterwards.
    pub token_lifetime: Duration,
}

impl Default for MockFcmConfig {
    fn default() -> Self {
        MockFcmConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            latency: Duration::ZERO,
            project_id: "fanout-test-project".into(),
            client_email: None,
            public_key_pem: TEST_ONLY_RSA_PUBLIC_KEY_PEM.into(),
            token_lifetime: Duration::from_secs(3600),
        }
    }
}

/// One scripted `messages:send` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FcmReply {
    pub status: u16,
    /// google.rpc status text, e.g. "NOT_FOUND"; with it the body is an error.
    pub error_status: Option<String>,
    /// An FcmError detail with this errorCode, e.g. "UNREGISTERED".
    pub fcm_error: Option<String>,
    /// A google.rpc.QuotaFailure detail.
    pub quota_failure: bool,
    /// Sent verbatim instead of the built body.
    pub raw_body: Option<String>,
    pub retry_after: Option<String>,
    pub delay: Duration,
}

impl FcmReply {
    /// 200 with a message name.
    pub fn ok() -> Self {
        FcmReply {
            status: 200,
            error_status: None,
            fcm_error: None,
            quota_failure: false,
            raw_body: None,
            retry_after: None,
            delay: Duration::ZERO,
        }
    }

    /// `status` with a google.rpc error body without details.
    pub fn error(status: u16, error_status: &str) -> Self {
        FcmReply { status, error_status: Some(error_status.into()), ..Self::ok() }
    }

    /// `status` with a google.rpc error body carrying an FcmError `code`.
    pub fn fcm_error(status: u16, error_status: &str, code: &str) -> Self {
        FcmReply { fcm_error: Some(code.into()), ..Self::error(status, error_status) }
    }

    /// `status` with `body` as is.
    pub fn raw(status: u16, body: &str) -> Self {
        FcmReply { status, raw_body: Some(body.into()), ..Self::ok() }
    }

    /// Adds a google.rpc.QuotaFailure detail.
    pub fn with_quota_failure(mut self) -> Self {
        self.quota_failure = true;
        self
    }

    pub fn with_retry_after(mut self, value: impl Into<String>) -> Self {
        self.retry_after = Some(value.into());
        self
    }

    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    fn body(&self, project_id: &str, id: u64) -> String {
        if let Some(raw) = &self.raw_body {
            return raw.clone();
        }
        let Some(status) = &self.error_status else {
            return serde_json::json!({"name": format!("projects/{project_id}/messages/{id}")}).to_string();
        };
        let mut details = Vec::new();
        if self.quota_failure {
            details.push(serde_json::json!({
                "@type": QUOTA_FAILURE_TYPE,
                "violations": [{"subject": "project", "description": "mock quota exceeded"}],
            }));
        }
        if let Some(code) = &self.fcm_error {
            details.push(serde_json::json!({"@type": FCM_ERROR_TYPE, "errorCode": code}));
        }
        let mut error = serde_json::json!({"code": self.status, "message": "mock FCM error", "status": status});
        if !details.is_empty() {
            error["details"] = details.into();
        }
        serde_json::json!({ "error": error }).to_string()
    }
}

#[derive(Deserialize)]
struct AssertionClaims {
    iss: String,
    scope: String,
    aud: String,
    iat: u64,
    exp: u64,
}

/// Verifies a JWT-bearer assertion: RS256 under `key`, `iss`, `aud` and the
/// FCM scope as expected, valid now, and living at most an hour.
pub fn verify_assertion(jwt: &str, key: &DecodingKey, client_email: &str, token_uri: &str) -> bool {
    let mut validation = Validation::new(Algorithm::RS256);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_aud = false;
    let Ok(data) = jsonwebtoken::decode::<AssertionClaims>(jwt, key, &validation) else {
        return false;
    };
    let c = data.claims;
    let now = unix_now();
    c.iss == client_email
        && c.aud == token_uri
        && c.scope.split(' ').any(|s| s == FCM_SCOPE)
        && c.iat <= now + 60
        && c.exp > now
        && c.exp > c.iat
        && c.exp - c.iat <= 3600
}

struct State {
    latency: Duration,
    project_id: String,
    client_email: String,
    key: DecodingKey,
    token_uri: String,
    token_lifetime: Duration,
    sends: Recorder<ProviderRequest>,
    token_requests: Recorder<ProviderRequest>,
    scripts: Mutex<HashMap<String, VecDeque<FcmReply>>>,
    token_script: Mutex<VecDeque<u16>>,
    issued: Mutex<HashMap<String, Instant>>,
    next_id: AtomicU64,
}

/// A running mock FCM. The server stops when this is dropped.
pub struct MockFcm {
    server: Server,
    state: Arc<State>,
    outage: Outage,
}

/// FCM's body with a 503: a google.rpc status, UNAVAILABLE.
const UNAVAILABLE_BODY: &str =
    r#"{"error":{"code":503,"message":"The service is currently unavailable.","status":"UNAVAILABLE"}}"#;

/// Binds, then serves in a background task until the `MockFcm` is dropped.
pub async fn start(pki: &TestPki, config: MockFcmConfig) -> anyhow::Result<MockFcm> {
    let key = DecodingKey::from_rsa_pem(config.public_key_pem.as_bytes())
        .context("the service-account public key is not an RSA PEM key")?;
    let listener = server::bind("mock FCM", config.bind).await?;
    let outage = Outage::new();
    let client_email =
        config.client_email.unwrap_or_else(|| FcmServiceAccount::test_only(&config.project_id, "").client_email);
    let state = Arc::new(State {
        latency: config.latency,
        project_id: config.project_id,
        client_email,
        key,
        // Assertions name the token endpoint as audience: known once bound.
        token_uri: format!("{}/token", server::base_url(listener.local_addr()?)),
        token_lifetime: config.token_lifetime,
        sends: Recorder::new(),
        token_requests: Recorder::new(),
        scripts: Mutex::new(HashMap::new()),
        token_script: Mutex::new(VecDeque::new()),
        issued: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
    });
    let options = server::Options {
        alpn: vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()],
        max_concurrent_streams: MAX_CONCURRENT_STREAMS,
        wire: None,
        outage: Some(outage.clone()),
        unavailable_body: UNAVAILABLE_BODY,
    };
    let handler_state = state.clone();
    let server = Server::serve(listener, pki, options, move |req| handle(req, handler_state.clone()))?;
    Ok(MockFcm { server, state, outage })
}

impl MockFcm {
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `https://127.0.0.1:<port>`: the engine's `base_url`.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// The switch that makes this FCM (its token endpoint too: one server)
    /// hang, refuse connections, stall in the TLS handshake, answer slowly
    /// or answer 503 ([`crate::outage`]). Requests an outage meets are
    /// counted there, not recorded here.
    pub fn outage(&self) -> &Outage {
        &self.outage
    }

    /// `https://127.0.0.1:<port>/token`: the service account's `token_uri`.
    pub fn token_uri(&self) -> String {
        self.state.token_uri.clone()
    }

    pub fn project_id(&self) -> &str {
        &self.state.project_id
    }

    /// The TEST-ONLY service account this mock accepts, with `token_uri` set.
    pub fn service_account(&self) -> FcmServiceAccount {
        let mut account = FcmServiceAccount::test_only(&self.state.project_id, &self.state.token_uri);
        account.client_email = self.state.client_email.clone();
        account
    }

    /// Every `messages:send` request (and any other non-token path) so far.
    pub fn received(&self) -> Vec<ProviderRequest> {
        self.state.sends.all()
    }

    /// The send requests for one registration token.
    pub fn received_for(&self, token: &str) -> Vec<ProviderRequest> {
        self.state.sends.for_token(token)
    }

    pub fn received_count(&self) -> usize {
        self.state.sends.count()
    }

    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<ProviderRequest> {
        self.state.sends.wait_for(n, timeout).await
    }

    /// Waits until at least `n` sends for `token` arrived or `timeout` passed;
    /// returns those for `token`.
    pub async fn wait_for_token(&self, token: &str, n: usize, timeout: Duration) -> Vec<ProviderRequest> {
        self.state.sends.wait_for_token(token, n, timeout).await
    }

    /// Every OAuth token request so far.
    pub fn token_requests(&self) -> Vec<ProviderRequest> {
        self.state.token_requests.all()
    }

    pub fn token_request_count(&self) -> usize {
        self.state.token_requests.count()
    }

    pub async fn wait_for_token_requests(&self, n: usize, timeout: Duration) -> Vec<ProviderRequest> {
        self.state.token_requests.wait_for(n, timeout).await
    }

    /// The next sends to registration `token` get `replies` in order, then 200.
    pub fn script(&self, token: &str, replies: Vec<FcmReply>) {
        lock(&self.state.scripts).entry(token.to_string()).or_default().extend(replies);
    }

    /// The next token requests are answered with these statuses (and an
    /// OAuth error body) instead of a token, in order.
    pub fn script_token_endpoint(&self, statuses: Vec<u16>) {
        lock(&self.state.token_script).extend(statuses);
    }

    /// Token requests are answered normally again: what
    /// [`MockFcm::script_token_endpoint`] queued and did not use is dropped.
    pub fn clear_token_script(&self) {
        lock(&self.state.token_script).clear();
    }

    /// Every access token issued so far is refused from now on (401).
    pub fn revoke_access_tokens(&self) {
        lock(&self.state.issued).clear();
    }

    pub fn clear_received(&self) {
        self.state.sends.clear();
        self.state.token_requests.clear();
    }

    /// Stops accepting and aborts open connections (without waiting).
    pub fn shutdown_now(&self) {
        self.server.stop_now();
    }

    /// Stops accepting and aborts open connections; waits for the listener to close.
    pub async fn shutdown(self) {
        self.server.stop().await;
    }
}

async fn handle(req: Request<Incoming>, state: Arc<State>) -> Response<Full<Bytes>> {
    let received_at = SystemTime::now();
    let (parts, body) = req.into_parts();
    let mut request = ProviderRequest::arrived(received_at, &parts, server::read_body(body).await);
    let path = request.path.clone();
    if path == "/token" {
        return token_endpoint(request, &state);
    }
    let send_path = format!("/v1/projects/{}/messages:send", state.project_id);
    request.token = request.json().and_then(|j| j["message"]["token"].as_str().map(str::to_owned)).unwrap_or_default();
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let bearer = request.bearer().map(str::to_owned);
    let live = bearer.is_some_and(|b| lock(&state.issued).get(&b).is_some_and(|expiry| Instant::now() < *expiry));
    request.auth_valid = Some(live);
    let reply = if parts.method != http::Method::POST || path != send_path {
        FcmReply::error(404, "NOT_FOUND")
    } else if !live {
        FcmReply::error(401, "UNAUTHENTICATED")
    } else if request.json().is_none_or(|message| !valid_message(&message)) {
        FcmReply::fcm_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT")
    } else {
        lock(&state.scripts).get_mut(&request.token).and_then(VecDeque::pop_front).unwrap_or_else(FcmReply::ok)
    };
    request.status_sent = reply.status;
    state.sends.record(request);
    let delay = state.latency + reply.delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let headers: Vec<(&str, String)> = reply.retry_after.iter().map(|v| ("retry-after", v.clone())).collect();
    server::response(reply.status, reply.body(&state.project_id, id), &headers)
}

/// FCM's rules on the fields fanout sets: `android.ttl` a Duration in
/// seconds (`"<n>s"`, optionally with up to nine decimals) of at most four
/// weeks; in the APNs block, `apns-expiration` a Unix time in seconds and
/// `apns-collapse-id` at most 64 bytes (APNs's limits, which FCM passes on).
fn valid_message(json: &serde_json::Value) -> bool {
    const MAX_TTL_SECONDS: u64 = 28 * 24 * 3600;
    let message = &json["message"];
    let ttl_ok = message["android"].get("ttl").is_none_or(|ttl| {
        ttl.as_str().and_then(|t| t.strip_suffix('s')).is_some_and(|t| {
            let (whole, fraction) = t.split_once('.').unwrap_or((t, ""));
            whole.parse::<u64>().is_ok_and(|n| n <= MAX_TTL_SECONDS)
                && fraction.len() <= 9
                && fraction.bytes().all(|b| b.is_ascii_digit())
        })
    });
    let headers = &message["apns"]["headers"];
    let expiration_ok =
        headers.get("apns-expiration").is_none_or(|e| e.as_str().is_some_and(|e| e.parse::<u64>().is_ok()));
    let collapse_ok = headers
        .get("apns-collapse-id")
        .is_none_or(|c| c.as_str().is_some_and(|c| c.len() <= super::apns::MAX_COLLAPSE_ID_BYTES));
    ttl_ok && expiration_ok && collapse_ok
}

fn token_endpoint(mut request: ProviderRequest, state: &State) -> Response<Full<Bytes>> {
    let form: HashMap<String, String> = String::from_utf8_lossy(&request.body)
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (percent_decode(k, true), percent_decode(v, true)))
        .collect();
    let grant_ok = form.get("grant_type").map(String::as_str) == Some(JWT_BEARER_GRANT);
    let valid = grant_ok
        && form
            .get("assertion")
            .is_some_and(|jwt| verify_assertion(jwt, &state.key, &state.client_email, &state.token_uri));
    request.auth_valid = Some(valid);
    let scripted = lock(&state.token_script).pop_front();
    let (status, body) = if request.method != "POST" {
        (405, serde_json::json!({"error": "invalid_request"}).to_string())
    } else if let Some(status) = scripted {
        (status, serde_json::json!({"error": "mock_failure", "error_description": "scripted"}).to_string())
    } else if !grant_ok {
        (400, serde_json::json!({"error": "unsupported_grant_type"}).to_string())
    } else if !valid {
        (400, serde_json::json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}).to_string())
    } else {
        let id = state.next_id.fetch_add(1, Ordering::Relaxed);
        let token = format!("ya29.mock-{id}-{:x}", unix_now());
        // A lifetime past the clock's range (the engine's tests ask for u64::MAX) never expires.
        let expires = Instant::now().checked_add(state.token_lifetime).unwrap_or_else(|| Instant::now() + FAR_FUTURE);
        lock(&state.issued).insert(token.clone(), expires);
        let body = serde_json::json!({
            "access_token": token,
            "expires_in": state.token_lifetime.as_secs(),
            "token_type": "Bearer",
        });
        (200, body.to_string())
    };
    request.status_sent = status;
    state.token_requests.record(request);
    server::response(status, body, &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use jsonwebtoken::{EncodingKey, Header};

    use crate::test_client::{TestClient, Versions, client};

    fn assertion(account: &FcmServiceAccount, iat: u64, aud: &str) -> String {
        let claims = serde_json::json!({
            "iss": account.client_email, "scope": FCM_SCOPE, "aud": aud, "iat": iat, "exp": iat + 3600,
        });
        let key = EncodingKey::from_rsa_pem(account.private_key_pem.as_bytes()).unwrap();
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &key).unwrap()
    }

    async fn post(
        client: &TestClient,
        url: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> (u16, http::HeaderMap, serde_json::Value) {
        let mut request = Request::post(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = client.request(request.body(Full::new(Bytes::from(body))).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
    }

    async fn fetch_token(client: &TestClient, mock: &MockFcm, jwt: &str) -> (u16, serde_json::Value) {
        let form = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={jwt}");
        let (status, _, body) =
            post(client, &mock.token_uri(), &[("content-type", "application/x-www-form-urlencoded")], form).await;
        (status, body)
    }

    fn message(token: &str) -> String {
        serde_json::json!({"message": {"token": token, "data": {"topic": "AAEC", "sequence_id": "1"}}}).to_string()
    }

    #[test]
    fn service_account_json_has_the_google_shape() {
        let account = FcmServiceAccount::test_only("p1", "https://127.0.0.1:1/token");
        let json: serde_json::Value = serde_json::from_str(&account.to_json()).unwrap();
        assert_eq!(json["type"], "service_account");
        assert_eq!(json["project_id"], "p1");
        assert_eq!(json["token_uri"], "https://127.0.0.1:1/token");
        assert!(json["private_key"].as_str().unwrap().starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(json["client_email"].as_str().unwrap().ends_with("@p1.iam.gserviceaccount.com"));
    }

    #[test]
    fn error_bodies_have_the_google_rpc_shape() {
        let body: serde_json::Value = serde_json::from_str(
            &FcmReply::fcm_error(404, "NOT_FOUND", "UNREGISTERED").with_quota_failure().body("p", 1),
        )
        .unwrap();
        assert_eq!(body["error"]["code"], 404);
        assert_eq!(body["error"]["status"], "NOT_FOUND");
        assert_eq!(body["error"]["details"][0]["@type"], QUOTA_FAILURE_TYPE);
        assert_eq!(body["error"]["details"][1]["@type"], FCM_ERROR_TYPE);
        assert_eq!(body["error"]["details"][1]["errorCode"], "UNREGISTERED");
        let plain: serde_json::Value =
            serde_json::from_str(&FcmReply::error(400, "INVALID_ARGUMENT").body("p", 1)).unwrap();
        assert!(plain["error"].get("details").is_none());
        assert_eq!(FcmReply::ok().body("p", 7), r#"{"name":"projects/p/messages/7"}"#);
    }

    #[tokio::test]
    async fn issues_tokens_for_valid_assertions_only() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockFcmConfig::default()).await.unwrap();
        let client = client(&pki, Versions::Any);
        let account = mock.service_account();
        let (status, body) = fetch_token(&client, &mock, &assertion(&account, unix_now(), &mock.token_uri())).await;
        assert_eq!(status, 200);
        assert_eq!(body["token_type"], "Bearer");
        assert_eq!(body["expires_in"], 3600);
        assert!(body["access_token"].as_str().unwrap().starts_with("ya29."));
        // Wrong audience, expired, or garbage.
        assert_eq!(
            fetch_token(&client, &mock, &assertion(&account, unix_now(), "https://elsewhere/token")).await.0,
            400
        );
        assert_eq!(
            fetch_token(&client, &mock, &assertion(&account, unix_now() - 7200, &mock.token_uri())).await.0,
            400
        );
        assert_eq!(fetch_token(&client, &mock, "a.b.c").await.0, 400);
        let valid: Vec<Option<bool>> = mock.token_requests().iter().map(|r| r.auth_valid).collect();
        assert_eq!(valid, vec![Some(true), Some(false), Some(false), Some(false)]);
        // Scripted failures come first, then tokens again.
        mock.script_token_endpoint(vec![503]);
        assert_eq!(fetch_token(&client, &mock, &assertion(&account, unix_now(), &mock.token_uri())).await.0, 503);
        assert_eq!(fetch_token(&client, &mock, &assertion(&account, unix_now(), &mock.token_uri())).await.0, 200);
        assert_eq!(mock.token_request_count(), 6);
    }

    #[tokio::test]
    async fn sends_need_a_live_token_and_follow_the_script() {
        let pki = TestPki::generate(&[]).unwrap();
        let mock = start(&pki, MockFcmConfig::default()).await.unwrap();
        let client = client(&pki, Versions::Any);
        let url = format!("{}/v1/projects/{}/messages:send", mock.base_url(), mock.project_id());
        let (_, body) =
            fetch_token(&client, &mock, &assertion(&mock.service_account(), unix_now(), &mock.token_uri())).await;
        let bearer = format!("Bearer {}", body["access_token"].as_str().unwrap());

        let (status, _, body) = post(&client, &url, &[("authorization", "Bearer nope")], message("r1")).await;
        assert_eq!((status, body["error"]["status"].as_str()), (401, Some("UNAUTHENTICATED")));

        mock.script("r1", vec![FcmReply::fcm_error(404, "NOT_FOUND", "UNREGISTERED").with_retry_after("30")]);
        let (status, headers, body) = post(&client, &url, &[("authorization", &bearer)], message("r1")).await;
        assert_eq!(status, 404);
        assert_eq!(headers["retry-after"], "30");
        assert_eq!(body["error"]["details"][0]["errorCode"], "UNREGISTERED");
        let (status, _, body) = post(&client, &url, &[("authorization", &bearer)], message("r1")).await;
        assert_eq!(status, 200);
        assert!(body["name"].as_str().unwrap().starts_with("projects/fanout-test-project/messages/"));

        // Another project's path is not found.
        let other = format!("{}/v1/projects/other/messages:send", mock.base_url());
        assert_eq!(post(&client, &other, &[("authorization", &bearer)], message("r1")).await.0, 404);

        // FCM's rules on ttl, apns-expiration and apns-collapse-id.
        let with = |android: serde_json::Value, headers: serde_json::Value| {
            serde_json::json!({"message": {"token": "r2", "android": android, "apns": {"headers": headers}}})
                .to_string()
        };
        let good = with(
            serde_json::json!({"ttl": "86400s"}),
            serde_json::json!({"apns-expiration": "0", "apns-collapse-id": "c".repeat(64)}),
        );
        assert_eq!(post(&client, &url, &[("authorization", &bearer)], good).await.0, 200);
        assert_eq!(
            post(
                &client,
                &url,
                &[("authorization", &bearer)],
                with(serde_json::json!({"ttl": "1.5s"}), serde_json::json!({}))
            )
            .await
            .0,
            200
        );
        for (android, headers) in [
            (serde_json::json!({"ttl": "86400"}), serde_json::json!({})),
            (serde_json::json!({"ttl": "2419201s"}), serde_json::json!({})),
            (serde_json::json!({"ttl": 60}), serde_json::json!({})),
            (serde_json::json!({}), serde_json::json!({"apns-expiration": "tomorrow"})),
            (serde_json::json!({}), serde_json::json!({"apns-collapse-id": "c".repeat(65)})),
        ] {
            let (status, _, body) =
                post(&client, &url, &[("authorization", &bearer)], with(android.clone(), headers.clone())).await;
            assert_eq!(
                (status, body["error"]["status"].as_str()),
                (400, Some("INVALID_ARGUMENT")),
                "{android} {headers}"
            );
        }

        mock.revoke_access_tokens();
        assert_eq!(post(&client, &url, &[("authorization", &bearer)], message("r1")).await.0, 401);

        let got = mock.wait_for_token("r1", 5, Duration::from_secs(5)).await;
        let auth: Vec<Option<bool>> = got.iter().map(|r| r.auth_valid).collect();
        assert_eq!(auth, vec![Some(false), Some(true), Some(true), Some(true), Some(false)]);
        assert_eq!(got[1].json().unwrap()["message"]["token"], "r1");
    }
}
