//! PUSH-238 and PUSH-260 against the real engine: the desired set goes up
//! after enable, each host change sends exactly its difference, a
//! server-side deletion is recovered, a count mismatch is repaired over later
//! runs, keys are re-uploaded, renewal happens, and the background loop runs
//! on triggers and at start.

use std::sync::Arc;
use std::time::Duration;

use fanout_client::sender_key::{GroupKey, HmacEpoch};
use fanout_client::{
    ConsentState::*, ConversationKind::*, MemoryStore, NotificationState, Override, RootKey, RuleOptions, StateStore,
    TokioRunner, Trigger,
};
use fanout_proto::v1 as pb;

use crate::common::*;

fn current_epoch(setup: &ClientSetup) -> i64 {
    use fanout_client::Clock as _;
    HmacEpoch::at(setup.clock.now()).0
}

#[tokio::test]
async fn enable_registers_then_the_desired_set_goes_up_with_its_key_windows() {
    let (_engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    s.host.join(&group(1), Group, Allowed);
    s.host.join(&group(2), Dm, Allowed);
    s.host.join(&group(3), Group, Unknown);
    s.host.join(&group(4), Sync, Allowed);

    let state = s.client.enable(webhook_target(), RuleOptions::default()).await.expect("enable");
    assert_eq!(state.channel, pb::Channel::Http);
    assert_eq!(state.topic_count, 0);
    assert_eq!(s.client.state(), NotificationState::Enabled);
    s.client.sync_now().await.expect("sync");

    let calls = tap.calls();
    let Call::Register { delivery: Some(pb::register_request::Delivery::Http(http)), .. } = &calls[0].call else {
        panic!("{calls:?}")
    };
    assert_eq!((http.url.as_str(), http.signing_key.as_slice()), ("https://127.0.0.1:9/hook", &[7; 32][..]));
    assert_eq!(calls.len(), 2, "Register, then one UpdateSubscriptions: {calls:?}");
    let (adds, removes) = calls[1].update().expect("an update");
    assert!(removes.is_empty());
    assert_eq!(
        topics_of(adds),
        sorted(vec![
            group(1).topic().as_bytes().to_vec(),
            group(2).topic().as_bytes().to_vec(),
            s.host.welcome().as_bytes().to_vec()
        ])
    );
    assert_eq!(calls[1].answer, Ok(3));
    let epoch = current_epoch(&s);
    let root = RootKey::new(&[0x2a; 42]).unwrap();
    for add in adds {
        assert!(!add.include_commits);
        if add.topic == s.host.welcome().as_bytes() {
            assert_eq!((add.hmac_epoch_base, add.hmac_keys.len()), (0, 0), "the welcome subscription has no keys");
            continue;
        }
        let gid = if add.topic == group(1).topic().as_bytes() { group(1) } else { group(2) };
        assert_eq!(add.hmac_epoch_base, epoch - 1);
        let expected: Vec<Vec<u8>> =
            (epoch - 1..=epoch + 1).map(|e| GroupKey::derive(&root, &gid, HmacEpoch(e)).as_bytes().to_vec()).collect();
        assert_eq!(add.hmac_keys, expected, "keys for current-1, current, current+1 in that order");
    }
    assert_eq!(s.client.stored().uploaded.len(), 3);
}

#[tokio::test]
async fn membership_consent_and_override_changes_send_exactly_their_difference() {
    let (_engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    for n in [1, 2] {
        s.host.join(&group(n), Group, Allowed);
    }
    s.host.join(&group(3), Group, Unknown);
    s.client
        .enable(webhook_target(), RuleOptions { include_welcomes: Some(false), ..RuleOptions::default() })
        .await
        .unwrap();
    s.client.sync_now().await.unwrap();
    assert_eq!(tap.calls().last().unwrap().answer, Ok(2));

    // A membership commit (left 2, joined 5) and a consent write (3 allowed).
    let before = tap.count();
    s.host.leave(&group(2));
    s.host.join(&group(5), Group, Allowed);
    s.host.set_consent(&group(3), Allowed);
    s.client.sync_now().await.unwrap();
    let calls = tap.calls_since(before);
    let shapes: Vec<_> = calls.iter().map(|c| c.update().map(|(a, r)| (topics_of(a), sorted(r.to_vec())))).collect();
    assert_eq!(
        shapes,
        vec![
            Some((vec![], vec![group(2).topic().as_bytes().to_vec()])),
            Some((sorted(vec![group(3).topic().as_bytes().to_vec(), group(5).topic().as_bytes().to_vec()]), vec![])),
        ],
        "removes, then adds, nothing else"
    );
    assert_eq!(calls.last().unwrap().answer, Ok(3));

    // An override replaces the consent rule, both ways.
    let before = tap.count();
    s.client.set_override(&group(1), Some(Override::Disabled)).unwrap();
    assert_eq!(s.client.effective_value(&group(1)).unwrap(), Some(false));
    s.client.sync_now().await.unwrap();
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].update().unwrap().1, &[group(1).topic().as_bytes().to_vec()]);

    let before = tap.count();
    s.client.set_override(&group(1), None).unwrap();
    assert_eq!(s.client.effective_value(&group(1)).unwrap(), Some(true));
    assert_eq!(s.client.effective_value(&group(99)).unwrap(), None, "unknown conversation");
    s.client.sync_now().await.unwrap();
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 1);
    assert_eq!(topics_of(calls[0].update().unwrap().0), vec![group(1).topic().as_bytes().to_vec()]);
    assert_eq!(calls[0].answer, Ok(3));

    // Nothing changed: the next run sends nothing.
    let before = tap.count();
    let report = s.client.sync_now().await.unwrap();
    assert!(report.updates.is_empty(), "{report:?}");
    assert_eq!(tap.count(), before);
}

#[tokio::test]
async fn a_server_side_deletion_is_recovered_by_register_and_a_full_resend() {
    let (engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    for n in [1, 2, 3] {
        s.host.join(&group(n), Group, Allowed);
    }
    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
    s.client.sync_now().await.unwrap();

    // The backend loses the recipient (expiry, a restore from backup).
    delete_behind_the_back(&engine, &s.client).await;

    let before = tap.count();
    s.host.join(&group(4), Group, Allowed);
    let report = s.client.sync_now().await.expect("recovered in the same run");
    assert!(report.recovered);
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(calls[0].answer, Err(tonic::Code::NotFound));
    assert!(calls[1].is_register());
    assert_eq!(calls[1].answer, Ok(0));
    let (adds, _) = calls[2].update().unwrap();
    assert_eq!(adds.len(), 5, "every desired topic again: 4 groups and the welcome topic");
    assert_eq!(calls[2].answer, Ok(5));
    assert!(!s.client.stored().resend_all);
}

#[tokio::test]
async fn a_topic_count_mismatch_is_repaired_over_later_runs_without_clearing_the_record() {
    let (engine, tap) = engine_and_tap("").await;
    let s = client_with(tap.addr, TestHost::new(1), Arc::new(MemoryStore::new()), held(), |c| c.max_batch = 2);
    for n in 1..=5 {
        s.host.join(&group(n), Group, Allowed);
    }
    let rules = RuleOptions { include_welcomes: Some(false), ..RuleOptions::default() };
    s.client.enable(webhook_target(), rules).await.unwrap();
    s.client.sync_now().await.unwrap();
    let sizes: Vec<usize> = tap.calls().iter().filter_map(|c| c.update()).map(|(a, _)| a.len()).collect();
    assert_eq!(sizes, vec![2, 2, 1], "batches of max_batch");

    // Two topics vanish behind the client's back.
    let identity = s.client.stored().identity.unwrap();
    let lost = vec![group(1).topic().as_bytes().to_vec(), group(2).topic().as_bytes().to_vec()];
    raw(&engine)
        .await
        .update_subscriptions(pb::UpdateSubscriptionsRequest {
            recipient_id: identity.id().to_vec(),
            recipient_secret: identity.secret().to_vec(),
            adds: vec![],
            removes: lost,
        })
        .await
        .unwrap();

    // The next request sees 4 where the client holds 6: the record is kept
    // and the repair is left to later runs.
    s.host.join(&group(6), Group, Allowed);
    let report = s.client.sync_now().await.unwrap();
    assert!(report.count_mismatch);
    assert_eq!(tap.calls().last().unwrap().answer, Ok(4));
    let stored = s.client.stored();
    assert_eq!(stored.uploaded.len(), 6, "a mismatch never discards the uploaded set");
    assert!(stored.resend_all);

    // The next run re-sends all six, in batches, and the counts agree again.
    let before = tap.count();
    let report = s.client.sync_now().await.unwrap();
    assert_eq!(report.updates, vec![(2, 0), (2, 0), (2, 0)]);
    assert!(!report.count_mismatch);
    assert_eq!(tap.calls().last().unwrap().answer, Ok(6));
    let resent: Vec<Vec<u8>> = tap.calls_since(before).iter().flat_map(|c| topics_of(c.update().unwrap().0)).collect();
    assert_eq!(sorted(resent), sorted((1..=6).map(|n| group(n).topic().as_bytes().to_vec()).collect()));
    assert!(!s.client.stored().resend_all);
    let before = tap.count();
    s.client.sync_now().await.unwrap();
    assert_eq!(tap.count(), before, "repaired: nothing more to send");
}

#[tokio::test]
async fn a_new_epoch_or_a_new_root_key_re_uploads_the_key_window() {
    let (_engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    s.host.set_root(None);
    s.host.join(&group(1), Group, Allowed);
    let rules = RuleOptions { include_welcomes: Some(false), ..RuleOptions::default() };
    s.client.enable(webhook_target(), rules).await.unwrap();
    s.client.sync_now().await.unwrap();
    let first = tap.calls().last().unwrap().update().unwrap().0.to_vec();
    assert!(first[0].hmac_keys.is_empty(), "no root key yet: no keys");

    // The root key arrives (SYNC-022): the subscription goes again with keys.
    let before = tap.count();
    s.host.set_root(Some(RootKey::new(&[1; 42]).unwrap()));
    s.client.changed(Trigger::RootKeyChanged);
    s.client.sync_now().await.unwrap();
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let sub = &calls[0].update().unwrap().0[0];
    assert_eq!((sub.hmac_keys.len(), sub.hmac_epoch_base), (3, current_epoch(&s) - 1));

    // Within the window: nothing to send.
    let before = tap.count();
    s.client.sync_now().await.unwrap();
    assert_eq!(tap.count(), before);

    // One epoch on, the window no longer covers the next epoch (PUSH-229).
    s.clock.advance(2_592_000);
    let before = tap.count();
    s.client.sync_now().await.unwrap();
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 1);
    let sub = &calls[0].update().unwrap().0[0];
    assert_eq!(sub.hmac_epoch_base, current_epoch(&s) - 1);

    // A root key change re-sends too.
    let before = tap.count();
    s.host.set_root(Some(RootKey::new(&[2; 42]).unwrap()));
    s.client.sync_now().await.unwrap();
    assert_eq!(tap.calls_since(before).len(), 1);
}

#[tokio::test]
async fn a_window_uploaded_while_the_clock_ran_fast_goes_again_when_it_moves_back() {
    let (_engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    s.host.join(&group(1), Group, Allowed);
    let rules = RuleOptions { include_welcomes: Some(false), ..RuleOptions::default() };
    // Three epochs (90 days) fast when the window is first uploaded.
    s.clock.advance(3 * 2_592_000);
    s.client.enable(webhook_target(), rules).await.unwrap();
    s.client.sync_now().await.unwrap();
    let fast_base = tap.calls().last().unwrap().update().unwrap().0[0].hmac_epoch_base;
    assert_eq!(fast_base, current_epoch(&s) - 1);

    // The clock is set right: the window starts after the next epoch, so it
    // no longer covers it and goes again (PUSH-229).
    s.clock.advance(-3 * 2_592_000);
    let before = tap.count();
    s.client.sync_now().await.unwrap();
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let sub = &calls[0].update().unwrap().0[0];
    assert_eq!((sub.hmac_keys.len(), sub.hmac_epoch_base), (3, current_epoch(&s) - 1));
    assert_eq!(sub.hmac_epoch_base, fast_base - 3);
}

#[tokio::test]
async fn a_run_renews_before_expiry_and_at_once_when_started_after_it() {
    let (_engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
    s.client.sync_now().await.unwrap();
    let before = tap.count();
    s.client.sync_now().await.unwrap();
    assert_eq!(tap.count(), before, "fresh: no renewal yet");

    // Past the midpoint of the 30-day TTL: an empty UpdateSubscriptions.
    s.clock.advance(16 * 86_400);
    let report = s.client.sync_now().await.unwrap();
    assert!(report.renewed);
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 1);
    let (adds, removes) = calls[0].update().unwrap();
    assert!(adds.is_empty() && removes.is_empty());

    // Started again after expiry (a stored state, a new client): the first
    // run renews.
    s.clock.advance(31 * 86_400);
    let host = s.host.clone();
    let store = s.store.clone();
    drop(s);
    let again = client_with(tap.addr, host, store, Arc::new(TokioRunner::current()), |_| {});
    again.clock.advance(47 * 86_400);
    let before = tap.count();
    again.client.start();
    let calls = tap.wait_for(before + 1, Duration::from_secs(20)).await;
    assert!(calls.len() > before, "the start run sent nothing");
    assert!(calls[before].update().is_some());
}

#[tokio::test]
async fn triggers_and_the_start_run_sync_in_the_background() {
    let (_engine, tap) = engine_and_tap("").await;
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let host = TestHost::new(1);
    let s = client_with(tap.addr, host.clone(), store.clone(), Arc::new(TokioRunner::current()), |_| {});
    s.client.start();
    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
    // Enabling is a trigger: the welcome topic goes up without sync_now.
    let calls = tap.wait_for(2, Duration::from_secs(20)).await;
    assert_eq!(calls[1].update().map(|(a, _)| a.len()), Some(1), "{calls:?}");

    // A group creation, told with changed(): returns at once, syncs later.
    s.host.join(&group(1), Group, Allowed);
    s.client.changed(Trigger::GroupCreated);
    let calls = tap.wait_for(3, Duration::from_secs(20)).await;
    assert_eq!(topics_of(calls[2].update().unwrap().0), vec![group(1).topic().as_bytes().to_vec()]);

    // The client stops; the host changes meanwhile; a new client over the
    // same store syncs at start, with the same recipient.
    drop(s);
    host.join(&group(2), Group, Allowed);
    let again = client_with(tap.addr, host, store, Arc::new(TokioRunner::current()), |_| {});
    assert_eq!(again.client.state(), NotificationState::Enabled, "read from the store, no backend call");
    again.client.start();
    let calls = tap.wait_for(4, Duration::from_secs(20)).await;
    let Call::Update { recipient_id, adds, .. } = &calls[3].call else { panic!("{calls:?}") };
    assert_eq!(topics_of(adds), vec![group(2).topic().as_bytes().to_vec()]);
    let Call::Register { recipient_id: first, .. } = &calls[0].call else { panic!() };
    assert_eq!(recipient_id, first);
}

#[tokio::test]
async fn the_periodic_run_picks_up_a_change_nobody_announced() {
    let (_engine, tap) = engine_and_tap("").await;
    let s =
        client_with(tap.addr, TestHost::new(1), Arc::new(MemoryStore::new()), Arc::new(TokioRunner::current()), |c| {
            c.sync_interval = Duration::from_secs(1)
        });
    s.client.start();
    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
    tap.wait_for(2, Duration::from_secs(20)).await;

    // A change the host never reports (a wake lost to a crash): the run at
    // most sync_interval after the last one sends it.
    s.host.join(&group(1), Group, Allowed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let wanted = group(1).topic().as_bytes().to_vec();
    while !tap.calls().iter().any(|c| c.update().is_some_and(|(a, _)| topics_of(a) == [wanted.clone()])) {
        assert!(tokio::time::Instant::now() < deadline, "no periodic run: {:?}", tap.calls());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
