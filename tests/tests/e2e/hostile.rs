//! Hostile publishers (issue 11): an input that could make a shard unusable is
//! refused on its own envelope, changes nothing, and leaves the shard and the
//! rest of the batch working.

use fanout_proto::v1 as pb;
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};

use crate::common::*;

fn with_sequence_id(topic: &[u8], sequence_id: u64) -> pb::Envelope {
    pb::Envelope { sequence_id, ..envelope(topic, pb::EnvelopeKind::Application, true) }
}

fn error_code(result: &pb::PublishResult) -> Option<i32> {
    match &result.result {
        Some(pb::publish_result::Result::Error(e)) => Some(e.code),
        _ => None,
    }
}

#[tokio::test]
async fn a_sequence_id_at_the_end_of_the_range_fails_alone_and_the_shard_keeps_working() {
    let setup = webhook_setup(EngineConfig::default()).await;
    let recipient = Recipient::random();
    let topic = group_topic();
    let key = [0x24u8; 32];
    register_webhook(&setup, &recipient, "/hook", &key, vec![subscription(&topic)]).await;

    // u64::MAX and a jump past 2^32: refused with INVALID_ARGUMENT, each on its
    // own; the neighbours (same shard and another topic) are stored.
    let other = group_topic();
    let results = publish(
        &setup.fanout,
        vec![
            with_sequence_id(&topic, u64::MAX),
            envelope(&other, pb::EnvelopeKind::Application, true),
            with_sequence_id(&topic, (1 << 32) + 10),
            envelope(&topic, pb::EnvelopeKind::Application, true),
        ],
    )
    .await;
    assert_eq!(error_code(&results[0]), Some(tonic::Code::InvalidArgument as i32), "{results:?}");
    assert_eq!(error_code(&results[2]), Some(tonic::Code::InvalidArgument as i32), "{results:?}");
    sequence_id(&results[1]);
    let first = sequence_id(&results[3]);

    // Later publishes to the same shard are stored and delivered.
    let again = publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let second = sequence_id(&again[0]);
    assert!(second > first);
    let got = setup.receiver.wait_for(2, DELIVERY_WAIT).await;
    assert_eq!(got.len(), 2, "both stored envelopes are delivered; engine log:\n{}", setup.fanout.log());
}
