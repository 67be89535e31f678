//! `PublishStream`: a bidirectional stream that answers
//! each batch with its own acknowledgement as soon as it is stored.
//!
//! One task per stream reads a batch, stores it to the end (never
//! cancelled: cutting a store call short would lose the acknowledgement of
//! a batch that may be stored), queues its acknowledgement, and only then
//! reads the next batch. So acknowledgements leave in request order, and
//! every stored batch's acknowledgement is queued ahead of whatever ends
//! the stream.
//!
//! Bounded everywhere: at most `ACKS_AHEAD` acknowledgements wait for the
//! client; while they do, no batch is read, and HTTP/2 flow control holds
//! the client's further batches in its own buffers. A decoded batch is at
//! most `server.grpc_max_message_bytes`.
//!
//! Liveness, not age: nothing times the stream or the gap between batches
//! (the 30 s server deadline ends when the response starts, here at once).
//! A client that vanished stops answering the server's HTTP/2 keepalive
//! pings and its connection is closed, which ends this task. A batch takes
//! as long as its store call, which bounds itself (ScyllaDB: the request
//! timeout per statement and bounded LWT retries; redb: a local write).

use std::sync::Arc;

use fanout_engine::ingest::Ingest;
use fanout_proto::v1 as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::batch::publish_batch;
use super::reroute::Forwarding;
use super::status::{PUBLISH_STREAM, record_rpc};

/// Acknowledgements that may wait for the client to read them.
const ACKS_AHEAD: usize = 4;

type Ack = Result<pb::PublishResponse, Status>;

/// Starts the stream's task; its acknowledgements are the response stream.
pub fn start(
    ingest: Arc<Ingest>,
    batches: Streaming<pb::PublishRequest>,
    forwarding: Option<Forwarding>,
    shutdown: watch::Receiver<bool>,
) -> ReceiverStream<Ack> {
    let (acks, rx) = mpsc::channel(ACKS_AHEAD);
    tokio::spawn(async move {
        let outcome = run(&ingest, batches, forwarding.as_ref(), &acks, shutdown).await;
        record_rpc(&ingest.metrics, PUBLISH_STREAM, &outcome);
        if let Err(status) = outcome {
            // After every acknowledgement queued before it; a client that
            // is gone does not need it.
            let _ = acks.send(Err(status)).await;
        }
    });
    ReceiverStream::new(rx)
}

/// `Ok` when the client closed its side and every acknowledgement is
/// queued; otherwise the status that ends the stream.
async fn run(
    ingest: &Ingest,
    mut batches: Streaming<pb::PublishRequest>,
    forwarding: Option<&Forwarding>,
    acks: &mpsc::Sender<Ack>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), Status> {
    loop {
        // Between batches only: a batch being stored is never abandoned.
        let next = tokio::select! {
            biased;
            // Every batch stored so far has its acknowledgement queued
            // ahead of this end, and none after them was read: the end
            // says so in its details (`SHUTTING_DOWN`, not stored), so a
            // client tells it from a failed store, whose outcome is unknown.
            _ = shutdown.wait_for(|stopping| *stopping) => {
                return Err(fanout_proto::routing::shutting_down(
                    "the server is shutting down; publish the batches sent after the last response again",
                ));
            }
            _ = acks.closed() => return Err(Status::cancelled("the client closed the stream")),
            next = batches.next() => next,
        };
        let batch = match next {
            None => return Ok(()),
            // A message over server.grpc_max_message_bytes, a broken
            // connection, a client that cancelled.
            Some(Err(status)) => return Err(status),
            Some(Ok(batch)) => batch,
        };
        // Forwards of the batch end by `timeout_ms`; the local append is never cut.
        let results = publish_batch(ingest, batch.envelopes, forwarding).await?;
        if acks.send(Ok(pb::PublishResponse { results })).await.is_err() {
            return Err(Status::cancelled("the client closed the stream"));
        }
    }
}
