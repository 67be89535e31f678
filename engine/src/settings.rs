//! Engine settings. `fanout-api` reads them from the TOML file and environment
//! (see `fanout.example.toml`, which documents every key with its default).

use std::time::Duration;

use serde::Deserialize;

use crate::channel::ChannelSettings;

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

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchSettings {
    /// Most envelopes a shard reads into one window.
    pub window_envelopes: usize,
    /// Subscribers read per page; one page becomes one batch of deliveries.
    pub subscriber_page: usize,
    /// Pages a shard may have awaiting first attempts at once.
    pub max_pages_in_flight: usize,
    /// How often an idle shard looks for work it was not woken for.
    pub poll_interval_ms: u64,
    /// A window whose first attempts have not all finished by then is replayed
    /// from the checkpoint (at-least-once, never skipped).
    pub window_timeout_seconds: u64,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            window_envelopes: 512,
            subscriber_page: 1000,
            max_pages_in_flight: 16,
            poll_interval_ms: 1000,
            window_timeout_seconds: 120,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliverySettings {
    /// Delivery workers; recipients are partitioned across them by id.
    pub workers: usize,
    /// Batches a worker's queue holds before senders wait.
    pub queue_batches: usize,
    /// Attempts a worker runs concurrently.
    pub max_in_flight_per_worker: usize,
    /// Deliveries a worker holds waiting for a retry timer before it stops
    /// taking new batches: a failing provider slows dispatch instead of
    /// filling memory.
    pub max_retrying_per_worker: usize,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self { workers: 8, queue_batches: 32, max_in_flight_per_worker: 512, max_retrying_per_worker: 20_000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// Seconds between the end of one retention pass and the start of the next.
    pub interval_seconds: u64,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self { interval_seconds: 3600 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseSettings {
    /// How long a shard lease and a node heartbeat live unless renewed; they
    /// are renewed every third of it. A dead node's shards move after this.
    pub ttl_seconds: u64,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self { ttl_seconds: 10 }
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
