//! A node that is stopping (SIGTERM) answers every call it took and
//! refuses the rest in a way that proves they were never processed (a
//! refused connection, a stream above its GOAWAY, a call the client never
//! sent): no call is cut with an outcome nobody can know. Publishers can
//! then send what was refused to another node, as a load balancer does,
//! without storing anything twice.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fanout_proto::routing::{never_processed, refused};
use fanout_proto::v1 as pb;
use fanout_tests::client::{envelope, group_topic};
use fanout_tests::{EngineConfig, Fanout};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

const PUBLISH: &str = "/fanout.v1.PublishService/Publish";

/// A request body sent when the test says: the call is open (its HEADERS
/// are in) while its message has not come yet.
type HeldBody = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

fn publish_message(topic: &[u8]) -> Bytes {
    let request = pb::PublishRequest { envelopes: vec![envelope(topic, pb::EnvelopeKind::Application, true)] };
    let message = request.encode_to_vec();
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    Bytes::from(frame)
}

fn publish_request(body: HeldBody) -> http::Request<HeldBody> {
    http::Request::post(format!("http://127.0.0.1{PUBLISH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap()
}

/// What a call over a raw HTTP/2 connection came to.
enum Outcome {
    /// Answered: grpc-status 0 and the envelope's sequence id.
    Stored(u64),
    /// Never processed (refused by GOAWAY, never sent).
    Refused,
    /// Anything else: an error nobody can tell the outcome of.
    Cut(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Stored(sequence_id) => write!(f, "stored as {sequence_id}"),
            Outcome::Refused => write!(f, "refused, never processed"),
            Outcome::Cut(error) => write!(f, "cut: {error}"),
        }
    }
}

async fn outcome(response: Result<http::Response<hyper::body::Incoming>, hyper::Error>) -> Outcome {
    let response = match response {
        Ok(r) => r,
        Err(e) if refused(&e) || std::error::Error::source(&e).is_some_and(refused) => return Outcome::Refused,
        Err(e) => return Outcome::Cut(format!("{e:?}")),
    };
    let collected = match response.into_body().collect().await {
        Ok(c) => c,
        Err(e) => return Outcome::Cut(format!("the answer broke off: {e:?}")),
    };
    let status = collected.trailers().and_then(|t| t.get("grpc-status")).map(|v| v.to_str().unwrap().to_owned());
    if status.as_deref() != Some("0") {
        return Outcome::Cut(format!("grpc-status {status:?}"));
    }
    let body = collected.to_bytes();
    let answer = pb::PublishResponse::decode(&body[5..]).expect("a PublishResponse");
    match answer.results[0].result {
        Some(pb::publish_result::Result::SequenceId(s)) => Outcome::Stored(s),
        ref other => Outcome::Cut(format!("not stored: {other:?}")),
    }
}

/// Sends SIGTERM, and waits until the gRPC port refuses connections: the
/// node has stopped taking calls (and told its connections so).
async fn sigterm_until_closed(fanout: &Fanout) {
    let pid = fanout.pid().expect("running");
    std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill -TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(fanout.grpc).await.is_ok() {
        assert!(Instant::now() < deadline, "the gRPC port still open 20 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The connections are told once the port is closed.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// An HTTP/2 connection to `address`, as hyper's client makes it (its
/// task spawned); the handshake does not wait for the server.
async fn http2(stream: TcpStream) -> hyper::client::conn::http2::SendRequest<HeldBody> {
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(connection);
    sender
}

/// A Publish of one envelope of `topic`, its message sent at once and its
/// body left open when `held` (until the returned sender is dropped); the
/// call's outcome once it ends.
fn publish_call(
    sender: &mut hyper::client::conn::http2::SendRequest<HeldBody>,
    topic: &[u8],
    held: bool,
) -> (Option<mpsc::Sender<Result<Frame<Bytes>, Infallible>>>, tokio::task::JoinHandle<Outcome>) {
    let (message, body) = mpsc::channel(1);
    message.try_send(Ok(Frame::data(publish_message(topic)))).unwrap();
    let call = sender.send_request(publish_request(StreamBody::new(ReceiverStream::new(body))));
    let open = tokio::spawn(async move { outcome(call.await).await });
    // Dropping the sender ends the body after the message.
    (held.then_some(message), open)
}

/// Calls that began before the stop and went on after it, each answered:
/// one whose message came after the GOAWAY; one on a connection that was
/// accepted but silent until after it; one sent whole on a connection the
/// node had not taken yet (its listener at its connection cap, the
/// connection in the kernel's backlog when the port closed).
#[tokio::test]
async fn calls_begun_before_a_stop_are_answered_after_it() {
    let config = EngineConfig {
        env: vec![
            ("FANOUT__SERVER__FIRST_REQUEST_TIMEOUT_SECONDS".into(), "20".into()),
            ("FANOUT__SERVER__MAX_CONNECTIONS_PER_LISTENER".into(), "2".into()),
        ],
        ..EngineConfig::default()
    };
    let mut fanout = Fanout::start(config).await.expect("start");
    let topic = group_topic();

    // One connection served (a call answered on it), then a Publish on it
    // whose HEADERS are in and whose message is held back.
    let mut served = http2(TcpStream::connect(fanout.grpc).await.unwrap()).await;
    let (_, first) = publish_call(&mut served, &topic, false);
    let first = first.await.unwrap();
    assert!(matches!(first, Outcome::Stored(_)), "{first}");
    let (message, held) = publish_call(&mut served, &topic, true);
    // The second slot: connected, not a byte sent yet.
    let silent = TcpStream::connect(fanout.grpc).await.unwrap();
    // The third waits in the backlog, its call sent whole, unanswered.
    let mut queued = http2(TcpStream::connect(fanout.grpc).await.unwrap()).await;
    let (_, in_backlog) = publish_call(&mut queued, &topic, false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!in_backlog.is_finished(), "a connection beyond the cap is not served");

    sigterm_until_closed(&fanout).await;

    message.unwrap().send(Ok(Frame::data(Bytes::new()))).await.expect("the call is still open");
    let held = held.await.unwrap();
    let in_backlog = in_backlog.await.unwrap();
    let mut speaking = http2(silent).await;
    let (_, silent) = publish_call(&mut speaking, &topic, false);
    let silent = silent.await.unwrap();
    eprintln!("held call: {held}; queued connection: {in_backlog}; silent connection: {silent}");
    assert!(matches!(held, Outcome::Stored(_)), "the call open across the stop: {held}");
    assert!(matches!(in_backlog, Outcome::Stored(_)), "the call queued before the stop: {in_backlog}");
    assert!(
        matches!(silent, Outcome::Stored(_) | Outcome::Refused),
        "a connection accepted before the stop, silent until after it: {silent}"
    );
    let exit = fanout.stop(Duration::from_secs(30)).await.expect("exits");
    assert!(exit.success(), "exit status {exit}");
}

#[derive(Default, Debug)]
struct Tally {
    stored: u64,
    refused: u64,
    cut: Vec<String>,
}

/// Publishers keep calling a node through its stop, over long-lived
/// connections (which reconnect at once when told GOAWAY) and over a new
/// connection per call: each call is answered or was never processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_to_a_stopping_node_is_answered_or_never_processed() {
    let mut fanout = Fanout::start(EngineConfig::default()).await.expect("start");
    let address = fanout.grpc;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let shared: Vec<_> =
        (0..4).map(|_| Endpoint::from_shared(format!("http://{address}")).unwrap().connect_lazy()).collect();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let publishers: Vec<_> = (0..24usize)
        .map(|p| {
            let (channel, tally, stopped) = (shared[p % shared.len()].clone(), tally.clone(), stopped.clone());
            tokio::spawn(publish_until(address, (p % 6 != 5).then_some(channel), tally, stopped))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let exit = fanout.stop(Duration::from_secs(30)).await.expect("SIGTERM");
    assert!(exit.success(), "exit status {exit}");
    // Calls to the stopped node are refused at connect for a moment more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(true);
    for p in publishers {
        p.await.unwrap();
    }
    let tally = tally.lock().unwrap();
    eprintln!("{} calls stored, {} never processed, {} cut", tally.stored, tally.refused, tally.cut.len());
    assert!(tally.stored > 50, "the publishers kept going: {tally:?}");
    assert!(tally.cut.is_empty(), "{} calls cut: {:#?}", tally.cut.len(), tally.cut);
}

/// Publishes over `channel` (or a new connection per call) until `stopped`.
async fn publish_until(
    address: SocketAddr,
    channel: Option<tonic::transport::Channel>,
    tally: Arc<Mutex<Tally>>,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    let topic = group_topic();
    while !*stopped.borrow() {
        let channel = channel
            .clone()
            .unwrap_or_else(|| Endpoint::from_shared(format!("http://{address}")).unwrap().connect_lazy());
        let mut client = pb::publish_service_client::PublishServiceClient::new(channel);
        let envelopes = (0..20).map(|_| envelope(&topic, pb::EnvelopeKind::Application, true)).collect();
        let mut request = tonic::Request::new(pb::PublishRequest { envelopes });
        request.set_timeout(Duration::from_secs(10));
        let result = client.publish(request).await;
        {
            let mut tally = tally.lock().unwrap();
            match result {
                Ok(_) => tally.stored += 1,
                Err(status) if never_processed(&status) => tally.refused += 1,
                Err(status) => tally.cut.push(format!("{status:?}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An open Health/Watch (a load balancer's) is told NOT_SERVING when the
/// node begins to stop and ends, so it does not hold the stop's wait for
/// calls in progress (here 120 s) to its bound.
#[tokio::test]
async fn an_open_health_watch_ends_with_not_serving_and_does_not_hold_the_stop() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let config = EngineConfig {
        env: vec![("FANOUT__SERVER__DRAIN_TIMEOUT_SECONDS".into(), "120".into())],
        ..EngineConfig::default()
    };
    let mut fanout = Fanout::start(config).await.expect("start");
    let channel = Endpoint::from_shared(format!("http://{}", fanout.grpc)).unwrap().connect().await.unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest { service: "fanout.v1.PublishService".into() })
        .await
        .expect("watch")
        .into_inner();
    let first = watch.message().await.unwrap().expect("the current status");
    assert_eq!(first.status, ServingStatus::Serving as i32);

    // Well inside the 120 s wait: the watch does not hold it.
    let exit = fanout.stop(Duration::from_secs(30)).await.expect("exits");
    assert!(exit.success(), "exit status {exit}");
    let mut statuses = Vec::new();
    while let Ok(Some(status)) = watch.message().await {
        statuses.push(status.status);
    }
    assert_eq!(statuses.last(), Some(&(ServingStatus::NotServing as i32)), "its last word: {statuses:?}");
}
