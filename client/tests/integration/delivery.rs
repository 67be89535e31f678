//! The whole path: two inboxes' devices enable webhook notifications, join
//! the same group and sync; a message published with a sender HMAC wakes the
//! other inbox's device and not the sender's own (PUSH-258, 229, 230).

use std::time::Duration;

use fanout_client::{
    BackendConfig, ConsentState::*, ConversationKind::*, DeliveryTarget, MemoryStore, Outgoing, Publisher, RootKey,
    RuleOptions,
};
use fanout_testkit::{MockWebhookConfig, TestPki, start_mock_webhook};

use crate::common::*;

/// The sequence ids delivered at `path`, with every signature checked.
fn delivered(receiver: &fanout_testkit::MockWebhook, path: &str) -> Vec<String> {
    receiver
        .received()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| {
            assert_eq!(r.signature_valid, Some(true), "{path}: bad signature");
            r.json().and_then(|j| j["sequence_id"].as_str().map(str::to_owned)).expect("a push body")
        })
        .collect()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_message_wakes_the_other_inboxs_device_and_not_the_senders() {
    let pki = TestPki::generate(&[]).unwrap();
    let ca_dir = tempfile::tempdir().unwrap();
    let ca = ca_dir.path().join("ca.pem");
    pki.write_ca(&ca).unwrap();
    let receiver = start_mock_webhook(&pki, MockWebhookConfig::default()).await.unwrap();
    let engine = start_engine("", Some(&ca)).await;

    let mut devices = Vec::new();
    for (n, root) in [(1u8, [0xa1; 42]), (2, [0xb2; 42])] {
        let host = TestHost::new(n);
        host.set_root(Some(RootKey::new(&root).unwrap()));
        host.join(&group(1), Group, Allowed);
        host.join(&group(2), Group, Allowed);
        let s = client_with(engine.grpc, host, std::sync::Arc::new(MemoryStore::new()), held(), |_| {});
        let path = format!("/device-{n}");
        let key = vec![n; 32];
        receiver.set_signing_key(&path, key.clone());
        let target = DeliveryTarget::Http { url: receiver.url(&path), signing_key: key };
        s.client.enable(target, RuleOptions::default()).await.expect("enable");
        s.client.sync_now().await.expect("sync");
        devices.push((s, path));
    }
    let (alice, alice_path) = &devices[0];
    let (bob, bob_path) = &devices[1];
    let publisher = |s: &ClientSetup| {
        Publisher::new(&BackendConfig::new(format!("http://{}", engine.grpc)), s.host.clone()).expect("publisher")
    };

    let from_alice = publisher(alice)
        .publish(&group(1), b"ciphertext from alice".to_vec(), Outgoing::Application { should_push: None })
        .await
        .expect("publish")
        .to_string();
    wait_until("bob's wake-up", || delivered(&receiver, bob_path).contains(&from_alice)).await;

    // Bob answers in the same group: Alice is woken by Bob's message, which
    // comes after hers, so hers was dispatched (and suppressed) by then.
    let from_bob = publisher(bob)
        .publish(&group(1), b"ciphertext from bob".to_vec(), Outgoing::Application { should_push: None })
        .await
        .expect("publish")
        .to_string();
    wait_until("alice's wake-up", || delivered(&receiver, alice_path).contains(&from_bob)).await;

    assert_eq!(delivered(&receiver, alice_path), vec![from_bob.clone()], "alice is never woken by her own message");
    assert_eq!(delivered(&receiver, bob_path), vec![from_alice], "bob is never woken by his own message");
    let (_, metrics) = engine.http_get("/metrics").await.unwrap();
    let suppressed: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("fanout_suppressed_total ")?.trim().parse().ok())
        .expect("the suppression counter");
    assert_eq!(suppressed, 2.0);
}
