//! `[engine.relay_ingress]`: the spec 003 push-server endpoint. Absent, the
//! endpoint is off (its path answers 404 like any unknown one).

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::duration;

/// §2.2's recommended window.
pub const DEFAULT_SIGNATURE_WINDOW: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayIngressSettings {
    /// The path hubs POST to (their `GIM_HUB_PUSH_WEBHOOK_URL`'s path) on
    /// the HTTP listener. Default "/v1/relay/push".
    #[serde(default = "default_path")]
    pub path: IngressPath,
    /// §2.2: a signature whose `t` is further than this from now is refused
    /// (a replay). Default 300.
    #[serde(rename = "signature_window_seconds", default = "default_window", deserialize_with = "duration::seconds")]
    pub signature_window: Duration,
    /// A larger body is refused (413) before it is read whole. 1 KiB to
    /// 1 MiB, default 64 KiB (a §3 payload is at most a few KiB).
    #[serde(default)]
    pub max_body_bytes: BodyBytes,
    /// Webhooks being handled at once; one more is answered 429 with
    /// Retry-After (§2.4: the hub retries it). Default 1000.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: NonZeroUsize,
    /// hub_id → a file holding that hub's `GIM_HUB_PUSH_WEBHOOK_SECRET`
    /// (trailing whitespace ignored). A webhook naming another hub is 401.
    pub hubs: Hubs,
    /// Bundle ids a registration's `app_id` may name on APNs (sent as
    /// `apns-topic`). A registration without `app_id` uses the APNs channel's
    /// `bundle_id`. Default empty: only registrations without `app_id`.
    #[serde(default)]
    pub apns_app_ids: Vec<String>,
    /// `app_id` values accepted for FCM (e.g. the app's Firebase project or
    /// package name). fanout sends every FCM push through the one project of
    /// its service account; this only refuses registrations of other apps.
    /// Default empty: only registrations without `app_id`.
    #[serde(default)]
    pub fcm_app_ids: Vec<String>,
}

fn default_path() -> IngressPath {
    IngressPath("/v1/relay/push".into())
}

fn default_window() -> Duration {
    DEFAULT_SIGNATURE_WINDOW
}

fn default_max_in_flight() -> NonZeroUsize {
    NonZeroUsize::new(1000).expect("nonzero")
}

const RESERVED_PREFIXES: [&str; 2] = ["/v2/", "/_arkret/"];

/// `path`: starts with `/`, no query, fragment, spaces or route-pattern
/// characters, and outside the product listener's own endpoints (`/v2/…`
/// of spec 003 §1 and §5, `/_arkret/…` of spec 002).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct IngressPath(String);

impl IngressPath {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for IngressPath {
    type Error = &'static str;

    fn try_from(path: String) -> Result<Self, Self::Error> {
        if !path.starts_with('/')
            || path.contains(['?', '#', '{', '}', '*', ':'])
            || path.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err("must be a path starting with '/' without query, fragment, spaces or any of {}*:");
        }
        if RESERVED_PREFIXES.iter().any(|p| path.starts_with(p)) {
            return Err("must not be under /v2/ or /_arkret/ (the listener's own endpoints)");
        }
        Ok(Self(path))
    }
}

/// `max_body_bytes`: 1 KiB to 1 MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct BodyBytes(usize);

impl BodyBytes {
    pub fn get(self) -> usize {
        self.0
    }
}

impl Default for BodyBytes {
    fn default() -> Self {
        Self(64 << 10)
    }
}

impl TryFrom<u64> for BodyBytes {
    type Error = &'static str;

    fn try_from(n: u64) -> Result<Self, Self::Error> {
        if (1 << 10..=1 << 20).contains(&n) { Ok(Self(n as usize)) } else { Err("must be between 1024 and 1048576") }
    }
}

/// `hubs`: at least one, each hub id 1 to 255 bytes.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "BTreeMap<String, PathBuf>")]
pub struct Hubs(BTreeMap<String, PathBuf>);

impl Hubs {
    pub fn iter(&self) -> impl Iterator<Item = (&String, &PathBuf)> {
        self.0.iter()
    }
}

impl TryFrom<BTreeMap<String, PathBuf>> for Hubs {
    type Error = &'static str;

    fn try_from(hubs: BTreeMap<String, PathBuf>) -> Result<Self, Self::Error> {
        if hubs.is_empty() {
            return Err("must name at least one hub");
        }
        if hubs.keys().any(|h| h.is_empty() || h.len() > 255) {
            return Err("hub ids must be 1 to 255 bytes");
        }
        if hubs.values().any(|p| p.as_os_str().is_empty()) {
            return Err("every hub needs a secret file");
        }
        Ok(Self(hubs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<RelayIngressSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_rules() {
        let s = parse(serde_json::json!({"hubs": {"hubexample": "/etc/fanout/hub.secret"}})).unwrap();
        assert_eq!(s.path.as_str(), "/v1/relay/push");
        assert_eq!(s.signature_window, Duration::from_secs(300));
        assert_eq!((s.max_body_bytes.get(), s.max_in_flight.get()), (65536, 1000));
        assert!(s.apns_app_ids.is_empty() && s.fcm_app_ids.is_empty());

        let refused = |json: serde_json::Value, rule: &str| {
            let err = parse(json.clone()).unwrap_err();
            assert!(err.contains(rule), "{json}: {err}");
        };
        refused(serde_json::json!({}), "missing field `hubs`");
        refused(serde_json::json!({"hubs": {}}), "at least one hub");
        refused(serde_json::json!({"hubs": {"": "/s"}}), "1 to 255 bytes");
        refused(serde_json::json!({"hubs": {"h": ""}}), "secret file");
        refused(serde_json::json!({"hubs": {"h": "/s"}, "path": "push"}), "starting with '/'");
        refused(serde_json::json!({"hubs": {"h": "/s"}, "path": "/v2/push/registration"}), "own endpoints");
        refused(serde_json::json!({"hubs": {"h": "/s"}, "path": "/_arkret/edge/push/notify"}), "own endpoints");
        refused(serde_json::json!({"hubs": {"h": "/s"}, "path": "/push/{id}"}), "any of {}*:");
        refused(serde_json::json!({"hubs": {"h": "/s"}, "signature_window_seconds": 0}), "positive");
        refused(serde_json::json!({"hubs": {"h": "/s"}, "max_body_bytes": 100}), "between 1024");
        refused(serde_json::json!({"hubs": {"h": "/s"}, "secret": "x"}), "unknown field");
    }
}
