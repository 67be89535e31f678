//! Security end to end: TLS on every listener, roles per service by bearer
//! token and by client certificate (mTLS), certificates and tokens reloaded
//! on SIGHUP without dropping open connections, the unsafe configurations
//! that refuse to start, and the connection and header-read limits. The
//! clients are rustls and tonic over our own connector, checking the
//! engine's certificate against a CA made here.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_proto::v1::notification_service_client::NotificationServiceClient;
use fanout_proto::v1::publish_service_client::PublishServiceClient;
use fanout_testkit::issuer::{CertIssuer, Issued};
use fanout_testkit::tls_client::{grpc_channel, https_request};
use fanout_tests::client::{Recipient, envelope, group_topic};
use fanout_tests::{EngineConfig, Fanout, fanout_binary};

use crate::common::quote;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::{Code, Request};

const PUBLISHER_TOKEN: &str = "publisher-token-0123456789abcdef0123456789";
const OPERATOR_TOKEN: &str = "operator-token-0123456789abcdef0123456789ab";
const PUBLISHER_URI: &str = "spiffe://fanout.test/ns/chat/sa/publisher";

fn hash_line(token: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(token.as_bytes())))
}

struct Secure {
    fanout: Fanout,
    ca: CertIssuer,
    dir: tempfile::TempDir,
}

impl Secure {
    /// A client configuration trusting the engine's CA, optionally with a
    /// client certificate.
    fn client(&self, identity: Option<&Issued>) -> Arc<rustls::ClientConfig> {
        self.ca.client_config(&[b"h2"], identity).unwrap()
    }

    async fn channel(&self, identity: Option<&Issued>) -> Channel {
        grpc_channel(self.fanout.grpc, &self.client(identity)).await.expect("TLS gRPC channel")
    }
}

/// An engine whose three listeners speak TLS, verifying client certificates
/// of the same CA, with publisher and operator token files and one
/// certificate identity granted the publisher role.
async fn secure() -> Secure {
    let ca = CertIssuer::new("fanout e2e CA").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.server("fanout e2e server").unwrap().write(dir.path(), "server").unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.ca_pem()).unwrap();
    let publishers = dir.path().join("publisher.tokens");
    std::fs::write(&publishers, format!("# CI publisher\n{} ci\n", hash_line(PUBLISHER_TOKEN))).unwrap();
    let operators = dir.path().join("operator.tokens");
    std::fs::write(&operators, hash_line(OPERATOR_TOKEN)).unwrap();
    let tables = format!(
        "[server.tls]\ncert_file = {}\nkey_file = {}\nclient_ca_file = {}\nreload_interval_seconds = 1\n\n\
         [server.auth]\ntoken_files = {{ publisher = {}, operator = {} }}\n\
         certificate_identities = {{ publisher = [\"uri:{PUBLISHER_URI}\"] }}\n\n",
        quote(&cert),
        quote(&key),
        quote(&ca_file),
        quote(&publishers),
        quote(&operators),
    );
    let tls = Some(ca.client_config(&[b"http/1.1"], None).unwrap());
    let fanout =
        Fanout::start(EngineConfig { extra_tables: tables, tls, ..EngineConfig::default() }).await.expect("start");
    Secure { fanout, ca, dir }
}

fn publish_request(token: Option<&str>, topic: &[u8]) -> Request<pb::PublishRequest> {
    let mut request =
        Request::new(pb::PublishRequest { envelopes: vec![envelope(topic, pb::EnvelopeKind::Application, true)] });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

fn sequence_ids(response: pb::PublishResponse) -> Vec<u64> {
    response
        .results
        .into_iter()
        .map(|r| match r.result {
            Some(pb::publish_result::Result::SequenceId(s)) => s,
            other => panic!("not stored: {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn each_grpc_service_takes_its_own_role_over_tls() {
    let s = secure().await;
    let topic = group_topic();
    let mut anonymous = PublishServiceClient::new(s.channel(None).await);

    // Refused calls change nothing: the first accepted publish of the topic
    // still gets its shard's first sequence id.
    let refused = anonymous.publish(publish_request(None, &topic)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let refused = anonymous.publish(publish_request(Some("a-token-nobody-issued"), &topic)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    let refused = anonymous.publish(publish_request(Some(OPERATOR_TOKEN), &topic)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("publisher role"), "{}", refused.message());
    let first = anonymous.publish(publish_request(Some(PUBLISHER_TOKEN), &topic)).await.expect("publisher token");
    assert_eq!(sequence_ids(first.into_inner()), [1], "the refused calls stored nothing");

    // mTLS: the certificate's SAN URI grants the publisher role, no token.
    let publisher_cert = s.ca.client("publisher", &[PUBLISHER_URI]).unwrap();
    let mut by_certificate = PublishServiceClient::new(s.channel(Some(&publisher_cert)).await);
    let second = by_certificate.publish(publish_request(None, &topic)).await.expect("publisher certificate");
    assert_eq!(sequence_ids(second.into_inner()), [2]);
    // A verified certificate nobody granted a role: unauthenticated.
    let stranger = s.ca.client("stranger", &["spiffe://fanout.test/ns/other/sa/x"]).unwrap();
    let mut by_stranger = PublishServiceClient::new(s.channel(Some(&stranger)).await);
    assert_eq!(by_stranger.publish(publish_request(None, &topic)).await.unwrap_err().code(), Code::Unauthenticated);

    // NotificationService: no role needed by default (the recipient secret
    // is spec 000's authentication): the call reaches the service.
    let mut notifications = NotificationServiceClient::new(s.channel(None).await);
    let missing = notifications.unregister(Recipient::random().unregister()).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");

    // Reflection is the operator's; health stays open.
    let mut health = tonic_health::pb::health_client::HealthClient::new(s.channel(None).await);
    let serving = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
    assert_eq!(serving.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    assert_eq!(list_services(s.channel(None).await, None).await.unwrap_err().code(), Code::Unauthenticated);
    assert_eq!(
        list_services(s.channel(None).await, Some(PUBLISHER_TOKEN)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let services = list_services(s.channel(None).await, Some(OPERATOR_TOKEN)).await.expect("operator");
    assert!(services.iter().any(|n| n == "fanout.v1.PublishService"), "{services:?}");

    // Plaintext to a TLS listener gets no gRPC answer.
    let plain = Channel::from_shared(format!("http://{}", s.fanout.grpc)).unwrap().connect().await;
    if let Ok(channel) = plain {
        let refused = PublishServiceClient::new(channel).publish(publish_request(Some(PUBLISHER_TOKEN), &topic)).await;
        assert!(refused.is_err(), "a plaintext call was answered");
    }
    // No token appears in the log.
    let log = s.fanout.log();
    assert!(!log.contains(PUBLISHER_TOKEN) && !log.contains(OPERATOR_TOKEN), "a token reached the log");
}

async fn list_services(channel: Channel, token: Option<&str>) -> Result<Vec<String>, tonic::Status> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut request = Request::new(tokio_stream::once(request));
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let mut stream = ServerReflectionClient::new(channel).server_reflection_info(request).await?.into_inner();
    match stream.message().await?.and_then(|r| r.message_response) {
        Some(MessageResponse::ListServicesResponse(list)) => Ok(list.service.into_iter().map(|s| s.name).collect()),
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

#[tokio::test]
async fn metrics_need_the_operator_and_probes_stay_open() {
    let s = secure().await;
    let tls = s.ca.client_config(&[b"http/1.1"], None).unwrap();
    let get = async |path: &str, token: Option<&str>| {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
        https_request(s.fanout.http, &tls, "GET", path, &headers, b"").await.expect("HTTPS request")
    };
    assert_eq!(get("/metrics", None).await.0, 401);
    assert_eq!(get("/metrics", Some(PUBLISHER_TOKEN)).await.0, 403);
    let (status, body) = get("/metrics", Some(OPERATOR_TOKEN)).await;
    assert_eq!(status, 200);
    assert!(body.contains("fanout_"), "{body}");
    // A recipient's delivery history is the operator's too.
    let history = format!("/admin/recipients/{}/deliveries", "ab".repeat(32));
    assert_eq!(get(&history, None).await.0, 401);
    assert_eq!(get(&history, Some(PUBLISHER_TOKEN)).await.0, 403);
    let (status, body) = get(&history, Some(OPERATOR_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"attempts\":[]"), "nothing sent to that recipient on this node: {body}");
    assert_eq!(get("/healthz", None).await, (200, "ok\n".to_owned()));
    assert_eq!(get("/readyz", None).await, (200, "ready\n".to_owned()));
    // The operator's client certificate works as well as its token... when
    // granted: this one is the publisher's, so /metrics stays closed to it.
    let publisher_cert = s.ca.client("publisher", &[PUBLISHER_URI]).unwrap();
    let with_cert = s.ca.client_config(&[b"http/1.1"], Some(&publisher_cert)).unwrap();
    let (status, _) = https_request(s.fanout.http, &with_cert, "GET", "/metrics", &[], b"").await.unwrap();
    assert_eq!(status, 403);
    // The API listener speaks TLS too.
    let (status, _) = https_request(s.fanout.api, &tls, "GET", "/nowhere", &[], b"").await.unwrap();
    assert_eq!(status, 404);
    // Plain HTTP to a TLS listener gets no HTTP answer.
    assert!(fanout_testkit::launcher::http_get(s.fanout.http, "/healthz").await.is_err());
}

#[tokio::test]
async fn certificates_and_tokens_reload_and_open_connections_stay() {
    let s = secure().await;
    let topic = group_topic();
    let mut open = PublishServiceClient::new(s.channel(None).await);
    open.publish(publish_request(Some(PUBLISHER_TOKEN), &topic)).await.expect("before the rotation");

    // A new CA's certificate replaces the server's: new connections must
    // trust the new CA, the open connection goes on.
    let next = CertIssuer::new("fanout e2e CA 2").unwrap();
    next.server("fanout e2e server 2").unwrap().write(s.dir.path(), "server").unwrap();
    let client_ca = s.dir.path().join("ca.crt");
    std::fs::write(&client_ca, format!("{}{}", s.ca.ca_pem(), next.ca_pem())).unwrap();
    signal_hangup(&s.fanout);
    let next_client = next.client_config(&[b"h2"], None).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let channel = loop {
        if let Ok(c) = grpc_channel(s.fanout.grpc, &next_client).await {
            break c;
        }
        assert!(tokio::time::Instant::now() < deadline, "the new certificate was not served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(grpc_channel(s.fanout.grpc, &s.client(None)).await.is_err(), "the old CA no longer verifies");
    open.publish(publish_request(Some(PUBLISHER_TOKEN), &topic)).await.expect("the open connection stays");

    // The publisher token rotates: the file's modification is noticed.
    let rotated = "rotated-publisher-token-0123456789abcdef012";
    std::fs::write(s.dir.path().join("publisher.tokens"), hash_line(rotated)).unwrap();
    let mut fresh = PublishServiceClient::new(channel);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while fresh.publish(publish_request(Some(rotated), &topic)).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the rotated token was not loaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let old = open.publish(publish_request(Some(PUBLISHER_TOKEN), &topic)).await.unwrap_err();
    assert_eq!(old.code(), Code::Unauthenticated, "the old token is gone");
    // A broken file changes nothing: the rotated token keeps working.
    std::fs::write(s.dir.path().join("publisher.tokens"), "not a hash\n").unwrap();
    signal_hangup(&s.fanout);
    tokio::time::sleep(Duration::from_millis(500)).await;
    fresh.publish(publish_request(Some(rotated), &topic)).await.expect("kept after a failed reload");
    assert!(s.fanout.log().contains("reload failed"), "the failed reload is logged");
}

fn signal_hangup(fanout: &Fanout) {
    let pid = fanout.pid().expect("running");
    let status = std::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap();
    assert!(status.success());
}

/// Runs `fanout <command> --config <file with toml>` with nothing from the
/// environment: (exit code, stderr).
fn run(command: &str, dir: &Path, toml: &str) -> (Option<i32>, String) {
    let file = dir.join("fanout.toml");
    std::fs::write(&file, toml).unwrap();
    let out = std::process::Command::new(fanout_binary())
        .args([command, "--config"])
        .arg(&file)
        .env_clear()
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn unsafe_configurations_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let public = "[server]\ngrpc_listen = \"0.0.0.0:50051\"\n";
    let (code, err) = run("check-config", dir.path(), public);
    assert_eq!(code, Some(1));
    assert!(err.contains("server.tls: required because server.grpc_listen"), "{err}");
    let tls = "[server.tls]\ncert_file = \"/c\"\nkey_file = \"/k\"\n";
    let (code, err) = run("check-config", dir.path(), &format!("{public}{tls}"));
    assert_eq!(code, Some(1));
    assert!(err.contains("server.auth: required"), "{err}");
    let allowed = format!("{public}dangerous_allow_unauthenticated = true\n{tls}");
    assert_eq!(run("check-config", dir.path(), &allowed).0, Some(0));
    // `serve` refuses such a file before it listens, naming the key.
    let (code, err) = run("serve", dir.path(), "[server]\napi_listen = \"0.0.0.0:0\"\n");
    assert_ne!(code, Some(0));
    assert!(err.contains("server.tls: required because server.api_listen"), "{err}");
    // A certificate file that does not parse stops the start.
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "nothing").unwrap();
    let toml = format!(
        "[store]\npath = {}\n[server.tls]\ncert_file = {}\nkey_file = {}\n",
        quote(&dir.path().join("data")),
        quote(&bad),
        quote(&bad)
    );
    let (code, err) = run("serve", dir.path(), &toml);
    assert_ne!(code, Some(0));
    assert!(err.contains("no certificate in the file"), "{err}");
}

#[tokio::test]
async fn idle_clients_are_cut_and_connections_are_capped() {
    // Two connections at most per listener; a client that does not finish
    // its request headers within 2 s is disconnected.
    let config = EngineConfig {
        env: vec![
            ("FANOUT__SERVER__MAX_CONNECTIONS_PER_LISTENER".into(), "2".into()),
            ("FANOUT__SERVER__HTTP_HEADER_READ_TIMEOUT_SECONDS".into(), "2".into()),
        ],
        ..EngineConfig::default()
    };
    let fanout = Fanout::start(config).await.unwrap();
    let connect = || tokio::net::TcpStream::connect(fanout.api);
    let (mut a, mut b) = (connect().await.unwrap(), connect().await.unwrap());
    a.write_all(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    b.write_all(b"GET /nowhere HTTP/1.1\r\n").await.unwrap();
    // The third connects (the kernel's backlog) but is not served while the
    // first two hold the listener's slots...
    let mut c = connect().await.unwrap();
    c.write_all(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let early = tokio::time::timeout(Duration::from_millis(800), c.read_to_end(&mut answer)).await;
    assert!(early.is_err(), "served beyond the cap: {:?}", String::from_utf8_lossy(&answer));
    // ...until the header-read bound cuts the two slow clients.
    for slow in [&mut a, &mut b] {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "a client that never finished its headers was kept");
    }
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut answer)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 404"), "{}", String::from_utf8_lossy(&answer));
}
