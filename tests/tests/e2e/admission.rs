//! PUSH-253 ordered admission on Register, Unregister and UpdateSubscriptions,
//! with "nothing changes" checked after every failure; PUSH-255 Register
//! (create, renew, expires_at_ns), PUSH-207 Unregister, PUSH-210 unconfigured
//! channels, PUSH-254 (no id, secret, URL, key or topic in the log, /metrics or
//! a status message), and the standard gRPC health and reflection services.
//!
//! Every check is recorded rather than asserted on the spot, so one run lists
//! every deviation from the spec; the test fails at the end when any exists.

use std::fmt::Debug;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use fanout_proto::v1 as pb;
use fanout_proto::v1::notification_service_client::NotificationServiceClient;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription, topic_of_kind, welcome_topic};
use fanout_tests::{EngineConfig, Fanout};
use rand::RngCore;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::*;

pub(crate) type Client = NotificationServiceClient<Channel>;

/// A named UpdateSubscriptions payload: (what, adds, removes).
pub(crate) type UpdateCase<'a> = (&'a str, Vec<pb::Subscription>, Vec<Vec<u8>>);

const DEFAULT_TTL_SECONDS: i64 = 2_592_000;
const NS: i64 = 1_000_000_000;

/// Records every expectation that does not hold, and every status message seen
/// (for the PUSH-254 check), instead of stopping at the first.
#[derive(Default)]
pub(crate) struct Check {
    pub failures: Vec<String>,
    pub messages: Vec<String>,
}

impl Check {
    /// Expects `want` (Code::Ok for success); returns the response on success.
    pub fn code<T: Debug>(
        &mut self,
        what: &str,
        res: Result<tonic::Response<T>, tonic::Status>,
        want: Code,
    ) -> Option<T> {
        match res {
            Ok(r) => {
                let v = r.into_inner();
                if want != Code::Ok {
                    self.failures.push(format!("{what}: expected {want:?}, got Ok({v:?})"));
                }
                Some(v)
            }
            Err(s) => {
                self.messages.push(s.message().to_owned());
                if s.code() != want {
                    self.failures.push(format!("{what}: expected {want:?}, got {:?} ({:?})", s.code(), s.message()));
                }
                None
            }
        }
    }

    pub fn ok<T: Debug>(&mut self, what: &str, res: Result<tonic::Response<T>, tonic::Status>) -> Option<T> {
        self.code(what, res, Code::Ok)
    }

    pub fn eq<T: PartialEq + Debug>(&mut self, what: &str, got: T, want: T) {
        if got != want {
            self.failures.push(format!("{what}: expected {want:?}, got {got:?}"));
        }
    }

    pub fn truth(&mut self, what: &str, holds: bool) {
        if !holds {
            self.failures.push(what.to_owned());
        }
    }

    /// The current RecipientState (an empty UpdateSubscriptions) must be
    /// `topic_count` topics on `channel`.
    pub async fn state_is(
        &mut self,
        client: &mut Client,
        r: &Recipient,
        what: &str,
        topic_count: u64,
        channel: pb::Channel,
    ) {
        let got = self.ok(
            &format!("{what}: follow-up empty UpdateSubscriptions"),
            client.update_subscriptions(r.update(vec![], vec![])).await,
        );
        if let Some(state) = got {
            self.eq(&format!("{what}: topic_count afterwards"), state.topic_count, topic_count);
            self.eq(&format!("{what}: channel afterwards"), state.channel, channel as i32);
        }
    }

    /// `r` must not exist: a follow-up empty UpdateSubscriptions answers NOT_FOUND.
    pub async fn absent(&mut self, client: &mut Client, r: &Recipient, what: &str) {
        let res = client.update_subscriptions(r.update(vec![], vec![])).await;
        self.code(&format!("{what}: recipient must not exist afterwards (UpdateSubscriptions)"), res, Code::NotFound);
    }

    pub fn finish(self, context: &str, log: &str) {
        assert!(
            self.failures.is_empty(),
            "{context}: {} deviation(s) from the spec:\n  {}\nengine log (tail):\n{}",
            self.failures.len(),
            self.failures.join("\n  "),
            tail(log, 4000)
        );
    }
}

pub(crate) fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

pub(crate) fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    rand::rng().fill_bytes(&mut v);
    v
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

/// Values that must never show up in the log, /metrics or a status message.
#[derive(Default)]
pub(crate) struct Private {
    values: Vec<(String, String)>,
}

impl Private {
    /// Values shorter than 12 characters are too likely to occur by chance.
    pub(crate) fn add(&mut self, what: &str, value: String) {
        if value.len() >= 12 {
            self.values.push((what.to_owned(), value));
        }
    }

    pub(crate) fn bytes(&mut self, what: &str, b: &[u8]) {
        self.add(what, hex::encode(b));
        self.add(what, hex::encode_upper(b));
        self.add(what, base64::engine::general_purpose::STANDARD.encode(b));
        self.add(what, base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b));
    }

    pub(crate) fn recipient(&mut self, r: &Recipient) {
        self.bytes("recipient id", &r.id);
        self.bytes("recipient secret", &r.secret);
    }

    pub(crate) fn check(&self, check: &mut Check, place: &str, text: &str) {
        for (what, value) in &self.values {
            if text.contains(value.as_str()) {
                check.failures.push(format!("PUSH-254: {place} contains a {what} ({value})"));
            }
        }
    }
}

fn http(url: &str, key: &[u8]) -> pb::register_request::Delivery {
    pb::register_request::Delivery::Http(pb::HttpDelivery { url: url.into(), signing_key: key.to_vec() })
}

fn apns(token: &str) -> pb::register_request::Delivery {
    pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: token.into() })
}

fn fcm(token: &str) -> pb::register_request::Delivery {
    pb::register_request::Delivery::Fcm(pb::FcmDelivery { token: token.into() })
}

fn with_keys(topic: &[u8], base: i64, keys: Vec<Vec<u8>>) -> pb::Subscription {
    pb::Subscription { topic: topic.to_vec(), hmac_epoch_base: base, hmac_keys: keys, include_commits: false }
}

fn creds(id: &[u8], secret: &[u8]) -> Recipient {
    Recipient { id: id.to_vec(), secret: secret.to_vec() }
}

fn register_no_delivery(r: &Recipient) -> pb::RegisterRequest {
    pb::RegisterRequest { recipient_id: r.id.clone(), recipient_secret: r.secret.clone(), delivery: None }
}

/// `expires_at_ns` must be the current time plus `ttl_seconds`, within a minute.
fn expires_near(check: &mut Check, what: &str, state: &pb::RecipientState, ttl_seconds: i64) {
    let want = now_ns() + ttl_seconds * NS;
    let off = (state.expires_at_ns - want).abs();
    if off > 60 * NS {
        check.failures.push(format!(
            "{what}: expires_at_ns {} is {:.1} s from now + {ttl_seconds} s",
            state.expires_at_ns,
            (state.expires_at_ns - want) as f64 / NS as f64
        ));
    }
}

/// A receiver path with a random token, so a URL leak is recognisable.
fn random_path(prefix: &str) -> String {
    format!("/{prefix}-{}", hex::encode(random_bytes(8)))
}

#[tokio::test]
async fn admission_table_in_order_on_all_three_rpcs() {
    let setup = webhook_setup(EngineConfig::default()).await;
    let fanout = &setup.fanout;
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let mut private = Private::default();

    // The stored recipient `r`: two topics, webhook at path_a under key_a.
    let r = Recipient::random();
    private.recipient(&r);
    let key_a = random_bytes(32);
    let path_a = random_path("a");
    let url_a = setup.receiver.url(&path_a);
    private.add("webhook URL", url_a.clone());
    private.add("webhook URL path", path_a.clone());
    private.bytes("signing key", &key_a);
    setup.receiver.set_signing_key(&path_a, key_a.clone());
    let (t1, t2) = (group_topic(), welcome_topic());
    private.bytes("topic", &t1);
    private.bytes("topic", &t2);
    let created = ck.ok("register r", c.register(r.register(http(&url_a, &key_a))).await).expect("register r");
    ck.eq("register r: topic_count", created.topic_count, 0);
    let s = ck
        .ok("subscribe r", c.update_subscriptions(r.update(vec![subscription(&t1), subscription(&t2)], vec![])).await);
    ck.eq("subscribe r: topic_count", s.map(|s| s.topic_count), Some(2));

    // A second URL and key nobody may switch `r` to through a failed call.
    let key_b = random_bytes(32);
    let path_b = random_path("b");
    let url_b = setup.receiver.url(&path_b);
    private.add("webhook URL", url_b.clone());
    private.add("webhook URL path", path_b.clone());
    private.bytes("signing key", &key_b);
    let fresh_topic = group_topic();
    private.bytes("topic", &fresh_topic);

    // ---- Row 1: id or secret not exactly 32 bytes → INVALID_ARGUMENT, on all
    // three RPCs, before NOT_FOUND, PERMISSION_DENIED and row 4.
    for len in [0usize, 31, 33] {
        let bad_id = creds(&random_bytes(len), &r.secret);
        let bad_secret_known = creds(&r.id, &random_bytes(len));
        let bad_secret_unknown = creds(&random_bytes(32), &random_bytes(len));
        private.bytes("recipient id", &bad_id.id);
        private.bytes("recipient secret", &bad_secret_known.secret);
        private.recipient(&bad_secret_unknown);
        for (who, x) in [
            ("id of the wrong length", &bad_id),
            ("secret of the wrong length on a stored id", &bad_secret_known),
            ("secret of the wrong length on an unknown id", &bad_secret_unknown),
        ] {
            let w = format!("row 1, {who} ({len} bytes)");
            ck.code(
                &format!("{w}: Register (valid http)"),
                c.register(x.register(http(&url_b, &key_b))).await,
                Code::InvalidArgument,
            );
            ck.code(
                &format!("{w}: Register (apns, unconfigured)"),
                c.register(x.register(apns("token"))).await,
                Code::InvalidArgument,
            );
            ck.code(
                &format!("{w}: Register (no delivery)"),
                c.register(register_no_delivery(x)).await,
                Code::InvalidArgument,
            );
            ck.code(&format!("{w}: Unregister"), c.unregister(x.unregister()).await, Code::InvalidArgument);
            ck.code(
                &format!("{w}: UpdateSubscriptions (valid add)"),
                c.update_subscriptions(x.update(vec![subscription(&fresh_topic)], vec![t1.clone()])).await,
                Code::InvalidArgument,
            );
            ck.code(
                &format!("{w}: UpdateSubscriptions (bad topic)"),
                c.update_subscriptions(x.update(vec![subscription(&topic_of_kind(0x02))], vec![])).await,
                Code::InvalidArgument,
            );
        }
        // The unknown 32-byte id was not created by the Register above.
        let unknown_with_good_secret = creds(&bad_secret_unknown.id, &random_bytes(32));
        private.recipient(&unknown_with_good_secret);
        ck.absent(&mut c, &unknown_with_good_secret, &format!("row 1 ({len}-byte secret) Register")).await;
    }
    // An id that is the stored id plus one byte, or minus one, is not the stored id.
    let mut longer = r.id.clone();
    longer.push(0);
    for (who, id) in [("stored id + 1 byte", longer), ("stored id - 1 byte", r.id[..31].to_vec())] {
        let x = creds(&id, &r.secret);
        ck.code(&format!("row 1, {who}: Unregister"), c.unregister(x.unregister()).await, Code::InvalidArgument);
        ck.code(
            &format!("row 1, {who}: UpdateSubscriptions"),
            c.update_subscriptions(x.update(vec![], vec![t1.clone()])).await,
            Code::InvalidArgument,
        );
        ck.code(
            &format!("row 1, {who}: Register"),
            c.register(x.register(http(&url_b, &key_b))).await,
            Code::InvalidArgument,
        );
    }
    ck.state_is(&mut c, &r, "after row 1 failures", 2, pb::Channel::Http).await;

    // ---- Row 2: Unregister / UpdateSubscriptions on an unknown id → NOT_FOUND,
    // even when the payload is malformed.
    let u = Recipient::random();
    private.recipient(&u);
    ck.code("row 2: Unregister unknown", c.unregister(u.unregister()).await, Code::NotFound);
    ck.code(
        "row 2: UpdateSubscriptions unknown (valid adds and removes)",
        c.update_subscriptions(u.update(vec![subscription(&fresh_topic)], vec![t1.clone()])).await,
        Code::NotFound,
    );
    ck.code(
        "row 2: UpdateSubscriptions unknown, empty",
        c.update_subscriptions(u.update(vec![], vec![])).await,
        Code::NotFound,
    );
    let four_keys = vec![random_bytes(42), random_bytes(42), random_bytes(42), random_bytes(42)];
    let malformed: Vec<UpdateCase> = vec![
        ("identity-update topic", vec![subscription(&topic_of_kind(0x02))], vec![]),
        ("key-package topic in removes", vec![], vec![topic_of_kind(0x03)]),
        ("empty topic", vec![subscription(&[])], vec![]),
        ("4 keys", vec![with_keys(&fresh_topic, 0, four_keys.clone())], vec![]),
        ("41-byte key", vec![with_keys(&fresh_topic, 0, vec![random_bytes(41)])], vec![]),
        ("negative base with keys", vec![with_keys(&fresh_topic, -1, vec![random_bytes(42)])], vec![]),
        ("topic twice", vec![subscription(&fresh_topic), subscription(&fresh_topic)], vec![]),
        ("topic in adds and removes", vec![subscription(&fresh_topic)], vec![fresh_topic.clone()]),
        ("bad topic and 4 keys", vec![with_keys(&topic_of_kind(0x04), 0, four_keys.clone())], vec![]),
    ];
    for (what, adds, removes) in &malformed {
        ck.code(
            &format!("row 2 before row 4: UpdateSubscriptions unknown recipient with a malformed payload ({what})"),
            c.update_subscriptions(u.update(adds.clone(), removes.clone())).await,
            Code::NotFound,
        );
    }
    ck.code("row 2: Unregister unknown, again", c.unregister(u.unregister()).await, Code::NotFound);
    ck.absent(&mut c, &u, "row 2").await;

    // ---- Row 3: a stored id with the wrong secret → PERMISSION_DENIED, before
    // any check of the payload (row 4), on all three RPCs.
    let wrong = creds(&r.id, &random_bytes(32));
    private.bytes("recipient secret", &wrong.secret);
    ck.code("row 3: Unregister, wrong secret", c.unregister(wrong.unregister()).await, Code::PermissionDenied);
    ck.code(
        "row 3: UpdateSubscriptions, wrong secret, valid adds and removes",
        c.update_subscriptions(wrong.update(vec![subscription(&fresh_topic)], vec![t1.clone()])).await,
        Code::PermissionDenied,
    );
    ck.code(
        "row 3: UpdateSubscriptions, wrong secret, empty",
        c.update_subscriptions(wrong.update(vec![], vec![])).await,
        Code::PermissionDenied,
    );
    for (what, adds, removes) in &malformed {
        ck.code(
            &format!("row 3 before row 4: UpdateSubscriptions, wrong secret, malformed payload ({what})"),
            c.update_subscriptions(wrong.update(adds.clone(), removes.clone())).await,
            Code::PermissionDenied,
        );
    }
    let long_url = format!("https://127.0.0.1/{}", "a".repeat(2100));
    let register_payloads: Vec<(&str, Option<pb::register_request::Delivery>)> = vec![
        ("valid new webhook", Some(http(&url_b, &key_b))),
        ("same webhook", Some(http(&url_a, &key_a))),
        ("no delivery", None),
        ("empty url", Some(http("", &key_b))),
        ("url longer than 2048", Some(http(&long_url, &key_b))),
        ("url with NUL", Some(http("https://127.0.0.1/a\0b", &key_b))),
        ("http:// url", Some(http("http://127.0.0.1/hook", &key_b))),
        ("15-byte signing key", Some(http(&url_b, &[7; 15]))),
        ("65-byte signing key", Some(http(&url_b, &[7; 65]))),
        ("apns (unconfigured channel)", Some(apns("0123456789abcdef"))),
        ("fcm (unconfigured channel)", Some(fcm("fcm-registration-token"))),
    ];
    for (what, delivery) in &register_payloads {
        let req = pb::RegisterRequest {
            recipient_id: wrong.id.clone(),
            recipient_secret: wrong.secret.clone(),
            delivery: delivery.clone(),
        };
        ck.code(&format!("row 3: Register, wrong secret, {what}"), c.register(req).await, Code::PermissionDenied);
    }
    ck.state_is(&mut c, &r, "after row 3 failures", 2, pb::Channel::Http).await;

    // ---- Row 4 for Register on the stored recipient (right secret): each
    // fails and leaves the recipient, its channel and its target unchanged.
    let right_secret_cases: Vec<(&str, Option<pb::register_request::Delivery>, Code)> = vec![
        ("no delivery", None, Code::InvalidArgument),
        ("empty url", Some(http("", &key_b)), Code::InvalidArgument),
        (
            "url of 2049 characters",
            Some(http(&format!("https://127.0.0.1/{}", "a".repeat(2049 - 18)), &key_b)),
            Code::InvalidArgument,
        ),
        ("url with NUL", Some(http(&format!("{url_b}\0"), &key_b)), Code::InvalidArgument),
        ("http:// url", Some(http(&url_b.replacen("https://", "http://", 1), &key_b)), Code::InvalidArgument),
        ("empty signing key", Some(http(&url_b, &[])), Code::InvalidArgument),
        ("15-byte signing key", Some(http(&url_b, &[7; 15])), Code::InvalidArgument),
        ("65-byte signing key", Some(http(&url_b, &[7; 65])), Code::InvalidArgument),
        ("apns, channel not configured (PUSH-210)", Some(apns("0123456789abcdef")), Code::FailedPrecondition),
        ("fcm, channel not configured (PUSH-210)", Some(fcm("fcm-registration-token")), Code::FailedPrecondition),
    ];
    assert_eq!(format!("https://127.0.0.1/{}", "a".repeat(2049 - 18)).chars().count(), 2049);
    for (what, delivery, want) in &right_secret_cases {
        let req = pb::RegisterRequest {
            recipient_id: r.id.clone(),
            recipient_secret: r.secret.clone(),
            delivery: delivery.clone(),
        };
        ck.code(&format!("row 4: Register stored recipient, {what}"), c.register(req).await, *want);
    }
    ck.state_is(&mut c, &r, "after row 4 Register failures", 2, pb::Channel::Http).await;

    // ---- Row 4 for Register on new ids: each fails and creates nothing.
    for (what, delivery, want) in &right_secret_cases {
        let n = Recipient::random();
        private.recipient(&n);
        let req = pb::RegisterRequest {
            recipient_id: n.id.clone(),
            recipient_secret: n.secret.clone(),
            delivery: delivery.clone(),
        };
        ck.code(&format!("row 4: Register new recipient, {what}"), c.register(req).await, *want);
        ck.absent(&mut c, &n, &format!("row 4: failed Register of a new recipient ({what})")).await;
    }
    // A URL of exactly 2048 characters is allowed.
    let edge = Recipient::random();
    private.recipient(&edge);
    let url_2048 = format!("https://127.0.0.1/{}", "b".repeat(2048 - 18));
    assert_eq!(url_2048.chars().count(), 2048);
    ck.ok(
        "row 4: Register with a url of exactly 2048 characters",
        c.register(edge.register(http(&url_2048, &key_b))).await,
    );
    ck.ok("Unregister the 2048-character recipient", c.unregister(edge.unregister()).await);

    // ---- PUSH-255: create and renew. `n` is created at path_n1, subscribed to
    // three topics, then renewed at path_n2 under a new key.
    let n = Recipient::random();
    private.recipient(&n);
    let (key_n1, key_n2) = (random_bytes(16), random_bytes(64));
    let (path_n1, path_n2, path_n3) = (random_path("n1"), random_path("n2"), random_path("n3"));
    for (p, k) in [(&path_n1, &key_n1), (&path_n2, &key_n2), (&path_n3, &key_n2)] {
        private.add("webhook URL", setup.receiver.url(p));
        private.add("webhook URL path", p.clone());
        private.bytes("signing key", k);
        setup.receiver.set_signing_key(p, k.clone());
    }
    let tn: Vec<Vec<u8>> = vec![group_topic(), group_topic(), welcome_topic()];
    for t in &tn {
        private.bytes("topic", t);
    }
    if let Some(s) =
        ck.ok("PUSH-255: create", c.register(n.register(http(&setup.receiver.url(&path_n1), &key_n1))).await)
    {
        ck.eq("PUSH-255: create: topic_count", s.topic_count, 0);
        ck.eq("PUSH-255: create: channel", s.channel, pb::Channel::Http as i32);
        expires_near(&mut ck, "PUSH-255: create", &s, DEFAULT_TTL_SECONDS);
    }
    let subscribed = ck.ok(
        "PUSH-255: subscribe three",
        c.update_subscriptions(n.update(tn.iter().map(|t| subscription(t)).collect(), vec![])).await,
    );
    if let Some(s) = &subscribed {
        ck.eq("PUSH-255: subscribe three: topic_count", s.topic_count, 3);
        ck.eq("PUSH-255: subscribe three: channel", s.channel, pb::Channel::Http as i32);
        expires_near(&mut ck, "PUSH-255: UpdateSubscriptions", s, DEFAULT_TTL_SECONDS);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    if let Some(s) = ck.ok(
        "PUSH-255: renew with a new URL and key",
        c.register(n.register(http(&setup.receiver.url(&path_n2), &key_n2))).await,
    ) {
        ck.eq("PUSH-255: renew keeps the subscriptions: topic_count", s.topic_count, 3);
        ck.eq("PUSH-255: renew: channel", s.channel, pb::Channel::Http as i32);
        expires_near(&mut ck, "PUSH-255: renew", &s, DEFAULT_TTL_SECONDS);
        if let Some(prev) = &subscribed {
            ck.truth(
                &format!("PUSH-255: renew moves expires_at_ns forward ({} -> {})", prev.expires_at_ns, s.expires_at_ns),
                s.expires_at_ns > prev.expires_at_ns,
            );
        }
    }

    // Delivery shows which target is stored: r still at path_a under key_a
    // (no failed call replaced it), n at path_n2 under key_n2 (the renewal did).
    let results = publish(
        fanout,
        vec![envelope(&t1, pb::EnvelopeKind::Application, true), envelope(&tn[0], pb::EnvelopeKind::Application, true)],
    )
    .await;
    let (seq_r, seq_n) = (sequence_id(&results[0]), sequence_id(&results[1]));
    let got = setup.receiver.wait_for(2, DELIVERY_WAIT).await;
    ck.eq("deliveries after the failed calls", got.len(), 2);
    let seq_of = |p: &fanout_testkit::ReceivedRequest| {
        p.json().and_then(|j| j["sequence_id"].as_str().map(str::to_owned)).unwrap_or_default()
    };
    let topic_of = |p: &fanout_testkit::ReceivedRequest| {
        p.json().and_then(|j| j["topic"].as_str().map(str::to_owned)).unwrap_or_default()
    };
    let b64 = |t: &[u8]| base64::engine::general_purpose::STANDARD.encode(t);
    for p in &got {
        let (seq, topic) = (seq_of(p), topic_of(p));
        if topic == b64(&t1) && seq == seq_r.to_string() {
            ck.eq(
                "r's push goes to the target registered first (failed Registers replaced nothing)",
                p.path.as_str(),
                path_a.as_str(),
            );
            ck.eq("r's push is signed with the first key", p.signature_valid, Some(true));
        } else if topic == b64(&tn[0]) && seq == seq_n.to_string() {
            ck.eq(
                "n's push goes to the renewed target (PUSH-255 stores the request)",
                p.path.as_str(),
                path_n2.as_str(),
            );
            ck.eq("n's push is signed with the renewed key", p.signature_valid, Some(true));
        } else {
            ck.failures.push(format!("unexpected push to {}: {:?}", p.path, String::from_utf8_lossy(&p.body)));
        }
    }

    // ---- PUSH-207: Unregister deletes the recipient and every subscription.
    ck.ok("PUSH-207: Unregister", c.unregister(n.unregister()).await);
    ck.absent(&mut c, &n, "PUSH-207: after Unregister").await;
    ck.code("PUSH-207: second Unregister", c.unregister(n.unregister()).await, Code::NotFound);
    if let Some(s) =
        ck.ok("PUSH-207: Register again", c.register(n.register(http(&setup.receiver.url(&path_n3), &key_n2))).await)
    {
        ck.eq("PUSH-207: Register again starts with no subscriptions: topic_count", s.topic_count, 0);
    }
    // Nothing is delivered to n for its old topics; r still gets t1.
    let before = setup.receiver.received_count();
    let results = publish(
        fanout,
        vec![envelope(&tn[0], pb::EnvelopeKind::Application, true), envelope(&t1, pb::EnvelopeKind::Application, true)],
    )
    .await;
    let seq_r2 = sequence_id(&results[1]);
    let got = setup.receiver.wait_for(before + 1, DELIVERY_WAIT).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let got_after = setup.receiver.received();
    ck.eq("pushes after Unregister + re-Register (only r's)", got_after.len(), before + 1);
    for p in got_after.iter().skip(before) {
        if p.path != path_a || topic_of(p) != b64(&t1) || seq_of(p) != seq_r2.to_string() {
            ck.failures.push(format!(
                "PUSH-207: unexpected push after Unregister to {}: {:?}",
                p.path,
                String::from_utf8_lossy(&p.body)
            ));
        }
    }
    drop(got);

    // ---- gRPC health (grpc.health.v1) and server reflection.
    let channel =
        Channel::from_shared(format!("http://{}", fanout.grpc)).expect("uri").connect().await.expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "fanout.v1.NotificationService", "fanout.v1.PublishService"] {
        let res = health.check(tonic_health::pb::HealthCheckRequest { service: service.into() }).await;
        if let Some(r) = ck.ok(&format!("grpc.health.v1 Check({service:?})"), res) {
            ck.eq(
                &format!("grpc.health.v1 Check({service:?}) status"),
                r.status,
                tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            );
        }
    }
    let services = reflection_services(fanout).await;
    for want in ["fanout.v1.NotificationService", "fanout.v1.PublishService", "grpc.health.v1.Health"] {
        ck.truth(&format!("server reflection lists {want} (got {services:?})"), services.iter().any(|s| s == want));
    }

    // ---- PUSH-254: nothing private in the log, /metrics or a status message.
    let (status, metrics) = fanout.http_get("/metrics").await.expect("/metrics");
    ck.eq("/metrics status", status, 200);
    private.check(&mut ck, "the engine log", &fanout.log());
    private.check(&mut ck, "the /metrics body", &metrics);
    let messages = ck.messages.join("\n");
    private.check(&mut ck, "a status message", &messages);

    ck.finish("admission", &fanout.log());
}

/// The service names server reflection (grpc.reflection.v1) lists.
async fn reflection_services(fanout: &Fanout) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let Ok(channel) = Channel::from_shared(format!("http://{}", fanout.grpc)).expect("uri").connect().await else {
        return vec![];
    };
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let Ok(response) = client.server_reflection_info(tonic::codegen::tokio_stream::once(request)).await else {
        return vec![];
    };
    let mut stream = response.into_inner();
    match stream.message().await {
        Ok(Some(r)) => match r.message_response {
            Some(MessageResponse::ListServicesResponse(list)) => list.service.into_iter().map(|s| s.name).collect(),
            _ => vec![],
        },
        _ => vec![],
    }
}

/// PUSH-255 with recipient_ttl_seconds = 100: expires_at_ns is the renewal time + 100 s.
#[tokio::test]
async fn expires_at_follows_recipient_ttl_seconds() {
    let fanout =
        Fanout::start(EngineConfig { engine_extra: "recipient_ttl_seconds = 100".into(), ..EngineConfig::default() })
            .await
            .expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let r = Recipient::random();
    let url = format!("https://127.0.0.1:9{}", random_path("ttl"));
    if let Some(s) = ck.ok("Register", c.register(r.register(http(&url, &[1; 32]))).await) {
        ck.eq("Register: topic_count", s.topic_count, 0);
        ck.eq("Register: channel", s.channel, pb::Channel::Http as i32);
        let off = s.expires_at_ns - (now_ns() + 100 * NS);
        ck.truth(
            &format!("Register: expires_at_ns is now + 100 s (off by {:.2} s)", off as f64 / NS as f64),
            off.abs() < 10 * NS,
        );
    }
    if let Some(s) =
        ck.ok("UpdateSubscriptions", c.update_subscriptions(r.update(vec![subscription(&group_topic())], vec![])).await)
    {
        ck.eq("UpdateSubscriptions: topic_count", s.topic_count, 1);
        let off = s.expires_at_ns - (now_ns() + 100 * NS);
        ck.truth(
            &format!("UpdateSubscriptions: expires_at_ns is now + 100 s (off by {:.2} s)", off as f64 / NS as f64),
            off.abs() < 10 * NS,
        );
    }
    ck.finish("recipient_ttl_seconds = 100", &fanout.log());
}

/// PUSH-210: with no HTTPS channel table, an HTTP Register answers
/// FAILED_PRECONDITION (after row 1) and creates nothing.
#[tokio::test]
async fn unconfigured_http_channel_is_failed_precondition() {
    let fanout =
        Fanout::start(EngineConfig { http_channel: false, ..EngineConfig::default() }).await.expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let r = Recipient::random();
    let url = format!("https://127.0.0.1:9{}", random_path("nohttp"));
    ck.code(
        "http Register, no HTTPS table",
        c.register(r.register(http(&url, &[1; 32]))).await,
        Code::FailedPrecondition,
    );
    ck.code(
        "apns Register, no APNs table",
        c.register(r.register(apns("0123456789abcdef"))).await,
        Code::FailedPrecondition,
    );
    ck.code("fcm Register, no FCM table", c.register(r.register(fcm("token"))).await, Code::FailedPrecondition);
    ck.absent(&mut c, &r, "PUSH-210").await;
    let short = creds(&r.id[..31], &r.secret);
    ck.code(
        "row 1 before PUSH-210: 31-byte id",
        c.register(short.register(http(&url, &[1; 32]))).await,
        Code::InvalidArgument,
    );
    ck.finish("http_channel = false", &fanout.log());
}
