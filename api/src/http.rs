//! The HTTP endpoints: /metrics (Prometheus text), /healthz, /readyz.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fanout_engine::dispatch::OwnedShards;
use fanout_engine::domain::ShardId;
use fanout_engine::metrics::Metrics;
use fanout_engine::store::Store;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A readiness probe must answer quickly even when the store hangs.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub store: Arc<dyn Store>,
    /// Several nodes (issue 7): this node's shards; `None` on a single node.
    pub ownership: Option<watch::Receiver<OwnedShards>>,
}

pub async fn serve(listener: TcpListener, state: HttpState, mut shutdown: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| route(state.clone(), req));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn route(state: HttpState, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let response = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => text(StatusCode::OK, state.metrics.render())
            .map(|mut r| {
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                r
            }),
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n".into()),
        (&Method::GET, "/readyz") => {
            // Ready when the store answers and, with several nodes (issue 7),
            // this node owns a shard or has finished a lease round.
            let leasing = state.ownership.as_ref().map(|o| {
                let o = o.borrow();
                o.settled || !o.shards.is_empty()
            });
            match tokio::time::timeout(READY_TIMEOUT, state.store.shard_position(ShardId(0))).await {
                Ok(Ok(_)) if leasing == Some(false) => {
                    text(StatusCode::SERVICE_UNAVAILABLE, "shard leases not settled yet\n".into())
                }
                Ok(Ok(_)) => text(StatusCode::OK, "ready\n".into()),
                _ => text(StatusCode::SERVICE_UNAVAILABLE, "store unreachable\n".into()),
            }
        }
        _ => problem(StatusCode::NOT_FOUND, "no such endpoint"),
    };
    Ok(response.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}

fn text(status: StatusCode, body: String) -> http::Result<Response<Full<Bytes>>> {
    Response::builder().status(status).body(Full::new(Bytes::from(body)))
}

/// An RFC 9457 problem body.
fn problem(status: StatusCode, title: &str) -> http::Result<Response<Full<Bytes>>> {
    let body = serde_json_like_problem(status.as_u16(), title);
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/problem+json")
        .body(Full::new(Bytes::from(body)))
}

fn serde_json_like_problem(status: u16, title: &str) -> String {
    format!(r#"{{"type":"about:blank","title":"{title}","status":{status}}}"#)
}

pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen for HTTP on {addr}: {e}"))
}
