//! Every listener (gRPC, HTTP, API; plaintext and TLS) bounds a connection's
//! life before its first request and after its last: idle and dripping
//! connections cannot lock a listener out, idle connections are closed
//! gracefully, a busy PublishStream is never cut, and the gRPC listener
//! refuses what is not gRPC before any handler runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fanout_proto::v1 as pb;
use fanout_testkit::issuer::CertIssuer;
use fanout_testkit::launcher;
use fanout_testkit::tls_client;
use fanout_tests::client::{envelope, group_topic};
use fanout_tests::{EngineConfig, Fanout};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::common::quote;

/// The listeners' cap in these tests, and the attackers per listener: more
/// than the cap, fewer than twice it, so a client that connects after them
/// is accepted when the first round of attackers is cut.
const CAP: usize = 8;
const IDLE_ATTACKERS: usize = 8;
const DRIPPING_ATTACKERS: usize = 4;
const FIRST_REQUEST: Duration = Duration::from_secs(2);
/// The bound a normal client is served within under attack.
const SERVED_WITHIN: Duration = Duration::from_secs(3);
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn env(name: &str, value: impl ToString) -> (String, String) {
    (name.to_owned(), value.to_string())
}

fn limited(first_request: Duration, idle: Duration) -> Vec<(String, String)> {
    vec![
        env("FANOUT__SERVER__MAX_CONNECTIONS_PER_LISTENER", CAP),
        env("FANOUT__SERVER__FIRST_REQUEST_TIMEOUT_SECONDS", first_request.as_secs()),
        env("FANOUT__SERVER__IDLE_TIMEOUT_SECONDS", idle.as_secs()),
    ]
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection to `addr`, over TLS when `tls` is given (handshake done).
async fn open(addr: SocketAddr, tls: Option<&Arc<rustls::ClientConfig>>) -> std::io::Result<Box<dyn Io>> {
    Ok(match tls {
        None => Box::new(TcpStream::connect(addr).await?),
        Some(config) => Box::new(tls_client::connect(addr, config.clone()).await?),
    })
}

/// An attacker: connects, then sends nothing (`drip` false) or the HTTP/2
/// preface a byte a second, until the server closes the connection.
/// Answers how long it held the connection, or `None` if never closed.
fn attacker(
    addr: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
    drip: bool,
) -> tokio::task::JoinHandle<Option<Duration>> {
    tokio::spawn(async move {
        let started = Instant::now();
        let held = async {
            let Ok(stream) = open(addr, tls.as_ref()).await else { return };
            let (mut reader, mut writer) = tokio::io::split(stream);
            let dripping = async {
                for byte in PREFACE.iter().take(if drip { PREFACE.len() } else { 0 }) {
                    if writer.write_all(std::slice::from_ref(byte)).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                std::future::pending::<()>().await;
            };
            let mut sink = Vec::new();
            tokio::select! {
                _ = reader.read_to_end(&mut sink) => {}
                () = dripping => {}
            }
        };
        tokio::time::timeout(Duration::from_secs(30), held).await.ok().map(|()| started.elapsed())
    })
}

fn attack(addr: SocketAddr, tls: Option<&Arc<rustls::ClientConfig>>) -> Vec<tokio::task::JoinHandle<Option<Duration>>> {
    let idle = (0..IDLE_ATTACKERS).map(|_| attacker(addr, tls.cloned(), false));
    let dripping = (0..DRIPPING_ATTACKERS).map(|_| attacker(addr, tls.cloned(), true));
    idle.chain(dripping).collect()
}

/// A gRPC health check on a fresh connection.
async fn health_check(addr: SocketAddr, tls: Option<&Arc<rustls::ClientConfig>>) -> anyhow::Result<()> {
    let channel: Channel = match tls {
        None => Endpoint::from_shared(format!("http://{addr}"))?.connect().await?,
        Some(config) => tls_client::grpc_channel(addr, config).await?,
    };
    let status = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await?.into_inner();
    anyhow::ensure!(status.status == 1, "not serving: {status:?}");
    Ok(())
}

/// One HTTP/1.1 request on a fresh connection: the status.
async fn http_status(addr: SocketAddr, path: &str, tls: Option<&Arc<rustls::ClientConfig>>) -> anyhow::Result<u16> {
    Ok(match tls {
        None => launcher::http_request(addr, "GET", path, &[], b"").await?.0,
        Some(config) => tls_client::https_request(addr, config, "GET", path, &[], b"").await?.0,
    })
}

/// `fanout_connections_closed_total{listener, reason}` as the engine exports it.
async fn closed(fanout: &Fanout, listener: &str, reason: &str) -> u64 {
    let (status, text) = fanout.http_get("/metrics").await.expect("/metrics");
    assert_eq!(status, 200, "{text}");
    let series = format!("fanout_connections_closed_total{{listener=\"{listener}\",reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .unwrap_or_else(|| panic!("{series} is not exported"))
        .trim()
        .parse()
        .expect("a counter value")
}

/// Attacks all three listeners at once, then checks that a normal client of
/// each is served within the deadline plus a second, and that every
/// attacker was cut and counted. With TLS, attackers offer both ALPN
/// protocols, so their handshakes succeed on every listener.
async fn attackers_cannot_lock_out(
    fanout: &Fanout,
    tls: Option<(&Arc<rustls::ClientConfig>, &Arc<rustls::ClientConfig>)>,
) {
    let (attacker_tls, tls) = (tls.map(|t| t.0), tls.map(|t| t.1));
    let attackers: Vec<_> =
        [fanout.grpc, fanout.http, fanout.api].into_iter().flat_map(|a| attack(a, attacker_tls)).collect();
    // Let every attacker connect before the normal clients do.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let timed = |work: std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>| async move {
        let started = Instant::now();
        let answer = tokio::time::timeout(SERVED_WITHIN, work).await;
        (answer, started.elapsed())
    };
    let (grpc, http, api) = tokio::join!(
        timed(Box::pin(health_check(fanout.grpc, tls))),
        timed(Box::pin(async {
            let status = http_status(fanout.http, "/healthz", tls).await?;
            anyhow::ensure!(status == 200, "/healthz answered {status}");
            Ok(())
        })),
        timed(Box::pin(async {
            let status = http_status(fanout.api, "/nowhere", tls).await?;
            anyhow::ensure!(status == 404, "the API answered {status}");
            Ok(())
        })),
    );
    for (listener, (answer, took)) in [("grpc", grpc), ("http", http), ("api", api)] {
        match answer {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{listener}: {e:#} after {took:?}"),
            Err(_) => panic!("{listener}: not served within {SERVED_WITHIN:?} under attack"),
        }
    }
    for attacker in attackers {
        let held = attacker.await.unwrap().expect("an attacker's connection was never closed");
        // Cut at the first-request deadline, counted from accept: one round
        // of the cap, then the rest.
        assert!(held < FIRST_REQUEST * 2 + Duration::from_secs(2), "held {held:?}");
    }
    for listener in ["grpc", "http", "api"] {
        let cut = closed(fanout, listener, "first_request_timeout").await;
        assert!(cut >= (IDLE_ATTACKERS + DRIPPING_ATTACKERS) as u64, "{listener}: {cut} counted");
    }
}

#[tokio::test]
async fn idle_and_dripping_connections_cannot_lock_out_any_listener() {
    let config = EngineConfig { env: limited(FIRST_REQUEST, Duration::from_secs(60)), ..EngineConfig::default() };
    let fanout = Fanout::start(config).await.expect("start");
    attackers_cannot_lock_out(&fanout, None).await;
}

#[tokio::test]
async fn over_tls_a_client_that_handshakes_and_says_nothing_is_cut_on_every_listener() {
    let ca = CertIssuer::new("fanout listeners CA").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.server("fanout listeners server").unwrap().write(dir.path(), "server").unwrap();
    let tables = format!("[server.tls]\ncert_file = {}\nkey_file = {}\n\n", quote(&cert), quote(&key));
    let http1 = ca.client_config(&[b"http/1.1"], None).unwrap();
    let config = EngineConfig {
        extra_tables: tables,
        tls: Some(http1.clone()),
        env: limited(FIRST_REQUEST, Duration::from_secs(60)),
        ..EngineConfig::default()
    };
    let fanout = Fanout::start(config).await.expect("start");
    let any_alpn = ca.client_config(&[b"h2", b"http/1.1"], None).unwrap();
    attackers_cannot_lock_out(&fanout, Some((&any_alpn, &http1))).await;
}

/// An HTTP/2 connection with prior knowledge, as hyper's client makes it:
/// the sender, and the connection's end (`Ok` when the server closed it
/// gracefully, with GOAWAY).
async fn http2(
    addr: SocketAddr,
) -> (hyper::client::conn::http2::SendRequest<Full<Bytes>>, tokio::task::JoinHandle<Result<(), hyper::Error>>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await.expect("HTTP/2 handshake");
    (sender, tokio::spawn(connection))
}

/// A gRPC frame: uncompressed, with its length.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

fn grpc_post(path: &str, content_type: &str, body: Bytes) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://127.0.0.1{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(Full::new(body))
        .unwrap()
}

#[tokio::test]
async fn connections_without_an_open_request_are_closed_gracefully_and_busy_streams_stay() {
    let idle = Duration::from_secs(2);
    let config = EngineConfig { env: limited(Duration::from_secs(10), idle), ..EngineConfig::default() };
    let fanout = Fanout::start(config).await.expect("start");

    // HTTP/2 on the gRPC listener: one call, then nothing. The server says
    // GOAWAY once the connection has had no stream open for the idle time.
    let (mut sender, connection) = http2(fanout.grpc).await;
    let response = sender
        .send_request(grpc_post("/grpc.health.v1.Health/Check", "application/grpc", grpc_frame(&[])))
        .await
        .expect("a health check");
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.expect("the whole answer");
    let answered = Instant::now();
    let ended = tokio::time::timeout(idle + Duration::from_secs(5), connection).await.expect("closed for idleness");
    ended.unwrap().expect("closed gracefully (GOAWAY), not reset");
    assert!(answered.elapsed() >= idle - Duration::from_millis(500), "closed after {:?}", answered.elapsed());

    // HTTP/1.1 keep-alive on the API listener: closed the same way.
    let mut tcp = TcpStream::connect(fanout.api).await.unwrap();
    tcp.write_all(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(idle + Duration::from_secs(5), tcp.read_to_end(&mut answer)).await;
    read.expect("closed for idleness").expect("a clean close");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 404"), "{}", String::from_utf8_lossy(&answer));

    // A PublishStream that keeps publishing for three idle times is never
    // cut, nor its connection.
    let mut publisher = fanout.publisher().await.expect("publisher");
    let (batches, rx) = mpsc::channel(4);
    let mut acks = publisher.publish_stream(ReceiverStream::new(rx)).await.expect("open the stream").into_inner();
    let topic = group_topic();
    for _ in 0..12 {
        let envelopes = vec![envelope(&topic, pb::EnvelopeKind::Application, true)];
        batches.send(pb::PublishRequest { envelopes }).await.expect("the stream takes a batch");
        let ack = tokio::time::timeout(Duration::from_secs(10), acks.message()).await.expect("an ack in time");
        assert_eq!(ack.expect("no error").expect("the stream is open").results.len(), 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(batches);

    assert!(closed(&fanout, "grpc", "idle_timeout").await >= 1);
    assert!(closed(&fanout, "api", "idle_timeout").await >= 1);
}

#[tokio::test]
async fn the_grpc_listener_refuses_what_is_not_grpc_and_names_decode_errors() {
    let fanout = Fanout::start(EngineConfig::default()).await.expect("start");
    let (mut sender, _connection) = http2(fanout.grpc).await;
    let publish = pb::PublishRequest { envelopes: vec![envelope(&group_topic(), pb::EnvelopeKind::Application, true)] };
    let encoded = message_of(&publish);

    // gRPC over HTTP/2: a content type that is not gRPC is answered 415
    // before any handler runs, whatever the body holds.
    for content_type in ["application/json", "application/grpc+json", "text/plain"] {
        let request = grpc_post("/fanout.v1.PublishService/Publish", content_type, grpc_frame(&encoded));
        let response = sender.send_request(request).await.expect("an answer");
        assert_eq!(response.status(), 415, "{content_type}");
    }
    let stored_before = published(&fanout).await;

    // A message that does not decode: INVALID_ARGUMENT, naming the error.
    let garbage = [0x0a, 0xff, 0xff];
    let request = grpc_post("/fanout.v1.PublishService/Publish", "application/grpc", grpc_frame(&garbage));
    let response = sender.send_request(request).await.expect("an answer");
    assert_eq!(response.status(), 200);
    let (parts, body) = response.into_parts();
    let trailers = body.collect().await.expect("the answer").trailers().cloned();
    let status = parts.headers.get("grpc-status").or_else(|| trailers.as_ref().and_then(|t| t.get("grpc-status")));
    let message = parts.headers.get("grpc-message").or_else(|| trailers.as_ref().and_then(|t| t.get("grpc-message")));
    assert_eq!(status.map(|v| v.to_str().unwrap()), Some("3"), "{parts:?} {trailers:?}");
    let message = message.map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    assert!(message.contains("does%20not%20decode") || message.contains("does not decode"), "{message}");

    // The same request as gRPC is stored: the refusals above changed nothing.
    let request = grpc_post("/fanout.v1.PublishService/Publish", "application/grpc+proto", grpc_frame(&encoded));
    let response = sender.send_request(request).await.expect("an answer");
    let (parts, body) = response.into_parts();
    let trailers = body.collect().await.expect("the answer").trailers().cloned();
    let status = trailers.as_ref().and_then(|t| t.get("grpc-status")).or(parts.headers.get("grpc-status"));
    assert_eq!(status.map(|v| v.to_str().unwrap()), Some("0"), "{parts:?} {trailers:?}");
    assert_eq!(published(&fanout).await, stored_before + 1);
}

fn message_of(publish: &pb::PublishRequest) -> Vec<u8> {
    prost::Message::encode_to_vec(publish)
}

/// `fanout_envelopes_published_total{result="stored"}`.
async fn published(fanout: &Fanout) -> u64 {
    let (_, text) = fanout.http_get("/metrics").await.expect("/metrics");
    text.lines()
        .find_map(|line| line.strip_prefix("fanout_envelopes_published_total{result=\"stored\"} "))
        .map_or(0, |v| v.trim().parse().expect("a counter value"))
}

#[tokio::test]
async fn a_request_whose_body_drips_is_answered_408_and_its_connection_closed() {
    let mut env = limited(Duration::from_secs(10), Duration::from_secs(60));
    env.push(("FANOUT__SERVER__HTTP_REQUEST_TIMEOUT_SECONDS".into(), "2".into()));
    let fanout = Fanout::start(EngineConfig { env, ..EngineConfig::default() }).await.expect("start");
    // A complete head, then a body that never comes: the request is open,
    // so only the request deadline bounds it.
    let mut tcp = TcpStream::connect(fanout.api).await.unwrap();
    tcp.write_all(b"PUT /v2/push/registration HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer)).await;
    read.expect("answered and closed within the deadline").expect("a clean close");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json") && answer.contains("http_request_timeout_seconds"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(1500), "answered after {:?}", started.elapsed());
}
