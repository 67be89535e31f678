//! One publish batch, as `Publish` and `PublishStream` both store it: proto
//! envelopes in, one result per envelope out. The envelopes of shards this
//! node holds are stored here; the others go to their owner (`reroute`:
//! forwarded, one request per owner, and routed again while the owner
//! moves) while the local append runs, and their results are put back in
//! their places.

use fanout_engine::ingest::{Ingest, MAX_BATCH};
use fanout_proto::v1 as pb;
use tonic::Status;

use super::answer::{input, result};
use super::reroute::{self, Forwarding};
use super::status::store_status;

/// Stores one batch: one result per envelope, in order. `Err` refuses the
/// batch as a whole (too many envelopes, storage failed).
pub(super) async fn publish_batch(
    ingest: &Ingest,
    envelopes: Vec<pb::Envelope>,
    forwarding: Option<&Forwarding>,
) -> Result<Vec<pb::PublishResult>, Status> {
    if envelopes.len() > MAX_BATCH {
        return Err(Status::invalid_argument(format!("a publish request carries at most {MAX_BATCH} envelopes")));
    }
    let mut routed = ingest.route(envelopes.into_iter().map(input).collect()).await.map_err(store_status)?;
    let Some(forwarding) = forwarding.filter(|_| !routed.elsewhere.is_empty()) else {
        let results = ingest.store(routed).await.map_err(store_status)?;
        return Ok(results.into_iter().map(result).collect());
    };
    let elsewhere = std::mem::take(&mut routed.elsewhere);
    let deadline = forwarding.forwarder.deadline(forwarding.call_deadline);
    // The local append is never cut short; the others end by the deadline.
    let (stored, placed) = tokio::join!(ingest.store(routed), reroute::place(ingest, forwarding, elsewhere, deadline));
    let mut results: Vec<pb::PublishResult> = stored.map_err(store_status)?.into_iter().map(result).collect();
    for (index, answer) in placed {
        results[index] = answer;
    }
    Ok(results)
}
