//! A `Store` decorator that times every operation and counts backend errors by
//! operation. Labels are operation names only (PUSH-254).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{
    Appended, GatewayRegistration, GatewayWakeup, LeasedWakeup, NodeId, NotifyClaim, NotifyKey, RegistrationRemoval,
    RelayClaim, RelayKey, RelaySettled, Revoke, RouteKey, ShardLeases, ShardPosition, Store, StoreError,
};
use crate::domain::{
    DeliveryTarget, NewEnvelope, Recipient, RecipientId, RecipientSummary, SecretHash, ShardId, StoredEnvelope,
    StoredSubscription, Subscriber, SubscriptionUpdate, Topic,
};
use crate::metrics::Metrics;

/// Every operation name this decorator reports.
pub const OPERATIONS: &[&str] = &[
    "recipient",
    "register",
    "unregister",
    "update_subscriptions",
    "subscriptions",
    "delete_recipient_if_unchanged",
    "remove_relay_registration",
    "delete_expired",
    "append",
    "shard_position",
    "read_window",
    "envelope_data",
    "advance_checkpoint",
    "subscribers",
    "relay_claim",
    "relay_settle",
    "relay_release",
    "delete_expired_relay",
    "gateway_register",
    "gateway_unregister",
    "gateway_route",
    "gateway_target",
    "gateway_mark_token_invalid",
    "gateway_notify_claim",
    "gateway_notify_commit",
    "gateway_notify_release",
    "gateway_wakeups_due",
    "gateway_wakeup_reschedule",
    "gateway_wakeup_delete",
    "gateway_state",
    "gateway_state_cas",
    "delete_expired_gateway",
];

/// The lease operations' names, reported only on a store that has leases.
pub const LEASE_OPERATIONS: &[&str] =
    &["acquire_lease", "release_lease", "lease_owner", "lease_owners", "heartbeat", "live_nodes"];

pub struct Instrumented {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl Instrumented {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        metrics.initialise_labels(OPERATIONS);
        Self { inner, metrics }
    }

    async fn observe<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        observe(&self.metrics, operation, call).await
    }
}

/// Times one operation and counts its backend error.
async fn observe<T>(
    metrics: &Metrics,
    operation: &'static str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = call.await;
    metrics.store_latency.with_label_values(&[operation]).observe(started.elapsed().as_secs_f64());
    // NotFound, SecretMismatch and TopicLimit are answers, not failures.
    if let Err(StoreError::Backend(e)) = &result {
        metrics.store_errors.with_label_values(&[operation]).inc();
        tracing::warn!(operation, error = %e, "storage operation failed");
    }
    result
}

/// The lease operations, timed and counted like every other store operation.
struct InstrumentedLeases {
    inner: Arc<dyn ShardLeases>,
    metrics: Arc<Metrics>,
}

#[async_trait]
impl ShardLeases for InstrumentedLeases {
    async fn acquire_lease(
        &self,
        shard: ShardId,
        node: &NodeId,
        address: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        observe(&self.metrics, "acquire_lease", self.inner.acquire_lease(shard, node, address, ttl)).await
    }

    async fn release_lease(&self, shard: ShardId, node: &NodeId) -> Result<(), StoreError> {
        observe(&self.metrics, "release_lease", self.inner.release_lease(shard, node)).await
    }

    async fn lease_owner(&self, shard: ShardId) -> Result<Option<(NodeId, String)>, StoreError> {
        observe(&self.metrics, "lease_owner", self.inner.lease_owner(shard)).await
    }

    async fn lease_owners(&self) -> Result<Vec<(ShardId, NodeId)>, StoreError> {
        observe(&self.metrics, "lease_owners", self.inner.lease_owners()).await
    }

    async fn heartbeat(&self, node: &NodeId, address: &str, ttl: Duration) -> Result<(), StoreError> {
        observe(&self.metrics, "heartbeat", self.inner.heartbeat(node, address, ttl)).await
    }

    async fn live_nodes(&self) -> Result<Vec<NodeId>, StoreError> {
        observe(&self.metrics, "live_nodes", self.inner.live_nodes()).await
    }
}

#[async_trait]
impl Store for Instrumented {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    async fn recipient(&self, id: &RecipientId) -> Result<Option<Recipient>, StoreError> {
        self.observe("recipient", self.inner.recipient(id)).await
    }

    async fn register(
        &self,
        id: &RecipientId,
        secret_hash: &SecretHash,
        target: &DeliveryTarget,
        now_ns: i64,
    ) -> Result<RecipientSummary, StoreError> {
        self.observe("register", self.inner.register(id, secret_hash, target, now_ns)).await
    }

    async fn unregister(&self, id: &RecipientId, secret_hash: &SecretHash) -> Result<(), StoreError> {
        self.observe("unregister", self.inner.unregister(id, secret_hash)).await
    }

    async fn update_subscriptions(
        &self,
        id: &RecipientId,
        secret_hash: &SecretHash,
        update: &SubscriptionUpdate,
        now_ns: i64,
        max_topics: u64,
    ) -> Result<RecipientSummary, StoreError> {
        let call = self.inner.update_subscriptions(id, secret_hash, update, now_ns, max_topics);
        self.observe("update_subscriptions", call).await
    }

    async fn subscriptions(&self, id: &RecipientId) -> Result<Vec<StoredSubscription>, StoreError> {
        self.observe("subscriptions", self.inner.subscriptions(id)).await
    }

    async fn remove_relay_registration(&self, removal: &RegistrationRemoval) -> Result<bool, StoreError> {
        self.observe("remove_relay_registration", self.inner.remove_relay_registration(removal)).await
    }

    async fn delete_recipient_if_unchanged(&self, expected: &Recipient) -> Result<bool, StoreError> {
        self.observe("delete_recipient_if_unchanged", self.inner.delete_recipient_if_unchanged(expected)).await
    }

    async fn delete_expired(&self, renewed_before_ns: i64) -> Result<u64, StoreError> {
        self.observe("delete_expired", self.inner.delete_expired(renewed_before_ns)).await
    }

    async fn append(&self, envelopes: &[NewEnvelope], now_ns: i64) -> Result<Vec<Appended>, StoreError> {
        self.observe("append", self.inner.append(envelopes, now_ns)).await
    }

    async fn shard_position(&self, shard: ShardId) -> Result<ShardPosition, StoreError> {
        self.observe("shard_position", self.inner.shard_position(shard)).await
    }

    async fn read_window(
        &self,
        shard: ShardId,
        after: u64,
        up_to: u64,
        limit: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        self.observe("read_window", self.inner.read_window(shard, after, up_to, limit)).await
    }

    async fn envelope_data(&self, shard: ShardId, sequence_id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.observe("envelope_data", self.inner.envelope_data(shard, sequence_id)).await
    }

    async fn advance_checkpoint(&self, shard: ShardId, checkpoint: u64) -> Result<(), StoreError> {
        self.observe("advance_checkpoint", self.inner.advance_checkpoint(shard, checkpoint)).await
    }

    async fn subscribers(
        &self,
        topic: &Topic,
        after: Option<&RecipientId>,
        limit: usize,
    ) -> Result<Vec<Subscriber>, StoreError> {
        self.observe("subscribers", self.inner.subscribers(topic, after, limit)).await
    }

    async fn relay_claim(
        &self,
        key: &RelayKey,
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<RelayClaim, StoreError> {
        self.observe("relay_claim", self.inner.relay_claim(key, now_ms, lease_until_ms, expires_at_ms)).await
    }

    async fn relay_settle(
        &self,
        key: &RelayKey,
        lease_until_ms: i64,
        settled: RelaySettled,
        expires_at_ms: i64,
    ) -> Result<(), StoreError> {
        self.observe("relay_settle", self.inner.relay_settle(key, lease_until_ms, settled, expires_at_ms)).await
    }

    async fn relay_release(&self, key: &RelayKey, lease_until_ms: i64) -> Result<(), StoreError> {
        self.observe("relay_release", self.inner.relay_release(key, lease_until_ms)).await
    }

    async fn delete_expired_relay(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.observe("delete_expired_relay", self.inner.delete_expired_relay(now_ms)).await
    }

    async fn gateway_register(&self, registration: &GatewayRegistration) -> Result<Option<String>, StoreError> {
        self.observe("gateway_register", self.inner.gateway_register(registration)).await
    }

    async fn gateway_unregister(&self, revoke: &Revoke) -> Result<bool, StoreError> {
        self.observe("gateway_unregister", self.inner.gateway_unregister(revoke)).await
    }

    async fn gateway_route(&self, route: &RouteKey, now_ms: i64) -> Result<Option<GatewayRegistration>, StoreError> {
        self.observe("gateway_route", self.inner.gateway_route(route, now_ms)).await
    }

    async fn gateway_target(
        &self,
        tenant: &str,
        push_target_id: &str,
        now_ms: i64,
    ) -> Result<Vec<GatewayRegistration>, StoreError> {
        self.observe("gateway_target", self.inner.gateway_target(tenant, push_target_id, now_ms)).await
    }

    async fn gateway_mark_token_invalid(&self, route: &RouteKey, registration_id: &str) -> Result<bool, StoreError> {
        self.observe("gateway_mark_token_invalid", self.inner.gateway_mark_token_invalid(route, registration_id)).await
    }

    async fn gateway_notify_claim(
        &self,
        key: &NotifyKey,
        digest: &[u8; 32],
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<NotifyClaim, StoreError> {
        let call = self.inner.gateway_notify_claim(key, digest, now_ms, lease_until_ms, expires_at_ms);
        self.observe("gateway_notify_claim", call).await
    }

    async fn gateway_notify_commit(
        &self,
        key: &NotifyKey,
        lease_until_ms: i64,
        response: &[u8],
        wakeups: &[GatewayWakeup],
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let call = self.inner.gateway_notify_commit(key, lease_until_ms, response, wakeups, expires_at_ms);
        self.observe("gateway_notify_commit", call).await
    }

    async fn gateway_notify_release(&self, key: &NotifyKey, lease_until_ms: i64) -> Result<(), StoreError> {
        self.observe("gateway_notify_release", self.inner.gateway_notify_release(key, lease_until_ms)).await
    }

    async fn gateway_wakeups_due(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<LeasedWakeup>, StoreError> {
        self.observe("gateway_wakeups_due", self.inner.gateway_wakeups_due(now_ms, lease_until_ms, limit)).await
    }

    async fn gateway_wakeup_reschedule(
        &self,
        leased: &LeasedWakeup,
        not_before_ms: i64,
        attempts: u32,
    ) -> Result<bool, StoreError> {
        let call = self.inner.gateway_wakeup_reschedule(leased, not_before_ms, attempts);
        self.observe("gateway_wakeup_reschedule", call).await
    }

    async fn gateway_wakeup_delete(&self, leased: &LeasedWakeup) -> Result<bool, StoreError> {
        self.observe("gateway_wakeup_delete", self.inner.gateway_wakeup_delete(leased)).await
    }

    async fn gateway_state(&self, tenant: &str, key: &[u8], now_ms: i64) -> Result<Option<Vec<u8>>, StoreError> {
        self.observe("gateway_state", self.inner.gateway_state(tenant, key, now_ms)).await
    }

    async fn gateway_state_cas(
        &self,
        tenant: &str,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let call = self.inner.gateway_state_cas(tenant, key, expected, new, now_ms, expires_at_ms);
        self.observe("gateway_state_cas", call).await
    }

    async fn delete_expired_gateway(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.observe("delete_expired_gateway", self.inner.delete_expired_gateway(now_ms)).await
    }
    fn leases(self: Arc<Self>) -> Option<Arc<dyn ShardLeases>> {
        let inner = self.inner.clone().leases()?;
        self.metrics.initialise_labels(LEASE_OPERATIONS);
        Some(Arc::new(InstrumentedLeases { inner, metrics: self.metrics.clone() }))
    }
}
