//! Deliveries parked while their channel cannot take them (`Store::parked`):
//! kept per (shard, channel), read in (sequence id, recipient id) order,
//! replaced by key, deleted by key.

use fanout_engine::domain::{
    Channel, EnvelopeKind, MAX_SEQUENCE_ID, ParkedDelivery, ParkedKey, RecipientId, ShardId, Topic,
};
use fanout_engine::store::{Store, StoreError};

use super::{SHARD_COUNT, rid, shard_id, topic};

fn parked(shard: u16, channel: Channel, sequence_id: u64, recipient: u8) -> ParkedDelivery {
    ParkedDelivery {
        shard: shard_id(shard),
        channel,
        sequence_id,
        recipient: rid(recipient),
        topic: topic(&[0, 7, recipient]),
        kind: EnvelopeKind::Application,
        server_ts_ns: 1_700_000_000_000_000_000 + sequence_id as i64,
        attempts: 0,
        all_gone: false,
    }
}

fn key(sequence_id: u64, recipient: u8) -> ParkedKey {
    ParkedKey { sequence_id, recipient: rid(recipient) }
}

fn keys(page: &[ParkedDelivery]) -> Vec<ParkedKey> {
    page.iter().map(ParkedDelivery::key).collect()
}

async fn read<S: Store>(
    store: &S,
    shard: u16,
    channel: Channel,
    after: Option<ParkedKey>,
    limit: usize,
) -> Vec<ParkedDelivery> {
    store.parked().parked(shard_id(shard), channel, after, limit).await.unwrap()
}

/// Pages follow (sequence id, recipient id) whatever order the deliveries
/// were parked in; `after` is exclusive (a key with no row too) and
/// `limit` bounds a page.
pub async fn parked_deliveries_are_read_in_key_order<S: Store>(store: &S) {
    let apns = Channel::Apns;
    let first = [parked(2, apns, 5, 2), parked(2, apns, 1, 9), parked(2, apns, 300, 0)];
    let second = [parked(2, apns, 5, 1), parked(2, apns, 3, 0), parked(2, apns, 1, 2), parked(2, apns, 256, 7)];
    store.parked().park(&first).await.unwrap();
    store.parked().park(&second).await.unwrap();
    let all = [key(1, 2), key(1, 9), key(3, 0), key(5, 1), key(5, 2), key(256, 7), key(300, 0)];

    let page = read(store, 2, apns, None, 100).await;
    assert_eq!(keys(&page), all);
    assert_eq!(page[0], second[2], "a delivery comes back whole");
    assert_eq!(keys(&read(store, 2, apns, None, 2).await), all[..2]);
    assert_eq!(keys(&read(store, 2, apns, Some(key(1, 9)), 2).await), all[2..4], "strictly after");
    assert_eq!(keys(&read(store, 2, apns, Some(key(1, 5)), 3).await), all[1..4], "after a key with no row");
    assert_eq!(keys(&read(store, 2, apns, Some(key(4, 0)), 2).await), all[3..5]);
    assert_eq!(keys(&read(store, 2, apns, Some(key(5, 2)), 100).await), all[5..]);
    assert!(read(store, 2, apns, Some(key(300, 0)), 100).await.is_empty(), "nothing after the last");
    assert!(read(store, 2, apns, Some(key(MAX_SEQUENCE_ID, 0xff)), 100).await.is_empty());
    assert!(read(store, 2, apns, Some(key(u64::MAX, 0xff)), 100).await.is_empty(), "after any id there is");
    assert!(read(store, 2, apns, None, 0).await.is_empty(), "limit 0");

    // Paging by the last key read visits every row once.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = read(store, 2, apns, after, 3).await;
        paged.extend(keys(&page));
        if page.len() < 3 {
            break;
        }
        after = page.last().map(ParkedDelivery::key);
    }
    assert_eq!(paged, all);
}

/// Each (shard, channel) is its own: the same key in another shard or
/// channel is another delivery, read and deleted apart.
pub async fn parked_deliveries_are_kept_per_shard_and_channel<S: Store>(store: &S) {
    let places = [(0, Channel::Apns), (0, Channel::Fcm), (1, Channel::Apns), (SHARD_COUNT - 1, Channel::WebPush)];
    let deliveries: Vec<ParkedDelivery> = places
        .iter()
        .enumerate()
        .map(|(n, &(shard, channel))| ParkedDelivery { attempts: n as u32, ..parked(shard, channel, 4, 1) })
        .collect();
    store.parked().park(&deliveries).await.unwrap();
    store.parked().park(&[parked(0, Channel::Apns, 6, 1)]).await.unwrap();
    for (d, &(shard, channel)) in deliveries.iter().zip(&places).skip(1) {
        assert_eq!(read(store, shard, channel, None, 10).await, [d.clone()]);
    }
    assert_eq!(keys(&read(store, 0, Channel::Apns, None, 10).await), [key(4, 1), key(6, 1)]);
    assert!(read(store, 0, Channel::Http, None, 10).await.is_empty(), "a channel with nothing parked");
    assert!(read(store, 2, Channel::Apns, None, 10).await.is_empty(), "a shard with nothing parked");

    store.parked().unpark(shard_id(0), Channel::Apns, &[key(4, 1)]).await.unwrap();
    assert_eq!(keys(&read(store, 0, Channel::Apns, None, 10).await), [key(6, 1)]);
    for (d, &(shard, channel)) in deliveries.iter().zip(&places).skip(1) {
        assert_eq!(read(store, shard, channel, None, 10).await, [d.clone()], "untouched by another's unpark");
    }
}

/// Parking a key again replaces its row (the attempts made since); an
/// unpark deletes exactly the keys it names and ignores those with no row.
pub async fn parking_again_replaces_and_unpark_deletes_only_its_keys<S: Store>(store: &S) {
    let fcm = Channel::Fcm;
    let five: Vec<ParkedDelivery> = (1..=5).map(|n| parked(3, fcm, 10 * u64::from(n), n)).collect();
    store.parked().park(&five).await.unwrap();
    store.parked().park(&five).await.unwrap();
    assert_eq!(read(store, 3, fcm, None, 10).await, five, "parking again the same is idempotent");

    let retried = ParkedDelivery { attempts: 2, all_gone: true, ..five[1].clone() };
    store.parked().park(std::slice::from_ref(&retried)).await.unwrap();
    let page = read(store, 3, fcm, None, 10).await;
    assert_eq!(page.len(), 5, "replaced, not added");
    assert_eq!(page[1], retried);

    // The last of one key given twice in a call stands.
    let again = ParkedDelivery { attempts: 3, ..retried.clone() };
    let last = ParkedDelivery { attempts: 4, all_gone: false, ..retried.clone() };
    store.parked().park(&[again, last.clone()]).await.unwrap();
    assert_eq!(read(store, 3, fcm, Some(five[0].key()), 1).await, [last]);

    let absent = [key(10, 9), key(15, 1), key(60, 6)];
    let gone = [five[0].key(), five[2].key(), absent[0], absent[1], absent[2]];
    store.parked().unpark(shard_id(3), fcm, &gone).await.unwrap();
    assert_eq!(keys(&read(store, 3, fcm, None, 10).await), [five[1].key(), five[3].key(), five[4].key()]);
    store.parked().unpark(shard_id(3), fcm, &gone).await.unwrap();
    store.parked().unpark(shard_id(3), fcm, &[]).await.unwrap();
    store.parked().park(&[]).await.unwrap();
    assert_eq!(read(store, 3, fcm, None, 10).await.len(), 3, "absent keys and empty calls change nothing");

    // A drained key parked again is back.
    store.parked().park(&five[..1]).await.unwrap();
    assert_eq!(
        keys(&read(store, 3, fcm, None, 10).await),
        [five[0].key(), five[1].key(), five[3].key(), five[4].key()]
    );
    let rest = keys(&read(store, 3, fcm, None, 10).await);
    store.parked().unpark(shard_id(3), fcm, &rest).await.unwrap();
    assert!(read(store, 3, fcm, None, 10).await.is_empty());
}

/// Every field comes back as parked: each envelope kind, channel, the
/// longest topic, the extremes of attempts, timestamps, ids.
pub async fn parked_deliveries_round_trip_every_field<S: Store>(store: &S) {
    use EnvelopeKind::*;
    let kinds = [Application, Commit, Proposal, Welcome, KeyPackage, IdentityUpdate, CommitLog];
    for (c, &channel) in Channel::ALL.iter().enumerate() {
        let deliveries: Vec<ParkedDelivery> = kinds
            .iter()
            .enumerate()
            .map(|(k, &kind)| {
                // The topic kind each envelope kind is published on.
                let topic_kind = match kind {
                    Welcome => 1,
                    IdentityUpdate => 2,
                    KeyPackage => 3,
                    _ => 0,
                };
                let n = (k + c) as u8;
                ParkedDelivery {
                    shard: shard_id(5),
                    channel,
                    sequence_id: if k == 0 { MAX_SEQUENCE_ID } else { k as u64 },
                    recipient: RecipientId::from_bytes([if k == 1 { 0 } else { 0xff - n }; 32]),
                    topic: Topic::parse(&[&[topic_kind][..], &[n; 64]].concat()).unwrap(),
                    kind,
                    server_ts_ns: [i64::MIN, -1, 0, i64::MAX][k % 4],
                    attempts: [0, 1, u32::MAX, 7][k % 4],
                    all_gone: k % 2 == 1,
                }
            })
            .collect();
        store.parked().park(&deliveries).await.unwrap();
        let mut expected = deliveries;
        expected.sort_by_key(ParkedDelivery::key);
        assert_eq!(read(store, 5, channel, None, 100).await, expected, "{}", channel.as_str());
        assert!(expected.iter().all(|d| d.topic.as_bytes().len() == 65));
    }
}

/// What no owner could drain is refused whole: a shard of another shard
/// count, a sequence id above any an envelope can have.
pub async fn parking_refuses_what_no_owner_could_drain<S: Store>(store: &S) {
    let ok = parked(4, Channel::Http, 1, 1);
    let beyond = ParkedDelivery { shard: ShardId::parse(SHARD_COUNT, SHARD_COUNT + 1).unwrap(), ..ok.clone() };
    let too_far = ParkedDelivery { sequence_id: MAX_SEQUENCE_ID + 1, ..parked(4, Channel::Http, 2, 2) };
    for bad in [beyond, too_far] {
        let refused = store.parked().park(&[ok.clone(), bad]).await;
        assert!(matches!(refused, Err(StoreError::Backend(_))), "{refused:?}");
    }
    assert!(read(store, 4, Channel::Http, None, 10).await.is_empty(), "nothing of a refused call is stored");
}
