//! Mock APNs provider: HTTP/2 over TLS (ALPN `h2` only, as APNs), serving
//! `POST /3/device/<token>`. It verifies the ES256 provider token against a
//! configured public key, refuses what APNs refuses (a collapse id over 64
//! bytes, an expiration that is not a number), records every request (or
//! only counts them, for load runs), counts what arrives on the wire
//! ([`crate::wire`]), and answers from a hook or a script per device token
//! (default: 200 with an `apns-id` header).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::Deserialize;

use super::provider::{MAX_CONCURRENT_STREAMS, ProviderRequest, unix_now};
use crate::lock;
use crate::outage::Outage;
use crate::pki::{ALPN_H2, TestPki};
use crate::recorder::Recorder;
use crate::request::{bearer, percent_decode};
use crate::server::{self, Server};
use crate::wire::{WireCounts, WireStats};

/// APNs refuses provider tokens older than this (ExpiredProviderToken).
const PROVIDER_TOKEN_LIFETIME_SECS: u64 = 3600;
/// APNs refuses a longer `apns-collapse-id` (BadCollapseId).
pub const MAX_COLLAPSE_ID_BYTES: usize = 64;
/// Verified provider tokens kept (the cache is emptied when full).
const MAX_VERIFIED_TOKENS: usize = 1024;

/// How the mock listens, authenticates and answers by default.
#[derive(Clone, Debug)]
pub struct MockApnsConfig {
    /// Listen address; port 0 picks a free port.
    pub bind: SocketAddr,
    /// Added before every answer.
    pub latency: Duration,
    /// Expected JWT `iss`.
    pub team_id: String,
    /// Expected JWT `kid`.
    pub key_id: String,
    /// The provider key's public half (SPKI PEM). With it, every request's
    /// token is verified and an invalid one is answered 403
    /// InvalidProviderToken; without it, `auth_valid` is `None`.
    pub public_key_pem: Option<String>,
    /// Keep every request for [`MockApns::received`] (default). Load runs
    /// turn it off: requests are then only counted.
    pub record_requests: bool,
    /// Sees every request; answers those APNs would accept.
    pub on_request: Option<ApnsHook>,
    /// Also accept a token whose ES256 signature is DER-encoded, as Java's
    /// `SHA256withECDSA` makes it and Pushy's client sends it (APNs takes
    /// both). Off by default: the engine must sign as RFC 7518 says (R ‖ S).
    pub accept_der_signatures: bool,
}

impl Default for MockApnsConfig {
    fn default() -> Self {
        MockApnsConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            latency: Duration::ZERO,
            team_id: "TEAM123456".into(),
            key_id: "KEY1234567".into(),
            public_key_pem: None,
            record_requests: true,
            on_request: None,
            accept_der_signatures: false,
        }
    }
}

/// A request as an [`ApnsHook`] sees it (borrowed, nothing copied).
pub struct ApnsHookRequest<'a> {
    /// The device token, decoded from the path.
    pub token: &'a str,
    pub headers: &'a http::HeaderMap,
    pub body: &'a [u8],
    /// APNs's answer when the request breaks one of its rules (method,
    /// path, provider token, collapse id, expiration); the hook's answer is
    /// then not used.
    pub refusal: Option<&'a ApnsReply>,
}

type ApnsHookFn = dyn Fn(&ApnsHookRequest<'_>) -> Option<ApnsReply> + Send + Sync;

/// Callback for [`MockApnsConfig::on_request`], run on the connection's task
/// for every request: `Some(reply)` answers an accepted request, `None`
/// leaves it to the script (then 200).
#[derive(Clone)]
pub struct ApnsHook(pub Arc<ApnsHookFn>);

impl ApnsHook {
    pub fn new(f: impl Fn(&ApnsHookRequest<'_>) -> Option<ApnsReply> + Send + Sync + 'static) -> Self {
        ApnsHook(Arc::new(f))
    }
}

impl std::fmt::Debug for ApnsHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApnsHook")
    }
}

/// One scripted APNs answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApnsReply {
    pub status: u16,
    /// Sent as `{"reason":"..."}`.
    pub reason: Option<String>,
    pub retry_after: Option<String>,
    /// Wait before answering; longer than the client's timeout simulates a
    /// provider that never answers.
    pub delay: Duration,
}

impl ApnsReply {
    /// 200, no body.
    pub fn ok() -> Self {
        Self::status(200)
    }

    /// `status` with no body.
    pub fn status(status: u16) -> Self {
        ApnsReply { status, reason: None, retry_after: None, delay: Duration::ZERO }
    }

    /// `status` with `{"reason":"<reason>"}`.
    pub fn reason(status: u16, reason: &str) -> Self {
        ApnsReply { reason: Some(reason.into()), ..Self::status(status) }
    }

    pub fn with_retry_after(mut self, value: impl Into<String>) -> Self {
        self.retry_after = Some(value.into());
        self
    }

    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// An EC P-256 provider key, as Apple issues it (`.p8`: PEM PKCS#8).
#[derive(Clone, Debug)]
pub struct ApnsTestKey {
    /// PEM PKCS#8 private key (the `.p8` file's content).
    pub private_pem: String,
    /// PEM SPKI public key (for [`MockApnsConfig::public_key_pem`]).
    pub public_pem: String,
}

impl ApnsTestKey {
    pub fn generate() -> anyhow::Result<Self> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).context("generating EC P-256 key")?;
        Ok(ApnsTestKey { private_pem: key.serialize_pem(), public_pem: key.public_key_pem() })
    }

    /// Writes the private key as a `.p8` file.
    pub fn write_p8(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, &self.private_pem).with_context(|| format!("writing APNs key to {}", path.display()))
    }

    /// A provider token as APNs expects it: ES256, `kid` = `key_id`, claims
    /// `iss` = `team_id` and `iat`.
    pub fn provider_token(&self, key_id: &str, team_id: &str, iat: u64) -> anyhow::Result<String> {
        let mut header = Header::new(Algorithm::ES256);
        header.typ = None;
        header.kid = Some(key_id.into());
        let key = EncodingKey::from_ec_pem(self.private_pem.as_bytes()).context("the test key is not an EC key")?;
        let claims = serde_json::json!({"iss": team_id, "iat": iat});
        jsonwebtoken::encode(&header, &claims, &key).context("signing a provider token")
    }
}

#[derive(Deserialize)]
struct ProviderClaims {
    iss: String,
    iat: u64,
}

/// Why a provider token was refused, as APNs would say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenCheck {
    Valid,
    Missing,
    Invalid,
    Expired,
}

/// Verifies an APNs provider token: ES256 under `key`, `kid` = `key_id`,
/// `iss` = `team_id`, `iat` not in the future and at most an hour old.
pub fn verify_provider_token(jwt: &str, key: &DecodingKey, team_id: &str, key_id: &str) -> bool {
    signed_iat(jwt, key, team_id, key_id).is_some_and(|iat| token_age(iat) == TokenCheck::Valid)
}

/// The `iat` of a token whose signature, `kid` and `iss` verify.
fn signed_iat(jwt: &str, key: &DecodingKey, team_id: &str, key_id: &str) -> Option<u64> {
    let mut validation = Validation::new(Algorithm::ES256);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    let data = jsonwebtoken::decode::<ProviderClaims>(jwt, key, &validation).ok()?;
    (data.header.kid.as_deref() == Some(key_id) && data.claims.iss == team_id).then_some(data.claims.iat)
}

/// `jwt` with its DER-encoded ECDSA signature (`SEQUENCE { INTEGER r,
/// INTEGER s }`) re-encoded as JWS's 64-byte R ‖ S; `None` when the
/// signature is not a P-256 one in DER.
fn with_jose_signature(jwt: &str) -> Option<String> {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (signed, signature) = jwt.rsplit_once('.')?;
    let der = URL_SAFE_NO_PAD.decode(signature).ok()?;
    let rest = match der.as_slice() {
        [0x30, len, rest @ ..] if usize::from(*len) == rest.len() => rest,
        _ => return None,
    };
    let (r, rest) = der_integer(rest)?;
    let (s, rest) = der_integer(rest)?;
    if !rest.is_empty() {
        return None;
    }
    let mut jose = [0u8; 64];
    jose[32 - r.len()..32].copy_from_slice(r);
    jose[64 - s.len()..].copy_from_slice(s);
    Some(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(jose)))
}

/// A DER INTEGER's magnitude (at most 32 bytes, its sign byte dropped) and
/// what follows it.
fn der_integer(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let [0x02, len, rest @ ..] = der else { return None };
    let len = usize::from(*len);
    if len == 0 || len > rest.len() {
        return None;
    }
    let (mut value, rest) = rest.split_at(len);
    while let [0, tail @ ..] = value {
        value = tail;
    }
    (value.len() <= 32).then_some((value, rest))
}

/// A verified token issued at `iat`, judged now.
fn token_age(iat: u64) -> TokenCheck {
    let now = unix_now();
    if iat > now + 60 {
        TokenCheck::Invalid
    } else if now.saturating_sub(iat) > PROVIDER_TOKEN_LIFETIME_SECS {
        TokenCheck::Expired
    } else {
        TokenCheck::Valid
    }
}

/// Provider-token checks, each token's signature verified once: a client
/// sends the same token for up to an hour, and verifying ES256 on every
/// request would make the mock, not the client, the bottleneck of a load run.
struct TokenVerifier {
    key: DecodingKey,
    team_id: String,
    key_id: String,
    /// `MockApnsConfig::accept_der_signatures`.
    accept_der: bool,
    /// Token → its `iat` when it verified, `None` when it did not.
    verified: Mutex<HashMap<String, Option<u64>>>,
}

impl TokenVerifier {
    fn check(&self, jwt: Option<&str>) -> TokenCheck {
        let Some(jwt) = jwt else {
            return TokenCheck::Missing;
        };
        let cached = lock(&self.verified).get(jwt).copied();
        let iat = cached.unwrap_or_else(|| {
            let verify = |jwt: &str| signed_iat(jwt, &self.key, &self.team_id, &self.key_id);
            let iat = verify(jwt)
                .or_else(|| if self.accept_der { with_jose_signature(jwt).and_then(|j| verify(&j)) } else { None });
            let mut verified = lock(&self.verified);
            if verified.len() >= MAX_VERIFIED_TOKENS {
                verified.clear();
            }
            verified.insert(jwt.to_owned(), iat);
            iat
        });
        iat.map_or(TokenCheck::Invalid, token_age)
    }
}

/// APNs's refusal of a request's headers: a collapse id over 64 bytes, an
/// expiration that is not a Unix time in seconds.
fn header_refusal(headers: &http::HeaderMap) -> Option<ApnsReply> {
    if headers.get("apns-collapse-id").is_some_and(|v| v.len() > MAX_COLLAPSE_ID_BYTES) {
        return Some(ApnsReply::reason(400, "BadCollapseId"));
    }
    let expiration = headers.get("apns-expiration").map(|v| v.to_str().ok().and_then(|t| t.parse::<u64>().ok()));
    if expiration == Some(None) {
        return Some(ApnsReply::reason(400, "BadExpirationDate"));
    }
    None
}

struct State {
    latency: Duration,
    verifier: Option<TokenVerifier>,
    recorder: Recorder<ProviderRequest>,
    record_requests: bool,
    on_request: Option<ApnsHook>,
    scripts: Mutex<HashMap<String, VecDeque<ApnsReply>>>,
    seen_tokens: Mutex<HashSet<String>>,
    expired_tokens: Mutex<HashSet<String>>,
    wire: Arc<WireStats>,
    next_id: AtomicU64,
}

/// A running mock APNs. The server stops when this is dropped.
pub struct MockApns {
    server: Server,
    state: Arc<State>,
    outage: Outage,
}

/// APNs's body with a 503 (its reason for a server that cannot take pushes).
const UNAVAILABLE_BODY: &str = r#"{"reason":"ServiceUnavailable"}"#;

/// Binds, then serves in a background task until the `MockApns` is dropped.
pub async fn start(pki: &TestPki, config: MockApnsConfig) -> anyhow::Result<MockApns> {
    let verifier = match &config.public_key_pem {
        Some(pem) => Some(TokenVerifier {
            key: DecodingKey::from_ec_pem(pem.as_bytes()).context("the APNs public key is not an EC PEM key")?,
            team_id: config.team_id,
            key_id: config.key_id,
            accept_der: config.accept_der_signatures,
            verified: Mutex::new(HashMap::new()),
        }),
        None => None,
    };
    let listener = server::bind("mock APNs", config.bind).await?;
    let outage = Outage::new();
    let wire = Arc::new(WireStats::default());
    let state = Arc::new(State {
        latency: config.latency,
        verifier,
        recorder: Recorder::new(),
        record_requests: config.record_requests,
        on_request: config.on_request,
        scripts: Mutex::new(HashMap::new()),
        seen_tokens: Mutex::new(HashSet::new()),
        expired_tokens: Mutex::new(HashSet::new()),
        wire: wire.clone(),
        next_id: AtomicU64::new(1),
    });
    let options = server::Options {
        alpn: vec![ALPN_H2.to_vec()],
        max_concurrent_streams: MAX_CONCURRENT_STREAMS,
        wire: Some(wire),
        outage: Some(outage.clone()),
        unavailable_body: UNAVAILABLE_BODY,
    };
    let handler_state = state.clone();
    let server = Server::serve(listener, pki, options, move |req| handle(req, handler_state.clone()))?;
    Ok(MockApns { server, state, outage })
}

impl MockApns {
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `https://127.0.0.1:<port>`: the engine's `production_url`/`sandbox_url`.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// The switch that makes this APNs hang, refuse connections, stall in
    /// the TLS handshake, answer slowly or answer 503 ([`crate::outage`]).
    /// Requests an outage meets are counted there, not recorded here.
    pub fn outage(&self) -> &Outage {
        &self.outage
    }

    /// Every request so far, in arrival order (none when `record_requests` is off).
    pub fn received(&self) -> Vec<ProviderRequest> {
        self.state.recorder.all()
    }

    /// The requests for one device token, in arrival order.
    pub fn received_for(&self, token: &str) -> Vec<ProviderRequest> {
        self.state.recorder.for_token(token)
    }

    pub fn received_count(&self) -> usize {
        self.state.recorder.count()
    }

    /// What clients sent on the wire so far: bytes, requests, header-block
    /// bytes, `authorization` literal bytes.
    pub fn wire(&self) -> WireCounts {
        self.state.wire.counts()
    }

    /// Waits until at least `n` requests arrived or `timeout` passed; returns all.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<ProviderRequest> {
        self.state.recorder.wait_for(n, timeout).await
    }

    /// Waits until at least `n` requests for `token` arrived or `timeout`
    /// passed; returns those for `token`.
    pub async fn wait_for_token(&self, token: &str, n: usize, timeout: Duration) -> Vec<ProviderRequest> {
        self.state.recorder.wait_for_token(token, n, timeout).await
    }

    /// The next requests for device `token` get `replies` in order, then 200.
    pub fn script(&self, token: &str, replies: Vec<ApnsReply>) {
        lock(&self.state.scripts).entry(token.to_string()).or_default().extend(replies);
    }

    /// Every provider token seen so far is expired from now on: requests
    /// carrying one are answered 403 ExpiredProviderToken (scripts untouched).
    pub fn expire_provider_tokens(&self) {
        let seen = lock(&self.state.seen_tokens).clone();
        lock(&self.state.expired_tokens).extend(seen);
    }

    pub fn clear_received(&self) {
        self.state.recorder.clear();
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
    let body = server::read_body(body).await;
    let token = parts.uri.path().strip_prefix("/3/device/").map(|t| percent_decode(t, false));
    let jwt = bearer(parts.headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()));
    let check = state.verifier.as_ref().map(|v| v.check(jwt));
    let revoked = jwt.is_some_and(|j| lock(&state.expired_tokens).contains(j));
    if let Some(jwt) = jwt {
        let mut seen = lock(&state.seen_tokens);
        if !seen.contains(jwt) {
            seen.insert(jwt.to_owned());
        }
    }

    // As APNs: the path and method first, then the provider token, then the
    // headers, then the device.
    let refusal = if parts.method != http::Method::POST {
        Some(ApnsReply::reason(405, "MethodNotAllowed"))
    } else if token.as_deref().is_none_or(str::is_empty) {
        Some(ApnsReply::reason(404, "BadPath"))
    } else if check == Some(TokenCheck::Missing) {
        Some(ApnsReply::reason(403, "MissingProviderToken"))
    } else if check == Some(TokenCheck::Invalid) {
        Some(ApnsReply::reason(403, "InvalidProviderToken"))
    } else if revoked || check == Some(TokenCheck::Expired) {
        Some(ApnsReply::reason(403, "ExpiredProviderToken"))
    } else {
        header_refusal(&parts.headers)
    };
    let token = token.unwrap_or_default();
    let hooked = state.on_request.as_ref().and_then(|hook| {
        (hook.0)(&ApnsHookRequest { token: &token, headers: &parts.headers, body: &body, refusal: refusal.as_ref() })
    });
    let reply = match refusal {
        Some(refusal) => refusal,
        None => hooked.unwrap_or_else(|| {
            lock(&state.scripts).get_mut(&token).and_then(VecDeque::pop_front).unwrap_or_else(ApnsReply::ok)
        }),
    };

    // Record before any delay so tests see requests whose answer is pending.
    if state.record_requests {
        let mut request = ProviderRequest::arrived(received_at, &parts, body);
        request.token = token;
        request.auth_valid = check.map(|c| c == TokenCheck::Valid);
        request.status_sent = reply.status;
        state.recorder.record(request);
    } else {
        state.recorder.count_only();
    }

    let delay = state.latency + reply.delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let mut headers = vec![("apns-id", format!("00000000-0000-4000-8000-{id:012x}"))];
    if let Some(value) = &reply.retry_after {
        headers.push(("retry-after", value.clone()));
    }
    let body = match (&reply.reason, reply.status) {
        (Some(reason), 410) => serde_json::json!({"reason": reason, "timestamp": unix_now() * 1000}).to_string(),
        (Some(reason), _) => serde_json::json!({"reason": reason}).to_string(),
        (None, _) => String::new(),
    };
    server::response(reply.status, body, &headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    use crate::test_client::{TestClient, Versions, client};

    const WAIT: Duration = Duration::from_secs(5);

    fn jwt(key: &ApnsTestKey, kid: &str, iss: &str, iat: u64) -> String {
        key.provider_token(kid, iss, iat).unwrap()
    }

    /// `jwt` with its R ‖ S signature DER-encoded, as Java signs.
    fn with_der_signature(jwt: &str) -> String {
        use base64::Engine as _;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (signed, signature) = jwt.rsplit_once('.').unwrap();
        let rs = URL_SAFE_NO_PAD.decode(signature).unwrap();
        let integer = |half: &[u8]| {
            let mut value: Vec<u8> = half.iter().copied().skip_while(|b| *b == 0).collect();
            if value.first().is_none_or(|b| b & 0x80 != 0) {
                value.insert(0, 0); // DER keeps an INTEGER positive
            }
            [vec![0x02, value.len() as u8], value].concat()
        };
        let body = [integer(&rs[..32]), integer(&rs[32..])].concat();
        let der = [vec![0x30, body.len() as u8], body].concat();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(der))
    }

    #[test]
    fn der_signatures_verify_only_where_accepted() {
        let key = ApnsTestKey::generate().unwrap();
        let verifier = |accept_der| TokenVerifier {
            key: DecodingKey::from_ec_pem(key.public_pem.as_bytes()).unwrap(),
            team_id: "TEAM".into(),
            key_id: "KID".into(),
            accept_der,
            verified: Mutex::new(HashMap::new()),
        };
        let (strict, lenient) = (verifier(false), verifier(true));
        for _ in 0..20 {
            // Each token's R and S differ: some need the sign byte, some are shorter.
            let jose = jwt(&key, "KID", "TEAM", unix_now());
            let der = with_der_signature(&jose);
            assert_eq!(with_jose_signature(&der).as_deref(), Some(jose.as_str()), "round trip");
            assert_eq!((strict.check(Some(&jose)), lenient.check(Some(&jose))), (TokenCheck::Valid, TokenCheck::Valid));
            assert_eq!(strict.check(Some(&der)), TokenCheck::Invalid, "DER only where accepted");
            assert_eq!(lenient.check(Some(&der)), TokenCheck::Valid);
        }
        let other = ApnsTestKey::generate().unwrap();
        let forged = with_der_signature(&jwt(&other, "KID", "TEAM", unix_now()));
        assert_eq!(lenient.check(Some(&forged)), TokenCheck::Invalid, "another key's DER token");
        assert_eq!(lenient.check(Some("a.b.c")), TokenCheck::Invalid);
    }

    async fn post(client: &TestClient, url: &str, jwt: Option<&str>) -> (u16, http::HeaderMap, String) {
        post_with(client, url, jwt, &[]).await
    }

    async fn post_with(
        client: &TestClient,
        url: &str,
        jwt: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, http::HeaderMap, String) {
        let mut request = Request::post(url).header("apns-topic", "com.example");
        if let Some(jwt) = jwt {
            request = request.header("authorization", format!("bearer {jwt}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = client.request(request.body(Full::new(Bytes::from_static(b"{}"))).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    async fn setup() -> (TestPki, ApnsTestKey, MockApns) {
        let pki = TestPki::generate(&[]).unwrap();
        let key = ApnsTestKey::generate().unwrap();
        let config = MockApnsConfig { public_key_pem: Some(key.public_pem.clone()), ..Default::default() };
        let mock = start(&pki, config).await.unwrap();
        (pki, key, mock)
    }

    #[test]
    fn generated_keys_are_pkcs8_p256() {
        let key = ApnsTestKey::generate().unwrap();
        assert!(key.private_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(key.public_pem.starts_with("-----BEGIN PUBLIC KEY-----"));
        let token = jwt(&key, "KID", "TEAM", unix_now());
        let decoding = DecodingKey::from_ec_pem(key.public_pem.as_bytes()).unwrap();
        assert!(verify_provider_token(&token, &decoding, "TEAM", "KID"));
        assert!(!verify_provider_token(&token, &decoding, "OTHER", "KID"));
        assert!(!verify_provider_token(&token, &decoding, "TEAM", "OTHER"));
        let other = ApnsTestKey::generate().unwrap();
        assert!(!verify_provider_token(&jwt(&other, "KID", "TEAM", unix_now()), &decoding, "TEAM", "KID"));
    }

    #[tokio::test]
    async fn records_verifies_and_answers_200_by_default() {
        let (pki, key, mock) = setup().await;
        let client = client(&pki, Versions::Http2);
        let token = jwt(&key, "KEY1234567", "TEAM123456", unix_now());
        let (status, headers, body) =
            post(&client, &format!("{}/3/device/abc%2F1", mock.base_url()), Some(&token)).await;
        assert_eq!(status, 200);
        assert!(headers.contains_key("apns-id"));
        assert!(body.is_empty());
        let got = mock.wait_for(1, WAIT).await;
        assert_eq!(got[0].token, "abc/1");
        assert_eq!(got[0].path, "/3/device/abc%2F1");
        assert_eq!(got[0].version, "HTTP/2.0");
        assert_eq!(got[0].auth_valid, Some(true));
        assert_eq!(got[0].bearer(), Some(token.as_str()));
        assert_eq!(got[0].header("apns-topic"), Some("com.example"));
    }

    #[tokio::test]
    async fn refuses_bad_missing_and_old_provider_tokens() {
        let (pki, key, mock) = setup().await;
        let client = client(&pki, Versions::Http2);
        let url = format!("{}/3/device/abc", mock.base_url());
        let (status, _, body) = post(&client, &url, None).await;
        assert_eq!((status, body.as_str()), (403, r#"{"reason":"MissingProviderToken"}"#));
        let wrong_team = jwt(&key, "KEY1234567", "OTHER", unix_now());
        assert_eq!(post(&client, &url, Some(&wrong_team)).await.2, r#"{"reason":"InvalidProviderToken"}"#);
        let old = jwt(&key, "KEY1234567", "TEAM123456", unix_now() - 7200);
        assert_eq!(post(&client, &url, Some(&old)).await.2, r#"{"reason":"ExpiredProviderToken"}"#);
        let valid: Vec<Option<bool>> = mock.received().iter().map(|r| r.auth_valid).collect();
        assert_eq!(valid, vec![Some(false), Some(false), Some(false)]);
    }

    #[tokio::test]
    async fn scripts_per_device_token_and_expiry_of_seen_tokens() {
        let (pki, key, mock) = setup().await;
        let client = client(&pki, Versions::Http2);
        let token = jwt(&key, "KEY1234567", "TEAM123456", unix_now());
        mock.script("dead", vec![ApnsReply::reason(410, "Unregistered"), ApnsReply::status(503).with_retry_after("3")]);
        let dead = format!("{}/3/device/dead", mock.base_url());
        let (status, _, body) = post(&client, &dead, Some(&token)).await;
        assert_eq!(status, 410);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["reason"], "Unregistered");
        assert!(json["timestamp"].is_u64());
        let (status, headers, _) = post(&client, &dead, Some(&token)).await;
        assert_eq!((status, headers["retry-after"].to_str().unwrap()), (503, "3"));
        assert_eq!(post(&client, &dead, Some(&token)).await.0, 200);

        mock.expire_provider_tokens();
        let (status, _, body) = post(&client, &dead, Some(&token)).await;
        assert_eq!((status, body.as_str()), (403, r#"{"reason":"ExpiredProviderToken"}"#));
        // A new token (another signature) is accepted.
        let fresh = jwt(&key, "KEY1234567", "TEAM123456", unix_now());
        assert_eq!(post(&client, &dead, Some(&fresh)).await.0, 200);
        assert_eq!(mock.received_for("dead").len(), 5);
        assert_eq!(mock.wait_for_token("dead", 5, WAIT).await.len(), 5);
    }

    #[tokio::test]
    async fn refuses_collapse_ids_over_64_bytes_and_bad_expirations() {
        let (pki, key, mock) = setup().await;
        let client = client(&pki, Versions::Http2);
        let token = jwt(&key, "KEY1234567", "TEAM123456", unix_now());
        let url = format!("{}/3/device/abc", mock.base_url());
        let post = |headers: Vec<(&'static str, String)>| {
            let (client, url, token) = (&client, &url, &token);
            async move {
                let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
                let (status, _, body) = post_with(client, url, Some(token), &headers).await;
                (status, body)
            }
        };
        assert_eq!(post(vec![("apns-collapse-id", "c".repeat(64))]).await.0, 200);
        assert_eq!(
            post(vec![("apns-collapse-id", "c".repeat(65))]).await,
            (400, r#"{"reason":"BadCollapseId"}"#.into())
        );
        assert_eq!(post(vec![("apns-expiration", "0".into())]).await.0, 200);
        assert_eq!(post(vec![("apns-expiration", "1700000000".into())]).await.0, 200);
        for bad in ["soon", "-1", "1.5", ""] {
            let answer = post(vec![("apns-expiration", bad.into())]).await;
            assert_eq!(answer, (400, r#"{"reason":"BadExpirationDate"}"#.into()), "{bad:?}");
        }
        // The request is recorded with the header as sent, and its answer.
        let got = mock.received();
        assert_eq!((got[1].header("apns-collapse-id").map(str::len), got[1].status_sent), (Some(65), 400));
    }

    /// Load runs: a hook answers, requests are only counted, and the wire
    /// counts give bytes per request, the `authorization` literal included.
    #[tokio::test]
    async fn a_hook_answers_and_the_wire_is_counted() {
        let pki = TestPki::generate(&[]).unwrap();
        let key = ApnsTestKey::generate().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook = {
            let seen = seen.clone();
            ApnsHook::new(move |r| {
                lock(&seen).push((r.token.to_owned(), r.refusal.map(|x| x.status), r.body.len()));
                (r.token == "busy").then(|| ApnsReply::reason(503, "ServiceUnavailable"))
            })
        };
        let config = MockApnsConfig {
            public_key_pem: Some(key.public_pem.clone()),
            record_requests: false,
            on_request: Some(hook),
            ..Default::default()
        };
        let mock = start(&pki, config).await.unwrap();
        let client = client(&pki, Versions::Http2);
        let token = jwt(&key, "KEY1234567", "TEAM123456", unix_now());
        let url = |device: &str| format!("{}/3/device/{device}", mock.base_url());
        assert_eq!(post(&client, &url("ok"), Some(&token)).await.0, 200);
        assert_eq!(post(&client, &url("busy"), Some(&token)).await.0, 503);
        assert_eq!(post(&client, &url("busy"), None).await.0, 403, "a refusal is not the hook's to change");
        assert_eq!(post(&client, &url("ok"), Some(&token)).await.0, 200);
        assert_eq!(
            *lock(&seen),
            [("ok".into(), None, 2), ("busy".into(), None, 2), ("busy".into(), Some(403), 2), ("ok".into(), None, 2)]
        );
        assert_eq!((mock.received_count(), mock.received().len()), (4, 0), "counted, not kept");
        let wire = mock.wire();
        assert_eq!(wire.requests, 4);
        assert_eq!(wire.data_bytes, 8, "four bodies of 2 bytes");
        assert!(wire.bytes > wire.header_block_bytes + wire.data_bytes, "{wire:?}");
        // Three requests carried `bearer <jwt>` as a literal: more than the
        // token's Huffman-coded length each, less than its raw length.
        let jwt_len = token.len() as u64 + 7;
        assert!((3 * jwt_len * 5 / 8..=3 * (jwt_len + 4)).contains(&wire.authorization_bytes), "{wire:?}");
    }

    #[tokio::test]
    async fn offers_only_http2() {
        let (pki, _key, mock) = setup().await;
        let h1 = client(&pki, Versions::Http1);
        let request = Request::post(format!("{}/3/device/abc", mock.base_url())).body(Full::new(Bytes::new())).unwrap();
        assert!(h1.request(request).await.is_err(), "an HTTP/1.1-only client cannot talk to APNs");
    }
}
