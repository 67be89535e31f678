//! The APNs and FCM channels end to end (spec 000 section 7, PUSH-259,
//! PUSH-234): the real engine against the mock providers over HTTP/2 + TLS on
//! 127.0.0.1. One engine per channel; every row of the channel's outcome
//! table runs as its own recipient, scripted by device token, concurrently.
//!
//! For each case: the exact request the provider received (headers, body,
//! credential), the number and spacing of attempts, the final outcome (from
//! `fanout_deliveries_total`), and the recipient's fate (terminal deletes,
//! mismatch/rejected/transient keep, a re-registered recipient survives).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use fanout_proto::v1 as pb;
use fanout_testkit::{ApnsReply, FcmReply, MockFcm, MockFcmConfig, ProviderRequest, TestPki, start_mock_fcm};
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::{EngineConfig, Fanout};
use rand::RngCore;
use tonic::Code;

use crate::common::{ApnsSetup, BUNDLE_ID, apns_setup, publish, quote, sequence_id};

/// Longest any case here takes to settle (the slowest waits ~14 s).
const SETTLE: Duration = Duration::from_secs(45);

/// Collects every deviation instead of stopping at the first, so one run
/// shows every row that is wrong.
#[derive(Default)]
struct Check(Vec<String>);

impl Check {
    fn truth(&mut self, what: impl Into<String>, holds: bool) {
        if !holds {
            self.0.push(what.into());
        }
    }

    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: impl AsRef<str>, got: T, want: T) {
        if got != want {
            self.0.push(format!("{}: expected {want:?}, got {got:?}", what.as_ref()));
        }
    }

    fn finish(self, fanout: &Fanout) {
        let log = fanout.log();
        let tail = &log[log.len().saturating_sub(4000)..];
        assert!(
            self.0.is_empty(),
            "{} deviation(s):\n  {}\nengine log (tail):\n{tail}",
            self.0.len(),
            self.0.join("\n  ")
        );
    }
}

/// What the recipient looks like after the case settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Deleted,
    Kept,
}

/// One row: a recipient with its own device token, topic and script.
struct Case {
    name: &'static str,
    recipient: Recipient,
    token: String,
    topic: Vec<u8>,
    seq: u64,
    /// Provider requests the delivery makes while the test runs.
    requests: usize,
    /// `fanout_deliveries_total` outcome label, or None while a retry is pending.
    outcome: Option<&'static str>,
    fate: Fate,
    /// Least time between consecutive requests (a retry's delay).
    spacing: Option<Duration>,
}

fn device_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn case(
    name: &'static str,
    requests: usize,
    outcome: Option<&'static str>,
    fate: Fate,
    spacing: Option<Duration>,
) -> Case {
    Case {
        name,
        recipient: Recipient::random(),
        token: device_token(),
        topic: group_topic(),
        seq: 0,
        requests,
        outcome,
        fate,
        spacing,
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn since(later: &ProviderRequest, earlier: &ProviderRequest) -> Duration {
    later.received_at.duration_since(earlier.received_at).unwrap_or_default()
}

/// Registers each case's recipient on `delivery(token)` and subscribes it to its topic.
async fn register_all(fanout: &Fanout, cases: &[Case], delivery: impl Fn(&str) -> pb::register_request::Delivery) {
    let mut client = fanout.notifications().await.expect("client");
    for c in cases {
        client.register(c.recipient.register(delivery(&c.token))).await.expect("register");
        client.update_subscriptions(c.recipient.update(vec![subscription(&c.topic)], vec![])).await.expect("subscribe");
    }
}

/// Publishes one push-eligible envelope per case and stores its sequence id.
async fn publish_all(fanout: &Fanout, cases: &mut [Case]) {
    let envelopes = cases.iter().map(|c| envelope(&c.topic, pb::EnvelopeKind::Application, true)).collect();
    let results = publish(fanout, envelopes).await;
    for (c, r) in cases.iter_mut().zip(&results) {
        c.seq = sequence_id(r);
    }
}

/// The value of one series in /metrics (0 when absent).
async fn metric(fanout: &Fanout, series: &str) -> u64 {
    let (_, text) = fanout.http_get("/metrics").await.expect("/metrics");
    text.lines()
        .filter_map(|line| line.strip_prefix(series))
        .filter_map(|rest| rest.strip_prefix(' '))
        .find_map(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

async fn deliveries(fanout: &Fanout, channel: &str, outcome: &str) -> u64 {
    metric(fanout, &format!("fanout_deliveries_total{{channel=\"{channel}\",outcome=\"{outcome}\"}}")).await
}

const OUTCOMES: [&str; 5] = ["delivered", "terminal", "mismatch", "rejected", "exhausted"];

/// Waits until `n` deliveries on `channel` finished.
async fn wait_settled(fanout: &Fanout, channel: &str, n: u64) -> u64 {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut total = 0;
        for outcome in OUTCOMES {
            total += deliveries(fanout, channel, outcome).await;
        }
        if total >= n || Instant::now() > deadline {
            return total;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the recipient still exists: an empty UpdateSubscriptions answers
/// OK or NOT_FOUND. A deletion is awaited briefly (it follows the outcome).
async fn fate_of(fanout: &Fanout, recipient: &Recipient, expect: Fate) -> Fate {
    let mut client = fanout.notifications().await.expect("client");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let fate = match client.update_subscriptions(recipient.update(vec![], vec![])).await {
            Ok(_) => Fate::Kept,
            Err(s) if s.code() == Code::NotFound => Fate::Deleted,
            Err(s) => panic!("UpdateSubscriptions: {s:?}"),
        };
        if fate == expect || Instant::now() > deadline {
            return fate;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Attempt count, spacing, final outcome and fate of every case.
async fn check_cases(
    ck: &mut Check,
    fanout: &Fanout,
    cases: &[Case],
    received: impl Fn(&str) -> Vec<ProviderRequest>,
    channel: &str,
) {
    for c in cases {
        let got = received(&c.token);
        ck.eq(format!("{}: provider requests", c.name), got.len(), c.requests);
        if let Some(min) = c.spacing {
            for pair in got.windows(2) {
                let gap = since(&pair[1], &pair[0]);
                ck.truth(format!("{}: retry after {gap:?}, expected at least {min:?}", c.name), gap >= min);
            }
        }
        let fate = fate_of(fanout, &c.recipient, c.fate).await;
        ck.eq(format!("{}: recipient afterwards", c.name), fate, c.fate);
    }
    for outcome in OUTCOMES {
        let want = cases.iter().filter(|c| c.outcome == Some(outcome)).count() as u64;
        ck.eq(format!("{channel} deliveries with outcome {outcome}"), deliveries(fanout, channel, outcome).await, want);
    }
}

/// PUSH-254: no device token, provider credential or topic in the log or /metrics.
async fn check_privacy(ck: &mut Check, fanout: &Fanout, cases: &[Case], credentials: &[String]) {
    let log = fanout.log();
    let (_, metrics) = fanout.http_get("/metrics").await.expect("/metrics");
    for c in cases {
        for (what, secret) in
            [("device token", c.token.clone()), ("topic", b64(&c.topic)), ("topic hex", hex::encode(&c.topic))]
        {
            ck.truth(format!("{}: {what} in the engine log", c.name), !log.contains(&secret));
            ck.truth(format!("{}: {what} in /metrics", c.name), !metrics.contains(&secret));
        }
    }
    for credential in credentials {
        ck.truth("a provider credential in the engine log", !log.contains(credential.as_str()));
    }
}

/// Every APNs request must be the Request column of section 7 for its case.
fn check_apns_request(ck: &mut Check, c: &Case, r: &ProviderRequest) {
    let what = |s: &str| format!("{}: {s}", c.name);
    ck.eq(what("method"), r.method.as_str(), "POST");
    ck.eq(what("path"), r.path.clone(), format!("/3/device/{}", c.token));
    ck.eq(what("HTTP version"), r.version.as_str(), "HTTP/2.0");
    ck.eq(what("provider token verifies (ES256, kid, iss)"), r.auth_valid, Some(true));
    ck.truth(
        what("authorization is `bearer <jwt>`"),
        r.header("authorization").is_some_and(|a| a.starts_with("bearer ")),
    );
    ck.eq(what("apns-topic"), r.header("apns-topic"), Some(BUNDLE_ID));
    ck.eq(what("apns-push-type"), r.header("apns-push-type"), Some("background"));
    ck.eq(what("apns-priority"), r.header("apns-priority"), Some("5"));
    ck.eq(what("apns-collapse-id"), r.header("apns-collapse-id").map(str::to_owned), Some(b64(&c.topic)));
    check_a_day(ck, &what("apns-expiration"), r, r.header("apns-expiration"));
    let body = format!(r#"{{"aps":{{"content-available":1}},"topic":"{}","sequence_id":"{}"}}"#, b64(&c.topic), c.seq);
    ck.eq(what("body"), String::from_utf8_lossy(&r.body).into_owned(), body);
}

#[tokio::test]
async fn apns_outcome_table_end_to_end() {
    let ApnsSetup { fanout, mock, _dir } = apns_setup("").await;
    let one = Duration::from_secs(1);
    let (kept, deleted) = (Fate::Kept, Fate::Deleted);
    let mut cases = vec![
        (case("200 delivered", 1, Some("delivered"), kept, None), vec![]),
        (case("410 Unregistered", 1, Some("terminal"), deleted, None), vec![ApnsReply::reason(410, "Unregistered")]),
        (case("410 ExpiredToken", 1, Some("terminal"), deleted, None), vec![ApnsReply::reason(410, "ExpiredToken")]),
        (case("410 without reason", 1, Some("rejected"), kept, None), vec![ApnsReply::status(410)]),
        (case("400 BadDeviceToken", 1, Some("mismatch"), kept, None), vec![ApnsReply::reason(400, "BadDeviceToken")]),
        (
            case("400 DeviceTokenNotForTopic", 1, Some("mismatch"), kept, None),
            vec![ApnsReply::reason(400, "DeviceTokenNotForTopic")],
        ),
        (case("400 BadCollapseId", 1, Some("rejected"), kept, None), vec![ApnsReply::reason(400, "BadCollapseId")]),
        (case("429 then 200", 2, Some("delivered"), kept, Some(one)), vec![ApnsReply::reason(429, "TooManyRequests")]),
        (
            case("500 then 200", 2, Some("delivered"), kept, Some(one)),
            vec![ApnsReply::reason(500, "InternalServerError")],
        ),
        (
            case("503 then 200", 2, Some("delivered"), kept, Some(one)),
            vec![ApnsReply::reason(503, "ServiceUnavailable")],
        ),
        (
            case("503 always", 3, Some("exhausted"), kept, Some(one)),
            vec![ApnsReply::reason(503, "ServiceUnavailable"); 4],
        ),
        // The engine gives up after 10 s; the retry comes 1 s after that.
        (
            case("timeout then 200", 2, Some("delivered"), kept, Some(Duration::from_millis(10_500))),
            vec![ApnsReply::ok().with_delay(Duration::from_secs(12))],
        ),
        (
            case("403 ExpiredProviderToken once", 2, Some("delivered"), kept, None),
            vec![ApnsReply::reason(403, "ExpiredProviderToken")],
        ),
        (
            case("403 ExpiredProviderToken twice", 2, Some("rejected"), kept, None),
            vec![ApnsReply::reason(403, "ExpiredProviderToken"); 3],
        ),
        (
            case("403 InvalidProviderToken", 1, Some("rejected"), kept, None),
            vec![ApnsReply::reason(403, "InvalidProviderToken")],
        ),
        // PUSH-234: the answer arrives after the recipient re-registered.
        (
            case("410 after re-registration", 1, Some("terminal"), kept, None),
            vec![ApnsReply::reason(410, "Unregistered").with_delay(Duration::from_secs(2))],
        ),
    ];
    for (c, script) in &cases {
        mock.script(&c.token, script.clone());
    }
    let mut cases: Vec<Case> = cases.drain(..).map(|(c, _)| c).collect();
    let apns = |token: &str| pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: token.into() });
    register_all(&fanout, &cases, apns).await;
    publish_all(&fanout, &mut cases).await;

    // Re-register the race case with a new token while its answer is pending.
    let race = cases.iter().find(|c| c.name == "410 after re-registration").unwrap();
    let pending = mock.wait_for_token(&race.token, 1, Duration::from_secs(15)).await;
    assert_eq!(pending.len(), 1, "the race case's request arrived; log:\n{}", fanout.log());
    let mut client = fanout.notifications().await.unwrap();
    client.register(race.recipient.register(apns(&device_token()))).await.expect("re-register");

    let settled = wait_settled(&fanout, "apns", cases.len() as u64).await;
    // Let a wrong extra retry show up before counting requests.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut ck = Check::default();
    ck.eq("apns deliveries settled", settled, cases.len() as u64);
    for c in &cases {
        for r in mock.received_for(&c.token) {
            check_apns_request(&mut ck, c, &r);
        }
    }
    check_cases(&mut ck, &fanout, &cases, |t| mock.received_for(t), "apns").await;
    ck.eq(
        "recipients deleted as terminal",
        metric(&fanout, "fanout_recipients_deleted_total{reason=\"terminal\"}").await,
        2,
    );

    // ExpiredProviderToken: refresh and resend within the attempt, with a new token.
    for name in ["403 ExpiredProviderToken once", "403 ExpiredProviderToken twice"] {
        let c = cases.iter().find(|c| c.name == name).unwrap();
        let got = mock.received_for(&c.token);
        if got.len() == 2 {
            ck.truth(format!("{name}: the resend carries a new provider token"), got[0].bearer() != got[1].bearer());
            ck.truth(format!("{name}: resent within the attempt"), since(&got[1], &got[0]) < one);
        }
    }

    // Every provider token APNs saw so far expires: the next push refreshes
    // once and resends; the one after it uses the refreshed token directly.
    let refreshes = "fanout_provider_token_refreshes_total{channel=\"apns\"}";
    let before = metric(&fanout, refreshes).await;
    mock.expire_provider_tokens();
    let mut later = vec![
        case("after expiry", 2, Some("delivered"), kept, None),
        case("after refresh", 1, Some("delivered"), kept, None),
    ];
    register_all(&fanout, &later, apns).await;
    publish_all(&fanout, &mut later[..1]).await;
    let first = mock.wait_for_token(&later[0].token, 2, Duration::from_secs(15)).await;
    publish_all(&fanout, &mut later[1..]).await;
    let second = mock.wait_for_token(&later[1].token, 1, Duration::from_secs(15)).await;
    ck.eq("after expiry: requests", first.len(), 2);
    ck.eq("after refresh: requests", second.len(), 1);
    if first.len() == 2 && second.len() == 1 {
        ck.eq("after expiry: first answer", first[0].status_sent, 403);
        ck.truth("after expiry: resent with a new token", first[0].bearer() != first[1].bearer());
        ck.eq("after refresh: the refreshed token is reused", second[0].bearer(), first[1].bearer());
        ck.eq("after refresh: delivered", second[0].status_sent, 200);
    }
    ck.eq("one forced refresh", metric(&fanout, refreshes).await, before + 1);

    let credentials: Vec<String> = mock.received().iter().filter_map(|r| r.bearer().map(str::to_owned)).collect();
    cases.extend(later);
    check_privacy(&mut ck, &fanout, &cases, &credentials).await;
    ck.finish(&fanout);
}

struct FcmSetup {
    fanout: Fanout,
    mock: MockFcm,
    _dir: tempfile::TempDir,
}

async fn fcm_setup() -> FcmSetup {
    let pki = TestPki::generate(&[]).expect("pki");
    let mock = start_mock_fcm(&pki, MockFcmConfig::default()).await.expect("mock FCM");
    let dir = tempfile::tempdir().expect("tempdir");
    let account: PathBuf = dir.path().join("service-account.json");
    mock.service_account().write(&account).expect("write service account");
    let ca: PathBuf = dir.path().join("ca.pem");
    pki.write_ca(&ca).expect("write ca");
    let table = format!(
        "[engine.channels.fcm]\nservice_account_file = {}\nbase_url = \"{}\"\nextra_ca_files = [{}]\n\n",
        quote(&account),
        mock.base_url(),
        quote(&ca),
    );
    let config = EngineConfig { engine_extra: "max_attempts = 3".into(), extra_tables: table, ..Default::default() };
    let fanout = Fanout::start(config).await.expect("start fanout");
    FcmSetup { fanout, mock, _dir: dir }
}

/// `apns-expiration` is explicit, a day (the default) after the
/// request left, in Unix seconds.
fn check_a_day(ck: &mut Check, what: &str, r: &ProviderRequest, expiration: Option<&str>) {
    let sent = r.received_at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let expiration = expiration.and_then(|e| e.parse::<u64>().ok()).unwrap_or_default();
    ck.truth(
        format!("{what} {expiration} is a day after {sent}"),
        (sent + 86_398..=sent + 86_400).contains(&expiration),
    );
}

/// Every FCM request must be the Request column of section 7 for its case.
fn check_fcm_request(ck: &mut Check, c: &Case, r: &ProviderRequest, project: &str) {
    let what = |s: &str| format!("{}: {s}", c.name);
    ck.eq(what("method"), r.method.as_str(), "POST");
    ck.eq(what("path"), r.path.clone(), format!("/v1/projects/{project}/messages:send"));
    ck.eq(what("HTTP version"), r.version.as_str(), "HTTP/2.0");
    ck.eq(what("bearer is an access token the token endpoint issued"), r.auth_valid, Some(true));
    ck.truth(
        what("authorization is `Bearer <token>`"),
        r.header("authorization").is_some_and(|a| a.starts_with("Bearer ")),
    );
    // Kept for ttl_seconds (default a day) on both platforms.
    let mut json = r.json().unwrap_or_default();
    let expiration = json["message"]["apns"]["headers"].as_object_mut().and_then(|h| h.remove("apns-expiration"));
    check_a_day(ck, &what("apns-expiration"), r, expiration.as_ref().and_then(|e| e.as_str()));
    let expected = serde_json::json!({"message": {
        "token": c.token,
        "data": {"topic": b64(&c.topic), "sequence_id": c.seq.to_string()},
        "android": {"priority": "HIGH", "ttl": "86400s"},
        "apns": {"headers": {"apns-priority": "5", "apns-push-type": "background"},
                 "payload": {"aps": {"content-available": 1}}},
    }});
    ck.eq(what("body"), json, expected);
    let body = String::from_utf8_lossy(&r.body).to_lowercase();
    ck.truth(
        what("no collapse key"),
        !body.contains("collapse") && r.headers.iter().all(|(n, _)| !n.contains("collapse")),
    );
}

#[tokio::test]
async fn fcm_outcome_table_end_to_end() {
    let FcmSetup { fanout, mock, _dir } = fcm_setup().await;
    let ten = Duration::from_secs(10);
    let kept = Fate::Kept;
    let project = mock.project_id().to_owned();
    let fcm = |token: &str| pb::register_request::Delivery::Fcm(pb::FcmDelivery { token: token.into() });
    let mut ck = Check::default();

    // A failed token fetch sends nothing, so it is not an attempt (spec 000 "Terms"):
    // tried again after 10 s, counted in fanout_unsent_total.
    mock.script_token_endpoint(vec![500]);
    let mut first = vec![case("token fetch fails then 200", 1, Some("delivered"), kept, None)];
    register_all(&fanout, &first, fcm).await;
    publish_all(&fanout, &mut first).await;
    let failed = mock.wait_for_token_requests(1, Duration::from_secs(15)).await;
    ck.eq("token fetch fails: token requests", failed.len(), 1);
    let failures = "fanout_provider_token_failures_total{channel=\"fcm\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(&fanout, failures).await < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ck.eq("token failures counted", metric(&fanout, failures).await, 1);
    let failed_at = failed.first().map_or_else(SystemTime::now, |r| r.received_at);

    let q = |status| FcmReply::error(status, "RESOURCE_EXHAUSTED");
    let mut cases = vec![
        (case("200 delivered", 1, Some("delivered"), kept, None), vec![]),
        // The 60-second rows: only the first attempt happens within the test.
        (case("429", 1, None, kept, None), vec![q(429)]),
        (case("QuotaFailure detail", 1, None, kept, None), vec![q(403).with_quota_failure()]),
        (
            case("FcmError QUOTA_EXCEEDED", 1, None, kept, None),
            vec![FcmReply::fcm_error(403, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED")],
        ),
        (case("Retry-After above 300", 1, None, kept, None), vec![q(429).with_retry_after("100000")]),
        (case("500 then 200", 2, Some("delivered"), kept, Some(ten)), vec![FcmReply::error(500, "INTERNAL")]),
        (case("503 then 200", 2, Some("delivered"), kept, Some(ten)), vec![FcmReply::error(503, "UNAVAILABLE")]),
        (
            case("503 with Retry-After 13 then 200", 2, Some("delivered"), kept, Some(Duration::from_secs(13))),
            vec![FcmReply::error(503, "UNAVAILABLE").with_retry_after("13")],
        ),
        (
            case("FcmError UNREGISTERED", 1, Some("terminal"), Fate::Deleted, None),
            vec![FcmReply::fcm_error(404, "NOT_FOUND", "UNREGISTERED")],
        ),
        (
            case("FcmError SENDER_ID_MISMATCH", 1, Some("mismatch"), kept, None),
            vec![FcmReply::fcm_error(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH")],
        ),
        (
            case("FcmError UNAVAILABLE then 200", 2, Some("delivered"), kept, Some(ten)),
            vec![FcmReply::fcm_error(502, "UNAVAILABLE", "UNAVAILABLE")],
        ),
        (
            case("FcmError INTERNAL then 200", 2, Some("delivered"), kept, Some(ten)),
            vec![FcmReply::fcm_error(400, "INTERNAL", "INTERNAL")],
        ),
        (
            case("FcmError INVALID_ARGUMENT", 1, Some("rejected"), kept, None),
            vec![FcmReply::fcm_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT")],
        ),
        (case("error without FcmError", 1, Some("rejected"), kept, None), vec![FcmReply::error(404, "NOT_FOUND")]),
    ];
    for (c, script) in &cases {
        mock.script(&c.token, script.clone());
    }
    let mut cases: Vec<Case> = cases.drain(..).map(|(c, _)| c).collect();
    register_all(&fanout, &cases, fcm).await;
    publish_all(&fanout, &mut cases).await;
    cases.extend(first);

    let pending = cases.iter().filter(|c| c.outcome.is_none()).count() as u64;
    let finished = cases.len() as u64 - pending;
    let settled = wait_settled(&fanout, "fcm", finished).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ck.eq("fcm deliveries settled", settled, finished);
    ck.eq("deliveries waiting for a retry (the 60 s rows)", metric(&fanout, "fanout_retry_queue_depth").await, pending);
    for c in &cases {
        for r in mock.received_for(&c.token) {
            check_fcm_request(&mut ck, c, &r, &project);
        }
    }
    check_cases(&mut ck, &fanout, &cases, |t| mock.received_for(t), "fcm").await;
    let transient = metric(&fanout, "fanout_attempts_total{channel=\"fcm\",outcome=\"transient\"}").await;
    let want_transient = cases.iter().filter(|c| c.outcome.is_none() || c.spacing.is_some()).count() as u64;
    ck.eq("transient fcm attempts (the failed token fetch is none)", transient, want_transient);
    let unsent = metric(&fanout, "fanout_unsent_total{channel=\"fcm\"}").await;
    ck.eq("fcm sends that never reached FCM (the failed token fetch)", unsent, 1);

    // The token-failure case was retried ≥ 10 s after the failed fetch.
    let token_case = cases.iter().find(|c| c.name == "token fetch fails then 200").unwrap();
    if let Some(sent) = mock.received_for(&token_case.token).first() {
        let gap = sent.received_at.duration_since(failed_at).unwrap_or_default();
        ck.truth(format!("token failure retried after {gap:?}, expected at least 10 s"), gap >= ten);
    }

    // One OAuth token served every send: single flight, cached.
    let token_requests = mock.token_requests();
    ck.eq("token requests (one failed, one issued)", token_requests.len(), 2);
    ck.truth(
        "every assertion verifies (RS256, iss, aud, scope)",
        token_requests.iter().all(|r| r.auth_valid == Some(true)),
    );
    ck.eq(
        "token refreshes counted",
        metric(&fanout, "fanout_provider_token_refreshes_total{channel=\"fcm\"}").await,
        1,
    );

    let mut credentials: Vec<String> = mock.received().iter().filter_map(|r| r.bearer().map(str::to_owned)).collect();
    credentials.extend(token_requests.iter().map(|r| String::from_utf8_lossy(&r.body).into_owned()));
    check_privacy(&mut ck, &fanout, &cases, &credentials).await;
    ck.finish(&fanout);
}

/// Misconfiguration fails at start, naming the key and never the key material.
#[tokio::test]
async fn provider_misconfiguration_fails_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("bad.p8");
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nTUlTQ09ORklHVVJFRA==\n-----END PRIVATE KEY-----\n").unwrap();
    let table = format!(
        "[engine.channels.apns]\nkey_file = {}\nkey_id = \"K\"\nteam_id = \"T\"\nbundle_id = \"b\"\nenvironment = \"sandbox\"\n",
        quote(&key)
    );
    let err =
        Fanout::start(EngineConfig { extra_tables: table, ..Default::default() }).await.err().expect("must not start");
    let text = format!("{err:#}");
    assert!(text.contains("channels.apns.key_file"), "{text}");
    assert!(!text.contains("TUlTQ09ORklHVVJFRA"), "{text}");

    let missing = dir.path().join("missing.json");
    let table = format!("[engine.channels.fcm]\nservice_account_file = {}\n", quote(&missing));
    let err =
        Fanout::start(EngineConfig { extra_tables: table, ..Default::default() }).await.err().expect("must not start");
    assert!(format!("{err:#}").contains("channels.fcm.service_account_file"), "{err:#}");
}
