//! Durable state. `Store` is the only way the engine touches it; every backend
//! passes the same conformance suite (`engine/tests/store_conformance`).
//! Each concern beyond the core has its own trait, reached from the `Store`:
//! the relay ingress's records (`relay`), the push gateway's (`gateway`),
//! the deliveries parked while their channel cannot take them (`parked`)
//! and shard leases (`leases`).

mod error;
mod gateway;
mod instrumented;
mod parked;
mod recipient_cache;
mod redb;
mod relay;
mod scylla;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use self::error::StoreError;
pub use self::gateway::GatewayStore;
pub use self::instrumented::Instrumented;
pub use self::parked::ParkedStore;
pub use self::redb::RedbStore;
pub use self::relay::RelayStore;
pub use self::scylla::{Keyspace, MAX_SUBSCRIPTION_CHANGES, Nodes, ScyllaSettings, ScyllaStore};
use crate::domain::{
    DeliveryTarget, NewEnvelope, Recipient, RecipientId, RecipientSummary, SecretHash, SequenceRefusal, ShardId,
    ShardProgress, StoredEnvelope, StoredSubscription, Subscriber, SubscriptionUpdate, Topic,
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

/// One engine process among several sharing a store: random per start.
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

/// A shard's lease as an operator reads it (`fanout cluster status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    pub shard: ShardId,
    pub node: NodeId,
    /// The gRPC address the owner advertises (`server.advertise_address`).
    pub address: String,
    /// The shard's current term: a new one is claimed each time the lease
    /// changes hands (or may have), and the owner appends under it. `None`:
    /// none claimed yet.
    pub term: Option<u64>,
    /// How long the lease lives unless renewed, when the store says.
    pub expires_in: Option<Duration>,
}

/// An engine node whose heartbeat has not expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveNode {
    pub node: NodeId,
    /// The gRPC address it advertises.
    pub address: String,
}

/// A mark a change of a recipient's subscriptions or target wrote on a
/// dispatch index row before its conditional batch (ScyllaDB, "Dispatch
/// copies" in `scylla.rs`): while it stands, dispatch joins the row with
/// the recipient partition instead of trusting its copy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CopyMark {
    pub topic: Topic,
    pub recipient: RecipientId,
    /// The change's own random value: each change deletes only its marks.
    pub mark: i64,
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
    /// envelope is gone (at or below the checkpoint). Windows never carry it;
    /// dispatch reads it for a page that needs it.
    async fn envelope_data(&self, shard: ShardId, sequence_id: u64) -> Result<Option<Vec<u8>>, StoreError>;

    /// Moves the checkpoint forward (never back) and drops envelopes at or below it.
    async fn advance_checkpoint(&self, shard: ShardId, checkpoint: u64) -> Result<(), StoreError>;

    /// What the shard's running window answered above its checkpoint
    /// (`ShardProgress`), replacing what was recorded before; written by the
    /// lease holder, read by the shard's next owner when it starts.
    async fn record_progress(&self, shard: ShardId, progress: &ShardProgress) -> Result<(), StoreError>;

    /// The last `record_progress` of the shard; empty when none.
    async fn shard_progress(&self, shard: ShardId) -> Result<ShardProgress, StoreError>;

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

    /// The relay ingress's records (spec 003 §2.5).
    fn relay(&self) -> &dyn RelayStore;

    /// The push gateway's records (spec 002).
    fn gateway(&self) -> &dyn GatewayStore;

    /// The deliveries parked while their channel cannot take them.
    fn parked(&self) -> &dyn ParkedStore;

    /// Shard leases when several nodes share this store: `None` on
    /// a store that one node owns alone, which then owns every shard.
    fn leases(self: Arc<Self>) -> Option<Arc<dyn ShardLeases>>;

    /// Marks on the dispatch index's rows ([`CopyMark`]), at most `limit`,
    /// in no particular order: those of changes running now and those a
    /// failed or crashed change left. None on a store without dispatch
    /// copies (the embedded store).
    async fn copy_marks(&self, limit: usize) -> Result<Vec<CopyMark>, StoreError>;

    /// Removes `marks` without trusting a stale copy: first makes sure that
    /// no change of each mark's recipient that started before this call can
    /// still apply, then sets the marked rows from the recipient as stored
    /// (its copy rewritten, or the row deleted when the subscription is
    /// gone), then deletes the marks. A running change of that recipient
    /// then fails its condition and starts over under a new mark, so this
    /// is for marks old enough that their change surely ended. Returns how
    /// many marks went; a recipient that keeps changing meanwhile keeps its
    /// marks for the next call.
    async fn clear_copy_marks(&self, marks: &[CopyMark]) -> Result<u64, StoreError>;
}

/// Cluster coordination: shard leases and node heartbeats on a
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

    /// Removes `node`'s heartbeat: it is leaving, so the others' fair share
    /// stops counting it at their next round rather than after the TTL.
    async fn forget_node(&self, node: &NodeId) -> Result<(), StoreError>;

    /// Every live lease with its owner's address, the shard's term and what
    /// is left of the lease, in shard order (`fanout cluster status`).
    async fn lease_holders(&self) -> Result<Vec<LeaseHolder>, StoreError>;

    /// The live nodes with their advertised addresses, in node order.
    async fn node_addresses(&self) -> Result<Vec<LiveNode>, StoreError>;
}

/// `Backend` for a shard id of another shard count than the store's.
fn check_shard(shard: ShardId, shard_count: u16) -> Result<(), StoreError> {
    if shard.index() < shard_count { Ok(()) } else { Err(StoreError::Backend("shard id is out of range".into())) }
}

/// Whether a page of `subscribers` is empty without reading: none asked
/// for, or none can follow the highest recipient id there is.
fn nothing_after(after: Option<&RecipientId>, limit: usize) -> bool {
    limit == 0 || after.is_some_and(|a| a.as_bytes() == &[0xff; 32])
}
