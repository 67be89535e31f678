//! Spec 003 end to end across two `fanout` processes (hub side and push-server side): a
//! hub (the relay channel, `[engine.channels.relay]`) posts its signed
//! webhooks to a push server (`[engine.relay_ingress]`), which delivers them
//! to the mock APNs. Nothing in between is fanout's test code: the hub's
//! HTTP client, the ingress's verification and the APNs channel are the
//! binaries'.

use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_testkit::ApnsReply;
use fanout_tests::client::{Recipient, envelope, subscription};
use fanout_tests::{EngineConfig, Fanout};
use serde_json::json;

use crate::common::{DELIVERY_WAIT, publish, sequence_id, still_registered};
use crate::relay::{metric, named_group, put, stand_in};
use crate::relay_ingress::{APP, HUB, PATH, SECRET, Setup, setup};

/// The hub, posting to the push server's ingress over plain HTTP on
/// loopback (TLS is the listener's business), with a 1 s request
/// timeout so that a slow provider makes the hub retry.
async fn hub(push_server: &Setup, dir: &tempfile::TempDir) -> Fanout {
    let secret = dir.path().join("hub.secret");
    std::fs::write(&secret, SECRET).expect("write secret");
    let tables = format!(
        "[engine.channels.relay]\nurl = \"http://{addr}{PATH}\"\nsecret_file = {secret:?}\nhub_id = \"{HUB}\"\n\
         timeout_seconds = 1\ndangerous_allow_plain_http = true\n",
        addr = push_server.fanout.api,
        secret = secret.display().to_string(),
    );
    Fanout::start(EngineConfig { extra_tables: tables, ..EngineConfig::default() }).await.expect("start the hub")
}

/// Registers `token` (sandbox APNs, the push server's app) on the hub and
/// subscribes the recipient to `topic`.
async fn device(hub: &Fanout, token: &str, topic: &[u8]) -> Recipient {
    let r = Recipient::random();
    let (status, body) =
        put(hub, &r, &json!({"provider": "apns", "token": token, "app_id": APP, "sandbox": true})).await;
    assert_eq!(status, 204, "{body}");
    let mut client = hub.notifications().await.unwrap();
    client.update_subscriptions(r.update(vec![subscription(topic)], vec![])).await.expect("subscribe");
    r
}

async fn message(hub: &Fanout, topic: &[u8]) -> u64 {
    let results = publish(hub, vec![envelope(topic, pb::EnvelopeKind::Application, true)]).await;
    sequence_id(&results[0])
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {DELIVERY_WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_crosses_hub_and_push_server_to_apns() {
    let push_server = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let hub = hub(&push_server, &dir).await;
    let gid = format!("pair-{}", hex::encode(rand::random::<[u8; 4]>()));
    let topic = named_group(&gid);
    device(&hub, "pair-token", &topic).await;

    let seq = message(&hub, &topic).await;
    let got = push_server.sandbox.wait_for(1, DELIVERY_WAIT).await;
    assert_eq!(got.len(), 1, "{}", push_server.fanout.log_tail(20));
    let r = &got[0];
    assert_eq!(r.path, "/3/device/pair-token");
    assert_eq!(r.auth_valid, Some(true));
    assert_eq!(r.header("apns-topic"), Some(APP));
    // collapse_id = message_id, the spec's stand-in for gid and seq (003 §2.1).
    assert_eq!(r.header("apns-collapse-id"), Some(stand_in(&gid, seq).as_str()));
    assert_eq!(r.header("apns-push-type"), Some("background"));
    let payload = &r.json().unwrap()["payload"];
    assert_eq!(
        (payload["type"].as_str(), payload["gid"].as_str(), payload["seq"].as_u64()),
        (Some("message"), Some(gid.as_str()), Some(seq))
    );
    until("the hub counts the push sent", async || metric(&hub, "sent").await == 1).await;
    assert_eq!(push_server.production.received_count() + push_server.fcm.received_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_retry_of_an_accepted_delivery_reaches_apns_once() {
    let push_server = setup().await;
    // APNs answers after 2.5 s: the hub gives up on its request after 1 s
    // and retries the same delivery_id while the push server still holds
    // (then has settled) the claim.
    push_server.sandbox.script("pair-slow", vec![ApnsReply::ok().with_delay(Duration::from_millis(2500))]);
    let dir = tempfile::tempdir().unwrap();
    let hub = hub(&push_server, &dir).await;
    let topic = named_group(&format!("pair-{}", hex::encode(rand::random::<[u8; 4]>())));
    device(&hub, "pair-slow", &topic).await;

    message(&hub, &topic).await;
    until("the hub's retry answered", async || metric(&hub, "sent").await == 1).await;
    assert!(metric(&hub, "retried").await >= 1, "the hub retried after its timeout");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(push_server.sandbox.received_for("pair-slow").len(), 1, "one provider request for one delivery_id");
    let (_, scrape) = push_server.fanout.http_get("/metrics").await.unwrap();
    assert!(scrape.contains("fanout_relay_ingress_webhooks_total{result=\"duplicate\"} 1"), "{scrape}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_apns_declares_dead_ends_with_the_hub_registration_deleted() {
    let push_server = setup().await;
    push_server.sandbox.script("pair-dead", vec![ApnsReply::reason(410, "Unregistered")]);
    let dir = tempfile::tempdir().unwrap();
    let hub = hub(&push_server, &dir).await;
    let topic = named_group(&format!("pair-{}", hex::encode(rand::random::<[u8; 4]>())));
    let dead = device(&hub, "pair-dead", &topic).await;
    let alive = device(&hub, "pair-alive", &topic).await;

    message(&hub, &topic).await;
    // APNs 410 → the push server answers 410 → the hub compare-and-removes
    // the registration (§2.4), counted once it is removed.
    until("the dead registration removed on the hub", async || metric(&hub, "invalid_token").await == 1).await;
    assert_eq!(push_server.sandbox.received_for("pair-alive").len(), 1);
    // The device stays (§1: only its registration goes); its next push is not sent.
    assert!(still_registered(&hub, &dead).await);
    message(&hub, &topic).await;
    until("the next push for the live device", async || push_server.sandbox.received_for("pair-alive").len() == 2)
        .await;
    assert_eq!(push_server.sandbox.received_for("pair-dead").len(), 1, "no registration: no push");
    assert!(still_registered(&hub, &alive).await, "the other device keeps its registration");
}
