//! Spec 003, hub side: the relay channel against the real binary.
//! Registration over HTTP and gRPC (§1), the signed webhook (§2) checked by
//! the testkit receiver and, independently, by a Python receiver, the
//! per-device coalescing queue (§4), each answer row of §2.4, minimal mode
//! (§3) and the log provider's debug ring (§5).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fanout_proto::v1 as pb;
use fanout_testkit::mock::webhook::RequestHook;
use fanout_testkit::{MockWebhook, MockWebhookConfig, ReceivedRequest, ScriptedResponse, TestPki, start_mock_webhook};
use fanout_tests::client::{Recipient, current_epoch, envelope, sender_hmac, subscription};
use fanout_tests::{EngineConfig, Fanout};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::{DELIVERY_WAIT, publish, sequence_id, still_registered};

const SECRET: &[u8] = b"example-secret-0123456789abcdef0123";
const PATH: &str = "/push";

struct Relay {
    fanout: Fanout,
    receiver: MockWebhook,
    _pki: TestPki,
    _dir: tempfile::TempDir,
}

/// The mock push server (HTTPS, verifying X-Gim-Signature with the 300 s
/// window) and an engine whose relay channel posts to it.
async fn relay_setup(relay_keys: &str, receiver: MockWebhookConfig) -> Relay {
    let pki = TestPki::generate(&["push.fanout.test"]).expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca: PathBuf = dir.path().join("ca.pem");
    pki.write_ca(&ca).expect("write ca");
    let secret = dir.path().join("relay-secret");
    std::fs::write(&secret, [SECRET, b"\n"].concat()).unwrap();
    let receiver = start_mock_webhook(&pki, receiver).await.expect("mock push server");
    receiver.set_signing_key(PATH, SECRET.to_vec());
    let config = EngineConfig {
        extra_tables: format!(
            "[engine.channels.relay]\nurl = {:?}\nsecret_file = {:?}\nextra_ca_files = [{:?}]\nhub_id = \"hub-test\"\n{relay_keys}\n",
            receiver.url(PATH),
            secret.display().to_string(),
            ca.display().to_string(),
        ),
        ..EngineConfig::default()
    };
    let fanout = Fanout::start(config).await.expect("start fanout");
    Relay { fanout, receiver, _pki: pki, _dir: dir }
}

pub(crate) async fn put(fanout: &Fanout, r: &Recipient, body: &Value) -> (u16, Value) {
    let bearer = r.bearer();
    let headers = [("authorization", bearer.as_str()), ("content-type", "application/json")];
    let (status, text) =
        fanout.api_request("PUT", "/v2/push/registration", &headers, body.to_string().as_bytes()).await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn delete(fanout: &Fanout, r: &Recipient) -> u16 {
    let bearer = r.bearer();
    fanout.api_request("DELETE", "/v2/push/registration", &[("authorization", &bearer)], b"").await.unwrap().0
}

async fn register(fanout: &Fanout, r: &Recipient, token: &str, topic: &[u8], include_commits: bool) {
    let (status, body) = put(fanout, r, &json!({"provider": "apns", "token": token})).await;
    assert_eq!(status, 204, "{body}");
    let mut client = fanout.notifications().await.unwrap();
    let sub = pb::Subscription { include_commits, ..subscription(topic) };
    client.update_subscriptions(r.update(vec![sub], vec![])).await.expect("subscribe");
}

fn token_of(q: &ReceivedRequest) -> String {
    q.json().and_then(|v| v["registration"]["token"].as_str().map(str::to_owned)).unwrap_or_default()
}

fn to(received: &[ReceivedRequest], token: &str) -> Vec<ReceivedRequest> {
    received.iter().filter(|q| token_of(q) == token).cloned().collect()
}

pub(crate) async fn metric(fanout: &Fanout, event: &str) -> u64 {
    let (_, text) = fanout.http_get("/metrics").await.unwrap();
    let prefix = format!("fanout_relay_pushes_total{{event=\"{event}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A group topic whose identifier is the UTF-8 `gid` (random suffix).
pub(crate) fn named_group(gid: &str) -> Vec<u8> {
    [&[0u8][..], gid.as_bytes()].concat()
}

pub(crate) fn stand_in(gid: &str, seq: u64) -> String {
    let mut h = Sha256::new();
    h.update(gid.as_bytes());
    h.update([0u8]);
    h.update(seq.to_be_bytes());
    hex::encode(&h.finalize()[..16])
}

#[tokio::test]
async fn registration_follows_every_rule_of_section_1() {
    // No push server configured: registrations are still accepted (003 §1).
    let config = EngineConfig { extra_tables: "[engine.channels.relay]\n".into(), ..EngineConfig::default() };
    let fanout = Fanout::start(config).await.unwrap();
    let long = |n: usize| "a".repeat(n);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"token": "t"}), "provider"),
        (json!({"provider": "", "token": "t"}), "provider"),
        (json!({"provider": long(65), "token": "t"}), "provider"),
        (json!({"provider": "APNS", "token": "t"}), "provider"),
        (json!({"provider": "fcm!", "token": "t"}), "provider"),
        (json!({"provider": "apns"}), "token"),
        (json!({"provider": "apns", "token": ""}), "token"),
        (json!({"provider": "apns", "token": long(4097)}), "token"),
        (json!({"provider": "apns", "token": "a\nb"}), "token"),
        (json!({"provider": "apns", "token": "a\u{0}b"}), "token"),
        (json!({"provider": "apns", "token": 7}), "token"),
        (json!({"provider": "apns", "token": "t", "app_id": ""}), "app_id"),
        (json!({"provider": "apns", "token": "t", "app_id": long(256)}), "app_id"),
        (json!({"provider": "apns", "token": "t", "app_id": "a b"}), "app_id"),
        (json!({"provider": "apns", "token": "t", "app_id": "a/b"}), "app_id"),
        (json!({"provider": "apns", "token": "t", "sandbox": "yes"}), "sandbox"),
        (json!({"provider": "apns", "token": "t", "p256dh": ""}), "p256dh"),
        (json!({"provider": "apns", "token": "t", "p256dh": "A".repeat(257)}), "p256dh"),
        (json!({"provider": "apns", "token": "t", "p256dh": "ab+c"}), "p256dh"),
        (json!({"provider": "apns", "token": "t", "p256dh": "ab/c"}), "p256dh"),
        (json!({"provider": "apns", "token": "t", "auth": "ab+c"}), "auth"),
        (json!({"provider": "apns", "token": "t", "user_id": "u"}), "body"),
        (json!(["apns"]), "body"),
    ];
    let r = Recipient::random();
    for (body, field) in &cases {
        let (status, problem) = put(&fanout, &r, body).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(problem["code"], "validation_failed", "{body}: {problem}");
        assert_eq!(problem["field"], *field, "{body}: {problem}");
        assert_eq!(problem["status"], 400);
        assert!(!still_registered(&fanout, &r).await, "{body}: nothing stored");
    }
    // The same rules over gRPC.
    let mut client = fanout.notifications().await.unwrap();
    let refused = client.register(r.register_relay("APNS", "t")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(!still_registered(&fanout, &r).await);

    // Authentication: the recipient credential of spec 000, checked as PUSH-253.
    let body = json!({"provider": "unifiedpush", "token": "tok", "app_id": "im.g.apps:x", "sandbox": true,
        "p256dh": "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQ=", "auth": "tBHItJI5svbpez7KI4CCXg=="});
    let (status, _) =
        fanout.api_request("PUT", "/v2/push/registration", &[], body.to_string().as_bytes()).await.unwrap();
    assert_eq!(status, 401);
    assert_eq!(put(&fanout, &r, &body).await.0, 204);
    assert_eq!(put(&fanout, &r, &json!({"provider": "log", "token": "other"})).await.0, 204, "replaced");
    let impostor = Recipient { secret: vec![9; 32], ..r.clone() };
    let (status, problem) = put(&fanout, &impostor, &body).await;
    assert_eq!((status, problem["code"].as_str()), (403, Some("forbidden")));
    let state = client.register(r.register_relay("fcm", "grpc-token")).await.unwrap().into_inner();
    assert_eq!(state.channel, pb::Channel::Relay as i32);
    assert_eq!(delete(&fanout, &impostor).await, 403);
    assert_eq!(delete(&fanout, &r).await, 204);
    // DELETE removes the registration, not the device (§1).
    assert!(still_registered(&fanout, &r).await, "the device stays");
    assert_eq!(delete(&fanout, &r).await, 204, "nothing registered: 204 all the same");
    assert_eq!(delete(&fanout, &Recipient::random()).await, 204, "an unknown device has nothing registered");

    // With no push server, pushes are skipped and counted.
    let topic = named_group("skipped");
    register(&fanout, &r, "tok", &topic, false).await;
    publish(&fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
    while metric(&fanout, "skipped").await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no skipped push counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The debug endpoint is off by default.
    let (status, text) = fanout.api_request("GET", "/v2/debug/push-log", &[], b"").await.unwrap();
    assert_eq!(status, 404);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["code"], "not_found");
}

#[tokio::test]
async fn a_burst_coalesces_to_the_newest_per_device_signed_and_without_the_sender() {
    let relay = relay_setup("", MockWebhookConfig::default()).await;
    let gid = format!("group-{}", hex::encode(rand::random::<[u8; 4]>()));
    let topic = named_group(&gid);
    let (a, b, sender) = (Recipient::random(), Recipient::random(), Recipient::random());
    register(&relay.fanout, &a, "tok-a", &topic, false).await;
    register(&relay.fanout, &b, "tok-b", &topic, false).await;
    // The sender's own device: subscribed with its HMAC key (PUSH-230).
    let key = vec![5u8; 42];
    let (status, _) = put(&relay.fanout, &sender, &json!({"provider": "apns", "token": "tok-sender"})).await;
    assert_eq!(status, 204);
    let mut client = relay.fanout.notifications().await.unwrap();
    let keyed =
        pb::Subscription { hmac_epoch_base: current_epoch(), hmac_keys: vec![key.clone()], ..subscription(&topic) };
    client.update_subscriptions(sender.update(vec![keyed], vec![])).await.unwrap();

    // Ten messages in one publish: one dispatch read, coalesced per device.
    let burst: Vec<pb::Envelope> = (0..10)
        .map(|i| {
            let data = format!("ciphertext {i}").into_bytes();
            pb::Envelope {
                sender_hmac: sender_hmac(&key, &data),
                data,
                ..envelope(&topic, pb::EnvelopeKind::Application, true)
            }
        })
        .collect();
    let results = publish(&relay.fanout, burst).await;
    let last = sequence_id(results.last().unwrap());
    relay.receiver.wait_for(2, DELIVERY_WAIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let received = relay.receiver.received();
    assert_eq!(received.len(), 2, "one push per device: {:?}", received.iter().map(token_of).collect::<Vec<_>>());
    assert!(to(&received, "tok-sender").is_empty(), "the sender's own device gets nothing");
    for (token, q) in [("tok-a", &to(&received, "tok-a")[0]), ("tok-b", &to(&received, "tok-b")[0])] {
        assert_eq!(q.signature_valid, Some(true), "{token}: X-Gim-Signature verifies within 300 s");
        assert_eq!(q.method, "POST");
        assert_eq!(q.header("content-type"), Some("application/json"));
        let body = q.json().unwrap();
        let delivery = body["delivery_id"].as_str().unwrap();
        assert_eq!(q.header("x-gim-delivery"), Some(delivery));
        assert!(delivery.len() == 32 && delivery.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        let t: i64 = q.header("x-gim-signature").unwrap().split(',').next().unwrap()[2..].parse().unwrap();
        let sent_at = body["sent_at"].as_i64().unwrap();
        assert!((sent_at / 1000 - t).abs() <= 1, "sent_at is the first attempt's");
        let message_id = stand_in(&gid, last);
        assert_eq!(
            body,
            json!({
                "v": 1, "hub_id": "hub-test", "delivery_id": delivery, "sent_at": sent_at,
                "registration": {"provider": "apns", "token": token},
                "priority": "high", "collapse_id": message_id, "ttl": 86400,
                "payload": {"v": 1, "type": "message", "gid": gid, "seq": last, "message_id": message_id,
                    "collapse_id": message_id, "mls_message": "Y2lwaGVydGV4dCA5"}
            }),
            "{token}: the newest of the burst, exactly the spec's fields"
        );
    }
    assert_ne!(
        to(&received, "tok-a")[0].json().unwrap()["delivery_id"],
        to(&received, "tok-b")[0].json().unwrap()["delivery_id"]
    );
    assert_eq!(metric(&relay.fanout, "enqueued").await, 20);
    assert_eq!(metric(&relay.fanout, "coalesced").await, 18);
    assert_eq!(metric(&relay.fanout, "sent").await, 2);
}

#[tokio::test]
async fn a_commit_with_a_membership_change_is_one_alert_with_the_membership_payload() {
    let relay = relay_setup("member_events = true", MockWebhookConfig::default()).await;
    let topic = named_group("members");
    let r = Recipient::random();
    register(&relay.fanout, &r, "tok", &topic, true).await;
    let commit = pb::Envelope {
        membership_change: pb::MembershipChange::MemberAdded as i32,
        message_id: "msg-7".into(),
        ..envelope(&topic, pb::EnvelopeKind::Commit, true)
    };
    let proposal = envelope(&topic, pb::EnvelopeKind::Proposal, true);
    let results = publish(&relay.fanout, vec![proposal, commit]).await;
    let seq = sequence_id(&results[1]);
    relay.receiver.wait_for(1, DELIVERY_WAIT).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let received = relay.receiver.received();
    assert_eq!(received.len(), 1, "the proposal is never pushed; the commit's two pushes coalesce");
    let body = received[0].json().unwrap();
    assert_eq!(body["priority"], "high", "the membership payload keeps the message's alert");
    assert_eq!(
        body["payload"],
        json!({"v": 1, "type": "group.member_added", "gid": "members", "seq": seq, "message_id": "msg-7", "collapse_id": "msg-7"})
    );
    assert_eq!(body["collapse_id"], "msg-7");
    assert_eq!(metric(&relay.fanout, "upgraded").await, 1);
}

/// Answers by registration token: a script per token, then 200.
fn scripted_by_token(scripts: HashMap<&'static str, Vec<ScriptedResponse>>) -> MockWebhookConfig {
    let scripts = Arc::new(Mutex::new(
        scripts
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into_iter().collect::<std::collections::VecDeque<_>>()))
            .collect::<HashMap<_, _>>(),
    ));
    let hook = RequestHook::new(move |req| {
        let token = serde_json::from_slice::<Value>(req.body).ok()?["registration"]["token"].as_str()?.to_owned();
        scripts.lock().unwrap().get_mut(&token)?.pop_front()
    });
    MockWebhookConfig { on_request: Some(hook), ..MockWebhookConfig::default() }
}

/// How late a retry may arrive: its target plus this. The schedule is
/// checked by the lower bounds and the order; the upper bound only has to
/// catch a wrong step, so it sits far above the worst lateness seen (a 1 s
/// step arriving after 2.007 s, under the whole suite on 2 cores: 1 s late)
/// and still below twice the target from the 4 s step on (a schedule one
/// step behind, 2, 4, 8, 16 s, fails).
const LATE: Duration = Duration::from_secs(3);

/// Whether a retry `gap` is its `target`'s: not early (50 ms for the
/// receiver's and the timer's granularity), and not a step late.
fn on_target(gap: Duration, target: Duration) -> bool {
    gap >= target - Duration::from_millis(50) && gap < target + LATE
}

fn gaps(requests: &[ReceivedRequest]) -> Vec<Duration> {
    requests.windows(2).map(|p| p[1].received_at.duration_since(p[0].received_at).unwrap()).collect()
}

#[tokio::test]
async fn each_answer_row_of_section_2_4() {
    let status = ScriptedResponse::status;
    let scripts = HashMap::from([
        ("ok", vec![status(202)]),
        ("gone", vec![status(404)]),
        ("gone410", vec![status(410)]),
        ("bad", vec![status(400)]),
        ("redirect", vec![status(302).with_location("/elsewhere")]),
        ("down", vec![status(500), status(503), status(502), status(500), status(503)]),
        ("limited", vec![status(429), status(200)]),
        ("ra30", vec![status(429).with_retry_after("30"), status(200)]),
        ("ra120", vec![status(503).with_retry_after("120"), status(200)]),
        ("slow", vec![status(200).with_delay(Duration::from_secs(4)), status(200)]),
        ("moving", vec![status(404).with_delay(Duration::from_millis(1500))]),
    ]);
    let relay = relay_setup("timeout_seconds = 2", scripted_by_token(scripts)).await;
    let topic = named_group("answers");
    let tokens = ["ok", "gone", "gone410", "bad", "redirect", "down", "limited", "ra30", "ra120", "slow", "moving"];
    let mut devices = HashMap::new();
    for token in tokens {
        let r = Recipient::random();
        register(&relay.fanout, &r, token, &topic, false).await;
        devices.insert(token, r);
    }
    publish(&relay.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    // "moving" re-registers another token while its 404 is on the way.
    relay.receiver.wait_for(tokens.len(), DELIVERY_WAIT).await;
    let (status_code, _) = put(&relay.fanout, &devices["moving"], &json!({"provider": "apns", "token": "moved"})).await;
    assert_eq!(status_code, 204);
    // ra120's second attempt is at 60 s (Retry-After honoured up to 60 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(80);
    while to(&relay.receiver.received(), "ra120").len() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let received = relay.receiver.received();
    let count = |t| to(&received, t).len();
    assert!(received.iter().all(|q| q.signature_valid == Some(true)));
    assert!(received.iter().all(|q| q.path == PATH), "a redirect is never followed");
    // 2xx, 404/410, 3xx and other 4xx: one attempt each.
    for t in ["ok", "gone", "gone410", "bad", "redirect", "moving"] {
        assert_eq!(count(t), 1, "{t}");
    }
    // 404/410 remove the registration, not the device (§1): whether it is
    // gone shows in the next push, checked at the end.
    for t in ["ok", "bad", "redirect", "down", "gone", "gone410", "moving"] {
        assert!(still_registered(&relay.fanout, &devices[t]).await, "{t}: the device is kept");
    }
    // 5xx: five attempts at 0, 1, 3, 7, 15 s, the same delivery and body.
    let down = to(&received, "down");
    assert_eq!(down.len(), 5);
    let down_gaps = gaps(&down);
    for (gap, want) in down_gaps.iter().zip([1, 2, 4, 8]) {
        assert!(on_target(*gap, Duration::from_secs(want)), "{down_gaps:?} vs 1, 2, 4, 8 s");
    }
    assert!(down_gaps.is_sorted(), "each retry waits longer: {down_gaps:?}");
    assert!(down.windows(2).all(|p| p[0].body == p[1].body), "identical bodies: delivery_id and sent_at kept");
    assert!(down.windows(2).all(|p| p[0].header("x-gim-delivery") == p[1].header("x-gim-delivery")));
    // 429 without Retry-After: the schedule; with 30: not before 30 s; with 120: at 60 s.
    let limited = gaps(&to(&received, "limited"));
    assert!(on_target(limited[0], Duration::from_secs(1)), "the schedule's first step: {limited:?}");
    let ra30 = gaps(&to(&received, "ra30"));
    assert!(ra30[0] >= Duration::from_secs(30) && ra30[0] < Duration::from_secs(30) + LATE, "{ra30:?}");
    let ra120 = gaps(&to(&received, "ra120"));
    assert!(ra120[0] >= Duration::from_secs(60) && ra120[0] < Duration::from_secs(60) + LATE, "{ra120:?}");
    // A timeout (4 s answer, 2 s bound) is retried.
    assert_eq!(count("slow"), 2);
    assert!(metric(&relay.fanout, "invalid_token").await >= 3);
    assert_eq!(metric(&relay.fanout, "failed").await, 3, "bad, redirect, and down after five attempts");

    // The next push: gone and gone410 have no registration left; moving's
    // new one (registered while its 404 was on the way) was kept.
    let next = named_group("answers-next");
    let mut client = relay.fanout.notifications().await.unwrap();
    for t in ["ok", "gone", "gone410", "moving"] {
        client.update_subscriptions(devices[t].update(vec![subscription(&next)], vec![])).await.expect("subscribe");
    }
    let before = relay.receiver.received().len();
    publish(&relay.fanout, vec![envelope(&next, pb::EnvelopeKind::Application, true)]).await;
    relay.receiver.wait_for(before + 2, DELIVERY_WAIT).await;
    let received = relay.receiver.received();
    assert_eq!((to(&received, "ok").len(), to(&received, "moved").len()), (2, 1), "ok and moved get the push");
    assert_eq!((to(&received, "gone").len(), to(&received, "gone410").len()), (1, 1), "no registration: no push");
}

/// The push server's first answer is slow (6 s, `timeout_seconds = 4`):
/// pushes to other devices published while it is pending are not held up
/// by it. Each leaves at once, and every attempt the hub counts is a
/// request the push server received.
#[tokio::test]
async fn a_slow_first_answer_holds_up_no_other_push() {
    let scripts = HashMap::from([("slow", vec![ScriptedResponse::status(200).with_delay(Duration::from_secs(6))])]);
    let relay = relay_setup("timeout_seconds = 4", scripted_by_token(scripts)).await;
    let (slow_topic, quick_topic) = (named_group("slow-first"), named_group("quick-after"));
    register(&relay.fanout, &Recipient::random(), "slow", &slow_topic, false).await;
    for token in ["quick-1", "quick-2", "quick-3"] {
        register(&relay.fanout, &Recipient::random(), token, &quick_topic, false).await;
    }
    let until = async |what: &str, done: &dyn Fn(&[ReceivedRequest], u64) -> bool| {
        let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
        while !done(&relay.receiver.received(), metric(&relay.fanout, "sent").await) {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // The host's first request: the slow one, received and not answered.
    publish(&relay.fanout, vec![envelope(&slow_topic, pb::EnvelopeKind::Application, true)]).await;
    until("the slow push reached the push server", &|r, _| to(r, "slow").len() == 1).await;
    publish(&relay.fanout, vec![envelope(&quick_topic, pb::EnvelopeKind::Application, true)]).await;
    until("the quick pushes were sent", &|_, sent| sent >= 3).await;
    let attempts = async |outcome: &str| {
        let (_, text) = relay.fanout.http_get("/metrics").await.unwrap();
        let series = format!("fanout_attempts_total{{channel=\"relay\",outcome=\"{outcome}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&series)?.parse::<u64>().ok()).unwrap_or(0)
    };
    assert_eq!(attempts("transient").await, 0, "answered before the first attempt timed out");
    let received = relay.receiver.received();
    for token in ["quick-1", "quick-2", "quick-3"] {
        assert_eq!(to(&received, token).len(), 1, "{token}: one attempt, answered");
    }
    assert_eq!(to(&received, "slow").len(), 1);
    // The slow one timed out after 4 s; its retry (1 s later) is answered.
    until("the slow push was retried", &|_, sent| sent >= 4).await;
    let counted = attempts("delivered").await + attempts("transient").await;
    assert_eq!((attempts("transient").await, counted), (1, 5));
    assert_eq!(relay.receiver.received().len(), 5, "every counted attempt reached the push server");
}

/// Spec 003 §1: DELETE and a 404/410 remove the registration, not the
/// device: it keeps its subscriptions, gets no push while it has no
/// registration, and a later PUT resumes its pushes without subscribing
/// again.
#[tokio::test]
async fn a_removed_registration_keeps_the_device_and_a_later_put_resumes_its_pushes() {
    let scripts = HashMap::from([("dead", vec![ScriptedResponse::status(410)])]);
    let relay = relay_setup("", scripted_by_token(scripts)).await;
    let topic = named_group("resumes");
    let (dead, deleted, barrier) = (Recipient::random(), Recipient::random(), Recipient::random());
    register(&relay.fanout, &dead, "dead", &topic, false).await;
    register(&relay.fanout, &deleted, "deleted", &topic, false).await;
    register(&relay.fanout, &barrier, "barrier", &topic, false).await;
    assert_eq!(delete(&relay.fanout, &deleted).await, 204);
    assert_eq!(delete(&relay.fanout, &deleted).await, 204, "nothing registered: 204");

    let seq_of = |q: &ReceivedRequest| q.json().and_then(|v| v["payload"]["seq"].as_u64());
    let message = async || {
        let results = publish(&relay.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
        sequence_id(&results[0])
    };
    let wait_for = async |token: &str, seq: u64| {
        let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
        while !to(&relay.receiver.received(), token).iter().any(|q| seq_of(q) == Some(seq)) {
            assert!(tokio::time::Instant::now() < deadline, "no push {seq} for {token}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let first = message().await;
    wait_for("dead", first).await;
    wait_for("barrier", first).await;
    // Counted once the hub removed the registration the 410 named.
    let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
    while metric(&relay.fanout, "invalid_token").await < 1 {
        assert!(tokio::time::Instant::now() < deadline, "the 410 was not counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // No registration: no push (the barrier's comes from the same read).
    let second = message().await;
    wait_for("barrier", second).await;
    let received = relay.receiver.received();
    assert_eq!(to(&received, "dead").len(), 1, "only the push the 410 answered");
    assert!(to(&received, "deleted").is_empty(), "deleted before the first push");
    for r in [&dead, &deleted] {
        assert!(still_registered(&relay.fanout, r).await, "the device is kept");
    }

    // A PUT resumes the pushes: the subscriptions were kept.
    for (r, token) in [(&dead, "revived"), (&deleted, "back")] {
        let (status, body) = put(&relay.fanout, r, &json!({"provider": "apns", "token": token})).await;
        assert_eq!(status, 204, "{body}");
    }
    let third = message().await;
    wait_for("revived", third).await;
    wait_for("back", third).await;
}

#[tokio::test]
async fn minimal_mode_sends_exactly_the_wake_object() {
    let relay = relay_setup("minimal = true", MockWebhookConfig::default()).await;
    let topic = named_group("quiet");
    let r = Recipient::random();
    register(&relay.fanout, &r, "tok", &topic, false).await;
    let results = publish(&relay.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let seq = sequence_id(&results[0]);
    let received = relay.receiver.wait_for(1, DELIVERY_WAIT).await;
    let body = String::from_utf8(received[0].body.to_vec()).unwrap();
    let wake = format!(r#""payload":{{"v":1,"type":"wake","collapse_id":"{}"}}"#, stand_in("quiet", seq));
    assert!(body.ends_with(&format!("{wake}}}")), "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["priority"].as_str(), v["collapse_id"].as_str()),
        (Some("high"), Some(stand_in("quiet", seq).as_str()))
    );
}

#[tokio::test]
async fn the_log_provider_fills_the_debug_ring_and_never_the_webhook() {
    let relay = relay_setup("dangerous_push_log_endpoint = true", MockWebhookConfig::default()).await;
    let topic = named_group("logged");
    let (logged, other) = (Recipient::random(), Recipient::random());
    let (s, _) = put(&relay.fanout, &logged, &json!({"provider": "log", "token": "log-token"})).await;
    assert_eq!(s, 204);
    let mut client = relay.fanout.notifications().await.unwrap();
    client.update_subscriptions(logged.update(vec![subscription(&topic)], vec![])).await.unwrap();
    register(&relay.fanout, &other, "webhook-token", &topic, false).await;
    let results = publish(&relay.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let seq = sequence_id(&results[0]);
    relay.receiver.wait_for(1, DELIVERY_WAIT).await;
    let path = format!("/v2/debug/push-log?device_id={}", logged.id_hex());
    let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
    let ring = loop {
        let (status, text) = relay.fanout.api_request("GET", &path, &[], b"").await.unwrap();
        assert_eq!(status, 200);
        let ring: Value = serde_json::from_str(&text).unwrap();
        if !ring["notifications"].as_array().unwrap().is_empty() || tokio::time::Instant::now() > deadline {
            break ring;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let entries = ring["notifications"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["device_id"], logged.id_hex());
    assert_eq!(entries[0]["token"], "log-token");
    assert_eq!(entries[0]["payload"]["seq"], seq);
    assert_eq!(entries[0]["payload"]["mls_message"], "b3BhcXVlIGNpcGhlcnRleHQ=");
    let now_ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!((now_ms - entries[0]["sent_at"].as_i64().unwrap()).abs() < 60_000);
    let received = relay.receiver.received();
    assert!(received.iter().all(|q| token_of(q) != "log-token"), "provider log never reaches the webhook");
    assert!(!relay.fanout.log().contains("log-token"), "the log line has no token");
    let (_, all) = relay.fanout.api_request("GET", "/v2/debug/push-log", &[], b"").await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&all).unwrap()["notifications"].as_array().unwrap().len(), 1);
}

/// The Python standard library's hmac, as a push server would write it,
/// verifies what the engine signs (over plain HTTP: dangerous_allow_plain_http).
#[tokio::test]
async fn an_independent_python_receiver_verifies_the_signature() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, [SECRET, b"\n"].concat()).unwrap();
    let out = dir.path().join("received.jsonl");
    let port = fanout_testkit::launcher::free_port();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/relay_receiver.py");
    let mut python = std::process::Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .arg(&secret)
        .arg(&out)
        .spawn()
        .expect("python3");
    let config = EngineConfig {
        extra_tables: format!(
            "[engine.channels.relay]\nurl = \"http://127.0.0.1:{port}/hook\"\nsecret_file = {:?}\ndangerous_allow_plain_http = true\n",
            secret.display().to_string()
        ),
        ..EngineConfig::default()
    };
    let fanout = Fanout::start(config).await.unwrap();
    let topic = named_group("python");
    let r = Recipient::random();
    register(&fanout, &r, "py-token", &topic, false).await;
    let welcome_topic = [&[1u8][..], b"python-welcome"].concat();
    let mut client = fanout.notifications().await.unwrap();
    client.update_subscriptions(r.update(vec![subscription(&welcome_topic)], vec![])).await.unwrap();
    publish(&fanout, vec![envelope(&welcome_topic, pb::EnvelopeKind::Welcome, true)]).await;
    let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
    let lines = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if !text.is_empty() || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = python.kill();
    let _ = python.wait();
    let record: Value = serde_json::from_str(lines.lines().next().expect("the receiver got a push")).unwrap();
    assert_eq!(record["valid"], true, "{record}");
    let body: Value = serde_json::from_str(record["body"].as_str().unwrap()).unwrap();
    assert_eq!(record["delivery"], body["delivery_id"]);
    assert_eq!(body["payload"]["type"], "welcome");
    assert_eq!(body["priority"], "high");
}
