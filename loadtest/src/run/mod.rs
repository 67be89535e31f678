//! `fanout-loadtest run` and `ceiling`: drive the real engine with a
//! scenario, prove nothing was lost, and measure how close it runs to the
//! machine's ceiling.
//!
//! - [`scenario`]: the TOML scenario and the plan expanded from it
//! - [`ids`]: recipient ids, secrets, keys and topics derived from a seed
//! - [`engine_process`]: the `fanout` binary and config for the shared
//!   launcher, /proc sampling, /metrics
//! - [`driver`]: registration, subscriptions and publishing over gRPC
//! - [`collector`]: the receiver-side accounting (missing, duplicates, latency)
//! - [`nodes`]: several engine nodes on one keyspace, their figures and the
//!   node fault
//! - [`ceiling`]: the bare HTTP/2 client with no engine in between
//! - [`h2load`]: the independent ceiling, nghttp2's h2load into the same receivers
//! - [`pushy`]: apns scenarios into Pushy's mock APNs, and Pushy's client into it
//! - [`outage`]: mixed-channel scenarios, run without and with an outage of
//!   the mock APNs
//! - [`sources`]: whether a build is older than its sources
//! - [`report`], [`svg`], [`progress`]: the outputs

pub mod args;
pub mod ceiling;
pub mod collector;
pub mod cql_ceiling;
pub mod db_fault;
pub mod driver;
pub mod engine_process;
pub mod h2load;
pub mod ids;
pub mod local_server;
pub mod nodes;
pub mod outage;
pub mod progress;
pub mod pushy;
pub mod report;
pub mod scenario;
pub mod sources;
pub mod svg;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use fanout_testkit::TestPki;
use fanout_testkit::launcher::{self, Launch};
use fanout_testkit::mock::apns::{ApnsTestKey, MockApns, MockApnsConfig};
use fanout_testkit::mock::webhook::{MockWebhook, MockWebhookConfig};
use fanout_testkit::mock::webpush::MockWebPush;
use fanout_testkit::webpush::VapidTestKey;
use fanout_testkit::wire::WireCounts;

pub use self::args::{ApnsServer, CeilingArgs, RunArgs};
use self::ceiling::{Targets, WebPushSender};
use self::collector::Collector;
use self::engine_process::{
    APNS_KEY_ID, APNS_TEAM_ID, PushTarget, Store, harness_apns_config, own_cpu_seconds, proc_sample,
};
use self::ids::RunIds;
use self::progress::Progress;
use self::report::{EngineInfo, Machine, PlanInfo, Report, Resources, WireReport};
use self::scenario::{Faults, Plan, Scenario, ScenarioChannel};

/// Registration calls a second during a database fault run (`db_fault::Churn`).
const CHURN_PER_SECOND: u32 = 20;

/// Runs a scenario, prints the summary, writes the reports; fails when the
/// run did (missing deliveries, publish errors, bad signatures).
pub async fn run_command(args: RunArgs) -> anyhow::Result<()> {
    if outage::is_outage_scenario(&args.scenario)? {
        return outage::run_command(&args).await;
    }
    let report = execute(&args).await?;
    println!("{}", report.text());
    if !report.passed {
        bail!("scenario {} failed: {}", report.scenario, report.failures.join("; "));
    }
    Ok(())
}

/// Measures the ceiling alone.
pub async fn ceiling_command(args: CeilingArgs) -> anyhow::Result<()> {
    let scenario = Scenario::load(&args.scenario)?;
    let plan = Arc::new(Plan::new(&scenario));
    let pki = TestPki::generate(&[]).context("generating test PKI")?;
    let progress = Progress::new();
    let printer = progress.spawn_printer();
    let requests = args.requests.unwrap_or_else(|| ceiling_requests(&scenario, &plan));
    let concurrency = args.concurrency.unwrap_or(scenario.ceiling.concurrency);
    let result = measure_ceiling(&pki, &ApnsPeer::Rust, &scenario, &plan, requests, concurrency, &progress).await;
    printer.abort();
    let result = result?;
    progress.say("");
    println!(
        "ceiling for {}: {:.0} requests/s ({} requests, concurrency {}, {} failed, {:.2} s, p50 {:.2} ms, p99 {:.2} ms)",
        scenario.name,
        result.requests_per_second,
        result.requests,
        result.concurrency,
        result.failed,
        result.seconds,
        result.latency.p50_ms,
        result.latency.p99_ms
    );
    if let Some(path) = &args.json_out {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if result.failed > 0 {
        bail!("{} ceiling requests failed", result.failed);
    }
    Ok(())
}

fn ceiling_requests(scenario: &Scenario, plan: &Plan) -> u64 {
    let all = plan.expected_deliveries(plan.envelopes);
    scenario.ceiling.max_requests.map_or(all, |cap| all.min(cap))
}

/// The scenario's mock receivers: webhook receivers (or the relay's push
/// server), one mock APNs with the provider key it verifies, or one mock
/// Web Push service with the VAPID key it expects.
enum Receivers {
    Webhooks(Vec<MockWebhook>),
    Apns {
        mock: MockApns,
        key: ApnsTestKey,
    },
    /// `--apns-server pushy`: Pushy's server, its lines fed to the collector.
    Pushy {
        server: Box<pushy::PushyServer>,
        key: ApnsTestKey,
        _files: pushy::PushyFiles,
    },
    WebPush {
        mock: MockWebPush,
        key: VapidTestKey,
    },
}

/// Which APNs peer the phases of an apns scenario start.
#[derive(Debug, Clone)]
enum ApnsPeer {
    Rust,
    /// `warmup`: pushes of Pushy's client into each server before its measured traffic.
    Pushy {
        classpath: pushy::Classpath,
        server: pushy::ServerOptions,
        warmup: u64,
    },
}

impl Receivers {
    /// Starts them with `collector` as their hook; they keep no requests.
    async fn start(
        pki: &TestPki,
        scenario: &Scenario,
        collector: &Arc<Collector>,
        peer: &ApnsPeer,
    ) -> anyhow::Result<Receivers> {
        let latency = Duration::from_millis(scenario.mock.latency_ms);
        if let (ScenarioChannel::Apns, ApnsPeer::Pushy { classpath, server, warmup }) = (scenario.channel, peer) {
            // Every device of the plan registered for the bundle id, the
            // run's provider key trusted: Pushy verifies every push.
            let key = ApnsTestKey::generate()?;
            let (plan, ids) = (collector.plan(), collector.ids());
            let files = pushy::PushyFiles::write(pki, &key, plan, ids)?;
            let server = pushy::PushyServer::start(classpath, &files, *server, Some(collector.clone())).await?;
            // Warmed up as the server of Pushy's own measurement is by its
            // warm-up, so no phase meets a cold JVM.
            // Pushy's client goes round the file as often as the warm-up needs.
            let warmup_file = files.path("warmup.txt");
            write_pushes(plan, ids, (*warmup).min(plan.expected_deliveries(plan.envelopes)), &warmup_file)?;
            server.warm_up(classpath, &files, &warmup_file, *warmup).await?;
            let receivers = Receivers::Pushy { server: Box::new(server), key, _files: files };
            receivers.warm_up_with_h2(pki, plan, ids, *warmup, scenario.ceiling.concurrency).await?;
            if let Receivers::Pushy { server, .. } = &receivers {
                server.forward_to_collector();
            }
            return Ok(receivers);
        }
        if scenario.channel == ScenarioChannel::Apns {
            let key = ApnsTestKey::generate()?;
            let config = MockApnsConfig { latency, ..harness_apns_config(&key, collector.apns_hook()) };
            let mock = fanout_testkit::mock::apns::start(pki, config).await?;
            return Ok(Receivers::Apns { mock, key });
        }
        if scenario.channel == ScenarioChannel::WebPush {
            // The mock checks every token against the run's VAPID key; the
            // collector decrypts every body with the recipient's key.
            let key = VapidTestKey::generate();
            let hook = collector.webpush_hook(latency);
            let mock = fanout_testkit::mock::webpush::start_with_hook(pki, Some(key.public_key.clone()), hook).await?;
            return Ok(Receivers::WebPush { mock, key });
        }
        let mut mocks = Vec::new();
        for _ in 0..scenario.mock.receivers {
            let config = MockWebhookConfig {
                latency,
                record_requests: false,
                on_request: Some(collector.hook()),
                ..MockWebhookConfig::default()
            };
            mocks.push(fanout_testkit::mock::webhook::start(pki, config).await?);
        }
        Ok(Receivers::Webhooks(mocks))
    }

    fn urls(&self) -> Vec<String> {
        match self {
            Receivers::Webhooks(mocks) => mocks.iter().map(|m| m.url("/hook")).collect(),
            Receivers::Apns { mock, .. } => vec![mock.base_url()],
            Receivers::Pushy { server, .. } => vec![server.base_url()],
            Receivers::WebPush { mock, .. } => vec![mock.base_url()],
        }
    }

    /// Pushy's server only: `warmup` more requests as h2 encodes them (the
    /// bare ceiling's client, the engine's stack), after Pushy's warm-up.
    /// h2 sends the provider token and the path as never-indexed literals
    /// where Netty's encoder indexes them, so Pushy's pushes leave the
    /// server's decoding of those uncompiled, and the first h2 client
    /// measured into it would pay for the JIT (0.6 of a core during the
    /// engine's phase, measured). Their lines are not the collector's.
    async fn warm_up_with_h2(
        &self,
        pki: &TestPki,
        plan: &Arc<Plan>,
        ids: RunIds,
        warmup: u64,
        concurrency: usize,
    ) -> anyhow::Result<()> {
        let Receivers::Pushy { server, .. } = self else { return Ok(()) };
        let before = server.counts.accepted.load(std::sync::atomic::Ordering::Relaxed);
        let expected = plan.expected_deliveries(plan.envelopes);
        let scratch = Collector::new(plan.clone(), ids, Faults::default());
        let mut left = warmup;
        while left > 0 && expected > 0 {
            let requests = left.min(expected);
            let targets = self.targets(plan, ids)?;
            let warm = ceiling::run(pki, plan, ids, targets, &scratch, requests, concurrency, &Progress::new()).await?;
            if warm.failed > 0 {
                bail!("warming Pushy's mock server up with h2's requests: {} of {requests} failed", warm.failed);
            }
            left -= requests;
        }
        // Every line of the warm-up read before the collector's are.
        server.wait_for_lines(before + (warmup - left)).await;
        Ok(())
    }

    /// Where the ceiling sends: for APNs with a provider token of the key
    /// (sensitive, as the engine's); for Web Push with the VAPID key and
    /// the keys of `plan`'s recipients under `ids`.
    fn targets(&self, plan: &Plan, ids: RunIds) -> anyhow::Result<Targets> {
        let webpush = match self {
            Receivers::WebPush { key, .. } => Some(WebPushSender::new(key.pem.as_bytes(), plan, ids)?),
            _ => None,
        };
        let apns_authorization = match self {
            Receivers::Webhooks(_) | Receivers::WebPush { .. } => None,
            Receivers::Apns { key, .. } | Receivers::Pushy { key, .. } => {
                let iat = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                let jwt = key.provider_token(APNS_KEY_ID, APNS_TEAM_ID, iat)?;
                let mut value = http::HeaderValue::try_from(format!("bearer {jwt}"))?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(Targets { urls: self.urls(), apns_authorization, webpush })
    }

    /// What the mock APNs read on the wire.
    fn wire(&self) -> Option<WireCounts> {
        match self {
            Receivers::Webhooks(_) | Receivers::WebPush { .. } | Receivers::Pushy { .. } => None,
            Receivers::Apns { mock, .. } => Some(mock.wire()),
        }
    }

    async fn shutdown(self) {
        match self {
            Receivers::Webhooks(mocks) => {
                for m in mocks {
                    m.shutdown().await;
                }
            }
            Receivers::Apns { mock, .. } => mock.shutdown().await,
            Receivers::Pushy { server, .. } => server.shutdown().await,
            Receivers::WebPush { mock, .. } => mock.shutdown().await,
        }
    }
}

async fn measure_ceiling(
    pki: &TestPki,
    peer: &ApnsPeer,
    scenario: &Scenario,
    plan: &Arc<Plan>,
    requests: u64,
    concurrency: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<ceiling::CeilingResult> {
    // A fresh identity space and a fault-free collector: the same per-request
    // work at the receiver as in the engine run.
    let ids = RunIds::fresh();
    let collector = Collector::new(plan.clone(), ids, Faults::default());
    let receivers = Receivers::start(pki, scenario, &collector, peer).await?;
    let targets = receivers.targets(plan, ids)?;
    let result = ceiling::run(pki, plan, ids, targets, &collector, requests, concurrency, progress).await;
    let wire = receivers.wire();
    receivers.shutdown().await;
    result.map(|r| ceiling::CeilingResult { wire, ..r })
}

/// The independent ceiling: h2load sends the run's first delivery, signed
/// as the engine signs it, to fresh receivers of the scenario's kind, with
/// the bare ceiling's concurrency split over `connections` per receiver.
async fn measure_h2load(
    pki: &TestPki,
    peer: &ApnsPeer,
    scenario: &Scenario,
    plan: &Arc<Plan>,
    requests: u64,
    connections: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<h2load::H2loadResult> {
    let ids = RunIds::fresh();
    let collector = Collector::new(plan.clone(), ids, Faults::default());
    let receivers = Receivers::start(pki, scenario, &collector, peer).await?;
    let targets = receivers.targets(plan, ids)?;
    collector.envelope_published(plan.topic_of_envelope(0), 1, Instant::now());
    let connections = connections.max(1);
    let streams = (scenario.ceiling.concurrency / (targets.urls.len() * connections)).max(1);
    progress.phase("h2load", requests);
    let request = ceiling::request(plan, ids, &targets, 0);
    let result = h2load::run(request, &targets.urls, requests, connections, streams).await;
    receivers.shutdown().await;
    result
}

/// Pushy's client into a fresh `peer` (Pushy's server, or the harness's
/// mock), once per connection count of `args`: the run's first `requests`
/// deliveries as the engine sends them (device token, collapse id, body; the
/// order of the plan), after a warm-up.
#[allow(clippy::too_many_arguments)]
async fn measure_pushy(
    args: &RunArgs,
    classpath: &pushy::Classpath,
    peer: pushy::ClientPeer,
    pki: &TestPki,
    scenario: &Scenario,
    plan: &Arc<Plan>,
    requests: u64,
    progress: &Arc<Progress>,
) -> anyhow::Result<pushy::PushyReport> {
    let ids = RunIds::fresh();
    let key = ApnsTestKey::generate()?;
    let files = pushy::PushyFiles::write(pki, &key, plan, ids)?;
    let pushes_file = files.path("pushes.txt");
    write_pushes(plan, ids, requests, &pushes_file)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut connections = args.pushy_connections.clone();
    if connections.is_empty() {
        connections = vec![1, 2, 4];
    }
    let server_threads = match peer {
        pushy::ClientPeer::Pushy(server) => server.threads,
        pushy::ClientPeer::HarnessMock => 0,
    };
    let mut report = pushy::PushyReport { server_threads, ..Default::default() };
    for c in connections {
        let config = pushy::ClientConfig {
            connections: c.max(1),
            in_flight: args.pushy_in_flight.max(1),
            warmup: args.pushy_warmup(),
            threads: c.clamp(1, cores),
        };
        progress.phase(&format!("pushy client, {} connection(s)", config.connections), 0);
        let timeout = scenario.drain_timeout();
        let result = pushy::measure_client(classpath, &files, &pushes_file, peer, (pki, &key), config, timeout).await?;
        progress.say(&format!(
            "pushy client: {:.0} pushes/s with {} connection(s), {} in flight ({} accepted, {} rejected)",
            result.pushes_per_second, result.connections, result.in_flight, result.accepted, result.rejected
        ));
        report.runs.push(result);
    }
    report.best = report
        .runs
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.pushes_per_second.total_cmp(&b.1.pushes_per_second))
        .map_or(0, |(i, _)| i);
    Ok(report)
}

/// The file of Pushy's client: the first `count` deliveries of `plan` under
/// `ids` as the engine sends them (device token, collapse id, body), in the
/// plan's order.
fn write_pushes(plan: &Plan, ids: RunIds, count: u64, path: &Path) -> anyhow::Result<()> {
    pushy::write_pushes(
        path,
        (0..count).map(|index| {
            let (envelope, slot) = plan.delivery_at(index);
            let topic = plan.topic_of_envelope(envelope);
            let recipient = plan.subscriber(topic, slot);
            // Synthetic sequence ids, as the ceiling's: envelope e is e + 1.
            let (collapse_id, body) = ceiling::apns_body(ids, topic, envelope + 1);
            (hex::encode(ids.recipient_id(recipient)), collapse_id, body)
        }),
    )
}

/// `flag` (`--apns-server pushy`, `--with-pushy-client`) runs an apns
/// scenario without faults or latency: Pushy's server, and the harness's
/// mock when it is measured with Pushy's client, answer every valid push
/// 200 at once, and both clients must meet the same answers.
fn check_pushy_scenario(scenario: &Scenario, flag: &str) -> anyhow::Result<()> {
    if scenario.channel != ScenarioChannel::Apns {
        bail!(
            "{flag} is for apns scenarios (channel = \"apns\"); scenario {} has channel {:?}",
            scenario.name,
            scenario.channel
        );
    }
    if scenario.faults.any() || scenario.mock.latency_ms > 0 {
        bail!(
            "{flag}: Pushy's client is measured into a server that answers every valid push 200 without delay; \
             scenario {} has faults or mock.latency_ms, which only the engine would meet",
            scenario.name
        );
    }
    Ok(())
}

/// `engine.lease.ttl_seconds` of the scenario's `[engine]` table (default 10 s).
fn lease_ttl(scenario: &Scenario) -> Duration {
    let ttl = scenario.engine.get("lease").and_then(|l| l.get("ttl_seconds")).and_then(toml::Value::as_integer);
    Duration::from_secs(ttl.unwrap_or(10).max(1) as u64)
}

/// The engine: started here, or already running elsewhere.
enum Engine {
    Started(launcher::Engine),
    External { grpc: SocketAddr, http: Option<SocketAddr>, pid: Option<u32> },
}

impl Engine {
    fn grpc(&self) -> SocketAddr {
        match self {
            Engine::Started(e) => e.grpc,
            Engine::External { grpc, .. } => *grpc,
        }
    }
    fn http(&self) -> Option<SocketAddr> {
        match self {
            Engine::Started(e) => Some(e.http),
            Engine::External { http, .. } => *http,
        }
    }
    fn pid(&self) -> Option<u32> {
        match self {
            Engine::Started(e) => e.pid(),
            Engine::External { pid, .. } => *pid,
        }
    }
}

/// Runs a scenario and returns its report (also written to --json-out/--svg-out).
pub async fn execute(args: &RunArgs) -> anyhow::Result<Report> {
    let run_started = Instant::now();
    let mut scenario = Scenario::load(&args.scenario)?;
    if scenario.outage.is_some() {
        bail!("scenario {} has an [outage]: it runs as `fanout-loadtest run` does it (run::outage)", scenario.name);
    }
    if args.outage.is_some() || args.outage_start_seconds.is_some() || args.outage_seconds.is_some() {
        bail!("--outage, --outage-start-seconds and --outage-seconds apply to scenarios with an [outage] table");
    }
    scenario.override_rate(args.rate, args.duration_seconds)?;
    scenario.override_sizes(args.setup_concurrency, args.batch_size)?;
    if args.max_rss_mib.is_some() {
        scenario.max_peak_rss_mib = args.max_rss_mib;
    }
    let plan = Arc::new(Plan::new(&scenario));
    let mut machine = Machine::read();
    let ca_dir = tempfile::Builder::new().prefix("fanout-loadtest-ca-").tempdir()?;
    let (pki, ca_path) = match &args.pki_dir {
        Some(dir) => (TestPki::load_or_generate(dir)?, dir.join(fanout_testkit::pki::CA_FILE)),
        None => (TestPki::generate(&[]).context("generating test PKI")?, ca_dir.path().join("mock-ca.pem")),
    };
    let ca_path = args.ca_out.clone().unwrap_or(ca_path);
    pki.write_ca(&ca_path)?;

    let progress = Progress::new();
    let printer = progress.spawn_printer();
    let store = Store::from_nodes(&args.scylla_nodes, args.scylla_replication_factor.unwrap_or(1))?;
    let result = execute_inner(args, &scenario, &plan, &pki, &ca_path, &progress, &store).await;
    printer.abort();
    // The engine stops (killed) before its keyspace goes: a node still
    // running would log the dropped tables as failures.
    let result = result.map(|(report, _engine)| report);
    if !args.keep_keyspace
        && let Err(e) = store.drop_keyspace().await
    {
        eprintln!("the run's keyspace was left behind: {e:#}");
    }
    let mut report = result?;
    machine.loadavg_end = report::loadavg();
    report.machine = machine;
    report.run_seconds = run_started.elapsed().as_secs_f64();
    report.judge();
    progress.say("");
    if let Some(path) = &args.json_out {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.svg_out {
        std::fs::write(path, svg::render(&report)).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

async fn execute_inner(
    args: &RunArgs,
    scenario: &Scenario,
    plan: &Arc<Plan>,
    pki: &TestPki,
    ca_path: &Path,
    progress: &Arc<Progress>,
    store: &Store,
) -> anyhow::Result<(Report, Engine)> {
    let started_at_unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let expected_all = plan.expected_deliveries(plan.envelopes);
    progress.say(&format!(
        "scenario {}: {} recipients, {} topics, {} subscriptions, {} envelopes, {} deliveries",
        scenario.name,
        plan.recipients,
        plan.topics(),
        plan.total_subscriptions(),
        plan.envelopes,
        expected_all
    ));

    // The APNs peer; Pushy's is built first if needed (Maven, minutes the first time).
    let peer = match args.apns_server {
        ApnsServer::Rust => {
            if args.with_pushy_client {
                check_pushy_scenario(scenario, "--with-pushy-client")?;
            }
            ApnsPeer::Rust
        }
        ApnsServer::Pushy => {
            check_pushy_scenario(scenario, "--apns-server pushy")?;
            progress.phase("building the Pushy peer (loadtest/pushy)", 0);
            let classpath = tokio::task::spawn_blocking(pushy::ensure_built).await??;
            let server =
                pushy::ServerOptions { threads: args.pushy_server_threads.max(1), validate: !args.pushy_accept_all };
            ApnsPeer::Pushy { classpath, server, warmup: args.pushy_warmup() }
        }
    };

    // 1. The ceiling, on an otherwise idle machine (no engine yet).
    let ceiling = if args.with_ceiling {
        let requests = ceiling_requests(scenario, plan);
        let c = measure_ceiling(pki, &peer, scenario, plan, requests, scenario.ceiling.concurrency, progress).await?;
        progress.say(&format!("ceiling: {:.0} requests/s over {} requests", c.requests_per_second, c.requests));
        Some(c)
    } else {
        None
    };

    let h2load = if args.with_h2load {
        let requests = ceiling_requests(scenario, plan);
        let h = measure_h2load(pki, &peer, scenario, plan, requests, args.h2load_connections, progress).await?;
        progress.say(&format!("h2load: {:.0} requests/s over {} requests", h.requests_per_second, h.requests));
        Some(h)
    } else {
        None
    };

    // Pushy's client, as many pushes as the engine will send, into the same kind of server.
    let pushy_client = match &peer {
        ApnsPeer::Pushy { classpath, server, .. } if !args.no_pushy_client => {
            let peer = pushy::ClientPeer::Pushy(*server);
            Some(measure_pushy(args, classpath, peer, pki, scenario, plan, expected_all, progress).await?)
        }
        ApnsPeer::Rust if args.with_pushy_client => {
            progress.phase("building Pushy's client (loadtest/pushy)", 0);
            let classpath = tokio::task::spawn_blocking(pushy::ensure_built).await??;
            let peer = pushy::ClientPeer::HarnessMock;
            Some(measure_pushy(args, &classpath, peer, pki, scenario, plan, expected_all, progress).await?)
        }
        _ => None,
    };

    let cql_ceiling = if args.with_cql_ceiling {
        progress.phase("CQL ceiling (the same driver, no engine)", 0);
        let c = cql_ceiling::measure(&args.scylla_nodes).await?;
        progress.say(&format!(
            "CQL ceiling: {:.0} plain inserts/s, {:.0} conditional/s, {:.0} batched rows/s, {:.0} subscriber pages/s, \
             {:.0} joined subscribers/s",
            c.plain_inserts.per_second,
            c.conditional_inserts.per_second,
            c.batches.rows_per_second,
            c.subscriber_pages.per_second,
            c.subscriber_joins.rows_per_second
        ));
        Some(c)
    } else {
        None
    };

    // 2. Receivers and engine (or engines).
    let node_count = usize::from(args.engine_nodes.max(1));
    // Engines the harness starts on ScyllaDB lease their shards, one node
    // or several: the per-node figures are reported for them.
    let leasing = matches!(store, Store::Scylla { .. }) && args.engine_grpc.is_none();
    if node_count > 1 && (args.scylla_nodes.is_empty() || args.engine_grpc.is_some()) {
        bail!("--engine-nodes {node_count} needs --scylla-nodes: the nodes share one keyspace and split its shards");
    }
    if args.node_fault.is_some() && node_count < 2 {
        bail!("--node-fault needs --engine-nodes 2 or more: the others take the faulted node's shards");
    }
    let db_control = match args.db_fault {
        Some(_) if scenario.channel != ScenarioChannel::Http => {
            bail!("--db-fault goes with a webhook scenario: its registration churn registers webhooks")
        }
        Some(_) => Some(db_fault::DbControl::find()?),
        None => None,
    };
    if !(0.0..=1.0).contains(&args.fault_after) {
        bail!("--fault-after is a fraction of the expected deliveries, 0 to 1");
    }
    let ids = RunIds::fresh();
    let collector = Collector::new(plan.clone(), ids, scenario.faults.clone());
    let receivers = Receivers::start(pki, scenario, &collector, &peer).await?;
    let urls = receivers.urls();
    if let Store::Scylla { .. } = store {
        progress.say(&format!("store: {}", store.describe()));
    }
    let mut engine = match args.engine_grpc {
        Some(_) if matches!(scenario.channel, ScenarioChannel::Apns | ScenarioChannel::WebPush) => {
            bail!("apns and webpush scenarios sign with a key made for the run: let the harness start the engine")
        }
        Some(grpc) => {
            progress.say(&format!(
                "using the engine at {grpc}; it must trust {} and allow private addresses",
                ca_path.display()
            ));
            Engine::External { grpc, http: args.engine_http, pid: args.engine_pid }
        }
        None => {
            let explicit = args.engine_bin.clone();
            let building = progress.clone();
            // cargo may take minutes: a phase of its own, off the runtime's threads.
            let binary = tokio::task::spawn_blocking(move || {
                engine_process::find_binary(explicit.as_deref(), || building.phase("building the engine", 0))
            })
            .await??;
            // A relay scenario: the mock is the push server, with its secret;
            // an apns scenario: the mock APNs, with the run's provider key;
            // a webpush scenario: the run's VAPID key.
            let secret_file = ca_path.with_extension("relay-secret");
            let key_file = ca_path.with_extension("apns-key.p8");
            let vapid_key_file = ca_path.with_extension("vapid.pem");
            let target = match &receivers {
                Receivers::WebPush { key, .. } => {
                    key.write(&vapid_key_file).with_context(|| format!("writing {}", vapid_key_file.display()))?;
                    PushTarget::WebPush { vapid_key_file: &vapid_key_file }
                }
                Receivers::Apns { key, .. } | Receivers::Pushy { key, .. } => {
                    key.write_p8(&key_file)?;
                    PushTarget::Apns { url: &urls[0], key_file: &key_file }
                }
                Receivers::Webhooks(_) if plan.relay() => {
                    std::fs::write(&secret_file, collector::RELAY_SECRET)
                        .with_context(|| format!("writing {}", secret_file.display()))?;
                    PushTarget::Relay { url: &urls[0], secret_file: &secret_file }
                }
                Receivers::Webhooks(_) => PushTarget::Webhooks,
            };
            let config = engine_process::engine_config_for(&scenario.engine, ca_path, target)?;
            let launch = Launch {
                env: store.env(),
                log_level: if leasing { nodes::LOG_LEVEL.into() } else { "warn".into() },
                drain_timeout_seconds: 2,
                data_dir: args.data_dir.clone(),
                start_timeout: Duration::from_secs(scenario.timeouts.engine_start_seconds),
                ..Launch::new(&binary, config)
            };
            let e = launcher::Engine::start(launch).await?;
            let pid = e.pid().unwrap_or_default();
            progress.say(&format!("engine {} started (pid {pid}, gRPC {})", binary.display(), e.grpc));
            Engine::Started(e)
        }
    };
    // The other nodes, on the same keyspace with the same config, one after
    // the other (the first has made the schema).
    let mut others: Vec<launcher::Engine> = Vec::new();
    if node_count > 1 {
        let Engine::Started(first) = &engine else { bail!("--engine-nodes starts its engines itself") };
        for index in 1..node_count {
            let e = launcher::Engine::start(first.launch().clone()).await?;
            progress.say(&format!(
                "engine node {index} started (pid {}, gRPC {})",
                e.pid().unwrap_or_default(),
                e.grpc
            ));
            others.push(e);
        }
    }
    let node_handles: Vec<(Option<u32>, SocketAddr)> = match &engine {
        Engine::Started(first) if leasing => std::iter::once(first).chain(&others).map(|e| (e.pid(), e.http)).collect(),
        _ => vec![],
    };
    let shard_count = scenario.engine.get("shard_count").and_then(toml::Value::as_integer).unwrap_or(256) as u64;
    let settle_within = Duration::from_secs(30) + 6 * lease_ttl(scenario);
    if leasing {
        progress.phase("waiting for the nodes to split the shards", 0);
        nodes::wait_settled(&node_handles, shard_count, settle_within).await?;
    }
    let engine_info = EngineInfo {
        mode: if args.engine_grpc.is_some() { "external" } else { "subprocess" }.into(),
        binary: match &engine {
            Engine::Started(e) => Some(e.binary().display().to_string()),
            Engine::External { .. } => None,
        },
        pid: engine.pid(),
        grpc: engine.grpc().to_string(),
        store: match &engine {
            Engine::Started(_) => store.describe(),
            Engine::External { .. } => "external engine's".into(),
        },
        overrides: serde_json::to_value(&scenario.engine)?,
    };
    if let Some(pid) = engine.pid() {
        progress.engine_pid.store(u64::from(pid), std::sync::atomic::Ordering::Relaxed);
    }
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = engine.pid().map(|pid| {
        let samples = samples.clone();
        let t0 = Instant::now();
        tokio::spawn(async move {
            loop {
                if let Some(s) = proc_sample(pid) {
                    let mut v = samples.lock().unwrap_or_else(|p| p.into_inner());
                    v.push((t0.elapsed().as_secs_f64(), s.rss_kib as f64 / 1024.0));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    });

    // 3. Recipients and subscriptions.
    let connect_timeout = Duration::from_secs(scenario.timeouts.engine_start_seconds);
    let cluster = if node_count > 1 {
        let addresses: Vec<SocketAddr> = std::iter::once(engine.grpc()).chain(others.iter().map(|e| e.grpc)).collect();
        let faulty = args.node_fault.is_some() || args.db_fault.is_some();
        driver::Cluster::connect(&addresses, 2, connect_timeout, args.publish_via, faulty).await?
    } else {
        driver::Cluster::single(driver::Grpc::connect(engine.grpc(), 2, connect_timeout).await?, engine.grpc())
    };
    let setup = driver::setup(
        &cluster,
        plan,
        ids,
        &urls,
        &scenario.setup,
        progress,
        Duration::from_secs(scenario.timeouts.setup_seconds),
    )
    .await?;
    progress.say(&format!(
        "setup: {} recipients, {} subscriptions in {:.1} s ({:.0} recipients/s, {:.0} RPCs/s)",
        setup.recipients, setup.subscriptions, setup.seconds, setup.recipients_per_second, setup.rpcs_per_second
    ));

    // 4. Publish, then wait (bounded) for every expected delivery.
    progress.watch(collector.clone());
    // Found before the interval: the scan of /proc is not the harness's work per delivery.
    let database = local_server::listening_pids(&store.contact_points());
    let profiler = crate::profile::Profiler::attach(args.profile.as_deref(), engine.pid())?;
    let cpu_before = engine.pid().and_then(proc_sample).map(|s| s.cpu_seconds);
    let harness_cpu_before = own_cpu_seconds();
    let database_cpu_before = local_server::cpu_seconds(&database);
    let delivery_started = Instant::now();
    let publish_timeout = Duration::from_secs(
        scenario.timeouts.publish_seconds + plan.rate.map_or(0, |r| (plan.envelopes as f64 / r) as u64),
    );
    // Several nodes: each one's CPU, metrics and ownership now, then sampled
    // (a killed node keeps its last sample).
    let mut node_before = Vec::new();
    for &(pid, http) in &node_handles {
        node_before.push(nodes::read_node(pid, http).await);
    }
    let ownership_before: Vec<nodes::Ownership> = match &engine {
        Engine::Started(first) if leasing => {
            std::iter::once(first).chain(&others).map(|e| nodes::Ownership::from_log(&e.log())).collect()
        }
        _ => vec![],
    };
    let samplers = nodes::Samplers::start(&node_handles);
    let gave_up = std::sync::atomic::AtomicBool::new(false);
    let threshold = (expected_all as f64 * args.fault_after).ceil() as u64;
    let pause = 2 * lease_ttl(scenario);
    let victim = node_count - 1;
    // Registration going on beside a database fault.
    let churn = match args.db_fault {
        Some(_) => {
            let mut grpcs = Vec::new();
            let addresses: Vec<SocketAddr> =
                std::iter::once(engine.grpc()).chain(others.iter().map(|e| e.grpc)).collect();
            for address in addresses {
                grpcs.push(driver::Grpc::connect(address, 1, connect_timeout).await?);
            }
            Some(db_fault::Churn::start(grpcs, plan.clone(), ids, urls.clone(), CHURN_PER_SECOND))
        }
        None => None,
    };
    let fault = async {
        match (args.node_fault, others.last_mut()) {
            (Some(nodes::NodeFault::Roll), _) => {
                let Engine::Started(first) = &mut engine else { bail!("--node-fault roll starts its engines itself") };
                let all: Vec<&mut launcher::Engine> = std::iter::once(first).chain(others.iter_mut()).collect();
                // A stop hands the shards over, closes gRPC, then drains: each bounded by the drain timeout.
                let stop_within = Duration::from_secs(30);
                nodes::roll(
                    all,
                    &node_handles,
                    shard_count,
                    stop_within,
                    settle_within,
                    &collector,
                    threshold,
                    delivery_started,
                    &gave_up,
                )
                .await
            }
            (Some(kind), Some(engine)) => {
                nodes::inject(kind, engine, victim, &collector, threshold, pause, delivery_started, &gave_up).await
            }
            _ => Ok(None),
        }
    };
    // A database fault, with registration going on beside it.
    let db_node = args.db_fault_node.unwrap_or(1);
    let db_hold = Duration::from_secs(args.db_fault_seconds.unwrap_or(15));
    let db_fault = async {
        match (args.db_fault, &db_control) {
            (Some(kind), Some(control)) => {
                db_fault::inject(kind, control, db_node, &collector, threshold, db_hold, delivery_started, &gave_up)
                    .await
            }
            _ => Ok(None),
        }
    };
    let work = async {
        let publish =
            driver::publish(&cluster, plan, ids, &scenario.envelopes, &collector, progress, publish_timeout).await;
        if publish.is_ok() {
            progress.phase("drain", 0);
            let expected = collector.counts().expected;
            let complete = collector.wait_complete(expected, scenario.drain_timeout()).await;
            if complete {
                // Keep counting for a moment: late duplicates would show up now.
                tokio::time::sleep(Duration::from_millis(scenario.timeouts.settle_ms)).await;
            }
        }
        gave_up.store(true, std::sync::atomic::Ordering::Relaxed);
        publish
    };
    let (fault, publish, db_fault) = tokio::join!(fault, work, db_fault);
    let churn = match churn {
        Some(c) => Some(c.finish().await?),
        None => None,
    };
    let (fault, publish, mut db_fault) = (fault?, publish?, db_fault?);
    if let Some(f) = &db_fault {
        progress.say(&format!(
            "database fault: node {} {:?} at {:.1} s, back at {:.1} s",
            f.node, f.kind, f.at_seconds, f.back_at_seconds
        ));
    } else if args.db_fault.is_some() {
        bail!("the database fault never came: fewer than --fault-after of the deliveries arrived");
    }
    if let Some(f) = &fault {
        progress.say(&format!("fault: node {} {:?} at {:.1} s", f.node, f.kind, f.at_seconds));
        // A resumed node's late sends would show up now.
        tokio::time::sleep(Duration::from_millis(scenario.timeouts.settle_ms)).await;
    }
    let delivery_seconds = delivery_started.elapsed().as_secs_f64();
    let end_sample = engine.pid().and_then(proc_sample);
    let harness_cpu = harness_cpu_before.zip(own_cpu_seconds()).map(|(before, after)| after - before);
    let database_cpu = database_cpu_before
        .filter(|_| !database.is_empty())
        .zip(local_server::cpu_seconds(&database))
        .map(|(before, after)| after - before);
    let profile = profiler.map(crate::profile::Profiler::finish).transpose()?;
    if let Some(task) = sampler {
        task.abort();
    }
    let engine_metrics = match engine.http() {
        Some(http) => engine_process::fetch_metrics(http).await.unwrap_or_default(),
        None => Default::default(),
    };
    let deliveries = collector.summary();
    if let Some(f) = &mut db_fault {
        f.recovery = db_fault::Recovery::measure(&deliveries.per_second, f.at_seconds, f.back_at_seconds);
        f.churn = churn.unwrap_or_default();
    }
    let nodes_report = if leasing {
        let mut latest = samplers.finish();
        let all: Vec<&launcher::Engine> = match &engine {
            Engine::Started(first) => std::iter::once(first).chain(&others).collect(),
            Engine::External { .. } => vec![],
        };
        let mut figures = Vec::new();
        for (i, e) in all.iter().enumerate() {
            let now = nodes::read_node(e.pid(), e.http).await;
            let after = if now.metrics.is_empty() { std::mem::take(&mut latest[i]) } else { now };
            figures.push(nodes::NodeFigures {
                grpc: e.grpc.to_string(),
                pid: node_handles[i].0,
                before: node_before[i].clone(),
                after,
                ownership_before: ownership_before[i],
                ownership_after: nodes::Ownership::from_log(&e.log()),
            });
        }
        let d = &deliveries;
        let r = nodes::NodesReport::new(
            figures,
            fault,
            &setup,
            &publish,
            d.seconds,
            d.delivered,
            &d.duplicates_per_second,
            d.unacknowledged,
        );
        Some(r)
    } else {
        drop(samplers);
        None
    };
    let wire = receivers.wire();
    receivers.shutdown().await;
    let resources = end_sample.map(|s| {
        let during = cpu_before.map_or(0.0, |before| s.cpu_seconds - before);
        Resources {
            peak_rss_mib: s.hwm_kib as f64 / 1024.0,
            rss_samples_mib: samples.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            cpu_seconds_total: s.cpu_seconds,
            cpu_seconds_delivery: during,
            cores_busy_delivery: during / delivery_seconds.max(1e-9),
            harness_cpu_seconds_delivery: harness_cpu,
            database_cpu_seconds_delivery: database_cpu,
        }
    });
    let ratio = ceiling
        .as_ref()
        .filter(|c| c.requests_per_second > 0.0)
        .map(|c| deliveries.deliveries_per_second / c.requests_per_second);
    let ratio_h2load = h2load
        .as_ref()
        .filter(|h| h.requests_per_second > 0.0)
        .map(|h| deliveries.deliveries_per_second / h.requests_per_second);
    let ratio_pushy = pushy_client
        .as_ref()
        .and_then(|p| p.best())
        .filter(|b| b.pushes_per_second > 0.0)
        .map(|b| deliveries.deliveries_per_second / b.pushes_per_second);
    let ratio_cql = cql_ceiling.as_ref().map(|c| report::CqlRatios::new(c, &setup, &publish, &deliveries));
    let f = &scenario.faults;
    let report = Report {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        passed: false,
        failures: vec![],
        started_at_unix,
        run_seconds: 0.0,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: Machine::default(),
        engine: engine_info,
        plan: PlanInfo {
            recipients: plan.recipients,
            topics: plan.topics(),
            subscriptions: plan.total_subscriptions(),
            envelopes: plan.envelopes,
            rate_per_second: plan.rate,
            expected_deliveries: expected_all,
            receivers: scenario.mock.receivers,
            faults: if f.any() {
                format!(
                    "503 {:.3}, 500 {:.3}, 404 {:.3} on the first {} attempt(s); delay {:.3} ({} ms)",
                    f.status_503,
                    f.status_500,
                    f.status_404,
                    f.failed_attempts(),
                    f.delay,
                    f.delay_ms
                )
            } else {
                "none".into()
            },
            fault_free: !f.any(),
            max_duplicate_ratio: scenario.max_duplicate_ratio,
            max_peak_rss_mib: scenario.max_peak_rss_mib,
        },
        setup,
        publish,
        deliveries_by_outcome: report::deliveries_by_outcome(&engine_metrics),
        profile,
        windows: report::Windows {
            completed: engine_metrics.get("fanout_windows_total").copied().unwrap_or(0.0),
            replays: engine_metrics.get("fanout_window_replays_total").copied().unwrap_or(0.0),
        },
        deliveries,
        resources,
        engine_metrics,
        ratio_cql,
        cql_ceiling,
        ceiling,
        ratio,
        h2load,
        ratio_h2load,
        apns_server: match (&peer, scenario.channel) {
            (_, channel) if channel != ScenarioChannel::Apns => None,
            (ApnsPeer::Rust, _) => Some("rust".into()),
            (ApnsPeer::Pushy { server, warmup, .. }, _) => Some(format!(
                "pushy ({} MockApnsServer, {} event-loop thread(s), each warmed up by {warmup} pushes of Pushy's client \
                 and {warmup} of h2's)",
                if server.validate { "validating" } else { "accept-all" },
                server.threads,
            )),
        },
        pushy: pushy_client,
        ratio_pushy,
        wire: wire.map(WireReport::from),
        nodes: nodes_report,
        db_fault,
    };
    drop(others);
    Ok((report, engine))
}

#[cfg(test)]
mod tests {
    use super::args::{DEFAULT_PUSHY_IN_FLIGHT, DEFAULT_PUSHY_SERVER_THREADS};
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn run_flags_parse() {
        use clap::Parser as _;
        let cli = Cli::try_parse_from([
            "run",
            "--scenario",
            "s.toml",
            "--setup-concurrency",
            "16",
            "--batch-size",
            "1",
            "--scylla-nodes",
            "127.0.0.1:9042,10.0.0.2:9042",
        ])
        .unwrap();
        assert_eq!((cli.run.setup_concurrency, cli.run.batch_size), (Some(16), Some(1)));
        assert_eq!(cli.run.scylla_nodes, ["127.0.0.1:9042", "10.0.0.2:9042"]);
        assert!(!cli.run.keep_keyspace, "a run's keyspace is dropped unless asked");
        let keep = ["run", "--scenario", "s.toml", "--scylla-nodes", "127.0.0.1:9042", "--keep-keyspace"];
        assert!(Cli::try_parse_from(keep).unwrap().run.keep_keyspace);
        assert!(Cli::try_parse_from(["run", "--scenario", "s.toml", "--keep-keyspace"]).is_err(), "only with CQL");
        let pushy = Cli::try_parse_from(["run", "--scenario", "s.toml", "--apns-server", "pushy"]).unwrap();
        assert_eq!(pushy.run.apns_server, ApnsServer::Pushy);
        assert_eq!(pushy.run.pushy_connections, [1, 2, 4]);
        assert_eq!((pushy.run.pushy_in_flight, pushy.run.pushy_warmup()), (1000, 20_000));
        let pushy =
            Cli::try_parse_from(["run", "--scenario", "s.toml", "--apns-server", "pushy", "--pushy-accept-all"]);
        assert_eq!(pushy.unwrap().run.pushy_warmup(), 300_000);
        let pushy = Cli::try_parse_from(["run", "--scenario", "s.toml", "--pushy-connections", "1,8"]).unwrap();
        assert_eq!(pushy.run.pushy_warmup(), 300_000);
        assert_eq!((pushy.run.apns_server, pushy.run.pushy_connections), (ApnsServer::Rust, vec![1, 8]));
        let pushy = Cli::try_parse_from(["run", "--scenario", "s.toml", "--pushy-warmup", "7"]).unwrap();
        assert_eq!(pushy.run.pushy_warmup(), 7);
        assert!(Cli::try_parse_from(["run", "--scenario", "s.toml", "--apns-server", "java"]).is_err());
        let plain = Cli::try_parse_from(["run", "--scenario", "s.toml"]).unwrap();
        assert!(plain.run.scylla_nodes.is_empty() && plain.run.batch_size.is_none());
        // ScyllaDB is for an engine the harness starts, with no redb directory.
        for other in [["--data-dir", "/tmp/d"], ["--engine-grpc", "127.0.0.1:50051"]] {
            let mut argv =
                vec!["run", "--scenario", "s.toml", "--pki-dir", "/tmp/p", "--scylla-nodes", "127.0.0.1:9042"];
            argv.extend(other);
            assert!(Cli::try_parse_from(argv).is_err(), "{other:?}");
        }
    }

    #[test]
    fn engine_node_flags_parse() {
        use clap::Parser as _;
        let base = ["run", "--scenario", "s.toml", "--scylla-nodes", "127.0.0.1:9042"];
        let cli = Cli::try_parse_from(base.iter().chain(&["--engine-nodes", "3", "--node-fault", "pause"])).unwrap();
        assert_eq!((cli.run.engine_nodes, cli.run.node_fault), (3, Some(nodes::NodeFault::Pause)));
        assert_eq!(cli.run.fault_after, 0.3);
        let kill = Cli::try_parse_from(base.iter().chain(&["--node-fault", "kill", "--fault-after", "0.5"])).unwrap();
        assert_eq!((kill.run.node_fault, kill.run.fault_after), (Some(nodes::NodeFault::Kill), 0.5));
        assert_eq!(Cli::try_parse_from(base).unwrap().run.engine_nodes, 1);
        assert!(Cli::try_parse_from(base.iter().chain(&["--engine-nodes", "0"])).is_err());
        assert!(Cli::try_parse_from(base.iter().chain(&["--node-fault", "reboot"])).is_err());
    }

    #[test]
    fn db_fault_flags_parse() {
        use clap::Parser as _;
        let base = ["run", "--scenario", "s.toml", "--scylla-nodes", "127.0.0.1:9043,127.0.0.2:9043"];
        let flags = ["--db-fault", "pause", "--db-fault-node", "2", "--db-fault-seconds", "20"];
        let cli = Cli::try_parse_from(base.iter().chain(&flags).chain(&["--scylla-replication-factor", "3"])).unwrap();
        assert_eq!(
            (cli.run.db_fault, cli.run.db_fault_node, cli.run.db_fault_seconds, cli.run.scylla_replication_factor),
            (Some(db_fault::DbFault::Pause), Some(2), Some(20), Some(3))
        );
        let kill = Cli::try_parse_from(base.iter().chain(&["--db-fault", "kill"])).unwrap();
        assert_eq!((kill.run.db_fault, kill.run.db_fault_node), (Some(db_fault::DbFault::Kill), None));
        assert!(Cli::try_parse_from(base.iter().chain(&["--db-fault-node", "4"])).is_err(), "three nodes");
        let no_cql = ["run", "--scenario", "s.toml", "--db-fault", "kill"];
        assert!(Cli::try_parse_from(no_cql).is_err(), "a database fault needs the cluster");
    }

    /// `--engine-nodes` without ScyllaDB, a fault without a second node and
    /// a fraction outside 0..1 are refused before anything starts.
    #[tokio::test]
    async fn engine_node_runs_need_a_shared_store_and_a_second_node() {
        let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/nodes.toml");
        let run = |args: RunArgs| async move { execute(&args).await.unwrap_err().to_string() };
        let nodes = RunArgs { scenario: scenario.clone(), engine_nodes: 2, fault_after: 0.3, ..RunArgs::default() };
        assert!(run(nodes).await.contains("needs --scylla-nodes"));
        let scylla = vec!["127.0.0.1:1".to_string()];
        let fault = RunArgs {
            scenario: scenario.clone(),
            scylla_nodes: scylla.clone(),
            node_fault: Some(nodes::NodeFault::Kill),
            fault_after: 0.3,
            ..RunArgs::default()
        };
        assert!(run(fault).await.contains("needs --engine-nodes 2"));
        let fraction =
            RunArgs { scenario, scylla_nodes: scylla, engine_nodes: 2, fault_after: 1.5, ..RunArgs::default() };
        assert!(run(fraction).await.contains("--fault-after"));
    }

    /// Two engine nodes on a fresh keyspace of the CQL server at
    /// FANOUT_TEST_CQL (CI sets it; a visible skip without it), the second one
    /// killed (SIGKILL) once 30 % of the deliveries arrived, publishing
    /// going on: the survivor takes its shards and nothing is missing; the
    /// handoffs, the duplicates per handoff and both nodes' figures are in
    /// the report. Eight seconds of publishing (8,000 deliveries), about
    /// 40 s here with the debug engine.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_engine_nodes_one_killed_mid_window_lose_nothing() {
        let Some(cql) = fanout_testkit::outside_service::cql_server() else { return };
        let binary = tokio::task::spawn_blocking(|| launcher::build_binary(false)).await.unwrap().unwrap();
        let out = tempfile::tempdir().unwrap();
        let args = RunArgs {
            scenario: Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/nodes.toml"),
            engine_bin: Some(binary),
            scylla_nodes: cql.split(',').map(str::to_owned).collect(),
            engine_nodes: 2,
            node_fault: Some(nodes::NodeFault::Kill),
            fault_after: 0.3,
            duration_seconds: Some(8.0),
            json_out: Some(out.path().join("report.json")),
            ..RunArgs::default()
        };
        let report = execute(&args).await.unwrap();
        eprintln!("{}", report.text());
        let d = &report.deliveries;
        assert_eq!((d.missing, d.delivered), (0, report.plan.expected_deliveries), "{}", report.text());
        assert_eq!((report.publish.errors, d.bad_signatures), (0, 0), "{}", report.text());
        // The scenario's `max_duplicate_ratio` too: duplicates bounded by
        // what was in flight at the kill, not by whole windows.
        assert!(report.passed, "{}", report.text());
        let nodes = report.nodes.as_ref().expect("the nodes' figures");
        assert_eq!(nodes.nodes.len(), 2);
        let fault = nodes.fault.as_ref().expect("the fault happened");
        assert_eq!((fault.kind, fault.node), (nodes::NodeFault::Kill, 1));
        assert!(fault.delivered_before < d.expected, "the kill came before the end");
        assert!(nodes.nodes[0].ownership.acquired > 0, "the survivor took the killed node's shards");
        assert_eq!(nodes.handoffs, nodes.nodes.iter().map(|n| n.ownership.acquired).sum::<u64>());
        assert!(nodes.nodes.iter().all(|n| n.registration_rpcs > 0 && n.envelopes_stored > 0), "{nodes:?}");
        assert_eq!(nodes.nodes.iter().map(|n| n.envelopes_stored).sum::<u64>(), report.publish.stored);
        // Round-robin: each node took every other RPC and forwarded what the
        // other owned.
        assert!(nodes.forwarded > 0.0, "publishes of the other node's shards were forwarded");
        assert_eq!(nodes.nodes[1].owned_shards_end, None);
        assert!(report.text().contains("duplicates per handoff") || d.duplicates == 0, "{}", report.text());
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).unwrap()).unwrap();
        assert_eq!(json["nodes"]["fault"]["kind"], "kill");
        assert_eq!(json["nodes"]["nodes"].as_array().map(Vec::len), Some(2));
        assert!(json["nodes"]["handoffs"].as_u64().is_some_and(|h| h > 0));
    }

    /// Runs a checked-in scenario with a ceiling against the debug engine
    /// binary; every expected delivery arrived, properly signed.
    async fn run_passing(scenario: &str) -> Report {
        let binary = tokio::task::spawn_blocking(|| launcher::build_binary(false)).await.unwrap().unwrap();
        let args = RunArgs {
            scenario: Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(scenario),
            engine_bin: Some(binary),
            with_ceiling: true,
            ..RunArgs::default()
        };
        let report = execute(&args).await.unwrap();
        eprintln!("{}", report.text());
        assert!(report.passed, "{}", report.text());
        assert_eq!(report.deliveries.delivered, report.plan.expected_deliveries);
        assert_eq!(report.deliveries.bad_signatures, 0);
        assert!(report.ratio.is_some_and(|r| r > 0.0));
        report
    }

    /// The engine's metrics count every expected delivery as delivered on `channel`.
    fn assert_all_delivered_on(report: &Report, channel: &str) {
        let delivered = report.deliveries_by_outcome.get(&format!("{channel}/delivered"));
        assert_eq!(delivered.map(|n| *n as u64), Some(report.plan.expected_deliveries), "{channel}");
    }

    /// The relay scenario (spec 003) end to end: every device's push reaches
    /// the mock push server signed with X-Gim-Signature, with a ceiling.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relay_smoke_scenario_end_to_end() {
        run_passing("relay-smoke.toml").await;
    }

    /// The Web Push scenario end to end: every push reaches the
    /// mock push service with a VAPID token it verifies, and every body
    /// decrypts with the recipient's key (RFC 8291), with a ceiling made of
    /// the same encrypted, signed requests.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn webpush_smoke_scenario_end_to_end() {
        let report = run_passing("webpush-smoke.toml").await;
        assert_all_delivered_on(&report, "webpush");
        let ceiling = report.ceiling.as_ref().unwrap();
        assert_eq!((ceiling.ok, ceiling.failed), (ceiling.requests, 0));
    }

    /// The APNs scenario end to end: every push reaches the mock APNs with a
    /// provider token it verifies, and the report gives bytes per request
    /// for the engine and the ceiling.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn apns_smoke_scenario_end_to_end() {
        let report = run_passing("apns-smoke.toml").await;
        assert_all_delivered_on(&report, "apns");
        let wire = report.wire.as_ref().expect("the mock APNs counts the wire");
        assert_eq!(wire.counts.requests, report.deliveries.attempts);
        // The body is PUSH-259's (about 80 bytes); the header block carries
        // the provider token as a literal (an ES256 JWT, over 100 bytes).
        assert!((80.0..120.0).contains(&wire.data_bytes_per_request), "{wire:?}");
        assert!(wire.authorization_bytes_per_request > 100.0, "{wire:?}");
        assert!(wire.header_block_bytes_per_request > wire.authorization_bytes_per_request, "{wire:?}");
        let ceiling = report.ceiling.as_ref().unwrap();
        assert_eq!(ceiling.wire.map(|w| w.requests), Some(ceiling.requests));
        assert!(report.text().contains("bytes/request received"));
    }

    /// The APNs scenario into Pushy's validating MockApnsServer:
    /// the server verifies every provider token and device token and accepts
    /// every push the engine sends, and Pushy's own client sends as many
    /// into a fresh server, all accepted; the report has both rates and the
    /// ratio. Needs Java and Maven (loadtest/pushy is built on first use):
    /// skipped where they are missing, but CI (`.ci/run` installs them) must
    /// run it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn apns_smoke_scenario_into_pushy() {
        if !pushy_tools() {
            return;
        }
        let binary = tokio::task::spawn_blocking(|| launcher::build_binary(false)).await.unwrap().unwrap();
        let out = tempfile::tempdir().unwrap();
        let args = RunArgs {
            scenario: Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/apns-smoke.toml"),
            engine_bin: Some(binary),
            apns_server: ApnsServer::Pushy,
            pushy_connections: vec![1, 2],
            pushy_in_flight: DEFAULT_PUSHY_IN_FLIGHT,
            // More than the run's 600 pushes: both warm-ups go round them again,
            // and none of h2's warm-up lines may reach the engine's accounting.
            pushy_warmup: Some(1000),
            pushy_server_threads: DEFAULT_PUSHY_SERVER_THREADS,
            pushy_accept_all: false,
            json_out: Some(out.path().join("report.json")),
            ..RunArgs::default()
        };
        let report = execute(&args).await.unwrap();
        eprintln!("{}", report.text());
        assert!(report.passed, "{}", report.text());
        let d = &report.deliveries;
        assert_eq!((d.delivered, d.missing), (report.plan.expected_deliveries, 0));
        assert_eq!((d.bad_signatures, d.unexpected), (0, 0), "Pushy's server rejected none of the engine's pushes");
        assert_all_delivered_on(&report, "apns");
        assert!(report.apns_server.as_deref().is_some_and(|p| p.starts_with("pushy")));
        let pushy = report.pushy.as_ref().expect("Pushy's client was measured");
        assert_eq!(pushy.runs.iter().map(|r| r.connections).collect::<Vec<_>>(), [1, 2]);
        for run in &pushy.runs {
            assert!(run.clean(), "{run:?}");
            assert_eq!((run.pushes, run.accepted, run.warmup), (report.plan.expected_deliveries, run.pushes, 1000));
            assert_eq!(run.server_accepted, run.warmup_accepted + run.accepted);
            assert!(run.pushes_per_second > 0.0 && run.cpu_seconds > 0.0, "{run:?}");
        }
        assert!(report.ratio_pushy.is_some_and(|r| r > 0.0));
        assert!(report.text().contains("Pushy's best pushes/s"));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).unwrap()).unwrap();
        assert!(json["ratio_pushy"].as_f64().is_some_and(|r| r > 0.0));
        assert_eq!(json["pushy"]["runs"].as_array().map(Vec::len), Some(2));
    }

    /// Java and Maven are here, or the test must run anyway (CI installs them).
    fn pushy_tools() -> bool {
        let found = ["java", "mvn"].iter().all(|t| {
            std::process::Command::new(t)
                .arg("-version")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if !found && std::env::var_os("CI").is_none() {
            eprintln!("skipped: java or mvn is not installed");
            return false;
        }
        true
    }

    /// `--with-pushy-client` with the harness's mock: Pushy's client is
    /// measured into a fresh harness mock, which verifies its provider
    /// tokens as it does the engine's, and the report compares the two.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn apns_smoke_scenario_with_pushy_client_into_the_harness_mock() {
        if !pushy_tools() {
            return;
        }
        let binary = tokio::task::spawn_blocking(|| launcher::build_binary(false)).await.unwrap().unwrap();
        let args = RunArgs {
            scenario: Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/apns-smoke.toml"),
            engine_bin: Some(binary),
            with_pushy_client: true,
            pushy_connections: vec![1],
            pushy_in_flight: DEFAULT_PUSHY_IN_FLIGHT,
            pushy_warmup: Some(100),
            ..RunArgs::default()
        };
        let report = execute(&args).await.unwrap();
        eprintln!("{}", report.text());
        assert!(report.passed, "{}", report.text());
        assert_all_delivered_on(&report, "apns");
        assert_eq!(report.apns_server.as_deref(), Some("rust"));
        let pushy = report.pushy.as_ref().expect("Pushy's client was measured");
        let [run] = pushy.runs.as_slice() else { panic!("one configuration: {pushy:?}") };
        assert!(run.clean(), "{run:?}");
        assert_eq!((run.pushes, run.accepted, run.warmup), (report.plan.expected_deliveries, run.pushes, 100));
        assert_eq!(run.server_accepted, run.warmup_accepted + run.accepted, "the mock counted every push");
        assert!(report.ratio_pushy.is_some_and(|r| r > 0.0));
    }

    /// The harness's mock verifies Pushy's client's provider tokens: pushes
    /// signed with another key than the mock's are all refused, and counted
    /// as the mock's rejections, so such a measurement is never clean.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_harness_mock_refuses_pushy_tokens_of_another_key() {
        if !pushy_tools() {
            return;
        }
        let scenario =
            Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/apns-smoke.toml")).unwrap();
        let plan = Plan::new(&scenario);
        let ids = RunIds::fresh();
        let pki = TestPki::generate(&[]).unwrap();
        let (signing, mocks) = (ApnsTestKey::generate().unwrap(), ApnsTestKey::generate().unwrap());
        let files = pushy::PushyFiles::write(&pki, &signing, &plan, ids).unwrap();
        let pushes = files.path("pushes.txt");
        write_pushes(&plan, ids, 10, &pushes).unwrap();
        let classpath = tokio::task::spawn_blocking(pushy::ensure_built).await.unwrap().unwrap();
        let config = pushy::ClientConfig { connections: 1, in_flight: 10, warmup: 0, threads: 1 };
        let peer = pushy::ClientPeer::HarnessMock;
        let timeout = Duration::from_secs(60);
        let run =
            pushy::measure_client(&classpath, &files, &pushes, peer, (&pki, &mocks), config, timeout).await.unwrap();
        assert_eq!((run.pushes, run.accepted, run.rejected), (10, 0, 10), "{run:?}");
        assert_eq!((run.server_accepted, run.server_rejected), (0, 10), "{run:?}");
        assert!(run.first_rejection.as_deref().is_some_and(|r| r.contains("InvalidProviderToken")), "{run:?}");
        assert!(!run.clean());
    }

    /// Pushy's server as an apns scenario's receiver verifies every provider
    /// token, signed as the engine signs (JWS R || S): the run's key is
    /// accepted and reaches the collector as a delivery; another key's is
    /// rejected (INVALID_PROVIDER_TOKEN) and counted with the bad
    /// signatures, so a run would fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pushy_server_verifies_every_provider_token() {
        let Some((good, forged, s)) = push_with_the_runs_key_and_another(true).await else { return };
        assert_eq!((good, forged), (200, 403));
        assert_eq!((s.delivered, s.bad_signatures, s.unexpected), (1, 1, 0), "{s:?}");
        assert_eq!(s.statuses.get(&403), Some(&1));
    }

    /// `--pushy-accept-all`: the same two pushes are both accepted and
    /// delivered, nothing is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pushy_accept_all_server_checks_no_token() {
        let Some((good, forged, s)) = push_with_the_runs_key_and_another(false).await else { return };
        assert_eq!((good, forged), (200, 200));
        assert_eq!((s.delivered, s.bad_signatures, s.unexpected), (2, 0, 0), "{s:?}");
    }

    /// Into Pushy's server (`validate` or accept-all) of apns-smoke, the
    /// first delivery signed with the run's key, the second with another
    /// key: both answers' statuses and the collector's summary
    /// once every line is read. `None` without java and mvn (outside CI).
    async fn push_with_the_runs_key_and_another(validate: bool) -> Option<(u16, u16, collector::Summary)> {
        if !pushy_tools() {
            return None;
        }
        let scenario =
            Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/apns-smoke.toml")).unwrap();
        let plan = Arc::new(Plan::new(&scenario));
        let ids = RunIds::fresh();
        let collector = Collector::new(plan.clone(), ids, Faults::default());
        let classpath = tokio::task::spawn_blocking(pushy::ensure_built).await.unwrap().unwrap();
        let peer = ApnsPeer::Pushy { classpath, server: pushy::ServerOptions { threads: 1, validate }, warmup: 20 };
        let pki = TestPki::generate(&[]).unwrap();
        let receivers = Receivers::start(&pki, &scenario, &collector, &peer).await.unwrap();
        let targets = receivers.targets(&plan, ids).unwrap();
        collector.envelope_published(plan.topic_of_envelope(0), 1, Instant::now());
        let client = ceiling::client(&pki);
        let good = client.request(ceiling::request(&plan, ids, &targets, 0)).await.unwrap();
        let other = ApnsTestKey::generate().unwrap();
        let jwt = other.provider_token(
            APNS_KEY_ID,
            APNS_TEAM_ID,
            SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs(),
        );
        let forged = Targets {
            apns_authorization: Some(http::HeaderValue::try_from(format!("bearer {}", jwt.unwrap())).unwrap()),
            ..receivers.targets(&plan, ids).unwrap()
        };
        let forged = client.request(ceiling::request(&plan, ids, &forged, 1)).await.unwrap();
        receivers.shutdown().await; // every line read
        Some((good.status().as_u16(), forged.status().as_u16(), collector.summary()))
    }

    /// `--apns-server pushy` is refused, with the reason, for a scenario
    /// that is not apns or has faults, before anything starts.
    #[test]
    fn pushy_needs_a_fault_free_apns_scenario() {
        let scenario = |channel: &str, extra: &str| {
            Scenario::parse(&format!(
                "name = \"t\"\nchannel = \"{channel}\"\nrecipients = 1\ntopics = [{{ count = 1, subscribers = 1 }}]\n\
                 [envelopes]\nper_topic = 1\n{extra}"
            ))
            .unwrap()
        };
        for flag in ["--apns-server pushy", "--with-pushy-client"] {
            let err = check_pushy_scenario(&scenario("http", ""), flag).unwrap_err().to_string();
            assert!(err.starts_with(flag) && err.contains("is for apns scenarios"), "{err}");
            let faults = scenario("apns", "[faults]\nstatus_503 = 0.1");
            let err = check_pushy_scenario(&faults, flag).unwrap_err().to_string();
            assert!(err.contains("has faults"), "{err}");
            let smoke =
                Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/apns-smoke.toml")).unwrap();
            check_pushy_scenario(&smoke, flag).unwrap();
        }
    }

    /// The smoke scenario end to end against the real `fanout` binary (built
    /// in debug like the e2e tests; about 10 s here). Also checks that the
    /// reports are written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn smoke_scenario_end_to_end() {
        let binary = tokio::task::spawn_blocking(|| launcher::build_binary(false)).await.unwrap().unwrap();
        let out = tempfile::tempdir().unwrap();
        let args = RunArgs {
            scenario: Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/smoke.toml"),
            engine_bin: Some(binary),
            with_ceiling: true,
            // The independent ceiling where h2load is installed;
            // CI (.ci/run installs it) must measure it.
            with_h2load: h2load::available() || std::env::var_os("CI").is_some(),
            h2load_connections: 1,
            json_out: Some(out.path().join("report.json")),
            svg_out: Some(out.path().join("report.svg")),
            ..RunArgs::default()
        };
        let report = execute(&args).await.unwrap();
        eprintln!("{}", report.text());
        assert!(report.passed, "{}", report.text());
        assert_eq!(report.deliveries.missing, 0);
        assert_eq!(report.deliveries.delivered, report.plan.expected_deliveries);
        assert!(report.deliveries.deliveries_per_second > 0.0);
        match report.h2load.as_ref() {
            Some(h2load) => {
                assert_eq!((h2load.ok, h2load.failed), (h2load.requests, 0), "{h2load:?}");
                assert!(report.ratio_h2load.is_some_and(|r| r > 0.0));
                // Clock ticks: a short run may have cost 0.00 s.
                assert!(h2load.cpu_seconds.is_some_and(|cpu| cpu >= 0.0), "{h2load:?}");
            }
            None => eprintln!("h2load not measured: not installed (Debian package {})", h2load::PACKAGE),
        }
        assert!(report.ratio.is_some_and(|r| r > 0.0));
        assert!(report.resources.as_ref().is_some_and(|r| r.peak_rss_mib > 0.0));
        assert!(report.resources.as_ref().is_some_and(|r| r.harness_cpu_seconds_delivery.is_some()));
        assert_all_delivered_on(&report, "http");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).unwrap()).unwrap();
        assert_eq!(json["deliveries"]["missing"], 0);
        assert!(std::fs::read_to_string(out.path().join("report.svg")).unwrap().contains("</svg>"));
    }
}
