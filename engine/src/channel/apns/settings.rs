use std::fmt;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use serde::Deserialize;

use crate::channel::common::{
    Connections, HttpsBase, PushLifetime, default_connections, default_max_in_flight, required_path,
};

/// Default APNs hosts (section 7: the production or sandbox host for the
/// configured environment).
pub const DEFAULT_PRODUCTION_URL: &str = "https://api.push.apple.com";
pub const DEFAULT_SANDBOX_URL: &str = "https://api.sandbox.push.apple.com";

fn default_production_url() -> HttpsBase {
    HttpsBase::parse(DEFAULT_PRODUCTION_URL).expect("the default production URL is valid")
}
fn default_sandbox_url() -> HttpsBase {
    HttpsBase::parse(DEFAULT_SANDBOX_URL).expect("the default sandbox URL is valid")
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
    #[serde(deserialize_with = "required_path")]
    pub key_file: PathBuf,
    /// The key's 10-character key id (the JWT `kid`).
    pub key_id: AsciiId,
    /// The developer team id (the JWT `iss`).
    pub team_id: AsciiId,
    /// The app's bundle id, sent as `apns-topic`.
    pub bundle_id: AsciiId,
    /// "production" or "sandbox": picks `production_url` or `sandbox_url`.
    pub environment: ApnsEnvironment,
    /// Default "https://api.push.apple.com".
    #[serde(default = "default_production_url")]
    pub production_url: HttpsBase,
    /// Default "https://api.sandbox.push.apple.com".
    #[serde(default = "default_sandbox_url")]
    pub sandbox_url: HttpsBase,
    /// Extra PEM CA files trusted besides the system roots. Default empty.
    #[serde(default)]
    pub extra_ca_files: Vec<PathBuf>,
    /// Most requests in flight at once; further sends wait. Default 1000.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: NonZeroUsize,
    /// HTTP/2 connections, used round-robin. Default 2.
    #[serde(default = "default_connections")]
    pub connections: Connections,
    /// Requests per second across all connections; 0 (the default) = no limit.
    #[serde(default)]
    pub rate_limit_per_second: u32,
    /// `apns-expiration` of every push: how long APNs may keep it for an
    /// offline device, 0 to 2,419,200 seconds; 0 = deliver once, store
    /// nothing. Default 86400 (one day).
    #[serde(default)]
    pub expiration_seconds: PushLifetime,
}

impl crate::channel::common::TrustedCas for ApnsSettings {
    fn extra_ca_files(&self) -> &[PathBuf] {
        &self.extra_ca_files
    }
}

impl ApnsSettings {
    /// The base URL for the configured environment.
    pub fn base_url(&self) -> &HttpsBase {
        match self.environment {
            ApnsEnvironment::Production => &self.production_url,
            ApnsEnvironment::Sandbox => &self.sandbox_url,
        }
    }
}

/// `key_id`, `team_id`, `bundle_id`: non-empty printable ASCII without
/// spaces, so each fits a JWT claim or an `apns-topic` header as it is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct AsciiId(String);

impl AsciiId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AsciiId {
    type Error = &'static str;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        if value.is_empty() {
            return Err("must not be empty");
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("must be printable ASCII without spaces");
        }
        Ok(Self(value))
    }
}

impl TryFrom<&str> for AsciiId {
    type Error = &'static str;

    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::try_from(value.to_owned())
    }
}

impl fmt::Display for AsciiId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<ApnsSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    fn valid() -> serde_json::Value {
        serde_json::json!({"key_file": "/k.p8", "key_id": "KEY1234567", "team_id": "TEAM123456",
            "bundle_id": "com.example.app", "environment": "sandbox"})
    }

    fn with(key: &str, value: serde_json::Value) -> serde_json::Value {
        let mut json = valid();
        json[key] = value;
        json
    }

    #[test]
    fn defaults_and_required_keys() {
        let apns = parse(valid()).unwrap();
        assert_eq!(apns.environment, ApnsEnvironment::Sandbox);
        assert_eq!(apns.production_url.as_str(), DEFAULT_PRODUCTION_URL);
        assert_eq!(apns.sandbox_url.as_str(), DEFAULT_SANDBOX_URL);
        assert_eq!(apns.base_url().as_str(), DEFAULT_SANDBOX_URL);
        assert_eq!((apns.max_in_flight.get(), apns.connections.get(), apns.rate_limit_per_second), (1000, 2, 0));
        assert_eq!(apns.expiration_seconds.seconds(), 86_400);
        assert_eq!(parse(with("expiration_seconds", 0.into())).unwrap().expiration_seconds.seconds(), 0);
        assert_eq!((apns.key_id.as_str(), apns.team_id.as_str()), ("KEY1234567", "TEAM123456"));
        assert!(apns.extra_ca_files.is_empty());

        // Required keys and a closed environment set.
        let err = parse(serde_json::json!({"key_file": "/k.p8"})).unwrap_err();
        assert!(err.contains("missing field"), "{err}");
        let err = parse(with("environment", "staging".into())).unwrap_err();
        assert!(err.contains("staging"), "{err}");
    }

    /// fanout.example.toml documents every key with its default.
    #[test]
    fn the_example_table_is_the_defaults() {
        let example = ApnsSettings::deserialize(crate::channel::common::example_table("apns")).unwrap();
        let defaults = parse(valid()).unwrap();
        assert_eq!(example.environment, ApnsEnvironment::Production);
        assert_eq!((&example.production_url, &example.sandbox_url), (&defaults.production_url, &defaults.sandbox_url));
        assert!(example.extra_ca_files.is_empty());
        assert_eq!((example.max_in_flight, example.connections), (defaults.max_in_flight, defaults.connections));
        assert_eq!(example.rate_limit_per_second, defaults.rate_limit_per_second);
        assert_eq!(example.expiration_seconds, defaults.expiration_seconds);
    }

    #[test]
    fn each_rule_is_in_a_type() {
        let refused = |key: &str, value: serde_json::Value, rule: &str| {
            let err = parse(with(key, value.clone())).unwrap_err();
            assert!(err.contains(rule), "{key} = {value}: {err}");
        };
        refused("key_id", " ".into(), "must be printable ASCII without spaces");
        refused("team_id", "".into(), "must not be empty");
        refused("bundle_id", "a b".into(), "must be printable ASCII without spaces");
        refused("key_file", "".into(), "must be set");
        refused("production_url", "http://x".into(), "must be an https URL");
        refused("sandbox_url", "https://x/?q=1".into(), "must not have a query or fragment");
        refused("max_in_flight", 0.into(), "nonzero");
        refused("connections", 0.into(), "must be between 1 and 64");
        refused("connections", 65.into(), "must be between 1 and 64");
        refused("expiration_seconds", 2_419_201.into(), "must be between 0 and 2419200 seconds");
        refused("expiration_seconds", (-1).into(), "invalid value");
    }
}
