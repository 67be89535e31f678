//! The ops listener (`server.http_listen`): /metrics (Prometheus text),
//! /healthz, /readyz. Product endpoints live on the API listener (`rest.rs`).
//!
//! With `[server.auth]`, `/metrics` needs the operator role (a bearer token,
//! as Prometheus sends with `authorization.credentials_file`, or a client
//! certificate); the two probes stay open for the kubelet and say nothing
//! but "ok" / "ready" or why not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fanout_engine::Readiness;
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
    last_check: Arc<Mutex<Option<(Instant, Result<(), String>)>>>,
}

impl HttpState {
    pub fn new(metrics: Arc<Metrics>, readiness: Readiness, auth: Option<Arc<Authenticator>>) -> Self {
        Self { metrics, readiness, auth, last_check: Arc::new(Mutex::new(None)) }
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
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such endpoint") })
        .with_state(state)
}

async fn metrics(State(state): State<HttpState>, headers: HeaderMap, peer: Option<Extension<Peer>>) -> Response {
    if let Some(auth) = &state.auth {
        let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
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
