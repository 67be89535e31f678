//! The outbound proxy (`[engine.outbound_proxy]`) end to end: every channel
//! connects through a real HTTP CONNECT proxy (Debian's tinyproxy, with Basic
//! authentication, named by `FANOUT_TEST_TINYPROXY`), the destination guard
//! (PUSH-256) still decides which address a webhook reaches and the proxy is
//! only ever asked for that address, and a proxy that answers 503 or is gone
//! is retried and recovered from without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fanout_proto::v1 as pb;
use fanout_testkit::mock::webpush as webpush_mock;
use fanout_testkit::webpush::VapidTestKey;
use fanout_testkit::{
    ApnsTestKey, MockApns, MockApnsConfig, MockFcm, MockFcmConfig, MockWebhook, MockWebhookConfig, TestPki,
    start_mock_apns, start_mock_fcm, start_mock_webhook,
};
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::dns::{self, TestDns};
use fanout_tests::proxy::{PASSWORD, Tinyproxy, USER, free_port};
use fanout_tests::{EngineConfig, Fanout};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::common::{BUNDLE_ID, DELIVERY_WAIT, KEY_ID, TEAM_ID, metric, publish, quote, wait_for_metric};
use crate::webhook_safety::standard_address;

const KEY: [u8; 32] = [0x5a; 32];
const HOOK: &str = "/hook";
const RELAY_PATH: &str = "/relay";
const RELAY_SECRET: &[u8] = b"outbound-proxy-relay-secret-0123456789";
/// The webhook receiver's name (the test DNS answers 127.0.0.1).
const RECEIVER: &str = "receiver.fanout.test";

/// The mocks of every channel, the test DNS and the files the engine reads.
struct Providers {
    _pki: TestPki,
    dns: TestDns,
    receiver: MockWebhook,
    apns: MockApns,
    fcm: MockFcm,
    webpush: webpush_mock::MockWebPush,
    dir: tempfile::TempDir,
}

async fn providers() -> Providers {
    let pki = TestPki::generate(&[RECEIVER]).expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let apns_key = ApnsTestKey::generate().expect("key");
    apns_key.write_p8(&dir.path().join("AuthKey.p8")).expect("write key");
    let apns_config = MockApnsConfig {
        team_id: TEAM_ID.into(),
        key_id: KEY_ID.into(),
        public_key_pem: Some(apns_key.public_pem.clone()),
        ..Default::default()
    };
    let apns = start_mock_apns(&pki, apns_config).await.expect("mock APNs");
    let fcm = start_mock_fcm(&pki, MockFcmConfig::default()).await.expect("mock FCM");
    fcm.service_account().write(&dir.path().join("service-account.json")).expect("write service account");
    let vapid = VapidTestKey::generate();
    vapid.write(&dir.path().join("vapid.pem")).expect("vapid key");
    let webpush = webpush_mock::start(&pki, Some(vapid.public_key.clone())).await.expect("mock push service");
    let receiver = start_mock_webhook(&pki, MockWebhookConfig::default()).await.expect("mock webhook");
    receiver.set_signing_key(HOOK, KEY.to_vec());
    receiver.set_signing_key(RELAY_PATH, RELAY_SECRET.to_vec());
    pki.write_ca(&dir.path().join("ca.pem")).expect("write ca");
    std::fs::write(dir.path().join("relay.secret"), RELAY_SECRET).expect("relay secret");
    std::fs::write(dir.path().join("proxy-credentials"), format!("{USER}:{PASSWORD}\n")).expect("credentials");
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    Providers { _pki: pki, dns, receiver, apns, fcm, webpush, dir }
}

impl Providers {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The engine: every channel, each sending to its mock, through the
    /// proxy at `proxy_port`.
    fn config(&self, proxy_port: u16) -> EngineConfig {
        let ca = self.path("ca.pem");
        let file = |name: &str| quote(&self.path(name));
        let tables = format!(
            "[engine.outbound_proxy]\nurl = \"http://127.0.0.1:{proxy_port}\"\ncredentials_file = {creds}\n\n\
             [engine.channels.apns]\nkey_file = {key}\nkey_id = \"{KEY_ID}\"\nteam_id = \"{TEAM_ID}\"\n\
             bundle_id = \"{BUNDLE_ID}\"\nenvironment = \"sandbox\"\nsandbox_url = \"{apns}\"\n\
             production_url = \"https://127.0.0.1:1\"\nextra_ca_files = [{ca}]\n\n\
             [engine.channels.fcm]\nservice_account_file = {account}\nbase_url = \"{fcm}\"\nextra_ca_files = [{ca}]\n\n\
             [engine.channels.webpush]\nvapid_key_file = {vapid}\nsubject = \"mailto:ops@fanout.test\"\n\
             allow_private_addresses = true\nextra_ca_files = [{ca}]\n\n\
             [engine.channels.relay]\nurl = \"{relay}\"\nsecret_file = {relay_secret}\nextra_ca_files = [{ca}]\n\
             hub_id = \"hub-proxy\"\n\n",
            creds = file("proxy-credentials"),
            key = file("AuthKey.p8"),
            apns = self.apns.base_url(),
            ca = quote(&ca),
            account = file("service-account.json"),
            fcm = self.fcm.base_url(),
            vapid = file("vapid.pem"),
            relay = self.receiver.url(RELAY_PATH),
            relay_secret = file("relay.secret"),
        );
        EngineConfig {
            dns_server: Some(self.dns.addr),
            ca_file: Some(ca),
            // Enough attempts to outlast a proxy outage of a few seconds
            // (fast failures retry after about a second).
            engine_extra: "max_attempts = 10".into(),
            extra_tables: tables,
            ..EngineConfig::default()
        }
    }

    fn webhook_url(&self) -> String {
        format!("https://{RECEIVER}:{}{HOOK}", self.receiver.addr().port())
    }
}

/// One recipient of every channel, all subscribed to one fresh topic.
struct Recipients {
    topic: Vec<u8>,
    apns: Recipient,
    fcm: Recipient,
    webpush: webpush_mock::MockSubscription,
    relay_token: String,
}

async fn register_everyone(fanout: &Fanout, p: &Providers) -> Recipients {
    let topic = group_topic();
    let mut client = fanout.notifications().await.expect("client");
    let subscribe = |r: &Recipient| r.update(vec![subscription(&topic)], vec![]);

    let webhook = Recipient::random();
    client.register(webhook.register_http(&p.webhook_url(), &KEY)).await.expect("register webhook");
    client.update_subscriptions(subscribe(&webhook)).await.expect("subscribe");
    let apns = Recipient::random();
    let delivery = pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: apns.id_hex() });
    client.register(apns.register(delivery)).await.expect("register apns");
    client.update_subscriptions(subscribe(&apns)).await.expect("subscribe");
    let fcm = Recipient::random();
    let delivery = pb::register_request::Delivery::Fcm(pb::FcmDelivery { token: fcm.id_hex() });
    client.register(fcm.register(delivery)).await.expect("register fcm");
    client.update_subscriptions(subscribe(&fcm)).await.expect("subscribe");
    let browser = Recipient::random();
    let webpush = p.webpush.subscribe();
    let delivery = pb::register_request::Delivery::Webpush(pb::WebPushDelivery {
        endpoint: webpush.endpoint.clone(),
        p256dh: webpush.p256dh.clone(),
        auth: webpush.auth.clone(),
    });
    client.register(browser.register(delivery)).await.expect("register webpush");
    client.update_subscriptions(subscribe(&browser)).await.expect("subscribe");
    // Spec 003 §1: a relay registration over the push API.
    let relayed = Recipient::random();
    let relay_token = format!("relay-{}", relayed.id_hex());
    let body = serde_json::json!({"provider": "apns", "token": relay_token}).to_string();
    let bearer = relayed.bearer();
    let headers = [("authorization", bearer.as_str()), ("content-type", "application/json")];
    let (status, text) =
        fanout.api_request("PUT", "/v2/push/registration", &headers, body.as_bytes()).await.expect("relay register");
    assert_eq!(status, 204, "relay registration: {text}");
    client.update_subscriptions(subscribe(&relayed)).await.expect("subscribe");
    Recipients { topic, apns, fcm, webpush, relay_token }
}

/// Waits until every channel's mock got the envelope: the webhook at its
/// path, APNs, FCM, the browser's push service and the relay's push server.
/// Returns what is still missing (empty: all arrived).
async fn missing_deliveries(p: &Providers, r: &Recipients, wait: Duration) -> Vec<&'static str> {
    let deadline = Instant::now() + wait;
    loop {
        let received = p.receiver.received();
        let at = |path: &str| received.iter().any(|q| q.path == path && (200..300).contains(&q.status_sent));
        let relayed = received.iter().any(|q| {
            q.path == RELAY_PATH && q.json().is_some_and(|v| v["registration"]["token"] == r.relay_token.as_str())
        });
        let mut missing = Vec::new();
        if !at(HOOK) {
            missing.push("webhook");
        }
        if !p.apns.received_for(&r.apns.id_hex()).iter().any(|q| q.status_sent == 200) {
            missing.push("apns");
        }
        if p.fcm.received_for(&r.fcm.id_hex()).is_empty() {
            missing.push("fcm");
        }
        if !p.webpush.received().iter().any(|q| q.subscription == r.webpush.id && q.status_sent < 300) {
            missing.push("webpush");
        }
        if !relayed {
            missing.push("relay");
        }
        if missing.is_empty() || Instant::now() >= deadline {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn port_of(url: &str) -> String {
    url.rsplit(':').next().unwrap_or_default().trim_end_matches('/').to_owned()
}

/// Nothing the engine logged holds the proxy's password, alone or as the
/// Basic credentials.
fn assert_no_credentials(fanout: &Fanout) {
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let log = fanout.log();
    assert!(!log.contains(PASSWORD) && !log.contains(&basic), "the engine log holds the proxy's credentials");
}

#[tokio::test]
async fn every_channel_connects_through_the_proxy() {
    let Some(binary) = fanout_testkit::outside_service::tinyproxy_binary() else { return };
    let p = providers().await;
    let proxy = Tinyproxy::start(&binary, 0).await.expect("tinyproxy");
    let fanout = Fanout::start(p.config(proxy.port())).await.expect("start fanout");
    let r = register_everyone(&fanout, &p).await;

    publish(&fanout, vec![envelope(&r.topic, pb::EnvelopeKind::Application, true)]).await;
    let missing = missing_deliveries(&p, &r, DELIVERY_WAIT).await;
    assert!(missing.is_empty(), "not delivered through the proxy: {missing:?}\nengine log:\n{}", fanout.log());

    let connects = proxy.connects();
    let to = |port: String| connects.iter().filter(|a| **a == format!("127.0.0.1:{port}")).count();
    // Each provider host by its address (the mocks' URLs are IP literals).
    assert!(to(port_of(&p.apns.base_url())) >= 1, "APNs through the proxy: {connects:?}");
    assert!(to(port_of(&p.webpush.base_url())) >= 1, "Web Push through the proxy: {connects:?}");
    // FCM's token endpoint and messages:send share the mock's port; the
    // token client's connections are the ones the send pool did not open.
    let pool = metric(&fanout, "fanout_provider_connections_opened_total{channel=\"fcm\"}").await.unwrap_or(0.0);
    assert_eq!(p.fcm.wait_for_token_requests(1, DELIVERY_WAIT).await.len(), 1, "one access token fetched");
    assert!(to(port_of(&p.fcm.base_url())) as f64 > pool, "the token fetch went through the proxy too: {connects:?}");
    // The webhook receiver (and the relay's push server on the same port):
    // asked for by the checked address, never by its name.
    let receiver_port = p.receiver.addr().port().to_string();
    assert!(to(receiver_port) >= 2, "the webhook and the relay through the proxy: {connects:?}");
    assert!(!connects.iter().any(|a| a.contains(RECEIVER)), "the proxy never resolves a webhook's name: {connects:?}");
    assert_no_credentials(&fanout);
}

/// PUSH-256 with a proxy: the engine resolves and checks the webhook's name
/// before every attempt; when the name moves to a reserved address, the
/// attempt is refused and the proxy is not asked for anything.
#[tokio::test]
async fn the_destination_guard_decides_before_the_proxy_is_asked() {
    let Some(binary) = fanout_testkit::outside_service::tinyproxy_binary() else { return };
    let p = providers().await;
    let proxy = Tinyproxy::start(&binary, 0).await.expect("tinyproxy");
    let config = p.config(proxy.port());
    let fanout = Fanout::start(config).await.expect("start fanout");
    let mut client = fanout.notifications().await.expect("client");
    let webhook = Recipient::random();
    let topic = group_topic();
    client.register(webhook.register_http(&p.webhook_url(), &KEY)).await.expect("register webhook");
    client.update_subscriptions(webhook.update(vec![subscription(&topic)], vec![])).await.expect("subscribe");
    publish(&fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    assert_eq!(p.receiver.wait_for(1, DELIVERY_WAIT).await.len(), 1, "engine log:\n{}", fanout.log());
    let before = proxy.connects();

    // DNS rebinding: the name now also answers a reserved address.
    let loopback = "127.0.0.1".parse().expect("ip");
    p.dns.set(RECEIVER, vec![loopback, standard_address("testnet1")]);
    let refused_series = "fanout_webhook_refused_send_total";
    let refused = metric(&fanout, refused_series).await.unwrap_or(0.0);
    publish(&fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let after = wait_for_metric(&fanout, refused_series, refused + 1.0, DELIVERY_WAIT).await;
    assert!(after > refused, "the attempt is refused ({refused} -> {after})");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(p.receiver.received_count(), 1, "nothing more reached the receiver");
    let new: Vec<String> = proxy.connects().into_iter().skip(before.len()).collect();
    assert!(new.is_empty(), "the proxy was asked for nothing after the refusal: {new:?}");
    assert!(!proxy.connects().iter().any(|a| a.contains("192.0.2.")), "never the reserved address");
}

/// A stand-in proxy that answers every CONNECT with 503 and counts them.
async fn answering_503(port: u16) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("bind the proxy's port");
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let answer =
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n";
                let _ = socket.write_all(answer).await;
            });
        }
    });
    (task, count)
}

/// The proxy answers 503, then is gone, then is back: every channel's
/// deliveries are retried (spec 000 section 7) and all arrive once the proxy
/// is back, without a restart of the engine.
#[tokio::test]
async fn a_proxy_that_answers_503_or_is_gone_is_recovered_from() {
    let Some(binary) = fanout_testkit::outside_service::tinyproxy_binary() else { return };
    let p = providers().await;
    let port = free_port().expect("port");
    let (stand_in, refusals) = answering_503(port).await;
    let fanout = Fanout::start(p.config(port)).await.expect("start fanout");
    let r = register_everyone(&fanout, &p).await;
    publish(&fanout, vec![envelope(&r.topic, pb::EnvelopeKind::Application, true)]).await;

    // Every channel has been refused by the proxy at least once.
    let deadline = Instant::now() + DELIVERY_WAIT;
    while refusals.load(Ordering::SeqCst) < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refusals.load(Ordering::SeqCst) >= 5, "the 503 proxy was asked by every channel");
    // Then no proxy at all for a moment (connections refused)...
    stand_in.abort();
    let _ = stand_in.await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let delivered_meanwhile = 5 - missing_deliveries(&p, &r, Duration::ZERO).await.len();
    assert_eq!(delivered_meanwhile, 0, "nothing can be delivered without the proxy");
    // ...then the real one, on the same port.
    let proxy = Tinyproxy::start(&binary, port).await.expect("tinyproxy");
    let missing = missing_deliveries(&p, &r, Duration::from_secs(60)).await;
    assert!(missing.is_empty(), "not recovered: {missing:?}\nengine log:\n{}", fanout.log());
    assert!(!proxy.connects().is_empty());
    assert_no_credentials(&fanout);
}

/// Settings the engine cannot use are refused at start, naming the key.
#[tokio::test]
async fn a_bad_credentials_file_stops_the_start_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let creds: &Path = &dir.path().join("creds");
    std::fs::write(creds, "no-colon-here\n").expect("write");
    let config = EngineConfig {
        extra_tables: format!(
            "[engine.outbound_proxy]\nurl = \"http://127.0.0.1:3128\"\ncredentials_file = {}\n",
            quote(creds)
        ),
        ..EngineConfig::default()
    };
    let err = Fanout::start(config).await.err().expect("the engine refuses to start");
    let text = format!("{err:#}");
    assert!(text.contains("engine.outbound_proxy.credentials_file"), "{text}");
    assert!(!text.contains("no-colon-here"), "the error never shows the file's contents: {text}");
}
