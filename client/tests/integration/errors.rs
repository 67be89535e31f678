//! PUSH-240, 251, 261, 262: enable's refusals, disable's order, every status
//! of PUSH-262 driving its transition (from the real engine where it can be
//! made to answer it, from the tap where it cannot), the request bound, and
//! the one error type's kinds.

use std::sync::Arc;
use std::time::Duration;

use fanout_client::{
    ConsentState::*, ConversationKind::*, DeliveryTarget, ErrorKind, FailureCause, MemoryStore, NotificationState,
    Override, RecipientIdentity, RuleOptions, StateStore, StoredState, TokioRunner,
};
use fanout_proto::v1 as pb;
use tonic::Code;

use crate::common::*;

#[tokio::test]
async fn enable_is_refused_without_storing_anything_when_the_runner_is_off_or_the_key_is_out_of_bounds() {
    let (_engine, tap) = engine_and_tap("").await;
    let store = Arc::new(MemoryStore::new());
    let off = Arc::new(TokioRunner::disabled(tokio::runtime::Handle::current()));
    let s = client_with(tap.addr, TestHost::new(1), store.clone(), off, |_| {});
    let err = s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BackgroundTasksDisabled);
    assert_eq!(store.load().unwrap(), None);

    let s = client_with(tap.addr, TestHost::new(1), store.clone(), held(), |_| {});
    for n in [15, 65] {
        let target = DeliveryTarget::Http { url: "https://127.0.0.1:9/hook".into(), signing_key: vec![1; n] };
        let err = s.client.enable(target, RuleOptions::default()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSigningKey, "{n}");
    }
    assert_eq!(store.load().unwrap(), None, "nothing stored");
    assert_eq!(s.client.state(), NotificationState::Disabled);
    assert_eq!(tap.count(), 0, "nothing sent");
}

/// Enables with `target` and expects Register to fail the state with `cause`.
async fn expect_failed_register(
    tap: &Tap,
    s: &ClientSetup,
    target: DeliveryTarget,
    kind: ErrorKind,
    cause: FailureCause,
) {
    let err = s.client.enable(target, RuleOptions::default()).await.unwrap_err();
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(s.client.state(), NotificationState::Failed(cause));
    // No request until the app enables again.
    let before = tap.count();
    s.host.join(&group(1), Group, Allowed);
    assert_eq!(s.client.sync_now().await.unwrap_err().kind(), ErrorKind::NotEnabled);
    assert_eq!(tap.count(), before);
}

#[tokio::test]
async fn the_engines_own_refusals_fail_the_state_with_their_cause() {
    let (engine, tap) = engine_and_tap("").await;

    // PUSH-210: no APNs table on this deployment.
    let s = client(tap.addr);
    let apns = DeliveryTarget::Apns { token: "a".repeat(64) };
    expect_failed_register(&tap, &s, apns, ErrorKind::ChannelNotConfigured, FailureCause::ChannelNotConfigured).await;
    // Enabling again with a target the deployment serves recovers.
    s.client.enable(webhook_target(), RuleOptions::default()).await.expect("re-enable");
    assert_eq!(s.client.state(), NotificationState::Enabled);

    // PUSH-256: a webhook URL that is not https.
    let s = client(tap.addr);
    let plain = DeliveryTarget::Http { url: "http://127.0.0.1:9/hook".into(), signing_key: vec![1; 16] };
    expect_failed_register(&tap, &s, plain, ErrorKind::InvalidArgument, FailureCause::InvalidArgument).await;

    // PUSH-253: the stored id belongs to a recipient with another secret.
    let taken = RecipientIdentity::generate().unwrap();
    let mut raw = raw(&engine).await;
    raw.register(pb::RegisterRequest {
        recipient_id: taken.id().to_vec(),
        recipient_secret: taken.secret().to_vec(),
        delivery: Some(pb::register_request::Delivery::Fcm(pb::FcmDelivery { token: "t".into() })),
    })
    .await
    .expect_err("no FCM table: refused, nothing stored");
    raw.register(pb::RegisterRequest {
        recipient_id: taken.id().to_vec(),
        recipient_secret: taken.secret().to_vec(),
        delivery: Some(pb::register_request::Delivery::Http(pb::HttpDelivery {
            url: "https://127.0.0.1:9/other".into(),
            signing_key: vec![2; 16],
        })),
    })
    .await
    .expect("someone else's recipient");
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let mine = RecipientIdentity::from_parts(*taken.id(), [0x55; 32]);
    store.save(&StoredState { identity: Some(mine), ..StoredState::default() }).unwrap();
    let s = client_with(tap.addr, TestHost::new(1), store, held(), |_| {});
    expect_failed_register(&tap, &s, webhook_target(), ErrorKind::PermissionDenied, FailureCause::PermissionDenied)
        .await;
}

#[tokio::test]
async fn each_terminal_status_on_update_fails_the_state_until_enabled_again() {
    let (_engine, tap) = engine_and_tap("").await;
    let cases = [
        (Code::PermissionDenied, ErrorKind::PermissionDenied, FailureCause::PermissionDenied),
        (Code::InvalidArgument, ErrorKind::InvalidArgument, FailureCause::InvalidArgument),
        (Code::OutOfRange, ErrorKind::OutOfRange, FailureCause::OutOfRange),
        (Code::Unimplemented, ErrorKind::Unimplemented, FailureCause::Unimplemented),
        (Code::FailedPrecondition, ErrorKind::FailedPrecondition, FailureCause::FailedPrecondition),
    ];
    for (code, kind, cause) in cases {
        let s = client(tap.addr);
        s.host.join(&group(1), Group, Allowed);
        s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
        tap.inject("update", Fault::Status(code));
        let err = s.client.sync_now().await.unwrap_err();
        assert_eq!(err.kind(), kind, "{code:?}");
        assert_eq!(s.client.state(), NotificationState::Failed(cause), "{code:?}");
        assert!(s.client.stored().uploaded.is_empty(), "{code:?}: refused whole, so nothing is recorded as sent");

        let before = tap.count();
        s.host.join(&group(2), Group, Allowed);
        s.client.changed(fanout_client::Trigger::MembershipCommit);
        assert_eq!(s.client.sync_now().await.unwrap_err().kind(), ErrorKind::NotEnabled);
        assert_eq!(tap.count(), before, "{code:?}: no request while failed");

        // Enabling again registers and syncs.
        s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
        s.client.sync_now().await.unwrap();
        assert_eq!(s.client.state(), NotificationState::Enabled);
        assert_eq!(tap.calls().last().unwrap().answer, Ok(3), "{code:?}");
    }
}

#[tokio::test]
async fn resource_exhausted_stops_adds_until_the_desired_set_changes_and_removes_go_on() {
    let (_engine, tap) = engine_and_tap("max_push_topics = 2").await;
    let s = client(tap.addr);
    let rules = RuleOptions { include_welcomes: Some(false), ..RuleOptions::default() };
    s.host.join(&group(1), Group, Allowed);
    s.client.enable(webhook_target(), rules).await.unwrap();
    s.client.sync_now().await.unwrap();

    // Leave 1, join 2, 3, 4: the remove goes, the three adds exceed the limit.
    s.host.leave(&group(1));
    for n in [2, 3, 4] {
        s.host.join(&group(n), Group, Allowed);
    }
    let before = tap.count();
    let err = s.client.sync_now().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TopicLimit);
    assert_eq!(s.client.state(), NotificationState::Enabled, "RESOURCE_EXHAUSTED does not fail the state");
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0].update().unwrap().1.len(), 1);
    assert_eq!(calls[0].answer, Ok(0));
    assert_eq!(calls[1].answer, Err(Code::ResourceExhausted));
    assert!(s.client.stored().uploaded.is_empty(), "the refused adds are not recorded");

    // Same desired set: no adds at all.
    let before = tap.count();
    s.client.sync_now().await.unwrap();
    assert_eq!(tap.count(), before, "no adds until the desired set changes");

    // The override takes one away: the desired set changed, adds resume.
    s.client.set_override(&group(4), Some(Override::Disabled)).unwrap();
    s.client.sync_now().await.unwrap();
    let calls = tap.calls_since(before);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].update().unwrap().0.len(), 2);
    assert_eq!(calls[0].answer, Ok(2));
}

#[tokio::test]
async fn removes_continue_while_adds_are_blocked() {
    let (_engine, tap) = engine_and_tap("max_push_topics = 2").await;
    let s = client(tap.addr);
    let rules = RuleOptions { include_welcomes: Some(false), ..RuleOptions::default() };
    for n in [1, 2] {
        s.host.join(&group(n), Group, Allowed);
    }
    s.client.enable(webhook_target(), rules).await.unwrap();
    s.client.sync_now().await.unwrap();
    s.host.join(&group(3), Group, Allowed);
    assert_eq!(s.client.sync_now().await.unwrap_err().kind(), ErrorKind::TopicLimit);

    // Leaving 2 changes the desired set to {1, 3}: the remove goes first,
    // then the add fits.
    s.host.leave(&group(2));
    let before = tap.count();
    s.client.sync_now().await.unwrap();
    let calls = tap.calls_since(before);
    let shapes: Vec<_> = calls.iter().map(|c| c.update().map(|(a, r)| (a.len(), r.len()))).collect();
    assert_eq!(shapes, vec![Some((0, 1)), Some((1, 0))]);
    assert_eq!(calls[1].answer, Ok(2));
}

#[tokio::test]
async fn not_found_a_timeout_and_other_statuses_stay_enabled_and_retry() {
    let (engine, tap) = engine_and_tap("").await;
    let s = client_with(tap.addr, TestHost::new(1), Arc::new(MemoryStore::new()), held(), |c| {
        c.backend.request_timeout = Duration::from_secs(1)
    });
    s.host.join(&group(1), Group, Allowed);
    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();

    for (fault, kind) in [
        (Fault::Status(Code::Unavailable), ErrorKind::Unavailable),
        (Fault::Status(Code::Internal), ErrorKind::Unavailable),
        (Fault::Status(Code::Aborted), ErrorKind::Unavailable),
        (Fault::Hang, ErrorKind::Timeout),
    ] {
        tap.inject("update", fault);
        let err = s.client.sync_now().await.unwrap_err();
        assert_eq!(err.kind(), kind, "{fault:?}");
        assert_eq!(s.client.state(), NotificationState::Enabled, "{fault:?}");
    }
    // The outcome of an unanswered request is unknown: the adds are kept as
    // pending and go again on the next run.
    let stored = s.client.stored();
    assert_eq!(stored.uploaded.len(), 2);
    assert!(stored.uploaded.values().all(|u| !u.confirmed));
    s.client.sync_now().await.expect("the retry goes through");
    assert_eq!(tap.calls().last().unwrap().answer, Ok(2));
    assert!(s.client.stored().uploaded.values().all(|u| u.confirmed));

    // A frozen engine: the bound ends the wait, the state stays enabled.
    engine.pause().unwrap();
    s.host.join(&group(2), Group, Allowed);
    let err = s.client.sync_now().await.unwrap_err();
    engine.resume().unwrap();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(s.client.state(), NotificationState::Enabled);
    s.client.sync_now().await.expect("after the engine came back");
    assert_eq!(tap.calls().last().unwrap().answer, Ok(3));
}

#[tokio::test]
async fn a_register_that_failed_for_a_retryable_reason_is_retried_by_the_next_run() {
    let (_engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    tap.inject("register", Fault::Status(Code::Unavailable));
    let err = s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(s.client.state(), NotificationState::Enabled, "enabled, registration retried");
    let report = s.client.sync_now().await.unwrap();
    assert!(report.registered);
    let registers: Vec<_> = tap.calls().into_iter().filter(|c| c.is_register()).collect();
    assert_eq!(registers.len(), 2);
    assert_eq!(registers[1].answer, Ok(0));
}

#[tokio::test]
async fn disable_clears_before_unregister_keeps_overrides_and_stops_every_request() {
    let (_engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    s.host.join(&group(1), Group, Allowed);
    s.client.set_override(&group(1), Some(Override::Enabled)).unwrap();
    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
    s.client.sync_now().await.unwrap();
    let identity = s.client.stored().identity.unwrap();

    s.client.disable().await.expect("disable");
    let stored = s.client.stored();
    assert_eq!(stored.state, NotificationState::Disabled);
    assert_eq!(stored.target, None);
    assert!(stored.uploaded.is_empty());
    assert_eq!(stored.overrides.get(&group(1)), Some(&Override::Enabled), "overrides are kept");
    assert_eq!(stored.identity.as_ref(), Some(&identity), "the identity is kept");
    let last = tap.calls().last().unwrap().clone();
    let Call::Unregister { recipient_id } = &last.call else { panic!("{last:?}") };
    assert_eq!((recipient_id.as_slice(), last.answer), (&identity.id()[..], Ok(0)));

    // Nothing leaves while disabled, whatever the host does.
    let before = tap.count();
    s.host.join(&group(2), Group, Allowed);
    s.client.changed(fanout_client::Trigger::GroupCreated);
    assert_eq!(s.client.sync_now().await.unwrap_err().kind(), ErrorKind::NotEnabled);
    assert_eq!(tap.count(), before);

    // Enable again: the same recipient id (PUSH-201), everything re-sent.
    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
    s.client.sync_now().await.unwrap();
    let ids: Vec<Vec<u8>> = tap
        .calls()
        .into_iter()
        .filter_map(|c| match c.call {
            Call::Register { recipient_id, .. } => Some(recipient_id),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1]);
    assert_eq!(tap.calls().last().unwrap().answer, Ok(3));
}

#[tokio::test]
async fn unregister_not_found_is_success_and_a_failed_unregister_is_not_retried() {
    let (engine, tap) = engine_and_tap("").await;
    let s = client(tap.addr);
    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
    delete_behind_the_back(&engine, &s.client).await;
    s.client.disable().await.expect("NOT_FOUND on Unregister is success");
    assert_eq!(tap.calls().last().unwrap().answer, Err(Code::NotFound));

    s.client.enable(webhook_target(), RuleOptions::default()).await.unwrap();
    tap.inject("unregister", Fault::Status(Code::Unavailable));
    let err = s.client.disable().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(s.client.state(), NotificationState::Disabled, "the client stays disabled");
    let before = tap.count();
    assert_eq!(s.client.sync_now().await.unwrap_err().kind(), ErrorKind::NotEnabled);
    assert_eq!(tap.count(), before, "the Unregister is not retried");
}
