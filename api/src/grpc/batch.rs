//! One publish batch, as `Publish` and `PublishStream` both store it: proto
//! envelopes in, one result per envelope out.

use fanout_engine::ingest::{EnvelopeInput, EnvelopeRejection, Ingest, MAX_BATCH};
use fanout_proto::v1 as pb;
use tonic::Status;

use super::status::store_status;

/// Stores one batch: one result per envelope, in order. `Err` refuses the
/// batch as a whole (too many envelopes, storage failed).
pub(super) async fn publish_batch(
    ingest: &Ingest,
    envelopes: Vec<pb::Envelope>,
) -> Result<Vec<pb::PublishResult>, Status> {
    if envelopes.len() > MAX_BATCH {
        return Err(Status::invalid_argument(format!("a publish request carries at most {MAX_BATCH} envelopes")));
    }
    let inputs = envelopes
        .into_iter()
        .map(|e| EnvelopeInput {
            topic: e.topic,
            kind: e.kind,
            should_push: e.should_push,
            sender_hmac: e.sender_hmac,
            data: e.data,
            sequence_id: e.sequence_id,
            membership_change: e.membership_change,
            message_id: e.message_id,
        })
        .collect();
    let results = ingest.publish(inputs).await.map_err(store_status)?;
    Ok(results
        .into_iter()
        .map(|(shard, r)| pb::PublishResult {
            shard: shard.map_or(0, |s| u32::from(s.index())),
            result: Some(match r {
                Ok(seq) => pb::publish_result::Result::SequenceId(seq),
                Err(e) => pb::publish_result::Result::Error(rejection(e)),
            }),
        })
        .collect())
}

fn rejection(e: EnvelopeRejection) -> pb::PublishError {
    let code = match e {
        // An envelope over `engine.ingest.max_data_bytes` is invalid
        // for this deployment whatever its state; resending it cannot help.
        EnvelopeRejection::Invalid(_)
        | EnvelopeRejection::DataTooLarge { .. }
        | EnvelopeRejection::SequenceTooFarAhead { .. } => tonic::Code::InvalidArgument,
        EnvelopeRejection::SequenceExhausted => tonic::Code::ResourceExhausted,
        EnvelopeRejection::SequenceNotIncreasing { .. } => tonic::Code::FailedPrecondition,
        // The redirect contract of several nodes (see the proto): publish to the named owner, or retry.
        EnvelopeRejection::OwnedElsewhere { .. }
        | EnvelopeRejection::NoOwner { .. }
        | EnvelopeRejection::LeaseLost { .. } => tonic::Code::Unavailable,
    };
    pb::PublishError { code: code as i32, message: e.to_string() }
}
