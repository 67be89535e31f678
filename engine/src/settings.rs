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
        if let Some(apns) = &self.channels.apns {
            apns.validate().map_err(|e| format!("channels.apns.{e}"))?;
        }
        if let Some(fcm) = &self.channels.fcm {
            fcm.validate().map_err(|e| format!("channels.fcm.{e}"))?;
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

/// A channel exists only when its table is present (section 2, PUSH-210).
/// With no `[engine.channels]` table at all, the HTTPS channel is configured
/// with safe defaults; once the table is written, exactly the channels it
/// lists exist (an empty `[engine.channels]` table configures none).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelSettings {
    pub http: Option<HttpChannelSettings>,
    /// `[engine.channels.apns]`; absent by default.
    pub apns: Option<ApnsSettings>,
    /// `[engine.channels.fcm]`; absent by default.
    pub fcm: Option<FcmSettings>,
}

impl ChannelSettings {
    /// What a deployment gets with no `[engine.channels]` table: HTTPS only.
    pub fn https_only() -> Self {
        Self { http: Some(HttpChannelSettings::default()), ..Self::default() }
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

/// Default APNs hosts (section 7: the production or sandbox host for the
/// configured environment).
pub const DEFAULT_APNS_PRODUCTION_URL: &str = "https://api.push.apple.com";
pub const DEFAULT_APNS_SANDBOX_URL: &str = "https://api.sandbox.push.apple.com";
/// Default FCM host of the HTTP v1 API.
pub const DEFAULT_FCM_BASE_URL: &str = "https://fcm.googleapis.com";
/// Default bound on a provider's concurrent requests.
pub const DEFAULT_PROVIDER_MAX_IN_FLIGHT: usize = 1000;
/// Default number of HTTP/2 connections per provider.
pub const DEFAULT_PROVIDER_CONNECTIONS: usize = 2;
/// Most HTTP/2 connections a provider may be given.
pub const MAX_PROVIDER_CONNECTIONS: usize = 64;

fn default_apns_production_url() -> String {
    DEFAULT_APNS_PRODUCTION_URL.into()
}
fn default_apns_sandbox_url() -> String {
    DEFAULT_APNS_SANDBOX_URL.into()
}
fn default_fcm_base_url() -> String {
    DEFAULT_FCM_BASE_URL.into()
}
fn default_max_in_flight() -> usize {
    DEFAULT_PROVIDER_MAX_IN_FLIGHT
}
fn default_connections() -> usize {
    DEFAULT_PROVIDER_CONNECTIONS
}

/// Which APNs host the channel sends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApnsEnvironment {
    Production,
    Sandbox,
}

/// `[engine.channels.apns]`: token-based (.p8) APNs over HTTP/2. The key,
/// key id, team id, bundle id and environment are required; the key file is
/// read and checked when the engine starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApnsSettings {
    /// The provider key: a PEM PKCS#8 EC P-256 `.p8` file from Apple.
    pub key_file: PathBuf,
    /// The key's 10-character key id (the JWT `kid`).
    pub key_id: String,
    /// The developer team id (the JWT `iss`).
    pub team_id: String,
    /// The app's bundle id, sent as `apns-topic`.
    pub bundle_id: String,
    /// "production" or "sandbox": picks `production_url` or `sandbox_url`.
    pub environment: ApnsEnvironment,
    /// Default "https://api.push.apple.com".
    #[serde(default = "default_apns_production_url")]
    pub production_url: String,
    /// Default "https://api.sandbox.push.apple.com".
    #[serde(default = "default_apns_sandbox_url")]
    pub sandbox_url: String,
    /// Extra PEM CA files trusted besides the system roots. Default empty.
    #[serde(default)]
    pub extra_ca_files: Vec<PathBuf>,
    /// Most requests in flight at once; further sends wait. Default 1000.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// HTTP/2 connections, used round-robin. Default 2.
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// Requests per second across all connections; 0 (the default) = no limit.
    #[serde(default)]
    pub rate_limit_per_second: u32,
}

impl ApnsSettings {
    /// The base URL for the configured environment.
    pub fn base_url(&self) -> &str {
        match self.environment {
            ApnsEnvironment::Production => &self.production_url,
            ApnsEnvironment::Sandbox => &self.sandbox_url,
        }
    }

    /// Static checks; the error starts with the bad key's name.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [("key_id", &self.key_id), ("team_id", &self.team_id), ("bundle_id", &self.bundle_id)] {
            if value.trim().is_empty() {
                return Err(format!("{key} must not be empty"));
            }
            if !value.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("{key} must be printable ASCII without spaces"));
            }
        }
        if self.key_file.as_os_str().is_empty() {
            return Err("key_file must be set".into());
        }
        check_https_base("production_url", &self.production_url)?;
        check_https_base("sandbox_url", &self.sandbox_url)?;
        check_pool(self.max_in_flight, self.connections)
    }
}

/// `[engine.channels.fcm]`: the FCM HTTP v1 API with a service account. The
/// service-account file is read and checked when the engine starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FcmSettings {
    /// A Google service-account JSON key file (`project_id`, `client_email`,
    /// `private_key`, `token_uri`). Its `token_uri` is where OAuth2 tokens
    /// are fetched.
    pub service_account_file: PathBuf,
    /// Default "https://fcm.googleapis.com".
    #[serde(default = "default_fcm_base_url")]
    pub base_url: String,
    /// Extra PEM CA files trusted besides the system roots, for the FCM host
    /// and the token endpoint. Default empty.
    #[serde(default)]
    pub extra_ca_files: Vec<PathBuf>,
    /// Most requests in flight at once; further sends wait. Default 1000.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// HTTP/2 connections, used round-robin. Default 2.
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// Requests per second across all connections; 0 (the default) = no limit.
    #[serde(default)]
    pub rate_limit_per_second: u32,
}

impl FcmSettings {
    /// Static checks; the error starts with the bad key's name.
    pub fn validate(&self) -> Result<(), String> {
        if self.service_account_file.as_os_str().is_empty() {
            return Err("service_account_file must be set".into());
        }
        check_https_base("base_url", &self.base_url)?;
        check_pool(self.max_in_flight, self.connections)
    }
}

/// An absolute https URL with a host and no query or fragment.
pub(crate) fn check_https_base(key: &str, url: &str) -> Result<(), String> {
    let uri: http::Uri = url.parse().map_err(|_| format!("{key} is not a valid URL"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("{key} must be an https URL"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{key} must name a host"));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(format!("{key} must not have a query or fragment"));
    }
    Ok(())
}

fn check_pool(max_in_flight: usize, connections: usize) -> Result<(), String> {
    if max_in_flight == 0 {
        return Err("max_in_flight must be greater than zero".into());
    }
    if connections == 0 || connections > MAX_PROVIDER_CONNECTIONS {
        return Err(format!("connections must be between 1 and {MAX_PROVIDER_CONNECTIONS}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels(json: serde_json::Value) -> Result<ChannelSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    fn engine(channels: ChannelSettings) -> EngineSettings {
        EngineSettings { channels, ..Default::default() }
    }

    #[test]
    fn provider_channel_tables_are_absent_by_default() {
        let c = EngineSettings::default().channels;
        assert!(c.http.is_some() && c.apns.is_none() && c.fcm.is_none(), "no table: HTTPS only");
        let c = channels(serde_json::json!({})).unwrap();
        assert!(c.http.is_none() && c.apns.is_none() && c.fcm.is_none(), "an empty table: no channel");
        let c = channels(serde_json::json!({"http": {}})).unwrap();
        assert!(c.http.is_some() && c.apns.is_none(), "an empty http table configures HTTPS");
    }

    #[test]
    fn provider_channel_defaults_and_required_keys() {
        let c = channels(serde_json::json!({
            "apns": {"key_file": "/k.p8", "key_id": "KEY1234567", "team_id": "TEAM123456",
                     "bundle_id": "com.example.app", "environment": "sandbox"},
            "fcm": {"service_account_file": "/sa.json"},
        }))
        .unwrap();
        let apns = c.apns.clone().unwrap();
        assert_eq!(apns.environment, ApnsEnvironment::Sandbox);
        assert_eq!(apns.production_url, DEFAULT_APNS_PRODUCTION_URL);
        assert_eq!(apns.sandbox_url, DEFAULT_APNS_SANDBOX_URL);
        assert_eq!(apns.base_url(), DEFAULT_APNS_SANDBOX_URL);
        assert_eq!((apns.max_in_flight, apns.connections, apns.rate_limit_per_second), (1000, 2, 0));
        assert!(apns.extra_ca_files.is_empty());
        let fcm = c.fcm.clone().unwrap();
        assert_eq!(fcm.base_url, DEFAULT_FCM_BASE_URL);
        assert_eq!((fcm.max_in_flight, fcm.connections, fcm.rate_limit_per_second), (1000, 2, 0));
        engine(c).validate().unwrap();

        // Required keys, a closed environment set, and no unknown keys.
        let err = channels(serde_json::json!({"apns": {"key_file": "/k.p8"}})).unwrap_err();
        assert!(err.contains("missing field"), "{err}");
        let err = channels(serde_json::json!({"apns": {"key_file": "/k", "key_id": "K", "team_id": "T",
            "bundle_id": "b", "environment": "staging"}}))
        .unwrap_err();
        assert!(err.contains("staging"), "{err}");
        let err = channels(serde_json::json!({"fcm": {"service_account_file": "/sa.json", "project": "p"}})).unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
    }

    #[test]
    fn provider_channel_validation_names_the_key() {
        let apns = || ApnsSettings {
            key_file: "/k.p8".into(),
            key_id: "KEY1234567".into(),
            team_id: "TEAM123456".into(),
            bundle_id: "com.example.app".into(),
            environment: ApnsEnvironment::Production,
            production_url: DEFAULT_APNS_PRODUCTION_URL.into(),
            sandbox_url: DEFAULT_APNS_SANDBOX_URL.into(),
            extra_ca_files: vec![],
            max_in_flight: 10,
            connections: 1,
            rate_limit_per_second: 0,
        };
        let check = |a: ApnsSettings| {
            engine(ChannelSettings { apns: Some(a), ..Default::default() }).validate().unwrap_err()
        };
        assert!(check(ApnsSettings { key_id: " ".into(), ..apns() }).starts_with("channels.apns.key_id"));
        assert!(check(ApnsSettings { team_id: "".into(), ..apns() }).starts_with("channels.apns.team_id"));
        assert!(check(ApnsSettings { bundle_id: "a b".into(), ..apns() }).starts_with("channels.apns.bundle_id"));
        assert!(check(ApnsSettings { production_url: "http://x".into(), ..apns() }).starts_with("channels.apns.production_url"));
        assert!(check(ApnsSettings { sandbox_url: "nope".into(), ..apns() }).starts_with("channels.apns.sandbox_url"));
        assert!(check(ApnsSettings { max_in_flight: 0, ..apns() }).starts_with("channels.apns.max_in_flight"));
        assert!(check(ApnsSettings { connections: 0, ..apns() }).starts_with("channels.apns.connections"));
        assert!(check(ApnsSettings { connections: 65, ..apns() }).starts_with("channels.apns.connections"));
        let fcm = FcmSettings {
            service_account_file: "/sa.json".into(),
            base_url: "https://fcm.example/?x=1".into(),
            extra_ca_files: vec![],
            max_in_flight: 1,
            connections: 1,
            rate_limit_per_second: 5,
        };
        let err = engine(ChannelSettings { fcm: Some(fcm), ..Default::default() }).validate().unwrap_err();
        assert!(err.starts_with("channels.fcm.base_url"), "{err}");
        assert!(check_https_base("u", "https://127.0.0.1:8443").is_ok());
        assert!(check_https_base("u", "https://fcm.example/").is_ok());
    }
}
