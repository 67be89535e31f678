//! Engine settings, the root of `[engine]`: it composes each component's own
//! settings (kept beside the component) and re-exports them. `fanout-api` reads
//! them from the TOML file and environment
//! (see `fanout.example.toml`, which documents every key with its default).
//!
//! Every rule on a value lives in its type (`NonZero*`, `Duration` through
//! [`crate::duration`], `Connections`, `HttpsBase`, ...), so settings that
//! deserialized are valid: there is no separate validation pass.

use std::num::{NonZeroU16, NonZeroU32};
use std::time::Duration;

use serde::Deserialize;

pub use crate::channel::ChannelSettings;
pub use crate::delivery::{DeliverySettings, HistorySettings};
pub use crate::dispatch::DispatchSettings;
pub use crate::gateway::GatewaySettings;
pub use crate::ingest::IngestSettings;
pub use crate::ownership::LeaseSettings;
pub use crate::registry::SubscriptionChanges;
pub use crate::relay_ingress::RelayIngressSettings;
pub use crate::retention::{RetentionInterval, RetentionSettings};
pub use crate::transport::proxy::OutboundProxySettings;

/// Default number of topic shards. Fixed per deployment: the store records it.
pub const DEFAULT_SHARD_COUNT: NonZeroU16 = NonZeroU16::new(256).unwrap();
/// PUSH-226 default: 30 days.
pub const DEFAULT_RECIPIENT_TTL: Duration = Duration::from_secs(2_592_000);
/// PUSH-217 default.
pub const DEFAULT_MAX_PUSH_TOPICS: u64 = 100_000;
/// Section 7 default.
pub const DEFAULT_MAX_ATTEMPTS: NonZeroU32 = NonZeroU32::new(3).unwrap();

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSettings {
    pub shard_count: NonZeroU16,
    /// PUSH-226: recipients not renewed for this long are deleted.
    #[serde(rename = "recipient_ttl_seconds", deserialize_with = "crate::duration::seconds")]
    pub recipient_ttl: Duration,
    pub max_push_topics: u64,
    /// Most adds plus removes per UpdateSubscriptions.
    pub max_subscription_changes: SubscriptionChanges,
    pub max_attempts: NonZeroU32,
    /// Limits on what a publish may carry.
    pub ingest: IngestSettings,
    pub dispatch: DispatchSettings,
    pub delivery: DeliverySettings,
    /// The recent attempts of each recipient, kept in memory per node.
    pub history: HistorySettings,
    pub retention: RetentionSettings,
    /// Shard leases when several nodes share a ScyllaDB store.
    pub lease: LeaseSettings,
    pub channels: ChannelSettings,
    /// An HTTP CONNECT proxy the channels connect through; absent: direct.
    pub outbound_proxy: Option<OutboundProxySettings>,
    /// Spec 003 push-server endpoint; absent: off.
    pub relay_ingress: Option<RelayIngressSettings>,
    /// Spec 002 Station and Gateway roles; absent: off.
    pub gateway: Option<GatewaySettings>,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            shard_count: DEFAULT_SHARD_COUNT,
            recipient_ttl: DEFAULT_RECIPIENT_TTL,
            max_push_topics: DEFAULT_MAX_PUSH_TOPICS,
            max_subscription_changes: SubscriptionChanges::DEFAULT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            ingest: IngestSettings::default(),
            dispatch: DispatchSettings::default(),
            delivery: DeliverySettings::default(),
            history: HistorySettings::default(),
            retention: RetentionSettings::default(),
            lease: LeaseSettings::default(),
            channels: ChannelSettings::https_only(),
            outbound_proxy: None,
            relay_ingress: None,
            gateway: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<EngineSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn an_empty_table_gives_the_defaults() {
        let s = parse(serde_json::json!({})).unwrap();
        assert_eq!((s.shard_count.get(), s.max_push_topics, s.max_attempts.get()), (256, 100_000, 3));
        assert_eq!(s.recipient_ttl, Duration::from_secs(2_592_000));
        assert_eq!(s.ingest.max_data_bytes.get(), 1 << 20);
        assert_eq!(s.max_subscription_changes.get(), 2000);
        assert_eq!(s.dispatch.window_timeout, Duration::from_secs(120));
        assert_eq!(s.dispatch.poll_interval, Duration::from_millis(1000));
        assert_eq!(s.delivery.workers.get(), 8);
        assert_eq!(s.retention.interval.get(), Duration::from_secs(3600));
        assert_eq!(s.lease.ttl, Duration::from_secs(10));
        assert!(s.channels.http.is_some() && s.channels.apns.is_none());
    }

    #[test]
    fn durations_keep_their_integer_keys() {
        let s = parse(serde_json::json!({"recipient_ttl_seconds": 100,
            "dispatch": {"window_timeout_seconds": 5, "poll_interval_ms": 250},
            "retention": {"interval_seconds": 60}, "lease": {"ttl_seconds": 30}}))
        .unwrap();
        assert_eq!(s.recipient_ttl, Duration::from_secs(100));
        assert_eq!(s.dispatch.window_timeout, Duration::from_secs(5));
        assert_eq!(s.dispatch.poll_interval, Duration::from_millis(250));
        assert_eq!(s.retention.interval.get(), Duration::from_secs(60));
        assert_eq!(s.lease.ttl, Duration::from_secs(30));
    }

    #[test]
    fn values_that_break_a_rule_do_not_deserialize() {
        let refused = |json: serde_json::Value, rule: &str| {
            let err = parse(json.clone()).unwrap_err();
            assert!(err.contains(rule), "{json}: {err}");
        };
        refused(serde_json::json!({"shard_count": 0}), "nonzero");
        refused(serde_json::json!({"max_attempts": 0}), "nonzero");
        refused(serde_json::json!({"recipient_ttl_seconds": 0}), "positive number of seconds");
        refused(serde_json::json!({"dispatch": {"window_envelopes": 0}}), "nonzero");
        refused(serde_json::json!({"ingest": {"max_data_bytes": 0}}), "nonzero");
        refused(serde_json::json!({"max_subscription_changes": 999}), "must be between 1000 and 65534");
        refused(serde_json::json!({"dispatch": {"poll_interval_ms": 0}}), "positive number of milliseconds");
        refused(serde_json::json!({"delivery": {"max_retrying_per_worker": 0}}), "nonzero");
        refused(serde_json::json!({"retention": {"interval_seconds": 0}}), "between 1 and 3600");
        refused(serde_json::json!({"retention": {"interval_seconds": 3601}}), "between 1 and 3600");
        refused(serde_json::json!({"lease": {"ttl_seconds": 0}}), "positive number of seconds");
        refused(serde_json::json!({"channels": {"http": {"connections": 0}}}), "between 1 and 64");
        refused(serde_json::json!({"dispatch": {"window_envelope": 1}}), "unknown field `window_envelope`");
    }
}
