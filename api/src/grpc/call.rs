//! What surrounds every gRPC call before a service sees it, in this order:
//! the content-type rule, the call's log span, and its deadline.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};
use tonic::Status;
use tracing::Instrument;

/// The content types fanout's services decode (protobuf only).
const GRPC_CONTENT_TYPES: [&str; 2] = ["application/grpc", "application/grpc+proto"];

/// The gRPC services behind the call rules, as an axum router for the
/// gRPC listener. `request_timeout` bounds every call until its response
/// starts (a client's shorter `grpc-timeout` wins).
pub fn router(routes: tonic::service::Routes, request_timeout: Duration) -> axum::Router {
    // One layer for the three rules: each layer boxes the call's future.
    routes.prepare().into_axum_router().layer(middleware::from_fn_with_state(request_timeout, call))
}

/// When the call must be answered (the limit below, from its arrival), in
/// every request's extensions: a forward ends before it.
#[derive(Debug, Clone, Copy)]
pub struct CallDeadline(pub tokio::time::Instant);

async fn call(State(server_timeout): State<Duration>, mut request: Request, next: Next) -> Response {
    // gRPC over HTTP/2: a request whose content type is not gRPC is answered
    // 415 Unsupported Media Type, before any handler or role check runs.
    if !is_grpc(request.headers()) {
        let message = format!("content-type must be {}", GRPC_CONTENT_TYPES.join(" or "));
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message)
            .into_response();
    }
    // Every RPC's log lines carry its method and a request id, nothing else.
    let span = tracing::info_span!("rpc", method = %request.uri().path(), request_id = %request_id());
    // The shorter of `server.grpc_request_timeout_seconds` and the client's
    // `grpc-timeout`, until the response starts: the whole of a unary call;
    // PublishStream answers at once and is never cut by it.
    let limit = grpc_timeout(request.headers()).map_or(server_timeout, |client| client.min(server_timeout));
    request.extensions_mut().insert(CallDeadline(tokio::time::Instant::now() + limit));
    match tokio::time::timeout(limit, next.run(request)).instrument(span).await {
        Ok(response) => response,
        Err(_) => {
            Status::deadline_exceeded(format!("the call ran longer than its deadline of {limit:?}")).into_http::<Body>()
        }
    }
}

fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    // Parameters (`; charset=...`) do not change the media type.
    let media_type = value.split(';').next().unwrap_or_default().trim();
    GRPC_CONTENT_TYPES.iter().any(|t| media_type.eq_ignore_ascii_case(t))
}

/// A process-unique id for correlating one request's log lines.
fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:x}-{:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The `grpc-timeout` header (gRPC over HTTP/2: at most 8 digits and a
/// unit); one that does not parse is ignored, as other servers do.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &'static str, value: &'static str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(name, value.parse().unwrap());
        map
    }

    #[test]
    fn only_grpc_protobuf_content_types_pass() {
        for ok in ["application/grpc", "application/grpc+proto", "Application/GRPC; charset=utf-8"] {
            assert!(is_grpc(&headers("content-type", ok)), "{ok}");
        }
        for refused in ["application/json", "application/grpc+json", "application/grpc-web", "text/plain", ""] {
            assert!(!is_grpc(&headers("content-type", refused)), "{refused}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn grpc_timeout_parses_every_unit_and_ignores_the_rest() {
        let parse = |v| grpc_timeout(&headers("grpc-timeout", v));
        assert_eq!(parse("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(parse("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "123456789S", "5s", "-5S", "5 S", "1.5S"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
