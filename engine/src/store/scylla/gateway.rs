//! Spec 002 on ScyllaDB: the push gateway's records (schema version 6,
//! `006_gateway.cql`; `domain/gateway.rs` says what each is).
//!
//! - **Routes**: one partition per (tenant, account, device). Register reads
//!   it with SERIAL consistency and writes the new route with
//!   `IF NOT EXISTS` or `IF registration_id = <read>`: a supersede is one
//!   lightweight transaction, so there are never two current routes.
//!   Unregister and the dead-token mark are conditional on registration_id
//!   too.
//! - **Target index** (`gateway_targets`): another partition, so outside
//!   the transaction, like the dispatch index of `topic_subscriptions`: the
//!   new row is written before the route's transaction, the superseded or
//!   revoked row deleted after it with a write timestamp taken before it
//!   (so it cannot erase a later re-add of the same row). Lookups join
//!   every row with its route partition and skip rows that do not match.
//! - **Notify records**: one partition each; claim, take-over, commit and
//!   release are lightweight transactions on (state, lease_until), as the
//!   relay ingress's. A commit first reads the record (SERIAL) and stores
//!   nothing when the claim is no longer its own; then inserts the wakeups
//!   (`IF NOT EXISTS`: a wakeup already stored is kept, the merge), then
//!   stores the response `IF state = 0 AND lease_until = <its lease>`. A
//!   claim lost between the read and that last step (its lease ran out
//!   meanwhile) leaves its wakeups stored: at worst a duplicate wakeup,
//!   never a lost one.
//! - **Wakeups**: `WAKEUP_QUEUES` partitions; a worker reads them,
//!   and leases each due row with `IF lease_until = <read>`.
//! - **Window state**: one partition per (tenant, key), compare-and-set by
//!   lightweight transaction.
//!
//! Every row has a TTL ending at its `expires_at`, so retention has nothing
//! to delete here.

use std::sync::Arc;

use async_trait::async_trait;
use scylla::client::session::Session;
use scylla::statement::Consistency;
use scylla::statement::prepared::PreparedStatement;

use super::cql::{Execute, WriteClock, all_rows, at, first_row, retry, statements, ttl_until};
use crate::domain::{
    AccountId, DeviceId, GatewayRegistration, GatewayWakeup, LeasedWakeup, NotifyClaim, NotifyKey, PushRouteId,
    PushTargetId, RegistrationId, Revoke, RouteKey, SaltEpochId, ServiceId,
};
use crate::store::gateway::{WAKEUP_QUEUES, revokes, wakeup_queue};
use crate::store::{GatewayStore, StoreError};

const ROUTE_COLS: &str = "registration_id, push_target_id, push_route_id, salt_epoch_id, push_key, platform, \
                          app_id, visible_opt_in, created_at, expires_at, token_invalid";

type RouteRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<bool>,
    Option<i64>,
    Option<i64>,
    Option<bool>,
);

const WAKEUP_COLS: &str = "wakeup_id, tenant, account_id, device_id, registration_id, payload, collapse_key, \
                           not_before, attempts, expires_at, lease_until";

type WakeupRow = (
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
    Option<String>,
    Option<i64>,
    Option<i32>,
    Option<i64>,
    Option<i64>,
);

/// The push gateway's `GatewayStore` on ScyllaDB.
pub(super) struct ScyllaGateway {
    session: Arc<Session>,
    st: GatewayStatements,
    /// `route_read` at SERIAL consistency.
    route_read_serial: PreparedStatement,
    /// The target index's write timestamps (the store's dispatch index clock).
    clock: Arc<WriteClock>,
}

statements! {
    struct GatewayStatements;
    fn prepare(session, ks);
    route_read: "SELECT {ROUTE_COLS} FROM {ks}.gateway_routes WHERE tenant = ? AND account_id = ? AND device_id = ?",
    route_insert: "INSERT INTO {ks}.gateway_routes (tenant, account_id, device_id, {ROUTE_COLS}) \
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS USING TTL ?",
    route_replace: "UPDATE {ks}.gateway_routes USING TTL ? SET registration_id = ?, push_target_id = ?, \
                    push_route_id = ?, salt_epoch_id = ?, push_key = ?, platform = ?, app_id = ?, visible_opt_in = ?, \
                    created_at = ?, expires_at = ?, token_invalid = ? \
                    WHERE tenant = ? AND account_id = ? AND device_id = ? IF registration_id = ?",
    route_delete: "DELETE FROM {ks}.gateway_routes WHERE tenant = ? AND account_id = ? AND device_id = ? \
                   IF registration_id = ?",
    route_mark: "UPDATE {ks}.gateway_routes USING TTL ? SET token_invalid = true \
                 WHERE tenant = ? AND account_id = ? AND device_id = ? IF registration_id = ?",
    target_put: "INSERT INTO {ks}.gateway_targets (tenant, push_target_id, device_id, account_id) \
                 VALUES (?, ?, ?, ?) USING TTL ? AND TIMESTAMP ?",
    target_del: "DELETE FROM {ks}.gateway_targets USING TIMESTAMP ? \
                 WHERE tenant = ? AND push_target_id = ? AND device_id = ?",
    target_read: "SELECT device_id, account_id FROM {ks}.gateway_targets WHERE tenant = ? AND push_target_id = ?",
    notify_read_serial: "SELECT state, lease_until, expires_at, digest FROM {ks}.gateway_notify \
                         WHERE tenant = ? AND idempotency_key = ?" => at(Consistency::LocalSerial),
    notify_insert: "INSERT INTO {ks}.gateway_notify (tenant, idempotency_key, state, lease_until, expires_at, digest) \
                    VALUES (?, ?, 0, ?, ?, ?) IF NOT EXISTS USING TTL ?",
    notify_take_over: "UPDATE {ks}.gateway_notify USING TTL ? SET state = 0, lease_until = ?, expires_at = ?, \
                       digest = ?, response = null WHERE tenant = ? AND idempotency_key = ? \
                       IF state = ? AND lease_until = ? AND expires_at = ?",
    // Every column is written again so that all of them get the new TTL.
    notify_commit: "UPDATE {ks}.gateway_notify USING TTL ? SET state = 1, response = ?, lease_until = ?, \
                    expires_at = ?, digest = ? WHERE tenant = ? AND idempotency_key = ? \
                    IF state = 0 AND lease_until = ?",
    notify_release: "DELETE FROM {ks}.gateway_notify WHERE tenant = ? AND idempotency_key = ? \
                     IF state = 0 AND lease_until = ?",
    wakeup_insert: "INSERT INTO {ks}.gateway_wakeups (queue, {WAKEUP_COLS}) \
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0) IF NOT EXISTS USING TTL ?",
    wakeup_queue: "SELECT {WAKEUP_COLS} FROM {ks}.gateway_wakeups WHERE queue = ?",
    wakeup_lease: "UPDATE {ks}.gateway_wakeups USING TTL ? SET lease_until = ? WHERE queue = ? AND wakeup_id = ? \
                   IF lease_until = ?",
    wakeup_reschedule: "UPDATE {ks}.gateway_wakeups USING TTL ? SET not_before = ?, attempts = ?, lease_until = 0 \
                        WHERE queue = ? AND wakeup_id = ? IF lease_until = ?",
    wakeup_delete: "DELETE FROM {ks}.gateway_wakeups WHERE queue = ? AND wakeup_id = ? IF lease_until = ?",
    state_read: "SELECT value, expires_at FROM {ks}.gateway_state WHERE tenant = ? AND key = ?"
        => at(Consistency::LocalSerial),
    // `IF value = null`, not `IF NOT EXISTS`: a row whose cells expired
    // before its row marker (an update's TTL is shorter than the insert's)
    // still exists, with nothing in it.
    state_insert: "UPDATE {ks}.gateway_state USING TTL ? SET value = ?, expires_at = ? WHERE tenant = ? AND key = ? \
                   IF value = null",
    state_update: "UPDATE {ks}.gateway_state USING TTL ? SET value = ?, expires_at = ? WHERE tenant = ? AND key = ? \
                   IF value = ? AND expires_at = ?",
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Backend(format!("corrupt gateway {what} row"))
}

/// A stored text that must parse as `T` again: one that no longer does is a
/// corrupt row.
fn parsed<T, E>(what: &str, text: &str, parse: impl FnOnce(&str) -> Result<T, E>) -> Result<T, StoreError> {
    parse(text).map_err(|_| corrupt(what))
}

fn decode_route(key: &RouteKey, row: RouteRow) -> Result<Option<GatewayRegistration>, StoreError> {
    let (registration_id, target, route, epoch, push_key, platform, app_id, visible, created, expires, invalid) = row;
    // A row caught while its TTL runs out (or a lone mark) is no route.
    let Some(registration_id) = registration_id else { return Ok(None) };
    let (Some(push_target_id), Some(push_route_id), Some(salt_epoch_id), Some(push_key), Some(expires_at_ms)) =
        (target, route, epoch, push_key, expires)
    else {
        return Err(corrupt("route"));
    };
    Ok(Some(GatewayRegistration {
        tenant: key.tenant.clone(),
        account_id: key.account_id.clone(),
        device_id: key.device_id.clone(),
        registration_id: parsed("route", &registration_id, RegistrationId::parse)?,
        push_target_id: parsed("route", &push_target_id, PushTargetId::parse)?,
        push_route_id: parsed("route", &push_route_id, PushRouteId::parse)?,
        salt_epoch_id: parsed("route", &salt_epoch_id, SaltEpochId::parse)?,
        push_key,
        platform,
        app_id,
        visible_opt_in: visible.unwrap_or(false),
        created_at_ms: created.unwrap_or(0),
        expires_at_ms,
        token_invalid: invalid.unwrap_or(false),
    }))
}

fn decode_wakeup(queue_row: WakeupRow) -> Result<Option<LeasedWakeup>, StoreError> {
    let (id, tenant, account, device, registration, payload, collapse, not_before, attempts, expires, lease) =
        queue_row;
    let Some(tenant) = tenant else { return Ok(None) };
    let (Some(account_id), Some(device_id), Some(registration_id), Some(expires_at_ms)) =
        (account, device, registration, expires)
    else {
        return Err(corrupt("wakeup"));
    };
    let route = RouteKey {
        tenant: parsed("wakeup", &tenant, ServiceId::parse)?,
        account_id: parsed("wakeup", &account_id, AccountId::parse)?,
        device_id: parsed("wakeup", &device_id, DeviceId::parse)?,
    };
    Ok(Some(LeasedWakeup {
        wakeup: GatewayWakeup {
            id,
            route,
            registration_id: parsed("wakeup", &registration_id, RegistrationId::parse)?,
            payload: payload.unwrap_or_default(),
            collapse_key: collapse.unwrap_or_default(),
            not_before_ms: not_before.unwrap_or(0),
            attempts: u32::try_from(attempts.unwrap_or(0)).unwrap_or(0),
            expires_at_ms,
        },
        lease_until_ms: lease.unwrap_or(0),
    }))
}

fn queue_of(id: &str) -> i16 {
    wakeup_queue(id) as i16
}

impl ScyllaGateway {
    pub(super) async fn prepare(session: &Arc<Session>, ks: &str, clock: Arc<WriteClock>) -> Result<Self, StoreError> {
        let st = GatewayStatements::prepare(session, ks).await?;
        let route_read_serial = at(Consistency::LocalSerial)(st.route_read.clone());
        Ok(Self { session: Arc::clone(session), st, route_read_serial, clock })
    }

    async fn read_route(&self, key: &RouteKey, serial: bool) -> Result<Option<GatewayRegistration>, StoreError> {
        let st = if serial { &self.route_read_serial } else { &self.st.route_read };
        let values = (key.tenant.as_str(), key.account_id.as_str(), key.device_id.as_str());
        let Some(row) = first_row(&self.session, st, values, "reading a gateway route").await? else { return Ok(None) };
        decode_route(key, row)
    }

    async fn delete_target_row(&self, reg: &GatewayRegistration, timestamp: i64) -> Result<(), StoreError> {
        let values = (timestamp, reg.tenant.as_str(), reg.push_target_id.to_string(), reg.device_id.as_str());
        self.session.write(&self.st.target_del, values).await
    }

    async fn read_state(&self, tenant: &ServiceId, key: &[u8]) -> Result<Option<(Vec<u8>, i64)>, StoreError> {
        let row = first_row(&self.session, &self.st.state_read, (tenant.as_str(), key), "reading a gateway state");
        Ok(row.await?.and_then(|(value, expires): (Option<Vec<u8>>, Option<i64>)| Some((value?, expires?))))
    }
}

#[async_trait]
impl GatewayStore for ScyllaGateway {
    async fn register(&self, reg: &GatewayRegistration) -> Result<Option<RegistrationId>, StoreError> {
        let st = &self.st;
        let key = &reg.route_key();
        let (tenant, account, device) = (key.tenant.as_str(), key.account_id.as_str(), key.device_id.as_str());
        let target = &reg.push_target_id.to_string();
        let ttl = ttl_until(reg.expires_at_ms);
        retry(|| async move {
            let old = self.read_route(key, true).await?;
            // The index row first: a route is never stored without it.
            let put = (tenant, target, device, account, ttl, self.clock.next());
            self.session.write(&st.target_put, put).await?;
            let before = self.clock.next();
            let fields = (
                reg.registration_id.as_str(),
                target,
                reg.push_route_id.as_str(),
                reg.salt_epoch_id.as_str(),
                &reg.push_key,
                &reg.platform,
                &reg.app_id,
                reg.visible_opt_in,
                reg.created_at_ms,
                reg.expires_at_ms,
                reg.token_invalid,
            );
            let applied = match &old {
                None => {
                    let (a, b, c, d, e, f, g, h, i, j, k) = fields;
                    let values = (tenant, account, device, a, b, c, d, e, f, g, h, i, j, k, ttl);
                    self.session.lwt(&st.route_insert, values).await?.applied
                }
                Some(old) => {
                    let (a, b, c, d, e, f, g, h, i, j, k) = fields;
                    let values =
                        (ttl, a, b, c, d, e, f, g, h, i, j, k, tenant, account, device, old.registration_id.as_str());
                    self.session.lwt(&st.route_replace, values).await?.applied
                }
            };
            if !applied {
                return Ok(None);
            }
            if let Some(old) = &old
                && old.push_target_id != reg.push_target_id
            {
                self.delete_target_row(old, before).await?;
            }
            Ok(Some(old.map(|o| o.registration_id)))
        })
        .await
    }

    async fn unregister(&self, revoke: &Revoke) -> Result<bool, StoreError> {
        retry(|| async move {
            let Some(old) = self.read_route(&revoke.route, true).await? else { return Ok(Some(false)) };
            if !revokes(revoke, &old) {
                return Ok(Some(false));
            }
            let before = self.clock.next();
            let r = &revoke.route;
            let values = (r.tenant.as_str(), r.account_id.as_str(), r.device_id.as_str(), old.registration_id.as_str());
            if !self.session.lwt(&self.st.route_delete, values).await?.applied {
                return Ok(None);
            }
            self.delete_target_row(&old, before).await?;
            Ok(Some(true))
        })
        .await
    }

    async fn route(&self, route: &RouteKey, now_ms: i64) -> Result<Option<GatewayRegistration>, StoreError> {
        Ok(self.read_route(route, false).await?.filter(|r| r.expires_at_ms > now_ms))
    }

    async fn target(
        &self,
        tenant: &ServiceId,
        push_target_id: &PushTargetId,
        now_ms: i64,
    ) -> Result<Vec<GatewayRegistration>, StoreError> {
        let values = (tenant.as_str(), push_target_id.to_string());
        let rows: Vec<(String, Option<String>)> =
            all_rows(&self.session, &self.st.target_read, values, "reading a gateway target").await?;
        let mut out = Vec::with_capacity(rows.len());
        for (device_id, account_id) in rows {
            let Some(account_id) = account_id else { continue };
            let key = RouteKey {
                tenant: tenant.clone(),
                account_id: parsed("target", &account_id, AccountId::parse)?,
                device_id: parsed("target", &device_id, DeviceId::parse)?,
            };
            if let Some(reg) = self.read_route(&key, false).await?
                && reg.push_target_id == *push_target_id
                && reg.expires_at_ms > now_ms
            {
                out.push(reg);
            }
        }
        Ok(out)
    }

    async fn mark_token_invalid(&self, route: &RouteKey, registration_id: &RegistrationId) -> Result<bool, StoreError> {
        let Some(reg) = self.read_route(route, true).await? else { return Ok(false) };
        if reg.registration_id != *registration_id {
            return Ok(false);
        }
        let r = (route.tenant.as_str(), route.account_id.as_str(), route.device_id.as_str());
        let values = (ttl_until(reg.expires_at_ms), r.0, r.1, r.2, registration_id.as_str());
        Ok(self.session.lwt(&self.st.route_mark, values).await?.applied)
    }

    async fn notify_claim(
        &self,
        key: &NotifyKey,
        digest: &[u8; 32],
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<NotifyClaim, StoreError> {
        let st = &self.st;
        let (tenant, idem) = (key.tenant.as_str(), key.idempotency_key.as_str());
        retry(|| async move {
            let ttl = ttl_until(expires_at_ms);
            let insert = self
                .session
                .lwt(&st.notify_insert, (tenant, idem, lease_until_ms, expires_at_ms, &digest[..], ttl))
                .await?;
            if insert.applied {
                return Ok(Some(NotifyClaim::Claimed));
            }
            let read = (
                insert.current_i8("state"),
                insert.current_i64("lease_until"),
                insert.current_i64("expires_at"),
                insert.current_blob("digest"),
            );
            // A row caught half expired: try again.
            let (Some(state), Some(lease), Some(expires), Some(stored_digest)) = read else { return Ok(None) };
            if expires > now_ms {
                if stored_digest != digest {
                    return Ok(Some(NotifyClaim::Conflict));
                }
                if state == 1 {
                    let response = insert.current_blob("response").unwrap_or_default().to_vec();
                    return Ok(Some(NotifyClaim::Replay(response)));
                }
                if lease > now_ms {
                    return Ok(Some(NotifyClaim::Busy { lease_until_ms: lease }));
                }
            }
            let values = (ttl, lease_until_ms, expires_at_ms, &digest[..], tenant, idem, state, lease, expires);
            Ok(self.session.lwt(&st.notify_take_over, values).await?.applied.then_some(NotifyClaim::Claimed))
        })
        .await
    }

    async fn notify_commit(
        &self,
        key: &NotifyKey,
        lease_until_ms: i64,
        response: &[u8],
        wakeups: &[GatewayWakeup],
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let st = &self.st;
        let (tenant, idem) = (key.tenant.as_str(), key.idempotency_key.as_str());
        type Row = (Option<i8>, Option<i64>, Option<i64>, Option<Vec<u8>>);
        let row = first_row::<Row>(&self.session, &st.notify_read_serial, (tenant, idem), "reading a notify record");
        let Some((Some(0), Some(lease), _, Some(digest))) = row.await? else { return Ok(false) };
        if lease != lease_until_ms {
            return Ok(false);
        }
        for w in wakeups {
            let r = &w.route;
            let values = (
                queue_of(&w.id),
                &w.id,
                r.tenant.as_str(),
                r.account_id.as_str(),
                r.device_id.as_str(),
                w.registration_id.as_str(),
                &w.payload,
                &w.collapse_key,
                w.not_before_ms,
                i32::try_from(w.attempts).unwrap_or(i32::MAX),
                w.expires_at_ms,
                ttl_until(w.expires_at_ms),
            );
            // Not applied: that wakeup is stored already (the merge).
            self.session.lwt(&st.wakeup_insert, values).await?;
        }
        let values =
            (ttl_until(expires_at_ms), response, lease_until_ms, expires_at_ms, digest, tenant, idem, lease_until_ms);
        Ok(self.session.lwt(&st.notify_commit, values).await?.applied)
    }

    async fn notify_release(&self, key: &NotifyKey, lease_until_ms: i64) -> Result<(), StoreError> {
        let values = (key.tenant.as_str(), key.idempotency_key.as_str(), lease_until_ms);
        self.session.lwt(&self.st.notify_release, values).await?;
        Ok(())
    }

    async fn wakeups_due(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<LeasedWakeup>, StoreError> {
        let st = &self.st;
        let mut out = Vec::new();
        // Start at a random queue so that concurrent workers spread out.
        let first = rand::random_range(0..WAKEUP_QUEUES);
        for i in 0..WAKEUP_QUEUES {
            if out.len() >= limit {
                break;
            }
            let queue = ((first + i) % WAKEUP_QUEUES) as i16;
            let rows: Vec<WakeupRow> =
                all_rows(&self.session, &st.wakeup_queue, (queue,), "reading the wakeups").await?;
            for row in rows {
                if out.len() >= limit {
                    break;
                }
                let Some(leased) = decode_wakeup(row)? else { continue };
                if leased.wakeup.not_before_ms > now_ms || leased.lease_until_ms > now_ms {
                    continue;
                }
                let w = &leased.wakeup;
                let values = (ttl_until(w.expires_at_ms), lease_until_ms, queue, &w.id, leased.lease_until_ms);
                if self.session.lwt(&st.wakeup_lease, values).await?.applied {
                    out.push(LeasedWakeup { lease_until_ms, ..leased });
                }
            }
        }
        Ok(out)
    }

    async fn wakeup_reschedule(
        &self,
        leased: &LeasedWakeup,
        not_before_ms: i64,
        attempts: u32,
    ) -> Result<bool, StoreError> {
        let w = &leased.wakeup;
        let values = (
            ttl_until(w.expires_at_ms),
            not_before_ms,
            i32::try_from(attempts).unwrap_or(i32::MAX),
            queue_of(&w.id),
            &w.id,
            leased.lease_until_ms,
        );
        Ok(self.session.lwt(&self.st.wakeup_reschedule, values).await?.applied)
    }

    async fn wakeup_delete(&self, leased: &LeasedWakeup) -> Result<bool, StoreError> {
        let w = &leased.wakeup;
        let values = (queue_of(&w.id), &w.id, leased.lease_until_ms);
        Ok(self.session.lwt(&self.st.wakeup_delete, values).await?.applied)
    }

    async fn state(&self, tenant: &ServiceId, key: &[u8], now_ms: i64) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.read_state(tenant, key).await?.filter(|(_, e)| *e > now_ms).map(|(v, _)| v))
    }

    async fn state_cas(
        &self,
        tenant: &ServiceId,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let st = &self.st;
        let ttl = ttl_until(expires_at_ms);
        let current = self.read_state(tenant, key).await?;
        let live = current.as_ref().filter(|(_, e)| *e > now_ms).map(|(v, _)| v.as_slice());
        if live != expected {
            return Ok(false);
        }
        match current {
            None => {
                let values = (ttl, new, expires_at_ms, tenant.as_str(), key);
                Ok(self.session.lwt(&st.state_insert, values).await?.applied)
            }
            // Conditional on exactly what was read (an expired value is
            // replaced too): of two writers, one wins.
            Some((value, expires)) => {
                let values = (ttl, new, expires_at_ms, tenant.as_str(), key, value, expires);
                Ok(self.session.lwt(&st.state_update, values).await?.applied)
            }
        }
    }

    async fn delete_expired(&self, _now_ms: i64) -> Result<u64, StoreError> {
        // Every row is written with a TTL ending at its expires_at.
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_id_that_no_longer_parses_is_a_corrupt_row() {
        let key = RouteKey {
            tenant: ServiceId::parse("station").unwrap(),
            account_id: AccountId::parse("ak:account:a").unwrap(),
            device_id: DeviceId::parse("ak:device:01964137-0000-7000-8000-000000000001").unwrap(),
        };
        let target = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8";
        let row = |registration_id: &str| -> RouteRow {
            let text = |s: &str| Some(s.to_owned());
            let id = text(registration_id);
            (id, text(target), text("fcm_main"), text("e1"), text("fcm:t"), None, None, None, None, Some(1), None)
        };
        assert!(decode_route(&key, row("registration-current-1")).unwrap().is_some());
        let err = decode_route(&key, row("reg-1")).unwrap_err();
        assert_eq!(err.to_string(), corrupt("route").to_string());
    }
}
