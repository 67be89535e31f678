//! The ingress end to end inside the engine: real signatures, a real redb
//! store, and a scripted provider that records what it was asked to send.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{Notify, Semaphore};

use super::request::Malformed;
use super::*;
use crate::channel::RelayPriority;
use crate::store::RedbStore;
use crate::testing::TestClock;

const SECRET: &[u8] = b"example-secret-0123456789abcdef0123";
const NOW: i64 = 1_760_600_000;
const ID: &str = "3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7c";

/// What the scripted provider saw of one relayed push.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    token: String,
    app_id: Option<String>,
    sandbox: bool,
    collapse_id: Option<String>,
    priority: RelayPriority,
    payload: serde_json::Value,
}

struct Scripted {
    channel: Channel,
    script: Mutex<VecDeque<Result<Outcome, Refusal>>>,
    seen: Mutex<Vec<Seen>>,
    sent: AtomicUsize,
    /// A held send tells `started`, then waits for a permit of `release`.
    held: bool,
    started: Notify,
    release: Semaphore,
}

impl Scripted {
    fn new(channel: Channel, held: bool) -> Arc<Self> {
        let (started, release) = (Notify::new(), Semaphore::new(0));
        Arc::new(Self {
            channel,
            script: Mutex::default(),
            seen: Mutex::default(),
            sent: AtomicUsize::new(0),
            held,
            started,
            release,
        })
    }

    fn then(&self, answer: Result<Outcome, Refusal>) {
        self.script.lock().unwrap().push_back(answer);
    }

    fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Provider for Scripted {
    fn channel(&self) -> Channel {
        self.channel
    }

    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        let Push::Relayed(push) = push else { unreachable!("the ingress sends only relayed pushes") };
        self.sent.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push(Seen {
            token: push.token.into(),
            app_id: push.app_id.map(Into::into),
            sandbox: push.sandbox,
            collapse_id: push.collapse_id.map(Into::into),
            priority: push.priority,
            payload: serde_json::Value::Object(push.payload.clone()),
        });
        if self.held {
            self.started.notify_one();
            self.release.acquire().await.unwrap().forget();
        }
        self.script.lock().unwrap().pop_front().unwrap_or(Ok(Outcome::Delivered))
    }

    fn timed_out(&self) -> Outcome {
        Outcome::transient(Duration::from_secs(1))
    }
}

struct Setup {
    ingress: Arc<RelayIngress>,
    apns: Arc<Scripted>,
    fcm: Arc<Scripted>,
    metrics: Arc<Metrics>,
    /// At `NOW` until a test moves it.
    clock: Arc<TestClock>,
    _dir: tempfile::TempDir,
}

fn setup_with(extra: serde_json::Value, held: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("hub.secret");
    std::fs::write(&secret_file, [SECRET, b"\n"].concat()).unwrap();
    let mut json = serde_json::json!({"hubs": {"hubexample": secret_file}, "apns_app_ids": ["im.g.apps"]});
    for (k, v) in extra.as_object().unwrap() {
        json[k] = v.clone();
    }
    let settings: RelayIngressSettings = serde_json::from_value(json).unwrap();
    let store = Arc::new(RedbStore::open(&dir.path().join("db"), 4).unwrap());
    let (apns, fcm) = (Scripted::new(Channel::Apns, held), Scripted::new(Channel::Fcm, held));
    let mut channels = Channels::default();
    channels.insert(apns.clone());
    channels.insert(fcm.clone());
    let metrics = Arc::new(Metrics::new());
    let clock = TestClock::at(NOW * 1000);
    let ingress = Arc::new(RelayIngress::new(&settings, channels, store, metrics.clone(), clock.clone()).unwrap());
    Setup { ingress, apns, fcm, metrics, clock, _dir: dir }
}

fn setup() -> Setup {
    setup_with(serde_json::json!({}), false)
}

fn body(id: &str, provider: &str, token: &str) -> serde_json::Value {
    serde_json::json!({"v": 1, "hub_id": "hubexample", "delivery_id": id, "sent_at": 1760600000123u64,
        "registration": {"provider": provider, "token": token, "app_id": "im.g.apps", "sandbox": true},
        "priority": "high", "collapse_id": "b76b4f49cf0d311f53af81576f61d459", "ttl": 86400,
        "payload": {"v": 1, "type": "message", "gid": "Z3JvdXAtMQ", "seq": 42,
                    "message_id": "b76b4f49cf0d311f53af81576f61d459",
                    "collapse_id": "b76b4f49cf0d311f53af81576f61d459", "mls_message": "QUJD"}})
}

fn bytes_of(v: &serde_json::Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap())
}

async fn post(s: &Setup, body: &Bytes, delivery: Option<&str>) -> Result<Accepted, IngressError> {
    let signature = signature::header_value(SECRET, NOW, body);
    s.ingress.handle(Some(&signature), delivery, body.clone()).await
}

fn rejected(s: &Setup, reason: &str) -> u64 {
    s.metrics.relay_ingress_rejected.with_label_values(&[reason]).get()
}

#[tokio::test]
async fn a_verified_webhook_reaches_its_provider_once() {
    let s = setup();
    let b = bytes_of(&body(ID, "apns", "00aa11"));
    assert_eq!(post(&s, &b, Some(ID)).await, Ok(Accepted::Delivered));
    let seen = s.apns.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].token, "00aa11");
    assert_eq!((seen[0].app_id.as_deref(), seen[0].sandbox), (Some("im.g.apps"), true));
    assert_eq!(seen[0].collapse_id.as_deref(), Some("b76b4f49cf0d311f53af81576f61d459"));
    assert_eq!(seen[0].priority, RelayPriority::High);
    assert_eq!(seen[0].payload, body(ID, "apns", "x")["payload"]);

    // §2.5: the same delivery_id again, even signed anew later, is answered
    // without a second provider request.
    assert_eq!(post(&s, &b, Some(ID)).await, Ok(Accepted::Duplicate));
    let later = signature::header_value(SECRET, NOW + 100, &b);
    s.clock.set((NOW + 100) * 1000);
    assert_eq!(s.ingress.handle(Some(&later), Some(ID), b.clone()).await, Ok(Accepted::Duplicate));
    s.clock.set(NOW * 1000);
    assert_eq!(s.apns.sent(), 1);
    let webhooks = |r: &str| s.metrics.relay_ingress_webhooks.with_label_values(&[r]).get();
    assert_eq!((webhooks("accepted"), webhooks("duplicate")), (1, 2));
    assert_eq!(s.metrics.relay_ingress_pushes.with_label_values(&["apns", "delivered"]).get(), 1);

    // FCM by provider name.
    let other = "0123456789abcdef0123456789abcdef";
    let mut fcm = body(other, "fcm", "reg-1");
    fcm["registration"].as_object_mut().unwrap().remove("app_id");
    assert_eq!(post(&s, &bytes_of(&fcm), Some(other)).await, Ok(Accepted::Delivered));
    assert_eq!((s.apns.sent(), s.fcm.sent()), (1, 1));
}

#[tokio::test]
async fn nothing_is_sent_before_verification() {
    let s = setup();
    let b = bytes_of(&body(ID, "apns", "t"));
    let good = signature::header_value(SECRET, NOW, &b);
    // Each request at `now` (Unix s) on the ingress's clock.
    let handle = |sig: Option<String>, delivery: Option<&'static str>, body: Bytes, now: i64| {
        let (ingress, clock) = (s.ingress.clone(), s.clock.clone());
        async move {
            clock.set(now * 1000);
            ingress.handle(sig.as_deref(), delivery, body).await
        }
    };
    use IngressError as E;
    // No signature, a malformed one, a replay outside the window.
    assert_eq!(handle(None, Some(ID), b.clone(), NOW).await, Err(E::Signature(SignatureError::Missing)));
    assert_eq!(
        handle(Some("v1=00".into()), Some(ID), b.clone(), NOW).await,
        Err(E::Signature(SignatureError::Malformed))
    );
    assert_eq!(
        handle(Some(good.clone()), Some(ID), b.clone(), NOW + 301).await,
        Err(E::Signature(SignatureError::Stale))
    );
    // A tampered body and the same JSON re-serialised.
    let tampered = Bytes::from(String::from_utf8(b.to_vec()).unwrap().replace("\"t\"", "\"u\""));
    assert_eq!(handle(Some(good.clone()), Some(ID), tampered, NOW).await, Err(E::Signature(SignatureError::Mismatch)));
    let pretty = Bytes::from(serde_json::to_vec_pretty(&body(ID, "apns", "t")).unwrap());
    assert_eq!(handle(Some(good.clone()), Some(ID), pretty, NOW).await, Err(E::Signature(SignatureError::Mismatch)));
    // Another hub's id, with a valid MAC under our secret: still unknown.
    let mut other_hub = body(ID, "apns", "t");
    other_hub["hub_id"] = "elsewhere".into();
    let ob = bytes_of(&other_hub);
    assert_eq!(post(&s, &ob, Some(ID)).await, Err(E::UnknownHub));
    // Signed right, but X-Gim-Delivery missing or wrong.
    assert_eq!(post(&s, &b, None).await, Err(E::Malformed(Malformed::DeliveryHeader)));
    assert_eq!(
        post(&s, &b, Some("0123456789abcdef0123456789abcdef")).await,
        Err(E::Malformed(Malformed::DeliveryHeader))
    );
    // v != 1.
    let mut v2 = body(ID, "apns", "t");
    v2["v"] = 2.into();
    assert_eq!(post(&s, &bytes_of(&v2), Some(ID)).await, Err(E::Malformed(Malformed::Version)));
    assert_eq!(s.apns.sent(), 0);
    assert_eq!(rejected(&s, "signature_mismatch"), 2);
    assert_eq!(rejected(&s, "signature_stale"), 1);
    assert_eq!(rejected(&s, "delivery_id"), 2);
    // The refusals stored nothing: the good request still goes out.
    assert_eq!(post(&s, &b, Some(ID)).await, Ok(Accepted::Delivered));
}

#[tokio::test]
async fn providers_and_apps_this_server_does_not_serve_are_permanent() {
    let s = setup();
    let b = bytes_of(&body(ID, "unifiedpush", "t"));
    assert_eq!(post(&s, &b, Some(ID)).await, Err(IngressError::UnsupportedProvider));
    let mut other_app = body(ID, "apns", "t");
    other_app["registration"]["app_id"] = "com.other.app".into();
    assert_eq!(post(&s, &bytes_of(&other_app), Some(ID)).await, Err(IngressError::UnknownApp));
    // fcm_app_ids is empty: an FCM registration naming an app is refused.
    assert_eq!(post(&s, &bytes_of(&body(ID, "fcm", "t")), Some(ID)).await, Err(IngressError::UnknownApp));
    assert_eq!(s.apns.sent() + s.fcm.sent(), 0);
}

#[tokio::test]
async fn a_dead_token_answers_gone_again_without_a_request() {
    let s = setup();
    s.apns.then(Ok(Outcome::Terminal));
    let b = bytes_of(&body(ID, "apns", "dead"));
    assert_eq!(post(&s, &b, Some(ID)).await, Err(IngressError::DeadToken));
    assert_eq!(post(&s, &b, Some(ID)).await, Err(IngressError::DeadToken));
    assert_eq!(s.apns.sent(), 1);
    assert_eq!(s.metrics.relay_ingress_pushes.with_label_values(&["apns", "dead_token"]).get(), 1);

    // A refused push (Mismatch, too large) is permanent too, and remembered.
    let id2 = "0123456789abcdef0123456789abcdef";
    s.apns.then(Ok(Outcome::Mismatch));
    let b2 = bytes_of(&body(id2, "apns", "other-env"));
    assert_eq!(post(&s, &b2, Some(id2)).await, Err(IngressError::ProviderRejected));
    assert_eq!(post(&s, &b2, Some(id2)).await, Err(IngressError::ProviderRejected));
    let id3 = "1123456789abcdef0123456789abcdef";
    s.apns.then(Err(Refusal::TooLarge));
    assert_eq!(post(&s, &bytes_of(&body(id3, "apns", "t")), Some(id3)).await, Err(IngressError::PayloadTooLarge));
    assert_eq!(s.apns.sent(), 3);
}

#[tokio::test]
async fn a_transient_answer_lets_the_hubs_retry_send_again() {
    let s = setup();
    s.apns.then(Ok(Outcome::transient(Duration::from_secs(10))));
    let b = bytes_of(&body(ID, "apns", "t"));
    let first = post(&s, &b, Some(ID)).await;
    assert_eq!(first, Err(IngressError::ProviderUnavailable { retry_after_secs: 10 }));
    assert_eq!(first.unwrap_err().retry_after_secs(), Some(10));
    assert_eq!(post(&s, &b, Some(ID)).await, Ok(Accepted::Delivered));
    assert_eq!(s.apns.sent(), 2);
    // FCM's quota delay is cut to what the hub honours.
    let id2 = "0123456789abcdef0123456789abcdef";
    s.apns.then(Ok(Outcome::transient(Duration::from_secs(300))));
    let answer = post(&s, &bytes_of(&body(id2, "apns", "t")), Some(id2)).await;
    assert_eq!(answer, Err(IngressError::ProviderUnavailable { retry_after_secs: 60 }));
}

#[tokio::test]
async fn a_retry_while_the_first_is_in_flight_is_told_to_retry() {
    let s = setup_with(serde_json::json!({}), true);
    let b = bytes_of(&body(ID, "apns", "t"));
    let first = tokio::spawn({
        let (ingress, b) = (s.ingress.clone(), b.clone());
        let sig = signature::header_value(SECRET, NOW, &b);
        async move { ingress.handle(Some(&sig), Some(ID), b).await }
    });
    s.apns.started.notified().await;
    assert_eq!(post(&s, &b, Some(ID)).await, Err(IngressError::InProgress { retry_after_secs: 1 }));
    s.apns.release.add_permits(1);
    assert_eq!(first.await.unwrap(), Ok(Accepted::Delivered));
    assert_eq!(post(&s, &b, Some(ID)).await, Ok(Accepted::Duplicate));
    assert_eq!(s.apns.sent(), 1);
}

#[tokio::test]
async fn overload_answers_429() {
    let s = setup_with(serde_json::json!({"max_in_flight": 1}), true);
    let b = bytes_of(&body(ID, "apns", "t"));
    let first = tokio::spawn({
        let (ingress, b) = (s.ingress.clone(), b.clone());
        let sig = signature::header_value(SECRET, NOW, &b);
        async move { ingress.handle(Some(&sig), Some(ID), b).await }
    });
    s.apns.started.notified().await;
    let id2 = "0123456789abcdef0123456789abcdef";
    let answer = post(&s, &bytes_of(&body(id2, "apns", "t")), Some(id2)).await;
    assert_eq!(answer, Err(IngressError::Overloaded));
    assert_eq!(answer.unwrap_err().retry_after_secs(), Some(1));
    s.apns.release.add_permits(1);
    assert_eq!(first.await.unwrap(), Ok(Accepted::Delivered));
    assert_eq!(rejected(&s, "overloaded"), 1);
}

#[test]
fn secret_files_must_be_readable_and_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(&dir.path().join("db"), 1).unwrap());
    let build = |file: &std::path::Path| {
        let settings: RelayIngressSettings = serde_json::from_value(serde_json::json!({"hubs": {"h1": file}})).unwrap();
        RelayIngress::new(&settings, Channels::default(), store.clone(), Arc::new(Metrics::new()), TestClock::at(0))
            .err()
            .unwrap()
            .to_string()
    };
    let e = build(&empty);
    assert!(e.starts_with("engine.relay_ingress.hubs: hub h1:") && e.contains("is empty"), "{e}");
    assert!(build(&dir.path().join("missing")).contains("cannot read"));
}
