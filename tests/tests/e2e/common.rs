use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_testkit::{
    ApnsTestKey, MockApns, MockApnsConfig, MockWebhook, MockWebhookConfig, TestPki, start_mock_apns, start_mock_webhook,
};
use fanout_tests::client::Recipient;
use fanout_tests::{EngineConfig, Fanout};

pub const BUNDLE_ID: &str = "com.example.fanout";
pub const TEAM_ID: &str = "TEAM123456";
pub const KEY_ID: &str = "KEY1234567";

/// A path as a TOML string.
pub fn quote(path: &std::path::Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// A mock APNs that verifies the provider key's tokens, and an engine whose
/// APNs channel (sandbox) sends to it, with `apns_keys` (TOML lines) added to
/// `[engine.channels.apns]`.
pub struct ApnsSetup {
    pub fanout: Fanout,
    pub mock: MockApns,
    pub _dir: tempfile::TempDir,
}

pub async fn apns_setup(apns_keys: &str) -> ApnsSetup {
    let pki = TestPki::generate(&[]).expect("pki");
    let key = ApnsTestKey::generate().expect("key");
    let config = MockApnsConfig {
        team_id: TEAM_ID.into(),
        key_id: KEY_ID.into(),
        public_key_pem: Some(key.public_pem.clone()),
        ..Default::default()
    };
    let mock = start_mock_apns(&pki, config).await.expect("mock APNs");
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file: PathBuf = dir.path().join("AuthKey.p8");
    key.write_p8(&key_file).expect("write key");
    let ca: PathBuf = dir.path().join("ca.pem");
    pki.write_ca(&ca).expect("write ca");
    // The sandbox environment is configured, so only the sandbox URL may be
    // used; the production URL points at a closed port.
    let table = format!(
        "[engine.channels.apns]\nkey_file = {}\nkey_id = \"{KEY_ID}\"\nteam_id = \"{TEAM_ID}\"\nbundle_id = \"{BUNDLE_ID}\"\n\
         environment = \"sandbox\"\nsandbox_url = \"{}\"\nproduction_url = \"https://127.0.0.1:1\"\nextra_ca_files = [{}]\n{apns_keys}\n",
        quote(&key_file),
        mock.base_url(),
        quote(&ca),
    );
    let config = EngineConfig { engine_extra: "max_attempts = 3".into(), extra_tables: table, ..Default::default() };
    let fanout = Fanout::start(config).await.expect("start fanout");
    ApnsSetup { fanout, mock, _dir: dir }
}

/// A mock webhook receiver with its own CA, and an engine that trusts it.
pub struct WebhookSetup {
    pub fanout: Fanout,
    pub receiver: MockWebhook,
    pub _pki: TestPki,
    pub _ca_dir: tempfile::TempDir,
}

pub async fn webhook_setup(config: EngineConfig) -> WebhookSetup {
    webhook_setup_with(config, MockWebhookConfig::default()).await
}

pub async fn webhook_setup_with(mut config: EngineConfig, receiver: MockWebhookConfig) -> WebhookSetup {
    let pki = TestPki::generate(&["receiver.fanout.test"]).expect("pki");
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let ca: PathBuf = ca_dir.path().join("ca.pem");
    pki.write_ca(&ca).expect("write ca");
    config.ca_file = Some(ca);
    let receiver = start_mock_webhook(&pki, receiver).await.expect("mock webhook");
    let fanout = Fanout::start(config).await.expect("start fanout");
    WebhookSetup { fanout, receiver, _pki: pki, _ca_dir: ca_dir }
}

/// Registers `recipient` at `path` of the receiver and subscribes it to `topics`.
pub async fn register_webhook(
    setup: &WebhookSetup,
    recipient: &Recipient,
    path: &str,
    key: &[u8],
    topics: Vec<pb::Subscription>,
) {
    let mut client = setup.fanout.notifications().await.expect("client");
    setup.receiver.set_signing_key(path, key.to_vec());
    client.register(recipient.register_http(&setup.receiver.url(path), key)).await.expect("register");
    if !topics.is_empty() {
        client.update_subscriptions(recipient.update(topics, vec![])).await.expect("subscribe");
    }
}

pub async fn publish(fanout: &Fanout, envelopes: Vec<pb::Envelope>) -> Vec<pb::PublishResult> {
    let mut publisher = fanout.publisher().await.expect("publisher");
    publisher.publish(pb::PublishRequest { envelopes }).await.expect("publish").into_inner().results
}

pub fn sequence_id(result: &pb::PublishResult) -> u64 {
    match result.result {
        Some(pb::publish_result::Result::SequenceId(s)) => s,
        ref other => panic!("envelope not stored: {other:?}"),
    }
}

/// Long enough for a delivery on loopback, short enough to fail fast.
pub const DELIVERY_WAIT: Duration = Duration::from_secs(15);

/// One series of the engine's /metrics, written as the engine writes it
/// (`name` or `name{label="value",...}`, labels in their declared order);
/// `None` while it is not there (a labelled counter appears at its first
/// increment).
pub async fn metric(fanout: &Fanout, series: &str) -> Option<f64> {
    let (_, scrape) = fanout.http_get("/metrics").await.expect("GET /metrics");
    scrape.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Polls `series` until it is at least `at_least`, for at most `timeout`;
/// returns the last value seen (0 while absent).
pub async fn wait_for_metric(fanout: &Fanout, series: &str, at_least: f64, timeout: Duration) -> f64 {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let value = metric(fanout, series).await.unwrap_or(0.0);
        if value >= at_least || tokio::time::Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `r` is still registered (an empty UpdateSubscriptions answers).
pub async fn still_registered(fanout: &Fanout, r: &Recipient) -> bool {
    let mut client = fanout.notifications().await.expect("client");
    match client.update_subscriptions(r.update(vec![], vec![])).await {
        Ok(_) => true,
        Err(s) if s.code() == tonic::Code::NotFound => false,
        Err(s) => panic!("unexpected status {s:?}"),
    }
}

/// An answer of `post_raw`: lowercase header block, body as text.
pub struct RawAnswer {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// One POST over HTTP/1.1 with `headers` (name, value); the body goes out
/// byte for byte as given (what a signature covers), the connection closes.
pub async fn post_raw(addr: std::net::SocketAddr, path: &str, headers: &[(String, String)], body: &[u8]) -> RawAnswer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await.expect("answer in time").unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = headers.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status line");
    RawAnswer { status, headers: headers.to_ascii_lowercase(), body: body.to_owned() }
}

/// A webhook push as the receiver saw it: (recipient id hex, topic base64,
/// sequence id). Sequence ids are per shard, so the topic is part of the key.
pub type Push = (String, String, u64);

/// Pushes received per delivery, validly signed ones only (a test with
/// faults may see others: they are not deliveries).
pub fn pushes(setup: &WebhookSetup) -> HashMap<Push, usize> {
    let mut seen = HashMap::new();
    for r in setup.receiver.received() {
        if r.signature_valid != Some(true) {
            continue;
        }
        let Some(j) = r.json() else { continue };
        let push = (
            j["recipient_id"].as_str().unwrap_or_default().to_owned(),
            j["topic"].as_str().unwrap_or_default().to_owned(),
            j["sequence_id"].as_str().and_then(|s| s.parse().ok()).unwrap_or_default(),
        );
        *seen.entry(push).or_insert(0) += 1;
    }
    seen
}
