use std::path::PathBuf;

use serde::Deserialize;

use crate::channel::settings::{check_https_base, check_pool, default_connections, default_max_in_flight};

/// Default host of the FCM HTTP v1 API.
pub const DEFAULT_BASE_URL: &str = "https://fcm.googleapis.com";

fn default_base_url() -> String {
    DEFAULT_BASE_URL.into()
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
    #[serde(default = "default_base_url")]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_unknown_keys_and_validation() {
        let fcm: FcmSettings = serde_json::from_value(serde_json::json!({"service_account_file": "/sa.json"})).unwrap();
        assert_eq!(fcm.base_url, DEFAULT_BASE_URL);
        assert_eq!((fcm.max_in_flight, fcm.connections, fcm.rate_limit_per_second), (1000, 2, 0));
        fcm.validate().unwrap();
        let err = serde_json::from_value::<FcmSettings>(
            serde_json::json!({"service_account_file": "/sa.json", "project": "p"}),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field"), "{err}");
        let bad = FcmSettings { base_url: "https://fcm.example/?x=1".into(), ..fcm.clone() };
        assert!(bad.validate().unwrap_err().starts_with("base_url"));
        let bad = FcmSettings { connections: 0, ..fcm };
        assert!(bad.validate().unwrap_err().starts_with("connections"));
    }
}
