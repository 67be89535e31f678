use std::num::NonZeroUsize;
use std::path::PathBuf;

use serde::Deserialize;

use crate::channel::common::{
    Connections, HttpsBase, PushLifetime, default_connections, default_max_in_flight, required_path,
};

/// Default host of the FCM HTTP v1 API.
pub const DEFAULT_BASE_URL: &str = "https://fcm.googleapis.com";

fn default_base_url() -> HttpsBase {
    HttpsBase::parse(DEFAULT_BASE_URL).expect("the default FCM URL is valid")
}

/// `[engine.channels.fcm]`: the FCM HTTP v1 API with a service account. The
/// service-account file is read and checked when the engine starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FcmSettings {
    /// A Google service-account JSON key file (`project_id`, `client_email`,
    /// `private_key`, `token_uri`). Its `token_uri` is where OAuth2 tokens
    /// are fetched.
    #[serde(deserialize_with = "required_path")]
    pub service_account_file: PathBuf,
    /// Default "https://fcm.googleapis.com".
    #[serde(default = "default_base_url")]
    pub base_url: HttpsBase,
    /// Extra PEM CA files trusted besides the system roots, for the FCM host
    /// and the token endpoint. Default empty.
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
    /// How long FCM may keep a push for an offline device: Android `ttl`,
    /// and `apns-expiration` for Apple devices reached through FCM. 0 to
    /// 2,419,200 seconds; 0 = deliver once, store nothing. Default 86400.
    #[serde(default)]
    pub ttl_seconds: PushLifetime,
}

impl crate::channel::common::TrustedCas for FcmSettings {
    fn extra_ca_files(&self) -> &[PathBuf] {
        &self.extra_ca_files
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<FcmSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    /// fanout.example.toml documents every key with its default.
    #[test]
    fn the_example_table_is_the_defaults() {
        let example = FcmSettings::deserialize(crate::channel::common::example_table("fcm")).unwrap();
        let defaults = parse(serde_json::json!({"service_account_file": "/sa.json"})).unwrap();
        assert_eq!(example.base_url, defaults.base_url);
        assert!(example.extra_ca_files.is_empty());
        assert_eq!((example.max_in_flight, example.connections), (defaults.max_in_flight, defaults.connections));
        assert_eq!(example.rate_limit_per_second, defaults.rate_limit_per_second);
        assert_eq!(example.ttl_seconds, defaults.ttl_seconds);
    }

    #[test]
    fn defaults_unknown_keys_and_rules() {
        let fcm = parse(serde_json::json!({"service_account_file": "/sa.json"})).unwrap();
        assert_eq!(fcm.base_url.as_str(), DEFAULT_BASE_URL);
        assert_eq!((fcm.max_in_flight.get(), fcm.connections.get(), fcm.rate_limit_per_second), (1000, 2, 0));
        assert_eq!(fcm.ttl_seconds.seconds(), 86_400);
        let fcm = parse(serde_json::json!({"service_account_file": "/sa.json", "ttl_seconds": 600})).unwrap();
        assert_eq!(fcm.ttl_seconds.seconds(), 600);
        let err = parse(serde_json::json!({"service_account_file": "/sa.json", "ttl_seconds": 2_419_201})).unwrap_err();
        assert!(err.contains("must be between 0 and 2419200 seconds"), "{err}");
        let err = parse(serde_json::json!({"service_account_file": "/sa.json", "project": "p"})).unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
        let err =
            parse(serde_json::json!({"service_account_file": "/sa.json", "base_url": "https://fcm.example/?x=1"}))
                .unwrap_err();
        assert!(err.contains("must not have a query or fragment"), "{err}");
        let err = parse(serde_json::json!({"service_account_file": "/sa.json", "connections": 0})).unwrap_err();
        assert!(err.contains("must be between 1 and 64"), "{err}");
        let err = parse(serde_json::json!({"service_account_file": ""})).unwrap_err();
        assert!(err.contains("must be set"), "{err}");
    }
}
