//! Which HTTP version each receiver host speaks, so that a burst to an
//! HTTP/2 host shares one connection per client instead of opening one per
//! request.
//!
//! hyper-util's pooled client cannot know that a host speaks HTTP/2 before
//! ALPN has said so on a connection: when the version is left to ALPN, every
//! request that finds no pooled connection opens one of its own, and all but
//! one are dropped once the first says h2. A burst of 100,000 webhooks to a
//! new host opened 741 TLS connections, each a full handshake on both sides.
//!
//! So a request to a host the pool does not know goes through a probing
//! HTTP/2 client (`Http2Client::probing`), which offers h2 and http/1.1 and
//! holds a connecting lock per host: the requests of a burst wait for that
//! one connection's ALPN result, never for another request's answer. On h2
//! they all share the connection; on http/1.1 none of them was sent, and
//! each goes through the lane's ALPN client. What the connection said is
//! remembered here, so later requests take their client at once. An HTTP/2
//! request that fails forgets the host, so a receiver that changed its
//! protocols is learned again.

use std::collections::HashMap;
use std::sync::Mutex;

use http::Version;
use http::uri::Authority;

/// Hosts remembered at most; past it the table starts again (each host
/// costs one probing connect to learn again).
const CAPACITY: usize = 16_384;

/// Which of a lane's clients carries a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The host negotiated h2: the HTTP/2 client.
    Http2,
    /// The host negotiated http/1.1: the ALPN client.
    Http1,
    /// Not known yet: the probing client, which learns it from the connection.
    Probe,
}

/// What the pool knows of its hosts.
#[derive(Default)]
pub struct HostProtocols {
    hosts: Mutex<HashMap<Authority, Version>>,
}

impl HostProtocols {
    /// The route of a request to `host`. Never waits.
    pub fn route(&self, host: &Authority) -> Route {
        match self.hosts.lock().expect("the host table's lock is never poisoned").get(host) {
            Some(&Version::HTTP_2) => Route::Http2,
            Some(_) => Route::Http1,
            None => Route::Probe,
        }
    }

    /// A connection to `host` negotiated `version`.
    pub fn learned(&self, host: &Authority, version: Version) {
        let mut hosts = self.hosts.lock().expect("the host table's lock is never poisoned");
        if hosts.len() >= CAPACITY && !hosts.contains_key(host) {
            hosts.clear();
        }
        hosts.insert(host.clone(), version);
    }

    /// An HTTP/2 request to `host` failed: learn its protocol again.
    pub fn forget(&self, host: &Authority) {
        let mut hosts = self.hosts.lock().expect("the host table's lock is never poisoned");
        if hosts.get(host) == Some(&Version::HTTP_2) {
            hosts.remove(host);
        }
    }

    #[cfg(test)]
    pub(crate) fn knows(&self, host: &Authority) -> Option<Version> {
        self.hosts.lock().unwrap().get(host).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str) -> Authority {
        Authority::try_from(name).unwrap()
    }

    #[test]
    fn an_unknown_host_is_probed_and_a_learned_one_routed() {
        let hosts = HostProtocols::default();
        let (a, b) = (host("a.example:443"), host("b.example"));
        assert_eq!(hosts.route(&a), Route::Probe);
        hosts.learned(&a, Version::HTTP_2);
        hosts.learned(&b, Version::HTTP_11);
        assert_eq!((hosts.route(&a), hosts.route(&b)), (Route::Http2, Route::Http1));
        // Forgetting applies to HTTP/2 hosts only.
        hosts.forget(&b);
        hosts.forget(&a);
        assert_eq!((hosts.route(&a), hosts.route(&b)), (Route::Probe, Route::Http1));
    }

    #[test]
    fn a_full_table_starts_again() {
        let hosts = HostProtocols::default();
        for i in 0..CAPACITY {
            hosts.learned(&host(&format!("h{i}.example")), Version::HTTP_2);
        }
        hosts.learned(&host("h0.example"), Version::HTTP_11);
        assert_eq!(hosts.hosts.lock().unwrap().len(), CAPACITY, "a known host is updated in place");
        hosts.learned(&host("new.example"), Version::HTTP_2);
        assert_eq!(hosts.hosts.lock().unwrap().len(), 1);
        assert_eq!(hosts.route(&host("new.example")), Route::Http2);
    }
}
