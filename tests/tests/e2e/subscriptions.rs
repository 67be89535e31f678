//! PUSH-215 (malformed requests apply nothing), PUSH-216 (atomic adds and
//! removes, the start position and replacement), PUSH-217 (the topic limit
//! refuses the whole request), observed through RecipientState.topic_count and,
//! for start positions, through real deliveries to an HTTPS receiver.

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine as _;
use fanout_proto::v1 as pb;
use fanout_tests::client::{
    Recipient, current_epoch, envelope, group_topic, subscription, topic_of_kind, welcome_topic,
};
use fanout_tests::{EngineConfig, Fanout};
use tonic::Code;

use crate::admission::{Check, Client, UpdateCase, random_bytes};
use crate::common::*;

fn sub_keys(topic: &[u8], base: i64, keys: Vec<Vec<u8>>, include_commits: bool) -> pb::Subscription {
    pb::Subscription { topic: topic.to_vec(), hmac_epoch_base: base, hmac_keys: keys, include_commits }
}

fn keys(n: usize, len: usize) -> Vec<Vec<u8>> {
    (0..n).map(|_| random_bytes(len)).collect()
}

/// A topic of `kind` with an identifier of `len` bytes.
fn topic_with_id(kind: u8, len: usize) -> Vec<u8> {
    let mut t = vec![kind];
    t.extend(random_bytes(len));
    t
}

/// The stored count, through an empty UpdateSubscriptions.
async fn count(ck: &mut Check, c: &mut Client, r: &Recipient, what: &str) -> Option<u64> {
    ck.ok(&format!("{what}: empty UpdateSubscriptions"), c.update_subscriptions(r.update(vec![], vec![])).await)
        .map(|s| s.topic_count)
}

/// An UpdateSubscriptions that must answer `want`; on success its topic_count
/// must be `want_count`, on failure the stored count must still be `want_count`.
#[allow(clippy::too_many_arguments)]
async fn update(
    ck: &mut Check,
    c: &mut Client,
    r: &Recipient,
    what: &str,
    adds: Vec<pb::Subscription>,
    removes: Vec<Vec<u8>>,
    want: Code,
    want_count: u64,
) {
    let got = ck.code(what, c.update_subscriptions(r.update(adds, removes)).await, want);
    match got {
        Some(state) => {
            ck.eq(&format!("{what}: topic_count in the response"), state.topic_count, want_count);
            ck.eq(&format!("{what}: channel in the response"), state.channel, pb::Channel::Http as i32);
        }
        None => {
            let after = count(ck, c, r, what).await;
            ck.eq(&format!("{what}: nothing applied, topic_count afterwards"), after, Some(want_count));
        }
    }
}

#[tokio::test]
async fn malformed_requests_apply_nothing_and_valid_ones_apply_together() {
    let fanout = Fanout::start(EngineConfig::default()).await.expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let r = Recipient::random();
    // Registration only (nothing is published in this test).
    ck.ok("register", c.register(r.register_http("https://127.0.0.1:9/subscriptions", &[3; 32])).await);

    let (t1, t2) = (group_topic(), welcome_topic());
    update(&mut ck, &mut c, &r, "store two topics", vec![subscription(&t1), subscription(&t2)], vec![], Code::Ok, 2)
        .await;

    // PUSH-215: every malformed element, each sent next to valid new adds and
    // next to a valid remove of a stored topic, so a partial application shows
    // in topic_count (adds raise it, the remove lowers it).
    let ia = Code::InvalidArgument;
    let fresh = group_topic();
    let bad_adds: Vec<(&str, pb::Subscription)> = vec![
        ("identity-update topic (0x02)", subscription(&topic_of_kind(0x02))),
        ("key-package topic (0x03)", subscription(&topic_of_kind(0x03))),
        ("unknown kind 0x04", subscription(&topic_of_kind(0x04))),
        ("unknown kind 0xff", subscription(&topic_of_kind(0xff))),
        ("empty topic", subscription(&[])),
        ("kind byte only (0-byte identifier)", subscription(&[0x00])),
        ("welcome kind byte only", subscription(&[0x01])),
        ("65-byte identifier", subscription(&topic_with_id(0x00, 65))),
        ("65-byte welcome identifier", subscription(&topic_with_id(0x01, 65))),
        ("negative hmac_epoch_base with keys", sub_keys(&fresh, -1, keys(1, 42), false)),
        ("i64::MIN hmac_epoch_base with keys", sub_keys(&fresh, i64::MIN, keys(3, 42), false)),
        ("4 keys", sub_keys(&fresh, current_epoch() - 1, keys(4, 42), false)),
        ("41-byte key", sub_keys(&fresh, current_epoch() - 1, keys(1, 41), false)),
        ("43-byte key", sub_keys(&fresh, current_epoch() - 1, keys(1, 43), false)),
        ("empty key", sub_keys(&fresh, current_epoch() - 1, vec![vec![]], false)),
        (
            "one good and one 41-byte key",
            sub_keys(&fresh, current_epoch() - 1, vec![random_bytes(42), random_bytes(41)], false),
        ),
    ];
    for (what, bad) in &bad_adds {
        let adds = vec![subscription(&group_topic()), bad.clone(), subscription(&welcome_topic())];
        update(&mut ck, &mut c, &r, &format!("PUSH-215 add: {what}, with two valid adds"), adds, vec![], ia, 2).await;
        update(
            &mut ck,
            &mut c,
            &r,
            &format!("PUSH-215 add: {what}, with a valid remove"),
            vec![bad.clone()],
            vec![t1.clone()],
            ia,
            2,
        )
        .await;
    }
    let bad_removes: Vec<(&str, Vec<u8>)> = vec![
        ("identity-update topic (0x02)", topic_of_kind(0x02)),
        ("key-package topic (0x03)", topic_of_kind(0x03)),
        ("unknown kind 0x04", topic_of_kind(0x04)),
        ("empty topic", vec![]),
        ("kind byte only", vec![0x00]),
        ("65-byte identifier", topic_with_id(0x00, 65)),
    ];
    for (what, bad) in &bad_removes {
        update(
            &mut ck,
            &mut c,
            &r,
            &format!("PUSH-215 remove: {what}, with a valid remove"),
            vec![],
            vec![t1.clone(), bad.clone()],
            ia,
            2,
        )
        .await;
        update(
            &mut ck,
            &mut c,
            &r,
            &format!("PUSH-215 remove: {what}, with a valid add"),
            vec![subscription(&group_topic())],
            vec![bad.clone()],
            ia,
            2,
        )
        .await;
    }
    // Duplicates across adds and removes.
    let n = group_topic();
    let dups: Vec<UpdateCase> = vec![
        ("new topic twice in adds", vec![subscription(&n), subscription(&n)], vec![]),
        ("new topic twice in adds, different keys", vec![subscription(&n), sub_keys(&n, 5, keys(1, 42), true)], vec![]),
        (
            "stored topic twice in adds, plus a new add",
            vec![subscription(&t1), subscription(&n), subscription(&t1)],
            vec![],
        ),
        ("new topic in adds and removes", vec![subscription(&n)], vec![n.clone()]),
        ("stored topic in adds and removes", vec![subscription(&t1), subscription(&n)], vec![t1.clone()]),
        ("stored topic twice in removes", vec![], vec![t1.clone(), t1.clone()]),
        ("stored topic twice in removes, plus a new add", vec![subscription(&n)], vec![t2.clone(), t2.clone()]),
        ("unstored topic twice in removes, plus a new add", vec![subscription(&n)], vec![fresh.clone(), fresh.clone()]),
    ];
    for (what, adds, removes) in dups {
        update(&mut ck, &mut c, &r, &format!("PUSH-215 duplicate: {what}"), adds, removes, ia, 2).await;
    }

    // Accepted edge cases.
    let edge1 = topic_with_id(0x00, 1);
    let edge64 = topic_with_id(0x01, 64);
    update(
        &mut ck,
        &mut c,
        &r,
        "1-byte and 64-byte identifiers",
        vec![subscription(&edge1), subscription(&edge64)],
        vec![],
        Code::Ok,
        4,
    )
    .await;
    // A negative base without keys is accepted (the base is not stored).
    let neg = group_topic();
    update(
        &mut ck,
        &mut c,
        &r,
        "negative hmac_epoch_base without keys",
        vec![sub_keys(&neg, -1, vec![], false)],
        vec![],
        Code::Ok,
        5,
    )
    .await;
    let neg_min = welcome_topic();
    update(
        &mut ck,
        &mut c,
        &r,
        "i64::MIN hmac_epoch_base without keys",
        vec![sub_keys(&neg_min, i64::MIN, vec![], true)],
        vec![],
        Code::Ok,
        6,
    )
    .await;
    // Three 42-byte keys are the maximum.
    update(
        &mut ck,
        &mut c,
        &r,
        "replace with three 42-byte keys",
        vec![sub_keys(&neg, current_epoch() - 1, keys(3, 42), true)],
        vec![],
        Code::Ok,
        6,
    )
    .await;
    update(
        &mut ck,
        &mut c,
        &r,
        "base 0 with one key",
        vec![sub_keys(&edge1, 0, keys(1, 42), false)],
        vec![],
        Code::Ok,
        6,
    )
    .await;

    // PUSH-216: adds and removes apply together.
    let (a1, a2) = (group_topic(), welcome_topic());
    update(
        &mut ck,
        &mut c,
        &r,
        "two adds and one remove",
        vec![subscription(&a1), subscription(&a2)],
        vec![t1.clone()],
        Code::Ok,
        7,
    )
    .await;
    update(&mut ck, &mut c, &r, "remove an unstored topic", vec![], vec![group_topic()], Code::Ok, 7).await;
    update(&mut ck, &mut c, &r, "remove t1 again (no longer stored)", vec![], vec![t1.clone()], Code::Ok, 7).await;
    update(
        &mut ck,
        &mut c,
        &r,
        "replace a stored topic and remove an unstored one",
        vec![sub_keys(&a1, current_epoch(), keys(2, 42), true)],
        vec![welcome_topic()],
        Code::Ok,
        7,
    )
    .await;
    update(&mut ck, &mut c, &r, "re-add t1", vec![subscription(&t1)], vec![], Code::Ok, 8).await;
    update(
        &mut ck,
        &mut c,
        &r,
        "swap: remove a1, add a fresh topic",
        vec![subscription(&group_topic())],
        vec![a1.clone()],
        Code::Ok,
        8,
    )
    .await;
    update(
        &mut ck,
        &mut c,
        &r,
        "remove everything",
        vec![],
        vec![t1.clone(), t2.clone(), edge1.clone(), edge64.clone(), neg.clone(), neg_min.clone(), a2.clone()],
        Code::Ok,
        1,
    )
    .await;

    ck.finish("PUSH-215/216", &fanout.log());
}

/// PUSH-216 start positions, observed through delivery: an envelope settled
/// before the subscription is never delivered; replacing the subscription keeps
/// its start position and takes the new include_commits.
#[tokio::test]
async fn start_position_is_kept_when_a_subscription_is_replaced() {
    let setup = webhook_setup(EngineConfig::default()).await;
    let fanout = &setup.fanout;
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let r = Recipient::random();
    let key = random_bytes(32);
    let topic = group_topic();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&topic);
    register_webhook(&setup, &r, "/start", &key, vec![]).await;

    let app = |t: &[u8]| envelope(t, pb::EnvelopeKind::Application, true);
    let commit = |t: &[u8]| envelope(t, pb::EnvelopeKind::Commit, false);

    // A settles before the subscription exists.
    let seq_a = sequence_id(&publish(fanout, vec![app(&topic)]).await[0]);
    update(
        &mut ck,
        &mut c,
        &r,
        "subscribe (no keys, include_commits false)",
        vec![subscription(&topic)],
        vec![],
        Code::Ok,
        1,
    )
    .await;

    // X (a commit, not wanted) then B in one batch: B's window covers X.
    let res = publish(fanout, vec![commit(&topic), app(&topic)]).await;
    let (seq_x, seq_b) = (sequence_id(&res[0]), sequence_id(&res[1]));
    let got = setup.receiver.wait_for(1, DELIVERY_WAIT).await;
    ck.eq("pushes after subscribing and publishing B", got.len(), 1);

    // D is published and the subscription replaced right away (new keys,
    // include_commits true): D is above the kept start position, so it is
    // delivered whether its window is read before or after the replacement.
    let seq_d = sequence_id(&publish(fanout, vec![app(&topic)]).await[0]);
    update(
        &mut ck,
        &mut c,
        &r,
        "replace (three keys, include_commits true)",
        vec![sub_keys(&topic, current_epoch() - 1, keys(3, 42), true)],
        vec![],
        Code::Ok,
        1,
    )
    .await;
    // C and the commit Y after the replacement: both wanted now.
    let res = publish(fanout, vec![app(&topic), commit(&topic)]).await;
    let (seq_c, seq_y) = (sequence_id(&res[0]), sequence_id(&res[1]));
    setup.receiver.wait_for(4, DELIVERY_WAIT).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let received = setup.receiver.received();
    let mut seqs = BTreeSet::new();
    for p in &received {
        let body = p.json().unwrap_or_default();
        ck.eq("push path", p.path.as_str(), "/start");
        ck.eq("push topic", body["topic"].as_str(), Some(b64.as_str()));
        ck.eq("push signature", p.signature_valid, Some(true));
        if let Some(s) = body["sequence_id"].as_str().and_then(|s| s.parse::<u64>().ok()) {
            seqs.insert(s);
        }
    }
    let want: BTreeSet<u64> = [seq_b, seq_d, seq_c, seq_y].into();
    ck.truth(
        &format!("A ({seq_a}), settled before the subscription, is never delivered (got {seqs:?})"),
        !seqs.contains(&seq_a),
    );
    ck.truth(
        &format!("commit X ({seq_x}) under include_commits false is not delivered (got {seqs:?})"),
        !seqs.contains(&seq_x),
    );
    ck.eq(&format!("delivered sequence ids (A={seq_a} X={seq_x} B={seq_b} D={seq_d} C={seq_c} Y={seq_y})"), seqs, want);
    ck.eq("number of pushes (one per delivered envelope)", received.len(), 4);

    // A second replacement, again keeping the start position: nothing old re-delivered.
    update(&mut ck, &mut c, &r, "replace again (no keys)", vec![subscription(&topic)], vec![], Code::Ok, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ck.eq("no re-delivery after a second replacement", setup.receiver.received_count(), 4);

    ck.finish("PUSH-216 start position", &fanout.log());
}

/// PUSH-217 with max_push_topics = 3: a request that would leave more than three
/// subscriptions is refused whole, its removes included.
#[tokio::test]
async fn topic_limit_refuses_the_whole_request() {
    let fanout = Fanout::start(EngineConfig { engine_extra: "max_push_topics = 3".into(), ..EngineConfig::default() })
        .await
        .expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let re = Code::ResourceExhausted;

    // Four at once on an empty recipient.
    let fresh = Recipient::random();
    ck.ok("register a second recipient", c.register(fresh.register_http("https://127.0.0.1:9/limit2", &[4; 32])).await);
    let four: Vec<pb::Subscription> = (0..4).map(|_| subscription(&group_topic())).collect();
    update(&mut ck, &mut c, &fresh, "four adds on an empty recipient", four, vec![], re, 0).await;
    let three: Vec<pb::Subscription> = (0..3).map(|_| subscription(&welcome_topic())).collect();
    update(&mut ck, &mut c, &fresh, "three adds on an empty recipient", three, vec![], Code::Ok, 3).await;

    let r = Recipient::random();
    ck.ok("register", c.register(r.register_http("https://127.0.0.1:9/limit", &[4; 32])).await);
    let t: Vec<Vec<u8>> = (0..7).map(|_| group_topic()).collect();
    let s = |i: usize| subscription(&t[i]);
    update(&mut ck, &mut c, &r, "add two", vec![s(0), s(1)], vec![], Code::Ok, 2).await;
    update(&mut ck, &mut c, &r, "add a third (exactly at the limit)", vec![s(2)], vec![], Code::Ok, 3).await;
    update(&mut ck, &mut c, &r, "add a fourth", vec![s(3)], vec![], re, 3).await;
    update(&mut ck, &mut c, &r, "remove one, add two (would be 4)", vec![s(3), s(4)], vec![t[0].clone()], re, 3).await;
    // t[0] is still stored: re-adding it is a replacement, which fits.
    update(&mut ck, &mut c, &r, "re-add t0 at the limit (replacement, still stored)", vec![s(0)], vec![], Code::Ok, 3)
        .await;
    update(
        &mut ck,
        &mut c,
        &r,
        "remove an unstored topic, add one (would be 4)",
        vec![s(3)],
        vec![t[6].clone()],
        re,
        3,
    )
    .await;
    update(&mut ck, &mut c, &r, "replace one and add one (would be 4)", vec![s(1), s(3)], vec![], re, 3).await;
    update(&mut ck, &mut c, &r, "remove one, add one at the limit", vec![s(3)], vec![t[0].clone()], Code::Ok, 3).await;
    // t[0] is gone now: adding it back would be a fourth.
    update(&mut ck, &mut c, &r, "re-add the removed t0", vec![s(0)], vec![], re, 3).await;
    update(
        &mut ck,
        &mut c,
        &r,
        "remove two, add two at the limit",
        vec![s(4), s(5)],
        vec![t[1].clone(), t[2].clone()],
        Code::Ok,
        3,
    )
    .await;
    update(
        &mut ck,
        &mut c,
        &r,
        "remove all three",
        vec![],
        vec![t[3].clone(), t[4].clone(), t[5].clone()],
        Code::Ok,
        0,
    )
    .await;
    // Admission row 3 comes before the limit.
    let wrong = Recipient { id: r.id.clone(), secret: random_bytes(32) };
    let four: Vec<pb::Subscription> = (0..4).map(|_| subscription(&group_topic())).collect();
    ck.code(
        "wrong secret with four adds",
        c.update_subscriptions(wrong.update(four, vec![])).await,
        Code::PermissionDenied,
    );
    let after = count(&mut ck, &mut c, &r, "after the wrong secret").await;
    ck.eq("count after the wrong secret", after, Some(0));

    ck.finish("PUSH-217, max_push_topics = 3", &fanout.log());
}
