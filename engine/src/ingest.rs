//! Envelope ingest: validate each envelope, store a batch in one append, and
//! wake the shards that moved. One bad envelope never drops the good ones.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ractor::ActorRef;

use crate::clock::unix_now_ns;

use crate::ownership::ShardOwnership;
use crate::supervisor::SupervisorMsg;
use crate::domain::{EnvelopeKind, NewEnvelope, ParseError, ShardId, Topic};
use crate::metrics::Metrics;
use crate::store::{Appended, Store, StoreError};

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
}

/// Why one envelope was not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeRejection {
    #[error("{0}")]
    Invalid(&'static str),
    #[error("sequence_id is not above the shard's last id {last}")]
    SequenceNotIncreasing { last: u64 },
    /// Issue 7 redirect contract: another node owns the shard; publish there.
    #[error("shard {shard} is owned by {address}; publish there")]
    OwnedElsewhere { shard: u16, address: String },
    /// Issue 7: no node owns the shard right now (leases are moving); retry.
    #[error("shard {shard} has no owner yet; retry")]
    NoOwner { shard: u16 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub shard: ShardId,
    pub sequence_id: u64,
}

pub struct Ingest {
    pub store: Arc<dyn Store>,
    pub shard_count: u16,
    pub dispatch: ActorRef<SupervisorMsg>,
    pub metrics: Arc<Metrics>,
    /// The shards this node may append to; `None`: all of them (one node).
    pub ownership: Option<ShardOwnership>,
    /// This node's advertised gRPC address: a lease naming it but not in the
    /// owned set is a dead predecessor's, so the answer is "no owner yet".
    pub advertise_address: String,
}

/// Most envelopes one publish request may carry.
pub const MAX_BATCH: usize = 10_000;

impl Ingest {
    /// One result per input, in order. `Err` only when storage itself failed.
    pub async fn publish(
        &self,
        inputs: Vec<EnvelopeInput>,
    ) -> Result<Vec<(Option<ShardId>, Result<u64, EnvelopeRejection>)>, StoreError> {
        let parsed: Vec<Result<NewEnvelope, (Option<ShardId>, EnvelopeRejection)>> = inputs
            .into_iter()
            .map(|i| self.parse(i).map_err(|e| (None, EnvelopeRejection::Invalid(e.0))))
            .collect();
        let parsed = self.redirect_unowned(parsed).await?;
        let valid: Vec<NewEnvelope> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
        let appended = if valid.is_empty() { Vec::new() } else { self.store.append(&valid, unix_now_ns()).await? };
        let mut appended = appended.into_iter().zip(valid.iter().map(|e| e.shard));
        let mut woken = BTreeSet::new();
        let results = parsed
            .into_iter()
            .map(|p| match p {
                Err((shard, e)) => (shard, Err(e)),
                Ok(_) => match appended.next() {
                    Some((Appended::Stored { sequence_id }, shard)) => {
                        woken.insert(shard);
                        (Some(shard), Ok(sequence_id))
                    }
                    Some((Appended::SequenceNotIncreasing { last }, shard)) => {
                        (Some(shard), Err(EnvelopeRejection::SequenceNotIncreasing { last }))
                    }
                    None => (None, Err(EnvelopeRejection::Invalid("not stored"))),
                },
            })
            .collect::<Vec<_>>();
        let stored = results.iter().filter(|r| r.1.is_ok()).count() as u64;
        self.metrics.envelopes_published.with_label_values(&["stored"]).inc_by(stored);
        self.metrics.envelopes_published.with_label_values(&["rejected"]).inc_by(results.len() as u64 - stored);
        if !woken.is_empty() {
            let _ = self.dispatch.cast(SupervisorMsg::Wake(woken.into_iter().collect()));
        }
        Ok(results)
    }

    /// Issue 7: only the owner of a shard appends to it. An envelope of a
    /// shard this node does not own is answered with where to publish it.
    async fn redirect_unowned(
        &self,
        parsed: Vec<Result<NewEnvelope, (Option<ShardId>, EnvelopeRejection)>>,
    ) -> Result<Vec<Result<NewEnvelope, (Option<ShardId>, EnvelopeRejection)>>, StoreError> {
        let Some(ownership) = &self.ownership else { return Ok(parsed) };
        let owned = ownership.owned.borrow().shards.clone();
        let mut owners: HashMap<ShardId, EnvelopeRejection> = HashMap::new();
        let mut out = Vec::with_capacity(parsed.len());
        for p in parsed {
            match p {
                Ok(e) if !owned.contains(&e.shard) => {
                    let shard = e.shard;
                    let rejection = match owners.get(&shard) {
                        Some(r) => r.clone(),
                        None => {
                            let r = match ownership.leases.lease_owner(shard).await? {
                                Some((_, address)) if !address.is_empty() && address != self.advertise_address => {
                                    EnvelopeRejection::OwnedElsewhere { shard: shard.0, address }
                                }
                                _ => EnvelopeRejection::NoOwner { shard: shard.0 },
                            };
                            owners.insert(shard, r.clone());
                            r
                        }
                    };
                    out.push(Err((Some(shard), rejection)));
                }
                other => out.push(other),
            }
        }
        Ok(out)
    }

    fn parse(&self, input: EnvelopeInput) -> Result<NewEnvelope, ParseError> {
        let topic = Topic::parse(&input.topic)?;
        let kind = u8::try_from(input.kind)
            .ok()
            .and_then(EnvelopeKind::from_u8)
            .ok_or(ParseError("envelope kind is unspecified or unknown"))?;
        let sequence_id = (input.sequence_id != 0).then_some(input.sequence_id);
        NewEnvelope::new(topic, self.shard_count, kind, input.should_push, input.sender_hmac, input.data, sequence_id)
    }
}
