//! The ops listener (`server.http_listen`): /metrics (Prometheus text),
//! /healthz, /readyz. Product endpoints live on the API listener (`rest.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use fanout_engine::Readiness;
use fanout_engine::metrics::Metrics;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
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
            let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

async fn route(state: HttpState, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let response = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => text(StatusCode::OK, state.metrics.render()).map(|mut r| {
            r.headers_mut()
                .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; version=0.0.4"));
            r
        }),
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n".into()),
        (&Method::GET, "/readyz") => match state.readiness.check().await {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(not_ready) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{not_ready}\n")),
        },
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
