use serde::Deserialize;

use super::apns::ApnsSettings;
use super::fcm::FcmSettings;
use super::http::HttpSettings;

/// `[engine.channels]`: one optional table per channel, named as the channel
/// is everywhere else (`Channel::as_str`). A channel exists only when its table
/// is present (section 2, PUSH-210). With no `[engine.channels]` table at all,
/// the HTTPS channel is configured with safe defaults; once the table is
/// written, exactly the channels it lists exist (an empty table configures none).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelSettings {
    pub http: Option<HttpSettings>,
    /// `[engine.channels.apns]`; absent by default.
    pub apns: Option<ApnsSettings>,
    /// `[engine.channels.fcm]`; absent by default.
    pub fcm: Option<FcmSettings>,
}

impl ChannelSettings {
    /// What a deployment gets with no `[engine.channels]` table: HTTPS only.
    pub fn https_only() -> Self {
        Self { http: Some(HttpSettings::default()), ..Self::default() }
    }

    /// Each present table's static checks; the error starts with the key
    /// path below `engine.`.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(apns) = &self.apns {
            apns.validate().map_err(|e| format!("channels.apns.{e}"))?;
        }
        if let Some(fcm) = &self.fcm {
            fcm.validate().map_err(|e| format!("channels.fcm.{e}"))?;
        }
        if let Some(http) = &self.http {
            http.validate().map_err(|e| format!("channels.http.{e}"))?;
        }
        Ok(())
    }
}

/// Default bound on a channel's concurrent requests.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1000;
/// Default number of HTTP/2 connections per APNs or FCM host.
pub const DEFAULT_CONNECTIONS: usize = 2;
/// Most connections a channel may be given.
pub const MAX_CONNECTIONS: usize = 64;

pub(crate) fn default_max_in_flight() -> usize {
    DEFAULT_MAX_IN_FLIGHT
}
pub(crate) fn default_connections() -> usize {
    DEFAULT_CONNECTIONS
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

/// The pool keys every channel table has.
pub(crate) fn check_pool(max_in_flight: usize, connections: usize) -> Result<(), String> {
    if max_in_flight == 0 {
        return Err("max_in_flight must be greater than zero".into());
    }
    if connections == 0 || connections > MAX_CONNECTIONS {
        return Err(format!("connections must be between 1 and {MAX_CONNECTIONS}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels(json: serde_json::Value) -> Result<ChannelSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn provider_channel_tables_are_absent_by_default() {
        let c = ChannelSettings::https_only();
        assert!(c.http.is_some() && c.apns.is_none() && c.fcm.is_none(), "no table: HTTPS only");
        let c = channels(serde_json::json!({})).unwrap();
        assert!(c.http.is_none() && c.apns.is_none() && c.fcm.is_none(), "an empty table: no channel");
        let c = channels(serde_json::json!({"http": {}})).unwrap();
        assert!(c.http.is_some() && c.apns.is_none(), "an empty http table configures HTTPS");
    }

    #[test]
    fn https_bases() {
        assert!(check_https_base("u", "https://127.0.0.1:8443").is_ok());
        assert!(check_https_base("u", "https://fcm.example/").is_ok());
        assert!(check_https_base("u", "http://fcm.example/").unwrap_err().starts_with("u must be an https URL"));
        assert!(check_https_base("u", "https://fcm.example/?x=1").is_err());
        assert!(check_https_base("u", "https://fcm.example/#x").is_err());
    }
}
