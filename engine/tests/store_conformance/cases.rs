//! The conformance suite every `Store` backend must pass (DESIGN.md, storage).
//! It uses only the engine's public API, so it lives here, outside the
//! library.
//!
//! Each case takes a fresh, empty store made with [`SHARD_COUNT`] shards and
//! panics on the first violation. A backend's tests call [`run_all`] with a
//! factory, or each case on its own for separate test names
//! ([`for_each_case!`]).

mod gateway;
mod parked;

use std::future::Future;

pub use self::gateway::*;
pub use self::parked::*;

use fanout_engine::domain::{
    Answered, Channel, DeliveryTarget, EnvelopeKind, KeyWindow, NewEnvelope, Partly, Recipient, RecipientId,
    RecipientSecret, RecipientSummary, RelayClaim, RelayKey, RelaySettled, SecretHash, SenderHmac, SequenceRefusal,
    ShardId, ShardProgress, SigningKey, StoredEnvelope, StoredSubscription, Subscriber, Subscription,
    SubscriptionUpdate, Topic, WebhookUrl,
};
use fanout_engine::store::{Appended, RegistrationRemoval, ShardPosition, Store, StoreError};

/// The shard count the factory given to the suite must use.
pub const SHARD_COUNT: u16 = 16;

/// Generous topic limit for cases that do not test PUSH-217.
const NO_LIMIT: u64 = 100_000;

/// Runs every case, each on a fresh store from `make`.
pub async fn run_all<S, F, Fut>(make: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    macro_rules! run_each {
        ($($case:ident),* $(,)?) => {$( $case(&make().await).await; )*};
    }
    for_each_case!(run_each);
}

/// Calls macro `$m` with the name of every conformance case, so each backend's
/// tests list them once: `cases::for_each_case!(my_test_macro);`.
macro_rules! for_each_case {
    ($m:ident) => {
        $m!(
            register_creates_and_renews,
            secret_mismatch_changes_nothing,
            unknown_recipient_is_not_found,
            unregister_deletes_subscriptions,
            update_applies_adds_and_removes_together,
            replace_keeps_start_position,
            topic_limit_applies_nothing,
            key_window_round_trip,
            compare_and_delete,
            delete_expired_boundary,
            append_allocates_per_shard,
            publisher_sequence_ids,
            non_eligible_envelopes_only_move_the_boundary,
            suppression_data_only_with_32_byte_hmac,
            relay_metadata_round_trips,
            relay_registration_round_trips_and_compare_and_deletes,
            relay_compare_and_delete_compares_provider_and_token_only,
            removing_a_relay_registration_keeps_the_device_and_its_subscriptions,
            webpush_subscription_round_trips_and_compare_and_deletes,
            read_window_range_and_limit,
            advance_checkpoint_forward_and_prunes,
            shard_progress_is_kept_per_shard_and_replaced,
            subscribers_paging,
            subscribers_large_pages,
            subscribers_carry_the_latest_registration,
            relay_claim_settle_and_release,
            relay_claims_expire_and_are_taken_over,
            relay_concurrent_claims_have_one_winner,
            gateway_register_supersedes,
            gateway_concurrent_registers_leave_one_route,
            gateway_unregister_and_expiry,
            gateway_dead_token_mark,
            gateway_notify_records,
            gateway_concurrent_notify_claims_have_one_winner,
            gateway_wakeups_are_leased,
            gateway_state_compare_and_set,
            gateway_state_replaces_a_value_expired_but_still_held,
            parked_deliveries_are_read_in_key_order,
            parked_deliveries_are_kept_per_shard_and_channel,
            parking_again_replaces_and_unpark_deletes_only_its_keys,
            parked_deliveries_round_trip_every_field,
            parking_refuses_what_no_owner_could_drain,
            concurrent_writes_all_land,
            a_refused_write_among_concurrent_ones_fails_alone,
        );
    };
}
pub(crate) use for_each_case;

// ---- helpers ----

fn rid(n: u8) -> RecipientId {
    RecipientId::from_bytes([n; 32])
}

fn secret(n: u8) -> SecretHash {
    RecipientSecret::parse(&[n; 32]).unwrap().hash()
}

fn apns(token: &str) -> DeliveryTarget {
    DeliveryTarget::Apns { token: token.into() }
}

fn fcm(token: &str) -> DeliveryTarget {
    DeliveryTarget::Fcm { token: token.into() }
}

fn http(url: &str, key: u8) -> DeliveryTarget {
    DeliveryTarget::Http { url: WebhookUrl::parse(url).unwrap(), signing_key: SigningKey::parse(&[key; 32]).unwrap() }
}

fn topic(bytes: &[u8]) -> Topic {
    Topic::parse(bytes).unwrap()
}

/// Shard `n` of `SHARD_COUNT`.
fn shard_id(n: u16) -> ShardId {
    ShardId::parse(n, SHARD_COUNT).expect("below SHARD_COUNT")
}

/// A group-message topic.
fn group(n: u8) -> Topic {
    topic(&[0, n])
}

/// The `n`th topic (from 0) of kind byte `kind` that falls in `shard`.
fn topic_in_shard(kind: u8, shard: u16, n: usize) -> Topic {
    (0..=u16::MAX)
        .map(|i| topic(&[kind, (i >> 8) as u8, i as u8]))
        .filter(|t| t.shard(SHARD_COUNT) == shard_id(shard))
        .nth(n)
        .expect("enough topics in every shard")
}

fn sub(topic: &Topic) -> Subscription {
    Subscription { topic: topic.clone(), keys: None, include_commits: false }
}

fn window(base: i64, fill: u8) -> KeyWindow {
    KeyWindow::parse(base, &[vec![fill; 42], vec![fill.wrapping_add(1); 42]]).unwrap().unwrap()
}

fn update(adds: Vec<Subscription>, removes: Vec<Topic>) -> SubscriptionUpdate {
    SubscriptionUpdate::new(adds, removes).unwrap()
}

fn envelope(
    topic: &Topic,
    kind: EnvelopeKind,
    should_push: bool,
    sender_hmac: Vec<u8>,
    data: Vec<u8>,
    sequence_id: Option<u64>,
) -> NewEnvelope {
    let sender_hmac = SenderHmac::parse(&sender_hmac);
    NewEnvelope::new(topic.clone(), SHARD_COUNT, kind, should_push, sender_hmac, data, sequence_id).unwrap()
}

/// A push-eligible application message with a fanout-allocated id.
fn app(topic: &Topic) -> NewEnvelope {
    envelope(topic, EnvelopeKind::Application, true, vec![], vec![], None)
}

fn stored(ids: impl IntoIterator<Item = u64>) -> Vec<Appended> {
    ids.into_iter().map(|sequence_id| Appended::Stored { sequence_id }).collect()
}

fn seq_ids(window: &[StoredEnvelope]) -> Vec<u64> {
    window.iter().map(|e| e.sequence_id).collect()
}

fn topics_of(subs: &[StoredSubscription]) -> Vec<Topic> {
    subs.iter().map(|s| s.subscription.topic.clone()).collect()
}

async fn subscribe<S: Store>(
    store: &S,
    id: &RecipientId,
    hash: &SecretHash,
    adds: Vec<Subscription>,
    now_ns: i64,
) -> RecipientSummary {
    store.update_subscriptions(id, hash, &update(adds, vec![]), now_ns, NO_LIMIT).await.unwrap()
}

/// Every subscriber id of a topic, in one large page.
async fn subscriber_ids<S: Store>(store: &S, topic: &Topic) -> Vec<RecipientId> {
    let page: Vec<Subscriber> = store.subscribers(topic, None, 10_000).await.unwrap();
    page.iter().map(|s| s.recipient.id).collect()
}

async fn position<S: Store>(store: &S, shard: u16) -> ShardPosition {
    store.shard_position(shard_id(shard)).await.unwrap()
}

async fn window_ids<S: Store>(store: &S, shard: u16, after: u64, up_to: u64, limit: usize) -> Vec<u64> {
    seq_ids(&store.read_window(shard_id(shard), after, up_to, limit).await.unwrap())
}

// ---- recipients ----

/// PUSH-255: Register creates with no subscriptions, renews keeping them, and
/// reports the stored count, channel and renewal time.
pub async fn register_creates_and_renews<S: Store>(store: &S) {
    assert!(!store.backend_name().is_empty());
    let (a, h) = (rid(1), secret(1));
    assert_eq!(store.recipient(&a).await.unwrap(), None);

    let s = store.register(&a, &h, &apns("t1"), 100).await.unwrap();
    assert_eq!(s, RecipientSummary { topic_count: 0, channel: Channel::Apns, renewed_at_ns: 100 });
    let r = store.recipient(&a).await.unwrap().expect("created");
    assert_eq!(r, Recipient { id: a, secret_hash: h, target: apns("t1"), renewed_at_ns: 100, topic_count: 0 });
    assert!(store.subscriptions(&a).await.unwrap().is_empty());

    let s = subscribe(store, &a, &h, vec![sub(&group(1)), sub(&group(2))], 150).await;
    assert_eq!(s, RecipientSummary { topic_count: 2, channel: Channel::Apns, renewed_at_ns: 150 });

    // A token refresh keeps the subscriptions.
    let s = store.register(&a, &h, &fcm("t2"), 200).await.unwrap();
    assert_eq!(s, RecipientSummary { topic_count: 2, channel: Channel::Fcm, renewed_at_ns: 200 });
    let r = store.recipient(&a).await.unwrap().unwrap();
    assert_eq!(r, Recipient { id: a, secret_hash: h, target: fcm("t2"), renewed_at_ns: 200, topic_count: 2 });
    assert_eq!(topics_of(&store.subscriptions(&a).await.unwrap()), vec![group(1), group(2)]);
    assert_eq!(subscriber_ids(store, &group(1)).await, vec![a]);

    let s = store.register(&a, &h, &http("https://example.com/hook", 3), 300).await.unwrap();
    assert_eq!(s, RecipientSummary { topic_count: 2, channel: Channel::Http, renewed_at_ns: 300 });
    assert_eq!(store.recipient(&a).await.unwrap().unwrap().target, http("https://example.com/hook", 3));

    // Another recipient is independent.
    let s = store.register(&rid(2), &secret(2), &apns("t3"), 400).await.unwrap();
    assert_eq!(s.topic_count, 0);
    assert_eq!(store.recipient(&a).await.unwrap().unwrap().renewed_at_ns, 300);
}

/// PUSH-253 check 3: a wrong secret fails every mutating call and changes nothing.
pub async fn secret_mismatch_changes_nothing<S: Store>(store: &S) {
    let (a, h, wrong) = (rid(1), secret(1), secret(2));
    store.register(&a, &h, &apns("t1"), 100).await.unwrap();
    subscribe(store, &a, &h, vec![sub(&group(1))], 110).await;
    let before = store.recipient(&a).await.unwrap().unwrap();

    let r = store.register(&a, &wrong, &apns("evil"), 200).await;
    assert!(matches!(r, Err(StoreError::SecretMismatch)), "register: {r:?}");
    let r = store.unregister(&a, &wrong).await;
    assert!(matches!(r, Err(StoreError::SecretMismatch)), "unregister: {r:?}");
    let r = store.update_subscriptions(&a, &wrong, &update(vec![sub(&group(2))], vec![group(1)]), 300, NO_LIMIT).await;
    assert!(matches!(r, Err(StoreError::SecretMismatch)), "update: {r:?}");

    assert_eq!(store.recipient(&a).await.unwrap(), Some(before));
    assert_eq!(topics_of(&store.subscriptions(&a).await.unwrap()), vec![group(1)]);
    assert_eq!(subscriber_ids(store, &group(1)).await, vec![a]);
    assert!(subscriber_ids(store, &group(2)).await.is_empty());
}

/// PUSH-253: unknown recipients are NotFound and nothing is created.
pub async fn unknown_recipient_is_not_found<S: Store>(store: &S) {
    store.register(&rid(1), &secret(1), &apns("t1"), 100).await.unwrap();
    let unknown = rid(7);
    let r = store.unregister(&unknown, &secret(7)).await;
    assert!(matches!(r, Err(StoreError::NotFound)), "unregister: {r:?}");
    let r =
        store.update_subscriptions(&unknown, &secret(7), &update(vec![sub(&group(1))], vec![]), 200, NO_LIMIT).await;
    assert!(matches!(r, Err(StoreError::NotFound)), "update: {r:?}");
    assert_eq!(store.recipient(&unknown).await.unwrap(), None);
    assert!(store.subscriptions(&unknown).await.unwrap().is_empty());
    assert!(subscriber_ids(store, &group(1)).await.is_empty());
}

/// PUSH-207: Unregister deletes the recipient and every subscription.
pub async fn unregister_deletes_subscriptions<S: Store>(store: &S) {
    let (a, b) = (rid(1), rid(2));
    for (id, n) in [(a, 1), (b, 2)] {
        store.register(&id, &secret(n), &apns("t"), 100).await.unwrap();
        subscribe(store, &id, &secret(n), vec![sub(&group(1)), sub(&group(2))], 110).await;
    }
    assert_eq!(subscriber_ids(store, &group(1)).await, vec![a, b]);

    store.unregister(&a, &secret(1)).await.unwrap();
    assert_eq!(store.recipient(&a).await.unwrap(), None);
    assert!(store.subscriptions(&a).await.unwrap().is_empty());
    assert_eq!(subscriber_ids(store, &group(1)).await, vec![b]);
    assert_eq!(subscriber_ids(store, &group(2)).await, vec![b]);
    assert!(matches!(store.unregister(&a, &secret(1)).await, Err(StoreError::NotFound)));

    // Registering again starts with no subscriptions.
    let s = store.register(&a, &secret(1), &apns("t"), 200).await.unwrap();
    assert_eq!(s.topic_count, 0);
    assert!(store.subscriptions(&a).await.unwrap().is_empty());
}

// ---- subscriptions ----

/// PUSH-216: adds and removes apply together; removing an unknown topic is a
/// no-op; subscriptions come back in topic order; PUSH-255 renewal and count.
pub async fn update_applies_adds_and_removes_together<S: Store>(store: &S) {
    let (a, h) = (rid(1), secret(1));
    store.register(&a, &h, &apns("t"), 100).await.unwrap();
    let welcome = topic(&[1, 0]);
    let longer = topic(&[0, 2, 5]);
    let adds = vec![sub(&welcome), sub(&group(3)), sub(&group(1)), sub(&longer), sub(&group(2))];
    let s = subscribe(store, &a, &h, adds, 110).await;
    assert_eq!(s, RecipientSummary { topic_count: 5, channel: Channel::Apns, renewed_at_ns: 110 });
    // In topic order (byte order).
    assert_eq!(
        topics_of(&store.subscriptions(&a).await.unwrap()),
        vec![group(1), group(2), longer.clone(), group(3), welcome.clone()]
    );

    let u = update(vec![sub(&group(4))], vec![group(1), group(9), welcome.clone()]);
    let s = store.update_subscriptions(&a, &h, &u, 120, NO_LIMIT).await.unwrap();
    assert_eq!(s, RecipientSummary { topic_count: 4, channel: Channel::Apns, renewed_at_ns: 120 });
    assert_eq!(topics_of(&store.subscriptions(&a).await.unwrap()), vec![group(2), longer.clone(), group(3), group(4)]);
    let r = store.recipient(&a).await.unwrap().unwrap();
    assert_eq!((r.topic_count, r.renewed_at_ns), (4, 120));
    assert!(subscriber_ids(store, &group(1)).await.is_empty());
    assert!(subscriber_ids(store, &welcome).await.is_empty());
    assert_eq!(subscriber_ids(store, &group(4)).await, vec![a]);

    // An empty update only renews.
    let s = store.update_subscriptions(&a, &h, &SubscriptionUpdate::default(), 130, NO_LIMIT).await.unwrap();
    assert_eq!(s, RecipientSummary { topic_count: 4, channel: Channel::Apns, renewed_at_ns: 130 });
}

/// PUSH-216: a replaced topic keeps its start position and takes the new keys
/// and include_commits; a new topic starts at its shard's current boundary.
pub async fn replace_keeps_start_position<S: Store>(store: &S) {
    let (a, h) = (rid(1), secret(1));
    let t = topic_in_shard(0, 3, 0);
    let t_same = topic_in_shard(0, 3, 1);
    let t_other = topic_in_shard(0, 5, 0);
    store.register(&a, &h, &apns("t"), 100).await.unwrap();

    store.append(&[app(&t), app(&t), app(&t)], 1).await.unwrap();
    assert_eq!(position(store, 3).await.boundary, 3);
    subscribe(store, &a, &h, vec![sub(&t)], 110).await;
    store.append(&[app(&t_same), app(&t)], 2).await.unwrap();
    assert_eq!(position(store, 3).await.boundary, 5);

    let replaced = Subscription { topic: t.clone(), keys: Some(window(10, 1)), include_commits: true };
    let s = subscribe(store, &a, &h, vec![replaced.clone(), sub(&t_same), sub(&t_other)], 120).await;
    assert_eq!(s.topic_count, 3);
    let subs = store.subscriptions(&a).await.unwrap();
    let find = |topic: &Topic| subs.iter().find(|s| s.subscription.topic == *topic).cloned().unwrap();
    assert_eq!(find(&t), StoredSubscription { subscription: replaced.clone(), start_position: 3 });
    assert_eq!(find(&t_same), StoredSubscription { subscription: sub(&t_same), start_position: 5 });
    assert_eq!(find(&t_other), StoredSubscription { subscription: sub(&t_other), start_position: 0 });

    // Dispatch sees the replaced subscription.
    let page = store.subscribers(&t, None, 10).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].subscription, StoredSubscription { subscription: replaced, start_position: 3 });

    // Removed and added again later: a new subscription, at the boundary of then.
    store.update_subscriptions(&a, &h, &update(vec![], vec![t.clone()]), 130, NO_LIMIT).await.unwrap();
    store.append(&[app(&t)], 3).await.unwrap();
    subscribe(store, &a, &h, vec![sub(&t)], 140).await;
    let subs = store.subscriptions(&a).await.unwrap();
    let again = subs.iter().find(|s| s.subscription.topic == t).unwrap();
    assert_eq!(again.start_position, 6);
}

/// PUSH-217: over the limit, neither adds nor removes nor the renewal apply.
pub async fn topic_limit_applies_nothing<S: Store>(store: &S) {
    let (a, h) = (rid(1), secret(1));
    store.register(&a, &h, &apns("t"), 10).await.unwrap();
    let u = update(vec![sub(&group(1)), sub(&group(2)), sub(&group(3))], vec![]);
    let s = store.update_subscriptions(&a, &h, &u, 20, 3).await.unwrap();
    assert_eq!(s.topic_count, 3, "exactly the limit is allowed");

    let u = update(vec![sub(&group(4)), sub(&group(5))], vec![group(1)]);
    let r = store.update_subscriptions(&a, &h, &u, 30, 3).await;
    assert!(matches!(r, Err(StoreError::TopicLimit)), "{r:?}");
    assert_eq!(topics_of(&store.subscriptions(&a).await.unwrap()), vec![group(1), group(2), group(3)]);
    let r = store.recipient(&a).await.unwrap().unwrap();
    assert_eq!((r.topic_count, r.renewed_at_ns), (3, 20), "no renewal on TopicLimit");
    assert_eq!(subscriber_ids(store, &group(1)).await, vec![a]);
    assert!(subscriber_ids(store, &group(4)).await.is_empty());

    // Replacing does not count twice; a remove makes room for an add.
    let replaced = Subscription { topic: group(2), keys: None, include_commits: true };
    let s = store.update_subscriptions(&a, &h, &update(vec![replaced], vec![]), 40, 3).await.unwrap();
    assert_eq!(s.topic_count, 3);
    let s = store.update_subscriptions(&a, &h, &update(vec![sub(&group(4))], vec![group(1)]), 50, 3).await.unwrap();
    assert_eq!((s.topic_count, s.renewed_at_ns), (3, 50));
    assert_eq!(topics_of(&store.subscriptions(&a).await.unwrap()), vec![group(2), group(3), group(4)]);

    let r = store.update_subscriptions(&a, &h, &update(vec![sub(&group(5))], vec![]), 60, 3).await;
    assert!(matches!(r, Err(StoreError::TopicLimit)), "{r:?}");
    assert_eq!(store.recipient(&a).await.unwrap().unwrap().renewed_at_ns, 50);
}

/// Group commit: many writers at once, of every kind, each
/// answered with its own result and all of them stored; appends to one
/// shard from concurrent publishes get distinct, gap-free ids.
pub async fn concurrent_writes_all_land<S: Store>(store: &S) {
    const N: u8 = 120;
    let registers =
        (0..N).map(|n| async move { store.register(&rid(n), &secret(n), &apns(&format!("t{n}")), 10).await });
    for summary in futures::future::join_all(registers).await {
        assert_eq!(summary.unwrap().topic_count, 0);
    }
    let t = group(1);
    let t = &t;
    let updates = (0..N).map(|n| async move {
        store.update_subscriptions(&rid(n), &secret(n), &update(vec![sub(t)], vec![]), 20, NO_LIMIT).await
    });
    let appends = (0..N).map(|_| async move { store.append(&[app(t)], 30).await });
    let (updates, appends) =
        futures::future::join(futures::future::join_all(updates), futures::future::join_all(appends)).await;
    assert!(updates.iter().all(|s| s.as_ref().is_ok_and(|s| s.topic_count == 1)), "{updates:?}");
    let mut ids: Vec<u64> = appends
        .into_iter()
        .map(|a| match a.unwrap()[..] {
            [Appended::Stored { sequence_id }] => sequence_id,
            ref other => panic!("{other:?}"),
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=u64::from(N)).collect::<Vec<_>>(), "one id each, no gap");
    let mut subscribers = subscriber_ids(store, &t).await;
    subscribers.sort();
    assert_eq!(subscribers, (0..N).map(rid).collect::<Vec<_>>());
    assert_eq!(store.shard_position(t.shard(SHARD_COUNT)).await.unwrap().boundary, u64::from(N));
}

/// Group commit: a refused write among concurrent ones (a wrong
/// secret, the topic limit) gets its own error, changes nothing, and fails
/// none of the writes it may have shared a transaction with.
pub async fn a_refused_write_among_concurrent_ones_fails_alone<S: Store>(store: &S) {
    const N: u8 = 90;
    for n in 0..N {
        store.register(&rid(n), &secret(n), &apns("t"), 10).await.unwrap();
    }
    let two = || update(vec![sub(&group(1)), sub(&group(2))], vec![]);
    let calls = (0..N).map(|n| {
        let two = two();
        async move {
            match n % 3 {
                0 => store.update_subscriptions(&rid(n), &secret(n.wrapping_add(1)), &two, 20, NO_LIMIT).await,
                1 => store.update_subscriptions(&rid(n), &secret(n), &two, 20, 1).await,
                _ => store.update_subscriptions(&rid(n), &secret(n), &two, 20, NO_LIMIT).await,
            }
        }
    });
    let results = futures::future::join_all(calls).await;
    for (n, result) in (0..N).zip(results) {
        let (topics, renewed) = match n % 3 {
            0 => {
                assert!(matches!(result, Err(StoreError::SecretMismatch)), "{n}: {result:?}");
                (vec![], 10)
            }
            1 => {
                assert!(matches!(result, Err(StoreError::TopicLimit)), "{n}: {result:?}");
                (vec![], 10)
            }
            _ => {
                assert_eq!(result.unwrap().topic_count, 2, "{n}");
                (vec![group(1), group(2)], 20)
            }
        };
        assert_eq!(topics_of(&store.subscriptions(&rid(n)).await.unwrap()), topics, "{n}");
        let r = store.recipient(&rid(n)).await.unwrap().unwrap();
        assert_eq!((r.topic_count, r.renewed_at_ns), (topics.len() as u64, renewed), "{n}");
    }
    let mut subscribers = subscriber_ids(store, &group(2)).await;
    subscribers.sort();
    assert_eq!(subscribers, (0..N).filter(|n| n % 3 == 2).map(rid).collect::<Vec<_>>());
}

/// Section 3: a key window round-trips exactly; without keys none is stored.
pub async fn key_window_round_trip<S: Store>(store: &S) {
    let (a, h) = (rid(1), secret(1));
    store.register(&a, &h, &apns("t"), 100).await.unwrap();
    assert_eq!(KeyWindow::parse(7, &[]).unwrap(), None);
    let three = KeyWindow::parse(7, &[vec![1; 42], vec![2; 42], vec![3; 42]]).unwrap().unwrap();
    let with_keys = Subscription { topic: group(2), keys: Some(three), include_commits: true };
    subscribe(store, &a, &h, vec![sub(&group(1)), with_keys.clone()], 110).await;
    let subs = store.subscriptions(&a).await.unwrap();
    assert_eq!(subs[0].subscription, sub(&group(1)));
    assert_eq!(subs[1].subscription, with_keys);

    // Replaced without keys: the window is gone.
    subscribe(store, &a, &h, vec![sub(&group(2))], 120).await;
    let subs = store.subscriptions(&a).await.unwrap();
    assert_eq!(subs[1].subscription.keys, None);
    assert!(!subs[1].subscription.include_commits);
}

/// PUSH-234: delete only when target and secret hash still match; renewal
/// time and topic count do not matter.
pub async fn compare_and_delete<S: Store>(store: &S) {
    let (a, h) = (rid(1), secret(1));
    store.register(&a, &h, &http("https://a.example/hook", 1), 100).await.unwrap();
    subscribe(store, &a, &h, vec![sub(&group(1))], 110).await;
    let expected = store.recipient(&a).await.unwrap().unwrap();

    store.register(&a, &h, &http("https://b.example/hook", 1), 120).await.unwrap();
    assert!(!store.delete_recipient_if_unchanged(&expected).await.unwrap(), "changed url");
    store.register(&a, &h, &http("https://a.example/hook", 2), 130).await.unwrap();
    assert!(!store.delete_recipient_if_unchanged(&expected).await.unwrap(), "changed signing key");
    assert!(store.recipient(&a).await.unwrap().is_some());

    store.register(&a, &h, &http("https://a.example/hook", 1), 140).await.unwrap();
    let other_secret = Recipient { secret_hash: secret(9), ..expected.clone() };
    assert!(!store.delete_recipient_if_unchanged(&other_secret).await.unwrap(), "changed secret");
    assert_eq!(subscriber_ids(store, &group(1)).await, vec![a]);

    // Same token on another channel is a different target.
    let b = rid(2);
    store.register(&b, &secret(2), &apns("tok"), 100).await.unwrap();
    let expected_b = store.recipient(&b).await.unwrap().unwrap();
    store.register(&b, &secret(2), &fcm("tok"), 110).await.unwrap();
    assert!(!store.delete_recipient_if_unchanged(&expected_b).await.unwrap(), "changed channel");
    assert!(store.recipient(&b).await.unwrap().is_some());

    // Unchanged apart from renewal time and count: deleted with its subscriptions.
    let stale = Recipient { renewed_at_ns: 0, topic_count: 99, ..expected.clone() };
    assert!(store.delete_recipient_if_unchanged(&stale).await.unwrap());
    assert_eq!(store.recipient(&a).await.unwrap(), None);
    assert!(store.subscriptions(&a).await.unwrap().is_empty());
    assert!(subscriber_ids(store, &group(1)).await.is_empty());
    assert!(!store.delete_recipient_if_unchanged(&expected).await.unwrap(), "already gone");
}

/// PUSH-226: recipients renewed strictly before the cutoff go, with their
/// subscriptions; one renewed exactly at the cutoff stays.
pub async fn delete_expired_boundary<S: Store>(store: &S) {
    let (a, b, c) = (rid(1), rid(2), rid(3));
    for (id, n, t) in [(a, 1, 100), (b, 2, 200), (c, 3, 300)] {
        store.register(&id, &secret(n), &apns("t"), t - 50).await.unwrap();
        subscribe(store, &id, &secret(n), vec![sub(&group(1))], t).await;
    }
    assert_eq!(store.delete_expired(200).await.unwrap(), 1);
    assert_eq!(store.recipient(&a).await.unwrap(), None);
    assert!(store.subscriptions(&a).await.unwrap().is_empty());
    assert!(store.recipient(&b).await.unwrap().is_some());
    assert_eq!(subscriber_ids(store, &group(1)).await, vec![b, c]);
    assert_eq!(store.delete_expired(200).await.unwrap(), 0);
    assert_eq!(store.delete_expired(301).await.unwrap(), 2);
    assert!(subscriber_ids(store, &group(1)).await.is_empty());
    assert_eq!(store.delete_expired(i64::MAX).await.unwrap(), 0);
}

// ---- envelopes and shards ----

/// Each shard allocates its own ids, from 1; the boundary follows.
pub async fn append_allocates_per_shard<S: Store>(store: &S) {
    let x1 = topic_in_shard(0, 2, 0);
    let x2 = topic_in_shard(0, 2, 1);
    let y = topic_in_shard(0, 9, 0);
    assert_eq!(position(store, 2).await, ShardPosition::default());
    assert!(store.append(&[], 1).await.unwrap().is_empty());

    let r = store.append(&[app(&x1), app(&y), app(&x2), app(&x1)], 1000).await.unwrap();
    assert_eq!(r, [stored([1]), stored([1]), stored([2, 3])].concat());
    assert_eq!(position(store, 2).await, ShardPosition { boundary: 3, checkpoint: 0 });
    assert_eq!(position(store, 9).await, ShardPosition { boundary: 1, checkpoint: 0 });
    assert_eq!(position(store, 4).await, ShardPosition::default());

    assert_eq!(store.append(&[app(&y)], 1001).await.unwrap(), stored([2]));
    let w = store.read_window(shard_id(2), 0, 3, 10).await.unwrap();
    assert_eq!(seq_ids(&w), vec![1, 2, 3]);
    assert_eq!(w.iter().map(|e| e.topic.clone()).collect::<Vec<_>>(), vec![x1.clone(), x2, x1]);
    assert!(w.iter().all(|e| e.shard == shard_id(2) && e.server_ts_ns == 1000));
}

/// API-286..289 as DESIGN.md states them: a publisher id must exceed the
/// shard's last id; a refused one does not stop the rest of the batch.
pub async fn publisher_sequence_ids<S: Store>(store: &S) {
    let x = topic_in_shard(0, 4, 0);
    let e = |seq: Option<u64>, tag: u8| envelope(&x, EnvelopeKind::Application, true, vec![0; 32], vec![tag], seq);
    assert_eq!(store.append(&[e(Some(5), 5)], 1).await.unwrap(), stored([5]));
    assert_eq!(position(store, 4).await.boundary, 5);
    assert_eq!(
        store.append(&[e(Some(5), 50), e(Some(3), 30)], 2).await.unwrap(),
        vec![Appended::Refused(SequenceRefusal::NotIncreasing { last: 5 }); 2]
    );
    let r =
        store.append(&[e(Some(7), 7), e(Some(6), 60), e(None, 8), e(Some(10), 10), e(Some(10), 100)], 3).await.unwrap();
    assert_eq!(
        r,
        vec![
            Appended::Stored { sequence_id: 7 },
            Appended::Refused(SequenceRefusal::NotIncreasing { last: 7 }),
            Appended::Stored { sequence_id: 8 },
            Appended::Stored { sequence_id: 10 },
            Appended::Refused(SequenceRefusal::NotIncreasing { last: 10 }),
        ]
    );
    assert_eq!(position(store, 4).await, ShardPosition { boundary: 10, checkpoint: 0 });
    let w = store.read_window(shard_id(4), 0, 100, 100).await.unwrap();
    assert_eq!(seq_ids(&w), vec![5, 7, 8, 10]);
    let mut tags = Vec::new();
    for e in &w {
        tags.push(store.envelope_data(shard_id(4), e.sequence_id).await.unwrap().unwrap()[0]);
    }
    assert_eq!(tags, vec![5, 7, 8, 10], "refused ones not stored");
    // An id too far ahead fails alone and leaves the shard usable.
    let far = 10 + fanout_engine::domain::MAX_SEQUENCE_GAP + 1;
    assert_eq!(
        store.append(&[e(Some(far), 1), e(Some(u64::MAX), 2), e(None, 11)], 4).await.unwrap(),
        vec![
            Appended::Refused(SequenceRefusal::TooFarAhead { last: 10 }),
            Appended::Refused(SequenceRefusal::TooFarAhead { last: 10 }),
            Appended::Stored { sequence_id: 11 },
        ]
    );
    assert_eq!(position(store, 4).await.boundary, 11);
}

/// PUSH-219: only push-eligible envelopes are stored, but every envelope takes
/// an id and moves the boundary.
pub async fn non_eligible_envelopes_only_move_the_boundary<S: Store>(store: &S) {
    use EnvelopeKind::*;
    let shard = 6;
    let g = topic_in_shard(0, shard, 0);
    let w = topic_in_shard(1, shard, 0);
    let iu = topic_in_shard(2, shard, 0);
    let kp = topic_in_shard(3, shard, 0);
    let none = |t: &Topic, kind, push| envelope(t, kind, push, vec![], vec![], None);
    let batch = [
        none(&kp, KeyPackage, true),
        none(&g, Application, false),
        none(&g, Application, true),
        none(&g, CommitLog, true),
        none(&iu, IdentityUpdate, true),
        none(&w, Welcome, false),
        none(&g, Commit, false),
        none(&g, Proposal, false),
    ];
    assert_eq!(store.append(&batch, 5).await.unwrap(), stored(1..=8));
    assert_eq!(position(store, shard).await.boundary, 8);
    let window = store.read_window(shard_id(shard), 0, 8, 100).await.unwrap();
    assert_eq!(seq_ids(&window), vec![3, 6, 7, 8]);
    assert_eq!(window.iter().map(|e| e.kind).collect::<Vec<_>>(), vec![Application, Welcome, Commit, Proposal]);
    assert_eq!(window[1].topic, w);
}

/// PUSH-230: sender_hmac and the suppression data are kept only with a
/// 32-byte sender_hmac; a window carries the hmac, never that data (issue
/// 11), which `envelope_data` reads until the checkpoint passes the
/// envelope. A window does carry data of at most MAX_INLINE_DATA bytes, the
/// relay's mls_message (spec 003 §3).
pub async fn suppression_data_only_with_32_byte_hmac<S: Store>(store: &S) {
    let g = topic_in_shard(0, 11, 0);
    let batch = [
        envelope(&g, EnvelopeKind::Application, true, vec![7; 32], b"ciphertext".to_vec(), None),
        envelope(&g, EnvelopeKind::Application, true, vec![7; 31], b"x".to_vec(), None),
        envelope(&g, EnvelopeKind::Application, true, vec![], b"y".to_vec(), None),
        envelope(&g, EnvelopeKind::Commit, false, vec![8; 32], b"z".to_vec(), None),
        envelope(
            &g,
            EnvelopeKind::Application,
            true,
            vec![9; 33],
            vec![1; fanout_engine::domain::MAX_INLINE_DATA + 1],
            None,
        ),
    ];
    store.append(&batch, 12_345).await.unwrap();
    let w = store.read_window(shard_id(11), 0, 5, 10).await.unwrap();
    assert_eq!(
        w[0],
        StoredEnvelope {
            shard: shard_id(11),
            sequence_id: 1,
            topic: g.clone(),
            kind: EnvelopeKind::Application,
            server_ts_ns: 12_345,
            sender_hmac: SenderHmac::parse(&[7; 32]),
            data: b"ciphertext".to_vec(),
            relay: Default::default(),
        }
    );
    let data = |seq: u64| store.envelope_data(shard_id(11), seq);
    assert_eq!(data(1).await.unwrap(), Some(b"ciphertext".to_vec()));
    for (i, inline) in [(1, &b"x"[..]), (2, b"y"), (4, b"")] {
        assert!(w[i].sender_hmac.is_none(), "envelope {i} kept its hmac");
        assert_eq!(w[i].data, inline, "envelope {i}");
        assert_eq!(data(i as u64 + 1).await.unwrap(), None, "envelope {i} kept suppression data");
    }
    assert_eq!((w[3].kind, w[3].sender_hmac), (EnvelopeKind::Commit, SenderHmac::parse(&[8; 32])));
    assert_eq!(data(4).await.unwrap(), Some(b"z".to_vec()));
    assert_eq!(data(99).await.unwrap(), None, "no such envelope");
    assert_eq!(store.envelope_data(shard_id(12), 1).await.unwrap(), None, "another shard's id");
    store.advance_checkpoint(shard_id(11), 1).await.unwrap();
    assert_eq!(data(1).await.unwrap(), None, "pruned with the checkpoint");
    assert_eq!(data(4).await.unwrap(), Some(b"z".to_vec()));
}

/// Spec 003: the publisher's message id and a Commit's membership change
/// are stored with the envelope; absent ones read back absent.
pub async fn relay_metadata_round_trips<S: Store>(store: &S) {
    use fanout_engine::domain::{MembershipChange, MessageId, RelayMeta};
    let g = topic_in_shard(0, 12, 0);
    let mut commit = envelope(&g, EnvelopeKind::Commit, false, vec![], b"c".to_vec(), None);
    let meta = RelayMeta {
        message_id: Some(MessageId::parse("msg-42").unwrap()),
        membership: Some(MembershipChange::MemberRemoved),
    };
    commit.relay = meta.clone();
    let plain = envelope(&g, EnvelopeKind::Application, true, vec![], b"a".to_vec(), None);
    store.append(&[commit, plain], 1).await.unwrap();
    let w = store.read_window(shard_id(12), 0, 5, 10).await.unwrap();
    assert_eq!(w.len(), 2);
    assert_eq!(w[0].relay, meta);
    assert_eq!(w[1].relay, RelayMeta::default());
}

fn relay_target(provider: &str, token: &str, sandbox: Option<bool>, app_id: Option<&str>) -> DeliveryTarget {
    use fanout_engine::domain::{RegistrationInput, RelayRegistration};
    let input = RegistrationInput { provider, token, sandbox, app_id, ..Default::default() };
    DeliveryTarget::Relay(Some(RelayRegistration::parse(input).unwrap()))
}

/// Spec 003 §1: a relay registration is stored whole (optional fields
/// absent or set), and a 404/410 removes it only while it is unchanged.
pub async fn relay_registration_round_trips_and_compare_and_deletes<S: Store>(store: &S) {
    use fanout_engine::domain::{RegistrationInput, RelayRegistration};
    let relay = |token: &str, full: bool| {
        let input = if full {
            RegistrationInput {
                provider: "unifiedpush",
                token,
                app_id: Some("im.g.apps"),
                sandbox: Some(true),
                p256dh: Some("BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQ"),
                auth: Some("tBHItJI5svbpez7KI4CCXg=="),
            }
        } else {
            RegistrationInput { provider: "apns", token, ..Default::default() }
        };
        DeliveryTarget::Relay(Some(RelayRegistration::parse(input).unwrap()))
    };
    let (a, h) = (rid(31), secret(31));
    for full in [true, false] {
        store.register(&a, &h, &relay("tok-1", full), 100).await.unwrap();
        assert_eq!(store.recipient(&a).await.unwrap().unwrap().target, relay("tok-1", full), "full: {full}");
    }
    let sent = store.recipient(&a).await.unwrap().unwrap();
    store.register(&a, &h, &relay("tok-2", false), 110).await.unwrap();
    let invalid = |sent: &Recipient| RegistrationRemoval::Invalid { sent: std::sync::Arc::new(sent.clone()) };
    assert!(!store.remove_relay_registration(&invalid(&sent)).await.unwrap(), "re-registered: kept");
    assert_eq!(store.recipient(&a).await.unwrap().unwrap().target, relay("tok-2", false));
    let current = store.recipient(&a).await.unwrap().unwrap();
    assert!(store.remove_relay_registration(&invalid(&current)).await.unwrap());
    assert_eq!(store.recipient(&a).await.unwrap().unwrap().target, DeliveryTarget::Relay(None));
    assert!(!store.remove_relay_registration(&invalid(&current)).await.unwrap(), "already removed");
}

/// Spec 003 §1, §2.4: a 404/410 removes the registration unless the device
/// registered a different provider or token meanwhile. The same provider
/// and token with only `sandbox` or `app_id` changed is still the dead one.
pub async fn relay_compare_and_delete_compares_provider_and_token_only<S: Store>(store: &S) {
    let (a, h) = (rid(33), secret(33));
    let invalid = |sent: &Recipient| RegistrationRemoval::Invalid { sent: std::sync::Arc::new(sent.clone()) };
    store.register(&a, &h, &relay_target("apns", "tok-1", Some(false), None), 100).await.unwrap();
    let sent = store.recipient(&a).await.unwrap().unwrap();
    store.register(&a, &h, &relay_target("apns", "tok-1", Some(true), Some("im.g.apps")), 110).await.unwrap();
    assert!(store.remove_relay_registration(&invalid(&sent)).await.unwrap(), "only sandbox and app_id changed");
    assert_eq!(store.recipient(&a).await.unwrap().unwrap().target, DeliveryTarget::Relay(None));

    store.register(&a, &h, &relay_target("apns", "tok-1", None, None), 120).await.unwrap();
    let sent = store.recipient(&a).await.unwrap().unwrap();
    store.register(&a, &h, &relay_target("fcm", "tok-1", None, None), 130).await.unwrap();
    assert!(!store.remove_relay_registration(&invalid(&sent)).await.unwrap(), "another provider: kept");
    assert_eq!(store.recipient(&a).await.unwrap().unwrap().target, relay_target("fcm", "tok-1", None, None));
    let other_secret = Recipient { secret_hash: secret(34), ..store.recipient(&a).await.unwrap().unwrap() };
    assert!(!store.remove_relay_registration(&invalid(&other_secret)).await.unwrap(), "another secret: kept");
}

/// Spec 003 §1: DELETE and a 404/410 remove the registration, not the
/// device. Its subscriptions and renewal time stay, it is no longer a
/// dispatch target with a registration, and registering again resumes it
/// with the same subscriptions.
pub async fn removing_a_relay_registration_keeps_the_device_and_its_subscriptions<S: Store>(store: &S) {
    let (a, h) = (rid(35), secret(35));
    let deleted = |h: SecretHash| RegistrationRemoval::Deleted { id: a, secret_hash: h };
    assert!(matches!(store.remove_relay_registration(&deleted(h)).await, Err(StoreError::NotFound)));
    store.register(&a, &h, &relay_target("apns", "tok-1", None, None), 100).await.unwrap();
    subscribe(store, &a, &h, vec![sub(&group(35)), sub(&group(36))], 110).await;
    assert!(matches!(store.remove_relay_registration(&deleted(secret(36))).await, Err(StoreError::SecretMismatch)));
    assert!(store.remove_relay_registration(&deleted(h)).await.unwrap());
    let kept = store.recipient(&a).await.unwrap().unwrap();
    assert_eq!(kept.target, DeliveryTarget::Relay(None));
    assert_eq!((kept.topic_count, kept.renewed_at_ns), (2, 110), "subscriptions and renewal time kept");
    assert_eq!(topics_of(&store.subscriptions(&a).await.unwrap()), vec![group(35), group(36)]);
    let page = store.subscribers(&group(35), None, 10).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].recipient.target, DeliveryTarget::Relay(None), "dispatch sees no registration");
    assert!(!store.remove_relay_registration(&deleted(h)).await.unwrap(), "nothing registered: nothing removed");

    let s = store.register(&a, &h, &relay_target("apns", "tok-2", None, None), 120).await.unwrap();
    assert_eq!((s.topic_count, s.channel), (2, Channel::Relay), "registered again: the same subscriptions");
    let page = store.subscribers(&group(36), None, 10).await.unwrap();
    assert_eq!(page[0].recipient.target, relay_target("apns", "tok-2", None, None));
}

/// A Web Push subscription (endpoint, p256dh, auth) is stored
/// whole, and a 404/410 deletes it only while it is unchanged.
pub async fn webpush_subscription_round_trips_and_compare_and_deletes<S: Store>(store: &S) {
    use base64::Engine as _;
    use fanout_engine::domain::WebPushKeys;
    // RFC 8291 appendix A's user agent key, and an auth secret per case.
    let p256dh = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode("BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4")
        .unwrap();
    let webpush = |endpoint: &str, auth: u8| DeliveryTarget::WebPush {
        endpoint: WebhookUrl::parse(endpoint).unwrap(),
        keys: WebPushKeys::parse(&p256dh, &[auth; 16]).unwrap(),
    };
    let (a, h) = (rid(32), secret(32));
    store.register(&a, &h, &webpush("https://push.example.net/wpush/v2/a", 1), 100).await.unwrap();
    let sent = store.recipient(&a).await.unwrap().unwrap();
    assert_eq!(sent.target, webpush("https://push.example.net/wpush/v2/a", 1));
    // The browser renewed its subscription: new keys, same endpoint.
    store.register(&a, &h, &webpush("https://push.example.net/wpush/v2/a", 2), 110).await.unwrap();
    assert_eq!(store.recipient(&a).await.unwrap().unwrap().target, webpush("https://push.example.net/wpush/v2/a", 2));
    assert!(!store.delete_recipient_if_unchanged(&sent).await.unwrap(), "re-registered: kept");
    let current = store.recipient(&a).await.unwrap().unwrap();
    assert!(store.delete_recipient_if_unchanged(&current).await.unwrap());
    assert!(store.recipient(&a).await.unwrap().is_none());
}

/// read_window: `after < id <= up_to`, ascending, at most `limit`, one shard.
pub async fn read_window_range_and_limit<S: Store>(store: &S) {
    let x = topic_in_shard(0, 7, 0);
    let y = topic_in_shard(0, 8, 0);
    store.append(&vec![app(&x); 10], 1).await.unwrap();
    store.append(&[app(&y), app(&y)], 1).await.unwrap();
    assert_eq!(window_ids(store, 7, 2, 8, 100).await, (3..=8).collect::<Vec<_>>());
    assert_eq!(window_ids(store, 7, 2, 8, 3).await, vec![3, 4, 5]);
    assert_eq!(window_ids(store, 7, 0, 100, 100).await, (1..=10).collect::<Vec<_>>());
    assert!(window_ids(store, 7, 5, 5, 10).await.is_empty());
    assert!(window_ids(store, 7, 8, 2, 10).await.is_empty());
    assert!(window_ids(store, 7, 0, 10, 0).await.is_empty());
    assert_eq!(window_ids(store, 8, 0, 10, 10).await, vec![1, 2]);
    assert!(window_ids(store, 9, 0, 10, 10).await.is_empty());
}

/// The checkpoint only moves forward, never past the boundary, and prunes
/// envelopes at or below it; ids are never reused.
pub async fn advance_checkpoint_forward_and_prunes<S: Store>(store: &S) {
    let x = topic_in_shard(0, 1, 0);
    store.append(&vec![app(&x); 5], 1).await.unwrap();

    store.advance_checkpoint(shard_id(1), 3).await.unwrap();
    assert_eq!(position(store, 1).await, ShardPosition { boundary: 5, checkpoint: 3 });
    assert_eq!(window_ids(store, 1, 0, 5, 10).await, vec![4, 5]);

    store.advance_checkpoint(shard_id(1), 2).await.unwrap();
    assert_eq!(position(store, 1).await, ShardPosition { boundary: 5, checkpoint: 3 }, "never back");

    store.advance_checkpoint(shard_id(1), 100).await.unwrap();
    assert_eq!(position(store, 1).await, ShardPosition { boundary: 5, checkpoint: 5 }, "clamped to boundary");
    assert!(window_ids(store, 1, 0, 5, 10).await.is_empty());

    assert_eq!(store.append(&[app(&x)], 2).await.unwrap(), stored([6]));
    assert_eq!(position(store, 1).await, ShardPosition { boundary: 6, checkpoint: 5 });
    assert_eq!(window_ids(store, 1, 0, 6, 10).await, vec![6]);

    store.advance_checkpoint(shard_id(2), 4).await.unwrap();
    assert_eq!(position(store, 2).await, ShardPosition::default(), "empty shard stays at zero");
}

/// A shard's progress reads back as last recorded, for that shard only, and
/// is empty before any; an invalid shard is refused.
pub async fn shard_progress_is_kept_per_shard_and_replaced<S: Store>(store: &S) {
    assert!(store.shard_progress(shard_id(3)).await.unwrap().is_empty(), "none recorded yet");
    let id = |b: u8| RecipientId::from_bytes([b; 32]);
    let after = Answered::Partly(Partly::upto(id(7)));
    let out_of_order = Partly::new(Some(id(2)), [id(9), id(5)]).map(Answered::Partly);
    let first = ShardProgress::of_window([
        (4, Some(Answered::Whole)),
        (5, Some(Answered::Whole)),
        (6, Some(after.clone())),
        (7, out_of_order),
    ]);
    store.record_progress(shard_id(3), &first).await.unwrap();
    assert_eq!(store.shard_progress(shard_id(3)).await.unwrap(), first);
    assert!(store.shard_progress(shard_id(4)).await.unwrap().is_empty(), "another shard's is its own");
    let second = ShardProgress::of_window([(6, Some(Answered::Whole)), (7, None), (8, Some(after))]);
    store.record_progress(shard_id(3), &second).await.unwrap();
    assert_eq!(store.shard_progress(shard_id(3)).await.unwrap(), second, "replaced, not merged");
    store.record_progress(shard_id(3), &ShardProgress::default()).await.unwrap();
    assert!(store.shard_progress(shard_id(3)).await.unwrap().is_empty());
    let outside = ShardId::parse(SHARD_COUNT, SHARD_COUNT + 1).unwrap();
    assert!(store.record_progress(outside, &first).await.is_err(), "a shard the store does not have");
}

/// subscribers() with pages of tens of subscribers, more than a backend may
/// read in one step (the embedded store reads a page's head on the calling
/// task and the rest on its blocking pool): every page is complete, ordered
/// and ends where the next begins, whatever its size against that step.
pub async fn subscribers_large_pages<S: Store>(store: &S) {
    let t = topic(&[0, 3]);
    // 80 subscribers, the last with the highest id there is.
    let mut ids: Vec<RecipientId> = (1..80u8).map(|b| RecipientId::from_bytes([b * 3; 32])).collect();
    ids.push(RecipientId::from_bytes([0xff; 32]));
    for id in &ids {
        store.register(id, &secret(1), &apns("tok"), 100).await.unwrap();
        subscribe(store, id, &secret(1), vec![sub(&t)], 110).await;
    }
    ids.sort();
    for size in [1, 31, 32, 33, 64, 79, 80, 81, 1000] {
        let mut seen = Vec::new();
        let mut after: Option<RecipientId> = None;
        loop {
            let page = store.subscribers(&t, after.as_ref(), size).await.unwrap();
            assert!(page.len() <= size, "page of {size}: {} rows", page.len());
            seen.extend(page.iter().map(|s| s.recipient.id));
            if page.len() < size {
                break; // a short page is the last one
            }
            after = page.last().map(|s| s.recipient.id);
        }
        assert_eq!(seen, ids, "pages of {size}: every subscriber once, in id order");
    }
}

/// subscribers() joins each subscriber with its recipient as stored now: a
/// re-registration's new target is what the next page carries, however
/// often the old one was read (a backend may keep decoded records).
pub async fn subscribers_carry_the_latest_registration<S: Store>(store: &S) {
    let t = topic(&[0, 4]);
    let id = rid(1);
    let targets = |page: Vec<Subscriber>| page.into_iter().map(|s| s.recipient.target.clone()).collect::<Vec<_>>();
    store.register(&id, &secret(1), &apns("first"), 100).await.unwrap();
    subscribe(store, &id, &secret(1), vec![sub(&t)], 110).await;
    for _ in 0..3 {
        assert_eq!(targets(store.subscribers(&t, None, 10).await.unwrap()), vec![apns("first")]);
    }
    store.register(&id, &secret(1), &apns("second"), 120).await.unwrap();
    let page = store.subscribers(&t, None, 10).await.unwrap();
    assert_eq!(Some(&*page[0].recipient), store.recipient(&id).await.unwrap().as_ref());
    assert_eq!(targets(page), vec![apns("second")]);
}

/// subscribers(): ordered by recipient id, each exactly once across pages,
/// joined with the recipient, only the asked topic.
pub async fn subscribers_paging<S: Store>(store: &S) {
    let t = topic(&[0, 1]);
    // A longer topic whose bytes start with `t`'s must not leak into its pages.
    let t_longer = topic(&[0, 1, 1]);
    let mut ids =
        [0x80, 0x01, 0xff, 0x00, 0x7f, 0x40].into_iter().map(|b| RecipientId::from_bytes([b; 32])).collect::<Vec<_>>();
    let mut last_differs = [0x40; 32];
    last_differs[31] = 0x41;
    ids.push(RecipientId::from_bytes(last_differs));
    for (i, id) in ids.iter().enumerate() {
        store.register(id, &secret(1), &apns(&format!("tok-{i}")), 100).await.unwrap();
        subscribe(store, id, &secret(1), vec![sub(&t)], 110).await;
    }
    let only_longer = RecipientId::from_bytes([0x50; 32]);
    store.register(&only_longer, &secret(1), &apns("x"), 100).await.unwrap();
    subscribe(store, &only_longer, &secret(1), vec![sub(&t_longer)], 110).await;
    subscribe(store, &ids[0], &secret(1), vec![sub(&t_longer)], 120).await;

    let mut expected = ids.clone();
    expected.sort();
    let mut seen = Vec::new();
    let mut after: Option<RecipientId> = None;
    let mut pages = 0;
    loop {
        let page = store.subscribers(&t, after.as_ref(), 3).await.unwrap();
        if page.is_empty() {
            break;
        }
        pages += 1;
        assert!(page.len() <= 3);
        for s in &page {
            assert_eq!(s.subscription.subscription.topic, t);
            assert_eq!(s.subscription.start_position, 0);
            assert_eq!(Some(&*s.recipient), store.recipient(&s.recipient.id).await.unwrap().as_ref());
            seen.push(s.recipient.id);
        }
        after = Some(page.last().unwrap().recipient.id);
    }
    assert_eq!(seen, expected, "every subscriber once, in id order");
    assert_eq!(pages, 3);
    assert!(store.subscribers(&t, None, 0).await.unwrap().is_empty());
    assert!(store.subscribers(&t, Some(&RecipientId::from_bytes([0xff; 32])), 10).await.unwrap().is_empty());

    // `after` need not be a subscriber itself.
    let page = store.subscribers(&t, Some(&RecipientId::from_bytes([0x41; 32])), 10).await.unwrap();
    let tail: Vec<_> = expected.iter().copied().filter(|id| *id.as_bytes() > [0x41; 32]).collect();
    assert_eq!(page.iter().map(|s| s.recipient.id).collect::<Vec<_>>(), tail);

    let mut longer = vec![only_longer, ids[0]];
    longer.sort();
    assert_eq!(subscriber_ids(store, &t_longer).await, longer);
    assert!(subscriber_ids(store, &topic(&[0, 2])).await.is_empty());
}

// ---- spec 003 §2.5: the relay ingress's delivery records ----

fn relay_key(hub: &str, n: u8) -> RelayKey {
    RelayKey { hub_id: hub.into(), delivery_id: format!("{n:032x}") }
}

/// What the relay and gateway stores' `delete_expired` answered, with
/// `expired` records past their expiry. redb deletes each itself and counts
/// it. ScyllaDB writes every such record with a TTL ending at its expiry, so
/// the database drops it on its own and retention deletes none: what TTL
/// guarantees is that the record is not read once expired, which each case
/// checks before pruning, never that it is gone by a given time.
fn assert_pruned<S: Store>(store: &S, deleted: u64, expired: u64) {
    match store.backend_name() {
        "redb" => assert_eq!(deleted, expired, "redb deletes and counts each expired record"),
        "scylla" => assert_eq!(deleted, 0, "ScyllaDB's TTL drops expired records; retention deletes none"),
        other => panic!("no expiry contract for backend {other}"),
    }
}

/// A time well ahead of every backend's clock-based TTL arithmetic: the
/// cases pass explicit times, as the ingress does, 1 h apart.
fn base_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

const HOUR_MS: i64 = 3_600_000;

pub async fn relay_claim_settle_and_release<S: Store>(store: &S) {
    let now = base_ms();
    let (lease, expires) = (now + 30_000, now + 24 * HOUR_MS);
    let k = relay_key("hub-a", 1);
    assert_eq!(store.relay().claim(&k, now, lease, expires).await.unwrap(), RelayClaim::Claimed);
    // A second request while the claim is held.
    let busy = store.relay().claim(&k, now + 1, now + 40_000, expires).await.unwrap();
    assert_eq!(busy, RelayClaim::Busy { lease_until_ms: lease });
    // Settling with another lease is not this claim: nothing changes.
    store.relay().settle(&k, lease + 1, RelaySettled::Delivered, expires).await.unwrap();
    assert!(matches!(store.relay().claim(&k, now + 2, now + 40_000, expires).await.unwrap(), RelayClaim::Busy { .. }));
    store.relay().settle(&k, lease, RelaySettled::Delivered, expires).await.unwrap();
    for _ in 0..2 {
        let again = store.relay().claim(&k, now + 3, now + 40_000, expires).await.unwrap();
        assert_eq!(again, RelayClaim::Settled(RelaySettled::Delivered));
    }
    // A settled record is not released.
    store.relay().release(&k, lease).await.unwrap();
    assert_eq!(
        store.relay().claim(&k, now + 4, now + 40_000, expires).await.unwrap(),
        RelayClaim::Settled(RelaySettled::Delivered)
    );

    // Gone and Rejected are kept as such.
    for (n, settled) in [(2, RelaySettled::Gone), (3, RelaySettled::Rejected)] {
        let k = relay_key("hub-a", n);
        assert_eq!(store.relay().claim(&k, now, lease, expires).await.unwrap(), RelayClaim::Claimed);
        store.relay().settle(&k, lease, settled, expires).await.unwrap();
        assert_eq!(store.relay().claim(&k, now + 1, lease, expires).await.unwrap(), RelayClaim::Settled(settled));
    }

    // Release: only the holder's own claim, and then the id is free again.
    let k = relay_key("hub-a", 4);
    assert_eq!(store.relay().claim(&k, now, lease, expires).await.unwrap(), RelayClaim::Claimed);
    store.relay().release(&k, lease + 1).await.unwrap();
    assert!(matches!(store.relay().claim(&k, now + 1, lease, expires).await.unwrap(), RelayClaim::Busy { .. }));
    store.relay().release(&k, lease).await.unwrap();
    assert_eq!(store.relay().claim(&k, now + 2, now + 50_000, expires).await.unwrap(), RelayClaim::Claimed);

    // The same delivery_id from another hub is another delivery.
    assert_eq!(store.relay().claim(&relay_key("hub-b", 1), now, lease, expires).await.unwrap(), RelayClaim::Claimed);
}

pub async fn relay_claims_expire_and_are_taken_over<S: Store>(store: &S) {
    let now = base_ms();
    let k = relay_key("hub-a", 7);
    let (lease, expires) = (now + 30_000, now + 2 * HOUR_MS);
    assert_eq!(store.relay().claim(&k, now, lease, expires).await.unwrap(), RelayClaim::Claimed);
    // The holder died: once its lease ran out, the next request takes over.
    let later = lease + 1;
    assert_eq!(store.relay().claim(&k, later, later + 30_000, expires).await.unwrap(), RelayClaim::Claimed);
    // The dead holder's settle or release no longer applies.
    store.relay().release(&k, lease).await.unwrap();
    store.relay().settle(&k, lease, RelaySettled::Gone, expires).await.unwrap();
    assert_eq!(
        store.relay().claim(&k, later + 1, later + 60_000, expires).await.unwrap(),
        RelayClaim::Busy { lease_until_ms: later + 30_000 }
    );
    store.relay().settle(&k, later + 30_000, RelaySettled::Delivered, expires).await.unwrap();
    assert_eq!(
        store.relay().claim(&k, later + 2, later + 60_000, expires).await.unwrap(),
        RelayClaim::Settled(RelaySettled::Delivered)
    );

    // Past its ttl the record no longer counts, even before retention ran.
    let after = expires + 1;
    let claimed = store.relay().claim(&k, after, after + 30_000, after + HOUR_MS).await.unwrap();
    assert_eq!(claimed, RelayClaim::Claimed);

    // Retention removes the expired record (or the backend's TTL does, and
    // it answers 0); the live one stays.
    let live = relay_key("hub-a", 8);
    assert_eq!(store.relay().claim(&live, now, lease, now + 10 * HOUR_MS).await.unwrap(), RelayClaim::Claimed);
    store.relay().settle(&live, lease, RelaySettled::Delivered, now + 10 * HOUR_MS).await.unwrap();
    let deleted = store.relay().delete_expired(now + 5 * HOUR_MS).await.unwrap();
    assert_pruned(store, deleted, 1);
    assert_eq!(
        store.relay().claim(&live, now + 1, lease, now + 10 * HOUR_MS).await.unwrap(),
        RelayClaim::Settled(RelaySettled::Delivered)
    );
}

pub async fn relay_concurrent_claims_have_one_winner<S: Store>(store: &S) {
    let now = base_ms();
    let k = relay_key("hub-a", 9);
    let claims = (0..8).map(|i| store.relay().claim(&k, now, now + 30_000 + i, now + HOUR_MS));
    let answers = futures::future::join_all(claims).await;
    let won = answers.iter().filter(|a| matches!(a, Ok(RelayClaim::Claimed))).count();
    assert_eq!(won, 1, "{answers:?}");
    assert!(answers.iter().all(|a| matches!(a, Ok(RelayClaim::Claimed | RelayClaim::Busy { .. }))), "{answers:?}");
}
