//! `fanout-loadtest relay-ingress`: spec 003's push-server side under load.
//! The real `fanout` binary with `[engine.relay_ingress]` (one hub, its
//! secret file, the app ids) and APNs and/or FCM pointed at the mocks;
//! `webhooks` signed webhooks (§2.2 `X-Gim-Signature`, `X-Gim-Delivery`),
//! each a distinct `delivery_id`, registrations spread over `devices`
//! tokens and the providers in turn, POSTed `concurrency` at once over
//! keep-alive HTTP/1.1 connections. Then a fraction (`replays`) of the
//! delivery ids is sent again, signed anew, as a hub's retry would be: §2.5
//! answers them without a provider request, so the mocks must have received
//! exactly one request per distinct delivery id (any other count fails the
//! run). Reported: webhooks answered per second, provider requests per
//! second (first webhook sent to last provider request received),
//! webhook-to-provider latency, errors by status, and with `--with-ceiling`
//! the ceiling: the same pushes (parsed from the same bodies by the engine's
//! own parser) sent by the engine's own APNs and FCM channels at the same
//! concurrency, with no HTTP, signature check, store or ingress in between.
//! `ratio` = provider requests/s ÷ ceiling.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use fanout_engine::domain::Channel;
use fanout_engine::relay_ingress::request::{self, HEADER_DELIVERY};
use fanout_engine::relay_ingress::signature::{self, HEADER_SIGNATURE};
use fanout_testkit::launcher;
use fanout_testkit::{
    ApnsTestKey, MockApnsConfig, MockFcmConfig, ProviderRequest, TestPki, start_mock_apns, start_mock_fcm,
};
use http_body_util::{BodyExt as _, Full};
use serde::Serialize;
use serde_json::{Value, json};

use crate::platform_channels::{
    self, EngineMeter, HttpClient, PlatformPush, PlatformRunArgs, apns_table, fcm_table, quote,
};
use crate::profile::ProfileSummary;
use crate::run::collector::{Percentiles, latency_histogram};
use crate::run::cql_ceiling::CqlCeiling;
use crate::run::engine_process::{APNS_KEY_ID, APNS_TEAM_ID};

const HUB: &str = "loadtesthub";
const SECRET: &[u8] = b"loadtest-relay-ingress-secret-0123456789";
const PATH: &str = "/v1/relay/push";
/// The `app_id` of every APNs registration (an allowed bundle id).
const APNS_APP: &str = "com.example.fanout.relay";
/// The `app_id` of every FCM registration (an allowed FCM app).
const FCM_APP: &str = "fanout-loadtest";
/// A webhook's answer is the provider's (the ingress answers after one
/// attempt, itself bounded by the engine): this only catches a hang.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// `registration.provider`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    Apns,
    Fcm,
}

#[derive(clap::Args, Debug, Clone)]
pub struct RelayIngressArgs {
    /// Device tokens the registrations are spread over (round robin).
    #[arg(long, default_value_t = 200)]
    pub devices: u64,
    /// Signed webhooks sent, each with its own delivery_id.
    #[arg(long, default_value_t = 2000)]
    pub webhooks: u64,
    /// Webhooks (and ceiling requests) in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// The registrations' providers, device by device in turn.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "apns,fcm")]
    pub providers: Vec<Platform>,
    /// Fraction of the delivery_ids sent again once all were answered (§2.5:
    /// acknowledged without a second provider request).
    #[arg(long, default_value_t = 0.1)]
    pub replays: f64,
    #[command(flatten)]
    pub run: PlatformRunArgs,
}

#[derive(Debug, Default, Serialize)]
pub struct RelayIngressReport {
    pub devices: u64,
    pub webhooks: u64,
    pub concurrency: usize,
    pub providers: Vec<Platform>,
    /// Webhooks answered 200 `delivered`.
    pub delivered: u64,
    pub webhook_seconds: f64,
    pub webhooks_per_second: f64,
    /// Delivery ids sent again, and those answered 200 `duplicate`.
    pub replays: u64,
    pub duplicates: u64,
    pub replays_per_second: f64,
    /// Answers other than 200 (by status), timeouts and connection errors,
    /// of the webhooks and the replays.
    pub errors: BTreeMap<String, u64>,
    /// Requests the mocks received, in all and by provider.
    pub provider_requests: u64,
    pub provider_requests_by_provider: BTreeMap<Platform, u64>,
    /// Distinct delivery ids among them (each push carries its own).
    pub distinct_delivery_ids_at_providers: u64,
    pub provider_seconds: f64,
    pub provider_requests_per_second: f64,
    /// Webhook sent → provider request received.
    pub latency: Percentiles,
    /// The engine's CPU time (user + system) from the first webhook to the
    /// last push at the mocks, per webhook sent (replays not included).
    pub engine_cpu_us_per_webhook: Option<f64>,
    /// The harness's CPU time over the same interval, per webhook: the
    /// load's signing and HTTP client and the mock providers answering.
    pub harness_cpu_us_per_webhook: Option<f64>,
    pub ceiling_requests_per_second: Option<f64>,
    /// The harness's CPU per ceiling request (the channels and the mock
    /// providers): with the rates, what the machine spends per push either way.
    pub ceiling_cpu_us_per_request: Option<f64>,
    /// provider_requests_per_second ÷ ceiling.
    pub ratio: Option<f64>,
    /// `redb`, or the ScyllaDB keyspace and nodes.
    pub store: String,
    /// With --with-cql-ceiling: the CQL server's rates for a plain client.
    pub cql_ceiling: Option<CqlCeiling>,
    /// `--profile`: where the engine's CPU time went.
    pub profile: Option<ProfileSummary>,
    pub passed: bool,
    pub failures: Vec<String>,
}

/// What webhook `i` of a run is: pure, so that the tests can hold it
/// against the engine's own parser and verifier.
#[derive(Debug, Clone)]
struct Plan {
    devices: u64,
    providers: Vec<Platform>,
    /// Makes the delivery ids of this run its own.
    run: u64,
}

impl Plan {
    /// §2.3: 32 lowercase hex, distinct for every `i`.
    fn delivery_id(&self, i: u64) -> String {
        format!("{:016x}{i:016x}", self.run)
    }

    fn device(&self, i: u64) -> u64 {
        i % self.devices.max(1)
    }

    fn platform(&self, i: u64) -> Platform {
        self.providers[(self.device(i) % self.providers.len() as u64) as usize]
    }

    /// The registration's token: 64 hex for APNs, an opaque string for FCM.
    fn token(&self, i: u64) -> String {
        match self.platform(i) {
            Platform::Apns => format!("{:064x}", self.device(i)),
            Platform::Fcm => format!("lt-fcm-{}", self.device(i)),
        }
    }

    /// The body a hub sends (§2.3), its §3 payload numbered `seq` = `i` so
    /// the provider request can be matched to its webhook.
    fn body(&self, i: u64, sent_at_ms: u64) -> Vec<u8> {
        let collapse = format!("{:032x}", i);
        let registration = match self.platform(i) {
            Platform::Apns => json!({"provider": "apns", "token": self.token(i), "app_id": APNS_APP, "sandbox": true}),
            Platform::Fcm => json!({"provider": "fcm", "token": self.token(i), "app_id": FCM_APP}),
        };
        json!({
            "v": 1, "hub_id": HUB, "delivery_id": self.delivery_id(i), "sent_at": sent_at_ms,
            "registration": registration, "priority": "high", "collapse_id": collapse, "ttl": 86400,
            "payload": {"v": 1, "type": "message", "gid": "bG9hZHRlc3Q", "seq": i, "message_id": collapse,
                        "collapse_id": collapse, "mls_message": "bG9hZHRlc3QgY2lwaGVydGV4dA"},
        })
        .to_string()
        .into_bytes()
    }

    /// Webhook `i` POSTed to `uri` at `now`: the body and its §2.2 headers,
    /// signed with the engine's signer (this is load, not a test of it).
    fn request(&self, uri: &str, i: u64, now: SystemTime) -> http::Request<Full<Bytes>> {
        let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let body = self.body(i, since_epoch.as_millis() as u64);
        let signature = signature::header_value(SECRET, since_epoch.as_secs() as i64, &body);
        http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(HEADER_SIGNATURE, signature)
            .header(HEADER_DELIVERY, self.delivery_id(i))
            .body(Full::new(Bytes::from(body)))
            .expect("valid request")
    }

    /// The push the ingress makes of webhook `i`, by the engine's parser.
    fn push(&self, i: u64) -> anyhow::Result<PlatformPush> {
        let webhook = request::parse(&self.body(i, 0), Some(&self.delivery_id(i)))
            .map_err(|e| anyhow::anyhow!("webhook {i}: {e}"))?;
        let channel = match self.platform(i) {
            Platform::Apns => Channel::Apns,
            Platform::Fcm => Channel::Fcm,
        };
        Ok(PlatformPush {
            channel,
            token: webhook.token,
            app_id: webhook.app_id,
            sandbox: webhook.sandbox,
            collapse_id: webhook.collapse_id,
            priority: webhook.priority,
            payload: webhook.payload,
            ttl: webhook.ttl,
        })
    }
}

/// The `[engine]` tables: the channels in use, and the ingress.
fn config(dir: &Path, providers: &[Platform], apns_url: &str, fcm_url: &str) -> String {
    channel_tables(dir, providers, apns_url, fcm_url)
        + &format!(
            "\n[engine.relay_ingress]\npath = \"{PATH}\"\nhubs = {{ {HUB} = {} }}\n\
             apns_app_ids = [\"{APNS_APP}\"]\nfcm_app_ids = [\"{FCM_APP}\"]\n",
            quote(&dir.join("hub.secret")),
        )
}

fn channel_tables(dir: &Path, providers: &[Platform], apns_url: &str, fcm_url: &str) -> String {
    let mut tables = String::new();
    if providers.contains(&Platform::Apns) {
        tables += &apns_table(dir, apns_url);
    }
    if providers.contains(&Platform::Fcm) {
        tables += &fcm_table(dir, fcm_url);
    }
    tables
}

/// The webhook answers of one phase.
#[derive(Debug, Default)]
struct Answers {
    delivered: u64,
    duplicate: u64,
    errors: BTreeMap<String, u64>,
    seconds: f64,
}

/// POSTs the webhooks `indices` with `concurrency` in flight over the
/// client's keep-alive connections; records when each was sent in
/// `sent_at` (µs after `started`, + 1), if given.
async fn send(
    client: &HttpClient,
    uri: &str,
    plan: &Arc<Plan>,
    indices: Vec<u64>,
    concurrency: usize,
    sent_at: Option<(Arc<Vec<AtomicU64>>, Instant)>,
) -> anyhow::Result<Answers> {
    let indices = Arc::new(indices);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, uri, plan, indices, next, sent_at) =
            (client.clone(), uri.to_owned(), plan.clone(), indices.clone(), next.clone(), sent_at.clone());
        workers.spawn(async move {
            let mut answers = Answers::default();
            loop {
                let Some(&i) = indices.get(next.fetch_add(1, Ordering::Relaxed) as usize) else {
                    return answers;
                };
                let request = plan.request(&uri, i, SystemTime::now());
                if let Some((sent_at, t0)) = &sent_at {
                    sent_at[i as usize].store(t0.elapsed().as_micros() as u64 + 1, Ordering::Relaxed);
                }
                let answer = tokio::time::timeout(ANSWER_TIMEOUT, async {
                    let response = client.request(request).await?;
                    let status = response.status().as_u16();
                    let body = response.into_body().collect().await?.to_bytes();
                    Ok::<_, anyhow::Error>((status, body))
                })
                .await;
                match answer {
                    Ok(Ok((200, body))) if body.as_ref() == br#"{"result":"delivered"}"# => answers.delivered += 1,
                    Ok(Ok((200, body))) if body.as_ref() == br#"{"result":"duplicate"}"# => answers.duplicate += 1,
                    Ok(Ok((status, _))) => *answers.errors.entry(status.to_string()).or_default() += 1,
                    Ok(Err(_)) => *answers.errors.entry("connection".into()).or_default() += 1,
                    Err(_) => *answers.errors.entry("timeout".into()).or_default() += 1,
                }
            }
        });
    }
    let mut all = Answers::default();
    while let Some(done) = workers.join_next().await {
        let answers = done?;
        all.delivered += answers.delivered;
        all.duplicate += answers.duplicate;
        for (k, v) in answers.errors {
            *all.errors.entry(k).or_default() += v;
        }
    }
    all.seconds = started.elapsed().as_secs_f64();
    Ok(all)
}

/// The webhook number a provider request carries (its payload's `seq`):
/// APNs has the payload in the body, FCM as a JSON string in `data`.
fn seq_of(platform: Platform, request: &ProviderRequest) -> Option<u64> {
    let json = request.json()?;
    match platform {
        Platform::Apns => json["payload"]["seq"].as_u64(),
        Platform::Fcm => {
            let payload: Value = serde_json::from_str(json["message"]["data"]["payload"].as_str()?).ok()?;
            payload["seq"].as_u64()
        }
    }
}

/// `count` webhooks spread evenly over `0..webhooks`.
fn replay_indices(webhooks: u64, fraction: f64) -> Vec<u64> {
    let count = ((webhooks as f64 * fraction.clamp(0.0, 1.0)).round() as u64).min(webhooks);
    (0..count).map(|j| j * webhooks / count).collect()
}

pub async fn run(args: RelayIngressArgs) -> anyhow::Result<RelayIngressReport> {
    if args.providers.is_empty() || args.devices == 0 {
        bail!("--providers and --devices must not be empty");
    }
    if !(0.0..=1.0).contains(&args.replays) {
        bail!("--replays is a fraction between 0 and 1");
    }
    let mut providers = args.providers.clone();
    providers.dedup();
    let plan = Arc::new(Plan { devices: args.devices, providers: providers.clone(), run: rand::random() });

    let pki = TestPki::generate(&[])?;
    let key = ApnsTestKey::generate()?;
    let apns = start_mock_apns(
        &pki,
        MockApnsConfig {
            team_id: APNS_TEAM_ID.into(),
            key_id: APNS_KEY_ID.into(),
            public_key_pem: Some(key.public_pem.clone()),
            ..Default::default()
        },
    )
    .await?;
    let fcm = start_mock_fcm(&pki, MockFcmConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    pki.write_ca(&dir.path().join("ca.pem"))?;
    key.write_p8(&dir.path().join("AuthKey.p8"))?;
    fcm.service_account().write(&dir.path().join("sa.json"))?;
    std::fs::write(dir.path().join("hub.secret"), SECRET)?;

    let ceiling = if args.run.with_ceiling {
        let channels =
            platform_channels::channels(&channel_tables(dir.path(), &providers, &apns.base_url(), &fcm.base_url()))?;
        let plan = plan.clone();
        Some(platform_channels::ceiling(&channels, args.webhooks, args.concurrency, move |i| plan.push(i)).await?)
    } else {
        None
    };
    apns.clear_received();
    fcm.clear_received();

    let store = args.run.store()?;
    let cql_ceiling = args.run.cql_ceiling().await?;
    let launch = args.run.launch(&store, config(dir.path(), &providers, &apns.base_url(), &fcm.base_url()))?;
    let engine = launcher::Engine::start(launch).await?;
    let uri = format!("http://{}{PATH}", engine.api);
    let client = platform_channels::http_client(args.concurrency);

    // The webhooks, each delivery id once.
    let sent_at: Arc<Vec<AtomicU64>> = Arc::new((0..args.webhooks).map(|_| AtomicU64::new(0)).collect());
    let meter = EngineMeter::start(&args.run, engine.pid())?;
    let started = Instant::now();
    let first =
        send(&client, &uri, &plan, (0..args.webhooks).collect(), args.concurrency, Some((sent_at.clone(), started)))
            .await?;

    // The ingress answers after the provider did; wait anyway, bounded, for
    // every delivered push at the mocks.
    let received = || apns.received_count() as u64 + fcm.received_count() as u64;
    let deadline = Instant::now() + Duration::from_secs(args.run.drain_seconds);
    while received() < first.delivered && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metered = meter.finish(args.webhooks)?;

    // A hub's retries of delivery ids already answered.
    let replays = replay_indices(args.webhooks, args.replays);
    let replay_count = replays.len() as u64;
    let second = send(&client, &uri, &plan, replays, args.concurrency, None).await?;
    // A second provider request, if the ingress made one, was made before
    // its answer; a moment more for one still on the wire.
    tokio::time::sleep(Duration::from_millis(500)).await;

    drop(engine);
    store.drop_keyspace().await?;

    let mut by_provider = BTreeMap::new();
    let mut distinct = HashSet::new();
    let mut histogram = latency_histogram();
    let mut last = started;
    for (platform, requests) in [(Platform::Apns, apns.received()), (Platform::Fcm, fcm.received())] {
        if !requests.is_empty() {
            by_provider.insert(platform, requests.len() as u64);
        }
        for r in &requests {
            let at = platform_channels::arrival(r.received_at);
            last = last.max(at);
            let Some(i) = seq_of(platform, r) else { continue };
            distinct.insert(i);
            let sent = sent_at.get(i as usize).map_or(0, |s| s.load(Ordering::Relaxed));
            if sent > 0 {
                let sent = started + Duration::from_micros(sent - 1);
                let _ = histogram.record(at.saturating_duration_since(sent).as_micros().max(1) as u64);
            }
        }
    }
    let provider_requests: u64 = by_provider.values().sum();
    let provider_seconds = last.duration_since(started).as_secs_f64().max(1e-6);
    let provider_rate = provider_requests as f64 / provider_seconds;
    let mut errors = first.errors;
    for (k, v) in second.errors {
        *errors.entry(k).or_default() += v;
    }

    let mut failures = Vec::new();
    if provider_requests != args.webhooks || distinct.len() as u64 != args.webhooks {
        failures.push(format!(
            "{provider_requests} provider requests for {} distinct delivery ids ({} of them at the providers)",
            args.webhooks,
            distinct.len()
        ));
    }
    if second.duplicate != replay_count {
        failures.push(format!("{} of {replay_count} replays answered as duplicates", second.duplicate));
    }
    if !errors.is_empty() {
        failures.push(format!("error answers: {errors:?}"));
    }
    if second.delivered > 0 {
        failures.push(format!("{} replays delivered again", second.delivered));
    }

    let report = RelayIngressReport {
        devices: args.devices,
        webhooks: args.webhooks,
        concurrency: args.concurrency,
        providers,
        delivered: first.delivered,
        webhook_seconds: first.seconds,
        webhooks_per_second: args.webhooks as f64 / first.seconds.max(1e-6),
        replays: replay_count,
        duplicates: second.duplicate,
        replays_per_second: replay_count as f64 / second.seconds.max(1e-6),
        errors,
        provider_requests,
        provider_requests_by_provider: by_provider,
        distinct_delivery_ids_at_providers: distinct.len() as u64,
        provider_seconds,
        provider_requests_per_second: provider_rate,
        latency: Percentiles::from_histogram_us(&histogram),
        engine_cpu_us_per_webhook: metered.engine_cpu_us,
        harness_cpu_us_per_webhook: metered.harness_cpu_us,
        ceiling_requests_per_second: ceiling.map(|c| c.requests_per_second),
        ceiling_cpu_us_per_request: ceiling.and_then(|c| c.cpu_us_per_request),
        ratio: ceiling.map(|c| provider_rate / c.requests_per_second),
        store: store.describe(),
        cql_ceiling,
        profile: metered.profile,
        passed: failures.is_empty(),
        failures,
    };
    if let Some(path) = &args.run.json_out {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?).with_context(|| format!("{}", path.display()))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_engine::relay_ingress::signature::SignatureHeader;

    fn plan() -> Plan {
        Plan { devices: 3, providers: vec![Platform::Apns, Platform::Fcm], run: 0xfeed }
    }

    /// The command end to end, small: the real binary, both mocks, the
    /// replays, the ceiling and the engine's CPU.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_run_delivers_each_webhook_once_and_answers_replays_as_duplicates() {
        let args = RelayIngressArgs {
            devices: 5,
            webhooks: 40,
            concurrency: 4,
            providers: vec![Platform::Apns, Platform::Fcm],
            replays: 0.25,
            run: PlatformRunArgs::for_tests(),
        };
        let report = run(args).await.unwrap();
        assert!(report.passed, "{:?}", report.failures);
        assert_eq!((report.delivered, report.provider_requests, report.duplicates), (40, 40, 10));
        assert!(report.ratio.is_some_and(|r| r > 0.0) && report.engine_cpu_us_per_webhook.is_some());
        assert_eq!(report.store, "redb");
    }

    #[tokio::test]
    async fn a_planned_webhook_passes_the_engines_verifier_and_parser() {
        let plan = plan();
        let now = SystemTime::now();
        let request = plan.request("http://127.0.0.1:1/v1/relay/push", 4, now);
        let header = |name: &str| request.headers()[name].to_str().unwrap().to_owned();
        let (signature, delivery) = (header(HEADER_SIGNATURE), header(HEADER_DELIVERY));
        let body = request.into_body().collect().await.unwrap().to_bytes();

        let t = now.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let verified = SignatureHeader::parse(&signature).unwrap().verify(SECRET, &body, t, Duration::from_secs(300));
        assert_eq!(verified, Ok(()));
        let webhook = request::parse(&body, Some(&delivery)).unwrap();
        assert_eq!(webhook.delivery_id, "000000000000feed0000000000000004");
        // Device 4 mod 3 = 1, the second provider.
        assert_eq!((webhook.provider.as_str(), webhook.token.as_str()), ("fcm", "lt-fcm-1"));
        assert_eq!(webhook.app_id.as_deref(), Some(FCM_APP));
        assert_eq!(webhook.payload["seq"], 4);

        // The ceiling's push is the same one.
        let push = plan.push(4).unwrap();
        assert_eq!((push.channel, push.token.as_str()), (Channel::Fcm, "lt-fcm-1"));
        assert_eq!(push.payload, webhook.payload);
        let apns = plan.push(3).unwrap();
        assert_eq!((apns.channel, apns.app_id.as_deref(), apns.sandbox), (Channel::Apns, Some(APNS_APP), true));
        assert_eq!(apns.token.len(), 64);
    }

    #[test]
    fn delivery_ids_are_distinct_and_replays_spread_over_them() {
        let plan = plan();
        let ids: HashSet<String> = (0..1000).map(|i| plan.delivery_id(i)).collect();
        assert_eq!(ids.len(), 1000);
        assert_eq!(replay_indices(100, 0.1), vec![0, 10, 20, 30, 40, 50, 60, 70, 80, 90]);
        assert_eq!(replay_indices(3, 1.0), vec![0, 1, 2]);
        assert!(replay_indices(100, 0.0).is_empty());
    }
}
