//! Operability: the dashboard and the Prometheus rules name only
//! metrics the engine's own `/metrics` exports; labels stay bounded and free of
//! ids, tokens, URLs and topics (PUSH-254); `/healthz`, `/readyz` and unknown
//! paths answer as docs/OPERATIONS.md says.
//!
//! A labelled family shows only the series its configuration fixes until
//! traffic creates others, so the first test scrapes the idle engine (and
//! checks those), then drives traffic over every channel (a webhook that answers, one that answers
//! 410 until the recipient is deleted, APNs and FCM channels whose hosts do not
//! listen, so their provider token is signed and their OAuth token fetch fails)
//! and then requires every referenced family, and requires the counters the
//! traffic must move to have moved. Another compares docs/METRICS.md's label
//! values with what an idle engine with every component configured exports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fanout_proto::v1 as pb;
use fanout_testkit::ScriptedResponse;
use fanout_testkit::launcher::free_port;
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};

use crate::common::*;

const DASHBOARD: &str = include_str!("../../../dashboards/fanout.json");
const ALERTS: &str = include_str!("../../../dashboards/rules/fanout-alerts.yml");
const RECORDING: &str = include_str!("../../../dashboards/rules/fanout-recording.yml");
const OPERATIONS: &str = include_str!("../../../docs/OPERATIONS.md");
const METRICS_DOC: &str = include_str!("../../../docs/METRICS.md");

/// TEST-ONLY APNs provider key (EC P-256, PKCS#8), generated for this test.
/// It protects nothing and is never sent anywhere but a closed local port.
const TEST_ONLY_APNS_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg3RSlB9iXyDY6EjhR
6d4pbV98WXBMVHtEoJpw08LaJvGhRANCAASbbtPVwja8QoxQNz7Cv9/HMfIhsoTz
6pPtfGXBkCEGvsHBjAca144JEaby1w97TxxjGOBZPbitZM/jyZSWtGX/
-----END PRIVATE KEY-----
";

/// The only label names the engine may use (docs/METRICS.md).
const LABELS: &[&str] = &[
    "channel",
    "outcome",
    "result",
    "method",
    "code",
    "reason",
    "operation",
    "limit",
    "le",
    "event",
    "route",
    "listener",
    "scope",
    "certificate",
];

/// How long the traffic may take to touch every family: three webhook
/// attempts 1 s apart, and provider attempts bounded to 10 s each.
const TRAFFIC_WAIT: Duration = Duration::from_secs(45);

/// The metric families in an exposition: name → type (from `# TYPE`), each
/// also required to have a `# HELP` line.
fn families(scrape: &str) -> BTreeMap<String, String> {
    let mut types = BTreeMap::new();
    let mut helps = BTreeSet::new();
    for line in scrape.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(name), Some(kind)) => {
                types.insert(name.to_owned(), kind.to_owned());
            }
            (Some("#"), Some("HELP"), Some(name), _) => {
                helps.insert(name.to_owned());
            }
            _ => {}
        }
    }
    for name in types.keys() {
        assert!(helps.contains(name), "{name} has a # TYPE but no # HELP line");
    }
    types
}

/// The sum of every sample of `series` (a family name, or a histogram's
/// `_count`) whose labels include all of `labels`.
fn sample_sum(scrape: &str, series: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name_labels, value) = l.rsplit_once(' ')?;
            let (name, rest) = match name_labels.split_once('{') {
                Some((n, r)) => (n, r),
                None => (name_labels, ""),
            };
            (name == series && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))).then_some(())?;
            value.parse::<f64>().ok()
        })
        .sum()
}

/// Maximal runs of PromQL identifier characters that mention a fanout metric.
/// A run with a `:` is a recording-rule name (`level:metric:operations`); any
/// other run must be a metric name. Tokenising whole identifiers, rather than
/// grepping `fanout_[a-z0-9_]+`, keeps `job:fanout_windows:rate5m` from being
/// read as a metric called `fanout_windows`.
fn referenced(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .map(|t| t.trim_end_matches(':'))
        .filter(|t| t.contains("fanout_"))
        .map(str::to_owned)
        .collect()
}

/// Every string in a JSON document (expressions, variable queries, texts).
fn json_strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|v| json_strings(v, out)),
        serde_json::Value::Object(o) => o.iter().for_each(|(k, v)| {
            out.push(k.clone());
            json_strings(v, out);
        }),
        _ => {}
    }
}

/// `record:` names of the recording rules.
fn recorded_names() -> BTreeSet<String> {
    RECORDING
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record:").or_else(|| l.trim().strip_prefix("record:")))
        .map(|n| n.trim().to_owned())
        .collect()
}

/// `alert:` names of the alerting rules.
fn alert_names() -> Vec<String> {
    ALERTS.lines().filter_map(|l| l.trim().strip_prefix("- alert:")).map(|n| n.trim().to_owned()).collect()
}

/// (source, metric family) for every metric the dashboard and the rules name,
/// with `_bucket`/`_sum`/`_count` folded into their histogram. Panics on a
/// recording-rule name that no rule records, or an unexpected identifier.
fn referenced_families(exported: &BTreeMap<String, String>) -> BTreeSet<(String, String)> {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboards/fanout.json is JSON");
    let mut strings = Vec::new();
    json_strings(&dashboard, &mut strings);
    let recorded = recorded_names();
    let mut out = BTreeSet::new();
    for (source, text) in [
        ("dashboards/fanout.json", strings.join("\n")),
        ("dashboards/rules/fanout-alerts.yml", ALERTS.to_owned()),
        ("dashboards/rules/fanout-recording.yml", RECORDING.to_owned()),
    ] {
        for id in referenced(&text) {
            if id.contains(':') {
                assert!(recorded.contains(&id), "{source} uses {id}, which no recording rule records");
                continue;
            }
            assert!(id.starts_with("fanout_"), "{source}: unexpected identifier {id}");
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = id.strip_suffix(suffix)?;
                    (exported.get(base).map(String::as_str) == Some("histogram")).then(|| base.to_owned())
                })
                .unwrap_or(id);
            out.insert((source.to_owned(), family));
        }
    }
    out
}

/// GET with the response headers (the shared helper returns status and body).
async fn get(addr: SocketAddr, path: &str) -> (u16, BTreeMap<String, String>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buf)).await.expect("answer").expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// The APNs and FCM channel tables: real credentials (test-only), hosts on
/// local ports where nothing listens.
fn provider_tables(dir: &std::path::Path) -> String {
    let apns_key = dir.join("apns-test-only.p8");
    std::fs::write(&apns_key, TEST_ONLY_APNS_KEY).expect("write apns key");
    let fcm_key = fanout_testkit::mock::fcm::TEST_ONLY_RSA_PRIVATE_KEY_PEM;
    let account = serde_json::json!({
        "type": "service_account",
        "project_id": "fanout-operability-test",
        "private_key_id": "test-only",
        "private_key": fcm_key,
        "client_email": "fanout-test@fanout-operability-test.iam.gserviceaccount.com",
        "token_uri": format!("https://127.0.0.1:{}/token", free_port()),
    });
    let account_file = dir.join("fcm-test-only.json");
    std::fs::write(&account_file, account.to_string()).expect("write service account");
    // The relay ingress too, so its families are exported (spec 003 push-server side).
    let hub_secret = dir.join("hub.secret");
    std::fs::write(&hub_secret, "operability-hub-secret-0123456789").expect("write hub secret");
    // And the spec 002 gateway, whose families are created with it.
    let salt = dir.join("push-salt.hex");
    std::fs::write(&salt, "22".repeat(32)).expect("write salt");
    format!(
        "[engine.channels.apns]\nkey_file = {:?}\nkey_id = \"TESTKEY001\"\nteam_id = \"TESTTEAM01\"\n\
         bundle_id = \"com.example.fanout\"\nenvironment = \"sandbox\"\nsandbox_url = \"https://127.0.0.1:{}\"\n\n\
         [engine.channels.fcm]\nservice_account_file = {:?}\nbase_url = \"https://127.0.0.1:{}\"\n\n\
         [engine.channels.relay]\n\n[engine.relay_ingress]\nhubs = {{ operability = {:?} }}\n\n\
         [engine.gateway]\nservice_id = \"did:web:push.operability.test\"\nsalt_epoch = \"e1\"\n\
         salt_secrets = {{ e1 = {:?} }}\n\n",
        apns_key.display().to_string(),
        free_port(),
        account_file.display().to_string(),
        free_port(),
        hub_secret.display().to_string(),
        salt.display().to_string(),
    )
}

#[tokio::test]
async fn dashboards_and_rules_name_only_exported_metrics() {
    let keys = tempfile::tempdir().expect("tempdir");
    let config = EngineConfig { extra_tables: provider_tables(keys.path()), ..EngineConfig::default() };
    let setup = webhook_setup(config).await;
    let fanout = &setup.fanout;

    // HTTP endpoints.
    let (status, _, body) = get(fanout.http, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"), "/healthz");
    let (status, _, _) = get(fanout.http, "/readyz").await;
    assert_eq!(status, 200, "/readyz with the store reachable");
    let (status, headers, body) = get(fanout.http, "/no-such-endpoint").await;
    assert_eq!(status, 404);
    assert_eq!(headers.get("content-type").map(String::as_str), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_str(&body).expect("problem body is JSON");
    assert_eq!(problem["status"], 404, "{body}");
    assert!(problem["title"].is_string(), "{body}");
    let (status, headers, _) = get(fanout.http, "/metrics").await;
    assert_eq!(status, 200);
    assert!(headers.get("content-type").is_some_and(|t| t.starts_with("text/plain")), "{headers:?}");

    // The idle engine: only unlabelled families, each with HELP and TYPE.
    let (_, idle) = fanout.http_get("/metrics").await.expect("metrics");
    let idle_families = families(&idle);

    // The HTTP API (spec 003 registration) on the relay channel.
    let relay = Recipient::random();
    let bearer = relay.bearer();
    let (status, _) = fanout
        .api_request(
            "PUT",
            "/v2/push/registration",
            &[("authorization", &bearer)],
            br#"{"provider":"log","token":"t"}"#,
        )
        .await
        .expect("API request");
    assert_eq!(status, 204);

    // Traffic over every channel.
    let topic = group_topic();
    let ok = Recipient::random();
    let gone = Recipient::random();
    register_webhook(&setup, &ok, "/ok", &[3u8; 32], vec![subscription(&topic)]).await;
    setup.receiver.script("/gone", vec![ScriptedResponse::status(410); 3]);
    register_webhook(&setup, &gone, "/gone", &[4u8; 32], vec![subscription(&topic)]).await;
    let mut client = fanout.notifications().await.expect("client");
    let apns_token = "a1b2c3d4".repeat(8);
    let fcm_token = "operability-test-fcm-registration-token";
    // The FCM token endpoint is unreachable, so FCM sends are never attempts
    // and their window never completes: FCM gets its own topic,
    // published to once the first window is done.
    let fcm_topic = group_topic();
    for (recipient, delivery, topic) in [
        (
            Recipient::random(),
            pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: apns_token.clone() }),
            &topic,
        ),
        (
            Recipient::random(),
            pb::register_request::Delivery::Fcm(pb::FcmDelivery { token: fcm_token.into() }),
            &fcm_topic,
        ),
    ] {
        client.register(recipient.register(delivery)).await.expect("register a provider recipient");
        client.update_subscriptions(recipient.update(vec![subscription(topic)], vec![])).await.expect("subscribe");
    }
    // PUSH-256 at registration: a non-https URL is refused (INVALID_ARGUMENT).
    let refused = client
        .register(Recipient::random().register_http("http://receiver.fanout.test/hook", &[5u8; 32]))
        .await
        .expect_err("http:// is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    // One stored envelope and one rejected (an empty topic fails TOPIC-001).
    let results = publish(
        fanout,
        vec![envelope(&topic, pb::EnvelopeKind::Application, true), envelope(&[], pb::EnvelopeKind::Application, true)],
    )
    .await;
    sequence_id(&results[0]);
    let deadline = Instant::now() + TRAFFIC_WAIT;
    while Instant::now() < deadline {
        let (_, scrape) = fanout.http_get("/metrics").await.expect("metrics");
        if sample_sum(&scrape, "fanout_windows_total", &[]) >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sequence_id(&publish(fanout, vec![envelope(&fcm_topic, pb::EnvelopeKind::Application, true)]).await[0]);

    // What the traffic must move, as (series, labels).
    let moved: &[(&str, &[(&str, &str)])] = &[
        ("fanout_envelopes_published_total", &[("result", "stored")]),
        ("fanout_envelopes_published_total", &[("result", "rejected")]),
        ("fanout_rpc_requests_total", &[("method", "Register"), ("code", "OK")]),
        ("fanout_rpc_requests_total", &[("method", "Register"), ("code", "INVALID_ARGUMENT")]),
        ("fanout_rpc_requests_total", &[("method", "UpdateSubscriptions"), ("code", "OK")]),
        ("fanout_webhook_refused_register_total", &[]),
        ("fanout_attempts_total", &[("channel", "http"), ("outcome", "delivered")]),
        ("fanout_attempts_total", &[("channel", "http"), ("outcome", "transient")]),
        ("fanout_attempts_total", &[("channel", "apns"), ("outcome", "transient")]),
        ("fanout_unsent_total", &[("channel", "fcm")]),
        ("fanout_deliveries_total", &[("channel", "http"), ("outcome", "delivered")]),
        ("fanout_deliveries_total", &[("channel", "http"), ("outcome", "terminal")]),
        ("fanout_retries_total", &[("channel", "http")]),
        ("fanout_recipients_deleted_total", &[("reason", "terminal")]),
        ("fanout_publish_to_attempt_seconds_count", &[("channel", "http")]),
        ("fanout_provider_latency_seconds_count", &[("channel", "http")]),
        ("fanout_provider_token_refreshes_total", &[("channel", "apns")]),
        ("fanout_provider_token_failures_total", &[("channel", "fcm")]),
        ("fanout_windows_total", &[]),
        ("fanout_window_duration_seconds_count", &[]),
    ];
    let deadline = Instant::now() + TRAFFIC_WAIT;
    let scrape = loop {
        let (_, scrape) = fanout.http_get("/metrics").await.expect("metrics");
        let missing: Vec<_> = moved.iter().filter(|(s, l)| sample_sum(&scrape, s, l) < 1.0).collect();
        if missing.is_empty() {
            break scrape;
        }
        assert!(
            Instant::now() < deadline,
            "traffic did not move {missing:?}; scrape:\n{scrape}\nlog:\n{}",
            fanout.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let exported = families(&scrape);
    assert!(idle_families.keys().all(|f| exported.contains_key(f)), "a family disappeared");

    // Every metric the dashboard and the rules name is exported.
    let refs = referenced_families(&exported);
    let missing: Vec<_> = refs.iter().filter(|(_, family)| !exported.contains_key(family)).collect();
    assert!(missing.is_empty(), "named but not exported: {missing:?}\nexported: {:?}", exported.keys());
    // And the idle engine shows only what needs no traffic: report the rest.
    let after_traffic: BTreeSet<_> =
        refs.iter().map(|(_, f)| f.clone()).filter(|f| !idle_families.contains_key(f)).collect();
    eprintln!("families exported only once traffic created a labelled child: {after_traffic:?}");

    // The dashboard and rules leave no exported family unwatched, and the
    // catalogue documents every one of them.
    let watched: BTreeSet<_> = refs.iter().map(|(_, f)| f.as_str()).collect();
    for family in exported.keys() {
        assert!(watched.contains(family.as_str()), "{family} is exported but on no dashboard panel or rule");
        assert!(METRICS_DOC.contains(&format!("`{family}`")), "{family} is missing from docs/METRICS.md");
    }

    // PUSH-254 / OPS-014: bounded label names, short symbolic values, and no
    // id, token, URL or topic anywhere in the exposition.
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let Some((_, labels)) = line.split_once('{') else { continue };
        let labels = labels.rsplit_once('}').expect("closing brace").0;
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').expect("name=value");
            let value = value.trim_matches('"');
            assert!(LABELS.contains(&name), "label {name} is not in the catalogue: {line}");
            let symbolic = value.len() <= 32 && value.chars().all(|c| c.is_ascii_alphabetic() || c == '_');
            let bound = name == "le" && (value == "+Inf" || value.parse::<f64>().is_ok());
            assert!(symbolic || bound, "label value {value:?} is not a bounded symbol: {line}");
        }
    }
    let b64 = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b);
    for private in [
        ok.id_hex(),
        gone.id_hex(),
        hex::encode(&topic),
        b64(&topic),
        apns_token,
        fcm_token.to_owned(),
        setup.receiver.url("/ok"),
        "receiver.fanout.test".to_owned(),
    ] {
        assert!(!scrape.contains(&private), "the exposition contains a private value");
    }
}

#[test]
fn every_alert_has_a_runbook_and_the_rules_are_well_formed() {
    let alerts = alert_names();
    for required in [
        "FanoutDispatchLagGrowing",
        "FanoutDispatchStalled",
        "FanoutWindowReplays",
        "FanoutShardRestarts",
        "FanoutStoreErrors",
        "FanoutHighTransientRatio",
        "FanoutHighRejectedRatio",
        "FanoutNoDeliveriesWhilePublishing",
        "FanoutWebhookRefusalsAtRegistration",
        "FanoutWebhookRefusalsAtSend",
    ] {
        assert!(alerts.iter().any(|a| a == required), "no alert {required}");
    }
    for alert in &alerts {
        assert!(
            OPERATIONS.contains(&format!("### {alert}\n")),
            "docs/OPERATIONS.md has no runbook heading for {alert}"
        );
        let anchor = format!("docs/OPERATIONS.md#{}", alert.to_ascii_lowercase());
        assert!(ALERTS.contains(&anchor), "{alert} has no runbook_url {anchor}");
    }
    // Full validation is promtool's (CI); here only the shape every file needs.
    for (name, text) in [("alerts", ALERTS), ("recording", RECORDING)] {
        assert!(text.lines().any(|l| l == "groups:"), "{name}: no top-level groups");
        assert!(!text.contains('\t'), "{name}: YAML forbids tabs in indentation");
    }
    let rules = ALERTS.matches("- alert:").count() + RECORDING.matches("- record:").count();
    assert_eq!(
        rules,
        ALERTS.matches("    expr:").count() + RECORDING.matches("    expr:").count(),
        "one expr per rule"
    );

    // The dashboard: one data-source variable, used by every panel and query.
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion");
    let vars = d["templating"]["list"].as_array().expect("templating");
    assert!(
        vars.iter().any(|v| v["name"] == "DS_PROMETHEUS" && v["type"] == "datasource" && v["query"] == "prometheus")
    );
    let panels = d["panels"].as_array().expect("panels");
    let rows: Vec<_> = panels.iter().filter(|p| p["type"] == "row").filter_map(|p| p["title"].as_str()).collect();
    for row in ["Overview", "Per-channel delivery", "Latency", "Dispatch lag and windows", "Saturation", "Errors"] {
        assert!(rows.contains(&row), "no row {row}: {rows:?}");
    }
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "duplicate panel id");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}");
            assert!(t["expr"].as_str().is_some_and(|e| e.contains("fanout_")), "panel {}", p["title"]);
        }
    }
}

/// The TOML block of the ConfigMap (`  fanout.toml: |`, then lines indented by 4).
fn configmap_toml(manifest: &str) -> String {
    let mut lines = manifest.lines().skip_while(|l| l.trim() != "fanout.toml: |").skip(1);
    let mut out = String::new();
    for line in lines.by_ref() {
        if !line.is_empty() && !line.starts_with("    ") {
            break;
        }
        out.push_str(line.strip_prefix("    ").unwrap_or(line));
        out.push('\n');
    }
    assert!(out.contains("[server]"), "no fanout.toml in the ConfigMap");
    out
}

#[test]
fn the_deployed_configurations_pass_check_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The base's ConfigMap (one node) and the cluster overlay's (ScyllaDB).
    let manifests = [
        ("configmap-fanout.toml", include_str!("../../../deploy/kubernetes/configmap.yaml")),
        ("configmap-cluster.toml", include_str!("../../../deploy/kubernetes-cluster/configmap.yaml")),
    ];
    let mut configs = Vec::new();
    for (name, manifest) in manifests {
        let path = dir.path().join(name);
        std::fs::write(&path, configmap_toml(manifest)).expect("write");
        configs.push(path);
    }
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    configs.extend(["fanout.toml", "compose/fanout.toml", "compose/cluster.toml"].map(|f| deploy.join(f)));
    for config in &configs {
        let mut command = std::process::Command::new(fanout_tests::engine::fanout_binary());
        command.args(["check-config", "--config"]).arg(config);
        // Only the file counts: no overrides from the test's environment.
        for (name, _) in std::env::vars().filter(|(k, _)| k.starts_with("FANOUT")) {
            command.env_remove(name);
        }
        let out = command.output().expect("run fanout check-config");
        assert!(
            out.status.success(),
            "{}: {}{}",
            config.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn identifiers_are_whole_promql_names() {
    let found = referenced(
        r#"sum by (le) (rate(fanout_a_seconds_bucket{job=~"$job"}[5m])) / job:fanout_b:rate5m
           - record: job_channel:fanout_c:ratio_rate5m"#,
    );
    let expected: BTreeSet<String> =
        ["fanout_a_seconds_bucket", "job:fanout_b:rate5m", "job_channel:fanout_c:ratio_rate5m"]
            .map(String::from)
            .into();
    assert_eq!(found, expected);
}

/// One row of docs/METRICS.md's "Labels" table: a label, the families the
/// row is limited to ("`label` on `family`"; empty: every other family with
/// the label), and its values: the backticked words outside parentheses
/// (parentheses explain, and name configuration keys).
struct LabelRow {
    label: String,
    families: Vec<String>,
    values: BTreeSet<String>,
}

/// The backticked words of `text` outside parentheses.
fn backticked_outside_parentheses(text: &str) -> Vec<String> {
    let mut depth = 0usize;
    let mut plain = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    plain.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

fn label_table() -> Vec<LabelRow> {
    let table = METRICS_DOC.split_once("| label | values |").expect("the Labels table").1;
    let rows: Vec<LabelRow> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 2, "a Labels row has two cells: {line}");
            let (label, families) = match cells[0].split_once(" on ") {
                Some((label, families)) => (label, backticked_outside_parentheses(families)),
                None => (cells[0], Vec::new()),
            };
            LabelRow {
                label: label.trim_matches('`').to_owned(),
                families,
                values: backticked_outside_parentheses(cells[1]).into_iter().collect(),
            }
        })
        .collect();
    assert!(rows.len() > 10, "the Labels table did not parse");
    rows
}

/// Every (family, label) → values of an exposition; a histogram's
/// `_bucket`, `_sum` and `_count` series count as its family.
fn exported_values(scrape: &str) -> BTreeMap<(String, String), BTreeSet<String>> {
    let types = families(scrape);
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, labels)) = line.split_once('{') else { continue };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| series.strip_suffix(suffix).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(series);
        let labels = labels.rsplit_once('}').expect("closing brace").0;
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').expect("name=value");
            out.entry((family.to_owned(), name.to_owned())).or_default().insert(value.trim_matches('"').to_owned());
        }
    }
    out
}

/// With every component configured: the webhook, APNs, FCM and Web Push
/// channels, the relay with a push server URL, the relay ingress and the
/// gateway; every provider channel with an extra CA, so each has its
/// certificate expiry series.
fn every_component(dir: &std::path::Path) -> String {
    let ca = dir.join("extra-ca.pem");
    fanout_testkit::TestPki::generate(&[]).expect("pki").write_ca(&ca).expect("write ca");
    let extra_ca = |table: &str| format!("{table}\nextra_ca_files = [{:?}]\n", ca.display().to_string());
    let relay_secret = dir.join("relay.secret");
    std::fs::write(&relay_secret, "operability-relay-secret-0123456789").expect("write relay secret");
    let vapid = dir.join("vapid-test-only.pem");
    std::fs::write(&vapid, TEST_ONLY_APNS_KEY).expect("write vapid key");
    let relay = format!(
        "[engine.channels.relay]\nurl = \"http://127.0.0.1:{}/push\"\nsecret_file = {:?}\n\
         dangerous_allow_plain_http = true\n",
        free_port(),
        relay_secret.display().to_string(),
    );
    let tables = provider_tables(dir);
    assert!(tables.contains("[engine.channels.relay]\n"), "the relay table to give a url");
    let tables = tables
        .replace("[engine.channels.relay]\n", &extra_ca(relay.trim_end()))
        .replace("[engine.channels.apns]\n", &extra_ca("[engine.channels.apns]"))
        .replace("[engine.channels.fcm]\n", &extra_ca("[engine.channels.fcm]"));
    format!(
        "{tables}{}vapid_key_file = {:?}\nsubject = \"mailto:ops@fanout.test\"\n\n",
        extra_ca("[engine.channels.webpush]"),
        vapid.display().to_string(),
    )
}

/// Catalogue values an engine with every component configured does not
/// export, and why.
const NOT_EXPORTED_HERE: &[(&str, &[&str], &str)] = &[
    (
        "operation",
        &[
            "acquire_lease",
            "release_lease",
            "lease_owner",
            "lease_owners",
            "heartbeat",
            "live_nodes",
            "forget_node",
            "lease_holders",
            "node_addresses",
        ],
        "lease operations exist only on a store with shard leases (ScyllaDB); the test engine's store is embedded",
    ),
    (
        "certificate",
        &["listener", "client_ca", "forwarding_ca", "store_ca"],
        "the test engine has no [server.tls] and an embedded store; the api's expiry unit test covers these sources",
    ),
];

#[tokio::test]
async fn the_label_catalogue_and_the_export_agree() {
    let keys = tempfile::tempdir().expect("tempdir");
    let config = EngineConfig { extra_tables: every_component(keys.path()), ..EngineConfig::default() };
    let setup = webhook_setup(config).await;
    // No traffic: what the catalogue lists must be there from start-up.
    let (_, scrape) = setup.fanout.http_get("/metrics").await.expect("metrics");
    let exported = exported_values(&scrape);
    let rows = label_table();

    let catalogued: BTreeSet<&str> = rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(catalogued, LABELS.iter().copied().collect(), "LABELS and the Labels table name other labels");

    // The row that gives `label`'s values on `family`.
    let row_for = |family: &str, label: &str| {
        rows.iter()
            .find(|r| r.label == label && r.families.iter().any(|f| f == family))
            .or_else(|| rows.iter().find(|r| r.label == label && r.families.is_empty()))
    };
    let mut unlisted = Vec::new();
    for ((family, label), values) in &exported {
        if label == "le" {
            continue; // bucket bounds, checked numerically by the traffic test
        }
        let Some(row) = row_for(family, label) else {
            unlisted.push(format!("{family}: label {label} has no row"));
            continue;
        };
        for value in values.difference(&row.values) {
            unlisted.push(format!("{family}{{{label}=\"{value}\"}}"));
        }
    }
    assert!(unlisted.is_empty(), "exported but not in the Labels table of docs/METRICS.md: {unlisted:#?}");

    let mut unexported = Vec::new();
    for row in rows.iter().filter(|r| r.label != "le") {
        // The exported values of the families this row covers.
        let covered: BTreeSet<&String> = exported
            .iter()
            .filter(|((family, label), _)| {
                *label == row.label && row_for(family, label).is_some_and(|r| std::ptr::eq(r, row))
            })
            .flat_map(|(_, values)| values)
            .collect();
        for value in &row.values {
            let excused = NOT_EXPORTED_HERE.iter().any(|(l, vs, _)| *l == row.label && vs.contains(&value.as_str()));
            if !covered.contains(value) && !excused {
                unexported.push(format!("{} on {:?}: {value}", row.label, row.families));
            }
        }
    }
    assert!(
        unexported.is_empty(),
        "in the Labels table of docs/METRICS.md but not exported at start-up: {unexported:#?}\nscrape:\n{scrape}"
    );
}
