//! PUSH-254 under traffic: two engines at debug level, in
//! the text and the JSON log format, carry pushes over every channel, and
//! neither log, neither `/metrics` and no error message (gRPC status, HTTP
//! problem body) holds a recipient id or secret, a signing key, a device
//! token, a webhook URL, a topic, envelope data or a provider credential.
//!
//! The hub sends webhooks (one receiver that answers, one that answers 410
//! until the recipient is deleted), APNs and FCM directly (a delivered token
//! and a dead one each), and relayed pushes (spec 003) to the push server,
//! whose ingress sends them on to the same mock APNs and FCM. `admission.rs`
//! checks the admission paths of one engine at info level; this adds the
//! delivery paths, both formats, debug level, and the provider credentials
//! the engines hold or are handed (the APNs key and its JWTs, the FCM
//! service-account key, its assertions and access tokens, the hub secret).

use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_testkit::{ApnsReply, FcmReply, ScriptedResponse};
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, subscription};
use serde_json::json;
use tonic::Code;

use crate::admission::{Check, Private, random_bytes};
use crate::common::{DELIVERY_WAIT, publish, quote, webhook_setup};
use crate::relay::{named_group, put};
use crate::relay_ingress::{APP, HUB, PATH, SECRET, post, setup_with};

/// Envelopes published: each reaches every live recipient.
const PUSHES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_private_in_text_logs_metrics_or_errors_under_traffic() {
    run("text").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_private_in_json_logs_metrics_or_errors_under_traffic() {
    run("json").await;
}

/// `FANOUT__LOG__*` for debug level in `format`; RUST_LOG too, which wins
/// over the file when the test's own environment sets it.
fn debug_logs(format: &str) -> Vec<(String, String)> {
    vec![
        ("FANOUT__LOG__LEVEL".into(), "debug".into()),
        ("FANOUT__LOG__FORMAT".into(), format.into()),
        ("RUST_LOG".into(), "debug".into()),
    ]
}

/// A random, recognisable text: `prefix-` and 24 hex digits.
fn marked(prefix: &str) -> String {
    format!("{prefix}-{}", hex::encode(random_bytes(12)))
}

/// The base64 body lines of a PEM file (each at least 12 characters).
fn pem_lines(private: &mut Private, what: &str, pem: &str) {
    for line in pem.lines().filter(|l| !l.starts_with("-----")) {
        private.add(what, line.trim().to_owned());
    }
}

/// A JWT and its parts (header, claims, signature): any of them is enough
/// to recognise or replay it.
fn jwt(private: &mut Private, what: &str, token: &str) {
    private.add(what, token.to_owned());
    for part in token.split('.') {
        private.add(what, part.to_owned());
    }
}

async fn run(format: &str) {
    let mut private = Private::default();
    let mut ck = Check::default();

    // The push server: relay ingress, APNs (production, with the sandbox
    // mock for sandbox tokens) and FCM, with the mocks they send to.
    let push = setup_with(debug_logs(format)).await;
    let dir = push.dir.path();
    pem_lines(&mut private, "APNs provider key", &std::fs::read_to_string(dir.join("AuthKey.p8")).unwrap());
    let account: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("sa.json")).unwrap()).unwrap();
    pem_lines(&mut private, "FCM service-account key", account["private_key"].as_str().unwrap());
    if let Some(id) = account["private_key_id"].as_str() {
        private.add("FCM private_key_id", id.to_owned());
    }
    private.add("hub secret", SECRET.to_owned());

    // The hub: webhooks to a mock receiver, APNs and FCM straight to the
    // mocks, and the relay channel to the push server's ingress.
    let hub_secret = dir.join("hub.secret");
    let tables = format!(
        "[engine.channels.apns]\nkey_file = {key}\nkey_id = \"KEY1234567\"\nteam_id = \"TEAM123456\"\n\
         bundle_id = \"com.example.fanout\"\nenvironment = \"sandbox\"\nsandbox_url = \"{sandbox}\"\n\
         production_url = \"https://127.0.0.1:1\"\nextra_ca_files = [{ca}]\n\n\
         [engine.channels.fcm]\nservice_account_file = {account}\nbase_url = \"{fcm}\"\nextra_ca_files = [{ca}]\n\n\
         [engine.channels.relay]\nurl = \"http://{ingress}{PATH}\"\nsecret_file = {secret}\nhub_id = \"{HUB}\"\n\
         dangerous_allow_plain_http = true\n\n",
        key = quote(&dir.join("AuthKey.p8")),
        sandbox = push.sandbox.base_url(),
        ca = quote(&dir.join("ca.pem")),
        account = quote(&dir.join("sa.json")),
        fcm = push.fcm.base_url(),
        ingress = push.fanout.api,
        secret = quote(&hub_secret),
    );
    // Webhooks go to a host name (the test DNS server's `receiver`), so a
    // name, its port and the address it resolves to are all private.
    let dns = fanout_tests::dns::start(fanout_tests::dns::standard_zone()).await.expect("dns");
    let config = EngineConfig {
        dns_server: Some(dns.addr),
        extra_tables: tables,
        engine_extra: "max_attempts = 3".into(),
        env: debug_logs(format),
        ..EngineConfig::default()
    };
    let setup = webhook_setup(config).await;
    let (hub, receiver) = (&setup.fanout, &setup.receiver);
    let mut c = hub.notifications().await.expect("client");

    // One topic for everything: a group id that is itself recognisable.
    let gid = marked("leak-gid");
    let topic = named_group(&gid);
    private.add("group id", gid.clone());
    private.bytes("topic", &topic);
    let subscribe = async |c: &mut crate::admission::Client, r: &Recipient| {
        c.update_subscriptions(r.update(vec![subscription(&topic)], vec![])).await.expect("subscribe");
    };

    // Webhooks: one answers, one is gone (410 on every attempt).
    let port = receiver.addr().port();
    private.add("webhook host", "receiver.fanout.test".into());
    private.add("webhook destination", format!("127.0.0.1:{port}"));
    let mut webhook = |path: &str| {
        let r = Recipient::random();
        let key = random_bytes(32);
        let url = format!("https://receiver.fanout.test:{port}{path}");
        receiver.set_signing_key(path, key.clone());
        private.recipient(&r);
        private.bytes("signing key", &key);
        private.add("webhook URL", url.clone());
        private.add("webhook path", path.to_owned());
        (r, url, key)
    };
    let live_path = format!("/{}", marked("hook-live"));
    let gone_path = format!("/{}", marked("hook-gone"));
    receiver.script(&gone_path, vec![ScriptedResponse::status(410); 3]);
    let webhooks = [webhook(&live_path), webhook(&gone_path)];
    for (r, url, key) in &webhooks {
        ck.ok("register a webhook", c.register(r.register_http(url, key)).await);
        subscribe(&mut c, r).await;
    }

    // APNs and FCM straight from the hub: one delivered token, one dead.
    let mut devices: Vec<(Recipient, String)> = Vec::new();
    for (channel, state) in [("apns", "ok"), ("apns", "dead"), ("fcm", "ok"), ("fcm", "dead")] {
        let r = Recipient::random();
        let token = marked(&format!("{channel}-{state}-token"));
        private.recipient(&r);
        private.add("device token", token.clone());
        let delivery = match channel {
            "apns" => pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: token.clone() }),
            _ => pb::register_request::Delivery::Fcm(pb::FcmDelivery { token: token.clone() }),
        };
        match (channel, state) {
            ("apns", "dead") => push.sandbox.script(&token, vec![ApnsReply::reason(410, "Unregistered")]),
            ("fcm", "dead") => push.fcm.script(&token, vec![FcmReply::fcm_error(404, "NOT_FOUND", "UNREGISTERED")]),
            _ => {}
        }
        ck.ok(&format!("register {channel} ({state})"), c.register(r.register(delivery)).await);
        subscribe(&mut c, &r).await;
        devices.push((r, token));
    }

    // Relayed pushes (spec 003): registered through the hub's HTTP API.
    let mut relayed: Vec<String> = Vec::new();
    for provider in ["apns", "fcm"] {
        let r = Recipient::random();
        let token = marked(&format!("relay-{provider}-token"));
        private.recipient(&r);
        private.add("relay token", token.clone());
        private.add("registration bearer", r.bearer());
        let mut body = json!({"provider": provider, "token": token});
        if provider == "apns" {
            body["app_id"] = json!(APP);
            body["sandbox"] = json!(true);
        }
        let (status, answer) = put(hub, &r, &body).await;
        ck.eq(&format!("relay registration ({provider}) {answer}"), status, 204);
        subscribe(&mut c, &r).await;
        relayed.push(token);
    }

    // Traffic: pushes in quick succession, each with its own recognisable data.
    for _ in 0..PUSHES {
        let data = random_bytes(24);
        private.bytes("envelope data", &data);
        let envelope = pb::Envelope {
            topic: topic.clone(),
            kind: pb::EnvelopeKind::Application as i32,
            should_push: true,
            data,
            ..pb::Envelope::default()
        };
        publish(hub, vec![envelope]).await;
    }
    let deadline = tokio::time::Instant::now() + DELIVERY_WAIT + Duration::from_secs(15);
    let arrived = |token: &str| push.sandbox.received_for(token).len() + push.fcm.received_for(token).len();
    let live_tokens: Vec<&str> = devices
        .iter()
        .map(|(_, t)| t.as_str())
        .filter(|t| t.contains("-ok-"))
        .chain(relayed.iter().map(String::as_str))
        .collect();
    // The relay channel may coalesce wake-ups, so a relayed token needs one.
    let to = |path: &str| receiver.received().iter().filter(|q| q.path == path).count();
    loop {
        let done = to(&live_path) >= PUSHES && to(&gone_path) >= 3 && live_tokens.iter().all(|t| arrived(t) >= 1);
        if done || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ck.eq("webhooks to the live receiver", to(&live_path), PUSHES);
    ck.truth("webhooks to the gone receiver", to(&gone_path) >= 3);
    for token in &live_tokens {
        ck.truth(&format!("a push reached the provider for {token}"), arrived(token) >= 1);
    }

    // Error messages: refused calls that carry private values.
    let (r, url, key) = &webhooks[0];
    let wrong = Recipient { id: r.id.clone(), secret: random_bytes(32) };
    private.recipient(&wrong);
    ck.code("Register with a wrong secret", c.register(wrong.register_http(url, key)).await, Code::PermissionDenied);
    let plain = url.replacen("https://", "http://", 1);
    private.add("webhook URL", plain.clone());
    let fresh = Recipient::random();
    private.recipient(&fresh);
    ck.code("Register an http:// URL", c.register(fresh.register_http(&plain, key)).await, Code::InvalidArgument);
    let nul_token = format!("{}\0", marked("nul-token"));
    private.add("device token", nul_token.trim_end_matches('\0').to_owned());
    let apns = pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: nul_token });
    ck.code("Register a token with a NUL", c.register(fresh.register(apns)).await, Code::InvalidArgument);
    let mut messages = ck.messages.join("\n");

    // HTTP problem bodies: the ingress refusing a forged webhook, the
    // registration API refusing a wrong credential.
    let forged = serde_json::to_vec(&json!({"v": 1, "hub_id": HUB, "delivery_id": "0".repeat(32),
        "registration": {"provider": "apns", "token": relayed[0], "app_id": APP}, "priority": "high",
        "payload": {"type": "wake"}}))
    .unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let forged_signature = format!("t={now},v1={}", hex::encode(random_bytes(32)));
    private.add("forged signature", forged_signature.clone());
    let answer = post(push.fanout.api, Some(&forged_signature), &"0".repeat(32), &forged).await;
    ck.eq("the ingress refuses a forged webhook", answer.status, 401);
    messages.push_str(&answer.body);
    let (status, body) = put(hub, &wrong, &json!({"provider": "fcm", "token": relayed[1]})).await;
    ck.truth(&format!("a wrong credential is refused ({status})"), status == 401 || status == 403);
    messages.push_str(&body.to_string());

    // Credentials the engines presented: the APNs JWTs, the FCM access
    // tokens and the OAuth assertions.
    for q in push.sandbox.received().iter().chain(push.fcm.received().iter()) {
        if let Some(bearer) =
            q.header("authorization").and_then(|a| a.strip_prefix("bearer ").or(a.strip_prefix("Bearer ")))
        {
            jwt(&mut private, "provider credential", bearer);
        }
    }
    for q in push.fcm.token_requests() {
        let form = String::from_utf8_lossy(&q.body).into_owned();
        for (name, value) in form.split('&').filter_map(|p| p.split_once('=')) {
            if name == "assertion" {
                jwt(&mut private, "OAuth assertion", value);
            }
        }
    }

    // The scan.
    for (who, engine) in [("hub", hub), ("push server", &push.fanout)] {
        let log = engine.log();
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        ck.truth(&format!("the {who} logged at debug level"), lines.iter().any(|l| l.contains("DEBUG")));
        let json_lines = lines.iter().filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()).count();
        let want_json = if format == "json" { lines.len() } else { 0 };
        ck.eq(&format!("the {who}'s {format} log lines that are JSON"), json_lines, want_json);
        private.check(&mut ck, &format!("the {who}'s {format} log"), &log);
        let (status, metrics) = engine.http_get("/metrics").await.expect("/metrics");
        ck.eq(&format!("the {who}'s /metrics"), status, 200);
        private.check(&mut ck, &format!("the {who}'s /metrics"), &metrics);
    }
    private.check(&mut ck, "an error message", &messages);

    ck.finish(&format!("PUSH-254 under traffic, {format} logs"), &hub.log());
}
