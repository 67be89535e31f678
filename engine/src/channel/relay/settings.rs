//! `[engine.channels.relay]`: spec 003's relay webhook (hub side). Every key
//! has a default; the table's presence makes the channel exist (PUSH-210).
//! The push-server URL is trusted operator configuration, not a recipient's
//! URL, so PUSH-256's destination rules do not apply to it; it must be https
//! unless `dangerous_allow_plain_http` (tests) says otherwise, which the
//! channel's constructor checks (it spans two keys).

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Error};

use crate::channel::common::Connections;
use crate::transport::ATTEMPT_TIMEOUT;

/// 003 §4: four workers send concurrently.
pub const DEFAULT_SENDERS: NonZeroUsize = NonZeroUsize::new(4).unwrap();
/// Devices with a pending push at most; further pushes are dropped.
pub const DEFAULT_QUEUE_CAPACITY: NonZeroUsize = NonZeroUsize::new(100_000).unwrap();

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelaySettings {
    /// The push server's webhook URL (GIM_HUB_PUSH_WEBHOOK_URL). Unset: the
    /// registrations are still accepted, their pushes skipped and counted.
    pub url: Option<RelayUrl>,
    /// File holding the webhook secret (GIM_HUB_PUSH_WEBHOOK_SECRET); needed
    /// with `url`. One trailing line break is ignored.
    pub secret_file: Option<PathBuf>,
    /// This hub's id in every body (`hub_id`).
    pub hub_id: HubId,
    /// Bound on one webhook request (GIM_HUB_PUSH_WEBHOOK_TIMEOUT_SECONDS),
    /// 1 to 10 seconds (spec 000's bound on every attempt).
    #[serde(rename = "timeout_seconds", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Every payload is the wake object (GIM_HUB_PUSH_MINIMAL).
    pub minimal: bool,
    /// Push group.member_added / group.member_removed (GIM_HUB_PUSH_MEMBER_EVENTS).
    pub member_events: bool,
    /// Most devices with a pending push (GIM_HUB_PUSH_QUEUE_CAPACITY).
    pub queue_capacity: NonZeroUsize,
    /// Concurrent senders.
    pub senders: NonZeroUsize,
    /// HTTP/2 connections to the push server, used round-robin.
    pub connections: Connections,
    /// Extra PEM CA certificates trusted for the push server's TLS.
    pub extra_ca_files: Vec<PathBuf>,
    /// Test deployments only: serve the log provider's ring at
    /// `GET /v2/debug/push-log`, unauthenticated, tokens included
    /// (GIM_HUB_PUSH_LOG_ENDPOINT). Off: 404.
    pub dangerous_push_log_endpoint: bool,
    /// Tests only: allow an `http://` URL.
    pub dangerous_allow_plain_http: bool,
}

impl crate::channel::common::TrustedCas for RelaySettings {
    fn extra_ca_files(&self) -> &[PathBuf] {
        &self.extra_ca_files
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            url: None,
            secret_file: None,
            hub_id: HubId("fanout".into()),
            timeout: ATTEMPT_TIMEOUT,
            minimal: false,
            member_events: false,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            senders: DEFAULT_SENDERS,
            connections: Connections::new(1).unwrap(),
            extra_ca_files: Vec::new(),
            dangerous_push_log_endpoint: false,
            dangerous_allow_plain_http: false,
        }
    }
}

fn timeout<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let secs = u64::deserialize(deserializer)?;
    if !(1..=ATTEMPT_TIMEOUT.as_secs()).contains(&secs) {
        return Err(D::Error::custom("must be between 1 and 10 seconds"));
    }
    Ok(Duration::from_secs(secs))
}

/// 1 to 64 characters of A-Z a-z 0-9 . _ -: it names the hub to the push server.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct HubId(String);

impl HubId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for HubId {
    type Error = &'static str;

    fn try_from(id: String) -> Result<Self, Self::Error> {
        let ok = (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ok { Ok(Self(id)) } else { Err("must be 1 to 64 characters of A-Z a-z 0-9 . _ -") }
    }
}

/// An absolute http(s) URL with a host and no fragment. Whether plain http
/// is allowed is the constructor's check. Errors and Debug never show it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct RelayUrl {
    uri: http::Uri,
}

impl RelayUrl {
    pub fn uri(&self) -> &http::Uri {
        &self.uri
    }

    pub fn is_https(&self) -> bool {
        self.uri.scheme_str() == Some("https")
    }
}

impl TryFrom<String> for RelayUrl {
    type Error = &'static str;

    fn try_from(url: String) -> Result<Self, Self::Error> {
        let uri: http::Uri = url.parse().map_err(|_| "must be a valid URL")?;
        if !matches!(uri.scheme_str(), Some("https" | "http")) {
            return Err("must be an https URL");
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err("must name a host");
        }
        if url.contains('#') || uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err("must have no fragment and no user info");
        }
        Ok(Self { uri })
    }
}

crate::domain::redacted_debug!(RelayUrl);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<RelaySettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults() {
        let s = parse(serde_json::json!({})).unwrap();
        assert!(s.url.is_none() && s.secret_file.is_none() && !s.minimal && !s.member_events);
        assert_eq!((s.hub_id.as_str(), s.timeout.as_secs(), s.senders.get()), ("fanout", 10, 4));
        assert_eq!(s.queue_capacity.get(), 100_000);
        assert!(!s.dangerous_push_log_endpoint && !s.dangerous_allow_plain_http);
    }

    #[test]
    fn rules() {
        let refused = |json: serde_json::Value, rule: &str| {
            let err = parse(json.clone()).unwrap_err();
            assert!(err.contains(rule), "{json}: {err}");
        };
        refused(serde_json::json!({"timeout_seconds": 0}), "between 1 and 10");
        refused(serde_json::json!({"timeout_seconds": 11}), "between 1 and 10");
        refused(serde_json::json!({"hub_id": ""}), "1 to 64");
        refused(serde_json::json!({"hub_id": "a b"}), "1 to 64");
        refused(serde_json::json!({"url": "ftp://x/"}), "https URL");
        refused(serde_json::json!({"url": "https://user:secret@x/"}), "no user info");
        refused(serde_json::json!({"senders": 0}), "nonzero");
        refused(serde_json::json!({"queue_capacity": 0}), "nonzero");
        refused(serde_json::json!({"debug_log": true}), "unknown field");
        let err = parse(serde_json::json!({"url": "https://user:secret@x/"})).unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        let s = parse(serde_json::json!({"url": "http://127.0.0.1:1/push", "timeout_seconds": 3})).unwrap();
        assert!(!s.url.unwrap().is_https());
        assert_eq!(s.timeout, Duration::from_secs(3));
    }
}
