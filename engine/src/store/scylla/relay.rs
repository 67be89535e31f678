//! Spec 003 §2.5 on ScyllaDB: the relay ingress's delivery records in
//! `relay_deliveries` (schema version 5). Each record is one partition, so
//! claim, settle and release are single-partition lightweight transactions;
//! every write carries a TTL ending at the record's `expires_at`, so the
//! records expire by themselves (retention has nothing to do here).

use std::sync::Arc;

use async_trait::async_trait;
use scylla::client::session::Session;

use super::cql::{Execute, retry, statements, ttl_until};
use crate::domain::{RelayClaim, RelayKey, RelaySettled};
use crate::store::{RelayStore, StoreError};

/// The relay ingress's `RelayStore` on ScyllaDB.
pub(super) struct ScyllaRelay {
    session: Arc<Session>,
    st: RelayStatements,
}

impl ScyllaRelay {
    pub(super) async fn prepare(session: &Arc<Session>, ks: &str) -> Result<Self, StoreError> {
        Ok(Self { session: Arc::clone(session), st: RelayStatements::prepare(session, ks).await? })
    }
}

statements! {
    struct RelayStatements;
    fn prepare(session, ks);
    insert: "INSERT INTO {ks}.relay_deliveries (hub_id, delivery_id, state, lease_until, expires_at) \
             VALUES (?, ?, 0, ?, ?) IF NOT EXISTS USING TTL ?",
    // A dead claimant's or an expired record is taken over only if it
    // is still exactly what was read: of two callers, one wins.
    take_over: "UPDATE {ks}.relay_deliveries USING TTL ? SET state = 0, lease_until = ?, expires_at = ? \
                WHERE hub_id = ? AND delivery_id = ? IF state = ? AND lease_until = ? AND expires_at = ?",
    // Every column is written again so that all of them get the new TTL.
    settle: "UPDATE {ks}.relay_deliveries USING TTL ? SET state = ?, lease_until = ?, expires_at = ? \
             WHERE hub_id = ? AND delivery_id = ? IF state = 0 AND lease_until = ?",
    release: "DELETE FROM {ks}.relay_deliveries WHERE hub_id = ? AND delivery_id = ? \
              IF state = 0 AND lease_until = ?",
}

#[async_trait]
impl RelayStore for ScyllaRelay {
    async fn claim(
        &self,
        key: &RelayKey,
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<RelayClaim, StoreError> {
        let st = &self.st;
        let (hub, id) = (key.hub_id.as_str(), key.delivery_id.as_str());
        retry(|| async move {
            let ttl = ttl_until(expires_at_ms);
            let insert = self.session.lwt(&st.insert, (hub, id, lease_until_ms, expires_at_ms, ttl)).await?;
            if insert.applied {
                return Ok(Some(RelayClaim::Claimed));
            }
            let read =
                (insert.current_i8("state"), insert.current_i64("lease_until"), insert.current_i64("expires_at"));
            // A row caught half expired (some cells gone): try again.
            let (Some(state), Some(lease), Some(expires)) = read else { return Ok(None) };
            if expires > now_ms {
                if let Some(settled) = RelaySettled::from_code(state) {
                    return Ok(Some(RelayClaim::Settled(settled)));
                }
                if lease > now_ms {
                    return Ok(Some(RelayClaim::Busy { lease_until_ms: lease }));
                }
            }
            let values = (ttl, lease_until_ms, expires_at_ms, hub, id, state, lease, expires);
            Ok(self.session.lwt(&st.take_over, values).await?.applied.then_some(RelayClaim::Claimed))
        })
        .await
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
        self.session.lwt(&self.st.settle, values).await?;
        Ok(())
    }

    async fn release(&self, key: &RelayKey, lease_until_ms: i64) -> Result<(), StoreError> {
        let values = (key.hub_id.as_str(), key.delivery_id.as_str(), lease_until_ms);
        self.session.lwt(&self.st.release, values).await?;
        Ok(())
    }

    async fn delete_expired(&self, _now_ms: i64) -> Result<u64, StoreError> {
        // Every record is written with a TTL ending at its expires_at.
        Ok(0)
    }
}
