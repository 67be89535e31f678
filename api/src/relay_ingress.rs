//! The HTTP edge of the spec 003 push-server endpoint, a route
//! of the product listener (`server.api_listen`, `rest.rs`): reads the body
//! within `max_body_bytes`, hands the raw bytes and the two headers to
//! `fanout_engine::relay_ingress`, and maps its answer to a status once.
//! Errors are RFC 9457 problem bodies whose title names the rule, never a
//! value (no token, payload or secret reaches a response or a log line).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fanout_engine::relay_ingress::request::HEADER_DELIVERY;
use fanout_engine::relay_ingress::signature::HEADER_SIGNATURE;
use fanout_engine::relay_ingress::{Accepted, IngressError, RelayIngress};
use http_body_util::{BodyExt, Limited};

/// §2.4 of spec 003, as the hub reads statuses: 2xx delivered; 404/410 the
/// registration is deleted; 429/5xx retried; any other 4xx dropped, the
/// registration kept.
pub fn status(error: &IngressError) -> StatusCode {
    match error {
        IngressError::Signature(_) | IngressError::UnknownHub => StatusCode::UNAUTHORIZED,
        IngressError::Malformed(_) => StatusCode::BAD_REQUEST,
        IngressError::BodyTooLarge | IngressError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        IngressError::UnsupportedProvider
        | IngressError::ProviderNotConfigured
        | IngressError::UnknownApp
        | IngressError::ProviderRejected => StatusCode::UNPROCESSABLE_ENTITY,
        IngressError::DeadToken => StatusCode::GONE,
        IngressError::Overloaded => StatusCode::TOO_MANY_REQUESTS,
        IngressError::InProgress { .. } | IngressError::ProviderUnavailable { .. } | IngressError::Storage => {
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub async fn handle(State(ingress): State<Arc<RelayIngress>>, headers: HeaderMap, body: Body) -> Response {
    let limit = ingress.max_body_bytes();
    let declared = header(&headers, "content-length").and_then(|v| v.parse::<u64>().ok());
    let body = if declared.is_some_and(|n| n > limit as u64) {
        None
    } else {
        Limited::new(body, limit).collect().await.ok().map(|b| b.to_bytes())
    };
    // A body over the limit, or one that broke off, is not a webhook.
    let Some(body) = body else {
        let error = IngressError::BodyTooLarge;
        ingress.count_rejected(&error);
        return problem(&error);
    };
    let signature = header(&headers, HEADER_SIGNATURE);
    let delivery = header(&headers, HEADER_DELIVERY);
    match ingress.handle(signature, delivery, body).await {
        Ok(accepted) => {
            let result = match accepted {
                Accepted::Delivered => "delivered",
                Accepted::Duplicate => "duplicate",
            };
            let body = Bytes::from(format!(r#"{{"result":"{result}"}}"#));
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(error) => {
            tracing::debug!(reason = error.label(), "relay webhook refused");
            problem(&error)
        }
    }
}

fn problem(error: &IngressError) -> Response {
    let status = status(error);
    let body = serde_json::json!({
        "type": "about:blank",
        "title": error.to_string(),
        "status": status.as_u16(),
        "reason": error.label(),
    });
    let mut response = (status, [(header::CONTENT_TYPE, "application/problem+json")], body.to_string()).into_response();
    if let Some(secs) = error.retry_after_secs() {
        response.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_engine::relay_ingress::request::Malformed;
    use fanout_engine::relay_ingress::signature::SignatureError;

    #[test]
    fn statuses_follow_section_2_4() {
        assert_eq!(status(&IngressError::Signature(SignatureError::Mismatch)), 401);
        assert_eq!(status(&IngressError::UnknownHub), 401);
        assert_eq!(status(&IngressError::Malformed(Malformed::DeliveryHeader)), 400);
        assert_eq!(status(&IngressError::DeadToken), 410);
        assert_eq!(status(&IngressError::UnsupportedProvider), 422);
        assert_eq!(status(&IngressError::Overloaded), 429);
        assert_eq!(status(&IngressError::Storage), 503);
        let r = problem(&IngressError::ProviderUnavailable { retry_after_secs: 7 });
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/problem+json");
    }
}
