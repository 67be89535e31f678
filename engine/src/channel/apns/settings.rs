use std::path::PathBuf;

use serde::Deserialize;

use crate::channel::settings::{check_https_base, check_pool, default_connections, default_max_in_flight};

/// Default APNs hosts (section 7: the production or sandbox host for the
/// configured environment).
pub const DEFAULT_PRODUCTION_URL: &str = "https://api.push.apple.com";
pub const DEFAULT_SANDBOX_URL: &str = "https://api.sandbox.push.apple.com";

fn default_production_url() -> String {
    DEFAULT_PRODUCTION_URL.into()
}
fn default_sandbox_url() -> String {
    DEFAULT_SANDBOX_URL.into()
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
    #[serde(default = "default_production_url")]
    pub production_url: String,
    /// Default "https://api.sandbox.push.apple.com".
    #[serde(default = "default_sandbox_url")]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<ApnsSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_required_keys() {
        let apns = parse(serde_json::json!({"key_file": "/k.p8", "key_id": "KEY1234567", "team_id": "TEAM123456",
                     "bundle_id": "com.example.app", "environment": "sandbox"}))
        .unwrap();
        assert_eq!(apns.environment, ApnsEnvironment::Sandbox);
        assert_eq!(apns.production_url, DEFAULT_PRODUCTION_URL);
        assert_eq!(apns.sandbox_url, DEFAULT_SANDBOX_URL);
        assert_eq!(apns.base_url(), DEFAULT_SANDBOX_URL);
        assert_eq!((apns.max_in_flight, apns.connections, apns.rate_limit_per_second), (1000, 2, 0));
        assert!(apns.extra_ca_files.is_empty());
        apns.validate().unwrap();

        // Required keys and a closed environment set.
        let err = parse(serde_json::json!({"key_file": "/k.p8"})).unwrap_err();
        assert!(err.contains("missing field"), "{err}");
        let err = parse(serde_json::json!({"key_file": "/k", "key_id": "K", "team_id": "T",
            "bundle_id": "b", "environment": "staging"}))
        .unwrap_err();
        assert!(err.contains("staging"), "{err}");
    }

    #[test]
    fn validation_names_the_key() {
        let apns = || ApnsSettings {
            key_file: "/k.p8".into(),
            key_id: "KEY1234567".into(),
            team_id: "TEAM123456".into(),
            bundle_id: "com.example.app".into(),
            environment: ApnsEnvironment::Production,
            production_url: DEFAULT_PRODUCTION_URL.into(),
            sandbox_url: DEFAULT_SANDBOX_URL.into(),
            extra_ca_files: vec![],
            max_in_flight: 10,
            connections: 1,
            rate_limit_per_second: 0,
        };
        let check = |a: ApnsSettings| a.validate().unwrap_err();
        assert!(check(ApnsSettings { key_id: " ".into(), ..apns() }).starts_with("key_id"));
        assert!(check(ApnsSettings { team_id: "".into(), ..apns() }).starts_with("team_id"));
        assert!(check(ApnsSettings { bundle_id: "a b".into(), ..apns() }).starts_with("bundle_id"));
        assert!(check(ApnsSettings { production_url: "http://x".into(), ..apns() }).starts_with("production_url"));
        assert!(check(ApnsSettings { sandbox_url: "nope".into(), ..apns() }).starts_with("sandbox_url"));
        assert!(check(ApnsSettings { max_in_flight: 0, ..apns() }).starts_with("max_in_flight"));
        assert!(check(ApnsSettings { connections: 0, ..apns() }).starts_with("connections"));
        assert!(check(ApnsSettings { connections: 65, ..apns() }).starts_with("connections"));
    }
}
