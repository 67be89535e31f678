//! Envelope ingest: validate each envelope, store a batch in one append, and
//! wake the shards that moved. One bad envelope never drops the good ones.

use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroUsize;
use std::sync::Arc;

use futures::stream::{self, StreamExt, TryStreamExt};
use ractor::ActorRef;
use serde::Deserialize;

use crate::domain::Clock;

use crate::domain::{
    EnvelopeKind, MembershipChange, MessageId, NewEnvelope, ParseError, RelayMeta, SenderHmac, SequenceRefusal,
    ShardId, Topic,
};
use crate::metrics::{Limit, Metrics, PublishResult};
use crate::ownership::ShardOwnership;
use crate::store::{Appended, Store, StoreError};
use crate::supervision::SupervisorMsg;

/// `[engine.ingest]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestSettings {
    /// The largest envelope `data` accepted, in bytes. A larger one
    /// is refused on its own (INVALID_ARGUMENT), its neighbours are stored.
    /// The data is PUSH-230's HMAC input, kept until its window completes
    /// and hashed once per subscriber key; this bounds both.
    pub max_data_bytes: NonZeroUsize,
}

/// 1 MiB: a quarter of the default gRPC message size, so a request can
/// carry a few envelopes at the limit.
pub const DEFAULT_MAX_DATA_BYTES: NonZeroUsize = NonZeroUsize::new(1 << 20).unwrap();

impl Default for IngestSettings {
    fn default() -> Self {
        Self { max_data_bytes: DEFAULT_MAX_DATA_BYTES }
    }
}

/// An envelope as received (API-210 stand-in).
pub struct EnvelopeInput {
    pub topic: Vec<u8>,
    /// Wire number of the kind; 0 is unspecified.
    pub kind: i32,
    pub should_push: bool,
    pub sender_hmac: Vec<u8>,
    pub data: Vec<u8>,
    /// 0 lets fanout allocate.
    pub sequence_id: u64,
    /// Spec 003: wire number of the Commit's membership change; 0 is none.
    pub membership_change: i32,
    /// Spec 003: the publisher's message id; empty is none.
    pub message_id: String,
}

/// Why one envelope was not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeRejection {
    #[error("{0}")]
    Invalid(&'static str),
    /// `data` above `engine.ingest.max_data_bytes`.
    #[error("envelope data is larger than the limit of {limit} bytes (engine.ingest.max_data_bytes)")]
    DataTooLarge { limit: usize },
    #[error("sequence_id is not above the shard's last id {last}")]
    SequenceNotIncreasing { last: u64 },
    /// A publisher id may not run ahead of its shard by more than
    /// `MAX_SEQUENCE_GAP`, nor pass `MAX_SEQUENCE_ID` (2^63 − 1).
    #[error("sequence_id is more than 2^32 above the shard's last id {last}, or above 2^63-1")]
    SequenceTooFarAhead { last: u64 },
    #[error("the shard has no sequence ids left")]
    SequenceExhausted,
    /// Another node owns the shard (not forwarded there: forwarding is off, or
    /// this request was itself forwarded here); publish there.
    #[error("shard {shard} is owned by {address}; publish there")]
    OwnedElsewhere { shard: u16, address: String },
    /// No node owns the shard right now (leases are moving); retry.
    #[error("shard {shard} has no owner yet; retry")]
    NoOwner { shard: u16 },
    /// The shard's lease ran out while the envelope was being stored: it may
    /// or may not be delivered, and it is not acknowledged. Retry (at worst
    /// a duplicate delivery).
    #[error("shard {shard}'s lease ran out while storing; outcome unknown, retry")]
    LeaseLost { shard: u16 },
}

pub struct Ingest {
    pub store: Arc<dyn Store>,
    pub shard_count: u16,
    pub dispatch: ActorRef<SupervisorMsg>,
    pub metrics: Arc<Metrics>,
    pub settings: IngestSettings,
    /// The shards this node may append to; `None`: all of them (one node).
    pub ownership: Option<ShardOwnership>,
    /// This node's advertised gRPC address: a lease naming it but not in the
    /// owned set is a dead predecessor's, so the answer is "no owner yet".
    pub advertise_address: String,
    /// The server timestamp envelopes are stored with.
    pub clock: Arc<dyn Clock>,
}

impl From<SequenceRefusal> for EnvelopeRejection {
    fn from(refusal: SequenceRefusal) -> Self {
        match refusal {
            SequenceRefusal::NotIncreasing { last } => Self::SequenceNotIncreasing { last },
            SequenceRefusal::TooFarAhead { last } => Self::SequenceTooFarAhead { last },
            SequenceRefusal::Exhausted => Self::SequenceExhausted,
        }
    }
}

/// Lease reads at once when the shard map is built.
const OWNER_READS: usize = 16;

/// Most envelopes one publish request may carry.
pub const MAX_BATCH: usize = 10_000;

/// One envelope's answer: its shard (when it parsed) and its sequence id or
/// why it was not stored.
pub type EnvelopeResult = (Option<ShardId>, Result<u64, EnvelopeRejection>);

/// A batch parsed and routed: what this node may store, and the envelopes
/// of shards another node owns.
pub struct Routed {
    parsed: Vec<Result<NewEnvelope, (Option<ShardId>, EnvelopeRejection)>>,
    /// The envelopes of shards this node does not hold, in batch order.
    /// Nothing is stored for them here; those left in place when the batch
    /// is stored are answered `OwnedElsewhere` or `NoOwner` (the caller may
    /// take them to forward them, or to route them again).
    pub elsewhere: Vec<Elsewhere>,
    /// How many `elsewhere` held when routed: those taken are counted by
    /// the node they are forwarded to, not here.
    routed_elsewhere: usize,
}

/// An envelope of a shard this node does not hold.
pub struct Elsewhere {
    /// Its place in the batch.
    pub index: usize,
    pub shard: ShardId,
    /// The owner's advertised gRPC address (`server.advertise_address`);
    /// `None` while no other node holds the shard (leases moving): the
    /// caller may route it again a moment later.
    pub owner: Option<String>,
    pub envelope: NewEnvelope,
}

impl Ingest {
    /// One result per input, in order. `Err` only when storage itself failed.
    pub async fn publish(&self, inputs: Vec<EnvelopeInput>) -> Result<Vec<EnvelopeResult>, StoreError> {
        let routed = self.route(inputs).await?;
        self.store(routed).await
    }

    /// Parses each envelope and finds the owner of each shard this node
    /// does not hold. `Err` only when the lease of such a shard could not be read.
    pub async fn route(&self, inputs: Vec<EnvelopeInput>) -> Result<Routed, StoreError> {
        let parsed: Vec<Result<NewEnvelope, (Option<ShardId>, EnvelopeRejection)>> =
            inputs.into_iter().map(|i| self.parse(i).map_err(|e| (None, e))).collect();
        let too_large = parsed.iter().filter(|p| matches!(p, Err((_, EnvelopeRejection::DataTooLarge { .. })))).count();
        if too_large > 0 {
            self.metrics.limit_refused(Limit::EnvelopeData, too_large as u64);
        }
        self.route_unowned(parsed).await
    }

    /// Stores the envelopes this node holds in one append and wakes their
    /// shards: one result per input of the routed batch, in order. `Err`
    /// only when storage itself failed.
    pub async fn store(&self, routed: Routed) -> Result<Vec<EnvelopeResult>, StoreError> {
        let Routed { parsed, elsewhere, routed_elsewhere } = routed;
        let valid: Vec<NewEnvelope> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
        let appended = if valid.is_empty() {
            Vec::new()
        } else {
            self.store.append(&valid, self.clock.now().as_unix_nanos()).await?
        };
        let fenced = self.fenced_after_append(&valid);
        let mut appended = appended.into_iter().zip(valid.iter().map(|e| e.shard()));
        let mut woken = BTreeSet::new();
        let results = parsed
            .into_iter()
            .map(|p| match p {
                Err((shard, e)) => (shard, Err(e)),
                Ok(_) => match appended.next() {
                    Some((Appended::Stored { .. }, shard)) if fenced.contains(&shard) => {
                        woken.insert(shard);
                        (Some(shard), Err(EnvelopeRejection::LeaseLost { shard: shard.index() }))
                    }
                    Some((Appended::Stored { sequence_id }, shard)) => {
                        woken.insert(shard);
                        (Some(shard), Ok(sequence_id))
                    }
                    Some((Appended::Refused(refusal), shard)) => (Some(shard), Err(refusal.into())),
                    None => (None, Err(EnvelopeRejection::Invalid("not stored"))),
                },
            })
            .collect::<Vec<_>>();
        let stored = results.iter().filter(|r| r.1.is_ok()).count() as u64;
        // Envelopes taken to be forwarded are their owner's to count.
        let forwarded = (routed_elsewhere - elsewhere.len()) as u64;
        self.metrics.envelopes_published_as(PublishResult::Stored).inc_by(stored);
        self.metrics.envelopes_published_as(PublishResult::Rejected).inc_by(results.len() as u64 - stored - forwarded);
        if !woken.is_empty() {
            let _ = self.dispatch.cast(SupervisorMsg::Wake(woken.into_iter().collect()));
        }
        Ok(results)
    }

    /// The advertised gRPC address of each shard's owner, in shard order;
    /// `None` while a shard has no owner. Reads the leases this node has
    /// not read within a lease round.
    pub async fn shard_map(&self) -> Result<Vec<Option<String>>, StoreError> {
        let all = ShardId::all(self.shard_count);
        let Some(ownership) = &self.ownership else {
            return Ok(all.map(|_| Some(self.advertise_address.clone())).collect());
        };
        let owned = ownership.owned.borrow().clone();
        let now = tokio::time::Instant::now();
        let owned = &owned;
        stream::iter(all)
            .map(|shard| async move {
                if owned.holds(shard, now) {
                    Ok(Some(self.advertise_address.clone()))
                } else {
                    ownership.owners.other_owner(shard).await
                }
            })
            .buffered(OWNER_READS)
            .try_collect()
            .await
    }

    /// A forward of `shard`'s envelopes to `owner` failed: its lease is read
    /// again at the next envelope rather than sent to a node that may be gone.
    pub fn forget_owner(&self, shard: ShardId, owner: &str) {
        if let Some(ownership) = &self.ownership {
            ownership.owners.forget(shard, owner);
        }
    }

    /// The shards of `appended` whose local lease deadline passed while they
    /// were stored. On a shared store an append is acknowledged only when it
    /// completed while the lease was surely this node's: the next owner's
    /// term starts above the rows it finds after taking the lease over, and
    /// a write that completed later may lie above that, never to be read
    /// (`store/scylla/log.rs`).
    fn fenced_after_append(&self, appended: &[NewEnvelope]) -> BTreeSet<ShardId> {
        let Some(ownership) = &self.ownership else { return BTreeSet::new() };
        let owned = ownership.owned.borrow();
        let now = tokio::time::Instant::now();
        appended.iter().map(NewEnvelope::shard).filter(|shard| !owned.holds(*shard, now)).collect()
    }

    /// Only the owner of a shard appends to it. An envelope of a shard this
    /// node does not own is set aside with its owner's address, or none
    /// (answered with it, or "no owner yet", unless the caller takes it).
    async fn route_unowned(
        &self,
        mut parsed: Vec<Result<NewEnvelope, (Option<ShardId>, EnvelopeRejection)>>,
    ) -> Result<Routed, StoreError> {
        let Some(ownership) = &self.ownership else {
            return Ok(Routed { parsed, elsewhere: Vec::new(), routed_elsewhere: 0 });
        };
        // Fencing: a shard whose local lease deadline passed is
        // not this node's any more, whatever the lease actor last decided.
        let owned = ownership.owned.borrow().clone();
        let now = tokio::time::Instant::now();
        let mut owners: HashMap<ShardId, Option<String>> = HashMap::new();
        let mut elsewhere = Vec::new();
        for (index, slot) in parsed.iter_mut().enumerate() {
            let shard = match slot {
                Ok(e) if !owned.holds(e.shard(), now) => e.shard(),
                _ => continue,
            };
            if !owners.contains_key(&shard) {
                owners.insert(shard, ownership.owners.other_owner(shard).await?);
            }
            let rejection = match &owners[&shard] {
                Some(address) => EnvelopeRejection::OwnedElsewhere { shard: shard.index(), address: address.clone() },
                None => EnvelopeRejection::NoOwner { shard: shard.index() },
            };
            let Ok(envelope) = std::mem::replace(slot, Err((Some(shard), rejection))) else { continue };
            elsewhere.push(Elsewhere { index, shard, owner: owners[&shard].clone(), envelope });
        }
        let routed_elsewhere = elsewhere.len();
        Ok(Routed { parsed, elsewhere, routed_elsewhere })
    }

    fn parse(&self, input: EnvelopeInput) -> Result<NewEnvelope, EnvelopeRejection> {
        let limit = self.settings.max_data_bytes.get();
        if input.data.len() > limit {
            return Err(EnvelopeRejection::DataTooLarge { limit });
        }
        let invalid = |e: ParseError| EnvelopeRejection::Invalid(e.0);
        let topic = Topic::parse(&input.topic).map_err(invalid)?;
        let kind = u8::try_from(input.kind)
            .ok()
            .and_then(EnvelopeKind::from_u8)
            .ok_or(EnvelopeRejection::Invalid("envelope kind is unspecified or unknown"))?;
        let sequence_id = (input.sequence_id != 0).then_some(input.sequence_id);
        let membership = match input.membership_change {
            0 => None,
            m => Some(
                u8::try_from(m)
                    .ok()
                    .and_then(MembershipChange::from_u8)
                    .ok_or(EnvelopeRejection::Invalid("membership_change is unknown"))?,
            ),
        };
        let message_id =
            (!input.message_id.is_empty()).then(|| MessageId::parse(&input.message_id)).transpose().map_err(invalid)?;
        // PUSH-230 fails open: a sender_hmac of another length than 32 is
        // no HMAC (the envelope is delivered), not an invalid envelope.
        let sender_hmac = SenderHmac::parse(&input.sender_hmac);
        let mut envelope =
            NewEnvelope::new(topic, self.shard_count, kind, input.should_push, sender_hmac, input.data, sequence_id)
                .map_err(invalid)?;
        // 003 §3: a membership change only means something on a Commit.
        let membership = membership.filter(|_| kind == EnvelopeKind::Commit);
        envelope.relay = RelayMeta { message_id, membership };
        Ok(envelope)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use tokio::sync::watch;

    use super::*;
    use crate::ownership::OwnedShards;
    use crate::shard_owners::ShardOwners;
    use crate::store::{NodeId, RedbStore, ShardLeases};
    use crate::testing::{MemoryLeases, StandIn};

    const SHARDS: u16 = 4;

    fn input(topic: &[u8], kind: EnvelopeKind, sequence_id: u64) -> EnvelopeInput {
        EnvelopeInput {
            topic: topic.to_vec(),
            kind: kind as i32,
            should_push: true,
            sender_hmac: vec![],
            data: b"ciphertext".to_vec(),
            sequence_id,
            membership_change: 0,
            message_id: String::new(),
        }
    }

    struct Fixture {
        ingest: Ingest,
        wakes: Arc<std::sync::Mutex<Vec<ShardId>>>,
        _dir: tempfile::TempDir,
    }

    async fn fixture(ownership: Option<ShardOwnership>) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (dispatch, wakes) = StandIn::start().await;
        let ingest = Ingest {
            store: Arc::new(RedbStore::open(dir.path(), SHARDS).unwrap()),
            shard_count: SHARDS,
            dispatch,
            metrics: Arc::new(Metrics::new()),
            settings: IngestSettings { max_data_bytes: NonZeroUsize::new(16).unwrap() },
            ownership,
            advertise_address: "me:1".into(),
            clock: Arc::new(crate::domain::SystemClock),
        };
        Fixture { ingest, wakes, _dir: dir }
    }

    fn ownership(owned: watch::Receiver<OwnedShards>, leases: Arc<MemoryLeases>) -> ShardOwnership {
        let owners = ShardOwners::new(leases, "me:1".into(), Duration::from_secs(3));
        ShardOwnership { owned, owners: Arc::new(owners) }
    }

    async fn wakes(f: &Fixture) -> Vec<ShardId> {
        // The cast is delivered to the stand-in asynchronously.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        f.wakes.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn one_bad_envelope_fails_alone_and_the_stored_shards_are_woken() {
        let f = fixture(None).await;
        let topic = [0u8, 7];
        let shard = Topic::parse(&topic).unwrap().shard(SHARDS);
        let results = f
            .ingest
            .publish(vec![
                input(&topic, EnvelopeKind::Application, 0),
                input(&[0x09, 1], EnvelopeKind::Application, 0), // no such topic kind
                input(&[0x01, 1], EnvelopeKind::Application, 0), // kind does not match the topic
                input(&topic, EnvelopeKind::Application, 0),
            ])
            .await
            .unwrap();
        assert_eq!(results[0], (Some(shard), Ok(1)));
        assert!(matches!(results[1], (None, Err(EnvelopeRejection::Invalid(_)))));
        assert!(matches!(results[2], (None, Err(EnvelopeRejection::Invalid(_)))));
        assert_eq!(results[3], (Some(shard), Ok(2)));
        assert_eq!(f.ingest.store.shard_position(shard).await.unwrap().boundary, 2);
        assert_eq!(wakes(&f).await, vec![shard]);
        let published = &f.ingest.metrics.envelopes_published;
        assert_eq!(
            (published.with_label_values(&["stored"]).get(), published.with_label_values(&["rejected"]).get()),
            (2, 2)
        );
    }

    #[tokio::test]
    async fn publisher_ids_must_increase_per_shard() {
        let f = fixture(None).await;
        let topic = [0u8, 7];
        let results = f
            .ingest
            .publish(vec![
                input(&topic, EnvelopeKind::Application, 10),
                input(&topic, EnvelopeKind::Application, 10),
                input(&topic, EnvelopeKind::Application, 11),
            ])
            .await
            .unwrap();
        assert_eq!(results[0].1, Ok(10));
        assert_eq!(results[1].1, Err(EnvelopeRejection::SequenceNotIncreasing { last: 10 }));
        assert_eq!(results[2].1, Ok(11));
    }

    #[tokio::test]
    async fn a_hostile_sequence_id_fails_alone_and_leaves_the_shard_usable() {
        let f = fixture(None).await;
        let topic = [0u8, 7];
        let results = f
            .ingest
            .publish(vec![
                input(&topic, EnvelopeKind::Application, u64::MAX),
                input(&topic, EnvelopeKind::Application, crate::domain::MAX_SEQUENCE_GAP + 1),
                input(&[0u8, 8], EnvelopeKind::Application, 0),
                input(&topic, EnvelopeKind::Application, 0),
            ])
            .await
            .unwrap();
        assert_eq!(results[0].1, Err(EnvelopeRejection::SequenceTooFarAhead { last: 0 }));
        assert_eq!(results[1].1, Err(EnvelopeRejection::SequenceTooFarAhead { last: 0 }));
        assert_eq!(results[2].1, Ok(1), "another shard's envelope is stored");
        assert!(results[3].1.is_ok(), "the shard still allocates");
        let again = f.ingest.publish(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        assert!(again[0].1.is_ok(), "later publishes to the shard work");
    }

    #[tokio::test]
    async fn data_over_the_limit_fails_alone_and_changes_nothing() {
        let f = fixture(None).await;
        let topic = [0u8, 7];
        let shard = Topic::parse(&topic).unwrap().shard(SHARDS);
        let sized = |n: usize| EnvelopeInput { data: vec![1; n], ..input(&topic, EnvelopeKind::Application, 0) };
        let results = f.ingest.publish(vec![sized(16), sized(17), sized(0), sized(1 << 20)]).await.unwrap();
        assert_eq!(results[0], (Some(shard), Ok(1)), "at the limit is stored");
        assert_eq!(results[1], (None, Err(EnvelopeRejection::DataTooLarge { limit: 16 })));
        assert_eq!(results[2], (Some(shard), Ok(2)), "the neighbours are stored");
        assert_eq!(results[3].1, Err(EnvelopeRejection::DataTooLarge { limit: 16 }));
        let message = results[1].1.clone().unwrap_err().to_string();
        assert_eq!(message, "envelope data is larger than the limit of 16 bytes (engine.ingest.max_data_bytes)");
        assert_eq!(f.ingest.store.shard_position(shard).await.unwrap().boundary, 2, "no id taken by a refusal");
        let refusals = f.ingest.metrics.render();
        assert!(refusals.contains("fanout_limit_refusals_total{limit=\"envelope_data\"} 2"), "{refusals}");
    }

    #[tokio::test]
    async fn nothing_stored_wakes_nothing() {
        let f = fixture(None).await;
        let results = f.ingest.publish(vec![input(&[0x09], EnvelopeKind::Application, 0)]).await.unwrap();
        assert!(results[0].1.is_err());
        assert!(wakes(&f).await.is_empty());
    }

    #[tokio::test]
    async fn an_unowned_shard_is_redirected_to_its_owner_or_refused() {
        let leases = Arc::new(MemoryLeases::default());
        let (_, owned) = watch::channel(OwnedShards { settled: true, ..OwnedShards::default() });
        let f = fixture(Some(ownership(owned, leases.clone()))).await;
        let topic = [0u8, 7];
        let shard = Topic::parse(&topic).unwrap().shard(SHARDS);
        let ttl = Duration::from_secs(60);
        let results = f.ingest.publish(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        assert_eq!(results[0].1, Err(EnvelopeRejection::NoOwner { shard: shard.index() }));
        // A lease naming this node's own address but not owned: a dead predecessor's.
        assert!(leases.acquire_lease(shard, &NodeId("old".into()), "me:1", ttl).await.unwrap());
        let results = f.ingest.publish(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        assert_eq!(results[0].1, Err(EnvelopeRejection::NoOwner { shard: shard.index() }));
        leases.release_lease(shard, &NodeId("old".into())).await.unwrap();
        assert!(leases.acquire_lease(shard, &NodeId("b".into()), "b:1", ttl).await.unwrap());
        let results = f.ingest.publish(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        assert_eq!(
            results[0].1,
            Err(EnvelopeRejection::OwnedElsewhere { shard: shard.index(), address: "b:1".into() })
        );
        assert_eq!(f.ingest.store.shard_position(shard).await.unwrap().boundary, 0, "nothing appended");
    }

    /// Envelopes of another node's shard are set aside for forwarding, in
    /// batch order, with their owner; those taken are not counted here, and
    /// those left are answered with the owner's address.
    #[tokio::test]
    async fn envelopes_another_node_owns_are_routed_to_it_in_order() {
        let leases = Arc::new(MemoryLeases::default());
        let (mine, theirs) = ([0u8, 7], [0u8, 8]);
        let (my_shard, their_shard) =
            (Topic::parse(&mine).unwrap().shard(SHARDS), Topic::parse(&theirs).unwrap().shard(SHARDS));
        assert_ne!(my_shard, their_shard);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let held = OwnedShards { shards: BTreeMap::from([(my_shard, deadline)]), settled: true, ..Default::default() };
        let (_tx, owned) = watch::channel(held);
        let f = fixture(Some(ownership(owned, leases.clone()))).await;
        assert!(leases.acquire_lease(their_shard, &NodeId("b".into()), "b:1", Duration::from_secs(60)).await.unwrap());
        let batch = || {
            vec![
                input(&theirs, EnvelopeKind::Application, 0),
                input(&mine, EnvelopeKind::Application, 0),
                input(&[0x09, 1], EnvelopeKind::Application, 0),
                input(&theirs, EnvelopeKind::Application, 5),
            ]
        };
        let mut routed = f.ingest.route(batch()).await.unwrap();
        let taken = std::mem::take(&mut routed.elsewhere);
        let placed: Vec<(usize, ShardId, &str, Option<u64>)> = taken
            .iter()
            .map(|e| (e.index, e.shard, e.owner.as_deref().unwrap_or("-"), e.envelope.sequence_id))
            .collect();
        assert_eq!(placed, [(0, their_shard, "b:1", None), (3, their_shard, "b:1", Some(5))]);
        let results = f.ingest.store(routed).await.unwrap();
        assert_eq!(results[1], (Some(my_shard), Ok(1)));
        assert!(matches!(results[2], (None, Err(EnvelopeRejection::Invalid(_)))));
        assert_eq!(f.ingest.store.shard_position(their_shard).await.unwrap().boundary, 0, "nothing appended");
        let published = &f.ingest.metrics.envelopes_published;
        let counts =
            || (published.with_label_values(&["stored"]).get(), published.with_label_values(&["rejected"]).get());
        assert_eq!(counts(), (1, 1), "the forwarded two are the owner's to count");

        // Not taken: answered with the owner, and counted as refused here.
        let results = f.ingest.publish(batch()).await.unwrap();
        let redirect = EnvelopeRejection::OwnedElsewhere { shard: their_shard.index(), address: "b:1".into() };
        assert_eq!(results[0], (Some(their_shard), Err(redirect.clone())));
        assert_eq!(results[3], (Some(their_shard), Err(redirect)));
        assert_eq!(counts(), (2, 4));

        // The shard map names this node for its shard and b for b's.
        let map = f.ingest.shard_map().await.unwrap();
        assert_eq!(map.len(), usize::from(SHARDS));
        assert_eq!(map[usize::from(my_shard.index())].as_deref(), Some("me:1"));
        assert_eq!(map[usize::from(their_shard.index())].as_deref(), Some("b:1"));
        assert_eq!(map.iter().filter(|o| o.is_none()).count(), usize::from(SHARDS) - 2, "the rest have no owner");
    }

    /// An envelope that found no owner is set aside too (the caller may
    /// route it again), and once the shard has one (here this node) it is stored.
    #[tokio::test]
    async fn an_envelope_with_no_owner_is_set_aside_and_routed_again() {
        let leases = Arc::new(MemoryLeases::default());
        let (tx, owned) = watch::channel(OwnedShards { settled: true, ..OwnedShards::default() });
        let f = fixture(Some(ownership(owned, leases))).await;
        let topic = [0u8, 7];
        let shard = Topic::parse(&topic).unwrap().shard(SHARDS);
        let mut routed = f.ingest.route(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        let taken = std::mem::take(&mut routed.elsewhere);
        assert_eq!((taken.len(), taken[0].owner.as_deref()), (1, None), "no owner yet");
        assert!(f.ingest.store(routed).await.unwrap()[0].1.is_err(), "not stored here");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        tx.send_modify(|o| {
            o.shards.insert(shard, deadline);
        });
        assert!(taken[0].envelope.sequence_id.is_none());
        let again = f.ingest.route(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        assert!(again.elsewhere.is_empty(), "held now");
        assert_eq!(f.ingest.store(again).await.unwrap()[0], (Some(shard), Ok(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_whose_local_lease_deadline_passed_takes_no_publish() {
        let leases = Arc::new(MemoryLeases::default());
        let topic = [0u8, 7];
        let shard = Topic::parse(&topic).unwrap().shard(SHARDS);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let (tx, owned) = watch::channel(OwnedShards {
            shards: BTreeMap::from([(shard, deadline)]),
            settled: true,
            ..Default::default()
        });
        let f = fixture(Some(ownership(owned, leases))).await;
        let results = f.ingest.publish(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        assert_eq!(results[0].1, Ok(1), "held: stored");
        // No renewal came: past the deadline the shard is fenced off.
        tokio::time::advance(Duration::from_secs(5)).await;
        let results = f.ingest.publish(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        assert_eq!(results[0].1, Err(EnvelopeRejection::NoOwner { shard: shard.index() }));
        assert_eq!(f.ingest.store.shard_position(shard).await.unwrap().boundary, 1, "nothing appended");
        // A late renewal moves the deadline: publishing works again.
        tx.send_modify(|o| {
            o.shards.insert(shard, tokio::time::Instant::now() + Duration::from_secs(5));
        });
        let results = f.ingest.publish(vec![input(&topic, EnvelopeKind::Application, 0)]).await.unwrap();
        assert_eq!(results[0].1, Ok(2));
    }

    /// On a shared store an append that completed after the local lease
    /// deadline is not acknowledged: the next owner may not have seen it.
    #[tokio::test(start_paused = true)]
    async fn an_append_that_outlives_the_lease_deadline_is_not_acknowledged() {
        let leases = Arc::new(MemoryLeases::default());
        let (held, other) = ([0u8, 7], [0u8, 8]);
        let shard = Topic::parse(&held).unwrap().shard(SHARDS);
        let other_shard = Topic::parse(&other).unwrap().shard(SHARDS);
        assert_ne!(shard, other_shard);
        let now = tokio::time::Instant::now();
        let deadlines =
            BTreeMap::from([(shard, now + Duration::from_secs(5)), (other_shard, now + Duration::from_secs(60))]);
        let (_tx, owned) = watch::channel(OwnedShards { shards: deadlines, settled: true, ..Default::default() });
        let f = fixture(Some(ownership(owned, leases))).await;
        let envelopes = |topic: &[u8]| {
            let e = input(topic, EnvelopeKind::Application, 0);
            NewEnvelope::new(Topic::parse(topic).unwrap(), SHARDS, EnvelopeKind::Application, true, None, e.data, None)
                .unwrap()
        };
        let appended = [envelopes(&held), envelopes(&other)];
        assert!(f.ingest.fenced_after_append(&appended).is_empty(), "both held");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(f.ingest.fenced_after_append(&appended), BTreeSet::from([shard]), "only the lapsed one");
        let message = EnvelopeRejection::LeaseLost { shard: shard.index() }.to_string();
        assert!(message.contains("outcome unknown"), "{message}");
    }

    /// The gRPC envelope fields as received, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        use proptest::test_runner::{Config, TestRunner};

        /// The fields of one `pb::Envelope`, mostly near the valid values.
        fn fields() -> impl Strategy<Value = (Vec<u8>, i32, bool, Vec<u8>, Vec<u8>, u64, i32, String)> {
            let topic = prop_oneof![
                3 => (0u8..4, prop::collection::vec(any::<u8>(), 1..65)).prop_map(|(k, mut id)| {
                    id.insert(0, k);
                    id
                }),
                1 => prop::collection::vec(any::<u8>(), 0..70),
            ];
            let kind = prop_oneof![3 => 0i32..9, 1 => any::<i32>()];
            let membership = prop_oneof![3 => 0i32..4, 1 => any::<i32>()];
            let message_id = prop_oneof!["", "[!-~]{1,64}", "\\PC{0,70}"];
            (
                topic,
                kind,
                any::<bool>(),
                prop::collection::vec(any::<u8>(), 0..40),
                prop::collection::vec(any::<u8>(), 0..24),
                prop_oneof![Just(0u64), any::<u64>()],
                membership,
                message_id,
            )
        }

        /// Any field values are stored as sent or refused by a rule that
        /// names no value; what is stored matches the domain's own parsers.
        #[tokio::test]
        async fn any_envelope_fields_parse_by_the_rules() {
            let f = fixture(None).await;
            let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::with_cases(512) });
            runner
                .run(&fields(), |(topic, kind, should_push, sender_hmac, data, sequence_id, membership, message_id)| {
                    let input = EnvelopeInput {
                        topic: topic.clone(),
                        kind,
                        should_push,
                        sender_hmac: sender_hmac.clone(),
                        data: data.clone(),
                        sequence_id,
                        membership_change: membership,
                        message_id: message_id.clone(),
                    };
                    let parsed_kind = u8::try_from(kind).ok().and_then(EnvelopeKind::from_u8);
                    let membership_ok =
                        membership == 0 || u8::try_from(membership).ok().and_then(MembershipChange::from_u8).is_some();
                    let message_id_ok = message_id.is_empty() || MessageId::parse(&message_id).is_ok();
                    let matches_topic = match (Topic::parse(&topic), parsed_kind) {
                        (Ok(t), Some(k)) => NewEnvelope::new(t, SHARDS, k, false, None, vec![], None).is_ok(),
                        _ => false,
                    };
                    let valid = data.len() <= 16 && matches_topic && membership_ok && message_id_ok;
                    match f.ingest.parse(input) {
                        Ok(envelope) => {
                            prop_assert!(valid);
                            prop_assert_eq!(envelope.topic().as_bytes(), &topic[..]);
                            prop_assert_eq!(envelope.shard(), envelope.topic().shard(SHARDS));
                            prop_assert_eq!(Some(envelope.kind()), parsed_kind);
                            prop_assert_eq!(envelope.should_push, should_push);
                            prop_assert_eq!(envelope.sender_hmac, SenderHmac::parse(&sender_hmac));
                            prop_assert_eq!(envelope.data, data);
                            prop_assert_eq!(envelope.sequence_id, (sequence_id != 0).then_some(sequence_id));
                            prop_assert_eq!(
                                envelope.relay.message_id.map(|m| m.as_str().to_owned()).unwrap_or_default(),
                                message_id
                            );
                            // 003 section 3: only a Commit keeps its membership change.
                            let kept = envelope.relay.membership.map_or(0, |m| m as i32);
                            let want = if parsed_kind == Some(EnvelopeKind::Commit) { membership } else { 0 };
                            prop_assert_eq!(kept, want);
                        }
                        Err(EnvelopeRejection::DataTooLarge { limit }) => {
                            prop_assert!(data.len() > limit && limit == 16)
                        }
                        Err(EnvelopeRejection::Invalid(_)) => prop_assert!(!valid && data.len() <= 16),
                        Err(other) => prop_assert!(false, "parse never answers {other:?}"),
                    }
                    Ok(())
                })
                .unwrap();
        }
    }
}
