//! Which HTTP version each receiver host speaks, learned from its first
//! answer, so that a burst to an HTTP/2 host shares one connection per
//! client instead of opening one per request (issue 18).
//!
//! hyper-util's pooled client cannot know that a host speaks HTTP/2 before
//! ALPN has said so on a connection: when the version is left to ALPN, every
//! request that finds no pooled connection opens one of its own, and all but
//! one are dropped once the first says h2. A burst of 100,000 webhooks to a
//! new host opened 741 TLS connections, each a full handshake on both sides.
//! The HTTP/2 client (`channel::http2`) holds a connecting lock per host instead.
//!
//! So the first request to a host the pool does not know goes alone through
//! the ALPN client; the others to that host wait for its answer (never past
//! the attempt bound). The version of that answer picks the client for the
//! host from then on: the HTTP/2 one, or the ALPN one for an HTTP/1.1
//! host (which needs a connection per request in flight anyway). An HTTP/2
//! request that fails forgets the host, so a receiver that changed its
//! protocols is learned again.

use std::collections::HashMap;
use std::sync::Mutex;

use http::Version;
use http::uri::Authority;
use tokio::sync::watch;

/// Hosts remembered at most; past it the learned ones are forgotten (each
/// costs one lone request to learn again).
const CAPACITY: usize = 16_384;
/// A waiting request learns the host's protocol from at most this many
/// first requests before it goes ahead through the ALPN client.
const MAX_WAITS: usize = 3;

/// Which of a lane's clients carries a request.
#[derive(Debug)]
pub enum Route<'a> {
    /// The host answered over HTTP/2: the HTTP/2 client.
    Http2,
    /// The host speaks HTTP/1.1, or learning gave up: the ALPN client.
    Alpn,
    /// Nobody knows the host yet: this request goes first, through the ALPN
    /// client, and tells what it learned (or dropping the guard, that it
    /// learned nothing).
    Learn(Learning<'a>),
}

enum State {
    /// A first request is in flight; its sender is dropped when it ends.
    Learning(watch::Receiver<()>),
    Http2,
    Http1,
}

/// What the pool knows of its hosts.
#[derive(Default)]
pub struct HostProtocols {
    hosts: Mutex<HashMap<Authority, State>>,
}

impl HostProtocols {
    /// The route of a request to `host`, after waiting for the first request
    /// to it if one is in flight. The caller bounds the wait with the
    /// attempt's own.
    pub async fn route(&self, host: &Authority) -> Route<'_> {
        for _ in 0..MAX_WAITS {
            let mut first = {
                let mut hosts = self.hosts.lock().expect("the host table's lock is never poisoned");
                match hosts.get(host) {
                    Some(State::Http2) => return Route::Http2,
                    Some(State::Http1) => return Route::Alpn,
                    Some(State::Learning(first)) => first.clone(),
                    None => {
                        if hosts.len() >= CAPACITY {
                            hosts.retain(|_, state| matches!(state, State::Learning(_)));
                        }
                        let (done, first) = watch::channel(());
                        hosts.insert(host.clone(), State::Learning(first));
                        return Route::Learn(Learning { hosts: self, host: host.clone(), _done: done });
                    }
                }
            };
            // Ends when the first request's guard is dropped.
            let _ = first.changed().await;
        }
        Route::Alpn
    }

    /// An HTTP/2 request to `host` failed: learn its protocol again.
    pub fn forget(&self, host: &Authority) {
        let mut hosts = self.hosts.lock().expect("the host table's lock is never poisoned");
        if matches!(hosts.get(host), Some(State::Http2)) {
            hosts.remove(host);
        }
    }

    #[cfg(test)]
    pub(crate) fn knows(&self, host: &Authority) -> Option<Version> {
        match self.hosts.lock().unwrap().get(host) {
            Some(State::Http2) => Some(Version::HTTP_2),
            Some(State::Http1) => Some(Version::HTTP_11),
            _ => None,
        }
    }
}

/// The first request to a host. Dropped without `learned` (an error, a
/// timeout, a cancelled attempt), it leaves the host unknown and lets the
/// next waiting request go first.
pub struct Learning<'a> {
    hosts: &'a HostProtocols,
    host: Authority,
    _done: watch::Sender<()>,
}

impl Learning<'_> {
    /// The host answered over `version`.
    pub fn learned(self, version: Version) {
        let state = if version == Version::HTTP_2 { State::Http2 } else { State::Http1 };
        self.hosts.hosts.lock().expect("the host table's lock is never poisoned").insert(self.host.clone(), state);
        // Drop removes nothing now: the entry is no longer `Learning`.
    }
}

impl Drop for Learning<'_> {
    fn drop(&mut self) {
        let mut hosts = self.hosts.hosts.lock().expect("the host table's lock is never poisoned");
        if matches!(hosts.get(&self.host), Some(State::Learning(_))) {
            hosts.remove(&self.host);
        }
    }
}

impl std::fmt::Debug for Learning<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No host: PUSH-254.
        f.debug_struct("Learning").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn host(name: &str) -> Authority {
        Authority::from_maybe_shared(name.to_owned()).unwrap()
    }

    #[tokio::test]
    async fn the_first_request_learns_and_the_others_wait_for_it() {
        let hosts = HostProtocols::default();
        let a = host("a.example:443");
        let Route::Learn(first) = hosts.route(&a).await else { panic!("the first request learns") };
        // A second request waits while the first is in flight.
        let second = hosts.route(&a);
        tokio::pin!(second);
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut second).await.is_err());
        first.learned(Version::HTTP_2);
        assert!(matches!(second.await, Route::Http2));
        assert_eq!(hosts.knows(&a), Some(Version::HTTP_2));
        // Other hosts are learned on their own.
        assert!(matches!(hosts.route(&host("b.example")).await, Route::Learn(_)));
    }

    #[tokio::test]
    async fn an_http1_answer_routes_through_the_alpn_client() {
        let hosts = HostProtocols::default();
        let a = host("a.example");
        let Route::Learn(first) = hosts.route(&a).await else { panic!() };
        first.learned(Version::HTTP_11);
        assert!(matches!(hosts.route(&a).await, Route::Alpn));
        // Forgetting applies to HTTP/2 hosts only.
        hosts.forget(&a);
        assert_eq!(hosts.knows(&a), Some(Version::HTTP_11));
    }

    #[tokio::test]
    async fn a_first_request_that_fails_lets_a_waiting_one_learn() {
        let hosts = HostProtocols::default();
        let a = host("a.example");
        let Route::Learn(first) = hosts.route(&a).await else { panic!() };
        let second = hosts.route(&a);
        tokio::pin!(second);
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut second).await.is_err());
        drop(first);
        let Route::Learn(second) = second.await else { panic!("the waiting request goes first now") };
        second.learned(Version::HTTP_2);
        hosts.forget(&a);
        assert_eq!(hosts.knows(&a), None, "a failed HTTP/2 request forgets the host");
    }

    #[tokio::test]
    async fn a_full_table_forgets_what_it_learned_but_not_what_is_being_learned() {
        let hosts = HostProtocols::default();
        let learning = host("learning.example");
        let Route::Learn(_pending) = hosts.route(&learning).await else { panic!() };
        for i in 0..CAPACITY {
            if let Route::Learn(first) = hosts.route(&host(&format!("h{i}.example"))).await {
                first.learned(Version::HTTP_2);
            }
        }
        let table = hosts.hosts.lock().unwrap();
        assert!(table.len() <= CAPACITY);
        assert!(matches!(table.get(&learning), Some(State::Learning(_))));
    }
}
