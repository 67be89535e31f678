use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use serde::Deserialize;

use crate::channel::common::{Connections, default_max_in_flight};
use crate::transport::destination::DomainPattern;

/// Default number of independent connection pools to one receiver: an HTTP/2
/// receiver gets up to this many connections, so its per-connection stream
/// limit (often 100 or 200) does not cap the engine's concurrency to it.
pub const DEFAULT_CONNECTIONS: Connections = Connections::new(4).unwrap();

fn default_connections() -> Connections {
    DEFAULT_CONNECTIONS
}

/// `[engine.channels.http]`: signed HTTPS webhooks (PUSH-235) to checked
/// destinations only (PUSH-256). Every key has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// When not empty, a webhook host must match an entry (`host` or `*.suffix`).
    pub allowed_domains: Vec<DomainPattern>,
    /// Development and test only: allow private, loopback and other blocked addresses.
    pub allow_private_addresses: bool,
    /// Allow the reserved classes beyond PUSH-256's table (NAT64 local use,
    /// 6to4, Teredo, IPv4-compatible, 192.0.0.0/24, benchmarking, TEST-NETs,
    /// 240.0.0.0/4, documentation). Default false: they are refused.
    pub allow_reserved_addresses: bool,
    /// DNS servers for webhook hosts; empty means the system configuration.
    pub dns_servers: Vec<SocketAddr>,
    /// Extra PEM CA certificates trusted for webhook TLS, besides the system roots.
    pub extra_ca_files: Vec<PathBuf>,
    /// Most webhook requests in flight at once; further sends wait. A slot is
    /// free again once the answer's status line is in (its body drains in the
    /// background, at most this many at once). Default 1000.
    pub max_in_flight: NonZeroUsize,
    /// Connection pools used round-robin (each holds one HTTP/2 connection
    /// per receiver host). Default 4.
    pub connections: Connections,
    /// Requests per second across all receivers; 0 (the default) = no limit.
    pub rate_limit_per_second: u32,
}

impl crate::channel::common::TrustedCas for HttpSettings {
    fn extra_ca_files(&self) -> &[PathBuf] {
        &self.extra_ca_files
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            allowed_domains: Vec::new(),
            allow_private_addresses: false,
            allow_reserved_addresses: false,
            dns_servers: Vec::new(),
            extra_ca_files: Vec::new(),
            max_in_flight: default_max_in_flight(),
            connections: default_connections(),
            rate_limit_per_second: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<HttpSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_rules() {
        let s = parse(serde_json::json!({})).unwrap();
        assert!(s.allowed_domains.is_empty() && !s.allow_private_addresses && s.dns_servers.is_empty());
        assert!(!s.allow_reserved_addresses, "the reserved classes are refused by default");
        assert_eq!((s.max_in_flight.get(), s.connections.get(), s.rate_limit_per_second), (1000, 4, 0));
        let s = parse(serde_json::json!({"allowed_domains": ["Hooks.Example.com", "*.example.net"]})).unwrap();
        assert_eq!(
            s.allowed_domains,
            [DomainPattern::Exact("hooks.example.com".into()), DomainPattern::Wildcard("example.net".into())]
        );
        let err = parse(serde_json::json!({"allowed_domains": ["*."]})).unwrap_err();
        assert!(err.contains("must be a host name or *. followed by a host name"), "{err}");
        let err = parse(serde_json::json!({"max_in_flight": 0})).unwrap_err();
        assert!(err.contains("nonzero"), "{err}");
    }
}
