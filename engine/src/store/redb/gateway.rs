//! Spec 002 on redb: the push gateway's records (`domain/gateway.rs`). Each
//! trait call is one write (or read) transaction, so a supersede, a notify
//! commit with its wakeups, and a lease are atomic.
//!
//! Keys put each text behind a 2-byte length, tenant first (the tenant
//! partition of §3.4):
//! - `gw_routes`: tenant ‖ account ‖ device → the current registration.
//! - `gw_targets`: tenant ‖ push_target_id ‖ device → account (the notify
//!   lookup; written and removed with its route in the same transaction).
//! - `gw_notify`: tenant ‖ Idempotency-Key → state (0 pending, 1 committed),
//!   lease_until, expires_at, body digest, response.
//! - `gw_state`: tenant ‖ key → expires_at, value.
//! - `gw_wakeups`: id → wakeup and its lease; `gw_wakeup_due`: due (u64
//!   big-endian, the later of not_before and lease_until) ‖ id → empty.
//! - `gw_expiry`: expires_at ‖ kind ‖ key → empty, so retention deletes by
//!   range.

use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};

use super::codec::{OrBackend, Reader, Writer};
use super::staged;
use super::time_index::{PRUNE_BATCH, at, due_keys};
use crate::domain::{
    AccountId, DeviceId, GatewayRegistration, GatewayWakeup, LeasedWakeup, NotifyClaim, NotifyKey, PushRouteId,
    PushTargetId, RegistrationId, Revoke, RouteKey, SaltEpochId, ServiceId,
};
use crate::store::StoreError;
use crate::store::gateway::{MAX_GATEWAY_TEXT, revokes};

pub(super) const ROUTES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("gw_routes");
pub(super) const TARGETS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("gw_targets");
pub(super) const NOTIFY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("gw_notify");
pub(super) const STATE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("gw_state");
pub(super) const WAKEUPS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("gw_wakeups");
pub(super) const WAKEUP_DUE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("gw_wakeup_due");
pub(super) const EXPIRY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("gw_expiry");

/// Every table, created at open.
pub(super) const TABLES: [TableDefinition<&[u8], &[u8]>; 7] =
    [ROUTES, TARGETS, NOTIFY, STATE, WAKEUPS, WAKEUP_DUE, EXPIRY];

const KIND_ROUTE: u8 = 1;
const KIND_NOTIFY: u8 = 2;
const KIND_STATE: u8 = 3;

const PENDING: u8 = 0;
const COMMITTED: u8 = 1;

fn corrupt(what: &str) -> StoreError {
    StoreError::Backend(format!("corrupt gateway {what} record"))
}

/// Keys of length-prefixed parts; refuses empty or over-long parts (the
/// typed ids never are: this bounds the window-state keys).
fn key(parts: &[&[u8]]) -> Result<Vec<u8>, StoreError> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len() + 2).sum());
    for p in parts {
        if p.is_empty() || p.len() > MAX_GATEWAY_TEXT {
            return Err(StoreError::Backend(format!("gateway key parts must be 1 to {MAX_GATEWAY_TEXT} bytes")));
        }
        k.extend_from_slice(&(p.len() as u16).to_be_bytes());
        k.extend_from_slice(p);
    }
    Ok(k)
}

fn route_key(r: &RouteKey) -> Result<Vec<u8>, StoreError> {
    key(&[r.tenant.as_str().as_bytes(), r.account_id.as_str().as_bytes(), r.device_id.as_str().as_bytes()])
}

fn target_prefix(tenant: &ServiceId, target: &PushTargetId) -> Result<Vec<u8>, StoreError> {
    key(&[tenant.as_str().as_bytes(), target.to_string().as_bytes()])
}

fn target_key(reg: &GatewayRegistration) -> Result<Vec<u8>, StoreError> {
    let target = reg.push_target_id.to_string();
    key(&[reg.tenant.as_str().as_bytes(), target.as_bytes(), reg.device_id.as_str().as_bytes()])
}

pub(super) fn notify_key(k: &NotifyKey) -> Result<Vec<u8>, StoreError> {
    key(&[k.tenant.as_str().as_bytes(), k.idempotency_key.as_str().as_bytes()])
}

pub(super) fn state_key(tenant: &ServiceId, k: &[u8]) -> Result<Vec<u8>, StoreError> {
    key(&[tenant.as_str().as_bytes(), k])
}

fn expiry_key(expires_at: i64, kind: u8, k: &[u8]) -> Vec<u8> {
    [at(expires_at).as_slice(), &[kind], k].concat()
}

fn due_key(due: i64, id: &str) -> Vec<u8> {
    [at(due).as_slice(), id.as_bytes()].concat()
}

// ---- codecs ----

fn encode_registration(reg: &GatewayRegistration) -> Vec<u8> {
    let mut w = Writer::new();
    let target = reg.push_target_id.to_string();
    for text in [
        reg.tenant.as_str(),
        reg.account_id.as_str(),
        reg.device_id.as_str(),
        reg.registration_id.as_str(),
        &target,
        reg.push_route_id.as_str(),
        reg.salt_epoch_id.as_str(),
        &reg.push_key,
    ] {
        w.bytes(text.as_bytes());
    }
    w.opt(reg.platform.as_deref()).opt(reg.app_id.as_deref());
    w.u8(reg.visible_opt_in as u8).i64(reg.created_at_ms).i64(reg.expires_at_ms).u8(reg.token_invalid as u8);
    w.finish()
}

fn decode_registration(buf: &[u8]) -> Result<GatewayRegistration, StoreError> {
    let mut r = Reader::new(buf, "gateway registration")?;
    let reg = GatewayRegistration {
        tenant: r.parsed(ServiceId::parse)?,
        account_id: r.parsed(AccountId::parse)?,
        device_id: r.parsed(DeviceId::parse)?,
        registration_id: r.parsed(RegistrationId::parse)?,
        push_target_id: r.parsed(PushTargetId::parse)?,
        push_route_id: r.parsed(PushRouteId::parse)?,
        salt_epoch_id: r.parsed(SaltEpochId::parse)?,
        push_key: r.string()?,
        platform: r.opt()?,
        app_id: r.opt()?,
        visible_opt_in: r.u8()? == 1,
        created_at_ms: r.i64()?,
        expires_at_ms: r.i64()?,
        token_invalid: r.u8()? == 1,
    };
    r.end()?;
    Ok(reg)
}

struct NotifyRecord {
    state: u8,
    lease_until: i64,
    expires_at: i64,
    digest: [u8; 32],
    response: Vec<u8>,
}

fn encode_notify(n: &NotifyRecord) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(n.state).i64(n.lease_until).i64(n.expires_at).raw(&n.digest).bytes(&n.response);
    w.finish()
}

fn decode_notify(buf: &[u8]) -> Result<NotifyRecord, StoreError> {
    let mut r = Reader::new(buf, "gateway notify")?;
    let n = NotifyRecord {
        state: r.u8()?,
        lease_until: r.i64()?,
        expires_at: r.i64()?,
        digest: r.array()?,
        response: r.bytes()?.to_vec(),
    };
    r.end()?;
    Ok(n)
}

fn encode_wakeup(w: &GatewayWakeup, lease_until: i64) -> Vec<u8> {
    let mut out = Writer::new();
    let r = &w.route;
    for text in
        [w.id.as_str(), r.tenant.as_str(), r.account_id.as_str(), r.device_id.as_str(), w.registration_id.as_str()]
    {
        out.bytes(text.as_bytes());
    }
    out.bytes(&w.payload)
        .bytes(w.collapse_key.as_bytes())
        .i64(w.not_before_ms)
        .u64(u64::from(w.attempts))
        .i64(w.expires_at_ms)
        .i64(lease_until);
    out.finish()
}

fn decode_wakeup(buf: &[u8]) -> Result<LeasedWakeup, StoreError> {
    let mut r = Reader::new(buf, "gateway wakeup")?;
    let id = r.string()?;
    let route = RouteKey {
        tenant: r.parsed(ServiceId::parse)?,
        account_id: r.parsed(AccountId::parse)?,
        device_id: r.parsed(DeviceId::parse)?,
    };
    let wakeup = GatewayWakeup {
        id,
        route,
        registration_id: r.parsed(RegistrationId::parse)?,
        payload: r.bytes()?.to_vec(),
        collapse_key: r.string()?,
        not_before_ms: r.i64()?,
        attempts: u32::try_from(r.u64()?).map_err(|_| corrupt("wakeup"))?,
        expires_at_ms: r.i64()?,
    };
    let lease_until_ms = r.i64()?;
    r.end()?;
    Ok(LeasedWakeup { wakeup, lease_until_ms })
}

fn due(l: &LeasedWakeup) -> i64 {
    l.wakeup.not_before_ms.max(l.lease_until_ms)
}

fn check_wakeup_id(id: &str) -> Result<(), StoreError> {
    if id.is_empty() || id.len() > MAX_GATEWAY_TEXT {
        return Err(StoreError::Backend("gateway wakeup ids must be 1 to 1024 bytes".into()));
    }
    Ok(())
}

// ---- registrations ----

fn get_route(txn: &WriteTransaction, k: &[u8]) -> Result<Option<GatewayRegistration>, StoreError> {
    txn.open_table(ROUTES).be()?.get(k).be()?.map(|g| decode_registration(g.value())).transpose()
}

/// Removes a route with its target index and expiry entries.
fn remove_route(txn: &WriteTransaction, k: &[u8], old: &GatewayRegistration) -> Result<(), StoreError> {
    txn.open_table(ROUTES).be()?.remove(k).be()?;
    txn.open_table(TARGETS).be()?.remove(target_key(old)?.as_slice()).be()?;
    txn.open_table(EXPIRY).be()?.remove(expiry_key(old.expires_at_ms, KIND_ROUTE, k).as_slice()).be()?;
    Ok(())
}

fn put_route(txn: &WriteTransaction, k: &[u8], reg: &GatewayRegistration) -> Result<(), StoreError> {
    txn.open_table(ROUTES).be()?.insert(k, encode_registration(reg).as_slice()).be()?;
    txn.open_table(TARGETS).be()?.insert(target_key(reg)?.as_slice(), reg.account_id.as_str().as_bytes()).be()?;
    txn.open_table(EXPIRY).be()?.insert(expiry_key(reg.expires_at_ms, KIND_ROUTE, k).as_slice(), [].as_slice()).be()?;
    Ok(())
}

pub(super) fn register(
    txn: &WriteTransaction,
    reg: &GatewayRegistration,
) -> Result<Option<RegistrationId>, StoreError> {
    let k = route_key(&reg.route_key())?;
    // Checked before anything is written: a bad part changes nothing.
    target_key(reg)?;
    let old = get_route(txn, &k)?;
    if let Some(old) = &old {
        remove_route(txn, &k, old)?;
    }
    put_route(txn, &k, reg)?;
    Ok(old.map(|o| o.registration_id))
}

pub(super) fn unregister(txn: &WriteTransaction, revoke: &Revoke) -> Result<bool, StoreError> {
    let k = route_key(&revoke.route)?;
    match get_route(txn, &k)? {
        Some(old) if revokes(revoke, &old) => {
            remove_route(txn, &k, &old)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

pub(super) fn route(
    txn: &ReadTransaction,
    route: &RouteKey,
    now_ms: i64,
) -> Result<Option<GatewayRegistration>, StoreError> {
    let k = route_key(route)?;
    let table = txn.open_table(ROUTES).be()?;
    let found = table.get(k.as_slice()).be()?.map(|g| decode_registration(g.value())).transpose()?;
    Ok(found.filter(|r| r.expires_at_ms > now_ms))
}

pub(super) fn target(
    txn: &ReadTransaction,
    tenant: &ServiceId,
    push_target_id: &PushTargetId,
    now_ms: i64,
) -> Result<Vec<GatewayRegistration>, StoreError> {
    let prefix = target_prefix(tenant, push_target_id)?;
    let targets = txn.open_table(TARGETS).be()?;
    let routes = txn.open_table(ROUTES).be()?;
    let mut out = Vec::new();
    for row in targets.range::<&[u8]>(prefix.as_slice()..).be()? {
        let (k, account) = row.be()?;
        let Some(device) = k.value().strip_prefix(prefix.as_slice()) else { break };
        // The device part: its own length prefix, then the id.
        let device = device.get(2..).ok_or_else(|| corrupt("target"))?;
        let rk = key(&[tenant.as_str().as_bytes(), account.value(), device])?;
        if let Some(reg) = routes.get(rk.as_slice()).be()?.map(|g| decode_registration(g.value())).transpose()?
            && reg.push_target_id == *push_target_id
            && reg.expires_at_ms > now_ms
        {
            out.push(reg);
        }
    }
    Ok(out)
}

pub(super) fn mark_token_invalid(
    txn: &WriteTransaction,
    route: &RouteKey,
    registration_id: &RegistrationId,
) -> Result<bool, StoreError> {
    let k = route_key(route)?;
    match get_route(txn, &k)? {
        Some(mut reg) if reg.registration_id == *registration_id => {
            if !reg.token_invalid {
                reg.token_invalid = true;
                txn.open_table(ROUTES).be()?.insert(k.as_slice(), encode_registration(&reg).as_slice()).be()?;
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

// ---- notify records ----

fn get_notify(txn: &WriteTransaction, k: &[u8]) -> Result<Option<NotifyRecord>, StoreError> {
    txn.open_table(NOTIFY).be()?.get(k).be()?.map(|g| decode_notify(g.value())).transpose()
}

fn put_notify(txn: &WriteTransaction, k: &[u8], old_expires: Option<i64>, n: &NotifyRecord) -> Result<(), StoreError> {
    move_expiry(txn, KIND_NOTIFY, k, old_expires, n.expires_at)?;
    txn.open_table(NOTIFY).be()?.insert(k, encode_notify(n).as_slice()).be()?;
    Ok(())
}

/// Moves the expiry index entry of record `k` of `kind` from `old` to `new`;
/// nothing when it stays (a commit keeps its claim's expiry, a window state
/// value its window's).
fn move_expiry(txn: &WriteTransaction, kind: u8, k: &[u8], old: Option<i64>, new: i64) -> Result<(), StoreError> {
    if old == Some(new) {
        return Ok(());
    }
    let mut expiry = txn.open_table(EXPIRY).be()?;
    if let Some(old) = old {
        expiry.remove(expiry_key(old, kind, k).as_slice()).be()?;
    }
    expiry.insert(expiry_key(new, kind, k).as_slice(), [].as_slice()).be()?;
    Ok(())
}

/// A notify record as staged: its expiry and its encoding.
fn staged_notify(n: &NotifyRecord) -> staged::Value {
    (n.expires_at, encode_notify(n))
}

/// The notify record under `k` as stored, in its staged form.
pub(super) fn stored_notify(txn: &ReadTransaction, k: &[u8]) -> Result<Option<staged::Value>, StoreError> {
    let table = txn.open_table(NOTIFY).be()?;
    table.get(k).be()?.map(|g| decode_notify(g.value()).map(|n| staged_notify(&n))).transpose()
}

/// A notify's claim (§5 Idempotency-Key) decided against the record as it
/// is now (staged, else stored): the record to stage, if any, and the answer.
pub(super) fn decide_notify_claim(
    current: Option<&staged::Value>,
    digest: &[u8; 32],
    now_ms: i64,
    lease_until_ms: i64,
    expires_at_ms: i64,
) -> Result<(Option<staged::Value>, NotifyClaim), StoreError> {
    let old = current.map(|(_, bytes)| decode_notify(bytes)).transpose()?;
    if let Some(r) = old.as_ref().filter(|r| r.expires_at > now_ms) {
        if r.digest != *digest {
            return Ok((None, NotifyClaim::Conflict));
        }
        if r.state == COMMITTED {
            return Ok((None, NotifyClaim::Replay(r.response.clone())));
        }
        if r.lease_until > now_ms {
            return Ok((None, NotifyClaim::Busy { lease_until_ms: r.lease_until }));
        }
    }
    let claim = NotifyRecord {
        state: PENDING,
        lease_until: lease_until_ms,
        expires_at: expires_at_ms,
        digest: *digest,
        response: Vec::new(),
    };
    Ok((Some(staged_notify(&claim)), NotifyClaim::Claimed))
}

/// Writes a notify record staged in memory, moving its expiry index entry.
pub(super) fn put_staged_notify(
    txn: &WriteTransaction,
    k: &[u8],
    (_, bytes): &staged::Value,
) -> Result<(), StoreError> {
    let record = decode_notify(bytes)?;
    let old = get_notify(txn, k)?;
    put_notify(txn, k, old.map(|o| o.expires_at), &record)
}

fn own_claim(txn: &WriteTransaction, k: &[u8], lease_until_ms: i64) -> Result<Option<NotifyRecord>, StoreError> {
    Ok(get_notify(txn, k)?.filter(|r| r.state == PENDING && r.lease_until == lease_until_ms))
}

pub(super) fn notify_commit(
    txn: &WriteTransaction,
    key: &NotifyKey,
    lease_until_ms: i64,
    response: &[u8],
    wakeups: &[GatewayWakeup],
    expires_at_ms: i64,
) -> Result<bool, StoreError> {
    let k = notify_key(key)?;
    let Some(old) = own_claim(txn, &k, lease_until_ms)? else { return Ok(false) };
    {
        let mut table = txn.open_table(WAKEUPS).be()?;
        let mut due_index = txn.open_table(WAKEUP_DUE).be()?;
        for w in wakeups {
            check_wakeup_id(&w.id)?;
            if table.get(w.id.as_bytes()).be()?.is_some() {
                continue;
            }
            table.insert(w.id.as_bytes(), encode_wakeup(w, 0).as_slice()).be()?;
            due_index.insert(due_key(w.not_before_ms, &w.id).as_slice(), [].as_slice()).be()?;
        }
    }
    // `own_claim`: its lease is `lease_until_ms`.
    let record = NotifyRecord { state: COMMITTED, expires_at: expires_at_ms, response: response.to_vec(), ..old };
    put_notify(txn, &k, Some(old.expires_at), &record)?;
    Ok(true)
}

pub(super) fn notify_release(txn: &WriteTransaction, key: &NotifyKey, lease_until_ms: i64) -> Result<(), StoreError> {
    let k = notify_key(key)?;
    if let Some(old) = own_claim(txn, &k, lease_until_ms)? {
        txn.open_table(EXPIRY).be()?.remove(expiry_key(old.expires_at, KIND_NOTIFY, &k).as_slice()).be()?;
        txn.open_table(NOTIFY).be()?.remove(k.as_slice()).be()?;
    }
    Ok(())
}

// ---- wakeups ----

pub(super) fn wakeups_due(
    txn: &WriteTransaction,
    now_ms: i64,
    lease_until_ms: i64,
    limit: usize,
) -> Result<Vec<LeasedWakeup>, StoreError> {
    let mut due_index = txn.open_table(WAKEUP_DUE).be()?;
    let mut table = txn.open_table(WAKEUPS).be()?;
    let taken = due_keys(&due_index, now_ms, limit)?;
    let mut out = Vec::with_capacity(taken.len());
    for k in taken {
        due_index.remove(k.as_slice()).be()?;
        let id = &k[8..];
        let Some(mut leased) = table.get(id).be()?.map(|g| decode_wakeup(g.value())).transpose()? else {
            continue;
        };
        leased.lease_until_ms = lease_until_ms;
        table.insert(id, encode_wakeup(&leased.wakeup, lease_until_ms).as_slice()).be()?;
        due_index.insert(due_key(due(&leased), &leased.wakeup.id).as_slice(), [].as_slice()).be()?;
        out.push(leased);
    }
    Ok(out)
}

/// The stored wakeup when `leased` still holds its lease.
fn held(txn: &WriteTransaction, leased: &LeasedWakeup) -> Result<Option<LeasedWakeup>, StoreError> {
    check_wakeup_id(&leased.wakeup.id)?;
    let table = txn.open_table(WAKEUPS).be()?;
    let stored = table.get(leased.wakeup.id.as_bytes()).be()?.map(|g| decode_wakeup(g.value())).transpose()?;
    Ok(stored.filter(|s| s.lease_until_ms == leased.lease_until_ms))
}

pub(super) fn wakeup_reschedule(
    txn: &WriteTransaction,
    leased: &LeasedWakeup,
    not_before_ms: i64,
    attempts: u32,
) -> Result<bool, StoreError> {
    let Some(stored) = held(txn, leased)? else { return Ok(false) };
    let id = stored.wakeup.id.clone();
    let mut due_index = txn.open_table(WAKEUP_DUE).be()?;
    due_index.remove(due_key(due(&stored), &id).as_slice()).be()?;
    let wakeup = GatewayWakeup { not_before_ms, attempts, ..stored.wakeup };
    txn.open_table(WAKEUPS).be()?.insert(id.as_bytes(), encode_wakeup(&wakeup, 0).as_slice()).be()?;
    due_index.insert(due_key(not_before_ms, &id).as_slice(), [].as_slice()).be()?;
    Ok(true)
}

pub(super) fn wakeup_delete(txn: &WriteTransaction, leased: &LeasedWakeup) -> Result<bool, StoreError> {
    let Some(stored) = held(txn, leased)? else { return Ok(false) };
    txn.open_table(WAKEUP_DUE).be()?.remove(due_key(due(&stored), &stored.wakeup.id).as_slice()).be()?;
    txn.open_table(WAKEUPS).be()?.remove(stored.wakeup.id.as_bytes()).be()?;
    Ok(true)
}

// ---- window state ----

fn decode_state(buf: &[u8]) -> Result<(i64, Vec<u8>), StoreError> {
    let mut r = Reader::new(buf, "gateway state")?;
    let v = (r.i64()?, r.bytes()?.to_vec());
    r.end()?;
    Ok(v)
}

/// A stored window state value, expired or not.
pub(super) fn stored_state(txn: &ReadTransaction, k: &[u8]) -> Result<Option<(i64, Vec<u8>)>, StoreError> {
    let table = txn.open_table(STATE).be()?;
    table.get(k).be()?.map(|g| decode_state(g.value())).transpose()
}

/// Writes a window state value staged in memory (`staged.rs`: compare-and-set
/// decided there) and moves its expiry index entry.
pub(super) fn put_state(
    txn: &WriteTransaction,
    k: &[u8],
    (expires_at_ms, value): &(i64, Vec<u8>),
) -> Result<(), StoreError> {
    let mut table = txn.open_table(STATE).be()?;
    let old = table.get(k).be()?.map(|g| decode_state(g.value())).transpose()?;
    move_expiry(txn, KIND_STATE, k, old.map(|(expires, _)| expires), *expires_at_ms)?;
    let mut w = Writer::new();
    w.i64(*expires_at_ms).bytes(value);
    table.insert(k, w.finish().as_slice()).be()?;
    Ok(())
}

// ---- retention ----

/// One batch of expired records; returns how many it deleted (fewer than
/// `PRUNE_BATCH` means none is left).
pub(super) fn prune_batch(txn: &WriteTransaction, now_ms: i64) -> Result<usize, StoreError> {
    let mut expiry = txn.open_table(EXPIRY).be()?;
    let expired = due_keys(&expiry, now_ms, PRUNE_BATCH)?;
    for k in &expired {
        expiry.remove(k.as_slice()).be()?;
        let (kind, record) = (k[8], &k[9..]);
        match kind {
            KIND_ROUTE => {
                if let Some(old) = get_route(txn, record)?.filter(|r| r.expires_at_ms <= now_ms) {
                    txn.open_table(ROUTES).be()?.remove(record).be()?;
                    txn.open_table(TARGETS).be()?.remove(target_key(&old)?.as_slice()).be()?;
                }
            }
            KIND_NOTIFY => {
                txn.open_table(NOTIFY).be()?.remove(record).be()?;
            }
            KIND_STATE => {
                txn.open_table(STATE).be()?.remove(record).be()?;
            }
            _ => return Err(corrupt("expiry")),
        }
    }
    Ok(expired.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_id_that_no_longer_parses_is_a_corrupt_record() {
        let wakeup = |device: &str| {
            let mut w = Writer::new();
            for text in ["0".repeat(32).as_str(), "station", "ak:account:a", device, "registration-current-1"] {
                w.bytes(text.as_bytes());
            }
            w.bytes(b"{}").bytes(b"key").i64(0).u64(0).i64(1).i64(0);
            w.finish()
        };
        assert!(decode_wakeup(&wakeup("ak:device:01964137-0000-7000-8000-000000000001")).is_ok());
        let err = decode_wakeup(&wakeup("ak:device:other")).unwrap_err();
        assert_eq!(err.to_string(), corrupt("wakeup").to_string());
    }
}
