//! The dashboards and rules on a real Prometheus (Debian's 2.42; its binary
//! is named by `FANOUT_TEST_PROMETHEUS`, set by `.ci/run`; without it the
//! test fails under CI and is a visible skip elsewhere).
//!
//! Prometheus scrapes two real engines every second with the project's
//! rules files loaded, their ranges and `for` durations shrunk to seconds
//! so that a run of about two minutes shows what hours would. Engine `fanout`
//! has every component (webhooks, APNs, FCM, Web Push, the relay on both
//! sides, the gateway) and a shard actor that panics once, engine
//! `fanout-dispatch` a short window timeout and three delivery attempts that
//! panic. Traffic runs throughout; for a stretch,
//! faults are switched on together (providers answering 503 and 400, an FCM
//! token outage, a webhook name turning to a reserved address, a failing
//! DNS name, refused registrations, envelopes over the data limit, hanging
//! webhooks, unverified relay webhooks and notify signatures, a device whose
//! wake-ups do not drain). Then:
//! - every recording rule and every dashboard query returns data, with the
//!   labels its legend names;
//! - every alert but those docs/OPERATIONS.md names as out of a short run's
//!   reach goes pending, and every alert is inactive again once the faults
//!   end; pausing the engine raises FanoutDown and FanoutAbsent, resuming it
//!   clears them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_testkit::launcher::free_port;
use fanout_testkit::mock::apns::ApnsHook;
use fanout_testkit::mock::webhook::RequestHook;
use fanout_testkit::{
    ApnsReply, ApnsTestKey, MockApns, MockApnsConfig, MockFcm, MockFcmConfig, MockWebhook, MockWebhookConfig,
    ScriptedResponse, TestPki, start_mock_apns, start_mock_fcm, start_mock_webhook,
};
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::dns::{self, TestDns};
use fanout_tests::{EngineConfig, Fanout};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::quote;
use crate::gateway::{self, Json as _};
use crate::{relay, relay_ingress, webhook_safety};

const DASHBOARD: &str = include_str!("../../../dashboards/fanout.json");
const ALERTS: &str = include_str!("../../../dashboards/rules/fanout-alerts.yml");
const RECORDING: &str = include_str!("../../../dashboards/rules/fanout-recording.yml");
const OPERATIONS: &str = include_str!("../../../docs/OPERATIONS.md");

/// Every range of the rules and of the dashboard queries becomes this...
const RANGE: &str = "15s";
/// ...and every `for` this, so an alert is pending within seconds of its
/// condition and resolves about a range after the fault ends.
const HOLD: &str = "2s";
/// The ranges and `for` durations the rules files use today.
const RULE_DURATIONS: &[&str] = &["5m", "10m", "15m", "30m"];

/// Alerts a run of minutes cannot provoke; docs/OPERATIONS.md names each
/// with its reason under [`UNPROVOKED_HEADING`].
const UNPROVOKED: &[&str] = &[
    "FanoutStoreErrors",
    "FanoutShardRestartLoop",
    "FanoutRelayQueueDropping",
    "FanoutGatewayWakeupWorkerStalled",
    "FanoutGatewayWakeupsLate",
    "FanoutCertificateExpiresSoon",
    "FanoutCertificateExpiring",
];
const UNPROVOKED_HEADING: &str = "### Alerts the live check cannot provoke";

/// Time between two rounds of traffic.
const TICK: Duration = Duration::from_millis(300);
/// Healthy traffic before the faults: every series has samples.
const WARM_UP: Duration = Duration::from_secs(8);
/// The faults last longer than a range plus the hold.
const FAULTS: Duration = Duration::from_secs(30);
/// Bound on the wait for every alert to resolve after the faults.
const RECOVERY: Duration = Duration::from_secs(120);
/// Bound on each wait around the pause.
const PAUSE_WAIT: Duration = Duration::from_secs(45);

/// The webhook receiver's paths and what each answers during the faults.
const OK_PATH: &str = "/ok";
const TRANSIENT_PATH: &str = "/transient"; // 503
const REJECTED_PATH: &str = "/rejected"; // 400
const RELAY_PATH: &str = "/push"; // the relay's push server: 400
/// A name of the test DNS server: loopback, then a reserved address during the faults.
const RECEIVER: &str = "receiver.fanout.test";
/// A name whose lookups fail (SERVFAIL): Register answers UNAVAILABLE.
const FAILING: &str = "servfail.fanout.test";
const RELAY_SECRET: &str = "live-prometheus-relay-secret-0123456789";

/// Rules text with every range and `for` shrunk.
fn shrunk(rules: &str) -> String {
    let mut text = rules.to_owned();
    for d in RULE_DURATIONS {
        text = text.replace(&format!("[{d}]"), &format!("[{RANGE}]"));
        text = text.replace(&format!("for: {d}"), &format!("for: {HOLD}"));
    }
    for (i, _) in text.match_indices("m]") {
        let before = text[..i].chars().next_back();
        assert!(
            !before.is_some_and(|c| c.is_ascii_digit()),
            "a range the test does not shrink: {}",
            &text[i - 4..i + 2]
        );
    }
    assert!(
        text.lines().filter_map(|l| l.trim().strip_prefix("for: ")).all(|d| d == HOLD),
        "a `for` the test does not shrink"
    );
    text
}

fn named(rules: &str, key: &str) -> Vec<String> {
    rules.lines().filter_map(|l| l.trim().strip_prefix(key)).map(|n| n.trim().to_owned()).collect()
}

/// (panel title, query, labels its legend names) for every dashboard query.
fn dashboard_queries() -> Vec<(String, String, Vec<String>)> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr").replace("$__rate_interval", RANGE);
            let expr = ["${job}", "$job", "${instance}", "$instance"].iter().fold(expr, |e, v| e.replace(v, ".*"));
            assert!(!expr.contains('$'), "an unknown variable in {expr}");
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            let labels = legend
                .split("{{")
                .skip(1)
                .filter_map(|s| s.split_once("}}"))
                .map(|(l, _)| l.trim().to_owned())
                .collect();
            out.push((panel["title"].as_str().unwrap_or_default().to_owned(), expr, labels));
        }
    }
    out
}

fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One GET over HTTP/1.0, so the answer is neither chunked nor kept alive.
async fn get(addr: SocketAddr, target: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {target} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await??;
    let text = String::from_utf8(buf)?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| anyhow::anyhow!("no header block"))?;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| anyhow::anyhow!("status"))?;
    Ok((status, body.to_owned()))
}

/// A Prometheus server on a free loopback port, killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(binary: &str, targets: &[(&str, SocketAddr)]) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("recording.yml"), shrunk(RECORDING)).expect("write rules");
        std::fs::write(dir.path().join("alerts.yml"), shrunk(ALERTS)).expect("write rules");
        let jobs: String = targets
            .iter()
            .map(|(job, addr)| format!("  - job_name: {job}\n    static_configs:\n      - targets: [\"{addr}\"]\n"))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 800ms\n  evaluation_interval: 1s\n\
             rule_files:\n  - recording.yml\n  - alerts.yml\nscrape_configs:\n{jobs}"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write config");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new(binary)
            .current_dir(dir.path())
            .arg("--config.file=prometheus.yml")
            .arg("--storage.tsdb.path=data")
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus { child, addr, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    async fn api(&self, target: &str) -> Value {
        let (status, body) = get(self.addr, target).await.unwrap_or_else(|e| panic!("GET {target}: {e}"));
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("GET {target}: {status} {body}"));
        assert_eq!(answer["status"], "success", "GET {target}: {body}");
        answer["data"].clone()
    }

    /// The samples of an instant query.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", percent_encoded(expr))).await;
        match data["resultType"].as_str() {
            Some("vector" | "matrix") => data["result"].as_array().cloned().unwrap_or_default(),
            _ => vec![data["result"].clone()],
        }
    }

    /// (alert name, state) of every pending or firing alert.
    async fn active_alerts(&self) -> Vec<(String, String)> {
        let data = self.api("/api/v1/alerts").await;
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let name = a["labels"]["alertname"].as_str().unwrap_or_default().to_owned();
                (name, a["state"].as_str().unwrap_or_default().to_owned())
            })
            .collect()
    }

    async fn wait_ready(&self, jobs: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if get(self.addr, "/-/ready").await.is_ok_and(|(s, _)| s == 200) {
                let up = self.query("up == 1").await;
                if up.len() == jobs {
                    return;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "Prometheus not scraping {jobs} targets:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the alert poller has seen: alert name → states.
type Seen = Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Everything the engines talk to, and the switches of the faults.
struct World {
    every: Fanout,
    dispatch: Fanout,
    receiver: MockWebhook,
    hanging: MockWebhook,
    _apns: MockApns,
    fcm: MockFcm,
    dns: TestDns,
    faults: Arc<AtomicBool>,
    _pki: TestPki,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let faults = Arc::new(AtomicBool::new(false));
    let pki = TestPki::generate(&[RECEIVER]).expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let on = faults.clone();
    let receiver = start_mock_webhook(
        &pki,
        MockWebhookConfig {
            on_request: Some(RequestHook::new(move |req| {
                if !on.load(Ordering::SeqCst) {
                    return None;
                }
                match req.path {
                    TRANSIENT_PATH => Some(ScriptedResponse::status(503)),
                    REJECTED_PATH | RELAY_PATH => Some(ScriptedResponse::status(400)),
                    _ => None,
                }
            })),
            ..MockWebhookConfig::default()
        },
    )
    .await
    .expect("mock webhook");
    let on = faults.clone();
    let hanging = start_mock_webhook(
        &pki,
        MockWebhookConfig {
            on_request: Some(RequestHook::new(move |_| {
                on.load(Ordering::SeqCst).then(|| ScriptedResponse::status(200).with_delay(Duration::from_secs(30)))
            })),
            ..MockWebhookConfig::default()
        },
    )
    .await
    .expect("mock webhook");
    let key = ApnsTestKey::generate().expect("key");
    let on = faults.clone();
    let apns = start_mock_apns(
        &pki,
        MockApnsConfig {
            on_request: Some(ApnsHook::new(move |_| on.load(Ordering::SeqCst).then(|| ApnsReply::status(503)))),
            ..gateway::apns_config(&key)
        },
    )
    .await
    .expect("mock APNs");
    let fcm = start_mock_fcm(&pki, MockFcmConfig::default()).await.expect("mock FCM");
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    dns.fail(FAILING);

    // APNs, FCM, the gateway and the Station, as the gateway tests have them...
    gateway::write_files(dir.path(), &pki, &key, &fcm);
    let ca = dir.path().join("ca.pem");
    let mut tables = gateway::tables(
        &apns.base_url(),
        &fcm.base_url(),
        dir.path(),
        true,
        30,
        "max_pending_wakeups_per_device = 2\n",
    );
    // ...the relay's hub side posting to the receiver...
    let relay_secret = dir.path().join("relay.secret");
    std::fs::write(&relay_secret, RELAY_SECRET).expect("write relay secret");
    tables.push_str(&format!(
        "[engine.channels.relay]\nurl = {:?}\nsecret_file = {}\nextra_ca_files = [{}]\nhub_id = \"hub-live\"\n\n",
        receiver.url(RELAY_PATH),
        quote(&relay_secret),
        quote(&ca),
    ));
    // ...its push-server side...
    let hub_secret = dir.path().join("hub.secret");
    std::fs::write(&hub_secret, relay_ingress::SECRET).expect("write hub secret");
    tables.push_str(&format!(
        "[engine.relay_ingress]\npath = \"{}\"\nhubs = {{ {} = {} }}\napns_app_ids = [\"{}\"]\n\n",
        relay_ingress::PATH,
        relay_ingress::HUB,
        quote(&hub_secret),
        relay_ingress::APP,
    ));
    // ...and Web Push (a P-256 key is a VAPID key).
    let vapid = dir.path().join("vapid.pem");
    ApnsTestKey::generate().expect("key").write_p8(&vapid).expect("write vapid key");
    tables.push_str(&format!(
        "[engine.channels.webpush]\nvapid_key_file = {}\nsubject = \"mailto:ops@fanout.test\"\n\n",
        quote(&vapid)
    ));
    let every = Fanout::start(EngineConfig {
        dns_server: Some(dns.addr),
        ca_file: Some(ca.clone()),
        extra_tables: tables,
        env: vec![
            ("FANOUT__ENGINE__INGEST__MAX_DATA_BYTES".into(), "1024".into()),
            // Apart from the attempts that panic, which the restarted
            // actor would re-send before any window replay could.
            ("FANOUT_DANGEROUS_PANIC_AFTER_PAGES".into(), "3".into()),
        ],
        ..EngineConfig::default()
    })
    .await
    .expect("start the engine with every component");
    let dispatch = Fanout::start(EngineConfig {
        ca_file: Some(ca),
        engine_extra: "[engine.dispatch]\nsubscriber_page = 5\nwindow_timeout_seconds = 2".into(),
        env: vec![("FANOUT_DANGEROUS_PANIC_ATTEMPTS".into(), "3".into())],
        ..EngineConfig::default()
    })
    .await
    .expect("start the dispatch engine");
    World { every, dispatch, receiver, hanging, _apns: apns, fcm, dns, faults, _pki: pki, _dir: dir }
}

/// The recipients and targets the traffic uses.
struct Traffic {
    topic: Vec<u8>,
    dispatch_topic: Vec<u8>,
    gateway_target: String,
    gateway_device: String,
    round: u64,
}

const KEY: [u8; 32] = [0x5a; 32];

async fn prepare(w: &World) -> Traffic {
    let mut c = w.every.notifications().await.expect("client");
    let topic = group_topic();
    let port = w.receiver.addr().port();
    let urls = [
        w.receiver.url(OK_PATH),
        w.receiver.url(TRANSIENT_PATH),
        w.receiver.url(REJECTED_PATH),
        format!("https://{RECEIVER}:{port}/send"),
    ];
    for url in urls {
        let r = Recipient::random();
        c.register(r.register_http(&url, &KEY)).await.expect("register");
        c.update_subscriptions(r.update(vec![subscription(&topic)], vec![])).await.expect("subscribe");
    }
    let relayed = Recipient::random();
    let (status, body) = relay::put(&w.every, &relayed, &json!({"provider": "apns", "token": "live-relay-1"})).await;
    assert_eq!(status, 204, "{body}");
    c.update_subscriptions(relayed.update(vec![subscription(&topic)], vec![])).await.expect("subscribe");

    let mut d = w.dispatch.notifications().await.expect("client");
    let dispatch_topic = group_topic();
    for i in 0..10 {
        let r = Recipient::random();
        d.register(r.register_http(&w.hanging.url(&format!("/d{i}")), &KEY)).await.expect("register");
        d.update_subscriptions(r.update(vec![subscription(&dispatch_topic)], vec![])).await.expect("subscribe");
    }

    let gateway_device = gateway::device(7);
    let answer = gateway::register_at(w.every.api, &gateway_device, "fcm:live-gateway-1").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let gateway_target = answer.json()["push_target_id"].as_str().expect("push_target_id").to_owned();
    Traffic { topic, dispatch_topic, gateway_target, gateway_device, round: 0 }
}

/// One round of traffic through every component; with the faults on, also
/// the requests that are refused.
async fn round(w: &World, t: &mut Traffic, faults: bool) {
    t.round += 1;
    let n = t.round;
    let mut envelopes = vec![envelope(&t.topic, pb::EnvelopeKind::Application, true)];
    if faults {
        envelopes.push(pb::Envelope { data: vec![0; 2048], ..envelope(&t.topic, pb::EnvelopeKind::Application, true) });
    }
    let mut p = w.every.publisher().await.expect("publisher");
    p.publish(pb::PublishRequest { envelopes }).await.expect("publish");
    let mut p = w.dispatch.publisher().await.expect("publisher");
    p.publish(pb::PublishRequest { envelopes: vec![envelope(&t.dispatch_topic, pb::EnvelopeKind::Application, true)] })
        .await
        .expect("publish");

    let mut c = w.every.notifications().await.expect("client");
    let _ = c.register(Recipient::random().register_http(&w.receiver.url(OK_PATH), &KEY)).await;
    if faults {
        // Refused by destination safety (not https), and a lookup that fails.
        let _ = c.register(Recipient::random().register_http("http://127.0.0.1:9/hook", &KEY)).await;
        let _ = c.register(Recipient::random().register_http(&format!("https://{FAILING}/hook"), &KEY)).await;
    }

    // The relay's push-server side, one webhook each for FCM and APNs.
    for (provider, token) in [("fcm", "live-ingress-fcm"), ("apns", "live-ingress-apns")] {
        let id = relay_ingress::delivery_id();
        let body = relay_ingress::webhook(&id, provider, token, false);
        let signature = relay_ingress::sign(relay_ingress::SECRET, relay_ingress::now(), &body);
        relay_ingress::post(w.every.api, Some(&signature), &id, &body).await;
        if faults {
            relay_ingress::post(w.every.api, Some("t=1,v1=00"), &relay_ingress::delivery_id(), &body).await;
        }
    }

    // The gateway: a wake-up for the device, and a stale signature.
    let notify = gateway::body(&t.gateway_target, &[&t.gateway_device]);
    gateway::notify_at(w.every.api, &format!("live-{n}"), &notify, gateway::now_s()).await;
    if faults {
        gateway::notify_at(w.every.api, &format!("stale-{n}"), &notify, gateway::now_s() - 3600).await;
    }
}

fn switch_faults(w: &World, on: bool) {
    w.faults.store(on, Ordering::SeqCst);
    let loopback: IpAddr = "127.0.0.1".parse().expect("an address");
    if on {
        w.fcm.script_token_endpoint(vec![503; 100_000]);
        w.fcm.revoke_access_tokens();
        w.dns.set(RECEIVER, vec![loopback, webhook_safety::standard_address("ietf")]);
    } else {
        w.fcm.clear_token_script();
        w.dns.set(RECEIVER, vec![loopback]);
    }
}

async fn run_for(w: &World, t: &mut Traffic, faults: bool, how_long: Duration) {
    let until = tokio::time::Instant::now() + how_long;
    while tokio::time::Instant::now() < until {
        round(w, t, faults).await;
        tokio::time::sleep(TICK).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_on_a_real_prometheus() {
    let Some(binary) = fanout_testkit::outside_service::prometheus_binary() else { return };
    let alerts = named(ALERTS, "- alert:");
    let unprovoked_doc = OPERATIONS.split(UNPROVOKED_HEADING).nth(1).expect("the section in OPERATIONS.md");
    let unprovoked_doc = unprovoked_doc.split("\n## ").next().unwrap_or_default();
    for name in UNPROVOKED {
        assert!(alerts.contains(&name.to_string()), "{name} is not an alert");
        assert!(unprovoked_doc.contains(&format!("`{name}`")), "OPERATIONS.md does not say why {name} is not provoked");
    }

    let w = world().await;
    let prometheus =
        Arc::new(Prometheus::start(&binary, &[("fanout", w.every.http), ("fanout-dispatch", w.dispatch.http)]));
    prometheus.wait_ready(2).await;
    let seen: Seen = Arc::default();
    let poller = {
        let (prometheus, seen) = (prometheus.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                for (name, state) in prometheus.active_alerts().await {
                    lock(&seen).entry(name).or_default().insert(state);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let mut t = prepare(&w).await;

    // Healthy traffic. A shard actor of the first engine panics once here,
    // and the first three attempts of the other, whose deliveries a window
    // replay re-sends.
    run_for(&w, &mut t, false, WARM_UP).await;
    switch_faults(&w, true);
    run_for(&w, &mut t, true, FAULTS).await;

    // With every family moving: every recording rule and dashboard query has data.
    let mut empty = Vec::new();
    for record in named(RECORDING, "- record:") {
        if prometheus.query(&record).await.is_empty() {
            empty.push(format!("recording rule {record}"));
        }
    }
    let queries = dashboard_queries();
    for (title, expr, labels) in &queries {
        let result = prometheus.query(expr).await;
        if result.is_empty() {
            empty.push(format!("panel {title:?}: {expr}"));
        }
        for sample in &result {
            for label in labels {
                if sample["metric"].get(label).is_none() {
                    empty.push(format!("panel {title:?}: a series without its legend label {label}: {sample}"));
                }
            }
        }
    }

    switch_faults(&w, false);
    let deadline = tokio::time::Instant::now() + RECOVERY;
    let mut still_active;
    loop {
        round(&w, &mut t, false).await;
        still_active = prometheus.active_alerts().await;
        if still_active.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let provoked: BTreeSet<String> = lock(&seen).keys().cloned().collect();

    // A frozen engine is not scraped: FanoutDown, and FanoutAbsent for its job.
    w.every.pause().expect("SIGSTOP");
    let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
    let down = ["FanoutDown", "FanoutAbsent"];
    while !down.iter().all(|a| lock(&seen).contains_key(*a)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let down_seen: Vec<_> = down.iter().filter(|a| lock(&seen).contains_key(**a)).collect();
    w.every.resume().expect("SIGCONT");
    let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
    let mut after_resume;
    loop {
        after_resume = prometheus.active_alerts().await;
        if after_resume.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    poller.abort();

    let expected: BTreeSet<String> =
        alerts.iter().filter(|a| !UNPROVOKED.contains(&a.as_str()) && !down.contains(&a.as_str())).cloned().collect();
    let missed: Vec<_> = expected.difference(&provoked).collect();
    let report = format!(
        "seen: {:#?}\nprometheus log:\n{}\nengine log tail:\n{}",
        lock(&seen),
        prometheus.log(),
        w.every.log_tail(40),
    ) + &format!("\ndispatch engine log tail:\n{}", w.dispatch.log_tail(40));
    assert!(empty.is_empty(), "queries without data: {empty:#?}\n{report}");
    assert!(missed.is_empty(), "alerts that never went pending: {missed:?}\n{report}");
    let unexpected: Vec<_> = provoked.iter().filter(|a| UNPROVOKED.contains(&a.as_str())).collect();
    assert!(unexpected.is_empty(), "alerts said to be out of reach went pending: {unexpected:?}; update UNPROVOKED");
    assert!(still_active.is_empty(), "alerts still active after the faults: {still_active:?}\n{report}");
    assert_eq!(down_seen.len(), down.len(), "a paused engine raises {down:?}; seen {down_seen:?}\n{report}");
    assert!(after_resume.is_empty(), "alerts still active after the resume: {after_resume:?}\n{report}");
    eprintln!(
        "live Prometheus: {} recording rules and {} dashboard queries returned data; {} of {} alerts went pending \
         and resolved",
        named(RECORDING, "- record:").len(),
        queries.len(),
        lock(&seen).len(),
        alerts.len(),
    );
}
