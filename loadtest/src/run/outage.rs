//! Mixed-channel scenarios with a provider outage (`channel = "mixed"` and
//! an `[outage]` table, e.g. `loadtest/scenarios/outage.toml`): do channels
//! fail alone?
//!
//! Even recipients register a webhook (answered at once by the harness's
//! receivers), odd ones an APNs device (the harness's mock APNs), all on the
//! same topics. One invocation runs the scenario twice, each time with a
//! fresh engine on a fresh embedded store, fresh mocks and fresh identities:
//! first the **baseline** (APNs healthy throughout), then **with the
//! outage** (the mock APNs hangs, refuses connections, stalls in the TLS
//! handshake, answers slowly or answers 503 from `start_seconds` after the
//! first publish for `duration_seconds`, then is healthy again on the same
//! address). Per channel and phase it reports deliveries/s and completion
//! time, the pace during the outage and what arrived after it, missing and
//! duplicate deliveries, and the engine's final outcomes (a delivery the
//! engine gave up after `max_attempts` is `exhausted`, spec 000 section 7;
//! one neither delivered nor given up is `unaccounted`), plus the engine's
//! peak RSS and CPU. The headline is the healthy channel's pace during the
//! outage ÷ its pace in the baseline.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use fanout_testkit::launcher::{self, Launch};
use fanout_testkit::mock::apns::{ApnsTestKey, MockApnsConfig};
use fanout_testkit::mock::webhook::{MockWebhook, MockWebhookConfig};
use fanout_testkit::{OutageKind, TestPki};
use serde::Serialize;

use super::args::{ApnsServer, RunArgs};
use super::collector::{ChannelTally, Collector};
use super::driver::{self, PublishStats};
use super::engine_process::{self, PushTarget, harness_apns_config, own_cpu_seconds, proc_sample};
use super::ids::RunIds;
use super::progress::Progress;
use super::report::{Machine, loadavg};
use super::scenario::{Faults, OutageSettings, Plan, Scenario, ScenarioChannel};

/// The engine's final outcomes besides `delivered` (`fanout_deliveries_total`).
const GIVEN_UP: [&str; 4] = ["exhausted", "rejected", "mismatch", "terminal"];

/// How often the wait for the last deliveries reads the engine's metrics.
const POLL: Duration = Duration::from_millis(250);

/// The two channels of a mixed scenario, as the report names them.
const CHANNELS: [(ScenarioChannel, &str); 2] = [(ScenarioChannel::Http, "http"), (ScenarioChannel::Apns, "apns")];

/// Deliveries that arrived within a stretch of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Stretch {
    pub deliveries: u64,
    /// From the stretch's start to its end (or to the channel's last
    /// delivery, when that came first).
    pub seconds: f64,
    pub per_second: f64,
    /// From the stretch's start to its first delivery.
    pub first_after_seconds: Option<f64>,
}

/// One channel in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct ChannelFigures {
    pub channel: String,
    /// (envelope, recipient) pairs of the stored envelopes on this channel.
    pub expected: u64,
    /// Pairs answered 2xx at least once.
    pub delivered: u64,
    /// expected − delivered.
    pub missing: u64,
    pub duplicates: u64,
    /// The engine's `fanout_deliveries_total` for this channel, by outcome.
    pub outcomes: BTreeMap<String, u64>,
    /// Given up by the engine after `max_attempts` transient attempts.
    pub exhausted: u64,
    /// Neither delivered nor given up (exhausted, rejected, mismatch,
    /// terminal) by the end of the wait: lost, or still held.
    pub unaccounted: u64,
    /// Deliveries the engine parked to a row, by reason
    /// (`fanout_parked_total`): with every provider healthy, none should be.
    pub parked: BTreeMap<String, u64>,
    /// From the first Publish RPC to the last first delivery.
    pub completion_seconds: f64,
    /// delivered ÷ completion_seconds.
    pub deliveries_per_second: f64,
    /// Within the outage (phase with the outage only; `None` when the
    /// channel had finished before it started).
    pub during_outage: Option<Stretch>,
    /// After the outage ended (phase with the outage only).
    pub after_outage: Option<Stretch>,
    /// First deliveries in each second since the first publish.
    pub per_second: Vec<u64>,
}

/// One run of the scenario: the baseline, or the one with the outage.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// `None` for the baseline.
    pub outage: Option<String>,
    /// The outage's window, seconds after the first publish.
    pub outage_from_seconds: Option<f64>,
    pub outage_to_seconds: Option<f64>,
    /// Requests the mock APNs held, slowed or answered 503, and TLS
    /// handshakes it stalled (refused connections are not seen by it).
    pub outage_met: u64,
    pub http: ChannelFigures,
    pub apns: ChannelFigures,
    pub setup_seconds: f64,
    pub publish: PublishStats,
    /// Requests with a bad signature or provider token (the run fails).
    pub bad_signatures: u64,
    /// Requests for no expected delivery.
    pub unexpected: u64,
    /// Every channel's deliveries settled (delivered or given up) before the wait's bound.
    pub settled: bool,
    /// From the first publish to the end of the wait.
    pub seconds: f64,
    /// The engine's VmHWM at the end of the phase.
    pub peak_rss_mib: Option<f64>,
    /// The engine's CPU from the first publish to the end of the wait.
    pub cpu_seconds: Option<f64>,
    /// The harness's own CPU over the same time: its mock receivers (the
    /// mock APNs answering an outage's retries too), collector and publisher.
    pub harness_cpu_seconds: Option<f64>,
    /// Windows completed, and replayed from the checkpoint after
    /// `window_timeout_seconds` without an answered first attempt
    /// (`fanout_windows_total`, `fanout_window_replays_total`).
    pub windows: u64,
    pub window_replays: u64,
}

impl Phase {
    fn channel(&self, channel: ScenarioChannel) -> &ChannelFigures {
        match channel {
            ScenarioChannel::Apns => &self.apns,
            _ => &self.http,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct OutageReport {
    pub scenario: String,
    pub description: String,
    pub passed: bool,
    pub failures: Vec<String>,
    pub command: String,
    pub started_at_unix: u64,
    pub run_seconds: f64,
    pub machine: Machine,
    pub engine_binary: String,
    pub recipients: u32,
    pub topics: u32,
    pub envelopes: u64,
    /// `hang`, `refuse`, `tls-stall`, `slow (N ms)` or `503`, of the mock APNs.
    pub outage: String,
    pub outage_start_seconds: f64,
    pub outage_duration_seconds: f64,
    /// The engine's `max_attempts` (spec 000 section 7).
    pub max_attempts: u32,
    pub baseline: Phase,
    pub with_outage: Phase,
    /// The healthy channel's (HTTPS) deliveries/s during the outage ÷ its
    /// deliveries/s in the baseline.
    pub healthy_pace_ratio: Option<f64>,
    /// The healthy channel's completion time in the baseline ÷ with the outage.
    pub healthy_completion_ratio: Option<f64>,
    /// The least `healthy_pace_ratio` that passes.
    pub min_pace_ratio: f64,
}

/// Whether the scenario at `path` is a mixed one with an outage.
pub fn is_outage_scenario(path: &Path) -> anyhow::Result<bool> {
    Ok(Scenario::load(path)?.outage.is_some())
}

/// `fanout-loadtest run` for a scenario with an `[outage]`: runs it, prints
/// the summary, writes `--json-out`; fails when the run did.
pub async fn run_command(args: &RunArgs) -> anyhow::Result<()> {
    let report = execute(args).await?;
    println!("{}", report.text());
    if !report.passed {
        bail!("scenario {} failed: {}", report.scenario, report.failures.join("; "));
    }
    Ok(())
}

/// Refuses the `run` flags that have no meaning here, before anything starts.
fn check_flags(args: &RunArgs) -> anyhow::Result<()> {
    let unsupported = [
        (args.with_ceiling, "--with-ceiling"),
        (args.with_h2load, "--with-h2load"),
        (args.engine_grpc.is_some(), "--engine-grpc"),
        (!args.scylla_nodes.is_empty(), "--scylla-nodes"),
        (args.engine_nodes > 1, "--engine-nodes"),
        (args.node_fault.is_some(), "--node-fault"),
        (args.apns_server != ApnsServer::Rust, "--apns-server"),
        (args.with_pushy_client, "--with-pushy-client"),
        (args.svg_out.is_some(), "--svg-out"),
        (args.data_dir.is_some(), "--data-dir"),
        (args.rate.is_some() || args.duration_seconds.is_some(), "--rate/--duration-seconds"),
    ];
    let given: Vec<&str> = unsupported.iter().filter(|(on, _)| *on).map(|(_, flag)| *flag).collect();
    if !given.is_empty() {
        bail!(
            "{} not supported with an outage scenario: it starts its own engine twice, on the embedded store",
            given.join(", ")
        );
    }
    Ok(())
}

pub async fn execute(args: &RunArgs) -> anyhow::Result<OutageReport> {
    let run_started = Instant::now();
    check_flags(args)?;
    let mut scenario = Scenario::load(&args.scenario)?;
    scenario.override_sizes(args.setup_concurrency, args.batch_size)?;
    scenario.override_outage(args.outage.as_deref(), args.outage_start_seconds, args.outage_seconds)?;
    let settings = scenario.outage.clone().context("the scenario has no [outage] table")?;
    let kind = settings.kind()?;
    let plan = Arc::new(Plan::new(&scenario));
    let mut machine = Machine::read();
    let started_at_unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let pki = TestPki::generate(&[]).context("generating test PKI")?;
    let dir = tempfile::Builder::new().prefix("fanout-loadtest-outage-").tempdir()?;
    let ca_path = args.ca_out.clone().unwrap_or_else(|| dir.path().join("mock-ca.pem"));
    pki.write_ca(&ca_path)?;

    let progress = Progress::new();
    let printer = progress.spawn_printer();
    let explicit = args.engine_bin.clone();
    let building = progress.clone();
    let binary = tokio::task::spawn_blocking(move || {
        engine_process::find_binary(explicit.as_deref(), || building.phase("building the engine", 0))
    })
    .await??;
    progress.say(&format!(
        "scenario {}: {} recipients (webhooks and APNs devices alternating), {} topics, {} envelopes, {} deliveries; \
         outage of the mock APNs: {kind} from {:.1} s after the first publish for {:.1} s",
        scenario.name,
        plan.recipients,
        plan.topics(),
        plan.envelopes,
        plan.expected_deliveries(plan.envelopes),
        settings.start_seconds,
        settings.duration_seconds
    ));
    let phases = async {
        progress.say("baseline: the same scenario with APNs healthy throughout");
        let baseline = phase(&scenario, &plan, &pki, &ca_path, &binary, dir.path(), None, &progress).await?;
        progress.say(&format!("with the outage: APNs {kind}"));
        let outage = Some((kind, &settings));
        let with_outage = phase(&scenario, &plan, &pki, &ca_path, &binary, dir.path(), outage, &progress).await?;
        anyhow::Ok((baseline, with_outage))
    };
    let result = phases.await;
    printer.abort();
    progress.say("");
    let (baseline, with_outage) = result?;
    machine.loadavg_end = loadavg();
    let mut report = OutageReport {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        passed: false,
        failures: vec![],
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_at_unix,
        run_seconds: run_started.elapsed().as_secs_f64(),
        machine,
        engine_binary: binary.display().to_string(),
        recipients: plan.recipients,
        topics: plan.topics(),
        envelopes: plan.envelopes,
        outage: kind.to_string(),
        outage_start_seconds: settings.start_seconds,
        outage_duration_seconds: settings.duration_seconds,
        max_attempts: scenario.max_attempts(),
        healthy_pace_ratio: None,
        healthy_completion_ratio: None,
        min_pace_ratio: settings.min_pace_ratio,
        baseline,
        with_outage,
    };
    report.judge(scenario.max_duplicate_ratio);
    if let Some(path) = &args.json_out {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

/// One run of the scenario on a fresh engine, store and mocks; with
/// `outage`, the mock APNs fails as it says during its window.
#[allow(clippy::too_many_arguments)]
async fn phase(
    scenario: &Scenario,
    plan: &Arc<Plan>,
    pki: &TestPki,
    ca_path: &Path,
    binary: &Path,
    dir: &Path,
    outage: Option<(OutageKind, &OutageSettings)>,
    progress: &Arc<Progress>,
) -> anyhow::Result<Phase> {
    let ids = RunIds::fresh();
    let collector = Collector::new(plan.clone(), ids, Faults::default());
    let latency = Duration::from_millis(scenario.mock.latency_ms);
    let mut webhooks: Vec<MockWebhook> = Vec::new();
    for _ in 0..scenario.mock.receivers {
        let config = MockWebhookConfig {
            latency,
            record_requests: false,
            on_request: Some(collector.hook()),
            ..MockWebhookConfig::default()
        };
        webhooks.push(fanout_testkit::mock::webhook::start(pki, config).await?);
    }
    let key = ApnsTestKey::generate()?;
    let apns_config = MockApnsConfig { latency, ..harness_apns_config(&key, collector.apns_hook()) };
    let apns = fanout_testkit::mock::apns::start(pki, apns_config).await?;
    let key_file: PathBuf = dir.join(format!("apns-{:x}.p8", rand::random::<u64>()));
    key.write_p8(&key_file)?;
    let apns_url = apns.base_url();
    let target = PushTarget::Apns { url: &apns_url, key_file: &key_file };
    let config = engine_process::engine_config_for(&scenario.engine, ca_path, target)?;
    let launch = Launch {
        log_level: "warn".into(),
        drain_timeout_seconds: 2,
        start_timeout: Duration::from_secs(scenario.timeouts.engine_start_seconds),
        ..Launch::new(binary, config)
    };
    let engine = launcher::Engine::start(launch).await?;
    let pid = engine.pid();
    progress.engine_pid.store(u64::from(pid.unwrap_or_default()), std::sync::atomic::Ordering::Relaxed);

    let connect_timeout = Duration::from_secs(scenario.timeouts.engine_start_seconds);
    let cluster = driver::Cluster::single(driver::Grpc::connect(engine.grpc, 2, connect_timeout).await?, engine.grpc);
    let urls: Vec<String> = webhooks.iter().map(|m| m.url("/hook")).collect();
    let setup_timeout = Duration::from_secs(scenario.timeouts.setup_seconds);
    let setup = driver::setup(&cluster, plan, ids, &urls, &scenario.setup, progress, setup_timeout).await?;

    // The outage's clock starts with the first Publish RPC.
    progress.watch(collector.clone());
    let cpu_before = pid.and_then(proc_sample).map(|s| s.cpu_seconds);
    let harness_cpu_before = own_cpu_seconds();
    let t0 = Instant::now();
    let window = outage.map(|(kind, settings)| {
        let (start, lasts) = (settings.start(), settings.duration());
        if start.is_zero() {
            apns.outage().start(kind);
        }
        let switch = apns.outage().clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep_until((t0 + start).into()).await;
            switch.start(kind);
            tokio::time::sleep_until((t0 + start + lasts).into()).await;
            switch.end();
        });
        (kind, t0 + start, t0 + start + lasts, timer)
    });
    let publish_timeout = Duration::from_secs(scenario.timeouts.publish_seconds);
    let publish =
        driver::publish(&cluster, plan, ids, &scenario.envelopes, &collector, progress, publish_timeout).await?;

    // Wait until both channels settled (delivered, or given up by the
    // engine) and the outage is over, or the bound passed.
    progress.phase("drain", 0);
    let expected: Vec<u64> = CHANNELS.iter().map(|(c, _)| collector.tally(*c).expected).collect();
    let outage_end = window.as_ref().map_or(t0, |w| w.2);
    let deadline = Instant::now().max(outage_end) + scenario.drain_timeout();
    let settled = loop {
        let metrics = engine_process::fetch_metrics(engine.http).await.unwrap_or_default();
        let done = CHANNELS.iter().zip(&expected).all(|((channel, name), expected)| {
            collector.delivered_on(*channel) + given_up(&metrics, name) >= *expected
        });
        if done && Instant::now() >= outage_end {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(POLL).await;
    };
    if settled {
        // Keep counting for a moment: late duplicates would show up now.
        tokio::time::sleep(Duration::from_millis(scenario.timeouts.settle_ms)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let end_sample = pid.and_then(proc_sample);
    let harness_cpu = harness_cpu_before.zip(own_cpu_seconds()).map(|(before, after)| after - before);
    let metrics = engine_process::fetch_metrics(engine.http).await.unwrap_or_default();
    let outage_met = apns.outage().met();
    if let Some(w) = &window {
        w.3.abort();
    }
    let summary = collector.summary();
    let window_times = window.as_ref().map(|(_, from, to, _)| (*from, *to));
    let figures = |(channel, name): (ScenarioChannel, &str)| {
        channel_figures(name, collector.tally(channel), &metrics, t0, window_times)
    };
    let phase = Phase {
        outage: window.as_ref().map(|w| w.0.to_string()),
        outage_from_seconds: window_times.map(|(from, _)| from.duration_since(t0).as_secs_f64()),
        outage_to_seconds: window_times.map(|(_, to)| to.duration_since(t0).as_secs_f64()),
        outage_met,
        http: figures(CHANNELS[0]),
        apns: figures(CHANNELS[1]),
        setup_seconds: setup.seconds,
        publish,
        bad_signatures: summary.bad_signatures,
        unexpected: summary.unexpected,
        settled,
        seconds,
        peak_rss_mib: end_sample.map(|s| s.hwm_kib as f64 / 1024.0),
        cpu_seconds: end_sample.zip(cpu_before).map(|(end, before)| end.cpu_seconds - before),
        harness_cpu_seconds: harness_cpu,
        windows: metrics.get("fanout_windows_total").copied().unwrap_or(0.0) as u64,
        window_replays: metrics.get("fanout_window_replays_total").copied().unwrap_or(0.0) as u64,
    };
    progress.engine_pid.store(0, std::sync::atomic::Ordering::Relaxed);
    drop(engine);
    apns.shutdown().await;
    for m in webhooks {
        m.shutdown().await;
    }
    Ok(phase)
}

/// `channel`'s deliveries the engine gave up (exhausted, rejected, mismatch, terminal).
fn given_up(metrics: &BTreeMap<String, f64>, channel: &str) -> u64 {
    GIVEN_UP.iter().map(|o| outcome(metrics, channel, o)).sum()
}

fn outcome(metrics: &BTreeMap<String, f64>, channel: &str, outcome: &str) -> u64 {
    let series = format!("fanout_deliveries_total{{channel=\"{channel}\",outcome=\"{outcome}\"}}");
    metrics.get(&series).copied().unwrap_or(0.0) as u64
}

/// The figures of one channel from its tally, the engine's metrics at the
/// end, the first publish `t0` and the outage's window.
fn channel_figures(
    name: &str,
    tally: ChannelTally,
    metrics: &BTreeMap<String, f64>,
    t0: Instant,
    window: Option<(Instant, Instant)>,
) -> ChannelFigures {
    let since = |at: Instant| at.saturating_duration_since(t0).as_secs_f64();
    let last = tally.arrivals.last().copied();
    let completion_seconds = last.map_or(0.0, since);
    let mut per_second = Vec::new();
    for at in &tally.arrivals {
        let second = since(*at) as usize;
        if per_second.len() <= second {
            per_second.resize(second + 1, 0);
        }
        per_second[second] += 1;
    }
    let complete = tally.delivered >= tally.expected;
    let stretch = |from: Instant, to: Instant| {
        let within: Vec<Instant> = tally.arrivals.iter().copied().filter(|at| *at >= from && *at < to).collect();
        // A channel that finished inside the stretch was active until its last delivery.
        let end = match last {
            Some(last) if complete && last < to => last,
            _ => to,
        };
        let seconds = end.saturating_duration_since(from).as_secs_f64();
        Stretch {
            deliveries: within.len() as u64,
            seconds,
            per_second: if seconds > 0.0 { within.len() as f64 / seconds } else { 0.0 },
            first_after_seconds: within.first().map(|at| at.saturating_duration_since(from).as_secs_f64()),
        }
    };
    let during_outage = window.and_then(|(from, to)| {
        let finished_before = complete && last.is_some_and(|l| l < from);
        (!finished_before).then(|| stretch(from, to))
    });
    let after_outage = window.map(|(_, to)| stretch(to, last.map_or(to, |l| l.max(to)) + Duration::from_nanos(1)));
    let outcomes: BTreeMap<String, u64> = metrics
        .iter()
        .filter_map(|(series, value)| {
            let rest = series.strip_prefix(&format!("fanout_deliveries_total{{channel=\"{name}\",outcome=\""))?;
            Some((rest.strip_suffix("\"}")?.to_owned(), *value as u64))
        })
        .collect();
    let parked: BTreeMap<String, u64> = metrics
        .iter()
        .filter_map(|(series, value)| {
            let rest = series.strip_prefix(&format!("fanout_parked_total{{channel=\"{name}\",reason=\""))?;
            Some((rest.strip_suffix("\"}")?.to_owned(), *value as u64)).filter(|(_, n)| *n > 0)
        })
        .collect();
    let given_up = given_up(metrics, name);
    ChannelFigures {
        channel: name.to_owned(),
        expected: tally.expected,
        delivered: tally.delivered,
        missing: tally.expected.saturating_sub(tally.delivered),
        duplicates: tally.duplicates,
        exhausted: outcome(metrics, name, "exhausted"),
        unaccounted: tally.expected.saturating_sub(tally.delivered + given_up),
        outcomes,
        parked,
        completion_seconds,
        deliveries_per_second: if completion_seconds > 0.0 { tally.delivered as f64 / completion_seconds } else { 0.0 },
        during_outage,
        after_outage,
        per_second,
    }
}

impl OutageReport {
    /// Sets the ratios, `passed` and `failures`.
    fn judge(&mut self, max_duplicate_ratio: f64) {
        let (base, out) = (&self.baseline.http, &self.with_outage.http);
        self.healthy_pace_ratio = out
            .during_outage
            .as_ref()
            .filter(|_| base.deliveries_per_second > 0.0)
            .map(|d| d.per_second / base.deliveries_per_second);
        self.healthy_completion_ratio =
            (out.completion_seconds > 0.0).then(|| base.completion_seconds / out.completion_seconds);
        let mut failures = Vec::new();
        for (name, phase) in [("baseline", &self.baseline), ("with the outage", &self.with_outage)] {
            if phase.publish.errors > 0 {
                failures.push(format!("{name}: {} envelopes were not stored", phase.publish.errors));
            }
            if phase.outage.is_none() && phase.window_replays > 0 {
                failures.push(format!("{name}: {} windows replayed without a fault", phase.window_replays));
            }
            if phase.bad_signatures > 0 {
                failures.push(format!("{name}: {} requests with a bad signature or token", phase.bad_signatures));
            }
            for (channel, _) in CHANNELS {
                let c = phase.channel(channel);
                // The healthy channel, and every channel in the baseline, must deliver everything.
                let must_deliver = channel == ScenarioChannel::Http || phase.outage.is_none();
                if must_deliver && c.missing > 0 {
                    failures.push(format!("{name}: {} of {} {} deliveries missing", c.missing, c.expected, c.channel));
                } else if c.unaccounted > 0 {
                    failures.push(format!(
                        "{name}: {} of {} {} deliveries neither arrived nor were given up by the engine",
                        c.unaccounted, c.expected, c.channel
                    ));
                }
                if c.duplicates as f64 > max_duplicate_ratio * c.expected as f64 {
                    failures.push(format!(
                        "{name}: {} duplicate {} deliveries, above {max_duplicate_ratio} of {}",
                        c.duplicates, c.channel, c.expected
                    ));
                }
            }
        }
        match self.healthy_pace_ratio {
            Some(ratio) if ratio < self.min_pace_ratio => failures.push(format!(
                "the webhooks ran at {ratio:.3} of their pace without the outage (at least {} wanted)",
                self.min_pace_ratio
            )),
            Some(_) => {}
            None => failures
                .push("no pace during the outage: the webhooks finished before it started (start it earlier)".into()),
        }
        self.passed = failures.is_empty();
        self.failures = failures;
    }

    /// The summary printed at the end of a run.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!("scenario   {}: {}", self.scenario, self.description));
        line(format!(
            "plan       {} recipients (webhooks and APNs devices alternating), {} topics, {} envelopes; \
             engine max_attempts {}",
            self.recipients, self.topics, self.envelopes, self.max_attempts
        ));
        line(format!(
            "outage     mock APNs {} from {:.1} s after the first publish for {:.1} s",
            self.outage, self.outage_start_seconds, self.outage_duration_seconds
        ));
        for (name, phase) in [("baseline", &self.baseline), ("outage", &self.with_outage)] {
            let rss = phase.peak_rss_mib.map_or("?".into(), |r| format!("{r:.1} MiB"));
            let cpu = phase.cpu_seconds.map_or("?".into(), |c| format!("{c:.2} s"));
            let harness = phase.harness_cpu_seconds.map_or("?".into(), |c| format!("{c:.2} s"));
            line(format!(
                "{name:<10} {:.1} s from the first publish, {}; {} windows, {} replayed; engine peak RSS {rss}, CPU {cpu}; harness CPU {harness}{}",
                phase.seconds,
                if phase.settled { "every delivery settled" } else { "NOT settled within the drain bound" },
                phase.windows,
                phase.window_replays,
                if phase.outage.is_some() {
                    format!("; the outage met {} requests/handshakes", phase.outage_met)
                } else {
                    String::new()
                }
            ));
            for c in [&phase.http, &phase.apns] {
                let mut text = format!(
                    "  {:<5}    {}/{} delivered, {} missing, {} duplicates, {} exhausted, {} unaccounted; \
                     done in {:.2} s, {:.0}/s",
                    c.channel,
                    c.delivered,
                    c.expected,
                    c.missing,
                    c.duplicates,
                    c.exhausted,
                    c.unaccounted,
                    c.completion_seconds,
                    c.deliveries_per_second
                );
                let parked: Vec<String> = c.parked.iter().map(|(reason, n)| format!("{n} {reason}")).collect();
                text.push_str(&format!(
                    "; parked {}",
                    if parked.is_empty() { "none".into() } else { parked.join(", ") }
                ));
                if let Some(d) = &c.during_outage {
                    text.push_str(&format!(
                        "; during the outage {} in {:.2} s ({:.0}/s)",
                        d.deliveries, d.seconds, d.per_second
                    ));
                }
                if let Some(a) = &c.after_outage {
                    text.push_str(&format!(
                        "; after it {} in {:.2} s ({:.0}/s)",
                        a.deliveries, a.seconds, a.per_second
                    ));
                    if let Some(first) = a.first_after_seconds {
                        text.push_str(&format!(", the first {first:.2} s after it ended"));
                    }
                }
                line(text);
            }
        }
        line(format!(
            "ratio      webhook pace during the outage ÷ without it: {} (at least {}); completion time without ÷ with: {}",
            self.healthy_pace_ratio.map_or("-".into(), |r| format!("{r:.3}")),
            self.min_pace_ratio,
            self.healthy_completion_ratio.map_or("-".into(), |r| format!("{r:.3}")),
        ));
        line(format!(
            "machine    {} cores, load {:.1} → {:.1}; run {:.0} s",
            self.machine.nproc, self.machine.loadavg_start, self.machine.loadavg_end, self.run_seconds
        ));
        line(if self.passed { "PASSED".into() } else { format!("FAILED: {}", self.failures.join("; ")) });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(expected: u64, arrivals_ms: &[u64], t0: Instant) -> ChannelTally {
        ChannelTally {
            expected,
            delivered: arrivals_ms.len() as u64,
            duplicates: 0,
            arrivals: arrivals_ms.iter().map(|ms| t0 + Duration::from_millis(*ms)).collect(),
        }
    }

    /// The pace during the outage counts the channel's active time inside
    /// it; what arrived after the outage is measured from its end.
    #[test]
    fn stretches_split_a_channel_at_the_outage() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let metrics: BTreeMap<String, f64> = [
            ("fanout_deliveries_total{channel=\"apns\",outcome=\"delivered\"}".to_owned(), 2.0),
            ("fanout_deliveries_total{channel=\"apns\",outcome=\"exhausted\"}".to_owned(), 1.0),
        ]
        .into();
        // Webhooks: all four done at 1.5 s, inside an outage from 1 s to 10 s.
        let http =
            channel_figures("http", tally(4, &[100, 900, 1200, 1500], t0), &metrics, t0, Some((ms(1000), ms(10_000))));
        assert_eq!((http.missing, http.unaccounted, http.completion_seconds), (0, 0, 1.5));
        let during = http.during_outage.unwrap();
        assert_eq!((during.deliveries, during.seconds, during.per_second), (2, 0.5, 4.0));
        assert_eq!(http.after_outage.unwrap().deliveries, 0);
        assert_eq!(http.per_second, vec![2, 2]);
        // APNs: nothing during the outage, two after it, one given up.
        let apns = channel_figures("apns", tally(4, &[10_500, 12_000], t0), &metrics, t0, Some((ms(1000), ms(10_000))));
        assert_eq!((apns.delivered, apns.missing, apns.exhausted, apns.unaccounted), (2, 2, 1, 1));
        assert_eq!(apns.during_outage.unwrap().deliveries, 0);
        let after = apns.after_outage.unwrap();
        assert_eq!((after.deliveries, after.first_after_seconds), (2, Some(0.5)));
        assert!((after.seconds - 2.0).abs() < 1e-6, "{after:?}");
        assert_eq!(apns.outcomes.get("exhausted"), Some(&1));
        // A channel done before the outage started has no pace during it.
        let early = channel_figures("http", tally(1, &[100], t0), &metrics, t0, Some((ms(1000), ms(2000))));
        assert!(early.during_outage.is_none());
    }
}
