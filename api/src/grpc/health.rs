//! `grpc.health.v1.Health` for a node that stops: tonic-health's service,
//! whose Watch streams end when the node begins to stop, each with a last
//! NOT_SERVING. An open watch (a load balancer's, a sidecar's) would
//! otherwise be a call in progress for the whole stop, holding the wait for
//! calls in progress (`server.drain_timeout_seconds`) to its bound.

use std::pin::Pin;

use futures::{Stream, StreamExt, stream};
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

pub struct StoppingHealth<H> {
    inner: H,
    /// True once the node stops taking calls.
    stopping: watch::Receiver<bool>,
}

impl<H> StoppingHealth<H> {
    pub fn new(inner: H, stopping: watch::Receiver<bool>) -> Self {
        Self { inner, stopping }
    }
}

type Statuses = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<H: Health> Health for StoppingHealth<H> {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = Statuses;

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let statuses = self.inner.watch(request).await?.into_inner();
        let mut stopping = self.stopping.clone();
        // A node whose stop signal is gone is stopping too.
        let stopped = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        let last = stream::once(async { Ok(HealthCheckResponse { status: ServingStatus::NotServing as i32 }) });
        Ok(Response::new(Box::pin(statuses.take_until(stopped).chain(last))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_ends_with_not_serving_when_the_node_stops() {
        let (reporter, _) = tonic_health::server::health_reporter();
        let (stop, stopping) = watch::channel(false);
        let health = StoppingHealth::new(tonic_health::server::HealthService::from_health_reporter(reporter), stopping);
        let check = health.check(Request::new(HealthCheckRequest { service: String::new() })).await.unwrap();
        assert_eq!(check.into_inner().status, ServingStatus::Serving as i32);
        let mut watch = health.watch(Request::new(HealthCheckRequest { service: String::new() })).await.unwrap();
        let watch = watch.get_mut();
        assert_eq!(watch.next().await.unwrap().unwrap().status, ServingStatus::Serving as i32);
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), watch.next()).await;
        assert!(pending.is_err(), "open while the node serves");
        stop.send(true).unwrap();
        assert_eq!(watch.next().await.unwrap().unwrap().status, ServingStatus::NotServing as i32);
        assert!(watch.next().await.is_none(), "and ended");
        let late = health.watch(Request::new(HealthCheckRequest { service: String::new() })).await.unwrap();
        let statuses: Vec<i32> = late.into_inner().map(|s| s.unwrap().status).collect().await;
        assert_eq!(statuses.last(), Some(&(ServingStatus::NotServing as i32)), "a watch begun during the stop ends");
    }
}
