//! The REST edges' errors: RFC 9457 problem bodies.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An RFC 9457 problem: `code` is the stable error code (e.g.
/// `validation_failed`), `field` names the body field at fault.
#[derive(Debug)]
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    detail: String,
    pub(crate) field: Option<&'static str>,
    /// Retry-After, in seconds (429, 503).
    retry_after_secs: Option<u64>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self { status, code, detail: detail.into(), field: None, retry_after_secs: None }
    }

    pub(crate) fn retry_after(self, secs: u64) -> Self {
        Self { retry_after_secs: Some(secs), ..self }
    }

    pub(crate) fn invalid(field: &'static str, detail: impl Into<String>) -> Self {
        Self { field: Some(field), ..Self::new(StatusCode::BAD_REQUEST, "validation_failed", detail) }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": "about:blank",
            "title": self.status.canonical_reason().unwrap_or("error"),
            "status": self.status.as_u16(),
            "code": self.code,
            "detail": self.detail,
        });
        if let Some(field) = self.field {
            body["field"] = field.into();
        }
        let mut response =
            (self.status, [(header::CONTENT_TYPE, "application/problem+json")], body.to_string()).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        response
    }
}
