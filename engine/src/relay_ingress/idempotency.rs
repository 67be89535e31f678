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
use crate::domain::{RelayClaim, RelayKey, RelaySettled, Timestamp};
use crate::store::Store;
use crate::transport::ATTEMPT_TIMEOUT;

/// A claim outlives its attempt (bounded to ATTEMPT_TIMEOUT) with room for
/// the store calls around it.
const LEASE: Duration = Duration::from_secs(ATTEMPT_TIMEOUT.as_secs() * 3);

pub(super) struct Ledger {
    store: Arc<dyn Store>,
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

fn now_ms() -> i64 {
    Timestamp::now().as_millis()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Ledger {
    pub(super) fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    pub(super) async fn claim(&self, webhook: &Webhook) -> Result<Claimed, IngressError> {
        let key = RelayKey { hub_id: webhook.hub_id.clone(), delivery_id: webhook.delivery_id.clone() };
        let now = now_ms();
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
