//! The Web Push channel end to end: the real engine against the
//! mock push service (`fanout_testkit::mock::webpush`) over TLS on
//! 127.0.0.1. The mock verifies every VAPID token against the key the
//! engine was given and decrypts every body with the subscription's private
//! key, so what it records is what a browser would read.

use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_testkit::TestPki;
use fanout_testkit::mock::webpush::{self as mock, MockSubscription, MockWebPush, WebPushReply};
use fanout_testkit::webpush::VapidTestKey;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::{EngineConfig, Fanout};
use tonic::Code;

use crate::common::{DELIVERY_WAIT, publish, quote, sequence_id, still_registered, wait_for_metric};
use crate::relay_ingress::{HUB, PATH, SECRET, delivery_id, now, post, sign};

struct Setup {
    fanout: Fanout,
    service: MockWebPush,
    _pki: TestPki,
    _dir: tempfile::TempDir,
}

/// An engine with the webpush table; `private`: allow_private_addresses (the
/// mock is on loopback).
async fn setup(private: bool) -> Setup {
    setup_with(private, |_| String::new()).await
}

/// `setup` with more tables, written with the temporary directory at hand.
async fn setup_with(private: bool, more: impl Fn(&std::path::Path) -> String) -> Setup {
    let pki = TestPki::generate(&[]).expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, pem) = (dir.path().join("ca.pem"), dir.path().join("vapid.pem"));
    pki.write_ca(&ca).expect("ca");
    let key = VapidTestKey::generate();
    key.write(&pem).expect("vapid key");
    let service = mock::start(&pki, Some(key.public_key.clone())).await.expect("mock push service");
    let config = EngineConfig {
        extra_tables: format!(
            "[engine.channels.webpush]\nvapid_key_file = {}\nsubject = \"mailto:ops@fanout.test\"\n\
             ttl_seconds = 120\nallow_private_addresses = {private}\nextra_ca_files = [{}]\n\n{}",
            quote(&pem),
            quote(&ca),
            more(dir.path()),
        ),
        ..EngineConfig::default()
    };
    let fanout = Fanout::start(config).await.expect("start fanout");
    Setup { fanout, service, _pki: pki, _dir: dir }
}

fn delivery(s: &MockSubscription) -> pb::register_request::Delivery {
    pb::register_request::Delivery::Webpush(pb::WebPushDelivery {
        endpoint: s.endpoint.clone(),
        p256dh: s.p256dh.clone(),
        auth: s.auth.clone(),
    })
}

/// Registers a recipient on `sub`, subscribed to a fresh group topic.
async fn register(fanout: &Fanout, sub: &MockSubscription) -> (Recipient, Vec<u8>) {
    let recipient = Recipient::random();
    let topic = group_topic();
    let mut client = fanout.notifications().await.expect("client");
    let state = client.register(recipient.register(delivery(sub))).await.expect("register").into_inner();
    assert_eq!(state.channel, pb::Channel::Webpush as i32);
    client.update_subscriptions(recipient.update(vec![subscription(&topic)], vec![])).await.expect("subscribe");
    (recipient, topic)
}

#[tokio::test]
async fn a_browser_decrypts_the_wake_up_and_a_410_deletes_the_registration() {
    let s = setup(true).await;
    let sub = s.service.subscribe();
    let (recipient, topic) = register(&s.fanout, &sub).await;

    let results = publish(&s.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let seq = sequence_id(&results[0]);
    let got = s.service.wait_for(&sub.id, 1, DELIVERY_WAIT).await;
    assert_eq!(got.len(), 1, "engine log:\n{}", s.fanout.log());
    let push = &got[0];
    use base64::Engine as _;
    let topic_b64 = base64::engine::general_purpose::STANDARD.encode(&topic);
    assert_eq!(push.json(), Some(serde_json::json!({"topic": topic_b64, "sequence_id": seq.to_string()})));
    let vapid = push.vapid.as_ref().expect("the VAPID token verifies with the configured key");
    assert_eq!(vapid.aud, s.service.base_url());
    assert_eq!(vapid.sub.as_deref(), Some("mailto:ops@fanout.test"));
    assert_eq!((push.header("ttl"), push.header("urgency")), (Some("120"), Some("normal")));
    assert_eq!(push.status_sent, 201);
    let delivered = "fanout_deliveries_total{channel=\"webpush\",outcome=\"delivered\"}";
    assert_eq!(wait_for_metric(&s.fanout, delivered, 1.0, DELIVERY_WAIT).await, 1.0);

    // The subscription expired: 410, and the registration is deleted (PUSH-234).
    s.service.script(&sub.id, vec![WebPushReply::status(410)]);
    publish(&s.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let terminal = "fanout_deliveries_total{channel=\"webpush\",outcome=\"terminal\"}";
    assert_eq!(wait_for_metric(&s.fanout, terminal, 1.0, DELIVERY_WAIT).await, 1.0, "{}", s.fanout.log());
    assert!(!still_registered(&s.fanout, &recipient).await, "a 410 deletes the registration");
    assert_eq!(s.service.wait_for(&sub.id, 2, Duration::ZERO).await.len(), 2, "one attempt for the 410");
}

#[tokio::test]
async fn bad_subscriptions_and_private_endpoints_are_refused_at_registration() {
    let s = setup(false).await;
    let sub = s.service.subscribe();
    let client = s.fanout.notifications().await.expect("client");
    let refused = |d: pb::register_request::Delivery| {
        let mut client = client.clone();
        async move { client.register(Recipient::random().register(d)).await.expect_err("refused") }
    };
    // The mock is on 127.0.0.1: a loopback endpoint is refused (PUSH-256).
    let status = refused(delivery(&sub)).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "webpush endpoint host does not resolve to an allowed address");
    assert!(!status.message().contains("127.0.0.1"));

    let with = |endpoint: &str, p256dh: &[u8], auth: &[u8]| {
        pb::register_request::Delivery::Webpush(pb::WebPushDelivery {
            endpoint: endpoint.into(),
            p256dh: p256dh.to_vec(),
            auth: auth.to_vec(),
        })
    };
    let public = "https://push.example.net/wpush/abc";
    let mut off_curve = sub.p256dh.clone();
    off_curve[64] ^= 1;
    let cases = [
        (with(public, &sub.p256dh[..33], &sub.auth), "p256dh must be an uncompressed P-256 point of 65 bytes"),
        (with(public, &off_curve, &sub.auth), "p256dh must be an uncompressed P-256 point of 65 bytes"),
        (with(public, &sub.p256dh, &sub.auth[..8]), "auth must be 16 bytes"),
        (with(&sub.endpoint.replace("https:", "http:"), &sub.p256dh, &sub.auth), "webpush endpoint must use https"),
        // Admission check 4 names the field sent: WebPushDelivery.endpoint.
        (with("", &sub.p256dh, &sub.auth), "endpoint is empty"),
        (with(&"a".repeat(2049), &sub.p256dh, &sub.auth), "endpoint is longer than 2048 characters"),
        (with("https://push.example.net/\0", &sub.p256dh, &sub.auth), "endpoint contains a NUL character"),
    ];
    for (d, message) in cases {
        let status = refused(d).await;
        assert_eq!((status.code(), status.message()), (Code::InvalidArgument, message));
    }
    // None of it reached the push service.
    assert!(s.service.received().is_empty());
}

/// Spec 003 push-server side with provider `webpush`: a relayed
/// registration's token is the endpoint, `p256dh` and `auth` its keys (as a
/// browser gives them, base64url); the push service decrypts the relayed
/// payload itself.
#[tokio::test]
async fn a_relayed_webpush_registration_is_delivered_through_the_ingress() {
    use base64::Engine as _;
    let s = setup_with(true, |dir| {
        let secret = dir.join("hub.secret");
        std::fs::write(&secret, SECRET).expect("hub secret");
        format!("[engine.relay_ingress]\npath = \"{PATH}\"\nhubs = {{ {HUB} = {} }}\n\n", quote(&secret))
    })
    .await;
    let sub = s.service.subscribe();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let collapse = "b76b4f49cf0d311f53af81576f61d459";
    let payload = serde_json::json!({"v": 1, "type": "message", "gid": "Z3JvdXAtMQ", "seq": 42,
                                     "collapse_id": collapse, "mls_message": "QUJD"});
    let webhook = |id: &str, registration: serde_json::Value| {
        serde_json::to_vec(&serde_json::json!({
            "v": 1, "hub_id": HUB, "delivery_id": id, "sent_at": now() * 1000, "registration": registration,
            "priority": "high", "collapse_id": collapse, "ttl": 3600, "payload": payload,
        }))
        .unwrap()
    };
    let send = |id: String, body: Vec<u8>| {
        let api = s.fanout.api;
        async move { post(api, Some(&sign(SECRET, now(), &body)), &id, &body).await }
    };

    let id = delivery_id();
    let registration = serde_json::json!({"provider": "webpush", "token": sub.endpoint,
                                          "p256dh": b64(&sub.p256dh), "auth": format!("{}==", b64(&sub.auth))});
    let answer = send(id.clone(), webhook(&id, registration.clone())).await;
    assert_eq!((answer.status, answer.body.as_str()), (200, r#"{"result":"delivered"}"#), "{}", s.fanout.log_tail(30));
    let got = s.service.wait_for(&sub.id, 1, DELIVERY_WAIT).await;
    let push = &got[0];
    assert_eq!(push.json(), Some(payload.clone()), "the browser reads the relayed payload");
    assert!(push.vapid.is_ok(), "{:?}", push.vapid);
    assert_eq!((push.header("ttl"), push.header("urgency")), (Some("3600"), Some("high")));
    let topic = push.header("topic").expect("a Topic for the collapse id");
    assert!(topic.len() == 32 && !topic.contains(collapse));

    // Keys that are not a subscription's: refused for good (422), nothing sent.
    let id = delivery_id();
    let mut bad = registration.clone();
    bad["p256dh"] = b64(&[4; 65]).into();
    assert_eq!(send(id.clone(), webhook(&id, bad)).await.status, 422);
    // The subscription expired: 410, so the hub deletes the registration.
    s.service.script(&sub.id, vec![WebPushReply::status(410)]);
    let id = delivery_id();
    assert_eq!(send(id.clone(), webhook(&id, registration)).await.status, 410);
    assert_eq!(s.service.received().len(), 2);
}
