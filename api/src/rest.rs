//! The product HTTP listener (`server.api_listen`): spec 003's JSON
//! endpoints, with RFC 9457 problem bodies. Separate from the ops listener
//! (`/metrics`, `/healthz`, `/readyz`).
//!
//! - `PUT /v2/push/registration`, `DELETE /v2/push/registration` (003 §1).
//! - `GET /v2/debug/push-log` (003 §5), only with the relay's
//!   `dangerous_push_log_endpoint`; 404 `not_found` otherwise.
//! - `POST <engine.relay_ingress.path>`: the 003 push-server endpoint
//!   (`relay_ingress.rs`), authenticated by the hub's signature instead.
//!
//! Authentication: `Authorization: Bearer <recipient_id>.<recipient_secret>`,
//! each the 32 bytes of spec 000 in lowercase or uppercase hex (64
//! characters). The credential is the device: checked exactly as PUSH-253
//! does for Register and Unregister (lengths, then existence for DELETE,
//! then the constant-time hash comparison), because it is that call.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use fanout_engine::channel::push_log::PushLog;
use fanout_engine::domain::RegistrationInput;
use fanout_engine::metrics::Metrics;
use fanout_engine::registry::{AdmissionError, DeliveryInput, Registry};
use fanout_engine::relay_ingress::RelayIngress;
use serde_json::{Map, Value};

use crate::problem::Problem;

/// A registration body is a few short fields and a token of at most 4096 bytes.
const MAX_BODY: usize = 16 * 1024;

/// The `route` labels of the registration endpoints.
const PUT_REGISTRATION: &str = "put_registration";
const DELETE_REGISTRATION: &str = "delete_registration";
/// Every problem code the registration routes answer (`credentials`,
/// `registration_body`, `admission_problem`), each created at zero with the
/// listener so that a refusal before the first scrape shows in `increase()`.
const REGISTRATION_CODES: [&str; 8] = [
    "validation_failed",
    "unauthorized",
    "forbidden",
    "not_found",
    "channel_not_configured",
    "limit_exceeded",
    "payload_too_large",
    "unavailable",
];

#[derive(Clone)]
pub struct ApiState {
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// `Some` only when the debug endpoint is enabled.
    pub push_log: Option<Arc<PushLog>>,
    /// `[engine.relay_ingress]`, when configured.
    pub relay_ingress: Option<Arc<RelayIngress>>,
    /// Spec 002's routes (`gateway.rs`), with `[engine.gateway]`.
    pub gateway: Option<crate::gateway::GatewayState>,
}

fn initialise_metrics(metrics: &Metrics) {
    for route in [PUT_REGISTRATION, DELETE_REGISTRATION] {
        for code in std::iter::once("ok").chain(REGISTRATION_CODES) {
            metrics.http_requests.with_label_values(&[route, code]);
        }
    }
}

pub fn router(state: ApiState, max_body_bytes: usize) -> Router {
    initialise_metrics(&state.metrics);
    // The ingress path cannot collide: its settings keep it out of /v2/ and /_arkret/.
    let ingress = state
        .relay_ingress
        .clone()
        .map(|ingress| Router::new().route(ingress.path(), post(crate::relay_ingress::handle)).with_state(ingress));
    let gateway = state.gateway.clone().map(crate::gateway::router);
    let mut router = Router::new()
        .route("/v2/push/registration", put(put_registration).delete(delete_registration))
        .route("/v2/debug/push-log", get(push_log))
        .fallback(|| async { Problem::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint").into_response() })
        .with_state(state);
    for routes in [ingress, gateway].into_iter().flatten() {
        router = router.merge(routes);
    }
    router.layer(DefaultBodyLimit::max(max_body_bytes))
}

/// The one mapping of admission errors to problems (as `grpc/status.rs` for gRPC).
fn admission_problem(e: AdmissionError) -> Problem {
    match e {
        AdmissionError::InvalidField(f) => Problem::invalid(f.field, f.rule),
        AdmissionError::InvalidArgument(msg) => Problem::new(StatusCode::BAD_REQUEST, "validation_failed", msg),
        AdmissionError::NotFound => {
            Problem::new(StatusCode::NOT_FOUND, "not_found", "no registration for this credential")
        }
        AdmissionError::PermissionDenied => {
            Problem::new(StatusCode::FORBIDDEN, "forbidden", "recipient secret does not match")
        }
        AdmissionError::FailedPrecondition(msg) => Problem::new(StatusCode::CONFLICT, "channel_not_configured", msg),
        AdmissionError::ResourceExhausted => Problem::new(StatusCode::CONFLICT, "limit_exceeded", e.to_string()),
        AdmissionError::Unavailable(e) => {
            tracing::error!(error = %e, "storage error");
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "storage unavailable")
        }
        AdmissionError::TryAgain(why) => Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why),
    }
}

/// The bearer credential: recipient id and secret, 32 bytes each, in hex.
fn credentials(headers: &HeaderMap) -> Result<([u8; 32], [u8; 32]), Problem> {
    let unauthorized = || {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a bearer credential <recipient_id hex>.<recipient_secret hex> is required",
        )
    };
    let value = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).ok_or_else(unauthorized)?;
    let (scheme, token) = value.split_once(' ').ok_or_else(unauthorized)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unauthorized());
    }
    let (id, secret) = token.trim().split_once('.').ok_or_else(unauthorized)?;
    let mut out = ([0u8; 32], [0u8; 32]);
    hex::decode_to_slice(id, &mut out.0).map_err(|_| unauthorized())?;
    hex::decode_to_slice(secret, &mut out.1).map_err(|_| unauthorized())?;
    Ok(out)
}

/// 003 §1's body: exactly its fields, each of its type.
fn registration_body(body: &[u8]) -> Result<Map<String, Value>, Problem> {
    if body.len() > MAX_BODY {
        return Err(Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the body is too large"));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|_| Problem::invalid("body", "the body must be a JSON object"))?;
    let Value::Object(map) = value else {
        return Err(Problem::invalid("body", "the body must be a JSON object"));
    };
    const FIELDS: [&str; 6] = ["provider", "token", "app_id", "sandbox", "p256dh", "auth"];
    if let Some(unknown) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        let _ = unknown; // never echoed: it is the client's text
        return Err(Problem::invalid("body", "the body has a field that is not a registration field"));
    }
    Ok(map)
}

fn text<'a>(map: &'a Map<String, Value>, field: &'static str) -> Result<Option<&'a str>, Problem> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(Problem::invalid(field, format!("{field} must be a string"))),
    }
}

async fn put_registration(State(state): State<ApiState>, headers: HeaderMap, body: Bytes) -> Response {
    let result = async {
        let (id, secret) = credentials(&headers)?;
        let map = registration_body(&body)?;
        let provider = text(&map, "provider")?.ok_or_else(|| Problem::invalid("provider", "provider is required"))?;
        let token = text(&map, "token")?.ok_or_else(|| Problem::invalid("token", "token is required"))?;
        let sandbox = match map.get("sandbox") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => return Err(Problem::invalid("sandbox", "sandbox must be a boolean")),
        };
        let input = RegistrationInput {
            provider,
            token,
            app_id: text(&map, "app_id")?,
            sandbox,
            p256dh: text(&map, "p256dh")?,
            auth: text(&map, "auth")?,
        };
        state.registry.register(&id, &secret, Some(DeliveryInput::Relay(input))).await.map_err(admission_problem)
    }
    .await;
    respond(&state, PUT_REGISTRATION, result.map(|_| ()))
}

/// 003 §1: DELETE removes the registration, not the device: its
/// subscriptions stay for a later PUT, and with nothing registered it is
/// 204 all the same.
async fn delete_registration(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let result = async {
        let (id, secret) = credentials(&headers)?;
        state.registry.remove_relay_registration(&id, &secret).await.map_err(admission_problem)
    }
    .await;
    respond(&state, DELETE_REGISTRATION, result)
}

/// 204 on success; counts the request by route and result (`ok` or the
/// problem's code: a fixed symbol, never a value from the request).
fn respond(state: &ApiState, route: &'static str, result: Result<(), Problem>) -> Response {
    let (code, response) = match result {
        Ok(()) => ("ok", StatusCode::NO_CONTENT.into_response()),
        Err(problem) => {
            tracing::info!(route, code = problem.code, field = problem.field, "request refused");
            (problem.code, problem.into_response())
        }
    };
    state.metrics.http_requests.with_label_values(&[route, code]).inc();
    response
}

/// 003 §5: the log provider's ring, oldest first, of one device or all.
async fn push_log(State(state): State<ApiState>, RawQuery(query): RawQuery) -> Response {
    let Some(log) = &state.push_log else {
        return Problem::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint").into_response();
    };
    let device = query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("device_id=")).filter(|d| !d.is_empty()));
    let body = log.notifications(device).to_string();
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registration_route_and_code_is_at_zero_from_the_start() {
        let metrics = Metrics::new();
        initialise_metrics(&metrics);
        let exposed = metrics.render();
        for route in ["put_registration", "delete_registration"] {
            for code in ["ok", "unauthorized", "forbidden", "validation_failed", "unavailable"] {
                let series = format!(r#"fanout_http_requests_total{{code="{code}",route="{route}"}} 0"#);
                assert!(exposed.contains(&series), "{series} missing:\n{exposed}");
            }
        }
        // The gateway's routes come with the gateway.
        assert!(!exposed.contains(r#"route="notify""#), "{exposed}");
    }

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, auth.parse().unwrap());
        h
    }

    #[test]
    fn bearer_credentials() {
        let good = format!("Bearer {}.{}", "01".repeat(32), "AB".repeat(32));
        assert_eq!(credentials(&headers(&good)).ok(), Some(([1; 32], [0xab; 32])));
        for bad in [
            format!("Basic {}.{}", "01".repeat(32), "02".repeat(32)),
            format!("Bearer {}", "01".repeat(64)),
            format!("Bearer {}.{}", "01".repeat(31), "02".repeat(32)),
            format!("Bearer {}.{}", "0g".repeat(32), "02".repeat(32)),
        ] {
            assert_eq!(credentials(&headers(&bad)).err().map(|p| p.status), Some(StatusCode::UNAUTHORIZED), "{bad}");
        }
        assert!(credentials(&HeaderMap::new()).is_err());
    }

    #[test]
    fn bodies_are_exactly_the_registration_fields() {
        assert!(registration_body(br#"{"provider":"apns","token":"t","sandbox":true}"#).is_ok());
        for bad in [&b"[]"[..], b"nope", br#"{"provider":"apns","token":"t","user_id":"x"}"#] {
            assert_eq!(registration_body(bad).err().and_then(|p| p.field), Some("body"));
        }
        let map = registration_body(br#"{"token":5}"#).unwrap();
        assert_eq!(text(&map, "token").err().and_then(|p| p.field), Some("token"));
    }
}
