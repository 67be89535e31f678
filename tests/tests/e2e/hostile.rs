//! Hostile inputs: an input that could make a shard unusable is
//! refused on its own envelope, changes nothing, and leaves the shard and the
//! rest of the batch working; every configured limit is answered with a
//! precise status and changes nothing.

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

fn env(name: &str, value: &str) -> (String, String) {
    (name.to_owned(), value.to_owned())
}

fn error_message(result: &pb::PublishResult) -> &str {
    match &result.result {
        Some(pb::publish_result::Result::Error(e)) => &e.message,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The value of an unlabelled or labelled sample in the engine's /metrics.
async fn sample(setup: &WebhookSetup, series: &str) -> f64 {
    let (_, scrape) = setup.fanout.http_get("/metrics").await.expect("metrics");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} not in:\n{scrape}"))
}

#[tokio::test]
async fn data_over_the_limit_fails_only_its_envelope() {
    let config =
        EngineConfig { env: vec![env("FANOUT__ENGINE__INGEST__MAX_DATA_BYTES", "1024")], ..Default::default() };
    let setup = webhook_setup(config).await;
    let recipient = Recipient::random();
    let topic = group_topic();
    register_webhook(&setup, &recipient, "/hook", &[0x25u8; 32], vec![subscription(&topic)]).await;

    let sized = |n: usize| pb::Envelope { data: vec![7; n], ..envelope(&topic, pb::EnvelopeKind::Application, true) };
    let results = publish(&setup.fanout, vec![sized(1024), sized(1025), sized(10)]).await;
    assert_eq!(error_code(&results[1]), Some(tonic::Code::InvalidArgument as i32), "{results:?}");
    assert_eq!(
        error_message(&results[1]),
        "envelope data is larger than the limit of 1024 bytes (engine.ingest.max_data_bytes)"
    );
    let (first, third) = (sequence_id(&results[0]), sequence_id(&results[2]));
    assert_eq!(third, first + 1, "the refused envelope took no sequence id");
    let got = setup.receiver.wait_for(2, DELIVERY_WAIT).await;
    assert_eq!(got.len(), 2, "both neighbours are delivered");
    assert_eq!(sample(&setup, r#"fanout_limit_refusals_total{limit="envelope_data"}"#).await, 1.0);
}

#[tokio::test]
async fn an_update_over_the_limits_is_refused_and_stores_nothing() {
    let config = EngineConfig {
        env: vec![
            env("FANOUT__ENGINE__MAX_SUBSCRIPTION_CHANGES", "1000"),
            env("FANOUT__ENGINE__MAX_PUSH_TOPICS", "1500"),
        ],
        ..Default::default()
    };
    let setup = webhook_setup(config).await;
    let recipient = Recipient::random();
    let mut client = setup.fanout.notifications().await.expect("client");
    let adds: Vec<pb::Subscription> = (0..1001).map(|_| subscription(&group_topic())).collect();

    // PUSH-253 order: an unknown recipient is NOT_FOUND whatever its payload.
    let unknown = client.update_subscriptions(recipient.update(adds.clone(), vec![])).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    register_webhook(&setup, &recipient, "/hook", &[0x26u8; 32], vec![]).await;

    // Over max_subscription_changes (adds and removes together): refused,
    // naming the limit, nothing stored.
    let over = client.update_subscriptions(recipient.update(adds.clone(), vec![])).await.unwrap_err();
    assert_eq!(over.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        over.message(),
        "an UpdateSubscriptions request carries at most 1000 adds and removes together \
         (engine.max_subscription_changes); send them in batches"
    );
    let removes: Vec<Vec<u8>> = (0..101).map(|_| group_topic()).collect();
    let mixed = client.update_subscriptions(recipient.update(adds[..900].to_vec(), removes)).await;
    assert_eq!(mixed.unwrap_err().code(), tonic::Code::InvalidArgument);
    let state = client.update_subscriptions(recipient.update(vec![], vec![])).await.expect("empty update").into_inner();
    assert_eq!(state.topic_count, 0, "nothing was stored");

    // PUSH-217, decided before any write: 1000 stored, 600 more would pass 1500.
    client.update_subscriptions(recipient.update(adds[..1000].to_vec(), vec![])).await.expect("at the change limit");
    let more: Vec<pb::Subscription> = (0..600).map(|_| subscription(&group_topic())).collect();
    let limit = client.update_subscriptions(recipient.update(more, vec![])).await.unwrap_err();
    assert_eq!(limit.code(), tonic::Code::ResourceExhausted);
    let state = client.update_subscriptions(recipient.update(vec![], vec![])).await.expect("empty update").into_inner();
    assert_eq!(state.topic_count, 1000, "the refused update stored nothing");
    assert_eq!(sample(&setup, r#"fanout_limit_refusals_total{limit="subscription_changes"}"#).await, 2.0);
}

#[tokio::test]
async fn a_message_over_the_grpc_limit_is_refused_by_the_transport() {
    let config =
        EngineConfig { env: vec![env("FANOUT__SERVER__GRPC_MAX_MESSAGE_BYTES", "65536")], ..Default::default() };
    let setup = webhook_setup(config).await;
    let topic = group_topic();
    let big = pb::Envelope { data: vec![7; 70_000], ..envelope(&topic, pb::EnvelopeKind::Application, true) };
    let mut publisher = setup.fanout.publisher().await.expect("publisher");

    let refused = publisher.publish(pb::PublishRequest { envelopes: vec![big.clone()] }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    assert!(refused.message().contains("the limit is: 65536 bytes"), "{refused:?}");

    // On a stream: the earlier batch's acknowledgement, then the status.
    let small = || pb::PublishRequest { envelopes: vec![envelope(&topic, pb::EnvelopeKind::Application, true)] };
    let batches = vec![small(), pb::PublishRequest { envelopes: vec![big] }, small()];
    let mut acks = publisher.publish_stream(tokio_stream::iter(batches)).await.expect("stream").into_inner();
    let first = sequence_id(&acks.message().await.expect("first ack").expect("an ack").results[0]);
    let end = acks.message().await.unwrap_err();
    assert_eq!(end.code(), tonic::Code::OutOfRange, "{end:?}");

    // Nothing of the refused messages was stored.
    let next = publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    assert_eq!(sequence_id(&next[0]), first + 1);
}
