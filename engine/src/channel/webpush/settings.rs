use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use serde::Deserialize;
use serde::de::{Deserializer, Error};

use crate::channel::common::{Connections, PushLifetime, default_max_in_flight, required_path};
use crate::transport::destination::DomainPattern;

/// Default connection pools to one push service (as the HTTPS channel).
pub const DEFAULT_CONNECTIONS: Connections = Connections::new(4).unwrap();

fn default_connections() -> Connections {
    DEFAULT_CONNECTIONS
}

/// `[engine.channels.webpush]`: Web Push (RFC 8030) to browser
/// subscriptions, encrypted (RFC 8291) and identified with VAPID (RFC 8292).
/// Endpoints come from recipients, so they pass the HTTPS channel's
/// destination rules (PUSH-256) at registration and before every attempt.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebPushSettings {
    /// The VAPID private key: a P-256 key in PEM (PKCS#8 `PRIVATE KEY` or
    /// SEC 1 `EC PRIVATE KEY`). Browsers subscribe with its public key.
    #[serde(deserialize_with = "required_path")]
    pub vapid_key_file: PathBuf,
    /// The VAPID `sub` claim: a `mailto:` or `https:` URI where the push
    /// service can reach the operator (RFC 8292 section 2.1).
    #[serde(deserialize_with = "subject")]
    pub subject: String,
    /// RFC 8030 `TTL`: how long the push service keeps a push for an
    /// offline browser. 0 to 2,419,200 seconds; default 86400.
    #[serde(default)]
    pub ttl_seconds: PushLifetime,
    /// When not empty, an endpoint host must match an entry (`host` or
    /// `*.suffix`), e.g. `fcm.googleapis.com`, `*.push.services.mozilla.com`,
    /// `*.notify.windows.com`, `web.push.apple.com`.
    #[serde(default)]
    pub allowed_domains: Vec<DomainPattern>,
    /// Development and test only: allow private, loopback and other blocked addresses.
    #[serde(default)]
    pub allow_private_addresses: bool,
    /// As the HTTPS channel's key: allow the reserved classes beyond PUSH-256's table.
    #[serde(default)]
    pub allow_reserved_addresses: bool,
    /// DNS servers for endpoint hosts; empty means the system configuration.
    #[serde(default)]
    pub dns_servers: Vec<SocketAddr>,
    /// Extra PEM CA certificates trusted besides the system roots.
    #[serde(default)]
    pub extra_ca_files: Vec<PathBuf>,
    /// Most requests in flight at once; further sends wait. Default 1000.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: NonZeroUsize,
    /// Connection pools used round-robin. Default 4.
    #[serde(default = "default_connections")]
    pub connections: Connections,
    /// Requests per second across all push services; 0 (the default) = no limit.
    #[serde(default)]
    pub rate_limit_per_second: u32,
}

impl crate::channel::common::TrustedCas for WebPushSettings {
    fn extra_ca_files(&self) -> &[PathBuf] {
        &self.extra_ca_files
    }
}

/// RFC 8292 section 2.1: `mailto:` or `https:`.
fn subject<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let subject = String::deserialize(deserializer)?;
    let ok = (subject.strip_prefix("mailto:").is_some_and(|a| a.contains('@'))
        || subject.strip_prefix("https://").is_some_and(|h| !h.is_empty()))
        && !subject.chars().any(char::is_control);
    if !ok {
        return Err(D::Error::custom("must be a mailto: address or an https: URL"));
    }
    Ok(subject)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<WebPushSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    fn minimal() -> serde_json::Value {
        serde_json::json!({"vapid_key_file": "/vapid.pem", "subject": "mailto:ops@example.com"})
    }

    /// fanout.example.toml documents every key with its default.
    #[test]
    fn the_example_table_is_the_defaults() {
        let example = WebPushSettings::deserialize(crate::channel::common::example_table("webpush")).unwrap();
        let defaults = parse(minimal()).unwrap();
        assert_eq!(example.ttl_seconds, defaults.ttl_seconds);
        assert!(example.allowed_domains.is_empty() && example.dns_servers.is_empty());
        assert!(example.extra_ca_files.is_empty());
        assert!(!example.allow_private_addresses && !example.allow_reserved_addresses);
        assert_eq!((example.max_in_flight, example.connections), (defaults.max_in_flight, defaults.connections));
        assert_eq!(example.rate_limit_per_second, defaults.rate_limit_per_second);
    }

    #[test]
    fn defaults_and_rules() {
        let s = parse(minimal()).unwrap();
        assert_eq!(s.ttl_seconds.seconds(), 86_400);
        assert_eq!((s.max_in_flight.get(), s.connections.get(), s.rate_limit_per_second), (1000, 4, 0));
        assert!(!s.allow_private_addresses && s.allowed_domains.is_empty());
        let mut j = minimal();
        j["subject"] = "https://ops.example.com/contact".into();
        assert!(parse(j).is_ok());
        for bad in ["ops@example.com", "mailto:", "http://example.com", ""] {
            let mut j = minimal();
            j["subject"] = bad.into();
            assert!(parse(j).unwrap_err().contains("must be a mailto: address or an https: URL"), "{bad}");
        }
        let mut j = minimal();
        j["vapid_key_file"] = "".into();
        assert!(parse(j).unwrap_err().contains("must be set"));
        let mut j = minimal();
        j["url"] = "x".into();
        assert!(parse(j).unwrap_err().contains("unknown field"));
        let mut j = minimal();
        j["allowed_domains"] = serde_json::json!(["*.push.services.mozilla.com"]);
        assert_eq!(parse(j).unwrap().allowed_domains, [DomainPattern::Wildcard("push.services.mozilla.com".into())]);
    }
}
