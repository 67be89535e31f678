//! `fanout-loadtest gateway`: spec 002's push gateway under load. The real
//! `fanout` binary with `[engine.gateway]`, `[station]` and FCM pointed at
//! the mock; `devices` devices registered on the Station route, then
//! `notifies` signed notify requests (`concurrency` at once), each one new
//! wake-up for one device; the mock FCM counts what arrives. Reported:
//! notify answers per second, provider requests per second (first notify
//! sent to last provider request received), notify-to-provider latency, and,
//! with `--with-ceiling`, the ceiling: the same FCM requests (same payload
//! shape, same collapse-key length) sent by the engine's own FCM channel,
//! same pool and client stack, at the same concurrency, with no gateway,
//! store or HTTP in between. `ratio` = provider requests/s ÷ ceiling.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use fanout_engine::channel::RelayPriority;
use fanout_engine::domain::Channel;
use fanout_engine::gateway::signature::{self, SignatureParams, SignedRequest};
use fanout_testkit::launcher;
use fanout_testkit::{MockFcmConfig, TestPki, start_mock_fcm};
use http_body_util::{BodyExt as _, Full};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::platform_channels::{self, Ceiling, EngineMeter, PlatformPush, PlatformRunArgs, fcm_table, quote};
use crate::profile::ProfileSummary;
use crate::run::collector::{Percentiles, latency_histogram};
use crate::run::cql_ceiling::CqlCeiling;

const GATEWAY: &str = "did:web:push.loadtest";
const GATEWAY_URL: &str = "https://push.loadtest/_arkret/edge/push/notify";
const STATION: &str = "did:web:station.loadtest";
const KEY_ID: &str = "loadtest";
const SEED: [u8; 32] = [42; 32];
const SESSION: &str = "loadtest-session";
const NOTIFY: &str = "/_arkret/edge/push/notify";
/// Distinct `unread_increment` values: a device gets at most this many
/// distinct wake-ups per window (the same wake-up twice is §2.4's duplicate).
const MAX_PER_DEVICE: u64 = 20;

#[derive(clap::Args, Debug, Clone)]
pub struct GatewayArgs {
    /// Devices registered (each an FCM route of its own).
    #[arg(long, default_value_t = 200)]
    pub devices: u64,
    /// Notify requests sent, one device each, round robin (at most 20 per device).
    #[arg(long, default_value_t = 2000)]
    pub notifies: u64,
    /// Notify requests (and ceiling requests) in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    #[command(flatten)]
    pub run: PlatformRunArgs,
}

#[derive(Debug, Default, Serialize)]
pub struct GatewayReport {
    pub devices: u64,
    pub notifies: u64,
    pub concurrency: usize,
    /// Answers 200 with the device `accepted`.
    pub accepted: u64,
    /// Answers other than 200, by status and problem detail: a run with
    /// any fails.
    pub errors: BTreeMap<String, u64>,
    pub notify_seconds: f64,
    pub notifies_per_second: f64,
    /// Provider requests the mock received (one per accepted notify).
    pub provider_requests: u64,
    pub provider_seconds: f64,
    pub provider_requests_per_second: f64,
    /// Notify sent → provider request received.
    pub latency: Percentiles,
    /// The engine's CPU time (user + system) from the first notify to the
    /// last wake-up at the mock, per notify sent.
    pub engine_cpu_us_per_notify: Option<f64>,
    /// The harness's CPU time over the same interval, per notify: the
    /// load's signing and HTTP client and the mock FCM answering.
    pub harness_cpu_us_per_notify: Option<f64>,
    pub ceiling_requests_per_second: Option<f64>,
    /// The harness's CPU per ceiling request (the FCM channel and the mock
    /// FCM): with the rates, what the machine spends per wake-up either way.
    pub ceiling_cpu_us_per_request: Option<f64>,
    /// provider_requests_per_second ÷ ceiling.
    pub ratio: Option<f64>,
    /// `redb`, or the ScyllaDB keyspace and nodes.
    pub store: String,
    /// With --with-cql-ceiling: the CQL server's rates for a plain client.
    pub cql_ceiling: Option<CqlCeiling>,
    /// `--profile`: where the engine's CPU time went.
    pub profile: Option<ProfileSummary>,
}

fn device(n: u64) -> String {
    format!("ak:device:01964137-0000-7000-8000-{n:012x}")
}

fn config(dir: &Path, base_url: &str) -> String {
    let public_key = URL_SAFE_NO_PAD.encode(signature::public_key(&SEED));
    format!(
        "[engine]\nshard_count = 16\n\n{fcm}\n\
         [engine.gateway]\nservice_id = \"{GATEWAY}\"\nsalt_epoch = \"e1\"\nsalt_secrets = {{ e1 = {salt} }}\n\
         aggressive_threshold = 1000\n\n\
         [[engine.gateway.gateways]]\nurl = \"{GATEWAY_URL}\"\nservice_id = \"{GATEWAY}\"\n\n\
         [[engine.gateway.source_services]]\nid = \"{STATION}\"\nkeys = [{{ key_id = \"{KEY_ID}\", public_key = \"{public_key}\" }}]\n\n\
         [station]\nservice_id = \"{STATION}\"\nsession_tokens_file = {sessions}\n",
        fcm = fcm_table(dir, base_url),
        salt = quote(&dir.join("salt.hex")),
        sessions = quote(&dir.join("sessions")),
    )
}

/// Whether a notify answer has a device `accepted`.
fn is_accepted(body: &[u8]) -> bool {
    body.windows(10).any(|w| w == b"\"accepted\"")
}

/// The notify body of request `i`: device `i mod devices`, a wake-up that
/// device has not had yet in this run.
fn notify_body(target: &str, device_id: &str, round: u64) -> Vec<u8> {
    json!({"notification": {
        "push_target_id": target,
        "wakeup_kind": "message",
        "counts": {"badge": "2-5", "unread_increment": round + 1},
        "devices": [{"device_id": device_id}],
    }})
    .to_string()
    .into_bytes()
}

/// The signed headers of one notify (RFC 9421 over the service headers and
/// Content-Digest), with the engine's own signer: this is load, not a test
/// of the signer.
fn signed(key: &str, body: &[u8], authority: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut headers = http::HeaderMap::new();
    let pairs = [
        ("arkret-operation", "ak.edge.push.command.notify.v1".to_owned()),
        ("idempotency-key", key.to_owned()),
        ("source-service-id", STATION.to_owned()),
        ("destination-service-id", GATEWAY.to_owned()),
        ("content-digest", signature::content_digest(body)),
    ];
    for (name, value) in &pairs {
        headers.insert(*name, value.parse()?);
    }
    let request =
        SignedRequest { method: "POST", scheme: "http", authority, path_and_query: NOTIFY, headers: &headers };
    let covered = [
        "@method",
        "@path",
        "arkret-operation",
        "idempotency-key",
        "source-service-id",
        "destination-service-id",
        "content-digest",
    ];
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let params =
        SignatureParams { created: now, expires: None, key_id: KEY_ID.into(), alg: true, nonce: None, tag: None };
    let (input, sig) =
        signature::sign(&request, &covered, &params, "sig1", &SEED).map_err(|e| anyhow::anyhow!("signing: {e}"))?;
    let mut out: Vec<(String, String)> = pairs.into_iter().map(|(n, v)| (n.to_owned(), v)).collect();
    out.push(("signature-input".into(), input));
    out.push(("signature".into(), sig));
    Ok(out)
}

pub async fn run(args: GatewayArgs) -> anyhow::Result<GatewayReport> {
    if args.notifies > args.devices * MAX_PER_DEVICE {
        bail!("--notifies is at most 20 × --devices (each device gets distinct wake-ups)");
    }
    let pki = TestPki::generate(&[])?;
    let fcm = start_mock_fcm(&pki, MockFcmConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    pki.write_ca(&dir.path().join("ca.pem"))?;
    fcm.service_account().write(&dir.path().join("sa.json"))?;
    std::fs::write(dir.path().join("salt.hex"), "22".repeat(32))?;
    let hash = hex::encode(Sha256::digest(SESSION.as_bytes()));
    std::fs::write(dir.path().join("sessions"), format!("{hash} ak:account:loadtest\n"))?;

    let ceiling = if args.run.with_ceiling { Some(ceiling(&args, dir.path(), &fcm.base_url()).await?) } else { None };
    fcm.clear_received();

    let store = args.run.store()?;
    let cql_ceiling = args.run.cql_ceiling().await?;
    let engine = launcher::Engine::start(args.run.launch(&store, config(dir.path(), &fcm.base_url()))?).await?;

    // The Station: one registration per device.
    let auth = format!("Bearer {SESSION}");
    let mut targets = Vec::with_capacity(args.devices as usize);
    for n in 0..args.devices {
        let body = json!({"device_id": device(n), "push_gateway_url": GATEWAY_URL, "push_key": format!("fcm:lt-{n}")});
        let (status, text) = engine
            .api_request(
                "POST",
                "/_arkret/edge/push/register-device",
                &[("authorization", &auth)],
                body.to_string().as_bytes(),
            )
            .await?;
        if status != 200 {
            bail!("register-device answered {status}: {text}\n{}", engine.log_tail(20));
        }
        let answer: Value = serde_json::from_str(&text)?;
        targets.push(answer["push_target_id"].as_str().context("push_target_id")?.to_owned());
    }

    // Notify: `concurrency` workers over the request indices, on keep-alive
    // connections as a Station keeps them.
    let authority = engine.api.to_string();
    let uri = format!("http://{authority}{NOTIFY}");
    let client = platform_channels::http_client(args.concurrency);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sent_at = Arc::new(std::sync::Mutex::new(HashMap::<(String, u64), Instant>::new()));
    let meter = EngineMeter::start(&args.run, engine.pid())?;
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        let (client, uri, next, sent_at, targets, authority) =
            (client.clone(), uri.clone(), next.clone(), sent_at.clone(), targets.clone(), authority.clone());
        let (devices, notifies) = (args.devices, args.notifies);
        workers.spawn(async move {
            let (mut accepted, mut errors) = (0u64, BTreeMap::<String, u64>::new());
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= notifies {
                    return Ok::<_, anyhow::Error>((accepted, errors));
                }
                let (n, round) = (i % devices, i / devices);
                let body = notify_body(&targets[n as usize], &device(n), round);
                let mut request = http::Request::post(&uri);
                for (name, value) in signed(&format!("lt-{i}"), &body, &authority)? {
                    request = request.header(name, value);
                }
                let request = request.header("content-type", "application/json").body(Full::new(Bytes::from(body)))?;
                sent_at.lock().unwrap().insert((format!("lt-{n}"), round + 1), Instant::now());
                let response = client.request(request).await?;
                let status = response.status().as_u16();
                let text = response.into_body().collect().await?.to_bytes();
                if status != 200 {
                    // Counted by status and detail (the rule a problem body names).
                    let detail = serde_json::from_slice::<Value>(&text)
                        .ok()
                        .and_then(|p| p["detail"].as_str().map(str::to_owned));
                    *errors.entry(format!("{status} {}", detail.unwrap_or_default())).or_default() += 1;
                    continue;
                }
                if is_accepted(&text) {
                    accepted += 1;
                }
            }
        });
    }
    let (mut accepted, mut errors) = (0, BTreeMap::<String, u64>::new());
    while let Some(done) = workers.join_next().await {
        let (a, e) = done??;
        accepted += a;
        for (k, n) in e {
            *errors.entry(k).or_default() += n;
        }
    }
    let notify_seconds = started.elapsed().as_secs_f64();

    // Wait for every accepted wake-up at the mock.
    let deadline = Instant::now() + Duration::from_secs(args.run.drain_seconds);
    while (fcm.received_count() as u64) < accepted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metered = meter.finish(args.notifies)?;
    if !errors.is_empty() {
        eprintln!("notify answers other than 200: {errors:?}; the engine's log ends:\n{}", engine.log_tail(30));
    }
    drop(engine);
    store.drop_keyspace().await?;
    let received = fcm.received();
    let sent_at = sent_at.lock().unwrap().clone();
    let mut histogram = latency_histogram();
    let mut last = started;
    for r in &received {
        let at = platform_channels::arrival(r.received_at);
        last = last.max(at);
        let payload = r.json().and_then(|j| j["message"]["data"]["payload"].as_str().map(str::to_owned));
        let increment = payload
            .and_then(|p| serde_json::from_str::<Value>(&p).ok())
            .and_then(|p| p["counts"]["unread_increment"].as_u64());
        if let Some(sent) = increment.and_then(|k| sent_at.get(&(r.token.clone(), k))) {
            let _ = histogram.record(at.saturating_duration_since(*sent).as_micros().max(1) as u64);
        }
    }
    let provider_seconds = last.duration_since(started).as_secs_f64().max(1e-6);
    let provider_requests = received.len() as u64;
    let provider_rate = provider_requests as f64 / provider_seconds;
    let report = GatewayReport {
        devices: args.devices,
        notifies: args.notifies,
        concurrency: args.concurrency,
        accepted,
        errors,
        notify_seconds,
        notifies_per_second: args.notifies as f64 / notify_seconds.max(1e-6),
        provider_requests,
        provider_seconds,
        provider_requests_per_second: provider_rate,
        latency: Percentiles::from_histogram_us(&histogram),
        engine_cpu_us_per_notify: metered.engine_cpu_us,
        harness_cpu_us_per_notify: metered.harness_cpu_us,
        ceiling_requests_per_second: ceiling.map(|c| c.requests_per_second),
        ceiling_cpu_us_per_request: ceiling.and_then(|c| c.cpu_us_per_request),
        ratio: ceiling.map(|c| provider_rate / c.requests_per_second),
        store: store.describe(),
        cql_ceiling,
        profile: metered.profile,
    };
    if provider_requests < accepted {
        eprintln!("missing: {} accepted wake-ups did not reach the mock", accepted - provider_requests);
    }
    if let Some(path) = &args.run.json_out {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(report)
}

/// The same FCM requests through the engine's FCM channel alone.
async fn ceiling(args: &GatewayArgs, dir: &Path, base_url: &str) -> anyhow::Result<Ceiling> {
    let channels = platform_channels::channels(&fcm_table(dir, base_url))?;
    let target = format!("ak:pseudonym:push:{}", URL_SAFE_NO_PAD.encode([7u8; 32]));
    let devices = args.devices;
    platform_channels::ceiling(&channels, args.notifies, args.concurrency, move |i| {
        // The gateway's payload shape: target, kind, counts.
        let payload = json!({"push_target_id": target, "wakeup_kind": "message",
                             "counts": {"badge": "2-5", "unread_increment": i / devices + 1}});
        Ok(PlatformPush {
            channel: Channel::Fcm,
            token: format!("lt-{}", i % devices),
            app_id: None,
            sandbox: false,
            collapse_id: Some("AAAAAAAAAAAAAAAAAAAAAA".into()),
            priority: RelayPriority::Normal,
            payload: payload.as_object().cloned().unwrap_or_default(),
            ttl: Duration::from_secs(86_400),
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command end to end, small: the real binary, the Station's
    /// registrations, signed notifies, every wake-up at the mock FCM.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_run_accepts_every_notify_and_delivers_every_wake_up() {
        let args = GatewayArgs { devices: 10, notifies: 40, concurrency: 4, run: PlatformRunArgs::for_tests() };
        let report = run(args).await.unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!((report.accepted, report.provider_requests), (40, 40));
        assert!(report.ratio.is_some_and(|r| r > 0.0) && report.engine_cpu_us_per_notify.is_some());
        assert_eq!(report.latency.count, 40, "each wake-up matched to its notify");
    }
}
