//! What the APNs and FCM mocks share: the record of a provider request, and
//! waiting for the requests of one device token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::recorder::Recorder;
use crate::request::{bearer, header, header_list};

/// HTTP/2 streams per connection: generous, so the engine's own bounds on
/// requests in flight are what tests see.
pub const MAX_CONCURRENT_STREAMS: u32 = 1000;

/// A request as a provider mock received it.
#[derive(Clone, Debug)]
pub struct ProviderRequest {
    pub received_at: SystemTime,
    pub method: String,
    /// URI path without the query, as sent (percent-encoded).
    pub path: String,
    /// "HTTP/2.0" or "HTTP/1.1".
    pub version: String,
    /// Names are lowercase; non-UTF-8 values are converted lossily.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// The device token (APNs: decoded from the path; FCM: `message.token`
    /// of the body; empty for OAuth token requests).
    pub token: String,
    /// Whether the credential verified (APNs provider token, FCM access
    /// token, OAuth assertion); `None` when the mock has no key to check with.
    pub auth_valid: Option<bool>,
    /// Status chosen for this request (possibly never delivered when delayed).
    pub status_sent: u16,
}

impl ProviderRequest {
    /// The request as it arrived; the mock fills in the token, whether the
    /// credential verified and the status it chose.
    pub fn arrived(received_at: SystemTime, parts: &http::request::Parts, body: Bytes) -> Self {
        ProviderRequest {
            received_at,
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            version: format!("{:?}", parts.version),
            headers: header_list(&parts.headers),
            body,
            token: String::new(),
            auth_valid: None,
            status_sent: 0,
        }
    }

    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The credential after `bearer `/`Bearer ` in `authorization`.
    pub fn bearer(&self) -> Option<&str> {
        bearer(self.header("authorization"))
    }
}

impl Recorder<ProviderRequest> {
    /// The requests for device `token`, in arrival order.
    pub fn for_token(&self, token: &str) -> Vec<ProviderRequest> {
        self.all().into_iter().filter(|r| r.token == token).collect()
    }

    /// Waits until at least `n` requests for `token` arrived or `timeout`
    /// passed; returns those for `token`.
    pub async fn wait_for_token(&self, token: &str, n: usize, timeout: Duration) -> Vec<ProviderRequest> {
        self.wait_until(timeout, |r| r.iter().filter(|q| q.token == token).count() >= n)
            .await
            .into_iter()
            .filter(|q| q.token == token)
            .collect()
    }
}

/// Unix time in whole seconds (token lifetimes are in seconds).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
