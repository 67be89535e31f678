//! The HTTPS row of the outcome table (spec 000 section 7) against a real
//! receiver: retries, their spacing, the 404/410 terminal rule with PUSH-234,
//! redirects never followed, and the send-time checks of PUSH-256.

use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_testkit::ScriptedResponse;
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::dns;

use crate::common::*;

/// Retries wait at least 1 s, so three attempts end after about 2 s.
const THREE_ATTEMPTS: Duration = Duration::from_secs(8);

#[tokio::test]
async fn https_outcome_table() {
    let setup = webhook_setup(EngineConfig::default()).await;
    let key = [9u8; 32];
    let topic = group_topic();
    let status = ScriptedResponse::status;
    // (path, script, attempts expected, recipient kept)
    let cases: Vec<(&str, Vec<ScriptedResponse>, usize, bool)> = vec![
        ("/gone404", vec![status(404), status(404), status(404)], 3, false),
        ("/gone410", vec![status(410), status(404), status(410)], 3, false),
        ("/back", vec![status(404), status(200)], 2, true),
        ("/mixed", vec![status(404), status(503), status(410)], 3, true),
        ("/down", vec![status(500), status(503), status(502)], 3, true),
        ("/bad", vec![status(400)], 1, true),
        ("/ratelimited", vec![status(429)], 1, true),
        ("/redirect", vec![status(302).with_location("/elsewhere")], 1, true),
        ("/ok", vec![status(204)], 1, true),
    ];
    let mut recipients = Vec::new();
    for (path, script, _, _) in &cases {
        let r = Recipient::random();
        setup.receiver.script(path, script.clone());
        register_webhook(&setup, &r, path, &key, vec![subscription(&topic)]).await;
        recipients.push(r);
    }
    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let total: usize = cases.iter().map(|c| c.2).sum();
    setup.receiver.wait_for(total, THREE_ATTEMPTS).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let received = setup.receiver.received();
    for ((path, _, attempts, kept), r) in cases.iter().zip(&recipients) {
        let mine: Vec<_> = received.iter().filter(|q| q.path == *path).collect();
        assert_eq!(mine.len(), *attempts, "{path}: attempts");
        for pair in mine.windows(2) {
            let gap = pair[1].received_at.duration_since(pair[0].received_at).unwrap();
            assert!(gap >= Duration::from_millis(950), "{path}: retry after {gap:?}, at least 1 s");
            assert_ne!(pair[0].header("webhook-id"), pair[1].header("webhook-id"), "new webhook-id per attempt");
        }
        assert_eq!(still_registered(&setup.fanout, r).await, *kept, "{path}: recipient kept?");
    }
    assert!(received.iter().all(|q| q.path != "/elsewhere"), "a redirect is never followed");
}

#[tokio::test]
async fn a_terminal_answer_does_not_delete_a_re_registered_recipient() {
    // PUSH-234: the recipient re-registers (new signing key) while its
    // deliveries are failing; the late terminal outcome must not delete it.
    let setup = webhook_setup(EngineConfig::default()).await;
    let topic = group_topic();
    let r = Recipient::random();
    setup.receiver.script("/moving", vec![ScriptedResponse::status(410); 3]);
    register_webhook(&setup, &r, "/moving", &[1u8; 32], vec![subscription(&topic)]).await;
    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    setup.receiver.wait_for(1, DELIVERY_WAIT).await;
    let mut client = setup.fanout.notifications().await.unwrap();
    client.register(r.register_http(&setup.receiver.url("/moving"), &[2u8; 32])).await.unwrap();
    setup.receiver.wait_for(3, THREE_ATTEMPTS).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(setup.receiver.received_count(), 3);
    assert!(still_registered(&setup.fanout, &r).await, "re-registered recipient survives");
}

#[tokio::test]
async fn destination_is_checked_again_before_every_attempt() {
    let dns = dns::start(dns::standard_zone()).await.unwrap();
    let config = EngineConfig { dns_server: Some(dns.addr), ..EngineConfig::default() };
    let mut setup = webhook_setup(config).await;
    let key = [5u8; 32];
    let topic = group_topic();
    let port = setup.receiver.addr().port();
    // receiver.fanout.test resolves to 127.0.0.1 (allowed: this engine is in test mode).
    let named = Recipient::random();
    let url = format!("https://receiver.fanout.test:{port}/named");
    setup.receiver.set_signing_key("/named", key.to_vec());
    let mut client = setup.fanout.notifications().await.unwrap();
    client.register(named.register_http(&url, &key)).await.expect("register by name");
    client.update_subscriptions(named.update(vec![subscription(&topic)], vec![])).await.unwrap();
    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let got = setup.receiver.wait_for(1, DELIVERY_WAIT).await;
    assert_eq!(got.len(), 1, "log:\n{}", setup.fanout.log());
    assert_eq!(got[0].signature_valid, Some(true));

    // The name stops resolving: the next attempt is not sent.
    dns.set("receiver.fanout.test", vec![]);
    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(setup.receiver.received_count(), 1, "no send to a host that resolves to nothing");

    // allowed_domains binds at send time: narrowing it stops deliveries to
    // recipients registered before the change.
    dns.set("receiver.fanout.test", vec!["127.0.0.1".parse().unwrap()]);
    setup.fanout.terminate().unwrap();
    let mut narrowed = setup.fanout.config().clone();
    narrowed.allowed_domains = vec!["*.elsewhere.test".into()];
    setup.fanout.set_config(narrowed);
    setup.fanout.restart().await.unwrap();
    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(setup.receiver.received_count(), 1, "no send to a host outside allowed_domains");
    let (_, metrics) = setup.fanout.http_get("/metrics").await.unwrap();
    let refused: f64 = metrics
        .lines()
        .find(|l| l.starts_with("fanout_webhook_refused_send_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap();
    assert!(refused >= 1.0);
}
