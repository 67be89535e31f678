//! The envelopes of a batch that this node does not hold: forwarded to
//! their shard's owner, one request per owner, and routed again while the
//! owner moves.
//!
//! An envelope is routed again (after a short pause, the owner read again
//! from the leases) only when nothing was stored for it: its shard had no
//! owner, the node it was sent to answered that it does not hold the shard
//! (`SHARD_OWNED_ELSEWHERE`, `SHARD_HAS_NO_OWNER`: a forwarded request is
//! never forwarded on), or no connection to that node could be opened. So a
//! node leaving or joining costs the publisher a little latency, not an
//! error. It may be stored here then, once this node holds its shard. A
//! forward whose outcome is unknown (a timeout, a broken connection, a lease
//! lost while storing) is never sent again: that could store it twice. All
//! of it ends by the forward's deadline (the caller's, less a tenth, or
//! `server.forwarding.timeout_ms`) and after `MAX_ROUTES` routings; what is
//! left then is answered with its last answer, 14 UNAVAILABLE.

use std::collections::BTreeMap;
use std::sync::Arc;

use fanout_engine::domain::ShardId;
use fanout_engine::ingest::{Elsewhere, EnvelopeRejection, Ingest};
use fanout_engine::metrics::PublishResult;
use fanout_proto::routing::{Reason, Routing};
use fanout_proto::v1 as pb;
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;

use super::answer::{envelope, forward_failed, input, result};
use crate::forward::{Failure, Forwarder, MAX_ROUTES, Retry, pause};

/// How a batch may forward (`None` for a batch that was itself forwarded
/// here, which is never forwarded twice, or with forwarding off).
pub(super) struct Forwarding {
    pub forwarder: Arc<Forwarder>,
    /// The call's own deadline, if it has one (a Publish; not a stream's batch).
    pub call_deadline: Option<Instant>,
    /// The publisher's `authorization`, passed on when this node has no token of its own.
    pub authorization: Option<AsciiMetadataValue>,
}

/// An envelope that may be routed again: nothing was stored for it.
struct Unplaced {
    /// Its place in the batch.
    index: usize,
    envelope: pb::Envelope,
    /// What it is answered if it is not routed again.
    answer: pb::PublishResult,
    why: Retry,
}

/// The answers of `elsewhere` (envelopes set aside by `Ingest::route`), as
/// (place in the batch, answer), by `deadline`.
pub(super) async fn place(
    ingest: &Ingest,
    forwarding: &Forwarding,
    elsewhere: Vec<Elsewhere>,
    deadline: Instant,
) -> Vec<(usize, pb::PublishResult)> {
    let mut placed = Vec::with_capacity(elsewhere.len());
    // The first routing numbers envelopes by their place in the batch.
    let mut places: Option<Vec<usize>> = None;
    let mut pending = elsewhere;
    for routed in 1.. {
        let place_of = |i: usize| places.as_ref().map_or(i, |p| p[i]);
        let unplaced = forward(ingest, forwarding, pending, deadline, &place_of, &mut placed).await;
        if unplaced.is_empty() {
            break;
        }
        let wait = pause(routed);
        if routed >= MAX_ROUTES || Instant::now() + wait >= deadline {
            ingest.metrics.envelopes_published_as(PublishResult::Rejected).inc_by(unplaced.len() as u64);
            placed.extend(unplaced.into_iter().map(|u| (u.index, u.answer)));
            break;
        }
        for u in &unplaced {
            forwarding.forwarder.retried(u.why, 1);
        }
        tokio::time::sleep(wait).await;
        let (again, answers): (Vec<(usize, pb::Envelope)>, Vec<pb::PublishResult>) =
            unplaced.into_iter().map(|u| ((u.index, u.envelope), u.answer)).unzip();
        let (indices, envelopes): (Vec<usize>, Vec<pb::Envelope>) = again.into_iter().unzip();
        let mut routed_again = match ingest.route(envelopes.into_iter().map(input).collect()).await {
            Ok(r) => r,
            // The leases could not be read: still stored nowhere.
            Err(_) => {
                ingest.metrics.envelopes_published_as(PublishResult::Rejected).inc_by(answers.len() as u64);
                placed.extend(indices.into_iter().zip(answers));
                break;
            }
        };
        pending = std::mem::take(&mut routed_again.elsewhere);
        // Those of shards this node holds by now are stored here.
        let away: std::collections::HashSet<usize> = pending.iter().map(|e| e.index).collect();
        match ingest.store(routed_again).await {
            Ok(results) => placed.extend(
                results
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| !away.contains(i))
                    .map(|(i, r)| (indices[i], result(r))),
            ),
            Err(e) => placed.extend(
                (0..indices.len()).filter(|i| !away.contains(i)).map(|i| (indices[i], storage_failed(&e.to_string()))),
            ),
        }
        places = Some(indices);
    }
    placed
}

/// One routing: each envelope with an owner forwarded there (one request
/// per owner, concurrently), its answer put in `placed`, or returned when
/// it may be routed again, as is each envelope with no owner.
async fn forward(
    ingest: &Ingest,
    forwarding: &Forwarding,
    pending: Vec<Elsewhere>,
    deadline: Instant,
    place_of: &impl Fn(usize) -> usize,
    placed: &mut Vec<(usize, pb::PublishResult)>,
) -> Vec<Unplaced> {
    let mut unplaced = Vec::new();
    let mut groups: BTreeMap<String, Vec<(usize, ShardId, pb::Envelope)>> = BTreeMap::new();
    for e in pending {
        let (index, shard) = (place_of(e.index), e.shard);
        match e.owner {
            Some(owner) => groups.entry(owner).or_default().push((index, shard, envelope(e.envelope))),
            None => unplaced.push(Unplaced {
                index,
                envelope: envelope(e.envelope),
                answer: result((Some(shard), Err(EnvelopeRejection::NoOwner { shard: shard.index() }))),
                why: Retry::NoOwner,
            }),
        }
    }
    let authorization = forwarding.authorization.as_ref();
    let forwards = groups.into_iter().map(|(owner, group)| async move {
        // Kept until the answer: an envelope stored nowhere is sent again.
        let envelopes = group.iter().map(|(_, _, e)| e.clone()).collect();
        let outcome = forwarding.forwarder.forward(&owner, envelopes, deadline, authorization).await;
        (owner, group, outcome)
    });
    for (owner, group, outcome) in futures::future::join_all(forwards).await {
        match outcome {
            Ok(answers) => {
                for ((index, shard, envelope), answer) in group.into_iter().zip(answers) {
                    match moved(&answer) {
                        Some(why) => {
                            ingest.forget_owner(shard, &owner);
                            unplaced.push(Unplaced { index, envelope, answer, why });
                        }
                        None => placed.push((index, answer)),
                    }
                }
            }
            Err(failure) => {
                // Read the lease again next time rather than send there.
                for (_, shard, _) in &group {
                    ingest.forget_owner(*shard, &owner);
                }
                if failure == Failure::NotConnected {
                    unplaced.extend(group.into_iter().map(|(index, shard, envelope)| Unplaced {
                        index,
                        envelope,
                        answer: forward_failed(shard, &owner, failure),
                        why: Retry::NotConnected,
                    }));
                } else {
                    ingest.metrics.envelopes_published_as(PublishResult::Rejected).inc_by(group.len() as u64);
                    placed.extend(
                        group.into_iter().map(|(index, shard, _)| (index, forward_failed(shard, &owner, failure))),
                    );
                }
            }
        }
    }
    unplaced
}

/// Why an owner's answer may be routed again: it says the node does not
/// hold the shard, so it stored nothing. Anything else is the answer.
fn moved(answer: &pb::PublishResult) -> Option<Retry> {
    let Some(pb::publish_result::Result::Error(e)) = &answer.result else { return None };
    if e.code != tonic::Code::Unavailable as i32 {
        return None;
    }
    match Routing::of(e) {
        Some(r) if r.outcome_unknown => None,
        Some(Routing { reason: Reason::ShardOwnedElsewhere, .. }) => Some(Retry::OwnerMoved),
        Some(Routing { reason: Reason::ShardHasNoOwner, .. }) => Some(Retry::NoOwner),
        _ => None,
    }
}

/// The answer of an envelope whose append, on a later routing, failed in
/// the store: it may have been written.
fn storage_failed(error: &str) -> pb::PublishResult {
    pb::PublishResult {
        shard: 0,
        result: Some(pb::publish_result::Result::Error(pb::PublishError {
            code: tonic::Code::Unavailable as i32,
            message: format!("storage failed: {error}; outcome unknown, retry"),
            details: vec![],
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(rejection: EnvelopeRejection) -> pb::PublishResult {
        result((None, Err(rejection)))
    }

    #[test]
    fn only_answers_that_prove_nothing_was_stored_are_routed_again() {
        let moved_to = EnvelopeRejection::OwnedElsewhere { shard: 3, address: "n3:1".into() };
        assert_eq!(moved(&error(moved_to)), Some(Retry::OwnerMoved));
        assert_eq!(moved(&error(EnvelopeRejection::NoOwner { shard: 3 })), Some(Retry::NoOwner));
        assert_eq!(moved(&error(EnvelopeRejection::LeaseLost { shard: 3 })), None, "outcome unknown");
        assert_eq!(moved(&error(EnvelopeRejection::Invalid("bad"))), None);
        assert_eq!(moved(&result((None, Ok(7)))), None);
        let shard = ShardId::parse(3, 16).unwrap();
        assert_eq!(moved(&forward_failed(shard, "n2:1", Failure::Timeout)), None, "the owner may have stored it");
        assert_eq!(moved(&forward_failed(shard, "n2:1", Failure::NotConnected)), None, "answered by this node");
    }
}
