//! Spec 003 §2.5 on ScyllaDB: the relay ingress's delivery records in
//! `relay_deliveries` (schema version 5). Each record is one partition, so
//! claim, settle and release are single-partition lightweight transactions;
//! every write carries a TTL ending at the record's `expires_at`, so the
//! records expire by themselves (retention has nothing to do here).

use async_trait::async_trait;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::{MAX_LWT_ATTEMPTS, ScyllaStore, backoff, be, contention};
use crate::domain::{RelayClaim, RelayKey, RelaySettled, Timestamp};
use crate::store::{RelayStore, StoreError};

pub(super) struct RelayStatements {
    insert: PreparedStatement,
    take_over: PreparedStatement,
    settle: PreparedStatement,
    release: PreparedStatement,
}

impl RelayStatements {
    pub(super) async fn prepare(session: &Session, ks: &str) -> Result<Self, StoreError> {
        let p = |cql: String| async move { session.prepare(cql).await.map_err(be("preparing a statement")) };
        Ok(Self {
            insert: p(format!(
                "INSERT INTO {ks}.relay_deliveries (hub_id, delivery_id, state, lease_until, expires_at) \
                 VALUES (?, ?, 0, ?, ?) IF NOT EXISTS USING TTL ?"
            ))
            .await?,
            // A dead claimant's or an expired record is taken over only if it
            // is still exactly what was read: of two callers, one wins.
            take_over: p(format!(
                "UPDATE {ks}.relay_deliveries USING TTL ? SET state = 0, lease_until = ?, expires_at = ? \
                 WHERE hub_id = ? AND delivery_id = ? IF state = ? AND lease_until = ? AND expires_at = ?"
            ))
            .await?,
            // Every column is written again so that all of them get the new TTL.
            settle: p(format!(
                "UPDATE {ks}.relay_deliveries USING TTL ? SET state = ?, lease_until = ?, expires_at = ? \
                 WHERE hub_id = ? AND delivery_id = ? IF state = 0 AND lease_until = ?"
            ))
            .await?,
            release: p(format!(
                "DELETE FROM {ks}.relay_deliveries WHERE hub_id = ? AND delivery_id = ? \
                 IF state = 0 AND lease_until = ?"
            ))
            .await?,
        })
    }
}

/// Seconds from now to `expires_at_ms`, rounded up, at least one: the
/// record's TTL.
pub(super) fn ttl_until(expires_at_ms: i64) -> i32 {
    let now_ms = Timestamp::now().as_millis();
    let secs = (expires_at_ms.saturating_sub(now_ms) + 999) / 1000;
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

#[async_trait]
impl RelayStore for ScyllaStore {
    async fn claim(
        &self,
        key: &RelayKey,
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<RelayClaim, StoreError> {
        let st = &self.st.relay;
        let (hub, id) = (key.hub_id.as_str(), key.delivery_id.as_str());
        for attempt in 0..MAX_LWT_ATTEMPTS {
            let ttl = ttl_until(expires_at_ms);
            let insert = self.lwt(&st.insert, (hub, id, lease_until_ms, expires_at_ms, ttl)).await?;
            if insert.applied {
                return Ok(RelayClaim::Claimed);
            }
            let read =
                (insert.current_i8("state"), insert.current_i64("lease_until"), insert.current_i64("expires_at"));
            // A row caught half expired (some cells gone): try again.
            let (Some(state), Some(lease), Some(expires)) = read else {
                backoff(attempt).await;
                continue;
            };
            if expires > now_ms {
                if let Some(settled) = RelaySettled::from_code(state) {
                    return Ok(RelayClaim::Settled(settled));
                }
                if lease > now_ms {
                    return Ok(RelayClaim::Busy { lease_until_ms: lease });
                }
            }
            let values = (ttl, lease_until_ms, expires_at_ms, hub, id, state, lease, expires);
            if self.lwt(&st.take_over, values).await?.applied {
                return Ok(RelayClaim::Claimed);
            }
            backoff(attempt).await;
        }
        Err(contention())
    }

    async fn settle(
        &self,
        key: &RelayKey,
        lease_until_ms: i64,
        settled: RelaySettled,
        expires_at_ms: i64,
    ) -> Result<(), StoreError> {
        let ttl = ttl_until(expires_at_ms);
        let values = (
            ttl,
            settled.code(),
            lease_until_ms,
            expires_at_ms,
            key.hub_id.as_str(),
            key.delivery_id.as_str(),
            lease_until_ms,
        );
        // Not applied: someone took the claim over; its outcome will stand.
        self.lwt(&self.st.relay.settle, values).await?;
        Ok(())
    }

    async fn release(&self, key: &RelayKey, lease_until_ms: i64) -> Result<(), StoreError> {
        let values = (key.hub_id.as_str(), key.delivery_id.as_str(), lease_until_ms);
        self.lwt(&self.st.relay.release, values).await?;
        Ok(())
    }

    async fn delete_expired(&self, _now_ms: i64) -> Result<u64, StoreError> {
        // Every record is written with a TTL ending at its expires_at.
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_and_stay_positive() {
        let now_ms = Timestamp::now().as_millis();
        assert_eq!(ttl_until(now_ms - 5_000), 1);
        let t = ttl_until(now_ms + 86_400_000);
        assert!((86_399..=86_400).contains(&t), "{t}");
    }
}
