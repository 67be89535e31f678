//! A `Store` decorator that times every operation and counts backend errors by
//! operation. Labels are operation names only (PUSH-254).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{
    Appended, CopyMark, GatewayStore, LeaseHolder, LiveNode, NodeId, ParkedStore, RegistrationRemoval, RelayStore,
    ShardLeases, ShardPosition, Store, StoreError,
};
use crate::domain::{
    Channel, DeliveryTarget, GatewayRegistration, GatewayWakeup, LeasedWakeup, NewEnvelope, NotifyClaim, NotifyKey,
    ParkedDelivery, ParkedKey, PushTargetId, Recipient, RecipientId, RecipientSummary, RegistrationId, RelayClaim,
    RelayKey, RelaySettled, Revoke, RouteKey, SecretHash, ServiceId, ShardId, ShardProgress, StoredEnvelope,
    StoredSubscription, Subscriber, SubscriptionUpdate, Topic,
};
use crate::metrics::Metrics;

/// `inner` with each of its operations timed and its backend errors counted.
/// `Instrumented` (of a whole `Store`) is also the relay, gateway and parked
/// store it hands out; `Instrumented<dyn ShardLeases>` is the leases'.
pub struct Instrumented<S: ?Sized = dyn Store> {
    inner: Arc<S>,
    metrics: Arc<Metrics>,
}

impl Instrumented {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        for operations in [STORE_OPERATIONS, RELAY_OPERATIONS, GATEWAY_OPERATIONS, PARKED_OPERATIONS] {
            metrics.initialise_labels(operations);
        }
        Self { inner, metrics }
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

/// Implements `$trait` for `Instrumented<$inner>`: each line an operation's
/// metric label and its method, which calls the same method of
/// `inner.$part()` (`as_ref`: `inner` itself) inside `observe`. `$labels`
/// names every label, in order; what follows the lines is the trait's other
/// methods.
macro_rules! instrumented {
    (
        $trait:ident for $inner:ty, via $part:ident, labels $labels:ident {
            $($label:literal: fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ok:ty;)*
        }
        $($other:tt)*
    ) => {
        /// The operation names this impl reports.
        const $labels: &[&str] = &[$($label),*];

        #[async_trait]
        impl $trait for Instrumented<$inner> {
            $(async fn $name(&self $(, $arg: $ty)*) -> Result<$ok, StoreError> {
                observe(&self.metrics, $label, self.inner.$part().$name($($arg),*)).await
            })*
            $($other)*
        }
    };
}

instrumented! {
    Store for dyn Store, via as_ref, labels STORE_OPERATIONS {
        "recipient": fn recipient(&self, id: &RecipientId) -> Option<Recipient>;
        "register": fn register(&self, id: &RecipientId, secret_hash: &SecretHash, target: &DeliveryTarget, now_ns: i64)
            -> RecipientSummary;
        "unregister": fn unregister(&self, id: &RecipientId, secret_hash: &SecretHash) -> ();
        "update_subscriptions": fn update_subscriptions(&self, id: &RecipientId, secret_hash: &SecretHash,
            update: &SubscriptionUpdate, now_ns: i64, max_topics: u64) -> RecipientSummary;
        "subscriptions": fn subscriptions(&self, id: &RecipientId) -> Vec<StoredSubscription>;
        "delete_recipient_if_unchanged": fn delete_recipient_if_unchanged(&self, expected: &Recipient) -> bool;
        "remove_relay_registration": fn remove_relay_registration(&self, removal: &RegistrationRemoval) -> bool;
        "delete_expired": fn delete_expired(&self, renewed_before_ns: i64) -> u64;
        "append": fn append(&self, envelopes: &[NewEnvelope], now_ns: i64) -> Vec<Appended>;
        "shard_position": fn shard_position(&self, shard: ShardId) -> ShardPosition;
        "read_window": fn read_window(&self, shard: ShardId, after: u64, up_to: u64, limit: usize)
            -> Vec<StoredEnvelope>;
        "envelope_data": fn envelope_data(&self, shard: ShardId, sequence_id: u64) -> Option<Vec<u8>>;
        "advance_checkpoint": fn advance_checkpoint(&self, shard: ShardId, checkpoint: u64) -> ();
        "record_progress": fn record_progress(&self, shard: ShardId, progress: &ShardProgress) -> ();
        "shard_progress": fn shard_progress(&self, shard: ShardId) -> ShardProgress;
        "subscribers": fn subscribers(&self, topic: &Topic, after: Option<&RecipientId>, limit: usize)
            -> Vec<Subscriber>;
        "copy_marks": fn copy_marks(&self, limit: usize) -> Vec<CopyMark>;
        "clear_copy_marks": fn clear_copy_marks(&self, marks: &[CopyMark]) -> u64;
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    fn relay(&self) -> &dyn RelayStore {
        self
    }

    fn gateway(&self) -> &dyn GatewayStore {
        self
    }

    fn parked(&self) -> &dyn ParkedStore {
        self
    }

    fn leases(self: Arc<Self>) -> Option<Arc<dyn ShardLeases>> {
        let inner = self.inner.clone().leases()?;
        self.metrics.initialise_labels(LEASE_OPERATIONS);
        Some(Arc::new(Instrumented { inner, metrics: self.metrics.clone() }))
    }
}

instrumented! {
    RelayStore for dyn Store, via relay, labels RELAY_OPERATIONS {
        "relay_claim": fn claim(&self, key: &RelayKey, now_ms: i64, lease_until_ms: i64, expires_at_ms: i64)
            -> RelayClaim;
        "relay_settle": fn settle(&self, key: &RelayKey, lease_until_ms: i64, settled: RelaySettled, expires_at_ms: i64)
            -> ();
        "relay_release": fn release(&self, key: &RelayKey, lease_until_ms: i64) -> ();
        "delete_expired_relay": fn delete_expired(&self, now_ms: i64) -> u64;
    }
}

instrumented! {
    GatewayStore for dyn Store, via gateway, labels GATEWAY_OPERATIONS {
        "gateway_register": fn register(&self, registration: &GatewayRegistration) -> Option<RegistrationId>;
        "gateway_unregister": fn unregister(&self, revoke: &Revoke) -> bool;
        "gateway_route": fn route(&self, route: &RouteKey, now_ms: i64) -> Option<GatewayRegistration>;
        "gateway_target": fn target(&self, tenant: &ServiceId, push_target_id: &PushTargetId, now_ms: i64)
            -> Vec<GatewayRegistration>;
        "gateway_mark_token_invalid": fn mark_token_invalid(&self, route: &RouteKey, registration_id: &RegistrationId)
            -> bool;
        "gateway_notify_claim": fn notify_claim(&self, key: &NotifyKey, digest: &[u8; 32], now_ms: i64,
            lease_until_ms: i64, expires_at_ms: i64) -> NotifyClaim;
        "gateway_notify_commit": fn notify_commit(&self, key: &NotifyKey, lease_until_ms: i64, response: &[u8],
            wakeups: &[GatewayWakeup], expires_at_ms: i64) -> bool;
        "gateway_notify_release": fn notify_release(&self, key: &NotifyKey, lease_until_ms: i64) -> ();
        "gateway_wakeups_due": fn wakeups_due(&self, now_ms: i64, lease_until_ms: i64, limit: usize)
            -> Vec<LeasedWakeup>;
        "gateway_wakeup_reschedule": fn wakeup_reschedule(&self, leased: &LeasedWakeup, not_before_ms: i64,
            attempts: u32) -> bool;
        "gateway_wakeup_delete": fn wakeup_delete(&self, leased: &LeasedWakeup) -> bool;
        "gateway_state": fn state(&self, tenant: &ServiceId, key: &[u8], now_ms: i64) -> Option<Vec<u8>>;
        "gateway_state_cas": fn state_cas(&self, tenant: &ServiceId, key: &[u8], expected: Option<&[u8]>, new: &[u8],
            now_ms: i64, expires_at_ms: i64) -> bool;
        "delete_expired_gateway": fn delete_expired(&self, now_ms: i64) -> u64;
    }
}

instrumented! {
    ParkedStore for dyn Store, via parked, labels PARKED_OPERATIONS {
        "park": fn park(&self, deliveries: &[ParkedDelivery]) -> ();
        "parked": fn parked(&self, shard: ShardId, channel: Channel, after: Option<ParkedKey>, limit: usize)
            -> Vec<ParkedDelivery>;
        "unpark": fn unpark(&self, shard: ShardId, channel: Channel, keys: &[ParkedKey]) -> ();
    }
}

instrumented! {
    ShardLeases for dyn ShardLeases, via as_ref, labels LEASE_OPERATIONS {
        "acquire_lease": fn acquire_lease(&self, shard: ShardId, node: &NodeId, address: &str, ttl: Duration) -> bool;
        "release_lease": fn release_lease(&self, shard: ShardId, node: &NodeId) -> ();
        "lease_owner": fn lease_owner(&self, shard: ShardId) -> Option<(NodeId, String)>;
        "lease_owners": fn lease_owners(&self) -> Vec<(ShardId, NodeId)>;
        "heartbeat": fn heartbeat(&self, node: &NodeId, address: &str, ttl: Duration) -> ();
        "live_nodes": fn live_nodes(&self) -> Vec<NodeId>;
        "forget_node": fn forget_node(&self, node: &NodeId) -> ();
        "lease_holders": fn lease_holders(&self) -> Vec<LeaseHolder>;
        "node_addresses": fn node_addresses(&self) -> Vec<LiveNode>;
    }
}
