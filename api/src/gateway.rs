//! Spec 002 on the product HTTP listener (`server.api_listen`), with
//! `[engine.gateway]`:
//!
//! - `POST /_arkret/edge/push/register-device`, `/unregister-device`
//!   (the Station role, §3.1–3.2), with `[station]`: the account is the
//!   authenticated session's (`Session` below), never the body's;
//! - `POST /_arkret/edge/push/notify` (the Gateway role, §5), authenticated
//!   service to service by an RFC 9421 HTTP message signature (Ed25519 keys
//!   per `Source-Service-ID`, `[[engine.gateway.source_services]]`).
//!
//! Errors are RFC 9457 problem bodies (`problem::Problem`) whose `code` is a
//! fixed symbol and whose `detail` names the rule, never a value: no push
//! key, account, device id or pseudonym reaches a response or a log line.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use fanout_engine::domain::{AccountId, ServiceId};
use fanout_engine::gateway::schema::NotifyHeaders;
use fanout_engine::gateway::schema::{Operation, RegisterDevice, SchemaViolation, UnregisterDevice, check_operation};
use fanout_engine::gateway::service::{GatewayService, NotifyError, StationError};
use fanout_engine::gateway::signature::{self, SignatureError, SignedRequest};
use fanout_engine::metrics::Metrics;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use strum::VariantArray;

use crate::problem::Problem;

/// A Station body is a few short fields.
const MAX_STATION_BODY: usize = 16 * 1024;
/// Notify is bounded by its devices (at most `max_devices_per_notify`).
const MAX_NOTIFY_BODY: usize = 256 * 1024;

/// `[station]`: the Station role of this deployment.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawStation")]
pub struct StationSettings {
    /// The tenant its registrations are kept under: the `Source-Service-ID`
    /// its notifying service sends (§3.4 tenant partition), so that notify
    /// finds them.
    pub service_id: ServiceId,
    /// Bearer sessions: lines `<sha256 hex of the token> <account_id>`.
    pub session_tokens_file: Option<PathBuf>,
    /// A header that a trusted front proxy sets to the authenticated
    /// account id; honoured only from `trusted_proxies`.
    pub proxy_account_header: Option<header::HeaderName>,
    pub trusted_proxies: Vec<IpAddr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStation {
    service_id: ServiceId,
    #[serde(default)]
    session_tokens_file: Option<PathBuf>,
    #[serde(default)]
    proxy_account_header: Option<String>,
    #[serde(default)]
    trusted_proxies: Vec<IpAddr>,
}

impl TryFrom<RawStation> for StationSettings {
    type Error = String;

    fn try_from(raw: RawStation) -> Result<Self, String> {
        let proxy_account_header = match raw.proxy_account_header {
            Some(h) => Some(
                header::HeaderName::try_from(h.to_ascii_lowercase())
                    .map_err(|_| "proxy_account_header must be an HTTP header name".to_owned())?,
            ),
            None => None,
        };
        if raw.session_tokens_file.is_none() && proxy_account_header.is_none() {
            return Err("set session_tokens_file, proxy_account_header, or both: sessions need a verifier".into());
        }
        if proxy_account_header.is_some() && raw.trusted_proxies.is_empty() {
            return Err("proxy_account_header needs trusted_proxies (the front proxy's addresses)".into());
        }
        Ok(Self {
            service_id: raw.service_id,
            session_tokens_file: raw.session_tokens_file,
            proxy_account_header,
            trusted_proxies: raw.trusted_proxies,
        })
    }
}

/// The session verifier of the Station role (§3.1 "服务端必须从 session grant
/// 取得 exact AccountId"): a bearer token whose SHA-256 is listed in the
/// tokens file, or the account id a trusted front proxy put in its header
/// (the proxy authenticated the session; a request from any other peer that
/// carries the header is refused, not trusted).
///
/// §3.1 also asks that the service DID equal `account_id.station_id`. The
/// account id is opaque text here (the seed does not define its
/// structure), so that check is the verifier's: it must assert only
/// accounts of `station.service_id` (docs/GATEWAY.md reading 27).
pub struct Session {
    tokens: HashMap<[u8; 32], AccountId>,
    proxy_header: Option<header::HeaderName>,
    trusted_proxies: Vec<IpAddr>,
}

/// Why a session file cannot be used. Names the line, never its content.
#[derive(Debug, thiserror::Error)]
pub enum SessionFileError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path} line {line}: expected `<sha256 hex of the token> <account_id>`")]
    Line { path: String, line: usize },
}

impl Session {
    pub fn load(settings: &StationSettings) -> Result<Self, SessionFileError> {
        let tokens = match &settings.session_tokens_file {
            Some(path) => read_tokens(path)?,
            None => HashMap::new(),
        };
        Ok(Self {
            tokens,
            proxy_header: settings.proxy_account_header.clone(),
            trusted_proxies: settings.trusted_proxies.clone(),
        })
    }

    /// The session's account, or `None` (401).
    pub fn account(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<AccountId> {
        if let Some(name) = &self.proxy_header
            && let Some(value) = headers.get(name)
        {
            if !peer.is_some_and(|p| self.trusted_proxies.contains(&p)) {
                return None;
            }
            return value.to_str().ok().and_then(|v| AccountId::parse(v).ok());
        }
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return None;
        }
        let hash: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        self.tokens.get(&hash).cloned()
    }
}

fn read_tokens(path: &Path) -> Result<HashMap<[u8; 32], AccountId>, SessionFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| SessionFileError::Read { path: shown.clone(), error })?;
    let mut tokens = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || SessionFileError::Line { path: shown.clone(), line: i + 1 };
        let (hash, account) = line.split_once(char::is_whitespace).ok_or_else(bad)?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hash, &mut digest).map_err(|_| bad())?;
        tokens.insert(digest, AccountId::parse(account.trim()).map_err(|_| bad())?);
    }
    Ok(tokens)
}

/// What the routes share.
#[derive(Clone)]
pub struct GatewayState {
    pub service: Arc<GatewayService>,
    /// `None` without `[station]`: the Station routes answer 404.
    pub station: Option<Arc<(StationSettings, Session)>>,
    pub metrics: Arc<Metrics>,
    /// The listener's scheme (`https` with `[server.tls]`): the value of a
    /// covered `@target-uri` / `@scheme`.
    pub scheme: &'static str,
}

/// The problem codes each route can answer (`fanout_http_requests_total`'s
/// `code`, besides `ok`), created at zero with the router.
const STATION_CODES: [&str; 8] = [
    SchemaViolation::CODE,
    "unauthorized",
    "not_found",
    "payload_too_large",
    "push_gateway_not_onboarded",
    "push_route_not_configured",
    "rate_limited",
    "unavailable",
];
const NOTIFY_CODES: [&str; 8] = [
    SchemaViolation::CODE,
    "unauthorized",
    "duplicate_conflict",
    "payload_too_large",
    "wrong_destination",
    "rate_limited",
    "in_progress",
    "unavailable",
];

/// Why a notify answered 401 (`fanout_gateway_notify_unauthorized_total`):
/// a source that is not configured, a Content-Digest that is missing or
/// does not match, or the signature check's own reason.
const UNKNOWN_SOURCE: &str = "unknown_source";
const CONTENT_DIGEST: &str = "content_digest";

fn initialise_metrics(metrics: &Metrics) {
    for (route, codes) in
        [("register_device", STATION_CODES), ("unregister_device", STATION_CODES), ("notify", NOTIFY_CODES)]
    {
        for code in std::iter::once("ok").chain(codes) {
            metrics.http_requests.with_label_values(&[route, code]);
        }
    }
    let refused = &metrics.gateway.notify_unauthorized;
    for reason in [UNKNOWN_SOURCE, CONTENT_DIGEST].into_iter().chain(SignatureError::VARIANTS.iter().map(|e| e.label()))
    {
        refused.with_label_values(&[reason]);
    }
}

pub fn router(state: GatewayState) -> Router {
    initialise_metrics(&state.metrics);
    Router::new()
        .route(Operation::RegisterDevice.path(), post(register_device))
        .route(Operation::UnregisterDevice.path(), post(unregister_device))
        .route(Operation::Notify.path(), post(notify))
        .with_state(state)
}

pub(crate) fn schema_problem(v: &SchemaViolation) -> Problem {
    Problem::new(StatusCode::BAD_REQUEST, SchemaViolation::CODE, v.to_string())
}

/// The problem of a refused Station request; 429 and 503 carry a Retry-After.
fn station_problem(e: &StationError) -> Problem {
    let (status, code) = match e {
        StationError::Schema(v) => return schema_problem(v),
        StationError::GatewayNotOnboarded => (StatusCode::UNPROCESSABLE_ENTITY, "push_gateway_not_onboarded"),
        StationError::RouteNotConfigured => (StatusCode::UNPROCESSABLE_ENTITY, "push_route_not_configured"),
        StationError::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
        StationError::Storage => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    retrying(Problem::new(status, code, e.to_string()))
}

/// `problem`, with a Retry-After when it is a 429 or a 503.
fn retrying(problem: Problem) -> Problem {
    match problem.status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => problem.retry_after(1),
        _ => problem,
    }
}

fn unauthorized() -> Problem {
    Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", "an authenticated session is required")
}

/// A Station request as the routes share it: the session's account under
/// the Station's tenant, the operation's selector, the body's size and its
/// closed schema, in that order.
struct StationRequest<T> {
    tenant: ServiceId,
    account: AccountId,
    body: T,
}

fn station_request<T>(
    state: &GatewayState,
    headers: &HeaderMap,
    peer: SocketAddr,
    operation: Operation,
    body: &Bytes,
    parse: impl FnOnce(&[u8]) -> Result<T, SchemaViolation>,
) -> Result<StationRequest<T>, Problem> {
    let Some(station) = &state.station else {
        return Err(Problem::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint"));
    };
    let account = station.1.account(headers, Some(peer.ip())).ok_or_else(unauthorized)?;
    check_operation(headers, operation).map_err(|v| schema_problem(&v))?;
    if body.len() > MAX_STATION_BODY {
        return Err(Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the body is too large"));
    }
    let body = parse(body).map_err(|v| schema_problem(&v))?;
    Ok(StationRequest { tenant: station.0.service_id.clone(), account, body })
}

async fn register_device(
    State(state): State<GatewayState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let r = station_request(&state, &headers, peer, Operation::RegisterDevice, &body, RegisterDevice::parse)?;
        let registered =
            state.service.register(&r.tenant, &r.account, &r.body).await.map_err(|e| station_problem(&e))?;
        let body = registered.to_json().to_string();
        Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response())
    }
    .await;
    counted(&state, "register_device", result)
}

async fn unregister_device(
    State(state): State<GatewayState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let r = station_request(&state, &headers, peer, Operation::UnregisterDevice, &body, UnregisterDevice::parse)?;
        state.service.unregister(&r.tenant, &r.account, &r.body).await.map_err(|e| station_problem(&e))?;
        // §3.2: 204 and no body, also when nothing was registered.
        Ok(StatusCode::NO_CONTENT.into_response())
    }
    .await;
    counted(&state, "unregister_device", result)
}

fn notify_problem(e: &NotifyError) -> Problem {
    let (status, code) = match e {
        NotifyError::Schema(v) => return schema_problem(v),
        NotifyError::UnknownSource => (StatusCode::UNAUTHORIZED, "unauthorized"),
        NotifyError::WrongDestination => (StatusCode::MISDIRECTED_REQUEST, "wrong_destination"),
        NotifyError::DuplicateConflict => (StatusCode::CONFLICT, "duplicate_conflict"),
        NotifyError::InProgress => (StatusCode::SERVICE_UNAVAILABLE, "in_progress"),
        NotifyError::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
        NotifyError::Storage => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    retrying(Problem::new(status, code, e.to_string()))
}

/// §5.1 notify: the headers, then the service's authentication (the body's
/// Content-Digest and the RFC 9421 signature under a key of the named
/// source service), then the service. Nothing of the body is read before
/// the signature verified.
async fn notify(
    State(state): State<GatewayState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        // Within the listener's own cap (`server.api_max_body_bytes`).
        if body.len() > MAX_NOTIFY_BODY {
            return Err(Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the body is too large"));
        }
        let parsed = NotifyHeaders::parse(&headers).map_err(|v| schema_problem(&v))?;
        let settings = state.service.settings();
        let unauthorized = |reason: &'static str, detail: String| {
            state.metrics.gateway.notify_unauthorized.with_label_values(&[reason]).inc();
            Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
        };
        let source = settings
            .source_service(&parsed.source)
            .ok_or_else(|| unauthorized(UNKNOWN_SOURCE, NotifyError::UnknownSource.to_string()))?;
        signature::verify_content_digest(&headers, &body).map_err(|e| unauthorized(CONTENT_DIGEST, e.to_string()))?;
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| headers.get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_owned))
            .unwrap_or_default();
        let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
        let request = SignedRequest {
            method: method.as_str(),
            scheme: state.scheme,
            authority: &authority,
            path_and_query,
            headers: &headers,
        };
        let now = state.service.now().as_secs();
        signature::verify(&request, source, &settings.notify_signature_policy(), now).map_err(|e| {
            tracing::info!(reason = e.label(), "notify signature refused");
            unauthorized(e.label(), e.to_string())
        })?;
        let answer = state.service.notify(&parsed, &body).await.map_err(|e| notify_problem(&e))?;
        Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], answer).into_response())
    }
    .await;
    counted(&state, "notify", result)
}

/// Counts a request by route and result (`ok` or the problem's code).
pub(crate) fn counted(state: &GatewayState, route: &'static str, result: Result<Response, Problem>) -> Response {
    let (code, response) = match result {
        Ok(response) => ("ok", response),
        Err(problem) => {
            tracing::info!(route, code = problem.code, "gateway request refused");
            (problem.code, problem.into_response())
        }
    };
    state.metrics.http_requests.with_label_values(&[route, code]).inc();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(tokens: Option<PathBuf>, proxy: Option<&str>, trusted: Vec<IpAddr>) -> Result<StationSettings, String> {
        StationSettings::try_from(RawStation {
            service_id: ServiceId::parse("did:web:station.example").unwrap(),
            session_tokens_file: tokens,
            proxy_account_header: proxy.map(str::to_owned),
            trusted_proxies: trusted,
        })
    }

    #[test]
    fn sessions_come_from_hashed_tokens_or_a_trusted_proxy() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sessions");
        let hash = hex::encode(Sha256::digest(b"secret-token"));
        std::fs::write(&file, format!("# comment\n{hash} ak:account:alice\n")).unwrap();
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let s = settings(Some(file), Some("X-Account"), vec![proxy]).unwrap();
        let session = Session::load(&s).unwrap();
        let with = |name: &str, value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::HeaderName::try_from(name).unwrap(), value.parse().unwrap());
            h
        };
        let alice = AccountId::parse("ak:account:alice").unwrap();
        assert_eq!(session.account(&with("authorization", "Bearer secret-token"), None), Some(alice.clone()));
        assert_eq!(session.account(&with("authorization", "Bearer other"), None), None);
        assert_eq!(session.account(&with("authorization", "Basic secret-token"), None), None);
        assert_eq!(session.account(&HeaderMap::new(), None), None);
        let bob = AccountId::parse("ak:account:bob").unwrap();
        assert_eq!(session.account(&with("x-account", "ak:account:bob"), Some(proxy)), Some(bob));
        // The header from anyone else is refused, not ignored.
        assert_eq!(session.account(&with("x-account", "ak:account:bob"), Some("10.0.0.2".parse().unwrap())), None);
        assert_eq!(session.account(&with("x-account", "ak:account:bob"), None), None);
    }

    #[test]
    fn station_settings_need_a_verifier() {
        assert!(settings(None, None, vec![]).is_err());
        assert!(settings(None, Some("x-account"), vec![]).is_err());
        assert!(settings(None, Some("bad header"), vec!["127.0.0.1".parse().unwrap()]).is_err());
        assert!(settings(None, Some("x-account"), vec!["127.0.0.1".parse().unwrap()]).is_ok());
    }

    #[test]
    fn bad_session_lines_are_named_by_number() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sessions");
        std::fs::write(&file, "\nnot-hex ak:account:a\n").unwrap();
        let s = settings(Some(file), None, vec![]).unwrap();
        let e = Session::load(&s).err().unwrap().to_string();
        assert!(e.ends_with("line 2: expected `<sha256 hex of the token> <account_id>`"), "{e}");
    }
}
