use std::sync::Arc;

use fanout_engine::ingest::{EnvelopeInput, EnvelopeRejection, Ingest, MAX_BATCH};
use fanout_proto::v1 as pb;
use pb::publish_service_server::PublishService;
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::publish_stream;
use super::status::{PUBLISH, record_rpc, store_status};

pub struct PublishApi {
    pub ingest: Arc<Ingest>,
    /// Becomes true when the server shuts down: open publish streams end.
    pub shutdown: watch::Receiver<bool>,
}

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
        // Issue 11: an envelope over `engine.ingest.max_data_bytes` is invalid
        // for this deployment whatever its state; resending it cannot help.
        EnvelopeRejection::Invalid(_)
        | EnvelopeRejection::DataTooLarge { .. }
        | EnvelopeRejection::SequenceTooFarAhead { .. } => tonic::Code::InvalidArgument,
        EnvelopeRejection::SequenceExhausted => tonic::Code::ResourceExhausted,
        EnvelopeRejection::SequenceNotIncreasing { .. } => tonic::Code::FailedPrecondition,
        // Issue 7 redirect contract (see the proto): publish to the named owner, or retry.
        EnvelopeRejection::OwnedElsewhere { .. }
        | EnvelopeRejection::NoOwner { .. }
        | EnvelopeRejection::LeaseLost { .. } => tonic::Code::Unavailable,
    };
    pb::PublishError { code: code as i32, message: e.to_string() }
}

#[tonic::async_trait]
impl PublishService for PublishApi {
    async fn publish(&self, request: Request<pb::PublishRequest>) -> Result<Response<pb::PublishResponse>, Status> {
        let result = publish_batch(&self.ingest, request.into_inner().envelopes).await;
        record_rpc(&self.ingest.metrics, PUBLISH, &result);
        Ok(Response::new(pb::PublishResponse { results: result? }))
    }

    type PublishStreamStream = ReceiverStream<Result<pb::PublishResponse, Status>>;

    async fn publish_stream(
        &self,
        request: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        let acks = publish_stream::start(self.ingest.clone(), request.into_inner(), self.shutdown.clone());
        Ok(Response::new(acks))
    }
}
