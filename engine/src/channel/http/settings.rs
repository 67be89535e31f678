use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::safety::DomainPattern;
use crate::channel::settings::{check_pool, default_max_in_flight};

/// Default number of independent connection pools to one receiver: an HTTP/2
/// receiver gets up to this many connections, so its per-connection stream
/// limit (often 100 or 200) does not cap the engine's concurrency to it.
pub const DEFAULT_CONNECTIONS: usize = 4;

fn default_connections() -> usize {
    DEFAULT_CONNECTIONS
}

/// `[engine.channels.http]`: signed HTTPS webhooks (PUSH-235) to checked
/// destinations only (PUSH-256). Every key has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// When not empty, a webhook host must match an entry (`host` or `*.suffix`).
    pub allowed_domains: Vec<String>,
    /// Development and test only: allow private, loopback and other blocked addresses.
    pub allow_private_addresses: bool,
    /// DNS servers for webhook hosts; empty means the system configuration.
    pub dns_servers: Vec<SocketAddr>,
    /// Extra PEM CA certificates trusted for webhook TLS, besides the system roots.
    pub extra_ca_files: Vec<PathBuf>,
    /// Most webhook requests in flight at once; further sends wait. Default 1000.
    pub max_in_flight: usize,
    /// Connection pools used round-robin (each holds one HTTP/2 connection
    /// per receiver host). Default 4.
    pub connections: usize,
    /// Requests per second across all receivers; 0 (the default) = no limit.
    pub rate_limit_per_second: u32,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            allowed_domains: Vec::new(),
            allow_private_addresses: false,
            dns_servers: Vec::new(),
            extra_ca_files: Vec::new(),
            max_in_flight: default_max_in_flight(),
            connections: default_connections(),
            rate_limit_per_second: 0,
        }
    }
}

impl HttpSettings {
    /// Static checks; the error starts with the bad key's name.
    pub fn validate(&self) -> Result<(), String> {
        for d in &self.allowed_domains {
            DomainPattern::parse(d).map_err(|e| format!("allowed_domains: {e}"))?;
        }
        check_pool(self.max_in_flight, self.connections)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let s: HttpSettings = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(s.allowed_domains.is_empty() && !s.allow_private_addresses && s.dns_servers.is_empty());
        assert_eq!((s.max_in_flight, s.connections, s.rate_limit_per_second), (1000, 4, 0));
        s.validate().unwrap();
        let bad = HttpSettings { allowed_domains: vec!["*.".into()], ..s.clone() };
        assert!(bad.validate().unwrap_err().starts_with("allowed_domains"));
        let bad = HttpSettings { max_in_flight: 0, ..s };
        assert!(bad.validate().unwrap_err().starts_with("max_in_flight"));
    }
}
