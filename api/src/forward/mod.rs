//! Any node takes any publish: the envelopes of a shard another node owns
//! are sent on to that node over node-to-node gRPC, one Publish per owner
//! per batch, and their results put back in their places. The owner appends
//! them (one writer per shard stays), so what the publisher is answered is
//! what the owner answered, envelope by envelope.
//!
//! A forwarded Publish is marked (`fanout-forwarded`) and never forwarded
//! again: an owner that lost the shard meanwhile answers those envelopes
//! itself, 14 UNAVAILABLE naming the new owner, and the publisher retries.
//! Bounded: at most `max_in_flight_per_node` forwards to one node at once,
//! and each under its deadline (the caller's, less a tenth to answer in, or
//! `timeout_ms`), so an unreachable or frozen owner costs its envelopes a
//! per-envelope UNAVAILABLE within the deadline, never the batch.

mod failure;
mod metrics;
mod peers;
mod retry;
mod settings;

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use fanout_proto::v1 as pb;
use pb::publish_service_client::PublishServiceClient;
use prometheus::Registry;
use tokio::time::{Instant, timeout_at};
use tonic::metadata::AsciiMetadataValue;

pub use failure::Failure;
use metrics::ForwardMetrics;
use peers::Peers;
pub use peers::PeersError;
pub use retry::{MAX_ROUTES, Retry, pause};
pub use settings::ForwardSettings;

use crate::tls::{Reloadable, TlsSettings};

/// The header of a forwarded Publish: its receiver never forwards it.
pub const FORWARDED: &str = "fanout-forwarded";

pub struct Forwarder {
    peers: Arc<Peers>,
    metrics: ForwardMetrics,
    timeout: Duration,
}

impl Forwarder {
    /// Reads the credential files once (an error stops the start, naming
    /// the key) and registers the forwarding metrics in `registry`.
    pub fn new(
        settings: &ForwardSettings,
        server_tls: Option<&TlsSettings>,
        registry: &Registry,
    ) -> Result<Self, PeersError> {
        Ok(Self {
            peers: Arc::new(Peers::load(settings, server_tls)?),
            metrics: ForwardMetrics::register(registry),
            timeout: settings.timeout,
        })
    }

    /// What reloads the credential files (`tls::watch_files`).
    pub fn reloadable(&self) -> Arc<dyn Reloadable> {
        self.peers.clone()
    }

    /// When a forward made now must be answered: `timeout_ms` from now, or
    /// the call's own deadline less a tenth of what is left of it (to answer
    /// the publisher in), whichever comes first.
    pub fn deadline(&self, call: Option<Instant>) -> Instant {
        let now = Instant::now();
        let own = now + self.timeout;
        match call {
            None => own,
            Some(call) => own.min(call - call.saturating_duration_since(now) / 10),
        }
    }

    /// Sends one owner's envelopes, in batch order, as one Publish marked
    /// forwarded, with this node's token or else the publisher's own
    /// `authorization`. One result per envelope, in order, or why none came.
    pub async fn forward(
        &self,
        owner: &str,
        envelopes: Vec<pb::Envelope>,
        deadline: Instant,
        authorization: Option<&AsciiMetadataValue>,
    ) -> Result<Vec<pb::PublishResult>, Failure> {
        let count = envelopes.len();
        let result = self.send(owner, envelopes, deadline, authorization).await;
        if let Err(failure) = result {
            self.metrics.failed(failure, count);
        }
        result
    }

    async fn send(
        &self,
        owner: &str,
        envelopes: Vec<pb::Envelope>,
        deadline: Instant,
        authorization: Option<&AsciiMetadataValue>,
    ) -> Result<Vec<pb::PublishResult>, Failure> {
        let peer = self.peers.peer(owner).ok_or(Failure::NotConnected)?;
        // The semaphore is never closed: an error is as good as no slot.
        let _slot = match timeout_at(deadline, peer.slots.acquire_owned()).await {
            Ok(Ok(slot)) => slot,
            _ => return Err(Failure::InFlight),
        };
        let count = envelopes.len();
        let mut request = tonic::Request::new(pb::PublishRequest { envelopes });
        // The owner's own deadline: it stops working on a forward nobody waits for.
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        request.metadata_mut().insert(FORWARDED, AsciiMetadataValue::from_static("1"));
        if let Some(token) = self.peers.token().or_else(|| authorization.cloned()) {
            request.metadata_mut().insert("authorization", token);
        }
        self.metrics.forwarded.inc_by(count as u64);
        let started = Instant::now();
        let answer = timeout_at(deadline, PublishServiceClient::new(peer.channel).publish(request)).await;
        self.metrics.seconds.observe(started.elapsed().as_secs_f64());
        let results = match answer {
            Err(_) => return Err(Failure::Timeout),
            Ok(Err(status)) => return Err(failure_of(&status)),
            Ok(Ok(response)) => response.into_inner().results,
        };
        if results.len() != count {
            return Err(Failure::Malformed);
        }
        Ok(results)
    }

    /// Counts `envelopes` routed again for `reason` (`grpc::reroute`).
    pub fn retried(&self, reason: Retry, envelopes: usize) {
        self.metrics.retried(reason, envelopes);
    }

    #[cfg(test)]
    fn failures(&self, reason: Failure) -> u64 {
        self.metrics.failures(reason)
    }
}

/// A status the transport made carries its cause: the client's own
/// enforcement of the request's `grpc-timeout` (the forward's deadline), or
/// a connection refused (nothing sent), or one that broke. One the owner
/// answered carries none.
fn failure_of(status: &tonic::Status) -> Failure {
    let mut cause = status.source();
    while let Some(error) = cause {
        if error.is::<tonic::TimeoutExpired>() {
            return Failure::Timeout;
        }
        // Refused at connect (the request never left this node), by the
        // owner's GOAWAY (it is shutting down), or never sent at all.
        if fanout_proto::routing::refused(error) {
            return Failure::NotConnected;
        }
        cause = error.source();
    }
    if status.source().is_some() {
        Failure::Unreachable
    } else if status.code() == tonic::Code::DeadlineExceeded {
        Failure::Timeout
    } else {
        Failure::Refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarder(settings: ForwardSettings) -> Forwarder {
        Forwarder::new(&settings, None, &Registry::new()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_forward_is_due_before_the_callers_deadline_and_never_after_the_timeout() {
        let f = forwarder(ForwardSettings { timeout: Duration::from_secs(10), ..ForwardSettings::default() });
        let now = Instant::now();
        assert_eq!(f.deadline(None), now + Duration::from_secs(10));
        assert_eq!(f.deadline(Some(now + Duration::from_secs(2))), now + Duration::from_millis(1800));
        assert_eq!(f.deadline(Some(now + Duration::from_secs(60))), now + Duration::from_secs(10));
        assert_eq!(f.deadline(Some(now)), now, "a call out of time forwards nothing");
    }

    #[tokio::test]
    async fn an_unreachable_owner_fails_at_once_and_is_counted_per_envelope() {
        // A port nothing listens on: the connect is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let f = forwarder(ForwardSettings::default());
        let deadline = Instant::now() + Duration::from_secs(30);
        let started = std::time::Instant::now();
        let envelopes = vec![pb::Envelope::default(), pb::Envelope::default()];
        let result = f.forward(&format!("127.0.0.1:{port}"), envelopes, deadline, None).await;
        assert_eq!(result, Err(Failure::NotConnected), "refused: never sent");
        assert!(!Failure::NotConnected.outcome_unknown());
        assert!(started.elapsed() < Duration::from_secs(5), "not held until the deadline: {:?}", started.elapsed());
        assert_eq!(f.failures(Failure::NotConnected), 2);
        assert_eq!(
            f.forward("not an address", vec![pb::Envelope::default()], deadline, None).await,
            Err(Failure::NotConnected)
        );
    }

    #[test]
    fn failures_are_told_apart_by_who_made_the_status() {
        let timed_out = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(failure_of(&timed_out), Failure::Timeout, "the client's own grpc-timeout");
        let broken = tonic::Status::from_error(Box::new(std::io::Error::other("connection reset")));
        assert_eq!(failure_of(&broken), Failure::Unreachable);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(failure_of(&tonic::Status::from_error(Box::new(refused))), Failure::NotConnected);
        assert_eq!(failure_of(&tonic::Status::deadline_exceeded("owner's deadline")), Failure::Timeout);
        assert_eq!(failure_of(&tonic::Status::unauthenticated("no token")), Failure::Refused);
        assert_eq!(failure_of(&tonic::Status::unavailable("storage unavailable")), Failure::Refused);
    }

    #[tokio::test]
    async fn a_forward_that_finds_every_slot_taken_until_its_deadline_is_never_sent() {
        let settings = ForwardSettings { max_in_flight_per_node: 1.try_into().unwrap(), ..ForwardSettings::default() };
        let f = forwarder(settings);
        let peer = f.peers.peer("127.0.0.1:9").unwrap();
        let _busy = peer.slots.clone().acquire_owned().await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(50);
        let result = f.forward("127.0.0.1:9", vec![pb::Envelope::default()], deadline, None).await;
        assert_eq!(result, Err(Failure::InFlight));
        assert!(!Failure::InFlight.outcome_unknown() && Failure::Timeout.outcome_unknown());
        assert_eq!(f.metrics.forwarded.get(), 0, "never sent");
    }
}
