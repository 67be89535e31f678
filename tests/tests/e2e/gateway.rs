//! Spec 002 end to end: the real `fanout` binary with
//! `[engine.gateway]` and `[station]`, the real APNs and FCM mocks. Devices
//! register on the Station routes with a bearer session; a Station service
//! calls notify, signed here with RFC 9421 over Ed25519 (`ring`, building
//! the signature base by hand from the RFC, independently of the engine's
//! signer) and RFC 9530 Content-Digest; the mocks show what the providers
//! receive.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use fanout_testkit::{
    ApnsTestKey, FcmReply, MockApns, MockApnsConfig, MockFcm, MockFcmConfig, TestPki, start_mock_apns, start_mock_fcm,
};
use fanout_tests::{EngineConfig, Fanout};

use crate::common::{RawAnswer, post_raw as post};
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const GATEWAY: &str = "did:web:push.example.test";
const GATEWAY_URL: &str = "https://push.example.test/_arkret/edge/push/notify";
const STATION: &str = "did:web:station.example.test";
const KEY_ID: &str = "station-2026";
pub(crate) const SEED: [u8; 32] = [7; 32];
const SESSION: &str = "session-token-of-alice";
const ACCOUNT: &str = "ak:account:alice@station.example.test";
const NOTIFY: &str = "/_arkret/edge/push/notify";
const T: Duration = Duration::from_secs(10);
/// The delivery window of these tests (short, so windows pass quickly).
const WINDOW_S: u64 = 2;

/// The provider payload members §5.1 allows.
const ALLOWED: [&str; 6] =
    ["push_target_id", "wakeup_kind", "push_hint", "push_hint_l10n_key", "evaluation_locus_unresolved", "counts"];

struct Setup {
    fanout: Fanout,
    apns: MockApns,
    fcm: MockFcm,
    dir: tempfile::TempDir,
}

fn quote(path: &std::path::Path) -> String {
    format!("{:?}", path.display().to_string())
}

fn public_key() -> String {
    let pair = Ed25519KeyPair::from_seed_unchecked(&SEED).unwrap();
    URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())
}

/// The configuration: APNs and FCM, the gateway, the Station. `fcm` false
/// leaves the FCM channel out (a registered FCM route is then unreachable).
/// `extra` holds more `[engine.gateway]` keys.
pub(crate) fn tables(
    s_apns: &str,
    s_fcm: &str,
    dir: &std::path::Path,
    fcm: bool,
    threshold: u32,
    extra: &str,
) -> String {
    let mut t = format!(
        "[engine.channels.apns]\nkey_file = {key}\nkey_id = \"KEY1234567\"\nteam_id = \"TEAM123456\"\n\
         bundle_id = \"com.example.fanout\"\nenvironment = \"production\"\nsandbox_url = \"{s_apns}\"\n\
         production_url = \"{s_apns}\"\nextra_ca_files = [{ca}]\n\n",
        key = quote(&dir.join("AuthKey.p8")),
        ca = quote(&dir.join("ca.pem")),
    );
    if fcm {
        t.push_str(&format!(
            "[engine.channels.fcm]\nservice_account_file = {account}\nbase_url = \"{s_fcm}\"\nextra_ca_files = [{ca}]\n\n",
            account = quote(&dir.join("sa.json")),
            ca = quote(&dir.join("ca.pem")),
        ));
    }
    t.push_str(&format!(
        "[engine.gateway]\nservice_id = \"{GATEWAY}\"\nsalt_epoch = \"e1\"\nsalt_secrets = {{ e1 = {salt} }}\n\
         window_seconds = {WINDOW_S}\naggressive_threshold = {threshold}\nmax_provider_payload_bytes = 256\n\
         no_fanout_event_kinds = [\"ak.agent.lifecycle\"]\n{extra}\n\
         [[engine.gateway.gateways]]\nurl = \"{GATEWAY_URL}\"\nservice_id = \"{GATEWAY}\"\n\n\
         [[engine.gateway.source_services]]\nid = \"{STATION}\"\nkeys = [{{ key_id = \"{KEY_ID}\", public_key = \"{pk}\" }}]\n\n\
         [station]\nservice_id = \"{STATION}\"\nsession_tokens_file = {sessions}\n\n",
        salt = quote(&dir.join("salt-e1.hex")),
        pk = public_key(),
        sessions = quote(&dir.join("sessions")),
    ));
    t
}

async fn setup(threshold: u32) -> Setup {
    setup_with(threshold, "").await
}

async fn setup_with(threshold: u32, extra: &str) -> Setup {
    let pki = TestPki::generate(&[]).expect("pki");
    let key = ApnsTestKey::generate().expect("key");
    let apns = start_mock_apns(&pki, apns_config(&key)).await.expect("mock APNs");
    let fcm = start_mock_fcm(&pki, MockFcmConfig::default()).await.expect("mock FCM");
    let dir = tempfile::tempdir().expect("tempdir");
    write_files(dir.path(), &pki, &key, &fcm);
    let config = tables(&apns.base_url(), &fcm.base_url(), dir.path(), true, threshold, extra);
    let fanout =
        Fanout::start(EngineConfig { extra_tables: config, ..Default::default() }).await.expect("start fanout");
    Setup { fanout, apns, fcm, dir }
}

/// A mock APNs that accepts the provider tokens of `key` under the key and
/// team ids [`tables`] configures.
pub(crate) fn apns_config(key: &ApnsTestKey) -> MockApnsConfig {
    MockApnsConfig {
        team_id: "TEAM123456".into(),
        key_id: "KEY1234567".into(),
        public_key_pem: Some(key.public_pem.clone()),
        ..Default::default()
    }
}

/// The files [`tables`] names: the APNs key, the CA, the FCM service
/// account, the salt and the Station's session tokens.
pub(crate) fn write_files(dir: &std::path::Path, pki: &TestPki, key: &ApnsTestKey, fcm: &MockFcm) {
    key.write_p8(&dir.join("AuthKey.p8")).expect("write key");
    pki.write_ca(&dir.join("ca.pem")).expect("write ca");
    fcm.service_account().write(&dir.join("sa.json")).expect("write service account");
    std::fs::write(dir.join("salt-e1.hex"), format!("{}\n", "11".repeat(32))).unwrap();
    let hash = hex::encode(Sha256::digest(SESSION.as_bytes()));
    std::fs::write(dir.join("sessions"), format!("{hash} {ACCOUNT}\n")).unwrap();
}

type Answer = RawAnswer;

pub(crate) trait Json {
    fn json(&self) -> Value;
}

impl Json for Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|_| panic!("JSON body: {}", self.body))
    }
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

pub(crate) fn device(n: u32) -> String {
    format!("ak:device:01964137-0000-7000-8000-{n:012x}")
}

async fn register(s: &Setup, device_id: &str, push_key: &str) -> Answer {
    register_at(s.fanout.api, device_id, push_key).await
}

/// Registers a device on the Station route of the API listener at `api`.
pub(crate) async fn register_at(api: std::net::SocketAddr, device_id: &str, push_key: &str) -> Answer {
    let body = json!({
        "device_id": device_id, "push_gateway_url": GATEWAY_URL, "push_key": push_key,
        "platform": "android", "app_id": "com.arkret.client", "display_name": "Alice's phone",
    });
    let auth = vec![("Authorization".to_string(), format!("Bearer {SESSION}"))];
    post(api, "/_arkret/edge/push/register-device", &auth, body.to_string().as_bytes()).await
}

async fn registered_target(s: &Setup, device_id: &str, push_key: &str) -> String {
    let answer = register(s, device_id, push_key).await;
    assert_eq!(answer.status, 200, "{}\n{}", answer.body, s.fanout.log_tail(20));
    answer.json()["push_target_id"].as_str().unwrap().to_owned()
}

/// RFC 9421 §2.5's signature base and RFC 9530's Content-Digest, written
/// from the RFCs: the covered components in order, then `@signature-params`.
pub(crate) fn signed_headers(key: &str, body: &[u8], seed: &[u8; 32], created: u64) -> Vec<(String, String)> {
    let digest = format!("sha-256=:{}:", STANDARD.encode(Sha256::digest(body)));
    let fields = [
        ("arkret-operation", "ak.edge.push.command.notify.v1".to_string()),
        ("idempotency-key", key.to_string()),
        ("source-service-id", STATION.to_string()),
        ("destination-service-id", GATEWAY.to_string()),
        ("content-digest", digest),
    ];
    let covered: Vec<String> =
        ["@method", "@path"].into_iter().chain(fields.iter().map(|(n, _)| *n)).map(|c| format!("\"{c}\"")).collect();
    let params = format!("({});created={created};keyid=\"{KEY_ID}\";alg=\"ed25519\"", covered.join(" "));
    let mut base = format!("\"@method\": POST\n\"@path\": {NOTIFY}\n");
    for (name, value) in &fields {
        base.push_str(&format!("\"{name}\": {value}\n"));
    }
    base.push_str(&format!("\"@signature-params\": {params}"));
    let pair = Ed25519KeyPair::from_seed_unchecked(seed).unwrap();
    let signature = STANDARD.encode(pair.sign(base.as_bytes()).as_ref());
    let mut headers: Vec<(String, String)> = fields.iter().map(|(n, v)| (n.to_string(), v.clone())).collect();
    headers.push(("signature-input".into(), format!("sig1={params}")));
    headers.push(("signature".into(), format!("sig1=:{signature}:")));
    headers
}

async fn notify(s: &Setup, key: &str, body: &Value) -> Answer {
    notify_at(s.fanout.api, key, body, now_s()).await
}

/// A notify signed by the Station's key with `created` as its time.
pub(crate) async fn notify_at(api: std::net::SocketAddr, key: &str, body: &Value, created: u64) -> Answer {
    let bytes = body.to_string().into_bytes();
    post(api, NOTIFY, &signed_headers(key, &bytes, &SEED, created), &bytes).await
}

pub(crate) fn body(target: &str, devices: &[&str]) -> Value {
    json!({"notification": {
        "push_target_id": target,
        "wakeup_kind": "message",
        "push_hint": "new_message",
        "counts": {"badge": "2-5", "missed_call": false},
        "devices": devices.iter().map(|d| json!({"device_id": d})).collect::<Vec<_>>(),
        "route_tokens": {"realm_route_token": "opaque-realm-token-1"},
    }})
}

fn outcomes(answer: &Answer) -> Vec<(String, String, Option<String>)> {
    let json = answer.json();
    json["outcomes"]
        .as_array()
        .unwrap_or_else(|| panic!("outcomes: {}", answer.body))
        .iter()
        .map(|o| {
            (
                o["device_id"].as_str().unwrap().to_owned(),
                o["gateway_status"].as_str().unwrap().to_owned(),
                o["reason_code"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

fn one(device: &str, status: &str, reason: Option<&str>) -> (String, String, Option<String>) {
    (device.to_owned(), status.to_owned(), reason.map(str::to_owned))
}

/// The FCM data payload of a received request.
fn fcm_payload(r: &fanout_testkit::ProviderRequest) -> Value {
    let message = &r.json().unwrap()["message"];
    serde_json::from_str(message["data"]["payload"].as_str().unwrap()).unwrap()
}

fn only_allowed(payload: &Value) {
    let object = payload.as_object().unwrap_or_else(|| panic!("payload object: {payload}"));
    for key in object.keys() {
        assert!(ALLOWED.contains(&key.as_str()), "{key} reached the provider: {payload}");
    }
}

/// Waits until the current delivery window has at least `room` left.
async fn window_with_room(room: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let left = WINDOW_S * 1000 - now % (WINDOW_S * 1000);
    if left < room.as_millis() as u64 {
        tokio::time::sleep(Duration::from_millis(left + 20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_notify_and_the_provider_sees_only_allowed_fields() {
    let s = setup(30).await;
    let (phone, tablet) = (device(1), device(2));
    let answer = register(&s, &phone, "fcm:fcm-token-phone").await;
    assert_eq!(answer.status, 200, "{}\n{}", answer.body, s.fanout.log_tail(20));
    let registered = answer.json();
    let target = registered["push_target_id"].as_str().unwrap().to_owned();
    assert!(target.starts_with("ak:pseudonym:push:") && target.len() == 18 + 43, "{target}");
    let registration_id = registered["registration_id"].as_str().unwrap();
    assert!(registration_id.len() >= 22 && !registration_id.starts_with("ak:"));
    assert!(registered["expires_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(registered.as_object().unwrap().len(), 3, "{registered}");

    // The phone is the target's device; the tablet is not bound to it.
    let request = body(&target, &[&phone, &tablet]);
    let answer = notify(&s, "idem-1", &request).await;
    assert_eq!(answer.status, 200, "{}\n{}", answer.body, s.fanout.log_tail(20));
    assert_eq!(answer.json()["push_target_id"], target.as_str());
    assert_eq!(
        outcomes(&answer),
        vec![one(&phone, "accepted", None), one(&tablet, "rejected", Some("push_token_unknown"))]
    );
    let got = s.fcm.wait_for_token("fcm-token-phone", 1, T).await;
    assert_eq!(got.len(), 1, "{}", s.fanout.log_tail(20));
    let payload = fcm_payload(&got[0]);
    only_allowed(&payload);
    assert_eq!(payload["push_target_id"], target.as_str());
    assert_eq!(payload["wakeup_kind"], "message");
    assert_eq!(payload["push_hint"], "new_message");
    assert_eq!(payload["counts"], json!({"badge": "2-5", "missed_call": false}));
    let collapse = got[0].json().unwrap()["message"]["android"]["collapse_key"].as_str().unwrap().to_owned();
    assert_eq!(collapse.len(), 22, "{collapse}");
    assert!(!String::from_utf8_lossy(&got[0].body).contains("opaque-realm-token-1"));

    // §5.2: an exact replay answers the same bytes and sends nothing; the
    // key with another body is duplicate_conflict and changes nothing.
    let replay = notify(&s, "idem-1", &request).await;
    assert_eq!((replay.status, &replay.body), (200, &answer.body));
    let mut other = request.clone();
    other["notification"]["wakeup_kind"] = "mention".into();
    let conflict = notify(&s, "idem-1", &other).await;
    assert_eq!(conflict.status, 409, "{}", conflict.body);
    assert!(conflict.headers.contains("content-type: application/problem+json"));
    assert_eq!(conflict.json()["code"], "duplicate_conflict");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.fcm.received_for("fcm-token-phone").len(), 1);

    // APNs: the route named by the key's prefix; the payload rides under
    // "payload" next to a background aps.
    let ipad = device(3);
    let ipad_target = registered_target(&s, &ipad, "apns:00aa11bb22").await;
    let answer = notify(&s, "idem-apns", &body(&ipad_target, &[&ipad])).await;
    assert_eq!(outcomes(&answer), vec![one(&ipad, "accepted", None)]);
    let got = s.apns.wait_for_token("00aa11bb22", 1, T).await;
    let json = got[0].json().unwrap();
    assert_eq!(json["aps"], json!({"content-available": 1}));
    only_allowed(&json["payload"]);
    assert_eq!(json["payload"]["push_target_id"], ipad_target.as_str());
    assert_eq!(got[0].header("apns-collapse-id").map(str::len), Some(22));

    // Nothing private in the log.
    let log = s.fanout.log();
    for private in ["fcm-token-phone", "00aa11bb22", ACCOUNT, SESSION, &phone, &target, "opaque-realm-token-1"] {
        assert!(!log.contains(private), "the log shows {private}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_target_and_device_reasons() {
    let mut s = setup(30).await;
    let phone = device(10);
    let target = registered_target(&s, &phone, "fcm:token-10").await;

    // An unknown (well-formed) target: every device rejected alike.
    let unknown = format!("ak:pseudonym:push:{}", URL_SAFE_NO_PAD.encode([9u8; 32]));
    let answer = notify(&s, "k-unknown", &body(&unknown, &[&phone, &device(11)])).await;
    assert_eq!(
        outcomes(&answer),
        vec![
            one(&phone, "rejected", Some("push_target_unknown")),
            one(&device(11), "rejected", Some("push_target_unknown"))
        ]
    );
    // A payload over max_provider_payload_bytes (256): expanded too.
    let mut big = body(&target, &[&phone, &device(11)]);
    big["notification"]["push_hint"] = "l10n_key".into();
    big["notification"]["push_hint_l10n_key"] = "k".repeat(128).into();
    big["notification"]["counts"] = json!({"badge": "21+", "missed_call": "6-20", "unread_increment": 20});
    big["notification"]["evaluation_locus_unresolved"] = true.into();
    big["notification"]["wakeup_kind"] = "expiry_invalidation".into();
    let answer = notify(&s, "k-big", &big).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(outcomes(&answer).iter().all(|o| o.2.as_deref() == Some("push_payload_too_large")), "{}", answer.body);
    // The no-fanout branches: every device duplicate, nothing sent.
    for (key, extra) in [
        ("k-hist", json!({"reason_code": "historical_only"})),
        ("k-kind", json!({"event_kind": "ak.agent.lifecycle"})),
        ("k-audit", json!({"audit_envelope": {"access_kind": "e2ee_late_recovery"}})),
    ] {
        let mut request = body(&target, &[&phone]);
        request.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let answer = notify(&s, key, &request).await;
        assert_eq!(outcomes(&answer), vec![one(&phone, "duplicate", None)], "{key}: {}", answer.body);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.fcm.received_count(), 0);

    // A provider-invalidated token: accepted (durable takeover), the
    // provider answers UNREGISTERED, and the next notify is push_token_invalid.
    s.fcm.script("token-10", vec![FcmReply::fcm_error(404, "NOT_FOUND", "UNREGISTERED")]);
    let answer = notify(&s, "k-dead-1", &body(&target, &[&phone])).await;
    assert_eq!(outcomes(&answer), vec![one(&phone, "accepted", None)]);
    s.fcm.wait_for_token("token-10", 1, T).await;
    let mut invalid = Vec::new();
    for i in 0..50 {
        let mut request = body(&target, &[&phone]);
        request["notification"]["wakeup_kind"] = "reaction".into();
        invalid = outcomes(&notify(&s, &format!("k-dead-2-{i}"), &request).await);
        if invalid[0].2.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(invalid, vec![one(&phone, "rejected", Some("push_token_invalid"))]);
    // Registering again gives a fresh route (new token): accepted again
    // (another wakeup: the same one would be this window's duplicate, §2.4).
    let target = registered_target(&s, &phone, "fcm:token-10b").await;
    let mut fresh = body(&target, &[&phone]);
    fresh["notification"]["wakeup_kind"] = "assignment".into();
    let answer = notify(&s, "k-fresh", &fresh).await;
    assert_eq!(outcomes(&answer), vec![one(&phone, "accepted", None)]);
    s.fcm.wait_for_token("token-10b", 1, T).await;

    // A transient provider answer after the takeover is the gateway's to
    // retry (FCM's table: 503 → again after 10 s): the caller already has
    // `accepted`.
    s.fcm.script("token-10b", vec![FcmReply::error(503, "UNAVAILABLE")]);
    let mut request = body(&target, &[&phone]);
    request["notification"]["wakeup_kind"] = "schedule".into();
    assert_eq!(outcomes(&notify(&s, "k-retry", &request).await), vec![one(&phone, "accepted", None)]);
    let retried = s.fcm.wait_for_token("token-10b", 3, Duration::from_secs(30)).await;
    assert_eq!(retried.len(), 3, "{}", s.fanout.log_tail(20));
    assert_eq!(fcm_payload(&retried[1]), fcm_payload(&retried[2]), "the same wakeup, sent again");

    // The FCM channel removed: a registered FCM route is unreachable for
    // now (retryable, with retry_after_ms).
    let config = tables(&s.apns.base_url(), &s.fcm.base_url(), s.dir.path(), false, 30, "");
    s.fanout.set_config(EngineConfig { extra_tables: config, ..Default::default() });
    s.fanout.restart().await.expect("restart");
    let answer = notify(&s, "k-unreachable", &body(&target, &[&phone])).await;
    assert_eq!(outcomes(&answer), vec![one(&phone, "rejected", Some("push_gateway_unreachable"))]);
    assert!(answer.json()["outcomes"][0]["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{}", answer.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_and_batching_per_window_and_unregister() {
    let s = setup(2).await;
    let phone = device(20);
    let target = registered_target(&s, &phone, "fcm:token-20").await;

    // §2.4: the same wakeup under another Idempotency-Key in the same window
    // is a duplicate; in the next window it is a new wakeup.
    window_with_room(Duration::from_millis(1500)).await;
    let request = body(&target, &[&phone]);
    assert_eq!(outcomes(&notify(&s, "d-1", &request).await), vec![one(&phone, "accepted", None)]);
    assert_eq!(outcomes(&notify(&s, "d-2", &request).await), vec![one(&phone, "duplicate", None)]);
    tokio::time::sleep(Duration::from_secs(WINDOW_S)).await;
    assert_eq!(outcomes(&notify(&s, "d-3", &request).await), vec![one(&phone, "accepted", None)]);
    let got = s.fcm.wait_for_token("token-20", 2, T).await;
    assert_eq!(got.len(), 2);
    // Unlinkable across windows: another collapse key.
    let key = |r: &fanout_testkit::ProviderRequest| r.json().unwrap()["message"]["android"]["collapse_key"].clone();
    assert_ne!(key(&got[0]), key(&got[1]));

    // §4.5 with aggressive_threshold = 2: in one window two wakeups go at
    // once, the next two are accepted and merge into one batch wakeup sent
    // at the window's end, flagged evaluation_locus_unresolved.
    tokio::time::sleep(Duration::from_secs(WINDOW_S)).await;
    window_with_room(Duration::from_millis(1500)).await;
    let tablet = device(21);
    let tablet_target = registered_target(&s, &tablet, "fcm:token-21").await;
    for (i, kind) in ["message", "mention", "reaction", "reminder"].into_iter().enumerate() {
        let mut request = body(&tablet_target, &[&tablet]);
        request["notification"]["wakeup_kind"] = kind.into();
        let answer = notify(&s, &format!("b-{i}"), &request).await;
        assert_eq!(outcomes(&answer), vec![one(&tablet, "accepted", None)], "{kind}");
    }
    let got = s.fcm.wait_for_token("token-21", 3, T).await;
    assert_eq!(got.len(), 3, "{}", s.fanout.log_tail(20));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.fcm.received_for("token-21").len(), 3);
    let batch = fcm_payload(&got[2]);
    only_allowed(&batch);
    assert_eq!(batch["evaluation_locus_unresolved"], true, "{batch}");
    assert_eq!(batch["wakeup_kind"], "reminder", "the latest kind stands: {batch}");

    // §3.2: unregister answers 204 without a body, also when repeated; the
    // target is then unknown.
    let auth = vec![("Authorization".to_string(), format!("Bearer {SESSION}"))];
    let unregister = json!({"device_id": phone}).to_string();
    for _ in 0..2 {
        let answer = post(s.fanout.api, "/_arkret/edge/push/unregister-device", &auth, unregister.as_bytes()).await;
        assert_eq!((answer.status, answer.body.as_str()), (204, ""), "{}", answer.headers);
    }
    let answer = notify(&s, "after-unregister", &body(&target, &[&phone])).await;
    assert_eq!(outcomes(&answer), vec![one(&phone, "rejected", Some("push_target_unknown"))]);

    // Re-registering supersedes: the old pseudonym of a device whose route
    // changed (APNs now) no longer resolves; never two current routes.
    let fcm_target = registered_target(&s, &tablet, "fcm:token-21b").await;
    assert_eq!(fcm_target, tablet_target, "same account, device, route and epoch: same pseudonym");
    let apns_target = registered_target(&s, &tablet, "apns:aabbcc21").await;
    assert_ne!(apns_target, tablet_target);
    let answer = notify(&s, "old-route", &body(&tablet_target, &[&tablet])).await;
    assert_eq!(outcomes(&answer), vec![one(&tablet, "rejected", Some("push_target_unknown"))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_and_malformed_requests_change_nothing() {
    let s = setup(30).await;
    let phone = device(30);
    let target = registered_target(&s, &phone, "fcm:token-30").await;
    let request = body(&target, &[&phone]);
    let bytes = request.to_string().into_bytes();

    // Notify: another key, a stale signature, a body changed after signing,
    // no signature at all.
    let other_key = signed_headers("s-1", &bytes, &[8; 32], now_s());
    let stale = signed_headers("s-1", &bytes, &SEED, now_s() - 3600);
    let tampered = signed_headers("s-1", b"{}", &SEED, now_s());
    let unsigned: Vec<_> = signed_headers("s-1", &bytes, &SEED, now_s()).into_iter().take(5).collect();
    for (what, headers) in [("other key", other_key), ("stale", stale), ("tampered", tampered), ("unsigned", unsigned)]
    {
        let answer = post(s.fanout.api, NOTIFY, &headers, &bytes).await;
        assert_eq!(answer.status, 401, "{what}: {}", answer.body);
        assert!(answer.headers.contains("application/problem+json"), "{what}");
    }
    // Schema: a forbidden field, a visible-only field, a duplicate device.
    for (what, change) in [
        ("content", json!({"content": "hello"})),
        ("event_id", json!({"event_id": "ak:event:1"})),
        ("devices", json!({"devices": [{"device_id": phone}, {"device_id": phone}]})),
    ] {
        let mut bad = request.clone();
        bad["notification"].as_object_mut().unwrap().extend(change.as_object().unwrap().clone());
        let answer = notify(&s, &format!("schema-{what}"), &bad).await;
        assert_eq!(answer.status, 400, "{what}: {}", answer.body);
        assert_eq!(answer.json()["code"], "schema_violation", "{what}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.fcm.received_count(), 0);
    // The refused keys stored nothing: the genuine request under one is accepted.
    let answer = notify(&s, "s-1", &request).await;
    assert_eq!(outcomes(&answer), vec![one(&phone, "accepted", None)]);

    // Station: no session, an unknown session, an account in the body, a
    // gateway that is not onboarded.
    let path = "/_arkret/edge/push/register-device";
    let good = json!({"device_id": device(31), "push_gateway_url": GATEWAY_URL, "push_key": "fcm:t31"});
    let auth = |token: &str| vec![("Authorization".to_string(), format!("Bearer {token}"))];
    assert_eq!(post(s.fanout.api, path, &[], good.to_string().as_bytes()).await.status, 401);
    assert_eq!(post(s.fanout.api, path, &auth("not-a-session"), good.to_string().as_bytes()).await.status, 401);
    let mut with_account = good.clone();
    with_account["account_id"] = ACCOUNT.into();
    let answer = post(s.fanout.api, path, &auth(SESSION), with_account.to_string().as_bytes()).await;
    assert_eq!((answer.status, answer.json()["code"].as_str()), (400, Some("schema_violation")));
    let mut elsewhere = good.clone();
    elsewhere["push_gateway_url"] = "https://push.example.test/_arkret/edge/push/notify/".into();
    let answer = post(s.fanout.api, path, &auth(SESSION), elsewhere.to_string().as_bytes()).await;
    assert_eq!((answer.status, answer.json()["code"].as_str()), (422, Some("push_gateway_not_onboarded")));
}

/// The value of one sample of the exposition, named with its labels as
/// written (`name{label="value"}`), or 0 when absent.
fn sample(scrape: &str, series: &str) -> f64 {
    scrape.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// §5.2 `rate_limited` (docs/GATEWAY.md reading 26): a device whose
/// accepted wake-ups do not finish (FCM answers 503: each is retried after
/// 10 s) reaches `max_pending_wakeups_per_device` and is answered
/// rate_limited with retry_after_ms, nothing stored for it, while another
/// device is accepted; once its wake-ups are delivered it is accepted again.
/// The gateway's metrics show all of it, with no private value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_whose_wakeups_do_not_drain_is_rate_limited_and_metrics_show_it() {
    let s = setup_with(30, "max_pending_wakeups_per_device = 2\n").await;
    let (phone, tablet) = (device(40), device(41));
    let phone_target = registered_target(&s, &phone, "fcm:token-40").await;
    let tablet_target = registered_target(&s, &tablet, "fcm:token-41").await;
    s.fcm.script("token-40", vec![FcmReply::error(503, "UNAVAILABLE"); 2]);
    let kind = |target: &str, device: &str, kind: &str| {
        let mut request = body(target, &[device]);
        request["notification"]["wakeup_kind"] = kind.into();
        request
    };

    // Two wake-ups taken over, both answered 503 by FCM: still the gateway's.
    for (key, k) in [("r-1", "message"), ("r-2", "mention")] {
        let answer = notify(&s, key, &kind(&phone_target, &phone, k)).await;
        assert_eq!(outcomes(&answer), vec![one(&phone, "accepted", None)], "{key}: {}", answer.body);
    }
    // A third is not: rate_limited, caller-retryable with its back-off.
    let limited_request = kind(&phone_target, &phone, "reaction");
    let limited = notify(&s, "r-3", &limited_request).await;
    assert_eq!(outcomes(&limited), vec![one(&phone, "rejected", Some("rate_limited"))], "{}", limited.body);
    let retry_after = limited.json()["outcomes"][0]["retry_after_ms"].as_u64();
    assert!(retry_after.is_some_and(|ms| (1_000..=300_000).contains(&ms)), "{}", limited.body);
    // Another device is not held back by it.
    let answer = notify(&s, "r-4", &kind(&tablet_target, &tablet, "reaction")).await;
    assert_eq!(outcomes(&answer), vec![one(&tablet, "accepted", None)]);
    s.fcm.wait_for_token("token-41", 1, T).await;
    // The exact replay answers the same bytes (§5.2 idempotency).
    let replay = notify(&s, "r-3", &limited_request).await;
    assert_eq!((replay.status, &replay.body), (200, &limited.body));

    // FCM recovers: both wake-ups leave on their retry (2 × 503, then 2 ×
    // 200), nothing was stored for the rate-limited one, and the device is
    // accepted again.
    let got = s.fcm.wait_for_token("token-40", 4, Duration::from_secs(40)).await;
    assert_eq!(got.len(), 4, "{}", s.fanout.log_tail(30));
    let kinds: Vec<_> = got.iter().map(|r| fcm_payload(r)["wakeup_kind"].as_str().unwrap().to_owned()).collect();
    assert!(!kinds.contains(&"reaction".to_owned()), "the rate-limited wake-up was sent: {kinds:?}");
    // The worker frees a device's entries just after the provider's answer,
    // so a notify right after it may still be rate_limited: counted below.
    let mut again = Vec::new();
    let mut limited_again = 0.0;
    for i in 0..50 {
        again = outcomes(&notify(&s, &format!("r-5-{i}"), &kind(&phone_target, &phone, "reminder")).await);
        if again[0].1 == "accepted" {
            break;
        }
        assert_eq!(again[0].2.as_deref(), Some("rate_limited"), "{again:?}");
        limited_again += 1.0;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(again, vec![one(&phone, "accepted", None)]);
    s.fcm.wait_for_token("token-40", 5, T).await;

    // A notify of the configured Station with a stale signature: counted by reason.
    let bytes = body(&phone_target, &[&phone]).to_string().into_bytes();
    let stale = post(s.fanout.api, NOTIFY, &signed_headers("r-6", &bytes, &SEED, now_s() - 3600), &bytes).await;
    assert_eq!(stale.status, 401);

    // The metrics, as an operator sees them. The worker counts a wake-up
    // after the provider's answer reached it, a moment after the mock saw
    // the request: wait (bounded) for the fifth delivery to be counted.
    let mut scrape = String::new();
    for _ in 0..50 {
        scrape = s.fanout.http_get("/metrics").await.expect("metrics").1;
        if sample(&scrape, "fanout_gateway_wakeups_total{outcome=\"delivered\"}") >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at_least = |series: &str, n: f64| {
        let v = sample(&scrape, series);
        assert!(v >= n, "{series} = {v}, expected at least {n}\n{scrape}");
    };
    at_least("fanout_gateway_device_rejections_total{reason=\"rate_limited\"}", 1.0);
    assert_eq!(
        sample(&scrape, "fanout_gateway_device_rejections_total{reason=\"rate_limited\"}"),
        1.0 + limited_again,
        "replays count once"
    );
    at_least("fanout_gateway_device_outcomes_total{result=\"accepted\"}", 4.0);
    at_least("fanout_gateway_wakeups_total{outcome=\"retried\"}", 2.0);
    at_least("fanout_gateway_wakeups_total{outcome=\"delivered\"}", 4.0);
    at_least("fanout_gateway_registrations_total{result=\"registered\"}", 2.0);
    at_least("fanout_gateway_notify_unauthorized_total{reason=\"signature_stale\"}", 1.0);
    // Created at zero with the gateway, so rates and alerts see them.
    for zero in [
        "fanout_gateway_device_rejections_total{reason=\"push_gateway_unreachable\"}",
        "fanout_gateway_wakeups_total{outcome=\"exhausted\"}",
        "fanout_gateway_notify_unauthorized_total{reason=\"unknown_source\"}",
    ] {
        assert!(scrape.lines().any(|l| l == format!("{zero} 0")), "{zero} is not at zero\n{scrape}");
    }
    assert!(scrape.contains("fanout_gateway_worker_stalled_seconds "), "{scrape}");
    for private in ["token-40", "token-41", ACCOUNT, &phone, &tablet, &phone_target, STATION, KEY_ID, "r-3"] {
        assert!(!scrape.contains(private), "the exposition shows {private}");
    }
}

/// §5.2 `accepted` is a durable takeover, also for notifies answered while
/// many run at once (their claims and window state ride on the commit that
/// stores their answers): after a `kill -9` right behind the last answer, an
/// exact replay of every notify gets its stored answer byte for byte (no
/// request is decided twice), and every accepted wake-up reaches the
/// provider, before the kill or after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_notifies_survive_a_kill_9_in_the_middle_of_concurrent_load() {
    const DEVICES: u32 = 20;
    const ROUNDS: u64 = 5;
    const IN_FLIGHT: usize = 16;
    let mut s = setup(1000).await;
    let mut targets = Vec::new();
    for n in 0..DEVICES {
        targets.push(registered_target(&s, &device(n), &format!("fcm:crash-{n}")).await);
    }
    let notifies: Vec<(String, Value)> = (0..ROUNDS)
        .flat_map(|round| (0..DEVICES).map(move |n| (round, n)))
        .map(|(round, n)| {
            let mut body = body(&targets[n as usize], &[&device(n)]);
            // A distinct wake-up per round: not §2.4's duplicate of the last.
            body["notification"]["counts"]["unread_increment"] = json!(round + 1);
            (format!("crash-{n}-{round}"), body)
        })
        .collect();

    let api = s.fanout.api;
    let first = answer_all(api, &notifies, IN_FLIGHT).await;
    s.fanout.kill9();
    let accepted: Vec<&(String, Value)> =
        notifies.iter().zip(&first).filter(|(_, a)| a.body.contains("\"accepted\"")).map(|(n, _)| n).collect();
    assert!(accepted.len() as u64 > ROUNDS * u64::from(DEVICES) / 2, "most are accepted: {}", accepted.len());

    s.fanout.restart().await.expect("restart");
    let again = answer_all(s.fanout.api, &notifies, IN_FLIGHT).await;
    for (((key, _), before), after) in notifies.iter().zip(&first).zip(&again) {
        assert_eq!(after.body, before.body, "the replay of {key} after the restart");
    }

    // Every accepted wake-up at the provider: (token, unread_increment).
    let wanted: std::collections::HashSet<(String, u64)> = accepted
        .iter()
        .map(|(key, body)| {
            let n: u32 = key.split('-').nth(1).unwrap().parse().unwrap();
            (format!("crash-{n}"), body["notification"]["counts"]["unread_increment"].as_u64().unwrap())
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen: std::collections::HashSet<(String, u64)> = s
            .fcm
            .received()
            .iter()
            .filter_map(|r| Some((r.token.clone(), fcm_payload(r)["counts"]["unread_increment"].as_u64()?)))
            .collect();
        let missing = wanted.difference(&seen).count();
        if missing == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{missing} of {} accepted wake-ups never reached the provider\n{}",
            wanted.len(),
            s.fanout.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends `notifies` with `in_flight` at once; their answers in order, each 200.
async fn answer_all(api: std::net::SocketAddr, notifies: &[(String, Value)], in_flight: usize) -> Vec<Answer> {
    let mut answers: Vec<Option<Answer>> = (0..notifies.len()).map(|_| None).collect();
    let mut running = tokio::task::JoinSet::new();
    let mut next = 0;
    while next < notifies.len() || !running.is_empty() {
        while next < notifies.len() && running.len() < in_flight {
            let (key, body) = notifies[next].clone();
            let i = next;
            running.spawn(async move { (i, notify_at(api, &key, &body, now_s()).await) });
            next += 1;
        }
        let (i, answer) = running.join_next().await.expect("a notify in flight").expect("a notify task");
        assert_eq!(answer.status, 200, "{}: {}", notifies[i].0, answer.body);
        answers[i] = Some(answer);
    }
    answers.into_iter().map(|a| a.expect("every notify answered")).collect()
}
