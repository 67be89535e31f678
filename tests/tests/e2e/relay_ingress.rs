//! Spec 003 push-server side end to end: the real `fanout` binary
//! with `[engine.relay_ingress]`, APNs (a sandbox and a production mock) and
//! FCM mocks. Webhooks are signed here with the `hmac` crate, independently
//! of the engine's code, and POSTed over plain HTTP/1.1 on 127.0.0.1.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fanout_testkit::{
    ApnsReply, ApnsTestKey, MockApns, MockApnsConfig, MockFcm, MockFcmConfig, TestPki, start_mock_apns, start_mock_fcm,
};
use fanout_tests::{EngineConfig, Fanout};

use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::common::{RawAnswer, post_raw, quote};

pub(crate) const SECRET: &str = "example-secret-0123456789abcdef0123";
pub(crate) const HUB: &str = "hubexample";
pub(crate) const PATH: &str = "/v1/relay/push";
pub(crate) const APP: &str = "im.g.apps";
const T: Duration = Duration::from_secs(10);

pub(crate) struct Setup {
    pub(crate) fanout: Fanout,
    pub(crate) sandbox: MockApns,
    pub(crate) production: MockApns,
    pub(crate) fcm: MockFcm,
    /// Holds AuthKey.p8, ca.pem, sa.json and hub.secret.
    pub(crate) dir: tempfile::TempDir,
}

pub(crate) async fn setup() -> Setup {
    setup_with(Vec::new()).await
}

/// `setup` with extra environment for the push server (e.g. its log format).
pub(crate) async fn setup_with(env: Vec<(String, String)>) -> Setup {
    let pki = TestPki::generate(&[]).expect("pki");
    let key = ApnsTestKey::generate().expect("key");
    let apns_config = || MockApnsConfig {
        team_id: "TEAM123456".into(),
        key_id: "KEY1234567".into(),
        public_key_pem: Some(key.public_pem.clone()),
        ..Default::default()
    };
    let sandbox = start_mock_apns(&pki, apns_config()).await.expect("mock APNs sandbox");
    let production = start_mock_apns(&pki, apns_config()).await.expect("mock APNs production");
    let fcm = start_mock_fcm(&pki, MockFcmConfig::default()).await.expect("mock FCM");
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file: PathBuf = dir.path().join("AuthKey.p8");
    key.write_p8(&key_file).expect("write key");
    let ca: PathBuf = dir.path().join("ca.pem");
    pki.write_ca(&ca).expect("write ca");
    let account: PathBuf = dir.path().join("sa.json");
    fcm.service_account().write(&account).expect("write service account");
    let secret: PathBuf = dir.path().join("hub.secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("write secret");
    let tables = format!(
        "[engine.channels.apns]\nkey_file = {key}\nkey_id = \"KEY1234567\"\nteam_id = \"TEAM123456\"\n\
         bundle_id = \"com.example.fanout\"\nenvironment = \"production\"\nsandbox_url = \"{sandbox}\"\n\
         production_url = \"{production}\"\nextra_ca_files = [{ca}]\n\n\
         [engine.channels.fcm]\nservice_account_file = {account}\nbase_url = \"{fcm}\"\nextra_ca_files = [{ca}]\n\n\
         [engine.relay_ingress]\npath = \"{PATH}\"\nhubs = {{ {HUB} = {secret} }}\napns_app_ids = [\"{APP}\"]\n\n",
        key = quote(&key_file),
        sandbox = sandbox.base_url(),
        production = production.base_url(),
        ca = quote(&ca),
        account = quote(&account),
        fcm = fcm.base_url(),
        secret = quote(&secret),
    );
    let fanout =
        Fanout::start(EngineConfig { extra_tables: tables, env, ..Default::default() }).await.expect("start fanout");
    Setup { fanout, sandbox, production, fcm, dir }
}

pub(crate) fn delivery_id() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// §2.2, written from the spec: hex(HMAC-SHA256(secret, "<t>." || body)).
pub(crate) fn sign(secret: &str, t: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

pub(crate) fn webhook(id: &str, provider: &str, token: &str, sandbox: bool) -> Vec<u8> {
    let collapse = "b76b4f49cf0d311f53af81576f61d459";
    let mut registration = serde_json::json!({"provider": provider, "token": token, "sandbox": sandbox});
    if provider == "apns" {
        registration["app_id"] = APP.into();
    }
    serde_json::to_vec(&serde_json::json!({
        "v": 1, "hub_id": HUB, "delivery_id": id, "sent_at": now() * 1000,
        "registration": registration, "priority": "high", "collapse_id": collapse, "ttl": 86400,
        "payload": {"v": 1, "type": "message", "gid": "Z3JvdXAtMQ", "seq": 42, "message_id": collapse,
                    "collapse_id": collapse, "mls_message": "QUJD"},
        "a_field_from_a_later_hub": true,
    }))
    .unwrap()
}

/// One POST over HTTP/1.1: the raw bytes go out exactly as signed.
pub(crate) async fn post(addr: SocketAddr, signature: Option<&str>, delivery: &str, body: &[u8]) -> RawAnswer {
    let mut headers = vec![("X-Gim-Delivery".to_string(), delivery.to_string())];
    if let Some(signature) = signature {
        headers.push(("X-Gim-Signature".to_string(), signature.to_string()));
    }
    post_raw(addr, PATH, &headers, body).await
}

async fn send(s: &Setup, id: &str, body: &[u8]) -> RawAnswer {
    post(s.fanout.api, Some(&sign(SECRET, now(), body)), id, body).await
}

async fn metric(s: &Setup, line: &str) -> u64 {
    let (_, text) = s.fanout.http_get("/metrics").await.expect("metrics");
    text.lines().find_map(|l| l.strip_prefix(line)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_webhooks_reach_apns_and_fcm_once() {
    let s = setup().await;

    // APNs, sandbox registration: the sandbox host, the app's topic, the collapse id.
    let id = delivery_id();
    let body = webhook(&id, "apns", "00aa11bb", true);
    let answer = send(&s, &id, &body).await;
    assert_eq!(answer.status, 200, "{}\n{}", answer.body, s.fanout.log_tail(30));
    assert_eq!(answer.body, r#"{"result":"delivered"}"#);
    let got = s.sandbox.wait_for(1, T).await;
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.path, "/3/device/00aa11bb");
    assert_eq!(r.auth_valid, Some(true));
    assert_eq!(r.header("apns-topic"), Some(APP));
    assert_eq!(r.header("apns-collapse-id"), Some("b76b4f49cf0d311f53af81576f61d459"));
    assert_eq!((r.header("apns-push-type"), r.header("apns-priority")), (Some("background"), Some("5")));
    let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let json = r.json().unwrap();
    assert_eq!(json["aps"], serde_json::json!({"content-available": 1}));
    assert_eq!(json["payload"], sent["payload"]);

    // §2.5: the same delivery_id again (a hub retry, signed anew) is
    // acknowledged without a second provider request.
    let again = send(&s, &id, &body).await;
    assert_eq!((again.status, again.body.as_str()), (200, r#"{"result":"duplicate"}"#));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.sandbox.received_count(), 1);

    // sandbox = false: the production host.
    let id = delivery_id();
    assert_eq!(send(&s, &id, &webhook(&id, "apns", "prod-token", false)).await.status, 200);
    assert_eq!(s.production.wait_for(1, T).await[0].path, "/3/device/prod-token");

    // FCM: the token in the message, collapse_key, priority, payload as data.
    let id = delivery_id();
    let body = webhook(&id, "fcm", "fcm-registration-1", false);
    assert_eq!(send(&s, &id, &body).await.status, 200);
    let got = s.fcm.wait_for(1, T).await;
    let message = &got[0].json().unwrap()["message"];
    assert_eq!(got[0].token, "fcm-registration-1");
    assert_eq!(message["android"]["collapse_key"], "b76b4f49cf0d311f53af81576f61d459");
    assert_eq!(message["android"]["priority"], "HIGH");
    let data: serde_json::Value = serde_json::from_str(message["data"]["payload"].as_str().unwrap()).unwrap();
    assert_eq!(data, serde_json::from_slice::<serde_json::Value>(&body).unwrap()["payload"]);

    assert_eq!(metric(&s, "fanout_relay_ingress_webhooks_total{result=\"accepted\"}").await, 3);
    assert_eq!(metric(&s, "fanout_relay_ingress_webhooks_total{result=\"duplicate\"}").await, 1);
    assert_eq!(metric(&s, "fanout_relay_ingress_pushes_total{channel=\"apns\",outcome=\"delivered\"}").await, 2);
    // No token, payload or secret in the log.
    let log = s.fanout.log();
    for secret in ["00aa11bb", "fcm-registration-1", SECRET, "QUJD"] {
        assert!(!log.contains(secret), "the log shows {secret}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unverified_webhooks_send_nothing() {
    let s = setup().await;
    let id = delivery_id();
    let body = webhook(&id, "apns", "tok", true);
    let t = now();
    // Signed with another secret, no signature, a replay from 10 minutes
    // ago, a body changed after signing, and a wrong X-Gim-Delivery.
    let cases: Vec<(&str, Option<String>, String, Vec<u8>, u16)> = vec![
        ("wrong secret", Some(sign("another-secret", t, &body)), id.clone(), body.clone(), 401),
        ("no signature", None, id.clone(), body.clone(), 401),
        ("stale", Some(sign(SECRET, t - 600, &body)), id.clone(), body.clone(), 401),
        ("tampered", Some(sign(SECRET, t, &body)), id.clone(), webhook(&id, "apns", "tok2", true), 401),
        ("wrong delivery header", Some(sign(SECRET, t, &body)), delivery_id(), body.clone(), 400),
    ];
    for (what, signature, delivery, sent, status) in cases {
        let answer = post(s.fanout.api, signature.as_deref(), &delivery, &sent).await;
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
        assert!(answer.headers.contains("content-type: application/problem+json"), "{what}: {}", answer.headers);
        let problem: serde_json::Value = serde_json::from_str(&answer.body).expect("problem JSON");
        assert_eq!(problem["status"], status, "{what}");
    }
    // A provider this server does not deliver: a permanent 4xx.
    let other = delivery_id();
    assert_eq!(send(&s, &other, &webhook(&other, "unifiedpush", "t", false)).await.status, 422);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.sandbox.received_count() + s.production.received_count() + s.fcm.received_count(), 0);
    assert_eq!(metric(&s, "fanout_relay_ingress_rejected_total{reason=\"signature_mismatch\"}").await, 2);
    assert_eq!(metric(&s, "fanout_relay_ingress_rejected_total{reason=\"signature_stale\"}").await, 1);

    // The refusals stored nothing: the genuine webhook is delivered.
    assert_eq!(send(&s, &id, &body).await.status, 200);
    assert_eq!(s.sandbox.wait_for(1, T).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_token_answers_410_and_a_transient_one_503() {
    let s = setup().await;
    s.sandbox.script("dead", vec![ApnsReply::reason(410, "Unregistered")]);
    let id = delivery_id();
    let body = webhook(&id, "apns", "dead", true);
    assert_eq!(send(&s, &id, &body).await.status, 410);
    // The hub's retry of it gets 410 again, from the record.
    assert_eq!(send(&s, &id, &body).await.status, 410);
    assert_eq!(s.sandbox.received_count(), 1);

    // APNs 503: answered 503 with Retry-After; the retry sends again.
    s.sandbox.script("busy", vec![ApnsReply::status(503)]);
    let id = delivery_id();
    let body = webhook(&id, "apns", "busy", true);
    let answer = send(&s, &id, &body).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(answer.headers.contains("retry-after: 1"), "{}", answer.headers);
    assert_eq!(send(&s, &id, &body).await.status, 200);
    assert_eq!(s.sandbox.received_for("busy").len(), 2);
}
