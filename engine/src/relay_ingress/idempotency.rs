//! Spec 003 §2.5: "Push servers deduplicate on delivery_id (keep the ids seen
//! within ttl)". The records live in the `Store` (both backends), so a
//! restart or another fanout node behind the same ScyllaDB keyspace answers a
//! retry the same way.
//!
//! A delivery is first *claimed* (a pending record with a lease), then
//! *settled* with the provider's final answer, or *released* when the answer
//! was transient so that the hub's retry sends again. Concurrent requests of
//! one delivery_id (a hub retrying while the first attempt is still out) see
//! the claim and are told to retry: one provider request, not two. A claim
//! whose holder died (a crash mid-attempt) is taken over once its lease ran
//! out: the push may then go out twice, which §2.5 tolerates, but it is never
//! lost.

use std::sync::Arc;
use std::time::Duration;

use super::error::IngressError;
use super::request::Webhook;
use crate::domain::{Clock, RelayClaim, RelayKey, RelaySettled};
use crate::store::Store;
use crate::transport::ATTEMPT_TIMEOUT;

/// A claim outlives its attempt (bounded to ATTEMPT_TIMEOUT) with room for
/// the store calls around it.
const LEASE: Duration = Duration::from_secs(ATTEMPT_TIMEOUT.as_secs() * 3);

pub(super) struct Ledger {
    store: Arc<dyn Store>,
    /// The time claims' leases and the records' expiry run on.
    clock: Arc<dyn Clock>,
}

/// A claim this request holds.
pub(super) struct Claim {
    key: RelayKey,
    lease_until_ms: i64,
    expires_at_ms: i64,
}

pub(super) enum Claimed {
    /// Send it.
    New(Claim),
    /// Answer as before, without a provider request.
    Settled(RelaySettled),
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Ledger {
    pub(super) fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        Self { store, clock }
    }

    pub(super) async fn claim(&self, webhook: &Webhook) -> Result<Claimed, IngressError> {
        let key = RelayKey { hub_id: webhook.hub_id.clone(), delivery_id: webhook.delivery_id.clone() };
        let now = self.clock.now_ms();
        let lease_until_ms = now.saturating_add(millis(LEASE));
        let expires_at_ms = now.saturating_add(millis(webhook.ttl));
        // The instrumented store counts and logs a backend failure.
        let claimed = self
            .store
            .relay()
            .claim(&key, now, lease_until_ms, expires_at_ms)
            .await
            .map_err(|_| IngressError::Storage)?;
        match claimed {
            RelayClaim::Claimed => Ok(Claimed::New(Claim { key, lease_until_ms, expires_at_ms })),
            RelayClaim::Settled(settled) => Ok(Claimed::Settled(settled)),
            // The holder usually answers long before its lease ends: ask
            // for the earliest retry rather than the end of the lease.
            RelayClaim::Busy { .. } => Err(IngressError::InProgress { retry_after_secs: 1 }),
        }
    }

    /// A failure is logged (by the instrumented store) and otherwise
    /// ignored: the claim then runs out and a retry sends again.
    pub(super) async fn settle(&self, claim: &Claim, settled: RelaySettled) {
        let _ = self.store.relay().settle(&claim.key, claim.lease_until_ms, settled, claim.expires_at_ms).await;
    }

    pub(super) async fn release(&self, claim: &Claim) {
        let _ = self.store.relay().release(&claim.key, claim.lease_until_ms).await;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::*;
    use crate::channel::RelayPriority;
    use crate::store::RedbStore;
    use crate::testing::TestClock;

    const T0: i64 = 1_767_225_600_000;
    const TTL: Duration = Duration::from_secs(60);

    fn webhook(delivery_id: &str) -> Webhook {
        Webhook {
            hub_id: "hub-a".into(),
            delivery_id: delivery_id.into(),
            provider: "fcm".into(),
            token: "t".into(),
            app_id: None,
            sandbox: false,
            priority: RelayPriority::Normal,
            collapse_id: None,
            ttl: TTL,
            payload: Map::new(),
            p256dh: None,
            auth: None,
        }
    }

    fn ledger() -> (tempfile::TempDir, Ledger, Arc<TestClock>) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), 4).unwrap());
        let clock = TestClock::at(T0);
        (dir, Ledger::new(store, clock.clone()), clock)
    }

    async fn claimed(ledger: &Ledger, delivery_id: &str) -> Claim {
        match ledger.claim(&webhook(delivery_id)).await {
            Ok(Claimed::New(claim)) => claim,
            other => panic!("not claimed: {:?}", other.map(|_| ()).err()),
        }
    }

    #[tokio::test]
    async fn a_settled_delivery_is_answered_as_before_until_its_ttl_ends_exactly() {
        let (_dir, ledger, clock) = ledger();
        let claim = claimed(&ledger, "d1").await;
        ledger.settle(&claim, RelaySettled::Delivered).await;
        clock.set(T0 + TTL.as_millis() as i64 - 1);
        assert!(matches!(ledger.claim(&webhook("d1")).await, Ok(Claimed::Settled(RelaySettled::Delivered))));
        // At its TTL the id is no longer kept (§2.5): a delivery sends again.
        clock.set(T0 + TTL.as_millis() as i64);
        claimed(&ledger, "d1").await;
    }

    #[tokio::test]
    async fn a_claim_in_flight_turns_retries_away_until_its_lease_ends() {
        let (_dir, ledger, clock) = ledger();
        let _held = claimed(&ledger, "d2").await;
        clock.set(T0 + LEASE.as_millis() as i64 - 1);
        let busy = ledger.claim(&webhook("d2")).await;
        assert!(matches!(busy, Err(IngressError::InProgress { retry_after_secs: 1 })), "one provider request");
        // Its holder died: the claim is taken over, the push never lost.
        clock.set(T0 + LEASE.as_millis() as i64);
        claimed(&ledger, "d2").await;
    }

    #[tokio::test]
    async fn a_released_claim_sends_again_at_once() {
        let (_dir, ledger, _clock) = ledger();
        let claim = claimed(&ledger, "d3").await;
        ledger.release(&claim).await;
        claimed(&ledger, "d3").await;
    }
}
