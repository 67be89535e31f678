//! The run's report: every figure in one serialisable struct (the JSON
//! report), a human summary on stdout, and the pass/fail verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use fanout_testkit::wire::WireCounts;
use serde::Serialize;

use super::ceiling::CeilingResult;
use super::collector::Summary;
use super::cql_ceiling::CqlCeiling;
use super::db_fault::DbFaultReport;
use super::driver::{PublishStats, SetupStats};
use super::h2load::H2loadResult;
use super::nodes::{NodeFault, NodesReport};

/// The most duplicates a database fault the replication factor covers may
/// cost, as a fraction of the expected deliveries.
pub const DB_FAULT_MAX_DUPLICATES: f64 = 0.01;
use super::pushy::PushyReport;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub description: String,
    /// False when deliveries are missing, publishes failed, or signatures were bad.
    pub passed: bool,
    pub failures: Vec<String>,
    pub started_at_unix: u64,
    /// Whole run, setup included, seconds.
    pub run_seconds: f64,
    pub command: String,
    pub machine: Machine,
    pub engine: EngineInfo,
    pub plan: PlanInfo,
    pub setup: SetupStats,
    pub publish: PublishStats,
    /// What the receivers saw: expected, delivered, missing, duplicates,
    /// attempts, throughput, latency.
    pub deliveries: Summary,
    pub resources: Option<Resources>,
    /// The engine's own counters at the end of the run (`fanout_*`, no buckets).
    pub engine_metrics: BTreeMap<String, f64>,
    /// `fanout_deliveries_total` by outcome.
    pub deliveries_by_outcome: BTreeMap<String, f64>,
    /// `--profile`: where the engine's CPU time went.
    pub profile: Option<crate::profile::ProfileSummary>,
    pub ceiling: Option<CeilingResult>,
    /// Engine deliveries/s ÷ ceiling requests/s.
    pub ratio: Option<f64>,
    /// `--with-cql-ceiling`: the CQL server for a plain client, same run.
    pub cql_ceiling: Option<CqlCeiling>,
    /// The engine's registration and publish against `cql_ceiling`.
    pub ratio_cql: Option<CqlRatios>,
    /// The independent ceiling: h2load into the same kind of receivers.
    pub h2load: Option<H2loadResult>,
    /// Engine deliveries/s ÷ h2load requests/s: the headline ratio when
    /// measured (the bare ceiling shares the engine's client stack).
    pub ratio_h2load: Option<f64>,
    /// apns scenarios: the APNs peer, `rust` (the harness's mock) or
    /// `pushy (...)` (Pushy's MockApnsServer, validating or accept-all).
    pub apns_server: Option<String>,
    /// `--apns-server pushy`, or `--with-pushy-client` with the harness's
    /// mock: Pushy's client into a fresh server of the kind the engine's
    /// phase had (`apns_server`), every configuration tried.
    pub pushy: Option<PushyReport>,
    /// Engine deliveries/s ÷ Pushy's best pushes/s (the target in docs/BENCHMARKS.md is ≥ 1.5).
    pub ratio_pushy: Option<f64>,
    pub windows: Windows,
    /// What the mock APNs read on the wire from the engine (apns scenarios).
    pub wire: Option<WireReport>,
    /// `--engine-nodes` 2 or more: each node's figures, the fault, the handoffs.
    pub nodes: Option<NodesReport>,
    /// `--db-fault`: the database fault, the registration beside it, the recovery.
    pub db_fault: Option<DbFaultReport>,
}

/// Bytes per request as the mock APNs read them after TLS:
/// everything, the HPACK header blocks, the `authorization` literals inside
/// them, the bodies.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WireReport {
    pub counts: WireCounts,
    pub bytes_per_request: f64,
    pub header_block_bytes_per_request: f64,
    pub authorization_bytes_per_request: f64,
    pub data_bytes_per_request: f64,
}

impl From<WireCounts> for WireReport {
    fn from(c: WireCounts) -> Self {
        WireReport {
            counts: c,
            bytes_per_request: c.per_request(c.bytes),
            header_block_bytes_per_request: c.per_request(c.header_block_bytes),
            authorization_bytes_per_request: c.per_request(c.authorization_bytes),
            data_bytes_per_request: c.per_request(c.data_bytes),
        }
    }
}

impl WireReport {
    /// One line for the summary.
    pub fn line(&self) -> String {
        format!(
            "{} requests: {:.1} bytes/request received (header block {:.1}, of which authorization {:.1}; body {:.1})",
            self.counts.requests,
            self.bytes_per_request,
            self.header_block_bytes_per_request,
            self.authorization_bytes_per_request,
            self.data_bytes_per_request
        )
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub memory_mib: u64,
    pub cpu_model: String,
    /// 1-minute load average when the run started and ended (others' work shows here).
    pub loadavg_start: f64,
    pub loadavg_end: f64,
}

impl Machine {
    pub fn read() -> Machine {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_default();
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_mib: memory_kib / 1024,
            cpu_model,
            loadavg_start: loadavg(),
            loadavg_end: 0.0,
        }
    }
}

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
}

/// The engine on CQL against what the same server does for a plain client.
#[derive(Debug, Clone, Serialize)]
pub struct CqlRatios {
    /// Registration RPCs/s ÷ plain inserts/s (each RPC writes at least one row).
    pub registration: f64,
    /// Publish envelopes/s ÷ batched rows/s.
    pub publish: f64,
    /// The Publish RPC's median latency, ms.
    pub publish_p50_ms: f64,
    /// Deliveries/s ÷ joined subscribers/s: against what each delivery
    /// cost the database when dispatch joined every subscriber; the store
    /// now reads copies and joins only rows a change has marked, so this
    /// can pass 1.
    pub delivery: f64,
}

impl CqlRatios {
    pub fn new(c: &CqlCeiling, setup: &SetupStats, publish: &PublishStats, deliveries: &Summary) -> Self {
        Self {
            registration: setup.rpcs_per_second / c.plain_inserts.per_second.max(1e-9),
            publish: publish.envelopes_per_second / c.batches.rows_per_second.max(1e-9),
            publish_p50_ms: publish.rpc_latency.p50_ms,
            delivery: deliveries.deliveries_per_second / c.subscriber_joins.rows_per_second.max(1e-9),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineInfo {
    /// "subprocess" (started by the harness) or "external" (--engine-grpc).
    pub mode: String,
    pub binary: Option<String>,
    pub pid: Option<u32>,
    pub grpc: String,
    /// The store a started engine ran on: `redb`, or `scylla keyspace K at
    /// NODES` (`--scylla-nodes`).
    pub store: String,
    /// The scenario's `[engine]` overrides.
    pub overrides: serde_json::Value,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PlanInfo {
    pub recipients: u32,
    pub topics: u32,
    pub subscriptions: u64,
    pub envelopes: u64,
    pub rate_per_second: Option<f64>,
    pub expected_deliveries: u64,
    pub receivers: usize,
    pub faults: String,
    /// The receivers' fault mix is empty: a window replay is then a failure.
    pub fault_free: bool,
    /// Duplicates ÷ expected above this fail the run (scenario
    /// `max_duplicate_ratio`, default 0.01).
    pub max_duplicate_ratio: f64,
    /// The engine's peak RSS above this fails the run (scenario
    /// `max_peak_rss_mib`, or `--max-rss-mib`).
    pub max_peak_rss_mib: Option<f64>,
}

/// Dispatch windows as the engine counted them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Windows {
    /// `fanout_windows_total`.
    pub completed: f64,
    /// `fanout_window_replays_total`.
    pub replays: f64,
}

/// The engine process's memory and CPU, from /proc.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Resources {
    /// VmHWM at the end: the peak resident set of the whole run.
    pub peak_rss_mib: f64,
    /// VmRSS sampled every 500 ms: (seconds since the engine started, MiB).
    pub rss_samples_mib: Vec<(f64, f64)>,
    /// utime + stime over the whole process life.
    pub cpu_seconds_total: f64,
    /// utime + stime from the first publish to the end of the drain.
    pub cpu_seconds_delivery: f64,
    /// cpu_seconds_delivery ÷ that wall time: cores kept busy.
    pub cores_busy_delivery: f64,
    /// The harness's own utime + stime over the same time: its mock
    /// receivers (all of the receivers' work unless the APNs peer is
    /// Pushy's server), the collector and the publisher.
    pub harness_cpu_seconds_delivery: Option<f64>,
    /// With `--scylla-nodes` on this machine: the utime + stime of the
    /// processes listening on the contact points (the CQL servers) over the
    /// same time.
    pub database_cpu_seconds_delivery: Option<f64>,
}

/// `fanout_deliveries_total{channel="http",outcome="delivered"}` → "http/delivered".
pub fn deliveries_by_outcome(metrics: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let label = |name: &str, key: &str| {
        let start = name.find(&format!("{key}=\""))? + key.len() + 2;
        Some(name[start..].split('"').next()?.to_string())
    };
    metrics
        .iter()
        .filter(|(k, _)| k.starts_with("fanout_deliveries_total{"))
        .filter_map(|(k, v)| Some((format!("{}/{}", label(k, "channel")?, label(k, "outcome")?), *v)))
        .collect()
}

impl Report {
    /// Sets `passed` and `failures` from the figures.
    pub fn judge(&mut self) {
        let mut failures = Vec::new();
        let d = &self.deliveries;
        if d.missing > 0 {
            failures.push(format!("{} of {} expected deliveries never arrived", d.missing, d.expected));
        }
        if self.publish.errors > 0 {
            failures.push(format!(
                "{} envelopes were not stored: {}",
                self.publish.errors,
                self.publish.first_error.as_deref().unwrap_or("")
            ));
        }
        if d.bad_signatures > 0 {
            failures.push(format!(
                "{} requests had a bad webhook signature or were refused by the mock APNs",
                d.bad_signatures
            ));
        }
        // Copies of envelopes whose publish had an unknown outcome (a node
        // fault) and was resent are expected to arrive; nothing else is.
        let explained = if self.publish.unknown_outcome > 0 { d.unacknowledged } else { 0 };
        if d.unexpected > explained {
            failures.push(format!("{} requests were not for an expected delivery", d.unexpected - explained));
        }
        // Unexplained duplicates or replays are a failed run. A database
        // fault the replication factor covers may cost at most 1 %.
        let rolled = self.nodes.as_ref().and_then(|n| n.fault.as_ref()).is_some_and(|f| f.kind == NodeFault::Roll);
        let max_duplicates = if self.db_fault.is_some() || rolled {
            self.plan.max_duplicate_ratio.min(DB_FAULT_MAX_DUPLICATES)
        } else {
            self.plan.max_duplicate_ratio
        };
        let duplicate_ratio = if d.expected == 0 { 0.0 } else { d.duplicates as f64 / d.expected as f64 };
        if duplicate_ratio > max_duplicates {
            failures.push(format!(
                "{} duplicate deliveries ({:.2} %), above {:.2} %",
                d.duplicates,
                duplicate_ratio * 100.0,
                max_duplicates * 100.0
            ));
        }
        // Any node takes any publish: with no node fault, no envelope needs a resend.
        if let Some(n) = &self.nodes
            && n.fault.is_none()
            && n.stored_first_try < n.envelopes_stored
        {
            failures.push(format!(
                "{} of {} envelopes needed a resend with no node fault",
                n.envelopes_stored - n.stored_first_try,
                n.envelopes_stored
            ));
        }
        // A rolling restart stays inside the engine: a stopping node
        // answers every call it took before handing its shards over, and
        // forwards follow the owner, so no envelope is answered with an
        // error (a call the node refused unprocessed, its connection or
        // stream, is no answer: the next node takes it).
        if rolled {
            let p = &self.publish;
            let answered = p.unknown_outcome + p.retries + p.redirects;
            if answered > 0 {
                failures.push(format!(
                    "{answered} envelopes were answered with an error during the rolling restart ({} with an \
                     unknown outcome, {} of them lost in transport; {} with no owner; {} redirected){}",
                    p.unknown_outcome,
                    p.lost_in_transport,
                    p.retries,
                    p.redirects,
                    p.first_error
                        .as_deref()
                        .or(p.first_resent.as_deref())
                        .map(|e| format!("; first: {e}"))
                        .unwrap_or_default()
                ));
            }
        }
        // A database fault at replication factor 3 stays inside the engine:
        // every publish and registration answered without an error.
        if let Some(f) = &self.db_fault {
            let p = &self.publish;
            let answered = p.errors + p.unknown_outcome + p.retries;
            if answered > 0 {
                failures.push(format!(
                    "{answered} envelopes were answered with an error during the database fault ({} failed, {} with \
                     an unknown outcome, {} with no owner){}",
                    p.errors,
                    p.unknown_outcome,
                    p.retries,
                    p.first_error
                        .as_deref()
                        .or(p.first_resent.as_deref())
                        .map(|e| format!("; first: {e}"))
                        .unwrap_or_default()
                ));
            }
            if f.churn.errors > 0 {
                failures.push(format!(
                    "{} of {} registration calls were answered with an error during the database fault: {}",
                    f.churn.errors,
                    f.churn.rpcs,
                    f.churn.first_error.as_deref().unwrap_or("")
                ));
            }
        }
        if self.plan.fault_free && self.windows.replays > 0.0 {
            failures.push(format!("{} dispatch windows were replayed in a fault-free run", self.windows.replays));
        }
        if let Some(c) = &self.ceiling
            && c.failed > 0
        {
            failures.push(format!("{} ceiling requests failed", c.failed));
        }
        if let Some(h) = &self.h2load
            && h.failed > 0
        {
            failures.push(format!("{} h2load requests failed", h.failed));
        }
        for r in self.pushy.iter().flat_map(|p| &p.runs).filter(|r| !r.clean()) {
            failures.push(format!(
                "Pushy's client ({} connection(s)): {} of {} pushes accepted, {} rejected, {} unanswered; the server \
                 accepted {} (warm-up {} included), rejected {}{}",
                r.connections,
                r.accepted,
                r.pushes,
                r.rejected,
                r.unanswered,
                r.server_accepted,
                r.warmup_accepted,
                r.server_rejected,
                r.first_rejection.as_deref().map(|f| format!(" (first: {f})")).unwrap_or_default()
            ));
        }
        failures.extend(memory_ceiling_failure(self.resources.as_ref(), self.plan.max_peak_rss_mib));
        self.passed = failures.is_empty();
        self.failures = failures;
    }

    /// The human summary printed at the end of a run.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let d = &self.deliveries;
        let _ = writeln!(s, "scenario {}: {}", self.scenario, if self.passed { "PASSED" } else { "FAILED" });
        for f in &self.failures {
            let _ = writeln!(s, "  failure: {f}");
        }
        let p = &self.plan;
        let _ = writeln!(
            s,
            "  plan        {} recipients, {} topics, {} subscriptions, {} envelopes{} -> {} deliveries",
            p.recipients,
            p.topics,
            p.subscriptions,
            p.envelopes,
            p.rate_per_second.map(|r| format!(" at {r}/s")).unwrap_or_default(),
            p.expected_deliveries
        );
        let _ = writeln!(s, "  store       {}", self.engine.store);
        let st = &self.setup;
        let _ = writeln!(
            s,
            "  setup       {:.1} s: {:.0} recipients/s, {:.0} RPCs/s",
            st.seconds, st.recipients_per_second, st.rpcs_per_second
        );
        let _ = writeln!(s, "  publish     {}", self.publish.line());
        let _ = writeln!(
            s,
            "  deliveries  expected {} delivered {} missing {} duplicates {} attempts {} (unexpected {}, bad signatures {})",
            d.expected, d.delivered, d.missing, d.duplicates, d.attempts, d.unexpected, d.bad_signatures
        );
        let _ = writeln!(s, "  windows     {} completed, {} replayed", self.windows.completed, self.windows.replays);
        let _ = writeln!(s, "  throughput  {:.0} deliveries/s over {:.2} s", d.deliveries_per_second, d.seconds);
        let l = &d.latency;
        let _ = writeln!(
            s,
            "  latency     p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  p99.9 {:.1} ms  max {:.1} ms",
            l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms
        );
        if let Some(r) = &self.resources {
            let _ = writeln!(
                s,
                "  engine      peak RSS {:.0} MiB, CPU {:.1} s total, {:.1} s during delivery ({:.2} cores)",
                r.peak_rss_mib, r.cpu_seconds_total, r.cpu_seconds_delivery, r.cores_busy_delivery
            );
            if !r.rss_samples_mib.is_empty() {
                let _ = writeln!(s, "  rss curve   {}", rss_curve(&r.rss_samples_mib, RSS_CURVE_POINTS));
            }
            if let Some(cpu) = r.harness_cpu_seconds_delivery {
                let per_delivery = cpu * 1e6 / self.deliveries.delivered.max(1) as f64;
                let _ = writeln!(
                    s,
                    "  harness     CPU {cpu:.1} s during delivery (its mock receivers, collector and publisher): \
                     {per_delivery:.1} µs per delivery",
                );
            }
            if let Some(cpu) = r.database_cpu_seconds_delivery {
                let per_delivery = cpu * 1e6 / self.deliveries.delivered.max(1) as f64;
                let _ = writeln!(
                    s,
                    "  database    CPU {cpu:.1} s during delivery (the local CQL servers): {per_delivery:.1} µs per delivery",
                );
            }
        }
        if let Some(f) = &self.db_fault {
            let _ = writeln!(
                s,
                "  db fault    node {} {:?} at {:.1} s ({} deliveries in) for {:.0} s, back at {:.1} s{}",
                f.node,
                f.kind,
                f.at_seconds,
                f.delivered_before,
                f.held_seconds,
                f.back_at_seconds,
                f.restart_seconds.map(|r| format!(" (restart took {r:.1} s)")).unwrap_or_default()
            );
            if let Some(r) = &f.recovery {
                let after = |v: Option<f64>| v.map_or("not within the run".to_string(), |v| format!("{v:.1} s"));
                let _ = writeln!(
                    s,
                    "  recovery    {:.0} deliveries/s before; slowest second {:.0} % of it; back to 80 % after {} \
                     ({} after the node was back)",
                    r.baseline_per_second,
                    r.lowest_ratio * 100.0,
                    after(r.recovered_after_seconds),
                    after(r.recovered_after_back_seconds)
                );
            }
            let c = &f.churn;
            let _ = writeln!(
                s,
                "  churn       {} registration calls, {} errors, slowest {:.2} s",
                c.rpcs, c.errors, c.slowest_seconds
            );
        }
        for line in self.nodes.iter().flat_map(NodesReport::lines) {
            let _ = writeln!(s, "  nodes       {line}");
        }
        if !self.deliveries_by_outcome.is_empty() {
            let outcomes: Vec<String> = self.deliveries_by_outcome.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  outcomes    {}", outcomes.join(" "));
        }
        if let Some(w) = &self.wire {
            let _ = writeln!(s, "  wire        {}", w.line());
        }
        if let Some(c) = &self.ceiling {
            let _ = writeln!(
                s,
                "  ceiling     {:.0} requests/s ({} requests, concurrency {}, {} failed, p99 {:.1} ms{})",
                c.requests_per_second,
                c.requests,
                c.concurrency,
                c.failed,
                c.latency.p99_ms,
                c.cpu_seconds.map(|cpu| format!("; harness CPU {cpu:.2} s: client and receivers")).unwrap_or_default()
            );
            if let Some(w) = c.wire {
                let _ = writeln!(s, "  ceiling     wire {}", WireReport::from(w).line());
            }
        }
        if let Some(ratio) = self.ratio {
            let _ = writeln!(s, "  ratio       {ratio:.2} (engine deliveries/s / ceiling requests/s)");
        }
        if let (Some(c), Some(r)) = (&self.cql_ceiling, &self.ratio_cql) {
            let _ = writeln!(
                s,
                "  cql ceiling {:.0} plain inserts/s, {:.0} conditional inserts/s ({} in flight); {:.0} rows/s in \
                 batches of {} ({} in flight); {:.0} subscriber pages/s ({} in flight); {:.0} joined \
                 subscribers/s ({} in flight)",
                c.plain_inserts.per_second,
                c.conditional_inserts.per_second,
                c.plain_inserts.in_flight,
                c.batches.rows_per_second,
                (c.batches.rows_per_second / c.batches.per_second.max(1e-9)).round(),
                c.batches.in_flight,
                c.subscriber_pages.per_second,
                c.subscriber_pages.in_flight,
                c.subscriber_joins.rows_per_second,
                c.subscriber_joins.in_flight,
            );
            let _ = writeln!(
                s,
                "  ratio cql   registration {:.2} of plain inserts, publish {:.2} of batched rows (Publish p50 {:.1} \
                 ms), delivery {:.2} of joined subscribers",
                r.registration, r.publish, r.publish_p50_ms, r.delivery
            );
        }
        if let Some(h) = &self.h2load {
            let mut cpu = h.cpu_seconds.map_or(String::new(), |cpu| {
                format!("; CPU {cpu:.2} s = {:.0} requests/CPU-s", h.ok as f64 / cpu.max(1e-9))
            });
            if let Some(harness) = h.harness_cpu_seconds {
                cpu.push_str(&format!("; harness CPU {harness:.2} s"));
            }
            let _ = writeln!(
                s,
                "  h2load      {:.0} requests/s ({} requests, {} connection(s) x {} streams per receiver, {} failed{cpu}; {})",
                h.requests_per_second, h.requests, h.connections, h.streams, h.failed, h.version
            );
        }
        if let Some(ratio) = self.ratio_h2load {
            let _ = writeln!(s, "  ratio       {ratio:.2} (engine deliveries/s / h2load requests/s)");
        }
        if let Some(peer) = &self.apns_server {
            let _ = writeln!(s, "  apns peer   {peer}");
        }
        for line in self.pushy.iter().flat_map(|p| p.lines()) {
            let _ = writeln!(s, "  pushy       {line}");
        }
        if let Some(ratio) = self.ratio_pushy {
            let _ = writeln!(
                s,
                "  ratio       {ratio:.2} (engine deliveries/s / Pushy's best pushes/s, into the same kind of APNs peer)"
            );
        }
        let m = &self.machine;
        let _ = writeln!(
            s,
            "  machine     {} cores, {} MiB, load {:.2} -> {:.2}; run took {:.1} s",
            m.nproc, m.memory_mib, m.loadavg_start, m.loadavg_end, self.run_seconds
        );
        s
    }
}

/// Points of the RSS curve in the text summary (the JSON report has every
/// sample).
const RSS_CURVE_POINTS: usize = 12;

/// Why the run fails its memory ceiling, if it does.
fn memory_ceiling_failure(resources: Option<&Resources>, max_mib: Option<f64>) -> Option<String> {
    let max = max_mib?;
    match resources {
        None => Some(format!("a memory ceiling of {max:.0} MiB was set, but the engine's RSS was not measured")),
        Some(r) if r.peak_rss_mib > max => {
            Some(format!("the engine's peak RSS was {:.0} MiB, above the ceiling of {max:.0} MiB", r.peak_rss_mib))
        }
        Some(_) => None,
    }
}

/// `points` samples spread evenly over `samples` (first and last
/// included), as "seconds s MiB" pairs.
fn rss_curve(samples: &[(f64, f64)], points: usize) -> String {
    let last = samples.len().saturating_sub(1);
    let mut picked: Vec<usize> = (0..points.max(2)).map(|i| i * last / (points.max(2) - 1)).collect();
    picked.dedup();
    picked.into_iter().map(|i| format!("{:.0} s {:.0}", samples[i].0, samples[i].1)).collect::<Vec<_>>().join(", ")
        + " MiB"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_ceiling_fails_a_run_above_it_or_unmeasured() {
        let measured = |peak| Resources { peak_rss_mib: peak, ..Resources::default() };
        assert_eq!(memory_ceiling_failure(Some(&measured(2_000.0)), None), None, "no ceiling, no check");
        assert_eq!(memory_ceiling_failure(Some(&measured(1_300.0)), Some(1_300.0)), None, "at the ceiling passes");
        assert_eq!(
            memory_ceiling_failure(Some(&measured(1_301.4)), Some(1_300.0)).as_deref(),
            Some("the engine's peak RSS was 1301 MiB, above the ceiling of 1300 MiB")
        );
        assert!(memory_ceiling_failure(None, Some(512.0)).unwrap().contains("not measured"));
    }

    #[test]
    fn the_rss_curve_spreads_its_points_over_the_samples() {
        let samples: Vec<(f64, f64)> = (0..=100).map(|i| (i as f64 * 0.5, 100.0 + i as f64)).collect();
        assert_eq!(rss_curve(&samples, 3), "0 s 100, 25 s 150, 50 s 200 MiB");
        assert_eq!(rss_curve(&samples[..1], 12), "0 s 100 MiB", "one sample, one point");
    }

    #[test]
    fn outcomes_from_metric_names() {
        let mut m = BTreeMap::new();
        m.insert("fanout_deliveries_total{channel=\"http\",outcome=\"delivered\"}".to_string(), 10.0);
        m.insert("fanout_deliveries_total{channel=\"http\",outcome=\"exhausted\"}".to_string(), 2.0);
        m.insert("fanout_attempts_total{channel=\"http\",outcome=\"delivered\"}".to_string(), 12.0);
        let o = deliveries_by_outcome(&m);
        assert_eq!(o.len(), 2);
        assert_eq!(o["http/delivered"], 10.0);
        assert_eq!(o["http/exhausted"], 2.0);
    }

    #[test]
    fn wire_figures_per_request() {
        let c = WireCounts {
            bytes: 4_000,
            requests: 10,
            header_block_bytes: 2_000,
            data_bytes: 900,
            authorization_bytes: 1_500,
        };
        let w = WireReport::from(c);
        assert_eq!((w.bytes_per_request, w.header_block_bytes_per_request), (400.0, 200.0));
        assert_eq!((w.authorization_bytes_per_request, w.data_bytes_per_request), (150.0, 90.0));
        assert_eq!(
            w.line(),
            "10 requests: 400.0 bytes/request received (header block 200.0, of which authorization 150.0; body 90.0)"
        );
        assert_eq!(WireReport::from(WireCounts::default()).bytes_per_request, 0.0);
    }

    #[test]
    fn machine_info_is_read() {
        let m = Machine::read();
        assert!(m.nproc >= 1);
        assert!(m.memory_mib > 0);
    }
}
