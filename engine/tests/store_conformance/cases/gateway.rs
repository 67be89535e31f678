//! Spec 002: the push gateway's records (`fanout_engine::domain`, through
//! `Store::gateway`).

use fanout_engine::domain::{
    AccountId, DeviceId, GatewayRegistration, GatewayWakeup, IdempotencyKey, LeasedWakeup, NotifyClaim, NotifyKey,
    PushRouteId, PushTargetId, RegistrationId, Revoke, RouteKey, SaltEpochId, ServiceId,
};
use fanout_engine::store::Store;

use super::{HOUR_MS, assert_pruned, base_ms};

fn tenant(name: &str) -> ServiceId {
    ServiceId::parse(name).unwrap()
}

fn device(n: u8) -> DeviceId {
    DeviceId::parse(&format!("ak:device:01964137-0000-7000-8000-0000000000{n:02x}")).unwrap()
}

/// The `n`th registration id of a device (22 base64url characters).
fn reg_id(device: u8, n: u32) -> RegistrationId {
    RegistrationId::parse(&format!("registration-{device:03}-{n:05}")).unwrap()
}

fn registration(tenant_name: &str, device_n: u8, n: u32, now: i64) -> GatewayRegistration {
    let mut target = [0; 32];
    target[0] = device_n;
    target[1..5].copy_from_slice(&n.to_be_bytes());
    GatewayRegistration {
        tenant: tenant(tenant_name),
        account_id: AccountId::parse("ak:account:alice").unwrap(),
        device_id: device(device_n),
        registration_id: reg_id(device_n, n),
        push_target_id: PushTargetId::from_bytes(target),
        push_route_id: PushRouteId::FcmMain,
        salt_epoch_id: SaltEpochId::parse("e1").unwrap(),
        push_key: format!("token-{device_n}-{n}"),
        platform: Some("android".into()),
        app_id: Some("com.example.app".into()),
        visible_opt_in: n % 2 == 1,
        created_at_ms: now,
        expires_at_ms: now + 24 * HOUR_MS,
        token_invalid: false,
    }
}

async fn target_ids<S: Store>(store: &S, reg: &GatewayRegistration, now: i64) -> Vec<RegistrationId> {
    let found = store.gateway().target(&reg.tenant, &reg.push_target_id, now).await.unwrap();
    found.into_iter().map(|r| r.registration_id).collect()
}

/// §3.1: a registration round-trips whole; a new one for the same device
/// supersedes it in one step (its target no longer finds it); tenants are
/// separate partitions.
pub async fn gateway_register_supersedes<S: Store>(store: &S) {
    let now = base_ms();
    let first = registration("station-a", 1, 1, now);
    assert_eq!(store.gateway().register(&first).await.unwrap(), None);
    assert_eq!(store.gateway().route(&first.route_key(), now).await.unwrap(), Some(first.clone()));
    assert_eq!(store.gateway().target(&first.tenant, &first.push_target_id, now).await.unwrap(), vec![first.clone()]);

    let second = registration("station-a", 1, 2, now);
    assert_eq!(store.gateway().register(&second).await.unwrap(), Some(first.registration_id.clone()));
    assert!(target_ids(store, &first, now).await.is_empty());
    assert_eq!(target_ids(store, &second, now).await, vec![second.registration_id.clone()]);
    assert_eq!(store.gateway().route(&first.route_key(), now).await.unwrap(), Some(second.clone()));

    // The same target again (same epoch and route): found once, the new one.
    let third = GatewayRegistration { registration_id: reg_id(1, 3), push_key: "token-1-3".into(), ..second.clone() };
    assert_eq!(store.gateway().register(&third).await.unwrap(), Some(second.registration_id.clone()));
    assert_eq!(target_ids(store, &third, now).await, vec![reg_id(1, 3)]);

    // Another device of the same target name, and the same device in another tenant.
    let other_device =
        GatewayRegistration { push_target_id: third.push_target_id, ..registration("station-a", 2, 1, now) };
    store.gateway().register(&other_device).await.unwrap();
    let mut both = target_ids(store, &third, now).await;
    both.sort();
    assert_eq!(both, vec![reg_id(1, 3), reg_id(2, 1)]);
    let elsewhere = registration("station-b", 1, 1, now);
    assert_eq!(store.gateway().register(&elsewhere).await.unwrap(), None);
    assert_eq!(store.gateway().route(&third.route_key(), now).await.unwrap().unwrap().registration_id, reg_id(1, 3));
    assert!(store.gateway().target(&tenant("station-b"), &third.push_target_id, now).await.unwrap().is_empty());
    assert_eq!(target_ids(store, &elsewhere, now).await, vec![reg_id(1, 1)]);
}

/// Never two current routes, whatever the interleaving of registers.
pub async fn gateway_concurrent_registers_leave_one_route<S: Store>(store: &S) {
    let now = base_ms();
    let regs: Vec<_> = (1..=6).map(|n| registration("station-a", 3, n, now)).collect();
    let answers = futures::future::join_all(regs.iter().map(|r| store.gateway().register(r))).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let current = store.gateway().route(&regs[0].route_key(), now).await.unwrap().unwrap();
    let mut found = 0;
    for r in &regs {
        let ids = target_ids(store, r, now).await;
        if r.registration_id == current.registration_id {
            assert_eq!(ids, vec![current.registration_id.clone()]);
        } else {
            assert!(ids.is_empty(), "a superseded registration is still found: {ids:?}");
        }
        found += ids.len();
    }
    assert_eq!(found, 1);
    // Exactly one register saw no predecessor.
    assert_eq!(answers.iter().filter(|a| matches!(a, Ok(None))).count(), 1);
}

/// §3.2: unregister removes the current route, narrowed by push key and app
/// id when given; §3.1: past expires_at a registration is not used, and
/// retention deletes it.
pub async fn gateway_unregister_and_expiry<S: Store>(store: &S) {
    let now = base_ms();
    let reg = registration("station-a", 4, 1, now);
    store.gateway().register(&reg).await.unwrap();
    let revoke = |push_key: Option<&str>, app_id: Option<&str>| Revoke {
        route: reg.route_key(),
        push_key: push_key.map(str::to_owned),
        app_id: app_id.map(str::to_owned),
    };
    assert!(!store.gateway().unregister(&revoke(Some("another-token"), None)).await.unwrap());
    assert!(!store.gateway().unregister(&revoke(None, Some("com.other"))).await.unwrap());
    assert_eq!(target_ids(store, &reg, now).await, vec![reg.registration_id.clone()]);
    assert!(store.gateway().unregister(&revoke(Some("token-4-1"), Some("com.example.app"))).await.unwrap());
    assert!(target_ids(store, &reg, now).await.is_empty());
    assert_eq!(store.gateway().route(&reg.route_key(), now).await.unwrap(), None);
    assert!(!store.gateway().unregister(&revoke(None, None)).await.unwrap());
    // Unknown devices and tenants: nothing to do, no error.
    let nobody = Revoke { route: nobody(), push_key: None, app_id: None };
    assert!(!store.gateway().unregister(&nobody).await.unwrap());

    // Expiry.
    let short = GatewayRegistration { expires_at_ms: now + HOUR_MS, ..registration("station-a", 5, 1, now) };
    store.gateway().register(&short).await.unwrap();
    assert_eq!(target_ids(store, &short, now + HOUR_MS - 1).await, vec![short.registration_id.clone()]);
    assert!(target_ids(store, &short, now + HOUR_MS).await.is_empty());
    assert_eq!(store.gateway().route(&short.route_key(), now + HOUR_MS).await.unwrap(), None);
    let long = registration("station-a", 6, 1, now);
    store.gateway().register(&long).await.unwrap();
    let deleted = store.gateway().delete_expired(now + 2 * HOUR_MS).await.unwrap();
    assert_pruned(store, deleted, 1); // short's registration
    assert_eq!(target_ids(store, &long, now + 2 * HOUR_MS).await, vec![long.registration_id.clone()]);
    // A device whose registration expired registers again.
    let again = GatewayRegistration { registration_id: reg_id(5, 2), ..registration("station-a", 5, 1, now) };
    store.gateway().register(&again).await.unwrap();
    assert_eq!(target_ids(store, &again, now).await, vec![reg_id(5, 2)]);
}

/// A route nothing was registered for.
fn nobody() -> RouteKey {
    RouteKey { tenant: tenant("t"), account_id: AccountId::parse("a").unwrap(), device_id: device(0xdd) }
}

/// §5.2 `push_token_invalid`: a dead-token mark applies only to the
/// registration that was used; a new registration starts clean.
pub async fn gateway_dead_token_mark<S: Store>(store: &S) {
    let now = base_ms();
    let reg = registration("station-a", 7, 1, now);
    store.gateway().register(&reg).await.unwrap();
    assert!(!store.gateway().mark_token_invalid(&reg.route_key(), &reg_id(7, 99)).await.unwrap());
    assert!(!store.gateway().target(&reg.tenant, &reg.push_target_id, now).await.unwrap()[0].token_invalid);
    assert!(store.gateway().mark_token_invalid(&reg.route_key(), &reg.registration_id).await.unwrap());
    let found = store.gateway().target(&reg.tenant, &reg.push_target_id, now).await.unwrap();
    assert_eq!(found.len(), 1);
    assert!(found[0].token_invalid);
    assert_eq!(found[0].push_key, reg.push_key);
    let fresh = registration("station-a", 7, 2, now);
    store.gateway().register(&fresh).await.unwrap();
    assert!(!store.gateway().route(&fresh.route_key(), now).await.unwrap().unwrap().token_invalid);
    assert!(!store.gateway().mark_token_invalid(&reg.route_key(), &reg.registration_id).await.unwrap());
    assert!(!store.gateway().mark_token_invalid(&nobody(), &reg_id(0, 0)).await.unwrap());
}

fn notify_key(name: &str, n: u8) -> NotifyKey {
    NotifyKey { tenant: tenant(name), idempotency_key: IdempotencyKey::parse(&format!("idem-{n}")).unwrap() }
}

fn wakeup(id: &str, device: u8, not_before_ms: i64, now: i64) -> GatewayWakeup {
    let reg = registration("station-a", device, 1, now);
    GatewayWakeup {
        id: id.into(),
        route: reg.route_key(),
        registration_id: reg.registration_id,
        payload: format!(r#"{{"wakeup_kind":"message","n":"{id}"}}"#).into_bytes(),
        collapse_key: "fFwYmh5Rc70O2MAFM35hPg".into(),
        not_before_ms,
        attempts: 0,
        expires_at_ms: now + HOUR_MS,
    }
}

/// §5.2 idempotency: replay, conflict, busy, lease take-over, release, expiry.
pub async fn gateway_notify_records<S: Store>(store: &S) {
    let now = base_ms();
    let (d1, d2) = ([1u8; 32], [2u8; 32]);
    let (lease, expires) = (now + 30_000, now + 24 * HOUR_MS);
    let k = notify_key("station-a", 1);
    assert_eq!(store.gateway().notify_claim(&k, &d1, now, lease, expires).await.unwrap(), NotifyClaim::Claimed);
    assert_eq!(
        store.gateway().notify_claim(&k, &d1, now + 1, now + 40_000, expires).await.unwrap(),
        NotifyClaim::Busy { lease_until_ms: lease }
    );
    assert_eq!(
        store.gateway().notify_claim(&k, &d2, now + 1, now + 40_000, expires).await.unwrap(),
        NotifyClaim::Conflict
    );
    // Not this claim's lease: nothing stored.
    assert!(!store.gateway().notify_commit(&k, lease + 1, b"other", &[], expires).await.unwrap());
    assert!(store.gateway().notify_commit(&k, lease, br#"{"outcomes":[]}"#, &[], expires).await.unwrap());
    for _ in 0..2 {
        assert_eq!(
            store.gateway().notify_claim(&k, &d1, now + 2, now + 40_000, expires).await.unwrap(),
            NotifyClaim::Replay(br#"{"outcomes":[]}"#.to_vec())
        );
    }
    assert_eq!(
        store.gateway().notify_claim(&k, &d2, now + 2, now + 40_000, expires).await.unwrap(),
        NotifyClaim::Conflict
    );
    // A committed record is neither released nor committed again.
    store.gateway().notify_release(&k, lease).await.unwrap();
    assert!(!store.gateway().notify_commit(&k, lease, b"again", &[], expires).await.unwrap());
    assert!(matches!(
        store.gateway().notify_claim(&k, &d1, now + 3, lease, expires).await.unwrap(),
        NotifyClaim::Replay(_)
    ));
    // The same key in another tenant is another request.
    let other = notify_key("station-b", 1);
    assert_eq!(store.gateway().notify_claim(&other, &d2, now, lease, expires).await.unwrap(), NotifyClaim::Claimed);

    // Release frees the key; a dead claimant's claim is taken over after its lease.
    let k2 = notify_key("station-a", 2);
    assert_eq!(store.gateway().notify_claim(&k2, &d1, now, lease, expires).await.unwrap(), NotifyClaim::Claimed);
    store.gateway().notify_release(&k2, lease + 1).await.unwrap();
    assert!(matches!(
        store.gateway().notify_claim(&k2, &d1, now + 1, lease, expires).await.unwrap(),
        NotifyClaim::Busy { .. }
    ));
    store.gateway().notify_release(&k2, lease).await.unwrap();
    assert_eq!(store.gateway().notify_claim(&k2, &d2, now + 2, lease, expires).await.unwrap(), NotifyClaim::Claimed);
    let later = lease + 1;
    assert_eq!(
        store.gateway().notify_claim(&k2, &d2, later, later + 30_000, expires).await.unwrap(),
        NotifyClaim::Claimed
    );
    assert!(!store.gateway().notify_commit(&k2, lease, b"late", &[], expires).await.unwrap());
    assert!(store.gateway().notify_commit(&k2, later + 30_000, b"taken over", &[], expires).await.unwrap());
    assert_eq!(
        store.gateway().notify_claim(&k2, &d2, later + 1, later + 60_000, expires).await.unwrap(),
        NotifyClaim::Replay(b"taken over".to_vec())
    );

    // Past its retention period a record no longer counts.
    let short = notify_key("station-a", 3);
    assert_eq!(
        store.gateway().notify_claim(&short, &d1, now, lease, now + HOUR_MS).await.unwrap(),
        NotifyClaim::Claimed
    );
    assert!(store.gateway().notify_commit(&short, lease, b"r", &[], now + HOUR_MS).await.unwrap());
    let after = now + HOUR_MS;
    assert_eq!(
        store.gateway().notify_claim(&short, &d2, after, after + 30_000, after + HOUR_MS).await.unwrap(),
        NotifyClaim::Claimed
    );
    let deleted = store.gateway().delete_expired(now + 3 * HOUR_MS).await.unwrap();
    assert_pruned(store, deleted, 1); // short's record
    assert!(matches!(
        store.gateway().notify_claim(&k, &d1, now + 3, lease, expires).await.unwrap(),
        NotifyClaim::Replay(_)
    ));
}

pub async fn gateway_concurrent_notify_claims_have_one_winner<S: Store>(store: &S) {
    let now = base_ms();
    let k = notify_key("station-a", 9);
    let claims = (0..8).map(|i| store.gateway().notify_claim(&k, &[9; 32], now, now + 30_000 + i, now + HOUR_MS));
    let answers = futures::future::join_all(claims).await;
    let won = answers.iter().filter(|a| matches!(a, Ok(NotifyClaim::Claimed))).count();
    assert_eq!(won, 1, "{answers:?}");
    assert!(answers.iter().all(|a| matches!(a, Ok(NotifyClaim::Claimed | NotifyClaim::Busy { .. }))), "{answers:?}");
}

async fn commit_wakeups<S: Store>(store: &S, n: u8, wakeups: &[GatewayWakeup], now: i64) {
    let k = notify_key("station-a", n);
    assert_eq!(
        store.gateway().notify_claim(&k, &[n; 32], now, now + 30_000, now + HOUR_MS).await.unwrap(),
        NotifyClaim::Claimed
    );
    assert!(store.gateway().notify_commit(&k, now + 30_000, b"{}", wakeups, now + HOUR_MS).await.unwrap());
}

fn ids(leased: &[LeasedWakeup]) -> Vec<String> {
    let mut ids: Vec<_> = leased.iter().map(|l| l.wakeup.id.clone()).collect();
    ids.sort();
    ids
}

/// §5.2 `accepted`: wakeups stored with the answer, leased by one worker at
/// a time, taken over when a lease runs out, rescheduled and deleted only by
/// their lease holder; a wakeup id stored twice is one wakeup (the merge).
pub async fn gateway_wakeups_are_leased<S: Store>(store: &S) {
    let now = base_ms();
    let soon = wakeup(&format!("{:032x}", 1), 1, now, now);
    let later = wakeup(&format!("{:032x}", 2), 2, now + 60_000, now);
    commit_wakeups(store, 20, &[soon.clone(), later.clone()], now).await;
    let lease = now + 30_000;
    let taken = store.gateway().wakeups_due(now, lease, 10).await.unwrap();
    assert_eq!(taken, vec![LeasedWakeup { wakeup: soon.clone(), lease_until_ms: lease }]);
    assert!(store.gateway().wakeups_due(now + 1, now + 40_000, 10).await.unwrap().is_empty());

    // The merge: the same id again keeps the stored wakeup as it is.
    let merged = GatewayWakeup { payload: b"{}".to_vec(), ..later.clone() };
    commit_wakeups(store, 21, &[merged], now).await;

    // The worker died: after its lease another takes the wakeup over.
    let taken_over = store.gateway().wakeups_due(lease, lease + 30_000, 10).await.unwrap();
    assert_eq!(ids(&taken_over), vec![soon.id.clone()]);
    let old = &taken[0];
    assert!(!store.gateway().wakeup_reschedule(old, now + 5_000, 1).await.unwrap());
    assert!(!store.gateway().wakeup_delete(old).await.unwrap());
    let held = &taken_over[0];
    assert!(store.gateway().wakeup_reschedule(held, lease + 10_000, 1).await.unwrap());
    assert!(store.gateway().wakeups_due(lease + 9_999, lease + 50_000, 10).await.unwrap().is_empty());

    // Both are due at the later time; the retry carries its attempt count.
    let t = now + 60_000;
    let due = store.gateway().wakeups_due(t, t + 30_000, 10).await.unwrap();
    assert_eq!(ids(&due), vec![soon.id.clone(), later.id.clone()]);
    let retried = due.iter().find(|l| l.wakeup.id == soon.id).unwrap();
    assert_eq!(retried.wakeup.attempts, 1);
    assert_eq!(retried.wakeup.not_before_ms, lease + 10_000);
    assert_eq!(due.iter().find(|l| l.wakeup.id == later.id).unwrap().wakeup.payload, later.payload);
    for l in &due {
        assert!(store.gateway().wakeup_delete(l).await.unwrap());
        assert!(!store.gateway().wakeup_delete(l).await.unwrap());
    }
    assert!(store.gateway().wakeups_due(t + HOUR_MS / 2, t + HOUR_MS, 10).await.unwrap().is_empty());

    // `limit`, and concurrent workers never lease the same wakeup.
    let many: Vec<_> = (10..22).map(|n| wakeup(&format!("{n:032x}"), 1, now, now)).collect();
    commit_wakeups(store, 22, &many, now).await;
    assert_eq!(store.gateway().wakeups_due(now, now + 1, 5).await.unwrap().len(), 5);
    let (a, b) = futures::join!(
        store.gateway().wakeups_due(now + 2, now + 30_000, 100),
        store.gateway().wakeups_due(now + 2, now + 30_001, 100)
    );
    let (a, b) = (ids(&a.unwrap()), ids(&b.unwrap()));
    assert_eq!(a.len() + b.len(), 12, "{a:?} {b:?}");
    assert!(a.iter().all(|id| !b.contains(id)), "{a:?} {b:?}");
}

/// §2.4 / §4.5 / §5.1 window state: compare-and-set with expiry, per tenant.
/// A value kept only until now (the ledger of a device whose last wake-up
/// went: kept 1 ms) is absent to the next change, which sets it from
/// absent: at once, while the backend still holds the row (ScyllaDB's TTL is
/// whole seconds), and after the backend let the value expire under a row
/// that lives on (ScyllaDB: the first write's row marker, with its longer
/// TTL).
pub async fn gateway_state_replaces_a_value_expired_but_still_held<S: Store>(store: &S) {
    let station = tenant("station-a");
    let now = base_ms();
    for (key, wait) in [(b"ledger-1", 0), (b"ledger-2", 1_100)] {
        assert!(store.gateway().state_cas(&station, key, None, b"[1]", now, now + HOUR_MS).await.unwrap());
        assert!(store.gateway().state_cas(&station, key, Some(b"[1]"), b"[]", now, now + 1).await.unwrap());
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        let later = base_ms().max(now + 2);
        assert_eq!(store.gateway().state(&station, key, later).await.unwrap(), None);
        assert!(store.gateway().state_cas(&station, key, None, b"[2]", later, later + HOUR_MS).await.unwrap());
        assert_eq!(store.gateway().state(&station, key, later).await.unwrap(), Some(b"[2]".to_vec()));
        assert!(store.gateway().state_cas(&station, key, Some(b"[2]"), b"[3]", later, later + HOUR_MS).await.unwrap());
    }
}

pub async fn gateway_state_compare_and_set<S: Store>(store: &S) {
    let now = base_ms();
    let expires = now + HOUR_MS;
    let key = b"dedup\x00window-1";
    let (station_a, station_b) = (tenant("station-a"), tenant("station-b"));
    assert_eq!(store.gateway().state(&station_a, key, now).await.unwrap(), None);
    assert!(store.gateway().state_cas(&station_a, key, None, b"a", now, expires).await.unwrap());
    assert!(!store.gateway().state_cas(&station_a, key, None, b"b", now, expires).await.unwrap());
    assert_eq!(store.gateway().state(&station_a, key, now).await.unwrap(), Some(b"a".to_vec()));
    assert!(!store.gateway().state_cas(&station_a, key, Some(b"x"), b"b", now, expires).await.unwrap());
    assert!(store.gateway().state_cas(&station_a, key, Some(b"a"), b"b", now, expires).await.unwrap());
    assert_eq!(store.gateway().state(&station_a, key, now).await.unwrap(), Some(b"b".to_vec()));
    assert_eq!(store.gateway().state(&station_b, key, now).await.unwrap(), None);
    assert!(store.gateway().state_cas(&station_b, key, None, b"z", now, expires).await.unwrap());
    // Expired: absent, and set again from absent.
    assert_eq!(store.gateway().state(&station_a, key, expires).await.unwrap(), None);
    assert!(!store.gateway().state_cas(&station_a, key, Some(b"b"), b"c", expires, expires + HOUR_MS).await.unwrap());
    assert!(store.gateway().state_cas(&station_a, key, None, b"c", expires, expires + HOUR_MS).await.unwrap());
    assert_eq!(store.gateway().state(&station_a, key, expires).await.unwrap(), Some(b"c".to_vec()));
    // Concurrent setters from absent: one wins.
    let k2 = b"count";
    let values: Vec<[u8; 1]> = (0..6u8).map(|i| [i]).collect();
    let sets = values.iter().map(|v| store.gateway().state_cas(&station_a, k2, None, v, now, expires));
    let won = futures::future::join_all(sets).await.into_iter().filter(|r| matches!(r, Ok(true))).count();
    assert_eq!(won, 1);
    let deleted = store.gateway().delete_expired(expires + 2 * HOUR_MS).await.unwrap();
    assert_pruned(store, deleted, 3); // station_a's and station_b's `key`, and `count`
}
