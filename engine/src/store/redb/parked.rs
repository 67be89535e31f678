//! Parked deliveries on redb (`store/parked.rs`).
//!
//! - `parked`: shard (u16) ‖ channel storage tag (u8) ‖ sequence id (u64)
//!   ‖ recipient id (32 bytes), integers big-endian, so that one (shard,
//!   channel)'s rows are one contiguous range in `ParkedKey` order → the
//!   topic, kind, server timestamp, attempts and all_gone (the `codec`
//!   encoding: a version byte, then the fields).
//!
//! A drained row is gone at its delete: redb keeps no tombstones, so a read
//! from the start of a (shard, channel) costs the same after a long outage
//! as before it.

use std::ops::Bound;

use redb::{ReadTransaction, TableDefinition, WriteTransaction};

use super::codec::{OrBackend, Reader, Writer, corrupt};
use crate::domain::{Channel, EnvelopeKind, ParkedDelivery, ParkedKey, RecipientId, ShardId, Topic};
use crate::store::StoreError;

/// shard ‖ channel tag.
const PREFIX_LEN: usize = 2 + 1;
/// shard ‖ channel tag ‖ sequence id ‖ recipient id.
const KEY_LEN: usize = PREFIX_LEN + 8 + 32;

type Key = [u8; KEY_LEN];

pub(super) const PARKED: TableDefinition<&Key, &[u8]> = TableDefinition::new("parked");

const WHAT: &str = "parked delivery";

/// The first `KEY_LEN` bytes a (shard, channel)'s key can have, followed by `fill`.
fn bound(shard: ShardId, channel: Channel, fill: u8) -> Key {
    let mut k = [fill; KEY_LEN];
    k[..2].copy_from_slice(&shard.index().to_be_bytes());
    k[2] = channel.storage_tag();
    k
}

fn key(shard: ShardId, channel: Channel, parked: &ParkedKey) -> Key {
    let mut k = bound(shard, channel, 0);
    k[PREFIX_LEN..PREFIX_LEN + 8].copy_from_slice(&parked.sequence_id.to_be_bytes());
    k[PREFIX_LEN + 8..].copy_from_slice(parked.recipient.as_bytes());
    k
}

fn parked_key(k: &Key) -> ParkedKey {
    let (seq, id) = k[PREFIX_LEN..].split_at(8);
    ParkedKey {
        sequence_id: u64::from_be_bytes(seq.try_into().expect("8 bytes")),
        recipient: RecipientId::from_bytes(id.try_into().expect("32 bytes")),
    }
}

/// The value: what the key does not hold.
fn encode(d: &ParkedDelivery) -> Vec<u8> {
    Writer::new()
        .bytes(d.topic.as_bytes())
        .u8(d.kind as u8)
        .i64(d.server_ts_ns)
        .u32(d.attempts)
        .u8(u8::from(d.all_gone))
        .finish()
}

fn decode(shard: ShardId, channel: Channel, k: &Key, buf: &[u8]) -> Result<ParkedDelivery, StoreError> {
    let mut r = Reader::new(buf, WHAT)?;
    let topic = Topic::parse(r.bytes()?).map_err(|_| corrupt(WHAT))?;
    let kind = EnvelopeKind::from_u8(r.u8()?).ok_or_else(|| corrupt(WHAT))?;
    let server_ts_ns = r.i64()?;
    let attempts = r.u32()?;
    let all_gone = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(corrupt(WHAT)),
    };
    r.end()?;
    let ParkedKey { sequence_id, recipient } = parked_key(k);
    Ok(ParkedDelivery { shard, channel, sequence_id, recipient, topic, kind, server_ts_ns, attempts, all_gone })
}

pub(super) fn park(txn: &WriteTransaction, deliveries: &[ParkedDelivery]) -> Result<(), StoreError> {
    let mut table = txn.open_table(PARKED).be()?;
    for d in deliveries {
        table.insert(&key(d.shard, d.channel, &d.key()), encode(d).as_slice()).be()?;
    }
    Ok(())
}

pub(super) fn parked(
    txn: &ReadTransaction,
    shard: ShardId,
    channel: Channel,
    after: Option<ParkedKey>,
    limit: usize,
) -> Result<Vec<ParkedDelivery>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let table = txn.open_table(PARKED).be()?;
    let lo = match after {
        Some(after) => Bound::Excluded(key(shard, channel, &after)),
        None => Bound::Included(bound(shard, channel, 0)),
    };
    let hi = bound(shard, channel, 0xff);
    let range = (lo.as_ref(), Bound::Included(&hi));
    let rows = table.range::<&Key>(range).be()?.take(limit);
    rows.map(|row| row.be().and_then(|(k, v)| decode(shard, channel, k.value(), v.value()))).collect()
}

pub(super) fn unpark(
    txn: &WriteTransaction,
    shard: ShardId,
    channel: Channel,
    keys: &[ParkedKey],
) -> Result<(), StoreError> {
    let mut table = txn.open_table(PARKED).be()?;
    for k in keys {
        table.remove(&key(shard, channel, k)).be()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(shard: u16, channel: Channel, sequence_id: u64, recipient: u8) -> ParkedDelivery {
        ParkedDelivery {
            shard: ShardId::parse(shard, 1024).unwrap(),
            channel,
            sequence_id,
            recipient: RecipientId::from_bytes([recipient; 32]),
            topic: Topic::parse(&[0; 65]).unwrap(),
            kind: EnvelopeKind::Commit,
            server_ts_ns: -5,
            attempts: u32::MAX,
            all_gone: true,
        }
    }

    #[test]
    fn a_key_is_shard_channel_sequence_id_recipient_big_endian() {
        let d = delivery(0x0102, Channel::Fcm, 0x0304_0506_0708_090a, 0xee);
        let k = key(d.shard, d.channel, &d.key());
        assert_eq!(k[..11], [1, 2, Channel::Fcm.storage_tag(), 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(k[11..], [0xee; 32]);
        assert_eq!(parked_key(&k), d.key());
    }

    #[test]
    fn byte_order_is_key_order_within_a_shard_and_channel() {
        let (shard, channel) = (ShardId::parse(3, 16).unwrap(), Channel::Apns);
        let keys: Vec<ParkedKey> = [(1, 9), (2, 0), (256, 1), (256, 2), (u64::MAX >> 1, 0)]
            .into_iter()
            .map(|(sequence_id, r)| ParkedKey { sequence_id, recipient: RecipientId::from_bytes([r; 32]) })
            .collect();
        let bytes: Vec<Key> = keys.iter().map(|k| key(shard, channel, k)).collect();
        assert!(bytes.windows(2).all(|w| w[0] < w[1]), "in ParkedKey order");
        assert!(bytes.iter().all(|k| bound(shard, channel, 0) <= *k && *k <= bound(shard, channel, 0xff)));
        let other =
            [bound(ShardId::parse(3, 16).unwrap(), Channel::Fcm, 0), bound(ShardId::parse(4, 16).unwrap(), channel, 0)];
        assert!(other.iter().all(|o| *o > bound(shard, channel, 0xff)), "another channel or shard lies outside");
    }

    #[test]
    fn a_value_round_trips_and_a_bad_one_is_corrupt() {
        for (kind, all_gone, attempts) in [(EnvelopeKind::Welcome, false, 0), (EnvelopeKind::Commit, true, u32::MAX)] {
            let d = ParkedDelivery { kind, all_gone, attempts, ..delivery(7, Channel::WebPush, 42, 1) };
            let k = key(d.shard, d.channel, &d.key());
            assert_eq!(decode(d.shard, d.channel, &k, &encode(&d)).unwrap(), d);
        }
        let d = delivery(7, Channel::Http, 42, 1);
        let k = key(d.shard, d.channel, &d.key());
        let good = encode(&d);
        let mut bad_gone = good.clone();
        *bad_gone.last_mut().unwrap() = 2;
        let mut bad_kind = good.clone();
        bad_kind[1 + 4 + 65] = 0;
        let mut trailing = good.clone();
        trailing.push(0);
        for bad in [bad_gone, bad_kind, trailing, good[..good.len() - 1].to_vec()] {
            assert!(decode(d.shard, d.channel, &k, &bad).is_err());
        }
    }
}
