//! Engine settings, the root of `[engine]`: it composes each component's own
//! settings (kept beside the component) and re-exports them. `fanout-api` reads
//! them from the TOML file and environment
//! (see `fanout.example.toml`, which documents every key with its default).

use std::time::Duration;

use serde::Deserialize;

pub use crate::channel::ChannelSettings;
pub use crate::delivery::DeliverySettings;
pub use crate::dispatch::DispatchSettings;
pub use crate::ownership::LeaseSettings;
pub use crate::retention::RetentionSettings;

/// Default number of topic shards. Fixed per deployment: the store records it.
pub const DEFAULT_SHARD_COUNT: u16 = 256;
/// PUSH-226 default.
pub const DEFAULT_RECIPIENT_TTL_SECONDS: u64 = 2_592_000;
/// PUSH-217 default.
pub const DEFAULT_MAX_PUSH_TOPICS: u64 = 100_000;
/// Section 7 default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Section 7: every attempt, credential fetches included, is bounded to 10 s.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSettings {
    pub shard_count: u16,
    pub recipient_ttl_seconds: u64,
    pub max_push_topics: u64,
    pub max_attempts: u32,
    pub dispatch: DispatchSettings,
    pub delivery: DeliverySettings,
    pub retention: RetentionSettings,
    /// Shard leases when several nodes share a ScyllaDB store (issue 7).
    pub lease: LeaseSettings,
    pub channels: ChannelSettings,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            shard_count: DEFAULT_SHARD_COUNT,
            recipient_ttl_seconds: DEFAULT_RECIPIENT_TTL_SECONDS,
            max_push_topics: DEFAULT_MAX_PUSH_TOPICS,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            dispatch: DispatchSettings::default(),
            delivery: DeliverySettings::default(),
            retention: RetentionSettings::default(),
            lease: LeaseSettings::default(),
            channels: ChannelSettings::https_only(),
        }
    }
}

impl EngineSettings {
    /// Validates once at start-up; the error names the bad key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("shard_count", u64::from(self.shard_count)),
            ("max_attempts", u64::from(self.max_attempts)),
            ("recipient_ttl_seconds", self.recipient_ttl_seconds),
            ("dispatch.window_envelopes", self.dispatch.window_envelopes as u64),
            ("dispatch.subscriber_page", self.dispatch.subscriber_page as u64),
            ("dispatch.max_pages_in_flight", self.dispatch.max_pages_in_flight as u64),
            ("dispatch.poll_interval_ms", self.dispatch.poll_interval_ms),
            ("dispatch.window_timeout_seconds", self.dispatch.window_timeout_seconds),
            ("delivery.workers", self.delivery.workers as u64),
            ("delivery.queue_batches", self.delivery.queue_batches as u64),
            ("delivery.max_in_flight_per_worker", self.delivery.max_in_flight_per_worker as u64),
            ("delivery.max_retrying_per_worker", self.delivery.max_retrying_per_worker as u64),
            ("retention.interval_seconds", self.retention.interval_seconds),
            ("lease.ttl_seconds", self.lease.ttl_seconds),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("{key} must be greater than zero"));
            }
        }
        if self.retention.interval_seconds > 3600 {
            // PUSH-226: a pass at most 3600 s after the previous one ended.
            return Err("retention.interval_seconds must be at most 3600".into());
        }
        self.channels.validate()?;
        Ok(())
    }

    pub fn recipient_ttl(&self) -> Duration {
        Duration::from_secs(self.recipient_ttl_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_errors_name_the_table() {
        let mut settings = EngineSettings::default();
        settings.channels.http.as_mut().unwrap().connections = 0;
        assert!(settings.validate().unwrap_err().starts_with("channels.http.connections"));
        settings.channels.http = None;
        settings.validate().unwrap();
    }
}
