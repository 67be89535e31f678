//! The platform channels (APNs, FCM) of the `gateway` and `relay-ingress`
//! runs, pointed at the testkit mocks: their `[engine.channels]` tables for
//! the engine under test, and the ceiling those runs compare against: the
//! engine's own providers, built from the same tables (same pool, same
//! client stack), sending the run's pushes alone, with no HTTP edge,
//! signature, store or worker in between.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use fanout_engine::channel::{ChannelContext, ChannelSettings, Channels, Outcome, Push, RelayPriority, RelayedPush};
use fanout_engine::domain::Channel;
use fanout_engine::metrics::Metrics;
use fanout_testkit::launcher::{self, Launch};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value};

use crate::profile::{ProfileSummary, Profiler};
use crate::run::cql_ceiling::{self, CqlCeiling};
use crate::run::engine_process::{APNS_BUNDLE_ID, APNS_KEY_ID, APNS_TEAM_ID, Store, own_cpu_seconds, proc_sample};

/// The options of every run against the platform mocks.
#[derive(clap::Args, Debug, Clone)]
pub struct PlatformRunArgs {
    /// Also measure the ceiling and report the ratio.
    #[arg(long)]
    pub with_ceiling: bool,
    /// Use the release binary (built if missing).
    #[arg(long)]
    pub release: bool,
    /// The `fanout` binary to run, instead of the workspace's (built if
    /// missing): for comparing two builds with the same harness.
    #[arg(long)]
    pub engine_bin: Option<PathBuf>,
    /// Sample the engine with `perf` during the load: PATH.perf.data, the
    /// flat profile in PATH.txt, its top lines in the report.
    #[arg(long, value_name = "PATH")]
    pub profile: Option<PathBuf>,
    /// Write the JSON report here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// How long to wait for the last provider request.
    #[arg(long, default_value_t = 120)]
    pub drain_seconds: u64,
    /// Start the engine on the ScyllaDB/Cassandra backend at these contact
    /// points (host:port, comma-separated) instead of the embedded store, in
    /// a keyspace made for the run (fanout_loadtest_<random>), dropped once
    /// the engine stopped.
    #[arg(long, value_delimiter = ',')]
    pub scylla_nodes: Vec<String>,
    /// With --scylla-nodes: before the engine starts, measure what the CQL
    /// server does for a plain client (`run --with-cql-ceiling`'s statements;
    /// the conditional inserts are the kind the gateway's claims and window
    /// state and the relay ingress's ledger use) and report it beside the run.
    #[arg(long, requires = "scylla_nodes")]
    pub with_cql_ceiling: bool,
}

impl PlatformRunArgs {
    /// A short run's options for the tests: the ceiling measured, the
    /// workspace's debug binary, the embedded store.
    #[cfg(test)]
    pub fn for_tests() -> Self {
        Self {
            with_ceiling: true,
            release: false,
            engine_bin: None,
            profile: None,
            json_out: None,
            drain_seconds: 30,
            scylla_nodes: Vec::new(),
            with_cql_ceiling: false,
        }
    }

    /// The run's store: `--scylla-nodes` in a keyspace of its own, else redb.
    pub fn store(&self) -> anyhow::Result<Store> {
        Store::from_nodes(&self.scylla_nodes, 1)
    }

    /// `--with-cql-ceiling`'s figures, when asked for.
    pub async fn cql_ceiling(&self) -> anyhow::Result<Option<CqlCeiling>> {
        if !self.with_cql_ceiling {
            return Ok(None);
        }
        Ok(Some(cql_ceiling::measure(&self.scylla_nodes).await?))
    }

    /// The engine under test: `binary` with `config`, on `store`.
    pub fn launch(&self, store: &Store, config: String) -> anyhow::Result<Launch> {
        let binary = match &self.engine_bin {
            Some(binary) => binary.clone(),
            None => launcher::build_binary(self.release)?,
        };
        let mut launch = Launch::new(binary, config);
        launch.env = store.env();
        Ok(launch)
    }
}

/// The engine over a run's measured interval: its CPU time, the harness's
/// own (the load's client and signing, and the mock providers), and with
/// `--profile`, where the engine's went.
pub struct EngineMeter {
    pid: Option<u32>,
    cpu_before: Option<f64>,
    harness_before: Option<f64>,
    profiler: Option<Profiler>,
}

/// CPU time per unit of work over a measured interval.
#[derive(Debug)]
pub struct Metered {
    /// The engine's user + system time per unit, in µs.
    pub engine_cpu_us: Option<f64>,
    /// The harness's: the load's client and its signing and the mock
    /// providers answering, per unit, in µs.
    pub harness_cpu_us: Option<f64>,
    pub profile: Option<ProfileSummary>,
}

fn per_unit(before: Option<f64>, after: Option<f64>, units: u64) -> Option<f64> {
    before.zip(after).map(|(before, after)| (after - before) * 1e6 / units.max(1) as f64)
}

impl EngineMeter {
    /// Starts measuring engine `pid` now.
    pub fn start(args: &PlatformRunArgs, pid: Option<u32>) -> anyhow::Result<Self> {
        let profiler = Profiler::attach(args.profile.as_deref(), pid)?;
        let cpu_before = pid.and_then(proc_sample).map(|s| s.cpu_seconds);
        Ok(Self { pid, cpu_before, harness_before: own_cpu_seconds(), profiler })
    }

    /// Ends the interval (`units` of work done in it).
    pub fn finish(self, units: u64) -> anyhow::Result<Metered> {
        let cpu_after = self.pid.and_then(proc_sample).map(|s| s.cpu_seconds);
        Ok(Metered {
            engine_cpu_us: per_unit(self.cpu_before, cpu_after, units),
            harness_cpu_us: per_unit(self.harness_before, own_cpu_seconds(), units),
            profile: self.profiler.map(Profiler::finish).transpose()?,
        })
    }
}

/// The load's HTTP/1.1 client: keep-alive connections, as a hub or a
/// Station keeps them to the engine.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client keeping up to `concurrency` idle connections.
pub fn http_client(concurrency: usize) -> HttpClient {
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(concurrency.max(1)).build_http()
}

/// A path as a TOML string.
pub fn quote(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// `[engine.channels.fcm]` at the mock FCM; `dir` holds its service account
/// (`sa.json`) and the mocks' CA (`ca.pem`).
pub fn fcm_table(dir: &Path, base_url: &str) -> String {
    format!(
        "[engine.channels.fcm]\nservice_account_file = {}\nbase_url = \"{base_url}\"\nextra_ca_files = [{}]\n",
        quote(&dir.join("sa.json")),
        quote(&dir.join("ca.pem")),
    )
}

/// `[engine.channels.apns]` with both hosts at the mock APNs; `dir` holds
/// the provider key (`AuthKey.p8`) and the mocks' CA (`ca.pem`).
pub fn apns_table(dir: &Path, base_url: &str) -> String {
    format!(
        "[engine.channels.apns]\nkey_file = {}\nkey_id = \"{APNS_KEY_ID}\"\nteam_id = \"{APNS_TEAM_ID}\"\n\
         bundle_id = \"{APNS_BUNDLE_ID}\"\nenvironment = \"sandbox\"\nsandbox_url = \"{base_url}\"\n\
         production_url = \"{base_url}\"\nextra_ca_files = [{}]\n",
        quote(&dir.join("AuthKey.p8")),
        quote(&dir.join("ca.pem")),
    )
}

/// The engine's channels built from `tables` (`[engine.channels.*]` text,
/// as the engine under test reads it).
pub fn channels(tables: &str) -> anyhow::Result<Channels> {
    let settings: ChannelSettings = toml::from_str::<toml::Table>(tables)?
        .get("engine")
        .and_then(|e| e.get("channels"))
        .cloned()
        .context("no [engine.channels] table")?
        .try_into()?;
    Ok(Channels::build(&settings, &ChannelContext::new(Arc::new(Metrics::new())))?)
}

/// One push for a platform channel: an owned [`RelayedPush`].
#[derive(Debug, Clone)]
pub struct PlatformPush {
    pub channel: Channel,
    pub token: String,
    pub app_id: Option<String>,
    pub sandbox: bool,
    pub collapse_id: Option<String>,
    pub priority: RelayPriority,
    pub payload: Map<String, Value>,
    pub ttl: Duration,
}

impl PlatformPush {
    pub fn relayed(&self) -> RelayedPush<'_> {
        RelayedPush {
            token: &self.token,
            app_id: self.app_id.as_deref(),
            sandbox: self.sandbox,
            collapse_id: self.collapse_id.as_deref(),
            priority: self.priority,
            payload: &self.payload,
            ttl: self.ttl,
            web_push_keys: None,
        }
    }
}

/// The ceiling's figures.
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    pub requests_per_second: f64,
    /// The harness's CPU per request: the channel sending and the mock
    /// provider answering, everything the ceiling runs, in µs.
    pub cpu_us_per_request: Option<f64>,
}

/// The ceiling: pushes `0..count` (`push(i)` makes the i-th) sent by the
/// engine's own providers with `concurrency` in flight. Every push must be
/// delivered.
pub async fn ceiling(
    channels: &Channels,
    count: u64,
    concurrency: usize,
    push: impl Fn(u64) -> anyhow::Result<PlatformPush> + Send + Sync + 'static,
) -> anyhow::Result<Ceiling> {
    let push = Arc::new(push);
    let next = Arc::new(AtomicU64::new(0));
    let cpu_before = own_cpu_seconds();
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (channels, next, push) = (channels.clone(), next.clone(), push.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<(), anyhow::Error>(());
                }
                let push = push(i)?;
                let provider = channels.get(push.channel).with_context(|| format!("no {:?} channel", push.channel))?;
                match provider.send(Push::Relayed(push.relayed())).await {
                    Ok(Outcome::Delivered) => {}
                    other => bail!("ceiling request answered {other:?}"),
                }
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok(Ceiling {
        requests_per_second: count as f64 / started.elapsed().as_secs_f64().max(1e-6),
        cpu_us_per_request: per_unit(cpu_before, own_cpu_seconds(), count),
    })
}

/// When a mock received a request, on this process's monotonic clock.
pub fn arrival(received_at: SystemTime) -> Instant {
    Instant::now() - SystemTime::now().duration_since(received_at).unwrap_or_default()
}
