//! `[engine.gateway]`: spec 002's Station and Gateway roles. Absent, both are
//! off (their paths answer 404 like any unknown one).
//!
//! The table deserializes as its fields, then `check` tests the rules
//! between keys (the current salt epoch has a secret, the dwell covers the
//! window, ...): settings that deserialized are valid.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::delivery::DeliverySettings;
use super::egress::EgressPolicy;
use super::grid::CountGrid;
use super::schema::{NotifyLimits, is_event_kind};
use super::signature::{SignaturePolicy, SourceService};
use crate::domain::{SaltEpochId, ServiceId};
use crate::duration;

/// §2.4: the delivery window when the policy names none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// §4.5: `aggressive_wakeup_threshold`, at most 30 wake-ups per 60 s.
pub const DEFAULT_AGGRESSIVE_THRESHOLD: u32 = 30;
/// §4.5 / §8 `traffic_metadata_hardened`: egress buckets of 300 s or coarser.
pub const MIN_HARDENED_BUCKET: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct GatewaySettings {
    /// This gateway's service DID: a notify whose `Destination-Service-ID`
    /// differs is refused (§5.1).
    pub service_id: ServiceId,
    /// §2.2: the epoch new pseudonyms are derived under.
    pub salt_epoch: SaltEpochId,
    /// §2.2: every epoch still resolving → the file of its secret (hex of at
    /// least 32 bytes). Removing an epoch retires its registrations.
    pub salt_secrets: BTreeMap<SaltEpochId, PathBuf>,
    /// §3.1 `expires_at`: how long a registration is used after it is made.
    #[serde(
        rename = "registration_ttl_seconds",
        default = "default_registration_ttl",
        deserialize_with = "duration::seconds"
    )]
    pub registration_ttl: Duration,
    /// §2.4: the delivery window (dedup, collapse key, wake-up rate).
    #[serde(rename = "window_seconds", default = "default_window", deserialize_with = "duration::seconds")]
    pub window: Duration,
    /// §4.5: wake-ups per route per window sent at once; beyond, they merge
    /// into one batch wake-up at the window's end.
    #[serde(default = "default_threshold")]
    pub aggressive_threshold: NonZeroU32,
    /// §5.1: the closed bucket grid of counts.
    #[serde(default)]
    pub count_grid: CountGrid,
    /// §5.1: a bucket, once switched, stays at least this long. Absent (zero,
    /// which the key refuses): the window.
    #[serde(rename = "count_dwell_seconds", default, deserialize_with = "duration::seconds")]
    pub count_dwell: Duration,
    /// §5.1: the largest `unread_increment` a notify may carry.
    #[serde(default = "default_max_unread_increment")]
    pub max_unread_increment: u32,
    /// §4.5 / §8: every route is `traffic_metadata_hardened` (batch only, in
    /// `hardened_bucket` buckets); a source service may also be marked alone.
    #[serde(default)]
    pub hardened: bool,
    #[serde(
        rename = "hardened_bucket_seconds",
        default = "default_hardened_bucket",
        deserialize_with = "duration::seconds"
    )]
    pub hardened_bucket: Duration,
    /// §5.2: how long an Idempotency-Key's record answers replays and
    /// conflicts.
    #[serde(
        rename = "idempotency_retention_seconds",
        default = "default_idempotency_retention",
        deserialize_with = "duration::seconds"
    )]
    pub idempotency_retention: Duration,
    /// §5.1: `event_kind` values answered with the no-fanout ack.
    #[serde(default)]
    pub no_fanout_event_kinds: BTreeSet<String>,
    /// §3.3: the pre-onboarded gateways a registration's `push_gateway_url`
    /// must name exactly.
    #[serde(default)]
    pub gateways: Vec<OnboardedGateway>,
    /// §5.1: the Stations that may call notify, with their Ed25519 keys.
    #[serde(default)]
    pub source_services: Vec<SourceService>,
    /// RFC 9421 `created` older than this is refused.
    #[serde(
        rename = "signature_max_age_seconds",
        default = "default_signature_max_age",
        deserialize_with = "duration::seconds"
    )]
    pub signature_max_age: Duration,
    /// Tolerance for clocks ahead (`created`) or behind (`expires`); 0 allowed.
    #[serde(rename = "clock_skew_seconds", default = "default_clock_skew", deserialize_with = "whole_seconds")]
    pub clock_skew: Duration,
    /// §5.2 `push_payload_too_large`: the rebuilt provider payload's limit.
    #[serde(default = "default_max_provider_payload_bytes")]
    pub max_provider_payload_bytes: usize,
    /// Devices one notify may name.
    #[serde(default = "default_max_devices")]
    pub max_devices_per_notify: usize,
    /// §5.2 `rate_limited` (reading 26): accepted wake-ups of one device
    /// that may be stored and unfinished at once; beyond, the device is
    /// `rate_limited` and nothing more is stored for it.
    #[serde(default = "default_max_pending_wakeups")]
    pub max_pending_wakeups_per_device: usize,
    /// `[engine.gateway.delivery]`: the wake-up worker.
    #[serde(default)]
    pub delivery: DeliverySettings,
}

impl<'de> Deserialize<'de> for GatewaySettings {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::deserialize(d)?.check().map_err(serde::de::Error::custom)
    }
}

fn whole_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_secs)
}

impl GatewaySettings {
    /// The onboarded gateway `push_gateway_url` names, compared byte for
    /// byte (§3.3: no redirect, no normalisation; anything else fails closed).
    pub fn gateway_for_url(&self, url: &str) -> Option<&OnboardedGateway> {
        self.gateways.iter().find(|g| g.url == url)
    }

    pub fn source_service(&self, id: &ServiceId) -> Option<&SourceService> {
        self.source_services.iter().find(|s| &s.id == id)
    }

    /// The secret files as `SaltSecrets::load` takes them.
    pub fn salt_secret_files(&self) -> impl Iterator<Item = (&SaltEpochId, &Path)> {
        self.salt_secrets.iter().map(|(e, p)| (e, p.as_path()))
    }

    /// Whether a source's routes are `traffic_metadata_hardened`.
    pub fn is_hardened(&self, source: &ServiceId) -> bool {
        self.hardened || self.source_service(source).is_some_and(|s| s.hardened)
    }

    /// The egress bucket of a route: the window, or the hardened bucket.
    pub fn egress_bucket(&self, source: &ServiceId) -> Duration {
        if self.is_hardened(source) { self.hardened_bucket } else { self.window }
    }

    /// The limits notify bodies are parsed under.
    pub fn notify_limits(&self) -> NotifyLimits<'_> {
        NotifyLimits {
            grid: &self.count_grid,
            max_unread_increment: self.max_unread_increment,
            max_devices: self.max_devices_per_notify,
        }
    }

    /// The egress timing of the routes of `source`.
    pub fn egress_policy(&self, source: &ServiceId) -> EgressPolicy {
        EgressPolicy {
            window: self.window,
            aggressive_threshold: self.aggressive_threshold.get(),
            hardened_bucket: self.is_hardened(source).then_some(self.hardened_bucket),
        }
    }

    /// The signature requirements of notify.
    pub fn notify_signature_policy(&self) -> SignaturePolicy {
        SignaturePolicy::notify(self.signature_max_age, self.clock_skew)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnboardedGateway {
    /// The exact `push_gateway_url` clients register with (https).
    pub url: String,
    /// The gateway's service DID (the `Destination-Service-ID` of notify).
    pub service_id: ServiceId,
}

fn default_registration_ttl() -> Duration {
    Duration::from_secs(30 * 86_400)
}
fn default_window() -> Duration {
    DEFAULT_WINDOW
}
fn default_threshold() -> NonZeroU32 {
    NonZeroU32::new(DEFAULT_AGGRESSIVE_THRESHOLD).expect("nonzero")
}
fn default_max_unread_increment() -> u32 {
    20
}
fn default_hardened_bucket() -> Duration {
    MIN_HARDENED_BUCKET
}
fn default_idempotency_retention() -> Duration {
    Duration::from_secs(86_400)
}
fn default_signature_max_age() -> Duration {
    Duration::from_secs(300)
}
fn default_clock_skew() -> Duration {
    Duration::from_secs(30)
}
fn default_max_provider_payload_bytes() -> usize {
    4096
}
fn default_max_devices() -> usize {
    100
}
/// Two windows' worth of wake-ups at the default §4.5 threshold (30) plus
/// room for the batch wake-ups: a device whose provider takes its wake-ups
/// never gets near it; one whose provider keeps failing reaches it within
/// about two windows.
pub const DEFAULT_MAX_PENDING_WAKEUPS: usize = 64;
fn default_max_pending_wakeups() -> usize {
    DEFAULT_MAX_PENDING_WAKEUPS
}

impl GatewaySettings {
    fn check(mut self) -> Result<Self, String> {
        if self.salt_secrets.values().any(|p| p.as_os_str().is_empty()) {
            return Err("salt_secrets: every epoch needs a secret file".into());
        }
        if !self.salt_secrets.contains_key(&self.salt_epoch) {
            return Err("salt_secrets must name the file of the current salt_epoch".into());
        }
        if self.window > Duration::from_secs(3600) {
            return Err("window_seconds must be between 1 and 3600".into());
        }
        if self.count_dwell.is_zero() {
            self.count_dwell = self.window;
        }
        // §5.1: dwell ≥ max(aggregation window, provider refresh interval).
        if self.count_dwell < self.window {
            return Err("count_dwell_seconds must be at least window_seconds".into());
        }
        if !(1..=1000).contains(&self.max_unread_increment) {
            return Err("max_unread_increment must be between 1 and 1000".into());
        }
        if self.hardened_bucket < MIN_HARDENED_BUCKET || self.hardened_bucket < self.window {
            return Err("hardened_bucket_seconds must be at least 300 and at least window_seconds".into());
        }
        if self.idempotency_retention < self.window {
            return Err("idempotency_retention_seconds must be at least window_seconds".into());
        }
        if !self.no_fanout_event_kinds.iter().all(|k| is_event_kind(k)) {
            return Err("no_fanout_event_kinds: each is 1 to 128 characters of a-z 0-9 . _ -".into());
        }
        let mut urls = BTreeSet::new();
        for g in &self.gateways {
            let rest = g.url.strip_prefix("https://").unwrap_or("");
            let host_end = rest.find('/').unwrap_or(rest.len());
            if rest[..host_end].is_empty()
                || rest.contains(['#', '@'])
                || g.url.bytes().any(|b| !(0x21..=0x7e).contains(&b))
            {
                return Err("gateways: each url must be an https URL without userinfo or fragment".into());
            }
            if !urls.insert(g.url.as_str()) {
                return Err("gateways: each url may be listed once".into());
            }
        }
        let mut ids = BTreeSet::new();
        for s in &self.source_services {
            if !ids.insert(&s.id) {
                return Err("source_services: each id may be listed once".into());
            }
            if s.keys.is_empty() {
                return Err("source_services: each needs at least one key".into());
            }
            let mut key_ids = BTreeSet::new();
            for k in &s.keys {
                if !crate::domain::visible_ascii(&k.key_id, 255) || !key_ids.insert(k.key_id.as_str()) {
                    return Err(
                        "source_services: key_id must be 1 to 255 visible ASCII characters, unique per service".into(),
                    );
                }
            }
        }
        if self.clock_skew > Duration::from_secs(300) {
            return Err("clock_skew_seconds must be between 0 and 300".into());
        }
        if !(256..=65536).contains(&self.max_provider_payload_bytes) {
            return Err("max_provider_payload_bytes must be between 256 and 65536".into());
        }
        if !(1..=1000).contains(&self.max_devices_per_notify) {
            return Err("max_devices_per_notify must be between 1 and 1000".into());
        }
        // The ledger is one stored value per device: keep it small.
        if !(1..=1000).contains(&self.max_pending_wakeups_per_device) {
            return Err("max_pending_wakeups_per_device must be between 1 and 1000".into());
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    /// RFC 9421 B.1.4's Ed25519 test key, as a JWK `x`.
    const RFC_KEY: &str = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs";

    fn minimal() -> serde_json::Value {
        serde_json::json!({
            "service_id": "did:web:push.example",
            "salt_epoch": "e1",
            "salt_secrets": {"e1": "/etc/fanout/push-e1.secret"},
        })
    }

    fn parse(json: serde_json::Value) -> Result<GatewaySettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    fn with(key: &str, value: serde_json::Value) -> serde_json::Value {
        let mut json = minimal();
        json[key] = value;
        json
    }

    #[test]
    fn defaults_are_the_specs() {
        let s = parse(minimal()).unwrap();
        assert_eq!(s.service_id.as_str(), "did:web:push.example");
        assert_eq!(s.salt_epoch.as_str(), "e1");
        assert_eq!(s.window, Duration::from_secs(60));
        assert_eq!(s.aggressive_threshold.get(), 30);
        assert_eq!(s.count_grid, CountGrid::default());
        assert_eq!(s.count_dwell, Duration::from_secs(60));
        assert_eq!(s.hardened_bucket, Duration::from_secs(300));
        assert!(!s.hardened);
        assert_eq!(s.registration_ttl, Duration::from_secs(2_592_000));
        assert_eq!(s.idempotency_retention, Duration::from_secs(86_400));
        assert_eq!((s.signature_max_age, s.clock_skew), (Duration::from_secs(300), Duration::from_secs(30)));
        assert_eq!((s.max_unread_increment, s.max_provider_payload_bytes, s.max_devices_per_notify), (20, 4096, 100));
        assert_eq!(s.max_pending_wakeups_per_device, 64);
        assert!(s.no_fanout_event_kinds.is_empty() && s.gateways.is_empty() && s.source_services.is_empty());
        assert_eq!(s.salt_secret_files().count(), 1);
        let d = s.delivery;
        assert_eq!((d.max_in_flight.get(), d.max_attempts.get()), (64, 8));
        assert_eq!(d.poll_interval, Duration::from_millis(500));
    }

    #[test]
    fn the_wakeup_worker_is_configured_in_its_own_table() {
        let json = serde_json::json!({"max_in_flight": 16, "max_attempts": 3, "poll_interval_ms": 250});
        let d = parse(with("delivery", json)).unwrap().delivery;
        assert_eq!((d.max_in_flight.get(), d.max_attempts.get()), (16, 3));
        assert_eq!(d.poll_interval, Duration::from_millis(250));
        let d = parse(with("delivery", serde_json::json!({"max_attempts": 1}))).unwrap().delivery;
        assert_eq!((d.max_in_flight.get(), d.max_attempts.get()), (64, 1), "the others keep their defaults");
        let refused = |json: serde_json::Value, rule: &str| {
            let err = parse(with("delivery", json.clone())).unwrap_err();
            assert!(err.contains(rule), "{json}: {err}");
        };
        refused(serde_json::json!({"max_in_flight": 0}), "nonzero");
        refused(serde_json::json!({"max_attempts": 0}), "nonzero");
        refused(serde_json::json!({"poll_interval_ms": 0}), "positive number of milliseconds");
        refused(serde_json::json!({"poll_interval": 500}), "unknown field `poll_interval`");
    }

    /// fanout.example.toml documents every key with its default.
    #[test]
    fn the_example_block_loads_with_the_defaults() {
        let example = include_str!("../../../fanout.example.toml");
        let start = example.find("# [engine.gateway]").unwrap();
        let block: String =
            example[start..].lines().map(|l| l.strip_prefix("# ").unwrap_or(l)).collect::<Vec<_>>().join("\n");
        let table: toml::Table = block.parse().unwrap();
        let s: GatewaySettings = table["engine"]["gateway"].clone().try_into().unwrap();
        let d = parse(minimal()).unwrap();
        assert_eq!(
            (s.registration_ttl, s.window, s.aggressive_threshold, s.count_dwell, s.max_unread_increment),
            (d.registration_ttl, d.window, d.aggressive_threshold, d.count_dwell, d.max_unread_increment)
        );
        assert_eq!((s.count_grid, s.hardened, s.hardened_bucket), (d.count_grid, d.hardened, d.hardened_bucket));
        assert_eq!(
            (s.idempotency_retention, s.no_fanout_event_kinds),
            (d.idempotency_retention, d.no_fanout_event_kinds)
        );
        assert_eq!((s.signature_max_age, s.clock_skew), (d.signature_max_age, d.clock_skew));
        assert_eq!(
            (s.max_provider_payload_bytes, s.max_devices_per_notify),
            (d.max_provider_payload_bytes, d.max_devices_per_notify)
        );
        assert_eq!(s.max_pending_wakeups_per_device, d.max_pending_wakeups_per_device);
        let (e, d) = (s.delivery, d.delivery);
        assert_eq!(
            (e.max_in_flight, e.max_attempts, e.poll_interval),
            (d.max_in_flight, d.max_attempts, d.poll_interval)
        );
        assert_eq!(s.gateways.len(), 1);
        assert_eq!(s.source_services[0].keys[0].public_key, URL_SAFE_NO_PAD.decode(RFC_KEY).unwrap()[..]);
    }

    #[test]
    fn gateways_sources_and_keys() {
        let mut json = minimal();
        json["gateways"] = serde_json::json!([
            {"url": "https://push.example/_arkret/edge/push/notify", "service_id": "did:web:push.example"}
        ]);
        json["source_services"] = serde_json::json!([
            {"id": "did:web:station.example", "keys": [{"key_id": "k1", "public_key": RFC_KEY}], "hardened": true},
            {"id": "did:web:other.example", "keys": [{"key_id": "k1", "public_key": RFC_KEY}]}
        ]);
        json["no_fanout_event_kinds"] = serde_json::json!(["ak.agent.lifecycle"]);
        let s = parse(json).unwrap();
        let g = s.gateway_for_url("https://push.example/_arkret/edge/push/notify").unwrap();
        assert_eq!(g.service_id.as_str(), "did:web:push.example");
        // Byte for byte: no normalisation.
        assert!(s.gateway_for_url("https://PUSH.example/_arkret/edge/push/notify").is_none());
        assert!(s.gateway_for_url("https://push.example/_arkret/edge/push/notify/").is_none());
        let station = ServiceId::parse("did:web:station.example").unwrap();
        let other = ServiceId::parse("did:web:other.example").unwrap();
        let source = s.source_service(&station).unwrap();
        assert_eq!(source.key("k1").unwrap().public_key[..4], [0x26, 0xb4, 0x0b, 0x8f]);
        assert!(source.key("k2").is_none());
        assert!(s.is_hardened(&station) && !s.is_hardened(&other));
        assert_eq!(s.egress_bucket(&station), Duration::from_secs(300));
        assert_eq!(s.egress_bucket(&other), Duration::from_secs(60));
        assert_eq!(s.egress_policy(&station).hardened_bucket, Some(Duration::from_secs(300)));
        assert_eq!(s.egress_policy(&other).hardened_bucket, None);
        assert_eq!(s.egress_policy(&other).aggressive_threshold, 30);
        assert_eq!((s.notify_limits().max_devices, s.notify_limits().max_unread_increment), (100, 20));
        assert_eq!(s.notify_signature_policy().max_age, Duration::from_secs(300));
        assert!(s.no_fanout_event_kinds.contains("ak.agent.lifecycle"));
    }

    #[test]
    fn rules_are_checked_once() {
        let refused = |json: serde_json::Value, rule: &str| {
            let err = parse(json.clone()).unwrap_err();
            assert!(err.contains(rule), "{json}: {err}");
        };
        refused(serde_json::json!({}), "missing field `service_id`");
        refused(with("salt_epoch", "e2".into()), "current salt_epoch");
        refused(with("salt_epoch", "e 1".into()), "salt epoch ids");
        refused(with("salt_secrets", serde_json::json!({"e1": ""})), "secret file");
        refused(with("window_seconds", 0.into()), "positive number of seconds");
        refused(with("window_seconds", 3601.into()), "between 1 and 3600");
        refused(with("aggressive_threshold", 0.into()), "nonzero");
        refused(with("count_dwell_seconds", 30.into()), "at least window_seconds");
        refused(with("hardened_bucket_seconds", 299.into()), "at least 300");
        refused(with("max_unread_increment", 0.into()), "between 1 and 1000");
        refused(with("idempotency_retention_seconds", 59.into()), "at least window_seconds");
        refused(with("no_fanout_event_kinds", serde_json::json!(["Ak.Upper"])), "no_fanout_event_kinds");
        refused(with("clock_skew_seconds", 301.into()), "between 0 and 300");
        refused(with("max_provider_payload_bytes", 100.into()), "between 256");
        refused(with("max_devices_per_notify", 0.into()), "between 1 and 1000");
        refused(with("max_pending_wakeups_per_device", 0.into()), "max_pending_wakeups_per_device must be between");
        refused(with("max_pending_wakeups_per_device", 1001.into()), "max_pending_wakeups_per_device must be between");
        refused(with("gateways", serde_json::json!([{"url": "http://push.example/", "service_id": "did:x"}])), "https");
        refused(
            with("gateways", serde_json::json!([{"url": "https://u@push.example/", "service_id": "did:x"}])),
            "https",
        );
        refused(
            with(
                "gateways",
                serde_json::json!([{"url": "https://a/", "service_id": "did:x"}, {"url": "https://a/", "service_id": "did:y"}]),
            ),
            "listed once",
        );
        refused(with("source_services", serde_json::json!([{"id": "did:s", "keys": []}])), "at least one key");
        refused(
            with(
                "source_services",
                serde_json::json!([{"id": "did:s", "keys": [{"key_id": "k", "public_key": "AAAA"}]}]),
            ),
            "base64url of 32 bytes",
        );
        refused(
            with(
                "source_services",
                serde_json::json!([{"id": "did:s", "keys": [
                    {"key_id": "k", "public_key": RFC_KEY}, {"key_id": "k", "public_key": RFC_KEY}]}]),
            ),
            "unique per service",
        );
        refused(with("salt_secret", serde_json::json!({})), "unknown field");
        refused(with("count_grid", serde_json::json!(["1", "2-5", "6-20"])), "count_grid");
    }
}
