//! Webhook answers with hostile bodies: a receiver answers
//! 200 at once and then sends a body that never ends, trickling (a few bytes
//! a second) or flooding (as fast as the connection takes it). The outcome is
//! decided on the status line, so every delivery is `delivered` at its first
//! attempt, nothing is retried, the checkpoint moves on, and the body is
//! drained (up to the 64 KiB cap) or dropped without holding the attempt or
//! the pool's in-flight slot: with one worker, one attempt in flight per
//! worker and one pool slot, every delivery still completes, where holding
//! the slot for a body would serialize them behind it.

use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_testkit::{AnswerBody, MockWebhookConfig, ScriptedResponse};
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};

use crate::common::*;

const DELIVERED: &str = r#"fanout_deliveries_total{channel="http",outcome="delivered"}"#;
const ATTEMPTS_DELIVERED: &str = r#"fanout_attempts_total{channel="http",outcome="delivered"}"#;
const TRANSIENT: &str = r#"fanout_attempts_total{channel="http",outcome="transient"}"#;

/// A few bytes a second, for ever: never reaches the cap.
const TRICKLE: AnswerBody = AnswerBody::Endless { chunk_bytes: 16, every: Duration::from_secs(1) };
/// 16 KiB every millisecond: past the 64 KiB cap at once.
const FLOOD: AnswerBody = AnswerBody::Endless { chunk_bytes: 16 * 1024, every: Duration::from_millis(1) };

fn env(name: &str, value: &str) -> (String, String) {
    (name.to_owned(), value.to_owned())
}

/// One delivery worker, one attempt in flight per worker, one pool slot.
fn one_at_a_time() -> EngineConfig {
    EngineConfig {
        env: vec![
            env("FANOUT__ENGINE__DELIVERY__WORKERS", "1"),
            env("FANOUT__ENGINE__DELIVERY__MAX_IN_FLIGHT_PER_WORKER", "1"),
            env("FANOUT__ENGINE__CHANNELS__HTTP__MAX_IN_FLIGHT", "1"),
        ],
        ..EngineConfig::default()
    }
}

/// `trickles` + `floods` recipients of one topic, each answered 200 and an
/// endless body of its kind; one publish; every delivery completes.
async fn endless_bodies_do_not_hold_deliveries(receiver: MockWebhookConfig, trickles: usize, floods: usize) {
    let setup = webhook_setup_with(one_at_a_time(), receiver).await;
    let topic = group_topic();
    let key = [0x51u8; 32];
    let n = trickles + floods;
    for i in 0..n {
        let path = format!("/endless{i}");
        let body = if i < trickles { TRICKLE } else { FLOOD };
        setup.receiver.script(&path, vec![ScriptedResponse { body, ..ScriptedResponse::status(200) }]);
        register_webhook(&setup, &Recipient::random(), &path, &key, vec![subscription(&topic)]).await;
    }
    let windows_before = metric(&setup.fanout, "fanout_windows_total").await.unwrap_or(0.0);

    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;

    // Every delivery reaches the receiver and is decided on its status line.
    let got = setup.receiver.wait_for(n, DELIVERY_WAIT).await;
    assert_eq!(
        got.len(),
        n,
        "deliveries queued behind an endless body (in-flight slot held?); {} bodies still open; engine log:\n{}",
        setup.receiver.open_bodies(),
        setup.fanout.log_tail(40)
    );
    assert!(got.iter().all(|q| q.signature_valid == Some(true)));
    let delivered = wait_for_metric(&setup.fanout, DELIVERED, n as f64, DELIVERY_WAIT).await;
    assert_eq!(delivered, n as f64, "every delivery is delivered");
    // The checkpoint moved past the envelope.
    let windows = wait_for_metric(&setup.fanout, "fanout_windows_total", windows_before + 1.0, DELIVERY_WAIT).await;
    assert!(windows > windows_before, "the window completed ({windows}, {windows_before} before)");

    // The engine lets go of every body (drained up to the cap, or dropped).
    let open = setup.receiver.wait_for_open_bodies_at_most(0, DELIVERY_WAIT).await;
    assert_eq!(open, 0, "endless bodies the engine still reads");

    // One attempt each, none timed out or retried, no repeats.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(setup.receiver.received_count(), n, "no delivery was sent twice");
    assert_eq!(metric(&setup.fanout, ATTEMPTS_DELIVERED).await, Some(n as f64));
    assert_eq!(metric(&setup.fanout, TRANSIENT).await.unwrap_or(0.0), 0.0, "no attempt timed out");

    // The channel still works: an ordinary answer on the same engine.
    let plain = Recipient::random();
    register_webhook(&setup, &plain, "/plain", &key, vec![subscription(&topic)]).await;
    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let total = 2 * n + 1;
    let got = setup.receiver.wait_for(total, DELIVERY_WAIT).await;
    assert_eq!(got.len(), total, "the second envelope reaches everyone; log:\n{}", setup.fanout.log_tail(40));
    assert_eq!(wait_for_metric(&setup.fanout, DELIVERED, total as f64, DELIVERY_WAIT).await, total as f64);
}

#[tokio::test]
async fn endless_bodies_over_http2_neither_hold_the_attempt_nor_the_slot() {
    endless_bodies_do_not_hold_deliveries(MockWebhookConfig::default(), 4, 2).await;
}

#[tokio::test]
async fn endless_bodies_over_http1_neither_hold_the_attempt_nor_the_slot() {
    endless_bodies_do_not_hold_deliveries(MockWebhookConfig::http1_only(), 4, 2).await;
}
