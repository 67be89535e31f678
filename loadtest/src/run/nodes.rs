//! Several engine nodes on one ScyllaDB keyspace (`--engine-nodes N`):
//! waiting until they have split the shards, sampling each node's CPU and
//! /metrics while the run goes on (a killed node keeps its last sample), its
//! shard ownership changes read from its log, the fault (`--node-fault`:
//! SIGKILL one node, SIGSTOP it past its lease TTL and SIGCONT it, or a
//! rolling restart of every node with SIGTERM), and the per-node and total
//! figures of the report.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use fanout_testkit::launcher;
use serde::Serialize;

use super::collector::Collector;
use super::driver::{PublishStats, PublishVia, SetupStats};
use super::engine_process::{fetch_metrics, proc_sample};

/// The harness's log filter for several nodes: warnings, and the lease
/// actor's acquisitions and releases, which the ownership counts are read from.
pub const LOG_LEVEL: &str = "warn,fanout_engine::ownership=info";

/// `--node-fault`: what happens to the last node once `--fault-after` of
/// the expected deliveries arrived.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeFault {
    /// SIGKILL: no drain; the others take its shards once its leases expire.
    Kill,
    /// SIGSTOP for twice the lease TTL, then SIGCONT: the others take its
    /// shards, and it must act on none of the leases it lost.
    Pause,
    /// A rolling restart: each node in turn gets SIGTERM (it hands its
    /// shards over while still answering, then stops), is started again on
    /// the same ports once it exited, and the next one follows once the
    /// nodes have split the shards again.
    Roll,
}

/// Shard ownership changes a node's log shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Ownership {
    /// "shard lease acquired": the node took a shard (a handoff to it,
    /// after the start).
    pub acquired: u64,
    /// "releasing a shard above the fair share": drained and given back.
    pub released: u64,
    /// "shard lease lost": a renewal failed, the shard actor was stopped at once.
    pub lost: u64,
    /// "shard lease not renewed in time": the fence paused a shard's dispatch.
    pub fenced: u64,
}

impl Ownership {
    pub fn from_log(log: &str) -> Ownership {
        let count = |needle: &str| log.matches(needle).count() as u64;
        Ownership {
            acquired: count("shard lease acquired"),
            released: count("releasing a shard above the fair share") + count("shard lease released on leaving"),
            lost: count("shard lease lost"),
            fenced: count("shard lease not renewed in time"),
        }
    }

    /// What changed after `before`.
    pub fn since(self, before: Ownership) -> Ownership {
        Ownership {
            acquired: self.acquired.saturating_sub(before.acquired),
            released: self.released.saturating_sub(before.released),
            lost: self.lost.saturating_sub(before.lost),
            fenced: self.fenced.saturating_sub(before.fenced),
        }
    }
}

/// One reading of a node: its CPU time and its metrics.
#[derive(Debug, Clone, Default)]
pub struct NodeSample {
    pub cpu_seconds: Option<f64>,
    pub metrics: BTreeMap<String, f64>,
}

impl NodeSample {
    /// `fanout_deliveries_total` with outcome `delivered`, every channel.
    pub fn delivered(&self) -> f64 {
        self.metrics
            .iter()
            .filter(|(k, _)| k.starts_with("fanout_deliveries_total{") && k.contains("outcome=\"delivered\""))
            .map(|(_, v)| v)
            .sum()
    }

    pub fn owned_shards(&self) -> Option<f64> {
        self.metrics.get("fanout_owned_shards").copied()
    }

    /// Every series of `family`, summed over its labels.
    pub fn family(&self, family: &str) -> f64 {
        self.metrics
            .iter()
            .filter(|(k, _)| k.strip_prefix(family).is_some_and(|rest| rest.is_empty() || rest.starts_with('{')))
            .map(|(_, v)| v)
            .sum()
    }
}

/// Reads a node now: CPU from /proc, /metrics over HTTP (either may fail
/// for a dead or frozen node: `None` or empty).
pub async fn read_node(pid: Option<u32>, http: SocketAddr) -> NodeSample {
    let cpu_seconds = pid.and_then(proc_sample).map(|s| s.cpu_seconds);
    let metrics = tokio::time::timeout(Duration::from_secs(1), fetch_metrics(http)).await.ok().and_then(Result::ok);
    NodeSample { cpu_seconds, metrics: metrics.unwrap_or_default() }
}

/// Keeps each node's latest good sample, every 500 ms, so that a node
/// killed mid-run still has figures.
pub struct Samplers {
    latest: Vec<Arc<Mutex<NodeSample>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Samplers {
    pub fn start(nodes: &[(Option<u32>, SocketAddr)]) -> Samplers {
        let mut latest = Vec::new();
        let mut tasks = Vec::new();
        for &(pid, http) in nodes {
            let slot = Arc::new(Mutex::new(NodeSample::default()));
            let keep = slot.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let s = read_node(pid, http).await;
                    {
                        let mut last = keep.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(cpu) = s.cpu_seconds {
                            last.cpu_seconds = Some(cpu);
                        }
                        if !s.metrics.is_empty() {
                            last.metrics = s.metrics;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }));
            latest.push(slot);
        }
        Samplers { latest, tasks }
    }

    /// Stops sampling and returns each node's latest sample.
    pub fn finish(self) -> Vec<NodeSample> {
        for t in &self.tasks {
            t.abort();
        }
        self.latest.iter().map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).clone()).collect()
    }
}

/// Waits until the nodes own every shard between them, each some, and the
/// split held for two readings in a row (the first node took them all, the
/// others get their share as it releases its extras).
pub async fn wait_settled(
    nodes: &[(Option<u32>, SocketAddr)],
    shard_count: u64,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last: Option<Vec<u64>> = None;
    loop {
        let mut owned = Vec::new();
        for &(pid, http) in nodes {
            owned.push(read_node(pid, http).await.owned_shards().unwrap_or(0.0) as u64);
        }
        let settled = owned.iter().sum::<u64>() == shard_count && owned.iter().all(|&o| o > 0);
        if settled && last.as_ref() == Some(&owned) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the {} nodes did not split the {shard_count} shards within {timeout:?}: they own {owned:?}",
                nodes.len()
            );
        }
        last = settled.then_some(owned);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct FaultReport {
    pub kind: NodeFault,
    /// Index of the node (0-based; the last one).
    pub node: usize,
    /// Seconds after the first publish.
    pub at_seconds: f64,
    /// Distinct deliveries that had arrived then.
    pub delivered_before: u64,
    /// `pause`: how long the node was frozen.
    pub paused_seconds: Option<f64>,
    /// `roll`: each node's restart, in order.
    pub restarts: Vec<Restart>,
}

/// One node's restart in a roll, in seconds after the first publish.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Restart {
    pub node: usize,
    /// SIGTERM sent.
    pub at_seconds: f64,
    /// From SIGTERM to its exit: the shards handed over and the drain.
    pub stop_seconds: f64,
    /// From the start again to ready (/readyz: a lease round done).
    pub start_seconds: f64,
    /// From ready until the nodes had split the shards again.
    pub settle_seconds: f64,
}

impl Restart {
    fn line(&self) -> String {
        format!(
            "node {} at {:.1} s: stopped in {:.1} s, ready {:.1} s later, shards split again {:.1} s after",
            self.node, self.at_seconds, self.stop_seconds, self.start_seconds, self.settle_seconds
        )
    }
}

/// Restarts `engines` one after the other once `threshold` distinct
/// deliveries arrived: SIGTERM, wait for the exit (bounded by `stop_within`),
/// start again on the same ports and store, wait until `nodes` (every
/// node's pid and HTTP address) have split `shard_count` shards again.
/// `None` when `gave_up` was set before the threshold.
#[allow(clippy::too_many_arguments)]
pub async fn roll(
    engines: Vec<&mut launcher::Engine>,
    nodes: &[(Option<u32>, SocketAddr)],
    shard_count: u64,
    stop_within: Duration,
    settle_within: Duration,
    collector: &Collector,
    threshold: u64,
    started: Instant,
    gave_up: &AtomicBool,
) -> anyhow::Result<Option<FaultReport>> {
    if !reached(collector, threshold, gave_up).await {
        return Ok(None);
    }
    let at_seconds = started.elapsed().as_secs_f64();
    let delivered_before = collector.counts().distinct;
    let mut restarts = Vec::new();
    for (node, engine) in engines.into_iter().enumerate() {
        let term = Instant::now();
        let status = engine.stop(stop_within).await?;
        if !status.success() {
            bail!("node {node} exited with {status} after SIGTERM; log:\n{}", engine.log_tail(20));
        }
        let stopped = Instant::now();
        engine.restart().await?;
        let ready = Instant::now();
        wait_settled(nodes, shard_count, settle_within).await?;
        restarts.push(Restart {
            node,
            at_seconds: term.duration_since(started).as_secs_f64(),
            stop_seconds: stopped.duration_since(term).as_secs_f64(),
            start_seconds: ready.duration_since(stopped).as_secs_f64(),
            settle_seconds: ready.elapsed().as_secs_f64(),
        });
    }
    Ok(Some(FaultReport {
        kind: NodeFault::Roll,
        node: 0,
        at_seconds,
        delivered_before,
        paused_seconds: None,
        restarts,
    }))
}

/// Waits until `threshold` distinct deliveries arrived, then kills `engine`
/// (SIGKILL) or freezes it for `pause` (SIGSTOP, then SIGCONT). `None` when
/// `gave_up` was set first (the run ended without reaching the threshold).
#[allow(clippy::too_many_arguments)]
pub async fn inject(
    kind: NodeFault,
    engine: &mut launcher::Engine,
    node: usize,
    collector: &Collector,
    threshold: u64,
    pause: Duration,
    started: Instant,
    gave_up: &AtomicBool,
) -> anyhow::Result<Option<FaultReport>> {
    if !reached(collector, threshold, gave_up).await {
        return Ok(None);
    }
    let at_seconds = started.elapsed().as_secs_f64();
    let delivered_before = collector.counts().distinct;
    let paused_seconds = match kind {
        NodeFault::Kill => {
            engine.kill9();
            None
        }
        NodeFault::Roll => bail!("a roll restarts every node: see `roll`"),
        NodeFault::Pause => {
            engine.pause()?;
            tokio::time::sleep(pause).await;
            engine.resume()?;
            Some(pause.as_secs_f64())
        }
    };
    Ok(Some(FaultReport { kind, node, at_seconds, delivered_before, paused_seconds, restarts: Vec::new() }))
}

/// One node's share of the run.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    pub index: usize,
    pub grpc: String,
    pub pid: Option<u32>,
    /// "killed" or "paused" for the node the fault hit.
    pub fault: Option<String>,
    pub registration_rpcs: u64,
    /// Its RPCs over the whole setup's duration.
    pub registration_rpcs_per_second: f64,
    pub envelopes_stored: u64,
    /// Its acknowledged envelopes over the whole publish phase.
    pub envelopes_per_second: f64,
    /// `fanout_deliveries_total{outcome="delivered"}` during the delivery
    /// phase (up to its last sample when it was killed).
    pub deliveries: f64,
    pub deliveries_per_second: f64,
    pub cpu_seconds_delivery: Option<f64>,
    pub owned_shards_start: f64,
    pub owned_shards_end: Option<f64>,
    /// Ownership changes during the publish and delivery phases.
    pub ownership: Ownership,
}

/// `--engine-nodes`: every node, the fault, and the handoffs' cost.
#[derive(Debug, Clone, Serialize)]
pub struct NodesReport {
    pub nodes: Vec<NodeReport>,
    pub fault: Option<FaultReport>,
    /// Shards acquired by some node during the run: each is a handoff whose
    /// new owner replayed from the checkpoint.
    pub handoffs: u64,
    /// Duplicate deliveries ÷ handoffs.
    pub duplicates_per_handoff: Option<f64>,
    /// The seconds since the first publish in which duplicates arrived, and
    /// how many: set beside the fault's time and the nodes' logs, they tell
    /// which handoff repeated what.
    pub duplicates_by_second: Vec<(usize, u64)>,
    /// Deliveries of envelope copies whose publish had an unknown outcome.
    pub unacknowledged: u64,
    pub redirects: u64,
    pub retries: u64,
    pub unknown_outcome: u64,
    /// Of those, RPCs no node answered (transport failure, no answer in time).
    pub lost_in_transport: u64,
    /// Envelopes of RPCs refused before any node processed them (connection
    /// refused, stream refused by GOAWAY, cancelled before it was sent),
    /// sent to the next node.
    pub unsent: u64,
    /// How the Publish RPCs chose their node.
    pub publish_via: PublishVia,
    pub envelopes_stored: u64,
    /// Of those, stored by the first RPC that carried them.
    pub stored_first_try: u64,
    /// Sum over the nodes of `fanout_forwarded_envelopes_total` during the
    /// run: envelopes a node sent on to their shard's owner.
    pub forwarded: f64,
    /// Sum over the nodes of `fanout_forward_failures_total`, every reason.
    pub forward_failures: f64,
    pub publish_p50_ms: f64,
    pub publish_p99_ms: f64,
    /// Distinct deliveries per second of the delivery phase.
    pub deliveries_per_second: f64,
    /// Sum over the nodes of their CPU during the delivery phase (the
    /// publishes included: it starts with the first).
    pub engine_cpu_seconds_delivery: f64,
    /// That, per 1,000 distinct deliveries (= ms per delivery).
    pub engine_cpu_seconds_per_1k_deliveries: f64,
    /// That, in ms per envelope stored.
    pub engine_cpu_ms_per_envelope: f64,
}

/// What [`NodesReport::new`] needs of each node.
pub struct NodeFigures {
    pub grpc: String,
    pub pid: Option<u32>,
    pub before: NodeSample,
    pub after: NodeSample,
    pub ownership_before: Ownership,
    pub ownership_after: Ownership,
}

impl NodesReport {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        figures: Vec<NodeFigures>,
        fault: Option<FaultReport>,
        setup: &SetupStats,
        publish: &PublishStats,
        delivery_seconds: f64,
        distinct: u64,
        duplicates: &[u64],
        unacknowledged: u64,
    ) -> NodesReport {
        let duplicates_by_second: Vec<(usize, u64)> =
            duplicates.iter().copied().enumerate().filter(|&(_, n)| n > 0).collect();
        let duplicates: u64 = duplicates.iter().sum();
        let per = |n: f64, s: f64| n / s.max(1e-9);
        let delta = |f: &NodeFigures, family: &str| (f.after.family(family) - f.before.family(family)).max(0.0);
        let forwarded: f64 = figures.iter().map(|f| delta(f, "fanout_forwarded_envelopes_total")).sum();
        let forward_failures: f64 = figures.iter().map(|f| delta(f, "fanout_forward_failures_total")).sum();
        let nodes: Vec<NodeReport> = figures
            .into_iter()
            .enumerate()
            .map(|(index, f)| {
                let rpcs = setup.rpcs_per_node.get(index).copied().unwrap_or(0);
                let stored = publish.stored_per_node.get(index).copied().unwrap_or(0);
                let deliveries = (f.after.delivered() - f.before.delivered()).max(0.0);
                let cpu = f.after.cpu_seconds.zip(f.before.cpu_seconds).map(|(a, b)| a - b);
                NodeReport {
                    index,
                    grpc: f.grpc,
                    pid: f.pid,
                    fault: fault.as_ref().filter(|x| x.node == index || x.kind == NodeFault::Roll).map(|x| {
                        match x.kind {
                            NodeFault::Kill => "killed".into(),
                            NodeFault::Pause => "paused".into(),
                            // Its counters start again at the restart: its figures are since then.
                            NodeFault::Roll => "restarted".into(),
                        }
                    }),
                    registration_rpcs: rpcs,
                    registration_rpcs_per_second: per(rpcs as f64, setup.seconds),
                    envelopes_stored: stored,
                    envelopes_per_second: per(stored as f64, publish.seconds),
                    deliveries,
                    deliveries_per_second: per(deliveries, delivery_seconds),
                    cpu_seconds_delivery: cpu,
                    owned_shards_start: f.before.owned_shards().unwrap_or(0.0),
                    owned_shards_end: match fault.as_ref() {
                        Some(x) if x.node == index && x.kind == NodeFault::Kill => None,
                        _ => f.after.owned_shards(),
                    },
                    ownership: f.ownership_after.since(f.ownership_before),
                }
            })
            .collect();
        let handoffs: u64 = nodes.iter().map(|n| n.ownership.acquired).sum();
        let cpu: f64 = nodes.iter().filter_map(|n| n.cpu_seconds_delivery).sum();
        NodesReport {
            publish_via: publish.via,
            envelopes_stored: publish.stored,
            stored_first_try: publish.first_try,
            forwarded,
            forward_failures,
            publish_p50_ms: publish.rpc_latency.p50_ms,
            publish_p99_ms: publish.rpc_latency.p99_ms,
            deliveries_per_second: per(distinct as f64, delivery_seconds),
            engine_cpu_ms_per_envelope: cpu * 1000.0 / publish.stored.max(1) as f64,
            handoffs,
            duplicates_per_handoff: (handoffs > 0).then(|| duplicates as f64 / handoffs as f64),
            duplicates_by_second,
            unacknowledged,
            redirects: publish.redirects,
            retries: publish.retries,
            unknown_outcome: publish.unknown_outcome,
            lost_in_transport: publish.lost_in_transport,
            unsent: publish.unsent,
            engine_cpu_seconds_delivery: cpu,
            engine_cpu_seconds_per_1k_deliveries: cpu * 1000.0 / distinct.max(1) as f64,
            nodes,
            fault,
        }
    }

    /// The summary's lines.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for n in &self.nodes {
            let o = &n.ownership;
            lines.push(format!(
                "node {} {}{}: {} RPCs ({:.0}/s), {} envelopes ({:.0}/s), {:.0} deliveries ({:.0}/s), CPU {}; \
                 shards {:.0} -> {}, acquired {} released {} lost {} fenced {}",
                n.index,
                n.grpc,
                n.fault.as_deref().map(|f| format!(" ({f})")).unwrap_or_default(),
                n.registration_rpcs,
                n.registration_rpcs_per_second,
                n.envelopes_stored,
                n.envelopes_per_second,
                n.deliveries,
                n.deliveries_per_second,
                n.cpu_seconds_delivery.map_or("?".into(), |c| format!("{c:.1} s")),
                n.owned_shards_start,
                n.owned_shards_end.map_or("-".into(), |s| format!("{s:.0}")),
                o.acquired,
                o.released,
                o.lost,
                o.fenced,
            ));
        }
        if let Some(f) = &self.fault {
            if f.kind == NodeFault::Roll {
                lines.push(format!(
                    "fault: every node restarted (SIGTERM) in turn from {:.1} s, after {} deliveries",
                    f.at_seconds, f.delivered_before
                ));
                lines.extend(f.restarts.iter().map(|r| format!("  {}", r.line())));
            } else {
                lines.push(format!(
                    "fault: node {} {} at {:.1} s, after {} deliveries{}",
                    f.node,
                    match f.kind {
                        NodeFault::Kill => "killed (SIGKILL)",
                        NodeFault::Pause => "paused (SIGSTOP)",
                        NodeFault::Roll => "restarted (SIGTERM)",
                    },
                    f.at_seconds,
                    f.delivered_before,
                    f.paused_seconds.map(|p| format!(", resumed {p:.1} s later")).unwrap_or_default()
                ));
            }
        }
        if !self.duplicates_by_second.is_empty() {
            let by_second: Vec<String> = self.duplicates_by_second.iter().map(|(s, n)| format!("{s} s: {n}")).collect();
            lines.push(format!("duplicates by second since the first publish: {}", by_second.join(", ")));
        }
        lines.push(format!(
            "publish via {}: {} of {} envelopes stored at their first try, {:.0} forwarded to their owner ({:.0} \
             forwards failed); Publish p50 {:.1} ms p99 {:.1} ms; {:.0} deliveries/s; engine CPU (all nodes) {:.3} ms \
             per envelope, {:.3} ms per delivery",
            match self.publish_via {
                PublishVia::RoundRobin => "round-robin",
                PublishVia::Owner => "owner",
            },
            self.stored_first_try,
            self.envelopes_stored,
            self.forwarded,
            self.forward_failures,
            self.publish_p50_ms,
            self.publish_p99_ms,
            self.deliveries_per_second,
            self.engine_cpu_ms_per_envelope,
            self.engine_cpu_seconds_per_1k_deliveries,
        ));
        lines.push(format!(
            "handoffs: {} ({}); publish: {} redirected, {} retried, {} of unknown outcome resent ({} lost in \
             transport; {} deliveries of unacknowledged copies), {} sent to the next node unprocessed; engine CPU \
             {:.1} s = {:.2} s per 1k deliveries",
            self.handoffs,
            self.duplicates_per_handoff
                .map_or("no duplicates to share".into(), |d| format!("{d:.1} duplicates per handoff")),
            self.redirects,
            self.retries,
            self.unknown_outcome,
            self.lost_in_transport,
            self.unacknowledged,
            self.unsent,
            self.engine_cpu_seconds_delivery,
            self.engine_cpu_seconds_per_1k_deliveries
        ));
        lines
    }
}

/// Waits until `threshold` distinct deliveries arrived (the fault's moment);
/// false if the run gave up first.
async fn reached(collector: &Collector, threshold: u64, gave_up: &AtomicBool) -> bool {
    while collector.counts().distinct < threshold {
        if gave_up.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_is_read_from_the_log() {
        let log = "INFO shard lease acquired shard=3\nINFO shard lease acquired shard=4\n\
                   INFO releasing a shard above the fair share shard=4\nWARN shard lease lost; stopping\n\
                   WARN shard lease not renewed in time; dispatch paused\n";
        let o = Ownership::from_log(log);
        assert_eq!(o, Ownership { acquired: 2, released: 1, lost: 1, fenced: 1 });
        let before = Ownership { acquired: 1, ..Ownership::default() };
        assert_eq!(o.since(before).acquired, 1);
    }

    #[test]
    fn a_roll_reports_each_restart_and_marks_every_node() {
        let restart = |node: usize| Restart {
            node,
            at_seconds: 3.0 + node as f64,
            stop_seconds: 1.2,
            start_seconds: 2.5,
            settle_seconds: 0.6,
        };
        let fault = FaultReport {
            kind: NodeFault::Roll,
            node: 0,
            at_seconds: 3.0,
            delivered_before: 100,
            paused_seconds: None,
            restarts: vec![restart(0), restart(1)],
        };
        let figure = |grpc: &str| NodeFigures {
            grpc: grpc.into(),
            pid: None,
            before: NodeSample::default(),
            after: NodeSample::default(),
            ownership_before: Ownership::default(),
            ownership_after: Ownership::default(),
        };
        let setup = SetupStats { seconds: 1.0, ..Default::default() };
        let publish = PublishStats { seconds: 1.0, ..Default::default() };
        let r = NodesReport::new(vec![figure("a:1"), figure("b:1")], Some(fault), &setup, &publish, 1.0, 0, &[], 0);
        assert!(r.nodes.iter().all(|n| n.fault.as_deref() == Some("restarted")));
        let text = r.lines().join("\n");
        assert!(text.contains("every node restarted (SIGTERM) in turn from 3.0 s, after 100 deliveries"), "{text}");
        assert!(
            text.contains("node 1 at 4.0 s: stopped in 1.2 s, ready 2.5 s later, shards split again 0.6 s after"),
            "{text}"
        );
        let o = Ownership::from_log("shard lease released on leaving\nreleasing a shard above the fair share\n");
        assert_eq!(o.released, 2);
    }

    #[test]
    fn duplicates_per_handoff_and_cpu_per_delivery() {
        let sample = |cpu: f64, delivered: f64, owned: f64| NodeSample {
            cpu_seconds: Some(cpu),
            metrics: [
                ("fanout_deliveries_total{channel=\"http\",outcome=\"delivered\"}".to_string(), delivered),
                ("fanout_owned_shards".to_string(), owned),
                ("fanout_forwarded_envelopes_total".to_string(), delivered / 100.0),
                ("fanout_forward_failures_total{reason=\"timeout\"}".to_string(), owned / 8.0),
                ("fanout_forward_failures_total{reason=\"refused\"}".to_string(), 0.0),
            ]
            .into_iter()
            .collect(),
        };
        let figures = vec![
            NodeFigures {
                grpc: "127.0.0.1:1".into(),
                pid: Some(1),
                before: sample(1.0, 0.0, 8.0),
                after: sample(3.0, 1500.0, 16.0),
                ownership_before: Ownership { acquired: 16, ..Default::default() },
                ownership_after: Ownership { acquired: 24, ..Default::default() },
            },
            NodeFigures {
                grpc: "127.0.0.1:2".into(),
                pid: Some(2),
                before: sample(1.0, 0.0, 8.0),
                after: sample(2.0, 500.0, 8.0),
                ownership_before: Ownership::default(),
                ownership_after: Ownership::default(),
            },
        ];
        let fault = FaultReport {
            kind: NodeFault::Kill,
            node: 1,
            at_seconds: 1.0,
            delivered_before: 400,
            paused_seconds: None,
            restarts: Vec::new(),
        };
        let setup = SetupStats { seconds: 2.0, rpcs_per_node: vec![10, 10], ..Default::default() };
        let publish = PublishStats {
            seconds: 1.0,
            stored: 12,
            first_try: 9,
            stored_per_node: vec![5, 7],
            redirects: 3,
            ..Default::default()
        };
        let r = NodesReport::new(figures, Some(fault), &setup, &publish, 4.0, 2000, &[0, 0, 10, 0, 6], 0);
        assert_eq!(r.handoffs, 8);
        assert_eq!(r.duplicates_per_handoff, Some(2.0));
        assert_eq!(r.duplicates_by_second, vec![(2, 10), (4, 6)]);
        assert_eq!((r.engine_cpu_seconds_delivery, r.engine_cpu_seconds_per_1k_deliveries), (3.0, 1.5));
        assert_eq!((r.nodes[0].deliveries_per_second, r.nodes[1].envelopes_per_second), (375.0, 7.0));
        assert_eq!((r.nodes[1].fault.as_deref(), r.nodes[1].owned_shards_end), (Some("killed"), None));
        assert_eq!((r.forwarded, r.forward_failures), (20.0, 1.0));
        assert_eq!((r.deliveries_per_second, r.engine_cpu_ms_per_envelope), (500.0, 250.0));
        let text = r.lines().join("\n");
        assert!(text.contains("node 1 127.0.0.1:2 (killed)"), "{text}");
        assert!(
            text.contains("publish via round-robin: 9 of 12 envelopes stored at their first try, 20 forwarded"),
            "{text}"
        );
        assert!(text.contains("8 (2.0 duplicates per handoff)"), "{text}");
        assert!(text.contains("duplicates by second since the first publish: 2 s: 10, 4 s: 6"), "{text}");
    }
}
