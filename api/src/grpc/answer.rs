//! One envelope's answer as the publisher is sent it (engine result →
//! proto, with the routing detail every 14 UNAVAILABLE carries), and a
//! parsed envelope as a forward sends it on.

use fanout_engine::domain::{NewEnvelope, ShardId};
use fanout_engine::ingest::{EnvelopeInput, EnvelopeRejection, EnvelopeResult};
use fanout_proto::routing::{Reason, Routing};
use fanout_proto::v1 as pb;

use crate::forward::Failure;

/// An envelope as ingest takes it.
pub(super) fn input(e: pb::Envelope) -> EnvelopeInput {
    EnvelopeInput {
        topic: e.topic,
        kind: e.kind,
        should_push: e.should_push,
        sender_hmac: e.sender_hmac,
        data: e.data,
        sequence_id: e.sequence_id,
        membership_change: e.membership_change,
        message_id: e.message_id,
    }
}

/// A parsed envelope as the owner is sent it: it parses there to the same
/// envelope (a `sender_hmac` of another length than 32 bytes was none
/// already, and a membership change only counts on a Commit).
pub(super) fn envelope(e: NewEnvelope) -> pb::Envelope {
    pb::Envelope {
        topic: e.topic().as_bytes().to_vec(),
        kind: i32::from(e.kind() as u8),
        should_push: e.should_push,
        sender_hmac: e.sender_hmac.map(|h| h.as_bytes().to_vec()).unwrap_or_default(),
        sequence_id: e.sequence_id.unwrap_or(0),
        membership_change: e.relay.membership.map_or(0, |m| i32::from(m as u8)),
        message_id: e.relay.message_id.map(|m| m.as_str().to_owned()).unwrap_or_default(),
        data: e.data,
    }
}

pub(super) fn result((shard, r): EnvelopeResult) -> pb::PublishResult {
    pb::PublishResult {
        shard: shard.map_or(0, |s| u32::from(s.index())),
        result: Some(match r {
            Ok(seq) => pb::publish_result::Result::SequenceId(seq),
            Err(e) => pb::publish_result::Result::Error(rejection(e)),
        }),
    }
}

fn rejection(e: EnvelopeRejection) -> pb::PublishError {
    let (code, routing) = match &e {
        // An envelope over `engine.ingest.max_data_bytes` is invalid
        // for this deployment whatever its state; resending it cannot help.
        EnvelopeRejection::Invalid(_)
        | EnvelopeRejection::DataTooLarge { .. }
        | EnvelopeRejection::SequenceTooFarAhead { .. } => (tonic::Code::InvalidArgument, None),
        EnvelopeRejection::SequenceExhausted => (tonic::Code::ResourceExhausted, None),
        EnvelopeRejection::SequenceNotIncreasing { .. } => (tonic::Code::FailedPrecondition, None),
        // Retry, where the detail says (see the proto).
        EnvelopeRejection::OwnedElsewhere { shard, address } => (
            tonic::Code::Unavailable,
            Some(Routing {
                reason: Reason::ShardOwnedElsewhere,
                shard: u32::from(*shard),
                owner: Some(address.clone()),
                outcome_unknown: false,
                failure: None,
            }),
        ),
        EnvelopeRejection::NoOwner { shard } => (
            tonic::Code::Unavailable,
            Some(Routing {
                reason: Reason::ShardHasNoOwner,
                shard: u32::from(*shard),
                owner: None,
                outcome_unknown: false,
                failure: None,
            }),
        ),
        EnvelopeRejection::LeaseLost { shard } => (
            tonic::Code::Unavailable,
            Some(Routing {
                reason: Reason::LeaseLostWhileStoring,
                shard: u32::from(*shard),
                owner: None,
                outcome_unknown: true,
                failure: None,
            }),
        ),
    };
    pb::PublishError {
        code: code as i32,
        message: e.to_string(),
        details: routing.iter().map(Routing::to_any).collect(),
    }
}

/// The answer of an envelope whose forward to `owner` failed.
pub(super) fn forward_failed(shard: ShardId, owner: &str, failure: Failure) -> pb::PublishResult {
    let outcome = if failure.outcome_unknown() { "outcome unknown" } else { "nothing stored" };
    let routing = Routing {
        reason: Reason::ForwardFailed,
        shard: u32::from(shard.index()),
        owner: Some(owner.to_owned()),
        outcome_unknown: failure.outcome_unknown(),
        failure: Some(failure.as_str().to_owned()),
    };
    let message = format!(
        "shard {} is owned by {owner}, and forwarding there failed ({}); {outcome}, retry",
        shard.index(),
        failure.as_str()
    );
    pb::PublishResult {
        shard: u32::from(shard.index()),
        result: Some(pb::publish_result::Result::Error(pb::PublishError {
            code: tonic::Code::Unavailable as i32,
            message,
            details: vec![routing.to_any()],
        })),
    }
}

#[cfg(test)]
mod tests {
    use fanout_engine::domain::{EnvelopeKind, MembershipChange, MessageId, RelayMeta, SenderHmac, Topic};

    use super::*;

    #[test]
    fn a_forwarded_envelope_carries_every_field_it_was_parsed_from() {
        let topic = Topic::parse(&[0, 1, 2, 3]).unwrap();
        let hmac = SenderHmac::parse(&[7; 32]);
        let mut parsed =
            NewEnvelope::new(topic.clone(), 16, EnvelopeKind::Commit, true, hmac, b"data".to_vec(), Some(42)).unwrap();
        parsed.relay = RelayMeta {
            message_id: Some(MessageId::parse("m-1").unwrap()),
            membership: Some(MembershipChange::MemberAdded),
        };
        let e = envelope(parsed);
        assert_eq!(
            e,
            pb::Envelope {
                topic: vec![0, 1, 2, 3],
                kind: pb::EnvelopeKind::Commit as i32,
                should_push: true,
                sender_hmac: vec![7; 32],
                data: b"data".to_vec(),
                sequence_id: 42,
                membership_change: pb::MembershipChange::MemberAdded as i32,
                message_id: "m-1".into(),
            }
        );
        let plain = NewEnvelope::new(topic, 16, EnvelopeKind::Application, false, None, vec![], None).unwrap();
        let e = envelope(plain);
        assert_eq!((e.sender_hmac.len(), e.sequence_id, e.membership_change, e.message_id.as_str()), (0, 0, 0, ""));
    }

    #[test]
    fn unavailable_answers_carry_their_routing_detail_and_others_none() {
        let routing = |e: EnvelopeRejection| Routing::of(&rejection(e));
        let owned = routing(EnvelopeRejection::OwnedElsewhere { shard: 3, address: "10.0.0.2:50051".into() }).unwrap();
        assert_eq!(
            (owned.reason, owned.shard, owned.owner.as_deref()),
            (Reason::ShardOwnedElsewhere, 3, Some("10.0.0.2:50051"))
        );
        assert!(!owned.outcome_unknown);
        let none = routing(EnvelopeRejection::NoOwner { shard: 4 }).unwrap();
        assert_eq!((none.reason, none.owner, none.outcome_unknown), (Reason::ShardHasNoOwner, None, false));
        let lost = routing(EnvelopeRejection::LeaseLost { shard: 5 }).unwrap();
        assert_eq!((lost.reason, lost.outcome_unknown), (Reason::LeaseLostWhileStoring, true));
        assert_eq!(routing(EnvelopeRejection::Invalid("bad")), None);
        assert_eq!(rejection(EnvelopeRejection::NoOwner { shard: 4 }).code, tonic::Code::Unavailable as i32);

        let shard = ShardId::parse(6, 16).unwrap();
        let Some(pb::publish_result::Result::Error(e)) = forward_failed(shard, "n2:1", Failure::Timeout).result else {
            panic!("an error")
        };
        assert_eq!(e.code, tonic::Code::Unavailable as i32);
        assert_eq!(
            e.message,
            "shard 6 is owned by n2:1, and forwarding there failed (timeout); outcome unknown, retry"
        );
        let detail = Routing::of(&e).unwrap();
        assert_eq!((detail.reason, detail.shard, detail.owner.as_deref()), (Reason::ForwardFailed, 6, Some("n2:1")));
        assert_eq!((detail.outcome_unknown, detail.failure.as_deref()), (true, Some("timeout")));
        let Some(pb::publish_result::Result::Error(e)) = forward_failed(shard, "n2:1", Failure::InFlight).result else {
            panic!("an error")
        };
        assert!(!Routing::of(&e).unwrap().outcome_unknown, "never sent: nothing stored");
    }
}
