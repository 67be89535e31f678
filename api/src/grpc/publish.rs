use std::sync::Arc;

use fanout_engine::ingest::Ingest;
use fanout_proto::v1 as pb;
use pb::publish_service_server::PublishService;
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::batch::publish_batch;
use super::publish_stream;
use super::status::{PUBLISH, record_rpc};

pub struct PublishApi {
    pub ingest: Arc<Ingest>,
    /// Becomes true when the server shuts down: open publish streams end.
    pub shutdown: watch::Receiver<bool>,
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
