//! The value types every channel table shares (`HttpsBase`, `PushLifetime`,
//! a credential file's path) and the defaults of the pool keys.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use serde::Deserialize;
use serde::de::{Deserializer, Error};

pub use crate::transport::pool::Connections;

/// Default bound on a channel's concurrent requests.
pub const DEFAULT_MAX_IN_FLIGHT: NonZeroUsize = NonZeroUsize::new(1000).unwrap();
/// Default number of HTTP/2 connections per APNs or FCM host.
pub const DEFAULT_CONNECTIONS: Connections = Connections::new(2).unwrap();

pub(crate) fn default_max_in_flight() -> NonZeroUsize {
    DEFAULT_MAX_IN_FLIGHT
}
pub(crate) fn default_connections() -> Connections {
    DEFAULT_CONNECTIONS
}

/// An absolute https URL with a host and no query or fragment: where a
/// channel sends (APNs `production_url` and `sandbox_url`, FCM `base_url`).
/// The errors name the rule, never the URL (it may carry credentials).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct HttpsBase(String);

impl HttpsBase {
    pub fn parse(url: &str) -> Result<Self, &'static str> {
        let uri: http::Uri = url.parse().map_err(|_| "must be a valid URL")?;
        if uri.scheme_str() != Some("https") {
            return Err("must be an https URL");
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err("must name a host");
        }
        if uri.query().is_some() || url.contains('#') {
            return Err("must not have a query or fragment");
        }
        Ok(Self(url.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL without trailing slashes, ready for a path to be appended.
    pub fn without_trailing_slash(&self) -> &str {
        self.0.trim_end_matches('/')
    }
}

impl TryFrom<String> for HttpsBase {
    type Error = &'static str;

    fn try_from(url: String) -> Result<Self, Self::Error> {
        Self::parse(&url)
    }
}

/// How long a provider may keep a push for a device that is offline: APNs
/// `expiration_seconds` (`apns-expiration`), FCM `ttl_seconds` (`android.ttl`
/// and the APNs block's `apns-expiration`). 0 to 2,419,200 seconds (four
/// weeks, FCM's documented maximum; Apple documents none); 0 means "now or
/// never": the provider tries once and stores nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct PushLifetime(u32);

impl PushLifetime {
    pub const MAX_SECONDS: u32 = 28 * 24 * 3600;
    /// One day: see `fanout.example.toml` for why.
    pub const DEFAULT: Self = Self(86_400);

    pub const fn new(seconds: u32) -> Option<Self> {
        if seconds <= Self::MAX_SECONDS { Some(Self(seconds)) } else { None }
    }

    pub const fn seconds(self) -> u32 {
        self.0
    }

    /// APNs's `apns-expiration` for a push sent at `now_unix_s`: the Unix
    /// second after which it is dropped, or 0 ("deliver once, store nothing").
    pub fn expires_at(self, now_unix_s: u64) -> u64 {
        if self.0 == 0 { 0 } else { now_unix_s.saturating_add(u64::from(self.0)) }
    }
}

impl Default for PushLifetime {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl TryFrom<u64> for PushLifetime {
    type Error = String;

    fn try_from(seconds: u64) -> Result<Self, String> {
        u32::try_from(seconds)
            .ok()
            .and_then(Self::new)
            .ok_or_else(|| format!("must be between 0 and {} seconds (four weeks)", Self::MAX_SECONDS))
    }
}

/// For a credential file key (`key_file`, `service_account_file`): the path
/// must not be empty. The file itself is read when the channel is built.
pub(crate) fn required_path<'de, D: Deserializer<'de>>(deserializer: D) -> Result<PathBuf, D::Error> {
    let path = PathBuf::deserialize(deserializer)?;
    if path.as_os_str().is_empty() {
        return Err(D::Error::custom("must be set"));
    }
    Ok(path)
}

/// The CA files a channel's settings name for it to trust besides the
/// system roots (`extra_ca_files`): certificates that expire, watched by the
/// expiry gauges. Each channel's settings implement it; none: no files.
pub trait TrustedCas {
    fn extra_ca_files(&self) -> &[PathBuf] {
        &[]
    }
}

/// The `[engine.channels.<name>]` block of `fanout.example.toml`,
/// uncommented: the settings tests check that it is the defaults.
#[cfg(test)]
pub(crate) fn example_table(name: &str) -> toml::Value {
    crate::testing::example_block(&format!("engine.channels.{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_bases() {
        assert_eq!(HttpsBase::parse("https://127.0.0.1:8443").unwrap().as_str(), "https://127.0.0.1:8443");
        assert_eq!(HttpsBase::parse("https://fcm.example/").unwrap().without_trailing_slash(), "https://fcm.example");
        assert_eq!(HttpsBase::parse("http://fcm.example/"), Err("must be an https URL"));
        assert_eq!(HttpsBase::parse("nope"), Err("must be an https URL"));
        assert_eq!(HttpsBase::parse("https://fcm.example/?x=1"), Err("must not have a query or fragment"));
        assert_eq!(HttpsBase::parse("https://fcm.example/#x"), Err("must not have a query or fragment"));
        assert_eq!(HttpsBase::parse("https://a b"), Err("must be a valid URL"));
        let err = serde_json::from_value::<HttpsBase>(serde_json::json!("http://user:secret@x/")).unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn push_lifetimes_are_zero_to_four_weeks() {
        assert_eq!(PushLifetime::default().seconds(), 86_400);
        assert_eq!(PushLifetime::new(0).map(|l| l.expires_at(1_700_000_000)), Some(0), "0: store nothing");
        assert_eq!(PushLifetime::new(60).map(|l| l.expires_at(1_700_000_000)), Some(1_700_000_060));
        assert_eq!(PushLifetime::new(2_419_200).map(PushLifetime::seconds), Some(2_419_200));
        assert!(PushLifetime::new(2_419_201).is_none());
        for bad in [serde_json::json!(2_419_201), serde_json::json!(-1), serde_json::json!(1.5)] {
            assert!(serde_json::from_value::<PushLifetime>(bad.clone()).is_err(), "{bad}");
        }
        let err = serde_json::from_value::<PushLifetime>(serde_json::json!(u64::MAX)).unwrap_err().to_string();
        assert!(err.contains("must be between 0 and 2419200 seconds"), "{err}");
    }

    #[test]
    fn connections_are_one_to_sixty_four() {
        assert_eq!(Connections::new(1).map(Connections::get), Some(1));
        assert_eq!(Connections::new(64).map(Connections::get), Some(64));
        assert!(Connections::new(0).is_none() && Connections::new(65).is_none());
        let err = serde_json::from_value::<Connections>(serde_json::json!(65)).unwrap_err().to_string();
        assert!(err.contains("must be between 1 and 64"), "{err}");
    }
}
