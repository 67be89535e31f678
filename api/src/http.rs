//! The ops listener (`server.http_listen`): /metrics (Prometheus text),
//! /healthz, /readyz, and a recipient's recent deliveries
//! (`/admin/recipients/{recipient_id}/deliveries`, `history.rs`). Product
//! endpoints live on the API listener (`rest.rs`).
//!
//! With `[server.auth]`, `/metrics` and `/admin/...` need the operator role
//! (a bearer token, as Prometheus sends with `authorization.credentials_file`,
//! or a client certificate); the two probes stay open for the kubelet and
//! say nothing but "ok" / "ready" or why not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Extension, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fanout_engine::Readiness;
use fanout_engine::delivery::History;
use fanout_engine::metrics::Metrics;
use tokio::sync::Mutex;

use crate::auth::{Authenticator, Denied, Peer, Role};

/// `/readyz` answers from a check at most this old, so a probe
/// storm costs the store one read per second at most.
const READINESS_CACHE: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    pub auth: Option<Arc<Authenticator>>,
    /// The engine's delivery history; `None`: off.
    pub history: Option<History>,
    /// This node as the others know it (`server.advertise_address`).
    pub node: String,
    last_check: Arc<Mutex<Option<(Instant, Result<(), String>)>>>,
}

impl HttpState {
    pub fn new(
        metrics: Arc<Metrics>,
        readiness: Readiness,
        auth: Option<Arc<Authenticator>>,
        history: Option<History>,
        node: String,
    ) -> Self {
        Self { metrics, readiness, auth, history, node, last_check: Arc::new(Mutex::new(None)) }
    }

    /// The store is asked by one request at a time, and only when the last
    /// answer is older than `READINESS_CACHE`.
    async fn ready(&self) -> Result<(), String> {
        let mut last = self.last_check.lock().await;
        if let Some((at, result)) = last.as_ref()
            && at.elapsed() < READINESS_CACHE
        {
            return result.clone();
        }
        let result = self.readiness.check().await.map_err(|e| e.to_string());
        *last = Some((Instant::now(), result.clone()));
        result
    }
}

pub fn router(state: HttpState) -> Router {
    let operator = Router::new()
        .route("/metrics", get(metrics))
        .route("/admin/recipients/{recipient_id}/deliveries", get(deliveries))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), require_operator));
    Router::new()
        .merge(operator)
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such endpoint") })
        .with_state(state)
}

/// With `[server.auth]`: the operator role, or 401/403 with a problem body.
async fn require_operator(
    State(state): State<HttpState>,
    peer: Option<Extension<Peer>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(auth) = &state.auth {
        let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        match auth.check(Role::Operator, authorization, peer.as_ref().map(|p| &p.0)) {
            Ok(()) => {}
            Err(Denied::Unauthenticated) => {
                let mut r = problem(StatusCode::UNAUTHORIZED, "an operator token or certificate is required");
                r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
                return r;
            }
            Err(Denied::PermissionDenied) => {
                return problem(StatusCode::FORBIDDEN, "these credentials do not grant the operator role");
            }
        }
    }
    next.run(request).await
}

async fn deliveries(State(state): State<HttpState>, Path(recipient): Path<String>) -> Response {
    crate::history::deliveries(state.history.as_ref(), &state.node, &recipient).await
}

async fn metrics(State(state): State<HttpState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

async fn readyz(State(state): State<HttpState>) -> Response {
    match state.ready().await {
        Ok(()) => "ready\n".into_response(),
        Err(not_ready) => (StatusCode::SERVICE_UNAVAILABLE, format!("{not_ready}\n")).into_response(),
    }
}

/// An RFC 9457 problem body.
fn problem(status: StatusCode, title: &str) -> Response {
    let body = serde_json::json!({"type": "about:blank", "title": title, "status": status.as_u16()});
    (status, [(header::CONTENT_TYPE, "application/problem+json")], body.to_string()).into_response()
}
