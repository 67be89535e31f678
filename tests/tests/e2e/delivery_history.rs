//! "Why didn't this device get its push?": the delivery history of one
//! recipient on the node that sent to it (`GET
//! /admin/recipients/{recipient_id}/deliveries` on the ops listener), with
//! each attempt's position, channel, outcome, provider status and reason,
//! attempt number and times, and nothing private.

use fanout_proto::v1 as pb;
use fanout_testkit::{ApnsReply, ScriptedResponse};
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use serde_json::Value;

use crate::common::{DELIVERY_WAIT, apns_setup, publish, register_webhook, sequence_id, webhook_setup};

const KEY: [u8; 32] = [0x3c; 32];

async fn history(fanout: &fanout_tests::Fanout, recipient: &str) -> (u16, Value) {
    let (status, body) =
        fanout.http_get(&format!("/admin/recipients/{recipient}/deliveries")).await.expect("history request");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Polls the history until it holds `n` attempts (the record follows the
/// answer by a moment).
async fn attempts(fanout: &fanout_tests::Fanout, recipient: &str, n: usize) -> Value {
    let deadline = std::time::Instant::now() + DELIVERY_WAIT;
    loop {
        let (status, body) = history(fanout, recipient).await;
        assert_eq!(status, 200, "{body}");
        if body["attempts"].as_array().is_some_and(|a| a.len() >= n) || std::time::Instant::now() >= deadline {
            return body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_webhook_retried_after_a_503_shows_both_attempts() {
    let setup =
        webhook_setup(EngineConfig { engine_extra: "max_attempts = 3".into(), ..EngineConfig::default() }).await;
    let recipient = Recipient::random();
    let topic = group_topic();
    register_webhook(&setup, &recipient, "/flaky", &KEY, vec![subscription(&topic)]).await;
    setup.receiver.script("/flaky", vec![ScriptedResponse::status(503)]);
    let results = publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let seq = sequence_id(&results[0]);
    assert_eq!(setup.receiver.wait_for(2, DELIVERY_WAIT).await.len(), 2, "a 503, then the retry");

    let body = attempts(&setup.fanout, &recipient.id_hex(), 2).await;
    let list = body["attempts"].as_array().expect("attempts");
    assert_eq!(list.len(), 2, "{body}");
    assert_eq!(body["recipient_id"], recipient.id_hex().as_str());
    assert!(body["node"].as_str().is_some_and(|n| !n.is_empty()), "{body}");
    assert_eq!(body["dropped_records"], 0);
    let (second, first) = (&list[0], &list[1]);
    // The first attempt: transient on the 503, retried.
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["channel"], "http");
    assert_eq!(first["outcome"], "transient");
    assert_eq!(first["provider_status"], 503);
    assert_eq!(first["ended"], Value::Null, "retried, not ended: {first}");
    assert!(first["retry_in_ms"].as_u64().is_some_and(|ms| ms >= 1000), "section 7's delay: {first}");
    // The second: delivered, which ended the delivery.
    assert_eq!(second["attempt"], 2);
    assert_eq!(second["outcome"], "delivered");
    assert_eq!(second["ended"], "delivered");
    assert_eq!(second["provider_status"], 200);
    assert_eq!(second["retry_in_ms"], Value::Null);
    for a in list {
        assert_eq!(a["sequence_id"], seq.to_string().as_str(), "the envelope's position: {a}");
        assert!(a["shard"].is_u64(), "{a}");
        assert_eq!(a["provider_reason"], Value::Null, "a webhook's answer names no reason");
        let at = |key: &str| a[key].as_i64().unwrap_or_else(|| panic!("{key} in {a}"));
        assert!(at("published_at_ms") <= at("first_attempt_at_ms"), "{a}");
        assert!(at("first_attempt_at_ms") <= at("sent_at_ms") && at("sent_at_ms") <= at("answered_at_ms"), "{a}");
        assert_eq!(at("first_attempt_at_ms"), first["sent_at_ms"].as_i64().unwrap(), "the first attempt's time");
    }
    // PUSH-254: nothing private in the answer.
    let text = body.to_string();
    for private in [setup.receiver.url("/flaky"), hex::encode(KEY), hex::encode(&topic), "fanout.test".into()] {
        assert!(!text.contains(&private), "the history shows a private value: {text}");
    }
    // Another recipient has nothing here; a malformed id is refused.
    let (status, other) = history(&setup.fanout, &Recipient::random().id_hex()).await;
    assert_eq!((status, other["attempts"].as_array().map(Vec::len)), (200, Some(0)));
    let (status, problem) = history(&setup.fanout, "not-hex").await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(
        (problem["field"].as_str(), problem["detail"].as_str()),
        (Some("recipient_id"), Some("must be 64 hexadecimal digits"))
    );
}

#[tokio::test]
async fn an_apns_refusal_shows_its_reason() {
    let setup = apns_setup("").await;
    let recipient = Recipient::random();
    // A device token unlike the recipient id, to look for in the answer.
    let token = Recipient::random().id_hex();
    setup.mock.script(&token, vec![ApnsReply::reason(400, "BadDeviceToken")]);
    let mut client = setup.fanout.notifications().await.expect("client");
    let delivery = pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: token.clone() });
    client.register(recipient.register(delivery)).await.expect("register");
    let topic = group_topic();
    client.update_subscriptions(recipient.update(vec![subscription(&topic)], vec![])).await.expect("subscribe");
    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;

    let body = attempts(&setup.fanout, &recipient.id_hex(), 1).await;
    let a = &body["attempts"][0];
    assert_eq!((a["channel"].as_str(), a["attempt"].as_u64()), (Some("apns"), Some(1)), "{body}");
    // Section 7's APNs row: BadDeviceToken is a token of another sender or
    // environment.
    assert_eq!((a["outcome"].as_str(), a["ended"].as_str()), (Some("mismatch"), Some("mismatch")), "{a}");
    assert_eq!(a["provider_status"], 400);
    assert_eq!(a["provider_reason"], "BadDeviceToken");
    assert!(!body.to_string().contains(&token[..16]), "no device token in the history");
}

#[tokio::test]
async fn the_history_can_be_turned_off() {
    let config = EngineConfig { engine_extra: "history = { max_records = 0 }".into(), ..EngineConfig::default() };
    let setup = webhook_setup(config).await;
    let (status, body) = history(&setup.fanout, &Recipient::random().id_hex()).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "history_off");
    assert_eq!(body["detail"], "the delivery history is off (engine.history.max_records = 0)");
}
