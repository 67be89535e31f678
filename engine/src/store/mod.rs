//! Durable state. `Store` is the only way the engine touches it; every backend
//! passes the same conformance suite (`engine/tests/store_conformance`).

mod gateway;
mod instrumented;
mod redb;
mod scylla;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use self::gateway::{
    GatewayRegistration, GatewayWakeup, LeasedWakeup, MAX_GATEWAY_TEXT, NotifyClaim, NotifyKey, Revoke, RouteKey,
    WAKEUP_QUEUES, wakeup_queue,
};
pub use self::instrumented::Instrumented;
pub use self::redb::RedbStore;
pub use self::scylla::{Keyspace, MAX_SUBSCRIPTION_CHANGES, Nodes, ScyllaSettings, ScyllaStore};
use crate::domain::{
    DeliveryTarget, NewEnvelope, Recipient, RecipientId, RecipientSummary, SecretHash, SequenceRefusal, ShardId,
    StoredEnvelope, StoredSubscription, Subscriber, SubscriptionUpdate, Topic,
};

/// A shard's durable positions. `checkpoint <= boundary` always.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardPosition {
    /// Closed allocation boundary: the largest id whose whole prefix is stored (API-203).
    pub boundary: u64,
    /// Every delivery at or below this id has had a first attempt.
    pub checkpoint: u64,
}

/// The outcome of appending one envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Stored (when push-eligible) under this sequence id of its shard.
    Stored { sequence_id: u64 },
    /// Not stored: `domain::next_sequence_id` refused its publisher-supplied
    /// id (not increasing, too far ahead) or the shard has no id left.
    Refused(SequenceRefusal),
}

/// One engine process among several sharing a store (issue 7): random per start.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub String);

impl NodeId {
    /// A fresh random id: 16 bytes in hex.
    pub fn random() -> Self {
        Self(format!("{:032x}", rand::random::<u128>()))
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Spec 003 §2.5: the relay ingress's idempotency key, a hub's `delivery_id`.
/// Keyed by hub too, so two hubs can never collide (a hub is trusted only
/// for its own ids). Debug shows neither value (PUSH-254 style).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RelayKey {
    pub hub_id: String,
    pub delivery_id: String,
}

impl std::fmt::Debug for RelayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelayKey(..)")
    }
}

/// How a relayed delivery ended, kept for its ttl so a retry of it gets the
/// same answer without another provider request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelaySettled {
    /// The provider accepted the push.
    Delivered,
    /// The provider declared the token dead (APNs Unregistered, FCM UNREGISTERED).
    Gone,
    /// The provider refused the push for good (bad token for the topic, too large, ...).
    Rejected,
}

impl RelaySettled {
    /// The stored code; 0 is a pending claim.
    pub fn code(self) -> i8 {
        match self {
            Self::Delivered => 1,
            Self::Gone => 2,
            Self::Rejected => 3,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            1 => Some(Self::Delivered),
            2 => Some(Self::Gone),
            3 => Some(Self::Rejected),
            _ => None,
        }
    }
}

/// The answer of `Store::relay_claim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayClaim {
    /// No live record: the caller now holds a pending claim until its
    /// `lease_until_ms` and makes the provider request.
    Claimed,
    /// Another caller holds a pending claim until `lease_until_ms`.
    Busy { lease_until_ms: i64 },
    /// Settled within its ttl.
    Settled(RelaySettled),
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("recipient not found")]
    NotFound,
    /// The stored secret hash differs from the presented one (PUSH-253 check 3).
    #[error("recipient secret does not match")]
    SecretMismatch,
    /// Applying the update would exceed max_push_topics (PUSH-217).
    #[error("subscription limit exceeded")]
    TopicLimit,
    /// The backend failed; the message never carries private values.
    #[error("storage backend error: {0}")]
    Backend(String),
}

/// Why a relay registration is removed (003 §1).
#[derive(Debug, Clone)]
pub enum RegistrationRemoval {
    /// `DELETE /v2/push/registration` by the device: `NotFound` and
    /// `SecretMismatch` as for Unregister; a device with no registration,
    /// or another channel's target, is left with none.
    Deleted { id: RecipientId, secret_hash: SecretHash },
    /// A 404/410 from the push server for a push sent to `sent` (§2.4):
    /// only while the stored registration has `sent`'s provider and token
    /// and its secret hash (`DeliveryTarget::still_names`).
    Invalid { sent: Arc<Recipient> },
}

impl RegistrationRemoval {
    pub fn id(&self) -> &RecipientId {
        match self {
            Self::Deleted { id, .. } => id,
            Self::Invalid { sent } => &sent.id,
        }
    }

    /// The recipient to store after the removal, or `Ok(None)` when there is
    /// nothing to change (no registration left, or an `Invalid` whose
    /// registration changed meanwhile).
    pub fn apply(&self, stored: Option<Recipient>) -> Result<Option<Recipient>, StoreError> {
        let removed = |r: Recipient| Recipient { target: DeliveryTarget::Relay(None), ..r };
        match self {
            Self::Deleted { secret_hash, .. } => {
                let stored = stored.ok_or(StoreError::NotFound)?;
                if stored.secret_hash != *secret_hash {
                    return Err(StoreError::SecretMismatch);
                }
                Ok((stored.target != DeliveryTarget::Relay(None)).then(|| removed(stored)))
            }
            Self::Invalid { sent } => Ok(stored
                .filter(|s| s.target.still_names(&sent.target) && s.secret_hash == sent.secret_hash)
                .map(removed)),
        }
    }
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short name for logs and metrics ("redb", "scylla").
    fn backend_name(&self) -> &'static str;

    async fn recipient(&self, id: &RecipientId) -> Result<Option<Recipient>, StoreError>;

    /// PUSH-255 for Register, in one transaction: create the recipient with no
    /// subscriptions, or (when `secret_hash` matches the stored one) replace its
    /// target; set the renewal time to `now_ns`; never touch subscriptions.
    /// `SecretMismatch` when an existing recipient's hash differs.
    async fn register(
        &self,
        id: &RecipientId,
        secret_hash: &SecretHash,
        target: &DeliveryTarget,
        now_ns: i64,
    ) -> Result<RecipientSummary, StoreError>;

    /// PUSH-207: delete the recipient and every subscription it holds.
    /// `NotFound` / `SecretMismatch` change nothing.
    async fn unregister(&self, id: &RecipientId, secret_hash: &SecretHash) -> Result<(), StoreError>;

    /// PUSH-216/217 in one transaction: apply every remove and add, keep the start
    /// position of a replaced topic, give a new topic the boundary of its shard
    /// (`topic.shard(shard_count)` for the store's own shard count) read in this
    /// transaction, set the renewal time.
    /// `TopicLimit` when the result would hold more than `max_topics`; then nothing changes.
    async fn update_subscriptions(
        &self,
        id: &RecipientId,
        secret_hash: &SecretHash,
        update: &SubscriptionUpdate,
        now_ns: i64,
        max_topics: u64,
    ) -> Result<RecipientSummary, StoreError>;

    /// Every stored subscription of a recipient, in topic order.
    async fn subscriptions(&self, id: &RecipientId) -> Result<Vec<StoredSubscription>, StoreError>;

    /// PUSH-234 compare-and-delete: delete the recipient and its subscriptions only
    /// when the stored target (channel, token or URL and signing key) and secret
    /// hash still equal `expected`'s. Returns whether it deleted.
    async fn delete_recipient_if_unchanged(&self, expected: &Recipient) -> Result<bool, StoreError>;

    /// 003 §1: remove a relay device's registration and keep the device (the
    /// recipient and every subscription it holds): its target becomes
    /// `DeliveryTarget::Relay(None)`, its renewal time unchanged. See
    /// [`RegistrationRemoval`] for when it applies. Returns whether a
    /// registration was removed.
    async fn remove_relay_registration(&self, removal: &RegistrationRemoval) -> Result<bool, StoreError>;

    /// PUSH-226: delete every recipient renewed before `renewed_before_ns`, with
    /// its subscriptions. Returns how many were deleted.
    async fn delete_expired(&self, renewed_before_ns: i64) -> Result<u64, StoreError>;

    /// Appends envelopes in one transaction, in order. Each gets the next id of its
    /// shard (or its publisher-supplied id when that is above the shard's last);
    /// push-eligible ones are stored for dispatch; every shard's boundary moves to
    /// its last id. One result per envelope, in order.
    async fn append(&self, envelopes: &[NewEnvelope], now_ns: i64) -> Result<Vec<Appended>, StoreError>;

    async fn shard_position(&self, shard: ShardId) -> Result<ShardPosition, StoreError>;

    /// Stored envelopes of `shard` with `after < sequence_id <= up_to`, ascending,
    /// at most `limit`, without their data.
    async fn read_window(
        &self,
        shard: ShardId,
        after: u64,
        up_to: u64,
        limit: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError>;

    /// PUSH-230's HMAC input: the `data` stored with envelope `sequence_id` of
    /// `shard`. `None` when none was kept (no 32-byte sender_hmac) or the
    /// envelope is gone (at or below the checkpoint). Windows never carry it
    /// (issue 11); dispatch reads it for a page that needs it.
    async fn envelope_data(&self, shard: ShardId, sequence_id: u64) -> Result<Option<Vec<u8>>, StoreError>;

    /// Moves the checkpoint forward (never back) and drops envelopes at or below it.
    async fn advance_checkpoint(&self, shard: ShardId, checkpoint: u64) -> Result<(), StoreError>;

    /// One page of a topic's subscribers, ordered by recipient id, strictly after
    /// `after` when given, at most `limit`. A page shorter than `limit` means the
    /// topic has no subscriber after it: an implementation that skips a row (a
    /// subscription whose recipient is gone) keeps reading to fill the page,
    /// because dispatch stops paging at the first short page.
    async fn subscribers(
        &self,
        topic: &Topic,
        after: Option<&RecipientId>,
        limit: usize,
    ) -> Result<Vec<Subscriber>, StoreError>;
    /// Spec 003 §2.5, in one atomic step: when `key` has a live record
    /// (`expires_at > now_ms`) that is settled, answer it; when it is a
    /// pending claim whose lease has not run out (`lease_until > now_ms`),
    /// answer `Busy`; otherwise (no record, an expired one, or a claim whose
    /// holder died) store a pending claim until `lease_until_ms`, kept until
    /// `expires_at_ms`, and answer `Claimed`. Of concurrent callers at most
    /// one gets `Claimed`.
    async fn relay_claim(
        &self,
        key: &RelayKey,
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<RelayClaim, StoreError>;

    /// Settles the pending claim `relay_claim` stored with `lease_until_ms`,
    /// kept until `expires_at_ms`. Changes nothing when the record is no
    /// longer that claim (another caller took it over after the lease ran out).
    async fn relay_settle(
        &self,
        key: &RelayKey,
        lease_until_ms: i64,
        settled: RelaySettled,
        expires_at_ms: i64,
    ) -> Result<(), StoreError>;

    /// Deletes the pending claim stored with `lease_until_ms` (the provider
    /// request failed transiently: the hub's retry must send again). Changes
    /// nothing when the record is no longer that claim.
    async fn relay_release(&self, key: &RelayKey, lease_until_ms: i64) -> Result<(), StoreError>;

    /// Retention: deletes relay records with `expires_at <= now_ms`. Returns
    /// how many it deleted; a backend whose records expire by themselves
    /// (ScyllaDB's TTL) answers 0.
    async fn delete_expired_relay(&self, now_ms: i64) -> Result<u64, StoreError>;

    // ---- spec 002, the push gateway (`gateway.rs` says what each record is) ----

    /// §3.1: stores `registration` as the current route of its (tenant,
    /// account, device) in one atomic step, superseding the previous one,
    /// whose push_target_id then no longer finds it: never two current
    /// routes. Returns the superseded registration's id.
    async fn gateway_register(&self, registration: &GatewayRegistration) -> Result<Option<String>, StoreError>;

    /// §3.2: deletes the current route of `revoke.route` when it has the
    /// push key and app id the request names (either may be left out).
    /// Returns whether it deleted one.
    async fn gateway_unregister(&self, revoke: &Revoke) -> Result<bool, StoreError>;

    /// The current route of a device while `expires_at > now_ms`.
    async fn gateway_route(&self, route: &RouteKey, now_ms: i64) -> Result<Option<GatewayRegistration>, StoreError>;

    /// Every current registration of `push_target_id` in `tenant` with
    /// `expires_at > now_ms`, dead-token marks included, in device id order.
    async fn gateway_target(
        &self,
        tenant: &str,
        push_target_id: &str,
        now_ms: i64,
    ) -> Result<Vec<GatewayRegistration>, StoreError>;

    /// Marks the route's token dead when its current registration is still
    /// `registration_id` (a device that registered again keeps its new
    /// route). Returns whether it marked.
    async fn gateway_mark_token_invalid(&self, route: &RouteKey, registration_id: &str) -> Result<bool, StoreError>;

    /// §5.2 idempotency, in one atomic step: a live record (`expires_at >
    /// now_ms`) with another digest answers `Conflict`; with this digest, its
    /// response when committed (`Replay`) or `Busy` while its claim's lease
    /// runs; otherwise (none, expired, or a dead claimant's) the caller gets
    /// a pending claim until `lease_until_ms`, kept until `expires_at_ms`.
    /// Of concurrent callers at most one gets `Claimed`.
    async fn gateway_notify_claim(
        &self,
        key: &NotifyKey,
        digest: &[u8; 32],
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<NotifyClaim, StoreError>;

    /// Stores `wakeups` (a wakeup whose id is already stored is kept as it
    /// is: the merge) and the claim's response, kept until `expires_at_ms`.
    /// False, and the response not stored, when the record is no longer the
    /// claim with `lease_until_ms`.
    async fn gateway_notify_commit(
        &self,
        key: &NotifyKey,
        lease_until_ms: i64,
        response: &[u8],
        wakeups: &[GatewayWakeup],
        expires_at_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Deletes the pending claim with `lease_until_ms` (nothing was decided:
    /// a retry of the request starts again). Nothing when it is not that claim.
    async fn gateway_notify_release(&self, key: &NotifyKey, lease_until_ms: i64) -> Result<(), StoreError>;

    /// Leases at most `limit` wakeups that are due (`not_before <= now_ms`)
    /// and not leased (a lease that ran out is taken over: its worker died),
    /// until `lease_until_ms`. Of concurrent callers one gets each wakeup.
    async fn gateway_wakeups_due(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<LeasedWakeup>, StoreError>;

    /// Gives a leased wakeup back for a later attempt. False, changing
    /// nothing, when the lease is no longer the holder's.
    async fn gateway_wakeup_reschedule(
        &self,
        leased: &LeasedWakeup,
        not_before_ms: i64,
        attempts: u32,
    ) -> Result<bool, StoreError>;

    /// Deletes a leased wakeup (sent, or given up). False, changing
    /// nothing, when the lease is no longer the holder's.
    async fn gateway_wakeup_delete(&self, leased: &LeasedWakeup) -> Result<bool, StoreError>;

    /// A window state value while its `expires_at > now_ms`.
    async fn gateway_state(&self, tenant: &str, key: &[u8], now_ms: i64) -> Result<Option<Vec<u8>>, StoreError>;

    /// Compare-and-set of a window state value: sets `new` until
    /// `expires_at_ms` when the live value is `expected` (`None`: absent or
    /// expired). Returns whether it set.
    async fn gateway_state_cas(
        &self,
        tenant: &str,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Retention: deletes expired registrations, notify records and window
    /// state. Returns how many it deleted; 0 on a backend whose records
    /// expire by themselves (ScyllaDB's TTL).
    async fn delete_expired_gateway(&self, now_ms: i64) -> Result<u64, StoreError>;

    /// Shard leases when several nodes share this store (issue 7): `None` on
    /// a store that one node owns alone, which then owns every shard.
    fn leases(self: Arc<Self>) -> Option<Arc<dyn ShardLeases>>;
}

/// Cluster coordination (issue 7): shard leases and node heartbeats on a
/// store that several engine nodes share.
#[async_trait]
pub trait ShardLeases: Send + Sync + 'static {
    /// Takes or renews the lease of `shard` for `ttl`. True when `node` owns
    /// it now (newly acquired or already its own); false when another does.
    async fn acquire_lease(
        &self,
        shard: ShardId,
        node: &NodeId,
        address: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// Gives the lease up, when `node` still holds it.
    async fn release_lease(&self, shard: ShardId, node: &NodeId) -> Result<(), StoreError>;

    /// The owner of `shard` and its advertised address, if any.
    async fn lease_owner(&self, shard: ShardId) -> Result<Option<(NodeId, String)>, StoreError>;

    /// Every live lease: shard and owner.
    async fn lease_owners(&self) -> Result<Vec<(ShardId, NodeId)>, StoreError>;

    /// Says that `node` is alive for `ttl`.
    async fn heartbeat(&self, node: &NodeId, address: &str, ttl: Duration) -> Result<(), StoreError>;

    /// The nodes whose heartbeat has not expired.
    async fn live_nodes(&self) -> Result<Vec<NodeId>, StoreError>;
}

/// Whether a page of `subscribers` is empty without reading: none asked
/// for, or none can follow the highest recipient id there is.
fn nothing_after(after: Option<&RecipientId>, limit: usize) -> bool {
    limit == 0 || after.is_some_and(|a| a.as_bytes() == &[0xff; 32])
}
