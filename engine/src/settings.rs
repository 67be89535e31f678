//! Engine settings. `fanout-api` reads them from the TOML file and environment
//! (see `fanout.example.toml`, which documents every key with its default).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

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
            channels: ChannelSettings::default(),
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
            ("retention.interval_seconds", self.retention.interval_seconds),
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
        if let Some(http) = &self.channels.http {
            for d in &http.allowed_domains {
                crate::webhook::DomainPattern::parse(d)
                    .map_err(|e| format!("channels.http.allowed_domains: {e}"))?;
            }
        }
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
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self { workers: 8, queue_batches: 32, max_in_flight_per_worker: 512 }
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

/// A channel exists only when its table is present (section 2, PUSH-210).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelSettings {
    pub http: Option<HttpChannelSettings>,
}

impl Default for ChannelSettings {
    /// The HTTPS channel is configured by default, with safe defaults.
    fn default() -> Self {
        Self { http: Some(HttpChannelSettings::default()) }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpChannelSettings {
    /// When not empty, a webhook host must match an entry (`host` or `*.suffix`).
    pub allowed_domains: Vec<String>,
    /// Development and test only: allow private, loopback and other blocked addresses.
    pub allow_private_addresses: bool,
    /// DNS servers for webhook hosts; empty means the system configuration.
    pub dns_servers: Vec<SocketAddr>,
    /// Extra PEM CA certificates trusted for webhook TLS, besides the system roots.
    pub extra_ca_files: Vec<PathBuf>,
}
