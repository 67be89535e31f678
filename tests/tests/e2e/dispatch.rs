//! Dispatch end to end (spec 000 sections 4–6): eligibility per kind (PUSH-219),
//! the delivery condition (PUSH-257), sender suppression (PUSH-230), publish
//! results per envelope, supervision after an injected panic, retention
//! (PUSH-226), and a clean SIGTERM.

use std::collections::HashMap;

use base64::Engine as _;
use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_tests::EngineConfig;
use fanout_tests::client::{
    Recipient, current_epoch, envelope, group_topic, sender_hmac, subscription, topic_of_kind, welcome_topic,
};
use pb::EnvelopeKind as K;

use crate::common::*;

/// Lets stragglers arrive before asserting that something did not.
const QUIET: Duration = Duration::from_millis(1500);

fn push_of(recipient: &Recipient, topic: &[u8], seq: u64) -> Push {
    (recipient.id_hex(), base64::engine::general_purpose::STANDARD.encode(topic), seq)
}

/// Pushes received per delivery, asserting that every one is validly signed.
fn pushes_all_signed(setup: &WebhookSetup) -> HashMap<Push, usize> {
    let mut seen = HashMap::new();
    for r in setup.receiver.received() {
        assert_eq!(r.signature_valid, Some(true), "every push is signed");
        let j = r.json().expect("json body");
        let push = (
            j["recipient_id"].as_str().unwrap().to_owned(),
            j["topic"].as_str().unwrap().to_owned(),
            j["sequence_id"].as_str().unwrap().parse().unwrap(),
        );
        *seen.entry(push).or_insert(0) += 1;
    }
    seen
}

async fn metric(setup: &WebhookSetup, name: &str) -> f64 {
    let (_, body) = setup.fanout.http_get("/metrics").await.expect("metrics");
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn eligibility_and_the_delivery_condition() {
    let setup = webhook_setup(EngineConfig::default()).await;
    let key = [1u8; 32];
    let group = group_topic();
    let welcome = welcome_topic();
    let with_commits = Recipient::random();
    let without_commits = Recipient::random();
    let mut sub_commits = subscription(&group);
    sub_commits.include_commits = true;
    register_webhook(&setup, &with_commits, "/a", &key, vec![sub_commits, subscription(&welcome)]).await;
    register_webhook(&setup, &without_commits, "/b", &key, vec![subscription(&group)]).await;

    let published = publish(
        &setup.fanout,
        vec![
            envelope(&group, K::Application, true),               // 0: both
            envelope(&group, K::Application, false),              // 1: nobody (should_push false)
            envelope(&group, K::Commit, false),                   // 2: include_commits only
            envelope(&group, K::Proposal, false),                 // 3: include_commits only
            envelope(&group, K::CommitLog, true),                 // 4: never pushed
            envelope(&welcome, K::Welcome, false),                // 5: welcome subscriber
            envelope(&topic_of_kind(2), K::IdentityUpdate, true), // 6: never pushed
            envelope(&topic_of_kind(3), K::KeyPackage, true),     // 7: never pushed
        ],
    )
    .await;
    let seq: Vec<u64> = published.iter().map(sequence_id).collect();
    let (a, b) = (&with_commits, &without_commits);
    let expected: HashMap<Push, usize> = [
        (push_of(a, &group, seq[0]), 1),
        (push_of(b, &group, seq[0]), 1),
        (push_of(a, &group, seq[2]), 1),
        (push_of(a, &group, seq[3]), 1),
        (push_of(a, &welcome, seq[5]), 1),
    ]
    .into_iter()
    .collect();
    setup.receiver.wait_for(expected.len(), DELIVERY_WAIT).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(pushes_all_signed(&setup), expected, "log:\n{}", setup.fanout.log());
}

#[tokio::test]
async fn senders_own_messages_are_suppressed_and_everything_else_fails_open() {
    suppression_cases(b"ciphertext".to_vec()).await;
}

/// Windows do not carry the data; a page reads it and, this large
/// (more than 64 KiB of hashing), hashes it off the shard actor's thread.
#[tokio::test]
async fn large_messages_are_suppressed_the_same_way() {
    suppression_cases((0..512 * 1024).map(|i| i as u8).collect()).await;
}

async fn suppression_cases(data: Vec<u8>) {
    let setup = webhook_setup(EngineConfig::default()).await;
    let key = [2u8; 32];
    let topic = group_topic();
    let epoch = current_epoch();
    let keys: Vec<Vec<u8>> = (0..3u8).map(|i| vec![0x10 + i; 42]).collect();
    let sender = Recipient::random();
    let other = Recipient::random();
    let mut with_keys = subscription(&topic);
    with_keys.hmac_epoch_base = epoch - 1;
    with_keys.hmac_keys = keys.clone();
    register_webhook(&setup, &sender, "/sender", &key, vec![with_keys]).await;
    register_webhook(&setup, &other, "/other", &key, vec![subscription(&topic)]).await;

    let signed = |hmac: Vec<u8>, data: &[u8]| {
        let mut e = envelope(&topic, K::Application, true);
        e.sender_hmac = hmac;
        e.data = data.to_vec();
        e
    };
    let current_key = &keys[1]; // index = epoch - base = 1
    let published = publish(
        &setup.fanout,
        vec![
            signed(sender_hmac(current_key, &data), &data), // 0: suppressed for the sender
            signed(sender_hmac(&keys[0], &data), &data),    // 1: key of another epoch: pushed
            signed(sender_hmac(current_key, b"other"), &data), // 2: HMAC of other data: pushed
            signed(sender_hmac(current_key, &data)[..31].to_vec(), &data), // 3: 31 bytes: pushed
            signed(vec![], &data),                          // 4: no HMAC: pushed
        ],
    )
    .await;
    let seq: Vec<u64> = published.iter().map(sequence_id).collect();
    let mut expected: HashMap<Push, usize> = seq.iter().map(|q| (push_of(&other, &topic, *q), 1)).collect();
    for q in &seq[1..] {
        expected.insert(push_of(&sender, &topic, *q), 1);
    }
    setup.receiver.wait_for(expected.len(), DELIVERY_WAIT).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(pushes_all_signed(&setup), expected);
    assert_eq!(metric(&setup, "fanout_suppressed_total").await, 1.0);
}

#[tokio::test]
async fn one_bad_envelope_does_not_drop_the_good_ones() {
    let setup = webhook_setup(EngineConfig::default()).await;
    let topic = group_topic();
    let mut unspecified = envelope(&topic, K::Application, true);
    unspecified.kind = 0;
    let mut own_id = envelope(&topic, K::Application, true);
    own_id.sequence_id = 1_000_000;
    let mut not_increasing = envelope(&topic, K::Application, true);
    not_increasing.sequence_id = 5;
    let results = publish(
        &setup.fanout,
        vec![
            envelope(&topic, K::Application, true),
            envelope(&[0x00], K::Application, true), // empty identifier
            unspecified,
            envelope(&welcome_topic(), K::Application, true), // kind does not match the topic
            own_id,
            not_increasing,
            envelope(&topic, K::Application, true),
        ],
    )
    .await;
    assert_eq!(results.len(), 7);
    let first = sequence_id(&results[0]);
    for bad in &results[1..4] {
        match &bad.result {
            Some(pb::publish_result::Result::Error(e)) => assert_eq!(e.code, tonic::Code::InvalidArgument as i32),
            other => panic!("expected an error, got {other:?}"),
        }
    }
    assert_eq!(sequence_id(&results[4]), 1_000_000, "publisher-supplied id above the last");
    match &results[5].result {
        Some(pb::publish_result::Result::Error(e)) => assert_eq!(e.code, tonic::Code::FailedPrecondition as i32),
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(sequence_id(&results[6]), 1_000_001, "allocation continues above the publisher's id");
    assert!(first < 1_000_000);
}

#[tokio::test]
async fn a_panicking_shard_actor_is_restarted_and_loses_nothing() {
    let config = EngineConfig {
        engine_extra: "[engine.dispatch]\nsubscriber_page = 5".into(),
        env: vec![("FANOUT_DANGEROUS_PANIC_AFTER_PAGES".into(), "3".into())],
        ..EngineConfig::default()
    };
    let setup = webhook_setup(config).await;
    let key = [3u8; 32];
    let topic = group_topic();
    let recipients: Vec<Recipient> = (0..20).map(|_| Recipient::random()).collect();
    for r in &recipients {
        register_webhook(&setup, r, "/p", &key, vec![subscription(&topic)]).await;
    }
    let seqs: Vec<u64> = publish(&setup.fanout, (0..3).map(|_| envelope(&topic, K::Application, true)).collect())
        .await
        .iter()
        .map(sequence_id)
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = pushes_all_signed(&setup);
        let missing = recipients
            .iter()
            .flat_map(|r| seqs.iter().map(|s| push_of(r, &topic, *s)))
            .filter(|k| !seen.contains_key(k))
            .count();
        if missing == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{missing} deliveries missing; log:\n{}", setup.fanout.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(setup.fanout.log().contains("injected shard actor panic"), "the panic happened");
    assert!(metric(&setup, "fanout_shard_restarts_total").await >= 1.0);
}

#[tokio::test]
async fn retention_deletes_recipients_that_stopped_renewing() {
    let config = EngineConfig {
        engine_extra: "recipient_ttl_seconds = 1\n[engine.retention]\ninterval_seconds = 1".into(),
        ..EngineConfig::default()
    };
    let setup = webhook_setup(config).await;
    let stale = Recipient::random();
    let key = [4u8; 32];
    register_webhook(&setup, &stale, "/r", &key, vec![subscription(&group_topic())]).await;
    let mut client = setup.fanout.notifications().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match client.update_subscriptions(stale.update(vec![], vec![])).await {
            Err(status) if status.code() == tonic::Code::NotFound => break,
            // Each successful update renews, so poll slowly enough to expire.
            _ => tokio::time::sleep(Duration::from_millis(2500)).await,
        }
        assert!(std::time::Instant::now() < deadline, "the expired recipient was never deleted");
    }
}

#[tokio::test]
async fn sigterm_exits_cleanly() {
    let mut setup = webhook_setup(EngineConfig::default()).await;
    // One node runs every shard (the harness configures 16).
    assert_eq!(metric(&setup, "fanout_owned_shards").await, 16.0);
    let status = setup.fanout.terminate().expect("terminate");
    assert!(status.success(), "exit status {status}; log:\n{}", setup.fanout.log());
    assert!(setup.fanout.log().contains("stopped"));
}

#[tokio::test]
async fn the_streaming_publish_answers_every_envelope_of_every_batch() {
    let setup = webhook_setup(EngineConfig::default()).await;
    let key = [6u8; 32];
    let topic = group_topic();
    let r = Recipient::random();
    register_webhook(&setup, &r, "/stream", &key, vec![subscription(&topic)]).await;
    let mut bad = envelope(&topic, K::Application, true);
    bad.kind = 0;
    let batches = vec![
        pb::PublishRequest { envelopes: vec![envelope(&topic, K::Application, true), bad] },
        pb::PublishRequest { envelopes: vec![envelope(&topic, K::Application, true)] },
    ];
    let mut publisher = setup.fanout.publisher().await.unwrap();
    let mut acks = publisher.publish_stream(tokio_stream::iter(batches)).await.unwrap().into_inner();
    let mut results = Vec::new();
    while let Some(ack) = acks.message().await.unwrap() {
        assert!(!ack.results.is_empty(), "one acknowledgement per batch");
        results.extend(ack.results);
    }
    assert_eq!(results.len(), 3, "one result per envelope, in order");
    let first = sequence_id(&results[0]);
    assert!(matches!(results[1].result, Some(pb::publish_result::Result::Error(_))));
    assert_eq!(sequence_id(&results[2]), first + 1);
    setup.receiver.wait_for(2, DELIVERY_WAIT).await;
    tokio::time::sleep(QUIET).await;
    let seen = pushes_all_signed(&setup);
    assert_eq!(seen.len(), 2);
    assert!(seen.contains_key(&push_of(&r, &topic, first)) && seen.contains_key(&push_of(&r, &topic, first + 1)));
}
