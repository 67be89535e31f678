use std::sync::Arc;

use fanout_engine::ingest::Ingest;
use fanout_proto::v1 as pb;
use pb::publish_service_server::PublishService;
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::batch::publish_batch;
use super::call::CallDeadline;
use super::publish_stream;
use super::reroute::Forwarding;
use super::status::{GET_SHARD_MAP, PUBLISH, record_rpc, store_status};
use crate::forward::{FORWARDED, Forwarder};

pub struct PublishApi {
    pub ingest: Arc<Ingest>,
    /// Becomes true when the server shuts down: open publish streams end.
    pub shutdown: watch::Receiver<bool>,
    /// Sends envelopes of other nodes' shards on to their owner; `None`:
    /// forwarding is off and they are answered with the owner.
    pub forwarder: Option<Arc<Forwarder>>,
}

impl PublishApi {
    /// How a call's batches may forward: never for a call that was itself
    /// forwarded here.
    fn forwarding<T>(&self, request: &Request<T>) -> Option<Forwarding> {
        let metadata = request.metadata();
        if metadata.contains_key(FORWARDED) {
            return None;
        }
        Some(Forwarding {
            forwarder: self.forwarder.clone()?,
            call_deadline: request.extensions().get::<CallDeadline>().map(|d| d.0),
            authorization: metadata.get("authorization").cloned(),
        })
    }
}

#[tonic::async_trait]
impl PublishService for PublishApi {
    async fn publish(&self, request: Request<pb::PublishRequest>) -> Result<Response<pb::PublishResponse>, Status> {
        let forwarding = self.forwarding(&request);
        let result = publish_batch(&self.ingest, request.into_inner().envelopes, forwarding.as_ref()).await;
        record_rpc(&self.ingest.metrics, PUBLISH, &result);
        Ok(Response::new(pb::PublishResponse { results: result? }))
    }

    type PublishStreamStream = ReceiverStream<Result<pb::PublishResponse, Status>>;

    async fn publish_stream(
        &self,
        request: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        // A stream's batches have no deadline of their own: each forward has `timeout_ms`.
        let forwarding = self.forwarding(&request).map(|f| Forwarding { call_deadline: None, ..f });
        let acks = publish_stream::start(self.ingest.clone(), request.into_inner(), forwarding, self.shutdown.clone());
        Ok(Response::new(acks))
    }

    async fn get_shard_map(&self, _: Request<pb::GetShardMapRequest>) -> Result<Response<pb::ShardMap>, Status> {
        let result = self.ingest.shard_map().await.map_err(store_status).map(|owners| pb::ShardMap {
            shard_count: u32::from(self.ingest.shard_count),
            owners: (0u32..)
                .zip(owners)
                .map(|(shard, address)| pb::ShardOwner { shard, address: address.unwrap_or_default() })
                .collect(),
        });
        record_rpc(&self.ingest.metrics, GET_SHARD_MAP, &result);
        result.map(Response::new)
    }
}
