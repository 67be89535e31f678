//! Spec 003 §2.5 on redb: the relay ingress's delivery records.
//!
//! - `relay_deliveries`: len(hub) ‖ hub ‖ delivery_id → state (0 pending,
//!   else `RelaySettled::code`), lease_until, expires_at (i64 big-endian).
//! - `relay_expiry`: expires_at (u64 big-endian) ‖ key → empty: retention
//!   deletes by range instead of scanning every record.
//!
//! A claim is decided and staged in memory (`staged.rs`) and written by the
//! next transaction, at the latest the one of its own settlement or release;
//! settlements and releases are writes of their own.

use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};

use super::codec::OrBackend;
use super::staged;
use super::time_index::{PRUNE_BATCH, at, due_keys};
use crate::domain::{RelayClaim, RelayKey, RelaySettled};
use crate::store::StoreError;

pub(super) const RELAY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("relay_deliveries");
pub(super) const RELAY_EXPIRY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("relay_expiry");

const PENDING: i8 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    state: i8,
    lease_until: i64,
    expires_at: i64,
}

/// The record's key: len(hub) ‖ hub ‖ delivery_id. Hub ids are kept within
/// 255 bytes, so the length byte is exact and two (hub, id) pairs never
/// share a key.
pub(super) fn key_bytes(key: &RelayKey) -> Result<Vec<u8>, StoreError> {
    let hub = key.hub_id.as_bytes();
    match u8::try_from(hub.len()) {
        Ok(len) if len > 0 => Ok([&[len], hub, key.delivery_id.as_bytes()].concat()),
        _ => Err(StoreError::Backend("relay hub id must be 1 to 255 bytes".into())),
    }
}

fn expiry_key(expires_at: i64, key: &[u8]) -> Vec<u8> {
    [&at(expires_at), key].concat()
}

fn encode(r: Record) -> [u8; 17] {
    let mut out = [0u8; 17];
    out[0] = r.state as u8;
    out[1..9].copy_from_slice(&r.lease_until.to_be_bytes());
    out[9..17].copy_from_slice(&r.expires_at.to_be_bytes());
    out
}

fn decode(buf: &[u8]) -> Result<Record, StoreError> {
    let buf: &[u8; 17] = buf.try_into().map_err(|_| StoreError::Backend("corrupt relay record".into()))?;
    Ok(Record {
        state: buf[0] as i8,
        lease_until: i64::from_be_bytes(buf[1..9].try_into().expect("8 bytes")),
        expires_at: i64::from_be_bytes(buf[9..17].try_into().expect("8 bytes")),
    })
}

fn get(txn: &WriteTransaction, key: &[u8]) -> Result<Option<Record>, StoreError> {
    txn.open_table(RELAY).be()?.get(key).be()?.map(|g| decode(g.value())).transpose()
}

/// Writes `record` under `key`, moving its expiry index entry (a
/// settlement keeps its claim's expiry: then the entry stays).
fn put(txn: &WriteTransaction, key: &[u8], old: Option<Record>, record: Record) -> Result<(), StoreError> {
    if old.map(|o| o.expires_at) != Some(record.expires_at) {
        let mut expiry = txn.open_table(RELAY_EXPIRY).be()?;
        if let Some(old) = old {
            expiry.remove(expiry_key(old.expires_at, key).as_slice()).be()?;
        }
        expiry.insert(expiry_key(record.expires_at, key).as_slice(), [].as_slice()).be()?;
    }
    txn.open_table(RELAY).be()?.insert(key, encode(record).as_slice()).be()?;
    Ok(())
}

fn remove(txn: &WriteTransaction, key: &[u8], old: Record) -> Result<(), StoreError> {
    txn.open_table(RELAY_EXPIRY).be()?.remove(expiry_key(old.expires_at, key).as_slice()).be()?;
    txn.open_table(RELAY).be()?.remove(key).be()?;
    Ok(())
}

/// A record as staged: its expiry and its encoding.
fn staged_value(r: Record) -> staged::Value {
    (r.expires_at, encode(r).to_vec())
}

/// The record under `k` as stored, in its staged form.
pub(super) fn stored(txn: &ReadTransaction, k: &[u8]) -> Result<Option<staged::Value>, StoreError> {
    let table = txn.open_table(RELAY).be()?;
    table.get(k).be()?.map(|g| decode(g.value()).map(staged_value)).transpose()
}

/// §2.5's claim decided against the record as it is now (staged, else
/// stored): the record to stage, if any, and the answer.
pub(super) fn decide_claim(
    current: Option<&staged::Value>,
    now_ms: i64,
    lease_until_ms: i64,
    expires_at_ms: i64,
) -> Result<(Option<staged::Value>, RelayClaim), StoreError> {
    let old = current.map(|(_, bytes)| decode(bytes)).transpose()?;
    if let Some(r) = old.filter(|r| r.expires_at > now_ms) {
        if let Some(settled) = RelaySettled::from_code(r.state) {
            return Ok((None, RelayClaim::Settled(settled)));
        }
        if r.lease_until > now_ms {
            return Ok((None, RelayClaim::Busy { lease_until_ms: r.lease_until }));
        }
    }
    let claim = Record { state: PENDING, lease_until: lease_until_ms, expires_at: expires_at_ms };
    Ok((Some(staged_value(claim)), RelayClaim::Claimed))
}

/// Writes a record staged in memory, moving its expiry index entry.
pub(super) fn put_staged(txn: &WriteTransaction, k: &[u8], (_, bytes): &staged::Value) -> Result<(), StoreError> {
    let record = decode(bytes)?;
    put(txn, k, get(txn, k)?, record)
}

/// A claim decided and written in `txn` (tests filling a store at once).
#[cfg(test)]
pub(super) fn claim(
    txn: &WriteTransaction,
    key: &RelayKey,
    now_ms: i64,
    lease_until_ms: i64,
    expires_at_ms: i64,
) -> Result<RelayClaim, StoreError> {
    let k = key_bytes(key)?;
    let current = get(txn, &k)?.map(staged_value);
    let (record, claimed) = decide_claim(current.as_ref(), now_ms, lease_until_ms, expires_at_ms)?;
    if let Some(record) = record {
        put_staged(txn, &k, &record)?;
    }
    Ok(claimed)
}

/// The record when it is still the pending claim with `lease_until_ms`.
fn own_claim(txn: &WriteTransaction, k: &[u8], lease_until_ms: i64) -> Result<Option<Record>, StoreError> {
    Ok(get(txn, k)?.filter(|r| r.state == PENDING && r.lease_until == lease_until_ms))
}

pub(super) fn settle(
    txn: &WriteTransaction,
    key: &RelayKey,
    lease_until_ms: i64,
    settled: RelaySettled,
    expires_at_ms: i64,
) -> Result<(), StoreError> {
    let k = key_bytes(key)?;
    if let Some(old) = own_claim(txn, &k, lease_until_ms)? {
        let record = Record { state: settled.code(), lease_until: lease_until_ms, expires_at: expires_at_ms };
        put(txn, &k, Some(old), record)?;
    }
    Ok(())
}

pub(super) fn release(txn: &WriteTransaction, key: &RelayKey, lease_until_ms: i64) -> Result<(), StoreError> {
    let k = key_bytes(key)?;
    if let Some(old) = own_claim(txn, &k, lease_until_ms)? {
        remove(txn, &k, old)?;
    }
    Ok(())
}

/// One batch of expired records; returns how many it deleted (fewer than
/// `PRUNE_BATCH` means none is left).
pub(super) fn prune_batch(txn: &WriteTransaction, now_ms: i64) -> Result<usize, StoreError> {
    let mut expiry = txn.open_table(RELAY_EXPIRY).be()?;
    let expired = due_keys(&expiry, now_ms, PRUNE_BATCH)?;
    let mut records = txn.open_table(RELAY).be()?;
    for k in &expired {
        expiry.remove(k.as_slice()).be()?;
        records.remove(&k[8..]).be()?;
    }
    Ok(expired.len())
}
