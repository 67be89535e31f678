//! The vertical slice: register a webhook → subscribe → publish → the HTTPS
//! receiver gets exactly the body of PUSH-259, signed per PUSH-235.

use std::time::Duration;

use base64::Engine as _;
use fanout_proto::v1 as pb;
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};

use crate::common::*;

#[tokio::test]
async fn webhook_receives_a_signed_content_free_push() {
    let setup = webhook_setup(EngineConfig::default()).await;
    let recipient = Recipient::random();
    let topic = group_topic();
    let key = [0x42u8; 32];
    register_webhook(&setup, &recipient, "/hook", &key, vec![subscription(&topic)]).await;

    let results = publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let seq = sequence_id(&results[0]);

    let got = setup.receiver.wait_for(1, DELIVERY_WAIT).await;
    assert_eq!(got.len(), 1, "one push; engine log:\n{}", setup.fanout.log());
    let push = &got[0];
    assert_eq!(push.method, "POST");
    assert_eq!(push.path, "/hook");
    assert_eq!(push.header("content-type"), Some("application/json"));
    assert_eq!(push.signature_valid, Some(true), "signed with the registered key (PUSH-235)");
    let id = push.header("webhook-id").expect("webhook-id");
    assert!(!id.is_empty());
    let ts: i64 = push.header("webhook-timestamp").expect("timestamp").parse().expect("decimal seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - ts).abs() < 60, "timestamp is the current Unix time in seconds");
    // PUSH-259: exactly topic, sequence_id (decimal text), recipient_id (lowercase hex).
    let expected = format!(
        r#"{{"topic":"{}","sequence_id":"{}","recipient_id":"{}"}}"#,
        base64::engine::general_purpose::STANDARD.encode(&topic),
        seq,
        recipient.id_hex()
    );
    assert_eq!(std::str::from_utf8(&push.body).unwrap(), expected);

    // Nothing else arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(setup.receiver.received_count(), 1);
}
